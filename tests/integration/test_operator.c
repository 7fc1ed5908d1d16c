/* The operator's ferryctl with real processes.
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
 *   as alive, and a drained worker stays drained;
 * - A job with no live client (finished, or its only client
 *   killed) shows its last figures dated ("no live client; as of ...")
 *   and "-" for batches/s and workers wanted, never a dead client's rate
 *   as current; a trainer whose workers are all drained, stopped or lost
 *   times out with an error that says so.
 * The random drain point prints its seed (FERRY_IT_SEED replays it). */
#include <criterion/criterion.h>
#include <criterion/hooks.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
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
static hx_proc_t *W[3];

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
  atomic_bool started;
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

/* ---- Figures with no live client ----------------------------- */

/* The last three columns (stall, batches/s, wanted) of the job's row in
 * `ferryctl jobs` text. False when no row names the job. */
static bool job_row(const char *text, const char *name, char cols[3][32]) {
  char key[64];
  snprintf(key, sizeof(key), " %s ", name);
  for (const char *l = text; l != NULL && *l != '\0';) {
    const char *nl = strchr(l, '\n');
    char *line = strndup(l, nl != NULL ? (size_t)(nl - l) : strlen(l));
    cr_assert_not_null(line);
    if (strstr(line, key) != NULL) {
      char *tok[32];
      int n = 0;
      for (char *t = strtok(line, " "); t != NULL && n < 32;
           t = strtok(NULL, " "))
        tok[n++] = t;
      cr_assert_geq(n, 3, "%s", text);
      for (int i = 0; i < 3; i++)
        snprintf(cols[i], 32, "%s", tok[n - 3 + i]);
      free(line);
      return true;
    }
    free(line);
    l = nl != NULL ? nl + 1 : NULL;
  }
  return false;
}

/* `ferryctl jobs` until the job's row shows batches/s "-" (`dash`) or a
 * rate above 0, at most `ms`: the last row in cols, the output in *text
 * (malloc'ed). */
static bool jobs_until(const char *name, bool dash, int ms, char cols[3][32],
                       char **text) {
  const char *args[] = {"jobs", "--dispatcher", D->addr, NULL};
  double until = hx_now_ms() + ms;
  for (;;) {
    ctl_t r = ctl(10000, args);
    cr_assert_eq(r.status, 0, "jobs: %s", r.err);
    bool listed = job_row(r.out, name, cols);
    bool ok = listed && (dash ? strcmp(cols[1], "-") == 0
                              : strcmp(cols[1], "-") != 0 &&
                                    strtod(cols[1], NULL) > 0);
    if (ok || hx_now_ms() > until) {
      *text = strdup(r.out);
      ctl_free(&r);
      return ok;
    }
    ctl_free(&r);
    usleep(100 * 1000);
  }
}

/* The job's block of `ferryctl status` text: from its `job N "NAME"` line
 * to the next job (malloc'ed), or NULL. */
static char *job_block(const char *text, const char *name) {
  char key[64];
  snprintf(key, sizeof(key), "\"%s\"", name);
  const char *at = strstr(text, key);
  if (at == NULL)
    return NULL;
  while (at > text && at[-1] != '\n')
    at--;
  const char *end = strstr(at + 1, "\n  job ");
  return strndup(at, end != NULL ? (size_t)(end - at + 1) : strlen(at));
}

/* A job's figures once it has no live client, in `ferryctl status`, `jobs`
 * and `jobs --json`: the dated line and no current one, "-" for
 * batches/s and wanted, live_clients 0. The dated stall in *stall_pct. */
static void no_live_client_figures(const char *name, double *stall_pct) {
  const char *sargs[] = {"status", "--dispatcher", D->addr, NULL};
  ctl_t r = ctl(10000, sargs);
  cr_assert_eq(r.status, 0, "status: %s", r.err);
  char *block = job_block(r.out, name);
  cr_assert_not_null(block, "job %s not in the status:\n%s", name, r.out);
  fprintf(stderr, "%s", block);
  cr_assert(strstr(block, "    no live client; as of the last report ") !=
                NULL,
            "no dated figures for job %s:\n%s", name, block);
  const char *st = strstr(block, " ago: stall ");
  cr_assert_not_null(st, "%s", block);
  cr_assert_eq(sscanf(st, " ago: stall %lf%%", stall_pct), 1, "%s", block);
  /* No figure shown as current: neither the current line nor a wanted
   * worker count. */
  cr_assert(strstr(block, "\n    stall ") == NULL &&
                strstr(block, "workers wanted") == NULL,
            "job %s shows figures as current:\n%s", name, block);
  free(block);
  ctl_free(&r);

  char cols[3][32], *text = NULL;
  cr_assert(jobs_until(name, true, 0, cols, &text),
            "job %s: batches/s is not '-':\n%s", name, text);
  cr_assert_str_eq(cols[2], "-", "job %s: workers wanted is not '-':\n%s",
                   name, text);
  double table_stall = -1;
  cr_assert_eq(sscanf(cols[0], "%lf%%", &table_stall), 1,
               "job %s: stall column '%s':\n%s", name, cols[0], text);
  cr_assert_float_eq(table_stall, *stall_pct, 0.051, "%s", text);
  free(text);

  const char *jargs[] = {"jobs", "--json", "--dispatcher", D->addr, NULL};
  r = ctl(10000, jargs);
  char anchor[64];
  snprintf(anchor, sizeof(anchor), "\"%s\"", name);
  int64_t live = -1, ago = -1;
  cr_assert(hx_json_int_after(r.out, anchor, "live_clients", &live) &&
                hx_json_int_after(r.out, anchor, "figures_ms_ago", &ago),
            "%s", r.out);
  cr_assert_eq(live, 0, "%s", r.out);
  cr_assert_gt(ago, 0, "%s", r.out);
  ctl_free(&r);
}

