/* The service end to end: a real ferry-dispatcher and ferry-workers on
 * 127.0.0.1, clients through libferry, synthetic datasets written by the
 * test. Each test starts its own cluster with short heartbeats and is
 * bounded by Criterion's timeout; the fini fixture kills whatever is left.
 *
 * Record identities: a batch carries, per record, file index << 40 |
 * record index; the harness compares their multiset with the dataset's
 * and checks each record's pixels and label against what was written. */
#include <criterion/criterion.h>
#include <criterion/hooks.h>
#include <criterion/logging.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "harness.h"
#include "it_cluster.h"
#include "tfrecord.h"
#include "tsan.h"

#define NEXT_TIMEOUT_MS 10000
#define ERROR_BUDGET_MS 5000.0
/* An idle daemon's exit after SIGTERM (5 s under ThreadSanitizer: an
 * idle worker took 1029 ms there once). */
#define STOP_BUDGET_MS (1000.0 * FERRY_TSAN_SLOWDOWN)

static hx_proc_t *D;
static hx_proc_t *W[4];

static void reset(void) {
  D = NULL;
  memset(W, 0, sizeof(W));
}

HX_SUITE(service, 60, reset, NULL);

/* Starts a dispatcher and `n` workers and waits until all registered. */
static void cluster(int n, const hx_daemon_opts_t *dopts,
                    const hx_daemon_opts_t *wopts) {
  it_cluster(&D, W, n, dopts, wopts);
}

static void make_small(hx_dataset_t *ds) {
  cr_assert_eq(hx_make_dataset(ds, "data", 4, 300, 8, 8, 3), 0,
               "cannot write the dataset");
}

/* Reads one epoch and checks it against `expected` repeated `times`. */
static void expect_epoch(ferry_client_t *c, const hx_dataset_t *ds,
                         const uint64_t *expected, size_t n_expected,
                         int times, int epoch, bool check_pixels) {
  hx_ids_t got = {0};
  ferry_error_t err = {0};
  int rc = hx_collect_epoch(c, &got, ds, check_pixels, NEXT_TIMEOUT_MS, NULL,
                            NULL, &err);
  if (rc != FERRY_EPOCH_END)
    hx_dump_logs();
  cr_assert_eq(rc, FERRY_EPOCH_END,
               "epoch %d: ferry_next returned %d (%s) after %zu records: %s",
               epoch, rc, rc < 0 ? ferry_strerror(rc) : "", got.n, err.msg);
  uint64_t *want = malloc(n_expected * (size_t)times * sizeof(uint64_t));
  cr_assert_not_null(want);
  /* `expected` is sorted: repeating each id in place keeps it sorted. */
  size_t n = n_expected * (size_t)times;
  for (size_t i = 0; i < n; i++)
    want[i] = expected[i / (size_t)times];
  char why[256];
  bool same = hx_same_multiset(got.ids, got.n, want, n, why, sizeof(why));
  cr_expect(!got.bad_pixels, "epoch %d: record %#llx has wrong pixels or "
            "label", epoch, (unsigned long long)got.bad_pixel_id);
  free(want);
  hx_ids_free(&got);
  cr_assert(same, "epoch %d: %s", epoch, why);
}

static void expect_end(ferry_client_t *c) {
  const ferry_batch_t *b = NULL;
  ferry_error_t err = {0};
  int rc = ferry_next(c, &b, NEXT_TIMEOUT_MS, &err);
  cr_assert_eq(rc, FERRY_END, "after the last epoch ferry_next returned %d "
               "(%s), not FERRY_END", rc, err.msg);
}

/* ---- distributed_epoch: exactly once, 1 to 3 workers --------------------- */

static void distributed(int workers) {
  hx_dataset_t ds;
  make_small(&ds);
  cluster(workers, NULL, NULL);
  char spec[1024];
  hx_spec(&ds, NULL, 32, spec, sizeof(spec));
  ferry_client_options_t o;
  hx_client_options(&o, D->addr, spec);
  o.num_epochs = 2;
  ferry_client_t *c = it_new_client(&o);
  size_t n;
  uint64_t *expected = hx_expected_ids(&ds, false, &n);
  cr_assert_eq(n, 1200);
  expect_epoch(c, &ds, expected, n, 1, 0, true);
  expect_epoch(c, &ds, expected, n, 1, 1, true);
  expect_end(c);
  ferry_client_free(c);
  free(expected);
  hx_dataset_free(&ds);
}

Test(service, distributed_epoch_1_worker) { distributed(1); }
Test(service, distributed_epoch_2_workers) { distributed(2); }
Test(service, distributed_epoch_3_workers) { distributed(3); }

/* ---- parallel_epochs: once per worker ----------------------------------- */

Test(service, parallel_epochs_2_workers) {
  hx_dataset_t ds;
  make_small(&ds);
  cluster(2, NULL, NULL);
  char spec[1024];
  hx_spec(&ds, NULL, 32, spec, sizeof(spec));
  ferry_client_options_t o;
  hx_client_options(&o, D->addr, spec);
  o.mode = FERRY_MODE_PARALLEL_EPOCHS;
  o.num_epochs = 2;
  ferry_client_t *c = it_new_client(&o);
  size_t n;
  uint64_t *expected = hx_expected_ids(&ds, false, &n);
  expect_epoch(c, &ds, expected, n, 2, 0, true);
  expect_epoch(c, &ds, expected, n, 2, 1, true);
  expect_end(c);
  ferry_client_free(c);
  free(expected);
  hx_dataset_free(&ds);
}

