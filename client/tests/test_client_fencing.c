/* Fencing without daemons (docs/ARCHITECTURE.md "Exactly
 * once"): a client hands out batches only while its lease holds, drops
 * what it had not handed out when the lease lapses, when the dispatcher
 * stops renewing it or takes its splits away (a new incarnation), takes
 * chunks only of splits it holds, and counts a split new to it from the
 * assignment's start.
 *
 * The clients here are the assembler alone (ferry__client_new_local)
 * switched to the networked rules: heartbeat answers go in through
 * ferry__client_apply_heartbeat and ferry__client_renew, chunks through
 * ferry__client_on_chunk. */
#include <criterion/criterion.h>
#include <pthread.h>

#include "client_test_util.h"

#define H 2
#define W 3
#define C 1
#define REC (H * W * C)
#define TIMEOUT_MS 1000

static ferry_client_t *networked(uint32_t batch, uint32_t prefetch) {
  ferry__asm_params_t ap = {.batch_size = batch, .height = H, .width = W,
                            .channels = C, .prefetch = prefetch};
  ferry_client_t *c;
  ferry_error_t err = {0};
  cr_assert_eq(ferry__client_new_local(&ap, &c, &err), 0, "%s", err.msg);
  c->networked = true;
  c->networked_lease = true;
  c->client_timeout_ms = TIMEOUT_MS;
  c->lease_until = ferry__client_now() + 60; /* renewed by the tests */
  return c;
}

static int feed(ferry_client_t *c, uint32_t split, uint64_t first,
                uint32_t count, bool last) {
  tu_chunk_opts_t o = {.epoch = 0, .split = split, .first = first,
                       .count = count, .h = H, .w = W, .c = C, .last = last};
  return tu_feed(c, &o, 1, 7);
}

/* A heartbeat answer of epoch 0 listing `n` splits (total 100 each) with
 * their start positions, under `incarnation`. */
static void beat(ferry_client_t *c, uint64_t incarnation,
                 const uint32_t *splits, const uint64_t *starts, size_t n) {
  Ferry__V1__ClientHeartbeatResponse r =
      FERRY__V1__CLIENT_HEARTBEAT_RESPONSE__INIT;
  Ferry__V1__Assignment a[8], *pa[8];
  cr_assert_leq(n, 8);
  for (size_t i = 0; i < n; i++) {
    ferry__v1__assignment__init(&a[i]);
    a[i].split = splits[i];
    a[i].num_records = 100;
    a[i].worker_id = 1;
    a[i].lease = 1;
    a[i].start = starts != NULL ? starts[i] : 0;
    pa[i] = &a[i];
  }
  r.n_assignments = n;
  r.assignments = pa;
  r.error = (char *)"";
  r.incarnation = incarnation;
  r.client_timeout_ms = TIMEOUT_MS;
  ferry__client_apply_heartbeat(c, &r);
}

static void renew(ferry_client_t *c, bool fenced) {
  Ferry__V1__ClientHeartbeatResponse r =
      FERRY__V1__CLIENT_HEARTBEAT_RESPONSE__INIT;
  r.client_timeout_ms = TIMEOUT_MS;
  r.fenced = fenced;
  ferry__client_renew(c, ferry__client_now(), 0, &r);
}

static int next(ferry_client_t *c, const ferry_batch_t **b) {
  return ferry_next(c, b, 0, NULL);
}

static ferry__split_t *entry(ferry_client_t *c, uint32_t split) {
  pthread_mutex_lock(&c->mu);
  ferry__split_t *s = ferry__client_split(c, 0, split);
  pthread_mutex_unlock(&c->mu);
  return s;
}

Test(client_fencing, a_split_new_to_the_client_counts_from_its_start) {
  ferry_client_t *c = networked(4, 3);
  const ferry_batch_t *b;
  uint32_t split = 3;
  uint64_t start = 40;
  beat(c, 0, &split, &start, 1);
  cr_assert_eq(entry(c, 3)->received, 40);
  cr_assert_eq(entry(c, 3)->delivered, 40);
  /* The chunks of the moved split start there: no gap, no restart. */
  cr_assert_eq(feed(c, 3, 40, 4, false), 0);
  cr_assert_eq(entry(c, 3)->restart, FERRY__RESTART_NONE);
  cr_assert_eq(next(c, &b), 0);
  cr_assert_eq(b->size, 4);
  for (uint32_t i = 0; i < 4; i++)
    cr_assert_eq(b->ids[i], tu_id(3, 40 + i));
  ferry_batch_release(c, b);
  cr_assert_eq(entry(c, 3)->delivered, 44);
  ferry_client_free(c);
}

