/* libferry: the trainer-side client of a Ferry cluster.
 *
 * A client registers a dataset (a pipeline spec) with the dispatcher, joins
 * or creates a job, streams its splits' chunks from every worker and
 * assembles fixed-size batches:
 *
 *   ferry_client_options_t o;
 *   ferry_client_options_init(&o);
 *   o.dispatcher = "127.0.0.1:5050";
 *   o.spec = "tfrecord(\"/data/*.tfrecord\") | decode(raw, 32, 32, 3) | "
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
 * Threads: ferry_next, ferry_batch_release and ferry_client_stats may be
 * called from any one thread at a time (the trainer's); the library runs
 * its own heartbeat and stream-reader threads. ferry_client_free must not
 * race with the others.
 */
#ifndef FERRY_CLIENT_H
#define FERRY_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ferry/error.h"

/* ferry_next's results besides 0 and errors. */
#define FERRY_EPOCH_END 1 /* every record of the epoch was delivered */
#define FERRY_END 2       /* the job is finished: every epoch delivered */

typedef enum {
  FERRY_MODE_DISTRIBUTED_EPOCH = 0, /* each record once per epoch, overall */
  FERRY_MODE_PARALLEL_EPOCHS = 1    /* each worker produces everything */
} ferry_job_mode_t;

typedef struct ferry_client_options_s {
  const char *dispatcher; /* "host:port" (required) */
  const char *spec;       /* pipeline spec text, or */
  const char *dataset_id; /* an id from an earlier registration */
  const char *job_name;   /* NULL or "": an anonymous, private job */
  ferry_job_mode_t mode;
  int64_t num_epochs;     /* 0: the spec's repeat() (default 1); -1: forever */
  int shuffle;            /* -1: as the spec says; 0 off; 1 on */
  uint64_t shuffle_seed;
  int error_policy;       /* FERRY_ON_ERROR_FAIL (default) or _SKIP */
  uint32_t batch_size;    /* 0: the spec's batch() */
  bool drop_remainder;    /* drop each epoch's last partial batch */
  uint32_t prefetch;      /* batches assembled ahead (default 4) */
  uint32_t splits_in_flight; /* splits held at once (default 8) */
  uint32_t heartbeat_ms;  /* default 250 */
  uint32_t connect_timeout_ms; /* dispatcher answer deadline (default 5000) */
} ferry_client_options_t;

/* A batch: `size` records (batch_size, except a final partial batch), NHWC
 * uint8 images and one int64 label and record id per record. Owned by the
 * client; valid until ferry_batch_release. */
typedef struct ferry_batch_s {
  const uint8_t *images;
  const int64_t *labels;
  const uint64_t *ids; /* file index << 40 | record index in the file */
  uint32_t size;
  uint32_t height, width, channels;
  uint32_t epoch;
  uint64_t index;      /* batch number within the job */
} ferry_batch_t;

typedef struct ferry_client_stats_s {
  uint64_t batches;
  uint64_t records;
  uint64_t bytes;
  double wait_seconds;   /* time spent inside ferry_next waiting */
  double total_seconds;  /* since ferry_client_new */
  double stall_fraction; /* wait / total */
  uint32_t workers;      /* worker streams open */
} ferry_client_stats_t;

void ferry_client_options_init(ferry_client_options_t *opts);

typedef struct ferry_client_s ferry_client_t;

/* Connects, registers the dataset and gets or creates the job. Returns 0
 * or an error with `err` naming the cause (an invalid spec, missing files,
 * an unreachable dispatcher) within connect_timeout_ms. Strings in `opts`
 * are copied. */
int ferry_client_new(const ferry_client_options_t *opts, ferry_client_t **out,
                     ferry_error_t *err);

/* Waits up to timeout_ms (-1: forever) for the next batch. Returns 0 and
 * sets *batch, FERRY_EPOCH_END (once per epoch, after its last batch),
 * FERRY_END (the job is over), FERRY_ETIMEDOUT, or an error whose message
 * carries a worker's or the dispatcher's text (e.g. the file and byte
 * offset of a corrupt record under policy fail). At most `prefetch`
 * batches may be held unreleased. */
int ferry_next(ferry_client_t *c, const ferry_batch_t **batch, int timeout_ms,
               ferry_error_t *err);

/* Returns a batch's memory to the client. */
void ferry_batch_release(ferry_client_t *c, const ferry_batch_t *batch);

void ferry_client_stats(ferry_client_t *c, ferry_client_stats_t *out);

/* The job's id and this client's id, for ferryctl and logs. */
uint64_t ferry_client_job_id(const ferry_client_t *c);

/* Says goodbye to the dispatcher (its splits go back to the pool), closes
 * the streams and frees everything. NULL is fine. */
void ferry_client_free(ferry_client_t *c);

#endif /* FERRY_CLIENT_H */
