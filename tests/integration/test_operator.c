/* Issue 10, point 5 with real processes: the operator's ferryctl.
 *
 * - drain a worker mid-epoch (2 workers, a client consuming): every record
 *   id exactly once, the drained worker holds no lease afterwards, `ferryctl
 *   drain` returns 0 once drained and 4 when it cannot finish in --timeout;
 * - cancel a job two clients read: each client's ferry_next fails with an
 *   error naming the job and the cancel within 2 heartbeats;
 * - with tokens on, the client token can neither drain nor cancel;
 * - status/jobs/workers/watch --json: one document per line, "schema": 1,
 *   agreeing with the text; --version; exit 3 for an unreachable
 *   dispatcher;
 * - after a dispatcher restart, a worker that left before it is not listed
 *   as alive, and a drained worker stays drained.
 * The random drain point prints its seed (FERRY_IT_SEED replays it). */
#include <criterion/criterion.h>
#include <criterion/hooks.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ferry/version.h"
#include "harness.h"
#include "it_cluster.h"

extern char **environ;

#define NEXT_TIMEOUT_MS 10000

static hx_proc_t *D;
static hx_proc_t *W[2];

static void reset(void) {
  D = NULL;
  memset(W, 0, sizeof(W));
}

HX_SUITE(operator, 180, reset, NULL);

/* ---- Running ferryctl --------------------------------------------------- */

typedef hx_run_t ctl_t;

/* Runs ferryctl with `args` (NULL-terminated, after the program name),
 * waiting at most `wait_ms` (then SIGKILL). */
static ctl_t ctl(int wait_ms, const char *const *args) {
  char *argv[32];
  int n = 0;
  ctl_t r;
  argv[n++] = (char *)hx_ferryctl_bin();
  for (; args[n - 1] != NULL && n < 31; n++)
    argv[n] = (char *)args[n - 1];
  argv[n] = NULL;
  int rc = hx_run_capture(argv, wait_ms, &r);
  cr_assert_eq(rc, 0, "cannot run %s: %s", argv[0], strerror(rc));
  return r;
}

static void ctl_free(ctl_t *r) { hx_run_free(r); }

/* Every line of `text` is one valid JSON document with "schema": 1;
 * returns the number of lines. */
static int json_lines(const char *text, const char *what) {
  int n = 0;
  const char *p = text;
  while (*p != '\0') {
    const char *nl = strchr(p, '\n');
    cr_assert_not_null(nl, "%s: the last document has no newline:\n%s", what,
                       text);
    char *line = strndup(p, (size_t)(nl - p));
    cr_assert(hx_json_valid(line), "%s: line %d is not one JSON document:\n%s",
              what, n + 1, line);
    cr_assert(strstr(line, "\"schema\": 1") != NULL,
              "%s: line %d has no \"schema\": 1:\n%s", what, n + 1, line);
    free(line);
    n++;
    p = nl + 1;
  }
  return n;
}

/* ---- Cluster ------------------------------------------------------------ */

static void cluster(int n, const char *const *dispatcher_argv) {
  hx_daemon_opts_t o = {.extra_argv = dispatcher_argv};
  it_cluster(&D, W, n, &o, NULL);
}

/* The worker's entry in `ferryctl workers --json` output, or NULL. */
static const char *worker_entry(const char *json, const char *addr) {
  char key[128];
  snprintf(key, sizeof(key), "\"address\": \"%s\"", addr);
  return strstr(json, key);
}

/* The value of the first "state" after the worker's address. */
static void worker_state(const char *json, const char *addr, char *out,
                         size_t cap) {
  const char *e = worker_entry(json, addr);
  out[0] = '\0';
  if (e == NULL)
    return;
  const char *s = strstr(e, "\"state\": \"");
  if (s == NULL)
    return;
  s += strlen("\"state\": \"");
  size_t n = strcspn(s, "\"");
  snprintf(out, cap, "%.*s", (int)(n < cap ? n : cap - 1), s);
}

