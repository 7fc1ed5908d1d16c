/* ferryctl records inspect|index|optimize and gen, run as the built
 * binary.
 *
 * Each test spawns FERRY_BINARY_DIR/client/ctl/ferryctl with posix_spawn,
 * captures its stdout and stderr in files of a fresh temp dir, and waits
 * for it with a deadline (a pidfd polled with a timeout; the child is
 * killed past the deadline). Fixtures are generated with `ferryctl gen`
 * and checked with Ferry's own reader and Example parser. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <turbojpeg.h>
#include <unistd.h>

#include "alloc.h"
#include "example.h"
#include "imgops.h"
#include "jpeg_restart.h"
#include "tfrecord.h"

#define FERRYCTL FERRY_BINARY_DIR "/client/ctl/ferryctl"
#define TIMEOUT_MS 30000

extern char **environ;

typedef struct run_s {
  int status; /* exit status; -1 when killed by a signal or timed out */
  char *out;  /* captured stdout, NUL-terminated */
  char *err;  /* captured stderr */
} run_t;

static char tmpdir[256];

static void setup_tmp(void) {
  snprintf(tmpdir, sizeof(tmpdir), "/tmp/ferry_test_ctl_XXXXXX");
  cr_assert_not_null(mkdtemp(tmpdir), "mkdtemp: %s", strerror(errno));
}

static void rm_rf(const char *path) {
  struct stat st;
  if (lstat(path, &st) != 0)
    return;
  if (S_ISDIR(st.st_mode)) {
    DIR *d = opendir(path);
    if (d != NULL) {
      struct dirent *e;
      while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
          continue;
        char sub[1024];
        snprintf(sub, sizeof(sub), "%s/%s", path, e->d_name);
        rm_rf(sub);
      }
      closedir(d);
    }
    rmdir(path);
  } else {
    unlink(path);
  }
}

static void teardown_tmp(void) {
  if (tmpdir[0] != '\0')
    rm_rf(tmpdir);
}

static char *read_file(const char *path, size_t *len_out) {
  FILE *f = fopen(path, "rb");
  if (f == NULL)
    return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = ferry__malloc((size_t)n + 1);
  cr_assert_not_null(buf);
  size_t got = fread(buf, 1, (size_t)n, f);
  fclose(f);
  buf[got] = '\0';
  if (len_out != NULL)
    *len_out = got;
  return buf;
}

static void write_file(const char *path, const void *data, size_t len) {
  FILE *f = fopen(path, "wb");
  cr_assert_not_null(f, "open %s: %s", path, strerror(errno));
  cr_assert_eq(fwrite(data, 1, len, f), len);
  cr_assert_eq(fclose(f), 0);
}

static void run_free(run_t *r) {
  ferry__free(r->out);
  ferry__free(r->err);
}

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Waits for `pid` until the deadline; kills it past the deadline. Returns
 * the wait status, or -1 after a kill. */
static int wait_deadline(pid_t pid) {
  int64_t deadline = now_ms() + TIMEOUT_MS;
  int status = 0;
  int pfd = (int)syscall(SYS_pidfd_open, pid, 0);
  for (;;) {
    pid_t w = waitpid(pid, &status, WNOHANG);
    if (w == pid)
      break;
    cr_assert(w == 0 || errno == EINTR, "waitpid: %s", strerror(errno));
    int64_t left = deadline - now_ms();
    if (left <= 0) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      if (pfd >= 0)
        close(pfd);
      cr_assert(false, "ferryctl did not finish within %d ms", TIMEOUT_MS);
      return -1;
    }
    if (pfd >= 0) {
      /* The pidfd becomes readable when the child exits. */
      struct pollfd p = {.fd = pfd, .events = POLLIN};
      poll(&p, 1, (int)left);
    } else {
      /* No pidfd (old kernel): a bounded poll of waitpid. */
      struct timespec ts = {0, 2000000};
      nanosleep(&ts, NULL);
    }
  }
  if (pfd >= 0)
    close(pfd);
  return status;
}

/* Runs ferryctl with the NULL-terminated arguments. */
static run_t run_ctl(const char *arg0, ...) {
  const char *argv[64];
  int n = 0;
  argv[n++] = FERRYCTL;
  va_list ap;
  va_start(ap, arg0);
  for (const char *a = arg0; a != NULL && n < 63; a = va_arg(ap, const char *))
    argv[n++] = a;
  va_end(ap);
  argv[n] = NULL;

  struct stat st;
  cr_assert_eq(stat(FERRYCTL, &st), 0,
               "%s is missing: build the ferryctl target first", FERRYCTL);

  static int serial;
  char out_path[512], err_path[512];
  snprintf(out_path, sizeof(out_path), "%s/.stdout.%d", tmpdir, serial);
  snprintf(err_path, sizeof(err_path), "%s/.stderr.%d", tmpdir, serial);
  serial++;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, out_path,
                                   O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_addopen(&fa, 2, err_path,
                                   O_WRONLY | O_CREAT | O_TRUNC, 0600);
  pid_t pid;
  int rc = posix_spawn(&pid, FERRYCTL, &fa, NULL, (char *const *)argv,
                       environ);
  posix_spawn_file_actions_destroy(&fa);
  cr_assert_eq(rc, 0, "posix_spawn: %s", strerror(rc));
  int status = wait_deadline(pid);
  run_t r;
  r.status = (status >= 0 && WIFEXITED(status)) ? WEXITSTATUS(status) : -1;
  r.out = read_file(out_path, NULL);
  r.err = read_file(err_path, NULL);
  cr_assert_not_null(r.out);
  cr_assert_not_null(r.err);
  unlink(out_path);
  unlink(err_path);
  return r;
}

static void path_in(char *buf, size_t cap, const char *name) {
  snprintf(buf, cap, "%s/%s", tmpdir, name);
}

/* ---- a small JSON syntax checker -------------------------------------- */

typedef struct json_s {
  const char *p;
  int depth;
} json_t;

static void js_ws(json_t *j) {
  while (*j->p == ' ' || *j->p == '\n' || *j->p == '\t' || *j->p == '\r')
    j->p++;
}

static bool js_value(json_t *j);

static bool js_string(json_t *j) {
  if (*j->p != '"')
    return false;
  j->p++;
  for (;;) {
    unsigned char c = (unsigned char)*j->p;
    if (c == '\0' || c < 0x20)
      return false;
    j->p++;
    if (c == '"')
      return true;
    if (c == '\\') {
      char e = *j->p++;
      if (e == 'u') {
        for (int i = 0; i < 4; i++, j->p++)
          if (!((*j->p >= '0' && *j->p <= '9') ||
                (*j->p >= 'a' && *j->p <= 'f') ||
                (*j->p >= 'A' && *j->p <= 'F')))
            return false;
      } else if (strchr("\"\\/bfnrt", e) == NULL || e == '\0') {
        return false;
      }
    }
  }
}

static bool js_number(json_t *j) {
  const char *s = j->p;
  if (*j->p == '-')
    j->p++;
  if (*j->p < '0' || *j->p > '9')
    return false;
  while (*j->p >= '0' && *j->p <= '9')
    j->p++;
  if (*j->p == '.') {
    j->p++;
    if (*j->p < '0' || *j->p > '9')
      return false;
    while (*j->p >= '0' && *j->p <= '9')
      j->p++;
  }
  if (*j->p == 'e' || *j->p == 'E') {
    j->p++;
    if (*j->p == '+' || *j->p == '-')
      j->p++;
    if (*j->p < '0' || *j->p > '9')
      return false;
    while (*j->p >= '0' && *j->p <= '9')
      j->p++;
  }
  return j->p > s;
}

static bool js_container(json_t *j, char open, char close, bool object) {
  if (*j->p != open || ++j->depth > 64)
    return false;
  j->p++;
  js_ws(j);
  if (*j->p == close) {
    j->p++;
    j->depth--;
    return true;
  }
  for (;;) {
    js_ws(j);
    if (object) {
      if (!js_string(j))
        return false;
      js_ws(j);
      if (*j->p++ != ':')
        return false;
      js_ws(j);
    }
    if (!js_value(j))
      return false;
    js_ws(j);
    if (*j->p == ',') {
      j->p++;
      continue;
    }
    if (*j->p == close) {
      j->p++;
      j->depth--;
      return true;
    }
    return false;
  }
}

static bool js_value(json_t *j) {
  switch (*j->p) {
  case '{': return js_container(j, '{', '}', true);
  case '[': return js_container(j, '[', ']', false);
  case '"': return js_string(j);
  case 't': return strncmp(j->p, "true", 4) == 0 && (j->p += 4);
  case 'f': return strncmp(j->p, "false", 5) == 0 && (j->p += 5);
  case 'n': return strncmp(j->p, "null", 4) == 0 && (j->p += 4);
  default: return js_number(j);
  }
}

static bool json_valid(const char *s) {
  json_t j = {s, 0};
  js_ws(&j);
  if (*j.p != '{' || !js_value(&j))
    return false;
  js_ws(&j);
  return *j.p == '\0';
}

/* `ferryctl ... --json` output: JSON Lines, every line one document with
 * "schema": 1 (README, --help). Returns the number of documents. */
static int json_lines(const char *s) {
  int n = 0;
  while (*s != '\0') {
    const char *nl = strchr(s, '\n');
    cr_assert_not_null(nl, "the last document has no newline:\n%s", s);
    char *line = strndup(s, (size_t)(nl - s));
    cr_assert_not_null(line);
    cr_assert(json_valid(line), "line %d is not one JSON document:\n%s",
              n + 1, line);
    cr_assert(strncmp(line, "{\"schema\": 1, ", 14) == 0,
              "line %d does not start with \"schema\": 1:\n%s", n + 1, line);
    free(line);
    n++;
    s = nl + 1;
  }
  return n;
}

