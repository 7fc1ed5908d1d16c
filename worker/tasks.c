/* The task table: tasks by state (pending, parked, held by the gate),
 * the compiled-pipeline cache, cancels and drains, and the pipeline
 * threads that take tasks from it (run.c runs one). Locking: worker.h.
 */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "alloc.h"
#include "spec.h"
#include "tasks_internal.h"
#include "wmetrics.h"
#include "worker.h"

/* Compiled pipelines kept once no task uses them. */
#define PIPE_CACHE_KEEP 8
/* A task's error text, as in ferry__wtask_t. */
#define ERROR_TEXT 512

/* ---- Tasks and pipelines ------------------------------------------------- */

void ferry__wpipe_unref(ferry__wpipe_t *p) {
  __atomic_sub_fetch(&p->refs, 1, __ATOMIC_ACQ_REL);
}

static void pipe_free(ferry__wpipe_t *p) {
  ferry__wpolicy_free(p->pol);
  ferry__pipeline_free(p->pipeline);
  ferry__spec_close(&p->spec);
  ferry__free(p->spec_bytes);
  ferry__free(p);
}

/* The task no longer makes its stream active (it ended). */
void ferry__wtask_key_idle(ferry__wtask_t *k) {
  if (!k->key_active)
    return;
  pthread_mutex_lock(&k->pool->lock);
  k->key->tasks--;
  pthread_mutex_unlock(&k->pool->lock);
  k->key_active = false;
}

void ferry__wtask_unref(ferry__wtask_t *task) {
  if (atomic_fetch_sub(&task->refs, 1) != 1)
    return;
  ferry__wrun_free(task->run);
  ferry__wpool_key_put(task->pool, task->key, task->key_active);
  if (task->pipe != NULL)
    ferry__wpipe_unref(task->pipe);
  ferry__free(task->file);
  ferry__free(task);
}

/* Puts the parked tasks `match` picks back at the head of the pending
 * queue and wakes the threads; returns how many moved. Tasks lock held. */
static int requeue_parked(ferry__wtasks_t *t,
                          bool (*match)(const ferry__wtask_t *k,
                                        const void *arg),
                          const void *arg) {
  int moved = 0;
  for (ferry__wtask_t **pp = &t->parked; *pp != NULL;) {
    ferry__wtask_t *k = *pp;
    if (!match(k, arg)) {
      pp = &k->qnext;
      continue;
    }
    *pp = k->qnext;
    k->state = WT_PENDING;
    k->share_wait = NULL;
    k->qnext = t->qhead;
    t->qhead = k;
    if (t->qtail == NULL)
      t->qtail = k;
    moved++;
  }
  if (moved > 0) {
    pthread_mutex_lock(&t->pool->lock);
    t->pool->parked -= moved;
    pthread_mutex_unlock(&t->pool->lock);
    pthread_cond_broadcast(&t->cv);
  }
  return moved;
}

typedef struct {
  uint64_t job_id, client_id;
} stream_id_t;

/* Parked on the pool, or on that stream's share of it. */
static bool parked_on_stream(const ferry__wtask_t *k, const void *arg) {
  const stream_id_t *s = arg;
  return k->park_pool || (k->job_id == s->job_id &&
                          k->client_id == s->client_id);
}

/* The pool's release callback: puts the tasks parked on that stream (or
 * on the whole pool) back at the head of the pending queue. */
static void wake_parked(void *arg, uint64_t job_id, uint64_t client_id) {
  ferry__wtasks_t *t = arg;
  stream_id_t s = {job_id, client_id};
  pthread_mutex_lock(&t->lock);
  requeue_parked(t, parked_on_stream, &s);
  pthread_mutex_unlock(&t->lock);
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
  pthread_mutex_lock(&pool->lock);
  pool->on_release = wake_parked;
  pool->on_release_arg = t;
  pthread_mutex_unlock(&pool->lock);
  return 0;
}

int ferry__wtasks_set_roots(ferry__wtasks_t *t, const char *list,
                            ferry_error_t *err) {
  ferry__roots_close(&t->roots);
  int rc = ferry__roots_init(&t->roots, list, err);
  if (rc != 0)
    ferry__roots_close(&t->roots);
  return rc;
}

