/* Gaussian blur as tfa.image.gaussian_filter2d on uint8 images: float32
 * kernel, REFLECT padding without the edge (reflect-101), float32
 * accumulation, truncation back to uint8. All paths are separable and
 * pair the symmetric taps (k[j] * (a + b), r + 1 multiplies instead of
 * 2r + 1): a vertical pass over a ring of float copies of the source rows
 * (reflected row indices) into a padded float row, its reflected borders,
 * then a horizontal pass fused with the truncating pack to uint8 (see
 * imgops_internal.h). No full-image float buffer: the working set is a
 * few dozen float rows, mostly in the L1 cache. The SIMD paths make
 * several output rows per vertical loop (each ring row loaded once). */
#include "imgops.h"

#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "imgops_internal.h"

#define MAX_SIZE 31

struct ferry_blur_s {
  int size, r;
  float sigma;
  float k[MAX_SIZE / 2 + 1]; /* centre tap, then distance 1..r */
  float *ring, *hrow;
  size_t ring_cap, hrow_cap; /* in floats, slack excluded */
  /* The border plan cached for the last shape and vector width. */
  int plan_w, plan_c, plan_v, npads;
  ferry__blur_pad_t pads[FERRY__BLUR_MAX_PADS];
};

/* The decimal the user most likely wrote for `f`: the shortest one that
 * rounds back to f (0.8f gives 0.8, not 0.800000011920929). */
static double shortest_decimal(float f) {
  char buf[32];
  for (int prec = 1; prec <= 9; prec++) {
    snprintf(buf, sizeof(buf), "%.*g", prec, (double)f);
    if (strtof(buf, NULL) == f)
      return strtod(buf, NULL);
  }
  return (double)f;
}

void ferry__blur_kernel(int size, float sigma, float *out) {
  /* tfa: x = -size/2..size/2, k = softmax(-x^2 / (2 sigma^2)). TensorFlow
   * evaluates this in float32 with sigma rounded to float; Ferry computes
   * the exact kernel in double for the decimal sigma and rounds each tap
   * to float. The two differ by under 1e-6 relative (5e-9 absolute) per
   * tap, far below the +-1 uint8 tolerance, and this one matches the
   * reference constants of OPS.md to 1e-7. */
  double e[MAX_SIZE], sum = 0.0, s;
  int r;
  if (size < 1 || size > MAX_SIZE || size % 2 == 0)
    return;
  r = size / 2;
  s = shortest_decimal(sigma);
  for (int i = 0; i < size; i++) {
    double x = i - r;
    e[i] = exp(-(x * x) / (2.0 * s * s));
    sum += e[i];
  }
  for (int i = 0; i < size; i++)
    out[i] = (float)(e[i] / sum);
}

static inline int reflect101(int t, int n) {
  if (t < 0)
    return -t;
  if (t >= n)
    return 2 * n - 2 - t;
  return t;
}

static inline uint8_t to_u8(float v) {
  /* Truncation as tf.cast; clamp first so the cast is defined. */
  if (!(v > 0.0f))
    return 0;
  if (v >= 255.0f)
    return 255;
  return (uint8_t)(int)v;
}

static int check_size(int size, float sigma) {
  if (size < 1 || size > MAX_SIZE || size % 2 == 0)
    return FERRY_EINVAL;
  if (!(sigma > 0.0f) || isinf(sigma))
    return FERRY_EINVAL;
  return 0;
}

int ferry__blur_reference(int size, float sigma, const uint8_t *src,
                          uint8_t *dst, int h, int w, int c) {
  float k[MAX_SIZE], k2[MAX_SIZE][MAX_SIZE];
  int r;
  if (check_size(size, sigma) != 0 || c <= 0 || h <= 0 || w <= 0)
    return FERRY_EINVAL;
  r = size / 2;
  if (h <= r || w <= r)
    return FERRY_ETOOSMALL;
  ferry__blur_kernel(size, sigma, k);
  for (int i = 0; i < size; i++)
    for (int j = 0; j < size; j++)
      k2[i][j] = k[i] * k[j];
  for (int y = 0; y < h; y++)
    for (int x = 0; x < w; x++)
      for (int ch = 0; ch < c; ch++) {
        float acc = 0.0f;
        for (int i = 0; i < size; i++) {
          const uint8_t *srow =
              src + (size_t)reflect101(y + i - r, h) * w * c;
          for (int j = 0; j < size; j++)
            acc += k2[i][j] * (float)srow[(size_t)reflect101(x + j - r, w) *
                                              c + ch];
        }
        dst[((size_t)y * w + x) * c + ch] = to_u8(acc);
      }
  return 0;
}

