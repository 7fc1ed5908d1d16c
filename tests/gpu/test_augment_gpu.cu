/* The augmentation kernel against its CPU twin, on a GPU: the generator
 * and the per-image maps computed on the device equal the host's bit for
 * bit, and ferry_augment_batch_cuda's output equals
 * ferry_augment_batch_cpu's (bitwise expected; 1e-5 relative allowed)
 * for every dtype, layout and mode on random batches. Without a usable
 * device it prints why and exits 77 (ctest's skip).
 *
 * Usage: test_augment_gpu [--device N]
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "augment.h"

static int failures;

#define CHECK_CUDA(call)                                                    \
  do {                                                                      \
    cudaError_t ce_ = (call);                                               \
    if (ce_ != cudaSuccess) {                                               \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,         \
              cudaGetErrorString(ce_));                                     \
      exit(1);                                                              \
    }                                                                       \
  } while (0)

static uint64_t rng = 0x1234567;

static uint32_t next_u32(void) {
  rng = rng * 6364136223846793005ull + 1442695040888963407ull;
  return (uint32_t)(rng >> 33);
}

/* ---- Parameters: the device's draws and maps against the host's. ---- */

struct key_t_ {
  uint64_t seed, epoch, batch, image;
  int w, h;
};

__global__ void params_kernel(ferry_augment_spec_t spec, const key_t_ *keys,
                              int n, ferry_augment_params_t *params,
                              ferry__aug_img_t *imgs) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n)
    return;
  ferry__aug_params(&spec, keys[i].seed, keys[i].epoch, keys[i].batch,
                    keys[i].image, &params[i]);
  ferry__aug_setup(&spec, &params[i], keys[i].w, keys[i].h, &imgs[i]);
}

static bool same_bits(float a, float b) { return memcmp(&a, &b, 4) == 0; }

static void check_params(const char *text) {
  const int n = 4096;
  ferry_augment_spec_t spec;
  ferry_error_t err = {0};
  if (ferry_augment_spec_parse(text, &spec, &err) != 0) {
    fprintf(stderr, "parse %s: %s\n", text, err.msg);
    exit(1);
  }
  key_t_ *keys = (key_t_ *)malloc(n * sizeof(key_t_)), *d_keys;
  ferry_augment_params_t *params = (ferry_augment_params_t *)malloc(
      n * sizeof(ferry_augment_params_t));
  ferry_augment_params_t *d_params;
  ferry__aug_img_t *imgs = (ferry__aug_img_t *)malloc(
      n * sizeof(ferry__aug_img_t));
  ferry__aug_img_t *d_imgs;
  for (int i = 0; i < n; i++) {
    keys[i].seed = i < 16 ? (uint64_t)i : ((uint64_t)next_u32() << 32 |
                                           next_u32());
    keys[i].epoch = next_u32() % 100;
    keys[i].batch = i < 16 ? 0 : next_u32();
    keys[i].image = (uint64_t)i % 300;
    keys[i].w = 2 + (int)(next_u32() % 300);
    keys[i].h = 2 + (int)(next_u32() % 300);
  }
  CHECK_CUDA(cudaMalloc(&d_keys, n * sizeof(key_t_)));
  CHECK_CUDA(cudaMalloc(&d_params, n * sizeof(ferry_augment_params_t)));
  CHECK_CUDA(cudaMalloc(&d_imgs, n * sizeof(ferry__aug_img_t)));
  CHECK_CUDA(cudaMemcpy(d_keys, keys, n * sizeof(key_t_),
                        cudaMemcpyHostToDevice));
  params_kernel<<<(n + 127) / 128, 128>>>(spec, d_keys, n, d_params, d_imgs);
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaMemcpy(params, d_params, n * sizeof(ferry_augment_params_t),
                        cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(imgs, d_imgs, n * sizeof(ferry__aug_img_t),
                        cudaMemcpyDeviceToHost));
  int bad = 0;
  for (int i = 0; i < n; i++) {
    ferry_augment_params_t p;
    ferry__aug_img_t im;
    /* The host side: the CPU twin's public function, built by the C
     * compiler; the maps through the shared header. */
    ferry_augment_params(&spec, keys[i].seed, keys[i].epoch, keys[i].batch,
                         keys[i].image, &p);
    ferry__aug_setup(&spec, &p, keys[i].w, keys[i].h, &im);
    bool ok = p.flip == params[i].flip &&
              same_bits(p.angle, params[i].angle) &&
              same_bits(p.zoom, params[i].zoom) &&
              im.flip == imgs[i].flip && im.resample == imgs[i].resample &&
              same_bits(im.z, imgs[i].z) && same_bits(im.zx, imgs[i].zx) &&
              same_bits(im.zy, imgs[i].zy);
    for (int k = 0; k < 6; k++)
      ok = ok && same_bits(im.m[k], imgs[i].m[k]);
    if (!ok && bad++ < 5)
      fprintf(stderr,
              "params %s key %d: host flip %d angle %a zoom %a m0 %a m2 %a; "
              "device flip %d angle %a zoom %a m0 %a m2 %a\n",
              text, i, p.flip, p.angle, p.zoom, im.m[0], im.m[2],
              params[i].flip, params[i].angle, params[i].zoom, imgs[i].m[0],
              imgs[i].m[2]);
  }
  printf("%-4s params  %-58s %d keys, %d differ\n", bad ? "FAIL" : "ok",
         text, n, bad);
  failures += bad != 0;
  cudaFree(d_keys);
  cudaFree(d_params);
  cudaFree(d_imgs);
  free(keys);
  free(params);
  free(imgs);
}

