/* The dispatcher's state machine (see state.h and docs/ARCHITECTURE.md,
 * "The service").
 *
 * Invariants:
 * - Only apply_*() functions mutate the journaled state, and each is a
 *   deterministic function of the state, the entry and `now` (which only
 *   feeds timers). Live calls decide, build entries and commit() them.
 * - Volatile fields (heartbeat times, worker load, client stats, the
 *   per-worker task counts) are never journaled; ntasks is recomputed by
 *   recount() before every leasing decision.
 * - A job's split table (rows) exists only for its current epoch, and only
 *   once that epoch started (`started`). Rows of an epoch are done when
 *   their total is known and delivered >= total, or, in parallel_epochs,
 *   when their pinned worker was lost (done-with-loss: those records are
 *   not produced again; the other workers' copies of the dataset are
 *   unaffected).
 * - A row is bound to at most one client (`client`, 0: unassigned) and
 *   leased to at most one worker (`worker`, 0: waiting for one). Every new
 *   lease gets the next generation (at least boot << 32, `boot` being
 *   journaled once per process, so above every earlier process's) and start =
 *   delivered, so a re-leased row resumes where the client's acknowledged
 *   count stands.
 * - Only the binding of a row to a client is journaled (JournalAssign).
 *   Which worker holds its lease, the generation and the start are
 *   volatile: a re-lease to another worker changes nothing durable, so it
 *   costs no journal write. After a replay every row waits for a worker
 *   (worker 0) and is leased again to workers that heartbeat to the new
 *   process; their old tasks are cancelled by the lease diff.
 */
#include "state.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ferry/alloc.h"
#include "ferry/crc32c.h"
#include "ferry/log.h"
#include "ferry/rpc.h"
#include "ferry/spec.h"
#include "ferry/tfrecord.h"
#include "ferry/v1/journal.pb-c.h"
#include "dmetrics.h"
#include "shard_index.h"

typedef Ferry__V1__JournalEntry entry_t;

/* ---- Arena and protobuf-c allocators ----------------------------------- */

typedef struct block_s {
  struct block_s *next;
  max_align_t data[];
} block_t;

void *ferry__arena_alloc(ferry_arena_t *a, size_t size) {
  block_t *b = ferry__calloc(1, sizeof(*b) + size);
  if (b == NULL)
    return NULL;
  b->next = a->head;
  a->head = b;
  return b->data;
}

void ferry__arena_free(ferry_arena_t *a) {
  block_t *b = a->head;
  while (b != NULL) {
    block_t *next = b->next;
    ferry__free(b);
    b = next;
  }
  a->head = NULL;
}

static void *pb_alloc(void *data, size_t n) { return ferry__malloc(n); }
static void pb_free(void *data, void *p) { ferry__free(p); }
static void *arena_pb_alloc(void *data, size_t n) {
  return ferry__arena_alloc(data, n);
}
static void arena_pb_free(void *data, void *p) {}

void ferry__disp_pb_allocator(ProtobufCAllocator *out) {
  out->alloc = pb_alloc;
  out->free = pb_free;
  out->allocator_data = NULL;
}

void ferry__disp_arena_allocator(ferry_arena_t *a, ProtobufCAllocator *out) {
  out->alloc = arena_pb_alloc;
  out->free = arena_pb_free;
  out->allocator_data = a;
}

static char *arena_strdup(ferry_arena_t *a, const char *s) {
  size_t n = strlen(s) + 1;
  char *p = ferry__arena_alloc(a, n);
  if (p != NULL)
    memcpy(p, s, n);
  return p;
}

/* ---- Split order ------------------------------------------------------- */

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

/* ---- The state --------------------------------------------------------- */

typedef struct split_s {
  uint32_t file;
  uint64_t offset, end; /* end 0: end of file */
  uint64_t first, count; /* count 0: unknown */
} split_t;

/* A file as this process scanned it. Datasets over the same files (the
 * same data under another pipeline) share the scan of a file whose
 * identity and times did not change since. */
typedef struct scanned_s {
  bool valid; /* scanned (or reused) by this process, not replayed */
  uint64_t dev, ino, size;
  int64_t mtime_ns, ctime_ns;
  int64_t at_ns; /* CLOCK_REALTIME when it was stat'ed for the scan */
} scanned_t;

/* File times tick coarsely (a clock tick): a file modified less than this
 * before its scan might change again without a new time, so its scan is
 * not shared (git's "racily clean" rule). */
#define SCAN_RACY_NS 100000000

typedef struct dataset_s {
  char *id;
  ferry_spec_t spec;
  uint8_t *spec_bytes; /* canonical serialization, sent in every Task */
  size_t spec_len;
  char **files;
  uint32_t nfiles;
  split_t *splits;
  uint32_t nsplits;
  uint64_t known_records; /* sum of the known split counts */
  scanned_t *scanned;     /* volatile, per file; NULL after a replay */
  uint32_t scan_per;      /* ... and the scan's records per split */
  int scan_compression;   /* ... and the spec's compression */
  int64_t idle_since;     /* volatile: unused by any job since (-1: used) */
} dataset_t;

typedef struct row_s {
  uint32_t split;
  uint64_t pinned; /* parallel_epochs: the row's worker */
  uint64_t client; /* 0: unassigned */
  uint64_t worker; /* lease holder; 0: none yet */
  uint64_t lease;  /* generation of the current lease; 0: never leased */
  uint64_t start;  /* first position of the current lease */
  uint64_t delivered;
  uint64_t total; /* valid when total_known */
  bool total_known;
  bool done;
  bool lost;           /* done-with-loss (parallel_epochs) */
  uint64_t skip_lease; /* skipped-count dedupe: last lease seen ... */
  uint64_t skip_seen;  /* ... and its cumulative count */
  uint64_t listed;     /* volatile: heartbeat generation that listed it */
  /* Volatile: restarts in a row without progress, and the worker whose
   * lease failed last, which the row avoids until `avoid_until`. */
  uint32_t restarts;
  uint64_t avoid;
  int64_t avoid_until;
} row_t;

typedef struct client_s {
  uint64_t id;
  bool active;
  uint64_t incarnation; /* joins after the first (journaled) */
  bool no_renew;        /* volatile: its stream stalled; heartbeats no
                         * longer renew its lease, so it expires */
  int64_t last_hb;
  double stall_fraction, batches_per_second; /* volatile stats */
  uint64_t batches;
  /* Volatile: the same over the last heartbeat interval (issue 10). */
  double ival_stall, ival_bps;
  bool has_ival;
  /* Issue 8: the secret its heartbeats and streams must carry (journaled;
   * none for clients of journals written before it). */
  uint8_t secret[FERRY_CLIENT_SECRET_BYTES];
  bool has_secret;
} client_t;

typedef struct job_s {
  uint64_t id;
  char *name; /* "" for anonymous jobs */
  dataset_t *ds;
  int mode, policy;
  int64_t num_epochs; /* >= 1 or -1 */
  bool shuffle;
  uint64_t seed;
  int state;
  int error_code;
  char *error;
  uint32_t epoch;
  bool started;
  uint32_t epochs_done;
  row_t *rows;
  uint32_t nrows;
  uint32_t *order; /* hand-out order of the rows */
  uint64_t *ep_workers; /* parallel_epochs: the epoch's workers */
  uint32_t n_ep_workers;
  client_t *clients;
  size_t nclients;
  uint64_t delivered_prev; /* records delivered in completed epochs */
  uint64_t skipped;
  uint64_t *skipped_by_file;
  int64_t idle_since; /* -1: busy; else when it became GC-able */
} job_t;

typedef struct worker_s {
  uint64_t id;
  char *address;
  bool lost;
  bool draining;
  int64_t last_hb;
  uint32_t threads;
  uint64_t buffer_bytes, buffer_free_bytes;
  uint32_t ntasks; /* volatile: leased rows not done */
  uint64_t beats;  /* volatile: heartbeats answered since this process
                    * started (the first one is never held back) */
  int64_t suspect_since; /* volatile: a client lost its stream (-1: no);
                          * cleared by a heartbeat arriving after it */
  /* Issue 10: an operator drained it (journaled): no new lease while this
   * id lives. `drain_beats` (volatile) is `beats` when the drain was
   * applied: a heartbeat after it that lists no unfinished task
   * (`unfinished`, volatile, from the last heartbeat) confirms that
   * nothing runs on it any more. */
  bool op_drained;
  uint64_t drain_beats;
  uint32_t unfinished;
} worker_t;

struct ferry_disp_s {
  ferry_disp_config_t cfg;
  int64_t now, start;
  dataset_t **ds;
  size_t nds;
  job_t **jobs;
  size_t njobs;
  worker_t **workers;
  size_t nworkers;
  uint64_t next_job, next_client, next_worker;
  uint64_t boot; /* this process's boot number (JournalBoot) */
  uint64_t hb_gen;
  uint64_t changes; /* live entries committed: wakes waiting heartbeats */
  ferry_disp_sink_cb sink;
  void *sink_arg;
  uint8_t *scratch;
  size_t scratch_cap;
};

#define PAR(j) ((j)->mode == FERRY__V1__JOB_MODE__JOB_MODE_PARALLEL_EPOCHS)
#define RUNNING(j) ((j)->state == FERRY__V1__JOB_STATE__JOB_STATE_RUNNING)

void ferry__disp_config_init(ferry_disp_config_t *cfg) {
  cfg->worker_timeout_ms = 10000;
  cfg->client_timeout_ms = 10000;
  cfg->job_gc_ms = 60000;
  cfg->records_per_split = 1024;
  cfg->heartbeat_ms = 1000;
  cfg->max_record_len = FERRY_TFR_DEFAULT_MAX_RECORD;
  cfg->client_stall_ms = 30000;
  cfg->roots = NULL;
  cfg->max_datasets = 1024;
  cfg->target_stall_fraction = 0.05;
}

/* Appends one pointer to an array whose capacity is implied by its count:
 * 4, then doubling, so it is full when the count is 4 or a larger power
 * of two (removals only ever leave more room than implied). */
static int push_ptr(void ***arr, size_t *n, void *p) {
  if (*n == 0 || (*n >= 4 && (*n & (*n - 1)) == 0)) {
    size_t cap = *n == 0 ? 4 : *n * 2;
    void **na = ferry__realloc(*arr, cap * sizeof(void *));
    if (na == NULL)
      return FERRY_ENOMEM;
    *arr = na;
  }
  (*arr)[(*n)++] = p;
  return 0;
}

static void free_dataset(dataset_t *ds) {
  if (ds == NULL)
    return;
  ferry__free(ds->id);
  ferry_spec_close(&ds->spec);
  ferry__free(ds->spec_bytes);
  for (uint32_t i = 0; i < ds->nfiles && ds->files != NULL; i++)
    ferry__free(ds->files[i]);
  ferry__free(ds->files);
  ferry__free(ds->splits);
  ferry__free(ds->scanned);
  ferry__free(ds);
}

static void free_rows(job_t *j) {
  ferry__free(j->rows);
  ferry__free(j->order);
  ferry__free(j->ep_workers);
  j->rows = NULL;
  j->order = NULL;
  j->ep_workers = NULL;
  j->nrows = 0;
  j->n_ep_workers = 0;
  j->started = false;
}

