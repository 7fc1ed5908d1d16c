/* Clients' reports of workers they cannot reach (state_unreach.c); the
 * lists themselves are state.c's (state_internal.h). */
#ifndef FERRY_DISPATCHER_STATE_UNREACH_H
#define FERRY_DISPATCHER_STATE_UNREACH_H

#include "state_internal.h"

/* The reason text kept per worker (ClientHeartbeatRequest.unreachable's
 * bounds are in state.h). */
#define FERRY_DISP_REASON_KEPT 256
/* The first backoff after a client reports a worker unreachable, doubled
 * with each further failure up to the maximum. */
#define FERRY_DISP_UNREACH_BACKOFF_MS 1000
#define FERRY_DISP_UNREACH_BACKOFF_MAX_MS 60000

/* FERRY_EINVAL naming the bound when the heartbeat's unreachable list is
 * too long or a reason or address too long. */
int ferry__disp_check_unreachable(const Ferry__V1__ClientHeartbeatRequest *req,
                                  ferry_error_t *err);

/* Records the client's unreachable list: each worker it names (by id and
 * address) gets or keeps an entry for the client; a new failure (a new
 * entry or a grown count) sets the backoff, moves the client's rows off
 * the worker, and the first one per worker is logged as a warning. Entries
 * of the client that the list no longer names are dropped (it reached the
 * worker again). `leaving`: every entry of the client goes. */
void ferry__disp_record_unreachable(ferry_disp_t *d, job_t *j, client_t *c,
                                    const Ferry__V1__ClientHeartbeatRequest *req);

#endif /* FERRY_DISPATCHER_STATE_UNREACH_H */
