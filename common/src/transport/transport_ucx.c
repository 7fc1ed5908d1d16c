/* The UCX transport (transport.h): chunks as UCP active messages.
 *
 * Control on gRPC, bytes on UCX. A stream is opened as a gRPC
 * server-streaming call, Worker/StreamChunksUcx, whose request is
 * StreamChunksRequest with the client's UCP worker address and a stream
 * id (fields 4 and 5). The call goes through the worker's gRPC server, so
 * TLS, the bearer token and the client secret are checked exactly as for
 * the gRPC transport (the worker's on_open sees the same request), and it
 * stays open for the stream's life, carrying no messages: its end is how
 * either side learns that the other cancelled, died or was cut off (gRPC
 * keepalive, the same bound as the gRPC transport), and it carries the
 * final status. The worker then creates a UCP endpoint to the client's
 * address and sends each chunk as two active messages on it:
 *   AM_HDR: the Chunk header bytes (eager, whole), and
 *   AM_PAY: the payload from the chunk pool (rendezvous above 8 KiB: the
 *           client keeps the descriptor and receives the payload straight
 *           into the memory of its first copy(), the staging slot),
 * each with a small AM header {stream id, sequence number, flags}, then
 * AM_END {status, message} after the last send completed.
 *
 * Why not UCX's own error handling: in UCX 1.13 the shared-memory
 * transports (posix, sysv) and cma have no peer failure handler, so a
 * UCP_ERR_HANDLING_MODE_PEER endpoint falls back to tcp on one host (a
 * tenth of the bandwidth; tests/bench/bare_transfer shows it with
 * FERRY_BENCH_UCX_PEER_ERRORS=1). Endpoints here use mode NONE, and the
 * gRPC call stands in for the failure detector: when it ends early the
 * worker waits up to a grace period for outstanding sends (a live client
 * that cancelled releases what it held at once), then drops the endpoint
 * and, ABANDON_MS later, gives up the sends it still holds, returning
 * their chunks to the pool. Dropped, not closed: UCX refuses the forced
 * close of a mode-NONE endpoint (UCS_ERR_INVALID_PARAM, 1.13 and since),
 * and a flushed close would wait for a peer that may be gone; UCP keeps
 * the endpoint until the worker's destroy. The same refusal leaves the
 * client no way to cancel a rendezvous receive from a worker cut off
 * (u_client_free).
 *
 * Progress. Worker side: the UCP worker belongs to the worker's libuv
 * loop thread (UCS_THREAD_MODE_SINGLE); uv_poll on ucp_worker_get_efd
 * drives ucp_worker_progress and ucp_worker_arm, a uv_idle handle runs it
 * once after each send (callbacks never call progress themselves), and a
 * 50 ms timer runs it and the grace deadlines. Client side: one progress
 * thread per ferry_client_t owns its UCP worker; reader threads hand it
 * receive and release operations through a queue and an eventfd, and wait
 * for receives on a condition variable.
 *
 * Fetching ahead. A rendezvous payload costs a round trip before its
 * bytes move, and a reader receives one payload at a time: on a link
 * with 100 ms round trips that held a stream to a chunk per round trip
 * (0.55 to 0.6 of a TCP stream's rate). Where a receive took
 * slow_fetch_ms or more (5 ms; the config's, else
 * FERRY_UCX_SLOW_FETCH_MS, where -1 takes every link for slow), the
 * reader that starts one also posts the receives of the next AHEAD_MAX
 * payloads already announced, into buffers of their own (a copy more,
 * which such a link does not notice); on a fast link it still receives
 * each payload straight into its staging slot. The payloads in flight
 * share the link, so one may take several times longer than alone: the
 * peer timeout counts from when the reader starts to wait and is renewed
 * whenever a payload fetched ahead on the same stream arrives (the peer
 * is alive), so it only fires when nothing has come from the worker for
 * that long.
 *
 * The AM headers are in host byte order: both ends must be little-endian
 * (x86-64, aarch64).
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include "alloc.h"
#include "ferry/log.h"
#include "ferry/v1/worker.pb-c.h"
#include "rpc_methods.h"
#include "transport.h"
#include "transport_internal.h"

#define METHOD FERRY_METHOD_STREAM_CHUNKS_UCX

enum { AM_HDR = 0x4601, AM_PAY = 0x4602, AM_END = 0x4603 };
#define AMF_PAYLOAD 1u /* AM_HDR: an AM_PAY follows */
/* AM_HDR also carries a copy of the payload's first PREFIX bytes (their
 * count in flags bits 8-15): the chunk parser reads a varint window a few
 * bytes past the header's end, which must not fetch the payload. */
#define PREFIX 16
#define RNDV_MIN 8192  /* payloads from this size go by rendezvous */
#define WINDOW 8       /* sends outstanding per stream */
#define GRACE_MS 1000  /* after an early end, before the endpoint's drop */
/* After the drop, before sends that never completed are given up
 * (abandon_sends). */
#define ABANDON_MS 4000
/* Client: a payload whose receive took this long or more marks a slow
 * link ("Fetching ahead" above). */
#define AHEAD_MS 5 /* the default of slow_fetch_ms */
#define AHEAD_MAX 3                /* payloads fetched ahead per stream */
#define AHEAD_BYTES (16u << 20)    /* ... and their bytes */
/* Client free: how long receives given up may still take to end. */
#define FREE_DRAIN_MS 500

typedef struct amhdr_s {
  uint64_t stream_id;
  uint64_t seq;
  int32_t status; /* AM_END: FERRY_RPC_* */
  uint32_t flags;
} amhdr_t;

static int64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* A UCP context and a worker with the AM and wakeup features. */
static int ucx_open(ucp_context_h *ctx, ucp_worker_h *worker,
                    bool indirect_ids, ferry_error_t *err) {
  ucp_params_t p = {.field_mask = UCP_PARAM_FIELD_FEATURES |
                                  UCP_PARAM_FIELD_NAME,
                    .features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP,
                    .name = "ferry"};
  /* The client's endpoint ids go on the wire indirect: an endpoint UCX
   * dropped after its worker died is then looked up as missing (the
   * receive of a payload it announced fails) instead of through a
   * dangling pointer, which asserted in ucp_rndv_receive (UCX 1.13 sends
   * pointers in mode NONE). Not the worker's: with indirect ids UCX keeps
   * each endpoint's requests on a list and asserts when a worker is
   * destroyed with one left, and a killed client's rendezvous sends stay
   * outstanding for good (abandon_sends). An operator's
   * UCX_PROTO_INDIRECT_ID wins. */
  ucp_config_t *config = NULL;
  ucs_status_t st = ucp_config_read(NULL, NULL, &config);
  if (st == UCS_OK && indirect_ids && getenv("UCX_PROTO_INDIRECT_ID") == NULL)
    (void)ucp_config_modify(config, "PROTO_INDIRECT_ID", "on");
  st = ucp_init(&p, st == UCS_OK ? config : NULL, ctx);
  if (config != NULL)
    ucp_config_release(config);
  if (st != UCS_OK)
    return ferry__seterr(err, FERRY_EIO, "transport ucx: ucp_init: %s",
                         ucs_status_string(st));
  ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                            .thread_mode = UCS_THREAD_MODE_SINGLE};
  st = ucp_worker_create(*ctx, &wp, worker);
  if (st != UCS_OK) {
    ucp_cleanup(*ctx);
    return ferry__seterr(err, FERRY_EIO,
                         "transport ucx: ucp_worker_create: %s",
                         ucs_status_string(st));
  }
  return 0;
}

static int set_am_handler(ucp_worker_h w, unsigned id, ucp_am_recv_callback_t cb,
                          void *arg) {
  ucp_am_handler_param_t hp = {
      .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID |
                    UCP_AM_HANDLER_PARAM_FIELD_CB |
                    UCP_AM_HANDLER_PARAM_FIELD_ARG |
                    UCP_AM_HANDLER_PARAM_FIELD_FLAGS,
      .id = id,
      .flags = UCP_AM_FLAG_WHOLE_MSG,
      .cb = cb,
      .arg = arg};
  return ucp_worker_set_am_recv_handler(w, &hp) == UCS_OK ? 0 : -1;
}

/* ======================================================================== */
/* Worker side                                                               */
/* ======================================================================== */

typedef struct ustream_s ustream_t;

typedef struct uregion_s {
  struct uregion_s *next;
  uintptr_t start, end;
  ucp_mem_h memh;
} uregion_t;

typedef struct userver_s {
  ferry_transport_server_t base;
  ferry_transport_open_cb on_open;
  void *user;
  ucp_context_h ctx;
  ucp_worker_h worker;
  ucp_address_t *addr;
  size_t addr_len;
  uv_poll_t poll;
  uv_idle_t kick;
  uv_timer_t timer;
  int handles; /* open uv handles */
  bool closing;
  ustream_t *streams;
  uregion_t *regions;
  /* Sends whose every AM went out inside ucp_am_send_nbx: they end from
   * the next sweep, so that send() never calls on_sent itself. */
  struct usend_s *done_now;
  /* Sends given up with their stream (their chunks released): UCP may
   * still complete them; freed then or after ucp_worker_destroy. */
  struct usend_s *abandoned;
  bool stopping;
  ferry_transport_done_cb done;
  void *done_arg;
} userver_t;

