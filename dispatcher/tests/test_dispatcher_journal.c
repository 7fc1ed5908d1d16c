/* Tests of the dispatcher's journal: replaying a scripted session gives
 * the live state back, a torn tail is cut off, corruption in the middle
 * is refused with its byte offset (or cut with --journal-recover).
 * A snapshot restores the live state, a crash before any step
 * of a compaction recovers the same state, failed writes and syncs are
 * cut back, a damaged snapshot refuses naming the file and offset. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "alloc.h"
#include "ferry/log.h"
#include "fixture.h"
#include "journal.h"
#include "snapshot.h"
#include <errno.h>


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
  cr_assert_eq(ferry__journal_open(wd(), false, &j, &err), 0, "%s", err.msg);
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
  cr_assert_eq(ferry__journal_open(wd(), false, &j, &err), 0, "%s", err.msg);
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
  cr_assert_eq(ferry__journal_open(wd(), false, &j, &err), 0, "%s", err.msg);
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
  cr_assert_eq(ferry__journal_open(wd(), false, &j, &err), 0, "%s", err.msg);
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
  cr_assert_eq(ferry__journal_open(wd(), false, &j, &err), 0, "%s", err.msg);
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
  cr_assert_eq(ferry__journal_open(wd(), false, &j, &err), 0, "%s", err.msg);
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
  cr_assert_eq(ferry__journal_open(wd(), false, &j, &err), 0, "%s", err.msg);
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
  cr_assert_eq(ferry__journal_open(wd(), false, &j, &err), 0, "%s", err.msg);
  cr_assert_neq(ferry__journal_replay(j, replay_into, b, false, &n, &err), 0);
  cr_assert(strstr(err.msg, "byte offset 0") != NULL, "%s", err.msg);
  ferry__journal_close(j);
  ferry__disp_free(b);
}

/* ---- Crash tails: damage that nothing valid follows is cut,
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
  cr_assert_eq(ferry__journal_open(wd(), false, &j, &err), 0, "%s", err.msg);
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
  cr_assert_eq(ferry__journal_open(wd(), false, &j, &err), 0, "%s", err.msg);
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
  cr_assert_eq(ferry__journal_open(wd(), false, &j, &err), 0, "%s", err.msg);
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
  cr_assert_eq(ferry__journal_open(wd(), false, &j, &err), 0, "%s", err.msg);
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
  cr_assert_eq(ferry__journal_open(wd(), false, &j, &err), 0, "%s", err.msg);
  seen = 0;
  cr_assert_eq(ferry__journal_replay(j, count_cb, &seen, false, &n, &err), 0, "%s",
               err.msg);
  cr_assert_eq(n, 4);
  cr_assert_eq(seen, 4);
  cr_assert_eq(file_size(), 4 * 116, "nothing cut");
  ferry__journal_close(j);
}

/* ---- Snapshots, compaction, write failures, recovery ---------- */

static ferry_disp_t *new_state(void) {
  ferry_disp_config_t cfg;
  ferry_disp_t *b;
  ferry__disp_config_init(&cfg);
  cfg.worker_timeout_ms = cfg.client_timeout_ms = 1000;
  cfg.job_gc_ms = 60000;
  cfg.records_per_split = 8;
  cr_assert_eq(ferry__disp_new(&cfg, 0, &b), 0);
  return b;
}

/* Runs script() on D, journaled, and leaves the journal open in *jp with
 * everything durable. */
static ferry_journal_t *scripted(void) {
  ferry_journal_t *j;
  ferry_error_t err = {0};
  D = fx_state(1000, 1000, 60000, 8);
  cr_assert_eq(ferry__journal_open(wd(), false, &j, &err), 0, "%s", err.msg);
  ferry__disp_set_sink(D, ferry__journal_sink, j);
  script();
  cr_assert_eq(ferry__journal_sync(j, &err), 0, "%s", err.msg);
  return j;
}

