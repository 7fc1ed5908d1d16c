/* ClientHeartbeat: progress, restarts, binding more rows, and the answer
 * with every row bound to the client. */
#include <stdlib.h>

#include "state_internal.h"
#include "state_apply.h"
#include "state_jobs.h"
#include "state_leases.h"
#include "state_unreach.h"

/* Commits one Progress entry with the rows whose delivered count grew. */
/* The row a client's SplitProgress is about: of the current epoch, bound
 * to that client and not done; -1 otherwise. */
static int64_t reported_row(const job_t *j, uint64_t client,
                            const Ferry__V1__SplitProgress *p) {
  int64_t r = p->epoch == j->epoch ? ferry__disp_row_of(j, p->split,
                                                        p->worker_id, client,
                                                        p->lease)
                                   : -1;
  if (r < 0 || j->rows[r].client != client || j->rows[r].done)
    return -1;
  return r;
}

static int record_progress(ferry_disp_t *d, job_t *j, uint64_t client,
                           const Ferry__V1__ClientHeartbeatRequest *req) {
  Ferry__V1__JournalProgress m = FERRY__V1__JOURNAL_PROGRESS__INIT;
  Ferry__V1__JournalRowDelivered *rows;
  Ferry__V1__JournalRowDelivered **ptrs;
  int rc = 0;

  if (req->n_progress == 0 || !j->started || !RUNNING(j))
    return 0;
  rows = ferry__calloc(req->n_progress, sizeof(*rows));
  ptrs = ferry__calloc(req->n_progress, sizeof(*ptrs));
  if (rows == NULL || ptrs == NULL)
    goto out;
  for (size_t i = 0; i < req->n_progress; i++) {
    const Ferry__V1__SplitProgress *p = req->progress[i];
    int64_t r = reported_row(j, client, p);
    row_t *row = r >= 0 ? &j->rows[r] : NULL;
    uint64_t v;
    if (row == NULL)
      continue;
    /* A client never acknowledges more than the split holds. */
    if (row->total_known && p->delivered > row->total)
      FERRY_LOG(FERRY_LOG_WARN,
                "job %" PRIu64 ": client %" PRIu64 " reports %" PRIu64
                " records of epoch %u split %u, which holds %" PRIu64
                ": counted as %" PRIu64,
                j->id, client, p->delivered, j->epoch,
                ferry__disp_row_split(j, (uint64_t)r), row->total,
                row->total);
    v = row->total_known && p->delivered > row->total ? row->total
                                                      : p->delivered;
    /* Nor more than its binding's end (the rest is another
     * rank's). */
    if (j->row_end != NULL && j->row_end[r] != 0 && v > j->row_end[r])
      v = j->row_end[r];
    if (v <= row->delivered)
      continue;
    /* It acknowledged records: it reads (ferry__disp_bind_rows). */
    client_t *cl = ferry__disp_find_client(j, client);
    if (cl != NULL)
      cl->proven = true;
    ferry__v1__journal_row_delivered__init(&rows[m.n_rows]);
    rows[m.n_rows].row = (uint32_t)r;
    rows[m.n_rows].delivered = v;
    ptrs[m.n_rows] = &rows[m.n_rows];
    m.n_rows++;
  }
  if (m.n_rows > 0) {
    m.job_id = j->id;
    m.epoch = j->epoch;
    m.rows = ptrs;
    ENTRY(e, PROGRESS, progress, m);
    rc = ferry__disp_commit(d, &e, NULL);
  }
out:
  ferry__free(rows);
  ferry__free(ptrs);
  return rc;
}

/* Re-leases the rows the client asks to restart: it lost records of them
 * in transit (a broken stream to a live worker), so their lease cannot
 * complete. Only a row still bound to the client, not done, leased, and
 * at the lease the client names: a restart for an older lease (a retried
 * or delayed request, after the re-lease it asked for) is stale. As for
 * a lost worker, the new lease starts at `delivered` with lease + 1; the
 * old task is cancelled by the worker's next heartbeat diff. */
static void restart_rows(ferry_disp_t *d, job_t *j, uint64_t client,
                         const Ferry__V1__ClientHeartbeatRequest *req) {
  if (!j->started || !RUNNING(j))
    return;
  for (size_t i = 0; i < req->n_progress; i++) {
    const Ferry__V1__SplitProgress *p = req->progress[i];
    int64_t r;
    row_t *row;
    if (!p->restart || (r = reported_row(j, client, p)) < 0)
      continue;
    row = &j->rows[r];
    /* A restart names the lease whose chunks were lost; an older one is
     * stale (a gap left by a superseded lease's straggler), except for a
     * restart of whatever is current (the client dropped what it held,
     * or its stream to the row's worker broke). */
    if (row->worker == 0 || p->lease > row->lease ||
        (row->lease != p->lease && !p->restart_current))
      continue;
    if (ferry__disp_restart_row(d, j, (uint32_t)r) != 0)
      return;
  }
}

