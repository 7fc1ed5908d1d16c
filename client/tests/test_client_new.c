/* ferry_client_new's failures, without the real daemons: a bad spec fails
 * before any RPC, an unreachable dispatcher within connect_timeout_ms, and
 * a dispatcher's refusal (a fake one on a libuv loop, answering
 * RegisterDataset with NOT_FOUND) reaches the caller with its text. Each
 * leaves nothing allocated.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <uv.h>

#include "alloc.h"
#include "client_internal.h"
#include "rpc.h"
#include "rpc_methods.h"

static const char *spec_ok =
    "tfrecord(\"/nonexistent/train-*.tfrecord\") | decode(raw, 4, 4, 3) | "
    "batch(8)";

Test(client_new, bad_spec_fails_before_any_rpc) {
  ferry_client_options_t o;
  ferry_client_t *c = (ferry_client_t *)1;
  ferry_error_t err = {0};
  ferry_alloc_stats_t a, b;
  ferry__alloc_stats(&a);
  ferry_client_options_init(&o);
  /* Nothing listens on port 1: an RPC would fail differently. */
  o.dispatcher = "127.0.0.1:1";
  o.spec = "tfrecord(\"/d/*.tfrecord\") | dec(raw, 4, 4, 3)";
  cr_assert_eq(ferry_client_new(&o, &c, &err), FERRY_ESPEC);
  cr_assert_null(c);
  cr_assert_not_null(strstr(err.msg, "column 29"), "%s", err.msg);
  /* JPEG of any size cannot be batched: refused before any RPC too. */
  o.spec = "tfrecord(\"/d/x\") | decode(jpeg) | batch(4)";
  cr_assert_eq(ferry_client_new(&o, &c, &err), FERRY_ESHAPE);
  o.spec = "tfrecord(\"/d/x\") | decode(raw, 2, 2, 1)";
  cr_assert_eq(ferry_client_new(&o, &c, &err), FERRY_EINVAL);
  cr_assert_not_null(strstr(err.msg, "batch"));
  ferry__alloc_stats(&b);
  cr_assert_eq(a.blocks, b.blocks);
}

Test(client_new, options_are_checked) {
  ferry_client_options_t o;
  ferry_client_t *c;
  ferry_error_t err = {0};
  ferry_client_options_init(&o);
  cr_assert_eq(o.prefetch, 3);
  cr_assert_eq(o.splits_in_flight, 8);
  cr_assert_eq(o.heartbeat_ms, 250);
  cr_assert_eq(o.shuffle, -1);
  cr_assert_eq(ferry_client_new(&o, &c, &err), FERRY_EINVAL);
  cr_assert_not_null(strstr(err.msg, "set the 'dispatcher' option to "
                                     "HOST:PORT"), "%s", err.msg);
  /* A malformed address is refused before anything is dialed (gRPC took
   * a missing port as 0 and wrapped 99999 around to 34463). */
  o.spec = spec_ok;
  const struct {
    const char *addr, *says;
  } bad[] = {
      {"127.0.0.2", "has no port: give HOST:PORT"},
      {"127.0.0.1:99999", "give a port from 1 to 65535"},
      {"::1:5050", "[::1]:5050"},
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    o.dispatcher = bad[i].addr;
    cr_assert_eq(ferry_client_new(&o, &c, &err), FERRY_EINVAL, "%s",
                 bad[i].addr);
    cr_assert_not_null(strstr(err.msg, "client: option 'dispatcher'"), "%s",
                       err.msg);
    cr_assert_not_null(strstr(err.msg, bad[i].says), "%s", err.msg);
  }
  o.spec = NULL;
  o.dispatcher = "127.0.0.1:1";
  cr_assert_eq(ferry_client_new(&o, &c, &err), FERRY_EINVAL);
  o.spec = spec_ok;
  o.dataset_id = "abc";
  cr_assert_eq(ferry_client_new(&o, &c, &err), FERRY_EINVAL);
  ferry_client_free(NULL);
}

