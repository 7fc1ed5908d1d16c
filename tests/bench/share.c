/* bench_share: shared production against independent jobs, in one run on
 * the same cores.
 *
 * Writes a dataset with `ferryctl gen`, starts a dispatcher and one
 * worker (--threads T) as subprocesses, and runs N trainers at once (N
 * client threads of this process, each its own job over the same spec
 * and seed), first sharing (options.share), then not, each on a fresh
 * cluster. Per run: the worker's CPU seconds (/proc/PID/stat), its
 * pipeline threads' alone, records it produced
 * (ferry_worker_records_produced_total), the trainers' records and wall
 * time. Printed ratio: worker CPU seconds per delivered epoch (one
 * trainer's epoch), shared / independent (target <= 0.2; 1/N is the
 * ideal).
 *
 * Usage: bench_share [--quick] [--trainers N] [--records R]
 *                    [--size HxW] [--epochs E] [--threads T]
 *                    [--window SIZE] (the worker's --share-bytes, 64M)
 *                    [--only shared|independent] (profiling: one run)
 */
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ferry/client.h"
#include "harness.h"

#define MAX_TRAINERS 32

static int opt_trainers = 8, opt_records = 131072, opt_epochs = 1,
           opt_threads = 1;
static const char *opt_size = "32x32";
static const char *opt_window = "64M"; /* --share-bytes */
static int opt_only = -1; /* --only shared|independent: that run alone */

typedef struct {
  const char *dispatcher, *spec;
  int share;
  uint64_t records;
  int rc;
  char err[600];
} trainer_t;

static void *trainer_main(void *arg) {
  trainer_t *t = arg;
  ferry_client_options_t o;
  hx_client_options(&o, t->dispatcher, t->spec);
  o.num_epochs = opt_epochs;
  o.shuffle = 1;
  o.shuffle_seed = 3;
  o.share = t->share;
  o.heartbeat_ms = 50;
  ferry_client_t *c = NULL;
  ferry_error_t err = {0};
  if ((t->rc = ferry_client_new(&o, &c, &err)) != 0) {
    snprintf(t->err, sizeof(t->err), "ferry_client_new: %s", err.msg);
    return NULL;
  }
  for (;;) {
    const ferry_batch_t *b;
    int rc = ferry_next(c, &b, 60000, &err);
    if (rc == FERRY_EPOCH_END)
      continue;
    if (rc == FERRY_END)
      break;
    if (rc != 0) {
      t->rc = rc;
      snprintf(t->err, sizeof(t->err), "ferry_next: %s", err.msg);
      break;
    }
    t->records += b->size;
    ferry_batch_release(c, b);
  }
  ferry_client_free(c);
  return NULL;
}

typedef struct {
  double cpu, pipe_cpu, seconds;
  long long produced, served, own;
  uint64_t delivered;
} result_t;

static int run(const char *spec, int share, result_t *res) {
  hx_proc_t *d, *w;
  char why[512];
  const char *argv[] = {"--metrics-port", "0", "--share-bytes", opt_window,
                        NULL};
  hx_daemon_opts_t wo = {.threads = opt_threads,
                         .buffer_bytes = 512u << 20,
                         .extra_argv = argv};
  if (hx_start_dispatcher(&d, NULL, why, sizeof(why)) != 0 ||
      hx_start_worker(&w, d->addr, &wo, why, sizeof(why)) != 0 ||
      hx_wait_workers(d->addr, 1, 10000) != 1) {
    fprintf(stderr, "bench_share: %s\n", why);
    return -1;
  }
  char url[128];
  if (hx_metrics_address(w, 5000, url, sizeof(url)) != 0) {
    fprintf(stderr, "bench_share: the worker printed no metrics line\n");
    return -1;
  }
  static trainer_t tr[MAX_TRAINERS];
  pthread_t th[MAX_TRAINERS];
  memset(tr, 0, sizeof(tr));
  double c0 = hx_proc_cpu_s(w->pid), p0 = hx_threads_cpu_s(w->pid, "ferry-pipeline");
  double t0 = hx_now_ms();
  for (int i = 0; i < opt_trainers; i++) {
    tr[i].dispatcher = d->addr;
    tr[i].spec = spec;
    tr[i].share = share;
    pthread_create(&th[i], NULL, trainer_main, &tr[i]);
  }
  int rc = 0;
  res->delivered = 0;
  for (int i = 0; i < opt_trainers; i++) {
    pthread_join(th[i], NULL);
    if (tr[i].rc != 0) {
      fprintf(stderr, "bench_share: trainer %d: %s\n", i, tr[i].err);
      rc = -1;
    }
    res->delivered += tr[i].records;
  }
  res->seconds = (hx_now_ms() - t0) / 1e3;
  res->cpu = hx_proc_cpu_s(w->pid) - c0;
  res->pipe_cpu = hx_threads_cpu_s(w->pid, "ferry-pipeline") - p0;
  res->produced = hx_metric(url, "ferry_worker_records_produced_total");
  res->served =
      hx_metric(url, "ferry_worker_share_records_total{what=\"served\"}");
  res->own = hx_metric(url, "ferry_worker_share_records_total{what=\"own\"}");
  hx_stop(w, SIGTERM, 10000, NULL);
  hx_stop(d, SIGTERM, 10000, NULL);
  return rc;
}

