/* The dispatcher's state machine, inside (state.h is its public face): the
 * types every part of it shares, and what state.c does with them. Each
 * other part declares what it gives the parts above it in a header of its
 * own name and calls only parts before it in this list, bottom to top:
 *   arena.c, check.c, scan.c (a registration's file I/O, off the loop):
 *     nothing of the state;
 *   state.c: lifetime, lookups, the rows' indexes, unreachable lists;
 *   state_ranks.c: ranks, resumes, elastic cuts;
 *   state_apply.c: journal entries, the commit path, the counters;
 *   state_leases.c: binding, leasing, restarts, epochs;
 *   state_jobs.c, state_unreach.c, state_figures.c;
 *   state_datasets.c, state_clients.c, state_gc.c, state_status.c;
 *   state_workers.c.
 * The state knows no journal file, metrics or RPC: its entries go to a
 * sink (ferry__disp_set_sink) and the metrics read its figures and
 * counters. See state.h and docs/ARCHITECTURE.md, "The service".
 *
 * Invariants:
 * - Only apply_*() functions mutate the journaled state, and each is a
 *   deterministic function of the state, the entry and `now` (which only
 *   feeds timers). Live calls decide, build entries and
 *   ferry__disp_commit() them.
 * - Volatile fields (heartbeat times, worker load, client stats, the
 *   per-worker task counts) are never journaled; ntasks is recomputed by
 *   ferry__disp_recount() before every leasing decision.
 * - A job's split table (rows) exists only for its current epoch, and only
 *   once that epoch started (`started`). Rows of an epoch are done when
 *   their total is known and delivered >= total, or, in parallel_epochs,
 *   when their pinned worker was lost (done-with-loss: those records are
 *   not produced again; the other workers' copies of the dataset are
 *   unaffected).
 * - A row is bound to at most one client (`client`, 0: unassigned) and
 *   leased to at most one worker (`worker`, 0: waiting for one). Every new
 *   lease gets the next generation (at least boot << 32, `boot` being
 *   journaled once per process, so above every earlier process's) and start =
 *   delivered, so a re-leased row resumes where the client's acknowledged
 *   count stands.
 * - Only the binding of a row to a client is journaled (JournalAssign).
 *   Which worker holds its lease, the generation and the start are
 *   volatile: a re-lease to another worker changes nothing durable, so it
 *   costs no journal write. After a replay every row waits for a worker
 *   (worker 0) and is leased again to workers that heartbeat to the new
 *   process; their old tasks are cancelled by the lease diff.
 */
#ifndef FERRY_DISPATCHER_STATE_INTERNAL_H
#define FERRY_DISPATCHER_STATE_INTERNAL_H

#include <inttypes.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "arena.h"
#include "check.h"
#include "ferry/log.h"
#include "ferry/v1/journal.pb-c.h"
#include "lease.h"
#include "rpc.h"
#include "scan.h"
#include "spec.h"
#include "state.h"

typedef Ferry__V1__JournalEntry entry_t;

typedef struct dataset_s {
  char *id;
  ferry_spec_t spec;
  uint8_t *spec_bytes; /* canonical serialization, sent in every Task */
  size_t spec_len;
  char **files;
  uint32_t nfiles;
  split_t *splits;
  uint32_t nsplits;
  uint64_t known_records; /* sum of the known split counts */
  scanned_t *scanned;     /* volatile, per file; NULL after a replay */
  uint32_t scan_per;      /* ... and the scan's records per split */
  int scan_compression;   /* ... and the spec's compression */
  int64_t idle_since;     /* volatile: unused by any job since (-1: used) */
} dataset_t;

/* One per split of a job's current epoch (per split and worker in
 * parallel_epochs; per part of a split a rank takes in a ranked job):
 * its split and pinned worker follow from its index
 * (ferry__disp_row_split, ferry__disp_row_pinned), not stored. */
