/* bench_ranks: 4 ranks sharing one job against 4 private jobs, in one
 * run, on the same dispatcher and workers.
 *
 * Writes a 32x32x3 raw dataset of 8 files, starts ferry-dispatcher and
 * two ferry-workers as subprocesses (127.0.0.1, any port), and times, in
 * alternation (a, b, a, b, ...):
 *   (a) shared: 4 trainer threads, each a client of one named job with
 *       world_size 4 and its own rank, drop_remainder, batch B, E epochs
 *       (a fresh job name per round: "ranked-R");
 *   (b) private: 4 trainer threads, each an anonymous job whose spec reads
 *       its own quarter of the files (2 of the 8), same batch B, E epochs,
 *       drop_remainder.
 * Both modes deliver the same records: B divides a quarter of the dataset,
 * so every rank and every private job takes the same steps per epoch.
 * Every dataset (the shared spec and the four quarters) is registered
 * before the first round, so no header scan is timed.
 *
 * Every client is created before the clock starts; then the threads start
 * together (a barrier) and each reads its batches to FERRY_END, doing a
 * simulated step per batch: a read of one byte per cache line of the
 * batch, then --step-us of sleep (default 0: a trainer that takes its
 * batches as fast as they come). A mode's figure is its records over the
 * wall time of its slowest thread. Per rank the client's stall fraction
 * is measured over the read (ferry_client_stats before and after:
 * wait / total seconds of that window), and each rank's batches per epoch
 * must equal ferry_client_steps_per_epoch and each other's: the program
 * fails (exit 1) when they differ or when a mode delivers a record count
 * other than the expected one.
 *
 * Each round's row also gives each worker process's CPU seconds and, the
 * largest over the threads, the time from the barrier to the first batch,
 * the epoch boundaries (FERRY_EPOCH_END to the next batch, summed) and
 * the last batch to FERRY_END (docs/PERFORMANCE.md: a ranked job's end
 * waits for the ranks' heartbeats).
 *
 * Prints each round, a table of medians, the ratio shared / private
 * (target >= 0.90, PASS or below: a miss does not fail the program, as in
 * bench_e2e) and "bench ranks: ok".
 *
 * Usage: bench_ranks [--quick] [--per-file N] [--batch B] [--epochs E]
 *                    [--rounds R] [--step-us US] [--worker-threads T]
 *                    [--client-heartbeat-ms MS] (default 50, the harness's)
 *                    [--dispatcher PATH] [--worker PATH]
 */
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ferry/client.h"
#include "ferry/log.h"
#include "harness.h"
#include "rpc.h"

#define H 32
#define W 32
#define C 3
#define IMG (H * W * C)
#define NFILES 8
#define NRANKS 4
#define MAX_ROUNDS 15
#define MAX_EPOCHS 16
#define NEXT_TIMEOUT_MS 60000

static int opt_step_us;
static int opt_client_hb_ms = 50; /* the harness's client heartbeat */

/* One trainer thread. */
typedef struct trainer_s {
  int index;
  ferry_client_t *c;
  pthread_barrier_t *start;
  uint64_t steps_expected; /* per epoch */
  uint32_t batch;
  /* Results. */
  uint64_t records;
  uint32_t epoch_batches[MAX_EPOCHS];
  uint32_t epochs;
  uint32_t bad_size; /* batches not of the batch size */
  double seconds;    /* barrier to FERRY_END */
  double stall;      /* the client's wait / total over the read */
  double first_ms;   /* barrier to the first batch */
  double gap_ms;     /* epoch ends to the next epoch's first batch, summed */
  double end_ms;     /* the last batch's release to FERRY_END */
  int rc;
  char err[600];
} trainer_t;

