/* grpc.health.v1.Health/Check on a Ferry server: SERVING (or NOT_SERVING
 * while draining) for "" and the registered service names, NOT_FOUND for
 * any other name. The state is owned by the server and freed with it. */
#include <string.h>

#include "alloc.h"
#include "grpc/health/v1/health.pb-c.h"
#include "pb_alloc.h"
#include "rpc_internal.h"
#include "rpc_methods.h"

#define SERVING                                                               \
  GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING
#define NOT_SERVING                                                           \
  GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING

struct ferry__rpc_health {
  bool serving;
  size_t n;
  char **services;
};


static bool known(const struct ferry__rpc_health *h, const char *service) {
  if (service[0] == '\0')
    return true;
  for (size_t i = 0; i < h->n; i++)
    if (strcmp(h->services[i], service) == 0)
      return true;
  return false;
}

static void on_check(ferry_rpc_call_t *call, const uint8_t *req, size_t len,
                     void *user) {
  const struct ferry__rpc_health *h = user;
  Grpc__Health__V1__HealthCheckRequest *r =
      grpc__health__v1__health_check_request__unpack(&ferry__pb_allocator, len,
                                                     req);
  if (r == NULL) {
    ferry__rpc_reply_error(call, FERRY_RPC_INVALID_ARGUMENT,
                           "malformed HealthCheckRequest");
    return;
  }
  if (!known(h, r->service)) {
    char msg[256];
    snprintf(msg, sizeof(msg), "unknown service \"%.200s\"", r->service);
    ferry__rpc_reply_error(call, FERRY_RPC_NOT_FOUND, msg);
  } else {
    Grpc__Health__V1__HealthCheckResponse resp =
        GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    uint8_t buf[16];
    resp.status = h->serving ? SERVING : NOT_SERVING;
    size_t n = grpc__health__v1__health_check_response__pack(&resp, buf);
    ferry__rpc_reply(call, buf, n);
  }
  grpc__health__v1__health_check_request__free_unpacked(r,
                                                        &ferry__pb_allocator);
}

void ferry__rpc_health_free(struct ferry__rpc_health *h) {
  if (h == NULL)
    return;
  for (size_t i = 0; i < h->n; i++)
    ferry__free(h->services[i]);
  ferry__free(h->services);
  ferry__free(h);
}

int ferry__rpc_health_register(ferry_rpc_server_t *server,
                               const char *const *services, size_t n,
                               ferry_error_t *err) {
  struct ferry__rpc_health **slot = ferry__rpc_server_health(server);
  struct ferry__rpc_health *h;
  int rc;
  if (*slot != NULL)
    return ferry__seterr(err, FERRY_EINVAL, "rpc: health registered twice");
  h = ferry__calloc(1, sizeof(*h));
  if (h == NULL || (n > 0 && (h->services = ferry__calloc(
                                  n, sizeof(*h->services))) == NULL)) {
    ferry__free(h);
    return ferry__seterr(err, FERRY_ENOMEM, "rpc: out of memory");
  }
  h->serving = true;
  for (; h->n < n; h->n++) {
    h->services[h->n] = ferry__strdup(services[h->n]);
    if (h->services[h->n] == NULL) {
      ferry__rpc_health_free(h);
      return ferry__seterr(err, FERRY_ENOMEM, "rpc: out of memory");
    }
  }
  rc = ferry__rpc_server_register(server, FERRY_METHOD_HEALTH_CHECK,
                                  FERRY_RPC_UNARY, on_check, h, err);
  if (rc != 0) {
    ferry__rpc_health_free(h);
    return rc;
  }
  *slot = h;
  return 0;
}

void ferry__rpc_health_set_serving(ferry_rpc_server_t *server, bool serving) {
  struct ferry__rpc_health *h = *ferry__rpc_server_health(server);
  if (h != NULL)
    h->serving = serving;
}
