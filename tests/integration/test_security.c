/* TLS on every channel, credentials per role
 * and per-client secrets, with real daemons.
 *
 * Certificates and tokens are made at test time by make_certs.sh (openssl;
 * the tests skip, saying so, when it is absent). The secured cluster runs
 * mutual TLS everywhere (client and ferryctl to the dispatcher, client to
 * workers, workers to the dispatcher) and bearer tokens per role. */
#include <criterion/criterion.h>
#include <criterion/hooks.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "alloc.h"
#include "ferry/v1/dispatcher.pb-c.h"
#include "ferry/v1/worker.pb-c.h"
#include "harness.h"
#include "rpc.h"
#include "rpc_methods.h"

#define NEXT_TIMEOUT_MS 10000
#define REFUSE_MS 2000

static hx_proc_t *D;
static hx_proc_t *W[2];

static void reset(void) {
  D = NULL;
  memset(W, 0, sizeof(W));
  ferry__rpc_init();
}

static void cleanup(void) { ferry__rpc_shutdown(); }

HX_SUITE(security, 120, reset, cleanup);

/* DIR/NAME of the certificate directory (static rotating buffers). */
static const char *C(const char *name) { return hx_cert(name); }

static void make_certs(void) {
  int st = hx_make_certs(FERRY_IT_CERTS_SCRIPT);
  if (st == 77)
    cr_skip_test("openssl is not installed: no certificates to test with");
  cr_assert_eq(st, 0, "make_certs.sh failed (status %d)", st);
}

/* The dispatcher's flags of the secured cluster. */
/* The flags both daemons take: TLS with `cert`/`key` and client
 * certificates required, and the worker and client tokens. Returns how
 * many were written into f. */
static int tls_token_flags(const char **f, const char *cert,
                           const char *key) {
  int n = 0;
  f[n++] = "--tls-cert";
  f[n++] = C(cert);
  f[n++] = "--tls-key";
  f[n++] = C(key);
  f[n++] = "--tls-ca";
  f[n++] = C("ca.pem");
  f[n++] = "--tls-client-auth";
  f[n++] = "--worker-token-file";
  f[n++] = C("worker.token");
  f[n++] = "--client-token-file";
  f[n++] = C("client.token");
  return n;
}

static const char *const *dispatcher_flags(const char *cert, const char *key) {
  static const char *f[32];
  int n = tls_token_flags(f, cert, key);
  f[n++] = "--status-token-file";
  f[n++] = C("status.token");
  f[n] = NULL;
  return f;
}

static const char *const *worker_flags(void) {
  static const char *f[32];
  int n = tls_token_flags(f, "server.pem", "server.key");
  f[n] = NULL;
  return f;
}

/* A channel with the client certificate (when `ca`) and `token_file`'s
 * token (when not NULL). */
static ferry_rpc_channel_t *channel(const char *addr, const char *ca,
                                    const char *cert, const char *key,
                                    const char *token_file) {
  ferry_rpc_tls_t tls = {ca, cert, key, false};
  ferry_rpc_options_t ro = {0};
  ferry_rpc_channel_t *ch = NULL;
  ferry_error_t err = {0};
  char *token = NULL;
  ro.tls = ca != NULL ? &tls : NULL;
  if (token_file != NULL)
    cr_assert_eq(ferry__rpc_read_token(token_file, &token, &err), 0, "%s",
                 err.msg);
  ro.bearer_token = token;
  cr_assert_eq(ferry__rpc_channel_new(addr, &ro, &ch, &err), 0, "%s", err.msg);
  ferry_free(token);
  return ch;
}

/* GetStatus on `ch`; returns its result (0 or FERRY_EGRPC_*). */
static int get_status(ferry_rpc_channel_t *ch, int *workers, char *msg,
                      size_t cap) {
  uint8_t *reply = NULL;
  size_t len = 0;
  ferry_error_t err = {0};
  int rc = ferry__rpc_unary(ch, FERRY_METHOD_GET_STATUS, "", 0, REFUSE_MS,
                            FERRY_RPC_WAIT_FOR_READY, &reply, &len, &err);
  if (msg != NULL)
    snprintf(msg, cap, "%s", err.msg);
  if (rc == 0 && workers != NULL) {
    Ferry__V1__GetStatusResponse *s =
        ferry__v1__get_status_response__unpack(NULL, len, reply);
    cr_assert_not_null(s);
    *workers = 0;
    for (size_t i = 0; i < s->n_workers; i++)
      *workers += strcmp(s->workers[i]->state, "alive") == 0;
    ferry__v1__get_status_response__free_unpacked(s, NULL);
  }
  ferry_free(reply);
  return rc;
}

/* Polls GetStatus (bounded: 10 s) until `n` workers are alive; returns
 * how many were. */
static int wait_alive(ferry_rpc_channel_t *ch, int n) {
  int alive = 0;
  double until = hx_now_ms() + 10000;
  while (hx_now_ms() < until) {
    if (get_status(ch, &alive, NULL, 0) == 0 && alive == n)
      break;
    usleep(50000); /* polling a condition, bounded by `until` */
  }
  return alive;
}