struct ustream_s {
  ferry_transport_stream_t base;
  ustream_t *next;
  userver_t *srv;
  ferry_rpc_call_t *call; /* the control call; NULL once answered */
  uint8_t *client_addr;
  size_t client_addr_len;
  uint64_t id; /* the client's stream id */
  ucp_ep_h ep;
  void *close_req; /* ucp_ep_close_nbx in progress */
  ferry_transport_sent_cb on_sent;
  ferry_transport_end_cb on_end;
  void *arg;
  bool accepted, ended, end_told, finished, end_sent;
  unsigned outstanding; /* sends not completed */
  struct usend_s *sends; /* those of them UCP still holds */
  uint64_t seq;
  int fin_status;
  char *fin_msg;
  /* ucp_ep_create to the client's address failed (e.g. its shared memory
   * is another user's): the call is answered UNAVAILABLE with this text,
   * whatever the worker finishes with, so the client learns at once and
   * (in auto mode) falls back to gRPC for this worker. */
  char *unreachable;
  int64_t grace_until; /* ended: force the close after this */
  amhdr_t end_h;       /* AM_END's header, read by UCP until the close */
};

/* One send: one or two AM requests and the header copy. */
typedef struct usend_s {
  struct usend_s *next; /* on srv->done_now */
  struct usend_s *lprev, *lnext; /* on s->sends or srv->abandoned */
  userver_t *srv;
  ustream_t *s; /* NULL: abandoned */
  int pending; /* AMs posted whose completion callback is still to come */
  bool failed;
  bool quiet; /* send() returned an error: no on_sent */
  amhdr_t h;  /* UCP reads the AM header until completion */
  void (*release)(void *);
  void *release_arg;
  size_t hdr_len;
  uint8_t hdr[];
} usend_t;

/* Runs progress and the sweep once more from the loop (never from inside
 * a UCX callback: those only mark and kick). */
static void on_kick(uv_idle_t *h);

static void srv_kick(userver_t *srv) {
  if (!srv->closing)
    uv_idle_start(&srv->kick, on_kick);
}

static void stream_end(ustream_t *s) {
  if (s->ended)
    return;
  s->ended = true;
  s->grace_until = mono_ms() + GRACE_MS;
  if (s->accepted && !s->finished && !s->end_told) {
    s->end_told = true;
    if (s->on_end != NULL)
      s->on_end(&s->base, s->arg);
  }
}

static void on_call_cancel(ferry_rpc_call_t *call, void *arg) {
  ustream_t *s = arg;
  (void)call;
  stream_end(s);
  srv_kick(s->srv);
}

static void usend_done(usend_t *u) {
  ustream_t *s = u->s;
  u->release(u->release_arg);
  s->outstanding--;
  bool ok = !u->failed, quiet = u->quiet;
  ferry__free(u);
  if (!ok)
    stream_end(s);
  if (!s->finished && !quiet && s->on_sent != NULL)
    s->on_sent(&s->base, ok, s->arg);
  srv_kick(s->srv);
}

static void send_link(usend_t **head, usend_t *u) {
  u->lprev = NULL;
  u->lnext = *head;
  if (*head != NULL)
    (*head)->lprev = u;
  *head = u;
}

static void send_unlink(usend_t **head, usend_t *u) {
  if (u->lprev != NULL)
    u->lprev->lnext = u->lnext;
  else
    *head = u->lnext;
  if (u->lnext != NULL)
    u->lnext->lprev = u->lprev;
}

static void am_sent(void *req, ucs_status_t st, void *user) {
  usend_t *u = user;
  if (u->s == NULL) { /* given up: its chunk went back long ago */
    ucp_request_free(req);
    if (--u->pending == 0) {
      send_unlink(&u->srv->abandoned, u);
      ferry__free(u);
    }
    return;
  }
  if (st != UCS_OK) {
    if (!u->s->ended)
      FERRY_LOG(FERRY_LOG_DEBUG, "transport ucx: stream %llu: send: %s",
                (unsigned long long)u->s->id, ucs_status_string(st));
    u->failed = true;
  }
  ucp_request_free(req);
  if (--u->pending == 0) {
    send_unlink(&u->s->sends, u);
    usend_done(u);
  }
}

/* Gives up a finished stream's sends that UCP still holds, long after
 * its endpoint's drop: a rendezvous payload that a client gone (killed,
 * or its UCP worker destroyed before its releases went out) will never
 * fetch stays outstanding for good on an endpoint in
 * UCP_ERR_HANDLING_MODE_NONE, and its chunk with it: the pool shrank by
 * up to a window per such client, and the stream was never freed (nor
 * the server, at shutdown). Their chunks go back to the pool; the usends
 * stay for UCP's late callbacks, if any. A client cut off for longer
 * than this whose link then heals could still fetch such a payload and
 * get whatever the pool holds there by then; it gave that receive up
 * long before (docs/ARCHITECTURE.md, UCX pitfalls). */
static void abandon_sends(ustream_t *s) {
  FERRY_LOG(FERRY_LOG_WARN, "transport ucx: stream %llu: %u sends still "
            "outstanding %d ms after the endpoint of a stream whose client "
            "is gone was dropped: their chunks go back to the pool",
            (unsigned long long)s->id, s->outstanding, ABANDON_MS);
  while (s->sends != NULL) {
    usend_t *u = s->sends;
    send_unlink(&s->sends, u);
    u->release(u->release_arg);
    u->s = NULL;
    send_link(&s->srv->abandoned, u);
    s->outstanding--;
  }
}

static ucp_mem_h region_find(userver_t *srv, const void *ptr, size_t len) {
  uintptr_t a = (uintptr_t)ptr;
  for (uregion_t *r = srv->regions; r != NULL; r = r->next)
    if (a >= r->start && a + len <= r->end)
      return r->memh;
  return NULL;
}

/* Posts one AM; returns 0 (done at once, or its completion follows in
 * am_sent and u->pending counts it) or an error.
 *
 * No UCP_OP_ATTR_FLAG_NO_IMM_CMPL: with it, UCX 1.13 runs the callback of
 * an AM that went out at once inside ucp_am_send_nbx (then returns the
 * request it freed), before u->pending counted it. A chunk whose header
 * and eager payload both went out at once (payloads under RNDV_MIN on a
 * connected endpoint) took pending to -1 and back to 0 and never ended:
 * no release, no on_sent, and after WINDOW of them the stream stalled for
 * good (integration/unreachable-ucx: 288 to 384 of 1200 records). An AM
 * done at once now returns NULL and is simply not counted. */
static int post_am(ustream_t *s, usend_t *u, unsigned id, const amhdr_t *h,
                   const void *data, size_t len, uint32_t flags,
                   ucp_mem_h memh) {
  ucp_request_param_t p = {
      .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                      UCP_OP_ATTR_FIELD_USER_DATA |
                      UCP_OP_ATTR_FIELD_FLAGS |
                      (memh != NULL ? UCP_OP_ATTR_FIELD_MEMH : 0),
      .cb.send = am_sent,
      .user_data = u,
      .flags = flags,
      .memh = memh};
  void *req = ucp_am_send_nbx(s->ep, id, h, sizeof(*h), data, len, &p);
  if (UCS_PTR_IS_ERR(req)) {
    FERRY_LOG(FERRY_LOG_DEBUG, "transport ucx: stream %llu: am %u: %s",
              (unsigned long long)s->id, id,
              ucs_status_string(UCS_PTR_STATUS(req)));
    return FERRY_ECANCELED;
  }
  if (req != NULL)
    u->pending++;
  return 0;
}

static void ep_closed(void *req, ucs_status_t st, void *user) {
  ustream_t *s = user;
  (void)st;
  ucp_request_free(req);
  s->close_req = NULL;
  srv_kick(s->srv);
}

/* Starts closing the endpoint, flushed; or, where the peer ended
 * (`drop`), drops it: UCX refuses a forced close in mode NONE (see the
 * top of this file). */
static void stream_close_ep(ustream_t *s, bool drop) {
  if (s->ep == NULL || s->close_req != NULL)
    return;
  if (drop) {
    s->ep = NULL;
    return;
  }
  ucp_request_param_t p = {
      .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
      .cb.send = ep_closed,
      .user_data = s};
  void *req = ucp_ep_close_nbx(s->ep, &p);
  s->ep = NULL;
  if (UCS_PTR_IS_PTR(req))
    s->close_req = req;
}

static void stream_answer(ustream_t *s) {
  if (s->call == NULL)
    return;
  ferry_rpc_call_t *call = s->call;
  s->call = NULL;
  if (s->unreachable != NULL)
    ferry__rpc_stream_finish(call, FERRY_RPC_UNAVAILABLE, s->unreachable);
  else if (!s->accepted && s->fin_status != FERRY_RPC_OK)
    ferry__rpc_reply_error(call, s->fin_status, s->fin_msg);
  else
    ferry__rpc_stream_finish(call, s->fin_status, s->fin_msg);
}

/* A finished stream, from the sweep: sends END once the last send
 * completed, closes the endpoint, answers the call. True when it can be
 * freed. */
static void send_end(ustream_t *s);

