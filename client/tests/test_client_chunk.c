/* The chunk header parser: messages built like the worker builds them,
 * cut into many small slices, checked against protobuf-c's own unpack;
 * the payload located without being copied; malformed messages refused
 * at every truncation point.
 */
#include <criterion/criterion.h>

#include "client_test_util.h"

static void check_chunk(const tu_chunk_opts_t *o, size_t slice) {
  size_t len;
  uint8_t *buf = tu_chunk(o, &len);
  tu_slices_t t;
  ferry_chunk_src_t src;
  ferry_chunk_parser_t p;
  ferry_chunk_t ch;
  ferry_error_t err = {0};
  tu_slices_init(&t, buf, len, slice);
  tu_src(&src, &t);
  ferry__chunk_parser_init(&p);
  cr_assert_eq(ferry__chunk_parse(&p, &src, &ch, &err), 0, "%s", err.msg);

  /* protobuf-c reads the same message (payload included) as the oracle. */
  Ferry__V1__Chunk *m = ferry__v1__chunk__unpack(NULL, len, buf);
  cr_assert_not_null(m);
  cr_assert_eq(ch.job_id, m->job_id);
  cr_assert_eq(ch.epoch, m->epoch);
  cr_assert_eq(ch.split, m->split);
  cr_assert_eq(ch.lease, m->lease);
  cr_assert_eq(ch.first, m->first);
  cr_assert_eq(ch.count, m->count);
  cr_assert_eq(ch.height, m->height);
  cr_assert_eq(ch.width, m->width);
  cr_assert_eq(ch.channels, m->channels);
  cr_assert_eq(ch.last, (bool)m->last);
  cr_assert_eq(ch.n_labels, m->n_labels);
  cr_assert_eq(ch.n_ids, m->n_ids);
  for (size_t i = 0; i < m->n_labels; i++)
    cr_assert_eq(ch.labels[i], m->labels[i]);
  for (size_t i = 0; i < m->n_ids; i++)
    cr_assert_eq(ch.ids[i], m->ids[i]);
  cr_assert_eq(ch.payload_len, m->payload.len);
  cr_assert(ch.has_payload);
  uint8_t *pl = ferry__malloc(ch.payload_len + 1);
  cr_assert_eq(src.copy(&src, ch.payload_off, pl, ch.payload_len),
               ch.payload_len);
  cr_assert_eq(memcmp(pl, m->payload.data, ch.payload_len), 0);
  ferry__free(pl);
  /* The window saw the header, not the payload (beyond one refill). */
  if (!o->payload_first && ch.payload_len > 8192)
    cr_assert_lt(p.win_base + p.win_len, ch.payload_off + 4096 + 16);
  ferry__v1__chunk__free_unpacked(m, NULL);
  ferry__chunk_parser_close(&p);
  tu_slices_close(&t);
  ferry__free(buf);
}

Test(client_chunk, header_and_payload_over_small_slices) {
  tu_chunk_opts_t o = {.epoch = 2, .split = 9, .first = 1000, .count = 300,
                       .h = 8, .w = 8, .c = 3, .last = true};
  size_t slices[] = {1, 2, 3, 7, 64, 1000, 65536};
  for (size_t i = 0; i < sizeof(slices) / sizeof(slices[0]); i++)
    check_chunk(&o, slices[i]);
}

Test(client_chunk, large_header_grows_the_window) {
  /* 5000 labels and ids with large values make a header of ~90 KiB. */
  tu_chunk_opts_t o = {.epoch = 0, .split = 1u << 20, .first = 1ull << 35,
                       .count = 5000, .h = 1, .w = 2, .c = 1};
  check_chunk(&o, 4096);
  check_chunk(&o, 5);
}

Test(client_chunk, payload_before_the_header_and_no_labels) {
  tu_chunk_opts_t o = {.epoch = 1, .split = 4, .first = 0, .count = 17,
                       .h = 5, .w = 3, .c = 2, .payload_first = true,
                       .no_labels = true};
  check_chunk(&o, 11);
}

Test(client_chunk, error_chunk) {
  tu_chunk_opts_t o = {.split = 3, .error_code = FERRY_EDATACRC,
                       .error = "train-0.tfrecord: record 12 at byte offset "
                                "40960: record data CRC mismatch"};
  size_t len;
  uint8_t *buf = tu_chunk(&o, &len);
  tu_slices_t t;
  ferry_chunk_src_t src;
  ferry_chunk_parser_t p;
  ferry_chunk_t ch;
  tu_slices_init(&t, buf, len, 3);
  tu_src(&src, &t);
  ferry__chunk_parser_init(&p);
  cr_assert_eq(ferry__chunk_parse(&p, &src, &ch, NULL), 0);
  cr_assert_eq(ch.error_code, FERRY_EDATACRC);
  cr_assert_str_eq(ch.error, o.error);
  ferry__chunk_parser_close(&p);
  tu_slices_close(&t);
  ferry__free(buf);
}

