/* The task runner over generated TFRecord files: every record once with
 * the right pixels, split ranges, shuffle and resume, error policies,
 * backpressure and cancellation. */
#include <pthread.h>
#include <sched.h>

#include "wtest_util.h"

/* Collects the chunks a task emits, decoded from their wire form. */
typedef struct {
  pthread_mutex_t lock;
  Ferry__V1__Chunk **chunks;
  size_t n;
  bool hold;              /* keep the blocks (backpressure tests) */
  ferry__wchunk_t *held[64];
  size_t nheld;
} sink_t;

static void sink_emit(ferry__wchunk_t *c, void *arg) {
  sink_t *s = arg;
  pthread_mutex_lock(&s->lock);
  if (s->hold) {
    cr_assert_lt(s->nheld, 64);
    s->held[s->nheld++] = c;
    pthread_mutex_unlock(&s->lock);
    return;
  }
  pthread_mutex_unlock(&s->lock);
  ferry__wtask_unref(c->task);
  c->task = NULL;
  Ferry__V1__Chunk *m = wt_unpack_pieces(c->pieces, c->n_pieces);
  ferry__wpool_release(c);
  pthread_mutex_lock(&s->lock);
  s->chunks = realloc(s->chunks, (s->n + 1) * sizeof(*s->chunks));
  s->chunks[s->n++] = m;
  pthread_mutex_unlock(&s->lock);
}

typedef struct {
  ferry__wpool_t pool;
  ferry__wtasks_t tasks;
  sink_t sink;
} rig_t;

static void rig_init(rig_t *r, uint64_t pool_bytes, uint64_t chunk_bytes) {
  memset(r, 0, sizeof(*r));
  pthread_mutex_init(&r->sink.lock, NULL);
  cr_assert_eq(ferry__wpool_init(&r->pool, pool_bytes), 0);
  cr_assert_eq(ferry__wtasks_init(&r->tasks, &r->pool, chunk_bytes,
                                  sink_emit, &r->sink),
               0);
}

static void rig_close(rig_t *r) {
  ferry__wtasks_close(&r->tasks);
  cr_assert_eq(ferry__wpool_used(&r->pool), 0, "every chunk came back");
  ferry__wpool_close(&r->pool);
  for (size_t i = 0; i < r->sink.n; i++)
    ferry__v1__chunk__free_unpacked(r->sink.chunks[i], NULL);
  free(r->sink.chunks);
  pthread_mutex_destroy(&r->sink.lock);
}

/* Adds the task and runs it on this thread. */
static void run_here(rig_t *r, const Ferry__V1__Task *t) {
  cr_assert_eq(ferry__wtasks_add(&r->tasks, t), 1);
  pthread_mutex_lock(&r->tasks.lock);
  ferry__wtask_t *k = r->tasks.qhead;
  r->tasks.qhead = r->tasks.qtail = NULL;
  k->qnext = NULL;
  k->state = WT_RUNNING;
  atomic_fetch_add(&k->refs, 1);
  pthread_mutex_unlock(&r->tasks.lock);
  ferry__wthread_t *th = ferry__wthread_new(&r->tasks);
  ferry__wthread_run_task(th, k);
  ferry__wthread_free(th);
  ferry__wtask_unref(k);
}

static ferry__wprogress_t progress(rig_t *r, const Ferry__V1__Task *t) {
  ferry__wprogress_t p;
  cr_assert(ferry__wtasks_progress(&r->tasks, t->job_id, t->epoch,
                                   t->split->index, t->lease, &p));
  return p;
}

/* Checks the chunks: contiguous positions from `start`, one `last` at the
 * end, and the records in `order` (record numbers in the file) with their
 * pixels, labels and ids. */
