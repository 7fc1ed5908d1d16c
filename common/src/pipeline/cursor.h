#ifndef FERRY_CURSOR_H
#define FERRY_CURSOR_H

/* Checkpoint cursors: where a ranked job in deterministic order
 * stands, small and versioned, so that a trainer restarted from a
 * checkpoint resumes its input exactly. The bytes are "FERRYCUR" and a
 * ferry.v1.Cursor message; this file and cursor.c own them. */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ferry/error.h"

#define FERRY_CURSOR_VERSION 1
#define FERRY_CURSOR_MAX_BYTES 4096
/* Changes of world size one epoch's cursor can carry. */
#define FERRY_CURSOR_MAX_CUTS 16

/* One cut of an epoch (a resume with another world size makes a new one):
 * world_size ranks took their first `step` batches of what the cuts
 * before it left. */
typedef struct ferry_cursor_cut_s {
  uint32_t world_size;
  uint64_t step;
} ferry_cursor_cut_t;

typedef struct ferry_cursor_s {
  uint32_t version;
  char dataset_id[65]; /* the spec's fingerprint (hex) */
  bool shuffle;
  uint64_t seed;
  uint32_t epoch; /* the next batch is batch `step` of `epoch` */
  uint64_t step;
  uint32_t world_size;
  uint32_t batch_size;
  bool pad; /* padding, not drop_remainder */
  uint64_t records_per_epoch;
  /* The epoch's earlier cuts, oldest first; the current one is
   * (world_size, step). */
  uint32_t ncuts;
  ferry_cursor_cut_t cuts[FERRY_CURSOR_MAX_CUTS];
} ferry_cursor_t;

/* Writes the cursor into buf (cap bytes); *len its size. FERRY_ERANGE
 * when cap is too small (*len then says how much is needed). */
int ferry__cursor_encode(const ferry_cursor_t *cur, uint8_t *buf, size_t cap,
                         size_t *len);

/* Reads a cursor. FERRY_EINVAL with err naming what is wrong: not a Ferry
 * cursor, a malformed one, or one of another format version. */
int ferry__cursor_decode(const void *buf, size_t len, ferry_cursor_t *cur,
                         ferry_error_t *err);

#endif
