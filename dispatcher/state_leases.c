/* Decisions: which worker may take a lease and which one gets it, epoch
 * transitions, binding rows to clients, re-leases after a restart, and
 * the fencing of clients that stopped reading. */
#include "state_leases.h"
#include "state_apply.h"
#include "state_ranks.h"

/* The least loaded first: fewer tasks, then the lower id. */
static bool lighter(const worker_t *a, const worker_t *b) {
  return a->ntasks != b->ntasks ? a->ntasks < b->ntasks : a->id < b->id;
}

static void heap_sift_down(ferry_disp_t *d, size_t i) {
  worker_t **h = d->heap;
  for (;;) {
    size_t l = 2 * i + 1, r = l + 1, m = i;
    if (l < d->nheap && lighter(h[l], h[m]))
      m = l;
    if (r < d->nheap && lighter(h[r], h[m]))
      m = r;
    if (m == i)
      return;
    worker_t *t = h[i];
    h[i] = h[m];
    h[m] = t;
    h[i]->heap_pos = (uint32_t)i;
    h[m]->heap_pos = (uint32_t)m;
    i = m;
  }
}

/* Rebuilds the heap of eligible workers (state_internal.h). */
static void heap_build(ferry_disp_t *d) {
  d->heap_ok = false;
  d->nheap = 0;
  for (size_t i = 0; i < d->nworkers; i++)
    d->workers[i]->heap_pos = UINT32_MAX;
  if (!FERRY__GROW(d->heap, d->heap_cap, d->nworkers, 4))
    return; /* pick_worker walks the workers instead */
  for (size_t i = 0; i < d->nworkers; i++) {
    worker_t *w = d->workers[i];
    if (!ferry__disp_eligible(d, w))
      continue;
    w->heap_pos = (uint32_t)d->nheap;
    d->heap[d->nheap++] = w;
  }
  for (size_t i = d->nheap / 2; i-- > 0;)
    heap_sift_down(d, i);
  d->heap_ok = true;
}

void ferry__disp_recount(ferry_disp_t *d) {
  /* Eligibility moves with time and heartbeats: the next pick rebuilds
   * the heap. The counts move only with rows: changes counts those. */
  d->heap_fresh = false;
  if (d->recount_valid && d->recount_changes == d->changes)
    return;
  d->recount_valid = true;
  d->recount_changes = d->changes;
  for (size_t i = 0; i < d->nworkers; i++)
    d->workers[i]->ntasks = 0;
  for (size_t i = 0; i < d->njobs; i++) {
    job_t *j = d->jobs[i];
    if (!RUNNING(j))
      continue;
    /* Every lease not done is on a row of the active list. */
    for (uint32_t k = 0; k < j->nactive; k++) {
      const row_t *row = &j->rows[j->active[k].row];
      worker_t *w;
      if (row->worker == 0 || row->done)
        continue;
      w = ferry__disp_find_worker(d, row->worker);
      if (w != NULL)
        w->ntasks++;
    }
  }
}

bool ferry__disp_eligible(const ferry_disp_t *d, const worker_t *w) {
  int64_t late = 2 * (int64_t)d->cfg.heartbeat_ms + 500;
  return !w->lost && !w->draining && !w->op_drained && w->beats > 0 &&
         w->suspect_since < 0 && d->now - w->last_hb <= late;
}

/* True while `row` must not be leased to `w`: its last lease there
 * failed moments ago (backoff after a restart). */
static bool avoided(const ferry_disp_t *d, const row_t *row,
                    const worker_t *w) {
  return row != NULL && row->avoid == w->id && d->now < row->avoid_until;
}

/* True while rows of `client` of job `j` must not go to `w`: `row`
 * avoids it (backoff after a restart), or the client reported it
 * unreachable (state_unreach.c). */
static bool shunned(const ferry_disp_t *d, const job_t *j, uint64_t client,
                    const row_t *row, const worker_t *w) {
  return avoided(d, row, w) ||
         (j != NULL && ferry__disp_unreachable_for(d, w, j->id, client));
}

/* The eligible worker with the fewest tasks (lowest id on a tie) that
 * `row` (may be NULL) of `client` (0: none) does not avoid, or NULL. */