static void check_chunks(rig_t *r, const wt_file_t *f, uint64_t start,
                         const uint64_t *order, size_t n) {
  uint64_t pos = start;
  size_t k = 0;
  uint8_t want[WT_BYTES];
  cr_assert_gt(r->sink.n, 0);
  for (size_t ci = 0; ci < r->sink.n; ci++) {
    Ferry__V1__Chunk *m = r->sink.chunks[ci];
    cr_assert_eq(m->error_code, 0, "%s", m->error);
    cr_assert_eq(m->job_id, 11);
    cr_assert_eq(m->epoch, 1);
    cr_assert_eq(m->split, 3);
    cr_assert_eq(m->lease, 5);
    cr_assert_eq(m->first, pos, "chunk %zu starts at %llu", ci,
                 (unsigned long long)pos);
    cr_assert_eq(m->last, ci + 1 == r->sink.n, "last only at the end");
    cr_assert_eq(m->height, WT_H);
    cr_assert_eq(m->width, WT_W);
    cr_assert_eq(m->channels, WT_C);
    cr_assert_eq(m->payload.len, (size_t)m->count * WT_BYTES);
    for (uint32_t j = 0; j < m->count; j++, k++) {
      cr_assert_lt(k, n, "more records than expected");
      int64_t label;
      wt_expected(f, order[k], want, &label);
      cr_assert_eq(m->ids[j], (int64_t)(2ull << 40 | order[k]),
                   "position %zu", k);
      cr_assert_eq(m->labels[j], label);
      cr_assert_eq(memcmp(m->payload.data + (size_t)j * WT_BYTES, want,
                          WT_BYTES),
                   0, "pixels of record %llu",
                   (unsigned long long)order[k]);
    }
    pos += m->count;
  }
  cr_assert_eq(k, n, "every record exactly once");
}

Test(tasks, identity_every_record_once) {
  wt_file_t f;
  rig_t r;
  wt_file_make(&f, 100, FERRY_COMPRESSION_NONE, SIZE_MAX);
  rig_init(&r, 64 << 20, 7 * WT_BYTES); /* K = 7 */
  wt_task_t t;
  wt_task(&t, &f, 0, 100, false);
  run_here(&r, &t.task);
  uint64_t order[100];
  for (int i = 0; i < 100; i++)
    order[i] = (uint64_t)i;
  cr_assert_eq(r.sink.n, 15, "ceil(100 / 7) chunks");
  check_chunks(&r, &f, 0, order, 100);
  ferry__wprogress_t p = progress(&r, &t.task);
  cr_assert(p.finished);
  cr_assert_eq(p.produced, 100);
  cr_assert_eq(p.skipped, 0);
  cr_assert_eq(p.error_code, 0);
  cr_assert_eq(p.state, WT_DONE);
  rig_close(&r);
  wt_file_free(&f);
}

Test(tasks, split_ranges_by_count_and_by_byte_end) {
  wt_file_t f;
  wt_file_make(&f, 50, FERRY_COMPRESSION_NONE, SIZE_MAX);
  uint64_t order[20];
  for (int i = 0; i < 20; i++)
    order[i] = 20 + (uint64_t)i;
  for (int use_end = 0; use_end < 2; use_end++) {
    rig_t r;
    rig_init(&r, 64 << 20, 1 << 20);
    wt_task_t t;
    wt_task(&t, &f, 20, 20, use_end);
    run_here(&r, &t.task);
    cr_assert_eq(r.sink.n, 1);
    check_chunks(&r, &f, 0, order, 20);
    cr_assert_eq(progress(&r, &t.task).produced, 20);
    rig_close(&r);
  }
  /* Unknown count, no end: to the end of the file. */
  rig_t r;
  rig_init(&r, 64 << 20, 1 << 20);
  wt_task_t t;
  wt_task(&t, &f, 40, 0, false);
  run_here(&r, &t.task);
  uint64_t tail[10];
  for (int i = 0; i < 10; i++)
    tail[i] = 40 + (uint64_t)i;
  check_chunks(&r, &f, 0, tail, 10);
  cr_assert(progress(&r, &t.task).finished);
  cr_assert_eq(progress(&r, &t.task).produced, 10);
  rig_close(&r);
  wt_file_free(&f);
}

/* Shuffled splits follow ferry__wshuffle; a lease resumed from `start`
 * yields exactly the tail of the full order. Uncompressed (records point
 * into the mapping) and gzip (records copied into the arena). */
