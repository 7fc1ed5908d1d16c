/* Bounded resources, measured on real daemons:
 *
 * (a) a worker's resident memory stays within --buffer-bytes plus a
 *     stated constant while its only client sleeps 200 ms per batch, over
 *     a dataset many times that size (unbounded buffering would hold it
 *     all);
 * (b) the dispatcher's resident memory is flat across 1,000 short-lived
 *     clients of one named job and across 1,000 private jobs run to the
 *     end (each garbage-collected after --job-gc-ms);
 * (c) the dispatcher's open file descriptors are flat across the churn of
 *     50 workers, each started, registered and killed with -9.
 *
 * Each prints what it measured. */
#include <criterion/criterion.h>
#include <criterion/hooks.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "it_cluster.h"

static hx_proc_t *D;
static hx_proc_t *W[2];

static void reset(void) {
  D = NULL;
  memset(W, 0, sizeof(W));
}

static void remove_shm_dir(void);
HX_SUITE(resources, 300, reset, remove_shm_dir);

/* (a) The worker's constant over --buffer-bytes: reader buffers, one
 * record, the record table, gRPC's buffers and threads, malloc slack (the
 * same constant as test_worker_faults' shuffled GZIP shard). */
#define WORKER_CONSTANT_KIB (32L << 10)
#define WORKER_BUFFER (4u << 20)

Test(resources, worker_rss_within_buffer_bytes_under_a_slow_trainer) {
  hx_dataset_t ds;
  /* 8 files of 1,500 records of 12 KiB: 147 MB, over 4 times the bound. */
  cr_assert_eq(hx_make_dataset(&ds, "big", 8, 1500, 64, 64, 3), 0);
  hx_daemon_opts_t wo = {.threads = 2, .buffer_bytes = WORKER_BUFFER};
  it_cluster(&D, W, 1, NULL, &wo);
  long rss0 = hx_status_kib(W[0]->pid, "VmRSS");
  cr_assert_gt(rss0, 0);
  long bound = rss0 + (long)(WORKER_BUFFER >> 10) + WORKER_CONSTANT_KIB;
  double dataset_mib =
      (double)ds.nfiles * ds.per_file * (64 * 64 * 3 + 60) / (1 << 20);
  /* Unbounded buffering would show: the dataset is over 3 times what the
   * worker may add. */
  cr_assert_gt(dataset_mib, 3.0 * (double)(bound - rss0) / 1024);

  char spec[1024];
  hx_spec(&ds, NULL, 32, spec, sizeof(spec));
  ferry_client_options_t o;
  hx_client_options(&o, D->addr, spec);
  o.num_epochs = 1;
  ferry_client_t *c = it_new_client(&o);
  ferry_error_t err = {0};
  long peak = rss0, samples = 0;
  /* 30 batches, 200 ms each: 6 s in which the worker could have read the
   * whole dataset many times over. */
  for (int i = 0; i < 30; i++) {
    const ferry_batch_t *b = NULL;
    int rc = ferry_next(c, &b, 10000, &err);
    if (rc != 0)
      hx_dump_logs();
    cr_assert_eq(rc, 0, "batch %d: %d %s", i, rc, err.msg);
    for (int k = 0; k < 4; k++) { /* the trainer's 200 ms step, sampled */
      usleep(50 * 1000);
      long rss = hx_status_kib(W[0]->pid, "VmRSS");
      peak = rss > peak ? rss : peak;
      samples++;
    }
    ferry_batch_release(c, b);
  }
  long hwm = hx_status_kib(W[0]->pid, "VmHWM");
  fprintf(stderr,
          "worker memory under a trainer sleeping 200 ms per batch: VmRSS "
          "%ld KiB at start, sampled peak %ld KiB (%ld samples), VmHWM %ld "
          "KiB; bound %ld KiB (start + --buffer-bytes %u MiB + %ld MiB); "
          "dataset %.0f MiB\n",
          rss0, peak, samples, hwm, bound, WORKER_BUFFER >> 20,
          WORKER_CONSTANT_KIB >> 10, dataset_mib);
  if (hx_figures_asserted("the worker's VmRSS bound")) {
    cr_assert_leq(peak, bound, "sampled VmRSS %ld KiB over %ld KiB", peak,
                  bound);
    cr_assert_leq(hwm, bound, "VmHWM %ld KiB over %ld KiB", hwm, bound);
  }
  ferry_client_free(c);
  hx_dataset_free(&ds);
}

/* (b) Growth allowed over the last 900 of 1,000 (the first 100 warm
 * the allocator, gRPC's pools and the dispatcher's tables). */