static bool stream_complete(ustream_t *s, int64_t now) {
  /* A finished stream whose call ended (the client cancelled, died, or the
   * gRPC server is shutting down) is answered now, whichever of the two
   * came first: nobody listens for its status, and the server's shutdown
   * waits for every answer. Its sends may never complete: a rendezvous
   * payload that a dead client will never fetch stays outstanding on a
   * UCP_ERR_HANDLING_MODE_NONE endpoint, so the answer must not wait for
   * them. */
  if (s->ended)
    stream_answer(s);
  /* A stream ended with an error (replaced by a newer one, cancelled)
   * tells the client at once: a live client that holds our payloads
   * without reading (a stalled trainer) releases them on AM_END, which
   * completes these sends; nothing else on the worker's side can. */
  if (s->outstanding > 0 && s->fin_status != FERRY_RPC_OK)
    send_end(s);
  if (s->outstanding > 0) {
    /* An ended stream's sends wait for a live client's release; after the
     * grace period the endpoint is dropped, and some time after that they
     * are given up. */
    if (s->ended && now >= s->grace_until)
      stream_close_ep(s, true);
    if (!s->ended || s->ep != NULL || s->close_req != NULL ||
        now < s->grace_until + ABANDON_MS)
      return false;
    abandon_sends(s);
    if (s->outstanding > 0) /* ended at once: the next sweep ends them */
      return false;
  }
  send_end(s);
  if (s->ep != NULL)
    stream_close_ep(s, s->ended);
  if (s->ep != NULL || s->close_req != NULL)
    return false;
  stream_answer(s);
  return true;
}

/* AM_END with the status, once. */
static void send_end(ustream_t *s) {
  if (s->ep != NULL && !s->ended && !s->end_sent) {
    s->end_sent = true;
    s->end_h = (amhdr_t){.stream_id = s->id, .seq = s->seq,
                         .status = s->fin_status};
    const char *msg = s->fin_msg != NULL ? s->fin_msg : "";
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                             .flags = UCP_AM_SEND_FLAG_EAGER};
    void *req = ucp_am_send_nbx(s->ep, AM_END, &s->end_h, sizeof(s->end_h), msg,
                                strlen(msg), &p);
    /* Completes on its own (fin_msg lives until the free, after the
     * close's flush). */
    if (UCS_PTR_IS_PTR(req))
      ucp_request_free(req);
  }
}

static void srv_progress(userver_t *srv) {
  for (;;) {
    while (ucp_worker_progress(srv->worker) != 0) {
    }
    if (ucp_worker_arm(srv->worker) != UCS_ERR_BUSY)
      break;
  }
}

static void srv_free_now(userver_t *srv);

/* Progress, then the finished streams' next steps; frees what is done. */
static void srv_sweep(userver_t *srv) {
  int64_t now = mono_ms();
  srv_progress(srv);
  /* Sends that went out at once end here, before their streams are looked
   * at (each still counts in its stream's outstanding). */
  while (srv->done_now != NULL) {
    usend_t *u = srv->done_now;
    srv->done_now = u->next;
    usend_done(u);
  }
  for (ustream_t **pp = &srv->streams; *pp != NULL;) {
    ustream_t *s = *pp;
    if (s->finished && stream_complete(s, now)) {
      *pp = s->next;
      ferry__free(s->client_addr);
      ferry__free(s->fin_msg);
      ferry__free(s->unreachable);
      ferry__free(s);
    } else {
      pp = &s->next;
    }
  }
  srv_progress(srv);
  if (srv->stopping && srv->streams == NULL)
    srv_free_now(srv);
}

static void on_kick(uv_idle_t *h) {
  uv_idle_stop(h);
  srv_sweep(h->data);
}

static void on_poll(uv_poll_t *h, int status, int events) {
  (void)status;
  (void)events;
  srv_sweep(h->data);
}

static void on_timer(uv_timer_t *h) { srv_sweep(h->data); }

static void handle_closed(uv_handle_t *h) {
  userver_t *srv = h->data;
  if (--srv->handles > 0)
    return;
  ucp_worker_release_address(srv->worker, srv->addr);
  ucp_worker_destroy(srv->worker);
  ucp_cleanup(srv->ctx);
  while (srv->abandoned != NULL) {
    usend_t *u = srv->abandoned;
    srv->abandoned = u->lnext;
    ferry__free(u);
  }
  ferry_transport_done_cb done = srv->done;
  void *arg = srv->done_arg;
  ferry__free(srv);
  if (done != NULL)
    done(arg);
}

/* Every stream is gone: unmap the pool, close the handles (the last close
 * destroys the UCP worker and calls done). */
static void srv_free_now(userver_t *srv) {
  if (srv->closing)
    return;
  srv->closing = true;
  while (srv->regions != NULL) {
    uregion_t *r = srv->regions;
    srv->regions = r->next;
    ucp_mem_unmap(srv->ctx, r->memh);
    ferry__free(r);
  }
  uv_poll_stop(&srv->poll);
  uv_idle_stop(&srv->kick);
  uv_timer_stop(&srv->timer);
  uv_close((uv_handle_t *)&srv->poll, handle_closed);
  uv_close((uv_handle_t *)&srv->kick, handle_closed);
  uv_close((uv_handle_t *)&srv->timer, handle_closed);
}

static void on_call(ferry_rpc_call_t *call, const uint8_t *req, size_t len,
                    void *user) {
  userver_t *srv = user;
  ferry_transport_open_t o;
  Ferry__V1__StreamChunksRequest *m = ferry__transport_request(call, req,
                                                               len, &o);
  if (m == NULL)
    return;
  if (m->transport_address.len == 0 || m->transport_address.len > 65536) {
    ferry__transport_request_free(m);
    ferry__rpc_reply_error(call, FERRY_RPC_INVALID_ARGUMENT,
                           "StreamChunksUcx: transport_address missing or over "
                           "64 KiB");
    return;
  }
  if (srv->stopping) {
    ferry__transport_request_free(m);
    ferry__rpc_reply_error(call, FERRY_RPC_UNAVAILABLE, "worker shutting down");
    return;
  }
  ustream_t *s = ferry__calloc(1, sizeof(*s));
  uint8_t *a = ferry__malloc(m->transport_address.len);
  if (s == NULL || a == NULL) {
    ferry__free(s);
    ferry__free(a);
    ferry__transport_request_free(m);
    ferry__rpc_reply_error(call, FERRY_RPC_INTERNAL, "out of memory");
    return;
  }
  memcpy(a, m->transport_address.data, m->transport_address.len);
  s->base.ops = &ferry__transport_ucx_server;
  s->base.server = &srv->base;
  s->srv = srv;
  s->call = call;
  s->client_addr = a;
  s->client_addr_len = m->transport_address.len;
  s->id = m->transport_stream_id;
  s->next = srv->streams;
  srv->streams = s;
  srv->on_open(&s->base, &o, srv->user);
  ferry__transport_request_free(m);
}

static int u_server_new(const ferry_transport_server_config_t *cfg,
                        ferry_transport_server_t **out, ferry_error_t *err) {
  *out = NULL;
  if (cfg->rpc_server == NULL || cfg->on_open == NULL || cfg->loop == NULL)
    return ferry__seterr(err, FERRY_EINVAL, "transport ucx: needs the "
                         "worker's loop and gRPC server");
  userver_t *srv = ferry__calloc(1, sizeof(*srv));
  if (srv == NULL)
    return ferry__seterr(err, FERRY_ENOMEM, "transport ucx: out of memory");
  srv->base.ops = &ferry__transport_ucx_server;
  srv->on_open = cfg->on_open;
  srv->user = cfg->user;
  int rc = ucx_open(&srv->ctx, &srv->worker, false, err);
  if (rc != 0) {
    ferry__free(srv);
    return rc;
  }
  int efd = -1;
  ucs_status_t st = ucp_worker_get_address(srv->worker, &srv->addr,
                                           &srv->addr_len);
  if (st == UCS_OK)
    st = ucp_worker_get_efd(srv->worker, &efd);
  if (st != UCS_OK) {
    rc = ferry__seterr(err, FERRY_EIO, "transport ucx: worker address or "
                       "event fd: %s", ucs_status_string(st));
    goto fail;
  }
  rc = ferry__rpc_server_register(cfg->rpc_server, METHOD,
                                  FERRY_RPC_SERVER_STREAM, on_call, srv, err);
  if (rc != 0)
    goto fail;
  uv_poll_init(cfg->loop, &srv->poll, efd);
  uv_idle_init(cfg->loop, &srv->kick);
  uv_timer_init(cfg->loop, &srv->timer);
  srv->poll.data = srv->kick.data = srv->timer.data = srv;
  srv->handles = 3;
  uv_poll_start(&srv->poll, UV_READABLE, on_poll);
  uv_timer_start(&srv->timer, on_timer, 50, 50);
  /* The timer alone must not keep the loop alive. */
  uv_unref((uv_handle_t *)&srv->timer);
  uv_unref((uv_handle_t *)&srv->poll);
  srv_progress(srv);
  FERRY_LOG(FERRY_LOG_INFO, "transport ucx: serving with UCX %s (%zu-byte "
            "worker address)", ucp_get_version_string(), srv->addr_len);
  *out = &srv->base;
  return 0;
fail:
  if (srv->addr != NULL)
    ucp_worker_release_address(srv->worker, srv->addr);
  ucp_worker_destroy(srv->worker);
  ucp_cleanup(srv->ctx);
  ferry__free(srv);
  return rc;
}

static const void *u_server_address(ferry_transport_server_t *base,
                                    size_t *len) {
  userver_t *srv = (userver_t *)base;
  *len = srv->addr_len;
  return srv->addr;
}

