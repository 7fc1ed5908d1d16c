/* GPU staging through the client's assembler, on a GPU (no daemons):
 * chunks go in through ferry__client_on_chunk, batches come out of
 * ferry_next as device tensors with an event to wait on.
 *
 *  1. Correctness: every batch's device output, read back after its
 *     ready event, equals ferry_augment_batch_cpu on the batch's uint8
 *     images with the same (seed, epoch, batch index), bitwise, for
 *     float32 NHWC and bfloat16 NCHW; the DLPack export says kDLCUDA.
 *  2. No allocation per batch: ferry__alloc_stats and cudaMemGetInfo are
 *     unchanged over 2,000 batches released on a stream
 *     (ferry_batch_release_after).
 *  3. Throughput: 256x224x224x3 batches through the assembler (one copy
 *     into the pinned slot, the copy to the device, the kernel), printed
 *     as batches/s next to the kernel alone is in bench_augment_gpu.
 *
 * Exits 77 (ctest's skip) when no device can be used.
 * Usage: test_staging_gpu [--device N] [--seconds S]
 */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "client_test_util.h"

#define SPEC_ALL "flip(horizontal) | rotate(0.1) | zoom(0.1) | rescale(1/255)"

static int failures;
#define CHECK(cond, ...)                                                    \
  do {                                                                      \
    if (!(cond)) {                                                          \
      fprintf(stderr, "%s:%d: ", __FILE__, __LINE__);                       \
      fprintf(stderr, __VA_ARGS__);                                         \
      fprintf(stderr, "\n");                                                \
      failures++;                                                           \
    }                                                                       \
  } while (0)

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A parsed chunk of `count` records kept alive so that it can be fed
 * again with another `first`. */
typedef struct feeder_s {
  uint8_t *buf;
  tu_slices_t t;
  ferry_chunk_src_t src;
  ferry_chunk_parser_t p;
  ferry_chunk_t ch;
} feeder_t;

static void feeder_init(feeder_t *f, uint32_t count, uint32_t h, uint32_t w,
                        uint32_t c) {
  tu_chunk_opts_t o = {.count = count, .h = h, .w = w, .c = c};
  size_t len;
  ferry_error_t err = {0};
  f->buf = tu_chunk(&o, &len);
  tu_slices_init(&f->t, f->buf, len, 1 << 20);
  tu_src(&f->src, &f->t);
  ferry__chunk_parser_init(&f->p);
  if (ferry__chunk_parse(&f->p, &f->src, &f->ch, &err) != 0) {
    fprintf(stderr, "chunk: %s\n", err.msg);
    exit(1);
  }
}

static int feed(ferry_client_t *cl, feeder_t *f, uint64_t first) {
  f->ch.first = first;
  return ferry__client_on_chunk(cl, &f->ch, &f->src, NULL);
}

static void feeder_close(feeder_t *f) {
  ferry__chunk_parser_close(&f->p);
  tu_slices_close(&f->t);
  ferry__free(f->buf);
}

static ferry_client_t *gpu_client(int device, uint32_t batch, uint32_t h,
                                  uint32_t w, ferry_dtype_t dtype,
                                  ferry_layout_t layout) {
  ferry__asm_params_t ap = {.batch_size = batch, .height = h, .width = w,
                            .channels = 3, .prefetch = 3, .gpu = true,
                            .device = device, .has_augment = true,
                            .augment_seed = 99, .dtype = dtype,
                            .layout = layout};
  ferry_error_t err = {0};
  ferry_client_t *cl;
  if (ferry_augment_spec_parse(SPEC_ALL, &ap.augment, &err) != 0 ||
      ferry__client_new_local(&ap, &cl, &err) != 0) {
    fprintf(stderr, "gpu client: %s\n", err.msg);
    exit(1);
  }
  return cl;
}

