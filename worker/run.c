/* Running one task on a pipeline thread (the task table is tasks.c, the
 * chunk pool pool.c).
 *
 * A thread runs one task (one split) until it ends or parks. Without
 * shuffle it streams the split's records from the reader in file order;
 * with shuffle one pass of the reader builds a table of where each record
 * is (its data's offset in the shard; for GZIP/ZLIB shards, whose inflated
 * stream cannot be read at random, in an unlinked spill file the pass
 * writes), then the permutation is walked reading each record back with
 * pread (shard records are checked against their CRC again: the file may
 * have changed). Memory: the reader's window, one record, 40 bytes per
 * record of the split; never the split itself.
 *
 * Parking: when the task's stream is at its share of the pool (or the pool
 * is full), the acquire does not wait. The task keeps its run state (the
 * reader, the table and position, the record just processed) and goes on
 * the parked list; the thread takes the next pending task. A release of
 * one of the stream's chunks (of any chunk when the pool was full) puts it
 * back at the head of the pending queue.
 * Positions in split order count the records the pipeline produced: a
 * record the reader skipped (bad CRC) never gets one, and under policy
 * skip neither does a record the pipeline rejects, so a lease resumed
 * from `start` replays the same order and discards the first `start`
 * outputs (under policy fail no record can be rejected before `start`, so
 * those are skipped without being processed).
 *
 * Chunks hold K = max(1, chunk_bytes / record_bytes) records of one shape.
 * A full chunk is handed on only when the next record needs room, so the
 * split's final chunk is always the one marked `last`.
 *
 * Two other sources may stand in for the shard (run_any): a sharing job's
 * task sends views of what another job's task produced (run_shared,
 * share.h), and a split whose deterministic prefix is cached is read
 * from its entry (run_cached, cache.h). Either may hand over to the shard
 * path at a position (own_from: positions below it pass unprocessed).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "alloc.h"
#include "crc32c.h"
#include "ferry/log.h"
#include "pcache.h"
#include "tasks_internal.h"
#include "tfrecord.h"
#include "wmetrics.h"
#include "worker.h"

/* ---- Shuffle ------------------------------------------------------------- */

static inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void ferry__wshuffle(uint64_t *out, uint64_t n, bool shuffle, uint64_t seed,
                     uint32_t epoch, uint32_t split) {
  for (uint64_t i = 0; i < n; i++)
    out[i] = i;
  if (!shuffle || n < 2)
    return;
  uint64_t s = mix64(seed ^ mix64((uint64_t)epoch * 0x9E3779B97F4A7C15ull + 1) ^
                     mix64((uint64_t)split * 0xD1B54A32D192ED03ull + 2));
  for (uint64_t i = n - 1; i > 0; i--) {
    s += 0x9E3779B97F4A7C15ull;
    uint64_t j = mix64(s) % (i + 1);
    uint64_t tmp = out[i];
    out[i] = out[j];
    out[j] = tmp;
  }
}

/* ---- One thread's state -------------------------------------------------- */

/* What a ctx the thread moves away from keeps of its scratch buffers:
 * the decode limit bounds the ctx in use, this the others. */
#define CTX_KEEP_BYTES (8u << 20)

/* Notes that the thread uses `ctx` now, trimming the one it used before
 * (it may hold a big image's buffers, and parked tasks keep their ctx). */
static ferry_pipeline_ctx_t *use_ctx(ferry__wthread_t *th,
                                     ferry_pipeline_ctx_t *ctx) {
  if (th->last != NULL && th->last != ctx)
    ferry__pipeline_ctx_trim(th->last, CTX_KEEP_BYTES);
  th->last = ctx;
  return ctx;
}

ferry__wthread_t *ferry__wthread_new(ferry__wtasks_t *t) {
  ferry__wthread_t *th = ferry__calloc(1, sizeof(*th));
  if (th != NULL)
    th->t = t;
  return th;
}

void ferry__wthread_free(ferry__wthread_t *th) {
  if (th == NULL)
    return;
  for (int i = 0; i < CTX_SLOTS; i++)
    if (th->slots[i].pipe != NULL) {
      ferry__pipeline_ctx_free(th->slots[i].ctx);
      ferry__pipeline_ctx_free(th->slots[i].pctx);
      ferry__wpipe_unref(th->slots[i].pipe);
    }
  ferry__free(th);
}

/* The thread's ctx for `pipe`, created (evicting the least recently used
 * one) when missing. */
static ferry_pipeline_ctx_t *get_ctx(ferry__wthread_t *th,
                                     ferry__wpipe_t *pipe,
                                     ferry_error_t *err) {
  struct ctx_slot *victim = &th->slots[0];
  th->tick++;
  for (int i = 0; i < CTX_SLOTS; i++) {
    struct ctx_slot *s = &th->slots[i];
    if (s->pipe != NULL && s->pipe_id == pipe->id) {
      s->used = th->tick;
      return use_ctx(th, s->ctx);
    }
    if (s->pipe == NULL || (victim->pipe != NULL && s->used < victim->used))
      victim = s;
  }
  ferry_pipeline_ctx_t *ctx;
  if (ferry__pipeline_ctx_new(pipe->pipeline, &ctx, err) != 0)
    return NULL;
  /* A record's pixels go straight into a chunk (put_record copies them
   * out before the next read, also when it parks). */
  ferry__pipeline_ctx_set_borrow(ctx, 1);
  if (th->t->jpeg_set)
    ferry__pipeline_ctx_set_jpeg_limits(ctx, &th->t->jpeg);
  if (victim->pipe != NULL) {
    if (th->last == victim->ctx)
      th->last = NULL;
    ferry__pipeline_ctx_free(victim->ctx);
    ferry__pipeline_ctx_free(victim->pctx);
    victim->pctx = NULL;
    ferry__wpipe_unref(victim->pipe);
  }
  __atomic_add_fetch(&pipe->refs, 1, __ATOMIC_ACQ_REL);
  victim->pipe = pipe;
  victim->pipe_id = pipe->id;
  victim->ctx = ctx;
  victim->used = th->tick;
  return use_ctx(th, ctx);
}

/* The thread's ctx of `pipe`'s prefix pipeline (the slot get_ctx just
 * returned for it), created when missing; NULL when out of memory. */
static ferry_pipeline_ctx_t *get_pctx(ferry__wthread_t *th,
                                      ferry__wpipe_t *pipe) {
  for (int i = 0; i < CTX_SLOTS; i++) {
    struct ctx_slot *s = &th->slots[i];
    if (s->pipe == NULL || s->pipe_id != pipe->id)
      continue;
    if (s->pctx == NULL) {
      ferry_error_t err;
      if (ferry__pipeline_ctx_new(pipe->pol->prefix, &s->pctx, &err) != 0)
        return NULL;
      if (th->t->jpeg_set)
        ferry__pipeline_ctx_set_jpeg_limits(s->pctx, &th->t->jpeg);
    }
    return s->pctx;
  }
  return NULL;
}

/* ---- A task's run state -------------------------------------------------- */

/* Spill files are written through a buffer of this size. */
#define SPILL_WBUF (1u << 20)

/* A record of a shuffled split: where its data is read back. */
struct rec_ref {
  uint64_t at;  /* the data's offset in the shard, or in the spill file */
  uint64_t len;
  uint64_t offset, index; /* in the shard's stream (for messages, ids) */
};

/* What a started task needs to go on where it stopped: it outlives the
 * thread when the task parks. */
