/* The prefix cache's files (pcache.h): round trips in any order, the
 * documented name hash, keys that differ in one field, truncation at every
 * byte and flips of every byte (caught, never served as wrong data),
 * commits with missing, extra or duplicate positions, abort, replace,
 * remove, the directory scan, allocation failures and leaks. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "alloc.h"
#include "pcache.h"
#include "unit_files.h"

/* Helpers. */

static char tmpdir[64];

static void remove_tree(const char *dir) {
  DIR *d = opendir(dir);
  struct dirent *e;
  char p[512];
  if (d == NULL)
    return;
  while ((e = readdir(d)) != NULL) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
      continue;
    snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
    if (unlink(p) != 0)
      rmdir(p);
  }
  closedir(d);
  rmdir(dir);
}

static void make_tmpdir(void) {
  strcpy(tmpdir, "/tmp/ferry-pcache-XXXXXX");
  cr_assert_not_null(mkdtemp(tmpdir));
}

static void remove_tmpdir(void) { remove_tree(tmpdir); }

static int count_files(const char *dir) {
  DIR *d = opendir(dir);
  struct dirent *e;
  int n = 0;
  cr_assert_not_null(d);
  while ((e = readdir(d)) != NULL)
    if (e->d_name[0] != '.')
      n++;
  closedir(d);
  return n;
}

static const char *entry_file(const ferry_pcache_key_t *k) {
  static char bufs[2][512];
  static int next;
  char name[FERRY_PCACHE_NAME_MAX], *p = bufs[next++ & 1];
  ferry__pcache_entry_name(k, name, sizeof(name));
  snprintf(p, 512, "%s/%s", tmpdir, name);
  return p;
}

static void spit(const char *path, const void *buf, size_t len) {
  FILE *f = fopen(path, "wb");
  cr_assert_not_null(f);
  cr_assert_eq(fwrite(buf, 1, len, f), len);
  cr_assert_eq(fclose(f), 0);
}

static int64_t live_bytes(void) {
  ferry_alloc_stats_t s;
  ferry__alloc_stats(&s);
  return s.bytes;
}

static ferry_pcache_key_t base_key(void) {
  ferry_pcache_key_t k = {
      .prefix_fp = UINT64_C(0x0123456789abcdef),
      .path = "gs://bucket/train-00007-of-01024",
      .file_size = 123456789,
      .mtime_ns = INT64_C(1700000000123456789),
      .byte_offset = 4096,
      .byte_end = 8192,
      .first_record = 17,
      .max_records = 0,
  };
  return k;
}

/* What position p holds: its shape, ids and pixels. */
typedef struct {
  int h, w, c;
} shape_t;

static shape_t shape_varied(uint64_t p) {
  shape_t s = {1 + (int)(p % 7), 1 + (int)(p % 5), 1 + (int)(p % 4)};
  return s;
}

static shape_t shape_small(uint64_t p) {
  (void)p;
  shape_t s = {4, 5, 3};
  return s;
}

static uint8_t px(uint64_t p, size_t i) {
  return (uint8_t)(p * 131 + i * 7 + (i >> 8));
}

static uint64_t idx_of(uint64_t p) { return 1000 + 3 * p; }
static uint64_t off_of(uint64_t p) { return UINT64_C(1) << 40 | p * 777; }
static int64_t label_of(uint64_t p) { return -(int64_t)p * 5 + 2; }

static void add_pos(ferry_pcache_writer_t *w, uint64_t p, shape_t s) {
  size_t n = (size_t)s.h * (size_t)s.w * (size_t)s.c;
  uint8_t *pix = malloc(n);
  ferry_error_t err;
  for (size_t i = 0; i < n; i++)
    pix[i] = px(p, i);
  cr_assert_eq(ferry__pcache_writer_add(w, p, idx_of(p), off_of(p), label_of(p),
                                        s.h, s.w, s.c, pix, &err),
               0, "%s", err.msg);
  free(pix);
}

/* A Fisher-Yates shuffle of 0..n-1 from a fixed seed. */
static void shuffled(uint64_t *v, uint64_t n, uint64_t seed) {
  for (uint64_t i = 0; i < n; i++)
    v[i] = i;
  for (uint64_t i = n; i > 1; i--) {
    seed = seed * 6364136223846793005u + 1442695040888963407u;
    uint64_t j = (seed >> 33) % i, t = v[i - 1];
    v[i - 1] = v[j];
    v[j] = t;
  }
}

/* Writes n entries in `order` (NULL: in order) and commits; offs (may be
 * NULL) gets each position's entry offset. */
static void write_entry(const ferry_pcache_key_t *k, uint64_t n,
                        const uint64_t *order, shape_t (*shape)(uint64_t),
                        uint64_t *offs) {
  ferry_pcache_writer_t *w;
  ferry_error_t err;
  cr_assert_eq(ferry__pcache_writer_open(tmpdir, k, &w, &err), 0, "%s",
               err.msg);
  for (uint64_t i = 0; i < n; i++) {
    uint64_t p = order != NULL ? order[i] : i;
    if (offs != NULL)
      offs[p] = ferry__pcache_writer_bytes(w);
    add_pos(w, p, shape(p));
  }
  cr_assert_eq(ferry__pcache_writer_commit(w, n, &err), 0, "%s", err.msg);
}

