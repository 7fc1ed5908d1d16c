/* Worker faults with real processes: a worker survives a shard
 * truncated under it (the client gets the error, the worker serves the
 * next job), a stalled trainer slows only itself (per-stream shares of
 * the worker's chunk pool), and a shuffled GZIP shard stays within
 * --buffer-bytes (spill file instead of buffering the split). A worker
 * SIGTERMed as its only trainer dies exits, cleanly and soon, whatever
 * the order of the two signals, and the dispatcher records it as left.
 *
 * Every wait is bounded; every record id of a completed epoch is counted
 * against the dataset's multiset. */
#include <criterion/criterion.h>
#include <criterion/hooks.h>
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "it_cluster.h"
#include "tfrecord.h"

#define NEXT_TIMEOUT_MS 10000

static hx_proc_t *D;
static hx_proc_t *W[2];

static void reset(void) {
  D = NULL;
  memset(W, 0, sizeof(W));
}

HX_SUITE(worker_faults, 240, reset, NULL);

static void cluster(int n, const hx_daemon_opts_t *wopts) {
  it_cluster(&D, W, n, NULL, wopts);
}

/* One epoch of `spec` on a new client, every id once; returns records/s. */
static double one_epoch(const char *spec, const hx_dataset_t *ds, int shuffle,
                        bool check_pixels) {
  ferry_client_options_t o;
  hx_client_options(&o, D->addr, spec);
  o.num_epochs = 1;
  if (shuffle) {
    o.shuffle = 1;
    o.shuffle_seed = 7;
  }
  ferry_client_t *c = it_new_client(&o);
  hx_ids_t got = {0};
  ferry_error_t err = {0};
  double t0 = hx_now_ms();
  int rc = hx_collect_epoch(c, &got, ds, check_pixels, NEXT_TIMEOUT_MS, NULL,
                            NULL, &err);
  double ms = hx_now_ms() - t0;
  if (rc != FERRY_EPOCH_END)
    hx_dump_logs();
  cr_assert_eq(rc, FERRY_EPOCH_END, "ferry_next returned %d (%s) after %zu "
               "records: %s", rc, rc < 0 ? ferry_strerror(rc) : "", got.n,
               err.msg);
  size_t n;
  uint64_t *want = hx_expected_ids(ds, false, &n);
  char why[256];
  bool same = hx_same_multiset(got.ids, got.n, want, n, why, sizeof(why));
  cr_expect(!got.bad_pixels, "record %#llx has wrong pixels or label",
            (unsigned long long)got.bad_pixel_id);
  size_t total = got.n;
  free(want);
  hx_ids_free(&got);
  ferry_client_free(c);
  cr_assert(same, "%s", why);
  return (double)total * 1000.0 / (ms > 1 ? ms : 1);
}

static bool alive(const hx_proc_t *p) {
  return p->pid > 0 && waitpid(p->pid, NULL, WNOHANG) == 0 &&
         kill(p->pid, 0) == 0;
}

/* (a) A shard truncated while a worker reads it: no SIGBUS; under policy
 * fail the client gets an error naming the file and a byte offset within
 * a bounded time; the worker then serves another job to its end. */
