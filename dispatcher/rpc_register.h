/* RegisterDataset off the loop (rpc_register.c): expansion and scan on
 * libuv's pool. Answers through the group commit. */
#ifndef FERRY_DISP_RPC_REGISTER_H
#define FERRY_DISP_RPC_REGISTER_H

#include <stdbool.h>

#include "rpc_service.h"

/* Starts a RegisterDataset from handle(): its error, or
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

#endif /* FERRY_DISP_RPC_REGISTER_H */