typedef struct row_s {
  uint64_t client; /* 0: unassigned */
  uint64_t worker; /* lease holder; 0: none yet */
  uint64_t lease;  /* generation of the current lease; 0: never leased */
  uint64_t start;  /* first position of the current lease */
  uint64_t delivered;
  uint64_t total; /* valid when total_known */
  /* Volatile: the worker whose lease failed last, which the row avoids
   * until `avoid_until`, and the restarts in a row without progress. */
  uint64_t avoid;
  int64_t avoid_until;
  uint32_t restarts;
  /* Volatile indexes (job_t): the row's place in the hand-out order, and
   * 1 + its slot in the job's active list (0: not in it). */
  uint32_t rank;
  uint32_t act;
  bool total_known;
  bool done;
  bool lost; /* done-with-loss (parallel_epochs) */
} row_t;

/* Memory per split (the target: 200 bytes in all). */
_Static_assert(sizeof(row_t) <= 80, "row_t grew");

/* A row bound to a client and not done (job_t.active), with what only
 * such a row needs: its heartbeat mark and the skipped-count dedupe of
 * its lease. A row that leaves the list and comes back (unbound, bound
 * again) starts them afresh: it comes back with a new lease. */
typedef struct active_s {
  uint32_t row;
  uint64_t listed;     /* volatile: heartbeat generation that listed it */
  uint64_t skip_lease; /* skipped-count dedupe: last lease seen ... */
  uint64_t skip_seen;  /* ... and its cumulative count */
  /* Volatile: the lease whose worker reported its client without a
   * stream for --client-idle-ms (TaskProgress.unread_ms); the answer
   * marks the assignment `unread` while the lease is current. */
  uint64_t unread_lease;
} active_t;

typedef struct client_s {
  uint64_t id;
  bool active;
  uint64_t incarnation; /* joins after the first (journaled) */
  bool no_renew;        /* volatile: its stream stalled; heartbeats no
                         * longer renew its lease, so it expires */
  int64_t last_hb;
  double stall_fraction, batches_per_second; /* volatile stats */
  uint64_t batches;
  /* Volatile: the same over the last heartbeat interval. */
  double ival_stall, ival_bps;
  bool has_ival;
  /* Volatile: when its last stats arrived (has_report) and the interval
   * they covered (ms; 0: none yet), which say whether its figures are
   * still current (ferry__disp_client_live). */
  bool has_report;
  int64_t last_report;
  int64_t ival_ms;
  /* Volatile: entries on workers' unreachable lists for this client. */
  uint32_t nunreach;
  /* The secret its heartbeats and streams must carry (journaled;
   * none for clients of journals written before it). */
  uint8_t secret[FERRY_CLIENT_SECRET_BYTES];
  bool has_secret;
  /* The rank it holds in a job of world_size > 0 (journaled);
   * -1: none. */
  int64_t rank;
  /* Volatile: it has read: a worker produced records of one of
   * its splits (a task starts only while its client has a stream open)
   * or it acknowledged records. Until then it is bound at most
   * FERRY_DISP_UNREAD_ROWS rows (ferry__disp_bind_rows). */
  bool proven;
  /* Volatile: a client lost after its lease stopped being
   * renewed for not reading, back with a new incarnation, is bound
   * nothing until this time while another client of its job can take
   * the rows (ferry__disp_bind_rows): else a client that asks in every
   * heartbeat and never reads took back, within milliseconds of its
   * loss, the rows its loss had just freed for the others. */
  int64_t rejoin_wait_until;
} client_t;

