/* Deterministic order without daemons (docs/ARCHITECTURE.md
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
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "client_test_util.h"

#define H 2
#define W 2
#define C 1

/* The assembler with `prefetch` slots, switched to the rules of a
 * deterministic rank (W = 1) of `records` records per epoch; `ahead`:
 * records before their turn may go straight into their batch (as
 * ferry_client_new sets it without policy skip), else they are held. */
static ferry_client_t *order_client(uint32_t batch, uint64_t records,
                                    uint32_t prefetch, bool ahead) {
  ferry__asm_params_t ap = {.batch_size = batch, .height = H, .width = W,
                            .channels = C, .prefetch = prefetch};
  ferry_client_t *c;
  ferry_error_t err = {0};
  cr_assert_eq(ferry__client_new_local(&ap, &c, &err), 0, "%s", err.msg);
  c->networked = true;
  c->ranked = true;
  c->det = true;
  c->det_ahead = ahead;
  c->rk_world = 1;
  c->rk_batch = batch;
  c->rk_pad = true;
  c->steps_per_epoch = (records + batch - 1) / batch;
  c->rank_records = records;
  c->num_epochs = 1;
  return c;
}

static ferry_client_t *det_client(uint32_t batch, uint64_t records) {
  return order_client(batch, records, 4, false);
}

/* An answer binding splits 0..n-1 of sizes[i] records, in the rank's
 * order split 0 first, each on worker 1 + i; `incarnation` as the
 * dispatcher says. */
