/* Apply: the only code that changes journaled state (the invariants are in
 * state_internal.h), the commit path that applies a live entry and hands it
 * to the journal, replays, and the builders of the entries that several
 * parts commit. */
#include "state_apply.h"
#include "state_ranks.h"

#include "pb_alloc.h"

static void row_check_done(job_t *j, uint32_t idx) {
  row_t *r = &j->rows[idx];
  if (!r->done && r->total_known && r->delivered >= r->total) {
    r->done = true;
    ferry__disp_row_changed(j, idx, false); /* a removal: cannot fail */
  }
}

static int bad_entry(ferry_error_t *err, const char *what, uint64_t id) {
  return ferry__seterr(err, FERRY_EINVAL,
                       "journal entry does not fit the state: %s %" PRIu64,
                       what, id);
}

static int apply_register(ferry_disp_t *d,
                          const Ferry__V1__JournalRegisterDataset *m,
                          ferry_error_t *err) {
  dataset_t *ds;
  int rc;
  /* A snapshot gives the splits as parallel arrays (journal.proto). */
  bool arrays = m->n_splits == 0 && m->n_split_file > 0;
  size_t n = arrays ? m->n_split_file : m->n_splits;

  if (ferry__disp_find_dataset(d, m->dataset_id) != NULL)
    return ferry__seterr(err, FERRY_EINVAL, "dataset %s registered twice",
                         m->dataset_id);
  if (arrays && (m->n_split_offset != n || m->n_split_end != n ||
                 m->n_split_first != n || m->n_split_count != n))
    return ferry__seterr(err, FERRY_EINVAL,
                         "dataset %s: split arrays of different lengths",
                         m->dataset_id);
  if (n > UINT32_MAX)
    return bad_entry(err, "split count", n);
  ds = ferry__calloc(1, sizeof(*ds));
  if (ds == NULL)
    return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
  ferry__spec_init(&ds->spec);
  rc = ferry__spec_unpack(m->spec.data, m->spec.len, &ds->spec, err);
  if (rc != 0) {
    ferry__disp_free_dataset(ds);
    return rc;
  }
  ds->id = ferry__strdup(m->dataset_id);
  ds->spec_bytes = ferry__malloc(m->spec.len ? m->spec.len : 1);
  ds->files = ferry__calloc(m->n_files ? m->n_files : 1, sizeof(char *));
  ds->splits = ferry__calloc(n ? n : 1, sizeof(split_t));
  if (ds->id == NULL || ds->spec_bytes == NULL || ds->files == NULL ||
      ds->splits == NULL)
    goto nomem;
  memcpy(ds->spec_bytes, m->spec.data, m->spec.len);
  ds->spec_len = m->spec.len;
  for (size_t i = 0; i < m->n_files; i++, ds->nfiles++)
    if ((ds->files[i] = ferry__strdup(m->files[i])) == NULL)
      goto nomem;
  for (size_t i = 0; i < n; i++) {
    uint64_t file, count, offset, end, first;
    if (arrays) {
      file = m->split_file[i];
      count = m->split_count[i];
      offset = m->split_offset[i];
      end = m->split_end[i];
      first = m->split_first[i];
    } else {
      const Ferry__V1__Split *s = m->splits[i];
      file = s->file_index;
      count = s->num_records;
      offset = s->byte_offset;
      end = s->byte_end;
      first = s->first_record;
    }
    if (file >= ds->nfiles) {
      ferry__disp_free_dataset(ds);
      return bad_entry(err, "split file index", file);
    }
    if (count > UINT32_MAX) {
      ferry__disp_free_dataset(ds);
      return bad_entry(err, "split record count", count);
    }
    ds->splits[i] = (split_t){.file = (uint32_t)file,
                              .count = (uint32_t)count,
                              .offset = offset,
                              .end = end,
                              .first = first};
    ds->known_records += count;
  }
  ds->nsplits = (uint32_t)n;
  ds->idle_since = d->now;
  if (ferry__disp_push_ptr((void ***)&d->ds, &d->nds, ds) != 0)
    goto nomem;
  return 0;
nomem:
  ferry__disp_free_dataset(ds);
  return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
}

