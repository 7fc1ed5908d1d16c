/* The gRPC server on a libuv loop.
 *
 * One thread blocks on the completion queue and appends every event to a
 * mutex-protected list, then wakes the loop with uv_async_send. The loop
 * drains the whole list (uv_async_send coalesces) and does everything
 * else: handlers, callbacks and all state changes, so the server state
 * needs no lock.
 *
 * Tags. Each call context carries one tag struct per kind of operation it
 * can have outstanding (request, close, send, status); an event is the
 * tag itself, linked into the hand-off list through its `next` field, so
 * handing an event over never allocates. Each started batch yields exactly
 * one event, so `pending` counts the batches in flight, and a context is
 * freed only when it was answered and `pending` is zero.
 */
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "alloc.h"
#include "ferry/log.h"
#include "metrics.h"
#include "rpc_internal.h"
#include "tsan.h"

enum tag_kind {
  TAG_REQUEST,  /* a requested call arrived (or the request failed) */
  TAG_CLOSE,    /* RECV_CLOSE_ON_SERVER: the call is over */
  TAG_SEND,     /* a streamed message was sent */
  TAG_STATUS,   /* the final status (and unary reply) was sent */
  TAG_SHUTDOWN, /* grpc_server_shutdown_and_notify finished */
  TAG_CQ_END    /* the completion-queue thread is exiting */
};

struct tag {
  enum tag_kind kind;
  int success;
  struct ferry_rpc_call_s *call; /* NULL for server-level tags */
  struct tag *next;              /* link in the hand-off list */
};

struct method {
  char *name;
  ferry_rpc_kind_t kind;
  ferry_rpc_handler_cb handler;
  void *user;
  void *handle; /* grpc_server_register_method's; NULL: unknown methods */
};

struct ferry_rpc_call_s {
  ferry_rpc_server_t *server;
  struct method *method;
  grpc_call *call;
  gpr_timespec deadline;
  grpc_metadata_array md;
  grpc_call_details details; /* unknown methods only */
  grpc_byte_buffer *payload;
  struct tag request_tag, close_tag, send_tag, status_tag;
  int pending;         /* batches started and not yet completed */
  int busy;            /* nesting depth of user callbacks */
  int close_cancelled; /* written by RECV_CLOSE_ON_SERVER */
  bool ended;          /* the close event arrived */
  bool cancelled;      /* ... and said the call ended early */
  bool answered;       /* the handler answered */
  bool md_sent;        /* initial metadata went out */
  bool send_busy;      /* a stream send is outstanding */
  bool status_started; /* the status batch went out */
  ferry_rpc_cancel_cb on_cancel;
  void *cancel_arg;
  ferry_rpc_sent_cb on_sent;
  void *sent_arg;
  grpc_byte_buffer *send_bb;
  /* The answer, kept until its batch completes (or starts, if deferred
   * behind an outstanding send). */
  int status;
  grpc_slice status_details;
  grpc_byte_buffer *reply_bb;
};

enum server_state { S_NEW, S_STARTED, S_STOPPING };

struct ferry_rpc_server_s {
  uv_loop_t *loop;
  uv_async_t async;
  ferry_rpc_options_t opts;
  grpc_server *server;
  grpc_completion_queue *cq;
  pthread_t thread;
  pthread_mutex_t lock; /* guards head and tail only */
  struct tag *head, *tail;
  struct method **methods;
  size_t nmethods, methods_cap;
  struct method unknown;
  struct tag shutdown_tag, cq_end_tag;
  enum server_state state;
  bool shutdown_seen;
  bool grpc_destroyed;
  size_t live_calls; /* call contexts allocated */
  ferry_rpc_done_cb done;
  void *done_arg;
  struct ferry__rpc_health *health;
  struct ferry__rpc_tls_server *tls; /* NULL: plaintext */
};

static void process(ferry_rpc_server_t *s, struct tag *t);

/* ---- The completion-queue thread and the hand-off ---------------------- */

static void hand_off(ferry_rpc_server_t *s, struct tag *t) {
  t->next = NULL;
  pthread_mutex_lock(&s->lock);
  if (s->tail != NULL)
    s->tail->next = t;
  else
    s->head = t;
  s->tail = t;
  pthread_mutex_unlock(&s->lock);
  uv_async_send(&s->async);
}