typedef struct job_s {
  uint64_t id;
  char *name; /* "" for anonymous jobs */
  dataset_t *ds;
  int mode, policy;
  int64_t num_epochs; /* >= 1 or -1 */
  bool shuffle;
  uint64_t seed;
  int state;
  int error_code;
  char *error;
  uint32_t epoch;
  bool started;
  uint32_t epochs_done;
  row_t *rows;
  uint32_t nrows;
  uint32_t *order;      /* hand-out order of the rows */
  /* Indexes over the rows, so that no RPC walks every row:
   * `active` lists the rows bound to a client and not done (every lease
   * not done is among them), in no order; `ndone` counts the rows done;
   * every row before `free_from` in hand-out order is bound or done.
   * Kept by ferry__disp_row_changed after any change of a row's client
   * or done flag; rebuilt from the rows by apply_epoch_start. */
  struct active_s *active;
  uint32_t nactive;
  size_t active_cap;
  uint32_t ndone;
  uint32_t free_from;
  uint64_t *ep_workers; /* parallel_epochs: the epoch's workers */
  uint32_t n_ep_workers;
  client_t *clients;
  size_t nclients, clients_cap;
  uint64_t delivered_prev; /* records delivered in completed epochs */
  uint64_t skipped;
  uint64_t *skipped_by_file;
  int64_t idle_since; /* -1: busy; else when it became GC-able */
  /* Ranks (docs/ARCHITECTURE.md, "Ranks"). world_size W > 0:
   * each rank takes quota(r) records per epoch (ferry__disp_rank_quota),
   * bound in ranges [start, row_end[r]) so that no rank takes past its
   * quota; rank_taken[r] counts the records rank r acknowledged in the
   * current epoch (journaled through Progress: each row's growth counts
   * for the rank of the row's client). Both arrays live with the rows
   * of the current epoch (row_end: nrows, rank_taken: W). */
  uint32_t world_size, batch;
  bool pad;
  bool share; /* JobOptions.share: lease splits by affinity */
  /* The job was made to resume at a cursor: it starts at epoch
   * resume_epoch, each rank's first resume_step batches of it done
   * (ferry__disp_resume_rows, from apply_epoch_start). */
  uint32_t resume_epoch;
  uint64_t resume_step;
  /* Elastic: the resumed epoch's earlier cuts, oldest first
   * (JobOptions.resume_earlier): cut i's cut_world[i] ranks took their
   * first cut_step[i] batches of what the cuts before it left. The
   * resumed epoch shares only what they left, resume_left records
   * (ferry__disp_rank_records), among this job's ranks. */
  uint32_t ncuts;
  uint32_t *cut_world;
  uint64_t *cut_step;
  uint64_t resume_left;
  uint64_t *row_end;
  uint64_t *rank_taken;
  /* Ranked jobs: the epoch's rows are parts of splits, each taken by
   * one rank (ferry__disp_plan_ranks, from the epoch's split order and
   * the splits' counts alone, so replay and snapshots rebuild them): row
   * r is records [part_base[r], rows[r].total) of split part_split[r],
   * for rank part_rank[r] (FERRY__PART_DROPPED: dropped under
   * drop_remainder; FERRY__PART_TAKEN: taken before a resume's earlier
   * cuts, done from the start). A split
   * shared by two ranks is two rows, leased, produced and acknowledged
   * independently, so no rank waits for another's progress (ranks in
   * lockstep, as DDP's all-reduce makes them, would wait for each other
   * for ever). split_part[s] is the first row of split s, split_nparts
   * [s] its count. part_roff[r] is where the part starts in its rank's
   * share (deterministic assembly puts record part_base[r] + i
   * at the rank's position part_roff[r] + i). */
  uint32_t *part_split;
  uint64_t *part_base, *part_roff;
  int32_t *part_rank;
  uint32_t *split_part, *split_nparts;
} job_t;

/* A client that cannot reach a worker (ClientHeartbeatRequest
 * .unreachable), on that worker's list. Volatile: clients list it again
 * in every heartbeat while it lasts. */
typedef struct unreach_s {
  uint64_t job, client;
  uint32_t failures;   /* as the client counts them; growth: a new failure */
  uint32_t strikes;    /* new failures seen: the backoff doubles with each */
  int64_t avoid_until; /* the client's rows avoid the worker until then */
  uint64_t gen;        /* the heartbeat that listed it last */
} unreach_t;

