/* The dispatcher's state machine: its lifetime, the split order, the
 * lookups and indexes every part uses and the workers' unreachable lists
 * (state_internal.h lists the parts). */
#include "pb_alloc.h"
#include "state_internal.h"

#include "tfrecord.h"

static uint64_t splitmix64(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void ferry__disp_split_order(bool shuffle, uint64_t seed, uint32_t epoch,
                             uint32_t *out, uint32_t n) {
  uint64_t s = seed ^ ((uint64_t)epoch * 0x9E3779B97F4A7C15ull);
  for (uint32_t i = 0; i < n; i++)
    out[i] = i;
  if (!shuffle)
    return;
  for (uint32_t i = n; i > 1; i--) {
    uint32_t j = (uint32_t)(splitmix64(&s) % i);
    uint32_t t = out[i - 1];
    out[i - 1] = out[j];
    out[j] = t;
  }
}

void ferry__disp_config_init(ferry_disp_config_t *cfg) {
  cfg->worker_timeout_ms = 10000;
  cfg->client_timeout_ms = 10000;
  cfg->job_gc_ms = 60000;
  cfg->records_per_split = 1024;
  cfg->heartbeat_ms = 1000;
  cfg->max_record_len = FERRY_TFR_DEFAULT_MAX_RECORD;
  cfg->client_stall_ms = 30000;
  cfg->client_idle_ms = 5000;
  cfg->roots = NULL;
  cfg->max_datasets = 1024;
  cfg->target_stall_fraction = 0.05;
}

int ferry__disp_push_ptr(void ***arr, size_t *n, void *p) {
  /* The capacity is implicit in the count: 0, then 4, then the powers of
   * two from there (these arrays never shrink below their count). */
  size_t cap = *n == 0 ? 0 : 4;
  while (cap < *n)
    cap *= 2;
  if (!ferry__grow(arr, &cap, *n + 1, sizeof(void *), 4))
    return FERRY_ENOMEM;
  (*arr)[(*n)++] = p;
  return 0;
}

void ferry__disp_free_dataset(dataset_t *ds) {
  if (ds == NULL)
    return;
  ferry__free(ds->id);
  ferry__spec_close(&ds->spec);
  ferry__free(ds->spec_bytes);
  for (uint32_t i = 0; i < ds->nfiles && ds->files != NULL; i++)
    ferry__free(ds->files[i]);
  ferry__free(ds->files);
  ferry__free(ds->splits);
  ferry__free(ds->scanned);
  ferry__free(ds);
}

void ferry__disp_free_rows(job_t *j) {
  ferry__free(j->rows);
  ferry__free(j->order);
  ferry__free(j->ep_workers);
  ferry__free(j->active);
  ferry__free(j->row_end);
  ferry__free(j->rank_taken);
  ferry__free(j->part_split);
  ferry__free(j->part_base);
  ferry__free(j->part_roff);
  ferry__free(j->part_rank);
  ferry__free(j->split_part);
  ferry__free(j->split_nparts);
  j->row_end = NULL;
  j->rank_taken = NULL;
  j->part_split = j->split_part = j->split_nparts = NULL;
  j->part_base = NULL;
  j->part_roff = NULL;
  j->part_rank = NULL;
  j->rows = NULL;
  j->order = NULL;
  j->active = NULL;
  j->nactive = j->active_cap = j->ndone = j->free_from = 0;
  j->ep_workers = NULL;
  j->nrows = 0;
  j->n_ep_workers = 0;
  j->started = false;
}

void ferry__disp_free_job(job_t *j) {
  if (j == NULL)
    return;
  ferry__disp_free_rows(j);
  ferry__free(j->name);
  ferry__free(j->error);
  ferry__free(j->clients);
  ferry__free(j->skipped_by_file);
  ferry__free(j->cut_world);
  ferry__free(j->cut_step);
  ferry__free(j);
}

int ferry__disp_new(const ferry_disp_config_t *cfg, int64_t now_ms,
                    ferry_disp_t **out) {
  ferry_disp_t *d = ferry__calloc(1, sizeof(*d));
  *out = NULL;
  if (d == NULL)
    return FERRY_ENOMEM;
  d->cfg = *cfg;
  if (d->cfg.records_per_split == 0)
    d->cfg.records_per_split = 1024;
  if (d->cfg.max_record_len == 0)
    d->cfg.max_record_len = FERRY_TFR_DEFAULT_MAX_RECORD;
  d->now = d->start = now_ms;
  d->next_job = d->next_client = d->next_worker = 1;
  *out = d;
  return 0;
}

void ferry__disp_free_collected(ferry_disp_t *d) {
  for (size_t i = 0; i < d->ncollected; i++)
    ferry__disp_free_dataset(d->collected[i]);
  ferry__free(d->collected);
  d->collected = NULL;
  d->ncollected = 0;
}

void ferry__disp_free_contents(ferry_disp_t *d) {
  for (size_t i = 0; i < d->nds; i++)
    ferry__disp_free_dataset(d->ds[i]);
  for (size_t i = 0; i < d->njobs; i++)
    ferry__disp_free_job(d->jobs[i]);
  for (size_t i = 0; i < d->nworkers; i++) {
    ferry__free(d->workers[i]->address);
    ferry__free(d->workers[i]->endpoints);
    ferry__disp_free_unreachable(d->workers[i]);
    ferry__disp_free_cache_report(d->workers[i]);
    ferry__free(d->workers[i]);
  }
  ferry__free(d->ds);
  ferry__free(d->jobs);
  ferry__free(d->workers);
  d->ds = NULL;
  d->jobs = NULL;
  d->workers = NULL;
  d->nds = d->njobs = d->nworkers = 0;
  /* The heap points at the workers: empty, rebuilt by the next pick. */
  d->nheap = 0;
  d->heap_fresh = false;
  ferry__disp_free_collected(d);
}

void ferry__disp_free(ferry_disp_t *d) {
  if (d == NULL)
    return;
  ferry__disp_free_contents(d);
  ferry__free(d->heap);
  ferry__free(d->scratch);
  ferry__free(d);
}

void ferry__disp_set_sink(ferry_disp_t *d, ferry_disp_sink_cb cb, void *arg) {
  d->sink = cb;
  d->sink_arg = arg;
}

dataset_t *ferry__disp_find_dataset(ferry_disp_t *d, const char *id) {
  for (size_t i = 0; i < d->nds; i++)
    if (strcmp(d->ds[i]->id, id) == 0)
      return d->ds[i];
  return NULL;
}

job_t *ferry__disp_find_job(ferry_disp_t *d, uint64_t id) {
  /* Jobs are appended as they are created, with rising ids, and removed
   * in place: the array stays sorted by id, and every client heartbeat
   * looks its job up here. A binary search, and a linear scan as the
   * fallback should that order ever not hold. */
  size_t lo = 0, hi = d->njobs;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (d->jobs[mid]->id == id)
      return d->jobs[mid];
    if (d->jobs[mid]->id < id)
      lo = mid + 1;
    else
      hi = mid;
  }
  for (size_t i = 0; i < d->njobs; i++)
    if (d->jobs[i]->id == id)
      return d->jobs[i];
  return NULL;
}

