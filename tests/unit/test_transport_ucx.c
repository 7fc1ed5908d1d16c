/* Tests of the UCX transport (transport.h,
 * common/src/transport/transport_ucx.c) on its own: a gRPC server with the UCX
 * transport on a libuv loop thread (127.0.0.1, port 0) sends chunks of a header
 * piece and a payload piece; the client side on the test thread reads them.
 * Every wait is bounded and every test checks that each send's release ran
 * exactly once and that Ferry's allocations came back. Skipped when UCX is not
 * built in or cannot start here. */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "alloc.h"
#include "rpc.h"
#include "transport.h"

#ifdef FERRY_HAVE_UCX

#define WAIT_MS 10000
/* The server's grace (1 s), the endpoint's drop, the 4 s after it before
 * it gives sends up, and slack for a loaded machine. */
#define ABANDON_WAIT_MS 20000
#define PAY (1u << 20)
#define VARY 4096

static const uint8_t SECRET[FERRY_CLIENT_SECRET_BYTES] = "0123456789abcdef";

static struct {
  uv_loop_t loop;
  uv_async_t wake;
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  ferry_rpc_server_t *rpc;
  ferry_transport_server_t *srv;
  uint8_t addr[4096];
  size_t addr_len;
  char target[64];
  uint8_t *payload; /* PAY bytes, the "pool" */
  size_t pay_len;   /* bytes of it each chunk sends (PAY unless a test
                     * sets fewer before it opens its stream) */
  bool vary;        /* chunk i's payload starts at byte VARY * (i % 8) */
  void *memh;
  /* the server's stream and its script */
  ferry_transport_stream_t *s;
  int total;     /* chunks to send */
  int sent;      /* sends started */
  int inflight;  /* sends without on_sent */
  bool finish_after; /* finish OK after `total` */
  atomic_int releases;
  atomic_int opens, ends, refused;
  bool stop, stopped;
  ferry_alloc_stats_t baseline;
} F;

static void notify(void) {
  pthread_mutex_lock(&F.mu);
  pthread_cond_broadcast(&F.cv);
  pthread_mutex_unlock(&F.mu);
}

static bool wait_for_ms(bool (*pred)(void), int ms) {
  struct timespec dl;
  clock_gettime(CLOCK_REALTIME, &dl);
  dl.tv_sec += ms / 1000;
  pthread_mutex_lock(&F.mu);
  bool ok = pred();
  while (!ok && pthread_cond_timedwait(&F.cv, &F.mu, &dl) == 0)
    ok = pred();
  ok = pred();
  pthread_mutex_unlock(&F.mu);
  return ok;
}

static bool wait_for(bool (*pred)(void)) { return wait_for_ms(pred, WAIT_MS); }

static void on_release(void *arg) {
  (void)arg;
  atomic_fetch_add(&F.releases, 1);
  notify();
}

static void pump(void);

static void on_sent(ferry_transport_stream_t *s, int ok, void *arg) {
  (void)s;
  (void)arg;
  F.inflight--;
  if (ok)
    pump();
  notify();
}

static void on_end(ferry_transport_stream_t *s, void *arg) {
  (void)arg;
  atomic_fetch_add(&F.ends, 1);
  if (F.s == s) {
    F.s = NULL;
    ferry__transport_finish(s, FERRY_RPC_CANCELLED, "cancelled");
  }
  notify();
}

/* Sends chunk headers "chunk N" and a payload from the pool. */
static uint8_t hdrs[64][32];
static void pump(void) {
  /* The script is set by the test's thread (set_script), under F.mu. */
  pthread_mutex_lock(&F.mu);
  int total = F.total;
  bool finish_after = F.finish_after;
  pthread_mutex_unlock(&F.mu);
  while (F.s != NULL && F.sent < total &&
         F.inflight < (int)ferry__transport_window(F.s)) {
    int i = F.sent++;
    int n = snprintf((char *)hdrs[i % 64], sizeof(hdrs[0]), "chunk %d", i);
    ferry_transport_send_t m = {.release = on_release, .n = 2};
    m.pieces[0] = (ferry_transport_piece_t){hdrs[i % 64], (size_t)n};
    size_t at = F.vary ? VARY * (size_t)(i % 8) : 0;
    m.pieces[1] = (ferry_transport_piece_t){F.payload + at, F.pay_len};
    F.inflight++;
    if (ferry__transport_send(F.s, &m) != 0) {
      F.inflight--;
      return;
    }
  }
  if (F.s != NULL && finish_after && F.sent == total && F.inflight == 0) {
    ferry_transport_stream_t *s = F.s;
    F.s = NULL;
    ferry__transport_finish(s, FERRY_RPC_OK, NULL);
  }
}