Test(ctl, json_checker_rejects_bad_json) {
  cr_assert(json_valid("{\"a\": [1, -2.5e3, \"x\\u00e9\", null, true]}"));
  cr_assert_not(json_valid("{\"a\": [1,]}"));
  cr_assert_not(json_valid("{\"a\": \"\x01\"}"));
  cr_assert_not(json_valid("{\"a\": 1} x"));
}

/* ---- record file helpers ---------------------------------------------- */

/* Byte offsets of the records of an uncompressed TFRecord image. */
static size_t record_offsets(const uint8_t *buf, size_t len, uint64_t *offs,
                             size_t cap) {
  size_t n = 0;
  uint64_t off = 0;
  while (off + 16 <= len && n < cap) {
    uint64_t l = 0;
    memcpy(&l, buf + off, 8);
    offs[n++] = off;
    off += 16 + l;
  }
  cr_assert_eq(off, len, "framing walk ended at %llu of %zu",
               (unsigned long long)off, len);
  return n;
}

static void gen_raw(const char *dir, const char *records, const char *seed) {
  run_t r = run_ctl("gen", "--out", dir, "--shards", "1", "--records",
                    records, "--size", "4x5", "--seed", seed, NULL);
  cr_assert_eq(r.status, 0, "gen failed: %s", r.err);
  run_free(&r);
}

/* Reads every record of `path`, parses it and checks the generated
 * schema; returns the number of records and stores ids in ids[]. */
static size_t check_shard(const char *path, size_t img_len, int64_t classes,
                          bool jpeg, int h, int w, int64_t *ids,
                          size_t cap, ferry_compression_t want) {
  ferry_tfr_options_t o;
  ferry__tfr_options_init(&o);
  ferry_tfr_reader_t *rd = NULL;
  ferry_error_t err;
  cr_assert_eq(ferry__tfr_reader_open(path, &o, &rd, &err), 0, "%s", err.msg);
  ferry_example_t ex;
  ferry__example_init(&ex);
  size_t n = 0;
  ferry_record_t rec;
  int rc;
  while ((rc = ferry__tfr_reader_next(rd, &rec, &err)) == 0) {
    cr_assert_eq(ferry__tfr_reader_compression(rd), want);
    cr_assert_eq(ferry__example_parse(&ex, rec.data, rec.len, &err), 0, "%s",
                 err.msg);
    cr_assert_eq(ex.n, 3);
    const ferry_feature_t *img = ferry__example_find(&ex, "image");
    const ferry_feature_t *lab = ferry__example_find(&ex, "label");
    const ferry_feature_t *id = ferry__example_find(&ex, "id");
    cr_assert(img && lab && id);
    const uint8_t *d;
    size_t len;
    cr_assert_eq(ferry__feature_bytes(img, 0, &d, &len), 0);
    if (jpeg) {
      tjhandle tj = tjInitDecompress();
      int jw, jh, ss, cs;
      cr_assert_eq(tjDecompressHeader3(tj, d, len, &jw, &jh, &ss, &cs), 0,
                   "%s", tjGetErrorStr2(tj));
      cr_assert_eq(jw, w);
      cr_assert_eq(jh, h);
      cr_assert_eq(ss, TJSAMP_420);
      tjDestroy(tj);
    } else {
      cr_assert_eq(len, img_len);
    }
    int64_t v[2];
    size_t nv;
    cr_assert_eq(ferry__feature_int64s(lab, v, 2, &nv), 0);
    cr_assert_eq(nv, 1);
    cr_assert(v[0] >= 0 && v[0] < classes, "label %lld", (long long)v[0]);
    cr_assert_eq(ferry__feature_int64s(id, v, 2, &nv), 0);
    cr_assert_eq(nv, 1);
    cr_assert_lt(n, cap);
    ids[n++] = v[0];
  }
  cr_assert_eq(rc, FERRY_EOF, "%s", err.msg);
  ferry__example_close(&ex);
  ferry__tfr_reader_free(rd);
  return n;
}

/* ---- gen -------------------------------------------------------------- */

Test(ctl, gen_raw_shards_parse, .init = setup_tmp, .fini = teardown_tmp) {
  char dir[512];
  path_in(dir, sizeof(dir), "raw");
  run_t r = run_ctl("gen", "--out", dir, "--shards", "3", "--records", "10",
                    "--size", "4x5", "--channels", "3", "--classes", "4",
                    "--seed", "7", NULL);
  cr_assert_eq(r.status, 0, "stderr: %s", r.err);
  cr_assert(strstr(r.out, "wrote 10 records to 3 files") != NULL, "%s",
            r.out);
  run_free(&r);
  static const size_t want[3] = {4, 3, 3};
  int64_t next = 0;
  for (int s = 0; s < 3; s++) {
    char path[600];
    snprintf(path, sizeof(path), "%s/train-%05d-of-00003.tfrecord", dir, s);
    int64_t ids[16];
    size_t n = check_shard(path, 60, 4, false, 4, 5, ids, 16,
                           FERRY_COMPRESSION_NONE);
    cr_assert_eq(n, want[s], "shard %d has %zu records", s, n);
    for (size_t i = 0; i < n; i++)
      cr_assert_eq(ids[i], next++, "ids run in order across shards");
  }
}

Test(ctl, gen_jpeg_gzip_and_zlib, .init = setup_tmp, .fini = teardown_tmp) {
  char dir[512];
  path_in(dir, sizeof(dir), "jpeg");
  run_t r = run_ctl("gen", "--out", dir, "--shards", "2", "--records", "6",
                    "--format", "jpeg", "--size", "24x40", "--seed", "3",
                    "--compression", "gzip", NULL);
  cr_assert_eq(r.status, 0, "stderr: %s", r.err);
  run_free(&r);
  char path[600];
  int64_t ids[8];
  snprintf(path, sizeof(path), "%s/train-00001-of-00002.tfrecord.gz", dir);
  size_t n = check_shard(path, 0, 10, true, 24, 40, ids, 8,
                         FERRY_COMPRESSION_GZIP);
  cr_assert_eq(n, 3);
  cr_assert_eq(ids[0], 3);

  path_in(dir, sizeof(dir), "zlib");
  r = run_ctl("gen", "--out", dir, "--records", "2", "--compression", "zlib",
              "--size", "8x8", NULL);
  cr_assert_eq(r.status, 0, "stderr: %s", r.err);
  run_free(&r);
  snprintf(path, sizeof(path), "%s/train-00000-of-00001.tfrecord.zz", dir);
  n = check_shard(path, 192, 10, false, 8, 8, ids, 8,
                  FERRY_COMPRESSION_ZLIB);
  cr_assert_eq(n, 2);
}

Test(ctl, gen_is_deterministic, .init = setup_tmp, .fini = teardown_tmp) {
  static const char *const formats[] = {"raw", "jpeg", "jpeg"};
  static const char *const contents[] = {"shapes", "shapes", "photo"};
  for (int f = 0; f < 3; f++) {
    char a[512], b[512], c[512];
    path_in(a, sizeof(a), "a");
    path_in(b, sizeof(b), "b");
    path_in(c, sizeof(c), "c");
    const char *dirs[3] = {a, b, c};
    const char *seeds[3] = {"11", "11", "12"};
    char *data[3];
    size_t len[3];
    for (int i = 0; i < 3; i++) {
      run_t r = run_ctl("gen", "--out", dirs[i], "--records", "20",
                        "--format", formats[f], "--content", contents[f],
                        "--size", "16x16", "--seed", seeds[i], NULL);
      cr_assert_eq(r.status, 0, "stderr: %s", r.err);
      run_free(&r);
      char path[600];
      snprintf(path, sizeof(path), "%s/train-00000-of-00001.tfrecord",
               dirs[i]);
      data[i] = read_file(path, &len[i]);
      cr_assert_not_null(data[i]);
    }
    cr_assert(len[0] == len[1] && memcmp(data[0], data[1], len[0]) == 0,
              "%s: two runs with the same arguments differ", formats[f]);
    cr_assert(len[0] != len[2] || memcmp(data[0], data[2], len[0]) != 0,
              "%s: different seeds gave the same file", formats[f]);
    for (int i = 0; i < 3; i++)
      ferry__free(data[i]);
    rm_rf(a);
    rm_rf(b);
    rm_rf(c);
  }
}

/* Opens DIR/train-00000-of-00001.tfrecord, the one shard `gen` writes
 * without --shards. */
static ferry_tfr_reader_t *open_only_shard(const char *dir) {
  char path[600];
  snprintf(path, sizeof(path), "%s/train-00000-of-00001.tfrecord", dir);
  ferry_tfr_options_t o;
  ferry__tfr_options_init(&o);
  ferry_tfr_reader_t *rd = NULL;
  cr_assert_eq(ferry__tfr_reader_open(path, &o, &rd, NULL), 0, "%s", path);
  return rd;
}

/* Records of a generated dataset are not all alike: labels vary and the
 * pixels of two records differ. */
