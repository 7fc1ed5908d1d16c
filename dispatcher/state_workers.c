/* WorkerHeartbeat (registration, task reports, the diff of leases), the
 * long-polled heartbeat, and the operator's DrainWorker. */
#include "pb_alloc.h"
#include "state_internal.h"
#include "state_apply.h"
#include "state_leases.h"
#include "state_status.h"

#include "transport.h"

/* The worker for this heartbeat: its live record, or a new registration. */
static worker_t *
worker_for_heartbeat(ferry_disp_t *d,
                     const Ferry__V1__WorkerHeartbeatRequest *req,
                     ferry_error_t *err) {
  Ferry__V1__JournalWorkerRegistered m =
      FERRY__V1__JOURNAL_WORKER_REGISTERED__INIT;
  worker_t *w =
      req->worker_id ? ferry__disp_live_worker(d, req->worker_id) : NULL;

  if (w != NULL && strcmp(w->address, req->address) == 0)
    return w;
  m.worker_id = w != NULL ? w->id : d->next_worker;
  m.address = req->address;
  ENTRY(e, WORKER_REGISTERED, worker_registered, m);
  if (ferry__disp_commit(d, &e, err) != 0)
    return NULL;
  if (w == NULL)
    FERRY_LOG(FERRY_LOG_INFO, "worker %" PRIu64 " registered at %s",
              m.worker_id, req->address);
  return ferry__disp_find_worker(d, m.worker_id);
}

/* The row a worker's task refers to if the worker still holds its lease
 * (job running, current epoch, same lease, not done), else NULL. */
static row_t *leased_row(ferry_disp_t *d, const worker_t *w,
                         const Ferry__V1__TaskProgress *t, job_t **jout) {
  job_t *j = ferry__disp_find_job(d, t->job_id);
  int64_t r;

  if (j == NULL || !RUNNING(j) || t->epoch != j->epoch)
    return NULL;
  if ((r = ferry__disp_row_of(j, t->split, w->id, 0, t->lease)) < 0)
    return NULL;
  if (j->rows[r].worker != w->id || j->rows[r].lease != t->lease ||
      j->rows[r].done)
    return NULL;
  *jout = j;
  return &j->rows[r];
}

/* The row of a task whose lease ended without a new one (its client left
 * or gave the split up, and no worker holds it since): lease generations
 * are the row's own and never reused, so a report naming that lease comes
 * from the worker that held it. NULL otherwise. */
static row_t *released_row(ferry_disp_t *d, const Ferry__V1__TaskProgress *t,
                           job_t **jout) {
  job_t *j = ferry__disp_find_job(d, t->job_id);
  int64_t r;
  if (j == NULL || !RUNNING(j) || PAR(j) || t->epoch != j->epoch ||
      (r = ferry__disp_row_of(j, t->split, 0, 0, t->lease)) < 0)
    return NULL;
  row_t *row = &j->rows[r];
  if (row->worker != 0 || row->lease != t->lease || row->done)
    return NULL;
  *jout = j;
  return row;
}

