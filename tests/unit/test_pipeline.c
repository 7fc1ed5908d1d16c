/* The per-record pipeline: its output against the ops run one by one, each
 * error a bad record can cause, and no allocation per record in steady
 * state. Examples are encoded by hand (protobuf wire format), JPEGs with
 * TurboJPEG. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <turbojpeg.h>

#include "alloc.h"
#include "crop.h"
#include "imgops.h"
#include "jpeg_restart.h"
#include "pipeline.h"
#include "spec.h"
#include "varint.h"

/* A growable byte buffer for the protobuf encoder. */
typedef struct {
  uint8_t *p;
  size_t n, cap;
} buf_t;

static void put(buf_t *b, const void *data, size_t len) {
  if (b->n + len > b->cap) {
    b->cap = (b->n + len) * 2 + 64;
    b->p = realloc(b->p, b->cap);
    cr_assert_not_null(b->p);
  }
  if (len > 0)
    memcpy(b->p + b->n, data, len);
  b->n += len;
}

static void put_varint(buf_t *b, uint64_t v) {
  uint8_t tmp[FERRY_VARINT_MAX];
  put(b, tmp, ferry__varint_put(tmp, v));
}

/* Appends field `field` (wire type 2) holding `len` bytes. */
static void put_ld(buf_t *b, int field, const void *data, size_t len) {
  put_varint(b, (uint64_t)field << 3 | 2);
  put_varint(b, len);
  put(b, data, len);
}

enum { F_BYTES = 1, F_FLOAT = 2, F_INT64 = 3 };

typedef struct {
  const char *key;
  int kind;
  const void *bytes; /* F_BYTES: one value */
  size_t len;
  int64_t ival; /* F_INT64: one value */
} feat_t;

/* Encodes an Example with the given features into *out (malloc'ed). */
static size_t build_example(const feat_t *f, size_t n, uint8_t **out) {
  buf_t features = {0}, ex = {0};

  for (size_t i = 0; i < n; i++) {
    buf_t list = {0}, feature = {0}, entry = {0};
    if (f[i].kind == F_BYTES) {
      put_ld(&list, 1, f[i].bytes, f[i].len);
    } else if (f[i].kind == F_INT64) {
      buf_t packed = {0};
      put_varint(&packed, (uint64_t)f[i].ival);
      put_ld(&list, 1, packed.p, packed.n);
      free(packed.p);
    } else {
      float v = 1.5f;
      put_ld(&list, 1, &v, sizeof(v));
    }
    put_ld(&feature, f[i].kind, list.p, list.n);
    put_ld(&entry, 1, f[i].key, strlen(f[i].key));
    put_ld(&entry, 2, feature.p, feature.n);
    put_ld(&features, 1, entry.p, entry.n);
    free(list.p);
    free(feature.p);
    free(entry.p);
  }
  put_ld(&ex, 1, features.p, features.n);
  free(features.p);
  *out = ex.p;
  return ex.n;
}

/* A raw-image record with features image, label and id. */
static size_t raw_record(const uint8_t *img, size_t len, int64_t label,
                         uint8_t **out) {
  feat_t f[] = {
      {"image", F_BYTES, img, len, 0},
      {"label", F_INT64, NULL, 0, label},
      {"id", F_INT64, NULL, 0, 42},
  };
  return build_example(f, 3, out);
}

static void fill_random(uint8_t *p, size_t n, uint32_t seed) {
  uint32_t s = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; i++) {
    s = s * 1664525u + 1013904223u;
    p[i] = (uint8_t)(s >> 24);
  }
}

/* A smooth, photo-like RGB image (JPEG of it stays close to it). */
static void fill_photo(uint8_t *p, int h, int w, uint32_t seed) {
  uint32_t s = seed + 7;
  for (int y = 0; y < h; y++)
    for (int x = 0; x < w; x++) {
      s = s * 1664525u + 1013904223u;
      uint8_t *px = p + ((size_t)y * w + x) * 3;
      px[0] = (uint8_t)(x * 255 / w);
      px[1] = (uint8_t)(y * 255 / h);
      px[2] = (uint8_t)(((x - w / 2) * (x - w / 2) + (y - h / 2) * (y - h / 2)
                         < h * w / 9)
                            ? 200 + (s >> 29)
                            : 40 + (s >> 29));
    }
}

static size_t make_jpeg(int h, int w, uint32_t seed, uint8_t **out) {
  uint8_t *rgb = malloc((size_t)h * w * 3);
  unsigned char *jpeg = NULL;
  unsigned long jlen = 0;
  tjhandle tj = tjInitCompress();

  cr_assert_not_null(rgb);
  cr_assert_not_null(tj);
  fill_photo(rgb, h, w, seed);
  cr_assert_eq(tjCompress2(tj, rgb, w, 0, h, TJPF_RGB, &jpeg, &jlen,
                           TJSAMP_420, 90, 0),
               0, "%s", tjGetErrorStr2(tj));
  *out = malloc(jlen);
  memcpy(*out, jpeg, jlen);
  tjFree(jpeg);
  tjDestroy(tj);
  free(rgb);
  return jlen;
}

/* A spec filled by hand, with heap keys that the test frees right after
 * ferry__pipeline_new (the pipeline must have made its own copies). */
static void spec_raw(ferry_spec_t *s, int h, int w, int c) {
  memset(s, 0, sizeof(*s));
  s->format = FERRY_IMAGE_RAW;
  s->height = h;
  s->width = w;
  s->channels = c;
  s->image_key = strdup("image");
  s->label_key = strdup("label");
  s->repeat = 1;
}

static void spec_jpeg(ferry_spec_t *s, int h, int w) {
  spec_raw(s, h, w, 3);
  s->format = FERRY_IMAGE_JPEG;
}

static void add_op(ferry_spec_t *s, ferry_op_kind_t kind, int a, int b,
                   float sigma) {
  ferry_image_op_t *op = &s->ops[s->n_ops++];
  op->kind = kind;
  op->a = a;
  op->b = b;
  op->sigma = sigma;
}

static void seed_ops(ferry_spec_t *s) {
  add_op(s, FERRY_OP_DILATE, 3, 0, 0);
  add_op(s, FERRY_OP_BLUR, 11, 0, 0.8f);
}

