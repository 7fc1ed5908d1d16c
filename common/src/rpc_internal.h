/* Shared between rpc_common.c, rpc_server.c, rpc_client.c and
 * rpc_health.c; not part of the public API. */
#ifndef FERRY_RPC_INTERNAL_H
#define FERRY_RPC_INTERNAL_H

#include <grpc/grpc.h>

#include "ferry/rpc.h"

/* The most channel args ferry__rpc_channel_args fills in. */
#define FERRY__RPC_MAX_ARGS 10

/* Fills `args` (FERRY__RPC_MAX_ARGS entries) from the options, for a
 * server or a client channel: message size limits, keepalive settings
 * that agree with each other, and (client channels) a fast reconnect
 * backoff. Returns the number of entries used. */
size_t ferry__rpc_channel_args(const ferry_rpc_options_t *opts, bool server,
                               grpc_arg *args);

/* Copies `opts` (NULL: all defaults) into `out` with the defaults filled
 * in; FERRY_ENOTSUP for TLS, FERRY_EINVAL for negative values. */
int ferry__rpc_options(const ferry_rpc_options_t *opts,
                       ferry_rpc_options_t *out, ferry_error_t *err);

/* The health service state a server owns (rpc_health.c). */
struct ferry__rpc_health;
struct ferry__rpc_health **ferry__rpc_server_health(ferry_rpc_server_t *s);
void ferry__rpc_health_free(struct ferry__rpc_health *h);

#endif /* FERRY_RPC_INTERNAL_H */
