/* GetStatus: workers, jobs and their clients as the state stands. */
#include "state_status.h"
#include "state_figures.h"
#include "state_leases.h"

bool ferry__disp_drained(const worker_t *w) {
  return w->lost || (w->op_drained && w->ntasks == 0 &&
                     w->beats > w->drain_beats && w->unfinished == 0);
}

const char *ferry__disp_worker_state(const worker_t *w) {
  if (w->lost)
    return w->left ? "left" : "lost";
  if (w->op_drained)
    return ferry__disp_drained(w) ? "drained" : "draining";
  if (w->draining)
    return "draining";
  return w->beats > 0 ? "alive" : "unknown";
}

static Ferry__V1__WorkerStatus *
worker_status(ferry_disp_t *d, const worker_t *w, ferry_arena_t *a) {
  Ferry__V1__WorkerStatus *s = ferry__arena_alloc(a, sizeof(*s));
  if (s == NULL)
    return NULL;
  ferry__v1__worker_status__init(s);
  s->worker_id = w->id;
  s->address = w->address;
  s->state = (char *)ferry__disp_worker_state(w);
  s->operator_drained = w->op_drained;
  s->tasks = w->ntasks;
  s->threads = w->threads;
  s->buffer_bytes = w->buffer_bytes;
  s->buffer_free_bytes = w->buffer_free_bytes;
  s->last_heartbeat_ms_ago = d->now - w->last_hb;
  s->unreachable_clients = ferry__disp_unreachable_count(d, w);
  s->unreachable_reason = w->unreach_reason != NULL ? w->unreach_reason : "";
  s->cache = w->cache; /* the worker's copy: the arena does not free it */
  s->unreachable_ms_ago = w->unreach_reason != NULL ? d->now - w->unreach_at
                                                    : -1;
  return s;
}

static int job_clients(ferry_disp_t *d, const job_t *j, Ferry__V1__JobStatus *s,
                       ferry_arena_t *a) {
  s->clients = ferry__arena_alloc(a, (j->nclients + 1) * sizeof(void *));
  if (s->clients == NULL)
    return FERRY_ENOMEM;
  for (size_t i = 0; i < j->nclients; i++) {
    const client_t *c = &j->clients[i];
    Ferry__V1__ClientStatus *cs;
    Ferry__V1__ClientStats *st;
    if (!c->active)
      continue;
    cs = ferry__arena_alloc(a, sizeof(*cs));
    st = ferry__arena_alloc(a, sizeof(*st));
    if (cs == NULL || st == NULL)
      return FERRY_ENOMEM;
    ferry__v1__client_status__init(cs);
    ferry__v1__client_stats__init(st);
    st->stall_fraction = c->stall_fraction;
    st->batches_per_second = c->batches_per_second;
    st->batches = c->batches;
    cs->client_id = c->id;
    cs->stats = st;
    for (uint32_t k = 0; k < j->nactive; k++)
      cs->splits_in_flight += j->rows[j->active[k].row].client == c->id;
    cs->last_heartbeat_ms_ago = d->now - c->last_hb;
    s->clients[s->n_clients++] = cs;
  }
  return 0;
}

static int job_skipped(const job_t *j, Ferry__V1__JobStatus *s,
                       ferry_arena_t *a) {
  s->skipped = j->skipped;
  s->skipped_by_file =
      ferry__arena_alloc(a, (j->ds->nfiles + 1) * sizeof(void *));
  if (s->skipped_by_file == NULL)
    return FERRY_ENOMEM;
  for (uint32_t f = 0; f < j->ds->nfiles; f++) {
    Ferry__V1__FileErrors *fe;
    if (j->skipped_by_file[f] == 0)
      continue;
    if ((fe = ferry__arena_alloc(a, sizeof(*fe))) == NULL)
      return FERRY_ENOMEM;
    ferry__v1__file_errors__init(fe);
    fe->file = j->ds->files[f];
    fe->skipped = j->skipped_by_file[f];
    s->skipped_by_file[s->n_skipped_by_file++] = fe;
  }
  return 0;
}

static Ferry__V1__JobStatus *job_status(ferry_disp_t *d, const job_t *j,
                                        ferry_arena_t *a) {
  Ferry__V1__JobStatus *s = ferry__arena_alloc(a, sizeof(*s));
  if (s == NULL)
    return NULL;
  ferry__v1__job_status__init(s);
  s->job_id = j->id;
  s->name = j->name;
  s->dataset_id = j->ds->id;
  s->mode = j->mode;
  s->state = j->state;
  s->epoch = j->epoch;
  s->num_epochs = j->num_epochs;
  s->share = j->share;
  s->delivered = ferry__disp_epoch_delivered(j);
  /* Records per epoch: known row totals (unknown counts add 0). */
  if (j->started)
    for (uint32_t r = 0; r < j->nrows; r++)
      s->total += j->rows[r].total_known ? j->rows[r].total : 0;
  else
    s->total = j->ds->known_records;
  s->delivered_all = j->delivered_prev + s->delivered;
  s->error = j->error != NULL ? j->error : "";
  ferry__disp_job_figures(d, j, s);
  if (job_skipped(j, s, a) != 0 || job_clients(d, j, s, a) != 0)
    return NULL;
  return s;
}

int ferry__disp_status(ferry_disp_t *d, const char *version,
                       Ferry__V1__GetStatusResponse *resp, ferry_arena_t *a,
                       int64_t now_ms) {
  d->now = now_ms;
  ferry__disp_recount(d);
  resp->version = ferry__arena_strdup(a, version);
  resp->uptime_ms = now_ms - d->start;
  resp->datasets = (uint32_t)d->nds;
  resp->workers = ferry__arena_alloc(a, (d->nworkers + 1) * sizeof(void *));
  resp->jobs = ferry__arena_alloc(a, (d->njobs + 1) * sizeof(void *));
  if (resp->version == NULL || resp->workers == NULL || resp->jobs == NULL)
    return FERRY_ENOMEM;
  for (size_t i = 0; i < d->nworkers; i++) {
    if ((resp->workers[i] = worker_status(d, d->workers[i], a)) == NULL)
      return FERRY_ENOMEM;
    resp->n_workers++;
  }
  for (size_t i = 0; i < d->njobs; i++) {
    if ((resp->jobs[i] = job_status(d, d->jobs[i], a)) == NULL)
      return FERRY_ENOMEM;
    resp->n_jobs++;
  }
  return 0;
}
