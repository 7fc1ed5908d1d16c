/* The Chunk contract (chunk.h): the encoder writes, byte for byte,
 * what protobuf-c packs for the same ferry.v1.Chunk; the parser reads
 * back what the encoder wrote; the header bound holds for extreme values.
 */
#include <criterion/criterion.h>
#include <string.h>

#include "alloc.h"
#include "chunk.h"
#include "ferry/v1/worker.pb-c.h"

typedef struct {
  ferry_chunk_t ch;
  uint8_t *payload;
} sample_t;

static void sample_fill(sample_t *s, int64_t *labels, int64_t *ids) {
  size_t plen = (size_t)s->ch.count * s->ch.height * s->ch.width *
                s->ch.channels;
  s->ch.payload_len = s->ch.error_code != 0 ? 0 : plen;
  s->payload = ferry__malloc(plen + 1);
  cr_assert_not_null(s->payload);
  for (size_t i = 0; i < plen; i++)
    s->payload[i] = (uint8_t)(i * 7 + 3);
  if (labels != NULL) {
    s->ch.labels = labels;
    s->ch.n_labels = s->ch.count;
  }
  if (ids != NULL) {
    s->ch.ids = ids;
    s->ch.n_ids = s->ch.count;
  }
}

/* protobuf-c's packing of the same message, payload included. */
static uint8_t *pb_pack(const sample_t *s, size_t *len) {
  Ferry__V1__Chunk m = FERRY__V1__CHUNK__INIT;
  m.job_id = s->ch.job_id;
  m.epoch = s->ch.epoch;
  m.split = s->ch.split;
  m.lease = s->ch.lease;
  m.first = s->ch.first;
  m.count = s->ch.count;
  m.height = s->ch.height;
  m.width = s->ch.width;
  m.channels = s->ch.channels;
  m.n_labels = s->ch.n_labels;
  m.labels = (int64_t *)s->ch.labels;
  m.n_ids = s->ch.n_ids;
  m.ids = (int64_t *)s->ch.ids;
  m.last = s->ch.last;
  m.error_code = s->ch.error_code;
  m.error = s->ch.error != NULL ? (char *)s->ch.error : (char *)"";
  m.payload.len = s->ch.payload_len;
  m.payload.data = s->payload;
  *len = ferry__v1__chunk__get_packed_size(&m);
  uint8_t *buf = ferry__malloc(*len + 1);
  cr_assert_not_null(buf);
  cr_assert_eq(ferry__v1__chunk__pack(&m, buf), *len);
  return buf;
}

/* Encodes, compares with protobuf-c, parses back and compares fields. */
static void round_trip(sample_t *s) {
  size_t cap = ferry__chunk_header_size(&s->ch);
  size_t bound = ferry__chunk_header_bound(
      s->ch.n_labels > s->ch.n_ids ? s->ch.n_labels : s->ch.n_ids,
      s->ch.error != NULL ? strlen(s->ch.error) : 0);
  cr_assert_leq(cap, bound);
  uint8_t *hdr = ferry__malloc(cap + 1);
  ferry_chunk_piece_t pieces[FERRY_CHUNK_MAX_PIECES];
  cr_assert_eq(
      ferry__chunk_encode(&s->ch, s->payload, hdr, cap - (cap > 0), pieces),
      cap > 0 ? FERRY_ERANGE : 1);
  int n = ferry__chunk_encode(&s->ch, s->payload, hdr, cap, pieces);
  cr_assert_eq(n, s->ch.payload_len > 0 ? 2 : 1);
  cr_assert_eq(pieces[0].ptr, hdr);
  cr_assert_eq(pieces[0].len, cap);
  if (n == 2) {
    cr_assert_eq(pieces[1].ptr, s->payload, "the payload is not copied");
    cr_assert_eq(pieces[1].len, s->ch.payload_len);
  }

  size_t len = 0;
  for (int i = 0; i < n; i++)
    len += pieces[i].len;
  uint8_t *msg = ferry__malloc(len + 1);
  size_t off = 0;
  for (int i = 0; i < n; i++) {
    memcpy(msg + off, pieces[i].ptr, pieces[i].len);
    off += pieces[i].len;
  }
  size_t pb_len;
  uint8_t *pb = pb_pack(s, &pb_len);
  cr_assert_eq(len, pb_len);
  cr_assert_eq(memcmp(msg, pb, len), 0, "bytes differ from protobuf-c's");

  ferry_chunk_src_t src;
  ferry__chunk_src_bytes(&src, msg, len);
  ferry_chunk_parser_t p;
  ferry__chunk_parser_init(&p);
  ferry_chunk_t got;
  ferry_error_t err = {0};
  cr_assert_eq(ferry__chunk_parse(&p, &src, &got, &err), 0, "%s", err.msg);
  cr_assert_eq(got.job_id, s->ch.job_id);
  cr_assert_eq(got.epoch, s->ch.epoch);
  cr_assert_eq(got.split, s->ch.split);
  cr_assert_eq(got.lease, s->ch.lease);
  cr_assert_eq(got.first, s->ch.first);
  cr_assert_eq(got.count, s->ch.count);
  cr_assert_eq(got.height, s->ch.height);
  cr_assert_eq(got.width, s->ch.width);
  cr_assert_eq(got.channels, s->ch.channels);
  cr_assert_eq(got.last, s->ch.last);
  cr_assert_eq(got.error_code, s->ch.error_code);
  /* The parser keeps FERRY_CHUNK_ERROR_MAX - 1 bytes of the text. */
  const char *want = s->ch.error != NULL ? s->ch.error : "";
  size_t want_len = strlen(want) < FERRY_CHUNK_ERROR_MAX - 1
                        ? strlen(want)
                        : FERRY_CHUNK_ERROR_MAX - 1;
  cr_assert_eq(strlen(got.error), want_len);
  cr_assert_eq(strncmp(got.error, want, want_len), 0);
  cr_assert_eq(got.n_labels, s->ch.n_labels);
  cr_assert_eq(got.n_ids, s->ch.n_ids);
  for (size_t i = 0; i < got.n_labels; i++)
    cr_assert_eq(got.labels[i], s->ch.labels[i]);
  for (size_t i = 0; i < got.n_ids; i++)
    cr_assert_eq(got.ids[i], s->ch.ids[i]);
  cr_assert_eq(got.has_payload, s->ch.payload_len > 0);
  cr_assert_eq(got.payload_len, s->ch.payload_len);
  if (s->ch.payload_len > 0) {
    cr_assert_eq(got.payload_off, cap);
    cr_assert_eq(memcmp(msg + got.payload_off, s->payload, got.payload_len),
                 0);
  }
  ferry__chunk_parser_close(&p);
  ferry__free(pb);
  ferry__free(msg);
  ferry__free(hdr);
  ferry__free(s->payload);
}

