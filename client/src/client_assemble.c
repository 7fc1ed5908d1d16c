/* The batch assembler: a ring of preallocated batch slots that stream
 * readers fill straight from the received chunks, the per-split
 * exactly-once bookkeeping (received and delivered counts), the end of
 * epoch logic and the trainer's side (ferry_next, ferry_batch_release,
 * ferry_client_stats).
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "alloc.h"
#include "client_internal.h"
#include "ferry/log.h"

struct timespec ferry__client_deadline(uint32_t ms) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  ts.tv_sec += ms / 1000;
  ts.tv_nsec += (long)(ms % 1000) * 1000000L;
  if (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000L;
  }
  return ts;
}

double ferry__client_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- Set-up ------------------------------------------------------------ */

static void det_drop_held_locked(ferry_client_t *c, ferry__split_t *s);

int ferry__asm_init(ferry_client_t *c, ferry_error_t *err) {
  const ferry__asm_params_t *ap = &c->ap;
  pthread_condattr_t ca;
  if (ap->batch_size == 0 || ap->prefetch == 0 || ap->height == 0 ||
      ap->width == 0 || ap->channels == 0)
    return ferry__seterr(err, FERRY_EINVAL,
                         "client: batch size, prefetch and image shape must "
                         "be positive");
  c->record_bytes = (size_t)ap->height * ap->width * ap->channels;
  size_t img;
  if (__builtin_mul_overflow(c->record_bytes, (size_t)ap->batch_size, &img))
    return ferry__seterr(err, FERRY_ERANGE, "client: batch too large");
  c->fill = -1;
  pthread_mutex_init(&c->mu, NULL);
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&c->ready_cv, &ca);
  pthread_cond_init(&c->space_cv, &ca);
  pthread_cond_init(&c->hb_cv, &ca);
  pthread_condattr_destroy(&ca);
  c->slots = ferry__calloc(ap->prefetch, sizeof(*c->slots));
  c->queue = ferry__calloc(ap->prefetch, sizeof(*c->queue));
  if (c->slots == NULL || c->queue == NULL)
    goto nomem;
  /* Every slot's memory, host and device, comes from the staging
   * allocator, once. */
  int rc = ferry__staging_alloc(c, err);
  if (rc != 0) {
    ferry__asm_close(c);
    return rc;
  }
  c->t0 = ferry__client_now();
  return 0;
nomem:
  ferry__asm_close(c);
  return ferry__seterr(err, FERRY_ENOMEM,
                       "client: out of memory for %u batch slots",
                       ap->prefetch);
}

void ferry__asm_close(ferry_client_t *c) {
  if (c->slots != NULL) {
    ferry__staging_free(c);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->ready_cv);
    pthread_cond_destroy(&c->space_cv);
    pthread_cond_destroy(&c->hb_cv);
  }
  for (size_t i = 0; c->splits != NULL && i < c->n_splits; i++)
    det_drop_held_locked(c, &c->splits[i]);
  ferry__free(c->slots);
  ferry__free(c->queue);
  ferry__free(c->splits);
  ferry__free(c->pad_image);
  c->pad_image = NULL;
  c->slots = NULL;
  c->queue = NULL;
  c->splits = NULL;
}

int ferry__client_new_local(const ferry__asm_params_t *ap,
                            ferry_client_t **out, ferry_error_t *err) {
  ferry_client_t *c = ferry__calloc(1, sizeof(*c));
  *out = NULL;
  if (c == NULL)
    return ferry__seterr(err, FERRY_ENOMEM, "client: out of memory");
  ferry_client_options_init(&c->opts);
  c->pid = getpid();
  c->ap = *ap;
  int rc = ferry__staging_check(c, false, err);
  if (rc == 0)
    rc = ferry__asm_init(c, err);
  if (rc != 0) {
    ferry__free(c);
    return rc;
  }
  *out = c;
  return 0;
}

/* ---- Failure and the split table --------------------------------------- */

void ferry__client_fail_locked(ferry_client_t *c, int code, const char *fmt,
                               ...) {
  if (c->fail_code != 0)
    return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->fail_msg, sizeof(c->fail_msg), fmt, ap);
  va_end(ap);
  c->fail_code = code < 0 ? code : FERRY_EIO;
  FERRY_LOG(FERRY_LOG_ERROR, "client: %s", c->fail_msg);
  pthread_cond_broadcast(&c->ready_cv);
  pthread_cond_broadcast(&c->space_cv);
  pthread_cond_broadcast(&c->hb_cv);
}

ferry__split_t *ferry__client_split(ferry_client_t *c, uint32_t epoch,
                                    uint32_t split) {
  for (size_t i = 0; i < c->n_splits; i++)
    if (c->splits[i].epoch == epoch && c->splits[i].split == split)
      return &c->splits[i];
  return NULL;
}

/* In distributed_epoch a split (or a part of one) is one entry whichever
 * worker holds its lease (a re-leased copy replays the same order and the
 * received count drops the duplicates). */
uint64_t ferry__client_split_key(const ferry_client_t *c, uint64_t worker,
                                 uint64_t lease) {
  return c->ap.per_worker ? worker : ferry__lease_part(lease);
}

ferry__split_t *ferry__client_split_of(ferry_client_t *c, uint32_t epoch,
                                       uint32_t split, uint64_t key) {
  for (size_t i = 0; i < c->n_splits; i++)
    if (c->splits[i].epoch == epoch && c->splits[i].split == split &&
        c->splits[i].key == key)
      return &c->splits[i];
  return NULL;
}

/* Finds or adds the entry for (epoch, split, key); NULL when out of
 * memory. */
static ferry__split_t *split_get(ferry_client_t *c, uint32_t epoch,
                                 uint32_t split, uint64_t key) {
  ferry__split_t *s = ferry__client_split_of(c, epoch, split, key);
  if (s != NULL)
    return s;
  if (!FERRY__GROW(c->splits, c->cap_splits, c->n_splits + 1, 32))
    return NULL;
  s = &c->splits[c->n_splits++];
  memset(s, 0, sizeof(*s));
  s->epoch = epoch;
  s->split = split;
  s->key = key;
  s->worker_id = c->ap.per_worker ? key : 0;
  return s;
}

/* Every record of the split arrived and, in deterministic order, went
 * into a slot (none waits its turn). */
static bool fully_received(const ferry__split_t *s) {
  return s->has_total && s->received >= s->total &&
         (!s->det || (s->assembled >= s->received && s->held == NULL));
}

/* Remembers a chunk with records that was dropped (fenced, or its split
 * not listed): should an answer list the split at that lease (or an
 * older one) after all, apply_locked asks for a restart, as those records
 * are lost; without it the split would wait for ever when the dropped
 * chunk was its last. One entry per split, the newest lease kept. */
static void note_dropped_locked(ferry_client_t *c, const ferry_chunk_t *ch,
                                uint64_t kw) {
  if (ch->count == 0)
    return;
  ferry__dropped_t *d = NULL;
  for (uint32_t k = 0; k < FERRY__DROPPED && d == NULL; k++)
    if (c->dropped[k].used && c->dropped[k].epoch == ch->epoch &&
        c->dropped[k].split == ch->split && c->dropped[k].kw == kw)
      d = &c->dropped[k];
  if (d == NULL)
    d = &c->dropped[c->n_dropped++ % FERRY__DROPPED];
  else if (d->lease > ch->lease)
    return;
  *d = (ferry__dropped_t){ch->epoch, ch->split, kw, ch->lease, true};
}

/* The entry of a split the dispatcher lists for this client, for a chunk
 * of it. A worker may learn of a lease (its heartbeat) before the client
 * does (its own heartbeat's answer), so a chunk of a split not listed yet
 * waits for up to two more answers, bounded in time, before it is
 * dropped as one of a split the client does not hold (moved to another
 * client, or done). NULL then. Lock held. */
static ferry__split_t *held_split_locked(ferry_client_t *c,
                                         const ferry_chunk_t *ch,
                                         uint64_t kw, const bool *stop) {
  uint32_t epoch = ch->epoch, split = ch->split;
  uint32_t seen = c->hb_applied;
  uint32_t wait_ms = 4 * c->opts.heartbeat_ms;
  struct timespec deadline =
      ferry__client_deadline(wait_ms < 1000 ? 1000 : wait_ms);
  for (;;) {
    ferry__split_t *s = ferry__client_split_of(c, epoch, split, kw);
    if (s != NULL && s->assigned)
      return s;
    if (c->hb_applied >= seen + 2 || c->stopping || c->fail_code != 0 ||
        (stop != NULL && *stop) ||
        pthread_cond_timedwait(&c->ready_cv, &c->mu, &deadline) ==
            ETIMEDOUT)
      break;
  }
  FERRY_LOG(FERRY_LOG_DEBUG,
            "client: a chunk of epoch %u split %u, which this client does "
            "not hold: dropped", epoch, split);
  note_dropped_locked(c, ch, kw);
  return NULL;
}

bool ferry__client_between_epochs_locked(const ferry_client_t *c) {
  return c->ranked && c->next_since > 0 && c->qlen == 0 &&
         ferry__client_held_locked(c) == 0;
}

uint32_t ferry__client_held_locked(const ferry_client_t *c) {
  uint32_t n = 0;
  for (size_t i = 0; i < c->n_splits; i++)
    n += c->splits[i].assigned && !fully_received(&c->splits[i]);
  return n;
}

/* Wakes the heartbeat thread for a beat now. */
static void kick_locked(ferry_client_t *c) {
  c->hb_kick = true;
  pthread_cond_signal(&c->hb_cv);
}

/* Whether a beat should ask for splits now: at most half of
 * splits_in_flight is still arriving. Asking as each split completes
 * cost a ClientHeartbeat (and a dispatcher journal batch) per split: 171
 * beats in a 0.8 s epoch of 256 splits, a fifth of the client's CPU;
 * half a window of splits still queued at the workers covers the beat's
 * round trip. */
static bool room_for_splits_locked(const ferry_client_t *c) {
  return ferry__client_held_locked(c) <= c->opts.splits_in_flight / 2;
}

/* ---- Restarts ---------------------------------------------------------- */