static void on_open(ferry_transport_stream_t *s,
                    const ferry_transport_open_t *req, void *user) {
  (void)user;
  atomic_fetch_add(&F.opens, 1);
  if (req->secret == NULL ||
      memcmp(req->secret, SECRET, FERRY_CLIENT_SECRET_BYTES) != 0 ||
      req->job_id != 7 || req->client_id != 9 || F.s != NULL) {
    atomic_fetch_add(&F.refused, 1);
    ferry__transport_finish(s, FERRY_RPC_PERMISSION_DENIED,
                            "not this client's stream");
    notify();
    return;
  }
  F.s = s;
  ferry__transport_accept(s, on_sent, on_end, NULL);
  pump();
  notify();
}

static void srv_done(void *arg) {
  (void)arg;
  uv_close((uv_handle_t *)&F.wake, NULL);
  pthread_mutex_lock(&F.mu);
  F.stopped = true;
  pthread_cond_broadcast(&F.cv);
  pthread_mutex_unlock(&F.mu);
}

static void rpc_done(void *arg) {
  (void)arg;
  if (F.memh != NULL)
    F.srv->ops->mem_unmap(F.srv, F.memh);
  ferry__transport_server_shutdown(F.srv, srv_done, NULL);
}

static void on_wake(uv_async_t *h) {
  (void)h;
  pthread_mutex_lock(&F.mu);
  bool stop = F.stop;
  F.stop = false;
  pthread_mutex_unlock(&F.mu);
  if (stop)
    ferry__rpc_server_shutdown(F.rpc, rpc_done, NULL);
}

static void *loop_main(void *arg) {
  (void)arg;
  uv_run(&F.loop, UV_RUN_DEFAULT);
  return NULL;
}

static void setup(void) {
  memset(&F, 0, sizeof(F));
  ferry__rpc_init();
  ferry__alloc_stats(&F.baseline);
  pthread_mutex_init(&F.mu, NULL);
  pthread_cond_init(&F.cv, NULL);
  F.pay_len = PAY;
  F.payload = ferry__malloc(PAY);
  cr_assert_not_null(F.payload);
  for (size_t i = 0; i < PAY; i++)
    F.payload[i] = (uint8_t)(i * 7 + 3);
  ferry_error_t err = {0};
  cr_assert_eq(uv_loop_init(&F.loop), 0);
  uv_async_init(&F.loop, &F.wake, on_wake);
  cr_assert_eq(ferry__rpc_server_new(&F.loop, NULL, &F.rpc, &err), 0, "%s",
               err.msg);
  ferry_transport_server_config_t cfg = {.loop = &F.loop, .rpc_server = F.rpc,
                                         .on_open = on_open};
  if (ferry__transport_ucx_server.server_new(&cfg, &F.srv, &err) != 0)
    cr_skip_test("UCX cannot start here: %s", err.msg);
  size_t len;
  const void *a = ferry__transport_server_address(F.srv, &len);
  cr_assert(len > 0 && len <= sizeof(F.addr));
  memcpy(F.addr, a, len);
  F.addr_len = len;
  cr_assert_eq(F.srv->ops->mem_map(F.srv, F.payload, PAY, &F.memh, &err), 0,
               "%s", err.msg);
  int port = 0;
  cr_assert_eq(ferry__rpc_server_start(F.rpc, "127.0.0.1:0", &port, &err), 0,
               "%s", err.msg);
  snprintf(F.target, sizeof(F.target), "127.0.0.1:%d", port);
  pthread_create(&F.thread, NULL, loop_main, NULL);
}

static bool is_stopped(void) { return F.stopped; }

static void teardown(void) {
  if (F.srv == NULL)
    return;
  pthread_mutex_lock(&F.mu);
  F.stop = true;
  pthread_mutex_unlock(&F.mu);
  uv_async_send(&F.wake);
  cr_assert(wait_for(is_stopped), "the servers did not shut down");
  pthread_join(F.thread, NULL);
  cr_assert_eq(uv_loop_close(&F.loop), 0, "a handle is left on the loop");
  cr_assert_eq(atomic_load(&F.releases), F.sent,
               "%d releases for %d sends", atomic_load(&F.releases), F.sent);
  ferry__free(F.payload);
  ferry_alloc_stats_t now;
  ferry__alloc_stats(&now);
  cr_assert_eq(now.blocks, F.baseline.blocks,
               "%lld Ferry blocks leaked",
               (long long)(now.blocks - F.baseline.blocks));
}