static int apply_create_job(ferry_disp_t *d,
                            const Ferry__V1__JournalCreateJob *m,
                            ferry_error_t *err) {
  dataset_t *ds = ferry__disp_find_dataset(d, m->dataset_id);
  job_t *j;

  if (ds == NULL)
    return ferry__seterr(err, FERRY_EINVAL,
                         "journal entry does not fit the state: dataset %s",
                         m->dataset_id);
  if (ferry__disp_find_job(d, m->job_id) != NULL)
    return bad_entry(err, "job created twice:", m->job_id);
  j = ferry__calloc(1, sizeof(*j));
  if (j == NULL)
    return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
  j->id = m->job_id;
  j->ds = ds;
  j->mode = m->mode;
  j->policy = m->error_policy;
  j->num_epochs = m->num_epochs;
  j->shuffle = m->shuffle;
  j->seed = m->seed;
  j->world_size = m->world_size;
  j->batch = m->batch_size;
  j->pad = m->pad_remainder;
  j->share = m->share;
  /* A job resumed at a cursor starts at its epoch. */
  j->resume_epoch = m->resume_epoch;
  j->resume_step = m->resume_step;
  j->epoch = j->epochs_done = m->resume_epoch;
  /* Elastic: the resumed epoch's earlier cuts and what they
   * left (check_ranked bounded them before the entry was written). */
  if (m->world_size > 0 && m->n_resume_earlier > 0) {
    uint32_t nc = (uint32_t)m->n_resume_earlier;
    j->cut_world = ferry__calloc(nc, sizeof(uint32_t));
    j->cut_step = ferry__calloc(nc, sizeof(uint64_t));
    if (j->cut_world == NULL || j->cut_step == NULL) {
      ferry__disp_free_job(j);
      return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
    }
    for (uint32_t i = 0; i < nc; i++) {
      j->cut_world[i] = m->resume_earlier[i]->world_size;
      j->cut_step[i] = m->resume_earlier[i]->step;
    }
    j->ncuts = nc;
    ferry__span_t *sp;
    uint32_t nsp;
    j->resume_left = ferry__disp_left_spans(ds->known_records, j->batch,
                                            j->pad, j->cut_world, j->cut_step,
                                            nc, &sp, &nsp);
    ferry__free(sp);
    if (j->resume_left == UINT64_MAX) {
      ferry__disp_free_job(j);
      return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
    }
  }
  j->state = FERRY__V1__JOB_STATE__JOB_STATE_RUNNING;
  j->idle_since = -1;
  ds->idle_since = -1;
  j->name = ferry__strdup(m->name);
  j->skipped_by_file = ferry__calloc(ds->nfiles, sizeof(uint64_t));
  if (j->name == NULL || j->skipped_by_file == NULL ||
      ferry__disp_push_ptr((void ***)&d->jobs, &d->njobs, j) != 0) {
    ferry__disp_free_job(j);
    return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
  }
  if (m->job_id >= d->next_job)
    d->next_job = m->job_id + 1;
  return 0;
}

static int apply_client_joined(ferry_disp_t *d,
                               const Ferry__V1__JournalClientJoined *m,
                               ferry_error_t *err) {
  job_t *j = ferry__disp_find_job(d, m->job_id);
  client_t *c;

  if (j == NULL)
    return bad_entry(err, "job", m->job_id);
  c = ferry__disp_find_client(j, m->client_id);
  if (c == NULL) {
    if (!FERRY__GROW(j->clients, j->clients_cap, j->nclients + 1, 4))
      return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
    c = &j->clients[j->nclients++];
    memset(c, 0, sizeof(*c));
    c->id = m->client_id;
    c->rank = -1;
  } else {
    c->incarnation++; /* a rejoin: it lost every split it held */
  }
  if (m->client_secret.len == FERRY_CLIENT_SECRET_BYTES) {
    memcpy(c->secret, m->client_secret.data, FERRY_CLIENT_SECRET_BYTES);
    c->has_secret = true;
  }
  if (m->ranked)
    c->rank = m->rank;
  c->active = true;
  c->no_renew = false;
  c->last_hb = d->now;
  if (RUNNING(j))
    j->idle_since = -1;
  if (m->client_id >= d->next_client)
    d->next_client = m->client_id + 1;
  return 0;
}

/* Unbinds the client's rows that are not done: they go back to the pool
 * with their delivered count, and their lease ends (worker 0). */
static int apply_client_left(ferry_disp_t *d,
                             const Ferry__V1__JournalClientLeft *m,
                             ferry_error_t *err) {
  job_t *j = ferry__disp_find_job(d, m->job_id);
  client_t *c = j != NULL ? ferry__disp_find_client(j, m->client_id) : NULL;

  if (c == NULL)
    return bad_entry(err, "client", m->client_id);
  c->active = false;
  /* Its rows not done are all in the active list; each removal moves the
   * last entry into the hole, so walk it from the end. */
  for (uint32_t k = j->nactive; k-- > 0;) {
    uint32_t r = j->active[k].row;
    row_t *row = &j->rows[r];
    if (row->client == m->client_id && !row->done) {
      row->client = 0;
      row->worker = 0;
      if (j->row_end != NULL)
        j->row_end[r] = 0;
      ferry__disp_row_changed(j, r, false); /* a removal: cannot fail */
    }
  }
  if (ferry__disp_active_clients(j) == 0)
    ferry__disp_mark_idle(d, j);
  return 0;
}

static int apply_assign(ferry_disp_t *d, const Ferry__V1__JournalAssign *m,
                        ferry_error_t *err) {
  job_t *j = ferry__disp_find_job(d, m->job_id);
  row_t *r = j != NULL ? ferry__disp_job_row(j, m->epoch, m->row) : NULL;

  if (r == NULL)
    return bad_entry(err, "assign: row", m->row);
  r->client = m->client_id;
  r->worker = m->worker_id;
  r->lease = m->lease;
  r->start = m->start;
  if (j->row_end != NULL)
    j->row_end[m->row] = m->client_id != 0 ? m->end : 0;
  if (ferry__disp_row_changed(j, m->row, r->done) != 0)
    return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
  return 0;
}

/* A row's delivered count grows to `to`: the growth counts for
 * the rank of the row's client (its binding ends at row_end, so the
 * growth never takes the rank past its quota). */
static void rank_progress(job_t *j, uint32_t idx, uint64_t to) {
  const row_t *r = &j->rows[idx];
  const client_t *c;
  if (j->rank_taken == NULL || r->client == 0 ||
      (c = ferry__disp_find_client(j, r->client)) == NULL || c->rank < 0 ||
      c->rank >= (int64_t)j->world_size)
    return;
  j->rank_taken[c->rank] += to - r->delivered;
}