static void free_job(job_t *j) {
  if (j == NULL)
    return;
  free_rows(j);
  ferry__free(j->name);
  ferry__free(j->error);
  ferry__free(j->clients);
  ferry__free(j->skipped_by_file);
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

void ferry__disp_free(ferry_disp_t *d) {
  if (d == NULL)
    return;
  for (size_t i = 0; i < d->nds; i++)
    free_dataset(d->ds[i]);
  for (size_t i = 0; i < d->njobs; i++)
    free_job(d->jobs[i]);
  for (size_t i = 0; i < d->nworkers; i++) {
    ferry__free(d->workers[i]->address);
    ferry__free(d->workers[i]);
  }
  ferry__free(d->ds);
  ferry__free(d->jobs);
  ferry__free(d->workers);
  ferry__free(d->scratch);
  ferry__free(d);
}

void ferry__disp_set_sink(ferry_disp_t *d, ferry_disp_sink_cb cb, void *arg) {
  d->sink = cb;
  d->sink_arg = arg;
}

/* ---- Lookups ----------------------------------------------------------- */

static dataset_t *find_dataset(ferry_disp_t *d, const char *id) {
  for (size_t i = 0; i < d->nds; i++)
    if (strcmp(d->ds[i]->id, id) == 0)
      return d->ds[i];
  return NULL;
}

static job_t *find_job(ferry_disp_t *d, uint64_t id) {
  for (size_t i = 0; i < d->njobs; i++)
    if (d->jobs[i]->id == id)
      return d->jobs[i];
  return NULL;
}

static worker_t *find_worker(ferry_disp_t *d, uint64_t id) {
  for (size_t i = 0; i < d->nworkers; i++)
    if (d->workers[i]->id == id)
      return d->workers[i];
  return NULL;
}

static client_t *find_client(job_t *j, uint64_t id) {
  for (size_t i = 0; i < j->nclients; i++)
    if (j->clients[i].id == id)
      return &j->clients[i];
  return NULL;
}

static worker_t *live_worker(ferry_disp_t *d, uint64_t id) {
  worker_t *w = find_worker(d, id);
  return w != NULL && !w->lost ? w : NULL;
}

/* The row of the current epoch at index `row`, or NULL. */
static row_t *job_row(job_t *j, uint32_t epoch, uint32_t row) {
  if (!j->started || epoch != j->epoch || row >= j->nrows)
    return NULL;
  return &j->rows[row];
}

/* The row index of (split, worker) in the current epoch, or -1. In
 * distributed_epoch the worker is irrelevant; in parallel_epochs each of
 * the epoch's workers owns the block of rows [slot * nsplits, ...). */
static int64_t row_index(const job_t *j, uint32_t split, uint64_t worker) {
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

static uint64_t epoch_delivered(const job_t *j) {
  uint64_t sum = 0;
  for (uint32_t i = 0; i < j->nrows; i++)
    sum += j->rows[i].delivered;
  return sum;
}

static size_t active_clients(const job_t *j) {
  size_t n = 0;
  for (size_t i = 0; i < j->nclients; i++)
    n += j->clients[i].active;
  return n;
}

static void mark_idle(ferry_disp_t *d, job_t *j) {
  if (j->idle_since < 0)
    j->idle_since = d->now;
}

/* Recomputes every worker's count of leased rows that are not done. */
static void recount(ferry_disp_t *d) {
  for (size_t i = 0; i < d->nworkers; i++)
    d->workers[i]->ntasks = 0;
  for (size_t i = 0; i < d->njobs; i++) {
    job_t *j = d->jobs[i];
    if (!RUNNING(j))
      continue;
    for (uint32_t r = 0; r < j->nrows; r++) {
      worker_t *w;
      if (j->rows[r].worker == 0 || j->rows[r].done)
        continue;
      w = find_worker(d, j->rows[r].worker);
      if (w != NULL)
        w->ntasks++;
    }
  }
}

/* A worker that may take new leases: live, not draining, heard from by
 * this process, not behind on its heartbeats (missed more than two
 * intervals) and not suspected (a client lost its stream to it and it has
 * not heartbeated since). A dead worker is thus skipped long before its
 * timeout declares it lost. */
static bool eligible(const ferry_disp_t *d, const worker_t *w) {
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

/* The eligible worker with the fewest tasks (lowest id on a tie) that
 * `row` (may be NULL) does not avoid, or NULL. */
static worker_t *pick_worker(ferry_disp_t *d, const row_t *row) {
  worker_t *best = NULL;
  for (size_t i = 0; i < d->nworkers; i++) {
    worker_t *w = d->workers[i];
    if (!eligible(d, w) || avoided(d, row, w))
      continue;
    if (best == NULL || w->ntasks < best->ntasks)
      best = w;
  }
  return best;
}

/* The row's next lease generation: one more than its current one, and at
 * least boot << 32, so that the first lease of a process is above every
 * lease an earlier process issued for the row without journaling it. */
static uint64_t next_lease(const ferry_disp_t *d, const row_t *row) {
  uint64_t floor = d->boot << 32;
  return row->lease + 1 > floor ? row->lease + 1 : floor;
}

/* ---- Apply: the only code that changes journaled state ------------------ */

static void row_check_done(row_t *r) {
  if (!r->done && r->total_known && r->delivered >= r->total)
    r->done = true;
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

  if (find_dataset(d, m->dataset_id) != NULL)
    return ferry__seterr(err, FERRY_EINVAL, "dataset %s registered twice",
                         m->dataset_id);
  ds = ferry__calloc(1, sizeof(*ds));
  if (ds == NULL)
    return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
  ferry_spec_init(&ds->spec);
  rc = ferry_spec_unpack(m->spec.data, m->spec.len, &ds->spec, err);
  if (rc != 0) {
    free_dataset(ds);
    return rc;
  }
  ds->id = ferry__strdup(m->dataset_id);
  ds->spec_bytes = ferry__malloc(m->spec.len ? m->spec.len : 1);
  ds->files = ferry__calloc(m->n_files ? m->n_files : 1, sizeof(char *));
  ds->splits = ferry__calloc(m->n_splits ? m->n_splits : 1, sizeof(split_t));
  if (ds->id == NULL || ds->spec_bytes == NULL || ds->files == NULL ||
      ds->splits == NULL)
    goto nomem;
  memcpy(ds->spec_bytes, m->spec.data, m->spec.len);
  ds->spec_len = m->spec.len;
  for (size_t i = 0; i < m->n_files; i++, ds->nfiles++)
    if ((ds->files[i] = ferry__strdup(m->files[i])) == NULL)
      goto nomem;
  for (size_t i = 0; i < m->n_splits; i++) {
    const Ferry__V1__Split *s = m->splits[i];
    if (s->file_index >= ds->nfiles) {
      free_dataset(ds);
      return bad_entry(err, "split file index", s->file_index);
    }
    ds->splits[i] = (split_t){s->file_index, s->byte_offset, s->byte_end,
                              s->first_record, s->num_records};
    ds->known_records += s->num_records;
  }
  ds->nsplits = (uint32_t)m->n_splits;
  ds->idle_since = d->now;
  if (push_ptr((void ***)&d->ds, &d->nds, ds) != 0)
    goto nomem;
  return 0;
nomem:
  free_dataset(ds);
  return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
}

static int apply_create_job(ferry_disp_t *d,
                            const Ferry__V1__JournalCreateJob *m,
                            ferry_error_t *err) {
  dataset_t *ds = find_dataset(d, m->dataset_id);
  job_t *j;

  if (ds == NULL)
    return ferry__seterr(err, FERRY_EINVAL,
                         "journal entry does not fit the state: dataset %s",
                         m->dataset_id);
  if (find_job(d, m->job_id) != NULL)
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
  j->state = FERRY__V1__JOB_STATE__JOB_STATE_RUNNING;
  j->idle_since = -1;
  ds->idle_since = -1;
  j->name = ferry__strdup(m->name);
  j->skipped_by_file = ferry__calloc(ds->nfiles, sizeof(uint64_t));
  if (j->name == NULL || j->skipped_by_file == NULL ||
      push_ptr((void ***)&d->jobs, &d->njobs, j) != 0) {
    free_job(j);
    return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
  }
  if (m->job_id >= d->next_job)
    d->next_job = m->job_id + 1;
  return 0;
}

static int apply_client_joined(ferry_disp_t *d,
                               const Ferry__V1__JournalClientJoined *m,
                               ferry_error_t *err) {
  job_t *j = find_job(d, m->job_id);
  client_t *c;

  if (j == NULL)
    return bad_entry(err, "job", m->job_id);
  c = find_client(j, m->client_id);
  if (c == NULL) {
    client_t *nc = ferry__realloc(j->clients,
                                  (j->nclients + 1) * sizeof(client_t));
    if (nc == NULL)
      return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
    j->clients = nc;
    c = &j->clients[j->nclients++];
    memset(c, 0, sizeof(*c));
    c->id = m->client_id;
  } else {
    c->incarnation++; /* a rejoin: it lost every split it held */
  }
  if (m->client_secret.len == FERRY_CLIENT_SECRET_BYTES) {
    memcpy(c->secret, m->client_secret.data, FERRY_CLIENT_SECRET_BYTES);
    c->has_secret = true;
  }
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
  job_t *j = find_job(d, m->job_id);
  client_t *c = j != NULL ? find_client(j, m->client_id) : NULL;

  if (c == NULL)
    return bad_entry(err, "client", m->client_id);
  c->active = false;
  for (uint32_t r = 0; r < j->nrows; r++) {
    row_t *row = &j->rows[r];
    if (row->client == m->client_id && !row->done) {
      row->client = 0;
      row->worker = 0;
    }
  }
  if (active_clients(j) == 0)
    mark_idle(d, j);
  return 0;
}

static int apply_assign(ferry_disp_t *d, const Ferry__V1__JournalAssign *m,
                        ferry_error_t *err) {
  job_t *j = find_job(d, m->job_id);
  row_t *r = j != NULL ? job_row(j, m->epoch, m->row) : NULL;

  if (r == NULL)
    return bad_entry(err, "assign: row", m->row);
  r->client = m->client_id;
  r->worker = m->worker_id;
  r->lease = m->lease;
  r->start = m->start;
  return 0;
}

static int apply_progress(ferry_disp_t *d,
                          const Ferry__V1__JournalProgress *m,
                          ferry_error_t *err) {
  job_t *j = find_job(d, m->job_id);

  if (j == NULL)
    return bad_entry(err, "job", m->job_id);
  for (size_t i = 0; i < m->n_rows; i++) {
    row_t *r = job_row(j, m->epoch, m->rows[i]->row);
    if (r == NULL)
      return bad_entry(err, "progress: row", m->rows[i]->row);
    if (m->rows[i]->delivered > r->delivered) {
      r->delivered = m->rows[i]->delivered;
      r->restarts = 0; /* progress: restarts no longer count in a row */
    }
    row_check_done(r);
  }
  return 0;
}

static int apply_task_finished(ferry_disp_t *d,
                               const Ferry__V1__JournalTaskFinished *m,
                               ferry_error_t *err) {
  job_t *j = find_job(d, m->job_id);
  row_t *r = j != NULL ? job_row(j, m->epoch, m->row) : NULL;

  if (r == NULL)
    return bad_entry(err, "finished: row", m->row);
  r->total = m->total;
  r->total_known = true;
  row_check_done(r);
  return 0;
}

static int apply_job_failed(ferry_disp_t *d,
                            const Ferry__V1__JournalJobFailed *m,
                            ferry_error_t *err) {
  job_t *j = find_job(d, m->job_id);
  char *msg;

  if (j == NULL)
    return bad_entry(err, "job", m->job_id);
  if ((msg = ferry__strdup(m->error)) == NULL)
    return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
  ferry__free(j->error);
  j->error = msg;
  j->error_code = m->error_code;
  j->state = FERRY__V1__JOB_STATE__JOB_STATE_FAILED;
  mark_idle(d, j);
  return 0;
}

/* Builds the epoch's rows: one per split, or per (worker, split). */
static int apply_epoch_start(ferry_disp_t *d,
                             const Ferry__V1__JournalEpochStart *m,
                             ferry_error_t *err) {
  job_t *j = find_job(d, m->job_id);
  uint32_t ns, nw, n, nsplit_order;
  uint32_t *perm;

  if (j == NULL || j->started || m->epoch != j->epoch || !RUNNING(j))
    return bad_entry(err, "epoch start for job", m->job_id);
  ns = j->ds->nsplits;
  nw = PAR(j) ? (uint32_t)m->n_workers : 1;
  n = ns * nw;
  j->rows = ferry__calloc(n ? n : 1, sizeof(row_t));
  j->order = ferry__calloc(n ? n : 1, sizeof(uint32_t));
  j->ep_workers = ferry__calloc(nw, sizeof(uint64_t));
  perm = ferry__calloc(ns ? ns : 1, sizeof(uint32_t));
  if (j->rows == NULL || j->order == NULL || j->ep_workers == NULL ||
      perm == NULL) {
    ferry__free(perm);
    free_rows(j);
    return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
  }
  for (uint32_t r = 0; r < n; r++) {
    const split_t *s = &j->ds->splits[r % ns];
    j->rows[r].split = r % ns;
    j->rows[r].pinned = PAR(j) ? m->workers[r / ns] : 0;
    j->rows[r].total = s->count;
    j->rows[r].total_known = s->count > 0;
  }
  /* Hand-out order: the epoch's split permutation, and for each split
   * every worker's row, so that a client's splits spread over workers. */
  ferry__disp_split_order(j->shuffle, j->seed, j->epoch, perm, ns);
  nsplit_order = 0;
  for (uint32_t i = 0; i < ns; i++)
    for (uint32_t s = 0; s < nw; s++)
      j->order[nsplit_order++] = s * ns + perm[i];
  ferry__free(perm);
  if (PAR(j))
    memcpy(j->ep_workers, m->workers, nw * sizeof(uint64_t));
  j->n_ep_workers = PAR(j) ? nw : 0;
  j->nrows = n;
  j->started = true;
  return 0;
}

static int apply_epoch_done(ferry_disp_t *d,
                            const Ferry__V1__JournalEpochDone *m,
                            ferry_error_t *err) {
  job_t *j = find_job(d, m->job_id);

  if (j == NULL || !j->started || m->epoch != j->epoch)
    return bad_entry(err, "epoch done for job", m->job_id);
  j->delivered_prev += epoch_delivered(j);
  j->epochs_done++;
  free_rows(j);
  if (j->num_epochs >= 0 && j->epochs_done >= (uint64_t)j->num_epochs) {
    j->state = FERRY__V1__JOB_STATE__JOB_STATE_FINISHED;
    mark_idle(d, j);
  } else {
    j->epoch++;
  }
  return 0;
}

static int apply_worker_registered(ferry_disp_t *d,
                                   const Ferry__V1__JournalWorkerRegistered *m,
                                   ferry_error_t *err) {
  worker_t *w = find_worker(d, m->worker_id);
  char *addr = ferry__strdup(m->address);

  if (addr == NULL)
    return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
  if (w == NULL) {
    w = ferry__calloc(1, sizeof(*w));
    if (w == NULL || push_ptr((void ***)&d->workers, &d->nworkers, w) != 0) {
      ferry__free(w);
      ferry__free(addr);
      return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
    }
    w->id = m->worker_id;
  }
  ferry__free(w->address);
  w->address = addr;
  w->lost = false;
  w->suspect_since = -1;
  w->last_hb = d->now;
  if (m->worker_id >= d->next_worker)
    d->next_worker = m->worker_id + 1;
  return 0;
}

/* distributed_epoch: the worker's unfinished rows wait for a new lease
 * (still bound to their clients). parallel_epochs: its pinned rows are
 * dropped as done-with-loss. */
static int apply_worker_lost(ferry_disp_t *d,
                             const Ferry__V1__JournalWorkerLost *m,
                             ferry_error_t *err) {
  worker_t *w = find_worker(d, m->worker_id);

  if (w == NULL)
    return bad_entry(err, "worker", m->worker_id);
  w->lost = true;
  for (size_t i = 0; i < d->njobs; i++) {
    job_t *j = d->jobs[i];
    for (uint32_t r = 0; r < j->nrows; r++) {
      row_t *row = &j->rows[r];
      if (row->done)
        continue;
      if (PAR(j) && row->pinned == m->worker_id) {
        row->done = row->lost = true;
        row->worker = 0;
      } else if (row->worker == m->worker_id) {
        row->worker = 0;
      }
    }
  }
  return 0;
}

/* Issue 10: no new lease for the worker; its rows that are not done wait
 * for another worker, from their delivered count, exactly as when it is
 * lost (parallel_epochs: its pinned rows end with loss). */
static int apply_worker_drained(ferry_disp_t *d,
                                const Ferry__V1__JournalWorkerDrained *m,
                                ferry_error_t *err) {
  worker_t *w = find_worker(d, m->worker_id);
  if (w == NULL)
    return bad_entry(err, "drained worker", m->worker_id);
  w->op_drained = true;
  w->drain_beats = w->beats;
  for (size_t i = 0; i < d->njobs; i++) {
    job_t *j = d->jobs[i];
    for (uint32_t r = 0; r < j->nrows; r++) {
      row_t *row = &j->rows[r];
      if (row->done)
        continue;
      if (PAR(j) && row->pinned == m->worker_id) {
        row->done = row->lost = true;
        row->worker = 0;
      } else if (row->worker == m->worker_id) {
        row->worker = 0;
      }
    }
  }
  return 0;
}

/* Issue 10: the job ends; its clients hear why from their heartbeats. */
static int apply_job_cancelled(ferry_disp_t *d,
                               const Ferry__V1__JournalJobCancelled *m,
                               ferry_error_t *err) {
  job_t *j = find_job(d, m->job_id);
  char buf[96], *msg;

  if (j == NULL || !RUNNING(j))
    return bad_entry(err, "cancelled job", m->job_id);
  snprintf(buf, sizeof(buf), "job %" PRIu64 " cancelled by the operator",
           j->id);
  if ((msg = ferry__strdup(buf)) == NULL)
    return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
  ferry__free(j->error);
  j->error = msg;
  j->error_code = FERRY_ECANCELED;
  j->state = FERRY__V1__JOB_STATE__JOB_STATE_CANCELLED;
  mark_idle(d, j);
  return 0;
}

static int apply_skipped(ferry_disp_t *d, const Ferry__V1__JournalSkipped *m,
                         ferry_error_t *err) {
  job_t *j = find_job(d, m->job_id);
  row_t *r = j != NULL ? job_row(j, m->epoch, m->row) : NULL;
  uint64_t delta;

  if (r == NULL)
    return bad_entry(err, "skipped: row", m->row);
  if (r->skip_lease != m->lease) {
    r->skip_lease = m->lease;
    r->skip_seen = 0;
  }
  if (m->skipped <= r->skip_seen)
    return 0;
  delta = m->skipped - r->skip_seen;
  r->skip_seen = m->skipped;
  j->skipped += delta;
  j->skipped_by_file[j->ds->splits[r->split].file] += delta;
  return 0;
}

/* True when a job still reads the dataset. */
static bool dataset_used(const ferry_disp_t *d, const dataset_t *ds) {
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
    free_job(d->jobs[i]);
    memmove(&d->jobs[i], &d->jobs[i + 1],
            (d->njobs - i - 1) * sizeof(job_t *));
    d->njobs--;
    if (!dataset_used(d, ds))
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
    if (dataset_used(d, d->ds[i]))
      break;
    free_dataset(d->ds[i]);
    memmove(&d->ds[i], &d->ds[i + 1], (d->nds - i - 1) * sizeof(dataset_t *));
    d->nds--;
    return 0;
  }
  return ferry__seterr(err, FERRY_EINVAL,
                       "journal entry does not fit the state: dataset %s "
                       "collected while unknown or in use", m->dataset_id);
}

static int apply_boot(ferry_disp_t *d, const Ferry__V1__JournalBoot *m,
                      ferry_error_t *err) {
  if (m->boot <= d->boot)
    return bad_entry(err, "boot", m->boot);
  d->boot = m->boot;
  return 0;
}

static int apply(ferry_disp_t *d, const entry_t *e, ferry_error_t *err) {
  switch (e->entry_case) {
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

/* Applies a live entry, then hands its serialization to the sink. */
static int commit(ferry_disp_t *d, const entry_t *e, ferry_error_t *err) {
  size_t n = protobuf_c_message_get_packed_size(&e->base);
  int rc;

  if (d->sink != NULL && n > d->scratch_cap) {
    uint8_t *p = ferry__realloc(d->scratch, n);
    if (p == NULL)
      return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
    d->scratch = p;
    d->scratch_cap = n;
  }
  /* Metrics count what this process does (replays do not come here). */
  bool relet = false;
  if (e->entry_case == FERRY__V1__JOURNAL_ENTRY__ENTRY_ASSIGN) {
    const job_t *j = find_job(d, e->assign->job_id);
    const row_t *row =
        j != NULL ? job_row((job_t *)j, e->assign->epoch, e->assign->row)
                  : NULL;
    relet = row != NULL && row->lease != 0;
  }
  rc = apply(d, e, err);
  if (rc != 0) {
    FERRY_LOG(FERRY_LOG_ERROR, "dispatcher: entry not applied: %s",
              err != NULL ? err->msg : ferry_strerror(rc));
    return rc;
  }
  ferry__dmetrics_committed(e, relet);
  d->changes++;
  if (d->sink != NULL) {
    protobuf_c_message_pack(&e->base, d->scratch);
    d->sink(d->scratch, n, d->sink_arg);
  }
  return 0;
}

int ferry__disp_apply(ferry_disp_t *d, const uint8_t *buf, size_t len,
                      int64_t now_ms, ferry_error_t *err) {
  ProtobufCAllocator al;
  entry_t *e;
  int rc;

  ferry__disp_pb_allocator(&al);
  e = ferry__v1__journal_entry__unpack(&al, len, buf);
  if (e == NULL)
    return ferry__seterr(err, FERRY_EINVAL, "malformed journal entry");
  d->now = now_ms;
  rc = apply(d, e, err);
  ferry__v1__journal_entry__free_unpacked(e, &al);
  return rc;
}

void ferry__disp_replayed(ferry_disp_t *d, int64_t now_ms) {
  d->now = now_ms;
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
}

int ferry__disp_boot(ferry_disp_t *d, ferry_error_t *err) {
  Ferry__V1__JournalBoot m = FERRY__V1__JOURNAL_BOOT__INIT;
  m.boot = d->boot + 1;
  entry_t e = FERRY__V1__JOURNAL_ENTRY__INIT;
  e.entry_case = FERRY__V1__JOURNAL_ENTRY__ENTRY_BOOT;
  e.boot = &m;
  return commit(d, &e, err);
}

/* ---- Entry builders ----------------------------------------------------- */

#define ENTRY(e, kind, field, msg)                                            \
  entry_t e = FERRY__V1__JOURNAL_ENTRY__INIT;                                 \
  e.entry_case = FERRY__V1__JOURNAL_ENTRY__ENTRY_##kind;                      \
  e.field = &(msg)

static int emit_assign(ferry_disp_t *d, job_t *j, uint32_t row,
                       uint64_t client, uint64_t worker, uint64_t lease,
                       uint64_t start) {
  Ferry__V1__JournalAssign m = FERRY__V1__JOURNAL_ASSIGN__INIT;
  m.job_id = j->id;
  m.epoch = j->epoch;
  m.row = row;
  m.client_id = client;
  m.worker_id = worker;
  m.lease = lease;
  m.start = start;
  ENTRY(e, ASSIGN, assign, m);
  return commit(d, &e, NULL);
}

static int emit_client_left(ferry_disp_t *d, job_t *j, uint64_t client,
                            bool lost) {
  Ferry__V1__JournalClientLeft m = FERRY__V1__JOURNAL_CLIENT_LEFT__INIT;
  m.job_id = j->id;
  m.client_id = client;
  m.lost = lost;
  ENTRY(e, CLIENT_LEFT, client_left, m);
  return commit(d, &e, NULL);
}

static int emit_client_joined(ferry_disp_t *d, job_t *j, uint64_t client,
                              const uint8_t *secret, ferry_error_t *err) {
  Ferry__V1__JournalClientJoined m = FERRY__V1__JOURNAL_CLIENT_JOINED__INIT;
  m.job_id = j->id;
  m.client_id = client;
  if (secret != NULL) {
    m.client_secret.data = (uint8_t *)secret;
    m.client_secret.len = FERRY_CLIENT_SECRET_BYTES;
  }
  ENTRY(e, CLIENT_JOINED, client_joined, m);
  return commit(d, &e, err);
}

/* Length of the valid UTF-8 sequence at s (1 to 4), or 0. */
static size_t utf8_char(const unsigned char *s) {
  if (s[0] < 0x80)
    return 1;
  if (s[0] >= 0xc2 && s[0] <= 0xdf)
    return (s[1] & 0xc0) == 0x80 ? 2 : 0;
  if (s[0] >= 0xe0 && s[0] <= 0xef) {
    if ((s[1] & 0xc0) != 0x80 || (s[2] & 0xc0) != 0x80 ||
        (s[0] == 0xe0 && s[1] < 0xa0) || (s[0] == 0xed && s[1] > 0x9f))
      return 0;
    return 3;
  }
  if (s[0] >= 0xf0 && s[0] <= 0xf4) {
    if ((s[1] & 0xc0) != 0x80 || (s[2] & 0xc0) != 0x80 ||
        (s[3] & 0xc0) != 0x80 || (s[0] == 0xf0 && s[1] < 0x90) ||
        (s[0] == 0xf4 && s[1] > 0x8f))
      return 0;
    return 4;
  }
  return 0;
}

/* True when s is valid UTF-8: proto3 `string` fields must be, or every
 * reader of a message that echoes them (GetStatus) refuses it. */
static bool utf8_valid(const char *s) {
  for (const unsigned char *p = (const unsigned char *)s; *p != '\0';) {
    size_t n = utf8_char(p);
    if (n == 0)
      return false;
    p += n;
  }
  return true;
}

/* A copy of `s` with every byte that is not valid UTF-8 replaced by '?'
 * (a worker's error text may carry a file name in another encoding). */
static void utf8_clean(const char *s, char *out, size_t cap) {
  size_t o = 0;
  for (const unsigned char *p = (const unsigned char *)s;
       *p != '\0' && o + 5 < cap;) {
    size_t n = utf8_char(p);
    if (n == 0) {
      out[o++] = '?';
      p++;
    } else {
      memcpy(out + o, p, n);
      o += n;
      p += n;
    }
  }
  out[o] = '\0';
}

static int emit_job_failed(ferry_disp_t *d, job_t *j, int code,
                           const char *msg) {
  Ferry__V1__JournalJobFailed m = FERRY__V1__JOURNAL_JOB_FAILED__INIT;
  char clean[FERRY_DISP_MAX_ERROR_LEN + 8];
  utf8_clean(msg, clean, sizeof(clean));
  msg = clean;
  m.job_id = j->id;
  m.error_code = code;
  m.error = (char *)msg;
  ENTRY(e, JOB_FAILED, job_failed, m);
  FERRY_LOG(FERRY_LOG_WARN, "job %" PRIu64 " failed: %s", j->id, msg);
  return commit(d, &e, NULL);
}

/* ---- Decisions: epochs and leases ------------------------------------- */

/* Binds row `r` to `client` and leases it to worker `w` (NULL: leaves it
 * waiting, worker 0) from its delivered count. Only a change of client is
 * journaled; a re-lease for the same client is volatile (see the
 * invariants) but still wakes waiting worker heartbeats. */
static int bind_row(ferry_disp_t *d, job_t *j, uint32_t r, uint64_t client,
                    worker_t *w) {
  row_t *row = &j->rows[r];
  uint64_t worker = w != NULL ? w->id : 0;
  uint64_t lease = w != NULL ? next_lease(d, row) : row->lease;
  uint64_t start = w != NULL ? row->delivered : row->start;
  if (w != NULL)
    w->ntasks++;
  if (row->client != client)
    return emit_assign(d, j, r, client, worker, lease, start);
  if (row->worker == worker && row->lease == lease)
    return 0;
  row->worker = worker;
  row->lease = lease;
  row->start = start;
  d->changes++;
  return 0;
}

/* The worker a row should be leased to now: its pinned worker in
 * parallel_epochs (if live and not in its backoff), else the least loaded
 * eligible one it does not avoid. */
static worker_t *worker_for(ferry_disp_t *d, job_t *j, const row_t *row) {
  if (PAR(j)) {
    worker_t *w = live_worker(d, row->pinned);
    return w != NULL && !avoided(d, row, w) ? w : NULL;
  }
  return pick_worker(d, row);
}

/* Leases every bound row that waits for a worker. */
static void lease_pending(ferry_disp_t *d, job_t *j) {
  for (uint32_t r = 0; r < j->nrows; r++) {
    row_t *row = &j->rows[r];
    worker_t *w;
    if (row->client == 0 || row->worker != 0 || row->done)
      continue;
    if ((w = worker_for(d, j, row)) == NULL)
      continue; /* waits: no eligible worker, or in its backoff */
    bind_row(d, j, r, row->client, w);
  }
}

static bool all_done(const job_t *j) {
  for (uint32_t r = 0; r < j->nrows; r++)
    if (!j->rows[r].done)
      return false;
  return true;
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
  rc = commit(d, &e, NULL);
  ferry__free(ws);
  return rc == 0;
}

/* Moves the job through finished epochs and starts the next one. */
static void advance(ferry_disp_t *d, job_t *j) {
  while (RUNNING(j)) {
    Ferry__V1__JournalEpochDone m = FERRY__V1__JOURNAL_EPOCH_DONE__INIT;
    if (!j->started && !start_epoch(d, j))
      return;
    if (j->nrows == 0 || !all_done(j))
      return;
    m.job_id = j->id;
    m.epoch = j->epoch;
    ENTRY(e, EPOCH_DONE, epoch_done, m);
    if (commit(d, &e, NULL) != 0)
      return;
    FERRY_LOG(FERRY_LOG_INFO, "job %" PRIu64 ": epoch %u done%s", j->id,
              m.epoch, RUNNING(j) ? "" : "; job finished");
  }
}

/* Epoch transitions and pending leases of every running job. */
static void schedule(ferry_disp_t *d) {
  recount(d);
  for (size_t i = 0; i < d->njobs; i++) {
    job_t *j = d->jobs[i];
    if (!RUNNING(j))
      continue;
    advance(d, j);
    if (RUNNING(j))
      lease_pending(d, j);
  }
}

/* Binds up to `want` unassigned rows of the current epoch to the client. */
static void bind_rows(ferry_disp_t *d, job_t *j, uint64_t client,
                      uint32_t want) {
  if (!RUNNING(j) || !j->started)
    return;
  recount(d);
  for (uint32_t k = 0; k < j->nrows && want > 0; k++) {
    uint32_t r = j->order[k];
    row_t *row = &j->rows[r];
    if (row->client != 0 || row->done)
      continue;
    if (bind_row(d, j, r, client, worker_for(d, j, row)) != 0)
      return;
    want--;
  }
}

/* ---- RegisterDataset ---------------------------------------------------- */

/* FERRY_EINVAL when `s` is longer than `max` bytes, or (`utf8`) not
 * valid UTF-8 (no request field is quoted back: it may be huge). */
static int check_str(const char *s, size_t max, bool utf8, const char *what,
                     ferry_error_t *err) {
  size_t n = s != NULL ? strnlen(s, max + 1) : 0;
  if (n > max)
    return ferry__seterr(err, FERRY_EINVAL, "%s is longer than %zu bytes",
                         what, max);
  if (utf8 && s != NULL && !utf8_valid(s))
    return ferry__seterr(err, FERRY_EINVAL, "%s is not valid UTF-8", what);
  return 0;
}

static int check_len(const char *s, size_t max, const char *what,
                     ferry_error_t *err) {
  return check_str(s, max, true, what, err);
}

/* FERRY_ENOSPC when the dispatcher holds its limit of datasets: checked
 * when a registration starts and again when it commits. */
static int dataset_room(const ferry_disp_t *d, ferry_error_t *err) {
  if (d->nds < d->cfg.max_datasets)
    return 0;
  return ferry__seterr(err, FERRY_ENOSPC,
                       "the dispatcher holds %zu datasets (its limit); a "
                       "dataset no job uses is dropped after --job-gc-ms",
                       d->nds);
}

typedef struct splits_s {
  split_t *v;
  size_t n, cap;
} splits_t;

static int push_split(splits_t *s, const split_t *sp) {
  if (s->n == s->cap) {
    size_t cap = s->cap ? s->cap * 2 : 64;
    split_t *nv = ferry__realloc(s->v, cap * sizeof(split_t));
    if (nv == NULL)
      return FERRY_ENOMEM;
    s->v = nv;
    s->cap = cap;
  }
  s->v[s->n++] = *sp;
  return 0;
}

static uint64_t le64(const uint8_t *b) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--)
    v = v << 8 | b[i];
  return v;
}

static bool header_ok(const uint8_t h[12]) {
  uint32_t stored = (uint32_t)h[8] | (uint32_t)h[9] << 8 |
                    (uint32_t)h[10] << 16 | (uint32_t)h[11] << 24;
  return ferry_crc32c_unmask(stored) == ferry_crc32c(0, h, 8);
}

/* Whether the file is compressed: per the spec, or for AUTO by the same
 * rule as the reader (a valid first header wins over the magic bytes). */
static bool is_compressed(ferry_compression_t c, const uint8_t *h, size_t n) {
  if (c == FERRY_COMPRESSION_GZIP || c == FERRY_COMPRESSION_ZLIB)
    return true;
  if (c != FERRY_COMPRESSION_AUTO || n < 2 || (n >= 12 && header_ok(h)))
    return false;
  if (h[0] == 0x1f && h[1] == 0x8b)
    return true;
  return (h[0] & 0x0f) == 8 && (h[0] >> 4) <= 7 && (h[1] & 0x20) == 0 &&
         ((unsigned)h[0] * 256 + h[1]) % 31 == 0;
}

/* Headers are read through a window of this many bytes: small records
 * then cost one read per window rather than one per record; a record
 * larger than the window costs one read of its header's window. */
#define SCAN_WINDOW (64u << 10)

typedef struct window_s {
  int fd;
  uint8_t *buf;
  uint64_t base; /* file offset of buf[0] */
  size_t len;    /* valid bytes */
} window_t;

/* Points *h at the 12 bytes at `off` (fewer at the end of the file: the
 * count is returned), reading a new window when they are not in the
 * current one. Returns -1 with errno on a read error. */
static ssize_t window_header(window_t *w, uint64_t off, const uint8_t **h) {
  if (off < w->base || off + 12 > w->base + w->len) {
    ssize_t n = ferry__pread_full(w->fd, w->buf, SCAN_WINDOW, off);
    if (n < 0)
      return -1;
    w->base = off;
    w->len = (size_t)n;
  }
  *h = w->buf + (off - w->base);
  return (ssize_t)(w->base + w->len - off < 12 ? w->base + w->len - off
                                                : 12);
}

/* Cuts an uncompressed file into splits of `per` records by reading the
 * 12-byte headers only (no CRC of the data). A header that is short,
 * fails its CRC, is over the maximum or points past the end ends the
 * scan: the rest of the file becomes one split of unknown count. */
static int scan_plain(int fd, uint64_t size, uint32_t file, uint32_t per,
                      uint64_t max_len, splits_t *out, const char *path) {
  split_t cur = {file, 0, 0, 0, 0};
  uint64_t off = 0, index = 0;
  window_t w = {fd, ferry__malloc(SCAN_WINDOW), 0, 0};
  int rc = 0;

  if (w.buf == NULL)
    return FERRY_ENOMEM;
  while (off < size) {
    uint64_t len;
    const uint8_t *h;
    ssize_t n = window_header(&w, off, &h);
    if (n < 0) {
      rc = ferry_err_from_errno(errno);
      goto out;
    }
    len = n == 12 ? le64(h) : 0;
    if (n < 12 || !header_ok(h) || len > max_len || size - off - 12 < 4 ||
        len > size - off - 16) {
      FERRY_LOG(FERRY_LOG_WARN,
                "%s: bad record header at byte offset %" PRIu64
                ": the rest of the file is one split of unknown count",
                path, off);
      if (cur.count > 0 && push_split(out, &cur) != 0) {
        rc = FERRY_ENOMEM;
        goto out;
      }
      cur = (split_t){file, off, 0, index, 0};
      rc = push_split(out, &cur);
      goto out;
    }
    if (cur.count == 0) {
      cur.offset = off;
      cur.first = index;
    }
    off += 16 + len;
    cur.end = off;
    cur.count++;
    index++;
    if (cur.count == per) {
      if (push_split(out, &cur) != 0) {
        rc = FERRY_ENOMEM;
        goto out;
      }
      cur.count = 0;
    }
  }
  if (cur.count > 0 && push_split(out, &cur) != 0)
    rc = FERRY_ENOMEM;
out:
  ferry__free(w.buf);
  return rc;
}

/* Cuts an uncompressed file into splits of `per` records from its trusted
 * DALI index (shard_index.h) instead of scanning its headers. */
static int scan_index(const ferry_tfr_index_entry_t *v, size_t n,
                      uint32_t file, uint32_t per, splits_t *out) {
  split_t cur = {file, 0, 0, 0, 0};
  for (size_t i = 0; i < n; i++) {
    if (cur.count == 0) {
      cur.offset = v[i].offset;
      cur.first = i;
    }
    cur.end = v[i].offset + v[i].size;
    if (++cur.count == per) {
      if (push_split(out, &cur) != 0)
        return FERRY_ENOMEM;
      cur.count = 0;
    }
  }
  if (cur.count > 0 && push_split(out, &cur) != 0)
    return FERRY_ENOMEM;
  return 0;
}

static void scanned_from_stat(scanned_t *f, const struct stat *st) {
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  f->at_ns = (int64_t)now.tv_sec * 1000000000 + now.tv_nsec;
  f->valid = true;
  f->dev = (uint64_t)st->st_dev;
  f->ino = (uint64_t)st->st_ino;
  f->size = (uint64_t)st->st_size;
  f->mtime_ns = (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec;
  f->ctime_ns = (int64_t)st->st_ctim.tv_sec * 1000000000 + st->st_ctim.tv_nsec;
}

/* Whether `now` is the file `then` was, unchanged since it was scanned. */
static bool same_file(const scanned_t *then, const scanned_t *now) {
  return then->valid && now->valid && then->dev == now->dev &&
         then->ino == now->ino && then->size == now->size &&
         then->mtime_ns == now->mtime_ns && then->ctime_ns == now->ctime_ns &&
         then->mtime_ns < then->at_ns - SCAN_RACY_NS;
}

/* Copies into *out the splits of `path` (file index `file` in the new
 * dataset) from a dataset this process scanned with the same parameters,
 * if the file did not change since `f` (its identity, stat'ed for this
 * registration). Returns true when the splits were copied (*rc: 0 or
 * FERRY_ENOMEM). Loop thread: reads d->ds. */
static bool reuse_scan(ferry_disp_t *d, const char *path, uint32_t file,
                       ferry_compression_t c, uint32_t per,
                       const scanned_t *f, splits_t *out, int *rc) {
  if (!f->valid)
    return false;
  for (size_t i = 0; i < d->nds; i++) {
    const dataset_t *ds = d->ds[i];
    if (ds->scanned == NULL || ds->scan_per != per ||
        ds->scan_compression != (int)c)
      continue;
    for (uint32_t k = 0; k < ds->nfiles; k++) {
      if (!same_file(&ds->scanned[k], f) || strcmp(ds->files[k], path) != 0)
        continue;
      *rc = 0;
      for (uint32_t s = 0; s < ds->nsplits && *rc == 0; s++)
        if (ds->splits[s].file == k) {
          split_t sp = ds->splits[s];
          sp.file = file;
          *rc = push_split(out, &sp);
        }
      FERRY_LOG(FERRY_LOG_DEBUG, "%s: splits of dataset %s reused", path,
                ds->id);
      return true;
    }
  }
  return false;
}

/* Scans one file into splits (from FILE.idx when it can be trusted, see
 * shard_index.h); *f gets its identity as scanned. */
static int scan_file(const char *path, uint32_t file, ferry_compression_t c,
                     uint32_t per, uint64_t max_len, splits_t *out,
                     scanned_t *f, ferry_error_t *err) {
  uint8_t h[12];
  struct stat st;
  ferry_tfr_index_entry_t *idx = NULL;
  size_t nidx = 0;
  ssize_t n;
  /* O_NONBLOCK: a FIFO or device named by a spec must not block the
   * thread in open() (a pool thread in the daemon, see
   * ferry__disp_reg_scan); only regular files are scanned. */
  int rc = 0, fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);

  if (fd < 0)
    return ferry__seterr(err, ferry_err_from_errno(errno), "%s: %s", path,
                         strerror(errno));
  if (fstat(fd, &st) != 0 ||
      (S_ISREG(st.st_mode) &&
       (n = ferry__pread_full(fd, h, sizeof(h), 0)) < 0)) {
    rc = ferry__seterr(err, ferry_err_from_errno(errno), "%s: %s", path,
                       strerror(errno));
  } else if (!S_ISREG(st.st_mode)) {
    rc = ferry__seterr(err, FERRY_EINVAL, "%s: not a regular file", path);
  } else {
    scanned_from_stat(f, &st);
    if (st.st_size == 0) {
      rc = 0; /* an empty file has no split */
    } else if (is_compressed(c, h, (size_t)n)) {
      split_t s = {file, 0, 0, 0, 0};
      rc = push_split(out, &s);
    } else if ((rc = ferry__shard_index_load(path, fd, &st, max_len, &idx,
                                             &nidx)) != 0) {
      if (rc > 0)
        rc = scan_index(idx, nidx, file, per, out);
      ferry__free(idx);
    } else {
      rc = scan_plain(fd, (uint64_t)st.st_size, file, per, max_len, out,
                      path);
      if (rc != 0 && rc != FERRY_ENOMEM)
        ferry__seterr(err, rc, "%s: %s", path, ferry_strerror(rc));
    }
  }
  if (rc == FERRY_ENOMEM)
    ferry__seterr(err, rc, "%s: out of memory", path);
  close(fd);
  return rc;
}

static void fill_register_resp(const dataset_t *ds,
                               Ferry__V1__RegisterDatasetResponse *resp) {
  resp->dataset_id = ds->id;
  resp->num_records = ds->known_records;
  resp->num_files = ds->nfiles;
  resp->num_splits = ds->nsplits;
}

/* Builds and commits the RegisterDataset entry for the scanned splits. */
static int commit_dataset(ferry_disp_t *d, const char *id, const uint8_t *spec,
                          size_t spec_len, char **files, size_t nfiles,
                          const splits_t *sp, ferry_error_t *err) {
  Ferry__V1__JournalRegisterDataset m =
      FERRY__V1__JOURNAL_REGISTER_DATASET__INIT;
  Ferry__V1__Split *msgs = ferry__calloc(sp->n, sizeof(*msgs));
  Ferry__V1__Split **ptrs = ferry__calloc(sp->n, sizeof(*ptrs));
  int rc;

  if (msgs == NULL || ptrs == NULL) {
    ferry__free(msgs);
    ferry__free(ptrs);
    return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
  }
  for (size_t i = 0; i < sp->n; i++) {
    ferry__v1__split__init(&msgs[i]);
    msgs[i].index = (uint32_t)i;
    msgs[i].file_index = sp->v[i].file;
    msgs[i].byte_offset = sp->v[i].offset;
    msgs[i].byte_end = sp->v[i].end;
    msgs[i].first_record = sp->v[i].first;
    msgs[i].num_records = sp->v[i].count;
    ptrs[i] = &msgs[i];
  }
  m.dataset_id = (char *)id;
  m.spec.data = (uint8_t *)spec;
  m.spec.len = spec_len;
  m.files = files;
  m.n_files = nfiles;
  m.splits = ptrs;
  m.n_splits = sp->n;
  ENTRY(e, REGISTER_DATASET, register_dataset, m);
  rc = commit(d, &e, err);
  ferry__free(msgs);
  ferry__free(ptrs);
  return rc;
}

/* Unpacks the request's spec by round-tripping it through its canonical
 * serialization (which validates it). */
static int request_spec(const Ferry__V1__PipelineSpec *pb, ferry_spec_t *spec,
                        ferry_error_t *err) {
  size_t n;
  uint8_t *buf;
  int rc;

  ferry_spec_init(spec);
  if (pb == NULL)
    return ferry__seterr(err, FERRY_ESPEC, "no pipeline spec in the request");
  n = protobuf_c_message_get_packed_size(&pb->base);
  if ((buf = ferry__malloc(n ? n : 1)) == NULL)
    return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
  protobuf_c_message_pack(&pb->base, buf);
  rc = ferry_spec_unpack(buf, n, spec, err);
  ferry__free(buf);
  return rc;
}

/* What a registration owns (see state.h). The loop sets the first
 * block in begin; the thread steps fill the rest, reuse fills `reused`
 * and `reuse`. Steps never overlap: each hands over to the next through
 * libuv (uv_queue_work and its after callback), which orders memory. */
struct ferry_disp_reg_s {
  ferry_spec_t spec; /* a private copy */
  uint8_t *canon;    /* its canonical serialization */
  size_t clen;
  char id[17];
  uint32_t per;
  uint64_t max_record_len;
  const ferry_roots_t *roots; /* the daemon's: immutable while it runs */

  char **files;
  size_t nfiles;
  scanned_t *scanned; /* per file: identity from stat, then from the scan */
  splits_t *reused;   /* per file: splits copied by reuse */
  uint8_t *reuse;     /* per file: 0 scan it, 1 reused, 2 reuse ran out of
                       * memory */
  splits_t sp;        /* every split, in file order */
  int rc;
  ferry_error_t err;
  atomic_bool cancel;
};

void ferry__disp_reg_free(ferry_disp_reg_t *r) {
  if (r == NULL)
    return;
  if (r->reused != NULL)
    for (size_t i = 0; i < r->nfiles; i++)
      ferry__free(r->reused[i].v);
  ferry__free(r->reused);
  ferry__free(r->reuse);
  ferry__free(r->scanned);
  ferry__free(r->sp.v);
  ferry_spec_free_files(r->files, r->nfiles);
  ferry__free(r->canon);
  ferry_spec_close(&r->spec);
  ferry__free(r);
}

void ferry__disp_reg_cancel(ferry_disp_reg_t *r) {
  atomic_store(&r->cancel, true);
}

static bool reg_cancelled(ferry_disp_reg_t *r) {
  if (!atomic_load(&r->cancel))
    return false;
  r->rc = ferry__seterr(&r->err, FERRY_ECANCELED,
                        "the registration was cancelled");
  return true;
}

int ferry__disp_reg_begin(ferry_disp_t *d,
                          const Ferry__V1__RegisterDatasetRequest *req,
                          Ferry__V1__RegisterDatasetResponse *resp,
                          ferry_arena_t *a, int64_t now_ms,
                          ferry_disp_reg_t **out, ferry_error_t *err) {
  ferry_disp_reg_t *r;
  dataset_t *ds;
  int rc;

  *out = NULL;
  d->now = now_ms;
  if (req->records_per_split > (1u << 24))
    return ferry__seterr(err, FERRY_EINVAL,
                         "records_per_split %u is over %u",
                         req->records_per_split, 1u << 24);
  if ((r = ferry__calloc(1, sizeof(*r))) == NULL)
    return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
  atomic_init(&r->cancel, false);
  r->per = req->records_per_split ? req->records_per_split
                                  : d->cfg.records_per_split;
  r->max_record_len = d->cfg.max_record_len;
  r->roots = d->cfg.roots;
  if ((rc = request_spec(req->spec, &r->spec, err)) != 0)
    goto fail;
  if (r->spec.n_patterns > FERRY_DISP_MAX_PATTERNS) {
    rc = ferry__seterr(err, FERRY_EINVAL, "spec: over %d file patterns",
                       FERRY_DISP_MAX_PATTERNS);
    goto fail;
  }
  for (size_t i = 0; i < r->spec.n_patterns; i++)
    if ((rc = check_len(r->spec.patterns[i], FERRY_DISP_MAX_PATTERN_LEN,
                        "a file pattern", err)) != 0)
      goto fail;
  if ((rc = check_len(r->spec.image_key, FERRY_DISP_MAX_NAME_LEN,
                      "image key", err)) != 0 ||
      (rc = check_len(r->spec.label_key, FERRY_DISP_MAX_NAME_LEN,
                      "label key", err)) != 0)
    goto fail;
  if ((rc = ferry_spec_pack(&r->spec, &r->canon, &r->clen)) != 0) {
    ferry__seterr(err, rc, "pipeline spec: %s", ferry_strerror(rc));
    goto fail;
  }
  snprintf(r->id, sizeof(r->id), "%016" PRIx64,
           ferry_spec_fingerprint(&r->spec));
  if ((ds = find_dataset(d, r->id)) != NULL) {
    fill_register_resp(ds, resp);
    if ((resp->dataset_id = arena_strdup(a, r->id)) == NULL)
      rc = ferry__seterr(err, FERRY_ENOMEM, "out of memory");
    goto fail; /* answered: nothing to scan */
  }
  if ((rc = dataset_room(d, err)) != 0)
    goto fail;
  FERRY_LOG(FERRY_LOG_DEBUG, "dataset %s: expanding and scanning its files",
            r->id);
  *out = r;
  return 0;
fail:
  ferry__disp_reg_free(r);
  return rc;
}

void ferry__disp_reg_expand(ferry_disp_reg_t *r) {
  ferry_error_t *err = &r->err;
  const ferry_spec_t *spec = &r->spec;
  int rc = 0;

  if (r->rc != 0 || reg_cancelled(r))
    return;
  /* Data roots: the patterns before they are expanded (a glob must not
   * probe outside the roots), then every file they name. */
  for (size_t i = 0; i < spec->n_patterns; i++)
    if ((rc = ferry_roots_check_pattern(r->roots, spec->patterns[i],
                                        err)) != 0)
      goto out;
  if ((rc = ferry_spec_expand_files(spec, &r->files, &r->nfiles, err)) != 0)
    goto out;
  if (r->nfiles > FERRY_DISP_MAX_FILES) {
    rc = ferry__seterr(err, FERRY_EINVAL, "%s: over %d files",
                       spec->patterns[0], FERRY_DISP_MAX_FILES);
    goto out;
  }
  for (size_t i = 0; i < r->nfiles; i++)
    if ((rc = ferry_roots_check(r->roots, r->files[i], err)) != 0)
      goto out;
  /* File names travel in `string` fields (Task.file, the status). */
  for (size_t i = 0; i < r->nfiles; i++)
    if (!utf8_valid(r->files[i])) {
      rc = ferry__seterr(err, FERRY_EINVAL,
                         "%s: a file it names has a name that is not valid "
                         "UTF-8", spec->patterns[0]);
      goto out;
    }
  {
    size_t n = r->nfiles ? r->nfiles : 1;
    r->scanned = ferry__calloc(n, sizeof(*r->scanned));
    r->reused = ferry__calloc(n, sizeof(*r->reused));
    r->reuse = ferry__calloc(n, 1);
    if (r->scanned == NULL || r->reused == NULL || r->reuse == NULL) {
      rc = ferry__seterr(err, FERRY_ENOMEM, "out of memory");
      goto out;
    }
  }
  /* Identities for the reuse of earlier scans (a file that cannot be
   * stat'ed is scanned, which says why it cannot be read). */
  for (size_t i = 0; i < r->nfiles; i++) {
    struct stat st;
    if (i % 256 == 0 && reg_cancelled(r))
      return;
    if (stat(r->files[i], &st) == 0)
      scanned_from_stat(&r->scanned[i], &st);
  }
out:
  if (rc != 0)
    r->rc = rc;
}

void ferry__disp_reg_reuse(ferry_disp_t *d, ferry_disp_reg_t *r) {
  if (r->rc != 0)
    return;
  for (size_t i = 0; i < r->nfiles; i++) {
    int rc = 0;
    if (reuse_scan(d, r->files[i], (uint32_t)i, r->spec.compression, r->per,
                   &r->scanned[i], &r->reused[i], &rc))
      r->reuse[i] = rc != 0 ? 2 : 1;
  }
}

/* Test-only (state.h): FERRY_DISP_SCAN_DELAY_MS, cancellable. */
static void scan_delay(ferry_disp_reg_t *r) {
  const char *e = getenv("FERRY_DISP_SCAN_DELAY_MS");
  long ms = e != NULL ? strtol(e, NULL, 10) : 0;
  if (ms > 60000)
    ms = 60000;
  for (; ms > 0 && !atomic_load(&r->cancel); ms -= 10) {
    struct timespec t = {0, 10 * 1000000L};
    nanosleep(&t, NULL);
  }
}

void ferry__disp_reg_scan(ferry_disp_reg_t *r) {
  ferry_error_t *err = &r->err;
  splits_t *sp = &r->sp;
  int rc = 0;

  if (r->rc != 0)
    return;
  scan_delay(r);
  for (size_t i = 0; i < r->nfiles && rc == 0; i++) {
    if (reg_cancelled(r))
      return;
    if (r->reuse[i] == 2) {
      rc = ferry__seterr(err, FERRY_ENOMEM, "%s: out of memory",
                         r->files[i]);
    } else if (r->reuse[i] == 1) {
      for (size_t k = 0; k < r->reused[i].n && rc == 0; k++)
        if ((rc = push_split(sp, &r->reused[i].v[k])) != 0)
          ferry__seterr(err, rc, "%s: out of memory", r->files[i]);
    } else {
      rc = scan_file(r->files[i], (uint32_t)i, r->spec.compression, r->per,
                     r->max_record_len, sp, &r->scanned[i], err);
    }
  }
  if (rc == 0 && sp->n == 0)
    rc = ferry__seterr(err, FERRY_EINVAL, "%s: no records in %zu file%s",
                       r->spec.patterns[0], r->nfiles,
                       r->nfiles == 1 ? "" : "s");
  if (rc == 0 && sp->n > UINT32_MAX / 2)
    rc = ferry__seterr(err, FERRY_EINVAL, "too many splits (%zu)", sp->n);
  r->rc = rc;
}

int ferry__disp_reg_finish(ferry_disp_t *d, ferry_disp_reg_t *r,
                           Ferry__V1__RegisterDatasetResponse *resp,
                           ferry_arena_t *a, int64_t now_ms,
                           ferry_error_t *err) {
  dataset_t *ds;
  int rc;

  d->now = now_ms;
  if (r->rc != 0) {
    *err = r->err;
    return r->rc;
  }
  /* Registered meanwhile by a concurrent call of the same spec. */
  if ((ds = find_dataset(d, r->id)) != NULL) {
    fill_register_resp(ds, resp);
  } else if ((rc = dataset_room(d, err)) != 0) {
    return rc;
  } else if ((rc = commit_dataset(d, r->id, r->canon, r->clen, r->files,
                                  r->nfiles, &r->sp, err)) != 0) {
    return rc;
  } else {
    ds = find_dataset(d, r->id);
    ds->scanned = r->scanned;
    ds->scan_per = r->per;
    ds->scan_compression = (int)r->spec.compression;
    r->scanned = NULL;
    fill_register_resp(ds, resp);
    FERRY_LOG(FERRY_LOG_INFO,
              "dataset %s: %zu files, %zu splits, %" PRIu64 " known records",
              r->id, r->nfiles, r->sp.n, ds->known_records);
  }
  if ((resp->dataset_id = arena_strdup(a, r->id)) == NULL)
    return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
  return 0;
}

int ferry__disp_register_dataset(ferry_disp_t *d,
                                 const Ferry__V1__RegisterDatasetRequest *req,
                                 Ferry__V1__RegisterDatasetResponse *resp,
                                 ferry_arena_t *a, int64_t now_ms,
                                 ferry_error_t *err) {
  ferry_disp_reg_t *r;
  int rc = ferry__disp_reg_begin(d, req, resp, a, now_ms, &r, err);
  if (rc != 0 || r == NULL)
    return rc;
  ferry__disp_reg_expand(r);
  ferry__disp_reg_reuse(d, r);
  ferry__disp_reg_scan(r);
  rc = ferry__disp_reg_finish(d, r, resp, a, now_ms, err);
  ferry__disp_reg_free(r);
  return rc;
}

/* ---- GetOrCreateJob ----------------------------------------------------- */

static job_t *find_named_job(ferry_disp_t *d, const char *name) {
  for (size_t i = 0; i < d->njobs; i++)
    if (RUNNING(d->jobs[i]) && strcmp(d->jobs[i]->name, name) == 0)
      return d->jobs[i];
  return NULL;
}

static int check_options(const Ferry__V1__JobOptions *o, ferry_error_t *err) {
  if (o->mode != FERRY__V1__JOB_MODE__JOB_MODE_DISTRIBUTED_EPOCH &&
      o->mode != FERRY__V1__JOB_MODE__JOB_MODE_PARALLEL_EPOCHS)
    return ferry__seterr(err, FERRY_EINVAL, "job options: unknown mode %d",
                         (int)o->mode);
  if (o->error_policy != FERRY__V1__ERROR_POLICY__ERROR_POLICY_FAIL &&
      o->error_policy != FERRY__V1__ERROR_POLICY__ERROR_POLICY_SKIP)
    return ferry__seterr(err, FERRY_EINVAL,
                         "job options: unknown error policy %d",
                         (int)o->error_policy);
  if (o->num_epochs < -1)
    return ferry__seterr(err, FERRY_EINVAL,
                         "job options: num_epochs %" PRId64
                         " (want >= 1, 0 for the spec's, -1 infinite)",
                         o->num_epochs);
  return 0;
}

static int create_job(ferry_disp_t *d, dataset_t *ds,
                      const Ferry__V1__JobOptions *o, job_t **out,
                      ferry_error_t *err) {
  Ferry__V1__JournalCreateJob m = FERRY__V1__JOURNAL_CREATE_JOB__INIT;
  int rc;

  m.job_id = d->next_job;
  m.dataset_id = ds->id;
  m.name = o->job_name;
  m.mode = o->mode;
  m.num_epochs = o->num_epochs;
  if (m.num_epochs == 0)
    m.num_epochs = ds->spec.repeat == 0 ? 1 : ds->spec.repeat;
  /* The job's shuffle overrides the spec's when set. */
  m.shuffle = o->shuffle || ds->spec.shuffle;
  m.seed = o->shuffle ? o->shuffle_seed : ds->spec.shuffle_seed;
  m.error_policy = o->error_policy;
  ENTRY(e, CREATE_JOB, create_job, m);
  if ((rc = commit(d, &e, err)) != 0)
    return rc;
  *out = find_job(d, m.job_id);
  return 0;
}

int ferry__disp_get_or_create_job(ferry_disp_t *d,
                                  const Ferry__V1__GetOrCreateJobRequest *req,
                                  Ferry__V1__GetOrCreateJobResponse *resp,
                                  ferry_arena_t *a, int64_t now_ms,
                                  ferry_error_t *err) {
  Ferry__V1__JobOptions defaults = FERRY__V1__JOB_OPTIONS__INIT;
  const Ferry__V1__JobOptions *o = req->options ? req->options : &defaults;
  dataset_t *ds = find_dataset(d, req->dataset_id);
  ProtobufCAllocator al;
  job_t *j = NULL;
  uint64_t client;
  int rc;

  d->now = now_ms;
  if ((rc = check_len(req->dataset_id, FERRY_DISP_MAX_NAME_LEN, "dataset_id",
                      err)) != 0 ||
      (rc = check_len(o->job_name, FERRY_DISP_MAX_NAME_LEN, "job_name",
                      err)) != 0)
    return rc;
  if (ds == NULL)
    return ferry__seterr(err, FERRY_ENOENT, "dataset %s is not registered",
                         req->dataset_id);
  if ((rc = check_options(o, err)) != 0)
    return rc;
  if (o->job_name[0] != '\0' && (j = find_named_job(d, o->job_name))) {
    if (j->ds != ds || j->mode != (int)o->mode)
      return ferry__seterr(err, FERRY_EINVAL,
                           "job '%s' already runs dataset %s in mode %s",
                           o->job_name, j->ds->id,
                           PAR(j) ? "parallel_epochs" : "distributed_epoch");
  } else {
    if ((rc = create_job(d, ds, o, &j, err)) != 0)
      return rc;
    resp->created = true;
  }
  client = d->next_client;
  uint8_t *secret = ferry__arena_alloc(a, FERRY_CLIENT_SECRET_BYTES);
  if (secret == NULL)
    return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
  if ((rc = ferry_rpc_random(secret, FERRY_CLIENT_SECRET_BYTES)) != 0)
    return ferry__seterr(err, rc, "getrandom: %s", ferry_strerror(rc));
  if ((rc = emit_client_joined(d, j, client, secret, err)) != 0)
    return rc;
  resp->client_secret.data = secret;
  resp->client_secret.len = FERRY_CLIENT_SECRET_BYTES;
  schedule(d);
  resp->job_id = j->id;
  resp->client_id = client;
  resp->num_epochs = j->num_epochs;
  resp->records_per_epoch = ds->known_records;
  resp->client_timeout_ms = d->cfg.client_timeout_ms;
  ferry__disp_arena_allocator(a, &al);
  resp->spec = ferry__v1__pipeline_spec__unpack(&al, ds->spec_len,
                                                ds->spec_bytes);
  if (resp->spec == NULL)
    return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
  return 0;
}

/* ---- ClientHeartbeat ---------------------------------------------------- */

/* Commits one Progress entry with the rows whose delivered count grew. */
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
    int64_t r = p->epoch == j->epoch
                    ? row_index(j, p->split, p->worker_id)
                    : -1;
    row_t *row = r >= 0 ? &j->rows[r] : NULL;
    uint64_t v;
    if (row == NULL || row->client != client || row->done)
      continue;
    /* A client never acknowledges more than the split holds. */
    if (row->total_known && p->delivered > row->total)
      FERRY_LOG(FERRY_LOG_WARN,
                "job %" PRIu64 ": client %" PRIu64 " reports %" PRIu64
                " records of epoch %u split %u, which holds %" PRIu64
                ": counted as %" PRIu64, j->id, client, p->delivered,
                j->epoch, row->split, row->total, row->total);
    v = row->total_known && p->delivered > row->total ? row->total
                                                       : p->delivered;
    if (v <= row->delivered)
      continue;
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
    rc = commit(d, &e, NULL);
  }
out:
  ferry__free(rows);
  ferry__free(ptrs);
  return rc;
}