/* A trainer's step: 1 ms of work per batch. */
static void step_1ms(uint32_t batches, void *arg) {
  (void)batches;
  (void)arg;
  struct timespec ts = {0, 1000000};
  nanosleep(&ts, NULL);
}

Test(operator, a_finished_job_shows_its_last_figures_dated) {
  hx_dataset_t ds;
  cr_assert_eq(hx_make_dataset(&ds, "f", 2, 400, 16, 16, 3), 0);
  cluster(1, NULL);
  char spec[1024];
  hx_spec(&ds, "dilate(3)", 16, spec, sizeof(spec));
  ferry_client_options_t o;
  hx_client_options(&o, D->addr, spec);
  o.job_name = "ran-to-the-end";
  o.num_epochs = 2;
  ferry_client_t *c = it_new_client(&o);
  for (int e = 0; e < 2; e++) {
    hx_ids_t got = {0};
    ferry_error_t err = {0};
    int rc = hx_collect_epoch(c, &got, NULL, false, NEXT_TIMEOUT_MS,
                              step_1ms, NULL, &err);
    cr_assert_eq(rc, FERRY_EPOCH_END, "epoch %d: %d %s", e, rc, err.msg);
    cr_assert_eq(got.n, 800, "epoch %d: %zu records", e, got.n);
    hx_ids_free(&got);
  }
  /* What the trainer measured over its run; its goodbye reports it. */
  ferry_client_stats_t st;
  ferry_client_stats(c, &st);
  ferry_client_free(c);
  fprintf(stderr, "finished job: the trainer stalled %.1f%% over %.2f s\n",
          st.stall_fraction * 100.0, st.total_seconds);

  const char *jargs[] = {"jobs", "--json", "--dispatcher", D->addr, NULL};
  ctl_t r = ctl(10000, jargs);
  cr_assert(strstr(r.out, "\"state\": \"finished\"") != NULL, "%s", r.out);
  ctl_free(&r);
  double shown = -1;
  no_live_client_figures("ran-to-the-end", &shown);
  /* The whole run's stall as the trainer reported it, not an idle
   * client's last interval (0.0%) nor a guess. */
  cr_assert_float_eq(shown, st.stall_fraction * 100.0, 3.0,
                     "ferryctl shows stall %.1f%%, the trainer measured "
                     "%.1f%%", shown, st.stall_fraction * 100.0);
  hx_dataset_free(&ds);
}

Test(operator, a_killed_clients_figures_are_not_shown_as_current) {
  hx_dataset_t ds;
  cr_assert_eq(hx_make_dataset(&ds, "k", 4, 500, 8, 8, 3), 0);
  cluster(1, NULL);
  char spec[1024], out[600], why[512];
  hx_spec(&ds, NULL, 16, spec, sizeof(spec));
  snprintf(out, sizeof(out), "%s/killed.ids", hx_tmpdir());
  /* Epochs without end, a 2 ms training step: live until killed. */
  char *argv[] = {FERRY_IT_CLIENT_BIN, D->addr, spec, "killed-client", "-1",
                  out, "2000", "-1", NULL};
  hx_proc_t *p;
  cr_assert_eq(hx_spawn_marked(&p, "killed-client", argv, "ready: ", 10000,
                               why, sizeof(why)),
               0, "%s", why);
  /* While it reads, its figures are current: a rate, a worker count. */
  char cols[3][32], *text = NULL;
  bool live = jobs_until("killed-client", false, 10000, cols, &text);
  if (!live)
    hx_dump_logs();
  cr_assert(live, "the client's figures never became current:\n%s", text);
  cr_assert_str_neq(cols[2], "-", "%s", text);
  fprintf(stderr, "killed client, live: stall %s, %s batches/s, wanted "
          "%s\n", cols[0], cols[1], cols[2]);
  free(text);

  hx_stop(p, SIGKILL, 5000, NULL);
  double killed = hx_now_ms();
  /* A client's figures are current for max(2 s, 4 of its heartbeats). */
  bool dated = jobs_until("killed-client", true, 10000, cols, &text);
  cr_assert(dated, "10 s after the kill, the dead client's rate is still "
            "shown as current:\n%s", text);
  fprintf(stderr, "killed client: figures dated %.0f ms after the kill\n",
          hx_now_ms() - killed);
  free(text);
  double shown = -1;
  no_live_client_figures("killed-client", &shown);
  hx_dataset_free(&ds);
}

