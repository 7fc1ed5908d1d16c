/* Smoke test of the ferry-dispatcher binary: it starts on a free port,
 * prints its listening line, answers Health/Check, GetStatus and
 * RegisterDataset over gRPC, keeps its datasets across a restart (the
 * journal) and exits 0 within a second of SIGTERM. Then the long poll of
 * worker heartbeats: held back while there is no news, answered at once
 * by a lease, and answered when the daemon stops. Last, a slow scan
 * (FERRY_DISP_SCAN_DELAY_MS) runs off the loop thread: other calls are
 * answered meanwhile, and a stop answers it at once. The journal:
 * concurrent calls all durable across a compaction, a corrupt journal
 * or a snapshot without its journal refused unless --journal-recover, a
 * real full disk, and answers held
 * for the batch that makes them durable (FERRY_JOURNAL_SYNC_DELAY_MS). */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "alloc.h"
#include "ferry/v1/dispatcher.pb-c.h"
#include "fixture.h"
#include "grpc/health/v1/health.pb-c.h"
#include "rpc.h"
#include "rpc_methods.h"
#include "spec.h"
#include "tsan.h"

#define WAIT_MS 10000

extern char **environ;

typedef struct daemon_s {
  pid_t pid;
  int out; /* read end of its stdout */
  int port;
} daemon_t;

static void setup(void) {
  sigset_t s;
  sigemptyset(&s);
  sigaddset(&s, SIGCHLD);
  /* Before any thread exists, so that sigtimedwait sees the child exit. */
  pthread_sigmask(SIG_BLOCK, &s, NULL);
  fx_setup();
}

/* The daemon a test started and has not reaped: a failed assertion must
 * not leave it running (the fini kills it). */
static pid_t running;

/* A tmpfs a test mounted on its work directory ("" when none). */
static char mounted[160];

static void teardown(void) {
  if (mounted[0] != '\0') {
    if (running > 0) {
      kill(running, SIGKILL);
      waitpid(running, NULL, 0);
      running = 0;
    }
    umount2(mounted, MNT_DETACH);
    mounted[0] = '\0';
  }
  if (running > 0) {
    kill(running, SIGKILL);
    waitpid(running, NULL, 0);
    running = 0;
  }
  fx_teardown();
}

TestSuite(daemon, .init = setup, .fini = teardown);

static double ms_since(const struct timespec *t0) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)(t.tv_sec - t0->tv_sec) * 1e3 +
         (double)(t.tv_nsec - t0->tv_nsec) / 1e6;
}

/* --heartbeat-ms for the next start (the daemon's default), and one more
 * flag ("" for none). */
static char hb_arg[16] = "1000";
static char extra_arg[64];

/* Spawns the daemon: its stdout into d->out, its stderr appended to
 * stderr.log. */
static void spawn_daemon(daemon_t *d) {
  char wd[128], log[128];
  char *argv[] = {FERRY_DISPATCHER_BIN, "--port", "0", "--host", "127.0.0.1",
                  "--work-dir", wd, "--log-level", "debug",
                  "--heartbeat-ms", hb_arg, extra_arg, NULL};
  posix_spawn_file_actions_t fa;
  int p[2];

  snprintf(wd, sizeof(wd), "%s/work", fx_dir);
  snprintf(log, sizeof(log), "%s/stderr.log", fx_dir);
  if (extra_arg[0] == '\0')
    argv[11] = NULL;
  cr_assert_eq(pipe(p), 0);
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, p[1], 1);
  posix_spawn_file_actions_addclose(&fa, p[0]);
  posix_spawn_file_actions_addopen(&fa, 2, log, O_WRONLY | O_CREAT | O_APPEND,
                                   0644);
  cr_assert_eq(posix_spawn(&d->pid, argv[0], &fa, NULL, argv, environ), 0);
  running = d->pid;
  posix_spawn_file_actions_destroy(&fa);
  close(p[1]);
  d->out = p[0];
}

/* Starts the daemon and waits (bounded) for its listening line. */
static void start(daemon_t *d) {
  char line[256] = {0};
  size_t got = 0;
  struct timespec t0;

  spawn_daemon(d);
  clock_gettime(CLOCK_MONOTONIC, &t0);
  while (strchr(line, '\n') == NULL && got < sizeof(line) - 1) {
    struct pollfd pfd = {d->out, POLLIN, 0};
    int left = WAIT_MS - (int)ms_since(&t0);
    ssize_t n;
    cr_assert_gt(left, 0, "no listening line within %d ms", WAIT_MS);
    cr_assert_geq(poll(&pfd, 1, left), 0);
    n = read(d->out, line + got, sizeof(line) - 1 - got);
    cr_assert_gt(n, 0, "the daemon exited before listening");
    got += (size_t)n;
  }
  cr_assert_eq(sscanf(line, "ferry-dispatcher listening on 127.0.0.1:%d",
                      &d->port),
               1, "bad line: %s", line);
  cr_assert_gt(d->port, 0);
}

/* SIGTERM, then the exit status within 1 s. */
static void stop(daemon_t *d) {
  sigset_t s;
  struct timespec t0, limit = {FERRY_TSAN_SLOWDOWN, 0};
  siginfo_t si;
  int status = -1;

  sigemptyset(&s);
  sigaddset(&s, SIGCHLD);
  clock_gettime(CLOCK_MONOTONIC, &t0);
  cr_assert_eq(kill(d->pid, SIGTERM), 0);
  while (waitpid(d->pid, &status, WNOHANG) == 0) {
    if (sigtimedwait(&s, &si, &limit) < 0) {
      kill(d->pid, SIGKILL);
      waitpid(d->pid, &status, 0);
      running = 0;
      cr_assert_fail("no exit within %d s of SIGTERM", FERRY_TSAN_SLOWDOWN);
    }
  }
  running = 0;
  cr_assert_lt(ms_since(&t0), 1000.0 * FERRY_TSAN_SLOWDOWN);
  cr_assert(WIFEXITED(status), "killed by signal %d", WTERMSIG(status));
  cr_assert_eq(WEXITSTATUS(status), 0);
  close(d->out);
}