/* A client that has not read its streams for `stalled_ms` (its own
 * report, or a worker's of its stream; `source` says which) past
 * --client-stall-ms is no longer renewed: it expires one client timeout
 * after its last renewal and its rows go back to the pool. */
static void stop_renewing_if_stalled(ferry_disp_t *d, const job_t *j,
                                     client_t *c, uint64_t stalled_ms,
                                     const char *source) {
  if (d->cfg.client_stall_ms <= 0 || c == NULL || !c->active ||
      c->no_renew || stalled_ms < (uint64_t)d->cfg.client_stall_ms)
    return;
  c->no_renew = true;
  FERRY_LOG(FERRY_LOG_WARN,
            "job %" PRIu64 ": client %" PRIu64 " has not read %s for %" PRIu64
            " ms: its lease is no longer renewed, its splits go back to the "
            "pool after the client timeout", j->id, c->id, source,
            stalled_ms);
}

/* Re-leases row `r`, whose current lease cannot complete. The worker that
 * held it is suspected until it heartbeats again, and the row avoids it
 * for a backoff that doubles with each restart in a row (100 ms up to the
 * worker timeout), so a dead worker is not handed the same split again and
 * again before its timeout. A row restarted FERRY_DISP_MAX_RESTARTS times
 * without progress fails its job, naming it. */