/* ---- Every worker drained ------------------------------------ */

/* `ferryctl workers --json` until the worker at `addr` is in `state`, at
 * most `ms`. */
static void worker_state_until(const char *addr, const char *want, int ms) {
  const char *args[] = {"workers", "--json", "--dispatcher", D->addr, NULL};
  double until = hx_now_ms() + ms;
  char state[32];
  for (;;) {
    ctl_t r = ctl(10000, args);
    worker_state(r.out, addr, state, sizeof(state));
    bool ok = strcmp(state, want) == 0;
    if (ok || hx_now_ms() > until) {
      cr_assert(ok, "worker %s is '%s', not '%s' after %d ms:\n%s", addr,
                state, want, ms, r.out);
      ctl_free(&r);
      return;
    }
    ctl_free(&r);
    usleep(100 * 1000);
  }
}

#define DRAINED_NEXT_MS 1500

/* Takes what the client still has (bounded), then expects ferry_next to
 * time out within DRAINED_NEXT_MS saying `why`. */
static void next_times_out_saying(ferry_client_t *c, const char *why) {
  double until = hx_now_ms() + 30000;
  int rc;
  ferry_error_t err = {0};
  uint64_t late = 0;
  for (;;) {
    const ferry_batch_t *b = NULL;
    memset(&err, 0, sizeof(err));
    double t0 = hx_now_ms();
    rc = ferry_next(c, &b, DRAINED_NEXT_MS, &err);
    if (rc == 0) {
      ferry_batch_release(c, b);
      late++;
    }
    if (rc == FERRY_ETIMEDOUT) {
      cr_assert_geq(hx_now_ms() - t0, DRAINED_NEXT_MS - 50.0);
      break;
    }
    cr_assert(rc == 0 || rc == FERRY_EPOCH_END, "ferry_next: %d %s", rc,
              err.msg);
    cr_assert_lt(hx_now_ms(), until, "batches kept coming (%llu) with no "
                 "worker serving", (unsigned long long)late);
  }
  fprintf(stderr, "after %llu more batches: %s\n", (unsigned long long)late,
          err.msg);
  char want[256];
  snprintf(want, sizeof(want), "no batch within %d ms: %s", DRAINED_NEXT_MS,
           why);
  cr_assert(strstr(err.msg, want) != NULL, "'%s' does not say '%s'",
            err.msg, want);
}

Test(operator, a_trainer_with_every_worker_drained_is_told_so) {
  hx_dataset_t ds;
  cr_assert_eq(hx_make_dataset(&ds, "w", 8, 500, 8, 8, 3), 0);
  const char *dargs[] = {"--records-per-split", "100", NULL};
  cluster(2, dargs);
  char spec[1024];
  hx_spec(&ds, NULL, 32, spec, sizeof(spec));
  ferry_client_options_t o;
  hx_client_options(&o, D->addr, spec);
  o.job_name = "drained-under-it";
  o.num_epochs = -1;
  ferry_client_t *c = it_new_client(&o);
  const ferry_batch_t *b = NULL;
  ferry_error_t err = {0};
  int rc = ferry_next(c, &b, NEXT_TIMEOUT_MS, &err);
  if (rc != 0)
    hx_dump_logs();
  cr_assert_eq(rc, 0, "the first batch: %d %s", rc, err.msg);
  ferry_batch_release(c, b);

  /* The operator drains both workers while the trainer reads. */
  for (int i = 0; i < 2; i++) {
    const char *dr[] = {"drain", W[i]->addr, "--dispatcher", D->addr,
                        "--timeout", "20", NULL};
    ctl_t r = ctl(30000, dr);
    cr_assert_eq(r.status, 0, "drain %s: exit %d: %s%s", W[i]->addr,
                 r.status, r.out, r.err);
    ctl_free(&r);
  }
  next_times_out_saying(c, "no worker is serving this job: 2 draining, "
                           "0 stopped, 0 lost");

  /* One stops (SIGTERM: it leaves), the other dies (lost after the
   * dispatcher's --worker-timeout-ms, 2 s here). */
  cr_assert_eq(hx_stop(W[0], SIGTERM, 10000, NULL), 0,
               "the drained worker did not exit 0 on SIGTERM");
  worker_state_until(W[0]->addr, "left", 10000);
  next_times_out_saying(c, "no worker is serving this job: 1 draining, "
                           "1 stopped, 0 lost");
  hx_stop(W[1], SIGKILL, 5000, NULL);
  worker_state_until(W[1]->addr, "lost", 10000);
  next_times_out_saying(c, "no worker is serving this job: 0 draining, "
                           "1 stopped, 1 lost");
  ferry_client_free(c);
  hx_dataset_free(&ds);
}
