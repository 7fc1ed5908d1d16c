/* The staging ring on the CPU, without daemons: chunks go into the
 * assembler (ferry__client_on_chunk) as in test_client_assemble.c and
 * batches come out of ferry_next. Checks that the ring allocates once
 * (10,000 augmented batches, ferry__alloc_stats unchanged), that every
 * output equals ferry_augment_batch_cpu on the same uint8 batch with the
 * same (seed, epoch, batch index), the DLPack export's fields and its
 * deleter, and the client options' validation.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>

#include "client_test_util.h"
#include "ferry/log.h"

#define H 4
#define W 5
#define C 3
#define REC (H * W * C)
#define SPEC_ALL "flip(horizontal) | rotate(0.1) | zoom(0.1) | rescale(1/255)"

static ferry_client_t *local(uint32_t batch, uint32_t prefetch,
                             const char *augment, uint64_t seed,
                             ferry_dtype_t dtype, ferry_layout_t layout) {
  ferry__asm_params_t ap = {.batch_size = batch, .height = H, .width = W,
                            .channels = C, .prefetch = prefetch,
                            .augment_seed = seed, .dtype = dtype,
                            .layout = layout, .device = -1};
  ferry_client_t *c;
  ferry_error_t err = {0};
  ferry_augment_spec_init(&ap.augment);
  if (augment != NULL) {
    cr_assert_eq(ferry_augment_spec_parse(augment, &ap.augment, &err), 0,
                 "%s", err.msg);
    ap.has_augment = true;
  }
  cr_assert_eq(ferry__client_new_local(&ap, &c, &err), 0, "%s", err.msg);
  return c;
}

/* Feeds one chunk of (epoch, split) positions [first, first + count). */
static void feed(ferry_client_t *c, uint32_t epoch, uint32_t split,
                 uint64_t first, uint32_t count, bool last) {
  tu_chunk_opts_t o = {.epoch = epoch, .split = split, .first = first,
                       .count = count, .h = H, .w = W, .c = C, .last = last};
  cr_assert_eq(tu_feed(c, &o, 0, 64), 0);
}

/* A heartbeat answer: split `split` of `epoch` with `total` records, the
 * epoch exhausted (so a partial batch is flushed). */
static void beat(ferry_client_t *c, uint32_t epoch, uint32_t split,
                 uint64_t total) {
  tu_answer(c, epoch, split, total, 0, true, 0);
}

static size_t dtype_bytes(ferry_dtype_t d) {
  return d == FERRY_DTYPE_FLOAT32 ? 4 : 2;
}

/* The batch's output against the CPU twin run on its own uint8 images
 * with the client's key: bitwise equal. */
static void check_output(const ferry_batch_t *b, const char *augment,
                         uint64_t seed, ferry_dtype_t dtype,
                         ferry_layout_t layout, void *scratch) {
  ferry_augment_spec_t s;
  ferry_error_t err = {0};
  cr_assert_eq(ferry_augment_spec_parse(augment, &s, &err), 0);
  cr_assert_not(b->raw);
  cr_assert_eq(b->device, -1);
  cr_assert_null(b->ready_event);
  cr_assert_eq(b->dtype, dtype);
  cr_assert_eq(b->layout, layout);
  cr_assert_neq((const void *)b->output, (const void *)b->images);
  cr_assert_eq(ferry_augment_batch_cpu(&s, seed, b->epoch, b->index,
                                       b->images, b->size, H, W, C, scratch,
                                       dtype, layout, &err),
               0, "%s", err.msg);
  size_t bytes = (size_t)b->size * REC * dtype_bytes(dtype);
  cr_assert_eq(memcmp(b->output, scratch, bytes), 0,
               "batch %llu differs from the CPU twin",
               (unsigned long long)b->index);
}