/* Errors, skipped counts and finished totals of the worker's live tasks. */
static void record_tasks(ferry_disp_t *d, worker_t *w,
                         const Ferry__V1__WorkerHeartbeatRequest *req) {
  for (size_t i = 0; i < req->n_tasks; i++) {
    const Ferry__V1__TaskProgress *t = req->tasks[i];
    job_t *j = NULL;
    row_t *row = leased_row(d, w, t, &j);
    uint32_t r;
    if (row == NULL && t->error_code != 0 && !t->worker_fault &&
        released_row(d, t, &j) != NULL) {
      /* A data error of a lease that ended before this report arrived
       * (the client saw the error chunk and left at once): the data is
       * bad whoever reads it next, so the job fails as it would have. */
      ferry__disp_emit_job_failed(d, j, t->error_code,
                                  t->error[0] ? t->error
                                              : ferry_strerror(t->error_code));
      continue;
    }
    if (row == NULL) {
      /* A worker reports only on leases it holds. A fault it
       * gave back is reported until the answer cancels the task. */
      if (t->error_code != 0 && !t->worker_fault)
        FERRY_LOG(FERRY_LOG_WARN,
                  "worker %" PRIu64 " reported an error for "
                  "job %" PRIu64 " epoch %u split %u lease %" PRIu64 ", "
                  "which it does not hold: ignored",
                  w->id, t->job_id, t->epoch, t->split, t->lease);
      continue;
    }
    r = (uint32_t)(row - j->rows);
    /* Produced: its client has a stream open (a task starts only then),
     * so it reads (ferry__disp_bind_rows). */
    if (t->produced > 0 && row->client != 0) {
      client_t *rc = ferry__disp_find_client(j, row->client);
      if (rc != NULL)
        rc->proven = true;
    }
    /* Its client has had no stream here for --client-idle-ms: the next
     * answer tells it, and it may give the split up (release_rows). A
     * stream open again lifts the mark. */
    if (d->cfg.client_idle_ms > 0 && !PAR(j) && t->lease == row->lease) {
      active_t *act = ferry__disp_row_active(j, row);
      if (act != NULL)
        act->unread_lease =
            t->unread_ms >= (uint64_t)d->cfg.client_idle_ms ? row->lease : 0;
      /* Still no stream a whole --client-idle-ms after the mark, and the
       * split not given back: not a libferry client that can give it
       * back (one that never opens a stream, or that holds records of
       * it it will not hand out). It loses its splits as a stalled
       * client does, or one such client would hold them from the
       * other clients of its job for ever. */
      if (t->unread_ms >= 2 * (uint64_t)d->cfg.client_idle_ms)
        ferry__disp_stop_renewing(j, ferry__disp_find_client(j, row->client),
                                  t->unread_ms,
                                  "a split on a worker that saw no stream of it");
    }
    if (t->stalled_ms > 0)
      ferry__disp_stop_renewing_if_stalled(
          d, j, ferry__disp_find_client(j, row->client), t->stalled_ms,
          "its stream from a worker");
    if (t->resend && t->error_code == 0 && row->client != 0) {
      (void)ferry__disp_resend_row(d, j, r); /* may fail the job */
      continue;
    }
    if (t->error_code != 0 && t->worker_fault) {
      /* The worker could not run the split (out of descriptors or
       * memory), which says nothing about the data: another worker
       * takes it from what the client received, with the restart's
       * backoff and its bound on restarts without progress. */
      FERRY_LOG(FERRY_LOG_WARN,
                "worker %" PRIu64 " cannot run job %" PRIu64 " split %u "
                "(%s): giving it to another worker",
                w->id, j->id, t->split,
                t->error[0] ? t->error : ferry_strerror(t->error_code));
      (void)ferry__disp_restart_row(d, j, r); /* may fail the job */
      continue;
    }
    if (t->error_code != 0) {
      ferry__disp_emit_job_failed(d, j, t->error_code,
                                  t->error[0] ? t->error
                                              : ferry_strerror(t->error_code));
      continue;
    }
    const active_t *act = ferry__disp_row_active(j, row);
    if (t->skipped >
        (act != NULL && act->skip_lease == t->lease ? act->skip_seen : 0)) {
      Ferry__V1__JournalSkipped m = FERRY__V1__JOURNAL_SKIPPED__INIT;
      m.job_id = j->id;
      m.epoch = j->epoch;
      m.row = r;
      m.lease = t->lease;
      m.skipped = t->skipped;
      ENTRY(e, SKIPPED, skipped, m);
      ferry__disp_commit(d, &e, NULL);
    }
    if (t->finished && (!row->total_known || row->total != t->produced)) {
      Ferry__V1__JournalTaskFinished m = FERRY__V1__JOURNAL_TASK_FINISHED__INIT;
      m.job_id = j->id;
      m.epoch = j->epoch;
      m.row = r;
      m.total = t->produced;
      ENTRY(e, TASK_FINISHED, task_finished, m);
      ferry__disp_commit(d, &e, NULL);
    }
  }
}

