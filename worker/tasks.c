/* The task runner: the chunk pool, the task table, the pipeline cache and
 * the pipeline threads.
 *
 * A thread takes a whole task (one split) at a time. Without shuffle it
 * streams the split's records from the reader in file order; with shuffle
 * it first collects them (pointers into the mapping for uncompressed
 * files, copies into a thread-owned arena for compressed ones, whose
 * reader reuses its buffer) and walks them in the split's permutation.
 * Positions in split order count the records the pipeline produced: a
 * record the reader skipped (bad CRC) never gets one, and under policy
 * skip neither does a record the pipeline rejects, so a lease resumed
 * from `start` replays the same order and discards the first `start`
 * outputs (under policy fail no record can be rejected before `start`, so
 * those are skipped without being processed).
 *
 * Chunks hold K = max(1, chunk_bytes / record_bytes) records of one shape.
 * A full chunk is handed on only when the next record needs room, so the
 * split's final chunk is always the one marked `last`.
 */
#include <string.h>
#include <unistd.h>

#include "ferry/alloc.h"
#include "ferry/log.h"
#include "ferry/spec.h"
#include "ferry/tfrecord.h"
#include "worker.h"

/* At most this many records per chunk, whatever the record size. */
#define MAX_CHUNK_RECORDS (1u << 20)
/* Compiled pipelines kept once no task uses them. */
#define PIPE_CACHE_KEEP 8
/* Pipeline contexts per thread. */
#define CTX_SLOTS 4
/* A task's error text, as in ferry__wtask_t. */
#define ERROR_TEXT 512

/* ---- Chunk pool ---------------------------------------------------------- */

int ferry__wpool_init(ferry__wpool_t *p, uint64_t cap) {
  memset(p, 0, sizeof(*p));
  p->cap = cap;
  if (pthread_mutex_init(&p->lock, NULL) != 0)
    return FERRY_ENOMEM;
  if (pthread_cond_init(&p->cv, NULL) != 0) {
    pthread_mutex_destroy(&p->lock);
    return FERRY_ENOMEM;
  }
  return 0;
}

void ferry__wpool_close(ferry__wpool_t *p) {
  ferry__wchunk_t *c = p->free_list;
  while (c != NULL) {
    ferry__wchunk_t *next = c->next;
    ferry__aligned_free(c);
    c = next;
  }
  p->free_list = NULL;
  pthread_cond_destroy(&p->cv);
  pthread_mutex_destroy(&p->lock);
}

static bool is_set(const atomic_bool *flag) {
  return flag != NULL && atomic_load(flag);
}

ferry__wchunk_t *ferry__wpool_acquire(ferry__wpool_t *p, uint32_t cap,
                                      size_t rec_bytes,
                                      const atomic_bool *cancel_a,
                                      const atomic_bool *cancel_b,
                                      bool *oom) {
  size_t need = ferry__wchunk_block_size(cap, rec_bytes);
  ferry__wchunk_t *c = NULL;
  *oom = false;
  pthread_mutex_lock(&p->lock);
  for (;;) {
    if (is_set(cancel_a) || is_set(cancel_b)) {
      pthread_mutex_unlock(&p->lock);
      return NULL;
    }
    /* Reuse a free block that fits without wasting more than half. */
    ferry__wchunk_t **pp = &p->free_list;
    while (*pp != NULL &&
           ((*pp)->block_size < need || (*pp)->block_size > 2 * need))
      pp = &(*pp)->next;
    if (*pp != NULL) {
      c = *pp;
      *pp = c->next;
      p->cached -= c->block_size;
      p->used += c->block_size;
      pthread_mutex_unlock(&p->lock);
      return ferry__wchunk_layout(c, c->block_size, cap, rec_bytes);
    }
    if (p->used + need <= p->cap || p->used == 0) {
      /* Make room among the free blocks, which count against the cap. */
      while (p->free_list != NULL && p->used + p->cached + need > p->cap) {
        ferry__wchunk_t *f = p->free_list;
        p->free_list = f->next;
        p->cached -= f->block_size;
        ferry__aligned_free(f);
      }
      p->used += need;
      pthread_mutex_unlock(&p->lock);
      c = ferry__aligned_alloc(64, need);
      if (c == NULL) {
        pthread_mutex_lock(&p->lock);
        p->used -= need;
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->lock);
        *oom = true;
        return NULL;
      }
      c->pool = p;
      return ferry__wchunk_layout(c, need, cap, rec_bytes);
    }
    p->waits++;
    pthread_cond_wait(&p->cv, &p->lock);
  }
}

