/* libferry: the trainer-side client of a Ferry cluster.
 *
 * A client registers a dataset (a pipeline spec) with the dispatcher, joins
 * or creates a job, streams its splits' chunks from every worker and
 * assembles fixed-size batches:
 *
 *   ferry_client_options_t o;
 *   ferry_client_options_init(&o);
 *   o.dispatcher = "127.0.0.1:5050";
 *   o.spec = "tfrecord(\"/data/train-*.tfrecord\") | decode(raw, 32, 32, 3) | "
 *            "dilate(3) | blur(11, 0.8) | batch(1024)";
 *   ferry_client_t *c;
 *   if (ferry_client_new(&o, &c, &err) != 0) ...
 *   for (;;) {
 *     const ferry_batch_t *b;
 *     int rc = ferry_next(c, &b, 10000, &err);
 *     if (rc == FERRY_EPOCH_END) continue;
 *     if (rc == FERRY_END) break;
 *     if (rc != 0) { report(err.msg); break; }
 *     train(b->images, b->labels, b->size);
 *     ferry_batch_release(c, b);
 *   }
 *   ferry_client_free(c);
 *
 * Threads. The library runs a heartbeat thread (every heartbeat_ms: asks
 * the dispatcher for splits, reports what the trainer received, opens one
 * stream per worker) and one reader thread per worker stream (parses each
 * chunk's header and copies its records straight into the batch being
 * assembled). ferry_next, ferry_batch_release, ferry_client_stats and
 * ferry_client_job_id/ferry_client_id are thread-safe against those
 * threads and each other, but a client has one consumer: call ferry_next
 * from one thread at a time. ferry_client_free must not race with any
 * other call on the same client, and no batch may be used after it.
 *
 * Ownership. The client copies every string of the options. Batches are
 * the client's memory (preallocated once: `prefetch` slots of batch_size
 * records); the trainer borrows one from ferry_next until
 * ferry_batch_release. The library never prints: install a log callback
 * (ferry/log.h) to see warnings such as a lost worker.
 *
 * Exactly once. In distributed_epoch mode each record reaches the trainers
 * of a job once per epoch, also when workers die: the client drops any
 * record position of a split it already received. A record counts as
 * delivered when ferry_next hands out its batch; a trainer that dies
 * after that but before the next heartbeat may see those records again
 * in another client (docs/ARCHITECTURE.md, "Jobs, epochs and the split
 * table").
 */
#ifndef FERRY_CLIENT_H
#define FERRY_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ferry/augment.h"
#include "ferry/common.h" /* FERRY_ON_ERROR_FAIL / _SKIP, ferry_free */
#include "ferry/dlpack.h"
#include "ferry/error.h"
#include "ferry/export.h"
#include "ferry/version.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ferry_next's results besides 0 and errors. */
#define FERRY_EPOCH_END 1 /* every record of the epoch was delivered */
#define FERRY_END 2       /* the job is finished: every epoch delivered */

typedef enum {
  FERRY_MODE_DISTRIBUTED_EPOCH = 0, /* each record once per epoch, overall */
  FERRY_MODE_PARALLEL_EPOCHS = 1    /* each worker produces everything */
} ferry_job_mode_t;

/* The client's options. ABI rule: fields are only ever appended, never
 * reordered, resized or removed, and `struct_size` (set by
 * ferry_client_options_init to the sizeof the caller was compiled with)
 * tells the library how much of the struct the caller has. The library
 * reads only struct_size bytes and gives every field beyond them its
 * default, so a binding built against an older header keeps working with
 * a newer libferry. struct_size must cover at least the fields through
 * dispatcher_timeout_ms (FERRY_CLIENT_OPTIONS_MIN_SIZE) and end on a
 * field boundary; 0 (not initialised) fails with FERRY_EINVAL. A
 * struct_size beyond what this libferry knows is accepted only when the
 * unknown tail is all zero bytes (options it cannot honour left unset). */
