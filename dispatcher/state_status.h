/* The workers' states that GetStatus shows (state_status.c). */
#ifndef FERRY_DISPATCHER_STATE_STATUS_H
#define FERRY_DISPATCHER_STATE_STATUS_H

#include "state_internal.h"

/* Nothing runs on the drained worker: no lease, and a heartbeat since the
 * drain listed no unfinished task; or it is lost. */
bool ferry__disp_drained(const worker_t *w);

/* WorkerStatus.state (dispatcher.proto). A worker known from the journal
 * but not heard from since this process started is "unknown", not alive:
 * it may have left before the restart (ferry__disp_recount() first). */
const char *ferry__disp_worker_state(const worker_t *w);

#endif /* FERRY_DISPATCHER_STATE_STATUS_H */
