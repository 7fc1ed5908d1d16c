/* ferry-worker: the CPU data-plane daemon. Options, start-up, exit. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "alloc.h"
#include "ferry/log.h"
#include "ferry/version.h"
#include "hostport.h"
#include "metrics.h"
#include "notify.h"
#include "options.h"
#include "wmetrics.h"
#include "worker.h"

static const ferry_option_t table[] = {
    {"dispatcher", FERRY_OPT_STRING, offsetof(ferry__wconfig_t, dispatcher),
     NULL, 0, 0, NULL, "dispatcher address HOST:PORT; required"},
    {"port", FERRY_OPT_INT, offsetof(ferry__wconfig_t, port), "0", 0, 65535,
     NULL, "port of the Worker service (0: any free port)"},
    {"host", FERRY_OPT_STRING, offsetof(ferry__wconfig_t, host), "0.0.0.0",
     0, 0, NULL,
     "address to bind (0.0.0.0: every interface; 127.0.0.1: this machine "
     "only)"},
    {"advertise", FERRY_OPT_STRING, offsetof(ferry__wconfig_t, advertise),
     NULL, 0, 0, NULL,
     "HOST:PORT (or HOST, with the bound port) the dispatcher gives to "
     "clients (default: --host, or this machine's host name for 0.0.0.0)"},
    {"threads", FERRY_OPT_INT, offsetof(ferry__wconfig_t, threads), "0", 0,
     4096, NULL, "pipeline threads (0: one per core)"},
    {"buffer-bytes", FERRY_OPT_SIZE, offsetof(ferry__wconfig_t, buffer_bytes),
     "256M", 1 << 20, 1ull << 40, NULL,
     "bound of the chunk buffers waiting to be sent (backpressure)"},
    {"jpeg-max-pixels", FERRY_OPT_INT,
     offsetof(ferry__wconfig_t, jpeg_max_pixels), "67108864", 0,
     4294967296.0, NULL,
     "refuse a JPEG record whose header claims more pixels (width x "
     "height) than this, before decoding it: a bad record under on_error "
     "(0: no limit; TensorFlow's 2^29 samples still apply)"},
    {"jpeg-max-scans", FERRY_OPT_INT,
     offsetof(ferry__wconfig_t, jpeg_max_scans), "100", 0, 65535, NULL,
     "refuse a JPEG record with more scans (SOS markers) than this: each "
     "progressive scan passes over the whole image (0: no limit)"},
    {"decode-bytes", FERRY_OPT_SIZE, offsetof(ferry__wconfig_t, decode_bytes),
     "0", 0, 1ull << 40, NULL,
     "memory the pipeline threads may use to decode images, together; "
     "each thread refuses a JPEG whose decode needs more than this / "
     "--threads (0: --buffer-bytes)"},
    {"heartbeat-ms", FERRY_OPT_INT, offsetof(ferry__wconfig_t, heartbeat_ms),
     "1000", 10, 600000, NULL,
     "heartbeat interval until the dispatcher says otherwise"},
    {"chunk-bytes", FERRY_OPT_SIZE, offsetof(ferry__wconfig_t, chunk_bytes),
     "2M", 1, 64 << 20, NULL, "target payload size of one chunk"},
    {"spill-dir", FERRY_OPT_STRING, offsetof(ferry__wconfig_t, spill_dir),
     NULL, 0, 0, NULL,
     "directory of the unlinked files shuffled GZIP/ZLIB shards are inflated "
     "into (default: $TMPDIR, else /tmp)"},
    {"cache-dir", FERRY_OPT_STRING, offsetof(ferry__wconfig_t, cache_dir),
     NULL, 0, 0, NULL,
     "directory of the prefix cache: from its second epoch a job reads the "
     "output of its pipeline's deterministic prefix from here when that "
     "costs less than recomputing it (may be shared by workers; none: no "
     "cache)"},
    {"cache-bytes", FERRY_OPT_SIZE, offsetof(ferry__wconfig_t, cache_bytes),
     "10G", 0, 1ull << 50, NULL,
     "bound of the prefix cache's entries on disk (full: the splits beyond "
     "it recompute)"},
    {"share-bytes", FERRY_OPT_SIZE, offsetof(ferry__wconfig_t, share_bytes),
     "512M", 0, 1ull << 44, NULL,
     "window of shared production: what this worker produced for jobs that "
     "share (a sweep's trainers) and keeps for the others; a job behind "
     "it gets what it missed produced again for it alone (0: no sharing)"},
    {"data-root", FERRY_OPT_LIST, offsetof(ferry__wconfig_t, data_roots),
     NULL, 0, 0, NULL,
     "a directory datasets may be read from (repeatable; none: any file)"},
    {"tls-cert", FERRY_OPT_STRING, offsetof(ferry__wconfig_t, tls_cert), NULL,
     0, 0, NULL,
     "PEM certificate chain: serve TLS (re-read when it changes or on "
     "SIGHUP); also this worker's client certificate to the dispatcher"},
    {"tls-key", FERRY_OPT_STRING, offsetof(ferry__wconfig_t, tls_key), NULL, 0,
     0, NULL, "PEM private key of --tls-cert"},
    {"tls-ca", FERRY_OPT_STRING, offsetof(ferry__wconfig_t, tls_ca), NULL, 0,
     0, NULL,
     "PEM CA bundle: talk TLS to the dispatcher and verify it (and client "
     "certificates with --tls-client-auth)"},
    {"tls-client-auth", FERRY_OPT_BOOL,
     offsetof(ferry__wconfig_t, tls_client_auth), "false", 0, 0, NULL,
     "require client certificates signed by --tls-ca (mutual TLS)"},
    {"worker-token-file", FERRY_OPT_STRING,
     offsetof(ferry__wconfig_t, worker_token_file), NULL, 0, 0, NULL,
     "file holding the bearer token sent to the dispatcher"},
    {"client-token-file", FERRY_OPT_STRING,
     offsetof(ferry__wconfig_t, client_token_file), NULL, 0, 0, NULL,
     "file holding the bearer token StreamChunks callers must send (none: "
     "open; the per-client secret is checked either way)"},
    {"config", FERRY_OPT_STRING, offsetof(ferry__wconfig_t, config), NULL, 0,
     0, NULL, "config file of 'name = value' lines (flags override it)"},
    {"log-level", FERRY_OPT_ENUM, offsetof(ferry__wconfig_t, log_level),
     "info", 0, 0, "error|warn|info|debug", "log verbosity"},
    {"help", FERRY_OPT_BOOL, offsetof(ferry__wconfig_t, help), "false", 0, 0,
     NULL, "print this help"},
    {"metrics-port", FERRY_OPT_INT, offsetof(ferry__wconfig_t, metrics_port),
     "-1", -1, 65535, NULL,
     "serve Prometheus /metrics, /healthz and /readyz over HTTP on this port "
     "(0: any free port; -1: no metrics server)"},
    {"metrics-host", FERRY_OPT_STRING,
     offsetof(ferry__wconfig_t, metrics_host), NULL, 0, 0, NULL,
     "address the metrics server binds (default: --host)"},
    {"idle-connection-ms", FERRY_OPT_INT,
     offsetof(ferry__wconfig_t, idle_connection_ms), "20000", 0, 86400000,
     NULL, "close a gRPC connection with no call in flight for this long "
     "(0: never)"},
    {"connection-age-ms", FERRY_OPT_INT,
     offsetof(ferry__wconfig_t, connection_age_ms), "3600000", 0,
     2147483647, NULL, "refuse new calls on a gRPC connection this old, so "
     "that its client reconnects; calls in flight, streams too, run to "
     "their end (0: never)"},
    {"handshake-timeout-ms", FERRY_OPT_INT,
     offsetof(ferry__wconfig_t, handshake_timeout_ms), "10000", 100, 600000,
     NULL, "close a connection whose TLS handshake and HTTP/2 preface are "
     "not done in this long"},
    {"test-record-delay-ms", FERRY_OPT_INT,
     offsetof(ferry__wconfig_t, test_record_delay_ms), "0", 0, 60000, NULL,
     "TESTS ONLY: sleep this long before processing each record (a slow "
     "producer, as heavy decodes make one; 0: none)"},
    {"version", FERRY_OPT_BOOL, offsetof(ferry__wconfig_t, version), "false",
     0, 0, NULL, "print 'ferry-worker VERSION' and exit"},
};
#define N_OPTS (sizeof(table) / sizeof(table[0]))

static bool worker_ready(void *arg) {
  ferry__worker_t *w = arg;
  return atomic_load(&w->worker_id) != 0 && !atomic_load(&w->draining);
}

static const char usage[] =
    "usage: ferry-worker --dispatcher HOST:PORT [options]\n"
    "\n"
    "Runs the splits the dispatcher leases to it through the pipeline and\n"
    "streams the chunks to the clients (Worker/StreamChunks). Prints\n"
    "'ferry-worker listening on HOST:PORT' once bound. SIGTERM drains.\n"
    "\n";

/* Flags, then the config file they name, then the flags again so that
 * they win over the file. */