static int apply_progress(ferry_disp_t *d, const Ferry__V1__JournalProgress *m,
                          ferry_error_t *err) {
  job_t *j = ferry__disp_find_job(d, m->job_id);

  if (j == NULL)
    return bad_entry(err, "job", m->job_id);
  for (size_t i = 0; i < m->n_rows; i++) {
    row_t *r = ferry__disp_job_row(j, m->epoch, m->rows[i]->row);
    if (r == NULL)
      return bad_entry(err, "progress: row", m->rows[i]->row);
    if (m->rows[i]->delivered > r->delivered) {
      rank_progress(j, m->rows[i]->row, m->rows[i]->delivered);
      r->delivered = m->rows[i]->delivered;
      r->restarts = 0; /* progress: restarts no longer count in a row */
    }
    row_check_done(j, m->rows[i]->row);
  }
  return 0;
}

static int apply_task_finished(ferry_disp_t *d,
                               const Ferry__V1__JournalTaskFinished *m,
                               ferry_error_t *err) {
  job_t *j = ferry__disp_find_job(d, m->job_id);
  row_t *r = j != NULL ? ferry__disp_job_row(j, m->epoch, m->row) : NULL;

  if (r == NULL)
    return bad_entry(err, "finished: row", m->row);
  /* A part of a split (ranked jobs) ends at its own end; the worker
   * names the split's. */
  r->total = j->part_base != NULL && m->total > r->total ? r->total
                                                         : m->total;
  r->total_known = true;
  row_check_done(j, m->row);
  return 0;
}

static int apply_job_failed(ferry_disp_t *d,
                            const Ferry__V1__JournalJobFailed *m,
                            ferry_error_t *err) {
  job_t *j = ferry__disp_find_job(d, m->job_id);
  char *msg;

  if (j == NULL)
    return bad_entry(err, "job", m->job_id);
  if ((msg = ferry__strdup(m->error)) == NULL)
    return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
  ferry__free(j->error);
  j->error = msg;
  j->error_code = m->error_code;
  j->state = FERRY__V1__JOB_STATE__JOB_STATE_FAILED;
  ferry__disp_mark_idle(d, j);
  return 0;
}

/* Builds the epoch's rows: one per split, or per (worker, split). */
static int apply_epoch_start(ferry_disp_t *d,
                             const Ferry__V1__JournalEpochStart *m,
                             ferry_error_t *err) {
  job_t *j = ferry__disp_find_job(d, m->job_id);
  uint32_t ns, nw, n, nsplit_order;
  uint32_t *perm;

  if (j == NULL || j->started || m->epoch != j->epoch || !RUNNING(j))
    return bad_entry(err, "epoch start for job", m->job_id);
  ns = j->ds->nsplits;
  nw = PAR(j) ? (uint32_t)m->n_workers : 1;
  n = ns * nw;
  if (j->world_size > 0) {
    /* Rows are the parts of splits each rank takes. */
    perm = ferry__calloc(ns ? ns : 1, sizeof(uint32_t));
    j->ep_workers = ferry__calloc(1, sizeof(uint64_t));
    j->rank_taken = ferry__calloc(j->world_size, sizeof(uint64_t));
    if (perm != NULL)
      ferry__disp_split_order(j->shuffle, j->seed, j->epoch, perm, ns);
    if (perm == NULL || j->ep_workers == NULL || j->rank_taken == NULL ||
        ferry__disp_plan_ranks(j, perm) != 0) {
      ferry__free(perm);
      ferry__disp_free_rows(j);
      return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
    }
    ferry__free(perm);
    j->n_ep_workers = 0;
    j->nactive = j->ndone = j->free_from = 0;
    j->started = true;
    /* A resumed job's first epoch starts at its cursor. */
    if (ferry__disp_resume_rows(j) != 0) {
      ferry__disp_free_rows(j);
      j->started = false;
      return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
    }
    return 0;
  }
  j->rows = ferry__calloc(n ? n : 1, sizeof(row_t));
  j->order = ferry__calloc(n ? n : 1, sizeof(uint32_t));
  j->ep_workers = ferry__calloc(nw, sizeof(uint64_t));
  perm = ferry__calloc(ns ? ns : 1, sizeof(uint32_t));
  if (j->rows == NULL || j->order == NULL || j->ep_workers == NULL ||
      perm == NULL) {
    ferry__free(perm);
    ferry__disp_free_rows(j);
    return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
  }
  for (uint32_t r = 0; r < n; r++) {
    const split_t *s = &j->ds->splits[r % ns];
    j->rows[r].total = s->count;
    j->rows[r].total_known = s->count > 0;
  }
  /* Hand-out order: the epoch's split permutation, and for each split
   * every worker's row, so that a client's splits spread over workers. */
  ferry__disp_split_order(j->shuffle, j->seed, j->epoch, perm, ns);
  nsplit_order = 0;
  for (uint32_t i = 0; i < ns; i++)
    for (uint32_t s = 0; s < nw; s++) {
      j->rows[s * ns + perm[i]].rank = nsplit_order;
      j->order[nsplit_order++] = s * ns + perm[i];
    }
  ferry__free(perm);
  if (PAR(j))
    memcpy(j->ep_workers, m->workers, nw * sizeof(uint64_t));
  j->n_ep_workers = PAR(j) ? nw : 0;
  j->nrows = n;
  j->nactive = j->ndone = j->free_from = 0;
  j->started = true;
  return 0;
}