static void *cq_thread(void *arg) {
  ferry_rpc_server_t *s = arg;
  for (;;) {
    grpc_event ev = grpc_completion_queue_next(
        s->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    if (ev.type == GRPC_QUEUE_SHUTDOWN)
      break;
    if (ev.type != GRPC_OP_COMPLETE)
      continue;
    struct tag *t = ev.tag;
    FERRY_TSAN_ACQUIRE(t);
    t->success = ev.success;
    hand_off(s, t);
  }
  /* The last event: after it the loop joins this thread. */
  hand_off(s, &s->cq_end_tag);
  return NULL;
}

static void on_async(uv_async_t *async) {
  ferry_rpc_server_t *s = async->data;
  pthread_mutex_lock(&s->lock);
  struct tag *t = s->head;
  s->head = s->tail = NULL;
  pthread_mutex_unlock(&s->lock);
  while (t != NULL) {
    struct tag *next = t->next;
    process(s, t);
    t = next;
  }
}

/* ---- Call contexts ----------------------------------------------------- */

static void set_tag(struct tag *t, enum tag_kind kind,
                    struct ferry_rpc_call_s *c) {
  t->kind = kind;
  t->call = c;
  t->success = 0;
  t->next = NULL;
}

static struct ferry_rpc_call_s *call_new(ferry_rpc_server_t *s,
                                         struct method *m) {
  struct ferry_rpc_call_s *c = ferry__calloc(1, sizeof(*c));
  if (c == NULL)
    return NULL;
  c->server = s;
  c->method = m;
  grpc_metadata_array_init(&c->md);
  grpc_call_details_init(&c->details);
  set_tag(&c->request_tag, TAG_REQUEST, c);
  set_tag(&c->close_tag, TAG_CLOSE, c);
  set_tag(&c->send_tag, TAG_SEND, c);
  set_tag(&c->status_tag, TAG_STATUS, c);
  c->status_details = grpc_empty_slice();
  s->live_calls++;
  return c;
}

static void maybe_finish_shutdown(ferry_rpc_server_t *s);

static void call_free(struct ferry_rpc_call_s *c) {
  ferry_rpc_server_t *s = c->server;
  if (c->call != NULL)
    grpc_call_unref(c->call);
  grpc_metadata_array_destroy(&c->md);
  grpc_call_details_destroy(&c->details);
  if (c->payload != NULL)
    grpc_byte_buffer_destroy(c->payload);
  if (c->reply_bb != NULL)
    grpc_byte_buffer_destroy(c->reply_bb);
  grpc_slice_unref(c->status_details);
  ferry__free(c);
  s->live_calls--;
  maybe_finish_shutdown(s);
}

/* Frees an accepted call once it was answered and gRPC holds no tag of it,
 * and never while a user callback of it is still running. */
static void maybe_free(struct ferry_rpc_call_s *c) {
  if (c->busy == 0 && c->answered && c->pending == 0)
    call_free(c);
}

static int start_batch(struct ferry_rpc_call_s *c, const grpc_op *ops,
                       size_t n, struct tag *t) {
  FERRY_TSAN_RELEASE(t);
  grpc_call_error e = grpc_call_start_batch(c->call, ops, n, t, NULL);
  if (e != GRPC_CALL_OK) {
    FERRY_LOG(FERRY_LOG_ERROR, "rpc: %s: grpc_call_start_batch: error %d",
              c->method->name, (int)e);
    return FERRY_EIO;
  }
  c->pending++;
  return 0;
}

static void op_initial_metadata(struct ferry_rpc_call_s *c, grpc_op *op) {
  memset(op, 0, sizeof(*op));
  op->op = GRPC_OP_SEND_INITIAL_METADATA;
  c->md_sent = true;
}

/* Posts one request for a call of method `m`: the request message comes
 * with it for registered methods. */
static int request_call(ferry_rpc_server_t *s, struct method *m) {
  struct ferry_rpc_call_s *c = call_new(s, m);
  grpc_call_error e;
  if (c == NULL)
    return FERRY_ENOMEM;
  FERRY_TSAN_RELEASE(&c->request_tag);
  if (m->handle != NULL)
    e = grpc_server_request_registered_call(s->server, m->handle, &c->call,
                                            &c->deadline, &c->md,
                                            &c->payload, s->cq, s->cq,
                                            &c->request_tag);
  else
    e = grpc_server_request_call(s->server, &c->call, &c->details, &c->md,
                                 s->cq, s->cq, &c->request_tag);
  if (e != GRPC_CALL_OK) {
    FERRY_LOG(FERRY_LOG_ERROR, "rpc: request_call %s: error %d", m->name,
              (int)e);
    call_free(c);
    return FERRY_EIO;
  }
  return 0;
}

/* ---- Answers ----------------------------------------------------------- */

/* ferry_rpc_handled_total{method,code} in the process's registry
 * (metrics.h): every status a server sends. */
static ferry_metric_family_t *handled_family;
static pthread_once_t handled_once = PTHREAD_ONCE_INIT;
static void handled_init(void) {
  handled_family = ferry__metrics_family(
      ferry__metrics_default(), FERRY_METRIC_COUNTER, "ferry_rpc_handled_total",
      "RPCs this daemon answered, by method and gRPC status code.",
      "method,code", 1, NULL, 0);
}

static atomic_bool handled_on;

void ferry__metrics_count_rpcs(bool on) { atomic_store(&handled_on, on); }

static void count_status(const char *method, int status) {
  static const char *const codes[17] = {
      "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
      "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED",
      "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
      "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
      "UNAUTHENTICATED"};
  if (!atomic_load_explicit(&handled_on, memory_order_relaxed))
    return;
  pthread_once(&handled_once, handled_init);
  const char *v[2] = {method,
                      status >= 0 && status < 17 ? codes[status] : "UNKNOWN"};
  ferry__metric_add(ferry__metric_child(handled_family, v), 1);
}

static int start_status(struct ferry_rpc_call_s *c) {
  grpc_op ops[3];
  size_t n = 0;
  c->status_started = true;
  count_status(c->method->name, c->status);
  if (!c->md_sent)
    op_initial_metadata(c, &ops[n++]);
  if (c->reply_bb != NULL) {
    memset(&ops[n], 0, sizeof(ops[n]));
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n++].data.send_message.send_message = c->reply_bb;
  }
  memset(&ops[n], 0, sizeof(ops[n]));
  ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
  ops[n].data.send_status_from_server.status = (grpc_status_code)c->status;
  ops[n++].data.send_status_from_server.status_details = &c->status_details;
  return start_batch(c, ops, n, &c->status_tag);
}

