/* The dispatcher's journal: WORKDIR/journal, one serialized
 * ferry.v1.JournalEntry per TFRecord-framed record.
 *
 * Appends are buffered in memory and made durable by ferry__journal_sync
 * (write, then fdatasync), which the RPC layer calls once per mutating
 * call before it answers: every entry a call produced shares one fsync.
 * A failed write or sync is sticky: the journal refuses further appends
 * and the daemon must stop (its memory is ahead of its disk).
 *
 * There is no snapshot: the journal grows with the number of state
 * changes (about 30 to 60 bytes per assignment and per progress report),
 * and a restart replays all of it.
 */
#ifndef FERRY_DISPATCHER_JOURNAL_H
#define FERRY_DISPATCHER_JOURNAL_H

#include <stddef.h>
#include <stdint.h>

#include "ferry/error.h"

typedef struct ferry_journal_s ferry_journal_t;

/* Receives one entry during replay; a non-zero return stops the replay
 * with that code (fill `err`). */
typedef int (*ferry_journal_entry_cb)(const uint8_t *entry, size_t len,
                                      void *arg, ferry_error_t *err);

/* Opens (creating `dir` and the file if needed) DIR/journal for
 * appending. Errors name the path. */
int ferry__journal_open(const char *dir, ferry_journal_t **out,
                        ferry_error_t *err);

/* Replays every entry from the start of the file through `cb`. On a bad
 * record at byte offset X, the rest of the file is searched (from X + 1)
 * for an offset where a complete valid record starts (length CRC and
 * data CRC both verify):
 *   - none: a torn tail (the last entry cut short, or zeros or garbage a
 *     crash left from inside it to the end of the file). The file is
 *     truncated at X, a warning "journal: cut N torn bytes at offset X"
 *     is logged and the replay succeeds;
 *   - one: corruption. The replay fails with the reader's code and an
 *     error naming X (and the valid record's offset); nothing is cut.
 * An entry that frames correctly but `cb` refuses fails with an error
 * naming its offset. Stores the number of entries in *n (may be NULL).
 * Call before the first append. */
int ferry__journal_replay(ferry_journal_t *j, ferry_journal_entry_cb cb,
                          void *arg, uint64_t *n, ferry_error_t *err);

/* Buffers one framed entry (no I/O). Out of memory is sticky and reported
 * by the next sync. */
void ferry__journal_append(ferry_journal_t *j, const uint8_t *entry,
                           size_t len);

/* Writes the buffered entries and fdatasyncs; nothing to do when the
 * buffer is empty. Returns 0 or the (sticky) error naming the path. */
int ferry__journal_sync(ferry_journal_t *j, ferry_error_t *err);

/* Size of the file in bytes (after the last sync), and the number of
 * syncs that wrote something. */
uint64_t ferry__journal_size(const ferry_journal_t *j);
uint64_t ferry__journal_syncs(const ferry_journal_t *j);

/* Syncs what is buffered (errors are logged) and closes. NULL-safe. */
void ferry__journal_close(ferry_journal_t *j);

/* Adapter for ferry__disp_set_sink: `arg` is the journal. */
void ferry__journal_sink(const uint8_t *entry, size_t len, void *arg);

#endif /* FERRY_DISPATCHER_JOURNAL_H */