/* Puts the rows the client gives up (SplitProgress.release) back into
 * the pool from their delivered count: an answer marked them `unread`
 * (their worker saw no stream of the client for --client-idle-ms: a
 * trainer that does not read, a worker out of descriptors), and the
 * client took no record of their lease, holds none it has not handed
 * out, and takes no chunk of that lease any more. The client stopped acting before it said so, so
 * nothing of the lease reaches its trainer after this: the row's next
 * holder starts where the trainer stands. Only a row still bound to the
 * client at the lease it names, leased and not done; its delivered count
 * is the one the client reports (recorded just before). Journaled as a
 * row's change of client; the worker's task is cancelled by its lease
 * diff, and the row avoids that worker for a while (it may be the one
 * the client cannot reach). The client is not fenced. */
static void release_rows(ferry_disp_t *d, job_t *j, uint64_t client,
                         const Ferry__V1__ClientHeartbeatRequest *req) {
  if (!j->started || !RUNNING(j) || PAR(j))
    return;
  for (size_t i = 0; i < req->n_progress; i++) {
    const Ferry__V1__SplitProgress *p = req->progress[i];
    int64_t r;
    row_t *row;
    if (!p->release || (r = reported_row(j, client, p)) < 0)
      continue;
    row = &j->rows[r];
    /* A row waiting for a worker keeps its lease generation until it is
     * leased (a new one then): giving that up again would only bind it
     * back to the asking client, once per heartbeat. */
    if (row->worker == 0 || row->lease != p->lease)
      continue;
    uint64_t worker = row->worker;
    FERRY_LOG(FERRY_LOG_INFO,
              "job %" PRIu64 ": client %" PRIu64 " took no record of epoch "
              "%u split %u (lease %" PRIu64 " on worker %" PRIu64 "): back "
              "to the pool at %" PRIu64,
              j->id, client, j->epoch, ferry__disp_row_split(j, (uint64_t)r),
              row->lease, worker, row->delivered);
    if (ferry__disp_emit_assign(d, j, (uint32_t)r, 0, 0, row->lease,
                                row->delivered, 0) != 0)
      return;
    row->avoid = worker;
    row->avoid_until = d->now + d->cfg.client_idle_ms;
  }
}

static int fill_workers(ferry_disp_t *d, Ferry__V1__ClientHeartbeatResponse *r,
                        ferry_arena_t *a) {
  r->workers = ferry__arena_alloc(a, (d->nworkers + 1) * sizeof(void *));
  if (r->workers == NULL)
    return FERRY_ENOMEM;
  for (size_t i = 0; i < d->nworkers; i++) {
    Ferry__V1__WorkerInfo *wi;
    if (d->workers[i]->lost)
      continue;
    if ((wi = ferry__arena_alloc(a, sizeof(*wi))) == NULL)
      return FERRY_ENOMEM;
    ferry__v1__worker_info__init(wi);
    wi->worker_id = d->workers[i]->id;
    wi->address = d->workers[i]->address;
    wi->endpoints = d->workers[i]->endpoints;
    wi->n_endpoints = d->workers[i]->n_endpoints;
    r->workers[r->n_workers++] = wi;
  }
  return 0;
}

typedef struct ranked_s {
  uint32_t rank, row;
} ranked_t;

static int cmp_ranked(const void *a, const void *b) {
  uint32_t x = ((const ranked_t *)a)->rank, y = ((const ranked_t *)b)->rank;
  return x < y ? -1 : x > y;
}

