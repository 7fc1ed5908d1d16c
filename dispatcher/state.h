/* The dispatcher's state machine: datasets and their split lists, jobs
 * with the split table of their current epoch, clients and workers.
 *
 * Single-threaded and I/O-free except for the header-only scan of the data
 * files at registration. Time is an argument (`now_ms`, any monotonic
 * clock), so tests drive it with a fake clock.
 *
 * Every change goes through one path: a journal entry
 * (proto/ferry/v1/journal.proto) is built, applied to the state, then
 * handed to the sink (the journal) in serialized form. Replaying the same
 * entries with ferry__disp_apply rebuilds the same state; decisions (which
 * row goes to which worker, when an epoch ends) are only ever taken by the
 * live calls below, never during replay.
 *
 * Requests and responses are the protobuf-c messages of
 * ferry/v1/dispatcher.proto. Responses are built in a caller-owned arena
 * (arena.h): everything they point to lives until ferry__arena_free.
 */
#ifndef FERRY_DISPATCHER_STATE_H
#define FERRY_DISPATCHER_STATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "arena.h"
#include "ferry/error.h"
#include "ferry/v1/dispatcher.pb-c.h"
#include "roots.h"

/* ---- Configuration ------------------------------------------------------ */

typedef struct ferry_disp_config_s {
  int64_t worker_timeout_ms; /* a worker without heartbeat is lost */
  int64_t client_timeout_ms; /* a client without heartbeat is lost */
  int64_t job_gc_ms;         /* finished or client-less jobs are dropped */
  uint32_t records_per_split; /* default split size */
  uint32_t heartbeat_ms;      /* told to workers */
  uint64_t max_record_len;    /* the scan ends a file at a longer header */
  /* A client whose stream to a worker has had chunks waiting this long
   * without taking one (the worker's TaskProgress.stalled_ms) stops being
   * renewed and loses its splits after client_timeout_ms; 0: never. */
  int64_t client_stall_ms;
  /* A split whose worker reports no stream of its client open this long
   * (TaskProgress.unread_ms) is marked unread in the client's answers
   * (Assignment.unread); a client that took no record of it then gives
   * it up (SplitProgress.release) and it goes back to the pool: a job's
   * claim on workers is earned by reading. The dispatcher takes nothing
   * back by itself; the client is not fenced. 0: never. */
  int64_t client_idle_ms;
  /* The directories datasets may be read from (not owned; NULL or empty:
   * any file). */
  const ferry_roots_t *roots;
  uint32_t max_datasets; /* registered at once (RESOURCE_EXHAUSTED past it);
                          * unused ones go after job_gc_ms */
  /* The stall fraction JobStatus.workers_wanted aims at. */
  double target_stall_fraction;
} ferry_disp_config_t;

/* Bounds on every request, checked before anything changes
 * (docs/PROTOCOL.md lists them). */
#define FERRY_DISP_MAX_PATTERNS 64      /* patterns in a spec */
#define FERRY_DISP_MAX_PATTERN_LEN 4096 /* bytes of one pattern */
#define FERRY_DISP_MAX_FILES 100000     /* files a spec expands to */
#define FERRY_DISP_MAX_NAME_LEN 256     /* job names, dataset ids */
#define FERRY_DISP_MAX_ADDRESS_LEN 256  /* a worker's address */
#define FERRY_DISP_MAX_PROGRESS 65536   /* SplitProgress / TaskProgress
                                           entries in one heartbeat */
#define FERRY_DISP_MAX_WANT 4096        /* splits asked for at once */
#define FERRY_DISP_MAX_WORLD_SIZE 8192  /* ranks of a job */
/* Rows bound to a client that has not read yet: a client that
 * asks for splits and never opens a stream holds no more than this many
 * tasks on the workers, however many it asks for. */
#define FERRY_DISP_UNREAD_ROWS 16
#define FERRY_DISP_MAX_ERROR_LEN 4096   /* a task's error text */
#define FERRY_DISP_MAX_UNREACHABLE 64   /* unreachable workers a client
                                           lists in one heartbeat */
#define FERRY_DISP_MAX_REASON_LEN 1024  /* ... and each one's reason */

