/* GPU benchmark of the node path's two device-side stages, each against
 * a baseline measured in the same run (docs/PERFORMANCE.md):
 *
 *  1. Host to device: a ring of pinned slots copied with cudaMemcpyAsync
 *     on a copy stream while the augmentation kernel runs on a compute
 *     stream (the staging pattern of the client: slot i's copy overlaps
 *     slot i-1's kernel), against back-to-back pinned cudaMemcpyAsync of
 *     the same bytes. Target: >= 90% of the plain copy's GB/s.
 *  2. The fused augmentation kernel on n x h x w x c batches (default
 *     256x224x224x3) for each dtype and layout, against a device-to-device
 *     cudaMemcpy of the same output bytes. Target: >= 50% of the copy's
 *     speed (exact mode is listed without a target).
 *
 * Usage: bench_augment_gpu [--quick] [--n N] [--h H] [--w W] [--c C]
 *                          [--iters K] [--device D]
 * Exits 77 without a usable device, 1 on a CUDA error, else 0 (a missed
 * target is reported, not an error: figures drift between machines).
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "augment.h"

#define SLOTS 3

#define CHECK_CUDA(call)                                                    \
  do {                                                                      \
    cudaError_t ce_ = (call);                                               \
    if (ce_ != cudaSuccess) {                                               \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,         \
              cudaGetErrorString(ce_));                                     \
      exit(1);                                                              \
    }                                                                       \
  } while (0)

#define CHECK_FERRY(call)                                                   \
  do {                                                                      \
    int rc_ = (call);                                                       \
    if (rc_ != 0) {                                                         \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,         \
              err.msg);                                                     \
      exit(1);                                                              \
    }                                                                       \
  } while (0)

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int passed, missed;

static const char *verdict(double value, double target) {
  if (target <= 0)
    return "";
  if (value >= target) {
    passed++;
    return "PASS";
  }
  missed++;
  return "MISS";
}

int main(int argc, char **argv) {
  size_t n = 256;
  uint32_t h = 224, w = 224, c = 3;
  int iters = 20, device = 0;
  ferry_error_t err = {0};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--quick") == 0) {
      n = 32;
      iters = 3;
    } else if (i + 1 < argc && strcmp(a, "--n") == 0) {
      n = strtoul(argv[++i], NULL, 10);
    } else if (i + 1 < argc && strcmp(a, "--h") == 0) {
      h = (uint32_t)strtoul(argv[++i], NULL, 10);
    } else if (i + 1 < argc && strcmp(a, "--w") == 0) {
      w = (uint32_t)strtoul(argv[++i], NULL, 10);
    } else if (i + 1 < argc && strcmp(a, "--c") == 0) {
      c = (uint32_t)strtoul(argv[++i], NULL, 10);
    } else if (i + 1 < argc && strcmp(a, "--iters") == 0) {
      iters = atoi(argv[++i]);
    } else if (i + 1 < argc && strcmp(a, "--device") == 0) {
      device = atoi(argv[++i]);
    } else {
      fprintf(stderr,
              "usage: %s [--quick] [--n N] [--h H] [--w W] [--c C] "
              "[--iters K] [--device D]\n",
              argv[0]);
      return 2;
    }
  }
  if (n == 0 || iters < 1) {
    fprintf(stderr, "bench_augment_gpu: --n and --iters must be positive\n");
    return 2;
  }
  int count = ferry_cuda_available(&err);
  if (count <= 0) {
    printf("SKIP bench_augment_gpu: %s\n", err.msg);
    return 77;
  }
  if (device >= count) {
    printf("SKIP bench_augment_gpu: device %d of %d\n", device, count);
    return 77;
  }
  CHECK_CUDA(cudaSetDevice(device));
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, device));

  ferry_augment_spec_t spec, exact;
  CHECK_FERRY(ferry_augment_spec_parse(
      "flip(horizontal) | rotate(0.1) | zoom(0.1) | rescale(1/255)", &spec,
      &err));
  exact = spec;
  exact.exact = true;

  size_t in_bytes = n * h * w * c;
  size_t out_max = ferry_augment_out_bytes(n, h, w, c, FERRY_DTYPE_FLOAT32);
  if (out_max == 0) {
    fprintf(stderr, "bench_augment_gpu: batch too large\n");
    return 2;
  }
  uint8_t *pinned[SLOTS], *d_in[SLOTS];
  void *d_out[SLOTS], *d_copy;
  for (int s = 0; s < SLOTS; s++) {
    CHECK_CUDA(cudaHostAlloc((void **)&pinned[s], in_bytes,
                             cudaHostAllocDefault));
    for (size_t i = 0; i < in_bytes; i++)
      pinned[s][i] = (uint8_t)(i * 2654435761u >> 13);
    CHECK_CUDA(cudaMalloc(&d_in[s], in_bytes));
    CHECK_CUDA(cudaMalloc(&d_out[s], out_max));
  }
  CHECK_CUDA(cudaMalloc(&d_copy, out_max));
  cudaStream_t copy_s, compute_s;
  CHECK_CUDA(cudaStreamCreateWithFlags(&copy_s, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamCreateWithFlags(&compute_s, cudaStreamNonBlocking));
  cudaEvent_t copied[SLOTS], done[SLOTS], t0, t1;
  for (int s = 0; s < SLOTS; s++) {
    CHECK_CUDA(cudaEventCreateWithFlags(&copied[s], cudaEventDisableTiming));
    CHECK_CUDA(cudaEventCreateWithFlags(&done[s], cudaEventDisableTiming));
  }
  CHECK_CUDA(cudaEventCreate(&t0));
  CHECK_CUDA(cudaEventCreate(&t1));

  printf("bench_augment_gpu: %s (sm_%d%d, %d SMs), batches of "
         "%zux%ux%ux%u uint8, %d iterations\n",
         prop.name, prop.major, prop.minor, prop.multiProcessorCount, n, h,
         w, c, iters);
  printf("%-44s %12s %10s %10s %9s %7s %s\n", "stage", "bytes/iter",
         "ms/iter", "GB/s", "vs base", "target", "");

  /* ---- 1. Host to device. ---- */
  for (int s = 0; s < SLOTS; s++) /* warm-up: page tables, clocks */
    CHECK_CUDA(cudaMemcpy(d_in[s], pinned[s], in_bytes,
                          cudaMemcpyHostToDevice));
  CHECK_FERRY(ferry_augment_batch_cuda(&spec, 1, 0, 0, d_in[0], n, h, w, c,
                                       d_out[0], FERRY_DTYPE_FLOAT32,
                                       FERRY_LAYOUT_NHWC, compute_s, &err));
  CHECK_CUDA(cudaDeviceSynchronize());

  double t = now();
  for (int i = 0; i < iters; i++)
    CHECK_CUDA(cudaMemcpyAsync(d_in[i % SLOTS], pinned[i % SLOTS], in_bytes,
                               cudaMemcpyHostToDevice, copy_s));
  CHECK_CUDA(cudaStreamSynchronize(copy_s));
  double plain_s = (now() - t) / iters;
  double plain_gbs = in_bytes / plain_s / 1e9;

  t = now();
  for (int i = 0; i < iters; i++) {
    int s = i % SLOTS;
    /* The slot's device buffer is free once its previous kernel ran. */
    if (i >= SLOTS)
      CHECK_CUDA(cudaStreamWaitEvent(copy_s, done[s], 0));
    CHECK_CUDA(cudaMemcpyAsync(d_in[s], pinned[s], in_bytes,
                               cudaMemcpyHostToDevice, copy_s));
    CHECK_CUDA(cudaEventRecord(copied[s], copy_s));
    CHECK_CUDA(cudaStreamWaitEvent(compute_s, copied[s], 0));
    CHECK_FERRY(ferry_augment_batch_cuda(&spec, 1, 0, (uint64_t)i, d_in[s],
                                         n, h, w, c, d_out[s],
                                         FERRY_DTYPE_FLOAT32,
                                         FERRY_LAYOUT_NHWC, compute_s, &err));
    CHECK_CUDA(cudaEventRecord(done[s], compute_s));
  }
  CHECK_CUDA(cudaStreamSynchronize(copy_s));
  double copies_done = now();
  CHECK_CUDA(cudaStreamSynchronize(compute_s));
  double staged_s = (copies_done - t) / iters;
  double staged_gbs = in_bytes / staged_s / 1e9;
  printf("%-44s %12zu %10.3f %10.2f %9s %7s\n",
         "h2d pinned cudaMemcpyAsync (baseline)", in_bytes, plain_s * 1e3,
         plain_gbs, "1.00", "");
  printf("%-44s %12zu %10.3f %10.2f %9.2f %7s %s\n",
         "h2d staging ring (3 slots, kernel overlapped)", in_bytes,
         staged_s * 1e3, staged_gbs, staged_gbs / plain_gbs, ">=0.90",
         verdict(staged_gbs / plain_gbs, 0.9));

  /* ---- 2. The kernel against a device-to-device copy. ---- */
  struct {
    const char *name;
    ferry_dtype_t dt;
    ferry_layout_t lay;
    const ferry_augment_spec_t *spec;
    double target;
  } cases[] = {
      {"float32 NHWC", FERRY_DTYPE_FLOAT32, FERRY_LAYOUT_NHWC, &spec, 0.5},
      {"float32 NCHW", FERRY_DTYPE_FLOAT32, FERRY_LAYOUT_NCHW, &spec, 0.5},
      {"float16 NHWC", FERRY_DTYPE_FLOAT16, FERRY_LAYOUT_NHWC, &spec, 0.5},
      {"float16 NCHW", FERRY_DTYPE_FLOAT16, FERRY_LAYOUT_NCHW, &spec, 0.5},
      {"bfloat16 NHWC", FERRY_DTYPE_BFLOAT16, FERRY_LAYOUT_NHWC, &spec, 0.5},
      {"bfloat16 NCHW", FERRY_DTYPE_BFLOAT16, FERRY_LAYOUT_NCHW, &spec, 0.5},
      {"float32 NHWC, exact mode", FERRY_DTYPE_FLOAT32, FERRY_LAYOUT_NHWC,
       &exact, 0},
  };
  for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
    size_t out_bytes = ferry_augment_out_bytes(n, h, w, c, cases[k].dt);
    float ms;
    char label[96];
    CHECK_CUDA(cudaMemcpyAsync(d_copy, d_out[0], out_bytes,
                               cudaMemcpyDeviceToDevice, compute_s));
    CHECK_CUDA(cudaEventRecord(t0, compute_s));
    for (int i = 0; i < iters; i++)
      CHECK_CUDA(cudaMemcpyAsync(d_copy, d_out[0], out_bytes,
                                 cudaMemcpyDeviceToDevice, compute_s));
    CHECK_CUDA(cudaEventRecord(t1, compute_s));
    CHECK_CUDA(cudaEventSynchronize(t1));
    CHECK_CUDA(cudaEventElapsedTime(&ms, t0, t1));
    double copy_ms = ms / iters;

    CHECK_FERRY(ferry_augment_batch_cuda(cases[k].spec, 2, 0, 0, d_in[0], n,
                                         h, w, c, d_out[1], cases[k].dt,
                                         cases[k].lay, compute_s, &err));
    CHECK_CUDA(cudaEventRecord(t0, compute_s));
    for (int i = 0; i < iters; i++)
      CHECK_FERRY(ferry_augment_batch_cuda(
          cases[k].spec, 2, 0, (uint64_t)i, d_in[0], n, h, w, c, d_out[1],
          cases[k].dt, cases[k].lay, compute_s, &err));
    CHECK_CUDA(cudaEventRecord(t1, compute_s));
    CHECK_CUDA(cudaEventSynchronize(t1));
    CHECK_CUDA(cudaGetLastError());
    CHECK_CUDA(cudaEventElapsedTime(&ms, t0, t1));
    double kernel_ms = ms / iters;

    snprintf(label, sizeof(label), "d2d cudaMemcpy %s bytes (baseline)",
             cases[k].name);
    printf("%-44s %12zu %10.3f %10.2f %9s %7s\n", label, out_bytes, copy_ms,
           out_bytes / copy_ms / 1e6, "1.00", "");
    snprintf(label, sizeof(label), "augment %s (%.0f images/s)",
             cases[k].name, n / (kernel_ms / 1e3));
    printf("%-44s %12zu %10.3f %10.2f %9.2f %7s %s\n", label, out_bytes,
           kernel_ms, out_bytes / kernel_ms / 1e6, copy_ms / kernel_ms,
           cases[k].target > 0 ? ">=0.50" : "-",
           verdict(copy_ms / kernel_ms, cases[k].target));
  }

  for (int s = 0; s < SLOTS; s++) {
    cudaEventDestroy(copied[s]);
    cudaEventDestroy(done[s]);
    cudaFreeHost(pinned[s]);
    cudaFree(d_in[s]);
    cudaFree(d_out[s]);
  }
  cudaEventDestroy(t0);
  cudaEventDestroy(t1);
  cudaFree(d_copy);
  cudaStreamDestroy(copy_s);
  cudaStreamDestroy(compute_s);
  printf("targets: %d PASS, %d MISS\nbench_augment_gpu: ok\n", passed,
         missed);
  return 0;
}
