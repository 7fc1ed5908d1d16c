/* AVX2 separable blur (see blur.c for the plan). Eight floats per vector;
 * a row tail ends with an overlapping vector (outputs never alias inputs,
 * so recomputed values are identical), rows narrower than a vector fall
 * back to scalar code. Each row's reflect padding is made from the source
 * bytes with two one-source permutes and a blend per chunk of eight
 * floats, the next row is prepared in the other padded-row buffer while
 * the current one is filtered, and the vertical pass makes two output
 * rows at a time so each tmp row loaded serves both. */
#include <immintrin.h>
#include <stddef.h>

#include "imgops_internal.h"

#define V 8
#define MAX_CHUNKS 16

typedef struct {
  int dst, src, cnt;
  __m256i idx, hi, store;
} pad_chunk_t;

/* As in blur_avx512.c, with a 16-byte source window per chunk that stays
 * inside the row. Returns -1 (scalar padding) for rows under 16 bytes or
 * when a chunk's sources span 16 floats or more. */
static int plan_pads(pad_chunk_t *pl, int r, int w, int c) {
  int rc = r * c, n = w * c, nch = 0;
  if (n < 2 * V)
    return -1;
  for (int side = 0; side < 2; side++) {
    int start = side == 0 ? 0 : rc + n;
    for (int q = 0; q < rc; q += V) {
      int cnt = rc - q < V ? rc - q : V, lo = 1 << 30, hi = -1;
      int src[V];
      for (int i = 0; i < cnt; i++) {
        int p = start + q + i, px = p / c - r, ch = p % c;
        int sp = px < 0 ? -px : 2 * (w - 1) - px;
        src[i] = sp * c + ch;
        lo = src[i] < lo ? src[i] : lo;
        hi = src[i] > hi ? src[i] : hi;
      }
      if (lo > n - 2 * V)
        lo = n - 2 * V;
      if (hi - lo >= 2 * V || nch == MAX_CHUNKS)
        return -1;
      int32_t ix[V] = {0}, st[V] = {0};
      for (int i = 0; i < cnt; i++) {
        ix[i] = src[i] - lo;
        st[i] = -1;
      }
      pl[nch].dst = start + q;
      pl[nch].src = lo;
      pl[nch].cnt = cnt;
      pl[nch].idx = _mm256_loadu_si256((const __m256i *)ix);
      pl[nch].hi = _mm256_cmpgt_epi32(pl[nch].idx, _mm256_set1_epi32(V - 1));
      pl[nch].store = _mm256_loadu_si256((const __m256i *)st);
      nch++;
    }
  }
  return nch;
}

static inline uint8_t to_u8(float v) {
  if (!(v > 0.0f))
    return 0;
  if (v >= 255.0f)
    return 255;
  return (uint8_t)(int)v;
}

/* Next vector start after x, or n when done; the last vector overlaps. */
static inline ptrdiff_t next_x(ptrdiff_t x, ptrdiff_t n) {
  if (x + V >= n)
    return n;
  return x + 2 * V <= n ? x + V : n - V;
}

static inline __m256 cvt8(__m128i b) {
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b));
}