void ferry__wpool_release(ferry__wchunk_t *c) {
  ferry__wpool_t *p = c->pool;
  if (c->task != NULL) {
    ferry__wtask_unref(c->task);
    c->task = NULL;
  }
  pthread_mutex_lock(&p->lock);
  p->used -= c->block_size;
  p->cached += c->block_size;
  c->next = p->free_list;
  p->free_list = c;
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->lock);
}

void ferry__wpool_wake(ferry__wpool_t *p) {
  pthread_mutex_lock(&p->lock);
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->lock);
}

uint64_t ferry__wpool_used(ferry__wpool_t *p) {
  pthread_mutex_lock(&p->lock);
  uint64_t used = p->used;
  pthread_mutex_unlock(&p->lock);
  return used;
}

/* ---- Shuffle ------------------------------------------------------------- */

static inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void ferry__wshuffle(uint64_t *out, uint64_t n, bool shuffle, uint64_t seed,
                     uint32_t epoch, uint32_t split) {
  for (uint64_t i = 0; i < n; i++)
    out[i] = i;
  if (!shuffle || n < 2)
    return;
  uint64_t s = mix64(seed ^ mix64((uint64_t)epoch * 0x9E3779B97F4A7C15ull + 1) ^
                     mix64((uint64_t)split * 0xD1B54A32D192ED03ull + 2));
  for (uint64_t i = n - 1; i > 0; i--) {
    s += 0x9E3779B97F4A7C15ull;
    uint64_t j = mix64(s) % (i + 1);
    uint64_t tmp = out[i];
    out[i] = out[j];
    out[j] = tmp;
  }
}

/* ---- Tasks and pipelines ------------------------------------------------- */

static void pipe_unref(ferry__wpipe_t *p) {
  __atomic_sub_fetch(&p->refs, 1, __ATOMIC_ACQ_REL);
}

static void pipe_free(ferry__wpipe_t *p) {
  ferry_pipeline_free(p->pipeline);
  ferry_spec_close(&p->spec);
  ferry__free(p->spec_bytes);
  ferry__free(p);
}

void ferry__wtask_unref(ferry__wtask_t *task) {
  if (atomic_fetch_sub(&task->refs, 1) != 1)
    return;
  if (task->pipe != NULL)
    pipe_unref(task->pipe);
  ferry__free(task->file);
  ferry__free(task);
}

int ferry__wtasks_init(ferry__wtasks_t *t, ferry__wpool_t *pool,
                       uint64_t chunk_bytes, ferry__wemit_cb emit,
                       void *emit_arg) {
  memset(t, 0, sizeof(*t));
  if (pthread_mutex_init(&t->lock, NULL) != 0)
    return FERRY_ENOMEM;
  if (pthread_cond_init(&t->cv, NULL) != 0) {
    pthread_mutex_destroy(&t->lock);
    return FERRY_ENOMEM;
  }
  atomic_init(&t->stop, false);
  t->pool = pool;
  t->chunk_bytes = chunk_bytes > 0 ? chunk_bytes : 1;
  t->emit = emit;
  t->emit_arg = emit_arg;
  t->next_pipe_id = 1;
  return 0;
}

/* Frees pipelines nobody uses beyond the ones kept. Tasks lock held. */
static void pipes_trim(ferry__wtasks_t *t, size_t keep) {
  size_t n = 0;
  for (ferry__wpipe_t **pp = &t->pipes; *pp != NULL;) {
    ferry__wpipe_t *p = *pp;
    if (__atomic_load_n(&p->refs, __ATOMIC_ACQUIRE) == 0 && ++n > keep) {
      *pp = p->next;
      pipe_free(p);
    } else {
      pp = &p->next;
    }
  }
}

/* Finds or compiles the pipeline for `bytes`. Tasks lock held. On failure
 * returns NULL with `err` set. */