/* Fills `cfg` with the defaults (10 s, 10 s, 60 s, 1024, 1000 ms,
 * FERRY_TFR_DEFAULT_MAX_RECORD, 30 s). */
void ferry__disp_config_init(ferry_disp_config_t *cfg);

typedef struct ferry_disp_s ferry_disp_t;

/* Receives each applied entry (a serialized ferry.v1.JournalEntry), valid
 * during the call only. */
typedef void (*ferry_disp_sink_cb)(const uint8_t *entry, size_t len,
                                   void *arg);

/* Creates an empty state; `cfg` is copied. Returns 0 or FERRY_ENOMEM. */
int ferry__disp_new(const ferry_disp_config_t *cfg, int64_t now_ms,
                    ferry_disp_t **out);
void ferry__disp_free(ferry_disp_t *d);

/* Installs the journal sink (NULL: none, e.g. while replaying). */
void ferry__disp_set_sink(ferry_disp_t *d, ferry_disp_sink_cb cb, void *arg);

/* Replays one serialized journal entry. Fails with FERRY_EINVAL when the
 * entry is malformed or does not fit the state (an unknown job, a row out
 * of range), FERRY_ESPEC for a bad stored spec, FERRY_ENOMEM. */
int ferry__disp_apply(ferry_disp_t *d, const uint8_t *entry, size_t len,
                      int64_t now_ms, ferry_error_t *err);

/* Ends a replay: every live worker and client counts as heartbeated at
 * `now_ms`, idle jobs start their GC delay from there, and every row
 * waits for a new lease (leases are not journaled). */
void ferry__disp_replayed(ferry_disp_t *d, int64_t now_ms);

/* Journals the start of this process (boot number = the last one + 1),
 * which keeps its lease generations above every earlier process's. Call
 * once after the replay, with the sink installed. Returns 0 or the
 * commit's error. */
int ferry__disp_boot(ferry_disp_t *d, ferry_error_t *err);

/* Consecutive restarts of one row without progress that fail its job. */
#define FERRY_DISP_MAX_RESTARTS 16

/* ---- RPCs ----------------------------------------------------------------
 * Each returns 0 with the response filled (in `a`), or a negative code
 * with `err` saying why for the client: FERRY_ESPEC (bad spec),
 * FERRY_ENOENT (missing file, empty glob, unknown dataset/job/client),
 * FERRY_EINVAL (bad options), FERRY_ENOMEM. */

/* Scans the spec's files into splits (or finds the dataset already
 * registered under the same fingerprint). Runs the five steps below
 * inline, file I/O included: for tests and callers without a loop. */
int ferry__disp_register_dataset(ferry_disp_t *d,
                                 const Ferry__V1__RegisterDatasetRequest *req,
                                 Ferry__V1__RegisterDatasetResponse *resp,
                                 ferry_arena_t *a, int64_t now_ms,
                                 ferry_error_t *err);

/* ---- RegisterDataset in steps ----------------------------------
 * The daemon runs the file I/O of a registration (globs, data roots, stat,
 * header scans) on libuv's thread pool and the rest on the loop:
 *   begin (loop)  -> expand (thread) -> reuse (loop) -> scan (thread)
 *   -> finish (loop) -> free (any).
 * A registration owns everything its thread steps touch (a copy of the
 * spec, the file list, the splits, its error); those steps (expand, scan,
 * cancel, free: scan.h) never touch ferry_disp_t, whose datasets the loop
 * reallocates and collects. An error in a step makes the later ones
 * no-ops and finish returns it. */
typedef struct ferry_disp_reg_s ferry_disp_reg_t;

/* Loop. Checks the request (no file I/O). Returns a negative code with
 * `err`; or 0 with *out NULL and `resp` filled when a dataset of that
 * fingerprint is registered already; or 0 with *out a registration to
 * run through the other steps. Commits nothing. */
int ferry__disp_reg_begin(ferry_disp_t *d,
                          const Ferry__V1__RegisterDatasetRequest *req,
                          Ferry__V1__RegisterDatasetResponse *resp,
                          ferry_arena_t *a, int64_t now_ms,
                          ferry_disp_reg_t **out, ferry_error_t *err);

