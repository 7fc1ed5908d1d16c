/* bench_trainer: a simulated trainer, the headline figure of what Ferry is
 * for. It consumes batches from a Ferry cluster at a fixed step time (a
 * sleep or a busy-wait standing in for the GPU's step: simulated work,
 * not synchronisation) and reports the input-stall fraction, the share of
 * wall time spent inside ferry_next, for several worker counts. With
 * enough workers the stall stays below 3%: the GPU is kept ~97% busy.
 *
 * It starts a local cluster (ferry-dispatcher and N ferry-worker
 * processes from this build, stopped with SIGTERM and a bounded wait) or
 * uses one given with --dispatcher, and writes its dataset with Ferry's
 * TFRecord writer: Examples with image (raw 32x32x3), label, id. Both are
 * the integration tests' harness (tests/integration/harness.h).
 *
 *   bench_trainer [--workers 1,2] [--step-ms 10] [--batches 300] ...
 *   bench_trainer --quick       a short smoke run (ctest bench/trainer-quick)
 *
 * Prints a table and "bench trainer: ok" on success.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ferry/client.h"
#include "ferry/error.h"
#include "harness.h"
#include "rpc.h"

#define IMG_H 32
#define IMG_W 32
#define IMG_C 3
#define IMG_BYTES (IMG_H * IMG_W * IMG_C)
#define MAX_WORKERS 16

/* ---- Options ------------------------------------------------------------ */

static struct {
  const char *dispatcher; /* an existing cluster, or NULL */
  int workers[MAX_WORKERS];
  int n_workers;
  int threads;     /* pipeline threads per worker */
  double step_ms;  /* simulated step time */
  bool busy;       /* busy-wait instead of sleeping */
  int batches;     /* measured batches per run */
  int warmup;      /* batches before the measurement */
  int batch;       /* batch size */
  int files, records_per_file;
  const char *pipeline; /* the stages after decode */
  const char *augment;  /* client-side augmentation (CPU twin) */
  const char *bin_dir;  /* a build tree, or NULL: this one */
  int heartbeat_ms;     /* the daemons' and the client's */
} opt = {
    .workers = {1, 2},
    .n_workers = 2,
    .threads = 1,
    .step_ms = 10,
    .batches = 300,
    .warmup = 20,
    .batch = 256,
    .files = 8,
    .records_per_file = 4096,
    .heartbeat_ms = 100,
    .pipeline = "dilate(3) | blur(11, 0.8)",
};

static void usage(void) {
  printf(
      "usage: bench_trainer [options]\n"
      "  --workers LIST      worker counts to run, e.g. 1,2 (default 1,2)\n"
      "  --threads N         pipeline threads per worker (default 1)\n"
      "  --step-ms X         simulated step time in ms (default 10)\n"
      "  --busy              busy-wait the step instead of sleeping\n"
      "  --batches N         measured batches per run (default 300)\n"
      "  --warmup N          batches before measuring (default 20)\n"
      "  --batch N           batch size (default 256)\n"
      "  --files N --records-per-file N   dataset size (8 x 4096)\n"
      "  --heartbeat-ms N    daemons' and client's heartbeat (default 100)\n"
      "  --pipeline TEXT     stages after decode (default the seed's:\n"
      "                      \"dilate(3) | blur(11, 0.8)\"; \"\" for none)\n"
      "  --augment TEXT      client-side augmentation (CPU twin)\n"
      "  --dispatcher H:P    use a running cluster (one run, its workers)\n"
      "  --bin-dir DIR       build tree with dispatcher/ and worker/\n"
      "                      (default: the one bench_trainer was built in)\n"
      "  --quick             a short smoke run: 1 worker, 40 batches\n");
}

static int parse_list(const char *s) {
  opt.n_workers = 0;
  while (*s && opt.n_workers < MAX_WORKERS) {
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || v < 1 || v > 64)
      return -1;
    opt.workers[opt.n_workers++] = (int)v;
    s = *end == ',' ? end + 1 : end;
    if (*end != ',' && *end != '\0')
      return -1;
  }
  return opt.n_workers > 0 ? 0 : -1;
}