static ferry_rpc_channel_t *channel(const daemon_t *d) {
  char target[64];
  ferry_rpc_channel_t *ch;
  ferry_error_t err = {0};
  snprintf(target, sizeof(target), "127.0.0.1:%d", d->port);
  cr_assert_eq(ferry__rpc_channel_new(target, NULL, &ch, &err), 0, "%s",
               err.msg);
  return ch;
}

static Ferry__V1__GetStatusResponse *status(ferry_rpc_channel_t *ch) {
  Ferry__V1__GetStatusRequest req = FERRY__V1__GET_STATUS_REQUEST__INIT;
  uint8_t buf[16], *reply;
  size_t n = ferry__v1__get_status_request__pack(&req, buf), len;
  ferry_error_t err = {0};
  Ferry__V1__GetStatusResponse *s;
  cr_assert_eq(ferry__rpc_unary(ch, FERRY_METHOD_GET_STATUS, buf, n, WAIT_MS,
                                FERRY_RPC_WAIT_FOR_READY, &reply, &len, &err),
               0, "%s", err.msg);
  s = ferry__v1__get_status_response__unpack(NULL, len, reply);
  ferry_free(reply);
  cr_assert_not_null(s);
  return s;
}

/* RegisterDataset of "tfrecord(DIR/pattern)"; returns the code. */
static int register_ds(ferry_rpc_channel_t *ch, const char *pattern,
                       char *id, ferry_error_t *err) {
  Ferry__V1__RegisterDatasetRequest req =
      FERRY__V1__REGISTER_DATASET_REQUEST__INIT;
  Ferry__V1__RegisterDatasetResponse *resp;
  ferry_spec_t spec;
  char text[512];
  uint8_t *sb, *buf, *reply;
  size_t sl, n, len;
  int rc;

  snprintf(text, sizeof(text), "tfrecord(\"%s/%s\") | decode(raw, 1, 1, 1)",
           fx_dir, pattern);
  cr_assert_eq(ferry__spec_parse(text, &spec, err), 0);
  cr_assert_eq(ferry__spec_pack(&spec, &sb, &sl), 0);
  ferry__spec_close(&spec);
  req.spec = ferry__v1__pipeline_spec__unpack(NULL, sl, sb);
  n = ferry__v1__register_dataset_request__get_packed_size(&req);
  buf = malloc(n);
  ferry__v1__register_dataset_request__pack(&req, buf);
  rc = ferry__rpc_unary(ch, FERRY_METHOD_REGISTER_DATASET, buf, n, WAIT_MS,
                        FERRY_RPC_WAIT_FOR_READY, &reply, &len, err);
  if (rc == 0) {
    resp = ferry__v1__register_dataset_response__unpack(NULL, len, reply);
    cr_assert_not_null(resp);
    cr_assert_eq(resp->num_records, 20);
    snprintf(id, 17, "%s", resp->dataset_id);
    ferry__v1__register_dataset_response__free_unpacked(resp, NULL);
    ferry_free(reply);
  }
  ferry__v1__pipeline_spec__free_unpacked(req.spec, NULL);
  ferry_free(sb);
  free(buf);
  return rc;
}

Test(daemon, serves_and_stops_on_sigterm) {
  daemon_t d;
  ferry_rpc_channel_t *ch;
  Grpc__Health__V1__HealthCheckRequest hreq =
      GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
  Grpc__Health__V1__HealthCheckResponse *h;
  Ferry__V1__GetStatusResponse *s;
  ferry_error_t err = {0};
  uint8_t buf[64], *reply;
  size_t n, len;
  char id[17] = {0};

  fx_write("d.tfrecord", 20, FERRY_COMPRESSION_NONE);
  ferry__rpc_init();
  start(&d);
  ch = channel(&d);
  n = grpc__health__v1__health_check_request__pack(&hreq, buf);
  cr_assert_eq(ferry__rpc_unary(ch, FERRY_METHOD_HEALTH_CHECK, buf, n, WAIT_MS,
                                FERRY_RPC_WAIT_FOR_READY, &reply, &len, &err),
               0, "%s", err.msg);
  h = grpc__health__v1__health_check_response__unpack(NULL, len, reply);
  cr_assert_not_null(h);
  cr_assert_eq(h->status,
               GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING);
  grpc__health__v1__health_check_response__free_unpacked(h, NULL);
  ferry_free(reply);

  s = status(ch);
  cr_assert_str_neq(s->version, "");
  cr_assert_eq(s->datasets, 0);
  ferry__v1__get_status_response__free_unpacked(s, NULL);

  cr_assert_eq(register_ds(ch, "missing-*.tfrecord", id, &err),
               FERRY_EGRPC_NOT_FOUND);
  cr_assert(strstr(err.msg, "missing-*.tfrecord") != NULL, "%s", err.msg);
  cr_assert_eq(register_ds(ch, "d.tfrecord", id, &err), 0, "%s", err.msg);
  ferry__rpc_channel_free(ch);
  stop(&d);

  /* The journal brings the dataset back. */
  start(&d);
  ch = channel(&d);
  s = status(ch);
  cr_assert_eq(s->datasets, 1);
  ferry__v1__get_status_response__free_unpacked(s, NULL);
  ferry__rpc_channel_free(ch);
  stop(&d);
  ferry__rpc_shutdown();
}

/* ---- Long-polled worker heartbeats --------------------------------------- */

/* One WorkerHeartbeat, blocking, that lists `n` tasks (split 0, `lease`)
 * of `job`. No assertion: it may run on a helper thread. */
typedef struct whb_s {
  ferry_rpc_channel_t *ch;
  uint64_t worker_id, job, lease;
  size_t n;
  int rc;
  double ms; /* how long the call took */
  Ferry__V1__WorkerHeartbeatResponse *resp;
  ferry_error_t err;
} whb_t;