/* Compiles `s` (then frees its keys) and makes a ctx. */
static void compile(ferry_spec_t *s, ferry_pipeline_t **p,
                    ferry_pipeline_ctx_t **ctx) {
  ferry_error_t err = {0};
  int rc = ferry__pipeline_new(s, p, &err);
  free(s->image_key);
  free(s->label_key);
  s->image_key = s->label_key = NULL;
  cr_assert_eq(rc, 0, "pipeline_new: %s", err.msg);
  rc = ferry__pipeline_ctx_new(*p, ctx, &err);
  cr_assert_eq(rc, 0, "ctx_new: %s", err.msg);
}

static void release(ferry_pipeline_t *p, ferry_pipeline_ctx_t *ctx) {
  ferry__pipeline_ctx_free(ctx);
  ferry__pipeline_free(p);
}

/* A JPEG record cut after `cut` bytes fails as a bad or truncated JPEG. */
static void expect_cut_jpeg_fails(ferry_pipeline_ctx_t *ctx,
                                  const uint8_t *jpeg, size_t cut) {
  uint8_t *rec;
  const uint8_t *px;
  int h, w, c;
  int64_t label;
  ferry_error_t err = {0};
  size_t len = raw_record(jpeg, cut, 1, &rec);
  int rc =
      ferry__pipeline_process(ctx, rec, len, &px, &h, &w, &c, &label, &err);
  cr_assert(rc == FERRY_EJPEG || rc == FERRY_EJPEGTRUNC, "got %s: %s",
            ferry_err_name(rc), err.msg);
  free(rec);
}

/* The ctx still works after errors: the whole JPEG (side x side) decodes
 * with its label. */
static void expect_ctx_recovers(ferry_pipeline_ctx_t *ctx,
                                const uint8_t *jpeg, size_t jlen, int side) {
  uint8_t *rec;
  const uint8_t *px;
  int h, w, c;
  int64_t label;
  ferry_error_t err = {0};
  size_t len = raw_record(jpeg, jlen, 9, &rec);
  cr_assert_eq(
      ferry__pipeline_process(ctx, rec, len, &px, &h, &w, &c, &label, &err), 0,
      "%s", err.msg);
  cr_assert(h == side && w == side && label == 9);
  free(rec);
}

/* Runs dilate(3) then blur(11, 0.8) directly on an h x w x c image. */
static void direct_ops(const uint8_t *img, int h, int w, int c,
                       uint8_t *out) {
  ferry_blur_t *blur = NULL;
  ferry_error_t err = {0};
  uint8_t *tmp = malloc((size_t)h * w * c);

  ferry__dilate3x3(img, tmp, h, w, c);
  cr_assert_eq(ferry__blur_new(11, 0.8f, &blur, &err), 0, "%s", err.msg);
  cr_assert_eq(ferry__blur_apply(blur, tmp, out, h, w, c, &err), 0, "%s",
               err.msg);
  ferry__blur_free(blur);
  free(tmp);
}

Test(pipeline, raw_matches_direct_ops) {
  enum { H = 32, W = 32, C = 3, N = H * W * C };
  uint8_t img[N], want[N], *rec;
  size_t len;
  ferry_spec_t s;
  ferry_pipeline_t *p;
  ferry_pipeline_ctx_t *ctx;
  ferry_error_t err = {0};
  const uint8_t *px;
  int h, w, c, sh, sw, sc;
  int64_t label = -1;

  spec_raw(&s, H, W, C);
  seed_ops(&s);
  compile(&s, &p, &ctx);
  cr_assert_eq(ferry__pipeline_shape(p, &sh, &sw, &sc), 0);
  cr_assert(sh == H && sw == W && sc == C);

  for (uint32_t seed = 1; seed <= 3; seed++) {
    fill_random(img, N, seed);
    len = raw_record(img, N, 100 + seed, &rec);
    direct_ops(img, H, W, C, want);
    cr_assert_eq(
        ferry__pipeline_process(ctx, rec, len, &px, &h, &w, &c, &label, &err),
        0, "%s", err.msg);
    cr_assert(h == H && w == W && c == C);
    cr_assert_eq(label, (int64_t)(100 + seed));
    cr_assert_arr_eq(px, want, N, "seed %u: output differs", seed);
    free(rec);
  }
  release(p, ctx);
}

Test(pipeline, raw_without_ops_is_a_copy_unless_borrowed) {
  enum { H = 8, W = 6, C = 1, N = H * W * C };
  uint8_t img[N], *rec;
  size_t len;
  ferry_spec_t s;
  ferry_pipeline_t *p;
  ferry_pipeline_ctx_t *ctx;
  ferry_error_t err = {0};
  const uint8_t *px;
  int h, w, c;
  int64_t label;

  spec_raw(&s, H, W, C);
  free(s.label_key);
  s.label_key = NULL; /* no label: reported as 0 */
  compile(&s, &p, &ctx);
  fill_random(img, N, 9);
  len = raw_record(img, N, 5, &rec);
  cr_assert_eq(
      ferry__pipeline_process(ctx, rec, len, &px, &h, &w, &c, &label, &err), 0,
      "%s", err.msg);
  cr_assert_arr_eq(px, img, N);
  cr_assert(px < rec || px >= rec + len, "output must be the ctx's memory");
  cr_assert_eq(label, 0);
  /* ferry__pipeline_ctx_set_borrow: the record's own bytes are handed out
   * (the worker copies them straight into a chunk). */
  ferry__pipeline_ctx_set_borrow(ctx, 1);
  cr_assert_eq(
      ferry__pipeline_process(ctx, rec, len, &px, &h, &w, &c, &label, &err), 0,
      "%s", err.msg);
  cr_assert(px >= rec && px + N <= rec + len,
            "borrowed output must lie in the record");
  cr_assert_arr_eq(px, img, N);
  cr_assert(h == H && w == W && c == C);
  release(p, ctx);
  /* An op that changes the pixels writes the ctx's buffer, borrow or not. */
  uint8_t want[N];
  spec_raw(&s, H, W, C);
  seed_ops(&s);
  compile(&s, &p, &ctx);
  ferry__pipeline_ctx_set_borrow(ctx, 1);
  direct_ops(img, H, W, C, want);
  cr_assert_eq(
      ferry__pipeline_process(ctx, rec, len, &px, &h, &w, &c, &label, &err), 0,
      "%s", err.msg);
  cr_assert(px < rec || px >= rec + len);
  cr_assert_arr_eq(px, want, N);
  free(rec);
  release(p, ctx);
}

