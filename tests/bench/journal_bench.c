/* bench_journal: the dispatcher's durable mutations per second with group
 * commit against one fdatasync per call (--journal-sync-per-call, the
 * behaviour before group commit), in one run, and its restart time on a long
 * history without and with snapshots.
 *
 * Throughput: for each mode and each client count T, a fresh
 * ferry-dispatcher (work directory under hx_tmpdir(), on the real disk,
 * --job-gc-ms=0), one registered dataset, then T threads, each with its
 * own channel, calling GetOrCreateJob (a new anonymous job and its
 * client) and a leaving ClientHeartbeat (the job is then collected at the
 * next tick, so the live state stays small and the figure is the
 * journal's, not the state's) for --seconds. Every call journals and is
 * answered once durable. Prints durable calls/s per mode and the ratio
 * group / per-call at each T.
 *
 * Restart: the history of --history calls (jobs whose clients leave and
 * that GC removes at once: a long journal over a small live state) is
 * written with --snapshot-bytes=0 (no compaction); the dispatcher is
 * restarted on it and the time from spawn to its listening line taken
 * (journal only). Then it runs with --snapshot-bytes=1 until it
 * compacted, and is restarted again (snapshot + short journal).
 *
 * Snapshot of a large state (in-process, the dispatcher's core library):
 * a dataset of --splits splits (default 1,000,000) and a job whose epoch
 * has as many rows, half delivered; the time to capture it (on the
 * dispatcher's loop: what a compaction stalls it for), to pack it (on the
 * journal's thread), its size, and the time to restore a state from it.
 *
 * Usage: bench_journal [--quick] [--seconds S] [--threads 1,8,32]
 *                      [--history N] [--splits N]
 */
#include <getopt.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "alloc.h"
#include "ferry/v1/dispatcher.pb-c.h"
#include "ferry/v1/journal.pb-c.h"
#include "harness.h"
#include "journal.h"
#include "rpc.h"
#include "rpc_methods.h"
#include "snapshot.h"
#include "spec.h"

#define CALL_MS 30000

static hx_dataset_t ds;

static void die(const char *what, const ferry_error_t *err) {
  fprintf(stderr, "bench journal: %s: %s\n", what,
          err != NULL ? err->msg : "");
  hx_reap_all();
  exit(1);
}

static ferry_rpc_channel_t *channel(const hx_proc_t *p) {
  ferry_rpc_channel_t *ch;
  ferry_error_t err = {0};
  if (ferry__rpc_channel_new(p->addr, NULL, &ch, &err) != 0)
    die("channel", &err);
  return ch;
}

/* RegisterDataset of the bench's dataset; its id into `id`. */
static void register_ds(const hx_proc_t *d, char id[17]) {
  char text[1024], why[512];
  hx_spec(&ds, NULL, 8, text, sizeof(text));
  if (hx_register_dataset(d->addr, text, id, why, sizeof(why)) != 0) {
    fprintf(stderr, "bench_journal: %s\n", why);
    exit(1);
  }
}

/* GetOrCreateJob of a new anonymous job; with `leave`, its client then
 * leaves (ClientHeartbeat leaving), so that GC drops the job. 0 or the
 * call's code. */
static int one_job(ferry_rpc_channel_t *ch, const char *id, bool leave) {
  Ferry__V1__GetOrCreateJobRequest jq =
      FERRY__V1__GET_OR_CREATE_JOB_REQUEST__INIT;
  Ferry__V1__JobOptions o = FERRY__V1__JOB_OPTIONS__INIT;
  Ferry__V1__GetOrCreateJobResponse *j;
  Ferry__V1__ClientHeartbeatRequest cq =
      FERRY__V1__CLIENT_HEARTBEAT_REQUEST__INIT;
  ferry_error_t err = {0};
  uint8_t buf[256], *reply, secret[16];
  size_t n, len;
  int rc;

  o.num_epochs = 1;
  jq.dataset_id = (char *)id;
  jq.options = &o;
  n = ferry__v1__get_or_create_job_request__pack(&jq, buf);
  if ((rc = ferry__rpc_unary(ch, FERRY_METHOD_GET_OR_CREATE_JOB, buf, n,
                             CALL_MS, 0, &reply, &len, &err)) != 0)
    return rc;
  j = ferry__v1__get_or_create_job_response__unpack(NULL, len, reply);
  ferry_free(reply);
  if (j == NULL)
    return FERRY_EINVAL;
  cq.job_id = j->job_id;
  cq.client_id = j->client_id;
  memcpy(secret, j->client_secret.data, 16);
  ferry__v1__get_or_create_job_response__free_unpacked(j, NULL);
  if (!leave)
    return 0;
  cq.client_secret.data = secret;
  cq.client_secret.len = 16;
  cq.leaving = true;
  n = ferry__v1__client_heartbeat_request__pack(&cq, buf);
  rc = ferry__rpc_unary(ch, FERRY_METHOD_CLIENT_HEARTBEAT, buf, n, CALL_MS, 0,
                        &reply, &len, &err);
  if (rc == 0)
    ferry_free(reply);
  return rc;
}