worker_t *ferry__disp_find_worker(ferry_disp_t *d, uint64_t id) {
  /* Workers are appended as they register, with ids from 1 up, and never
   * removed: worker i is at i - 1, unless the journal skipped ids; then a
   * binary search, and a linear scan as the fallback should that order
   * ever not hold. */
  size_t lo = 0, hi = d->nworkers;
  if (id >= 1 && id <= d->nworkers && d->workers[id - 1]->id == id)
    return d->workers[id - 1];
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (d->workers[mid]->id == id)
      return d->workers[mid];
    if (d->workers[mid]->id < id)
      lo = mid + 1;
    else
      hi = mid;
  }
  for (size_t i = 0; i < d->nworkers; i++)
    if (d->workers[i]->id == id)
      return d->workers[i];
  return NULL;
}

client_t *ferry__disp_find_client(job_t *j, uint64_t id) {
  for (size_t i = 0; i < j->nclients; i++)
    if (j->clients[i].id == id)
      return &j->clients[i];
  return NULL;
}

worker_t *ferry__disp_live_worker(ferry_disp_t *d, uint64_t id) {
  worker_t *w = ferry__disp_find_worker(d, id);
  return w != NULL && !w->lost ? w : NULL;
}

row_t *ferry__disp_job_row(job_t *j, uint32_t epoch, uint32_t row) {
  if (!j->started || epoch != j->epoch || row >= j->nrows)
    return NULL;
  return &j->rows[row];
}