/* A secured dispatcher and `n` secured workers, all registered. */
static void secure_cluster(int n) {
  char why[512];
  hx_daemon_opts_t d = {0};
  d.extra_argv = dispatcher_flags("server.pem", "server.key");
  cr_assert_eq(hx_start_dispatcher(&D, &d, why, sizeof(why)), 0, "%s", why);
  hx_daemon_opts_t w = {0};
  w.extra_argv = worker_flags();
  for (int i = 0; i < n; i++)
    cr_assert_eq(hx_start_worker(&W[i], D->addr, &w, why, sizeof(why)), 0,
                 "%s", why);
  ferry_rpc_channel_t *ch = channel(D->addr, C("ca.pem"), C("client.pem"),
                                    C("client.key"), C("status.token"));
  int alive = wait_alive(ch, n);
  ferry__rpc_channel_free(ch);
  if (alive != n)
    hx_dump_logs();
  cr_assert_eq(alive, n, "%d of %d TLS workers registered within 10 s",
               alive, n);
}

static void make_small(hx_dataset_t *ds) {
  cr_assert_eq(hx_make_dataset(ds, "data", 4, 300, 8, 8, 3), 0,
               "cannot write the dataset");
}

/* Client options of the secured cluster. */
static void secure_options(ferry_client_options_t *o, const char *spec) {
  hx_client_options(o, D->addr, spec);
  o->tls_ca = C("ca.pem");
  o->tls_cert = C("client.pem");
  o->tls_key = C("client.key");
  o->token_file = C("client.token");
}

/* ferry_client_new must fail; returns its message (static). */
static const char *refused(const ferry_client_options_t *o, const char *what) {
  static char msg[512];
  ferry_client_t *c = NULL;
  ferry_error_t err = {0};
  double t0 = hx_now_ms();
  int rc = ferry_client_new(o, &c, &err);
  if (rc == 0)
    ferry_client_free(c);
  cr_assert_neq(rc, 0, "%s: ferry_client_new succeeded", what);
  cr_assert(err.msg[0] != '\0', "%s: no error message", what);
  cr_assert_lt(hx_now_ms() - t0, 15000.0, "%s: took too long", what);
  snprintf(msg, sizeof(msg), "%s", err.msg);
  fprintf(stderr, "refused as expected, %s: %s\n", what, msg);
  return msg;
}

/* ---- mutual TLS + tokens: exactly once --------------------------------- */

Test(security, mutual_tls_and_tokens_deliver_exactly_once) {
  make_certs();
  hx_dataset_t ds;
  make_small(&ds);
  secure_cluster(2);
  /* SIGHUP reloads certificates (and the dispatcher's tokens): the
   * daemons must go on serving. */
  cr_assert_eq(kill(D->pid, SIGHUP), 0);
  cr_assert_eq(kill(W[0]->pid, SIGHUP), 0);
  char spec[1024];
  hx_spec(&ds, NULL, 32, spec, sizeof(spec));
  ferry_client_options_t o;
  secure_options(&o, spec);
  o.num_epochs = 1;
  ferry_client_t *c = NULL;
  ferry_error_t err = {0};
  int rc = ferry_client_new(&o, &c, &err);
  if (rc != 0)
    hx_dump_logs();
  cr_assert_eq(rc, 0, "ferry_client_new over mutual TLS: %s", err.msg);
  hx_ids_t got = {0};
  rc = hx_collect_epoch(c, &got, &ds, true, NEXT_TIMEOUT_MS, NULL, NULL, &err);
  if (rc != FERRY_EPOCH_END)
    hx_dump_logs();
  cr_assert_eq(rc, FERRY_EPOCH_END, "ferry_next: %d (%s) after %zu records",
               rc, err.msg, got.n);
  size_t n;
  uint64_t *expected = hx_expected_ids(&ds, false, &n);
  char why[256];
  cr_assert(hx_same_multiset(got.ids, got.n, expected, n, why, sizeof(why)),
            "%s", why);
  cr_assert(!got.bad_pixels, "record %#llx has wrong pixels",
            (unsigned long long)got.bad_pixel_id);
  free(expected);
  hx_ids_free(&got);
  ferry_client_free(c);

  /* ferryctl status with the status token over mutual TLS, and without
   * the token. */
  char cmd[4096];
  snprintf(cmd, sizeof(cmd),
           "%s status --dispatcher %s --tls-ca %s --tls-cert %s --tls-key %s "
           "--token-file %s >/dev/null 2>&1", hx_ferryctl_bin(), D->addr,
           C("ca.pem"), C("client.pem"), C("client.key"), C("status.token"));
  cr_assert_eq(system(cmd), 0, "ferryctl status with the status token");
  snprintf(cmd, sizeof(cmd),
           "%s status --dispatcher %s --tls-ca %s --tls-cert %s --tls-key %s "
           ">/dev/null 2>&1", hx_ferryctl_bin(), D->addr, C("ca.pem"),
           C("client.pem"), C("client.key"));
  cr_assert_neq(system(cmd), 0, "ferryctl status without a token succeeded");
  hx_dataset_free(&ds);
}

