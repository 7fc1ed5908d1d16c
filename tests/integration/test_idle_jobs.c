/* Idle jobs do not starve shared workers (security report): N clients
 * created with ferry_client_new in this process, each with its own
 * anonymous job, that never call ferry_next (a trainer compiling its
 * model, or a client that asks for splits and never reads), next to one
 * real job on the same two workers. Checked: each worker's resident
 * memory stays within its size at rest + --buffer-bytes + 32 MiB, and
 * the real job's records/s is at least half of what it gets alone.
 * Before the fix, 20 such jobs left the real job 0 records in 90 s and
 * 500 grew each worker to 780 MB at --buffer-bytes 8M.
 *
 * FERRY_IT_IDLE_JOBS sets N (default 60; 500 by hand). Every wait is
 * bounded; every record id of the real job's epochs is counted. The
 * rates are of 5 epochs after a first one, the better of two clients,
 * alone and then next to the idle jobs. */
#include <criterion/criterion.h>
#include <criterion/hooks.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "it_cluster.h"

#define NEXT_TIMEOUT_MS 20000
#define WORKER_BUFFER (8u << 20)
#define WORKER_CONSTANT_KIB (32L << 10)

static hx_proc_t *D;
static hx_proc_t *W[2];

static void reset(void) {
  D = NULL;
  memset(W, 0, sizeof(W));
}

HX_SUITE(idle_jobs, 600, reset, NULL);

/* Epochs of the real job measured after a first one (the client's start,
 * its first grants and streams, is not what is compared). */
#define MEASURED_EPOCHS 5

/* 1 + MEASURED_EPOCHS epochs of `spec` on a new client, every id of each
 * once; returns the records/s of the measured ones together, printing
 * each epoch's. */
static double measure(const char *spec, const hx_dataset_t *ds,
                      const char *what) {
  ferry_client_options_t o;
  hx_client_options(&o, D->addr, spec);
  o.num_epochs = 1 + MEASURED_EPOCHS;
  ferry_client_t *c = it_new_client(&o);
  size_t n;
  uint64_t *want = hx_expected_ids(ds, false, &n);
  size_t records = 0;
  double ms_total = 0;
  fprintf(stderr, "real job %s: records/s per epoch:", what);
  for (int e = 0; e <= MEASURED_EPOCHS; e++) {
    hx_ids_t got = {0};
    ferry_error_t err = {0};
    double t0 = hx_now_ms();
    int rc = hx_collect_epoch(c, &got, ds, false, NEXT_TIMEOUT_MS, NULL,
                              NULL, &err);
    double ms = hx_now_ms() - t0;
    if (rc != FERRY_EPOCH_END)
      hx_dump_logs();
    cr_assert_eq(rc, FERRY_EPOCH_END, "%s, epoch %d: ferry_next returned %d "
                 "(%s) after %zu records in %.0f ms: %s", what, e, rc,
                 rc < 0 ? ferry_strerror(rc) : "", got.n, ms, err.msg);
    char why[256];
    bool same = hx_same_multiset(got.ids, got.n, want, n, why, sizeof(why));
    cr_assert(same, "%s, epoch %d: %s", what, e, why);
    fprintf(stderr, " %s%.0f", e == 0 ? "(first, not counted) " : "",
            (double)got.n * 1000.0 / (ms > 1 ? ms : 1));
    if (e > 0) {
      records += got.n;
      ms_total += ms;
    }
    hx_ids_free(&got);
  }
  fprintf(stderr, "\n");
  free(want);
  ferry_client_free(c);
  return (double)records * 1000.0 / (ms_total > 1 ? ms_total : 1);
}

static long rss_max(long *peak) {
  for (int i = 0; i < 2; i++) {
    long r = hx_status_kib(W[i]->pid, "VmRSS");
    if (r > peak[i])
      peak[i] = r;
  }
  return peak[0] > peak[1] ? peak[0] : peak[1];
}

Test(idle_jobs, idle_clients_hold_no_worker) {
  int n_idle = 60;
  const char *env = getenv("FERRY_IT_IDLE_JOBS");
  if (env != NULL && atoi(env) > 0)
    n_idle = atoi(env);
  hx_dataset_t real, idle;
  cr_assert_eq(hx_make_dataset(&real, "real", 8, 3000, 32, 32, 3), 0);
  /* 12 KiB records: a task that ran would fill chunks and hold a record. */
  cr_assert_eq(hx_make_dataset(&idle, "idle", 4, 1000, 64, 64, 3), 0);
  hx_daemon_opts_t wo = {.threads = 1, .buffer_bytes = WORKER_BUFFER};
  it_cluster(&D, W, 2, NULL, &wo);
  char spec_real[1024], spec_idle[1024];
  hx_spec(&real, NULL, 32, spec_real, sizeof(spec_real));
  hx_spec(&idle, NULL, 32, spec_idle, sizeof(spec_idle));

  /* The two cores are shared: several epochs each time, and the better
   * of two clients' runs. */
  double alone = measure(spec_real, &real, "alone");
  double again = measure(spec_real, &real, "alone");
  alone = again > alone ? again : alone;
  long rest[2], peak[2] = {0, 0};
  for (int i = 0; i < 2; i++)
    rest[i] = hx_status_kib(W[i]->pid, "VmRSS");
  long rest_max = rest[0] > rest[1] ? rest[0] : rest[1];
  long bound = rest_max + (long)(WORKER_BUFFER >> 10) + WORKER_CONSTANT_KIB;

  ferry_client_t **idlers = calloc((size_t)n_idle, sizeof(*idlers));
  cr_assert_not_null(idlers);
  double t0 = hx_now_ms();
  for (int i = 0; i < n_idle; i++) {
    ferry_client_options_t o;
    hx_client_options(&o, D->addr, spec_idle);
    o.num_epochs = 1;
    idlers[i] = it_new_client(&o);
    if (i % 10 == 0)
      rss_max(peak);
  }
  fprintf(stderr, "%d idle clients (one job each) created in %.0f ms\n",
          n_idle, hx_now_ms() - t0);
  /* Long enough for their heartbeats to ask and their tasks to start. */
  for (int i = 0; i < 20; i++) {
    usleep(100 * 1000);
    rss_max(peak);
  }
  double busy = measure(spec_real, &real, "next to idle jobs");
  rss_max(peak);
  again = measure(spec_real, &real, "next to idle jobs");
  busy = again > busy ? again : busy;
  long top = rss_max(peak);
  fprintf(stderr,
          "real job: %.0f records/s alone, %.0f records/s next to %d idle "
          "jobs (ratio %.2f; %d epochs of %d records each, the better of "
          "two clients)\n",
          alone, busy, n_idle, busy / alone, MEASURED_EPOCHS,
          real.nfiles * real.per_file);
  fprintf(stderr,
          "worker VmRSS: at rest %ld / %ld KiB, peak %ld / %ld KiB with %d "
          "idle jobs (bound %ld KiB: rest + buffer + 32 MiB)\n",
          rest[0], rest[1], peak[0], peak[1], n_idle, bound);
  for (int i = 0; i < n_idle; i++)
    ferry_client_free(idlers[i]);
  free(idlers);
  cr_assert_geq(busy, 0.5 * alone,
                "real job: %.0f records/s alone, %.0f next to %d idle jobs",
                alone, busy, n_idle);
  cr_assert_leq(top, bound, "worker VmRSS %ld KiB over %ld KiB with %d idle "
                "jobs", top, bound, n_idle);
  hx_dataset_free(&real);
  hx_dataset_free(&idle);
}