static int apply_epoch_done(ferry_disp_t *d,
                            const Ferry__V1__JournalEpochDone *m,
                            ferry_error_t *err) {
  job_t *j = ferry__disp_find_job(d, m->job_id);

  if (j == NULL || !j->started || m->epoch != j->epoch)
    return bad_entry(err, "epoch done for job", m->job_id);
  j->delivered_prev += ferry__disp_epoch_delivered(j);
  j->epochs_done++;
  ferry__disp_free_rows(j);
  if (j->num_epochs >= 0 && j->epochs_done >= (uint64_t)j->num_epochs) {
    j->state = FERRY__V1__JOB_STATE__JOB_STATE_FINISHED;
    ferry__disp_mark_idle(d, j);
  } else {
    j->epoch++;
  }
  return 0;
}

static int apply_worker_registered(ferry_disp_t *d,
                                   const Ferry__V1__JournalWorkerRegistered *m,
                                   ferry_error_t *err) {
  worker_t *w = ferry__disp_find_worker(d, m->worker_id);
  char *addr = ferry__strdup(m->address);

  if (addr == NULL)
    return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
  if (w == NULL) {
    w = ferry__calloc(1, sizeof(*w));
    if (w == NULL ||
        ferry__disp_push_ptr((void ***)&d->workers, &d->nworkers, w) != 0) {
      ferry__free(w);
      ferry__free(addr);
      return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
    }
    w->id = m->worker_id;
    w->heap_pos = UINT32_MAX; /* until ferry__disp_recount */
  } else {
    /* Registered again: what clients could not reach may be fixed. */
    ferry__disp_prune_unreachable(d, w, true);
  }
  ferry__free(w->address);
  w->address = addr;
  w->lost = false;
  w->left = false;
  w->suspect_since = -1;
  w->last_hb = d->now;
  if (m->worker_id >= d->next_worker)
    d->next_worker = m->worker_id + 1;
  return 0;
}

/* distributed_epoch: the worker's unfinished rows wait for a new lease
 * (still bound to their clients). parallel_epochs: its pinned rows are
 * dropped as done-with-loss. */
static void release_rows(ferry_disp_t *d, uint64_t worker) {
  for (size_t i = 0; i < d->njobs; i++) {
    job_t *j = d->jobs[i];
    for (uint32_t r = 0; r < j->nrows; r++) {
      row_t *row = &j->rows[r];
      if (row->done)
        continue;
      if (PAR(j) && ferry__disp_row_pinned(j, r) == worker) {
        row->done = row->lost = true;
        row->worker = 0;
        ferry__disp_row_changed(j, r, false); /* a removal: cannot fail */
      } else if (row->worker == worker) {
        row->worker = 0;
      }
    }
  }
}

/* The worker's rows go (release_rows). */
static int apply_worker_lost(ferry_disp_t *d,
                             const Ferry__V1__JournalWorkerLost *m,
                             ferry_error_t *err) {
  worker_t *w = ferry__disp_find_worker(d, m->worker_id);

  if (w == NULL)
    return bad_entry(err, "worker", m->worker_id);
  w->lost = true;
  w->left = m->left;
  release_rows(d, m->worker_id);
  return 0;
}

/* No new lease for the worker; its rows that are not done wait
 * for another worker, from their delivered count, exactly as when it is
 * lost (parallel_epochs: its pinned rows end with loss). */
static int apply_worker_drained(ferry_disp_t *d,
                                const Ferry__V1__JournalWorkerDrained *m,
                                ferry_error_t *err) {
  worker_t *w = ferry__disp_find_worker(d, m->worker_id);
  if (w == NULL)
    return bad_entry(err, "drained worker", m->worker_id);
  w->op_drained = true;
  w->drain_beats = w->beats;
  release_rows(d, m->worker_id);
  return 0;
}

/* The job ends; its clients hear why from their heartbeats. */
static int apply_job_cancelled(ferry_disp_t *d,
                               const Ferry__V1__JournalJobCancelled *m,
                               ferry_error_t *err) {
  job_t *j = ferry__disp_find_job(d, m->job_id);
  char buf[128], *msg;

  if (j == NULL || !RUNNING(j))
    return bad_entry(err, "cancelled job", m->job_id);
  if (m->superseded_by != 0)
    snprintf(buf, sizeof(buf), "job %" PRIu64 " superseded by job %" PRIu64
             ", which resumed from a checkpoint cursor", j->id,
             m->superseded_by);
  else
    snprintf(buf, sizeof(buf), "job %" PRIu64 " cancelled by the operator",
             j->id);
  if ((msg = ferry__strdup(buf)) == NULL)
    return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
  ferry__free(j->error);
  j->error = msg;
  j->error_code = FERRY_ECANCELED;
  j->state = FERRY__V1__JOB_STATE__JOB_STATE_CANCELLED;
  ferry__disp_mark_idle(d, j);
  return 0;
}

