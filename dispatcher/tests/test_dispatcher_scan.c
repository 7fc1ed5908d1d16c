/* Tests of the dispatcher's dataset scan: a glob never takes a
 * DALI index file for a shard, a valid FILE.idx next to an uncompressed
 * shard replaces the header scan, and a stale or foreign one is ignored
 * with a warning naming it. */
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

static ferry_disp_t *D;
static char logged[16][600];
static int nlogged;

static void keep_log(int level, const char *msg, void *arg) {
  (void)arg;
  if (level <= FERRY_LOG_DEBUG && nlogged < 16)
    snprintf(logged[nlogged++], sizeof(logged[0]), "%s", msg);
}

static void setup(void) {
  fx_begin();
  nlogged = 0;
  ferry_log_set_callback(keep_log, NULL);
  ferry_log_set_level(FERRY_LOG_DEBUG);
  D = fx_state(1000, 1000, 60000, 8);
}

static void teardown(void) {
  ferry_log_set_callback(NULL, NULL);
  fx_end(&D);
}

TestSuite(scan, .init = setup, .fini = teardown);

/* The first logged line containing both strings, or NULL. */
static const char *find_log(const char *a, const char *b) {
  for (int i = 0; i < nlogged; i++)
    if (strstr(logged[i], a) != NULL && (b == NULL || strstr(logged[i], b)))
      return logged[i];
  return NULL;
}

/* Writes DIR/a.tfrecord (40 records) and its index DIR/a.tfrecord.idx;
 * returns the entries (ferry__free) and the shard's path. */
static ferry_tfr_index_entry_t *shard_and_index(char *path, size_t cap,
                                                char *idx, size_t *n) {
  ferry_tfr_index_entry_t *v;
  ferry_error_t err = {0};
  snprintf(path, cap, "%s", fx_write("a.tfrecord", 40, FERRY_COMPRESSION_NONE));
  snprintf(idx, cap + 4, "%s.idx", path);
  cr_assert_eq(ferry__tfr_index_build(path, &v, n, &err), 0, "%s", err.msg);
  cr_assert_eq(*n, 40);
  cr_assert_eq(ferry__tfr_index_write(idx, v, *n, &err), 0, "%s", err.msg);
  return v;
}

/* Breaks the length CRC of record `rec`'s header: a header scan stops
 * there, an index does not look. */
static void break_header(const char *path, const ferry_tfr_index_entry_t *v,
                         int rec) {
  int fd = open(path, O_RDWR);
  uint8_t b;
  cr_assert_geq(fd, 0);
  cr_assert_eq(pread(fd, &b, 1, (off_t)v[rec].offset + 8), 1);
  b ^= 0x40;
  cr_assert_eq(pwrite(fd, &b, 1, (off_t)v[rec].offset + 8), 1);
  close(fd);
}

/* Sets the file's mtime `delta_s` seconds away from the shard's. */
static void set_mtime(const char *file, const char *shard, int delta_s) {
  struct stat st;
  struct timespec t[2];
  cr_assert_eq(stat(shard, &st), 0);
  t[0] = st.st_atim;
  t[1] = st.st_mtim;
  t[1].tv_sec += delta_s;
  cr_assert_eq(utimensat(AT_FDCWD, file, t, 0), 0);
}

static Ferry__V1__JournalRegisterDataset *register_all(void) {
  char spec[256];
  ferry_error_t err = {0};
  Ferry__V1__RegisterDatasetResponse *r;
  snprintf(spec, sizeof(spec),
           "tfrecord(\"%s/*\", compression=auto) | decode(raw, 1, 1, 1)",
           fx_dir);
  cr_assert_eq(fx_register(D, spec, 8, &r, 0, &err), 0, "%s", err.msg);
  return fx_last_dataset();
}

/* The splits the index gives: 5 of 8 known records, contiguous. */
static void expect_index_splits(const Ferry__V1__JournalRegisterDataset *ds,
                                const ferry_tfr_index_entry_t *v) {
  cr_assert_eq(ds->n_files, 1, "the .idx file is not a shard");
  cr_assert_eq(ds->n_splits, 5);
  for (size_t i = 0; i < 5; i++) {
    const Ferry__V1__Split *s = ds->splits[i];
    cr_assert_eq(s->num_records, 8, "split %zu", i);
    cr_assert_eq(s->first_record, 8 * i);
    cr_assert_eq(s->byte_offset, v[8 * i].offset);
    cr_assert_eq(s->byte_end, v[8 * i + 7].offset + v[8 * i + 7].size);
  }
}

/* What the header scan gives with record 20's header broken: 16 records
 * in two splits, then the rest as one split of unknown count. */
static void expect_scan_splits(const Ferry__V1__JournalRegisterDataset *ds,
                               const ferry_tfr_index_entry_t *v) {
  cr_assert_eq(ds->n_files, 1, "the .idx file is not a shard");
  cr_assert_eq(ds->n_splits, 4);
  cr_assert_eq(ds->splits[2]->num_records, 4);
  cr_assert_eq(ds->splits[3]->num_records, 0);
  cr_assert_eq(ds->splits[3]->byte_offset, v[20].offset);
}

