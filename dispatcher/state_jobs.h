/* Jobs (state_jobs.c): GetOrCreateJob and CancelJob are in state.h;
 * here what clients' heartbeats check of a job. */
#ifndef FERRY_DISPATCHER_STATE_JOBS_H
#define FERRY_DISPATCHER_STATE_JOBS_H

#include "state_internal.h"

/* FERRY_EINVAL naming both clients when a live client other than
 * `client` holds `rank` in `j`; else 0. */
int ferry__disp_check_rank(const job_t *j, uint64_t client, int64_t rank,
                           ferry_error_t *err);

#endif /* FERRY_DISPATCHER_STATE_JOBS_H */