static int apply_skipped(ferry_disp_t *d, const Ferry__V1__JournalSkipped *m,
                         ferry_error_t *err) {
  job_t *j = ferry__disp_find_job(d, m->job_id);
  row_t *r = j != NULL ? ferry__disp_job_row(j, m->epoch, m->row) : NULL;
  uint64_t delta;

  if (r == NULL)
    return bad_entry(err, "skipped: row", m->row);
  /* Only a row under lease (so on the active list) reports skips. */
  active_t none = {0}, *s = ferry__disp_row_active(j, r);
  if (s == NULL)
    s = &none;
  if (s->skip_lease != m->lease) {
    s->skip_lease = m->lease;
    s->skip_seen = 0;
  }
  if (m->skipped <= s->skip_seen)
    return 0;
  delta = m->skipped - s->skip_seen;
  s->skip_seen = m->skipped;
  j->skipped += delta;
  j->skipped_by_file[j->ds->splits[ferry__disp_row_split(j, m->row)].file] +=
      delta;
  return 0;
}

bool ferry__disp_dataset_used(const ferry_disp_t *d, const dataset_t *ds) {
  for (size_t i = 0; i < d->njobs; i++)
    if (d->jobs[i]->ds == ds)
      return true;
  return false;
}

static int apply_job_gc(ferry_disp_t *d, const Ferry__V1__JournalJobGC *m,
                        ferry_error_t *err) {
  for (size_t i = 0; i < d->njobs; i++) {
    if (d->jobs[i]->id != m->job_id)
      continue;
    dataset_t *ds = d->jobs[i]->ds;
    ferry__disp_free_job(d->jobs[i]);
    memmove(&d->jobs[i], &d->jobs[i + 1], (d->njobs - i - 1) * sizeof(job_t *));
    d->njobs--;
    if (!ferry__disp_dataset_used(d, ds))
      ds->idle_since = d->now;
    return 0;
  }
  return bad_entry(err, "job", m->job_id);
}

static int apply_dataset_gc(ferry_disp_t *d,
                            const Ferry__V1__JournalDatasetGC *m,
                            ferry_error_t *err) {
  for (size_t i = 0; i < d->nds; i++) {
    if (strcmp(d->ds[i]->id, m->dataset_id) != 0)
      continue;
    if (ferry__disp_dataset_used(d, d->ds[i]))
      break;
    if (d->snap_pins == 0)
      ferry__disp_free_dataset(d->ds[i]);
    else if (ferry__disp_push_ptr((void ***)&d->collected, &d->ncollected,
                                  d->ds[i]) != 0)
      return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
    memmove(&d->ds[i], &d->ds[i + 1], (d->nds - i - 1) * sizeof(dataset_t *));
    d->nds--;
    return 0;
  }
  return ferry__seterr(err, FERRY_EINVAL,
                       "journal entry does not fit the state: dataset %s "
                       "collected while unknown or in use",
                       m->dataset_id);
}

static int apply_boot(ferry_disp_t *d, const Ferry__V1__JournalBoot *m,
                      ferry_error_t *err) {
  if (m->boot <= d->boot)
    return bad_entry(err, "boot", m->boot);
  d->boot = m->boot;
  return 0;
}

/* ---- Snapshots (snapshot.c writes them) ---------------------------------- */

static int apply_segment(ferry_disp_t *d, const Ferry__V1__JournalSegment *m,
                         ferry_error_t *err) {
  if (m->segment != d->segment)
    return ferry__seterr(err, FERRY_EINVAL,
                         "journal segment %" PRIu64 " does not follow the "
                         "snapshot (it is followed by segment %" PRIu64 ")",
                         m->segment, d->segment);
  return 0;
}

static int apply_snapshot_begin(ferry_disp_t *d,
                                const Ferry__V1__JournalSnapshotBegin *m,
                                ferry_error_t *err) {
  if (d->nds != 0 || d->njobs != 0 || d->nworkers != 0 || d->snap_open ||
      d->snap_done)
    return ferry__seterr(err, FERRY_EINVAL,
                         "journal entry does not fit the state: a snapshot "
                         "begins on a state that is not empty");
  d->segment = m->segment;
  d->next_job = m->next_job > 0 ? m->next_job : 1;
  d->next_client = m->next_client > 0 ? m->next_client : 1;
  d->next_worker = m->next_worker > 0 ? m->next_worker : 1;
  d->boot = m->boot;
  d->snap_open = true;
  d->snap_count = 0;
  return 0;
}

static int apply_snapshot_end(ferry_disp_t *d,
                              const Ferry__V1__JournalSnapshotEnd *m,
                              ferry_error_t *err) {
  if (!d->snap_open)
    return ferry__seterr(err, FERRY_EINVAL, "a snapshot end without its "
                         "beginning");
  if (m->entries != d->snap_count)
    return ferry__seterr(err, FERRY_EINVAL,
                         "the snapshot's end says %" PRIu64 " entries, %"
                         PRIu64 " came before it",
                         m->entries, d->snap_count);
  d->snap_open = false;
  d->snap_done = true;
  return 0;
}

enum { ROW_TOTAL_KNOWN = 1, ROW_DONE = 2, ROW_LOST = 4 };

