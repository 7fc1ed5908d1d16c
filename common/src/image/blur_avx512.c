/* The blur's AVX-512 path: blur_rows.h with sixteen floats per vector,
 * masked loads and stores for row tails (any row width), borders from
 * two-source permutes, and lane shifts (alignr) for the outer taps of
 * blur 11 on one or three channels. */
#include <immintrin.h>
#include <stddef.h>

#include "imgops_internal.h"

#define BLUR_ENTRY ferry__blur_avx512
#define V 16
#define BLUR_MIN_N 0
#define BLUR_NEXT_X(x, n) ((x) + V)

#define BV_PS(op) _mm512_##op##_ps
typedef __m512 bvec;

static inline __mmask16 tail_mask(ptrdiff_t left) {
  return left >= V ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
}

static inline bvec cvt16(__m128i b) {
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(b));
}

static inline bvec bv_cvt_u8(const uint8_t *s) {
  return cvt16(_mm_loadu_si128((const __m128i *)s));
}

/* A masked load: the vector is zero past n. */
static inline void conv_tail(float *d, const uint8_t *s, ptrdiff_t x,
                             ptrdiff_t n) {
  _mm512_store_ps(d + x, cvt16(_mm_maskz_loadu_epi8(tail_mask(n - x),
                                                     s + x)));
}

/* The unsigned saturating narrow clamps at 255; a masked store for the
 * tail. */
static inline void store_u8(uint8_t *o, ptrdiff_t left, bvec acc) {
  __m128i b = _mm512_cvtusepi32_epi8(_mm512_cvttps_epi32(acc));
  if (left >= V)
    _mm_storeu_si128((__m128i *)o, b);
  else
    _mm_mask_storeu_epi8(o, tail_mask(left), b);
}

static inline void pad_chunk(float *p, const ferry__blur_pad_t *pl) {
  __m512 a = _mm512_load_ps(p + pl->src);
  __m512 b = _mm512_load_ps(p + pl->src + V);
  __m512i idx = _mm512_loadu_si512(pl->idx);
  _mm512_mask_store_ps(p + pl->dst, (__mmask16)pl->keep,
                       _mm512_permutex2var_ps(a, idx, b));
}

#define BLUR_SHL(cv, lv, s)                                                  \
  _mm512_castsi512_ps(_mm512_alignr_epi32(_mm512_castps_si512(cv),          \
                                          _mm512_castps_si512(lv), 16 - (s)))
#define BLUR_SHR(rv, cv, s)                                                  \
  _mm512_castsi512_ps(_mm512_alignr_epi32(_mm512_castps_si512(rv),          \
                                          _mm512_castps_si512(cv), (s)))

#include "blur_rows.h"