static ferry__wpipe_t *pipe_get(ferry__wtasks_t *t, const uint8_t *bytes,
                                size_t len, ferry_error_t *err) {
  for (ferry__wpipe_t *p = t->pipes; p != NULL; p = p->next)
    if (p->spec_len == len && memcmp(p->spec_bytes, bytes, len) == 0) {
      __atomic_add_fetch(&p->refs, 1, __ATOMIC_ACQ_REL);
      return p;
    }
  ferry__wpipe_t *p = ferry__calloc(1, sizeof(*p));
  if (p == NULL || (p->spec_bytes = ferry__malloc(len + 1)) == NULL) {
    ferry__free(p);
    ferry__seterr(err, FERRY_ENOMEM, "out of memory");
    return NULL;
  }
  memcpy(p->spec_bytes, bytes, len);
  p->spec_len = len;
  int rc = ferry_spec_unpack(bytes, len, &p->spec, err);
  if (rc == 0)
    rc = ferry_pipeline_new(&p->spec, &p->pipeline, err);
  if (rc != 0) {
    ferry__prefixerr(err, "task spec");
    ferry_spec_close(&p->spec);
    ferry__free(p->spec_bytes);
    ferry__free(p);
    return NULL;
  }
  p->id = t->next_pipe_id++;
  p->refs = 1;
  p->next = t->pipes;
  t->pipes = p;
  pipes_trim(t, PIPE_CACHE_KEEP);
  return p;
}

static ferry__wtask_t *find_task(ferry__wtasks_t *t, uint64_t job_id,
                                 uint32_t epoch, uint32_t split,
                                 uint64_t lease, ferry__wtask_t ***link) {
  for (ferry__wtask_t **pp = &t->list; *pp != NULL; pp = &(*pp)->next) {
    ferry__wtask_t *k = *pp;
    if (k->job_id == job_id && k->epoch == epoch && k->split == split &&
        k->lease == lease) {
      if (link != NULL)
        *link = pp;
      return k;
    }
  }
  return NULL;
}

int ferry__wtasks_add(ferry__wtasks_t *t, const Ferry__V1__Task *m) {
  ferry_error_t err;
  const Ferry__V1__Split *sp = m->split;
  ferry_error_clear(&err);
  pthread_mutex_lock(&t->lock);
  if (t->draining || atomic_load(&t->stop) ||
      find_task(t, m->job_id, m->epoch, sp != NULL ? sp->index : 0, m->lease,
                NULL) != NULL) {
    pthread_mutex_unlock(&t->lock);
    return 0;
  }
  ferry__wtask_t *k = ferry__calloc(1, sizeof(*k));
  if (k == NULL ||
      (k->file = ferry__strdup(m->file != NULL ? m->file : "")) == NULL) {
    pthread_mutex_unlock(&t->lock);
    ferry__free(k);
    return FERRY_ENOMEM;
  }
  atomic_init(&k->refs, 1);
  atomic_init(&k->cancelled, false);
  k->job_id = m->job_id;
  k->client_id = m->client_id;
  k->lease = m->lease;
  k->epoch = m->epoch;
  if (sp != NULL) {
    k->split = sp->index;
    k->file_index = sp->file_index;
    k->byte_offset = sp->byte_offset;
    k->first_record = sp->first_record;
    k->num_records = sp->num_records;
    k->byte_end = sp->byte_end;
  }
  k->start = m->start;
  k->shuffle = m->shuffle;
  k->seed = m->shuffle_seed;
  k->policy = m->error_policy == FERRY__V1__ERROR_POLICY__ERROR_POLICY_SKIP
                  ? FERRY_ON_ERROR_SKIP
                  : FERRY_ON_ERROR_FAIL;
  k->state = WT_PENDING;
  if (sp == NULL) {
    ferry__seterr(&err, FERRY_EINVAL, "task without a split");
  } else {
    k->pipe = pipe_get(t, m->spec.data, m->spec.len, &err);
  }
  if (k->pipe == NULL) {
    /* The thread that takes the task sends the error on the stream. */
    k->error_code = err.code != 0 ? err.code : FERRY_ESPEC;
    snprintf(k->error, sizeof(k->error), "%s", err.msg);
  }
  k->next = t->list;
  t->list = k;
  if (t->qtail != NULL)
    t->qtail->qnext = k;
  else
    t->qhead = k;
  t->qtail = k;
  pthread_cond_signal(&t->cv);
  pthread_mutex_unlock(&t->lock);
  return 1;
}