typedef struct worker_s {
  uint64_t id;
  char *address;
  /* The transport endpoints its last heartbeat published, as client
   * heartbeats relay them (volatile, not journaled: every heartbeat
   * carries them); one allocation holding the messages and their bytes,
   * freed with ferry__free(endpoints). */
  Ferry__V1__TransportEndpoint **endpoints;
  size_t n_endpoints;
  bool lost;
  bool left; /* lost after a heartbeat that said draining: it exited */
  bool draining;
  int64_t last_hb;
  uint32_t threads;
  uint64_t buffer_bytes, buffer_free_bytes;
  uint32_t ntasks;       /* volatile: leased rows not done */
  uint64_t beats;        /* volatile: heartbeats answered since this process
                          * started (the first one is never held back) */
  int64_t suspect_since; /* volatile: a client lost its stream (-1: no);
                          * cleared by a heartbeat arriving after it */
  /* An operator drained it (journaled): no new lease while this
   * id lives. `drain_beats` (volatile) is `beats` when the drain was
   * applied: a heartbeat after it that lists no unfinished task
   * (`unfinished`, volatile, from the last heartbeat) confirms that
   * nothing runs on it any more. */
  bool op_drained;
  uint64_t drain_beats;
  uint32_t unfinished;
  uint32_t heap_pos; /* volatile: its slot in ferry_disp_t.heap, or
                      * UINT32_MAX when not in it */
  /* Volatile: clients that report it unreachable, the latest reason
   * (cleaned), when one last reported it (-1: never) and whether the
   * once-per-worker warning was logged. */
  unreach_t *unreach;
  uint32_t nunreach;
  size_t unreach_cap;
  char *unreach_reason;
  int64_t unreach_at;
  bool unreach_warned;
  /* Volatile: its prefix cache as its last heartbeat reported it (NULL:
   * none), unpacked with ferry__pb_allocator, and that message packed. */
  Ferry__V1__CacheReport *cache;
  uint8_t *cache_pb;
  size_t cache_len;
} worker_t;

struct ferry_disp_s {
  ferry_disp_config_t cfg;
  int64_t now, start;
  dataset_t **ds;
  size_t nds;
  job_t **jobs;
  size_t njobs;
  worker_t **workers;
  size_t nworkers;
  uint64_t next_job, next_client, next_worker;
  uint64_t boot; /* this process's boot number (JournalBoot) */
  uint64_t hb_gen;
  uint64_t unreach_gen; /* volatile: client heartbeats that listed any */
  uint64_t changes; /* live entries committed: wakes waiting heartbeats */
  ferry_disp_counters_t counters; /* volatile: kept by ferry__disp_reset */
  /* Snapshots (snapshot.c): the journal segment that follows the state
   * loaded, and while a snapshot is applied, its entries so far. */
  uint64_t segment;
  bool snap_open, snap_done;
  uint64_t snap_count;
  /* Snapshots being packed off the loop pin the datasets: one collected
   * meanwhile waits in `collected` until the last pin goes. */
  uint32_t snap_pins;
  dataset_t **collected;
  size_t ncollected;
  ferry_disp_sink_cb sink;
  void *sink_arg;
  uint8_t *scratch;
  size_t scratch_cap;
  /* Volatile: the eligible workers as a binary min-heap by
   * (ntasks, id), built by the first pick after each
   * ferry__disp_recount (heap_fresh) and kept as each lease adds a task,
   * so that picking the least loaded worker costs O(log workers), not a
   * walk of them all. heap_ok false (out of memory): the walk. */
  worker_t **heap;
  size_t nheap, heap_cap;
  bool heap_ok, heap_fresh;
  /* Volatile: `changes` when the task counts were last recounted; while
   * it has not moved (no entry applied, no re-lease) they still hold. */
  uint64_t recount_changes;
  bool recount_valid;
};

#define PAR(j) ((j)->mode == FERRY__V1__JOB_MODE__JOB_MODE_PARALLEL_EPOCHS)
#define RUNNING(j) ((j)->state == FERRY__V1__JOB_STATE__JOB_STATE_RUNNING)

/* A journal entry `e` of one kind, pointing at the message `msg`. */
#define ENTRY(e, kind, field, msg)                                             \
  entry_t e = FERRY__V1__JOURNAL_ENTRY__INIT;                                  \
  e.entry_case = FERRY__V1__JOURNAL_ENTRY__ENTRY_##kind;                       \
  e.field = &(msg)

/* state.c */

/* Appends one pointer to an array whose capacity is implied by its count:
 * 4, then doubling, so it is full when the count is 4 or a larger power
 * of two (removals only ever leave more room than implied). */
int ferry__disp_push_ptr(void ***arr, size_t *n, void *p);

/* Free a dataset, a job's rows of its current epoch, a job. */
void ferry__disp_free_dataset(dataset_t *ds);
void ferry__disp_free_rows(job_t *j);
void ferry__disp_free_job(job_t *j);
/* Frees every dataset, job and worker (the state is then empty; its
 * configuration, sink, scratch and counters stay). */
void ferry__disp_free_contents(ferry_disp_t *d);
/* Frees the datasets collected while snapshots pinned them. */
void ferry__disp_free_collected(ferry_disp_t *d);

