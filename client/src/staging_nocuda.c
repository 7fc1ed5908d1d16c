/* The staging ring's device side in builds without CUDA (CMake picks this
 * file or staging_cuda.cu): nothing can be opened, so GPU staging is
 * refused by ferry__staging_check before any of these run; they answer
 * FERRY_ENOTSUP all the same. */
#include "ferry/error.h"
#include "staging.h"

int ferry__stg_pinned_alloc(size_t bytes, void **out, ferry_error_t *err) {
  *out = NULL;
  return ferry__seterr(err, FERRY_ENOTSUP,
                       "staging: this libferry was built without CUDA");
}

void ferry__stg_pinned_free(void *p) { (void)p; }

int ferry__stg_gpu_open(int device, uint32_t depth, size_t in_bytes,
                        size_t out_bytes, ferry__stg_gpu_t **out,
                        ferry_error_t *err) {
  *out = NULL;
  return ferry__seterr(err, FERRY_ENOTSUP,
                       "staging: this libferry was built without CUDA");
}

void *ferry__stg_gpu_out(const ferry__stg_gpu_t *g, uint32_t slot) {
  return NULL;
}

void *ferry__stg_gpu_ready(const ferry__stg_gpu_t *g, uint32_t slot) {
  return NULL;
}

int ferry__stg_gpu_submit(ferry__stg_gpu_t *g, uint32_t slot,
                          const uint8_t *host, size_t n, uint32_t h,
                          uint32_t w, uint32_t c,
                          const ferry_augment_spec_t *spec, uint64_t seed,
                          uint64_t epoch, uint64_t batch_index,
                          ferry_dtype_t dtype, ferry_layout_t layout,
                          ferry_error_t *err) {
  return ferry__seterr(err, FERRY_ENOTSUP,
                       "staging: this libferry was built without CUDA");
}

int ferry__stg_gpu_release(ferry__stg_gpu_t *g, uint32_t slot, bool ordered,
                           void *stream, ferry_error_t *err) {
  return 0;
}

int ferry__stg_gpu_wait(ferry__stg_gpu_t *g, uint32_t slot, void *stream,
                        ferry_error_t *err) {
  return ferry__seterr(err, FERRY_ENOTSUP,
                       "staging: this libferry was built without CUDA");
}

void ferry__stg_gpu_close(ferry__stg_gpu_t *g) { (void)g; }
