/* TFRecord reader and writer.
 *
 * The reader sees its input as one byte stream, the uncompressed TFRecord
 * framing, through window(): "give me `need` bytes from the current
 * offset". A caller's buffer is used in place. A file is never mapped: a
 * file truncated under a mapping kills the process with SIGBUS, so files
 * are read with pread(2). Uncompressed files go through a sliding read
 * window (one buffer, refilled in WIN_MIN pieces, grown only for a record
 * larger than it), and records are returned as pointers into it: no copy
 * per record beyond the read itself. Compressed input is read in ZIN_BUF
 * pieces and inflated into one buffer that grows to the largest record
 * seen. Either way steady-state reading allocates nothing. A file that
 * ends before the size it had when opened was truncated under the reader:
 * every message then says so. */
#include "tfrecord.h"

#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "alloc.h"
#include "crc32c.h"

#define HEADER_LEN FERRY_TFR_HEADER_LEN
#define FRAMING_LEN 16

/* The inflate buffer starts at this size and doubles only when it is full
 * and a record still needs more, so its size stays within twice the
 * largest record (and within twice what the stream really holds: a huge
 * length in a truncated stream costs nothing). */
#define ZBUF_MIN (64u << 10)
/* Input is handed to zlib in pieces that fit its 32-bit counters. */
#define ZIN_CHUNK (1u << 30)
/* File input: compressed bytes are read in pieces of this size. */
#define ZIN_BUF (256u << 10)
/* File input, uncompressed: the read window's size (pread size). 256 KiB
 * keeps the window in L2 while the CRC reads what pread just wrote
 * (docs/PERFORMANCE.md). */
#define WIN_MIN (256u << 10)

struct ferry_tfr_reader_s {
  char *name;
  ferry_tfr_options_t opts;
  ferry_compression_t compression; /* resolved: never AUTO */

  const uint8_t *src; /* memory input: the caller's buffer */
  size_t src_len;
  int fd;             /* file input; -1 for memory input */
  uint64_t file_size; /* file input: its size when opened */
  bool in_eof;        /* no more input bytes (file or buffer) */
  bool shrunk;        /* the file ended before file_size */
  uint64_t eof_at;    /* where, when shrunk */
  uint8_t *zin;       /* compressed file input: ZIN_BUF bytes */

  uint64_t pos;        /* offset of the next record in the stream */
  uint64_t next_index; /* number of the record at pos */
  bool started;        /* start_offset has been applied */
  bool done;           /* clean end: only FERRY_EOF from now on */
  int sticky;          /* error code repeated under policy FAIL */
  ferry_error_t sticky_err;
  ferry_tfr_stats_t stats;

  /* Compressed input only. buf[beg, end) holds stream bytes starting at
   * offset buf_off, and buf_off <= pos <= buf_off + (end - beg). */
  z_stream zs;
  bool z_init;
  bool z_eof;   /* no more output will come */
  bool z_trunc; /* input ended before the end-of-stream marker */
  bool z_bad;   /* the stream is corrupt past the output so far */
  size_t z_bad_at; /* where, in the compressed input */
  char z_msg[160];
  size_t in_pos; /* input bytes handed to zlib so far */
  /* Compressed input, and uncompressed file input (the read window). */
  uint8_t *buf;
  size_t cap, beg, end;
  uint64_t buf_off;
  char note[160]; /* "" or why the input ended early (shrunk) */
  uint64_t bad_len; /* length of the record behind an EDATACRC */
};

static inline uint64_t load_le64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--)
    v = (v << 8) | p[i];
  return v;
}

static inline uint32_t load_le32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
         (uint32_t)p[3] << 24;
}

static inline void store_le32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}

void ferry__tfr_options_init(ferry_tfr_options_t *opts) {
  memset(opts, 0, sizeof(*opts));
  opts->compression = FERRY_COMPRESSION_AUTO;
  opts->max_record_len = FERRY_TFR_DEFAULT_MAX_RECORD;
  opts->on_error = FERRY_ON_ERROR_FAIL;
  opts->verify_crc = true;
}

void ferry__tfr_frame_header(uint64_t len, uint8_t out[12]) {
  for (int i = 0; i < 8; i++)
    out[i] = (uint8_t)(len >> (8 * i));
  store_le32(out + 8, ferry__crc32c_mask(ferry__crc32c(0, out, 8)));
}

void ferry__tfr_frame_footer(const void *data, size_t len, uint8_t out[4]) {
  store_le32(out, ferry__crc32c_mask(ferry__crc32c(0, data, len)));
}

int ferry__compression_parse(const char *name) {
  if (name == NULL)
    return -1;
  if (name[0] == '\0' || strcasecmp(name, "none") == 0)
    return FERRY_COMPRESSION_NONE;
  if (strcasecmp(name, "gzip") == 0)
    return FERRY_COMPRESSION_GZIP;
  if (strcasecmp(name, "zlib") == 0)
    return FERRY_COMPRESSION_ZLIB;
  if (strcasecmp(name, "auto") == 0)
    return FERRY_COMPRESSION_AUTO;
  return -1;
}