typedef struct ferry__wrun_s {
  ferry_tfr_reader_t *rd;
  uint64_t out, skipped;
  /* Shuffled splits: the record table built by one pass of the reader,
   * then walked in the permutation from `next`. */
  bool collected;
  struct rec_ref *recs;
  size_t nrecs, recs_cap;
  uint64_t *order;
  uint64_t next;
  int fd;       /* the shard (uncompressed) or the spill file; -1 */
  bool spill;
  uint8_t *rbuf; /* one record read back (+ its footer) */
  size_t rbuf_cap;
  uint8_t *wbuf; /* spill writes */
  size_t wlen;
  uint64_t spill_len;
  /* The prefix cache (worker/cache.h): an entry being read (a hit) or
   * written (a miss the policy wants kept); the key names the entry. */
  ferry_pcache_reader_t *pc_rd;
  ferry_pcache_writer_t *pc_wr;
  ferry_pcache_key_t pc_key;
  uint64_t *pc_order; /* a hit: positions in split order */
  uint64_t pc_next, pc_added;
  /* Positions below this were produced elsewhere (a prefix cache entry
   * found damaged, a shared-production entry): the shard path goes on
   * from here. */
  uint64_t resume_at;
  bool rd_used; /* the reader has read (a restart reopens it) */
  /* Shared production (share.h): the entry this task produces into
   * (share_producer) or sends from; share_ended once a producer said so. */
  ferry__wshare_entry_t *share_e;
  ferry__wtasks_t *share_t; /* whose window share_e is in */
  bool share_producer;
  /* The record processed when the task parked, waiting for a chunk. */
  bool pending;
  uint8_t *pix;
  size_t pix_cap;
  int h, w, c;
  int64_t label, id;
} wrun_t;

static void share_drop(wrun_t *ru, bool complete);

void ferry__wrun_free(wrun_t *ru) {
  if (ru == NULL)
    return;
  ferry__tfr_reader_free(ru->rd);
  ferry__pcache_reader_close(ru->pc_rd);
  ferry__pcache_writer_abort(ru->pc_wr);
  ferry__free(ru->pc_order);
  share_drop(ru, false); /* a task cancelled while parked */
  if (ru->fd >= 0)
    close(ru->fd);
  ferry__free(ru->recs);
  ferry__free(ru->order);
  ferry__free(ru->rbuf);
  ferry__free(ru->wbuf);
  ferry__free(ru->pix);
  ferry__free(ru);
}

/* ---- Running a task ------------------------------------------------------ */

typedef struct run_s {
  ferry__wthread_t *th;
  ferry__wtask_t *task;
  wrun_t *ru;
  ferry_pipeline_ctx_t *ctx;
  ferry__wchunk_t *cur; /* the chunk being filled */
  uint64_t out;         /* positions done (from 0) */
  uint64_t skipped;     /* pipeline rejects at positions >= start */
  bool stopped;         /* cancelled, or the worker stops */
  bool may_park;
  bool parked;          /* a chunk would have to wait: park the task */
  bool park_key_full;
  uint64_t park_gen;
  int err_code;
  ferry_error_t err;
  /* Metrics: records seen by this run (every 16th is timed per stage) and
   * when the record before a timed one ended (its read time); 0: none. */
  uint64_t seen;
  int64_t read_t0;
  /* The prefix cache: records served from entries and recomputed, entries
   * found damaged, records of this run seen by its timing sample. */
  uint64_t pc_hits, pc_misses, pc_corrupt, pc_seen, pc_read_bytes;
  bool window_warned; /* a JPEG's tiles could not be used (logged once) */
  /* Shared production: parked waiting for the entry's producer (at the
   * entry's gen). */
  bool share_wait;
  uint64_t share_gen;
} run_t;

static bool should_stop(run_t *r) {
  if (atomic_load(&r->task->cancelled) || atomic_load(&r->th->t->stop))
    r->stopped = true;
  return r->stopped;
}

/* Hands the current chunk on. */
static int flush(run_t *r, bool last) {
  ferry__wchunk_t *c = r->cur;
  ferry__wtasks_t *t = r->th->t;
  r->cur = NULL;
  c->last = last;
  int rc = ferry__wchunk_encode(c);
  if (rc != 0) {
    ferry__wpool_release(c);
    return ferry__seterr(&r->err, rc, "%s: chunk header too large",
                         r->task->file);
  }
  pthread_mutex_lock(&t->lock);
  r->task->produced = c->first + c->count;
  r->task->skipped = r->skipped;
  pthread_mutex_unlock(&t->lock);
  const ferry__wmetrics_t *m = ferry__wmetrics();
  ferry__metric_add(m->records, c->count);
  ferry__metric_add(m->bytes, (int64_t)(c->count * c->rec_bytes));
  wrun_t *ru = r->ru;
  if (ru != NULL && ru->share_producer && c->count > 0) {
    bool wake;
    ferry__wshare_append(t->share, ru->share_e, c->first, c->count, c->h,
                         c->w, c->c, c->labels, c->ids, c->payload, &wake);
    if (wake)
      ferry__wtasks_wake_share(t, ru->share_e);
  }
  t->emit(c, t->emit_arg);
  return 0;
}

/* A fresh chunk for `cap` records; NULL when stopped, out of memory
 * (r->err set) or, when the task may park, when the stream's share or the
 * pool is full (r->parked set). */
static ferry__wchunk_t *new_chunk(run_t *r, uint32_t cap, int h, int w,
                                  int ch) {
  ferry__wtasks_t *t = r->th->t;
  ferry__wtask_t *k = r->task;
  bool oom;
  size_t rb = (size_t)h * (size_t)w * (size_t)ch;
  ferry__wchunk_t *c = ferry__wpool_acquire_key(
      t->pool, k->key, cap, rb, !r->may_park, &k->cancelled, &t->stop,
      &r->park_gen, &r->park_key_full, &oom);
  if (c == NULL) {
    if (oom)
      ferry__seterr(&r->err, FERRY_ENOMEM, "out of memory for a chunk");
    else if (should_stop(r) || !r->may_park)
      r->stopped = true;
    else
      r->parked = true;
    return NULL;
  }
  atomic_fetch_add(&k->refs, 1);
  c->task = k;
  c->job_id = k->job_id;
  c->client_id = k->client_id;
  c->lease = k->lease;
  c->epoch = k->epoch;
  c->split = k->split;
  c->first = r->out;
  c->h = h;
  c->w = w;
  c->c = ch;
  return c;
}

/* The place of one record of h x w x c in the current chunk (a new one
 * when full or of another shape), not yet counted: commit_record counts
 * it. NULL when the task ends or parks here (r->parked). */
static uint8_t *reserve_record(run_t *r, int h, int w, int c) {
  size_t rb = (size_t)h * (size_t)w * (size_t)c;
  ferry__wchunk_t *cur = r->cur;
  if (cur != NULL && (cur->count == cur->cap || cur->h != h || cur->w != w ||
                      cur->c != c)) {
    if (flush(r, false) != 0)
      return NULL;
    cur = NULL;
  }
  if (cur == NULL) {
    uint64_t kk = rb > 0 ? r->th->t->chunk_bytes / rb : MAX_CHUNK_RECORDS;
    if (kk < 1)
      kk = 1;
    if (kk > MAX_CHUNK_RECORDS)
      kk = MAX_CHUNK_RECORDS;
    cur = r->cur = new_chunk(r, (uint32_t)kk, h, w, c);
    if (cur == NULL)
      return NULL;
  }
  return cur->payload + (size_t)cur->count * rb;
}

/* Counts the record reserve_record placed. */
static void commit_record(run_t *r, int64_t label, int64_t id) {
  ferry__wchunk_t *cur = r->cur;
  cur->labels[cur->count] = label;
  cur->ids[cur->count] = id;
  cur->count++;
  r->out++;
}

/* Puts one produced record into the current chunk. Returns false when the
 * task ends or parks here; on parking the record is kept in the run
 * state. */