/* Records the handler's answer and sends it, now or after the outstanding
 * send. Takes `reply_bb`. */
static int answer(struct ferry_rpc_call_s *c, int status, const char *msg,
                  grpc_byte_buffer *reply_bb) {
  int rc = 0;
  if (c->answered) {
    if (reply_bb != NULL)
      grpc_byte_buffer_destroy(reply_bb);
    return FERRY_EINVAL;
  }
  c->answered = true;
  c->status = status;
  c->reply_bb = reply_bb;
  grpc_slice_unref(c->status_details);
  c->status_details = grpc_slice_from_copied_string(msg != NULL ? msg : "");
  /* After the call ended nobody listens: skip the batch. */
  if (!c->ended && !c->send_busy)
    rc = start_status(c);
  maybe_free(c);
  return rc;
}

int ferry__rpc_reply(ferry_rpc_call_t *call, const void *bytes, size_t len) {
  if (call->method->kind != FERRY_RPC_UNARY)
    return FERRY_EINVAL;
  grpc_slice slice = grpc_slice_from_copied_buffer(bytes, len);
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&slice, 1);
  grpc_slice_unref(slice);
  return answer(call, GRPC_STATUS_OK, NULL, bb);
}

int ferry__rpc_reply_error(ferry_rpc_call_t *call, int status,
                           const char *msg) {
  if (status == GRPC_STATUS_OK)
    return FERRY_EINVAL;
  return answer(call, status, msg, NULL);
}

int ferry__rpc_stream_finish(ferry_rpc_call_t *call, int status,
                             const char *msg) {
  if (call->method->kind != FERRY_RPC_SERVER_STREAM)
    return FERRY_EINVAL;
  return answer(call, status, msg, NULL);
}

static void free_pieces(const ferry_rpc_piece_t *pieces, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (pieces[i].free_fn != NULL)
      pieces[i].free_fn(pieces[i].free_arg);
}

/* Wraps the pieces into slices (zero-copy unless free_fn is NULL) and one
 * byte buffer. The buffer then owns the pieces. */
