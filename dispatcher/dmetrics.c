/* The dispatcher's metrics (dmetrics.h). */
#include "dmetrics.h"

#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "alloc.h"
#include "ferry/v1/dispatcher.pb-c.h"
#include "job_names.h"

/* How long a scrape waits for the loop thread to compute the gauges
 * before it answers with the previous values. */
#define COLLECT_WAIT_MS 2000

struct ferry__dmetrics_gauges_s {
  ferry__dmetrics_t m; /* the object main.c holds */
  uv_async_t async;
  ferry_disp_t *d;
  ferry_journal_t *j;
  pthread_mutex_t lock;
  pthread_cond_t cv;
  uint64_t asked, done; /* generations */
  bool closed;
  ferry_metric_family_t *f_workers, *f_jobs, *f_splits, *f_jbytes, *f_sbytes,
      *f_stall, *f_bps, *f_wanted, *f_delivered, *f_live, *f_unreach;
};

static ferry_metric_t *counter(ferry_metrics_t *r, const char *name,
                               const char *help) {
  return ferry__metric_get(ferry__metrics_family(r, FERRY_METRIC_COUNTER, name,
                                                 help, NULL, 1, NULL, 0));
}

/* The families of the gauges computed at scrape time (compute below). */
#define F(name) offsetof(ferry__dmetrics_gauges_t, name)
static const struct {
  size_t f;
  ferry_metric_type_t type;
  const char *name, *help, *labels;
  double scale;
} families[] = {
    {F(f_jbytes), FERRY_METRIC_GAUGE, "ferry_dispatcher_journal_bytes",
     "Size of the journal file.", NULL, 1},
    {F(f_sbytes), FERRY_METRIC_GAUGE, "ferry_dispatcher_snapshot_bytes",
     "Size of the last snapshot written or loaded (0: none).", NULL, 1},
    {F(f_workers), FERRY_METRIC_GAUGE, "ferry_dispatcher_workers",
     "Workers known to the dispatcher, by state (as ferryctl workers "
     "shows it).",
     "state", 1},
    {F(f_jobs), FERRY_METRIC_GAUGE, "ferry_dispatcher_jobs", "Jobs by state.",
     "state", 1},
    {F(f_splits), FERRY_METRIC_GAUGE, "ferry_dispatcher_splits",
     "Splits of the jobs' current epochs by state (waiting: no lease; "
     "leased; done).",
     "state", 1},
    {F(f_unreach), FERRY_METRIC_GAUGE, "ferry_worker_unreachable_clients",
     "Clients whose streams to the worker fail (a wrong --advertise, a TLS "
     "certificate that does not name its address) and that still report "
     "it; their splits avoid it. Workers not lost.",
     "worker,address", 1},
    {F(f_stall), FERRY_METRIC_GAUGE, "ferry_job_stall_fraction",
     "Fraction of time the job's trainers wait for batches (mean of its "
     "live clients over their last heartbeat interval; with none, the "
     "whole-run figure of its last report).",
     "job,name", 1e-6},
    {F(f_bps), FERRY_METRIC_GAUGE, "ferry_job_batches_per_second",
     "Batches per second the job's live clients take (summed; 0 with no "
     "live client).",
     "job,name", 1e-3},
    {F(f_live), FERRY_METRIC_GAUGE, "ferry_job_live_clients",
     "Clients of the job whose figures are current (a report within "
     "max(2 s, 4 heartbeat intervals)).",
     "job,name", 1},
    {F(f_wanted), FERRY_METRIC_GAUGE, "ferry_job_workers_wanted",
     "Workers the job needs for its trainers to stall at most "
     "--target-stall-fraction (docs/OPERATIONS.md).",
     "job,name", 1},
    {F(f_delivered), FERRY_METRIC_COUNTER, "ferry_job_records_delivered_total",
     "Records the job's clients acknowledged, all epochs (ferryctl "
     "status: delivered_all).",
     "job,name", 1},
};
#undef F