int ferry__wtasks_set_spill_dir(ferry__wtasks_t *t, const char *dir) {
  char *copy = NULL;
  if (dir != NULL && dir[0] != '\0' && (copy = ferry__strdup(dir)) == NULL)
    return FERRY_ENOMEM;
  ferry__free(t->spill_dir);
  t->spill_dir = copy;
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
  int rc = ferry__spec_unpack(bytes, len, &p->spec, err);
  if (rc == 0)
    rc = ferry__pipeline_new(&p->spec, &p->pipeline, err);
  if (rc != 0) {
    ferry__prefixerr(err, "task spec");
    ferry__spec_close(&p->spec);
    ferry__free(p->spec_bytes);
    ferry__free(p);
    return NULL;
  }
  if (t->cache != NULL && (p->pol = ferry__wpolicy_new(&p->spec)) == NULL) {
    ferry__pipeline_free(p->pipeline);
    ferry__spec_close(&p->spec);
    ferry__free(p->spec_bytes);
    ferry__free(p);
    ferry__seterr(err, FERRY_ENOMEM, "out of memory");
    return NULL;
  }
  p->deterministic =
      ferry__spec_det_prefix(&p->spec, NULL) == (int)p->spec.n_ops;
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
  k->pool = t->pool;
  k->key = ferry__wpool_key_get(t->pool, m->job_id, m->client_id, true);
  if (k->key == NULL) {
    pthread_mutex_unlock(&t->lock);
    ferry__free(k->file);
    ferry__free(k);
    return FERRY_ENOMEM;
  }
  k->key_active = true;
  atomic_init(&k->refs, 1);
  atomic_init(&k->cancelled, false);
  k->job_id = m->job_id;
  k->client_id = m->client_id;
  if (m->client_secret.len == FERRY_CLIENT_SECRET_BYTES) {
    memcpy(k->secret, m->client_secret.data, FERRY_CLIENT_SECRET_BYTES);
    k->has_secret = true;
  }
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
  k->end = m->end > m->start ? m->end : 0;
  k->shuffle = m->shuffle;
  k->share = m->share;
  k->seed = m->shuffle_seed;
  k->policy = m->error_policy == FERRY__V1__ERROR_POLICY__ERROR_POLICY_SKIP
                  ? FERRY_ON_ERROR_SKIP
                  : FERRY_ON_ERROR_FAIL;
  k->state = WT_PENDING;
  {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    k->added_ms = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
  }
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

int ferry__wtasks_park_share(ferry__wtasks_t *t, ferry__wtask_t *k,
                             ferry__wshare_entry_t *e, uint64_t gen) {
  pthread_mutex_lock(&t->lock);
  if (atomic_load(&k->cancelled) || atomic_load(&t->stop)) {
    pthread_mutex_unlock(&t->lock);
    return FERRY__WPARK_STOP;
  }
  pthread_mutex_lock(&t->share->mu);
  if (e->gen != gen) {
    pthread_mutex_unlock(&t->share->mu);
    pthread_mutex_unlock(&t->lock);
    return FERRY__WPARK_RETRY;
  }
  e->waiting++;
  pthread_mutex_unlock(&t->share->mu);
  pthread_mutex_lock(&t->pool->lock);
  t->pool->parked++;
  pthread_mutex_unlock(&t->pool->lock);
  k->state = WT_PARKED;
  k->park_pool = false;
  k->share_wait = e;
  k->qnext = t->parked;
  t->parked = k;
  pthread_mutex_unlock(&t->lock);
  return FERRY__WPARK_DONE;
}

static bool parked_on_entry(const ferry__wtask_t *k, const void *e) {
  return k->share_wait == e;
}

void ferry__wtasks_wake_share(ferry__wtasks_t *t, ferry__wshare_entry_t *e) {
  pthread_mutex_lock(&t->lock);
  requeue_parked(t, parked_on_entry, e);
  pthread_mutex_lock(&t->share->mu);
  e->waiting = 0;
  pthread_mutex_unlock(&t->share->mu);
  pthread_mutex_unlock(&t->lock);
}

/* Unlinks a parked task. Tasks lock held. */
static void unpark(ferry__wtasks_t *t, ferry__wtask_t *k) {
  for (ferry__wtask_t **pp = &t->parked; *pp != NULL; pp = &(*pp)->qnext)
    if (*pp == k) {
      *pp = k->qnext;
      k->qnext = NULL;
      k->state = WT_DONE;
      k->share_wait = NULL;
      pthread_mutex_lock(&t->pool->lock);
      t->pool->parked--;
      pthread_mutex_unlock(&t->pool->lock);
      return;
    }
}

/* Unlinks a held task. Tasks lock held. */
static void unhold(ferry__wtasks_t *t, ferry__wtask_t *k) {
  for (ferry__wtask_t **pp = &t->held; *pp != NULL; pp = &(*pp)->qnext)
    if (*pp == k) {
      *pp = k->qnext;
      k->qnext = NULL;
      k->state = WT_DONE;
      return;
    }
}

/* Queues the held tasks of stream `key` (NULL: of every stream) at the
 * head of the pending queue, where the gate looks at them again. Tasks
 * lock held. */
static void release_held(ferry__wtasks_t *t, const ferry__wkey_t *key) {
  bool moved = false;
  for (ferry__wtask_t **pp = &t->held; *pp != NULL;) {
    ferry__wtask_t *k = *pp;
    if (key != NULL && k->key != key) {
      pp = &k->qnext;
      continue;
    }
    *pp = k->qnext;
    k->state = WT_PENDING;
    k->qnext = t->qhead;
    t->qhead = k;
    if (t->qtail == NULL)
      t->qtail = k;
    moved = true;
  }
  if (moved)
    pthread_cond_broadcast(&t->cv);
}

/* The task's run state is gone: its stream's slot frees, and one of the
 * stream's held tasks may start. Tasks lock held. */
void ferry__wrun_slot_put(ferry__wtasks_t *t, ferry__wtask_t *k) {
  if (!k->has_run_slot)
    return;
  k->has_run_slot = false;
  k->key->runs--;
  release_held(t, k->key);
}

/* Whether the gate holds `k` back: it has no run state yet, and its
 * client has no stream open here or its stream has its share of started
 * tasks. A task that holds nothing costs nobody a thread or memory; a
 * spec that did not compile starts at once to report its error. Tasks
 * lock held; takes the run slot when it lets the task through. */
static bool gate_holds(ferry__wtasks_t *t, ferry__wtask_t *k) {
  if (k->run != NULL || k->has_run_slot || k->pipe == NULL)
    return false;
  if (t->gate && (!atomic_load(&k->key->reader) ||
                  k->key->runs >= FERRY__WKEY_MAX_RUNS))
    return true;
  k->has_run_slot = true;
  k->key->runs++;
  return false;
}

void ferry__wtasks_reader_opened(ferry__wtasks_t *t, uint64_t job_id,
                                 uint64_t client_id) {
  pthread_mutex_lock(&t->lock);
  for (ferry__wtask_t *k = t->held; k != NULL; k = k->qnext)
    if (k->job_id == job_id && k->client_id == client_id) {
      release_held(t, k->key);
      break;
    }
  pthread_mutex_unlock(&t->lock);
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
  else if (k->state == WT_PARKED)
    unpark(t, k);
  else if (k->state == WT_HELD)
    unhold(t, k);
  /* A parked task's run state goes with it: its slot frees now (a
   * running one frees its own when it stops). */
  if (k->state == WT_DONE && k->has_run_slot)
    ferry__wrun_slot_put(t, k);
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

size_t ferry__wtasks_mark_resend(ferry__wtasks_t *t, uint64_t job_id,
                                 uint64_t client_id, uint64_t gen) {
  size_t n = 0;
  pthread_mutex_lock(&t->lock);
  for (ferry__wtask_t *k = t->list; k != NULL; k = k->next)
    if (k->job_id == job_id && k->client_id == client_id &&
        !atomic_load(&k->cancelled) && atomic_load(&k->sent_gen) == gen &&
        !atomic_exchange(&k->resend, true))
      n++;
  pthread_mutex_unlock(&t->lock);
  return n;
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
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  int64_t now_ms = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
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
    p->resend = atomic_load(&k->resend);
    int64_t since = k->key != NULL ? atomic_load(&k->key->stall_since_ms) : 0;
    p->stalled_ms = since > 0 && now_ms > since ? (uint64_t)(now_ms - since)
                                                 : 0;
    /* How long its client has had no stream here: since the task came,
     * or since its client's last stream closed. */
    if (k->key != NULL && !atomic_load(&k->key->reader) && !k->finished &&
        k->error_code == 0) {
      int64_t from = atomic_load(&k->key->read_ms);
      if (from < k->added_ms)
        from = k->added_ms;
      p->unread_ms = now_ms > from ? (uint64_t)(now_ms - from) : 0;
    }
    char *text = texts + i * ERROR_TEXT;
    if (k->state == WT_DONE && k->error_code != 0) {
      p->error_code = k->error_code;
      p->worker_fault = k->worker_fault;
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

/* ---- Threads ------------------------------------------------------------- */

uint32_t ferry__wshare_epoch(const ferry__wtask_t *k) {
  /* Unshuffled, and no op drawn per epoch: every epoch's records are the
   * same, so a trainer that joined later shares too. */
  if (!k->shuffle && k->pipe != NULL && k->pipe->deterministic)
    return 0;
  return k->epoch;
}

/* Takes the next pending task: the head, except that a new task of a
 * sharing job whose split the shared-production window holds goes first
 * (it sends what another job's task produced, while the window still has
 * it, instead of waiting behind splits of its own job that would push
 * it out). Tasks lock held; the queue is not empty. */
static ferry__wtask_t *next_task(ferry__wtasks_t *t) {
  ferry__wtask_t **pp = &t->qhead, *prev = NULL;
  if (t->share != NULL)
    for (ferry__wtask_t **q = &t->qhead, *p = NULL; *q != NULL;
         p = *q, q = &(*q)->qnext) {
      ferry__wtask_t *c = *q;
      if (c->share && c->run == NULL && c->pipe != NULL &&
          ferry__wshare_has(t->share, c->pipe->id, ferry__wshare_epoch(c),
                            c->split)) {
        pp = q;
        prev = p;
        break;
      }
    }
  ferry__wtask_t *k = *pp;
  *pp = k->qnext;
  if (t->qtail == k)
    t->qtail = prev;
  k->qnext = NULL;
  return k;
}

static void *thread_main(void *arg) {
  ferry__wthread_t *th = arg;
  ferry__wtasks_t *t = th->t;
  /* Named for top(1) and the benchmarks, which count the CPU time spent
   * producing records apart from sending them. */
  pthread_setname_np(pthread_self(), "ferry-pipeline");
  for (;;) {
    pthread_mutex_lock(&t->lock);
    while (t->qhead == NULL && !atomic_load(&t->stop))
      pthread_cond_wait(&t->cv, &t->lock);
    if (atomic_load(&t->stop)) {
      pthread_mutex_unlock(&t->lock);
      break;
    }
    ferry__wtask_t *k = next_task(t);
    if (gate_holds(t, k)) {
      k->state = WT_HELD;
      k->qnext = t->held;
      t->held = k;
      pthread_mutex_unlock(&t->lock);
      continue;
    }
    k->state = WT_RUNNING;
    atomic_fetch_add(&k->refs, 1);
    pthread_mutex_unlock(&t->lock);
    ferry__wtask_step(th, k, true);
    ferry__wtask_unref(k);
  }
  return NULL;
}

int ferry__wtasks_start(ferry__wtasks_t *t, size_t n, ferry_error_t *err) {
  if (n == 0) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    n = cores > 0 ? (size_t)cores : 1;
  }
  /* Each thread decodes one image at a time: its share of the decode
   * budget bounds that image (ferry_jpeg_limits_t.max_bytes). */
  if (t->jpeg_set && t->decode_bytes > 0)
    t->jpeg.max_bytes = t->decode_bytes / n;
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
  /* nthreads stays as it was: the heartbeat thread, still running,
   * reports it. A second stop finds no threads. */
  for (size_t i = 0; t->threads != NULL && i < t->nthreads; i++) {
    pthread_join(t->threads[i], NULL);
    ferry__wthread_free(t->thread_states[i]);
  }
  ferry__free(t->threads);
  ferry__free(t->thread_states);
  t->threads = NULL;
  t->thread_states = NULL;
}

void ferry__wtasks_close(ferry__wtasks_t *t) {
  ferry__wtasks_stop(t);
  /* No release calls back into the table from here on. */
  ferry__wpool_t *p = t->pool;
  pthread_mutex_lock(&p->lock);
  p->on_release = NULL;
  while (p->in_cb > 0)
    pthread_cond_wait(&p->cv, &p->lock);
  pthread_mutex_unlock(&p->lock);
  pthread_mutex_lock(&t->lock);
  int parked = 0;
  for (ferry__wtask_t *k = t->parked; k != NULL; k = k->qnext)
    parked++;
  t->parked = NULL;
  t->held = NULL;
  pthread_mutex_unlock(&t->lock);
  pthread_mutex_lock(&p->lock);
  p->parked -= parked;
  pthread_mutex_unlock(&p->lock);
  ferry__wtask_t *k = t->list;
  t->list = t->qhead = t->qtail = NULL;
  while (k != NULL) {
    ferry__wtask_t *next = k->next;
    ferry__wtask_unref(k);
    k = next;
  }
  pipes_trim(t, 0);
  ferry__free(t->spill_dir);
  t->spill_dir = NULL;
  ferry__roots_close(&t->roots);
  pthread_cond_destroy(&t->cv);
  pthread_mutex_destroy(&t->lock);
}