static grpc_byte_buffer *pieces_to_bb(const ferry_rpc_piece_t *pieces,
                                      size_t n) {
  grpc_slice stack[8];
  grpc_slice *slices = stack;
  if (n > sizeof(stack) / sizeof(stack[0])) {
    slices = ferry__malloc(n * sizeof(*slices));
    if (slices == NULL)
      return NULL;
  }
  for (size_t i = 0; i < n; i++) {
    const ferry_rpc_piece_t *p = &pieces[i];
    if (p->free_fn == NULL)
      slices[i] = grpc_slice_from_copied_buffer(p->ptr, p->len);
    else {
      FERRY_TSAN_RELEASE(p->free_arg); /* free_fn acquires it */
      slices[i] = grpc_slice_new_with_user_data((void *)p->ptr, p->len,
                                                p->free_fn, p->free_arg);
    }
  }
  /* The byte buffer takes its own reference on every slice. */
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(slices, n);
  for (size_t i = 0; i < n; i++)
    grpc_slice_unref(slices[i]);
  if (slices != stack)
    ferry__free(slices);
  return bb;
}

int ferry__rpc_stream_send(ferry_rpc_call_t *call,
                           const ferry_rpc_piece_t *pieces, size_t n,
                           ferry_rpc_sent_cb on_sent, void *arg) {
  grpc_op ops[2];
  size_t nops = 0;
  int rc = 0;
  if (call->method->kind != FERRY_RPC_SERVER_STREAM || call->answered ||
      call->send_busy)
    rc = FERRY_EINVAL;
  else if (call->ended)
    rc = FERRY_ECANCELED;
  if (rc != 0) {
    free_pieces(pieces, n);
    return rc;
  }
  grpc_byte_buffer *bb = pieces_to_bb(pieces, n);
  if (bb == NULL) {
    free_pieces(pieces, n);
    return FERRY_ENOMEM;
  }
  bool md_was_sent = call->md_sent;
  if (!call->md_sent)
    op_initial_metadata(call, &ops[nops++]);
  memset(&ops[nops], 0, sizeof(ops[nops]));
  ops[nops].op = GRPC_OP_SEND_MESSAGE;
  ops[nops++].data.send_message.send_message = bb;
  rc = start_batch(call, ops, nops, &call->send_tag);
  if (rc != 0) {
    call->md_sent = md_was_sent;
    grpc_byte_buffer_destroy(bb); /* runs the pieces' free_fn */
    return rc;
  }
  call->send_bb = bb;
  call->send_busy = true;
  call->on_sent = on_sent;
  call->sent_arg = arg;
  return 0;
}

void ferry__rpc_call_on_cancel(ferry_rpc_call_t *call, ferry_rpc_cancel_cb cb,
                               void *arg) {
  call->on_cancel = cb;
  call->cancel_arg = arg;
  if (call->cancelled && !call->answered && cb != NULL) {
    call->on_cancel = NULL;
    cb(call, arg);
  }
}

bool ferry__rpc_call_cancelled(const ferry_rpc_call_t *call) {
  return call->cancelled;
}

const char *ferry__rpc_call_method(const ferry_rpc_call_t *call) {
  return call->method->name;
}

/* ---- Events ------------------------------------------------------------ */

static void start_close(struct ferry_rpc_call_s *c) {
  grpc_op op;
  memset(&op, 0, sizeof(op));
  op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
  op.data.recv_close_on_server.cancelled = &c->close_cancelled;
  if (start_batch(c, &op, 1, &c->close_tag) != 0)
    c->ended = c->cancelled = true;
}

static void answer_unknown(struct ferry_rpc_call_s *c) {
  char msg[256];
  char *name = grpc_slice_to_c_string(c->details.method);
  snprintf(msg, sizeof(msg), "unknown method %s", name);
  gpr_free(name);
  answer(c, GRPC_STATUS_UNIMPLEMENTED, msg, NULL);
}

/* Hands the request to the handler as one contiguous buffer: a single
 * slice is passed as is, several (large requests) are joined. */
