/* Tests of the dispatcher's journal: replaying a scripted session gives
 * the live state back, a torn tail is cut off, corruption in the middle
 * is refused with its byte offset. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ferry/alloc.h"
#include "ferry/log.h"
#include "fixture.h"
#include "journal.h"


static ferry_disp_t *D;

static void setup(void) {
  fx_begin();
}

static void teardown(void) {
  fx_end(&D);
}

TestSuite(journal, .init = setup, .fini = teardown);

static char *wd(void) {
  static char p[128];
  snprintf(p, sizeof(p), "%s/work", fx_dir);
  return p;
}

static char *journal_path(void) {
  static char p[160];
  snprintf(p, sizeof(p), "%s/work/journal", fx_dir);
  return p;
}

static int replay_into(const uint8_t *e, size_t len, uint64_t off,
                       void *arg, ferry_error_t *err) {
  (void)off;
  return ferry__disp_apply(arg, e, len, 50000, err);
}

/* Runs a session touching every kind of entry on D (journaled into J). */
static void script(void) {
  char spec[512];
  ferry_error_t err = {0};
  Ferry__V1__RegisterDatasetResponse *r;
  Ferry__V1__GetOrCreateJobResponse *a, *a2, *p, *f;
  Ferry__V1__WorkerHeartbeatResponse *w1, *w2;
  Ferry__V1__ClientHeartbeatResponse *c;
  uint64_t prog[8];

  fx_write("a.tfrecord", 40, FERRY_COMPRESSION_NONE);
  fx_write("b.tfrecord", 30, FERRY_COMPRESSION_GZIP);
  snprintf(spec, sizeof(spec),
           "tfrecord(\"%s/*.tfrecord\", compression=auto) | "
           "decode(raw, 1, 1, 1)",
           fx_dir);
  cr_assert_eq(fx_register(D, spec, 0, &r, 0, &err), 0, "%s", err.msg);
  w1 = fx_worker(D, 0, "w1:1", NULL, 0, false, 0);
  w2 = fx_worker(D, 0, "w2:1", NULL, 0, false, 0);
  a = fx_job(D, r->dataset_id, "shared", DIST, 2, SKIP, 0);
  a2 = fx_job(D, r->dataset_id, "shared", DIST, 2, SKIP, 0);
  p = fx_job(D, r->dataset_id, "", PARALLEL, 1, FAIL, 0);
  f = fx_job(D, r->dataset_id, "", DIST, 1, FAIL, 0);
  c = fx_client(D, a->job_id, a->client_id, 3, NULL, 0, false, 10);
  cr_assert_eq(c->n_assignments, 3);
  fx_client(D, a2->job_id, a2->client_id, 2, NULL, 0, false, 10);
  fx_client(D, p->job_id, p->client_id, 3, NULL, 0, false, 10);
  fx_client(D, f->job_id, f->client_id, 1, NULL, 0, false, 10);
  {
    fx_task_t t[3] = {
        {.job = a->job_id, .split = 0, .lease = 1, .produced = 4,
         .skipped = 2},
        {.job = a->job_id, .split = 4, .lease = 1, .produced = 25,
         .finished = true},
        {.job = f->job_id, .split = 0, .lease = 1, .error_code = FERRY_EIO,
         .error = "a.tfrecord: i/o error"}};
    /* Each worker lists the tasks it holds; unknown ones are cancelled. */
    fx_worker(D, w1->worker_id, "w1:1", t, 3, false, 20);
    fx_worker(D, w2->worker_id, "w2:1", t, 3, false, 20);
  }
  prog[0] = 0, prog[1] = 0, prog[2] = 6, prog[3] = 0;
  prog[4] = 0, prog[5] = 1, prog[6] = 10, prog[7] = 0;
  fx_client(D, a->job_id, a->client_id, 0, prog, 2, false, 30);
  /* w2 goes silent and is lost; the clients stay. */
  fx_worker(D, w1->worker_id, "w1:1", NULL, 0, false, 900);
  fx_client(D, a->job_id, a->client_id, 0, NULL, 0, false, 900);
  fx_client(D, a2->job_id, a2->client_id, 0, NULL, 0, false, 900);
  fx_client(D, p->job_id, p->client_id, 0, NULL, 0, false, 900);
  ferry__disp_tick(D, 1100);
  fx_client(D, a2->job_id, a2->client_id, 0, NULL, 0, true, 1200);
}