Test(ctl, gen_records_vary, .init = setup_tmp, .fini = teardown_tmp) {
  char dir[512];
  path_in(dir, sizeof(dir), "v");
  run_t r = run_ctl("gen", "--out", dir, "--records", "50", "--size",
                    "8x8", "--classes", "10", NULL);
  cr_assert_eq(r.status, 0, "stderr: %s", r.err);
  run_free(&r);
  ferry_tfr_reader_t *rd = open_only_shard(dir);
  ferry_example_t ex;
  ferry__example_init(&ex);
  ferry_record_t rec;
  bool seen[10] = {false};
  uint8_t first[192];
  bool differ = false;
  for (int i = 0; ferry__tfr_reader_next(rd, &rec, NULL) == 0; i++) {
    cr_assert_eq(ferry__example_parse(&ex, rec.data, rec.len, NULL), 0);
    int64_t label;
    size_t nv;
    ferry__feature_int64s(ferry__example_find(&ex, "label"), &label, 1, &nv);
    seen[label] = true;
    const uint8_t *d;
    size_t len;
    ferry__feature_bytes(ferry__example_find(&ex, "image"), 0, &d, &len);
    cr_assert_eq(len, sizeof(first));
    if (i == 0)
      memcpy(first, d, len);
    else if (memcmp(first, d, len) != 0)
      differ = true;
  }
  int classes_seen = 0;
  for (int i = 0; i < 10; i++)
    classes_seen += seen[i];
  cr_assert_geq(classes_seen, 5, "only %d labels among 50 records",
                classes_seen);
  cr_assert(differ);
  ferry__example_close(&ex);
  ferry__tfr_reader_free(rd);
}

/* --content photo --size imagenet: each record has one of ImageNet's
 * sizes (not all the same), its JPEG decodes to that size, and the
 * dataset lands in the bytes per pixel of ImageNet's photographs at
 * quality 90 (the JPEG benchmark relies on it), as printed. */
Test(ctl, gen_photo_imagenet, .init = setup_tmp, .fini = teardown_tmp) {
  char dir[512];
  path_in(dir, sizeof(dir), "photo");
  run_t r = run_ctl("gen", "--out", dir, "--records", "40", "--format",
                    "jpeg", "--content", "photo", "--size", "imagenet",
                    "--seed", "13", NULL);
  cr_assert_eq(r.status, 0, "stderr: %s", r.err);
  const char *bpp_at = strstr(r.out, "bytes per image, ");
  cr_assert_not_null(bpp_at, "%s", r.out);
  double printed_bpp = 0;
  cr_assert(sscanf(strstr(bpp_at, "pixels per image, ") +
                       strlen("pixels per image, "),
                   "%lf", &printed_bpp) == 1, "%s", r.out);
  run_free(&r);
  ferry_tfr_reader_t *rd = open_only_shard(dir);
  ferry_example_t ex;
  ferry__example_init(&ex);
  ferry_record_t rec;
  tjhandle tj = tjInitDecompress();
  cr_assert_not_null(tj);
  uint64_t bytes = 0, pixels = 0;
  int n = 0, h0 = 0, w0 = 0;
  bool sizes_differ = false;
  while (ferry__tfr_reader_next(rd, &rec, NULL) == 0) {
    cr_assert_eq(ferry__example_parse(&ex, rec.data, rec.len, NULL), 0);
    const uint8_t *d;
    size_t len;
    cr_assert_eq(
        ferry__feature_bytes(ferry__example_find(&ex, "image"), 0, &d, &len),
        0);
    int w, h, sub, cs;
    cr_assert_eq(tjDecompressHeader3(tj, d, (unsigned long)len, &w, &h,
                                     &sub, &cs), 0, "record %d", n);
    bool known = (h == 375 && w == 500) || (h == 333 && w == 500) ||
                 (h == 500 && w == 375) || (h == 500 && w == 333) ||
                 (h == 500 && w == 500) || (h == 400 && w == 500) ||
                 (h == 480 && w == 640) || (h == 225 && w == 300) ||
                 (h == 300 && w == 400) || (h == 600 && w == 800) ||
                 (h == 768 && w == 1024);
    cr_assert(known, "record %d is %dx%d, not one of ImageNet's sizes", n,
              h, w);
    if (n == 0) {
      h0 = h;
      w0 = w;
    } else if (h != h0 || w != w0) {
      sizes_differ = true;
    }
    bytes += len;
    pixels += (uint64_t)h * (uint64_t)w;
    n++;
  }
  cr_assert_eq(n, 40);
  cr_assert(sizes_differ, "all 40 records are %dx%d", h0, w0);
  double bpp = (double)bytes / (double)pixels;
  cr_assert(bpp > 0.45 && bpp < 0.75, "%.3f bytes per pixel", bpp);
  cr_assert(printed_bpp > bpp - 0.001 && printed_bpp < bpp + 0.001,
            "printed %.3f, measured %.4f", printed_bpp, bpp);
  tjDestroy(tj);
  ferry__example_close(&ex);
  ferry__tfr_reader_free(rd);

  /* Tiny images too (leaves larger than the image, radius 0). */
  static const char *const tiny[] = {"1x1", "2x3", "5x4", "3x40"};
  for (size_t i = 0; i < sizeof(tiny) / sizeof(tiny[0]); i++) {
    path_in(dir, sizeof(dir), "tiny");
    r = run_ctl("gen", "--out", dir, "--records", "5", "--content", "photo",
                "--size", tiny[i], NULL);
    cr_assert_eq(r.status, 0, "%s: %s", tiny[i], r.err);
    run_free(&r);
    rm_rf(dir);
  }
}

/* ---- inspect ---------------------------------------------------------- */

Test(ctl, inspect_clean_text_and_json, .init = setup_tmp,
     .fini = teardown_tmp) {
  char dir[512], path[600];
  path_in(dir, sizeof(dir), "c");
  gen_raw(dir, "5", "1");
  snprintf(path, sizeof(path), "%s/train-00000-of-00001.tfrecord", dir);

  run_t r = run_ctl("records", "inspect", path, NULL);
  cr_assert_eq(r.status, 0, "stdout: %s\nstderr: %s", r.out, r.err);
  cr_assert(strstr(r.out, "compression: none") != NULL, "%s", r.out);
  cr_assert(strstr(r.out, "records: 5,") != NULL, "%s", r.out);
  cr_assert(strstr(r.out, "bad records: 0") != NULL, "%s", r.out);
  cr_assert(strstr(r.out, "features (3 keys)") != NULL, "%s", r.out);
  cr_assert(strstr(r.out, "image  bytes, in 5 of 5 records") != NULL, "%s",
            r.out);
  cr_assert(strstr(r.out, "id     int64, in 5 of 5 records") != NULL, "%s",
            r.out);
  cr_assert(strstr(r.out, "    id  int64[1]: 0\n") != NULL, "%s", r.out);
  cr_assert(strstr(r.out, "status: clean") != NULL, "%s", r.out);
  run_free(&r);

  r = run_ctl("records", "inspect", "--json", "--show", "2", path, path,
              NULL);
  cr_assert_eq(r.status, 0, "stderr: %s", r.err);
  /* One document per file, one per line (it printed one pretty-printed
   * {"files": [...]} without "schema"). */
  cr_assert_eq(json_lines(r.out), 2, "%s", r.out);
  static const char head[] =
      "{\"schema\": 1, \"kind\": \"records_inspect\", \"path\": ";
  cr_assert(strncmp(r.out, head, sizeof(head) - 1) == 0, "%s", r.out);
  /* And as a JSON Lines reader takes it, when python3 is here. */
  if (system("python3 -c '' >/dev/null 2>&1") == 0) {
    char out[600], cmd[1600];
    path_in(out, sizeof(out), "inspect.jsonl");
    write_file(out, r.out, strlen(r.out));
    snprintf(cmd, sizeof(cmd),
             "python3 -c 'import json, sys\n"
             "docs = [json.loads(l) for l in open(sys.argv[1])]\n"
             "assert len(docs) == 2, docs\n"
             "assert all(d[\"schema\"] == 1 and d[\"records\"] == 5 "
             "for d in docs), docs' %s", out);
    cr_assert_eq(system(cmd), 0, "python3 json.loads per line failed:\n%s",
                 r.out);
  }
  cr_assert(strstr(r.out, "\"records\": 5,") != NULL, "%s", r.out);
  cr_assert(strstr(r.out, "\"clean\": true") != NULL);
  cr_assert(strstr(r.out, "{\"key\": \"image\", \"type\": \"bytes\", "
                          "\"records\": 5") != NULL, "%s", r.out);
  cr_assert(strstr(r.out, "{\"key\": \"label\", \"type\": \"int64\"") !=
            NULL);
  cr_assert(strstr(r.out, "{\"key\": \"id\", \"type\": \"int64\", "
                          "\"count\": 1, \"values\": [1]}") != NULL,
            "the second record's id: %s", r.out);
  cr_assert(strstr(r.out, "\"len\": 60, \"hex\": ") != NULL);
  /* Two files, two reports. */
  const char *second = strstr(r.out, "\"path\"");
  cr_assert(second && strstr(second + 1, "\"path\"") != NULL);
  run_free(&r);
}

Test(ctl, inspect_gzip_detected, .init = setup_tmp, .fini = teardown_tmp) {
  char dir[512], path[600];
  path_in(dir, sizeof(dir), "g");
  run_t r = run_ctl("gen", "--out", dir, "--records", "7", "--compression",
                    "gzip", NULL);
  cr_assert_eq(r.status, 0);
  run_free(&r);
  snprintf(path, sizeof(path), "%s/train-00000-of-00001.tfrecord.gz", dir);
  r = run_ctl("records", "inspect", "--json", path, NULL);
  cr_assert_eq(r.status, 0, "%s", r.err);
  cr_assert_eq(json_lines(r.out), 1, "%s", r.out);
  cr_assert(strstr(r.out, "\"compression\": \"gzip\", \"records\": 7,") !=
            NULL, "%s", r.out);
  run_free(&r);
  /* Forcing the wrong compression finds no records, only damage. */
  r = run_ctl("records", "inspect", "--compression", "none", path, NULL);
  cr_assert_eq(r.status, 1, "%s", r.out);
  cr_assert(strstr(r.out, "records: 0,") != NULL, "%s", r.out);
  run_free(&r);
}