/* Compacts: D's snapshot becomes the next segment's base. Returns the
 * batch's result (crash steps: FERRY_ECANCELED, the batch left open). */
static int pack_cb(void *arg, uint8_t **out, size_t *len,
                   ferry_error_t *err) {
  return ferry__disp_snapshot_pack(arg, out, len, err);
}

static int compact(ferry_journal_t *j, ferry_error_t *err) {
  uint8_t hdr[16];
  size_t hl;
  uint64_t seg = ferry__disp_segment(D) + 1;
  ferry_disp_snap_t *s = ferry__disp_snapshot_take(D, seg);
  int rc;
  cr_assert_not_null(s);
  hl = ferry__disp_segment_header(seg, hdr);
  cr_assert(ferry__journal_compact_begin(j, pack_cb, s, hdr, hl));
  rc = ferry__journal_batch_write(j, err);
  ferry__disp_snapshot_release(D, s);
  if (rc == FERRY_ECANCELED)
    return rc; /* "crashed": nothing more happens to the files */
  ferry__journal_batch_end(j, rc);
  if (rc == 0)
    ferry__disp_set_segment(D, seg);
  return rc;
}

/* Restores a fresh state from the work directory; asserts success. */
static ferry_disp_t *restored(ferry_disp_restore_t *st) {
  ferry_journal_t *j;
  ferry_error_t err = {0};
  ferry_disp_t *b = new_state();
  ferry_disp_restore_t s;
  cr_assert_eq(ferry__journal_open(wd(), false, &j, &err), 0, "%s", err.msg);
  cr_assert_eq(ferry__disp_restore(b, j, false, 1200, st ? st : &s, &err), 0,
               "%s", err.msg);
  ferry__journal_close(j);
  {
    char why[256];
    cr_assert(ferry__disp_check_indexes(b, why, sizeof(why)), "%s", why);
  }
  return b;
}

static void assert_same_status(ferry_disp_t *a, ferry_disp_t *b, int64_t t) {
  size_t la, lb;
  uint8_t *sa = fx_status_bytes(a, t, &la), *sb = fx_status_bytes(b, t, &lb);
  if (la != lb || memcmp(sa, sb, la) != 0) {
    Ferry__V1__GetStatusResponse *x = fx_status(a, t), *y = fx_status(b, t);
    cr_assert_eq(x->n_workers, y->n_workers);
    for (size_t i = 0; i < x->n_workers; i++)
      cr_assert(strcmp(x->workers[i]->state, y->workers[i]->state) == 0 &&
                    x->workers[i]->tasks == y->workers[i]->tasks &&
                    x->workers[i]->last_heartbeat_ms_ago ==
                        y->workers[i]->last_heartbeat_ms_ago,
                "worker %zu: %s/%s tasks %u/%u hb %llu/%llu", i,
                x->workers[i]->state, y->workers[i]->state,
                x->workers[i]->tasks, y->workers[i]->tasks,
                (unsigned long long)x->workers[i]->last_heartbeat_ms_ago,
                (unsigned long long)y->workers[i]->last_heartbeat_ms_ago);
    cr_assert_eq(x->n_jobs, y->n_jobs);
    for (size_t i = 0; i < x->n_jobs; i++) {
      cr_assert_eq(x->jobs[i]->state, y->jobs[i]->state, "job %zu", i);
      cr_assert_eq(x->jobs[i]->clients, y->jobs[i]->clients);
      cr_assert_eq(x->jobs[i]->delivered, y->jobs[i]->delivered);
      cr_assert_eq(x->jobs[i]->epoch, y->jobs[i]->epoch);
    }
  }
  cr_assert(la == lb && memcmp(sa, sb, la) == 0,
            "the restored status differs from the live one");
}

static off_t path_size(const char *name) {
  char p[256];
  struct stat st;
  snprintf(p, sizeof(p), "%s/%s", wd(), name);
  return stat(p, &st) == 0 ? st.st_size : -1;
}