const char *ferry__compression_name(ferry_compression_t c) {
  switch (c) {
  case FERRY_COMPRESSION_NONE: return "none";
  case FERRY_COMPRESSION_GZIP: return "gzip";
  case FERRY_COMPRESSION_ZLIB: return "zlib";
  case FERRY_COMPRESSION_AUTO: return "auto";
  }
  return "unknown";
}

/* zlib allocates through the wrapper so leak checks see its state. */
static voidpf zalloc_cb(voidpf opaque, uInt items, uInt size) {
  if (size != 0 && items > SIZE_MAX / size)
    return Z_NULL;
  return ferry__malloc((size_t)items * size);
}

static void zfree_cb(voidpf opaque, voidpf p) { ferry__free(p); }

bool ferry__tfr_header_check(const uint8_t h[FERRY_TFR_HEADER_LEN],
                             uint64_t *len) {
  if (load_le32(h + 8) != ferry__crc32c_mask(ferry__crc32c(0, h, 8)))
    return false;
  if (len != NULL)
    *len = load_le64(h);
  return true;
}

ferry_compression_t ferry__tfr_sniff(const uint8_t *b, size_t n) {
  if (n >= HEADER_LEN && ferry__tfr_header_check(b, NULL))
    return FERRY_COMPRESSION_NONE;
  if (n >= 2 && b[0] == 0x1f && b[1] == 0x8b)
    return FERRY_COMPRESSION_GZIP;
  /* zlib: deflate method, window at most 32 KiB, no preset dictionary,
   * and the check bits make CMF * 256 + FLG a multiple of 31. */
  if (n >= 2 && (b[0] & 0x0f) == 8 && (b[0] >> 4) <= 7 &&
      (b[1] & 0x20) == 0 && ((unsigned)b[0] * 256 + b[1]) % 31 == 0)
    return FERRY_COMPRESSION_ZLIB;
  return FERRY_COMPRESSION_NONE;
}

const char *ferry__tfr_describe_head(const uint8_t *b, size_t n) {
  static const struct {
    const char *magic;
    size_t len;
    const char *kind;
  } kinds[] = {
      {"\xff\xd8\xff", 3, "a JPEG image"},
      {"\x89PNG\r\n", 6, "a PNG image"},
      {"PK\x03\x04", 4, "a ZIP archive"},
      {"BZh", 3, "bzip2 data"},
      {"\xfd" "7zXZ", 5, "xz data"},
      {"\x28\xb5\x2f\xfd", 4, "zstd data"},
  };
  if (n >= 2 && b[0] == 0x1f && b[1] == 0x8b)
    return "gzip data";
  for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++)
    if (n >= kinds[i].len && memcmp(b, kinds[i].magic, kinds[i].len) == 0)
      return kinds[i].kind;
  /* Text before zlib: a zlib header is two bytes that text can form. */
  size_t printable = 0;
  for (size_t i = 0; i < n; i++)
    if ((b[i] >= 0x20 && b[i] < 0x7f) || b[i] == '\n' || b[i] == '\r' ||
        b[i] == '\t')
      printable++;
  if (n > 0 && printable == n)
    return "text";
  if (!(n >= HEADER_LEN && ferry__tfr_header_check(b, NULL)) &&
      ferry__tfr_sniff(b, n) == FERRY_COMPRESSION_ZLIB)
    return "zlib data";
  return NULL;
}

int ferry__tfr_sniff_file(const char *path, ferry_error_t *err) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return ferry__seterr(err, ferry__err_from_errno(errno), "%s: %s", path,
                         strerror(errno));
  uint8_t head[HEADER_LEN];
  int64_t n = ferry__pread_full(fd, head, sizeof(head), 0);
  int e = errno;
  close(fd);
  if (n < 0)
    return ferry__seterr(err, ferry__err_from_errno(e), "%s: read: %s", path,
                         strerror(e));
  return (int)ferry__tfr_sniff(head, (size_t)n);
}

static const char *zname(const ferry_tfr_reader_t *r) {
  return ferry__compression_name(r->compression);
}

int64_t ferry__pread_full(int fd, void *buf, size_t n, uint64_t off) {
  uint8_t *p = buf;
  size_t got = 0;
  while (got < n) {
    ssize_t k = pread(fd, p + got, n - got, (off_t)(off + got));
    if (k < 0) {
      if (errno == EINTR)
        continue;
      return -(int64_t)errno;
    }
    if (k == 0)
      break;
    got += (size_t)k;
  }
  return (int64_t)got;
}

/* Notes that file input ended at `at`: when that is before the size the
 * file had when opened, it was truncated under the reader. */
static void note_end(ferry_tfr_reader_t *r, uint64_t at) {
  r->in_eof = true;
  if (r->fd >= 0 && at < r->file_size && !r->shrunk) {
    r->shrunk = true;
    r->eof_at = at;
    snprintf(r->note, sizeof(r->note),
             " (the file was truncated while being read: it ends at byte "
             "offset %" PRIu64 " but had %" PRIu64 " bytes when opened)",
             at, r->file_size);
  }
}