static Ferry__V1__Task *make_task(const job_t *j, const row_t *row,
                                  ferry_arena_t *a) {
  Ferry__V1__Task *t = ferry__arena_alloc(a, sizeof(*t));
  Ferry__V1__Split *s = ferry__arena_alloc(a, sizeof(*s));
  uint32_t split = ferry__disp_row_split(j, (uint64_t)(row - j->rows));
  const split_t *sp = &j->ds->splits[split];

  if (t == NULL || s == NULL)
    return NULL;
  ferry__v1__task__init(t);
  ferry__v1__split__init(s);
  s->index = split;
  s->file_index = sp->file;
  s->byte_offset = sp->offset;
  s->byte_end = sp->end;
  s->first_record = sp->first;
  s->num_records = sp->count;
  t->job_id = j->id;
  t->client_id = row->client;
  const client_t *c = ferry__disp_find_client((job_t *)j, row->client);
  if (c != NULL && c->has_secret) {
    t->client_secret.data = (uint8_t *)c->secret;
    t->client_secret.len = FERRY_CLIENT_SECRET_BYTES;
  }
  t->epoch = j->epoch;
  t->split = s;
  t->file = j->ds->files[sp->file];
  t->start = row->start;
  /* A ranked part ends where its rows ends (the rest of the
   * split is other parts'), so its worker stops there. */
  if (j->part_split != NULL && row->total_known)
    t->end = row->total;
  t->lease = row->lease;
  t->spec.data = j->ds->spec_bytes;
  t->spec.len = j->ds->spec_len;
  t->shuffle = j->shuffle;
  t->shuffle_seed = j->seed;
  t->error_policy = j->policy;
  t->share = j->share;
  return t;
}

/* Cancels the listed tasks the worker no longer holds; marks the others. */
static int diff_cancelled(ferry_disp_t *d, worker_t *w,
                          const Ferry__V1__WorkerHeartbeatRequest *req,
                          Ferry__V1__WorkerHeartbeatResponse *resp,
                          ferry_arena_t *a, uint32_t *listed) {
  resp->cancelled = ferry__arena_alloc(a, (req->n_tasks + 1) * sizeof(void *));
  if (resp->cancelled == NULL)
    return FERRY_ENOMEM;
  for (size_t i = 0; i < req->n_tasks; i++) {
    const Ferry__V1__TaskProgress *t = req->tasks[i];
    job_t *j = NULL;
    row_t *row = leased_row(d, w, t, &j);
    Ferry__V1__TaskRef *ref;
    if (row != NULL) {
      active_t *act = ferry__disp_row_active(j, row);
      if (act != NULL) { /* always: a row under lease is active */
        *listed += act->listed != d->hb_gen; /* each row once */
        act->listed = d->hb_gen;
      }
      continue;
    }
    if ((ref = ferry__arena_alloc(a, sizeof(*ref))) == NULL)
      return FERRY_ENOMEM;
    ferry__v1__task_ref__init(ref);
    ref->job_id = t->job_id;
    ref->epoch = t->epoch;
    ref->split = t->split;
    ref->lease = t->lease;
    resp->cancelled[resp->n_cancelled++] = ref;
  }
  return 0;
}

/* Every lease of the worker it did not list: new tasks. `listed`: the
 * distinct leases of the worker that the request listed. w->ntasks is
 * never below the worker's leases not done (ferry__disp_recount made it
 * exact and every new lease since added one), so when it is not above
 * `listed` there is nothing new and the walk is skipped: a held
 * heartbeat is re-checked after every change at the cost of its own
 * tasks only. */
