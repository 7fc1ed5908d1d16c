/* The chunk pool: a byte budget shared by every stream of the worker,
 * with a fair share per stream key (job, client) and the parking of
 * tasks at their share; chunks are released from any thread (the
 * transports' completion). Locking: worker.h ("Threads and locks").
 */
#include <string.h>

#include "alloc.h"
#include "worker.h"

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
  while (p->keys != NULL) { /* only when a test left references behind */
    ferry__wkey_t *k = p->keys;
    p->keys = k->next;
    ferry__free(k);
  }
  pthread_cond_destroy(&p->cv);
  pthread_mutex_destroy(&p->lock);
}

static bool is_set(const atomic_bool *flag) {
  return flag != NULL && atomic_load(flag);
}

ferry__wkey_t *ferry__wpool_key_get(ferry__wpool_t *p, uint64_t job_id,
                                    uint64_t client_id, bool task) {
  pthread_mutex_lock(&p->lock);
  ferry__wkey_t *k = p->keys;
  while (k != NULL && (k->job_id != job_id || k->client_id != client_id))
    k = k->next;
  if (k == NULL && (k = ferry__calloc(1, sizeof(*k))) != NULL) {
    k->job_id = job_id;
    k->client_id = client_id;
    atomic_init(&k->stall_since_ms, 0);
    atomic_init(&k->reader, false);
    atomic_init(&k->read_ms, 0);
    k->next = p->keys;
    p->keys = k;
  }
  if (k != NULL) {
    k->refs++;
    if (task)
      k->tasks++;
  }
  pthread_mutex_unlock(&p->lock);
  return k;
}

/* Drops a reference; pool lock held. */
static void key_put_locked(ferry__wpool_t *p, ferry__wkey_t *k, bool task) {
  if (task)
    k->tasks--;
  if (--k->refs > 0)
    return;
  for (ferry__wkey_t **pp = &p->keys; *pp != NULL; pp = &(*pp)->next)
    if (*pp == k) {
      *pp = k->next;
      break;
    }
  ferry__free(k);
}

void ferry__wpool_key_put(ferry__wpool_t *p, ferry__wkey_t *k, bool task) {
  if (k == NULL)
    return;
  pthread_mutex_lock(&p->lock);
  key_put_locked(p, k, task);
  pthread_mutex_unlock(&p->lock);
}

/* The share of `k` for a block of `need` bytes: the cap divided by one
 * more than the active streams (with live tasks or chunks out, `k`
 * included), at least two blocks. The one share kept free is what a
 * stream that becomes active finds while the others hold theirs: shares
 * are computed at acquire time, and a stalled stream keeps what it took
 * when there were fewer streams. Pool lock held. */
static uint64_t share_of(ferry__wpool_t *p, const ferry__wkey_t *k,
                         size_t need) {
  uint64_t n = 0;
  bool self = false;
  for (const ferry__wkey_t *q = p->keys; q != NULL; q = q->next)
    if (q->tasks > 0 || q->used > 0) {
      n++;
      self |= q == k;
    }
  if (!self)
    n++;
  uint64_t share = p->cap / (n + 1), floor = 2 * (uint64_t)need;
  return share > floor ? share : floor;
}

uint64_t ferry__wpool_share(ferry__wpool_t *p, ferry__wkey_t *k, size_t need) {
  pthread_mutex_lock(&p->lock);
  uint64_t s = share_of(p, k, need);
  pthread_mutex_unlock(&p->lock);
  return s;
}

int ferry__wpool_key_tasks(ferry__wpool_t *p, ferry__wkey_t *k) {
  pthread_mutex_lock(&p->lock);
  int n = k->tasks;
  pthread_mutex_unlock(&p->lock);
  return n;
}

enum { TAKE_OK, TAKE_FULL_KEY, TAKE_FULL_POOL };

/* Reserves `need` bytes for `key` (may be NULL: no share). On TAKE_OK,
 * *reuse is a free block to lay out, or NULL: allocate `need` bytes.
 * Pool lock held. */