static int parse(ferry__wconfig_t *cfg, int argc, char **argv,
                 ferry_error_t *err) {
  int npos = 0, rc;
  rc = ferry__options_defaults(table, N_OPTS, cfg, err);
  if (rc == 0)
    rc = ferry__options_parse_argv(table, N_OPTS, cfg, argc - 1, argv + 1,
                                   &npos, err);
  if (rc == 0 && npos > 0)
    rc = ferry__seterr(err, FERRY_EOPTION, "unexpected argument '%s'",
                       argv[1]);
  /* --version and --help answer without reading the config file (as the
   * dispatcher does): a missing file must not hide the version. */
  if (rc == 0 && cfg->config != NULL && cfg->config[0] != '\0' &&
      !cfg->version && !cfg->help) {
    char *path = cfg->config;
    cfg->config = NULL;
    ferry__options_free(table, N_OPTS, cfg);
    rc = ferry__options_defaults(table, N_OPTS, cfg, err);
    if (rc == 0)
      rc = ferry__options_parse_file(table, N_OPTS, cfg, path, err);
    ferry__free(path);
    /* argv was reordered by the first pass: only options remain in it. */
    if (rc == 0)
      rc = ferry__options_parse_argv(table, N_OPTS, cfg, argc - 1, argv + 1,
                                     &npos, err);
  }
  return rc;
}