static void *trainer_main(void *arg) {
  trainer_t *t = arg;
  ferry_error_t err = {0};
  ferry_client_stats_t s0, s1;
  volatile uint8_t sink = 0;
  pthread_barrier_wait(t->start);
  ferry_client_stats(t->c, &s0);
  double t0 = hx_now_ms(), t_epoch_end = -1, t_last = t0;
  uint32_t e = 0;
  for (;;) {
    const ferry_batch_t *b = NULL;
    int rc = ferry_next(t->c, &b, NEXT_TIMEOUT_MS, &err);
    double now = hx_now_ms();
    if (rc == FERRY_EPOCH_END) {
      t_epoch_end = now;
      e++;
      continue;
    }
    if (rc == FERRY_END) {
      t->end_ms = now - t_last;
      break;
    }
    if (rc == 0 && t->records == 0)
      t->first_ms = now - t0;
    if (rc == 0 && t_epoch_end >= 0) {
      t->gap_ms += now - t_epoch_end;
      t_epoch_end = -1;
    }
    if (rc != 0 || e >= MAX_EPOCHS) {
      t->rc = rc != 0 ? rc : -1;
      snprintf(t->err, sizeof(t->err), "trainer %d, epoch %u: %s", t->index,
               e, rc != 0 ? err.msg : "too many epochs");
      if (b != NULL)
        ferry_batch_release(t->c, b);
      break;
    }
    /* The simulated step: touch the batch, as a trainer's copy to the
     * device would, then the step's own time. */
    uint8_t x = 0;
    size_t bytes = (size_t)b->size * IMG;
    for (size_t i = 0; i < bytes; i += 64)
      x ^= b->images[i];
    sink ^= x;
    t->epoch_batches[e]++;
    t->bad_size += b->size != t->batch;
    t->records += b->num_real;
    ferry_batch_release(t->c, b);
    if (opt_step_us > 0)
      usleep((useconds_t)opt_step_us);
    t_last = hx_now_ms();
  }
  t->seconds = (hx_now_ms() - t0) / 1e3;
  t->epochs = e;
  ferry_client_stats(t->c, &s1);
  double total = s1.total_seconds - s0.total_seconds;
  t->stall = total > 0 ? (s1.wait_seconds - s0.wait_seconds) / total : 0;
  (void)sink;
  return NULL;
}

/* One timed run of a mode. */
typedef struct run_s {
  double seconds; /* the slowest thread's */
  uint64_t records;
  double rps;
  double stall[NRANKS];
  double thread_s[NRANKS];
  uint64_t steps[NRANKS];
  double wcpu[2]; /* CPU seconds of each worker's process over the run */
  double first_ms, gap_ms, end_ms; /* the largest of any thread */
} run_t;

typedef struct cfg_s {
  const char *dispatcher;
  hx_proc_t *workers[2];
  char shared_spec[2048];
  char quarter_spec[NRANKS][2048];
  int per_file, batch, epochs;
} cfg_t;

static int failures; /* step-count or record-count failures */

/* Runs one round of `shared` (a) or private (b). 0, or -1 when a client
 * could not start or a thread failed. */
