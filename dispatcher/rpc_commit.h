/* Group commit (rpc_commit.c), the bottom of the RPC layer: every answer
 * waits until what the state shows is durable. Knows nothing of the
 * layers above it but the hooks in ferry_disp_service_t. */
#ifndef FERRY_DISP_RPC_COMMIT_H
#define FERRY_DISP_RPC_COMMIT_H

#include <stdbool.h>

#include "rpc_service.h"

/* Packs `msg` into one buffer and answers the call now. */
void ferry__disp_rpc_reply_msg(ferry_rpc_call_t *call,
                               const ProtobufCMessage *msg, ferry_arena_t *a);

/* Answers `call` with `msg` (or an error status and text)
 * once what the state shows is durable (group commit). */
void ferry__disp_rpc_answer(ferry_disp_service_t *svc, ferry_rpc_call_t *call,
                            const ProtobufCMessage *msg, ferry_arena_t *a);
void ferry__disp_rpc_answer_error(ferry_disp_service_t *svc,
                                  ferry_rpc_call_t *call, int status,
                                  const char *text);

/* Makes the entries appended outside an RPC (the timer) durable: starts
 * a batch unless one is in flight. Once a batch is durable, answers the
 * held calls it covers and the waiting heartbeats whose answer changed.
 * A failed batch fails the held calls and rebuilds the state from disk
 * (the fatal callback runs only when that fails). The hooks tell the
 * held-back heartbeats either way. */
void ferry__disp_rpc_flush(ferry_disp_service_t *svc);

#endif /* FERRY_DISP_RPC_COMMIT_H */