Test(client_staging, ring_allocates_once_over_10000_batches) {
  const uint32_t batch = 8, total = 10000;
  uint8_t *scratch = ferry__malloc((size_t)batch * REC * 4);
  uint8_t *prev = ferry__malloc((size_t)batch * REC * 4);
  ferry_client_t *c = local(batch, 3, SPEC_ALL, 42, FERRY_DTYPE_FLOAT32,
                            FERRY_LAYOUT_NHWC);
  ferry_alloc_stats_t a = {0}, b = {0};
  uint64_t pos = 0, seen = 0;
  bool differs = false;
  /* Chunks of 5 records, so batches straddle chunks; the batches are
   * taken as soon as they are ready and released at once. */
  while (seen < total) {
    feed(c, 0, 0, pos, 5, false);
    pos += 5;
    const ferry_batch_t *bt;
    while (ferry_next(c, &bt, 0, NULL) == 0) {
      cr_assert_eq(bt->index, seen);
      cr_assert_eq(bt->size, batch);
      /* The key moves with the batch index: consecutive batches hold
       * different records, and their outputs are not a copy of one
       * another's. */
      if (seen > 0 && memcmp(prev, bt->output, (size_t)batch * REC * 4) != 0)
        differs = true;
      memcpy(prev, bt->output, (size_t)batch * REC * 4);
      if (seen % 97 == 0 || seen < 10)
        check_output(bt, SPEC_ALL, 42, FERRY_DTYPE_FLOAT32,
                     FERRY_LAYOUT_NHWC, scratch);
      ferry_batch_release(c, bt);
      if (++seen == 3)
        ferry__alloc_stats(&a); /* the steady state starts here */
    }
  }
  ferry__alloc_stats(&b);
  cr_assert(differs);
  cr_assert_eq(b.blocks, a.blocks, "blocks %lld -> %lld",
               (long long)a.blocks, (long long)b.blocks);
  cr_assert_eq(b.bytes, a.bytes, "bytes %lld -> %lld", (long long)a.bytes,
               (long long)b.bytes);
  ferry_client_stats_t st;
  ferry_client_stats(c, &st);
  cr_assert_eq(st.batches, total);
  ferry_client_free(c);
  ferry__free(scratch);
  ferry__free(prev);
}

/* Every dtype and layout, exact mode too, and a flushed partial batch
 * (prepared by ferry_next itself, on the trainer's thread). */
Test(client_staging, output_equals_cpu_twin_every_dtype_layout) {
  static const char *specs[] = {SPEC_ALL, SPEC_ALL " | exact",
                                "rescale(2)", ""};
  for (int si = 0; si < 4; si++)
    for (int d = 0; d <= FERRY_DTYPE_BFLOAT16; d++)
      for (int l = 0; l <= FERRY_LAYOUT_NCHW; l++) {
        uint8_t *scratch = ferry__malloc(6 * REC * 4);
        ferry_client_t *c = local(6, 3, specs[si], 7 + (uint64_t)si,
                                  (ferry_dtype_t)d, (ferry_layout_t)l);
        feed(c, 0, 3, 0, 10, true);
        const ferry_batch_t *b1, *b2;
        cr_assert_eq(ferry_next(c, &b1, 0, NULL), 0);
        cr_assert_eq(b1->size, 6);
        check_output(b1, specs[si], 7 + (uint64_t)si, (ferry_dtype_t)d,
                     (ferry_layout_t)l, scratch);
        /* The remaining 4 wait for the end of the epoch. */
        cr_assert_eq(ferry_next(c, &b2, 0, NULL), FERRY_ETIMEDOUT);
        beat(c, 0, 3, 10);
        cr_assert_eq(ferry_next(c, &b2, 0, NULL), 0);
        cr_assert_eq(b2->size, 4);
        cr_assert_eq(b2->index, 1);
        check_output(b2, specs[si], 7 + (uint64_t)si, (ferry_dtype_t)d,
                     (ferry_layout_t)l, scratch);
        ferry_batch_release(c, b1);
        ferry_batch_release(c, b2);
        ferry_client_free(c);
        ferry__free(scratch);
      }
}

Test(client_staging, same_key_same_output_across_clients) {
  /* Two clients with one seed give equal outputs; another seed does
   * not. */
  ferry_client_t *c1 = local(4, 3, SPEC_ALL, 5, FERRY_DTYPE_FLOAT32,
                             FERRY_LAYOUT_NCHW);
  ferry_client_t *c2 = local(4, 3, SPEC_ALL, 5, FERRY_DTYPE_FLOAT32,
                             FERRY_LAYOUT_NCHW);
  ferry_client_t *c3 = local(4, 3, SPEC_ALL, 6, FERRY_DTYPE_FLOAT32,
                             FERRY_LAYOUT_NCHW);
  feed(c1, 0, 0, 0, 4, false);
  feed(c2, 0, 0, 0, 4, false);
  feed(c3, 0, 0, 0, 4, false);
  const ferry_batch_t *b1, *b2, *b3;
  cr_assert_eq(ferry_next(c1, &b1, 0, NULL), 0);
  cr_assert_eq(ferry_next(c2, &b2, 0, NULL), 0);
  cr_assert_eq(ferry_next(c3, &b3, 0, NULL), 0);
  cr_assert_eq(memcmp(b1->output, b2->output, 4 * REC * 4), 0);
  cr_assert_neq(memcmp(b1->output, b3->output, 4 * REC * 4), 0);
  ferry_client_free(c1);
  ferry_client_free(c2);
  ferry_client_free(c3);
}

