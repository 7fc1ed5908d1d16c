/* The dispatcher's journal (see journal.h). */
#include "journal.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "alloc.h"
#include "ferry/log.h"
#include "tfrecord.h"

struct ferry_journal_s {
  int fd;
  char *dir, *path;
  uint8_t *buf; /* framed entries appended, not yet in a batch */
  size_t len, cap;
  uint8_t *fbuf; /* the batch in flight (a compaction: the snapshot) */
  size_t flen, fcap;
  uint8_t *hdr; /* compaction: the new segment's framed header */
  size_t hlen;
  bool inflight, compacting;
  ferry_journal_pack_cb pack; /* compaction: packs the snapshot */
  void *pack_arg;
  int64_t batch_ns;  /* the last batch_write's duration */
  uint64_t size;     /* durable bytes in the file */
  uint64_t appended; /* logical positions (journal.h) */
  uint64_t durable;
  uint64_t batch_end; /* what the batch in flight covers */
  uint64_t syncs;
  uint64_t appends;   /* entries appended */
  uint64_t snap_size; /* the last snapshot's size (0: none) */
  bool oom;           /* an append ran out of memory (loop) */
  bool batch_oom;     /* ... before the batch in flight (its thread) */
};

static ferry_journal_io_t io_sys = {pwrite, fdatasync};
static ferry_journal_io_t io = {pwrite, fdatasync};
static int crash_step;
static int64_t sync_delay_ms;

void ferry__journal_set_io(const ferry_journal_io_t *o) {
  io = o != NULL ? *o : io_sys;
}

/* Test-only: fdatasync, then FERRY_JOURNAL_SYNC_DELAY_MS more. */
static int delayed_fsync(int fd) {
  struct timespec t = {(time_t)(sync_delay_ms / 1000),
                       (long)(sync_delay_ms % 1000) * 1000000L};
  int rc = fdatasync(fd);
  while (nanosleep(&t, &t) != 0 && errno == EINTR)
    ;
  return rc;
}

void ferry__journal_test_env(void) {
  const char *e = getenv("FERRY_JOURNAL_SYNC_DELAY_MS");
  long v = e != NULL ? strtol(e, NULL, 10) : 0;
  if (v <= 0 || v > 60000)
    return;
  sync_delay_ms = v;
  io.fsync = delayed_fsync;
  FERRY_LOG(FERRY_LOG_WARN, "FERRY_JOURNAL_SYNC_DELAY_MS=%ld: every journal "
            "sync takes %ld ms more (test-only)", v, v);
}

void ferry__journal_set_crash_step(int step) { crash_step = step; }

static int sys_err(ferry_error_t *err, const char *what, const char *path) {
  int e = errno;
  return ferry__seterr(err, ferry__err_from_errno(e), "%s: %s: %s", path, what,
                       strerror(e));
}

/* Makes a directory's entries durable (after creating or renaming). */
static int sync_dir(const char *dir) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC), rc;
  if (fd < 0)
    return -1;
  rc = io.fsync(fd);
  close(fd);
  return rc;
}

/* Writes all of `n` bytes at `off`. -1 with errno. */
static int write_all(int fd, const uint8_t *b, size_t n, uint64_t off) {
  while (n > 0) {
    ssize_t w = io.pwrite(fd, b, n, (off_t)off);
    if (w < 0 && errno == EINTR)
      continue;
    if (w < 0)
      return -1;
    if (w == 0) {
      errno = EIO;
      return -1;
    }
    b += w;
    n -= (size_t)w;
    off += (uint64_t)w;
  }
  return 0;
}

static char *path_join(const char *dir, const char *name) {
  size_t n = strlen(dir) + strlen(name) + 2;
  char *p = ferry__malloc(n);
  if (p != NULL)
    snprintf(p, n, "%s/%s", dir, name);
  return p;
}

/* The compaction's files in `dir` that only exist once a journal did: a
 * journal is created before the first compaction and never removed
 * (compaction truncates it in place), so either beside a missing journal
 * means the journal was lost, not a crash. NULL when there is none. */
