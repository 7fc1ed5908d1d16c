/* The resampler's passes over a planned job (crop.c), compiled twice:
 * into crop.c for the baseline and into crop_avx2.c with AVX2, each file
 * defining RESAMPLE_ROWS to its function's name first. Both files build
 * with -fvect-cost-model=dynamic (the loops below vectorise) and
 * -ffp-contract=off (no fused multiply-adds), so both give the same bits:
 * every sum is formed in the same order with the same roundings. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "imgops_internal.h"

typedef ferry__v4f rs_v4;
typedef int32_t rs_v4i __attribute__((vector_size(16)));
typedef float rs_v8 __attribute__((vector_size(32)));
typedef int32_t rs_v8i __attribute__((vector_size(32)));

/* row[i] = sum_k w[k] * s[k * stride + i] over i < ncols, the sum in k
 * order. With n a constant (the switch below) the k loop unrolls and the
 * i loop vectorises, each sum kept in a register. */
static inline __attribute__((always_inline)) void
rs_vpass_n(float *restrict row, const uint8_t *restrict s, size_t stride,
           const float *restrict w, int n, size_t ncols) {
  for (size_t i = 0; i < ncols; i++) {
    float a = w[0] * (float)s[i];
#pragma GCC unroll 8
    for (int k = 1; k < n; k++)
      a += w[k] * (float)s[(size_t)k * stride + i];
    row[i] = a;
  }
}

static void rs_vpass(float *restrict row, const uint8_t *restrict s,
                     size_t stride, const float *restrict w, int n,
                     size_t ncols) {
  switch (n) {
  case 1: rs_vpass_n(row, s, stride, w, 1, ncols); break;
  case 2: rs_vpass_n(row, s, stride, w, 2, ncols); break;
  case 3: rs_vpass_n(row, s, stride, w, 3, ncols); break;
  case 4: rs_vpass_n(row, s, stride, w, 4, ncols); break;
  case 5: rs_vpass_n(row, s, stride, w, 5, ncols); break;
  case 6: rs_vpass_n(row, s, stride, w, 6, ncols); break;
  default: {
    /* Long filters: a row at a time, the same order of sums. */
    float w0 = w[0];
    for (size_t i = 0; i < ncols; i++)
      row[i] = w0 * (float)s[i];
    for (int k = 1; k < n; k++) {
      const uint8_t *restrict sk = s + (size_t)k * stride;
      float wk = w[k];
      for (size_t i = 0; i < ncols; i++)
        row[i] += wk * (float)sk[i];
    }
  }
  }
}

static inline uint8_t rs_u8(float v) {
  if (!(v > 0.0f))
    return 0;
  if (v >= 254.5f)
    return 255;
  return (uint8_t)(int)(v + 0.5f);
}

/* The horizontal pass of one row into 3-channel output, n taps a pixel
 * (inlined with n constant by the switch of the caller). */
/* Output pixel ox of a row: its n taps' sum on 4 lanes, then rs_u8 on
 * each (+0.5, clamp to [0, 255], NaN to 0, trunc). */
static inline __attribute__((always_inline)) rs_v4i
rs_h4_pixel(const float *wx, const rs_v4 *p4, int n) {
  rs_v4 a = wx[0] * p4[0];
  for (int k = 1; k < n; k++)
    a += wx[k] * p4[k];
  a += 0.5f;
  rs_v4i lo = a > 0.0f, hi = a >= 255.0f;
  rs_v4i t = __builtin_convertvector(a, rs_v4i);
  return (t & lo & ~hi) | (hi & 255);
}

#ifdef __SSE2__
/* Output pixels 2p and 2p + 1 of a row at once, 8 lanes (each lane the
 * same operations as rs_h4_pixel's), as 6 bytes in the low ones of the
 * result: their pixels' 4 lanes are at a and b, their weights at w8
 * (ferry__rs_job_t.wx8). */
static inline __attribute__((always_inline)) uint64_t
rs_h8_pair(const float *w8, const rs_v4 *a4, const rs_v4 *b4, int n) {
  const rs_v8 *w = (const rs_v8 *)(const void *)w8;
  rs_v8 a = w[0] * __builtin_shufflevector(a4[0], b4[0], 0, 1, 2, 3, 4, 5,
                                           6, 7);
#pragma GCC unroll 8
  for (int k = 1; k < n; k++)
    a += w[k] * __builtin_shufflevector(a4[k], b4[k], 0, 1, 2, 3, 4, 5, 6, 7);
  a += 0.5f;
  rs_v8i lo = a > 0.0f, hi = a >= 255.0f;
  rs_v8i t = __builtin_convertvector(a, rs_v8i);
  t = (t & lo & ~hi) | (hi & 255);
  __m128i p = _mm_packs_epi32((__m128i)__builtin_shufflevector(t, t, 0, 1, 2, 3),
                              (__m128i)__builtin_shufflevector(t, t, 4, 5, 6, 7));
  uint64_t u = (uint64_t)_mm_cvtsi128_si64(_mm_packus_epi16(p, p));
  /* Bytes R G B x R G B x: drop the first x. */
  return (u & 0xFFFFFFu) | ((u >> 8) & 0xFFFFFF000000u);
}
#endif