/* True when `a` and `b` register the same dataset (fingerprint and split
 * size): one scan answers both. Loop; what it reads is set by
 * ferry__disp_reg_begin and never changes. */
bool ferry__disp_reg_same(const ferry_disp_reg_t *a,
                          const ferry_disp_reg_t *b);

/* The dataset id `r` registers. */
const char *ferry__disp_reg_id(const ferry_disp_reg_t *r);

/* Loop. Copies the splits of the files that a dataset of this process
 * scanned with the same parameters and that did not change since. */
void ferry__disp_reg_reuse(ferry_disp_t *d, ferry_disp_reg_t *r);

/* Loop. Returns the error of an earlier step; else answers with the
 * dataset registered meanwhile under the same fingerprint (two
 * concurrent registrations of one spec make one dataset), or checks the
 * dataset limit again and commits the new dataset. */
int ferry__disp_reg_finish(ferry_disp_t *d, ferry_disp_reg_t *r,
                           Ferry__V1__RegisterDatasetResponse *resp,
                           ferry_arena_t *a, int64_t now_ms,
                           ferry_error_t *err);

/* Joins the running job named in the options, or creates one (always for
 * an anonymous job); the caller becomes a new client of it. */
int ferry__disp_get_or_create_job(ferry_disp_t *d,
                                  const Ferry__V1__GetOrCreateJobRequest *req,
                                  Ferry__V1__GetOrCreateJobResponse *resp,
                                  ferry_arena_t *a, int64_t now_ms,
                                  ferry_error_t *err);

/* Records progress, binds up to want_splits more rows, answers with every
 * row bound to the client. */
int ferry__disp_client_heartbeat(ferry_disp_t *d,
                                 const Ferry__V1__ClientHeartbeatRequest *req,
                                 Ferry__V1__ClientHeartbeatResponse *resp,
                                 ferry_arena_t *a, int64_t now_ms,
                                 ferry_error_t *err);

/* Registers (worker_id 0 or an id the dispatcher does not know as live),
 * records task progress and answers with the diff of leases. */
int ferry__disp_worker_heartbeat(ferry_disp_t *d,
                                 const Ferry__V1__WorkerHeartbeatRequest *req,
                                 Ferry__V1__WorkerHeartbeatResponse *resp,
                                 ferry_arena_t *a, int64_t now_ms,
                                 ferry_error_t *err);

/* ---- Long-polled worker heartbeats ---------------------------------------
 * The daemon holds back a worker's heartbeat whose answer carries nothing
 * new, until a lease or a cancellation for that worker appears or the
 * heartbeat interval passed, so that workers learn of leases at once
 * without beating faster. The call counts as a heartbeat at its arrival. */

/* After ferry__disp_worker_heartbeat answered `req` with `resp`: true when
 * the call may wait. That needs a live worker already registered under
 * req->worker_id that heard the interval from this process before (its
 * first heartbeat since the start is always answered at once), not
 * draining, and an answer without new or cancelled tasks. */
bool ferry__disp_worker_may_wait(
    ferry_disp_t *d, const Ferry__V1__WorkerHeartbeatRequest *req,
    const Ferry__V1__WorkerHeartbeatResponse *resp);

/* Re-evaluates a waiting heartbeat: fills `resp` (in `a`) as the diff of
 * leases against req's tasks stands now, recording nothing, and returns
 * true when the call should be answered now: the answer carries a new
 * task or cancels one that req lists as not finished (a finished task's
 * cancellation stops no work and waits for the next answer), the worker
 * is no longer live, or out of memory (`err` set, `resp` incomplete). */
bool ferry__disp_worker_poll(ferry_disp_t *d,
                             const Ferry__V1__WorkerHeartbeatRequest *req,
                             Ferry__V1__WorkerHeartbeatResponse *resp,
                             ferry_arena_t *a, int64_t now_ms,
                             ferry_error_t *err);

/* The number of live journal entries committed so far: when it did not
 * change, no waiting heartbeat's answer can have changed either. */
uint64_t ferry__disp_changes(const ferry_disp_t *d);

