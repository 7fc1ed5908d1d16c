/* Ranked jobs. W ranks share one named distributed_epoch job;
 * each takes the same number of steps of B records per epoch, bound in
 * ranges cut at record boundaries so that a fast rank never takes a slow
 * rank's share. Simulated clients of different speeds consume their
 * assignments; every record position is checked to reach one rank at most,
 * every rank its quota, the remainder dropped or delivered (pad); duplicate
 * ranks and disagreeing world sizes are refused naming both clients; a
 * rank whose client was lost is taken over by a new client; the journal
 * replays to the same state. N, B and the split size come from a printed
 * seed (FERRY_SEED overrides it). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fixture.h"

static ferry_disp_t *D;

static void setup(void) { fx_begin(); }
static void teardown(void) { fx_end(&D); }

TestSuite(ranks, .init = setup, .fini = teardown);

#define W 4
#define MAXSPLITS 256
#define MAXREC 4096

typedef struct rk_s {
  uint64_t job, id;
  uint32_t epoch;
  uint64_t pos[MAXSPLITS];
  uint64_t taken[4];  /* per epoch */
  uint32_t speed;
} rk_t;

static int16_t owner[4][MAXREC]; /* per epoch: record -> rank + 1 */
static uint32_t per_split_g;

static const char *reg(uint32_t n, uint32_t per) {
  char spec[512];
  ferry_error_t err = {0};
  Ferry__V1__RegisterDatasetResponse *r;
  fx_write("a.tfrecord", (int)n, FERRY_COMPRESSION_NONE);
  snprintf(spec, sizeof(spec),
           "tfrecord(\"%s/a.tfrecord\") | decode(raw, 1, 1, 1)", fx_dir);
  cr_assert_eq(fx_register(D, spec, per, &r, 0, &err), 0, "%s", err.msg);
  cr_assert_eq(r->num_records, n);
  return r->dataset_id;
}

static int join(const char *ds, uint32_t ws, uint32_t b, bool pad,
                uint32_t rank, Ferry__V1__GetOrCreateJobResponse **out,
                int64_t now, ferry_error_t *err) {
  Ferry__V1__GetOrCreateJobRequest req =
      FERRY__V1__GET_OR_CREATE_JOB_REQUEST__INIT;
  Ferry__V1__JobOptions o = FERRY__V1__JOB_OPTIONS__INIT;
  req.dataset_id = (char *)ds;
  req.options = &o;
  req.rank = rank;
  o.job_name = "ddp";
  o.mode = DIST;
  o.num_epochs = 2;
  o.world_size = ws;
  o.batch_size = b;
  o.pad_remainder = pad;
  return fx_job_req(D, &req, out, now, err);
}

/* One heartbeat of rank r: reports its positions, then consumes up to
 * `speed` records of each assignment (never past its end). */
static Ferry__V1__ClientHeartbeatResponse *beat(rk_t *k, uint32_t r,
                                                int64_t now) {
  uint64_t prog[4 * MAXSPLITS];
  size_t n = 0;
  Ferry__V1__ClientHeartbeatResponse *resp;
  for (uint32_t s = 0; s < MAXSPLITS; s++)
    if (k->pos[s] > 0) {
      prog[4 * n] = k->epoch;
      prog[4 * n + 1] = s;
      prog[4 * n + 2] = k->pos[s];
      prog[4 * n + 3] = 0;
      n++;
    }
  resp = fx_client(D, k->job, k->id, 4, prog, n, false, now);
  if (resp->epoch != k->epoch) {
    memset(k->pos, 0, sizeof(k->pos));
    k->epoch = resp->epoch;
  }
  for (size_t i = 0; i < resp->n_assignments; i++) {
    const Ferry__V1__Assignment *a = resp->assignments[i];
    uint64_t lim = a->end != 0 ? a->end : a->num_records;
    uint64_t *p = &k->pos[a->split];
    cr_assert_eq(a->epoch, k->epoch);
    if (a->start > *p)
      *p = a->start;
    for (uint32_t c = 0; c < k->speed && *p < lim; c++, (*p)++) {
      uint64_t rec = (uint64_t)a->split * per_split_g + *p;
      cr_assert_lt(rec, MAXREC);
      cr_assert_eq(owner[a->epoch][rec], 0,
                   "epoch %u record %llu reached rank %d and rank %u",
                   a->epoch, (unsigned long long)rec,
                   owner[a->epoch][rec] - 1, r);
      owner[a->epoch][rec] = (int16_t)(r + 1);
      k->taken[a->epoch]++;
    }
  }
  return resp;
}

