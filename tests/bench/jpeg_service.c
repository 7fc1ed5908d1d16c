/* bench_jpeg_service: the ImageNet-like job through the service, on the
 * generated JPEGs and on the same dataset after `ferryctl records
 * optimize`, in one run on the same cores: images per second of the
 * worker's CPU (per worker core).
 *
 * One dataset (`ferryctl gen --format jpeg --content photo --size
 * imagenet`), its optimized copy (written by the real command), then
 * --rounds rounds of two jobs, original then optimized, each on a fresh
 * cluster of a dispatcher and one worker (--threads T, --metrics-port 0):
 *   decode(jpeg) | random_resized_crop(224) | batch(32), shuffled, 1 epoch
 * For each job: the records, the worker's CPU seconds (its process,
 * /proc/PID/stat), those of its pipeline threads alone, images per worker
 * CPU second, and the worker's ferry_worker_jpeg_decodes_total by path.
 * Every record's pixels are hashed with its id into an order-independent
 * sum: both datasets must deliver the same pixels (the rewrite is
 * lossless and the window path gives the fused path's pixels), and the
 * optimized jobs must decode through the window path. Prints the medians
 * and their ratio, and "bench jpeg_service: ok" when the checks hold.
 *
 * Usage: bench_jpeg_service [--quick] [--records N] [--rounds R]
 *                           [--threads T]
 */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/client.h"
#include "harness.h"

#define MAX_ROUNDS 16

typedef struct job_s {
  uint64_t records, sum, window, fused, full;
  double seconds, cpu, pipe_cpu;
} job_t;

static int opt_records = 512, opt_rounds = 3, opt_threads = 1;

static uint64_t fnv(const uint8_t *p, size_t n, uint64_t h) {
  for (size_t i = 0; i < n; i++)
    h = (h ^ p[i]) * 0x100000001B3ull;
  return h;
}

static long long decodes(const char *metrics, const char *path) {
  char name[128];
  snprintf(name, sizeof(name),
           "ferry_worker_jpeg_decodes_total{path=\"%s\"}", path);
  long long v = hx_metric(metrics, name);
  return v > 0 ? v : 0;
}

/* One job of one epoch over `dir` on a fresh cluster; fills *j. */
static int run(const char *dir, job_t *j) {
  hx_proc_t *d, *w;
  char why[512], spec[900], metrics[128];
  const char *argv[] = {"--metrics-port", "0", "--metrics-host", "127.0.0.1",
                        NULL};
  hx_daemon_opts_t wo = {.threads = opt_threads, .buffer_bytes = 256u << 20,
                         .extra_argv = argv};
  memset(j, 0, sizeof(*j));
  if (hx_start_dispatcher(&d, NULL, why, sizeof(why)) != 0) {
    fprintf(stderr, "bench_jpeg_service: %s\n", why);
    return -1;
  }
  if (hx_start_worker(&w, d->addr, &wo, why, sizeof(why)) != 0 ||
      hx_metrics_address(w, 10000, metrics, sizeof(metrics)) != 0 ||
      hx_wait_workers(d->addr, 1, 10000) != 1) {
    fprintf(stderr, "bench_jpeg_service: worker: %s\n", why);
    return -1;
  }
  snprintf(spec, sizeof(spec), "tfrecord(\"%s/*.tfrecord\") | decode(jpeg) "
           "| random_resized_crop(224) | batch(32)", dir);
  ferry_client_options_t o;
  hx_client_options(&o, d->addr, spec);
  o.num_epochs = 1;
  o.shuffle = 1;
  o.shuffle_seed = 1;
  ferry_client_t *c = NULL;
  ferry_error_t err = {0};
  if (ferry_client_new(&o, &c, &err) != 0) {
    fprintf(stderr, "bench_jpeg_service: ferry_client_new: %s\n", err.msg);
    return -1;
  }
  int rc = 0;
  double c0 = hx_proc_cpu_s(w->pid);
  double p0 = hx_threads_cpu_s(w->pid, "ferry-pipeline");
  double t0 = hx_now_ms();
  for (;;) {
    const ferry_batch_t *b;
    int r = ferry_next(c, &b, 60000, &err);
    if (r == FERRY_EPOCH_END || r == FERRY_END)
      break;
    if (r != 0) {
      fprintf(stderr, "bench_jpeg_service: ferry_next: %s\n", err.msg);
      rc = -1;
      break;
    }
    size_t one = (size_t)b->height * b->width * b->channels;
    for (uint32_t i = 0; i < b->size; i++)
      j->sum += fnv(b->images + i * one, one, 0xCBF29CE484222325ull ^ b->ids[i]);
    j->records += b->size;
    ferry_batch_release(c, b);
  }
  j->seconds = (hx_now_ms() - t0) / 1e3;
  j->cpu = hx_proc_cpu_s(w->pid) - c0;
  j->pipe_cpu = hx_threads_cpu_s(w->pid, "ferry-pipeline") - p0;
  j->window = (uint64_t)decodes(metrics, "window");
  j->fused = (uint64_t)decodes(metrics, "fused");
  j->full = (uint64_t)decodes(metrics, "full");
  ferry_client_free(c);
  hx_stop(w, SIGTERM, 10000, NULL);
  hx_stop(d, SIGTERM, 10000, NULL);
  return rc;
}

static double per_cpu(const job_t *j) {
  return j->cpu > 0 ? (double)j->records / j->cpu : 0;
}

