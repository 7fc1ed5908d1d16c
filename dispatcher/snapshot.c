/* Snapshots and the restore from disk (see snapshot.h). */
#include "snapshot.h"
#include "state_internal.h"

#include "pb_alloc.h"

/* The framed records of a snapshot being written. */
typedef struct out_s {
  uint8_t *buf, *scratch;
  size_t len, cap, scratch_cap;
  uint64_t entries;
  int rc;
} out_t;

static void put(out_t *o, const entry_t *e) {
  size_t n = protobuf_c_message_get_packed_size(&e->base);
  if (o->rc != 0)
    return;
  if (!FERRY__GROW(o->scratch, o->scratch_cap, n, 256)) {
    o->rc = FERRY_ENOMEM;
    return;
  }
  protobuf_c_message_pack(&e->base, o->scratch);
  o->rc = ferry__journal_frame(&o->buf, &o->len, &o->cap, o->scratch, n);
  o->entries++;
}

/* A dataset with its splits as the parallel arrays of journal.proto. */
static void put_dataset(out_t *o, const dataset_t *ds) {
  Ferry__V1__JournalRegisterDataset m =
      FERRY__V1__JOURNAL_REGISTER_DATASET__INIT;
  size_t n = ds->nsplits;
  uint32_t *file = ferry__malloc((n ? n : 1) * sizeof(uint32_t));
  uint64_t *u = ferry__malloc((n ? n : 1) * 4 * sizeof(uint64_t));

  if (file == NULL || u == NULL) {
    o->rc = FERRY_ENOMEM;
  } else {
    for (size_t i = 0; i < n; i++) {
      const split_t *sp = &ds->splits[i];
      file[i] = sp->file;
      u[i] = sp->offset;
      u[n + i] = sp->end;
      u[2 * n + i] = sp->first;
      u[3 * n + i] = sp->count;
    }
    m.dataset_id = ds->id;
    m.spec.data = ds->spec_bytes;
    m.spec.len = ds->spec_len;
    m.files = ds->files;
    m.n_files = ds->nfiles;
    m.n_split_file = m.n_split_offset = m.n_split_end = m.n_split_first =
        m.n_split_count = n;
    m.split_file = file;
    m.split_offset = u;
    m.split_end = u + n;
    m.split_first = u + 2 * n;
    m.split_count = u + 3 * n;
    ENTRY(e, REGISTER_DATASET, register_dataset, m);
    put(o, &e);
  }
  ferry__free(file);
  ferry__free(u);
}

/* ---- The capture ----------------------------------------------------------
 * ferry__disp_snapshot_take copies, on the loop, every journaled field of
 * the workers and jobs into messages ready to pack (the rows as the
 * parallel arrays of JournalJobState: one pass over them, no packing);
 * the datasets, immutable once registered, are only pinned. Packing, the
 * expensive part (a split list is most of a snapshot), then runs on the
 * journal's thread (ferry__disp_snapshot_pack). */

typedef struct snap_job_s {
  Ferry__V1__JournalJobState m;
  Ferry__V1__JournalCreateJob cj;
  Ferry__V1__JournalClientState *cs, **cp;
  client_t *clients; /* their secrets */
  uint64_t *u;       /* the seven uint64 row arrays */
  uint32_t *flags;
  uint64_t *ep_workers, *skipped;
  uint64_t *row_end, *rank_taken; /* Ranked jobs */
  Ferry__V1__CursorSegment *cuts, **cut_ptrs; /* Elastic */
  char *name, *error;
} snap_job_t;

typedef struct snap_worker_s {
  uint64_t id;
  char *address;
  bool lost, left, drained;
} snap_worker_t;

struct ferry_disp_snap_s {
  uint64_t segment, next_job, next_client, next_worker, boot;
  dataset_t **ds;
  size_t nds;
  snap_worker_t *workers;
  size_t nworkers;
  snap_job_t *jobs;
  size_t njobs;
};

