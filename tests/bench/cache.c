/* bench_cache: the worker's prefix cache (--cache-dir) against
 * recomputing, in one run on the same cores.
 *
 * For each case, a dataset written by `ferryctl gen`, a dispatcher and
 * one worker (--threads T) started as subprocesses, and one job of
 * --epochs epochs (shuffled): per epoch the records, the wall time, the
 * worker's CPU seconds (its process, /proc/PID/stat: utime + stime),
 * those of its pipeline threads alone (the threads named
 * "ferry-pipeline": producing records, not sending them) and records per
 * worker CPU second. The same job runs again on a worker without a cache
 * (the baseline, in the same run). Printed ratios: records per worker
 * CPU second of epoch 2 over epoch 1 with the cache (target >= 5 for the
 * seed pipeline) and of the cached epoch 2 over the uncached one; and
 * each worker's policy line from `ferryctl status`: the choice and the
 * measured costs behind it.
 *
 * Cases (--cases, comma-separated; default all but --quick's):
 *   seed32   decode(raw, 32, 32, 3) | dilate(3) | blur(11, 0.8), CIFAR
 *            sizes (DESIGN.md section 1)
 *   seed224  the same ops on 224x224x3 raw images
 *   rrc      ImageNet-like photo JPEGs (`ferryctl gen --size imagenet
 *            --content photo`): decode(jpeg) | random_resized_crop(224),
 *            the fused decode (no deterministic prefix: it declines)
 *   rrcexact the same with exact=true: the decode alone is the prefix,
 *            and the policy weighs reading decoded images against
 *            decoding them
 *
 * Usage: bench_cache [--quick] [--cases LIST] [--records N] [--epochs E]
 *                    [--threads T] [--transport grpc|ucx]
 */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ferry/client.h"
#include "harness.h"

#define MAX_EPOCHS 8

typedef struct case_s {
  const char *name;
  const char *gen;   /* ferryctl gen options */
  const char *stages; /* after tfrecord(...) */
  int records;       /* default count */
  int batch;
} case_t;

static const case_t cases[] = {
    {"seed32", "--size 32x32 --shards 8",
     "decode(raw, 32, 32, 3) | dilate(3) | blur(11, 0.8)", 262144, 256},
    {"seed224", "--size 224x224 --shards 4",
     "decode(raw, 224, 224, 3) | dilate(3) | blur(11, 0.8)", 2048, 32},
    {"rrc", "--format jpeg --size imagenet --content photo --shards 2",
     "decode(jpeg) | random_resized_crop(224)", 1024, 32},
    {"rrcexact", "--format jpeg --size imagenet --content photo --shards 2",
     "decode(jpeg) | random_resized_crop(224, exact=true)", 1024, 32},
};

static int opt_epochs = 3, opt_threads = 1, opt_records;
static const char *opt_transport;

typedef struct epoch_s {
  uint64_t records;
  double seconds, cpu, pipe_cpu;
} epoch_t;

/* Runs the job on a fresh cluster; fills ep[0..epochs). Prints the
 * worker's cache lines of `ferryctl status` when cached. */
static int run(const case_t *k, const char *spec, bool cached,
               epoch_t *ep) {
  hx_proc_t *d, *w;
  char why[512], cache_dir[600];
  const char *argv[8];
  int a = 0;
  hx_daemon_opts_t wo = {.threads = opt_threads, .buffer_bytes = 256u << 20};
  if (hx_start_dispatcher(&d, NULL, why, sizeof(why)) != 0) {
    fprintf(stderr, "bench_cache: %s\n", why);
    return -1;
  }
  if (cached) {
    snprintf(cache_dir, sizeof(cache_dir), "%s/cache-%s", hx_tmpdir(),
             k->name);
    argv[a++] = "--cache-dir";
    argv[a++] = cache_dir;
  }
  argv[a] = NULL;
  wo.extra_argv = argv;
  if (hx_start_worker(&w, d->addr, &wo, why, sizeof(why)) != 0 ||
      hx_wait_workers(d->addr, 1, 10000) != 1) {
    fprintf(stderr, "bench_cache: worker: %s\n", why);
    return -1;
  }
  ferry_client_options_t o;
  hx_client_options(&o, d->addr, spec);
  o.num_epochs = opt_epochs;
  o.shuffle = 1;
  o.shuffle_seed = 1;
  o.heartbeat_ms = 50;
  if (opt_transport != NULL)
    o.transport = opt_transport;
  ferry_client_t *c = NULL;
  ferry_error_t err = {0};
  if (ferry_client_new(&o, &c, &err) != 0) {
    fprintf(stderr, "bench_cache: ferry_client_new: %s\n", err.msg);
    return -1;
  }
  int rc = 0;
  for (int e = 0; e < opt_epochs && rc == 0; e++) {
    double c0 = hx_proc_cpu_s(w->pid), p0 = hx_threads_cpu_s(w->pid, "ferry-pipeline");
    double t0 = hx_now_ms();
    uint64_t n = 0;
    for (;;) {
      const ferry_batch_t *b;
      int r = ferry_next(c, &b, 60000, &err);
      if (r == FERRY_EPOCH_END || r == FERRY_END)
        break;
      if (r != 0) {
        fprintf(stderr, "bench_cache: %s: ferry_next: %s\n", k->name,
                err.msg);
        rc = -1;
        break;
      }
      n += b->size;
      ferry_batch_release(c, b);
    }
    ep[e].records = n;
    ep[e].seconds = (hx_now_ms() - t0) / 1e3;
    ep[e].cpu = hx_proc_cpu_s(w->pid) - c0;
    ep[e].pipe_cpu = hx_threads_cpu_s(w->pid, "ferry-pipeline") - p0;
  }
  ferry_client_free(c);
  if (cached) {
    char cmd[1200];
    snprintf(cmd, sizeof(cmd), "%s status --dispatcher %s", hx_ferryctl_bin(),
             d->addr);
    FILE *p = popen(cmd, "r");
    char line[2048];
    while (p != NULL && fgets(line, sizeof(line), p) != NULL)
      if (strstr(line, "cache") != NULL)
        printf("  %s", line + strspn(line, " "));
    if (p != NULL)
      pclose(p);
  }
  hx_stop(w, SIGTERM, 10000, NULL);
  hx_stop(d, SIGTERM, 10000, NULL);
  return rc;
}