static const char *snapshot_without_journal(const char *dir,
                                            ferry_error_t *err, int *rc) {
  static const char *const names[] = {"snapshot", "snapshot.tmp"};
  *rc = 0;
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
    char *p = path_join(dir, names[i]);
    struct stat st;
    int e;
    if (p == NULL) {
      *rc = ferry__seterr(err, FERRY_ENOMEM, "out of memory");
      return NULL;
    }
    e = lstat(p, &st) == 0 ? 0 : errno;
    if (e != 0 && e != ENOENT) {
      errno = e;
      *rc = sys_err(err, "cannot stat", p);
    }
    ferry__free(p);
    if (e == 0 || *rc != 0)
      return e == 0 ? names[i] : NULL;
  }
  return NULL;
}

int ferry__journal_open(const char *dir, bool recover, ferry_journal_t **out,
                        ferry_error_t *err) {
  ferry_journal_t *j;
  struct stat st;
  bool created = false;

  *out = NULL;
  if (mkdir(dir, 0755) != 0 && errno != EEXIST)
    return sys_err(err, "cannot create the work directory", dir);
  j = ferry__calloc(1, sizeof(*j));
  if (j == NULL || (j->path = path_join(dir, "journal")) == NULL ||
      (j->dir = ferry__strdup(dir)) == NULL) {
    if (j != NULL)
      ferry__free(j->path);
    ferry__free(j);
    return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
  }
  j->fd = open(j->path, O_RDWR | O_CLOEXEC);
  if (j->fd < 0 && errno == ENOENT) {
    /* Decided before anything is created: a refused start must leave the
     * directory as it was, or the next start would find an empty journal
     * and take it for the one that was lost. */
    int rc;
    const char *snap = snapshot_without_journal(dir, err, &rc);
    if (rc != 0) {
      ferry__journal_close(j);
      return rc;
    }
    if (snap != NULL && !recover) {
      rc = ferry__seterr(
          err, FERRY_EINVAL,
          "%s is missing but %s/%s exists: the journal holds every change "
          "since that snapshot, and no crash removes it (compaction "
          "truncates it in place), so it was lost or deleted; refusing to "
          "start. --journal-recover starts from the snapshot alone, "
          "dropping the changes the journal held",
          j->path, dir, snap);
      ferry__journal_close(j);
      return rc;
    }
    if (snap != NULL)
      FERRY_LOG(FERRY_LOG_WARN,
                "journal: --journal-recover: %s is missing beside %s/%s: "
                "starting from the snapshot alone; the changes made after "
                "it are lost",
                j->path, dir, snap);
    j->fd = open(j->path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    created = true;
  }
  if (j->fd < 0 || fstat(j->fd, &st) != 0) {
    int rc = sys_err(err, "cannot open", j->path);
    ferry__journal_close(j);
    return rc;
  }
  j->size = (uint64_t)st.st_size;
  /* The new name must be durable before any entry is: fdatasync makes the
   * file's data durable, not its directory entry. */
  if ((created || j->size == 0) && sync_dir(dir) != 0) {
    int rc = sys_err(err, "cannot sync the work directory", dir);
    ferry__journal_close(j);
    return rc;
  }
  *out = j;
  return 0;
}

static int cut_at(ferry_journal_t *j, uint64_t at, ferry_error_t *err) {
  if (ftruncate(j->fd, (off_t)at) != 0 || io.fsync(j->fd) != 0)
    return sys_err(err, "cannot truncate", j->path);
  j->size = at;
  return 0;
}

/* The valid records from `from` to `end` (a corrupt region's survivors):
 * walks complete records, searching again past each gap. */
static uint64_t count_valid(int fd, uint64_t from, uint64_t end) {
  uint64_t n = 0, off = from;
  while (off + 16 <= end) {
    uint64_t len = 0;
    int v = ferry__tfr_valid_record_at(fd, off, end, &len);
    if (v < 0)
      break;
    if (v == 1) {
      n++;
      off += 16 + len;
      continue;
    }
    int64_t next = ferry__tfr_next_valid_record(fd, off, end);
    if (next < 0 || (uint64_t)next >= end)
      break;
    off = (uint64_t)next;
  }
  return n;
}

/* Decides what a reader error at `at` means. A crash can leave the last
 * entry cut short, or followed (or overwritten from inside) by zeros or
 * garbage up to the end of the file: nothing valid comes after the
 * damage, and the damaged bytes are a torn tail (cut them). Damage that a
 * complete valid record follows cannot come from a crash while
 * appending: corruption (fatal, naming both offsets), unless `recover`. */
static int bad_record(ferry_journal_t *j, int code, uint64_t at,
                      uint64_t good, bool recover, const ferry_error_t *rerr,
                      ferry_error_t *err) {
  int64_t next = ferry__tfr_next_valid_record(j->fd, at, j->size);
  if (next < 0)
    return sys_err(err, "cannot read the journal's tail", j->path);
  if ((uint64_t)next >= j->size) {
    FERRY_LOG(FERRY_LOG_WARN,
              "journal: cut %" PRIu64 " torn bytes at offset %" PRIu64
              " of %s (no valid entry follows them: a crash tail)",
              j->size - at, at, j->path);
    return cut_at(j, at, err);
  }
  if (recover) {
    uint64_t lost = count_valid(j->fd, (uint64_t)next, j->size);
    FERRY_LOG(FERRY_LOG_ERROR,
              "journal: --journal-recover: %s: corrupt entry at byte offset "
              "%" PRIu64 " (%s); dropped %" PRIu64 " bytes from offset "
              "%" PRIu64 " to the end, holding %" PRIu64 " valid entries "
              "after the damage (from offset %" PRIu64 "); kept the %" PRIu64
              " entries before it",
              j->path, at, rerr->msg, j->size - at, at, lost,
              (uint64_t)next, good);
    return cut_at(j, at, err);
  }
  return ferry__seterr(err, code,
                       "%s: corrupt journal entry at byte offset %" PRIu64
                       ": %s (a valid entry follows at byte offset %" PRIu64
                       ", so this is not a torn tail; refusing to replay: "
                       "--journal-recover truncates the journal there, "
                       "dropping what follows)",
                       j->path, at, rerr->msg, (uint64_t)next);
}

/* Reads `path` record by record through `cb`. Stores the end of the last
 * good record in *good_end; a reader error is left in `rerr` (rc its
 * code). */
static int read_records(const char *path, ferry_journal_entry_cb cb,
                        void *arg, uint64_t *count, uint64_t *good_end,
                        ferry_error_t *rerr, ferry_error_t *err) {
  ferry_tfr_options_t opts;
  ferry_tfr_reader_t *r = NULL;
  ferry_record_t rec;
  int rc;

  ferry__tfr_options_init(&opts);
  opts.compression = FERRY_COMPRESSION_NONE;
  opts.on_error = FERRY_ON_ERROR_FAIL;
  if ((rc = ferry__tfr_reader_open(path, &opts, &r, err)) != 0)
    return rc;
  while ((rc = ferry__tfr_reader_next(r, &rec, rerr)) == 0) {
    if ((rc = cb(rec.data, rec.len, rec.offset, arg, err)) != 0) {
      if (err != NULL && err->code != 0)
        ferry__prefixerr(err, "%s: entry at byte offset %" PRIu64, path,
                         rec.offset);
      break;
    }
    *good_end = rec.offset + 16 + rec.len;
    (*count)++;
  }
  ferry__tfr_reader_free(r);
  return rc == FERRY_EOF ? 0 : rc;
}

int ferry__journal_replay(ferry_journal_t *j, ferry_journal_entry_cb cb,
                          void *arg, bool recover, uint64_t *n,
                          ferry_error_t *err) {
  ferry_error_t rerr = {0};
  uint64_t count = 0, good_end = 0;
  int rc;

  if (n != NULL)
    *n = 0;
  if (j->size == 0)
    return 0;
  rc = read_records(j->path, cb, arg, &count, &good_end, &rerr, err);
  if (rc != 0 && rerr.code != 0 && rc == rerr.code)
    rc = bad_record(j, rc, good_end, count, recover, &rerr, err);
  if (n != NULL)
    *n = count;
  return rc;
}

int ferry__journal_read_snapshot(const char *dir, ferry_journal_entry_cb cb,
                                 void *arg, bool *found, uint64_t *n,
                                 uint64_t *bytes, ferry_error_t *err) {
  char *path = path_join(dir, "snapshot"), *tmp = path_join(dir, "snapshot.tmp");
  ferry_error_t rerr = {0};
  uint64_t count = 0, good_end = 0;
  struct stat st;
  int rc = 0;

  *found = false;
  *n = *bytes = 0;
  if (path == NULL || tmp == NULL) {
    rc = ferry__seterr(err, FERRY_ENOMEM, "out of memory");
    goto out;
  }
  if (unlink(tmp) == 0)
    FERRY_LOG(FERRY_LOG_WARN, "%s: removed (a compaction stopped before "
              "renaming it into place; %s is the snapshot)", tmp, path);
  if (stat(path, &st) != 0) {
    if (errno != ENOENT)
      rc = sys_err(err, "cannot stat", path);
    goto out;
  }
  *found = true;
  *bytes = (uint64_t)st.st_size;
  rc = read_records(path, cb, arg, &count, &good_end, &rerr, err);
  if (rc != 0 && rerr.code != 0 && rc == rerr.code)
    rc = ferry__seterr(err, rc,
                       "%s: corrupt snapshot at byte offset %" PRIu64
                       ": %s (refusing to start: a snapshot is renamed "
                       "into place complete, so this is not a crash)",
                       path, good_end, rerr.msg);
out:
  *n = count;
  ferry__free(path);
  ferry__free(tmp);
  return rc;
}

int ferry__journal_frame(uint8_t **buf, size_t *len, size_t *cap,
                         const uint8_t *entry, size_t elen) {
  if (elen > SIZE_MAX - 16 - *len ||
      !ferry__grow(buf, cap, *len + elen + 16, 1, 4096))
    return FERRY_ENOMEM;
  ferry__tfr_frame_header(elen, *buf + *len);
  memcpy(*buf + *len + 12, entry, elen);
  ferry__tfr_frame_footer(entry, elen, *buf + *len + 12 + elen);
  *len += elen + 16;
  return 0;
}

int ferry__journal_reset(ferry_journal_t *j, const uint8_t *header,
                         size_t len, ferry_error_t *err) {
  uint8_t *b = NULL;
  size_t n = 0, cap = 0;
  int rc = 0;

  if (ferry__journal_frame(&b, &n, &cap, header, len) != 0)
    return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
  if (ftruncate(j->fd, 0) != 0)
    rc = sys_err(err, "cannot truncate", j->path);
  else if (write_all(j->fd, b, n, 0) != 0 || io.fsync(j->fd) != 0)
    rc = sys_err(err, "cannot write the segment header", j->path);
  ferry__free(b);
  if (rc != 0) {
    /* Whatever made it stays: a torn header is cut at the next start. */
    struct stat st;
    j->size = fstat(j->fd, &st) == 0 ? (uint64_t)st.st_size : 0;
    return rc;
  }
  j->size = n;
  return 0;
}

void ferry__journal_append(ferry_journal_t *j, const uint8_t *entry,
                           size_t len) {
  if (ferry__journal_frame(&j->buf, &j->len, &j->cap, entry, len) != 0) {
    j->oom = true;
    return;
  }
  j->appended += len + 16;
  j->appends++;
}

void ferry__journal_sink(const uint8_t *entry, size_t len, void *arg) {
  ferry__journal_append(arg, entry, len);
}

bool ferry__journal_batch_begin(ferry_journal_t *j) {
  uint8_t *t;
  size_t c;
  if (j->inflight || (j->len == 0 && !j->oom))
    return false;
  t = j->fbuf, c = j->fcap;
  j->fbuf = j->buf, j->fcap = j->cap, j->flen = j->len;
  j->buf = t, j->cap = c, j->len = 0;
  j->batch_end = j->appended;
  j->inflight = true;
  j->compacting = false;
  j->batch_oom = j->oom;
  j->oom = false;
  return true;
}

bool ferry__journal_compact_begin(ferry_journal_t *j,
                                  ferry_journal_pack_cb pack, void *arg,
                                  const uint8_t *header, size_t header_len) {
  size_t cap = 0;
  if (j->inflight)
    return false;
  j->hlen = 0;
  ferry__free(j->hdr);
  j->hdr = NULL;
  if (ferry__journal_frame(&j->hdr, &j->hlen, &cap, header, header_len) !=
      0)
    j->oom = true;
  /* The snapshot covers what was appended: those entries are not written. */
  j->len = 0;
  j->pack = pack;
  j->pack_arg = arg;
  j->batch_end = j->appended;
  j->inflight = true;
  j->compacting = true;
  j->batch_oom = j->oom;
  j->oom = false;
  return true;
}

/* Compaction: the steps of journal.h; `crash_step` stops before one. */
static int compact_write(ferry_journal_t *j, ferry_error_t *err) {
  char *snap = path_join(j->dir, "snapshot");
  char *tmp = path_join(j->dir, "snapshot.tmp");
  int fd = -1, rc = 0, step = 0;

#define STEP()                                                                 \
  do {                                                                         \
    if (++step == crash_step) {                                                \
      rc = ferry__seterr(err, FERRY_ECANCELED, "test: crash before step %d",  \
                         step);                                                \
      goto out;                                                                \
    }                                                                          \
  } while (0)

  if (snap == NULL || tmp == NULL) {
    rc = ferry__seterr(err, FERRY_ENOMEM, "out of memory");
    goto out;
  }
  ferry__free(j->fbuf);
  j->fbuf = NULL;
  j->flen = j->fcap = 0;
  if ((rc = j->pack(j->pack_arg, &j->fbuf, &j->flen, err)) != 0)
    goto out;
  j->fcap = j->flen;
  STEP(); /* 1: nothing written yet */
  fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    rc = sys_err(err, "cannot create", tmp);
    goto out;
  }
  if (write_all(fd, j->fbuf, j->flen / 2, 0) != 0) {
    rc = sys_err(err, "write", tmp);
    goto out;
  }
  STEP(); /* 2: half of snapshot.tmp written */
  if (write_all(fd, j->fbuf + j->flen / 2, j->flen - j->flen / 2,
                j->flen / 2) != 0) {
    rc = sys_err(err, "write", tmp);
    goto out;
  }
  STEP(); /* 3: written, not synced */
  if (io.fsync(fd) != 0) {
    rc = sys_err(err, "fsync", tmp);
    goto out;
  }
  STEP(); /* 4: synced, not renamed */
  if (rename(tmp, snap) != 0) {
    rc = sys_err(err, "cannot rename it to snapshot", tmp);
    goto out;
  }
  STEP(); /* 5: renamed, directory not synced */
  if (sync_dir(j->dir) != 0) {
    rc = sys_err(err, "fsync of the directory", j->dir);
    goto out;
  }
  STEP(); /* 6: the snapshot is durable; the journal is the old segment */
  if (ftruncate(j->fd, 0) != 0) {
    rc = sys_err(err, "cannot truncate", j->path);
    goto out;
  }
  STEP(); /* 7: the journal is empty */
  if (write_all(j->fd, j->hdr, j->hlen / 2, 0) != 0) {
    rc = sys_err(err, "write", j->path);
    goto out;
  }
  STEP(); /* 8: half of the new segment's header */
  if (write_all(j->fd, j->hdr + j->hlen / 2, j->hlen - j->hlen / 2,
                j->hlen / 2) != 0 ||
      io.fsync(j->fd) != 0)
    rc = sys_err(err, "cannot write the segment header", j->path);
out:
#undef STEP
  if (fd >= 0) {
    close(fd);
    if (rc != 0 && step < 4 && crash_step == 0)
      unlink(tmp);
  }
  ferry__free(snap);
  ferry__free(tmp);
  return rc;
}

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int ferry__journal_batch_write(ferry_journal_t *j, ferry_error_t *err) {
  int64_t t0 = now_ns();
  int rc = 0;

  if (j->batch_oom)
    rc = ferry__seterr(err, FERRY_ENOMEM, "%s: out of memory", j->path);
  else if (j->compacting)
    rc = compact_write(j, err);
  else if (write_all(j->fd, j->fbuf, j->flen, j->size) != 0)
    rc = sys_err(err, "write", j->path);
  else if (io.fsync(j->fd) != 0)
    rc = sys_err(err, "fdatasync", j->path);
  j->batch_ns = now_ns() - t0;
  return rc;
}

