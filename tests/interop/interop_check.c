/* interop_check: Ferry's side of the TensorFlow interop tests.
 *
 *   interop_check read-expected DIR   reads the TFRecords tf_write.py wrote
 *       in DIR with Ferry's reader and Example parser and compares every
 *       record and feature value with DIR/expected.txt.
 *   interop_check write DIR           writes TFRecords with Ferry's writer
 *       (uncompressed, GZIP, ZLIB) and DIR/manifest.txt for tf_read.py.
 *   interop_check ops DIR             runs Ferry's dilate, blur and JPEG
 *       decoder on the inputs tf_ops_ref.py wrote and compares with
 *       TensorFlow's outputs, for each SIMD level the CPU has.
 *
 * Prints one line per check ("ok   ..." / "FAIL ...", "skip ..." for what
 * cannot run here), then "interop: N passed, M failed"; exits 1 on any
 * failure, 2 on usage or I/O errors of the test itself.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "example.h"
#include "ferry/error.h"
#include "imgops.h"
#include "tfrecord.h"

/* JPEG tolerance against tf.io.decode_jpeg. TensorFlow links its own
 * libjpeg-turbo, Ferry the system's; both run the same IFAST IDCT and
 * fancy upsampling, which are integer code, so the same inputs give the
 * same pixels and the bound is 0. Override with FERRY_INTEROP_JPEG_TOL if
 * a platform's libjpeg-turbo ever differs, and say why. */
#define JPEG_TOL_DEFAULT 0

/* The blur bound of OPS.md: a separable float32 sum in another order than
 * TensorFlow's 2-D depthwise convolution, truncated to uint8. */
#define BLUR_TOL 1

static int n_pass, n_fail, n_skip;

static void check(bool ok, const char *fmt, ...) FERRY_PRINTF(2, 3);
static void check(bool ok, const char *fmt, ...) {
  va_list ap;
  fputs(ok ? "ok   " : "FAIL ", stdout);
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  putchar('\n');
  if (ok)
    n_pass++;
  else
    n_fail++;
}

static void skip(const char *fmt, ...) FERRY_PRINTF(1, 2);
static void skip(const char *fmt, ...) {
  va_list ap;
  fputs("skip ", stdout);
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  putchar('\n');
  n_skip++;
}

static void die(const char *fmt, ...) FERRY_PRINTF(1, 2);
static void die(const char *fmt, ...) {
  va_list ap;
  fputs("interop_check: ", stderr);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  exit(2);
}

static void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p)
    die("out of memory (%zu bytes)", n);
  return p;
}

/* ---- SHA-256 (FIPS 180-4), to compare records with Python's hashlib. */

typedef struct {
  uint32_t h[8];
  uint64_t len;
  uint8_t buf[64];
  size_t nbuf;
} sha256_t;

