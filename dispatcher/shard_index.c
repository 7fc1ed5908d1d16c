/* Trusting a DALI index file next to a shard (see shard_index.h). */
#include "shard_index.h"

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "alloc.h"
#include "crc32c.h"
#include "ferry/log.h"

static int64_t mtime_ns(const struct stat *st) {
  return (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec;
}

/* Whether the record header at `off` in the shard holds a valid length
 * CRC and the data length `len`. */
static bool header_says(int fd, uint64_t off, uint64_t len) {
  uint8_t h[12];
  uint64_t got = 0;
  ssize_t r;
  do
    r = pread(fd, h, sizeof(h), (off_t)off);
  while (r < 0 && errno == EINTR);
  if (r != (ssize_t)sizeof(h))
    return false;
  for (int i = 7; i >= 0; i--)
    got = got << 8 | h[i];
  uint32_t stored = (uint32_t)h[8] | (uint32_t)h[9] << 8 |
                    (uint32_t)h[10] << 16 | (uint32_t)h[11] << 24;
  return got == len && ferry__crc32c_unmask(stored) == ferry__crc32c(0, h, 8);
}

/* Why the entries do not describe the shard, or NULL when they do. */
static const char *check(const ferry_tfr_index_entry_t *v, size_t n, int fd,
                         uint64_t size, uint64_t max_len, char *why,
                         size_t cap) {
  uint64_t end = 0;
  for (size_t i = 0; i < n; i++) {
    if (v[i].offset != end) {
      snprintf(why, cap,
               "entry %zu starts at byte %" PRIu64
               " but the previous record ends at %" PRIu64,
               i + 1, v[i].offset, end);
      return why;
    }
    if (v[i].size - 16 > max_len || v[i].size > size - end) {
      snprintf(why, cap,
               "entry %zu (%" PRIu64 " bytes at %" PRIu64
               ") is too long for the shard",
               i + 1, v[i].size, v[i].offset);
      return why;
    }
    end += v[i].size;
  }
  if (end != size) {
    snprintf(why, cap,
             "its records end at byte %" PRIu64 " but the shard has %" PRIu64
             " bytes",
             end, size);
    return why;
  }
  if (!header_says(fd, v[0].offset, v[0].size - 16) ||
      !header_says(fd, v[n - 1].offset, v[n - 1].size - 16)) {
    snprintf(why, cap,
             "the shard's record headers at bytes %" PRIu64 " and %" PRIu64
             " do not match it",
             v[0].offset, v[n - 1].offset);
    return why;
  }
  return NULL;
}

int ferry__shard_index_load(const ferry_roots_t *roots, const char *path,
                            int fd, const struct stat *st, uint64_t max_len,
                            ferry_tfr_index_entry_t **out, size_t *n) {
  char idx[4200], why[200];
  const char *bad = NULL;
  ferry_tfr_index_entry_t *v = NULL;
  ferry_error_t err = {0};
  struct stat ist;
  size_t cnt = 0;
  int rc, ifd;

  *out = NULL;
  *n = 0;
  snprintf(idx, sizeof(idx), "%s.idx", path);
  if (access(idx, F_OK) != 0)
    return 0;
  /* Read through the roots like the shard: an index is data too. */
  if (ferry__roots_open_file(roots, idx, &ifd, &err) != 0) {
    FERRY_LOG(FERRY_LOG_WARN, "%s; scanning %s instead", err.msg, path);
    return 0;
  }
  if (fstat(ifd, &ist) != 0 || !S_ISREG(ist.st_mode)) {
    close(ifd);
    return 0;
  }
  if (mtime_ns(st) > mtime_ns(&ist)) {
    close(ifd);
    FERRY_LOG(FERRY_LOG_WARN,
              "%s: ignored (stale): %s was modified after its index was "
              "written; scanning its headers instead",
              idx, path);
    return 0;
  }
  if ((rc = ferry__tfr_index_read_fd(ifd, idx, &v, &cnt, &err)) != 0) {
    if (rc == FERRY_ENOMEM)
      return rc;
    FERRY_LOG(FERRY_LOG_WARN, "%s: ignored: %s; scanning %s instead", idx,
              err.msg, path);
    return 0;
  }
  if (cnt == 0)
    bad = "it lists no record but the shard is not empty";
  else
    bad = check(v, cnt, fd, (uint64_t)st->st_size, max_len, why, sizeof(why));
  if (bad != NULL) {
    FERRY_LOG(FERRY_LOG_WARN,
              "%s: ignored (stale or not an index of %s): %s; scanning its "
              "headers instead",
              idx, path, bad);
    ferry__free(v);
    return 0;
  }
  FERRY_LOG(FERRY_LOG_DEBUG, "%s: %zu records from its index %s", path, cnt,
            idx);
  *out = v;
  *n = cnt;
  return 1;
}