static void put_worker(out_t *o, const snap_worker_t *w) {
  Ferry__V1__JournalWorkerRegistered r =
      FERRY__V1__JOURNAL_WORKER_REGISTERED__INIT;
  r.worker_id = w->id;
  r.address = w->address;
  ENTRY(e, WORKER_REGISTERED, worker_registered, r);
  put(o, &e);
  if (w->lost) {
    Ferry__V1__JournalWorkerLost l = FERRY__V1__JOURNAL_WORKER_LOST__INIT;
    l.worker_id = w->id;
    l.left = w->left;
    ENTRY(el, WORKER_LOST, worker_lost, l);
    put(o, &el);
  }
  if (w->drained) {
    Ferry__V1__JournalWorkerDrained dr =
        FERRY__V1__JOURNAL_WORKER_DRAINED__INIT;
    dr.worker_id = w->id;
    ENTRY(ed, WORKER_DRAINED, worker_drained, dr);
    put(o, &ed);
  }
}

enum { ROW_TOTAL_KNOWN = 1, ROW_DONE = 2, ROW_LOST = 4 };

static void free_job(snap_job_t *s) {
  ferry__free(s->cs);
  ferry__free(s->cp);
  ferry__free(s->clients);
  ferry__free(s->u);
  ferry__free(s->flags);
  ferry__free(s->ep_workers);
  ferry__free(s->skipped);
  ferry__free(s->row_end);
  ferry__free(s->rank_taken);
  ferry__free(s->cuts);
  ferry__free(s->cut_ptrs);
  ferry__free(s->name);
  ferry__free(s->error);
}

static uint64_t *copy_u64(const uint64_t *v, size_t n) {
  uint64_t *c = ferry__malloc(n ? n * sizeof(uint64_t) : 1);
  if (c != NULL && n > 0)
    memcpy(c, v, n * sizeof(uint64_t));
  return c;
}

