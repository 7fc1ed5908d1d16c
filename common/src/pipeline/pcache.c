/* The prefix cache's files (pcache.h, which documents the format). */
#include "pcache.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "alloc.h"
#include "crc32c.h"
#include "error_internal.h"
#include "tfrecord.h"

#define HDR FERRY_TFR_HEADER_LEN /* 12: a frame's header */
#define FRAME (HDR + 4)          /* a frame's header and data CRC */
#define KEY_FIXED 60             /* the key's bytes before the path */
#define HEADER_FIXED (8 + KEY_FIXED)
#define ENTRY_FIXED 44
#define FOOTER_FIXED 16
#define TRAILER_DATA 16
#define TRAILER_LEN (FRAME + TRAILER_DATA) /* 32 */
#define WBUF (1u << 20)
#define RBUF_MIN (64u << 10)

static const char magic_header[8] = {'F', 'E', 'R', 'R', 'Y', 'P', 'C', '1'};
static const char magic_footer[8] = {'F', 'E', 'R', 'R', 'Y', 'P', 'C', 'F'};
static const char magic_trailer[8] = {'F', 'E', 'R', 'R', 'Y', 'P', 'C', 'T'};

/* Little-endian fields. */

static void put_u32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}

static void put_u64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_u32(const uint8_t *p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; i--)
    v = (v << 8) | p[i];
  return v;
}

static uint64_t get_u64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--)
    v = (v << 8) | p[i];
  return v;
}

static uint32_t crc_masked(uint32_t crc) { return ferry__crc32c_mask(crc); }

/* The key's fixed bytes (header offsets 8..67): the fields, then path_len.
 * False when the key has no path or one too long for the format. */
static bool key_fixed(const ferry_pcache_key_t *k, uint8_t out[KEY_FIXED],
                      size_t *plen) {
  if (k == NULL || k->path == NULL)
    return false;
  size_t n = strlen(k->path);
  if (n > UINT32_MAX)
    return false;
  put_u64(out, k->prefix_fp);
  put_u64(out + 8, k->file_size);
  put_u64(out + 16, (uint64_t)k->mtime_ns);
  put_u64(out + 24, k->byte_offset);
  put_u64(out + 32, k->byte_end);
  put_u64(out + 40, k->first_record);
  put_u64(out + 48, k->max_records);
  put_u32(out + 56, (uint32_t)n);
  *plen = n;
  return true;
}

static uint64_t fnv1a(uint64_t h, const void *buf, size_t n) {
  const uint8_t *p = buf;
  for (size_t i = 0; i < n; i++) {
    h ^= p[i];
    h *= UINT64_C(0x100000001b3);
  }
  return h;
}

static uint64_t splitmix_final(uint64_t z) {
  z ^= z >> 30;
  z *= UINT64_C(0xbf58476d1ce4e5b9);
  z ^= z >> 27;
  z *= UINT64_C(0x94d049bb133111eb);
  z ^= z >> 31;
  return z;
}

void ferry__pcache_entry_name(const ferry_pcache_key_t *k, char *buf,
                              size_t n) {
  uint8_t fixed[KEY_FIXED];
  size_t plen = 0;
  const char *path = k->path != NULL ? k->path : "";
  if (!key_fixed(k, fixed, &plen)) {
    memset(fixed, 0, sizeof(fixed));
    put_u64(fixed, k->prefix_fp);
  }
  uint64_t h = fnv1a(UINT64_C(0xcbf29ce484222325), fixed, sizeof(fixed));
  h = splitmix_final(fnv1a(h, path, plen));
  if (n > 0)
    snprintf(buf, n, "%016" PRIx64 "-%016" PRIx64 "%s", k->prefix_fp, h,
             FERRY_PCACHE_SUFFIX);
}

bool ferry__pcache_damaged(int code) {
  return code == FERRY_ELENCRC || code == FERRY_EDATACRC ||
         code == FERRY_ETRUNCLEN || code == FERRY_ETRUNCDATA;
}

/* "<dir>/<entry name>" in a new string, or NULL (out of memory). */
static char *entry_path(const char *dir, const ferry_pcache_key_t *k,
                        size_t extra) {
  char name[FERRY_PCACHE_NAME_MAX];
  ferry__pcache_entry_name(k, name, sizeof(name));
  size_t n = strlen(dir) + 1 + strlen(name) + extra + 1;
  char *p = ferry__malloc(n);
  if (p != NULL)
    snprintf(p, n, "%s/%s", dir, name);
  return p;
}

static int sys_err(ferry_error_t *err, int e, const char *what,
                   const char *path) {
  return ferry__seterr(err, ferry__err_from_errno(e), "%s: %s: %s", path, what,
                       strerror(e));
}

/* Writer. */