/* Unlinks `k` from the pending queue if it is there. Tasks lock held. */
static void dequeue(ferry__wtasks_t *t, ferry__wtask_t *k) {
  ferry__wtask_t *prev = NULL;
  for (ferry__wtask_t *q = t->qhead; q != NULL; prev = q, q = q->qnext) {
    if (q != k)
      continue;
    if (prev != NULL)
      prev->qnext = q->qnext;
    else
      t->qhead = q->qnext;
    if (t->qtail == q)
      t->qtail = prev;
    q->qnext = NULL;
    return;
  }
}

bool ferry__wtasks_cancel(ferry__wtasks_t *t, uint64_t job_id,
                          uint32_t epoch, uint32_t split, uint64_t lease) {
  ferry__wtask_t **link;
  pthread_mutex_lock(&t->lock);
  ferry__wtask_t *k = find_task(t, job_id, epoch, split, lease, &link);
  if (k == NULL) {
    pthread_mutex_unlock(&t->lock);
    return false;
  }
  *link = k->next;
  k->next = NULL;
  if (k->state == WT_PENDING)
    dequeue(t, k);
  atomic_store(&k->cancelled, true);
  pthread_mutex_unlock(&t->lock);
  /* A thread blocked on the pool rechecks its task's flag. */
  ferry__wpool_wake(t->pool);
  ferry__wtask_unref(k);
  return true;
}

void ferry__wtasks_drain(ferry__wtasks_t *t) {
  pthread_mutex_lock(&t->lock);
  t->draining = true;
  pthread_mutex_unlock(&t->lock);
}

bool ferry__wtasks_progress(ferry__wtasks_t *t, uint64_t job_id,
                            uint32_t epoch, uint32_t split, uint64_t lease,
                            ferry__wprogress_t *out) {
  pthread_mutex_lock(&t->lock);
  ferry__wtask_t *k = find_task(t, job_id, epoch, split, lease, NULL);
  if (k != NULL) {
    out->state = k->state;
    out->produced = k->produced;
    out->skipped = k->skipped;
    out->finished = k->finished;
    out->error_code = k->error_code;
    memcpy(out->error, k->error, sizeof(out->error));
  }
  pthread_mutex_unlock(&t->lock);
  return k != NULL;
}

int ferry__wtasks_report(ferry__wtasks_t *t,
                         Ferry__V1__WorkerHeartbeatRequest *req, void **mem) {
  size_t n = 0;
  *mem = NULL;
  req->n_tasks = 0;
  req->tasks = NULL;
  pthread_mutex_lock(&t->lock);
  for (ferry__wtask_t *k = t->list; k != NULL; k = k->next)
    n++;
  if (n == 0) {
    pthread_mutex_unlock(&t->lock);
    return 0;
  }
  size_t each = sizeof(Ferry__V1__TaskProgress *) +
                sizeof(Ferry__V1__TaskProgress) + ERROR_TEXT;
  uint8_t *block = ferry__malloc(n * each);
  if (block == NULL) {
    pthread_mutex_unlock(&t->lock);
    return FERRY_ENOMEM;
  }
  Ferry__V1__TaskProgress **ptrs = (Ferry__V1__TaskProgress **)block;
  Ferry__V1__TaskProgress *tp = (Ferry__V1__TaskProgress *)(ptrs + n);
  char *texts = (char *)(tp + n);
  size_t i = 0;
  for (ferry__wtask_t *k = t->list; k != NULL; k = k->next, i++) {
    Ferry__V1__TaskProgress *p = &tp[i];
    ferry__v1__task_progress__init(p);
    p->job_id = k->job_id;
    p->epoch = k->epoch;
    p->split = k->split;
    p->lease = k->lease;
    p->produced = k->produced;
    p->finished = k->finished;
    p->skipped = k->skipped;
    char *text = texts + i * ERROR_TEXT;
    if (k->state == WT_DONE && k->error_code != 0) {
      p->error_code = k->error_code;
      memcpy(text, k->error, ERROR_TEXT);
      p->error = text;
    }
    ptrs[i] = p;
  }
  pthread_mutex_unlock(&t->lock);
  req->n_tasks = n;
  req->tasks = ptrs;
  *mem = block;
  return 0;
}

/* ---- One thread's state -------------------------------------------------- */

struct ctx_slot {
  ferry__wpipe_t *pipe; /* holds a reference; NULL: empty slot */
  uint64_t pipe_id;
  ferry_pipeline_ctx_t *ctx;
  uint64_t used; /* LRU tick */
};

