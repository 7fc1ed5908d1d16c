/* The worker's prefix cache: the directory, the policy (cache.h). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "alloc.h"
#include "cache.h"
#include "crc32c.h"
#include "ferry/log.h"
#include "pcache.h"
#include "tfrecord.h"

/* Reading must cost less than 1 / this of recomputing to be chosen: the
 * margin pays for the disk the entries take and the measurement's noise. */
#define CACHE_MARGIN 1.25
/* Records timed before the policy chooses. */
#define MIN_SAMPLES 8
/* Bytes read back before reads replace the calibration. */
#define MIN_READ_BYTES (4u << 20)

const char *ferry__wc_choice_name(ferry__wc_choice_t c) {
  switch (c) {
  case FERRY__WC_NO_PREFIX:
    return "no_prefix";
  case FERRY__WC_MEASURING:
    return "measuring";
  case FERRY__WC_CACHE:
    return "cache";
  case FERRY__WC_RECOMPUTE:
    return "recompute";
  }
  return "unknown";
}

int64_t ferry__thread_cpu_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* CPU nanoseconds per byte to pread a file of the directory back and
 * check it, as an entry read does (the page cache's copy and the CRC);
 * 0.5 ns (2 GB/s) when it cannot be measured. */
static double calibrate(const char *dir) {
  enum { BLOCK = 1 << 20, BLOCKS = 8 };
  char path[4096];
  double per_byte = 0.5;
  snprintf(path, sizeof(path), "%s/.calibrate.fpc.tmp.%ld", dir,
           (long)getpid());
  uint8_t *buf = ferry__malloc(BLOCK);
  int fd = open(path, O_CREAT | O_RDWR | O_TRUNC | O_CLOEXEC, 0600);
  if (buf == NULL || fd < 0)
    goto out;
  memset(buf, 0xa5, BLOCK);
  for (int i = 0; i < BLOCKS; i++)
    if (write(fd, buf, BLOCK) != BLOCK)
      goto out;
  uint32_t crc = 0;
  int64_t t0 = ferry__thread_cpu_ns();
  for (int i = 0; i < BLOCKS; i++) {
    if (ferry__pread_full(fd, buf, BLOCK, (uint64_t)i * BLOCK) != BLOCK)
      goto out;
    crc ^= ferry__crc32c(0, buf, BLOCK);
  }
  int64_t t1 = ferry__thread_cpu_ns();
  if (t1 > t0 && crc != 1)
    per_byte = (double)(t1 - t0) / ((double)BLOCK * BLOCKS);
out:
  if (fd >= 0) {
    close(fd);
    unlink(path);
  }
  ferry__free(buf);
  return per_byte;
}

int ferry__wcache_open(ferry__wcache_t *c, const char *dir, uint64_t budget,
                       ferry_error_t *err) {
  memset(c, 0, sizeof(*c));
  if (mkdir(dir, 0755) != 0 && errno != EEXIST)
    return ferry__seterr(err, ferry__err_from_errno(errno),
                         "--cache-dir %s: %s", dir, strerror(errno));
  uint64_t bytes = 0, entries = 0;
  int rc = ferry__pcache_dir_scan(dir, true, &bytes, &entries, err);
  if (rc != 0) {
    ferry__prefixerr(err, "--cache-dir %s", dir);
    return rc;
  }
  if ((c->dir = ferry__strdup(dir)) == NULL)
    return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
  c->budget = budget;
  c->read_ns_per_byte = calibrate(dir);
  atomic_init(&c->held, bytes);
  atomic_init(&c->entries, entries);
  FERRY_LOG(FERRY_LOG_INFO,
            "prefix cache in %s: %llu entries, %llu of %llu bytes; reading "
            "costs %.3f ns of CPU per byte",
            dir, (unsigned long long)entries, (unsigned long long)bytes,
            (unsigned long long)budget, c->read_ns_per_byte);
  return 0;
}

void ferry__wcache_close(ferry__wcache_t *c) {
  ferry__free(c->dir);
  c->dir = NULL;
}

ferry__wpolicy_t *ferry__wpolicy_new(const ferry_spec_t *spec) {
  ferry__wpolicy_t *p = ferry__calloc(1, sizeof(*p));
  if (p == NULL)
    return NULL;
  pthread_mutex_init(&p->mu, NULL);
  p->det_ops = ferry__spec_det_prefix(spec, &p->why);
  p->n_ops = spec->n_ops;
  p->dataset_fp = ferry__spec_fingerprint(spec);
  if (p->det_ops >= 0) {
    p->prefix_fp = ferry__spec_prefix_fingerprint(spec, (size_t)p->det_ops);
    if ((size_t)p->det_ops < spec->n_ops) {
      ferry_spec_t ps;
      ferry_error_t err;
      int rc = ferry__spec_prefix(spec, (size_t)p->det_ops, &ps);
      if (rc == 0) {
        rc = ferry__pipeline_new(&ps, &p->prefix, &err);
        ferry__spec_close(&ps);
      }
      if (rc != 0) {
        /* No prefix pipeline: nothing to cache (said in the reason). */
        p->det_ops = -1;
        p->why = "the prefix does not compile alone";
      }
    }
  }
  p->choice = p->det_ops < 0 ? FERRY__WC_NO_PREFIX : FERRY__WC_MEASURING;
  snprintf(p->reason, sizeof(p->reason), "%s",
           p->det_ops < 0 ? p->why : "too few records timed yet");
  return p;
}

void ferry__wpolicy_free(ferry__wpolicy_t *p) {
  if (p == NULL)
    return;
  ferry__pipeline_free(p->prefix);
  pthread_mutex_destroy(&p->mu);
  ferry__free(p);
}

ferry__wc_choice_t ferry__wpolicy_decide_locked(const ferry__wcache_t *c,
                                                ferry__wpolicy_t *p) {
  double recompute = -1;
  if (p->n_recompute > 0)
    recompute = p->recompute_ns / (double)p->n_recompute;
  else if (p->n_prefix > 0)
    recompute = p->prefix_ns / (double)p->n_prefix +
                (p->n_suffix > 0 ? p->suffix_ns / (double)p->n_suffix : 0);
  if (p->det_ops < 0) {
    p->choice = FERRY__WC_NO_PREFIX;
    if (recompute >= 0)
      snprintf(p->reason, sizeof(p->reason),
               "%s: recompute (%.3f ms of CPU per record)", p->why,
               recompute / 1e6);
    else
      snprintf(p->reason, sizeof(p->reason), "%s: recompute", p->why);
    return p->choice;
  }
  uint64_t timed = p->n_recompute + p->n_prefix;
  if (timed < MIN_SAMPLES || p->n_entries == 0 || recompute < 0) {
    p->choice = FERRY__WC_MEASURING;
    snprintf(p->reason, sizeof(p->reason),
             "%llu of %d records timed", (unsigned long long)timed,
             MIN_SAMPLES);
    return p->choice;
  }
  double bytes = p->entry_bytes / (double)p->n_entries;
  double per_byte = p->read_bytes >= MIN_READ_BYTES
                        ? p->read_ns / p->read_bytes
                        : c->read_ns_per_byte;
  double rest = (size_t)p->det_ops < p->n_ops && p->n_suffix > 0
                    ? p->suffix_ns / (double)p->n_suffix
                    : 0;
  double hit = bytes * per_byte + rest;
  bool pays = hit * CACHE_MARGIN <= recompute;
  /* "<=" in the reason: not enough cheaper (the margin). */
  p->choice = pays ? FERRY__WC_CACHE : FERRY__WC_RECOMPUTE;
  int n = snprintf(
      p->reason, sizeof(p->reason),
      "recompute %.3f ms %s read %.1f KB at %.2f GB/s of CPU %.3f ms + "
      "the ops after the prefix %.3f ms (CPU per record; the prefix: the "
      "decode and %d of %zu ops)",
      recompute / 1e6, pays ? ">" : "<=", bytes / 1e3,
      per_byte > 0 ? 1.0 / per_byte : 0.0, bytes * per_byte / 1e6,
      rest / 1e6, p->det_ops, p->n_ops);
  if (pays && p->full && n > 0 && (size_t)n < sizeof(p->reason))
    snprintf(p->reason + n, sizeof(p->reason) - (size_t)n,
             "; --cache-bytes is full: the splits beyond it recompute");
  return p->choice;
}