/* Asks for a restart of split `s` at `lease` unless one was already asked
 * for that lease or a newer one (once per lease generation), or the lease
 * is older than one the client already knows (a superseded lease's loss
 * does not matter). `current` (a fence, a broken stream) asks for the
 * restart of whatever lease the row has now: what was lost may be of a
 * lease newer than any the client heard of. */
static void mark_restart_locked(ferry_client_t *c, ferry__split_t *s,
                                uint64_t lease, bool current) {
  if (current) {
    if (s->restart == FERRY__RESTART_PENDING && s->restart_current)
      return; /* already going out */
  } else if (lease < s->lease || lease <= s->restart_lease) {
    return;
  }
  s->lease = lease;
  if (lease > s->restart_lease)
    s->restart_lease = lease;
  s->restart = FERRY__RESTART_PENDING;
  s->restart_current = current;
  FERRY_LOG(FERRY_LOG_WARN,
            "client: epoch %u split %u: records of lease %llu%s lost in "
            "transit; asking for a restart from %llu", s->epoch, s->split,
            (unsigned long long)lease, current ? " (or newer)" : "",
            (unsigned long long)s->delivered);
  kick_locked(c);
}

void ferry__client_restart_worker_locked(ferry_client_t *c,
                                         uint64_t worker_id) {
  for (size_t i = 0; i < c->n_splits; i++) {
    ferry__split_t *s = &c->splits[i];
    if (s->assigned && s->worker_id == worker_id && !fully_received(s))
      mark_restart_locked(c, s, s->lease, true);
  }
}

/* Whether split `s` is to be given up now: listed, marked unread at its
 * current lease (its worker saw no stream of ours for --client-idle-ms:
 * the task has not started), not complete, no record of that lease
 * taken, none received that the trainer has not had, no restart
 * pending. A client whose stream to the worker does not open (a worker
 * out of descriptors, a trainer that stopped reading before it opened
 * one) so frees the split for the job's other clients or workers, while
 * a slow worker that has not produced a chunk yet is waited for. */
static bool release_due_locked(const ferry__split_t *s) {
  return s->assigned && s->unread && !s->released && s->worker_id != 0 &&
         !fully_received(s) && s->grant_lease != 0 &&
         s->got_lease < s->grant_lease && s->received == s->delivered &&
         s->restart == FERRY__RESTART_NONE;
}

/* Whether chunks of lease `lease` of split `s` may be taken: not of a
 * lease this client gave up. */
static bool split_taken_locked(const ferry__split_t *s, uint64_t lease) {
  return !(s->released && lease <= s->released_lease);
}

size_t ferry__client_progress_locked(ferry_client_t *c,
                                     Ferry__V1__SplitProgress *prog,
                                     Ferry__V1__SplitProgress **pp) {
  for (size_t i = 0; i < c->n_splits; i++) {
    ferry__split_t *s = &c->splits[i];
    ferry__v1__split_progress__init(&prog[i]);
    prog[i].epoch = s->epoch;
    prog[i].split = s->split;
    prog[i].delivered = s->delivered;
    prog[i].worker_id = s->worker_id;
    /* The lease names the part of the split (lease.h). */
    prog[i].lease = s->lease;
    if (s->restart == FERRY__RESTART_PENDING) {
      prog[i].restart = true;
      prog[i].lease = s->restart_lease;
      prog[i].restart_current = s->restart_current;
      s->restart = FERRY__RESTART_SENT;
    } else if (release_due_locked(s)) {
      /* Fencing by the client itself: from now on no chunk of this lease
       * is taken (split_taken_locked), and only then does the dispatcher
       * hear of it and put the split back into the pool. Nothing of the
       * lease was taken and nothing received waits to be handed out, so
       * the split's next holder starts where this client's trainer
       * stands. Said again in every beat until an answer stops listing
       * the split at that lease. */
      FERRY_LOG(FERRY_LOG_INFO,
                "client: epoch %u split %u: worker %llu saw no stream of "
                "ours for lease %llu: given back to the dispatcher",
                s->epoch, s->split, (unsigned long long)s->worker_id,
                (unsigned long long)s->grant_lease);
      s->released = true;
      s->released_lease = s->grant_lease;
    }
    if (s->released && s->released_lease == s->grant_lease) {
      prog[i].release = true;
      prog[i].lease = s->released_lease;
    }
    pp[i] = &prog[i];
  }
  return c->n_splits;
}

void ferry__client_restart_unsent_locked(ferry_client_t *c) {
  for (size_t i = 0; i < c->n_splits; i++)
    if (c->splits[i].restart == FERRY__RESTART_SENT)
      c->splits[i].restart = FERRY__RESTART_PENDING;
}

/* ---- Slots ------------------------------------------------------------- */

static void close_fill_locked(ferry_client_t *c) {
  ferry__slot_t *s = &c->slots[c->fill];
  s->state = FERRY__SLOT_CLOSED;
  /* Slots close in queue order and every closed slot that is neither
   * empty nor dropped is handed out in that order, so the index is known
   * now: the augmentation's key needs it before ferry_next runs. */
  if (!s->drop && s->size > 0)
    s->index = c->next_index++;
  c->fill = -1;
  if (s->copied == s->size)
    pthread_cond_broadcast(&c->ready_cv);
}

/* Frees a discarded slot once no reader copies into it and no thread
 * prepares it. */
static void free_discarded_locked(ferry_client_t *c, ferry__slot_t *s) {
  if (s->state != FERRY__SLOT_DISCARDED || s->copied != s->size ||
      s->preparing)
    return;
  s->state = FERRY__SLOT_FREE;
  pthread_cond_broadcast(&c->space_cv);
}

/* Deterministic order: the offsets of a slot reserved so far. */
static void det_clear_slot(const ferry_client_t *c, ferry__slot_t *s) {
  s->det_at = 0;
  if (c->det && s->det_bits != NULL)
    memset(s->det_bits, 0,
           (c->ap.batch_size + 63) / 64 * sizeof(*s->det_bits));
}

/* ---- Fencing ----------------------------------------------------------- */

void ferry__client_fence_locked(ferry_client_t *c, bool drop_splits,
                                const char *why) {
  uint64_t dropped = 0;
  /* Deterministic order: the rank's next position is the first one not
   * handed out, the oldest queued slot's first. */
  for (uint32_t i = 0; c->det && i < c->qlen; i++) {
    ferry__slot_t *s = &c->slots[c->queue[(c->qhead + i) % c->ap.prefetch]];
    if (s->det_has_first) {
      c->det_epoch = s->epoch;
      c->det_next = s->det_first;
      break;
    }
  }
  for (uint32_t i = 0; i < c->qlen; i++) {
    ferry__slot_t *s = &c->slots[c->queue[(c->qhead + i) % c->ap.prefetch]];
    dropped += s->size;
    s->state = FERRY__SLOT_DISCARDED;
    free_discarded_locked(c, s);
  }
  c->qlen = 0;
  c->fill = -1;
  for (size_t i = 0; i < c->n_splits; i++) {
    ferry__split_t *s = &c->splits[i];
    s->received = s->assembled = s->delivered;
    det_drop_held_locked(c, s);
    if (!drop_splits && s->assigned &&
        !(s->has_total && s->delivered >= s->total))
      mark_restart_locked(c, s, s->lease, true);
  }
  if (drop_splits)
    c->n_splits = 0;
  c->det_ahead_recs = 0; /* their slots were dropped with the rest */
  c->fenced = true;
  c->fences++;
  FERRY_LOG(FERRY_LOG_WARN,
            "client %llu: %s: stopped handing out batches and dropped %llu "
            "records not handed out yet%s", (unsigned long long)c->client_id,
            why, (unsigned long long)dropped,
            drop_splits ? "; the splits went to other clients" : "");
  pthread_cond_broadcast(&c->space_cv);
  pthread_cond_broadcast(&c->ready_cv);
  pthread_cond_broadcast(&c->hb_cv);
}

/* Fences the client when its lease ran out. Lock held. Returns true while
 * the client is fenced. */
double ferry__client_lease_s(const ferry_client_t *c) {
  return (double)c->client_timeout_ms * 1e-3 * FERRY__LEASE_FRACTION;
}

static bool lease_lapsed_locked(ferry_client_t *c) {
  if (!c->networked_lease)
    return false;
  if (!c->fenced && ferry__client_now() > c->lease_until) {
    char why[160];
    snprintf(why, sizeof(why),
             "no heartbeat answered for %.0f ms (the dispatcher's client "
             "timeout is %lld ms)",
             (ferry__client_now() - c->lease_until + ferry__client_lease_s(c)) *
                 1e3,
             (long long)c->client_timeout_ms);
    ferry__client_fence_locked(c, false, why);
  }
  return c->fenced;
}

static void renew_locked(ferry_client_t *c, double t_send, uint64_t records,
                         const Ferry__V1__ClientHeartbeatResponse *r) {
  if (!c->rejoined && records > c->records_acked) {
    c->records_acked = records;
    /* A rank's epoch may end on it (rank_done_locked). */
    if (c->ranked)
      pthread_cond_broadcast(&c->ready_cv);
  }
  if (r->client_timeout_ms > 0) {
    c->networked_lease = true;
    c->client_timeout_ms = r->client_timeout_ms;
  }
  if (r->fenced) {
    if (!c->fenced)
      ferry__client_fence_locked(c, false,
                                 "the dispatcher no longer renews our lease "
                                 "(a stream stalled, or we were declared "
                                 "lost and the job no longer runs)");
  } else if (c->networked_lease) {
    double until = t_send + ferry__client_lease_s(c);
    if (until > c->lease_until)
      c->lease_until = until;
    if (c->fenced && ferry__client_now() <= c->lease_until) {
      c->fenced = false;
      FERRY_LOG(FERRY_LOG_INFO, "client %llu: lease renewed; handing out "
                "batches again", (unsigned long long)c->client_id);
      pthread_cond_broadcast(&c->ready_cv);
    }
  }
}

void ferry__client_renew(ferry_client_t *c, double t_send, uint64_t records,
                         const Ferry__V1__ClientHeartbeatResponse *r) {
  pthread_mutex_lock(&c->mu);
  renew_locked(c, t_send, records, r);
  pthread_mutex_unlock(&c->mu);
}