static unsigned seed_of(void) {
  const char *s = getenv("FERRY_SEED");
  unsigned seed = s ? (unsigned)strtoul(s, NULL, 10)
                    : (unsigned)time(NULL) ^ (unsigned)clock();
  fprintf(stderr, "test_dispatcher_ranks: seed %u (FERRY_SEED=%u repeats)\n",
          seed, seed);
  return seed;
}

/* Runs 2 epochs with ranks of speeds 40, 3, 9, 17 records per beat. */
static void run(bool pad) {
  unsigned seed = seed_of();
  srand(seed);
  uint32_t b = 5 + (uint32_t)(rand() % 16);
  uint32_t n;
  do
    n = (uint32_t)(W * b + rand() % 1500);
  while (n % (W * b) == 0);
  per_split_g = 16 + (uint32_t)(rand() % 64);
  fprintf(stderr, "  N %u, B %u, per split %u, %s\n", n, b, per_split_g,
          pad ? "pad" : "drop");
  D = fx_state(100000, 100000, 600000, per_split_g);
  const char *ds = reg(n, per_split_g);
  rk_t k[W];
  uint32_t speeds[W] = {40, 3, 9, 17};
  ferry_error_t err = {0};
  uint64_t steps = pad ? (n + W * b - 1) / (W * b) : n / (W * b);
  memset(k, 0, sizeof(k));
  memset(owner, 0, sizeof(owner));
  for (uint32_t r = 0; r < W; r++) {
    Ferry__V1__GetOrCreateJobResponse *j;
    cr_assert_eq(join(ds, W, b, pad, r, &j, 0, &err), 0, "%s", err.msg);
    cr_assert_eq(j->steps_per_epoch, steps);
    cr_assert_eq(j->dropped_per_epoch, pad ? 0 : n - steps * W * b);
    cr_assert_eq(j->rank_records,
                 pad ? n / W + (r < n % W) : steps * b);
    k[r].job = j->job_id;
    k[r].id = j->client_id;
    k[r].speed = speeds[r];
  }
  Ferry__V1__ClientHeartbeatResponse *last = NULL;
  for (int it = 0; it < 100000; it++) {
    for (uint32_t r = 0; r < W; r++)
      last = beat(&k[r], r, 10 + it);
    if (last->state == FERRY__V1__JOB_STATE__JOB_STATE_FINISHED)
      break;
  }
  cr_assert_eq(last->state, FERRY__V1__JOB_STATE__JOB_STATE_FINISHED,
               "the job finishes");
  for (uint32_t e = 0; e < 2; e++) {
    uint64_t seen = 0;
    for (uint32_t r = 0; r < W; r++) {
      uint64_t q = pad ? n / W + (r < n % W) : steps * b;
      cr_assert_eq(k[r].taken[e], q,
                   "epoch %u rank %u took %llu records, its quota is %llu",
                   e, r, (unsigned long long)k[r].taken[e],
                   (unsigned long long)q);
      seen += k[r].taken[e];
    }
    cr_assert_eq(seen, pad ? n : steps * W * b);
  }
}

Test(ranks, drop_equal_quotas_cut_rows_remainder_dropped) { run(false); }

Test(ranks, pad_every_record_once_even_shares) { run(true); }