/* True when rec is exactly what position p holds. */
static bool rec_is(const ferry_pcache_record_t *rec, uint64_t p, shape_t s) {
  if (rec->index != idx_of(p) || rec->offset != off_of(p) ||
      rec->label != label_of(p) || rec->h != s.h || rec->w != s.w ||
      rec->c != s.c)
    return false;
  size_t n = (size_t)s.h * (size_t)s.w * (size_t)s.c;
  for (size_t i = 0; i < n; i++)
    if (rec->pixels[i] != px(p, i))
      return false;
  return true;
}

static void check_get(ferry_pcache_reader_t *r, uint64_t p, shape_t s) {
  ferry_pcache_record_t rec;
  ferry_error_t err;
  cr_assert_eq(ferry__pcache_reader_get(r, p, &rec, &err), 0,
               "position %" PRIu64 ": %s", p, err.msg);
  cr_assert(rec_is(&rec, p, s), "position %" PRIu64 " differs", p);
}

/* Round trips. */

Test(pcache, round_trip_shuffled, .init = make_tmpdir, .fini = remove_tmpdir) {
  enum { N = 60 };
  ferry_pcache_key_t k = base_key();
  ferry_pcache_reader_t *r;
  ferry_error_t err;
  uint64_t order[N], offs[N];
  int64_t before = live_bytes();

  shuffled(order, N, 42);
  write_entry(&k, N, order, shape_varied, offs);
  cr_assert_eq(count_files(tmpdir), 1);
  cr_assert_eq(ferry__pcache_reader_open(tmpdir, &k, &r, &err), 0, "%s",
               err.msg);
  cr_assert_eq(ferry__pcache_reader_count(r), N);
  uint64_t want_bytes = 0;
  for (uint64_t p = 0; p < N; p++) {
    check_get(r, p, shape_varied(p));
    shape_t s = shape_varied(p);
    want_bytes += 16 + 44 + (uint64_t)(s.h * s.w * s.c);
  }
  /* Every entry in one pread of its own bytes after the first. */
  cr_assert_geq(ferry__pcache_reader_bytes(r), want_bytes);
  for (uint64_t p = N; p-- > 0;)
    check_get(r, p, shape_varied(p));
  for (uint64_t seed = 1; seed < 6; seed++) {
    uint64_t o[N];
    shuffled(o, N, seed);
    for (uint64_t i = 0; i < N; i++)
      check_get(r, o[i], shape_varied(o[i]));
  }
  ferry_pcache_record_t rec;
  cr_assert_eq(ferry__pcache_reader_get(r, N, &rec, &err), FERRY_EINVAL);
  ferry__pcache_reader_close(r);
  ferry__pcache_reader_close(NULL);
  cr_assert_eq(live_bytes(), before);
}

Test(pcache, writer_bytes_and_file_size, .init = make_tmpdir,
     .fini = remove_tmpdir) {
  ferry_pcache_key_t k = base_key();
  ferry_pcache_writer_t *w;
  ferry_error_t err;
  struct stat st;
  size_t plen = strlen(k.path);
  cr_assert_eq(ferry__pcache_writer_open(tmpdir, &k, &w, &err), 0);
  cr_assert_eq(ferry__pcache_writer_bytes(w), 16 + 68 + plen);
  add_pos(w, 1, shape_small(1));
  add_pos(w, 0, shape_small(0));
  uint64_t b = ferry__pcache_writer_bytes(w);
  cr_assert_eq(b, 16 + 68 + plen + 2 * (16 + 44 + 60));
  cr_assert_eq(ferry__pcache_writer_commit(w, 2, &err), 0, "%s", err.msg);
  cr_assert_eq(stat(entry_file(&k), &st), 0);
  cr_assert_eq((uint64_t)st.st_size, b + (16 + 16 + 16) + 32);
  mode_t um = umask(0);
  umask(um);
  cr_assert_eq(st.st_mode & 0777, 0644 & ~um);
}

