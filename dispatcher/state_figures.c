/* The figures behind the metrics and JobStatus: splits by
 * state, the counters, a job's stall fraction, batches per second and
 * workers wanted. */
#include "state_figures.h"
#include "state_leases.h"

#include <math.h>

uint32_t ferry__disp_workers_wanted(uint32_t n, const double *stall,
                                    const double *bps, size_t k,
                                    double target) {
  double demand = 0, rate = 0;
  for (size_t i = 0; i < k; i++) {
    double s = stall[i] < 0 ? 0 : stall[i] > 0.99 ? 0.99 : stall[i];
    double r = bps[i] > 0 ? bps[i] : 0;
    demand += r / (1 - s); /* what its trainer would take unstalled */
    rate += r;
  }
  if (target < 0 || target >= 1)
    target = 0;
  if (rate <= 0)
    return n > 0 ? n : 1;
  double want = ceil((n > 0 ? n : 1) * (1 - target) * demand / rate - 1e-9);
  if (want > 10000)
    want = 10000;
  uint32_t w = (uint32_t)want;
  if (w < n)
    w = n;
  return w > 0 ? w : 1;
}

void ferry__disp_split_counts(const ferry_disp_t *d, uint64_t out[3]) {
  out[0] = out[1] = out[2] = 0;
  for (size_t i = 0; i < d->njobs; i++) {
    const job_t *j = d->jobs[i];
    if (!j->started)
      continue;
    /* Leases not done are on the active list. */
    uint64_t leased = 0;
    for (uint32_t k = 0; k < j->nactive; k++)
      leased += j->rows[j->active[k].row].worker != 0;
    out[0] += j->nrows - j->ndone - leased;
    out[1] += leased;
    out[2] += j->ndone;
  }
}

void ferry__disp_counters(const ferry_disp_t *d, ferry_disp_counters_t *out) {
  *out = d->counters;
}

bool ferry__disp_client_live(const ferry_disp_t *d, const client_t *c) {
  int64_t fresh = 4 * c->ival_ms > 2000 ? 4 * c->ival_ms : 2000;
  return c->active && c->has_report && d->now - c->last_report <= fresh;
}

void ferry__disp_job_figures(const ferry_disp_t *d, const job_t *j,
                             Ferry__V1__JobStatus *s) {
  double stall[64], bps[64];
  size_t k = 0;
  uint32_t n = 0;
  int64_t newest = -1;
  for (size_t i = 0; i < d->nworkers; i++)
    n += ferry__disp_eligible(d, d->workers[i]);
  for (size_t i = 0; i < j->nclients; i++) {
    const client_t *c = &j->clients[i];
    if (c->has_report && c->last_report > newest)
      newest = c->last_report;
    if (!ferry__disp_client_live(d, c))
      continue;
    s->live_clients++;
    if (k == 64)
      continue;
    stall[k] = c->has_ival ? c->ival_stall : c->stall_fraction;
    bps[k] = c->has_ival ? c->ival_bps : c->batches_per_second;
    s->stall_fraction += stall[k];
    s->batches_per_second += bps[k];
    k++;
  }
  if (k > 0) {
    s->stall_fraction /= (double)k;
    s->figures_ms_ago = 0;
    s->workers_wanted = ferry__disp_workers_wanted(
        n, stall, bps, k, d->cfg.target_stall_fraction);
    return;
  }
  /* No live client (the job finished, or its clients left or died): the
   * whole-run figures of the clients that reported last, as of then
   * (figures_ms_ago says how old), so that a finished job still shows how
   * much its trainers waited and a dead client's rate is not taken for a
   * current one. */
  s->figures_ms_ago = newest >= 0 ? d->now - newest : -1;
  for (size_t i = 0; i < j->nclients && newest >= 0; i++) {
    const client_t *c = &j->clients[i];
    if (!c->has_report || newest - c->last_report > 2000 || k == 64)
      continue;
    stall[k] = c->stall_fraction;
    bps[k] = c->batches_per_second;
    s->stall_fraction += stall[k];
    s->batches_per_second += bps[k];
    k++;
  }
  if (k > 0)
    s->stall_fraction /= (double)k;
  s->workers_wanted = ferry__disp_workers_wanted(
      n, stall, bps, k, d->cfg.target_stall_fraction);
}