TestSuite(transport_ucx, .init = setup, .fini = teardown, .timeout = 60);

static ferry_transport_client_t *client_with(int slow_fetch_ms) {
  ferry_transport_client_t *cl = NULL;
  ferry_error_t err = {0};
  ferry_transport_client_config_t cfg = {.peer_timeout_ms = 5000,
                                         .slow_fetch_ms = slow_fetch_ms};
  cr_assert_eq(ferry__transport_ucx.client_new(&cfg, &cl, &err), 0, "%s",
               err.msg);
  return cl;
}

static ferry_transport_client_t *client(void) { return client_with(0); }

static ferry_transport_cstream_t *open_stream(ferry_transport_client_t *cl,
                                              const uint8_t *secret) {
  ferry_transport_peer_t peer = {F.target, F.addr, F.addr_len};
  ferry_transport_open_t req = {.job_id = 7, .client_id = 9,
                                .secret = secret};
  ferry_transport_cstream_t *s = NULL;
  ferry_error_t err = {0};
  cr_assert_eq(cl->ops->open(cl, &peer, &req, &s, &err), 0, "%s", err.msg);
  return s;
}

static void set_script(int total, bool finish) {
  pthread_mutex_lock(&F.mu);
  F.total = total;
  F.finish_after = finish;
  pthread_mutex_unlock(&F.mu);
}

/* Reads one message; checks its header and payload. `split` copies the
 * payload in two parts (the bounce path), else in one (straight into dst). */
static void read_one(ferry_transport_cstream_t *s, int want, uint8_t *dst,
                     bool split) {
  ferry_transport_msg_t m;
  ferry_error_t err = {0};
  int rc = ferry__transport_next(s, &m, WAIT_MS, &err);
  cr_assert_eq(rc, 0, "next: %d %s", rc, err.msg);
  char hdr[32] = {0}, exp[32];
  int n = snprintf(exp, sizeof(exp), "chunk %d", want);
  size_t pay = F.pay_len;
  cr_assert_eq(m.len, (size_t)n + pay);
  cr_assert_eq(m.copy(&m, 0, hdr, (size_t)n), (size_t)n);
  cr_assert_str_eq(hdr, exp);
  memset(dst, 0, PAY);
  if (split) {
    cr_assert_eq(m.copy(&m, (size_t)n, dst, 1000), 1000u);
    cr_assert_eq(m.copy(&m, (size_t)n + 1000, dst + 1000, pay - 1000),
                 pay - 1000);
  } else {
    cr_assert_eq(m.copy(&m, (size_t)n, dst, pay), pay);
  }
  size_t at = F.vary ? VARY * (size_t)(want % 8) : 0;
  cr_assert_eq(memcmp(dst, F.payload + at, pay), 0, "payload %d differs",
               want);
  ferry__transport_msg_release(&m);
}

Test(transport_ucx, every_chunk_once_in_order_then_eof) {
  set_script(40, true);
  ferry_transport_client_t *cl = client();
  ferry_transport_cstream_t *s = open_stream(cl, SECRET);
  uint8_t *dst = ferry__malloc(PAY);
  for (int i = 0; i < 40; i++)
    read_one(s, i, dst, i % 3 == 2);
  ferry_transport_msg_t m;
  ferry_error_t err = {0};
  cr_assert_eq(ferry__transport_next(s, &m, WAIT_MS, &err), FERRY_EOF, "%s",
               err.msg);
  cr_assert_eq(ferry__transport_next(s, &m, 10, &err), FERRY_EOF);
  ferry__free(dst);
  ferry__transport_cstream_free(s);
  cl->ops->client_free(cl);
  cr_assert_eq(atomic_load(&F.refused), 0);
}

/* Payloads under the rendezvous threshold go eager, and on a connected
 * endpoint a chunk's two AMs usually go out inside ucp_am_send_nbx. Such
 * sends used to never end (UCX 1.13 ran their callbacks inside the call,
 * before they were counted): no release, no on_sent, and the stream
 * stalled after its first window (integration/unreachable-ucx). */