/* The order of the records in a rank's batches (options.order). */
typedef enum {
  FERRY_ORDER_ARRIVAL = 0,
  FERRY_ORDER_DETERMINISTIC = 1,
} ferry_order_t;

typedef struct ferry_client_options_s {
  uint32_t struct_size;   /* sizeof(ferry_client_options_t) as the caller
                             compiled it: set by ferry_client_options_init */
  const char *dispatcher; /* "host:port" (required) */
  const char *spec;       /* pipeline spec text, or */
  const char *dataset_id; /* an id from an earlier registration */
  const char *job_name;   /* NULL or "": an anonymous, private job */
  ferry_job_mode_t mode;
  int64_t num_epochs;     /* 0: the spec's repeat() (default 1); -1: forever */
  int shuffle;            /* -1 (default): as the spec's shuffle() says;
                             1: on with shuffle_seed; 0: no override (the
                             job does not shuffle unless the spec does) */
  uint64_t shuffle_seed;
  int error_policy;       /* FERRY_ON_ERROR_FAIL (default) or _SKIP
                             (ferry/common.h) */
  uint32_t batch_size;    /* 0: the spec's batch() */
  bool drop_remainder;    /* drop each epoch's last partial batch */
  uint32_t prefetch;      /* batches assembled ahead: the staging ring's
                             depth (default 3) */
  uint32_t splits_in_flight; /* splits held at once (default 8) */
  uint32_t heartbeat_ms;  /* default 250 */
  uint32_t connect_timeout_ms; /* dispatcher answer deadline (default 5000) */
  uint32_t dispatcher_timeout_ms; /* no heartbeat answer for this long fails
                                     the client (default 30000) */

  /* The GPU node path. Zero values keep host batches of uint8
   * images, as without these fields. */
  bool gpu;               /* stage batches to CUDA device `device`: pinned
                             host slots, an asynchronous copy and the
                             augmentation kernel; the batch's `output` is
                             device memory */
  int device;             /* CUDA device id (with gpu) */
  bool device_fallback;   /* gpu but no usable CUDA device: host batches
                             (augmented by the CPU twin) with a logged
                             warning, instead of failing */
  const char *augment;    /* NULL or "": no augmentation; else the
                             ferry/augment.h text form, e.g.
                             "flip(horizontal) | rotate(0.1) | zoom(0.1) | "
                             "rescale(1/255)" */
  uint64_t augment_seed;  /* with epoch, batch index and image index, the
                             key of every image's random parameters */
  ferry_dtype_t dtype;    /* augmented output type (default float32) */
  ferry_layout_t layout;  /* augmented output layout (default NHWC) */

  /* Security. NULL keeps plaintext and no token. With tls_ca or
   * tls_cert set, every channel (dispatcher and workers) uses TLS. */
  const char *tls_ca;     /* PEM CA bundle the dispatcher's and workers'
                             certificates must chain to (NULL with
                             tls_cert: gRPC's default roots) */
  const char *tls_cert;   /* PEM client certificate for mutual TLS */
  const char *tls_key;    /* its private key */
  const char *token_file; /* file holding the client bearer token, sent to
                             the dispatcher and workers on every call */

  /* Data plane: how chunks travel from each worker. NULL, ""
   * or "auto": UCX where this libferry and the worker both have it (and
   * no TLS is configured: UCX does not encrypt), else gRPC, the reason
   * logged at INFO; "grpc"; "ucx" (ferry_client_new fails with
   * FERRY_ENOTSUP in a libferry built without UCX; a worker without UCX
   * gets no stream, logged). NULL falls back to the FERRY_TRANSPORT
   * environment variable. */
  const char *transport;

  /* Ranks: data-parallel trainers (PyTorch DDP, Horovod,
   * MultiWorkerMirroredStrategy), whose ranks must all take the same
   * number of steps per epoch. world_size W > 1 makes this client rank
   * `rank` (0 <= rank < W) of the named distributed_epoch job `job_name`
   * (required): every rank receives ferry_client_steps_per_epoch()
   * batches of exactly batch_size records per epoch, and every record of
   * the epoch reaches one rank. drop_remainder chooses what happens to the
   * last round of W x batch_size records when it is partial: true drops
   * it (ferry_client_dropped_per_epoch() records are not delivered that
   * epoch); false (the default, as DistributedSampler) pads: each rank's
   * last batches are filled up by repeating records of its epoch, and
   * ferry_batch_t.num_real says how many records of a batch are real.
   * Every client of the job must give the same W, batch size and policy,
   * and a rank is held by one live client at a time (FERRY_EINVAL naming
   * both clients otherwise); a client that joins as the rank of one that
   * left or died gets that rank's remaining steps of the epoch. 0 or 1:
   * no ranks (any client takes any split). */
  uint32_t world_size;
  uint32_t rank;

  /* Order. FERRY_ORDER_ARRIVAL (the default): a batch takes
   * records as they arrive, from whichever worker is first.
   * FERRY_ORDER_DETERMINISTIC: batch s of a rank holds the records
   * [s x B, (s + 1) x B) of the rank's share of the epoch's order (the
   * split order, then the record order inside each split: permutations
   * keyed by (shuffle_seed, epoch, split) under shuffle), in that order,
   * so the batches, their records and their bytes are a function of the
   * files, the spec, the seed, the epoch, B, W and the rank: not of the
   * workers, their number, speed or faults, the dispatcher's restarts,
   * prefetch or the transport. Needs mode distributed_epoch and a dataset
   * whose splits all have a known count (uncompressed files). Without
   * world_size the client is the one rank of its job (W = 1; the last
   * batch of an epoch is short, or dropped under drop_remainder).
   * Records that arrive before their turn wait in host memory: at most
   * splits_in_flight splits' records. */
  ferry_order_t order;

  /* Resume: a cursor from ferry_client_state (resume_len bytes,
   * at most FERRY_CLIENT_CURSOR_MAX), saved with a checkpoint: the job
   * starts at the cursor's epoch and step, so the first batch is the one
   * an uninterrupted run would have delivered next; each rank's records
   * before it are counted done and never read (the dispatcher starts
   * their splits at the cursor's position). Needs order deterministic and
   * the cursor's dataset, shuffle seed, batch size and policy (FERRY_EINVAL
   * naming what differs). The world size may differ (elastic): what the
   * cursor's ranks left of its epoch is then cut anew among this job's
   * ranks, in the epoch's order, and that epoch has its own steps
   * (ferry_client_steps_per_epoch); later epochs are whole. A named job
   * that runs
   * from elsewhere (the run that died) is superseded: cancelled, its
   * clients told so, and made anew at the cursor; the ranks of one
   * restart join the same new job. NULL: no resume. */
  const void *resume;
  size_t resume_len;

  /* Shared production (0, the default: the job has its own). 1: the
   * job shares what the workers produce with every other sharing job of
   * the same dataset, spec, shuffle seed and epoch (a hyperparameter
   * sweep's trainers): the dispatcher leases a split of all of them to
   * one worker, which reads and processes it once and sends each job its
   * own copy, every record to every trainer once per epoch, each at its
   * own pace. A worker keeps what it produced for the others within its
   * --share-bytes window; a job that falls behind it gets the records it
   * missed produced again for it alone, never holding the others back.
   * Nothing else changes: the job's leases, faults and order are its
   * own. */
  int share;
} ferry_client_options_t;