/* Defines the families (defining one twice returns the first). */
static void define(ferry__dmetrics_gauges_t *g) {
  ferry__dmetrics_t *dm = &g->m;
  ferry_metrics_t *r = ferry__metrics_default();
  static const double fsync_bounds[] = {1e-4, 3e-4, 1e-3, 3e-3, 1e-2,
                                        3e-2, 0.1,  0.3,  1,    3};
  dm->leases = counter(r, "ferry_dispatcher_leases_granted_total",
                       "Split leases granted to workers (re-grants "
                       "included).");
  dm->relets = counter(r, "ferry_dispatcher_leases_regranted_total",
                       "Leases of splits that had been leased before in the "
                       "same epoch (a worker or client was lost, a stream "
                       "restarted).");
  dm->workers_lost = counter(r, "ferry_dispatcher_workers_lost_total",
                             "Workers declared lost (no heartbeat for "
                             "--worker-timeout-ms) that had not said they "
                             "were draining.");
  dm->workers_left = counter(r, "ferry_dispatcher_workers_left_total",
                             "Workers that left cleanly: silent for "
                             "--worker-timeout-ms after a heartbeat that "
                             "said draining (SIGTERM).");
  dm->clients_lost = counter(r, "ferry_dispatcher_clients_lost_total",
                             "Clients declared lost (no heartbeat for "
                             "--client-timeout-ms, or a stalled stream).");
  dm->appends = counter(r, "ferry_dispatcher_journal_appends_total",
                        "Entries appended to the journal.");
  dm->fsync = ferry__metric_get(ferry__metrics_family(
      r, FERRY_METRIC_HISTOGRAM, "ferry_dispatcher_journal_fsync_seconds",
      "Seconds one journal batch (the entries of every call since the "
      "last: group commit) or compaction took to write and fdatasync.",
      NULL, 1e-9, fsync_bounds,
      sizeof(fsync_bounds) / sizeof(fsync_bounds[0])));
  dm->write_failures = counter(
      r, "ferry_dispatcher_journal_write_failures_total",
      "Journal batches whose write or fdatasync failed (ENOSPC, EIO): their "
      "calls failed and the state was rebuilt from disk.");
  dm->snapshots = counter(r, "ferry_dispatcher_snapshots_total",
                          "Snapshots written (compactions).");
  for (size_t i = 0; i < sizeof(families) / sizeof(families[0]); i++)
    *(ferry_metric_family_t **)((char *)g + families[i].f) =
        ferry__metrics_family(r, families[i].type, families[i].name,
                              families[i].help, families[i].labels,
                              families[i].scale, NULL, 0);
}

/* ---- Scrape-time values -------------------------------------------------- */

/* Loop thread: the counters and gauges from the state and the journal. */
static void compute(ferry__dmetrics_gauges_t *g) {
  Ferry__V1__GetStatusResponse resp = FERRY__V1__GET_STATUS_RESPONSE__INIT;
  ferry_arena_t a = {0};
  int64_t now = (int64_t)(uv_hrtime() / 1000000); /* ferry__disp_now_ms */
  ferry_disp_counters_t c;
  ferry__disp_counters(g->d, &c);
  ferry__metric_set(g->m.leases, (int64_t)c.leases);
  ferry__metric_set(g->m.relets, (int64_t)c.relets);
  ferry__metric_set(g->m.workers_lost, (int64_t)c.workers_lost);
  ferry__metric_set(g->m.workers_left, (int64_t)c.workers_left);
  ferry__metric_set(g->m.clients_lost, (int64_t)c.clients_lost);
  ferry__metric_set(g->m.appends, (int64_t)ferry__journal_appends(g->j));
  ferry__metric_set(ferry__metric_get(g->f_jbytes),
                    (int64_t)ferry__journal_size(g->j));
  ferry__metric_set(ferry__metric_get(g->f_sbytes),
                    (int64_t)ferry__journal_snapshot_size(g->j));
  uint64_t splits[3];
  static const char *const split_states[3] = {"waiting", "leased", "done"};
  ferry__disp_split_counts(g->d, splits);
  for (int i = 0; i < 3; i++)
    ferry__metric_set(ferry__metric_get1(g->f_splits, split_states[i]),
                      (int64_t)splits[i]);
  if (ferry__disp_status(g->d, "", &resp, &a, now) == 0) {
    /* Workers: the states seen now (a state with none drops out). */
    ferry__metric_family_clear(g->f_workers);
    for (size_t i = 0; i < resp.n_workers; i++)
      ferry__metric_add(
          ferry__metric_get1(g->f_workers, resp.workers[i]->state), 1);
    ferry__metric_family_clear(g->f_unreach);
    for (size_t i = 0; i < resp.n_workers; i++) {
      const Ferry__V1__WorkerStatus *ws = resp.workers[i];
      char id[24];
      if (strcmp(ws->state, "lost") == 0 || strcmp(ws->state, "left") == 0)
        continue;
      snprintf(id, sizeof(id), "%" PRIu64, ws->worker_id);
      const char *v[2] = {id, ws->address != NULL ? ws->address : ""};
      ferry__metric_set(ferry__metric_child(g->f_unreach, v),
                        ws->unreachable_clients);
    }
    /* Jobs: every state, 0 included. */
    const ProtobufCEnumDescriptor *jd = &ferry__v1__job_state__descriptor;
    for (unsigned v = 0; v < jd->n_values; v++) {
      int64_t n = 0;
      for (size_t i = 0; i < resp.n_jobs; i++)
        n += (int)resp.jobs[i]->state == jd->values[v].value;
      const char *name = ferry__job_state_name(jd->values[v].value);
      ferry__metric_set(ferry__metric_get1(g->f_jobs, name), n);
    }
    ferry__metric_family_clear(g->f_stall);
    ferry__metric_family_clear(g->f_bps);
    ferry__metric_family_clear(g->f_wanted);
    ferry__metric_family_clear(g->f_delivered);
    ferry__metric_family_clear(g->f_live);
    for (size_t i = 0; i < resp.n_jobs; i++) {
      const Ferry__V1__JobStatus *js = resp.jobs[i];
      char id[24];
      snprintf(id, sizeof(id), "%" PRIu64, js->job_id);
      const char *v[2] = {id, js->name != NULL ? js->name : ""};
      ferry__metric_set_double(ferry__metric_child(g->f_stall, v),
                               js->stall_fraction);
      /* A dead client's last rate is no rate now. */
      ferry__metric_set_double(ferry__metric_child(g->f_bps, v),
                               js->live_clients > 0 ? js->batches_per_second
                                                    : 0.0);
      ferry__metric_set(ferry__metric_child(g->f_live, v), js->live_clients);
      ferry__metric_set(ferry__metric_child(g->f_wanted, v),
                        js->workers_wanted);
      ferry__metric_set(ferry__metric_child(g->f_delivered, v),
                        (int64_t)js->delivered_all);
    }
  }
  ferry__arena_free(&a);
}

