/* DALI index files next to shards: SHARD.idx (what `ferryctl records
 * index` and DALI's tfrecord2idx write: one "<offset> <size>" line per
 * record, size including the 16 framing bytes) lets the dispatcher cut an
 * uncompressed shard into splits without its header scan.
 *
 * An index is trusted only when it describes the shard as it is now:
 *   - the shard is not newer than the index (mtime);
 *   - the first entry starts at 0 and each next one where the previous
 *     record ends (offsets strictly increasing, no gap, no overlap);
 *   - the last record ends at the shard's size;
 *   - no record is longer than the dispatcher's maximum;
 *   - the shard's first and last record headers (12 bytes each, two
 *     preads) pass their length CRC and hold the lengths the index gives.
 * Contiguity plus the size make every offset a record boundary unless the
 * shard was rewritten with the same size and an older mtime; the two
 * header reads catch most of what remains at the cost of two reads
 * instead of one per 64 KiB window. Anything else is ignored with a
 * warning naming the index file, and the shard is scanned.
 */
#ifndef FERRY_DISPATCHER_SHARD_INDEX_H
#define FERRY_DISPATCHER_SHARD_INDEX_H

#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#include "roots.h"
#include "tfrecord.h"

/* Loads PATH.idx for the uncompressed shard `path` (open as `fd`, whose
 * fstat is `st`), opened through `roots` (ferry__roots_open_file: an index
 * outside them, or a symlink swapped in, is not read). Returns 1 with the
 * entries in *out (ferry__free) and their count in *n when the index exists and
 * is trusted (see above); 0 when there is none, or it is stale or malformed (a
 * warning naming the index file was logged); FERRY_ENOMEM. */
int ferry__shard_index_load(const ferry_roots_t *roots, const char *path,
                            int fd, const struct stat *st, uint64_t max_len,
                            ferry_tfr_index_entry_t **out, size_t *n);

#endif /* FERRY_DISPATCHER_SHARD_INDEX_H */
