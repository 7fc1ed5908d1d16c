/* The staging ring's device side: pinned host memory, device buffers,
 * streams and events. One API, two implementations that CMake chooses
 * between: staging_cuda.cu (CUDA runtime) and staging_nocuda.c (every
 * call answers FERRY_ENOTSUP). The portable part, which owns the slots'
 * memory and runs the CPU twin, is staging.c.
 *
 * Per slot i of a depth-d ring the device side holds an input buffer
 * d_in[i] (the uint8 batch), an output buffer d_out[i] (the augmented
 * tensor) and three events: copied[i] (the host-to-device copy is done,
 * so host slot i may be refilled), ready[i] (the kernel is done: the
 * trainer's event) and released[i] (recorded on the trainer's stream by
 * ferry_batch_release_after). Two streams: copies go on the copy stream,
 * kernels on the compute stream, and ready[i]'s copy counterpart links
 * them, so batch k+1's copy overlaps batch k's kernel.
 */
#ifndef FERRY_CLIENT_STAGING_H
#define FERRY_CLIENT_STAGING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ferry/augment.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ferry__stg_gpu_s ferry__stg_gpu_t;

/* Page-locked host memory (cudaHostAlloc, portable). Returns 0 with *out
 * set, FERRY_ENOMEM, or FERRY_ENOTSUP without CUDA. */
int ferry__stg_pinned_alloc(size_t bytes, void **out, ferry_error_t *err);
void ferry__stg_pinned_free(void *p);

/* Creates the device side of a ring of `depth` slots on `device`: the
 * streams, events and buffers (in_bytes and out_bytes each), all at once.
 * Returns 0, FERRY_ENOMEM / FERRY_EIO with CUDA's message, or
 * FERRY_ENOTSUP without CUDA. Leaves the calling thread's current device
 * as it found it. */
int ferry__stg_gpu_open(int device, uint32_t depth, size_t in_bytes,
                        size_t out_bytes, ferry__stg_gpu_t **out,
                        ferry_error_t *err);

/* Slot i's device output buffer and its ready event (a cudaEvent_t). */
void *ferry__stg_gpu_out(const ferry__stg_gpu_t *g, uint32_t slot);
void *ferry__stg_gpu_ready(const ferry__stg_gpu_t *g, uint32_t slot);

/* Enqueues slot i: copy n images (host, pinned) to d_in[i] on the copy
 * stream after the slot's previous kernel finished reading d_in[i];
 * record copied[i]; the compute stream waits for it and for released[i]
 * (when the trainer released the slot on a stream), runs the kernel into
 * d_out[i] and records ready[i]. Returns once enqueued: 0, or FERRY_EIO
 * with CUDA's message. Thread-safe for distinct slots. */
int ferry__stg_gpu_submit(ferry__stg_gpu_t *g, uint32_t slot,
                          const uint8_t *host, size_t n, uint32_t h,
                          uint32_t w, uint32_t c,
                          const ferry_augment_spec_t *spec, uint64_t seed,
                          uint64_t epoch, uint64_t batch_index,
                          ferry_dtype_t dtype, ferry_layout_t layout,
                          ferry_error_t *err);

/* The trainer is done with slot i: waits (on the host) for copied[i], so
 * the host slot may be refilled; when `ordered`, records released[i] on
 * `stream` (NULL: the legacy default stream) for the next submit of the
 * slot to wait on. Returns 0 or FERRY_EIO. */
int ferry__stg_gpu_release(ferry__stg_gpu_t *g, uint32_t slot, bool ordered,
                           void *stream, ferry_error_t *err);

/* Makes `stream` (a cudaStream_t; NULL: the legacy default stream of the
 * ring's device) wait on the device for ready[i] (cudaStreamWaitEvent):
 * work enqueued on it afterwards sees slot i's output. Returns 0 or
 * FERRY_EIO. */
int ferry__stg_gpu_wait(ferry__stg_gpu_t *g, uint32_t slot, void *stream,
                        ferry_error_t *err);

/* Waits for the device work, then frees everything. NULL is fine. */
void ferry__stg_gpu_close(ferry__stg_gpu_t *g);

#ifdef __cplusplus
}
#endif

#endif /* FERRY_CLIENT_STAGING_H */
