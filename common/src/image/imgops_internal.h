/* Internal interface between the portable image-op files and their SIMD
 * variants (*_avx2.c, *_avx512.c), plus test-only hooks. Not installed. */
#ifndef FERRY_IMGOPS_INTERNAL_H
#define FERRY_IMGOPS_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "crop.h"
#include "ferry/error.h"
#include "imgops.h"

enum {
  FERRY__ISA_SCALAR = 0,
  FERRY__ISA_AVX2 = 1,
  FERRY__ISA_AVX512 = 2
};

/* The SIMD level the ops use now (detected once, or forced by
 * ferry__imgops_set_isa). */
int ferry__imgops_level(void);

/* dilate 3x3 paths; same contract as ferry__dilate3x3. */
void ferry__dilate3x3_scalar(const uint8_t *src, uint8_t *dst, int h, int w,
                             int c);
void ferry__dilate3x3_avx2(const uint8_t *src, uint8_t *dst, int h, int w,
                           int c);

/* One separable blur of a validated image (h, w > r, c >= 1), vertical
 * pass first. `k` holds the centre tap then the taps at distance 1..r.
 * Each source row is converted to float once into `ring`, 2r + 4 rows of
 * `rstride` floats (a path using m of them keeps row t in slot t % m);
 * the rows a block of output rows needs, reflected ones included, lie in
 * a window of consecutive source rows. The vertical sums of an output row
 * go to one of the 8 padded rows of `hrow` (`hstride` floats each,
 * interior at `hoff`, a multiple of 16 not below r * c), get their
 * reflected borders there, and the horizontal pass reads them back and
 * packs to uint8. Buffers are 64-byte aligned with slack: vector code may
 * read and write whole vectors past a row's end (rstride and hstride -
 * 2 * hoff are at least w * c rounded up to 16, plus 16), and only finite
 * values are ever found there. */
#define FERRY__BLUR_SLACK 64

/* One vector's worth of reflected border, made from two aligned vectors
 * of a padded row: lane i of the padded row at `dst` (relative to the
 * interior start, a multiple of the vector width V) takes the float at
 * src + idx[i] (src a multiple of V, idx in 0..2V-1), where bit i of
 * `keep` is set. Built in blur.c for V = 8 or 16. */
#define FERRY__BLUR_MAX_PADS 16
typedef struct ferry__blur_pad_s {
  int32_t idx[16];
  int dst, src;
  uint32_t keep;
} ferry__blur_pad_t;

typedef struct ferry__blur_job_s {
  const float *k;
  int r;
  const uint8_t *src;
  uint8_t *dst;
  int h, w, c;
  float *ring;
  size_t rstride;
  float *hrow;
  size_t hstride, hoff;
  /* The border plan for this shape and vector width, or npads < 0 when
   * a chunk's sources span more than two vectors: borders in scalar. */
  const ferry__blur_pad_t *pads;
  int npads;
} ferry__blur_job_t;

void ferry__blur_scalar(const ferry__blur_job_t *job);
void ferry__blur_avx2(const ferry__blur_job_t *job);
void ferry__blur_avx512(const ferry__blur_job_t *job);

/* One resampling (crop.c) after its taps are planned: `src` points at
 * column xlo of the source's first row; the vertical taps of output row
 * oy are rows ystart[oy].. (ycount, weights wy + oy * ystride), the
 * horizontal ones of column ox are source columns xstart[ox].. (absolute,
 * xcount >= 1, weights wx + ox * xstride; a zero pixel has one tap of
 * weight 0). `row` holds ncols floats (16-byte aligned: with in_c = 4 it
 * is read as vectors of 4), `row4` (in_c = 3) ncols / 3 vectors of 4
 * (the row's pixels padded to 4 lanes). The two paths give the same
 * bits. */
typedef float ferry__v4f __attribute__((vector_size(16)));
typedef struct ferry__rs_job_s {
  const uint8_t *src;
  size_t stride;
  int in_c, out_c; /* out_c <= in_c: extra input channels are dropped */
  uint8_t *dst;
  int dh, dw;
  float *row;
  ferry__v4f *row4;
  size_t ncols;
  int xlo;
  const int *ystart, *ycount;
  const float *wy;
  int ystride;
  const int *xstart, *xcount;
  const float *wx;
  int xstride;
  int xtaps; /* every xcount[ox] is this */
  /* With out_c 3 and in_c >= 3: columns 2p and 2p + 1's weights side by
   * side, 8 floats a tap (4 copies of 2p's, then of 2p + 1's), xtaps of
   * them a pair, for p < dw / 2 (32-byte aligned). */
  const float *wx8;
} ferry__rs_job_t;

void ferry__resample_rows_scalar(const ferry__rs_job_t *job);
void ferry__resample_rows_avx2(const ferry__rs_job_t *job);

/* ferry__resample with in_c source channels of which the first out_c are
 * kept (in_c 4, out_c 3: RGBX from libjpeg to RGB). */
int ferry__resample_x(ferry_resampler_t *r, const uint8_t *src, int sh,
                      int sw, size_t stride, int in_c, int out_c,
                      const ferry_window_t *win, uint8_t *dst, int dh,
                      int dw, ferry_error_t *err);

/* Test hook: ferry__jpeg_decode with `accurate` != 0 selecting the slow
 * integer DCT (JDCT_ISLOW) instead of TensorFlow's IFAST, so tests can
 * compare pixels with hashes made by other libjpeg-turbo programs. */
int ferry__jpeg_decode_dct(ferry_jpeg_t *j, const uint8_t *src,
                           size_t len, uint8_t *dst, size_t cap, int *h,
                           int *w, int accurate, ferry_error_t *err);

#endif /* FERRY_IMGOPS_INTERNAL_H */