Test(journal, snapshot_restores_the_live_state_and_bounds_the_journal) {
  ferry_journal_t *j = scripted();
  ferry_error_t err = {0};
  ferry_disp_restore_t st;
  uint64_t before = ferry__journal_size(j);
  ferry_disp_t *b;

  ferry__disp_replayed(D, 1200);
  cr_assert_eq(compact(j, &err), 0, "%s", err.msg);
  cr_assert_eq(ferry__disp_segment(D), 1);
  cr_assert_lt(ferry__journal_size(j), 32, "the journal is its header");
  cr_assert_gt(path_size("snapshot"), 0);
  cr_assert_eq(path_size("snapshot.tmp"), -1);
  b = restored(&st);
  cr_assert(st.snapshot && !st.stale);
  cr_assert_eq(st.journal_entries, 1, "the segment header only");
  cr_assert_eq(st.segment, 1);
  assert_same_status(D, b, 1200);
  ferry__disp_free(b);

  /* Changes after the snapshot go to segment 1 and replay on top. */
  fx_worker(D, 1, "w1:1", NULL, 0, false, 1250);
  fx_client(D, 1, 1, 3, NULL, 0, false, 1300);
  cr_assert_eq(ferry__journal_sync(j, &err), 0, "%s", err.msg);
  b = restored(&st);
  cr_assert_gt(st.journal_entries, 1);
  ferry__disp_replayed(D, 1200);
  assert_same_status(D, b, 1300);
  /* The same next calls give the same answers (ids, bindings). */
  {
    Ferry__V1__GetOrCreateJobResponse *x, *y;
    ferry_disp_t *live = D;
    const char *ds = fx_status(D, 1300)->jobs[0]->dataset_id;
    x = fx_job(D, ds, "", DIST, 1, FAIL, 0);
    D = b;
    y = fx_job(b, ds, "", DIST, 1, FAIL, 0);
    D = live;
    cr_assert_eq(x->job_id, y->job_id);
    cr_assert_eq(x->client_id, y->client_id);
  }
  ferry__disp_free(b);
  cr_assert_lt(ferry__journal_size(j), before);
  ferry__disp_set_sink(D, NULL, NULL);
  ferry__journal_close(j);
}

/* A crash before each step of a compaction (journal.h) recovers to the
 * same state: the old snapshot and journal, or the new snapshot. */
Test(journal, a_crash_at_every_compaction_step_recovers_the_same_state) {
  for (int step = 1; step <= FERRY_JOURNAL_STEPS; step++) {
    ferry_journal_t *j;
    ferry_error_t err = {0};
    ferry_disp_restore_t st;
    ferry_disp_t *b, *ref;
    char cmd[300];

    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", wd());
    cr_assert_eq(system(cmd), 0);
    j = scripted();
    ferry__disp_replayed(D, 1200);
    /* A first compaction, then changes in segment 1, then the one that
     * crashes: both an old snapshot and an old segment exist. */
    cr_assert_eq(compact(j, &err), 0, "%s", err.msg);
    fx_worker(D, 0, "w9:1", NULL, 0, false, 1250);
    cr_assert_eq(ferry__journal_sync(j, &err), 0, "%s", err.msg);
    ref = restored(NULL); /* what the disk holds before the compaction */
    ferry__journal_set_crash_step(step);
    cr_assert_eq(compact(j, &err), FERRY_ECANCELED, "step %d", step);
    ferry__journal_set_crash_step(0);
    ferry__journal_close(j); /* the batch is in flight: no more I/O */
    ferry__disp_set_sink(D, NULL, NULL);

    b = restored(&st);
    cr_assert_eq(st.segment, step >= 5 ? 2 : 1, "step %d: segment %llu",
                 step, (unsigned long long)st.segment);
    cr_assert_eq(st.stale, step >= 5 && step <= 6, "step %d", step);
    cr_assert_eq(st.snapshot_entries > 0, true);
    cr_assert_eq(path_size("snapshot.tmp"), -1, "step %d", step);
    assert_same_status(ref, b, 1300);
    ferry__disp_free(b);
    /* And again: the restore left a consistent pair behind. */
    b = restored(&st);
    cr_assert(!st.stale);
    assert_same_status(ref, b, 1300);
    ferry__disp_free(b);
    ferry__disp_free(ref);
    ferry__disp_free(D);
    D = NULL;
  }
}

