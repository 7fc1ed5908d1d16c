/* What the transports of common/src/transport share (not installed). */
#ifndef FERRY_TRANSPORT_INTERNAL_H
#define FERRY_TRANSPORT_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "ferry/v1/worker.pb-c.h"
#include "rpc.h"
#include "transport.h"

/* The StreamChunksRequest a transport's gRPC call opened with: unpacked
 * (with ferry__pb_allocator), and the job, client, secret and bearer token
 * the worker's on_open needs taken from it into `o` (pointing into the
 * message and the call: valid until ferry__transport_request_free). A
 * malformed request is answered INVALID_ARGUMENT and NULL returned. */
Ferry__V1__StreamChunksRequest *
ferry__transport_request(ferry_rpc_call_t *call, const uint8_t *req,
                         size_t len, ferry_transport_open_t *o);
void ferry__transport_request_free(Ferry__V1__StreamChunksRequest *m);

/* cfg's peer timeout, or the default (10 s) where it leaves it 0. */
int ferry__transport_peer_timeout_ms(
    const ferry_transport_client_config_t *cfg);

/* A client's channel options for its streams to workers: cfg's rpc_opts
 * (or none), with the keepalive, where they leave it 0, derived from the
 * peer timeout. Each stream has a gRPC connection of its own (UCX's
 * control call too), and its keepalive is what notices a worker cut off
 * while the stream is quiet: a ping after half the peer timeout without
 * a byte received, the connection dropped when the answer takes another
 * half (at least MIN_KEEPALIVE_TIMEOUT_MS, so that a congested link's
 * retransmissions do not look like a dead peer). */
void ferry__transport_client_opts(const ferry_transport_client_config_t *cfg,
                                  ferry_rpc_options_t *out);

#endif /* FERRY_TRANSPORT_INTERNAL_H */