/* ---- TLS without client certificates --------------------------------- */

/* A dispatcher with a certificate and no --tls-ca requests no client
 * certificate: it must start and serve TLS (gRPC's reloading credentials
 * refuse a config without roots by aborting the process). */
Test(security, tls_without_a_ca_serves) {
  make_certs();
  char why[512];
  const char *df[] = {"--tls-cert", C("server.pem"), "--tls-key",
                      C("server.key"), NULL};
  hx_daemon_opts_t d = {0};
  d.extra_argv = df;
  cr_assert_eq(hx_start_dispatcher(&D, &d, why, sizeof(why)), 0, "%s", why);
  /* The worker needs the CA to check the dispatcher it dials: without it
   * it refuses to start, saying so. */
  char cmd[4096], out[2048] = "";
  snprintf(cmd, sizeof(cmd),
           "%s --dispatcher %s --host 127.0.0.1 --port 0 --tls-cert %s "
           "--tls-key %s 2>&1", hx_worker_bin(), D->addr, C("server.pem"),
           C("server.key"));
  FILE *p = popen(cmd, "r");
  cr_assert_not_null(p);
  size_t got = fread(out, 1, sizeof(out) - 1, p);
  out[got] = '\0';
  int st = pclose(p);
  cr_assert(WIFEXITED(st) && WEXITSTATUS(st) != 0,
            "a TLS worker without --tls-ca started (status %#x)", st);
  cr_assert(strstr(out, "--tls-cert needs --tls-ca") != NULL,
            "the refusal does not name --tls-ca: %s", out);

  const char *wf[] = {"--tls-cert", C("server.pem"), "--tls-key",
                      C("server.key"), "--tls-ca", C("ca.pem"), NULL};
  hx_daemon_opts_t w = {0};
  w.extra_argv = wf;
  cr_assert_eq(hx_start_worker(&W[0], D->addr, &w, why, sizeof(why)), 0,
               "%s", why);
  ferry_rpc_channel_t *ch = channel(D->addr, C("ca.pem"), NULL, NULL, NULL);
  int alive = wait_alive(ch, 1);
  ferry__rpc_channel_free(ch);
  if (alive != 1)
    hx_dump_logs();
  cr_assert_eq(alive, 1, "the TLS worker without a CA registered within "
               "10 s (alive: %d)", alive);
  cr_assert_eq(kill(D->pid, 0), 0, "the dispatcher is gone");
}

/* ---- a certificate that does not name the advertised address ---------- */

/* The unreachable worker's reason, from GetStatus over TLS ("" when no
 * client reports one). */
static int unreachable_reason(ferry_rpc_channel_t *ch, const char *addr,
                              char *out, size_t cap) {
  uint8_t *reply = NULL;
  size_t len = 0;
  ferry_error_t err = {0};
  int n = 0;
  out[0] = '\0';
  if (ferry__rpc_unary(ch, FERRY_METHOD_GET_STATUS, "", 0, REFUSE_MS,
                       FERRY_RPC_WAIT_FOR_READY, &reply, &len, &err) != 0)
    return 0;
  Ferry__V1__GetStatusResponse *st =
      ferry__v1__get_status_response__unpack(NULL, len, reply);
  cr_assert_not_null(st);
  for (size_t i = 0; i < st->n_workers; i++)
    if (strcmp(st->workers[i]->address, addr) == 0 &&
        st->workers[i]->unreachable_clients > 0) {
      n = (int)st->workers[i]->unreachable_clients;
      snprintf(out, cap, "%s", st->workers[i]->unreachable_reason);
    }
  ferry__v1__get_status_response__free_unpacked(st, NULL);
  ferry_free(reply);
  return n;
}

/* What GetStatus says of the worker at `addr`: its state, tasks and
 * heartbeat's age (for a job it took no part in), into `out`; returns
 * that age in ms (-1: unknown). */
static int64_t worker_state(ferry_rpc_channel_t *ch, const char *addr,
                            char *out, size_t cap) {
  uint8_t *reply = NULL;
  size_t len = 0;
  ferry_error_t err = {0};
  snprintf(out, cap, "not in GetStatus");
  if (ferry__rpc_unary(ch, FERRY_METHOD_GET_STATUS, "", 0, REFUSE_MS,
                       FERRY_RPC_WAIT_FOR_READY, &reply, &len, &err) != 0) {
    snprintf(out, cap, "GetStatus failed: %.200s", err.msg);
    return -1;
  }
  int64_t age = -1;
  Ferry__V1__GetStatusResponse *st =
      ferry__v1__get_status_response__unpack(NULL, len, reply);
  cr_assert_not_null(st);
  for (size_t i = 0; i < st->n_workers; i++)
    if (strcmp(st->workers[i]->address, addr) == 0) {
      age = st->workers[i]->last_heartbeat_ms_ago;
      snprintf(out, cap, "%.40s, %u tasks, last heartbeat %lld ms ago",
               st->workers[i]->state, st->workers[i]->tasks,
               (long long)age);
    }
  ferry__v1__get_status_response__free_unpacked(st, NULL);
  ferry_free(reply);
  return age;
}