static void shuffle_case(ferry_compression_t comp) {
  wt_file_t f;
  wt_file_make(&f, 60, comp, SIZE_MAX);
  uint64_t perm[60], order[60];
  ferry__wshuffle(perm, 60, true, 1234, 1, 3);
  for (int i = 0; i < 60; i++)
    order[i] = perm[i]; /* the split starts at record 0 */
  uint64_t starts[] = {0, 1, 17, 59};
  for (size_t s = 0; s < sizeof(starts) / sizeof(starts[0]); s++) {
    rig_t r;
    rig_init(&r, 64 << 20, 8 * WT_BYTES);
    wt_task_t t;
    wt_task(&t, &f, 0, comp == FERRY_COMPRESSION_NONE ? 60 : 0, false);
    t.task.shuffle = true;
    t.task.shuffle_seed = 1234;
    t.task.start = starts[s];
    run_here(&r, &t.task);
    check_chunks(&r, &f, starts[s], order + starts[s], 60 - starts[s]);
    ferry__wprogress_t p = progress(&r, &t.task);
    cr_assert(p.finished);
    cr_assert_eq(p.produced, 60, "counted from position 0");
    rig_close(&r);
  }
  wt_file_free(&f);
}

Test(tasks, shuffle_and_resume_uncompressed) {
  shuffle_case(FERRY_COMPRESSION_NONE);
}

Test(tasks, shuffle_and_resume_gzip) { shuffle_case(FERRY_COMPRESSION_GZIP); }

/* A task with Task.end (a ranked part that ends before its
 * split) stops there: its positions [start, end) in split order, the last
 * chunk marked `last`, nothing past it produced; identity and shuffled. */
Test(tasks, a_part_ends_at_its_end) {
  wt_file_t f;
  wt_file_make(&f, 60, FERRY_COMPRESSION_NONE, SIZE_MAX);
  uint64_t perm[60];
  ferry__wshuffle(perm, 60, true, 1234, 1, 3);
  for (int shuffled = 0; shuffled < 2; shuffled++) {
    uint64_t order[60];
    for (int i = 0; i < 60; i++)
      order[i] = shuffled ? perm[i] : (uint64_t)i;
    rig_t r;
    rig_init(&r, 64 << 20, 8 * WT_BYTES);
    wt_task_t t;
    wt_task(&t, &f, 0, 60, false);
    t.task.shuffle = shuffled;
    t.task.shuffle_seed = 1234;
    t.task.start = 17;
    t.task.end = 41;
    run_here(&r, &t.task);
    check_chunks(&r, &f, 17, order + 17, 41 - 17);
    ferry__wprogress_t p = progress(&r, &t.task);
    cr_assert(p.finished);
    cr_assert_eq(p.produced, 41, "stopped at the part's end");
    rig_close(&r);
  }
  wt_file_free(&f);
}

Test(tasks, identity_resume_and_gzip_stream) {
  wt_file_t f;
  wt_file_make(&f, 30, FERRY_COMPRESSION_GZIP, SIZE_MAX);
  rig_t r;
  rig_init(&r, 64 << 20, 4 * WT_BYTES);
  wt_task_t t;
  wt_task(&t, &f, 0, 0, false);
  t.task.start = 9;
  run_here(&r, &t.task);
  uint64_t order[30];
  for (int i = 0; i < 30; i++)
    order[i] = (uint64_t)i;
  check_chunks(&r, &f, 9, order + 9, 21);
  cr_assert_eq(progress(&r, &t.task).produced, 30);
  rig_close(&r);
  wt_file_free(&f);
}

Test(tasks, nothing_left_sends_one_empty_last_chunk) {
  wt_file_t f;
  wt_file_make(&f, 10, FERRY_COMPRESSION_NONE, SIZE_MAX);
  rig_t r;
  rig_init(&r, 64 << 20, 1 << 20);
  wt_task_t t;
  wt_task(&t, &f, 0, 10, false);
  t.task.start = 10;
  run_here(&r, &t.task);
  cr_assert_eq(r.sink.n, 1);
  Ferry__V1__Chunk *m = r.sink.chunks[0];
  cr_assert_eq(m->count, 0);
  cr_assert(m->last);
  cr_assert_eq(m->first, 10, "the client learns the total");
  cr_assert_eq(m->payload.len, 0);
  cr_assert(progress(&r, &t.task).finished);
  cr_assert_eq(progress(&r, &t.task).produced, 10);
  rig_close(&r);
  wt_file_free(&f);
}

/* The error chunk: count 0, the code, and a message naming the file and
 * the record's byte offset. */
