/* Long-polled worker heartbeats (rpc_wait.c): see
 * ferry__disp_worker_may_wait (state.h). Answers through the group
 * commit. */
#ifndef FERRY_DISP_RPC_WAIT_H
#define FERRY_DISP_RPC_WAIT_H

#include <stdbool.h>

#include "rpc_service.h"

/* Frees a request unpacked with ferry__pb_allocator. */
void ferry__disp_rpc_free_request(ProtobufCMessage *m);

/* A worker heartbeat held back until it has news.
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

#endif /* FERRY_DISP_RPC_WAIT_H */
