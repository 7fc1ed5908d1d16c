/* Ranks: W trainers of one named job, as data-parallel ranks,
 * each take the same number of batches per epoch, every batch of the
 * job's batch size, and every record of an epoch reaches one rank (under
 * padding the padded records are repeats of the rank's own records, and
 * the batch's num_real says where they start; under drop the remainder
 * is counted, never delivered). Also when a worker is killed and when the
 * dispatcher is killed and restarted on its journal mid-epoch, at random
 * points (printed seeds, FERRY_IT_SEED replays one); and when a rank's
 * client dies and a new one takes the rank over, getting only the rank's
 * remaining steps.
 *
 * The ranks here are threads of this process, one client each: the
 * dispatcher cannot tell them from processes, and every rank reads at
 * its own pace (rank r sleeps r x 2 ms per batch), so a fast rank would
 * take a slow one's share if quotas did not hold. */
#include <criterion/criterion.h>
#include <criterion/hooks.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "it_cluster.h"

#define MAX_RANKS 4
#define EPOCHS 2
#define NEXT_TIMEOUT_MS 30000
#define CLIENT_TIMEOUT_MS 3000

static hx_proc_t *D;
static hx_proc_t *W[3];
static char WORKDIR[600];

static void reset(void) {
  D = NULL;
  memset(W, 0, sizeof(W));
}

HX_SUITE(ranks, 300, reset, NULL);

/* What one rank took in one epoch. */
typedef struct rank_epoch_s {
  uint32_t batches;
  uint32_t bad_size;     /* batches whose size is not the batch size */
  hx_ids_t real, padded; /* ids of real and of padding records */
} rank_epoch_t;

/* Lockstep, as DDP's all-reduce makes it: no rank starts step k + 1
 * before every rank finished step k. A barrier whose waits are bounded
 * (a broken lockstep fails the test instead of hanging it). */
typedef struct lockstep_s {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int n, arrived;
  uint64_t gen;
  bool broken;
} lockstep_t;

static lockstep_t LOCKSTEP = {PTHREAD_MUTEX_INITIALIZER,
                              PTHREAD_COND_INITIALIZER, 0, 0, 0, false};

/* False when another rank broke the lockstep or the wait timed out. */
static bool lockstep_wait(lockstep_t *l) {
  pthread_mutex_lock(&l->mu);
  uint64_t gen = l->gen;
  if (++l->arrived == l->n) {
    l->arrived = 0;
    l->gen++;
    pthread_cond_broadcast(&l->cv);
  }
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_sec += NEXT_TIMEOUT_MS / 1000;
  while (l->gen == gen && !l->broken)
    if (pthread_cond_timedwait(&l->cv, &l->mu, &ts) == ETIMEDOUT)
      l->broken = true;
  bool ok = !l->broken;
  pthread_cond_broadcast(&l->cv);
  pthread_mutex_unlock(&l->mu);
  return ok;
}

static void lockstep_break(lockstep_t *l) {
  pthread_mutex_lock(&l->mu);
  l->broken = true;
  pthread_cond_broadcast(&l->cv);
  pthread_mutex_unlock(&l->mu);
}

typedef struct rank_s {
  int rank;
  bool lockstep; /* step with the others (LOCKSTEP) */
  ferry_client_options_t o;
  ferry_client_t *c;
  uint64_t steps;
  rank_epoch_t ep[EPOCHS];
  int rc;
  char err[600];
  /* The fault hook: rank 0 calls it after its `fault_after`th batch. */
  void (*fault)(void);
  uint32_t fault_after;
} rank_t;

static void push(hx_ids_t *v, uint64_t id) {
  if (v->n == v->cap) {
    v->cap = v->cap ? v->cap * 2 : 256;
    v->ids = realloc(v->ids, v->cap * sizeof(*v->ids));
    cr_assert_not_null(v->ids);
  }
  v->ids[v->n++] = id;
}