static int restart_row(ferry_disp_t *d, job_t *j, uint32_t r) {
  row_t *row = &j->rows[r];
  const split_t *sp = &j->ds->splits[row->split];
  worker_t *w = find_worker(d, row->worker);
  int64_t backoff = 100;

  if (++row->restarts > FERRY_DISP_MAX_RESTARTS) {
    char msg[700];
    snprintf(msg, sizeof(msg),
             "epoch %u split %u (%s, records from %" PRIu64 "): restarted %u "
             "times in a row without progress; giving up", j->epoch,
             row->split, j->ds->files[sp->file], sp->first,
             FERRY_DISP_MAX_RESTARTS);
    return emit_job_failed(d, j, FERRY_EIO, msg);
  }
  for (uint32_t k = 1; k < row->restarts && backoff < INT64_MAX / 2; k++)
    backoff *= 2;
  if (backoff > d->cfg.worker_timeout_ms)
    backoff = d->cfg.worker_timeout_ms;
  row->avoid = row->worker;
  row->avoid_until = d->now + backoff;
  if (w != NULL && w->suspect_since < 0)
    w->suspect_since = d->now;
  FERRY_LOG(FERRY_LOG_INFO,
            "job %" PRIu64 ": client %" PRIu64 " restarts epoch %u split %u "
            "(lease %" PRIu64 " on worker %" PRIu64 ") from %" PRIu64
            " (restart %u in a row)", j->id, row->client, j->epoch,
            row->split, row->lease, row->worker, row->delivered,
            row->restarts);
  recount(d);
  return bind_row(d, j, r, row->client, worker_for(d, j, row));
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
    if (!p->restart || p->epoch != j->epoch)
      continue;
    if ((r = row_index(j, p->split, p->worker_id)) < 0)
      continue;
    row = &j->rows[r];
    if (row->client != client || row->done || row->worker == 0 ||
        row->lease != p->lease)
      continue;
    if (restart_row(d, j, (uint32_t)r) != 0)
      return;
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
    r->workers[r->n_workers++] = wi;
  }
  return 0;
}