static int read_error(ferry_tfr_reader_t *r, int64_t neg_errno, uint64_t off,
                      ferry_error_t *err) {
  int e = (int)-neg_errno;
  return ferry__seterr(err, ferry__err_from_errno(e),
                       "%s: read at byte offset %" PRIu64 ": %s", r->name, off,
                       strerror(e));
}

/* Compressed input: makes zs->avail_in > 0 unless the input is over.
 * Returns 0 or a negative code. */
static int refill(ferry_tfr_reader_t *r, ferry_error_t *err) {
  z_stream *zs = &r->zs;
  if (zs->avail_in > 0 || r->in_eof)
    return 0;
  if (r->fd < 0) {
    size_t chunk = r->src_len - r->in_pos;
    if (chunk == 0) {
      r->in_eof = true;
      return 0;
    }
    if (chunk > ZIN_CHUNK)
      chunk = ZIN_CHUNK;
    zs->next_in = (Bytef *)(uintptr_t)(r->src + r->in_pos);
    zs->avail_in = (uInt)chunk;
    r->in_pos += chunk;
    return 0;
  }
  int64_t n = ferry__pread_full(r->fd, r->zin, ZIN_BUF, r->in_pos);
  if (n < 0)
    return read_error(r, n, r->in_pos, err);
  if (n == 0) {
    note_end(r, r->in_pos);
    return 0;
  }
  zs->next_in = r->zin;
  zs->avail_in = (uInt)n;
  r->in_pos += (size_t)n;
  return 0;
}

/* Whether a gzip member starts at compressed offset `at` (after the end of
 * the previous one; at least one byte follows it). */
static bool gzip_magic_at(ferry_tfr_reader_t *r, size_t at) {
  uint8_t m[2];
  if (r->zs.avail_in >= 2) {
    memcpy(m, r->zs.next_in, 2);
  } else if (r->fd < 0) {
    if (r->src_len - at < 2)
      return false;
    memcpy(m, r->src + at, 2);
  } else if (ferry__pread_full(r->fd, m, 2, at) != 2) {
    return false;
  }
  return m[0] == 0x1f && m[1] == 0x8b;
}

/* Fills buf[end, cap) with more output. Returns 0 or a negative code. */
static int inflate_some(ferry_tfr_reader_t *r, ferry_error_t *err) {
  z_stream *zs = &r->zs;
  size_t room = r->cap - r->end;
  int zr, rc;

  if ((rc = refill(r, err)) < 0)
    return rc;
  if (room > UINT_MAX)
    room = UINT_MAX;
  zs->next_out = r->buf + r->end;
  zs->avail_out = (uInt)room;
  zr = inflate(zs, Z_NO_FLUSH);
  r->end += room - zs->avail_out;

  size_t consumed = r->in_pos - zs->avail_in;
  switch (zr) {
  case Z_OK:
    return 0;
  case Z_STREAM_END:
    if ((rc = refill(r, err)) < 0)
      return rc;
    if (zs->avail_in == 0 && r->in_eof) {
      r->z_eof = true;
      return 0;
    }
    /* Concatenated gzip members form one stream (as gzip -d reads
     * them); anything else after the end is an error, not ignored. */
    if (r->compression == FERRY_COMPRESSION_GZIP &&
        gzip_magic_at(r, consumed)) {
      inflateReset(zs);
      return 0;
    }
    snprintf(r->z_msg, sizeof(r->z_msg),
             "%" PRIu64 " bytes of trailing data after the end of the stream",
             (r->fd < 0 ? (uint64_t)r->src_len : r->file_size) -
                 (uint64_t)consumed);
    break;
  case Z_BUF_ERROR:
    if (zs->avail_in == 0 && r->in_eof) {
      r->z_eof = true;
      r->z_trunc = true;
      return 0;
    }
    snprintf(r->z_msg, sizeof(r->z_msg), "inflate made no progress");
    break;
  case Z_MEM_ERROR:
    return ferry__seterr(err, FERRY_ENOMEM, "%s: out of memory inflating",
                         r->name);
  default:
    snprintf(r->z_msg, sizeof(r->z_msg), "%s",
             zs->msg != NULL ? zs->msg : "inflate failed");
    break;
  }
  /* The output inflated so far is good: the error is reported when a
   * record needs bytes past it (see window()). */
  r->z_eof = true;
  r->z_bad = true;
  r->z_bad_at = consumed;
  return 0;
}

/* Grows buf to at least `need` bytes (keeping buf[beg, end)). */
static int grow_buf(ferry_tfr_reader_t *r, size_t need, size_t min,
                    ferry_error_t *err) {
  if (!FERRY__GROW(r->buf, r->cap, need, min))
    return ferry__seterr(err, FERRY_ENOMEM,
                         "%s: out of memory growing the read buffer to %zu "
                         "bytes",
                         r->name, need);
  return 0;
}

/* Uncompressed file input: the sliding window. buf[beg, end) holds the
 * file's bytes from buf_off; refills read as much as fits. */