Test(pipeline, custom_keys_and_extra_features) {
  enum { H = 7, W = 9, C = 3, N = H * W * C };
  uint8_t img[N], want[N], *rec;
  size_t len;
  ferry_spec_t s;
  ferry_pipeline_t *p;
  ferry_pipeline_ctx_t *ctx;
  ferry_error_t err = {0};
  const uint8_t *px;
  int h, w, c;
  int64_t label;

  fill_random(img, N, 4);
  feat_t f[] = {
      {"other", F_FLOAT, NULL, 0, 0},
      {"y", F_INT64, NULL, 0, -3},
      {"pixels", F_BYTES, img, N, 0},
  };
  len = build_example(f, 3, &rec);
  spec_raw(&s, H, W, C);
  free(s.image_key);
  free(s.label_key);
  s.image_key = strdup("pixels");
  s.label_key = strdup("y");
  add_op(&s, FERRY_OP_DILATE, 3, 0, 0);
  compile(&s, &p, &ctx);
  ferry__dilate3x3(img, want, H, W, C);
  cr_assert_eq(
      ferry__pipeline_process(ctx, rec, len, &px, &h, &w, &c, &label, &err), 0,
      "%s", err.msg);
  cr_assert_arr_eq(px, want, N);
  cr_assert_eq(label, -3);
  free(rec);
  release(p, ctx);
}

Test(pipeline, jpeg_matches_direct_ops) {
  enum { H = 40, W = 48 };
  uint8_t *jpeg, *rec, *dec, *want;
  size_t jlen, len;
  ferry_spec_t s;
  ferry_pipeline_t *p;
  ferry_pipeline_ctx_t *ctx;
  ferry_jpeg_t *j;
  ferry_error_t err = {0};
  const uint8_t *px;
  int h, w, c, dh, dw;
  int64_t label;

  jlen = make_jpeg(H, W, 3, &jpeg);
  len = raw_record(jpeg, jlen, 11, &rec);
  dec = malloc(H * W * 3);
  want = malloc(H * W * 3);
  cr_assert_eq(ferry__jpeg_new(&j, &err), 0, "%s", err.msg);
  cr_assert_eq(
      ferry__jpeg_decode(j, jpeg, jlen, dec, H * W * 3, &dh, &dw, &err), 0,
      "%s", err.msg);
  cr_assert(dh == H && dw == W);
  direct_ops(dec, H, W, 3, want);

  spec_jpeg(&s, 0, 0); /* any size */
  seed_ops(&s);
  compile(&s, &p, &ctx);
  cr_assert_eq(ferry__pipeline_shape(p, &h, &w, &c), FERRY_ESHAPE);
  /* Twice: the second run reuses the grown buffers. */
  for (int k = 0; k < 2; k++) {
    cr_assert_eq(
        ferry__pipeline_process(ctx, rec, len, &px, &h, &w, &c, &label, &err),
        0, "%s", err.msg);
    cr_assert(h == H && w == W && c == 3);
    cr_assert_eq(label, 11);
    cr_assert_arr_eq(px, want, H * W * 3);
  }
  release(p, ctx);
  ferry__jpeg_free(j);
  free(dec);
  free(want);
  free(rec);
  free(jpeg);
}

Test(pipeline, jpeg_wrong_size_is_eshape_unless_resized) {
  uint8_t *jpeg, *rec, *dec, *want;
  size_t jlen, len;
  ferry_spec_t s;
  ferry_pipeline_t *p;
  ferry_pipeline_ctx_t *ctx;
  ferry_jpeg_t *j;
  ferry_error_t err = {0};
  const uint8_t *px;
  int h, w, c, dh, dw;
  int64_t label;

  jlen = make_jpeg(24, 20, 5, &jpeg);
  len = raw_record(jpeg, jlen, 1, &rec);

  spec_jpeg(&s, 16, 16);
  seed_ops(&s);
  compile(&s, &p, &ctx);
  cr_assert_eq(ferry__pipeline_shape(p, &h, &w, &c), 0);
  cr_assert_eq(
      ferry__pipeline_process(ctx, rec, len, &px, &h, &w, &c, &label, &err),
      FERRY_ESHAPE);
  cr_assert_eq(err.code, FERRY_ESHAPE);
  cr_assert(strstr(err.msg, "24x20") && strstr(err.msg, "16x16"), "%s",
            err.msg);
  release(p, ctx);

  /* The same spec with a resize first: the record fits. */
  spec_jpeg(&s, 16, 16);
  add_op(&s, FERRY_OP_RESIZE, 16, 16, 0);
  seed_ops(&s);
  compile(&s, &p, &ctx);
  cr_assert_eq(ferry__pipeline_shape(p, &h, &w, &c), 0);
  cr_assert(h == 16 && w == 16 && c == 3);
  cr_assert_eq(
      ferry__pipeline_process(ctx, rec, len, &px, &h, &w, &c, &label, &err), 0,
      "%s", err.msg);
  cr_assert(h == 16 && w == 16 && c == 3);

  dec = malloc(24 * 20 * 3);
  want = malloc(16 * 16 * 3);
  uint8_t *rs = malloc(16 * 16 * 3);
  cr_assert_eq(ferry__jpeg_new(&j, &err), 0, "%s", err.msg);
  cr_assert_eq(
      ferry__jpeg_decode(j, jpeg, jlen, dec, 24 * 20 * 3, &dh, &dw, &err), 0,
      "%s", err.msg);
  ferry__resize_bilinear(dec, 24, 20, 3, rs, 16, 16);
  direct_ops(rs, 16, 16, 3, want);
  cr_assert_arr_eq(px, want, 16 * 16 * 3);
  ferry__jpeg_free(j);
  free(rs);
  free(dec);
  free(want);
  release(p, ctx);
  free(rec);
  free(jpeg);
}

/* Runs one record through a fresh raw 4x4x1 pipeline (dilate only) and
 * returns the code; `err` gets the message. */
static int run_raw_once(ferry_spec_t *s, const uint8_t *rec, size_t len,
                        ferry_error_t *err) {
  ferry_pipeline_t *p;
  ferry_pipeline_ctx_t *ctx;
  const uint8_t *px;
  int h, w, c, rc;
  int64_t label;

  compile(s, &p, &ctx);
  rc = ferry__pipeline_process(ctx, rec, len, &px, &h, &w, &c, &label, err);
  /* The same error without an error struct must not crash. */
  cr_assert_eq(
      ferry__pipeline_process(ctx, rec, len, &px, &h, &w, &c, &label, NULL),
      rc);
  release(p, ctx);
  return rc;
}