static void u_server_shutdown(ferry_transport_server_t *base,
                              ferry_transport_done_cb done, void *arg) {
  userver_t *srv = (userver_t *)base;
  srv->stopping = true;
  srv->done = done;
  srv->done_arg = arg;
  for (ustream_t *s = srv->streams, *next; s != NULL; s = next) {
    next = s->next;
    stream_end(s);
    s->grace_until = 0; /* no grace: drop at once */
  }
  srv_kick(srv);
}

static int u_mem_map(ferry_transport_server_t *base, void *ptr, size_t len,
                     void **memh, ferry_error_t *err) {
  userver_t *srv = (userver_t *)base;
  uregion_t *r = ferry__calloc(1, sizeof(*r));
  if (r == NULL)
    return ferry__seterr(err, FERRY_ENOMEM, "transport ucx: out of memory");
  ucp_mem_map_params_t mp = {.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS |
                                           UCP_MEM_MAP_PARAM_FIELD_LENGTH,
                             .address = ptr,
                             .length = len};
  ucs_status_t st = ucp_mem_map(srv->ctx, &mp, &r->memh);
  if (st != UCS_OK) {
    ferry__free(r);
    return ferry__seterr(err, FERRY_EIO, "transport ucx: ucp_mem_map of "
                         "%zu bytes: %s", len, ucs_status_string(st));
  }
  r->start = (uintptr_t)ptr;
  r->end = r->start + len;
  r->next = srv->regions;
  srv->regions = r;
  *memh = r;
  return 0;
}

static void u_mem_unmap(ferry_transport_server_t *base, void *memh) {
  userver_t *srv = (userver_t *)base;
  for (uregion_t **pp = &srv->regions; *pp != NULL; pp = &(*pp)->next)
    if (*pp == memh) {
      uregion_t *r = *pp;
      *pp = r->next;
      ucp_mem_unmap(srv->ctx, r->memh);
      ferry__free(r);
      return;
    }
}

static void u_accept(ferry_transport_stream_t *base,
                     ferry_transport_sent_cb on_sent,
                     ferry_transport_end_cb on_end, void *arg) {
  ustream_t *s = (ustream_t *)base;
  s->on_sent = on_sent;
  s->on_end = on_end;
  s->arg = arg;
  s->accepted = true;
  ucp_ep_params_t ep = {
      .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                    UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
      .address = (const ucp_address_t *)s->client_addr,
      .err_mode = UCP_ERR_HANDLING_MODE_NONE};
  ucs_status_t st = ucp_ep_create(s->srv->worker, &ep, &s->ep);
  if (st != UCS_OK) {
    char why[160];
    snprintf(why, sizeof(why), "the worker cannot reach the client's UCX "
             "address: %s", ucs_status_string(st));
    FERRY_LOG(FERRY_LOG_WARN, "transport ucx: stream %llu: %s",
              (unsigned long long)s->id, why);
    s->unreachable = ferry__strdup(why);
    s->ep = NULL;
    stream_end(s);
    return;
  }
  /* on_end runs now if the call already ended. */
  ferry__rpc_call_on_cancel(s->call, on_call_cancel, s);
}

static int u_send(ferry_transport_stream_t *base,
                  const ferry_transport_send_t *m) {
  ustream_t *s = (ustream_t *)base;
  if (!s->accepted || s->finished || s->outstanding >= WINDOW || m->n == 0 ||
      m->n > FERRY_TRANSPORT_MAX_PIECES) {
    m->release(m->release_arg);
    return FERRY_EINVAL;
  }
  if (s->ended || s->ep == NULL) {
    m->release(m->release_arg);
    return FERRY_ECANCELED;
  }
  /* pieces[n-1] is the payload when n > 1; the rest is the header. */
  size_t nh = m->n > 1 ? m->n - 1 : 1, hlen = 0;
  for (size_t i = 0; i < nh; i++)
    hlen += m->pieces[i].len;
  const ferry_transport_piece_t *pay = m->n > 1 ? &m->pieces[m->n - 1] : NULL;
  size_t prefix = pay == NULL ? 0 : pay->len < PREFIX ? pay->len : PREFIX;
  usend_t *u = ferry__malloc(sizeof(*u) + hlen + prefix);
  if (u == NULL) {
    m->release(m->release_arg);
    return FERRY_ENOMEM;
  }
  *u = (usend_t){.srv = s->srv, .s = s, .release = m->release,
                 .release_arg = m->release_arg, .hdr_len = hlen};
  for (size_t i = 0, off = 0; i < nh; off += m->pieces[i].len, i++)
    memcpy(u->hdr + off, m->pieces[i].ptr, m->pieces[i].len);
  if (prefix > 0)
    memcpy(u->hdr + hlen, pay->ptr, prefix);
  u->h = (amhdr_t){.stream_id = s->id, .seq = s->seq++,
                   .flags = (pay != NULL ? AMF_PAYLOAD : 0) |
                            (uint32_t)prefix << 8};
  int rc = post_am(s, u, AM_HDR, &u->h, u->hdr, hlen + prefix,
                   UCP_AM_SEND_FLAG_EAGER, NULL);
  if (rc == 0 && pay != NULL)
    rc = post_am(s, u, AM_PAY, &u->h, pay->ptr, pay->len,
                 pay->len >= RNDV_MIN ? UCP_AM_SEND_FLAG_RNDV : 0,
                 region_find(s->srv, pay->ptr, pay->len));
  s->outstanding++;
  if (u->pending > 0)
    send_link(&s->sends, u);
  if (rc != 0) {
    u->failed = true;
    if (u->pending == 0) {
      /* Nothing is outstanding (not posted, or the header went out at
       * once): release now, no on_sent. */
      s->outstanding--;
      m->release(m->release_arg);
      ferry__free(u);
    } else {
      /* The header is out: its completion releases; no on_sent. */
      u->quiet = true;
    }
    stream_end(s);
    return FERRY_ECANCELED;
  }
  if (u->pending == 0) {
    /* Both AMs went out at once (eager, connected endpoint): it ends from
     * the sweep the kick below runs, never inside this call. */
    u->next = s->srv->done_now;
    s->srv->done_now = u;
  }
  srv_kick(s->srv);
  return 0;
}

static unsigned u_window(const ferry_transport_stream_t *s) {
  (void)s;
  return WINDOW;
}

static bool u_ended(const ferry_transport_stream_t *base) {
  const ustream_t *s = (const ustream_t *)base;
  return s->ended || (s->call != NULL && ferry__rpc_call_cancelled(s->call));
}

static void u_finish(ferry_transport_stream_t *base, int status,
                     const char *msg) {
  ustream_t *s = (ustream_t *)base;
  s->finished = true;
  s->fin_status = status;
  s->fin_msg = msg != NULL ? ferry__strdup(msg) : NULL;
  /* An ended stream's call is answered now (its peer is gone; the gRPC
   * server's shutdown waits for the answer); the rest in the sweep. */
  if (s->ended || !s->accepted)
    stream_answer(s);
  srv_kick(s->srv);
}

/* ======================================================================== */
/* Client side                                                               */
/* ======================================================================== */

typedef struct ucstream_s ucstream_t;

/* A received chunk: header bytes, then a payload held as a rendezvous
 * descriptor (received on the first copy) or as bytes. */
typedef struct umsg_s {
  struct umsg_s *next;
  uint64_t seq;
  uint8_t *hdr;
  size_t hdr_len;
  bool has_hdr, has_payload, payload_arrived;
  size_t prefix_len; /* the payload's first bytes, after hdr[hdr_len] */
  size_t pay_len;
  void *desc;          /* rendezvous descriptor not received yet */
  uint8_t *pay;        /* payload bytes (eager copy or bounce) */
  bool pay_is_bounce;  /* pay is the stream's bounce buffer (not freed) */
  const uint8_t *direct; /* where the payload was received directly */
  bool pay_failed;
  struct uop_s *ahead; /* the payload's receive, posted ahead of the reader
                          (on a slow link) into a buffer of its own */
} umsg_t;

enum { OP_RECV, OP_RELEASE };
typedef struct uclient_s uclient_t;
typedef struct uop_s {
  struct uop_s *next;
  uclient_t *cl;
  int kind;
  void *desc;
  void *dst;
  size_t len;
  void *own;        /* a buffer the op owns (dst of a fetch ahead) */
  int64_t posted_ms, done_ms;
  atomic_int state; /* OPS_PENDING, OPS_DONE, OPS_ABANDONED */
  ucs_status_t st;
} uop_t;
enum { OPS_PENDING, OPS_DONE, OPS_ABANDONED };

struct uclient_s {
  ferry_transport_client_t base;
  ferry_rpc_options_t opts;
  int peer_timeout_ms;
  int slow_fetch_ms; /* 0: fetch ahead on every link */
  ucp_context_h ctx;
  ucp_worker_h worker;
  ucp_address_t *addr;
  size_t addr_len;
  int efd, wake_fd;
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t op_cv;
  bool stop;
  uop_t *ops, *ops_tail;
  ucstream_t *streams;
  uint64_t next_id;
  /* Receives given up while UCP still held them (a worker cut off). */
  atomic_int abandoned;
};