static void correctness(int device, ferry_dtype_t dtype,
                        ferry_layout_t layout, int batches) {
  const uint32_t n = 16, h = 32, w = 32;
  size_t esz = dtype == FERRY_DTYPE_FLOAT32 ? 4 : 2;
  size_t out_bytes = (size_t)n * h * w * 3 * esz;
  ferry_client_t *cl = gpu_client(device, n, h, w, dtype, layout);
  feeder_t f;
  ferry_augment_spec_t spec;
  ferry_augment_spec_parse(SPEC_ALL, &spec, NULL);
  uint8_t *got = malloc(out_bytes), *want = malloc(out_bytes);
  cudaStream_t trainer;
  cudaSetDevice(device);
  cudaStreamCreate(&trainer);
  feeder_init(&f, n, h, w, 3);
  ferry_alloc_stats_t a = {0}, b = {0};
  size_t free0 = 0, free1 = 0, total = 0;
  for (int i = 0; i < batches; i++) {
    const ferry_batch_t *bt;
    ferry_error_t err = {0};
    CHECK(feed(cl, &f, (uint64_t)i * n) == 0, "feed");
    int rc = ferry_next(cl, &bt, 1000, &err);
    if (rc != 0) {
      CHECK(0, "ferry_next: %s", err.msg);
      break;
    }
    CHECK(bt->device == device && bt->ready_event != NULL && !bt->raw,
          "batch fields");
    CHECK(bt->index == (uint64_t)i, "index %llu",
          (unsigned long long)bt->index);
    cudaStreamWaitEvent(trainer, (cudaEvent_t)bt->ready_event, 0);
    if (i < 50 || i % 100 == 0) {
      cudaMemcpyAsync(got, bt->output, out_bytes, cudaMemcpyDeviceToHost,
                      trainer);
      cudaStreamSynchronize(trainer);
      ferry_augment_batch_cpu(&spec, 99, bt->epoch, bt->index, bt->images,
                              n, h, w, 3, want, dtype, layout, NULL);
      CHECK(memcmp(got, want, out_bytes) == 0,
            "batch %d: device output differs from the CPU twin", i);
    }
    if (i == 0) {
      DLManagedTensor *t;
      CHECK(ferry_batch_to_dlpack(cl, bt, &t) == 0, "dlpack");
      CHECK(t->dl_tensor.device.device_type == kDLCUDA &&
                t->dl_tensor.device.device_id == device &&
                t->dl_tensor.data == bt->output,
            "dlpack device");
      t->deleter(t);
    } else {
      ferry_batch_release_after(cl, bt, trainer);
    }
    if (i == 10) {
      ferry__alloc_stats(&a);
      cudaMemGetInfo(&free0, &total);
    }
  }
  cudaStreamSynchronize(trainer);
  ferry__alloc_stats(&b);
  cudaMemGetInfo(&free1, &total);
  CHECK(a.blocks == b.blocks && a.bytes == b.bytes,
        "host allocations grew: %lld -> %lld blocks", (long long)a.blocks,
        (long long)b.blocks);
  CHECK(free0 == free1, "device memory changed: %zu -> %zu free", free0,
        free1);
  printf("staging %s %s: %d batches checked against the CPU twin: %s\n",
         dtype == FERRY_DTYPE_FLOAT32 ? "float32" : "bfloat16",
         layout == FERRY_LAYOUT_NHWC ? "NHWC" : "NCHW", batches,
         failures ? "FAIL" : "ok");
  feeder_close(&f);
  ferry_client_free(cl);
  cudaStreamDestroy(trainer);
  free(got);
  free(want);
}

/* 256x224x224x3 batches through the assembler for `seconds`. */
static void throughput(int device, double seconds) {
  const uint32_t n = 256, h = 224, w = 224;
  ferry_client_t *cl = gpu_client(device, n, h, w, FERRY_DTYPE_FLOAT16,
                                   FERRY_LAYOUT_NCHW);
  feeder_t f;
  cudaStream_t trainer;
  cudaSetDevice(device);
  cudaStreamCreate(&trainer);
  feeder_init(&f, n, h, w, 3);
  int done = 0;
  double t0 = 0;
  for (int i = 0;; i++) {
    const ferry_batch_t *bt;
    ferry_error_t err = {0};
    if (i == 3)
      t0 = now_s();
    if (i > 3 && now_s() - t0 > seconds)
      break;
    feed(cl, &f, (uint64_t)i * n);
    if (ferry_next(cl, &bt, 1000, &err) != 0) {
      CHECK(0, "ferry_next: %s", err.msg);
      break;
    }
    cudaStreamWaitEvent(trainer, (cudaEvent_t)bt->ready_event, 0);
    ferry_batch_release_after(cl, bt, trainer);
    if (i >= 3)
      done++;
  }
  cudaStreamSynchronize(trainer);
  double dt = now_s() - t0;
  double gb = (double)done * n * h * w * 3 / dt / 1e9;
  printf("staging throughput (256x224x224x3 uint8 -> float16 NCHW, one "
         "reader thread, host copy into the pinned slot included): %.1f "
         "batches/s, %.2f GB/s of uint8 input\n", done / dt, gb);
  feeder_close(&f);
  ferry_client_free(cl);
  cudaStreamDestroy(trainer);
}

int main(int argc, char **argv) {
  int device = 0;
  double seconds = 3;
  for (int i = 1; i + 1 < argc; i++) {
    if (strcmp(argv[i], "--device") == 0)
      device = atoi(argv[++i]);
    else if (strcmp(argv[i], "--seconds") == 0)
      seconds = atof(argv[++i]);
  }
  ferry_error_t err = {0};
  int count = ferry_cuda_available(&err);
  if (count <= 0) {
    printf("test_staging_gpu: skipped: %s\n", err.msg);
    return 77;
  }
  if (device >= count) {
    printf("test_staging_gpu: skipped: device %d of %d\n", device, count);
    return 77;
  }
  correctness(device, FERRY_DTYPE_FLOAT32, FERRY_LAYOUT_NHWC, 2000);
  correctness(device, FERRY_DTYPE_BFLOAT16, FERRY_LAYOUT_NCHW, 300);
  throughput(device, seconds);
  if (failures) {
    printf("test_staging_gpu: %d failure(s)\n", failures);
    return 1;
  }
  printf("test_staging_gpu: ok\n");
  return 0;
}