/* Prepares a slot marked by nobody else: marks it, drops the lock for the
 * work, takes it back and records the outcome (a failure fails the
 * client). */
static void prepare_unlocked(ferry_client_t *c, ferry__slot_t *s) {
  ferry_error_t e = {0};
  s->preparing = true;
  pthread_mutex_unlock(&c->mu);
  int rc = ferry__staging_prepare(c, s, &e);
  pthread_mutex_lock(&c->mu);
  s->preparing = false;
  if (s->state == FERRY__SLOT_DISCARDED) {
    free_discarded_locked(c, s);
    return; /* fenced meanwhile: its batch is gone */
  }
  if (rc == 0)
    s->prepared = true;
  else
    ferry__client_fail_locked(c, rc, "batch %llu: %s",
                              (unsigned long long)s->index, e.msg);
  pthread_cond_broadcast(&c->ready_cv);
}

/* Flushes the partial batch of epoch e once the epoch cannot bring this
 * client more records: the dispatcher has no unassigned split left in it
 * and every split the client holds in it is fully received. */
static void maybe_flush_locked(ferry_client_t *c) {
  if (c->fill < 0 || !c->hb_seen)
    return;
  /* Records placed ahead wait for the positions before them: the epoch
   * still brings those (det_skip_locked fences if it cannot). */
  if (c->det_ahead_recs > 0)
    return;
  ferry__slot_t *slot = &c->slots[c->fill];
  uint32_t e = slot->epoch;
  if (!(c->d_epoch > e || (c->d_epoch == e && c->d_exhausted)))
    return;
  for (size_t i = 0; i < c->n_splits; i++)
    if (c->splits[i].epoch == e && !fully_received(&c->splits[i]))
      return;
  slot->drop = c->ap.drop_remainder;
  close_fill_locked(c);
}

/* ---- Ranks: equal steps ------------------------------------- */

uint64_t ferry__client_rk_steps(const ferry_client_t *c, uint32_t epoch) {
  return c->has_ep && epoch == c->ep_epoch ? c->ep_steps
                                           : c->steps_per_epoch;
}

uint64_t ferry__client_rk_records(const ferry_client_t *c, uint32_t epoch) {
  return c->has_ep && epoch == c->ep_epoch ? c->ep_records
                                           : c->rank_records;
}

/* A ranked job that pads (no drop_remainder): every rank hands out
 * steps_per_epoch batches per epoch, its last real one filled up and
 * then, if its real records ran out sooner, batches of no real record. */
static bool padding(const ferry_client_t *c) {
  return c->ranked && c->rk_pad && c->rk_world > 1;
}

/* Slots queued of epoch e holding real records. */
static uint64_t queued_real_locked(const ferry_client_t *c, uint32_t e) {
  uint64_t n = 0;
  for (uint32_t i = 0; i < c->qlen; i++) {
    const ferry__slot_t *s =
        &c->slots[c->queue[(c->qhead + i) % c->ap.prefetch]];
    n += s->epoch == e && s->size > 0 && !s->drop && !s->pad_only;
  }
  return n;
}

/* Whether a slot of `epoch` must wait: the trainer's epoch may still owe
 * padding batches, which come before any batch of a later epoch. */
static bool pad_gate_locked(const ferry_client_t *c, uint32_t epoch) {
  return padding(c) && c->hb_seen && epoch > c->cur_epoch &&
         c->rk_handed + queued_real_locked(c, c->cur_epoch) <
             ferry__client_rk_steps(c, c->cur_epoch);
}

/* Fills a closed, fully copied slot of fewer than batch_size real records
 * (a rank's last of the epoch) up to batch_size by repeating its own
 * records, before it is prepared; num_real keeps the real count. */
static void pad_partial_locked(ferry_client_t *c, ferry__slot_t *s) {
  uint32_t b = c->ap.batch_size, n = s->size;
  if (!padding(c) || s->padded || s->drop || n == 0 || n >= b ||
      s->state != FERRY__SLOT_CLOSED || s->copied != n)
    return;
  size_t rb = c->record_bytes;
  for (uint32_t i = n; i < b; i++) {
    memcpy(s->images + (size_t)i * rb, s->images + (size_t)(i % n) * rb, rb);
    s->labels[i] = s->labels[i % n];
    s->ids[i] = s->ids[i % n];
  }
  s->num_real = n;
  s->padded = true;
  s->size = s->copied = b;
}

/* Makes free slot i an empty slot of `epoch` taking records, queued
 * after the others. */
static void open_slot_locked(ferry_client_t *c, uint32_t i, uint32_t epoch) {
  ferry__slot_t *s = &c->slots[i];
  s->state = FERRY__SLOT_FILLING;
  s->size = s->copied = s->n_segs = 0;
  s->epoch = epoch;
  s->drop = false;
  s->padded = s->pad_only = false;
  s->num_real = 0;
  s->det_has_first = false;
  det_clear_slot(c, s);
  s->prepared = c->stg_mode == FERRY__STG_RAW;
  s->preparing = false;
  c->queue[(c->qhead + c->qlen) % c->ap.prefetch] = i;
  c->qlen++;
}

/* Makes c->fill a slot of `epoch` taking reservations, waiting for a free
 * slot if needed. Returns false when the client stops or failed. */
static bool take_slot_locked(ferry_client_t *c, uint32_t epoch,
                             const bool *stop) {
  if (c->fill >= 0 && c->slots[c->fill].epoch != epoch)
    close_fill_locked(c); /* batches never straddle epochs */
  while (c->fill < 0) {
    if (c->stopping || c->fail_code != 0 || (stop != NULL && *stop))
      return false;
    for (uint32_t i = 0; i < c->ap.prefetch && !pad_gate_locked(c, epoch);
         i++) {
      if (c->slots[i].state != FERRY__SLOT_FREE)
        continue;
      open_slot_locked(c, i, epoch);
      c->fill = (int)i;
      /* A slot was taken: whoever still waits starts a new stall. */
      c->space_wait_since = c->space_waiters > 0 ? ferry__client_now() : 0;
      return true;
    }
    if (c->space_waiters++ == 0 && c->space_wait_since == 0)
      c->space_wait_since = ferry__client_now();
    pthread_cond_wait(&c->space_cv, &c->mu);
    if (--c->space_waiters == 0)
      c->space_wait_since = 0;
  }
  return true;
}

/* Counts n records of (epoch, split, key kw) in the slot's segments
 * (what handing it out adds to their splits' delivered counts). */
static void add_seg(ferry__slot_t *slot, uint32_t epoch, uint32_t split,
                    uint64_t kw, uint32_t n) {
  ferry__seg_t *last = slot->n_segs ? &slot->segs[slot->n_segs - 1] : NULL;
  if (last != NULL && last->epoch == epoch && last->split == split &&
      last->key == kw)
    last->count += n;
  else
    slot->segs[slot->n_segs++] = (ferry__seg_t){
        .epoch = epoch, .split = split, .count = n, .key = kw};
}

/* Reserves n records of (epoch, split, key kw) at the end of the
 * fill slot, closing it when full; returns their first index in it. */
static uint32_t reserve_locked(ferry_client_t *c, uint32_t epoch,
                               uint32_t split, uint64_t kw, uint32_t n) {
  ferry__slot_t *slot = &c->slots[c->fill];
  uint32_t base = slot->size;
  slot->size += n;
  add_seg(slot, epoch, split, kw, n);
  if (slot->size == c->ap.batch_size)
    close_fill_locked(c);
  return base;
}

/* Copies the n records of ch from its record `off` into the slot's
 * reserved records [base, base + n), outside the lock (readers copy in
 * parallel), then prepares the slot if that completed it. Lock held on
 * entry and on return. */
static void copy_in_locked(ferry_client_t *c, ferry__slot_t *slot,
                           const ferry_chunk_t *ch,
                           const ferry_chunk_src_t *src, uint64_t off,
                           uint32_t base, uint32_t n) {
  size_t rb = c->record_bytes;
  pthread_mutex_unlock(&c->mu);
  size_t want = (size_t)n * rb;
  size_t got = src->copy(src, ch->payload_off + off * rb,
                         slot->images + base * rb, want);
  if (ch->n_labels != 0)
    memcpy(slot->labels + base, ch->labels + off, n * sizeof(int64_t));
  else
    memset(slot->labels + base, 0, n * sizeof(int64_t));
  if (ch->n_ids != 0)
    memcpy(slot->ids + base, ch->ids + off, n * sizeof(uint64_t));
  else
    memset(slot->ids + base, 0, n * sizeof(uint64_t));
  pthread_mutex_lock(&c->mu);
  slot->copied += n;
  if (got != want) {
    /* The transport could not deliver the payload (UCX: the worker
     * died between a chunk's header and its payload): these records are
     * not in the slot. Fencing drops every batch not handed out and
     * restarts our splits from what the trainer got. */
    char why[160];
    snprintf(why, sizeof(why), "a chunk's payload could not be received "
             "(%zu of %zu bytes)", got, want);
    ferry__client_fence_locked(c, false, why);
  }
  free_discarded_locked(c, slot);
  if (slot->state == FERRY__SLOT_CLOSED && slot->copied == slot->size) {
    pad_partial_locked(c, slot);
    /* The reader that completes a batch augments it (or enqueues it on
     * the device) right away, in parallel with the trainer. */
    if (!slot->prepared && !slot->preparing && !slot->drop &&
        slot->size > 0)
      prepare_unlocked(c, slot);
    pthread_cond_broadcast(&c->ready_cv);
  }
}

/* ---- Deterministic order ------------------------------------ */

/* The rank's position of the split's position p. */
static uint64_t det_pos(const ferry__split_t *s, uint64_t p) {
  return (uint64_t)(s->det_base + (int64_t)p);
}

/* Frees the split's held records. A block still being copied into (not
 * ready) is only unlinked: its copier frees it. */
static void det_drop_held_locked(ferry_client_t *c, ferry__split_t *s) {
  ferry__held_t *h = s->held;
  s->held = NULL;
  while (h != NULL) {
    ferry__held_t *next = h->next;
    c->det_held -= h->count;
    h->next = NULL;
    if (h->ready)
      ferry__free(h);
    else
      h->ready = true; /* orphaned: the copier sees it and frees it */
    h = next;
  }
}

