/* The worker's life cycle on its loop: start-up (pool, task table, RPC
 * server, pipeline threads, heartbeat thread, signals) and the drain on
 * SIGTERM/SIGINT or request. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "alloc.h"
#include "ferry/log.h"
#include "notify.h"
#include "worker.h"

static void on_signal(uv_signal_t *h, int signum) {
  ferry__worker_t *w = h->data;
  if (w->stopping) {
    FERRY_LOG(FERRY_LOG_WARN, "%s again while draining",
              signum == SIGINT ? "SIGINT" : "SIGTERM");
    return;
  }
  FERRY_LOG(FERRY_LOG_INFO, "%s: draining",
            signum == SIGINT ? "SIGINT" : "SIGTERM");
  ferry__worker_shutdown(w);
}

/* The address clients should dial: --advertise (HOST:PORT as given, or
 * HOST with the bound port), else --host unless it is a wildcard, else
 * this machine's name (gethostname), with the bound port. A bare IPv6
 * address gets its brackets. */
static void make_address(ferry__worker_t *w) {
  const ferry__wconfig_t *cfg = &w->cfg;
  char host[256];
  const char *h = cfg->advertise, *colon;
  if (h == NULL || h[0] == '\0') {
    h = cfg->host;
    if (h == NULL || h[0] == '\0' || strcmp(h, "0.0.0.0") == 0 ||
        strcmp(h, "::") == 0 || strcmp(h, "[::]") == 0) {
      if (gethostname(host, sizeof(host)) != 0)
        snprintf(host, sizeof(host), "localhost");
      host[sizeof(host) - 1] = '\0';
      h = host;
    }
  }
  colon = strchr(h, ':');
  if (h[0] == '[' ? strstr(h, "]:") != NULL
                  : colon != NULL && strchr(colon + 1, ':') == NULL)
    snprintf(w->address, sizeof(w->address), "%s", h); /* has its port */
  else if (colon != NULL && h[0] != '[')
    snprintf(w->address, sizeof(w->address), "[%s]:%d", h, w->port);
  else
    snprintf(w->address, sizeof(w->address), "%s:%d", h, w->port);
}

static void on_closed(uv_handle_t *h) { (void)h; }

/* Re-read the TLS files at the next connection even if they
 * look unchanged (they are also re-read whenever they change). */
static void on_sighup(uv_signal_t *h, int signum) {
  ferry__worker_t *w = h->data;
  (void)signum;
  FERRY_LOG(FERRY_LOG_INFO, "SIGHUP: re-reading the TLS files");
  if (w->server != NULL)
    ferry__rpc_server_reload_tls(w->server);
}

static void on_server_done(void *arg) {
  ferry__worker_t *w = arg;
  w->server = NULL;
  w->server_done = true;
  pthread_mutex_lock(&w->inbox_lock);
  w->inbox_closed = true;
  ferry__wchunk_t *c = w->inbox_head;
  w->inbox_head = w->inbox_tail = NULL;
  pthread_mutex_unlock(&w->inbox_lock);
  while (c != NULL) {
    ferry__wchunk_t *next = c->next;
    ferry__wpool_release(c);
    c = next;
  }
  ferry__wstream_close_all(w);
  if (w->async_on) {
    uv_close((uv_handle_t *)&w->inbox_async, on_closed);
    w->async_on = false;
  }
  if (w->signals_on) {
    uv_close((uv_handle_t *)&w->sigterm, on_closed);
    uv_close((uv_handle_t *)&w->sigint, on_closed);
    uv_close((uv_handle_t *)&w->sighup, on_closed);
    w->signals_on = false;
  }
  FERRY_LOG(FERRY_LOG_INFO, "worker stopped");
}

void ferry__worker_shutdown(ferry__worker_t *w) {
  if (w->stopping)
    return;
  w->stopping = true;
  /* systemd: deactivating from here on (TimeoutStopSec covers the drain). */
  ferry__notify_stopping("draining");
  atomic_store(&w->draining, true);
  ferry__wtasks_drain(&w->tasks);
  if (atomic_load(&w->hb_started))
    ferry__whb_quit(w);
  ferry__wtasks_stop(&w->tasks);
  if (w->server != NULL) {
    ferry__rpc_health_set_serving(w->server, false);
    ferry__wstream_close_all(w);
    ferry__rpc_server_shutdown(w->server, on_server_done, w);
  } else {
    on_server_done(w);
  }
}

