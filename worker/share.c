/* The worker's shared-production window (share.h). */
#include "share.h"

#include <string.h>

#include "alloc.h"
#include "ferry/error.h"

int ferry__wshare_init(ferry__wshare_t *s, uint64_t cap) {
  memset(s, 0, sizeof(*s));
  if (pthread_mutex_init(&s->mu, NULL) != 0)
    return FERRY_ENOMEM;
  s->cap = cap;
  atomic_init(&s->served, 0);
  atomic_init(&s->stored, 0);
  atomic_init(&s->own, 0);
  return 0;
}

void ferry__wshare_chunk_ref(const ferry__wshare_chunk_t *ch) {
  atomic_fetch_add(&((ferry__wshare_chunk_t *)ch)->refs, 1);
}

void ferry__wshare_chunk_unref(void *arg) {
  ferry__wshare_chunk_t *ch = arg;
  if (atomic_fetch_sub(&ch->refs, 1) == 1)
    ferry__free(ch);
}

static void entry_free(ferry__wshare_entry_t *e) {
  for (size_t i = e->lo; i < e->nchunks; i++)
    ferry__wshare_chunk_unref(e->chunks[i]);
  ferry__free(e->chunks);
  ferry__free(e);
}

static void unlink_entry(ferry__wshare_t *s, ferry__wshare_entry_t *e) {
  if (e->prev != NULL)
    e->prev->next = e->next;
  else
    s->head = e->next;
  if (e->next != NULL)
    e->next->prev = e->prev;
  else
    s->tail = e->prev;
  e->prev = e->next = NULL;
  e->linked = false;
  s->used -= e->bytes;
}

static void link_head(ferry__wshare_t *s, ferry__wshare_entry_t *e) {
  e->prev = NULL;
  e->next = s->head;
  if (s->head != NULL)
    s->head->prev = e;
  s->head = e;
  if (s->tail == NULL)
    s->tail = e;
  e->linked = true;
  s->used += e->bytes;
}

void ferry__wshare_close(ferry__wshare_t *s) {
  for (ferry__wshare_entry_t *e = s->head, *n; e != NULL; e = n) {
    n = e->next;
    entry_free(e);
  }
  s->head = s->tail = NULL;
  s->used = 0;
  pthread_mutex_destroy(&s->mu);
}

static bool same_key(const ferry__wshare_key_t *a,
                     const ferry__wshare_key_t *b) {
  return a->pipe_id == b->pipe_id && a->seed == b->seed &&
         a->shuffle == b->shuffle && a->policy == b->policy &&
         a->epoch == b->epoch && a->split == b->split &&
         a->file_index == b->file_index && a->byte_offset == b->byte_offset &&
         a->byte_end == b->byte_end && a->first_record == b->first_record &&
         a->num_records == b->num_records;
}

ferry__wshare_entry_t *ferry__wshare_get(ferry__wshare_t *s,
                                         const ferry__wshare_key_t *key,
                                         bool create, bool *producer) {
  *producer = false;
  pthread_mutex_lock(&s->mu);
  ferry__wshare_entry_t *e = s->head;
  while (e != NULL && !same_key(&e->key, key))
    e = e->next;
  if (e != NULL) {
    unlink_entry(s, e); /* most recently used */
    link_head(s, e);
    e->refs++;
  } else if (create && (e = ferry__calloc(1, sizeof(*e))) != NULL) {
    e->key = *key;
    e->producing = true;
    e->refs = 1;
    link_head(s, e);
    *producer = true;
  }
  pthread_mutex_unlock(&s->mu);
  return e;
}

void ferry__wshare_put(ferry__wshare_t *s, ferry__wshare_entry_t *e) {
  if (e == NULL)
    return;
  pthread_mutex_lock(&s->mu);
  bool gone = --e->refs == 0 && !e->linked;
  pthread_mutex_unlock(&s->mu);
  if (gone)
    entry_free(e);
}

/* Unlinks least recently used entries nobody holds until `need` more
 * bytes fit; the unlinked ones are freed (after the lock) by the caller
 * through *freed. Mutex held. */
static bool make_room(ferry__wshare_t *s, uint64_t need,
                      ferry__wshare_entry_t **freed) {
  for (ferry__wshare_entry_t *e = s->tail, *p; e != NULL && s->used + need >
                                                                s->cap;
       e = p) {
    p = e->prev;
    if (e->refs > 0)
      continue;
    unlink_entry(s, e);
    e->next = *freed;
    *freed = e;
  }
  /* Then the oldest chunks of entries, least recently used first (the
   * appending one too): what consumers behind them need they produce. */
  for (ferry__wshare_entry_t *e = s->tail; e != NULL && s->used + need >
                                                            s->cap;
       e = e->prev)
    while (e->lo < e->nchunks && s->used + need > s->cap) {
      ferry__wshare_chunk_t *ch = e->chunks[e->lo++];
      uint64_t b = sizeof(ferry__wshare_chunk_t) + 16 * (uint64_t)ch->count +
                   (uint64_t)ch->h * (uint64_t)ch->w * (uint64_t)ch->c *
                       ch->count;
      e->bytes -= b;
      s->used -= b;
      ferry__wshare_chunk_unref(ch); /* a view in flight keeps it */
    }
  return s->used + need <= s->cap;
}