int main(int argc, char **argv) {
  static const struct option longopts[] = {
      {"quick", no_argument, NULL, 'q'},
      {"trainers", required_argument, NULL, 'n'},
      {"records", required_argument, NULL, 'r'},
      {"size", required_argument, NULL, 's'},
      {"epochs", required_argument, NULL, 'e'},
      {"threads", required_argument, NULL, 't'},
      {"only", required_argument, NULL, 'o'},
      {"window", required_argument, NULL, 'w'},
      {NULL, 0, NULL, 0}};
  int ch;
  while ((ch = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
    switch (ch) {
    case 'q':
      opt_trainers = 4;
      opt_records = 4096;
      break;
    case 'n':
      opt_trainers = atoi(optarg);
      break;
    case 'r':
      opt_records = atoi(optarg);
      break;
    case 's':
      opt_size = optarg;
      break;
    case 'e':
      opt_epochs = atoi(optarg);
      break;
    case 't':
      opt_threads = atoi(optarg);
      break;
    case 'w':
      opt_window = optarg;
      break;
    case 'o':
      opt_only = strcmp(optarg, "shared") == 0 ? 1 : 0;
      break;
    default:
      fprintf(stderr, "usage: bench_share [--quick] [--trainers N] "
              "[--records R] [--size HxW] [--epochs E] [--threads T]\n");
      return 2;
    }
  }
  int h, w;
  if (opt_trainers < 1 || opt_trainers > MAX_TRAINERS || opt_records < 1 ||
      opt_epochs < 1 || opt_threads < 1 ||
      sscanf(opt_size, "%dx%d", &h, &w) != 2) {
    fprintf(stderr, "bench_share: --trainers 1..%d, --records, --epochs, "
            "--threads >= 1, --size HxW\n", MAX_TRAINERS);
    return 2;
  }
  char dir[600], cmd[1400], spec[1400];
  snprintf(dir, sizeof(dir), "%s/data", hx_tmpdir());
  snprintf(cmd, sizeof(cmd),
           "%s gen --out %s --records %d --size %s --shards 8 >/dev/null",
           hx_ferryctl_bin(), dir, opt_records, opt_size);
  if (system(cmd) != 0) {
    fprintf(stderr, "bench_share: %s failed\n", cmd);
    return 1;
  }
  snprintf(spec, sizeof(spec),
           "tfrecord(\"%s/*.tfrecord\") | decode(raw, %d, %d, 3) | "
           "dilate(3) | blur(11, 0.8) | batch(256)",
           dir, h, w);
  printf("bench_share: %d trainers, each its own job, %d epoch(s) of %d "
         "records of %s; one worker --threads %d --share-bytes %s\n  %s\n",
         opt_trainers, opt_epochs, opt_records, opt_size, opt_threads,
         opt_window, spec);
  result_t r[2];
  memset(r, 0, sizeof(r));
  for (int share = 1; share >= 0; share--) {
    if (opt_only >= 0 && share != opt_only)
      continue;
    if (run(spec, share, &r[share]) != 0) {
      hx_reap_all();
      printf("bench share: FAILED\n");
      return 1;
    }
    double epochs = (double)opt_trainers * opt_epochs;
    printf("  %-11s: %llu records delivered in %.2f s; worker CPU %.2f s "
           "(pipeline threads %.2f s), %.3f s per delivered epoch; "
           "%lld records produced, %lld sent from the window, %lld tasks produced "
           "the rest of their split themselves\n",
           share ? "shared" : "independent",
           (unsigned long long)r[share].delivered, r[share].seconds,
           r[share].cpu, r[share].pipe_cpu, r[share].cpu / epochs,
           r[share].produced, r[share].served, r[share].own);
  }
  if (opt_only >= 0) {
    hx_reap_all();
    printf("bench share: ok (one run)\n");
    return 0;
  }
  printf("  ratio: worker CPU seconds per delivered epoch, shared / "
         "independent %.3f (pipeline threads alone %.3f; ideal %.3f)\n",
         r[1].cpu / r[0].cpu,
         r[0].pipe_cpu > 0 ? r[1].pipe_cpu / r[0].pipe_cpu : 0.0,
         1.0 / opt_trainers);
  hx_reap_all();
  printf("bench share: ok\n");
  return 0;
}