static int fill_assignments(ferry_disp_t *d, job_t *j, uint64_t client,
                            Ferry__V1__ClientHeartbeatResponse *r,
                            ferry_arena_t *a) {
  r->assignments = ferry__arena_alloc(a, (j->nrows + 1) * sizeof(void *));
  if (r->assignments == NULL)
    return FERRY_ENOMEM;
  /* In hand-out order, so the client reads splits in the epoch's order. */
  for (uint32_t i = 0; i < j->nrows; i++) {
    const row_t *row = &j->rows[j->order[i]];
    worker_t *w = row->worker ? find_worker(d, row->worker) : NULL;
    Ferry__V1__Assignment *as;
    if (row->client != client || row->done)
      continue;
    if ((as = ferry__arena_alloc(a, sizeof(*as))) == NULL)
      return FERRY_ENOMEM;
    ferry__v1__assignment__init(as);
    as->epoch = j->epoch;
    as->split = row->split;
    as->num_records = row->total_known ? row->total : 0;
    as->worker_id = w != NULL ? w->id : (PAR(j) ? row->pinned : 0);
    as->worker_address = w != NULL ? w->address : "";
    as->lease = row->lease;
    as->start = row->delivered;
    r->assignments[r->n_assignments++] = as;
  }
  return 0;
}