static void *rank_main(void *arg) {
  rank_t *r = arg;
  ferry_error_t err = {0};
  uint32_t e = 0, total = 0;
  for (;;) {
    const ferry_batch_t *b = NULL;
    int rc = ferry_next(r->c, &b, NEXT_TIMEOUT_MS, &err);
    if (rc == FERRY_EPOCH_END) {
      e++;
      continue;
    }
    if (rc == FERRY_END) {
      r->rc = 0;
      break;
    }
    if (rc != 0 || e >= EPOCHS) {
      if (r->lockstep)
        lockstep_break(&LOCKSTEP);
      r->rc = rc != 0 ? rc : -1;
      snprintf(r->err, sizeof(r->err), "rank %d epoch %u after %u batches: "
               "%s", r->rank, e, total,
               rc != 0 ? err.msg : "a batch past the last epoch");
      if (b != NULL)
        ferry_batch_release(r->c, b);
      break;
    }
    rank_epoch_t *re = &r->ep[e];
    re->batches++;
    re->bad_size += b->size != r->o.batch_size;
    for (uint32_t i = 0; i < b->size; i++)
      push(i < b->num_real ? &re->real : &re->padded, b->ids[i]);
    ferry_batch_release(r->c, b);
    if (r->lockstep && !lockstep_wait(&LOCKSTEP)) {
      r->rc = -1;
      snprintf(r->err, sizeof(r->err), "rank %d epoch %u step %u: the "
               "lockstep broke (a rank got no batch)", r->rank, e,
               re->batches);
      break;
    }
    if (r->rank > 0)
      usleep((useconds_t)r->rank * 2000);
    if (++total == r->fault_after && r->fault != NULL)
      r->fault();
  }
  return NULL;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* Whether every id of `sub` is in `set` (sorted). */
static bool all_in(const hx_ids_t *sub, const uint64_t *set, size_t n) {
  for (size_t i = 0; i < sub->n; i++)
    if (bsearch(&sub->ids[i], set, n, sizeof(uint64_t), cmp_u64) == NULL)
      return false;
  return true;
}

/* The run's shape, drawn from the seed. */
typedef struct shape_s {
  int world, files, per_file, batch, per_split;
  bool pad;
} shape_t;

static shape_t draw(unsigned seed) {
  srand(seed);
  shape_t s;
  s.world = 2 + rand() % 3;
  s.files = 2 + rand() % 4;
  s.per_file = 40 + rand() % 120;
  s.batch = 4 + rand() % 13;
  s.per_split = 10 + rand() % 40;
  s.pad = rand() % 2;
  /* Under drop the job needs at least one round. */
  while (!s.pad && s.files * s.per_file < s.world * s.batch)
    s.per_file += s.batch;
  return s;
}

static char PER_SPLIT[16];
static const char *DARGS[] = {"--records-per-split", PER_SPLIT, NULL};

static void start_cluster(const shape_t *s, int workers) {
  char why[512];
  snprintf(PER_SPLIT, sizeof(PER_SPLIT), "%d", s->per_split);
  hx_daemon_opts_t d = {.heartbeat_ms = 100,
                        .worker_timeout_ms = 1500,
                        .client_timeout_ms = CLIENT_TIMEOUT_MS,
                        .extra_argv = DARGS};
  snprintf(WORKDIR, sizeof(WORKDIR), "%s/dispatcher", hx_tmpdir());
  cr_assert_eq(hx_start_dispatcher_at(&D, &d, 0, WORKDIR, why, sizeof(why)),
               0, "%s", why);
  for (int i = 0; i < workers; i++)
    cr_assert_eq(hx_start_worker(&W[i], D->addr, NULL, why, sizeof(why)), 0,
                 "%s", why);
  cr_assert_eq(hx_wait_workers(D->addr, workers, 10000), workers);
}

static hx_dataset_t DS;
static char SPEC[1024];

/* Starts W rank clients of job "ranked" (all created before any reads:
 * the job is created by the first, joined by the others). */
static void start_ranks(rank_t *r, const shape_t *s) {
  memset(r, 0, sizeof(*r) * MAX_RANKS);
  for (int k = 0; k < s->world; k++) {
    r[k].rank = k;
    hx_client_options(&r[k].o, D->addr, SPEC);
    r[k].o.job_name = "ranked";
    r[k].o.num_epochs = EPOCHS;
    r[k].o.batch_size = (uint32_t)s->batch;
    r[k].o.drop_remainder = !s->pad;
    r[k].o.world_size = (uint32_t)s->world;
    r[k].o.rank = (uint32_t)k;
    r[k].c = it_new_client(&r[k].o);
    r[k].steps = ferry_client_steps_per_epoch(r[k].c);
  }
}

/* Runs the ranks to the end of the job and checks the guarantee. */
static void run_and_check(rank_t *r, const shape_t *s, const char *what) {
  pthread_t th[MAX_RANKS];
  for (int k = 0; k < s->world; k++)
    cr_assert_eq(pthread_create(&th[k], NULL, rank_main, &r[k]), 0);
  for (int k = 0; k < s->world; k++)
    pthread_join(th[k], NULL);
  bool failed = false;
  for (int k = 0; k < s->world; k++)
    failed |= r[k].rc != 0;
  if (failed)
    hx_dump_logs();
  for (int k = 0; k < s->world; k++)
    cr_assert_eq(r[k].rc, 0, "%s: %s", what, r[k].err);

  size_t n_all;
  uint64_t *all = hx_expected_ids(&DS, false, &n_all);
  uint64_t steps = r[0].steps;
  uint64_t dropped = ferry_client_dropped_per_epoch(r[0].c);
  uint64_t round = (uint64_t)s->world * (uint64_t)s->batch;
  uint64_t want_steps = s->pad ? (n_all + round - 1) / round : n_all / round;
  cr_assert_eq(steps, want_steps, "%s: steps_per_epoch %llu, not %llu", what,
               (unsigned long long)steps, (unsigned long long)want_steps);
  cr_assert_eq(dropped, s->pad ? 0 : n_all - want_steps * round,
               "%s: dropped_per_epoch %llu", what,
               (unsigned long long)dropped);
  for (int e = 0; e < EPOCHS; e++) {
    hx_ids_t real = {0};
    char line[256];
    int at = snprintf(line, sizeof(line), "%s epoch %d: steps", what, e);
    for (int k = 0; k < s->world; k++) {
      rank_epoch_t *re = &r[k].ep[e];
      at += snprintf(line + at, sizeof(line) - (size_t)at, " %u", re->batches);
      cr_assert_eq(r[k].steps, steps, "rank %d was told %llu steps", k,
                   (unsigned long long)r[k].steps);
      cr_assert_eq(re->batches, steps,
                   "%s, epoch %d: rank %d took %u batches, not %llu", what, e,
                   k, re->batches, (unsigned long long)steps);
      cr_assert_eq(re->bad_size, 0, "%s, epoch %d: rank %d had %u batches "
                   "not of %d records", what, e, k, re->bad_size, s->batch);
      if (!s->pad)
        cr_assert_eq(re->padded.n, 0, "drop: padding records");
      /* Each rank's share: an even one under pad, its steps' worth under
       * drop (a client that dies may repeat its unacknowledged tail,
       * which no test here does). */
      uint64_t share = s->pad ? n_all / (uint64_t)s->world +
                                    ((uint64_t)k < n_all % (uint64_t)s->world)
                              : steps * (uint64_t)s->batch;
      cr_assert_eq(re->real.n, share, "%s, epoch %d: rank %d had %zu real "
                   "records, not %llu", what, e, k, re->real.n,
                   (unsigned long long)share);
      /* Padding repeats the rank's own records of the epoch. */
      qsort(re->real.ids, re->real.n, sizeof(uint64_t), cmp_u64);
      if (re->real.n > 0)
        cr_assert(all_in(&re->padded, re->real.ids, re->real.n),
                  "%s, epoch %d: rank %d padded with records not its own",
                  what, e, k);
      for (size_t i = 0; i < re->real.n; i++)
        push(&real, re->real.ids[i]);
    }
    fprintf(stderr, "%s (of %llu each; %zu records, world %d, batch %d, "
            "%s)\n", line, (unsigned long long)steps, n_all, s->world,
            s->batch, s->pad ? "pad" : "drop");
    qsort(real.ids, real.n, sizeof(uint64_t), cmp_u64);
    for (size_t i = 1; i < real.n; i++)
      cr_assert_neq(real.ids[i], real.ids[i - 1],
                    "%s, epoch %d: record %llx reached two ranks", what, e,
                    (unsigned long long)real.ids[i]);
    cr_assert(all_in(&real, all, n_all), "%s: an id not of the dataset",
              what);
    cr_assert_eq(real.n, n_all - dropped,
                 "%s, epoch %d: %zu real records, not %llu", what, e, real.n,
                 (unsigned long long)(n_all - dropped));
    hx_ids_free(&real);
  }
  for (int k = 0; k < s->world; k++) {
    for (int e = 0; e < EPOCHS; e++) {
      hx_ids_free(&r[k].ep[e].real);
      hx_ids_free(&r[k].ep[e].padded);
    }
    ferry_client_free(r[k].c);
  }
  free(all);
}

/* Runs W ranks of shape `s` on `workers` workers: `lockstep`, as DDP
 * trains (a barrier after every batch); `fault` (may be NULL) at a random
 * batch of rank 0. */
static void run_shape(const char *name, shape_t s, int workers, bool lockstep,
                      void (*fault)(void)) {
  start_cluster(&s, workers);
  cr_assert_eq(hx_make_dataset(&DS, "data", s.files, s.per_file, 8, 8, 3), 0);
  hx_spec(&DS, NULL, s.batch, SPEC, sizeof(SPEC));
  rank_t r[MAX_RANKS];
  start_ranks(r, &s);
  if (lockstep) {
    LOCKSTEP.n = s.world;
    LOCKSTEP.arrived = 0;
    LOCKSTEP.broken = false;
    for (int k = 0; k < s.world; k++)
      r[k].lockstep = true;
  }
  if (fault != NULL) {
    r[0].fault = fault;
    r[0].fault_after = 1 + (uint32_t)(rand() % (int)(r[0].steps * EPOCHS));
    fprintf(stderr, "%s: the fault comes after rank 0's batch %u of %llu\n",
            name, r[0].fault_after,
            (unsigned long long)(r[0].steps * EPOCHS));
  }
  run_and_check(r, &s, name);
  hx_dataset_free(&DS);
}

/* Ranks in lockstep whose shares end inside files: 6 files of 50
 * records over 4 ranks (75 each under pad, 72 under drop) in batches
 * of 8; a rank's last records are the part of a file another rank
 * shares. */
static void lockstep_run(const char *name, bool pad) {
  shape_t s = {.world = 4, .files = 6, .per_file = 50, .batch = 8,
               .per_split = 50, .pad = pad};
  run_shape(name, s, 2, true, NULL);
}

Test(ranks, lockstep_ranks_sharing_files_pad) {
  lockstep_run("lockstep_ranks_sharing_files_pad", true);
}

Test(ranks, lockstep_ranks_sharing_files_drop) {
  lockstep_run("lockstep_ranks_sharing_files_drop", false);
}

static void scenario(const char *name, int workers, void (*fault)(void)) {
  /* Faults hit ranks in lockstep, as DDP trains. */
  run_shape(name, draw(hx_seed(name)), workers, fault != NULL, fault);
}

/* 65 records, 4 ranks, batches of 8: 3 steps each, rank 0 gets 17 real
 * records (8, 8 and 1 padded to 8), ranks 1 to 3 get 16 and a third
 * batch of no real record, filled with one of their own records. */
Test(ranks, padding_batches_of_no_real_record) {
  shape_t s = {.world = 4, .files = 5, .per_file = 13, .batch = 8,
               .per_split = 13, .pad = true};
  run_shape("padding_batches_of_no_real_record", s, 2, false, NULL);
}

Test(ranks, every_rank_takes_the_same_steps) {
  scenario("every_rank_takes_the_same_steps", 2, NULL);
}

static void kill_worker(void) { hx_stop(W[0], SIGKILL, 5000, NULL); }

Test(ranks, a_worker_killed_mid_epoch) {
  scenario("a_worker_killed_mid_epoch", 3, kill_worker);
}

static void restart_dispatcher(void) {
  char why[512];
  int port = atoi(strrchr(D->addr, ':') + 1);
  hx_daemon_opts_t d = {.heartbeat_ms = 100,
                        .worker_timeout_ms = 1500,
                        .client_timeout_ms = CLIENT_TIMEOUT_MS,
                        .extra_argv = DARGS};
  hx_stop(D, SIGKILL, 5000, NULL);
  cr_assert_eq(hx_start_dispatcher_at(&D, &d, port, WORKDIR, why,
                                      sizeof(why)),
               0, "%s", why);
}

Test(ranks, the_dispatcher_restarted_mid_epoch) {
  scenario("the_dispatcher_restarted_mid_epoch", 2, restart_dispatcher);
}

/* ---- A rank taken over (torchrun's elastic restart) --------------------- */

/* Starts it_client as rank 0 of the job; NULL when it exited before it
 * was ready (the rank still held by a client not yet declared lost). */
static hx_proc_t *rank_process(const char *name, char *out, size_t cap) {
  char why[512];
  hx_proc_t *p = NULL;
  snprintf(out, cap, "%s/%s.ids", hx_tmpdir(), name);
  char *argv[] = {FERRY_IT_CLIENT_BIN, D->addr, SPEC, "ranked", "2", out,
                  "20000", "-1", NULL};
  if (hx_spawn_marked(&p, name, argv, "ready: ", 10000, why, sizeof(why)) !=
      0) {
    fprintf(stderr, "%s: not started: %s\n", name, why);
    return NULL;
  }
  return p;
}

/* Records of `epoch` in an it_client log, and whether each is in `l`. */
static size_t epoch_records(const hx_client_log_t *l, uint32_t epoch) {
  size_t n = 0;
  for (size_t i = 0; i < l->n; i++)
    n += l->v[i].epoch == epoch;
  return n;
}

/* Rank 0 is a process (20 ms per step) killed at a random batch of the
 * first epoch; a new process joins as rank 0 once the dispatcher
 * declared the first lost (it is refused before, naming both clients),
 * and gets only the rank's remaining steps of that epoch: the steps the
 * dispatcher acknowledged are not taken again, and what the dead one
 * handed out unacknowledged (its tail) comes again. Rank 1 is a thread.
 * Drop policy, so that every step is a full batch of real records. */
Test(ranks, a_rank_killed_and_taken_over) {
  unsigned seed = hx_seed("a_rank_killed_and_taken_over");
  shape_t s = draw(seed);
  s.world = 2;
  s.pad = false;
  s.per_file = 60 + s.per_file;
  start_cluster(&s, 2);
  cr_assert_eq(hx_make_dataset(&DS, "data", s.files, s.per_file, 8, 8, 3), 0);
  hx_spec(&DS, NULL, s.batch, SPEC, sizeof(SPEC));
  char batch[16];
  snprintf(batch, sizeof(batch), "%d", s.batch);
  setenv("FERRY_IT_CLIENT_WORLD", "2", 1);
  setenv("FERRY_IT_CLIENT_RANK", "0", 1);
  setenv("FERRY_IT_CLIENT_BATCH", batch, 1);
  setenv("FERRY_IT_CLIENT_DROP", "1", 1);
  char out_a[600], out_b[600];
  hx_proc_t *a = rank_process("rank0-a", out_a, sizeof(out_a));
  cr_assert_not_null(a);

  rank_t r1[MAX_RANKS];
  memset(r1, 0, sizeof(r1));
  r1[0].rank = 1;
  hx_client_options(&r1[0].o, D->addr, SPEC);
  r1[0].o.job_name = "ranked";
  r1[0].o.num_epochs = EPOCHS;
  r1[0].o.batch_size = (uint32_t)s.batch;
  r1[0].o.drop_remainder = true;
  r1[0].o.world_size = 2;
  r1[0].o.rank = 1;
  r1[0].c = it_new_client(&r1[0].o);
  uint64_t steps = ferry_client_steps_per_epoch(r1[0].c);
  cr_assert_geq(steps, 2, "the shape gives %llu steps",
                (unsigned long long)steps);
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, rank_main, &r1[0]), 0);

  long kill_at = 1 + rand() % (long)(steps - 1);
  double until = hx_now_ms() + 30000;
  while (hx_client_log_batches(out_a) < kill_at && hx_now_ms() < until)
    usleep(5000); /* polling the process's output: bounded */
  cr_assert_geq(hx_client_log_batches(out_a), kill_at);
  hx_stop(a, SIGKILL, 5000, NULL);
  double killed_ms = hx_now_ms();
  fprintf(stderr, "rank 0 killed after %ld of %llu steps\n", kill_at,
          (unsigned long long)steps);

  /* Its heir: refused while the dead client's rank is held. */
  hx_proc_t *b = NULL;
  int refused = 0;
  until = hx_now_ms() + CLIENT_TIMEOUT_MS + 15000;
  while ((b = rank_process("rank0-b", out_b, sizeof(out_b))) == NULL &&
         hx_now_ms() < until) {
    refused++;
    usleep(200 * 1000); /* retrying a join: bounded */
  }
  cr_assert_not_null(b, "no new rank 0 within %d ms", CLIENT_TIMEOUT_MS +
                     15000);
  fprintf(stderr, "new rank 0 joined %.0f ms after the kill (%d refused)\n",
          hx_now_ms() - killed_ms, refused);
  int st = hx_stop(b, 0, 60000, NULL);
  pthread_join(th, NULL);
  unsetenv("FERRY_IT_CLIENT_WORLD");
  if (st != 0 || r1[0].rc != 0)
    hx_dump_logs();
  cr_assert_eq(st, 0, "the new rank 0 exited with status %d", st);
  cr_assert_eq(r1[0].rc, 0, "%s", r1[0].err);

  hx_client_log_t la, lb;
  char why[600];
  cr_assert_eq(hx_read_client_log(out_a, true, &la, why, sizeof(why)), 0,
               "%s", why);
  cr_assert_eq(hx_read_client_log(out_b, false, &lb, why, sizeof(why)), 0,
               "%s", why);
  uint64_t B = (uint64_t)s.batch;
  size_t a0 = epoch_records(&la, 0), b0 = epoch_records(&lb, 0),
         b1 = epoch_records(&lb, 1);
  uint64_t acked = hx_acked_at(&la, killed_ms);
  fprintf(stderr, "epoch 0: rank 0 took %zu steps then %zu (the dead one's "
          "last acknowledged count %llu records), rank 1 %u; epoch 1: %zu "
          "and %u (of %llu each)\n", a0 / B, b0 / B,
          (unsigned long long)acked, r1[0].ep[0].batches, b1 / B,
          r1[0].ep[1].batches, (unsigned long long)steps);
  /* The heir takes the rank's remaining steps: at least what the dead
   * one had not handed out, at most what the dispatcher had not
   * acknowledged. */
  cr_assert_eq(b0 % B, 0);
  cr_assert_geq(b0 / B + a0 / B, steps);
  cr_assert_leq(b0 / B, steps - acked / B);
  cr_assert_eq(r1[0].ep[0].batches, steps);
  cr_assert_eq(r1[0].ep[1].batches, steps);
  cr_assert_eq(b1, steps * B, "epoch 1: the new rank 0 took %zu records",
               b1);
  /* Every record once per epoch, but the dead one's unacknowledged tail,
   * which its heir may take again. */
  for (uint32_t e = 0; e < EPOCHS; e++) {
    hx_ids_t all = {0};
    for (size_t i = 0; i < r1[0].ep[e].real.n; i++)
      push(&all, r1[0].ep[e].real.ids[i]);
    for (size_t i = 0; i < lb.n; i++)
      if (lb.v[i].epoch == e)
        push(&all, lb.v[i].id);
    size_t tail = 0;
    for (size_t i = 0; i < la.n; i++) {
      if (la.v[i].epoch != e)
        continue;
      bool again = false;
      for (size_t k = 0; k < all.n && !again; k++)
        again = all.ids[k] == la.v[i].id;
      if (again) {
        cr_assert(hx_in_unacked_tail(&la, e, la.v[i].id,
                                     CLIENT_TIMEOUT_MS, killed_ms, 0),
                  "epoch %u: record %llx of the dead rank 0 came again but "
                  "was acknowledged", e, (unsigned long long)la.v[i].id);
        tail++;
      } else {
        push(&all, la.v[i].id);
      }
    }
    qsort(all.ids, all.n, sizeof(uint64_t), cmp_u64);
    for (size_t i = 1; i < all.n; i++)
      cr_assert_neq(all.ids[i], all.ids[i - 1], "epoch %u: %llx twice", e,
                    (unsigned long long)all.ids[i]);
    size_t n_all;
    uint64_t *want = hx_expected_ids(&DS, false, &n_all);
    uint64_t dropped = n_all - steps * B * 2;
    cr_assert_eq(all.n, n_all - dropped, "epoch %u: %zu distinct records, "
                 "not %llu", e, all.n, (unsigned long long)(n_all - dropped));
    cr_assert(all_in(&all, want, n_all));
    fprintf(stderr, "epoch %u: %zu distinct records, %zu again from the "
            "dead rank's unacknowledged tail\n", e, all.n, tail);
    free(want);
    hx_ids_free(&all);
  }
  for (int e = 0; e < EPOCHS; e++) {
    hx_ids_free(&r1[0].ep[e].real);
    hx_ids_free(&r1[0].ep[e].padded);
  }
  hx_client_log_free(&la);
  hx_client_log_free(&lb);
  ferry_client_free(r1[0].c);
  hx_dataset_free(&DS);
}