/* After each batch: what GetStatus says of the bad worker, kept once
 * seen (a client drops its report when its splits no longer use the
 * worker, so it is looked for while the epoch runs). */
typedef struct seen_s {
  ferry_rpc_channel_t *ch;
  const char *addr;
  int reporters;
  char reason[512];
} seen_t;

static void look_for_report(uint32_t batches, void *arg) {
  seen_t *s = arg;
  (void)batches;
  if (s->reporters == 0)
    s->reporters = unreachable_reason(s->ch, s->addr, s->reason,
                                      sizeof(s->reason));
}

/* A worker serving TLS at 127.0.0.2 with a certificate that names only
 * 127.0.0.1 heartbeats fine (its own channel checks the dispatcher's
 * certificate, not its own), but no trainer can check it: the trainer
 * reports it, the epoch ends exactly once on the other worker, and the
 * dispatcher shows the worker as unreachable with gRPC's reason. */
Test(security, a_certificate_not_naming_the_worker_is_reported) {
  make_certs();
  hx_dataset_t ds;
  make_small(&ds);
  char why[512];
  /* 24 splits: the bad worker surely gets some of them. */
  const char *df[40];
  const char *const *base = dispatcher_flags("server.pem", "server.key");
  int nf = 0;
  while (base[nf] != NULL)
    df[nf] = base[nf], nf++;
  df[nf++] = "--records-per-split";
  df[nf++] = "50";
  df[nf] = NULL;
  hx_daemon_opts_t d = {0};
  d.extra_argv = df;
  cr_assert_eq(hx_start_dispatcher(&D, &d, why, sizeof(why)), 0, "%s", why);
  hx_daemon_opts_t w = {0};
  w.extra_argv = worker_flags();
  cr_assert_eq(hx_start_worker(&W[0], D->addr, &w, why, sizeof(why)), 0,
               "%s", why);
  w.host = "127.0.0.2";
  cr_assert_eq(hx_start_worker(&W[1], D->addr, &w, why, sizeof(why)), 0,
               "%s", why);
  ferry_rpc_channel_t *ch = channel(D->addr, C("ca.pem"), C("client.pem"),
                                    C("client.key"), C("status.token"));
  int alive = wait_alive(ch, 2);
  cr_assert_eq(alive, 2, "%d of 2 TLS workers registered within 10 s",
               alive);

  char spec[1024];
  hx_spec(&ds, NULL, 32, spec, sizeof(spec));
  ferry_client_options_t o;
  secure_options(&o, spec);
  o.num_epochs = 1;
  o.transport = "grpc"; /* TLS: UCX does not encrypt */
  /* The bad worker takes half the splits when it is eligible as the job
   * begins. A client reports it after its second failed stream to it (one
   * may be a worker dying); after the first, the dispatcher moves the
   * rows away and suspects the worker until its next heartbeat, and an
   * epoch this small (30 ms) may end on the other worker before that
   * heartbeat, with one failure and nothing to report. Such a job says
   * nothing either way: another one runs, at most 8 in all, each once
   * the bad worker heartbeated after the last one ended (so that it is
   * no longer suspected and takes splits again). */
  seen_t seen = {.ch = ch, .addr = W[1]->addr};
  bool warned = false;
  char state[256];
  double ended = hx_now_ms() - 200; /* the first job: a beat in 200 ms */
  for (int attempt = 1; attempt <= 8; attempt++) {
    /* At most 10 s of waiting for that heartbeat. */
    double until = hx_now_ms() + 10000;
    int64_t age;
    while (((age = worker_state(ch, W[1]->addr, state, sizeof(state))) < 0 ||
            (double)age >= hx_now_ms() - ended) &&
           hx_now_ms() < until)
      usleep(20000); /* polling a condition, bounded by `until` */
    ferry_client_t *c = NULL;
    ferry_error_t err = {0};
    cr_assert_eq(ferry_client_new(&o, &c, &err), 0, "%s", err.msg);
    hx_ids_t got = {0};
    double t0 = hx_now_ms();
    int rc = hx_collect_epoch(c, &got, &ds, true, NEXT_TIMEOUT_MS,
                              look_for_report, &seen, &err);
    if (rc != FERRY_EPOCH_END)
      hx_dump_logs();
    cr_assert_eq(rc, FERRY_EPOCH_END, "ferry_next: %d (%s) after %zu records",
                 rc, err.msg, got.n);
    size_t n;
    uint64_t *expected = hx_expected_ids(&ds, false, &n);
    cr_assert(hx_same_multiset(got.ids, got.n, expected, n, why, sizeof(why)),
              "%s", why);
    free(expected);
    hx_ids_free(&got);
    ferry_client_free(c);
    ended = hx_now_ms();
    fprintf(stderr, "certificate not naming %s, job %d: epoch of %zu records "
            "in %.0f ms; unreachable by %d client(s): %s\n", W[1]->addr,
            attempt, n, hx_now_ms() - t0, seen.reporters, seen.reason);
    /* The dispatcher's warning names the address, what to check and the
     * reason; GetStatus showed it while the epoch ran. */
    char line[2048];
    FILE *log = fopen(D->log, "r");
    cr_assert_not_null(log, "%s", D->log);
    while (!warned && fgets(line, sizeof(line), log) != NULL)
      warned = strstr(line, W[1]->addr) != NULL &&
               strstr(line, "cannot reach") != NULL &&
               strstr(line, "TLS certificate") != NULL;
    fclose(log);
    if (warned || seen.reporters > 0)
      break;
    worker_state(ch, W[1]->addr, state, sizeof(state));
    fprintf(stderr, "  no report and no warning of %s after job %d (at "
            "most one failed stream to it; now: %s)\n", W[1]->addr, attempt,
            state);
  }
  cr_assert(warned, "no dispatcher warning names %s", W[1]->addr);
  cr_assert_eq(seen.reporters, 1, "the worker whose certificate does not "
               "name %s was not shown unreachable during the epoch",
               W[1]->addr);
  cr_assert(strstr(seen.reason, "certificate") != NULL ||
                strstr(seen.reason, "handshake") != NULL ||
                strstr(seen.reason, "SSL") != NULL,
            "the reason does not point at TLS: %s", seen.reason);
  ferry__rpc_channel_free(ch);
  hx_dataset_free(&ds);
}