Test(journal, replay_reproduces_the_state) {
  ferry_journal_t *j;
  ferry_disp_t *b;
  ferry_disp_config_t cfg;
  ferry_error_t err = {0};
  uint8_t *sa, *sb;
  size_t la, lb;
  uint64_t n = 0;
  Ferry__V1__ClientHeartbeatResponse *ca, *cb;

  D = fx_state(1000, 1000, 60000, 8);
  cr_assert_eq(ferry__journal_open(wd(), &j, &err), 0, "%s", err.msg);
  ferry__disp_set_sink(D, ferry__journal_sink, j);
  script();
  cr_assert_eq(ferry__journal_sync(j, &err), 0, "%s", err.msg);
  cr_assert_gt(ferry__journal_size(j), 0);
  ferry__disp_set_sink(D, NULL, NULL);
  ferry__journal_close(j);

  ferry__disp_config_init(&cfg);
  cfg.worker_timeout_ms = cfg.client_timeout_ms = 1000;
  cfg.job_gc_ms = 60000;
  cfg.records_per_split = 8;
  cr_assert_eq(ferry__disp_new(&cfg, 0, &b), 0);
  cr_assert_eq(ferry__journal_open(wd(), &j, &err), 0, "%s", err.msg);
  cr_assert_eq(ferry__journal_replay(j, replay_into, b, false, &n, &err), 0, "%s",
               err.msg);
  cr_assert_gt(n, 20);
  ferry__disp_replayed(b, 1200);
  sa = fx_status_bytes(D, 1200, &la);
  sb = fx_status_bytes(b, 1200, &lb);
  cr_assert_eq(la, lb);
  cr_assert_arr_eq(sa, sb, la, "replayed status differs from the live one");
  {
    Ferry__V1__GetStatusResponse *s = fx_status(b, 1200);
    cr_assert_eq(s->n_jobs, 3);
    cr_assert_str_eq(s->workers[1]->state, "lost");
    cr_assert_eq(s->jobs[0]->skipped, 2);
    cr_assert_eq(s->jobs[2]->state, FERRY__V1__JOB_STATE__JOB_STATE_FAILED);
    cr_assert_str_eq(s->jobs[2]->error, "a.tfrecord: i/o error");
  }
  /* The hidden state (ids, bindings, starts, skip dedupe) matches too:
   * the same next calls give the same answers. Leases are volatile: the
   * replayed rows wait for a worker that heartbeats to the new process,
   * and then go where the live ones are. */
  ferry__disp_set_sink(b, NULL, NULL);
  cr_assert_eq(ferry__disp_boot(b, &err), 0, "%s", err.msg);
  fx_worker(D, 1, "w1:1", NULL, 0, false, 1250);
  fx_worker(b, 1, "w1:1", NULL, 0, false, 1250);
  ca = fx_client(D, 1, 1, 3, NULL, 0, false, 1300);
  ferry_disp_t *live = D;
  D = b;
  cb = fx_client(b, 1, 1, 3, NULL, 0, false, 1300);
  D = live;
  cr_assert_eq(ca->n_assignments, cb->n_assignments);
  for (size_t i = 0; i < ca->n_assignments; i++) {
    cr_assert_eq(ca->assignments[i]->split, cb->assignments[i]->split);
    cr_assert_eq(ca->assignments[i]->start, cb->assignments[i]->start);
    cr_assert_eq(ca->assignments[i]->worker_id,
                 cb->assignments[i]->worker_id);
    cr_assert_geq(cb->assignments[i]->lease, (uint64_t)1 << 32,
                  "a new process's leases are above the old one's");
  }
  sa = fx_status_bytes(D, 1300, &la);
  sb = fx_status_bytes(b, 1300, &lb);
  cr_assert(la == lb && memcmp(sa, sb, la) == 0);
  ferry__journal_close(j);
  ferry__disp_free(b);
}

