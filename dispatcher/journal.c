/* The dispatcher's journal (see journal.h). */
#include "journal.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ferry/alloc.h"
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

/* True when every byte of the file from `off` to its end is zero: what a
 * file system can leave after a crash that extended the file. */
static bool zero_tail(int fd, uint64_t off, uint64_t end) {
  uint8_t b[4096];
  while (off < end) {
    size_t want = end - off < sizeof(b) ? (size_t)(end - off) : sizeof(b);
    ssize_t got = pread(fd, b, want, (off_t)off);
    if (got <= 0)
      return false;
    for (ssize_t i = 0; i < got; i++)
      if (b[i] != 0)
        return false;
    off += (uint64_t)got;
  }
  return true;
}

static int cut_tail(ferry_journal_t *j, uint64_t at, ferry_error_t *err) {
  FERRY_LOG(FERRY_LOG_WARN,
            "%s: torn tail at byte offset %" PRIu64 " (%" PRIu64
            " bytes) cut off",
            j->path, at, j->size - at);
  if (ftruncate(j->fd, (off_t)at) != 0 || fdatasync(j->fd) != 0)
    return sys_err(err, "cannot truncate the torn tail", j->path);
  j->size = at;
  return 0;
}

/* Decides what a reader error at `at` means: a torn tail (cut it) or
 * corruption (fatal). */
static int bad_record(ferry_journal_t *j, int code, uint64_t at,
                      const ferry_error_t *rerr, ferry_error_t *err) {
  if (code == FERRY_ETRUNCLEN || code == FERRY_ETRUNCDATA ||
      ((code == FERRY_ELENCRC || code == FERRY_EDATACRC ||
        code == FERRY_ETOOLONG) &&
       zero_tail(j->fd, at, j->size)))
    return cut_tail(j, at, err);
  return ferry__seterr(err, code,
                       "%s: corrupt journal entry at byte offset %" PRIu64
                       ": %s",
                       j->path, at, rerr->msg);
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
}

void ferry__journal_sink(const uint8_t *entry, size_t len, void *arg) {
  ferry__journal_append(arg, entry, len);
}

int ferry__journal_sync(ferry_journal_t *j, ferry_error_t *err) {
  size_t done = 0;

  if (j->failed.code == 0 && j->len > 0) {
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