/* Moves the rank's next position on by n; past the rank's last record of
 * the epoch it is the next epoch's first. */
static void det_advance_locked(ferry_client_t *c, uint64_t n) {
  c->det_next += n;
  uint64_t records = ferry__client_rk_records(c, c->det_epoch);
  if (records > 0 && c->det_next >= records) {
    c->det_epoch++;
    c->det_next = 0;
  }
}

/* Whether a slot of `epoch` can be had now without waiting. */
static bool slot_free_locked(const ferry_client_t *c, uint32_t epoch) {
  if (c->fill >= 0 && c->slots[c->fill].epoch == epoch)
    return true;
  if (pad_gate_locked(c, epoch))
    return false;
  for (uint32_t i = 0; i < c->ap.prefetch; i++)
    if (c->slots[i].state == FERRY__SLOT_FREE)
      return true;
  return false;
}

/* Positions are about to be skipped while records sit at offsets that
 * assumed they would come: the client fences (every batch not handed out
 * is dropped and its splits asked for again from what the trainer got)
 * and places nothing ahead from now on. Returns whether it did. Not
 * expected where det_ahead is on (no policy skip; a job whose records
 * stop short fails), but a wrong batch must never be handed out. */
static bool det_unplace_locked(ferry_client_t *c) {
  if (c->det_ahead_recs == 0)
    return false;
  c->det_ahead = false;
  ferry__client_fence_locked(c, false,
                             "deterministic order: positions the client "
                             "placed records after will not come");
  return true;
}

static bool det_bit(const ferry__slot_t *s, uint32_t i) {
  return (s->det_bits[i / 64] >> (i % 64)) & 1;
}

/* How many offsets from `at` on are free, up to the batch's end. */
static uint32_t det_free_run(const ferry_client_t *c, const ferry__slot_t *s,
                             uint32_t at) {
  uint32_t i = at;
  while (i < c->ap.batch_size && !det_bit(s, i))
    i++;
  return i - at;
}

/* Reserves offsets [at, at + n) of the slot for n records of (epoch,
 * split, key kw). */
static void det_reserve(ferry__slot_t *s, uint32_t epoch, uint32_t split,
                        uint64_t kw, uint32_t at, uint32_t n) {
  for (uint32_t i = at; i < at + n; i++)
    s->det_bits[i / 64] |= 1ull << (i % 64);
  s->size += n;
  add_seg(s, epoch, split, kw, n);
}

/* The fill slot's place in the queue (c->fill >= 0). */
static uint32_t fill_queue_index(const ferry_client_t *c) {
  uint32_t qi = 0;
  while (qi < c->qlen && c->queue[(c->qhead + qi) % c->ap.prefetch] !=
                             (uint32_t)c->fill)
    qi++;
  return qi;
}

/* After the next position moved: offsets placed ahead that it reached
 * are passed over (det_next moves past them), a full fill slot closes,
 * and the slot queued after it, if one was taken ahead, becomes the fill
 * slot. Returns whether it closed such a slot (taken ahead, its copies
 * may all be done: no copier sees it close). */
static bool det_settle_locked(ferry_client_t *c) {
  uint32_t b = c->ap.batch_size;
  bool closed_ahead = false;
  for (bool ahead = false; c->fill >= 0; ahead = true) {
    ferry__slot_t *f = &c->slots[c->fill];
    uint32_t run = 0;
    while (f->det_at + run < b && det_bit(f, f->det_at + run))
      run++;
    if (run > 0) {
      f->det_at += run;
      c->det_ahead_recs -= run;
      det_advance_locked(c, run);
    }
    if (f->size < b)
      break;
    uint32_t qi = fill_queue_index(c);
    close_fill_locked(c);
    closed_ahead |= ahead;
    if (qi + 1 >= c->qlen)
      break;
    uint32_t next = c->queue[(c->qhead + qi + 1) % c->ap.prefetch];
    ferry__slot_t *a = &c->slots[next];
    if (a->state != FERRY__SLOT_FILLING)
      break;
    if (a->epoch != c->det_epoch || a->det_first != c->det_next) {
      det_unplace_locked(c); /* never a batch out of its place */
      break;
    }
    c->fill = (int)next;
  }
  return closed_ahead;
}

/* Prepares a queued slot that closed with every copy done (closed by
 * det_settle_locked after its last copy: no copier saw it close). */
static void det_prepare_closed_locked(ferry_client_t *c) {
  for (uint32_t i = 0; i < c->qlen; i++) {
    ferry__slot_t *s = &c->slots[c->queue[(c->qhead + i) % c->ap.prefetch]];
    if (s->state == FERRY__SLOT_CLOSED && s->copied == s->size &&
        !s->prepared && !s->preparing && !s->drop && s->size > 0) {
      pad_partial_locked(c, s);
      prepare_unlocked(c, s);
      return; /* the lock was dropped: the queue may have moved */
    }
  }
}

/* Moves records of ch (split key kw) into slots while they are the rank's
 * next: from the split's `assembled` position up to `end`. A chunk off a
 * stream (from_net) moves `received` along; a held block's records were
 * received already. may_wait false: stops rather than wait for a slot.
 * Returns the records moved. */
static uint64_t det_place_locked(ferry_client_t *c, const ferry_chunk_t *ch,
                                 const ferry_chunk_src_t *src, uint64_t kw,
                                 uint64_t end, bool from_net, bool may_wait,
                                 const bool *stop) {
  uint64_t moved = 0, fences = c->fences;
  for (;;) {
    ferry__split_t *s = ferry__client_split_of(c, ch->epoch, ch->split, kw);
    /* A fence moved every count back: this chunk's place is unknown. */
    if (c->fences != fences)
      break;
    if (s == NULL || s->assembled >= end || s->assembled < ch->first ||
        (from_net && s->assembled != s->received) ||
        ch->epoch != c->det_epoch || det_pos(s, s->assembled) != c->det_next)
      break;
    if (!may_wait && !slot_free_locked(c, ch->epoch))
      break;
    if (!take_slot_locked(c, ch->epoch, stop))
      break;
    s = ferry__client_split_of(c, ch->epoch, ch->split, kw);
    if (c->fences != fences || s == NULL || s->assembled >= end ||
        s->assembled < ch->first ||
        (from_net && s->assembled != s->received) ||
        ch->epoch != c->det_epoch ||
        det_pos(s, s->assembled) != c->det_next || lease_lapsed_locked(c))
      break;
    ferry__slot_t *slot = &c->slots[c->fill];
    if (!slot->det_has_first) {
      slot->det_has_first = true;
      slot->det_first = c->det_next;
    }
    uint64_t off = s->assembled - ch->first;
    uint32_t base = slot->det_at;
    /* Up to the first offset placed ahead (det_settle_locked keeps
     * det_at on a free one). */
    uint32_t n = det_free_run(c, slot, base);
    if (n > end - s->assembled)
      n = (uint32_t)(end - s->assembled);
    if (n == 0)
      break;
    det_reserve(slot, ch->epoch, ch->split, kw, base, n);
    slot->det_at += n;
    s->assembled += n;
    if (from_net)
      s->received = s->assembled;
    det_advance_locked(c, n);
    moved += n;
    bool closed_ahead = det_settle_locked(c);
    copy_in_locked(c, slot, ch, src, off, base, n);
    if (closed_ahead)
      det_prepare_closed_locked(c);
  }
  return moved;
}

/* Takes a free slot, without waiting, for the whole batch of `epoch`
 * that starts at the rank's position `start`, after the slots queued
 * (records placed ahead, det_ahead_locked). NULL when none is free. */
static ferry__slot_t *det_take_ahead_locked(ferry_client_t *c,
                                            uint32_t epoch, uint64_t start) {
  if (pad_gate_locked(c, epoch))
    return NULL;
  for (uint32_t i = 0; i < c->ap.prefetch; i++) {
    ferry__slot_t *s = &c->slots[i];
    if (s->state != FERRY__SLOT_FREE)
      continue;
    open_slot_locked(c, i, epoch);
    s->det_has_first = true;
    s->det_first = start;
    return s;
  }
  return NULL;
}

/* Where the rank's position p of epoch `epoch` (after det_next, before
 * the epoch's `records`) goes: *slot and *at, in the fill slot past its
 * next offset or in a whole batch queued after it (taken now if a slot
 * is free). Returns false when it has no slot now. */
static bool det_locate_locked(ferry_client_t *c, uint32_t epoch, uint64_t p,
                              uint64_t records, ferry__slot_t **slot,
                              uint32_t *at) {
  uint32_t b = c->ap.batch_size;
  if (c->fill < 0) {
    if (!slot_free_locked(c, epoch) || !take_slot_locked(c, epoch, NULL))
      return false;
  }
  ferry__slot_t *f = &c->slots[c->fill];
  if (f->epoch != epoch)
    return false;
  if (!f->det_has_first) {
    f->det_has_first = true;
    f->det_first = c->det_next;
  }
  uint64_t off = f->det_at + (p - c->det_next);
  if (off < b) {
    *slot = f;
    *at = (uint32_t)off;
    return true;
  }
  /* The batches after the fill slot, each whole and inside the epoch. */
  uint64_t start = c->det_next + (b - f->det_at);
  uint32_t qi = fill_queue_index(c);
  uint64_t last = start + (p - start) / b * b; /* p's batch */
  if (last + b > records)
    return false;
  /* The slots up to p's batch that are not queued yet must all be free:
   * a batch between the fill slot and p's is taken empty, for the
   * records of the splits between. */
  uint64_t batches = (last - start) / b + 1;
  uint32_t queued = c->qlen - (qi + 1), free = 0;
  for (uint32_t i = 0; i < c->ap.prefetch; i++)
    free += c->slots[i].state == FERRY__SLOT_FREE;
  if (batches > (uint64_t)queued + free)
    return false;
  for (uint32_t k = qi + 1;; k++, start += b) {
    ferry__slot_t *a;
    if (k < c->qlen) {
      a = &c->slots[c->queue[(c->qhead + k) % c->ap.prefetch]];
      if (a->state != FERRY__SLOT_FILLING || a->epoch != epoch ||
          !a->det_has_first || a->det_first != start)
        return false;
    } else if ((a = det_take_ahead_locked(c, epoch, start)) == NULL) {
      return false;
    }
    if (p < start + b) {
      *slot = a;
      *at = (uint32_t)(p - start);
      return true;
    }
  }
}