/* Three raw entries of 100 bytes: each record takes 116 bytes. */
static void write_three(void) {
  ferry_journal_t *j;
  ferry_error_t err = {0};
  uint8_t e[100];
  cr_assert_eq(ferry__journal_open(wd(), &j, &err), 0, "%s", err.msg);
  for (int i = 0; i < 3; i++) {
    memset(e, 'a' + i, sizeof(e));
    ferry__journal_append(j, e, sizeof(e));
  }
  cr_assert_eq(ferry__journal_sync(j, &err), 0, "%s", err.msg);
  cr_assert_eq(ferry__journal_size(j), 348);
  cr_assert_eq(ferry__journal_syncs(j), 1);
  ferry__journal_close(j);
}

static int count_cb(const uint8_t *e, size_t len, uint64_t off, void *arg,
                    ferry_error_t *err) {
  (void)off;
  int *n = arg;
  cr_assert_eq(len, 100);
  cr_assert_eq(e[0], 'a' + *n);
  (*n)++;
  return 0;
}

static off_t file_size(void) {
  struct stat st;
  cr_assert_eq(stat(journal_path(), &st), 0);
  return st.st_size;
}

Test(journal, torn_tail_is_cut_off) {
  ferry_journal_t *j;
  ferry_error_t err = {0};
  uint64_t n;
  int seen = 0;
  uint8_t e[10] = {0};

  write_three();
  cr_assert_eq(truncate(journal_path(), 348 - 30), 0);
  cr_assert_eq(ferry__journal_open(wd(), &j, &err), 0, "%s", err.msg);
  cr_assert_eq(ferry__journal_replay(j, count_cb, &seen, false, &n, &err), 0, "%s",
               err.msg);
  cr_assert_eq(n, 2);
  cr_assert_eq(seen, 2);
  cr_assert_eq(file_size(), 232, "the torn record is gone");
  /* Appends continue after the cut. */
  ferry__journal_append(j, e, sizeof(e));
  cr_assert_eq(ferry__journal_sync(j, &err), 0);
  cr_assert_eq(file_size(), 232 + 26);
  ferry__journal_close(j);

  /* A torn header (fewer than 12 bytes) too. */
  cr_assert_eq(truncate(journal_path(), 232 + 5), 0);
  cr_assert_eq(ferry__journal_open(wd(), &j, &err), 0, "%s", err.msg);
  seen = 0;
  cr_assert_eq(ferry__journal_replay(j, count_cb, &seen, false, &n, &err), 0, "%s",
               err.msg);
  cr_assert_eq(n, 2);
  cr_assert_eq(file_size(), 232);
  ferry__journal_close(j);
}

Test(journal, zero_filled_tail_is_cut_off) {
  ferry_journal_t *j;
  ferry_error_t err = {0};
  uint64_t n;
  int seen = 0;

  write_three();
  cr_assert_eq(truncate(journal_path(), 348 + 4096), 0);
  cr_assert_eq(ferry__journal_open(wd(), &j, &err), 0, "%s", err.msg);
  cr_assert_eq(ferry__journal_replay(j, count_cb, &seen, false, &n, &err), 0, "%s",
               err.msg);
  cr_assert_eq(n, 3);
  cr_assert_eq(file_size(), 348);
  ferry__journal_close(j);
}

