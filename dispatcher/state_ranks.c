/* The rank plan of a ranked job's epoch: quotas, the
 * parts of splits each rank takes, and where a resumed epoch starts,
 * including one resumed with another world size (docs/ARCHITECTURE.md,
 * "Ranks", "Deterministic order", "Elastic"). */
#include <stdlib.h>

#include "state_ranks.h"

uint64_t ferry__disp_cut_steps(uint64_t n, uint32_t w, uint32_t b, bool pad) {
  uint64_t round = (uint64_t)w * b;
  if (round == 0)
    return 0;
  return pad ? (n + round - 1) / round : n / round;
}

uint64_t ferry__disp_cut_quota(uint64_t n, uint32_t w, uint32_t b, bool pad,
                               uint32_t k) {
  if (w == 0 || k >= w)
    return 0;
  /* Under pad every record is delivered: an even share, so that every
   * rank's real records fill all its batches but the last (a share is at
   * least floor(n / w) >= (S - 1) x b records). */
  if (pad)
    return n / w + (k < n % w ? 1 : 0);
  return ferry__disp_cut_steps(n, w, b, pad) * b;
}

/* Appends [from, to) to spans, merging it with the last one it touches. */
static void span_add(ferry__span_t *sp, uint32_t *n, uint64_t from,
                     uint64_t to) {
  if (from >= to)
    return;
  if (*n > 0 && sp[*n - 1].to == from)
    sp[*n - 1].to = to;
  else
    sp[(*n)++] = (ferry__span_t){from, to};
}

uint64_t ferry__disp_left_spans(uint64_t n, uint32_t b, bool pad,
                                const uint32_t *cw, const uint64_t *cs,
                                uint32_t ncuts, ferry__span_t **spans,
                                uint32_t *nspans) {
  uint32_t ns = 0;
  ferry__span_t *sp = ferry__calloc(1, sizeof(*sp));
  *spans = NULL;
  *nspans = 0;
  if (sp == NULL)
    return UINT64_MAX;
  span_add(sp, &ns, 0, n);
  uint64_t left = n;
  for (uint32_t i = 0; i < ncuts; i++) {
    /* Cut i shares what is left (R) among cw[i] ranks: rank k's share is
     * R's offsets [at_k, at_k + quota_k), and it took the first
     * min(cs[i] x b, quota_k) of them. Each rank's take splits at most
     * one span in two: R gains at most cw[i] spans. */
    uint32_t w = cw[i];
    ferry__span_t *out = ferry__calloc((size_t)ns + w + 1, sizeof(*out));
    if (out == NULL) {
      ferry__free(sp);
      return UINT64_MAX;
    }
    uint32_t no = 0, si = 0;
    uint64_t ro = 0; /* R's offset at the start of span si */
    uint64_t pos = 0, taken = 0;
    uint64_t at = 0; /* R's offset where the next rank's share starts */
    for (uint32_t k = 0; k <= w; k++) {
      /* Keep R's offsets [pos, keep_to), then skip [keep_to, skip_to). */
      uint64_t q = k < w ? ferry__disp_cut_quota(left, w, b, pad, k) : 0;
      uint64_t take = k < w ? (cs[i] * b < q ? cs[i] * b : q) : 0;
      uint64_t keep_to = k < w ? at : left, skip_to = keep_to + take;
      at += q;
      while (pos < skip_to && si < ns) {
        uint64_t len = sp[si].to - sp[si].from;
        uint64_t off = pos - ro, end = ro + len;
        if (pos < keep_to) {
          uint64_t stop = keep_to < end ? keep_to : end;
          span_add(out, &no, sp[si].from + off, sp[si].from + (stop - ro));
          pos = stop;
        } else {
          pos = skip_to < end ? skip_to : end;
        }
        if (pos >= end) {
          ro = end;
          si++;
        }
      }
      taken += take;
    }
    ferry__free(sp);
    sp = out;
    ns = no;
    left -= taken;
  }
  *spans = sp;
  *nspans = ns;
  return left;
}

uint64_t ferry__disp_rank_records(const job_t *j) {
  if (j->ncuts > 0 && j->epoch == j->resume_epoch)
    return j->resume_left;
  return j->ds->known_records;
}

uint64_t ferry__disp_rank_steps(const job_t *j) {
  return ferry__disp_cut_steps(ferry__disp_rank_records(j), j->world_size,
                               j->batch, j->pad);
}

uint64_t ferry__disp_rank_quota(const job_t *j, uint32_t rank) {
  return ferry__disp_cut_quota(ferry__disp_rank_records(j), j->world_size,
                               j->batch, j->pad, rank);
}

uint64_t ferry__disp_rank_dropped(const job_t *j) {
  if (j->world_size == 0 || j->pad)
    return 0;
  return ferry__disp_rank_records(j) -
         ferry__disp_rank_steps(j) * j->batch * j->world_size;
}