struct ferry_pcache_writer_s {
  int fd;
  char *tmp;   /* the temporary file */
  char *final; /* the entry's name */
  uint8_t *buf;
  size_t blen;
  uint64_t bytes;        /* appended so far, buffered bytes included */
  uint64_t *offs;        /* by pos: the entry's file offset, 0 = not yet */
  size_t ocap;           /* slots in offs, all initialised */
  uint64_t added;        /* distinct positions added */
  uint64_t pos_limit;    /* positions must be below this */
  int failed;            /* the sticky code of the first failure, or 0 */
  ferry_error_t failerr; /* its error */
};

static int write_all(ferry_pcache_writer_t *w, const void *p, size_t n,
                     ferry_error_t *err) {
  const uint8_t *b = p;
  while (n > 0) {
    ssize_t k = write(w->fd, b, n);
    if (k < 0) {
      if (errno == EINTR)
        continue;
      return sys_err(err, errno, "write", w->tmp);
    }
    b += k;
    n -= (size_t)k;
  }
  return 0;
}

static int flush(ferry_pcache_writer_t *w, ferry_error_t *err) {
  int rc = write_all(w, w->buf, w->blen, err);
  w->blen = 0;
  return rc;
}

/* Appends n bytes: through the buffer, or straight to the file when they
 * are half the buffer or more. */
static int append(ferry_pcache_writer_t *w, const void *p, size_t n,
                  ferry_error_t *err) {
  int rc;
  if ((n >= WBUF / 2 || n > WBUF - w->blen) && (rc = flush(w, err)) != 0)
    return rc;
  if (n >= WBUF / 2) {
    if ((rc = write_all(w, p, n, err)) != 0)
      return rc;
  } else {
    memcpy(w->buf + w->blen, p, n);
    w->blen += n;
  }
  w->bytes += n;
  return 0;
}

/* Marks w spent with the failure in err (code rc) and returns rc. */
static int fail(ferry_pcache_writer_t *w, int rc, ferry_error_t *err) {
  if (w->failed == 0) {
    w->failed = rc;
    if (err != NULL)
      w->failerr = *err;
    else
      ferry__seterr(&w->failerr, rc, "%s: %s", w->tmp, ferry_strerror(rc));
  }
  return rc;
}

static void writer_free(ferry_pcache_writer_t *w, bool unlink_tmp) {
  if (w->fd >= 0)
    close(w->fd);
  if (unlink_tmp && w->tmp != NULL)
    unlink(w->tmp);
  ferry__free(w->tmp);
  ferry__free(w->final);
  ferry__free(w->buf);
  ferry__free(w->offs);
  ferry__free(w);
}

static uint64_t random64(void) {
  uint64_t v;
  if (getrandom(&v, sizeof(v), GRND_NONBLOCK) == (ssize_t)sizeof(v))
    return v;
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  v = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30);
  return splitmix_final(v ^ ((uint64_t)getpid() << 40) ^ (uintptr_t)&ts);
}

int ferry__pcache_writer_open(const char *dir, const ferry_pcache_key_t *key,
                              ferry_pcache_writer_t **out, ferry_error_t *err) {
  uint8_t fixed[KEY_FIXED];
  size_t plen;
  int rc;
  *out = NULL;
  if (dir == NULL || !key_fixed(key, fixed, &plen))
    return ferry__seterr(err, FERRY_EINVAL,
                         "prefix cache: a key needs a path (and a directory)");
  ferry_pcache_writer_t *w = ferry__calloc(1, sizeof(*w));
  if (w == NULL)
    return ferry__seterr(err, FERRY_ENOMEM, "prefix cache: out of memory");
  w->fd = -1;
  w->pos_limit = FERRY_PCACHE_MAX_RECORDS;
  if (key->max_records != 0 && key->max_records < w->pos_limit)
    w->pos_limit = key->max_records;
  w->final = entry_path(dir, key, 0);
  w->tmp = entry_path(dir, key, 5 + 16);
  w->buf = ferry__malloc(WBUF);
  if (w->final == NULL || w->tmp == NULL || w->buf == NULL) {
    writer_free(w, false);
    return ferry__seterr(err, FERRY_ENOMEM, "prefix cache: out of memory");
  }
  size_t base = strlen(w->final);
  for (int tries = 0; w->fd < 0; tries++) {
    snprintf(w->tmp + base, 5 + 16 + 1, ".tmp.%016" PRIx64, random64());
    w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (w->fd < 0 && (errno != EEXIST || tries == 8)) {
      rc = sys_err(err, errno, "create", w->tmp);
      writer_free(w, false);
      return rc;
    }
  }
  /* The header record. */
  uint8_t head[HDR + HEADER_FIXED], foot[4];
  uint64_t len = HEADER_FIXED + (uint64_t)plen;
  ferry__tfr_frame_header(len, head);
  memcpy(head + HDR, magic_header, 8);
  memcpy(head + HDR + 8, fixed, KEY_FIXED);
  uint32_t crc = ferry__crc32c(0, head + HDR, HEADER_FIXED);
  crc = ferry__crc32c(crc, key->path, plen);
  put_u32(foot, crc_masked(crc));
  if ((rc = append(w, head, sizeof(head), err)) != 0 ||
      (rc = append(w, key->path, plen, err)) != 0 ||
      (rc = append(w, foot, 4, err)) != 0) {
    writer_free(w, true);
    return rc;
  }
  *out = w;
  return 0;
}