/* Flips one data byte of record `k` of `path`; returns its offset. */
static uint64_t corrupt_record(const char *path, size_t k) {
  size_t len;
  char *buf = read_file(path, &len);
  cr_assert_not_null(buf);
  uint64_t offs[64];
  size_t n = record_offsets((uint8_t *)buf, len, offs, 64);
  cr_assert_lt(k, n);
  buf[offs[k] + 12 + 20] ^= 0x5A;
  write_file(path, buf, len);
  ferry__free(buf);
  return offs[k];
}

Test(ctl, inspect_reports_bad_crc_offsets, .init = setup_tmp,
     .fini = teardown_tmp) {
  char dir[512], path[600];
  path_in(dir, sizeof(dir), "bad");
  gen_raw(dir, "8", "2");
  snprintf(path, sizeof(path), "%s/train-00000-of-00001.tfrecord", dir);
  uint64_t off3 = corrupt_record(path, 3);
  cr_assert_gt(off3, 0);

  run_t r = run_ctl("records", "inspect", path, NULL);
  cr_assert_eq(r.status, 1, "stdout: %s", r.out);
  char want[128];
  snprintf(want, sizeof(want), "offset %llu: EDATACRC",
           (unsigned long long)off3);
  cr_assert(strstr(r.out, want) != NULL, "no '%s' in:\n%s", want, r.out);
  cr_assert(strstr(r.out, "records: 7,") != NULL, "%s", r.out);
  cr_assert(strstr(r.out, "bad records: 1") != NULL, "%s", r.out);
  cr_assert(strstr(r.out, "status: BAD") != NULL);
  run_free(&r);

  r = run_ctl("records", "inspect", "--json", path, NULL);
  cr_assert_eq(r.status, 1);
  cr_assert_eq(json_lines(r.out), 1, "%s", r.out);
  snprintf(want, sizeof(want), "{\"offset\": %llu, \"record\": 3, "
           "\"error\": \"EDATACRC\"",
           (unsigned long long)off3);
  cr_assert(strstr(r.out, want) != NULL, "no '%s' in:\n%s", want, r.out);
  cr_assert(strstr(r.out, "\"clean\": false") != NULL);
  run_free(&r);
}

/* Two bad records in a row: the reader skips both in one call; each is
 * still reported (through the reader's on_skip) with its own offset. */
Test(ctl, inspect_reports_consecutive_bad_records, .init = setup_tmp,
     .fini = teardown_tmp) {
  char dir[512], path[600];
  path_in(dir, sizeof(dir), "bad2");
  gen_raw(dir, "8", "2");
  snprintf(path, sizeof(path), "%s/train-00000-of-00001.tfrecord", dir);
  uint64_t off2 = corrupt_record(path, 2);
  uint64_t off3 = corrupt_record(path, 3);
  run_t r = run_ctl("records", "inspect", "--json", path, NULL);
  cr_assert_eq(r.status, 1);
  cr_assert_eq(json_lines(r.out), 1, "%s", r.out);
  char want[128];
  snprintf(want, sizeof(want), "{\"offset\": %llu, \"record\": 2, "
           "\"error\": \"EDATACRC\"",
           (unsigned long long)off2);
  cr_assert(strstr(r.out, want) != NULL, "no '%s' in:\n%s", want, r.out);
  snprintf(want, sizeof(want), "{\"offset\": %llu, \"record\": 3, "
           "\"error\": \"EDATACRC\"",
           (unsigned long long)off3);
  cr_assert(strstr(r.out, want) != NULL, "no '%s' in:\n%s", want, r.out);
  cr_assert(strstr(r.out, "\"bad_records\": 2,") != NULL, "%s", r.out);
  run_free(&r);
}

Test(ctl, inspect_reports_truncation, .init = setup_tmp,
     .fini = teardown_tmp) {
  char dir[512], path[600];
  path_in(dir, sizeof(dir), "trunc");
  gen_raw(dir, "4", "5");
  snprintf(path, sizeof(path), "%s/train-00000-of-00001.tfrecord", dir);
  size_t len;
  char *buf = read_file(path, &len);
  uint64_t offs[8];
  cr_assert_eq(record_offsets((uint8_t *)buf, len, offs, 8), 4);
  write_file(path, buf, len - 10);
  ferry__free(buf);
  run_t r = run_ctl("records", "inspect", path, NULL);
  cr_assert_eq(r.status, 1);
  char want[64];
  snprintf(want, sizeof(want), "offset %llu: ETRUNCDATA",
           (unsigned long long)offs[3]);
  cr_assert(strstr(r.out, want) != NULL, "no '%s' in:\n%s", want, r.out);
  cr_assert(strstr(r.out, "records: 3,") != NULL, "%s", r.out);
  run_free(&r);
}

Test(ctl, inspect_reports_malformed_examples, .init = setup_tmp,
     .fini = teardown_tmp) {
  char path[600];
  path_in(path, sizeof(path), "notex.tfrecord");
  /* One record "hello": valid framing (the OPS.md vector), not an
   * Example ('h' is field 13 with wire type 0, then 'e' ...). */
  static const uint8_t rec[] = {0x05, 0, 0, 0, 0, 0, 0, 0, 0xea, 0xb2, 0x04,
                                0x3e, 'h', 'e', 'l', 'l', 'o', 0xbb, 0x1f,
                                0x1c, 0x19};
  write_file(path, rec, sizeof(rec));
  run_t r = run_ctl("records", "inspect", "--json", path, NULL);
  cr_assert_eq(r.status, 1, "%s", r.out);
  cr_assert_eq(json_lines(r.out), 1, "%s", r.out);
  cr_assert(strstr(r.out, "\"records\": 1,") != NULL, "%s", r.out);
  cr_assert(strstr(r.out, "\"malformed_examples\": 1") != NULL, "%s", r.out);
  cr_assert(strstr(r.out, "\"malformed\": [{\"offset\": 0, "
                          "\"record\": 0,") != NULL, "%s", r.out);
  run_free(&r);
}

/* Keys and values are arbitrary bytes: the JSON stays valid. */
Test(ctl, inspect_json_escapes_keys_and_values, .init = setup_tmp,
     .fini = teardown_tmp) {
  char path[600];
  path_in(path, sizeof(path), "esc.tfrecord");
  /* Example{features{feature{key: ff 01 'k', value: bytes_list{'a"b'}}}} */
  static const uint8_t ex[] = {0x0A, 0x10, 0x0A, 0x0E, 0x0A, 0x03, 0xFF,
                               0x01, 'k',  0x12, 0x07, 0x0A, 0x05, 0x0A,
                               0x03, 'a',  '"',  'b'};
  ferry_tfr_writer_t *w;
  cr_assert_eq(ferry__tfr_writer_open(path, FERRY_COMPRESSION_NONE, &w, NULL),
               0);
  cr_assert_eq(ferry__tfr_writer_write(w, ex, sizeof(ex), NULL), 0);
  cr_assert_eq(ferry__tfr_writer_close(w, NULL), 0);
  run_t r = run_ctl("records", "inspect", "--json", path, NULL);
  cr_assert_eq(r.status, 0, "%s%s", r.out, r.err);
  cr_assert_eq(json_lines(r.out), 1, "%s", r.out);
  cr_assert(strstr(r.out, "\"key\": \"\\u00ff\\u0001k\"") != NULL, "%s",
            r.out);
  cr_assert(strstr(r.out, "\"text\": \"a\\\"b\"") != NULL, "%s", r.out);
  run_free(&r);
  r = run_ctl("records", "inspect", path, NULL);
  cr_assert_eq(r.status, 0);
  cr_assert(strstr(r.out, "\\xff\\x01k") != NULL, "%s", r.out);
  run_free(&r);
}

/* ---- index ------------------------------------------------------------ */

Test(ctl, index_writes_dali_lines, .init = setup_tmp, .fini = teardown_tmp) {
  char dir[512], path[600], idx[700], outdir[512];
  path_in(dir, sizeof(dir), "i");
  run_t r = run_ctl("gen", "--out", dir, "--records", "200", "--size",
                    "3x3", NULL);
  cr_assert_eq(r.status, 0);
  run_free(&r);
  snprintf(path, sizeof(path), "%s/train-00000-of-00001.tfrecord", dir);
  size_t len;
  char *buf = read_file(path, &len);
  uint64_t offs[256];
  size_t n = record_offsets((uint8_t *)buf, len, offs, 256);
  cr_assert_eq(n, 200);
  ferry__free(buf);
  char *want = ferry__malloc(n * 48 + 1);
  size_t w = 0;
  for (size_t i = 0; i < n; i++) {
    uint64_t end = i + 1 < n ? offs[i + 1] : len;
    w += (size_t)sprintf(want + w, "%llu %llu\n", (unsigned long long)offs[i],
                         (unsigned long long)(end - offs[i]));
  }

  r = run_ctl("records", "index", path, NULL);
  cr_assert_eq(r.status, 0, "%s", r.err);
  cr_assert(strstr(r.out, "200 records") != NULL, "%s", r.out);
  run_free(&r);
  snprintf(idx, sizeof(idx), "%s.idx", path);
  char *got = read_file(idx, NULL);
  cr_assert_not_null(got, "no %s", idx);
  cr_assert_str_eq(got, want);
  ferry__free(got);

  path_in(outdir, sizeof(outdir), "idxout");
  cr_assert_eq(mkdir(outdir, 0700), 0);
  r = run_ctl("records", "index", "--out-dir", outdir, path, NULL);
  cr_assert_eq(r.status, 0, "%s", r.err);
  run_free(&r);
  snprintf(idx, sizeof(idx), "%s/train-00000-of-00001.tfrecord.idx", outdir);
  got = read_file(idx, NULL);
  cr_assert_not_null(got, "no %s", idx);
  cr_assert_str_eq(got, want);
  ferry__free(got);
  ferry__free(want);
}

