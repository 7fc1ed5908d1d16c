/* ferry-dispatcher: the control-plane daemon. One libuv loop owns the
 * state machine (state.h); the gRPC layer hands it calls (rpc_*.c),
 * a timer runs timeouts and GC, and SIGTERM/SIGINT shut it down. */
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <uv.h>

#include "alloc.h"
#include "dmetrics.h"
#include "ferry/log.h"
#include "ferry/version.h"
#include "journal.h"
#include "metrics.h"
#include "notify.h"
#include "options.h"
#include "rpc.h"
#include "rpc_commit.h"
#include "rpc_handlers.h"
#include "snapshot.h"
#include "state.h"
#include "workdir.h"

#define TICK_MS 100

typedef struct settings_s {
  int64_t port;
  char *host;
  char *work_dir;
  char *config;
  int64_t worker_timeout_ms;
  int64_t client_timeout_ms;
  int64_t client_stall_ms;
  int64_t client_idle_ms;
  char *data_roots;
  int64_t job_gc_ms;
  int64_t records_per_split;
  int64_t heartbeat_ms;
  int64_t metrics_port; /* -1: no metrics server */
  char *metrics_host;   /* NULL: --host */
  /* gRPC connection lifetimes (ferry_rpc_options_t); 0: never. */
  int64_t idle_connection_ms, connection_age_ms, handshake_timeout_ms;
  double target_stall_fraction;
  int log_level;
  bool journal_recover;
  int64_t snapshot_bytes;
  bool sync_per_call;
  bool help;
  bool version;
  /* TLS and bearer tokens. */
  char *tls_cert, *tls_key, *tls_ca;
  bool tls_client_auth;
  char *worker_token_file, *client_token_file, *status_token_file;
  char *admin_token_file; /* DrainWorker, CancelJob */
} settings_t;

#define OPT(name, type, field, def, lo, hi, choices, help)                    \
  { name, type, offsetof(settings_t, field), def, lo, hi, choices, help }

