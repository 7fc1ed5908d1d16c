/* The per-record data path: parse the Example, find the image and label
 * features, decode, run the image ops in spec order.
 *
 * The compiled pipeline holds copies of what it needs from the spec and is
 * read-only after ferry__pipeline_new, so threads share it. Each thread's
 * ctx owns the mutable state: the Example's feature array, a TurboJPEG
 * handle, one blur object per blur op and two ping-pong pixel buffers that
 * grow to the largest image seen. Once they have grown, a record allocates
 * nothing.
 */
#include "pipeline.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#include "alloc.h"
#include "crop.h"
#include "example.h"
#include "imgops.h"

/* Pixel buffers are 64-byte aligned for the SIMD paths, with a little
 * slack past the end so vector code may load a full register at the tail. */
#define BUF_ALIGN 64
#define BUF_SLACK 64
#define BUF_MIN (16u << 10)

/* Largest image the pipeline accepts on any side (JPEG's own limit). */
#define MAX_SIDE 65535

struct ferry_pipeline_s {
  ferry_image_format_t format;
  int height, width, channels; /* decode size; JPEG: 0 = any */
  char *image_key;
  char *label_key; /* NULL: no label */
  ferry_image_op_t ops[FERRY_SPEC_MAX_OPS];
  size_t n_ops;
  bool has_resize; /* an op sets the size (the JPEG's may differ) */
  /* The decode fused with the first ops: `fused` ops (0, 1
   * or 2) run inside ferry__jpeg_decode_crop as `fop` says; the loop runs
   * the rest. */
  size_t fused;
  ferry_crop_op_t fop;
  int out_h, out_w, out_c; /* out_h/out_w 0 when they vary per record */
};