struct ucstream_s {
  ferry_transport_cstream_t base;
  ucstream_t *next;
  uclient_t *cl;
  uint64_t id;
  char *peer;
  ferry_rpc_channel_t *channel;
  ferry_rpc_stream_t *ctl;
  pthread_cond_t cv;
  /* Chunks by sequence number, ascending: the header and the payload of a
   * chunk may arrive in either order (eager and rendezvous take different
   * paths), so next hands out `deliver` once both are in. */
  umsg_t *msgs;
  umsg_t *out;      /* the chunk handed out by next */
  uint64_t deliver; /* the next sequence number to hand out */
  bool got_end;
  uint64_t end_seq; /* chunks sent before END */
  int end_status;
  char end_msg[512];
  bool cancelled;
  bool peer_dead; /* the control call failed or a payload did not come */
  int final_rc; /* sticky result once ended (0: running) */
  char final_msg[600];
  int64_t ctl_ok_at; /* the call ended OK at this time, END not yet in */
  /* Reader thread: the buffer a payload copied in parts is received into,
   * kept for the next one (a malloc and its page faults per chunk cost
   * more than the copy). One message is read at a time. */
  uint8_t *bounce;
  size_t bounce_cap;
  /* The last payload receive took slow_fetch_ms or more (mu). */
  bool fetch_ahead;
};

static void cl_wake(uclient_t *cl) {
  uint64_t one = 1;
  ssize_t n = write(cl->wake_fd, &one, sizeof(one));
  (void)n;
}

/* Queues an operation for the progress thread (mu held). */
static void op_push_locked(uclient_t *cl, uop_t *op) {
  op->next = NULL;
  if (cl->ops_tail != NULL)
    cl->ops_tail->next = op;
  else
    cl->ops = op;
  cl->ops_tail = op;
}

static void op_drop(uop_t *op);

static void umsg_free(uclient_t *cl, umsg_t *m, bool locked, bool peer_dead) {
  if (m == NULL)
    return;
  if (m->ahead != NULL)
    op_drop(m->ahead);
  /* A dead worker's descriptors are left alone: UCX may have dropped the
   * endpoint they refer to (releasing one then asserts in UCX). */
  if (m->desc != NULL && !peer_dead) {
    uop_t *op = ferry__calloc(1, sizeof(*op));
    if (op != NULL) {
      op->kind = OP_RELEASE;
      op->desc = m->desc;
      if (!locked)
        pthread_mutex_lock(&cl->mu);
      op_push_locked(cl, op);
      if (!locked)
        pthread_mutex_unlock(&cl->mu);
      cl_wake(cl);
    }
  }
  ferry__free(m->hdr);
  if (!m->pay_is_bounce)
    ferry__free(m->pay);
  ferry__free(m);
}

static ucstream_t *stream_find_locked(uclient_t *cl, uint64_t id) {
  for (ucstream_t *s = cl->streams; s != NULL; s = s->next)
    if (s->id == id)
      return s;
  return NULL;
}

/* The chunk `seq` of the stream, made when first heard of (mu held). */
static umsg_t *msg_get_locked(ucstream_t *s, uint64_t seq) {
  umsg_t **pp = &s->msgs;
  while (*pp != NULL && (*pp)->seq < seq)
    pp = &(*pp)->next;
  if (*pp != NULL && (*pp)->seq == seq)
    return *pp;
  if (seq < s->deliver)
    return NULL; /* already handed out */
  umsg_t *m = ferry__calloc(1, sizeof(*m));
  if (m == NULL)
    return NULL;
  m->seq = seq;
  m->next = *pp;
  *pp = m;
  return m;
}

static bool msg_complete(const umsg_t *m) {
  return m->has_hdr && (!m->has_payload || m->payload_arrived);
}

/* Fails the stream with a protocol error (mu held). */
static void proto_error_locked(ucstream_t *s, const char *what) {
  if (s->final_rc == 0) {
    s->final_rc = FERRY_EGRPC_INTERNAL;
    snprintf(s->final_msg, sizeof(s->final_msg),
             "StreamChunksUcx from %s: %s", s->peer, what);
  }
  pthread_cond_broadcast(&s->cv);
}

static ucs_status_t on_am_hdr(void *arg, const void *header, size_t hlen,
                              void *data, size_t len,
                              const ucp_am_recv_param_t *param) {
  uclient_t *cl = arg;
  amhdr_t h;
  if (hlen != sizeof(h) || (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV))
    return UCS_OK; /* not ours; a header is always eager */
  memcpy(&h, header, sizeof(h));
  pthread_mutex_lock(&cl->mu);
  ucstream_t *s = stream_find_locked(cl, h.stream_id);
  if (s == NULL || s->cancelled || s->final_rc != 0 || s->got_end) {
    pthread_mutex_unlock(&cl->mu);
    return UCS_OK;
  }
  umsg_t *m = msg_get_locked(s, h.seq);
  uint8_t *copy = ferry__malloc(len > 0 ? len : 1);
  if (m == NULL || copy == NULL || m->has_hdr) {
    ferry__free(copy);
    proto_error_locked(s, m == NULL || copy == NULL ? "out of memory"
                                                    : "a chunk header twice");
    pthread_mutex_unlock(&cl->mu);
    return UCS_OK;
  }
  if (len > 0)
    memcpy(copy, data, len);
  size_t prefix = (h.flags >> 8) & 0xff;
  if (prefix > len || prefix > PREFIX) {
    ferry__free(copy);
    proto_error_locked(s, "a malformed chunk header");
    pthread_mutex_unlock(&cl->mu);
    return UCS_OK;
  }
  m->hdr = copy;
  m->hdr_len = len - prefix;
  m->prefix_len = prefix;
  m->has_hdr = true;
  m->has_payload = (h.flags & AMF_PAYLOAD) != 0;
  if (msg_complete(m))
    pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&cl->mu);
  return UCS_OK;
}

static ucs_status_t on_am_pay(void *arg, const void *header, size_t hlen,
                              void *data, size_t len,
                              const ucp_am_recv_param_t *param) {
  uclient_t *cl = arg;
  amhdr_t h;
  bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  if (hlen != sizeof(h))
    return UCS_OK;
  memcpy(&h, header, sizeof(h));
  pthread_mutex_lock(&cl->mu);
  ucstream_t *s = stream_find_locked(cl, h.stream_id);
  /* A payload nobody wants is dropped: returning UCS_OK without receiving
   * a rendezvous completes the worker's send. */
  if (s == NULL || s->cancelled || s->final_rc != 0 ||
      (s->got_end && s->end_status != FERRY_RPC_OK)) {
    pthread_mutex_unlock(&cl->mu);
    return UCS_OK;
  }
  umsg_t *m = msg_get_locked(s, h.seq);
  if (m == NULL || m->payload_arrived) {
    proto_error_locked(s, m == NULL ? "out of memory" : "a payload twice");
    pthread_mutex_unlock(&cl->mu);
    return UCS_OK;
  }
  m->pay_len = len;
  m->payload_arrived = true;
  m->has_payload = true;
  ucs_status_t ret = UCS_OK;
  if (rndv) {
    m->desc = data;
    ret = UCS_INPROGRESS; /* kept until copy() or release */
  } else {
    m->pay = ferry__malloc(len > 0 ? len : 1);
    if (m->pay == NULL)
      m->pay_failed = true;
    else if (len > 0)
      memcpy(m->pay, data, len);
  }
  if (msg_complete(m))
    pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&cl->mu);
  return ret;
}

static void drop_queued_locked(ucstream_t *s);

/* The chunk handed out to the reader: a payload it has not started to
 * receive is given back (mu held). A reader blocked before its copy (the
 * trainer holds every batch) would otherwise pin the worker's pool memory
 * for as long as it stalls; its copy then comes up short (a fence). */
static void drop_out_payload_locked(ucstream_t *s) {
  umsg_t *m = s->out;
  if (m == NULL || m->desc == NULL)
    return;
  if (!s->peer_dead) {
    uop_t *op = ferry__calloc(1, sizeof(*op));
    if (op == NULL)
      return; /* kept: released with the message */
    op->kind = OP_RELEASE;
    op->desc = m->desc;
    op_push_locked(s->cl, op);
    cl_wake(s->cl);
  }
  m->desc = NULL;
  m->pay_failed = true;
}

static ucs_status_t on_am_end(void *arg, const void *header, size_t hlen,
                              void *data, size_t len,
                              const ucp_am_recv_param_t *param) {
  uclient_t *cl = arg;
  amhdr_t h;
  if (hlen != sizeof(h) || (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV))
    return UCS_OK;
  memcpy(&h, header, sizeof(h));
  pthread_mutex_lock(&cl->mu);
  ucstream_t *s = stream_find_locked(cl, h.stream_id);
  if (s != NULL && !s->got_end) {
    s->got_end = true;
    s->end_seq = h.seq;
    s->end_status = h.status;
    size_t n = len < sizeof(s->end_msg) - 1 ? len : sizeof(s->end_msg) - 1;
    memcpy(s->end_msg, data, n);
    s->end_msg[n] = '\0';
    /* An error ends the stream now: what is queued is given back (the
     * worker's sends complete), even while the reader is blocked. */
    if (h.status != FERRY_RPC_OK) {
      drop_queued_locked(s);
      drop_out_payload_locked(s);
    }
    pthread_cond_broadcast(&s->cv);
  }
  pthread_mutex_unlock(&cl->mu);
  return UCS_OK;
}

/* A receive ended (progress thread); its waiter is woken by the
 * broadcast after progress, or it gave up and the op is freed here. */
