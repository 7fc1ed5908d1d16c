/* Fixtures shared by the worker tests: hand-encoded Examples written with
 * ferry_tfr_writer, tasks for them, and decoded chunks. Header-only, each
 * test file includes it once. */
#ifndef FERRY_WTEST_UTIL_H
#define FERRY_WTEST_UTIL_H

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "pipeline.h"
#include "spec.h"
#include "tfrecord.h"
#include "varint.h"
#include "worker.h"

typedef struct {
  uint8_t *p;
  size_t n, cap;
} wbuf_t;

static inline void wb_put(wbuf_t *b, const void *data, size_t len) {
  if (b->n + len > b->cap) {
    b->cap = (b->n + len) * 2 + 64;
    b->p = realloc(b->p, b->cap);
    cr_assert_not_null(b->p);
  }
  if (len > 0)
    memcpy(b->p + b->n, data, len);
  b->n += len;
}

static inline void wb_varint(wbuf_t *b, uint64_t v) {
  uint8_t tmp[FERRY_VARINT_MAX];
  wb_put(b, tmp, ferry__varint_put(tmp, v));
}

static inline void wb_ld(wbuf_t *b, int field, const void *data, size_t len) {
  wb_varint(b, (uint64_t)field << 3 | 2);
  wb_varint(b, len);
  wb_put(b, data, len);
}

/* One map entry of Features: key -> Feature{bytes_list | int64_list}. */
static inline void wb_feature(wbuf_t *features, const char *key, const void *bytes,
                       size_t len, int64_t ival, bool is_bytes) {
  wbuf_t list = {0}, feature = {0}, entry = {0};
  if (is_bytes) {
    wb_ld(&list, 1, bytes, len);
  } else {
    wbuf_t packed = {0};
    wb_varint(&packed, (uint64_t)ival);
    wb_ld(&list, 1, packed.p, packed.n);
    free(packed.p);
  }
  wb_ld(&feature, is_bytes ? 1 : 3, list.p, list.n);
  wb_ld(&entry, 1, key, strlen(key));
  wb_ld(&entry, 2, feature.p, feature.n);
  wb_ld(features, 1, entry.p, entry.n);
  free(list.p);
  free(feature.p);
  free(entry.p);
}

/* The image of record `i`: a function of i alone. */
static inline void wt_image(uint8_t *img, size_t n, uint64_t i) {
  uint64_t s = i * 0x9E3779B97F4A7C15ull + 12345;
  for (size_t k = 0; k < n; k++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    img[k] = (uint8_t)(s >> 56);
  }
}

/* An Example with image (n bytes), label (i % 10 - 3) and id. */
static inline void wt_example(wbuf_t *ex, uint64_t i, size_t n) {
  wbuf_t features = {0};
  uint8_t *img = malloc(n + 1);
  wt_image(img, n, i);
  wb_feature(&features, "image", img, n, 0, true);
  wb_feature(&features, "label", NULL, 0, (int64_t)(i % 10) - 3, false);
  wb_feature(&features, "id", NULL, 0, (int64_t)i, false);
  ex->n = 0;
  wb_ld(ex, 1, features.p, features.n);
  free(features.p);
  free(img);
}

#define WT_H 8
#define WT_W 6
#define WT_C 3
#define WT_BYTES (WT_H * WT_W * WT_C)

typedef struct {
  char dir[64];
  char path[128];
  size_t n;
  uint64_t *offsets; /* byte offset of each record */
  ferry_spec_t spec;
  uint8_t *spec_bytes;
  size_t spec_len;
} wt_file_t;

/* Writes `n` records; record `bad_image` (if < n) has an image of the
 * wrong size. */
static inline void wt_file_make(wt_file_t *f, size_t n, ferry_compression_t comp,
                         size_t bad_image) {
  ferry_error_t err;
  memset(f, 0, sizeof(*f));
  snprintf(f->dir, sizeof(f->dir), "/tmp/ferry-wtest-XXXXXX");
  cr_assert_not_null(mkdtemp(f->dir));
  snprintf(f->path, sizeof(f->path), "%s/data.tfrecord%s", f->dir,
           comp == FERRY_COMPRESSION_GZIP ? ".gz" : "");
  ferry_tfr_writer_t *w;
  cr_assert_eq(ferry__tfr_writer_open(f->path, comp, &w, &err), 0, "%s",
               err.msg);
  f->n = n;
  f->offsets = calloc(n + 1, sizeof(uint64_t));
  uint64_t off = 0;
  wbuf_t ex = {0};
  for (size_t i = 0; i < n; i++) {
    wt_example(&ex, i, i == bad_image ? WT_BYTES - 1 : WT_BYTES);
    f->offsets[i] = off;
    off += ex.n + 16;
    cr_assert_eq(ferry__tfr_writer_write(w, ex.p, ex.n, &err), 0);
  }
  f->offsets[n] = off;
  free(ex.p);
  cr_assert_eq(ferry__tfr_writer_close(w, &err), 0);

  char text[256];
  snprintf(text, sizeof(text), "tfrecord(\"%s\"%s) | decode(raw, %d, %d, %d)",
           f->path, comp == FERRY_COMPRESSION_GZIP ? ", compression=gzip" : "",
           WT_H, WT_W, WT_C);
  cr_assert_eq(ferry__spec_parse(text, &f->spec, &err), 0, "%s", err.msg);
  cr_assert_eq(ferry__spec_pack(&f->spec, &f->spec_bytes, &f->spec_len), 0);
}