Test(client_staging, without_augment_the_uint8_slot_as_before) {
  ferry_client_t *c = local(4, 3, NULL, 0, FERRY_DTYPE_FLOAT32,
                            FERRY_LAYOUT_NCHW);
  feed(c, 0, 0, 0, 4, false);
  const ferry_batch_t *b;
  cr_assert_eq(ferry_next(c, &b, 0, NULL), 0);
  cr_assert(b->raw);
  cr_assert_eq((const void *)b->output, (const void *)b->images);
  cr_assert_eq(b->layout, FERRY_LAYOUT_NHWC);
  cr_assert_eq(b->device, -1);
  cr_assert_null(b->ready_event);
  /* The slots are page-aligned. */
  cr_assert_eq((uintptr_t)b->images % 4096, 0);
  for (size_t i = 0; i < REC; i++)
    cr_assert_eq(b->images[i], tu_pixel(0, 0, 0, i));
  ferry_batch_release(c, b);
  ferry_client_free(c);
}

/* Host batches: waiting a stream on them is a no-op that succeeds; a
 * batch not held (released, or another client's) is refused. */
Test(client_staging, wait_stream_on_host_batches) {
  ferry_client_t *c = local(4, 3, SPEC_ALL, 1, FERRY_DTYPE_FLOAT32,
                            FERRY_LAYOUT_NHWC);
  ferry_client_t *other = local(4, 3, NULL, 0, FERRY_DTYPE_FLOAT32,
                                FERRY_LAYOUT_NHWC);
  ferry_error_t err = {0};
  feed(c, 0, 0, 0, 4, false);
  const ferry_batch_t *b;
  cr_assert_eq(ferry_next(c, &b, 0, NULL), 0);
  cr_assert_eq(ferry_batch_wait_stream(c, b, NULL, &err), 0, "%s", err.msg);
  cr_assert_eq(ferry_batch_wait_stream(c, b, (void *)0x1234, &err), 0,
               "%s", err.msg);
  cr_assert_eq(ferry_batch_wait_stream(other, b, NULL, &err), FERRY_EINVAL);
  cr_assert_not_null(strstr(err.msg, "not a batch of this client"), "%s",
                     err.msg);
  ferry_batch_release(c, b);
  cr_assert_eq(ferry_batch_wait_stream(c, b, NULL, &err), FERRY_EINVAL);
  cr_assert_not_null(strstr(err.msg, "not held"), "%s", err.msg);
  cr_assert_eq(ferry_batch_wait_stream(c, NULL, NULL, &err), FERRY_EINVAL);
  ferry_client_free(other);
  ferry_client_free(c);
}

/* ferry_client_stats writes only the caller's sizeof: a struct from an
 * older header (cut before records_acked) keeps the bytes after it. */
Test(client_staging, stats_write_only_the_callers_size) {
  ferry_client_t *c = local(4, 3, NULL, 0, FERRY_DTYPE_FLOAT32,
                            FERRY_LAYOUT_NHWC);
  feed(c, 0, 0, 0, 4, false);
  const ferry_batch_t *b;
  cr_assert_eq(ferry_next(c, &b, 0, NULL), 0);
  ferry_batch_release(c, b);
  struct {
    ferry_client_stats_t st;
    uint64_t newer;
  } big;
  size_t cut = offsetof(ferry_client_stats_t, records_acked);
  memset(&big, 0xAB, sizeof(big));
  ferry_client_stats_sized(c, &big.st, cut);
  cr_assert_eq(big.st.batches, 1);
  cr_assert_eq(big.st.records, 4);
  const unsigned char *p = (const unsigned char *)&big;
  for (size_t i = cut; i < sizeof(big); i++)
    cr_assert_eq(p[i], 0xAB, "byte %zu written", i);
  ferry_client_stats_sized(c, &big.st, sizeof(big));
  cr_assert_eq(big.st.batches, 1);
  cr_assert_eq(big.newer, 0);
  ferry_client_stats(c, &big.st);
  cr_assert_eq(big.st.records, 4);
  ferry_client_free(c);
}

/* ---- DLPack ------------------------------------------------------------ */