#define DISPATCHER_GROWTH_KIB 2048L
#define N_SHORT 1000
#define WARMUP 100
#define CHURN_THREADS 4

/* What GetStatus lists now. */
static hx_status_counts_t status_now(void) {
  hx_status_counts_t c;
  cr_assert_eq(hx_status_counts(D->addr, &c), 0, "GetStatus failed");
  return c;
}

/* The churn's journal lives on tmpfs when there is one: these tests
 * measure memory, and 1,000 jobs of fsyncs on a disk would take a
 * minute. Removed after each test. */
static char SHM_DIR[64];

static void remove_shm_dir(void) {
  if (SHM_DIR[0] != '\0') {
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", SHM_DIR);
    if (system(cmd) != 0)
      fprintf(stderr, "could not remove %s\n", SHM_DIR);
    SHM_DIR[0] = '\0';
  }
}

static void dispatcher_for_churn(hx_dataset_t *ds, char *spec, size_t cap) {
  static const char *const gc[] = {"--job-gc-ms", "200", NULL};
  hx_daemon_opts_t d = {.extra_argv = gc};
  char why[512], wd[128];
  const char *dir = NULL;
  snprintf(SHM_DIR, sizeof(SHM_DIR), "/dev/shm/ferry-it-res-XXXXXX");
  if (mkdtemp(SHM_DIR) != NULL) {
    snprintf(wd, sizeof(wd), "%s/dispatcher", SHM_DIR);
    dir = wd;
  } else {
    SHM_DIR[0] = '\0';
  }
  cr_assert_eq(hx_start_dispatcher_at(&D, &d, 0, dir, why, sizeof(why)), 0,
               "%s", why);
  cr_assert_eq(hx_start_worker(&W[0], D->addr, NULL, why, sizeof(why)), 0,
               "%s", why);
  cr_assert_eq(hx_wait_workers(D->addr, 1, 10000), 1);
  cr_assert_eq(hx_make_dataset(ds, "tiny", 1, 64, 8, 8, 3), 0);
  hx_spec(ds, NULL, 64, spec, cap);
}

/* Short-lived clients on one thread: each joins (job NULL: a private job
 * of one epoch, run to its end; else the named job, running forever, for
 * one batch), then leaves. */
typedef struct churner_s {
  const char *spec, *job;
  int n;
  int failed; /* clients that did not do their part */
  char why[640];
} churner_t;

static void *churner(void *arg) {
  churner_t *t = arg;
  for (int i = 0; i < t->n; i++) {
    ferry_client_options_t o;
    hx_client_options(&o, D->addr, t->spec);
    o.job_name = t->job;
    o.num_epochs = t->job == NULL ? 1 : -1;
    ferry_client_t *c = NULL;
    ferry_error_t err = {0};
    const ferry_batch_t *b;
    int rc = ferry_client_new(&o, &c, &err);
    while (rc == 0 || rc == FERRY_EPOCH_END) {
      rc = ferry_next(c, &b, 10000, &err);
      if (rc == 0) {
        ferry_batch_release(c, b);
        if (t->job != NULL)
          break;
      }
    }
    if (rc != (t->job != NULL ? 0 : FERRY_END)) {
      if (t->failed++ == 0)
        snprintf(t->why, sizeof(t->why), "client %d: %d %s", i, rc, err.msg);
    }
    ferry_client_free(c);
  }
  return NULL;
}

static void churn_clients(const char *spec, const char *job, int n) {
  pthread_t th[CHURN_THREADS];
  churner_t t[CHURN_THREADS];
  for (int i = 0; i < CHURN_THREADS; i++) {
    t[i] = (churner_t){.spec = spec, .job = job, .n = n / CHURN_THREADS};
    cr_assert_eq(pthread_create(&th[i], NULL, churner, &t[i]), 0);
  }
  for (int i = 0; i < CHURN_THREADS; i++)
    pthread_join(th[i], NULL);
  for (int i = 0; i < CHURN_THREADS; i++) {
    if (t[i].failed)
      hx_dump_logs();
    cr_assert_eq(t[i].failed, 0, "%d short-lived clients failed; first: %s",
                 t[i].failed, t[i].why);
  }
}