static void op_finish(uop_t *op, ucs_status_t st) {
  op->st = st;
  op->done_ms = mono_ms();
  if (atomic_exchange(&op->state, OPS_DONE) == OPS_ABANDONED) {
    atomic_fetch_sub(&op->cl->abandoned, 1);
    ferry__free(op->own);
    ferry__free(op);
  }
}

/* Gives up a receive nobody will wait for: freed now if it ended, else
 * left to UCP, whose completion frees it with its buffer. */
/* Marks a pending receive abandoned (counted until UCP ends it); false
 * when it had already ended. */
static bool op_abandon(uop_t *op) {
  int state = OPS_PENDING;
  atomic_fetch_add(&op->cl->abandoned, 1);
  if (atomic_compare_exchange_strong(&op->state, &state, OPS_ABANDONED))
    return true;
  atomic_fetch_sub(&op->cl->abandoned, 1);
  return false;
}

static void op_drop(uop_t *op) {
  if (!op_abandon(op)) {
    ferry__free(op->own);
    ferry__free(op);
  }
}

/* A receive of `len` payload bytes from `desc` into `dst`. */
static uop_t *recv_op_new(uclient_t *cl, void *desc, void *dst, size_t len) {
  uop_t *op = ferry__calloc(1, sizeof(*op));
  if (op == NULL)
    return NULL;
  op->cl = cl;
  op->kind = OP_RECV;
  op->desc = desc;
  op->dst = dst;
  op->len = len;
  op->posted_ms = mono_ms();
  return op;
}

static void op_recv_done(void *req, ucs_status_t st, size_t len, void *user) {
  (void)len;
  ucp_request_free(req);
  op_finish(user, st);
}

/* Runs queued operations (progress thread). */
static void run_ops(uclient_t *cl) {
  pthread_mutex_lock(&cl->mu);
  uop_t *op = cl->ops;
  cl->ops = cl->ops_tail = NULL;
  pthread_mutex_unlock(&cl->mu);
  while (op != NULL) {
    uop_t *next = op->next;
    if (op->kind == OP_RELEASE) {
      ucp_am_data_release(cl->worker, op->desc);
      ferry__free(op);
    } else {
      ucp_request_param_t p = {
          .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                          UCP_OP_ATTR_FIELD_USER_DATA,
          .cb.recv_am = op_recv_done,
          .user_data = op};
      void *req = ucp_am_recv_data_nbx(cl->worker, op->desc, op->dst,
                                       op->len, &p);
      op->desc = NULL; /* UCP owns it now */
      if (UCS_PTR_IS_ERR(req))
        op_finish(op, UCS_PTR_STATUS(req));
      else if (req == NULL)
        op_finish(op, UCS_OK);
      /* else op_recv_done marks it */
    }
    op = next;
  }
}

static void *progress_main(void *arg) {
  uclient_t *cl = arg;
  struct pollfd pfd[2] = {{.fd = cl->efd, .events = POLLIN},
                          {.fd = cl->wake_fd, .events = POLLIN}};
  for (;;) {
    run_ops(cl);
    while (ucp_worker_progress(cl->worker) != 0) {
    }
    /* Publish finished receives and free abandoned ones. */
    pthread_mutex_lock(&cl->mu);
    bool stop = cl->stop;
    pthread_cond_broadcast(&cl->op_cv);
    bool more = cl->ops != NULL;
    pthread_mutex_unlock(&cl->mu);
    if (stop)
      break;
    if (more)
      continue;
    if (ucp_worker_arm(cl->worker) == UCS_ERR_BUSY)
      continue;
    if (poll(pfd, 2, 100) > 0 && (pfd[1].revents & POLLIN)) {
      uint64_t v;
      ssize_t n = read(cl->wake_fd, &v, sizeof(v));
      (void)n;
    }
  }
  return NULL;
}

static int u_client_new(const ferry_transport_client_config_t *cfg,
                        ferry_transport_client_t **out, ferry_error_t *err) {
  *out = NULL;
  uclient_t *cl = ferry__calloc(1, sizeof(*cl));
  if (cl == NULL)
    return ferry__seterr(err, FERRY_ENOMEM, "transport ucx: out of memory");
  cl->base.ops = &ferry__transport_ucx;
  ferry__transport_client_opts(cfg, &cl->opts);
  cl->peer_timeout_ms = ferry__transport_peer_timeout_ms(cfg);
  int slow = cfg != NULL ? cfg->slow_fetch_ms : 0;
  const char *env = getenv("FERRY_UCX_SLOW_FETCH_MS");
  if (slow == 0 && env != NULL && env[0] != '\0')
    slow = atoi(env);
  cl->slow_fetch_ms = slow == 0 ? AHEAD_MS : slow < 0 ? 0 : slow;
  cl->efd = cl->wake_fd = -1;
  int rc = ucx_open(&cl->ctx, &cl->worker, true, err);
  if (rc != 0) {
    ferry__free(cl);
    return rc;
  }
  ucs_status_t st = ucp_worker_get_address(cl->worker, &cl->addr,
                                           &cl->addr_len);
  if (st == UCS_OK)
    st = ucp_worker_get_efd(cl->worker, &cl->efd);
  if (st != UCS_OK) {
    rc = ferry__seterr(err, FERRY_EIO, "transport ucx: worker address or "
                       "event fd: %s", ucs_status_string(st));
    goto fail;
  }
  if (set_am_handler(cl->worker, AM_HDR, on_am_hdr, cl) != 0 ||
      set_am_handler(cl->worker, AM_PAY, on_am_pay, cl) != 0 ||
      set_am_handler(cl->worker, AM_END, on_am_end, cl) != 0) {
    rc = ferry__seterr(err, FERRY_EIO, "transport ucx: cannot set the "
                       "active message handlers");
    goto fail;
  }
  cl->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (cl->wake_fd < 0) {
    rc = ferry__seterr(err, FERRY_EIO, "transport ucx: eventfd: %s",
                       strerror(errno));
    goto fail;
  }
  uint64_t base_id = 0;
  ferry__rpc_random(&base_id, sizeof(base_id));
  cl->next_id = base_id | 1;
  pthread_mutex_init(&cl->mu, NULL);
  pthread_cond_init(&cl->op_cv, NULL);
  if (pthread_create(&cl->thread, NULL, progress_main, cl) != 0) {
    pthread_mutex_destroy(&cl->mu);
    pthread_cond_destroy(&cl->op_cv);
    rc = ferry__seterr(err, FERRY_EIO, "transport ucx: cannot start the "
                       "progress thread");
    goto fail;
  }
  *out = &cl->base;
  return 0;
fail:
  if (cl->wake_fd >= 0)
    close(cl->wake_fd);
  if (cl->addr != NULL)
    ucp_worker_release_address(cl->worker, cl->addr);
  ucp_worker_destroy(cl->worker);
  ucp_cleanup(cl->ctx);
  ferry__free(cl);
  return rc;
}

static void u_client_free(ferry_transport_client_t *base) {
  uclient_t *cl = (uclient_t *)base;
  if (cl == NULL)
    return;
  pthread_mutex_lock(&cl->mu);
  cl->stop = true;
  pthread_mutex_unlock(&cl->mu);
  cl_wake(cl);
  pthread_join(cl->thread, NULL);
  run_ops(cl); /* releases queued by the last cstream_free */
  while (ucp_worker_progress(cl->worker) != 0) {
  }
  /* Receives given up on a worker cut off (not dead: UCX saw no error)
   * may still end on a slow link; give them a moment. UCX 1.13 asserts
   * when a worker is destroyed with such a receive left on an endpoint
   * (its list of requests, kept with indirect ids), so then the UCP
   * worker is left to the process's exit. */
  int64_t until = mono_ms() + FREE_DRAIN_MS;
  while (atomic_load(&cl->abandoned) > 0 && mono_ms() < until) {
    if (ucp_worker_progress(cl->worker) == 0 &&
        ucp_worker_arm(cl->worker) == UCS_OK) {
      struct pollfd pfd = {.fd = cl->efd, .events = POLLIN};
      (void)poll(&pfd, 1, 10);
    }
  }
  int left = atomic_load(&cl->abandoned);
  if (left > 0) {
    FERRY_LOG(FERRY_LOG_WARN, "transport ucx: %d payload receives from "
              "workers cut off never ended; the client's UCX worker is "
              "left to the process's exit", left);
  } else {
    ucp_worker_release_address(cl->worker, cl->addr);
    ucp_worker_destroy(cl->worker);
    ucp_cleanup(cl->ctx);
  }
  close(cl->wake_fd);
  pthread_mutex_destroy(&cl->mu);
  pthread_cond_destroy(&cl->op_cv);
  ferry__free(cl);
}