static bool put_record(run_t *r, const uint8_t *pix, int h, int w, int c,
                       int64_t label, int64_t id) {
  size_t rb = (size_t)h * (size_t)w * (size_t)c;
  wrun_t *ru = r->ru;
  uint8_t *slot = reserve_record(r, h, w, c);
  if (slot == NULL) {
    if (r->parked && pix != ru->pix) {
      if (!FERRY__GROW(ru->pix, ru->pix_cap, rb > 0 ? rb : 1, 256)) {
        r->parked = false;
        ferry__seterr(&r->err, FERRY_ENOMEM, "out of memory");
        return false;
      }
      memcpy(ru->pix, pix, rb);
      ru->h = h;
      ru->w = w;
      ru->c = c;
      ru->label = label;
      ru->id = id;
      ru->pending = true;
    }
    return false;
  }
  memcpy(slot, pix, rb);
  commit_record(r, label, id);
  if (pix == ru->pix)
    ru->pending = false;
  return true;
}

static int process(run_t *r, const uint8_t *data, size_t len, uint64_t index,
                   uint64_t offset, const uint8_t **pix, int *h, int *w,
                   int *c, int64_t *label, ferry_error_t *perr);

/* Runs one record; returns false when the task ends or parks here. */
static bool do_record(run_t *r, const uint8_t *data, size_t len,
                      uint64_t offset, uint64_t index) {
  ferry__wtask_t *k = r->task;
  const uint8_t *pix;
  int h, w, c;
  int64_t label;
  if (should_stop(r))
    return false;
  if ((r->out < k->start && k->policy == FERRY_ON_ERROR_FAIL) ||
      r->out < r->ru->resume_at) {
    r->out++;
    return true;
  }
  if (r->th->t->test_record_delay_ms > 0) {
    /* --test-record-delay-ms: a slow producer that burns its CPU as a
     * heavy decode does, checking for a cancel every few ms. */
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int64_t spent = 0; spent < r->th->t->test_record_delay_ms;) {
      if ((spent & 7) == 0 && should_stop(r))
        return false;
      clock_gettime(CLOCK_MONOTONIC, &now);
      spent = (int64_t)(now.tv_sec - t0.tv_sec) * 1000 +
              (now.tv_nsec - t0.tv_nsec) / 1000000;
    }
  }
  ferry_error_t perr;
  /* One record in 16 is timed per stage (two clock reads per stage). */
  uint64_t n = r->seen++;
  bool timed = (n & ((1u << FERRY_WSTAGE_SAMPLE_SHIFT) - 1)) == 0;
  double t0[FERRY_STAGE_COUNT], t1[FERRY_STAGE_COUNT];
  if (timed) {
    const ferry__wmetrics_t *m = ferry__wmetrics();
    if (r->read_t0 != 0)
      ferry__metric_observe(m->stage[FERRY_WSTAGE_READ],
                            ferry__metrics_now_ns() - r->read_t0);
    ferry__pipeline_ctx_times(r->ctx, t0);
    ferry__pipeline_ctx_set_timing(r->ctx, 1);
  }
  /* The random ops' key: the same record of the same epoch draws the
   * same crop whichever worker or lease runs it. */
  ferry__pipeline_ctx_set_key(r->ctx, k->seed, k->epoch,
                              (uint64_t)k->file_index << 40 | index);
  int rc = process(r, data, len, index, offset, &pix, &h, &w, &c, &label,
                   &perr);
  if (timed) {
    const ferry__wmetrics_t *m = ferry__wmetrics();
    ferry__pipeline_ctx_set_timing(r->ctx, 0);
    ferry__pipeline_ctx_times(r->ctx, t1);
    for (int i = 0; i < FERRY_STAGE_COUNT; i++)
      if (t1[i] > t0[i]) /* stages the spec has */
        ferry__metric_observe(m->stage[i], (int64_t)((t1[i] - t0[i]) * 1e9));
    r->read_t0 = 0;
  } else if (((n + 1) & ((1u << FERRY_WSTAGE_SAMPLE_SHIFT) - 1)) == 0) {
    r->read_t0 = ferry__metrics_now_ns(); /* the next record's read */
  }
  if (rc == 0) {
    ferry__metric_add(ferry__wmetrics()->produced, 1);
    ferry_decode_path_t dp = ferry__pipeline_ctx_last_decode(r->ctx);
    if (dp != FERRY_DECODE_NONE)
      ferry__metric_add(ferry__wmetrics()->jpeg[dp], 1);
    if (dp == FERRY_DECODE_WINDOW_FALLBACK && !r->window_warned) {
      r->window_warned = true;
      FERRY_LOG(FERRY_LOG_WARN, "%s: record %llu at byte offset %llu: its "
                "JPEG's restart-interval tiles cannot be used (%s); decoded "
                "without them (once per split; ferry_worker_jpeg_decodes_"
                "total{path=\"window_fallback\"} counts them all)",
                k->file, (unsigned long long)index,
                (unsigned long long)offset,
                ferry__pipeline_ctx_window_why(r->ctx));
    }
  }
  if (rc != 0) {
    if (k->policy == FERRY_ON_ERROR_SKIP) {
      if (r->out >= k->start) {
        r->skipped++;
        ferry__wmetrics_skipped(perr.code, 1);
      }
      FERRY_LOG(FERRY_LOG_DEBUG, "%s: record %llu at byte offset %llu: %s "
                "(skipped)", k->file, (unsigned long long)index,
                (unsigned long long)offset, perr.msg);
      return true;
    }
    r->err = perr;
    ferry__prefixerr(&r->err, "%s: record %llu at byte offset %llu", k->file,
                     (unsigned long long)index, (unsigned long long)offset);
    return false;
  }
  if (r->out < k->start) {
    r->out++;
    return true;
  }
  return put_record(r, pix, h, w, c, label,
                    (int64_t)((uint64_t)k->file_index << 40 | index));
}

/* Streams the split in file order. Returns the reader's result (0 when
 * the task stopped, failed in the pipeline or parked). */
static int run_identity(run_t *r) {
  ferry__wtask_t *k = r->task;
  ferry_record_t rec;
  int rc;
  r->ru->rd_used = true;
  while ((rc = ferry__tfr_reader_next(r->ru->rd, &rec, &r->err)) == 0) {
    if (k->byte_end != 0 && rec.offset >= k->byte_end)
      return FERRY_EOF;
    if (k->end != 0 && r->out >= k->end)
      return FERRY_EOF; /* the part ends here (Task.end) */
    if (!do_record(r, rec.data, rec.len, rec.offset, rec.index))
      return 0;
  }
  return rc;
}

static int spill_flush(run_t *r) {
  wrun_t *ru = r->ru;
  size_t off = 0;
  while (off < ru->wlen) {
    ssize_t n = pwrite(ru->fd, ru->wbuf + off, ru->wlen - off,
                       (off_t)(ru->spill_len - ru->wlen + off));
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0) {
      int e = n < 0 ? errno : ENOSPC;
      return ferry__seterr(&r->err, ferry__err_from_errno(e),
                           "%s: spill file in %s: write: %s", r->task->file,
                           r->th->t->spill_dir != NULL ? r->th->t->spill_dir
                                                       : "$TMPDIR",
                           strerror(e));
    }
    off += (size_t)n;
  }
  ru->wlen = 0;
  return 0;
}

/* An unlinked spill file in the spill directory. */
static int spill_open(run_t *r) {
  const char *dir = r->th->t->spill_dir;
  if (dir == NULL)
    dir = getenv("TMPDIR");
  if (dir == NULL || dir[0] == '\0')
    dir = "/tmp";
  int fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    char path[4096];
    snprintf(path, sizeof(path), "%s/ferry-spill-XXXXXX", dir);
    fd = mkstemp(path);
    if (fd >= 0)
      unlink(path);
  }
  if (fd < 0)
    return ferry__seterr(&r->err, ferry__err_from_errno(errno),
                         "%s: cannot create a spill file in %s: %s",
                         r->task->file, dir, strerror(errno));
  r->ru->fd = fd;
  return 0;
}