int ferry__blur_new(int size, float sigma, ferry_blur_t **out,
                    ferry_error_t *err) {
  float k[MAX_SIZE];
  ferry_blur_t *b;
  *out = NULL;
  if (check_size(size, sigma) != 0)
    return ferry__seterr(err, FERRY_EINVAL,
                         "blur(%d, %g): size must be odd in 1..%d and sigma "
                         "positive", size, (double)sigma, MAX_SIZE);
  b = ferry__calloc(1, sizeof(*b));
  if (b == NULL)
    return ferry__seterr(err, FERRY_ENOMEM, "blur: out of memory");
  b->size = size;
  b->r = size / 2;
  b->sigma = sigma;
  ferry__blur_kernel(size, sigma, k);
  for (int i = 0; i <= b->r; i++)
    b->k[i] = k[b->r + i];
  *out = b;
  return 0;
}

void ferry__blur_free(ferry_blur_t *b) {
  if (b == NULL)
    return;
  ferry__aligned_free(b->ring);
  ferry__aligned_free(b->hrow);
  ferry__free(b);
}

/* Makes *buf hold at least `need` floats plus the slack, zeroed when new.
 * Grows only; steady-state calls of one size do not allocate. */
static int reserve(float **buf, size_t *cap, size_t need) {
  float *p;
  size_t bytes;
  if (*buf != NULL && *cap >= need)
    return 0;
  bytes = (need + FERRY__BLUR_SLACK) * sizeof(float);
  p = ferry__aligned_alloc(64, bytes);
  if (p == NULL)
    return FERRY_ENOMEM;
  memset(p, 0, bytes);
  ferry__aligned_free(*buf);
  *buf = p;
  *cap = need;
  return 0;
}

/* The portable separable path; the SIMD paths follow the same plan. */
void ferry__blur_scalar(const ferry__blur_job_t *jb) {
  const float *k = jb->k;
  const int r = jb->r, h = jb->h, c = jb->c, nring = 2 * r + 1;
  const ptrdiff_t n = (ptrdiff_t)jb->w * c;
  float *p = jb->hrow + jb->hoff;
  int next = 0; /* first source row not yet in the ring */
  for (int y = 0; y < h; y++) {
    const float *rows[MAX_SIZE];
    int last = y + r < h ? y + r : h - 1;
    for (; next <= last; next++) {
      const uint8_t *s = jb->src + (size_t)next * n;
      float *d = jb->ring + (size_t)(next % nring) * jb->rstride;
      for (ptrdiff_t x = 0; x < n; x++)
        d[x] = (float)s[x];
    }
    for (int i = -r; i <= r; i++)
      rows[i + r] =
          jb->ring + (size_t)(reflect101(y + i, h) % nring) * jb->rstride;
    for (ptrdiff_t x = 0; x < n; x++) {
      float acc = k[0] * rows[r][x];
      for (int j = 1; j <= r; j++)
        acc += k[j] * (rows[r - j][x] + rows[r + j][x]);
      p[x] = acc;
    }
    for (ptrdiff_t j = 1; j <= r; j++)
      for (ptrdiff_t ch = 0; ch < c; ch++) {
        p[-j * c + ch] = p[j * c + ch];
        p[n - c + j * c + ch] = p[n - c - j * c + ch];
      }
    uint8_t *o = jb->dst + (size_t)y * n;
    for (ptrdiff_t x = 0; x < n; x++) {
      float acc = k[0] * p[x];
      for (ptrdiff_t j = 1; j <= r; j++)
        acc += k[j] * (p[x - j * c] + p[x + j * c]);
      o[x] = to_u8(acc);
    }
  }
}

/* Floor division for the border plan (a may be negative). */
static int floor_div(int a, int b) {
  return a >= 0 ? a / b : -((-a + b - 1) / b);
}

/* Plans the reflected borders of a padded row for vectors of `v` floats
 * (see ferry__blur_pad_t). Returns the number of chunks, or -1 when some
 * chunk's sources do not fit in two aligned vectors or there are too
 * many chunks. */