Test(client_fencing, chunks_of_splits_not_held_are_dropped) {
  ferry_client_t *c = networked(2, 3);
  const ferry_batch_t *b;
  uint32_t split = 0;
  beat(c, 0, &split, NULL, 1);
  double t0 = ferry__client_now();
  cr_assert_eq(feed(c, 5, 0, 2, false), 0);
  double waited = ferry__client_now() - t0;
  cr_assert_null(entry(c, 5), "a split the client does not hold");
  cr_assert_eq(next(c, &b), FERRY_ETIMEDOUT, "nothing to hand out");
  cr_assert_lt(waited, 3.0, "the wait for an assignment is bounded");
  ferry_client_free(c);
}

/* A chunk dropped because its split was not listed yet is not lost for
 * good: when an answer lists the split at that lease after all, the
 * client asks for it again (else the split would wait for ever). */
Test(client_fencing, a_dropped_chunk_of_a_split_listed_later_restarts_it) {
  ferry_client_t *c = networked(2, 3);
  uint32_t split = 4;
  beat(c, 0, NULL, NULL, 0);
  cr_assert_eq(feed(c, 4, 0, 2, true), 0); /* at lease 3 (tu_chunk) */
  cr_assert_null(entry(c, 4));
  tu_answer(c, 0, split, 2, 3, false, TIMEOUT_MS);
  cr_assert_not_null(entry(c, 4));
  cr_assert_eq(entry(c, 4)->restart, FERRY__RESTART_PENDING);
  ferry_client_free(c);
}

/* An answer listing split `split` of epoch 0 on worker 1 at `lease`. */
static void beat_lease(ferry_client_t *c, uint32_t split, uint64_t lease) {
  tu_answer(c, 0, split, 100, lease, false, TIMEOUT_MS);
}

/* A broken stream asks for a restart of whatever lease is current, and
 * only the answer to the heartbeat that carried it ends it: a stopped
 * client whose stream broke may get an answer listing a lease it never
 * heard of, whose chunks were lost in the same stream (chaos seed 20266;
 * before, that answer ended the restart and the split never came). */
Test(client_fencing, a_broken_stream_restarts_whatever_lease_is_current) {
  ferry_client_t *c = networked(2, 3);
  beat_lease(c, 0, 1);
  pthread_mutex_lock(&c->mu);
  ferry__client_restart_worker_locked(c, 1);
  pthread_mutex_unlock(&c->mu);
  cr_assert_eq(entry(c, 0)->restart, FERRY__RESTART_PENDING);
  cr_assert(entry(c, 0)->restart_current);
  /* An answer computed before the restart went out lists a newer lease:
   * the restart still goes out. */
  beat_lease(c, 0, 2);
  cr_assert_eq(entry(c, 0)->restart, FERRY__RESTART_PENDING,
               "a newer lease the restart did not cause does not end it");
  Ferry__V1__SplitProgress p = tu_progress1(c);
  cr_assert(p.restart && p.restart_current);
  cr_assert_eq(entry(c, 0)->restart, FERRY__RESTART_SENT);
  /* The answer to it: the dispatcher restarted the current lease. */
  beat_lease(c, 0, 3);
  cr_assert_eq(entry(c, 0)->restart, FERRY__RESTART_NONE);
  cr_assert_not(entry(c, 0)->restart_current);
  /* A gap names its lease exactly (chunks of tu_chunk are at lease 3). */
  cr_assert_eq(feed(c, 0, 50, 2, false), 0); /* expected 0: a gap */
  cr_assert_eq(entry(c, 0)->restart, FERRY__RESTART_PENDING);
  cr_assert_not(entry(c, 0)->restart_current);
  ferry_client_free(c);
}

typedef struct feeder_s {
  ferry_client_t *c;
  int rc;
} feeder_t;

static void *feed_split_1(void *arg) {
  feeder_t *f = arg;
  f->rc = feed(f->c, 1, 0, 2, false);
  return NULL;
}

Test(client_fencing, a_chunk_ahead_of_its_assignment_waits_for_it) {
  ferry_client_t *c = networked(2, 3);
  const ferry_batch_t *b;
  feeder_t f = {.c = c};
  pthread_t t;
  uint32_t split = 1;
  beat(c, 0, NULL, NULL, 0);
  /* The worker learned of the lease before the client did. */
  cr_assert_eq(pthread_create(&t, NULL, feed_split_1, &f), 0);
  beat(c, 0, &split, NULL, 1);
  pthread_join(t, NULL);
  cr_assert_eq(f.rc, 0);
  cr_assert_eq(next(c, &b), 0, "the chunk was taken once the split was "
                               "listed");
  cr_assert_eq(b->ids[0], tu_id(1, 0));
  ferry_batch_release(c, b);
  ferry_client_free(c);
}