/* ---- Drain -------------------------------------------------------------- */

typedef struct drain_ctx_s {
  uint32_t at;       /* drain after this many batches */
  bool done;
  ctl_t result;
  int checks;        /* status checks after the drain */
  int64_t max_tasks; /* most leases the drained worker held after it */
} drain_ctx_t;

static void after_batch(uint32_t batches, void *arg) {
  drain_ctx_t *x = arg;
  if (!x->done && batches == x->at) {
    const char *args[] = {"drain", W[1]->addr, "--dispatcher", D->addr,
                          "--timeout", "20", NULL};
    x->result = ctl(30000, args);
    x->done = true;
    return;
  }
  if (x->done && batches % 4 == 0) {
    const char *args[] = {"workers", "--json", "--dispatcher", D->addr, NULL};
    ctl_t r = ctl(10000, args);
    int64_t tasks = -1;
    cr_assert_eq(r.status, 0, "workers --json: %s", r.err);
    cr_assert(hx_json_int_after(r.out, W[1]->addr, "tasks", &tasks),
              "drained worker not listed:\n%s", r.out);
    if (tasks > x->max_tasks)
      x->max_tasks = tasks;
    x->checks++;
    ctl_free(&r);
  }
}

Test(operator, drain_mid_epoch_keeps_exactly_once) {
  hx_dataset_t ds;
  cr_assert_eq(hx_make_dataset(&ds, "d", 8, 500, 8, 8, 3), 0);
  const char *dargs[] = {"--records-per-split", "100", NULL};
  cluster(2, dargs);
  unsigned seed = getenv("FERRY_IT_SEED") != NULL
                      ? (unsigned)strtoul(getenv("FERRY_IT_SEED"), NULL, 10)
                      : (unsigned)time(NULL);
  srand(seed);
  drain_ctx_t x = {.at = 5 + (uint32_t)(rand() % 40)};
  fprintf(stderr, "drain_mid_epoch: seed %u (FERRY_IT_SEED): drain after "
          "batch %u of 125\n", seed, x.at);

  char spec[1024];
  hx_spec(&ds, NULL, 32, spec, sizeof(spec));
  ferry_client_options_t o;
  hx_client_options(&o, D->addr, spec);
  o.num_epochs = 1;
  ferry_client_t *c = it_new_client(&o);
  hx_ids_t got = {0};
  ferry_error_t err = {0};
  int rc = hx_collect_epoch(c, &got, &ds, true, NEXT_TIMEOUT_MS, after_batch,
                            &x, &err);
  if (rc != FERRY_EPOCH_END)
    hx_dump_logs();
  cr_assert_eq(rc, FERRY_EPOCH_END, "ferry_next returned %d after %zu "
               "records: %s", rc, got.n, err.msg);
  cr_assert(x.done, "the epoch ended before batch %u", x.at);
  fprintf(stderr, "drain: exit %d in %.0f ms:\n%s%s", x.result.status,
          x.result.ms, x.result.out, x.result.err);
  cr_assert_eq(x.result.status, 0, "ferryctl drain exited %d: %s",
               x.result.status, x.result.err);
  cr_assert(strstr(x.result.out, "drained") != NULL, "%s", x.result.out);
  /* Said once, and no "moved to 0 other workers": the other is alive. */
  cr_assert(strstr(x.result.out, "drained (drained)") == NULL &&
                strstr(x.result.out, "to 0 other") == NULL,
            "%s", x.result.out);

  size_t n;
  uint64_t *want = hx_expected_ids(&ds, false, &n);
  char why[256];
  cr_assert(hx_same_multiset(got.ids, got.n, want, n, why, sizeof(why)),
            "%s (seed %u)", why, seed);
  cr_expect(!got.bad_pixels, "record %#llx has wrong pixels",
            (unsigned long long)got.bad_pixel_id);
  fprintf(stderr, "drain: %zu records exactly once; drained worker held at "
          "most %lld leases in %d checks after the drain\n", got.n,
          (long long)x.max_tasks, x.checks);
  cr_assert_eq(x.max_tasks, 0, "the drained worker got a new split");

  const char *args[] = {"workers", "--json", "--dispatcher", D->addr, NULL};
  ctl_t r = ctl(10000, args);
  char state[32];
  worker_state(r.out, W[1]->addr, state, sizeof(state));
  cr_assert_str_eq(state, "drained", "%s", r.out);
  cr_assert(strstr(worker_entry(r.out, W[1]->addr), "\"operator_drained\": "
                   "true") != NULL, "%s", r.out);
  ctl_free(&r);

  /* A worker that cannot confirm (stopped) is not drained in time. */
  cr_assert_eq(kill(W[0]->pid, SIGSTOP), 0);
  const char *dr[] = {"drain", W[0]->addr, "--dispatcher", D->addr,
                      "--timeout", "0.5", NULL};
  r = ctl(10000, dr);
  kill(W[0]->pid, SIGCONT);
  fprintf(stderr, "drain of a stopped worker: exit %d in %.0f ms: %s",
          r.status, r.ms, r.err);
  cr_assert_eq(r.status, 4, "exit %d: %s%s", r.status, r.out, r.err);
  cr_assert(strstr(r.err, "not drained") != NULL, "%s", r.err);
  ctl_free(&r);
  /* Unknown workers are a failure, not a timeout. */
  const char *nw[] = {"drain", "9999", "--dispatcher", D->addr, NULL};
  r = ctl(10000, nw);
  cr_assert_eq(r.status, 1, "exit %d: %s", r.status, r.err);
  ctl_free(&r);

  free(want);
  hx_ids_free(&got);
  ctl_free(&x.result);
  ferry_client_free(c);
  hx_dataset_free(&ds);
}