Test(ctl, index_refuses_compressed_and_bad, .init = setup_tmp,
     .fini = teardown_tmp) {
  char dir[512], path[600], idx[700];
  path_in(dir, sizeof(dir), "z");
  run_t r = run_ctl("gen", "--out", dir, "--records", "3", "--compression",
                    "gzip", NULL);
  cr_assert_eq(r.status, 0);
  run_free(&r);
  snprintf(path, sizeof(path), "%s/train-00000-of-00001.tfrecord.gz", dir);
  r = run_ctl("records", "index", path, NULL);
  cr_assert_eq(r.status, 2);
  cr_assert(strstr(r.err, path) != NULL, "%s", r.err);
  cr_assert(strstr(r.err, "gzip-compressed") != NULL, "%s", r.err);
  run_free(&r);
  snprintf(idx, sizeof(idx), "%s.idx", path);
  cr_assert_neq(access(idx, F_OK), 0, "an index was written for gzip");

  path_in(dir, sizeof(dir), "b");
  gen_raw(dir, "5", "4");
  snprintf(path, sizeof(path), "%s/train-00000-of-00001.tfrecord", dir);
  uint64_t off = corrupt_record(path, 4);
  r = run_ctl("records", "index", path, NULL);
  cr_assert_eq(r.status, 1, "%s", r.err);
  char want[64];
  snprintf(want, sizeof(want), "offset %llu", (unsigned long long)off);
  cr_assert(strstr(r.err, want) != NULL, "no '%s' in %s", want, r.err);
  cr_assert(strstr(r.err, "EDATACRC") != NULL, "%s", r.err);
  run_free(&r);
  snprintf(idx, sizeof(idx), "%s.idx", path);
  cr_assert_neq(access(idx, F_OK), 0, "an index was written for a bad file");
}

/* ---- optimize --------------------------------------------------------- */

/* Every record of `path` (any compression), copied. */
typedef struct recs_s {
  uint8_t **data;
  size_t *len;
  size_t n, cap;
} recs_t;

static void recs_read(const char *path, recs_t *rs) {
  ferry_tfr_options_t o;
  ferry__tfr_options_init(&o);
  ferry_tfr_reader_t *rd = NULL;
  ferry_error_t err;
  memset(rs, 0, sizeof(*rs));
  cr_assert_eq(ferry__tfr_reader_open(path, &o, &rd, &err), 0, "%s", err.msg);
  ferry_record_t rec;
  int rc;
  while ((rc = ferry__tfr_reader_next(rd, &rec, &err)) == 0) {
    if (rs->n == rs->cap) {
      rs->cap = rs->cap ? 2 * rs->cap : 64;
      rs->data = realloc(rs->data, rs->cap * sizeof(*rs->data));
      rs->len = realloc(rs->len, rs->cap * sizeof(*rs->len));
      cr_assert(rs->data && rs->len);
    }
    rs->data[rs->n] = malloc(rec.len + 1);
    cr_assert_not_null(rs->data[rs->n]);
    memcpy(rs->data[rs->n], rec.data, rec.len);
    rs->len[rs->n++] = rec.len;
  }
  cr_assert_eq(rc, FERRY_EOF, "%s", err.msg);
  ferry__tfr_reader_free(rd);
}

static void recs_free(recs_t *rs) {
  for (size_t i = 0; i < rs->n; i++)
    free(rs->data[i]);
  free(rs->data);
  free(rs->len);
}

/* What a comparison of an input with its output counted. */
typedef struct opt_seen_s {
  size_t records, not_examples, jpegs, rewritten, copied;
} opt_seen_t;

static bool is_jpeg(const uint8_t *d, size_t len) {
  return len >= 3 && d[0] == 0xFF && d[1] == 0xD8 && d[2] == 0xFF;
}

/* Decodes a JPEG with Ferry's decoder into a malloc'd buffer. */
static uint8_t *decode_jpeg(ferry_jpeg_t *j, const uint8_t *d, size_t len,
                            int *h, int *w) {
  ferry_error_t err;
  cr_assert_eq(ferry__jpeg_header(j, d, len, h, w, &err), 0, "%s", err.msg);
  size_t cap = (size_t)*h * (size_t)*w * 3;
  uint8_t *px = malloc(cap);
  cr_assert_not_null(px);
  cr_assert_eq(ferry__jpeg_decode(j, d, len, px, cap, h, w, &err), 0, "%s",
               err.msg);
  return px;
}

/* Compares input `in` with output `out` record by record, in order: a
 * record that is not an Example is copied byte for byte; an Example has
 * the same features in the same order, every list but a JPEG's
 * byte-identical, and every JPEG either copied byte for byte or rewritten
 * (laid out for cropping) to an image that decodes to the same pixels. */
static opt_seen_t compare_optimized(const char *in, const char *out) {
  recs_t a, b;
  recs_read(in, &a);
  recs_read(out, &b);
  cr_assert_eq(b.n, a.n, "%s: %zu records, %s: %zu", in, a.n, out, b.n);
  ferry_jpeg_t *j = NULL;
  cr_assert_eq(ferry__jpeg_new(&j, NULL), 0);
  ferry_example_t ea, eb;
  ferry__example_init(&ea);
  ferry__example_init(&eb);
  opt_seen_t seen = {a.n, 0, 0, 0, 0};
  for (size_t r = 0; r < a.n; r++) {
    if (ferry__example_parse(&ea, a.data[r], a.len[r], NULL) != 0) {
      seen.not_examples++;
      cr_assert(b.len[r] == a.len[r] &&
                    memcmp(a.data[r], b.data[r], a.len[r]) == 0,
                "%s: record %zu (not an Example) changed", in, r);
      continue;
    }
    ferry_error_t err;
    cr_assert_eq(ferry__example_parse(&eb, b.data[r], b.len[r], &err), 0,
                 "%s: record %zu: %s", out, r, err.msg);
    cr_assert_eq(eb.n, ea.n, "record %zu", r);
    for (size_t i = 0; i < ea.n; i++) {
      const ferry_feature_t *fa = &ea.features[i], *fb = &eb.features[i];
      cr_assert(fa->key_len == fb->key_len &&
                memcmp(fa->key, fb->key, fa->key_len) == 0);
      cr_assert_eq(fa->kind, fb->kind);
      cr_assert_eq(fa->count, fb->count);
      if (fa->kind != FERRY_FEATURE_BYTES) {
        cr_assert(fa->list_len == fb->list_len &&
                  (fa->list_len == 0 ||
                   memcmp(fa->list, fb->list, fa->list_len) == 0),
                  "record %zu: feature %zu changed", r, i);
        continue;
      }
      for (size_t v = 0; v < fa->count; v++) {
        const uint8_t *da, *db;
        size_t la, lb;
        cr_assert_eq(ferry__feature_bytes(fa, v, &da, &la), 0);
        cr_assert_eq(ferry__feature_bytes(fb, v, &db, &lb), 0);
        bool same = la == lb && (la == 0 || memcmp(da, db, la) == 0);
        if (!is_jpeg(da, la)) {
          cr_assert(same, "record %zu: feature %zu value %zu changed", r, i,
                    v);
          continue;
        }
        seen.jpegs++;
        if (same) {
          seen.copied++;
          continue;
        }
        seen.rewritten++;
        ferry_jpeg_layout_t l;
        cr_assert_eq(ferry__jpeg_layout(db, lb, &l, NULL, 0), 1,
                     "record %zu: the rewrite is not laid out", r);
        int ha, wa, hb, wb;
        uint8_t *pa = decode_jpeg(j, da, la, &ha, &wa);
        uint8_t *pb = decode_jpeg(j, db, lb, &hb, &wb);
        cr_assert(ha == hb && wa == wb, "record %zu: %dx%d, was %dx%d", r,
                  hb, wb, ha, wa);
        cr_assert_eq(memcmp(pa, pb, (size_t)ha * (size_t)wa * 3), 0,
                     "%s: record %zu: the rewritten JPEG decodes to other "
                     "pixels", out, r);
        free(pa);
        free(pb);
      }
    }
  }
  ferry__example_close(&ea);
  ferry__example_close(&eb);
  ferry__jpeg_free(j);
  recs_free(&a);
  recs_free(&b);
  return seen;
}

static uint64_t file_size(const char *path) {
  struct stat st;
  cr_assert_eq(stat(path, &st), 0, "%s: %s", path, strerror(errno));
  return (uint64_t)st.st_size;
}