static int fill_assignments(ferry_disp_t *d, job_t *j, uint64_t client,
                            Ferry__V1__ClientHeartbeatResponse *r,
                            ferry_arena_t *a) {
  /* The client's rows not done are on the active list. */
  ranked_t *mine = ferry__arena_alloc(a, (j->nactive + 1) * sizeof(*mine));
  uint32_t n = 0;
  r->assignments = ferry__arena_alloc(a, (j->nactive + 1) * sizeof(void *));
  if (r->assignments == NULL || mine == NULL)
    return FERRY_ENOMEM;
  for (uint32_t k = 0; k < j->nactive; k++) {
    const row_t *row = &j->rows[j->active[k].row];
    if (row->client == client && !row->done)
      mine[n++] = (ranked_t){row->rank, j->active[k].row};
  }
  /* In hand-out order, so the client reads splits in the epoch's order. */
  qsort(mine, n, sizeof(*mine), cmp_ranked);
  for (uint32_t i = 0; i < n; i++) {
    const row_t *row = &j->rows[mine[i].row];
    worker_t *w = row->worker ? ferry__disp_find_worker(d, row->worker) : NULL;
    Ferry__V1__Assignment *as;
    if (row->client != client || row->done)
      continue;
    if ((as = ferry__arena_alloc(a, sizeof(*as))) == NULL)
      return FERRY_ENOMEM;
    ferry__v1__assignment__init(as);
    as->epoch = j->epoch;
    as->split = ferry__disp_row_split(j, mine[i].row);
    as->num_records = row->total_known ? row->total : 0;
    as->worker_id =
        w != NULL ? w->id : ferry__disp_row_pinned(j, mine[i].row);
    as->worker_address = w != NULL ? w->address : "";
    as->lease = row->lease;
    as->start = row->delivered;
    as->end = j->row_end != NULL ? j->row_end[mine[i].row] : 0;
    if (j->part_roff != NULL)
      as->rank_index = j->part_roff[mine[i].row] + row->delivered -
                       j->part_base[mine[i].row];
    const active_t *act = ferry__disp_row_active(j, row);
    as->unread = act != NULL && row->worker != 0 &&
                 act->unread_lease == row->lease;
    r->assignments[r->n_assignments++] = as;
  }
  return 0;
}

/* True when no row of the current epoch waits for a client; for a client
 * of a ranked job, when its rank's quota is all bound or
 * taken: nothing more of the epoch comes to it. */
static bool exhausted(job_t *j, uint64_t client) {
  const client_t *c;
  if (j->world_size > 0 && (c = ferry__disp_find_client(j, client)) != NULL &&
      c->rank >= 0)
    return ferry__disp_rank_unbound(j, c->rank) == 0;
  return ferry__disp_first_free(j) >= j->nrows;
}

/* What the client's trainer may be told when no batch comes: workers
 * serving, draining, stopped (left), lost, and those this client's splits
 * avoid. */
static int fill_worker_counts(ferry_disp_t *d, const job_t *j,
                              uint64_t client,
                              Ferry__V1__ClientHeartbeatResponse *r,
                              ferry_arena_t *a) {
  Ferry__V1__WorkerCounts *wc = ferry__arena_alloc(a, sizeof(*wc));
  if (wc == NULL)
    return FERRY_ENOMEM;
  ferry__v1__worker_counts__init(wc);
  for (size_t i = 0; i < d->nworkers; i++) {
    const worker_t *w = d->workers[i];
    if (w->lost && w->left)
      wc->left++;
    else if (w->lost)
      wc->lost++;
    else if (w->draining || w->op_drained)
      wc->draining++;
    else if (w->beats > 0) {
      wc->serving++;
      wc->avoided += ferry__disp_unreachable_for(d, w, j->id, client);
    }
  }
  r->worker_counts = wc;
  return 0;
}

static int fill_client_resp(ferry_disp_t *d, job_t *j, uint64_t client,
                            Ferry__V1__ClientHeartbeatResponse *r,
                            ferry_arena_t *a, ferry_error_t *err) {
  r->state = j->state;
  r->epoch = j->epoch;
  r->epochs_done = j->epochs_done;
  r->epoch_exhausted = !RUNNING(j) || (j->started && exhausted(j, client));
  if (j->state == FERRY__V1__JOB_STATE__JOB_STATE_FAILED ||
      j->state == FERRY__V1__JOB_STATE__JOB_STATE_CANCELLED) {
    r->error_code = j->error_code;
    r->error = j->error != NULL ? j->error : "";
  }
  if (fill_workers(d, r, a) != 0 ||
      fill_worker_counts(d, j, client, r, a) != 0 ||
      (RUNNING(j) && fill_assignments(d, j, client, r, a) != 0))
    return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
  return 0;
}