static int u_open(ferry_transport_client_t *base,
                  const ferry_transport_peer_t *peer,
                  const ferry_transport_open_t *req,
                  ferry_transport_cstream_t **out, ferry_error_t *err) {
  uclient_t *cl = (uclient_t *)base;
  *out = NULL;
  ucstream_t *s = ferry__calloc(1, sizeof(*s));
  if (s == NULL || (s->peer = ferry__strdup(peer->name)) == NULL) {
    ferry__free(s);
    return ferry__seterr(err, FERRY_ENOMEM, "transport ucx: out of memory");
  }
  s->base.ops = &ferry__transport_ucx;
  s->cl = cl;
  pthread_cond_init(&s->cv, NULL);
  s->fetch_ahead = cl->slow_fetch_ms == 0;
  pthread_mutex_lock(&cl->mu);
  s->id = cl->next_id++;
  s->next = cl->streams;
  cl->streams = s;
  pthread_mutex_unlock(&cl->mu);

  Ferry__V1__StreamChunksRequest m = FERRY__V1__STREAM_CHUNKS_REQUEST__INIT;
  m.job_id = req->job_id;
  m.client_id = req->client_id;
  if (req->secret != NULL) {
    m.client_secret.data = (uint8_t *)req->secret;
    m.client_secret.len = FERRY_CLIENT_SECRET_BYTES;
  }
  m.transport_address.data = (uint8_t *)cl->addr;
  m.transport_address.len = cl->addr_len;
  m.transport_stream_id = s->id;
  size_t len = ferry__v1__stream_chunks_request__get_packed_size(&m);
  uint8_t *buf = ferry__malloc(len);
  int rc = buf == NULL ? ferry__seterr(err, FERRY_ENOMEM,
                                       "transport ucx: out of memory")
                       : 0;
  if (rc == 0) {
    ferry__v1__stream_chunks_request__pack(&m, buf);
    rc = ferry__rpc_channel_new(peer->name, &cl->opts, &s->channel, err);
  }
  if (rc == 0)
    rc = ferry__rpc_stream_open(s->channel, METHOD, buf, len, 0, 0, &s->ctl,
                                err);
  ferry__free(buf);
  if (rc != 0) {
    ferry__transport_cstream_free(&s->base);
    return rc;
  }
  *out = &s->base;
  return 0;
}

/* On a slow link, posts the receives of the next chunks' payloads, each
 * into a buffer of its own, while the reader receives this one's: up to
 * 1 + AHEAD_MAX fetches in flight per stream instead of one, each a round
 * trip. They share the link (recv_wait's timeout allows for that). Only
 * while the peer is not known dead (mu held). */
static void fetch_ahead_locked(ucstream_t *s, const umsg_t *cur) {
  uclient_t *cl = s->cl;
  if (!s->fetch_ahead || s->peer_dead || s->cancelled || s->final_rc != 0)
    return;
  unsigned count = 0;
  size_t bytes = 0;
  uint64_t seq = cur->seq + 1;
  for (umsg_t *n = s->msgs; n != NULL && n->seq == seq; n = n->next, seq++) {
    if (n->ahead != NULL) {
      count++;
      bytes += n->pay_len;
      continue;
    }
    if (n->desc == NULL || n->pay_failed)
      break; /* its payload is not in yet, or not a rendezvous */
    if (count >= AHEAD_MAX || bytes + n->pay_len > AHEAD_BYTES)
      break;
    uint8_t *buf = ferry__malloc(n->pay_len > 0 ? n->pay_len : 1);
    uop_t *op = buf != NULL ? recv_op_new(cl, n->desc, buf, n->pay_len)
                            : NULL;
    if (op == NULL) {
      ferry__free(buf);
      break; /* the reader fetches it when it gets there */
    }
    op->own = buf;
    n->desc = NULL;
    n->ahead = op;
    op_push_locked(cl, op);
    count++;
    bytes += n->pay_len;
  }
  if (count > 0)
    cl_wake(cl);
}

/* When a payload fetched ahead last arrived on the stream (mu held). */
static int64_t ahead_heard_locked(const ucstream_t *s) {
  int64_t heard = 0;
  for (const umsg_t *m = s->msgs; m != NULL; m = m->next)
    if (m->ahead != NULL && atomic_load(&m->ahead->state) == OPS_DONE &&
        m->ahead->done_ms > heard)
      heard = m->ahead->done_ms;
  return heard;
}

/* Waits for a payload receive (mu not held). True when it arrived; on a
 * timeout the op is left to UCP. The peer timeout runs from now, and is
 * renewed while payloads fetched ahead on the same stream keep arriving:
 * those share the link with this one, which then takes longer, but the
 * peer is alive. */
static bool recv_wait(ucstream_t *s, uop_t *op, bool *gave_up,
                      ucs_status_t *st) {
  uclient_t *cl = s->cl;
  int64_t until = mono_ms() + cl->peer_timeout_ms;
  pthread_mutex_lock(&cl->mu);
  while (atomic_load(&op->state) == OPS_PENDING) {
    if (mono_ms() >= until) {
      int64_t heard = ahead_heard_locked(s);
      if (heard + cl->peer_timeout_ms <= mono_ms())
        break;
      until = heard + cl->peer_timeout_ms;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 50 * 1000000;
    if (ts.tv_nsec >= 1000000000) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000;
    }
    pthread_cond_timedwait(&cl->op_cv, &cl->mu, &ts);
  }
  *gave_up = op_abandon(op);
  *st = *gave_up ? UCS_ERR_TIMED_OUT : op->st;
  bool ok = !*gave_up && op->st == UCS_OK;
  if (ok)
    s->fetch_ahead = op->done_ms - op->posted_ms >= cl->slow_fetch_ms;
  pthread_mutex_unlock(&cl->mu);
  return ok;
}

static size_t msg_copy(const ferry_transport_msg_t *mv, size_t off,
                       void *dst, size_t n) {
  ucstream_t *s = mv->impl_[0];
  umsg_t *m = mv->impl_[1];
  uclient_t *cl = s->cl;
  size_t total = m->hdr_len + m->pay_len, done = 0;
  if (off >= total)
    return 0;
  if (n > total - off)
    n = total - off;
  uint8_t *d = dst;
  if (off < m->hdr_len) {
    size_t k = m->hdr_len - off < n ? m->hdr_len - off : n;
    memcpy(d, m->hdr + off, k);
    done = k;
  }
  if (done == n)
    return n;
  size_t poff = off + done - m->hdr_len, plen = n - done;
  /* The descriptor (or the receive posted ahead) is taken under mu: AM_END
   * with an error (progress thread) gives back one the reader has not
   * claimed. */
  pthread_mutex_lock(&cl->mu);
  void *desc = m->desc;
  uop_t *ahead = m->ahead;
  bool failed = m->pay_failed;
  /* Reads within the payload's first bytes (the chunk parser's window
   * past the header) come from the prefix copy; one that starts in the
   * header stops after it while the payload is still on the worker: the
   * payload is fetched by the copy that names where it goes. */
  bool pending = desc != NULL || ahead != NULL;
  bool from_prefix = poff + plen <= m->prefix_len || done > 0;
  if (pending && !from_prefix) {
    m->desc = NULL; /* claimed: the receive below owns it */
    m->ahead = NULL;
  }
  pthread_mutex_unlock(&cl->mu);
  if (from_prefix && (pending || failed)) {
    size_t k = poff < m->prefix_len ? m->prefix_len - poff : 0;
    if (k > plen)
      k = plen;
    memcpy(d + done, m->hdr + m->hdr_len + poff, k);
    return done + k;
  }
  if (failed && ahead == NULL)
    return done;
  if (pending) {
    /* The first payload copy: straight into dst when it takes the whole
     * payload, else into a bounce buffer; or from the receive posted
     * ahead. */
    bool direct = ahead == NULL && poff == 0 && plen == m->pay_len;
    uop_t *op = ahead;
    uint8_t *bounce = NULL;
    if (op == NULL) {
      if (!direct && s->bounce_cap < m->pay_len) {
        ferry__free(s->bounce);
        s->bounce = ferry__malloc(m->pay_len);
        s->bounce_cap = s->bounce != NULL ? m->pay_len : 0;
      }
      bounce = direct ? NULL : s->bounce;
      if (direct || bounce != NULL)
        op = recv_op_new(cl, desc, direct ? d + done : bounce, m->pay_len);
      if (op == NULL) {
        pthread_mutex_lock(&cl->mu);
        m->desc = desc; /* released with the message */
        m->pay_failed = true;
        pthread_mutex_unlock(&cl->mu);
        return 0;
      }
    }
    /* This receive (unless it was posted ahead) and the next ones, in
     * one hold of mu. */
    pthread_mutex_lock(&cl->mu);
    if (op != ahead)
      op_push_locked(cl, op);
    fetch_ahead_locked(s, m);
    pthread_mutex_unlock(&cl->mu);
    if (op != ahead)
      cl_wake(cl);
    bool gave_up;
    ucs_status_t st_copy;
    bool ok = recv_wait(s, op, &gave_up, &st_copy);
    uint8_t *own = op->own;
    if (gave_up) {
      /* The peer stopped answering: the op is UCP's now; its completion
       * (or the worker's destroy) frees it. */
      FERRY_LOG(FERRY_LOG_WARN, "transport ucx: %s: a payload of %zu bytes "
                "did not arrive (nothing came for %d ms)", s->peer,
                m->pay_len, cl->peer_timeout_ms);
    } else {
      ferry__free(op);
    }
    if (!ok) {
      if (!gave_up)
        ferry__free(own);
      m->pay_failed = true;
      if (gave_up && bounce != NULL) {
        /* UCP may still write into it: leaked, never reused. */
        s->bounce = NULL;
        s->bounce_cap = 0;
      }
      /* The stream fails at the next next(): the worker is gone or the
       * transfer broke. */
      pthread_mutex_lock(&cl->mu);
      s->peer_dead = true;
      if (s->final_rc == 0) {
        s->final_rc = FERRY_EGRPC_UNAVAILABLE;
        snprintf(s->final_msg, sizeof(s->final_msg),
                 "StreamChunksUcx from %s: a payload of %zu bytes could "
                 "not be received (%s)", s->peer, m->pay_len,
                 gave_up ? "timed out" : ucs_status_string(st_copy));
      }
      pthread_mutex_unlock(&cl->mu);
      return done;
    }
    if (direct) {
      m->direct = d + done;
      return n;
    }
    if (own != NULL) {
      m->pay = own; /* freed with the message */
    } else {
      m->pay = bounce;
      m->pay_is_bounce = true;
    }
  }
  const uint8_t *src = m->pay != NULL ? m->pay : m->direct;
  if (src == NULL)
    return 0;
  if (src + poff != d + done)
    memcpy(d + done, src + poff, plen);
  return n;
}