static int parse_args(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define NEEDV()                                                              \
  do {                                                                       \
    if (v == NULL) {                                                         \
      fprintf(stderr, "bench_trainer: %s needs a value\n", a);               \
      return -1;                                                             \
    }                                                                        \
    i++;                                                                     \
  } while (0)
    if (strcmp(a, "--quick") == 0) {
      opt.workers[0] = 1;
      opt.n_workers = 1;
      opt.batches = 40;
      opt.warmup = 5;
      opt.step_ms = 5;
      opt.files = 2;
      opt.records_per_file = 2048;
    } else if (strcmp(a, "--busy") == 0) {
      opt.busy = true;
    } else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      usage();
      exit(0);
    } else if (strcmp(a, "--workers") == 0) {
      NEEDV();
      if (parse_list(v) != 0) {
        fprintf(stderr, "bench_trainer: bad --workers list '%s'\n", v);
        return -1;
      }
    } else if (strcmp(a, "--threads") == 0) {
      NEEDV();
      opt.threads = atoi(v);
    } else if (strcmp(a, "--step-ms") == 0) {
      NEEDV();
      opt.step_ms = atof(v);
    } else if (strcmp(a, "--batches") == 0) {
      NEEDV();
      opt.batches = atoi(v);
    } else if (strcmp(a, "--warmup") == 0) {
      NEEDV();
      opt.warmup = atoi(v);
    } else if (strcmp(a, "--batch") == 0) {
      NEEDV();
      opt.batch = atoi(v);
    } else if (strcmp(a, "--files") == 0) {
      NEEDV();
      opt.files = atoi(v);
    } else if (strcmp(a, "--records-per-file") == 0) {
      NEEDV();
      opt.records_per_file = atoi(v);
    } else if (strcmp(a, "--heartbeat-ms") == 0) {
      NEEDV();
      opt.heartbeat_ms = atoi(v);
    } else if (strcmp(a, "--pipeline") == 0) {
      NEEDV();
      opt.pipeline = v;
    } else if (strcmp(a, "--augment") == 0) {
      NEEDV();
      opt.augment = v;
    } else if (strcmp(a, "--dispatcher") == 0) {
      NEEDV();
      opt.dispatcher = v;
    } else if (strcmp(a, "--bin-dir") == 0) {
      NEEDV();
      opt.bin_dir = v;
    } else {
      fprintf(stderr, "bench_trainer: unknown argument '%s' (--help)\n", a);
      return -1;
    }
#undef NEEDV
  }
  if (opt.threads < 1 || opt.step_ms < 0 || opt.batches < 1 ||
      opt.warmup < 0 || opt.batch < 1 || opt.files < 1 ||
      opt.records_per_file < 1 || opt.heartbeat_ms < 10) {
    fprintf(stderr, "bench_trainer: option out of range\n");
    return -1;
  }
  return 0;
}

/* Seconds on the monotonic clock. */
static double now_s(void) { return hx_now_ms() / 1e3; }

/* ---- The trainer -------------------------------------------------------- */

typedef struct result_s {
  int workers;
  double stall, batches_per_s, ideal, seconds;
  double client_stall; /* ferry_client_stats' figure, since the start */
} result_t;

/* The simulated step: the GPU's time, spent sleeping (the host CPU stays
 * free for the workers, as it would be while a GPU computes) or busy. */
