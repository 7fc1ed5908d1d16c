/* Snapshots and the restore from disk (see snapshot.h). */
#include "snapshot.h"
#include "state_internal.h"

#include "ferry/pb_alloc.h"

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
  if (n > o->scratch_cap) {
    uint8_t *p = ferry__realloc(o->scratch, n);
    if (p == NULL) {
      o->rc = FERRY_ENOMEM;
      return;
    }
    o->scratch = p;
    o->scratch_cap = n;
  }
  protobuf_c_message_pack(&e->base, o->scratch);
  o->rc = ferry__journal_frame(&o->buf, &o->len, &o->cap, o->scratch, n);
  o->entries++;
}

static void put_dataset(out_t *o, const dataset_t *ds) {
  Ferry__V1__JournalRegisterDataset m =
      FERRY__V1__JOURNAL_REGISTER_DATASET__INIT;
  Ferry__V1__Split *msgs = ferry__calloc(ds->nsplits ? ds->nsplits : 1,
                                         sizeof(*msgs));
  Ferry__V1__Split **ptrs = ferry__calloc(ds->nsplits ? ds->nsplits : 1,
                                          sizeof(*ptrs));
  if (msgs == NULL || ptrs == NULL) {
    o->rc = FERRY_ENOMEM;
  } else {
    for (uint32_t i = 0; i < ds->nsplits; i++) {
      ferry__v1__split__init(&msgs[i]);
      msgs[i].index = i;
      msgs[i].file_index = ds->splits[i].file;
      msgs[i].byte_offset = ds->splits[i].offset;
      msgs[i].byte_end = ds->splits[i].end;
      msgs[i].first_record = ds->splits[i].first;
      msgs[i].num_records = ds->splits[i].count;
      ptrs[i] = &msgs[i];
    }
    m.dataset_id = ds->id;
    m.spec.data = ds->spec_bytes;
    m.spec.len = ds->spec_len;
    m.files = ds->files;
    m.n_files = ds->nfiles;
    m.splits = ptrs;
    m.n_splits = ds->nsplits;
    ENTRY(e, REGISTER_DATASET, register_dataset, m);
    put(o, &e);
  }
  ferry__free(msgs);
  ferry__free(ptrs);
}

static void put_worker(out_t *o, const worker_t *w) {
  Ferry__V1__JournalWorkerRegistered r =
      FERRY__V1__JOURNAL_WORKER_REGISTERED__INIT;
  r.worker_id = w->id;
  r.address = w->address != NULL ? w->address : (char *)"";
  ENTRY(e, WORKER_REGISTERED, worker_registered, r);
  put(o, &e);
  if (w->lost) {
    Ferry__V1__JournalWorkerLost l = FERRY__V1__JOURNAL_WORKER_LOST__INIT;
    l.worker_id = w->id;
    ENTRY(el, WORKER_LOST, worker_lost, l);
    put(o, &el);
  }
  if (w->op_drained) {
    Ferry__V1__JournalWorkerDrained dr =
        FERRY__V1__JOURNAL_WORKER_DRAINED__INIT;
    dr.worker_id = w->id;
    ENTRY(ed, WORKER_DRAINED, worker_drained, dr);
    put(o, &ed);
  }
}

enum { ROW_TOTAL_KNOWN = 1, ROW_DONE = 2, ROW_LOST = 4 };

