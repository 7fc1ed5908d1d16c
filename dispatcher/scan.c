/* The dataset scan (scan.h): the steps of a registration that run off the
 * loop, with every file I/O of the dispatcher's state: pattern expansion,
 * data roots, stat, and cutting files into splits by their record headers
 * (or their trusted DALI index). Nothing here touches ferry_disp_t. */
#include "scan.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "alloc.h"
#include "check.h"
#include "ferry/log.h"
#include "shard_index.h"
#include "tfrecord.h"

int ferry__disp_push_split(splits_t *s, const split_t *sp) {
  if (!FERRY__GROW(s->v, s->cap, s->n + 1, 64))
    return FERRY_ENOMEM;
  s->v[s->n++] = *sp;
  return 0;
}

/* Whether the file is compressed: per the spec, or for AUTO by the
 * reader's rule (ferry__tfr_sniff). */
static bool is_compressed(ferry_compression_t c, const uint8_t *h, size_t n) {
  return c == FERRY_COMPRESSION_GZIP || c == FERRY_COMPRESSION_ZLIB ||
         (c == FERRY_COMPRESSION_AUTO &&
          ferry__tfr_sniff(h, n) != FERRY_COMPRESSION_NONE);
}

#define HDR FERRY_TFR_HEADER_LEN

/* Headers are read through a window of this many bytes: small records
 * then cost one read per window rather than one per record; a record
 * larger than the window costs one read of its header's window. */
#define SCAN_WINDOW (64u << 10)

typedef struct window_s {
  int fd;
  uint8_t *buf;
  uint64_t base; /* file offset of buf[0] */
  size_t len;    /* valid bytes */
} window_t;

/* Points *h at the 12 bytes at `off` (fewer at the end of the file: the
 * count is returned), reading a new window when they are not in the
 * current one. Returns -1 with errno on a read error. */
static ssize_t window_header(window_t *w, uint64_t off, const uint8_t **h) {
  if (off < w->base || off + HDR > w->base + w->len) {
    ssize_t n = ferry__pread_full(w->fd, w->buf, SCAN_WINDOW, off);
    if (n < 0)
      return -1;
    w->base = off;
    w->len = (size_t)n;
  }
  *h = w->buf + (off - w->base);
  return (ssize_t)(w->base + w->len - off < HDR ? w->base + w->len - off : HDR);
}

/* Cuts an uncompressed file into splits of `per` records by reading the
 * 12-byte headers only (no CRC of the data). A header that is short,
 * fails its CRC, is over the maximum or points past the end ends the
 * scan: the rest of the file becomes one split of unknown count. */
static int scan_plain(int fd, uint64_t size, uint32_t file, uint32_t per,
                      uint64_t max_len, splits_t *out, const char *path) {
  split_t cur = {.file = file};
  uint64_t off = 0, index = 0;
  window_t w = {fd, ferry__malloc(SCAN_WINDOW), 0, 0};
  int rc = 0;

  if (w.buf == NULL)
    return FERRY_ENOMEM;
  while (off < size) {
    uint64_t len;
    const uint8_t *h;
    ssize_t n = window_header(&w, off, &h);
    if (n < 0) {
      rc = ferry__err_from_errno(errno);
      goto out;
    }
    len = 0;
    if (n < HDR || !ferry__tfr_header_check(h, &len) || len > max_len ||
        size - off - HDR < 4 || len > size - off - 16) {
      FERRY_LOG(FERRY_LOG_WARN,
                "%s: bad record header at byte offset %" PRIu64
                ": the rest of the file is one split of unknown count",
                path, off);
      if (cur.count > 0 && ferry__disp_push_split(out, &cur) != 0) {
        rc = FERRY_ENOMEM;
        goto out;
      }
      cur = (split_t){.file = file, .offset = off, .first = index};
      rc = ferry__disp_push_split(out, &cur);
      goto out;
    }
    if (cur.count == 0) {
      cur.offset = off;
      cur.first = index;
    }
    off += 16 + len;
    cur.end = off;
    cur.count++;
    index++;
    if (cur.count == per) {
      if (ferry__disp_push_split(out, &cur) != 0) {
        rc = FERRY_ENOMEM;
        goto out;
      }
      cur.count = 0;
    }
  }
  if (cur.count > 0 && ferry__disp_push_split(out, &cur) != 0)
    rc = FERRY_ENOMEM;
out:
  ferry__free(w.buf);
  return rc;
}

/* Cuts an uncompressed file into splits of `per` records from its trusted
 * DALI index (shard_index.h) instead of scanning its headers. */
