/* The dispatcher's journal (see journal.h). */
#include "journal.h"
#include "dmetrics.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ferry/alloc.h"
#include "ferry/crc32c.h"
#include "ferry/log.h"
#include "ferry/tfrecord.h"

struct ferry_journal_s {
  int fd;
  char *path;
  uint8_t *buf; /* framed entries not yet written */
  size_t len, cap;
  uint64_t size; /* bytes in the file */
  uint64_t syncs;
  ferry_error_t failed; /* sticky error; code 0 while healthy */
};

static int sys_err(ferry_error_t *err, const char *what, const char *path) {
  int e = errno;
  return ferry__seterr(err, ferry_err_from_errno(e), "%s: %s: %s", path, what,
                       strerror(e));
}

/* Makes the journal's directory entry durable (after creating it). */
static void sync_dir(const char *dir) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    fsync(fd);
    close(fd);
  }
}

int ferry__journal_open(const char *dir, ferry_journal_t **out,
                        ferry_error_t *err) {
  ferry_journal_t *j;
  struct stat st;
  size_t n = strlen(dir) + sizeof("/journal");

  *out = NULL;
  if (mkdir(dir, 0755) != 0 && errno != EEXIST)
    return sys_err(err, "cannot create the work directory", dir);
  j = ferry__calloc(1, sizeof(*j));
  if (j == NULL || (j->path = ferry__malloc(n)) == NULL) {
    ferry__free(j);
    return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
  }
  snprintf(j->path, n, "%s/journal", dir);
  j->fd = open(j->path, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (j->fd < 0 || fstat(j->fd, &st) != 0) {
    int rc = sys_err(err, "cannot open", j->path);
    ferry__journal_close(j);
    return rc;
  }
  j->size = (uint64_t)st.st_size;
  if (j->size == 0)
    sync_dir(dir);
  *out = j;
  return 0;
}

static uint32_t le32(const uint8_t *b) {
  return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 |
         (uint32_t)b[3] << 24;
}

/* Whether a complete, valid record (length CRC and data CRC) starts at
 * `off`, `h` being the (up to 12) bytes there. -1: read error. */
static int valid_record_at(int fd, uint64_t off, uint64_t end,
                           const uint8_t *h, size_t hn) {
  uint8_t b[4096];
  uint64_t len = 0, at;
  uint32_t crc = 0;

  if (hn < 12 || ferry_crc32c_unmask(le32(h + 8)) != ferry_crc32c(0, h, 8))
    return 0;
  for (int i = 7; i >= 0; i--)
    len = len << 8 | h[i];
  if (end - off < 16 || len > end - off - 16)
    return 0;
  for (at = off + 12; at < off + 12 + len;) {
    size_t want = (size_t)(off + 12 + len - at < sizeof(b)
                               ? off + 12 + len - at
                               : sizeof(b));
    if (ferry__pread_full(fd, b, want, at) != (ssize_t)want)
      return -1;
    crc = ferry_crc32c(crc, b, want);
    at += want;
  }
  if (ferry__pread_full(fd, b, 4, at) != 4)
    return -1;
  return ferry_crc32c_unmask(le32(b)) == crc;
}

/* The first offset after `bad` (to `end`) where a complete valid record
 * starts; `end` when there is none, -1 with errno on a read error. The
 * header CRC rejects almost every offset from 12 bytes already held in
 * the window; only a header that verifies costs a read of its data. */
static int64_t next_valid_record(int fd, uint64_t bad, uint64_t end) {
  enum { WIN = 64 << 10 };
  uint8_t *w = ferry__malloc(WIN);
  uint64_t base = 0, off;
  size_t wlen = 0;
  int64_t found = (int64_t)end;

  if (w == NULL) {
    errno = ENOMEM;
    return -1;
  }
  for (off = bad + 1; off < end; off++) {
    int v;
    if (off < base || off + 12 > base + wlen) {
      ssize_t n = ferry__pread_full(fd, w, WIN, off);
      if (n < 0) {
        found = -1;
        break;
      }
      base = off;
      wlen = (size_t)n;
    }
    v = valid_record_at(fd, off, end, w + (off - base),
                        base + wlen - off < 12 ? base + wlen - off : 12);
    if (v != 0) {
      found = v < 0 ? -1 : (int64_t)off;
      break;
    }
  }
  ferry__free(w);
  return found;
}

static int cut_tail(ferry_journal_t *j, uint64_t at, ferry_error_t *err) {
  FERRY_LOG(FERRY_LOG_WARN,
            "journal: cut %" PRIu64 " torn bytes at offset %" PRIu64
            " of %s (no valid entry follows them: a crash tail)",
            j->size - at, at, j->path);
  if (ftruncate(j->fd, (off_t)at) != 0 || fdatasync(j->fd) != 0)
    return sys_err(err, "cannot truncate the torn tail", j->path);
  j->size = at;
  return 0;
}

/* Decides what a reader error at `at` means. A crash can leave the last
 * entry cut short, or followed (or overwritten from inside) by zeros or
 * garbage up to the end of the file: nothing valid comes after the
 * damage, and the damaged bytes are a torn tail (cut them). Damage that a
 * complete valid record follows cannot come from a crash while
 * appending: corruption (fatal, naming both offsets). */
static int bad_record(ferry_journal_t *j, int code, uint64_t at,
                      const ferry_error_t *rerr, ferry_error_t *err) {
  int64_t next = next_valid_record(j->fd, at, j->size);
  if (next < 0)
    return sys_err(err, "cannot read the journal's tail", j->path);
  if ((uint64_t)next >= j->size)
    return cut_tail(j, at, err);
  return ferry__seterr(err, code,
                       "%s: corrupt journal entry at byte offset %" PRIu64
                       ": %s (a valid entry follows at byte offset %" PRIu64
                       ", so this is not a torn tail; refusing to replay)",
                       j->path, at, rerr->msg, (uint64_t)next);
}

int ferry__journal_replay(ferry_journal_t *j, ferry_journal_entry_cb cb,
                          void *arg, uint64_t *n, ferry_error_t *err) {
  ferry_tfr_options_t opts;
  ferry_tfr_reader_t *r = NULL;
  ferry_record_t rec;
  ferry_error_t rerr = {0};
  uint64_t count = 0, good_end = 0;
  int rc;

  if (n != NULL)
    *n = 0;
  if (j->size == 0)
    return 0;
  ferry_tfr_options_init(&opts);
  opts.compression = FERRY_COMPRESSION_NONE;
  opts.on_error = FERRY_ON_ERROR_FAIL;
  if ((rc = ferry_tfr_reader_open(j->path, &opts, &r, err)) != 0)
    return rc;
  while ((rc = ferry_tfr_reader_next(r, &rec, &rerr)) == 0) {
    if ((rc = cb(rec.data, rec.len, arg, err)) != 0) {
      ferry__prefixerr(err, "%s: entry at byte offset %" PRIu64, j->path,
                       rec.offset);
      break;
    }
    good_end = rec.offset + 16 + rec.len;
    count++;
  }
  ferry_tfr_reader_free(r);
  if (rc == FERRY_EOF)
    rc = 0;
  else if (rerr.code != 0 && rc == rerr.code)
    rc = bad_record(j, rc, good_end, &rerr, err);
  if (n != NULL)
    *n = count;
  return rc;
}

void ferry__journal_append(ferry_journal_t *j, const uint8_t *entry,
                           size_t len) {
  size_t need = j->len + len + 16;
  if (j->failed.code != 0)
    return;
  if (need > j->cap) {
    size_t cap = j->cap ? j->cap : 4096;
    uint8_t *nb;
    while (cap < need)
      cap *= 2;
    if ((nb = ferry__realloc(j->buf, cap)) == NULL) {
      ferry__seterr(&j->failed, FERRY_ENOMEM, "%s: out of memory", j->path);
      return;
    }
    j->buf = nb;
    j->cap = cap;
  }
  ferry_tfr_frame_header(len, j->buf + j->len);
  memcpy(j->buf + j->len + 12, entry, len);
  ferry_tfr_frame_footer(entry, len, j->buf + j->len + 12 + len);
  j->len += len + 16;
  ferry_metric_add(ferry__dmetrics()->appends, 1);
}

void ferry__journal_sink(const uint8_t *entry, size_t len, void *arg) {
  ferry__journal_append(arg, entry, len);
}

int ferry__journal_sync(ferry_journal_t *j, ferry_error_t *err) {
  size_t done = 0;

  if (j->failed.code == 0 && j->len > 0) {
    int64_t t0 = ferry_metrics_now_ns();
    while (done < j->len) {
      ssize_t w = write(j->fd, j->buf + done, j->len - done);
      if (w < 0 && errno == EINTR)
        continue;
      if (w < 0) {
        sys_err(&j->failed, "write", j->path);
        break;
      }
      done += (size_t)w;
    }
    j->size += done;
    if (j->failed.code == 0 && fdatasync(j->fd) != 0)
      sys_err(&j->failed, "fdatasync", j->path);
    ferry_metric_observe(ferry__dmetrics()->fsync,
                         ferry_metrics_now_ns() - t0);
    j->len = 0;
    j->syncs++;
  }
  if (j->failed.code != 0) {
    if (err != NULL)
      *err = j->failed;
    return j->failed.code;
  }
  return 0;
}

uint64_t ferry__journal_size(const ferry_journal_t *j) { return j->size; }
uint64_t ferry__journal_syncs(const ferry_journal_t *j) { return j->syncs; }

void ferry__journal_close(ferry_journal_t *j) {
  ferry_error_t err = {0};
  if (j == NULL)
    return;
  if (j->fd >= 0 && ferry__journal_sync(j, &err) != 0)
    FERRY_LOG(FERRY_LOG_ERROR, "%s", err.msg);
  if (j->fd >= 0)
    close(j->fd);
  ferry__free(j->buf);
  ferry__free(j->path);
  ferry__free(j);
}