static void put_job(out_t *o, const job_t *j) {
  Ferry__V1__JournalJobState m = FERRY__V1__JOURNAL_JOB_STATE__INIT;
  Ferry__V1__JournalCreateJob cj = FERRY__V1__JOURNAL_CREATE_JOB__INIT;
  Ferry__V1__JournalClientState *cs = NULL, **cp = NULL;
  uint32_t n = j->started ? j->nrows : 0;
  size_t nc = j->nclients;
  /* One block for the eight row arrays (uint64 but the flags). */
  uint64_t *u = ferry__calloc(7 * (size_t)n + 1, sizeof(uint64_t));
  uint32_t *flags = ferry__calloc(n + 1, sizeof(uint32_t));

  cs = ferry__calloc(nc + 1, sizeof(*cs));
  cp = ferry__calloc(nc + 1, sizeof(*cp));
  if (u == NULL || flags == NULL || cs == NULL || cp == NULL) {
    o->rc = FERRY_ENOMEM;
    goto out;
  }
  cj.job_id = j->id;
  cj.dataset_id = j->ds->id;
  cj.name = j->name != NULL ? j->name : (char *)"";
  cj.mode = j->mode;
  cj.num_epochs = j->num_epochs;
  cj.shuffle = j->shuffle;
  cj.seed = j->seed;
  cj.error_policy = j->policy;
  m.job = &cj;
  m.state = j->state;
  m.error_code = j->error_code;
  m.error = j->error != NULL ? j->error : (char *)"";
  m.epoch = j->epoch;
  m.started = j->started;
  m.epochs_done = j->epochs_done;
  m.n_epoch_workers = j->started ? j->n_ep_workers : 0;
  m.epoch_workers = j->ep_workers;
  m.delivered_prev = j->delivered_prev;
  m.skipped = j->skipped;
  m.n_skipped_by_file = j->ds->nfiles;
  m.skipped_by_file = j->skipped_by_file;
  m.idle = j->idle_since >= 0;
  for (size_t i = 0; i < nc; i++) {
    ferry__v1__journal_client_state__init(&cs[i]);
    cs[i].client_id = j->clients[i].id;
    cs[i].active = j->clients[i].active;
    cs[i].incarnation = j->clients[i].incarnation;
    if (j->clients[i].has_secret) {
      cs[i].client_secret.data = (uint8_t *)j->clients[i].secret;
      cs[i].client_secret.len = FERRY_CLIENT_SECRET_BYTES;
    }
    cp[i] = &cs[i];
  }
  m.n_clients = nc;
  m.clients = cp;
  m.rows = n;
  m.n_row_client = m.n_row_lease = m.n_row_start = m.n_row_delivered =
      m.n_row_total = m.n_row_flags = m.n_row_skip_lease = m.n_row_skip_seen =
          n;
  m.row_client = u;
  m.row_lease = u + n;
  m.row_start = u + 2 * (size_t)n;
  m.row_delivered = u + 3 * (size_t)n;
  m.row_total = u + 4 * (size_t)n;
  m.row_skip_lease = u + 5 * (size_t)n;
  m.row_skip_seen = u + 6 * (size_t)n;
  m.row_flags = flags;
  for (uint32_t r = 0; r < n; r++) {
    const row_t *row = &j->rows[r];
    m.row_client[r] = row->client;
    m.row_lease[r] = row->lease;
    m.row_start[r] = row->start;
    m.row_delivered[r] = row->delivered;
    m.row_total[r] = row->total;
    m.row_skip_lease[r] = ferry__disp_row_active(j, row) != NULL
                              ? ferry__disp_row_active(j, row)->skip_lease
                              : 0;
    m.row_skip_seen[r] = ferry__disp_row_active(j, row) != NULL
                             ? ferry__disp_row_active(j, row)->skip_seen
                             : 0;
    flags[r] = (row->total_known ? ROW_TOTAL_KNOWN : 0) |
               (row->done ? ROW_DONE : 0) | (row->lost ? ROW_LOST : 0);
  }
  ENTRY(e, JOB_STATE, job_state, m);
  put(o, &e);
out:
  ferry__free(u);
  ferry__free(flags);
  ferry__free(cs);
  ferry__free(cp);
}

int ferry__disp_snapshot(const ferry_disp_t *d, uint64_t segment,
                         uint8_t **out, size_t *len, ferry_error_t *err) {
  out_t o = {0};
  Ferry__V1__JournalSnapshotBegin b = FERRY__V1__JOURNAL_SNAPSHOT_BEGIN__INIT;
  Ferry__V1__JournalSnapshotEnd en = FERRY__V1__JOURNAL_SNAPSHOT_END__INIT;

  *out = NULL;
  *len = 0;
  b.segment = segment;
  b.next_job = d->next_job;
  b.next_client = d->next_client;
  b.next_worker = d->next_worker;
  b.boot = d->boot;
  ENTRY(eb, SNAPSHOT_BEGIN, snapshot_begin, b);
  put(&o, &eb);
  o.entries = 0;
  /* Datasets before the jobs that name them; workers before the jobs
   * (a lost worker's entry releases rows, and there are none yet). */
  for (size_t i = 0; i < d->nds; i++)
    put_dataset(&o, d->ds[i]);
  for (size_t i = 0; i < d->nworkers; i++)
    put_worker(&o, d->workers[i]);
  for (size_t i = 0; i < d->njobs; i++)
    put_job(&o, d->jobs[i]);
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