/* ---- refusals ------------------------------------------------------------ */

Test(security, strangers_are_refused) {
  make_certs();
  hx_dataset_t ds;
  make_small(&ds);
  secure_cluster(1);
  char spec[1024];
  hx_spec(&ds, NULL, 32, spec, sizeof(spec));
  ferry_client_options_t o;
  const char *msg;

  secure_options(&o, spec);
  o.connect_timeout_ms = REFUSE_MS;
  o.tls_ca = o.tls_cert = o.tls_key = NULL;
  refused(&o, "plaintext client to a TLS dispatcher");

  secure_options(&o, spec);
  o.connect_timeout_ms = REFUSE_MS;
  o.tls_ca = C("other-ca.pem");
  refused(&o, "client trusting another CA");

  secure_options(&o, spec);
  o.connect_timeout_ms = REFUSE_MS;
  o.tls_cert = C("other-client.pem");
  o.tls_key = C("other-client.key");
  refused(&o, "client certificate from another CA");

  secure_options(&o, spec);
  o.connect_timeout_ms = REFUSE_MS;
  o.tls_cert = o.tls_key = NULL;
  refused(&o, "no client certificate under mutual TLS");

  secure_options(&o, spec);
  o.connect_timeout_ms = REFUSE_MS;
  o.token_file = NULL;
  msg = refused(&o, "no token");
  cr_assert(strstr(msg, "bearer token") != NULL, "%s", msg);
  cr_assert(strstr(msg, "client.token") == NULL, "names the file: %s", msg);

  secure_options(&o, spec);
  o.connect_timeout_ms = REFUSE_MS;
  o.token_file = C("wrong.token");
  msg = refused(&o, "wrong token");
  cr_assert(strstr(msg, "bearer token") != NULL, "%s", msg);

  secure_options(&o, spec);
  o.connect_timeout_ms = REFUSE_MS;
  o.token_file = C("status.token");
  msg = refused(&o, "the status token used as a client");
  cr_assert(strstr(msg, "does not allow") != NULL, "%s", msg);

  /* GetStatus: the status token or a stronger one; nothing else. */
  static const struct {
    const char *token;
    int rc;
  } st[] = {{"status.token", 0},
            {"client.token", 0},
            {"worker.token", 0},
            {"wrong.token", FERRY_EGRPC_UNAUTHENTICATED},
            {NULL, FERRY_EGRPC_UNAUTHENTICATED}};
  for (size_t i = 0; i < sizeof(st) / sizeof(st[0]); i++) {
    ferry_rpc_channel_t *ch =
        channel(D->addr, C("ca.pem"), C("client.pem"), C("client.key"),
                st[i].token != NULL ? C(st[i].token) : NULL);
    char m[600];
    int rc = get_status(ch, NULL, m, sizeof(m));
    cr_expect_eq(rc, st[i].rc, "GetStatus with %s: %d (%s)",
                 st[i].token ? st[i].token : "no token", rc, m);
    ferry__rpc_channel_free(ch);
  }
  /* The worker role with the client token. */
  {
    ferry_rpc_channel_t *ch = channel(D->addr, C("ca.pem"), C("client.pem"),
                                      C("client.key"), C("client.token"));
    Ferry__V1__WorkerHeartbeatRequest req =
        FERRY__V1__WORKER_HEARTBEAT_REQUEST__INIT;
    req.address = "10.9.9.9:1";
    uint8_t buf[64], *reply = NULL;
    size_t len = ferry__v1__worker_heartbeat_request__pack(&req, buf), rlen;
    ferry_error_t err = {0};
    int rc = ferry__rpc_unary(ch, FERRY_METHOD_WORKER_HEARTBEAT, buf, len,
                              REFUSE_MS, 0, &reply, &rlen, &err);
    ferry_free(reply);
    cr_expect_eq(rc, FERRY_EGRPC_PERMISSION_DENIED,
                 "a client forging a WorkerHeartbeat: %d (%s)", rc, err.msg);
    ferry__rpc_channel_free(ch);
  }

  /* An expired server certificate is refused by a client that trusts its
   * CA. */
  char why[512];
  hx_proc_t *old = D;
  hx_daemon_opts_t d = {0};
  d.extra_argv = dispatcher_flags("expired.pem", "expired.key");
  cr_assert_eq(hx_start_dispatcher(&D, &d, why, sizeof(why)), 0, "%s", why);
  secure_options(&o, spec);
  o.connect_timeout_ms = REFUSE_MS;
  refused(&o, "dispatcher with an expired certificate");
  D = old;

  /* The real cluster still serves its clients. */
  secure_options(&o, spec);
  ferry_client_t *c = NULL;
  ferry_error_t err = {0};
  cr_assert_eq(ferry_client_new(&o, &c, &err), 0, "%s", err.msg);
  hx_ids_t got = {0};
  cr_assert_eq(hx_collect_epoch(c, &got, &ds, true, NEXT_TIMEOUT_MS, NULL,
                                NULL, &err),
               FERRY_EPOCH_END, "%s", err.msg);
  size_t n;
  uint64_t *expected = hx_expected_ids(&ds, false, &n);
  cr_assert(hx_same_multiset(got.ids, got.n, expected, n, why, sizeof(why)),
            "%s", why);
  free(expected);
  hx_ids_free(&got);
  ferry_client_free(c);
  hx_dataset_free(&ds);
}