static void check_dl(const DLManagedTensor *t, const ferry_batch_t *b,
                     uint8_t code, uint8_t bits, const int64_t *shape) {
  cr_assert_eq(t->dl_tensor.data, b->output);
  cr_assert_eq(t->dl_tensor.device.device_type, kDLCPU);
  cr_assert_eq(t->dl_tensor.device.device_id, 0);
  cr_assert_eq(t->dl_tensor.ndim, 4);
  for (int i = 0; i < 4; i++)
    cr_assert_eq(t->dl_tensor.shape[i], shape[i], "dim %d", i);
  cr_assert_null(t->dl_tensor.strides);
  cr_assert_eq(t->dl_tensor.byte_offset, 0);
  cr_assert_eq(t->dl_tensor.dtype.code, code);
  cr_assert_eq(t->dl_tensor.dtype.bits, bits);
  cr_assert_eq(t->dl_tensor.dtype.lanes, 1);
  cr_assert_not_null(t->deleter);
}

Test(client_staging, dlpack_fields) {
  /* The enum values are the specification's. */
  cr_assert_eq(kDLCPU, 1);
  cr_assert_eq(kDLCUDA, 2);
  cr_assert_eq(kDLCUDAHost, 3);
  cr_assert_eq(kDLUInt, 1);
  cr_assert_eq(kDLFloat, 2);
  cr_assert_eq(kDLBfloat, 4);
  cr_assert_eq(offsetof(DLTensor, device), sizeof(void *));
  cr_assert_eq(offsetof(DLManagedTensor, manager_ctx), sizeof(DLTensor));

  struct {
    const char *aug;
    ferry_dtype_t d;
    ferry_layout_t l;
    uint8_t code, bits;
    int64_t shape[4];
  } cases[] = {
      {NULL, FERRY_DTYPE_FLOAT32, FERRY_LAYOUT_NCHW, kDLUInt, 8,
       {4, H, W, C}},
      {SPEC_ALL, FERRY_DTYPE_FLOAT32, FERRY_LAYOUT_NHWC, kDLFloat, 32,
       {4, H, W, C}},
      {SPEC_ALL, FERRY_DTYPE_FLOAT16, FERRY_LAYOUT_NCHW, kDLFloat, 16,
       {4, C, H, W}},
      {SPEC_ALL, FERRY_DTYPE_BFLOAT16, FERRY_LAYOUT_NCHW, kDLBfloat, 16,
       {4, C, H, W}},
  };
  for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
    ferry_client_t *c = local(4, 3, cases[k].aug, 1, cases[k].d, cases[k].l);
    feed(c, 0, 0, 0, 4, false);
    const ferry_batch_t *b;
    DLManagedTensor *t;
    cr_assert_eq(ferry_next(c, &b, 0, NULL), 0);
    cr_assert_eq(ferry_batch_to_dlpack(c, b, &t), 0);
    check_dl(t, b, cases[k].code, cases[k].bits, cases[k].shape);
    t->deleter(t);
    ferry_client_free(c);
  }
}

Test(client_staging, dlpack_deleter_returns_the_slot) {
  ferry_client_t *c = local(2, 3, SPEC_ALL, 1, FERRY_DTYPE_FLOAT32,
                            FERRY_LAYOUT_NHWC);
  const ferry_batch_t *b[3], *more;
  DLManagedTensor *t[3];
  ferry_error_t err = {0};
  feed(c, 0, 0, 0, 6, false);
  for (int i = 0; i < 3; i++) {
    cr_assert_eq(ferry_next(c, &b[i], 0, NULL), 0);
    cr_assert_eq(ferry_batch_to_dlpack(c, b[i], &t[i]), 0);
  }
  /* Exported once only; never a batch not held or not the client's. */
  DLManagedTensor *dup;
  cr_assert_eq(ferry_batch_to_dlpack(c, b[0], &dup), FERRY_EINVAL);
  cr_assert_null(dup);
  ferry_batch_t fake = *b[0];
  cr_assert_eq(ferry_batch_to_dlpack(c, &fake, &dup), FERRY_EINVAL);
  /* Every slot is held by a tensor: no more batches. */
  cr_assert_eq(ferry_next(c, &more, 0, &err), FERRY_EINVAL);
  cr_assert_not_null(strstr(err.msg, "held"), "%s", err.msg);
  /* The deleter gives the slot back: the assembler fills it again. */
  t[1]->deleter(t[1]);
  cr_assert_eq(ferry_batch_to_dlpack(c, b[1], &dup), FERRY_EINVAL);
  feed(c, 0, 0, 6, 2, false);
  cr_assert_eq(ferry_next(c, &more, 0, NULL), 0);
  cr_assert_eq(more, b[1]); /* the same slot, refilled */
  cr_assert_eq(more->index, 3);
  cr_assert_eq(more->ids[0], tu_id(0, 6));
  cr_assert_eq(ferry_batch_to_dlpack(c, more, &dup), 0);
  dup->deleter(dup);
  t[0]->deleter(t[0]);
  t[2]->deleter(t[2]);
  ferry_client_free(c);
}

