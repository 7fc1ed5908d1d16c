/* The worker's prefix cache (docs/ARCHITECTURE.md, "The prefix cache"):
 * the directory of entries (--cache-dir, bounded by --cache-bytes), its
 * counters, and per compiled pipeline the deterministic prefix and the
 * policy that chooses between reading an entry and recomputing, from
 * costs measured on this worker. The entries' file format is
 * common/src/pipeline/pcache.c's. */
#ifndef FERRY_WORKER_CACHE_H
#define FERRY_WORKER_CACHE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "ferry/error.h"
#include "pipeline.h"
#include "spec.h"

/* The policy's choice for a pipeline (CacheReport.choice names them). */
typedef enum {
  FERRY__WC_NO_PREFIX = 0, /* nothing deterministic to cache */
  FERRY__WC_MEASURING,     /* too few records timed: write, read hits */
  FERRY__WC_CACHE,         /* reading costs less than recomputing */
  FERRY__WC_RECOMPUTE      /* recomputing costs less */
} ferry__wc_choice_t;

const char *ferry__wc_choice_name(ferry__wc_choice_t c);

typedef struct ferry__wcache_s {
  char *dir;
  uint64_t budget; /* --cache-bytes */
  /* CPU seconds per byte to read and check an entry, measured at open on
   * a file in the directory; replaced by what reads measure. */
  double read_ns_per_byte;
  /* Bytes and entries in the directory: the scan at open, plus what
   * this worker committed since (others sharing it are not seen). */
  atomic_uint_least64_t held, entries;
  atomic_uint_least64_t hits, misses, read_bytes, written_bytes, corrupt;
  atomic_uint_least64_t full; /* entries not written: over the budget */
} ferry__wcache_t;

/* One pipeline's prefix and costs (held by ferry__wpipe_t). Sums in
 * nanoseconds of thread CPU time, under mu. */
typedef struct ferry__wpolicy_s {
  pthread_mutex_t mu;
  int det_ops;      /* ferry__spec_det_prefix; -1: none */
  const char *why;  /* its sentence */
  size_t n_ops;
  uint64_t prefix_fp;
  uint64_t dataset_fp; /* the whole spec's fingerprint: the dataset id */
  /* The prefix compiled alone; NULL when it is the whole pipeline or
   * there is none. */
  ferry_pipeline_t *prefix;
  double recompute_ns; /* the whole pipeline, uncached */
  uint64_t n_recompute;
  double prefix_ns; /* the prefix alone (while writing) */
  uint64_t n_prefix;
  double suffix_ns; /* the ops after the prefix, on its output */
  uint64_t n_suffix;
  double entry_bytes;
  uint64_t n_entries;
  double read_ns, read_bytes; /* entries read back */
  uint64_t hits, misses;
  bool full; /* an entry was not written: over the budget */
  ferry__wc_choice_t choice;
  char reason[400];
} ferry__wpolicy_t;

/* Opens the cache in `dir` (created if missing): removes temporary files
 * a killed worker left, counts the entries, measures the read cost. */
int ferry__wcache_open(ferry__wcache_t *c, const char *dir, uint64_t budget,
                       ferry_error_t *err);
void ferry__wcache_close(ferry__wcache_t *c);

/* A policy for a compiled spec (NULL when out of memory). */
ferry__wpolicy_t *ferry__wpolicy_new(const ferry_spec_t *spec);
void ferry__wpolicy_free(ferry__wpolicy_t *p);

/* Chooses from the costs measured so far and fills p->reason; mu held. */
ferry__wc_choice_t ferry__wpolicy_decide_locked(const ferry__wcache_t *c,
                                                ferry__wpolicy_t *p);

/* Thread CPU time in nanoseconds. */
int64_t ferry__thread_cpu_ns(void);

#endif /* FERRY_WORKER_CACHE_H */