static const ferry_option_t options[] = {
    OPT("port", FERRY_OPT_INT, port, "5050", 0, 65535, NULL,
        "TCP port to listen on (0: any free port)"),
    OPT("host", FERRY_OPT_STRING, host, "0.0.0.0", 0, 0, NULL,
        "address to bind (0.0.0.0: every interface; 127.0.0.1: this "
        "machine only)"),
    OPT("work-dir", FERRY_OPT_STRING, work_dir, NULL, 0, 0, NULL,
        "directory of the journal (required)"),
    OPT("config", FERRY_OPT_STRING, config, NULL, 0, 0, NULL,
        "config file of 'name = value' lines; flags override it"),
    OPT("worker-timeout-ms", FERRY_OPT_INT, worker_timeout_ms, "10000", 1,
        86400000, NULL, "a worker without heartbeat this long is lost"),
    OPT("data-root", FERRY_OPT_LIST, data_roots, NULL, 0, 0, NULL,
        "a directory datasets may be read from (repeatable; none: any "
        "file)"),
    OPT("client-stall-ms", FERRY_OPT_INT, client_stall_ms, "30000", 0,
        86400000, NULL,
        "a client whose stream has not taken a chunk this long loses its "
        "splits like a dead one (0: never)"),
    OPT("client-idle-ms", FERRY_OPT_INT, client_idle_ms, "5000", 0,
        86400000, NULL,
        "a split whose worker saw no stream of its client this long is "
        "marked unread; the client gives it back to the pool if it took "
        "no record of it, and a client that keeps it unread twice this "
        "long loses its splits as a stalled one (0: never)"),
    OPT("client-timeout-ms", FERRY_OPT_INT, client_timeout_ms, "10000", 1,
        86400000, NULL, "a client without heartbeat this long is lost"),
    OPT("job-gc-ms", FERRY_OPT_INT, job_gc_ms, "60000", 0, 86400000, NULL,
        "drop finished or client-less jobs after this long"),
    OPT("records-per-split", FERRY_OPT_INT, records_per_split, "1024", 1,
        1 << 30, NULL, "default split size in records"),
    OPT("metrics-port", FERRY_OPT_INT, metrics_port, "-1", -1, 65535, NULL,
        "serve Prometheus /metrics, /healthz and /readyz over HTTP on this "
        "port (0: any free port; -1: no metrics server)"),
    OPT("metrics-host", FERRY_OPT_STRING, metrics_host, NULL, 0, 0, NULL,
        "address the metrics server binds (default: --host)"),
    OPT("target-stall-fraction", FERRY_OPT_DOUBLE, target_stall_fraction,
        "0.05", 0, 0.99, NULL,
        "the trainers' stall fraction ferry_job_workers_wanted aims at "
        "(docs/OPERATIONS.md, 'How many workers')"),
    OPT("heartbeat-ms", FERRY_OPT_INT, heartbeat_ms, "1000", 10, 600000, NULL,
        "heartbeat interval told to workers"),
    OPT("idle-connection-ms", FERRY_OPT_INT, idle_connection_ms, "20000", 0,
        86400000, NULL, "close a gRPC connection with no call in flight "
        "for this long (0: never)"),
    OPT("connection-age-ms", FERRY_OPT_INT, connection_age_ms, "3600000", 0,
        2147483647, NULL, "refuse new calls on a gRPC connection this old, "
        "so that its client reconnects; calls in flight, streams too, "
        "run to their end (0: never)"),
    OPT("handshake-timeout-ms", FERRY_OPT_INT, handshake_timeout_ms, "10000",
        100, 600000, NULL, "close a connection whose TLS handshake and "
        "HTTP/2 preface are not done in this long"),
    OPT("tls-cert", FERRY_OPT_STRING, tls_cert, NULL, 0, 0, NULL,
        "PEM certificate chain: serve TLS (re-read when it changes or on "
        "SIGHUP; without it the dispatcher serves plaintext)"),
    OPT("tls-key", FERRY_OPT_STRING, tls_key, NULL, 0, 0, NULL,
        "PEM private key of --tls-cert"),
    OPT("tls-ca", FERRY_OPT_STRING, tls_ca, NULL, 0, 0, NULL,
        "PEM CA bundle that client certificates must chain to"),
    OPT("tls-client-auth", FERRY_OPT_BOOL, tls_client_auth, "false", 0, 0,
        NULL, "require a client certificate signed by --tls-ca (mutual TLS)"),
    OPT("worker-token-file", FERRY_OPT_STRING, worker_token_file, NULL, 0, 0,
        NULL, "file holding the bearer token workers must send (none: any "
        "caller may act as a worker)"),
    OPT("client-token-file", FERRY_OPT_STRING, client_token_file, NULL, 0, 0,
        NULL, "file holding the bearer token clients and ferryctl must send "
        "(none: any caller may act as a client)"),
    OPT("status-token-file", FERRY_OPT_STRING, status_token_file, NULL, 0, 0,
        NULL, "file holding the token that allows GetStatus only (the "
        "worker and client tokens allow it too; none: open)"),
    OPT("admin-token-file", FERRY_OPT_STRING, admin_token_file, NULL, 0, 0,
        NULL, "file holding the operator's token: DrainWorker, CancelJob "
        "(ferryctl drain, job cancel) and GetStatus (none: those two are "
        "open only while no other token file is given, else refused)"),
    OPT("journal-recover", FERRY_OPT_BOOL, journal_recover, "false", 0, 0,
        NULL, "start from a journal with a corrupt entry by truncating it "
        "to the last good entry before the damage (what is dropped is "
        "logged: entries, bytes, offset), or from a snapshot whose journal "
        "is missing, dropping the changes made after it (logged); without "
        "it either refuses to start"),
    OPT("snapshot-bytes", FERRY_OPT_INT, snapshot_bytes, "67108864", 0,
        1125899906842624.0, NULL, "compact: write a snapshot of the state and start "
        "a new journal once the journal exceeds max(this, 2 x the last "
        "snapshot) bytes (0: never)"),
    OPT("journal-sync-per-call", FERRY_OPT_BOOL, sync_per_call, "false", 0,
        0, NULL, "write and fdatasync the journal on the loop thread after "
        "each call instead of group commit (the behaviour before issue "
        "12: a baseline for tests/bench/journal_bench; slower)"),
    OPT("log-level", FERRY_OPT_ENUM, log_level, "info", 0, 0,
        "error|warn|info|debug", "log verbosity"),
    OPT("help", FERRY_OPT_BOOL, help, "false", 0, 0, NULL,
        "print this help"),
    OPT("version", FERRY_OPT_BOOL, version, "false", 0, 0, NULL,
        "print 'ferry-dispatcher VERSION' and exit"),
};
#define N_OPTIONS (sizeof(options) / sizeof(options[0]))