/* The .idx of an uncompressed output: what `records index` would write. */
static void check_idx(const char *path) {
  char idx[700];
  snprintf(idx, sizeof(idx), "%s.idx", path);
  size_t len;
  char *buf = read_file(path, &len);
  cr_assert_not_null(buf);
  uint64_t offs[64];
  size_t n = record_offsets((uint8_t *)buf, len, offs, 64);
  ferry__free(buf);
  char want[64 * 48] = "";
  size_t w = 0;
  for (size_t i = 0; i < n; i++) {
    uint64_t end = i + 1 < n ? offs[i + 1] : len;
    w += (size_t)snprintf(want + w, sizeof(want) - w, "%llu %llu\n",
                          (unsigned long long)offs[i],
                          (unsigned long long)(end - offs[i]));
  }
  char *got = read_file(idx, NULL);
  cr_assert_not_null(got, "no %s", idx);
  cr_assert_str_eq(got, want);
  ferry__free(got);
}

/* The line of `out` that starts with `head`, and its counts. */
static void check_line(const char *out, const char *head,
                       const opt_seen_t *s, uint64_t bytes_in,
                       uint64_t bytes_out) {
  const char *line = strstr(out, head);
  cr_assert_not_null(line, "no '%s' in:\n%s", head, out);
  char want[256];
  snprintf(want, sizeof(want), "%s%zu records, %zu JPEGs: %zu rewritten, "
           "%zu copied", head, s->records, s->jpegs, s->rewritten,
           s->copied);
  cr_assert(strncmp(line, want, strlen(want)) == 0, "want '%s' in:\n%s",
            want, out);
  const char *eol = strchr(line, '\n');
  cr_assert_not_null(eol);
  double pct = 100.0 * ((double)bytes_out - (double)bytes_in) /
               (double)bytes_in;
  snprintf(want, sizeof(want), ", bytes %llu -> %llu (%+.2f%%)\n",
           (unsigned long long)bytes_in, (unsigned long long)bytes_out, pct);
  cr_assert(strncmp(eol + 1 - strlen(want), want, strlen(want)) == 0,
            "want '%s' in:\n%s", want, out);
}

/* Optimizes the dataset `gen` writes with `args` (into IN, two shards
 * when `shards` is "2") and checks every output against its input and the
 * report; returns the JPEGs rewritten. */
static size_t optimize_generated(const char *size, const char *records,
                                 const char *shards) {
  char in[512], out[512], again[512];
  path_in(in, sizeof(in), "in");
  path_in(out, sizeof(out), "out");
  path_in(again, sizeof(again), "again");
  run_t r = run_ctl("gen", "--out", in, "--format", "jpeg", "--content",
                    "photo", "--size", size, "--records", records,
                    "--shards", shards, "--seed", "5", NULL);
  cr_assert_eq(r.status, 0, "%s", r.err);
  run_free(&r);
  r = run_ctl("records", "optimize", in, out, NULL);
  cr_assert_eq(r.status, 0, "%s%s", r.out, r.err);
  int n = atoi(shards);
  opt_seen_t total = {0};
  uint64_t total_in = 0, total_out = 0;
  for (int s = 0; s < n; s++) {
    char a[700], b[700], head[1500];
    snprintf(a, sizeof(a), "%s/train-%05d-of-%05d.tfrecord", in, s, n);
    snprintf(b, sizeof(b), "%s/train-%05d-of-%05d.tfrecord", out, s, n);
    opt_seen_t seen = compare_optimized(a, b);
    cr_assert_eq(seen.not_examples, 0);
    cr_assert_gt(seen.jpegs, 0);
    check_idx(b);
    snprintf(head, sizeof(head), "%s -> %s: ", a, b);
    check_line(r.out, head, &seen, file_size(a), file_size(b));
    total.records += seen.records;
    total.jpegs += seen.jpegs;
    total.rewritten += seen.rewritten;
    total.copied += seen.copied;
    total_in += file_size(a);
    total_out += file_size(b);
  }
  cr_assert_eq(total.records, (size_t)atoi(records));
  if (n > 1) {
    char head[64];
    snprintf(head, sizeof(head), "total (%d files): ", n);
    check_line(r.out, head, &total, total_in, total_out);
  }
  run_free(&r);

  /* --json: one document with the same counts. */
  r = run_ctl("records", "optimize", "--json", in, out, NULL);
  cr_assert_eq(r.status, 0, "%s", r.err);
  cr_assert_eq(json_lines(r.out), 1, "%s", r.out);
  char want[256];
  snprintf(want, sizeof(want), "\"total\": {\"files\": %d, \"records\": %zu, "
           "\"not_examples\": 0, \"jpegs\": %zu, \"rewritten\": %zu, "
           "\"copied\": %zu, ", n, total.records, total.jpegs,
           total.rewritten, total.copied);
  cr_assert(strstr(r.out, want) != NULL, "no '%s' in:\n%s", want, r.out);
  snprintf(want, sizeof(want), "\"bytes_in\": %llu, \"bytes_out\": %llu",
           (unsigned long long)total_in, (unsigned long long)total_out);
  cr_assert(strstr(r.out, want) != NULL, "no '%s' in:\n%s", want, r.out);
  run_free(&r);

  /* One thread writes the same bytes as several; a second pass finds
   * every rewritten image already laid out. */
  r = run_ctl("records", "optimize", "--threads", "1", in, again, NULL);
  cr_assert_eq(r.status, 0, "%s", r.err);
  run_free(&r);
  for (int s = 0; s < n; s++) {
    char a[700], b[700];
    size_t la, lb;
    snprintf(a, sizeof(a), "%s/train-%05d-of-%05d.tfrecord", out, s, n);
    snprintf(b, sizeof(b), "%s/train-%05d-of-%05d.tfrecord", again, s, n);
    char *da = read_file(a, &la), *db = read_file(b, &lb);
    cr_assert(da && db && la == lb && memcmp(da, db, la) == 0,
              "--threads 1 wrote another %s", b);
    ferry__free(da);
    ferry__free(db);
  }
  r = run_ctl("records", "optimize", "--json", out, again, NULL);
  cr_assert_eq(r.status, 0, "%s", r.err);
  snprintf(want, sizeof(want), "\"rewritten\": 0, \"copied\": %zu, "
           "\"reasons\": {\"already\": %zu, ", total.jpegs, total.rewritten);
  cr_assert(strstr(r.out, want) != NULL, "no '%s' in:\n%s", want, r.out);
  run_free(&r);
  rm_rf(in);
  rm_rf(out);
  rm_rf(again);
  return total.rewritten;
}

Test(ctl, optimize_photo_dataset, .init = setup_tmp, .fini = teardown_tmp,
     .timeout = 240) {
  size_t rewritten = optimize_generated("64x96", "20", "2");
  cr_assert_gt(rewritten, 10, "only %zu of 20 JPEGs rewritten", rewritten);
  rewritten = optimize_generated("imagenet", "6", "1");
  cr_assert_gt(rewritten, 3, "only %zu of 6 JPEGs rewritten", rewritten);
}

/* --compression changes the outputs' compression: no index then, and the
 * records are the same. */
Test(ctl, optimize_compression, .init = setup_tmp, .fini = teardown_tmp) {
  char in[512], out[512], a[700], b[700], idx[800];
  path_in(in, sizeof(in), "in");
  path_in(out, sizeof(out), "out");
  run_t r = run_ctl("gen", "--out", in, "--format", "jpeg", "--content",
                    "photo", "--size", "48x64", "--records", "5",
                    "--compression", "gzip", NULL);
  cr_assert_eq(r.status, 0, "%s", r.err);
  run_free(&r);
  snprintf(a, sizeof(a), "%s/train-00000-of-00001.tfrecord.gz", in);
  snprintf(b, sizeof(b), "%s/train-00000-of-00001.tfrecord.gz", out);
  snprintf(idx, sizeof(idx), "%s.idx", b);
  /* The same compression as the input by default; an index left by an
   * earlier run is removed. */
  cr_assert_eq(mkdir(out, 0700), 0);
  write_file(idx, "0 16\n", 5);
  r = run_ctl("records", "optimize", a, out, NULL);
  cr_assert_eq(r.status, 0, "%s", r.err);
  run_free(&r);
  cr_assert_eq(ferry__tfr_sniff_file(b, NULL), FERRY_COMPRESSION_GZIP);
  cr_assert_neq(access(idx, F_OK), 0, "a stale index was left for gzip");
  opt_seen_t seen = compare_optimized(a, b);
  cr_assert_eq(seen.records, 5);
  cr_assert_gt(seen.rewritten, 0);
  /* --compression none: uncompressed, with its index. */
  rm_rf(out);
  r = run_ctl("records", "optimize", "--compression", "none", a, out, NULL);
  cr_assert_eq(r.status, 0, "%s", r.err);
  run_free(&r);
  cr_assert_eq(ferry__tfr_sniff_file(b, NULL), FERRY_COMPRESSION_NONE);
  check_idx(b);
  seen = compare_optimized(a, b);
  cr_assert_eq(seen.records, 5);
}

/* OUT an input directory, an output over an input, two inputs with one
 * name: refused before anything is written (exit 2). */
