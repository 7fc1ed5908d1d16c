/* Random augmentations of uint8 NHWC batches: horizontal flip, rotation,
 * zoom and rescale, fused with the conversion to the trainer's dtype and
 * layout. The semantics are Keras 2.x's preprocessing layers
 * (RandomFlip, RandomRotation, RandomZoom, Rescaling) as ../shared/OPS.md
 * states them; docs/ARCHITECTURE.md lists where Ferry departs.
 *
 * One per-pixel routine (client/src/augment.h) is compiled twice: by the
 * C compiler for the CPU twin (ferry_augment_batch_cpu) and by nvcc for
 * the CUDA kernel (ferry_augment_batch_cuda). Both use the same float
 * operations in the same order without contraction, so their outputs are
 * bitwise equal.
 *
 *   ferry_augment_spec_t s;
 *   if (ferry_augment_spec_parse(
 *           "flip(horizontal) | rotate(0.1) | zoom(0.1) | rescale(1/255)",
 *           &s, &err) != 0) ...
 *   ferry_augment_batch_cpu(&s, seed, epoch, batch_index, images, n, h, w,
 *                           c, out, FERRY_DTYPE_FLOAT32, FERRY_LAYOUT_NCHW,
 *                           &err);
 *   ferry_augment_spec_close(&s);
 *
 * Randomness: each image's parameters are a pure function of (seed, epoch,
 * batch index, image index in the batch), so a run reproduces exactly and
 * the CPU and the GPU draw the same parameters.
 */
#ifndef FERRY_AUGMENT_H
#define FERRY_AUGMENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ferry/error.h"
#include "ferry/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Output element types. float16 and bfloat16 are rounded to nearest even
 * from the float32 result. */
typedef enum {
  FERRY_DTYPE_FLOAT32 = 0,
  FERRY_DTYPE_FLOAT16 = 1,
  FERRY_DTYPE_BFLOAT16 = 2
} ferry_dtype_t;

/* Output layouts. Inputs are always NHWC uint8. */
typedef enum { FERRY_LAYOUT_NHWC = 0, FERRY_LAYOUT_NCHW = 1 } ferry_layout_t;

typedef enum { FERRY_FLIP_NONE = 0, FERRY_FLIP_HORIZONTAL = 1 } ferry_flip_t;

/* A parsed augmentation spec. Plain data: callers may also fill it by hand
 * (after ferry_augment_spec_init). Factors are in [0, 1); 0 turns the op
 * off. */
typedef struct ferry_augment_spec_s {
  ferry_flip_t flip;
  float rotate;  /* angle ~ U(-rotate * 2 pi, +rotate * 2 pi) */
  float zoom;    /* z ~ U(1 - zoom, 1 + zoom), both axes; z > 1 zooms out */
  bool rescale;  /* multiply by `scale` at the end */
  float scale;   /* float32(a / b) for rescale(a/b) */
  /* Resample rotation and zoom separately, as Keras does (two bilinear
   * passes through a float intermediate). The default composes them into
   * one affine map and resamples once: faster and with one interpolation
   * loss fewer, a deliberate difference from Keras. */
  bool exact;
} ferry_augment_spec_t;

/* One image's drawn parameters. */
typedef struct ferry_augment_params_s {
  bool flip;   /* mirror x -> W-1-x before the other ops */
  float angle; /* radians, counter-clockwise positive; 0 without rotate */
  float zoom;  /* 1 without zoom */
} ferry_augment_params_t;

/* The identity spec (no op, scale 1, fused mode). */
FERRY_API void ferry_augment_spec_init(ferry_augment_spec_t *spec);

/* Parses the text form: ops separated by '|', each at most once and in
 * this order (Keras applies its layers in model order; Ferry's is fixed):
 *   flip(horizontal) or flip(none)
 *   rotate(F)   F in [0, 1)
 *   zoom(F)     F in [0, 1)
 *   rescale(A/B) or rescale(X)   A, B, X decimal numbers, finite, B != 0
 *   exact       (anywhere; also "exact()") two resamplings, as Keras
 * An empty text (or only blanks) is the identity: dtype/layout conversion
 * only. Returns 0, or FERRY_ESPEC with `err` giving the column and what
 * was expected. `spec` is caller-owned; it is set to the identity on
 * error. Thread-safe. */
