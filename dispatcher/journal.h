/* The dispatcher's durable state: WORKDIR/snapshot (the live state at one
 * point) and WORKDIR/journal (the changes since), both sequences of
 * serialized ferry.v1.JournalEntry messages in TFRecord framing.
 *
 * Per-entry checksum: every record carries the masked CRC-32C of its
 * 8-byte length and the masked CRC-32C of its data (the TFRecord frame,
 * common/include/tfrecord.h), so a flipped bit anywhere in an entry
 * (length or payload) is caught before the entry is parsed; the protobuf
 * parse and the state's own checks (state_apply.c) come on top.
 *
 * Group commit. Appends are buffered in memory (loop thread). A batch
 * takes every entry appended so far (ferry__journal_batch_begin, loop),
 * writes it at the durable end of the file and fdatasyncs it
 * (ferry__journal_batch_write, any one thread: the loop keeps appending
 * meanwhile to a second buffer), then ferry__journal_batch_end (loop)
 * moves the durable position. Positions are logical byte counts over the
 * journal's whole life (they keep growing across compactions): a caller
 * that saw ferry__journal_appended() == P may say what it did once
 * ferry__journal_durable() >= P.
 *
 * A failed write or sync is not sticky: batch_end cuts the file back to
 * its durable size and drops the batch and everything appended after it
 * (the caller rebuilds its state from disk, see ferry__disp_restore), and
 * the next batch tries again.
 *
 * Compaction (ferry__journal_compact_begin): the batch is a snapshot of
 * the state, which covers every entry appended so far; it is packed on
 * the batch's thread (a callback). Its steps, each of which a crash may
 * follow:
 *   1. write WORKDIR/snapshot.tmp, fsync it;
 *   2. rename it over WORKDIR/snapshot, fsync the directory;
 *   3. cut the journal to 0 bytes and write the new segment's header
 *      entry (JournalSegment), fdatasync.
 * The snapshot names the segment that follows it; a journal whose header
 * names an older segment (or has none) is covered by the snapshot and is
 * started afresh at the next start (ferry__disp_restore). So a crash
 * anywhere leaves either the old snapshot and the old journal, or the new
 * snapshot (and a stale or new journal): the same state in both cases,
 * minus batches that were never acknowledged.
 */
#ifndef FERRY_DISPATCHER_JOURNAL_H
#define FERRY_DISPATCHER_JOURNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "ferry/error.h"

typedef struct ferry_journal_s ferry_journal_t;

/* Receives one entry during a replay; a non-zero return stops the replay
 * with that code (fill `err`). `offset` is the record's byte offset. */
typedef int (*ferry_journal_entry_cb)(const uint8_t *entry, size_t len,
                                      uint64_t offset, void *arg,
                                      ferry_error_t *err);

/* Opens (creating `dir` and the file if needed) DIR/journal. Errors name
 * the path. A missing journal beside DIR/snapshot (or snapshot.tmp) is
 * refused (FERRY_EINVAL, naming both files and --journal-recover) and
 * nothing is created: no crash leaves that state, since the journal is
 * created before the first compaction and only ever truncated in place.
 * With `recover` (--journal-recover) an empty journal is created with a
 * warning, and the restore starts from the snapshot alone. */
int ferry__journal_open(const char *dir, bool recover, ferry_journal_t **out,
                        ferry_error_t *err);

/* Replays every entry from the start of the file through `cb`. On a bad
 * record at byte offset X, the rest of the file is searched (from X + 1)
 * for an offset where a complete valid record starts (length CRC and
 * data CRC both verify):
 *   - none: a torn tail (the last entry cut short, or zeros or garbage a
 *     crash left from inside it to the end of the file). The file is
 *     truncated at X, a warning "journal: cut N torn bytes at offset X"
 *     is logged and the replay succeeds;
 *   - one, `recover` false: corruption. The replay fails with the
 *     reader's code and an error naming X (and the valid record's
 *     offset); nothing is cut;
 *   - one, `recover` true (--journal-recover): the file is truncated at X
 *     (the last good entry ends there) and an error-level line says what
 *     was dropped: the bytes, their offset and the valid entries among
 *     them. The replay succeeds.
 * An entry that frames correctly but `cb` refuses fails with an error
 * naming its offset. Stores the number of entries in *n (may be NULL).
 * Call before the first append. */
int ferry__journal_replay(ferry_journal_t *j, ferry_journal_entry_cb cb,
                          void *arg, bool recover, uint64_t *n,
                          ferry_error_t *err);

/* Replays DIR/snapshot strictly: any framing or CRC error, and any entry
 * `cb` refuses, fails naming the file and the byte offset (a snapshot has
 * no torn tail: it is renamed into place complete). *found is false (and
 * 0 returned) when there is no snapshot. Removes a leftover
 * DIR/snapshot.tmp (a compaction that crashed before its rename). */
int ferry__journal_read_snapshot(const char *dir, ferry_journal_entry_cb cb,
                                 void *arg, bool *found, uint64_t *n,
                                 uint64_t *bytes, ferry_error_t *err);

