/* Elastic: an epoch resumed with another world size. A cursor
 * of W1 ranks at step s leaves W1 ranges of the epoch's order; the job
 * that resumes with W2 ranks cuts what is left, in the epoch's order,
 * into W2 shares (a rank may get two parts of one split, told apart by
 * their leases). Checked against a naive walk over explicit positions:
 * the spans left, each rank's records in its share's order, nothing the
 * cursor's ranks took delivered again, every other record once (under
 * drop, the remainder past the last share never), the next epoch whole,
 * and the journal replaying to the same state. Sizes, world sizes, steps
 * and the policy come from a printed seed (FERRY_SEED repeats it). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fixture.h"
#include "lease.h"
#include "state_ranks.h"

static ferry_disp_t *D;

static void setup(void) { fx_begin(); }
static void teardown(void) { fx_end(&D); }

TestSuite(elastic, .init = setup, .fini = teardown);

#define MAXREC 2048
#define MAXW 8
#define MAXSPLITS 128
#define MAXPARTS 32
#define MAXCUTS 4

static unsigned seed_of(const char *what) {
  const char *s = getenv("FERRY_SEED");
  unsigned seed = s ? (unsigned)strtoul(s, NULL, 10)
                    : (unsigned)time(NULL) ^ (unsigned)clock();
  fprintf(stderr, "test_dispatcher_elastic %s: seed %u (FERRY_SEED=%u "
          "repeats)\n", what, seed, seed);
  return seed;
}

/* The test's own quotas (not the dispatcher's functions). */
static uint64_t steps_of(uint64_t m, uint32_t w, uint32_t b, bool pad) {
  return pad ? (m + (uint64_t)w * b - 1) / ((uint64_t)w * b)
             : m / ((uint64_t)w * b);
}
static uint64_t quota_of(uint64_t m, uint32_t w, uint32_t b, bool pad,
                         uint32_t k) {
  return pad ? m / w + (k < m % w) : steps_of(m, w, b, pad) * b;
}

/* The naive walk: left[] lists the positions of an epoch of n records
 * that the cuts left, in order; returns how many. */
static uint32_t naive_left(uint32_t n, uint32_t b, bool pad,
                           const uint32_t *cw, const uint64_t *cs,
                           uint32_t nc, uint32_t *left) {
  static bool gone[MAXREC];
  uint32_t m = n;
  for (uint32_t i = 0; i < n; i++)
    left[i] = i;
  for (uint32_t c = 0; c < nc; c++) {
    memset(gone, 0, sizeof(gone));
    uint64_t at = 0;
    for (uint32_t k = 0; k < cw[c]; k++) {
      uint64_t q = quota_of(m, cw[c], b, pad, k);
      uint64_t take = cs[c] * b < q ? cs[c] * b : q;
      for (uint64_t x = at; x < at + take; x++)
        gone[x] = true;
      at += q;
    }
    uint32_t o = 0;
    for (uint32_t x = 0; x < m; x++)
      if (!gone[x])
        left[o++] = left[x];
    m = o;
  }
  return m;
}

Test(elastic, left_spans_match_a_naive_walk) {
  srand(seed_of("spans"));
  static uint32_t left[MAXREC];
  for (int it = 0; it < 400; it++) {
    uint32_t n = 1 + (uint32_t)(rand() % (MAXREC - 1));
    uint32_t b = 1 + (uint32_t)(rand() % 12);
    bool pad = rand() % 2;
    uint32_t nc = 1 + (uint32_t)(rand() % MAXCUTS), cw[MAXCUTS];
    uint64_t cs[MAXCUTS], m = n;
    for (uint32_t c = 0; c < nc; c++) {
      cw[c] = 1 + (uint32_t)(rand() % MAXW);
      uint64_t steps = steps_of(m, cw[c], b, pad);
      cs[c] = steps > 0 ? (uint64_t)rand() % steps : 0;
      m = naive_left(n, b, pad, cw, cs, c + 1, left);
    }
    ferry__span_t *sp;
    uint32_t nsp;
    uint64_t got = ferry__disp_left_spans(n, b, pad, cw, cs, nc, &sp, &nsp);
    cr_assert_eq(got, m, "it %d: %llu records left, the walk says %llu", it,
                 (unsigned long long)got, (unsigned long long)m);
    uint32_t o = 0;
    for (uint32_t i = 0; i < nsp; i++) {
      cr_assert_lt(sp[i].from, sp[i].to, "it %d: empty span", it);
      cr_assert(i == 0 || sp[i - 1].to < sp[i].from,
                "it %d: spans %u and %u touch or overlap", it, i - 1, i);
      for (uint64_t x = sp[i].from; x < sp[i].to; x++, o++)
        cr_assert_eq(x, left[o], "it %d: position %u of what is left",
                     it, o);
    }
    cr_assert_eq(o, m);
    ferry__free(sp);
  }
}