/* Refuses a malformed --dispatcher or --advertise at start (usage, exit
 * 2) instead of dialing port 0 or advertising an address no client can
 * dial. A bare IPv6 --advertise (no brackets, no port) stays accepted:
 * the worker brackets it itself. */
static int check_addresses(const ferry__wconfig_t *cfg) {
  ferry_error_t err = {0};
  char v6[FERRY_HOST_MAX + 3];
  if (ferry__hostport_parse(cfg->dispatcher, 0, NULL, 0, NULL, &err) != 0) {
    fprintf(stderr, "ferry-worker: --dispatcher: %s\n", err.msg);
    return -1;
  }
  const char *adv = cfg->advertise;
  if (adv == NULL || adv[0] == '\0')
    return 0;
  const char *colon = strchr(adv, ':');
  if (adv[0] != '[' && colon != NULL && strchr(colon + 1, ':') != NULL &&
      strlen(adv) <= FERRY_HOST_MAX) {
    snprintf(v6, sizeof(v6), "[%s]", adv);
    adv = v6;
  }
  if (ferry__hostport_parse(adv, FERRY_HOSTPORT_PORT_OPTIONAL, NULL, 0, NULL,
                            &err) != 0) {
    fprintf(stderr, "ferry-worker: --advertise: %s\n", err.msg);
    return -1;
  }
  return 0;
}