static void step(double ms) {
  if (ms <= 0)
    return;
  if (opt.busy) {
    double end = now_s() + ms * 1e-3;
    while (now_s() < end)
      ;
    return;
  }
  struct timespec ts = {(time_t)(ms / 1000),
                        (long)((ms - 1000 * (time_t)(ms / 1000)) * 1e6)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
    ;
}

static int train(const char *dispatcher, const char *spec, result_t *r) {
  ferry_client_options_t o;
  ferry_client_t *c;
  ferry_error_t err = {0};
  ferry_client_options_init(&o);
  o.dispatcher = dispatcher;
  o.spec = spec;
  o.num_epochs = -1;
  o.augment = opt.augment;
  o.heartbeat_ms = (uint32_t)opt.heartbeat_ms;
  if (ferry_client_new(&o, &c, &err) != 0) {
    fprintf(stderr, "bench_trainer: ferry_client_new: %s\n", err.msg);
    return -1;
  }
  double wait = 0, t0 = 0;
  int got = 0, rc = 0;
  volatile uint8_t sink = 0;
  while (got < opt.warmup + opt.batches) {
    const ferry_batch_t *b;
    if (got == opt.warmup) {
      t0 = now_s();
      wait = 0;
    }
    double a = now_s();
    rc = ferry_next(c, &b, 30000, &err);
    wait += now_s() - a;
    if (rc == FERRY_EPOCH_END)
      continue;
    if (rc != 0) {
      fprintf(stderr, "bench_trainer: ferry_next: %s\n", err.msg);
      break;
    }
    sink ^= b->images[(size_t)b->size * IMG_BYTES - 1];
    step(opt.step_ms);
    ferry_batch_release(c, b);
    got++;
  }
  double total = now_s() - t0;
  ferry_client_stats_t st;
  ferry_client_stats(c, &st);
  ferry_client_free(c);
  (void)sink;
  if (rc != 0 && rc != FERRY_EPOCH_END)
    return -1;
  r->stall = total > 0 ? wait / total : 0;
  r->batches_per_s = total > 0 ? opt.batches / total : 0;
  r->ideal = opt.step_ms > 0 ? 1000.0 / opt.step_ms : 0;
  r->seconds = total;
  r->client_stall = st.stall_fraction;
  return 0;
}

/* One run with n local workers (or the given cluster when n is 0). The
 * daemons get their own defaults but for the heartbeat and threads. */
static int run(const char *spec, int n, result_t *r) {
  hx_proc_t *d = NULL, *w[64] = {NULL};
  hx_daemon_opts_t o = {.heartbeat_ms = opt.heartbeat_ms,
                        .worker_timeout_ms = 10000,
                        .client_timeout_ms = 10000,
                        .threads = opt.threads,
                        .buffer_bytes = 256ull << 20};
  char why[512];
  int rc = -1, started = 0;
  r->workers = n;
  if (opt.dispatcher != NULL)
    return train(opt.dispatcher, spec, r);
  if (hx_start_dispatcher(&d, &o, why, sizeof(why)) != 0) {
    fprintf(stderr, "bench_trainer: %s\n", why);
    goto out;
  }
  for (; started < n; started++)
    if (hx_start_worker(&w[started], d->addr, &o, why, sizeof(why)) != 0) {
      fprintf(stderr, "bench_trainer: %s\n", why);
      goto out;
    }
  /* Measure with every worker registered, not while the last ones join. */
  if (hx_wait_workers(d->addr, n, 10000) < n)
    fprintf(stderr, "bench_trainer: %d worker(s) did not register\n", n);
  else
    rc = train(d->addr, spec, r);
out:
  for (int i = 0; i < n; i++) {
    hx_stop(w[i], SIGTERM, 5000, NULL);
    hx_forget(w[i]);
  }
  hx_stop(d, SIGTERM, 5000, NULL);
  hx_forget(d);
  return rc;
}

int main(int argc, char **argv) {
  if (parse_args(argc, argv) != 0)
    return 2;
  signal(SIGPIPE, SIG_IGN);
  /* The harness finds the daemons through these when they are set. */
  char bin[4096];
  if (opt.bin_dir != NULL) {
    snprintf(bin, sizeof(bin), "%s/dispatcher/ferry-dispatcher", opt.bin_dir);
    setenv("FERRY_IT_DISPATCHER", bin, 1);
    snprintf(bin, sizeof(bin), "%s/worker/ferry-worker", opt.bin_dir);
    setenv("FERRY_IT_WORKER", bin, 1);
  }
  /* One gRPC initialisation for the whole run, not one per status poll
   * and client. */
  ferry__rpc_init();
  printf("bench_trainer: dataset %d x %d records of %dx%dx%d in %s/train\n",
         opt.files, opt.records_per_file, IMG_H, IMG_W, IMG_C, hx_tmpdir());
  hx_dataset_t ds;
  if (hx_make_dataset(&ds, "train", opt.files, opt.records_per_file, IMG_H,
                      IMG_W, IMG_C) != 0) {
    fprintf(stderr, "bench_trainer: cannot write the dataset in %s\n",
            hx_tmpdir());
    return 1;
  }
  char spec[8192];
  hx_spec(&ds, opt.pipeline, opt.batch, spec, sizeof(spec));
  hx_dataset_free(&ds);
  printf("spec: %s\n", spec);
  if (opt.augment != NULL)
    printf("augment (client, CPU twin): %s\n", opt.augment);
  printf("step: %.2f ms (%s), %d batches measured after %d, %d thread%s per "
         "worker\n\n", opt.step_ms, opt.busy ? "busy-wait" : "sleep",
         opt.batches, opt.warmup, opt.threads, opt.threads == 1 ? "" : "s");

  result_t res[MAX_WORKERS];
  int nres = 0, failed = 0;
  int runs = opt.dispatcher != NULL ? 1 : opt.n_workers;
  for (int i = 0; i < runs; i++) {
    int n = opt.dispatcher != NULL ? 0 : opt.workers[i];
    if (run(spec, n, &res[nres]) != 0) {
      fprintf(stderr, "bench_trainer: the run with %d worker(s) failed "
                      "(logs in %s)\n", n, hx_tmpdir());
      failed = 1;
      break;
    }
    nres++;
  }

  printf("| workers | stall | batches/s | ideal batches/s | images/s | "
         "seconds | client stall (since start) |\n");
  printf("|---|---|---|---|---|---|---|\n");
  for (int i = 0; i < nres; i++) {
    char wname[16];
    if (res[i].workers > 0)
      snprintf(wname, sizeof(wname), "%d", res[i].workers);
    else
      snprintf(wname, sizeof(wname), "given");
    printf("| %s | %.2f%% | %.1f | %.1f | %.0f | %.2f | %.2f%% |\n", wname,
           100 * res[i].stall, res[i].batches_per_s, res[i].ideal,
           res[i].batches_per_s * opt.batch, res[i].seconds,
           100 * res[i].client_stall);
  }
  if (nres > 0) {
    const result_t *best = &res[nres - 1];
    printf("\nheadline: %.2f%% input stall with %d worker(s) (target < 3%%: "
           "%s)\n", 100 * best->stall, best->workers,
           best->stall < 0.03 ? "PASS" : "MISS");
  }
  ferry__rpc_shutdown();
  /* hx_reap_all (at exit) removes the temporary directory, but keeps the
   * logs of a failed run. */
  if (failed) {
    setenv("FERRY_IT_KEEP", "1", 1);
    return 1;
  }
  printf("bench trainer: ok\n");
  return 0;
}
