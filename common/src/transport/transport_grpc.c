/* The gRPC transport (transport.h): Worker/StreamChunks over
 * rpc.h, with its TLS, bearer tokens and keepalive.
 *
 * Worker side: StreamChunks is registered on the worker's gRPC server; a
 * call becomes a stream handed to on_open. Sends map one to one onto
 * ferry__rpc_stream_send (one outstanding: window 1), the pieces' free
 * callbacks onto the send's release, the call's cancel onto on_end.
 * Client side: a channel and a ferry_rpc_stream_t per stream; a message is
 * the received gRPC byte buffer, read through ferry__rpc_msg_copy.
 */
#include <stdatomic.h>
#include <string.h>

#include "alloc.h"
#include "ferry/log.h"
#include "ferry/v1/worker.pb-c.h"
#include "rpc_methods.h"
#include "transport.h"
#include "transport_internal.h"
#include "tsan.h"

/* ---- Worker side --------------------------------------------------------- */

typedef struct gserver_s {
  ferry_transport_server_t base;
  ferry_transport_open_cb on_open;
  void *user;
} gserver_t;

typedef struct gstream_s {
  ferry_transport_stream_t base;
  ferry_rpc_call_t *call;
  ferry_transport_sent_cb on_sent;
  ferry_transport_end_cb on_end;
  void *arg;
  bool accepted;
  bool sending;
} gstream_t;

/* The release of one send: the pieces' free callbacks count down. */
typedef struct grelease_s {
  atomic_int refs;
  void (*release)(void *);
  void *arg;
} grelease_t;

static void piece_free(void *arg) {
  grelease_t *r = arg;
  FERRY_TSAN_ACQUIRE(r); /* released when the piece went to gRPC */
  if (atomic_fetch_sub(&r->refs, 1) == 1) {
    r->release(r->arg);
    ferry__free(r);
  }
}

static void on_call(ferry_rpc_call_t *call, const uint8_t *req, size_t len,
                    void *user) {
  gserver_t *srv = user;
  ferry_transport_open_t o;
  Ferry__V1__StreamChunksRequest *m = ferry__transport_request(call, req,
                                                               len, &o);
  if (m == NULL)
    return;
  gstream_t *s = ferry__calloc(1, sizeof(*s));
  if (s == NULL) {
    ferry__transport_request_free(m);
    ferry__rpc_reply_error(call, FERRY_RPC_INTERNAL, "out of memory");
    return;
  }
  s->base.ops = &ferry__transport_grpc_server;
  s->base.server = &srv->base;
  s->call = call;
  srv->on_open(&s->base, &o, srv->user);
  ferry__transport_request_free(m);
}

static int g_server_new(const ferry_transport_server_config_t *cfg,
                        ferry_transport_server_t **out, ferry_error_t *err) {
  *out = NULL;
  if (cfg->rpc_server == NULL || cfg->on_open == NULL)
    return ferry__seterr(err, FERRY_EINVAL,
                         "transport grpc: needs the worker's gRPC server");
  gserver_t *srv = ferry__calloc(1, sizeof(*srv));
  if (srv == NULL)
    return ferry__seterr(err, FERRY_ENOMEM, "transport grpc: out of memory");
  srv->base.ops = &ferry__transport_grpc_server;
  srv->on_open = cfg->on_open;
  srv->user = cfg->user;
  int rc =
      ferry__rpc_server_register(cfg->rpc_server, FERRY_METHOD_STREAM_CHUNKS,
                                 FERRY_RPC_SERVER_STREAM, on_call, srv, err);
  if (rc != 0) {
    ferry__free(srv);
    return rc;
  }
  *out = &srv->base;
  return 0;
}

static const void *g_server_address(ferry_transport_server_t *srv,
                                    size_t *len) {
  (void)srv;
  *len = 0;
  return NULL;
}

static void g_server_shutdown(ferry_transport_server_t *base,
                              ferry_transport_done_cb done, void *arg) {
  /* Called after the gRPC server's shutdown completed: its calls were
   * cancelled, answered and their pieces released by then. */
  ferry__free(base);
  if (done != NULL)
    done(arg);
}