int ferry__disp_plan_ranks(job_t *j, const uint32_t *perm) {
  uint32_t ns = j->ds->nsplits, w = j->world_size;
  /* The positions the epoch shares: all of it, or in the epoch a job
   * resumed with another world size, what its earlier cuts left. */
  ferry__span_t *sp = NULL, whole = {0, j->ds->known_records};
  uint32_t nsp = 1;
  if (j->ncuts > 0 && j->epoch == j->resume_epoch) {
    if (ferry__disp_left_spans(j->ds->known_records, j->batch, j->pad,
                               j->cut_world, j->cut_step, j->ncuts, &sp,
                               &nsp) == UINT64_MAX)
      return FERRY_ENOMEM;
  } else {
    sp = &whole;
  }
  /* Rows end at split ends, rank boundaries and span edges. */
  size_t cap = (size_t)ns + w + 2 * (size_t)nsp + 1;
  int rc = FERRY_ENOMEM;
  j->rows = ferry__calloc(cap, sizeof(row_t));
  j->order = ferry__calloc(cap, sizeof(uint32_t));
  j->row_end = ferry__calloc(cap, sizeof(uint64_t));
  j->part_split = ferry__calloc(cap, sizeof(uint32_t));
  j->part_base = ferry__calloc(cap, sizeof(uint64_t));
  j->part_rank = ferry__calloc(cap, sizeof(int32_t));
  j->part_roff = ferry__calloc(cap, sizeof(uint64_t));
  j->split_part = ferry__calloc(ns ? ns : 1, sizeof(uint32_t));
  j->split_nparts = ferry__calloc(ns ? ns : 1, sizeof(uint32_t));
  if (j->rows == NULL || j->order == NULL || j->row_end == NULL ||
      j->part_split == NULL || j->part_base == NULL || j->part_rank == NULL ||
      j->part_roff == NULL || j->split_part == NULL ||
      j->split_nparts == NULL)
    goto out;
  /* Rank k takes the offsets [b_k - quota(k), b_k) of the shared
   * positions, b_k = quota(0) + ... + quota(k); what lies past b_{W-1} is
   * dropped. p walks the epoch's order, o the shared offsets. Rows are
   * numbered in the epoch's order. */
  uint64_t p = 0, o = 0, b = ferry__disp_rank_quota(j, 0);
  uint32_t k = 0, n = 0, si = 0;
  while (k < w && o >= b && ++k < w)
    b += ferry__disp_rank_quota(j, k);
  for (uint32_t i = 0; i < ns; i++) {
    uint32_t s = perm[i];
    uint64_t t = j->ds->splits[s].count, at = 0;
    j->split_part[s] = n;
    do {
      while (si < nsp && sp[si].to <= p)
        si++;
      bool shared = si < nsp && sp[si].from <= p;
      uint64_t len = t - at;
      if (shared && sp[si].to - p < len)
        len = sp[si].to - p;
      if (shared && k < w && b - o < len)
        len = b - o;
      if (!shared && si < nsp && sp[si].from - p < len)
        len = sp[si].from - p;
      if (n == cap) {
        rc = FERRY_EINVAL; /* cannot happen: see cap */
        goto out;
      }
      row_t *row = &j->rows[n];
      uint64_t stop = at + len;
      row->total = stop;
      row->total_known = t > 0;
      row->delivered = row->start = at;
      row->rank = n;
      /* Not issued yet, but naming its part already: a client bound to
       * the row before any worker took it keys it by this. */
      row->lease = ferry__lease_floor(0, n - j->split_part[s]);
      j->order[n] = n;
      j->row_end[n] = 0;
      j->part_split[n] = s;
      j->part_base[n] = at;
      j->part_rank[n] = !shared ? FERRY__PART_TAKEN
                        : k < w ? (int32_t)k
                                : FERRY__PART_DROPPED;
      /* Where the part starts in its rank's share. */
      j->part_roff[n] =
          shared && k < w ? o - (b - ferry__disp_rank_quota(j, k)) : 0;
      n++;
      p += len;
      if (shared)
        o += len;
      at = stop;
      while (k < w && o >= b && ++k < w)
        b += ferry__disp_rank_quota(j, k);
    } while (at < t);
    j->split_nparts[s] = n - j->split_part[s];
  }
  j->nrows = n;
  rc = 0;
out:
  if (sp != &whole)
    ferry__free(sp);
  return rc;
}

uint64_t ferry__disp_resume_taken(const job_t *j, uint32_t rank) {
  if (j->world_size == 0 || j->epoch != j->resume_epoch ||
      j->resume_step == 0)
    return 0;
  uint64_t q = ferry__disp_rank_quota(j, rank);
  uint64_t at = j->resume_step * j->batch;
  return at < q ? at : q;
}

int ferry__disp_resume_rows(job_t *j) {
  if (j->part_roff == NULL || j->epoch != j->resume_epoch ||
      (j->resume_step == 0 && j->ncuts == 0))
    return 0;
  for (uint32_t r = 0; r < j->nrows; r++) {
    int32_t k = j->part_rank[r];
    row_t *row = &j->rows[r];
    if (k == FERRY__PART_TAKEN) {
      /* Taken by an earlier cut: neither this job's nor any rank's. */
      row->delivered = row->start = row->total;
      row->done = true;
    } else {
      if (k < 0)
        continue;
      uint64_t skip = ferry__disp_resume_taken(j, (uint32_t)k);
      uint64_t from = j->part_roff[r], n = row->total - j->part_base[r];
      if (skip <= from)
        continue; /* the row lies after the cursor */
      if (skip >= from + n) {
        row->delivered = row->start = row->total;
        row->done = true;
      } else {
        row->delivered = row->start = j->part_base[r] + (skip - from);
      }
    }
    if (ferry__disp_row_changed(j, r, false) != 0)
      return FERRY_ENOMEM;
  }
  for (uint32_t k = 0; k < j->world_size; k++)
    j->rank_taken[k] = ferry__disp_resume_taken(j, k);
  return 0;
}