static double median(double *v, int n) {
  for (int i = 1; i < n; i++)
    for (int k = i; k > 0 && v[k] < v[k - 1]; k--) {
      double t = v[k];
      v[k] = v[k - 1];
      v[k - 1] = t;
    }
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int main(int argc, char **argv) {
  static const struct option longopts[] = {
      {"quick", no_argument, NULL, 'q'},
      {"records", required_argument, NULL, 'r'},
      {"rounds", required_argument, NULL, 'n'},
      {"threads", required_argument, NULL, 't'},
      {NULL, 0, NULL, 0}};
  int ch;
  while ((ch = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
    switch (ch) {
    case 'q':
      opt_records = 64;
      opt_rounds = 1;
      break;
    case 'r':
      opt_records = atoi(optarg);
      break;
    case 'n':
      opt_rounds = atoi(optarg);
      break;
    case 't':
      opt_threads = atoi(optarg);
      break;
    default:
      fprintf(stderr, "usage: bench_jpeg_service [--quick] [--records N] "
              "[--rounds R] [--threads T]\n");
      return 2;
    }
  }
  if (opt_records < 1 || opt_rounds < 1 || opt_rounds > MAX_ROUNDS ||
      opt_threads < 1) {
    fprintf(stderr, "bench_jpeg_service: --records >= 1, --rounds 1..%d, "
            "--threads >= 1\n", MAX_ROUNDS);
    return 2;
  }
  char data[600], opt[600], cmd[1500];
  snprintf(data, sizeof(data), "%s/data", hx_tmpdir());
  snprintf(opt, sizeof(opt), "%s/optimized", hx_tmpdir());
  snprintf(cmd, sizeof(cmd), "%s gen --out %s --records %d --shards 2 "
           "--format jpeg --content photo --size imagenet --quality 90 "
           "--seed 5 | tail -n 1", hx_ferryctl_bin(), data, opt_records);
  printf("bench_jpeg_service: %d ImageNet-like JPEGs, worker --threads %d, "
         "%d rounds\n", opt_records, opt_threads, opt_rounds);
  fflush(stdout);
  if (system(cmd) != 0) {
    fprintf(stderr, "bench_jpeg_service: %s failed\n", cmd);
    return 1;
  }
  snprintf(cmd, sizeof(cmd), "%s records optimize %s %s | tail -n 1",
           hx_ferryctl_bin(), data, opt);
  fflush(stdout);
  if (system(cmd) != 0) {
    fprintf(stderr, "bench_jpeg_service: %s failed\n", cmd);
    return 1;
  }
  job_t jobs[2][MAX_ROUNDS];
  double rate[2][MAX_ROUNDS], prate[2][MAX_ROUNDS];
  static const char *const what[2] = {"original", "optimized"};
  int failed = 0;
  for (int r = 0; r < opt_rounds && !failed; r++)
    for (int k = 0; k < 2 && !failed; k++) {
      job_t *j = &jobs[k][r];
      if (run(k ? opt : data, j) != 0) {
        failed = 1;
        break;
      }
      rate[k][r] = per_cpu(j);
      prate[k][r] = j->pipe_cpu > 0 ? (double)j->records / j->pipe_cpu : 0;
      printf("  %-9s round %d: %5llu images in %5.2f s, worker CPU %5.2f s "
             "(pipeline threads %5.2f s): %5.0f images per worker CPU s; "
             "decodes window %llu, fused %llu, full %llu\n",
             what[k], r + 1, (unsigned long long)j->records, j->seconds,
             j->cpu, j->pipe_cpu, rate[k][r], (unsigned long long)j->window,
             (unsigned long long)j->fused, (unsigned long long)j->full);
      if (j->records != (uint64_t)opt_records) {
        fprintf(stderr, "bench_jpeg_service: %s: %llu images, not %d\n",
                what[k], (unsigned long long)j->records, opt_records);
        failed = 1;
      } else if (j->sum != jobs[0][r].sum) {
        fprintf(stderr, "bench_jpeg_service: the optimized dataset "
                "delivered other pixels (sum %016llx, not %016llx)\n",
                (unsigned long long)j->sum,
                (unsigned long long)jobs[0][r].sum);
        failed = 1;
      } else if (k == 1 && j->window < j->records / 2) {
        fprintf(stderr, "bench_jpeg_service: only %llu of %llu optimized "
                "images decoded through the window path\n",
                (unsigned long long)j->window,
                (unsigned long long)j->records);
        failed = 1;
      } else if (k == 0 && j->window != 0) {
        fprintf(stderr, "bench_jpeg_service: the original JPEGs took the "
                "window path\n");
        failed = 1;
      }
    }
  hx_reap_all();
  if (failed) {
    printf("bench jpeg_service: FAILED\n");
    return 1;
  }
  double o = median(rate[0], opt_rounds), z = median(rate[1], opt_rounds);
  double po = median(prate[0], opt_rounds), pz = median(prate[1], opt_rounds);
  printf("medians: original %.0f, optimized %.0f images per worker CPU s: "
         "%.2fx (pipeline threads alone: %.0f and %.0f, %.2fx); the same "
         "pixels from both (every image hashed with its id)\n",
         o, z, o > 0 ? z / o : 0, po, pz, po > 0 ? pz / po : 0);
  printf("bench jpeg_service: ok\n");
  return 0;
}