static int diff_new(ferry_disp_t *d, worker_t *w,
                    Ferry__V1__WorkerHeartbeatResponse *resp,
                    ferry_arena_t *a, uint32_t listed) {
  size_t n = 0, k = 0;
  if (w->ntasks <= listed)
    return 0;
  for (size_t i = 0; i < d->njobs; i++)
    n += RUNNING(d->jobs[i]) ? d->jobs[i]->nactive : 0;
  if ((resp->new_tasks = ferry__arena_alloc(a, (n + 1) * sizeof(void *))) ==
      NULL)
    return FERRY_ENOMEM;
  for (size_t i = 0; i < d->njobs; i++) {
    job_t *j = d->jobs[i];
    if (!RUNNING(j))
      continue;
    /* Every lease not done is on a row of the active list. */
    for (uint32_t x = 0; x < j->nactive; x++) {
      row_t *row = &j->rows[j->active[x].row];
      if (row->worker != w->id || row->done ||
          j->active[x].listed == d->hb_gen)
        continue;
      if ((resp->new_tasks[k] = make_task(j, row, a)) == NULL)
        return FERRY_ENOMEM;
      k++;
    }
  }
  resp->n_new_tasks = k;
  return 0;
}

/* The answer for worker `w` listing `req`'s tasks: its id, the interval,
 * and the diff of leases. */
static int fill_worker_resp(ferry_disp_t *d, worker_t *w,
                            const Ferry__V1__WorkerHeartbeatRequest *req,
                            Ferry__V1__WorkerHeartbeatResponse *resp,
                            ferry_arena_t *a, ferry_error_t *err) {
  uint32_t listed = 0;
  d->hb_gen++;
  resp->worker_id = w->id;
  resp->heartbeat_ms = d->cfg.heartbeat_ms;
  if (diff_cancelled(d, w, req, resp, a, &listed) != 0 ||
      diff_new(d, w, resp, a, listed) != 0)
    return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
  return 0;
}

static int check_address(const char *address, ferry_error_t *err) {
  return ferry__disp_check_len(address, FERRY_DISP_MAX_ADDRESS_LEN,
                               "worker address", err);
}

/* The endpoints a heartbeat published, as the seam checks them. */
static int published(const Ferry__V1__WorkerHeartbeatRequest *req,
                     ferry_transport_endpoint_t *out, ferry_error_t *err) {
  if (req->n_endpoints > FERRY_TRANSPORT_ENDPOINTS_MAX)
    return ferry__seterr(err, FERRY_EINVAL, "worker heartbeat: %zu "
                         "endpoints, over %d", req->n_endpoints,
                         FERRY_TRANSPORT_ENDPOINTS_MAX);
  for (size_t i = 0; i < req->n_endpoints; i++) {
    const Ferry__V1__TransportEndpoint *e = req->endpoints[i];
    out[i].transport = e->transport != NULL ? e->transport : "";
    out[i].transport_len = strlen(out[i].transport);
    out[i].address = e->address.data;
    out[i].address_len = e->address.len;
  }
  int rc = ferry__transport_endpoints_check(out, req->n_endpoints, err);
  return rc != 0 ? ferry__prefixerr(err, "worker heartbeat") : 0;
}

static bool same_endpoints(const worker_t *w,
                           const ferry_transport_endpoint_t *e, size_t n) {
  if (n != w->n_endpoints)
    return false;
  for (size_t i = 0; i < n; i++) {
    const Ferry__V1__TransportEndpoint *k = w->endpoints[i];
    if (strlen(k->transport) != e[i].transport_len ||
        memcmp(k->transport, e[i].transport, e[i].transport_len) != 0 ||
        k->address.len != e[i].address_len ||
        (e[i].address_len > 0 &&
         memcmp(k->address.data, e[i].address, e[i].address_len) != 0))
      return false;
  }
  return true;
}