Test(client_fencing, a_lapsed_lease_stops_hand_outs_and_drops_undelivered) {
  ferry_client_t *c = networked(4, 3);
  const ferry_batch_t *b;
  uint32_t split = 0;
  beat(c, 0, &split, NULL, 1);
  cr_assert_eq(feed(c, 0, 0, 12, false), 0); /* three full batches */
  cr_assert_eq(next(c, &b), 0);
  ferry_batch_release(c, b);
  cr_assert_eq(entry(c, 0)->delivered, 4);
  /* No heartbeat answered for 3/4 of the dispatcher's timeout. */
  c->lease_until = ferry__client_now() - 0.001;
  cr_assert_eq(next(c, &b), FERRY_ETIMEDOUT,
               "no batch is handed out past the lease");
  cr_assert(c->fenced);
  cr_assert_eq(c->fences, 1);
  cr_assert_eq(entry(c, 0)->received, 4, "back to what was handed out");
  cr_assert_eq(entry(c, 0)->restart, FERRY__RESTART_PENDING,
               "asks for the split again from delivered");
  /* Chunks are not taken while fenced. */
  cr_assert_eq(feed(c, 0, 4, 4, false), 0);
  cr_assert_eq(entry(c, 0)->received, 4);
  /* A renewal lifts the fence; the split's records come again from 4. */
  renew(c, false);
  cr_assert_not(c->fenced);
  cr_assert_eq(feed(c, 0, 4, 4, false), 0);
  cr_assert_eq(next(c, &b), 0);
  for (uint32_t i = 0; i < 4; i++)
    cr_assert_eq(b->ids[i], tu_id(0, 4 + i), "once, in order");
  ferry_batch_release(c, b);
  cr_assert_eq(entry(c, 0)->delivered, 8);
  ferry_client_free(c);
}

Test(client_fencing, a_fenced_answer_stops_hand_outs_at_once) {
  ferry_client_t *c = networked(4, 3);
  const ferry_batch_t *b;
  uint32_t split = 0;
  beat(c, 0, &split, NULL, 1);
  cr_assert_eq(feed(c, 0, 0, 8, false), 0);
  renew(c, true);
  cr_assert(c->fenced);
  cr_assert_eq(next(c, &b), FERRY_ETIMEDOUT);
  /* Still fenced after more such answers: they do not renew. */
  renew(c, true);
  cr_assert(c->fenced);
  cr_assert_eq(entry(c, 0)->delivered, 0);
  ferry_client_free(c);
}

Test(client_fencing, a_new_incarnation_drops_the_split_table) {
  ferry_client_t *c = networked(4, 3);
  const ferry_batch_t *b;
  uint32_t split = 0, other = 7;
  uint64_t start = 20;
  beat(c, 5, &split, NULL, 1);
  cr_assert_eq(feed(c, 0, 0, 8, false), 0);
  cr_assert_eq(next(c, &b), 0);
  ferry_batch_release(c, b);
  /* The dispatcher declared the client lost and gave split 0 away; it
   * rejoined and got split 7, which another client left at 20. */
  beat(c, 6, &other, &start, 1);
  cr_assert_null(entry(c, 0), "split 0 is another client's now");
  cr_assert_eq(entry(c, 7)->received, 20);
  renew(c, false);
  cr_assert_eq(next(c, &b), FERRY_ETIMEDOUT,
               "the batch of split 0 that was not handed out is gone");
  cr_assert_eq(feed(c, 0, 8, 4, false), 0);
  cr_assert_eq(next(c, &b), FERRY_ETIMEDOUT, "split 0 is not taken");
  cr_assert_eq(feed(c, 7, 20, 4, false), 0);
  cr_assert_eq(next(c, &b), 0);
  cr_assert_eq(b->ids[0], tu_id(7, 20));
  ferry_batch_release(c, b);
  ferry_client_free(c);
}

/* A fence while the trainer holds a batch: the held batch stays valid,
 * the slots not handed out are recycled, and the ring keeps working. */
Test(client_fencing, a_fence_keeps_held_batches_and_recycles_the_rest) {
  ferry_client_t *c = networked(2, 3);
  const ferry_batch_t *held, *b;
  uint32_t split = 0;
  beat(c, 0, &split, NULL, 1);
  cr_assert_eq(feed(c, 0, 0, 6, false), 0);
  cr_assert_eq(next(c, &held), 0);
  ferry__split_t *s = entry(c, 0);
  cr_assert_eq(s->delivered, 2);
  pthread_mutex_lock(&c->mu);
  ferry__client_fence_locked(c, false, "test");
  pthread_mutex_unlock(&c->mu);
  cr_assert_eq(held->ids[0], tu_id(0, 0));
  cr_assert_eq(held->ids[1], tu_id(0, 1));
  renew(c, false);
  cr_assert_eq(feed(c, 0, 2, 4, false), 0, "two free slots again");
  ferry_batch_release(c, held);
  for (uint64_t pos = 2; pos < 6; pos += 2) {
    cr_assert_eq(next(c, &b), 0);
    cr_assert_eq(b->ids[0], tu_id(0, pos));
    ferry_batch_release(c, b);
  }
  cr_assert_eq(entry(c, 0)->delivered, 6);
  ferry_client_free(c);
}