Test(worker_faults, shard_truncated_under_a_reading_worker) {
  hx_dataset_t big, small;
  /* One 37 MB shard of 12 KiB records: three splits of 1024. */
  cr_assert_eq(hx_make_dataset(&big, "big", 1, 3000, 64, 64, 3), 0);
  cr_assert_eq(hx_make_dataset(&small, "small", 2, 300, 8, 8, 3), 0);
  hx_daemon_opts_t wo = {.threads = 1, .buffer_bytes = 4u << 20};
  cluster(1, &wo);

  char spec[1024];
  hx_spec(&big, NULL, 32, spec, sizeof(spec));
  ferry_client_options_t o;
  hx_client_options(&o, D->addr, spec);
  o.num_epochs = 1;
  ferry_client_t *c = it_new_client(&o);
  const ferry_batch_t *b = NULL;
  ferry_error_t err = {0};
  int rc = ferry_next(c, &b, NEXT_TIMEOUT_MS, &err);
  cr_assert_eq(rc, 0, "first batch: %d %s", rc, err.msg);
  ferry_batch_release(c, b);
  /* The client stops reading: the worker parks on its full share with
   * the shard open at some offset well before 60% of it. Then cut it. */
  usleep(300 * 1000);
  uint64_t cut = big.offsets[0][1800] + 100;
  cr_assert_eq(truncate(big.files[0], (off_t)cut), 0);
  fprintf(stderr, "truncated %s to %llu bytes\n", big.files[0],
          (unsigned long long)cut);

  double t0 = hx_now_ms();
  size_t records = 32;
  for (;;) {
    rc = ferry_next(c, &b, NEXT_TIMEOUT_MS, &err);
    if (rc != 0)
      break;
    records += b->size;
    ferry_batch_release(c, b);
    cr_assert_lt(hx_now_ms() - t0, 30000.0, "no error within 30 s");
  }
  double ms = hx_now_ms() - t0;
  fprintf(stderr, "error after %.0f ms and %zu records: %s\n", ms, records,
          err.msg);
  if (rc >= 0)
    hx_dump_logs();
  cr_assert_lt(rc, 0, "ferry_next returned %d, not an error", rc);
  cr_assert_neq(rc, FERRY_ETIMEDOUT, "the client hung: %s", err.msg);
  cr_assert(strstr(err.msg, big.files[0]) != NULL, "no file name in: %s",
            err.msg);
  cr_assert(strstr(err.msg, "offset") != NULL, "no offset in: %s", err.msg);
  cr_assert_lt(records, 3000);
  ferry_client_free(c);

  cr_assert(alive(W[0]), "the worker died (status %d)", W[0]->status);
  hx_spec(&small, NULL, 32, spec, sizeof(spec));
  one_epoch(spec, &small, 0, true);
  cr_assert(alive(W[0]), "the worker died after the second job");
  hx_dataset_free(&big);
  hx_dataset_free(&small);
}

/* (b) Job A's trainer stalls (holds its batch, stops calling ferry_next)
 * while job B runs on the same workers: B keeps at least half the
 * throughput it had alone (each figure the better of two epochs of 16,000
 * records; every id of each epoch counted). */
Test(worker_faults, stalled_client_slows_only_itself) {
  hx_dataset_t a, bds;
  cr_assert_eq(hx_make_dataset(&a, "a", 4, 1000, 64, 64, 3), 0);
  cr_assert_eq(hx_make_dataset(&bds, "b", 4, 4000, 32, 32, 3), 0);
  hx_daemon_opts_t wo = {.threads = 1, .buffer_bytes = 16u << 20};
  cluster(2, &wo);
  char spec_a[1024], spec_b[1024];
  hx_spec(&a, NULL, 32, spec_a, sizeof(spec_a));
  hx_spec(&bds, NULL, 32, spec_b, sizeof(spec_b));

  /* The better of two epochs each time: the two cores are shared. */
  double alone = one_epoch(spec_b, &bds, 0, true);
  double again = one_epoch(spec_b, &bds, 0, true);
  alone = again > alone ? again : alone;

  ferry_client_options_t o;
  hx_client_options(&o, D->addr, spec_a);
  o.num_epochs = 1;
  ferry_client_t *ca = it_new_client(&o);
  const ferry_batch_t *held = NULL;
  ferry_error_t err = {0};
  for (int i = 0; i < 3; i++) {
    if (held != NULL)
      ferry_batch_release(ca, held);
    int rc = ferry_next(ca, &held, NEXT_TIMEOUT_MS, &err);
    cr_assert_eq(rc, 0, "job A batch %d: %d %s", i, rc, err.msg);
  }
  /* A holds its batch and reads no more: its streams fill their shares. */
  usleep(1000 * 1000);
  double stalled = one_epoch(spec_b, &bds, 0, true);
  again = one_epoch(spec_b, &bds, 0, true);
  stalled = again > stalled ? again : stalled;
  fprintf(stderr,
          "job B: %.0f records/s alone, %.0f records/s with job A stalled "
          "(ratio %.2f)\n",
          alone, stalled, stalled / alone);
  cr_assert_geq(stalled, 0.5 * alone,
                "job B: %.0f records/s alone, %.0f with job A stalled",
                alone, stalled);
  ferry_batch_release(ca, held);
  ferry_client_free(ca);
  hx_dataset_free(&a);
  hx_dataset_free(&bds);
}

/* (c) A shuffled GZIP shard of 98 MB (inflated) under --buffer-bytes 4 MiB:
 * the worker's peak resident memory grows by at most the buffer plus 32
 * MiB (reader and spill buffers, one record, the record table, gRPC's
 * buffers, malloc slack), never by the split. */