/* The shuffled split's first pass: the reader checks every record once
 * and the table keeps where each one's data is. Compressed records are
 * copied into the spill file (the inflated stream is not seekable). */
static int collect(run_t *r) {
  ferry__wtask_t *k = r->task;
  wrun_t *ru = r->ru;
  ferry_record_t rec;
  int rc;
  ru->rd_used = true;
  ru->spill = ferry__tfr_reader_compression(ru->rd) != FERRY_COMPRESSION_NONE;
  if (ru->spill) {
    if ((rc = spill_open(r)) < 0)
      return rc;
    if ((ru->wbuf = ferry__malloc(SPILL_WBUF)) == NULL)
      return ferry__seterr(&r->err, FERRY_ENOMEM, "out of memory");
  } else if ((ru->fd = fcntl(ferry__tfr_reader_fd(ru->rd), F_DUPFD_CLOEXEC,
                             0)) < 0) {
    /* The reader's file, not the path again: the name may lead elsewhere
     * by now (--data-root). */
    return ferry__seterr(&r->err, ferry__err_from_errno(errno), "%s: dup: %s",
                         k->file, strerror(errno));
  }
  while ((rc = ferry__tfr_reader_next(ru->rd, &rec, &r->err)) == 0) {
    if (k->byte_end != 0 && rec.offset >= k->byte_end)
      break;
    if ((ru->nrecs & 1023) == 0 && should_stop(r))
      return 0;
    if (!FERRY__GROW(ru->recs, ru->recs_cap, ru->nrecs + 1, 256))
      return ferry__seterr(&r->err, FERRY_ENOMEM, "out of memory");
    struct rec_ref *ref = &ru->recs[ru->nrecs++];
    ref->len = rec.len;
    ref->offset = rec.offset;
    ref->index = rec.index;
    if (!ru->spill) {
      ref->at = rec.offset + 12;
      continue;
    }
    ref->at = ru->spill_len;
    size_t done = 0;
    while (done < rec.len) {
      size_t n = rec.len - done;
      if (n > SPILL_WBUF - ru->wlen)
        n = SPILL_WBUF - ru->wlen;
      memcpy(ru->wbuf + ru->wlen, rec.data + done, n);
      ru->wlen += n;
      ru->spill_len += n;
      done += n;
      if (ru->wlen == SPILL_WBUF && (rc = spill_flush(r)) < 0)
        return rc;
    }
  }
  if (rc != 0 && rc != FERRY_EOF)
    return rc;
  if (ru->spill) {
    if ((rc = spill_flush(r)) < 0)
      return rc;
    ferry__free(ru->wbuf);
    ru->wbuf = NULL;
  }
  ru->order = ferry__malloc((ru->nrecs > 0 ? ru->nrecs : 1) *
                            sizeof(*ru->order));
  if (ru->order == NULL)
    return ferry__seterr(&r->err, FERRY_ENOMEM, "out of memory");
  ferry__wshuffle(ru->order, ru->nrecs, k->shuffle, k->seed, k->epoch,
                  k->split);
  ru->collected = true;
  return 0;
}

/* Reads a collected record back into ru->rbuf. A shard record is checked
 * against its data CRC again: the file may have changed since the first
 * pass. Returns 0 or a negative code with r->err set. */
static int read_back(run_t *r, const struct rec_ref *ref) {
  ferry__wtask_t *k = r->task;
  wrun_t *ru = r->ru;
  size_t n = (size_t)ref->len + (ru->spill ? 0 : 4);
  if (!FERRY__GROW(ru->rbuf, ru->rbuf_cap, n > 0 ? n : 1, 256))
    return ferry__seterr(&r->err, FERRY_ENOMEM, "out of memory");
  int64_t got = ferry__pread_full(ru->fd, ru->rbuf, n, ref->at);
  const char *what = ru->spill ? "spill file of " : "";
  if (got < 0)
    return ferry__seterr(&r->err, ferry__err_from_errno((int)-got),
                         "%s%s: record %llu at byte offset %llu: read: %s",
                         what, k->file, (unsigned long long)ref->index,
                         (unsigned long long)ref->offset, strerror((int)-got));
  if ((size_t)got < n)
    return ferry__seterr(&r->err, FERRY_ETRUNCDATA,
                         "%s%s: record %llu at byte offset %llu: file ends "
                         "inside the record data (%lld of %zu bytes): it was "
                         "truncated while the worker read it",
                         what, k->file, (unsigned long long)ref->index,
                         (unsigned long long)ref->offset, (long long)got, n);
  if (!ru->spill) {
    const uint8_t *f = ru->rbuf + ref->len;
    uint32_t stored = (uint32_t)f[0] | (uint32_t)f[1] << 8 |
                      (uint32_t)f[2] << 16 | (uint32_t)f[3] << 24;
    uint32_t computed =
        ferry__crc32c_mask(ferry__crc32c(0, ru->rbuf, (size_t)ref->len));
    if (stored != computed)
      return ferry__seterr(&r->err, FERRY_EDATACRC,
                           "%s: record %llu at byte offset %llu: record data "
                           "CRC mismatch on reading it again: the file "
                           "changed while the worker read it",
                           k->file, (unsigned long long)ref->index,
                           (unsigned long long)ref->offset);
  }
  return 0;
}

/* Builds the table once, then walks the permutation from ru->next. */
static int run_shuffled(run_t *r) {
  ferry__wtask_t *k = r->task;
  wrun_t *ru = r->ru;
  int rc;
  if (!ru->collected) {
    if ((rc = collect(r)) < 0)
      return rc;
    if (!ru->collected)
      return 0; /* stopped */
  }
  while (ru->next < ru->nrecs) {
    if (k->end != 0 && r->out >= k->end)
      return FERRY_EOF; /* the part ends here (Task.end) */
    const struct rec_ref *ref = &ru->recs[ru->order[ru->next++]];
    if ((r->out < k->start && k->policy == FERRY_ON_ERROR_FAIL) ||
        r->out < ru->resume_at) {
      if ((ru->next & 1023) == 0 && should_stop(r))
        return 0;
      r->out++; /* as do_record would, without reading the record */
      continue;
    }
    if ((rc = read_back(r, ref)) < 0) {
      if (k->policy != FERRY_ON_ERROR_SKIP)
        return rc;
      if (r->out >= k->start) {
        r->skipped++;
        ferry__wmetrics_skipped(rc, 1);
      }
      FERRY_LOG(FERRY_LOG_DEBUG, "%s (skipped)", r->err.msg);
      ferry_error_clear(&r->err);
      continue;
    }
    if (!do_record(r, ru->rbuf, (size_t)ref->len, ref->offset, ref->index))
      return 0;
  }
  return FERRY_EOF;
}

/* The task's reader over `fd` (the shard, opened once by run_begin). */
static int open_reader(run_t *r, int fd) {
  ferry__wtask_t *k = r->task;
  ferry_tfr_options_t o;
  ferry__tfr_options_init(&o);
  o.compression = k->pipe->spec.compression;
  o.on_error = (ferry_error_policy_t)k->policy;
  o.start_offset = k->byte_offset;
  o.start_index = k->first_record;
  o.max_records = k->num_records;
  return ferry__tfr_reader_open_fd(fd, k->file, &o, &r->ru->rd, &r->err);
}

/* A source standing in for the shard (run_shared, run_cached) hands the
 * task over to the shard path, from r->out (own_from has set it up). */
enum { RUN_OWN = 1 };