Test(client_new, unreachable_dispatcher_within_the_timeout) {
  ferry_client_options_t o;
  ferry_client_t *c;
  ferry_error_t err = {0};
  ferry_alloc_stats_t a, b;
  ferry__alloc_stats(&a);
  ferry_client_options_init(&o);
  o.dispatcher = "127.0.0.1:1";
  o.spec = spec_ok;
  o.connect_timeout_ms = 400;
  double t0 = ferry__client_now();
  int rc = ferry_client_new(&o, &c, &err);
  double took = ferry__client_now() - t0;
  cr_assert(rc == FERRY_EGRPC_DEADLINE_EXCEEDED ||
            rc == FERRY_EGRPC_UNAVAILABLE, "%d %s", rc, err.msg);
  cr_assert_lt(took, 3.0);
  cr_assert_not_null(strstr(err.msg, "127.0.0.1:1"), "%s", err.msg);
  cr_assert_not_null(strstr(err.msg, "unreachable"), "%s", err.msg);
  cr_assert_not_null(strstr(err.msg, "nothing listens on 127.0.0.1:1"), "%s",
                     err.msg);
  /* A host that does not resolve read "Deadline Exceeded": it is named. */
  o.dispatcher = "no-such-host.invalid:5050";
  rc = ferry_client_new(&o, &c, &err);
  cr_assert(rc == FERRY_EGRPC_DEADLINE_EXCEEDED ||
            rc == FERRY_EGRPC_UNAVAILABLE, "%d %s", rc, err.msg);
  cr_assert_not_null(strstr(err.msg, "cannot resolve host "
                                     "'no-such-host.invalid'"),
                     "%s", err.msg);
  ferry__alloc_stats(&b);
  cr_assert_eq(a.blocks, b.blocks);
}

/* ---- A fake dispatcher -------------------------------------------------- */

typedef struct fake_s {
  uv_loop_t loop;
  uv_async_t stop;
  ferry_rpc_server_t *server;
  int port;
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool ready;
} fake_t;

static void on_register(ferry_rpc_call_t *call, const uint8_t *req,
                        size_t len, void *user) {
  ferry__rpc_reply_error(call, FERRY_RPC_NOT_FOUND,
                         "no file matches /nonexistent/train-*.tfrecord");
}

static void server_done(void *arg) {
  fake_t *f = arg;
  uv_close((uv_handle_t *)&f->stop, NULL);
}

static void on_stop(uv_async_t *h) {
  fake_t *f = h->data;
  ferry__rpc_server_shutdown(f->server, server_done, f);
}

static void *fake_main(void *arg) {
  fake_t *f = arg;
  ferry_error_t err = {0};
  uv_loop_init(&f->loop);
  uv_async_init(&f->loop, &f->stop, on_stop);
  f->stop.data = f;
  cr_assert_eq(ferry__rpc_server_new(&f->loop, NULL, &f->server, &err), 0);
  cr_assert_eq(
      ferry__rpc_server_register(f->server, FERRY_METHOD_REGISTER_DATASET,
                                 FERRY_RPC_UNARY, on_register, f, &err),
      0);
  cr_assert_eq(
      ferry__rpc_server_start(f->server, "127.0.0.1:0", &f->port, &err), 0,
      "%s", err.msg);
  pthread_mutex_lock(&f->mu);
  f->ready = true;
  pthread_cond_signal(&f->cv);
  pthread_mutex_unlock(&f->mu);
  uv_run(&f->loop, UV_RUN_DEFAULT);
  uv_loop_close(&f->loop);
  return NULL;
}

Test(client_new, dispatcher_refusal_keeps_its_text) {
  fake_t f;
  memset(&f, 0, sizeof(f));
  pthread_mutex_init(&f.mu, NULL);
  pthread_cond_init(&f.cv, NULL);
  /* Counted around the server's whole life: it allocates per call. */
  ferry_alloc_stats_t a, b;
  ferry__alloc_stats(&a);
  ferry__rpc_init();
  pthread_create(&f.thread, NULL, fake_main, &f);
  pthread_mutex_lock(&f.mu);
  while (!f.ready)
    pthread_cond_wait(&f.cv, &f.mu);
  pthread_mutex_unlock(&f.mu);

  char addr[64];
  snprintf(addr, sizeof(addr), "127.0.0.1:%d", f.port);
  ferry_client_options_t o;
  ferry_client_t *c;
  ferry_error_t err = {0};
  ferry_client_options_init(&o);
  o.dispatcher = addr;
  o.spec = spec_ok;
  cr_assert_eq(ferry_client_new(&o, &c, &err), FERRY_ENOENT, "%s", err.msg);
  cr_assert_not_null(strstr(err.msg, "/nonexistent/train-*.tfrecord"), "%s",
                     err.msg);
  cr_assert_not_null(strstr(err.msg, "register dataset"), "%s", err.msg);

  uv_async_send(&f.stop);
  pthread_join(f.thread, NULL);
  ferry__rpc_shutdown();
  ferry__alloc_stats(&b);
  cr_assert_eq(a.blocks, b.blocks);
  cr_assert_eq(a.bytes, b.bytes);
}
