/* Tests of the dispatcher's state machine with a fake clock: dataset
 * registration (the header scan), assignment and leasing, worker and
 * client loss, epochs, failure, skip counts, GC and status, and an
 * exactly-once simulation with workers and clients coming and going. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "alloc.h"
#include "ferry/log.h"
#include "transport.h"
#include <sys/stat.h>

#include "fixture.h"

#define TASK(j, e, s, l)                                                      \
  { .job = (j), .epoch = (e), .split = (s), .lease = (l) }

#define RUNNING FERRY__V1__JOB_STATE__JOB_STATE_RUNNING
#define FINISHED FERRY__V1__JOB_STATE__JOB_STATE_FINISHED
#define FAILED FERRY__V1__JOB_STATE__JOB_STATE_FAILED

static ferry_disp_t *D;

static void setup(void) {
  fx_begin();
}

/* Frees the state and checks that everything Ferry allocated came back. */
static void teardown(void) {
  fx_end(&D);
}

TestSuite(dispatcher, .init = setup, .fini = teardown);

/* Registers "tfrecord(DIR/pattern)" and returns the dataset id. */
static const char *reg(const char *pattern, const char *extra, uint32_t per,
                       Ferry__V1__RegisterDatasetResponse **out) {
  char spec[512];
  ferry_error_t err = {0};
  Ferry__V1__RegisterDatasetResponse *r;
  snprintf(spec, sizeof(spec), "tfrecord(\"%s/%s\"%s) | decode(raw, 1, 1, 1)",
           fx_dir, pattern, extra);
  cr_assert_eq(fx_register(D, spec, per, &r, 0, &err), 0, "%s", err.msg);
  if (out != NULL)
    *out = r;
  return r->dataset_id;
}

/* ---- Registration ------------------------------------------------------- */

Test(dispatcher, splits_match_the_index) {
  ferry_tfr_index_entry_t *idx;
  size_t n;
  ferry_error_t err = {0};
  Ferry__V1__RegisterDatasetResponse *r;
  Ferry__V1__JournalRegisterDataset *ds;
  const char *a;

  D = fx_state(1000, 1000, 1000, 1024);
  a = fx_write("a.tfrecord", 2500, FERRY_COMPRESSION_NONE);
  cr_assert_eq(ferry__tfr_index_build(a, &idx, &n, &err), 0, "%s", err.msg);
  fx_write("b.tfrecord", 10, FERRY_COMPRESSION_NONE);
  reg("*.tfrecord", "", 0, &r);
  cr_assert_eq(r->num_files, 2);
  cr_assert_eq(r->num_splits, 4);
  cr_assert_eq(r->num_records, 2510);
  cr_assert_eq(strlen(r->dataset_id), 16);
  ds = fx_last_dataset();
  cr_assert_eq(ds->n_splits, 4);
  for (int s = 0; s < 3; s++) {
    size_t first = (size_t)s * 1024, last = s < 2 ? first + 1023 : 2499;
    cr_assert_eq(ds->splits[s]->index, (uint32_t)s);
    cr_assert_eq(ds->splits[s]->file_index, 0);
    cr_assert_eq(ds->splits[s]->byte_offset, idx[first].offset);
    cr_assert_eq(ds->splits[s]->first_record, first);
    cr_assert_eq(ds->splits[s]->num_records, last - first + 1);
    cr_assert_eq(ds->splits[s]->byte_end, idx[last].offset + idx[last].size);
  }
  cr_assert_eq(ds->splits[3]->file_index, 1);
  cr_assert_eq(ds->splits[3]->num_records, 10);
  ferry_free(idx);
}

/* Records smaller and larger than the scan's read window (64 KiB), so
 * headers fall inside a window, at its end and past it. */
Test(dispatcher, splits_match_the_index_across_read_windows) {
  ferry_tfr_index_entry_t *idx;
  size_t n;
  ferry_error_t err = {0};
  Ferry__V1__RegisterDatasetResponse *r;
  Ferry__V1__JournalRegisterDataset *ds;
  char path[256];
  ferry_tfr_writer_t *w;
  uint8_t *buf = calloc(1, 200000);

  D = fx_state(1000, 1000, 1000, 1024);
  snprintf(path, sizeof(path), "%s/big.tfrecord", fx_dir);
  cr_assert_eq(ferry__tfr_writer_open(path, FERRY_COMPRESSION_NONE, &w, &err),
               0, "%s", err.msg);
  for (int i = 0; i < 60; i++) {
    size_t len = i % 7 == 3 ? 150000 + (size_t)i : 1 + (size_t)i * 4099 % 70000;
    cr_assert_eq(ferry__tfr_writer_write(w, buf, len, &err), 0, "%s", err.msg);
  }
  cr_assert_eq(ferry__tfr_writer_close(w, &err), 0, "%s", err.msg);
  free(buf);
  cr_assert_eq(ferry__tfr_index_build(path, &idx, &n, &err), 0, "%s", err.msg);
  cr_assert_eq(n, 60);
  reg("big.tfrecord", "", 7, &r);
  cr_assert_eq(r->num_records, 60);
  cr_assert_eq(r->num_splits, 9);
  ds = fx_last_dataset();
  for (size_t s = 0; s < 9; s++) {
    size_t first = s * 7, last = s < 8 ? first + 6 : 59;
    cr_assert_eq(ds->splits[s]->byte_offset, idx[first].offset);
    cr_assert_eq(ds->splits[s]->first_record, first);
    cr_assert_eq(ds->splits[s]->num_records, last - first + 1);
    cr_assert_eq(ds->splits[s]->byte_end, idx[last].offset + idx[last].size);
  }
  ferry_free(idx);
}

static int reused_logged;

static void count_reuse(int level, const char *msg, void *arg) {
  (void)level;
  (void)arg;
  if (strstr(msg, "reused") != NULL)
    reused_logged++;
}

/* Registers every .tfrecord file of the directory, decoded raw and
 * batched by `batch` (another pipeline over the same files), and returns
 * its splits. */
static Ferry__V1__JournalRegisterDataset *reg_batch(int batch, uint32_t per) {
  char spec[512];
  ferry_error_t err = {0};
  Ferry__V1__RegisterDatasetResponse *r;
  snprintf(spec, sizeof(spec),
           "tfrecord(\"%s/*.tfrecord\") | decode(raw, 1, 1, 1) | batch(%d)",
           fx_dir, batch);
  cr_assert_eq(fx_register(D, spec, per, &r, 0, &err), 0, "%s", err.msg);
  return fx_last_dataset();
}

static void same_splits(const Ferry__V1__JournalRegisterDataset *a,
                        const Ferry__V1__JournalRegisterDataset *b) {
  cr_assert_eq(a->n_splits, b->n_splits);
  for (size_t i = 0; i < a->n_splits; i++) {
    cr_assert_eq(a->splits[i]->file_index, b->splits[i]->file_index);
    cr_assert_eq(a->splits[i]->byte_offset, b->splits[i]->byte_offset);
    cr_assert_eq(a->splits[i]->byte_end, b->splits[i]->byte_end);
    cr_assert_eq(a->splits[i]->first_record, b->splits[i]->first_record);
    cr_assert_eq(a->splits[i]->num_records, b->splits[i]->num_records);
  }
}

/* Sets the file's modification time `ago_s` seconds back. */
static void age(const char *name, int ago_s) {
  char path[256];
  struct timespec t[2];
  snprintf(path, sizeof(path), "%s/%s", fx_dir, name);
  clock_gettime(CLOCK_REALTIME, &t[0]);
  t[0].tv_sec -= ago_s;
  t[1] = t[0];
  cr_assert_eq(utimensat(AT_FDCWD, path, t, 0), 0);
}

/* Another pipeline over the same, unchanged files reuses their scan; a
 * file that changed, one modified right before its scan (its time may
 * not tick on the next change), or another split size is scanned again. */
Test(dispatcher, datasets_over_the_same_files_share_the_scan) {
  D = fx_state(1000, 1000, 1000, 10);
  fx_write("a.tfrecord", 35, FERRY_COMPRESSION_NONE);
  fx_write("b.tfrecord", 20, FERRY_COMPRESSION_NONE);
  age("a.tfrecord", 10);
  age("b.tfrecord", 10);
  ferry_log_set_callback(count_reuse, NULL);
  ferry_log_set_level(FERRY_LOG_DEBUG);
  Ferry__V1__JournalRegisterDataset *d1 = reg_batch(4, 0);
  cr_assert_eq(reused_logged, 0);
  cr_assert_eq(d1->n_splits, 6);
  Ferry__V1__JournalRegisterDataset *d2 = reg_batch(8, 0);
  cr_assert_eq(reused_logged, 2, "both files' scans reused");
  same_splits(d1, d2);
  /* b rewritten: scanned again, a still reused. */
  fx_write("b.tfrecord", 30, FERRY_COMPRESSION_NONE);
  Ferry__V1__JournalRegisterDataset *d3 = reg_batch(16, 0);
  cr_assert_eq(reused_logged, 3);
  cr_assert_eq(d3->n_splits, 7);
  cr_assert_eq(d3->splits[6]->num_records, 10);
  cr_assert_eq(d3->splits[6]->first_record, 20);
  /* b was modified just before that scan: not shared. */
  Ferry__V1__JournalRegisterDataset *d4 = reg_batch(64, 0);
  cr_assert_eq(reused_logged, 4);
  same_splits(d3, d4);
  /* Another split size: no reuse. */
  Ferry__V1__JournalRegisterDataset *d5 = reg_batch(32, 5);
  cr_assert_eq(reused_logged, 4);
  cr_assert_eq(d5->n_splits, 13);
  ferry_log_set_callback(NULL, NULL);
  ferry_log_set_level(FERRY_LOG_INFO);
}

Test(dispatcher, compressed_file_is_one_split_of_unknown_count) {
  Ferry__V1__RegisterDatasetResponse *r;
  Ferry__V1__JournalRegisterDataset *ds;

  D = fx_state(1000, 1000, 1000, 16);
  fx_write("g.tfrecord", 100, FERRY_COMPRESSION_GZIP);
  reg("g.tfrecord", ", compression=gzip", 0, &r);
  cr_assert_eq(r->num_splits, 1);
  cr_assert_eq(r->num_records, 0);
  ds = fx_last_dataset();
  cr_assert_eq(ds->splits[0]->num_records, 0);
  cr_assert_eq(ds->splits[0]->byte_offset, 0);
  cr_assert_eq(ds->splits[0]->byte_end, 0);

  /* AUTO detects a zlib stream, and scans a plain file normally. */
  fx_write("z.tfrecord", 100, FERRY_COMPRESSION_ZLIB);
  fx_write("p.tfrecord", 100, FERRY_COMPRESSION_NONE);
  reg("[pz].tfrecord", ", compression=auto", 0, &r);
  ds = fx_last_dataset();
  cr_assert_eq(r->num_splits, 8); /* p: 7 splits of 16 or less, z: 1 */
  cr_assert_eq(r->num_records, 100);
  cr_assert_eq(ds->splits[7]->file_index, 1);
  cr_assert_eq(ds->splits[7]->num_records, 0);
}

Test(dispatcher, corrupt_header_ends_the_scan_with_a_tail_split) {
  ferry_tfr_index_entry_t *idx;
  size_t n;
  ferry_error_t err = {0};
  Ferry__V1__RegisterDatasetResponse *r;
  Ferry__V1__JournalRegisterDataset *ds;
  const char *p;
  FILE *f;

  D = fx_state(1000, 1000, 1000, 16);
  p = fx_write("c.tfrecord", 100, FERRY_COMPRESSION_NONE);
  cr_assert_eq(ferry__tfr_index_build(p, &idx, &n, &err), 0, "%s", err.msg);
  f = fopen(p, "r+b");
  fseek(f, (long)idx[40].offset + 9, SEEK_SET); /* inside the length CRC */
  fputc(0x5a ^ fgetc(f), f);
  fseek(f, (long)idx[40].offset + 9, SEEK_SET);
  fputc(0xff, f);
  fclose(f);
  reg("c.tfrecord", "", 0, &r);
  ds = fx_last_dataset();
  cr_assert_eq(r->num_splits, 4, "16 + 16 + 8 records, then the tail");
  cr_assert_eq(r->num_records, 40);
  cr_assert_eq(ds->splits[2]->num_records, 8);
  cr_assert_eq(ds->splits[2]->byte_end, idx[40].offset);
  cr_assert_eq(ds->splits[3]->byte_offset, idx[40].offset);
  cr_assert_eq(ds->splits[3]->first_record, 40);
  cr_assert_eq(ds->splits[3]->num_records, 0);
  cr_assert_eq(ds->splits[3]->byte_end, 0);
  ferry_free(idx);
}

Test(dispatcher, truncated_file_gets_a_tail_split) {
  Ferry__V1__RegisterDatasetResponse *r;
  Ferry__V1__JournalRegisterDataset *ds;
  const char *p;
  struct stat st;

  D = fx_state(1000, 1000, 1000, 64);
  p = fx_write("t.tfrecord", 50, FERRY_COMPRESSION_NONE);
  cr_assert_eq(stat(p, &st), 0);
  cr_assert_eq(truncate(p, st.st_size - 3), 0);
  reg("t.tfrecord", "", 0, &r);
  ds = fx_last_dataset();
  cr_assert_eq(r->num_splits, 2);
  cr_assert_eq(ds->splits[0]->num_records, 49);
  cr_assert_eq(ds->splits[1]->first_record, 49);
  cr_assert_eq(ds->splits[1]->num_records, 0);
}

Test(dispatcher, missing_file_is_named) {
  Ferry__V1__RegisterDatasetResponse *r;
  ferry_error_t err = {0};
  char spec[512];

  D = fx_state(1000, 1000, 1000, 64);
  snprintf(spec, sizeof(spec),
           "tfrecord(\"%s/nope-*.tfrecord\") | decode(raw, 1, 1, 1)", fx_dir);
  cr_assert_eq(fx_register(D, spec, 0, &r, 0, &err), FERRY_ENOENT);
  cr_assert(strstr(err.msg, "nope-*.tfrecord") != NULL, "%s", err.msg);
  cr_assert_eq(fx_entries.n, 0, "a failed registration is not journaled");

  fx_write("empty.tfrecord", 0, FERRY_COMPRESSION_NONE);
  snprintf(spec, sizeof(spec),
           "tfrecord(\"%s/empty.tfrecord\") | decode(raw, 1, 1, 1)", fx_dir);
  cr_assert_eq(fx_register(D, spec, 0, &r, 0, &err), FERRY_EINVAL);
  cr_assert(strstr(err.msg, "no records") != NULL, "%s", err.msg);
}

Test(dispatcher, same_spec_same_id) {
  Ferry__V1__RegisterDatasetResponse *r1, *r2;
  ferry_error_t err = {0};
  char spec[512];

  D = fx_state(1000, 1000, 1000, 64);
  fx_write("a.tfrecord", 100, FERRY_COMPRESSION_NONE);
  reg("a.tfrecord", "", 0, &r1);
  snprintf(spec, sizeof(spec),
           "tfrecord( \"%s/a.tfrecord\" )|decode(raw,1,1,1)", fx_dir);
  cr_assert_eq(fx_register(D, spec, 0, &r2, 0, &err), 0, "%s", err.msg);
  cr_assert_str_eq(r1->dataset_id, r2->dataset_id);
  cr_assert_eq(r2->num_splits, r1->num_splits);
  cr_assert_eq(fx_entries.n, 1, "registered once");
  cr_assert_eq(fx_status(D, 0)->datasets, 1);
}

/* ---- Assignment and leasing -------------------------------------------- */

/* A dataset of `splits` splits of 10 records each. */
static const char *dataset(int splits) {
  D = fx_state(1000, 1000, 5000, 10);
  fx_write("d.tfrecord", splits * 10, FERRY_COMPRESSION_NONE);
  return reg("d.tfrecord", "", 0, NULL);
}

/* Workers "a" and "b" registered at 0, and a one-epoch job of `mode`
 * (error policy fail) over dataset(splits) with its first client. */
typedef struct two_s {
  const char *id;
  Ferry__V1__WorkerHeartbeatResponse *a, *b;
  Ferry__V1__GetOrCreateJobResponse *j;
} two_t;

static two_t two_workers(int splits, int mode) {
  two_t t;
  t.id = dataset(splits);
  t.a = fx_worker(D, 0, "a", NULL, 0, false, 0);
  t.b = fx_worker(D, 0, "b", NULL, 0, false, 0);
  t.j = fx_job(D, t.id, "", mode, 1, FAIL, 0);
  return t;
}

static uint32_t worker_tasks(Ferry__V1__GetStatusResponse *s, uint64_t id) {
  for (size_t i = 0; i < s->n_workers; i++)
    if (s->workers[i]->worker_id == id)
      return s->workers[i]->tasks;
  cr_assert_fail("worker %llu not in status", (unsigned long long)id);
  return 0;
}

Test(dispatcher, leases_balance_over_workers) {
  const char *id = dataset(8);
  Ferry__V1__GetOrCreateJobResponse *j;
  Ferry__V1__ClientHeartbeatResponse *c;
  Ferry__V1__WorkerHeartbeatResponse *w1, *w2;
  Ferry__V1__GetStatusResponse *s;

  w1 = fx_worker(D, 0, "w1:1", NULL, 0, false, 0);
  w2 = fx_worker(D, 0, "w2:1", NULL, 0, false, 0);
  cr_assert_neq(w1->worker_id, w2->worker_id);
  j = fx_job(D, id, "", DIST, 1, FAIL, 0);
  cr_assert(j->created);
  cr_assert_eq(j->records_per_epoch, 80);
  cr_assert_not_null(j->spec);
  c = fx_client(D, j->job_id, j->client_id, 4, NULL, 0, false, 10);
  cr_assert_eq(c->n_assignments, 4);
  cr_assert_eq(c->epoch, 0);
  cr_assert_not(c->epoch_exhausted);
  cr_assert_eq(c->n_workers, 2);
  for (size_t i = 0; i < 4; i++) {
    cr_assert_eq(c->assignments[i]->lease, 1);
    cr_assert_eq(c->assignments[i]->num_records, 10);
    cr_assert_neq(c->assignments[i]->worker_id, 0);
    cr_assert_str_neq(c->assignments[i]->worker_address, "");
  }
  s = fx_status(D, 10);
  cr_assert_eq(worker_tasks(s, w1->worker_id), 2);
  cr_assert_eq(worker_tasks(s, w2->worker_id), 2);

  w1 = fx_worker(D, w1->worker_id, "w1:1", NULL, 0, false, 20);
  cr_assert_eq(w1->n_new_tasks, 2);
  cr_assert_eq(w1->heartbeat_ms, 1000);
  for (size_t i = 0; i < 2; i++) {
    Ferry__V1__Task *t = w1->new_tasks[i];
    cr_assert_eq(t->job_id, j->job_id);
    cr_assert_eq(t->client_id, j->client_id);
    cr_assert_eq(t->start, 0);
    cr_assert_eq(t->lease, 1);
    cr_assert_eq(t->split->num_records, 10);
    cr_assert_eq(t->split->first_record, t->split->index * 10);
    cr_assert(strstr(t->file, "d.tfrecord") != NULL);
    cr_assert_gt(t->spec.len, 0);
  }
  /* Listed tasks are not sent again. */
  {
    fx_task_t t[2] = {TASK(j->job_id, 0, w1->new_tasks[0]->split->index, 1),
                      TASK(j->job_id, 0, w1->new_tasks[1]->split->index, 1)};
    w1 = fx_worker(D, w1->worker_id, "w1:1", t, 2, false, 30);
    cr_assert_eq(w1->n_new_tasks, 0);
    cr_assert_eq(w1->n_cancelled, 0);
  }
}