static long churn(const char *what, const char *spec, const char *job) {
  double t0 = hx_now_ms();
  churn_clients(spec, job, WARMUP);
  long rss_warm = hx_status_kib(D->pid, "VmRSS");
  churn_clients(spec, job, N_SHORT - WARMUP);
  long rss = hx_status_kib(D->pid, "VmRSS");
  fprintf(stderr,
          "dispatcher memory over %d %s (%d threads, journal on %s): VmRSS "
          "%ld KiB after %d, %ld KiB after %d (growth %ld KiB, %.0f bytes "
          "each; bound %ld KiB); %.1f s\n",
          N_SHORT, what, CHURN_THREADS, SHM_DIR[0] ? "tmpfs" : "disk",
          rss_warm, WARMUP, rss, N_SHORT, rss - rss_warm,
          (double)(rss - rss_warm) * 1024 / (N_SHORT - WARMUP),
          DISPATCHER_GROWTH_KIB, (hx_now_ms() - t0) / 1000);
  if (hx_figures_asserted("the dispatcher's VmRSS growth"))
    cr_assert_leq(rss - rss_warm, DISPATCHER_GROWTH_KIB,
                  "%s: the dispatcher grew %ld KiB", what, rss - rss_warm);
  return rss - rss_warm;
}

Test(resources, dispatcher_rss_flat_across_short_lived_clients) {
  hx_dataset_t ds;
  char spec[1024];
  dispatcher_for_churn(&ds, spec, sizeof(spec));
  churn("short-lived clients of one named job", spec, "churn");
  hx_dataset_free(&ds);
}

Test(resources, dispatcher_rss_flat_across_finished_jobs) {
  hx_dataset_t ds;
  char spec[1024];
  dispatcher_for_churn(&ds, spec, sizeof(spec));
  churn("private jobs run to their end", spec, NULL);
  /* Finished jobs are collected --job-gc-ms (200 ms) after they end: the
   * status lists none soon after. */
  double end = hx_now_ms() + 5000;
  int jobs;
  while ((jobs = status_now().jobs) > 0 && hx_now_ms() < end)
    usleep(100 * 1000); /* the GC tick: bounded by 5 s */
  fprintf(stderr, "jobs listed after the churn: %d\n", jobs);
  cr_assert_eq(jobs, 0, "%d finished jobs not collected", jobs);
  hx_dataset_free(&ds);
}

/* (c) Descriptors allowed over the count before the churn. */
#define FD_SLACK 8
#define N_WORKERS_CHURNED 50

Test(resources, dispatcher_fds_flat_across_worker_churn) {
  char why[512];
  hx_daemon_opts_t dopts = {.worker_timeout_ms = 500};
  cr_assert_eq(hx_start_dispatcher(&D, &dopts, why, sizeof(why)), 0, "%s",
               why);
  /* One worker stays, so that the dispatcher has the steady state of a
   * live cluster; the churned ones come and go beside it. */
  cr_assert_eq(hx_start_worker(&W[0], D->addr, NULL, why, sizeof(why)), 0,
               "%s", why);
  cr_assert_eq(hx_wait_workers(D->addr, 1, 10000), 1);
  int fds0 = hx_count_fds(D->pid);
  cr_assert_gt(fds0, 0);
  double t0 = hx_now_ms();
  for (int i = 0; i < N_WORKERS_CHURNED; i++) {
    /* Registered: one more worker listed (lost ones stay listed). */
    int listed = status_now().workers;
    cr_assert_eq(hx_start_worker(&W[1], D->addr, NULL, why, sizeof(why)), 0,
                 "%s", why);
    double end = hx_now_ms() + 10000;
    while (status_now().workers == listed && hx_now_ms() < end)
      usleep(10 * 1000); /* its first heartbeat: bounded by 10 s */
    cr_assert_gt(status_now().workers, listed,
                 "churned worker %d did not register", i);
    hx_stop(W[1], SIGKILL, 5000, NULL);
    hx_forget(W[1]);
    W[1] = NULL;
  }
  /* Every churned worker declared lost (timeout 500 ms). */
  double end = hx_now_ms() + 10000;
  hx_status_counts_t st;
  while ((st = status_now()).alive > 1 && hx_now_ms() < end)
    usleep(100 * 1000); /* bounded by 10 s */
  int fds1 = hx_count_fds(D->pid);
  fprintf(stderr,
          "dispatcher descriptors: %d before, %d after %d workers started "
          "and killed with -9 (%.1f s); bound %d; status lists %d workers "
          "(%d alive)\n",
          fds0, fds1, N_WORKERS_CHURNED, (hx_now_ms() - t0) / 1000,
          fds0 + FD_SLACK, st.workers, st.alive);
  cr_assert_eq(st.alive, 1, "%d workers alive", st.alive);
  cr_assert_leq(fds1, fds0 + FD_SLACK, "descriptors %d -> %d", fds0, fds1);
}