typedef struct daemon_s {
  uv_loop_t loop;
  uv_timer_t tick;
  uv_signal_t sigterm, sigint;
  ferry_rpc_server_t *rpc;
  ferry_disp_t *state;
  ferry_journal_t *journal;
  int lock_fd; /* WORKDIR/lock, held while the process runs */
  uv_signal_t sighup;                  /* reloads TLS files and tokens */
  char *tokens[4];                     /* worker, client, status, admin */
  const settings_t *settings;
  ferry_roots_t roots; /* --data-root */
  ferry_disp_service_t svc;
  ferry_notify_watchdog_t watchdog; /* WATCHDOG=1 from the loop */
  ferry_metrics_http_t *http;       /* --metrics-port */
  ferry__dmetrics_t *metrics;          /* with --metrics-port */
  bool stopping;
  int exit_code;
} daemon_t;

/* Flags, then the config file they name, then the flags again so that
 * they win over the file. */
static int parse_settings(settings_t *s, int argc, char **argv,
                          ferry_error_t *err) {
  int npos = 0, rc;

  if ((rc = ferry__options_defaults(options, N_OPTIONS, s, err)) != 0 ||
      (rc = ferry__options_parse_argv(options, N_OPTIONS, s, argc - 1, argv + 1,
                                      &npos, err)) != 0)
    return rc;
  if (npos > 0)
    return ferry__seterr(err, FERRY_EOPTION, "unexpected argument '%s'",
                         argv[1]);
  if (s->config != NULL && !s->help && !s->version) {
    char path[4096];
    snprintf(path, sizeof(path), "%s", s->config);
    if ((rc = ferry__options_parse_file(options, N_OPTIONS, s, path, err)) ||
        (rc = ferry__options_parse_argv(options, N_OPTIONS, s, argc - 1,
                                        argv + 1, &npos, err)))
      return rc;
  }
  if (!s->help && !s->version &&
      (s->work_dir == NULL || s->work_dir[0] == '\0'))
    return ferry__seterr(err, FERRY_EOPTION, "--work-dir is required");
  return 0;
}

static void close_cb(uv_handle_t *h) {}

static void on_rpc_done(void *arg) {
  FERRY_LOG(FERRY_LOG_INFO, "dispatcher stopped");
}

/* Stops accepting calls and lets the loop run dry: the timer and signal
 * handles close, and the RPC server finishes the calls in flight. */
static void stop(daemon_t *d, int code) {
  if (d->stopping)
    return;
  d->stopping = true;
  d->exit_code = code;
  /* systemd: deactivating from here on (TimeoutStopSec runs). */
  ferry__notify_stopping(code == 0 ? "shutting down" : "stopping on an error");
  uv_close((uv_handle_t *)&d->tick, close_cb);
  uv_close((uv_handle_t *)&d->sigterm, close_cb);
  uv_close((uv_handle_t *)&d->sigint, close_cb);
  uv_close((uv_handle_t *)&d->sighup, close_cb);
  ferry__rpc_health_set_serving(d->rpc, false);
  /* The metrics server goes first: a scrape waiting on this loop returns
   * at once, then its thread is joined. */
  ferry__dmetrics_detach(d->metrics);
  d->metrics = NULL;
  ferry__metrics_http_stop(d->http);
  d->http = NULL;
  /* Held-back heartbeats first: the shutdown waits for every answer. */
  ferry__disp_rpc_stop(&d->svc);
  ferry__rpc_server_shutdown(d->rpc, on_rpc_done, d);
}

static void on_tick(uv_timer_t *t) {
  daemon_t *d = t->data;
  if (d->svc.failed) {
    stop(d, 1);
    return;
  }
  /* After a failed batch the state was rebuilt from disk and its boot
   * entry waits for the first mutating call (rpc_commit.c, rebuild()):
   * until then no lease may be issued under the old boot number, so the
   * timer's timeouts and leasing wait too (the disk is likely still
   * full; reads are answered meanwhile). */
  if (!d->svc.need_boot)
    ferry__disp_tick(d->state, ferry__disp_now_ms());
  ferry__disp_rpc_flush(&d->svc);
}

/* The journal failed inside a handler: stop from the timer, outside it. */
static void on_fatal(const ferry_error_t *err, void *arg) {
  daemon_t *d = arg;
  FERRY_LOG(FERRY_LOG_ERROR, "stopping: %s", err->msg);
  if (!d->stopping)
    uv_timer_start(&d->tick, on_tick, 0, TICK_MS);
}