Test(dispatcher, rows_wait_for_a_worker) {
  const char *id = dataset(4);
  Ferry__V1__GetOrCreateJobResponse *j = fx_job(D, id, "", DIST, 1, FAIL, 0);
  Ferry__V1__ClientHeartbeatResponse *c;
  Ferry__V1__WorkerHeartbeatResponse *w;

  c = fx_client(D, j->job_id, j->client_id, 2, NULL, 0, false, 0);
  cr_assert_eq(c->n_assignments, 2);
  cr_assert_eq(c->assignments[0]->worker_id, 0);
  cr_assert_eq(c->assignments[0]->lease, 0);
  w = fx_worker(D, 0, "w:1", NULL, 0, false, 10);
  cr_assert_eq(w->n_new_tasks, 2, "bound rows are leased at registration");
  c = fx_client(D, j->job_id, j->client_id, 0, NULL, 0, false, 20);
  cr_assert_eq(c->n_assignments, 2);
  cr_assert_eq(c->assignments[0]->worker_id, w->worker_id);
  cr_assert_eq(c->assignments[0]->lease, 1);
}

/* A worker's heartbeat request listing `n` tasks of `job` (lease 1). */
static Ferry__V1__WorkerHeartbeatRequest *wreq(uint64_t id, uint64_t job,
                                               const uint32_t *splits,
                                               size_t n, bool draining) {
  Ferry__V1__WorkerHeartbeatRequest *r =
      ferry__arena_alloc(&fx_arena, sizeof(*r));
  Ferry__V1__TaskProgress **tp =
      ferry__arena_alloc(&fx_arena, (n + 1) * sizeof(*tp));
  ferry__v1__worker_heartbeat_request__init(r);
  for (size_t i = 0; i < n; i++) {
    tp[i] = ferry__arena_alloc(&fx_arena, sizeof(**tp));
    ferry__v1__task_progress__init(tp[i]);
    tp[i]->job_id = job;
    tp[i]->split = splits[i];
    tp[i]->lease = 1;
  }
  r->worker_id = id;
  r->address = (char *)"w:1";
  r->tasks = tp;
  r->n_tasks = n;
  r->draining = draining;
  return r;
}

static Ferry__V1__WorkerHeartbeatResponse *wbeat(
    const Ferry__V1__WorkerHeartbeatRequest *req, int64_t now) {
  Ferry__V1__WorkerHeartbeatResponse *r =
      ferry__arena_alloc(&fx_arena, sizeof(*r));
  ferry_error_t err = {0};
  ferry__v1__worker_heartbeat_response__init(r);
  cr_assert_eq(ferry__disp_worker_heartbeat(D, req, r, &fx_arena, now, &err),
               0, "%s", err.msg);
  return r;
}

/* Re-evaluates a waiting heartbeat; returns whether it would be answered
 * now, and the answer in *out. */
static bool wpoll(const Ferry__V1__WorkerHeartbeatRequest *req, int64_t now,
                  Ferry__V1__WorkerHeartbeatResponse **out) {
  ferry_error_t err = {0};
  *out = ferry__arena_alloc(&fx_arena, sizeof(**out));
  ferry__v1__worker_heartbeat_response__init(*out);
  bool news = ferry__disp_worker_poll(D, req, *out, &fx_arena, now, &err);
  cr_assert_eq(err.code, 0, "%s", err.msg);
  return news;
}

/* Long poll: which heartbeats may wait, and what wakes them. */
Test(dispatcher, idle_worker_heartbeats_wait_for_news) {
  const char *id = dataset(4);
  Ferry__V1__WorkerHeartbeatRequest *q;
  Ferry__V1__WorkerHeartbeatResponse *r;

  /* Registration, and the first heartbeat this process answers, never
   * wait: they tell the worker its id and the interval. */
  q = wreq(0, 0, NULL, 0, false);
  r = wbeat(q, 0);
  cr_assert_not(ferry__disp_worker_may_wait(D, q, r));
  uint64_t w = r->worker_id;
  q = wreq(w, 0, NULL, 0, false);
  r = wbeat(q, 10);
  cr_assert(ferry__disp_worker_may_wait(D, q, r), "nothing to tell: wait");
  uint64_t changes = ferry__disp_changes(D);
  cr_assert_not(wpoll(q, 20, &r), "no news yet");
  cr_assert_eq(ferry__disp_changes(D), changes, "a poll records nothing");

  /* A client takes two splits: the waiting call has news. */
  Ferry__V1__GetOrCreateJobResponse *j = fx_job(D, id, "", DIST, 1, FAIL, 30);
  Ferry__V1__ClientHeartbeatResponse *c =
      fx_client(D, j->job_id, j->client_id, 2, NULL, 0, false, 40);
  cr_assert_eq(c->n_assignments, 2);
  cr_assert_gt(ferry__disp_changes(D), changes);
  cr_assert(wpoll(q, 50, &r), "new leases wake the waiting heartbeat");
  cr_assert_eq(r->n_new_tasks, 2);
  cr_assert_eq(r->worker_id, w);
  cr_assert_eq(r->heartbeat_ms, 1000);

  /* The worker lists them: nothing more to say, it may wait again. */
  uint32_t splits[2] = {r->new_tasks[0]->split->index,
                        r->new_tasks[1]->split->index};
  q = wreq(w, j->job_id, splits, 2, false);
  r = wbeat(q, 60);
  cr_assert(ferry__disp_worker_may_wait(D, q, r));
  cr_assert_not(wpoll(q, 70, &r));

  /* The client delivered one split whole: its task is cancelled. The
   * worker listed it unfinished (a stale copy still running): wake. */
  uint64_t prog[4] = {0, splits[0], 10, w};
  fx_client(D, j->job_id, j->client_id, 0, prog, 1, false, 80);
  cr_assert(wpoll(q, 90, &r), "a done split wakes the waiting heartbeat");
  cr_assert_eq(r->n_cancelled, 1);
  cr_assert_eq(r->cancelled[0]->split, splits[0]);
  cr_assert_eq(r->n_new_tasks, 0);
  /* Listed finished, its cancellation stops no work: no wake, though the
   * answer, when it comes, cancels it. */
  q->tasks[0]->finished = true;
  q->tasks[0]->produced = 10;
  cr_assert_not(wpoll(q, 95, &r), "a finished task's end woke the call");
  cr_assert_eq(r->n_cancelled, 1);
  q->tasks[0]->finished = false;

  /* An answer with news, or a draining worker, never waits. */
  r = wbeat(q, 100);
  cr_assert_eq(r->n_cancelled, 1);
  cr_assert_not(ferry__disp_worker_may_wait(D, q, r));
  q = wreq(w, j->job_id, splits + 1, 1, true);
  r = wbeat(q, 110);
  cr_assert_not(ferry__disp_worker_may_wait(D, q, r));

  /* A lost worker's waiting call is answered: it must register again. */
  q = wreq(w, j->job_id, splits + 1, 1, false);
  r = wbeat(q, 120);
  cr_assert(ferry__disp_worker_may_wait(D, q, r));
  ferry__disp_tick(D, 120 + 1000);
  cr_assert(wpoll(q, 1130, &r), "a lost worker's call is answered");
}

Test(dispatcher, draining_worker_gets_no_new_leases) {
  const char *id = dataset(4);
  Ferry__V1__WorkerHeartbeatResponse *w1 = fx_worker(D, 0, "a", NULL, 0,
                                                     true, 0);
  Ferry__V1__WorkerHeartbeatResponse *w2 = fx_worker(D, 0, "b", NULL, 0,
                                                     false, 0);
  Ferry__V1__GetOrCreateJobResponse *j = fx_job(D, id, "", DIST, 1, FAIL, 0);
  Ferry__V1__ClientHeartbeatResponse *c =
      fx_client(D, j->job_id, j->client_id, 4, NULL, 0, false, 0);
  for (size_t i = 0; i < c->n_assignments; i++)
    cr_assert_eq(c->assignments[i]->worker_id, w2->worker_id);
  cr_assert_str_eq(fx_status(D, 0)->workers[0]->state, "draining");
  (void)w1;
}

Test(dispatcher, lost_worker_rows_are_released_from_delivered) {
  two_t ab = two_workers(2, DIST);
  Ferry__V1__WorkerHeartbeatResponse *a = ab.a, *b = ab.b;
  Ferry__V1__GetOrCreateJobResponse *j = ab.j;
  Ferry__V1__ClientHeartbeatResponse *c;
  uint32_t split_a = 0;
  uint64_t prog[4];

  c = fx_client(D, j->job_id, j->client_id, 2, NULL, 0, false, 0);
  for (size_t i = 0; i < 2; i++)
    if (c->assignments[i]->worker_id == a->worker_id)
      split_a = c->assignments[i]->split;
  prog[0] = 0, prog[1] = split_a, prog[2] = 7, prog[3] = 0;
  fx_client(D, j->job_id, j->client_id, 0, prog, 1, false, 500);
  b = fx_worker(D, b->worker_id, "b", NULL, 0, false, 900);
  cr_assert_eq(b->n_new_tasks, 1);
  {
    fx_task_t t = TASK(j->job_id, 0, b->new_tasks[0]->split->index, 1);
    fx_client(D, j->job_id, j->client_id, 0, NULL, 0, false, 1100);
    b = fx_worker(D, b->worker_id, "b", &t, 1, false, 1200);
    ferry__disp_tick(D, 1200); /* a: no heartbeat since 0 */
    b = fx_worker(D, b->worker_id, "b", &t, 1, false, 1300);
  }
  cr_assert_eq(b->n_new_tasks, 1);
  cr_assert_eq(b->new_tasks[0]->split->index, split_a);
  cr_assert_eq(b->new_tasks[0]->start, 7, "resumes at delivered");
  cr_assert_eq(b->new_tasks[0]->lease, 2);
  cr_assert_eq(b->new_tasks[0]->client_id, j->client_id);
  cr_assert_str_eq(fx_status(D, 1300)->workers[0]->state, "lost");
  c = fx_client(D, j->job_id, j->client_id, 0, NULL, 0, false, 1300);
  cr_assert_eq(c->n_assignments, 2);
  for (size_t i = 0; i < 2; i++)
    cr_assert_eq(c->assignments[i]->worker_id, b->worker_id);
  /* The lost worker comes back: a new identity, its old task cancelled. */
  {
    fx_task_t t = TASK(j->job_id, 0, split_a, 1);
    a = fx_worker(D, a->worker_id, "a", &t, 1, false, 1400);
    cr_assert_neq(a->worker_id, 1);
    cr_assert_eq(a->n_cancelled, 1);
    cr_assert_eq(a->cancelled[0]->lease, 1);
  }
}

/* A client heartbeat restarting one split at `lease` after acknowledging
 * `delivered` of it. */
/* A ClientHeartbeat asking for a restart of `split` at `lease` (of
 * whatever lease is current with `current`). */
static Ferry__V1__ClientHeartbeatResponse *
restart_as(ferry_disp_t *d, uint64_t job, uint64_t client, uint32_t split,
           uint64_t delivered, uint64_t lease, bool current, int64_t now) {
  Ferry__V1__ClientHeartbeatRequest req =
      FERRY__V1__CLIENT_HEARTBEAT_REQUEST__INIT;
  Ferry__V1__SplitProgress p = FERRY__V1__SPLIT_PROGRESS__INIT, *pp = &p;
  Ferry__V1__ClientHeartbeatResponse *resp;
  ferry_error_t err = {0};
  p.split = split;
  p.delivered = delivered;
  p.restart = true;
  p.lease = lease;
  p.restart_current = current;
  req.job_id = job;
  req.client_id = client;
  req.progress = &pp;
  req.n_progress = 1;
  fx_sign(&req);
  resp = ferry__arena_alloc(&fx_arena, sizeof(*resp));
  ferry__v1__client_heartbeat_response__init(resp);
  cr_assert_eq(ferry__disp_client_heartbeat(d, &req, resp, &fx_arena, now,
                                            &err),
               0, "%s", err.msg);
  return resp;
}

static Ferry__V1__ClientHeartbeatResponse *restart(ferry_disp_t *d,
                                                  uint64_t job,
                                                  uint64_t client,
                                                  uint32_t split,
                                                  uint64_t delivered,
                                                  uint64_t lease,
                                                  int64_t now) {
  return restart_as(d, job, client, split, delivered, lease, false, now);
}

/* The assignment of `split` in `c`, or NULL. */
static const Ferry__V1__Assignment *
find_assignment(const Ferry__V1__ClientHeartbeatResponse *c, uint32_t split) {
  for (size_t i = 0; i < c->n_assignments; i++)
    if (c->assignments[i]->split == split)
      return c->assignments[i];
  return NULL;
}

/* The assignment of `split` in `c`, which must be there. */
static const Ferry__V1__Assignment *
assignment_of(const Ferry__V1__ClientHeartbeatResponse *c, uint32_t split) {
  const Ferry__V1__Assignment *as = find_assignment(c, split);
  cr_assert_not_null(as, "split %u not assigned", split);
  return as;
}

Test(dispatcher, restart_releases_from_delivered) {
  two_t ab = two_workers(2, DIST);
  const char *id = ab.id;
  Ferry__V1__WorkerHeartbeatResponse *a = ab.a, *b = ab.b;
  Ferry__V1__GetOrCreateJobResponse *j = ab.j;
  Ferry__V1__ClientHeartbeatResponse *c;
  const Ferry__V1__Assignment *as;
  uint32_t split_a = 0, split_b = 0;
  size_t before;

  c = fx_client(D, j->job_id, j->client_id, 2, NULL, 0, false, 0);
  cr_assert_eq(c->n_assignments, 2);
  for (size_t i = 0; i < 2; i++)
    if (c->assignments[i]->worker_id == a->worker_id)
      split_a = c->assignments[i]->split;
    else
      split_b = c->assignments[i]->split;
  {
    fx_task_t t = TASK(j->job_id, 0, split_a, 1);
    a = fx_worker(D, a->worker_id, "a", &t, 1, false, 10);
    cr_assert_eq(a->n_cancelled, 0);
  }
  /* The client lost records of split_a in transit after taking 4. */
  before = fx_entries.n;
  c = restart(D, j->job_id, j->client_id, split_a, 4, 1, 20);
  as = assignment_of(c, split_a);
  cr_assert_eq(as->lease, 2, "a restart is a new lease");
  cr_assert_eq(as->start, 4, "from delivered");
  cr_assert_eq(assignment_of(c, split_b)->lease, 1, "other rows unchanged");
  /* Not to the worker whose lease failed (it is suspected and avoided),
   * though it ties with b on load. */
  cr_assert_eq(as->worker_id, b->worker_id);
  cr_assert_eq(fx_entries.n, before + 1,
               "only the progress is journaled, not the re-lease");
  {
    /* a's next heartbeat cancels the old task and gives it nothing new;
     * b starts the new lease at delivered. */
    fx_task_t t = TASK(j->job_id, 0, split_a, 1);
    a = fx_worker(D, a->worker_id, "a", &t, 1, false, 30);
    cr_assert_eq(a->n_cancelled, 1);
    cr_assert_eq(a->cancelled[0]->split, split_a);
    cr_assert_eq(a->cancelled[0]->lease, 1);
    cr_assert_eq(a->n_new_tasks, 0);
    b = fx_worker(D, b->worker_id, "b", NULL, 0, false, 30);
    cr_assert_eq(b->n_new_tasks, 2);
    for (size_t i = 0; i < 2; i++) {
      if (b->new_tasks[i]->split->index != split_a)
        continue;
      cr_assert_eq(b->new_tasks[i]->lease, 2);
      cr_assert_eq(b->new_tasks[i]->start, 4, "resumes at delivered");
      cr_assert_eq(b->new_tasks[i]->client_id, j->client_id);
    }
  }
  /* A stale restart (the old lease, e.g. a retried request) changes
   * nothing and commits nothing. */
  before = fx_entries.n;
  c = restart(D, j->job_id, j->client_id, split_a, 4, 1, 40);
  cr_assert_eq(assignment_of(c, split_a)->lease, 2);
  cr_assert_eq(fx_entries.n, before, "a stale restart is not journaled");
  /* Nor does a restart of a row not bound to the client. */
  {
    Ferry__V1__GetOrCreateJobResponse *o = fx_job(D, id, "", DIST, 1, FAIL,
                                                  40);
    before = fx_entries.n;
    restart(D, o->job_id, o->client_id, split_a, 0, 2, 40);
    cr_assert_eq(fx_entries.n, before, "another client's restart");
  }
  /* A restart at the current lease moves it back to a: a heartbeated
   * after its suspicion, and b is now the one avoided. */
  c = restart(D, j->job_id, j->client_id, split_a, 6, 2, 50);
  as = assignment_of(c, split_a);
  cr_assert_eq(as->lease, 3);
  cr_assert_eq(as->worker_id, a->worker_id);
  cr_assert_eq(as->start, 6);

  /* Replaying the journal gives the same journaled state; leases are not
   * journaled, so after the boot entry every row is leased again with a
   * generation above every earlier one. */
  {
    ferry_disp_config_t cfg;
    ferry_disp_t *r;
    ferry_error_t err = {0};
    uint8_t *sa, *sb;
    size_t la, lb;
    Ferry__V1__WorkerHeartbeatResponse *wr;
    ferry__disp_config_init(&cfg);
    cfg.worker_timeout_ms = cfg.client_timeout_ms = 1000;
    cfg.job_gc_ms = 5000;
    cfg.records_per_split = 10;
    cr_assert_eq(ferry__disp_new(&cfg, 0, &r), 0);
    for (size_t i = 0; i < fx_entries.n; i++)
      cr_assert_eq(ferry__disp_apply(r, fx_entries.e[i], fx_entries.len[i],
                                     60, &err),
                   0, "entry %zu: %s", i, err.msg);
    ferry__disp_replayed(r, 60);
    cr_assert_eq(ferry__disp_boot(r, &err), 0, "%s", err.msg);
    sa = fx_status_bytes(D, 60, &la);
    sb = fx_status_bytes(r, 60, &lb);
    cr_assert_eq(la, lb);
    cr_assert_arr_eq(sa, sb, la, "replayed status differs from the live one");
    {
      fx_task_t t = TASK(j->job_id, 0, split_a, 3);
      wr = fx_worker(r, a->worker_id, "a", &t, 1, false, 70);
    }
    cr_assert_eq(wr->n_cancelled, 1, "the old process's lease is cancelled");
    cr_assert_geq(wr->n_new_tasks, 1);
    for (size_t i = 0; i < wr->n_new_tasks; i++) {
      cr_assert_geq(wr->new_tasks[i]->lease, (uint64_t)1 << 32);
      if (wr->new_tasks[i]->split->index == split_a)
        cr_assert_eq(wr->new_tasks[i]->start, 6);
    }
    ferry__disp_free(r);
  }
}

