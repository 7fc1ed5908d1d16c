/* Image ops on uint8 HWC images, with TensorFlow's exact semantics
 * (../shared/OPS.md, docs/ARCHITECTURE.md). Each vectorised op has a
 * portable scalar path and AVX2 / AVX-512 paths chosen at run time from
 * the CPU's features; all paths give the same result (bitwise for dilate,
 * within +-1 on uint8 for blur against the direct 2-D reference).
 */
#ifndef FERRY_IMGOPS_H
#define FERRY_IMGOPS_H

#include <stddef.h>
#include <stdint.h>

#include "ferry/error.h"

/* tf.io.decode_raw: `len` must equal h*w*c, else FERRY_EIMGSIZE with the
 * expected and actual sizes. Copies into `dst`. */
int ferry__decode_raw(const uint8_t *src, size_t len, int h, int w, int c,
                      uint8_t *dst, ferry_error_t *err);

/* JPEG decoding with TurboJPEG, as tf.io.decode_jpeg does by default: fast
 * integer DCT, fancy upsampling, RGB output. One decoder per thread. */
typedef struct ferry_jpeg_s ferry_jpeg_t;
int ferry__jpeg_new(ferry_jpeg_t **out, ferry_error_t *err);
void ferry__jpeg_free(ferry_jpeg_t *j);

/* What one image may cost, checked from its markers before anything is
 * allocated or decoded (every decode path, ferry__jpeg_header included).
 * An image over a limit fails with FERRY_EJPEG naming the limit, so it
 * is a bad record like any other (on_error). 0: no limit. */
typedef struct ferry_jpeg_limits_s {
  uint64_t max_pixels; /* width x height (--jpeg-max-pixels) */
  uint32_t max_scans;  /* SOS markers: each progressive scan passes over
                          the whole image (--jpeg-max-scans) */
  uint64_t max_bytes;  /* the decode's memory: the pixels at 4 bytes each
                          (7 for CMYK), plus libjpeg's whole-image
                          coefficient buffer (2 bytes a coefficient) for a
                          progressive or multi-scan file (--decode-bytes
                          per pipeline thread) */
} ferry_jpeg_limits_t;

/* The defaults of a new decoder: 64 Mi pixels, 100 scans, no byte
 * limit (the worker sets one from --decode-bytes). */
#define FERRY_JPEG_MAX_PIXELS (64u << 20)
#define FERRY_JPEG_MAX_SCANS 100u
void ferry__jpeg_set_limits(ferry_jpeg_t *j, const ferry_jpeg_limits_t *l);

/* Frees the decoder's scratch buffers over `keep` bytes (a thread that
 * decoded one big image does not keep its memory). */
void ferry__jpeg_trim(ferry_jpeg_t *j, size_t keep);

/* Reads the image size without decoding. FERRY_EJPEG when not a JPEG;
 * on any failure *h and *w are 0. */
int ferry__jpeg_header(ferry_jpeg_t *j, const uint8_t *src, size_t len, int *h,
                       int *w, ferry_error_t *err);

/* Decodes into `dst` (capacity `cap` bytes, at least h*w*3) and sets *h,
 * *w. Returns 0, FERRY_EJPEG (corrupt), FERRY_EJPEGTRUNC (data ends early)
 * or FERRY_ERANGE (dst too small). */
int ferry__jpeg_decode(ferry_jpeg_t *j, const uint8_t *src, size_t len,
                       uint8_t *dst, size_t cap, int *h, int *w,
                       ferry_error_t *err);

/* dilate(3): tf.nn.dilation2d with a zero 3x3xC filter, SAME, stride 1:
 * the max over the in-image 3x3 neighbourhood, per channel. `dst` must
 * not alias `src`. */
void ferry__dilate3x3(const uint8_t *src, uint8_t *dst, int h, int w, int c);

/* Gaussian blur (tfa.image.gaussian_filter2d): separable float32 kernel of
 * odd `size` and `sigma`, REFLECT padding without the edge, truncated back
 * to uint8. A blur object holds the kernel and its scratch rows; one per
 * thread. */
typedef struct ferry_blur_s ferry_blur_t;
int ferry__blur_new(int size, float sigma, ferry_blur_t **out,
                    ferry_error_t *err);
void ferry__blur_free(ferry_blur_t *b);

/* Blurs src into dst (no aliasing). FERRY_ETOOSMALL when h or w is not
 * larger than size/2 (REFLECT needs it), naming the size. */
int ferry__blur_apply(ferry_blur_t *b, const uint8_t *src, uint8_t *dst, int h,
                      int w, int c, ferry_error_t *err);

/* The normalised 1-D kernel of `size` taps (size <= 31) as float32. */
void ferry__blur_kernel(int size, float sigma, float *out);

/* A direct 2-D float reference (size*size taps per pixel), slow: the
 * baseline for tests and benchmarks. */
int ferry__blur_reference(int size, float sigma, const uint8_t *src,
                          uint8_t *dst, int h, int w, int c);

/* A plain scalar dilate, the baseline for tests and benchmarks. */
void ferry__dilate3x3_reference(const uint8_t *src, uint8_t *dst, int h, int w,
                                int c);

/* resize(H, W): tf.image.resize bilinear, half-pixel centres, antialias
 * off, rounded back to uint8. */
void ferry__resize_bilinear(const uint8_t *src, int sh, int sw, int c,
                            uint8_t *dst, int dh, int dw);

/* SIMD level in use: "avx512", "avx2" or "scalar". ferry__imgops_set_isa
 * forces a lower level (tests and benchmarks); returns FERRY_ENOTSUP when
 * the CPU lacks it. Not thread-safe: call before ops run. */
const char *ferry__imgops_isa(void);
int ferry__imgops_set_isa(const char *name);

#endif /* FERRY_IMGOPS_H */