/* ---- Two clients of one named job ---------------------------------------- */

typedef struct reader_s {
  ferry_client_t *c;
  const hx_dataset_t *ds;
  hx_ids_t got;
  int rc, rc_end;
  ferry_error_t err;
} reader_t;

static void *reader_main(void *arg) {
  reader_t *r = arg;
  r->rc = hx_collect_epoch(r->c, &r->got, r->ds, true, NEXT_TIMEOUT_MS, NULL,
                           NULL, &r->err);
  if (r->rc == FERRY_EPOCH_END) {
    const ferry_batch_t *b;
    r->rc_end = ferry_next(r->c, &b, NEXT_TIMEOUT_MS, &r->err);
    if (r->rc_end == 0)
      ferry_batch_release(r->c, b);
  }
  return NULL;
}

Test(service, two_clients_share_a_named_job) {
  hx_dataset_t ds;
  cr_assert_eq(hx_make_dataset(&ds, "data", 8, 150, 8, 8, 3), 0);
  cluster(2, NULL, NULL);
  char spec[1024];
  hx_spec(&ds, NULL, 16, spec, sizeof(spec));
  ferry_client_options_t o;
  hx_client_options(&o, D->addr, spec);
  o.job_name = "shared";
  o.num_epochs = 1;
  /* One split at a time and little prefetch, so that the first client
   * cannot take every split before the second one joins. */
  o.splits_in_flight = 1;
  o.prefetch = 1;
  reader_t r[2];
  memset(r, 0, sizeof(r));
  for (int i = 0; i < 2; i++) {
    r[i].c = it_new_client(&o);
    r[i].ds = &ds;
  }
  cr_assert_eq(ferry_client_job_id(r[0].c), ferry_client_job_id(r[1].c),
               "the two clients of job \"shared\" are in different jobs");
  pthread_t t[2];
  for (int i = 0; i < 2; i++)
    cr_assert_eq(pthread_create(&t[i], NULL, reader_main, &r[i]), 0);
  for (int i = 0; i < 2; i++)
    pthread_join(t[i], NULL);
  for (int i = 0; i < 2; i++) {
    cr_assert_eq(r[i].rc, FERRY_EPOCH_END, "client %d: ferry_next returned "
                 "%d: %s", i, r[i].rc, r[i].err.msg);
    cr_assert_eq(r[i].rc_end, FERRY_END, "client %d: after the epoch "
                 "ferry_next returned %d: %s", i, r[i].rc_end, r[i].err.msg);
    cr_assert(!r[i].got.bad_pixels, "client %d: wrong pixels", i);
    cr_expect_gt(r[i].got.n, 0, "client %d received nothing: the job was "
                 "not shared", i);
  }
  hx_ids_t all = {0};
  all.n = r[0].got.n + r[1].got.n;
  all.ids = malloc(all.n * sizeof(uint64_t));
  memcpy(all.ids, r[0].got.ids, r[0].got.n * sizeof(uint64_t));
  memcpy(all.ids + r[0].got.n, r[1].got.ids, r[1].got.n * sizeof(uint64_t));
  size_t n;
  uint64_t *expected = hx_expected_ids(&ds, false, &n);
  char why[256];
  cr_assert(hx_same_multiset(all.ids, all.n, expected, n, why, sizeof(why)),
            "two clients (%zu + %zu records): %s", r[0].got.n, r[1].got.n,
            why);
  for (int i = 0; i < 2; i++) {
    ferry_client_free(r[i].c);
    hx_ids_free(&r[i].got);
  }
  free(all.ids);
  free(expected);
  hx_dataset_free(&ds);
}

/* ---- Shuffle: same seed, same order ------------------------------------- */

static hx_ids_t shuffled_run(const hx_dataset_t *ds, uint64_t seed) {
  char spec[1024];
  hx_spec(ds, NULL, 32, spec, sizeof(spec));
  ferry_client_options_t o;
  hx_client_options(&o, D->addr, spec);
  o.shuffle = 1;
  o.shuffle_seed = seed;
  o.num_epochs = 1;
  /* One split at a time: the order is then the dispatcher's and the
   * worker's permutations alone, not the timing of several streams. */
  o.splits_in_flight = 1;
  ferry_client_t *c = it_new_client(&o);
  hx_ids_t got = {0};
  ferry_error_t err = {0};
  int rc = hx_collect_epoch(c, &got, ds, true, NEXT_TIMEOUT_MS, NULL, NULL,
                            &err);
  cr_assert_eq(rc, FERRY_EPOCH_END, "seed %llu: ferry_next returned %d: %s",
               (unsigned long long)seed, rc, err.msg);
  ferry_client_free(c);
  return got;
}