/* Copies the job's journaled fields into `s`; FERRY_ENOMEM. */
static int take_job(snap_job_t *s, const job_t *j) {
  Ferry__V1__JournalJobState *m = &s->m;
  uint32_t n = j->started ? j->nrows : 0;
  size_t nc = j->nclients, nw = j->started ? j->n_ep_workers : 0;

  ferry__v1__journal_job_state__init(m);
  ferry__v1__journal_create_job__init(&s->cj);
  s->u = ferry__malloc((7 * (size_t)n + 1) * sizeof(uint64_t));
  s->flags = ferry__malloc((n + 1) * sizeof(uint32_t));
  s->cs = ferry__calloc(nc + 1, sizeof(*s->cs));
  s->cp = ferry__calloc(nc + 1, sizeof(*s->cp));
  s->clients = ferry__calloc(nc + 1, sizeof(client_t));
  s->ep_workers = copy_u64(j->ep_workers, nw);
  s->skipped = copy_u64(j->skipped_by_file, j->ds->nfiles);
  if (j->started && j->row_end != NULL) {
    s->row_end = copy_u64(j->row_end, n);
    s->rank_taken = copy_u64(j->rank_taken, j->world_size);
    if (s->row_end == NULL || s->rank_taken == NULL)
      return FERRY_ENOMEM;
    m->n_row_end = n;
    m->row_end = s->row_end;
    m->n_rank_taken = j->world_size;
    m->rank_taken = s->rank_taken;
  }
  s->name = ferry__strdup(j->name != NULL ? j->name : "");
  s->error = ferry__strdup(j->error != NULL ? j->error : "");
  if (s->u == NULL || s->flags == NULL || s->cs == NULL || s->cp == NULL ||
      s->clients == NULL || s->ep_workers == NULL || s->skipped == NULL ||
      s->name == NULL || s->error == NULL)
    return FERRY_ENOMEM;
  s->cj.job_id = j->id;
  s->cj.dataset_id = j->ds->id; /* the dataset is pinned */
  s->cj.name = s->name;
  s->cj.mode = j->mode;
  s->cj.num_epochs = j->num_epochs;
  s->cj.shuffle = j->shuffle;
  s->cj.seed = j->seed;
  s->cj.error_policy = j->policy;
  s->cj.world_size = j->world_size;
  s->cj.batch_size = j->batch;
  s->cj.pad_remainder = j->pad;
  s->cj.share = j->share;
  s->cj.resume_epoch = j->resume_epoch;
  s->cj.resume_step = j->resume_step;
  if (j->ncuts > 0) {
    s->cuts = ferry__calloc(j->ncuts, sizeof(*s->cuts));
    s->cut_ptrs = ferry__calloc(j->ncuts, sizeof(*s->cut_ptrs));
    if (s->cuts == NULL || s->cut_ptrs == NULL)
      return FERRY_ENOMEM;
    for (uint32_t i = 0; i < j->ncuts; i++) {
      ferry__v1__cursor_segment__init(&s->cuts[i]);
      s->cuts[i].world_size = j->cut_world[i];
      s->cuts[i].step = j->cut_step[i];
      s->cut_ptrs[i] = &s->cuts[i];
    }
    s->cj.n_resume_earlier = j->ncuts;
    s->cj.resume_earlier = s->cut_ptrs;
  }
  m->job = &s->cj;
  m->state = j->state;
  m->error_code = j->error_code;
  m->error = s->error;
  m->epoch = j->epoch;
  m->started = j->started;
  m->epochs_done = j->epochs_done;
  m->n_epoch_workers = nw;
  m->epoch_workers = s->ep_workers;
  m->delivered_prev = j->delivered_prev;
  m->skipped = j->skipped;
  m->n_skipped_by_file = j->ds->nfiles;
  m->skipped_by_file = s->skipped;
  m->idle = j->idle_since >= 0;
  if (nc > 0)
    memcpy(s->clients, j->clients, nc * sizeof(client_t));
  for (size_t i = 0; i < nc; i++) {
    ferry__v1__journal_client_state__init(&s->cs[i]);
    s->cs[i].client_id = s->clients[i].id;
    s->cs[i].active = s->clients[i].active;
    s->cs[i].incarnation = s->clients[i].incarnation;
    s->cs[i].ranked = s->clients[i].rank >= 0;
    s->cs[i].rank = s->clients[i].rank >= 0 ? (uint32_t)s->clients[i].rank : 0;
    if (s->clients[i].has_secret) {
      s->cs[i].client_secret.data = s->clients[i].secret;
      s->cs[i].client_secret.len = FERRY_CLIENT_SECRET_BYTES;
    }
    s->cp[i] = &s->cs[i];
  }
  m->n_clients = nc;
  m->clients = s->cp;
  m->rows = n;
  m->n_row_client = m->n_row_lease = m->n_row_start = m->n_row_delivered =
      m->n_row_total = m->n_row_flags = m->n_row_skip_lease =
          m->n_row_skip_seen = n;
  m->row_client = s->u;
  m->row_lease = s->u + n;
  m->row_start = s->u + 2 * (size_t)n;
  m->row_delivered = s->u + 3 * (size_t)n;
  m->row_total = s->u + 4 * (size_t)n;
  m->row_skip_lease = s->u + 5 * (size_t)n;
  m->row_skip_seen = s->u + 6 * (size_t)n;
  m->row_flags = s->flags;
  for (uint32_t r = 0; r < n; r++) {
    const row_t *row = &j->rows[r];
    const active_t *a = ferry__disp_row_active(j, row);
    m->row_client[r] = row->client;
    m->row_lease[r] = row->lease;
    m->row_start[r] = row->start;
    m->row_delivered[r] = row->delivered;
    m->row_total[r] = row->total;
    m->row_skip_lease[r] = a != NULL ? a->skip_lease : 0;
    m->row_skip_seen[r] = a != NULL ? a->skip_seen : 0;
    s->flags[r] = (row->total_known ? ROW_TOTAL_KNOWN : 0) |
                  (row->done ? ROW_DONE : 0) | (row->lost ? ROW_LOST : 0);
  }
  return 0;
}

ferry_disp_snap_t *ferry__disp_snapshot_take(ferry_disp_t *d,
                                             uint64_t segment) {
  ferry_disp_snap_t *s = ferry__calloc(1, sizeof(*s));
  if (s == NULL)
    return NULL;
  s->segment = segment;
  s->next_job = d->next_job;
  s->next_client = d->next_client;
  s->next_worker = d->next_worker;
  s->boot = d->boot;
  d->snap_pins++; /* before anything can fail: release unpins */
  s->ds = ferry__calloc(d->nds + 1, sizeof(dataset_t *));
  s->workers = ferry__calloc(d->nworkers + 1, sizeof(snap_worker_t));
  s->jobs = ferry__calloc(d->njobs + 1, sizeof(snap_job_t));
  if (s->ds == NULL || s->workers == NULL || s->jobs == NULL)
    goto nomem;
  for (; s->nds < d->nds; s->nds++)
    s->ds[s->nds] = d->ds[s->nds];
  for (; s->nworkers < d->nworkers; s->nworkers++) {
    const worker_t *w = d->workers[s->nworkers];
    snap_worker_t *c = &s->workers[s->nworkers];
    c->id = w->id;
    c->lost = w->lost;
    c->left = w->left;
    c->drained = w->op_drained;
    if ((c->address = ferry__strdup(w->address != NULL ? w->address : "")) ==
        NULL)
      goto nomem;
  }
  for (; s->njobs < d->njobs; s->njobs++)
    if (take_job(&s->jobs[s->njobs], d->jobs[s->njobs]) != 0) {
      s->njobs++; /* free its part */
      goto nomem;
    }
  return s;
nomem:
  ferry__disp_snapshot_release(d, s);
  return NULL;
}

