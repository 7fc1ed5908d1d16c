/* The staging ring's device side with the CUDA runtime (staging.h).
 *
 * Streams are created non-blocking so that they never serialise with the
 * legacy default stream the trainer may use. Events are created with
 * cudaEventDisableTiming (cheaper to record and wait on). Every entry
 * point may run on a thread whose current device is another one (stream
 * readers, the trainer's thread): each sets the ring's device and puts
 * the caller's back.
 */
#include <cuda_runtime.h>

#include "staging.h"

extern "C" {
#include "alloc.h"
}

struct ferry__stg_gpu_s {
  int device;
  uint32_t depth;
  cudaStream_t copy, compute;
  uint8_t **d_in;
  void **d_out;
  cudaEvent_t *copied, *ready, *released;
  bool *release_pending; /* released[i] was recorded and not yet waited */
};

/* Fills err from a CUDA error; returns the Ferry code. */
static int cuda_err(cudaError_t ce, const char *what, ferry_error_t *err) {
  int code = ce == cudaErrorMemoryAllocation ? FERRY_ENOMEM : FERRY_EIO;
  cudaGetLastError(); /* clear a sticky-free error for later calls */
  return ferry__seterr(err, code, "staging: %s: %s (%s)", what,
                       cudaGetErrorString(ce), cudaGetErrorName(ce));
}

/* Makes `device` current, keeping the caller's in *prev. */
static cudaError_t enter(int device, int *prev) {
  cudaError_t ce = cudaGetDevice(prev);
  if (ce != cudaSuccess)
    return ce;
  return *prev == device ? cudaSuccess : cudaSetDevice(device);
}

static void leave(int device, int prev) {
  if (prev != device)
    cudaSetDevice(prev);
}

extern "C" int ferry__stg_pinned_alloc(size_t bytes, void **out,
                                       ferry_error_t *err) {
  /* Portable: the pages are pinned for every device and context. */
  cudaError_t ce = cudaHostAlloc(out, bytes, cudaHostAllocPortable);
  if (ce != cudaSuccess) {
    *out = NULL;
    return cuda_err(ce, "cudaHostAlloc", err);
  }
  return 0;
}

extern "C" void ferry__stg_pinned_free(void *p) {
  if (p != NULL)
    cudaFreeHost(p);
}

extern "C" void ferry__stg_gpu_close(ferry__stg_gpu_t *g) {
  if (g == NULL)
    return;
  int prev = g->device;
  if (enter(g->device, &prev) == cudaSuccess) {
    if (g->copy != NULL)
      cudaStreamSynchronize(g->copy);
    if (g->compute != NULL)
      cudaStreamSynchronize(g->compute);
    for (uint32_t i = 0; i < g->depth; i++) {
      if (g->d_in != NULL && g->d_in[i] != NULL)
        cudaFree(g->d_in[i]);
      if (g->d_out != NULL && g->d_out[i] != NULL)
        cudaFree(g->d_out[i]);
      if (g->copied != NULL && g->copied[i] != NULL)
        cudaEventDestroy(g->copied[i]);
      if (g->ready != NULL && g->ready[i] != NULL)
        cudaEventDestroy(g->ready[i]);
      if (g->released != NULL && g->released[i] != NULL)
        cudaEventDestroy(g->released[i]);
    }
    if (g->copy != NULL)
      cudaStreamDestroy(g->copy);
    if (g->compute != NULL)
      cudaStreamDestroy(g->compute);
    leave(g->device, prev);
  }
  ferry__free(g->d_in);
  ferry__free(g->d_out);
  ferry__free(g->copied);
  ferry__free(g->ready);
  ferry__free(g->released);
  ferry__free(g->release_pending);
  ferry__free(g);
}

extern "C" int ferry__stg_gpu_open(int device, uint32_t depth,
                                   size_t in_bytes, size_t out_bytes,
                                   ferry__stg_gpu_t **out,
                                   ferry_error_t *err) {
  int prev = device, rc = 0;
  cudaError_t ce;
  *out = NULL;
  ferry__stg_gpu_t *g = (ferry__stg_gpu_t *)ferry__calloc(1, sizeof(*g));
  if (g == NULL)
    return ferry__seterr(err, FERRY_ENOMEM, "staging: out of memory");
  g->device = device;
  g->depth = depth;
  g->d_in = (uint8_t **)ferry__calloc(depth, sizeof(*g->d_in));
  g->d_out = (void **)ferry__calloc(depth, sizeof(*g->d_out));
  g->copied = (cudaEvent_t *)ferry__calloc(depth, sizeof(cudaEvent_t));
  g->ready = (cudaEvent_t *)ferry__calloc(depth, sizeof(cudaEvent_t));
  g->released = (cudaEvent_t *)ferry__calloc(depth, sizeof(cudaEvent_t));
  g->release_pending = (bool *)ferry__calloc(depth, sizeof(bool));
  if (g->d_in == NULL || g->d_out == NULL || g->copied == NULL ||
      g->ready == NULL || g->released == NULL || g->release_pending == NULL) {
    g->depth = 0;
    ferry__stg_gpu_close(g);
    return ferry__seterr(err, FERRY_ENOMEM, "staging: out of memory");
  }
  if ((ce = enter(device, &prev)) != cudaSuccess) {
    g->depth = 0;
    ferry__stg_gpu_close(g);
    return cuda_err(ce, "cudaSetDevice", err);
  }
  if ((ce = cudaStreamCreateWithFlags(&g->copy, cudaStreamNonBlocking)) !=
          cudaSuccess ||
      (ce = cudaStreamCreateWithFlags(&g->compute, cudaStreamNonBlocking)) !=
          cudaSuccess) {
    rc = cuda_err(ce, "cudaStreamCreate", err);
    goto out;
  }
  for (uint32_t i = 0; i < depth; i++) {
    if ((ce = cudaMalloc((void **)&g->d_in[i], in_bytes ? in_bytes : 1)) !=
            cudaSuccess ||
        (ce = cudaMalloc(&g->d_out[i], out_bytes ? out_bytes : 1)) !=
            cudaSuccess) {
      rc = cuda_err(ce, "cudaMalloc", err);
      goto out;
    }
    if ((ce = cudaEventCreateWithFlags(&g->copied[i],
                                       cudaEventDisableTiming)) !=
            cudaSuccess ||
        (ce = cudaEventCreateWithFlags(&g->ready[i],
                                       cudaEventDisableTiming)) !=
            cudaSuccess ||
        (ce = cudaEventCreateWithFlags(&g->released[i],
                                       cudaEventDisableTiming)) !=
            cudaSuccess) {
      rc = cuda_err(ce, "cudaEventCreate", err);
      goto out;
    }
  }
out:
  leave(device, prev);
  if (rc != 0) {
    ferry__stg_gpu_close(g);
    return rc;
  }
  *out = g;
  return 0;
}

