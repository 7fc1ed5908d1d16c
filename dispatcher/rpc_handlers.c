/* The dispatcher's gRPC glue: the method table, role checks, and the
 * dispatch of a call to the state machine (see rpc_handlers.h; group
 * commit, long polls and registrations are rpc_commit.c, rpc_wait.c and
 * rpc_register.c, below it). */
#include "rpc_handlers.h"

#include "ferry/log.h"
#include "pb_alloc.h"
#include "rpc_commit.h"
#include "rpc_methods.h"
#include "rpc_register.h"
#include "rpc_wait.h"

typedef int (*op_fn)(ferry_disp_service_t *svc, const void *req, void *resp,
                     ferry_arena_t *a, int64_t now, ferry_error_t *err);

typedef struct method_s {
  const char *name;
  const ProtobufCMessageDescriptor *req, *resp;
  op_fn fn;
  size_t max_request; /* bytes; larger requests are refused unread */
} method_t;

static int op_register(ferry_disp_service_t *svc, const void *req, void *resp,
                       ferry_arena_t *a, int64_t now, ferry_error_t *err) {
  return ferry__disp_register_dataset(svc->state, req, resp, a, now, err);
}

static int op_job(ferry_disp_service_t *svc, const void *req, void *resp,
                  ferry_arena_t *a, int64_t now, ferry_error_t *err) {
  return ferry__disp_get_or_create_job(svc->state, req, resp, a, now, err);
}

static int op_client(ferry_disp_service_t *svc, const void *req, void *resp,
                     ferry_arena_t *a, int64_t now, ferry_error_t *err) {
  return ferry__disp_client_heartbeat(svc->state, req, resp, a, now, err);
}

static int op_worker(ferry_disp_service_t *svc, const void *req, void *resp,
                     ferry_arena_t *a, int64_t now, ferry_error_t *err) {
  return ferry__disp_worker_heartbeat(svc->state, req, resp, a, now, err);
}

static int op_status(ferry_disp_service_t *svc, const void *req, void *resp,
                     ferry_arena_t *a, int64_t now, ferry_error_t *err) {
  int rc = ferry__disp_status(svc->state, svc->version, resp, a, now);
  if (rc != 0)
    return ferry__seterr(err, rc, "out of memory");
  /* A job's error names its files: only the status credential (and the
   * job's own clients, through their heartbeats) may read it. A cancel's
   * text ("job J cancelled by the operator") names none. */
  if (!svc->call_sees_errors) {
    Ferry__V1__GetStatusResponse *s = resp;
    for (size_t i = 0; i < s->n_jobs; i++)
      if (s->jobs[i]->error != NULL && s->jobs[i]->error[0] != '\0' &&
          s->jobs[i]->state != FERRY__V1__JOB_STATE__JOB_STATE_CANCELLED)
        s->jobs[i]->error = (char *)"(hidden: needs the status credential)";
  }
  return 0;
}

static int op_drain(ferry_disp_service_t *svc, const void *req, void *resp,
                    ferry_arena_t *a, int64_t now, ferry_error_t *err) {
  return ferry__disp_drain_worker(svc->state, req, resp, a, now, err);
}

static int op_cancel(ferry_disp_service_t *svc, const void *req, void *resp,
                     ferry_arena_t *a, int64_t now, ferry_error_t *err) {
  return ferry__disp_cancel_job(svc->state, req, resp, a, now, err);
}

/* The order is the method index authorize() maps to roles. */
static const method_t methods[] = {
    {FERRY_METHOD_REGISTER_DATASET,
     &ferry__v1__register_dataset_request__descriptor,
     &ferry__v1__register_dataset_response__descriptor, op_register,
     1 << 20},
    {FERRY_METHOD_GET_OR_CREATE_JOB,
     &ferry__v1__get_or_create_job_request__descriptor,
     &ferry__v1__get_or_create_job_response__descriptor, op_job, 64 << 10},
    {FERRY_METHOD_CLIENT_HEARTBEAT,
     &ferry__v1__client_heartbeat_request__descriptor,
     &ferry__v1__client_heartbeat_response__descriptor, op_client,
     8 << 20},
    {FERRY_METHOD_WORKER_HEARTBEAT,
     &ferry__v1__worker_heartbeat_request__descriptor,
     &ferry__v1__worker_heartbeat_response__descriptor, op_worker,
     64 << 20},
    {FERRY_METHOD_GET_STATUS,
     &ferry__v1__get_status_request__descriptor,
     &ferry__v1__get_status_response__descriptor, op_status, 4 << 10},
    {FERRY_METHOD_DRAIN_WORKER,
     &ferry__v1__drain_worker_request__descriptor,
     &ferry__v1__drain_worker_response__descriptor, op_drain, 4 << 10},
    {FERRY_METHOD_CANCEL_JOB,
     &ferry__v1__cancel_job_request__descriptor,
     &ferry__v1__cancel_job_response__descriptor, op_cancel, 4 << 10},
};
_Static_assert(sizeof(methods) / sizeof(methods[0]) ==
                   FERRY_DISP_N_METHODS,
               "one binding per method");