#define MEM_CONSTANT_KIB (32L << 10)
Test(worker_faults, shuffled_gzip_within_buffer_bytes) {
  hx_dataset_t ds;
  cr_assert_eq(hx_make_dataset(&ds, "gz", 1, 8000, 64, 64, 3), 0);
  cr_assert_eq(hx_compress_dataset(&ds, FERRY_COMPRESSION_GZIP), 0);
  hx_daemon_opts_t wo = {.threads = 1, .buffer_bytes = 4u << 20};
  cluster(1, &wo);
  long rss0 = hx_status_kib(W[0]->pid, "VmRSS");
  cr_assert_gt(rss0, 0);
  char spec[1024];
  snprintf(spec, sizeof(spec),
           "tfrecord(\"%s\", compression=gzip) | decode(raw, %d, %d, %d) | "
           "batch(32)",
           ds.glob, ds.h, ds.w, ds.c);
  one_epoch(spec, &ds, 1, true);
  long hwm = hx_status_kib(W[0]->pid, "VmHWM");
  long rss1 = hx_status_kib(W[0]->pid, "VmRSS");
  long bound = rss0 + (long)(4u << 10) + MEM_CONSTANT_KIB;
  fprintf(stderr,
          "worker memory: VmRSS %ld KiB before, VmHWM %ld KiB and VmRSS %ld "
          "KiB after a shuffled epoch of a %.0f MB GZIP shard; bound %ld KiB "
          "(before + --buffer-bytes 4 MiB + %ld MiB)\n",
          rss0, hwm, rss1,
          (double)ds.per_file * (64 * 64 * 3 + 60) / 1e6, bound,
          MEM_CONSTANT_KIB >> 10);
  cr_assert_leq(hwm, bound, "VmHWM %ld KiB over %ld KiB", hwm, bound);
  hx_dataset_free(&ds);
}

/* (d) SIGTERM to a worker at about the moment its only trainer dies
 * (SIGKILL or SIGTERM to the it_client process), in either order, up to
 * 30 ms apart (half the time within 3 ms), over gRPC or UCX: the worker exits with status 0 within
 * 5 s every time. Before the fix, a UCX stream the worker finished (its
 * shutdown) before it saw the client's control call end kept that call
 * unanswered while sends to the dead client stayed outstanding, and the
 * worker's gRPC server shutdown, waiting for every answer, never ended.
 * The iterations run until 100 or 45 s, whichever comes first; the seed
 * (FERRY_IT_SEED, else the time) is printed to replay a failure. Then
 * every worker stopped is listed "left" by the dispatcher, none "lost". */
#define SIGTERM_ITERATIONS 100
#define SIGTERM_BUDGET_MS 45000.0
#define SIGTERM_EXIT_MS 5000
#define SIGTERM_SPREAD_US 30000

static unsigned next_rand(uint64_t *s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return (unsigned)(*s >> 33);
}

/* Occurrences of `needle` in `text`. */
static int count_of(const char *text, const char *needle) {
  int n = 0;
  for (const char *p = text; (p = strstr(p, needle)) != NULL;
       p += strlen(needle))
    n++;
  return n;
}

