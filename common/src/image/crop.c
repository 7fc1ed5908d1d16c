/* torchvision's crop geometry and antialiased resampling on uint8 HWC
 * images (crop.h; semantics in docs/TORCHVISION_OPS.md).
 *
 * The resampler follows PIL's ImagingResample and ATen's
 * _upsample_bilinear2d_aa (torchvision's antialias=True): per axis, the
 * output pixel i of a window [x, x + w) of n pixels is centred at
 * c = (x - clip0) + (i + 0.5) * s with s = w / n, relative to the clip;
 * the filter is the triangle max(0, 1 - |t|) stretched by max(s, 1); the
 * taps are the clip's pixels j in [max(int(c - support + 0.5), 0),
 * min(int(c + support + 0.5), clip size)) with weights
 * filter((j - c + 0.5) / max(s, 1)) normalised to sum 1. Both passes run
 * in float, the vertical one first (it reads whole contiguous rows, which
 * the compiler vectorises), and the result is rounded once.
 */
#include "crop.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "alloc.h"
#include "imgops_internal.h"

#define RESAMPLE_ROWS ferry__resample_rows_scalar
#include "resample_rows.h"

/* ---------------------------------------------------------------------
 * The generator: splitmix64 over a key hashed from (seed, epoch, record).
 */
#define GOLDEN 0x9E3779B97F4A7C15ull

