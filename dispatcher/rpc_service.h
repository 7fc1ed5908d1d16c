/* The dispatcher's RPC service: what main.c sets up and the RPC files
 * share. The files, bottom to top: rpc_commit.c (group commit: answers
 * held until the journal made them durable), rpc_wait.c (long-polled
 * worker heartbeats), rpc_register.c (RegisterDataset off the loop),
 * rpc_handlers.c (methods, roles, dispatch); each declares its functions
 * in a header of its own name and calls only those below it. Not
 * installed; loop thread only. */
#ifndef FERRY_DISP_RPC_SERVICE_H
#define FERRY_DISP_RPC_SERVICE_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "ferry/error.h"
#include "journal.h"
#include "metrics.h"
#include "rpc.h"
#include "state.h"

typedef struct ferry_disp_service_s ferry_disp_service_t;

/* Dispatcher methods: the five of the protocol's core, DrainWorker and
 * CancelJob. */
#define FERRY_DISP_N_METHODS 7

/* Called once when the state cannot be rebuilt from disk after a failed
 * batch: the daemon must stop. */
typedef void (*ferry_disp_fatal_cb)(const ferry_error_t *err, void *arg);

typedef struct ferry_disp_binding_s {
  ferry_disp_service_t *svc;
  int method;
} ferry_disp_binding_t;

/* A worker heartbeat held back (long poll); private to rpc_wait.c. */
typedef struct ferry_disp_wait_s ferry_disp_wait_t;

/* A RegisterDataset call whose file I/O runs on libuv's thread pool;
 * private to rpc_register.c. */
typedef struct ferry_disp_regcall_s ferry_disp_regcall_t;

/* An answer held until the journal is durable up to its position;
 * private to rpc_commit.c. */
typedef struct ferry_disp_held_s ferry_disp_held_t;

/* RegisterDataset calls in progress at once; more are refused with
 * RESOURCE_EXHAUSTED (each holds a spec and, scanned, its splits). */
#define FERRY_DISP_MAX_REGISTERING 64

/* Calls that wait for one registration in progress of the same dataset
 * (each a few dozen bytes); more are refused with RESOURCE_EXHAUSTED. */
#define FERRY_DISP_MAX_REG_FOLLOWERS 4096

struct ferry_disp_service_s {
  ferry_disp_t *state;
  ferry_journal_t *journal; /* NULL: no journal (tests) */
  /* What the group commit counts as its batches end: the journal's fsync
   * histogram, write failures and snapshots. dmetrics.c defines them and
   * main.c sets them (NULL: not counted; they live as long as the
   * process's registry). */
  struct {
    ferry_metric_t *fsync, *write_failures, *snapshots;
  } metrics;
  const char *version;
  ferry_disp_fatal_cb fatal;
  void *fatal_arg;
  bool failed; /* the state could not be rebuilt: the daemon stops */
  ferry_disp_binding_t bindings[FERRY_DISP_N_METHODS];

  /* Group commit (rpc_commit.c): answers held in journal order, the
   * batch in flight, and compaction once the journal exceeds
   * max(compact_bytes, 2 x the last snapshot) (0: never). The commit
   * tells the held-back heartbeats, above it, through the two hooks
   * ferry__disp_rpc_register sets: what was appended is durable (or
   * nothing was pending), and a batch failed (`why`: the text their calls
   * fail with). */
  ferry_disp_held_t *held, **held_tail;
  size_t n_held;
  uv_work_t sync_req;
  int sync_rc;
  ferry_error_t sync_err;
  bool compacting;
  uint64_t compact_segment;
  int64_t compact_ms; /* the last snapshot's capture, on the loop */
  struct ferry_disp_snap_s *snap; /* the compaction's capture */
  uint64_t compact_bytes;
  bool need_boot; /* a rebuild from disk needs a new boot entry */
  bool sync_per_call; /* no group commit: a batch per call, on the loop */
  void (*on_durable)(ferry_disp_service_t *svc);
  void (*on_failed)(ferry_disp_service_t *svc, const char *why);

  /* Held-back worker heartbeats (see ferry__disp_worker_may_wait). Calls
   * wait only between ferry__disp_rpc_start and ferry__disp_rpc_stop. */
  ferry_disp_wait_t *waiting;
  uint64_t waiting_changes; /* ferry__disp_changes at their last check */
  uv_timer_t wait_timer;    /* the earliest interval's end */
  bool can_wait;

  /* RegisterDataset calls whose globs, stats and scans run on the
   * loop's thread pool (only between ferry__disp_rpc_start and
   * ferry__disp_rpc_stop; without them a registration runs inline). */
  uv_loop_t *loop;
  ferry_disp_regcall_t *registering;
  size_t n_registering;

  /* Bearer tokens per role; NULL: the role is open. Checked on
   * every Dispatcher call: WorkerHeartbeat needs the worker token,
   * RegisterDataset, GetOrCreateJob and ClientHeartbeat the client
   * token, GetStatus the status token or either of the others. */
  const char *worker_token, *client_token, *status_token;
  /* DrainWorker and CancelJob need this one (it allows
   * GetStatus too, job errors included). NULL: those methods are open
   * only while no role has a token; else refused to every caller. */
  const char *admin_token;
  /* Set for the call being handled: the caller may read every job's
   * error text in GetStatus (it holds the status token, or no token is
   * configured at all). Job errors name files and offsets of that job's
   * data; other callers see them through their own job only. */
  bool call_sees_errors;
};

/* Milliseconds of the monotonic clock the state machine runs on. */
static inline int64_t ferry__disp_now_ms(void) {
  return (int64_t)(uv_hrtime() / 1000000);
}

#endif /* FERRY_DISP_RPC_SERVICE_H */