int64_t ferry__disp_row_index(const job_t *j, uint32_t split, uint64_t worker) {
  uint32_t ns = j->ds->nsplits;
  if (!j->started || split >= ns)
    return -1;
  if (!PAR(j))
    return split;
  for (uint32_t s = 0; s < j->n_ep_workers; s++)
    if (j->ep_workers[s] == worker)
      return (int64_t)s * ns + split;
  return -1;
}

int ferry__disp_row_changed(job_t *j, uint32_t r, bool was_done) {
  row_t *row = &j->rows[r];
  bool in = row->client != 0 && !row->done;
  if (row->done && !was_done)
    j->ndone++;
  if (in && row->act == 0) {
    if (!FERRY__GROW(j->active, j->active_cap, (size_t)j->nactive + 1, 64))
      return FERRY_ENOMEM;
    j->active[j->nactive++] = (active_t){.row = r};
    row->act = j->nactive;
  } else if (!in && row->act != 0) {
    uint32_t k = row->act - 1;
    j->active[k] = j->active[--j->nactive];
    j->rows[j->active[k].row].act = k + 1;
    row->act = 0;
  }
  if (row->client == 0 && !row->done && row->rank < j->free_from)
    j->free_from = row->rank;
  return 0;
}

uint32_t ferry__disp_first_free(job_t *j) {
  while (j->free_from < j->nrows) {
    const row_t *row = &j->rows[j->order[j->free_from]];
    if (row->client == 0 && !row->done)
      break;
    j->free_from++;
  }
  return j->free_from;
}

static bool heavier(const worker_t *a, const worker_t *b) {
  return a->ntasks != b->ntasks ? a->ntasks > b->ntasks : a->id > b->id;
}

bool ferry__disp_check_indexes(const ferry_disp_t *d, char *why, size_t cap) {
  for (size_t i = 0; i < d->njobs; i++) {
    const job_t *j = d->jobs[i];
    uint32_t done = 0, act = 0;
    for (uint32_t r = 0; r < j->nrows; r++) {
      const row_t *row = &j->rows[r];
      bool in = row->client != 0 && !row->done;
      done += row->done;
      act += in;
      if ((row->act != 0) != in ||
          (in && (row->act > j->nactive || j->active[row->act - 1].row != r))) {
        snprintf(why, cap, "job %" PRIu64 " row %u: client %" PRIu64
                 " done %d, active slot %u", j->id, r, row->client, row->done,
                 row->act);
        return false;
      }
      if (row->rank >= j->nrows || j->order[row->rank] != r) {
        snprintf(why, cap, "job %" PRIu64 " row %u: rank %u", j->id, r,
                 row->rank);
        return false;
      }
      if (row->rank < j->free_from && !row->done && row->client == 0) {
        snprintf(why, cap, "job %" PRIu64 " row %u: free at rank %u, "
                 "before the first free rank %u", j->id, r, row->rank,
                 j->free_from);
        return false;
      }
    }
    if (done != j->ndone || act != j->nactive) {
      snprintf(why, cap, "job %" PRIu64 ": %u rows done, %u active; the "
               "indexes say %u and %u", j->id, done, act, j->ndone,
               j->nactive);
      return false;
    }
  }
  for (size_t k = 0; d->heap_fresh && d->heap_ok && k < d->nheap; k++)
    if (d->heap[k]->heap_pos != k ||
        (k > 0 && heavier(d->heap[(k - 1) / 2], d->heap[k]))) {
      snprintf(why, cap, "worker heap: slot %zu (worker %" PRIu64 ")", k,
               d->heap[k]->id);
      return false;
    }
  return true;
}