Test(worker_faults, sigterm_while_its_trainer_dies, .timeout = 180) {
  const char *env = getenv("FERRY_IT_SEED");
  uint64_t seed = env != NULL && env[0] != '\0'
                      ? strtoull(env, NULL, 10)
                      : (uint64_t)time(NULL) ^ (uint64_t)getpid();
  uint64_t rng = seed;
  fprintf(stderr, "sigterm_while_its_trainer_dies: seed %llu "
          "(FERRY_IT_SEED=%llu replays it)\n",
          (unsigned long long)seed, (unsigned long long)seed);
  hx_dataset_t ds;
  /* 3 KiB records, 64 per batch: chunks large enough for UCX rendezvous. */
  cr_assert_eq(hx_make_dataset(&ds, "sig", 2, 400, 32, 32, 3), 0);
  char spec[1024], why[512];
  hx_spec(&ds, NULL, 64, spec, sizeof(spec));
  cr_assert_eq(hx_start_dispatcher(&D, NULL, why, sizeof(why)), 0, "%s",
               why);
  hx_daemon_opts_t wo = {.threads = 1, .buffer_bytes = 16u << 20};
  double t0 = hx_now_ms(), worst = 0;
  int it = 0;
  for (; it < SIGTERM_ITERATIONS && hx_now_ms() - t0 < SIGTERM_BUDGET_MS;
       it++) {
    hx_proc_t *w, *c;
    cr_assert_eq(hx_start_worker(&w, D->addr, &wo, why, sizeof(why)), 0,
                 "%s", why);
    cr_assert_eq(hx_wait_workers(D->addr, 1, 10000), 1,
                 "iteration %d: the worker did not register", it);
    /* UCX 3 times in 4: its streams are where the hang was. */
    const char *transport = next_rand(&rng) % 4 ? "ucx" : "grpc";
    char name[32], job[32], out[600], step[16];
    snprintf(name, sizeof(name), "trainer%d", it);
    snprintf(job, sizeof(job), "sigterm-%d", it);
    snprintf(out, sizeof(out), "%s/%s.ids", hx_tmpdir(), name);
    snprintf(step, sizeof(step), "%u", next_rand(&rng) % 2 ? 2000u : 0u);
    setenv("FERRY_IT_CLIENT_TRANSPORT", transport, 1);
    char *argv[] = {FERRY_IT_CLIENT_BIN, D->addr, spec, job, "100000", out,
                    step, "-1", NULL};
    cr_assert_eq(hx_spawn_marked(&c, name, argv, "ready: ", 10000, why,
                                 sizeof(why)),
                 0, "%s", why);
    /* Chunks flow: the trainer took two batches (polling its output file,
     * at most 10 s). */
    double until = hx_now_ms() + 10000;
    while (hx_client_log_batches(out) < 2 && hx_now_ms() < until)
      usleep(5000);
    if (hx_client_log_batches(out) < 2)
      hx_dump_logs();
    cr_assert_geq(hx_client_log_batches(out), 2,
                  "iteration %d: no batch within 10 s", it);
    int tsig = next_rand(&rng) % 2 ? SIGKILL : SIGTERM;
    /* Half the time within 3 ms (the trainer first) to 1 ms (the worker
     * first), where the race is; else within 30 ms either way. */
    long spread = next_rand(&rng) % 2
                      ? (long)(next_rand(&rng) % 4001) - 3000
                      : (long)(next_rand(&rng) % (2 * SIGTERM_SPREAD_US + 1)) -
                            SIGTERM_SPREAD_US;
    /* The offset is the fault's shape, not a synchronisation: spread < 0
     * kills the trainer first, > 0 the worker first. */
    struct timespec gap = {0, labs(spread) * 1000L};
    double sent;
    if (spread < 0) {
      kill(c->pid, tsig);
      nanosleep(&gap, NULL);
      sent = hx_now_ms();
      kill(w->pid, SIGTERM);
    } else {
      sent = hx_now_ms();
      kill(w->pid, SIGTERM);
      nanosleep(&gap, NULL);
      kill(c->pid, tsig);
    }
    /* Signal 0: only waits (and SIGKILLs it past the bound). */
    int st = hx_stop(w, 0, SIGTERM_EXIT_MS, NULL);
    double ms = hx_now_ms() - sent;
    if (st == -1)
      hx_dump_logs();
    cr_assert_neq(st, -1,
                  "iteration %d (seed %llu): the worker did not exit within "
                  "%d ms of SIGTERM (trainer %s, %s, step %s us, SIGTERM "
                  "%+.1f ms after the trainer's signal): SIGKILLed",
                  it, (unsigned long long)seed, SIGTERM_EXIT_MS,
                  tsig == SIGKILL ? "SIGKILL" : "SIGTERM", transport, step,
                  -spread / 1000.0);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0,
              "iteration %d (seed %llu): the worker ended with wait status "
              "%#x",
              it, (unsigned long long)seed, st);
    worst = ms > worst ? ms : worst;
    hx_stop(c, SIGKILL, 5000, NULL);
    hx_forget(w);
    hx_forget(c);
  }
  unsetenv("FERRY_IT_CLIENT_TRANSPORT");
  fprintf(stderr, "sigterm_while_its_trainer_dies: %d iterations in %.1f s, "
          "every worker exited 0, the slowest %.0f ms after its SIGTERM "
          "(seed %llu)\n",
          it, (hx_now_ms() - t0) / 1000, worst, (unsigned long long)seed);
  cr_assert_geq(it, 10, "only %d iterations in %.0f s", it,
                SIGTERM_BUDGET_MS / 1000);

  /* Each worker's last heartbeat said draining: once the worker timeout
   * (2 s) passed, the dispatcher lists every one of them as left (at most
   * 10 s), and none as lost. */
  char *json = NULL;
  int status = -1;
  double until = hx_now_ms() + 10000;
  for (;;) {
    free(json);
    json = hx_ferryctl_status_json(D->addr, &status);
    cr_assert_not_null(json, "ferryctl status did not run");
    if (count_of(json, "\"state\": \"left\"") >= it ||
        hx_now_ms() > until)
      break;
    usleep(100000);
  }
  cr_assert_eq(count_of(json, "\"state\": \"lost\""), 0,
               "a worker stopped with SIGTERM is listed lost:\n%s", json);
  cr_assert_eq(count_of(json, "\"state\": \"left\""), it,
               "not every stopped worker is listed left:\n%s", json);
  free(json);
  hx_dataset_free(&ds);
}