static inline __attribute__((always_inline)) void
rs_h4(const ferry__rs_job_t *j, const rs_v4 *r4, uint8_t *o, int n) {
  const float *wx = j->wx;
  const int *xs = j->xstart;
  const int xlo = j->xlo, dw = j->dw;
  const size_t st = (size_t)j->xstride;
  int ox = 0;
#ifdef __SSE2__
  /* Two pixels at a time, 8 bytes a store: the last 2 are the next
   * pixel's, which its own store overwrites (so a pair needs a pixel
   * after it). */
  const float *w8 = j->wx8;
  for (; ox + 2 < dw; ox += 2, w8 += 8 * n, o += 6) {
    uint64_t u = rs_h8_pair(w8, r4 + (xs[ox] - xlo), r4 + (xs[ox + 1] - xlo),
                            n);
    memcpy(o, &u, 8);
  }
  wx += (size_t)ox * st;
  /* The 4 lanes as bytes in one store: the 4th is the next pixel's,
   * which its own store overwrites; the row's last pixel below. */
  for (; ox + 1 < dw; ox++, wx += st, o += 3) {
    rs_v4i t = rs_h4_pixel(wx, r4 + (xs[ox] - xlo), n);
    __m128i p = _mm_packs_epi32((__m128i)t, (__m128i)t);
    uint32_t u = (uint32_t)_mm_cvtsi128_si32(_mm_packus_epi16(p, p));
    memcpy(o, &u, 4);
  }
#endif
  for (; ox < dw; ox++, wx += st, o += 3) {
    rs_v4i t = rs_h4_pixel(wx, r4 + (xs[ox] - xlo), n);
    o[0] = (uint8_t)t[0];
    o[1] = (uint8_t)t[1];
    o[2] = (uint8_t)t[2];
  }
}

void RESAMPLE_ROWS(const ferry__rs_job_t *j);
void RESAMPLE_ROWS(const ferry__rs_job_t *j) {
  int ic = j->in_c, oc = j->out_c;
  const rs_v4 *r4 = ic == 4 ? (const rs_v4 *)(const void *)j->row : j->row4;
  for (int oy = 0; oy < j->dh; oy++) {
    uint8_t *o = j->dst + (size_t)oy * (size_t)j->dw * (size_t)oc;
    rs_vpass(j->row, j->src + (size_t)j->ystart[oy] * j->stride, j->stride,
             j->wy + (size_t)oy * (size_t)j->ystride, j->ycount[oy],
             j->ncols);
    if (ic == 3) {
      size_t np = j->ncols / 3;
      for (size_t i = 0; i < np; i++) {
        rs_v4 v = {j->row[3 * i], j->row[3 * i + 1], j->row[3 * i + 2],
                   0.0f};
        j->row4[i] = v;
      }
    }
    if (oc == 3 && ic >= 3) {
      /* One 4-lane vector per pixel, a tap loop of fixed length. */
      switch (j->xtaps) {
      case 1: rs_h4(j, r4, o, 1); break;
      case 2: rs_h4(j, r4, o, 2); break;
      case 3: rs_h4(j, r4, o, 3); break;
      case 4: rs_h4(j, r4, o, 4); break;
      case 5: rs_h4(j, r4, o, 5); break;
      case 6: rs_h4(j, r4, o, 6); break;
      case 7: rs_h4(j, r4, o, 7); break;
      case 8: rs_h4(j, r4, o, 8); break;
      default: rs_h4(j, r4, o, j->xtaps); break;
      }
      continue;
    }
    for (int ox = 0; ox < j->dw; ox++) {
      int nx = j->xcount[ox];
      const float *wx = j->wx + (size_t)ox * (size_t)j->xstride;
      const float *p = j->row + (size_t)(j->xstart[ox] - j->xlo) * (size_t)ic;
      uint8_t *q = o + (size_t)ox * (size_t)oc;
      for (int ch = 0; ch < oc; ch++) {
        float a = 0.0f;
        for (int k = 0; k < nx; k++)
          a += wx[k] * p[(size_t)k * (size_t)ic + (size_t)ch];
        q[ch] = rs_u8(a);
      }
    }
  }
}