Test(pcache, large_and_small_entries, .init = make_tmpdir,
     .fini = remove_tmpdir) {
  /* Entries over the write buffer and the read buffer, between small
   * ones: direct writes and two-pread gets. */
  ferry_pcache_key_t k = base_key();
  ferry_pcache_writer_t *w;
  ferry_pcache_reader_t *r;
  ferry_error_t err;
  shape_t big = {700, 600, 3}, small = {2, 3, 1};
  uint64_t order[] = {3, 0, 2, 4, 1};
  int64_t before = live_bytes();
  cr_assert_eq(ferry__pcache_writer_open(tmpdir, &k, &w, &err), 0);
  for (int i = 0; i < 5; i++)
    add_pos(w, order[i], order[i] % 2 == 0 ? big : small);
  cr_assert_eq(ferry__pcache_writer_commit(w, 5, &err), 0, "%s", err.msg);
  cr_assert_eq(ferry__pcache_reader_open(tmpdir, &k, &r, &err), 0, "%s",
               err.msg);
  uint64_t seq[] = {1, 0, 3, 2, 4, 4, 1};
  for (int i = 0; i < 7; i++)
    check_get(r, seq[i], seq[i] % 2 == 0 ? big : small);
  ferry__pcache_reader_close(r);
  cr_assert_eq(live_bytes(), before);
}

Test(pcache, empty_split, .init = make_tmpdir, .fini = remove_tmpdir) {
  ferry_pcache_key_t k = base_key();
  ferry_pcache_reader_t *r;
  ferry_error_t err;
  ferry_pcache_record_t rec;
  write_entry(&k, 0, NULL, shape_small, NULL);
  cr_assert_eq(ferry__pcache_reader_open(tmpdir, &k, &r, &err), 0, "%s",
               err.msg);
  cr_assert_eq(ferry__pcache_reader_count(r), 0);
  cr_assert_eq(ferry__pcache_reader_get(r, 0, &rec, &err), FERRY_EINVAL);
  ferry__pcache_reader_close(r);
}

Test(pcache, commit_replaces_older_entry, .init = make_tmpdir,
     .fini = remove_tmpdir) {
  ferry_pcache_key_t k = base_key();
  ferry_pcache_reader_t *r;
  ferry_error_t err;
  write_entry(&k, 3, NULL, shape_small, NULL);
  write_entry(&k, 9, NULL, shape_varied, NULL);
  cr_assert_eq(count_files(tmpdir), 1);
  cr_assert_eq(ferry__pcache_reader_open(tmpdir, &k, &r, &err), 0);
  cr_assert_eq(ferry__pcache_reader_count(r), 9);
  for (uint64_t p = 0; p < 9; p++)
    check_get(r, p, shape_varied(p));
  ferry__pcache_reader_close(r);
}

/* Names and keys. */

static uint64_t ref_hash(const ferry_pcache_key_t *k) {
  uint8_t b[60 + 256];
  uint64_t v[7] = {k->prefix_fp,   k->file_size, (uint64_t)k->mtime_ns,
                   k->byte_offset, k->byte_end,  k->first_record,
                   k->max_records};
  size_t plen = strlen(k->path), n = 0;
  for (int f = 0; f < 7; f++)
    for (int i = 0; i < 8; i++)
      b[n++] = (uint8_t)(v[f] >> (8 * i));
  for (int i = 0; i < 4; i++)
    b[n++] = (uint8_t)(plen >> (8 * i));
  memcpy(b + n, k->path, plen);
  n += plen;
  uint64_t h = 0xcbf29ce484222325u;
  for (size_t i = 0; i < n; i++)
    h = (h ^ b[i]) * 0x100000001b3u;
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9u;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebu;
  h ^= h >> 31;
  return h;
}

Test(pcache, entry_name_is_the_documented_hash) {
  ferry_pcache_key_t k = base_key();
  char name[FERRY_PCACHE_NAME_MAX], want[FERRY_PCACHE_NAME_MAX];
  ferry__pcache_entry_name(&k, name, sizeof(name));
  snprintf(want, sizeof(want), "%016" PRIx64 "-%016" PRIx64 ".fpc", k.prefix_fp,
           ref_hash(&k));
  cr_assert_str_eq(name, want);
  cr_assert_eq(strlen(name), 37);
  cr_assert_eq(strncmp(name, "0123456789abcdef-", 17), 0);
  k.path = "";
  ferry__pcache_entry_name(&k, name, sizeof(name));
  snprintf(want, sizeof(want), "%016" PRIx64 "-%016" PRIx64 ".fpc", k.prefix_fp,
           ref_hash(&k));
  cr_assert_str_eq(name, want);
  char small[8];
  ferry__pcache_entry_name(&k, small, sizeof(small));
  cr_assert_str_eq(small, "0123456");
}

/* The key with field f changed. */
static ferry_pcache_key_t key_variant(int f) {
  ferry_pcache_key_t k = base_key();
  switch (f) {
  case 0:
    k.prefix_fp ^= 1;
    break;
  case 1:
    k.file_size += 1;
    break;
  case 2:
    k.mtime_ns -= 1;
    break;
  case 3:
    k.path = "gs://bucket/train-00007-of-01025";
    break;
  case 4:
    k.path = "gs://bucket/train-00007-of-0102";
    break;
  case 5:
    k.byte_offset += 1;
    break;
  case 6:
    k.byte_end -= 1;
    break;
  case 7:
    k.first_record += 1;
    break;
  case 8:
    k.max_records = 100;
    break;
  default:
    cr_assert_fail("no field %d", f);
  }
  return k;
}
#define NVARIANTS 9