/* The task produces its records itself from position `pos` on (what
 * came before was sent from elsewhere): the shard path restarts at
 * position 0 and passes over the positions below `pos` (resume_at). A
 * reader that has read starts again over the same descriptor. */
static int own_from(run_t *r, uint64_t pos) {
  wrun_t *ru = r->ru;
  ru->resume_at = pos;
  r->out = 0;
  if (r->task->shuffle) {
    ru->next = 0; /* the table, when built, serves again */
    return 0;
  }
  if (!ru->rd_used)
    return 0;
  int fd = fcntl(ferry__tfr_reader_fd(ru->rd), F_DUPFD_CLOEXEC, 0);
  if (fd < 0)
    return ferry__seterr(&r->err, ferry__err_from_errno(errno),
                         "%s: dup: %s", r->task->file, strerror(errno));
  ferry__tfr_reader_free(ru->rd);
  ru->rd = NULL;
  ru->rd_used = false;
  return open_reader(r, fd);
}

/* ---- Shared production (share.h) ---------------------------------------- */

/* Joins the window's entry of the task's split: a task from the split's
 * start that finds none produces it (into a new entry); one that finds
 * one sends from it. Ranked parts, policy skip (whose positions are
 * counted per job) and tasks of jobs that do not share have none. */
static void share_begin(run_t *r) {
  ferry__wtask_t *k = r->task;
  ferry__wtasks_t *t = r->th->t;
  if (t->share == NULL || !k->share || k->end != 0 ||
      k->policy != FERRY_ON_ERROR_FAIL)
    return;
  ferry__wshare_key_t key = {.pipe_id = k->pipe->id,
                             .seed = k->seed,
                             .shuffle = k->shuffle,
                             .policy = k->policy,
                             .epoch = ferry__wshare_epoch(k),
                             .split = k->split,
                             .file_index = k->file_index,
                             .byte_offset = k->byte_offset,
                             .byte_end = k->byte_end,
                             .first_record = k->first_record,
                             .num_records = k->num_records};
  bool producer;
  r->ru->share_t = t;
  r->ru->share_e = ferry__wshare_get(t->share, &key, k->start == 0, &producer);
  r->ru->share_producer = producer;
}

/* A producer stops producing (`complete`: at the split's end); the tasks
 * waiting on its entry wake to take over or finish. */
static void share_end(wrun_t *ru, bool complete) {
  if (ru == NULL || ru->share_e == NULL || !ru->share_producer)
    return;
  ferry__wtasks_t *t = ru->share_t;
  bool wake;
  ferry__wshare_end(t->share, ru->share_e, complete, &wake);
  ru->share_producer = false;
  if (wake)
    ferry__wtasks_wake_share(t, ru->share_e);
}

/* The task's end: its production ends, its reference goes. */
static void share_drop(wrun_t *ru, bool complete) {
  if (ru == NULL || ru->share_e == NULL)
    return;
  share_end(ru, complete);
  ferry__wshare_put(ru->share_t->share, ru->share_e);
  ru->share_e = NULL;
}

/* Sends the task's records from its entry, from r->out. Returns FERRY_EOF
 * at the split's end, 0 when stopped or parked (r->share_wait: waiting
 * for the producer, at r->share_gen), RUN_OWN when the task produces the
 * rest itself (taking over the entry's production, or alone past what
 * the window kept), or an error. */
static int run_shared(run_t *r) {
  ferry__wtask_t *k = r->task;
  wrun_t *ru = r->ru;
  ferry__wshare_t *sh = r->th->t->share;
  if (r->out < k->start)
    r->out = k->start; /* the positions before were the client's */
  for (;;) {
    if (should_stop(r))
      return 0;
    const ferry__wshare_chunk_t *ch = NULL;
    uint64_t gen;
    switch (ferry__wshare_at(sh, ru->share_e, r->out, &ch, &gen)) {
    case FERRY__WSHARE_CHUNK: {
      /* The chunk goes as a view of the window's payload: no copy. */
      size_t rb = (size_t)ch->h * (size_t)ch->w * (size_t)ch->c;
      uint32_t i0 = (uint32_t)(r->out - ch->first), n = ch->count - i0;
      if (r->cur != NULL && r->cur->count > 0) {
        if (flush(r, false) != 0)
          return r->err.code;
      } else if (r->cur != NULL) {
        ferry__wpool_release(r->cur);
        r->cur = NULL;
      }
      /* A block for the header, labels and ids only. */
      ferry__wchunk_t *v = new_chunk(r, n, 0, 0, 0);
      if (v == NULL)
        return r->err.code != 0 ? r->err.code : 0; /* parked, stopped */
      v->h = ch->h;
      v->w = ch->w;
      v->c = ch->c;
      v->rec_bytes = rb;
      v->payload = ch->payload + (size_t)i0 * rb;
      memcpy(v->labels, ch->labels + i0, 8 * (size_t)n);
      memcpy(v->ids, ch->ids + i0, 8 * (size_t)n);
      v->count = n;
      ferry__wshare_chunk_ref(ch);
      v->view_release = ferry__wshare_chunk_unref;
      v->view_arg = (void *)ch;
      r->cur = v; /* flushed by what comes next: the split's end marks it */
      r->out += n;
      atomic_fetch_add_explicit(&sh->served, n, memory_order_relaxed);
      break;
    }
    case FERRY__WSHARE_END:
      return FERRY_EOF;
    case FERRY__WSHARE_WAIT:
      /* A parked task keeps no chunk: what it has goes now. */
      if (r->cur != NULL && r->cur->count > 0) {
        if (flush(r, false) != 0)
          return r->err.code;
      } else if (r->cur != NULL) {
        ferry__wpool_release(r->cur);
        r->cur = NULL;
      }
      r->parked = true;
      r->share_wait = true;
      r->share_gen = gen;
      return 0;
    case FERRY__WSHARE_TAKE:
      ru->share_producer = true;
      return own_from(r, r->out) == 0 ? RUN_OWN : r->err.code;
    case FERRY__WSHARE_OWN:
      atomic_fetch_add(&sh->own, 1);
      ferry__wshare_put(sh, ru->share_e);
      ru->share_e = NULL;
      return own_from(r, r->out) == 0 ? RUN_OWN : r->err.code;
    }
  }
}

/* ---- The prefix cache ---------------------------------------------------- */

/* An entry of at most this many bytes is read whole when opened: small
 * images then cost no system call each. */
#define PC_LOAD_BYTES (16u << 20)

/* One record in 16 of a run is timed for the policy (thread CPU time). */
static bool pc_sample(run_t *r) { return (r->pc_seen++ & 15) == 0; }

/* One read in 64 is timed: reads cost the same every time, and two clock
 * reads (system calls) are a fair part of reading a 3 KB entry. */
static bool pc_sample_read(run_t *r) { return (r->pc_seen++ & 63) == 0; }

static void writer_drop(run_t *r) {
  ferry__pcache_writer_abort(r->ru->pc_wr);
  r->ru->pc_wr = NULL;
}

/* An entry is not written: --cache-bytes is reached (the policy's reason
 * says so). */
static void cache_full(ferry__wcache_t *c, ferry__wpolicy_t *pol) {
  atomic_fetch_add(&c->full, 1);
  pthread_mutex_lock(&pol->mu);
  pol->full = true;
  pthread_mutex_unlock(&pol->mu);
}

/* One record served from an entry of `bytes` pixel bytes. */
static void cache_hit(run_t *r, uint64_t bytes) {
  r->pc_hits++;
  r->pc_read_bytes += bytes;
  ferry__metric_add(ferry__wmetrics()->produced, 1);
}

/* Runs the pipeline on one record. While the run writes an entry, the
 * prefix runs first (alone, or as the whole pipeline), its output goes
 * into the entry, then the ops after it run on that output: the same
 * pixels as one pass (ferry__spec_det_prefix keeps fusions whole). */