Test(client_chunk, truncated_messages_are_refused) {
  tu_chunk_opts_t o = {.epoch = 1, .split = 2, .first = 5, .count = 3,
                       .h = 2, .w = 2, .c = 1, .last = true};
  size_t len;
  uint8_t *buf = tu_chunk(&o, &len);
  ferry_chunk_parser_t p;
  size_t refused_from = 1;
  ferry__chunk_parser_init(&p);
  for (size_t cut = 1; cut < len; cut++) {
    tu_slices_t t;
    ferry_chunk_src_t src;
    ferry_chunk_t ch;
    ferry_error_t err = {0};
    tu_slices_init(&t, buf, cut, 2);
    tu_src(&src, &t);
    int rc = ferry__chunk_parse(&p, &src, &ch, &err);
    /* A cut between whole fields before `count` is a valid empty chunk;
     * any later cut leaves the payload or the labels short. */
    cr_assert(rc != 0 || ch.count == 0, "cut at %zu parsed", cut);
    if (rc != 0)
      cr_assert_neq(err.msg[0], '\0');
    else
      refused_from = cut + 1;
    tu_slices_close(&t);
  }
  /* Only the few header bytes before `count` can parse. */
  cr_assert_lt(refused_from, 16);
  ferry__chunk_parser_close(&p);
  ferry__free(buf);
}

Test(client_chunk, malformed_fields) {
  ferry_chunk_parser_t p;
  ferry_chunk_t ch;
  ferry_error_t err = {0};
  ferry__chunk_parser_init(&p);
  struct {
    const uint8_t *b;
    size_t n;
    int code;
  } cases[] = {
      /* count = 1 (1x1x1) but the payload has 2 bytes. */
      {(const uint8_t[]){0x30, 1, 0x38, 1, 0x40, 1, 0x48, 1, 0x7a, 2, 9, 9},
       12, FERRY_EINVAL},
      /* field 2 (epoch) as a length-delimited field. */
      {(const uint8_t[]){0x12, 1, 0}, 3, FERRY_EWIRETYPE},
      /* wire type 3 (groups). */
      {(const uint8_t[]){0x0b}, 1, FERRY_EWIRETYPE},
      /* an 11-byte varint. */
      {(const uint8_t[]){0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                         0xff, 0xff, 0xff, 0x01},
       12, FERRY_EVARINT},
      /* payload length past the end. */
      {(const uint8_t[]){0x7a, 0x80, 0x01, 1, 2}, 5, FERRY_EOVERRUN},
      /* field number 0. */
      {(const uint8_t[]){0x00, 0x01}, 2, FERRY_EINVAL},
      /* a 6-byte tag (an unknown fixed64 field written overlong): found by
       * fuzz_chunk, refused by protobuf-c too. */
      {(const uint8_t[]){0xa9, 0xff, 0xa5, 0xff, 0x8d, 0x00, 0, 0, 0, 0, 0, 0,
                         0, 0},
       14, FERRY_EVARINT},
      /* a 6-byte length (0 written overlong): found by fuzz_chunk. */
      {(const uint8_t[]){0x72, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00}, 7,
       FERRY_EVARINT},
      /* two labels for one record. */
      {(const uint8_t[]){0x30, 1, 0x38, 1, 0x40, 1, 0x48, 1, 0x52, 2, 1, 2,
                         0x7a, 1, 7},
       15, FERRY_EINVAL},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    tu_slices_t t;
    ferry_chunk_src_t src;
    tu_slices_init(&t, cases[i].b, cases[i].n, 1);
    tu_src(&src, &t);
    cr_assert_eq(ferry__chunk_parse(&p, &src, &ch, &err), cases[i].code,
                 "case %zu: %s", i, err.msg);
    tu_slices_close(&t);
  }
  ferry__chunk_parser_close(&p);
}

Test(client_chunk, steady_state_allocates_nothing) {
  tu_chunk_opts_t o = {.split = 1, .count = 64, .h = 4, .w = 4, .c = 3};
  size_t len;
  uint8_t *buf = tu_chunk(&o, &len);
  tu_slices_t t;
  ferry_chunk_src_t src;
  ferry_chunk_parser_t p;
  ferry_chunk_t ch;
  ferry_alloc_stats_t a, b;
  tu_slices_init(&t, buf, len, 100);
  tu_src(&src, &t);
  ferry__chunk_parser_init(&p);
  cr_assert_eq(ferry__chunk_parse(&p, &src, &ch, NULL), 0);
  ferry__alloc_stats(&a);
  for (int i = 0; i < 100; i++)
    cr_assert_eq(ferry__chunk_parse(&p, &src, &ch, NULL), 0);
  ferry__alloc_stats(&b);
  cr_assert_eq(a.blocks, b.blocks);
  cr_assert_eq(a.bytes, b.bytes);
  ferry__chunk_parser_close(&p);
  tu_slices_close(&t);
  ferry__free(buf);
}