static void *whb_run(void *arg) {
  whb_t *h = arg;
  Ferry__V1__WorkerHeartbeatRequest req =
      FERRY__V1__WORKER_HEARTBEAT_REQUEST__INIT;
  Ferry__V1__TaskProgress t = FERRY__V1__TASK_PROGRESS__INIT;
  Ferry__V1__TaskProgress *tp[1] = {&t};
  uint8_t buf[256], *reply = NULL;
  size_t len;
  struct timespec t0;
  t.job_id = h->job;
  t.lease = h->lease;
  req.worker_id = h->worker_id;
  req.address = (char *)"127.0.0.1:1";
  req.tasks = tp;
  req.n_tasks = h->n;
  size_t n = ferry__v1__worker_heartbeat_request__pack(&req, buf);
  clock_gettime(CLOCK_MONOTONIC, &t0);
  h->resp = NULL;
  h->rc =
      ferry__rpc_unary(h->ch, FERRY_METHOD_WORKER_HEARTBEAT, buf, n, WAIT_MS,
                       FERRY_RPC_WAIT_FOR_READY, &reply, &len, &h->err);
  h->ms = ms_since(&t0);
  if (h->rc == 0) {
    h->resp = ferry__v1__worker_heartbeat_response__unpack(NULL, len, reply);
    ferry_free(reply);
  }
  return NULL;
}

/* Waits (bounded, by asking GetStatus) until the dispatcher saw a
 * heartbeat of worker `id` that left after `t0`. */
static void wait_heartbeat_seen(ferry_rpc_channel_t *ch, uint64_t id,
                                const struct timespec *t0) {
  for (;;) {
    double since = ms_since(t0);
    Ferry__V1__GetStatusResponse *s = status(ch);
    bool seen = false;
    for (size_t i = 0; i < s->n_workers; i++)
      if (s->workers[i]->worker_id == id &&
          (double)s->workers[i]->last_heartbeat_ms_ago < since)
        seen = true;
    ferry__v1__get_status_response__free_unpacked(s, NULL);
    if (seen)
      return;
    cr_assert_lt(ms_since(t0), (double)WAIT_MS, "no heartbeat arrived");
  }
}

/* GetOrCreateJob (anonymous, one epoch) then ClientHeartbeat asking for
 * one split. */
/* GetOrCreateJob of an anonymous one-epoch job on dataset `id`: the
 * call's code, and with 0 the response in *out (may be NULL: freed). */
static int create_job(ferry_rpc_channel_t *ch, const char *id,
                      Ferry__V1__GetOrCreateJobResponse **out,
                      ferry_error_t *err) {
  Ferry__V1__GetOrCreateJobRequest jq =
      FERRY__V1__GET_OR_CREATE_JOB_REQUEST__INIT;
  Ferry__V1__JobOptions o = FERRY__V1__JOB_OPTIONS__INIT;
  Ferry__V1__GetOrCreateJobResponse *j;
  uint8_t buf[256], *reply;
  size_t n, len;
  int rc;
  o.num_epochs = 1;
  jq.dataset_id = (char *)id;
  jq.options = &o;
  n = ferry__v1__get_or_create_job_request__pack(&jq, buf);
  rc = ferry__rpc_unary(ch, FERRY_METHOD_GET_OR_CREATE_JOB, buf, n, WAIT_MS, 0,
                        &reply, &len, err);
  if (rc != 0)
    return rc;
  j = ferry__v1__get_or_create_job_response__unpack(NULL, len, reply);
  ferry_free(reply);
  cr_assert_not_null(j);
  if (out != NULL)
    *out = j;
  else
    ferry__v1__get_or_create_job_response__free_unpacked(j, NULL);
  return 0;
}

static void client_takes_a_split(ferry_rpc_channel_t *ch, const char *id) {
  Ferry__V1__ClientHeartbeatRequest cq =
      FERRY__V1__CLIENT_HEARTBEAT_REQUEST__INIT;
  Ferry__V1__GetOrCreateJobResponse *j = NULL;
  ferry_error_t err = {0};
  uint8_t buf[256], *reply;
  size_t n, len;
  cr_assert_eq(create_job(ch, id, &j, &err), 0, "%s", err.msg);
  cq.job_id = j->job_id;
  cq.client_id = j->client_id;
  cq.want_splits = 1;
  uint8_t secret[16];
  cr_assert_eq(j->client_secret.len, 16);
  memcpy(secret, j->client_secret.data, 16);
  cq.client_secret.data = secret;
  cq.client_secret.len = 16;
  ferry__v1__get_or_create_job_response__free_unpacked(j, NULL);
  n = ferry__v1__client_heartbeat_request__pack(&cq, buf);
  cr_assert_eq(ferry__rpc_unary(ch, FERRY_METHOD_CLIENT_HEARTBEAT, buf, n,
                                WAIT_MS, 0, &reply, &len, &err),
               0, "%s", err.msg);
  Ferry__V1__ClientHeartbeatResponse *c =
      ferry__v1__client_heartbeat_response__unpack(NULL, len, reply);
  ferry_free(reply);
  cr_assert_not_null(c);
  cr_assert_eq(c->n_assignments, 1);
  ferry__v1__client_heartbeat_response__free_unpacked(c, NULL);
}