Test(pipeline, missing_image_feature) {
  uint8_t *rec;
  size_t len;
  ferry_spec_t s;
  ferry_error_t err = {0};
  feat_t f[] = {{"label", F_INT64, NULL, 0, 1}, {"id", F_INT64, NULL, 0, 2}};

  len = build_example(f, 2, &rec);
  spec_raw(&s, 4, 4, 1);
  add_op(&s, FERRY_OP_DILATE, 3, 0, 0);
  cr_assert_eq(run_raw_once(&s, rec, len, &err), FERRY_ENOFEATURE);
  cr_assert_eq(err.code, FERRY_ENOFEATURE);
  cr_assert(strstr(err.msg, "'image'") != NULL, "%s", err.msg);
  /* The record's keys are file bytes: counted, not quoted. */
  cr_assert(strstr(err.msg, "has 2 other features") != NULL, "%s", err.msg);
  cr_assert(strstr(err.msg, "'label'") == NULL &&
                strstr(err.msg, "'id'") == NULL,
            "no key read from the file in the message: %s", err.msg);
  free(rec);
}

Test(pipeline, missing_label_feature) {
  uint8_t img[16] = {0}, *rec;
  size_t len;
  ferry_spec_t s;
  ferry_error_t err = {0};
  feat_t f[] = {{"image", F_BYTES, img, 16, 0}};

  len = build_example(f, 1, &rec);
  spec_raw(&s, 4, 4, 1);
  cr_assert_eq(run_raw_once(&s, rec, len, &err), FERRY_ENOFEATURE);
  cr_assert(strstr(err.msg, "'label'") != NULL, "%s", err.msg);
  free(rec);
}

Test(pipeline, wrong_feature_types) {
  uint8_t img[16] = {0}, *rec;
  size_t len;
  ferry_spec_t s;
  ferry_error_t err = {0};
  feat_t f1[] = {{"image", F_INT64, NULL, 0, 3},
                 {"label", F_INT64, NULL, 0, 1}};
  feat_t f2[] = {{"image", F_BYTES, img, 16, 0},
                 {"label", F_FLOAT, NULL, 0, 0}};

  len = build_example(f1, 2, &rec);
  spec_raw(&s, 4, 4, 1);
  cr_assert_eq(run_raw_once(&s, rec, len, &err), FERRY_EFEATTYPE);
  cr_assert(strstr(err.msg, "'image'") != NULL, "%s", err.msg);
  free(rec);

  len = build_example(f2, 2, &rec);
  spec_raw(&s, 4, 4, 1);
  cr_assert_eq(run_raw_once(&s, rec, len, &err), FERRY_EFEATTYPE);
  cr_assert(strstr(err.msg, "'label'") != NULL, "%s", err.msg);
  free(rec);
}

Test(pipeline, raw_of_wrong_size) {
  uint8_t img[15] = {0}, *rec;
  size_t len;
  ferry_spec_t s;
  ferry_error_t err = {0};

  len = raw_record(img, sizeof(img), 1, &rec);
  /* With ops (the size check of the zero-copy path) and without (the
   * check of ferry__decode_raw). */
  spec_raw(&s, 4, 4, 1);
  add_op(&s, FERRY_OP_DILATE, 3, 0, 0);
  cr_assert_eq(run_raw_once(&s, rec, len, &err), FERRY_EIMGSIZE);
  cr_assert(strstr(err.msg, "16") && strstr(err.msg, "15"), "%s", err.msg);
  spec_raw(&s, 4, 4, 1);
  cr_assert_eq(run_raw_once(&s, rec, len, &err), FERRY_EIMGSIZE);
  cr_assert(strstr(err.msg, "image") != NULL, "%s", err.msg);
  free(rec);
}

Test(pipeline, malformed_example) {
  uint8_t *rec;
  size_t len;
  ferry_spec_t s;
  ferry_error_t err = {0};
  uint8_t img[16] = {0};
  int rc;

  len = raw_record(img, sizeof(img), 1, &rec);
  spec_raw(&s, 4, 4, 1);
  /* Cut inside the image bytes: a length runs past the end. */
  rc = run_raw_once(&s, rec, len - 10, &err);
  cr_assert(rc == FERRY_EOVERRUN || rc == FERRY_EVARINT ||
                rc == FERRY_EWIRETYPE,
            "got %s: %s", ferry_err_name(rc), err.msg);
  free(rec);
}

Test(pipeline, corrupt_jpeg) {
  uint8_t *jpeg, *rec, junk[300];
  size_t jlen, len;
  ferry_spec_t s;
  ferry_error_t err = {0};
  ferry_pipeline_t *p;
  ferry_pipeline_ctx_t *ctx;
  const uint8_t *px;
  int h, w, c, rc;
  int64_t label;

  spec_jpeg(&s, 0, 0);
  seed_ops(&s);
  compile(&s, &p, &ctx);

  fill_random(junk, sizeof(junk), 77);
  len = raw_record(junk, sizeof(junk), 1, &rec);
  rc = ferry__pipeline_process(ctx, rec, len, &px, &h, &w, &c, &label, &err);
  cr_assert_eq(rc, FERRY_EJPEG, "got %s: %s", ferry_err_name(rc), err.msg);
  cr_assert(strstr(err.msg, "image") != NULL, "%s", err.msg);
  free(rec);

  /* A JPEG cut short after its header. */
  jlen = make_jpeg(64, 64, 1, &jpeg);
  expect_cut_jpeg_fails(ctx, jpeg, jlen / 3);
  expect_ctx_recovers(ctx, jpeg, jlen, 64);
  free(jpeg);
  release(p, ctx);
}

Test(pipeline, too_small_for_blur) {
  uint8_t img[5 * 5 * 3] = {0}, *rec;
  size_t len;
  ferry_spec_t s;
  ferry_error_t err = {0};

  len = raw_record(img, sizeof(img), 1, &rec);
  spec_raw(&s, 5, 5, 3);
  seed_ops(&s);
  cr_assert_eq(run_raw_once(&s, rec, len, &err), FERRY_ETOOSMALL);
  cr_assert(strstr(err.msg, "blur") != NULL, "%s", err.msg);
  free(rec);
}