static double per_cpu(const epoch_t *e) {
  return e->cpu > 0 ? (double)e->records / e->cpu : 0;
}

static void print_epochs(const char *what, const epoch_t *ep) {
  for (int e = 0; e < opt_epochs; e++)
    printf("  %-9s epoch %d: %7llu records in %6.2f s, worker CPU %6.2f s "
           "(pipeline threads %6.2f s): %9.0f records per worker CPU s\n",
           what, e + 1, (unsigned long long)ep[e].records, ep[e].seconds,
           ep[e].cpu, ep[e].pipe_cpu, per_cpu(&ep[e]));
}

int main(int argc, char **argv) {
  static const struct option longopts[] = {
      {"quick", no_argument, NULL, 'q'},
      {"cases", required_argument, NULL, 'c'},
      {"records", required_argument, NULL, 'r'},
      {"epochs", required_argument, NULL, 'e'},
      {"threads", required_argument, NULL, 't'},
      {"transport", required_argument, NULL, 'x'},
      {NULL, 0, NULL, 0}};
  const char *want = "seed32,seed224,rrc,rrcexact";
  bool quick = false;
  int ch;
  while ((ch = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
    switch (ch) {
    case 'q':
      quick = true;
      want = "seed224";
      opt_records = 256;
      opt_epochs = 2;
      break;
    case 'c':
      want = optarg;
      break;
    case 'r':
      opt_records = atoi(optarg);
      break;
    case 'e':
      opt_epochs = atoi(optarg);
      break;
    case 't':
      opt_threads = atoi(optarg);
      break;
    case 'x':
      opt_transport = optarg;
      break;
    default:
      fprintf(stderr, "usage: bench_cache [--quick] [--cases LIST] "
              "[--records N] [--epochs E] [--threads T] "
              "[--transport grpc|ucx]\n");
      return 2;
    }
  }
  if (opt_epochs < 2 || opt_epochs > MAX_EPOCHS || opt_threads < 1) {
    fprintf(stderr, "bench_cache: --epochs 2..%d, --threads >= 1\n",
            MAX_EPOCHS);
    return 2;
  }
  printf("bench_cache: worker --threads %d, %d epochs per job, transport "
         "%s%s\n", opt_threads, opt_epochs,
         opt_transport != NULL ? opt_transport : "(the client's choice)",
         quick ? " (quick)" : "");
  int failed = 0;
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    const case_t *k = &cases[i];
    size_t l = strlen(k->name);
    const char *at = strstr(want, k->name);
    if (at == NULL || (at[l] != '\0' && at[l] != ','))
      continue;
    int records = opt_records > 0 ? opt_records : k->records;
    char dir[600], cmd[1400], spec[1400];
    snprintf(dir, sizeof(dir), "%s/data-%s", hx_tmpdir(), k->name);
    snprintf(cmd, sizeof(cmd), "%s gen --out %s --records %d %s >/dev/null",
             hx_ferryctl_bin(), dir, records, k->gen);
    double t0 = hx_now_ms();
    if (system(cmd) != 0) {
      fprintf(stderr, "bench_cache: %s failed\n", cmd);
      return 1;
    }
    printf("\ncase %s: %d records (written in %.1f s)\n  %s\n", k->name,
           records, (hx_now_ms() - t0) / 1e3, k->stages);
    snprintf(spec, sizeof(spec), "tfrecord(\"%s/*.tfrecord\") | %s | "
             "batch(%d)", dir, k->stages, k->batch);
    epoch_t on[MAX_EPOCHS], off[MAX_EPOCHS];
    if (run(k, spec, true, on) != 0 || run(k, spec, false, off) != 0) {
      failed++;
      continue;
    }
    print_epochs("cache", on);
    print_epochs("no cache", off);
    double r21 = per_cpu(&on[1]) / per_cpu(&on[0]);
    double rvs = per_cpu(&on[1]) / per_cpu(&off[1]);
    double p21 = on[1].pipe_cpu > 0 && on[0].pipe_cpu > 0
                     ? (on[0].pipe_cpu / (double)on[0].records) /
                           (on[1].pipe_cpu / (double)on[1].records)
                     : 0;
    printf("  ratio %s: records per worker CPU s, epoch 2 / epoch 1 with "
           "the cache %.2f (pipeline threads alone %.2f); cached epoch 2 / "
           "uncached epoch 2 %.2f\n",
           k->name, r21, p21, rvs);
  }
  hx_reap_all();
  printf("\nbench cache: %s\n", failed ? "FAILED" : "ok");
  return failed ? 1 : 0;
}