typedef struct rk_s {
  uint64_t job, id;
  uint32_t epoch;
  uint64_t pos[MAXSPLITS][MAXPARTS];
  uint64_t lease[MAXSPLITS][MAXPARTS];
  uint64_t taken[2];
  uint32_t speed;
} rk_t;

static uint32_t per_g;
static int16_t owner[2][MAXREC];  /* record -> rank + 1 */
static int32_t seq[MAXW][MAXREC]; /* epoch 0: rank position -> record */

/* One heartbeat of rank r: reports each part it holds (by its lease),
 * then takes up to `speed` records of each assignment. */
static Ferry__V1__ClientHeartbeatResponse *beat(rk_t *k, uint32_t r,
                                                int64_t now) {
  static uint64_t prog[4 * MAXSPLITS * MAXPARTS];
  static uint64_t leases[MAXSPLITS * MAXPARTS];
  size_t n = 0;
  for (uint32_t s = 0; s < MAXSPLITS; s++)
    for (uint32_t x = 0; x < MAXPARTS; x++)
      if (k->pos[s][x] > 0) {
        prog[4 * n] = k->epoch;
        prog[4 * n + 1] = s;
        prog[4 * n + 2] = k->pos[s][x];
        prog[4 * n + 3] = 0;
        leases[n++] = k->lease[s][x];
      }
  fx_prog_leases = leases;
  Ferry__V1__ClientHeartbeatResponse *resp =
      fx_client(D, k->job, k->id, 4, prog, n, false, now);
  fx_prog_leases = NULL;
  if (resp->epoch != k->epoch) {
    memset(k->pos, 0, sizeof(k->pos));
    k->epoch = resp->epoch;
  }
  for (size_t i = 0; i < resp->n_assignments; i++) {
    const Ferry__V1__Assignment *a = resp->assignments[i];
    uint32_t x = ferry__lease_part(a->lease);
    cr_assert_lt(x, MAXPARTS);
    cr_assert_lt(a->split, MAXSPLITS);
    cr_assert_eq(a->epoch, k->epoch);
    uint64_t lim = a->end != 0 ? a->end : a->num_records;
    uint64_t *p = &k->pos[a->split][x];
    k->lease[a->split][x] = a->lease;
    if (a->start > *p)
      *p = a->start;
    for (uint32_t c = 0; c < k->speed && *p < lim; c++, (*p)++) {
      uint64_t rec = (uint64_t)a->split * per_g + *p;
      cr_assert_lt(rec, MAXREC);
      cr_assert_eq(owner[a->epoch][rec], 0,
                   "epoch %u record %llu reached rank %d and rank %u",
                   a->epoch, (unsigned long long)rec,
                   owner[a->epoch][rec] - 1, r);
      owner[a->epoch][rec] = (int16_t)(r + 1);
      k->taken[a->epoch]++;
      if (a->epoch == 0) {
        uint64_t at = a->rank_index + (*p - a->start);
        cr_assert_lt(at, MAXREC);
        cr_assert_eq(seq[r][at], -1, "rank %u position %llu twice", r,
                     (unsigned long long)at);
        seq[r][at] = (int32_t)rec;
      }
    }
  }
  return resp;
}

static int join(const char *ds, uint32_t w, uint32_t b, bool pad,
                uint32_t rank, const uint32_t *cw, const uint64_t *cs,
                uint32_t nc, uint64_t step,
                Ferry__V1__GetOrCreateJobResponse **out, ferry_error_t *err) {
  Ferry__V1__GetOrCreateJobRequest req =
      FERRY__V1__GET_OR_CREATE_JOB_REQUEST__INIT;
  Ferry__V1__JobOptions o = FERRY__V1__JOB_OPTIONS__INIT;
  Ferry__V1__CursorSegment segs[MAXCUTS], *ptrs[MAXCUTS];
  for (uint32_t i = 0; i < nc; i++) {
    ferry__v1__cursor_segment__init(&segs[i]);
    segs[i].world_size = cw[i];
    segs[i].step = cs[i];
    ptrs[i] = &segs[i];
  }
  req.dataset_id = (char *)ds;
  req.options = &o;
  req.rank = rank;
  o.job_name = "elastic";
  o.mode = DIST;
  o.num_epochs = 2;
  o.world_size = w;
  o.batch_size = b;
  o.pad_remainder = pad;
  o.resume = true;
  o.resume_step = step;
  o.n_resume_earlier = nc;
  o.resume_earlier = ptrs;
  return fx_job_req(D, &req, out, 0, err);
}