static inline void wt_file_free(wt_file_t *f) {
  unlink(f->path);
  rmdir(f->dir);
  free(f->offsets);
  ferry__spec_close(&f->spec);
  ferry_free(f->spec_bytes);
}

/* Flips one byte inside record i's data (its data CRC then fails). */
static inline void wt_corrupt(wt_file_t *f, size_t i) {
  FILE *fp = fopen(f->path, "r+b");
  cr_assert_not_null(fp);
  cr_assert_eq(fseek(fp, (long)(f->offsets[i] + 12 + 5), SEEK_SET), 0);
  int c = fgetc(fp);
  cr_assert_eq(fseek(fp, (long)(f->offsets[i] + 12 + 5), SEEK_SET), 0);
  fputc(c ^ 0x55, fp);
  fclose(fp);
}

/* A task message over records [first, first + count) of the file (count
 * 0: to the end, or to byte_end when `use_end`). */
typedef struct {
  Ferry__V1__Task task;
  Ferry__V1__Split split;
} wt_task_t;

static inline void wt_task(wt_task_t *t, const wt_file_t *f, uint64_t first,
                    uint64_t count, bool use_end) {
  ferry__v1__task__init(&t->task);
  ferry__v1__split__init(&t->split);
  t->task.job_id = 11;
  t->task.client_id = 22;
  t->task.epoch = 1;
  t->split.index = 3;
  t->split.file_index = 2;
  t->split.byte_offset = f->offsets[first];
  t->split.first_record = first;
  t->split.num_records = use_end ? 0 : count;
  if (use_end && count > 0)
    t->split.byte_end = f->offsets[first + count];
  t->task.split = &t->split;
  t->task.file = (char *)f->path;
  t->task.lease = 5;
  t->task.spec.data = f->spec_bytes;
  t->task.spec.len = f->spec_len;
}

/* The expected pixels and label of record i, by the pipeline directly. */
static inline void wt_expected(const wt_file_t *f, uint64_t i, uint8_t *pixels,
                        int64_t *label) {
  ferry_pipeline_t *p;
  ferry_pipeline_ctx_t *ctx;
  ferry_error_t err;
  wbuf_t ex = {0};
  const uint8_t *pix;
  int h, w, c;
  wt_example(&ex, i, WT_BYTES);
  cr_assert_eq(ferry__pipeline_new(&f->spec, &p, &err), 0);
  cr_assert_eq(ferry__pipeline_ctx_new(p, &ctx, &err), 0);
  cr_assert_eq(
      ferry__pipeline_process(ctx, ex.p, ex.n, &pix, &h, &w, &c, label, &err),
      0, "%s", err.msg);
  cr_assert_eq(h * w * c, WT_BYTES);
  memcpy(pixels, pix, WT_BYTES);
  ferry__pipeline_ctx_free(ctx);
  ferry__pipeline_free(p);
  free(ex.p);
}

/* Joins a message's bytes and unpacks it. */
static inline Ferry__V1__Chunk *wt_unpack_pieces(const ferry_chunk_piece_t *pieces,
                                          size_t n) {
  size_t total = 0, off = 0;
  for (size_t i = 0; i < n; i++)
    total += pieces[i].len;
  uint8_t *buf = malloc(total + 1);
  for (size_t i = 0; i < n; i++) {
    memcpy(buf + off, pieces[i].ptr, pieces[i].len);
    off += pieces[i].len;
  }
  Ferry__V1__Chunk *m = ferry__v1__chunk__unpack(NULL, total, buf);
  free(buf);
  cr_assert_not_null(m, "chunk message is valid protobuf");
  return m;
}

#endif /* FERRY_WTEST_UTIL_H */