/* Empties the journal and writes `header` (one serialized entry, framed
 * here) as its first entry, durably. Synchronous; no batch in flight. */
int ferry__journal_reset(ferry_journal_t *j, const uint8_t *header,
                         size_t len, ferry_error_t *err);

/* Buffers one framed entry (no I/O). Out of memory is reported by the
 * next batch (and fails it). */
void ferry__journal_append(ferry_journal_t *j, const uint8_t *entry,
                           size_t len);

/* Loop: takes the entries appended so far as the next batch. False (and
 * nothing taken) when nothing is appended or a batch is in flight. */
bool ferry__journal_batch_begin(ferry_journal_t *j);

/* Packs a snapshot on the batch's thread: framed records (see
 * ferry__journal_frame) in *out (ferry heap, taken over). 0 or an error
 * (the compaction then fails like a write). */
typedef int (*ferry_journal_pack_cb)(void *arg, uint8_t **out, size_t *len,
                                     ferry_error_t *err);

/* Loop: takes a compaction as the next batch instead: batch_write first
 * calls `pack` (on its thread) for the snapshot, which must hold the
 * state with every entry appended so far; `header` (one serialized
 * entry, copied) becomes the new journal segment's first entry. False
 * (nothing taken) when a batch is in flight. */
bool ferry__journal_compact_begin(ferry_journal_t *j,
                                  ferry_journal_pack_cb pack, void *arg,
                                  const uint8_t *header, size_t header_len);

/* Any one thread, between begin and end: writes the batch and makes it
 * durable. Returns 0 or the error naming the path, the step and errno.
 * Touches nothing the loop uses meanwhile. */
int ferry__journal_batch_write(ferry_journal_t *j, ferry_error_t *err);

/* Loop: ends the batch with batch_write's result. 0: the batch is
 * durable. Else the file is cut back to its durable size and the batch
 * and every entry appended since are dropped (the caller's state is then
 * ahead of the disk: rebuild it). */
void ferry__journal_batch_end(ferry_journal_t *j, int rc);

/* begin + write + end on the calling thread; 0 when nothing to write. */
int ferry__journal_sync(ferry_journal_t *j, ferry_error_t *err);

/* Logical positions (bytes over the journal's life): appended so far,
 * and made durable (by a batch or a compaction). */
uint64_t ferry__journal_appended(const ferry_journal_t *j);
uint64_t ferry__journal_durable(const ferry_journal_t *j);
bool ferry__journal_busy(const ferry_journal_t *j); /* a batch in flight */

/* Size of the file in bytes (durable), the number of batches that wrote
 * something, the entries appended (since open, dropped ones included),
 * how long the last batch_write took (ns), and the size of the last
 * snapshot written or read (0: none). Nothing here counts into the
 * metrics: dmetrics.c and the group commit read these. */
uint64_t ferry__journal_size(const ferry_journal_t *j);
uint64_t ferry__journal_syncs(const ferry_journal_t *j);
uint64_t ferry__journal_appends(const ferry_journal_t *j);
int64_t ferry__journal_batch_ns(const ferry_journal_t *j);
uint64_t ferry__journal_snapshot_size(const ferry_journal_t *j);
void ferry__journal_set_snapshot_size(ferry_journal_t *j, uint64_t n);
const char *ferry__journal_dir(const ferry_journal_t *j);

/* Frames `len` bytes of `entry` as one TFRecord record at the end of
 * *buf (grown as needed). Returns 0 or FERRY_ENOMEM. */
int ferry__journal_frame(uint8_t **buf, size_t *len, size_t *cap,
                         const uint8_t *entry, size_t elen);

/* Syncs what is buffered (errors are logged) and closes. NULL-safe. */
void ferry__journal_close(ferry_journal_t *j);

/* Adapter for ferry__disp_set_sink: `arg` is the journal. */
void ferry__journal_sink(const uint8_t *entry, size_t len, void *arg);

/* ---- Test seams -----------------------------------------------------------
 * Every write and sync of the journal and the snapshot goes through these
 * (NULL restores the system calls), so tests inject ENOSPC or EIO. */
typedef struct ferry_journal_io_s {
  ssize_t (*pwrite)(int fd, const void *buf, size_t n, off_t off);
  int (*fsync)(int fd); /* fsync and fdatasync both */
} ferry_journal_io_t;
void ferry__journal_set_io(const ferry_journal_io_t *io);

/* Compaction stops, as if the process died, right before step `step`
 * (1: before writing snapshot.tmp ... see FERRY_JOURNAL_STEPS), leaving
 * the files as they are; batch_write then returns FERRY_ECANCELED.
 * 0: never. */
#define FERRY_JOURNAL_STEPS 8
void ferry__journal_set_crash_step(int step);

/* Test-only, for the daemon's tests: FERRY_JOURNAL_SYNC_DELAY_MS (1 to
 * 60000) makes every sync take that much longer, so that a test can see
 * answers held for a pending batch. Called once by main(). */
void ferry__journal_test_env(void);

#endif /* FERRY_DISPATCHER_JOURNAL_H */