int ferry__disp_snapshot_pack(const ferry_disp_snap_t *s, uint8_t **out,
                              size_t *len, ferry_error_t *err) {
  out_t o = {0};
  Ferry__V1__JournalSnapshotBegin b = FERRY__V1__JOURNAL_SNAPSHOT_BEGIN__INIT;
  Ferry__V1__JournalSnapshotEnd en = FERRY__V1__JOURNAL_SNAPSHOT_END__INIT;

  *out = NULL;
  *len = 0;
  b.segment = s->segment;
  b.next_job = s->next_job;
  b.next_client = s->next_client;
  b.next_worker = s->next_worker;
  b.boot = s->boot;
  ENTRY(eb, SNAPSHOT_BEGIN, snapshot_begin, b);
  put(&o, &eb);
  o.entries = 0;
  /* Datasets before the jobs that name them; workers before the jobs
   * (a lost worker's entry releases rows, and there are none yet). */
  for (size_t i = 0; i < s->nds; i++)
    put_dataset(&o, s->ds[i]);
  for (size_t i = 0; i < s->nworkers; i++)
    put_worker(&o, &s->workers[i]);
  for (size_t i = 0; i < s->njobs; i++) {
    ENTRY(ej, JOB_STATE, job_state, s->jobs[i].m);
    put(&o, &ej);
  }
  en.entries = o.entries;
  ENTRY(ee, SNAPSHOT_END, snapshot_end, en);
  put(&o, &ee);
  ferry__free(o.scratch);
  if (o.rc != 0) {
    ferry__free(o.buf);
    return ferry__seterr(err, o.rc, "snapshot: out of memory");
  }
  *out = o.buf;
  *len = o.len;
  return 0;
}

void ferry__disp_snapshot_release(ferry_disp_t *d, ferry_disp_snap_t *s) {
  if (s == NULL)
    return;
  for (size_t i = 0; i < s->nworkers; i++)
    ferry__free(s->workers[i].address);
  for (size_t i = 0; i < s->njobs; i++)
    free_job(&s->jobs[i]);
  ferry__free(s->ds);
  ferry__free(s->workers);
  ferry__free(s->jobs);
  ferry__free(s);
  if (--d->snap_pins == 0)
    ferry__disp_free_collected(d);
}

int ferry__disp_snapshot(ferry_disp_t *d, uint64_t segment, uint8_t **out,
                         size_t *len, ferry_error_t *err) {
  ferry_disp_snap_t *s = ferry__disp_snapshot_take(d, segment);
  int rc;
  if (s == NULL)
    return ferry__seterr(err, FERRY_ENOMEM, "snapshot: out of memory");
  rc = ferry__disp_snapshot_pack(s, out, len, err);
  ferry__disp_snapshot_release(d, s);
  return rc;
}

size_t ferry__disp_segment_header(uint64_t segment, uint8_t buf[16]) {
  Ferry__V1__JournalSegment m = FERRY__V1__JOURNAL_SEGMENT__INIT;
  m.segment = segment;
  ENTRY(e, SEGMENT, segment, m);
  return protobuf_c_message_pack(&e.base, buf);
}

uint64_t ferry__disp_segment(const ferry_disp_t *d) { return d->segment; }

void ferry__disp_set_segment(ferry_disp_t *d, uint64_t segment) {
  d->segment = segment;
}

