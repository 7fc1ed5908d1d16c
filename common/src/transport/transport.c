/* The registry of transports, the bounds on what workers publish, and the
 * client's choice between transports (transport.h).
 */
#include <stdio.h>
#include <string.h>

#include "pb_alloc.h"
#include "transport.h"
#include "transport_internal.h"

/* The registry: every transport of this source tree, in the order that
 * gives their positions, with the CMake option that builds it (NULL:
 * always built), its client table and its worker table (NULL where that
 * option left it out). Adding a transport is one line here
 * (docs/ARCHITECTURE.md, "Adding a transport"). */
#define FERRY__TRANSPORT_REGISTRY(X)                                           \
  X("grpc", NULL, &ferry__transport_grpc, &ferry__transport_grpc_server)       \
  X("ucx", "FERRY_WITH_UCX", FERRY__TRANSPORT_UCX, FERRY__TRANSPORT_UCX_SERVER)

/* The client tables and, apart, the worker tables: only
 * ferry__transport_server_at reads the second array, so a program that
 * never calls it (libferry.so) keeps no server when linked with
 * --gc-sections. */
#define CLIENT_ENTRY(name, option, ops, server) {name, option, ops},
#define SERVER_ENTRY(name, option, ops, server) server,
static const struct {
  const char *name;
  const char *option;
  const ferry_transport_ops_t *ops;
} registry[] = {FERRY__TRANSPORT_REGISTRY(CLIENT_ENTRY)};
static const ferry_transport_server_ops_t *const servers[] = {
    FERRY__TRANSPORT_REGISTRY(SERVER_ENTRY)};
#define N_REGISTRY (sizeof(registry) / sizeof(registry[0]))
_Static_assert(N_REGISTRY <= FERRY_TRANSPORTS_MAX,
               "more transports than FERRY_TRANSPORTS_MAX");

size_t ferry__transport_count(void) {
  size_t n = 0;
  for (size_t i = 0; i < N_REGISTRY; i++)
    n += registry[i].ops != NULL;
  return n;
}

/* The registry entry of the built transport at position i, or
 * N_REGISTRY. */
static size_t entry_at(size_t i) {
  size_t k = 0;
  for (; k < N_REGISTRY; k++)
    if (registry[k].ops != NULL && i-- == 0)
      break;
  return k;
}

const ferry_transport_ops_t *ferry__transport_at(size_t i) {
  size_t k = entry_at(i);
  return k < N_REGISTRY ? registry[k].ops : NULL;
}

const ferry_transport_server_ops_t *ferry__transport_server_at(size_t i) {
  size_t k = entry_at(i);
  return k < N_REGISTRY ? servers[k] : NULL;
}

/* The position of the built transport whose name is name[0..len). */
static int index_of(const char *name, size_t len) {
  int pos = 0;
  for (size_t k = 0; k < N_REGISTRY; k++) {
    if (registry[k].ops == NULL)
      continue;
    if (strlen(registry[k].name) == len &&
        memcmp(registry[k].name, name, len) == 0)
      return pos;
    pos++;
  }
  return -1;
}

int ferry__transport_index(const char *name) {
  return name == NULL ? -1 : index_of(name, strlen(name));
}

const ferry_transport_ops_t *ferry__transport_find(const char *name) {
  int i = ferry__transport_index(name);
  return i < 0 ? NULL : ferry__transport_at((size_t)i);
}

static bool name_ok(const char *s, size_t len) {
  if (len == 0 || len > FERRY_TRANSPORT_NAME_MAX)
    return false;
  for (size_t i = 0; i < len; i++)
    if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') ||
          s[i] == '_'))
      return false;
  return true;
}