/* One resumed job: cuts cw/cs (the last one the cursor's own, when
 * `recut`), then w2 ranks from step `step` of what they left. */
static void run_elastic(unsigned seed) {
  srand(seed);
  static uint32_t left[MAXREC];
  uint32_t n, b, nc, cw[MAXCUTS], w2;
  uint64_t cs[MAXCUTS], m, step;
  bool pad;
  /* Draw until the resumed cut has a step. */
  for (;;) {
    n = 64 + (uint32_t)(rand() % (MAXREC - 64));
    b = 2 + (uint32_t)(rand() % 10);
    pad = rand() % 2;
    per_g = 8 + (uint32_t)(rand() % 56);
    if ((n + per_g - 1) / per_g > MAXSPLITS)
      continue;
    nc = 1 + (uint32_t)(rand() % 2);
    m = n;
    bool ok = true;
    for (uint32_t c = 0; c < nc && ok; c++) {
      cw[c] = 1 + (uint32_t)(rand() % MAXW);
      uint64_t s = steps_of(m, cw[c], b, pad);
      ok = s > 0;
      cs[c] = ok ? (uint64_t)rand() % s : 0;
      m = naive_left(n, b, pad, cw, cs, c + 1, left);
    }
    do
      w2 = 1 + (uint32_t)(rand() % MAXW);
    while (w2 == cw[nc - 1]);
    uint64_t s2 = steps_of(m, w2, b, pad);
    if (!ok || s2 == 0)
      continue;
    /* Half the runs resume inside the re-cut (a cursor saved there with
     * w2 ranks resumed with w2 again). */
    step = rand() % 2 ? (uint64_t)rand() % s2 : 0;
    break;
  }
  fprintf(stderr, "  N %u, B %u, per split %u, %s, cuts", n, b, per_g,
          pad ? "pad" : "drop");
  for (uint32_t c = 0; c < nc; c++)
    fprintf(stderr, " (W %u, step %llu)", cw[c], (unsigned long long)cs[c]);
  fprintf(stderr, ", then W %u from step %llu of %llu records left\n", w2,
          (unsigned long long)step, (unsigned long long)m);

  D = fx_state(1000000, 1000000, 600000, per_g);
  char spec[512];
  ferry_error_t err = {0};
  Ferry__V1__RegisterDatasetResponse *rr;
  fx_write("a.tfrecord", (int)n, FERRY_COMPRESSION_NONE);
  snprintf(spec, sizeof(spec),
           "tfrecord(\"%s/a.tfrecord\") | decode(raw, 1, 1, 1)", fx_dir);
  cr_assert_eq(fx_register(D, spec, per_g, &rr, 0, &err), 0, "%s", err.msg);

  static rk_t k[MAXW];
  uint32_t speeds[MAXW] = {40, 3, 9, 17, 5, 23, 2, 11};
  memset(k, 0, sizeof(k));
  memset(owner, 0, sizeof(owner));
  memset(seq, 0xff, sizeof(seq));
  uint64_t s2 = steps_of(m, w2, b, pad);
  for (uint32_t r = 0; r < w2; r++) {
    Ferry__V1__GetOrCreateJobResponse *j;
    cr_assert_eq(join(rr->dataset_id, w2, b, pad, r, cw, cs, nc, step, &j,
                      &err),
                 0, "%s", err.msg);
    cr_assert_eq(j->steps_per_epoch, steps_of(n, w2, b, pad));
    cr_assert_eq(j->rank_records, quota_of(n, w2, b, pad, r));
    cr_assert_eq(j->epoch_steps, s2);
    cr_assert_eq(j->epoch_rank_records, quota_of(m, w2, b, pad, r));
    cr_assert_eq(j->n_epoch_earlier, nc);
    uint64_t before = step * b < quota_of(m, w2, b, pad, r)
                          ? step * b
                          : quota_of(m, w2, b, pad, r);
    cr_assert_eq(j->rank_taken, before);
    k[r].job = j->job_id;
    k[r].id = j->client_id;
    k[r].speed = speeds[r];
  }
  Ferry__V1__ClientHeartbeatResponse *last = NULL;
  int64_t t = 10;
  for (int it = 0; it < 100000; it++, t++) {
    for (uint32_t r = 0; r < w2; r++)
      last = beat(&k[r], r, t);
    if (it == 5)
      fx_replay_matches(D, t);
    if (last->state == FERRY__V1__JOB_STATE__JOB_STATE_FINISHED)
      break;
  }
  cr_assert_eq(last->state, FERRY__V1__JOB_STATE__JOB_STATE_FINISHED,
               "the job finishes");
  /* Epoch 0: rank r's share of what is left, from its step on, in
   * order; nothing the cuts took; nothing else. */
  uint64_t at = 0, delivered = 0;
  for (uint32_t r = 0; r < w2; r++) {
    uint64_t q = quota_of(m, w2, b, pad, r);
    uint64_t from = step * b < q ? step * b : q;
    for (uint64_t x = 0; x < MAXREC; x++) {
      bool mine = x >= from && x < q;
      cr_assert_eq(seq[r][x] >= 0, mine,
                   "rank %u position %llu: %s", r, (unsigned long long)x,
                   mine ? "missing" : "delivered, but not in its share");
      if (mine)
        cr_assert_eq((uint32_t)seq[r][x], left[at + x],
                     "rank %u position %llu: record %d, want %u", r,
                     (unsigned long long)x, seq[r][x], left[at + x]);
    }
    cr_assert_eq(k[r].taken[0], q - from);
    delivered += q - from;
    at += q;
  }
  uint64_t seen = 0;
  for (uint32_t x = 0; x < n; x++)
    seen += owner[0][x] != 0;
  cr_assert_eq(seen, delivered);
  /* Epoch 1: whole, w2 ranks. */
  for (uint32_t r = 0; r < w2; r++)
    cr_assert_eq(k[r].taken[1], quota_of(n, w2, b, pad, r));
}