static void beat_sizes(ferry_client_t *c, uint32_t n, const uint32_t *sizes,
                       bool exhausted, uint64_t incarnation) {
  Ferry__V1__ClientHeartbeatResponse r =
      FERRY__V1__CLIENT_HEARTBEAT_RESPONSE__INIT;
  Ferry__V1__Assignment a[8], *pa[8];
  uint64_t at = 0;
  cr_assert_leq(n, 8);
  for (uint32_t i = 0; i < n; i++) {
    ferry__v1__assignment__init(&a[i]);
    a[i].split = i;
    a[i].num_records = sizes[i];
    a[i].worker_id = 1 + i;
    a[i].lease = 3;
    a[i].rank_index = at;
    at += sizes[i];
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

/* beat_sizes with n splits of `per` records each. */
static void beat(ferry_client_t *c, uint32_t n, uint64_t per,
                 bool exhausted, uint64_t incarnation) {
  uint32_t sizes[8];
  for (uint32_t i = 0; i < n && i < 8; i++)
    sizes[i] = (uint32_t)per;
  beat_sizes(c, n, sizes, exhausted, incarnation);
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

/* ---- Records placed ahead (det_ahead) ------------------------------------
 * Records that come before their turn go straight into the batch their
 * position maps to when a slot is free for it, not through a held copy. */

/* Checks batch `b` holds the records at rank positions [first, first +
 * b->size) of splits of `sizes`: ids, labels and every pixel. */
static void check_batch(const ferry_batch_t *b, const uint32_t *sizes,
                        uint64_t first, const char *what) {
  size_t rec = (size_t)H * W * C;
  for (uint32_t i = 0; i < b->size; i++) {
    uint64_t p = first + i;
    uint32_t split = 0;
    while (p >= sizes[split])
      p -= sizes[split++];
    cr_assert_eq(b->ids[i], tu_id(split, p), "%s: record %u of the batch "
                 "at %llu", what, i, (unsigned long long)first);
    cr_assert_eq(b->labels[i], tu_label(split, p), "%s: label %u", what, i);
    for (size_t k = 0; k < rec; k++)
      cr_assert_eq(b->images[i * rec + k], tu_pixel(0, split, p, k),
                   "%s: record %u byte %zu", what, i, k);
  }
}

static uint64_t ahead_total(ferry_client_t *c) {
  pthread_mutex_lock(&c->mu);
  uint64_t n = c->det_ahead_total;
  pthread_mutex_unlock(&c->mu);
  return n;
}

Test(client_order, records_before_their_turn_go_into_their_batches) {
  /* Splits 0 and 1 of 6 records, batches of 4: split 1 arrives first,
   * entirely. Its positions 6-11 go into batch 1 (offsets 2-3) and batch
   * 2 (offsets 0-3), taken ahead of batch 0; nothing is held. */
  uint32_t sizes[2] = {6, 6};
  ferry_client_t *c = order_client(4, 12, 4, true);
  const ferry_batch_t *b;
  beat_sizes(c, 2, sizes, true, 0);
  cr_assert_eq(feed(c, 1, 0, 6, true), 0);
  cr_assert_eq(held(c), 0);
  cr_assert_eq(ahead_total(c), 6);
  cr_assert_eq(ferry_next(c, &b, 0, NULL), FERRY_ETIMEDOUT,
               "nothing of split 0 yet: no batch");
  cr_assert_eq(feed(c, 0, 0, 3, false), 0);
  cr_assert_eq(feed(c, 0, 3, 3, true), 0);
  for (int k = 0; k < 3; k++) {
    cr_assert_eq(ferry_next(c, &b, 1000, NULL), 0, "batch %d", k);
    cr_assert_eq(b->size, 4);
    check_batch(b, sizes, (uint64_t)k * 4, "ahead");
    ferry_batch_release(c, b);
  }
  pthread_mutex_lock(&c->mu);
  cr_assert_eq(c->det_held_peak, 0);
  cr_assert_eq(c->det_ahead_recs, 0, "every record placed ahead reached");
  pthread_mutex_unlock(&c->mu);
  ferry_client_free(c);
}

Test(client_order, records_beyond_the_free_slots_are_held) {
  /* Two slots: batch 0 takes one, so only batch 1 can be taken ahead.
   * Split 1 (positions 6-11) fills batch 1's offsets 2-3 and the rest,
   * batch 2's, waits aside. */
  uint32_t sizes[2] = {6, 6};
  ferry_client_t *c = order_client(4, 12, 2, true);
  const ferry_batch_t *b;
  beat_sizes(c, 2, sizes, true, 0);
  cr_assert_eq(feed(c, 1, 0, 6, true), 0);
  cr_assert_eq(ahead_total(c), 2);
  cr_assert_eq(held(c), 4);
  /* Batch 0, then batch 1 fills the filling slot; batch 2 needs the slot
   * batch 0 frees (the reader would wait for it: one thread here). */
  cr_assert_eq(feed(c, 0, 0, 4, false), 0);
  cr_assert_eq(ferry_next(c, &b, 1000, NULL), 0);
  check_batch(b, sizes, 0, "two slots");
  ferry_batch_release(c, b);
  cr_assert_eq(feed(c, 0, 4, 2, true), 0);
  cr_assert_eq(held(c), 0, "fed into the freed slot");
  for (int k = 1; k < 3; k++) {
    cr_assert_eq(ferry_next(c, &b, 1000, NULL), 0, "batch %d", k);
    check_batch(b, sizes, (uint64_t)k * 4, "two slots");
    ferry_batch_release(c, b);
  }
  ferry_client_free(c);
}

Test(client_order, a_fence_drops_what_was_placed_ahead) {
  /* Split 1 placed ahead, batch 0 handed out, then a new incarnation:
   * the batches taken ahead are dropped with the rest, the next position
   * goes back to 4, and what comes again makes the same batches. */
  uint32_t sizes[2] = {6, 6};
  ferry_client_t *c = order_client(4, 12, 4, true);
  const ferry_batch_t *b;
  beat_sizes(c, 2, sizes, true, 0);
  cr_assert_eq(feed(c, 1, 0, 6, true), 0);
  cr_assert_eq(feed(c, 0, 0, 4, false), 0);
  cr_assert_eq(ferry_next(c, &b, 1000, NULL), 0);
  check_batch(b, sizes, 0, "before the fence");
  ferry_batch_release(c, b);
  beat_sizes(c, 2, sizes, true, 1);
  pthread_mutex_lock(&c->mu);
  cr_assert_eq(c->det_next, 4, "the first record not handed out");
  cr_assert_eq(c->det_ahead_recs, 0);
  cr_assert_eq(c->qlen, 0, "the batches taken ahead were dropped");
  pthread_mutex_unlock(&c->mu);
  beat_sizes(c, 2, sizes, true, 1);
  cr_assert_eq(feed(c, 1, 0, 6, true), 0);
  cr_assert_eq(feed(c, 0, 0, 6, true), 0);
  for (int k = 1; k < 3; k++) {
    cr_assert_eq(ferry_next(c, &b, 1000, NULL), 0, "batch %d", k);
    check_batch(b, sizes, (uint64_t)k * 4, "after the fence");
    ferry_batch_release(c, b);
  }
  ferry_client_free(c);
}

/* The trainer of the random runs: takes `n` batches as they come and
 * checks each against the rank's order. */
typedef struct consumer_s {
  ferry_client_t *c;
  const uint32_t *sizes;
  uint32_t batch, n, got;
  uint64_t total;
  int rc;
} consumer_t;

static void *consume(void *arg) {
  consumer_t *t = arg;
  const ferry_batch_t *b;
  uint64_t at = 0;
  for (t->got = 0; t->got < t->n; t->got++) {
    ferry_error_t err = {0};
    if ((t->rc = ferry_next(t->c, &b, 5000, &err)) != 0)
      return NULL;
    uint32_t want = t->total - at < t->batch ? (uint32_t)(t->total - at)
                                             : t->batch;
    cr_assert_eq(b->size, want, "batch %u", t->got);
    check_batch(b, t->sizes, at, "random arrival");
    at += b->size;
    ferry_batch_release(t->c, b);
  }
  return NULL;
}

/* The assembler's state, for a run that failed. */
static void dump(ferry_client_t *c, const uint32_t *sizes, uint32_t n) {
  pthread_mutex_lock(&c->mu);
  fprintf(stderr, "next position %llu of epoch %u, %llu placed ahead, "
          "%llu held; fill slot %d, %u queued from %u\n",
          (unsigned long long)c->det_next, c->det_epoch,
          (unsigned long long)c->det_ahead_recs,
          (unsigned long long)c->det_held, c->fill, c->qlen, c->qhead);
  for (uint32_t i = 0; i < c->ap.prefetch; i++) {
    const ferry__slot_t *q = &c->slots[i];
    fprintf(stderr, "  slot %u: state %d, %u reserved, %u copied, next "
            "offset %u, first position %llu\n", i, (int)q->state, q->size,
            q->copied, q->det_at, (unsigned long long)q->det_first);
  }
  for (size_t i = 0; i < c->n_splits; i++) {
    const ferry__split_t *q = &c->splits[i];
    fprintf(stderr, "  split %u (%u records at %lld): received %llu, in "
            "slots %llu, delivered %llu%s\n", q->split,
            q->split < n ? sizes[q->split] : 0, (long long)q->det_base,
            (unsigned long long)q->received,
            (unsigned long long)q->assembled,
            (unsigned long long)q->delivered, q->held ? ", some held" : "");
  }
  pthread_mutex_unlock(&c->mu);
}

Test(client_order, random_arrival_gives_the_rank_order) {
  /* Up to 8 splits of 1 to 13 records, batches of 1 to 7, 2 to 5 slots:
   * each split's chunks (1 to 5 records) come in order, the splits'
   * streams interleaved at random, while a trainer thread takes the
   * batches. Every batch must be the rank's next B records, pixels
   * included, whatever was placed ahead, held or taken in turn. */
  unsigned seed = (unsigned)time(NULL);
  const char *env = getenv("FERRY_TEST_SEED");
  if (env != NULL)
    seed = (unsigned)strtoul(env, NULL, 10);
  fprintf(stderr, "random_arrival_gives_the_rank_order: seed %u "
          "(FERRY_TEST_SEED replays it)\n", seed);
  uint64_t ahead = 0, held_peak = 0;
  for (int run = 0; run < 300; run++) {
    uint32_t n = 1 + (uint32_t)(rand_r(&seed) % 8), sizes[8];
    uint64_t total = 0;
    for (uint32_t i = 0; i < n; i++)
      total += sizes[i] = 1 + (uint32_t)(rand_r(&seed) % 13);
    uint32_t batch = 1 + (uint32_t)(rand_r(&seed) % 7);
    uint32_t prefetch = 2 + (uint32_t)(rand_r(&seed) % 4);
    ferry_client_t *c = order_client(batch, total, prefetch, true);
    beat_sizes(c, n, sizes, true, 0);
    consumer_t t = {.c = c, .sizes = sizes, .batch = batch,
                    .n = (uint32_t)((total + batch - 1) / batch),
                    .total = total};
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, consume, &t), 0);
    uint64_t sent[8] = {0};
    for (uint64_t left = total; left > 0;) {
      uint32_t k = (uint32_t)(rand_r(&seed) % n);
      if (sent[k] == sizes[k])
        continue;
      uint32_t m = 1 + (uint32_t)(rand_r(&seed) % 5);
      if (m > sizes[k] - sent[k])
        m = (uint32_t)(sizes[k] - sent[k]);
      cr_assert_eq(feed(c, k, sent[k], m, sent[k] + m == sizes[k]), 0);
      sent[k] += m;
      left -= m;
    }
    pthread_join(th, NULL);
    if (t.rc != 0)
      dump(c, sizes, n);
    cr_assert_eq(t.rc, 0, "run %d (%u splits, batch %u, %u slots): batch "
                 "%u of %u: %s", run, n, batch, prefetch, t.got, t.n,
                 ferry_strerror(t.rc));
    pthread_mutex_lock(&c->mu);
    ahead += c->det_ahead_total;
    held_peak = c->det_held_peak > held_peak ? c->det_held_peak : held_peak;
    cr_assert_eq(c->det_ahead_recs, 0, "run %d", run);
    pthread_mutex_unlock(&c->mu);
    ferry_client_free(c);
  }
  fprintf(stderr, "300 runs: %llu records placed ahead, at most %llu "
          "held at once\n", (unsigned long long)ahead,
          (unsigned long long)held_peak);
  cr_assert_gt(ahead, 0, "nothing was placed ahead");
  cr_assert_gt(held_peak, 0, "nothing was held");
}