static int fail_errno, fail_after;
static ssize_t failing_pwrite(int fd, const void *b, size_t n, off_t off) {
  if (fail_after-- <= 0) {
    errno = fail_errno;
    return -1;
  }
  return pwrite(fd, b, n / 2 + 1 < n ? n / 2 + 1 : n, off);
}
static int failing_fsync(int fd) {
  (void)fd;
  errno = fail_errno;
  return -1;
}

Test(journal, a_failed_write_is_cut_back_and_the_state_rebuilt_from_disk) {
  ferry_journal_t *j = scripted();
  ferry_error_t err = {0};
  ferry_journal_io_t io = {failing_pwrite, fdatasync};
  ferry_disp_restore_t st;
  ferry_disp_t *b;
  uint64_t durable = ferry__journal_size(j), pos;
  uint8_t *ref;
  size_t reflen;

  ferry__disp_replayed(D, 1200);
  ref = fx_status_bytes(D, 1300, &reflen);
  /* ENOSPC after a partial write: the batch fails naming the path. */
  fx_worker(D, 0, "w3:1", NULL, 0, false, 1250);
  pos = ferry__journal_appended(j);
  fail_errno = ENOSPC;
  fail_after = 1;
  ferry__journal_set_io(&io);
  cr_assert_eq(ferry__journal_sync(j, &err), FERRY_ENOSPC);
  cr_assert(strstr(err.msg, journal_path()) != NULL, "%s", err.msg);
  cr_assert(strstr(err.msg, "No space left on device") != NULL, "%s",
            err.msg);
  cr_assert_eq(file_size(), (off_t)durable, "cut back to the durable end");
  cr_assert_geq(ferry__journal_durable(j), pos);
  /* EIO from fdatasync: the same. */
  io.pwrite = pwrite;
  io.fsync = failing_fsync;
  fail_errno = EIO;
  ferry__journal_set_io(&io);
  fx_worker(D, 0, "w4:1", NULL, 0, false, 1260);
  cr_assert_eq(ferry__journal_sync(j, &err), FERRY_EIO);
  cr_assert(strstr(err.msg, "fdatasync") != NULL, "%s", err.msg);
  cr_assert_eq(file_size(), (off_t)durable);
  ferry__journal_set_io(NULL);
  /* What the disk holds is the state before the failed batches. */
  ferry__disp_set_sink(D, NULL, NULL);
  ferry__disp_reset(D, 1200);
  cr_assert_eq(ferry__disp_restore(D, j, false, 1200, &st, &err), 0, "%s",
               err.msg);
  {
    size_t n;
    uint8_t *s = fx_status_bytes(D, 1300, &n);
    cr_assert(n == reflen && memcmp(s, ref, n) == 0,
              "the rebuilt state is the durable one");
  }
  /* Space is back: the next batch succeeds and replays. */
  ferry__disp_set_sink(D, ferry__journal_sink, j);
  cr_assert_eq(ferry__disp_boot(D, &err), 0, "%s", err.msg);
  fx_worker(D, 0, "w5:1", NULL, 0, false, 1270);
  cr_assert_eq(ferry__journal_sync(j, &err), 0, "%s", err.msg);
  cr_assert_gt(file_size(), (off_t)durable);
  b = restored(NULL);
  ferry__disp_replayed(D, 1200);
  assert_same_status(D, b, 1300);
  ferry__disp_free(b);
  ferry__disp_set_sink(D, NULL, NULL);
  ferry__journal_close(j);
}