/* ---- Batches: the kernel against the CPU twin. ---- */

static float half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1F,
           m = h & 0x3FF, u;
  float f;
  if (e == 0) {
    f = (float)m * 5.9604644775390625e-8f;
    return sign ? -f : f;
  }
  if (e == 31)
    u = sign | 0x7F800000u | (m << 13);
  else
    u = sign | ((e + 112) << 23) | (m << 13);
  memcpy(&f, &u, 4);
  return f;
}

static float bf16_to_float(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static float element(const void *buf, size_t i, ferry_dtype_t dt) {
  if (dt == FERRY_DTYPE_FLOAT16)
    return half_to_float(((const uint16_t *)buf)[i]);
  if (dt == FERRY_DTYPE_BFLOAT16)
    return bf16_to_float(((const uint16_t *)buf)[i]);
  return ((const float *)buf)[i];
}

static const char *dtype_name(ferry_dtype_t dt) {
  return dt == FERRY_DTYPE_FLOAT16    ? "float16"
         : dt == FERRY_DTYPE_BFLOAT16 ? "bfloat16"
                                      : "float32";
}

static void check_batch(const char *text, size_t n, uint32_t h, uint32_t w,
                        uint32_t c, cudaStream_t stream) {
  ferry_augment_spec_t spec;
  ferry_error_t err = {0};
  if (ferry_augment_spec_parse(text, &spec, &err) != 0) {
    fprintf(stderr, "parse %s: %s\n", text, err.msg);
    exit(1);
  }
  size_t in_len = n * h * w * c;
  uint8_t *in = (uint8_t *)malloc(in_len), *d_in;
  for (size_t i = 0; i < in_len; i++)
    in[i] = (uint8_t)next_u32();
  CHECK_CUDA(cudaMalloc(&d_in, in_len));
  CHECK_CUDA(cudaMemcpy(d_in, in, in_len, cudaMemcpyHostToDevice));
  uint64_t seed = ((uint64_t)next_u32() << 32) | next_u32();
  uint64_t batch = next_u32() % 1000;
  for (int d = 0; d < 3; d++) {
    for (int l = 0; l < 2; l++) {
      ferry_dtype_t dt = (ferry_dtype_t)d;
      ferry_layout_t lay = (ferry_layout_t)l;
      size_t bytes = ferry_augment_out_bytes(n, h, w, c, dt);
      void *cpu = malloc(bytes), *gpu = malloc(bytes), *d_out;
      CHECK_CUDA(cudaMalloc(&d_out, bytes));
      CHECK_CUDA(cudaMemset(d_out, 0xFF, bytes));
      int rc = ferry_augment_batch_cpu(&spec, seed, 5, batch, in, n, h, w, c,
                                       cpu, dt, lay, &err);
      if (rc == 0)
        rc = ferry_augment_batch_cuda(&spec, seed, 5, batch, d_in, n, h, w,
                                      c, d_out, dt, lay, stream, &err);
      if (rc != 0) {
        printf("FAIL batch  %s: %s\n", text, err.msg);
        failures++;
        cudaFree(d_out);
        free(cpu);
        free(gpu);
        continue;
      }
      CHECK_CUDA(cudaStreamSynchronize(stream));
      CHECK_CUDA(cudaMemcpy(gpu, d_out, bytes, cudaMemcpyDeviceToHost));
      size_t es = dt == FERRY_DTYPE_FLOAT32 ? 4 : 2, count = bytes / es;
      size_t differ = 0, worst_i = 0;
      double worst = 0;
      for (size_t i = 0; i < count; i++) {
        float a = element(cpu, i, dt), b = element(gpu, i, dt);
        double diff = fabs((double)a - (double)b) / fmax(1.0, fabs(a));
        differ += memcmp((const char *)cpu + i * es,
                         (const char *)gpu + i * es, es) != 0;
        if (!(diff <= worst)) {
          worst = diff;
          worst_i = i;
        }
      }
      bool ok = worst <= 1e-5;
      printf("%-4s batch   %-40s %4zux%ux%ux%u %-8s %s: %zu of %zu elements "
             "differ, worst %.3g%s\n",
             ok ? "ok" : "FAIL", text, n, h, w, c, dtype_name(dt),
             lay == FERRY_LAYOUT_NCHW ? "NCHW" : "NHWC", differ, count, worst,
             differ ? " (not bitwise)" : " (bitwise)");
      if (!ok)
        printf("     element %zu: cpu %.9g gpu %.9g\n", worst_i,
               element(cpu, worst_i, dt), element(gpu, worst_i, dt));
      failures += !ok;
      cudaFree(d_out);
      free(cpu);
      free(gpu);
    }
  }
  cudaFree(d_in);
  free(in);
}

int main(int argc, char **argv) {
  ferry_error_t err = {0};
  int device = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--device") == 0 && i + 1 < argc) {
      device = atoi(argv[++i]);
    } else {
      fprintf(stderr, "usage: %s [--device N]\n", argv[0]);
      return 2;
    }
  }
  int count = ferry_cuda_available(&err);
  if (count <= 0) {
    printf("SKIP test_augment_gpu: %s\n", err.msg);
    return 77;
  }
  if (device >= count) {
    printf("SKIP test_augment_gpu: device %d of %d\n", device, count);
    return 77;
  }
  CHECK_CUDA(cudaSetDevice(device));
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
  printf("device %d: %s (sm_%d%d)\n", device, prop.name, prop.major,
         prop.minor);

  const char *full =
      "flip(horizontal) | rotate(0.1) | zoom(0.1) | rescale(1/255)";
  check_params(full);
  check_params("flip(horizontal) | rotate(0.45) | zoom(0.5) | exact");
  check_params("rotate(0.99)");
  check_params("zoom(0.2)");

  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  check_batch(full, 16, 224, 224, 3, stream);
  check_batch("flip(horizontal) | rotate(0.1) | zoom(0.1) | rescale(1/255) "
              "| exact",
              8, 64, 48, 3, stream);
  check_batch("flip(horizontal) | rotate(0.45) | zoom(0.5)", 33, 17, 29, 1,
              NULL);
  check_batch("rotate(0.3) | exact", 5, 2, 2, 4, stream);
  check_batch("zoom(0.25) | rescale(0.5)", 7, 31, 5, 2, stream);
  check_batch("flip(horizontal)", 9, 1, 1, 3, stream);
  check_batch("", 3, 10, 12, 3, stream);
  /* More images than the grid's y dimension holds. */
  check_batch("flip(horizontal) | rotate(0.1)", 70000, 2, 3, 1, stream);
  CHECK_CUDA(cudaStreamDestroy(stream));

  /* The launcher's argument checks are the CPU twin's. */
  ferry_augment_spec_t spec;
  ferry_augment_spec_parse("rotate(0.1)", &spec, &err);
  int rc = ferry_augment_batch_cuda(&spec, 1, 0, 0, (const uint8_t *)1, 1, 1,
                                    5, 3, (void *)1, FERRY_DTYPE_FLOAT32,
                                    FERRY_LAYOUT_NHWC, NULL, &err);
  bool ok = rc == FERRY_ETOOSMALL;
  printf("%-4s refuses 1-pixel-high images with rotate: %s\n",
         ok ? "ok" : "FAIL", err.msg);
  failures += !ok;

  printf("test_augment_gpu: %s (%d failure%s)\n", failures ? "FAILED" : "ok",
         failures, failures == 1 ? "" : "s");
  return failures ? 1 : 0;
}