struct ferry_pipeline_ctx_s {
  const ferry_pipeline_t *p;
  ferry_example_t ex;
  ferry_jpeg_t *jpeg;
  ferry_blur_t *blur[FERRY_SPEC_MAX_OPS]; /* indexed like p->ops */
  ferry_resampler_t *rs; /* the crop and resize(S) ops not fused */
  uint64_t seed, epoch, record; /* the random ops' key (set_key) */
  ferry_decode_path_t last;     /* the last record's decode */
  uint8_t *buf[2];
  size_t cap[2];
  int timing;
  int borrow; /* ferry__pipeline_ctx_set_borrow */
  double t[FERRY_STAGE_COUNT];
};

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int ferry__pipeline_new(const ferry_spec_t *spec, ferry_pipeline_t **out,
                        ferry_error_t *err) {
  ferry_pipeline_t *p;
  const char *image_key;
  int h, w, c;

  *out = NULL;
  if (spec == NULL)
    return ferry__seterr(err, FERRY_EINVAL, "pipeline: no spec");
  if (spec->format != FERRY_IMAGE_RAW && spec->format != FERRY_IMAGE_JPEG)
    return ferry__seterr(err, FERRY_ESPEC, "decode: unknown format %d",
                         (int)spec->format);
  if (spec->format == FERRY_IMAGE_RAW) {
    if (spec->height <= 0 || spec->width <= 0 || spec->channels <= 0 ||
        spec->height > MAX_SIDE || spec->width > MAX_SIDE ||
        spec->channels > 4)
      return ferry__seterr(err, FERRY_ESPEC,
                           "decode(raw, %d, %d, %d): sizes out of range",
                           spec->height, spec->width, spec->channels);
  } else {
    if (spec->height < 0 || spec->width < 0 || spec->height > MAX_SIDE ||
        spec->width > MAX_SIDE || (spec->height == 0) != (spec->width == 0))
      return ferry__seterr(err, FERRY_ESPEC,
                           "decode(jpeg, %d, %d): sizes out of range",
                           spec->height, spec->width);
    if (spec->channels != 0 && spec->channels != 3)
      return ferry__seterr(err, FERRY_ESPEC,
                           "decode(jpeg): %d channels (only 3, RGB)",
                           spec->channels);
  }
  if (spec->n_ops > FERRY_SPEC_MAX_OPS)
    return ferry__seterr(err, FERRY_ESPEC, "pipeline: %zu ops (max %d)",
                         spec->n_ops, FERRY_SPEC_MAX_OPS);

  h = spec->height;
  w = spec->width;
  c = spec->format == FERRY_IMAGE_JPEG ? 3 : spec->channels;
  for (size_t i = 0; i < spec->n_ops; i++) {
    const ferry_image_op_t *op = &spec->ops[i];
    switch (op->kind) {
    case FERRY_OP_RESIZE:
      if (op->a <= 0 || op->b <= 0 || op->a > MAX_SIDE || op->b > MAX_SIDE)
        return ferry__seterr(err, FERRY_ESPEC,
                             "resize(%d, %d): sizes out of range", op->a,
                             op->b);
      h = op->a;
      w = op->b;
      break;
    case FERRY_OP_DILATE:
      if (op->a != 3)
        return ferry__seterr(err, FERRY_ENOTSUP,
                             "dilate(%d): only dilate(3) is supported",
                             op->a);
      break;
    case FERRY_OP_BLUR:
      if (op->a < 1 || op->a > 31 || op->a % 2 == 0 || !(op->sigma > 0.0f))
        return ferry__seterr(err, FERRY_ESPEC,
                             "blur(%d, %g): size must be odd in 1..31 and "
                             "sigma positive",
                             op->a, (double)op->sigma);
      break;
    case FERRY_OP_RANDOM_RESIZED_CROP:
    case FERRY_OP_CENTER_CROP:
    case FERRY_OP_RESIZE_SHORTER: {
      const char *name = op->kind == FERRY_OP_CENTER_CROP ? "center_crop"
                         : op->kind == FERRY_OP_RESIZE_SHORTER
                             ? "resize"
                             : "random_resized_crop";
      if (op->a < 1 || op->a > MAX_SIDE ||
          (op->kind != FERRY_OP_RESIZE_SHORTER &&
           (op->b < 1 || op->b > MAX_SIDE)))
        return ferry__seterr(err, FERRY_ESPEC, "%s (op %zu): sizes out of "
                             "range", name, i + 1);
      if (op->kind == FERRY_OP_RANDOM_RESIZED_CROP &&
          !(op->scale[0] > 0.0f && op->scale[0] <= op->scale[1] &&
            op->scale[1] <= 1.0f && op->ratio[0] >= 0.01f &&
            op->ratio[0] <= op->ratio[1] && op->ratio[1] <= 100.0f))
        return ferry__seterr(err, FERRY_ESPEC,
                             "random_resized_crop (op %zu): scale or ratio "
                             "out of range",
                             i + 1);
      if (c > 4)
        return ferry__seterr(err, FERRY_ENOTSUP,
                             "%s (op %zu): images of 1 to 4 channels, this "
                             "one has %d",
                             name, i + 1, c);
      if (op->kind == FERRY_OP_RESIZE_SHORTER) {
        if (h > 0)
          ferry__resize_shorter_size(h, w, op->a, &h, &w);
      } else {
        h = op->a;
        w = op->b;
      }
      break;
    }
    default:
      return ferry__seterr(err, FERRY_ESPEC, "op %zu: unknown kind %d", i,
                           (int)op->kind);
    }
  }

  p = ferry__calloc(1, sizeof(*p));
  if (p == NULL)
    return ferry__seterr(err, FERRY_ENOMEM, "pipeline: out of memory");
  image_key = spec->image_key != NULL ? spec->image_key : "image";
  p->image_key = ferry__strdup(image_key);
  if (spec->label_key != NULL)
    p->label_key = ferry__strdup(spec->label_key);
  if (p->image_key == NULL ||
      (spec->label_key != NULL && p->label_key == NULL)) {
    ferry__pipeline_free(p);
    return ferry__seterr(err, FERRY_ENOMEM, "pipeline: out of memory");
  }
  p->format = spec->format;
  p->height = spec->height;
  p->width = spec->width;
  p->channels = c;
  memcpy(p->ops, spec->ops, spec->n_ops * sizeof(spec->ops[0]));
  p->n_ops = spec->n_ops;
  for (size_t i = 0; i < p->n_ops; i++)
    if (p->ops[i].kind != FERRY_OP_DILATE && p->ops[i].kind != FERRY_OP_BLUR)
      p->has_resize = true;
  /* Fusion: a JPEG whose first op crops or resizes the torchvision way,
   * unless that op asks for the exact path. */
  if (p->format == FERRY_IMAGE_JPEG && p->n_ops > 0) {
    const ferry_image_op_t *o0 = &p->ops[0];
    ferry_crop_op_t *f = &p->fop;
    if (o0->kind == FERRY_OP_RANDOM_RESIZED_CROP && !o0->exact) {
      f->kind = FERRY_CROP_RANDOM_RESIZED;
      f->out_h = o0->a;
      f->out_w = o0->b;
      f->rrc.scale_min = o0->scale[0];
      f->rrc.scale_max = o0->scale[1];
      f->rrc.ratio_min = o0->ratio[0];
      f->rrc.ratio_max = o0->ratio[1];
      p->fused = 1;
    } else if (o0->kind == FERRY_OP_RESIZE_SHORTER && !o0->exact) {
      f->kind = FERRY_CROP_RESIZE_CENTER;
      f->shorter = o0->a;
      p->fused = 1;
      if (p->n_ops > 1 && p->ops[1].kind == FERRY_OP_CENTER_CROP) {
        f->out_h = p->ops[1].a;
        f->out_w = p->ops[1].b;
        p->fused = 2;
      }
    } else if (o0->kind == FERRY_OP_CENTER_CROP) {
      /* Scale 8/8 and an integer box: the same pixels as the full
       * decode's crop, without decoding the rest. */
      f->kind = FERRY_CROP_CENTER;
      f->out_h = o0->a;
      f->out_w = o0->b;
      p->fused = 1;
    }
  }
  p->out_h = h;
  p->out_w = w;
  p->out_c = c;
  *out = p;
  return 0;
}