static void on_signal(uv_signal_t *h, int signum) {
  daemon_t *d = h->data;
  FERRY_LOG(FERRY_LOG_INFO, "%s: shutting down",
            signum == SIGTERM ? "SIGTERM" : "SIGINT");
  stop(d, 0);
}

/* Reads the token files; on a reload a file that cannot be read keeps the
 * token it replaces (logged). */
static int load_tokens(daemon_t *d, const settings_t *s, bool reload,
                       ferry_error_t *err) {
  const char *files[4] = {s->worker_token_file, s->client_token_file,
                          s->status_token_file, s->admin_token_file};
  static const char *const roles[4] = {"worker", "client", "status",
                                       "admin"};
  bool any = false;
  for (int i = 0; i < 4; i++)
    any |= files[i] != NULL && files[i][0] != '\0';
  for (int i = 0; i < 4; i++) {
    char *tok = NULL;
    int rc;
    if (files[i] == NULL || files[i][0] == '\0') {
      if (!reload && i == 3 && any)
        FERRY_LOG(FERRY_LOG_WARN, "no --admin-token-file: DrainWorker and "
                  "CancelJob are refused to every caller");
      else if (!reload)
        FERRY_LOG(FERRY_LOG_WARN, "no --%s-token-file: the %s role is open "
                  "to any caller", roles[i], roles[i]);
      continue;
    }
    if ((rc = ferry__rpc_read_token(files[i], &tok, err)) != 0) {
      if (!reload)
        return ferry__prefixerr(err, "--%s-token-file", roles[i]);
      FERRY_LOG(FERRY_LOG_WARN, "SIGHUP: keeping the %s token: %s", roles[i],
                err->msg);
      continue;
    }
    if (d->tokens[i] != NULL)
      explicit_bzero(d->tokens[i], strlen(d->tokens[i]));
    ferry_free(d->tokens[i]);
    d->tokens[i] = tok;
  }
  d->svc.worker_token = d->tokens[0];
  d->svc.client_token = d->tokens[1];
  d->svc.status_token = d->tokens[2];
  d->svc.admin_token = d->tokens[3];
  return 0;
}

static void on_sighup(uv_signal_t *h, int signum) {
  daemon_t *d = h->data;
  ferry_error_t err = {0};
  (void)signum;
  FERRY_LOG(FERRY_LOG_INFO, "SIGHUP: re-reading the TLS files and tokens");
  ferry__rpc_server_reload_tls(d->rpc);
  load_tokens(d, d->settings, true, &err);
}

/* Creates the state and rebuilds it from the snapshot and the journal. */
static int open_state(daemon_t *d, const settings_t *s, ferry_error_t *err) {
  ferry_disp_config_t cfg;
  ferry_disp_restore_t st;
  int64_t t0;
  int rc;

  ferry__disp_config_init(&cfg);
  cfg.worker_timeout_ms = s->worker_timeout_ms;
  cfg.client_timeout_ms = s->client_timeout_ms;
  cfg.client_stall_ms = s->client_stall_ms;
  cfg.client_idle_ms = s->client_idle_ms;
  if ((rc = ferry__roots_init(&d->roots, s->data_roots, err)) != 0)
    return rc;
  cfg.roots = &d->roots;
  if (ferry__roots_open(&d->roots))
    FERRY_LOG(FERRY_LOG_WARN, "no --data-root: a spec may name any file "
              "this dispatcher can read");
  cfg.job_gc_ms = s->job_gc_ms;
  cfg.records_per_split = (uint32_t)s->records_per_split;
  cfg.heartbeat_ms = (uint32_t)s->heartbeat_ms;
  cfg.target_stall_fraction = s->target_stall_fraction;
  if ((rc = ferry__disp_new(&cfg, ferry__disp_now_ms(), &d->state)) != 0)
    return ferry__seterr(err, rc, "out of memory");
  /* Before the replay: a second dispatcher must not touch the journal. */
  t0 = ferry__disp_now_ms();
  if ((rc = ferry__workdir_lock(s->work_dir, &d->lock_fd, err)) != 0 ||
      (rc = ferry__journal_open(s->work_dir, s->journal_recover,
                                &d->journal, err)) != 0 ||
      (rc = ferry__disp_restore(d->state, d->journal, s->journal_recover,
                                ferry__disp_now_ms(), &st, err)) != 0)
    return rc;
  ferry__disp_set_sink(d->state, ferry__journal_sink, d->journal);
  /* The boot entry keeps this process's lease generations above every
   * earlier one's; it is synced with the first RPC's entries. */
  if ((rc = ferry__disp_boot(d->state, err)) != 0)
    return rc;
  FERRY_LOG(FERRY_LOG_INFO,
            "restored %s in %" PRId64 " ms: snapshot %s (%" PRIu64
            " entries, %" PRIu64 " bytes), journal segment %" PRIu64
            " (%" PRIu64 " entries, %" PRIu64 " bytes)",
            s->work_dir, ferry__disp_now_ms() - t0,
            st.snapshot ? "loaded" : "none", st.snapshot_entries,
            st.snapshot_bytes, st.segment, st.journal_entries,
            st.journal_bytes);
  return 0;
}

