/* AVX2 separable blur (see blur.c and imgops_internal.h for the plan).
 * Eight floats per vector; a row tail ends with an overlapping vector
 * (outputs never alias inputs, so recomputed values are identical) and
 * rows narrower than a vector take the scalar path. As in blur_avx512.c,
 * output rows go in blocks of NR: one vertical loop over 2r + NR ring rows
 * each loaded once, borders from one-source permutes and blends, and the
 * horizontal pass (misaligned loads; lane shifts built from aligned
 * vectors measured slower here) one block behind, so its loads read
 * stores that have left the store buffer. */
#include <immintrin.h>
#include <stddef.h>

#include "imgops_internal.h"

#define V 8

static inline __m256 cvt8(const uint8_t *s) {
  return _mm256_cvtepi32_ps(
      _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)s)));
}

/* Converts a source row (n >= V) to floats. */
static inline void conv_row(float *d, const uint8_t *s, ptrdiff_t n) {
  ptrdiff_t x = 0;
  for (; x + V <= n; x += V)
    _mm256_store_ps(d + x, cvt8(s + x));
  if (x < n)
    _mm256_storeu_ps(d + n - V, cvt8(s + n - V));
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
     const __m256 *kv, const int r) {
  for (ptrdiff_t x = 0; x < n; x += V) {
    __m256 v[2 * 15 + NR];
#pragma GCC unroll 40
    for (int i = 0; i < 2 * r + NR; i++) {
      __m256 t = _mm256_load_ps(rows[i] + x);
      /* Keeps each row in a register: folded into several rows' adds,
       * GCC would load it again each time, and loads are the
       * bottleneck. */
      __asm__("" : "+v"(t));
      v[i] = t;
    }
#pragma GCC unroll 4
    for (int q = 0; q < NR; q++) {
      __m256 a = v[r + q];
#pragma GCC unroll 16
      for (int j = 1; j <= r; j++)
        a = _mm256_fmadd_ps(kv[j], _mm256_add_ps(v[r + q - j], v[r + q + j]),
                            a);
      _mm256_store_ps(p[q] + x, a);
    }
  }
}

/* Reflected borders of the padded row `p` (interior start). */
static inline void pad_row(float *p, ptrdiff_t n, int r, int c,
                           const ferry__blur_pad_t *pl, int np) {
  if (np >= 0) {
    for (int i = 0; i < np; i++) {
      __m256i idx = _mm256_loadu_si256((const __m256i *)pl[i].idx);
      __m256 a = _mm256_permutevar8x32_ps(_mm256_load_ps(p + pl[i].src), idx);
      __m256 b = _mm256_permutevar8x32_ps(
          _mm256_load_ps(p + pl[i].src + V), idx);
      __m256i hi = _mm256_cmpgt_epi32(idx, _mm256_set1_epi32(V - 1));
      __m256i keep = _mm256_cmpeq_epi32(
          _mm256_and_si256(_mm256_set1_epi32((int)pl[i].keep),
                           _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128)),
          _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128));
      __m256 v = _mm256_blendv_ps(a, b, _mm256_castsi256_ps(hi));
      float *d = p + pl[i].dst;
      _mm256_store_ps(d, _mm256_blendv_ps(_mm256_load_ps(d), v,
                                          _mm256_castsi256_ps(keep)));
    }
    return;
  }
  for (ptrdiff_t j = 1; j <= r; j++)
    for (ptrdiff_t ch = 0; ch < c; ch++) {
      p[-j * c + ch] = p[j * c + ch];
      p[n - c + j * c + ch] = p[n - c - j * c + ch];
    }
}

/* Truncates 8 sums and stores them as bytes; the saturating packs clamp
 * to [0, 255]. */
static inline void store8(uint8_t *o, __m256 acc) {
  __m256i iv = _mm256_cvttps_epi32(acc);
  __m128i w16 = _mm_packs_epi32(_mm256_castsi256_si128(iv),
                                _mm256_extracti128_si256(iv, 1));
  _mm_storel_epi64((__m128i *)o, _mm_packus_epi16(w16, w16));
}