Test(service, shuffle_seed_gives_a_stable_order) {
  hx_dataset_t ds;
  make_small(&ds);
  cluster(1, NULL, NULL);
  hx_ids_t a = shuffled_run(&ds, 7);
  hx_ids_t b = shuffled_run(&ds, 7);
  hx_ids_t c = shuffled_run(&ds, 8);
  size_t n;
  uint64_t *expected = hx_expected_ids(&ds, false, &n);
  char why[256];
  cr_assert(hx_same_multiset(a.ids, a.n, expected, n, why, sizeof(why)),
            "shuffled epoch: %s", why);
  cr_assert_eq(a.n, b.n);
  cr_assert_eq(memcmp(a.ids, b.ids, a.n * sizeof(uint64_t)), 0,
               "two runs with seed 7 gave different orders");
  cr_assert_neq(memcmp(a.ids, expected, n * sizeof(uint64_t)), 0,
                "seed 7 left the records in file order");
  cr_assert(a.n != c.n || memcmp(a.ids, c.ids, a.n * sizeof(uint64_t)) != 0,
            "seeds 7 and 8 gave the same order");
  hx_ids_free(&a);
  hx_ids_free(&b);
  hx_ids_free(&c);
  free(expected);
  hx_dataset_free(&ds);
}

/* ---- Errors reach the client, naming the cause, within 5 s -------------- */

/* Creates a client and reads until an error; returns it with the time it
 * took from ferry_client_new. */
static int first_error(const ferry_client_options_t *o, ferry_error_t *err,
                       double *ms) {
  double t0 = hx_now_ms();
  ferry_client_t *c = NULL;
  int rc = ferry_client_new(o, &c, err);
  if (rc == 0) {
    hx_ids_t got = {0};
    rc = hx_collect_epoch(c, &got, NULL, false, (int)ERROR_BUDGET_MS, NULL,
                          NULL, err);
    hx_ids_free(&got);
  }
  *ms = hx_now_ms() - t0;
  ferry_client_free(c);
  return rc;
}

Test(service, missing_files_fail_naming_the_file) {
  cluster(1, NULL, NULL);
  char spec[1024];
  snprintf(spec, sizeof(spec), "tfrecord(\"%s/absent-file.tfrecord\") | "
           "decode(raw, 8, 8, 3) | batch(32)", hx_tmpdir());
  ferry_client_options_t o;
  hx_client_options(&o, D->addr, spec);
  ferry_error_t err = {0};
  double ms;
  int rc = first_error(&o, &err, &ms);
  cr_assert_lt(rc, 0, "a job over a missing file gave %d, not an error", rc);
  cr_assert_neq(rc, FERRY_ETIMEDOUT, "no error within %.0f ms", ms);
  cr_assert_lt(ms, ERROR_BUDGET_MS, "the error took %.0f ms", ms);
  cr_assert(strstr(err.msg, "absent-file.tfrecord") != NULL,
            "the error does not name the file: %s", err.msg);
}

Test(service, corrupt_record_under_fail_names_the_file) {
  hx_dataset_t ds;
  make_small(&ds);
  cr_assert_eq(hx_corrupt_record(&ds, 2, 100), 0);
  cluster(1, NULL, NULL);
  char spec[1024];
  hx_spec(&ds, NULL, 32, spec, sizeof(spec));
  ferry_client_options_t o;
  hx_client_options(&o, D->addr, spec);
  o.error_policy = FERRY_ON_ERROR_FAIL;
  ferry_error_t err = {0};
  double ms;
  int rc = first_error(&o, &err, &ms);
  cr_assert_lt(rc, 0, "a corrupt record under policy fail gave %d", rc);
  cr_assert_neq(rc, FERRY_ETIMEDOUT, "no error within %.0f ms", ms);
  cr_assert_lt(ms, ERROR_BUDGET_MS, "the error took %.0f ms", ms);
  cr_assert(strstr(err.msg, "data-002.tfrecord") != NULL,
            "the error does not name the file: %s", err.msg);
  hx_dataset_free(&ds);
}

Test(service, invalid_spec_names_the_column) {
  cluster(1, NULL, NULL);
  ferry_client_options_t o;
  hx_client_options(&o, D->addr,
                    "tfrecord(\"/tmp/x-*.tfrecord\") | decode(raw, 8, 8, 3) "
                    "| bogus(3) | batch(32)");
  ferry_error_t err = {0};
  double ms;
  int rc = first_error(&o, &err, &ms);
  cr_assert_lt(rc, 0, "an invalid spec gave %d", rc);
  cr_assert_lt(ms, ERROR_BUDGET_MS, "the error took %.0f ms", ms);
  cr_assert(strstr(err.msg, "column") != NULL,
            "the error does not name the column: %s", err.msg);
}

/* ---- Policy skip: corrupt records skipped and counted ------------------- */