Test(journal, a_failed_compaction_keeps_the_old_files) {
  ferry_journal_t *j = scripted();
  ferry_error_t err = {0};
  ferry_journal_io_t io = {failing_pwrite, fdatasync};
  ferry_disp_t *b;
  off_t size = file_size();

  ferry__disp_replayed(D, 1200);
  fail_errno = ENOSPC;
  fail_after = 0;
  ferry__journal_set_io(&io);
  cr_assert_eq(compact(j, &err), FERRY_ENOSPC);
  ferry__journal_set_io(NULL);
  cr_assert(strstr(err.msg, "snapshot.tmp") != NULL, "%s", err.msg);
  cr_assert_eq(path_size("snapshot.tmp"), -1, "the partial file is gone");
  cr_assert_eq(path_size("snapshot"), -1);
  cr_assert_eq(file_size(), size);
  cr_assert_eq(ferry__disp_segment(D), 0);
  b = restored(NULL);
  assert_same_status(D, b, 1300);
  ferry__disp_free(b);
  ferry__disp_set_sink(D, NULL, NULL);
  ferry__journal_close(j);
}

/* Overwrites one byte of WORKDIR/name at `off`. */
static void poke(const char *name, off_t off, uint8_t x) {
  char p[256];
  int fd;
  snprintf(p, sizeof(p), "%s/%s", wd(), name);
  cr_assert_geq(fd = open(p, O_WRONLY), 0);
  cr_assert_eq(pwrite(fd, &x, 1, off), 1);
  close(fd);
}

static int restore_error(ferry_error_t *err) {
  ferry_journal_t *j;
  ferry_disp_t *b = new_state();
  ferry_disp_restore_t st;
  int rc;
  cr_assert_eq(ferry__journal_open(wd(), false, &j, err), 0, "%s", err->msg);
  rc = ferry__disp_restore(b, j, false, 1200, &st, err);
  ferry__journal_close(j);
  ferry__disp_free(b);
  return rc;
}

Test(journal, a_corrupt_or_truncated_snapshot_refuses_with_its_offset) {
  ferry_journal_t *j = scripted();
  ferry_error_t err = {0};
  char p[256];
  off_t n;

  cr_assert_eq(compact(j, &err), 0, "%s", err.msg);
  ferry__disp_set_sink(D, NULL, NULL);
  ferry__journal_close(j);
  n = path_size("snapshot");
  poke("snapshot", n / 2, 0xff);
  cr_assert_lt(restore_error(&err), 0);
  cr_assert(strstr(err.msg, "/work/snapshot: corrupt snapshot at byte "
                            "offset") != NULL,
            "%s", err.msg);
  /* Cut after its first record: frames fine, lacks its end. */
  snprintf(p, sizeof(p), "%s/snapshot", wd());
  {
    uint8_t h[8];
    uint64_t len = 0;
    int fd = open(p, O_RDONLY);
    cr_assert_eq(pread(fd, h, 8, 0), 8);
    close(fd);
    for (int i = 7; i >= 0; i--)
      len = len << 8 | h[i];
    cr_assert_eq(truncate(p, (off_t)(16 + len)), 0);
  }
  cr_assert_lt(restore_error(&err), 0);
  cr_assert(strstr(err.msg, "without its end entry") != NULL, "%s",
            err.msg);
}

static char errlog[512];
static void keep_error(int level, const char *msg, void *arg) {
  (void)arg;
  if (level == FERRY_LOG_ERROR)
    snprintf(errlog, sizeof(errlog), "%s", msg);
}