Test(pipeline, bad_specs_are_rejected) {
  ferry_spec_t s;
  ferry_pipeline_t *p = (ferry_pipeline_t *)&s;
  ferry_error_t err = {0};

  spec_raw(&s, 0, 4, 3); /* raw needs sizes */
  cr_assert_lt(ferry__pipeline_new(&s, &p, &err), 0);
  cr_assert_null(p);
  free(s.image_key);
  free(s.label_key);

  spec_raw(&s, 4, 4, 3);
  add_op(&s, FERRY_OP_BLUR, 10, 0, 0.8f); /* even size */
  cr_assert_lt(ferry__pipeline_new(&s, &p, &err), 0);
  cr_assert(strstr(err.msg, "blur") != NULL, "%s", err.msg);
  free(s.image_key);
  free(s.label_key);

  spec_raw(&s, 4, 4, 3);
  add_op(&s, FERRY_OP_DILATE, 5, 0, 0);
  cr_assert_lt(ferry__pipeline_new(&s, &p, &err), 0);
  free(s.image_key);
  free(s.label_key);
}

Test(pipeline, timing) {
  enum { H = 16, W = 16, C = 3, N = H * W * C };
  uint8_t img[N], *rec;
  size_t len;
  ferry_spec_t s;
  ferry_pipeline_t *p;
  ferry_pipeline_ctx_t *ctx;
  ferry_error_t err = {0};
  const uint8_t *px;
  int h, w, c;
  int64_t label;
  double t[FERRY_STAGE_COUNT];

  fill_random(img, N, 2);
  len = raw_record(img, N, 1, &rec);
  spec_raw(&s, H, W, C);
  seed_ops(&s);
  compile(&s, &p, &ctx);
  ferry__pipeline_process(ctx, rec, len, &px, &h, &w, &c, &label, &err);
  ferry__pipeline_ctx_times(ctx, t);
  for (int i = 0; i < FERRY_STAGE_COUNT; i++)
    cr_assert_eq(t[i], 0.0, "timing is off by default");
  ferry__pipeline_ctx_set_timing(ctx, 1);
  for (int i = 0; i < 50; i++)
    cr_assert_eq(
        ferry__pipeline_process(ctx, rec, len, &px, &h, &w, &c, &label, &err),
        0);
  ferry__pipeline_ctx_times(ctx, t);
  cr_assert_gt(t[FERRY_STAGE_PARSE], 0.0);
  cr_assert_gt(t[FERRY_STAGE_OPS], 0.0);
  cr_assert_gt(t[FERRY_STAGE_BLUR], 0.0);
  cr_assert_geq(t[FERRY_STAGE_OPS],
                t[FERRY_STAGE_DILATE] + t[FERRY_STAGE_BLUR]);
  free(rec);
  release(p, ctx);
}

/* Records of each kind run 1000 times after a warm-up: the allocator's
 * live block count and bytes must not move. */
static void assert_steady_state(ferry_spec_t *s, uint8_t **recs,
                                size_t *lens, int n) {
  ferry_pipeline_t *p;
  ferry_pipeline_ctx_t *ctx;
  ferry_error_t err = {0};
  ferry_alloc_stats_t before, after;
  const uint8_t *px;
  int h, w, c;
  int64_t label;

  compile(s, &p, &ctx);
  for (int i = 0; i < 2 * n; i++)
    cr_assert_eq(ferry__pipeline_process(ctx, recs[i % n], lens[i % n], &px, &h,
                                         &w, &c, &label, &err),
                 0, "%s", err.msg);
  ferry__alloc_stats(&before);
  for (int i = 0; i < 1000; i++)
    cr_assert_eq(ferry__pipeline_process(ctx, recs[i % n], lens[i % n], &px, &h,
                                         &w, &c, &label, &err),
                 0, "%s", err.msg);
  ferry__alloc_stats(&after);
  cr_assert_eq(after.blocks, before.blocks, "blocks %lld -> %lld",
               (long long)before.blocks, (long long)after.blocks);
  cr_assert_eq(after.bytes, before.bytes);
  release(p, ctx);
}

Test(pipeline, no_allocation_in_steady_state) {
  enum { H = 32, W = 32, C = 3, N = H * W * C };
  uint8_t img[N], *recs[3];
  size_t lens[3];
  ferry_spec_t s;

  for (int i = 0; i < 3; i++) {
    fill_random(img, N, (uint32_t)i);
    lens[i] = raw_record(img, N, i, &recs[i]);
  }
  spec_raw(&s, H, W, C);
  seed_ops(&s);
  assert_steady_state(&s, recs, lens, 3);
  for (int i = 0; i < 3; i++)
    free(recs[i]);

  /* JPEGs of three sizes, any size accepted. */
  int sizes[3][2] = {{40, 48}, {64, 32}, {24, 24}};
  for (int i = 0; i < 3; i++) {
    uint8_t *jpeg;
    size_t jlen = make_jpeg(sizes[i][0], sizes[i][1], (uint32_t)i, &jpeg);
    lens[i] = raw_record(jpeg, jlen, i, &recs[i]);
    free(jpeg);
  }
  spec_jpeg(&s, 0, 0);
  seed_ops(&s);
  assert_steady_state(&s, recs, lens, 3);

  /* The same JPEGs resized to one shape. */
  spec_jpeg(&s, 0, 0);
  add_op(&s, FERRY_OP_RESIZE, 32, 32, 0);
  seed_ops(&s);
  assert_steady_state(&s, recs, lens, 3);
  for (int i = 0; i < 3; i++)
    free(recs[i]);
}

/* ---------------------------------------------------------------------
 * The crop ops: fused with the JPEG decode when first, keyed
 * by (seed, epoch, record).
 */

static void add_rrc(ferry_spec_t *s, int size, bool exact) {
  ferry_image_op_t *op = &s->ops[s->n_ops++];
  memset(op, 0, sizeof(*op));
  op->kind = FERRY_OP_RANDOM_RESIZED_CROP;
  op->a = op->b = size;
  op->scale[0] = 0.08f;
  op->scale[1] = 1.0f;
  op->ratio[0] = 0.75f;
  op->ratio[1] = (float)(4.0 / 3.0);
  op->exact = exact;
}

/* The fused pipeline gives ferry__jpeg_decode_crop's pixels for the same
 * key; exact=true the exact path's; the same key replays, another epoch
 * draws another crop; the counters say what ran. */