static uint64_t mix(uint64_t x) {
  x += GOLDEN;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t ferry__crop_key(uint64_t seed, uint64_t epoch, uint64_t record) {
  /* A constant of its own so the crop's draws are not the GPU
   * augmentation's (client/src/augment.h) for equal inputs. */
  uint64_t k = mix(seed ^ 0x63726F7052524321ull);
  k = mix(k ^ epoch);
  return mix(k ^ record);
}

static uint64_t draw(uint64_t key, uint32_t i) {
  return mix(key + (uint64_t)(i + 1) * GOLDEN);
}

/* Uniform in [lo, hi) from 53 bits. */
static double uniform(uint64_t r, double lo, double hi) {
  double u = (double)(r >> 11) * 0x1.0p-53;
  return lo + (hi - lo) * u;
}

/* Uniform integer in [0, n) (n >= 1), by multiply-high. */
static int randbelow(uint64_t r, int n) {
  return (int)(((unsigned __int128)r * (uint64_t)n) >> 64);
}

/* Python's round() on a double: half to even (rint in the default
 * rounding mode). Values here are far inside int's range. */
static int pyround(double v) { return (int)nearbyint(v); }

void ferry__rrc_sample(const ferry_rrc_t *p, int h, int w, uint64_t key,
                       ferry_box_t *out) {
  double area = (double)h * (double)w;
  double lr0 = log(p->ratio_min), lr1 = log(p->ratio_max);
  for (uint32_t t = 0; t < 10; t++) {
    double target = area * uniform(draw(key, 4 * t), p->scale_min,
                                   p->scale_max);
    double aspect = exp(uniform(draw(key, 4 * t + 1), lr0, lr1));
    int cw = pyround(sqrt(target * aspect));
    int ch = pyround(sqrt(target / aspect));
    if (cw > 0 && cw <= w && ch > 0 && ch <= h) {
      out->top = randbelow(draw(key, 4 * t + 2), h - ch + 1);
      out->left = randbelow(draw(key, 4 * t + 3), w - cw + 1);
      out->height = ch;
      out->width = cw;
      return;
    }
  }
  /* The centre crop, clamped to the ratio range. */
  double in_ratio = (double)w / (double)h;
  int cw, ch;
  if (in_ratio < p->ratio_min) {
    cw = w;
    ch = pyround((double)cw / p->ratio_min);
  } else if (in_ratio > p->ratio_max) {
    ch = h;
    cw = pyround((double)ch * p->ratio_max);
  } else {
    cw = w;
    ch = h;
  }
  /* Rounding can reach 0 on extreme shapes (torchvision would then fail
   * later); keep one pixel. It never exceeds the image: w / ratio_min <
   * h here, and likewise for the width. */
  if (ch < 1)
    ch = 1;
  if (cw < 1)
    cw = 1;
  out->top = (h - ch) / 2;
  out->left = (w - cw) / 2;
  out->height = ch;
  out->width = cw;
}

void ferry__resize_shorter_size(int h, int w, int shorter, int *oh, int *ow) {
  int s = w <= h ? w : h, l = w <= h ? h : w;
  /* Python: int(requested_new_short * long / short), a true division in
   * double, then truncation. */
  int nl = (int)((double)((int64_t)shorter * l) / (double)s);
  if (nl < 1)
    nl = 1;
  if (w <= h) {
    *ow = shorter;
    *oh = nl;
  } else {
    *oh = shorter;
    *ow = nl;
  }
}

/* One axis of CenterCrop: the offset of a crop of c in an image of n. */
static int center_off(int n, int c) {
  if (c > n)
    return -((c - n) / 2); /* padded: left pad (c - n) // 2 */
  return pyround((double)(n - c) / 2.0);
}

void ferry__center_crop_box(int h, int w, int ch, int cw, ferry_box_t *out) {
  out->top = center_off(h, ch);
  out->left = center_off(w, cw);
  out->height = ch;
  out->width = cw;
}

void ferry__window_of_box(const ferry_box_t *b, ferry_window_t *win) {
  win->x = b->left;
  win->y = b->top;
  win->w = b->width;
  win->h = b->height;
  win->clip = *b;
}

void ferry__window_resize_center(int h, int w, int shorter, int ch, int cw,
                                 ferry_window_t *win, int *oh, int *ow) {
  int nh, nw;
  ferry_box_t b;
  ferry__resize_shorter_size(h, w, shorter, &nh, &nw);
  if (ch <= 0 || cw <= 0) {
    ch = nh;
    cw = nw;
  }
  ferry__center_crop_box(nh, nw, ch, cw, &b);
  double sy = (double)h / (double)nh, sx = (double)w / (double)nw;
  win->x = (double)b.left * sx;
  win->y = (double)b.top * sy;
  win->w = (double)cw * sx;
  win->h = (double)ch * sy;
  /* torchvision resizes the whole image, so its filter may read outside
   * the crop: the clip is the window grown by the filter's support (and a
   * pixel for rounding), inside the image. The taps then are those of the
   * whole image's resize, and the decoder need not decode the rest. */
  {
    double spy = sy > 1.0 ? sy : 1.0, spx = sx > 1.0 ? sx : 1.0;
    int y0 = (int)floor(win->y - spy - 1.0), x0 = (int)floor(win->x - spx - 1.0);
    int y1 = (int)ceil(win->y + win->h + spy + 1.0);
    int x1 = (int)ceil(win->x + win->w + spx + 1.0);
    y0 = y0 > 0 ? y0 : 0;
    x0 = x0 > 0 ? x0 : 0;
    y1 = y1 < h ? y1 : h;
    x1 = x1 < w ? x1 : w;
    win->clip.top = y0;
    win->clip.left = x0;
    win->clip.height = y1 - y0;
    win->clip.width = x1 - x0;
  }
  *oh = ch;
  *ow = cw;
}

int ferry__crop_plan(const ferry_crop_op_t *op, int h, int w,
                     ferry_window_t *win, int *oh, int *ow,
                     ferry_error_t *err) {
  ferry_box_t b;
  if (h <= 0 || w <= 0)
    return ferry__seterr(err, FERRY_ETOOSMALL, "crop: empty %dx%d image",
                         w, h);
  switch (op->kind) {
  case FERRY_CROP_RANDOM_RESIZED:
    if (op->out_h <= 0 || op->out_w <= 0)
      return ferry__seterr(err, FERRY_EINVAL,
                           "random_resized_crop: size %dx%d", op->out_h,
                           op->out_w);
    ferry__rrc_sample(&op->rrc, h, w, op->key, &b);
    ferry__window_of_box(&b, win);
    *oh = op->out_h;
    *ow = op->out_w;
    return 0;
  case FERRY_CROP_RESIZE_CENTER:
    if (op->shorter <= 0 || op->out_h < 0 || op->out_w < 0 ||
        (op->out_h == 0) != (op->out_w == 0))
      return ferry__seterr(err, FERRY_EINVAL,
                           "resize(%d) | center_crop(%d, %d): bad sizes",
                           op->shorter, op->out_h, op->out_w);
    ferry__window_resize_center(h, w, op->shorter, op->out_h, op->out_w, win,
                                oh, ow);
    return 0;
  case FERRY_CROP_CENTER:
    if (op->out_h <= 0 || op->out_w <= 0)
      return ferry__seterr(err, FERRY_EINVAL, "center_crop: size %dx%d",
                           op->out_h, op->out_w);
    ferry__center_crop_box(h, w, op->out_h, op->out_w, &b);
    ferry__window_of_box(&b, win);
    /* The clip is the box inside the image: the rest of a box larger
     * than the image is zero padding. */
    {
      int y0 = b.top > 0 ? b.top : 0, x0 = b.left > 0 ? b.left : 0;
      int y1 = b.top + b.height < h ? b.top + b.height : h;
      int x1 = b.left + b.width < w ? b.left + b.width : w;
      win->clip.top = y0;
      win->clip.left = x0;
      win->clip.height = y1 - y0; /* >= 1: a centred box meets the image */
      win->clip.width = x1 - x0;
    }
    *oh = op->out_h;
    *ow = op->out_w;
    return 0;
  }
  return ferry__seterr(err, FERRY_EINVAL, "crop: unknown kind %d",
                       (int)op->kind);
}

/* ---------------------------------------------------------------------
 * The resampler.
 */

/* One axis' taps: output i reads `count[i]` pixels from `start[i]`
 * (absolute source index) with weights w[i * stride ...]. */
typedef struct {
  int *start, *count;
  float *w;
  int stride;
  int ntaps; /* every output's count after padding (axis_pad) */
  size_t cap_s, cap_c, cap_w;
} axis_t;

struct ferry_resampler_s {
  axis_t ax[2]; /* 0: rows, 1: columns */
  float *row;   /* one vertical pass result */
  size_t row_cap;
  ferry__v4f *row4; /* the same, 4 lanes a pixel (16-byte aligned) */
  size_t row4_cap;
  float *wx8; /* ferry__rs_job_t's wx8 */
  size_t wx8_cap;
};

int ferry__resampler_new(ferry_resampler_t **out, ferry_error_t *err) {
  *out = ferry__calloc(1, sizeof(**out));
  if (*out == NULL)
    return ferry__seterr(err, FERRY_ENOMEM, "resample: out of memory");
  return 0;
}

static void axis_free(axis_t *a) {
  ferry__free(a->start);
  ferry__free(a->count);
  ferry__free(a->w);
}

void ferry__resampler_free(ferry_resampler_t *r) {
  if (r == NULL)
    return;
  axis_free(&r->ax[0]);
  axis_free(&r->ax[1]);
  ferry__aligned_free(r->row);
  ferry__aligned_free(r->row4);
  ferry__aligned_free(r->wx8);
  ferry__free(r);
}

/* Taps of one axis: window [x, x + len) over n outputs, clip [c0, c1). */
static int axis_plan(axis_t *a, double x, double len, int n, int c0,
                     int c1) {
  double scale = len / (double)n;
  double support = scale >= 1.0 ? scale : 1.0;
  double inv = scale >= 1.0 ? 1.0 / scale : 1.0;
  int size = c1 - c0;
  int stride = (int)ceil(support) * 2 + 1;
  if (!FERRY__GROW(a->start, a->cap_s, (size_t)n, 16) ||
      !FERRY__GROW(a->count, a->cap_c, (size_t)n, 16) ||
      !FERRY__GROW(a->w, a->cap_w, (size_t)n * (size_t)stride, 64))
    return FERRY_ENOMEM;
  a->stride = stride;
  for (int i = 0; i < n; i++) {
    double center = (x - c0) + ((double)i + 0.5) * scale;
    float *w = a->w + (size_t)i * (size_t)stride;
    double lo = center - support + 0.5, hi = center + support + 0.5;
    int xmin, xmax;
    double total = 0.0;
    if (!(center >= 0.0 && center < (double)size)) {
      a->start[i] = c0; /* outside the clip: a zero pixel */
      a->count[i] = 1;
      w[0] = 0.0f;
      continue;
    }
    xmin = lo > 0.0 ? (int)lo : 0;
    xmax = hi < (double)size ? (int)hi : size;
    if (xmax - xmin > stride)
      xmax = xmin + stride; /* rounding at the far edge */
    int cnt = xmax - xmin, k0 = 0;
    /* The taps' sum first (in double), then the normalised weights,
     * without the zero taps at both ends (the triangle's edges). */
    for (int k = 0; k < cnt; k++) {
      double v = 1.0 - fabs(((double)(k + xmin) - center + 0.5) * inv);
      total += v > 0.0 ? v : 0.0;
    }
    for (int k = 0; k < cnt; k++) {
      double v = 1.0 - fabs(((double)(k + xmin) - center + 0.5) * inv);
      if (v <= 0.0 && k == k0) {
        k0++;
        continue;
      }
      w[k - k0] = (float)(v > 0.0 && total != 0.0 ? v / total : 0.0);
    }
    while (cnt > k0 && w[cnt - 1 - k0] == 0.0f)
      cnt--;
    if (cnt == k0) { /* no weight at all (cannot happen inside the clip) */
      w[0] = 0.0f;
      cnt = k0 + 1;
    }
    a->start[i] = c0 + xmin + k0;
    a->count[i] = cnt - k0;
  }
  return 0;
}

/* Gives every output of the axis the same number of taps (the largest
 * count), padding with zero weights in front and moving the start left;
 * counts never exceed the clip's size, so starts stay inside it. The
 * row loops then run one fixed-length tap loop. */
static void axis_pad(axis_t *a, int n, int c0) {
  int m = 1;
  for (int i = 0; i < n; i++)
    if (a->count[i] > m)
      m = a->count[i];
  for (int i = 0; i < n; i++) {
    int cnt = a->count[i], pad = m - cnt, shift;
    float *w = a->w + (size_t)i * (size_t)a->stride;
    if (pad == 0)
      continue;
    /* Left as far as the clip allows, the rest of the padding after. */
    shift = a->start[i] - c0 < pad ? a->start[i] - c0 : pad;
    memmove(w + shift, w, (size_t)cnt * sizeof(float));
    for (int k = 0; k < shift; k++)
      w[k] = 0.0f;
    for (int k = shift + cnt; k < m; k++)
      w[k] = 0.0f;
    a->start[i] -= shift;
    a->count[i] = m;
  }
  a->ntaps = m;
}

int ferry__resample(ferry_resampler_t *r, const uint8_t *src, int sh, int sw,
                    size_t stride, int c, const ferry_window_t *win,
                    uint8_t *dst, int dh, int dw, ferry_error_t *err) {
  return ferry__resample_x(r, src, sh, sw, stride, c, c, win, dst, dh, dw,
                           err);
}

int ferry__resample_x(ferry_resampler_t *r, const uint8_t *src, int sh,
                      int sw, size_t stride, int c, int out_c,
                      const ferry_window_t *win, uint8_t *dst, int dh,
                      int dw, ferry_error_t *err) {
  const ferry_box_t *cl = &win->clip;
  int rc, xlo, xhi;
  size_t ncols;

  if (sh <= 0 || sw <= 0 || dh <= 0 || dw <= 0 || c < 1 || c > 4 ||
      out_c < 1 || out_c > c || stride < (size_t)sw * (size_t)c)
    return ferry__seterr(err, FERRY_EINVAL,
                         "resample: bad sizes (%dx%dx%d to %dx%d)", sh, sw,
                         c, dh, dw);
  if (cl->top < 0 || cl->left < 0 || cl->height <= 0 || cl->width <= 0 ||
      cl->top > sh - cl->height || cl->left > sw - cl->width)
    return ferry__seterr(err, FERRY_EINVAL,
                         "resample: clip %dx%d at (%d, %d) is not inside the "
                         "%dx%d image",
                         cl->height, cl->width, cl->top, cl->left, sh, sw);
  if (!(win->w > 0.0 && win->h > 0.0 && isfinite(win->w) &&
        isfinite(win->h) && isfinite(win->x) && isfinite(win->y)))
    return ferry__seterr(err, FERRY_EINVAL,
                         "resample: window %gx%g at (%g, %g) is empty or "
                         "not finite",
                         win->h, win->w, win->y, win->x);
  if ((rc = axis_plan(&r->ax[0], win->y, win->h, dh, cl->top,
                      cl->top + cl->height)) != 0 ||
      (rc = axis_plan(&r->ax[1], win->x, win->w, dw, cl->left,
                      cl->left + cl->width)) != 0)
    return ferry__seterr(err, rc, "resample: out of memory");
  axis_pad(&r->ax[1], dw, cl->left);

  /* The columns the horizontal taps read. */
  const axis_t *ay = &r->ax[0], *axx = &r->ax[1];
  xlo = axx->start[0];
  xhi = xlo + 1;
  for (int i = 0; i < dw; i++) {
    if (axx->start[i] < xlo)
      xlo = axx->start[i];
    if (axx->start[i] + axx->count[i] > xhi)
      xhi = axx->start[i] + axx->count[i];
  }
  ncols = (size_t)(xhi - xlo) * (size_t)c;
  if (ncols > r->row_cap) {
    float *q = ferry__aligned_alloc(64, ncols * 2 * sizeof(float));
    if (q == NULL)
      return ferry__seterr(err, FERRY_ENOMEM, "resample: out of memory");
    ferry__aligned_free(r->row);
    r->row = q;
    r->row_cap = ncols * 2;
  }
  if (c == 3 && (size_t)(xhi - xlo) > r->row4_cap) {
    size_t n = (size_t)(xhi - xlo) * 2;
    ferry__v4f *q = ferry__aligned_alloc(64, n * sizeof(ferry__v4f));
    if (q == NULL)
      return ferry__seterr(err, FERRY_ENOMEM, "resample: out of memory");
    ferry__aligned_free(r->row4);
    r->row4 = q;
    r->row4_cap = n;
  }

  /* The horizontal weights of pixel pairs (ferry__rs_job_t.wx8). */
  if (out_c == 3) {
    size_t n = (size_t)(dw / 2) * (size_t)axx->ntaps * 8;
    if (n > r->wx8_cap) {
      float *q = ferry__aligned_alloc(64, n * sizeof(float));
      if (q == NULL)
        return ferry__seterr(err, FERRY_ENOMEM, "resample: out of memory");
      ferry__aligned_free(r->wx8);
      r->wx8 = q;
      r->wx8_cap = n;
    }
    float *q = r->wx8;
    for (int p = 0; p < dw / 2; p++) {
      const float *wa = axx->w + (size_t)(2 * p) * (size_t)axx->stride;
      const float *wb = wa + axx->stride;
      for (int k = 0; k < axx->ntaps; k++, q += 8) {
        q[0] = q[1] = q[2] = q[3] = wa[k];
        q[4] = q[5] = q[6] = q[7] = wb[k];
      }
    }
  }

  {
    ferry__rs_job_t job = {
        .src = src + (size_t)xlo * (size_t)c, .stride = stride, .in_c = c,
        .out_c = out_c, .dst = dst, .dh = dh, .dw = dw, .row = r->row, .row4 = r->row4,
        .ncols = ncols,
        .xlo = xlo, .ystart = ay->start, .ycount = ay->count, .wy = ay->w,
        .ystride = ay->stride, .xstart = axx->start, .xcount = axx->count,
        .wx = axx->w, .xstride = axx->stride, .xtaps = axx->ntaps,
        .wx8 = r->wx8};
    if (ferry__imgops_level() >= FERRY__ISA_AVX2)
      ferry__resample_rows_avx2(&job);
    else
      ferry__resample_rows_scalar(&job);
  }
  return 0;
}