/* A collected record of a shuffled split. */
struct rec_ref {
  const uint8_t *data; /* NULL while `arena_off` is meant */
  size_t arena_off;
  size_t len;
  uint64_t offset, index;
};

struct ferry__wthread_s {
  ferry__wtasks_t *t;
  pthread_t tid;
  struct ctx_slot slots[CTX_SLOTS];
  uint64_t tick;
  struct rec_ref *recs;
  size_t recs_cap;
  uint64_t *order;
  size_t order_cap;
  uint8_t *arena;
  size_t arena_cap;
};

ferry__wthread_t *ferry__wthread_new(ferry__wtasks_t *t) {
  ferry__wthread_t *th = ferry__calloc(1, sizeof(*th));
  if (th != NULL)
    th->t = t;
  return th;
}

void ferry__wthread_free(ferry__wthread_t *th) {
  if (th == NULL)
    return;
  for (int i = 0; i < CTX_SLOTS; i++)
    if (th->slots[i].pipe != NULL) {
      ferry_pipeline_ctx_free(th->slots[i].ctx);
      pipe_unref(th->slots[i].pipe);
    }
  ferry__free(th->recs);
  ferry__free(th->order);
  ferry__free(th->arena);
  ferry__free(th);
}

/* The thread's ctx for `pipe`, created (evicting the least recently used
 * one) when missing. */
static ferry_pipeline_ctx_t *get_ctx(ferry__wthread_t *th,
                                     ferry__wpipe_t *pipe,
                                     ferry_error_t *err) {
  struct ctx_slot *victim = &th->slots[0];
  th->tick++;
  for (int i = 0; i < CTX_SLOTS; i++) {
    struct ctx_slot *s = &th->slots[i];
    if (s->pipe != NULL && s->pipe_id == pipe->id) {
      s->used = th->tick;
      return s->ctx;
    }
    if (s->pipe == NULL || (victim->pipe != NULL && s->used < victim->used))
      victim = s;
  }
  ferry_pipeline_ctx_t *ctx;
  if (ferry_pipeline_ctx_new(pipe->pipeline, &ctx, err) != 0)
    return NULL;
  if (victim->pipe != NULL) {
    ferry_pipeline_ctx_free(victim->ctx);
    pipe_unref(victim->pipe);
  }
  __atomic_add_fetch(&pipe->refs, 1, __ATOMIC_ACQ_REL);
  victim->pipe = pipe;
  victim->pipe_id = pipe->id;
  victim->ctx = ctx;
  victim->used = th->tick;
  return ctx;
}

static bool grow(void **p, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap)
    return true;
  size_t n = *cap > 0 ? *cap : 256;
  while (n < need)
    n *= 2;
  void *q = ferry__realloc(*p, n * elem);
  if (q == NULL)
    return false;
  *p = q;
  *cap = n;
  return true;
}

/* ---- Running a task ------------------------------------------------------ */

typedef struct run_s {
  ferry__wthread_t *th;
  ferry__wtask_t *task;
  ferry_pipeline_ctx_t *ctx;
  ferry__wchunk_t *cur; /* the chunk being filled */
  uint64_t out;         /* positions done (from 0) */
  uint64_t skipped;     /* pipeline rejects at positions >= start */
  bool stopped;         /* cancelled, or the worker stops */
  int err_code;
  ferry_error_t err;
} run_t;

static bool should_stop(run_t *r) {
  if (atomic_load(&r->task->cancelled) || atomic_load(&r->th->t->stop))
    r->stopped = true;
  return r->stopped;
}

/* Hands the current chunk on. */
static int flush(run_t *r, bool last) {
  ferry__wchunk_t *c = r->cur;
  ferry__wtasks_t *t = r->th->t;
  r->cur = NULL;
  c->last = last;
  int rc = ferry__wchunk_encode(c);
  if (rc != 0) {
    ferry__wpool_release(c);
    return ferry__seterr(&r->err, rc, "%s: chunk header too large",
                         r->task->file);
  }
  pthread_mutex_lock(&t->lock);
  r->task->produced = c->first + c->count;
  r->task->skipped = r->skipped;
  pthread_mutex_unlock(&t->lock);
  t->emit(c, t->emit_arg);
  return 0;
}

/* A fresh chunk for `cap` records; NULL when stopped or out of memory
 * (r->err set). */