/* ---- Cancel ------------------------------------------------------------- */

typedef struct reader_s {
  ferry_client_t *c;
  pthread_t t;
  volatile bool started;
  int rc;
  char msg[512];
  double failed_at; /* hx_now_ms */
  uint64_t batches;
} reader_t;

static void *read_until_error(void *arg) {
  reader_t *r = arg;
  for (;;) {
    const ferry_batch_t *b = NULL;
    ferry_error_t err = {0};
    int rc = ferry_next(r->c, &b, NEXT_TIMEOUT_MS, &err);
    if (rc == 0) {
      ferry_batch_release(r->c, b);
      r->batches++;
      r->started = true;
      struct timespec ts = {0, 5000000}; /* a trainer's step */
      nanosleep(&ts, NULL);
      continue;
    }
    if (rc == FERRY_EPOCH_END)
      continue;
    r->failed_at = hx_now_ms();
    r->rc = rc;
    snprintf(r->msg, sizeof(r->msg), "%s", err.msg);
    return NULL;
  }
}

#define CANCEL_HB_MS 200

Test(operator, cancel_fails_every_client_within_two_heartbeats) {
  hx_dataset_t ds;
  cr_assert_eq(hx_make_dataset(&ds, "c", 4, 500, 8, 8, 3), 0);
  /* 40 splits an epoch: both clients get some. */
  const char *dargs[] = {"--records-per-split", "50", NULL};
  cluster(2, dargs);
  char spec[1024];
  hx_spec(&ds, NULL, 16, spec, sizeof(spec));
  ferry_client_options_t o;
  hx_client_options(&o, D->addr, spec);
  o.job_name = "to-cancel";
  o.num_epochs = -1;
  o.heartbeat_ms = CANCEL_HB_MS;
  reader_t rd[2];
  memset(rd, 0, sizeof(rd));
  for (int i = 0; i < 2; i++) {
    rd[i].c = it_new_client(&o);
    cr_assert_eq(pthread_create(&rd[i].t, NULL, read_until_error, &rd[i]), 0);
  }
  double deadline = hx_now_ms() + 10000;
  while ((!rd[0].started || !rd[1].started) && hx_now_ms() < deadline) {
    struct timespec ts = {0, 10000000};
    nanosleep(&ts, NULL); /* polling the readers' first batch, bounded */
  }
  if (!rd[0].started || !rd[1].started)
    hx_dump_logs();
  cr_assert(rd[0].started && rd[1].started, "the clients got no batch: "
            "%d '%s', %d '%s'", rd[0].rc, rd[0].msg, rd[1].rc, rd[1].msg);

  const char *jargs[] = {"jobs", "--json", "--dispatcher", D->addr, NULL};
  ctl_t r = ctl(10000, jargs);
  int64_t job = -1;
  cr_assert_eq(r.status, 0, "%s", r.err);
  cr_assert(hx_json_int_after(r.out, "\"jobs\"", "id", &job), "%s", r.out);
  ctl_free(&r);
  char jid[32];
  snprintf(jid, sizeof(jid), "%lld", (long long)job);
  const char *cargs[] = {"job", "cancel", jid, "--dispatcher", D->addr, NULL};
  r = ctl(10000, cargs);
  double done = hx_now_ms();
  cr_assert_eq(r.status, 0, "job cancel exited %d: %s", r.status, r.err);
  cr_assert(strstr(r.out, "cancelled") != NULL, "%s", r.out);
  ctl_free(&r);

  char want[96];
  snprintf(want, sizeof(want), "job %s cancelled by the operator", jid);
  for (int i = 0; i < 2; i++) {
    pthread_join(rd[i].t, NULL);
    double late = rd[i].failed_at - done;
    fprintf(stderr, "client %d: failed %.0f ms after the cancel returned "
            "(%llu batches): %s\n", i, late,
            (unsigned long long)rd[i].batches, rd[i].msg);
    cr_assert_eq(rd[i].rc, FERRY_ECANCELED, "client %d: %d %s", i, rd[i].rc,
                 rd[i].msg);
    cr_assert(strstr(rd[i].msg, want) != NULL, "client %d: '%s' does not "
              "say '%s'", i, rd[i].msg, want);
    cr_assert_leq(late, 2.0 * CANCEL_HB_MS, "client %d failed %.0f ms after "
                  "the cancel, over 2 heartbeats", i, late);
  }
  /* The job is cancelled for good; its workers stop its tasks. */
  bool idle = false;
  deadline = hx_now_ms() + 5000;
  while (!idle && hx_now_ms() < deadline) {
    const char *wargs[] = {"status", "--json", "--dispatcher", D->addr,
                           NULL};
    r = ctl(10000, wargs);
    int64_t t0 = -1, t1 = -1;
    idle = hx_json_int_after(r.out, W[0]->addr, "tasks", &t0) &&
           hx_json_int_after(r.out, W[1]->addr, "tasks", &t1) && t0 == 0 &&
           t1 == 0 && strstr(r.out, "\"state\": \"cancelled\"") != NULL;
    ctl_free(&r);
  }
  cr_assert(idle, "the workers still hold tasks of the cancelled job");
  r = ctl(10000, cargs);
  cr_assert_eq(r.status, 0, "cancelling again: %s", r.err);
  cr_assert(strstr(r.out, "already cancelled") != NULL, "%s", r.out);
  ctl_free(&r);
  for (int i = 0; i < 2; i++)
    ferry_client_free(rd[i].c);
  hx_dataset_free(&ds);
}