Test(daemon, idle_worker_heartbeats_wait_for_a_lease) {
  daemon_t d;
  char id[17] = {0};
  ferry_error_t err = {0};
  pthread_t th;

  fx_write("d.tfrecord", 20, FERRY_COMPRESSION_NONE);
  snprintf(hb_arg, sizeof(hb_arg), "1500");
  ferry__rpc_init();
  start(&d);
  ferry_rpc_channel_t *ch = channel(&d);

  /* Registration is answered at once, with the interval. */
  whb_t h = {.ch = ch};
  whb_run(&h);
  cr_assert_eq(h.rc, 0, "%s", h.err.msg);
  cr_assert_lt(h.ms, 1000.0, "registration took %.0f ms", h.ms);
  cr_assert_eq(h.resp->heartbeat_ms, 1500);
  uint64_t w = h.resp->worker_id;
  ferry__v1__worker_heartbeat_response__free_unpacked(h.resp, NULL);

  /* Nothing to tell: held back for the interval, then answered empty. */
  h = (whb_t){.ch = ch, .worker_id = w};
  whb_run(&h);
  cr_assert_eq(h.rc, 0, "%s", h.err.msg);
  cr_assert_geq(h.ms, 1000.0, "an idle heartbeat answered after %.0f ms, "
                "not held back", h.ms);
  cr_assert_lt(h.ms, 5000.0);
  cr_assert_eq(h.resp->n_new_tasks, 0);
  ferry__v1__worker_heartbeat_response__free_unpacked(h.resp, NULL);

  /* A held-back call is answered as soon as a client takes a split. */
  struct timespec sent;
  h = (whb_t){.ch = ch, .worker_id = w};
  clock_gettime(CLOCK_MONOTONIC, &sent);
  cr_assert_eq(pthread_create(&th, NULL, whb_run, &h), 0);
  wait_heartbeat_seen(ch, w, &sent);
  cr_assert_eq(register_ds(ch, "d.tfrecord", id, &err), 0, "%s", err.msg);
  client_takes_a_split(ch, id);
  pthread_join(th, NULL);
  cr_assert_eq(h.rc, 0, "%s", h.err.msg);
  cr_assert_eq(h.resp->n_new_tasks, 1, "the lease is in the answer");
  cr_assert_lt(h.ms, 1000.0, "the lease took %.0f ms to reach the worker",
               h.ms);
  whb_t h2 = {.ch = ch,
              .worker_id = w,
              .job = h.resp->new_tasks[0]->job_id,
              .lease = h.resp->new_tasks[0]->lease,
              .n = 1};
  ferry__v1__worker_heartbeat_response__free_unpacked(h.resp, NULL);

  /* The task listed: held back again, and answered when the daemon
   * stops, which it still does within a second. */
  clock_gettime(CLOCK_MONOTONIC, &sent);
  cr_assert_eq(pthread_create(&th, NULL, whb_run, &h2), 0);
  wait_heartbeat_seen(ch, w, &sent);
  stop(&d);
  pthread_join(th, NULL);
  cr_assert_lt(h2.ms, 1500.0, "the held call was not answered at the stop");
  if (h2.resp != NULL)
    ferry__v1__worker_heartbeat_response__free_unpacked(h2.resp, NULL);
  ferry__rpc_channel_free(ch);
  ferry__rpc_shutdown();
}

/* ---- Registrations off the loop thread ------------------------ */

/* One RegisterDataset of prepared bytes, blocking. No assertion: it runs
 * on a helper thread. */
typedef struct reg_s {
  ferry_rpc_channel_t *ch;
  uint8_t *buf;
  size_t n;
  int timeout_ms; /* 0: WAIT_MS */
  int rc;
  uint64_t records;
  double ms;
  ferry_error_t err;
  atomic_bool done;
} reg_t;

static void *reg_run(void *arg) {
  reg_t *r = arg;
  uint8_t *reply = NULL;
  size_t len;
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  r->rc = ferry__rpc_unary(r->ch, FERRY_METHOD_REGISTER_DATASET, r->buf, r->n,
                           r->timeout_ms ? r->timeout_ms : WAIT_MS,
                           FERRY_RPC_WAIT_FOR_READY, &reply, &len, &r->err);
  r->ms = ms_since(&t0);
  if (r->rc == 0) {
    Ferry__V1__RegisterDatasetResponse *resp =
        ferry__v1__register_dataset_response__unpack(NULL, len, reply);
    r->records = resp != NULL ? resp->num_records : 0;
    if (resp != NULL)
      ferry__v1__register_dataset_response__free_unpacked(resp, NULL);
    ferry_free(reply);
  }
  atomic_store(&r->done, true);
  return NULL;
}

/* The packed RegisterDataset request for "tfrecord(DIR/pattern)". */
static uint8_t *register_request(const char *pattern, size_t *n) {
  Ferry__V1__RegisterDatasetRequest req =
      FERRY__V1__REGISTER_DATASET_REQUEST__INIT;
  ferry_spec_t spec;
  ferry_error_t err = {0};
  char text[512];
  uint8_t *sb, *buf;
  size_t sl;
  snprintf(text, sizeof(text), "tfrecord(\"%s/%s\") | decode(raw, 1, 1, 1)",
           fx_dir, pattern);
  cr_assert_eq(ferry__spec_parse(text, &spec, &err), 0, "%s", err.msg);
  cr_assert_eq(ferry__spec_pack(&spec, &sb, &sl), 0);
  ferry__spec_close(&spec);
  req.spec = ferry__v1__pipeline_spec__unpack(NULL, sl, sb);
  *n = ferry__v1__register_dataset_request__get_packed_size(&req);
  buf = malloc(*n);
  ferry__v1__register_dataset_request__pack(&req, buf);
  ferry__v1__pipeline_spec__free_unpacked(req.spec, NULL);
  ferry_free(sb);
  return buf;
}

/* Whether the daemon's log holds `what` (it logs at debug level). */
/* How many times the daemon's log says `what`. */
static int log_count(const char *what) {
  char path[128], *buf;
  size_t n;
  int count = 0;
  FILE *f;
  snprintf(path, sizeof(path), "%s/stderr.log", fx_dir);
  if ((f = fopen(path, "r")) == NULL)
    return 0;
  buf = malloc(16 << 20);
  cr_assert_not_null(buf);
  n = fread(buf, 1, (16 << 20) - 1, f);
  fclose(f);
  buf[n] = '\0';
  for (const char *p = buf; (p = strstr(p, what)) != NULL; p += strlen(what))
    count++;
  free(buf);
  return count;
}

