#ifndef FERRY_PCACHE_H
#define FERRY_PCACHE_H

/* The prefix cache's files: a worker keeps, per TFRecord split, the output
 * images of the deterministic prefix of a pipeline, so that later epochs
 * read them instead of recomputing. This file and pcache.c own the format;
 * everything else calls them.
 *
 * A cache entry is one file, named by ferry__pcache_entry_name, in the
 * cache directory. It is a sequence of TFRecord-framed records (the
 * records layer's framing: u64 length, u32 masked crc32c of those 8
 * bytes, the data, u32 masked crc32c of the data). Every integer is
 * little-endian. Byte offsets below are within a record's data.
 *
 *   1. Header record, at offset 0, 68 + path_len data bytes:
 *        0  "FERRYPC1"        8 bytes
 *        8  prefix_fp         u64
 *       16  file_size         u64
 *       24  mtime_ns          i64
 *       32  byte_offset       u64
 *       40  byte_end          u64
 *       48  first_record      u64
 *       56  max_records       u64
 *       64  path_len          u32
 *       68  path              path_len bytes, no NUL
 *   2. Entries, one per record of the split, in any order (the writer
 *      writes them in the order they are added), 44 + h*w*c data bytes:
 *        0  pos               u64 (position in the split, file order, 0..)
 *        8  index             u64 (record index in the shard)
 *       16  offset            u64 (byte offset of the record in the shard)
 *       24  label             i64
 *       32  h, w, c           u32 each (h, w > 0 and <= INT_MAX; 1..4 c)
 *       44  pixels            h*w*c bytes (HWC, u8)
 *   3. Footer record, 16 + 8n data bytes:
 *        0  "FERRYPCF"        8 bytes
 *        8  n                 u64 (entries)
 *       16  offsets[n]        u64 each: offsets[pos] is the file offset of
 *                             entry pos's 12-byte header
 *   4. Trailer record, the file's last 32 bytes (12 + 16 + 4):
 *        0  "FERRYPCT"        8 bytes
 *        8  footer_offset     u64 (file offset of the footer's header)
 *
 * A reader starts at the trailer, then reads the footer (which must end
 * where the trailer begins) and the header, and checks every offset
 * against the space between the header and the footer. An entry is
 * checked when it is read (both CRCs, its stored pos, its shape).
 *
 * The file name: "<prefix_fp, 16 hex>-<hash, 16 hex>.fpc", where hash is
 * 64-bit FNV-1a (offset basis 0xcbf29ce484222325, prime 0x100000001b3)
 * over the header's key bytes (offsets 8 to the end of the path above,
 * the same fields in the same order and encoding), then splitmix64's
 * finaliser (z ^= z >> 30; z *= 0xbf58476d1ce4e5b9; z ^= z >> 27;
 * z *= 0x94d049bb133111eb; z ^= z >> 31). It only names files: the key in
 * the header is compared field by field on open, so a collision is a
 * mismatch, never a wrong hit. A writer works in "<name>.tmp.<16 hex>"
 * and renames it into place on commit.
 *
 * Errors. Damage (ferry__pcache_damaged is true for exactly these codes):
 * FERRY_ELENCRC and FERRY_EDATACRC for a bad length or data CRC,
 * FERRY_ETRUNCLEN and FERRY_ETRUNCDATA for a file or frame that ends
 * short (the file's size disagrees with its trailer, footer or frames),
 * and FERRY_EDATACRC too for anything wrong inside frames whose CRCs
 * hold (magic, key, count, offsets, entry pos, shape): Ferry has no
 * separate "corrupt" code, and to the caller it is the same verdict,
 * recompute. Messages name the cache file and the byte offset, and for
 * an entry its position; they never quote the file's bytes. System
 * errors are negated errno values, as everywhere.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ferry/error.h"

#define FERRY_PCACHE_SUFFIX ".fpc"
/* The most positions a writer takes (the offset table then needs 2 GiB). */
#define FERRY_PCACHE_MAX_RECORDS (UINT64_C(1) << 28)
/* Room for an entry name with its NUL (37 bytes used). */
#define FERRY_PCACHE_NAME_MAX 64

typedef struct ferry_pcache_key_s {
  uint64_t prefix_fp; /* fingerprint of the pipeline prefix */
  const char *path;   /* the shard, as tasks name it */
  uint64_t file_size; /* the shard's identity: its size ... */
  int64_t mtime_ns;   /* ... and its modification time */
  uint64_t byte_offset, byte_end, first_record, max_records; /* the split */
} ferry_pcache_key_t;

/* The entry's file name in the cache directory, "<16 hex of
 * prefix_fp>-<16 hex of the key's hash>.fpc" (see above), NUL-terminated
 * into buf of n bytes (FERRY_PCACHE_NAME_MAX suffice; a shorter buffer
 * gets a truncated name). */
void ferry__pcache_entry_name(const ferry_pcache_key_t *k, char *buf, size_t n);

/* True for the codes that mean a damaged or foreign cache file (see
 * "Errors" above): the caller recomputes and may remove the entry. */
bool ferry__pcache_damaged(int code);

typedef struct ferry_pcache_writer_s ferry_pcache_writer_t;

/* Creates a temporary file "<entry name>.tmp.<16 random hex>" in dir
 * (O_CLOEXEC, mode 0644 less the umask) and writes the header record.
 * Returns 0 and sets *out, or a negative code with err naming the file
 * (FERRY_EINVAL for a key without a path). The writer belongs to the
 * caller, one thread at a time, until commit or abort. */
