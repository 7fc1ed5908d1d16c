/* AVX-512 separable blur (see blur.c and imgops_internal.h for the plan).
 * Sixteen floats per vector, masked loads and stores for row tails.
 * Output rows go in blocks of NR: one vertical loop makes the block's
 * sums from 2r + NR ring rows, each loaded once (loads bound this loop),
 * into NR padded rows whose borders come from two-source permutes. The
 * horizontal pass of a block runs after the vertical pass of the next
 * one (2 NR padded rows), so its misaligned loads read stores that have
 * left the store buffer. For blur 11 on one or three channels, the three
 * outer tap pairs are lane shifts of the aligned vectors around the
 * output instead of misaligned loads, balancing the load ports against
 * the shuffle units (all loads or all shifts are both ~40% slower on
 * Zen 4). */
#include <immintrin.h>
#include <stddef.h>

#include "imgops_internal.h"

#define V 16

static inline __mmask16 tail_mask(ptrdiff_t left) {
  return left >= V ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
}

static inline __m512 cvt16(__m128i b) {
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(b));
}

/* Converts a source row to floats; the tail vector is zero past n. */
static inline void conv_row(float *d, const uint8_t *s, ptrdiff_t n) {
  ptrdiff_t x = 0;
  for (; x + V <= n; x += V)
    _mm512_store_ps(d + x, cvt16(_mm_loadu_si128((const __m128i *)(s + x))));
  if (x < n)
    _mm512_store_ps(d + x, cvt16(_mm_maskz_loadu_epi8(tail_mask(n - x),
                                                       s + x)));
}

/* GCC cannot see that the runtime-radius copy of vert() sets every v[i]
 * it reads (the first 2r + NR). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

/* Vertical sums over k[0] of NR consecutive output rows, row q centred on
 * rows[r + q] and stored at p[q], each ring row loaded once. */
#define NR 4
static inline __attribute__((always_inline)) void
vert(float *const *p, const float *const *rows, ptrdiff_t n,
     const __m512 *kv, const int r) {
  for (ptrdiff_t x = 0; x < n; x += V) {
    __m512 v[2 * 15 + NR];
#pragma GCC unroll 40
    for (int i = 0; i < 2 * r + NR; i++) {
      __m512 t = _mm512_load_ps(rows[i] + x);
      /* Keeps each row in a register: folded into several rows' adds,
       * GCC would load it again each time, and loads are the
       * bottleneck. */
      __asm__("" : "+v"(t));
      v[i] = t;
    }
#pragma GCC unroll 4
    for (int q = 0; q < NR; q++) {
      __m512 a = v[r + q];
#pragma GCC unroll 16
      for (int j = 1; j <= r; j++)
        a = _mm512_fmadd_ps(kv[j], _mm512_add_ps(v[r + q - j], v[r + q + j]),
                            a);
      _mm512_store_ps(p[q] + x, a);
    }
  }
}

/* Reflected borders of the padded row `p` (interior start). */
static inline void pad_row(float *p, ptrdiff_t n, int r, int c,
                           const ferry__blur_pad_t *pl, int np) {
  if (np >= 0) {
    for (int i = 0; i < np; i++) {
      __m512 a = _mm512_load_ps(p + pl[i].src);
      __m512 b = _mm512_load_ps(p + pl[i].src + V);
      __m512i idx = _mm512_loadu_si512(pl[i].idx);
      _mm512_mask_store_ps(p + pl[i].dst, (__mmask16)pl[i].keep,
                           _mm512_permutex2var_ps(a, idx, b));
    }
    return;
  }
  for (ptrdiff_t j = 1; j <= r; j++)
    for (ptrdiff_t ch = 0; ch < c; ch++) {
      p[-j * c + ch] = p[j * c + ch];
      p[n - c + j * c + ch] = p[n - c - j * c + ch];
    }
}

/* Truncates 16 sums (never negative nor NaN: non-negative pixels times
 * positive taps) to bytes; the unsigned saturating narrow clamps at 255. */
static inline void store16(uint8_t *o, ptrdiff_t left, __m512 acc) {
  __m128i b = _mm512_cvtusepi32_epi8(_mm512_cvttps_epi32(acc));
  if (left >= V)
    _mm_storeu_si128((__m128i *)o, b);
  else
    _mm_mask_storeu_epi8(o, tail_mask(left), b);
}

/* Elements x - s and x + s of the window (lv, cv, rv) centred on cv. */
#define SHL(cv, lv, s)                                                       \
  _mm512_castsi512_ps(_mm512_alignr_epi32(_mm512_castps_si512(cv),          \
                                          _mm512_castps_si512(lv), 16 - (s)))
#define SHR(rv, cv, s)                                                       \
  _mm512_castsi512_ps(_mm512_alignr_epi32(_mm512_castps_si512(rv),          \
                                          _mm512_castps_si512(cv), (s)))
#define TAP_SHIFT(j, s)                                                      \
  acc = _mm512_fmadd_ps(kv[j], _mm512_add_ps(SHL(cv, lv, s), SHR(rv, cv, s)), \
                        acc)
#define TAP_LOAD(j, s)                                                       \
  acc = _mm512_fmadd_ps(kv[j], _mm512_add_ps(_mm512_loadu_ps(p + x - (s)),   \
                                             _mm512_loadu_ps(p + x + (s))),  \
                        acc)