static void on_async(uv_async_t *h) {
  ferry__dmetrics_gauges_t *g = h->data;
  pthread_mutex_lock(&g->lock);
  uint64_t asked = g->asked;
  bool closed = g->closed;
  pthread_mutex_unlock(&g->lock);
  if (!closed)
    compute(g);
  pthread_mutex_lock(&g->lock);
  g->done = asked;
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->lock);
}

/* The registry's collector (the HTTP thread): asks the loop, waits. */
static void collect(void *arg) {
  ferry__dmetrics_gauges_t *g = arg;
  pthread_mutex_lock(&g->lock);
  if (!g->closed) {
    uint64_t gen = ++g->asked;
    uv_async_send(&g->async);
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += COLLECT_WAIT_MS / 1000;
    while (!g->closed && g->done < gen &&
           pthread_cond_timedwait(&g->cv, &g->lock, &until) != ETIMEDOUT) {
    }
  }
  pthread_mutex_unlock(&g->lock);
}

ferry__dmetrics_t *ferry__dmetrics_attach(uv_loop_t *loop, ferry_disp_t *d,
                                          ferry_journal_t *j) {
  ferry__dmetrics_gauges_t *g = ferry__calloc(1, sizeof(*g));
  if (g == NULL)
    return NULL;
  g->m.gauges = g;
  g->d = d;
  g->j = j;
  define(g);
  pthread_mutex_init(&g->lock, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&g->cv, &ca);
  pthread_condattr_destroy(&ca);
  if (uv_async_init(loop, &g->async, on_async) != 0) {
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->lock);
    ferry__free(g);
    return NULL;
  }
  g->async.data = g;
  if (ferry__metrics_add_collector(ferry__metrics_default(), collect, g) != 0) {
    g->closed = true;
    ferry__dmetrics_detach(&g->m);
    return NULL;
  }
  return &g->m;
}

static void on_closed(uv_handle_t *h) {
  ferry__dmetrics_gauges_t *g = h->data;
  pthread_cond_destroy(&g->cv);
  pthread_mutex_destroy(&g->lock);
  ferry__free(g);
}

void ferry__dmetrics_detach(ferry__dmetrics_t *m) {
  if (m == NULL)
    return;
  ferry__dmetrics_gauges_t *g = m->gauges;
  pthread_mutex_lock(&g->lock);
  g->closed = true;
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->lock);
  /* Waits for a render in progress (it returns now that closed is set). */
  ferry__metrics_remove_collector(ferry__metrics_default(), collect, g);
  uv_close((uv_handle_t *)&g->async, on_closed);
}