Test(pcache, key_differing_in_one_field_never_hits, .init = make_tmpdir,
     .fini = remove_tmpdir) {
  ferry_pcache_key_t k = base_key();
  ferry_pcache_reader_t *r;
  ferry_error_t err;
  int64_t before = live_bytes();
  write_entry(&k, 3, NULL, shape_small, NULL);
  for (int f = 0; f < NVARIANTS; f++) {
    ferry_pcache_key_t v = key_variant(f);
    char a[FERRY_PCACHE_NAME_MAX], b[FERRY_PCACHE_NAME_MAX];
    ferry__pcache_entry_name(&k, a, sizeof(a));
    ferry__pcache_entry_name(&v, b, sizeof(b));
    cr_assert_str_neq(a, b, "field %d: same name", f);
    /* Another name: a miss. */
    memset(&err, 0, sizeof(err));
    cr_assert_eq(ferry__pcache_reader_open(tmpdir, &v, &r, &err), FERRY_ENOENT,
                 "field %d", f);
    cr_assert_eq(err.code, FERRY_ENOENT);
    cr_assert_null(r);
    /* The same name (a hash collision): the header's key refuses it. */
    cr_assert_eq(rename(entry_file(&k), entry_file(&v)), 0);
    int rc = ferry__pcache_reader_open(tmpdir, &v, &r, &err);
    cr_assert_eq(rc, FERRY_EDATACRC, "field %d: %d %s", f, rc, err.msg);
    cr_assert(ferry__pcache_damaged(rc));
    cr_assert(strstr(err.msg, "another key") != NULL, "%s", err.msg);
    cr_assert(strstr(err.msg, tmpdir) != NULL, "%s", err.msg);
    cr_assert_eq(rename(entry_file(&v), entry_file(&k)), 0);
  }
  cr_assert_eq(ferry__pcache_reader_open(tmpdir, &k, &r, &err), 0);
  ferry__pcache_reader_close(r);
  cr_assert_eq(live_bytes(), before);
}

Test(pcache, miss_and_bad_arguments, .init = make_tmpdir,
     .fini = remove_tmpdir) {
  ferry_pcache_key_t k = base_key();
  ferry_pcache_reader_t *r;
  ferry_pcache_writer_t *w;
  ferry_error_t err;
  memset(&err, 0, sizeof(err));
  cr_assert_eq(ferry__pcache_reader_open(tmpdir, &k, &r, &err), FERRY_ENOENT);
  cr_assert(strstr(err.msg, tmpdir) != NULL, "%s", err.msg);
  k.path = NULL;
  cr_assert_eq(ferry__pcache_reader_open(tmpdir, &k, &r, &err), FERRY_EINVAL);
  cr_assert_eq(ferry__pcache_writer_open(tmpdir, &k, &w, &err), FERRY_EINVAL);
  k = base_key();
  cr_assert_eq(ferry__pcache_writer_open("/nonexistent-dir", &k, &w, &err),
               FERRY_ENOENT);
  cr_assert(strstr(err.msg, "/nonexistent-dir/") != NULL, "%s", err.msg);
  cr_assert_not(ferry__pcache_damaged(FERRY_ENOENT));
  cr_assert_not(ferry__pcache_damaged(FERRY_EIO));
  cr_assert_eq(count_files(tmpdir), 0);
}

/* Damage. */

/* The small file of these tests: 3 entries of 4x5x3, added 2, 0, 1. */
static uint8_t *small_file(const ferry_pcache_key_t *k, size_t *len,
                           uint64_t offs[3]) {
  uint64_t order[3] = {2, 0, 1};
  write_entry(k, 3, order, shape_small, offs);
  uint8_t *b = tu_slurp(entry_file(k), len);
  cr_assert_not_null(b);
  return b;
}

/* How probe reads: each get on its own or after loading the whole file,
 * into the reader's buffer or the caller's (get_into). */
enum { READ_GET, READ_LOADED, READ_INTO, READ_LOADED_INTO, READ_MODES };

/* Opens the entry and reads every position (as `mode` says): each get
 * either fails with a damage code or returns exactly the right entry.
 * Returns -1 when open (or the load) failed (a damage code), else a bit
 * mask of the positions that failed. */