static int run_mode(const cfg_t *cfg, bool shared, int round, run_t *out) {
  trainer_t t[NRANKS];
  pthread_t th[NRANKS];
  pthread_barrier_t start;
  char job[32];
  snprintf(job, sizeof(job), "ranked-%d", round);
  memset(t, 0, sizeof(t));
  memset(out, 0, sizeof(*out));
  int status = 0, created = 0;
  /* Every client first: the first rank creates the job, the others join. */
  for (int k = 0; k < NRANKS; k++) {
    ferry_client_options_t o;
    hx_client_options(&o, cfg->dispatcher,
                      shared ? cfg->shared_spec : cfg->quarter_spec[k]);
    o.num_epochs = cfg->epochs;
    o.heartbeat_ms = (uint32_t)opt_client_hb_ms;
    o.batch_size = (uint32_t)cfg->batch;
    o.drop_remainder = true;
    if (shared) {
      o.job_name = job;
      o.world_size = NRANKS;
      o.rank = (uint32_t)k;
    }
    ferry_error_t err = {0};
    t[k].index = k;
    t[k].batch = (uint32_t)cfg->batch;
    t[k].start = &start;
    if (ferry_client_new(&o, &t[k].c, &err) != 0) {
      fprintf(stderr, "bench_ranks: %s client %d: %s\n",
              shared ? "shared" : "private", k, err.msg);
      hx_dump_logs();
      status = -1;
      break;
    }
    created++;
    /* A private job of a quarter: its own batches per epoch. */
    t[k].steps_expected =
        shared ? ferry_client_steps_per_epoch(t[k].c)
               : (uint64_t)(2 * cfg->per_file) / (uint64_t)cfg->batch;
  }
  double w0[2];
  for (int i = 0; i < 2; i++)
    w0[i] = hx_proc_cpu_s(cfg->workers[i]->pid);
  if (status == 0) {
    pthread_barrier_init(&start, NULL, NRANKS);
    for (int k = 0; k < NRANKS; k++)
      pthread_create(&th[k], NULL, trainer_main, &t[k]);
    for (int k = 0; k < NRANKS; k++)
      pthread_join(th[k], NULL);
    pthread_barrier_destroy(&start);
  }
  for (int i = 0; i < 2; i++)
    out->wcpu[i] = hx_proc_cpu_s(cfg->workers[i]->pid) - w0[i];
  uint64_t want_steps = (uint64_t)(2 * cfg->per_file) / (uint64_t)cfg->batch;
  for (int k = 0; k < created && status == 0; k++) {
    if (t[k].rc != 0) {
      fprintf(stderr, "bench_ranks: %s\n", t[k].err);
      status = -1;
      continue;
    }
    if (t[k].seconds > out->seconds)
      out->seconds = t[k].seconds;
    out->records += t[k].records;
    out->stall[k] = t[k].stall;
    out->thread_s[k] = t[k].seconds;
    out->steps[k] = t[k].epoch_batches[0];
    if (t[k].first_ms > out->first_ms)
      out->first_ms = t[k].first_ms;
    if (t[k].gap_ms > out->gap_ms)
      out->gap_ms = t[k].gap_ms;
    if (t[k].end_ms > out->end_ms)
      out->end_ms = t[k].end_ms;
    bool bad = t[k].steps_expected != want_steps ||
               t[k].epochs != (uint32_t)cfg->epochs || t[k].bad_size != 0;
    for (int e = 0; e < cfg->epochs && e < MAX_EPOCHS; e++)
      bad |= t[k].epoch_batches[e] != want_steps;
    if (bad) {
      fprintf(stderr, "bench_ranks: %s round %d, %s %d: told %llu steps per "
              "epoch, took", shared ? "shared" : "private", round,
              shared ? "rank" : "job", k,
              (unsigned long long)t[k].steps_expected);
      for (int e = 0; e < cfg->epochs && e < MAX_EPOCHS; e++)
        fprintf(stderr, " %u", t[k].epoch_batches[e]);
      fprintf(stderr, " in %u epochs (%u batches not of %d); want %llu "
              "each\n", t[k].epochs, t[k].bad_size, cfg->batch,
              (unsigned long long)want_steps);
      failures++;
    }
  }
  for (int k = 0; k < created; k++)
    ferry_client_free(t[k].c);
  if (status != 0)
    return -1;
  uint64_t want = want_steps * (uint64_t)cfg->batch * NRANKS *
                  (uint64_t)cfg->epochs;
  if (out->records != want) {
    fprintf(stderr, "bench_ranks: %s round %d delivered %llu records, not "
            "%llu\n", shared ? "shared" : "private", round,
            (unsigned long long)out->records, (unsigned long long)want);
    failures++;
  }
  out->rps = out->seconds > 0 ? (double)out->records / out->seconds : 0;
  return 0;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(const double *v, int n) {
  double s[MAX_ROUNDS];
  memcpy(s, v, (size_t)n * sizeof(double));
  qsort(s, (size_t)n, sizeof(double), cmp_double);
  return n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}

static void print_run(const char *mode, int round, const run_t *r) {
  printf("  %-8s %5d %12.0f %8.3f  ", mode, round, r->rps, r->seconds);
  for (int k = 0; k < NRANKS; k++)
    printf(" %5.1f%%", r->stall[k] * 100.0);
  printf("   ");
  for (int k = 0; k < NRANKS; k++)
    printf(" %6.3f", r->thread_s[k]);
  printf("    %5.2f %5.2f   %5.0f %5.0f %5.0f\n", r->wcpu[0], r->wcpu[1],
         r->first_ms, r->gap_ms, r->end_ms);
  fflush(stdout);
}

int main(int argc, char **argv) {
  bool quick = false;
  int per_file = 65536, batch = 256, epochs = 2, rounds = 3, wthreads = 1;
  bool per_file_set = false, batch_set = false, rounds_set = false;
  static const struct option longopts[] = {
      {"quick", no_argument, NULL, 'q'},
      {"per-file", required_argument, NULL, 'n'},
      {"batch", required_argument, NULL, 'B'},
      {"epochs", required_argument, NULL, 'E'},
      {"rounds", required_argument, NULL, 'R'},
      {"step-us", required_argument, NULL, 'S'},
      {"worker-threads", required_argument, NULL, 't'},
      {"client-heartbeat-ms", required_argument, NULL, 'H'},
      {"dispatcher", required_argument, NULL, 'd'},
      {"worker", required_argument, NULL, 'w'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0}};
  int ch;
  while ((ch = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
    switch (ch) {
    case 'q': quick = true; break;
    case 'n': per_file = atoi(optarg); per_file_set = true; break;
    case 'B': batch = atoi(optarg); batch_set = true; break;
    case 'E': epochs = atoi(optarg); break;
    case 'R': rounds = atoi(optarg); rounds_set = true; break;
    case 'S': opt_step_us = atoi(optarg); break;
    case 't': wthreads = atoi(optarg); break;
    case 'H': opt_client_hb_ms = atoi(optarg); break;
    case 'd': setenv("FERRY_IT_DISPATCHER", optarg, 1); break;
    case 'w': setenv("FERRY_IT_WORKER", optarg, 1); break;
    default:
      fprintf(ch == 'h' ? stdout : stderr,
              "usage: bench_ranks [--quick] [--per-file N] [--batch B] "
              "[--epochs E] [--rounds R]\n"
              "                   [--step-us US] [--worker-threads T] "
              "[--client-heartbeat-ms MS]\n"
              "                   [--dispatcher PATH] [--worker PATH]\n");
      return ch == 'h' ? 0 : 2;
    }
  }
  if (quick) {
    if (!per_file_set)
      per_file = 1024;
    if (!batch_set)
      batch = 64;
    if (!rounds_set)
      rounds = 1;
  }
  if (per_file < 1 || batch < 1 || (2 * per_file) % batch != 0 ||
      epochs < 1 || epochs > MAX_EPOCHS || rounds < 1 ||
      rounds > MAX_ROUNDS || opt_step_us < 0 || wthreads < 1 ||
      wthreads > 16 || opt_client_hb_ms < 1) {
    fprintf(stderr, "bench_ranks: --batch must divide 2 x --per-file (a "
            "quarter of the files), --epochs 1..16, --rounds 1..15, "
            "--worker-threads 1..16, --client-heartbeat-ms >= 1\n");
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  ferry_log_set_callback(ferry_log_to_stderr, NULL);
  ferry_log_set_level(FERRY_LOG_WARN); /* not 16 transport lines a round */
  hx_client_log_from_env(); /* FERRY_IT_CLIENT_LOG=debug */
  ferry__rpc_init();

  hx_dataset_t ds;
  double t0 = hx_now_ms();
  if (hx_make_dataset(&ds, "ranks", NFILES, per_file, H, W, C) != 0) {
    fprintf(stderr, "bench_ranks: cannot write the dataset in %s\n",
            hx_tmpdir());
    return 1;
  }
  uint64_t total = (uint64_t)NFILES * (uint64_t)per_file;
  printf("bench ranks: %llu records of %dx%dx%d raw (%.1f MB) in %d files, "
         "written in %.1f s; 2 workers --threads %d; batch %d, %d epochs, "
         "%d rounds per mode, step %d us + touch, client heartbeat %d ms\n",
         (unsigned long long)total, H, W, C, (double)total * IMG / 1e6,
         NFILES, (hx_now_ms() - t0) / 1e3, wthreads, batch, epochs, rounds,
         opt_step_us, opt_client_hb_ms);
  fflush(stdout);

  cfg_t cfg;
  memset(&cfg, 0, sizeof(cfg));
  cfg.per_file = per_file;
  cfg.batch = batch;
  cfg.epochs = epochs;
  hx_spec(&ds, NULL, batch, cfg.shared_spec, sizeof(cfg.shared_spec));
  for (int k = 0; k < NRANKS; k++)
    snprintf(cfg.quarter_spec[k], sizeof(cfg.quarter_spec[k]),
             "tfrecord(\"%s\", \"%s\") | decode(raw, %d, %d, %d) | "
             "batch(%d)", ds.files[2 * k], ds.files[2 * k + 1], H, W, C,
             batch);

  int status = 0;
  char why[512];
  hx_proc_t *d = NULL, *w[2] = {NULL, NULL};
  hx_daemon_opts_t dopt = {.heartbeat_ms = 100};
  hx_daemon_opts_t wopt = {.heartbeat_ms = 100,
                           .threads = wthreads,
                           .buffer_bytes = 256ull << 20};
  run_t runs[2][MAX_ROUNDS];
  int done[2] = {0, 0};
  if (hx_start_dispatcher(&d, &dopt, why, sizeof(why)) != 0) {
    fprintf(stderr, "bench_ranks: %s\n", why);
    status = 1;
    goto out;
  }
  cfg.dispatcher = d->addr;
  /* Header scans now, not in a timed round. */
  if (hx_register_dataset(d->addr, cfg.shared_spec, NULL, why,
                          sizeof(why)) != 0) {
    fprintf(stderr, "bench_ranks: %s\n", why);
    status = 1;
    goto out;
  }
  for (int k = 0; k < NRANKS; k++) {
    if (hx_register_dataset(d->addr, cfg.quarter_spec[k], NULL, why,
                            sizeof(why)) != 0) {
      fprintf(stderr, "bench_ranks: %s\n", why);
      status = 1;
      goto out;
    }
  }
  for (int i = 0; i < 2; i++) {
    if (hx_start_worker(&w[i], d->addr, &wopt, why, sizeof(why)) != 0) {
      fprintf(stderr, "bench_ranks: %s\n", why);
      status = 1;
      goto out;
    }
  }
  if (hx_wait_workers(d->addr, 2, 10000) < 2) {
    fprintf(stderr, "bench_ranks: 2 workers did not register\n");
    hx_dump_logs();
    status = 1;
    goto out;
  }

  cfg.workers[0] = w[0];
  cfg.workers[1] = w[1];
  printf("\n  %-8s %5s %12s %8s   %-30s %-31s %-14s %s\n", "mode", "round",
         "records/s", "seconds", "stalled, rank/job 0..3",
         "seconds, thread 0..3", "worker CPU s",
         "first/gaps/end ms");
  for (int r = 0; r < rounds; r++) {
    for (int m = 0; m < 2; m++) {
      bool shared = m == 0;
      run_t *x = &runs[m][r];
      if (run_mode(&cfg, shared, r, x) != 0) {
        status = 1;
        goto out;
      }
      done[m]++;
      print_run(shared ? "shared" : "private", r, x);
    }
  }

out:;
  int pass = 0, fail = 0;
  if (done[0] > 0 && done[0] == done[1]) {
    int n = done[0];
    double rps[2][MAX_ROUNDS], st[2][NRANKS][MAX_ROUNDS];
    for (int m = 0; m < 2; m++)
      for (int i = 0; i < n; i++) {
        rps[m][i] = runs[m][i].rps;
        for (int k = 0; k < NRANKS; k++)
          st[m][k][i] = runs[m][i].stall[k];
      }
    printf("\nmedians of %d rounds (steps per epoch: shared ranks", n);
    for (int k = 0; k < NRANKS; k++)
      printf(" %llu", (unsigned long long)runs[0][0].steps[k]);
    printf(", private jobs");
    for (int k = 0; k < NRANKS; k++)
      printf(" %llu", (unsigned long long)runs[1][0].steps[k]);
    printf("):\n  %-30s %12s %10s   %s\n", "mode", "records/s", "range",
           "stall fraction, rank/job 0..3");
    for (int m = 0; m < 2; m++) {
      double lo = rps[m][0], hi = rps[m][0];
      for (int i = 1; i < n; i++) {
        lo = rps[m][i] < lo ? rps[m][i] : lo;
        hi = rps[m][i] > hi ? rps[m][i] : hi;
      }
      printf("  %-30s %12.0f %4.0fk-%.0fk  ",
             m == 0 ? "shared: 4 ranks of one job" : "private: 4 quarter jobs",
             median(rps[m], n), lo / 1e3, hi / 1e3);
      for (int k = 0; k < NRANKS; k++)
        printf(" %5.1f%%", median(st[m][k], n) * 100.0);
      printf("\n");
    }
    double ratio = median(rps[1], n) > 0
                       ? median(rps[0], n) / median(rps[1], n)
                       : 0;
    bool ok = ratio >= 0.9;
    /* Each round's a over its b, the runs next to each other in time:
     * printed next to the target, less moved by a drifting load. */
    double per_round[MAX_ROUNDS];
    for (int i = 0; i < n; i++)
      per_round[i] = rps[1][i] > 0 ? rps[0][i] / rps[1][i] : 0;
    printf("ratios (records/s):\n  %-52s %6.2f  (target >= 0.90: %s; "
           "median of the %d rounds' own ratios %.2f)\n",
           "shared 4 ranks / 4 private quarter jobs", ratio,
           ok ? "PASS" : "below", n, median(per_round, n));
    if (ok)
      pass++;
    else
      fail++;
  }
  printf("targets: %d PASS, %d below\n", pass, fail);
  if (failures > 0) {
    fprintf(stderr, "bench_ranks: %d step or record count failures\n",
            failures);
    status = 1;
  }
  if (w[1])
    hx_stop(w[1], SIGTERM, 3000, NULL);
  if (w[0])
    hx_stop(w[0], SIGTERM, 3000, NULL);
  if (d)
    hx_stop(d, SIGTERM, 3000, NULL);
  hx_reap_all();
  hx_dataset_free(&ds);
  ferry__rpc_shutdown();
  if (status == 0)
    printf("bench ranks: ok\n");
  return status;
}