static ferry__wchunk_t *new_chunk(run_t *r, uint32_t cap, int h, int w,
                                  int ch) {
  ferry__wtasks_t *t = r->th->t;
  ferry__wtask_t *k = r->task;
  bool oom;
  size_t rb = (size_t)h * (size_t)w * (size_t)ch;
  ferry__wchunk_t *c =
      ferry__wpool_acquire(t->pool, cap, rb, &k->cancelled, &t->stop, &oom);
  if (c == NULL) {
    if (oom)
      ferry__seterr(&r->err, FERRY_ENOMEM, "out of memory for a chunk");
    else
      r->stopped = true;
    return NULL;
  }
  atomic_fetch_add(&k->refs, 1);
  c->task = k;
  c->job_id = k->job_id;
  c->client_id = k->client_id;
  c->lease = k->lease;
  c->epoch = k->epoch;
  c->split = k->split;
  c->first = r->out;
  c->h = h;
  c->w = w;
  c->c = ch;
  return c;
}

/* Runs one record; returns false when the task ends here (stopped or
 * failed). */
static bool do_record(run_t *r, const uint8_t *data, size_t len,
                      uint64_t offset, uint64_t index) {
  ferry__wtask_t *k = r->task;
  const uint8_t *pix;
  int h, w, c;
  int64_t label;
  if (should_stop(r))
    return false;
  if (r->out < k->start && k->policy == FERRY_ON_ERROR_FAIL) {
    r->out++;
    return true;
  }
  ferry_error_t perr;
  int rc = ferry_pipeline_process(r->ctx, data, len, &pix, &h, &w, &c,
                                  &label, &perr);
  if (rc != 0) {
    if (k->policy == FERRY_ON_ERROR_SKIP) {
      if (r->out >= k->start)
        r->skipped++;
      FERRY_LOG(FERRY_LOG_DEBUG, "%s: record %llu at byte offset %llu: %s "
                "(skipped)", k->file, (unsigned long long)index,
                (unsigned long long)offset, perr.msg);
      return true;
    }
    r->err = perr;
    ferry__prefixerr(&r->err, "%s: record %llu at byte offset %llu", k->file,
                     (unsigned long long)index, (unsigned long long)offset);
    return false;
  }
  if (r->out < k->start) {
    r->out++;
    return true;
  }
  size_t rb = (size_t)h * (size_t)w * (size_t)c;
  ferry__wchunk_t *cur = r->cur;
  if (cur != NULL && (cur->count == cur->cap || cur->h != h || cur->w != w ||
                      cur->c != c)) {
    if (flush(r, false) != 0)
      return false;
    cur = NULL;
  }
  if (cur == NULL) {
    uint64_t kk = rb > 0 ? r->th->t->chunk_bytes / rb : MAX_CHUNK_RECORDS;
    if (kk < 1)
      kk = 1;
    if (kk > MAX_CHUNK_RECORDS)
      kk = MAX_CHUNK_RECORDS;
    cur = r->cur = new_chunk(r, (uint32_t)kk, h, w, c);
    if (cur == NULL)
      return false;
  }
  memcpy(cur->payload + (size_t)cur->count * rb, pix, rb);
  cur->labels[cur->count] = label;
  cur->ids[cur->count] = (int64_t)((uint64_t)k->file_index << 40 | index);
  cur->count++;
  r->out++;
  return true;
}

/* Streams the split in file order. Returns the reader's result. */
static int run_identity(run_t *r, ferry_tfr_reader_t *rd) {
  ferry__wtask_t *k = r->task;
  ferry_record_t rec;
  int rc;
  while ((rc = ferry_tfr_reader_next(rd, &rec, &r->err)) == 0) {
    if (k->byte_end != 0 && rec.offset >= k->byte_end)
      return FERRY_EOF;
    if (!do_record(r, rec.data, rec.len, rec.offset, rec.index))
      return 0;
  }
  return rc;
}