/* ---- a client may only touch its own job and stream its own splits ----- */

struct victim {
  hx_ids_t got;
  uint32_t pause_at; /* batches: the attack happens here */
  volatile int paused;
};

static void victim_batch(uint32_t batches, void *arg) {
  struct victim *v = arg;
  if (batches == v->pause_at) {
    v->paused = 1;
  }
}

Test(security, stolen_stream_and_forged_heartbeat_get_nothing) {
  make_certs();
  hx_dataset_t ds;
  cr_assert_eq(hx_make_dataset(&ds, "data", 4, 400, 8, 8, 3), 0);
  secure_cluster(1);
  char spec[1024];
  hx_spec(&ds, NULL, 16, spec, sizeof(spec));
  ferry_client_options_t o;
  secure_options(&o, spec);
  o.prefetch = 2;
  o.splits_in_flight = 1;
  ferry_client_t *c = NULL;
  ferry_error_t err = {0};
  cr_assert_eq(ferry_client_new(&o, &c, &err), 0, "%s", err.msg);
  uint64_t job = ferry_client_job_id(c), client = ferry_client_id(c);

  /* Let the victim take a few batches so its worker has its stream. */
  struct victim v = {0};
  const ferry_batch_t *b = NULL;
  for (int i = 0; i < 3; i++) {
    cr_assert_eq(ferry_next(c, &b, NEXT_TIMEOUT_MS, &err), 0, "%s", err.msg);
    for (uint32_t k = 0; k < b->size; k++) {
      if (v.got.n == v.got.cap) {
        v.got.cap = v.got.cap ? v.got.cap * 2 : 1024;
        v.got.ids = realloc(v.got.ids, v.got.cap * sizeof(uint64_t));
      }
      v.got.ids[v.got.n++] = b->ids[k];
    }
    ferry_batch_release(c, b);
  }

  /* An attacker with valid client credentials (TLS and token) but not
   * the victim's secret: a stream with the victim's ids gets nothing. */
  ferry_rpc_channel_t *wch = channel(W[0]->addr, C("ca.pem"), C("client.pem"),
                                     C("client.key"), C("client.token"));
  static const uint8_t forged[FERRY_CLIENT_SECRET_BYTES] = {1, 2, 3};
  for (int attempt = 0; attempt < 2; attempt++) {
    Ferry__V1__StreamChunksRequest sq = FERRY__V1__STREAM_CHUNKS_REQUEST__INIT;
    sq.job_id = job;
    sq.client_id = client;
    if (attempt == 1) {
      sq.client_secret.data = (uint8_t *)forged;
      sq.client_secret.len = sizeof(forged);
    }
    uint8_t buf[64];
    size_t len = ferry__v1__stream_chunks_request__pack(&sq, buf);
    ferry_rpc_stream_t *st = NULL;
    cr_assert_eq(ferry__rpc_stream_open(wch, FERRY_METHOD_STREAM_CHUNKS, buf,
                                        len, 0, 0, &st, &err),
                 0, "%s", err.msg);
    ferry_rpc_msg_t msg;
    int rc = ferry__rpc_stream_next(st, &msg, 1500, &err);
    if (rc == 0)
      ferry__rpc_msg_release(&msg);
    cr_assert_neq(rc, 0, "a stolen stream (%s secret) received a chunk",
                  attempt ? "forged" : "no");
    cr_expect(rc == FERRY_EGRPC_PERMISSION_DENIED || rc == FERRY_ETIMEDOUT ||
                  rc == FERRY_EGRPC_UNAVAILABLE,
              "stolen stream: %d (%s)", rc, err.msg);
    ferry__rpc_stream_free(st);
  }
  ferry__rpc_channel_free(wch);
  /* Without the client token the worker refuses the call outright. */
  {
    ferry_rpc_channel_t *nt = channel(W[0]->addr, C("ca.pem"), C("client.pem"),
                                      C("client.key"), NULL);
    Ferry__V1__StreamChunksRequest sq = FERRY__V1__STREAM_CHUNKS_REQUEST__INIT;
    sq.job_id = job;
    sq.client_id = client;
    uint8_t buf[64];
    size_t len = ferry__v1__stream_chunks_request__pack(&sq, buf);
    ferry_rpc_stream_t *st = NULL;
    cr_assert_eq(ferry__rpc_stream_open(nt, FERRY_METHOD_STREAM_CHUNKS, buf,
                                        len, 0, 0, &st, &err),
                 0, "%s", err.msg);
    ferry_rpc_msg_t msg;
    int rc = ferry__rpc_stream_next(st, &msg, 5000, &err);
    if (rc == 0)
      ferry__rpc_msg_release(&msg);
    cr_assert_eq(rc, FERRY_EGRPC_UNAUTHENTICATED,
                 "StreamChunks without the client token: %d (%s)", rc,
                 err.msg);
    ferry__rpc_stream_free(st);
    ferry__rpc_channel_free(nt);
  }

  /* A forged ClientHeartbeat (the victim's ids, claims of progress, no or
   * a wrong secret) is refused. */
  ferry_rpc_channel_t *dch = channel(D->addr, C("ca.pem"), C("client.pem"),
                                     C("client.key"), C("client.token"));
  for (int attempt = 0; attempt < 2; attempt++) {
    Ferry__V1__ClientHeartbeatRequest hq =
        FERRY__V1__CLIENT_HEARTBEAT_REQUEST__INIT;
    Ferry__V1__SplitProgress p = FERRY__V1__SPLIT_PROGRESS__INIT, *pp = &p;
    p.split = 0;
    p.delivered = 400;
    hq.job_id = job;
    hq.client_id = client;
    hq.progress = &pp;
    hq.n_progress = 1;
    hq.leaving = true;
    if (attempt == 1) {
      hq.client_secret.data = (uint8_t *)forged;
      hq.client_secret.len = sizeof(forged);
    }
    uint8_t buf[128], *reply = NULL;
    size_t len = ferry__v1__client_heartbeat_request__pack(&hq, buf), rlen;
    int rc = ferry__rpc_unary(dch, FERRY_METHOD_CLIENT_HEARTBEAT, buf, len,
                              REFUSE_MS, 0, &reply, &rlen, &err);
    ferry_free(reply);
    cr_assert_eq(rc, FERRY_EGRPC_PERMISSION_DENIED,
                 "forged ClientHeartbeat (%s secret): %d (%s)",
                 attempt ? "wrong" : "no", rc, err.msg);
    cr_assert(strstr(err.msg, "secret") != NULL, "%s", err.msg);
  }
  ferry__rpc_channel_free(dch);

  /* The victim still gets its epoch exactly once. */
  hx_ids_t rest = {0};
  int rc = hx_collect_epoch(c, &rest, NULL, false, NEXT_TIMEOUT_MS,
                            victim_batch, &v, &err);
  if (rc != FERRY_EPOCH_END)
    hx_dump_logs();
  cr_assert_eq(rc, FERRY_EPOCH_END, "victim: %d (%s)", rc, err.msg);
  for (size_t i = 0; i < rest.n; i++) {
    if (v.got.n == v.got.cap) {
      v.got.cap = v.got.cap ? v.got.cap * 2 : 1024;
      v.got.ids = realloc(v.got.ids, v.got.cap * sizeof(uint64_t));
    }
    v.got.ids[v.got.n++] = rest.ids[i];
  }
  size_t n;
  uint64_t *expected = hx_expected_ids(&ds, false, &n);
  char why[256];
  cr_assert(hx_same_multiset(v.got.ids, v.got.n, expected, n, why,
                             sizeof(why)),
            "victim's epoch: %s", why);
  free(expected);
  hx_ids_free(&rest);
  free(v.got.ids);
  ferry_client_free(c);
  hx_dataset_free(&ds);
}

