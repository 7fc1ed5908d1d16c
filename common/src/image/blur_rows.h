/* The SIMD separable blur (blur.c has the plan, imgops_internal.h the
 * job), compiled twice: into blur_avx2.c (8 floats per vector) and into
 * blur_avx512.c (16). Not compiled on its own. Both paths form every sum
 * in the same order with the same roundings, so they give the same bits
 * (not the scalar path's: the taps are factored differently below).
 *
 * Output rows go in blocks of NR: one vertical loop makes the block's
 * sums from 2r + NR ring rows, each loaded once (loads bound this loop),
 * into NR padded rows whose borders come from permutes of two aligned
 * vectors. The horizontal pass of a block runs after the vertical pass
 * of the next one (2 NR padded rows), so its misaligned loads read stores
 * that have left the store buffer.
 *
 * The including file defines, before the #include:
 *   BLUR_ENTRY            the path's function, e.g. ferry__blur_avx2
 *   V                     floats per vector
 *   bvec                  the vector type of V floats
 *   BV_PS(op)             the intrinsic _mm<bits>_<op>_ps for bvec (the
 *                         template's bv_load, bv_add, ... below)
 *   bv_cvt_u8(s)          the V bytes at s as floats
 *   conv_tail(d, s, x, n) the floats of bytes s[x .. n) (0 < n - x < V)
 *                         into d[x .. n); it may also write finite
 *                         values to d[n ..] up to the vector's end, or
 *                         rewrite d[.. x) with the same values
 *   store_u8(o, left, a)  truncates the V sums of a to bytes (the sums
 *                         are never negative nor NaN) clamped at 255 and
 *                         stores the first min(left, V) of them at o
 *   BLUR_NEXT_X(x, n)     the start of the horizontal pass's vector after
 *                         the one at x: x + V when store_u8 handles a
 *                         partial tail; else a last vector that overlaps
 *                         the one before (n - V; outputs never alias
 *                         inputs, so recomputed values are identical)
 *   BLUR_MIN_N            rows of fewer floats (w * c) take the scalar
 *                         path; 0 when conv_tail and store_u8 handle any
 *                         tail
 *   pad_chunk(p, pl)      one chunk of reflected border (pl, a
 *                         ferry__blur_pad_t) of the padded row p
 * and, where lane shifts pay (blur_avx512.c), optionally
 *   BLUR_SHL(cv, lv, s), BLUR_SHR(rv, cv, s)
 *                         elements x - s and x + s (0 < s < V) of the
 *                         window of aligned vectors (lv, cv, rv) centred
 *                         on cv, the vector at x; macros, s a literal
 * with which blur 11 on one or three channels takes its three outer tap
 * pairs from lane shifts instead of misaligned loads (horiz5). */
#ifndef BLUR_ENTRY
#error "blur_rows.h is included by blur_avx2.c and blur_avx512.c only"
#endif

#include <stddef.h>
#include <stdint.h>

#include "imgops_internal.h"

#define NR 4

/* Aligned load, misaligned load, aligned store, broadcast, a + b, a * b
 * and fused a * b + c. */
static inline bvec bv_load(const float *p) { return BV_PS(load)(p); }
static inline bvec bv_loadu(const float *p) { return BV_PS(loadu)(p); }
static inline void bv_store(float *p, bvec a) { BV_PS(store)(p, a); }
static inline bvec bv_set1(float f) { return BV_PS(set1)(f); }
static inline bvec bv_add(bvec a, bvec b) { return BV_PS(add)(a, b); }
static inline bvec bv_mul(bvec a, bvec b) { return BV_PS(mul)(a, b); }
static inline bvec bv_fmadd(bvec a, bvec b, bvec c) {
  return BV_PS(fmadd)(a, b, c);
}

/* Converts a source row to floats (n >= BLUR_MIN_N). */
static inline void conv_row(float *d, const uint8_t *s, ptrdiff_t n) {
  ptrdiff_t x = 0;
  for (; x + V <= n; x += V)
    bv_store(d + x, bv_cvt_u8(s + x));
  if (x < n)
    conv_tail(d, s, x, n);
}

/* GCC cannot see that the runtime-radius copy of vert() sets every v[i]
 * it reads (the first 2r + NR). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

/* Vertical sums over k[0] of NR consecutive output rows, row q centred on
 * rows[r + q] and stored at p[q], each ring row loaded once. */
static inline __attribute__((always_inline)) void
vert(float *const *p, const float *const *rows, ptrdiff_t n,
     const bvec *kv, const int r) {
  for (ptrdiff_t x = 0; x < n; x += V) {
    bvec v[2 * 15 + NR];
#pragma GCC unroll 40
    for (int i = 0; i < 2 * r + NR; i++) {
      bvec t = bv_load(rows[i] + x);
      /* Keeps each row in a register: folded into several rows' adds,
       * GCC would load it again each time, and loads are the
       * bottleneck. */
      __asm__("" : "+v"(t));
      v[i] = t;
    }
#pragma GCC unroll 4
    for (int q = 0; q < NR; q++) {
      bvec a = v[r + q];
#pragma GCC unroll 16
      for (int j = 1; j <= r; j++)
        a = bv_fmadd(kv[j], bv_add(v[r + q - j], v[r + q + j]), a);
      bv_store(p[q] + x, a);
    }
  }
}