/* Starts the RPC server, the timer and the signal handlers. */
static int start(daemon_t *d, const settings_t *s, ferry_error_t *err) {
  char addr[300];
  int port = 0, rc;
  bool v6 = strchr(s->host, ':') != NULL;

  d->svc.state = d->state;
  d->svc.journal = d->journal;
  d->svc.version = FERRY_VERSION_STRING;
  d->svc.fatal = on_fatal;
  d->svc.fatal_arg = d;
  d->svc.compact_bytes = (uint64_t)s->snapshot_bytes;
  d->svc.sync_per_call = s->sync_per_call;
  d->settings = s;
  ferry_rpc_tls_t tls = {s->tls_ca, s->tls_cert, s->tls_key,
                         s->tls_client_auth};
  ferry_rpc_options_t ro = {0};
  ro.tls = s->tls_cert != NULL ? &tls : NULL;
  ro.idle_connection_ms =
      s->idle_connection_ms > 0 ? (int)s->idle_connection_ms : -1;
  ro.max_connection_age_ms =
      s->connection_age_ms > 0 ? (int)s->connection_age_ms : -1;
  ro.handshake_timeout_ms = (int)s->handshake_timeout_ms;
  if (s->tls_cert == NULL && (s->tls_key != NULL || s->tls_client_auth))
    return ferry__seterr(err, FERRY_EOPTION,
                         "--tls-key and --tls-client-auth need --tls-cert");
  if ((rc = load_tokens(d, s, false, err)) != 0)
    return rc;
  if ((rc = ferry__rpc_server_new(&d->loop, &ro, &d->rpc, err)) != 0)
    return rc;
  snprintf(addr, sizeof(addr), v6 ? "[%s]:%" PRId64 : "%s:%" PRId64, s->host,
           s->port);
  if ((rc = ferry__disp_rpc_register(&d->svc, d->rpc, err)) != 0 ||
      (rc = ferry__rpc_server_start(d->rpc, addr, &port, err)) != 0)
    return rc;
  /* The metrics server, once the gRPC port listens: /readyz answers 200
   * from the start, since the journal is loaded by now. On a failure the
   * caller shuts the RPC server down and the loop runs out. */
  const char *mhost = s->metrics_host != NULL && s->metrics_host[0] != '\0'
                          ? s->metrics_host
                          : s->host;
  int mport = 0;
  if (s->metrics_port >= 0) {
    ferry__metrics_count_rpcs(true);
    if ((d->metrics = ferry__dmetrics_attach(&d->loop, d->state,
                                             d->journal)) == NULL)
      return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
    if ((rc = ferry__metrics_http_start(ferry__metrics_default(), mhost,
                                        (int)s->metrics_port, &d->http, &mport,
                                        err)) != 0) {
      ferry__dmetrics_detach(d->metrics);
      d->metrics = NULL;
      return ferry__prefixerr(err, "--metrics-port");
    }
    ferry__metrics_http_set_ready(d->http, true);
    d->svc.metrics.fsync = d->metrics->fsync;
    d->svc.metrics.write_failures = d->metrics->write_failures;
    d->svc.metrics.snapshots = d->metrics->snapshots;
  }
  if ((rc = ferry__disp_rpc_start(&d->svc, &d->loop)) != 0)
    return ferry__seterr(err, FERRY_EIO, "uv_timer_init: %s",
                         uv_strerror(rc));
  uv_timer_init(&d->loop, &d->tick);
  uv_signal_init(&d->loop, &d->sigterm);
  uv_signal_init(&d->loop, &d->sigint);
  d->tick.data = d->sigterm.data = d->sigint.data = d;
  uv_timer_start(&d->tick, on_tick, TICK_MS, TICK_MS);
  uv_signal_start(&d->sigterm, on_signal, SIGTERM);
  uv_signal_start(&d->sigint, on_signal, SIGINT);
  uv_signal_init(&d->loop, &d->sighup);
  d->sighup.data = d;
  uv_signal_start(&d->sighup, on_sighup, SIGHUP);
  FERRY_LOG(FERRY_LOG_INFO, "bound to %s:%d (--host %s), %s", s->host, port,
            s->host,
            s->tls_cert == NULL    ? "plaintext gRPC"
            : s->tls_client_auth ? "TLS, client certificates required"
                                 : "TLS");
  if (s->tls_cert == NULL && !ferry__rpc_host_is_loopback(s->host))
    FERRY_LOG(FERRY_LOG_WARN,
              "*** PLAINTEXT on %s:%d: anyone on the network can read and "
              "forge this dispatcher's traffic; use --tls-cert/--tls-key "
              "(docs/SECURITY.md) or --host 127.0.0.1 ***", s->host, port);
  printf(v6 ? "ferry-dispatcher listening on [%s]:%d\n"
            : "ferry-dispatcher listening on %s:%d\n",
         s->host, port);
  fflush(stdout);
  if (d->http != NULL) {
    /* The metrics server is plain HTTP whatever --tls-cert says, and
     * binds --host unless told otherwise. */
    if (!ferry__rpc_host_is_loopback(mhost))
      FERRY_LOG(FERRY_LOG_WARN,
                "*** PLAIN HTTP metrics on %s:%d (--metrics-host %s): "
                "anyone who reaches it reads job names and can open "
                "connections to it; use --metrics-host 127.0.0.1 or a "
                "private interface's address ***", mhost, mport, mhost);
    printf(strchr(mhost, ':') != NULL
               ? "ferry-dispatcher metrics on http://[%s]:%d/metrics\n"
               : "ferry-dispatcher metrics on http://%s:%d/metrics\n",
           mhost, mport);
    fflush(stdout);
  }
  /* systemd Type=notify: the port accepts connections from here on. */
  ferry__notify_ready("serving on %s:%d, journal %s", s->host, port,
                      s->work_dir);
  ferry__notify_watchdog_start(&d->watchdog, &d->loop);
  return 0;
}

