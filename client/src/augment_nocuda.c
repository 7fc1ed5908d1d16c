/* The CUDA launcher's API in builds without CUDA (CMake picks this file
 * or augment_cuda.cu): every call says the build has no CUDA. Callers
 * fall back to the CPU twin. */
#include "ferry/augment.h"

int ferry_augment_batch_cuda(const ferry_augment_spec_t *spec, uint64_t seed,
                             uint64_t epoch, uint64_t batch_index,
                             const uint8_t *d_in, size_t n, uint32_t h,
                             uint32_t w, uint32_t c, void *d_out,
                             ferry_dtype_t dtype, ferry_layout_t layout,
                             void *stream, ferry_error_t *err) {
  return ferry__seterr(err, FERRY_ENOTSUP,
                       "augment: this libferry was built without CUDA");
}

int ferry_cuda_available(ferry_error_t *err) {
  return ferry__seterr(err, FERRY_ENOTSUP,
                       "no CUDA device: this libferry was built without "
                       "CUDA");
}
