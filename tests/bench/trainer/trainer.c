/* bench_trainer: a simulated trainer, the headline figure of what Ferry is
 * for. It consumes batches from a Ferry cluster at a fixed step time (a
 * sleep or a busy-wait standing in for the GPU's step: simulated work,
 * not synchronisation) and reports the input-stall fraction, the share of
 * wall time spent inside ferry_next, for several worker counts. With
 * enough workers the stall stays below 3%: the GPU is kept ~97% busy.
 *
 * It starts a local cluster (build/dispatcher/ferry-dispatcher and N
 * build/worker/ferry-worker processes, stopped with SIGTERM and a bounded
 * wait) or uses one given with --dispatcher, and writes its dataset with
 * Ferry's TFRecord writer: Examples with image (raw 32x32x3), label, id.
 *
 *   bench_trainer [--workers 1,2] [--step-ms 10] [--batches 300] ...
 *   bench_trainer --quick       a short smoke run (ctest bench/trainer-quick)
 *
 * Prints a table and "bench trainer: ok" on success.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ferry/client.h"
#include "ferry/error.h"
#include "ferry/tfrecord.h"

extern char **environ;

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
  const char *bin_dir;  /* the build tree */
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
    .bin_dir = FERRY_BUILD_DIR,
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

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- Dataset ------------------------------------------------------------ */

static size_t put_varint(uint8_t *p, uint64_t v) {
  size_t n = 0;
  while (v >= 0x80) {
    p[n++] = (uint8_t)(v | 0x80);
    v >>= 7;
  }
  p[n++] = (uint8_t)v;
  return n;
}

static size_t varint_len(uint64_t v) {
  uint8_t tmp[10];
  return put_varint(tmp, v);
}

/* One map entry of Features: key -> Feature holding one int64 or one
 * bytes value, written in the protobuf wire format by hand. */
static size_t put_entry(uint8_t *p, const char *key, const uint8_t *bytes,
                        size_t blen, uint64_t ival) {
  size_t klen = strlen(key);
  /* Feature: bytes_list = 1 {value = 1} or int64_list = 3 {packed 1}. */
  size_t inner = bytes != NULL ? 1 + varint_len(blen) + blen
                               : 1 + varint_len(varint_len(ival)) +
                                     varint_len(ival);
  size_t feature = 1 + varint_len(inner) + inner;
  size_t entry = 1 + varint_len(klen) + klen + 1 + varint_len(feature) +
                 feature;
  size_t n = 0;
  p[n++] = 0x0a; /* Features.feature = 1 (map entry) */
  n += put_varint(p + n, entry);
  p[n++] = 0x0a; /* key */
  n += put_varint(p + n, klen);
  memcpy(p + n, key, klen);
  n += klen;
  p[n++] = 0x12; /* value: Feature */
  n += put_varint(p + n, feature);
  if (bytes != NULL) {
    p[n++] = 0x0a; /* bytes_list */
    n += put_varint(p + n, inner);
    p[n++] = 0x0a;
    n += put_varint(p + n, blen);
    memcpy(p + n, bytes, blen);
    n += blen;
  } else {
    p[n++] = 0x1a; /* int64_list */
    n += put_varint(p + n, inner);
    p[n++] = 0x0a; /* packed values */
    n += put_varint(p + n, varint_len(ival));
    n += put_varint(p + n, ival);
  }
  return n;
}

/* Example { features = 1 { image, label, id } }. */
static size_t make_example(uint8_t *buf, const uint8_t *img, uint64_t label,
                           uint64_t id) {
  uint8_t body[IMG_BYTES + 256];
  size_t n = 0;
  n += put_entry(body + n, "image", img, IMG_BYTES, 0);
  n += put_entry(body + n, "label", NULL, 0, label);
  n += put_entry(body + n, "id", NULL, 0, id);
  size_t m = 0;
  buf[m++] = 0x0a;
  m += put_varint(buf + m, n);
  memcpy(buf + m, body, n);
  return m + n;
}

static int write_dataset(const char *dir) {
  uint8_t img[IMG_BYTES], rec[IMG_BYTES + 512];
  uint64_t id = 0, x = 0x9E3779B97F4A7C15ull;
  for (int f = 0; f < opt.files; f++) {
    char path[4096];
    ferry_tfr_writer_t *w;
    ferry_error_t err = {0};
    snprintf(path, sizeof(path), "%s/train-%03d.tfrecord", dir, f);
    if (ferry_tfr_writer_open(path, FERRY_COMPRESSION_NONE, &w, &err) != 0) {
      fprintf(stderr, "bench_trainer: %s\n", err.msg);
      return -1;
    }
    for (int r = 0; r < opt.records_per_file; r++, id++) {
      for (int i = 0; i < IMG_BYTES; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        img[i] = (uint8_t)(x >> 56);
      }
      size_t len = make_example(rec, img, id % 10, id);
      if (ferry_tfr_writer_write(w, rec, len, &err) != 0) {
        fprintf(stderr, "bench_trainer: %s\n", err.msg);
        ferry_tfr_writer_close(w, NULL);
        return -1;
      }
    }
    if (ferry_tfr_writer_close(w, &err) != 0) {
      fprintf(stderr, "bench_trainer: %s\n", err.msg);
      return -1;
    }
  }
  return 0;
}

/* ---- Daemons ------------------------------------------------------------ */

typedef struct proc_s {
  pid_t pid;
  int out_fd;
  char address[256];
} proc_t;

/* Starts argv with stdout on a pipe and stderr in `log`, and waits up to
 * 10 s for its "... listening on HOST:PORT" line. */