/* SplitProgress.restart_current: a restart naming an older lease is stale
 * and ignored, unless it asks for whatever lease is current (the client
 * was fenced, or its stream to the row's worker broke: it may never have
 * heard of the newer lease whose chunks were lost with that stream, chaos
 * seed 20266); a lease the client cannot know of is never restarted. */
Test(dispatcher, restart_of_the_current_lease) {
  two_t ab = two_workers(2, DIST);
  Ferry__V1__GetOrCreateJobResponse *j = ab.j;
  Ferry__V1__ClientHeartbeatResponse *c;
  uint64_t wa = ab.a->worker_id, wb = ab.b->worker_id;
  size_t before;

  c = fx_client(D, j->job_id, j->client_id, 2, NULL, 0, false, 0);
  cr_assert_eq(c->n_assignments, 2);
  uint32_t split = c->assignments[0]->split;
  cr_assert_eq(assignment_of(c, split)->lease, 1);
  c = restart(D, j->job_id, j->client_id, split, 4, 1, 10);
  uint64_t l2 = assignment_of(c, split)->lease;
  cr_assert_gt(l2, 1, "the named lease is restarted");
  /* Both workers beat again: neither is suspected any more. */
  fx_worker(D, wa, "a", NULL, 0, false, 5000);
  fx_worker(D, wb, "b", NULL, 0, false, 5000);
  before = fx_entries.n;
  c = restart(D, j->job_id, j->client_id, split, 4, 1, 5010);
  cr_assert_eq(assignment_of(c, split)->lease, l2, "stale: ignored");
  cr_assert_eq(fx_entries.n, before, "nor journaled");
  c = restart_as(D, j->job_id, j->client_id, split, 6, 1, true, 5020);
  uint64_t l3 = assignment_of(c, split)->lease;
  cr_assert_gt(l3, l2, "whatever lease is current is restarted");
  cr_assert_eq(assignment_of(c, split)->start, 6, "from delivered");
  fx_worker(D, wa, "a", NULL, 0, false, 10000);
  fx_worker(D, wb, "b", NULL, 0, false, 10000);
  c = restart_as(D, j->job_id, j->client_id, split, 6, l3 + 5, true, 10010);
  cr_assert_eq(assignment_of(c, split)->lease, l3,
               "a lease the client cannot know of: ignored");
}

/* A worker whose chunks of a lease went into a stream that ended early
 * (the client left it, e.g. after it broke, before this lease existed)
 * reports the task (TaskProgress.resend): the row is leased again from
 * what the client acknowledged, on any worker and without suspecting this
 * one; a report naming a lease the row no longer has is ignored. */
Test(dispatcher, chunks_sent_into_a_left_stream_are_leased_again) {
  two_t ab = two_workers(2, DIST);
  Ferry__V1__GetOrCreateJobResponse *j = ab.j;
  Ferry__V1__ClientHeartbeatResponse *c;
  uint64_t wa = ab.a->worker_id;

  c = fx_client(D, j->job_id, j->client_id, 2, NULL, 0, false, 0);
  cr_assert_eq(c->n_assignments, 2);
  const Ferry__V1__Assignment *as = c->assignments[0];
  if (as->worker_id != wa)
    as = c->assignments[1];
  cr_assert_eq(as->worker_id, wa);
  uint32_t split = as->split;
  uint64_t l1 = as->lease;
  uint64_t prog[4] = {0, split, 4, 0};
  fx_client(D, j->job_id, j->client_id, 0, prog, 1, false, 100);
  fx_task_t t = TASK(j->job_id, 0, split, l1);
  t.produced = 10;
  t.finished = true;
  t.resend = true;
  Ferry__V1__WorkerHeartbeatResponse *a =
      fx_worker(D, wa, "a", &t, 1, false, 200);
  c = fx_client(D, j->job_id, j->client_id, 0, NULL, 0, false, 300);
  const Ferry__V1__Assignment *now = assignment_of(c, split);
  cr_assert_gt(now->lease, l1, "leased again");
  cr_assert_eq(now->start, 4, "from what the client acknowledged");
  /* The same report again (the worker has not seen the answer yet) names
   * a lease the row no longer has: nothing changes. */
  uint64_t l2 = now->lease;
  a = fx_worker(D, wa, "a", &t, 1, false, 400);
  (void)a;
  c = fx_client(D, j->job_id, j->client_id, 0, NULL, 0, false, 500);
  cr_assert_eq(assignment_of(c, split)->lease, l2, "stale: ignored");
  cr_assert_str_neq(fx_status(D, 500)->workers[0]->state, "suspect");
}

Test(dispatcher, lost_client_rows_return_to_the_pool) {
  const char *id = dataset(2);
  Ferry__V1__WorkerHeartbeatResponse *w = fx_worker(D, 0, "w", NULL, 0,
                                                    false, 0);
  Ferry__V1__GetOrCreateJobResponse *j1 = fx_job(D, id, "shared", DIST, 1,
                                                 FAIL, 0);
  Ferry__V1__GetOrCreateJobResponse *j2;
  Ferry__V1__ClientHeartbeatResponse *c;
  uint64_t prog[4] = {0, 0, 5, 0};
  fx_task_t t[2] = {TASK(j1->job_id, 0, 0, 1), TASK(j1->job_id, 0, 1, 1)};

  c = fx_client(D, j1->job_id, j1->client_id, 2, NULL, 0, false, 0);
  cr_assert_eq(c->n_assignments, 2);
  prog[1] = c->assignments[0]->split;
  fx_client(D, j1->job_id, j1->client_id, 0, prog, 1, false, 100);
  j2 = fx_job(D, id, "shared", DIST, 1, FAIL, 200);
  cr_assert_not(j2->created);
  cr_assert_eq(j2->job_id, j1->job_id);
  cr_assert_neq(j2->client_id, j1->client_id);
  c = fx_client(D, j2->job_id, j2->client_id, 2, NULL, 0, false, 300);
  cr_assert_eq(c->n_assignments, 0, "both rows held by client 1");
  cr_assert(c->epoch_exhausted);
  w = fx_worker(D, w->worker_id, "w", t, 2, false, 1000);
  fx_client(D, j2->job_id, j2->client_id, 0, NULL, 0, false, 1000);
  ferry__disp_tick(D, 1100); /* client 1: last heartbeat at 100 */
  w = fx_worker(D, w->worker_id, "w", t, 2, false, 1150);
  cr_assert_eq(w->n_cancelled, 2, "their stream's client is gone");
  c = fx_client(D, j2->job_id, j2->client_id, 2, NULL, 0, false, 1200);
  cr_assert_eq(c->n_assignments, 2);
  for (size_t i = 0; i < 2; i++)
    cr_assert_eq(c->assignments[i]->lease, 2);
  w = fx_worker(D, w->worker_id, "w", NULL, 0, false, 1250);
  cr_assert_eq(w->n_new_tasks, 2);
  for (size_t i = 0; i < 2; i++) {
    Ferry__V1__Task *task = w->new_tasks[i];
    cr_assert_eq(task->client_id, j2->client_id);
    cr_assert_eq(task->start, task->split->index == prog[1] ? 5 : 0);
  }
  /* What the metrics read: four leases, the last two re-grants of rows
   * leased before in the epoch; one client lost, no worker. */
  ferry_disp_counters_t n;
  ferry__disp_counters(D, &n);
  cr_assert_eq(n.leases, 4, "%llu", (unsigned long long)n.leases);
  cr_assert_eq(n.relets, 2, "%llu", (unsigned long long)n.relets);
  cr_assert_eq(n.clients_lost, 1);
  cr_assert_eq(n.workers_lost + n.workers_left, 0);
}

Test(dispatcher, leaving_client_releases_at_once) {
  const char *id = dataset(2);
  Ferry__V1__GetOrCreateJobResponse *j = fx_job(D, id, "x", DIST, 1, FAIL, 0);
  Ferry__V1__GetOrCreateJobResponse *j2;
  Ferry__V1__ClientHeartbeatResponse *c;
  Ferry__V1__GetStatusResponse *s;

  fx_client(D, j->job_id, j->client_id, 2, NULL, 0, false, 0);
  j2 = fx_job(D, id, "x", DIST, 1, FAIL, 0);
  c = fx_client(D, j->job_id, j->client_id, 0, NULL, 0, true, 10);
  cr_assert_eq(c->n_assignments, 0);
  s = fx_status(D, 10);
  cr_assert_eq(s->jobs[0]->n_clients, 1);
  cr_assert_eq(s->jobs[0]->clients[0]->client_id, j2->client_id);
  c = fx_client(D, j2->job_id, j2->client_id, 5, NULL, 0, false, 20);
  cr_assert_eq(c->n_assignments, 2);
}

Test(dispatcher, anonymous_jobs_are_private) {
  const char *id = dataset(2);
  Ferry__V1__GetOrCreateJobResponse *a = fx_job(D, id, "", DIST, 1, FAIL, 0);
  Ferry__V1__GetOrCreateJobResponse *b = fx_job(D, id, "", DIST, 1, FAIL, 0);
  Ferry__V1__GetOrCreateJobRequest req =
      FERRY__V1__GET_OR_CREATE_JOB_REQUEST__INIT;
  Ferry__V1__GetOrCreateJobResponse resp =
      FERRY__V1__GET_OR_CREATE_JOB_RESPONSE__INIT;
  Ferry__V1__JobOptions o = FERRY__V1__JOB_OPTIONS__INIT;
  ferry_error_t err = {0};

  cr_assert_neq(a->job_id, b->job_id);
  cr_assert(a->created && b->created);
  req.dataset_id = "0123456789abcdef";
  req.options = &o;
  cr_assert_eq(ferry__disp_get_or_create_job(D, &req, &resp, &fx_arena, 0,
                                             &err),
               FERRY_ENOENT);
  cr_assert(strstr(err.msg, "0123456789abcdef") != NULL);
  req.dataset_id = (char *)id;
  o.num_epochs = -2;
  cr_assert_eq(ferry__disp_get_or_create_job(D, &req, &resp, &fx_arena, 0,
                                             &err),
               FERRY_EINVAL);
}

/* ---- Epochs, modes, failure --------------------------------------------- */

/* Completes every row the client holds: the worker lists them and the
 * client reports them fully delivered. Returns the rows completed. */
static size_t complete_all(uint64_t job, uint64_t client, uint64_t wid,
                           const char *waddr, int64_t now) {
  Ferry__V1__ClientHeartbeatResponse *c =
      fx_client(D, job, client, 1000, NULL, 0, false, now);
  size_t n = c->n_assignments;
  uint64_t *prog = calloc(4 * n + 1, sizeof(uint64_t));
  for (size_t i = 0; i < n; i++) {
    prog[4 * i] = c->assignments[i]->epoch;
    prog[4 * i + 1] = c->assignments[i]->split;
    prog[4 * i + 2] = c->assignments[i]->num_records;
    prog[4 * i + 3] = c->assignments[i]->worker_id;
  }
  fx_worker(D, wid, waddr, NULL, 0, false, now);
  fx_client(D, job, client, 0, prog, n, false, now);
  free(prog);
  return n;
}

Test(dispatcher, epochs_advance_then_finish) {
  const char *id = dataset(3);
  Ferry__V1__WorkerHeartbeatResponse *w = fx_worker(D, 0, "w", NULL, 0,
                                                    false, 0);
  Ferry__V1__GetOrCreateJobResponse *j = fx_job(D, id, "", DIST, 2, FAIL, 0);
  Ferry__V1__ClientHeartbeatResponse *c;
  Ferry__V1__GetStatusResponse *s;

  cr_assert_eq(j->num_epochs, 2);
  cr_assert_eq(complete_all(j->job_id, j->client_id, w->worker_id, "w", 10),
               3);
  c = fx_client(D, j->job_id, j->client_id, 0, NULL, 0, false, 20);
  cr_assert_eq(c->epochs_done, 1);
  cr_assert_eq(c->epoch, 1);
  cr_assert_eq(c->state, RUNNING);
  s = fx_status(D, 20);
  cr_assert_eq(s->jobs[0]->delivered_all, 30);
  cr_assert_eq(s->jobs[0]->delivered, 0);
  cr_assert_eq(s->jobs[0]->total, 30);
  cr_assert_eq(complete_all(j->job_id, j->client_id, w->worker_id, "w", 30),
               3);
  c = fx_client(D, j->job_id, j->client_id, 4, NULL, 0, false, 40);
  cr_assert_eq(c->state, FINISHED);
  cr_assert_eq(c->epochs_done, 2);
  cr_assert(c->epoch_exhausted);
  cr_assert_eq(c->n_assignments, 0);
  cr_assert_eq(fx_status(D, 40)->jobs[0]->delivered_all, 60);
}

Test(dispatcher, infinite_epochs_keep_going) {
  const char *id = dataset(2);
  Ferry__V1__WorkerHeartbeatResponse *w = fx_worker(D, 0, "w", NULL, 0,
                                                    false, 0);
  Ferry__V1__GetOrCreateJobResponse *j = fx_job(D, id, "", DIST, -1, FAIL, 0);
  Ferry__V1__ClientHeartbeatResponse *c = NULL;

  cr_assert_eq(j->num_epochs, -1);
  for (int e = 0; e < 5; e++) {
    cr_assert_eq(complete_all(j->job_id, j->client_id, w->worker_id, "w",
                              10 * e),
                 2);
    c = fx_client(D, j->job_id, j->client_id, 0, NULL, 0, false, 10 * e + 5);
    cr_assert_eq(c->epochs_done, (uint32_t)e + 1);
  }
  cr_assert_eq(c->state, RUNNING);
  cr_assert_eq(c->epoch, 5);
}

Test(dispatcher, spec_repeat_sets_the_epochs) {
  Ferry__V1__GetOrCreateJobResponse *j;
  char spec[512];
  ferry_error_t err = {0};
  Ferry__V1__RegisterDatasetResponse *r;

  D = fx_state(1000, 1000, 1000, 10);
  fx_write("d.tfrecord", 20, FERRY_COMPRESSION_NONE);
  snprintf(spec, sizeof(spec),
           "tfrecord(\"%s/d.tfrecord\") | decode(raw, 1, 1, 1) | repeat(3)",
           fx_dir);
  cr_assert_eq(fx_register(D, spec, 0, &r, 0, &err), 0, "%s", err.msg);
  j = fx_job(D, r->dataset_id, "", DIST, 0, FAIL, 0);
  cr_assert_eq(j->num_epochs, 3);
}

Test(dispatcher, shuffled_split_order) {
  uint32_t a[100], b[100], c[100];
  bool seen[100] = {false};
  ferry__disp_split_order(true, 7, 0, a, 100);
  ferry__disp_split_order(true, 7, 0, b, 100);
  ferry__disp_split_order(true, 7, 1, c, 100);
  cr_assert_arr_eq(a, b, sizeof(a), "deterministic");
  cr_assert(memcmp(a, c, sizeof(a)) != 0, "differs across epochs");
  for (int i = 0; i < 100; i++) {
    cr_assert_lt(a[i], 100);
    cr_assert_not(seen[a[i]]);
    seen[a[i]] = true;
  }
  ferry__disp_split_order(false, 7, 3, c, 100);
  for (uint32_t i = 0; i < 100; i++)
    cr_assert_eq(c[i], i);
}

Test(dispatcher, shuffled_job_hands_out_the_permutation) {
  Ferry__V1__ClientHeartbeatResponse *c;
  Ferry__V1__GetOrCreateJobResponse *j;
  Ferry__V1__RegisterDatasetResponse *r;
  ferry_error_t err = {0};
  uint32_t perm[10];
  char spec[512];

  D = fx_state(1000, 1000, 1000, 10);
  fx_write("d.tfrecord", 100, FERRY_COMPRESSION_NONE);
  snprintf(spec, sizeof(spec),
           "tfrecord(\"%s/d.tfrecord\") | decode(raw, 1, 1, 1) | "
           "shuffle(seed=42)",
           fx_dir);
  cr_assert_eq(fx_register(D, spec, 0, &r, 0, &err), 0, "%s", err.msg);
  j = fx_job(D, r->dataset_id, "", DIST, 1, FAIL, 0);
  c = fx_client(D, j->job_id, j->client_id, 3, NULL, 0, false, 0);
  ferry__disp_split_order(true, 42, 0, perm, 10);
  cr_assert_eq(c->n_assignments, 3);
  for (int i = 0; i < 3; i++)
    cr_assert_eq(c->assignments[i]->split, perm[i]);
}