Test(journal, corrupt_middle_is_fatal) {
  ferry_journal_t *j;
  ferry_error_t err = {0};
  uint64_t n;
  int seen = 0, fd;
  uint8_t x = 'z';

  write_three();
  fd = open(journal_path(), O_WRONLY);
  cr_assert_eq(pwrite(fd, &x, 1, 116 + 12 + 50), 1);
  close(fd);
  cr_assert_eq(ferry__journal_open(wd(), &j, &err), 0, "%s", err.msg);
  cr_assert_eq(ferry__journal_replay(j, count_cb, &seen, false, &n, &err),
               FERRY_EDATACRC);
  cr_assert(strstr(err.msg, "byte offset 116") != NULL, "%s", err.msg);
  cr_assert_eq(file_size(), 348, "nothing is cut");
  ferry__journal_close(j);
}

Test(journal, bad_entry_is_fatal_with_its_offset) {
  ferry_journal_t *j;
  ferry_disp_t *b;
  ferry_disp_config_t cfg;
  ferry_error_t err = {0};
  uint64_t n;

  write_three(); /* not JournalEntry messages */
  ferry__disp_config_init(&cfg);
  cr_assert_eq(ferry__disp_new(&cfg, 0, &b), 0);
  cr_assert_eq(ferry__journal_open(wd(), &j, &err), 0, "%s", err.msg);
  cr_assert_neq(ferry__journal_replay(j, replay_into, b, false, &n, &err), 0);
  cr_assert(strstr(err.msg, "byte offset 0") != NULL, "%s", err.msg);
  ferry__journal_close(j);
  ferry__disp_free(b);
}

/* ---- Crash tails (issue 7): damage that nothing valid follows is cut,
 * damage followed by a valid entry is refused. ---------------------------- */

static char logged[4][512];
static int nlogged;

static void keep_log(int level, const char *msg, void *arg) {
  (void)arg;
  if (level == FERRY_LOG_WARN && nlogged < 4)
    snprintf(logged[nlogged++], sizeof(logged[0]), "%s", msg);
}

/* Overwrites [from, to) of the journal with `byte` (or pseudo-random
 * bytes when byte < 0), extending the file if `to` is past its end. */
static void damage(off_t from, off_t to, int byte) {
  int fd = open(journal_path(), O_WRONLY);
  uint32_t x = 12345;
  cr_assert_geq(fd, 0);
  for (off_t o = from; o < to; o++) {
    uint8_t b;
    x = x * 1103515245u + 12345u;
    b = byte >= 0 ? (uint8_t)byte : (uint8_t)(x >> 16);
    cr_assert_eq(pwrite(fd, &b, 1, o), 1);
  }
  close(fd);
}

/* Replays, expecting success with `entries` entries, a file cut to `cut`
 * and the warning naming the cut. */
static void expect_cut(uint64_t entries, off_t cut, off_t was) {
  ferry_journal_t *j;
  ferry_error_t err = {0};
  uint64_t n = 0;
  int seen = 0;
  char want[128];

  nlogged = 0;
  ferry_log_set_callback(keep_log, NULL);
  cr_assert_eq(ferry__journal_open(wd(), &j, &err), 0, "%s", err.msg);
  cr_assert_eq(ferry__journal_replay(j, count_cb, &seen, false, &n, &err), 0, "%s",
               err.msg);
  ferry_log_set_callback(NULL, NULL);
  cr_assert_eq(n, entries);
  cr_assert_eq(file_size(), cut, "file is %lld bytes, not cut at %lld",
               (long long)file_size(), (long long)cut);
  cr_assert_eq(ferry__journal_size(j), (uint64_t)cut);
  snprintf(want, sizeof(want), "journal: cut %lld torn bytes at offset %lld",
           (long long)(was - cut), (long long)cut);
  cr_assert_eq(nlogged, 1);
  cr_assert(strstr(logged[0], want) != NULL, "'%s' lacks '%s'", logged[0],
            want);
  ferry__journal_close(j);
}

Test(journal, zeros_from_inside_the_last_entry_are_cut) {
  write_three();
  /* The last entry's data zeroed from its middle, then a zero-filled
   * extension: what a crash on some file systems leaves. */
  damage(232 + 12 + 40, 348 + 8192, 0);
  expect_cut(2, 232, 348 + 8192);
}