/* Horizontal pass of the padded row `p` into output row `o`, radius 5
 * and c = 1 or 3 (r * c < 16: the window of three aligned vectors holds
 * every tap). */
static inline __attribute__((always_inline)) void
horiz5(uint8_t *o, const float *p, ptrdiff_t n, const __m512 *kv,
       const int c) {
  __m512 lv = _mm512_load_ps(p - V), cv = _mm512_load_ps(p);
  for (ptrdiff_t x = 0; x < n; x += V) {
    __m512 rv = _mm512_load_ps(p + x + V);
    __m512 acc = _mm512_mul_ps(kv[0], cv);
    if (c == 3) {
      TAP_LOAD(1, 3);
      TAP_LOAD(2, 6);
      TAP_SHIFT(3, 9);
      TAP_SHIFT(4, 12);
      TAP_SHIFT(5, 15);
    } else {
      TAP_LOAD(1, 1);
      TAP_LOAD(2, 2);
      TAP_SHIFT(3, 3);
      TAP_SHIFT(4, 4);
      TAP_SHIFT(5, 5);
    }
    store16(o + x, n - x, acc);
    lv = cv;
    cv = rv;
  }
}

/* Horizontal pass, any radius and channel count. */
static inline __attribute__((always_inline)) void
horiz(uint8_t *o, const float *p, ptrdiff_t n, ptrdiff_t c,
      const __m512 *kv, const int r) {
  for (ptrdiff_t x = 0; x < n; x += V) {
    __m512 acc = _mm512_mul_ps(kv[0], _mm512_load_ps(p + x));
#pragma GCC unroll 16
    for (ptrdiff_t j = 1; j <= r; j++)
      acc = _mm512_fmadd_ps(kv[j],
                            _mm512_add_ps(_mm512_loadu_ps(p + x - j * c),
                                          _mm512_loadu_ps(p + x + j * c)),
                            acc);
    store16(o + x, n - x, acc);
  }
}

/* `cc` is the channel count when known at compile time (1 or 3 with
 * radius 5), else 0. */
static inline __attribute__((always_inline)) void
run(const ferry__blur_job_t *jb, const int r, const int cc) {
  const int h = jb->h, c = cc ? cc : jb->c, nring = 2 * r + NR;
  const ptrdiff_t n = (ptrdiff_t)jb->w * c;
  float *hb[2 * NR];
  __m512 kv[16], kh[16];
  int next = 0;

  if (r < 0 || r > 15)
    __builtin_unreachable();
  for (int i = 0; i < 2 * NR; i++)
    hb[i] = jb->hrow + i * jb->hstride + jb->hoff;
  for (int j = 0; j <= r; j++) {
    /* The vertical pass leaves out the centre tap's factor (kv[j] =
     * k[j] / k[0], the centre taken as is, one multiply less) and the
     * horizontal pass puts it back (kh[j] = k[j] * k[0]). */
    kv[j] = _mm512_set1_ps(jb->k[j] / jb->k[0]);
    kh[j] = _mm512_set1_ps(jb->k[j] * jb->k[0]);
  }
  for (int y0 = 0; y0 < h + NR; y0 += NR) {
    /* Vertical pass of rows y0 .. y0 + NR - 1, then the horizontal pass
     * of the NR rows before. */
    float *const *p = hb + (y0 & NR);
    if (y0 < h) {
      const float *rows[2 * 15 + NR];
      int last = y0 + r + NR - 1 < h ? y0 + r + NR - 1 : h - 1;
      for (int i = 0; i < 2 * r + NR; i++) {
        int t = y0 - r + i;
        t = t < 0 ? -t : t >= h ? 2 * h - 2 - t : t;
        /* Rows past the image end only feed output rows past it too;
         * any ring row will do. */
        t = t < 0 ? 0 : t;
        rows[i] = jb->ring + (size_t)(t % nring) * jb->rstride;
      }
      for (; next <= last; next++)
        conv_row(jb->ring + (size_t)(next % nring) * jb->rstride,
                 jb->src + (size_t)next * n, n);
      vert(p, rows, n, kv, r);
      for (int q = 0; q < NR && y0 + q < h; q++)
        pad_row(p[q], n, r, c, jb->pads, jb->npads);
    }
    if (y0 >= NR) {
      int y = y0 - NR;
      for (int q = 0; q < NR && y + q < h; q++) {
        const float *pp = hb[(y & NR) + q];
        uint8_t *o = jb->dst + (size_t)(y + q) * n;
        if (cc)
          horiz5(o, pp, n, kh, cc);
        else
          horiz(o, pp, n, c, kh, r);
      }
    }
  }
}

/* AVX-512 path of ferry_blur_apply; radius 5 (blur 11) and 2 get copies
 * with the radius known at compile time so the tap loops unroll. */
void ferry__blur_avx512(const ferry__blur_job_t *jb) {
  switch (jb->r) {
  case 5:
    if (jb->c == 3)
      run(jb, 5, 3);
    else if (jb->c == 1)
      run(jb, 5, 1);
    else
      run(jb, 5, 0);
    break;
  case 2:
    run(jb, 2, 0);
    break;
  default:
    run(jb, jb->r, 0);
    break;
  }
}