static void run_handler(struct ferry_rpc_call_s *c) {
  struct method *m = c->method;
  grpc_slice joined = grpc_empty_slice();
  const uint8_t *req = NULL;
  size_t len = 0;
  grpc_byte_buffer *bb = c->payload;
  if (bb != NULL && bb->type == GRPC_BB_RAW &&
      bb->data.raw.compression == GRPC_COMPRESS_NONE &&
      bb->data.raw.slice_buffer.count == 1) {
    req = GRPC_SLICE_START_PTR(bb->data.raw.slice_buffer.slices[0]);
    len = GRPC_SLICE_LENGTH(bb->data.raw.slice_buffer.slices[0]);
  } else if (bb != NULL) {
    grpc_byte_buffer_reader r;
    if (grpc_byte_buffer_reader_init(&r, bb)) {
      joined = grpc_byte_buffer_reader_readall(&r);
      grpc_byte_buffer_reader_destroy(&r);
    }
    req = GRPC_SLICE_START_PTR(joined);
    len = GRPC_SLICE_LENGTH(joined);
  }
  m->handler(c, req != NULL ? req : (const uint8_t *)"", len, m->user);
  grpc_slice_unref(joined);
  if (c->payload != NULL) {
    grpc_byte_buffer_destroy(c->payload);
    c->payload = NULL;
  }
}

static void on_request(ferry_rpc_server_t *s, struct ferry_rpc_call_s *c,
                       int ok) {
  if (!ok) { /* the server is shutting down */
    call_free(c);
    return;
  }
  /* Keep the number of waiting requests constant. If this fails (out of
   * memory, logged), the method has one slot less until restart. */
  if (s->state == S_STARTED)
    request_call(s, c->method);
  start_close(c);
  c->busy++;
  if (c->method->handle == NULL)
    answer_unknown(c);
  else
    run_handler(c);
  c->busy--;
  maybe_free(c);
}

/* The call ended early: tell the handler, once, unless it answered. */
static void cancelled(struct ferry_rpc_call_s *c) {
  ferry_rpc_cancel_cb cb = c->on_cancel;
  c->cancelled = true;
  c->on_cancel = NULL;
  if (cb != NULL && !c->answered) {
    c->busy++;
    cb(c, c->cancel_arg);
    c->busy--;
  }
}

static void on_close(struct ferry_rpc_call_s *c) {
  c->pending--;
  c->ended = true;
  if (c->close_cancelled)
    cancelled(c);
  maybe_free(c);
}

static void on_send(struct ferry_rpc_call_s *c, int ok) {
  ferry_rpc_sent_cb cb = c->on_sent;
  c->pending--;
  c->send_busy = false;
  c->on_sent = NULL;
  grpc_byte_buffer_destroy(c->send_bb);
  c->send_bb = NULL;
  /* A send fails only on a dead call; the close event may come later, but
   * the handler hears of the cancellation first, whatever the order. */
  if (!ok)
    cancelled(c);
  if (cb != NULL && !c->answered) {
    c->busy++;
    cb(c, ok, c->sent_arg);
    c->busy--;
  }
  /* A finish that waited for this send. */
  if (c->answered && !c->status_started && !c->ended)
    start_status(c);
  maybe_free(c);
}

static void on_status(struct ferry_rpc_call_s *c) {
  c->pending--;
  if (c->reply_bb != NULL) {
    grpc_byte_buffer_destroy(c->reply_bb);
    c->reply_bb = NULL;
  }
  maybe_free(c);
}

static void on_closed_handle(uv_handle_t *h) {
  ferry_rpc_server_t *s = h->data;
  ferry_rpc_done_cb done = s->done;
  void *done_arg = s->done_arg;
  for (size_t i = 0; i < s->nmethods; i++) {
    ferry__free(s->methods[i]->name);
    ferry__free(s->methods[i]);
  }
  ferry__free(s->methods);
  ferry__rpc_health_free(s->health);
  ferry__rpc_tls_server_free(s->tls);
  pthread_mutex_destroy(&s->lock);
  ferry__free(s);
  if (done != NULL)
    done(done_arg);
}

static void on_cq_end(ferry_rpc_server_t *s) {
  pthread_join(s->thread, NULL);
  grpc_completion_queue_destroy(s->cq);
  s->cq = NULL;
  uv_close((uv_handle_t *)&s->async, on_closed_handle);
}

static void process(ferry_rpc_server_t *s, struct tag *t) {
  switch (t->kind) {
  case TAG_REQUEST: on_request(s, t->call, t->success); break;
  case TAG_CLOSE: on_close(t->call); break;
  case TAG_SEND: on_send(t->call, t->success); break;
  case TAG_STATUS: on_status(t->call); break;
  case TAG_SHUTDOWN:
    s->shutdown_seen = true;
    maybe_finish_shutdown(s);
    break;
  case TAG_CQ_END: on_cq_end(s); break;
  }
}