Test(pipeline, random_resized_crop_fused_and_exact) {
  uint8_t *jpeg, *rec, *want = malloc(64 * 64 * 3);
  size_t jlen = make_jpeg(300, 400, 5, &jpeg), len;
  ferry_spec_t s;
  ferry_error_t err = {0};
  ferry_pipeline_t *p[2];
  ferry_pipeline_ctx_t *ctx[2];
  const uint8_t *px;
  int h, w, c, oh, ow;
  int64_t label;
  ferry_jpeg_t *j;

  len = raw_record(jpeg, jlen, 3, &rec);
  cr_assert_eq(ferry__jpeg_new(&j, NULL), 0);
  for (int exact = 0; exact <= 1; exact++) {
    spec_jpeg(&s, 0, 0);
    add_rrc(&s, 64, exact);
    compile(&s, &p[exact], &ctx[exact]);
    cr_assert_eq(ferry__pipeline_shape(p[exact], &h, &w, &c), 0);
    cr_assert(h == 64 && w == 64 && c == 3);
    for (uint64_t rec_id = 0; rec_id < 20; rec_id++) {
      ferry_crop_op_t op = {.kind = FERRY_CROP_RANDOM_RESIZED,
                            .out_h = 64,
                            .out_w = 64,
                            .rrc = {0.08f, 1.0f, 0.75f, (float)(4.0 / 3.0)},
                            .key = ferry__crop_key(7, 2, rec_id),
                            .exact = exact};
      ferry__pipeline_ctx_set_key(ctx[exact], 7, 2, rec_id);
      cr_assert_eq(ferry__pipeline_process(ctx[exact], rec, len, &px, &h, &w,
                                           &c, &label, &err),
                   0, "%s", err.msg);
      cr_assert(h == 64 && w == 64 && c == 3 && label == 3);
      ferry_decode_path_t dp = ferry__pipeline_ctx_last_decode(ctx[exact]);
      cr_assert(exact ? dp == FERRY_DECODE_FULL
                      : dp == FERRY_DECODE_FUSED || dp == FERRY_DECODE_FULL,
                "exact %d: path %d", exact, (int)dp);
      cr_assert_eq(ferry__jpeg_decode_crop(j, jpeg, jlen, &op, want,
                                           64 * 64 * 3, &oh, &ow, NULL, &err),
                   0, "%s", err.msg);
      cr_assert(memcmp(px, want, 64 * 64 * 3) == 0,
                "exact %d record %llu: not decode_crop's pixels", exact,
                (unsigned long long)rec_id);
    }
  }
  ferry_jpeg_crop_stats_t st;
  ferry__pipeline_ctx_jpeg_stats(ctx[0], &st);
  cr_assert(st.images == 20 && st.fused + st.full == 20 && st.fused > 0,
            "fused %llu full %llu", (unsigned long long)st.fused,
            (unsigned long long)st.full);
  ferry__pipeline_ctx_jpeg_stats(ctx[1], &st);
  cr_assert(st.fused == 0, "exact=true fused %llu", (unsigned long long)st.fused);

  /* Replays and epochs. */
  uint8_t a[64 * 64 * 3];
  ferry__pipeline_ctx_set_key(ctx[0], 7, 2, 11);
  cr_assert_eq(
      ferry__pipeline_process(ctx[0], rec, len, &px, &h, &w, &c, &label, &err),
      0);
  memcpy(a, px, sizeof(a));
  ferry__pipeline_ctx_set_key(ctx[0], 7, 2, 11);
  cr_assert_eq(
      ferry__pipeline_process(ctx[0], rec, len, &px, &h, &w, &c, &label, &err),
      0);
  cr_assert(memcmp(a, px, sizeof(a)) == 0, "the same key drew another crop");
  ferry__pipeline_ctx_set_key(ctx[0], 7, 3, 11);
  cr_assert_eq(
      ferry__pipeline_process(ctx[0], rec, len, &px, &h, &w, &c, &label, &err),
      0);
  cr_assert(memcmp(a, px, sizeof(a)) != 0, "another epoch, the same crop");
  for (int i = 0; i < 2; i++)
    release(p[i], ctx[i]);
  ferry__jpeg_free(j);
  free(rec);
  free(jpeg);
  free(want);
}

/* resize(S) | center_crop fused equals the unfused exact path within 1
 * at scale 8/8 (small images), and on raw images runs the same math. */
Test(pipeline, resize_center_crop_fused_and_raw) {
  int H = 120, W = 160;
  uint8_t *jpeg, *rec, *rgb = malloc((size_t)H * W * 3), *out[2];
  size_t jlen = make_jpeg(H, W, 9, &jpeg), len;
  ferry_spec_t s;
  ferry_error_t err = {0};
  ferry_pipeline_t *p;
  ferry_pipeline_ctx_t *ctx;
  const uint8_t *px;
  int h, w, c;
  int64_t label;

  len = raw_record(jpeg, jlen, 1, &rec);
  for (int exact = 0; exact <= 1; exact++) {
    spec_jpeg(&s, 0, 0);
    add_op(&s, FERRY_OP_RESIZE_SHORTER, 100, 0, 0);
    s.ops[0].exact = exact;
    add_op(&s, FERRY_OP_CENTER_CROP, 90, 80, 0);
    compile(&s, &p, &ctx);
    cr_assert_eq(
        ferry__pipeline_process(ctx, rec, len, &px, &h, &w, &c, &label, &err),
        0, "%s", err.msg);
    cr_assert(h == 90 && w == 80, "%dx%d", h, w);
    out[exact] = malloc(90 * 80 * 3);
    memcpy(out[exact], px, 90 * 80 * 3);
    release(p, ctx);
  }
  /* Scale 7/8 against 8/8 on a synthetic image with hard edges: close
   * on average (the photographs' bounds are test_crop's). */
  double sq = 0;
  for (size_t i = 0; i < 90 * 80 * 3; i++)
    sq += (double)(out[0][i] - out[1][i]) * (out[0][i] - out[1][i]);
  double mse = sq / (90 * 80 * 3);
  cr_assert(mse < 65.0, "fused vs exact: mse %g (PSNR %.1f dB)", mse,
            10 * log10(65025.0 / mse));
  /* A raw image: resize(S) alone gives the torchvision size. */
  fill_photo(rgb, H, W, 3);
  free(rec);
  len = raw_record(rgb, (size_t)H * W * 3, 1, &rec);
  spec_raw(&s, H, W, 3);
  add_op(&s, FERRY_OP_RESIZE_SHORTER, 50, 0, 0);
  compile(&s, &p, &ctx);
  cr_assert_eq(ferry__pipeline_shape(p, &h, &w, &c), 0);
  cr_assert(h == 50 && w == 66, "%dx%d", h, w);
  cr_assert_eq(
      ferry__pipeline_process(ctx, rec, len, &px, &h, &w, &c, &label, &err), 0,
      "%s", err.msg);
  cr_assert(h == 50 && w == 66, "%dx%d", h, w);
  release(p, ctx);
  free(out[0]);
  free(out[1]);
  free(rec);
  free(rgb);
  free(jpeg);
}