static void g_on_cancel(ferry_rpc_call_t *call, void *arg) {
  gstream_t *s = arg;
  (void)call;
  if (s->on_end != NULL)
    s->on_end(&s->base, s->arg);
}

static void g_accept(ferry_transport_stream_t *base,
                     ferry_transport_sent_cb on_sent,
                     ferry_transport_end_cb on_end, void *arg) {
  gstream_t *s = (gstream_t *)base;
  s->on_sent = on_sent;
  s->on_end = on_end;
  s->arg = arg;
  s->accepted = true;
  ferry__rpc_call_on_cancel(s->call, g_on_cancel, s);
}

static void g_on_sent(ferry_rpc_call_t *call, int ok, void *arg) {
  gstream_t *s = arg;
  (void)call;
  s->sending = false;
  if (s->on_sent != NULL)
    s->on_sent(&s->base, ok, s->arg);
}

static int g_send(ferry_transport_stream_t *base,
                  const ferry_transport_send_t *m) {
  gstream_t *s = (gstream_t *)base;
  if (!s->accepted || s->sending || m->n == 0 ||
      m->n > FERRY_TRANSPORT_MAX_PIECES) {
    m->release(m->release_arg);
    return FERRY_EINVAL;
  }
  grelease_t *r = ferry__malloc(sizeof(*r));
  if (r == NULL) {
    m->release(m->release_arg);
    return FERRY_ENOMEM;
  }
  atomic_init(&r->refs, (int)m->n);
  r->release = m->release;
  r->arg = m->release_arg;
  ferry_rpc_piece_t p[FERRY_TRANSPORT_MAX_PIECES];
  for (size_t i = 0; i < m->n; i++)
    p[i] = (ferry_rpc_piece_t){m->pieces[i].ptr, m->pieces[i].len,
                               piece_free, r};
  /* Each piece's free runs exactly once, whether this succeeds or not. */
  int rc = ferry__rpc_stream_send(s->call, p, m->n, g_on_sent, s);
  if (rc == 0) {
    s->sending = true;
  }
  return rc;
}

static unsigned g_window(const ferry_transport_stream_t *s) {
  (void)s;
  return 1;
}

static bool g_ended(const ferry_transport_stream_t *base) {
  const gstream_t *s = (const gstream_t *)base;
  return ferry__rpc_call_cancelled(s->call);
}

static void g_finish(ferry_transport_stream_t *base, int status,
                     const char *msg) {
  gstream_t *s = (gstream_t *)base;
  /* A refusal before anything was accepted is the call's error reply. */
  if (!s->accepted && status != FERRY_RPC_OK)
    ferry__rpc_reply_error(s->call, status, msg);
  else
    ferry__rpc_stream_finish(s->call, status, msg);
  /* No callback of the call runs after its answer. */
  ferry__free(s);
}

/* ---- Client side --------------------------------------------------------- */

typedef struct gclient_s {
  ferry_transport_client_t base;
  ferry_rpc_options_t opts; /* the pointers in it outlive the client */
} gclient_t;

typedef struct gcstream_s {
  ferry_transport_cstream_t base;
  ferry_rpc_channel_t *channel;
  ferry_rpc_stream_t *stream;
  ferry_rpc_msg_t msg; /* the message handed out, until its release */
} gcstream_t;

static int g_client_new(const ferry_transport_client_config_t *cfg,
                        ferry_transport_client_t **out, ferry_error_t *err) {
  gclient_t *cl = ferry__calloc(1, sizeof(*cl));
  *out = NULL;
  if (cl == NULL)
    return ferry__seterr(err, FERRY_ENOMEM, "transport grpc: out of memory");
  cl->base.ops = &ferry__transport_grpc;
  ferry__transport_client_opts(cfg, &cl->opts);
  *out = &cl->base;
  return 0;
}

static void g_client_free(ferry_transport_client_t *cl) {
  ferry__free(cl);
}