static worker_t *pick_worker(ferry_disp_t *d, const job_t *j, uint64_t client,
                             const row_t *row) {
  worker_t *best = NULL;
  if (!d->heap_fresh) {
    heap_build(d);
    d->heap_fresh = true;
  }
  if (d->heap_ok) {
    /* The heap's root, unless the row avoids it: then the lighter of the
     * root's children, the next in order, when neither of them is
     * shunned too (a client may shun several workers: then the walk). */
    if (d->nheap == 0 || !shunned(d, j, client, row, d->heap[0]))
      return d->nheap > 0 ? d->heap[0] : NULL;
    bool exact = true;
    for (size_t i = 1; i <= 2 && i < d->nheap; i++) {
      if (shunned(d, j, client, row, d->heap[i]))
        exact = false;
      else if (best == NULL || lighter(d->heap[i], best))
        best = d->heap[i];
    }
    if (exact)
      return best;
    best = NULL;
  }
  for (size_t i = 0; i < d->nworkers; i++) {
    worker_t *w = d->workers[i];
    if (!ferry__disp_eligible(d, w) || shunned(d, j, client, row, w))
      continue;
    if (best == NULL || lighter(w, best))
      best = w;
  }
  return best;
}

/* The row's next lease generation: one more than its current one, and at
 * least the floor of this process and the row's part (lease.h), so
 * that the first lease of a process is above every lease an earlier
 * process issued for the row without journaling it, and two parts of a
 * split never share a lease (a worker's task is (job, epoch, split,
 * lease); a client keys a split's parts by it). */
static uint64_t next_lease(const ferry_disp_t *d, const job_t *j,
                           const row_t *row) {
  uint32_t part = 0;
  if (j->part_split != NULL) {
    uint32_t r = (uint32_t)(row - j->rows);
    part = r - j->split_part[j->part_split[r]];
  }
  uint64_t floor = ferry__lease_floor(d->boot, part);
  return row->lease + 1 > floor ? row->lease + 1 : floor;
}

/* Binds row `r` to `client` and leases it to worker `w` (NULL: leaves it
 * waiting, worker 0) from its delivered count. Only a change of client is
 * journaled; a re-lease for the same client is volatile (see the
 * invariants) but still wakes waiting worker heartbeats. */
static int bind_row_end(ferry_disp_t *d, job_t *j, uint32_t r,
                        uint64_t client, worker_t *w, uint64_t end) {
  row_t *row = &j->rows[r];
  uint64_t worker = w != NULL ? w->id : 0;
  uint64_t lease = w != NULL ? next_lease(d, j, row) : row->lease;
  uint64_t start = w != NULL ? row->delivered : row->start;
  if (w != NULL) {
    w->ntasks++;
    if (d->heap_fresh && d->heap_ok && w->heap_pos != UINT32_MAX)
      heap_sift_down(d, w->heap_pos);
  }
  if (row->client != client)
    return ferry__disp_emit_assign(d, j, r, client, worker, lease, start,
                                   end);
  if (row->worker == worker && row->lease == lease)
    return 0;
  row->worker = worker;
  row->lease = lease;
  row->start = start;
  d->changes++;
  return 0;
}

/* bind_row_end for a binding to the split's end (or a re-lease for the
 * same client, which keeps its end). */
static int bind_row(ferry_disp_t *d, job_t *j, uint32_t r, uint64_t client,
                    worker_t *w) {
  return bind_row_end(d, j, r, client, w, 0);
}

static uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* Shared production (JobOptions.share): every sharing job's row of one
 * split of a dataset goes to the same worker, so the worker produces it
 * once for all of them. Rendezvous hashing over the eligible workers the
 * row does not shun: (dataset, split, worker) scores, the highest wins;
 * a worker joining or leaving moves only the splits it wins or held.
 * Walks the workers (sharing jobs only). NULL: none eligible. */
static worker_t *share_worker(ferry_disp_t *d, const job_t *j, uint32_t r,
                              uint64_t client, const row_t *row) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const char *p = j->ds->id; *p != '\0'; p++)
    h = (h ^ (uint8_t)*p) * 0x100000001b3ull;
  h ^= mix64((uint64_t)ferry__disp_row_split(j, r) + 1);
  worker_t *best = NULL;
  uint64_t best_score = 0;
  for (size_t i = 0; i < d->nworkers; i++) {
    worker_t *w = d->workers[i];
    if (!ferry__disp_eligible(d, w) || shunned(d, j, client, row, w))
      continue;
    uint64_t score = mix64(h ^ mix64(w->id * 0x9E3779B97F4A7C15ull));
    if (best == NULL || score > best_score) {
      best = w;
      best_score = score;
    }
  }
  return best;
}