Test(service, skip_policy_counts_corrupt_records_in_status) {
  hx_dataset_t ds;
  make_small(&ds);
  cr_assert_eq(hx_corrupt_record(&ds, 1, 10), 0);
  cr_assert_eq(hx_corrupt_record(&ds, 1, 200), 0);
  cr_assert_eq(hx_corrupt_record(&ds, 3, 299), 0);
  cluster(1, NULL, NULL);
  char spec[1024];
  hx_spec(&ds, NULL, 32, spec, sizeof(spec));
  ferry_client_options_t o;
  hx_client_options(&o, D->addr, spec);
  o.error_policy = FERRY_ON_ERROR_SKIP;
  o.job_name = "skippy";
  o.num_epochs = 1;
  ferry_client_t *c = it_new_client(&o);
  size_t n;
  uint64_t *expected = hx_expected_ids(&ds, true, &n);
  cr_assert_eq(n, 1197);
  expect_epoch(c, &ds, expected, n, 1, 0, true);

  /* The counts travel in worker heartbeats (every 100 ms): ask until they
   * are all in, at most 3 s. */
  char *json = NULL;
  int status = -1;
  int64_t skipped = -1;
  double deadline = hx_now_ms() + 3000;
  do {
    free(json);
    json = hx_ferryctl_status_json(D->addr, &status);
    cr_assert_not_null(json, "cannot run %s", hx_ferryctl_bin());
    skipped = -1;
    hx_json_int_after(json, "\"delivered_all\"", "skipped", &skipped);
  } while (skipped < 3 && hx_now_ms() < deadline);
  cr_assert_eq(status, 0, "ferryctl status --json exited %d:\n%s", status,
               json);
  cr_assert(hx_json_valid(json), "ferryctl status --json is not valid "
            "JSON:\n%s", json);
  cr_assert(strstr(json, "\"skippy\"") != NULL, "job not listed:\n%s", json);
  cr_assert_eq(skipped, 3, "job skipped count %lld, expected 3:\n%s",
               (long long)skipped, json);
  int64_t f1 = -1, f3 = -1;
  cr_assert(hx_json_int_after(json, "data-001.tfrecord\"", "skipped", &f1),
            "no per-file count for data-001:\n%s", json);
  cr_assert(hx_json_int_after(json, "data-003.tfrecord\"", "skipped", &f3),
            "no per-file count for data-003:\n%s", json);
  cr_assert_eq(f1, 2, "data-001: %lld skipped, expected 2", (long long)f1);
  cr_assert_eq(f3, 1, "data-003: %lld skipped, expected 1", (long long)f3);
  cr_assert(strstr(json, "data-000.tfrecord\"") == NULL,
            "a clean file is listed with skipped records:\n%s", json);
  expect_end(c);
  free(json);
  ferry_client_free(c);
  free(expected);
  hx_dataset_free(&ds);
}

/* ---- SIGTERM on idle daemons -------------------------------------------- */

static void expect_clean_exit(hx_proc_t *p, const char *what) {
  double ms = -1;
  int st = hx_stop(p, SIGTERM, (int)(3 * STOP_BUDGET_MS), &ms);
  if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
    hx_dump_logs();
  cr_assert_neq(st, -1, "%s ignored SIGTERM for %.0f ms", what,
                3 * STOP_BUDGET_MS);
  cr_assert(WIFEXITED(st), "%s died of signal %d", what,
            WIFSIGNALED(st) ? WTERMSIG(st) : -1);
  cr_assert_eq(WEXITSTATUS(st), 0, "%s exited %d", what, WEXITSTATUS(st));
  cr_assert_lt(ms, STOP_BUDGET_MS, "%s took %.0f ms to exit", what, ms);
}

Test(service, sigterm_idle_dispatcher_exits_0_within_1s) {
  cluster(0, NULL, NULL);
  expect_clean_exit(D, "the idle dispatcher");
}

Test(service, sigterm_idle_worker_exits_0_within_1s) {
  cluster(1, NULL, NULL);
  expect_clean_exit(W[0], "the idle worker");
  expect_clean_exit(D, "the dispatcher");
}

/* ---- A worker killed mid-epoch ------------------------------------------ */

typedef struct killer_s {
  uint32_t at;
  hx_proc_t *victim;
  bool done;
  double kill_ms;
} killer_t;

static void kill_after(uint32_t batches, void *arg) {
  killer_t *k = arg;
  if (!k->done && batches >= k->at) {
    k->done = true;
    k->kill_ms = hx_now_ms();
    hx_stop(k->victim, SIGKILL, 2000, NULL);
  }
}

Test(service, worker_killed_mid_epoch_still_exactly_once) {
  hx_dataset_t ds;
  /* 8 splits of 1000 records of 3 KiB: enough that each worker still has
   * work when one dies after a few batches. */
  cr_assert_eq(hx_make_dataset(&ds, "data", 8, 1000, 32, 32, 3), 0);
  hx_daemon_opts_t d = {.worker_timeout_ms = 1000};
  cluster(2, &d, NULL);
  char spec[1024];
  hx_spec(&ds, NULL, 64, spec, sizeof(spec));
  ferry_client_options_t o;
  hx_client_options(&o, D->addr, spec);
  o.num_epochs = 1;
  o.prefetch = 2;
  ferry_client_t *c = it_new_client(&o);
  killer_t k = {.at = 3, .victim = W[0]};
  hx_ids_t got = {0};
  ferry_error_t err = {0};
  int rc = hx_collect_epoch(c, &got, &ds, true, NEXT_TIMEOUT_MS, kill_after,
                            &k, &err);
  cr_assert(k.done, "the epoch ended before the kill (%u batches)",
            got.batches);
  if (rc != FERRY_EPOCH_END)
    hx_dump_logs();
  cr_assert_eq(rc, FERRY_EPOCH_END, "after the kill ferry_next returned %d: "
               "%s (%zu records)", rc, err.msg, got.n);
  size_t n;
  uint64_t *expected = hx_expected_ids(&ds, false, &n);
  char why[256];
  cr_assert(hx_same_multiset(got.ids, got.n, expected, n, why, sizeof(why)),
            "with a worker killed: %s", why);
  cr_assert(!got.bad_pixels, "record %#llx has wrong pixels",
            (unsigned long long)got.bad_pixel_id);
  cr_log_info("epoch finished %.0f ms after the kill",
              hx_now_ms() - k.kill_ms);
  expect_end(c);
  ferry_client_free(c);
  hx_ids_free(&got);
  free(expected);
  hx_dataset_free(&ds);
}

