/* Ranks, resumes and elastic cuts (state_ranks.c): what a rank takes of
 * an epoch and the rows of a ranked job's epoch (docs/ARCHITECTURE.md,
 * "Ranks"). Below the journal entries that build those rows. */
#ifndef FERRY_DISPATCHER_STATE_RANKS_H
#define FERRY_DISPATCHER_STATE_RANKS_H

#include "state_internal.h"

/* The records a cut of n records among w ranks of batch b
 * gives: its steps (drop: floor(n / (w x b)); pad: ceil), and rank k's
 * records (drop: steps x b; pad: an even share, the first n % w ranks
 * one more). */
uint64_t ferry__disp_cut_steps(uint64_t n, uint32_t w, uint32_t b, bool pad);
uint64_t ferry__disp_cut_quota(uint64_t n, uint32_t w, uint32_t b, bool pad,
                               uint32_t k);

/* Elastic: the positions of an epoch of n records left by
 * ncuts earlier cuts (cut i: cw[i] ranks took their first cs[i] batches
 * of b records of what the cuts before it left), as sorted disjoint
 * spans [from, to) of the epoch's order (*spans, *nspans: the caller
 * frees; NULL for none). Returns the records left. *spans is NULL and
 * the result UINT64_MAX when out of memory. */
typedef struct ferry__span_s {
  uint64_t from, to;
} ferry__span_t;
uint64_t ferry__disp_left_spans(uint64_t n, uint32_t b, bool pad,
                                const uint32_t *cw, const uint64_t *cs,
                                uint32_t ncuts, ferry__span_t **spans,
                                uint32_t *nspans);

/* The job's records in the current epoch (every split's count;
 * in an epoch resumed with another world size, what its earlier cuts
 * left), its steps per epoch, rank r's records in it, and the records
 * no rank receives (drop). */
uint64_t ferry__disp_rank_records(const job_t *j);
uint64_t ferry__disp_rank_steps(const job_t *j);
uint64_t ferry__disp_rank_quota(const job_t *j, uint32_t rank);
uint64_t ferry__disp_rank_dropped(const job_t *j);

#define FERRY__PART_DROPPED (-1)
#define FERRY__PART_TAKEN (-2)

/* Builds the rows of a ranked job's epoch from the epoch's
 * split order `perm` (job_t.part_*): j->rows, j->order, j->nrows. 0 or
 * FERRY_ENOMEM. */
int ferry__disp_plan_ranks(job_t *j, const uint32_t *perm);

/* In the epoch a resumed job starts at, marks the records its
 * earlier cuts took done (FERRY__PART_TAKEN rows) and each rank's first
 * resume_step x B records of its share (rows wholly before that point
 * done, a row across it delivered from there), counting the latter
 * taken. 0 or FERRY_ENOMEM. */
int ferry__disp_resume_rows(job_t *j);

/* The records of rank `rank` a resumed job counts taken in its
 * first epoch before any client reported (0 in any other epoch). */
uint64_t ferry__disp_resume_taken(const job_t *j, uint32_t rank);

#endif /* FERRY_DISPATCHER_STATE_RANKS_H */