int ferry__disp_rpc_start(ferry_disp_service_t *svc, uv_loop_t *loop) {
  int rc = uv_timer_init(loop, &svc->wait_timer);
  if (rc != 0)
    return rc;
  svc->wait_timer.data = svc;
  svc->loop = loop;
  svc->can_wait = true;
  return 0;
}

static void timer_closed(uv_handle_t *h) { (void)h; }

void ferry__disp_rpc_stop(ferry_disp_service_t *svc) {
  if (!svc->can_wait)
    return;
  svc->can_wait = false;
  while (svc->waiting != NULL)
    ferry__disp_wait_answer(svc, svc->waiting, false);
  /* Registrations in progress: answered now; their work ends without
   * committing, and the loop runs until its after callbacks freed them. */
  ferry__disp_rpc_reg_stop_all(svc);
  uv_close((uv_handle_t *)&svc->wait_timer, timer_closed);
}

/* Role checks. Returns 0 when the call may proceed, else the
 * gRPC status it was answered with. The refusal names no file and no
 * state; the log line says which method and role. */
enum { ROLE_CLIENT, ROLE_WORKER, ROLE_STATUS, ROLE_ADMIN };

static int authorize(ferry_disp_service_t *svc, ferry_rpc_call_t *call,
                     int method) {
  int role = method == 3   ? ROLE_WORKER
             : method == 4 ? ROLE_STATUS
             : method >= 5 ? ROLE_ADMIN
                           : ROLE_CLIENT;
  bool no_tokens = svc->worker_token == NULL && svc->client_token == NULL &&
                   svc->status_token == NULL && svc->admin_token == NULL;
  /* The admin role is open only on a cluster without any token;
   * once any role has one, DrainWorker and CancelJob need the admin token
   * (refused to everyone when --admin-token-file is not given). */
  const char *need = role == ROLE_WORKER   ? svc->worker_token
                     : role == ROLE_CLIENT ? svc->client_token
                     : role == ROLE_STATUS ? svc->status_token
                     : no_tokens           ? NULL
                                           : "";
  size_t n;
  const char *tok = ferry__rpc_call_bearer(call, &n);
  bool w, c, st, adm;
  adm = tok != NULL && svc->admin_token != NULL &&
        ferry__rpc_token_equal(tok, n, svc->admin_token);
  svc->call_sees_errors = no_tokens || adm ||
                          (tok != NULL && svc->status_token != NULL &&
                           ferry__rpc_token_equal(tok, n, svc->status_token));
  if (need == NULL)
    return 0;
  /* Every configured token is compared, whatever matches first. */
  w = tok != NULL && svc->worker_token != NULL &&
      ferry__rpc_token_equal(tok, n, svc->worker_token);
  c = tok != NULL && svc->client_token != NULL &&
      ferry__rpc_token_equal(tok, n, svc->client_token);
  st = tok != NULL && svc->status_token != NULL &&
       ferry__rpc_token_equal(tok, n, svc->status_token);
  if ((role == ROLE_WORKER && w) || (role == ROLE_CLIENT && c) ||
      (role == ROLE_STATUS && (st || w || c || adm)) ||
      (role == ROLE_ADMIN && adm))
    return 0;
  /* With tokens on but no admin token, everyone is refused: say so,
   * since no credential can succeed until the operator restarts the
   * dispatcher with one. Which role a
   * method needs is documented, so naming it tells a stranger nothing. */
  if (role == ROLE_ADMIN && svc->admin_token == NULL) {
    FERRY_LOG(FERRY_LOG_WARN, "%s: refused: no --admin-token-file is "
              "configured", methods[method].name);
    ferry__rpc_reply_error(call, FERRY_RPC_PERMISSION_DENIED,
                           "this method needs the admin token: the "
                           "dispatcher was started without "
                           "--admin-token-file");
    return FERRY_RPC_PERMISSION_DENIED;
  }
  if (w || c || st || adm) {
    FERRY_LOG(FERRY_LOG_WARN, "%s: refused a caller holding another role's "
              "token", methods[method].name);
    ferry__rpc_reply_error(call, FERRY_RPC_PERMISSION_DENIED,
                           role == ROLE_ADMIN
                               ? "this credential does not allow this "
                                 "method: it needs the admin token"
                               : "this credential does not allow this method");
    return FERRY_RPC_PERMISSION_DENIED;
  }
  FERRY_LOG(FERRY_LOG_WARN, "%s: refused a caller with %s bearer token",
            methods[method].name, tok == NULL ? "no" : "a wrong");
  ferry__rpc_reply_error(call, FERRY_RPC_UNAUTHENTICATED,
                         role == ROLE_ADMIN
                             ? "missing or invalid bearer token: this method "
                               "needs the admin token"
                             : "missing or invalid bearer token");
  return FERRY_RPC_UNAUTHENTICATED;
}