int ferry__pcache_writer_add(ferry_pcache_writer_t *w, uint64_t pos,
                             uint64_t index, uint64_t offset, int64_t label,
                             int h, int wd, int c, const uint8_t *pixels,
                             ferry_error_t *err) {
  int rc;
  if (w->failed != 0) {
    if (err != NULL)
      *err = w->failerr;
    return w->failed;
  }
  if (h <= 0 || wd <= 0 || c <= 0 || c > 4 || pixels == NULL) {
    rc = ferry__seterr(err, FERRY_EINVAL,
                       "%s: position %" PRIu64 ": bad image (%dx%dx%d)", w->tmp,
                       pos, h, wd, c);
    return fail(w, rc, err);
  }
  if (pos >= w->pos_limit) {
    rc = ferry__seterr(err, FERRY_EINVAL,
                       "%s: position %" PRIu64 " out of range (limit %" PRIu64
                       ")",
                       w->tmp, pos, w->pos_limit);
    return fail(w, rc, err);
  }
  if (pos >= w->ocap) {
    size_t old = w->ocap;
    if (!FERRY__GROW(w->offs, w->ocap, (size_t)pos + 1, 1024)) {
      rc = ferry__seterr(err, FERRY_ENOMEM, "%s: out of memory", w->tmp);
      return fail(w, rc, err);
    }
    memset(w->offs + old, 0, (w->ocap - old) * sizeof(*w->offs));
  }
  if (w->offs[pos] != 0) {
    rc = ferry__seterr(err, FERRY_EINVAL,
                       "%s: position %" PRIu64 " added twice", w->tmp, pos);
    return fail(w, rc, err);
  }
  /* h, wd < 2^31 and c <= 4: no overflow in 64 bits. */
  uint64_t npix = (uint64_t)h * (uint64_t)wd * (uint64_t)c;
  if (npix > SIZE_MAX - ENTRY_FIXED) {
    rc =
        ferry__seterr(err, FERRY_EINVAL,
                      "%s: position %" PRIu64 ": image too large", w->tmp, pos);
    return fail(w, rc, err);
  }
  uint8_t head[HDR + ENTRY_FIXED], foot[4];
  uint64_t at = w->bytes;
  ferry__tfr_frame_header(ENTRY_FIXED + npix, head);
  uint8_t *d = head + HDR;
  put_u64(d, pos);
  put_u64(d + 8, index);
  put_u64(d + 16, offset);
  put_u64(d + 24, (uint64_t)label);
  put_u32(d + 32, (uint32_t)h);
  put_u32(d + 36, (uint32_t)wd);
  put_u32(d + 40, (uint32_t)c);
  uint32_t crc = ferry__crc32c(0, d, ENTRY_FIXED);
  crc = ferry__crc32c(crc, pixels, (size_t)npix);
  put_u32(foot, crc_masked(crc));
  if ((rc = append(w, head, sizeof(head), err)) != 0 ||
      (rc = append(w, pixels, (size_t)npix, err)) != 0 ||
      (rc = append(w, foot, 4, err)) != 0)
    return fail(w, rc, err);
  w->offs[pos] = at;
  w->added++;
  return 0;
}

uint64_t ferry__pcache_writer_bytes(const ferry_pcache_writer_t *w) {
  return w->bytes;
}

/* The footer and trailer records. */
static int write_tail(ferry_pcache_writer_t *w, uint64_t n,
                      ferry_error_t *err) {
  uint8_t head[HDR + FOOTER_FIXED], foot[4], chunk[8 * 512];
  uint64_t footer_off = w->bytes;
  int rc;
  ferry__tfr_frame_header(FOOTER_FIXED + 8 * n, head);
  memcpy(head + HDR, magic_footer, 8);
  put_u64(head + HDR + 8, n);
  uint32_t crc = ferry__crc32c(0, head + HDR, FOOTER_FIXED);
  if ((rc = append(w, head, sizeof(head), err)) != 0)
    return rc;
  for (uint64_t i = 0; i < n;) {
    size_t k = 0;
    for (; k < 512 && i < n; k++, i++)
      put_u64(chunk + 8 * k, w->offs[i]);
    crc = ferry__crc32c(crc, chunk, 8 * k);
    if ((rc = append(w, chunk, 8 * k, err)) != 0)
      return rc;
  }
  put_u32(foot, crc_masked(crc));
  if ((rc = append(w, foot, 4, err)) != 0)
    return rc;
  uint8_t t[TRAILER_LEN];
  ferry__tfr_frame_header(TRAILER_DATA, t);
  memcpy(t + HDR, magic_trailer, 8);
  put_u64(t + HDR + 8, footer_off);
  ferry__tfr_frame_footer(t + HDR, TRAILER_DATA, t + HDR + TRAILER_DATA);
  if ((rc = append(w, t, sizeof(t), err)) != 0)
    return rc;
  return flush(w, err);
}

