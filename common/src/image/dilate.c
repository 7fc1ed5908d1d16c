/* dilate(3): tf.nn.dilation2d with a zero 3x3xC filter, SAME, stride 1.
 * Out-of-image taps are skipped, which for a max equals replicating the
 * edge: the fast paths rely on that (max is idempotent). */
#include "imgops.h"

#include "imgops_internal.h"

static inline uint8_t max8(uint8_t a, uint8_t b) { return a > b ? a : b; }

void ferry__dilate3x3_reference(const uint8_t *src, uint8_t *dst, int h, int w,
                                int c) {
  for (int y = 0; y < h; y++)
    for (int x = 0; x < w; x++)
      for (int ch = 0; ch < c; ch++) {
        uint8_t m = 0;
        for (int dy = -1; dy <= 1; dy++) {
          int yy = y + dy;
          if (yy < 0 || yy >= h)
            continue;
          for (int dx = -1; dx <= 1; dx++) {
            int xx = x + dx;
            if (xx < 0 || xx >= w)
              continue;
            m = max8(m, src[((size_t)yy * w + xx) * c + ch]);
          }
        }
        dst[((size_t)y * w + x) * c + ch] = m;
      }
}

/* Portable path: clipped rows (a missing row above or below is replaced by
 * the row itself), the interior columns in a loop the compiler can
 * vectorise, and the first and last pixel with clipped columns. */
static inline uint8_t col3(const uint8_t *u, const uint8_t *m,
                           const uint8_t *d, size_t x) {
  return max8(max8(u[x], m[x]), d[x]);
}

static void edge(const uint8_t *u, const uint8_t *m, const uint8_t *d,
                 uint8_t *o, size_t x0, size_t x1, size_t n, size_t c) {
  for (size_t x = x0; x < x1; x++) {
    size_t l = x >= c ? x - c : x;
    size_t r = x + c < n ? x + c : x;
    o[x] = max8(max8(col3(u, m, d, l), col3(u, m, d, x)), col3(u, m, d, r));
  }
}

void ferry__dilate3x3_scalar(const uint8_t *src, uint8_t *dst, int h, int w,
                             int c) {
  size_t n = (size_t)w * c, cc = (size_t)c;
  for (int y = 0; y < h; y++) {
    const uint8_t *m = src + (size_t)y * n;
    const uint8_t *u = y > 0 ? m - n : m;
    const uint8_t *d = y + 1 < h ? m + n : m;
    uint8_t *o = dst + (size_t)y * n;
    if (w < 3) {
      edge(u, m, d, o, 0, n, n, cc);
      continue;
    }
    edge(u, m, d, o, 0, cc, n, cc);
    for (size_t x = cc; x < n - cc; x++)
      o[x] = max8(max8(col3(u, m, d, x - cc), col3(u, m, d, x)),
                  col3(u, m, d, x + cc));
    edge(u, m, d, o, n - cc, n, n, cc);
  }
}

void ferry__dilate3x3(const uint8_t *src, uint8_t *dst, int h, int w, int c) {
  if (h <= 0 || w <= 0 || c <= 0)
    return;
  if (ferry__imgops_level() >= FERRY__ISA_AVX2)
    ferry__dilate3x3_avx2(src, dst, h, w, c);
  else
    ferry__dilate3x3_scalar(src, dst, h, w, c);
}
