/* Ranks without daemons (docs/ARCHITECTURE.md "Ranks"): a
 * binding cut at Assignment.end ends there for this client, and under
 * padding a rank gets steps_per_epoch batches of batch_size records: its
 * last real batch filled up with its own records, then batches of no
 * real record, num_real saying which records are real.
 *
 * The clients are the assembler alone (ferry__client_new_local) switched
 * to the networked, ranked rules; answers go in through
 * ferry__client_apply_heartbeat, chunks through ferry__client_on_chunk. */
#include <criterion/criterion.h>

#include "client_test_util.h"

#define H 2
#define W 2
#define C 1
#define REC (H * W * C)

static ferry_client_t *ranked(uint32_t batch, uint64_t steps, bool pad) {
  ferry__asm_params_t ap = {.batch_size = batch, .height = H, .width = W,
                            .channels = C, .prefetch = 4,
                            .drop_remainder = !pad};
  ferry_client_t *c;
  ferry_error_t err = {0};
  cr_assert_eq(ferry__client_new_local(&ap, &c, &err), 0, "%s", err.msg);
  c->networked = true;
  c->ranked = true;
  c->rk_world = 2; /* padding needs W > 1 */
  c->rk_batch = batch;
  c->rk_pad = pad;
  c->steps_per_epoch = steps;
  c->num_epochs = 2;
  return c;
}

/* An answer for epoch 0 listing split 0 (100 records) bound up to `end`
 * (0: its end); `exhausted`: the rank's quota is all bound; `done`:
 * epochs the dispatcher finished. */
static void beat(ferry_client_t *c, uint64_t end, bool exhausted,
                 uint32_t done) {
  Ferry__V1__ClientHeartbeatResponse r =
      FERRY__V1__CLIENT_HEARTBEAT_RESPONSE__INIT;
  Ferry__V1__Assignment a = FERRY__V1__ASSIGNMENT__INIT, *pa = &a;
  a.split = 0;
  a.num_records = 100;
  a.worker_id = 1;
  a.lease = 3;
  a.end = end;
  r.n_assignments = done > 0 ? 0 : 1;
  r.assignments = &pa;
  r.error = (char *)"";
  r.state = FERRY__V1__JOB_STATE__JOB_STATE_RUNNING;
  r.epoch = done;
  r.epochs_done = done;
  r.epoch_exhausted = exhausted;
  ferry__client_apply_heartbeat(c, &r);
}

static int feed(ferry_client_t *c, uint64_t first, uint32_t count) {
  tu_chunk_opts_t o = {.split = 0, .first = first, .count = count, .h = H,
                       .w = W, .c = C};
  return tu_feed(c, &o, 1, 5);
}

Test(client_ranks, a_cut_binding_ends_at_its_end) {
  ferry_client_t *c = ranked(4, 2, false);
  const ferry_batch_t *b;
  beat(c, 6, true, 0);
  /* A chunk across the cut: the records past it are another rank's. */
  cr_assert_eq(feed(c, 0, 10), 0);
  pthread_mutex_lock(&c->mu);
  ferry__split_t *s = ferry__client_split(c, 0, 0);
  cr_assert_eq(s->received, 6);
  cr_assert(s->has_total);
  cr_assert_eq(s->total, 6, "the split ends at the cut for this client");
  pthread_mutex_unlock(&c->mu);
  /* More of the split after the cut: taken by nobody here. */
  cr_assert_eq(feed(c, 10, 4), 0);
  cr_assert_eq(ferry_next(c, &b, 0, NULL), 0);
  cr_assert_eq(b->size, 4);
  cr_assert_eq(b->num_real, 4);
  for (uint32_t i = 0; i < 4; i++)
    cr_assert_eq(b->ids[i], tu_id(0, i));
  ferry_batch_release(c, b);
  /* The epoch can bring no more: the rest (2 records) is a partial batch
   * under drop, dropped. */
  cr_assert_eq(ferry_next(c, &b, 0, NULL), FERRY_ETIMEDOUT);
  ferry_client_free(c);
}

Test(client_ranks, padding_fills_the_last_batch_then_adds_empty_ones) {
  /* 5 real records, batches of 4, 3 steps: 4 real; 1 real and 3 copies
   * of it; no real record (4 copies of the last batch's first). */
  ferry_client_t *c = ranked(4, 3, true);
  const ferry_batch_t *b[3];
  beat(c, 5, true, 0);
  cr_assert_eq(feed(c, 0, 5), 0);
  for (int k = 0; k < 3; k++) {
    cr_assert_eq(ferry_next(c, &b[k], 0, NULL), 0, "step %d", k);
    cr_assert_eq(b[k]->size, 4, "step %d", k);
  }
  cr_assert_eq(b[0]->num_real, 4);
  cr_assert_eq(b[1]->num_real, 1);
  cr_assert_eq(b[2]->num_real, 0);
  for (uint32_t i = 0; i < 4; i++) {
    cr_assert_eq(b[0]->ids[i], tu_id(0, i));
    cr_assert_eq(b[1]->ids[i], tu_id(0, 4), "padding repeats record 4");
    cr_assert_eq(b[2]->ids[i], tu_id(0, 4), "the last batch's first");
    cr_assert_eq(b[1]->labels[i], tu_label(0, 4));
    cr_assert_eq(memcmp(b[1]->images + i * REC, b[1]->images, REC), 0);
    cr_assert_eq(memcmp(b[2]->images + i * REC, b[1]->images, REC), 0);
  }
  /* Three steps, and no fourth: the epoch ends when the dispatcher
   * says so. */
  const ferry_batch_t *more;
  cr_assert_eq(ferry_next(c, &more, 0, NULL), FERRY_ETIMEDOUT,
               "a slot is free, yet the rank had its 3 steps");
  for (int k = 0; k < 3; k++)
    ferry_batch_release(c, b[k]);
  beat(c, 0, false, 1);
  cr_assert_eq(ferry_next(c, &b[0], 0, NULL), FERRY_EPOCH_END);
  ferry_client_stats_t st;
  ferry_client_stats(c, &st);
  cr_assert_eq(st.batches, 3);
  cr_assert_eq(st.records, 5, "records counts real records only");
  ferry_client_free(c);
}

Test(client_ranks, a_rank_taken_over_owes_only_its_remaining_steps) {
  /* The rank's first client took 8 records (2 steps of 4) of epoch 0:
   * its heir, with 1 record of the rank's share left, owes 1 step. */
  ferry_client_t *c = ranked(4, 3, true);
  const ferry_batch_t *b;
  c->rk_epoch = 0;
  c->rk_handed = 2;
  beat(c, 9, true, 0);
  pthread_mutex_lock(&c->mu);
  ferry__client_split(c, 0, 0)->received = 8;
  ferry__client_split(c, 0, 0)->delivered = 8;
  pthread_mutex_unlock(&c->mu);
  cr_assert_eq(feed(c, 8, 1), 0);
  cr_assert_eq(ferry_next(c, &b, 0, NULL), 0);
  cr_assert_eq(b->num_real, 1);
  cr_assert_eq(b->ids[0], tu_id(0, 8));
  ferry_batch_release(c, b);
  cr_assert_eq(ferry_next(c, &b, 0, NULL), FERRY_ETIMEDOUT,
               "the rank had its 3 steps");
  ferry_client_free(c);
}