bool ferry__wshare_append(ferry__wshare_t *s, ferry__wshare_entry_t *e,
                          uint64_t first, uint32_t count, int h, int w,
                          int c, const int64_t *labels, const int64_t *ids,
                          const uint8_t *payload, bool *wake) {
  size_t rb = (size_t)h * (size_t)w * (size_t)c;
  size_t bytes = sizeof(ferry__wshare_chunk_t) + 16 * (size_t)count +
                 rb * count;
  ferry__wshare_entry_t *freed = NULL;
  bool ok = false;
  *wake = false;
  pthread_mutex_lock(&s->mu);
  /* A chunk may begin before what the entry holds (a consumer that took
   * over production had sent records from it into the same chunk): only
   * its new records go in. */
  if (!e->full && first < e->produced && first + count > e->produced) {
    uint32_t skip = (uint32_t)(e->produced - first);
    first += skip;
    count -= skip;
    labels += skip;
    ids += skip;
    payload += (size_t)skip * rb;
    bytes = sizeof(ferry__wshare_chunk_t) + 16 * (size_t)count + rb * count;
  } else if (!e->full && first + count <= e->produced) {
    ok = true; /* nothing new */
    goto out;
  }
  if (e->full || first != e->produced || !e->linked ||
      !make_room(s, bytes, &freed) ||
      (e->nchunks == e->cap && !FERRY__GROW(e->chunks, e->cap,
                                            e->nchunks + 1, 16))) {
    e->full = true;
    goto out;
  }
  /* Copied under the lock: a consumer reads chunks only through
   * ferry__wshare_at, and a chunk never changes once it is in. */
  ferry__wshare_chunk_t *k = ferry__malloc(bytes);
  if (k == NULL) {
    e->full = true;
    goto out;
  }
  atomic_init(&k->refs, 1);
  k->first = first;
  k->count = count;
  k->h = h;
  k->w = w;
  k->c = c;
  k->labels = (int64_t *)(k + 1);
  k->ids = k->labels + count;
  k->payload = (uint8_t *)(k->ids + count);
  memcpy(k->labels, labels, 8 * (size_t)count);
  memcpy(k->ids, ids, 8 * (size_t)count);
  memcpy(k->payload, payload, rb * count);
  e->chunks[e->nchunks++] = k;
  e->produced = first + count;
  e->bytes += bytes;
  s->used += bytes;
  ok = true;
  atomic_fetch_add(&s->stored, count);
out:
  e->gen++;
  *wake = e->waiting > 0;
  pthread_mutex_unlock(&s->mu);
  for (ferry__wshare_entry_t *f = freed, *n; f != NULL; f = n) {
    n = f->next;
    entry_free(f);
  }
  return ok;
}

void ferry__wshare_end(ferry__wshare_t *s, ferry__wshare_entry_t *e,
                       bool complete, bool *wake) {
  pthread_mutex_lock(&s->mu);
  e->producing = false;
  if (complete && !e->full)
    e->complete = true;
  e->gen++;
  *wake = e->waiting > 0;
  pthread_mutex_unlock(&s->mu);
}

bool ferry__wshare_has(ferry__wshare_t *s, uint64_t pipe_id, uint32_t epoch,
                       uint32_t split) {
  pthread_mutex_lock(&s->mu);
  ferry__wshare_entry_t *e = s->head;
  while (e != NULL && (e->key.pipe_id != pipe_id || e->key.epoch != epoch ||
                       e->key.split != split))
    e = e->next;
  pthread_mutex_unlock(&s->mu);
  return e != NULL;
}

bool ferry__wshare_waiting(ferry__wshare_t *s, ferry__wshare_entry_t *e) {
  pthread_mutex_lock(&s->mu);
  bool w = e->waiting > 0;
  pthread_mutex_unlock(&s->mu);
  return w;
}

ferry__wshare_at_t ferry__wshare_at(ferry__wshare_t *s,
                                    ferry__wshare_entry_t *e, uint64_t pos,
                                    const ferry__wshare_chunk_t **chunk,
                                    uint64_t *gen) {
  ferry__wshare_at_t at;
  pthread_mutex_lock(&s->mu);
  *gen = e->gen;
  if (pos < e->produced &&
      (e->lo == e->nchunks || pos < e->chunks[e->lo]->first)) {
    at = FERRY__WSHARE_OWN; /* slid out of the window */
  } else if (pos < e->produced) {
    /* Binary search: chunks are contiguous. */
    size_t lo = e->lo, hi = e->nchunks;
    while (hi - lo > 1) {
      size_t mid = (lo + hi) / 2;
      if (e->chunks[mid]->first <= pos)
        lo = mid;
      else
        hi = mid;
    }
    *chunk = e->chunks[lo];
    at = FERRY__WSHARE_CHUNK;
  } else if (e->complete) {
    at = FERRY__WSHARE_END;
  } else if (e->full || pos > e->produced) {
    at = FERRY__WSHARE_OWN;
  } else if (e->producing) {
    at = FERRY__WSHARE_WAIT;
  } else {
    e->producing = true;
    e->gen++;
    *gen = e->gen;
    at = FERRY__WSHARE_TAKE;
  }
  pthread_mutex_unlock(&s->mu);
  return at;
}
