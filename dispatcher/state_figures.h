/* The figures behind GetStatus and the metrics (state_figures.c): a job's
 * stall fraction, rates and workers wanted, and which clients' figures
 * are current. The split counts and counters the metrics read are in
 * state.h. */
#ifndef FERRY_DISPATCHER_STATE_FIGURES_H
#define FERRY_DISPATCHER_STATE_FIGURES_H

#include "state_internal.h"

/* The job's stall fraction (mean over its clients), batches per second
 * (summed) and workers wanted, from the clients' latest heartbeats: the
 * last interval's figures where the client sent them. */
void ferry__disp_job_figures(const ferry_disp_t *d, const job_t *j,
                             Ferry__V1__JobStatus *s);

/* True when the client's figures are current: it is active and reported
 * within max(2 s, 4 of its heartbeat intervals). A killed client stays
 * active until its timeout, but its last rate is no longer a rate. */
bool ferry__disp_client_live(const ferry_disp_t *d, const client_t *c);

#endif /* FERRY_DISPATCHER_STATE_FIGURES_H */