/* Lookups by id: NULL when unknown (live_worker: or lost). */
dataset_t *ferry__disp_find_dataset(ferry_disp_t *d, const char *id);
job_t *ferry__disp_find_job(ferry_disp_t *d, uint64_t id);
worker_t *ferry__disp_find_worker(ferry_disp_t *d, uint64_t id);
client_t *ferry__disp_find_client(job_t *j, uint64_t id);
worker_t *ferry__disp_live_worker(ferry_disp_t *d, uint64_t id);

/* The row of the current epoch at index `row`, or NULL. */
row_t *ferry__disp_job_row(job_t *j, uint32_t epoch, uint32_t row);

/* The split of row `r` of the current epoch, and in parallel_epochs its
 * worker (each of the epoch's workers owns the block of rows
 * [slot * nsplits, ...); 0 in distributed_epoch). */
static inline uint32_t ferry__disp_row_split(const job_t *j, uint64_t r) {
  return j->part_split != NULL ? j->part_split[r]
                               : (uint32_t)(r % j->ds->nsplits);
}
static inline uint64_t ferry__disp_row_pinned(const job_t *j, uint64_t r) {
  return PAR(j) ? j->ep_workers[r / j->ds->nsplits] : 0;
}

/* The row index of (split, worker) in the current epoch, or -1. In
 * distributed_epoch the worker is irrelevant; in parallel_epochs each of
 * the epoch's workers owns the block of rows [slot * nsplits, ...). */
int64_t ferry__disp_row_index(const job_t *j, uint32_t split, uint64_t worker);

/* The row a report about `split` is about: in a ranked job the split's
 * part bound to `client` (non-zero; the part `lease` names when
 * non-zero) or leased as `lease`; else as
 * ferry__disp_row_index. -1: none. */
int64_t ferry__disp_row_of(const job_t *j, uint32_t split, uint64_t worker,
                           uint64_t client, uint64_t lease);

/* Row `r`'s client or done flag changed: updates the job's active list,
 * done count and first free rank. Returns 0 or FERRY_ENOMEM (the active
 * list could not grow; only when the row became active). `was_done`: the
 * row was done before the change. */
int ferry__disp_row_changed(job_t *j, uint32_t r, bool was_done);

/* The active list's entry of a row of `j` (NULL: not on it). */
static inline active_t *ferry__disp_row_active(const job_t *j,
                                               const row_t *row) {
  return row->act != 0 ? &j->active[row->act - 1] : NULL;
}

/* The first rank in hand-out order whose row is unbound and not done
 * (nrows: none), advancing the job's cursor. */
uint32_t ferry__disp_first_free(job_t *j);

/* Records delivered in the job's current epoch. */
uint64_t ferry__disp_epoch_delivered(const job_t *j);

size_t ferry__disp_active_clients(const job_t *j);

/* The job becomes GC-able from now on, unless it already is. */
void ferry__disp_mark_idle(ferry_disp_t *d, job_t *j);

/* The workers' unreachable lists (state_unreach.c records what clients
 * report). The entry of (job, client) on `w`'s list, or NULL; dropping
 * entry i of it (the last one takes its place). */
unreach_t *ferry__disp_unreach_find(const worker_t *w, uint64_t job,
                                    uint64_t client);
void ferry__disp_unreach_drop(ferry_disp_t *d, worker_t *w, uint32_t i);

/* True while `client` of job `job` reported `w` unreachable and its
 * backoff runs: that client's rows are not leased to `w`. */
bool ferry__disp_unreachable_for(const ferry_disp_t *d, const worker_t *w,
                                 uint64_t job, uint64_t client);

/* Clients of running jobs, still active, whose entries are on `w`. */
uint32_t ferry__disp_unreachable_count(ferry_disp_t *d, const worker_t *w);

/* Drops the entries of clients no longer active (tick), or every entry
 * (`all`: the worker registered again). */
void ferry__disp_prune_unreachable(ferry_disp_t *d, worker_t *w, bool all);

/* Frees a worker's lists. */
void ferry__disp_free_unreachable(worker_t *w);
/* Frees the prefix cache report a worker's heartbeat left (state.c). */
void ferry__disp_free_cache_report(worker_t *w);

#endif /* FERRY_DISPATCHER_STATE_INTERNAL_H */