/* (e) A worker out of file descriptors: its splits move to the other
 * worker and the epoch ends once, every record exactly once, under policy
 * skip, with nothing counted as skipped. Before, the worker reported the
 * failed open ("open: Too many open files") as the data's error and the
 * job failed, skip or not. Worker 2's limit is set (prlimit) at its
 * lowest free descriptor once it registered: every open fails with
 * EMFILE, while the connections it already has keep working. */
static char *slurp(const char *path) {
  FILE *f = fopen(path, "r");
  if (f == NULL)
    return NULL;
  size_t cap = 1 << 16, n = 0;
  char *s = malloc(cap);
  size_t got;
  while (s != NULL && (got = fread(s + n, 1, cap - 1 - n, f)) > 0) {
    n += got;
    if (n + 1 == cap) {
      char *t = realloc(s, cap *= 2);
      if (t == NULL) {
        free(s);
        s = NULL;
      }
      s = t;
    }
  }
  fclose(f);
  if (s != NULL)
    s[n] = '\0';
  return s;
}

static int lowest_free_fd(pid_t pid) {
  char path[64];
  for (int fd = 0; fd < 65536; fd++) {
    snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)pid, fd);
    if (access(path, F_OK) != 0)
      return fd;
  }
  return -1;
}


/* The log's lines in which `what` comes before `tag` (e.g. "restarts
 * epoch ... (lease L on worker N)"). */
static int lines_saying(const char *log, const char *tag, const char *what) {
  int n = 0;
  for (const char *q = log; (q = strstr(q, tag)) != NULL; q++) {
    const char *bol = q;
    while (bol > log && bol[-1] != '\n')
      bol--;
    const char *w = strstr(bol, what);
    n += w != NULL && w < q;
  }
  return n;
}