/* A batch: `size` records (batch_size, except an epoch's last, partial
 * batch), NHWC uint8 images and one int64 label and record id per record
 * (0 when the spec has label(none)). All records of a batch belong to one
 * epoch. Owned by the client; valid until ferry_batch_release.
 *
 * `output` is what the trainer feeds its model:
 *   - host batches without an augmentation spec: `images` itself (uint8
 *     NHWC; `raw` is true and dtype/layout say nothing);
 *   - host batches with a spec: a host buffer of `size` images augmented
 *     by the CPU twin into `dtype` and `layout`;
 *   - GPU staging (options.gpu): device memory on CUDA device `device`
 *     written by the augmentation kernel (an empty spec only converts to
 *     `dtype` and `layout`). `ready_event` (a cudaEvent_t) is recorded
 *     after the kernel: make the trainer's stream wait on it
 *     (cudaStreamWaitEvent) before reading `output`. `images` still points
 *     at the pinned host copy.
 * Image i of the batch was augmented with the parameters of
 * ferry_augment_params(spec, augment_seed, epoch, index, i). */
typedef struct ferry_batch_s {
  const uint8_t *images;
  const int64_t *labels;
  const uint64_t *ids; /* file index << 40 | record index in the file */
  uint32_t size;
  uint32_t height, width, channels;
  uint32_t epoch;
  uint64_t index;      /* batch number within the job */
  const void *output;  /* see above */
  bool raw;            /* output is the uint8 NHWC images */
  ferry_dtype_t dtype;
  ferry_layout_t layout;
  int device;          /* CUDA device of output, or -1 for host memory */
  void *ready_event;   /* cudaEvent_t to wait on (GPU staging), else NULL */
  /* The batch's first num_real records are real; the rest (a ranked
   * job's padded last batches, options.world_size) repeat records of the
   * epoch, so that a loss can leave them out. `size` otherwise. */
  uint32_t num_real;
} ferry_batch_t;