Test(dispatcher, parallel_epochs_rows_per_worker) {
  two_t ab = two_workers(3, PARALLEL);
  Ferry__V1__WorkerHeartbeatResponse *a = ab.a, *b = ab.b;
  Ferry__V1__GetOrCreateJobResponse *j = ab.j;
  Ferry__V1__ClientHeartbeatResponse *c;
  uint64_t prog[3 * 4];
  int on_a = 0, n = 0;

  c = fx_client(D, j->job_id, j->client_id, 100, NULL, 0, false, 0);
  cr_assert_eq(c->n_assignments, 6, "3 splits x 2 workers");
  for (size_t i = 0; i < 6; i++)
    on_a += c->assignments[i]->worker_id == a->worker_id;
  cr_assert_eq(on_a, 3);
  cr_assert_eq(fx_status(D, 0)->jobs[0]->total, 60);
  /* Worker a's rows are delivered; b is lost: its rows are dropped. */
  for (size_t i = 0; i < 6; i++) {
    if (c->assignments[i]->worker_id != a->worker_id)
      continue;
    prog[4 * n] = 0;
    prog[4 * n + 1] = c->assignments[i]->split;
    prog[4 * n + 2] = 10;
    prog[4 * n + 3] = a->worker_id;
    n++;
  }
  a = fx_worker(D, a->worker_id, "a", NULL, 0, false, 900);
  cr_assert_eq(a->n_new_tasks, 3);
  fx_client(D, j->job_id, j->client_id, 0, prog, 3, false, 900);
  c = fx_client(D, j->job_id, j->client_id, 0, NULL, 0, false, 950);
  cr_assert_eq(c->n_assignments, 3, "b's rows remain");
  ferry__disp_tick(D, 1000);
  c = fx_client(D, j->job_id, j->client_id, 0, NULL, 0, false, 1000);
  cr_assert_eq(c->state, FINISHED, "a lost worker cannot hang the job");
  (void)b;
}

Test(dispatcher, parallel_epoch_waits_for_a_worker) {
  const char *id = dataset(2);
  Ferry__V1__GetOrCreateJobResponse *j = fx_job(D, id, "", PARALLEL, 1, FAIL,
                                                0);
  Ferry__V1__ClientHeartbeatResponse *c =
      fx_client(D, j->job_id, j->client_id, 10, NULL, 0, false, 0);
  cr_assert_eq(c->n_assignments, 0);
  cr_assert_not(c->epoch_exhausted);
  fx_worker(D, 0, "a", NULL, 0, false, 10);
  c = fx_client(D, j->job_id, j->client_id, 10, NULL, 0, false, 20);
  cr_assert_eq(c->n_assignments, 2);
}

Test(dispatcher, worker_error_fails_the_job) {
  const char *id = dataset(2);
  Ferry__V1__WorkerHeartbeatResponse *w = fx_worker(D, 0, "w", NULL, 0,
                                                    false, 0);
  Ferry__V1__GetOrCreateJobResponse *j = fx_job(D, id, "", DIST, 1, FAIL, 0);
  Ferry__V1__ClientHeartbeatResponse *c;
  fx_task_t t[2] = {TASK(j->job_id, 0, 0, 1), TASK(j->job_id, 0, 1, 1)};

  fx_client(D, j->job_id, j->client_id, 2, NULL, 0, false, 0);
  t[1].error_code = FERRY_EDATACRC;
  t[1].error = "d.tfrecord: record 12 at byte offset 400: data CRC mismatch";
  w = fx_worker(D, w->worker_id, "w", t, 2, false, 10);
  cr_assert_eq(w->n_cancelled, 2, "the failed job's tasks are cancelled");
  c = fx_client(D, j->job_id, j->client_id, 2, NULL, 0, false, 20);
  cr_assert_eq(c->state, FAILED);
  cr_assert_eq(c->error_code, FERRY_EDATACRC);
  cr_assert_str_eq(c->error, t[1].error);
  cr_assert_eq(c->n_assignments, 0);
  cr_assert_str_eq(fx_status(D, 20)->jobs[0]->error, t[1].error);
}

Test(dispatcher, skipped_counts_per_job_and_file) {
  Ferry__V1__GetOrCreateJobResponse *j;
  Ferry__V1__WorkerHeartbeatResponse *w;
  Ferry__V1__GetStatusResponse *s;
  Ferry__V1__JobStatus *js;
  const char *id;
  fx_task_t t[2];

  D = fx_state(1000, 1000, 1000, 10);
  fx_write("a.tfrecord", 10, FERRY_COMPRESSION_NONE);
  fx_write("b.tfrecord", 10, FERRY_COMPRESSION_NONE);
  id = reg("*.tfrecord", "", 0, NULL);
  w = fx_worker(D, 0, "w", NULL, 0, false, 0);
  j = fx_job(D, id, "", DIST, 1, SKIP, 0);
  fx_client(D, j->job_id, j->client_id, 2, NULL, 0, false, 0);
  t[0] = (fx_task_t){j->job_id, 0, 0, 1, 5, 3, false, 0, NULL, 0, false};
  t[1] = (fx_task_t){j->job_id, 0, 1, 1, 5, 1, false, 0, NULL, 0, false};
  fx_worker(D, w->worker_id, "w", t, 2, false, 10);
  t[0].skipped = 4; /* cumulative: one more */
  fx_worker(D, w->worker_id, "w", t, 2, false, 20);
  fx_worker(D, w->worker_id, "w", t, 2, false, 30); /* repeated: no change */
  s = fx_status(D, 30);
  js = s->jobs[0];
  cr_assert_eq(js->skipped, 5);
  cr_assert_eq(js->n_skipped_by_file, 2);
  cr_assert(strstr(js->skipped_by_file[0]->file, "a.tfrecord") != NULL);
  cr_assert_eq(js->skipped_by_file[0]->skipped, 4);
  cr_assert_eq(js->skipped_by_file[1]->skipped, 1);
  /* A stale lease's counts are ignored. */
  t[0].lease = 9;
  t[0].skipped = 100;
  fx_worker(D, w->worker_id, "w", t, 2, false, 40);
  cr_assert_eq(fx_status(D, 40)->jobs[0]->skipped, 5);
}

Test(dispatcher, unknown_count_known_when_finished) {
  Ferry__V1__GetOrCreateJobResponse *j;
  Ferry__V1__WorkerHeartbeatResponse *w;
  Ferry__V1__ClientHeartbeatResponse *c;
  const char *id;
  uint64_t prog[4] = {0, 0, 100, 0};
  fx_task_t t = {0};

  D = fx_state(1000, 1000, 1000, 10);
  fx_write("g.tfrecord", 100, FERRY_COMPRESSION_GZIP);
  id = reg("g.tfrecord", ", compression=gzip", 0, NULL);
  w = fx_worker(D, 0, "w", NULL, 0, false, 0);
  j = fx_job(D, id, "", DIST, 1, FAIL, 0);
  c = fx_client(D, j->job_id, j->client_id, 1, NULL, 0, false, 0);
  cr_assert_eq(c->assignments[0]->num_records, 0);
  fx_client(D, j->job_id, j->client_id, 0, prog, 1, false, 10);
  c = fx_client(D, j->job_id, j->client_id, 0, NULL, 0, false, 10);
  cr_assert_eq(c->n_assignments, 1, "not done while the total is unknown");
  t = (fx_task_t){j->job_id, 0, 0, 1, 100, 0, true, 0, NULL, 0, false};
  fx_worker(D, w->worker_id, "w", &t, 1, false, 20);
  c = fx_client(D, j->job_id, j->client_id, 0, NULL, 0, false, 30);
  cr_assert_eq(c->state, FINISHED);
  cr_assert_eq(fx_status(D, 30)->jobs[0]->delivered_all, 100);
}

/* ---- GC and status ------------------------------------------------------ */

Test(dispatcher, finished_and_abandoned_jobs_are_collected) {
  const char *id = dataset(1); /* job GC after 5000 ms */
  Ferry__V1__WorkerHeartbeatResponse *w = fx_worker(D, 0, "w", NULL, 0,
                                                    false, 0);
  Ferry__V1__GetOrCreateJobResponse *done = fx_job(D, id, "", DIST, 1, FAIL,
                                                   0);
  Ferry__V1__GetOrCreateJobResponse *left = fx_job(D, id, "", DIST, 1, FAIL,
                                                   0);
  Ferry__V1__ClientHeartbeatRequest req =
      FERRY__V1__CLIENT_HEARTBEAT_REQUEST__INIT;
  Ferry__V1__ClientHeartbeatResponse resp =
      FERRY__V1__CLIENT_HEARTBEAT_RESPONSE__INIT;
  ferry_error_t err = {0};

  complete_all(done->job_id, done->client_id, w->worker_id, "w", 100);
  fx_client(D, left->job_id, left->client_id, 0, NULL, 0, true, 100);
  ferry__disp_tick(D, 4000);
  cr_assert_eq(fx_status(D, 4000)->n_jobs, 2);
  ferry__disp_tick(D, 5100);
  cr_assert_eq(fx_status(D, 5100)->n_jobs, 0);
  req.job_id = done->job_id;
  req.client_id = done->client_id;
  fx_sign(&req);
  cr_assert_eq(ferry__disp_client_heartbeat(D, &req, &resp, &fx_arena, 5200,
                                            &err),
               FERRY_ENOENT);
  cr_assert(strstr(err.msg, "not found") != NULL);
}

Test(dispatcher, status_contents) {
  const char *id = dataset(4);
  Ferry__V1__WorkerHeartbeatResponse *w = fx_worker(D, 0, "host:7070", NULL,
                                                    0, false, 0);
  Ferry__V1__GetOrCreateJobResponse *j = fx_job(D, id, "train", DIST, 3,
                                                FAIL, 0);
  Ferry__V1__ClientHeartbeatRequest req =
      FERRY__V1__CLIENT_HEARTBEAT_REQUEST__INIT;
  Ferry__V1__ClientHeartbeatResponse resp =
      FERRY__V1__CLIENT_HEARTBEAT_RESPONSE__INIT;
  Ferry__V1__ClientStats st = FERRY__V1__CLIENT_STATS__INIT;
  Ferry__V1__GetStatusResponse *s;
  ferry_error_t err = {0};
  uint64_t prog[4] = {0, 0, 4, 0};

  req.job_id = j->job_id;
  req.client_id = j->client_id;
  req.want_splits = 2;
  req.stats = &st;
  st.stall_fraction = 0.25;
  st.batches = 17;
  fx_sign(&req);
  cr_assert_eq(ferry__disp_client_heartbeat(D, &req, &resp, &fx_arena, 100,
                                            &err),
               0, "%s", err.msg);
  prog[1] = resp.assignments[0]->split;
  fx_client(D, j->job_id, j->client_id, 0, prog, 1, false, 200);
  s = fx_status(D, 700);
  cr_assert_str_eq(s->version, "test");
  cr_assert_eq(s->uptime_ms, 700);
  cr_assert_eq(s->datasets, 1);
  cr_assert_eq(s->n_workers, 1);
  cr_assert_eq(s->workers[0]->worker_id, w->worker_id);
  cr_assert_str_eq(s->workers[0]->address, "host:7070");
  cr_assert_str_eq(s->workers[0]->state, "alive");
  cr_assert_eq(s->workers[0]->tasks, 2);
  cr_assert_eq(s->workers[0]->threads, 4);
  cr_assert_eq(s->workers[0]->last_heartbeat_ms_ago, 700);
  cr_assert_eq(s->n_jobs, 1);
  cr_assert_str_eq(s->jobs[0]->name, "train");
  cr_assert_str_eq(s->jobs[0]->dataset_id, id);
  cr_assert_eq(s->jobs[0]->num_epochs, 3);
  cr_assert_eq(s->jobs[0]->delivered, 4);
  cr_assert_eq(s->jobs[0]->total, 40);
  cr_assert_eq(s->jobs[0]->n_clients, 1);
  cr_assert_eq(s->jobs[0]->clients[0]->splits_in_flight, 2);
  cr_assert_eq(s->jobs[0]->clients[0]->last_heartbeat_ms_ago, 500);
  cr_assert_eq(s->jobs[0]->clients[0]->stats->batches, 17);
  cr_assert_float_eq(s->jobs[0]->clients[0]->stats->stall_fraction, 0.25,
                     1e-9);
}

/* ---- Exactly-once simulation ------------------------------------------- */

#define SIM_WORKERS 4
#define SIM_CLIENTS 3
#define SIM_SPLITS 64
#define SIM_EPOCHS 2
#define SIM_MAX_RECORDS 64

typedef struct sim_task_s {
  uint32_t epoch, split;
  uint64_t lease, start, count;
} sim_task_t;

typedef struct sim_worker_s {
  uint64_t id;
  char addr[16];
  bool alive;
  sim_task_t tasks[256];
  size_t n;
} sim_worker_t;

typedef struct sim_slot_s {
  uint32_t epoch, split;
  int64_t pos; /* next position to deliver; -1: not started */
} sim_slot_t;

typedef struct sim_client_s {
  uint64_t job, id;
  bool alive;
  sim_slot_t slots[SIM_SPLITS];
  size_t n;
} sim_client_t;

static sim_worker_t SW[SIM_WORKERS];
static sim_client_t SC[SIM_CLIENTS];
/* Times each (epoch, split, position) reached a trainer. */
static uint8_t seen[SIM_EPOCHS][SIM_SPLITS][SIM_MAX_RECORDS];
static uint64_t true_count[SIM_SPLITS];
static int releases_mid_split; /* re-leases that resumed past position 0 */
static int tasks_on_late_worker;

static void sim_worker_hb(sim_worker_t *w, uint64_t job, int64_t now) {
  fx_task_t t[256];
  Ferry__V1__WorkerHeartbeatResponse *r;
  for (size_t i = 0; i < w->n; i++) {
    sim_task_t *s = &w->tasks[i];
    /* Workers produce instantly: every task is finished. */
    t[i] = (fx_task_t){job, s->epoch, s->split, s->lease, s->count, 0, true,
                       0, NULL, 0, false};
  }
  r = fx_worker(D, w->id, w->addr, t, w->n, false, now);
  w->id = r->worker_id;
  for (size_t c = 0; c < r->n_cancelled; c++)
    for (size_t i = 0; i < w->n; i++)
      if (w->tasks[i].split == r->cancelled[c]->split &&
          w->tasks[i].epoch == r->cancelled[c]->epoch &&
          w->tasks[i].lease == r->cancelled[c]->lease) {
        w->tasks[i] = w->tasks[--w->n];
        break;
      }
  for (size_t i = 0; i < r->n_new_tasks; i++) {
    Ferry__V1__Task *nt = r->new_tasks[i];
    cr_assert_lt(w->n, 256);
    releases_mid_split += nt->lease > 1 && nt->start > 0;
    tasks_on_late_worker += w == &SW[3];
    w->tasks[w->n++] = (sim_task_t){nt->epoch, nt->split->index, nt->lease,
                                    nt->start, true_count[nt->split->index]};
  }
}

static sim_task_t *sim_find_task(uint64_t worker, uint32_t epoch,
                                 uint32_t split, uint64_t lease) {
  for (int w = 0; w < SIM_WORKERS; w++) {
    if (SW[w].id != worker || !SW[w].alive)
      continue;
    for (size_t i = 0; i < SW[w].n; i++)
      if (SW[w].tasks[i].epoch == epoch && SW[w].tasks[i].split == split &&
          SW[w].tasks[i].lease == lease)
        return &SW[w].tasks[i];
  }
  return NULL;
}

/* One client step: heartbeat, then (if `deliver`) hand up to 3 records
 * per split to the trainer from the worker streams it can reach; they are
 * reported on the next step. */
static bool sim_client_step(sim_client_t *c, int64_t now, bool deliver) {
  uint64_t prog[4 * SIM_SPLITS];
  size_t np = 0;
  Ferry__V1__ClientHeartbeatResponse *r;
  sim_slot_t keep[SIM_SPLITS];
  size_t nk = 0;

  for (size_t i = 0; i < c->n; i++)
    if (c->slots[i].pos > 0) {
      prog[4 * np] = c->slots[i].epoch;
      prog[4 * np + 1] = c->slots[i].split;
      prog[4 * np + 2] = (uint64_t)c->slots[i].pos;
      prog[4 * np + 3] = 0;
      np++;
    }
  r = fx_client(D, c->job, c->id, 1, prog, np, false, now);
  if (r->state != RUNNING)
    return false;
  /* Slots follow the assignments: new ones start unknown, dropped ones
   * (done, or lost to the pool) go away. */
  for (size_t i = 0; i < r->n_assignments; i++) {
    Ferry__V1__Assignment *as = r->assignments[i];
    sim_slot_t s = {as->epoch, as->split, -1};
    sim_task_t *t;
    for (size_t k = 0; k < c->n; k++)
      if (c->slots[k].epoch == as->epoch && c->slots[k].split == as->split)
        s = c->slots[k];
    t = sim_find_task(as->worker_id, as->epoch, as->split, as->lease);
    if (t != NULL && deliver) {
      if (s.pos < 0)
        s.pos = (int64_t)t->start;
      /* Positions below the client's count are dropped; a stream only
       * resumes at or below it. */
      cr_assert_leq(t->start, (uint64_t)s.pos, "a lease skipped records");
      for (int k = 0; k < 3 && (uint64_t)s.pos < t->count; k++, s.pos++) {
        cr_assert_lt(as->epoch, SIM_EPOCHS);
        seen[as->epoch][as->split][s.pos]++;
      }
    }
    keep[nk++] = s;
  }
  memcpy(c->slots, keep, nk * sizeof(sim_slot_t));
  c->n = nk;
  return true;
}