static void check_error(rig_t *r, const wt_task_t *t, const wt_file_t *f,
                        int code, uint64_t offset) {
  char where[64];
  snprintf(where, sizeof(where), "%llu", (unsigned long long)offset);
  cr_assert_gt(r->sink.n, 0);
  Ferry__V1__Chunk *m = r->sink.chunks[r->sink.n - 1];
  cr_assert_eq(m->error_code, code, "%d: %s", m->error_code, m->error);
  cr_assert_eq(m->count, 0);
  cr_assert(!m->last);
  cr_assert_not_null(strstr(m->error, f->path), "%s", m->error);
  cr_assert_not_null(strstr(m->error, where), "%s names offset %s", m->error,
                     where);
  ferry__wprogress_t p = progress(r, &t->task);
  cr_assert_eq(p.error_code, code);
  cr_assert_not_null(strstr(p.error, f->path));
  cr_assert(!p.finished);
}

Test(tasks, policy_fail_on_bad_crc_reports_file_and_offset) {
  wt_file_t f;
  wt_file_make(&f, 20, FERRY_COMPRESSION_NONE, SIZE_MAX);
  wt_corrupt(&f, 13);
  rig_t r;
  rig_init(&r, 64 << 20, 1 << 20);
  wt_task_t t;
  wt_task(&t, &f, 0, 20, false);
  run_here(&r, &t.task);
  check_error(&r, &t, &f, FERRY_EDATACRC, f.offsets[13]);
  rig_close(&r);
  wt_file_free(&f);
}

Test(tasks, policy_fail_on_bad_image_reports_file_and_offset) {
  wt_file_t f;
  wt_file_make(&f, 20, FERRY_COMPRESSION_NONE, 6);
  rig_t r;
  rig_init(&r, 64 << 20, 4 * WT_BYTES);
  wt_task_t t;
  wt_task(&t, &f, 0, 20, false);
  run_here(&r, &t.task);
  check_error(&r, &t, &f, FERRY_EIMGSIZE, f.offsets[6]);
  /* The records before it were sent: positions 0..5. */
  cr_assert_eq(r.sink.chunks[0]->first, 0);
  cr_assert_eq(r.sink.chunks[0]->count, 4);
  cr_assert_eq(r.sink.chunks[1]->count, 2);
  rig_close(&r);
  wt_file_free(&f);
}

Test(tasks, policy_skip_counts) {
  wt_file_t f;
  wt_file_make(&f, 40, FERRY_COMPRESSION_NONE, 30);
  wt_corrupt(&f, 7);
  uint64_t order[38];
  size_t n = 0;
  for (uint64_t i = 0; i < 40; i++)
    if (i != 7 && i != 30)
      order[n++] = i;
  rig_t r;
  rig_init(&r, 64 << 20, 5 * WT_BYTES);
  wt_task_t t;
  wt_task(&t, &f, 0, 40, false);
  t.task.error_policy = FERRY__V1__ERROR_POLICY__ERROR_POLICY_SKIP;
  run_here(&r, &t.task);
  check_chunks(&r, &f, 0, order, 38);
  ferry__wprogress_t p = progress(&r, &t.task);
  cr_assert(p.finished);
  cr_assert_eq(p.produced, 38);
  cr_assert_eq(p.skipped, 2, "one bad CRC, one bad image");
  cr_assert_eq(p.error_code, 0);
  rig_close(&r);

  /* Resumed past the bad image: the same positions as the full run. */
  rig_init(&r, 64 << 20, 5 * WT_BYTES);
  t.task.start = 31;
  run_here(&r, &t.task);
  check_chunks(&r, &f, 31, order + 31, 7);
  cr_assert_eq(progress(&r, &t.task).produced, 38);
  rig_close(&r);
  wt_file_free(&f);
}

Test(tasks, bad_spec_reports_an_error) {
  wt_file_t f;
  wt_file_make(&f, 3, FERRY_COMPRESSION_NONE, SIZE_MAX);
  rig_t r;
  rig_init(&r, 64 << 20, 1 << 20);
  wt_task_t t;
  wt_task(&t, &f, 0, 3, false);
  uint8_t junk[] = {0xff, 0xff, 0xff};
  t.task.spec.data = junk;
  t.task.spec.len = sizeof(junk);
  run_here(&r, &t.task);
  cr_assert_eq(r.sink.n, 1);
  cr_assert_neq(r.sink.chunks[0]->error_code, 0);
  cr_assert_neq(progress(&r, &t.task).error_code, 0);
  rig_close(&r);
  wt_file_free(&f);
}