int ferry__pcache_writer_commit(ferry_pcache_writer_t *w, uint64_t n,
                                ferry_error_t *err) {
  int rc;
  if (w->failed != 0) {
    rc = w->failed;
    if (err != NULL)
      *err = w->failerr;
    writer_free(w, true);
    return rc;
  }
  for (uint64_t p = 0; p < n; p++)
    if (p >= w->ocap || w->offs[p] == 0) {
      rc = ferry__seterr(err, FERRY_EINVAL,
                         "%s: position %" PRIu64 " of %" PRIu64
                         " was never added",
                         w->tmp, p, n);
      writer_free(w, true);
      return rc;
    }
  if (w->added != n) {
    uint64_t p = n;
    while (p < w->ocap && w->offs[p] == 0)
      p++;
    rc = ferry__seterr(err, FERRY_EINVAL,
                       "%s: position %" PRIu64
                       " added beyond the count %" PRIu64,
                       w->tmp, p, n);
    writer_free(w, true);
    return rc;
  }
  if ((rc = write_tail(w, n, err)) != 0) {
    writer_free(w, true);
    return rc;
  }
  int fd = w->fd;
  w->fd = -1;
  if (close(fd) != 0) {
    rc = sys_err(err, errno, "close", w->tmp);
    writer_free(w, true);
    return rc;
  }
  if (rename(w->tmp, w->final) != 0) {
    int e = errno;
    rc = ferry__seterr(err, ferry__err_from_errno(e), "%s: rename to %s: %s",
                       w->tmp, w->final, strerror(e));
    writer_free(w, true);
    return rc;
  }
  writer_free(w, false);
  return 0;
}

void ferry__pcache_writer_abort(ferry_pcache_writer_t *w) {
  if (w != NULL)
    writer_free(w, true);
}

/* Reader. */

struct ferry_pcache_reader_s {
  int fd;
  char *path;
  uint64_t n;
  uint64_t *offs;
  uint64_t hdr_end;    /* where the header record ends */
  uint64_t footer_off; /* where the footer record begins */
  uint8_t *buf;
  size_t cap;
  size_t guess; /* bytes the next get reads first */
  uint64_t bytes;
  /* ferry__pcache_reader_load: the entries, [hdr_end, footer_off), read
   * in one call; NULL: each get reads its entry. */
  uint8_t *all;
};

static void reader_free(ferry_pcache_reader_t *r) {
  if (r->fd >= 0)
    close(r->fd);
  ferry__free(r->path);
  ferry__free(r->offs);
  ferry__free(r->buf);
  ferry__free(r->all);
  ferry__free(r);
}

/* Reads exactly n bytes at off, or fails: a read error, or a file that
 * ends short (`trunc`, a truncation code). */
static int read_at(ferry_pcache_reader_t *r, void *buf, size_t n, uint64_t off,
                   int trunc, const char *what, ferry_error_t *err) {
  int64_t got = ferry__pread_full(r->fd, buf, n, off);
  if (got < 0)
    return ferry__seterr(err, ferry__err_from_errno((int)-got),
                         "%s: offset %" PRIu64 ": read %s: %s", r->path, off,
                         what, strerror((int)-got));
  if ((uint64_t)got < n)
    return ferry__seterr(err, trunc,
                         "%s: offset %" PRIu64 ": the file ends in the %s",
                         r->path, off, what);
  return 0;
}

static int damaged(ferry_pcache_reader_t *r, ferry_error_t *err, int code,
                   uint64_t off, const char *what) {
  return ferry__seterr(err, code, "%s: offset %" PRIu64 ": %s", r->path, off,
                       what);
}

static int check_trailer(ferry_pcache_reader_t *r, uint64_t size,
                         ferry_error_t *err) {
  uint8_t t[TRAILER_LEN];
  uint64_t len, at = size - TRAILER_LEN;
  int rc = read_at(r, t, sizeof(t), at, FERRY_ETRUNCDATA, "trailer", err);
  if (rc != 0)
    return rc;
  if (!ferry__tfr_header_check(t, &len))
    return damaged(r, err, FERRY_ELENCRC, at,
                   "trailer: length CRC mismatch (a truncated or damaged "
                   "file)");
  if (len != TRAILER_DATA)
    return damaged(r, err, FERRY_EDATACRC, at,
                   "trailer: wrong length (a truncated or damaged file)");
  uint32_t crc = crc_masked(ferry__crc32c(0, t + HDR, TRAILER_DATA));
  if (get_u32(t + HDR + TRAILER_DATA) != crc)
    return damaged(r, err, FERRY_EDATACRC, at, "trailer: data CRC mismatch");
  if (memcmp(t + HDR, magic_trailer, 8) != 0)
    return damaged(r, err, FERRY_EDATACRC, at,
                   "not a prefix cache trailer (bad magic)");
  r->footer_off = get_u64(t + HDR + 8);
  if (r->footer_off < FRAME + HEADER_FIXED ||
      r->footer_off > at - FRAME - FOOTER_FIXED)
    return damaged(r, err, FERRY_EDATACRC, at + HDR + 8,
                   "trailer: footer offset out of bounds");
  return 0;
}