static bool log_has(const char *what) { return log_count(what) > 0; }

Test(daemon, a_slow_scan_does_not_block_other_calls) {
  daemon_t d;
  pthread_t th;
  struct timespec t0, t1;
  char path[128];
  int polls = 0;

  fx_write("d.tfrecord", 20, FERRY_COMPRESSION_NONE);
  fx_write("e.tfrecord", 20, FERRY_COMPRESSION_NONE);
  ferry__rpc_init();
  /* Test-only: every scan waits 1.5 s first (a slow file system). */
  setenv("FERRY_DISP_SCAN_DELAY_MS", "1500", 1);
  start(&d);
  unsetenv("FERRY_DISP_SCAN_DELAY_MS");
  ferry_rpc_channel_t *ch = channel(&d);
  ferry__v1__get_status_response__free_unpacked(status(ch), NULL);

  reg_t r = {.ch = ch};
  r.buf = register_request("d.tfrecord", &r.n);
  atomic_init(&r.done, false);
  clock_gettime(CLOCK_MONOTONIC, &t0);
  cr_assert_eq(pthread_create(&th, NULL, reg_run, &r), 0);
  /* While it scans, GetStatus and a worker's first heartbeat (answered at
   * once) keep being answered promptly. */
  while (!atomic_load(&r.done)) {
    clock_gettime(CLOCK_MONOTONIC, &t1);
    Ferry__V1__GetStatusResponse *s = status(ch);
    double ms = ms_since(&t1);
    bool in_flight = !atomic_load(&r.done);
    if (in_flight) {
      cr_assert_lt(ms, 200.0, "GetStatus took %.0f ms during a scan", ms);
      /* The commit comes at least 1.5 s after t0 (the scan's delay); a
       * status answered later may already show it before the
       * registering thread hears its own answer. */
      if (ms_since(&t0) < 1500.0)
        cr_assert_eq(s->datasets, 0, "committed before the scan ended");
      polls++;
    }
    ferry__v1__get_status_response__free_unpacked(s, NULL);
    if (polls == 3) {
      whb_t h = {.ch = ch};
      whb_run(&h);
      cr_assert_eq(h.rc, 0, "%s", h.err.msg);
      if (!atomic_load(&r.done))
        cr_assert_lt(h.ms, 200.0, "a worker heartbeat took %.0f ms during "
                     "a scan", h.ms);
      ferry__v1__worker_heartbeat_response__free_unpacked(h.resp, NULL);
    }
    cr_assert_lt(ms_since(&t0), (double)WAIT_MS, "the registration hangs");
  }
  pthread_join(th, NULL);
  cr_assert_eq(r.rc, 0, "%s", r.err.msg);
  cr_assert_eq(r.records, 20);
  cr_assert_geq(r.ms, 1500.0, "the scan did not wait (%.0f ms)", r.ms);
  cr_assert_geq(polls, 5, "only %d calls answered during the scan", polls);
  Ferry__V1__GetStatusResponse *s = status(ch);
  cr_assert_eq(s->datasets, 1);
  ferry__v1__get_status_response__free_unpacked(s, NULL);

  /* Registered: answered at once, without a scan. */
  reg_t again = {.ch = ch, .buf = r.buf, .n = r.n};
  reg_run(&again);
  cr_assert_eq(again.rc, 0, "%s", again.err.msg);
  cr_assert_lt(again.ms, 1000.0);
  free(r.buf);

  /* A client that gives up (its deadline) ends the registration: nothing
   * is committed and the daemon goes on serving. */
  reg_t gone = {.ch = ch, .timeout_ms = 300};
  gone.buf = register_request("e.tfrecord", &gone.n);
  reg_run(&gone);
  cr_assert_eq(gone.rc, FERRY_EGRPC_DEADLINE_EXCEEDED, "%d %s", gone.rc,
               gone.err.msg);
  s = status(ch);
  cr_assert_eq(s->datasets, 1);
  ferry__v1__get_status_response__free_unpacked(s, NULL);
  free(gone.buf);

  /* A stop answers a registration in progress at once (UNAVAILABLE) and
   * still exits within a second; the scan's work ends early. */
  snprintf(path, sizeof(path), "%s/stderr.log", fx_dir);
  cr_assert_eq(truncate(path, 0), 0);
  reg_t r2 = {.ch = ch};
  r2.buf = register_request("e.tfrecord", &r2.n);
  atomic_init(&r2.done, false);
  clock_gettime(CLOCK_MONOTONIC, &t0);
  cr_assert_eq(pthread_create(&th, NULL, reg_run, &r2), 0);
  while (!log_has("expanding and scanning its files"))
    cr_assert_lt(ms_since(&t0), (double)WAIT_MS, "the scan never started");
  cr_assert(!atomic_load(&r2.done));
  stop(&d);
  pthread_join(th, NULL);
  cr_assert_eq(r2.rc, FERRY_EGRPC_UNAVAILABLE, "%d %s", r2.rc, r2.err.msg);
  cr_assert_lt(r2.ms, 1500.0);
  free(r2.buf);
  ferry__rpc_channel_free(ch);
  ferry__rpc_shutdown();
}

/* Every rank of a data-parallel job registers its dataset as it starts:
 * 200 calls at once for one dataset that needs a (slow) scan, over three
 * times FERRY_DISP_MAX_REGISTERING. One scan runs; every call gets the
 * dataset, the first one's caller giving up meanwhile included (it stops
 * nobody's registration). */