static int process(run_t *r, const uint8_t *data, size_t len, uint64_t index,
                   uint64_t offset, const uint8_t **pix, int *h, int *w,
                   int *c, int64_t *label, ferry_error_t *perr) {
  ferry__wtask_t *k = r->task;
  ferry__wpolicy_t *pol = k->pipe->pol;
  ferry__wcache_t *cache = r->th->t->cache;
  wrun_t *ru = r->ru;
  bool sample = pol != NULL && pc_sample(r);
  ferry_pipeline_ctx_t *pctx = NULL;
  if (ru->pc_wr != NULL && pol->prefix != NULL &&
      (pctx = get_pctx(r->th, k->pipe)) == NULL)
    writer_drop(r); /* out of memory: recompute without writing */
  if (pol != NULL && pol->det_ops >= 0)
    r->pc_misses++;
  int64_t t0 = sample ? ferry__thread_cpu_ns() : 0;
  if (ru->pc_wr == NULL) {
    int rc = ferry__pipeline_process(r->ctx, data, len, pix, h, w, c, label,
                                     perr);
    if (sample && rc == 0) {
      int64_t t1 = ferry__thread_cpu_ns();
      pthread_mutex_lock(&pol->mu);
      pol->recompute_ns += (double)(t1 - t0);
      pol->n_recompute++;
      pthread_mutex_unlock(&pol->mu);
    }
    return rc;
  }
  const uint8_t *pp;
  int ph, pw, pc, rc;
  /* The prefix alone, or (no ops after it) the whole pipeline. */
  ferry_pipeline_ctx_t *first = pctx != NULL ? pctx : r->ctx;
  if (pctx != NULL)
    ferry__pipeline_ctx_set_key(pctx, k->seed, k->epoch,
                                (uint64_t)k->file_index << 40 | index);
  rc = ferry__pipeline_process(first, data, len, &pp, &ph, &pw, &pc, label,
                               perr);
  if (rc != 0) {
    writer_drop(r); /* a record the pipeline rejects: no entry */
    return rc;
  }
  int64_t t1 = sample ? ferry__thread_cpu_ns() : 0;
  size_t bytes = (size_t)ph * (size_t)pw * (size_t)pc;
  uint64_t held = atomic_load(&cache->held);
  if (held + ferry__pcache_writer_bytes(ru->pc_wr) + bytes + 64 >
      cache->budget) {
    writer_drop(r);
    cache_full(cache, pol);
  } else {
    ferry_error_t werr;
    if (ferry__pcache_writer_add(ru->pc_wr, index - k->first_record, index,
                                 offset, *label, ph, pw, pc, pp,
                                 &werr) != 0) {
      FERRY_LOG(FERRY_LOG_WARN, "prefix cache: %s (the split is not cached)",
                werr.msg);
      writer_drop(r);
    } else {
      ru->pc_added++;
    }
  }
  if (pctx != NULL) {
    rc = ferry__pipeline_process_from(r->ctx, (size_t)pol->det_ops, pp, ph,
                                      pw, pc, pix, h, w, perr);
    if (rc != 0)
      return rc;
  } else {
    *pix = pp;
    *h = ph;
    *w = pw;
  }
  *c = pc;
  if (sample) {
    int64_t t2 = ferry__thread_cpu_ns();
    pthread_mutex_lock(&pol->mu);
    pol->prefix_ns += (double)(t1 - t0);
    pol->n_prefix++;
    if (pctx != NULL) {
      pol->suffix_ns += (double)(t2 - t1);
      pol->n_suffix++;
    }
    pol->entry_bytes += (double)bytes + 64;
    pol->n_entries++;
    pthread_mutex_unlock(&pol->mu);
  }
  return 0;
}

/* Looks the task's split up in the cache, as the policy says: a hit
 * opens the entry (run_cached serves it); a miss of a whole split that
 * fits opens a writer. `sb` is the shard's identity. */
static void cache_begin(run_t *r, const struct stat *sb) {
  ferry__wtask_t *k = r->task;
  ferry__wcache_t *c = r->th->t->cache;
  ferry__wpolicy_t *pol = k->pipe->pol;
  wrun_t *ru = r->ru;
  if (c == NULL || pol == NULL)
    return;
  if (pol->det_ops < 0) { /* nothing to cache: the reason gets the costs */
    pthread_mutex_lock(&pol->mu);
    ferry__wpolicy_decide_locked(c, pol);
    pthread_mutex_unlock(&pol->mu);
    return;
  }
  ferry_pcache_key_t *key = &ru->pc_key;
  key->prefix_fp = pol->prefix_fp;
  key->path = k->file;
  key->file_size = (uint64_t)sb->st_size;
  key->mtime_ns = (int64_t)sb->st_mtim.tv_sec * 1000000000 +
                  sb->st_mtim.tv_nsec;
  key->byte_offset = k->byte_offset;
  key->byte_end = k->byte_end;
  key->first_record = k->first_record;
  key->max_records = k->num_records;
  pthread_mutex_lock(&pol->mu);
  ferry__wc_choice_t choice = ferry__wpolicy_decide_locked(c, pol);
  pthread_mutex_unlock(&pol->mu);
  if (choice == FERRY__WC_RECOMPUTE)
    return;
  ferry_error_t err;
  int rc = ferry__pcache_reader_open(c->dir, key, &ru->pc_rd, &err);
  if (rc == 0 &&
      (rc = ferry__pcache_reader_load(ru->pc_rd, PC_LOAD_BYTES, &err)) != 0) {
    ferry__pcache_reader_close(ru->pc_rd);
    ru->pc_rd = NULL;
  }
  if (rc == 0)
    return;
  if (rc != FERRY_ENOENT) {
    FERRY_LOG(FERRY_LOG_WARN, "prefix cache: %s; recomputing the split",
              err.msg);
    if (!ferry__pcache_damaged(rc))
      return; /* an I/O error: neither trusted nor replaced */
    r->pc_corrupt++;
    ferry__pcache_remove(c->dir, key);
  }
  /* Only a whole split is written: a part or a lease resumed past its
   * start does not produce every record. */
  if (k->start != 0 || k->end != 0)
    return;
  if (atomic_load(&c->held) >= c->budget) {
    cache_full(c, pol);
    return;
  }
  if (ferry__pcache_writer_open(c->dir, key, &ru->pc_wr, &err) != 0)
    FERRY_LOG(FERRY_LOG_WARN, "prefix cache: %s (the split is not cached)",
              err.msg);
}

/* The split goes on recomputed from the position reached: after an entry
 * read back damaged (removed and counted), or after an op past the
 * prefix failed on a sound entry's record (the shard's path judges that
 * record under the job's error policy; the entry stays). */
static void cache_fallback(run_t *r, const ferry_error_t *why,
                           bool damaged) {
  wrun_t *ru = r->ru;
  if (damaged)
    FERRY_LOG(FERRY_LOG_WARN,
              "prefix cache: %s; recomputing the split from position %llu",
              why->msg, (unsigned long long)r->out);
  ferry__pcache_reader_close(ru->pc_rd);
  ru->pc_rd = NULL;
  if (damaged) {
    r->pc_corrupt++;
    ferry__pcache_remove(r->th->t->cache->dir, &ru->pc_key);
  }
  /* The shard's pass counts positions from 0 again, passing over those
   * already produced without processing them (a cached split is clean:
   * every record has its position). */
  own_from(r, r->out); /* the reader has not read: nothing can fail */
}

/* Serves the split from its entry in split order (the permutation of the
 * records in file order, as run_shuffled walks it). Returns FERRY_EOF at
 * the end, 0 when stopped or parked, RUN_OWN when an entry is damaged
 * (recompute from r->out). */