/* Two clients of one rank at once, or a client whose world size, batch
 * size or policy is not the job's: refused, naming both clients. */
Test(ranks, disagreeing_ranks_are_refused_naming_both) {
  shape_t s = {.world = 2, .files = 2, .per_file = 40, .batch = 4,
               .per_split = 20, .pad = true};
  start_cluster(&s, 1);
  cr_assert_eq(hx_make_dataset(&DS, "data", s.files, s.per_file, 8, 8, 3), 0);
  hx_spec(&DS, NULL, s.batch, SPEC, sizeof(SPEC));
  rank_t r[MAX_RANKS];
  start_ranks(r, &s);
  uint64_t holder = ferry_client_id(r[0].c);
  struct {
    uint32_t world, rank, batch;
    bool drop;
    const char *want;
  } bad[] = {{2, 0, 4, false, "is held by live client"},
             {3, 2, 4, false, "world_size 3"},
             {2, 1, 8, false, "batch 8"},
             {2, 1, 4, true, "world_size 2"}};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    ferry_client_options_t o;
    ferry_client_t *c = NULL;
    ferry_error_t err = {0};
    hx_client_options(&o, D->addr, SPEC);
    o.job_name = "ranked";
    o.num_epochs = EPOCHS;
    o.world_size = bad[i].world;
    o.rank = bad[i].rank;
    o.batch_size = bad[i].batch;
    o.drop_remainder = bad[i].drop;
    int rc = ferry_client_new(&o, &c, &err);
    cr_assert_eq(rc, FERRY_EINVAL, "case %zu: %d (%s)", i, rc, err.msg);
    cr_assert(strstr(err.msg, bad[i].want) != NULL, "case %zu: %s", i,
              err.msg);
    char who[32];
    snprintf(who, sizeof(who), "client %llu", (unsigned long long)holder);
    if (i == 0)
      cr_assert(strstr(err.msg, who) != NULL, "%s", err.msg);
    cr_assert(strstr(err.msg, "client ") != NULL, "%s", err.msg);
    cr_log_info("refused: %s", err.msg);
  }
  /* And before any RPC: a rank past the world, no job name. */
  ferry_client_options_t o;
  ferry_client_t *c = NULL;
  ferry_error_t err = {0};
  hx_client_options(&o, D->addr, SPEC);
  o.world_size = 2;
  o.rank = 2;
  o.job_name = "ranked";
  cr_assert_eq(ferry_client_new(&o, &c, &err), FERRY_EINVAL);
  cr_assert(strstr(err.msg, "rank 2 is not below world_size 2") != NULL,
            "%s", err.msg);
  o.rank = 1;
  o.job_name = NULL;
  cr_assert_eq(ferry_client_new(&o, &c, &err), FERRY_EINVAL);
  cr_assert(strstr(err.msg, "needs a job_name") != NULL, "%s", err.msg);
  for (int k = 0; k < s.world; k++)
    ferry_client_free(r[k].c);
  hx_dataset_free(&DS);
}