int ferry__disp_client_heartbeat(ferry_disp_t *d,
                                 const Ferry__V1__ClientHeartbeatRequest *req,
                                 Ferry__V1__ClientHeartbeatResponse *resp,
                                 ferry_arena_t *a, int64_t now_ms,
                                 ferry_error_t *err) {
  job_t *j = ferry__disp_find_job(d, req->job_id);
  client_t *c = j != NULL ? ferry__disp_find_client(j, req->client_id) : NULL;
  int rc;

  d->now = now_ms;
  if (req->n_progress > FERRY_DISP_MAX_PROGRESS ||
      req->want_splits > FERRY_DISP_MAX_WANT)
    return ferry__seterr(err, FERRY_EINVAL,
                         "client heartbeat: over %d progress entries or %d "
                         "splits wanted",
                         FERRY_DISP_MAX_PROGRESS, FERRY_DISP_MAX_WANT);
  if ((rc = ferry__disp_check_unreachable(req, err)) != 0)
    return rc;
  if (j == NULL)
    return ferry__seterr(err, FERRY_ENOENT, "job %" PRIu64 " not found",
                         req->job_id);
  if (c == NULL)
    return ferry__seterr(err, FERRY_ENOENT,
                         "client %" PRIu64 " not found in job %" PRIu64,
                         req->client_id, req->job_id);
  /* Only the client that joined (its secret) touches its state. */
  if (c->has_secret &&
      (req->client_secret.len != FERRY_CLIENT_SECRET_BYTES ||
       !ferry__rpc_bytes_equal(req->client_secret.data, c->secret,
                               FERRY_CLIENT_SECRET_BYTES))) {
    FERRY_LOG(FERRY_LOG_WARN,
              "ClientHeartbeat for job %" PRIu64 " client "
              "%" PRIu64 " without its secret: refused",
              j->id, c->id);
    return ferry__seterr(err, FERRY_EACCES,
                         "ClientHeartbeat: this caller is "
                         "not that client (wrong or missing client secret)");
  }
  /* A client declared lost comes back without its old rows; a ranked one
   * only while no other client took its rank meanwhile. */
  if (!c->active && !req->leaving && RUNNING(j) && c->rank >= 0 &&
      (rc = ferry__disp_check_rank(j, c->id, c->rank, err)) != 0)
    return rc;
  if (!c->active && !req->leaving && RUNNING(j)) {
    bool fenced = c->no_renew; /* lost for not reading */
    if ((rc = ferry__disp_emit_client_joined(
             d, j, req->client_id, c->has_secret ? c->secret : NULL, c->rank,
             err)) != 0)
      return rc;
    c = ferry__disp_find_client(j, req->client_id);
    if (fenced)
      c->rejoin_wait_until = now_ms + d->cfg.client_timeout_ms;
  }
  ferry__disp_stop_renewing_if_stalled(
      d, j, c, req->stalled_ms, "its streams (its trainer holds every batch)");
  /* A client being fenced (stalled stream) is not renewed: it expires. */
  if (!c->no_renew)
    c->last_hb = now_ms;
  if (req->stats != NULL) {
    c->stall_fraction = req->stats->stall_fraction;
    c->batches_per_second = req->stats->batches_per_second;
    c->batches = req->stats->batches;
    c->has_ival = req->stats->interval_seconds > 0;
    c->ival_stall = req->stats->interval_stall_fraction;
    c->ival_bps = req->stats->interval_batches_per_second;
    c->has_report = true;
    c->last_report = now_ms;
    c->ival_ms = c->has_ival && req->stats->interval_seconds < 3600
                     ? (int64_t)(req->stats->interval_seconds * 1e3)
                     : 0;
  }
  if (c->active)
    record_progress(d, j, c->id, req);
  if (c->active && !req->leaving && !c->no_renew)
    restart_rows(d, j, c->id, req);
  if (c->active && !req->leaving)
    release_rows(d, j, c->id, req);
  /* After the restarts: a row the client restarted already left the
   * worker it cannot reach (and avoids it); the rest move here. */
  if (req->n_unreachable > 0 || c->nunreach > 0)
    ferry__disp_record_unreachable(d, j, c, req);
  if (req->leaving && c->active)
    ferry__disp_emit_client_left(d, j, c->id, false);
  ferry__disp_schedule_job(d, j);
  if (!req->leaving && c->active && !c->no_renew) {
    ferry__disp_bind_rows(d, j, c->id, req->want_splits);
    ferry__disp_schedule_job(d, j);
  }
  resp->incarnation = c->incarnation;
  /* A client still lost here could not rejoin (its job no longer runs):
   * it is not renewed, or it would hand out what it still holds, records
   * its rows' new clients delivered (chaos seed 5037). Fenced, it drops
   * them and sees the job's end. */
  resp->fenced = c->no_renew || (!c->active && !req->leaving);
  resp->client_timeout_ms = d->cfg.client_timeout_ms;
  return fill_client_resp(d, j, c->id, resp, a, err);
}