/* Reflected borders of the padded row `p` (interior start). */
static inline void pad_row(float *p, ptrdiff_t n, int r, int c,
                           const ferry__blur_pad_t *pl, int np) {
  if (np >= 0) {
    for (int i = 0; i < np; i++)
      pad_chunk(p, &pl[i]);
    return;
  }
  for (ptrdiff_t j = 1; j <= r; j++)
    for (ptrdiff_t ch = 0; ch < c; ch++) {
      p[-j * c + ch] = p[j * c + ch];
      p[n - c + j * c + ch] = p[n - c - j * c + ch];
    }
}

/* Horizontal pass, any radius and channel count. */
static inline __attribute__((always_inline)) void
horiz(uint8_t *o, const float *p, ptrdiff_t n, ptrdiff_t c,
      const bvec *kv, const int r) {
  for (ptrdiff_t x = 0; x < n; x = BLUR_NEXT_X(x, n)) {
    bvec acc = bv_mul(kv[0], bv_loadu(p + x));
#pragma GCC unroll 16
    for (ptrdiff_t j = 1; j <= r; j++)
      acc = bv_fmadd(kv[j],
                     bv_add(bv_loadu(p + x - j * c), bv_loadu(p + x + j * c)),
                     acc);
    store_u8(o + x, n - x, acc);
  }
}

#ifdef BLUR_SHL
#define TAP_SHIFT(j, s)                                                      \
  acc = bv_fmadd(kv[j], bv_add(BLUR_SHL(cv, lv, s), BLUR_SHR(rv, cv, s)), acc)
#define TAP_LOAD(j, s)                                                       \
  acc = bv_fmadd(kv[j], bv_add(bv_loadu(p + x - (s)), bv_loadu(p + x + (s))), \
                 acc)

/* Horizontal pass of radius 5 and c = 1 or 3 (r * c < V: the window of
 * three aligned vectors holds every tap). The three outer tap pairs are
 * lane shifts of the aligned vectors around the output instead of
 * misaligned loads, balancing the load ports against the shuffle units
 * (all loads or all shifts are both ~40% slower with AVX-512 on Zen 4;
 * with AVX2 the shifts measured slower). */
static inline __attribute__((always_inline)) void
horiz5(uint8_t *o, const float *p, ptrdiff_t n, const bvec *kv,
       const int c) {
  bvec lv = bv_load(p - V), cv = bv_load(p);
  for (ptrdiff_t x = 0; x < n; x += V) {
    bvec rv = bv_load(p + x + V);
    bvec acc = bv_mul(kv[0], cv);
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
    store_u8(o + x, n - x, acc);
    lv = cv;
    cv = rv;
  }
}
#endif

/* `cc` is the channel count when known at compile time (1 or 3 with
 * radius 5, for horiz5), else 0. */
static inline __attribute__((always_inline)) void
run(const ferry__blur_job_t *jb, const int r, const int cc) {
  const int h = jb->h, c = cc ? cc : jb->c, nring = 2 * r + NR;
  const ptrdiff_t n = (ptrdiff_t)jb->w * c;
  float *hb[2 * NR];
  bvec kv[16], kh[16];
  int next = 0;

  if (r < 0 || r > 15)
    __builtin_unreachable();
  for (int i = 0; i < 2 * NR; i++)
    hb[i] = jb->hrow + i * jb->hstride + jb->hoff;
  if (BLUR_MIN_N > 0 && n < BLUR_MIN_N) {
    ferry__blur_scalar(jb);
    return;
  }
  for (int j = 0; j <= r; j++) {
    /* The vertical pass leaves out the centre tap's factor (kv[j] =
     * k[j] / k[0], the centre taken as is, one multiply less) and the
     * horizontal pass puts it back (kh[j] = k[j] * k[0]). */
    kv[j] = bv_set1(jb->k[j] / jb->k[0]);
    kh[j] = bv_set1(jb->k[j] * jb->k[0]);
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
#ifdef BLUR_SHL
        if (cc) {
          horiz5(o, pp, n, kh, cc);
          continue;
        }
#endif
        horiz(o, pp, n, c, kh, r);
      }
    }
  }
}

/* The path's entry for ferry__blur_apply; radius 5 (blur 11) and 2 get
 * copies with the radius known at compile time so the tap loops unroll,
 * and with lane shifts radius 5 on one or three channels one each with
 * the channel count known too. */
void BLUR_ENTRY(const ferry__blur_job_t *jb) {
  switch (jb->r) {
  case 5:
#ifdef BLUR_SHL
    if (jb->c == 3) {
      run(jb, 5, 3);
      break;
    }
    if (jb->c == 1) {
      run(jb, 5, 1);
      break;
    }
#endif
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