Test(ctl, optimize_refuses_to_overwrite_inputs, .init = setup_tmp,
     .fini = teardown_tmp) {
  char in[512], other[512], fresh[512], path[700], copy[700];
  path_in(in, sizeof(in), "in");
  path_in(other, sizeof(other), "other");
  path_in(fresh, sizeof(fresh), "fresh");
  gen_raw(in, "3", "1");
  cr_assert_eq(mkdir(other, 0700), 0);
  snprintf(path, sizeof(path), "%s/train-00000-of-00001.tfrecord", in);
  snprintf(copy, sizeof(copy), "%s/train-00000-of-00001.tfrecord", other);
  size_t len;
  char *data = read_file(path, &len);
  write_file(copy, data, len);
  ferry__free(data);
  struct {
    const char *a[3];
    const char *says;
  } cases[] = {
      {{in, in, NULL}, "is the input directory"},
      {{path, in, NULL}, "would overwrite the input"},
      {{in, other, in}, "would overwrite the input"},
      {{path, copy, fresh}, "are both named"},
      {{path, path, NULL}, "not a directory"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    run_t r = run_ctl("records", "optimize", cases[i].a[0], cases[i].a[1],
                      cases[i].a[2], NULL);
    cr_assert_eq(r.status, 2, "case %zu: exit %d: %s", i, r.status, r.err);
    cr_assert(strstr(r.err, cases[i].says) != NULL, "case %zu: %s", i,
              r.err);
    run_free(&r);
  }
  cr_assert_neq(access(fresh, F_OK), 0, "OUT was created for a refusal");
  char idx[800];
  snprintf(idx, sizeof(idx), "%s.idx", path);
  cr_assert_neq(access(idx, F_OK), 0, "an index was written over IN");
}

/* A data CRC error: exit 1 naming the file and the record's offset, and
 * nothing under the output's name (nor a temporary file left over). */
Test(ctl, optimize_stops_at_a_bad_record, .init = setup_tmp,
     .fini = teardown_tmp) {
  char in[512], out[512], path[700];
  path_in(in, sizeof(in), "in");
  path_in(out, sizeof(out), "out");
  run_t r = run_ctl("gen", "--out", in, "--format", "jpeg", "--content",
                    "photo", "--size", "64x96", "--records", "20", NULL);
  cr_assert_eq(r.status, 0, "%s", r.err);
  run_free(&r);
  snprintf(path, sizeof(path), "%s/train-00000-of-00001.tfrecord", in);
  uint64_t off = corrupt_record(path, 13);
  for (int json = 0; json < 2; json++) {
    r = json ? run_ctl("records", "optimize", "--json", path, out, NULL)
             : run_ctl("records", "optimize", path, out, NULL);
    cr_assert_eq(r.status, 1, "exit %d: %s", r.status, r.err);
    char want[128];
    snprintf(want, sizeof(want), "offset %llu", (unsigned long long)off);
    cr_assert(strstr(r.err, path) != NULL && strstr(r.err, want) != NULL &&
                  strstr(r.err, "EDATACRC") != NULL,
              "no file, '%s' and EDATACRC in: %s", want, r.err);
    if (json) {
      cr_assert_eq(json_lines(r.out), 1, "%s", r.out);
      cr_assert(strstr(r.out, "\"error\": \"EDATACRC\"") != NULL, "%s",
                r.out);
    }
    run_free(&r);
    DIR *d = opendir(out);
    cr_assert_not_null(d, "OUT was not created");
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
      cr_assert(strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0,
                "%s left in OUT", e->d_name);
    closedir(d);
  }
}

/* ---- usage ------------------------------------------------------------ */

Test(ctl, usage_errors_exit_2, .init = setup_tmp, .fini = teardown_tmp) {
  char out[512];
  path_in(out, sizeof(out), "u");
  struct {
    const char *a[8];
    const char *in_stderr;
  } cases[] = {
      {{"records", NULL}, "usage"},
      {{"records", "frob", NULL}, "unknown command 'frob'"},
      {{"records", "inspect", NULL}, "no FILE"},
      {{"records", "inspect", "--bogus", "x", NULL}, "--bogus"},
      {{"records", "inspect", "--show", "-3", "x", NULL}, "show"},
      {{"records", "inspect", "/nonexistent/ferry.tfrecord", NULL},
       "/nonexistent/ferry.tfrecord"},
      {{"records", "index", NULL}, "no FILE"},
      {{"records", "index", "--out-dir", "/nonexistent/d", "f", NULL},
       "/nonexistent/d"},
      {{"records", "optimize", NULL}, "give IN... and OUT"},
      {{"records", "optimize", out, NULL}, "give IN... and OUT"},
      {{"records", "optimize", "/nonexistent/in", out, NULL},
       "/nonexistent/in"},
      {{"records", "optimize", "--compression", "lz4", "x", out, NULL},
       "compression"},
      {{"gen", "--records", "3", NULL}, "--out"},
      {{"gen", "--out", out, "--size", "3y4", NULL}, "--size"},
      {{"gen", "--out", out, "--format", "jpeg", "--channels", "2", NULL},
       "channels"},
      {{"gen", "--out", out, "--format", "png", NULL}, "format"},
      {{"gen", "--out", out, "stray", NULL}, "stray"},
      {{"gen", "--out", out, "--size", "imagenet", NULL}, "--format jpeg"},
      {{"gen", "--out", out, "--content", "photo", "--channels", "1", NULL},
       "--channels 3"},
      {{"gen", "--out", out, "--content", "cartoon", NULL}, "content"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    const char *const *a = cases[i].a;
    run_t r = run_ctl(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], NULL);
    cr_assert_eq(r.status, 2, "case %zu (%s %s): status %d", i, a[0],
                 a[1] ? a[1] : "", r.status);
    cr_assert(strstr(r.err, cases[i].in_stderr) != NULL,
              "case %zu: no '%s' in stderr: %s", i, cases[i].in_stderr,
              r.err);
    run_free(&r);
  }
}

Test(ctl, help_lists_options, .init = setup_tmp, .fini = teardown_tmp) {
  struct {
    const char *a[4];
    const char *want;
  } cases[] = {
      {{"records", "inspect", "--help", NULL}, "--json"},
      {{"records", "inspect", "-h", NULL}, "--max-record-bytes"},
      {{"records", "index", "--help", NULL}, "--out-dir"},
      {{"gen", "--help", NULL}, "--compression"},
      {{"records", "--help", NULL}, "records index"},
      {{"records", "--help", NULL}, "records optimize"},
      {{"records", "optimize", "--help", NULL}, "--threads"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    run_t r = run_ctl(cases[i].a[0], cases[i].a[1], cases[i].a[2], NULL);
    cr_assert_eq(r.status, 0, "case %zu: %s", i, r.err);
    cr_assert(strstr(r.out, "usage: ferryctl") != NULL, "%s", r.out);
    cr_assert(strstr(r.out, cases[i].want) != NULL, "case %zu: %s", i,
              r.out);
    run_free(&r);
  }
}

/* ---- real files (../shared/testdata) ---------------------------------- */

static bool have_testdata(void) {
  struct stat st;
  return stat(FERRY_TESTDATA_DIR "/tfrecord", &st) == 0 &&
         S_ISDIR(st.st_mode);
}

Test(ctl, testdata_index_matches_expected, .init = setup_tmp,
     .fini = teardown_tmp) {
  if (!have_testdata())
    cr_skip_test("no testdata at %s", FERRY_TESTDATA_DIR);
  const char *exp_dir = FERRY_TESTDATA_DIR "/dali_index/computed_by_us";
  DIR *d = opendir(exp_dir);
  cr_assert_not_null(d, "%s", exp_dir);
  struct dirent *e;
  int checked = 0;
  while ((e = readdir(d)) != NULL) {
    size_t nl = strlen(e->d_name);
    if (nl < 5 || strcmp(e->d_name + nl - 4, ".idx") != 0)
      continue;
    char src[1024], expect[1024], got_path[1024];
    snprintf(src, sizeof(src), "%s/tfrecord/%.*s", FERRY_TESTDATA_DIR,
             (int)(nl - 4), e->d_name);
    snprintf(expect, sizeof(expect), "%s/%s", exp_dir, e->d_name);
    snprintf(got_path, sizeof(got_path), "%s/%s", tmpdir, e->d_name);
    run_t r = run_ctl("records", "index", "--out-dir", tmpdir, src, NULL);
    cr_assert_eq(r.status, 0, "%s: %s", src, r.err);
    run_free(&r);
    size_t gl, el;
    char *got = read_file(got_path, &gl);
    char *want = read_file(expect, &el);
    cr_assert_not_null(got, "%s", got_path);
    cr_assert_not_null(want);
    cr_assert(gl == el && memcmp(got, want, gl) == 0,
              "%s differs from %s", got_path, expect);
    ferry__free(got);
    ferry__free(want);
    checked++;
  }
  closedir(d);
  cr_assert_geq(checked, 6, "only %d expected indices found", checked);
}

Test(ctl, testdata_inspect_nitishkiitk, .init = setup_tmp,
     .fini = teardown_tmp) {
  if (!have_testdata())
    cr_skip_test("no testdata at %s", FERRY_TESTDATA_DIR);
  run_t r = run_ctl("records", "inspect", "--json",
                    FERRY_TESTDATA_DIR "/tfrecord/nitishkiitk_test.tfrecord",
                    NULL);
  cr_assert_eq(r.status, 0, "%s", r.err);
  cr_assert_eq(json_lines(r.out), 1, "%s", r.out);
  cr_assert(strstr(r.out, "\"records\": 10,") != NULL);
  static const char *const keys[7] = {
      "image/encoded", "image/class/label", "image/width", "image/height",
      "image/format", "image/filename", "image/angle"};
  for (int i = 0; i < 7; i++) {
    char want[128];
    snprintf(want, sizeof(want), "{\"key\": \"%s\", \"type\": \"%s\", "
             "\"records\": 10,", keys[i],
             (i == 0 || i == 4 || i == 5) ? "bytes" : "int64");
    cr_assert(strstr(r.out, want) != NULL, "no '%s'", want);
  }
  /* Exactly 7 keys in the features summary. */
  const char *feat = strstr(r.out, "\"features\": [");
  const char *first = strstr(r.out, "\"first_records\"");
  cr_assert(feat && first && feat < first);
  int n = 0;
  for (const char *p = feat; (p = strstr(p, "{\"key\": ")) && p < first; p++)
    n++;
  cr_assert_eq(n, 7);
  /* The Windows path's backslashes are escaped. */
  cr_assert(strstr(r.out, "E:\\\\LTTS\\\\") != NULL);
  run_free(&r);

  /* The damaged pets file: the data CRC at 0 and the garbage header at
   * 18446 (MANIFEST A3) are both reported. */
  r = run_ctl("records", "inspect",
              FERRY_TESTDATA_DIR "/tfrecord/DAMAGED_crlf_pets_examples.record",
              NULL);
  cr_assert_eq(r.status, 1);
  cr_assert(strstr(r.out, "offset 0: EDATACRC") != NULL, "%s", r.out);
  cr_assert(strstr(r.out, "offset 18446: ELENCRC") != NULL, "%s", r.out);
  run_free(&r);
}

/* The real files of ../shared/testdata: each optimized, its records
 * compared with the input's (a rewritten JPEG decodes to the same pixels,
 * a copied one and everything else is byte-identical); a damaged file
 * fails naming its byte offset and leaves no output. */
Test(ctl, optimize_testdata, .init = setup_tmp, .fini = teardown_tmp,
     .timeout = 600) {
  if (!have_testdata()) {
    printf("ctl: skipping optimize_testdata: no %s/tfrecord\n",
           FERRY_TESTDATA_DIR);
    cr_skip_test("no testdata at %s", FERRY_TESTDATA_DIR);
  }
  const char *dir = FERRY_TESTDATA_DIR "/tfrecord";
  DIR *d = opendir(dir);
  cr_assert_not_null(d, "%s", dir);
  struct dirent *e;
  size_t files = 0, damaged = 0, rewritten = 0, copied = 0;
  while ((e = readdir(d)) != NULL) {
    size_t nl = strlen(e->d_name);
    if (!((nl > 9 && strcmp(e->d_name + nl - 9, ".tfrecord") == 0) ||
          (nl > 7 && strcmp(e->d_name + nl - 7, ".record") == 0)))
      continue;
    char in[1024], out[1024];
    snprintf(in, sizeof(in), "%s/%s", dir, e->d_name);
    snprintf(out, sizeof(out), "%s/%s", tmpdir, e->d_name);
    /* Damaged: Ferry's reader stops inside it. */
    ferry_tfr_options_t o;
    ferry__tfr_options_init(&o);
    ferry_tfr_reader_t *rd = NULL;
    cr_assert_eq(ferry__tfr_reader_open(in, &o, &rd, NULL), 0, "%s", in);
    ferry_record_t rec;
    int rc;
    while ((rc = ferry__tfr_reader_next(rd, &rec, NULL)) == 0)
      ;
    ferry__tfr_reader_free(rd);
    run_t r = run_ctl("records", "optimize", in, tmpdir, NULL);
    if (rc != FERRY_EOF) {
      cr_assert_eq(r.status, 1, "%s: exit %d: %s", in, r.status, r.err);
      cr_assert(strstr(r.err, in) != NULL &&
                    strstr(r.err, "byte offset") != NULL,
                "%s: %s", in, r.err);
      cr_assert_neq(access(out, F_OK), 0, "%s written for a damaged file",
                    out);
      damaged++;
    } else {
      cr_assert_eq(r.status, 0, "%s: exit %d: %s", in, r.status, r.err);
      opt_seen_t seen = compare_optimized(in, out);
      rewritten += seen.rewritten;
      copied += seen.copied;
      files++;
    }
    printf("ctl: optimize_testdata: %s", r.out[0] ? r.out : r.err);
    run_free(&r);
  }
  closedir(d);
  cr_assert_geq(files, 8, "only %zu files optimized", files);
  cr_assert_geq(damaged, 1);
  cr_assert_gt(rewritten, 100, "only %zu JPEGs rewritten", rewritten);
  printf("ctl: optimize_testdata: %zu files (%zu damaged), %zu JPEGs "
         "rewritten, %zu copied\n", files + damaged, damaged, rewritten,
         copied);
}

/* ---- the cluster commands' address and reachability errors ------------- */

/* --dispatcher 127.0.0.2 dialed port 0, :99999 dialed 34463 and '' printed
 * gRPC internals: each is a usage error (exit 2) that says what to write,
 * before anything is dialed. */
Test(ctl, bad_dispatcher_addresses_are_usage_errors, .init = setup_tmp,
     .fini = teardown_tmp) {
  struct {
    const char *cmd, *addr, *says;
  } cases[] = {
      {"status", "127.0.0.2", "has no port: give HOST:PORT, e.g. "
                              "127.0.0.2:5050"},
      {"status", "127.0.0.1:99999", "port 99999 is out of range: give a "
                                    "port from 1 to 65535"},
      {"workers", "", "empty address: give HOST:PORT"},
      {"jobs", "::1:5050", "[::1]:5050"},
      {"watch", "http://127.0.0.1:5050", "without a scheme"},
      {"drain", "127.0.0.1:", "empty port"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    run_t r = strcmp(cases[i].cmd, "drain") == 0
                  ? run_ctl("drain", "1", "--dispatcher", cases[i].addr,
                            NULL)
                  : run_ctl(cases[i].cmd, "--dispatcher", cases[i].addr,
                            NULL);
    cr_assert_eq(r.status, 2, "%s --dispatcher '%s': exit %d: %s",
                 cases[i].cmd, cases[i].addr, r.status, r.err);
    cr_assert(strstr(r.err, "--dispatcher") != NULL &&
                  strstr(r.err, cases[i].says) != NULL,
              "%s --dispatcher '%s': no '%s' in: %s", cases[i].cmd,
              cases[i].addr, cases[i].says, r.err);
    cr_assert(strstr(r.err, "grpc") == NULL && strstr(r.err, "GRPC") == NULL,
              "gRPC internals: %s", r.err);
    run_free(&r);
  }
}

/* An unresolvable host read "Deadline Exceeded": it names the host and
 * says it does not resolve (exit 3). .invalid never resolves (RFC 6761). */
Test(ctl, unresolvable_host_is_named, .init = setup_tmp,
     .fini = teardown_tmp) {
  run_t r = run_ctl("status", "--dispatcher", "no-such-host.invalid:5050",
                    NULL);
  cr_assert_eq(r.status, 3, "exit %d: %s", r.status, r.err);
  cr_assert(strstr(r.err, "cannot resolve host 'no-such-host.invalid'") !=
                NULL, "%s", r.err);
  cr_assert(strstr(r.err, "Deadline Exceeded") == NULL, "%s", r.err);
  run_free(&r);
}

/* Nothing listening: said so, with what to check (exit 3). */
Test(ctl, nothing_listening_is_named, .init = setup_tmp,
     .fini = teardown_tmp) {
  run_t r = run_ctl("jobs", "--dispatcher", "127.0.0.1:1", NULL);
  cr_assert_eq(r.status, 3, "exit %d: %s", r.status, r.err);
  cr_assert(strstr(r.err, "nothing listens on 127.0.0.1:1") != NULL, "%s",
            r.err);
  run_free(&r);
}

/* ---- files that are not TFRecord files --------------------------------- */

/* A JPEG, a text file and a gzip file read as plain TFRecords failed with
 * a bare "record length CRC mismatch": the first record's failure asks
 * whether it is a TFRecord file and names the kind its first bytes look
 * like, never the bytes. */
Test(ctl, inspect_hints_at_files_that_are_not_tfrecords, .init = setup_tmp,
     .fini = teardown_tmp) {
  static const uint8_t jpeg[] = {0xff, 0xd8, 0xff, 0xe0, 0x00, 0x10, 'J',
                                 'F',  'I',  'F',  0x00, 0x01, 0x01, 0x00};
  static const char text[] = "label,path\n1,secret-name.jpg\n";
  static const uint8_t gz[] = {0x1f, 0x8b, 0x08, 0x00, 0x00, 0x00, 0x00,
                               0x00, 0x00, 0x03, 0x03, 0x00, 0x00, 0x00,
                               0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
  struct {
    const char *name;
    const void *data;
    size_t len;
    const char *kind;
    const char *args[3];
  } cases[] = {
      {"photo.jpg", jpeg, sizeof(jpeg), "look like a JPEG image", {NULL}},
      {"labels.csv", text, sizeof(text) - 1, "look like text", {NULL}},
      {"data.gz", gz, sizeof(gz), "look like gzip data",
       {"--compression", "none", NULL}},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    char path[600];
    path_in(path, sizeof(path), cases[i].name);
    write_file(path, cases[i].data, cases[i].len);
    run_t r = cases[i].args[0] != NULL
                  ? run_ctl("records", "inspect", cases[i].args[0],
                            cases[i].args[1], path, NULL)
                  : run_ctl("records", "inspect", path, NULL);
    cr_assert_eq(r.status, 1, "%s: exit %d: %s%s", cases[i].name, r.status,
                 r.out, r.err);
    cr_assert(strstr(r.out, "is this a TFRecord file?") != NULL &&
                  strstr(r.out, cases[i].kind) != NULL &&
                  strstr(r.out, path) != NULL,
              "%s: no hint naming the file and '%s':\n%s", cases[i].name,
              cases[i].kind, r.out);
    cr_assert(strstr(r.out, "JFIF") == NULL &&
                  strstr(r.out, "secret-name") == NULL &&
                  strstr(r.out, "label,") == NULL,
              "%s: file bytes quoted:\n%s", cases[i].name, r.out);
    run_free(&r);
  }
}