static void handle(ferry_rpc_call_t *call, const uint8_t *req, size_t len,
                   void *user) {
  ferry_disp_binding_t *b = user;
  const method_t *m = &methods[b->method];
  ferry_disp_service_t *svc = b->svc;
  ProtobufCMessage *rq, *rs;
  ferry_arena_t a = {0};
  ferry_error_t err = {0};
  bool held = false, later = false;
  int rc;

  if (svc->failed) {
    ferry__rpc_reply_error(call, FERRY_RPC_UNAVAILABLE,
                           "dispatcher: the journal failed; shutting down");
    return;
  }
  if (authorize(svc, call, b->method) != 0)
    return;
  /* Each method's requests are bounded in bytes before they are parsed
   * (the fields inside are bounded again by the state machine). */
  if (len > m->max_request) {
    ferry__rpc_reply_error(call, FERRY_RPC_RESOURCE_EXHAUSTED,
                           "request larger than this method accepts");
    return;
  }
  rq = protobuf_c_message_unpack(m->req, &ferry__pb_allocator, len, req);
  if (rq == NULL) {
    ferry__rpc_reply_error(call, FERRY_RPC_INVALID_ARGUMENT,
                           "malformed request message");
    return;
  }
  /* After a failed batch, the first mutating call journals the boot
   * entry again (rebuild()); GetStatus only reads. */
  if (svc->need_boot && m->fn != op_status) {
    if (ferry__disp_boot(svc->state, &err) != 0) {
      ferry__rpc_reply_error(call, FERRY_RPC_INTERNAL, err.msg);
      ferry__disp_rpc_free_request(rq);
      return;
    }
    svc->need_boot = false;
  }
  if ((rs = ferry__arena_alloc(&a, m->resp->sizeof_message)) == NULL) {
    rc = ferry__seterr(&err, FERRY_ENOMEM, "out of memory");
  } else {
    m->resp->message_init(rs);
    /* With a loop, a registration's file I/O runs on its thread pool. */
    if (m->fn == op_register && svc->can_wait)
      rc = ferry__disp_rpc_reg_start(svc, call, (void *)rq, (void *)rs, &a,
                                     &err, &later);
    else
      rc = m->fn(svc, rq, rs, &a, ferry__disp_now_ms(), &err);
  }
  if (later) { /* answered by reg_after; nothing was changed yet */
    ferry__disp_rpc_free_request(rq);
    ferry__arena_free(&a);
    return;
  }
  /* What the call changed is durable before anyone hears of it:
   * ferry__disp_rpc_answer() holds the answer until then. */
  if (rc != 0) {
    ferry__disp_rpc_answer_error(svc, call, ferry__rpc_status_from_err(rc),
                                 err.msg);
  } else {
    /* A worker heartbeat with nothing to hear waits for news. */
    if (m->fn == op_worker && svc->can_wait) {
      Ferry__V1__WorkerHeartbeatRequest *wq = (void *)rq;
      Ferry__V1__WorkerHeartbeatResponse *wr = (void *)rs;
      held = ferry__disp_worker_may_wait(svc->state, wq, wr) &&
             ferry__disp_wait_start(svc, call, wq, wr->heartbeat_ms);
    }
    if (!held)
      ferry__disp_rpc_answer(svc, call, rs, &a);
  }
  if (!held)
    ferry__disp_rpc_free_request(rq);
  if (rc != 0)
    FERRY_LOG(FERRY_LOG_DEBUG, "%s: %s", m->name, err.msg);
  ferry__arena_free(&a);
  ferry__disp_rpc_flush(svc); /* a held heartbeat's changes too */
}

int ferry__disp_rpc_register(ferry_disp_service_t *svc,
                             ferry_rpc_server_t *server, ferry_error_t *err) {
  static const char *const services[] = {"ferry.v1.Dispatcher"};
  int rc;

  svc->on_durable = ferry__disp_wait_check;
  svc->on_failed = ferry__disp_wait_fail_all;
  for (int i = 0; i < (int)(sizeof(methods) / sizeof(methods[0])); i++) {
    svc->bindings[i].svc = svc;
    svc->bindings[i].method = i;
    rc = ferry__rpc_server_register(server, methods[i].name, FERRY_RPC_UNARY,
                                    handle, &svc->bindings[i], err);
    if (rc != 0)
      return rc;
  }
  return ferry__rpc_health_register(server, services, 1, err);
}
