/* The augmentation's arithmetic, shared by the CPU twin (augment.c, built
 * by the C compiler) and the CUDA kernel (augment_cuda.cu, built by nvcc):
 * the counter-based parameter generator, the per-image affine maps, the
 * reflect fill, bilinear sampling and the float16/bfloat16 conversions.
 *
 * Plain C99 that is also valid CUDA C++. Host and device results are
 * bitwise equal because every step is a correctly rounded IEEE operation
 * (+, -, *, /, floor, conversions) done in the same order on both sides:
 * no library sin/cos (they differ between glibc and CUDA), no fused
 * multiply-adds (the C files build with -ffp-contract=off and the .cu
 * files with --fmad=false), no reassociation (no fast-math).
 *
 * The sampling follows TensorFlow's ImageProjectiveTransformV3 (which
 * Keras' RandomRotation and RandomZoom call): output pixel (x=col, y=row)
 * maps to a float input coordinate, the coordinate is reflected into the
 * image (fill mode "reflect", which repeats the edge) and clamped, then
 * read bilinearly with out-of-image taps as 0 (they only ever get weight
 * 0 after the clamp).
 */
#ifndef FERRY_CLIENT_AUGMENT_H
#define FERRY_CLIENT_AUGMENT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifndef __CUDACC__
#include <math.h>
#endif

#include "ferry/augment.h"

#ifdef __CUDACC__
#define FERRY_HD static inline __host__ __device__
#else
#define FERRY_HD static inline
#endif

/* How an image is resampled. */
#define FERRY__RS_NONE 0 /* no rotate or zoom: pixels are read directly */
#define FERRY__RS_ONE 1  /* one bilinear pass through the affine map m */
#define FERRY__RS_TWO 2  /* exact mode: zoom pass over a rotation pass */

/* Largest accepted sizes (both paths index images with int). */
#define FERRY__AUG_MAX_DIM 32768
#define FERRY__AUG_MAX_CHANNELS 64

/* Everything one image's pixels need, derived from the spec and the
 * image's parameters by ferry__aug_setup. */
typedef struct ferry__aug_img_s {
  int flip;
  int resample;
  float m[6];   /* output -> input: x' = m0 x + m1 y + m2, y' = m3 x ... */
  float z, zx, zy; /* RS_TWO's zoom pass: x' = z x + zx, y' = z y + zy */
  int scale_on;
  float scale;
} ferry__aug_img_t;

/* ---------------------------------------------------------------------
 * The counter-based generator: splitmix64 over a key hashed from
 * (seed, epoch, batch, image). Integer operations only, so identical
 * everywhere.
 */

#define FERRY__GOLDEN 0x9E3779B97F4A7C15ull