/* Collects the split, then walks its permutation. */
static int run_shuffled(run_t *r, ferry_tfr_reader_t *rd) {
  ferry__wthread_t *th = r->th;
  ferry__wtask_t *k = r->task;
  bool copy = ferry_tfr_reader_compression(rd) != FERRY_COMPRESSION_NONE;
  size_t n = 0, arena_len = 0;
  ferry_record_t rec;
  int rc;
  while ((rc = ferry_tfr_reader_next(rd, &rec, &r->err)) == 0) {
    if (k->byte_end != 0 && rec.offset >= k->byte_end)
      break;
    if ((n & 1023) == 0 && should_stop(r))
      return 0;
    if (!grow((void **)&th->recs, &th->recs_cap, n + 1, sizeof(*th->recs)))
      return ferry__seterr(&r->err, FERRY_ENOMEM, "out of memory");
    struct rec_ref *ref = &th->recs[n++];
    ref->len = rec.len;
    ref->offset = rec.offset;
    ref->index = rec.index;
    ref->data = rec.data;
    if (copy) {
      if (!grow((void **)&th->arena, &th->arena_cap, arena_len + rec.len, 1))
        return ferry__seterr(&r->err, FERRY_ENOMEM, "out of memory");
      memcpy(th->arena + arena_len, rec.data, rec.len);
      ref->data = NULL;
      ref->arena_off = arena_len;
      arena_len += rec.len;
    }
  }
  if (rc != 0 && rc != FERRY_EOF)
    return rc;
  if (!grow((void **)&th->order, &th->order_cap, n, sizeof(*th->order)))
    return ferry__seterr(&r->err, FERRY_ENOMEM, "out of memory");
  ferry__wshuffle(th->order, n, k->shuffle, k->seed, k->epoch, k->split);
  for (size_t i = 0; i < n; i++) {
    const struct rec_ref *ref = &th->recs[th->order[i]];
    const uint8_t *data = ref->data != NULL ? ref->data
                                            : th->arena + ref->arena_off;
    if (!do_record(r, data, ref->len, ref->offset, ref->index))
      return 0;
  }
  return FERRY_EOF;
}

/* Sends an error chunk and records the error on the task. */
static void fail(run_t *r, int code) {
  ferry__wtask_t *k = r->task;
  ferry__wtasks_t *t = r->th->t;
  if (r->cur != NULL)
    flush(r, false);
  if (!should_stop(r)) {
    ferry__wchunk_t *c = new_chunk(r, 0, 0, 0, 0);
    if (c != NULL) {
      c->error_code = code;
      snprintf(c->error, 512, "%s", r->err.msg);
      r->cur = c;
      flush(r, false);
    }
  }
  FERRY_LOG(FERRY_LOG_WARN, "task job %llu split %u: %s",
            (unsigned long long)k->job_id, k->split, r->err.msg);
  pthread_mutex_lock(&t->lock);
  k->error_code = code;
  snprintf(k->error, sizeof(k->error), "%s", r->err.msg);
  pthread_mutex_unlock(&t->lock);
}

void ferry__wthread_run_task(ferry__wthread_t *th, ferry__wtask_t *k) {
  ferry__wtasks_t *t = th->t;
  run_t r;
  memset(&r, 0, sizeof(r));
  r.th = th;
  r.task = k;
  ferry_error_clear(&r.err);

  ferry_tfr_reader_t *rd = NULL;
  int rc = 0;
  if (k->pipe == NULL) {
    ferry__seterr(&r.err, k->error_code, "%s", k->error);
    rc = k->error_code;
  } else if ((r.ctx = get_ctx(th, k->pipe, &r.err)) == NULL) {
    rc = r.err.code != 0 ? r.err.code : FERRY_ENOMEM;
  } else {
    ferry_tfr_options_t o;
    ferry_tfr_options_init(&o);
    o.compression = k->pipe->spec.compression;
    o.on_error = (ferry_error_policy_t)k->policy;
    o.start_offset = k->byte_offset;
    o.start_index = k->first_record;
    o.max_records = k->num_records;
    rc = ferry_tfr_reader_open(k->file, &o, &rd, &r.err);
    if (rc == 0) {
      rc = k->shuffle ? run_shuffled(&r, rd) : run_identity(&r, rd);
      if (rc == FERRY_EOF)
        rc = 0;
      else if (rc == 0 && r.err.code != 0 && !r.stopped)
        rc = r.err.code; /* a pipeline error under policy fail */
    }
  }
  if (rc == 0 && !r.stopped && r.err.code == 0) {
    /* The split is complete: its final chunk carries `last` (an empty
     * one when nothing was left to produce). */
    ferry_tfr_stats_t st;
    ferry_tfr_reader_stats(rd, &st);
    if (k->start == 0)
      r.skipped += st.skipped;
    if (r.cur == NULL) {
      int h = 0, w = 0, c = 0;
      if (ferry_pipeline_shape(k->pipe->pipeline, &h, &w, &c) != 0)
        h = w = c = 0;
      r.cur = new_chunk(&r, 0, h, w, c);
    }
    if (r.cur != NULL && flush(&r, true) == 0) {
      pthread_mutex_lock(&t->lock);
      k->finished = true;
      k->produced = r.out;
      k->skipped = r.skipped;
      pthread_mutex_unlock(&t->lock);
    } else if (r.err.code != 0) {
      fail(&r, r.err.code);
    }
  } else if (!r.stopped) {
    if (rc == 0)
      rc = r.err.code;
    fail(&r, rc);
  }
  if (r.cur != NULL) /* stopped mid-chunk: the task's chunks are moot */
    ferry__wpool_release(r.cur);
  ferry_tfr_reader_free(rd);
  pthread_mutex_lock(&t->lock);
  k->state = WT_DONE;
  bool news = k->error_code != 0 || k->skipped > 0 ||
              (k->finished &&
               (k->num_records == 0 || k->produced != k->num_records));
  pthread_mutex_unlock(&t->lock);
  if (t->on_end != NULL)
    t->on_end(t->end_arg, news);
}