void ferry__journal_batch_end(ferry_journal_t *j, int rc) {
  if (!j->inflight)
    return;
  j->inflight = false;
  j->syncs++;
  if (rc == 0) {
    if (j->compacting) {
      j->size = j->hlen;
      j->snap_size = j->flen;
    } else {
      j->size += j->flen;
    }
    j->durable = j->batch_end;
  } else {
    struct stat st;
    /* A compaction that failed after its rename left the new snapshot:
     * the restore decides from what is on disk. A batch is cut back. */
    if (!j->compacting) {
      if (ftruncate(j->fd, (off_t)j->size) != 0)
        FERRY_LOG(FERRY_LOG_ERROR, "%s: cannot cut the failed batch at "
                  "offset %" PRIu64 ": %s", j->path, j->size,
                  strerror(errno));
    } else if (fstat(j->fd, &st) == 0) {
      j->size = (uint64_t)st.st_size;
    }
    /* Everything appended is dropped: the caller rebuilds its state. */
    j->len = 0;
    j->oom = false;
    j->durable = j->appended;
  }
  j->compacting = false;
  if (j->fcap > (4u << 20)) { /* a snapshot or a burst: give it back */
    ferry__free(j->fbuf);
    j->fbuf = NULL;
    j->fcap = 0;
  }
  j->flen = 0;
}