static int64_t window_file(ferry_tfr_reader_t *r, size_t need,
                           const uint8_t **p, ferry_error_t *err) {
  if (r->pos > r->buf_off + (r->end - r->beg)) {
    r->beg = r->end = 0; /* a jump past the window (a seek) */
  } else {
    r->beg += (size_t)(r->pos - r->buf_off);
  }
  r->buf_off = r->pos;
  while (r->end - r->beg < need && !r->in_eof) {
    size_t have = r->end - r->beg;
    if (r->beg > 0) {
      memmove(r->buf, r->buf + r->beg, have);
      r->end = have;
      r->beg = 0;
    }
    if (r->cap < need || r->cap == 0) {
      int rc = grow_buf(r, need, WIN_MIN, err);
      if (rc < 0)
        return rc;
    }
    uint64_t at = r->buf_off + have;
    int64_t n =
        ferry__pread_full(r->fd, r->buf + r->end, r->cap - r->end, at);
    if (n < 0)
      return read_error(r, n, at, err);
    r->end += (size_t)n;
    if ((size_t)n < r->cap - have)
      note_end(r, at + (uint64_t)n);
  }
  size_t have = r->end - r->beg;
  *p = r->buf + r->beg;
  return (int64_t)(have < need ? have : need);
}

/* Makes up to `need` bytes from r->pos visible at *p. Returns how many
 * (fewer than `need` only at the end of the stream) or a negative code. */
static int64_t window(ferry_tfr_reader_t *r, size_t need, const uint8_t **p,
                      ferry_error_t *err) {
  size_t have;

  if (r->compression == FERRY_COMPRESSION_NONE) {
    if (r->fd >= 0)
      return window_file(r, need, p, err);
    have = r->src_len - (size_t)r->pos;
    *p = r->src + r->pos;
    return (int64_t)(have < need ? have : need);
  }
  r->beg += (size_t)(r->pos - r->buf_off);
  r->buf_off = r->pos;
  while (r->end - r->beg < need && !r->z_eof) {
    if (r->beg > 0 && r->cap - r->end < need - (r->end - r->beg)) {
      memmove(r->buf, r->buf + r->beg, r->end - r->beg);
      r->end -= r->beg;
      r->beg = 0;
    }
    if (r->end == r->cap) {
      int rc = grow_buf(r, r->cap + 1, ZBUF_MIN, err);
      if (rc < 0)
        return rc;
    }
    int rc = inflate_some(r, err);
    if (rc < 0)
      return rc;
  }
  have = r->end - r->beg;
  if (have < need && r->z_bad)
    return ferry__seterr(err, FERRY_ECOMPRESS,
                         "%s: record %" PRIu64 " at byte offset %" PRIu64
                         ": corrupt %s stream at compressed byte offset "
                         "%zu: %s%s",
                         r->name, r->next_index, r->pos, zname(r),
                         r->z_bad_at, r->z_msg, r->note);
  *p = r->buf + r->beg;
  return (int64_t)(have < need ? have : need);
}

static int release(ferry_tfr_reader_t *r) {
  if (r->z_init)
    inflateEnd(&r->zs);
  if (r->fd >= 0)
    close(r->fd);
  ferry__free(r->zin);
  ferry__free(r->buf);
  ferry__free(r->name);
  ferry__free(r);
  return 0;
}

void ferry__tfr_reader_free(ferry_tfr_reader_t *r) {
  if (r != NULL)
    release(r);
}

/* Memory input: `buf`, `len` (fd < 0). File input: `fd` of a file of
 * `len` bytes (taken over whatever the outcome). */