void ferry__pipeline_free(ferry_pipeline_t *p) {
  if (p == NULL)
    return;
  ferry__free(p->image_key);
  ferry__free(p->label_key);
  ferry__free(p);
}

int ferry__pipeline_shape(const ferry_pipeline_t *p, int *h, int *w, int *c) {
  if (p->out_h == 0 || p->out_w == 0)
    return FERRY_ESHAPE;
  *h = p->out_h;
  *w = p->out_w;
  *c = p->out_c;
  return 0;
}

/* Makes ctx->buf[i] hold at least `need` bytes. The old content is not
 * kept: callers grow a buffer before writing into it. */
static int grow(ferry_pipeline_ctx_t *ctx, int i, size_t need,
                ferry_error_t *err) {
  size_t cap;
  uint8_t *b;

  if (need <= ctx->cap[i])
    return 0;
  cap = ctx->cap[i] + ctx->cap[i] / 2;
  if (cap < need)
    cap = need;
  if (cap < BUF_MIN)
    cap = BUF_MIN;
  b = ferry__aligned_alloc(BUF_ALIGN, cap + BUF_SLACK);
  if (b == NULL)
    return ferry__seterr(err, FERRY_ENOMEM,
                         "pipeline: out of memory for a %zu-byte image", cap);
  ferry__aligned_free(ctx->buf[i]);
  ctx->buf[i] = b;
  ctx->cap[i] = cap;
  return 0;
}