/* Bad JPEGs through the fused decode: errors name the feature and keep
 * the codes the error policies act on (corrupt FERRY_EJPEG, cut short
 * FERRY_EJPEGTRUNC, also when the cut lies below the crop window). */
Test(pipeline, bad_jpegs_fused) {
  uint8_t *jpeg, *rec, junk[300];
  size_t jlen = make_jpeg(256, 256, 2, &jpeg), len;
  ferry_spec_t s;
  ferry_error_t err = {0};
  ferry_pipeline_t *p;
  ferry_pipeline_ctx_t *ctx;
  const uint8_t *px;
  int h, w, c, rc;
  int64_t label;

  spec_jpeg(&s, 0, 0);
  add_rrc(&s, 32, false);
  compile(&s, &p, &ctx);
  fill_random(junk, sizeof(junk), 78);
  len = raw_record(junk, sizeof(junk), 1, &rec);
  rc = ferry__pipeline_process(ctx, rec, len, &px, &h, &w, &c, &label, &err);
  cr_assert_eq(rc, FERRY_EJPEG, "got %s: %s", ferry_err_name(rc), err.msg);
  cr_assert(strstr(err.msg, "feature 'image'") != NULL, "%s", err.msg);
  free(rec);
  /* Cut at 90%: many crops lie above the cut and decode no further; the
   * marker walk still finds the missing end. */
  for (uint64_t k = 0; k < 20; k++) {
    len = raw_record(jpeg, jlen * 9 / 10, 1, &rec);
    ferry__pipeline_ctx_set_key(ctx, 1, 0, k);
    rc = ferry__pipeline_process(ctx, rec, len, &px, &h, &w, &c, &label, &err);
    cr_assert_eq(rc, FERRY_EJPEGTRUNC, "key %llu: got %s: %s",
                 (unsigned long long)k, ferry_err_name(rc), err.msg);
    cr_assert(strstr(err.msg, "feature 'image'") != NULL, "%s", err.msg);
    free(rec);
  }
  /* Only the header. */
  expect_cut_jpeg_fails(ctx, jpeg, 200);
  expect_ctx_recovers(ctx, jpeg, jlen, 32);
  free(jpeg);
  release(p, ctx);
}

/* ---- The deterministic prefix (spec_prefix.c) ---------------------------- */

static void add_resize_shorter(ferry_spec_t *s, int size) {
  add_op(s, FERRY_OP_RESIZE_SHORTER, size, 0, 0);
}

/* Which leading ops depend only on the record. */
Test(pipeline, deterministic_prefix_rule) {
  ferry_spec_t s;
  const char *why;
  spec_raw(&s, 32, 32, 3);
  cr_assert_eq(ferry__spec_det_prefix(&s, &why), 0, "decode alone");
  seed_ops(&s);
  cr_assert_eq(ferry__spec_det_prefix(&s, &why), 2);
  cr_assert_str_eq(why, "the whole pipeline depends only on the record");
  add_rrc(&s, 16, false);
  add_op(&s, FERRY_OP_BLUR, 3, 0, 0.5f);
  cr_assert_eq(ferry__spec_det_prefix(&s, NULL), 2, "up to the crop");
  free(s.image_key);
  free(s.label_key);

  /* A JPEG decode fused with a random crop: nothing. */
  spec_jpeg(&s, 0, 0);
  add_rrc(&s, 64, false);
  cr_assert_eq(ferry__spec_det_prefix(&s, &why), -1);
  cr_assert(strstr(why, "fuses with random_resized_crop") != NULL, "%s", why);
  /* The exact crop does not fuse: the decode is the prefix. */
  s.ops[0].exact = true;
  cr_assert_eq(ferry__spec_det_prefix(&s, NULL), 0);
  /* Fused deterministic ops belong to it whole. */
  s.n_ops = 0;
  add_resize_shorter(&s, 80);
  add_op(&s, FERRY_OP_CENTER_CROP, 64, 64, 0);
  add_rrc(&s, 32, false);
  cr_assert_eq(ferry__spec_det_prefix(&s, NULL), 2);
  free(s.image_key);
  free(s.label_key);
}

/* The prefix's fingerprint names what it produces: the same for specs
 * that differ only after it or in epoch-level stages, another for
 * another prefix. */
Test(pipeline, prefix_fingerprints) {
  ferry_spec_t a, b;
  spec_raw(&a, 32, 32, 3);
  seed_ops(&a);
  spec_raw(&b, 32, 32, 3);
  seed_ops(&b);
  add_rrc(&b, 16, false);
  b.shuffle = true;
  b.shuffle_seed = 99;
  b.batch_size = 7;
  uint64_t fa = ferry__spec_prefix_fingerprint(&a, 2);
  cr_assert_neq(fa, 0);
  cr_assert_eq(fa, ferry__spec_prefix_fingerprint(&b, 2));
  cr_assert_neq(fa, ferry__spec_prefix_fingerprint(&a, 1));
  b.ops[1].sigma = 0.9f;
  cr_assert_neq(fa, ferry__spec_prefix_fingerprint(&b, 2));
  b.ops[1].sigma = 0.8f;
  free(b.label_key);
  b.label_key = strdup("other");
  cr_assert_neq(fa, ferry__spec_prefix_fingerprint(&b, 2),
                "the label is part of an entry");
  for (ferry_spec_t *s = &a; s != NULL; s = s == &a ? &b : NULL) {
    free(s->image_key);
    free(s->label_key);
  }
}

/* The prefix compiled alone, then ferry__pipeline_process_from on its
 * output, gives the whole pipeline's pixels bit for bit, random ops
 * keyed alike (what a cache hit serves is what recomputing gives). */