FERRY_API int ferry_augment_spec_parse(const char *text,
                                       ferry_augment_spec_t *spec,
                                       ferry_error_t *err);

/* Writes the canonical text of `spec` (the form the parser reads back to
 * the same spec, with rescale as a decimal of float precision) into buf,
 * NUL-terminated and truncated to cap bytes. Returns the full length. */
FERRY_API size_t ferry_augment_spec_format(const ferry_augment_spec_t *spec,
                                           char *buf, size_t cap);

/* Releases what the spec holds (today nothing: kept for the init/close
 * pairing so that later fields may own memory). NULL is fine. */
FERRY_API void ferry_augment_spec_close(ferry_augment_spec_t *spec);

/* The parameters of image `image` of batch `batch` of `epoch`: the same
 * values the CPU twin and the CUDA kernel use. Ops the spec turns off get
 * their identity (flip false, angle 0, zoom 1). */
FERRY_API void ferry_augment_params(const ferry_augment_spec_t *spec,
                                    uint64_t seed, uint64_t epoch,
                                    uint64_t batch, uint64_t image,
                                    ferry_augment_params_t *out);

/* Size of the output of an n x h x w x c batch in `dtype`, in bytes (0 on
 * overflow or an unknown dtype). */
FERRY_API size_t ferry_augment_out_bytes(size_t n, uint32_t h, uint32_t w,
                                         uint32_t c, ferry_dtype_t dtype);

/* The CPU twin: augments n images (uint8, NHWC, contiguous) into `out`
 * (ferry_augment_out_bytes(...) bytes, `layout`, `dtype`). Image i uses
 * ferry_augment_params(spec, seed, epoch, batch_index, i). Allocates
 * nothing. Returns 0; FERRY_EINVAL for NULL buffers, zero or oversized
 * dimensions (h, w <= 32768, h*w*c < 2^31, c <= 64) or unknown
 * dtype/layout; FERRY_ETOOSMALL when rotate or zoom is on and the images
 * are 1 pixel wide or high (reflection needs two pixels). Thread-safe for
 * distinct outputs. */
FERRY_API int
ferry_augment_batch_cpu(const ferry_augment_spec_t *spec, uint64_t seed,
                        uint64_t epoch, uint64_t batch_index, const uint8_t *in,
                        size_t n, uint32_t h, uint32_t w, uint32_t c, void *out,
                        ferry_dtype_t dtype, ferry_layout_t layout,
                        ferry_error_t *err);

/* The CUDA kernel: the same as ferry_augment_batch_cpu, with `d_in` and
 * `d_out` in device memory, enqueued on `stream` (a cudaStream_t; NULL is
 * the default stream). Returns once the kernel is enqueued: wait on the
 * stream before reading d_out. Allocates nothing. Returns the CPU twin's
 * argument errors, FERRY_EIO with CUDA's message when the launch fails,
 * or FERRY_ENOTSUP in builds without CUDA. */
FERRY_API int ferry_augment_batch_cuda(
    const ferry_augment_spec_t *spec, uint64_t seed, uint64_t epoch,
    uint64_t batch_index, const uint8_t *d_in, size_t n, uint32_t h, uint32_t w,
    uint32_t c, void *d_out, ferry_dtype_t dtype, ferry_layout_t layout,
    void *stream, ferry_error_t *err);

/* Whether a CUDA device can be used: returns the device count (> 0), or
 * FERRY_ENOTSUP with `err` saying why not (a build without CUDA, no
 * device, or CUDA's own message, e.g. a driver older than the runtime).
 * Any CUDA error counts as "no device". */
FERRY_API int ferry_cuda_available(ferry_error_t *err);

#ifdef __cplusplus
}
#endif

#endif /* FERRY_AUGMENT_H */