/* Places records [received, end) of ch, which come before their turn,
 * straight into the slots their positions map to (det_locate_locked),
 * while det_ahead holds and they have a slot; the rest is held
 * (det_hold_locked). Every position before them comes (not under
 * policy skip, and det_skip_locked fences if one does not), so the
 * position of each offset is known when they arrive. Returns the records
 * placed. */
static uint64_t det_ahead_locked(ferry_client_t *c, const ferry_chunk_t *ch,
                                 const ferry_chunk_src_t *src, uint64_t kw,
                                 uint64_t end) {
  uint64_t placed = 0, fences = c->fences;
  for (;;) {
    ferry__split_t *s = ferry__client_split_of(c, ch->epoch, ch->split, kw);
    if (!c->det_ahead || c->fences != fences || s == NULL ||
        s->received >= end || s->received < ch->first ||
        s->received != s->assembled || ch->epoch != c->det_epoch ||
        lease_lapsed_locked(c))
      break;
    uint64_t p = det_pos(s, s->received);
    uint64_t records = ferry__client_rk_records(c, ch->epoch);
    if (p <= c->det_next || records == 0 || p >= records)
      break;
    ferry__slot_t *slot;
    uint32_t at;
    if (!det_locate_locked(c, ch->epoch, p, records, &slot, &at))
      break;
    uint32_t n = det_free_run(c, slot, at);
    if (n > end - s->received)
      n = (uint32_t)(end - s->received);
    if (n > records - p)
      n = (uint32_t)(records - p);
    if (n == 0)
      break;
    uint64_t off = s->received - ch->first;
    det_reserve(slot, ch->epoch, ch->split, kw, at, n);
    s->received += n;
    s->assembled = s->received;
    c->det_ahead_recs += n;
    c->det_ahead_total += n;
    placed += n;
    copy_in_locked(c, slot, ch, src, off, at, n);
  }
  return placed;
}

/* Keeps the records [received, end) of ch, which are not the rank's next
 * yet, until they are (det_feed_locked). */
static void det_hold_locked(ferry_client_t *c, const ferry_chunk_t *ch,
                            const ferry_chunk_src_t *src, uint64_t kw,
                            uint64_t end) {
  ferry__split_t *s = ferry__client_split_of(c, ch->epoch, ch->split, kw);
  if (s == NULL || s->received >= end || s->received < ch->first)
    return;
  /* Fenced meanwhile (this reader waited for a slot in det_place_locked
   * after the chunk was checked): nothing is taken until the lease is
   * renewed. The fence asked for this split again from its delivered
   * count. A block held now would outlive the fence that should have
   * dropped it, and det_feed_locked, finding the client fenced, would
   * free it with `received` past records nobody has: the rank waited
   * for them for ever (chaos seed 32006, found with readers that also
   * waited for their turn). */
  if (lease_lapsed_locked(c))
    return;
  size_t rb = c->record_bytes;
  uint32_t n = (uint32_t)(end - s->received);
  uint64_t off = s->received - ch->first;
  ferry__held_t *h = ferry__malloc(sizeof(*h) + (size_t)n * rb +
                                   (size_t)n * 2 * sizeof(int64_t));
  if (h == NULL) {
    ferry__client_fail_locked(c, FERRY_ENOMEM,
                              "client: out of memory for %u records that "
                              "wait for their turn", n);
    return;
  }
  h->labels = (int64_t *)(h + 1);
  h->ids = h->labels + n;
  h->images = (uint8_t *)(h->ids + n);
  h->first = s->received;
  h->count = n;
  h->ready = false;
  ferry__held_t **at = &s->held;
  while (*at != NULL && (*at)->first < h->first)
    at = &(*at)->next;
  h->next = *at;
  *at = h;
  s->received = end;
  c->det_held += n;
  if (c->det_held > c->det_held_peak)
    c->det_held_peak = c->det_held;
  pthread_mutex_unlock(&c->mu);
  size_t want = (size_t)n * rb;
  size_t got = src->copy(src, ch->payload_off + off * rb, h->images, want);
  if (ch->n_labels != 0)
    memcpy(h->labels, ch->labels + off, n * sizeof(int64_t));
  else
    memset(h->labels, 0, n * sizeof(int64_t));
  if (ch->n_ids != 0)
    memcpy(h->ids, ch->ids + off, n * sizeof(int64_t));
  else
    memset(h->ids, 0, n * sizeof(int64_t));
  pthread_mutex_lock(&c->mu);
  if (h->ready) {
    ferry__free(h); /* dropped meanwhile (a fence, the split's end) */
    return;
  }
  h->ready = true;
  if (got != want) {
    char why[160];
    snprintf(why, sizeof(why), "a chunk's payload could not be received "
             "(%zu of %zu bytes)", got, want);
    ferry__client_fence_locked(c, false, why);
  }
}

/* Moves the rank's next position past what cannot come: the rest of a
 * binding that ended short (policy skip), or the rest of an epoch the
 * dispatcher has no more of for this rank. Returns whether it moved. */
static bool det_skip_locked(ferry_client_t *c) {
  bool rest = c->hb_seen && (c->d_epoch > c->det_epoch ||
                             (c->d_epoch == c->det_epoch && c->d_exhausted));
  for (size_t i = 0; i < c->n_splits; i++) {
    const ferry__split_t *t = &c->splits[i];
    if (!t->det || t->epoch != c->det_epoch)
      continue;
    if (!fully_received(t)) {
      rest = false;
      continue;
    }
    if (det_pos(t, t->assembled) <= c->det_next && c->det_next < t->det_end) {
      if (det_unplace_locked(c))
        return false;
      det_advance_locked(c, t->det_end - c->det_next);
      return true;
    }
  }
  if (!rest || c->det_next == 0 || det_unplace_locked(c))
    return false;
  c->det_epoch++;
  c->det_next = 0;
  return true;
}

/* Moves held records into slots while they are the rank's next, one
 * thread at a time. may_wait false: only into slots free now (the
 * trainer's thread must not wait for a slot only it can free). Returns
 * whether anything moved. */
static bool det_feed_locked(ferry_client_t *c, bool may_wait,
                            const bool *stop) {
  if (!c->det || c->det_feeding)
    return false;
  bool any = false;
  c->det_feeding = true;
  while (c->fail_code == 0 && !c->stopping && !(stop != NULL && *stop)) {
    ferry__split_t *s = NULL;
    for (size_t i = 0; i < c->n_splits && s == NULL; i++) {
      ferry__split_t *t = &c->splits[i];
      if (t->det && t->epoch == c->det_epoch && t->held != NULL &&
          t->held->ready && t->held->first == t->assembled &&
          det_pos(t, t->assembled) == c->det_next)
        s = t;
    }
    if (s == NULL) {
      if (det_skip_locked(c))
        continue;
      break;
    }
    if (!may_wait && !slot_free_locked(c, s->epoch))
      break;
    ferry__held_t *h = s->held;
    s->held = h->next;
    h->next = NULL;
    c->det_held -= h->count;
    uint64_t kw = s->key;
    ferry_chunk_t hc = {.epoch = s->epoch, .split = s->split,
                        .lease = s->lease, .first = h->first,
                        .count = h->count, .labels = h->labels,
                        .n_labels = h->count, .ids = h->ids,
                        .n_ids = h->count};
    ferry_chunk_src_t src;
    ferry__chunk_src_bytes(&src, h->images, (size_t)h->count * c->record_bytes);
    uint64_t end = h->first + h->count, fences = c->fences;
    uint64_t moved = det_place_locked(c, &hc, &src, kw, end, false,
                                      may_wait, stop);
    any = any || moved > 0;
    s = ferry__client_split_of(c, hc.epoch, hc.split, kw);
    if (c->fences == fences && s != NULL && moved < h->count &&
        s->assembled >= h->first &&
        s->assembled < end && !c->stopping &&
        c->fail_code == 0 && !lease_lapsed_locked(c)) {
      /* Stopped for want of a free slot: the rest waits again. */
      uint64_t skip = s->assembled - h->first;
      uint32_t left = (uint32_t)(end - s->assembled);
      size_t rb = c->record_bytes;
      memmove(h->images, h->images + skip * rb, (size_t)left * rb);
      memmove(h->labels, h->labels + skip, left * sizeof(int64_t));
      memmove(h->ids, h->ids + skip, left * sizeof(int64_t));
      h->first = s->assembled;
      h->count = left;
      h->next = s->held; /* the first held: it is the next */
      s->held = h;
      c->det_held += left;
      break;
    }
    ferry__free(h);
    if (moved == 0)
      break;
  }
  c->det_feeding = false;
  return any;
}

/* Takes a chunk's records [received, end) in deterministic order: those
 * this client handed out already are skipped, those next go into slots,
 * the rest are held until their turn. A replay comes after the
 * dispatcher took the client's splits away (a new incarnation) and bound
 * them again from their acknowledged counts: the records after those
 * counts that the trainer had are counted delivered again (reported), or
 * the split would never complete. */
static void det_chunk_locked(ferry_client_t *c, const ferry_chunk_t *ch,
                             const ferry_chunk_src_t *src, uint64_t kw,
                             uint64_t end, const bool *stop) {
  ferry__split_t *s = ferry__client_split_of(c, ch->epoch, ch->split, kw);
  if (s == NULL || !s->det)
    return;
  if (s->received == s->assembled && s->held == NULL &&
      (ch->epoch < c->det_epoch ||
       (ch->epoch == c->det_epoch && det_pos(s, s->received) < c->det_next))) {
    uint64_t upto = end;
    if (ch->epoch == c->det_epoch && det_pos(s, end) > c->det_next)
      upto = (uint64_t)((int64_t)c->det_next - s->det_base);
    if (upto > s->received)
      s->received = s->assembled = upto;
    if (upto > s->delivered) {
      s->delivered = upto;
      kick_locked(c);
    }
  }
  if (s->received >= end)
    return;
  det_place_locked(c, ch, src, kw, end, true, true, stop);
  det_ahead_locked(c, ch, src, kw, end);
  det_hold_locked(c, ch, src, kw, end);
}