static void msg_release(ferry_transport_msg_t *mv) {
  ucstream_t *s = mv->impl_[0];
  umsg_t *m = mv->impl_[1];
  if (s != NULL) {
    pthread_mutex_lock(&s->cl->mu);
    if (s->out == m)
      s->out = NULL;
    umsg_free(s->cl, m, true, s->peer_dead);
    pthread_mutex_unlock(&s->cl->mu);
  }
  memset(mv, 0, sizeof(*mv));
}

/* Whether the control call failed (the worker died or was cut off), not
 * counting our own cancel. Reader thread (or free). */
static bool ctl_failed(ucstream_t *s) {
  ferry_rpc_msg_t cm;
  ferry_error_t cerr = {0};
  int rc = ferry__rpc_stream_next(s->ctl, &cm, 0, &cerr);
  if (rc == 0)
    ferry__rpc_msg_release(&cm);
  return rc != 0 && rc != FERRY_ETIMEDOUT && rc != FERRY_EOF &&
         rc != FERRY_EGRPC_CANCELLED;
}

static int u_next(ferry_transport_cstream_t *base, ferry_transport_msg_t *msg,
                  int timeout_ms, ferry_error_t *err) {
  ucstream_t *s = (ucstream_t *)base;
  uclient_t *cl = s->cl;
  memset(msg, 0, sizeof(*msg));
  int64_t until = timeout_ms < 0 ? INT64_MAX : mono_ms() + timeout_ms;
  pthread_mutex_lock(&cl->mu);
  if (s->out != NULL) { /* a message the reader forgot */
    umsg_free(cl, s->out, true, s->peer_dead);
    s->out = NULL;
  }
  for (;;) {
    if (s->final_rc == 0 && s->cancelled) {
      s->final_rc = FERRY_EGRPC_CANCELLED;
      snprintf(s->final_msg, sizeof(s->final_msg),
               "StreamChunksUcx from %s: cancelled", s->peer);
      pthread_mutex_unlock(&cl->mu);
      bool dead = ctl_failed(s);
      ferry__rpc_stream_cancel(s->ctl);
      pthread_mutex_lock(&cl->mu);
      if (dead)
        s->peer_dead = true;
      /* What a live worker waits for: release it now. */
      drop_queued_locked(s);
    }
    if (s->final_rc != 0)
      break;
    umsg_t *m = s->msgs;
    if (m != NULL && m->seq == s->deliver && msg_complete(m)) {
      s->msgs = m->next;
      s->deliver++;
      m->next = NULL;
      s->out = m;
      pthread_mutex_unlock(&cl->mu);
      msg->len = m->hdr_len + m->pay_len;
      msg->copy = msg_copy;
      msg->release = msg_release;
      msg->impl_[0] = s;
      msg->impl_[1] = m;
      return 0;
    }
    if (s->got_end &&
        (s->end_status != FERRY_RPC_OK || s->deliver >= s->end_seq)) {
      if (s->end_status == FERRY_RPC_OK) {
        s->final_rc = FERRY_EOF;
      } else {
        s->final_rc = ferry__rpc_err_from_status(s->end_status);
        snprintf(s->final_msg, sizeof(s->final_msg),
                 "StreamChunksUcx from %s: %s", s->peer, s->end_msg);
      }
      break;
    }
    /* The control call: its end without our END is a failure (the
     * worker died, refused the stream or was cut off). Until the first
     * message came over UCX, the call's connection (TCP, TLS, HTTP/2
     * settings) may still be in progress, and gRPC core advances it only
     * while some thread polls the call's completion queue: then this
     * thread waits there, 5 ms at a time, instead of on s->cv. */
    int64_t left = until - mono_ms();
    int ctl_wait = s->deliver == 0 && s->msgs == NULL && !s->got_end
                       ? (int)(left < 5 ? (left > 0 ? left : 0) : 5)
                       : 0;
    pthread_mutex_unlock(&cl->mu);
    ferry_rpc_msg_t cm;
    ferry_error_t cerr = {0};
    int rc = ferry__rpc_stream_next(s->ctl, &cm, ctl_wait, &cerr);
    if (rc == 0)
      ferry__rpc_msg_release(&cm); /* none are sent; ignore */
    pthread_mutex_lock(&cl->mu);
    if (rc != 0 && rc != FERRY_ETIMEDOUT && s->final_rc == 0 && !s->got_end) {
      if (rc == FERRY_EOF) {
        /* Finished OK: END is on its way over UCX; wait a little. */
        if (s->ctl_ok_at == 0)
          s->ctl_ok_at = mono_ms();
        else if (mono_ms() - s->ctl_ok_at > cl->peer_timeout_ms) {
          s->final_rc = FERRY_EGRPC_UNAVAILABLE;
          snprintf(s->final_msg, sizeof(s->final_msg),
                   "StreamChunksUcx from %s: the stream ended without its "
                   "last message", s->peer);
        }
      } else {
        s->final_rc = rc;
        s->peer_dead = true;
        snprintf(s->final_msg, sizeof(s->final_msg), "%s", cerr.msg);
      }
      if (s->final_rc != 0)
        break;
    }
    int64_t now = mono_ms();
    if (now >= until) {
      pthread_mutex_unlock(&cl->mu);
      return FERRY_ETIMEDOUT;
    }
    if (ctl_wait > 0 && rc == FERRY_ETIMEDOUT)
      continue; /* waited on the call instead */
    int64_t wait = until - now < 50 ? until - now : 50;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += (long)wait * 1000000;
    while (ts.tv_nsec >= 1000000000) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000;
    }
    pthread_cond_timedwait(&s->cv, &cl->mu, &ts);
  }
  int rc = s->final_rc;
  if (rc != FERRY_EOF)
    ferry__seterr(err, rc, "%s", s->final_msg);
  pthread_mutex_unlock(&cl->mu);
  return rc;
}

/* Drops every chunk held (mu held): their rendezvous descriptors are
 * released, which completes the worker's sends. */
static void drop_queued_locked(ucstream_t *s) {
  while (s->msgs != NULL) {
    umsg_t *m = s->msgs;
    s->msgs = m->next;
    umsg_free(s->cl, m, true, s->peer_dead);
  }
}

/* Wakes the reader, whose next returns FERRY_EGRPC_CANCELLED and cancels
 * the control call (the worker's on_end), after looking whether the
 * worker died (the reader owns the call; cstream_free does it otherwise). */
static void u_cancel(ferry_transport_cstream_t *base) {
  ucstream_t *s = (ucstream_t *)base;
  pthread_mutex_lock(&s->cl->mu);
  s->cancelled = true;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->cl->mu);
}

static void u_cstream_free(ferry_transport_cstream_t *base) {
  ucstream_t *s = (ucstream_t *)base;
  if (s == NULL)
    return;
  uclient_t *cl = s->cl;
  /* Did the worker die? Then its descriptors are not released. */
  bool dead = s->ctl != NULL && ctl_failed(s);
  pthread_mutex_lock(&cl->mu);
  s->cancelled = true;
  if (dead)
    s->peer_dead = true;
  for (ucstream_t **pp = &cl->streams; *pp != NULL; pp = &(*pp)->next)
    if (*pp == s) {
      *pp = s->next;
      break;
    }
  drop_queued_locked(s);
  if (s->out != NULL) {
    umsg_free(cl, s->out, true, s->peer_dead);
    s->out = NULL;
  }
  pthread_mutex_unlock(&cl->mu);
  ferry__rpc_stream_free(s->ctl);
  ferry__rpc_channel_free(s->channel);
  pthread_cond_destroy(&s->cv);
  ferry__free(s->bounce);
  ferry__free(s->peer);
  ferry__free(s);
}

const ferry_transport_server_ops_t ferry__transport_ucx_server = {
    .transport = &ferry__transport_ucx,
    .server_new = u_server_new,
    .server_address = u_server_address,
    .server_shutdown = u_server_shutdown,
    .mem_map = u_mem_map,
    .mem_unmap = u_mem_unmap,
    .accept = u_accept,
    .send = u_send,
    .window = u_window,
    .ended = u_ended,
    .finish = u_finish,
};

const ferry_transport_ops_t ferry__transport_ucx = {
    .name = "ucx",
    .caps = FERRY_TRANSPORT_NEEDS_ADDRESS | FERRY_TRANSPORT_ZERO_COPY,
    .priority = 10,
    .client_new = u_client_new,
    .client_free = u_client_free,
    .client_mem_map = NULL,
    .client_mem_unmap = NULL,
    .open = u_open,
    .next = u_next,
    .cancel = u_cancel,
    .cstream_free = u_cstream_free,
};