static int open_common(const uint8_t *buf, size_t len, int fd,
                       const char *name, const ferry_tfr_options_t *opts,
                       ferry_tfr_reader_t **out, ferry_error_t *err) {
  ferry_tfr_reader_t *r;
  int zr;

  *out = NULL;
  r = ferry__calloc(1, sizeof(*r));
  if (r == NULL || (r->name = ferry__strdup(name)) == NULL) {
    if (fd >= 0)
      close(fd);
    ferry__free(r);
    return ferry__seterr(err, FERRY_ENOMEM, "%s: out of memory", name);
  }
  r->fd = fd;
  r->file_size = len;
  r->src = fd < 0 ? buf : NULL;
  r->src_len = fd < 0 ? len : 0;
  if (opts != NULL)
    r->opts = *opts;
  else
    ferry__tfr_options_init(&r->opts);
  r->next_index = r->opts.start_index;

  switch (r->opts.compression) {
  case FERRY_COMPRESSION_NONE:
  case FERRY_COMPRESSION_GZIP:
  case FERRY_COMPRESSION_ZLIB:
    r->compression = r->opts.compression;
    break;
  case FERRY_COMPRESSION_AUTO:
    if (fd >= 0) {
      uint8_t head[HEADER_LEN];
      int64_t n = ferry__pread_full(fd, head, sizeof(head), 0);
      if (n < 0) {
        int code = read_error(r, n, 0, err);
        release(r);
        return code;
      }
      r->compression = ferry__tfr_sniff(head, (size_t)n);
    } else {
      r->compression = ferry__tfr_sniff(buf, len);
    }
    break;
  default:
    ferry__seterr(err, FERRY_EINVAL, "%s: unknown compression %d", name,
                  (int)r->opts.compression);
    release(r);
    return FERRY_EINVAL;
  }
  if (r->opts.on_error != FERRY_ON_ERROR_FAIL &&
      r->opts.on_error != FERRY_ON_ERROR_SKIP) {
    ferry__seterr(err, FERRY_EINVAL, "%s: unknown error policy %d", name,
                  (int)r->opts.on_error);
    release(r);
    return FERRY_EINVAL;
  }

  if (r->compression == FERRY_COMPRESSION_NONE) {
    if (r->opts.start_offset > len) {
      ferry__seterr(err, FERRY_EINVAL,
                    "%s: start offset %" PRIu64
                    " is past the end of the file (%zu bytes)",
                    name, r->opts.start_offset, len);
      release(r);
      return FERRY_EINVAL;
    }
    r->pos = r->opts.start_offset;
    r->started = true;
  } else {
    if (fd >= 0 && (r->zin = ferry__malloc(ZIN_BUF)) == NULL) {
      ferry__seterr(err, FERRY_ENOMEM, "%s: out of memory", name);
      release(r);
      return FERRY_ENOMEM;
    }
    r->zs.zalloc = zalloc_cb;
    r->zs.zfree = zfree_cb;
    r->zs.opaque = Z_NULL;
    zr = inflateInit2(&r->zs, r->compression == FERRY_COMPRESSION_GZIP
                                  ? 15 + 16
                                  : 15);
    if (zr != Z_OK) {
      int code = zr == Z_MEM_ERROR ? FERRY_ENOMEM : FERRY_EIO;
      ferry__seterr(err, code, "%s: inflateInit2 failed (%d)", name, zr);
      release(r);
      return code;
    }
    r->z_init = true;
  }
  *out = r;
  return 0;
}

int ferry__tfr_reader_open_mem(const void *buf, size_t len, const char *name,
                               const ferry_tfr_options_t *opts,
                               ferry_tfr_reader_t **out, ferry_error_t *err) {
  return open_common(buf, len, -1, name != NULL ? name : "<memory>", opts,
                     out, err);
}

int ferry__tfr_reader_open(const char *path, const ferry_tfr_options_t *opts,
                           ferry_tfr_reader_t **out, ferry_error_t *err) {
  int fd, code;

  *out = NULL;
  /* O_NONBLOCK: opening a FIFO (or a device) named by a spec must not
   * block; anything but a regular file is refused below. */
  fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    code = ferry__err_from_errno(errno);
    return ferry__seterr(err, code, "%s: open: %s", path, strerror(errno));
  }
  return ferry__tfr_reader_open_fd(fd, path, opts, out, err);
}

int ferry__tfr_reader_open_fd(int fd, const char *path,
                              const ferry_tfr_options_t *opts,
                              ferry_tfr_reader_t **out, ferry_error_t *err) {
  struct stat st;
  int code;

  *out = NULL;
  if (fstat(fd, &st) != 0) {
    code = ferry__err_from_errno(errno);
    ferry__seterr(err, code, "%s: fstat: %s", path, strerror(errno));
    close(fd);
    return code;
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return ferry__seterr(err, FERRY_EINVAL, "%s: not a regular file", path);
  }
  posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  return open_common(NULL, (size_t)st.st_size, fd, path, opts, out, err);
}

int ferry__tfr_reader_fd(const ferry_tfr_reader_t *r) { return r->fd; }

ferry_compression_t ferry__tfr_reader_compression(const ferry_tfr_reader_t *r) {
  return r->compression;
}

void ferry__tfr_reader_stats(const ferry_tfr_reader_t *r,
                             ferry_tfr_stats_t *out) {
  *out = r->stats;
}

/* Discards the stream up to start_offset (compressed input only). */
static int seek_start(ferry_tfr_reader_t *r, ferry_error_t *err) {
  while (r->pos < r->opts.start_offset) {
    const uint8_t *p;
    uint64_t left = r->opts.start_offset - r->pos;
    int64_t n = window(r, left < ZBUF_MIN ? (size_t)left : ZBUF_MIN, &p, err);
    if (n < 0)
      return (int)n;
    if (n == 0)
      return ferry__seterr(err, FERRY_EINVAL,
                           "%s: start offset %" PRIu64
                           " is past the end of the stream (%" PRIu64
                           " bytes)",
                           r->name, r->opts.start_offset, r->pos);
    r->pos += (uint64_t)n;
  }
  r->started = true;
  return 0;
}

#define AT "%s: record %" PRIu64 " at byte offset %" PRIu64 ": "

/* Reads the record at r->pos. Returns 0 (and advances), FERRY_EOF at a
 * clean end, or a negative code without advancing. */