Test(journal, recover_cuts_at_the_damage_and_says_what_it_dropped) {
  ferry_journal_t *j;
  ferry_error_t err = {0};
  uint64_t n = 0;
  int seen = 0;

  write_three();
  damage(116 + 30, 116 + 60, -1); /* the second entry; the third intact */
  cr_assert_eq(ferry__journal_open(wd(), false, &j, &err), 0, "%s", err.msg);
  errlog[0] = '\0';
  ferry_log_set_callback(keep_error, NULL);
  cr_assert_eq(ferry__journal_replay(j, count_cb, &seen, true, &n, &err), 0,
               "%s", err.msg);
  ferry_log_set_callback(NULL, NULL);
  cr_assert_eq(n, 1);
  cr_assert_eq(file_size(), 116, "cut at the last good entry");
  cr_assert(strstr(errlog, "corrupt entry at byte offset 116") != NULL &&
                strstr(errlog, "dropped 232 bytes from offset 116") !=
                    NULL &&
                strstr(errlog, "holding 1 valid entries") != NULL,
            "%s", errlog);
  ferry__journal_close(j);
}

Test(journal, a_journal_newer_than_the_snapshot_refuses) {
  ferry_journal_t *j = scripted();
  ferry_error_t err = {0};
  uint8_t hdr[16];
  size_t hl = ferry__disp_segment_header(7, hdr);

  cr_assert_eq(compact(j, &err), 0, "%s", err.msg);
  cr_assert_eq(ferry__journal_reset(j, hdr, hl, &err), 0, "%s", err.msg);
  ferry__disp_set_sink(D, NULL, NULL);
  ferry__journal_close(j);
  cr_assert_lt(restore_error(&err), 0);
  cr_assert(strstr(err.msg, "the journal is segment 7 but the snapshot is "
                            "followed by segment 1") != NULL,
            "%s", err.msg);
}

/* A dataset collected while a capture is being packed (on the journal's
 * thread in the daemon) stays readable until the capture is released,
 * and the snapshot still holds it (it is the state at the capture). */
Test(journal, a_dataset_collected_during_a_capture_stays_until_released) {
  ferry_error_t err = {0};
  Ferry__V1__RegisterDatasetResponse *r;
  Ferry__V1__JournalDatasetGC gc = FERRY__V1__JOURNAL_DATASET_GC__INIT;
  Ferry__V1__JournalEntry e = FERRY__V1__JOURNAL_ENTRY__INIT;
  ferry_disp_snap_t *cap;
  ferry_disp_t *b;
  uint8_t *buf, gcb[64];
  size_t len, gl;
  char spec[512], p[256];
  FILE *f;

  D = fx_state(1000, 1000, 60000, 8);
  fx_write("a.tfrecord", 40, FERRY_COMPRESSION_NONE);
  snprintf(spec, sizeof(spec),
           "tfrecord(\"%s/a.tfrecord\") | decode(raw, 1, 1, 1)", fx_dir);
  cr_assert_eq(fx_register(D, spec, 0, &r, 0, &err), 0, "%s", err.msg);
  cap = ferry__disp_snapshot_take(D, 1);
  cr_assert_not_null(cap);
  gc.dataset_id = r->dataset_id;
  e.entry_case = FERRY__V1__JOURNAL_ENTRY__ENTRY_DATASET_GC;
  e.dataset_gc = &gc;
  gl = ferry__v1__journal_entry__pack(&e, gcb);
  cr_assert_eq(ferry__disp_apply(D, gcb, gl, 100, &err), 0, "%s", err.msg);
  cr_assert_eq(fx_status(D, 100)->datasets, 0);
  cr_assert_eq(ferry__disp_snapshot_pack(cap, &buf, &len, &err), 0);
  ferry__disp_snapshot_release(D, cap);
  /* The snapshot restores the dataset. */
  mkdir(wd(), 0755);
  snprintf(p, sizeof(p), "%s/snapshot", wd());
  cr_assert_not_null(f = fopen(p, "wb"));
  cr_assert_eq(fwrite(buf, 1, len, f), len);
  fclose(f);
  ferry__free(buf);
  /* An empty journal beside it: a compaction that stopped at step 7. */
  snprintf(p, sizeof(p), "%s/journal", wd());
  cr_assert_not_null(f = fopen(p, "wb"));
  fclose(f);
  b = restored(NULL);
  cr_assert_eq(fx_status(b, 100)->datasets, 1);
  ferry__disp_free(b);
}