Test(journal, zeros_over_the_last_header_are_cut) {
  write_three();
  damage(232 + 3, 348, 0);
  expect_cut(2, 232, 348);
}

Test(journal, garbage_tail_is_cut) {
  write_three();
  damage(232 + 20, 348 + 3000, -1);
  expect_cut(2, 232, 348 + 3000);
  /* Garbage from inside the header too. */
  cr_assert_eq(unlink(journal_path()), 0);
  write_three();
  damage(232 + 4, 348 + 100, -1);
  expect_cut(2, 232, 348 + 100);
}

Test(journal, tail_cut_mid_header_is_cut) {
  write_three();
  cr_assert_eq(truncate(journal_path(), 232 + 7), 0);
  expect_cut(2, 232, 232 + 7);
}

Test(journal, damage_followed_by_a_valid_entry_is_refused) {
  ferry_journal_t *j;
  ferry_error_t err = {0};
  uint64_t n;
  int seen = 0;

  /* Zeros over the second entry (header included), the third intact. */
  write_three();
  damage(116, 200, 0);
  cr_assert_eq(ferry__journal_open(wd(), &j, &err), 0, "%s", err.msg);
  cr_assert_lt(ferry__journal_replay(j, count_cb, &seen, false, &n, &err), 0);
  cr_assert(strstr(err.msg, "byte offset 116") != NULL, "%s", err.msg);
  cr_assert(strstr(err.msg, "valid entry follows at byte offset 232") !=
                NULL,
            "%s", err.msg);
  cr_assert_eq(file_size(), 348, "nothing is cut");
  ferry__journal_close(j);

  /* Garbage in the middle, and zeros after the last valid entry: still
   * corruption (a valid entry follows the first damage). */
  cr_assert_eq(unlink(journal_path()), 0);
  write_three();
  damage(116 + 30, 116 + 60, -1);
  damage(348, 348 + 512, 0);
  seen = 0;
  cr_assert_eq(ferry__journal_open(wd(), &j, &err), 0, "%s", err.msg);
  cr_assert_lt(ferry__journal_replay(j, count_cb, &seen, false, &n, &err), 0);
  cr_assert(strstr(err.msg, "byte offset 116") != NULL, "%s", err.msg);
  cr_assert_eq(file_size(), 348 + 512, "nothing is cut");
  ferry__journal_close(j);
}

Test(journal, appends_and_replays_after_a_cut) {
  ferry_journal_t *j;
  ferry_error_t err = {0};
  uint64_t n = 0;
  int seen = 0;
  uint8_t e[100];

  write_three();
  damage(232 + 50, 348 + 4096, 0);
  expect_cut(2, 232, 348 + 4096);
  /* Append the third entry again, and a fourth, after the cut. */
  cr_assert_eq(ferry__journal_open(wd(), &j, &err), 0, "%s", err.msg);
  cr_assert_eq(ferry__journal_replay(j, count_cb, &seen, false, &n, &err), 0, "%s",
               err.msg);
  cr_assert_eq(n, 2);
  for (int i = 2; i < 4; i++) {
    memset(e, 'a' + i, sizeof(e));
    ferry__journal_append(j, e, sizeof(e));
  }
  cr_assert_eq(ferry__journal_sync(j, &err), 0, "%s", err.msg);
  cr_assert_eq(file_size(), 4 * 116);
  ferry__journal_close(j);
  cr_assert_eq(ferry__journal_open(wd(), &j, &err), 0, "%s", err.msg);
  seen = 0;
  cr_assert_eq(ferry__journal_replay(j, count_cb, &seen, false, &n, &err), 0, "%s",
               err.msg);
  cr_assert_eq(n, 4);
  cr_assert_eq(seen, 4);
  cr_assert_eq(file_size(), 4 * 116, "nothing cut");
  ferry__journal_close(j);
}