static int read_one(ferry_tfr_reader_t *r, ferry_record_t *rec,
                    ferry_error_t *err) {
  const uint8_t *b;
  uint64_t len;
  uint32_t stored, computed;
  int64_t n;

  n = window(r, HEADER_LEN, &b, err);
  if (n < 0)
    return (int)n;
  if (n == 0) {
    if (r->z_trunc)
      return ferry__seterr(err, FERRY_ECOMPRESS,
                           AT "corrupt %s stream: the input ends before the "
                              "end-of-stream marker%s",
                           r->name, r->next_index, r->pos, zname(r), r->note);
    if (r->shrunk)
      return ferry__seterr(err, FERRY_ETRUNCLEN,
                           AT "file ends before the next record header%s",
                           r->name, r->next_index, r->pos, r->note);
    return FERRY_EOF;
  }
  if (n < HEADER_LEN)
    return ferry__seterr(err, FERRY_ETRUNCLEN,
                         AT "file ends inside the 12-byte record header "
                            "(%" PRId64 " bytes left)%s%s",
                         r->name, r->next_index, r->pos, n,
                         r->z_trunc ? " and the compressed stream is cut" : "",
                         r->note);
  len = load_le64(b);
  stored = load_le32(b + 8);
  /* The length CRC is checked even when verify_crc is off: a length that
   * is not checked must never be used to allocate or to seek. */
  computed = ferry__crc32c_mask(ferry__crc32c(0, b, 8));
  /* A bad first header usually means the file is not a TFRecord file at
   * all (or is compressed and was read as plain): say so, naming only
   * the kind its first bytes look like. */
  if (stored != computed && r->pos == 0 && r->next_index == 0) {
    const char *kind = ferry__tfr_describe_head(b, HEADER_LEN);
    bool packed = kind != NULL && (strcmp(kind, "gzip data") == 0 ||
                                   strcmp(kind, "zlib data") == 0);
    return ferry__seterr(err, FERRY_ELENCRC,
                         AT "record length CRC mismatch in the first record: "
                            "is this a TFRecord file? %s%s%s",
                         r->name, r->next_index, r->pos,
                         kind == NULL ? "Its first bytes are not a TFRecord "
                                        "header"
                                      : "Its first bytes look like ",
                         kind == NULL ? "" : kind,
                         packed ? " (read it with compression auto or the "
                                  "matching compression)"
                                : "");
  }
  if (stored != computed && !r->opts.file_bytes_in_errors)
    return ferry__seterr(err, FERRY_ELENCRC,
                         AT "record length CRC mismatch",
                         r->name, r->next_index, r->pos);
  if (stored != computed)
    return ferry__seterr(err, FERRY_ELENCRC,
                         AT "record length CRC mismatch (stored 0x%08" PRIx32
                            ", computed 0x%08" PRIx32 ", length field %" PRIu64
                            ")",
                         r->name, r->next_index, r->pos, stored, computed,
                         len);
  if ((len > r->opts.max_record_len || len > SIZE_MAX - FRAMING_LEN) &&
      !r->opts.file_bytes_in_errors)
    return ferry__seterr(err, FERRY_ETOOLONG,
                         AT "record length is over the maximum %" PRIu64,
                         r->name, r->next_index, r->pos,
                         r->opts.max_record_len);
  if (len > r->opts.max_record_len || len > SIZE_MAX - FRAMING_LEN)
    return ferry__seterr(err, FERRY_ETOOLONG,
                         AT "record length %" PRIu64
                            " is over the maximum %" PRIu64,
                         r->name, r->next_index, r->pos, len,
                         r->opts.max_record_len);
  n = window(r, (size_t)len + FRAMING_LEN, &b, err);
  if (n < 0)
    return (int)n;
  if ((uint64_t)n < len + FRAMING_LEN)
    return ferry__seterr(err, FERRY_ETRUNCDATA,
                         AT "file ends inside the record data or footer "
                            "(record needs %" PRIu64 " bytes, %" PRId64
                            " left)%s%s",
                         r->name, r->next_index, r->pos, len + FRAMING_LEN, n,
                         r->z_trunc ? " and the compressed stream is cut" : "",
                         r->note);
  if (r->opts.verify_crc) {
    stored = load_le32(b + HEADER_LEN + len);
    computed = ferry__crc32c_mask(ferry__crc32c(0, b + HEADER_LEN, len));
    if (stored != computed) {
      r->bad_len = len;
      if (!r->opts.file_bytes_in_errors)
        return ferry__seterr(err, FERRY_EDATACRC,
                             AT "record data CRC mismatch", r->name,
                             r->next_index, r->pos);
      return ferry__seterr(err, FERRY_EDATACRC,
                           AT "record data CRC mismatch (stored 0x%08" PRIx32
                              ", computed 0x%08" PRIx32 ")",
                           r->name, r->next_index, r->pos, stored, computed);
    }
  }
  rec->data = b + HEADER_LEN;
  rec->len = (size_t)len;
  rec->offset = r->pos;
  rec->index = r->next_index;
  r->pos += len + FRAMING_LEN;
  r->next_index++;
  return 0;
}

/* After a bad header at r->pos: moves r->pos to the next offset whose 12
 * bytes form a header with a matching length CRC and a length within the
 * maximum. Returns 0, FERRY_EOF when none is left, or a negative code. */