/* The worker a row bound (or about to be bound) to `client` should be
 * leased to now: its pinned worker in parallel_epochs (if live and not in
 * its backoff), else the least loaded eligible one it does not avoid and
 * the client can reach. */
static worker_t *worker_for(ferry_disp_t *d, job_t *j, uint32_t r,
                            uint64_t client) {
  const row_t *row = &j->rows[r];
  if (PAR(j)) {
    worker_t *w = ferry__disp_live_worker(d, ferry__disp_row_pinned(j, r));
    return w != NULL && !avoided(d, row, w) ? w : NULL;
  }
  if (j->share)
    return share_worker(d, j, r, client, row);
  return pick_worker(d, j, client, row);
}

/* Leases every bound row that waits for a worker. */
static void lease_pending(ferry_disp_t *d, job_t *j) {
  /* bind_row keeps the row's client, so the active list does not change
   * under the walk. */
  for (uint32_t k = 0; k < j->nactive; k++) {
    uint32_t r = j->active[k].row;
    row_t *row = &j->rows[r];
    worker_t *w;
    if (row->client == 0 || row->worker != 0 || row->done)
      continue;
    if ((w = worker_for(d, j, r, row->client)) == NULL)
      continue; /* waits: no eligible worker, or in its backoff */
    bind_row(d, j, r, row->client, w);
  }
}

static bool all_done(const job_t *j) {
  if (j->world_size > 0) {
    /* The epoch ends when every rank took its quota (under
     * drop the remainder's rows stay undone: nobody receives them). */
    for (uint32_t r = 0; r < j->world_size; r++)
      if (j->rank_taken == NULL ||
          j->rank_taken[r] < ferry__disp_rank_quota(j, (uint32_t)r))
        return false;
    return true;
  }
  return j->ndone >= j->nrows;
}

/* Starts the current epoch: needs a live worker in parallel_epochs. */
static bool start_epoch(ferry_disp_t *d, job_t *j) {
  Ferry__V1__JournalEpochStart m = FERRY__V1__JOURNAL_EPOCH_START__INIT;
  uint64_t *ws = NULL;
  int rc;

  if (PAR(j)) {
    ws = ferry__calloc(d->nworkers ? d->nworkers : 1, sizeof(uint64_t));
    if (ws == NULL)
      return false;
    for (size_t i = 0; i < d->nworkers; i++)
      if (!d->workers[i]->lost && !d->workers[i]->draining &&
          !d->workers[i]->op_drained)
        ws[m.n_workers++] = d->workers[i]->id;
    if (m.n_workers == 0) {
      ferry__free(ws);
      return false;
    }
    m.workers = ws;
  }
  m.job_id = j->id;
  m.epoch = j->epoch;
  ENTRY(e, EPOCH_START, epoch_start, m);
  rc = ferry__disp_commit(d, &e, NULL);
  ferry__free(ws);
  return rc == 0;
}

/* Moves the job through finished epochs and starts the next one. */
static void advance(ferry_disp_t *d, job_t *j) {
  while (RUNNING(j)) {
    Ferry__V1__JournalEpochDone m = FERRY__V1__JOURNAL_EPOCH_DONE__INIT;
    if (!j->started && !start_epoch(d, j))
      return;
    if ((j->nrows == 0 && j->world_size == 0) || !all_done(j))
      return;
    m.job_id = j->id;
    m.epoch = j->epoch;
    ENTRY(e, EPOCH_DONE, epoch_done, m);
    if (ferry__disp_commit(d, &e, NULL) != 0)
      return;
    FERRY_LOG(FERRY_LOG_INFO, "job %" PRIu64 ": epoch %u done%s", j->id,
              m.epoch, RUNNING(j) ? "" : "; job finished");
  }
}

static void schedule_one(ferry_disp_t *d, job_t *j) {
  if (!RUNNING(j))
    return;
  advance(d, j);
  if (RUNNING(j))
    lease_pending(d, j);
}

void ferry__disp_schedule(ferry_disp_t *d) {
  ferry__disp_recount(d);
  for (size_t i = 0; i < d->njobs; i++)
    schedule_one(d, d->jobs[i]);
}

void ferry__disp_schedule_job(ferry_disp_t *d, job_t *j) {
  ferry__disp_recount(d);
  schedule_one(d, j);
}