Test(worker_faults, worker_out_of_descriptors_gives_splits_back,
     .timeout = 120) {
  hx_dataset_t ds;
  /* 8 files of 200 records: one split each, spread over both workers. */
  cr_assert_eq(hx_make_dataset(&ds, "fds", 8, 200, 8, 8, 3), 0);
  hx_daemon_opts_t wo = {.threads = 1};
  /* A client gives up splits whose worker saw no stream of it for 1 s,
   * before its stream there fails (about 5 s). */
  const char *const dargv[] = {"--client-idle-ms", "1000", NULL};
  hx_daemon_opts_t dopts = {.extra_argv = dargv};
  it_cluster(&D, W, 2, &dopts, &wo);
  int low = lowest_free_fd(W[1]->pid);
  cr_assert_gt(low, 2);
  struct rlimit rl = {(rlim_t)low, (rlim_t)low};
  cr_assert_eq(prlimit(W[1]->pid, RLIMIT_NOFILE, &rl, NULL), 0,
               "prlimit: %s", strerror(errno));
  fprintf(stderr, "worker2 (pid %d): RLIMIT_NOFILE %d\n", (int)W[1]->pid,
          low);

  char spec[1024];
  hx_spec(&ds, NULL, 32, spec, sizeof(spec));
  ferry_client_options_t o;
  hx_client_options(&o, D->addr, spec);
  o.num_epochs = 1;
  o.error_policy = FERRY_ON_ERROR_SKIP;
  ferry_client_t *c = it_new_client(&o);
  hx_ids_t got = {0};
  ferry_error_t err = {0};
  int rc = hx_collect_epoch(c, &got, &ds, true, NEXT_TIMEOUT_MS, NULL, NULL,
                            &err);
  if (rc != FERRY_EPOCH_END)
    hx_dump_logs();
  cr_assert_eq(rc, FERRY_EPOCH_END,
               "ferry_next returned %d (%s) after %zu records: %s", rc,
               rc < 0 ? ferry_strerror(rc) : "", got.n, err.msg);
  /* Once: the next call says the job has ended, not another epoch. */
  const ferry_batch_t *b = NULL;
  rc = ferry_next(c, &b, NEXT_TIMEOUT_MS, &err);
  cr_assert_eq(rc, FERRY_END, "after the epoch: %d (%s) %s", rc,
               rc < 0 ? ferry_strerror(rc) : "", err.msg);
  size_t n;
  uint64_t *want = hx_expected_ids(&ds, false, &n);
  char why[256];
  bool same = hx_same_multiset(got.ids, got.n, want, n, why, sizeof(why));
  free(want);
  cr_assert(same, "%s", why);
  cr_expect(!got.bad_pixels, "record %#llx has wrong pixels or label",
            (unsigned long long)got.bad_pixel_id);

  int st = 0;
  char *json = hx_ferryctl_status_json(D->addr, &st);
  cr_assert_not_null(json);
  int64_t skipped = -1;
  cr_assert(hx_json_int_after(json, "\"jobs\"", "skipped", &skipped),
            "no skipped count in: %s", json);
  cr_assert_eq(skipped, 0, "%lld records counted as skipped",
               (long long)skipped);
  cr_assert_null(strstr(json, "\"failed\""), "a job failed: %s", json);
  free(json);
  /* The fault path ran: worker 2 was leased splits and they came back.
   * A task starts only once its client's stream is open, and worker 2
   * cannot accept one: the client then gives the splits up
   * (--client-idle-ms, "took no record" at the dispatcher) or restarts
   * them when its stream there fails. A task that did start and failed
   * to open its file gives its split back itself. */
  char *log = slurp(W[1]->log);
  cr_assert_not_null(log);
  int gave_back = 0;
  for (const char *q = log; (q = strstr(q, "giving the split back")) != NULL;
       q++)
    gave_back++;
  free(log);
  log = slurp(D->log);
  cr_assert_not_null(log);
  /* Worker 2's id: "worker N registered at ITS_ADDR". */
  char w2[96];
  unsigned long long id2 = 0;
  for (const char *q = log; (q = strstr(q, "worker ")) != NULL; q++) {
    char at[80];
    unsigned long long id;
    if (sscanf(q, "worker %llu registered at %79s", &id, at) == 2 &&
        strcmp(at, W[1]->addr) == 0)
      id2 = id;
  }
  cr_assert_neq(id2, 0, "worker2's registration is not in the log");
  snprintf(w2, sizeof(w2), "on worker %llu)", id2);
  /* The dispatcher's lines for a split leaving worker 2 at its client's
   * word: given up ("took no record") or restarted (the stream to it
   * broke), both "(lease L on worker N)". */
  int given_up = lines_saying(log, w2, "took no record");
  int restarted = lines_saying(log, w2, "restarts epoch");
  free(log);
  fprintf(stderr, "worker2 gave %d split(s) back; the client gave %d of "
          "worker2's up and restarted %d; %zu records, each once\n",
          gave_back, given_up, restarted, got.n);
  if (gave_back + given_up + restarted == 0)
    hx_dump_logs();
  cr_assert_gt(gave_back + given_up + restarted, 0, "worker2 never held a split: the "
               "test did not test anything");
  hx_ids_free(&got);
  ferry_client_free(c);
  hx_dataset_free(&ds);
}

/* (f) The worker's own path: a job on two workers whose
 * client stream to worker 2 is open and has delivered records; then worker
 * 2 runs out of descriptors. Its limit (prlimit) is cut to the lowest
 * descriptor number it holds for anything but a shard, so every shard it
 * opens from then on fails with EMFILE (a shard's descriptor freed later
 * sits above the limit and cannot be reused), while its client stream and
 * its dispatcher connection, already open, keep working. Each task there
 * gives its split back (TaskProgress.worker_fault) and the dispatcher
 * moves the split ("cannot run job ... giving it to another worker"):
 * under policy fail the job must not fail, and the epoch ends once with
 * every record exactly once. Without the worker_fault path the failed open
 * is the data's error and the job fails. When the limit is cut (0 to 100
 * ms after the first record from one of worker 2's splits) comes from the
 * printed seed. */
typedef struct {
  const hx_dataset_t *ds;
  const hx_ids_t *got;
  pid_t w2;
  const char *w2_log;
  unsigned seed;
  bool capped;     /* worker 2's limit is cut */
  int limit;       /* the limit set */
  int open_shards; /* shard descriptors it held then */
  uint32_t at_batch;
  size_t at_records;
  double at_ms;
} fd_cut_t;

/* The dataset file `path` names (-1: none). */
static int ds_file_index(const hx_dataset_t *ds, const char *path, size_t n) {
  for (int i = 0; i < ds->nfiles; i++)
    if (strlen(ds->files[i]) == n && strncmp(ds->files[i], path, n) == 0)
      return i;
  return -1;
}