Test(tasks, duplicate_and_draining_tasks_are_ignored) {
  wt_file_t f;
  wt_file_make(&f, 3, FERRY_COMPRESSION_NONE, SIZE_MAX);
  rig_t r;
  rig_init(&r, 64 << 20, 1 << 20);
  wt_task_t t;
  wt_task(&t, &f, 0, 3, false);
  cr_assert_eq(ferry__wtasks_add(&r.tasks, &t.task), 1);
  cr_assert_eq(ferry__wtasks_add(&r.tasks, &t.task), 0, "same lease");
  t.task.lease = 6;
  ferry__wtasks_drain(&r.tasks);
  cr_assert_eq(ferry__wtasks_add(&r.tasks, &t.task), 0, "draining");
  /* The heartbeat report lists the one task. */
  Ferry__V1__WorkerHeartbeatRequest req =
      FERRY__V1__WORKER_HEARTBEAT_REQUEST__INIT;
  void *mem;
  cr_assert_eq(ferry__wtasks_report(&r.tasks, &req, &mem), 0);
  cr_assert_eq(req.n_tasks, 1);
  cr_assert_eq(req.tasks[0]->lease, 5);
  cr_assert_eq(req.tasks[0]->split, 3);
  ferry__free(mem);
  cr_assert(ferry__wtasks_cancel(&r.tasks, 11, 1, 3, 5));
  cr_assert(!ferry__wtasks_cancel(&r.tasks, 11, 1, 3, 5), "forgotten");
  rig_close(&r);
  wt_file_free(&f);
}

/* With threads: a full pool blocks the producer (backpressure); a
 * cancellation releases it, and the task stops without finishing. */
Test(tasks, backpressure_then_cancel, .timeout = 60) {
  wt_file_t f;
  wt_file_make(&f, 200, FERRY_COMPRESSION_NONE, SIZE_MAX);
  rig_t r;
  size_t block = ferry__wchunk_block_size(2, WT_BYTES);
  /* One stream's share is half the pool (one share stays free). */
  rig_init(&r, 6 * block, 2 * WT_BYTES);
  r.sink.hold = true;
  ferry_error_t err;
  cr_assert_eq(ferry__wtasks_start(&r.tasks, 2, &err), 0);
  wt_task_t t;
  wt_task(&t, &f, 0, 200, false);
  cr_assert_eq(ferry__wtasks_add(&r.tasks, &t.task), 1);
  /* Three blocks fit the share: a full chunk is handed on when the next
   * record needs room, so three are emitted and the fourth acquire parks
   * the task. */
  bool waited = false;
  for (int i = 0; i < 5000000 && !waited; i++) {
    pthread_mutex_lock(&r.pool.lock);
    waited = r.pool.waits > 0;
    pthread_mutex_unlock(&r.pool.lock);
    if (!waited)
      sched_yield();
  }
  cr_assert(waited, "the producer blocks on the full pool");
  pthread_mutex_lock(&r.sink.lock);
  size_t held = r.sink.nheld;
  pthread_mutex_unlock(&r.sink.lock);
  cr_assert_eq(held, 3);
  cr_assert_eq(ferry__wpool_used(&r.pool), 3 * block);

  /* Releasing one lets exactly one more chunk through. */
  pthread_mutex_lock(&r.sink.lock);
  ferry__wchunk_t *c = r.sink.held[0];
  r.sink.held[0] = NULL;
  pthread_mutex_unlock(&r.sink.lock);
  ferry__wpool_release(c);
  bool more = false;
  for (int i = 0; i < 5000000 && !more; i++) {
    pthread_mutex_lock(&r.pool.lock);
    more = r.pool.waits > 1;
    pthread_mutex_unlock(&r.pool.lock);
    if (!more)
      sched_yield();
  }
  cr_assert(more, "blocked again after one more chunk");
  pthread_mutex_lock(&r.sink.lock);
  cr_assert_eq(r.sink.nheld, 4);
  pthread_mutex_unlock(&r.sink.lock);

  cr_assert(ferry__wtasks_cancel(&r.tasks, 11, 1, 3, 5));
  /* The thread wakes, gives its partial chunk back and ends. */
  ferry__wtasks_stop(&r.tasks);
  for (size_t i = 0; i < r.sink.nheld; i++)
    if (r.sink.held[i] != NULL)
      ferry__wpool_release(r.sink.held[i]);
  r.sink.nheld = 0;
  rig_close(&r);
  wt_file_free(&f);
}