typedef struct ferry_client_stats_s {
  uint64_t batches;
  uint64_t records;
  uint64_t bytes;
  double wait_seconds;   /* time spent inside ferry_next waiting */
  double total_seconds;  /* since ferry_client_new */
  double stall_fraction; /* wait / total */
  uint32_t workers;      /* worker streams open */
  /* Records handed to the trainer that the dispatcher has acknowledged
   * (it answered a heartbeat reporting them). Should this client die,
   * at most records - records_acked of them may reach another client
   * again (docs/ARCHITECTURE.md, "Exactly once"). */
  uint64_t records_acked;
  /* Deterministic order (options.order): the most records that waited
   * in host memory for their turn at once (at most splits_in_flight
   * splits' records), of record_bytes each. */
  uint64_t held_records_peak;
  /* Deterministic order: records that arrived before their turn and went
   * straight into the batch they belong to (a batch taken ahead of the
   * one filling, within prefetch), not held aside. */
  uint64_t records_placed_ahead;
} ferry_client_stats_t;

/* The smallest struct_size ferry_client_new accepts: the options of the
 * first release (dispatcher through dispatcher_timeout_ms). */
#define FERRY_CLIENT_OPTIONS_MIN_SIZE                                       \
  (offsetof(ferry_client_options_t, dispatcher_timeout_ms) + sizeof(uint32_t))

/* Zero-fills the first `size` bytes of *opts, sets struct_size = size and
 * the defaults written next to each field that fits in `size` (everything
 * else 0/NULL: distributed_epoch, the spec's epochs and batch size, policy
 * fail). Callers write ferry_client_options_init(&o), which passes the
 * sizeof their header declares; bindings that lay the struct out
 * themselves call this with their own size. */
FERRY_API void ferry_client_options_init_sized(ferry_client_options_t *opts,
                                               size_t size);
#define ferry_client_options_init(opts)                                     \
  ferry_client_options_init_sized((opts), sizeof *(opts))

typedef struct ferry_client_s ferry_client_t;