/* Takes a chunk's records [received, end) in arrival order: into the
 * fill slot, whichever split they are of. */
static void arrival_chunk_locked(ferry_client_t *c, const ferry_chunk_t *ch,
                                 const ferry_chunk_src_t *src, uint64_t kw,
                                 uint64_t end, const bool *stop) {
  for (;;) {
    /* Re-read after every unlock: another reader may have taken the same
     * positions from a re-leased duplicate meanwhile. */
    ferry__split_t *s = ferry__client_split_of(c, ch->epoch, ch->split, kw);
    if (s == NULL || s->received >= end || s->received < ch->first)
      break;
    if (!take_slot_locked(c, ch->epoch, stop))
      break;
    /* A fence while waiting for a slot moves received back below this
     * chunk, or drops the split. */
    s = ferry__client_split_of(c, ch->epoch, ch->split, kw);
    if (s == NULL || s->received >= end || s->received < ch->first ||
        !split_taken_locked(s, ch->lease) || lease_lapsed_locked(c))
      break;
    ferry__slot_t *slot = &c->slots[c->fill];
    uint64_t off = s->received - ch->first;
    uint32_t n = c->ap.batch_size - slot->size;
    if (n > end - s->received)
      n = (uint32_t)(end - s->received);
    uint32_t base = reserve_locked(c, ch->epoch, ch->split, kw, n);
    s->received += n;
    copy_in_locked(c, slot, ch, src, off, base, n);
  }
}

int ferry__client_on_chunk(ferry_client_t *c, const ferry_chunk_t *ch,
                           const ferry_chunk_src_t *src, const bool *stop) {
  const ferry__asm_params_t *ap = &c->ap;
  int rc = 0;
  pthread_mutex_lock(&c->mu);
  if (ch->error_code != 0) {
    ferry__client_fail_locked(c, ch->error_code, "%s",
                              ch->error[0] ? ch->error
                                           : ferry_strerror(ch->error_code));
    goto out;
  }
  if (ch->count > 0 && (ch->height != ap->height || ch->width != ap->width ||
                        ch->channels != ap->channels)) {
    ferry__client_fail_locked(
        c, FERRY_ESHAPE,
        "epoch %u split %u position %llu: chunk images are %ux%ux%u, the "
        "batch takes %ux%ux%u", ch->epoch, ch->split,
        (unsigned long long)ch->first, ch->height, ch->width, ch->channels,
        ap->height, ap->width, ap->channels);
    goto out;
  }
  /* Every record of an epoch the dispatcher counts delivered was handed
   * out, and its split entries are gone: a late copy (a replaying stream,
   * a re-leased duplicate) would look like a new split. */
  if (c->hb_seen && ch->epoch < c->d_epochs_done)
    goto out;
  uint64_t kw = ferry__client_split_key(c, ch->worker_id, ch->lease);
  ferry__split_t *s;
  /* Fenced: nothing is taken until the lease is renewed, and a split
   * still held must then come again from its delivered count. */
  if (lease_lapsed_locked(c)) {
    s = ferry__client_split_of(c, ch->epoch, ch->split, kw);
    if (s != NULL && s->assigned && ch->count > 0)
      mark_restart_locked(c, s, ch->lease, false);
    /* The chunk may be of a lease the answer that lifts the fence brings
     * (after a rejoin the split table is new). */
    note_dropped_locked(c, ch, kw);
    goto out;
  }
  if (c->networked) {
    /* Only splits the dispatcher lists for this client are taken. */
    if ((s = held_split_locked(c, ch, kw, stop)) == NULL)
      goto out;
  } else if ((s = split_get(c, ch->epoch, ch->split, kw)) == NULL) {
    ferry__client_fail_locked(c, FERRY_ENOMEM, "client: out of memory");
    goto out;
  }
  if (!split_taken_locked(s, ch->lease)) {
    FERRY_LOG(FERRY_LOG_DEBUG,
              "client: a chunk of epoch %u split %u at lease %llu, which "
              "this client gave up: dropped", ch->epoch, ch->split,
              (unsigned long long)ch->lease);
    goto out;
  }
  /* The binding was cut and this client has all of its range:
   * the rest of the split is another rank's. */
  if (s->cut > 0 && s->received >= s->cut)
    goto out;
  /* Records of this lease are being taken: it is not given up now. */
  if (ch->count > 0 && ch->lease > s->got_lease)
    s->got_lease = ch->lease;
  bool was_received = fully_received(s);
  if (ch->first > s->received) {
    /* A gap: records in between were lost in transit (a stream that
     * broke while its worker went on), so this lease cannot complete the
     * split: ask the dispatcher for a new one from `delivered`. */
    FERRY_LOG(FERRY_LOG_DEBUG,
              "client: epoch %u split %u: chunk at position %llu but %llu "
              "expected; dropped", ch->epoch, ch->split,
              (unsigned long long)ch->first,
              (unsigned long long)s->received);
    mark_restart_locked(c, s, ch->lease, false);
    goto out;
  }
  if (ch->lease > s->lease)
    s->lease = ch->lease;
  if (ch->last) {
    s->last_total = ch->first + ch->count;
    s->has_total = true;
    s->total = s->cut > 0 && s->cut < s->last_total ? s->cut : s->last_total;
  }
  uint64_t end = ch->first + ch->count;
  if (s->cut > 0 && end > s->cut)
    end = s->cut;
  if (c->det) {
    det_chunk_locked(c, ch, src, kw, end, stop);
    det_feed_locked(c, true, stop);
  } else {
    arrival_chunk_locked(c, ch, src, kw, end, stop);
  }
  /* Fully received: the client may take more splits now. */
  s = ferry__client_split_of(c, ch->epoch, ch->split, kw);
  if (s != NULL && !was_received && fully_received(s) &&
      room_for_splits_locked(c))
    kick_locked(c);
  maybe_flush_locked(c);
out:
  rc = c->fail_code;
  pthread_mutex_unlock(&c->mu);
  return rc;
}

/* ---- Heartbeat answers ------------------------------------------------- */

static void apply_locked(ferry_client_t *c,
                         const Ferry__V1__ClientHeartbeatResponse *r) {
  c->hb_applied++;
  c->rejoined = c->have_incarnation && r->incarnation != c->incarnation;
  /* What a trainer waiting in vain is told (ferry__client_why_locked). */
  c->d_has_counts = r->worker_counts != NULL;
  if (r->worker_counts != NULL) {
    c->d_serving = r->worker_counts->serving;
    c->d_draining = r->worker_counts->draining;
    c->d_lost = r->worker_counts->lost;
    c->d_left = r->worker_counts->left;
    c->d_avoided = r->worker_counts->avoided;
  }
  /* Another incarnation: the dispatcher declared this client lost (or
   * its stream stalled) and gave every split it held to other clients,
   * from what it had acknowledged. Whatever was not handed out is not
   * ours to hand out any more. */
  if (c->have_incarnation && r->incarnation != c->incarnation) {
    char why[120];
    snprintf(why, sizeof(why),
             "the dispatcher took our splits away (incarnation %llu -> %llu)",
             (unsigned long long)c->incarnation,
             (unsigned long long)r->incarnation);
    ferry__client_fence_locked(c, true, why);
  }
  c->have_incarnation = true;
  c->incarnation = r->incarnation;
  if (!c->hb_seen) {
    c->cur_epoch = r->epoch;
    /* The rank's steps taken before this client joined count only for
     * the epoch they were taken in. */
    if (c->rk_epoch != c->cur_epoch) {
      c->rk_epoch = c->cur_epoch;
      c->rk_handed = 0;
    }
  }
  c->hb_seen = true;
  c->job_state = r->state;
  c->d_epoch = r->epoch;
  c->d_exhausted = r->epoch_exhausted;
  c->d_epochs_done = r->epochs_done;
  if (r->state == FERRY__V1__JOB_STATE__JOB_STATE_FAILED)
    ferry__client_fail_locked(c, r->error_code < 0 ? r->error_code
                                                   : FERRY_EIO,
                              "job failed: %s",
                              r->error && r->error[0] ? r->error
                                                      : "(no message)");
  /* The error says "job J cancelled by the operator". */
  else if (r->state == FERRY__V1__JOB_STATE__JOB_STATE_CANCELLED)
    ferry__client_fail_locked(c, FERRY_ECANCELED, "%s",
                              r->error && r->error[0]
                                  ? r->error
                                  : "job cancelled by the operator");
  for (size_t i = 0; i < c->n_splits; i++) {
    c->splits[i].was_assigned = c->splits[i].assigned;
    c->splits[i].assigned = false;
  }
  size_t known = c->n_splits;
  for (size_t i = 0; i < r->n_assignments; i++) {
    const Ferry__V1__Assignment *a = r->assignments[i];
    uint64_t kw = ferry__client_split_key(c, a->worker_id, a->lease);
    bool fresh = ferry__client_split_of(c, a->epoch, a->split, kw) == NULL;
    ferry__split_t *s = split_get(c, a->epoch, a->split, kw);
    if (s == NULL) {
      ferry__client_fail_locked(c, FERRY_ENOMEM, "client: out of memory");
      break;
    }
    /* A split new to this client counts from where the dispatcher's
     * acknowledged count stands (it may have moved from another client):
     * its chunks start there, and a count from 0 would see a gap. */
    if (fresh)
      s->received = s->delivered = s->assembled = a->start;
    /* Where the split's records stand in the rank's share. */
    if (c->det) {
      s->det = true;
      s->det_base = (int64_t)a->rank_index - (int64_t)a->start;
      s->det_end = det_pos(s, a->end > 0 ? a->end : a->num_records);
    }
    /* A new grant (or the first): a lease newer than one given up is
     * taken again. */
    if (fresh || a->lease > s->grant_lease) {
      s->grant_lease = a->lease;
      s->released = false;
    }
    s->unread = a->unread && a->lease == s->grant_lease;
    /* A chunk of this split at this lease was dropped while the split
     * was not listed yet: its records must come again. */
    for (uint32_t k = 0; k < FERRY__DROPPED; k++) {
      ferry__dropped_t *d = &c->dropped[k];
      if (!d->used || d->epoch != a->epoch || d->split != a->split ||
          d->kw != kw)
        continue;
      d->used = false;
      if (d->lease >= a->lease && !fully_received(s))
        mark_restart_locked(c, s, d->lease, false);
    }
    s->assigned = true;
    s->worker_id = a->worker_id;
    if (a->lease > s->lease)
      s->lease = a->lease;
    /* The restart asked for came: the new lease replays from delivered
     * and the received count drops what was already taken. Only the
     * answer to the heartbeat that carried it says so (heartbeats go one
     * at a time): a lease newer than the one a restart names may predate
     * the loss, its chunks lost in the same broken stream (chaos seed
     * 20266: a stopped client, a dispatcher restarted meanwhile). */
    if (s->restart == FERRY__RESTART_SENT && a->lease > s->restart_lease) {
      s->restart = FERRY__RESTART_NONE;
      s->restart_current = false;
    }
    /* A binding cut for this rank ends at `end`; the split's
     * own total (its last chunk's, else the scan's) ends it otherwise. */
    if (a->end != s->cut) {
      s->cut = a->end;
      uint64_t whole = s->last_total > 0 ? s->last_total : a->num_records;
      s->has_total = s->cut > 0 || whole > 0;
      s->total = s->cut > 0 && (whole == 0 || s->cut < whole) ? s->cut
                                                               : whole;
    }
    /* A total from the split's last chunk wins: under policy skip it is
     * below the scan's count. */
    if (a->num_records > 0 && !s->has_total) {
      s->has_total = true;
      s->total = a->num_records;
    }
  }
  /* A split the dispatcher stops listing while the job runs (the
   * incarnation is the same: a rejoin dropped the table above) is done
   * there: it counted delivered == total, from this client's reports or,
   * for a split whose every record was skipped (a truncated file's
   * tail), from the worker's total of 0 alone. Nothing more of it comes:
   * its total is what was received. Its last chunk (empty: total 0) may
   * come after this answer and be dropped as not listed, and without
   * this the split stayed unfinished and the epoch's partial batch was
   * never flushed: the trainer waited for ever. */
  if (r->state == FERRY__V1__JOB_STATE__JOB_STATE_RUNNING)
    for (size_t i = 0; i < c->n_splits; i++) {
      ferry__split_t *s = &c->splits[i];
      /* Not a split given up: it went back to the pool, not done. */
      if (s->was_assigned && !s->assigned && s->epoch <= r->epoch &&
          !fully_received(s) && !s->released) {
        FERRY_LOG(FERRY_LOG_DEBUG,
                  "client: epoch %u split %u is done at the dispatcher "
                  "after %llu records (%s): counted complete",
                  s->epoch, s->split, (unsigned long long)s->received,
                  s->has_total ? "fewer than its count" : "count unknown");
        s->has_total = true;
        s->total = s->received;
      }
    }
  /* Granted new splits and still short of splits_in_flight (some were
   * taken away, or received meanwhile): ask again at once. Without a
   * grant the dispatcher has none to give (or no epoch yet): the interval
   * paces the asking. */
  if (c->n_splits > known && !r->epoch_exhausted &&
      room_for_splits_locked(c))
    kick_locked(c);
  /* Entries of finished epochs are no longer needed once the dispatcher
   * stopped listing them. */
  size_t k = 0;
  for (size_t i = 0; i < c->n_splits; i++)
    if (!(c->splits[i].epoch < r->epochs_done && !c->splits[i].assigned) &&
        !(c->splits[i].released && !c->splits[i].assigned))
      c->splits[k++] = c->splits[i];
    else
      det_drop_held_locked(c, &c->splits[i]);
  c->n_splits = k;
  maybe_flush_locked(c);
  pthread_cond_broadcast(&c->ready_cv);
}