static int run_cached(run_t *r) {
  ferry__wtask_t *k = r->task;
  ferry__wpolicy_t *pol = k->pipe->pol;
  wrun_t *ru = r->ru;
  uint64_t n = ferry__pcache_reader_count(ru->pc_rd);
  if (ru->pc_order == NULL) {
    ru->pc_order = ferry__malloc((n > 0 ? n : 1) * sizeof(*ru->pc_order));
    if (ru->pc_order == NULL)
      return ferry__seterr(&r->err, FERRY_ENOMEM, "out of memory");
    ferry__wshuffle(ru->pc_order, n, k->shuffle, k->seed, k->epoch, k->split);
  }
  bool suffix = (size_t)pol->det_ops < pol->n_ops;
  /* The entries hold the output itself, of one shape: each is read
   * straight into its place in the chunk. */
  int sh = 0, sw = 0, sc = 0;
  bool direct = !suffix &&
                ferry__pipeline_shape(k->pipe->pipeline, &sh, &sw, &sc) == 0;
  size_t bytes = (size_t)sh * (size_t)sw * (size_t)sc;
  while (ru->pc_next < n) {
    if (k->end != 0 && r->out >= k->end)
      return FERRY_EOF;
    if (r->out < k->start || r->out < ru->resume_at) {
      ru->pc_next++;
      r->out++;
      continue;
    }
    if (should_stop(r))
      return 0;
    bool sample = pc_sample_read(r);
    int64_t t0 = sample ? ferry__thread_cpu_ns() : 0;
    ferry_pcache_record_t e;
    ferry_error_t err;
    if (direct) {
      uint8_t *slot = reserve_record(r, sh, sw, sc);
      if (slot == NULL)
        return 0; /* parked (nothing pending: this entry is read again) */
      if (ferry__pcache_reader_get_into(ru->pc_rd,
                                        ru->pc_order[ru->pc_next], slot,
                                        bytes, &e, &err) != 0) {
        cache_fallback(r, &err, true);
        return RUN_OWN;
      }
      ru->pc_next++;
      if (sample) {
        int64_t t1 = ferry__thread_cpu_ns();
        pthread_mutex_lock(&pol->mu);
        pol->read_ns += (double)(t1 - t0);
        pol->read_bytes += (double)bytes;
        pthread_mutex_unlock(&pol->mu);
      }
      cache_hit(r, bytes);
      commit_record(r, e.label,
                    (int64_t)((uint64_t)k->file_index << 40 | e.index));
      continue;
    }
    if (ferry__pcache_reader_get(ru->pc_rd, ru->pc_order[ru->pc_next], &e,
                                 &err) != 0) {
      cache_fallback(r, &err, true);
      return RUN_OWN;
    }
    int64_t t1 = sample ? ferry__thread_cpu_ns() : 0;
    const uint8_t *pix = e.pixels;
    int h = e.h, w = e.w;
    uint64_t id = (uint64_t)k->file_index << 40 | e.index;
    if (suffix) {
      ferry_error_t perr;
      ferry__pipeline_ctx_set_key(r->ctx, k->seed, k->epoch, id);
      if (ferry__pipeline_process_from(r->ctx, (size_t)pol->det_ops,
                                       e.pixels, e.h, e.w, e.c, &pix, &h, &w,
                                       &perr) != 0) {
        /* The policies judge the record where it is recomputed. */
        cache_fallback(r, &perr, false);
        return RUN_OWN;
      }
    }
    ru->pc_next++;
    if (sample) {
      int64_t t2 = ferry__thread_cpu_ns();
      pthread_mutex_lock(&pol->mu);
      pol->read_ns += (double)(t1 - t0);
      pol->read_bytes += (double)((size_t)e.h * (size_t)e.w * (size_t)e.c);
      if (suffix) {
        pol->suffix_ns += (double)(t2 - t1);
        pol->n_suffix++;
      }
      pthread_mutex_unlock(&pol->mu);
    }
    cache_hit(r, (uint64_t)e.h * (uint64_t)e.w * (uint64_t)e.c);
    if (!put_record(r, pix, h, w, e.c, e.label, (int64_t)id))
      return 0;
  }
  return FERRY_EOF;
}

/* Adds the run's cache counts to its policy, the cache and the metrics. */
static void cache_count(run_t *r) {
  ferry__wpolicy_t *pol = r->task->pipe != NULL ? r->task->pipe->pol : NULL;
  ferry__wcache_t *c = r->th->t->cache;
  if (pol == NULL || c == NULL ||
      (r->pc_hits | r->pc_misses | r->pc_corrupt) == 0)
    return;
  pthread_mutex_lock(&pol->mu);
  pol->hits += r->pc_hits;
  pol->misses += r->pc_misses;
  pthread_mutex_unlock(&pol->mu);
  atomic_fetch_add(&c->hits, r->pc_hits);
  atomic_fetch_add(&c->misses, r->pc_misses);
  atomic_fetch_add(&c->corrupt, r->pc_corrupt);
  atomic_fetch_add(&c->read_bytes, r->pc_read_bytes);
  r->pc_hits = r->pc_misses = r->pc_corrupt = r->pc_read_bytes = 0;
}

/* Commits the entry a complete, clean run wrote. */
static void cache_commit(run_t *r, uint64_t reader_skipped) {
  wrun_t *ru = r->ru;
  ferry__wcache_t *c = r->th->t->cache;
  if (ru->pc_wr == NULL)
    return;
  if (reader_skipped != 0 || r->skipped != 0 || ru->pc_added == 0) {
    writer_drop(r);
    return;
  }
  uint64_t bytes = ferry__pcache_writer_bytes(ru->pc_wr);
  ferry_error_t err;
  int rc = ferry__pcache_writer_commit(ru->pc_wr, ru->pc_added, &err);
  ru->pc_wr = NULL;
  if (rc != 0) {
    FERRY_LOG(FERRY_LOG_WARN, "prefix cache: %s (the split is not cached)",
              err.msg);
    return;
  }
  atomic_fetch_add(&c->held, bytes);
  atomic_fetch_add(&c->entries, 1);
  atomic_fetch_add(&c->written_bytes, bytes);
}

/* Runs the split from the cache when it has its entry, else (or from
 * where an entry turned out damaged) from the shard. */
static int run_any(run_t *r) {
  if (r->ru->share_e != NULL && !r->ru->share_producer) {
    int rc = run_shared(r);
    if (rc != RUN_OWN)
      return rc;
  }
  if (r->ru->pc_rd != NULL) {
    int rc = run_cached(r);
    if (rc != RUN_OWN)
      return rc;
  }
  return r->task->shuffle ? run_shuffled(r) : run_identity(r);
}

/* Sends an error chunk and records the error on the task. */
static void fail(run_t *r, int code) {
  ferry__wtask_t *k = r->task;
  ferry__wtasks_t *t = r->th->t;
  if (r->cur != NULL)
    flush(r, false);
  if (!should_stop(r)) {
    ferry__wchunk_t *c = new_chunk(r, 0, 0, 0, 0);
    if (c != NULL) {
      c->error_code = code;
      snprintf(c->error, 512, "%s", r->err.msg);
      r->cur = c;
      flush(r, false);
    }
  }
  FERRY_LOG(FERRY_LOG_WARN, "task job %llu split %u: %s",
            (unsigned long long)k->job_id, k->split, r->err.msg);
  pthread_mutex_lock(&t->lock);
  k->error_code = code;
  snprintf(k->error, sizeof(k->error), "%s", r->err.msg);
  pthread_mutex_unlock(&t->lock);
}

/* True when `code` is the worker's own fault rather than the data's: out
 * of descriptors anywhere, or out of memory while opening the shard
 * (`opening`). Another worker can run the split, so the task gives it back
 * (give_back) instead of failing the job or skipping records. */