int ferry__pcache_writer_open(const char *dir, const ferry_pcache_key_t *key,
                              ferry_pcache_writer_t **out, ferry_error_t *err);

/* Appends one entry: the record at position pos of the split (any order),
 * with its shard index, shard byte offset, label and its h x wd x c u8
 * pixels (HWC). Writes are buffered (1 MiB); large pixel blocks go to the
 * file directly. FERRY_EINVAL for a pos given before, a pos not below
 * FERRY_PCACHE_MAX_RECORDS (nor below the key's max_records when that is
 * not 0), h or wd not positive, c not in 1..4, or NULL pixels; a write
 * error gives its negated errno with err naming the file. After any
 * failure the writer is spent: later adds return the same code, commit
 * returns it (removing the file); only commit or abort free it. */
int ferry__pcache_writer_add(ferry_pcache_writer_t *w, uint64_t pos,
                             uint64_t index, uint64_t offset, int64_t label,
                             int h, int wd, int c, const uint8_t *pixels,
                             ferry_error_t *err);

/* Bytes appended so far, framing included (buffered bytes too). */
uint64_t ferry__pcache_writer_bytes(const ferry_pcache_writer_t *w);

/* Finishes the entry: requires positions 0..n-1 each added exactly once
 * and no other (else FERRY_EINVAL naming the first missing or extra
 * position), writes the footer and trailer records, closes the file and
 * renames it to the entry name (an atomic replace of any older entry).
 * No fsync: a torn file is caught by its checksums. On any failure the
 * temporary file is removed. Frees w either way. */
int ferry__pcache_writer_commit(ferry_pcache_writer_t *w, uint64_t n,
                                ferry_error_t *err);

/* Removes the temporary file and frees w (NULL: nothing). */
void ferry__pcache_writer_abort(ferry_pcache_writer_t *w);

typedef struct ferry_pcache_reader_s ferry_pcache_reader_t;

typedef struct ferry_pcache_record_s {
  uint64_t index, offset; /* in the shard */
  int64_t label;
  int h, w, c;
  const uint8_t *pixels; /* h*w*c bytes in the reader's buffer, valid until
                            the next get or close */
} ferry_pcache_record_t;

/* Opens the entry for key in dir: reads the trailer, the footer (the
 * offset table) and the header, and checks them (framing and CRCs, magic,
 * the key field by field, path included, the file's size against the
 * trailer and footer, every offset strictly between the header and the
 * footer with room for an entry). Returns 0 and sets *out; FERRY_ENOENT
 * with err set when there is no entry (a miss); a damage code (see
 * "Errors") with err naming the cache file and byte offset; or a negated
 * errno. Memory: the offset table (8 bytes a record) and one entry
 * buffer. The reader belongs to the caller, one thread at a time. */
int ferry__pcache_reader_open(const char *dir, const ferry_pcache_key_t *key,
                              ferry_pcache_reader_t **out, ferry_error_t *err);

/* The number of entries (positions 0..count-1). */
uint64_t ferry__pcache_reader_count(const ferry_pcache_reader_t *r);

/* Reads entry pos into *out with one pread (two for an entry larger than
 * the buffer) and checks the length CRC, the data CRC, that the stored
 * pos is pos, that h, w, c are positive, c <= 4, that h*w*c is the data
 * length less 44, and that the entry ends before the footer. FERRY_EINVAL
 * for pos >= count; damage: a damage code with err naming the cache
 * file, the position and the byte offset (the caller recomputes); the
 * reader stays usable for other positions. */
int ferry__pcache_reader_get(ferry_pcache_reader_t *r, uint64_t pos,
                             ferry_pcache_record_t *out, ferry_error_t *err);

/* Reads all the entries into memory in one call when they take at most
 * max_bytes (else, or out of memory, leaves each get to read its own):
 * small images then cost no system call each. Gets still check every
 * entry. A file cut short here is damage. */
int ferry__pcache_reader_load(ferry_pcache_reader_t *r, uint64_t max_bytes,
                              ferry_error_t *err);

/* Like ferry__pcache_reader_get for an entry of exactly `bytes` pixel
 * bytes, read straight into `dst` (one copy: the worker passes the
 * record's place in a chunk). out->pixels is dst. An entry of another
 * size is damage. dst holds unchecked bytes after an error. */
int ferry__pcache_reader_get_into(ferry_pcache_reader_t *r, uint64_t pos,
                                  uint8_t *dst, size_t bytes,
                                  ferry_pcache_record_t *out,
                                  ferry_error_t *err);
/* Total bytes read by gets, framing included (for read rates). */
uint64_t ferry__pcache_reader_bytes(const ferry_pcache_reader_t *r);

/* Closes the file and frees r (NULL: nothing). */
void ferry__pcache_reader_close(ferry_pcache_reader_t *r);

/* Unlinks the entry for key in dir. 0, also when it is absent, or a
 * negated errno. */
int ferry__pcache_remove(const char *dir, const ferry_pcache_key_t *key);

/* Walks dir (not its subdirectories): sums the sizes of the regular files
 * named "*.fpc" into *bytes and counts them into *entries; with
 * remove_temps, unlinks the regular files named "*.fpc.tmp.*" (left by a
 * killed writer: call it before this process opens writers). Other files
 * are left alone and not counted. Returns 0 or a negated errno with err
 * naming dir. */
int ferry__pcache_dir_scan(const char *dir, bool remove_temps, uint64_t *bytes,
                           uint64_t *entries, ferry_error_t *err);

#endif /* FERRY_PCACHE_H */