/* Connects, registers the dataset (opts->spec) or names it
 * (opts->dataset_id: exactly one of the two), gets or creates the job and
 * starts the client's threads. Returns 0, or within connect_timeout_ms an
 * error with `err` naming the cause:
 *   FERRY_ESPEC    the spec text does not parse ("spec: column N: ..."),
 *                  or the augment text ("augment spec: column N: ..."),
 *                  found before any RPC;
 *   FERRY_ENOTSUP  gpu is set without device_fallback and no CUDA device
 *                  can be used (the text says why: a build without CUDA,
 *                  no device, a driver error), before any RPC;
 *   FERRY_ETOOSMALL the augmentation cannot apply to the images (rotate
 *                  or zoom on 1-pixel-wide or -high images);
 *   FERRY_ENOENT   the dispatcher found no file for a pattern, or does not
 *                  know the dataset id (its text names the pattern/file);
 *   FERRY_EINVAL   missing options, no batch size (neither batch_size nor
 *                  a batch() stage), a device id beyond the devices
 *                  present, an unknown dtype or layout, or a request the
 *                  dispatcher refused;
 *   FERRY_ESHAPE   the images have no fixed shape (JPEG without resize);
 *   FERRY_EGRPC_*  the dispatcher was unreachable or failed
 *                  ("dispatcher HOST:PORT unreachable within N ms");
 *   FERRY_EFORKED  this process was forked while a client of its parent
 *                  was open: gRPC cannot run here (start it with spawn).
 * Tunes glibc's malloc for gRPC's buffers once per process. Strings in
 * `opts` are copied. */
FERRY_API int ferry_client_new(const ferry_client_options_t *opts,
                               ferry_client_t **out, ferry_error_t *err);

/* Waits up to timeout_ms (-1: forever) for the next batch. Returns 0 and
 * sets *batch, FERRY_EPOCH_END (once per epoch, after its last batch),
 * FERRY_END (the job is over), FERRY_ETIMEDOUT, or an error whose message
 * carries a worker's or the dispatcher's text (e.g. the file and byte
 * offset of a corrupt record under policy fail; the dispatcher out of
 * reach for dispatcher_timeout_ms, a failed augmentation or CUDA call).
 * Errors other than FERRY_ETIMEDOUT are final: every later call returns
 * the same. At most `prefetch` batches may be held unreleased: asking for
 * another fails with FERRY_EINVAL. Waits on a condition variable (no
 * polling); the time spent inside counts as the trainer's wait in the
 * stats (including an augmentation that ferry_next had to run itself
 * because no reader had done it yet). */
FERRY_API int ferry_next(ferry_client_t *c, const ferry_batch_t **batch,
                         int timeout_ms, ferry_error_t *err);

/* Returns a batch's memory to the client (batches may be released in any
 * order). NULL is ignored. With GPU staging the client may overwrite the
 * batch's device buffers as soon as this returns: the trainer's device
 * work that reads `output` must be finished (e.g. its stream
 * synchronised), or use ferry_batch_release_after. */
FERRY_API void ferry_batch_release(ferry_client_t *c,
                                   const ferry_batch_t *batch);

/* ferry_batch_release for work still queued: the client's next write into
 * the batch's device buffers waits (on the device, not the host) for
 * everything enqueued on `stream` (a cudaStream_t; NULL is the legacy
 * default stream) before this call. The same as ferry_batch_release for
 * host batches. */
FERRY_API void ferry_batch_release_after(ferry_client_t *c,
                                         const ferry_batch_t *batch,
                                         void *stream);

/* Exports a held batch's `output` as a DLPack tensor without a copy:
 * shape (size, height, width, channels) for NHWC and raw batches, (size,
 * channels, height, width) for NCHW; strides NULL (compact row-major);
 * dtype uint8 (raw), float32, float16 or bfloat16; device kDLCPU (host
 * batches) or kDLCUDA with the batch's device id.
 *
 * Ownership: the tensor takes over the trainer's hold on the batch. The
 * trainer must not call ferry_batch_release on it any more; the consumer
 * (PyTorch's from_dlpack, JAX, CuPy) calls the tensor's deleter exactly
 * once when it is done, which releases the batch as
 * ferry_batch_release_after(c, batch, NULL) does (ordered after the
 * legacy default stream: a consumer on another stream must synchronise
 * it first). The DLManagedTensor and its shape are the batch slot's own
 * (no allocation) and are valid until the deleter runs, which must happen
 * before ferry_client_free. With GPU staging the consumer must wait on
 * `ready_event` first (DLPack carries no event). A batch can be exported
 * once: a second call fails with FERRY_EINVAL, as does a batch not held. */
FERRY_API int ferry_batch_to_dlpack(ferry_client_t *c,
                                    const ferry_batch_t *batch,
                                    DLManagedTensor **out);

