/* What the dispatcher's RPC files share (rpc_handlers.c: the methods,
 * authorization and dispatch; rpc_commit.c: group commit; rpc_wait.c:
 * long-polled worker heartbeats; rpc_register.c: RegisterDataset off the
 * loop). Not installed. */
#ifndef FERRY_DISP_RPC_INTERNAL_H
#define FERRY_DISP_RPC_INTERNAL_H

#include <stdbool.h>

#include "rpc_handlers.h"

/* rpc_handlers.c: packs `msg` into one buffer and answers the call now. */
void ferry__disp_rpc_reply_msg(ferry_rpc_call_t *call,
                               const ProtobufCMessage *msg, ferry_arena_t *a);
/* rpc_wait.c: frees a request unpacked with ferry__pb_allocator. */
void ferry__disp_rpc_free_request(ProtobufCMessage *m);

/* rpc_commit.c: answers `call` with `msg` (or an error status and text)
 * once what the state shows is durable (group commit). */
void ferry__disp_rpc_answer(ferry_disp_service_t *svc, ferry_rpc_call_t *call,
                            const ProtobufCMessage *msg, ferry_arena_t *a);
void ferry__disp_rpc_answer_error(ferry_disp_service_t *svc,
                                  ferry_rpc_call_t *call, int status,
                                  const char *text);

/* rpc_wait.c: a worker heartbeat held back until it has news.
 * ferry__disp_wait_start holds `call`, taking `req` (false, nothing
 * taken, when out of memory); ferry__disp_wait_answer answers one now
 * (with only_news, only when it carries something; true when it
 * answered, and freed it); ferry__disp_wait_check answers those with
 * news or past due; ferry__disp_wait_fail_all fails them all (a failed
 * batch). */
bool ferry__disp_wait_start(ferry_disp_service_t *svc, ferry_rpc_call_t *call,
                            Ferry__V1__WorkerHeartbeatRequest *req,
                            uint32_t interval_ms);
bool ferry__disp_wait_answer(ferry_disp_service_t *svc, ferry_disp_wait_t *w,
                             bool only_news);
void ferry__disp_wait_check(ferry_disp_service_t *svc);
void ferry__disp_wait_fail_all(ferry_disp_service_t *svc, const char *why);

/* rpc_register.c: starts a RegisterDataset from handle(): its error, or
 * 0 with *later false and `resp` filled (the dataset exists), or 0 with
 * *later true: the call is answered when the work is done.
 * ferry__disp_rpc_reg_stop_all answers every registration in progress
 * (the daemon stops); their work ends without committing. */
int ferry__disp_rpc_reg_start(ferry_disp_service_t *svc,
                              ferry_rpc_call_t *call,
                              const Ferry__V1__RegisterDatasetRequest *req,
                              Ferry__V1__RegisterDatasetResponse *resp,
                              ferry_arena_t *a, ferry_error_t *err,
                              bool *later);
void ferry__disp_rpc_reg_stop_all(ferry_disp_service_t *svc);

#endif /* FERRY_DISP_RPC_INTERNAL_H */