/* Registers the dataset and creates one job whose client stays, so that
 * --job-gc-ms=0 (every other job is collected as soon as its client
 * left: a small live state however long the history) never collects the
 * dataset. The registration and the job are two calls: a tick between
 * them may collect the dataset, so retry (bounded). */
static void register_and_keep(const hx_proc_t *d, char id[17]) {
  ferry_rpc_channel_t *ch = channel(d);
  int i;
  for (i = 0; i < 20; i++) {
    register_ds(d, id);
    if (one_job(ch, id, false) == 0)
      break;
  }
  ferry__rpc_channel_free(ch);
  if (i == 20)
    die("the job that keeps the dataset", NULL);
}

typedef struct load_s {
  const hx_proc_t *d;
  const char *id;
  double until_ms;
  uint64_t ops, errors;
} load_t;

static void *load_run(void *arg) {
  load_t *l = arg;
  ferry_rpc_channel_t *ch = channel(l->d);
  while (hx_now_ms() < l->until_ms) {
    if (one_job(ch, l->id, true) == 0)
      l->ops += 2; /* GetOrCreateJob and the leaving ClientHeartbeat */
    else
      l->errors++;
  }
  ferry__rpc_channel_free(ch);
  return NULL;
}

static hx_proc_t *start_at(const char *wd, const char *const *flags,
                           double *ms) {
  hx_daemon_opts_t o = {.heartbeat_ms = 1000,
                        .worker_timeout_ms = 10000,
                        .client_timeout_ms = 10000,
                        .extra_argv = flags};
  hx_proc_t *p;
  char why[512];
  double t0 = hx_now_ms();
  if (hx_start_dispatcher_at(&p, &o, 0, wd, why, sizeof(why)) != 0) {
    fprintf(stderr, "bench journal: dispatcher: %s\n", why);
    hx_reap_all();
    exit(1);
  }
  if (ms != NULL)
    *ms = hx_now_ms() - t0;
  return p;
}

static void stop(hx_proc_t *p) {
  if (hx_stop(p, SIGTERM, 10000, NULL) != 0) {
    fprintf(stderr, "bench journal: the dispatcher did not exit cleanly\n");
    hx_reap_all();
    exit(1);
  }
  hx_forget(p);
}

/* Ops/s of T threads for `seconds` on a fresh dispatcher. */
static double throughput(bool per_call, int threads, double seconds,
                         int run) {
  static const char *const group[] = {"--snapshot-bytes=0", "--job-gc-ms=0",
                                      "--client-timeout-ms=3600000", NULL};
  static const char *const single[] = {"--snapshot-bytes=0", "--job-gc-ms=0",
                                       "--client-timeout-ms=3600000",
                                       "--journal-sync-per-call", NULL};
  char wd[700], id[17];
  pthread_t th[256];
  load_t l[256];
  uint64_t ops = 0, errors = 0;
  double t0;
  hx_proc_t *d;

  snprintf(wd, sizeof(wd), "%s/tp-%d", hx_tmpdir(), run);
  d = start_at(wd, per_call ? single : group, NULL);
  register_and_keep(d, id);
  t0 = hx_now_ms();
  for (int i = 0; i < threads; i++) {
    l[i] = (load_t){d, id, t0 + seconds * 1000.0, 0, 0};
    pthread_create(&th[i], NULL, load_run, &l[i]);
  }
  for (int i = 0; i < threads; i++) {
    pthread_join(th[i], NULL);
    ops += l[i].ops;
    errors += l[i].errors;
  }
  t0 = hx_now_ms() - t0;
  stop(d);
  if (errors > 0) {
    fprintf(stderr, "bench journal: %llu calls failed\n",
            (unsigned long long)errors);
    hx_reap_all();
    exit(1);
  }
  return (double)ops / (t0 / 1000.0);
}