int ferry__transport_endpoints_check(const ferry_transport_endpoint_t *e,
                                     size_t n, ferry_error_t *err) {
  if (n > FERRY_TRANSPORT_ENDPOINTS_MAX)
    return ferry__seterr(err, FERRY_EINVAL, "endpoints: %zu, over %d", n,
                         FERRY_TRANSPORT_ENDPOINTS_MAX);
  for (size_t i = 0; i < n; i++) {
    if (!name_ok(e[i].transport, e[i].transport_len))
      return ferry__seterr(err, FERRY_EINVAL, "endpoints[%zu].transport: "
                           "expected 1 to %d bytes of [a-z0-9_]", i,
                           FERRY_TRANSPORT_NAME_MAX);
    if (e[i].address_len > FERRY_TRANSPORT_ADDRESS_MAX)
      return ferry__seterr(err, FERRY_EINVAL, "endpoints[%zu].address: %zu "
                           "bytes, over %d", i, e[i].address_len,
                           FERRY_TRANSPORT_ADDRESS_MAX);
    for (size_t k = 0; k < i; k++)
      if (e[k].transport_len == e[i].transport_len &&
          memcmp(e[k].transport, e[i].transport, e[i].transport_len) == 0)
        return ferry__seterr(err, FERRY_EINVAL, "endpoints[%zu].transport: "
                             "'%.*s' also at %zu", i, (int)e[i].transport_len,
                             e[i].transport, k);
  }
  return 0;
}

/* ---- Choosing ---------------------------------------------------------- */

static bool is_auto(const char *want) {
  return want == NULL || want[0] == '\0' || strcmp(want, "auto") == 0;
}

/* "grpc, ucx": the names built in. */
static void built_names(char *out, size_t cap) {
  size_t used = 0;
  out[0] = '\0';
  for (size_t i = 0; i < ferry__transport_count() && used < cap; i++) {
    int n = snprintf(out + used, cap - used, "%s%s", i > 0 ? ", " : "",
                     ferry__transport_at(i)->name);
    if (n < 0)
      break;
    used += (size_t)n;
  }
}

int ferry__transport_want_check(const char *want, ferry_error_t *err) {
  if (is_auto(want) || ferry__transport_index(want) >= 0)
    return 0;
  for (size_t k = 0; k < N_REGISTRY; k++)
    if (strcmp(registry[k].name, want) == 0)
      return ferry__seterr(err, FERRY_ENOTSUP, "transport %s: this libferry "
                           "was built without it (%s)", want,
                           registry[k].option);
  char names[FERRY_TRANSPORTS_MAX * (FERRY_TRANSPORT_NAME_MAX + 2)];
  built_names(names, sizeof(names));
  return ferry__seterr(err, FERRY_EINVAL, "transport '%s': expected auto or "
                       "one of: %s", want, names);
}

/* The endpoint `offered` holds for transport `ops`, or NULL. */
static const ferry_transport_endpoint_t *
offer_of(const ferry_transport_ops_t *ops,
         const ferry_transport_endpoint_t *offered, size_t n) {
  size_t len = strlen(ops->name);
  for (size_t i = 0; i < n; i++)
    if (offered[i].transport_len == len &&
        memcmp(offered[i].transport, ops->name, len) == 0)
      return &offered[i];
  return NULL;
}

/* Whether the worker offers `ops`: a transport needing an address when it
 * published one, any other always (it reaches the gRPC address). */
static bool offers(const ferry_transport_ops_t *ops,
                   const ferry_transport_endpoint_t *offered, size_t n,
                   const ferry_transport_endpoint_t **ep) {
  *ep = offer_of(ops, offered, n);
  if (!(ops->caps & FERRY_TRANSPORT_NEEDS_ADDRESS))
    return true;
  return *ep != NULL && (*ep)->address_len > 0;
}

static void chose(ferry_transport_choice_t *out, int index,
                  const ferry_transport_endpoint_t *ep) {
  out->index = index;
  out->address = ep != NULL && ep->address_len > 0 ? ep->address : NULL;
  out->address_len = out->address != NULL ? ep->address_len : 0;
}