Test(ranks, refusals_name_both_clients) {
  ferry_error_t err = {0};
  Ferry__V1__GetOrCreateJobResponse *a, *x;
  D = fx_state(1000, 1000, 600000, 32);
  const char *ds = reg(1000, 32);
  cr_assert_eq(join(ds, W, 10, false, 2, &a, 0, &err), 0, "%s", err.msg);
  /* The same rank while its client lives. */
  cr_assert_eq(join(ds, W, 10, false, 2, &x, 0, &err), FERRY_EINVAL);
  char want[128];
  snprintf(want, sizeof(want), "held by live client %llu",
           (unsigned long long)a->client_id);
  cr_assert(strstr(err.msg, want) != NULL, "%s", err.msg);
  /* Another world size. */
  cr_assert_eq(join(ds, 8, 10, false, 1, &x, 0, &err), FERRY_EINVAL);
  cr_assert(strstr(err.msg, "world_size 8") != NULL &&
                strstr(err.msg, "world_size 4") != NULL,
            "%s", err.msg);
  snprintf(want, sizeof(want), "created by client %llu (rank 2)",
           (unsigned long long)a->client_id);
  cr_assert(strstr(err.msg, want) != NULL, "%s", err.msg);
  /* Out of range, and no step under drop. */
  cr_assert_eq(join(ds, W, 10, false, 4, &x, 0, &err), FERRY_EINVAL);
  cr_assert_eq(join(ds, W, 300, false, 0, &x, 0, &err), FERRY_EINVAL);
  cr_assert(strstr(err.msg, "no step") != NULL, "%s", err.msg);

  /* The client of rank 2 is lost: a new client takes the rank over. */
  ferry__disp_tick(D, 5000);
  cr_assert_eq(join(ds, W, 10, false, 2, &x, 5000, &err), 0, "%s", err.msg);
  cr_assert_neq(x->client_id, a->client_id);
}

/* A rank's client dies with rows bound; a new process joins as that rank
 * and gets the rank's remaining quota (its rows from their acknowledged
 * counts). The journal replays to the same status. */
Test(ranks, rejoined_rank_gets_the_rest_and_replay_matches) {
  ferry_error_t err = {0};
  Ferry__V1__GetOrCreateJobResponse *j[W];
  uint32_t b = 10, n = 1000;
  per_split_g = 32;
  D = fx_state(100000, 1000, 600000, per_split_g);
  const char *ds = reg(n, per_split_g);
  rk_t k[W];
  memset(k, 0, sizeof(k));
  memset(owner, 0, sizeof(owner));
  for (uint32_t r = 0; r < W; r++) {
    cr_assert_eq(join(ds, W, b, false, r, &j[r], 0, &err), 0, "%s", err.msg);
    k[r].job = j[r]->job_id;
    k[r].id = j[r]->client_id;
    k[r].speed = 7;
  }
  int64_t t = 10;
  for (int it = 0; it < 5; it++, t += 10)
    for (uint32_t r = 0; r < W; r++)
      beat(&k[r], r, t);
  /* Rank 1 dies after a last beat that took records it never reports:
   * the documented window of duplicates (they go to its heir again). */
  beat(&k[1], 1, t);
  /* Others beat on while rank 1 is silent for the client timeout. */
  for (; t < 1200; t += 100)
    for (uint32_t r = 0; r < W; r++)
      if (r != 1)
        beat(&k[r], r, t);
  ferry__disp_tick(D, t);
  Ferry__V1__GetOrCreateJobResponse *heir;
  cr_assert_eq(join(ds, W, b, false, 1, &heir, t, &err), 0, "%s", err.msg);
  rk_t h;
  memset(&h, 0, sizeof(h));
  h.job = heir->job_id;
  h.id = heir->client_id;
  h.speed = 7;
  /* Epoch 0's bookkeeping restarts here: the heir may get again what
   * rank 1 took and never reported. Epoch 1 is checked in full. */
  memset(owner, 0, sizeof(owner));
  /* Replay check before finishing. */
  fx_replay_matches(D, t);
  /* Finish: the heir and the others; the epoch ends only when every rank
   * took its quota, which the heir completes. */
  Ferry__V1__ClientHeartbeatResponse *last = NULL;
  for (int it = 0; it < 20000; it++, t += 10) {
    for (uint32_t r = 0; r < W; r++)
      last = r == 1 ? beat(&h, 1, t) : beat(&k[r], r, t);
    if (last->state == FERRY__V1__JOB_STATE__JOB_STATE_FINISHED)
      break;
  }
  cr_assert_eq(last->state, FERRY__V1__JOB_STATE__JOB_STATE_FINISHED);
  /* Epoch 1 ran with the heir from the start: equal quotas. */
  uint64_t q = n / (W * b) * b;
  cr_assert_eq(h.taken[1], q);
  for (uint32_t r = 0; r < W; r++)
    if (r != 1)
      cr_assert_eq(k[r].taken[1], q);
}