/* ---- Life cycle -------------------------------------------------------- */

/* Once gRPC confirmed the shutdown and every call context is gone, the
 * server is destroyed and the queue shut down; the thread then sees
 * GRPC_QUEUE_SHUTDOWN and hands over its last event. */
static void maybe_finish_shutdown(ferry_rpc_server_t *s) {
  if (s->state != S_STOPPING || !s->shutdown_seen || s->live_calls != 0 ||
      s->grpc_destroyed)
    return;
  s->grpc_destroyed = true;
  grpc_server_destroy(s->server);
  s->server = NULL;
  grpc_completion_queue_shutdown(s->cq);
}

/* Undoes the gRPC part of ferry__rpc_server_new when no thread runs. */
static void destroy_unstarted(ferry_rpc_server_t *s) {
  grpc_server_destroy(s->server);
  grpc_completion_queue_shutdown(s->cq);
  while (grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_REALTIME),
                                    NULL)
             .type != GRPC_QUEUE_SHUTDOWN)
    ;
  grpc_completion_queue_destroy(s->cq);
  pthread_mutex_destroy(&s->lock);
}

static void free_on_close(uv_handle_t *h) { ferry__free(h->data); }

int ferry__rpc_server_new(uv_loop_t *loop, const ferry_rpc_options_t *opts,
                          ferry_rpc_server_t **out, ferry_error_t *err) {
  grpc_arg args[FERRY__RPC_MAX_ARGS + 1];
  ferry_rpc_server_t *s;
  size_t nargs;
  int rc;
  *out = NULL;
  s = ferry__calloc(1, sizeof(*s));
  if (s == NULL)
    return ferry__seterr(err, FERRY_ENOMEM, "rpc: out of memory");
  rc = ferry__rpc_options(opts, &s->opts, err);
  if (rc == 0 && s->opts.tls != NULL)
    rc = ferry__rpc_tls_server_new(s->opts.tls, &s->tls, err);
  s->opts.tls = NULL;
  s->opts.bearer_token = NULL;
  if (rc != 0) {
    ferry__free(s);
    return rc;
  }
  s->loop = loop;
  /* gRPC core sets SO_REUSEPORT on listening sockets by default: a second
   * daemon on a taken port would then bind as well and the kernel would
   * share the connections between the two. Ferry wants the bind to fail. */
  nargs = ferry__rpc_channel_args(&s->opts, true, args);
  args[nargs].type = GRPC_ARG_INTEGER;
  args[nargs].key = (char *)GRPC_ARG_ALLOW_REUSEPORT;
  args[nargs].value.integer = 0;
  nargs++;
  grpc_channel_args cargs = {nargs, args};
  s->server = grpc_server_create(&cargs, NULL);
  s->cq = grpc_completion_queue_create_for_next(NULL);
  grpc_server_register_completion_queue(s->server, s->cq, NULL);
  pthread_mutex_init(&s->lock, NULL);
  rc = uv_async_init(loop, &s->async, on_async);
  if (rc != 0) {
    destroy_unstarted(s);
    ferry__rpc_tls_server_free(s->tls);
    ferry__free(s);
    return ferry__seterr(err, FERRY_EIO, "rpc: uv_async_init: %s",
                         uv_strerror(rc));
  }
  s->async.data = s;
  s->unknown.name = "(unknown method)";
  s->unknown.kind = FERRY_RPC_UNARY;
  set_tag(&s->shutdown_tag, TAG_SHUTDOWN, NULL);
  set_tag(&s->cq_end_tag, TAG_CQ_END, NULL);
  if (pthread_create(&s->thread, NULL, cq_thread, s) != 0) {
    destroy_unstarted(s);
    ferry__rpc_tls_server_free(s->tls);
    uv_close((uv_handle_t *)&s->async, free_on_close);
    return ferry__seterr(err, FERRY_EIO, "rpc: cannot start a thread");
  }
  *out = s;
  return 0;
}