Test(dispatcher, exactly_once_with_failures) {
  Ferry__V1__GetOrCreateJobResponse *j;
  Ferry__V1__GetStatusResponse *s;
  const char *id;
  int64_t now = 0;
  int step;
  bool running = true;

  D = fx_state(1000, 1000, 1000000, 8);
  /* Plain files with 8-record splits plus a gzip file of unknown count. */
  fx_write("a.tfrecord", 200, FERRY_COMPRESSION_NONE); /* 25 splits */
  fx_write("b.tfrecord", 301, FERRY_COMPRESSION_NONE); /* 38 splits */
  fx_write("c.tfrecord", 50, FERRY_COMPRESSION_GZIP);  /* 1 split */
  id = reg("*.tfrecord", ", compression=auto", 0, NULL);
  for (int i = 0; i < SIM_SPLITS; i++)
    true_count[i] = i < 25 ? 8 : i < 62 ? 8 : i == 62 ? 5 : 50;
  memset(SW, 0, sizeof(SW));
  memset(SC, 0, sizeof(SC));
  memset(seen, 0, sizeof(seen));
  releases_mid_split = tasks_on_late_worker = 0;
  for (int w = 0; w < 3; w++) {
    snprintf(SW[w].addr, sizeof(SW[w].addr), "w%d:1", w);
    SW[w].alive = true;
  }
  snprintf(SW[3].addr, sizeof(SW[3].addr), "w3:1");
  for (int c = 0; c < SIM_CLIENTS; c++) {
    j = fx_job(D, id, "sim", DIST, SIM_EPOCHS, FAIL, 0);
    SC[c] = (sim_client_t){j->job_id, j->client_id, true, {{0}}, 0};
  }
  for (step = 0; running && step < 3000; step++) {
    now += 100;
    if (step == 5)
      SW[1].alive = false; /* stops heartbeating: lost at ~1 s */
    if (step == 12) {
      /* A trainer dies right after a heartbeat (records it took after
       * its last report would be the documented duplicates). */
      sim_client_step(&SC[0], now, false);
      SC[0].alive = false;
    }
    if (step == 15)
      SW[3].alive = true; /* a new worker joins */
    for (int w = 0; w < SIM_WORKERS; w++)
      if (SW[w].alive)
        sim_worker_hb(&SW[w], SC[0].job, now);
    running = false;
    for (int c = 0; c < SIM_CLIENTS; c++)
      if (SC[c].alive)
        running |= sim_client_step(&SC[c], now, true);
    ferry__disp_tick(D, now);
    char why[300];
    cr_assert(ferry__disp_check_indexes(D, why, sizeof(why)), "step %d: %s",
              step, why);
  }
  cr_assert_not(running, "the job did not finish in %d steps", step);
  cr_assert_gt(step, 30, "finished too early to exercise the failures");
  s = fx_status(D, now);
  cr_assert_eq(s->jobs[0]->state, FINISHED);
  cr_assert_eq(s->jobs[0]->delivered_all, SIM_EPOCHS * 551);
  for (int e = 0; e < SIM_EPOCHS; e++)
    for (int sp = 0; sp < SIM_SPLITS; sp++)
      for (uint64_t p = 0; p < SIM_MAX_RECORDS; p++)
        cr_assert_eq(seen[e][sp][p], p < true_count[sp] ? 1 : 0,
                     "epoch %d split %d position %llu delivered %d times", e,
                     sp, (unsigned long long)p, seen[e][sp][p]);
  cr_assert_str_eq(s->workers[1]->state, "lost");
  cr_assert_gt(releases_mid_split, 0, "no split was re-leased mid-way");
  cr_assert_gt(tasks_on_late_worker, 0, "the late worker got no task");
}

/* ---- Client faults -------------------------------------------- */

/* A split moved from a client that left to another one carries the
 * position it starts from: the new client counts from there (counting
 * from 0 made it see a gap and ask for restarts forever). */
Test(dispatcher, moved_split_carries_its_start) {
  const char *id = dataset(2);
  fx_worker(D, 0, "w", NULL, 0, false, 0);
  Ferry__V1__GetOrCreateJobResponse *j1 = fx_job(D, id, "m", DIST, 1, FAIL, 0);
  Ferry__V1__GetOrCreateJobResponse *j2 = fx_job(D, id, "m", DIST, 1, FAIL, 0);
  Ferry__V1__ClientHeartbeatResponse *c;
  uint64_t prog[4] = {0, 0, 7, 0};

  c = fx_client(D, j1->job_id, j1->client_id, 2, NULL, 0, false, 0);
  cr_assert_eq(c->n_assignments, 2);
  for (size_t i = 0; i < 2; i++)
    cr_assert_eq(c->assignments[i]->start, 0);
  prog[1] = c->assignments[0]->split;
  /* Client 1 took 7 records of its first split and leaves. */
  fx_client(D, j1->job_id, j1->client_id, 0, prog, 1, true, 10);
  c = fx_client(D, j2->job_id, j2->client_id, 2, NULL, 0, false, 20);
  cr_assert_eq(c->n_assignments, 2, "the rows returned at once");
  cr_assert_eq(find_assignment(c, (uint32_t)prog[1])->start, 7);
  cr_assert_eq(find_assignment(c, (uint32_t)(1 - prog[1]))->start, 0);
}

/* A client declared lost that comes back gets a new incarnation (so it
 * drops what it had not handed out) and fresh splits, none of its old
 * bindings. */
Test(dispatcher, lost_client_rejoins_with_a_new_incarnation) {
  const char *id = dataset(4);
  fx_worker(D, 0, "w", NULL, 0, false, 0);
  Ferry__V1__GetOrCreateJobResponse *j = fx_job(D, id, "r", DIST, 1, FAIL, 0);
  Ferry__V1__GetOrCreateJobResponse *o = fx_job(D, id, "r", DIST, 1, FAIL, 0);
  Ferry__V1__ClientHeartbeatResponse *c;
  uint64_t inc;

  cr_assert_eq(j->client_timeout_ms, 1000);
  c = fx_client(D, j->job_id, j->client_id, 2, NULL, 0, false, 0);
  cr_assert_eq(c->n_assignments, 2);
  cr_assert_not(c->fenced);
  cr_assert_eq(c->client_timeout_ms, 1000);
  inc = c->incarnation;
  uint32_t first[2] = {c->assignments[0]->split, c->assignments[1]->split};
  fx_worker(D, 1, "w", NULL, 0, false, 900);
  fx_client(D, o->job_id, o->client_id, 0, NULL, 0, false, 900);
  ferry__disp_tick(D, 1100); /* client j: silent since 0 */
  c = fx_client(D, o->job_id, o->client_id, 4, NULL, 0, false, 1150);
  cr_assert_eq(c->n_assignments, 4, "the lost client's rows went back");
  c = fx_client(D, j->job_id, j->client_id, 2, NULL, 0, false, 1200);
  cr_assert_eq(c->incarnation, inc + 1);
  cr_assert_eq(c->n_assignments, 0, "all rows are with the other client");
  cr_assert_null(find_assignment(c, first[0]));
  cr_assert_null(find_assignment(c, first[1]));
}

/* Chaos seed 5037 (tests/chaos): a client stopped past its timeout and
 * resumed after the job's other client finished the job cannot rejoin
 * (the job no longer runs). Its heartbeat must not renew it: answered
 * as before (same incarnation, not fenced), it handed out the batches it
 * still held, records the other client had delivered. The answer says
 * `fenced`, so it drops them and ends. */
Test(dispatcher, lost_client_of_a_finished_job_is_not_renewed) {
  const char *id = dataset(3);
  Ferry__V1__WorkerHeartbeatResponse *w = fx_worker(D, 0, "w", NULL, 0,
                                                    false, 0);
  Ferry__V1__GetOrCreateJobResponse *j = fx_job(D, id, "f", DIST, 1, FAIL, 0);
  Ferry__V1__GetOrCreateJobResponse *o = fx_job(D, id, "f", DIST, 1, FAIL, 0);
  Ferry__V1__ClientHeartbeatResponse *c;
  uint64_t inc;

  c = fx_client(D, j->job_id, j->client_id, 2, NULL, 0, false, 0);
  cr_assert_eq(c->n_assignments, 2);
  cr_assert_not(c->fenced);
  inc = c->incarnation;
  fx_worker(D, w->worker_id, "w", NULL, 0, false, 900);
  fx_client(D, o->job_id, o->client_id, 0, NULL, 0, false, 900);
  ferry__disp_tick(D, 1100); /* client j: silent since 0, lost */
  cr_assert_eq(complete_all(o->job_id, o->client_id, w->worker_id, "w",
                            1150),
               3, "every row went to the other client");
  c = fx_client(D, o->job_id, o->client_id, 0, NULL, 0, false, 1160);
  cr_assert_eq(c->state, FINISHED);
  c = fx_client(D, j->job_id, j->client_id, 0, NULL, 0, false, 1200);
  cr_assert_eq(c->state, FINISHED);
  cr_assert_eq(c->incarnation, inc, "no rejoin into a finished job");
  cr_assert(c->fenced, "a lost client of a finished job was renewed");
  cr_assert_eq(c->n_assignments, 0);
}

/* A split whose lease fails again and again without progress fails the
 * job with a message naming it, instead of looping for ever. */
Test(dispatcher, restart_loop_fails_the_job_naming_the_split) {
  const char *id = dataset(2);
  Ferry__V1__WorkerHeartbeatResponse *w = fx_worker(D, 0, "w", NULL, 0,
                                                    false, 0);
  Ferry__V1__GetOrCreateJobResponse *j = fx_job(D, id, "", DIST, 1, FAIL, 0);
  Ferry__V1__ClientHeartbeatResponse *c;
  Ferry__V1__GetStatusResponse *s;
  int64_t now = 0;

  c = fx_client(D, j->job_id, j->client_id, 1, NULL, 0, false, 0);
  cr_assert_eq(c->n_assignments, 1);
  uint32_t split = c->assignments[0]->split;
  uint64_t lease = c->assignments[0]->lease;
  for (int i = 0; i <= FERRY_DISP_MAX_RESTARTS; i++) {
    c = restart(D, j->job_id, j->client_id, split, 3, lease, now);
    if (c->state != RUNNING)
      break;
    /* The only worker: the row waits for its backoff to pass and for the
     * worker to heartbeat again (it was suspected); everyone keeps
     * heartbeating meanwhile. */
    for (int step = 0; step < 20; step++) {
      now += 300;
      fx_worker(D, w->worker_id, "w", NULL, 0, false, now);
      ferry__disp_tick(D, now);
      c = fx_client(D, j->job_id, j->client_id, 0, NULL, 0, false, now);
      cr_assert_not_null(find_assignment(c, split), "restart %d", i);
      if (find_assignment(c, split)->lease > lease &&
          find_assignment(c, split)->worker_id != 0)
        break;
    }
    cr_assert_gt(find_assignment(c, split)->lease, lease, "restart %d", i);
    lease = find_assignment(c, split)->lease;
  }
  cr_assert_eq(c->state, FAILED);
  cr_assert(strstr(c->error, "split") != NULL &&
                strstr(c->error, "d.tfrecord") != NULL &&
                strstr(c->error, "restarted") != NULL,
            "%s", c->error);
  s = fx_status(D, now);
  cr_assert_eq(s->jobs[0]->state, FAILED);
}

/* A worker that missed its heartbeats, or whose lease a client just lost,
 * gets no new lease while another worker can take it. */
Test(dispatcher, suspect_and_silent_workers_get_no_leases) {
  two_t ab = two_workers(4, DIST);
  Ferry__V1__WorkerHeartbeatResponse *a = ab.a, *b = ab.b;
  Ferry__V1__GetOrCreateJobResponse *j = ab.j;
  Ferry__V1__ClientHeartbeatResponse *c;

  /* b is silent for more than two intervals (1000 ms each): only a. */
  a = fx_worker(D, a->worker_id, "a", NULL, 0, false, 2600);
  c = fx_client(D, j->job_id, j->client_id, 2, NULL, 0, false, 2600);
  cr_assert_eq(c->n_assignments, 2);
  for (size_t i = 0; i < 2; i++)
    cr_assert_eq(c->assignments[i]->worker_id, a->worker_id);
  /* b is back; a client loses its stream to a: its split goes to b, and
   * a (suspected until it heartbeats) gets no other new split either. */
  b = fx_worker(D, b->worker_id, "b", NULL, 0, false, 2700);
  uint32_t split = c->assignments[0]->split;
  c = restart(D, j->job_id, j->client_id, split,
              0, c->assignments[0]->lease, 2710);
  cr_assert_eq(find_assignment(c, split)->worker_id, b->worker_id);
  c = fx_client(D, j->job_id, j->client_id, 3, NULL, 0, false, 2720);
  for (size_t i = 0; i < c->n_assignments; i++)
    if (c->assignments[i]->split != split &&
        c->assignments[i]->lease > 1)
      cr_assert_fail("a re-lease went to a");
  size_t on_b = 0;
  for (size_t i = 0; i < c->n_assignments; i++)
    on_b += c->assignments[i]->worker_id == b->worker_id;
  cr_assert_eq(on_b, 3, "the new splits and the restarted one go to b");
}

/* A client whose stream stalls stops being renewed: its answers say
 * `fenced`, it gets no new split, and it is declared lost one client
 * timeout after its last renewal, its rows back in the pool. */
Test(dispatcher, stalled_stream_fences_then_expires_the_client) {
  const char *id = dataset(2);
  Ferry__V1__WorkerHeartbeatResponse *w = fx_worker(D, 0, "w", NULL, 0,
                                                    false, 0);
  Ferry__V1__GetOrCreateJobResponse *j = fx_job(D, id, "s", DIST, 1, FAIL, 0);
  Ferry__V1__GetOrCreateJobResponse *o = fx_job(D, id, "s", DIST, 1, FAIL, 0);
  Ferry__V1__ClientHeartbeatResponse *c;
  fx_task_t t = TASK(j->job_id, 0, 0, 1);

  c = fx_client(D, j->job_id, j->client_id, 1, NULL, 0, false, 0);
  cr_assert_eq(c->n_assignments, 1);
  t.split = c->assignments[0]->split;
  t.stalled_ms = 30000; /* the default --client-stall-ms */
  w = fx_worker(D, w->worker_id, "w", &t, 1, false, 100);
  c = fx_client(D, j->job_id, j->client_id, 2, NULL, 0, false, 200);
  cr_assert(c->fenced);
  cr_assert_eq(c->n_assignments, 1, "no new split while fenced");
  fx_client(D, o->job_id, o->client_id, 0, NULL, 0, false, 900);
  fx_worker(D, w->worker_id, "w", NULL, 0, false, 900);
  ferry__disp_tick(D, 900); /* renewed last at 0 (200 did not renew) */
  c = fx_client(D, o->job_id, o->client_id, 2, NULL, 0, false, 950);
  cr_assert_eq(c->n_assignments, 1, "still bound to the stalled client");
  ferry__disp_tick(D, 1050);
  c = fx_client(D, o->job_id, o->client_id, 2, NULL, 0, false, 1060);
  cr_assert_eq(c->n_assignments, 2, "its row went back to the pool");
  c = fx_client(D, j->job_id, j->client_id, 0, NULL, 0, false, 1100);
  cr_assert_not(c->fenced, "it rejoined");
  cr_assert_eq(c->incarnation, 1);
}

/* A worker that saw no stream of a split's client for --client-idle-ms
 * (5 s by default; TaskProgress.unread_ms) makes the client's next answer
 * mark the split unread; the client may then give it up
 * (SplitProgress.release): the row goes back to the pool from its
 * delivered count, another client of the job gets it, and the idle
 * client is not fenced and gets splits again when it asks. The dispatcher
 * takes nothing back by itself, and a release of another lease than the
 * row's is stale and ignored. */
Test(dispatcher, released_split_goes_back_without_fencing) {
  const char *id = dataset(2);
  Ferry__V1__WorkerHeartbeatResponse *w = fx_worker(D, 0, "w", NULL, 0,
                                                    false, 0);
  Ferry__V1__GetOrCreateJobResponse *j = fx_job(D, id, "s", DIST, 1, FAIL, 0);
  Ferry__V1__GetOrCreateJobResponse *o = fx_job(D, id, "s", DIST, 1, FAIL, 0);
  Ferry__V1__ClientHeartbeatResponse *c;

  c = fx_client(D, j->job_id, j->client_id, 1, NULL, 0, false, 0);
  cr_assert_eq(c->n_assignments, 1);
  cr_assert_not(c->assignments[0]->unread);
  uint32_t split = c->assignments[0]->split;
  uint64_t lease = c->assignments[0]->lease;
  fx_task_t t = TASK(j->job_id, 0, split, lease);
  uint64_t prog[4] = {0, split, 3, 0};
  /* Below the bound: not marked. */
  fx_unread_ms = 4999;
  w = fx_worker(D, w->worker_id, "w", &t, 1, false, 100);
  c = fx_client(D, j->job_id, j->client_id, 0, prog, 1, false, 150);
  cr_assert_eq(c->n_assignments, 1);
  cr_assert_not(c->assignments[0]->unread, "marked below --client-idle-ms");
  /* At the bound: marked, and nothing taken back without the client. */
  fx_unread_ms = 5000;
  w = fx_worker(D, w->worker_id, "w", &t, 1, false, 200);
  fx_unread_ms = 0;
  cr_assert_eq(w->n_cancelled, 0, "the dispatcher took it back by itself");
  c = fx_client(D, j->job_id, j->client_id, 0, prog, 1, false, 250);
  cr_assert_eq(c->n_assignments, 1);
  cr_assert(c->assignments[0]->unread, "not marked at --client-idle-ms");
  /* A release of an older lease: stale, kept. */
  fx_release_lease = lease - 1;
  c = fx_client(D, j->job_id, j->client_id, 0, prog, 1, false, 300);
  cr_assert_eq(c->n_assignments, 1, "a stale release is ignored");
  w = fx_worker(D, w->worker_id, "w", &t, 1, false, 350);
  cr_assert_eq(w->n_cancelled, 0);
  /* Its lease: the row is free, the task cancelled, nobody fenced. */
  fx_release_lease = lease;
  c = fx_client(D, j->job_id, j->client_id, 0, prog, 1, false, 400);
  fx_release_lease = 0;
  cr_assert_not(c->fenced, "the idle client is not fenced");
  cr_assert_eq(c->n_assignments, 0, "its split went back to the pool");
  w = fx_worker(D, w->worker_id, "w", &t, 1, false, 500);
  cr_assert_eq(w->n_cancelled, 1, "the given-up lease is cancelled");
  c = fx_client(D, o->job_id, o->client_id, 2, NULL, 0, false, 600);
  bool found = false;
  for (size_t i = 0; i < c->n_assignments; i++)
    if (c->assignments[i]->split == split) {
      found = true;
      cr_assert_eq(c->assignments[i]->start, 3, "from its delivered count");
      cr_assert_not(c->assignments[i]->unread);
      /* The row avoids the worker a while (the client may not reach
       * it): with no other worker, it waits for one. */
      cr_assert_neq(c->assignments[i]->worker_id, w->worker_id);
    }
  cr_assert(found);
  /* Once it reads, the idle client asks again and is answered (the epoch
   * has nothing left here, but it is renewed, not fenced). */
  c = fx_client(D, j->job_id, j->client_id, 2, NULL, 0, false, 800);
  cr_assert_not(c->fenced);
}

/* ---- Hostile specs -------------------------------------------- */

/* A FIFO named by a spec fails the registration at once, naming it; the
 * scan never blocks in open() (the loop thread would freeze). */