FERRY_HD uint64_t ferry__aug_mix(uint64_t x) {
  x += FERRY__GOLDEN;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

FERRY_HD uint64_t ferry__aug_key(uint64_t seed, uint64_t epoch,
                                 uint64_t batch, uint64_t image) {
  uint64_t k = ferry__aug_mix(seed);
  k = ferry__aug_mix(k ^ epoch);
  k = ferry__aug_mix(k ^ batch);
  return ferry__aug_mix(k ^ image);
}

/* Draw number `i` of a key: the i-th output of splitmix64 seeded with it. */
FERRY_HD uint64_t ferry__aug_draw(uint64_t key, uint32_t i) {
  return ferry__aug_mix(key + (uint64_t)i * FERRY__GOLDEN);
}

/* A uniform float in [0, 1) from the top 24 bits: the integer converts to
 * float exactly and the scaling by 2^-24 is exact. */
FERRY_HD float ferry__aug_uniform(uint64_t r) {
  return (float)(uint32_t)(r >> 40) * 5.9604644775390625e-8f;
}

/* The draws: 0 the flip bit, 1 the angle, 2 the zoom. Every draw is made
 * whether or not its op is on, so turning an op on or off leaves the
 * others' values alone. */
FERRY_HD void ferry__aug_params(const ferry_augment_spec_t *spec,
                                uint64_t seed, uint64_t epoch, uint64_t batch,
                                uint64_t image, ferry_augment_params_t *out) {
  uint64_t key = ferry__aug_key(seed, epoch, batch, image);
  float u1 = ferry__aug_uniform(ferry__aug_draw(key, 1));
  float u2 = ferry__aug_uniform(ferry__aug_draw(key, 2));
  out->flip = spec->flip == FERRY_FLIP_HORIZONTAL &&
              (ferry__aug_draw(key, 0) >> 63) != 0;
  out->angle = 0.0f;
  out->zoom = 1.0f;
  if (spec->rotate > 0.0f) {
    float bound = spec->rotate * 6.28318548f; /* float32(2 pi) */
    out->angle = (u1 * 2.0f - 1.0f) * bound;
  }
  if (spec->zoom > 0.0f)
    out->zoom = 1.0f + (u2 * 2.0f - 1.0f) * spec->zoom;
}

/* ---------------------------------------------------------------------
 * sin and cos in double from +, - and * only (the libraries' versions
 * differ between host and device): reduce by the nearest multiple of
 * pi/2 (Cody-Waite, two constants), then Taylor series on |r| <= pi/4,
 * whose truncation errors are below 1e-16. Angles here are below 2 pi in
 * magnitude.
 */
FERRY_HD void ferry__aug_sincos(double t, double *s, double *c) {
  double q = t * 0.63661977236758134308;
  int k = (int)(q >= 0.0 ? q + 0.5 : q - 0.5);
  double r = (t - (double)k * 1.5707963267948966) -
             (double)k * 6.123233995736766e-17;
  double r2 = r * r;
  double sp = r2 * (1.0 / 1307674368000.0);
  double cp = r2 * (1.0 / 20922789888000.0);
  double sr, cr;
  sp = r2 * (1.0 / 6227020800.0 - sp);
  sp = r2 * (1.0 / 39916800.0 - sp);
  sp = r2 * (1.0 / 362880.0 - sp);
  sp = r2 * (1.0 / 5040.0 - sp);
  sp = r2 * (1.0 / 120.0 - sp);
  sp = r2 * (1.0 / 6.0 - sp);
  sr = r - r * sp;
  cp = r2 * (1.0 / 87178291200.0 - cp);
  cp = r2 * (1.0 / 479001600.0 - cp);
  cp = r2 * (1.0 / 3628800.0 - cp);
  cp = r2 * (1.0 / 40320.0 - cp);
  cp = r2 * (1.0 / 720.0 - cp);
  cp = r2 * (1.0 / 24.0 - cp);
  cp = r2 * (0.5 - cp);
  cr = 1.0 - cp;
  switch (k & 3) {
  case 0:
    *s = sr;
    *c = cr;
    break;
  case 1:
    *s = cr;
    *c = -sr;
    break;
  case 2:
    *s = -sr;
    *c = -cr;
    break;
  default:
    *s = -cr;
    *c = sr;
    break;
  }
}

/* Derives an image's maps (OPS.md's formulas, in float32 as Keras builds
 * its transforms). Keras order: flip, then rotation, then zoom; mapping
 * an output pixel back to the input runs the other way: zoom's map, then
 * rotation's, then the flip (done on integer pixel indices, so exact). */
FERRY_HD void ferry__aug_setup(const ferry_augment_spec_t *spec,
                               const ferry_augment_params_t *p, int w, int h,
                               ferry__aug_img_t *img) {
  float w1 = (float)(w - 1), h1 = (float)(h - 1);
  float c = 1.0f, s = 0.0f, a2, b2, z = p->zoom;
  int rot = spec->rotate > 0.0f, zoom = spec->zoom > 0.0f;
  img->flip = p->flip ? 1 : 0;
  img->scale_on = spec->rescale ? 1 : 0;
  img->scale = spec->scale;
  if (rot) {
    double sd, cd;
    ferry__aug_sincos((double)p->angle, &sd, &cd);
    s = (float)sd;
    c = (float)cd;
  }
  a2 = (w1 - (c * w1 - s * h1)) * 0.5f;
  b2 = (h1 - (s * w1 + c * h1)) * 0.5f;
  img->z = z;
  img->zx = w1 * 0.5f * (1.0f - z);
  img->zy = h1 * 0.5f * (1.0f - z);
  if (!rot && !zoom) {
    img->resample = FERRY__RS_NONE;
    img->m[0] = 1.0f;
    img->m[1] = 0.0f;
    img->m[2] = 0.0f;
    img->m[3] = 0.0f;
    img->m[4] = 1.0f;
    img->m[5] = 0.0f;
  } else if (!zoom || (rot && spec->exact)) {
    /* Rotation alone, or exact mode's rotation pass. */
    img->resample = zoom ? FERRY__RS_TWO : FERRY__RS_ONE;
    img->m[0] = c;
    img->m[1] = -s;
    img->m[2] = a2;
    img->m[3] = s;
    img->m[4] = c;
    img->m[5] = b2;
  } else if (!rot) {
    img->resample = FERRY__RS_ONE;
    img->m[0] = z;
    img->m[1] = 0.0f;
    img->m[2] = img->zx;
    img->m[3] = 0.0f;
    img->m[4] = z;
    img->m[5] = img->zy;
  } else {
    /* Fused: rotation's map after zoom's, one affine map. */
    img->resample = FERRY__RS_ONE;
    img->m[0] = c * z;
    img->m[1] = -(s * z);
    img->m[2] = (c * img->zx - s * img->zy) + a2;
    img->m[3] = s * z;
    img->m[4] = c * z;
    img->m[5] = (s * img->zx + c * img->zy) + b2;
  }
}

/* ---------------------------------------------------------------------
 * Sampling.
 */

/* Fill mode "reflect" (d c b a | a b c d | d c b a) on a float
 * coordinate, then the clamp to [0, len-1]: TensorFlow's map_coordinate
 * for FILL_REFLECT, operation for operation (len >= 2). */
FERRY_HD float ferry__aug_reflect(float x, int len) {
  long long sz2 = 2 * (long long)len;
  float hi = (float)(len - 1);
  if (x < 0.0f) {
    x = (float)(sz2 * (long long)(-x / (float)sz2)) + x;
    x = (x < (float)-len) ? x + (float)sz2 : -x - 1.0f;
  } else if (x > hi) {
    x -= (float)(sz2 * (long long)(x / (float)sz2));
    if (x >= (float)len)
      x = (float)sz2 - x - 1.0f;
  }
  return x < 0.0f ? 0.0f : (x > hi ? hi : x);
}

/* The four taps of a bilinear read at a float coordinate: integer
 * indices (-1 for a tap past the far edge, read as 0) and weights as
 * TensorFlow computes them (ceil - x and x - floor). */
typedef struct ferry__aug_taps_s {
  int x0, x1, y0, y1;
  float wx0, wx1, wy0, wy1;
} ferry__aug_taps_t;

FERRY_HD void ferry__aug_taps(float x, float y, int w, int h,
                              ferry__aug_taps_t *t) {
  float xr = ferry__aug_reflect(x, w), yr = ferry__aug_reflect(y, h);
  float xf = floorf(xr), yf = floorf(yr);
  float xc = xf + 1.0f, yc = yf + 1.0f;
  t->x0 = (int)xf;
  t->y0 = (int)yf;
  t->x1 = t->x0 + 1 < w ? t->x0 + 1 : -1;
  t->y1 = t->y0 + 1 < h ? t->y0 + 1 : -1;
  t->wx0 = xc - xr;
  t->wx1 = xr - xf;
  t->wy0 = yc - yr;
  t->wy1 = yr - yf;
}

/* Pixel (x, y) channel ch of the flipped source image, or 0 off the
 * image. */
FERRY_HD float ferry__aug_src(const uint8_t *img, int w, int ch_count,
                              int flip, int x, int y, int ch) {
  int sx;
  if (x < 0 || y < 0)
    return 0.0f;
  sx = flip ? w - 1 - x : x;
  return (float)img[((size_t)y * (size_t)w + (size_t)sx) * (size_t)ch_count +
                    (size_t)ch];
}

FERRY_HD float ferry__aug_bilinear(const ferry__aug_taps_t *t,
                                   const uint8_t *img, int w, int ch_count,
                                   int flip, int ch) {
  float v00 = ferry__aug_src(img, w, ch_count, flip, t->x0, t->y0, ch);
  float v01 = ferry__aug_src(img, w, ch_count, flip, t->x1, t->y0, ch);
  float v10 = ferry__aug_src(img, w, ch_count, flip, t->x0, t->y1, ch);
  float v11 = ferry__aug_src(img, w, ch_count, flip, t->x1, t->y1, ch);
  float top = t->wx0 * v00 + t->wx1 * v01;
  float bottom = t->wx0 * v10 + t->wx1 * v11;
  return t->wy0 * top + t->wy1 * bottom;
}

/* ---------------------------------------------------------------------
 * Output conversions: round to nearest even, from the float's bits.
 */

FERRY_HD uint32_t ferry__aug_f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  return u;
}

