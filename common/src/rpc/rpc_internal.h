/* Shared between rpc_common.c, rpc_server.c, rpc_client.c and
 * rpc_health.c; not part of the public API. */
#ifndef FERRY_RPC_INTERNAL_H
#define FERRY_RPC_INTERNAL_H

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>

#include "rpc.h"

/* The most channel args ferry__rpc_channel_args fills in. */
#define FERRY__RPC_MAX_ARGS 16

/* Fills `args` (FERRY__RPC_MAX_ARGS entries) from the options, for a
 * server or a client channel: message size limits, keepalive settings
 * that agree with each other, and (client channels) a fast reconnect
 * backoff. Returns the number of entries used. */
size_t ferry__rpc_channel_args(const ferry_rpc_options_t *opts, bool server,
                               grpc_arg *args);

/* Copies `opts` (NULL: all defaults) into `out` with the defaults filled
 * in; FERRY_EINVAL for negative values. `out->tls` and
 * `out->bearer_token` still point at the caller's: copy what is kept. */
int ferry__rpc_options(const ferry_rpc_options_t *opts,
                       ferry_rpc_options_t *out, ferry_error_t *err);

/* The health service state a server owns (rpc_health.c). */
struct ferry__rpc_health;
struct ferry__rpc_health **ferry__rpc_server_health(ferry_rpc_server_t *s);
void ferry__rpc_health_free(struct ferry__rpc_health *h);

/* TLS (rpc_auth.c). Channel credentials from the files `tls` names. */
int ferry__rpc_channel_creds(const ferry_rpc_tls_t *tls,
                             grpc_channel_credentials **out,
                             ferry_error_t *err);
/* A server's TLS files (copied and checked) behind gRPC's certificate
 * fetcher; freed after the gRPC server is destroyed. */
struct ferry__rpc_tls_server;
int ferry__rpc_tls_server_new(const ferry_rpc_tls_t *tls,
                              struct ferry__rpc_tls_server **out,
                              ferry_error_t *err);
grpc_server_credentials *
ferry__rpc_tls_server_creds(struct ferry__rpc_tls_server *t);
void ferry__rpc_tls_server_force(struct ferry__rpc_tls_server *t);
void ferry__rpc_tls_server_free(struct ferry__rpc_tls_server *t);

#endif /* FERRY_RPC_INTERNAL_H */