/* ---- Roles -------------------------------------------------------------- */

static const char *write_token(const char *name, const char *value) {
  const char *p = hx_write_token(name, value);
  cr_assert_not_null(p, "cannot write the token file %s", name);
  return p;
}

Test(operator, client_token_cannot_drain_or_cancel) {
  const char *client = write_token("client.token", "client-secret-token-1");
  const char *admin = write_token("admin.token", "admin-secret-token-2");
  const char *dargs[] = {"--client-token-file", client, "--admin-token-file",
                         admin, NULL};
  hx_dataset_t ds;
  cr_assert_eq(hx_make_dataset(&ds, "t", 2, 200, 8, 8, 3), 0);
  cluster(1, dargs);
  char spec[1024];
  hx_spec(&ds, NULL, 16, spec, sizeof(spec));
  ferry_client_options_t o;
  hx_client_options(&o, D->addr, spec);
  o.token_file = client;
  o.num_epochs = -1;
  ferry_client_t *c = it_new_client(&o);
  const ferry_batch_t *b = NULL;
  ferry_error_t err = {0};
  cr_assert_eq(ferry_next(c, &b, NEXT_TIMEOUT_MS, &err), 0, "%s", err.msg);
  ferry_batch_release(c, b);

  struct {
    const char *token; /* NULL: none */
    int want;
    const char *says;
  } cases[] = {
      {client, 1, "does not allow"},
      {NULL, 1, "missing or invalid"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    const char *d[] = {"drain",        W[0]->addr, "--dispatcher", D->addr,
                       "--token-file", cases[i].token, NULL};
    const char *k[] = {"job",          "cancel", "1", "--dispatcher", D->addr,
                       "--token-file", cases[i].token, NULL};
    if (cases[i].token == NULL)
      d[4] = k[5] = NULL;
    ctl_t r = ctl(10000, d);
    cr_assert_eq(r.status, cases[i].want, "drain (%s): exit %d: %s",
                 cases[i].token ? "client token" : "no token", r.status,
                 r.err);
    cr_assert(strstr(r.err, cases[i].says) != NULL, "%s", r.err);
    ctl_free(&r);
    r = ctl(10000, k);
    cr_assert_eq(r.status, cases[i].want, "cancel (%s): exit %d: %s",
                 cases[i].token ? "client token" : "no token", r.status,
                 r.err);
    cr_assert(strstr(r.err, cases[i].says) != NULL, "%s", r.err);
    ctl_free(&r);
  }
  /* Nothing changed: the client still reads. */
  cr_assert_eq(ferry_next(c, &b, NEXT_TIMEOUT_MS, &err), 0, "%s", err.msg);
  ferry_batch_release(c, b);
  /* The admin token may (and may read the status). */
  const char *k[] = {"job", "cancel", "1", "--dispatcher", D->addr,
                     "--token-file", admin, NULL};
  ctl_t r = ctl(10000, k);
  cr_assert_eq(r.status, 0, "cancel with the admin token: %s", r.err);
  ctl_free(&r);
  const char *s[] = {"jobs", "--dispatcher", D->addr, "--token-file", admin,
                     NULL};
  r = ctl(10000, s);
  cr_assert_eq(r.status, 0, "jobs with the admin token: %s", r.err);
  cr_assert(strstr(r.out, "cancelled") != NULL, "%s", r.out);
  ctl_free(&r);
  ferry_client_free(c);
  hx_dataset_free(&ds);
}

/* ---- JSON and text ------------------------------------------------------ */

Test(operator, json_lines_agree_with_the_text) {
  hx_dataset_t ds;
  cr_assert_eq(hx_make_dataset(&ds, "j", 2, 300, 8, 8, 3), 0);
  cluster(1, NULL);
  char spec[1024];
  hx_spec(&ds, NULL, 32, spec, sizeof(spec));
  ferry_client_options_t o;
  hx_client_options(&o, D->addr, spec);
  o.job_name = "two-epochs";
  o.num_epochs = 2;
  ferry_client_t *c = it_new_client(&o);
  for (int e = 0; e < 2; e++) {
    hx_ids_t got = {0};
    ferry_error_t err = {0};
    int rc = hx_collect_epoch(c, &got, &ds, true, NEXT_TIMEOUT_MS, NULL, NULL,
                              &err);
    cr_assert_eq(rc, e == 0 ? FERRY_EPOCH_END : FERRY_EPOCH_END,
                 "epoch %d: %d %s", e, rc, err.msg);
    hx_ids_free(&got);
  }
  ferry_client_free(c); /* the job is finished: 2 of 2 epochs */

  const char *cmds[] = {"status", "jobs", "workers"};
  for (int i = 0; i < 3; i++) {
    const char *jargs[] = {cmds[i], "--json", "--dispatcher", D->addr, NULL};
    const char *targs[] = {cmds[i], "--dispatcher", D->addr, NULL};
    ctl_t j = ctl(10000, jargs), t = ctl(10000, targs);
    cr_assert_eq(j.status, 0, "%s --json: %s", cmds[i], j.err);
    cr_assert_eq(t.status, 0, "%s: %s", cmds[i], t.err);
    cr_assert_eq(json_lines(j.out, cmds[i]), 1, "%s --json", cmds[i]);
    /* The worker: same address and state in both. */
    if (i != 1) {
      char state[32], line[160];
      worker_state(j.out, W[0]->addr, state, sizeof(state));
      cr_assert_str_eq(state, "alive", "%s", j.out);
      snprintf(line, sizeof(line), "%s", W[0]->addr);
      const char *w = strstr(t.out, line);
      cr_assert_not_null(w, "%s: no worker in the text:\n%s", cmds[i], t.out);
      cr_assert(strstr(w, "alive") != NULL, "%s", t.out);
    }
    /* The finished job: epoch 2 of 2, every record of it, in both. */
    if (i != 2) {
      int64_t epoch = -1, num = -1, delivered = -1, total = -1;
      cr_assert(hx_json_int_after(j.out, "\"two-epochs\"", "epoch", &epoch));
      cr_assert(hx_json_int_after(j.out, "\"two-epochs\"", "num_epochs",
                                  &num));
      cr_assert(hx_json_int_after(j.out, "\"two-epochs\"", "delivered",
                                  &delivered));
      cr_assert(hx_json_int_after(j.out, "\"two-epochs\"", "total", &total));
      cr_assert_eq(epoch, 2, "%s", j.out);
      cr_assert_eq(num, 2, "%s", j.out);
      cr_assert_eq(total, 600, "%s", j.out);
      cr_assert_eq(delivered, 600, "%s", j.out);
      cr_assert(strstr(j.out, "\"state\": \"finished\"") != NULL, "%s",
                j.out);
      const char *job = strstr(t.out, "two-epochs");
      cr_assert_not_null(job, "%s", t.out);
      cr_assert(strstr(job, "finished") != NULL, "%s", t.out);
      cr_assert(strstr(job, "2/2") != NULL, "%s: no epoch 2/2:\n%s", cmds[i],
                t.out);
      cr_assert(strstr(job, i == 0 ? "600 of 600" : "600/600") != NULL,
                "%s: not every record:\n%s", cmds[i], t.out);
    }
    ctl_free(&j);
    ctl_free(&t);
  }
  /* watch --json: one document per refresh, one per line. */
  const char *w[] = {"watch", "--json", "--count", "3", "--interval", "0.1",
                     "--dispatcher", D->addr, NULL};
  ctl_t r = ctl(10000, w);
  cr_assert_eq(r.status, 0, "%s", r.err);
  cr_assert_eq(json_lines(r.out, "watch --json"), 3, "%s", r.out);
  ctl_free(&r);
  const char *sw[] = {"status", "--watch", "--json", "--count", "2",
                      "--interval", "0.1", "--dispatcher", D->addr, NULL};
  r = ctl(10000, sw);
  cr_assert_eq(r.status, 0, "%s", r.err);
  cr_assert_eq(json_lines(r.out, "status --watch --json"), 2, "%s", r.out);
  ctl_free(&r);

  /* --version, and exit 3 for a dispatcher nobody answers for. */
  const char *v[] = {"--version", NULL};
  r = ctl(10000, v);
  char want[64];
  snprintf(want, sizeof(want), "ferryctl %s\n", FERRY_VERSION_STRING);
  cr_assert_eq(r.status, 0);
  cr_assert_str_eq(r.out, want);
  ctl_free(&r);
  double ms = -1;
  char dead[64];
  snprintf(dead, sizeof(dead), "%s", D->addr);
  hx_stop(D, SIGTERM, 5000, &ms);
  const char *cmd3[5][4] = {{"status", "--json"},
                            {"workers", "--json"},
                            {"jobs"},
                            {"drain", "1"},
                            {"job", "cancel", "1"}};
  for (int i = 0; i < 5; i++) {
    const char *a[8];
    int k = 0;
    for (int m = 0; m < 4 && cmd3[i][m] != NULL; m++)
      a[k++] = cmd3[i][m];
    a[k++] = "--dispatcher";
    a[k++] = dead;
    a[k] = NULL;
    r = ctl(10000, a);
    cr_assert_eq(r.status, 3, "%s with the dispatcher gone: exit %d: %s",
                 cmd3[i][0], r.status, r.err);
    cr_assert(strstr(r.err, "did not answer") != NULL, "%s", r.err);
    ctl_free(&r);
  }
  const char *u[] = {"workers", "--bogus", NULL};
  r = ctl(10000, u);
  cr_assert_eq(r.status, 2, "a usage error: exit %d", r.status);
  ctl_free(&r);
  hx_dataset_free(&ds);
}

/* ---- Restart ------------------------------------------------------------ */

Test(operator, restart_lists_no_departed_worker_as_alive) {
  char why[512], dir[600];
  snprintf(dir, sizeof(dir), "%s/work", hx_tmpdir());
  cr_assert_eq(hx_start_dispatcher_at(&D, NULL, 0, dir, why, sizeof(why)), 0,
               "%s", why);
  for (int i = 0; i < 2; i++)
    cr_assert_eq(hx_start_worker(&W[i], D->addr, NULL, why, sizeof(why)), 0,
                 "%s", why);
  cr_assert_eq(hx_wait_workers(D->addr, 2, 10000), 2);
  const char *dr[] = {"drain", W[0]->addr, "--dispatcher", D->addr,
                      "--timeout", "10", NULL};
  ctl_t r = ctl(15000, dr);
  cr_assert_eq(r.status, 0, "%s", r.err);
  ctl_free(&r);
  /* Worker 1 leaves; the dispatcher dies before its timeout. */
  hx_stop(W[1], SIGKILL, 5000, NULL);
  int port = atoi(strrchr(D->addr, ':') + 1);
  hx_stop(D, SIGKILL, 5000, NULL);
  cr_assert_eq(hx_start_dispatcher_at(&D, NULL, port, dir, why, sizeof(why)),
               0, "%s", why);
  const char *wa[] = {"workers", "--json", "--dispatcher", D->addr, NULL};
  r = ctl(10000, wa);
  char s0[32], s1[32];
  worker_state(r.out, W[1]->addr, s1, sizeof(s1));
  fprintf(stderr, "after the restart: %s", r.out);
  cr_assert(s1[0] != '\0', "the departed worker is not listed:\n%s", r.out);
  cr_assert_str_neq(s1, "alive", "a worker that left is listed alive:\n%s",
                    r.out);
  ctl_free(&r);
  /* The drained worker comes back drained, and nothing else. */
  double deadline = hx_now_ms() + 10000;
  do {
    r = ctl(10000, wa);
    worker_state(r.out, W[0]->addr, s0, sizeof(s0));
    worker_state(r.out, W[1]->addr, s1, sizeof(s1));
    bool ok = strcmp(s0, "drained") == 0 && strcmp(s1, "lost") == 0;
    if (ok || hx_now_ms() > deadline)
      break;
    ctl_free(&r);
  } while (true);
  cr_assert_str_eq(s0, "drained", "%s", r.out);
  cr_assert_str_eq(s1, "lost", "%s", r.out);
  ctl_free(&r);
}