FERRY_HD uint16_t ferry__aug_f32_to_f16(float f) {
  uint32_t x = ferry__aug_f32_bits(f);
  uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7FFFFFFFu;
  uint32_t e = ax >> 23, m = ax & 0x7FFFFFu, h, rem;
  if (ax > 0x7F800000u) /* NaN: quiet, keep the payload's top bits */
    return (uint16_t)(sign | 0x7E00u | (m >> 13));
  if (ax >= 0x47800000u) /* 65536 and above (and inf): inf */
    return (uint16_t)(sign | 0x7C00u);
  if (ax < 0x38800000u) {
    /* Below 2^-14: a float16 subnormal (units of 2^-24) or 0. */
    uint32_t shift, q, half;
    if (ax <= 0x33000000u) /* at most 2^-25: ties to even 0 */
      return (uint16_t)sign;
    m |= 0x800000u;
    shift = 126u - e; /* 14..24 */
    q = m >> shift;
    rem = m & ((1u << shift) - 1u);
    half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u) != 0))
      q++;
    return (uint16_t)(sign | q);
  }
  h = ((e - 112u) << 10) | (m >> 13);
  rem = m & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u) != 0))
    h++; /* a carry into the exponent is right, up to inf */
  return (uint16_t)(sign | h);
}

FERRY_HD uint16_t ferry__aug_f32_to_bf16(float f) {
  uint32_t x = ferry__aug_f32_bits(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u)
    return (uint16_t)((x >> 16) | 0x40u);
  return (uint16_t)((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

FERRY_HD void ferry__aug_store(void *out, size_t i, float v, int dtype) {
  if (dtype == FERRY_DTYPE_FLOAT16)
    ((uint16_t *)out)[i] = ferry__aug_f32_to_f16(v);
  else if (dtype == FERRY_DTYPE_BFLOAT16)
    ((uint16_t *)out)[i] = ferry__aug_f32_to_bf16(v);
  else
    ((float *)out)[i] = v;
}

/* ---------------------------------------------------------------------
 * The per-pixel routine: every channel of output pixel (x, y) of one
 * image. `src` is the image (h x w x ch_count uint8); channel k goes to
 * element `base + k * cstride` of `out` (NHWC: base = pixel * C,
 * cstride 1; NCHW: base = image plane start + pixel, cstride h * w).
 */
FERRY_HD void ferry__aug_pixel(const ferry__aug_img_t *p, const uint8_t *src,
                               int w, int h, int ch_count, int x, int y,
                               void *out, size_t base, size_t cstride,
                               int dtype) {
  float fx = (float)x, fy = (float)y;
  int k;
  if (p->resample == FERRY__RS_NONE) {
    for (k = 0; k < ch_count; k++) {
      float v = ferry__aug_src(src, w, ch_count, p->flip, x, y, k);
      if (p->scale_on)
        v = v * p->scale;
      ferry__aug_store(out, base + (size_t)k * cstride, v, dtype);
    }
  } else if (p->resample == FERRY__RS_ONE) {
    ferry__aug_taps_t t;
    float xin = (p->m[0] * fx + p->m[1] * fy) + p->m[2];
    float yin = (p->m[3] * fx + p->m[4] * fy) + p->m[5];
    ferry__aug_taps(xin, yin, w, h, &t);
    for (k = 0; k < ch_count; k++) {
      float v = ferry__aug_bilinear(&t, src, w, ch_count, p->flip, k);
      if (p->scale_on)
        v = v * p->scale;
      ferry__aug_store(out, base + (size_t)k * cstride, v, dtype);
    }
  } else {
    /* Exact mode: the zoom pass reads four pixels of the rotated float
     * image, each of them recomputed here from its own rotation taps, so
     * the result equals two full passes without an intermediate buffer. */
    ferry__aug_taps_t zt, rt[4];
    int q;
    ferry__aug_taps(p->z * fx + p->zx, p->z * fy + p->zy, w, h, &zt);
    for (q = 0; q < 4; q++) {
      int ix = (q & 1) ? zt.x1 : zt.x0, iy = (q & 2) ? zt.y1 : zt.y0;
      float rx = (float)ix, ry = (float)iy;
      if (ix < 0 || iy < 0) {
        rt[q].x0 = -1; /* an off-image tap of the intermediate: 0 */
        continue;
      }
      ferry__aug_taps((p->m[0] * rx + p->m[1] * ry) + p->m[2],
                      (p->m[3] * rx + p->m[4] * ry) + p->m[5], w, h, &rt[q]);
    }
    for (k = 0; k < ch_count; k++) {
      float iv[4], top, bottom, v;
      for (q = 0; q < 4; q++)
        iv[q] = rt[q].x0 < 0 ? 0.0f
                             : ferry__aug_bilinear(&rt[q], src, w, ch_count,
                                                   p->flip, k);
      top = zt.wx0 * iv[0] + zt.wx1 * iv[1];
      bottom = zt.wx0 * iv[2] + zt.wx1 * iv[3];
      v = zt.wy0 * top + zt.wy1 * bottom;
      if (p->scale_on)
        v = v * p->scale;
      ferry__aug_store(out, base + (size_t)k * cstride, v, dtype);
    }
  }
}

/* ---------------------------------------------------------------------
 * Host-side helpers (augment.c), shared by both launchers.
 */
#ifdef __cplusplus
extern "C" {
#endif

/* Checks a batch call's arguments (the contract of
 * ferry_augment_batch_cpu); `who` starts the messages. Returns 0 or the
 * error, with `err` filled. */
int ferry__augment_check(const ferry_augment_spec_t *spec, const void *in,
                         size_t n, uint32_t h, uint32_t w, uint32_t c,
                         const void *out, ferry_dtype_t dtype,
                         ferry_layout_t layout, const char *who,
                         ferry_error_t *err);

#ifdef __cplusplus
}
#endif

#endif /* FERRY_CLIENT_AUGMENT_H */
