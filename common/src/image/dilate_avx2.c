/* AVX2 dilate 3x3: per output row, the vertical max of the three clipped
 * rows goes into a small buffer padded by one replicated pixel on each
 * side, then the horizontal max of that buffer at -c, 0, +c bytes. Rows
 * wider than the buffer are done in segments. */
#include <immintrin.h>
#include <string.h>

#include "imgops_internal.h"

#define SEG 4096
#define MAXC 32

/* out[i] = max(a[i], b[i], e[i]) for i < n. Ends with an overlapping
 * vector instead of a scalar tail; `out` never aliases the inputs, so
 * recomputing a few bytes writes the same values. */
static inline void max3(const uint8_t *a, const uint8_t *b, const uint8_t *e,
                        uint8_t *out, size_t n) {
  size_t i = 0;
  if (n >= 32) {
    for (;;) {
      __m256i v = _mm256_max_epu8(
          _mm256_loadu_si256((const __m256i *)(a + i)),
          _mm256_loadu_si256((const __m256i *)(b + i)));
      v = _mm256_max_epu8(v, _mm256_loadu_si256((const __m256i *)(e + i)));
      _mm256_storeu_si256((__m256i *)(out + i), v);
      if (i + 32 == n)
        return;
      i += 32;
      if (i + 32 > n)
        i = n - 32;
    }
  }
  if (n >= 16) {
    for (;;) {
      __m128i v = _mm_max_epu8(_mm_loadu_si128((const __m128i *)(a + i)),
                               _mm_loadu_si128((const __m128i *)(b + i)));
      v = _mm_max_epu8(v, _mm_loadu_si128((const __m128i *)(e + i)));
      _mm_storeu_si128((__m128i *)(out + i), v);
      if (i + 16 == n)
        return;
      i += 16;
      if (i + 16 > n)
        i = n - 16;
    }
  }
  for (; i < n; i++) {
    uint8_t m = a[i] > b[i] ? a[i] : b[i];
    out[i] = m > e[i] ? m : e[i];
  }
}

/* Fast path of ferry__dilate3x3 (h, w, c >= 1). */
void ferry__dilate3x3_avx2(const uint8_t *src, uint8_t *dst, int h, int w,
                           int c) {
  uint8_t vbuf[SEG + 2 * MAXC];
  size_t n = (size_t)w * c, cc = (size_t)c;
  if (c > MAXC) {
    ferry__dilate3x3_scalar(src, dst, h, w, c);
    return;
  }
  for (int y = 0; y < h; y++) {
    const uint8_t *m = src + (size_t)y * n;
    const uint8_t *u = y > 0 ? m - n : m;
    const uint8_t *d = y + 1 < h ? m + n : m;
    uint8_t *o = dst + (size_t)y * n;
    for (size_t s = 0; s < n; s += SEG) {
      size_t e = s + SEG < n ? s + SEG : n;
      /* vbuf[j] holds the vertical max at row position s - c + j. */
      size_t lo = s >= cc ? s - cc : 0;
      size_t hi = e + cc <= n ? e + cc : n;
      uint8_t *v0 = vbuf + (lo + cc - s);
      max3(u + lo, m + lo, d + lo, v0, hi - lo);
      if (s == 0)
        memcpy(vbuf, vbuf + cc, cc);
      if (e == n)
        memcpy(vbuf + (n - s) + cc, vbuf + (n - s), cc);
      max3(vbuf, vbuf + cc, vbuf + 2 * cc, o + s, e - s);
    }
  }
}