static int check_footer(ferry_pcache_reader_t *r, uint64_t size,
                        ferry_error_t *err) {
  uint8_t f[HDR + FOOTER_FIXED], foot[4];
  uint64_t len, at = r->footer_off;
  int rc = read_at(r, f, sizeof(f), at, FERRY_ETRUNCDATA, "footer", err);
  if (rc != 0)
    return rc;
  if (!ferry__tfr_header_check(f, &len))
    return damaged(r, err, FERRY_ELENCRC, at, "footer: length CRC mismatch");
  /* The footer ends where the trailer begins. */
  if (len != size - TRAILER_LEN - at - FRAME)
    return damaged(r, err, FERRY_ETRUNCDATA, at,
                   "footer: its length disagrees with the file's size");
  if (len < FOOTER_FIXED || (len - FOOTER_FIXED) % 8 != 0)
    return damaged(r, err, FERRY_EDATACRC, at, "footer: malformed length");
  uint64_t n = (len - FOOTER_FIXED) / 8;
  if (memcmp(f + HDR, magic_footer, 8) != 0)
    return damaged(r, err, FERRY_EDATACRC, at + HDR,
                   "not a prefix cache footer (bad magic)");
  if (get_u64(f + HDR + 8) != n)
    return damaged(r, err, FERRY_EDATACRC, at + HDR + 8,
                   "footer: count disagrees with its length");
  if (n > SIZE_MAX / 8)
    return damaged(r, err, FERRY_EDATACRC, at, "footer: too many entries");
  r->offs = ferry__malloc(n > 0 ? (size_t)n * 8 : 1);
  if (r->offs == NULL)
    return ferry__seterr(err, FERRY_ENOMEM, "%s: out of memory", r->path);
  uint64_t tab = at + HDR + FOOTER_FIXED;
  if ((rc = read_at(r, r->offs, (size_t)n * 8, tab, FERRY_ETRUNCDATA, "footer",
                    err)) != 0 ||
      (rc = read_at(r, foot, 4, tab + 8 * n, FERRY_ETRUNCDATA, "footer",
                    err)) != 0)
    return rc;
  uint32_t crc = ferry__crc32c(0, f + HDR, FOOTER_FIXED);
  crc = ferry__crc32c(crc, r->offs, (size_t)n * 8);
  if (get_u32(foot) != crc_masked(crc))
    return damaged(r, err, FERRY_EDATACRC, at, "footer: data CRC mismatch");
  for (uint64_t i = 0; i < n; i++)
    r->offs[i] = get_u64((const uint8_t *)&r->offs[i]);
  r->n = n;
  return 0;
}

static int check_header(ferry_pcache_reader_t *r, const uint8_t *fixed,
                        const char *path, size_t plen, ferry_error_t *err) {
  static const char *const fields[] = {
      "prefix fingerprint", "file size",    "mtime",       "byte offset",
      "byte end",           "first record", "max records", "path length"};
  uint8_t h[HDR];
  uint64_t len;
  int rc = read_at(r, h, sizeof(h), 0, FERRY_ETRUNCLEN, "header", err);
  if (rc != 0)
    return rc;
  if (!ferry__tfr_header_check(h, &len))
    return damaged(r, err, FERRY_ELENCRC, 0, "header: length CRC mismatch");
  if (len > r->footer_off - FRAME)
    return damaged(r, err, FERRY_EDATACRC, 0, "header: runs into the footer");
  if (len != HEADER_FIXED + (uint64_t)plen)
    return damaged(r, err, FERRY_EDATACRC, 0,
                   "header: the entry is for another key (path length)");
  size_t need = (size_t)len + 4;
  if (need > r->cap) {
    uint8_t *b = ferry__realloc(r->buf, need);
    if (b == NULL)
      return ferry__seterr(err, FERRY_ENOMEM, "%s: out of memory", r->path);
    r->buf = b;
    r->cap = need;
  }
  if ((rc = read_at(r, r->buf, need, HDR, FERRY_ETRUNCDATA, "header", err)) !=
      0)
    return rc;
  uint32_t crc = crc_masked(ferry__crc32c(0, r->buf, (size_t)len));
  if (get_u32(r->buf + len) != crc)
    return damaged(r, err, FERRY_EDATACRC, 0, "header: data CRC mismatch");
  if (memcmp(r->buf, magic_header, 8) != 0)
    return damaged(r, err, FERRY_EDATACRC, HDR,
                   "not a prefix cache file (bad magic)");
  for (size_t i = 0; i < KEY_FIXED / 8 + 1; i++) {
    size_t o = 8 * i, w = i < KEY_FIXED / 8 ? 8 : 4;
    if (memcmp(r->buf + 8 + o, fixed + o, w) != 0)
      return ferry__seterr(err, FERRY_EDATACRC,
                           "%s: offset %zu: the entry is for another key "
                           "(%s)",
                           r->path, HDR + 8 + o, fields[i]);
  }
  if (memcmp(r->buf + HEADER_FIXED, path, plen) != 0)
    return damaged(r, err, FERRY_EDATACRC, HDR + HEADER_FIXED,
                   "the entry is for another key (path)");
  r->hdr_end = FRAME + len;
  return 0;
}