/* A journal is created before the first compaction and only truncated in
 * place, so no crash leaves a snapshot without one: a missing journal
 * was lost, and starting from the snapshot alone would silently undo the
 * changes it held. Refused, naming both files and the flag, with nothing
 * created (a second start refuses too); --journal-recover starts from the
 * snapshot with a warning. */
Test(journal, a_snapshot_without_its_journal_refuses_unless_recover) {
  ferry_journal_t *j = scripted();
  ferry_error_t err = {0};
  ferry_disp_restore_t st;
  ferry_disp_t *snap, *b;
  char want[600], p[600];

  cr_assert_eq(compact(j, &err), 0, "%s", err.msg);
  snap = restored(NULL); /* the snapshot alone */
  /* Changes after the snapshot: only the journal holds them. */
  fx_worker(D, 0, "w9:1", NULL, 0, false, 1250);
  cr_assert_eq(ferry__journal_sync(j, &err), 0, "%s", err.msg);
  ferry__disp_set_sink(D, NULL, NULL);
  ferry__journal_close(j);
  cr_assert_eq(unlink(journal_path()), 0);

  for (int i = 0; i < 2; i++) {
    j = NULL;
    cr_assert_eq(ferry__journal_open(wd(), false, &j, &err), FERRY_EINVAL,
                 "start %d: %s", i, err.msg);
    cr_assert_null(j);
    snprintf(want, sizeof(want), "%s is missing but %s/snapshot exists",
             journal_path(), wd());
    cr_assert(strstr(err.msg, want) != NULL, "%s", err.msg);
    cr_assert(strstr(err.msg, "--journal-recover starts from the snapshot "
                              "alone") != NULL,
              "%s", err.msg);
    cr_assert_eq(path_size("journal"), -1, "start %d created it", i);
  }

  nlogged = 0;
  ferry_log_set_callback(keep_log, NULL);
  cr_assert_eq(ferry__journal_open(wd(), true, &j, &err), 0, "%s", err.msg);
  ferry_log_set_callback(NULL, NULL);
  cr_assert_eq(nlogged, 1);
  cr_assert(strstr(logged[0], "--journal-recover") != NULL &&
                strstr(logged[0], journal_path()) != NULL,
            "%s", logged[0]);
  b = new_state();
  cr_assert_eq(ferry__disp_restore(b, j, true, 1200, &st, &err), 0, "%s",
               err.msg);
  ferry__journal_close(j);
  cr_assert(st.snapshot);
  assert_same_status(snap, b, 1300);
  ferry__disp_free(b);
  /* The pair is consistent again: a plain start works. */
  b = restored(NULL);
  assert_same_status(snap, b, 1300);
  ferry__disp_free(b);
  ferry__disp_free(snap);

  /* A partial snapshot.tmp also means a compaction ran: refused too. */
  snprintf(p, sizeof(p), "rm -rf '%s' && mkdir '%s' && touch '%s/snapshot.tmp'",
           wd(), wd(), wd());
  cr_assert_eq(system(p), 0);
  cr_assert_eq(ferry__journal_open(wd(), false, &j, &err), FERRY_EINVAL);
  cr_assert(strstr(err.msg, "/work/snapshot.tmp exists") != NULL, "%s",
            err.msg);
  /* An empty work directory is a first start. */
  snprintf(p, sizeof(p), "rm -f '%s/snapshot.tmp'", wd());
  cr_assert_eq(system(p), 0);
  cr_assert_eq(ferry__journal_open(wd(), false, &j, &err), 0, "%s", err.msg);
  ferry__journal_close(j);
  cr_assert_eq(path_size("journal"), 0);
}