Test(dispatcher, fifo_in_a_spec_is_refused_without_blocking,
     .timeout = 10) {
  char path[128], spec[256];
  Ferry__V1__RegisterDatasetResponse *r;
  ferry_error_t err = {0};
  D = fx_state(1000, 1000, 1000, 10);
  snprintf(path, sizeof(path), "%s/p.tfrecord", fx_dir);
  cr_assert_eq(mkfifo(path, 0600), 0);
  snprintf(spec, sizeof(spec), "tfrecord(\"%s\") | decode(raw, 1, 1, 1)",
           path);
  cr_assert_eq(fx_register(D, spec, 0, &r, 0, &err), FERRY_EINVAL);
  cr_assert(strstr(err.msg, "p.tfrecord: not a regular file") != NULL, "%s",
            err.msg);
}

/* A state whose config names `root` as its only data root. */
static ferry_roots_t roots;
static ferry_disp_t *rooted_state(const char *root) {
  ferry_disp_config_t cfg;
  ferry_error_t err = {0};
  ferry_disp_t *d;
  cr_assert_eq(ferry__roots_init(&roots, root, &err), 0, "%s", err.msg);
  ferry__disp_config_init(&cfg);
  cfg.records_per_split = 10;
  cfg.roots = &roots;
  cr_assert_eq(ferry__disp_new(&cfg, 0, &d), 0);
  return d;
}

static int reg_text(const char *pattern, ferry_error_t *err) {
  char spec[512];
  Ferry__V1__RegisterDatasetResponse *r;
  snprintf(spec, sizeof(spec), "tfrecord(\"%s\") | decode(raw, 1, 1, 1)",
           pattern);
  return fx_register(D, spec, 0, &r, 0, err);
}

/* Data roots: a spec whose file or glob resolves outside every root is
 * refused before anything outside is opened or listed, with the same
 * answer whether or not the files exist (no glob oracle); a symlink
 * inside a root that points out is refused too. */
Test(dispatcher, data_roots_refuse_files_outside_and_answer_globs_alike) {
  char root[128], inside[160], link[160], pat[200];
  ferry_error_t e1 = {0}, e2 = {0}, e3 = {0};
  snprintf(root, sizeof(root), "%s/root", fx_dir);
  cr_assert_eq(mkdir(root, 0755), 0);
  D = rooted_state(root);
  fx_write("root/d.tfrecord", 20, FERRY_COMPRESSION_NONE);
  snprintf(inside, sizeof(inside), "%s/d.tfrecord", root);
  cr_assert_eq(reg_text(inside, &e1), 0, "%s", e1.msg);

  cr_assert_eq(reg_text("/etc/passwd", &e1), FERRY_EACCES);
  cr_assert(strstr(e1.msg, "/etc/passwd is outside every --data-root") !=
                NULL, "%s", e1.msg);
  /* The glob oracle: matching and non-matching patterns answer alike. */
  cr_assert_eq(reg_text("/etc/pass[w-z]*", &e2), FERRY_EACCES);
  cr_assert_eq(reg_text("/etc/pass[a-v]*", &e3), FERRY_EACCES);
  cr_assert(strstr(e2.msg, "outside every --data-root") != NULL &&
                strstr(e3.msg, "outside every --data-root") != NULL,
            "%s / %s", e2.msg, e3.msg);
  cr_assert_eq(reg_text("/no/such/dir/*.tfrecord", &e3), FERRY_EACCES);
  /* `..` out of the root. */
  snprintf(pat, sizeof(pat), "%s/../d.tfrecord", root);
  fx_write("d.tfrecord", 20, FERRY_COMPRESSION_NONE);
  cr_assert_eq(reg_text(pat, &e1), FERRY_EACCES, "%s", e1.msg);
  /* A symlink inside the root to a file outside it. */
  snprintf(link, sizeof(link), "%s/evil.tfrecord", root);
  cr_assert_eq(symlink("/etc/passwd", link), 0);
  cr_assert_eq(reg_text(link, &e1), FERRY_EACCES, "%s", e1.msg);
  snprintf(pat, sizeof(pat), "%s/*.tfrecord", root);
  cr_assert_eq(reg_text(pat, &e1), FERRY_EACCES, "%s", e1.msg);
  cr_assert(strstr(e1.msg, "evil.tfrecord is outside") != NULL, "%s",
            e1.msg);
  ferry__roots_close(&roots);
}

/* Every string and repeated field of a request is bounded before anything
 * changes: a 10 MB worker address, a huge job name, too many progress
 * entries are refused and leave no trace (no worker, no entry). */
Test(dispatcher, oversized_requests_are_refused_before_any_change) {
  const char *id = dataset(2);
  Ferry__V1__WorkerHeartbeatRequest wq =
      FERRY__V1__WORKER_HEARTBEAT_REQUEST__INIT;
  Ferry__V1__WorkerHeartbeatResponse wr =
      FERRY__V1__WORKER_HEARTBEAT_RESPONSE__INIT;
  ferry_error_t err = {0};
  size_t before = fx_entries.n;
  char *huge = malloc(10 << 20);
  memset(huge, 'a', (10 << 20) - 1);
  huge[(10 << 20) - 1] = '\0';
  wq.address = huge;
  cr_assert_eq(ferry__disp_worker_heartbeat(D, &wq, &wr, &fx_arena, 0, &err),
               FERRY_EINVAL);
  cr_assert(strlen(err.msg) < 200, "the address is not echoed");
  cr_assert_eq(fx_status(D, 0)->n_workers, 0);
  cr_assert_eq(fx_entries.n, before, "nothing journaled");

  Ferry__V1__GetOrCreateJobRequest jq =
      FERRY__V1__GET_OR_CREATE_JOB_REQUEST__INIT;
  Ferry__V1__JobOptions jo = FERRY__V1__JOB_OPTIONS__INIT;
  Ferry__V1__GetOrCreateJobResponse jr =
      FERRY__V1__GET_OR_CREATE_JOB_RESPONSE__INIT;
  jq.dataset_id = (char *)id;
  jq.options = &jo;
  jo.job_name = huge;
  cr_assert_eq(ferry__disp_get_or_create_job(D, &jq, &jr, &fx_arena, 0, &err),
               FERRY_EINVAL);
  cr_assert_eq(fx_status(D, 0)->n_jobs, 0);
  free(huge);

  Ferry__V1__GetOrCreateJobResponse *j = fx_job(D, id, "", DIST, 1, FAIL, 0);
  Ferry__V1__ClientHeartbeatRequest cq =
      FERRY__V1__CLIENT_HEARTBEAT_REQUEST__INIT;
  Ferry__V1__ClientHeartbeatResponse cr =
      FERRY__V1__CLIENT_HEARTBEAT_RESPONSE__INIT;
  cq.job_id = j->job_id;
  cq.client_id = j->client_id;
  cq.want_splits = FERRY_DISP_MAX_WANT + 1;
  before = fx_entries.n;
  cr_assert_eq(ferry__disp_client_heartbeat(D, &cq, &cr, &fx_arena, 0, &err),
               FERRY_EINVAL);
  cr_assert_eq(fx_entries.n, before);
}

/* Datasets are bounded in number and collected once no job has used them
 * for --job-gc-ms (the job's own GC first). */
Test(dispatcher, datasets_are_bounded_and_collected) {
  ferry_disp_config_t cfg;
  ferry_error_t err = {0};
  char spec[256];
  Ferry__V1__RegisterDatasetResponse *r;
  ferry__disp_config_init(&cfg);
  cfg.records_per_split = 10;
  cfg.job_gc_ms = 1000;
  cfg.max_datasets = 3;
  D = fx_state(1000, 1000, 1000, 10);
  ferry__disp_free(D);
  cr_assert_eq(ferry__disp_new(&cfg, 0, &D), 0);
  fx_write("d.tfrecord", 20, FERRY_COMPRESSION_NONE);
  for (int k = 1; k <= 3; k++) {
    snprintf(spec, sizeof(spec),
             "tfrecord(\"%s/d.tfrecord\") | decode(raw, 1, 1, %d)", fx_dir, k);
    cr_assert_eq(fx_register(D, spec, 0, &r, 0, &err), 0, "%s", err.msg);
  }
  const char *used = r->dataset_id;
  snprintf(spec, sizeof(spec),
           "tfrecord(\"%s/d.tfrecord\") | decode(raw, 1, 1, 9)", fx_dir);
  cr_assert_eq(fx_register(D, spec, 0, &r, 0, &err), FERRY_ENOSPC);
  cr_assert(strstr(err.msg, "holds 3 datasets") != NULL, "%s", err.msg);
  /* A job uses the third one: the other two go after 1 s, it stays. */
  Ferry__V1__GetOrCreateJobResponse *j = fx_job(D, used, "", DIST, 1, FAIL,
                                                10);
  ferry__disp_tick(D, 1500);
  cr_assert_eq(fx_status(D, 1500)->datasets, 1);
  cr_assert_eq(fx_register(D, spec, 0, &r, 1500, &err), 0, "%s", err.msg);
  /* The job's client leaves: the job goes after 1 s, its dataset 1 s
   * later. */
  fx_client(D, j->job_id, j->client_id, 0, NULL, 0, true, 1600);
  ferry__disp_tick(D, 2700);
  cr_assert_eq(fx_status(D, 2700)->n_jobs, 0);
  ferry__disp_tick(D, 3800);
  cr_assert_eq(fx_status(D, 3800)->datasets, 0);
}

/* A ClientHeartbeat must carry the secret GetOrCreateJob gave its
 * client; the worker's Task carries it; a replayed journal keeps it. */
Test(dispatcher, client_secret_checked_and_kept_by_the_journal) {
  const char *id = dataset(4);
  Ferry__V1__WorkerHeartbeatResponse *w = fx_worker(D, 0, "w:1", NULL, 0,
                                                    false, 0);
  Ferry__V1__GetOrCreateJobResponse *j = fx_job(D, id, "", DIST, 1, FAIL, 0);
  Ferry__V1__GetOrCreateJobResponse *k = fx_job(D, id, "", DIST, 1, FAIL, 0);
  Ferry__V1__ClientHeartbeatRequest req =
      FERRY__V1__CLIENT_HEARTBEAT_REQUEST__INIT;
  Ferry__V1__ClientHeartbeatResponse resp =
      FERRY__V1__CLIENT_HEARTBEAT_RESPONSE__INIT;
  ferry_error_t err = {0};
  uint8_t wrong[16] = {0};

  cr_assert_eq(j->client_secret.len, 16);
  cr_assert(memcmp(j->client_secret.data, k->client_secret.data, 16) != 0,
            "two clients got the same secret");
  req.job_id = j->job_id;
  req.client_id = j->client_id;
  req.want_splits = 1;
  req.leaving = true;
  cr_assert_eq(ferry__disp_client_heartbeat(D, &req, &resp, &fx_arena, 10,
                                            &err),
               FERRY_EACCES, "no secret");
  cr_assert(strstr(err.msg, "secret") != NULL, "%s", err.msg);
  req.client_secret.data = wrong;
  req.client_secret.len = 16;
  cr_assert_eq(ferry__disp_client_heartbeat(D, &req, &resp, &fx_arena, 10,
                                            &err),
               FERRY_EACCES, "a wrong secret");
  /* Another client's secret is wrong too. */
  req.client_secret = k->client_secret;
  cr_assert_eq(ferry__disp_client_heartbeat(D, &req, &resp, &fx_arena, 10,
                                            &err),
               FERRY_EACCES, "the other client's secret");
  /* The refused calls changed nothing: the client still holds its job. */
  Ferry__V1__ClientHeartbeatResponse *c =
      fx_client(D, j->job_id, j->client_id, 1, NULL, 0, false, 20);
  cr_assert_eq(c->n_assignments, 1);
  w = fx_worker(D, w->worker_id, "w:1", NULL, 0, false, 30);
  cr_assert_eq(w->n_new_tasks, 1);
  cr_assert_eq(w->new_tasks[0]->client_secret.len, 16);
  cr_assert_arr_eq(w->new_tasks[0]->client_secret.data, j->client_secret.data,
                   16, "the task carries its client's secret");

  /* A dispatcher restarted on the journal still knows the secret. */
  ferry_disp_config_t cfg;
  ferry_disp_t *r;
  ferry__disp_config_init(&cfg);
  cfg.worker_timeout_ms = cfg.client_timeout_ms = 1000;
  cfg.records_per_split = 10;
  cr_assert_eq(ferry__disp_new(&cfg, 0, &r), 0);
  for (size_t i = 0; i < fx_entries.n; i++)
    cr_assert_eq(ferry__disp_apply(r, fx_entries.e[i], fx_entries.len[i], 40,
                                   &err),
                 0, "entry %zu: %s", i, err.msg);
  ferry__disp_replayed(r, 40);
  req.client_secret.data = wrong;
  req.leaving = false;
  cr_assert_eq(ferry__disp_client_heartbeat(r, &req, &resp, &fx_arena, 50,
                                            &err),
               FERRY_EACCES, "replayed: a wrong secret");
  fx_client(r, j->job_id, j->client_id, 1, NULL, 0, false, 60);
  ferry__disp_free(r);
}

/* proto3 `string` fields must hold UTF-8, or every reader of GetStatus
 * refuses the answer (found by the grpcio RPC fuzz: a worker address of
 * random bytes broke `ferryctl status` for everyone): identifiers that are
 * not UTF-8 are refused, error text is cleaned. */
Test(dispatcher, strings_that_are_not_utf8_are_refused_or_cleaned) {
  const char *id = dataset(2);
  ferry_error_t err = {0};
  Ferry__V1__WorkerHeartbeatRequest wq =
      FERRY__V1__WORKER_HEARTBEAT_REQUEST__INIT;
  Ferry__V1__WorkerHeartbeatResponse wr =
      FERRY__V1__WORKER_HEARTBEAT_RESPONSE__INIT;
  wq.address = (char *)"host\xff\xfe:1";
  cr_assert_eq(ferry__disp_worker_heartbeat(D, &wq, &wr, &fx_arena, 0, &err),
               FERRY_EINVAL);
  cr_assert(strstr(err.msg, "not valid UTF-8") != NULL, "%s", err.msg);
  cr_assert_eq(fx_status(D, 0)->n_workers, 0);

  Ferry__V1__WorkerHeartbeatResponse *w = fx_worker(D, 0, "w", NULL, 0,
                                                    false, 0);
  Ferry__V1__GetOrCreateJobResponse *j = fx_job(D, id, "", DIST, 1, FAIL, 0);
  Ferry__V1__ClientHeartbeatResponse *c =
      fx_client(D, j->job_id, j->client_id, 1, NULL, 0, false, 0);
  fx_task_t t = TASK(j->job_id, 0, c->assignments[0]->split,
                     c->assignments[0]->lease);
  t.error_code = FERRY_EDATACRC;
  t.error = "caf\xe9.tfrecord: record 1 at byte offset 9: bad";
  fx_worker(D, w->worker_id, "w", &t, 1, false, 10);
  Ferry__V1__GetStatusResponse *s = fx_status(D, 10);
  cr_assert_eq(s->jobs[0]->state, FAILED);
  cr_assert_str_eq(s->jobs[0]->error,
                   "caf?.tfrecord: record 1 at byte offset 9: bad");
}

/* ---- Operator calls ------------------------------------------ */

static Ferry__V1__DrainWorkerResponse *drain(ferry_disp_t *d, uint64_t id,
                                             const char *addr, int64_t now,
                                             int want_rc) {
  Ferry__V1__DrainWorkerRequest req = FERRY__V1__DRAIN_WORKER_REQUEST__INIT;
  Ferry__V1__DrainWorkerResponse *resp =
      ferry__arena_alloc(&fx_arena, sizeof(*resp));
  ferry_error_t err = {0};
  ferry__v1__drain_worker_response__init(resp);
  req.worker_id = id;
  req.address = (char *)(addr != NULL ? addr : "");
  cr_assert_eq(ferry__disp_drain_worker(d, &req, resp, &fx_arena, now, &err),
               want_rc, "%s", err.msg);
  return resp;
}

static Ferry__V1__CancelJobResponse *cancel(ferry_disp_t *d, uint64_t job,
                                            int64_t now, int want_rc,
                                            ferry_error_t *err) {
  Ferry__V1__CancelJobRequest req = FERRY__V1__CANCEL_JOB_REQUEST__INIT;
  Ferry__V1__CancelJobResponse *resp =
      ferry__arena_alloc(&fx_arena, sizeof(*resp));
  ferry__v1__cancel_job_response__init(resp);
  req.job_id = job;
  cr_assert_eq(ferry__disp_cancel_job(d, &req, resp, &fx_arena, now, err),
               want_rc, "%s", err->msg);
  return resp;
}

static ferry_disp_t *replayed(int64_t now) {
  ferry_disp_config_t cfg;
  ferry_disp_t *r;
  ferry_error_t err = {0};
  ferry__disp_config_init(&cfg);
  cfg.worker_timeout_ms = cfg.client_timeout_ms = 1000;
  cfg.job_gc_ms = 5000;
  cfg.records_per_split = 10;
  cr_assert_eq(ferry__disp_new(&cfg, now, &r), 0);
  for (size_t i = 0; i < fx_entries.n; i++)
    cr_assert_eq(ferry__disp_apply(r, fx_entries.e[i], fx_entries.len[i], now,
                                   &err),
                 0, "entry %zu: %s", i, err.msg);
  ferry__disp_replayed(r, now);
  return r;
}

static const char *wstate(Ferry__V1__GetStatusResponse *s, uint64_t id) {
  for (size_t i = 0; i < s->n_workers; i++)
    if (s->workers[i]->worker_id == id)
      return s->workers[i]->state;
  cr_assert_fail("worker %llu not in status", (unsigned long long)id);
  return NULL;
}

/* A drain moves the worker's leases to another worker from the client's
 * acknowledged count with a newer lease, cancels its tasks, reports it
 * drained once a heartbeat lists no unfinished task, and stays in the
 * journal: a restarted dispatcher gives it no lease either. */
