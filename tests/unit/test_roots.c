/* Tests of the data roots (roots.h): what a root allows (symlinks
 * and `..` resolved, symlinks inside a root kept), and that
 * ferry__roots_open_file never yields a file outside every root while a
 * thread swaps a symlink into the path it opens (renameat2
 * RENAME_EXCHANGE every 8 to 40 us, seeded: FERRY_TEST_SEED repeats a
 * run), through openat2 and through the component walk that stands in
 * for it on kernels without openat2. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "roots.h"

static char base[128];

static void setup(void) {
  snprintf(base, sizeof(base), "/tmp/ferry-roots-XXXXXX");
  cr_assert_not_null(mkdtemp(base));
}

static void teardown(void) {
  char cmd[200];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", base);
  if (system(cmd) != 0)
    fprintf(stderr, "cannot remove %s\n", base);
  ferry__roots_use_openat2(true);
}

TestSuite(roots, .init = setup, .fini = teardown);

static const char *at(const char *rel) {
  static char p[4][256];
  static int i;
  i = (i + 1) % 4;
  snprintf(p[i], sizeof(p[i]), "%s/%s", base, rel);
  return p[i];
}

static void put(const char *rel, const char *text) {
  FILE *f = fopen(at(rel), "w");
  cr_assert_not_null(f, "%s", at(rel));
  fputs(text, f);
  fclose(f);
}

/* Opens `rel` through the roots; 0 and its first bytes in `got`, or the
 * error. */
static int read_through(const ferry_roots_t *r, const char *path, char *got,
                        size_t cap, ferry_error_t *err) {
  int fd, rc = ferry__roots_open_file(r, path, &fd, err);
  ssize_t n;
  if (rc != 0)
    return rc;
  n = pread(fd, got, cap - 1, 0);
  close(fd);
  got[n > 0 ? n : 0] = '\0';
  return 0;
}

static void make_tree(ferry_roots_t *r) {
  ferry_error_t err = {0};
  cr_assert_eq(mkdir(at("root"), 0755), 0);
  cr_assert_eq(mkdir(at("root/sub"), 0755), 0);
  cr_assert_eq(mkdir(at("other"), 0755), 0);
  cr_assert_eq(mkdir(at("out"), 0755), 0);
  put("root/a", "INSIDE-A");
  put("other/b", "INSIDE-B");
  put("out/secret", "OUTSIDE");
  cr_assert_eq(symlink("a", at("root/rel")), 0);
  cr_assert_eq(symlink(at("root/a"), at("root/abs")), 0);
  cr_assert_eq(symlink(at("other/b"), at("root/to-other")), 0);
  cr_assert_eq(symlink(at("out/secret"), at("root/to-out")), 0);
  cr_assert_eq(symlink(at("root"), at("alias")), 0);
  {
    char list[600];
    snprintf(list, sizeof(list), "%s\n%s", at("root"), at("other"));
    cr_assert_eq(ferry__roots_init(r, list, &err), 0, "%s", err.msg);
  }
}

/* Symlinks inside a root (relative, absolute, into another root, a root
 * reached through a symlink) and `..` that stays inside are allowed, as
 * before; one that leads out is refused naming the path as given. */
Test(roots, open_file_keeps_the_semantics_of_the_check) {
  static const struct {
    const char *rel, *want;
  } ok[] = {{"root/a", "INSIDE-A"},       {"root/rel", "INSIDE-A"},
            {"root/abs", "INSIDE-A"},     {"root/to-other", "INSIDE-B"},
            {"root/sub/../a", "INSIDE-A"}, {"alias/a", "INSIDE-A"},
            {"alias/rel", "INSIDE-A"}};
  static const char *const refused[] = {"root/to-out", "root/../out/secret",
                                        "out/secret"};
  for (int walk = 0; walk < 2; walk++) {
    ferry_roots_t r;
    ferry_error_t err = {0};
    char got[64];
    ferry__roots_use_openat2(walk == 0);
    if (walk == 0) {
      make_tree(&r);
    } else {
      char list[600];
      snprintf(list, sizeof(list), "%s\n%s", at("root"), at("other"));
      cr_assert_eq(ferry__roots_init(&r, list, &err), 0, "%s", err.msg);
    }
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
      cr_assert_eq(read_through(&r, at(ok[i].rel), got, sizeof(got), &err),
                   0, "walk %d: %s: %s", walk, ok[i].rel, err.msg);
      cr_assert_str_eq(got, ok[i].want, "%s", ok[i].rel);
    }
    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
      char want[300];
      cr_assert_eq(read_through(&r, at(refused[i]), got, sizeof(got), &err),
                   FERRY_EACCES, "walk %d: %s", walk, refused[i]);
      snprintf(want, sizeof(want), "%s is outside every --data-root",
               at(refused[i]));
      cr_assert_str_eq(err.msg, want);
    }
    /* A missing file inside says so. */
    cr_assert_eq(read_through(&r, at("root/none"), got, sizeof(got), &err),
                 FERRY_EACCES, "realpath fails: no oracle either way");
    ferry__roots_close(&r);
  }
  /* No root: anything opens. */
  {
    ferry_roots_t none;
    ferry_error_t err = {0};
    char got[64];
    cr_assert_eq(ferry__roots_init(&none, NULL, &err), 0);
    cr_assert_eq(read_through(&none, at("out/secret"), got, sizeof(got),
                              &err),
                 0, "%s", err.msg);
    cr_assert_str_eq(got, "OUTSIDE");
    ferry__roots_close(&none);
  }
}