static int scan_index(const ferry_tfr_index_entry_t *v, size_t n, uint32_t file,
                      uint32_t per, splits_t *out) {
  split_t cur = {.file = file};
  for (size_t i = 0; i < n; i++) {
    if (cur.count == 0) {
      cur.offset = v[i].offset;
      cur.first = i;
    }
    cur.end = v[i].offset + v[i].size;
    if (++cur.count == per) {
      if (ferry__disp_push_split(out, &cur) != 0)
        return FERRY_ENOMEM;
      cur.count = 0;
    }
  }
  if (cur.count > 0 && ferry__disp_push_split(out, &cur) != 0)
    return FERRY_ENOMEM;
  return 0;
}

static void scanned_from_stat(scanned_t *f, const struct stat *st) {
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  f->at_ns = (int64_t)now.tv_sec * 1000000000 + now.tv_nsec;
  f->valid = true;
  f->dev = (uint64_t)st->st_dev;
  f->ino = (uint64_t)st->st_ino;
  f->size = (uint64_t)st->st_size;
  f->mtime_ns = (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec;
  f->ctime_ns = (int64_t)st->st_ctim.tv_sec * 1000000000 + st->st_ctim.tv_nsec;
}

bool ferry__disp_same_file(const scanned_t *then, const scanned_t *now) {
  return then->valid && now->valid && then->dev == now->dev &&
         then->ino == now->ino && then->size == now->size &&
         then->mtime_ns == now->mtime_ns && then->ctime_ns == now->ctime_ns &&
         then->mtime_ns < then->at_ns - SCAN_RACY_NS;
}

/* Scans one file into splits (from FILE.idx when it can be trusted, see
 * shard_index.h); *f gets its identity as scanned. */
static int scan_file(const ferry_roots_t *roots, const char *path,
                     uint32_t file, ferry_compression_t c, uint32_t per,
                     uint64_t max_len, splits_t *out, scanned_t *f,
                     ferry_error_t *err) {
  uint8_t h[HDR];
  struct stat st;
  ferry_tfr_index_entry_t *idx = NULL;
  size_t nidx = 0;
  ssize_t n;
  /* Opened through the roots (checked again, without a race against a
   * symlink swapped in since the expand step checked it), O_NONBLOCK: a
   * FIFO or device named by a spec must not block the thread in open() (a
   * pool thread in the daemon, see ferry__disp_reg_scan); only regular
   * files are scanned. */
  int fd, rc = ferry__roots_open_file(roots, path, &fd, err);

  if (rc != 0)
    return rc;
  if (fstat(fd, &st) != 0 ||
      (S_ISREG(st.st_mode) &&
       (n = ferry__pread_full(fd, h, sizeof(h), 0)) < 0)) {
    rc = ferry__seterr(err, ferry__err_from_errno(errno), "%s: %s", path,
                       strerror(errno));
  } else if (!S_ISREG(st.st_mode)) {
    rc = ferry__seterr(err, FERRY_EINVAL, "%s: not a regular file", path);
  } else {
    scanned_from_stat(f, &st);
    if (st.st_size == 0) {
      rc = 0; /* an empty file has no split */
    } else if (is_compressed(c, h, (size_t)n)) {
      split_t s = {.file = file};
      rc = ferry__disp_push_split(out, &s);
    } else if ((rc = ferry__shard_index_load(roots, path, fd, &st, max_len,
                                             &idx, &nidx)) != 0) {
      if (rc > 0)
        rc = scan_index(idx, nidx, file, per, out);
      ferry__free(idx);
    } else {
      rc = scan_plain(fd, (uint64_t)st.st_size, file, per, max_len, out, path);
      if (rc != 0 && rc != FERRY_ENOMEM)
        ferry__seterr(err, rc, "%s: %s", path, ferry_strerror(rc));
    }
  }
  if (rc == FERRY_ENOMEM)
    ferry__seterr(err, rc, "%s: out of memory", path);
  close(fd);
  return rc;
}

void ferry__disp_reg_free(ferry_disp_reg_t *r) {
  if (r == NULL)
    return;
  if (r->reused != NULL)
    for (size_t i = 0; i < r->nfiles; i++)
      ferry__free(r->reused[i].v);
  ferry__free(r->reused);
  ferry__free(r->reuse);
  ferry__free(r->scanned);
  ferry__free(r->sp.v);
  ferry__spec_free_files(r->files, r->nfiles);
  ferry__free(r->canon);
  ferry__spec_close(&r->spec);
  ferry__free(r);
}

void ferry__disp_reg_cancel(ferry_disp_reg_t *r) {
  atomic_store(&r->cancel, true);
}

static bool reg_cancelled(ferry_disp_reg_t *r) {
  if (!atomic_load(&r->cancel))
    return false;
  r->rc =
      ferry__seterr(&r->err, FERRY_ECANCELED, "the registration was cancelled");
  return true;
}

void ferry__disp_reg_expand(ferry_disp_reg_t *r) {
  ferry_error_t *err = &r->err;
  const ferry_spec_t *spec = &r->spec;
  int rc = 0;

  if (r->rc != 0 || reg_cancelled(r))
    return;
  /* Data roots: the patterns before they are expanded (a glob must not
   * probe outside the roots), then every file they name. */
  for (size_t i = 0; i < spec->n_patterns; i++)
    if ((rc = ferry__roots_check_pattern(r->roots, spec->patterns[i], err)) !=
        0)
      goto out;
  if ((rc = ferry__spec_expand_files(spec, &r->files, &r->nfiles, err)) != 0)
    goto out;
  if (r->nfiles > r->max_files) {
    rc = ferry__seterr(err, FERRY_EINVAL, "%s: over %u files",
                       spec->patterns[0], r->max_files);
    goto out;
  }
  for (size_t i = 0; i < r->nfiles; i++)
    if ((rc = ferry__roots_check(r->roots, r->files[i], err)) != 0)
      goto out;
  /* File names travel in `string` fields (Task.file, the status). */
  for (size_t i = 0; i < r->nfiles; i++)
    if (!ferry__disp_utf8_valid(r->files[i])) {
      rc = ferry__seterr(err, FERRY_EINVAL,
                         "%s: a file it names has a name that is not valid "
                         "UTF-8",
                         spec->patterns[0]);
      goto out;
    }
  {
    size_t n = r->nfiles ? r->nfiles : 1;
    r->scanned = ferry__calloc(n, sizeof(*r->scanned));
    r->reused = ferry__calloc(n, sizeof(*r->reused));
    r->reuse = ferry__calloc(n, 1);
    if (r->scanned == NULL || r->reused == NULL || r->reuse == NULL) {
      rc = ferry__seterr(err, FERRY_ENOMEM, "out of memory");
      goto out;
    }
  }
  /* Identities for the reuse of earlier scans (a file that cannot be
   * stat'ed is scanned, which says why it cannot be read). */
  for (size_t i = 0; i < r->nfiles; i++) {
    struct stat st;
    if (i % 256 == 0 && reg_cancelled(r))
      return;
    if (stat(r->files[i], &st) == 0)
      scanned_from_stat(&r->scanned[i], &st);
  }
out:
  if (rc != 0)
    r->rc = rc;
}

/* Test-only (scan.h): FERRY_DISP_SCAN_DELAY_MS, cancellable. */
static void scan_delay(ferry_disp_reg_t *r) {
  const char *e = getenv("FERRY_DISP_SCAN_DELAY_MS");
  long ms = e != NULL ? strtol(e, NULL, 10) : 0;
  if (ms > 60000)
    ms = 60000;
  for (; ms > 0 && !atomic_load(&r->cancel); ms -= 10) {
    struct timespec t = {0, 10 * 1000000L};
    nanosleep(&t, NULL);
  }
}

void ferry__disp_reg_scan(ferry_disp_reg_t *r) {
  ferry_error_t *err = &r->err;
  splits_t *sp = &r->sp;
  int rc = 0;

  if (r->rc != 0)
    return;
  scan_delay(r);
  for (size_t i = 0; i < r->nfiles && rc == 0; i++) {
    if (reg_cancelled(r))
      return;
    if (r->reuse[i] == 2) {
      rc = ferry__seterr(err, FERRY_ENOMEM, "%s: out of memory", r->files[i]);
    } else if (r->reuse[i] == 1) {
      for (size_t k = 0; k < r->reused[i].n && rc == 0; k++)
        if ((rc = ferry__disp_push_split(sp, &r->reused[i].v[k])) != 0)
          ferry__seterr(err, rc, "%s: out of memory", r->files[i]);
    } else {
      rc = scan_file(r->roots, r->files[i], (uint32_t)i, r->spec.compression,
                     r->per, r->max_record_len, sp, &r->scanned[i], err);
    }
  }
  if (rc == 0 && sp->n == 0)
    rc = ferry__seterr(err, FERRY_EINVAL, "%s: no records in %zu file%s",
                       r->spec.patterns[0], r->nfiles,
                       r->nfiles == 1 ? "" : "s");
  if (rc == 0 && sp->n > UINT32_MAX / 2)
    rc = ferry__seterr(err, FERRY_EINVAL, "too many splits (%zu)", sp->n);
  r->rc = rc;
}
