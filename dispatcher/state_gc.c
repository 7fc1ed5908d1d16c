/* Timeouts (lost workers and clients) and garbage collection of jobs and
 * datasets: the periodic tick. */
#include "state_internal.h"
#include "state_apply.h"
#include "state_leases.h"

static void expire_workers(ferry_disp_t *d) {
  for (size_t i = 0; i < d->nworkers; i++) {
    worker_t *w = d->workers[i];
    Ferry__V1__JournalWorkerLost m = FERRY__V1__JOURNAL_WORKER_LOST__INIT;
    if (w->lost || d->now - w->last_hb < d->cfg.worker_timeout_ms)
      continue;
    /* A worker whose last heartbeat said draining sent it on its way out
     * (SIGTERM): its silence is a clean exit, which alerts on lost
     * workers must not count. */
    if (w->draining)
      FERRY_LOG(FERRY_LOG_INFO,
                "worker %" PRIu64 " (%s) left: drained, last heartbeat %" PRId64
                " ms ago",
                w->id, w->address, d->now - w->last_hb);
    else
      FERRY_LOG(FERRY_LOG_WARN,
                "worker %" PRIu64 " (%s) lost: no heartbeat for %" PRId64
                " ms",
                w->id, w->address, d->now - w->last_hb);
    m.worker_id = w->id;
    m.left = w->draining;
    ENTRY(e, WORKER_LOST, worker_lost, m);
    ferry__disp_commit(d, &e, NULL);
  }
}

static void expire_clients(ferry_disp_t *d) {
  for (size_t i = 0; i < d->njobs; i++) {
    job_t *j = d->jobs[i];
    for (size_t c = 0; c < j->nclients; c++) {
      client_t *cl = &j->clients[c];
      if (!cl->active || d->now - cl->last_hb < d->cfg.client_timeout_ms)
        continue;
      FERRY_LOG(FERRY_LOG_WARN, "job %" PRIu64 ": client %" PRIu64 " lost",
                j->id, cl->id);
      ferry__disp_emit_client_left(d, j, cl->id, true);
    }
  }
}

static void collect_jobs(ferry_disp_t *d) {
  size_t i = d->njobs;
  while (i-- > 0) {
    job_t *j = d->jobs[i];
    Ferry__V1__JournalJobGC m = FERRY__V1__JOURNAL_JOB_GC__INIT;
    if (j->idle_since < 0 || d->now - j->idle_since < d->cfg.job_gc_ms)
      continue;
    FERRY_LOG(FERRY_LOG_INFO, "job %" PRIu64 " garbage-collected", j->id);
    m.job_id = j->id;
    ENTRY(e, JOB_GC, job_gc, m);
    ferry__disp_commit(d, &e, NULL);
  }
}

/* Datasets no job used for job_gc_ms. */
static void collect_datasets(ferry_disp_t *d) {
  size_t i = d->nds;
  while (i-- > 0) {
    dataset_t *ds = d->ds[i];
    Ferry__V1__JournalDatasetGC m = FERRY__V1__JOURNAL_DATASET_GC__INIT;
    if (ds->idle_since < 0 || d->now - ds->idle_since < d->cfg.job_gc_ms ||
        ferry__disp_dataset_used(d, ds))
      continue;
    char id[FERRY_DISP_MAX_NAME_LEN + 1];
    /* A copy: the entry is serialized after it is applied (freed). */
    snprintf(id, sizeof(id), "%s", ds->id);
    FERRY_LOG(FERRY_LOG_INFO, "dataset %s garbage-collected", id);
    m.dataset_id = id;
    ENTRY(e, DATASET_GC, dataset_gc, m);
    ferry__disp_commit(d, &e, NULL);
  }
}

/* Unreachable reports of clients gone, and every report on a lost
 * worker. */
static void prune_unreachable(ferry_disp_t *d) {
  for (size_t i = 0; i < d->nworkers; i++)
    if (d->workers[i]->nunreach > 0)
      ferry__disp_prune_unreachable(d, d->workers[i], d->workers[i]->lost);
}

void ferry__disp_tick(ferry_disp_t *d, int64_t now_ms) {
  d->now = now_ms;
  expire_workers(d);
  expire_clients(d);
  prune_unreachable(d);
  collect_jobs(d);
  collect_datasets(d);
  ferry__disp_schedule(d);
}