int ferry__pipeline_ctx_new(const ferry_pipeline_t *p,
                            ferry_pipeline_ctx_t **out, ferry_error_t *err) {
  ferry_pipeline_ctx_t *ctx;
  int rc;

  *out = NULL;
  ctx = ferry__calloc(1, sizeof(*ctx));
  if (ctx == NULL)
    return ferry__seterr(err, FERRY_ENOMEM, "pipeline: out of memory");
  ctx->p = p;
  ferry__example_init(&ctx->ex);
  if (p->format == FERRY_IMAGE_JPEG) {
    rc = ferry__jpeg_new(&ctx->jpeg, err);
    if (rc < 0)
      goto fail;
  }
  for (size_t i = 0; i < p->n_ops; i++) {
    if (p->ops[i].kind != FERRY_OP_BLUR)
      continue;
    rc = ferry__blur_new(p->ops[i].a, p->ops[i].sigma, &ctx->blur[i], err);
    if (rc < 0)
      goto fail;
  }
  for (size_t i = p->fused; i < p->n_ops; i++) {
    ferry_op_kind_t k = p->ops[i].kind;
    if (k != FERRY_OP_RANDOM_RESIZED_CROP && k != FERRY_OP_RESIZE_SHORTER &&
        k != FERRY_OP_CENTER_CROP)
      continue;
    if ((rc = ferry__resampler_new(&ctx->rs, err)) < 0)
      goto fail;
    break;
  }
  /* With known sizes the buffers get their final size now, so even the
   * first record allocates nothing. */
  if (p->height > 0 && p->width > 0) {
    size_t in = (size_t)p->height * (size_t)p->width * (size_t)p->channels;
    size_t most = in;
    for (size_t i = 0; i < p->n_ops; i++)
      if (p->ops[i].kind == FERRY_OP_RESIZE ||
          p->ops[i].kind == FERRY_OP_RANDOM_RESIZED_CROP ||
          p->ops[i].kind == FERRY_OP_CENTER_CROP) {
        size_t s = (size_t)p->ops[i].a * (size_t)p->ops[i].b *
                   (size_t)p->channels;
        if (s > most)
          most = s;
      }
    if ((rc = grow(ctx, 0, most, err)) < 0 ||
        (rc = grow(ctx, 1, most, err)) < 0)
      goto fail;
  }
  *out = ctx;
  return 0;

fail:
  ferry__pipeline_ctx_free(ctx);
  return rc;
}

void ferry__pipeline_ctx_free(ferry_pipeline_ctx_t *ctx) {
  if (ctx == NULL)
    return;
  ferry__example_close(&ctx->ex);
  ferry__jpeg_free(ctx->jpeg);
  for (size_t i = 0; i < FERRY_SPEC_MAX_OPS; i++)
    ferry__blur_free(ctx->blur[i]);
  ferry__resampler_free(ctx->rs);
  ferry__aligned_free(ctx->buf[0]);
  ferry__aligned_free(ctx->buf[1]);
  ferry__free(ctx);
}

void ferry__pipeline_ctx_set_key(ferry_pipeline_ctx_t *ctx, uint64_t seed,
                                 uint64_t epoch, uint64_t record) {
  ctx->seed = seed;
  ctx->epoch = epoch;
  ctx->record = record;
}

void ferry__pipeline_ctx_set_jpeg_limits(ferry_pipeline_ctx_t *ctx,
                                         const ferry_jpeg_limits_t *l) {
  if (ctx->jpeg != NULL)
    ferry__jpeg_set_limits(ctx->jpeg, l);
}

void ferry__pipeline_ctx_trim(ferry_pipeline_ctx_t *ctx, size_t keep) {
  for (int i = 0; i < 2; i++)
    if (ctx->cap[i] > keep) {
      ferry__aligned_free(ctx->buf[i]);
      ctx->buf[i] = NULL;
      ctx->cap[i] = 0;
    }
  if (ctx->jpeg != NULL)
    ferry__jpeg_trim(ctx->jpeg, keep);
}

const char *ferry__pipeline_ctx_window_why(const ferry_pipeline_ctx_t *ctx) {
  return ctx->jpeg != NULL ? ferry__jpeg_window_why(ctx->jpeg) : "";
}

void ferry__pipeline_ctx_jpeg_stats(const ferry_pipeline_ctx_t *ctx,
                                    ferry_jpeg_crop_stats_t *out) {
  if (ctx->jpeg != NULL)
    ferry__jpeg_crop_stats(ctx->jpeg, out);
  else
    memset(out, 0, sizeof(*out));
}

ferry_decode_path_t
ferry__pipeline_ctx_last_decode(const ferry_pipeline_ctx_t *ctx) {
  return ctx->last;
}

/* The key of op i's draws for the current record: ops differ by index so
 * two random ops of one spec do not draw alike. */
static uint64_t op_key(const ferry_pipeline_ctx_t *ctx, size_t i) {
  return ferry__crop_key(ctx->seed, ctx->epoch, ctx->record) ^
         ((uint64_t)i * 0x9E3779B97F4A7C15ull);
}

