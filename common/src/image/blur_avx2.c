/* The blur's AVX2 path: blur_rows.h with eight floats per vector. A row
 * tail ends with an overlapping vector and rows narrower than a vector
 * take the scalar path. Borders come from one-source permutes and
 * blends; the horizontal pass uses misaligned loads only (lane shifts
 * built from aligned vectors measured slower here). */
#include <immintrin.h>
#include <stddef.h>

#include "imgops_internal.h"

#define BLUR_ENTRY ferry__blur_avx2
#define V 8
#define BLUR_MIN_N V
#define BLUR_NEXT_X(x, n) ((x) + 2 * V <= (n) || (x) + V >= (n) ? (x) + V \
                                                                 : (n) - V)

#define BV_PS(op) _mm256_##op##_ps
typedef __m256 bvec;

static inline bvec bv_cvt_u8(const uint8_t *s) {
  return _mm256_cvtepi32_ps(
      _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)s)));
}

/* The last V bytes again (n >= V). */
static inline void conv_tail(float *d, const uint8_t *s, ptrdiff_t x,
                             ptrdiff_t n) {
  (void)x;
  _mm256_storeu_ps(d + n - V, bv_cvt_u8(s + n - V));
}

/* Always a whole vector (BLUR_NEXT_X); the saturating packs clamp to
 * [0, 255]. */
static inline void store_u8(uint8_t *o, ptrdiff_t left, bvec acc) {
  __m256i iv = _mm256_cvttps_epi32(acc);
  __m128i w16 = _mm_packs_epi32(_mm256_castsi256_si128(iv),
                                _mm256_extracti128_si256(iv, 1));
  (void)left;
  _mm_storel_epi64((__m128i *)o, _mm_packus_epi16(w16, w16));
}

/* Lanes from the first source vector where idx < 8, from the second
 * (idx - 8) otherwise, blended into the lanes of `keep`. */
static inline void pad_chunk(float *p, const ferry__blur_pad_t *pl) {
  const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  __m256i idx = _mm256_loadu_si256((const __m256i *)pl->idx);
  __m256 a = _mm256_permutevar8x32_ps(_mm256_load_ps(p + pl->src), idx);
  __m256 b = _mm256_permutevar8x32_ps(_mm256_load_ps(p + pl->src + V), idx);
  __m256i hi = _mm256_cmpgt_epi32(idx, _mm256_set1_epi32(V - 1));
  __m256i keep = _mm256_cmpeq_epi32(
      _mm256_and_si256(_mm256_set1_epi32((int)pl->keep), bit), bit);
  __m256 v = _mm256_blendv_ps(a, b, _mm256_castsi256_ps(hi));
  float *d = p + pl->dst;
  _mm256_store_ps(d, _mm256_blendv_ps(_mm256_load_ps(d), v,
                                      _mm256_castsi256_ps(keep)));
}

#include "blur_rows.h"