static int plan_pads(ferry__blur_pad_t *pl, int v, int r, int w, int c) {
  const int rc = r * c, n = w * c;
  int np = 0;
  for (int side = 0; side < 2; side++) {
    int lo = side == 0 ? -rc : n, hi = side == 0 ? 0 : n + rc;
    for (int d = floor_div(lo, v) * v; d < hi; d += v) {
      int smin = 1 << 30, smax = -1, src[16];
      uint32_t keep = 0;
      for (int i = 0; i < v; i++) {
        int x = d + i, px, ch, sp;
        if (x < lo || x >= hi)
          continue;
        px = floor_div(x, c);
        ch = x - px * c;
        sp = reflect101(px, w);
        src[i] = sp * c + ch;
        smin = src[i] < smin ? src[i] : smin;
        smax = src[i] > smax ? src[i] : smax;
        keep |= 1u << i;
      }
      if (keep == 0)
        continue;
      int base = floor_div(smin, v) * v;
      if (smax - base >= 2 * v || np == FERRY__BLUR_MAX_PADS)
        return -1;
      memset(&pl[np], 0, sizeof(pl[np]));
      for (int i = 0; i < v; i++)
        if (keep & (1u << i))
          pl[np].idx[i] = src[i] - base;
      pl[np].dst = d;
      pl[np].src = base;
      pl[np].keep = keep;
      np++;
    }
  }
  return np;
}

int ferry__blur_apply(ferry_blur_t *b, const uint8_t *src, uint8_t *dst, int h,
                      int w, int c, ferry_error_t *err) {
  ferry__blur_job_t jb;
  size_t n16, hoff, rstride, hstride;
  int rc, need = b->r + 1, level, v;
  if (h <= 0 || w <= 0 || c <= 0)
    return ferry__seterr(err, FERRY_EINVAL, "blur(%d): invalid shape "
                         "%dx%dx%d", b->size, h, w, c);
  if (h <= b->r || w <= b->r)
    return ferry__seterr(err, FERRY_ETOOSMALL,
                         "blur(%d): image %dx%d is too small: REFLECT padding "
                         "needs H, W >= %d", b->size, h, w, need);
  /* Row offsets (the border plan's included) are ints. */
  if ((size_t)w * c > INT_MAX / 2)
    return ferry__seterr(err, FERRY_EINVAL, "blur(%d): rows of %dx%d "
                         "values are too long", b->size, w, c);
  n16 = ((size_t)w * c + 15) & ~(size_t)15;
  hoff = ((size_t)b->r * c + 15) & ~(size_t)15;
  rstride = n16 + 16;
  hstride = hoff + n16 + hoff + 16;
  rc = reserve(&b->ring, &b->ring_cap, (size_t)(2 * b->r + 4) * rstride);
  if (rc == 0)
    rc = reserve(&b->hrow, &b->hrow_cap, 8 * hstride);
  if (rc != 0)
    return ferry__seterr(err, rc, "blur(%d): out of memory for a %dx%dx%d "
                         "image", b->size, h, w, c);
  level = ferry__imgops_level();
  v = level == FERRY__ISA_AVX512 ? 16 : level == FERRY__ISA_AVX2 ? 8 : 0;
  if (v != 0 && (b->plan_w != w || b->plan_c != c || b->plan_v != v)) {
    b->npads = plan_pads(b->pads, v, b->r, w, c);
    b->plan_w = w;
    b->plan_c = c;
    b->plan_v = v;
  }
  jb.k = b->k;
  jb.r = b->r;
  jb.src = src;
  jb.dst = dst;
  jb.h = h;
  jb.w = w;
  jb.c = c;
  jb.ring = b->ring;
  jb.rstride = rstride;
  jb.hrow = b->hrow;
  jb.hstride = hstride;
  jb.hoff = hoff;
  jb.pads = b->pads;
  jb.npads = v != 0 ? b->npads : -1;
  switch (level) {
  case FERRY__ISA_AVX512:
    ferry__blur_avx512(&jb);
    break;
  case FERRY__ISA_AVX2:
    ferry__blur_avx2(&jb);
    break;
  default:
    ferry__blur_scalar(&jb);
    break;
  }
  return 0;
}