void ferry__client_apply_heartbeat(
    ferry_client_t *c, const Ferry__V1__ClientHeartbeatResponse *r) {
  pthread_mutex_lock(&c->mu);
  apply_locked(c, r);
  pthread_mutex_unlock(&c->mu);
}

void ferry__client_answer(ferry_client_t *c, double t_send, uint64_t records,
                          const Ferry__V1__ClientHeartbeatResponse *r) {
  /* One critical section: no chunk may see the new assignments while
   * the fence the answer lifts still holds (it would be dropped). */
  pthread_mutex_lock(&c->mu);
  apply_locked(c, r);
  renew_locked(c, t_send, records, r);
  pthread_mutex_unlock(&c->mu);
}

/* ---- The trainer's side ------------------------------------------------ */

/* Adds a slot's records to their splits' delivered counts. */
static void account_locked(ferry_client_t *c, const ferry__slot_t *slot) {
  for (uint32_t i = 0; i < slot->n_segs; i++) {
    const ferry__seg_t *g = &slot->segs[i];
    ferry__split_t *s = ferry__client_split_of(c, g->epoch, g->split,
                                                g->key);
    if (s == NULL)
      continue;
    s->delivered += g->count;
    /* Tell the dispatcher soon when the split's end may end its epoch
     * (the dispatcher has no unassigned split of it left); otherwise the
     * next beat reports it. */
    if (s->has_total && s->delivered >= s->total &&
        (s->epoch < c->d_epoch || c->d_exhausted))
      kick_locked(c);
  }
}

/* True while a slot still holds or expects records of epoch <= e. */
static bool pending_locked(const ferry_client_t *c, uint32_t e) {
  for (uint32_t i = 0; i < c->qlen; i++) {
    const ferry__slot_t *s = &c->slots[c->queue[(c->qhead + i) %
                                                c->ap.prefetch]];
    if (s->epoch <= e && s->size > 0)
      return true;
  }
  return false;
}

static void pop_locked(ferry_client_t *c) {
  c->qhead = (c->qhead + 1) % c->ap.prefetch;
  c->qlen--;
}

/* Whether epoch e can bring this rank no more records: the dispatcher
 * has none left to bind to it (a later epoch runs, or the rank's quota
 * is all bound), every split it holds in e is fully received, and no
 * slot of e is still queued. */
static bool rank_epoch_over_locked(const ferry_client_t *c, uint32_t e) {
  if (!c->hb_seen || !(c->d_epoch > e || (c->d_epoch == e && c->d_exhausted)))
    return false;
  for (size_t i = 0; i < c->n_splits; i++)
    if (c->splits[i].epoch == e && !fully_received(&c->splits[i]))
      return false;
  return !pending_locked(c, e);
}

/* Whether the trainer's epoch still owes this rank batches of no real
 * record: fewer than steps_per_epoch handed out, in an epoch the job has
 * (num_epochs -1: forever). */
static bool owes_pad_locked(const ferry_client_t *c) {
  return padding(c) &&
         c->rk_handed < ferry__client_rk_steps(c, c->cur_epoch) &&
         (c->num_epochs < 0 || c->cur_epoch < (uint64_t)c->num_epochs);
}

/* Whether the trainer's epoch is over for this rank without waiting for
 * the dispatcher to say the whole epoch is (which comes with the next
 * heartbeat after the slowest rank's last report): it had its
 * steps_per_epoch batches, nothing of the epoch can still come for it,
 * and the dispatcher acknowledged every record it handed out (so a
 * record of its tail cannot come again in this epoch, but for a client
 * declared lost meanwhile, whose acknowledgements stop). */
static bool rank_done_locked(const ferry_client_t *c) {
  return c->ranked &&
         c->rk_handed >= ferry__client_rk_steps(c, c->cur_epoch) &&
         (c->num_epochs < 0 || c->cur_epoch < (uint64_t)c->num_epochs) &&
         c->records_acked >= c->records &&
         rank_epoch_over_locked(c, c->cur_epoch);
}

/* ferry_next returns FERRY_EPOCH_END: the rank's count starts over. */
static void epoch_end_locked(ferry_client_t *c) {
  c->cur_epoch++;
  c->rk_epoch = c->cur_epoch;
  c->rk_handed = 0;
  pthread_cond_broadcast(&c->space_cv); /* pad_gate_locked may open */
}

/* A batch of no real record for the trainer's epoch, in a free slot (NULL:
 * none is free): batch_size copies of pad_image (zeros before any record
 * was handed out). */
static ferry__slot_t *pad_slot_locked(ferry_client_t *c) {
  ferry__slot_t *s = NULL;
  for (uint32_t i = 0; i < c->ap.prefetch && s == NULL; i++)
    if (c->slots[i].state == FERRY__SLOT_FREE)
      s = &c->slots[i];
  if (s == NULL)
    return NULL;
  uint32_t b = c->ap.batch_size;
  size_t rb = c->record_bytes;
  s->state = FERRY__SLOT_CLOSED;
  s->size = s->copied = b;
  s->n_segs = 0;
  s->epoch = c->cur_epoch;
  s->drop = false;
  s->padded = s->pad_only = true;
  s->num_real = 0;
  s->det_has_first = false;
  s->prepared = c->stg_mode == FERRY__STG_RAW;
  s->preparing = false;
  for (uint32_t i = 0; i < b; i++) {
    if (c->has_pad_rec)
      memcpy(s->images + (size_t)i * rb, c->pad_image, rb);
    else
      memset(s->images + (size_t)i * rb, 0, rb);
    s->labels[i] = c->has_pad_rec ? c->pad_label : 0;
    s->ids[i] = c->has_pad_rec ? c->pad_id : 0;
  }
  s->index = c->next_index++;
  return s;
}

/* Keeps a copy of the batch's first record: what batches of no real
 * record repeat. */
static void keep_pad_record_locked(ferry_client_t *c, const ferry__slot_t *s) {
  if (!padding(c) || s->pad_only || s->size == 0)
    return;
  if (c->pad_image == NULL &&
      (c->pad_image = ferry__malloc(c->record_bytes)) == NULL)
    return; /* the next batch tries again; zeros meanwhile */
  memcpy(c->pad_image, s->images, c->record_bytes);
  c->pad_label = s->labels[0];
  c->pad_id = s->ids[0];
  c->has_pad_rec = true;
}