/* True when no row of the current epoch waits for a client. */
static bool exhausted(const job_t *j) {
  for (uint32_t i = 0; i < j->nrows; i++)
    if (j->rows[i].client == 0 && !j->rows[i].done)
      return false;
  return true;
}

static int fill_client_resp(ferry_disp_t *d, job_t *j, uint64_t client,
                            Ferry__V1__ClientHeartbeatResponse *r,
                            ferry_arena_t *a, ferry_error_t *err) {
  r->state = j->state;
  r->epoch = j->epoch;
  r->epochs_done = j->epochs_done;
  r->epoch_exhausted = !RUNNING(j) || (j->started && exhausted(j));
  if (j->state == FERRY__V1__JOB_STATE__JOB_STATE_FAILED ||
      j->state == FERRY__V1__JOB_STATE__JOB_STATE_CANCELLED) {
    r->error_code = j->error_code;
    r->error = j->error != NULL ? j->error : "";
  }
  if (fill_workers(d, r, a) != 0 ||
      (RUNNING(j) && fill_assignments(d, j, client, r, a) != 0))
    return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
  return 0;
}

int ferry__disp_client_heartbeat(ferry_disp_t *d,
                                 const Ferry__V1__ClientHeartbeatRequest *req,
                                 Ferry__V1__ClientHeartbeatResponse *resp,
                                 ferry_arena_t *a, int64_t now_ms,
                                 ferry_error_t *err) {
  job_t *j = find_job(d, req->job_id);
  client_t *c = j != NULL ? find_client(j, req->client_id) : NULL;
  int rc;

  d->now = now_ms;
  if (req->n_progress > FERRY_DISP_MAX_PROGRESS ||
      req->want_splits > FERRY_DISP_MAX_WANT)
    return ferry__seterr(err, FERRY_EINVAL,
                         "client heartbeat: over %d progress entries or %d "
                         "splits wanted", FERRY_DISP_MAX_PROGRESS,
                         FERRY_DISP_MAX_WANT);
  if (j == NULL)
    return ferry__seterr(err, FERRY_ENOENT, "job %" PRIu64 " not found",
                         req->job_id);
  if (c == NULL)
    return ferry__seterr(err, FERRY_ENOENT,
                         "client %" PRIu64 " not found in job %" PRIu64,
                         req->client_id, req->job_id);
  /* Issue 8: only the client that joined (its secret) touches its state. */
  if (c->has_secret &&
      (req->client_secret.len != FERRY_CLIENT_SECRET_BYTES ||
       !ferry_rpc_bytes_equal(req->client_secret.data, c->secret,
                              FERRY_CLIENT_SECRET_BYTES))) {
    FERRY_LOG(FERRY_LOG_WARN, "ClientHeartbeat for job %" PRIu64 " client "
              "%" PRIu64 " without its secret: refused", j->id, c->id);
    return ferry__seterr(err, FERRY_EACCES, "ClientHeartbeat: this caller is "
                         "not that client (wrong or missing client secret)");
  }
  /* A client declared lost comes back without its old rows. */
  if (!c->active && !req->leaving && RUNNING(j)) {
    if ((rc = emit_client_joined(d, j, req->client_id,
                                 c->has_secret ? c->secret : NULL, err)) != 0)
      return rc;
    c = find_client(j, req->client_id);
  }
  stop_renewing_if_stalled(d, j, c, req->stalled_ms,
                           "its streams (its trainer holds every batch)");
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
  }
  if (c->active)
    record_progress(d, j, c->id, req);
  if (c->active && !req->leaving && !c->no_renew)
    restart_rows(d, j, c->id, req);
  if (req->leaving && c->active)
    emit_client_left(d, j, c->id, false);
  schedule(d);
  if (!req->leaving && c->active && !c->no_renew) {
    bind_rows(d, j, c->id, req->want_splits);
    schedule(d);
  }
  resp->incarnation = c->incarnation;
  resp->fenced = c->no_renew;
  resp->client_timeout_ms = d->cfg.client_timeout_ms;
  return fill_client_resp(d, j, c->id, resp, a, err);
}

