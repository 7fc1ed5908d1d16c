/* What the task table (tasks.c) and the task runner (run.c) share. Not
 * installed; locking as in worker.h. */
#ifndef FERRY_WORKER_TASKS_INTERNAL_H
#define FERRY_WORKER_TASKS_INTERNAL_H

#include "worker.h"

/* At most this many records per chunk, whatever the record size. */
#define MAX_CHUNK_RECORDS (1u << 20)
/* Pipeline contexts per thread. */
#define CTX_SLOTS 4

/* A pipeline thread's state: its pipeline contexts, least recently used
 * first to go (run.c). */
struct ctx_slot {
  ferry__wpipe_t *pipe; /* holds a reference; NULL: empty slot */
  uint64_t pipe_id;
  ferry_pipeline_ctx_t *ctx;
  ferry_pipeline_ctx_t *pctx; /* the prefix's (pipe->pol->prefix); lazy */
  uint64_t used; /* LRU tick */
};

struct ferry__wthread_s {
  ferry__wtasks_t *t;
  pthread_t tid;
  struct ctx_slot slots[CTX_SLOTS];
  uint64_t tick;
  ferry_pipeline_ctx_t *last; /* the ctx of the last get_ctx */
};

/* Runs `k` on `th` until it ends (true) or parks (false: it is on the
 * parked list, or, with may_park false, never) (run.c). */
bool ferry__wtask_step(ferry__wthread_t *th, ferry__wtask_t *k, bool may_park);

/* Drops a task's (or a thread's) reference to a compiled pipeline; the
 * cache frees it (tasks.c). */
void ferry__wpipe_unref(ferry__wpipe_t *p);
/* The task no longer makes its stream active (it ended). */
void ferry__wtask_key_idle(ferry__wtask_t *k);
/* The task's run state is gone: its stream's run slot frees, and one of
 * the stream's held tasks may start. Tasks lock held. */
void ferry__wrun_slot_put(ferry__wtasks_t *t, ferry__wtask_t *k);
/* Parks `k` on a shared-production entry until its producer appends or
 * stops, unless the entry changed since `gen` (retry) or the task was
 * cancelled (stop) (tasks.c). */
enum { FERRY__WPARK_DONE, FERRY__WPARK_RETRY, FERRY__WPARK_STOP };
int ferry__wtasks_park_share(ferry__wtasks_t *t, ferry__wtask_t *k,
                             ferry__wshare_entry_t *e, uint64_t gen);
/* The epoch that keys a task's shared-production entry: its own, or 0
 * when every epoch's records are the same (no shuffle, no op drawn per
 * epoch) (tasks.c). */
uint32_t ferry__wshare_epoch(const ferry__wtask_t *k);
/* Puts the tasks parked on `e` back at the head of the pending queue. */
void ferry__wtasks_wake_share(ferry__wtasks_t *t, ferry__wshare_entry_t *e);
/* Frees a task's run state (NULL: nothing) (run.c). */
void ferry__wrun_free(struct ferry__wrun_s *ru);

#endif /* FERRY_WORKER_TASKS_INTERNAL_H */