static int resync(ferry_tfr_reader_t *r, ferry_error_t *err) {
  for (;;) {
    const uint8_t *b;
    int64_t n;
    r->pos++;
    n = window(r, HEADER_LEN, &b, err);
    if (n < 0)
      return (int)n;
    if (n < HEADER_LEN) {
      r->pos += (uint64_t)n;
      return FERRY_EOF;
    }
    uint64_t len;
    if (ferry__tfr_header_check(b, &len) && len <= r->opts.max_record_len &&
        len <= SIZE_MAX - FRAMING_LEN)
      return 0;
  }
}

static bool is_record_error(int code) {
  return code == FERRY_ETRUNCLEN || code == FERRY_ETRUNCDATA ||
         code == FERRY_ELENCRC || code == FERRY_EDATACRC ||
         code == FERRY_ETOOLONG || code == FERRY_ECOMPRESS;
}

/* Counts a skipped bad record at r->pos (policy SKIP) and reports it. */
static void note_skip(ferry_tfr_reader_t *r, const ferry_error_t *e) {
  r->stats.skipped++;
  r->stats.last_bad = *e;
  if (r->opts.on_skip != NULL)
    r->opts.on_skip(e, r->pos, r->next_index, r->opts.on_skip_arg);
}

static int fail(ferry_tfr_reader_t *r, int code, const ferry_error_t *e,
                ferry_error_t *err) {
  r->sticky = code;
  r->sticky_err = *e;
  if (err != NULL)
    *err = *e;
  return code;
}

int ferry__tfr_reader_next(ferry_tfr_reader_t *r, ferry_record_t *rec,
                           ferry_error_t *err) {
  ferry_error_t e;
  int rc;

  if (r->sticky != 0) {
    if (err != NULL)
      *err = r->sticky_err;
    return r->sticky;
  }
  if (r->done)
    return FERRY_EOF;
  ferry_error_clear(&e);
  if (!r->started) {
    rc = seek_start(r, &e);
    if (rc < 0)
      return fail(r, rc, &e, err);
  }
  for (;;) {
    /* max_records counts record slots, skipped ones included, so a range
     * read from an index never runs into the next range. */
    if (r->opts.max_records != 0 &&
        r->next_index - r->opts.start_index >= r->opts.max_records) {
      r->done = true;
      return FERRY_EOF;
    }
    rc = read_one(r, rec, &e);
    if (rc == 0) {
      r->stats.records++;
      r->stats.bytes += rec->len;
      return 0;
    }
    if (rc == FERRY_EOF) {
      r->done = true;
      return FERRY_EOF;
    }
    if (r->opts.on_error == FERRY_ON_ERROR_FAIL || !is_record_error(rc))
      return fail(r, rc, &e, err);

    note_skip(r, &e);
    switch (rc) {
    case FERRY_EDATACRC:
      r->pos += r->bad_len + FRAMING_LEN;
      r->next_index++;
      break;
    case FERRY_ELENCRC:
    case FERRY_ETOOLONG:
      r->next_index++;
      rc = resync(r, &e);
      if (rc == FERRY_EOF) {
        r->done = true;
        return FERRY_EOF;
      }
      if (rc == FERRY_ECOMPRESS) {
        /* The stream broke while scanning: one more bad stretch. */
        note_skip(r, &e);
        r->done = true;
        return FERRY_EOF;
      }
      if (rc < 0)
        return fail(r, rc, &e, err);
      break;
    default:
      /* A truncated tail or a broken stream ends the file. */
      r->done = true;
      return FERRY_EOF;
    }
  }
}

/* Writer. */

#define WBUF_LEN (256u << 10)

struct ferry_tfr_writer_s {
  char *path;
  int fd;
  ferry_compression_t compression;
  z_stream zs;
  bool z_init;
  uint8_t *out; /* bytes waiting for write(2) */
  size_t out_len;
  uint64_t file_off; /* bytes written to the file so far */
  int code;          /* first error, repeated from then on */
  ferry_error_t first_err;
};

static int wfail(ferry_tfr_writer_t *w, ferry_error_t *err) {
  if (err != NULL)
    *err = w->first_err;
  return w->code;
}

static int write_all(ferry_tfr_writer_t *w, const uint8_t *p, size_t n) {
  while (n > 0) {
    ssize_t k = write(w->fd, p, n);
    if (k < 0) {
      if (errno == EINTR)
        continue;
      w->code = ferry__err_from_errno(errno);
      ferry__seterr(&w->first_err, w->code,
                    "%s: write at byte offset %" PRIu64 ": %s", w->path,
                    w->file_off, strerror(errno));
      return w->code;
    }
    p += k;
    n -= (size_t)k;
    w->file_off += (uint64_t)k;
  }
  return 0;
}

static int flush_out(ferry_tfr_writer_t *w) {
  int rc = write_all(w, w->out, w->out_len);
  w->out_len = 0;
  return rc;
}