static int job_state_rows(ferry_disp_t *d, job_t *j,
                          const Ferry__V1__JournalJobState *m,
                          ferry_error_t *err) {
  Ferry__V1__JournalEpochStart es = FERRY__V1__JOURNAL_EPOCH_START__INIT;
  int state = j->state, rc;
  uint32_t n;

  es.job_id = j->id;
  es.epoch = j->epoch;
  es.n_workers = m->n_epoch_workers;
  es.workers = m->epoch_workers;
  j->state = FERRY__V1__JOB_STATE__JOB_STATE_RUNNING;
  rc = apply_epoch_start(d, &es, err);
  j->state = state;
  if (rc != 0)
    return rc;
  n = j->nrows;
  if (m->rows != n || m->n_row_client != n || m->n_row_lease != n ||
      m->n_row_start != n || m->n_row_delivered != n || m->n_row_total != n ||
      m->n_row_flags != n || m->n_row_skip_lease != n ||
      m->n_row_skip_seen != n ||
      (j->row_end != NULL && m->n_row_end != n) ||
      (j->rank_taken != NULL && m->n_rank_taken != j->world_size))
    return bad_entry(err, "job state: rows of job", j->id);
  if (j->rank_taken != NULL)
    memcpy(j->rank_taken, m->rank_taken, j->world_size * sizeof(uint64_t));
  for (uint32_t r = 0; r < n; r++) {
    row_t *row = &j->rows[r];
    active_t *a;
    row->client = m->row_client[r];
    row->lease = m->row_lease[r];
    row->start = m->row_start[r];
    row->delivered = m->row_delivered[r];
    row->total = m->row_total[r];
    row->total_known = (m->row_flags[r] & ROW_TOTAL_KNOWN) != 0;
    row->done = (m->row_flags[r] & ROW_DONE) != 0;
    row->lost = (m->row_flags[r] & ROW_LOST) != 0;
    if (j->row_end != NULL)
      j->row_end[r] = m->row_end[r];
    /* The job's indexes (active list, done count, first free rank). */
    if (ferry__disp_row_changed(j, r, false) != 0)
      return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
    /* Only an active row keeps a skipped-count dedupe. */
    if ((a = ferry__disp_row_active(j, row)) != NULL) {
      a->skip_lease = m->row_skip_lease[r];
      a->skip_seen = m->row_skip_seen[r];
    }
  }
  return 0;
}

/* A whole job (snapshot.c writes it from the same fields). */
static int apply_job_state(ferry_disp_t *d,
                           const Ferry__V1__JournalJobState *m,
                           ferry_error_t *err) {
  job_t *j;
  int rc;

  if (m->job == NULL)
    return bad_entry(err, "job state without its job", 0);
  if ((rc = apply_create_job(d, m->job, err)) != 0)
    return rc;
  j = ferry__disp_find_job(d, m->job->job_id);
  if (m->n_skipped_by_file != j->ds->nfiles)
    return bad_entry(err, "job state: skipped counts of job", j->id);
  j->state = m->state;
  j->error_code = m->error_code;
  if (m->error != NULL && m->error[0] != '\0' &&
      (j->error = ferry__strdup(m->error)) == NULL)
    return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
  j->epoch = m->epoch;
  j->epochs_done = m->epochs_done;
  j->delivered_prev = m->delivered_prev;
  j->skipped = m->skipped;
  if (j->ds->nfiles > 0)
    memcpy(j->skipped_by_file, m->skipped_by_file,
           j->ds->nfiles * sizeof(uint64_t));
  if (m->n_clients > 0) {
    j->clients = ferry__calloc(m->n_clients, sizeof(client_t));
    if (j->clients == NULL)
      return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
    j->clients_cap = m->n_clients;
    for (size_t i = 0; i < m->n_clients; i++) {
      const Ferry__V1__JournalClientState *cs = m->clients[i];
      client_t *c = &j->clients[j->nclients++];
      c->id = cs->client_id;
      c->active = cs->active;
      c->incarnation = cs->incarnation;
      c->rank = cs->ranked ? (int64_t)cs->rank : -1;
      c->last_hb = d->now;
      if (cs->client_secret.len == FERRY_CLIENT_SECRET_BYTES) {
        memcpy(c->secret, cs->client_secret.data, FERRY_CLIENT_SECRET_BYTES);
        c->has_secret = true;
      }
      if (cs->client_id >= d->next_client)
        d->next_client = cs->client_id + 1;
    }
  }
  if (m->started && (rc = job_state_rows(d, j, m, err)) != 0)
    return rc;
  j->idle_since = m->idle ? d->now : -1;
  return 0;
}

