/* The dataset scan: the steps of RegisterDataset that run off the loop
 * (state.h, "RegisterDataset in steps", tells the order) and own every
 * file I/O of the state machine. A registration (ferry_disp_reg_t)
 * carries all they touch; they never see ferry_disp_t, and nothing here
 * knows the state. The loop steps (state_datasets.c) fill and read the
 * same registration. */
#ifndef FERRY_DISPATCHER_SCAN_H
#define FERRY_DISPATCHER_SCAN_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ferry/error.h"
#include "roots.h"
#include "spec.h"

/* 32 bytes: a dataset holds one per split. A split holds at
 * most records_per_split (<= 2^24) records, so its count fits 32 bits. */
typedef struct split_s {
  uint32_t file;
  uint32_t count;       /* 0: unknown */
  uint64_t offset, end; /* end 0: end of file */
  uint64_t first;
} split_t;
_Static_assert(sizeof(split_t) == 32, "split_t grew");

/* A file as this process scanned it. Datasets over the same files (the
 * same data under another pipeline) share the scan of a file whose
 * identity and times did not change since. */
typedef struct scanned_s {
  bool valid; /* scanned (or reused) by this process, not replayed */
  uint64_t dev, ino, size;
  int64_t mtime_ns, ctime_ns;
  int64_t at_ns; /* CLOCK_REALTIME when it was stat'ed for the scan */
} scanned_t;

/* File times tick coarsely (a clock tick): a file modified less than this
 * before its scan might change again without a new time, so its scan is
 * not shared (git's "racily clean" rule). */
#define SCAN_RACY_NS 100000000

typedef struct splits_s {
  split_t *v;
  size_t n, cap;
} splits_t;

/* What a registration owns (state.h names it too). The loop sets the first
 * block in begin; the thread steps fill the rest, reuse fills `reused`
 * and `reuse`. Steps never overlap: each hands over to the next through
 * libuv (uv_queue_work and its after callback), which orders memory. */
struct ferry_disp_reg_s {
  ferry_spec_t spec; /* a private copy */
  uint8_t *canon;    /* its canonical serialization */
  size_t clen;
  char id[17];
  uint32_t per;
  uint32_t max_files; /* FERRY_DISP_MAX_FILES */
  uint64_t max_record_len;
  const ferry_roots_t *roots; /* the daemon's: immutable while it runs */

  char **files;
  size_t nfiles;
  scanned_t *scanned; /* per file: identity from stat, then from the scan */
  splits_t *reused;   /* per file: splits copied by reuse */
  uint8_t *reuse;     /* per file: 0 scan it, 1 reused, 2 reuse ran out of
                       * memory */
  splits_t sp;        /* every split, in file order */
  int rc;
  ferry_error_t err;
  atomic_bool cancel;
};
typedef struct ferry_disp_reg_s ferry_disp_reg_t;

/* Any thread. Checks the patterns against the data roots, expands them,
 * checks the file count, every file's root and UTF-8 name, and stats the
 * files. */
void ferry__disp_reg_expand(ferry_disp_reg_t *r);

/* Any thread. Scans the files not reused. Test-only: the environment
 * variable FERRY_DISP_SCAN_DELAY_MS (milliseconds, at most 60000) makes
 * it wait that long first, to stand for a slow file system. */
void ferry__disp_reg_scan(ferry_disp_reg_t *r);

/* Any thread. Makes a running expand or scan stop early (between files,
 * or during the test delay) with FERRY_ECANCELED. */
void ferry__disp_reg_cancel(ferry_disp_reg_t *r);

/* Any thread. Frees the registration. */
void ferry__disp_reg_free(ferry_disp_reg_t *r);

/* scan.c */

/* Appends a split: 0 or FERRY_ENOMEM. */
int ferry__disp_push_split(splits_t *s, const split_t *sp);

/* Whether `now` is the file `then` was, unchanged since it was scanned. */
bool ferry__disp_same_file(const scanned_t *then, const scanned_t *now);

#endif /* FERRY_DISPATCHER_SCAN_H */