/* For a batch from ferry_next (held, or exported with
 * ferry_batch_to_dlpack and not yet deleted): makes CUDA stream `stream`
 * (a cudaStream_t; NULL: the legacy default stream of the batch's device)
 * wait on the device for the batch's ready_event (cudaStreamWaitEvent),
 * so work enqueued on it afterwards reads the finished `output`; the host
 * does not wait. Returns 0 and does nothing for host batches;
 * FERRY_EINVAL for a batch that is not this client's or not held;
 * FERRY_EIO with CUDA's message. */
FERRY_API int ferry_batch_wait_stream(ferry_client_t *c,
                                      const ferry_batch_t *batch, void *stream,
                                      ferry_error_t *err);

/* Counters since ferry_client_new; `records` counts records handed out
 * (a remainder dropped under drop_remainder is not). Callers write
 * ferry_client_stats(c, &st): the macro passes the caller's sizeof, and
 * the library writes only that many bytes (ferry_client_stats_t, like the
 * options, only grows at its end). */
FERRY_API void ferry_client_stats_sized(ferry_client_t *c,
                                        ferry_client_stats_t *out,
                                        size_t size);
#define ferry_client_stats(c, out)                                          \
  ferry_client_stats_sized((c), (out), sizeof *(out))

/* Ranks (options.world_size > 1): the batches every rank receives in the
 * trainer's current epoch, known from ferry_client_new on (learning-rate
 * schedules and Keras need it before the epoch starts; the same in every
 * epoch but one resumed with another world size, which shares only what
 * the cursor's ranks left), and the records of each epoch that no rank
 * receives (drop_remainder; 0 under padding). Both 0 for a client
 * without ranks. */
FERRY_API uint64_t ferry_client_steps_per_epoch(const ferry_client_t *c);
FERRY_API uint64_t ferry_client_dropped_per_epoch(const ferry_client_t *c);

/* Checkpoint cursors, at most this many bytes. */
#define FERRY_CLIENT_CURSOR_MAX 4096

/* Writes the client's cursor into buf (cap bytes), *len its size: where
 * the job stands for this rank's trainer, the batch after the last one
 * ferry_next handed out (every rank of a synchronous job at the same step
 * writes the same cursor, so any rank's restores the job). Save it with
 * the model's checkpoint and give it back as options.resume. Versioned,
 * opaque, at most FERRY_CLIENT_CURSOR_MAX bytes. FERRY_ENOTSUP without
 * order deterministic; FERRY_ERANGE when cap is too small. */
FERRY_API int ferry_client_state(ferry_client_t *c, void *buf, size_t cap,
                                 size_t *len, ferry_error_t *err);

/* The job's id and this client's id within it, for ferryctl and logs. */
FERRY_API uint64_t ferry_client_job_id(const ferry_client_t *c);
FERRY_API uint64_t ferry_client_id(const ferry_client_t *c);

/* Memory the library holds right now, process-wide: live bytes and
 * allocations made through its allocator (every client, batch ring and
 * message buffer). Either pointer may be NULL. For leak checks. */
FERRY_API void ferry_memory_stats(int64_t *bytes, int64_t *blocks);

/* Says goodbye to the dispatcher (a last heartbeat with leaving set: its
 * splits go back to the pool from what the trainer received), cancels the
 * streams, joins the threads and frees everything, batches included.
 * Takes at most about 2 s with an unreachable dispatcher. NULL is fine.
 *
 * Fork: in a process forked after the client was created, every call on
 * it fails at once with FERRY_EFORKED (ferry_next, ferry_batch_to_dlpack,
 * ferry_batch_wait_stream; releases do nothing, stats are zeros), and
 * this frees nothing and calls nothing: the client's memory is leaked on
 * purpose (the parent's pages, copy-on-write), the parent's threads,
 * sockets and gRPC state are left alone. */
FERRY_API void ferry_client_free(ferry_client_t *c);

#ifdef __cplusplus
}
#endif

#endif /* FERRY_CLIENT_H */