void ferry__pipeline_ctx_set_borrow(ferry_pipeline_ctx_t *ctx, int on) {
  ctx->borrow = on;
}

void ferry__pipeline_ctx_set_timing(ferry_pipeline_ctx_t *ctx, int on) {
  ctx->timing = on != 0;
}

void ferry__pipeline_ctx_times(const ferry_pipeline_ctx_t *ctx,
                               double seconds[FERRY_STAGE_COUNT]) {
  memcpy(seconds, ctx->t, sizeof(ctx->t));
}

/* FERRY_ENOFEATURE for `key`. The record's own keys are bytes of the file
 * and errors travel to remote callers, so the message gives
 * their count and the tool that lists them, not the keys. */
static int missing_feature(const ferry_example_t *ex, const char *key,
                           ferry_error_t *err) {
  if (ex->n == 0)
    return ferry__seterr(err, FERRY_ENOFEATURE,
                         "missing feature '%s' (the record has no features)",
                         key);
  return ferry__seterr(err, FERRY_ENOFEATURE,
                       "missing feature '%s' (the record has %zu other "
                       "features: `ferryctl records inspect` lists them)",
                       key, ex->n);
}

/* Decodes the JPEG at src into ctx->buf[0], growing it to the image's
 * size when needed. */
static int decode_jpeg(ferry_pipeline_ctx_t *ctx, const uint8_t *src,
                       size_t len, int *h, int *w, ferry_error_t *err) {
  int rc;

  /* Try the buffer we have: most datasets have one size, so the header is
   * read once, by the decoder, and the retry below is rare. */
  if (ctx->cap[0] > 0) {
    rc = ferry__jpeg_decode(ctx->jpeg, src, len, ctx->buf[0], ctx->cap[0], h, w,
                            err);
    if (rc != FERRY_ERANGE)
      return rc;
  }
  rc = ferry__jpeg_header(ctx->jpeg, src, len, h, w, err);
  if (rc < 0)
    return rc;
  if (*h <= 0 || *w <= 0 || *h > MAX_SIDE || *w > MAX_SIDE)
    return ferry__seterr(err, FERRY_EJPEG, "JPEG of %dx%d pixels", *w, *h);
  rc = grow(ctx, 0, (size_t)*h * (size_t)*w * 3, err);
  if (rc < 0)
    return rc;
  return ferry__jpeg_decode(ctx->jpeg, src, len, ctx->buf[0], ctx->cap[0], h, w,
                            err);
}

/* The decode fused with the first p->fused ops, into ctx->buf[0]. */
static int decode_jpeg_fused(ferry_pipeline_ctx_t *ctx, const uint8_t *src,
                             size_t len, int *h, int *w, ferry_error_t *err) {
  const ferry_pipeline_t *p = ctx->p;
  ferry_crop_op_t op = p->fop;
  ferry_window_t win;
  ferry_jpeg_crop_info_t info;
  int rc, sh, sw;

  op.key = op_key(ctx, 0);
  if (ctx->cap[0] > 0) {
    rc = ferry__jpeg_decode_crop(ctx->jpeg, src, len, &op, ctx->buf[0],
                                 ctx->cap[0], h, w, &info, err);
    if (rc != FERRY_ERANGE)
      goto done;
  }
  /* The output's size: from the header and the plan. */
  if ((rc = ferry__jpeg_header(ctx->jpeg, src, len, &sh, &sw, err)) < 0)
    return rc;
  if ((rc = ferry__crop_plan(&op, sh, sw, &win, h, w, err)) < 0)
    return rc;
  if (*h > MAX_SIDE || *w > MAX_SIDE)
    return ferry__seterr(err, FERRY_ETOOSMALL,
                         "resize(%d) of a %dx%d JPEG gives %dx%d, over %d",
                         op.shorter, sw, sh, *w, *h, MAX_SIDE);
  if ((rc = grow(ctx, 0, (size_t)*h * (size_t)*w * 3, err)) < 0)
    return rc;
  rc = ferry__jpeg_decode_crop(ctx->jpeg, src, len, &op, ctx->buf[0],
                               ctx->cap[0], h, w, &info, err);
done:
  if (rc == 0)
    ctx->last = info.window            ? FERRY_DECODE_WINDOW
                : info.window_fallback ? FERRY_DECODE_WINDOW_FALLBACK
                : info.progressive     ? FERRY_DECODE_PROGRESSIVE
                : info.scale < 8 || info.decoded.height < info.src_h ||
                        info.decoded.width < info.src_w
                    ? FERRY_DECODE_FUSED
                    : FERRY_DECODE_FULL;
  return rc;
}