void ferry__disp_reset(ferry_disp_t *d, int64_t now_ms) {
  ferry__disp_free_contents(d);
  d->next_job = d->next_client = d->next_worker = 1;
  d->boot = 0;
  d->segment = 0;
  d->snap_open = d->snap_done = false;
  d->snap_count = 0;
  d->now = now_ms;
  d->changes++; /* waiting heartbeats look again */
}

typedef struct restore_s {
  ferry_disp_t *d;
  int64_t now;
  bool first, stale;
  uint64_t segment; /* the journal's, from its header (0: none) */
} restore_t;

static int snapshot_cb(const uint8_t *e, size_t len, uint64_t off,
                       void *arg, ferry_error_t *err) {
  restore_t *r = arg;
  (void)off;
  return ferry__disp_apply(r->d, e, len, r->now, err);
}

/* The segment of a JournalSegment entry; false for any other entry. */
static bool segment_of(const uint8_t *e, size_t len, uint64_t *seg) {
  entry_t *m = ferry__v1__journal_entry__unpack(&ferry__pb_allocator, len, e);
  bool is = m != NULL &&
            m->entry_case == FERRY__V1__JOURNAL_ENTRY__ENTRY_SEGMENT;
  if (is)
    *seg = m->segment->segment;
  if (m != NULL)
    ferry__v1__journal_entry__free_unpacked(m, &ferry__pb_allocator);
  return is;
}

static int journal_cb(const uint8_t *e, size_t len, uint64_t off, void *arg,
                      ferry_error_t *err) {
  restore_t *r = arg;
  if (r->first) {
    uint64_t seg = 0;
    r->first = false;
    if (!segment_of(e, len, &seg) && r->d->segment == 0)
      return ferry__disp_apply(r->d, e, len, r->now, err);
    r->segment = seg;
    if (seg < r->d->segment) {
      r->stale = true;
      return FERRY_ECANCELED;
    }
    if (seg > r->d->segment)
      return ferry__seterr(err, FERRY_EINVAL,
                           "the journal is segment %" PRIu64 " but the "
                           "snapshot is followed by segment %" PRIu64
                           ": the snapshot is older than the journal "
                           "(restored from a backup?); refusing to start",
                           seg, r->d->segment);
  }
  (void)off;
  return ferry__disp_apply(r->d, e, len, r->now, err);
}

int ferry__disp_restore(ferry_disp_t *d, ferry_journal_t *j, bool recover,
                        int64_t now_ms, ferry_disp_restore_t *st,
                        ferry_error_t *err) {
  restore_t r = {d, now_ms, true, false, 0};
  uint8_t hdr[16];
  int rc;

  memset(st, 0, sizeof(*st));
  d->now = now_ms;
  rc = ferry__journal_read_snapshot(ferry__journal_dir(j), snapshot_cb, &r,
                                    &st->snapshot, &st->snapshot_entries,
                                    &st->snapshot_bytes, err);
  if (rc != 0)
    return rc;
  if (st->snapshot && (!d->snap_done || d->snap_open))
    return ferry__seterr(err, FERRY_EINVAL,
                         "%s/snapshot: ends at byte offset %" PRIu64
                         " without its end entry (truncated); refusing to "
                         "start",
                         ferry__journal_dir(j), st->snapshot_bytes);
  ferry__journal_set_snapshot_size(j, st->snapshot_bytes);
  rc = ferry__journal_replay(j, journal_cb, &r, recover,
                             &st->journal_entries, err);
  if (r.stale) {
    FERRY_LOG(FERRY_LOG_WARN,
              "%s/journal: segment %" PRIu64 ", older than the snapshot's "
              "(%" PRIu64 "), which covers it (a compaction stopped before "
              "starting the new segment): starting segment %" PRIu64,
              ferry__journal_dir(j), r.segment, d->segment, d->segment);
    st->stale = true;
    st->journal_entries = 0;
    rc = 0;
  }
  if (rc != 0)
    return rc;
  if (d->segment > 0 && (r.stale || ferry__journal_size(j) == 0)) {
    size_t n = ferry__disp_segment_header(d->segment, hdr);
    if ((rc = ferry__journal_reset(j, hdr, n, err)) != 0)
      return rc;
  }
  st->segment = d->segment;
  st->journal_bytes = ferry__journal_size(j);
  ferry__disp_replayed(d, now_ms);
  return 0;
}