static int apply(ferry_disp_t *d, const entry_t *e, ferry_error_t *err) {
  if (d->snap_open)
    d->snap_count++;
  switch (e->entry_case) {
  case FERRY__V1__JOURNAL_ENTRY__ENTRY_SEGMENT:
    return apply_segment(d, e->segment, err);
  case FERRY__V1__JOURNAL_ENTRY__ENTRY_SNAPSHOT_BEGIN:
    return apply_snapshot_begin(d, e->snapshot_begin, err);
  case FERRY__V1__JOURNAL_ENTRY__ENTRY_SNAPSHOT_END:
    d->snap_count--; /* counts the entries before it */
    return apply_snapshot_end(d, e->snapshot_end, err);
  case FERRY__V1__JOURNAL_ENTRY__ENTRY_JOB_STATE:
    return apply_job_state(d, e->job_state, err);
  case FERRY__V1__JOURNAL_ENTRY__ENTRY_REGISTER_DATASET:
    return apply_register(d, e->register_dataset, err);
  case FERRY__V1__JOURNAL_ENTRY__ENTRY_CREATE_JOB:
    return apply_create_job(d, e->create_job, err);
  case FERRY__V1__JOURNAL_ENTRY__ENTRY_CLIENT_JOINED:
    return apply_client_joined(d, e->client_joined, err);
  case FERRY__V1__JOURNAL_ENTRY__ENTRY_CLIENT_LEFT:
    return apply_client_left(d, e->client_left, err);
  case FERRY__V1__JOURNAL_ENTRY__ENTRY_ASSIGN:
    return apply_assign(d, e->assign, err);
  case FERRY__V1__JOURNAL_ENTRY__ENTRY_PROGRESS:
    return apply_progress(d, e->progress, err);
  case FERRY__V1__JOURNAL_ENTRY__ENTRY_TASK_FINISHED:
    return apply_task_finished(d, e->task_finished, err);
  case FERRY__V1__JOURNAL_ENTRY__ENTRY_JOB_FAILED:
    return apply_job_failed(d, e->job_failed, err);
  case FERRY__V1__JOURNAL_ENTRY__ENTRY_EPOCH_START:
    return apply_epoch_start(d, e->epoch_start, err);
  case FERRY__V1__JOURNAL_ENTRY__ENTRY_EPOCH_DONE:
    return apply_epoch_done(d, e->epoch_done, err);
  case FERRY__V1__JOURNAL_ENTRY__ENTRY_WORKER_REGISTERED:
    return apply_worker_registered(d, e->worker_registered, err);
  case FERRY__V1__JOURNAL_ENTRY__ENTRY_WORKER_LOST:
    return apply_worker_lost(d, e->worker_lost, err);
  case FERRY__V1__JOURNAL_ENTRY__ENTRY_SKIPPED:
    return apply_skipped(d, e->skipped, err);
  case FERRY__V1__JOURNAL_ENTRY__ENTRY_JOB_GC:
    return apply_job_gc(d, e->job_gc, err);
  case FERRY__V1__JOURNAL_ENTRY__ENTRY_BOOT:
    return apply_boot(d, e->boot, err);
  case FERRY__V1__JOURNAL_ENTRY__ENTRY_DATASET_GC:
    return apply_dataset_gc(d, e->dataset_gc, err);
  case FERRY__V1__JOURNAL_ENTRY__ENTRY_WORKER_DRAINED:
    return apply_worker_drained(d, e->worker_drained, err);
  case FERRY__V1__JOURNAL_ENTRY__ENTRY_JOB_CANCELLED:
    return apply_job_cancelled(d, e->job_cancelled, err);
  default:
    return ferry__seterr(err, FERRY_EINVAL, "journal entry of unknown kind %d",
                         (int)e->entry_case);
  }
}

/* The largest serialization buffer kept between commits. */
#define SCRATCH_KEEP (1u << 20)

/* Counts what a committed live entry did (ferry__disp_counters);
 * `relet`: an assignment of a row that had a lease before in this epoch. */
static void count(ferry_disp_t *d, const entry_t *e, bool relet) {
  ferry_disp_counters_t *c = &d->counters;
  switch (e->entry_case) {
  case FERRY__V1__JOURNAL_ENTRY__ENTRY_ASSIGN:
    if (e->assign->worker_id != 0) {
      c->leases++;
      c->relets += relet;
    }
    break;
  case FERRY__V1__JOURNAL_ENTRY__ENTRY_WORKER_LOST:
    if (e->worker_lost->left)
      c->workers_left++;
    else
      c->workers_lost++;
    break;
  case FERRY__V1__JOURNAL_ENTRY__ENTRY_CLIENT_LEFT:
    c->clients_lost += e->client_left->lost;
    break;
  default:
    break;
  }
}

int ferry__disp_commit(ferry_disp_t *d, const entry_t *e, ferry_error_t *err) {
  size_t n = protobuf_c_message_get_packed_size(&e->base);
  int rc;

  if (d->sink != NULL && !FERRY__GROW(d->scratch, d->scratch_cap, n, 256))
    return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
  /* The counters count what this process does (replays do not come
   * here). */
  bool relet = false;
  if (e->entry_case == FERRY__V1__JOURNAL_ENTRY__ENTRY_ASSIGN) {
    const job_t *j = ferry__disp_find_job(d, e->assign->job_id);
    const row_t *row =
        j != NULL
            ? ferry__disp_job_row((job_t *)j, e->assign->epoch, e->assign->row)
            : NULL;
    relet = row != NULL && ferry__lease_issued(row->lease);
  }
  rc = apply(d, e, err);
  if (rc != 0) {
    FERRY_LOG(FERRY_LOG_ERROR, "dispatcher: entry not applied: %s",
              err != NULL ? err->msg : ferry_strerror(rc));
    return rc;
  }
  count(d, e, relet);
  d->changes++;
  if (d->sink != NULL) {
    protobuf_c_message_pack(&e->base, d->scratch);
    d->sink(d->scratch, n, d->sink_arg);
    /* The buffer stays for the next entry, unless a rare large one (a
     * dataset's split list) grew it: that would stay resident. */
    if (d->scratch_cap > SCRATCH_KEEP) {
      ferry__free(d->scratch);
      d->scratch = NULL;
      d->scratch_cap = 0;
    }
  }
  return 0;
}

