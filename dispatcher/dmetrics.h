/* The dispatcher's Prometheus metrics (docs/OPERATIONS.md, "Metrics").
 * Counters are updated where the event happens (state_apply.c's commit, the
 * journal); the gauges of the state (workers, jobs, splits, per-job
 * figures) are computed at scrape time on the loop thread, which owns the
 * state: the scrape asks the loop through a uv_async and waits (bounded). */
#ifndef FERRY_DMETRICS_H
#define FERRY_DMETRICS_H

#include <stdbool.h>
#include <uv.h>

#include "ferry/metrics.h"
#include "ferry/v1/journal.pb-c.h"

typedef struct ferry__dmetrics_s {
  ferry_metric_t *leases;        /* ferry_dispatcher_leases_granted_total */
  ferry_metric_t *relets;        /* ..._leases_regranted_total */
  ferry_metric_t *workers_lost;  /* ..._workers_lost_total */
  ferry_metric_t *workers_left;  /* ..._workers_left_total */
  ferry_metric_t *clients_lost;  /* ..._clients_lost_total */
  ferry_metric_t *appends;       /* ..._journal_appends_total */
  ferry_metric_t *fsync;         /* ..._journal_fsync_seconds (ns) */
  ferry_metric_t *write_failures; /* ..._journal_write_failures_total */
  ferry_metric_t *snapshots;      /* ..._snapshots_total */
} ferry__dmetrics_t;

const ferry__dmetrics_t *ferry__dmetrics(void);

/* Counts a committed journal entry (state_apply.c); `relet`: an assignment of a
 * split that had a lease before in this epoch. */
void ferry__dmetrics_committed(const Ferry__V1__JournalEntry *e, bool relet);

struct ferry_disp_s;
struct ferry_journal_s;
typedef struct ferry__dmetrics_gauges_s ferry__dmetrics_gauges_t;

/* Starts the scrape-time collector for the state `d` and journal `j` on
 * `loop` (loop thread). NULL when out of memory. */
ferry__dmetrics_gauges_t *ferry__dmetrics_attach(uv_loop_t *loop,
                                                 struct ferry_disp_s *d,
                                                 struct ferry_journal_s *j);
/* Loop thread: removes the collector (a scrape waiting on the loop gives
 * up at once) and closes its handle; freed once closed. */
void ferry__dmetrics_detach(ferry__dmetrics_gauges_t *g);

#endif /* FERRY_DMETRICS_H */