/* ---- WorkerHeartbeat ---------------------------------------------------- */

/* The worker for this heartbeat: its live record, or a new registration. */
static worker_t *worker_for_heartbeat(ferry_disp_t *d,
                                      const Ferry__V1__WorkerHeartbeatRequest *req,
                                      ferry_error_t *err) {
  Ferry__V1__JournalWorkerRegistered m =
      FERRY__V1__JOURNAL_WORKER_REGISTERED__INIT;
  worker_t *w = req->worker_id ? live_worker(d, req->worker_id) : NULL;

  if (w != NULL && strcmp(w->address, req->address) == 0)
    return w;
  m.worker_id = w != NULL ? w->id : d->next_worker;
  m.address = req->address;
  ENTRY(e, WORKER_REGISTERED, worker_registered, m);
  if (commit(d, &e, err) != 0)
    return NULL;
  if (w == NULL)
    FERRY_LOG(FERRY_LOG_INFO, "worker %" PRIu64 " registered at %s",
              m.worker_id, req->address);
  return find_worker(d, m.worker_id);
}

/* The row a worker's task refers to if the worker still holds its lease
 * (job running, current epoch, same lease, not done), else NULL. */
static row_t *leased_row(ferry_disp_t *d, const worker_t *w,
                         const Ferry__V1__TaskProgress *t, job_t **jout) {
  job_t *j = find_job(d, t->job_id);
  int64_t r;

  if (j == NULL || !RUNNING(j) || t->epoch != j->epoch)
    return NULL;
  if ((r = row_index(j, t->split, w->id)) < 0)
    return NULL;
  if (j->rows[r].worker != w->id || j->rows[r].lease != t->lease ||
      j->rows[r].done)
    return NULL;
  *jout = j;
  return &j->rows[r];
}

/* Errors, skipped counts and finished totals of the worker's live tasks. */
static void record_tasks(ferry_disp_t *d, worker_t *w,
                         const Ferry__V1__WorkerHeartbeatRequest *req) {
  for (size_t i = 0; i < req->n_tasks; i++) {
    const Ferry__V1__TaskProgress *t = req->tasks[i];
    job_t *j = NULL;
    row_t *row = leased_row(d, w, t, &j);
    uint32_t r;
    if (row == NULL) {
      /* Issue 8: a worker reports only on leases it holds. */
      if (t->error_code != 0)
        FERRY_LOG(FERRY_LOG_WARN, "worker %" PRIu64 " reported an error for "
                  "job %" PRIu64 " epoch %u split %u lease %" PRIu64 ", "
                  "which it does not hold: ignored", w->id, t->job_id,
                  t->epoch, t->split, t->lease);
      continue;
    }
    r = (uint32_t)(row - j->rows);
    if (t->stalled_ms > 0)
      stop_renewing_if_stalled(d, j, find_client(j, row->client),
                               t->stalled_ms, "its stream from a worker");
    if (t->error_code != 0) {
      emit_job_failed(d, j, t->error_code, t->error[0] ? t->error
                                                       : ferry_strerror(
                                                             t->error_code));
      continue;
    }
    if (t->skipped > (row->skip_lease == t->lease ? row->skip_seen : 0)) {
      Ferry__V1__JournalSkipped m = FERRY__V1__JOURNAL_SKIPPED__INIT;
      m.job_id = j->id;
      m.epoch = j->epoch;
      m.row = r;
      m.lease = t->lease;
      m.skipped = t->skipped;
      ENTRY(e, SKIPPED, skipped, m);
      commit(d, &e, NULL);
    }
    if (t->finished && (!row->total_known || row->total != t->produced)) {
      Ferry__V1__JournalTaskFinished m = FERRY__V1__JOURNAL_TASK_FINISHED__INIT;
      m.job_id = j->id;
      m.epoch = j->epoch;
      m.row = r;
      m.total = t->produced;
      ENTRY(e, TASK_FINISHED, task_finished, m);
      commit(d, &e, NULL);
    }
  }
}

static Ferry__V1__Task *make_task(const job_t *j, const row_t *row,
                                  ferry_arena_t *a) {
  Ferry__V1__Task *t = ferry__arena_alloc(a, sizeof(*t));
  Ferry__V1__Split *s = ferry__arena_alloc(a, sizeof(*s));
  const split_t *sp = &j->ds->splits[row->split];

  if (t == NULL || s == NULL)
    return NULL;
  ferry__v1__task__init(t);
  ferry__v1__split__init(s);
  s->index = row->split;
  s->file_index = sp->file;
  s->byte_offset = sp->offset;
  s->byte_end = sp->end;
  s->first_record = sp->first;
  s->num_records = sp->count;
  t->job_id = j->id;
  t->client_id = row->client;
  const client_t *c = find_client((job_t *)j, row->client);
  if (c != NULL && c->has_secret) {
    t->client_secret.data = (uint8_t *)c->secret;
    t->client_secret.len = FERRY_CLIENT_SECRET_BYTES;
  }
  t->epoch = j->epoch;
  t->split = s;
  t->file = j->ds->files[sp->file];
  t->start = row->start;
  t->lease = row->lease;
  t->spec.data = j->ds->spec_bytes;
  t->spec.len = j->ds->spec_len;
  t->shuffle = j->shuffle;
  t->shuffle_seed = j->seed;
  t->error_policy = j->policy;
  return t;
}