/* The lowest descriptor number `pid` does not hold for anything but one of
 * the dataset's shards (-1 on error); *shards gets the shards it holds. */
#define FD_SCAN_MAX 4096
static int lowest_non_shard_free(pid_t pid, const hx_dataset_t *ds,
                                 int *shards) {
  static bool held[FD_SCAN_MAX];
  memset(held, 0, sizeof(held));
  *shards = 0;
  char dir[64];
  snprintf(dir, sizeof(dir), "/proc/%d/fd", (int)pid);
  DIR *d = opendir(dir);
  if (d == NULL)
    return -1;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.')
      continue;
    int fd = atoi(e->d_name);
    char path[600], target[700];
    snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
    ssize_t n = readlink(path, target, sizeof(target) - 1);
    if (n < 0)
      continue; /* closed meanwhile */
    if (ds_file_index(ds, target, (size_t)n) >= 0) {
      (*shards)++;
      continue;
    }
    if (fd >= 0 && fd < FD_SCAN_MAX)
      held[fd] = true;
  }
  closedir(d);
  for (int fd = 0; fd < FD_SCAN_MAX; fd++)
    if (!held[fd])
      return fd;
  return -1;
}

/* After each batch until the limit is cut: once worker 2's log shows the
 * client's stream open there and the client holds a record of a split
 * leased to worker 2, wait 0 to 100 ms (seeded) and cut its limit. */
static void cut_fds_once_streaming(uint32_t batches, void *arg) {
  fd_cut_t *s = arg;
  if (s->capped)
    return;
  char *log = slurp(s->w2_log);
  if (log == NULL)
    return;
  bool streaming = strstr(log, "stream open: job") != NULL;
  bool *leased = calloc((size_t)s->ds->nfiles, sizeof(bool));
  cr_assert_not_null(leased);
  /* "task job J epoch E split S lease L from START: FILE" */
  for (const char *q = log; (q = strstr(q, "task job ")) != NULL; q++) {
    const char *eol = strchr(q, '\n');
    const char *from = strstr(q, " from ");
    const char *colon = from != NULL ? strstr(from, ": ") : NULL;
    if (eol == NULL || colon == NULL || colon > eol)
      continue;
    int f = ds_file_index(s->ds, colon + 2, (size_t)(eol - colon - 2));
    if (f >= 0)
      leased[f] = true;
  }
  free(log);
  bool delivered = false;
  for (size_t i = 0; i < s->got->n && !delivered; i++) {
    int f = (int)(s->got->ids[i] >> 40);
    delivered = f >= 0 && f < s->ds->nfiles && leased[f];
  }
  free(leased);
  if (!streaming || !delivered)
    return;
  usleep((useconds_t)(rand_r(&s->seed) % 101) * 1000);
  int shards = 0;
  int low = lowest_non_shard_free(s->w2, s->ds, &shards);
  cr_assert_gt(low, 2, "worker2's descriptors could not be read");
  struct rlimit rl = {(rlim_t)low, (rlim_t)low};
  cr_assert_eq(prlimit(s->w2, RLIMIT_NOFILE, &rl, NULL), 0, "prlimit: %s",
               strerror(errno));
  s->capped = true;
  s->limit = low;
  s->open_shards = shards;
  s->at_batch = batches;
  s->at_records = s->got->n;
  s->at_ms = hx_now_ms();
}