static const uint32_t sha_k[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1,
    0x923f82a4, 0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3,
    0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786,
    0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147,
    0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13,
    0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
    0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a,
    0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208,
    0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

static uint32_t ror(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

static void sha_block(sha256_t *s, const uint8_t *p) {
  uint32_t w[64], v[8];
  for (int i = 0; i < 16; i++)
    w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 |
           (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
  for (int i = 16; i < 64; i++) {
    uint32_t s0 = ror(w[i - 15], 7) ^ ror(w[i - 15], 18) ^ (w[i - 15] >> 3);
    uint32_t s1 = ror(w[i - 2], 17) ^ ror(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  memcpy(v, s->h, sizeof v);
  for (int i = 0; i < 64; i++) {
    uint32_t s1 = ror(v[4], 6) ^ ror(v[4], 11) ^ ror(v[4], 25);
    uint32_t ch = (v[4] & v[5]) ^ (~v[4] & v[6]);
    uint32_t t1 = v[7] + s1 + ch + sha_k[i] + w[i];
    uint32_t s0 = ror(v[0], 2) ^ ror(v[0], 13) ^ ror(v[0], 22);
    uint32_t maj = (v[0] & v[1]) ^ (v[0] & v[2]) ^ (v[1] & v[2]);
    memmove(v + 1, v, 7 * sizeof v[0]);
    v[4] += t1;
    v[0] = t1 + s0 + maj;
  }
  for (int i = 0; i < 8; i++)
    s->h[i] += v[i];
}

static void sha_init(sha256_t *s) {
  static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372,
                                 0xa54ff53a, 0x510e527f, 0x9b05688c,
                                 0x1f83d9ab, 0x5be0cd19};
  memcpy(s->h, h0, sizeof h0);
  s->len = 0;
  s->nbuf = 0;
}

static void sha_update(sha256_t *s, const uint8_t *p, size_t n) {
  s->len += n;
  while (n > 0) {
    if (s->nbuf == 0 && n >= 64) {
      sha_block(s, p);
      p += 64;
      n -= 64;
      continue;
    }
    size_t k = 64 - s->nbuf < n ? 64 - s->nbuf : n;
    memcpy(s->buf + s->nbuf, p, k);
    s->nbuf += k;
    p += k;
    n -= k;
    if (s->nbuf == 64) {
      sha_block(s, s->buf);
      s->nbuf = 0;
    }
  }
}

/* Writes the digest of `n` bytes at `p` as 64 hex digits and a NUL. */
static void sha256_hex(const void *p, size_t n, char out[65]) {
  sha256_t s;
  uint8_t pad[72] = {0x80};
  sha_init(&s);
  sha_update(&s, p, n);
  uint64_t bits = s.len * 8;
  size_t padlen = (s.nbuf < 56 ? 56 : 120) - s.nbuf;
  for (int i = 0; i < 8; i++)
    pad[padlen + i] = (uint8_t)(bits >> (56 - 8 * i));
  sha_update(&s, pad, padlen + 8);
  for (int i = 0; i < 8; i++)
    sprintf(out + 8 * i, "%08x", s.h[i]);
}

/* ---- Small helpers. */

/* Reads a whole file into a malloc'ed buffer; NULL when it cannot. */
static uint8_t *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return NULL;
  size_t cap = 1 << 16, n = 0;
  uint8_t *buf = xmalloc(cap);
  for (;;) {
    if (n == cap) {
      cap *= 2;
      uint8_t *nb = realloc(buf, cap);
      if (!nb)
        die("out of memory reading %s", path);
      buf = nb;
    }
    size_t k = fread(buf + n, 1, cap - n, f);
    if (k == 0)
      break;
    n += k;
  }
  bool bad = ferror(f);
  fclose(f);
  if (bad) {
    free(buf);
    return NULL;
  }
  *len = n;
  return buf;
}

static uint8_t *slurp_exact(const char *path, size_t want) {
  size_t len = 0;
  uint8_t *p = slurp(path, &len);
  if (!p)
    die("cannot read %s", path);
  if (len != want)
    die("%s has %zu bytes, want %zu", path, len, want);
  return p;
}

static int hexval(int c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

/* Decodes hex into `out` (capacity `cap`); returns the length or -1. */
static long unhex(const char *s, uint8_t *out, size_t cap) {
  size_t n = strlen(s);
  if (n % 2 || n / 2 > cap)
    return -1;
  for (size_t i = 0; i < n / 2; i++) {
    int hi = hexval(s[2 * i]), lo = hexval(s[2 * i + 1]);
    if (hi < 0 || lo < 0)
      return -1;
    out[i] = (uint8_t)(hi << 4 | lo);
  }
  return (long)(n / 2);
}

/* Splits `line` in place at blanks into at most `max` tokens. */
static int tokenize(char *line, char **tok, int max) {
  int n = 0;
  char *save = NULL;
  for (char *t = strtok_r(line, " \t\r\n", &save); t && n < max;
       t = strtok_r(NULL, " \t\r\n", &save))
    tok[n++] = t;
  return n;
}

/* ---- read-expected. */

/* Compares one "feat KEYHEX KIND COUNT VALUE..." line (tokens in `tok`)
 * with the parsed example; on mismatch writes why into `why`. */
static bool feat_matches(const ferry_example_t *ex, char **tok, int ntok,
                         char *why, size_t whylen) {
  uint8_t key[256];
  char keyz[257];
  long klen = unhex(tok[1], key, sizeof key);
  if (klen < 0)
    die("expected.txt: bad key %s", tok[1]);
  memcpy(keyz, key, (size_t)klen);
  keyz[klen] = 0;
  const ferry_feature_t *f = ferry__example_find(ex, keyz);
  if (!f) {
    snprintf(why, whylen, "feature '%s' not found", keyz);
    return false;
  }
  const char *kind = tok[2];
  size_t count = strtoull(tok[3], NULL, 10);
  if ((size_t)ntok != 4 + count)
    die("expected.txt: feature %s has %d values, says %zu", keyz, ntok - 4,
        count);
  ferry_feature_kind_t want_kind =
      !strcmp(kind, "bytes")   ? FERRY_FEATURE_BYTES
      : !strcmp(kind, "int64") ? FERRY_FEATURE_INT64
      : !strcmp(kind, "float") ? FERRY_FEATURE_FLOAT
                               : FERRY_FEATURE_NONE;
  if (f->kind != want_kind) {
    snprintf(why, whylen, "feature '%s' kind %s, want %s", keyz,
             ferry__feature_kind_name(f->kind), kind);
    return false;
  }
  if (f->count != count) {
    snprintf(why, whylen, "feature '%s' has %zu values, want %zu", keyz,
             f->count, count);
    return false;
  }
  if (want_kind == FERRY_FEATURE_BYTES) {
    for (size_t i = 0; i < count; i++) {
      const uint8_t *d;
      size_t dl;
      int rc = ferry__feature_bytes(f, i, &d, &dl);
      if (rc < 0) {
        snprintf(why, whylen, "feature '%s' value %zu: %s", keyz, i,
                 ferry_err_name(rc));
        return false;
      }
      const char *v = tok[4 + i];
      bool same;
      if (!strcmp(v, "-")) {
        same = dl == 0;
      } else if (v[0] == '#') {
        char hex[65];
        size_t wl = strtoull(v + 1, NULL, 10);
        const char *h = strchr(v, ':');
        sha256_hex(d, dl, hex);
        same = h && wl == dl && !strcmp(h + 1, hex);
      } else {
        uint8_t buf[64];
        long wl = unhex(v, buf, sizeof buf);
        same = wl >= 0 && (size_t)wl == dl && !memcmp(buf, d, dl);
      }
      if (!same) {
        snprintf(why, whylen, "feature '%s' bytes value %zu differs (%zu "
                 "bytes)", keyz, i, dl);
        return false;
      }
    }
  } else if (want_kind == FERRY_FEATURE_INT64) {
    int64_t *v = xmalloc((count + 1) * sizeof *v);
    size_t n = 0;
    int rc = ferry__feature_int64s(f, v, count, &n);
    bool ok = rc == 0 && n == count;
    for (size_t i = 0; ok && i < count; i++) {
      int64_t want = strtoll(tok[4 + i], NULL, 10);
      if (v[i] != want) {
        snprintf(why, whylen, "feature '%s' int64 value %zu: %" PRId64
                 ", want %" PRId64, keyz, i, v[i], want);
        ok = false;
      }
    }
    if (!ok && (rc != 0 || n != count))
      snprintf(why, whylen, "feature '%s' int64s: rc %s, n %zu", keyz,
               ferry_err_name(rc), n);
    free(v);
    return ok;
  } else if (want_kind == FERRY_FEATURE_FLOAT) {
    float *v = xmalloc((count + 1) * sizeof *v);
    size_t n = 0;
    int rc = ferry__feature_floats(f, v, count, &n);
    bool ok = rc == 0 && n == count;
    for (size_t i = 0; ok && i < count; i++) {
      uint32_t bits, want = (uint32_t)strtoul(tok[4 + i], NULL, 16);
      memcpy(&bits, &v[i], 4);
      if (bits != want) {
        snprintf(why, whylen, "feature '%s' float value %zu: bits %08x, "
                 "want %08x", keyz, i, bits, want);
        ok = false;
      }
    }
    if (!ok && (rc != 0 || n != count))
      snprintf(why, whylen, "feature '%s' floats: rc %s, n %zu", keyz,
               ferry_err_name(rc), n);
    free(v);
    return ok;
  }
  return true;
}

typedef struct {
  char name[256];
  char comp[16];
  size_t nrec;
  bool example;
  char **lines; /* the rec/feat lines of this file */
  size_t nlines, cap;
} exp_file_t;

/* Reads one file with the given compression and checks it against its
 * expectation; prints one check line. */
static void check_file(const char *dir, const exp_file_t *ef,
                       ferry_compression_t comp) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, ef->name);
  ferry_tfr_options_t opts;
  ferry__tfr_options_init(&opts);
  opts.compression = comp;
  ferry_error_t err = {0};
  ferry_tfr_reader_t *r = NULL;
  ferry_example_t ex;
  ferry__example_init(&ex);
  char why[1024] = "";
  char *tok[4096 + 8];
  size_t li = 0, nrec = 0;
  int rc = ferry__tfr_reader_open(path, &opts, &r, &err);
  if (rc < 0) {
    snprintf(why, sizeof why, "open: %s: %s", ferry_err_name(rc), err.msg);
    goto out;
  }
  for (;;) {
    ferry_record_t rec;
    rc = ferry__tfr_reader_next(r, &rec, &err);
    if (rc == FERRY_EOF)
      break;
    if (rc < 0) {
      snprintf(why, sizeof why, "record %zu: %s: %s", nrec,
               ferry_err_name(rc), err.msg);
      goto out;
    }
    if (li >= ef->nlines) {
      snprintf(why, sizeof why, "extra record %zu (%zu bytes)", nrec,
               rec.len);
      goto out;
    }
    char *line = strdup(ef->lines[li++]);
    int nt = tokenize(line, tok, 8);
    if (nt != 4 || strcmp(tok[0], "rec"))
      die("expected.txt: bad rec line in %s", ef->name);
    size_t want_len = strtoull(tok[2], NULL, 10);
    char hex[65];
    sha256_hex(rec.data, rec.len, hex);
    if (rec.len != want_len || strcmp(hex, tok[3]) || rec.index != nrec) {
      snprintf(why, sizeof why, "record %zu (offset %" PRIu64 ", index %"
               PRIu64 "): %zu bytes, want %zu%s", nrec, rec.offset,
               rec.index, rec.len, want_len,
               strcmp(hex, tok[3]) ? ", content differs" : "");
      free(line);
      goto out;
    }
    free(line);
    if (ef->example) {
      size_t nfeat = 0;
      rc = ferry__example_parse(&ex, rec.data, rec.len, &err);
      if (rc < 0) {
        snprintf(why, sizeof why, "record %zu: Example parse: %s: %s", nrec,
                 ferry_err_name(rc), err.msg);
        goto out;
      }
      while (li < ef->nlines && !strncmp(ef->lines[li], "feat ", 5)) {
        line = strdup(ef->lines[li++]);
        nt = tokenize(line, tok, (int)(sizeof tok / sizeof tok[0]));
        char fwhy[512];
        bool ok = nt >= 4 && feat_matches(&ex, tok, nt, fwhy, sizeof fwhy);
        free(line);
        if (!ok) {
          snprintf(why, sizeof why, "record %zu: %s", nrec, fwhy);
          goto out;
        }
        nfeat++;
      }
      if (ex.n != nfeat) {
        snprintf(why, sizeof why, "record %zu: %zu features, want %zu", nrec,
                 ex.n, nfeat);
        goto out;
      }
    }
    nrec++;
  }
  if (nrec != ef->nrec)
    snprintf(why, sizeof why, "%zu records, want %zu", nrec, ef->nrec);
out:
  check(why[0] == 0, "ferry reads %s (%s as %s): %zu records%s%s%s", ef->name,
        ef->comp, ferry__compression_name(comp), nrec,
        ef->example ? ", Examples parsed" : "", why[0] ? ": " : "", why);
  ferry__example_close(&ex);
  if (r)
    ferry__tfr_reader_free(r);
}

static int cmd_read_expected(const char *dir) {
  char path[4096];
  snprintf(path, sizeof path, "%s/expected.txt", dir);
  FILE *f = fopen(path, "r");
  if (!f)
    die("cannot open %s", path);
  exp_file_t *files = NULL;
  size_t nfiles = 0;
  char *line = NULL;
  size_t cap = 0;
  while (getline(&line, &cap, f) > 0) {
    if (!strncmp(line, "file ", 5)) {
      files = realloc(files, (nfiles + 1) * sizeof *files);
      if (!files)
        die("out of memory");
      exp_file_t *ef = &files[nfiles++];
      memset(ef, 0, sizeof *ef);
      char kind[16];
      if (sscanf(line, "file %255s %15s %zu %15s", ef->name, ef->comp,
                 &ef->nrec, kind) != 4)
        die("expected.txt: bad line: %s", line);
      ef->example = !strcmp(kind, "example");
    } else if (nfiles > 0) {
      exp_file_t *ef = &files[nfiles - 1];
      if (ef->nlines == ef->cap) {
        ef->cap = ef->cap ? 2 * ef->cap : 64;
        ef->lines = realloc(ef->lines, ef->cap * sizeof *ef->lines);
        if (!ef->lines)
          die("out of memory");
      }
      ef->lines[ef->nlines++] = strdup(line);
    }
  }
  free(line);
  fclose(f);
  if (nfiles == 0)
    die("%s lists no files", path);
  for (size_t i = 0; i < nfiles; i++) {
    exp_file_t *ef = &files[i];
    /* AUTO detection is what users get by default; the explicit setting
     * checks that path too. */
    check_file(dir, ef, FERRY_COMPRESSION_AUTO);
    check_file(dir, ef,
               (ferry_compression_t)ferry__compression_parse(ef->comp));
    for (size_t j = 0; j < ef->nlines; j++)
      free(ef->lines[j]);
    free(ef->lines);
  }
  free(files);
  return 0;
}

/* ---- write. */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng_next(void) {
  /* xorshift64*: deterministic content, no libc rand() state. */
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return rng_state * 0x2545f4914f6cdd1dull;
}

static int cmd_write(const char *dir) {
  static const size_t sizes[] = {0,     1,     5,      127,     128,
                                 4096,  65535, 65536,  65537,   1000,
                                 0,     3,     300001, 1u << 20, 777};
  static const char *comps[] = {"none", "gzip", "zlib"};
  size_t nsizes = sizeof sizes / sizeof sizes[0];
  char path[4096];
  if (mkdir(dir, 0777) < 0 && errno != EEXIST)
    die("cannot create %s: %s", dir, strerror(errno));
  snprintf(path, sizeof path, "%s/manifest.txt", dir);
  FILE *man = fopen(path, "w");
  if (!man)
    die("cannot create %s", path);
  uint8_t *buf = xmalloc(1u << 20);
  for (int c = 0; c < 3; c++) {
    for (int empty = 0; empty < 2; empty++) {
      char name[64];
      snprintf(name, sizeof name, "ferry_%s_%s.tfrecord",
               empty ? "empty" : "raw", comps[c]);
      snprintf(path, sizeof path, "%s/%s", dir, name);
      ferry_error_t err = {0};
      ferry_tfr_writer_t *w = NULL;
      size_t n = empty ? 0 : nsizes;
      int rc = ferry__tfr_writer_open(
          path, (ferry_compression_t)ferry__compression_parse(comps[c]), &w,
          &err);
      char why[700] = "";
      if (rc < 0) {
        snprintf(why, sizeof why, "open: %s: %s", ferry_err_name(rc),
                 err.msg);
      } else {
        fprintf(man, "file %s %s %zu raw\n", name, comps[c], n);
        rng_state = 0x9e3779b97f4a7c15ull + (uint64_t)c;
        for (size_t i = 0; i < n && rc == 0; i++) {
          for (size_t j = 0; j < sizes[i]; j++)
            buf[j] = (uint8_t)(rng_next() >> 56);
          char hex[65];
          sha256_hex(buf, sizes[i], hex);
          fprintf(man, "rec %zu %zu %s\n", i, sizes[i], hex);
          rc = ferry__tfr_writer_write(w, buf, sizes[i], &err);
          if (rc < 0)
            snprintf(why, sizeof why, "write %zu: %s: %s", i,
                     ferry_err_name(rc), err.msg);
        }
        int crc = ferry__tfr_writer_close(w, &err);
        if (crc < 0 && !why[0])
          snprintf(why, sizeof why, "close: %s: %s", ferry_err_name(crc),
                   err.msg);
      }
      check(why[0] == 0, "ferry writes %s (%s, %zu records)%s%s", name,
            comps[c], n, why[0] ? ": " : "", why);
    }
  }
  free(buf);
  if (fclose(man) != 0)
    die("cannot write %s/manifest.txt", dir);
  return 0;
}

/* ---- ops. */

typedef struct {
  int maxdiff;
  size_t ndiff, n;
  size_t nhigh; /* values where Ferry's output is above TensorFlow's */
} diff_t;

/* Compares Ferry's output `a` with TensorFlow's `b`. */
static diff_t compare(const uint8_t *a, const uint8_t *b, size_t n) {
  diff_t d = {0, 0, n, 0};
  for (size_t i = 0; i < n; i++) {
    int x = abs((int)a[i] - (int)b[i]);
    if (x) {
      d.ndiff++;
      d.nhigh += a[i] > b[i];
      if (x > d.maxdiff)
        d.maxdiff = x;
    }
  }
  return d;
}

static void diff_add(diff_t *tot, const diff_t *d) {
  tot->ndiff += d->ndiff;
  tot->n += d->n;
  tot->nhigh += d->nhigh;
  if (d->maxdiff > tot->maxdiff)
    tot->maxdiff = d->maxdiff;
}

typedef struct {
  char name[128];
  int h, w, c;
  char jpeg[4096]; /* path of the JPEG; empty for img lines */
} op_case_t;

static void ops_images(const char *dir, const op_case_t *cases, size_t n) {
  static const char *isas[] = {"avx512", "avx2", "scalar"};
  char path[4200];
  /* Highest level first: ferry__imgops_set_isa only promises lowering. */
  for (int k = 0; k < 3; k++) {
    int rc = ferry__imgops_set_isa(isas[k]);
    if (rc < 0) {
      skip("dilate/blur [%s]: %s (the CPU lacks it)", isas[k],
           ferry_err_name(rc));
      continue;
    }
    ferry_blur_t *blur = NULL;
    ferry_error_t err = {0};
    rc = ferry__blur_new(11, 0.8f, &blur, &err);
    if (rc < 0) {
      check(false, "blur [%s]: ferry__blur_new(11, 0.8): %s: %s", isas[k],
            ferry_err_name(rc), err.msg);
      continue;
    }
    diff_t btot = {0, 0, 0, 0};
    for (size_t i = 0; i < n; i++) {
      const op_case_t *oc = &cases[i];
      if (oc->jpeg[0])
        continue;
      size_t sz = (size_t)oc->h * oc->w * oc->c;
      snprintf(path, sizeof path, "%s/%s.in", dir, oc->name);
      uint8_t *in = slurp_exact(path, sz);
      snprintf(path, sizeof path, "%s/%s.dilate", dir, oc->name);
      uint8_t *dref = slurp_exact(path, sz);
      snprintf(path, sizeof path, "%s/%s.blur", dir, oc->name);
      uint8_t *bref = slurp_exact(path, sz);
      uint8_t *out = xmalloc(sz);

      memset(out, 0xa5, sz);
      ferry__dilate3x3(in, out, oc->h, oc->w, oc->c);
      diff_t d = compare(out, dref, sz);
      check(d.ndiff == 0, "dilate [%s] %s (%dx%dx%d) equals "
            "tf.nn.dilation2d: %zu of %zu values differ, max diff %d",
            isas[k], oc->name, oc->h, oc->w, oc->c, d.ndiff, d.n,
            d.maxdiff);

      memset(out, 0xa5, sz);
      rc = ferry__blur_apply(blur, in, out, oc->h, oc->w, oc->c, &err);
      if (rc < 0) {
        check(false, "blur [%s] %s: %s: %s", isas[k], oc->name,
              ferry_err_name(rc), err.msg);
      } else {
        d = compare(out, bref, sz);
        check(d.maxdiff <= BLUR_TOL, "blur(11, 0.8) [%s] %s (%dx%dx%d) vs "
              "tfa gaussian_filter2d: max diff %d (bound %d), %.3f%% of "
              "values differ (%zu above, %zu below)", isas[k], oc->name,
              oc->h, oc->w, oc->c, d.maxdiff, BLUR_TOL,
              100.0 * (double)d.ndiff / (double)d.n, d.nhigh,
              d.ndiff - d.nhigh);
        diff_add(&btot, &d);
      }
      free(in);
      free(dref);
      free(bref);
      free(out);
    }
    printf("info blur [%s] over all images: max diff %d, %zu of %zu "
           "values (%.3f%%) differ, %zu of them above TensorFlow's\n",
           isas[k], btot.maxdiff, btot.ndiff, btot.n,
           btot.n ? 100.0 * (double)btot.ndiff / (double)btot.n : 0.0,
           btot.nhigh);
    ferry__blur_free(blur);
  }
}

static void ops_jpeg(const char *dir, const op_case_t *cases, size_t n) {
  int tol = JPEG_TOL_DEFAULT;
  const char *env = getenv("FERRY_INTEROP_JPEG_TOL");
  if (env && *env)
    tol = atoi(env);
  ferry_jpeg_t *j = NULL;
  ferry_error_t err = {0};
  int rc = ferry__jpeg_new(&j, &err);
  if (rc < 0) {
    check(false, "jpeg: ferry__jpeg_new: %s: %s", ferry_err_name(rc), err.msg);
    return;
  }
  diff_t tot = {0, 0, 0, 0};
  char path[4200];
  for (size_t i = 0; i < n; i++) {
    const op_case_t *oc = &cases[i];
    if (!oc->jpeg[0])
      continue;
    size_t len = 0, sz = (size_t)oc->h * oc->w * 3;
    uint8_t *src = slurp(oc->jpeg, &len);
    if (!src)
      die("cannot read %s", oc->jpeg);
    snprintf(path, sizeof path, "%s/%s.jpegout", dir, oc->name);
    uint8_t *ref = slurp_exact(path, sz);
    uint8_t *out = xmalloc(sz);
    int h = 0, w = 0;
    rc = ferry__jpeg_decode(j, src, len, out, sz, &h, &w, &err);
    if (rc < 0) {
      check(false, "jpeg %s (%dx%d): Ferry fails where TensorFlow decodes: "
            "%s: %s", oc->name, oc->h, oc->w, ferry_err_name(rc), err.msg);
    } else if (h != oc->h || w != oc->w) {
      check(false, "jpeg %s: Ferry decodes %dx%d, TensorFlow %dx%d",
            oc->name, h, w, oc->h, oc->w);
    } else {
      diff_t d = compare(out, ref, sz);
      check(d.maxdiff <= tol, "jpeg %s (%dx%d) vs tf.io.decode_jpeg: max "
            "diff %d (bound %d), %.3f%% of values differ", oc->name, h, w,
            d.maxdiff, tol, 100.0 * (double)d.ndiff / (double)d.n);
      diff_add(&tot, &d);
    }
    free(src);
    free(ref);
    free(out);
  }
  printf("info jpeg over all decoded images: max diff %d, %zu of %zu values "
         "(%.3f%%) differ\n", tot.maxdiff, tot.ndiff, tot.n,
         tot.n ? 100.0 * (double)tot.ndiff / (double)tot.n : 0.0);
  ferry__jpeg_free(j);
}

static int cmd_ops(const char *dir) {
  char path[4096];
  snprintf(path, sizeof path, "%s/manifest.txt", dir);
  FILE *f = fopen(path, "r");
  if (!f)
    die("cannot open %s", path);
  op_case_t *cases = NULL;
  size_t n = 0;
  char *line = NULL;
  size_t cap = 0;
  while (getline(&line, &cap, f) > 0) {
    op_case_t oc;
    memset(&oc, 0, sizeof oc);
    if (sscanf(line, "img %127s %d %d %d", oc.name, &oc.h, &oc.w, &oc.c) ==
        4) {
      /* ok */
    } else if (sscanf(line, "jpeg %127s %d %d %4095s", oc.name, &oc.h,
                      &oc.w, oc.jpeg) == 4) {
      oc.c = 3;
    } else {
      continue;
    }
    if (oc.h <= 0 || oc.w <= 0 || oc.c <= 0)
      die("%s: bad shape in: %s", path, line);
    cases = realloc(cases, (n + 1) * sizeof *cases);
    if (!cases)
      die("out of memory");
    cases[n++] = oc;
  }
  free(line);
  fclose(f);
  if (n == 0)
    die("%s lists no cases", path);
  printf("info imgops ISA before forcing: %s\n", ferry__imgops_isa());
  ops_images(dir, cases, n);
  ops_jpeg(dir, cases, n);
  free(cases);
  return 0;
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s read-expected|write|ops DIR\n", argv[0]);
    return 2;
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (!strcmp(argv[1], "read-expected"))
    cmd_read_expected(argv[2]);
  else if (!strcmp(argv[1], "write"))
    cmd_write(argv[2]);
  else if (!strcmp(argv[1], "ops"))
    cmd_ops(argv[2]);
  else
    die("unknown subcommand '%s'", argv[1]);
  if (n_skip)
    printf("info %d checks skipped (see the 'skip' lines)\n", n_skip);
  printf("interop: %d passed, %d failed\n", n_pass, n_fail);
  return n_fail ? 1 : 0;
}