int ferry__journal_sync(ferry_journal_t *j, ferry_error_t *err) {
  int rc;
  if (!ferry__journal_batch_begin(j))
    return 0;
  rc = ferry__journal_batch_write(j, err);
  ferry__journal_batch_end(j, rc);
  return rc;
}

uint64_t ferry__journal_appended(const ferry_journal_t *j) {
  return j->appended;
}
uint64_t ferry__journal_durable(const ferry_journal_t *j) {
  return j->durable;
}
bool ferry__journal_busy(const ferry_journal_t *j) { return j->inflight; }
uint64_t ferry__journal_size(const ferry_journal_t *j) { return j->size; }
uint64_t ferry__journal_syncs(const ferry_journal_t *j) { return j->syncs; }
uint64_t ferry__journal_appends(const ferry_journal_t *j) {
  return j->appends;
}
int64_t ferry__journal_batch_ns(const ferry_journal_t *j) {
  return j->batch_ns;
}
uint64_t ferry__journal_snapshot_size(const ferry_journal_t *j) {
  return j->snap_size;
}
const char *ferry__journal_dir(const ferry_journal_t *j) { return j->dir; }

void ferry__journal_set_snapshot_size(ferry_journal_t *j, uint64_t n) {
  j->snap_size = n;
}

void ferry__journal_close(ferry_journal_t *j) {
  ferry_error_t err = {0};
  if (j == NULL)
    return;
  if (j->fd >= 0 && !j->inflight && ferry__journal_sync(j, &err) != 0)
    FERRY_LOG(FERRY_LOG_ERROR, "%s", err.msg);
  if (j->fd >= 0)
    close(j->fd);
  ferry__free(j->buf);
  ferry__free(j->fbuf);
  ferry__free(j->hdr);
  ferry__free(j->path);
  ferry__free(j->dir);
  ferry__free(j);
}