/* ---- Options ----------------------------------------------------------- */

static char logged[512];
static void capture(int level, const char *msg, void *ud) {
  if (level == FERRY_LOG_WARN)
    snprintf(logged, sizeof(logged), "%s", msg);
}

static void base_options(ferry_client_options_t *o) {
  ferry_client_options_init(o);
  o->dispatcher = "127.0.0.1:1";
  o->spec = "tfrecord(\"/d/x\") | decode(raw, 4, 5, 3) | batch(4)";
  o->connect_timeout_ms = 200;
}

Test(client_staging, zero_options_keep_host_batches) {
  ferry_client_options_t o;
  ferry_client_options_init(&o);
  cr_assert_not(o.gpu);
  cr_assert_null(o.augment);
  cr_assert_eq(o.dtype, FERRY_DTYPE_FLOAT32);
  cr_assert_eq(o.layout, FERRY_LAYOUT_NHWC);
}

Test(client_staging, bad_augment_spec_fails_with_its_column) {
  ferry_client_options_t o;
  ferry_client_t *c = (ferry_client_t *)&o;
  ferry_error_t err = {0};
  base_options(&o);
  o.augment = "flip(horizontal) | rotate(2)";
  cr_assert_eq(ferry_client_new(&o, &c, &err), FERRY_ESPEC);
  cr_assert_null(c);
  cr_assert_not_null(strstr(err.msg, "augment spec: column 27"), "%s", err.msg);
  o.augment = "flip(horizontal) | blur(3)";
  cr_assert_eq(ferry_client_new(&o, &c, &err), FERRY_ESPEC);
  cr_assert_not_null(strstr(err.msg, "column 20"), "%s", err.msg);
  o.augment = SPEC_ALL;
  o.dtype = (ferry_dtype_t)9;
  cr_assert_eq(ferry_client_new(&o, &c, &err), FERRY_EINVAL);
  cr_assert_not_null(strstr(err.msg, "dtype"), "%s", err.msg);
  o.dtype = FERRY_DTYPE_FLOAT16;
  o.layout = (ferry_layout_t)5;
  cr_assert_eq(ferry_client_new(&o, &c, &err), FERRY_EINVAL);
  cr_assert_not_null(strstr(err.msg, "layout"), "%s", err.msg);
  /* 1-pixel-wide images cannot be rotated: refused before any RPC. */
  o.layout = FERRY_LAYOUT_NCHW;
  o.spec = "tfrecord(\"/d/x\") | decode(raw, 4, 1, 3) | batch(4)";
  cr_assert_eq(ferry_client_new(&o, &c, &err), FERRY_ETOOSMALL);
  cr_assert_not_null(strstr(err.msg, "rotate"), "%s", err.msg);
}

Test(client_staging, gpu_without_cuda_fails_or_falls_back) {
  ferry_client_options_t o;
  ferry_client_t *c;
  ferry_error_t err = {0};
  if (ferry_cuda_available(NULL) > 0)
    cr_skip_test("a CUDA device is present: tests/gpu covers GPU staging");
  base_options(&o);
  o.augment = SPEC_ALL;
  o.gpu = true;
  o.device = 0;
  int nrc = ferry_client_new(&o, &c, &err);
  cr_assert_eq(nrc, FERRY_ENOTSUP, "%d %s", nrc, err.msg);
  cr_assert_null(c);
  cr_assert_not_null(strstr(err.msg, "device 0"), "%s", err.msg);
  cr_assert_not_null(strstr(err.msg, "CUDA"), "%s", err.msg);
  /* With the fallback the options pass and the client goes on to the
   * (unreachable) dispatcher, after a warning. */
  o.device_fallback = true;
  ferry_log_set_callback(capture, NULL);
  int rc = ferry_client_new(&o, &c, &err);
  ferry_log_set_callback(NULL, NULL);
  cr_assert_neq(rc, FERRY_ENOTSUP);
  cr_assert_neq(rc, 0);
  cr_assert_not_null(strstr(logged, "host batches"), "%s", logged);
  /* The assembler alone refuses GPU staging too. */
  ferry__asm_params_t ap = {.batch_size = 2, .height = H, .width = W,
                            .channels = C, .prefetch = 3, .gpu = true};
  ferry_augment_spec_init(&ap.augment);
  int lrc = ferry__client_new_local(&ap, &c, &err);
  cr_assert_eq(lrc, FERRY_ENOTSUP, "%d %s", lrc, err.msg);
}