uint64_t ferry__disp_rank_unbound(const job_t *j, int64_t rank) {
  uint64_t q, held;
  if (j->world_size == 0 || rank < 0 || rank >= (int64_t)j->world_size ||
      !j->started || j->rank_taken == NULL)
    return 0;
  q = ferry__disp_rank_quota(j, (uint32_t)rank);
  held = j->rank_taken[rank];
  /* Records bound to the rank's clients and not yet acknowledged. */
  for (uint32_t k = 0; k < j->nactive; k++) {
    uint32_t r = j->active[k].row;
    const row_t *row = &j->rows[r];
    const client_t *c = ferry__disp_find_client((job_t *)j, row->client);
    uint64_t end;
    if (row->done || c == NULL || c->rank != rank)
      continue;
    end = j->row_end[r] != 0 ? j->row_end[r] : row->total;
    if (end > row->delivered)
      held += end - row->delivered;
  }
  return held >= q ? 0 : q - held;
}

/* Binds to a ranked client only the rows (parts of splits) its
 * rank owns in the epoch's plan (ferry__disp_plan_ranks): a fast rank
 * never takes a record of another rank's share, and no rank waits for
 * another's progress. */
static void bind_rank_rows(ferry_disp_t *d, job_t *j, const client_t *c,
                           uint32_t want) {
  for (uint32_t k = ferry__disp_first_free(j); k < j->nrows && want > 0;
       k++) {
    uint32_t r = j->order[k];
    row_t *row = &j->rows[r];
    const split_t *s = &j->ds->splits[j->part_split[r]];
    if (row->client != 0 || row->done || row->total <= row->delivered ||
        j->part_rank[r] != c->rank)
      continue;
    /* A part that ends before its split does carries its end to the
     * client (Assignment.end): the rest of the chunks is not its. */
    if (bind_row_end(d, j, r, c->id, worker_for(d, j, r, c->id),
                     row->total < s->count ? row->total : 0) != 0)
      return;
    want--;
  }
}

/* A client that has not read yet (client_t.proven) is bound
 * at most FERRY_DISP_UNREAD_ROWS rows: asking for splits without ever
 * opening a stream holds no more of the workers than that. A client
 * that reads proves it at the next worker heartbeat after its first
 * stream opens (its tasks produce), so a small cap delays no one: its
 * first splits' streams open at once. */
static uint32_t unread_cap(const job_t *j, const client_t *c, uint32_t want) {
  if (c == NULL || c->proven)
    return want;
  uint32_t held = 0;
  for (uint32_t k = 0; k < j->nactive; k++) {
    const row_t *row = &j->rows[j->active[k].row];
    held += row->client == c->id && !row->done;
  }
  if (held >= FERRY_DISP_UNREAD_ROWS)
    return 0;
  return want < FERRY_DISP_UNREAD_ROWS - held ? want
                                              : FERRY_DISP_UNREAD_ROWS - held;
}

/* Whether `c`, back after it was lost for not reading, must
 * wait (client_t.rejoin_wait_until) because another live client of its
 * job can take the rows (a rank's rows are its own: never). */
static bool rejoin_waits(const ferry_disp_t *d, const job_t *j,
                         const client_t *c) {
  if (c == NULL || j->world_size > 0 || d->now >= c->rejoin_wait_until)
    return false;
  for (size_t i = 0; i < j->nclients; i++) {
    const client_t *o = &j->clients[i];
    if (o->id != c->id && o->active && !o->no_renew)
      return true;
  }
  return false;
}

void ferry__disp_bind_rows(ferry_disp_t *d, job_t *j, uint64_t client,
                           uint32_t want) {
  if (!RUNNING(j) || !j->started)
    return;
  const client_t *c = ferry__disp_find_client(j, client);
  if (rejoin_waits(d, j, c))
    return;
  want = unread_cap(j, c, want);
  if (j->world_size > 0) {
    ferry__disp_recount(d);
    if (c != NULL)
      bind_rank_rows(d, j, c, want);
    return;
  }
  ferry__disp_recount(d);
  for (uint32_t k = ferry__disp_first_free(j); k < j->nrows && want > 0;
       k++) {
    uint32_t r = j->order[k];
    row_t *row = &j->rows[r];
    if (row->client != 0 || row->done)
      continue;
    if (bind_row(d, j, r, client, worker_for(d, j, r, client)) != 0)
      return;
    want--;
  }
}