/* Runs deflate over `n` bytes with `flush`, writing full buffers out. */
static int deflate_bytes(ferry_tfr_writer_t *w, const uint8_t *p, size_t n,
                         int flush) {
  z_stream *zs = &w->zs;
  for (;;) {
    size_t chunk = n > ZIN_CHUNK ? ZIN_CHUNK : n;
    int zr;
    zs->next_in = (Bytef *)(uintptr_t)p;
    zs->avail_in = (uInt)chunk;
    do {
      if (w->out_len == WBUF_LEN && flush_out(w) != 0)
        return w->code;
      zs->next_out = w->out + w->out_len;
      zs->avail_out = (uInt)(WBUF_LEN - w->out_len);
      zr = deflate(zs, chunk == n ? flush : Z_NO_FLUSH);
      w->out_len = WBUF_LEN - zs->avail_out;
      if (zr == Z_STREAM_ERROR) {
        w->code = FERRY_EIO;
        ferry__seterr(&w->first_err, w->code, "%s: deflate failed",
                      w->path);
        return w->code;
      }
    } while (zs->avail_in > 0 || zs->avail_out == 0 ||
             (flush == Z_FINISH && chunk == n && zr != Z_STREAM_END));
    p += chunk;
    n -= chunk;
    if (n == 0)
      return 0;
  }
}

static int emit(ferry_tfr_writer_t *w, const void *data, size_t n) {
  if (w->compression != FERRY_COMPRESSION_NONE)
    return deflate_bytes(w, data, n, Z_NO_FLUSH);
  if (n > WBUF_LEN - w->out_len) {
    if (flush_out(w) != 0)
      return w->code;
    if (n >= WBUF_LEN)
      return write_all(w, data, n);
  }
  memcpy(w->out + w->out_len, data, n);
  w->out_len += n;
  return 0;
}

int ferry__tfr_writer_open(const char *path, ferry_compression_t compression,
                           ferry_tfr_writer_t **out, ferry_error_t *err) {
  ferry_tfr_writer_t *w;
  int code;

  *out = NULL;
  if (compression != FERRY_COMPRESSION_NONE &&
      compression != FERRY_COMPRESSION_GZIP &&
      compression != FERRY_COMPRESSION_ZLIB)
    return ferry__seterr(err, FERRY_EINVAL,
                         "%s: the writer needs none, gzip or zlib, not %s",
                         path, ferry__compression_name(compression));
  w = ferry__calloc(1, sizeof(*w));
  if (w == NULL || (w->path = ferry__strdup(path)) == NULL ||
      (w->out = ferry__malloc(WBUF_LEN)) == NULL) {
    if (w != NULL)
      ferry__free(w->path);
    ferry__free(w);
    return ferry__seterr(err, FERRY_ENOMEM, "%s: out of memory", path);
  }
  w->compression = compression;
  if (compression != FERRY_COMPRESSION_NONE) {
    w->zs.zalloc = zalloc_cb;
    w->zs.zfree = zfree_cb;
    int zr = deflateInit2(&w->zs, Z_DEFAULT_COMPRESSION, Z_DEFLATED,
                          compression == FERRY_COMPRESSION_GZIP ? 15 + 16 : 15,
                          8, Z_DEFAULT_STRATEGY);
    if (zr != Z_OK) {
      ferry__free(w->out);
      ferry__free(w->path);
      ferry__free(w);
      return ferry__seterr(err, zr == Z_MEM_ERROR ? FERRY_ENOMEM : FERRY_EIO,
                           "%s: deflateInit2 failed (%d)", path, zr);
    }
    w->z_init = true;
  }
  w->fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (w->fd < 0) {
    code = ferry__err_from_errno(errno);
    ferry__seterr(err, code, "%s: open: %s", path, strerror(errno));
    if (w->z_init)
      deflateEnd(&w->zs);
    ferry__free(w->out);
    ferry__free(w->path);
    ferry__free(w);
    return code;
  }
  *out = w;
  return 0;
}

int ferry__tfr_writer_write(ferry_tfr_writer_t *w, const void *data, size_t len,
                            ferry_error_t *err) {
  uint8_t header[HEADER_LEN], footer[4];

  if (w->code != 0)
    return wfail(w, err);
  ferry__tfr_frame_header(len, header);
  ferry__tfr_frame_footer(data, len, footer);
  if (emit(w, header, sizeof(header)) != 0 || emit(w, data, len) != 0 ||
      emit(w, footer, sizeof(footer)) != 0)
    return wfail(w, err);
  return 0;
}

int ferry__tfr_writer_close(ferry_tfr_writer_t *w, ferry_error_t *err) {
  int code;

  if (w == NULL)
    return 0;
  if (w->code == 0 && w->compression != FERRY_COMPRESSION_NONE)
    deflate_bytes(w, NULL, 0, Z_FINISH);
  if (w->code == 0)
    flush_out(w);
  if (close(w->fd) != 0 && w->code == 0) {
    w->code = ferry__err_from_errno(errno);
    ferry__seterr(&w->first_err, w->code, "%s: close: %s", w->path,
                  strerror(errno));
  }
  code = w->code;
  if (code != 0 && err != NULL)
    *err = w->first_err;
  if (w->z_init)
    deflateEnd(&w->zs);
  ferry__free(w->out);
  ferry__free(w->path);
  ferry__free(w);
  return code;
}