static int g_open(ferry_transport_client_t *base,
                  const ferry_transport_peer_t *peer,
                  const ferry_transport_open_t *req,
                  ferry_transport_cstream_t **out, ferry_error_t *err) {
  gclient_t *cl = (gclient_t *)base;
  Ferry__V1__StreamChunksRequest m = FERRY__V1__STREAM_CHUNKS_REQUEST__INIT;
  uint8_t buf[64];
  *out = NULL;
  m.job_id = req->job_id;
  m.client_id = req->client_id;
  if (req->secret != NULL) {
    m.client_secret.data = (uint8_t *)req->secret;
    m.client_secret.len = FERRY_CLIENT_SECRET_BYTES;
  }
  size_t len = ferry__v1__stream_chunks_request__pack(&m, buf);
  gcstream_t *s = ferry__calloc(1, sizeof(*s));
  if (s == NULL)
    return ferry__seterr(err, FERRY_ENOMEM, "transport grpc: out of memory");
  s->base.ops = &ferry__transport_grpc;
  int rc = ferry__rpc_channel_new(peer->name, &cl->opts, &s->channel, err);
  if (rc == 0)
    rc = ferry__rpc_stream_open(s->channel, FERRY_METHOD_STREAM_CHUNKS, buf,
                                len, 0, 0, &s->stream, err);
  if (rc != 0) {
    ferry__rpc_channel_free(s->channel);
    ferry__free(s);
    return rc;
  }
  *out = &s->base;
  return 0;
}

static size_t g_msg_copy(const ferry_transport_msg_t *m, size_t off,
                         void *dst, size_t n) {
  const gcstream_t *s = m->impl_[0];
  return ferry__rpc_msg_copy(&s->msg, off, dst, n);
}

static void g_msg_release(ferry_transport_msg_t *m) {
  gcstream_t *s = m->impl_[0];
  ferry__rpc_msg_release(&s->msg);
  memset(m, 0, sizeof(*m));
}

static int g_next(ferry_transport_cstream_t *base, ferry_transport_msg_t *msg,
                  int timeout_ms, ferry_error_t *err) {
  gcstream_t *s = (gcstream_t *)base;
  memset(msg, 0, sizeof(*msg));
  ferry__rpc_msg_release(&s->msg); /* a message the reader forgot */
  int rc = ferry__rpc_stream_next(s->stream, &s->msg, timeout_ms, err);
  if (rc != 0)
    return rc;
  msg->len = s->msg.len;
  msg->copy = g_msg_copy;
  msg->release = g_msg_release;
  msg->impl_[0] = s;
  return 0;
}

static void g_cancel(ferry_transport_cstream_t *base) {
  ferry__rpc_stream_cancel(((gcstream_t *)base)->stream);
}

static void g_cstream_free(ferry_transport_cstream_t *base) {
  gcstream_t *s = (gcstream_t *)base;
  if (s == NULL)
    return;
  ferry__rpc_msg_release(&s->msg);
  ferry__rpc_stream_free(s->stream);
  ferry__rpc_channel_free(s->channel);
  ferry__free(s);
}

const ferry_transport_server_ops_t ferry__transport_grpc_server = {
    .transport = &ferry__transport_grpc,
    .server_new = g_server_new,
    .server_address = g_server_address,
    .server_shutdown = g_server_shutdown,
    .mem_map = NULL,
    .mem_unmap = NULL,
    .accept = g_accept,
    .send = g_send,
    .window = g_window,
    .ended = g_ended,
    .finish = g_finish,
};

const ferry_transport_ops_t ferry__transport_grpc = {
    .name = "grpc",
    .caps = FERRY_TRANSPORT_ENCRYPTS,
    .priority = 0,
    .client_new = g_client_new,
    .client_free = g_client_free,
    .client_mem_map = NULL,
    .client_mem_unmap = NULL,
    .open = g_open,
    .next = g_next,
    .cancel = g_cancel,
    .cstream_free = g_cstream_free,
};