static int spawn_daemon(proc_t *p, char *const argv[], const char *log) {
  int fds[2];
  posix_spawn_file_actions_t fa;
  memset(p, 0, sizeof(*p));
  p->pid = -1;
  if (pipe(fds) != 0)
    return -1;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  posix_spawn_file_actions_addclose(&fa, fds[0]);
  posix_spawn_file_actions_addopen(&fa, 2, log, O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  int rc = posix_spawn(&p->pid, argv[0], &fa, NULL, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  close(fds[1]);
  if (rc != 0) {
    fprintf(stderr, "bench_trainer: cannot start %s: %s\n", argv[0],
            strerror(rc));
    close(fds[0]);
    p->pid = -1;
    return -1;
  }
  p->out_fd = fds[0];
  char line[512];
  size_t n = 0;
  double deadline = now_s() + 10;
  while (now_s() < deadline && n < sizeof(line) - 1) {
    struct pollfd pfd = {.fd = p->out_fd, .events = POLLIN};
    if (poll(&pfd, 1, 100) <= 0)
      continue;
    ssize_t k = read(p->out_fd, line + n, 1);
    if (k <= 0)
      break;
    if (line[n] == '\n') {
      line[n] = '\0';
      const char *at = strstr(line, "listening on ");
      if (at != NULL) {
        snprintf(p->address, sizeof(p->address), "%s", at + 13);
        return 0;
      }
      n = 0;
      continue;
    }
    n++;
  }
  fprintf(stderr, "bench_trainer: %s did not say where it listens (log: "
                  "%s)\n", argv[0], log);
  return -1;
}

/* SIGTERM, then up to 5 s for it to exit, then SIGKILL. */
static void stop_daemon(proc_t *p) {
  if (p->pid <= 0)
    return;
  kill(p->pid, SIGTERM);
  double deadline = now_s() + 5;
  int st;
  while (waitpid(p->pid, &st, WNOHANG) == 0) {
    if (now_s() > deadline) {
      kill(p->pid, SIGKILL);
      waitpid(p->pid, &st, 0);
      break;
    }
    struct timespec ts = {0, 10 * 1000000L};
    nanosleep(&ts, NULL);
  }
  if (p->out_fd > 0)
    close(p->out_fd);
  p->pid = -1;
}

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

/* One run with n local workers (or the given cluster when n is 0). */
static int run(const char *root, const char *spec, int n, result_t *r) {
  proc_t d = {.pid = -1}, w[64];
  char bin[4096], log[4096], wd[4096], threads[16], hb[16];
  int rc = -1, started = 0;
  r->workers = n;
  if (opt.dispatcher != NULL)
    return train(opt.dispatcher, spec, r);
  snprintf(wd, sizeof(wd), "%s/dispatcher-%d", root, n);
  mkdir(wd, 0755);
  snprintf(bin, sizeof(bin), "%s/dispatcher/ferry-dispatcher", opt.bin_dir);
  snprintf(log, sizeof(log), "%s/dispatcher-%d.log", root, n);
  snprintf(hb, sizeof(hb), "%d", opt.heartbeat_ms);
  char *dargv[] = {bin, "--port", "0", "--host", "127.0.0.1", "--work-dir",
                   wd, "--heartbeat-ms", hb, NULL};
  if (spawn_daemon(&d, dargv, log) != 0)
    goto out;
  snprintf(bin, sizeof(bin), "%s/worker/ferry-worker", opt.bin_dir);
  snprintf(threads, sizeof(threads), "%d", opt.threads);
  for (; started < n; started++) {
    snprintf(log, sizeof(log), "%s/worker-%d-%d.log", root, n, started);
    char *wargv[] = {bin, "--dispatcher", d.address, "--port", "0",
                     "--host", "127.0.0.1", "--threads", threads,
                     "--heartbeat-ms", hb, NULL};
    if (spawn_daemon(&w[started], wargv, log) != 0) {
      started++;
      goto out;
    }
  }
  rc = train(d.address, spec, r);
out:
  for (int i = 0; i < started; i++)
    stop_daemon(&w[i]);
  stop_daemon(&d);
  return rc;
}

int main(int argc, char **argv) {
  if (parse_args(argc, argv) != 0)
    return 2;
  signal(SIGPIPE, SIG_IGN);
  char root[] = "/tmp/ferry-trainer-XXXXXX";
  if (mkdtemp(root) == NULL) {
    perror("bench_trainer: mkdtemp");
    return 1;
  }
  printf("bench_trainer: dataset %d x %d records of %dx%dx%d in %s\n",
         opt.files, opt.records_per_file, IMG_H, IMG_W, IMG_C, root);
  if (write_dataset(root) != 0)
    return 1;
  char spec[8192];
  snprintf(spec, sizeof(spec),
           "tfrecord(\"%s/train-*.tfrecord\") | decode(raw, %d, %d, %d)%s%s "
           "| batch(%d)",
           root, IMG_H, IMG_W, IMG_C, opt.pipeline[0] ? " | " : "",
           opt.pipeline, opt.batch);
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
    if (run(root, spec, n, &res[nres]) != 0) {
      fprintf(stderr, "bench_trainer: the run with %d worker(s) failed "
                      "(logs in %s)\n", n, root);
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
  if (failed)
    return 1;
  /* The dataset is removed; logs of a failed run are kept. */
  char cmd[4200];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
  if (system(cmd) != 0)
    fprintf(stderr, "bench_trainer: could not remove %s\n", root);
  printf("bench trainer: ok\n");
  return 0;
}