Test(elastic, resumed_with_another_world_size_every_record_once) {
  unsigned seed = seed_of("resume");
  for (int i = 0; i < 12; i++) {
    fx_end(&D);
    fx_begin();
    run_elastic(seed + (unsigned)i);
  }
}

Test(elastic, refusals_name_what_is_wrong) {
  ferry_error_t err = {0};
  Ferry__V1__GetOrCreateJobResponse *j;
  Ferry__V1__RegisterDatasetResponse *rr;
  char spec[512];
  per_g = 10;
  D = fx_state(1000000, 1000000, 600000, per_g);
  fx_write("a.tfrecord", 100, FERRY_COMPRESSION_NONE);
  snprintf(spec, sizeof(spec),
           "tfrecord(\"%s/a.tfrecord\") | decode(raw, 1, 1, 1)", fx_dir);
  cr_assert_eq(fx_register(D, spec, per_g, &rr, 0, &err), 0, "%s", err.msg);
  uint32_t cw[2] = {4, 0};
  uint64_t cs[2] = {3, 0};
  /* 100 records, 4 ranks x batch 5 under drop: 5 steps; 3 taken leave 40
   * records, no step of 16 ranks x 5. */
  cr_assert_eq(join(rr->dataset_id, 16, 5, false, 0, cw, cs, 1, 0, &j, &err),
               FERRY_EINVAL);
  cr_assert(strstr(err.msg, "makes no step") != NULL, "%s", err.msg);
  /* A cut's step past its steps. */
  cs[0] = 5;
  cr_assert_eq(join(rr->dataset_id, 2, 5, false, 0, cw, cs, 1, 0, &j, &err),
               FERRY_EINVAL);
  cr_assert(strstr(err.msg, "that cut of it") != NULL, "%s", err.msg);
  /* A cut of no ranks. */
  cs[0] = 1;
  cw[1] = 0;
  cr_assert_eq(join(rr->dataset_id, 2, 5, false, 0, cw, cs, 2, 0, &j, &err),
               FERRY_EINVAL);
  cr_assert(strstr(err.msg, "world_size 0") != NULL, "%s", err.msg);
  /* The step of the resumed cut past what is left: 4 x 3 x 5 = 60 taken,
   * 40 left, 2 ranks x 5: 4 steps. */
  cs[0] = 3;
  cr_assert_eq(join(rr->dataset_id, 2, 5, false, 0, cw, cs, 1, 4, &j, &err),
               FERRY_EINVAL);
  cr_assert(strstr(err.msg, "what its earlier cuts left has 4 steps") != NULL,
            "%s", err.msg);
  cr_assert_eq(join(rr->dataset_id, 2, 5, false, 0, cw, cs, 1, 3, &j, &err),
               0, "%s", err.msg);
  cr_assert_eq(j->epoch_steps, 4);
}