void ferry__disp_stop_renewing_if_stalled(ferry_disp_t *d, const job_t *j,
                                          client_t *c, uint64_t stalled_ms,
                                          const char *source) {
  if (d->cfg.client_stall_ms <= 0 ||
      stalled_ms < (uint64_t)d->cfg.client_stall_ms)
    return;
  ferry__disp_stop_renewing(j, c, stalled_ms, source);
}

void ferry__disp_stop_renewing(const job_t *j, client_t *c,
                               uint64_t stalled_ms, const char *source) {
  if (c == NULL || !c->active || c->no_renew)
    return;
  c->no_renew = true;
  FERRY_LOG(FERRY_LOG_WARN,
            "job %" PRIu64 ": client %" PRIu64 " has not read %s for %" PRIu64
            " ms: its lease is no longer renewed, its splits go back to the "
            "pool after the client timeout",
            j->id, c->id, source, stalled_ms);
}

/* Leases row r again from what its client acknowledged; `suspect`: away
 * from its worker for a backoff, which is marked suspect (the loss may
 * be the worker's). Fails the job after FERRY_DISP_MAX_RESTARTS in a row
 * without progress. */
static int restart_row(ferry_disp_t *d, job_t *j, uint32_t r, bool suspect,
                       const char *why) {
  row_t *row = &j->rows[r];
  uint32_t split = ferry__disp_row_split(j, r);
  const split_t *sp = &j->ds->splits[split];
  worker_t *w = ferry__disp_find_worker(d, row->worker);
  int64_t backoff = 100;

  if (++row->restarts > FERRY_DISP_MAX_RESTARTS) {
    char msg[700];
    snprintf(msg, sizeof(msg),
             "epoch %u split %u (%s, records from %" PRIu64 "): restarted %u "
             "times in a row without progress; giving up",
             j->epoch, split, j->ds->files[sp->file], sp->first,
             FERRY_DISP_MAX_RESTARTS);
    return ferry__disp_emit_job_failed(d, j, FERRY_EIO, msg);
  }
  if (suspect) {
    for (uint32_t k = 1; k < row->restarts && backoff < INT64_MAX / 2; k++)
      backoff *= 2;
    if (backoff > d->cfg.worker_timeout_ms)
      backoff = d->cfg.worker_timeout_ms;
    row->avoid = row->worker;
    row->avoid_until = d->now + backoff;
    if (w != NULL && w->suspect_since < 0)
      w->suspect_since = d->now;
  }
  FERRY_LOG(FERRY_LOG_INFO,
            "job %" PRIu64 ": %s epoch %u split %u (lease %" PRIu64
            " on worker %" PRIu64 ") from %" PRIu64 " (restart %u in a row)",
            j->id, why, j->epoch, split, row->lease, row->worker,
            row->delivered, row->restarts);
  ferry__disp_recount(d);
  return bind_row(d, j, r, row->client, worker_for(d, j, r, row->client));
}

int ferry__disp_restart_row(ferry_disp_t *d, job_t *j, uint32_t r) {
  char why[64];
  snprintf(why, sizeof(why), "client %" PRIu64 " restarts", j->rows[r].client);
  return restart_row(d, j, r, true, why);
}

int ferry__disp_resend_row(ferry_disp_t *d, job_t *j, uint32_t r) {
  return restart_row(d, j, r, false,
                     "its worker sent chunks into a stream its client left: "
                     "leasing again");
}

uint32_t ferry__disp_move_client_rows(ferry_disp_t *d, job_t *j,
                                      uint64_t client, const worker_t *w) {
  uint32_t moved = 0;
  if (!RUNNING(j) || !j->started || PAR(j))
    return 0;
  ferry__disp_recount(d);
  /* bind_row keeps the row's client: the active list stays as it is. */
  for (uint32_t k = 0; k < j->nactive; k++) {
    uint32_t r = j->active[k].row;
    row_t *row = &j->rows[r];
    if (row->client != client || row->worker != w->id || row->done)
      continue;
    /* Waits (worker 0) when no other worker can take it. */
    worker_t *to = worker_for(d, j, r, client);
    if (to == NULL || to == w) {
      row->worker = 0; /* its task on `w` is cancelled by the lease diff */
      d->changes++;
      moved++;
    } else if (bind_row(d, j, r, client, to) == 0) {
      moved++;
    }
  }
  return moved;
}