Test(chunk, records_with_labels_and_ids) {
  int64_t labels[5] = {0, 1, 9, 1000, 1LL << 40};
  int64_t ids[5] = {0, 1ll << 40 | 3, 7, 1ll << 62, 12345};
  sample_t s = {.ch = {.job_id = 77, .epoch = 3, .split = 12, .lease = 5,
                       .first = 1000, .count = 5, .height = 4, .width = 3,
                       .channels = 3}};
  sample_fill(&s, labels, ids);
  round_trip(&s);
}

Test(chunk, negative_labels_take_ten_bytes) {
  int64_t labels[3] = {-1, INT64_MIN, -300};
  sample_t s = {.ch = {.job_id = 1, .count = 3, .height = 1, .width = 1,
                       .channels = 1, .last = true}};
  sample_fill(&s, labels, NULL);
  round_trip(&s);
}

Test(chunk, extreme_values_stay_within_the_bound) {
  int64_t labels[2] = {INT64_MIN, -1};
  int64_t ids[2] = {INT64_MAX, INT64_MIN};
  char error[512];
  memset(error, 'e', sizeof(error) - 1);
  error[sizeof(error) - 1] = '\0';
  sample_t s = {.ch = {.job_id = UINT64_MAX, .epoch = UINT32_MAX,
                       .split = UINT32_MAX, .lease = UINT64_MAX,
                       .first = UINT64_MAX, .count = 2, .height = 1,
                       .width = 1, .channels = 1, .last = true,
                       .error = error}};
  sample_fill(&s, labels, ids);
  round_trip(&s);
}

Test(chunk, error_chunk_with_negative_code) {
  sample_t s = {.ch = {.job_id = 9, .epoch = 1, .split = 2, .lease = 3,
                       .error_code = FERRY_EDATACRC,
                       .error = "/data/a.tfrecord: byte offset 16: bad crc"}};
  sample_fill(&s, NULL, NULL);
  round_trip(&s);
}

Test(chunk, empty_last_chunk_and_all_defaults) {
  sample_t s = {.ch = {.last = true}};
  sample_fill(&s, NULL, NULL);
  round_trip(&s);
  sample_t z = {.ch = {0}};
  sample_fill(&z, NULL, NULL);
  round_trip(&z);
}

Test(chunk, large_payload_and_many_records) {
  enum { N = 3000 };
  int64_t *labels = ferry__malloc(N * sizeof(int64_t));
  int64_t *ids = ferry__malloc(N * sizeof(int64_t));
  for (int i = 0; i < N; i++) {
    labels[i] = i % 1000;
    ids[i] = (int64_t)i << 20 | i;
  }
  sample_t s = {.ch = {.job_id = 5, .epoch = 2, .split = 70000, .lease = 1,
                       .first = 1ull << 33, .count = N, .height = 8,
                       .width = 8, .channels = 3}};
  sample_fill(&s, labels, ids);
  round_trip(&s);
  ferry__free(labels);
  ferry__free(ids);
}

Test(chunk, bytes_source_stops_at_its_end) {
  const uint8_t b[4] = {1, 2, 3, 4};
  uint8_t d[8] = {0};
  ferry_chunk_src_t src;
  ferry__chunk_src_bytes(&src, b, sizeof(b));
  cr_assert_eq(src.copy(&src, 1, d, 8), 3);
  cr_assert_eq(d[0], 2);
  cr_assert_eq(d[2], 4);
  cr_assert_eq(src.copy(&src, 4, d, 1), 0);
}