int ferry__pcache_reader_open(const char *dir, const ferry_pcache_key_t *key,
                              ferry_pcache_reader_t **out, ferry_error_t *err) {
  uint8_t fixed[KEY_FIXED];
  size_t plen;
  struct stat st;
  int rc;
  *out = NULL;
  if (dir == NULL || !key_fixed(key, fixed, &plen))
    return ferry__seterr(err, FERRY_EINVAL,
                         "prefix cache: a key needs a path (and a directory)");
  ferry_pcache_reader_t *r = ferry__calloc(1, sizeof(*r));
  if (r == NULL)
    return ferry__seterr(err, FERRY_ENOMEM, "prefix cache: out of memory");
  r->fd = -1;
  r->path = entry_path(dir, key, 0);
  r->buf = ferry__malloc(RBUF_MIN);
  if (r->path == NULL || r->buf == NULL) {
    reader_free(r);
    return ferry__seterr(err, FERRY_ENOMEM, "prefix cache: out of memory");
  }
  r->cap = r->guess = RBUF_MIN;
  r->fd = open(r->path, O_RDONLY | O_CLOEXEC);
  if (r->fd < 0) {
    rc = errno == ENOENT
             ? ferry__seterr(err, FERRY_ENOENT, "%s: no cache entry", r->path)
             : sys_err(err, errno, "open", r->path);
    reader_free(r);
    return rc;
  }
  if (fstat(r->fd, &st) != 0) {
    rc = sys_err(err, errno, "stat", r->path);
    reader_free(r);
    return rc;
  }
  uint64_t size = (uint64_t)st.st_size;
  if (!S_ISREG(st.st_mode))
    rc = damaged(r, err, FERRY_EDATACRC, 0, "not a regular file");
  else if (size < 2 * FRAME + HEADER_FIXED + FOOTER_FIXED + TRAILER_LEN)
    rc = damaged(r, err, FERRY_ETRUNCDATA, size,
                 "the file is too short for a cache entry");
  else
    rc = check_trailer(r, size, err);
  if (rc == 0)
    rc = check_footer(r, size, err);
  if (rc == 0)
    rc = check_header(r, fixed, key->path, plen, err);
  for (uint64_t i = 0; rc == 0 && i < r->n; i++) {
    uint64_t o = r->offs[i];
    if (o < r->hdr_end || o > r->footer_off ||
        r->footer_off - o < FRAME + ENTRY_FIXED)
      rc =
          ferry__seterr(err, FERRY_EDATACRC,
                        "%s: offset %" PRIu64 ": footer: the offset of "
                        "position %" PRIu64 " is out of bounds",
                        r->path, r->footer_off + HDR + FOOTER_FIXED + 8 * i, i);
  }
  if (rc != 0) {
    reader_free(r);
    return rc;
  }
  *out = r;
  return 0;
}

uint64_t ferry__pcache_reader_count(const ferry_pcache_reader_t *r) {
  return r->n;
}

static int entry_damaged(ferry_pcache_reader_t *r, ferry_error_t *err, int code,
                         uint64_t pos, uint64_t off, const char *what) {
  return ferry__seterr(err, code,
                       "%s: position %" PRIu64 " at offset %" PRIu64 ": %s",
                       r->path, pos, off, what);
}

/* The checks of an entry whose fixed part is at d, pixels at px (n
 * bytes) and data CRC at tail: the CRC, the stored position, the shape;
 * fills *out. */
static int entry_check(ferry_pcache_reader_t *r, uint64_t pos, uint64_t off,
                       const uint8_t *d, const uint8_t *px, size_t n,
                       const uint8_t *tail, ferry_pcache_record_t *out,
                       ferry_error_t *err) {
  uint32_t crc = ferry__crc32c(ferry__crc32c(0, d, ENTRY_FIXED), px, n);
  if (get_u32(tail) != crc_masked(crc))
    return entry_damaged(r, err, FERRY_EDATACRC, pos, off, "data CRC mismatch");
  if (get_u64(d) != pos)
    return entry_damaged(r, err, FERRY_EDATACRC, pos, off,
                         "the entry holds another position");
  uint32_t h = get_u32(d + 32), w = get_u32(d + 36), c = get_u32(d + 40);
  if (h == 0 || w == 0 || c == 0 || c > 4 || h > INT_MAX || w > INT_MAX ||
      (uint64_t)h * w * c != n)
    return entry_damaged(r, err, FERRY_EDATACRC, pos, off, "bad image shape");
  out->index = get_u64(d + 8);
  out->offset = get_u64(d + 16);
  out->label = (int64_t)get_u64(d + 24);
  out->h = (int)h;
  out->w = (int)w;
  out->c = (int)c;
  out->pixels = px;
  return 0;
}