Test(transport_ucx, eager_payloads_past_the_window_all_arrive) {
  pthread_mutex_lock(&F.mu);
  F.pay_len = 4800; /* a chunk of 25 records of 8x8x3 bytes */
  pthread_mutex_unlock(&F.mu);
  set_script(100, true);
  ferry_transport_client_t *cl = client();
  ferry_transport_cstream_t *s = open_stream(cl, SECRET);
  uint8_t *dst = ferry__malloc(PAY);
  for (int i = 0; i < 100; i++)
    read_one(s, i, dst, i % 3 == 2);
  ferry_transport_msg_t m;
  ferry_error_t err = {0};
  cr_assert_eq(ferry__transport_next(s, &m, WAIT_MS, &err), FERRY_EOF, "%s",
               err.msg);
  ferry__free(dst);
  ferry__transport_cstream_free(s);
  cl->ops->client_free(cl);
  cr_assert_eq(atomic_load(&F.releases), 100);
}

static bool has_sent_window(void) { return F.sent >= 8; }

static bool ended_and_released(void) {
  return atomic_load(&F.ends) == 1 && atomic_load(&F.releases) == F.sent;
}

/* On a slow link the client fetches the next payloads while the reader
 * copies this one (slow_fetch_ms < 0 takes every link for slow): each
 * chunk still gets its own payload, in order, whichever way it is copied
 * (whole, in parts, or not at all: a message released with its payload
 * fetched ahead drops that receive), and every send completes. */
static bool all_released(void) {
  return F.sent > 0 && atomic_load(&F.releases) == F.sent;
}

Test(transport_ucx, payloads_fetched_ahead_arrive_in_order) {
  pthread_mutex_lock(&F.mu);
  F.vary = true;
  F.pay_len = PAY - 8 * VARY;
  pthread_mutex_unlock(&F.mu);
  set_script(60, true);
  ferry_transport_client_t *cl = client_with(-1);
  ferry_transport_cstream_t *s = open_stream(cl, SECRET);
  uint8_t *dst = ferry__malloc(PAY);
  for (int i = 0; i < 60; i++) {
    if (i % 7 == 5) { /* the header only: the payload is never copied */
      ferry_transport_msg_t m;
      ferry_error_t err = {0};
      cr_assert_eq(ferry__transport_next(s, &m, WAIT_MS, &err), 0, "%s",
                   err.msg);
      char hdr[32] = {0}, exp[32];
      int n = snprintf(exp, sizeof(exp), "chunk %d", i);
      cr_assert_eq(m.copy(&m, 0, hdr, (size_t)n), (size_t)n);
      cr_assert_str_eq(hdr, exp);
      ferry__transport_msg_release(&m);
      continue;
    }
    read_one(s, i, dst, i % 3 == 2);
  }
  ferry_transport_msg_t m;
  ferry_error_t err = {0};
  cr_assert_eq(ferry__transport_next(s, &m, WAIT_MS, &err), FERRY_EOF, "%s",
               err.msg);
  cr_assert(wait_for(all_released), "%d of %d sends released",
            atomic_load(&F.releases), F.sent);
  ferry__free(dst);
  ferry__transport_cstream_free(s);
  cl->ops->client_free(cl);
  cr_assert_eq(F.sent, 60);
}

/* A reader that cancels after `reads` chunks, with the worker's window
 * of sends out and held by this client: the stream ends and every send
 * completes (teardown: every allocation came back). */
static void cancel_after(int reads, int slow_fetch_ms) {
  set_script(1000, false);
  ferry_transport_client_t *cl = client_with(slow_fetch_ms);
  ferry_transport_cstream_t *s = open_stream(cl, SECRET);
  uint8_t *dst = ferry__malloc(PAY);
  for (int i = 0; i < reads; i++)
    read_one(s, i, dst, false);
  ferry__transport_cancel(s);
  ferry_transport_msg_t m;
  ferry_error_t err = {0};
  cr_assert_eq(ferry__transport_next(s, &m, WAIT_MS, &err),
               FERRY_EGRPC_CANCELLED);
  cr_assert(wait_for(ended_and_released), "ends %d, releases %d of %d",
            atomic_load(&F.ends), atomic_load(&F.releases), F.sent);
  ferry__free(dst);
  ferry__transport_cstream_free(s);
  cl->ops->client_free(cl);
}

