/* TFRecord files: reader and writer, uncompressed, GZIP and ZLIB, and DALI
 * index files.
 *
 * Framing of each record: uint64 length (LE), uint32 masked crc32c of the 8
 * length bytes, the data, uint32 masked crc32c of the data. Compression
 * wraps the whole stream. Offsets reported by the reader are byte offsets
 * in the uncompressed stream (the file itself when uncompressed).
 */
#ifndef FERRY_TFRECORD_H
#define FERRY_TFRECORD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ferry/common.h" /* ferry_error_policy_t */
#include "ferry/error.h"

typedef enum {
  FERRY_COMPRESSION_NONE = 0,
  FERRY_COMPRESSION_GZIP = 1,
  FERRY_COMPRESSION_ZLIB = 2,
  FERRY_COMPRESSION_AUTO = 3 /* reader only: detect from the first bytes */
} ferry_compression_t;

#define FERRY_TFR_DEFAULT_MAX_RECORD (256u << 20)

typedef struct ferry_tfr_options_s {
  ferry_compression_t compression; /* default AUTO */
  uint64_t max_record_len;         /* default FERRY_TFR_DEFAULT_MAX_RECORD */
  ferry_error_policy_t on_error;   /* default FAIL */
  bool verify_crc;                 /* default true */
  uint64_t start_offset; /* first record's byte offset (uncompressed: a
                            seek; compressed: decompress and discard) */
  uint64_t start_index;  /* index the first record is numbered with */
  uint64_t max_records;  /* stop after this many; 0 = no limit */
  /* Policy SKIP: called for every bad record skipped, in file order, on
   * the reader's thread, with its error (code, and a message naming the
   * file and byte offset), its byte offset and its record index. NULL: no
   * call (the count and the last error are in the stats). */
  void (*on_skip)(const ferry_error_t *err, uint64_t offset, uint64_t index,
                  void *arg);
  void *on_skip_arg;
  /* Errors may quote values read from the file (stored CRCs, length
   * fields). Default false: errors name the file, record and byte offset
   * only, since the daemons send them to remote callers (A
   * length field is 8 bytes of whatever file a spec names). ferryctl,
   * run by the file's owner, turns it on. */
  bool file_bytes_in_errors;
} ferry_tfr_options_t;

/* Fills `opts` with the defaults above. */
void ferry__tfr_options_init(ferry_tfr_options_t *opts);

typedef struct ferry_record_s {
  const uint8_t *data; /* valid until the next call on the reader */
  size_t len;
  uint64_t offset; /* byte offset of the record's length field */
  uint64_t index;  /* record number in the file (0-based) */
} ferry_record_t;

typedef struct ferry_tfr_stats_s {
  uint64_t records;       /* good records returned */
  uint64_t bytes;         /* their data bytes */
  uint64_t skipped;       /* bad records skipped (policy SKIP) */
  ferry_error_t last_bad; /* the most recent bad-record error, if any */
} ferry_tfr_stats_t;

typedef struct ferry_tfr_reader_s ferry_tfr_reader_t;

/* Opens `path`. The file is read with pread(2), never mapped, so a file
 * truncated or rewritten under the reader gives an error naming the file
 * and byte offset (a record error: policy SKIP ends the file there), not
 * SIGBUS. Uncompressed records are returned as pointers into a sliding
 * read window (no copy per record beyond the read). A file that ends
 * before the size it had when opened is reported as truncated, also at a
 * record boundary. Returns 0 and sets *out, or a negative code
 * with `err` naming the file. The reader is owned by the caller (free with
 * ferry__tfr_reader_free) and used by one thread at a time. */
int ferry__tfr_reader_open(const char *path, const ferry_tfr_options_t *opts,
                           ferry_tfr_reader_t **out, ferry_error_t *err);

/* Like ferry__tfr_reader_open over `fd`, already open for reading (by
 * ferry__roots_open_file: the file a data root allows). The reader owns
 * `fd` from the call on, failure included; `path` names it in errors. */
int ferry__tfr_reader_open_fd(int fd, const char *path,
                              const ferry_tfr_options_t *opts,
                              ferry_tfr_reader_t **out, ferry_error_t *err);

/* The reader's file descriptor (-1 for an in-memory stream); it stays
 * the reader's. */
int ferry__tfr_reader_fd(const ferry_tfr_reader_t *r);

/* Like ferry__tfr_reader_open over an in-memory stream (not copied: `buf`
 * must outlive the reader). `name` is used in error messages. */
int ferry__tfr_reader_open_mem(const void *buf, size_t len, const char *name,
                               const ferry_tfr_options_t *opts,
                               ferry_tfr_reader_t **out, ferry_error_t *err);

/* Reads the next record into *rec. Returns 0, FERRY_EOF at the clean end
 * (or after max_records), or a negative code with `err` naming the file,
 * the byte offset and the fault (FERRY_ETRUNCLEN, ETRUNCDATA, ELENCRC,
 * EDATACRC, ETOOLONG, ECOMPRESS, EIO). Under policy SKIP bad records are
 * counted and skipped; a bad length CRC makes the reader scan forward for
 * the next plausible header. After an error under FAIL, further calls
 * return the same error. */
int ferry__tfr_reader_next(ferry_tfr_reader_t *r, ferry_record_t *rec,
                           ferry_error_t *err);

