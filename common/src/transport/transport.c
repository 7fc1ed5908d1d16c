/* The transports built in and the choice between them (ferry/transport.h).
 */
#include <stdio.h>
#include <string.h>

#include "ferry/pb_alloc.h"
#include "ferry/transport.h"
#include "transport_internal.h"

static const ferry_transport_ops_t *const all[] = {
    &ferry_transport_grpc,
#ifdef FERRY_HAVE_UCX
    &ferry_transport_ucx,
#endif
};

const ferry_transport_ops_t *ferry_transport_find(const char *name) {
  if (name == NULL)
    return NULL;
  for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
    if (strcmp(all[i]->name, name) == 0)
      return all[i];
  return NULL;
}

static void say(char *why, size_t why_len, const char *msg) {
  if (why != NULL && why_len > 0)
    snprintf(why, why_len, "%s", msg);
}

const ferry_transport_ops_t *ferry_transport_choose(const char *want,
                                                    bool peer_has_ucx,
                                                    char *why, size_t why_len,
                                                    ferry_error_t *err) {
  const ferry_transport_ops_t *ucx = ferry_transport_find("ucx");
  if (want == NULL || want[0] == '\0' || strcmp(want, "auto") == 0) {
    if (ucx != NULL && peer_has_ucx) {
      say(why, why_len, "auto: both ends offer ucx");
      return ucx;
    }
    say(why, why_len,
        ucx == NULL ? "auto: grpc, this libferry was built without UCX"
                    : "auto: grpc, the worker offers no UCX address");
    return &ferry_transport_grpc;
  }
  if (strcmp(want, "grpc") == 0) {
    say(why, why_len, "grpc: asked for");
    return &ferry_transport_grpc;
  }
  if (strcmp(want, "ucx") == 0) {
    if (ucx == NULL) {
      ferry__seterr(err, FERRY_ENOTSUP, "transport ucx: this libferry was "
                    "built without UCX (FERRY_WITH_UCX)");
      return NULL;
    }
    if (!peer_has_ucx) {
      ferry__seterr(err, FERRY_ENOTSUP, "transport ucx: the worker offers "
                    "no UCX address (built without UCX?)");
      return NULL;
    }
    say(why, why_len, "ucx: asked for");
    return ucx;
  }
  ferry__seterr(err, FERRY_EINVAL, "transport '%s': expected auto, grpc or "
                "ucx", want);
  return NULL;
}

Ferry__V1__StreamChunksRequest *
ferry__transport_request(ferry_rpc_call_t *call, const uint8_t *req,
                         size_t len, ferry_transport_open_t *o) {
  Ferry__V1__StreamChunksRequest *m =
      ferry__v1__stream_chunks_request__unpack(&ferry__pb_allocator, len, req);
  if (m == NULL) {
    ferry_rpc_reply_error(call, FERRY_RPC_INVALID_ARGUMENT,
                          "StreamChunksRequest: malformed protobuf");
    return NULL;
  }
  memset(o, 0, sizeof(*o));
  o->job_id = m->job_id;
  o->client_id = m->client_id;
  if (m->client_secret.len == FERRY_CLIENT_SECRET_BYTES)
    o->secret = m->client_secret.data;
  o->bearer = ferry_rpc_call_bearer(call, &o->bearer_len);
  return m;
}

void ferry__transport_request_free(Ferry__V1__StreamChunksRequest *m) {
  if (m != NULL)
    ferry__v1__stream_chunks_request__free_unpacked(m, &ferry__pb_allocator);
}

#define DEFAULT_PEER_TIMEOUT_MS 10000
#define MIN_KEEPALIVE_TIMEOUT_MS 2000

int ferry__transport_peer_timeout_ms(
    const ferry_transport_client_config_t *cfg) {
  return cfg != NULL && cfg->peer_timeout_ms > 0 ? cfg->peer_timeout_ms
                                                 : DEFAULT_PEER_TIMEOUT_MS;
}

/* gRPC's TCP_USER_TIMEOUT alone (it sets it from the keepalive timeout)
 * only notices a peer gone while the client has bytes in flight: a
 * client cut off while it waits on a stream it has nothing to send on
 * would wait out the 30 s default keepalive, past a trainer's patience. */
void ferry__transport_client_opts(const ferry_transport_client_config_t *cfg,
                                  ferry_rpc_options_t *out) {
  ferry_rpc_options_t o = {0};
  if (cfg != NULL && cfg->rpc_opts != NULL)
    o = *cfg->rpc_opts;
  int half = ferry__transport_peer_timeout_ms(cfg) / 2;
  if (o.keepalive_time_ms == 0)
    o.keepalive_time_ms =
        half > FERRY_RPC_MIN_KEEPALIVE_MS ? half : FERRY_RPC_MIN_KEEPALIVE_MS;
  if (o.keepalive_timeout_ms == 0)
    o.keepalive_timeout_ms =
        half > MIN_KEEPALIVE_TIMEOUT_MS ? half : MIN_KEEPALIVE_TIMEOUT_MS;
  *out = o;
}