int ferry__pcache_reader_load(ferry_pcache_reader_t *r, uint64_t max_bytes,
                              ferry_error_t *err) {
  uint64_t n = r->footer_off - r->hdr_end;
  if (r->all != NULL || n > max_bytes || n == 0)
    return 0;
  uint8_t *all = ferry__malloc((size_t)n);
  if (all == NULL)
    return 0; /* each get reads its entry */
  int64_t got = ferry__pread_full(r->fd, all, (size_t)n, r->hdr_end);
  if (got < 0) {
    ferry__free(all);
    return sys_err(err, (int)-got, "read", r->path);
  }
  r->bytes += (uint64_t)got;
  if ((uint64_t)got < n) {
    ferry__free(all);
    return damaged(r, err, FERRY_ETRUNCDATA, r->hdr_end + (uint64_t)got,
                   "the file ends in the entries");
  }
  r->all = all;
  return 0;
}

int ferry__pcache_reader_get(ferry_pcache_reader_t *r, uint64_t pos,
                             ferry_pcache_record_t *out, ferry_error_t *err) {
  if (pos >= r->n)
    return ferry__seterr(err, FERRY_EINVAL,
                         "%s: position %" PRIu64 " past the %" PRIu64
                         " entries",
                         r->path, pos, r->n);
  uint64_t off = r->offs[pos], room = r->footer_off - off, len;
  if (r->all != NULL) {
    const uint8_t *e = r->all + (off - r->hdr_end);
    if (!ferry__tfr_header_check(e, &len))
      return entry_damaged(r, err, FERRY_ELENCRC, pos, off,
                           "length CRC mismatch");
    if (len > room - FRAME || len < ENTRY_FIXED)
      return entry_damaged(r, err, FERRY_EDATACRC, pos, off,
                           len < ENTRY_FIXED ? "entry too short"
                                             : "entry runs into the footer");
    return entry_check(r, pos, off, e + HDR, e + HDR + ENTRY_FIXED,
                       (size_t)len - ENTRY_FIXED, e + HDR + len, out, err);
  }
  size_t want = room < r->guess ? (size_t)room : r->guess;
  int64_t got = ferry__pread_full(r->fd, r->buf, want, off);
  if (got < 0)
    return ferry__seterr(err, ferry__err_from_errno((int)-got),
                         "%s: position %" PRIu64 " at offset %" PRIu64
                         ": read: %s",
                         r->path, pos, off, strerror((int)-got));
  r->bytes += (uint64_t)got;
  if (got < HDR)
    return entry_damaged(r, err, FERRY_ETRUNCLEN, pos, off,
                         "the file ends in the entry's header");
  if (!ferry__tfr_header_check(r->buf, &len))
    return entry_damaged(r, err, FERRY_ELENCRC, pos, off,
                         "length CRC mismatch");
  if (len > room - FRAME || len < ENTRY_FIXED)
    return entry_damaged(r, err, FERRY_EDATACRC, pos, off,
                         len < ENTRY_FIXED ? "entry too short"
                                           : "entry runs into the footer");
  size_t total = (size_t)(len + FRAME); /* <= room: fits */
  if (total > (size_t)got) {
    if (total > r->cap) {
      uint8_t *b = ferry__realloc(r->buf, total);
      if (b == NULL)
        return ferry__seterr(err, FERRY_ENOMEM, "%s: out of memory", r->path);
      r->buf = b;
      r->cap = total;
    }
    size_t rest = total - (size_t)got;
    int64_t k =
        ferry__pread_full(r->fd, r->buf + got, rest, off + (uint64_t)got);
    if (k < 0)
      return ferry__seterr(err, ferry__err_from_errno((int)-k),
                           "%s: position %" PRIu64 " at offset %" PRIu64
                           ": read: %s",
                           r->path, pos, off, strerror((int)-k));
    r->bytes += (uint64_t)k;
    if ((size_t)k < rest)
      return entry_damaged(r, err, FERRY_ETRUNCDATA, pos, off,
                           "the file ends in the entry");
  }
  r->guess = total > RBUF_MIN / 16 ? total : RBUF_MIN / 16;
  const uint8_t *d = r->buf + HDR;
  return entry_check(r, pos, off, d, d + ENTRY_FIXED,
                     (size_t)len - ENTRY_FIXED, d + len, out, err);
}