/* Cancels the listed tasks the worker no longer holds; marks the others. */
static int diff_cancelled(ferry_disp_t *d, worker_t *w,
                          const Ferry__V1__WorkerHeartbeatRequest *req,
                          Ferry__V1__WorkerHeartbeatResponse *resp,
                          ferry_arena_t *a) {
  resp->cancelled = ferry__arena_alloc(a, (req->n_tasks + 1) * sizeof(void *));
  if (resp->cancelled == NULL)
    return FERRY_ENOMEM;
  for (size_t i = 0; i < req->n_tasks; i++) {
    const Ferry__V1__TaskProgress *t = req->tasks[i];
    job_t *j = NULL;
    row_t *row = leased_row(d, w, t, &j);
    Ferry__V1__TaskRef *ref;
    if (row != NULL) {
      row->listed = d->hb_gen;
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

/* Every lease of the worker it did not list: new tasks. */
static int diff_new(ferry_disp_t *d, worker_t *w,
                    Ferry__V1__WorkerHeartbeatResponse *resp,
                    ferry_arena_t *a) {
  size_t n = 0, k = 0;
  for (size_t i = 0; i < d->njobs; i++)
    n += RUNNING(d->jobs[i]) ? d->jobs[i]->nrows : 0;
  if ((resp->new_tasks = ferry__arena_alloc(a, (n + 1) * sizeof(void *))) ==
      NULL)
    return FERRY_ENOMEM;
  for (size_t i = 0; i < d->njobs; i++) {
    job_t *j = d->jobs[i];
    if (!RUNNING(j))
      continue;
    for (uint32_t r = 0; r < j->nrows; r++) {
      row_t *row = &j->rows[r];
      if (row->worker != w->id || row->done || row->listed == d->hb_gen)
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
  d->hb_gen++;
  resp->worker_id = w->id;
  resp->heartbeat_ms = d->cfg.heartbeat_ms;
  if (diff_cancelled(d, w, req, resp, a) != 0 || diff_new(d, w, resp, a) != 0)
    return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
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
  if ((rc = check_len(req->address, FERRY_DISP_MAX_ADDRESS_LEN,
                      "worker address", err)) != 0)
    return rc;
  if (req->address == NULL || req->address[0] == '\0')
    return ferry__seterr(err, FERRY_EINVAL, "worker heartbeat: no address");
  if (req->n_tasks > FERRY_DISP_MAX_PROGRESS)
    return ferry__seterr(err, FERRY_EINVAL,
                         "worker heartbeat: over %d tasks",
                         FERRY_DISP_MAX_PROGRESS);
  /* A task's error is cleaned of invalid UTF-8 when it is recorded. */
  for (size_t i = 0; i < req->n_tasks; i++)
    if ((rc = check_str(req->tasks[i]->error, FERRY_DISP_MAX_ERROR_LEN,
                        false, "a task's error", err)) != 0)
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
  w->unfinished = 0;
  for (size_t i = 0; i < req->n_tasks; i++)
    w->unfinished += !req->tasks[i]->finished;
  record_tasks(d, w, req);
  schedule(d);
  return fill_worker_resp(d, w, req, resp, a, err);
}

bool ferry__disp_worker_may_wait(
    ferry_disp_t *d, const Ferry__V1__WorkerHeartbeatRequest *req,
    const Ferry__V1__WorkerHeartbeatResponse *resp) {
  worker_t *w = live_worker(d, resp->worker_id);
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
  worker_t *w = find_worker(d, req->worker_id);

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
    if (!req->tasks[i]->finished &&
        leased_row(d, w, req->tasks[i], &j) == NULL)
      return true;
  }
  return false;
}

uint64_t ferry__disp_changes(const ferry_disp_t *d) { return d->changes; }

/* ---- Operator calls (issue 10) ------------------------------------------ */

static bool drained(const worker_t *w);
static const char *worker_state(const worker_t *w);

/* The worker a DrainWorker request names: by id, else the newest worker
 * registered at the address that is not lost (else the newest lost one). */
static worker_t *drain_target(ferry_disp_t *d,
                              const Ferry__V1__DrainWorkerRequest *req,
                              ferry_error_t *err) {
  worker_t *best = NULL;
  if (req->worker_id != 0) {
    if ((best = find_worker(d, req->worker_id)) == NULL)
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
  if ((rc = check_len(req->address, FERRY_DISP_MAX_ADDRESS_LEN,
                      "worker address", err)) != 0)
    return rc;
  if ((w = drain_target(d, req, err)) == NULL)
    return err != NULL ? err->code : FERRY_ENOENT;
  if (!w->lost && !w->op_drained) {
    Ferry__V1__JournalWorkerDrained m =
        FERRY__V1__JOURNAL_WORKER_DRAINED__INIT;
    uint32_t moved = 0;
    for (size_t i = 0; i < d->njobs; i++) {
      const job_t *j = d->jobs[i];
      for (uint32_t r = 0; RUNNING(j) && r < j->nrows; r++)
        moved += !j->rows[r].done &&
                 (j->rows[r].worker == w->id ||
                  (PAR(j) && j->rows[r].pinned == w->id));
    }
    m.worker_id = w->id;
    ENTRY(e, WORKER_DRAINED, worker_drained, m);
    if ((rc = commit(d, &e, err)) != 0)
      return rc;
    FERRY_LOG(FERRY_LOG_INFO, "worker %" PRIu64 " (%s) drained by the "
              "operator: %u leases move to other workers", w->id,
              w->address, moved);
    resp->moved = moved;
    schedule(d); /* re-leases its rows (and answers its held heartbeat) */
  }
  recount(d);
  resp->worker_id = w->id;
  resp->address = arena_strdup(a, w->address);
  resp->state = (char *)worker_state(w);
  resp->tasks = w->ntasks;
  resp->drained = drained(w);
  for (size_t i = 0; i < d->nworkers; i++)
    resp->other_workers += d->workers[i] != w && eligible(d, d->workers[i]);
  if (resp->address == NULL)
    return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
  return 0;
}

static const char *job_state_name(int state) {
  switch (state) {
  case FERRY__V1__JOB_STATE__JOB_STATE_FINISHED:
    return "finished";
  case FERRY__V1__JOB_STATE__JOB_STATE_FAILED:
    return "failed";
  case FERRY__V1__JOB_STATE__JOB_STATE_CANCELLED:
    return "cancelled";
  default:
    return "running";
  }
}

int ferry__disp_cancel_job(ferry_disp_t *d,
                           const Ferry__V1__CancelJobRequest *req,
                           Ferry__V1__CancelJobResponse *resp,
                           ferry_arena_t *a, int64_t now_ms,
                           ferry_error_t *err) {
  job_t *j = find_job(d, req->job_id);
  Ferry__V1__JournalJobCancelled m = FERRY__V1__JOURNAL_JOB_CANCELLED__INIT;
  int rc;

  (void)a;
  d->now = now_ms;
  if (j == NULL)
    return ferry__seterr(err, FERRY_ENOENT, "CancelJob: no job %" PRIu64,
                         req->job_id);
  resp->job_id = j->id;
  resp->state = j->state;
  if (j->state == FERRY__V1__JOB_STATE__JOB_STATE_CANCELLED) {
    resp->already = true;
    return 0;
  }
  if (!RUNNING(j))
    return ferry__seterr(err, FERRY_EGRPC_FAILED_PRECONDITION,
                         "CancelJob: job %" PRIu64 " already %s; nothing to "
                         "cancel", j->id, job_state_name(j->state));
  m.job_id = j->id;
  ENTRY(e, JOB_CANCELLED, job_cancelled, m);
  if ((rc = commit(d, &e, err)) != 0)
    return rc;
  FERRY_LOG(FERRY_LOG_WARN, "job %" PRIu64 " cancelled by the operator",
            j->id);
  resp->state = j->state;
  return 0;
}

/* ---- Timeouts and GC ---------------------------------------------------- */

static void expire_workers(ferry_disp_t *d) {
  for (size_t i = 0; i < d->nworkers; i++) {
    worker_t *w = d->workers[i];
    Ferry__V1__JournalWorkerLost m = FERRY__V1__JOURNAL_WORKER_LOST__INIT;
    if (w->lost || d->now - w->last_hb < d->cfg.worker_timeout_ms)
      continue;
    FERRY_LOG(FERRY_LOG_WARN,
              "worker %" PRIu64 " (%s) lost: no heartbeat for %" PRId64 " ms",
              w->id, w->address, d->now - w->last_hb);
    m.worker_id = w->id;
    ENTRY(e, WORKER_LOST, worker_lost, m);
    commit(d, &e, NULL);
  }
}

static void expire_clients(ferry_disp_t *d) {
  for (size_t i = 0; i < d->njobs; i++) {
    job_t *j = d->jobs[i];
    for (size_t c = 0; c < j->nclients; c++) {
      client_t *cl = &j->clients[c];
      if (!cl->active || d->now - cl->last_hb < d->cfg.client_timeout_ms)
        continue;
      FERRY_LOG(FERRY_LOG_WARN, "job %" PRIu64 ": client %" PRIu64 " lost",
                j->id, cl->id);
      emit_client_left(d, j, cl->id, true);
    }
  }
}

static void collect_jobs(ferry_disp_t *d) {
  size_t i = d->njobs;
  while (i-- > 0) {
    job_t *j = d->jobs[i];
    Ferry__V1__JournalJobGC m = FERRY__V1__JOURNAL_JOB_GC__INIT;
    if (j->idle_since < 0 || d->now - j->idle_since < d->cfg.job_gc_ms)
      continue;
    FERRY_LOG(FERRY_LOG_INFO, "job %" PRIu64 " garbage-collected", j->id);
    m.job_id = j->id;
    ENTRY(e, JOB_GC, job_gc, m);
    commit(d, &e, NULL);
  }
}

/* Datasets no job used for job_gc_ms. */
static void collect_datasets(ferry_disp_t *d) {
  size_t i = d->nds;
  while (i-- > 0) {
    dataset_t *ds = d->ds[i];
    Ferry__V1__JournalDatasetGC m = FERRY__V1__JOURNAL_DATASET_GC__INIT;
    if (ds->idle_since < 0 || d->now - ds->idle_since < d->cfg.job_gc_ms ||
        dataset_used(d, ds))
      continue;
    char id[FERRY_DISP_MAX_NAME_LEN + 1];
    /* A copy: the entry is serialized after it is applied (freed). */
    snprintf(id, sizeof(id), "%s", ds->id);
    FERRY_LOG(FERRY_LOG_INFO, "dataset %s garbage-collected", id);
    m.dataset_id = id;
    ENTRY(e, DATASET_GC, dataset_gc, m);
    commit(d, &e, NULL);
  }
}

void ferry__disp_tick(ferry_disp_t *d, int64_t now_ms) {
  d->now = now_ms;
  expire_workers(d);
  expire_clients(d);
  collect_jobs(d);
  collect_datasets(d);
  schedule(d);
}

/* ---- Status ------------------------------------------------------------- */

/* Nothing runs on the drained worker: no lease, and a heartbeat since the
 * drain listed no unfinished task; or it is lost. */
static bool drained(const worker_t *w) {
  return w->lost || (w->op_drained && w->ntasks == 0 &&
                     w->beats > w->drain_beats && w->unfinished == 0);
}

/* WorkerStatus.state (dispatcher.proto). A worker known from the journal
 * but not heard from since this process started is "unknown", not alive:
 * it may have left before the restart (recount() first). */
static const char *worker_state(const worker_t *w) {
  if (w->lost)
    return "lost";
  if (w->op_drained)
    return drained(w) ? "drained" : "draining";
  if (w->draining)
    return "draining";
  return w->beats > 0 ? "alive" : "unknown";
}

static Ferry__V1__WorkerStatus *worker_status(ferry_disp_t *d,
                                              const worker_t *w,
                                              ferry_arena_t *a) {
  Ferry__V1__WorkerStatus *s = ferry__arena_alloc(a, sizeof(*s));
  if (s == NULL)
    return NULL;
  ferry__v1__worker_status__init(s);
  s->worker_id = w->id;
  s->address = w->address;
  s->state = (char *)worker_state(w);
  s->operator_drained = w->op_drained;
  s->tasks = w->ntasks;
  s->threads = w->threads;
  s->buffer_bytes = w->buffer_bytes;
  s->buffer_free_bytes = w->buffer_free_bytes;
  s->last_heartbeat_ms_ago = d->now - w->last_hb;
  return s;
}

static int job_clients(ferry_disp_t *d, const job_t *j,
                       Ferry__V1__JobStatus *s, ferry_arena_t *a) {
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
    for (uint32_t r = 0; r < j->nrows; r++)
      cs->splits_in_flight +=
          j->rows[r].client == c->id && !j->rows[r].done;
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

uint32_t ferry__disp_workers_wanted(uint32_t n, const double *stall,
                                    const double *bps, size_t k,
                                    double target) {
  double demand = 0, rate = 0;
  for (size_t i = 0; i < k; i++) {
    double s = stall[i] < 0 ? 0 : stall[i] > 0.99 ? 0.99 : stall[i];
    double r = bps[i] > 0 ? bps[i] : 0;
    demand += r / (1 - s); /* what its trainer would take unstalled */
    rate += r;
  }
  if (target < 0 || target >= 1)
    target = 0;
  if (rate <= 0)
    return n > 0 ? n : 1;
  double want = ceil((n > 0 ? n : 1) * (1 - target) * demand / rate - 1e-9);
  if (want > 10000)
    want = 10000;
  uint32_t w = (uint32_t)want;
  if (w < n)
    w = n;
  return w > 0 ? w : 1;
}

void ferry__disp_split_counts(const ferry_disp_t *d, uint64_t out[3]) {
  out[0] = out[1] = out[2] = 0;
  for (size_t i = 0; i < d->njobs; i++) {
    const job_t *j = d->jobs[i];
    if (!j->started)
      continue;
    for (uint32_t r = 0; r < j->nrows; r++) {
      const row_t *row = &j->rows[r];
      out[row->done ? 2 : row->worker != 0 ? 1 : 0]++;
    }
  }
}

/* The job's stall fraction (mean over its clients), batches per second
 * (summed) and workers wanted, from the clients' latest heartbeats: the
 * last interval's figures where the client sent them. */
static void job_figures(const ferry_disp_t *d, const job_t *j,
                        Ferry__V1__JobStatus *s) {
  double stall[64], bps[64];
  size_t k = 0;
  uint32_t n = 0;
  for (size_t i = 0; i < d->nworkers; i++)
    n += eligible(d, d->workers[i]);
  for (size_t i = 0; i < j->nclients && k < 64; i++) {
    const client_t *c = &j->clients[i];
    if (!c->active)
      continue;
    stall[k] = c->has_ival ? c->ival_stall : c->stall_fraction;
    bps[k] = c->has_ival ? c->ival_bps : c->batches_per_second;
    s->stall_fraction += stall[k];
    s->batches_per_second += bps[k];
    k++;
  }
  if (k > 0)
    s->stall_fraction /= (double)k;
  s->workers_wanted = ferry__disp_workers_wanted(
      n, stall, bps, k, d->cfg.target_stall_fraction);
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
  s->delivered = epoch_delivered(j);
  /* Records per epoch: known row totals (unknown counts add 0). */
  if (j->started)
    for (uint32_t r = 0; r < j->nrows; r++)
      s->total += j->rows[r].total_known ? j->rows[r].total : 0;
  else
    s->total = j->ds->known_records;
  s->delivered_all = j->delivered_prev + s->delivered;
  s->error = j->error != NULL ? j->error : "";
  job_figures(d, j, s);
  if (job_skipped(j, s, a) != 0 || job_clients(d, j, s, a) != 0)
    return NULL;
  return s;
}

int ferry__disp_status(ferry_disp_t *d, const char *version,
                       Ferry__V1__GetStatusResponse *resp, ferry_arena_t *a,
                       int64_t now_ms) {
  d->now = now_ms;
  recount(d);
  resp->version = arena_strdup(a, version);
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