static long long file_size(const char *wd, const char *name) {
  char p[800];
  struct stat st;
  snprintf(p, sizeof(p), "%s/%s", wd, name);
  return stat(p, &st) == 0 ? (long long)st.st_size : -1;
}

typedef struct hist_s {
  const hx_proc_t *d;
  const char *id;
  int n;
  int failed;
} hist_t;

static void *hist_run(void *arg) {
  hist_t *h = arg;
  ferry_rpc_channel_t *ch = channel(h->d);
  for (int i = 0; i < h->n; i++)
    h->failed += one_job(ch, h->id, true) != 0;
  ferry__rpc_channel_free(ch);
  return NULL;
}

/* Applies one entry built by the caller (the same path as a replay). */
static void apply_entry(ferry_disp_t *d, Ferry__V1__JournalEntry *e) {
  size_t n = ferry__v1__journal_entry__get_packed_size(e);
  uint8_t *b = malloc(n ? n : 1);
  ferry_error_t err = {0};
  ferry__v1__journal_entry__pack(e, b);
  if (ferry__disp_apply(d, b, n, 0, &err) != 0)
    die("apply", &err);
  free(b);
}

static void snapshot_scale(uint32_t n) {
  ferry_disp_config_t cfg;
  ferry_disp_t *d, *r;
  ferry_spec_t spec;
  ferry_error_t err = {0};
  Ferry__V1__JournalEntry e = FERRY__V1__JOURNAL_ENTRY__INIT;
  Ferry__V1__JournalRegisterDataset rd =
      FERRY__V1__JOURNAL_REGISTER_DATASET__INIT;
  Ferry__V1__JournalCreateJob cj = FERRY__V1__JOURNAL_CREATE_JOB__INIT;
  Ferry__V1__JournalClientJoined cl = FERRY__V1__JOURNAL_CLIENT_JOINED__INIT;
  Ferry__V1__JournalEpochStart es = FERRY__V1__JOURNAL_EPOCH_START__INIT;
  Ferry__V1__JournalProgress pr = FERRY__V1__JOURNAL_PROGRESS__INIT;
  Ferry__V1__Split *sp = calloc(n, sizeof(*sp)), **spp = calloc(n, sizeof(*spp));
  Ferry__V1__JournalRowDelivered *rw = calloc(n, sizeof(*rw)),
                                 **rwp = calloc(n, sizeof(*rwp));
  char *files[1] = {(char *)"/data/a.tfrecord"}, wd[700], path[800];
  uint8_t *snap, *sb;
  size_t len, sl;
  double t0, take_ms, pack_ms, restore_ms;
  ferry_disp_snap_t *cap;
  ferry_journal_t *j;
  ferry_disp_restore_t st;
  FILE *f;

  if (sp == NULL || spp == NULL || rw == NULL || rwp == NULL)
    die("out of memory", NULL);
  ferry__disp_config_init(&cfg);
  if (ferry__disp_new(&cfg, 0, &d) != 0 || ferry__disp_new(&cfg, 0, &r) != 0)
    die("out of memory", NULL);
  if (ferry__spec_parse("tfrecord(\"/data/*.tfrecord\") | decode(raw, 4, 4, "
                        "1)",
                        &spec, &err) != 0 ||
      ferry__spec_pack(&spec, &sb, &sl) != 0)
    die("spec", &err);
  ferry__spec_close(&spec);
  for (uint32_t i = 0; i < n; i++) {
    ferry__v1__split__init(&sp[i]);
    sp[i].index = i;
    sp[i].byte_offset = (uint64_t)i * 50000;
    sp[i].byte_end = (uint64_t)(i + 1) * 50000;
    sp[i].first_record = (uint64_t)i * 1024;
    sp[i].num_records = 1024;
    spp[i] = &sp[i];
    ferry__v1__journal_row_delivered__init(&rw[i]);
    rw[i].row = i;
    rw[i].delivered = 512;
    rwp[i] = &rw[i];
  }
  rd.dataset_id = (char *)"big";
  rd.spec.data = sb;
  rd.spec.len = sl;
  rd.files = files;
  rd.n_files = 1;
  rd.splits = spp;
  rd.n_splits = n;
  e.entry_case = FERRY__V1__JOURNAL_ENTRY__ENTRY_REGISTER_DATASET;
  e.register_dataset = &rd;
  apply_entry(d, &e);
  cj.job_id = 1;
  cj.dataset_id = (char *)"big";
  cj.name = (char *)"";
  cj.num_epochs = 1;
  e.entry_case = FERRY__V1__JOURNAL_ENTRY__ENTRY_CREATE_JOB;
  e.create_job = &cj;
  apply_entry(d, &e);
  cl.job_id = 1;
  cl.client_id = 1;
  e.entry_case = FERRY__V1__JOURNAL_ENTRY__ENTRY_CLIENT_JOINED;
  e.client_joined = &cl;
  apply_entry(d, &e);
  es.job_id = 1;
  e.entry_case = FERRY__V1__JOURNAL_ENTRY__ENTRY_EPOCH_START;
  e.epoch_start = &es;
  apply_entry(d, &e);
  pr.job_id = 1;
  pr.rows = rwp;
  pr.n_rows = n;
  e.entry_case = FERRY__V1__JOURNAL_ENTRY__ENTRY_PROGRESS;
  e.progress = &pr;
  apply_entry(d, &e);

  t0 = hx_now_ms();
  if ((cap = ferry__disp_snapshot_take(d, 1)) == NULL)
    die("snapshot: out of memory", NULL);
  take_ms = hx_now_ms() - t0;
  t0 = hx_now_ms();
  if (ferry__disp_snapshot_pack(cap, &snap, &len, &err) != 0)
    die("snapshot", &err);
  pack_ms = hx_now_ms() - t0;
  ferry__disp_snapshot_release(d, cap);
  snprintf(wd, sizeof(wd), "%s/snapshot-scale", hx_tmpdir());
  mkdir(wd, 0755);
  snprintf(path, sizeof(path), "%s/snapshot", wd);
  if ((f = fopen(path, "wb")) == NULL || fwrite(snap, 1, len, f) != len ||
      fclose(f) != 0)
    die("cannot write the snapshot", NULL);
  t0 = hx_now_ms();
  /* A snapshot written alone, with no journal to lose: recover. */
  if (ferry__journal_open(wd, true, &j, &err) != 0 ||
      ferry__disp_restore(r, j, false, 0, &st, &err) != 0)
    die("restore", &err);
  restore_ms = hx_now_ms() - t0;
  printf("snapshot of %u splits and %u rows: %zu bytes (%.1f per split); "
         "captured on the loop in %.0f ms, packed on the journal's thread "
         "in %.0f ms; restored in %.0f ms\n",
         n, n, len, (double)len / n, take_ms, pack_ms, restore_ms);
  ferry__journal_close(j);
  ferry__free(snap);
  ferry_free(sb);
  ferry__disp_free(d);
  ferry__disp_free(r);
  free(sp);
  free(spp);
  free(rw);
  free(rwp);
}