/* Converts image row `s` into the padded row `pr` (interior at rc). */
static inline void fill_row(float *pr, const uint8_t *s, ptrdiff_t n,
                            ptrdiff_t rc, int r, int c,
                            const pad_chunk_t *pl, int nch) {
  float *p = pr + rc;
  if (n >= V) {
    for (ptrdiff_t x = 0; x < n; x = next_x(x, n))
      _mm256_storeu_ps(p + x, cvt8(_mm_loadl_epi64((const __m128i *)(s + x))));
  } else {
    for (ptrdiff_t x = 0; x < n; x++)
      p[x] = (float)s[x];
  }
  if (nch >= 0) {
    for (int i = 0; i < nch; i++) {
      __m128i b = _mm_loadu_si128((const __m128i *)(s + pl[i].src));
      __m256 a = _mm256_permutevar8x32_ps(cvt8(b), pl[i].idx);
      __m256 e = _mm256_permutevar8x32_ps(cvt8(_mm_srli_si128(b, 8)),
                                          pl[i].idx);
      _mm256_maskstore_ps(pr + pl[i].dst, pl[i].store,
                          _mm256_blendv_ps(a, e,
                                           _mm256_castsi256_ps(pl[i].hi)));
    }
  } else {
    for (ptrdiff_t j = 1; j <= r; j++)
      for (ptrdiff_t ch = 0; ch < c; ch++) {
        p[-j * c + ch] = s[j * c + ch];
        p[n - c + j * c + ch] = s[n - c - j * c + ch];
      }
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

static inline __attribute__((always_inline)) void
run(const ferry__blur_job_t *jb, const int r) {
  const int h = jb->h, c = jb->c;
  const ptrdiff_t n = (ptrdiff_t)jb->w * c, rc = (ptrdiff_t)r * c;
  __m256 kv[16];
  pad_chunk_t pl[MAX_CHUNKS];
  int nch = plan_pads(pl, r, jb->w, c);
  float *prow[2] = {jb->row, jb->row + jb->rstride};
  const float *k = jb->k;

  if (r < 0 || r > 15)
    __builtin_unreachable();
  for (int j = 0; j <= r; j++)
    kv[j] = _mm256_set1_ps(k[j]);
  fill_row(prow[0], jb->src, n, rc, r, c, pl, nch);
  for (int yy = 0; yy < h + r; yy++) {
    if (yy < h) {
      const float *p = prow[yy & 1] + rc;
      float *t = jb->tmp + (size_t)yy * n;
      if (yy + 1 < h)
        fill_row(prow[(yy + 1) & 1], jb->src + (size_t)(yy + 1) * n, n, rc,
                 r, c, pl, nch);
      if (n >= V) {
        for (ptrdiff_t x = 0; x < n; x = next_x(x, n)) {
          __m256 acc = _mm256_mul_ps(kv[0], _mm256_loadu_ps(p + x));
#pragma GCC unroll 16
          for (ptrdiff_t j = 1; j <= r; j++) {
            __m256 pair = _mm256_add_ps(_mm256_loadu_ps(p + x - j * c),
                                        _mm256_loadu_ps(p + x + j * c));
            acc = _mm256_fmadd_ps(kv[j], pair, acc);
          }
          _mm256_storeu_ps(t + x, acc);
        }
      } else {
        for (ptrdiff_t x = 0; x < n; x++) {
          float acc = k[0] * p[x];
          for (ptrdiff_t j = 1; j <= r; j++)
            acc = __builtin_fmaf(k[j], p[x - j * c] + p[x + j * c], acc);
          t[x] = acc;
        }
      }
    }
    /* Output rows in pairs (y - 1, y) once row y + r is ready; a last
     * unpaired row alone. */
    int y = yy - r, pair = y >= 1 && (y & 1);
    int single = y == h - 1 && !(y & 1);
    if (!pair && !single)
      continue;
    int y0 = pair ? y - 1 : y;
    const float *rows[32];
    for (int i = -r; i <= r + 1; i++) {
      int t = y0 + i;
      t = t < 0 ? -t : t >= h ? 2 * h - 2 - t : t;
      rows[i + r] = jb->tmp + (size_t)t * n;
    }
    if (!pair) /* unused, but loaded: keep it a valid row */
      rows[2 * r + 1] = rows[2 * r];
    uint8_t *o0 = jb->dst + (size_t)y0 * n;
    if (n >= V) {
      for (ptrdiff_t x = 0; x < n; x = next_x(x, n)) {
        __m256 v[32];
#pragma GCC unroll 16
        for (int i = 0; i <= 2 * r + 1; i++)
          v[i] = _mm256_loadu_ps(rows[i] + x);
        __m256 a0 = _mm256_mul_ps(kv[0], v[r]);
#pragma GCC unroll 16
        for (int j = 1; j <= r; j++)
          a0 = _mm256_fmadd_ps(kv[j], _mm256_add_ps(v[r - j], v[r + j]), a0);
        store8(o0 + x, a0);
        if (pair) {
          __m256 a1 = _mm256_mul_ps(kv[0], v[r + 1]);
#pragma GCC unroll 16
          for (int j = 1; j <= r; j++)
            a1 = _mm256_fmadd_ps(kv[j],
                                 _mm256_add_ps(v[r + 1 - j], v[r + 1 + j]),
                                 a1);
          store8(o0 + n + x, a1);
        }
      }
    } else {
      for (int q = 0; q <= pair; q++)
        for (ptrdiff_t x = 0; x < n; x++) {
          float acc = k[0] * rows[r + q][x];
          for (int j = 1; j <= r; j++)
            acc = __builtin_fmaf(k[j], rows[r + q - j][x] + rows[r + q + j][x],
                                 acc);
          o0[q * n + x] = to_u8(acc);
        }
    }
  }
}

/* AVX2 path of ferry_blur_apply; radius 5 (blur 11) and 2 get copies with
 * the radius known at compile time so the tap loops unroll. */
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