/* ---- certificate reload without a restart -------------------------------- */

static void copy_file(const char *from, const char *to) {
  char tmp[800], cmd[2000];
  snprintf(tmp, sizeof(tmp), "%s.new", to);
  snprintf(cmd, sizeof(cmd), "cp '%s' '%s' && mv '%s' '%s'", from, tmp, tmp,
           to);
  cr_assert_eq(system(cmd), 0, "%s", cmd);
}

Test(security, certificate_files_are_reloaded_when_they_change) {
  make_certs();
  /* The dispatcher starts with a certificate of another CA in the files
   * it serves from. */
  copy_file(C("other-server.pem"), C("live.pem"));
  copy_file(C("other-server.key"), C("live.key"));
  char why[512];
  hx_daemon_opts_t d = {0};
  d.extra_argv = dispatcher_flags("live.pem", "live.key");
  cr_assert_eq(hx_start_dispatcher(&D, &d, why, sizeof(why)), 0, "%s", why);
  ferry_rpc_channel_t *ch = channel(D->addr, C("ca.pem"), C("client.pem"),
                                    C("client.key"), C("status.token"));
  char m[600];
  cr_assert_neq(get_status(ch, NULL, m, sizeof(m)), 0,
                "a certificate of another CA was accepted");
  ferry__rpc_channel_free(ch);
  /* A stream... a channel opened before the change keeps working: use a
   * plain long-lived status channel trusting the other CA. */
  ferry_rpc_channel_t *before = channel(D->addr, C("other-ca.pem"),
                                        C("client.pem"), C("client.key"),
                                        C("status.token"));
  cr_assert_eq(get_status(before, NULL, m, sizeof(m)), 0, "%s", m);
  copy_file(C("server.pem"), C("live.pem"));
  copy_file(C("server.key"), C("live.key"));
  ch = channel(D->addr, C("ca.pem"), C("client.pem"), C("client.key"),
               C("status.token"));
  cr_assert_eq(get_status(ch, NULL, m, sizeof(m)), 0,
               "the new certificate was not served: %s", m);
  ferry__rpc_channel_free(ch);
  /* The connection made before the change was not dropped. */
  cr_assert_eq(get_status(before, NULL, m, sizeof(m)), 0,
               "the old connection broke: %s", m);
  ferry__rpc_channel_free(before);
}