void ferry__worker_request_stop(ferry__worker_t *w) {
  pthread_mutex_lock(&w->inbox_lock);
  if (!w->inbox_closed) {
    w->inbox_stop = true;
    uv_async_send(&w->inbox_async);
  }
  pthread_mutex_unlock(&w->inbox_lock);
}

int ferry__worker_start(ferry__worker_t *w, const ferry__wconfig_t *cfg,
                        uv_loop_t *loop, bool signals, ferry_error_t *err) {
  static const char *const services[] = {"ferry.v1.Worker"};
  char addr[300];
  int rc;
  memset(w, 0, sizeof(*w));
  w->cfg = *cfg;
  w->loop = loop;
  atomic_init(&w->draining, false);
  atomic_init(&w->worker_id, 0);
  atomic_init(&w->heartbeat_ms, (int)cfg->heartbeat_ms);
  atomic_init(&w->heartbeats_ok, 0);
  pthread_mutex_init(&w->inbox_lock, NULL);
  pthread_mutex_init(&w->hb_lock, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&w->hb_cv, &ca);
  pthread_condattr_destroy(&ca);
  if (ferry__wpool_init(&w->pool, cfg->buffer_bytes) != 0 ||
      ferry__wtasks_init(&w->tasks, &w->pool, cfg->chunk_bytes,
                         ferry__winbox_push, w) != 0 ||
      ferry__wtasks_set_spill_dir(&w->tasks, cfg->spill_dir) != 0)
    return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
  if ((rc = ferry__wtasks_set_roots(&w->tasks, cfg->data_roots, err)) != 0)
    return rc;
  if (cfg->share_bytes > 0) {
    if (ferry__wshare_init(&w->share, cfg->share_bytes) != 0)
      return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
    w->share_on = true;
    w->tasks.share = &w->share;
  }
  if (cfg->cache_dir != NULL && cfg->cache_dir[0] != '\0') {
    if ((rc = ferry__wcache_open(&w->cache, cfg->cache_dir, cfg->cache_bytes,
                                 err)) != 0)
      return rc;
    w->cache_on = true;
    w->tasks.cache = &w->cache;
  }
  w->tasks.test_record_delay_ms = cfg->test_record_delay_ms;
  /* Tasks start only while their client reads (worker.h, the gate). */
  w->tasks.gate = true;
  if (ferry__roots_open(&w->tasks.roots))
    FERRY_LOG(FERRY_LOG_WARN, "no --data-root: tasks may read any file this "
              "worker can open");
  if (cfg->dispatcher != NULL && cfg->dispatcher[0] != '\0') {
    w->tasks.on_end = ferry__whb_task_ended;
    w->tasks.end_arg = w;
  }
  rc = uv_async_init(loop, &w->inbox_async, ferry__winbox_on_async);
  if (rc != 0)
    return ferry__seterr(err, FERRY_EIO, "uv_async_init: %s",
                         uv_strerror(rc));
  w->inbox_async.data = w;
  w->async_on = true;
  {
    ferry_rpc_tls_t tls = {cfg->tls_ca, cfg->tls_cert, cfg->tls_key,
                           cfg->tls_client_auth};
    ferry_rpc_options_t ro = {0};
    ro.tls = cfg->tls_cert != NULL ? &tls : NULL;
    /* The flags' 0 is "never"; ferry_rpc_options_t's is the default. */
    ro.idle_connection_ms = cfg->idle_connection_ms > 0
                                ? (int)cfg->idle_connection_ms
                                : -1;
    ro.max_connection_age_ms = cfg->connection_age_ms > 0
                                   ? (int)cfg->connection_age_ms
                                   : -1;
    ro.handshake_timeout_ms = (int)cfg->handshake_timeout_ms;
    if (cfg->tls_cert == NULL && (cfg->tls_key != NULL ||
                                  cfg->tls_client_auth)) {
      rc = ferry__seterr(err, FERRY_EOPTION,
                         "--tls-key and --tls-client-auth need --tls-cert");
      goto fail;
    }
    /* The worker dials the dispatcher with the same TLS settings: with a
     * certificate and no CA it could not check the dispatcher, and a
     * plaintext dial to a TLS dispatcher fails with nothing but
     * handshake errors in its log. */
    if (cfg->tls_cert != NULL && cfg->tls_ca == NULL) {
      rc = ferry__seterr(err, FERRY_EOPTION,
                         "--tls-cert needs --tls-ca: the worker checks the "
                         "dispatcher's certificate against it");
      goto fail;
    }
    if ((cfg->worker_token_file != NULL &&
         (rc = ferry__rpc_read_token(cfg->worker_token_file, &w->worker_token,
                                     err)) != 0) ||
        (cfg->client_token_file != NULL &&
         (rc = ferry__rpc_read_token(cfg->client_token_file, &w->client_token,
                                     err)) != 0))
      goto fail;
    rc = ferry__rpc_server_new(loop, &ro, &w->server, err);
  }
  if (rc != 0)
    goto fail;
  if ((rc = ferry__wstream_register(w, err)) != 0 ||
      (rc = ferry__rpc_health_register(w->server, services, 1, err)) != 0)
    goto fail;
  {
    const char *h = cfg->host != NULL && cfg->host[0] != '\0' ? cfg->host
                                                              : "127.0.0.1";
    /* A bare IPv6 address ("::1") needs its brackets before the port. */
    snprintf(addr, sizeof(addr),
             strchr(h, ':') != NULL && h[0] != '[' ? "[%s]:%d" : "%s:%d", h,
             (int)cfg->port);
  }
  rc = ferry__rpc_server_start(w->server, addr, &w->port, err);
  if (rc != 0)
    goto fail;
  make_address(w);
  w->tasks.jpeg.max_pixels = (uint64_t)cfg->jpeg_max_pixels;
  w->tasks.jpeg.max_scans = (uint32_t)cfg->jpeg_max_scans;
  w->tasks.decode_bytes =
      cfg->decode_bytes > 0 ? cfg->decode_bytes : cfg->buffer_bytes;
  w->tasks.jpeg_set = true;
  rc = ferry__wtasks_start(&w->tasks, (size_t)cfg->threads, err);
  if (rc != 0)
    goto fail;
  if (signals) {
    uv_signal_init(loop, &w->sigterm);
    uv_signal_init(loop, &w->sigint);
    w->sigterm.data = w->sigint.data = w;
    uv_signal_start(&w->sigterm, on_signal, SIGTERM);
    uv_signal_start(&w->sigint, on_signal, SIGINT);
    uv_signal_init(loop, &w->sighup);
    w->sighup.data = w;
    uv_signal_start(&w->sighup, on_sighup, SIGHUP);
    w->signals_on = true;
  }
  if (cfg->dispatcher != NULL && cfg->dispatcher[0] != '\0') {
    rc = ferry__whb_start(w, err);
    if (rc != 0)
      goto fail;
  }
  return 0;
fail:
  ferry__worker_shutdown(w);
  return rc;
}

bool ferry__worker_close(ferry__worker_t *w, int hb_wait_ms) {
  if (atomic_load(&w->hb_started) && !ferry__whb_join(w, hb_wait_ms))
    return false;
  ferry__wstream_endpoints_free(w);
  ferry__wtasks_close(&w->tasks);
  if (w->cache_on) {
    ferry__wcache_close(&w->cache);
    w->cache_on = false;
  }
  if (w->share_on) {
    ferry__wshare_close(&w->share);
    w->share_on = false;
  }
  uint64_t used = ferry__wpool_used(&w->pool);
  if (used != 0)
    FERRY_LOG(FERRY_LOG_WARN, "worker: %llu chunk bytes still out at exit",
              (unsigned long long)used);
  else
    ferry__wpool_close(&w->pool);
  ferry_free(w->worker_token);
  ferry_free(w->client_token);
  pthread_mutex_destroy(&w->inbox_lock);
  pthread_mutex_destroy(&w->hb_lock);
  pthread_cond_destroy(&w->hb_cv);
  return true;
}