int main(int argc, char **argv) {
  static const struct option lo[] = {{"quick", no_argument, NULL, 'q'},
                                     {"seconds", required_argument, NULL, 's'},
                                     {"threads", required_argument, NULL, 't'},
                                     {"history", required_argument, NULL, 'h'},
                                     {"splits", required_argument, NULL, 'p'},
                                     {NULL, 0, NULL, 0}};
  double seconds = 3.0;
  int tl[16] = {1, 8, 32}, nt = 3, history = 20000, c;
  long splits = 1000000;
  char tlist[128] = "";

  while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
    if (c == 'q') {
      seconds = 1.0;
      history = 2000;
      splits = 100000;
      tl[0] = 1, tl[1] = 16, nt = 2;
    } else if (c == 's') {
      seconds = atof(optarg);
    } else if (c == 'h') {
      history = atoi(optarg);
    } else if (c == 'p') {
      splits = atol(optarg);
    } else if (c == 't') {
      char *save = NULL, *tok;
      snprintf(tlist, sizeof(tlist), "%s", optarg);
      nt = 0;
      for (tok = strtok_r(tlist, ",", &save); tok != NULL && nt < 16;
           tok = strtok_r(NULL, ",", &save))
        tl[nt++] = atoi(tok);
    } else {
      fprintf(stderr, "usage: bench_journal [--quick] [--seconds S] "
                      "[--threads 1,8,32] [--history N] [--splits N]\n");
      return 2;
    }
  }
  for (int i = 0; i < nt; i++)
    if (tl[i] < 1 || tl[i] > 256) {
      fprintf(stderr, "bench journal: --threads: 1 to 256 each\n");
      return 2;
    }
  ferry__rpc_init();
  if (hx_make_dataset(&ds, "data", 2, 64, 4, 4, 1) != 0)
    die("dataset", NULL);

  printf("durable mutating calls/s (GetOrCreateJob, then the client "
         "leaves; the job is collected at once), %.1f s per run, work "
         "directory under %s\n",
         seconds, hx_tmpdir());
  printf("%8s %16s %16s %8s\n", "clients", "fsync per call", "group commit",
         "ratio");
  int run = 0;
  for (int i = 0; i < nt; i++) {
    double a = throughput(true, tl[i], seconds, run++);
    double b = throughput(false, tl[i], seconds, run++);
    printf("%8d %16.0f %16.0f %8.2f\n", tl[i], a, b, b / a);
    fflush(stdout);
  }

  /* Restart on a long history. */
  {
    /* GC at once (a long history over a small state); one job whose
     * client stays keeps the dataset from being collected too. */
    static const char *const nosnap[] = {"--snapshot-bytes=0",
                                         "--job-gc-ms=0",
                                         "--client-timeout-ms=3600000", NULL};
    static const char *const snap[] = {"--snapshot-bytes=1",
                                       "--job-gc-ms=0",
                                       "--client-timeout-ms=3600000", NULL};
    char wd[700], id[17];
    hist_t h[16];
    pthread_t th[16];
    double ms_journal, ms_snap, t0;
    long long jsize, jsize2, ssize;
    int failed = 0;
    hx_proc_t *d;
    ferry_rpc_channel_t *ch;

    snprintf(wd, sizeof(wd), "%s/history", hx_tmpdir());
    d = start_at(wd, nosnap, NULL);
    register_and_keep(d, id);
    t0 = hx_now_ms();
    for (int i = 0; i < 16; i++) {
      h[i] = (hist_t){d, id, history / 16, 0};
      pthread_create(&th[i], NULL, hist_run, &h[i]);
    }
    for (int i = 0; i < 16; i++) {
      pthread_join(th[i], NULL);
      failed += h[i].failed;
    }
    if (failed > 0)
      die("history calls failed", NULL);
    t0 = hx_now_ms() - t0;
    stop(d);
    jsize = file_size(wd, "journal");
    /* Restart on the whole history (no snapshot). */
    d = start_at(wd, nosnap, &ms_journal);
    stop(d);
    /* Run with compaction on until a snapshot exists, then restart. */
    d = start_at(wd, snap, NULL);
    ch = channel(d);
    for (int i = 0; i < 100 && file_size(wd, "snapshot") < 0; i++)
      one_job(ch, id, true); /* each call's batch may compact */
    ferry__rpc_channel_free(ch);
    stop(d);
    ssize = file_size(wd, "snapshot");
    if (ssize < 0)
      die("no snapshot was written", NULL);
    jsize2 = file_size(wd, "journal");
    d = start_at(wd, snap, &ms_snap);
    stop(d);
    printf("history: %d jobs created, left and collected in %.1f s "
           "(%.0f/s)\n",
           history / 16 * 16, t0 / 1000.0, history / 16 * 16 / (t0 / 1e3));
    printf("restart (spawn to listening): journal of %lld bytes: %.0f ms; "
           "snapshot of %lld bytes + journal of %lld bytes: %.0f ms; "
           "ratio %.2f\n",
           jsize, ms_journal, ssize, jsize2, ms_snap, ms_journal / ms_snap);
  }
  if (splits < 1 || splits > 100000000)
    die("--splits: 1 to 100000000", NULL);
  snapshot_scale((uint32_t)splits);
  hx_dataset_free(&ds);
  hx_reap_all();
  ferry__rpc_shutdown();
  printf("bench journal: ok\n");
  return 0;
}
