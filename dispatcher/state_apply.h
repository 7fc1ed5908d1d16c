/* The journal entries of the state machine (state_apply.c): the commit
 * path every live change takes (state_internal.h's invariants) and the
 * builders of the entries that several parts commit. */
#ifndef FERRY_DISPATCHER_STATE_APPLY_H
#define FERRY_DISPATCHER_STATE_APPLY_H

#include "state_internal.h"

/* True when a job still reads the dataset. */
bool ferry__disp_dataset_used(const ferry_disp_t *d, const dataset_t *ds);

/* Applies a live entry, then hands its serialization to the sink. */
int ferry__disp_commit(ferry_disp_t *d, const entry_t *e, ferry_error_t *err);

/* Build one entry and commit it. */
int ferry__disp_emit_assign(ferry_disp_t *d, job_t *j, uint32_t row,
                            uint64_t client, uint64_t worker, uint64_t lease,
                            uint64_t start, uint64_t end);

int ferry__disp_emit_client_left(ferry_disp_t *d, job_t *j, uint64_t client,
                                 bool lost);

int ferry__disp_emit_client_joined(ferry_disp_t *d, job_t *j, uint64_t client,
                                   const uint8_t *secret, int64_t rank,
                                   ferry_error_t *err);

int ferry__disp_emit_job_failed(ferry_disp_t *d, job_t *j, int code,
                                const char *msg);

#endif /* FERRY_DISPATCHER_STATE_APPLY_H */