/* Keeps the endpoints a heartbeat published, as the messages client
 * heartbeats relay (one allocation: pointers, messages, bytes). */
static int set_endpoints(worker_t *w, const ferry_transport_endpoint_t *e,
                         size_t n) {
  if (same_endpoints(w, e, n))
    return 0;
  size_t bytes = n * (sizeof(void *) + sizeof(Ferry__V1__TransportEndpoint));
  for (size_t i = 0; i < n; i++)
    bytes += e[i].transport_len + 1 + e[i].address_len;
  void *block = NULL;
  if (n > 0 && (block = ferry__malloc(bytes)) == NULL)
    return FERRY_ENOMEM;
  Ferry__V1__TransportEndpoint **ptrs = block;
  Ferry__V1__TransportEndpoint *msgs =
      (Ferry__V1__TransportEndpoint *)(ptrs + n);
  char *p = (char *)(msgs + n);
  for (size_t i = 0; i < n; i++) {
    ferry__v1__transport_endpoint__init(&msgs[i]);
    memcpy(p, e[i].transport, e[i].transport_len);
    p[e[i].transport_len] = '\0';
    msgs[i].transport = p;
    p += e[i].transport_len + 1;
    if (e[i].address_len > 0) {
      memcpy(p, e[i].address, e[i].address_len);
      msgs[i].address.data = (uint8_t *)p;
      msgs[i].address.len = e[i].address_len;
      p += e[i].address_len;
    }
    ptrs[i] = &msgs[i];
  }
  ferry__free(w->endpoints);
  w->endpoints = ptrs;
  w->n_endpoints = n;
  return 0;
}

/* Bounds of a heartbeat's cache report (dispatcher.proto CacheReport). */
#define MAX_CACHE_POLICIES 64
#define MAX_CACHE_DIR 4096
#define MAX_CACHE_REASON 512

static int check_cache_report(const Ferry__V1__CacheReport *c,
                              ferry_error_t *err) {
  int rc;
  if (c == NULL)
    return 0;
  if (c->n_policies > MAX_CACHE_POLICIES)
    return ferry__seterr(err, FERRY_EINVAL, "worker heartbeat: %zu cache "
                         "policies, over %d", c->n_policies,
                         MAX_CACHE_POLICIES);
  if ((rc = ferry__disp_check_str(c->dir, MAX_CACHE_DIR, true,
                                  "the cache directory", err)) != 0)
    return rc;
  for (size_t i = 0; i < c->n_policies; i++) {
    const Ferry__V1__CachePolicy *p = c->policies[i];
    if ((rc = ferry__disp_check_str(p->dataset_id, 64, true,
                                    "a cache policy's dataset", err)) != 0 ||
        (rc = ferry__disp_check_str(p->choice, 32, true,
                                    "a cache policy's choice", err)) != 0 ||
        (rc = ferry__disp_check_str(p->reason, MAX_CACHE_REASON, true,
                                    "a cache policy's reason", err)) != 0)
      return rc;
  }
  return 0;
}

/* Keeps the cache report of a heartbeat (a copy, unpacked again only
 * when it changed). */
static int set_cache_report(worker_t *w, const Ferry__V1__CacheReport *c) {
  if (c == NULL) {
    ferry__disp_free_cache_report(w);
    return 0;
  }
  size_t n = ferry__v1__cache_report__get_packed_size(c);
  uint8_t *buf = ferry__malloc(n > 0 ? n : 1);
  if (buf == NULL)
    return FERRY_ENOMEM;
  ferry__v1__cache_report__pack(c, buf);
  if (w->cache != NULL && n == w->cache_len &&
      memcmp(buf, w->cache_pb, n) == 0) {
    ferry__free(buf);
    return 0;
  }
  Ferry__V1__CacheReport *copy =
      ferry__v1__cache_report__unpack(&ferry__pb_allocator, n, buf);
  if (copy == NULL) {
    ferry__free(buf);
    return FERRY_ENOMEM;
  }
  ferry__disp_free_cache_report(w);
  w->cache = copy;
  w->cache_pb = buf;
  w->cache_len = n;
  return 0;
}