static int probe_mode(const ferry_pcache_key_t *k, const char *what,
                      size_t at, int mode) {
  ferry_pcache_reader_t *r;
  ferry_pcache_record_t rec;
  ferry_error_t err;
  uint8_t into[60];
  int rc = ferry__pcache_reader_open(tmpdir, k, &r, &err), mask = 0;
  if (rc == 0 && (mode == READ_LOADED || mode == READ_LOADED_INTO) &&
      (rc = ferry__pcache_reader_load(r, 1u << 20, &err)) != 0)
    ferry__pcache_reader_close(r);
  if (rc != 0) {
    cr_assert(ferry__pcache_damaged(rc), "%s %zu: open: %d %s", what, at, rc,
              err.msg);
    cr_assert(strstr(err.msg, tmpdir) != NULL, "%s", err.msg);
    cr_assert(strstr(err.msg, "offset") != NULL, "%s", err.msg);
    return -1;
  }
  cr_assert_eq(ferry__pcache_reader_count(r), 3, "%s %zu", what, at);
  for (uint64_t p = 0; p < 3; p++) {
    memset(into, 0, sizeof(into));
    rc = mode == READ_INTO || mode == READ_LOADED_INTO
             ? ferry__pcache_reader_get_into(r, p, into, sizeof(into), &rec,
                                             &err)
             : ferry__pcache_reader_get(r, p, &rec, &err);
    if (rc == 0) {
      cr_assert(rec_is(&rec, p, shape_small(p)),
                "%s %zu: position %" PRIu64 " served wrong data", what, at, p);
    } else {
      cr_assert(ferry__pcache_damaged(rc), "%s %zu: get: %d %s", what, at, rc,
                err.msg);
      char want[64];
      snprintf(want, sizeof(want), "position %" PRIu64 " at offset", p);
      cr_assert(strstr(err.msg, want) != NULL, "%s", err.msg);
      mask |= 1 << p;
    }
  }
  ferry__pcache_reader_close(r);
  return mask;
}

static int probe(const ferry_pcache_key_t *k, const char *what, size_t at) {
  return probe_mode(k, what, at, READ_GET);
}

Test(pcache, truncation_at_every_byte, .init = make_tmpdir,
     .fini = remove_tmpdir) {
  ferry_pcache_key_t k = base_key();
  size_t len;
  uint64_t offs[3];
  uint8_t *b = small_file(&k, &len, offs);
  int64_t before = live_bytes();
  for (size_t cut = 0; cut < len; cut++) {
    spit(entry_file(&k), b, cut);
    /* The trailer is the last 32 bytes: every cut loses it. */
    cr_assert_eq(probe(&k, "cut at", cut), -1, "cut at %zu not caught", cut);
  }
  spit(entry_file(&k), b, len);
  cr_assert_eq(probe(&k, "whole", len), 0);
  cr_assert_eq(live_bytes(), before);
  free(b);
}

Test(pcache, every_byte_flip_is_caught, .init = make_tmpdir,
     .fini = remove_tmpdir) {
  static const uint8_t masks[] = {0x01, 0x80, 0xff, 0x10};
  ferry_pcache_key_t k = base_key();
  size_t len;
  uint64_t offs[3];
  uint8_t *b = small_file(&k, &len, offs);
  const uint64_t elen = 16 + 44 + 60;
  int64_t before = live_bytes();
  for (size_t at = 0; at < len; at++) {
    int in = -1;
    for (int p = 0; p < 3; p++)
      if (at >= offs[p] && at < offs[p] + elen)
        in = p;
    for (size_t m = 0; m < sizeof(masks); m++) {
      b[at] ^= masks[m];
      spit(entry_file(&k), b, len);
      b[at] ^= masks[m];
      for (int mode = 0; mode < READ_MODES; mode++) {
        int got = probe_mode(&k, "flip at", at, mode);
        if (in < 0)
          cr_assert_eq(got, -1,
                       "flip at %zu (outside entries) not caught (mode %d)",
                       at, mode);
        else
          cr_assert_eq(got, 1 << in,
                       "flip at %zu in position %d: failed mask %d (mode %d)",
                       at, in, got, mode);
      }
    }
  }
  cr_assert_eq(live_bytes(), before);
  free(b);
}

Test(pcache, entry_out_of_place_is_caught, .init = make_tmpdir,
     .fini = remove_tmpdir) {
  /* Entries 0 and 1 swapped in place (CRCs intact): the stored position
   * catches it. */
  ferry_pcache_key_t k = base_key();
  size_t len;
  uint64_t offs[3];
  uint8_t *b = small_file(&k, &len, offs), tmp[120];
  memcpy(tmp, b + offs[0], 120);
  memcpy(b + offs[0], b + offs[1], 120);
  memcpy(b + offs[1], tmp, 120);
  spit(entry_file(&k), b, len);
  cr_assert_eq(probe(&k, "swap", 0), 3);
  free(b);
}

Test(pcache, foreign_and_empty_files_are_damage, .init = make_tmpdir,
     .fini = remove_tmpdir) {
  ferry_pcache_key_t k = base_key();
  spit(entry_file(&k), "", 0);
  cr_assert_eq(probe(&k, "empty", 0), -1);
  uint8_t junk[4096];
  for (size_t i = 0; i < sizeof(junk); i++)
    junk[i] = (uint8_t)(i * 13);
  spit(entry_file(&k), junk, sizeof(junk));
  cr_assert_eq(probe(&k, "junk", 0), -1);
}

/* Commits that must fail. */