/* ---- Leases do not wait for heartbeats ---------------------------------- */

/* Heartbeats every 10 s on every side and one split at a time: workers
 * learn of leases from a held-back heartbeat the dispatcher answers at
 * once, and the client asks for the next split as soon as it received the
 * last one, so 12 splits take well under one interval. */
Test(service, leases_do_not_wait_for_heartbeats) {
  hx_dataset_t ds;
  cr_assert_eq(hx_make_dataset(&ds, "data", 12, 100, 8, 8, 3), 0);
  hx_daemon_opts_t d = {.heartbeat_ms = 10000,
                        .worker_timeout_ms = 60000,
                        .client_timeout_ms = 60000};
  hx_daemon_opts_t w = {.heartbeat_ms = 10000};
  cluster(2, &d, &w);
  char spec[1024];
  hx_spec(&ds, NULL, 32, spec, sizeof(spec));
  ferry_client_options_t o;
  hx_client_options(&o, D->addr, spec);
  o.heartbeat_ms = 10000;
  o.num_epochs = 1;
  o.splits_in_flight = 1;
  double t0 = hx_now_ms();
  ferry_client_t *c = it_new_client(&o);
  size_t n;
  uint64_t *expected = hx_expected_ids(&ds, false, &n);
  expect_epoch(c, &ds, expected, n, 1, 0, true);
  double ms = hx_now_ms() - t0;
  cr_assert_lt(ms, 5000.0, "12 splits took %.0f ms", ms);
  expect_end(c);
  ferry_client_free(c);
  free(expected);
  hx_dataset_free(&ds);
}

/* ---- The dispatcher killed mid-epoch ------------------------------------ */

/* Workers and clients retry a lost dispatcher every 100 ms to 1 s
 * (rpc_common.c): an epoch over 8 splits finishes well within this. */
#define RESTART_BUDGET_MS 5000.0

typedef struct restarter_s {
  uint32_t at;
  bool done;
  int port;
  char work_dir[600];
  double kill_ms, up_ms;
  int rc;
  char why[512];
} restarter_t;

/* SIGKILLs the dispatcher and starts a new one on its port and journal,
 * from inside the client's loop: the client, its heartbeat thread and
 * the workers see the outage with records in flight. */
static void restart_dispatcher_after(uint32_t batches, void *arg) {
  restarter_t *r = arg;
  if (r->done || batches < r->at)
    return;
  r->done = true;
  r->kill_ms = hx_now_ms();
  hx_stop(D, SIGKILL, 2000, NULL);
  r->rc = hx_start_dispatcher_at(&D, NULL, r->port, r->work_dir, r->why,
                                 sizeof(r->why));
  r->up_ms = hx_now_ms();
}

/* The journal restores jobs, split tables and leases; the workers' and
 * the client's heartbeats find the new process on the same address by
 * themselves, and the epoch still delivers every record once. */
Test(service, dispatcher_killed_mid_epoch_still_exactly_once) {
  hx_dataset_t ds;
  cr_assert_eq(hx_make_dataset(&ds, "data", 8, 1000, 32, 32, 3), 0);
  restarter_t r = {.at = 3};
  snprintf(r.work_dir, sizeof(r.work_dir), "%s/dispatcher-journal",
           hx_tmpdir());
  char why[512];
  cr_assert_eq(hx_start_dispatcher_at(&D, NULL, 0, r.work_dir, why,
                                      sizeof(why)), 0, "%s", why);
  const char *colon = strrchr(D->addr, ':');
  cr_assert_not_null(colon, "no port in %s", D->addr);
  r.port = atoi(colon + 1);
  cr_assert_gt(r.port, 0, "no port in %s", D->addr);
  char addr[64];
  snprintf(addr, sizeof(addr), "%s", D->addr);
  for (int i = 0; i < 2; i++)
    cr_assert_eq(hx_start_worker(&W[i], addr, NULL, why, sizeof(why)), 0,
                 "%s", why);
  cr_assert_eq(hx_wait_workers(addr, 2, 10000), 2,
               "the workers did not register within 10 s");
  char spec[1024];
  hx_spec(&ds, NULL, 64, spec, sizeof(spec));
  ferry_client_options_t o;
  hx_client_options(&o, addr, spec);
  o.num_epochs = 2;
  o.prefetch = 2;
  /* Two splits of eight at a time: most leases of epoch 0 come from the
   * restarted dispatcher. */
  o.splits_in_flight = 2;
  ferry_client_t *c = it_new_client(&o);
  size_t n;
  uint64_t *expected = hx_expected_ids(&ds, false, &n);
  for (int epoch = 0; epoch < 2; epoch++) {
    hx_ids_t got = {0};
    ferry_error_t err = {0};
    int rc = hx_collect_epoch(c, &got, &ds, true, NEXT_TIMEOUT_MS,
                              restart_dispatcher_after, &r, &err);
    cr_assert(r.done, "the epoch ended before the kill (%u batches)",
              got.batches);
    cr_assert_eq(r.rc, 0, "cannot restart the dispatcher on port %d: %s",
                 r.port, r.why);
    if (rc != FERRY_EPOCH_END)
      hx_dump_logs();
    cr_assert_eq(rc, FERRY_EPOCH_END, "epoch %d: after the restart "
                 "ferry_next returned %d: %s (%zu records)", epoch, rc,
                 err.msg, got.n);
    cr_assert(hx_same_multiset(got.ids, got.n, expected, n, why,
                               sizeof(why)),
              "epoch %d with the dispatcher restarted: %s", epoch, why);
    cr_assert(!got.bad_pixels, "record %#llx has wrong pixels",
              (unsigned long long)got.bad_pixel_id);
    if (epoch == 0) {
      double ms = hx_now_ms() - r.kill_ms;
      cr_log_info("restart took %.0f ms; epoch 0 finished %.0f ms after "
                  "the kill", r.up_ms - r.kill_ms, ms);
      cr_assert_lt(ms, RESTART_BUDGET_MS, "epoch 0 finished %.0f ms after "
                   "the kill", ms);
    }
    hx_ids_free(&got);
  }
  expect_end(c);
  ferry_client_free(c);
  free(expected);
  hx_dataset_free(&ds);
}

