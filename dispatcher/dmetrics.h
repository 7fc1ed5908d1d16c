/* The dispatcher's Prometheus metrics (docs/OPERATIONS.md, "Metrics").
 * Nothing below calls into them: the state and the journal keep their own
 * counts, which the collector reads at scrape time with the gauges of the
 * state (workers, jobs, splits, per-job figures), on the loop thread that
 * owns them (the scrape asks the loop through a uv_async and waits,
 * bounded). The group commit (rpc_commit.c), which owns the journal's
 * batches, counts them into the three metrics main.c hands it. */
#ifndef FERRY_DMETRICS_H
#define FERRY_DMETRICS_H

#include <stdbool.h>
#include <uv.h>

#include "journal.h"
#include "metrics.h"
#include "state.h"

typedef struct ferry__dmetrics_gauges_s ferry__dmetrics_gauges_t;

typedef struct ferry__dmetrics_s {
  /* Counted by the group commit as batches end (main.c hands them to it:
   * ferry_disp_service_t.metrics). */
  ferry_metric_t *fsync;          /* ..._journal_fsync_seconds (ns) */
  ferry_metric_t *write_failures; /* ..._journal_write_failures_total */
  ferry_metric_t *snapshots;      /* ..._snapshots_total */
  /* Set at scrape time from ferry__disp_counters and the journal. */
  ferry_metric_t *leases;        /* ferry_dispatcher_leases_granted_total */
  ferry_metric_t *relets;        /* ..._leases_regranted_total */
  ferry_metric_t *workers_lost;  /* ..._workers_lost_total */
  ferry_metric_t *workers_left;  /* ..._workers_left_total */
  ferry_metric_t *clients_lost;  /* ..._clients_lost_total */
  ferry_metric_t *appends;       /* ..._journal_appends_total */
  ferry__dmetrics_gauges_t *gauges; /* private: the collector */
} ferry__dmetrics_t;

/* Loop thread: defines the dispatcher's metrics in the process's registry
 * and starts the scrape-time collector for the state `d` and journal `j`
 * on `loop`. NULL when out of memory. */
ferry__dmetrics_t *ferry__dmetrics_attach(uv_loop_t *loop, ferry_disp_t *d,
                                          ferry_journal_t *j);
/* Loop thread: removes the collector (a scrape waiting on the loop gives
 * up at once) and closes its handle; `m` is freed once closed (the
 * metrics it points to stay in the registry). NULL-safe. */
void ferry__dmetrics_detach(ferry__dmetrics_t *m);

#endif /* FERRY_DMETRICS_H */