static bool worker_fault(int code, bool opening) {
  return code == FERRY_EMFILE || code == FERRY_ENFILE ||
         (opening && code == FERRY_ENOMEM);
}

/* Ends the task on a worker fault: no error chunk reaches the client
 * (its chunk in progress is dropped by the caller) and nothing counts as
 * skipped; the heartbeat reports error_code with worker_fault, and the
 * dispatcher leases the split to another worker from what the client
 * received. */
static void give_back(run_t *r, int code) {
  ferry__wtask_t *k = r->task;
  ferry__wtasks_t *t = r->th->t;
  FERRY_LOG(FERRY_LOG_WARN,
            "task job %llu split %u: %s; giving the split back to the "
            "dispatcher (a fault of this worker, not of the data)",
            (unsigned long long)k->job_id, k->split, r->err.msg);
  pthread_mutex_lock(&t->lock);
  k->error_code = code;
  k->worker_fault = true;
  snprintf(k->error, sizeof(k->error), "%s", r->err.msg);
  pthread_mutex_unlock(&t->lock);
}

enum { PARK_DONE, PARK_RETRY, PARK_STOP };

/* Parks `k` unless a release came since the acquire failed (retry) or it
 * was cancelled (stop). */
static int park(ferry__wtasks_t *t, ferry__wtask_t *k, const run_t *r) {
  pthread_mutex_lock(&t->lock);
  if (atomic_load(&k->cancelled) || atomic_load(&t->stop)) {
    pthread_mutex_unlock(&t->lock);
    return PARK_STOP;
  }
  pthread_mutex_lock(&t->pool->lock);
  if (t->pool->gen != r->park_gen) {
    pthread_mutex_unlock(&t->pool->lock);
    pthread_mutex_unlock(&t->lock);
    return PARK_RETRY;
  }
  t->pool->parked++;
  pthread_mutex_unlock(&t->pool->lock);
  k->state = WT_PARKED;
  k->park_pool = !r->park_key_full;
  k->qnext = t->parked;
  t->parked = k;
  pthread_mutex_unlock(&t->lock);
  return PARK_DONE;
}

/* Opens the task's reader (the first step of a task). */
static int run_begin(run_t *r) {
  ferry__wtask_t *k = r->task;
  wrun_t *ru = ferry__calloc(1, sizeof(*ru));
  if (ru == NULL)
    return ferry__seterr(&r->err, FERRY_ENOMEM, "out of memory");
  ru->fd = -1;
  k->run = ru;
  r->ru = ru;
  /* The dispatcher checked the roots at registration; check again here,
   * where the file is opened (a forged or stale task, a symlink that
   * moved), and open what was checked: every read of the task, the
   * shuffle's included, goes through this one descriptor. */
  int fd, rc = ferry__roots_open_file(&r->th->t->roots, k->file, &fd, &r->err);
  if (rc != 0)
    return rc;
  struct stat sb;
  if (r->th->t->cache != NULL && fstat(fd, &sb) == 0)
    cache_begin(r, &sb);
  share_begin(r);
  return open_reader(r, fd);
}

/* Runs `k` until it ends (true) or parks (false: it is on the parked
 * list, or, with may_park false, never). */
bool ferry__wtask_step(ferry__wthread_t *th, ferry__wtask_t *k, bool may_park) {
  ferry__wtasks_t *t = th->t;
  run_t r;
  memset(&r, 0, sizeof(r));
  r.th = th;
  r.task = k;
  r.may_park = may_park;
  ferry_error_clear(&r.err);

  int rc = 0;
  bool opening = false; /* the failure, if any, is run_begin's */
  if (k->pipe == NULL) {
    ferry__seterr(&r.err, k->error_code, "%s", k->error);
    rc = k->error_code;
  } else if ((r.ctx = get_ctx(th, k->pipe, &r.err)) == NULL) {
    rc = r.err.code != 0 ? r.err.code : FERRY_ENOMEM;
  } else if (k->run == NULL && (rc = run_begin(&r)) != 0) {
    opening = true; /* rc and r.err say why */
  } else {
    for (;;) {
      wrun_t *ru = r.ru = k->run;
      r.out = ru->out;
      r.skipped = ru->skipped;
      r.parked = false;
      r.share_wait = false;
      rc = 0;
      if (!ru->pending ||
          put_record(&r, ru->pix, ru->h, ru->w, ru->c, ru->label, ru->id))
        rc = run_any(&r);
      if (!r.parked)
        break;
      ru->out = r.out;
      ru->skipped = r.skipped;
      int pr;
      if (r.share_wait) {
        int sp = ferry__wtasks_park_share(t, k, ru->share_e, r.share_gen);
        pr = sp == FERRY__WPARK_DONE    ? PARK_DONE
             : sp == FERRY__WPARK_RETRY ? PARK_RETRY
                                        : PARK_STOP;
      } else {
        /* A producer held back by its own client while other tasks wait
         * for the split: one of them takes over (this one sends from the
         * window when it runs again), so no trainer waits for another. */
        if (ru->share_producer &&
            ferry__wshare_waiting(t->share, ru->share_e))
          share_end(r.ru, false);
        pr = park(t, k, &r);
      }
      if (pr == PARK_DONE) {
        cache_count(&r);
        return false;
      }
      if (pr == PARK_STOP) {
        r.parked = false;
        r.stopped = true;
        break;
      }
    }
    if (rc == FERRY_EOF)
      rc = 0;
    else if (rc == 0 && r.err.code != 0 && !r.stopped)
      rc = r.err.code; /* a pipeline error under policy fail */
  }
  if (rc == 0 && !r.stopped && r.err.code == 0) {
    /* The split is complete: its final chunk carries `last` (an empty
     * one when nothing was left to produce). */
    ferry_tfr_stats_t st;
    ferry__tfr_reader_stats(k->run->rd, &st);
    if (k->start == 0) {
      r.skipped += st.skipped;
      ferry__wmetrics_skipped(0, st.skipped);
    }
    cache_commit(&r, st.skipped);
    if (r.cur == NULL) {
      int h = 0, w = 0, c = 0;
      if (ferry__pipeline_shape(k->pipe->pipeline, &h, &w, &c) != 0)
        h = w = c = 0;
      r.cur = new_chunk(&r, 0, h, w, c);
    }
    if (r.cur != NULL && flush(&r, true) == 0) {
      pthread_mutex_lock(&t->lock);
      k->finished = true;
      k->produced = r.out;
      k->skipped = r.skipped;
      pthread_mutex_unlock(&t->lock);
    } else if (r.err.code != 0) {
      fail(&r, r.err.code);
    }
  } else if (!r.stopped) {
    if (rc == 0)
      rc = r.err.code;
    if (worker_fault(rc, opening))
      give_back(&r, rc);
    else
      fail(&r, rc);
  }
  if (r.cur != NULL) /* stopped mid-chunk, or given back: the chunk is moot */
    ferry__wpool_release(r.cur);
  cache_count(&r);
  pthread_mutex_lock(&t->lock);
  wrun_t *ru = k->run;
  k->run = NULL;
  k->state = WT_DONE;
  ferry__wrun_slot_put(t, k);
  bool news = k->error_code != 0 || k->skipped > 0 ||
              (k->finished &&
               (k->num_records == 0 || k->produced != k->num_records));
  pthread_mutex_unlock(&t->lock);
  share_drop(ru, k->finished);
  ferry__wrun_free(ru);
  ferry__wtask_key_idle(k);
  if (t->on_end != NULL)
    t->on_end(t->end_arg, news);
  return true;
}

void ferry__wthread_run_task(ferry__wthread_t *th, ferry__wtask_t *k) {
  ferry__wtask_step(th, k, false);
}

