/* Snapshots of the dispatcher's state, and the restore from disk
 * (WORKDIR/snapshot, then the journal segment that follows it). The file
 * steps and their crash safety are journal.c's (journal.h,
 * "Compaction"); the snapshot's entries are ferry.v1.JournalEntry
 * messages (journal.proto, JournalSnapshotBegin) applied by
 * state_apply.c like any other entry. */
#ifndef FERRY_DISPATCHER_SNAPSHOT_H
#define FERRY_DISPATCHER_SNAPSHOT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ferry/error.h"
#include "journal.h"
#include "state.h"

/* A capture of the state for a snapshot (snapshot.c). */
typedef struct ferry_disp_snap_s ferry_disp_snap_t;

/* Loop: captures the state for a snapshot followed by journal segment
 * `segment`: the workers' and jobs' journaled fields are copied (the rows
 * into the arrays the snapshot stores, one pass); the datasets, immutable
 * once registered, are pinned (one collected meanwhile is freed by the
 * release). NULL when out of memory. */
ferry_disp_snap_t *ferry__disp_snapshot_take(ferry_disp_t *d,
                                             uint64_t segment);

/* Any one thread, between take and release: packs the capture as framed
 * records into *out (ferry heap, *len bytes). 0 or FERRY_ENOMEM. */
int ferry__disp_snapshot_pack(const ferry_disp_snap_t *s, uint8_t **out,
                              size_t *len, ferry_error_t *err);

/* Loop: frees the capture and unpins. NULL-safe. */
void ferry__disp_snapshot_release(ferry_disp_t *d, ferry_disp_snap_t *s);

/* take + pack + release on the calling thread (tests, benchmarks). */
int ferry__disp_snapshot(ferry_disp_t *d, uint64_t segment, uint8_t **out,
                         size_t *len, ferry_error_t *err);

/* The serialized JournalSegment entry of `segment` in `buf`; its length. */
size_t ferry__disp_segment_header(uint64_t segment, uint8_t buf[16]);

/* The journal segment that follows the state's snapshot (0: none yet). */
uint64_t ferry__disp_segment(const ferry_disp_t *d);
/* A compaction made `segment` the journal's (the snapshot is durable). */
void ferry__disp_set_segment(ferry_disp_t *d, uint64_t segment);

typedef struct ferry_disp_restore_s {
  bool snapshot;             /* a snapshot was loaded */
  uint64_t snapshot_entries; /* ... its entries and bytes */
  uint64_t snapshot_bytes;
  uint64_t journal_entries; /* entries replayed from the journal */
  uint64_t journal_bytes;   /* the journal's size after the replay */
  uint64_t segment;         /* the journal's segment */
  bool stale;               /* the journal was older than the snapshot */
} ferry_disp_restore_t;

/* Rebuilds the empty state `d` from j's directory: the snapshot if any
 * (strictly: any damage refuses, naming the file and byte offset), then
 * the journal (ferry__journal_replay's rules; `recover`:
 * --journal-recover). A journal of an older segment than the snapshot
 * names is covered by it and is started afresh. Call with no sink
 * installed and no batch in flight; ends with ferry__disp_replayed. */
int ferry__disp_restore(ferry_disp_t *d, ferry_journal_t *j, bool recover,
                        int64_t now_ms, ferry_disp_restore_t *st,
                        ferry_error_t *err);

/* Empties the state (datasets, jobs, workers, counters), keeping its
 * configuration and sink: the start of a rebuild from disk. */
void ferry__disp_reset(ferry_disp_t *d, int64_t now_ms);

#endif /* FERRY_DISPATCHER_SNAPSHOT_H */