static void prefix_then_rest(ferry_spec_t *s, const uint8_t *rec, size_t len,
                             const char *what) {
  int n = ferry__spec_det_prefix(s, NULL);
  cr_assert_geq(n, 0, "%s", what);
  ferry_spec_t ps;
  cr_assert_eq(ferry__spec_prefix(s, (size_t)n, &ps), 0);
  ferry_pipeline_t *whole, *pre;
  ferry_pipeline_ctx_t *cw, *cp;
  ferry_error_t err = {0};
  cr_assert_eq(ferry__pipeline_new(&ps, &pre, &err), 0, "%s: %s", what,
               err.msg);
  ferry__spec_close(&ps);
  cr_assert_eq(ferry__pipeline_ctx_new(pre, &cp, &err), 0);
  compile(s, &whole, &cw);
  for (uint64_t id = 0; id < 8; id++) {
    const uint8_t *px, *pp, *out;
    int h, w, c, ph, pw, pc, oh, ow;
    int64_t label, plabel;
    ferry__pipeline_ctx_set_key(cw, 5, 3, id);
    ferry__pipeline_ctx_set_key(cp, 5, 3, id);
    cr_assert_eq(ferry__pipeline_process(cw, rec, len, &px, &h, &w, &c,
                                         &label, &err),
                 0, "%s: %s", what, err.msg);
    uint8_t *want = malloc((size_t)h * w * c);
    memcpy(want, px, (size_t)h * w * c);
    cr_assert_eq(ferry__pipeline_process(cp, rec, len, &pp, &ph, &pw, &pc,
                                         &plabel, &err),
                 0, "%s: %s", what, err.msg);
    cr_assert_eq(plabel, label);
    ferry__pipeline_ctx_set_key(cw, 5, 3, id);
    cr_assert_eq(ferry__pipeline_process_from(cw, (size_t)n, pp, ph, pw, pc,
                                              &out, &oh, &ow, &err),
                 0, "%s: %s", what, err.msg);
    cr_assert(oh == h && ow == w && pc == c, "%s: %dx%d, whole %dx%d", what,
              oh, ow, h, w);
    cr_assert(memcmp(out, want, (size_t)h * w * c) == 0,
              "%s, record %llu: prefix + rest differs from the whole", what,
              (unsigned long long)id);
    free(want);
  }
  release(whole, cw);
  release(pre, cp);
}

Test(pipeline, prefix_then_rest_equals_the_whole) {
  uint8_t img[40 * 36 * 3], *rec, *jpeg;
  fill_random(img, sizeof(img), 3);
  size_t len = raw_record(img, sizeof(img), 4, &rec);
  ferry_spec_t s;
  spec_raw(&s, 40, 36, 3);
  seed_ops(&s);
  prefix_then_rest(&s, rec, len, "raw: dilate | blur");
  spec_raw(&s, 40, 36, 3);
  seed_ops(&s);
  add_rrc(&s, 24, false);
  add_op(&s, FERRY_OP_DILATE, 3, 0, 0);
  prefix_then_rest(&s, rec, len, "raw: dilate | blur | rrc | dilate");
  free(rec);

  size_t jlen = make_jpeg(120, 160, 4, &jpeg);
  len = raw_record(jpeg, jlen, 2, &rec);
  spec_jpeg(&s, 0, 0);
  add_rrc(&s, 48, true);
  prefix_then_rest(&s, rec, len, "jpeg: exact rrc");
  spec_jpeg(&s, 0, 0);
  add_resize_shorter(&s, 90);
  add_op(&s, FERRY_OP_CENTER_CROP, 80, 80, 0);
  add_rrc(&s, 48, false);
  prefix_then_rest(&s, rec, len, "jpeg: resize(S) | center_crop (fused) | rrc");
  spec_jpeg(&s, 0, 0);
  add_op(&s, FERRY_OP_BLUR, 3, 0, 0.7f);
  add_rrc(&s, 48, false);
  add_op(&s, FERRY_OP_RESIZE, 32, 32, 0);
  prefix_then_rest(&s, rec, len, "jpeg: blur | rrc | resize");
  free(rec);
  free(jpeg);
}

/* A JPEG laid out in restart-interval tiles (ferryctl records optimize)
 * decodes through the window path, with the pixels of the same JPEG
 * decoded without it, and the ctx says so (the worker's
 * ferry_worker_jpeg_decodes_total{path="window"}). */
Test(pipeline, optimized_jpeg_takes_the_window_path) {
  uint8_t *jpeg, *opt, *rec, *orec;
  size_t jlen = make_jpeg(300, 400, 5, &jpeg), olen, len, rlen;
  ferry_spec_t s;
  ferry_error_t err = {0};
  ferry_pipeline_t *p;
  ferry_pipeline_ctx_t *ctx;
  ferry_jopt_result_t res;
  ferry_jpeg_t *j;
  const uint8_t *px;
  uint8_t a[64 * 64 * 3];
  int h, w, c, windows = 0;
  int64_t label;

  cr_assert_eq(ferry__jpeg_new(&j, NULL), 0);
  cr_assert_eq(ferry__jpeg_optimize(j, jpeg, jlen, &opt, &olen, &res, &err),
               0);
  cr_assert(res.reason == FERRY_JOPT_REWRITTEN, "%s", res.detail);
  len = raw_record(jpeg, jlen, 3, &rec);
  rlen = raw_record(opt, olen, 3, &orec);
  spec_jpeg(&s, 0, 0);
  add_rrc(&s, 64, 0);
  compile(&s, &p, &ctx);
  for (uint64_t id = 0; id < 20; id++) {
    ferry__pipeline_ctx_set_key(ctx, 7, 1, id);
    cr_assert_eq(ferry__pipeline_process(ctx, rec, len, &px, &h, &w, &c,
                                         &label, &err), 0, "%s", err.msg);
    cr_assert(ferry__pipeline_ctx_last_decode(ctx) != FERRY_DECODE_WINDOW);
    memcpy(a, px, sizeof(a));
    cr_assert_eq(ferry__pipeline_process(ctx, orec, rlen, &px, &h, &w, &c,
                                         &label, &err), 0, "%s", err.msg);
    cr_assert(memcmp(a, px, sizeof(a)) == 0, "record %llu: other pixels",
              (unsigned long long)id);
    windows += ferry__pipeline_ctx_last_decode(ctx) == FERRY_DECODE_WINDOW;
  }
  cr_assert(windows >= 10, "%d of 20 through the window", windows);
  ferry__pipeline_free(p);
  ferry__pipeline_ctx_free(ctx);
  ferry__jpeg_free(j);
  ferry__free(opt);
  free(rec);
  free(orec);
  free(jpeg);
}