/* The crop and resize(S) ops outside a fusion: plan on the current
 * image, resample into buffer dst_i. */
static int crop_op(ferry_pipeline_ctx_t *ctx, size_t i, const uint8_t *cur,
                   int *ih, int *iw, int ic, int dst_i, ferry_error_t *err) {
  const ferry_image_op_t *op = &ctx->p->ops[i];
  ferry_crop_op_t co = {0};
  ferry_window_t win;
  int oh, ow, rc;
  switch (op->kind) {
  case FERRY_OP_RANDOM_RESIZED_CROP:
    co.kind = FERRY_CROP_RANDOM_RESIZED;
    co.out_h = op->a;
    co.out_w = op->b;
    co.rrc.scale_min = op->scale[0];
    co.rrc.scale_max = op->scale[1];
    co.rrc.ratio_min = op->ratio[0];
    co.rrc.ratio_max = op->ratio[1];
    co.key = op_key(ctx, i);
    break;
  case FERRY_OP_RESIZE_SHORTER:
    co.kind = FERRY_CROP_RESIZE_CENTER;
    co.shorter = op->a;
    break;
  default:
    co.kind = FERRY_CROP_CENTER;
    co.out_h = op->a;
    co.out_w = op->b;
    break;
  }
  if ((rc = ferry__crop_plan(&co, *ih, *iw, &win, &oh, &ow, err)) < 0)
    return rc;
  if (oh > MAX_SIDE || ow > MAX_SIDE)
    return ferry__seterr(err, FERRY_ETOOSMALL,
                         "resize(%d) of a %dx%d image gives %dx%d, over %d",
                         op->a, *iw, *ih, ow, oh, MAX_SIDE);
  if ((rc = grow(ctx, dst_i, (size_t)oh * (size_t)ow * (size_t)ic, err)) < 0)
    return rc;
  rc = ferry__resample(ctx->rs, cur, *ih, *iw, (size_t)*iw * (size_t)ic, ic,
                       &win, ctx->buf[dst_i], oh, ow, err);
  if (rc < 0)
    return rc;
  *ih = oh;
  *iw = ow;
  return 0;
}

/* Runs ops [from, n_ops) on *curp (ih x iw x ic), leaving the result's
 * place in *curp; `which` is the buffer *curp is in (1 for memory outside
 * the ctx, so the first op writes buffer 0). */
