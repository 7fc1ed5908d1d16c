/* The augmentation kernel and its launcher. The arithmetic is augment.h's,
 * shared with the CPU twin; this file only spreads it over the GPU: one
 * thread per output pixel at a time (all its channels), blocks of 256
 * threads covering up to 4 x 256 pixels of one image, the grid's y
 * dimension over the batch's images. Thread 0 of each block derives its
 * image's parameters into shared memory (a hundred-odd operations, which
 * the 1024 pixels amortise; cheaper than a parameter buffer and its copy
 * per batch).
 * Built with --fmad=false: see augment.h.
 */
#include <cuda_runtime.h>

#include "augment.h"

#define BLOCK 256
#define PIXELS_PER_THREAD 4
#define MAX_GRID_Y 65535

__global__ void augment_kernel(ferry_augment_spec_t spec, uint64_t seed,
                               uint64_t epoch, uint64_t batch,
                               const uint8_t *in, int n, int h, int w, int c,
                               void *out, int dtype, int nchw) {
  __shared__ ferry__aug_img_t img;
  int hw = h * w;
  for (int i = blockIdx.y; i < n; i += gridDim.y) {
    const uint8_t *src = in + (size_t)i * (size_t)hw * (size_t)c;
    if (threadIdx.x == 0) {
      ferry_augment_params_t prm;
      ferry__aug_params(&spec, seed, epoch, batch, (uint64_t)i, &prm);
      ferry__aug_setup(&spec, &prm, w, h, &img);
    }
    __syncthreads();
    for (int pix = blockIdx.x * blockDim.x + threadIdx.x; pix < hw;
         pix += gridDim.x * blockDim.x) {
      int y = pix / w, x = pix - y * w;
      size_t first = (size_t)i * (size_t)hw * (size_t)c;
      if (nchw)
        ferry__aug_pixel(&img, src, w, h, c, x, y, out, first + pix,
                         (size_t)hw, dtype);
      else
        ferry__aug_pixel(&img, src, w, h, c, x, y, out,
                         first + (size_t)pix * c, 1, dtype);
    }
    /* img is rewritten for the next image only after every thread is
     * done with this one. */
    __syncthreads();
  }
}

extern "C" int ferry_augment_batch_cuda(
    const ferry_augment_spec_t *spec, uint64_t seed, uint64_t epoch,
    uint64_t batch_index, const uint8_t *d_in, size_t n, uint32_t h,
    uint32_t w, uint32_t c, void *d_out, ferry_dtype_t dtype,
    ferry_layout_t layout, void *stream, ferry_error_t *err) {
  int rc = ferry__augment_check(spec, d_in, n, h, w, c, d_out, dtype, layout,
                                "augment (cuda)", err);
  cudaError_t ce;
  if (rc != 0 || n == 0)
    return rc;
  unsigned hw = h * w, per_block = BLOCK * PIXELS_PER_THREAD;
  dim3 grid((hw + per_block - 1) / per_block,
            n < MAX_GRID_Y ? (unsigned)n : MAX_GRID_Y);
  augment_kernel<<<grid, BLOCK, 0, (cudaStream_t)stream>>>(
      *spec, seed, epoch, batch_index, d_in, (int)n, (int)h, (int)w, (int)c,
      d_out, (int)dtype, layout == FERRY_LAYOUT_NCHW);
  ce = cudaGetLastError();
  if (ce != cudaSuccess)
    return ferry__seterr(err, FERRY_EIO,
                         "augment (cuda): kernel launch failed: %s (%s)",
                         cudaGetErrorString(ce), cudaGetErrorName(ce));
  return 0;
}

extern "C" int ferry_cuda_available(ferry_error_t *err) {
  int count = 0;
  cudaError_t ce = cudaGetDeviceCount(&count);
  if (ce != cudaSuccess) {
    /* Clear the error so that it does not surface in a later call. */
    cudaGetLastError();
    return ferry__seterr(err, FERRY_ENOTSUP,
                         "no CUDA device: cudaGetDeviceCount: %s (%s)",
                         cudaGetErrorString(ce), cudaGetErrorName(ce));
  }
  if (count <= 0)
    return ferry__seterr(err, FERRY_ENOTSUP,
                         "no CUDA device: cudaGetDeviceCount found none");
  return count;
}