Test(daemon, concurrent_registrations_of_one_dataset_share_a_scan) {
  enum { CALLS = 200 };
  daemon_t d;
  pthread_t th[CALLS];
  reg_t *r = calloc(CALLS, sizeof(*r));
  struct timespec t0;
  size_t n;

  cr_assert_not_null(r);
  fx_write("d.tfrecord", 20, FERRY_COMPRESSION_NONE);
  ferry__rpc_init();
  setenv("FERRY_DISP_SCAN_DELAY_MS", "1000", 1);
  start(&d);
  unsetenv("FERRY_DISP_SCAN_DELAY_MS");
  ferry_rpc_channel_t *ch = channel(&d);
  uint8_t *buf = register_request("d.tfrecord", &n);
  /* The first caller gives up before the scan ends. */
  r[0] = (reg_t){.ch = ch, .buf = buf, .n = n, .timeout_ms = 300};
  atomic_init(&r[0].done, false);
  clock_gettime(CLOCK_MONOTONIC, &t0);
  cr_assert_eq(pthread_create(&th[0], NULL, reg_run, &r[0]), 0);
  while (!log_has("expanding and scanning its files"))
    cr_assert_lt(ms_since(&t0), (double)WAIT_MS, "the scan never started");
  for (int i = 1; i < CALLS; i++) {
    r[i] = (reg_t){.ch = ch, .buf = buf, .n = n};
    atomic_init(&r[i].done, false);
    cr_assert_eq(pthread_create(&th[i], NULL, reg_run, &r[i]), 0);
  }
  int ok = 0;
  double slowest = 0;
  for (int i = 0; i < CALLS; i++) {
    pthread_join(th[i], NULL);
    if (i == 0)
      continue;
    cr_expect_eq(r[i].rc, 0, "call %d: %s", i, r[i].err.msg);
    ok += r[i].rc == 0 && r[i].records == 20;
    slowest = r[i].ms > slowest ? r[i].ms : slowest;
  }
  cr_assert_eq(r[0].rc, FERRY_EGRPC_DEADLINE_EXCEEDED, "%d %s", r[0].rc,
               r[0].err.msg);
  int scans = log_count("expanding and scanning its files");
  fprintf(stderr, "%d concurrent registrations of one dataset: %d answered "
          "with its 20 records, the slowest in %.0f ms; %d scan(s)\n",
          CALLS - 1, ok, slowest, scans);
  cr_assert_eq(ok, CALLS - 1);
  cr_assert_eq(scans, 1, "%d scans of one dataset", scans);
  cr_assert_lt(slowest, (double)WAIT_MS);
  Ferry__V1__GetStatusResponse *s = status(ch);
  cr_assert_eq(s->datasets, 1);
  ferry__v1__get_status_response__free_unpacked(s, NULL);
  free(buf);
  free(r);
  ferry__rpc_channel_free(ch);
  stop(&d);
  ferry__rpc_shutdown();
}

/* ---- Group commit and a full disk ------------------------------ */

typedef struct jobs_s {
  ferry_rpc_channel_t *ch;
  const char *id;
  int n, ok;
} jobs_t;

static void *jobs_run(void *arg) {
  jobs_t *t = arg;
  for (int i = 0; i < t->n; i++) {
    ferry_error_t err = {0};
    t->ok += create_job(t->ch, t->id, NULL, &err) == 0;
  }
  return NULL;
}

static size_t jobs_after_restart(daemon_t *d) {
  ferry_rpc_channel_t *ch;
  Ferry__V1__GetStatusResponse *s;
  size_t n;
  start(d);
  ch = channel(d);
  s = status(ch);
  n = s->n_jobs;
  ferry__v1__get_status_response__free_unpacked(s, NULL);
  ferry__rpc_channel_free(ch);
  stop(d);
  return n;
}

/* Concurrent mutating calls share fsyncs; every one answered is there
 * after a restart, and the snapshot written meanwhile (--snapshot-bytes
 * small) holds them too. */
Test(daemon, concurrent_calls_are_all_durable_across_a_compaction) {
  enum { THREADS = 8, EACH = 25 };
  daemon_t d;
  ferry_rpc_channel_t *ch;
  ferry_error_t err = {0};
  pthread_t th[THREADS];
  jobs_t t[THREADS];
  char id[17] = {0}, snap[160];
  int ok = 0;

  fx_write("d.tfrecord", 20, FERRY_COMPRESSION_NONE);
  ferry__rpc_init();
  snprintf(extra_arg, sizeof(extra_arg), "--snapshot-bytes=4096");
  start(&d);
  ch = channel(&d);
  cr_assert_eq(register_ds(ch, "d.tfrecord", id, &err), 0, "%s", err.msg);
  for (int i = 0; i < THREADS; i++) {
    t[i] = (jobs_t){ch, id, EACH, 0};
    cr_assert_eq(pthread_create(&th[i], NULL, jobs_run, &t[i]), 0);
  }
  for (int i = 0; i < THREADS; i++) {
    pthread_join(th[i], NULL);
    ok += t[i].ok;
  }
  cr_assert_eq(ok, THREADS * EACH);
  ferry__rpc_channel_free(ch);
  stop(&d);
  snprintf(snap, sizeof(snap), "%s/work/snapshot", fx_dir);
  cr_assert_eq(access(snap, F_OK), 0, "no compaction happened");
  cr_assert(log_has("journal: snapshot of "));
  cr_assert_eq(jobs_after_restart(&d), (size_t)THREADS * EACH);
  extra_arg[0] = '\0';
  ferry__rpc_shutdown();
}

/* Writes d.tfrecord, starts the daemon, registers it and creates one job:
 * the channel, the dataset id in `id`. */
static ferry_rpc_channel_t *start_with_a_job(daemon_t *d, char id[17]) {
  ferry_rpc_channel_t *ch;
  ferry_error_t err = {0};
  fx_write("d.tfrecord", 20, FERRY_COMPRESSION_NONE);
  ferry__rpc_init();
  start(d);
  ch = channel(d);
  cr_assert_eq(register_ds(ch, "d.tfrecord", id, &err), 0, "%s", err.msg);
  cr_assert_eq(create_job(ch, id, NULL, &err), 0, "%s", err.msg);
  return ch;
}

/* Starts the daemon expecting it to refuse: its exit status, once its
 * stdout closed (bounded by WAIT_MS) without a listening line. */
