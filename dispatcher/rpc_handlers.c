/* The dispatcher's gRPC glue (see rpc_handlers.h). */
#include "rpc_handlers.h"

#include <string.h>

#include "ferry/alloc.h"
#include "ferry/log.h"

typedef int (*op_fn)(ferry_disp_service_t *svc, const void *req, void *resp,
                     ferry_arena_t *a, int64_t now, ferry_error_t *err);

typedef struct method_s {
  const char *name;
  const ProtobufCMessageDescriptor *req, *resp;
  op_fn fn;
} method_t;

int64_t ferry__disp_now_ms(void) { return (int64_t)(uv_hrtime() / 1000000); }

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
  return rc ? ferry__seterr(err, rc, "out of memory") : 0;
}

static const method_t methods[] = {
    {"/ferry.v1.Dispatcher/RegisterDataset",
     &ferry__v1__register_dataset_request__descriptor,
     &ferry__v1__register_dataset_response__descriptor, op_register},
    {"/ferry.v1.Dispatcher/GetOrCreateJob",
     &ferry__v1__get_or_create_job_request__descriptor,
     &ferry__v1__get_or_create_job_response__descriptor, op_job},
    {"/ferry.v1.Dispatcher/ClientHeartbeat",
     &ferry__v1__client_heartbeat_request__descriptor,
     &ferry__v1__client_heartbeat_response__descriptor, op_client},
    {"/ferry.v1.Dispatcher/WorkerHeartbeat",
     &ferry__v1__worker_heartbeat_request__descriptor,
     &ferry__v1__worker_heartbeat_response__descriptor, op_worker},
    {"/ferry.v1.Dispatcher/GetStatus",
     &ferry__v1__get_status_request__descriptor,
     &ferry__v1__get_status_response__descriptor, op_status},
};

int ferry__disp_rpc_sync(ferry_disp_service_t *svc) {
  ferry_error_t err = {0};
  int rc;

  if (svc->journal == NULL || svc->failed)
    return svc->failed ? FERRY_EIO : 0;
  if ((rc = ferry__journal_sync(svc->journal, &err)) != 0) {
    svc->failed = true;
    FERRY_LOG(FERRY_LOG_ERROR, "journal: %s", err.msg);
    if (svc->fatal != NULL)
      svc->fatal(&err, svc->fatal_arg);
  }
  return rc;
}

/* Packs the response into one buffer and answers the call. */
static void reply_msg(ferry_rpc_call_t *call, const ProtobufCMessage *msg,
                      ferry_arena_t *a) {
  size_t n = protobuf_c_message_get_packed_size(msg);
  uint8_t *buf = ferry__arena_alloc(a, n ? n : 1);
  if (buf == NULL) {
    ferry_rpc_reply_error(call, FERRY_RPC_INTERNAL, "out of memory");
    return;
  }
  protobuf_c_message_pack(msg, buf);
  ferry_rpc_reply(call, buf, n);
}

static void handle(ferry_rpc_call_t *call, const uint8_t *req, size_t len,
                   void *user) {
  ferry_disp_binding_t *b = user;
  const method_t *m = &methods[b->method];
  ferry_disp_service_t *svc = b->svc;
  ProtobufCAllocator al;
  ProtobufCMessage *rq, *rs;
  ferry_arena_t a = {0};
  ferry_error_t err = {0};
  int rc;

  if (svc->failed) {
    ferry_rpc_reply_error(call, FERRY_RPC_UNAVAILABLE,
                          "dispatcher: the journal failed; shutting down");
    return;
  }
  ferry__disp_pb_allocator(&al);
  if ((rq = protobuf_c_message_unpack(m->req, &al, len, req)) == NULL) {
    ferry_rpc_reply_error(call, FERRY_RPC_INVALID_ARGUMENT,
                          "malformed request message");
    return;
  }
  if ((rs = ferry__arena_alloc(&a, m->resp->sizeof_message)) == NULL) {
    rc = ferry__seterr(&err, FERRY_ENOMEM, "out of memory");
  } else {
    m->resp->message_init(rs);
    rc = m->fn(svc, rq, rs, &a, ferry__disp_now_ms(), &err);
  }
  protobuf_c_message_free_unpacked(rq, &al);
  /* What the call changed is durable before anyone hears of it. */
  if (ferry__disp_rpc_sync(svc) != 0)
    ferry_rpc_reply_error(call, FERRY_RPC_UNAVAILABLE,
                          "dispatcher: cannot write its journal");
  else if (rc != 0)
    ferry_rpc_reply_error(call, ferry_rpc_status_from_err(rc), err.msg);
  else
    reply_msg(call, rs, &a);
  if (rc != 0)
    FERRY_LOG(FERRY_LOG_DEBUG, "%s: %s", m->name, err.msg);
  ferry__arena_free(&a);
}

int ferry__disp_rpc_register(ferry_disp_service_t *svc,
                             ferry_rpc_server_t *server, ferry_error_t *err) {
  static const char *const services[] = {"ferry.v1.Dispatcher"};
  int rc;

  for (int i = 0; i < (int)(sizeof(methods) / sizeof(methods[0])); i++) {
    svc->bindings[i].svc = svc;
    svc->bindings[i].method = i;
    rc = ferry_rpc_server_register(server, methods[i].name, FERRY_RPC_UNARY,
                                   handle, &svc->bindings[i], err);
    if (rc != 0)
      return rc;
  }
  return ferry_rpc_health_register(server, services, 1, err);
}