int ferry__pcache_reader_get_into(ferry_pcache_reader_t *r, uint64_t pos,
                                  uint8_t *dst, size_t bytes,
                                  ferry_pcache_record_t *out,
                                  ferry_error_t *err) {
  if (pos >= r->n)
    return ferry__seterr(err, FERRY_EINVAL,
                         "%s: position %" PRIu64 " past the %" PRIu64
                         " entries",
                         r->path, pos, r->n);
  uint64_t off = r->offs[pos], room = r->footer_off - off, len;
  uint64_t total = (uint64_t)HDR + ENTRY_FIXED + bytes + 4;
  if (total > room)
    return entry_damaged(r, err, FERRY_EDATACRC, pos, off,
                         "entry runs into the footer, or is not of the "
                         "expected size");
  uint8_t head[HDR + ENTRY_FIXED], tail[4];
  struct iovec iov[3] = {{head, sizeof(head)}, {dst, bytes}, {tail, 4}};
  size_t done = 0;
  if (r->all != NULL) {
    const uint8_t *e = r->all + (off - r->hdr_end);
    memcpy(head, e, sizeof(head));
    memcpy(dst, e + sizeof(head), bytes);
    memcpy(tail, e + sizeof(head) + bytes, 4);
    done = total;
  }
  while (done < total) {
    /* Past what a short read delivered: move the vectors on. */
    struct iovec v[3];
    int nv = 0;
    size_t skip = done;
    for (int i = 0; i < 3; i++) {
      if (skip >= iov[i].iov_len) {
        skip -= iov[i].iov_len;
        continue;
      }
      v[nv].iov_base = (uint8_t *)iov[i].iov_base + skip;
      v[nv].iov_len = iov[i].iov_len - skip;
      skip = 0;
      nv++;
    }
    ssize_t k = preadv(r->fd, v, nv, (off_t)(off + done));
    if (k < 0 && errno == EINTR)
      continue;
    if (k < 0)
      return ferry__seterr(err, ferry__err_from_errno(errno),
                           "%s: position %" PRIu64 " at offset %" PRIu64
                           ": read: %s",
                           r->path, pos, off, strerror(errno));
    if (k == 0)
      return entry_damaged(r, err, FERRY_ETRUNCDATA, pos, off,
                           "the file ends in the entry");
    done += (size_t)k;
  }
  if (r->all == NULL)
    r->bytes += total;
  if (!ferry__tfr_header_check(head, &len))
    return entry_damaged(r, err, FERRY_ELENCRC, pos, off,
                         "length CRC mismatch");
  if (len != ENTRY_FIXED + bytes)
    return entry_damaged(r, err, FERRY_EDATACRC, pos, off,
                         "the entry is not of the expected size");
  return entry_check(r, pos, off, head + HDR, dst, bytes, tail, out, err);
}

uint64_t ferry__pcache_reader_bytes(const ferry_pcache_reader_t *r) {
  return r->bytes;
}

void ferry__pcache_reader_close(ferry_pcache_reader_t *r) {
  if (r != NULL)
    reader_free(r);
}

int ferry__pcache_remove(const char *dir, const ferry_pcache_key_t *key) {
  char *p = entry_path(dir, key, 0);
  int rc = 0;
  if (p == NULL)
    return FERRY_ENOMEM;
  if (unlink(p) != 0 && errno != ENOENT)
    rc = ferry__err_from_errno(errno);
  ferry__free(p);
  return rc;
}

static bool ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n >= k && memcmp(s + n - k, suffix, k) == 0;
}

int ferry__pcache_dir_scan(const char *dir, bool remove_temps, uint64_t *bytes,
                           uint64_t *entries, ferry_error_t *err) {
  uint64_t nb = 0, ne = 0;
  struct dirent *e;
  struct stat st;
  int rc = 0;
  DIR *d = opendir(dir);
  if (d == NULL)
    return sys_err(err, errno, "open directory", dir);
  for (;;) {
    errno = 0;
    if ((e = readdir(d)) == NULL) {
      if (errno != 0)
        rc = sys_err(err, errno, "read directory", dir);
      break;
    }
    bool entry = ends_with(e->d_name, FERRY_PCACHE_SUFFIX);
    bool temp = strstr(e->d_name, FERRY_PCACHE_SUFFIX ".tmp.") != NULL;
    if (!entry && !(temp && remove_temps))
      continue;
    if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno == ENOENT)
        continue; /* gone meanwhile */
      rc = sys_err(err, errno, "stat", e->d_name);
      break;
    }
    if (!S_ISREG(st.st_mode))
      continue;
    if (entry) {
      nb += (uint64_t)st.st_size;
      ne++;
    } else if (unlinkat(dirfd(d), e->d_name, 0) != 0 && errno != ENOENT) {
      rc = sys_err(err, errno, "remove", e->d_name);
      break;
    }
  }
  closedir(d);
  if (bytes != NULL)
    *bytes = nb;
  if (entries != NULL)
    *entries = ne;
  return rc;
}
