/* The dispatcher's gRPC glue, the top of its RPC layer (rpc_service.h
 * lists the files): unpacks each request, runs the state machine, holds
 * its answer until its journal entries (and every entry appended before
 * it) are durable (rpc_commit.h), and answers. Loop thread only. */
#ifndef FERRY_DISPATCHER_RPC_HANDLERS_H
#define FERRY_DISPATCHER_RPC_HANDLERS_H

#include "rpc_service.h"

/* Registers the Dispatcher methods and the health service on
 * `server` (before it starts), and sets the group commit's hooks. `svc`
 * must outlive the server. */
int ferry__disp_rpc_register(ferry_disp_service_t *svc,
                             ferry_rpc_server_t *server, ferry_error_t *err);

/* Lets worker heartbeats wait on `loop` (the server's loop): initialises
 * the timer that answers them when their interval passed. Also moves the
 * file I/O of RegisterDataset to the loop's thread pool (the call is
 * answered from the loop once the scan is done and journaled). Returns 0
 * or a libuv error. Without it every call is answered at once (tests). */
int ferry__disp_rpc_start(ferry_disp_service_t *svc, uv_loop_t *loop);

/* Answers every waiting heartbeat, answers every registration in
 * progress with UNAVAILABLE (its thread-pool work is cancelled or stops
 * early, and commits nothing; the loop keeps running until it returned,
 * so run the loop dry before freeing the state), lets no more calls wait
 * and closes the timer. Call before ferry__rpc_server_shutdown, which
 * waits for every call to be answered. Idempotent. */
void ferry__disp_rpc_stop(ferry_disp_service_t *svc);

#endif /* FERRY_DISPATCHER_RPC_HANDLERS_H */
