/* AVX-512 separable blur (see blur.c for the plan). Sixteen floats per
 * vector with masked loads and stores for row tails. Each row's reflect
 * padding is made from the source bytes with two-source permutes, the
 * next row is prepared in the other padded-row buffer while the current
 * one is filtered, and the vertical pass makes two output rows at a time
 * so each tmp row loaded serves both. */
#include <immintrin.h>
#include <stddef.h>

#include "imgops_internal.h"

#define V 16
#define MAX_CHUNKS 8

typedef struct {
  int dst;   /* offset in the padded row */
  int src;   /* first source byte in the image row */
  int cnt;   /* floats written */
  __mmask32 load;
  __m512i idx;
} pad_chunk_t;

/* Plans the 2*r*c padding floats of a row: chunk i writes `cnt` floats at
 * `dst`, taken by index from the 32 source bytes at `src` (masked to the
 * row). Returns the number of chunks, or -1 when a chunk's sources span
 * 32 floats or more (many channels): then the caller pads in scalar. */
static int plan_pads(pad_chunk_t *pl, int r, int w, int c) {
  int rc = r * c, n = w * c, nch = 0;
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
      if (hi - lo >= 2 * V || nch == MAX_CHUNKS)
        return -1;
      int32_t ix[V] = {0};
      for (int i = 0; i < cnt; i++)
        ix[i] = src[i] - lo;
      pl[nch].dst = start + q;
      pl[nch].src = lo;
      pl[nch].cnt = cnt;
      pl[nch].load = n - lo >= 32 ? 0xFFFFFFFFu : (1u << (n - lo)) - 1;
      pl[nch].idx = _mm512_loadu_si512(ix);
      nch++;
    }
  }
  return nch;
}

static inline __mmask16 tail_mask(ptrdiff_t left) {
  return left >= V ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
}

static inline __m512 cvt16(__m128i b) {
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(b));
}

/* Converts image row `s` into the padded row `pr` (interior at rc). */
static inline void fill_row(float *pr, const uint8_t *s, ptrdiff_t n,
                            ptrdiff_t rc, int r, int c,
                            const pad_chunk_t *pl, int nch) {
  float *p = pr + rc;
  for (ptrdiff_t x = 0; x < n; x += V) {
    __mmask16 m = tail_mask(n - x);
    _mm512_mask_storeu_ps(p + x, m, cvt16(_mm_maskz_loadu_epi8(m, s + x)));
  }
  if (nch >= 0) {
    for (int i = 0; i < nch; i++) {
      __m256i b = _mm256_maskz_loadu_epi8(pl[i].load, s + pl[i].src);
      __m512 a = cvt16(_mm256_castsi256_si128(b));
      __m512 e = cvt16(_mm256_extracti128_si256(b, 1));
      _mm512_mask_storeu_ps(pr + pl[i].dst, tail_mask(pl[i].cnt),
                            _mm512_permutex2var_ps(a, pl[i].idx, e));
    }
  } else {
    for (ptrdiff_t j = 1; j <= r; j++)
      for (ptrdiff_t ch = 0; ch < c; ch++) {
        p[-j * c + ch] = s[j * c + ch];
        p[n - c + j * c + ch] = s[n - c - j * c + ch];
      }
  }
}

static inline __m512i to_u32(__m512 acc) {
  return _mm512_max_epi32(_mm512_cvttps_epi32(acc), _mm512_setzero_si512());
}

static inline __attribute__((always_inline)) void
run(const ferry__blur_job_t *jb, const int r) {
  const int h = jb->h, c = jb->c;
  const ptrdiff_t n = (ptrdiff_t)jb->w * c, rc = (ptrdiff_t)r * c;
  __m512 kv[16];
  pad_chunk_t pl[MAX_CHUNKS];
  int nch = plan_pads(pl, r, jb->w, c);
  float *prow[2] = {jb->row, jb->row + jb->rstride};

  if (r < 0 || r > 15)
    __builtin_unreachable();

  for (int j = 0; j <= r; j++)
    kv[j] = _mm512_set1_ps(jb->k[j]);
  fill_row(prow[0], jb->src, n, rc, r, c, pl, nch);
  for (int yy = 0; yy < h + r; yy++) {
    if (yy < h) {
      const float *p = prow[yy & 1] + rc;
      float *t = jb->tmp + (size_t)yy * n;
      if (yy + 1 < h)
        fill_row(prow[(yy + 1) & 1], jb->src + (size_t)(yy + 1) * n, n, rc,
                 r, c, pl, nch);
      for (ptrdiff_t x = 0; x < n; x += V) {
        __m512 acc = _mm512_mul_ps(kv[0], _mm512_loadu_ps(p + x));
#pragma GCC unroll 16
        for (ptrdiff_t j = 1; j <= r; j++) {
          __m512 pair = _mm512_add_ps(_mm512_loadu_ps(p + x - j * c),
                                      _mm512_loadu_ps(p + x + j * c));
          acc = _mm512_fmadd_ps(kv[j], pair, acc);
        }
        _mm512_mask_storeu_ps(t + x, tail_mask(n - x), acc);
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
    /* Loads past the row end stay inside tmp's slack and are unused. */
    for (ptrdiff_t x = 0; x < n; x += V) {
      __mmask16 m = tail_mask(n - x);
      __m512 v[32];
#pragma GCC unroll 16
      for (int i = 0; i <= 2 * r + 1; i++)
        v[i] = _mm512_loadu_ps(rows[i] + x);
      __m512 a0 = _mm512_mul_ps(kv[0], v[r]);
#pragma GCC unroll 16
      for (int j = 1; j <= r; j++)
        a0 = _mm512_fmadd_ps(kv[j], _mm512_add_ps(v[r - j], v[r + j]), a0);
      _mm_mask_storeu_epi8(o0 + x, m, _mm512_cvtusepi32_epi8(to_u32(a0)));
      if (pair) {
        __m512 a1 = _mm512_mul_ps(kv[0], v[r + 1]);
#pragma GCC unroll 16
        for (int j = 1; j <= r; j++)
          a1 = _mm512_fmadd_ps(kv[j], _mm512_add_ps(v[r + 1 - j],
                                                    v[r + 1 + j]), a1);
        _mm_mask_storeu_epi8(o0 + n + x, m,
                             _mm512_cvtusepi32_epi8(to_u32(a1)));
      }
    }
  }
}

/* AVX-512 path of ferry_blur_apply; radius 5 (blur 11) and 2 get copies
 * with the radius known at compile time so the tap loops unroll. */
void ferry__blur_avx512(const ferry__blur_job_t *jb) {
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