/* Data roots: the worker checks a task's file against its roots
 * before it opens it: a task for a file outside (forged, or a symlink
 * that moved) fails naming the file, and nothing is read. */
Test(tasks, a_file_outside_the_data_roots_is_not_opened) {
  wt_file_t f;
  wt_file_make(&f, 10, FERRY_COMPRESSION_NONE, SIZE_MAX);
  rig_t r;
  ferry_error_t err = {0};
  rig_init(&r, 64 << 20, 1 << 20);
  char root[] = "/tmp/ferry-roots-XXXXXX";
  cr_assert_not_null(mkdtemp(root));
  cr_assert_eq(ferry__wtasks_set_roots(&r.tasks, root, &err), 0, "%s",
               err.msg);
  wt_task_t t;
  wt_task(&t, &f, 0, 10, false);
  run_here(&r, &t.task);
  Ferry__V1__Chunk *m = r.sink.chunks[r.sink.n - 1];
  cr_assert_eq(m->error_code, FERRY_EACCES, "%d: %s", m->error_code,
               m->error);
  cr_assert_not_null(strstr(m->error, "is outside every --data-root"), "%s",
                     m->error);
  ferry__wprogress_t p = progress(&r, &t.task);
  cr_assert_eq(p.produced, 0);
  rig_close(&r);
  rmdir(root);
  wt_file_free(&f);
}

/* ---------------------------------------------------------------------
 * JPEG records through the decode fused with random_resized_crop (issue
 * 13): bad JPEGs under both error policies, and a split run again draws
 * the same crops (the key is the job's seed, the epoch and the record).
 */
#include <turbojpeg.h>

#define JT_N 12
#define JT_TRUNC 4   /* a JPEG cut at 60% */
#define JT_CORRUPT 9 /* no JPEG at all */
#define JT_OUT 16

static void jt_file_make(wt_file_t *f) {
  ferry_error_t err;
  tjhandle tj = tjInitCompress();
  cr_assert_not_null(tj);
  memset(f, 0, sizeof(*f));
  snprintf(f->dir, sizeof(f->dir), "/tmp/ferry-wtest-XXXXXX");
  cr_assert_not_null(mkdtemp(f->dir));
  snprintf(f->path, sizeof(f->path), "%s/jpeg.tfrecord", f->dir);
  ferry_tfr_writer_t *w;
  cr_assert_eq(
      ferry__tfr_writer_open(f->path, FERRY_COMPRESSION_NONE, &w, &err), 0,
      "%s", err.msg);
  f->n = JT_N;
  f->offsets = calloc(JT_N + 1, sizeof(uint64_t));
  uint64_t off = 0;
  wbuf_t ex = {0};
  int ih = 96, iw = 128;
  uint8_t *rgb = malloc((size_t)ih * iw * 3);
  for (size_t i = 0; i < JT_N; i++) {
    unsigned char *jpeg = NULL;
    unsigned long jlen = 0;
    wt_image(rgb, (size_t)ih * iw * 3, i);
    for (int y = 0; y < ih; y++) /* smooth it: a photo-like gradient */
      for (int x = 0; x < iw * 3; x++)
        rgb[(size_t)y * iw * 3 + x] = (uint8_t)(rgb[x] / 2 + y + x / 6);
    cr_assert_eq(tjCompress2(tj, rgb, iw, 0, ih, TJPF_RGB, &jpeg, &jlen,
                             TJSAMP_420, 90, 0),
                 0);
    size_t len = i == JT_TRUNC ? jlen * 6 / 10 : i == JT_CORRUPT ? 50 : jlen;
    if (i == JT_CORRUPT)
      memset(jpeg, 0x42, 50);
    wbuf_t features = {0};
    wb_feature(&features, "image", jpeg, len, 0, true);
    wb_feature(&features, "label", NULL, 0, (int64_t)i, false);
    ex.n = 0;
    wb_ld(&ex, 1, features.p, features.n);
    free(features.p);
    tjFree(jpeg);
    f->offsets[i] = off;
    off += ex.n + 16;
    cr_assert_eq(ferry__tfr_writer_write(w, ex.p, ex.n, &err), 0);
  }
  f->offsets[JT_N] = off;
  free(ex.p);
  free(rgb);
  tjDestroy(tj);
  cr_assert_eq(ferry__tfr_writer_close(w, &err), 0);
  char text[256];
  snprintf(text, sizeof(text),
           "tfrecord(\"%s\") | decode(jpeg) | random_resized_crop(%d)",
           f->path, JT_OUT);
  cr_assert_eq(ferry__spec_parse(text, &f->spec, &err), 0, "%s", err.msg);
  cr_assert_eq(ferry__spec_pack(&f->spec, &f->spec_bytes, &f->spec_len), 0);
}