Test(dispatcher, drain_moves_leases_from_delivered_and_is_journaled) {
  const char *id = dataset(4);
  Ferry__V1__WorkerHeartbeatResponse *a =
      fx_worker(D, 0, "a:1", NULL, 0, false, 0);
  Ferry__V1__WorkerHeartbeatResponse *b =
      fx_worker(D, 0, "b:1", NULL, 0, false, 0);
  uint64_t ida = a->worker_id, idb = b->worker_id;
  Ferry__V1__GetOrCreateJobResponse *j = fx_job(D, id, "", DIST, 1, FAIL, 0);
  Ferry__V1__ClientHeartbeatResponse *c =
      fx_client(D, j->job_id, j->client_id, 4, NULL, 0, false, 10);
  fx_task_t ta[4];
  size_t na = 0;
  uint32_t split_a = 99;
  uint64_t lease_a = 0;

  cr_assert_eq(c->n_assignments, 4);
  for (size_t i = 0; i < c->n_assignments; i++)
    if (c->assignments[i]->worker_id == ida && split_a == 99) {
      split_a = c->assignments[i]->split;
      lease_a = c->assignments[i]->lease;
    }
  cr_assert_neq(split_a, 99, "worker a got a split");
  uint64_t prog[4] = {0, split_a, 3, 0};
  fx_client(D, j->job_id, j->client_id, 0, prog, 1, false, 20);
  a = fx_worker(D, ida, "a:1", NULL, 0, false, 30);
  for (size_t i = 0; i < a->n_new_tasks; i++)
    ta[na++] = (fx_task_t)TASK(j->job_id, 0, a->new_tasks[i]->split->index,
                               a->new_tasks[i]->lease);
  cr_assert_eq(na, 2, "two of four splits on a");

  drain(D, 0, "", 40, FERRY_EINVAL);
  drain(D, 77, NULL, 40, FERRY_ENOENT);
  drain(D, 0, "nowhere:1", 40, FERRY_ENOENT);
  Ferry__V1__DrainWorkerResponse *r = drain(D, 0, "a:1", 40, 0);
  cr_assert_eq(r->worker_id, ida, "found by address");
  cr_assert_eq(r->moved, 2);
  cr_assert_eq(r->tasks, 0, "its leases moved at once");
  cr_assert_eq(r->other_workers, 1);
  cr_assert_not(r->drained, "its heartbeat has not confirmed it yet");
  cr_assert_str_eq(r->state, "draining");

  /* b gets both rows, a's acknowledged split from 3 with a newer lease. */
  b = fx_worker(D, idb, "b:1", NULL, 0, false, 50);
  cr_assert_eq(b->n_new_tasks, 4);
  for (size_t i = 0; i < b->n_new_tasks; i++)
    if (b->new_tasks[i]->split->index == split_a) {
      cr_assert_eq(b->new_tasks[i]->start, 3, "resumes at delivered");
      cr_assert_gt(b->new_tasks[i]->lease, lease_a);
    }
  c = fx_client(D, j->job_id, j->client_id, 0, NULL, 0, false, 55);
  for (size_t i = 0; i < c->n_assignments; i++)
    cr_assert_eq(c->assignments[i]->worker_id, idb);

  /* a hears its tasks cancelled; a heartbeat without them confirms. */
  a = fx_worker(D, ida, "a:1", ta, na, false, 60);
  cr_assert_eq(a->n_cancelled, 2);
  cr_assert_eq(a->n_new_tasks, 0);
  cr_assert_not(drain(D, ida, NULL, 61, 0)->drained,
                "a heartbeat still listing unfinished tasks");
  a = fx_worker(D, ida, "a:1", NULL, 0, false, 70);
  r = drain(D, ida, NULL, 71, 0);
  cr_assert(r->drained);
  cr_assert_eq(r->moved, 0, "a second call moves nothing");
  cr_assert_str_eq(r->state, "drained");
  cr_assert(fx_status(D, 72)->workers[0]->operator_drained);

  /* Restarted: a stays drained, b is "unknown" until it heartbeats. */
  ferry_disp_t *R = replayed(100);
  cr_assert_str_eq(wstate(fx_status(R, 100), idb), "unknown");
  cr_assert_str_eq(wstate(fx_status(R, 100), ida), "draining");
  fx_worker(R, ida, "a:1", NULL, 0, false, 110);
  cr_assert_str_eq(wstate(fx_status(R, 111), ida), "drained");
  c = fx_client(R, j->job_id, j->client_id, 0, NULL, 0, false, 120);
  a = fx_worker(R, ida, "a:1", NULL, 0, false, 130);
  cr_assert_eq(a->n_new_tasks, 0, "no lease to a drained worker");
  b = fx_worker(R, idb, "b:1", NULL, 0, false, 140);
  cr_assert_eq(b->n_new_tasks, 4);
  cr_assert_str_eq(wstate(fx_status(R, 141), idb), "alive");
  ferry__disp_free(R);
}

/* A worker that left before a restart is not listed as alive: "unknown"
 * until its timeout makes it "lost". */
Test(dispatcher, workers_silent_since_a_restart_are_not_alive) {
  dataset(1);
  Ferry__V1__WorkerHeartbeatResponse *a =
      fx_worker(D, 0, "a:1", NULL, 0, false, 0);
  cr_assert_str_eq(wstate(fx_status(D, 1), a->worker_id), "alive");
  ferry_disp_t *R = replayed(10);
  cr_assert_str_eq(wstate(fx_status(R, 10), a->worker_id), "unknown");
  ferry__disp_tick(R, 10 + 1000);
  cr_assert_str_eq(wstate(fx_status(R, 1010), a->worker_id), "lost");
  ferry__disp_free(R);
}

Test(dispatcher, cancel_fails_the_clients_and_cancels_the_tasks) {
  const char *id = dataset(2);
  ferry_error_t err = {0};
  Ferry__V1__WorkerHeartbeatResponse *w =
      fx_worker(D, 0, "w:1", NULL, 0, false, 0);
  Ferry__V1__GetOrCreateJobResponse *j = fx_job(D, id, "", DIST, 1, FAIL, 0);
  Ferry__V1__ClientHeartbeatResponse *c =
      fx_client(D, j->job_id, j->client_id, 2, NULL, 0, false, 10);
  fx_task_t t[2];
  char want[64];

  cr_assert_eq(c->n_assignments, 2);
  w = fx_worker(D, w->worker_id, "w:1", NULL, 0, false, 20);
  cr_assert_eq(w->n_new_tasks, 2);
  for (int i = 0; i < 2; i++)
    t[i] = (fx_task_t)TASK(j->job_id, 0, w->new_tasks[i]->split->index,
                           w->new_tasks[i]->lease);
  cancel(D, 999, 25, FERRY_ENOENT, &err);
  Ferry__V1__CancelJobResponse *r = cancel(D, j->job_id, 30, 0, &err);
  cr_assert_eq(r->state, FERRY__V1__JOB_STATE__JOB_STATE_CANCELLED);
  cr_assert_not(r->already);
  cr_assert(cancel(D, j->job_id, 31, 0, &err)->already);
  snprintf(want, sizeof(want), "job %llu cancelled by the operator",
           (unsigned long long)j->job_id);
  c = fx_client(D, j->job_id, j->client_id, 1, NULL, 0, false, 40);
  cr_assert_eq(c->state, FERRY__V1__JOB_STATE__JOB_STATE_CANCELLED);
  cr_assert_eq(c->error_code, FERRY_ECANCELED);
  cr_assert_str_eq(c->error, want);
  cr_assert_eq(c->n_assignments, 0);
  w = fx_worker(D, w->worker_id, "w:1", t, 2, false, 50);
  cr_assert_eq(w->n_cancelled, 2, "its tasks are cancelled");
  cr_assert_str_eq(fx_status(D, 51)->jobs[0]->error, want);

  /* A restarted dispatcher keeps both cancels. */
  Ferry__V1__GetOrCreateJobResponse *k = fx_job(D, id, "", DIST, 1, FAIL, 60);
  cancel(D, k->job_id, 61, 0, &err);
  ferry_disp_t *R = replayed(100);
  Ferry__V1__GetStatusResponse *s = fx_status(R, 100);
  cr_assert_eq(s->n_jobs, 2);
  cr_assert_eq(s->jobs[0]->state, FERRY__V1__JOB_STATE__JOB_STATE_CANCELLED);
  cr_assert_str_eq(s->jobs[0]->error, want);
  c = fx_client(R, j->job_id, j->client_id, 1, NULL, 0, false, 110);
  cr_assert_eq(c->error_code, FERRY_ECANCELED);
  ferry__disp_free(R);
}

/* ---- Workers clients cannot reach; figures of jobs without live clients */

/* A client heartbeat of (job, client) asking for `want` splits that lists
 * worker `w` at `addr` as unreachable after `failures` failed streams
 * (failures 0: lists nothing). */
static Ferry__V1__ClientHeartbeatResponse *
unreachable_beat(uint64_t job, uint64_t client, uint32_t want, uint64_t w,
                 const char *addr, uint32_t failures, int64_t now) {
  Ferry__V1__ClientHeartbeatRequest req =
      FERRY__V1__CLIENT_HEARTBEAT_REQUEST__INIT;
  Ferry__V1__UnreachableWorker u = FERRY__V1__UNREACHABLE_WORKER__INIT;
  Ferry__V1__UnreachableWorker *up = &u;
  Ferry__V1__ClientHeartbeatResponse *resp =
      ferry__arena_alloc(&fx_arena, sizeof(*resp));
  ferry_error_t err = {0};
  ferry__v1__client_heartbeat_response__init(resp);
  req.job_id = job;
  req.client_id = client;
  req.want_splits = want;
  u.worker_id = w;
  u.address = (char *)addr;
  u.reason = "failed to connect to all addresses; last error: Peer name "
             "127.0.0.4 is not in peer certificate\n";
  u.failures = failures;
  req.unreachable = &up;
  req.n_unreachable = failures > 0;
  fx_sign(&req);
  cr_assert_eq(ferry__disp_client_heartbeat(D, &req, resp, &fx_arena, now,
                                            &err),
               0, "%s", err.msg);
  return resp;
}

static const Ferry__V1__WorkerStatus *
worker_status_of(Ferry__V1__GetStatusResponse *s, uint64_t id) {
  for (size_t i = 0; i < s->n_workers; i++)
    if (s->workers[i]->worker_id == id)
      return s->workers[i];
  cr_assert_fail("worker %llu not in status", (unsigned long long)id);
  return NULL;
}

static size_t leased_to(const Ferry__V1__ClientHeartbeatResponse *c,
                        uint64_t worker) {
  size_t n = 0;
  for (size_t i = 0; i < c->n_assignments; i++)
    n += c->assignments[i]->worker_id == worker;
  return n;
}

Test(dispatcher, unreachable_worker_is_avoided_by_that_client_only) {
  const char *id = dataset(12);
  Ferry__V1__WorkerHeartbeatResponse *a, *b;
  a = fx_worker(D, 0, "127.0.0.4:5051", NULL, 0, false, 0);
  b = fx_worker(D, 0, "b", NULL, 0, false, 0);
  uint64_t wa = a->worker_id, wb = b->worker_id;
  Ferry__V1__GetOrCreateJobResponse *j1 =
      fx_job(D, id, "shared", DIST, 1, FAIL, 0);
  Ferry__V1__GetOrCreateJobResponse *j2 =
      fx_job(D, id, "shared", DIST, 1, FAIL, 0);
  uint64_t job = j1->job_id, c1 = j1->client_id, c2 = j2->client_id;
  Ferry__V1__ClientHeartbeatResponse *c;
  Ferry__V1__GetStatusResponse *s;

  c = fx_client(D, job, c1, 4, NULL, 0, false, 0);
  cr_assert_eq(leased_to(c, wa), 2, "balanced before anyone knows");
  cr_assert_eq(c->worker_counts->serving, 2);
  cr_assert_eq(c->worker_counts->avoided, 0);
  /* One failure is not reported by clients (a dying worker); two are. */
  c = unreachable_beat(job, c1, 0, wa, "127.0.0.4:5051", 2, 100);
  cr_assert_eq(c->n_assignments, 4);
  cr_assert_eq(leased_to(c, wa), 0, "its splits moved off the worker");
  cr_assert_eq(leased_to(c, wb), 4);
  for (size_t i = 0; i < c->n_assignments; i++)
    cr_assert_eq(c->assignments[i]->start, 0, "from delivered");
  cr_assert_eq(c->worker_counts->serving, 2);
  cr_assert_eq(c->worker_counts->avoided, 1);
  s = fx_status(D, 150);
  const Ferry__V1__WorkerStatus *ws = worker_status_of(s, wa);
  cr_assert_str_eq(ws->state, "alive", "it heartbeats: alive, yet...");
  cr_assert_eq(ws->unreachable_clients, 1);
  cr_assert(strstr(ws->unreachable_reason,
                   "Peer name 127.0.0.4 is not in peer certificate") != NULL,
            "%s", ws->unreachable_reason);
  cr_assert_null(strchr(ws->unreachable_reason, '\n'), "cleaned");
  cr_assert_eq(ws->unreachable_ms_ago, 50);
  cr_assert_eq(worker_status_of(s, wb)->unreachable_clients, 0);
  cr_assert_eq(worker_status_of(s, wb)->unreachable_ms_ago, -1);
  /* a's next heartbeat gets none of the moved leases. */
  a = fx_worker(D, wa, "127.0.0.4:5051", NULL, 0, false, 200);
  cr_assert_eq(a->n_new_tasks, 0, "nothing for a: c1's rows left it");
  /* c1 keeps listing it: its new splits avoid a, though a is idle. */
  c = unreachable_beat(job, c1, 2, wa, "127.0.0.4:5051", 2, 300);
  cr_assert_eq(c->n_assignments, 6);
  cr_assert_eq(leased_to(c, wa), 0);
  /* Another client is not affected: a, idle, gets its split. */
  c = fx_client(D, job, c2, 1, NULL, 0, false, 310);
  cr_assert_eq(leased_to(c, wa), 1, "only c1 avoids a");
  /* Past the backoff (1 s), a probe may go to a; a new failure moves it
   * again and doubles the backoff. */
  fx_worker(D, wa, "127.0.0.4:5051", NULL, 0, false, 900);
  fx_worker(D, wb, "b", NULL, 0, false, 900);
  c = unreachable_beat(job, c1, 1, wa, "127.0.0.4:5051", 2, 1150);
  cr_assert_eq(leased_to(c, wa), 1, "the probe after the backoff");
  c = unreachable_beat(job, c1, 0, wa, "127.0.0.4:5051", 3, 1200);
  cr_assert_eq(leased_to(c, wa), 0, "a new failure: moved again");
  c = unreachable_beat(job, c1, 1, wa, "127.0.0.4:5051", 3, 1900);
  cr_assert_eq(leased_to(c, wa), 0, "within the doubled backoff");
  /* The client reached it again (it lists it no more): lifted. */
  c = fx_client(D, job, c1, 1, NULL, 0, false, 1950);
  cr_assert_eq(c->worker_counts->avoided, 0);
  cr_assert_eq(leased_to(c, wa), 1, "a, the lightest, serves c1 again");
  s = fx_status(D, 1960);
  cr_assert_eq(worker_status_of(s, wa)->unreachable_clients, 0);
  cr_assert_geq(worker_status_of(s, wa)->unreachable_ms_ago, 0,
                "the last reason stays for the operator");
}

Test(dispatcher, unreachable_reports_are_bounded_and_end_with_the_client) {
  const char *id = dataset(4);
  uint64_t wa = fx_worker(D, 0, "a", NULL, 0, false, 0)->worker_id;
  Ferry__V1__GetOrCreateJobResponse *j = fx_job(D, id, "", DIST, 1, FAIL, 0);
  Ferry__V1__ClientHeartbeatRequest req =
      FERRY__V1__CLIENT_HEARTBEAT_REQUEST__INIT;
  Ferry__V1__ClientHeartbeatResponse resp =
      FERRY__V1__CLIENT_HEARTBEAT_RESPONSE__INIT;
  Ferry__V1__UnreachableWorker u = FERRY__V1__UNREACHABLE_WORKER__INIT;
  Ferry__V1__UnreachableWorker *many[FERRY_DISP_MAX_UNREACHABLE + 1];
  ferry_error_t err = {0};
  char big[FERRY_DISP_MAX_REASON_LEN + 2];

  for (size_t i = 0; i <= FERRY_DISP_MAX_UNREACHABLE; i++)
    many[i] = &u;
  u.worker_id = wa;
  u.address = "a";
  u.reason = "x";
  u.failures = 2;
  req.job_id = j->job_id;
  req.client_id = j->client_id;
  req.unreachable = many;
  req.n_unreachable = FERRY_DISP_MAX_UNREACHABLE + 1;
  fx_sign(&req);
  cr_assert_eq(ferry__disp_client_heartbeat(D, &req, &resp, &fx_arena, 10,
                                            &err),
               FERRY_EINVAL);
  memset(big, 'r', sizeof(big) - 1);
  big[sizeof(big) - 1] = '\0';
  u.reason = big;
  req.n_unreachable = 1;
  cr_assert_eq(ferry__disp_client_heartbeat(D, &req, &resp, &fx_arena, 10,
                                            &err),
               FERRY_EINVAL);
  cr_assert_eq(worker_status_of(fx_status(D, 10), wa)->unreachable_clients,
               0, "refused before any change");
  unreachable_beat(j->job_id, j->client_id, 0, wa, "a", 2, 20);
  cr_assert_eq(worker_status_of(fx_status(D, 20), wa)->unreachable_clients,
               1);
  /* Another address under that id: a worker registered again since. */
  unreachable_beat(j->job_id, j->client_id, 0, wa, "elsewhere", 5, 30);
  cr_assert_eq(worker_status_of(fx_status(D, 30), wa)->unreachable_clients,
               0, "not listed (the stale entry names another address)");
  unreachable_beat(j->job_id, j->client_id, 0, wa, "a", 2, 40);
  fx_client(D, j->job_id, j->client_id, 0, NULL, 0, true, 50);
  cr_assert_eq(worker_status_of(fx_status(D, 50), wa)->unreachable_clients,
               0, "a client that left reports nothing");
}

/* A heartbeat with stats: whole-run stall and rate, and those of the last
 * interval (ival_s long; 0: none). */
static void stats_beat(uint64_t job, uint64_t client, double stall,
                       double bps, double ival_stall, double ival_bps,
                       double ival_s, const uint64_t *prog, size_t n,
                       bool leaving, int64_t now) {
  Ferry__V1__ClientHeartbeatRequest req =
      FERRY__V1__CLIENT_HEARTBEAT_REQUEST__INIT;
  Ferry__V1__ClientHeartbeatResponse resp =
      FERRY__V1__CLIENT_HEARTBEAT_RESPONSE__INIT;
  Ferry__V1__ClientStats st = FERRY__V1__CLIENT_STATS__INIT;
  Ferry__V1__SplitProgress p[8], *pp[8];
  ferry_error_t err = {0};
  for (size_t i = 0; i < n && i < 8; i++) {
    ferry__v1__split_progress__init(&p[i]);
    p[i].epoch = (uint32_t)prog[4 * i];
    p[i].split = (uint32_t)prog[4 * i + 1];
    p[i].delivered = prog[4 * i + 2];
    pp[i] = &p[i];
  }
  st.stall_fraction = stall;
  st.batches_per_second = bps;
  st.interval_stall_fraction = ival_stall;
  st.interval_batches_per_second = ival_bps;
  st.interval_seconds = ival_s;
  req.job_id = job;
  req.client_id = client;
  req.stats = &st;
  req.progress = pp;
  req.n_progress = n;
  req.leaving = leaving;
  fx_sign(&req);
  cr_assert_eq(ferry__disp_client_heartbeat(D, &req, &resp, &fx_arena, now,
                                            &err),
               0, "%s", err.msg);
}