static void on_failed_start(void *arg) {}

int main(int argc, char **argv) {
  static daemon_t d;
  settings_t s;
  ferry_error_t err = {0};
  int rc;

  signal(SIGPIPE, SIG_IGN);
  ferry_log_set_callback(ferry_log_to_stderr, NULL);
  memset(&s, 0, sizeof(s));
  if ((rc = parse_settings(&s, argc, argv, &err)) != 0) {
    fprintf(stderr, "ferry-dispatcher: %s\n(--help lists the options)\n",
            err.msg);
    ferry__options_free(options, N_OPTIONS, &s);
    return 2;
  }
  if (s.version) {
    printf("ferry-dispatcher %s\n", FERRY_VERSION_STRING);
    ferry__options_free(options, N_OPTIONS, &s);
    return 0;
  }
  if (s.help) {
    printf("usage: ferry-dispatcher --work-dir DIR [options]\n");
    ferry__options_help(options, N_OPTIONS, stdout);
    ferry__options_free(options, N_OPTIONS, &s);
    return 0;
  }
  ferry_log_set_level(s.log_level);
  ferry__journal_test_env();
  ferry__rpc_tune_malloc();
  ferry__rpc_init();
  uv_loop_init(&d.loop);
  d.lock_fd = -1;
  if ((rc = open_state(&d, &s, &err)) != 0 ||
      (rc = start(&d, &s, &err)) != 0) {
    FERRY_LOG(FERRY_LOG_ERROR, "%s", err.msg);
    d.exit_code = 1;
    if (d.rpc != NULL)
      ferry__rpc_server_shutdown(d.rpc, on_failed_start, NULL);
  }
  uv_run(&d.loop, UV_RUN_DEFAULT);
  /* The watchdog timer does not hold the loop: close it, then let the
   * loop finish the close. */
  ferry__notify_watchdog_stop(&d.watchdog);
  uv_run(&d.loop, UV_RUN_DEFAULT);
  ferry__journal_close(d.journal);
  ferry__workdir_unlock(d.lock_fd);
  ferry__disp_free(d.state);
  for (int i = 0; i < 4; i++)
    ferry_free(d.tokens[i]);
  ferry__roots_close(&d.roots);
  uv_loop_close(&d.loop);
  ferry__rpc_shutdown();
  ferry__options_free(options, N_OPTIONS, &s);
  return d.exit_code;
}