/* ---- Policy skip: a truncated last record -------------------------------- */

/* A file whose last record is cut short (a copy that died, a disk that
 * filled) under policy skip: the good records are delivered once each,
 * the partial last batch comes, the epoch and the job end, and the cut
 * record counts as one skip. Every case is drawn from a printed seed
 * (FERRY_IT_SEED replays one): the cut point inside the record (length
 * header, data or data CRC) and some batch sizes. Before the fix a batch
 * size the good records are not a multiple of never saw its epoch end. */

#define TRUNC_RECORDS 32 /* per file, the last one cut: 31 good */

static uint64_t trunc_rng(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Cuts the last record of file `f` after `cut` of its bytes and notes it
 * as lost (hx_expected_ids leaves it out). */
static void truncate_last(hx_dataset_t *ds, int f, uint64_t cut) {
  int last = ds->per_file - 1;
  uint64_t at = ds->offsets[f][last];
  cr_assert_eq(truncate(ds->files[f], (off_t)(at + cut)), 0, "truncate %s",
               ds->files[f]);
  ds->corrupt[ds->ncorrupt++] = ((uint64_t)f << 40) | (uint64_t)last;
}

/* Rewrites file `f` (already cut) as one GZIP stream of its bytes: a
 * well-formed compressed file whose records end inside the last one. */
static void gzip_file(hx_dataset_t *ds, int f) {
  FILE *in = fopen(ds->files[f], "rb");
  cr_assert_not_null(in);
  static uint8_t buf[1 << 16];
  size_t n = fread(buf, 1, sizeof(buf), in);
  cr_assert(feof(in), "%s is over %zu bytes", ds->files[f], sizeof(buf));
  fclose(in);
  gzFile z = gzopen(ds->files[f], "wb");
  cr_assert_not_null(z);
  cr_assert_eq(gzwrite(z, buf, (unsigned)n), (int)n);
  cr_assert_eq(gzclose(z), Z_OK);
}

/* Flips a bit of the length CRC of record `rec` of file `f`: the scan
 * stops there (the rest of the file is one split of unknown count) and
 * the worker resynchronises past it. */
static void break_header(hx_dataset_t *ds, int f, int rec) {
  int fd = open(ds->files[f], O_RDWR);
  cr_assert_geq(fd, 0);
  uint8_t b;
  off_t at = (off_t)ds->offsets[f][rec] + 9;
  cr_assert_eq(pread(fd, &b, 1, at), 1);
  b ^= 0x04;
  cr_assert_eq(pwrite(fd, &b, 1, at), 1);
  close(fd);
  ds->corrupt[ds->ncorrupt++] = ((uint64_t)f << 40) | (uint64_t)rec;
}

typedef struct trunc_case_s {
  const char *name;
  uint32_t batch;
  bool gzip;
  bool mid_header; /* also a bad length header in the middle */
  bool parallel; /* parallel_epochs: every worker produces everything */
  int epochs;
} trunc_case_t;

/* One case on the running cluster (`workers` workers): a fresh one-file
 * dataset with its last record cut at a drawn point, one job. */
static void truncated_case(const trunc_case_t *tc, int idx, int workers,
                           uint64_t *rng) {
  hx_dataset_t ds;
  char sub[64], job[64], spec[1024];
  snprintf(sub, sizeof(sub), "trunc-%d", idx);
  snprintf(job, sizeof(job), "trunc-%d-%s", idx, tc->name);
  cr_assert_eq(hx_make_dataset(&ds, sub, 1, TRUNC_RECORDS, 4, 4, 3), 0);
  struct stat st;
  cr_assert_eq(stat(ds.files[0], &st), 0);
  uint64_t rec_len = (uint64_t)st.st_size - ds.offsets[0][TRUNC_RECORDS - 1];
  /* 1 .. rec_len - 1: inside the length header (1..11), the data, or
   * the data CRC (the last 4 bytes). */
  uint64_t cut = 1 + trunc_rng(rng) % (rec_len - 1);
  const char *where = cut < 12 ? "length header"
                      : cut < rec_len - 4 ? "data" : "data CRC";
  truncate_last(&ds, 0, cut);
  /* Not the record before the cut one: with the cut inside its length
   * header, the resync after the bad header finds no header to the end of
   * the file, and the worker skips one region of two records, not two. */
  int bad = tc->mid_header ? 1 + (int)(trunc_rng(rng) % (TRUNC_RECORDS - 3))
                           : -1;
  if (bad >= 0)
    break_header(&ds, 0, bad);
  if (tc->gzip)
    gzip_file(&ds, 0);
  fprintf(stderr, "  case %d (%s): batch %u, record of %llu bytes cut after %llu "
              "(%s)%s%s, bad header at record %d\n", idx, tc->name, tc->batch,
              (unsigned long long)rec_len, (unsigned long long)cut, where,
              tc->gzip ? ", gzip" : "", tc->parallel ? ", parallel" : "",
              bad);
  if (tc->gzip)
    snprintf(spec, sizeof(spec),
             "tfrecord(\"%s\", compression=gzip) | decode(raw, %d, %d, %d) "
             "| batch(%u)", ds.glob, ds.h, ds.w, ds.c, tc->batch);
  else
    hx_spec(&ds, NULL, (int)tc->batch, spec, sizeof(spec));
  ferry_client_options_t o;
  hx_client_options(&o, D->addr, spec);
  o.error_policy = FERRY_ON_ERROR_SKIP;
  o.job_name = job;
  o.num_epochs = tc->epochs;
  if (tc->parallel)
    o.mode = FERRY_MODE_PARALLEL_EPOCHS;
  ferry_client_t *c = it_new_client(&o);
  size_t n;
  uint64_t *expected = hx_expected_ids(&ds, true, &n);
  cr_assert_eq(n, (size_t)(TRUNC_RECORDS - ds.ncorrupt));
  int copies = tc->parallel ? workers : 1;
  for (int e = 0; e < tc->epochs; e++) {
    double t0 = hx_now_ms();
    hx_ids_t got = {0};
    ferry_error_t err = {0};
    int rc = hx_collect_epoch(c, &got, &ds, true, NEXT_TIMEOUT_MS, NULL,
                              NULL, &err);
    if (rc != FERRY_EPOCH_END)
      hx_dump_logs();
    cr_assert_eq(rc, FERRY_EPOCH_END,
                 "case %d (%s, batch %u, cut %llu) epoch %d: ferry_next "
                 "returned %d (%s) after %zu records in %.0f ms: %s",
                 idx, tc->name, tc->batch, (unsigned long long)cut, e, rc,
                 rc < 0 ? ferry_strerror(rc) : "", got.n, hx_now_ms() - t0,
                 err.msg);
    uint64_t *want = malloc(n * (size_t)copies * sizeof(uint64_t));
    cr_assert_not_null(want);
    for (size_t i = 0; i < n * (size_t)copies; i++)
      want[i] = expected[i / (size_t)copies];
    char why[256];
    bool same = hx_same_multiset(got.ids, got.n, want, n * (size_t)copies,
                                 why, sizeof(why));
    free(want);
    cr_assert(same, "case %d (%s, batch %u, cut %llu) epoch %d: %s", idx,
              tc->name, tc->batch, (unsigned long long)cut, e, why);
    cr_assert(!got.bad_pixels, "case %d: record %#llx has wrong pixels", idx,
              (unsigned long long)got.bad_pixel_id);
    hx_ids_free(&got);
  }
  expect_end(c);
  ferry_client_free(c);

  /* The skips: per epoch and producing worker, from worker
   * heartbeats; ask until it is in, at most 3 s. */
  int64_t want_skipped = (int64_t)tc->epochs * copies * ds.ncorrupt;
  int64_t skipped = -1;
  int status = -1;
  char *json = NULL, anchor[80];
  snprintf(anchor, sizeof(anchor), "\"%s\"", job);
  double deadline = hx_now_ms() + 3000;
  do {
    free(json);
    json = hx_ferryctl_status_json(D->addr, &status);
    cr_assert_not_null(json, "cannot run %s", hx_ferryctl_bin());
    skipped = -1;
    hx_json_int_after(json, anchor, "skipped", &skipped);
  } while (skipped < want_skipped && hx_now_ms() < deadline);
  cr_assert_eq(skipped, want_skipped, "case %d (%s): job skipped %lld, "
               "expected %lld:\n%s", idx, tc->name, (long long)skipped,
               (long long)want_skipped, json);
  free(json);
  free(expected);
  hx_dataset_free(&ds);
}

static uint64_t trunc_seed(void) {
  const char *e = getenv("FERRY_IT_SEED");
  uint64_t seed = e != NULL && *e ? strtoull(e, NULL, 0)
                                  : (uint64_t)time(NULL) ^ (uint64_t)getpid();
  fprintf(stderr, "skip_policy_truncated_last_record: seed %llu "
                  "(FERRY_IT_SEED=%llu replays it)\n",
          (unsigned long long)seed, (unsigned long long)seed);
  return seed;
}

Test(service, skip_policy_truncated_last_record_ends_the_epoch, .timeout = 240) {
  uint64_t seed = trunc_seed(), rng = seed;
  /* Splits of 10 records: the file is 4 splits of known count and the
   * cut record's split of unknown count. */
  const char *extra[] = {"--records-per-split", "10", NULL};
  hx_daemon_opts_t d = {.extra_argv = extra};
  cluster(2, &d, NULL);
  trunc_case_t cases[] = {
      {"distributed", 1, false, false, false, 1},
      {"distributed", 7, false, false, false, 1},
      {"distributed", 8, false, false, false, 2},
      {"distributed", 31, false, false, false, 1},
      {"distributed", 32, false, false, false, 1},
      {"distributed", 100, false, false, false, 1},
      {"distributed", 0, false, false, false, 1},
      {"distributed", 0, false, false, false, 1},
      {"mid-header", 8, false, true, false, 1},
      {"mid-header", 0, false, true, false, 1},
      {"gzip", 8, true, false, false, 1},
      {"gzip", 0, true, false, false, 1},
      {"parallel", 8, false, false, true, 2},
      {"parallel", 0, false, false, true, 1},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    if (cases[i].batch == 0)
      cases[i].batch = 2 + (uint32_t)(trunc_rng(&rng) % 63);
    truncated_case(&cases[i], (int)i, 2, &rng);
  }
  fprintf(stderr, "skip_policy_truncated_last_record: seed %llu passed\n",
          (unsigned long long)seed);
}

/* The order that hung for sure: the cut tail's row is done at the
 * dispatcher (the worker's total of 0) and the client's answer no longer
 * lists it while the tail's empty last chunk still waits in the stream,
 * behind records the client has no slot for (one slot, held by the
 * trainer). The client drops that chunk as not listed; before the fix
 * its split stayed "not received" and the last 7 records never came. */
Test(service, skip_policy_truncated_tail_done_before_its_last_chunk) {
  const char *extra[] = {"--records-per-split", "10", NULL};
  hx_daemon_opts_t d = {.extra_argv = extra};
  cluster(1, &d, NULL);
  hx_dataset_t ds;
  cr_assert_eq(hx_make_dataset(&ds, "tail", 1, TRUNC_RECORDS, 4, 4, 3), 0);
  truncate_last(&ds, 0, 20);
  char spec[1024];
  hx_spec(&ds, NULL, 8, spec, sizeof(spec));
  ferry_client_options_t o;
  hx_client_options(&o, D->addr, spec);
  o.error_policy = FERRY_ON_ERROR_SKIP;
  o.job_name = "tail";
  o.num_epochs = 1;
  o.prefetch = 1;
  ferry_client_t *c = it_new_client(&o);
  /* The client asks for splits once its trainer reads: the first batch
   * comes before the tail is done, and the trainer holds it (prefetch 1:
   * the client reads no further). */
  const ferry_batch_t *b = NULL;
  ferry_error_t err = {0};
  cr_assert_eq(ferry_next(c, &b, NEXT_TIMEOUT_MS, &err), 0, "%s", err.msg);
  /* The tail is done at the dispatcher once its skip is counted (the
   * same worker heartbeat reports both). */
  int64_t skipped = -1;
  int status = -1;
  char *json = NULL;
  double deadline = hx_now_ms() + 10000;
  do {
    free(json);
    json = hx_ferryctl_status_json(D->addr, &status);
    cr_assert_not_null(json, "cannot run %s", hx_ferryctl_bin());
    skipped = -1;
    hx_json_int_after(json, "\"tail\"", "skipped", &skipped);
  } while (skipped < 1 && hx_now_ms() < deadline);
  cr_assert_eq(skipped, 1, "the skip was not counted within 10 s:\n%s",
               json);
  free(json);
  /* Hold the one batch until an answer acknowledges it: that answer,
   * computed after the tail was done, no longer lists the tail. */
  cr_assert_eq(b->size, 8);
  hx_ids_t got = {0};
  for (uint32_t i = 0; i < b->size; i++) {
    cr_assert_lt(got.n, (size_t)TRUNC_RECORDS);
    if (got.ids == NULL)
      got.ids = calloc(TRUNC_RECORDS, sizeof(uint64_t));
    got.ids[got.n++] = b->ids[i];
  }
  ferry_client_stats_t st;
  deadline = hx_now_ms() + 10000;
  do {
    ferry_client_stats(c, &st);
  } while (st.records_acked < 8 && hx_now_ms() < deadline &&
           usleep(2000) == 0);
  cr_assert_geq(st.records_acked, 8, "no answer acknowledged the batch "
                "within 10 s");
  ferry_batch_release(c, b);
  hx_ids_t rest = {0};
  int rc = hx_collect_epoch(c, &rest, &ds, true, NEXT_TIMEOUT_MS, NULL, NULL,
                            &err);
  if (rc != FERRY_EPOCH_END)
    hx_dump_logs();
  cr_assert_eq(rc, FERRY_EPOCH_END, "ferry_next returned %d (%s) after %zu "
               "more records: %s", rc, rc < 0 ? ferry_strerror(rc) : "",
               rest.n, err.msg);
  for (size_t i = 0; i < rest.n; i++) {
    cr_assert_lt(got.n, (size_t)TRUNC_RECORDS, "too many records");
    got.ids[got.n++] = rest.ids[i];
  }
  size_t n;
  uint64_t *want = hx_expected_ids(&ds, true, &n);
  char why[256];
  cr_assert(hx_same_multiset(got.ids, got.n, want, n, why, sizeof(why)),
            "%s", why);
  expect_end(c);
  ferry_client_free(c);
  free(want);
  hx_ids_free(&got);
  hx_ids_free(&rest);
  hx_dataset_free(&ds);
}