/* Hands slot s out to the trainer. */
static void hand_out_locked(ferry_client_t *c, ferry__slot_t *s,
                            const ferry_batch_t **batch) {
  uint32_t real = s->padded ? s->num_real : s->size;
  s->state = FERRY__SLOT_HANDED;
  s->batch.size = s->size;
  s->batch.num_real = real;
  s->batch.epoch = s->epoch;
  s->batch.index = s->index;
  keep_pad_record_locked(c, s);
  if (c->ranked)
    c->rk_handed++;
  c->handed++;
  c->batches++;
  c->records += real;
  c->bytes += (uint64_t)real * c->record_bytes;
  *batch = &s->batch;
}

int ferry_next(ferry_client_t *c, const ferry_batch_t **batch, int timeout_ms,
               ferry_error_t *err) {
  double t_start = ferry__client_now();
  struct timespec deadline =
      ferry__client_deadline(timeout_ms > 0 ? (uint32_t)timeout_ms : 0);
  int rc;
  *batch = NULL;
  if ((rc = ferry__client_forked(c, err)) != 0)
    return rc;
  pthread_mutex_lock(&c->mu);
  c->next_since = t_start;
  if (!c->reading) {
    /* The first call: the client asks for splits from now on, at once. */
    c->reading = true;
    kick_locked(c);
  }
  for (;;) {
    if (c->fail_code != 0) {
      rc = ferry__seterr(err, c->fail_code, "%s", c->fail_msg);
      break;
    }
    if (c->ended) {
      rc = FERRY_END;
      break;
    }
    /* Past the lease nothing is handed out (the fence empties the
     * queue); a renewal brings new records. */
    (void)lease_lapsed_locked(c);
    if (c->qlen > 0) {
      ferry__slot_t *s = &c->slots[c->queue[c->qhead]];
      if (s->state == FERRY__SLOT_CLOSED && s->copied == s->size) {
        if (s->drop || s->size == 0) {
          account_locked(c, s);
          s->state = FERRY__SLOT_FREE;
          pop_locked(c);
          pthread_cond_broadcast(&c->space_cv);
          continue;
        }
        if (c->hb_seen && s->epoch > c->cur_epoch) {
          epoch_end_locked(c);
          rc = FERRY_EPOCH_END;
          break;
        }
        pad_partial_locked(c, s);
        if (!s->prepared && !s->preparing) {
          /* No reader prepared it (a flushed batch): the trainer's thread
           * does, and the time counts as its wait. */
          prepare_unlocked(c, s);
          continue;
        }
      }
      if (s->state == FERRY__SLOT_CLOSED && s->copied == s->size &&
          s->prepared) {
        pop_locked(c);
        account_locked(c, s);
        hand_out_locked(c, s, batch);
        rc = 0;
        break;
      }
    }
    /* The rank's records of this epoch are all out and it has
     * had fewer than steps_per_epoch batches: one of no real record. */
    if (owes_pad_locked(c) && c->handed < c->ap.prefetch &&
        rank_epoch_over_locked(c, c->cur_epoch)) {
      ferry__slot_t *s = pad_slot_locked(c);
      if (s != NULL) {
        if (!s->prepared)
          prepare_unlocked(c, s);
        if (c->fail_code != 0) {
          s->state = FERRY__SLOT_FREE;
          continue;
        }
        hand_out_locked(c, s, batch);
        rc = 0;
        break;
      }
    }
    bool owes = owes_pad_locked(c);
    if (rank_done_locked(c)) {
      epoch_end_locked(c);
      rc = FERRY_EPOCH_END;
      break;
    }
    /* And the job's end after a rank's last epoch. */
    if (c->ranked && c->num_epochs > 0 &&
        c->cur_epoch >= (uint64_t)c->num_epochs &&
        !pending_locked(c, UINT32_MAX)) {
      c->ended = true;
      rc = FERRY_END;
      break;
    }
    if (c->hb_seen && c->d_epochs_done > c->cur_epoch && !owes &&
        !pending_locked(c, c->cur_epoch)) {
      epoch_end_locked(c);
      rc = FERRY_EPOCH_END;
      break;
    }
    if (c->hb_seen &&
        c->job_state == FERRY__V1__JOB_STATE__JOB_STATE_FINISHED && !owes &&
        !pending_locked(c, UINT32_MAX)) {
      c->ended = true;
      rc = FERRY_END;
      break;
    }
    if (c->handed == c->ap.prefetch) {
      rc = ferry__seterr(err, FERRY_EINVAL,
                         "client: all %u batches are held: release one "
                         "before asking for more", c->ap.prefetch);
      break;
    }
    /* Deterministic order: held records that became the next (an
     * answer ended a split short or the epoch) go into free slots; the
     * epoch's last records among them may leave its short last batch
     * to flush (no reader comes again to do it). */
    if (det_feed_locked(c, false, NULL)) {
      maybe_flush_locked(c);
      continue;
    }
    if (timeout_ms == 0) {
      rc = ferry__seterr(err, FERRY_ETIMEDOUT, "client: no batch ready");
      break;
    }
    if (timeout_ms < 0) {
      pthread_cond_wait(&c->ready_cv, &c->mu);
    } else if (pthread_cond_timedwait(&c->ready_cv, &c->mu, &deadline) ==
               ETIMEDOUT) {
      /* Say why when the client knows: a timeout alone sent operators
       * to --verbose logs for a drained or unreachable worker. */
      char why[384];
      ferry__client_why_locked(c, why, sizeof(why));
      rc = ferry__seterr(err, FERRY_ETIMEDOUT,
                         "client: no batch within %d ms%s%s", timeout_ms,
                         why[0] ? ": " : "", why);
      break;
    }
  }
  c->wait_s += ferry__client_now() - t_start;
  c->next_since = 0;
  pthread_mutex_unlock(&c->mu);
  return rc;
}

double ferry__client_waited_locked(const ferry_client_t *c, double now) {
  return c->wait_s + (c->next_since > 0 && now > c->next_since
                          ? now - c->next_since
                          : 0);
}

/* The slot a batch pointer belongs to, or NULL. */
static ferry__slot_t *slot_of(ferry_client_t *c, const ferry_batch_t *b) {
  for (uint32_t i = 0; i < c->ap.prefetch; i++)
    if (&c->slots[i].batch == b)
      return &c->slots[i];
  return NULL;
}

static void release(ferry_client_t *c, const ferry_batch_t *batch,
                    bool ordered, void *stream) {
  /* A forked child's batches are the parent's slots: nothing to give. */
  if (c == NULL || batch == NULL || ferry__client_forked(c, NULL) != 0)
    return;
  ferry__slot_t *s = slot_of(c, batch);
  if (s == NULL)
    return;
  /* The device side first, outside the lock: the slot must not be
   * refilled before its copy to the device is done. */
  ferry_error_t e = {0};
  int rc = ferry__staging_release(c, s, ordered, stream, &e);
  pthread_mutex_lock(&c->mu);
  if (rc != 0)
    ferry__client_fail_locked(c, rc, "releasing batch %llu: %s",
                              (unsigned long long)s->index, e.msg);
  if (s->state == FERRY__SLOT_HANDED) {
    s->state = FERRY__SLOT_FREE;
    s->exported = false;
    c->handed--;
    pthread_cond_broadcast(&c->space_cv);
  }
  pthread_mutex_unlock(&c->mu);
}

void ferry_batch_release(ferry_client_t *c, const ferry_batch_t *batch) {
  release(c, batch, false, NULL);
}

void ferry_batch_release_after(ferry_client_t *c, const ferry_batch_t *batch,
                               void *stream) {
  release(c, batch, true, stream);
}

int ferry_batch_wait_stream(ferry_client_t *c, const ferry_batch_t *batch,
                            void *stream, ferry_error_t *err) {
  if (c == NULL || batch == NULL)
    return ferry__seterr(err, FERRY_EINVAL,
                         "batch_wait_stream: no client or no batch");
  int rc = ferry__client_forked(c, err);
  if (rc != 0)
    return rc;
  ferry__slot_t *s = slot_of(c, batch);
  if (s == NULL)
    return ferry__seterr(err, FERRY_EINVAL,
                         "batch_wait_stream: not a batch of this client");
  pthread_mutex_lock(&c->mu);
  bool held = s->state == FERRY__SLOT_HANDED;
  unsigned long long index = (unsigned long long)s->index;
  pthread_mutex_unlock(&c->mu);
  if (!held)
    return ferry__seterr(err, FERRY_EINVAL,
                         "batch_wait_stream: batch %llu is not held (already "
                         "released?)",
                         index);
  return ferry__staging_wait_stream(c, s, stream, err);
}

void ferry_client_stats_sized(ferry_client_t *c, ferry_client_stats_t *user,
                              size_t size) {
  /* Filled whole here; the caller gets the `size` bytes its header
   * declared (an older caller's struct lacks the fields appended since). */
  ferry_client_stats_t st, *out = &st;
  memset(out, 0, sizeof(*out));
  /* A forked child gets zeros: the counters sit under a lock a parent
   * thread may have held at the fork. */
  if (ferry__client_forked(c, NULL) != 0) {
    if (user != NULL)
      memset(user, 0, size);
    return;
  }
  pthread_mutex_lock(&c->mu);
  out->batches = c->batches;
  out->records = c->records;
  out->bytes = c->bytes;
  double now = ferry__client_now();
  out->wait_seconds = ferry__client_waited_locked(c, now);
  out->total_seconds = now - c->t0;
  out->stall_fraction =
      out->total_seconds > 0 ? out->wait_seconds / out->total_seconds : 0;
  out->records_acked = c->records_acked;
  out->held_records_peak = c->det_held_peak;
  out->records_placed_ahead = c->det_ahead_total;
  for (size_t i = 0; i < c->n_workers; i++)
    if (!c->workers[i]->ended)
      out->workers++;
  pthread_mutex_unlock(&c->mu);
  if (user == NULL)
    return;
  memcpy(user, &st, size < sizeof(st) ? size : sizeof(st));
  if (size > sizeof(st)) /* a newer caller: fields this library lacks */
    memset((char *)user + sizeof(st), 0, size - sizeof(st));
}