static int run_ops(ferry_pipeline_ctx_t *ctx, size_t from,
                   const uint8_t **curp, int which, int *ihp, int *iwp,
                   int ic, ferry_error_t *err) {
  const ferry_pipeline_t *p = ctx->p;
  const uint8_t *cur = *curp;
  int ih = *ihp, iw = *iwp, rc;
  double t2;
  /* Each op reads `cur` and writes the other buffer; `which` is the
   * buffer `cur` is in (1 for the raw record itself, so the first op
   * writes buffer 0). */
  for (size_t i = from; i < p->n_ops; i++) {
    const ferry_image_op_t *op = &p->ops[i];
    int dst_i = which == 0 ? 1 : 0;
    size_t in_bytes = (size_t)ih * (size_t)iw * (size_t)ic;
    uint8_t *dst;

    if (op->kind == FERRY_OP_RANDOM_RESIZED_CROP ||
        op->kind == FERRY_OP_RESIZE_SHORTER ||
        op->kind == FERRY_OP_CENTER_CROP) {
      if ((rc = crop_op(ctx, i, cur, &ih, &iw, ic, dst_i, err)) < 0) {
        ferry__prefixerr(err, "%s (op %zu)",
                         op->kind == FERRY_OP_CENTER_CROP ? "center_crop"
                         : op->kind == FERRY_OP_RESIZE_SHORTER
                             ? "resize"
                             : "random_resized_crop",
                         i + 1);
        return rc;
      }
      dst = ctx->buf[dst_i];
    } else if (op->kind == FERRY_OP_RESIZE) {
      size_t out_bytes = (size_t)op->a * (size_t)op->b * (size_t)ic;
      if (op->a == ih && op->b == iw)
        continue; /* Half-pixel bilinear at scale 1 is the identity. */
      if ((rc = grow(ctx, dst_i, out_bytes, err)) < 0)
        return rc;
      dst = ctx->buf[dst_i];
      ferry__resize_bilinear(cur, ih, iw, ic, dst, op->a, op->b);
      ih = op->a;
      iw = op->b;
    } else {
      if ((rc = grow(ctx, dst_i, in_bytes, err)) < 0)
        return rc;
      dst = ctx->buf[dst_i];
      t2 = ctx->timing ? now() : 0;
      if (op->kind == FERRY_OP_DILATE) {
        ferry__dilate3x3(cur, dst, ih, iw, ic);
        if (ctx->timing)
          ctx->t[FERRY_STAGE_DILATE] += now() - t2;
      } else {
        rc = ferry__blur_apply(ctx->blur[i], cur, dst, ih, iw, ic, err);
        if (rc < 0) {
          ferry__prefixerr(err, "blur(%d, %g) on a %dx%d image", op->a,
                           (double)op->sigma, ih, iw);
          return rc;
        }
        if (ctx->timing)
          ctx->t[FERRY_STAGE_BLUR] += now() - t2;
      }
    }
    cur = dst;
    which = dst_i;
  }
  *curp = cur;
  *ihp = ih;
  *iwp = iw;
  return 0;
}

