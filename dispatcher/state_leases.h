/* Binding rows to clients and leasing them to workers (state_leases.c):
 * the task counts and the worker heap, epochs, restarts, stalled
 * clients. Commits through state_apply.c. */
#ifndef FERRY_DISPATCHER_STATE_LEASES_H
#define FERRY_DISPATCHER_STATE_LEASES_H

#include "state_internal.h"

/* Recomputes every worker's count of leased rows that are not done. */
void ferry__disp_recount(ferry_disp_t *d);

/* A worker that may take new leases: live, not draining, heard from by
 * this process, not behind on its heartbeats (missed more than two
 * intervals) and not suspected (a client lost its stream to it and it has
 * not heartbeated since). A dead worker is thus skipped long before its
 * timeout declares it lost. */
bool ferry__disp_eligible(const ferry_disp_t *d, const worker_t *w);

/* Epoch transitions and pending leases of every running job: after a
 * change that may touch any job (a worker's heartbeat, loss or drain,
 * the tick's expiries and the passing of time). */
void ferry__disp_schedule(ferry_disp_t *d);

/* The same for job `j` alone: after a change inside `j` (its clients'
 * heartbeats, a join). A client's heartbeat costs the rows of its own
 * job, not of every job: 500 jobs that heartbeat 20 times a second
 * otherwise spent the dispatcher's core walking each other's rows. Rows
 * of other jobs that wait for a worker, or for a backoff to pass, are
 * leased at the next tick (TICK_MS) or worker heartbeat. */
void ferry__disp_schedule_job(ferry_disp_t *d, job_t *j);

/* Records of the current epoch rank `rank` still needs beyond
 * what it took and what is bound to its clients (0 for an unranked job,
 * or before the epoch starts). */
uint64_t ferry__disp_rank_unbound(const job_t *j, int64_t rank);

/* Binds up to `want` unassigned rows of the current epoch to the client
 * (ranked jobs: only up to its rank's quota). */
void ferry__disp_bind_rows(ferry_disp_t *d, job_t *j, uint64_t client,
                           uint32_t want);

/* A client that has not read its streams for `stalled_ms` (its own
 * report, or a worker's of its stream; `source` says which) past
 * --client-stall-ms is no longer renewed: it expires one client timeout
 * after its last renewal and its rows go back to the pool. */
void ferry__disp_stop_renewing_if_stalled(ferry_disp_t *d, const job_t *j,
                                          client_t *c, uint64_t stalled_ms,
                                          const char *source);

/* The same, whatever --client-stall-ms: `c` (may be NULL) has not read
 * `source` for `stalled_ms`, logged as a warning once. */
void ferry__disp_stop_renewing(const job_t *j, client_t *c,
                               uint64_t stalled_ms, const char *source);

/* Re-leases row `r`, whose current lease cannot complete. The worker that
 * held it is suspected until it heartbeats again, and the row avoids it
 * for a backoff that doubles with each restart in a row (100 ms up to the
 * worker timeout), so a dead worker is not handed the same split again and
 * again before its timeout. A row restarted FERRY_DISP_MAX_RESTARTS times
 * without progress fails its job, naming it. */
int ferry__disp_restart_row(ferry_disp_t *d, job_t *j, uint32_t r);
/* The same for a row whose worker reports chunks sent into a stream that
 * ended early (TaskProgress.resend): the worker is not suspect, and may
 * take the row again. */
int ferry__disp_resend_row(ferry_disp_t *d, job_t *j, uint32_t r);

/* Re-leases every row of `client` leased to `w` and not done to another
 * worker, from its delivered count (as a restart, without counting one or
 * suspecting `w`): the client cannot reach `w`. distributed_epoch only
 * (parallel_epochs rows are pinned). Returns the rows moved. */
uint32_t ferry__disp_move_client_rows(ferry_disp_t *d, job_t *j,
                                      uint64_t client, const worker_t *w);

#endif /* FERRY_DISPATCHER_STATE_LEASES_H */