static int start_refused(void) {
  daemon_t d;
  int status = -1;
  char buf[256];
  struct timespec t0;
  ssize_t n = 1;

  clock_gettime(CLOCK_MONOTONIC, &t0);
  spawn_daemon(&d);
  while (n != 0) {
    struct pollfd pfd = {d.out, POLLIN, 0};
    int left = WAIT_MS - (int)ms_since(&t0);
    cr_assert_gt(left, 0, "it did not exit within %d ms", WAIT_MS);
    cr_assert_geq(poll(&pfd, 1, left), 0);
    n = read(d.out, buf, sizeof(buf));
    cr_assert_geq(n, 0);
    cr_assert(n == 0 || memmem(buf, (size_t)n, "listening", 9) == NULL,
              "it started");
  }
  cr_assert_eq(waitpid(d.pid, &status, 0), d.pid);
  running = 0;
  close(d.out);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* A corrupt journal entry followed by valid ones refuses to start naming
 * its offset; --journal-recover starts, cutting there and saying so. */
Test(daemon, a_corrupt_journal_refuses_unless_recovered) {
  daemon_t d;
  ferry_rpc_channel_t *ch;
  Ferry__V1__GetStatusResponse *s;
  char id[17] = {0}, path[160];
  uint8_t x;
  int fd;

  ch = start_with_a_job(&d, id);
  ferry__rpc_channel_free(ch);
  stop(&d);
  /* The first entry (the boot) gets a flipped byte in its data. */
  snprintf(path, sizeof(path), "%s/work/journal", fx_dir);
  cr_assert_geq(fd = open(path, O_RDWR), 0);
  cr_assert_eq(pread(fd, &x, 1, 12), 1);
  x ^= 0x40;
  cr_assert_eq(pwrite(fd, &x, 1, 12), 1);
  close(fd);
  cr_assert_eq(start_refused(), 1);
  cr_assert(log_has("corrupt journal entry at byte offset 0"));
  snprintf(extra_arg, sizeof(extra_arg), "--journal-recover");
  start(&d);
  extra_arg[0] = '\0';
  cr_assert(log_has("--journal-recover"));
  cr_assert(log_has("dropped"));
  ch = channel(&d);
  s = status(ch);
  cr_assert_eq(s->datasets, 0, "everything after offset 0 was dropped");
  ferry__v1__get_status_response__free_unpacked(s, NULL);
  ferry__rpc_channel_free(ch);
  stop(&d);
  ferry__rpc_shutdown();
}

/* A snapshot whose journal is missing refuses to start, naming the
 * journal and --journal-recover, and creates nothing (a second start
 * refuses too); with the flag it starts from the snapshot and warns. */
Test(daemon, a_snapshot_without_its_journal_refuses_unless_recovered) {
  daemon_t d;
  ferry_rpc_channel_t *ch;
  ferry_error_t err = {0};
  Ferry__V1__GetStatusResponse *s;
  char id[17] = {0}, path[160], snap[160];
  int made = 0;

  fx_write("d.tfrecord", 20, FERRY_COMPRESSION_NONE);
  ferry__rpc_init();
  snprintf(extra_arg, sizeof(extra_arg), "--snapshot-bytes=4096");
  start(&d);
  ch = channel(&d);
  cr_assert_eq(register_ds(ch, "d.tfrecord", id, &err), 0, "%s", err.msg);
  snprintf(snap, sizeof(snap), "%s/work/snapshot", fx_dir);
  /* Jobs until a compaction wrote the snapshot, then a few more. */
  for (int more = 5; more > 0 && made < 2000; made++) {
    cr_assert_eq(create_job(ch, id, NULL, &err), 0, "%s", err.msg);
    if (access(snap, F_OK) == 0)
      more--;
  }
  cr_assert_eq(access(snap, F_OK), 0, "no compaction after %d jobs", made);
  ferry__rpc_channel_free(ch);
  stop(&d);
  extra_arg[0] = '\0';
  snprintf(path, sizeof(path), "%s/work/journal", fx_dir);
  cr_assert_eq(unlink(path), 0);
  for (int i = 0; i < 2; i++) {
    cr_assert_eq(start_refused(), 1);
    cr_assert(log_has("/work/journal is missing but"));
    cr_assert(log_has("--journal-recover starts from the snapshot alone"));
    cr_assert_neq(access(path, F_OK), 0, "start %d created the journal", i);
  }
  snprintf(extra_arg, sizeof(extra_arg), "--journal-recover");
  start(&d);
  extra_arg[0] = '\0';
  cr_assert(log_has("starting from the snapshot alone"));
  ch = channel(&d);
  s = status(ch);
  cr_assert_eq(s->datasets, 1, "the snapshot's dataset");
  cr_assert_gt(s->n_jobs, 0);
  cr_assert_leq(s->n_jobs, (size_t)made);
  ferry__v1__get_status_response__free_unpacked(s, NULL);
  ferry__rpc_channel_free(ch);
  stop(&d);
  ferry__rpc_shutdown();
}

/* A real full disk (a small tmpfs on the work directory; root only):
 * mutating calls fail with UNAVAILABLE naming the journal and ENOSPC,
 * reads keep working, and once space is back mutations succeed; a
 * restart has exactly the jobs that were acknowledged. */
Test(daemon, a_full_disk_fails_mutations_and_recovers) {
  daemon_t d;
  ferry_rpc_channel_t *ch;
  ferry_error_t err = {0};
  Ferry__V1__GetStatusResponse *s;
  char id[17] = {0}, wd[160], filler[200];
  size_t acked = 0;
  int fd, rc = 0, tries;
  static char block[4096];

  snprintf(wd, sizeof(wd), "%s/work", fx_dir);
  cr_assert_eq(mkdir(wd, 0755), 0);
  if (geteuid() != 0)
    cr_skip_test("not root: cannot mount a tmpfs to fill");
  if (mount("tmpfs", wd, "tmpfs", 0, "size=256k") != 0)
    cr_skip_test("mount -t tmpfs failed (%s): skipped", strerror(errno));
  snprintf(mounted, sizeof(mounted), "%s", wd);
  ch = start_with_a_job(&d, id);
  acked++;

  /* Fill the file system. */
  snprintf(filler, sizeof(filler), "%s/filler", wd);
  cr_assert_geq(fd = open(filler, O_WRONLY | O_CREAT, 0644), 0);
  memset(block, 'x', sizeof(block));
  while (write(fd, block, sizeof(block)) > 0)
    ;
  while (write(fd, block, 1) > 0)
    ;
  close(fd);
  /* The journal's last page may still take a few entries: call until one
   * fails (bounded). */
  for (tries = 0; tries < 500; tries++) {
    if ((rc = create_job(ch, id, NULL, &err)) != 0)
      break;
    acked++;
  }
  cr_assert_eq(rc, FERRY_EGRPC_UNAVAILABLE, "%d: %s", rc, err.msg);
  cr_assert(strstr(err.msg, "No space left on device") != NULL &&
                strstr(err.msg, "/work/journal") != NULL,
            "%s", err.msg);
  cr_assert(log_has("rebuilding the state from disk"));
  /* Reads keep working and show only what was acknowledged. */
  s = status(ch);
  cr_assert_eq(s->n_jobs, acked);
  ferry__v1__get_status_response__free_unpacked(s, NULL);
  /* Still full: still refused. */
  cr_assert_eq(create_job(ch, id, NULL, &err), FERRY_EGRPC_UNAVAILABLE);
  s = status(ch);
  cr_assert_eq(s->n_jobs, acked);
  ferry__v1__get_status_response__free_unpacked(s, NULL);
  /* Space comes back: mutations succeed again. */
  cr_assert_eq(unlink(filler), 0);
  cr_assert_eq(create_job(ch, id, NULL, &err), 0, "%s", err.msg);
  cr_assert_eq(create_job(ch, id, NULL, &err), 0, "%s", err.msg);
  acked += 2;
  ferry__rpc_channel_free(ch);
  stop(&d);
  cr_assert_eq(jobs_after_restart(&d), acked);
  ferry__rpc_shutdown();
}

typedef struct timed_job_s {
  ferry_rpc_channel_t *ch;
  const char *id;
  struct timespec t0;
  double start_ms, end_ms; /* since t0 */
  int rc;
} timed_job_t;

static void *timed_job_run(void *arg) {
  timed_job_t *t = arg;
  ferry_error_t err = {0};
  t->start_ms = ms_since(&t->t0);
  t->rc = create_job(t->ch, t->id, NULL, &err);
  t->end_ms = ms_since(&t->t0);
  return NULL;
}

/* Every journal sync takes 400 ms more (FERRY_JOURNAL_SYNC_DELAY_MS): a
 * mutating call is answered only after its batch (>= 400 ms); 8 calls at
 * once share batches instead of taking 8 x 400 ms; a GetStatus that shows
 * a job another call just created is answered only once that job is
 * durable (never before the creating call's batch ended), and one with
 * nothing pending is answered at once. */
Test(daemon, answers_wait_for_the_batch_that_covers_them) {
  enum { N = 8, DELAY = 400 };
  daemon_t d;
  ferry_rpc_channel_t *ch;
  Ferry__V1__GetStatusResponse *s;
  timed_job_t t[N];
  pthread_t th[N];
  char id[17] = {0};
  struct timespec t0;
  size_t jobs;
  double wall, ms;

  cr_assert_eq(setenv("FERRY_JOURNAL_SYNC_DELAY_MS", "400", 1), 0);
  ch = start_with_a_job(&d, id);
  unsetenv("FERRY_JOURNAL_SYNC_DELAY_MS");
  cr_assert(log_has("FERRY_JOURNAL_SYNC_DELAY_MS=400"));
  /* Nothing pending: a read is answered at once. */
  clock_gettime(CLOCK_MONOTONIC, &t0);
  s = status(ch);
  jobs = s->n_jobs;
  ferry__v1__get_status_response__free_unpacked(s, NULL);
  ms = ms_since(&t0);
  cr_assert_lt(ms, DELAY / 2.0, "GetStatus took %.0f ms", ms);
  /* N calls at once. */
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (int i = 0; i < N; i++) {
    t[i] = (timed_job_t){ch, id, t0, 0, 0, -1};
    cr_assert_eq(pthread_create(&th[i], NULL, timed_job_run, &t[i]), 0);
  }
  for (int i = 0; i < N; i++)
    pthread_join(th[i], NULL);
  wall = ms_since(&t0);
  for (int i = 0; i < N; i++) {
    cr_assert_eq(t[i].rc, 0);
    cr_assert_geq(t[i].end_ms - t[i].start_ms, DELAY,
                  "answered after %.0f ms: before its batch was durable",
                  t[i].end_ms - t[i].start_ms);
  }
  cr_assert_lt(wall, N * DELAY / 2.0,
               "%d calls took %.0f ms: they did not share syncs", N, wall);
  jobs += N;
  /* A read racing a creation: if it shows the job, it was answered no
   * earlier than one delay after the creation started. */
  for (int round = 0; round < 3; round++) {
    timed_job_t a = {ch, id, {0}, 0, 0, -1};
    pthread_t ta;
    double st_end;
    clock_gettime(CLOCK_MONOTONIC, &a.t0);
    cr_assert_eq(pthread_create(&ta, NULL, timed_job_run, &a), 0);
    s = status(ch);
    st_end = ms_since(&a.t0);
    if (s->n_jobs > jobs)
      cr_assert_geq(st_end, DELAY,
                    "GetStatus showed a job %.0f ms after its creation "
                    "started, before it was durable", st_end);
    ferry__v1__get_status_response__free_unpacked(s, NULL);
    pthread_join(ta, NULL);
    cr_assert_eq(a.rc, 0);
    jobs++;
  }
  ferry__rpc_channel_free(ch);
  stop(&d);
  ferry__rpc_shutdown();
}