int ferry__pipeline_process(ferry_pipeline_ctx_t *ctx, const uint8_t *record,
                            size_t len, const uint8_t **pixels, int *h, int *w,
                            int *c, int64_t *label, ferry_error_t *err) {
  const ferry_pipeline_t *p = ctx->p;
  const ferry_feature_t *img, *lab;
  const uint8_t *data, *cur;
  size_t data_len, n;
  int64_t lv = 0;
  int ih, iw, ic, rc, which;
  double t0 = 0, t1;

  if (ctx->timing)
    t0 = now();
  ctx->last = FERRY_DECODE_NONE;

  rc = ferry__example_parse(&ctx->ex, record, len, err);
  if (rc < 0)
    return rc;
  img = ferry__example_find(&ctx->ex, p->image_key);
  if (img == NULL)
    return missing_feature(&ctx->ex, p->image_key, err);
  if (img->kind != FERRY_FEATURE_BYTES)
    return ferry__seterr(err, FERRY_EFEATTYPE,
                         "feature '%s' is a %s list, expected bytes",
                         p->image_key, ferry__feature_kind_name(img->kind));
  if (img->count == 0 || ferry__feature_bytes(img, 0, &data, &data_len) < 0)
    return ferry__seterr(err, FERRY_ENOFEATURE,
                         "feature '%s' has no value", p->image_key);
  if (p->label_key != NULL) {
    lab = ferry__example_find(&ctx->ex, p->label_key);
    if (lab == NULL)
      return missing_feature(&ctx->ex, p->label_key, err);
    if (lab->kind != FERRY_FEATURE_INT64)
      return ferry__seterr(err, FERRY_EFEATTYPE,
                           "feature '%s' is a %s list, expected int64",
                           p->label_key, ferry__feature_kind_name(lab->kind));
    if (ferry__feature_int64s(lab, &lv, 1, &n) < 0 || n == 0)
      return ferry__seterr(err, FERRY_ENOFEATURE,
                           "feature '%s' has no value", p->label_key);
  }

  if (ctx->timing) {
    t1 = now();
    ctx->t[FERRY_STAGE_PARSE] += t1 - t0;
    t0 = t1;
  }

  ic = p->channels;
  if (p->format == FERRY_IMAGE_RAW) {
    size_t want;

    ih = p->height;
    iw = p->width;
    want = (size_t)ih * (size_t)iw * (size_t)ic;
    if (p->n_ops > 0 || ctx->borrow) {
      /* The first op reads the pixels where they lie in the record (or,
       * borrowing, the caller does): the size check is all decode_raw
       * has to do. */
      if (data_len != want)
        return ferry__seterr(err, FERRY_EIMGSIZE,
                             "feature '%s': decode(raw, %d, %d, %d) expects "
                             "%zu bytes, found %zu",
                             p->image_key, ih, iw, ic, want, data_len);
      cur = data;
      which = 1;
    } else {
      /* Grown at ctx_new, but ferry__pipeline_ctx_trim may have freed it. */
      if ((rc = grow(ctx, 0, want, err)) < 0)
        return rc;
      rc = ferry__decode_raw(data, data_len, ih, iw, ic, ctx->buf[0], err);
      if (rc < 0) {
        ferry__prefixerr(err, "feature '%s'", p->image_key);
        return rc;
      }
      cur = ctx->buf[0];
      which = 0;
    }
  } else {
    if (p->fused > 0) {
      rc = decode_jpeg_fused(ctx, data, data_len, &ih, &iw, err);
    } else {
      rc = decode_jpeg(ctx, data, data_len, &ih, &iw, err);
      if (rc == 0)
        ctx->last = FERRY_DECODE_FULL;
    }
    if (rc < 0) {
      ferry__prefixerr(err, "feature '%s': decode(jpeg)", p->image_key);
      return rc;
    }
    if (p->height > 0 && !p->has_resize &&
        (ih != p->height || iw != p->width))
      return ferry__seterr(err, FERRY_ESHAPE,
                           "feature '%s': JPEG is %dx%d (HxW), the spec "
                           "wants %dx%d and has no resize",
                           p->image_key, ih, iw, p->height, p->width);
    cur = ctx->buf[0];
    which = 0;
  }

  if (ctx->timing) {
    t1 = now();
    ctx->t[FERRY_STAGE_DECODE] += t1 - t0;
    t0 = t1;
  }

  rc = run_ops(ctx, p->format == FERRY_IMAGE_JPEG ? p->fused : 0, &cur,
               which, &ih, &iw, ic, err);
  if (rc < 0)
    return rc;

  /* Only identity resizes ran on a raw record: the output is the
   * record's own bytes, handed out as they are when the caller allows it
   * (ferry__pipeline_ctx_set_borrow), else copied into the ctx. */
  if (cur == data && !ctx->borrow) {
    if ((rc = grow(ctx, 0, (size_t)ih * (size_t)iw * (size_t)ic, err)) < 0)
      return rc;
    memcpy(ctx->buf[0], data, (size_t)ih * (size_t)iw * (size_t)ic);
    cur = ctx->buf[0];
  }

  if (ctx->timing)
    ctx->t[FERRY_STAGE_OPS] += now() - t0;

  *pixels = cur;
  *h = ih;
  *w = iw;
  *c = ic;
  *label = lv;
  return 0;
}

int ferry__pipeline_process_from(ferry_pipeline_ctx_t *ctx, size_t from,
                                 const uint8_t *in, int h, int w, int c,
                                 const uint8_t **pixels, int *oh, int *ow,
                                 ferry_error_t *err) {
  const ferry_pipeline_t *p = ctx->p;
  const uint8_t *cur = in;
  double t0 = ctx->timing ? now() : 0;
  if (from > p->n_ops || c != p->channels || h <= 0 || w <= 0)
    return ferry__seterr(err, FERRY_EINVAL,
                         "pipeline: ops from %zu of %zu on a %dx%dx%d image",
                         from, p->n_ops, h, w, c);
  /* The fused ops run inside the decode only: a later start is outside
   * the fusion by construction (ferry__spec_det_prefix). */
  if (p->format == FERRY_IMAGE_JPEG && from < p->fused && from > 0)
    return ferry__seterr(err, FERRY_EINVAL,
                         "pipeline: ops from %zu split a fused decode", from);
  int rc = run_ops(ctx, from, &cur, 1, &h, &w, c, err);
  if (rc < 0)
    return rc;
  if (ctx->timing)
    ctx->t[FERRY_STAGE_OPS] += now() - t0;
  *pixels = cur;
  *oh = h;
  *ow = w;
  return 0;
}