static void commit_fails(ferry_pcache_writer_t *w, uint64_t n,
                         const char *want) {
  ferry_error_t err;
  cr_assert_eq(ferry__pcache_writer_commit(w, n, &err), FERRY_EINVAL);
  cr_assert(strstr(err.msg, want) != NULL, "%s", err.msg);
  cr_assert_eq(count_files(tmpdir), 0);
}

Test(pcache, commit_with_missing_position_fails, .init = make_tmpdir,
     .fini = remove_tmpdir) {
  ferry_pcache_key_t k = base_key();
  ferry_pcache_writer_t *w;
  ferry_error_t err;
  int64_t before = live_bytes();
  cr_assert_eq(ferry__pcache_writer_open(tmpdir, &k, &w, &err), 0);
  add_pos(w, 0, shape_small(0));
  add_pos(w, 2, shape_small(2));
  add_pos(w, 3, shape_small(3));
  cr_assert_eq(count_files(tmpdir), 1); /* the temporary file */
  commit_fails(w, 4, "position 1 ");
  cr_assert_eq(live_bytes(), before);
}

Test(pcache, commit_with_extra_position_fails, .init = make_tmpdir,
     .fini = remove_tmpdir) {
  ferry_pcache_key_t k = base_key();
  ferry_pcache_writer_t *w;
  ferry_error_t err;
  cr_assert_eq(ferry__pcache_writer_open(tmpdir, &k, &w, &err), 0);
  for (uint64_t p = 0; p < 3; p++)
    add_pos(w, p, shape_small(p));
  add_pos(w, 7, shape_small(7));
  commit_fails(w, 3, "position 7 ");
}

Test(pcache, duplicate_position_fails, .init = make_tmpdir,
     .fini = remove_tmpdir) {
  ferry_pcache_key_t k = base_key();
  ferry_pcache_writer_t *w;
  ferry_error_t err;
  uint8_t pix[60] = {0};
  int64_t before = live_bytes();
  cr_assert_eq(ferry__pcache_writer_open(tmpdir, &k, &w, &err), 0);
  add_pos(w, 1, shape_small(1));
  add_pos(w, 0, shape_small(0));
  cr_assert_eq(ferry__pcache_writer_add(w, 1, 0, 0, 0, 4, 5, 3, pix, &err),
               FERRY_EINVAL);
  cr_assert(strstr(err.msg, "position 1 added twice") != NULL, "%s", err.msg);
  /* The writer is spent: the commit fails and leaves nothing. */
  commit_fails(w, 2, "position 1 added twice");
  cr_assert_eq(live_bytes(), before);
}

Test(pcache, bad_images_are_rejected, .init = make_tmpdir,
     .fini = remove_tmpdir) {
  static const int shapes[][3] = {
      {0, 5, 3}, {4, 0, 3}, {4, 5, 0}, {4, 5, 5}, {-1, 5, 3}};
  ferry_pcache_key_t k = base_key();
  ferry_pcache_writer_t *w;
  ferry_error_t err;
  uint8_t pix[60] = {0};
  for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
    cr_assert_eq(ferry__pcache_writer_open(tmpdir, &k, &w, &err), 0);
    cr_assert_eq(ferry__pcache_writer_add(w, 0, 0, 0, 0, shapes[i][0],
                                          shapes[i][1], shapes[i][2], pix,
                                          &err),
                 FERRY_EINVAL, "shape %zu", i);
    commit_fails(w, 0, "bad image");
  }
  cr_assert_eq(ferry__pcache_writer_open(tmpdir, &k, &w, &err), 0);
  cr_assert_eq(ferry__pcache_writer_add(w, 0, 0, 0, 0, 4, 5, 3, NULL, &err),
               FERRY_EINVAL);
  ferry__pcache_writer_abort(w);
  /* A position at or past the key's max_records. */
  k.max_records = 2;
  cr_assert_eq(ferry__pcache_writer_open(tmpdir, &k, &w, &err), 0);
  cr_assert_eq(ferry__pcache_writer_add(w, 2, 0, 0, 0, 4, 5, 3, pix, &err),
               FERRY_EINVAL);
  ferry__pcache_writer_abort(w);
  cr_assert_eq(ferry__pcache_writer_open(tmpdir, &k, &w, &err), 0);
  cr_assert_eq(ferry__pcache_writer_add(w, FERRY_PCACHE_MAX_RECORDS, 0, 0, 0, 4,
                                        5, 3, pix, &err),
               FERRY_EINVAL);
  ferry__pcache_writer_abort(w);
  cr_assert_eq(count_files(tmpdir), 0);
}

