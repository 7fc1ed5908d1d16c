/* Shared production on a worker (docs/ARCHITECTURE.md, "Shared
 * production"): tasks of sharing jobs (Task.share) that run the same split
 * of the same epoch through the same spec, shuffle and seed produce it
 * once. The first task of such a split (its producer) copies each chunk
 * it sends into an entry of the window (--share-bytes); the others
 * (consumers) send their copies from the entry (views of its memory, no
 * copy), waiting (parked, holding no thread) while the producer is ahead
 * of nothing, taking over production when it stops, or producing the
 * rest themselves when the window no longer holds their position. Room
 * is made by dropping, least recently used first, entries no task reads,
 * then the oldest chunks of entries (a sliding window: a consumer behind
 * it produces the rest itself).
 *
 * Locking: the window's mutex is a leaf, except that park_share (tasks.c)
 * takes it under the tasks lock. */
#ifndef FERRY_WORKER_SHARE_H
#define FERRY_WORKER_SHARE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

/* Records of one chunk the producer sent, copied. */
typedef struct ferry__wshare_chunk_s {
  /* The entry's, plus one per chunk in flight that sends its payload
   * (a consumer's view): freed at the last. */
  atomic_int refs;
  uint64_t first;
  uint32_t count;
  int h, w, c;
  int64_t *labels, *ids;
  uint8_t *payload;
} ferry__wshare_chunk_t;

/* What makes two tasks' records the same. */
typedef struct ferry__wshare_key_s {
  uint64_t pipe_id; /* one compiled spec (ferry__wpipe_t.id) */
  uint64_t seed;
  bool shuffle;
  int policy;
  uint32_t epoch, split, file_index;
  uint64_t byte_offset, byte_end, first_record, num_records;
} ferry__wshare_key_t;

typedef struct ferry__wshare_entry_s {
  struct ferry__wshare_entry_s *prev, *next; /* the window, MRU first */
  ferry__wshare_key_t key;
  ferry__wshare_chunk_t **chunks; /* in position order, contiguous */
  size_t nchunks, cap;
  /* chunks[0, lo) are gone (trimmed for room, oldest first): positions
   * below chunks[lo]->first are no longer held. */
  size_t lo;
  uint64_t produced; /* positions [0, produced) are in chunks */
  uint64_t bytes;
  bool producing;    /* a task appends to it */
  bool complete;     /* produced is the split's end */
  bool full;         /* no room was left: nothing more is appended */
  bool linked;       /* in the window (else freed at its last ref) */
  int refs;          /* tasks reading or producing it */
  int waiting;       /* tasks parked on it (set under the tasks lock) */
  uint64_t gen;      /* changes with each append and state change */
} ferry__wshare_entry_t;

typedef struct ferry__wshare_s {
  pthread_mutex_t mu;
  uint64_t cap;  /* --share-bytes */
  uint64_t used; /* bytes of linked entries */
  ferry__wshare_entry_t *head, *tail;
  /* Records consumers sent from the window; records producers put in
   * it; consumers that produced the rest themselves. */
  atomic_uint_least64_t served, stored, own;
} ferry__wshare_t;

int ferry__wshare_init(ferry__wshare_t *s, uint64_t cap);
/* Frees every entry (no task may hold one). */
void ferry__wshare_close(ferry__wshare_t *s);

/* The entry of `key`, referenced, or NULL. With `create` and none found,
 * a new one whose producer is the caller (*producer set true). */
ferry__wshare_entry_t *ferry__wshare_get(ferry__wshare_t *s,
                                         const ferry__wshare_key_t *key,
                                         bool create, bool *producer);
/* Drops a reference. A producer first ends its production with
 * ferry__wshare_end. */
void ferry__wshare_put(ferry__wshare_t *s, ferry__wshare_entry_t *e);

/* The producer's chunk of records [first, first + count), copied in;
 * false when the window has no room for it (the entry is then full: its
 * consumers produce what follows themselves). Returns whether tasks wait
 * on the entry in *wake. */
bool ferry__wshare_append(ferry__wshare_t *s, ferry__wshare_entry_t *e,
                          uint64_t first, uint32_t count, int h, int w,
                          int c, const int64_t *labels, const int64_t *ids,
                          const uint8_t *payload, bool *wake);
/* The producer stops producing: at the split's end (`complete`), or not
 * (stopped, failed, or parked on its stream's share: another task may
 * take over). *wake as for append. */
void ferry__wshare_end(ferry__wshare_t *s, ferry__wshare_entry_t *e,
                       bool complete, bool *wake);

/* A consumer's chunk sends `ch`'s payload where it lies: a reference
 * until the chunk is released (ferry__wshare_chunk_unref, any thread). */
void ferry__wshare_chunk_ref(const ferry__wshare_chunk_t *ch);
void ferry__wshare_chunk_unref(void *ch);

/* What a consumer at position `pos` finds. */
typedef enum {
  FERRY__WSHARE_CHUNK,   /* *chunk holds pos */
  FERRY__WSHARE_END,     /* pos is the split's end */
  FERRY__WSHARE_WAIT,    /* the producer has not got there yet (*gen) */
  FERRY__WSHARE_TAKE,    /* nobody produces it: the caller now does, from
                          * pos (== produced), appending */
  FERRY__WSHARE_OWN      /* the rest is not in the window: produce it */
} ferry__wshare_at_t;

/* Whether the window holds an entry of that split (of a compiled spec,
 * any seed): a task of it should run soon. */
bool ferry__wshare_has(ferry__wshare_t *s, uint64_t pipe_id, uint32_t epoch,
                       uint32_t split);

/* Whether tasks wait on `e` (parked for its producer). */
bool ferry__wshare_waiting(ferry__wshare_t *s, ferry__wshare_entry_t *e);

ferry__wshare_at_t ferry__wshare_at(ferry__wshare_t *s,
                                    ferry__wshare_entry_t *e, uint64_t pos,
                                    const ferry__wshare_chunk_t **chunk,
                                    uint64_t *gen);

#endif /* FERRY_WORKER_SHARE_H */