/* The first job's error as GetStatus shows it to `token_file`'s holder. */
static void job_error(const char *token_file, char *out, size_t cap) {
  ferry_rpc_channel_t *ch = channel(D->addr, C("ca.pem"), C("client.pem"),
                                    C("client.key"), C(token_file));
  uint8_t *reply = NULL;
  size_t len = 0;
  ferry_error_t err = {0};
  cr_assert_eq(ferry__rpc_unary(ch, FERRY_METHOD_GET_STATUS, "", 0, REFUSE_MS,
                                FERRY_RPC_WAIT_FOR_READY, &reply, &len, &err),
               0, "%s", err.msg);
  Ferry__V1__GetStatusResponse *s =
      ferry__v1__get_status_response__unpack(NULL, len, reply);
  cr_assert(s != NULL && s->n_jobs > 0);
  snprintf(out, cap, "%s", s->jobs[0]->error);
  ferry__v1__get_status_response__free_unpacked(s, NULL);
  ferry_free(reply);
  ferry__rpc_channel_free(ch);
}

/* A job's error names its files: GetStatus shows it to the status
 * credential only; a caller with the client (or worker) token sees that
 * there is one, not its text (the job's own clients get it through their
 * heartbeats). */
Test(security, job_errors_are_shown_to_the_status_credential_only) {
  make_certs();
  hx_dataset_t ds;
  make_small(&ds);
  secure_cluster(1);
  cr_assert_eq(hx_corrupt_record(&ds, 0, 5), 0);
  char spec[1024];
  hx_spec(&ds, NULL, 32, spec, sizeof(spec));
  ferry_client_options_t o;
  secure_options(&o, spec);
  o.num_epochs = 1;
  ferry_client_t *c = NULL;
  ferry_error_t err = {0};
  cr_assert_eq(ferry_client_new(&o, &c, &err), 0, "%s", err.msg);
  const ferry_batch_t *b;
  int rc;
  while ((rc = ferry_next(c, &b, 10000, &err)) == 0)
    ferry_batch_release(c, b);
  cr_assert_eq(rc, FERRY_EDATACRC, "%d: %s", rc, err.msg);
  cr_assert(strstr(err.msg, "data-000") != NULL,
            "the job's client gets the whole error: %s", err.msg);
  ferry_client_free(c);
  /* The client may learn the error from its stream (the worker's error
   * chunk) before the dispatcher hears of it from the worker's next
   * heartbeat: wait for the job to be failed there, bounded. */
  char seen[600];
  double until = hx_now_ms() + 5000;
  do {
    job_error("status.token", seen, sizeof(seen));
    if (strstr(seen, "data-000") != NULL)
      break;
    usleep(20000); /* polling a condition, bounded by `until` */
  } while (hx_now_ms() < until);
  cr_assert(strstr(seen, "data-000") != NULL, "status: %s", seen);
  job_error("client.token", seen, sizeof(seen));
  cr_assert(strstr(seen, "data-000") == NULL && strstr(seen, "hidden"),
            "client token: %s", seen);
  job_error("worker.token", seen, sizeof(seen));
  cr_assert(strstr(seen, "data-000") == NULL, "worker token: %s", seen);
  hx_dataset_free(&ds);
}