/* Horizontal pass of the padded row `p` into output row `o`. */
static inline __attribute__((always_inline)) void
horiz(uint8_t *o, const float *p, ptrdiff_t n, ptrdiff_t c,
      const __m256 *kv, const int r) {
  for (ptrdiff_t x = 0; x < n; x = x + 2 * V <= n || x + V >= n ? x + V
                                                                  : n - V) {
    __m256 acc = _mm256_mul_ps(kv[0], _mm256_loadu_ps(p + x));
#pragma GCC unroll 16
    for (ptrdiff_t j = 1; j <= r; j++)
      acc = _mm256_fmadd_ps(kv[j],
                            _mm256_add_ps(_mm256_loadu_ps(p + x - j * c),
                                          _mm256_loadu_ps(p + x + j * c)),
                            acc);
    store8(o + x, acc);
  }
}

static inline __attribute__((always_inline)) void
run(const ferry__blur_job_t *jb, const int r) {
  const int h = jb->h, c = jb->c, nring = 2 * r + NR;
  const ptrdiff_t n = (ptrdiff_t)jb->w * c;
  float *hb[2 * NR];
  __m256 kv[16], kh[16];
  int next = 0;

  if (r < 0 || r > 15)
    __builtin_unreachable();
  for (int i = 0; i < 2 * NR; i++)
    hb[i] = jb->hrow + i * jb->hstride + jb->hoff;
  if (n < V) {
    ferry__blur_scalar(jb);
    return;
  }
  for (int j = 0; j <= r; j++) {
    /* The vertical pass leaves out the centre tap's factor (kv[j] =
     * k[j] / k[0], the centre taken as is, one multiply less) and the
     * horizontal pass puts it back (kh[j] = k[j] * k[0]). */
    kv[j] = _mm256_set1_ps(jb->k[j] / jb->k[0]);
    kh[j] = _mm256_set1_ps(jb->k[j] * jb->k[0]);
  }
  for (int y0 = 0; y0 < h + NR; y0 += NR) {
    /* Vertical pass of rows y0 .. y0 + NR - 1, then the horizontal pass
     * of the NR rows before. */
    float *const *p = hb + (y0 & NR);
    if (y0 < h) {
      const float *rows[2 * 15 + NR];
      int last = y0 + r + NR - 1 < h ? y0 + r + NR - 1 : h - 1;
      for (; next <= last; next++)
        conv_row(jb->ring + (size_t)(next % nring) * jb->rstride,
                 jb->src + (size_t)next * n, n);
      for (int i = 0; i < 2 * r + NR; i++) {
        int t = y0 - r + i;
        t = t < 0 ? -t : t >= h ? 2 * h - 2 - t : t;
        /* Rows past the image end only feed output rows past it too;
         * any ring row will do. */
        t = t < 0 ? 0 : t;
        rows[i] = jb->ring + (size_t)(t % nring) * jb->rstride;
      }
      vert(p, rows, n, kv, r);
      for (int q = 0; q < NR && y0 + q < h; q++)
        pad_row(p[q], n, r, c, jb->pads, jb->npads);
    }
    if (y0 >= NR) {
      int y = y0 - NR;
      for (int q = 0; q < NR && y + q < h; q++) {
        const float *pp = hb[(y & NR) + q];
        uint8_t *o = jb->dst + (size_t)(y + q) * n;
        horiz(o, pp, n, c, kh, r);
      }
    }
  }
}

/* AVX2 path of ferry_blur_apply; radius 5 (blur 11) and 2 get copies
 * with the radius known at compile time so the tap loops unroll. */
void ferry__blur_avx2(const ferry__blur_job_t *jb) {
  switch (jb->r) {
  case 5:
    run(jb, 5);
    break;
  case 2:
    run(jb, 2);
    break;
  default:
    run(jb, jb->r);
    break;
  }
}