extern "C" void *ferry__stg_gpu_out(const ferry__stg_gpu_t *g,
                                    uint32_t slot) {
  return g->d_out[slot];
}

extern "C" void *ferry__stg_gpu_ready(const ferry__stg_gpu_t *g,
                                      uint32_t slot) {
  return (void *)g->ready[slot];
}

extern "C" int ferry__stg_gpu_submit(
    ferry__stg_gpu_t *g, uint32_t slot, const uint8_t *host, size_t n,
    uint32_t h, uint32_t w, uint32_t c, const ferry_augment_spec_t *spec,
    uint64_t seed, uint64_t epoch, uint64_t batch_index, ferry_dtype_t dtype,
    ferry_layout_t layout, ferry_error_t *err) {
  int prev = g->device, rc = 0;
  size_t bytes = n * h * w * c;
  cudaError_t ce = enter(g->device, &prev);
  if (ce != cudaSuccess)
    return cuda_err(ce, "cudaSetDevice", err);
  /* d_in[slot] may still be read by the slot's previous kernel; ready
   * is recorded after it (waiting on a never-recorded event is a
   * no-op). */
  if ((ce = cudaStreamWaitEvent(g->copy, g->ready[slot], 0)) != cudaSuccess ||
      (ce = cudaMemcpyAsync(g->d_in[slot], host, bytes,
                            cudaMemcpyHostToDevice, g->copy)) !=
          cudaSuccess ||
      (ce = cudaEventRecord(g->copied[slot], g->copy)) != cudaSuccess ||
      (ce = cudaStreamWaitEvent(g->compute, g->copied[slot], 0)) !=
          cudaSuccess) {
    rc = cuda_err(ce, "copy to the device", err);
    goto out;
  }
  /* The trainer's work on the previous batch of this slot, if it released
   * it on a stream, comes before the kernel overwrites d_out[slot]. Only
   * this thread prepares the slot now, and release came before. */
  if (g->release_pending[slot]) {
    g->release_pending[slot] = false;
    if ((ce = cudaStreamWaitEvent(g->compute, g->released[slot], 0)) !=
        cudaSuccess) {
      rc = cuda_err(ce, "cudaStreamWaitEvent", err);
      goto out;
    }
  }
  rc = ferry_augment_batch_cuda(spec, seed, epoch, batch_index, g->d_in[slot],
                                n, h, w, c, g->d_out[slot], dtype, layout,
                                (void *)g->compute, err);
  if (rc == 0 && (ce = cudaEventRecord(g->ready[slot], g->compute)) !=
                     cudaSuccess)
    rc = cuda_err(ce, "cudaEventRecord", err);
out:
  leave(g->device, prev);
  return rc;
}

extern "C" int ferry__stg_gpu_wait(ferry__stg_gpu_t *g, uint32_t slot,
                                   void *stream, ferry_error_t *err) {
  int prev = g->device, rc = 0;
  cudaError_t ce = enter(g->device, &prev);
  if (ce != cudaSuccess)
    return cuda_err(ce, "cudaSetDevice", err);
  if ((ce = cudaStreamWaitEvent((cudaStream_t)stream, g->ready[slot], 0)) !=
      cudaSuccess)
    rc = cuda_err(ce, "cudaStreamWaitEvent on the trainer's stream", err);
  leave(g->device, prev);
  return rc;
}

extern "C" int ferry__stg_gpu_release(ferry__stg_gpu_t *g, uint32_t slot,
                                      bool ordered, void *stream,
                                      ferry_error_t *err) {
  int prev = g->device, rc = 0;
  cudaError_t ce = enter(g->device, &prev);
  if (ce != cudaSuccess)
    return cuda_err(ce, "cudaSetDevice", err);
  /* The assembler refills the host slot once this returns. */
  if ((ce = cudaEventSynchronize(g->copied[slot])) != cudaSuccess) {
    rc = cuda_err(ce, "waiting for the copy to the device", err);
  } else if (ordered) {
    if ((ce = cudaEventRecord(g->released[slot], (cudaStream_t)stream)) !=
        cudaSuccess)
      rc = cuda_err(ce, "cudaEventRecord on the trainer's stream", err);
    else
      g->release_pending[slot] = true;
  }
  leave(g->device, prev);
  return rc;
}