Test(worker_faults, worker_out_of_descriptors_mid_stream_gives_splits_back,
     .timeout = 120) {
  unsigned seed =
      hx_seed("worker_out_of_descriptors_mid_stream_gives_splits_back");
  hx_dataset_t ds;
  /* 32 files of 200 records: one split each, spread over both workers,
   * most of them leased after the limit is cut. */
  cr_assert_eq(hx_make_dataset(&ds, "fdm", 32, 200, 8, 8, 3), 0);
  /* Debug: worker 2's log names each task's file and the stream's open. */
  const char *const wargv[] = {"--log-level", "debug", NULL};
  hx_daemon_opts_t wo = {.threads = 1, .extra_argv = wargv};
  cluster(2, &wo);

  char spec[1024];
  hx_spec(&ds, NULL, 32, spec, sizeof(spec));
  ferry_client_options_t o;
  hx_client_options(&o, D->addr, spec);
  o.num_epochs = 1; /* policy fail: a worker's fault must not fail it */
  ferry_client_t *c = it_new_client(&o);
  hx_ids_t got = {0};
  ferry_error_t err = {0};
  fd_cut_t cut = {.ds = &ds, .got = &got, .w2 = W[1]->pid,
                  .w2_log = W[1]->log, .seed = seed};
  double t0 = hx_now_ms();
  int rc = hx_collect_epoch(c, &got, &ds, true, NEXT_TIMEOUT_MS,
                            cut_fds_once_streaming, &cut, &err);
  double ms = hx_now_ms() - t0;
  if (rc != FERRY_EPOCH_END || !cut.capped)
    hx_dump_logs();
  cr_assert_eq(rc, FERRY_EPOCH_END,
               "ferry_next returned %d (%s) after %zu records (worker2 "
               "capped: %d, seed %u): %s",
               rc, rc < 0 ? ferry_strerror(rc) : "", got.n, cut.capped, seed,
               err.msg);
  cr_assert(cut.capped, "worker2 never streamed a record to the client: "
            "its limit was never cut (seed %u)", seed);
  /* Once: the next call says the job has ended, not another epoch. */
  const ferry_batch_t *b = NULL;
  rc = ferry_next(c, &b, NEXT_TIMEOUT_MS, &err);
  cr_assert_eq(rc, FERRY_END, "after the epoch: %d (%s) %s", rc,
               rc < 0 ? ferry_strerror(rc) : "", err.msg);
  size_t n;
  uint64_t *want = hx_expected_ids(&ds, false, &n);
  char why[256];
  bool same = hx_same_multiset(got.ids, got.n, want, n, why, sizeof(why));
  free(want);
  cr_assert(same, "%s (seed %u)", why, seed);
  cr_expect(!got.bad_pixels, "record %#llx has wrong pixels or label",
            (unsigned long long)got.bad_pixel_id);

  int st = 0;
  char *json = hx_ferryctl_status_json(D->addr, &st);
  cr_assert_not_null(json);
  cr_assert_null(strstr(json, "\"failed\""), "a job failed: %s", json);
  free(json);

  /* The worker's own path ran: worker 2 gave splits back after the cut,
   * and the dispatcher moved them as worker faults. */
  char *log = slurp(W[1]->log);
  cr_assert_not_null(log);
  int gave_back = count_of(log, "giving the split back");
  int emfile = count_of(log, "Too many open files");
  free(log);
  log = slurp(D->log);
  cr_assert_not_null(log);
  unsigned long long id2 = 0;
  for (const char *q = log; (q = strstr(q, "worker ")) != NULL; q++) {
    char at[80];
    unsigned long long id;
    if (sscanf(q, "worker %llu registered at %79s", &id, at) == 2 &&
        strcmp(at, W[1]->addr) == 0)
      id2 = id;
  }
  cr_assert_neq(id2, 0, "worker2's registration is not in the log");
  char moved_on[96], w2[96];
  snprintf(moved_on, sizeof(moved_on), "worker %llu cannot run job", id2);
  snprintf(w2, sizeof(w2), "on worker %llu)", id2);
  int moved = 0;
  for (const char *q = log; (q = strstr(q, moved_on)) != NULL; q++) {
    const char *eol = strchr(q, '\n');
    const char *g = strstr(q, "giving it to another worker");
    moved += g != NULL && (eol == NULL || g < eol);
  }
  int given_up = lines_saying(log, w2, "took no record");
  int restarted = lines_saying(log, w2, "restarts epoch");
  free(log);
  fprintf(stderr,
          "worker2 (pid %d) capped at RLIMIT_NOFILE %d (%d shard(s) open) "
          "after batch %u, %zu records, %.0f ms into the epoch; worker2 "
          "gave %d split(s) back (%d EMFILE lines), the dispatcher moved %d "
          "as worker faults; %d of worker2's splits given up at the "
          "client's word, %d restarted elsewhere; %zu records, each once, "
          "in %.0f ms (seed %u)\n",
          (int)W[1]->pid, cut.limit, cut.open_shards, cut.at_batch,
          cut.at_records, cut.at_ms - t0, gave_back, emfile, moved,
          given_up, restarted, got.n, ms, seed);
  if (gave_back == 0 || moved == 0)
    hx_dump_logs();
  cr_assert_gt(gave_back, 0, "worker2 opened no shard after its limit was "
               "cut: the worker's fault path did not run (seed %u)", seed);
  cr_assert_gt(moved, 0, "the dispatcher moved none of worker2's splits as "
               "a worker fault (seed %u)", seed);
  hx_ids_free(&got);
  ferry_client_free(c);
  hx_dataset_free(&ds);
}