int ferry__disp_worker_heartbeat(ferry_disp_t *d,
                                 const Ferry__V1__WorkerHeartbeatRequest *req,
                                 Ferry__V1__WorkerHeartbeatResponse *resp,
                                 ferry_arena_t *a, int64_t now_ms,
                                 ferry_error_t *err) {
  worker_t *w;
  int rc;

  d->now = now_ms;
  if ((rc = check_address(req->address, err)) != 0)
    return rc;
  if (req->address == NULL || req->address[0] == '\0')
    return ferry__seterr(err, FERRY_EINVAL, "worker heartbeat: no address");
  ferry_transport_endpoint_t endpoints[FERRY_TRANSPORT_ENDPOINTS_MAX];
  if ((rc = published(req, endpoints, err)) != 0)
    return rc;
  if (req->n_tasks > FERRY_DISP_MAX_PROGRESS)
    return ferry__seterr(err, FERRY_EINVAL, "worker heartbeat: over %d tasks",
                         FERRY_DISP_MAX_PROGRESS);
  if ((rc = check_cache_report(req->cache, err)) != 0)
    return rc;
  /* A task's error is cleaned of invalid UTF-8 when it is recorded. */
  for (size_t i = 0; i < req->n_tasks; i++)
    if ((rc = ferry__disp_check_str(req->tasks[i]->error,
                                    FERRY_DISP_MAX_ERROR_LEN, false,
                                    "a task's error", err)) != 0)
      return rc;
  if ((w = worker_for_heartbeat(d, req, err)) == NULL)
    return err != NULL && err->code != 0 ? err->code : FERRY_ENOMEM;
  w->last_hb = now_ms;
  if (w->suspect_since >= 0 && now_ms > w->suspect_since)
    w->suspect_since = -1; /* alive after all */
  w->beats++;
  w->threads = req->threads;
  w->buffer_bytes = req->buffer_bytes;
  w->buffer_free_bytes = req->buffer_free_bytes;
  if (req->draining && !w->draining)
    FERRY_LOG(FERRY_LOG_INFO, "worker %" PRIu64 " is draining", w->id);
  w->draining = req->draining;
  if (set_endpoints(w, endpoints, req->n_endpoints) != 0 ||
      set_cache_report(w, req->cache) != 0)
    return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
  w->unfinished = 0;
  for (size_t i = 0; i < req->n_tasks; i++)
    w->unfinished += !req->tasks[i]->finished;
  record_tasks(d, w, req);
  ferry__disp_schedule(d);
  return fill_worker_resp(d, w, req, resp, a, err);
}

bool ferry__disp_worker_may_wait(
    ferry_disp_t *d, const Ferry__V1__WorkerHeartbeatRequest *req,
    const Ferry__V1__WorkerHeartbeatResponse *resp) {
  worker_t *w = ferry__disp_live_worker(d, resp->worker_id);
  /* The first answer since this process started tells the worker the
   * interval (and so how long its calls may wait): never held back. */
  return w != NULL && req->worker_id == w->id && w->beats > 1 &&
         !req->draining && !w->draining && resp->n_new_tasks == 0 &&
         resp->n_cancelled == 0;
}

bool ferry__disp_worker_poll(ferry_disp_t *d,
                             const Ferry__V1__WorkerHeartbeatRequest *req,
                             Ferry__V1__WorkerHeartbeatResponse *resp,
                             ferry_arena_t *a, int64_t now_ms,
                             ferry_error_t *err) {
  worker_t *w = ferry__disp_find_worker(d, req->worker_id);

  d->now = now_ms;
  if (w == NULL) {
    resp->worker_id = req->worker_id;
    resp->heartbeat_ms = d->cfg.heartbeat_ms;
    return true;
  }
  if (fill_worker_resp(d, w, req, resp, a, err) != 0)
    return true;
  if (w->lost || resp->n_new_tasks > 0)
    return true;
  /* A finished task's cancellation stops no work: it can wait for the
   * next answer. */
  for (size_t i = 0; i < req->n_tasks; i++) {
    job_t *j = NULL;
    if (!req->tasks[i]->finished && leased_row(d, w, req->tasks[i], &j) == NULL)
      return true;
  }
  return false;
}