/* ---- Threads ------------------------------------------------------------- */

static void *thread_main(void *arg) {
  ferry__wthread_t *th = arg;
  ferry__wtasks_t *t = th->t;
  for (;;) {
    pthread_mutex_lock(&t->lock);
    while (t->qhead == NULL && !atomic_load(&t->stop))
      pthread_cond_wait(&t->cv, &t->lock);
    if (atomic_load(&t->stop)) {
      pthread_mutex_unlock(&t->lock);
      break;
    }
    ferry__wtask_t *k = t->qhead;
    t->qhead = k->qnext;
    if (t->qhead == NULL)
      t->qtail = NULL;
    k->qnext = NULL;
    k->state = WT_RUNNING;
    atomic_fetch_add(&k->refs, 1);
    pthread_mutex_unlock(&t->lock);
    ferry__wthread_run_task(th, k);
    ferry__wtask_unref(k);
  }
  return NULL;
}

int ferry__wtasks_start(ferry__wtasks_t *t, size_t n, ferry_error_t *err) {
  if (n == 0) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    n = cores > 0 ? (size_t)cores : 1;
  }
  t->threads = ferry__calloc(n, sizeof(*t->threads));
  ferry__wthread_t **ths = ferry__calloc(n, sizeof(*ths));
  if (t->threads == NULL || ths == NULL) {
    ferry__free(ths);
    return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
  }
  t->thread_states = ths;
  for (size_t i = 0; i < n; i++) {
    ths[i] = ferry__wthread_new(t);
    if (ths[i] == NULL ||
        pthread_create(&t->threads[i], NULL, thread_main, ths[i]) != 0) {
      ferry__wthread_free(ths[i]);
      ths[i] = NULL;
      return ferry__seterr(err, FERRY_EIO,
                           "cannot start pipeline thread %zu", i);
    }
    t->nthreads++;
  }
  return 0;
}

void ferry__wtasks_stop(ferry__wtasks_t *t) {
  pthread_mutex_lock(&t->lock);
  atomic_store(&t->stop, true);
  t->draining = true;
  for (ferry__wtask_t *k = t->list; k != NULL; k = k->next)
    atomic_store(&k->cancelled, true);
  pthread_cond_broadcast(&t->cv);
  pthread_mutex_unlock(&t->lock);
  ferry__wpool_wake(t->pool);
  for (size_t i = 0; i < t->nthreads; i++) {
    pthread_join(t->threads[i], NULL);
    ferry__wthread_free(t->thread_states[i]);
  }
  t->nthreads = 0;
  ferry__free(t->threads);
  ferry__free(t->thread_states);
  t->threads = NULL;
  t->thread_states = NULL;
}

void ferry__wtasks_close(ferry__wtasks_t *t) {
  ferry__wtasks_stop(t);
  ferry__wtask_t *k = t->list;
  t->list = t->qhead = t->qtail = NULL;
  while (k != NULL) {
    ferry__wtask_t *next = k->next;
    ferry__wtask_unref(k);
    k = next;
  }
  pipes_trim(t, 0);
  pthread_cond_destroy(&t->cv);
  pthread_mutex_destroy(&t->lock);
}