Test(dispatcher, finished_job_keeps_its_last_stall_figures) {
  const char *id = dataset(2);
  fx_worker(D, 0, "a", NULL, 0, false, 0);
  Ferry__V1__GetOrCreateJobResponse *j = fx_job(D, id, "", DIST, 1, FAIL, 0);
  Ferry__V1__ClientHeartbeatResponse *c =
      fx_client(D, j->job_id, j->client_id, 2, NULL, 0, false, 0);
  cr_assert_eq(c->n_assignments, 2);
  Ferry__V1__GetStatusResponse *s = fx_status(D, 10);
  cr_assert_eq(s->jobs[0]->live_clients, 0);
  cr_assert_eq(s->jobs[0]->figures_ms_ago, -1, "nobody reported yet");
  uint64_t prog[8] = {0, c->assignments[0]->split, 10, 0,
                      0, c->assignments[1]->split, 10, 0};
  stats_beat(j->job_id, j->client_id, 0.5, 80, 0.4, 90, 0.25, NULL, 0,
             false, 100);
  s = fx_status(D, 200);
  cr_assert_eq(s->jobs[0]->live_clients, 1);
  cr_assert_eq(s->jobs[0]->figures_ms_ago, 0);
  cr_assert_float_eq(s->jobs[0]->stall_fraction, 0.4, 1e-9, "the interval");
  /* Every record delivered; the trainer leaves with its whole-run figures
   * (it waited 99.1% of its time). */
  stats_beat(j->job_id, j->client_id, 0.991, 60, 1.0, 0, 0.25, prog, 2,
             false, 300);
  stats_beat(j->job_id, j->client_id, 0.991, 60, 1.0, 0, 0.01, NULL, 0,
             true, 310);
  s = fx_status(D, 1310);
  cr_assert_eq(s->jobs[0]->state, FINISHED);
  cr_assert_eq(s->jobs[0]->live_clients, 0);
  cr_assert_eq(s->jobs[0]->figures_ms_ago, 1000);
  cr_assert_float_eq(s->jobs[0]->stall_fraction, 0.991, 1e-9,
                     "the trainer's last figure, not 0");
  cr_assert_float_eq(s->jobs[0]->batches_per_second, 60, 1e-9);
}

Test(dispatcher, dead_clients_rate_is_not_a_current_one) {
  const char *id = dataset(4);
  fx_worker(D, 0, "a", NULL, 0, false, 0);
  Ferry__V1__GetOrCreateJobResponse *j = fx_job(D, id, "", DIST, 1, FAIL, 0);
  fx_client(D, j->job_id, j->client_id, 2, NULL, 0, false, 0);
  stats_beat(j->job_id, j->client_id, 0.3, 1500, 0.2, 1571.2, 0.25, NULL, 0,
             false, 100);
  Ferry__V1__GetStatusResponse *s = fx_status(D, 300);
  cr_assert_eq(s->jobs[0]->live_clients, 1);
  cr_assert_float_eq(s->jobs[0]->batches_per_second, 1571.2, 1e-9);
  /* Killed: no more reports, yet active until its timeout (no tick). */
  s = fx_status(D, 2500);
  cr_assert_eq(s->jobs[0]->n_clients, 1, "still counted as a client");
  cr_assert_eq(s->jobs[0]->live_clients, 0, "but not live");
  cr_assert_eq(s->jobs[0]->figures_ms_ago, 2400, "figures of back then");
  cr_assert_float_eq(s->jobs[0]->stall_fraction, 0.3, 1e-9,
                     "its whole-run figures as of its last report");
  /* A heartbeat every 1 s keeps it live for 4 intervals. */
  stats_beat(j->job_id, j->client_id, 0.3, 1500, 0.2, 1571.2, 1.0, NULL, 0,
             false, 3000);
  cr_assert_eq(fx_status(D, 6900)->jobs[0]->live_clients, 1);
  cr_assert_eq(fx_status(D, 7100)->jobs[0]->live_clients, 0);
}

/* A client that asks for every split and never reads (opens no
 * stream: its tasks never produce) is bound FERRY_DISP_UNREAD_ROWS rows
 * at most; once a worker produced records of one of its splits, or it
 * acknowledged records, it gets what it asks for. */
Test(dispatcher, a_client_that_has_not_read_is_bound_few_rows) {
  const char *id = dataset(40);
  Ferry__V1__WorkerHeartbeatResponse *w = fx_worker(D, 0, "w", NULL, 0,
                                                    false, 0);
  Ferry__V1__GetOrCreateJobResponse *j = fx_job(D, id, "", DIST, 1, FAIL, 0);
  Ferry__V1__GetOrCreateJobResponse *k = fx_job(D, id, "", DIST, 1, FAIL, 0);
  Ferry__V1__ClientHeartbeatResponse *c;
  c = fx_client(D, j->job_id, j->client_id, 4096, NULL, 0, false, 10);
  cr_assert_eq(c->n_assignments, FERRY_DISP_UNREAD_ROWS);
  c = fx_client(D, j->job_id, j->client_id, 4096, NULL, 0, false, 20);
  cr_assert_eq(c->n_assignments, FERRY_DISP_UNREAD_ROWS,
               "asking again got more without reading");
  /* A worker produced records of one of its splits: it reads. */
  fx_task_t t = TASK(j->job_id, 0, c->assignments[0]->split,
                     c->assignments[0]->lease);
  t.produced = 5;
  w = fx_worker(D, w->worker_id, "w", &t, 1, false, 30);
  c = fx_client(D, j->job_id, j->client_id, 4096, NULL, 0, false, 40);
  cr_assert_eq(c->n_assignments, 40, "a client that reads gets the rest");
  /* The other job's client proves itself by acknowledging. */
  c = fx_client(D, k->job_id, k->client_id, 4096, NULL, 0, false, 50);
  cr_assert_eq(c->n_assignments, FERRY_DISP_UNREAD_ROWS);
  uint64_t prog[4] = {0, c->assignments[0]->split, 2, 0};
  c = fx_client(D, k->job_id, k->client_id, 4096, prog, 1, false, 60);
  cr_assert_eq(c->n_assignments, 40);
}

/* A worker's transport endpoints reach clients as the worker published
 * them, whatever their names (the dispatcher knows no transport), a
 * change replaces them, and a list over the seam's bounds is refused
 * before any change, naming the endpoint and the field. */
Test(dispatcher, worker_endpoints_are_relayed_as_published) {
  const char *id = dataset(4);
  uint8_t addr[300];
  for (size_t i = 0; i < sizeof(addr); i++)
    addr[i] = (uint8_t)(i * 7);
  Ferry__V1__TransportEndpoint e[FERRY_TRANSPORT_ENDPOINTS_MAX + 1];
  Ferry__V1__TransportEndpoint *ep[FERRY_TRANSPORT_ENDPOINTS_MAX + 1];
  for (size_t i = 0; i <= FERRY_TRANSPORT_ENDPOINTS_MAX; i++) {
    ferry__v1__transport_endpoint__init(&e[i]);
    ep[i] = &e[i];
  }
  e[0].transport = "grpc";
  e[1].transport = "not_built_here";
  e[1].address.data = addr;
  e[1].address.len = sizeof(addr);
  Ferry__V1__WorkerHeartbeatRequest wq =
      FERRY__V1__WORKER_HEARTBEAT_REQUEST__INIT;
  Ferry__V1__WorkerHeartbeatResponse wr =
      FERRY__V1__WORKER_HEARTBEAT_RESPONSE__INIT;
  ferry_error_t err = {0};
  wq.address = "w:1";
  wq.endpoints = ep;
  wq.n_endpoints = 2;
  cr_assert_eq(ferry__disp_worker_heartbeat(D, &wq, &wr, &fx_arena, 0, &err),
               0, "%s", err.msg);
  Ferry__V1__GetOrCreateJobResponse *j = fx_job(D, id, "", DIST, 1, FAIL, 0);
  Ferry__V1__ClientHeartbeatResponse *c =
      fx_client(D, j->job_id, j->client_id, 4, NULL, 0, false, 10);
  cr_assert_eq(c->n_workers, 1);
  const Ferry__V1__WorkerInfo *wi = c->workers[0];
  cr_assert_eq(wi->n_endpoints, 2);
  cr_assert_str_eq(wi->endpoints[0]->transport, "grpc");
  cr_assert_eq(wi->endpoints[0]->address.len, 0);
  cr_assert_str_eq(wi->endpoints[1]->transport, "not_built_here");
  cr_assert_eq(wi->endpoints[1]->address.len, sizeof(addr));
  cr_assert_eq(memcmp(wi->endpoints[1]->address.data, addr, sizeof(addr)),
               0);

  /* A heartbeat without endpoints (a worker of an older release, or one
   * whose transports all failed but gRPC) clears them. */
  wq.worker_id = wr.worker_id;
  wq.n_endpoints = 1;
  cr_assert_eq(ferry__disp_worker_heartbeat(D, &wq, &wr, &fx_arena, 20, &err),
               0, "%s", err.msg);
  c = fx_client(D, j->job_id, j->client_id, 4, NULL, 0, false, 30);
  cr_assert_eq(c->workers[0]->n_endpoints, 1);
  cr_assert_str_eq(c->workers[0]->endpoints[0]->transport, "grpc");

  /* Over the bounds: refused, and the last good list stays. */
  static uint8_t big[FERRY_TRANSPORT_ADDRESS_MAX + 1];
  struct {
    size_t at, n;
    const char *name;
    size_t len;
    const char *says;
  } bad[] = {
      {1, 2, "grpc", 0, "endpoints[1].transport"},   /* twice */
      {1, 2, "Bad-Name", 0, "endpoints[1].transport"},
      {1, 2, "big", sizeof(big), "endpoints[1].address"},
      {1, FERRY_TRANSPORT_ENDPOINTS_MAX + 1, "x", 0, "endpoints"},
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    for (size_t k = 1; k <= FERRY_TRANSPORT_ENDPOINTS_MAX; k++) {
      static char names[FERRY_TRANSPORT_ENDPOINTS_MAX + 1][8];
      snprintf(names[k], sizeof(names[k]), "t%zu", k);
      e[k].transport = names[k];
      e[k].address.len = 0;
    }
    e[bad[i].at].transport = (char *)bad[i].name;
    e[bad[i].at].address.data = big;
    e[bad[i].at].address.len = bad[i].len;
    wq.n_endpoints = bad[i].n;
    size_t before = fx_entries.n;
    cr_assert_eq(ferry__disp_worker_heartbeat(D, &wq, &wr, &fx_arena,
                                              40 + (int64_t)i, &err),
                 FERRY_EINVAL, "case %zu accepted", i);
    cr_assert(strstr(err.msg, bad[i].says) != NULL, "case %zu: %s", i,
              err.msg);
    cr_assert_eq(fx_entries.n, before, "nothing journaled");
  }
  c = fx_client(D, j->job_id, j->client_id, 4, NULL, 0, false, 60);
  cr_assert_eq(c->workers[0]->n_endpoints, 1);
  cr_assert_str_eq(c->workers[0]->endpoints[0]->transport, "grpc");
}

/* A worker's cache report is kept as its last heartbeat sent it, shown in
 * GetStatus, bounded before anything changes, and cleared by a heartbeat
 * without one. */
Test(dispatcher, worker_cache_reports_are_bounded_and_shown) {
  dataset(1); /* makes the state */
  Ferry__V1__CachePolicy pol[65], *pp[65];
  for (int i = 0; i < 65; i++) {
    ferry__v1__cache_policy__init(&pol[i]);
    pol[i].dataset_id = "00000000000000aa";
    pol[i].choice = "cache";
    pol[i].reason = "recompute 1.0 ms > read 0.1 ms";
    pp[i] = &pol[i];
  }
  Ferry__V1__CacheReport rep = FERRY__V1__CACHE_REPORT__INIT;
  rep.dir = "/var/cache/ferry";
  rep.hits = 42;
  rep.policies = pp;
  rep.n_policies = 1;
  Ferry__V1__WorkerHeartbeatRequest wq =
      FERRY__V1__WORKER_HEARTBEAT_REQUEST__INIT;
  Ferry__V1__WorkerHeartbeatResponse wr =
      FERRY__V1__WORKER_HEARTBEAT_RESPONSE__INIT;
  ferry_error_t err = {0};
  wq.address = "w:1";
  wq.cache = &rep;
  cr_assert_eq(ferry__disp_worker_heartbeat(D, &wq, &wr, &fx_arena, 0, &err),
               0, "%s", err.msg);
  Ferry__V1__GetStatusResponse *s = fx_status(D, 1);
  cr_assert_eq(s->n_workers, 1);
  const Ferry__V1__CacheReport *got = s->workers[0]->cache;
  cr_assert_not_null(got);
  cr_assert_str_eq(got->dir, "/var/cache/ferry");
  cr_assert_eq(got->hits, 42);
  cr_assert_eq(got->n_policies, 1);
  cr_assert_str_eq(got->policies[0]->choice, "cache");

  /* Over the bounds: refused naming what, the kept report unchanged. */
  wq.worker_id = wr.worker_id;
  rep.n_policies = 65;
  cr_assert_eq(ferry__disp_worker_heartbeat(D, &wq, &wr, &fx_arena, 2, &err),
               FERRY_EINVAL);
  cr_assert(strstr(err.msg, "65 cache policies") != NULL, "%s", err.msg);
  rep.n_policies = 1;
  char reason[600];
  memset(reason, 'x', sizeof(reason) - 1);
  reason[sizeof(reason) - 1] = '\0';
  pol[0].reason = reason;
  cr_assert_eq(ferry__disp_worker_heartbeat(D, &wq, &wr, &fx_arena, 3, &err),
               FERRY_EINVAL);
  cr_assert(strstr(err.msg, "reason") != NULL, "%s", err.msg);
  s = fx_status(D, 4);
  cr_assert_eq(s->workers[0]->cache->hits, 42);

  /* Without one: cleared. */
  wq.cache = NULL;
  cr_assert_eq(ferry__disp_worker_heartbeat(D, &wq, &wr, &fx_arena, 5, &err),
               0, "%s", err.msg);
  s = fx_status(D, 6);
  cr_assert_null(s->workers[0]->cache);
}

/* Shared production: the rows of one split of every sharing job go to one
 * worker (whatever each job's own balance), and the worker's tasks say
 * they share; a job that does not share is balanced as ever. The option
 * survives a replay of the journal. */
Test(dispatcher, sharing_jobs_lease_a_split_to_one_worker) {
  const char *id = dataset(8);
  Ferry__V1__WorkerHeartbeatResponse *w[3];
  for (int i = 0; i < 3; i++) {
    char addr[16];
    snprintf(addr, sizeof(addr), "w%d:1", i);
    w[i] = fx_worker(D, 0, addr, NULL, 0, false, 0);
  }
  Ferry__V1__GetOrCreateJobRequest req =
      FERRY__V1__GET_OR_CREATE_JOB_REQUEST__INIT;
  Ferry__V1__JobOptions o = FERRY__V1__JOB_OPTIONS__INIT;
  req.dataset_id = (char *)id;
  req.options = &o;
  o.job_name = "";
  o.mode = DIST;
  o.num_epochs = 1;
  o.error_policy = FAIL;
  o.share = true;
  Ferry__V1__GetOrCreateJobResponse *j[3];
  ferry_error_t err = {0};
  for (int k = 0; k < 2; k++)
    cr_assert_eq(fx_job_req(D, &req, &j[k], 0, &err), 0, "%s", err.msg);
  o.share = false;
  cr_assert_eq(fx_job_req(D, &req, &j[2], 0, &err), 0, "%s", err.msg);
  uint64_t where[3][8] = {{0}};
  for (int k = 0; k < 3; k++) {
    Ferry__V1__ClientHeartbeatResponse *c =
        fx_client(D, j[k]->job_id, j[k]->client_id, 8, NULL, 0, false, 10);
    cr_assert_eq(c->n_assignments, 8);
    for (size_t i = 0; i < 8; i++)
      where[k][c->assignments[i]->split] = c->assignments[i]->worker_id;
  }
  int used[3] = {0};
  for (int s = 0; s < 8; s++) {
    cr_assert_eq(where[0][s], where[1][s], "split %d: workers %llu and %llu",
                 s, (unsigned long long)where[0][s],
                 (unsigned long long)where[1][s]);
    for (int i = 0; i < 3; i++)
      used[i] += where[0][s] == w[i]->worker_id;
  }
  /* Rendezvous hashing spreads the splits (8 over 3: none takes all). */
  cr_assert(used[0] < 8 && used[1] < 8 && used[2] < 8);
  Ferry__V1__WorkerHeartbeatResponse *r =
      fx_worker(D, w[0]->worker_id, "w0:1", NULL, 0, false, 20);
  cr_assert_gt(r->n_new_tasks, 0);
  for (size_t i = 0; i < r->n_new_tasks; i++)
    cr_assert_eq(r->new_tasks[i]->share,
                 r->new_tasks[i]->job_id != j[2]->job_id,
                 "job %llu's task", (unsigned long long)
                 r->new_tasks[i]->job_id);
  /* A replay of the journal keeps the option. */
  ferry_disp_config_t cfg;
  ferry_disp_t *r2;
  ferry__disp_config_init(&cfg);
  cr_assert_eq(ferry__disp_new(&cfg, 0, &r2), 0);
  for (size_t i = 0; i < fx_entries.n; i++)
    cr_assert_eq(ferry__disp_apply(r2, fx_entries.e[i], fx_entries.len[i], 30,
                                   &err),
                 0, "%s", err.msg);
  Ferry__V1__GetStatusResponse *st = fx_status(r2, 30);
  int shared = 0, alone = 0;
  for (size_t i = 0; i < st->n_jobs; i++)
    *(st->jobs[i]->share ? &shared : &alone) += 1;
  ferry__disp_free(r2);
  cr_assert(shared == 2 && alone == 1, "after the replay %d jobs share, %d "
            "do not", shared, alone);
}