typedef struct flipper_s {
  const char *a, *b;
  atomic_bool stop;
  uint64_t seed, flips;
} flipper_t;

static uint64_t next_rand(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

/* Exchanges a and b (one a regular file or directory in the root, the
 * other a symlink to the outside) every 8 to 40 us until stopped. */
static void *flip(void *arg) {
  flipper_t *f = arg;
  uint64_t s = f->seed;
  while (!atomic_load(&f->stop)) {
    struct timespec t = {0, (long)(8 + next_rand(&s) % 33) * 1000};
    if (renameat2(AT_FDCWD, f->a, AT_FDCWD, f->b, RENAME_EXCHANGE) == 0)
      f->flips++;
    nanosleep(&t, NULL);
  }
  return NULL;
}

static double ms_since(const struct timespec *t0) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)(t.tv_sec - t0->tv_sec) * 1e3 +
         (double)(t.tv_nsec - t0->tv_nsec) / 1e6;
}

/* One race: opens `path` through the roots for `ms` while `a` and `b`
 * are exchanged; no open may read the outside file's bytes. */
static void race(const char *what, const char *path, const char *a,
                 const char *b, uint64_t seed, double ms) {
  ferry_roots_t r;
  ferry_error_t err = {0};
  flipper_t f = {a, b, false, seed, 0};
  pthread_t th;
  struct timespec t0;
  uint64_t inside = 0, outside = 0, raced = 0, refused = 0;
  char got[64];

  cr_assert_eq(ferry__roots_init(&r, at("root"), &err), 0, "%s", err.msg);
  cr_assert_eq(pthread_create(&th, NULL, flip, &f), 0);
  clock_gettime(CLOCK_MONOTONIC, &t0);
  while (ms_since(&t0) < ms) {
    int rc = read_through(&r, path, got, sizeof(got), &err);
    if (rc == 0 && strcmp(got, "OUTSIDE") == 0)
      outside++;
    else if (rc == 0)
      inside++;
    else if (strstr(err.msg, "changed while it was opened") != NULL)
      raced++; /* the symlink came in after the check: refused */
    else
      refused++;
  }
  atomic_store(&f.stop, true);
  pthread_join(th, NULL);
  ferry__roots_close(&r);
  fprintf(stderr,
          "%s: seed %llu: %llu flips; opens: %llu inside, %llu outside, "
          "%llu refused (outside when checked), %llu refused (swapped in "
          "after the check)\n",
          what, (unsigned long long)seed, (unsigned long long)f.flips,
          (unsigned long long)inside, (unsigned long long)outside,
          (unsigned long long)refused, (unsigned long long)raced);
  cr_assert_eq(outside, 0,
               "%s: seed %llu: %llu opens read the file outside the root",
               what, (unsigned long long)seed, (unsigned long long)outside);
  cr_assert_gt(inside, 0, "%s: never opened the file inside", what);
  cr_assert_gt(f.flips, 0);
}

static uint64_t test_seed(void) {
  const char *e = getenv("FERRY_TEST_SEED");
  struct timespec t;
  if (e != NULL && *e != '\0')
    return strtoull(e, NULL, 10) | 1;
  clock_gettime(CLOCK_REALTIME, &t);
  return ((uint64_t)t.tv_nsec ^ (uint64_t)getpid() << 32 ^
          (uint64_t)t.tv_sec) | 1;
}

/* The shard itself flips between the file in the root and a symlink to
 * the outside; then the directory it is in flips with a symlink to an
 * outside directory holding a file of that name. */
Test(roots, a_symlink_swapped_in_is_never_followed, .timeout = 120) {
  uint64_t seed = test_seed();
  double ms = 1500;
  const char *e = getenv("FERRY_TEST_RACE_MS");
  if (e != NULL && atof(e) > 0)
    ms = atof(e);
  fprintf(stderr, "roots race: seed %llu (FERRY_TEST_SEED repeats it), "
          "%.0f ms per case\n", (unsigned long long)seed, ms);
  cr_assert_eq(mkdir(at("root"), 0755), 0);
  cr_assert_eq(mkdir(at("root/d"), 0755), 0);
  cr_assert_eq(mkdir(at("out"), 0755), 0);
  put("root/shard", "INSIDE");
  put("root/d/shard", "INSIDE");
  put("out/shard", "OUTSIDE");
  cr_assert_eq(symlink(at("out/shard"), at("root/alt")), 0);
  cr_assert_eq(symlink(at("out"), at("root/e")), 0);
  for (int walk = 0; walk < 2; walk++) {
    ferry__roots_use_openat2(walk == 0);
    race(walk ? "file, walk" : "file, openat2", at("root/shard"),
         at("root/shard"), at("root/alt"), seed, ms);
    race(walk ? "directory, walk" : "directory, openat2", at("root/d/shard"),
         at("root/d"), at("root/e"), seed + 2, ms);
  }
}