/* The worker a DrainWorker request names: by id, else the newest worker
 * registered at the address that is not lost (else the newest lost one). */
static worker_t *drain_target(ferry_disp_t *d,
                              const Ferry__V1__DrainWorkerRequest *req,
                              ferry_error_t *err) {
  worker_t *best = NULL;
  if (req->worker_id != 0) {
    if ((best = ferry__disp_find_worker(d, req->worker_id)) == NULL)
      ferry__seterr(err, FERRY_ENOENT, "DrainWorker: no worker %" PRIu64,
                    req->worker_id);
    return best;
  }
  if (req->address == NULL || req->address[0] == '\0') {
    ferry__seterr(err, FERRY_EINVAL,
                  "DrainWorker: give a worker id or an address");
    return NULL;
  }
  for (size_t i = 0; i < d->nworkers; i++) {
    worker_t *w = d->workers[i];
    if (strcmp(w->address, req->address) != 0)
      continue;
    if (best == NULL || (best->lost && !w->lost) ||
        (best->lost == w->lost && w->id > best->id))
      best = w;
  }
  if (best == NULL)
    ferry__seterr(err, FERRY_ENOENT, "DrainWorker: no worker at %s",
                  req->address);
  return best;
}

int ferry__disp_drain_worker(ferry_disp_t *d,
                             const Ferry__V1__DrainWorkerRequest *req,
                             Ferry__V1__DrainWorkerResponse *resp,
                             ferry_arena_t *a, int64_t now_ms,
                             ferry_error_t *err) {
  worker_t *w;
  int rc;

  d->now = now_ms;
  if ((rc = check_address(req->address, err)) != 0)
    return rc;
  if ((w = drain_target(d, req, err)) == NULL)
    return err != NULL ? err->code : FERRY_ENOENT;
  if (!w->lost && !w->op_drained) {
    Ferry__V1__JournalWorkerDrained m = FERRY__V1__JOURNAL_WORKER_DRAINED__INIT;
    uint32_t moved = 0;
    for (size_t i = 0; i < d->njobs; i++) {
      const job_t *j = d->jobs[i];
      for (uint32_t r = 0; RUNNING(j) && r < j->nrows; r++)
        moved += !j->rows[r].done && (j->rows[r].worker == w->id ||
                                      ferry__disp_row_pinned(j, r) == w->id);
    }
    m.worker_id = w->id;
    ENTRY(e, WORKER_DRAINED, worker_drained, m);
    if ((rc = ferry__disp_commit(d, &e, err)) != 0)
      return rc;
    FERRY_LOG(FERRY_LOG_INFO,
              "worker %" PRIu64 " (%s) drained by the "
              "operator: %u leases move to other workers",
              w->id, w->address, moved);
    resp->moved = moved;
    ferry__disp_schedule(
        d); /* re-leases its rows (and answers its held heartbeat) */
  }
  ferry__disp_recount(d);
  resp->worker_id = w->id;
  resp->address = ferry__arena_strdup(a, w->address);
  resp->state = (char *)ferry__disp_worker_state(w);
  resp->tasks = w->ntasks;
  resp->drained = ferry__disp_drained(w);
  for (size_t i = 0; i < d->nworkers; i++)
    resp->other_workers +=
        d->workers[i] != w && ferry__disp_eligible(d, d->workers[i]);
  if (resp->address == NULL)
    return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
  return 0;
}
