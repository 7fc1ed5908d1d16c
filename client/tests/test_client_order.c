/* Deterministic order without daemons (issue 22, docs/ARCHITECTURE.md
 * "Deterministic order"): chunks that arrive before their turn are held
 * and go into batches in the rank's order; a fence drops what was held
 * and moves the next position back to the first record not handed out;
 * a replay after a rebind skips, and counts delivered, what the trainer
 * had. Under ASan (CI) nothing held may leak.
 *
 * The clients are the assembler alone (ferry__client_new_local) switched
 * to the networked, ranked, deterministic rules; answers go in through
 * ferry__client_apply_heartbeat, chunks through ferry__client_on_chunk. */
#include <criterion/criterion.h>

#include "client_test_util.h"

#define H 2
#define W 2
#define C 1

static ferry_client_t *det_client(uint32_t batch, uint64_t records) {
  ferry__asm_params_t ap = {.batch_size = batch, .height = H, .width = W,
                            .channels = C, .prefetch = 4};
  ferry_client_t *c;
  ferry_error_t err = {0};
  cr_assert_eq(ferry__client_new_local(&ap, &c, &err), 0, "%s", err.msg);
  c->networked = true;
  c->ranked = true;
  c->det = true;
  c->rk_world = 1;
  c->rk_batch = batch;
  c->rk_pad = true;
  c->steps_per_epoch = (records + batch - 1) / batch;
  c->rank_records = records;
  c->num_epochs = 1;
  return c;
}

/* An answer for epoch 0 binding splits 0..n-1 of `per` records each, in
 * the rank's order split 0 first; `incarnation` as the dispatcher says. */
static void beat(ferry_client_t *c, uint32_t n, uint64_t per,
                 bool exhausted, uint64_t incarnation) {
  Ferry__V1__ClientHeartbeatResponse r =
      FERRY__V1__CLIENT_HEARTBEAT_RESPONSE__INIT;
  Ferry__V1__Assignment a[4], *pa[4];
  for (uint32_t i = 0; i < n; i++) {
    ferry__v1__assignment__init(&a[i]);
    a[i].split = i;
    a[i].num_records = per;
    a[i].worker_id = 1 + i;
    a[i].lease = 3;
    a[i].rank_index = i * per;
    pa[i] = &a[i];
  }
  r.n_assignments = n;
  r.assignments = pa;
  r.error = (char *)"";
  r.state = FERRY__V1__JOB_STATE__JOB_STATE_RUNNING;
  r.epoch_exhausted = exhausted;
  r.incarnation = incarnation;
  ferry__client_apply_heartbeat(c, &r);
}

static int feed(ferry_client_t *c, uint32_t split, uint64_t first,
                uint32_t count, bool last) {
  tu_chunk_opts_t o = {.split = split, .first = first, .count = count,
                       .h = H, .w = W, .c = C, .last = last};
  return tu_feed(c, &o, 1 + split, 3);
}

static uint64_t held(ferry_client_t *c) {
  pthread_mutex_lock(&c->mu);
  uint64_t n = c->det_held;
  pthread_mutex_unlock(&c->mu);
  return n;
}

Test(client_order, later_splits_wait_for_their_turn) {
  /* Splits 0 and 1 of 6 records, batches of 4: split 1 arrives first,
   * entirely, and is held; the batches are 0:0-3, then 0:4-5 + 1:0-1,
   * then 1:2-5. */
  ferry_client_t *c = det_client(4, 12);
  const ferry_batch_t *b;
  beat(c, 2, 6, true, 0);
  cr_assert_eq(feed(c, 1, 0, 6, true), 0);
  cr_assert_eq(held(c), 6);
  cr_assert_eq(ferry_next(c, &b, 0, NULL), FERRY_ETIMEDOUT,
               "nothing of split 0 yet: no batch");
  cr_assert_eq(feed(c, 0, 0, 3, false), 0);
  cr_assert_eq(feed(c, 0, 3, 3, true), 0);
  uint64_t want[12];
  for (int i = 0; i < 12; i++)
    want[i] = tu_id(i / 6, i % 6);
  for (int k = 0; k < 3; k++) {
    cr_assert_eq(ferry_next(c, &b, 1000, NULL), 0, "batch %d", k);
    cr_assert_eq(b->size, 4);
    for (uint32_t i = 0; i < 4; i++)
      cr_assert_eq(b->ids[i], want[k * 4 + i], "batch %d record %u", k, i);
    ferry_batch_release(c, b);
  }
  cr_assert_eq(held(c), 0);
  pthread_mutex_lock(&c->mu);
  cr_assert_eq(c->det_held_peak, 6);
  pthread_mutex_unlock(&c->mu);
  ferry_client_free(c);
}

Test(client_order, a_fence_drops_what_was_held) {
  /* Split 1 held, two batches of split 0 assembled, one handed out; then
   * a new incarnation (the dispatcher took the splits away): the held
   * records and the batch not handed out are dropped, and what comes
   * again restarts at the first record not handed out. The freed blocks
   * would show as leaks under ASan. */
  ferry_client_t *c = det_client(4, 12);
  const ferry_batch_t *b;
  beat(c, 2, 6, true, 0);
  cr_assert_eq(feed(c, 1, 0, 6, true), 0);
  cr_assert_eq(feed(c, 0, 0, 6, true), 0);
  cr_assert_eq(ferry_next(c, &b, 1000, NULL), 0);
  cr_assert_eq(b->ids[0], tu_id(0, 0));
  ferry_batch_release(c, b);
  beat(c, 2, 6, true, 1); /* rejoined: everything not handed out goes */
  cr_assert_eq(held(c), 0);
  pthread_mutex_lock(&c->mu);
  cr_assert_eq(c->det_next, 4, "the first record not handed out");
  pthread_mutex_unlock(&c->mu);
  /* The splits come back from their acknowledged counts (0 here: the
   * dispatcher never heard of the batch): split 0's first 4 records are
   * skipped (the trainer had them) and counted delivered. */
  beat(c, 2, 6, true, 1);
  cr_assert_eq(feed(c, 0, 0, 6, true), 0);
  pthread_mutex_lock(&c->mu);
  ferry__split_t *s = ferry__client_split(c, 0, 0);
  cr_assert(s != NULL);
  cr_assert_eq(s->delivered, 4, "the replayed records the trainer had");
  pthread_mutex_unlock(&c->mu);
  cr_assert_eq(feed(c, 1, 0, 6, true), 0);
  for (int k = 1; k < 3; k++) {
    cr_assert_eq(ferry_next(c, &b, 1000, NULL), 0, "batch %d", k);
    for (uint32_t i = 0; i < 4; i++) {
      uint64_t p = (uint64_t)k * 4 + i;
      cr_assert_eq(b->ids[i], tu_id((uint32_t)(p / 6), p % 6),
                   "batch %d record %u", k, i);
    }
    ferry_batch_release(c, b);
  }
  ferry_client_free(c);
}

Test(client_order, held_records_are_freed_with_the_client) {
  /* A client freed while records wait for their turn leaks nothing. */
  ferry_client_t *c = det_client(4, 12);
  beat(c, 2, 6, true, 0);
  cr_assert_eq(feed(c, 1, 0, 6, true), 0);
  cr_assert_eq(held(c), 6);
  ferry_client_free(c);
}