int ferry__rpc_server_register(ferry_rpc_server_t *s, const char *method,
                               ferry_rpc_kind_t kind,
                               ferry_rpc_handler_cb handler, void *user,
                               ferry_error_t *err) {
  struct method *m;
  if (s->state != S_NEW || method == NULL || method[0] != '/' ||
      handler == NULL)
    return ferry__seterr(err, FERRY_EINVAL,
                         "rpc: cannot register method %s",
                         method != NULL ? method : "(null)");
  for (size_t i = 0; i < s->nmethods; i++)
    if (strcmp(s->methods[i]->name, method) == 0)
      return ferry__seterr(err, FERRY_EINVAL,
                           "rpc: method %s registered twice", method);
  if (!FERRY__GROW(s->methods, s->methods_cap, s->nmethods + 1, 8))
    return ferry__seterr(err, FERRY_ENOMEM, "rpc: out of memory");
  m = ferry__calloc(1, sizeof(*m));
  if (m == NULL || (m->name = ferry__strdup(method)) == NULL) {
    ferry__free(m);
    return ferry__seterr(err, FERRY_ENOMEM, "rpc: out of memory");
  }
  m->kind = kind;
  m->handler = handler;
  m->user = user;
  m->handle = grpc_server_register_method(
      s->server, m->name, NULL, GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER, 0);
  if (m->handle == NULL) {
    ferry__free(m->name);
    ferry__free(m);
    return ferry__seterr(err, FERRY_EINVAL,
                         "rpc: gRPC refused to register method %s", method);
  }
  s->methods[s->nmethods++] = m;
  return 0;
}

int ferry__rpc_server_start(ferry_rpc_server_t *s, const char *addr, int *port,
                            ferry_error_t *err) {
  int rc = 0;
  if (s->state != S_NEW)
    return ferry__seterr(err, FERRY_EINVAL, "rpc: server already started");
  grpc_server_credentials *creds =
      s->tls != NULL ? ferry__rpc_tls_server_creds(s->tls)
                     : grpc_insecure_server_credentials_create();
  if (creds == NULL)
    return ferry__seterr(err, FERRY_EINVAL,
                         "rpc: gRPC refused the TLS settings for %s", addr);
  int bound = grpc_server_add_http2_port(s->server, addr, creds);
  grpc_server_credentials_release(creds);
  if (bound == 0)
    return ferry__seterr(err, FERRY_EIO,
                         "rpc: cannot listen on %s (the port is taken, or "
                         "the host is not an address of this machine)",
                         addr);
  grpc_server_start(s->server);
  s->state = S_STARTED;
  for (int i = 0; i < s->opts.request_slots && rc == 0; i++) {
    for (size_t j = 0; j < s->nmethods && rc == 0; j++)
      rc = request_call(s, s->methods[j]);
    if (rc == 0)
      rc = request_call(s, &s->unknown);
  }
  if (port != NULL)
    *port = bound;
  if (rc != 0)
    return ferry__seterr(err, rc, "rpc: cannot request calls on %s", addr);
  return 0;
}

void ferry__rpc_server_shutdown(ferry_rpc_server_t *s, ferry_rpc_done_cb done,
                                void *arg) {
  enum server_state was = s->state;
  s->done = done;
  s->done_arg = arg;
  s->state = S_STOPPING;
  if (was == S_NEW) {
    /* Nothing was ever requested or bound: tear down at once. */
    s->shutdown_seen = true;
    maybe_finish_shutdown(s);
    return;
  }
  FERRY_TSAN_RELEASE(&s->shutdown_tag);
  grpc_server_shutdown_and_notify(s->server, s->cq, &s->shutdown_tag);
  grpc_server_cancel_all_calls(s->server);
}

struct ferry__rpc_health **ferry__rpc_server_health(ferry_rpc_server_t *s) {
  return &s->health;
}

void ferry__rpc_server_reload_tls(ferry_rpc_server_t *s) {
  ferry__rpc_tls_server_force(s->tls);
}

const char *ferry__rpc_call_bearer(const ferry_rpc_call_t *call, size_t *len) {
  static const char prefix[] = "Bearer ";
  *len = 0;
  for (size_t i = 0; i < call->md.count; i++) {
    const grpc_metadata *m = &call->md.metadata[i];
    if (grpc_slice_str_cmp(m->key, "authorization") != 0)
      continue;
    size_t n = GRPC_SLICE_LENGTH(m->value);
    const char *v = (const char *)GRPC_SLICE_START_PTR(m->value);
    if (n < sizeof(prefix) - 1 ||
        strncasecmp(v, prefix, sizeof(prefix) - 1) != 0)
      return NULL;
    *len = n - (sizeof(prefix) - 1);
    return v + sizeof(prefix) - 1;
  }
  return NULL;
}