/* Operator calls (the admin role; docs/PROTOCOL.md).
 * DrainWorker: journals that the worker (by id, or the newest live one at
 * the address) takes no new lease, and re-leases every row it held from
 * the row's delivered count (parallel_epochs: its pinned rows end with
 * loss), as for a lost worker. Idempotent; answers whether it is drained
 * (nothing leased, and a heartbeat since the drain listed no unfinished
 * task). A drained worker stays drained across dispatcher restarts until
 * it restarts itself (a new worker id). FERRY_ENOENT: no such worker. */
int ferry__disp_drain_worker(ferry_disp_t *d,
                             const Ferry__V1__DrainWorkerRequest *req,
                             Ferry__V1__DrainWorkerResponse *resp,
                             ferry_arena_t *a, int64_t now_ms,
                             ferry_error_t *err);

/* CancelJob: journals that the running job is cancelled. Its clients'
 * heartbeat answers then carry FERRY_ECANCELED and "job J cancelled by
 * the operator"; its workers' tasks are cancelled by their lease diffs.
 * A cancelled job answers `already`; a finished or failed one is
 * FERRY_EGRPC_FAILED_PRECONDITION; an unknown one FERRY_ENOENT. */
int ferry__disp_cancel_job(ferry_disp_t *d,
                           const Ferry__V1__CancelJobRequest *req,
                           Ferry__V1__CancelJobResponse *resp,
                           ferry_arena_t *a, int64_t now_ms,
                           ferry_error_t *err);

/* The workers a job needs (docs/OPERATIONS.md, "How many workers") so
 * that its trainers stall at most `target` of their time, from
 * the `n` workers serving now and its `k` clients' stall fractions and
 * batches per second: ceil(n * (1 - target) * sum(bps_i / (1 - stall_i))
 * / sum(bps_i)), never below n (a trainer that does not stall cannot say
 * how many fewer would do) and at least 1; n when nothing was delivered
 * yet. Stall fractions are capped at 0.99, the answer at 10000. */
uint32_t ferry__disp_workers_wanted(uint32_t n, const double *stall,
                                    const double *bps, size_t k,
                                    double target);

/* Splits of the jobs' current epochs by state, for the metrics:
 * out[0] waiting (no lease), out[1] leased, out[2] done. */
void ferry__disp_split_counts(const ferry_disp_t *d, uint64_t out[3]);

/* What this process's live calls did, counted as their entries are
 * committed (a replay counts nothing; ferry__disp_reset keeps them): the
 * metrics read them (dmetrics.c) rather than being called from here. */
typedef struct ferry_disp_counters_s {
  uint64_t leases;       /* leases granted, re-grants included */
  uint64_t relets;       /* ... of rows leased before in the same epoch */
  uint64_t workers_lost; /* declared lost without having said draining */
  uint64_t workers_left; /* silent after a heartbeat that said draining */
  uint64_t clients_lost; /* declared lost (timeout or stalled stream) */
} ferry_disp_counters_t;
void ferry__disp_counters(const ferry_disp_t *d, ferry_disp_counters_t *out);

/* Cluster status. `version` is copied into the response. */
int ferry__disp_status(ferry_disp_t *d, const char *version,
                       Ferry__V1__GetStatusResponse *resp, ferry_arena_t *a,
                       int64_t now_ms);

/* Timeouts (lost workers and clients), job GC, epoch transitions and
 * leasing of rows waiting for a worker. Call periodically. */
void ferry__disp_tick(ferry_disp_t *d, int64_t now_ms);

/* ---- Helpers shared with tests ------------------------------------------ */

/* The split order of an epoch: out[0..n) becomes a permutation of 0..n-1.
 * Without shuffle it is the identity; with shuffle a Fisher-Yates shuffle
 * driven by splitmix64 seeded with seed ^ (epoch * golden ratio), taking
 * each index modulo i+1 (the bias is below 2^-40 for n < 2^24). */
void ferry__disp_split_order(bool shuffle, uint64_t seed, uint32_t epoch,
                             uint32_t *out, uint32_t n);

/* Checks the split tables' indexes and the worker heap
 * (state_internal.h) against the rows and workers they index, recomputed
 * the slow way. Returns true, or false with what disagrees in `why`. */
bool ferry__disp_check_indexes(const ferry_disp_t *d, char *why, size_t cap);

#endif /* FERRY_DISPATCHER_STATE_H */
