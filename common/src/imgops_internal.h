/* Internal interface between the portable image-op files and their SIMD
 * variants (*_avx2.c, *_avx512.c), plus test-only hooks. Not installed. */
#ifndef FERRY_IMGOPS_INTERNAL_H
#define FERRY_IMGOPS_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "ferry/error.h"
#include "ferry/imgops.h"

enum {
  FERRY__ISA_SCALAR = 0,
  FERRY__ISA_AVX2 = 1,
  FERRY__ISA_AVX512 = 2
};

/* The SIMD level the ops use now (detected once, or forced by
 * ferry_imgops_set_isa). */
int ferry__imgops_level(void);

/* dilate 3x3 paths; same contract as ferry_dilate3x3. */
void ferry__dilate3x3_scalar(const uint8_t *src, uint8_t *dst, int h, int w,
                             int c);
void ferry__dilate3x3_avx2(const uint8_t *src, uint8_t *dst, int h, int w,
                           int c);

/* One separable blur of a validated image (h, w > r, c >= 1). `k` holds the
 * centre tap then the taps at distance 1..r. `row` holds two padded rows
 * of `rstride` floats each (at least (w + 2r) * c + FERRY__BLUR_SLACK, a
 * multiple of 16) and `tmp` h * w * c + FERRY__BLUR_SLACK floats, both
 * 64-byte aligned; the slack lets vector code read past a row's end
 * without leaving the allocation. Two padded rows let the next row be
 * converted while the current one is filtered: loads then never wait on
 * the stores just made (a store-forwarding stall on misaligned loads). */
#define FERRY__BLUR_SLACK 64
typedef struct ferry__blur_job_s {
  const float *k;
  int r;
  const uint8_t *src;
  uint8_t *dst;
  int h, w, c;
  float *row;
  size_t rstride;
  float *tmp;
} ferry__blur_job_t;

void ferry__blur_scalar(const ferry__blur_job_t *job);
void ferry__blur_avx2(const ferry__blur_job_t *job);
void ferry__blur_avx512(const ferry__blur_job_t *job);

/* Test hook: ferry_jpeg_decode with `accurate` != 0 selecting the slow
 * integer DCT (JDCT_ISLOW) instead of TensorFlow's IFAST, so tests can
 * compare pixels with hashes made by other libjpeg-turbo programs. */
int ferry__jpeg_decode_dct(ferry_jpeg_t *j, const uint8_t *src,
                           size_t len, uint8_t *dst, size_t cap, int *h,
                           int *w, int accurate, ferry_error_t *err);

#endif /* FERRY_IMGOPS_INTERNAL_H */