Test(pcache, abort_leaves_no_file, .init = make_tmpdir, .fini = remove_tmpdir) {
  ferry_pcache_key_t k = base_key();
  ferry_pcache_writer_t *w;
  ferry_error_t err;
  int64_t before = live_bytes();
  write_entry(&k, 2, NULL, shape_small, NULL);
  cr_assert_eq(ferry__pcache_writer_open(tmpdir, &k, &w, &err), 0);
  add_pos(w, 0, shape_small(0));
  cr_assert_eq(count_files(tmpdir), 2);
  ferry__pcache_writer_abort(w);
  ferry__pcache_writer_abort(NULL);
  cr_assert_eq(count_files(tmpdir), 1); /* the older entry stays */
  ferry_pcache_reader_t *r;
  cr_assert_eq(ferry__pcache_reader_open(tmpdir, &k, &r, &err), 0);
  cr_assert_eq(ferry__pcache_reader_count(r), 2);
  ferry__pcache_reader_close(r);
  cr_assert_eq(live_bytes(), before);
}

/* Remove and scan. */

Test(pcache, remove_entry, .init = make_tmpdir, .fini = remove_tmpdir) {
  ferry_pcache_key_t k = base_key(), other = key_variant(0);
  ferry_pcache_reader_t *r;
  ferry_error_t err;
  write_entry(&k, 1, NULL, shape_small, NULL);
  write_entry(&other, 1, NULL, shape_small, NULL);
  cr_assert_eq(ferry__pcache_remove(tmpdir, &k), 0);
  cr_assert_eq(ferry__pcache_remove(tmpdir, &k), 0);
  cr_assert_eq(ferry__pcache_reader_open(tmpdir, &k, &r, &err), FERRY_ENOENT);
  cr_assert_eq(ferry__pcache_reader_open(tmpdir, &other, &r, &err), 0);
  ferry__pcache_reader_close(r);
}

Test(pcache, dir_scan_counts_and_removes_temps, .init = make_tmpdir,
     .fini = remove_tmpdir) {
  ferry_pcache_key_t a = base_key(), b = key_variant(3);
  ferry_pcache_writer_t *w;
  ferry_error_t err;
  struct stat sa, sb;
  char p[512];
  uint64_t bytes = 1, entries = 1;
  write_entry(&a, 3, NULL, shape_small, NULL);
  write_entry(&b, 5, NULL, shape_varied, NULL);
  cr_assert_eq(stat(entry_file(&a), &sa), 0);
  cr_assert_eq(stat(entry_file(&b), &sb), 0);
  /* A writer's temporary file, one left by a killed worker, and others. */
  cr_assert_eq(ferry__pcache_writer_open(tmpdir, &a, &w, &err), 0);
  add_pos(w, 0, shape_small(0));
  snprintf(p, sizeof(p), "%s/0000000000000001-0000000000000002.fpc.tmp.x",
           tmpdir);
  spit(p, "junk", 4);
  snprintf(p, sizeof(p), "%s/notes.txt", tmpdir);
  spit(p, "keep", 4);
  snprintf(p, sizeof(p), "%s/keep.fpc.old", tmpdir);
  spit(p, "keep", 4);
  snprintf(p, sizeof(p), "%s/sub.fpc", tmpdir);
  cr_assert_eq(mkdir(p, 0755), 0);
  cr_assert_eq(count_files(tmpdir), 7);

  cr_assert_eq(ferry__pcache_dir_scan(tmpdir, false, &bytes, &entries, &err), 0,
               "%s", err.msg);
  cr_assert_eq(entries, 2);
  cr_assert_eq(bytes, (uint64_t)(sa.st_size + sb.st_size));
  cr_assert_eq(count_files(tmpdir), 7);

  cr_assert_eq(ferry__pcache_dir_scan(tmpdir, true, &bytes, &entries, &err), 0,
               "%s", err.msg);
  cr_assert_eq(entries, 2);
  cr_assert_eq(bytes, (uint64_t)(sa.st_size + sb.st_size));
  cr_assert_eq(count_files(tmpdir), 5); /* both temps gone */
  cr_assert_eq(access(p, F_OK), 0);
  /* The writer whose file went fails on commit, and leaves nothing. */
  cr_assert_neq(ferry__pcache_writer_commit(w, 1, &err), 0);

  cr_assert_eq(
      ferry__pcache_dir_scan("/nonexistent-dir", true, &bytes, &entries, &err),
      FERRY_ENOENT);
  cr_assert(strstr(err.msg, "/nonexistent-dir") != NULL, "%s", err.msg);
}

/* Allocation failures: every one is an error, never a crash or a leak. */