/* The payload bytes of every chunk, in order, and their record count. */
static size_t jt_payload(rig_t *r, uint8_t *out, size_t cap) {
  size_t n = 0, recs = 0;
  for (size_t ci = 0; ci < r->sink.n; ci++) {
    Ferry__V1__Chunk *m = r->sink.chunks[ci];
    if (m->count == 0)
      continue;
    cr_assert(m->height == JT_OUT && m->width == JT_OUT && m->channels == 3);
    cr_assert_leq(n + m->payload.len, cap);
    memcpy(out + n, m->payload.data, m->payload.len);
    n += m->payload.len;
    recs += m->count;
  }
  cr_assert_eq(n, recs * JT_OUT * JT_OUT * 3);
  return recs;
}

Test(tasks, fused_jpeg_bad_records_under_both_policies) {
  wt_file_t f;
  jt_file_make(&f);
  rig_t r;
  wt_task_t t;
  size_t cap = JT_N * JT_OUT * JT_OUT * 3;
  uint8_t *a = malloc(cap), *b = malloc(cap);

  /* fail: the truncated JPEG stops the split, naming file and offset. */
  rig_init(&r, 64 << 20, 1 << 20);
  wt_task(&t, &f, 0, JT_N, false);
  t.task.shuffle_seed = 7;
  run_here(&r, &t.task);
  check_error(&r, &t, &f, FERRY_EJPEGTRUNC, f.offsets[JT_TRUNC]);
  cr_assert_eq(jt_payload(&r, a, cap), JT_TRUNC, "the records before it");
  rig_close(&r);

  /* skip: both bad records are counted, the rest delivered. */
  rig_init(&r, 64 << 20, 1 << 20);
  t.task.error_policy = FERRY__V1__ERROR_POLICY__ERROR_POLICY_SKIP;
  run_here(&r, &t.task);
  ferry__wprogress_t p = progress(&r, &t.task);
  cr_assert(p.finished);
  cr_assert_eq(p.produced, JT_N - 2);
  cr_assert_eq(p.skipped, 2, "one truncated, one corrupt JPEG");
  cr_assert_eq(jt_payload(&r, a, cap), JT_N - 2);
  rig_close(&r);

  /* The same split run again (a re-lease) draws the same crops. */
  rig_init(&r, 64 << 20, 1 << 20);
  run_here(&r, &t.task);
  cr_assert_eq(jt_payload(&r, b, cap), JT_N - 2);
  cr_assert(memcmp(a, b, (JT_N - 2) * JT_OUT * JT_OUT * 3) == 0,
            "a re-run of the split drew other crops");
  rig_close(&r);

  /* Another epoch draws others. */
  rig_init(&r, 64 << 20, 1 << 20);
  t.task.epoch = 2;
  run_here(&r, &t.task);
  cr_assert_eq(jt_payload(&r, b, cap), JT_N - 2);
  cr_assert(memcmp(a, b, (JT_N - 2) * JT_OUT * JT_OUT * 3) != 0,
            "epoch 2 drew epoch 1's crops");
  rig_close(&r);
  free(a);
  free(b);
  wt_file_free(&f);
}