Test(scan, valid_index_replaces_the_header_scan) {
  char path[256], idx[260];
  size_t n;
  ferry_tfr_index_entry_t *v = shard_and_index(path, sizeof(path), idx, &n);

  break_header(path, v, 20);
  set_mtime(idx, path, 1); /* indexed after the last change */
  expect_index_splits(register_all(), v);
  cr_assert_not_null(find_log("records from its index", idx));
  cr_assert_null(find_log("ignored", NULL), "%s", find_log("ignored", NULL));
  ferry__free(v);
}

Test(scan, index_with_the_same_mtime_is_used) {
  char path[256], idx[260];
  size_t n;
  ferry_tfr_index_entry_t *v = shard_and_index(path, sizeof(path), idx, &n);

  set_mtime(idx, path, 0);
  expect_index_splits(register_all(), v);
  cr_assert_not_null(find_log("records from its index", idx));
  ferry__free(v);
}

Test(scan, index_older_than_the_shard_is_ignored) {
  char path[256], idx[260];
  size_t n;
  ferry_tfr_index_entry_t *v = shard_and_index(path, sizeof(path), idx, &n);

  break_header(path, v, 20);
  set_mtime(idx, path, -10);
  expect_scan_splits(register_all(), v);
  cr_assert_not_null(find_log(idx, "ignored (stale)"));
  cr_assert_null(find_log("records from its index", NULL));
  ferry__free(v);
}

Test(scan, index_whose_sizes_do_not_add_up_is_ignored) {
  char path[256], idx[260];
  size_t n;
  ferry_error_t err = {0};
  ferry_tfr_index_entry_t *v = shard_and_index(path, sizeof(path), idx, &n);

  break_header(path, v, 20);
  /* The last record missing: the index ends before the shard does. */
  cr_assert_eq(ferry__tfr_index_write(idx, v, n - 1, &err), 0, "%s", err.msg);
  set_mtime(idx, path, 1);
  expect_scan_splits(register_all(), v);
  cr_assert_not_null(find_log(idx, "but the shard has"));
  cr_assert_null(find_log("records from its index", NULL));
  ferry__free(v);
}

Test(scan, index_with_a_gap_is_ignored) {
  char path[256], idx[260];
  size_t n;
  ferry_error_t err = {0};
  ferry_tfr_index_entry_t *v = shard_and_index(path, sizeof(path), idx, &n);

  break_header(path, v, 20);
  v[5].offset += 1; /* not where record 4 ends */
  cr_assert_eq(ferry__tfr_index_write(idx, v, n, &err), 0, "%s", err.msg);
  v[5].offset -= 1;
  set_mtime(idx, path, 1);
  expect_scan_splits(register_all(), v);
  cr_assert_not_null(find_log(idx, "entry 6 starts at byte"));
  ferry__free(v);
}

Test(scan, index_of_other_records_is_ignored) {
  char path[256], idx[260];
  size_t n;
  ferry_error_t err = {0};
  ferry_tfr_index_entry_t *v = shard_and_index(path, sizeof(path), idx, &n);
  ferry_tfr_index_entry_t w[2];

  break_header(path, v, 20);
  /* Sizes that add up to the shard's, but not its record boundaries:
   * the first header says otherwise. */
  w[0].offset = 0;
  w[0].size = 16;
  w[1].offset = 16;
  w[1].size = v[n - 1].offset + v[n - 1].size - 16;
  cr_assert_eq(ferry__tfr_index_write(idx, w, 2, &err), 0, "%s", err.msg);
  set_mtime(idx, path, 1);
  expect_scan_splits(register_all(), v);
  cr_assert_not_null(find_log(idx, "record headers"));
  ferry__free(v);
}

Test(scan, malformed_index_is_ignored) {
  char path[256], idx[260];
  size_t n;
  FILE *f;
  ferry_tfr_index_entry_t *v = shard_and_index(path, sizeof(path), idx, &n);

  break_header(path, v, 20);
  f = fopen(idx, "w");
  cr_assert_not_null(f);
  fputs("0 25\nnot an index\n", f);
  fclose(f);
  set_mtime(idx, path, 1);
  expect_scan_splits(register_all(), v);
  cr_assert_not_null(find_log(idx, "ignored"));
  ferry__free(v);
}

Test(scan, glob_skips_index_files_and_compressed_shards_ignore_them) {
  char path[256], gz[256], idx[260];
  size_t n;
  FILE *f;
  Ferry__V1__JournalRegisterDataset *ds;
  ferry_tfr_index_entry_t *v = shard_and_index(path, sizeof(path), idx, &n);

  /* A GZIP shard with an index file next to it (an index describes
   * uncompressed files only): one split of unknown count, no warning. */
  snprintf(gz, sizeof(gz), "%s",
           fx_write("b.tfrecord", 10, FERRY_COMPRESSION_GZIP));
  snprintf(idx, sizeof(idx), "%s.idx", gz);
  f = fopen(idx, "w");
  cr_assert_not_null(f);
  fputs("0 25\n", f);
  fclose(f);
  ds = register_all();
  cr_assert_eq(ds->n_files, 2);
  cr_assert(strstr(ds->files[0], "/a.tfrecord") != NULL, "%s", ds->files[0]);
  cr_assert(strstr(ds->files[1], "/b.tfrecord") != NULL, "%s", ds->files[1]);
  cr_assert_eq(ds->n_splits, 6);
  cr_assert_eq(ds->splits[5]->file_index, 1);
  cr_assert_eq(ds->splits[5]->num_records, 0);
  cr_assert_null(find_log("ignored", NULL), "%s", find_log("ignored", NULL));
  ferry__free(v);
}