/* ... with payloads fetched ahead (every link taken for slow). */
Test(transport_ucx, cancel_with_payloads_fetched_ahead_releases_them) {
  cancel_after(5, -1);
}

Test(transport_ucx, cancel_ends_the_stream_and_releases_every_send) {
  cancel_after(3, 0);
}

Test(transport_ucx, a_client_that_goes_away_holding_chunks_frees_them) {
  set_script(1000, false);
  ferry_transport_client_t *cl = client();
  ferry_transport_cstream_t *s = open_stream(cl, SECRET);
  uint8_t *dst = ferry__malloc(PAY);
  read_one(s, 0, dst, false);
  ferry__free(dst);
  /* Free without reading the rest: what it held is given back, by its
   * releases or, where they did not get out before its UCP worker was
   * destroyed, by the server giving the sends up. */
  ferry__transport_cstream_free(s);
  cl->ops->client_free(cl);
  cr_assert(wait_for_ms(ended_and_released, ABANDON_WAIT_MS),
            "ends %d, releases %d of %d", atomic_load(&F.ends),
            atomic_load(&F.releases), F.sent);
}

/* A client killed while it holds rendezvous payloads it never fetched:
 * UCX never completes those sends on a mode-NONE endpoint (and refuses
 * its forced close), and their chunks stayed out of the worker's pool
 * for good (and its server never shut down). The server gives them up
 * some time after the endpoint's drop: every release runs, within a
 * bound. */
Test(transport_ucx, a_client_killed_holding_payloads_does_not_pin_them) {
  set_script(1000, false);
  char hex[2 * sizeof(F.addr) + 1], secret[FERRY_CLIENT_SECRET_BYTES + 1];
  for (size_t i = 0; i < F.addr_len; i++)
    snprintf(hex + 2 * i, 3, "%02x", F.addr[i]);
  memcpy(secret, SECRET, FERRY_CLIENT_SECRET_BYTES);
  secret[FERRY_CLIENT_SECRET_BYTES] = 0;
  int out[2];
  cr_assert_eq(pipe(out), 0);
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    dup2(out[1], 1);
    close(out[0]);
    close(out[1]);
    execl(FERRY_UCX_VANISHING_CLIENT, "ucx_vanishing_client", F.target, hex,
          secret, "7", "9", (char *)NULL);
    _exit(127);
  }
  close(out[1]);
  char line[64] = {0};
  size_t got = 0;
  struct pollfd pfd = {.fd = out[0], .events = POLLIN};
  while (got < sizeof(line) - 1 && strchr(line, '\n') == NULL &&
         poll(&pfd, 1, WAIT_MS) == 1) {
    ssize_t n = read(out[0], line + got, sizeof(line) - 1 - got);
    if (n <= 0)
      break;
    got += (size_t)n;
  }
  close(out[0]);
  kill(pid, SIGKILL);
  int st;
  cr_assert_eq(waitpid(pid, &st, 0), pid);
  cr_assert_str_eq(line, "holding\n", "the client did not take a chunk");
  cr_assert(wait_for(has_sent_window), "sent %d", F.sent);
  cr_assert(wait_for_ms(ended_and_released, ABANDON_WAIT_MS),
            "ends %d, releases %d of %d", atomic_load(&F.ends),
            atomic_load(&F.releases), F.sent);
}

static bool refused_once(void) { return atomic_load(&F.refused) == 1; }

Test(transport_ucx, a_wrong_secret_is_refused_like_grpc) {
  set_script(5, true);
  ferry_transport_client_t *cl = client();
  uint8_t bad[FERRY_CLIENT_SECRET_BYTES] = {0};
  ferry_transport_cstream_t *s = open_stream(cl, bad);
  ferry_transport_msg_t m;
  ferry_error_t err = {0};
  int rc = ferry__transport_next(s, &m, WAIT_MS, &err);
  cr_assert_eq(rc, FERRY_EGRPC_PERMISSION_DENIED, "%d: %s", rc, err.msg);
  cr_assert(strstr(err.msg, "not this client's stream") != NULL, "%s",
            err.msg);
  cr_assert(wait_for(refused_once));
  ferry__transport_cstream_free(s);
  cl->ops->client_free(cl);
}

#else

Test(transport_ucx, not_built) {
  cr_skip_test("built without UCX (FERRY_WITH_UCX=OFF or no libucx)");
}

#endif