int main(int argc, char **argv) {
  ferry__wconfig_t cfg;
  ferry_error_t err;
  uv_loop_t loop;
  ferry__worker_t w;

  memset(&cfg, 0, sizeof(cfg));
  ferry_log_set_callback(ferry_log_to_stderr, NULL);
  if (parse(&cfg, argc, argv, &err) != 0) {
    fprintf(stderr, "ferry-worker: %s\n", err.msg);
    ferry__options_free(table, N_OPTS, &cfg);
    return 2;
  }
  if (cfg.version) {
    printf("ferry-worker %s\n", FERRY_VERSION_STRING);
    ferry__options_free(table, N_OPTS, &cfg);
    return 0;
  }
  if (cfg.help) {
    fputs(usage, stdout);
    ferry__options_help(table, N_OPTS, stdout);
    ferry__options_free(table, N_OPTS, &cfg);
    return 0;
  }
  if (cfg.dispatcher == NULL || cfg.dispatcher[0] == '\0') {
    fprintf(stderr, "ferry-worker: --dispatcher HOST:PORT is required\n");
    ferry__options_free(table, N_OPTS, &cfg);
    return 2;
  }
  if (check_addresses(&cfg) != 0) {
    ferry__options_free(table, N_OPTS, &cfg);
    return 2;
  }
  ferry_log_set_level(cfg.log_level);
  ferry__rpc_tune_malloc();
  signal(SIGPIPE, SIG_IGN);
  /* SIGHUP forces a TLS reload (worker.c); until its handler is installed
   * it must not kill. */
  signal(SIGHUP, SIG_IGN);
  ferry__rpc_init();
  uv_loop_init(&loop);
  ferry_notify_watchdog_t watchdog = {0};
  ferry_metrics_http_t *http = NULL;
  bool attached = false;

  int rc = ferry__worker_start(&w, &cfg, &loop, true, &err);
  if (rc == 0) {
    /* Logged before the listening line, which tools wait for. */
    if (cfg.tls_cert == NULL && !ferry__rpc_host_is_loopback(cfg.host))
      FERRY_LOG(FERRY_LOG_WARN,
                "*** PLAINTEXT on %s:%d: anyone on the network can read "
                "this worker's streams; use --tls-cert/--tls-key "
                "(docs/SECURITY.md) or --host 127.0.0.1 ***", cfg.host,
                w.port);
    FERRY_LOG(FERRY_LOG_INFO,
              "bound to %s:%d (--host), %s; advertising %s to "
              "the dispatcher and clients (%s)",
              cfg.host, w.port,
              cfg.tls_cert == NULL ? "plaintext gRPC"
              : cfg.tls_client_auth ? "TLS, client certificates required"
                                    : "TLS",
              w.address,
              cfg.advertise != NULL && cfg.advertise[0] != '\0'
                  ? "--advertise"
                  : "no --advertise: the bind host, or this machine's name "
                    "for a wildcard");
    printf("ferry-worker listening on %s:%d\n", cfg.host, w.port);
    fflush(stdout);
    if (cfg.metrics_port >= 0) {
      const char *mh = cfg.metrics_host != NULL && cfg.metrics_host[0]
                           ? cfg.metrics_host
                           : cfg.host;
      int mport = 0;
      attached = ferry__wmetrics_attach(&w) == 0;
      ferry__metrics_count_rpcs(true);
      if (ferry__metrics_http_start(ferry__metrics_default(), mh,
                                    (int)cfg.metrics_port, &http, &mport,
                                    &err) != 0) {
        fprintf(stderr, "ferry-worker: --metrics-port: %s\n", err.msg);
        rc = err.code;
        ferry__worker_request_stop(&w);
      } else {
        /* /readyz: 200 once the dispatcher registered this worker and
         * while it does not drain. */
        ferry__metrics_http_set_ready_fn(http, worker_ready, &w);
        /* Plain HTTP whatever --tls-cert says, on --host by default. */
        if (!ferry__rpc_host_is_loopback(mh))
          FERRY_LOG(FERRY_LOG_WARN,
                    "*** PLAIN HTTP metrics on %s:%d (--metrics-host %s): "
                    "anyone who reaches it reads job names and can open "
                    "connections to it; use --metrics-host 127.0.0.1 or a "
                    "private interface's address ***", mh, mport, mh);
        printf(strchr(mh, ':') != NULL
                   ? "ferry-worker metrics on http://[%s]:%d/metrics\n"
                   : "ferry-worker metrics on http://%s:%d/metrics\n",
               mh, mport);
        fflush(stdout);
      }
    }
    /* systemd Type=notify: ready once the port accepts connections, not
     * once the dispatcher answered (docs/OPERATIONS.md, "systemd"). */
    ferry__notify_ready("serving on %s, registering with %s", w.address,
                        cfg.dispatcher);
    ferry__notify_watchdog_start(&watchdog, &loop);
    FERRY_LOG(FERRY_LOG_INFO, "worker %s: %zu threads, buffer %llu bytes, "
              "dispatcher %s", w.address, w.tasks.nthreads,
              (unsigned long long)cfg.buffer_bytes, cfg.dispatcher);
  } else {
    fprintf(stderr, "ferry-worker: %s\n", err.msg);
  }
  uv_run(&loop, UV_RUN_DEFAULT);
  /* The collector reads the pool and the task table: gone before them. */
  ferry__metrics_http_stop(http);
  if (attached)
    ferry__wmetrics_detach(&w);
  /* The watchdog timer does not hold the loop: close it, then let the
   * loop finish the close. */
  ferry__notify_watchdog_stop(&watchdog);
  uv_run(&loop, UV_RUN_DEFAULT);
  if (!ferry__worker_close(&w, 700)) {
    /* A heartbeat is stuck on an unresponsive dispatcher: everything
     * else is down, so leave without waiting for it. */
    FERRY_LOG(FERRY_LOG_WARN, "heartbeat still in flight; exiting anyway");
    fflush(stdout);
    _exit(rc == 0 ? 0 : 1);
  }
  uv_loop_close(&loop);
  ferry__rpc_shutdown();
  ferry__options_free(table, N_OPTS, &cfg);
  return rc == 0 ? 0 : 1;
}