int ferry__transport_choose(const char *want, bool tls,
                            const ferry_transport_endpoint_t *offered, size_t n,
                            uint32_t failed, ferry_transport_choice_t *out,
                            ferry_error_t *err) {
  const ferry_transport_endpoint_t *ep;
  memset(out, 0, sizeof(*out));
  int rc = ferry__transport_want_check(want, err);
  if (rc != 0)
    return rc;
  if (!is_auto(want)) {
    int i = ferry__transport_index(want);
    const ferry_transport_ops_t *ops = ferry__transport_at((size_t)i);
    if (!offers(ops, offered, n, &ep))
      return ferry__seterr(err, FERRY_ENOTSUP, "transport %s: the worker "
                           "offers no %s endpoint (built without it?)",
                           want, want);
    chose(out, i, ep);
    snprintf(out->why, sizeof(out->why), "%s: asked for%s", want,
             tls && !(ops->caps & FERRY_TRANSPORT_ENCRYPTS)
                 ? " (it does not encrypt: TLS covers the control plane "
                   "only)"
                 : "");
    return 0;
  }
  /* auto: the highest priority that applies; the lowest offered is the
   * last resort, whatever failed. */
  int best = -1, last = -1;
  for (size_t i = 0; i < ferry__transport_count(); i++) {
    const ferry_transport_ops_t *ops = ferry__transport_at(i);
    if (!offers(ops, offered, n, &ep) ||
        (tls && !(ops->caps & FERRY_TRANSPORT_ENCRYPTS)))
      continue;
    if (last < 0 || ops->priority < ferry__transport_at((size_t)last)->priority)
      last = (int)i;
    if ((failed & (1u << i)) == 0 &&
        (best < 0 ||
         ops->priority > ferry__transport_at((size_t)best)->priority))
      best = (int)i;
  }
  if (best < 0)
    best = last;
  if (best < 0)
    return ferry__seterr(err, FERRY_ENOTSUP, "transport auto: the worker "
                         "offers no transport this client may use");
  const ferry_transport_ops_t *ops = ferry__transport_at((size_t)best);
  offers(ops, offered, n, &ep);
  chose(out, best, ep);
  /* Why not one preferred to it. */
  const ferry_transport_ops_t *better = NULL;
  for (size_t i = 0; i < ferry__transport_count(); i++) {
    const ferry_transport_ops_t *o = ferry__transport_at(i);
    if ((int)i != best && o->priority > ops->priority &&
        offers(o, offered, n, &ep) &&
        (better == NULL || o->priority > better->priority))
      better = o;
  }
  if (better == NULL)
    snprintf(out->why, sizeof(out->why), "auto: %s, the first both ends "
             "offer", ops->name);
  else
    snprintf(out->why, sizeof(out->why), "auto: %s, not %s: %s", ops->name,
             better->name,
             tls && !(better->caps & FERRY_TRANSPORT_ENCRYPTS)
                 ? "TLS is configured and it does not encrypt"
                 : "its stream to this worker failed before its first "
                   "chunk");
  return 0;
}

bool ferry__transport_falls_back(const char *want, int index, uint64_t chunks) {
  return is_auto(want) && chunks == 0 && index >= 0 &&
         (size_t)index < ferry__transport_count();
}

Ferry__V1__StreamChunksRequest *
ferry__transport_request(ferry_rpc_call_t *call, const uint8_t *req,
                         size_t len, ferry_transport_open_t *o) {
  Ferry__V1__StreamChunksRequest *m =
      ferry__v1__stream_chunks_request__unpack(&ferry__pb_allocator, len, req);
  if (m == NULL) {
    ferry__rpc_reply_error(call, FERRY_RPC_INVALID_ARGUMENT,
                           "StreamChunksRequest: malformed protobuf");
    return NULL;
  }
  memset(o, 0, sizeof(*o));
  o->job_id = m->job_id;
  o->client_id = m->client_id;
  if (m->client_secret.len == FERRY_CLIENT_SECRET_BYTES)
    o->secret = m->client_secret.data;
  o->bearer = ferry__rpc_call_bearer(call, &o->bearer_len);
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