Test(pcache, allocation_failures, .init = make_tmpdir, .fini = remove_tmpdir) {
  ferry_pcache_key_t k = base_key();
  ferry_pcache_writer_t *w;
  ferry_pcache_reader_t *r;
  ferry_pcache_record_t rec;
  ferry_error_t err;
  uint8_t pix[60] = {0};
  int64_t before = live_bytes();
  bool done = false;
  for (int64_t n = 0; n < 64 && !done; n++) {
    int rc;
    ferry__alloc_fail_after(n);
    rc = ferry__pcache_writer_open(tmpdir, &k, &w, &err);
    if (rc == 0) {
      for (uint64_t p = 0; p < 3000 && rc == 0; p++)
        rc = ferry__pcache_writer_add(w, p, p, p, 0, 4, 5, 3, pix, &err);
      if (rc == 0)
        rc = ferry__pcache_writer_commit(w, 3000, &err);
      else
        ferry__pcache_writer_abort(w);
    }
    if (rc == 0) {
      rc = ferry__pcache_reader_open(tmpdir, &k, &r, &err);
      if (rc == 0) {
        rc = ferry__pcache_reader_get(r, 2999, &rec, &err);
        ferry__pcache_reader_close(r);
        done = rc == 0;
      }
    }
    ferry__alloc_fail_reset();
    cr_assert(rc == 0 || rc == FERRY_ENOMEM, "n=%" PRId64 ": %d %s", n, rc,
              err.msg);
    cr_assert_eq(live_bytes(), before, "n=%" PRId64, n);
    cr_assert_leq(count_files(tmpdir), 1);
  }
  cr_assert(done);
}

/* The format itself: the C writer makes, byte for byte, the seed that
 * tests/fuzz/pipeline/corpus/make_pcache_seeds.py writes from the
 * header's description. */
Test(pcache, bytes_equal_the_independent_writer, .init = make_tmpdir,
     .fini = remove_tmpdir) {
  ferry_pcache_key_t k = {.prefix_fp = UINT64_C(0x0123456789abcdef),
                          .path = "shard-00000.tfrecord",
                          .file_size = 1000,
                          .mtime_ns = 1,
                          .byte_end = 1000};
  ferry_pcache_writer_t *w;
  ferry_error_t err;
  uint64_t order[3] = {2, 0, 1};
  uint8_t pix[60];
  size_t len, want_len;
  cr_assert_eq(ferry__pcache_writer_open(tmpdir, &k, &w, &err), 0);
  for (int i = 0; i < 3; i++) {
    uint64_t p = order[i];
    for (size_t j = 0; j < sizeof(pix); j++)
      pix[j] = (uint8_t)(p * 131 + j * 7);
    cr_assert_eq(ferry__pcache_writer_add(w, p, 100 + p, 4096 * p, -(int64_t)p,
                                          4, 5, 3, pix, &err),
                 0);
  }
  cr_assert_eq(ferry__pcache_writer_commit(w, 3, &err), 0, "%s", err.msg);
  uint8_t *got = tu_slurp(entry_file(&k), &len);
  uint8_t *want = tu_slurp(FERRY_SOURCE_DIR "/tests/fuzz/pipeline/corpus/"
                                            "pcache/three_4x5x3_shuffled",
                           &want_len);
  cr_assert_not_null(got);
  cr_assert_not_null(want);
  cr_assert_eq(len, want_len);
  cr_assert_arr_eq(got, want, len);
  free(got);
  free(want);
}

/* The whole-file read and the read into the caller's buffer give what
 * get gives, for every shape; get_into refuses an entry of another
 * size; a file cut between open and load is damage. */
Test(pcache, load_and_get_into_agree_with_get, .init = make_tmpdir,
     .fini = remove_tmpdir) {
  enum { N = 40 };
  ferry_pcache_key_t k = base_key();
  ferry_pcache_reader_t *r;
  ferry_pcache_record_t rec;
  ferry_error_t err;
  uint64_t order[N];
  uint8_t buf[4 * 7 * 5];
  shuffled(order, N, 7);
  write_entry(&k, N, order, shape_varied, NULL);
  for (int loaded = 0; loaded <= 1; loaded++) {
    cr_assert_eq(ferry__pcache_reader_open(tmpdir, &k, &r, &err), 0, "%s",
                 err.msg);
    if (loaded)
      cr_assert_eq(ferry__pcache_reader_load(r, 1u << 20, &err), 0, "%s",
                   err.msg);
    for (uint64_t p = 0; p < N; p++) {
      shape_t s = shape_varied(p);
      size_t n = (size_t)s.h * (size_t)s.w * (size_t)s.c;
      check_get(r, p, s);
      cr_assert_eq(ferry__pcache_reader_get_into(r, p, buf, n, &rec, &err), 0,
                   "%s", err.msg);
      cr_assert(rec.pixels == buf && rec_is(&rec, p, s), "position %" PRIu64,
                p);
      int rc = ferry__pcache_reader_get_into(r, p, buf, n + 1, &rec, &err);
      cr_assert(ferry__pcache_damaged(rc), "another size: %d", rc);
    }
    ferry__pcache_reader_close(r);
  }
  /* Cut after the open: the load finds it. */
  cr_assert_eq(ferry__pcache_reader_open(tmpdir, &k, &r, &err), 0);
  cr_assert_eq(truncate(entry_file(&k), 200), 0);
  int rc = ferry__pcache_reader_load(r, 1u << 20, &err);
  cr_assert(ferry__pcache_damaged(rc), "load of a cut file: %d", rc);
  cr_assert(strstr(err.msg, "ends") != NULL, "%s", err.msg);
  ferry__pcache_reader_close(r);
}