static int take(ferry__wpool_t *p, ferry__wkey_t *key, size_t need, bool tiny,
                ferry__wchunk_t **reuse) {
  *reuse = NULL;
  if (key != NULL && !tiny && key->used > 0 &&
      key->used + need > share_of(p, key, need))
    return TAKE_FULL_KEY;
  /* Reuse a free block that fits without wasting more than half. */
  ferry__wchunk_t **pp = &p->free_list;
  while (*pp != NULL &&
         ((*pp)->block_size < need || (*pp)->block_size > 2 * need))
    pp = &(*pp)->next;
  if (*pp != NULL) {
    ferry__wchunk_t *c = *pp;
    *pp = c->next;
    p->cached -= c->block_size;
    p->used += c->block_size;
    if (key != NULL)
      key->used += c->block_size;
    *reuse = c;
    return TAKE_OK;
  }
  if (!(p->used + need <= p->cap || p->used == 0 || tiny))
    return TAKE_FULL_POOL;
  /* Make room among the free blocks, which count against the cap. */
  while (p->free_list != NULL && p->used + p->cached + need > p->cap) {
    ferry__wchunk_t *f = p->free_list;
    p->free_list = f->next;
    p->cached -= f->block_size;
    ferry__aligned_free(f);
  }
  p->used += need;
  if (key != NULL)
    key->used += need;
  return TAKE_OK;
}

/* After TAKE_OK, pool lock released: the chunk, or NULL (*oom). */
static ferry__wchunk_t *finish_take(ferry__wpool_t *p, ferry__wkey_t *key,
                                    ferry__wchunk_t *reuse, size_t need,
                                    uint32_t cap, size_t rec_bytes,
                                    bool *oom) {
  ferry__wchunk_t *c = reuse;
  size_t size = reuse != NULL ? reuse->block_size : need;
  if (c == NULL) {
    c = ferry__aligned_alloc(64, need);
    if (c == NULL) {
      pthread_mutex_lock(&p->lock);
      p->used -= need;
      if (key != NULL) {
        key->used -= need;
        key_put_locked(p, key, false);
      }
      pthread_cond_broadcast(&p->cv);
      pthread_mutex_unlock(&p->lock);
      *oom = true;
      return NULL;
    }
    c->pool = p;
  }
  c = ferry__wchunk_layout(c, size, cap, rec_bytes);
  c->key = key;
  return c;
}

ferry__wchunk_t *ferry__wpool_acquire_key(ferry__wpool_t *p,
                                          ferry__wkey_t *key, uint32_t cap,
                                          size_t rec_bytes, bool wait,
                                          const atomic_bool *cancel_a,
                                          const atomic_bool *cancel_b,
                                          uint64_t *gen, bool *key_full,
                                          bool *oom) {
  size_t need = ferry__wchunk_block_size(cap, rec_bytes);
  ferry__wchunk_t *reuse;
  *oom = false;
  pthread_mutex_lock(&p->lock);
  for (;;) {
    if (is_set(cancel_a) || is_set(cancel_b))
      break;
    int why = take(p, key, need, cap == 0, &reuse);
    if (why == TAKE_OK) {
      if (key != NULL)
        key->refs++; /* the chunk's */
      pthread_mutex_unlock(&p->lock);
      return finish_take(p, key, reuse, need, cap, rec_bytes, oom);
    }
    p->waits++;
    if (gen != NULL)
      *gen = p->gen;
    if (key_full != NULL)
      *key_full = why == TAKE_FULL_KEY;
    if (!wait)
      break;
    pthread_cond_wait(&p->cv, &p->lock);
  }
  pthread_mutex_unlock(&p->lock);
  return NULL;
}

ferry__wchunk_t *ferry__wpool_acquire(ferry__wpool_t *p, uint32_t cap,
                                      size_t rec_bytes,
                                      const atomic_bool *cancel_a,
                                      const atomic_bool *cancel_b,
                                      bool *oom) {
  return ferry__wpool_acquire_key(p, NULL, cap, rec_bytes, true, cancel_a,
                                  cancel_b, NULL, NULL, oom);
}

void ferry__wpool_release(ferry__wchunk_t *c) {
  ferry__wpool_t *p = c->pool;
  ferry__wkey_t *key = c->key;
  if (c->view_release != NULL) {
    c->view_release(c->view_arg);
    c->view_release = NULL;
  }
  uint64_t job_id = key != NULL ? key->job_id : 0;
  uint64_t client_id = key != NULL ? key->client_id : 0;
  if (c->task != NULL) {
    ferry__wtask_unref(c->task);
    c->task = NULL;
  }
  pthread_mutex_lock(&p->lock);
  p->used -= c->block_size;
  p->cached += c->block_size;
  if (key != NULL) {
    key->used -= c->block_size;
    key_put_locked(p, key, false);
    c->key = NULL;
  }
  c->next = p->free_list;
  p->free_list = c;
  p->gen++;
  void (*cb)(void *, uint64_t, uint64_t) =
      p->parked > 0 ? p->on_release : NULL;
  void *cb_arg = p->on_release_arg;
  if (cb != NULL)
    p->in_cb++;
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->lock);
  if (cb != NULL) {
    cb(cb_arg, job_id, client_id);
    pthread_mutex_lock(&p->lock);
    p->in_cb--;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->lock);
  }
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