/* Entries over this many bytes unpack into an arena. */
#define APPLY_ARENA_MIN (64u << 10)

int ferry__disp_apply(ferry_disp_t *d, const uint8_t *buf, size_t len,
                      int64_t now_ms, ferry_error_t *err) {
  entry_t *e;
  int rc;
  /* A large entry (a dataset's split list: a million Split messages)
   * unpacks into an arena, freed in one go, rather than one malloc and
   * one free per message (that was half of a replay). */
  bool large = len > APPLY_ARENA_MIN;
  ferry_arena_t arena = {0};
  ProtobufCAllocator arena_alloc;
  ferry__disp_arena_allocator(&arena, &arena_alloc);

  e = ferry__v1__journal_entry__unpack(
      large ? &arena_alloc : &ferry__pb_allocator, len, buf);
  if (e == NULL) {
    ferry__arena_free(&arena);
    return ferry__seterr(err, FERRY_EINVAL, "malformed journal entry");
  }
  d->now = now_ms;
  d->recount_valid = false; /* rows change without `changes` moving */
  rc = apply(d, e, err);
  if (large)
    ferry__arena_free(&arena);
  else
    ferry__v1__journal_entry__free_unpacked(e, &ferry__pb_allocator);
  return rc;
}

void ferry__disp_replayed(ferry_disp_t *d, int64_t now_ms) {
  d->now = now_ms;
  d->recount_valid = false;
  for (size_t i = 0; i < d->nworkers; i++)
    d->workers[i]->last_hb = now_ms;
  for (size_t i = 0; i < d->njobs; i++) {
    job_t *j = d->jobs[i];
    for (size_t c = 0; c < j->nclients; c++)
      j->clients[c].last_hb = now_ms;
    if (j->idle_since >= 0)
      j->idle_since = now_ms;
    /* Leases are volatile: the journal may not know the last one. */
    for (uint32_t r = 0; r < j->nrows; r++)
      j->rows[r].worker = 0;
  }
  for (size_t i = 0; i < d->nds; i++)
    if (d->ds[i]->idle_since >= 0)
      d->ds[i]->idle_since = now_ms;
  /* The replay unpacked every entry: split lists of large datasets. */
  ferry__disp_trim_heap();
}

int ferry__disp_boot(ferry_disp_t *d, ferry_error_t *err) {
  Ferry__V1__JournalBoot m = FERRY__V1__JOURNAL_BOOT__INIT;
  m.boot = d->boot + 1;
  entry_t e = FERRY__V1__JOURNAL_ENTRY__INIT;
  e.entry_case = FERRY__V1__JOURNAL_ENTRY__ENTRY_BOOT;
  e.boot = &m;
  return ferry__disp_commit(d, &e, err);
}

int ferry__disp_emit_assign(ferry_disp_t *d, job_t *j, uint32_t row,
                            uint64_t client, uint64_t worker, uint64_t lease,
                            uint64_t start, uint64_t end) {
  Ferry__V1__JournalAssign m = FERRY__V1__JOURNAL_ASSIGN__INIT;
  m.job_id = j->id;
  m.epoch = j->epoch;
  m.row = row;
  m.client_id = client;
  m.worker_id = worker;
  m.lease = lease;
  m.start = start;
  m.end = end;
  ENTRY(e, ASSIGN, assign, m);
  return ferry__disp_commit(d, &e, NULL);
}

int ferry__disp_emit_client_left(ferry_disp_t *d, job_t *j, uint64_t client,
                                 bool lost) {
  Ferry__V1__JournalClientLeft m = FERRY__V1__JOURNAL_CLIENT_LEFT__INIT;
  m.job_id = j->id;
  m.client_id = client;
  m.lost = lost;
  ENTRY(e, CLIENT_LEFT, client_left, m);
  return ferry__disp_commit(d, &e, NULL);
}

int ferry__disp_emit_client_joined(ferry_disp_t *d, job_t *j, uint64_t client,
                                   const uint8_t *secret, int64_t rank,
                                   ferry_error_t *err) {
  Ferry__V1__JournalClientJoined m = FERRY__V1__JOURNAL_CLIENT_JOINED__INIT;
  m.job_id = j->id;
  m.client_id = client;
  m.ranked = rank >= 0;
  m.rank = rank >= 0 ? (uint32_t)rank : 0;
  if (secret != NULL) {
    m.client_secret.data = (uint8_t *)secret;
    m.client_secret.len = FERRY_CLIENT_SECRET_BYTES;
  }
  ENTRY(e, CLIENT_JOINED, client_joined, m);
  return ferry__disp_commit(d, &e, err);
}

int ferry__disp_emit_job_failed(ferry_disp_t *d, job_t *j, int code,
                                const char *msg) {
  Ferry__V1__JournalJobFailed m = FERRY__V1__JOURNAL_JOB_FAILED__INIT;
  char clean[FERRY_DISP_MAX_ERROR_LEN + 8];
  ferry__disp_utf8_clean(msg, clean, sizeof(clean));
  msg = clean;
  m.job_id = j->id;
  m.error_code = code;
  m.error = (char *)msg;
  ENTRY(e, JOB_FAILED, job_failed, m);
  FERRY_LOG(FERRY_LOG_WARN, "job %" PRIu64 " failed: %s", j->id, msg);
  return ferry__disp_commit(d, &e, NULL);
}