uint64_t ferry__disp_epoch_delivered(const job_t *j) {
  uint64_t sum = 0;
  for (uint32_t i = 0; i < j->nrows; i++)
    sum += j->rows[i].delivered -
           (j->part_base != NULL ? j->part_base[i] : 0);
  return sum;
}

size_t ferry__disp_active_clients(const job_t *j) {
  size_t n = 0;
  for (size_t i = 0; i < j->nclients; i++)
    n += j->clients[i].active;
  return n;
}

int64_t ferry__disp_row_of(const job_t *j, uint32_t split, uint64_t worker,
                           uint64_t client, uint64_t lease) {
  if (j->part_split == NULL)
    return ferry__disp_row_index(j, split, worker);
  if (!j->started || split >= j->ds->nsplits)
    return -1;
  /* A client's report names the part by its lease (lease.h): an
   * epoch resumed with another world size may bind a client two parts of
   * one split. Without a lease (an older client), its first part. */
  for (uint32_t x = 0; x < j->split_nparts[split]; x++) {
    uint32_t r = j->split_part[split] + x;
    if (client == 0 && j->rows[r].lease == lease)
      return r;
    if (client == 0 || j->rows[r].client != client)
      continue;
    if (lease == 0 || ferry__lease_part(lease) == x % FERRY_LEASE_MAX_PARTS)
      return r;
  }
  return -1;
}

void ferry__disp_mark_idle(ferry_disp_t *d, job_t *j) {
  if (j->idle_since < 0)
    j->idle_since = d->now;
}

uint64_t ferry__disp_changes(const ferry_disp_t *d) { return d->changes; }

/* ---- Unreachable lists (state_unreach.c records them) ------------------ */

unreach_t *ferry__disp_unreach_find(const worker_t *w, uint64_t job,
                                    uint64_t client) {
  for (uint32_t i = 0; i < w->nunreach; i++)
    if (w->unreach[i].job == job && w->unreach[i].client == client)
      return &w->unreach[i];
  return NULL;
}

void ferry__disp_unreach_drop(ferry_disp_t *d, worker_t *w, uint32_t i) {
  job_t *j = ferry__disp_find_job(d, w->unreach[i].job);
  client_t *c = j != NULL ? ferry__disp_find_client(j, w->unreach[i].client)
                          : NULL;
  if (c != NULL && c->nunreach > 0)
    c->nunreach--;
  w->unreach[i] = w->unreach[--w->nunreach];
}

bool ferry__disp_unreachable_for(const ferry_disp_t *d, const worker_t *w,
                                 uint64_t job, uint64_t client) {
  if (w->nunreach == 0 || client == 0)
    return false;
  const unreach_t *u = ferry__disp_unreach_find(w, job, client);
  return u != NULL && d->now < u->avoid_until;
}

/* The entry's client, if still active in a running job. */
static bool entry_live(ferry_disp_t *d, const unreach_t *u) {
  job_t *j = ferry__disp_find_job(d, u->job);
  client_t *c = j != NULL && RUNNING(j) ? ferry__disp_find_client(j, u->client)
                                        : NULL;
  return c != NULL && c->active;
}

uint32_t ferry__disp_unreachable_count(ferry_disp_t *d, const worker_t *w) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < w->nunreach; i++)
    n += entry_live(d, &w->unreach[i]);
  return n;
}

void ferry__disp_prune_unreachable(ferry_disp_t *d, worker_t *w, bool all) {
  for (uint32_t k = w->nunreach; k-- > 0;)
    if (all || !entry_live(d, &w->unreach[k]))
      ferry__disp_unreach_drop(d, w, k);
}

void ferry__disp_free_cache_report(worker_t *w) {
  if (w->cache != NULL)
    ferry__v1__cache_report__free_unpacked(w->cache, &ferry__pb_allocator);
  ferry__free(w->cache_pb);
  w->cache = NULL;
  w->cache_pb = NULL;
  w->cache_len = 0;
}

void ferry__disp_free_unreachable(worker_t *w) {
  ferry__free(w->unreach);
  ferry__free(w->unreach_reason);
  w->unreach = NULL;
  w->unreach_reason = NULL;
  w->nunreach = w->unreach_cap = 0;
}