void ferry__tfr_reader_stats(const ferry_tfr_reader_t *r,
                             ferry_tfr_stats_t *out);
/* The compression in use: the configured one, or what AUTO detected
 * (never AUTO). */
ferry_compression_t ferry__tfr_reader_compression(const ferry_tfr_reader_t *r);
void ferry__tfr_reader_free(ferry_tfr_reader_t *r);

typedef struct ferry_tfr_writer_s ferry_tfr_writer_t;

/* Creates (truncates) `path` and writes records to it, compressed as asked
 * (AUTO is invalid here). Close with ferry__tfr_writer_close, which flushes
 * and reports the first write error. */
int ferry__tfr_writer_open(const char *path, ferry_compression_t compression,
                           ferry_tfr_writer_t **out, ferry_error_t *err);
int ferry__tfr_writer_write(ferry_tfr_writer_t *w, const void *data, size_t len,
                            ferry_error_t *err);
int ferry__tfr_writer_close(ferry_tfr_writer_t *w, ferry_error_t *err);

/* Writes the 12-byte header and 4-byte footer of a record of `len` bytes
 * with data CRC computed over `data`. */
void ferry__tfr_frame_header(uint64_t len, uint8_t out[12]);
void ferry__tfr_frame_footer(const void *data, size_t len, uint8_t out[4]);

/* DALI index entries: "<offset> <size incl. 16 framing bytes>" per line. */
typedef struct ferry_tfr_index_entry_s {
  uint64_t offset;
  uint64_t size;
} ferry_tfr_index_entry_t;

/* Scans an uncompressed TFRecord file (verifying both CRCs) and returns
 * its index in a ferry_free()-able array. Compressed files: FERRY_ENOTSUP. */
int ferry__tfr_index_build(const char *path, ferry_tfr_index_entry_t **out,
                           size_t *n, ferry_error_t *err);
int ferry__tfr_index_write(const char *path,
                           const ferry_tfr_index_entry_t *entries, size_t n,
                           ferry_error_t *err);
/* Reads an index file; a malformed line gives FERRY_EINDEX naming the file
 * and line. */
int ferry__tfr_index_read(const char *path, ferry_tfr_index_entry_t **out,
                          size_t *n, ferry_error_t *err);
/* Like ferry__tfr_index_read over `fd` (closed either way; opened by
 * ferry__roots_open_file where data roots apply); `path` names it. */
int ferry__tfr_index_read_fd(int fd, const char *path,
                             ferry_tfr_index_entry_t **out, size_t *n,
                             ferry_error_t *err);

/* Parses "none", "gzip", "zlib", "auto"; returns the value or -1. */
int ferry__compression_parse(const char *name);
const char *ferry__compression_name(ferry_compression_t c);

/* A record's header: the uint64 length (LE) and the masked crc32c of
 * those 8 bytes. */
#define FERRY_TFR_HEADER_LEN 12

/* The one record-header check (the reader, the dispatcher's scan,
 * ferryctl): true when the stored CRC matches the length bytes, with the
 * length in *len (may be NULL). The length itself is not bounded here. */
bool ferry__tfr_header_check(const uint8_t h[FERRY_TFR_HEADER_LEN],
                             uint64_t *len);

/* The compression of a TFRecord stream judged from its first n bytes (12
 * suffice): a valid first record header wins over the magic bytes (an
 * uncompressed file whose first length starts like gzip's 1f 8b or a
 * zlib header is not compressed), then gzip's magic, then a zlib header
 * (deflate, window <= 32 KiB, no dictionary, check bits); NONE
 * otherwise. Never AUTO. */
ferry_compression_t ferry__tfr_sniff(const uint8_t *head, size_t n);

/* What a stream whose first record header is bad looks like, judged from
 * its first n bytes: "gzip data", "zlib data", "a JPEG image", "a PNG
 * image", "a ZIP archive", "bzip2 data", "xz data", "zstd data", "text",
 * or NULL (unknown binary). A static string naming the kind, never the
 * bytes themselves (errors do not quote file contents). */
const char *ferry__tfr_describe_head(const uint8_t *head, size_t n);

/* ferry__tfr_sniff on the first bytes of the file at `path`. Returns the
 * compression (>= 0), or a negative code with err naming the file. */
int ferry__tfr_sniff_file(const char *path, ferry_error_t *err);

/* Whole valid records in an uncompressed file (tfrecord_scan.c): both
 * CRCs checked, the record within [off, end).
 * ferry__tfr_valid_record_at: 1 when one starts at `off` (its data length
 * in *len, may be NULL), 0 when not, -1 on a read error (errno set).
 * ferry__tfr_next_valid_record: the first offset after `after` (to `end`)
 * where one starts; `end` when there is none, -1 on a read error. */
int ferry__tfr_valid_record_at(int fd, uint64_t off, uint64_t end,
                               uint64_t *len);
int64_t ferry__tfr_next_valid_record(int fd, uint64_t after, uint64_t end);

/* pread(2) that retries on EINTR and reads until `n` bytes or the end of
 * the file: the one way Ferry reads files at an offset (the reader, the
 * dispatcher's scan and journal, the worker's spill files). Returns the
 * count (short only at the end of the file) or -errno (errno is left
 * set). */
int64_t ferry__pread_full(int fd, void *buf, size_t n, uint64_t off);

#endif /* FERRY_TFRECORD_H */
