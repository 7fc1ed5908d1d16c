/* ferryctl records inspect|index|optimize: look inside TFRecord files,
 * write DALI-compatible index files, and rewrite the JPEGs inside them
 * with restart intervals for cropped decodes.
 *
 * inspect reads each file with the reader's SKIP policy, so that one bad
 * record does not hide the next, and lists every bad record the reader
 * reports through its on_skip callback.
 *
 * optimize reads each file with the FAIL policy, copies its records a
 * batch at a time, rewrites the batch's JPEGs on a pool of threads
 * (ferry__example_rewrite_bytes, ferry__jpeg_optimize) and writes the
 * batch in the input's order.
 */
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "alloc.h"
#include "ctl.h"
#include "example.h"
#include "imgops.h"
#include "jpeg_restart.h"
#include "options.h"
#include "tfrecord.h"

#define MAX_KEYS 4096       /* distinct keys tracked per file */
#define MAX_ERRORS 100000   /* error entries kept per file and kind */
#define SHOW_NUMBERS 8      /* numbers shown per feature */
#define SHOW_BYTES 3        /* bytes values shown per feature */
#define TEXT_PREFIX 40      /* printable prefix of a bytes value */
#define HEX_PREFIX 16       /* hex prefix of a binary bytes value */
#define JSON_SCHEMA 1       /* "schema" of the --json documents */

static const char records_usage[] =
    "usage: ferryctl records inspect FILE... [options]\n"
    "       ferryctl records index FILE... [--out-dir DIR]\n"
    "       ferryctl records optimize IN... OUT [options]\n"
    "\n"
    "Run 'ferryctl records COMMAND --help' (inspect, index, optimize).\n";

/* ---- inspect ---------------------------------------------------------- */

typedef struct inspect_opts_s {
  bool json;
  int compression; /* index into "auto|none|gzip|zlib" */
  uint64_t max_record_bytes;
  int64_t show;
  bool help;
} inspect_opts_t;

static const ferry_option_t inspect_table[] = {
    {"json", FERRY_OPT_BOOL, offsetof(inspect_opts_t, json), "false", 0, 0,
     NULL, "print JSON instead of text: one document per file, one per "
     "line, each with \"schema\": 1"},
    {"compression", FERRY_OPT_ENUM, offsetof(inspect_opts_t, compression),
     "auto", 0, 0, "auto|none|gzip|zlib",
     "the files' compression; auto detects it from the first bytes"},
    {"max-record-bytes", FERRY_OPT_SIZE,
     offsetof(inspect_opts_t, max_record_bytes), "256M", 1,
     (double)(1ull << 40), NULL,
     "records longer than this are reported as bad (ETOOLONG)"},
    {"show", FERRY_OPT_INT, offsetof(inspect_opts_t, show), "1", 0, 1000,
     NULL, "print the features and first values of the first N records"},
    {"help", FERRY_OPT_BOOL, offsetof(inspect_opts_t, help), "false", 0, 0,
     NULL, "print this help"},
};
#define INSPECT_N (sizeof(inspect_table) / sizeof(inspect_table[0]))

static const char inspect_usage[] =
    "usage: ferryctl records inspect FILE... [options]\n"
    "\n"
    "Reads every record of each TFRecord file (plain, GZIP or ZLIB) and\n"
    "reports the compression, the record count and data bytes, every bad\n"
    "record (CRC mismatch, truncation, absurd length) with its byte offset\n"
    "in the uncompressed stream, every record that is not a valid\n"
    "tf.train.Example, the feature keys seen across all records with their\n"
    "types and value counts, and the first records' values.\n";

static const char inspect_footer[] =
    "\nExit status: 0 when every file is clean, 1 when a bad record or a\n"
    "malformed Example was found, 2 on usage errors or unreadable files.\n";

static const ferry_compression_t compression_of_choice[] = {
    FERRY_COMPRESSION_AUTO, FERRY_COMPRESSION_NONE, FERRY_COMPRESSION_GZIP,
    FERRY_COMPRESSION_ZLIB};

/* One bad record or one malformed Example. */
typedef struct problem_s {
  uint64_t offset; /* byte offset of the record */
  uint64_t index;  /* record slot number */
  int code;
  char *msg;
} problem_t;

typedef struct problems_s {
  problem_t *v;
  size_t n, cap;
  uint64_t dropped; /* past MAX_ERRORS: counted, not kept */
} problems_t;

typedef struct keystat_s {
  char *key;
  size_t key_len;
  ferry_feature_kind_t kind; /* kind in the first record that had it */
  bool mixed;                /* another kind was seen too */
  uint64_t records;          /* records that have the key */
  uint64_t values_min, values_max, values_total;
  uint64_t last_record;      /* guards against counting a record twice */
} keystat_t;

typedef struct saved_record_s {
  uint8_t *data;
  size_t len;
  uint64_t offset, index;
} saved_record_t;

typedef struct file_report_s {
  const char *path;
  ferry_compression_t compression;
  int open_code;       /* < 0: the file could not be opened */
  ferry_error_t open_err;
  int fatal_code;      /* < 0: reading stopped early on this error */
  ferry_error_t fatal_err;
  uint64_t records, bytes, skipped, examples_ok;
  problems_t bad, malformed;
  keystat_t *keys;     /* in order of first appearance */
  size_t n_keys, keys_cap;
  uint32_t *slots;     /* hash table of indices + 1 into keys */
  size_t n_slots;
  uint64_t untracked_keys; /* occurrences of keys past MAX_KEYS */
  int skip_rc;             /* < 0: recording a bad record failed */
  saved_record_t *shown;
  size_t n_shown;
} file_report_t;

static int problems_add(problems_t *p, uint64_t offset, uint64_t index,
                        int code, const char *msg) {
  if (p->n == MAX_ERRORS) {
    p->dropped++;
    return 0;
  }
  if (!FERRY__GROW(p->v, p->cap, p->n + 1, 16))
    return FERRY_ENOMEM;
  char *m = ferry__strdup(msg);
  if (m == NULL)
    return FERRY_ENOMEM;
  p->v[p->n++] = (problem_t){offset, index, code, m};
  return 0;
}

static void problems_free(problems_t *p) {
  for (size_t i = 0; i < p->n; i++)
    ferry__free(p->v[i].msg);
  ferry__free(p->v);
}

static uint64_t fnv1a(const void *s, size_t len) {
  const uint8_t *p = s;
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < len; i++)
    h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

/* The stats of `key`, created on first sight; NULL when MAX_KEYS keys are
 * already tracked or memory ran out (*oom set). */
static keystat_t *key_lookup(file_report_t *f, const char *key, size_t len,
                             bool *oom) {
  if (f->n_slots == 0) {
    f->n_slots = 64;
    f->slots = ferry__calloc(f->n_slots, sizeof(*f->slots));
    if (f->slots == NULL) {
      f->n_slots = 0;
      *oom = true;
      return NULL;
    }
  }
  size_t mask = f->n_slots - 1;
  size_t i = (size_t)fnv1a(key, len) & mask;
  while (f->slots[i] != 0) {
    keystat_t *k = &f->keys[f->slots[i] - 1];
    if (k->key_len == len && memcmp(k->key, key, len) == 0)
      return k;
    i = (i + 1) & mask;
  }
  if (f->n_keys == MAX_KEYS)
    return NULL;
  if (!FERRY__GROW(f->keys, f->keys_cap, f->n_keys + 1, 16)) {
    *oom = true;
    return NULL;
  }
  char *copy = ferry__malloc(len + 1);
  if (copy == NULL) {
    *oom = true;
    return NULL;
  }
  memcpy(copy, key, len);
  copy[len] = '\0';
  keystat_t *k = &f->keys[f->n_keys++];
  *k = (keystat_t){.key = copy, .key_len = len, .last_record = UINT64_MAX};
  f->slots[i] = (uint32_t)f->n_keys;
  /* Keep the table at most half full. */
  if (f->n_keys * 2 > f->n_slots) {
    size_t n = f->n_slots * 2;
    uint32_t *s = ferry__calloc(n, sizeof(*s));
    if (s == NULL) {
      *oom = true;
      return NULL;
    }
    for (size_t j = 0; j < f->n_keys; j++) {
      size_t h = (size_t)fnv1a(f->keys[j].key, f->keys[j].key_len) & (n - 1);
      while (s[h] != 0)
        h = (h + 1) & (n - 1);
      s[h] = (uint32_t)(j + 1);
    }
    ferry__free(f->slots);
    f->slots = s;
    f->n_slots = n;
    k = &f->keys[f->n_keys - 1];
  }
  return k;
}

static void report_free(file_report_t *f) {
  problems_free(&f->bad);
  problems_free(&f->malformed);
  for (size_t i = 0; i < f->n_keys; i++)
    ferry__free(f->keys[i].key);
  ferry__free(f->keys);
  ferry__free(f->slots);
  for (size_t i = 0; i < f->n_shown; i++)
    ferry__free(f->shown[i].data);
  ferry__free(f->shown);
}

static int count_features(file_report_t *f, const ferry_example_t *ex,
                          uint64_t index) {
  for (size_t i = 0; i < ex->n; i++) {
    const ferry_feature_t *ft = &ex->features[i];
    bool oom = false;
    keystat_t *k = key_lookup(f, ft->key, ft->key_len, &oom);
    if (oom)
      return FERRY_ENOMEM;
    if (k == NULL) {
      f->untracked_keys++;
      continue;
    }
    if (k->last_record == index)
      continue;
    if (k->records == 0) {
      k->kind = ft->kind;
      k->values_min = k->values_max = ft->count;
    } else {
      if (k->kind != ft->kind)
        k->mixed = true;
      if (ft->count < k->values_min)
        k->values_min = ft->count;
      if (ft->count > k->values_max)
        k->values_max = ft->count;
    }
    k->last_record = index;
    k->records++;
    k->values_total += ft->count;
  }
  return 0;
}

/* The reader's on_skip callback: one bad record. */
static void on_bad_record(const ferry_error_t *err, uint64_t offset,
                          uint64_t index, void *arg) {
  file_report_t *f = arg;
  int rc = problems_add(&f->bad, offset, index, err->code, err->msg);
  if (rc < 0 && f->skip_rc == 0)
    f->skip_rc = rc;
}

/* Reads one file into `f`. Returns 0, or FERRY_ENOMEM. Problems with the
 * file itself are recorded in `f`, not returned. */
static int inspect_file(file_report_t *f, const inspect_opts_t *o,
                        ferry_example_t *ex) {
  ferry_tfr_options_t ro;
  ferry__tfr_options_init(&ro);
  ro.on_error = FERRY_ON_ERROR_SKIP;
  ro.max_record_len = o->max_record_bytes;
  ro.compression = compression_of_choice[o->compression];
  ro.on_skip = on_bad_record;
  ro.on_skip_arg = f;
  ro.file_bytes_in_errors = true; /* the file's owner reads these */

  ferry_tfr_reader_t *r = NULL;
  int rc = ferry__tfr_reader_open(f->path, &ro, &r, &f->open_err);
  if (rc < 0) {
    f->open_code = rc;
    return 0;
  }
  f->compression = ferry__tfr_reader_compression(r);
  ferry_error_t err;
  ferry_error_clear(&err);
  int out = 0;
  for (;;) {
    ferry_record_t rec;
    rc = ferry__tfr_reader_next(r, &rec, &err);
    if (f->skip_rc < 0) {
      out = f->skip_rc;
      break;
    }
    if (rc == FERRY_EOF)
      break;
    if (rc < 0) {
      f->fatal_code = rc;
      f->fatal_err = err;
      break;
    }
    f->records++;
    f->bytes += rec.len;
    if (f->n_shown < (size_t)o->show) {
      saved_record_t *s = &f->shown[f->n_shown];
      s->data = ferry__malloc(rec.len ? rec.len : 1);
      if (s->data == NULL) {
        out = FERRY_ENOMEM;
        break;
      }
      memcpy(s->data, rec.data, rec.len);
      s->len = rec.len;
      s->offset = rec.offset;
      s->index = rec.index;
      f->n_shown++;
    }
    rc = ferry__example_parse(ex, rec.data, rec.len, &err);
    if (rc == FERRY_ENOMEM) {
      out = rc;
      break;
    }
    if (rc < 0) {
      out = problems_add(&f->malformed, rec.offset, rec.index, rc,
                         err.msg);
      if (out < 0)
        break;
      continue;
    }
    f->examples_ok++;
    out = count_features(f, ex, rec.index);
    if (out < 0)
      break;
  }
  ferry_tfr_stats_t st;
  ferry__tfr_reader_stats(r, &st);
  f->skipped = st.skipped;
  ferry__tfr_reader_free(r);
  return out;
}

static bool report_clean(const file_report_t *f) {
  return f->open_code == 0 && f->fatal_code == 0 && f->bad.n == 0 &&
         f->bad.dropped == 0 && f->malformed.n == 0 &&
         f->malformed.dropped == 0;
}

static const char *kind_name(const keystat_t *k) {
  return k->mixed ? "mixed" : ferry__feature_kind_name(k->kind);
}

/* Prints bytes for a terminal: printable ASCII as is, the rest as \xNN. */
static void print_escaped(FILE *out, const void *s, size_t len) {
  const unsigned char *p = s;
  for (size_t i = 0; i < len; i++) {
    if (p[i] == '\\')
      fputs("\\\\", out);
    else if (p[i] >= 0x20 && p[i] < 0x7F)
      putc(p[i], out);
    else
      fprintf(out, "\\x%02x", p[i]);
  }
}

static bool is_text(const uint8_t *p, size_t len) {
  for (size_t i = 0; i < len; i++)
    if (p[i] < 0x20 || p[i] >= 0x7F)
      return false;
  return true;
}

static void print_hex(FILE *out, const uint8_t *p, size_t len) {
  for (size_t i = 0; i < len; i++)
    fprintf(out, "%02x", p[i]);
}

/* Prints one float as JSON (null for NaN and infinities) or text. */
static void print_float(FILE *out, float v, bool json) {
  if (json && (v != v || v - v != 0.0f))
    fputs("null", out);
  else
    fprintf(out, "%.9g", (double)v);
}

/* Prints the first values of `ft`: a JSON array or a text line. */
static void print_values(FILE *out, const ferry_feature_t *ft, bool json) {
  if (json)
    putc('[', out);
  if (ft->kind == FERRY_FEATURE_INT64) {
    int64_t v[SHOW_NUMBERS];
    size_t n = 0;
    ferry__feature_int64s(ft, v, SHOW_NUMBERS, &n);
    for (size_t i = 0; i < n && i < SHOW_NUMBERS; i++)
      fprintf(out, "%s%lld", i ? (json ? ", " : " ") : "", (long long)v[i]);
  } else if (ft->kind == FERRY_FEATURE_FLOAT) {
    float v[SHOW_NUMBERS];
    size_t n = 0;
    ferry__feature_floats(ft, v, SHOW_NUMBERS, &n);
    for (size_t i = 0; i < n && i < SHOW_NUMBERS; i++) {
      if (i)
        fputs(json ? ", " : " ", out);
      print_float(out, v[i], json);
    }
  } else if (ft->kind == FERRY_FEATURE_BYTES) {
    for (size_t i = 0; i < ft->count && i < SHOW_BYTES; i++) {
      const uint8_t *d = NULL;
      size_t len = 0;
      if (ferry__feature_bytes(ft, i, &d, &len) < 0)
        break;
      if (i)
        fputs(json ? ", " : " ", out);
      bool text = is_text(d, len < TEXT_PREFIX ? len : TEXT_PREFIX);
      size_t shown = text ? (len < TEXT_PREFIX ? len : TEXT_PREFIX)
                          : (len < HEX_PREFIX ? len : HEX_PREFIX);
      if (json) {
        fprintf(out, "{\"len\": %zu, \"%s\": ", len, text ? "text" : "hex");
        if (text) {
          ferryctl_json_string(out, d, shown);
        } else {
          putc('"', out);
          print_hex(out, d, shown);
          putc('"', out);
        }
        fprintf(out, ", \"truncated\": %s}", shown < len ? "true" : "false");
      } else {
        fprintf(out, "(%zu B) ", len);
        if (text) {
          putc('\'', out);
          print_escaped(out, d, shown);
          fputs(shown < len ? "'..." : "'", out);
        } else {
          fputs("0x", out);
          print_hex(out, d, shown);
          if (shown < len)
            fputs("...", out);
        }
      }
    }
  }
  if (json) {
    putc(']', out);
  } else {
    size_t limit = ft->kind == FERRY_FEATURE_BYTES ? SHOW_BYTES
                                                   : SHOW_NUMBERS;
    if (ft->count > limit)
      fprintf(out, " ... (%zu values)", ft->count);
  }
}

static void json_problems(FILE *out, const problems_t *p) {
  putc('[', out);
  for (size_t i = 0; i < p->n; i++) {
    const problem_t *e = &p->v[i];
    fprintf(out,
            "%s{\"offset\": %llu, \"record\": %llu, \"error\": \"%s\"",
            i ? ", " : "", (unsigned long long)e->offset,
            (unsigned long long)e->index, ferry_err_name(e->code));
    fputs(", \"message\": ", out);
    ferryctl_json_string(out, e->msg, strlen(e->msg));
    putc('}', out);
  }
  putc(']', out);
}

/* One file's report: one JSON document on one line (JSON Lines, as every
 * ferryctl --json prints), so that a reader can take the files one by
 * one (`jq -c`, json.loads per line). */
static void json_report(FILE *out, const file_report_t *f,
                        ferry_example_t *ex) {
  fprintf(out, "{\"schema\": %d, \"kind\": \"records_inspect\", "
          "\"path\": ", JSON_SCHEMA);
  ferryctl_json_string(out, f->path, strlen(f->path));
  fprintf(out, ", \"clean\": %s", report_clean(f) ? "true" : "false");
  if (f->open_code < 0) {
    fprintf(out, ", \"error\": \"%s\", \"message\": ",
            ferry_err_name(f->open_code));
    ferryctl_json_string(out, f->open_err.msg, strlen(f->open_err.msg));
    fputs("}\n", out);
    return;
  }
  fprintf(out,
          ", \"compression\": \"%s\", \"records\": %llu, "
          "\"data_bytes\": %llu, \"bad_records\": %llu, "
          "\"examples\": %llu, \"malformed_examples\": %llu",
          ferry__compression_name(f->compression),
          (unsigned long long)f->records, (unsigned long long)f->bytes,
          (unsigned long long)f->skipped, (unsigned long long)f->examples_ok,
          (unsigned long long)(f->malformed.n + f->malformed.dropped));
  if (f->fatal_code < 0) {
    fprintf(out, ", \"error\": \"%s\", \"message\": ",
            ferry_err_name(f->fatal_code));
    ferryctl_json_string(out, f->fatal_err.msg, strlen(f->fatal_err.msg));
  }
  fputs(", \"bad\": ", out);
  json_problems(out, &f->bad);
  fputs(", \"malformed\": ", out);
  json_problems(out, &f->malformed);
  fputs(", \"features\": [", out);
  for (size_t i = 0; i < f->n_keys; i++) {
    const keystat_t *k = &f->keys[i];
    fputs(i ? ", {\"key\": " : "{\"key\": ", out);
    ferryctl_json_string(out, k->key, k->key_len);
    fprintf(out,
            ", \"type\": \"%s\", \"records\": %llu, \"values_min\": %llu, "
            "\"values_max\": %llu, \"values_total\": %llu}",
            kind_name(k), (unsigned long long)k->records,
            (unsigned long long)k->values_min,
            (unsigned long long)k->values_max,
            (unsigned long long)k->values_total);
  }
  fputs("], \"first_records\": [", out);
  for (size_t i = 0; i < f->n_shown; i++) {
    const saved_record_t *s = &f->shown[i];
    fprintf(out, "%s{\"record\": %llu, \"offset\": %llu, "
            "\"bytes\": %zu, \"features\": [",
            i ? ", " : "", (unsigned long long)s->index,
            (unsigned long long)s->offset, s->len);
    if (ferry__example_parse(ex, s->data, s->len, NULL) == 0) {
      for (size_t j = 0; j < ex->n; j++) {
        const ferry_feature_t *ft = &ex->features[j];
        fputs(j ? ", {\"key\": " : "{\"key\": ", out);
        ferryctl_json_string(out, ft->key, ft->key_len);
        fprintf(out, ", \"type\": \"%s\", \"count\": %zu, \"values\": ",
                ferry__feature_kind_name(ft->kind), ft->count);
        print_values(out, ft, true);
        putc('}', out);
      }
    }
    fputs("]}", out);
  }
  fputs("]}\n", out);
}

static void text_report(FILE *out, const file_report_t *f,
                        ferry_example_t *ex) {
  char hb[32];
  fputs(f->path, out);
  fputs(":\n", out);
  if (f->open_code < 0) {
    fprintf(out, "  error: %s (%s)\n", f->open_err.msg,
            ferry_err_name(f->open_code));
    return;
  }
  fprintf(out, "  compression: %s\n", ferry__compression_name(f->compression));
  fprintf(out, "  records: %llu, %llu data bytes (%s)\n",
          (unsigned long long)f->records, (unsigned long long)f->bytes,
          ferryctl_human_bytes(f->bytes, hb, sizeof(hb)));
  fprintf(out, "  bad records: %llu\n", (unsigned long long)f->skipped);
  for (size_t i = 0; i < f->bad.n; i++) {
    const problem_t *e = &f->bad.v[i];
    fprintf(out, "    offset %llu: %s: %s\n", (unsigned long long)e->offset,
            ferry_err_name(e->code), e->msg);
  }
  if (f->bad.dropped)
    fprintf(out, "    ... and %llu more not listed\n",
            (unsigned long long)f->bad.dropped);
  if (f->fatal_code < 0)
    fprintf(out, "  reading stopped: %s: %s\n", ferry_err_name(f->fatal_code),
            f->fatal_err.msg);
  fprintf(out, "  examples: %llu parsed, %llu malformed\n",
          (unsigned long long)f->examples_ok,
          (unsigned long long)(f->malformed.n + f->malformed.dropped));
  for (size_t i = 0; i < f->malformed.n; i++) {
    const problem_t *e = &f->malformed.v[i];
    fprintf(out, "    record %llu at offset %llu: %s: %s\n",
            (unsigned long long)e->index, (unsigned long long)e->offset,
            ferry_err_name(e->code), e->msg);
  }
  if (f->malformed.dropped)
    fprintf(out, "    ... and %llu more not listed\n",
            (unsigned long long)f->malformed.dropped);
  if (f->n_keys) {
    fprintf(out, "  features (%zu keys):\n", f->n_keys);
    size_t width = 0;
    for (size_t i = 0; i < f->n_keys; i++)
      if (f->keys[i].key_len > width)
        width = f->keys[i].key_len;
    if (width > 40)
      width = 40;
    for (size_t i = 0; i < f->n_keys; i++) {
      const keystat_t *k = &f->keys[i];
      fputs("    ", out);
      print_escaped(out, k->key, k->key_len);
      for (size_t pad = k->key_len; pad < width; pad++)
        putc(' ', out);
      fprintf(out, "  %s, in %llu of %llu records, ", kind_name(k),
              (unsigned long long)k->records,
              (unsigned long long)f->examples_ok);
      if (k->values_min == k->values_max)
        fprintf(out, "%llu value%s each\n",
                (unsigned long long)k->values_min,
                k->values_min == 1 ? "" : "s");
      else
        fprintf(out, "%llu to %llu values\n",
                (unsigned long long)k->values_min,
                (unsigned long long)k->values_max);
    }
  }
  if (f->untracked_keys)
    fprintf(out, "  (%llu occurrences of keys past the first %d not "
            "counted)\n", (unsigned long long)f->untracked_keys, MAX_KEYS);
  for (size_t i = 0; i < f->n_shown; i++) {
    const saved_record_t *s = &f->shown[i];
    fprintf(out, "  record %llu (offset %llu, %zu bytes):\n",
            (unsigned long long)s->index, (unsigned long long)s->offset,
            s->len);
    if (ferry__example_parse(ex, s->data, s->len, NULL) < 0) {
      fputs("    (not a valid Example)\n", out);
      continue;
    }
    for (size_t j = 0; j < ex->n; j++) {
      const ferry_feature_t *ft = &ex->features[j];
      fputs("    ", out);
      print_escaped(out, ft->key, ft->key_len);
      fprintf(out, "  %s[%zu]: ", ferry__feature_kind_name(ft->kind),
              ft->count);
      print_values(out, ft, false);
      putc('\n', out);
    }
  }
  fprintf(out, "  status: %s\n", report_clean(f) ? "clean" : "BAD");
}

static int cmd_inspect(int argc, char **argv) {
  inspect_opts_t o;
  memset(&o, 0, sizeof(o));
  int npos = 0;
  int rc = ferryctl_parse_options(
      "records inspect", inspect_usage, inspect_footer, inspect_table,
      INSPECT_N, &o, offsetof(inspect_opts_t, help), argc, argv, &npos);
  if (rc != FERRYCTL_CONTINUE) {
    ferry__options_free(inspect_table, INSPECT_N, &o);
    return rc;
  }
  if (npos == 0) {
    fprintf(stderr, "ferryctl records inspect: no FILE given\n\n%s",
            inspect_usage);
    ferry__options_free(inspect_table, INSPECT_N, &o);
    return FERRYCTL_EXIT_USAGE;
  }

  int status = FERRYCTL_EXIT_OK;
  ferry_example_t ex;
  ferry__example_init(&ex);
  for (int i = 0; i < npos; i++) {
    file_report_t f;
    memset(&f, 0, sizeof(f));
    f.path = argv[i];
    f.shown = o.show > 0 ? ferry__calloc((size_t)o.show, sizeof(*f.shown))
                         : NULL;
    int r = (o.show > 0 && f.shown == NULL) ? FERRY_ENOMEM
                                            : inspect_file(&f, &o, &ex);
    if (r < 0) {
      fprintf(stderr, "ferryctl records inspect: %s: %s\n", f.path,
              ferry_strerror(r));
      report_free(&f);
      status = FERRYCTL_EXIT_USAGE;
      break;
    }
    if (o.json)
      json_report(stdout, &f, &ex);
    else
      text_report(stdout, &f, &ex);
    if (f.open_code < 0) {
      fprintf(stderr, "ferryctl records inspect: %s\n", f.open_err.msg);
      status = FERRYCTL_EXIT_USAGE;
    } else if (!report_clean(&f) && status == FERRYCTL_EXIT_OK) {
      status = FERRYCTL_EXIT_BAD;
    }
    report_free(&f);
  }
  ferry__example_close(&ex);
  ferry__options_free(inspect_table, INSPECT_N, &o);
  return status;
}

/* ---- index ------------------------------------------------------------ */

typedef struct index_opts_s {
  char *out_dir;
  bool help;
} index_opts_t;

static const ferry_option_t index_table[] = {
    {"out-dir", FERRY_OPT_STRING, offsetof(index_opts_t, out_dir), NULL, 0,
     0, NULL, "write DIR/BASENAME.idx instead of FILE.idx (DIR must exist)"},
    {"help", FERRY_OPT_BOOL, offsetof(index_opts_t, help), "false", 0, 0,
     NULL, "print this help"},
};
#define INDEX_N (sizeof(index_table) / sizeof(index_table[0]))

static const char index_usage[] =
    "usage: ferryctl records index FILE... [--out-dir DIR]\n"
    "\n"
    "Writes FILE.idx for each uncompressed TFRecord file: one line\n"
    "\"<offset> <size>\" per record, size including the 16 framing bytes,\n"
    "as NVIDIA DALI's tfrecord2idx writes it. Both CRCs of every record are\n"
    "verified; a file with a bad record gets no index. Compressed files are\n"
    "refused: their offsets cannot be seeked to.\n";

static const char index_footer[] =
    "\nExit status: 0 when every index was written, 1 when a file has a bad\n"
    "record, 2 on usage errors and unreadable or compressed files.\n";

/* Prints `err` as "ferryctl records CMD: PATH: message (CODE)", leaving
 * out the path when there is none or the message already names it. */
static void records_error(const char *cmd, const char *path,
                          const ferry_error_t *err, int rc) {
  const char *msg = err->msg[0] ? err->msg : ferry_strerror(rc);
  if (path == NULL || strstr(msg, path) != NULL)
    fprintf(stderr, "ferryctl records %s: %s (%s)\n", cmd, msg,
            ferry_err_name(rc));
  else
    fprintf(stderr, "ferryctl records %s: %s: %s (%s)\n", cmd, path, msg,
            ferry_err_name(rc));
}

static bool is_framing_error(int rc) {
  return rc == FERRY_ETRUNCLEN || rc == FERRY_ETRUNCDATA ||
         rc == FERRY_ELENCRC || rc == FERRY_EDATACRC || rc == FERRY_ETOOLONG;
}

static int index_one(const char *path, const char *out_dir) {
  ferry_error_t err;
  ferry_error_clear(&err);
  int c = ferry__tfr_sniff_file(path, &err);
  if (c < 0) {
    records_error("index", path, &err, c);
    return FERRYCTL_EXIT_USAGE;
  }
  if (c != FERRY_COMPRESSION_NONE) {
    fprintf(stderr,
            "ferryctl records index: %s: the file is %s-compressed; index "
            "files are only for uncompressed TFRecords (a reader cannot "
            "seek to an offset inside a compressed stream)\n",
            path, ferry__compression_name((ferry_compression_t)c));
    return FERRYCTL_EXIT_USAGE;
  }
  ferry_tfr_index_entry_t *e = NULL;
  size_t n = 0;
  int rc = ferry__tfr_index_build(path, &e, &n, &err);
  if (rc < 0) {
    records_error("index", path, &err, rc);
    ferry_free(e);
    return is_framing_error(rc) ? FERRYCTL_EXIT_BAD : FERRYCTL_EXIT_USAGE;
  }
  char *out = NULL;
  size_t len;
  if (out_dir != NULL) {
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    len = strlen(out_dir) + 1 + strlen(base) + 5;
    out = ferry__malloc(len);
    if (out != NULL)
      snprintf(out, len, "%s/%s.idx", out_dir, base);
  } else {
    len = strlen(path) + 5;
    out = ferry__malloc(len);
    if (out != NULL)
      snprintf(out, len, "%s.idx", path);
  }
  if (out == NULL) {
    ferry_free(e);
    fprintf(stderr, "ferryctl records index: %s: out of memory\n", path);
    return FERRYCTL_EXIT_USAGE;
  }
  rc = ferry__tfr_index_write(out, e, n, &err);
  if (rc < 0) {
    records_error("index", out, &err, rc);
  } else {
    printf("%s: %zu records\n", out, n);
  }
  ferry__free(out);
  ferry_free(e);
  return rc < 0 ? FERRYCTL_EXIT_USAGE : FERRYCTL_EXIT_OK;
}

static int cmd_index(int argc, char **argv) {
  index_opts_t o;
  memset(&o, 0, sizeof(o));
  int npos = 0;
  int rc = ferryctl_parse_options("records index", index_usage, index_footer,
                                  index_table, INDEX_N, &o,
                                  offsetof(index_opts_t, help), argc, argv,
                                  &npos);
  if (rc != FERRYCTL_CONTINUE) {
    ferry__options_free(index_table, INDEX_N, &o);
    return rc;
  }
  int status = FERRYCTL_EXIT_OK;
  struct stat st;
  if (npos == 0) {
    fprintf(stderr, "ferryctl records index: no FILE given\n\n%s",
            index_usage);
    status = FERRYCTL_EXIT_USAGE;
  } else if (o.out_dir != NULL && o.out_dir[0] != '\0' &&
             (stat(o.out_dir, &st) != 0 || !S_ISDIR(st.st_mode))) {
    fprintf(stderr, "ferryctl records index: --out-dir %s: not a "
            "directory\n", o.out_dir);
    status = FERRYCTL_EXIT_USAGE;
  } else {
    const char *dir = o.out_dir && o.out_dir[0] ? o.out_dir : NULL;
    for (int i = 0; i < npos; i++) {
      int r = index_one(argv[i], dir);
      if (r > status)
        status = r;
    }
  }
  ferry__options_free(index_table, INDEX_N, &o);
  return status;
}

/* ---- optimize --------------------------------------------------------- */

#define OPT_MAX_THREADS 256
#define OPT_BATCH_PER_THREAD 16      /* records per batch and thread */
#define OPT_BATCH_BYTES (64u << 20)  /* a batch stops growing past this */

typedef struct optimize_opts_s {
  int compression; /* index into "same|none|gzip|zlib" */
  int64_t threads;
  bool json;
  bool help;
} optimize_opts_t;

static const ferry_option_t optimize_table[] = {
    {"compression", FERRY_OPT_ENUM, offsetof(optimize_opts_t, compression),
     "same", 0, 0, "same|none|gzip|zlib",
     "the outputs' compression; same: each input's own"},
    {"threads", FERRY_OPT_INT, offsetof(optimize_opts_t, threads), "0", 0,
     OPT_MAX_THREADS, NULL,
     "threads rewriting JPEGs (0: one per CPU); records keep their order"},
    {"json", FERRY_OPT_BOOL, offsetof(optimize_opts_t, json), "false", 0, 0,
     NULL, "print one JSON document (with \"schema\": 1) instead of text"},
    {"help", FERRY_OPT_BOOL, offsetof(optimize_opts_t, help), "false", 0, 0,
     NULL, "print this help"},
};
#define OPTIMIZE_N (sizeof(optimize_table) / sizeof(optimize_table[0]))

static const ferry_compression_t compression_of_output[] = {
    FERRY_COMPRESSION_AUTO, FERRY_COMPRESSION_NONE, FERRY_COMPRESSION_GZIP,
    FERRY_COMPRESSION_ZLIB};

static const char optimize_usage[] =
    "usage: ferryctl records optimize IN... OUT [options]\n"
    "\n"
    "Rewrites the JPEGs in TFRecord files losslessly for cropped decodes:\n"
    "every bytes value of a tf.train.Example that starts as a JPEG does\n"
    "(FF D8 FF) gets restart intervals that tile its rows (the same DCT\n"
    "coefficients, optimal Huffman tables), so that a crop decodes only its\n"
    "window. A rewrite is kept only when it decodes to exactly the\n"
    "original's pixels and is at most 10% larger; otherwise the image is\n"
    "copied as it was, and so is a record that is not an Example. Every\n"
    "other byte of a record is kept, and records keep their order.\n"
    "\n"
    "IN is a TFRecord file (plain, GZIP or ZLIB) or a directory, whose\n"
    "files named *.tfrecord, *.tfrecords or *.record (.gz or .zz after it\n"
    "for compressed ones) are read in name order. OUT is a directory,\n"
    "created if missing; each output keeps its input's basename and an\n"
    "uncompressed one gets OUT/BASENAME.idx as 'records index' writes it.\n"
    "An output is written under a temporary name and renamed once whole.\n"
    "OUT may not be an IN directory, and no output may overwrite an input.\n"
    "\n"
    "Prints per file the records, the JPEGs rewritten and copied (and why:\n"
    "already laid out, unreadable, warnings, too_small, grows, differs) and\n"
    "the file sizes before and after, and a total for several files.\n";

static const char optimize_footer[] =
    "\nExit status: 0 when every file was written, 1 when an input has a bad\n"
    "record (named with its byte offset; nothing is left under its output's\n"
    "name), 2 on usage errors and unreadable or unwritable files.\n";

/* Counts of one record, one file or all of them. */
typedef struct opt_counts_s {
  uint64_t files, records, not_examples, jpegs;
  uint64_t reasons[FERRY_JOPT_NREASONS]; /* [FERRY_JOPT_REWRITTEN]: those
                                            rewritten */
  uint64_t bytes_in, bytes_out;          /* the files' sizes */
} opt_counts_t;

static void counts_add(opt_counts_t *to, const opt_counts_t *c) {
  to->files += c->files;
  to->records += c->records;
  to->not_examples += c->not_examples;
  to->jpegs += c->jpegs;
  for (int i = 0; i < FERRY_JOPT_NREASONS; i++)
    to->reasons[i] += c->reasons[i];
  to->bytes_in += c->bytes_in;
  to->bytes_out += c->bytes_out;
}

/* One input file and the names of its output. */
typedef struct opt_file_s {
  char *in;
  const char *base; /* inside `in` */
  struct stat st;
  char *out, *tmp, *idx, *idx_tmp;
} opt_file_t;

/* One record of a batch. */
typedef struct opt_slot_s {
  uint8_t *data; /* a copy of the input record */
  size_t len, cap;
  uint64_t offset, index;
  uint8_t *out; /* the rewritten record, or NULL: write `data` */
  size_t out_len;
  int rc; /* < 0: it failed (out of memory), err says where */
  ferry_error_t err;
  opt_counts_t counts;
} opt_slot_t;

struct opt_pool_s;

typedef struct opt_worker_s {
  struct opt_pool_s *pool;
  ferry_jpeg_t *jpeg;
  opt_slot_t *slot; /* the record being rewritten */
} opt_worker_t;

/* The threads that rewrite one batch of records at a time. The calling
 * thread is worker 0 and takes its share of each batch; records are taken
 * in order, and each result stays in its record's slot, so the writer
 * keeps the input's order whatever finishes first. */
typedef struct opt_pool_s {
  pthread_mutex_t mu;
  pthread_cond_t go, done;
  uint64_t gen; /* batches handed out */
  bool quit;
  int busy;     /* threads still on the current batch */
  opt_slot_t *slots;
  size_t n, next;
  opt_worker_t *workers;
  int n_workers;
  pthread_t *tids;
  int n_threads; /* started: workers 1 .. n_threads */
} opt_pool_t;

/* The rewriter's callback: a value that starts as a JPEG does is offered
 * to ferry__jpeg_optimize and counted. */
static int optimize_value(void *ctx, const char *key, size_t key_len,
                          size_t index, const uint8_t *value, size_t len,
                          uint8_t **replacement, size_t *replacement_len) {
  opt_worker_t *w = ctx;
  opt_counts_t *c = &w->slot->counts;
  ferry_jopt_result_t res;
  (void)key;
  (void)key_len;
  (void)index;
  if (len < 3 || value[0] != 0xFF || value[1] != 0xD8 || value[2] != 0xFF)
    return 0;
  int rc = ferry__jpeg_optimize(w->jpeg, value, len, replacement,
                                replacement_len, &res, NULL);
  if (rc < 0)
    return rc;
  c->jpegs++;
  c->reasons[res.reason]++;
  return 0;
}

static void optimize_slot(opt_worker_t *w, opt_slot_t *s) {
  memset(&s->counts, 0, sizeof(s->counts));
  s->counts.records = 1;
  s->out = NULL;
  s->out_len = 0;
  w->slot = s;
  s->rc = ferry__example_rewrite_bytes(s->data, s->len, optimize_value, w,
                                       &s->out, &s->out_len, &s->err);
  if (s->rc == FERRY_EVARINT || s->rc == FERRY_EWIRETYPE ||
      s->rc == FERRY_EOVERRUN) {
    /* Not an Example: copied as it is, whatever was counted before the
     * fault. */
    memset(&s->counts, 0, sizeof(s->counts));
    s->counts.records = 1;
    s->counts.not_examples = 1;
    s->rc = 0;
  }
}

/* Takes the batch's records one by one until none is left. */
static void pool_work(opt_pool_t *p, opt_worker_t *w) {
  for (;;) {
    pthread_mutex_lock(&p->mu);
    size_t i = p->next < p->n ? p->next++ : p->n;
    pthread_mutex_unlock(&p->mu);
    if (i == p->n)
      return;
    optimize_slot(w, &p->slots[i]);
  }
}

static void *pool_thread(void *arg) {
  opt_worker_t *w = arg;
  opt_pool_t *p = w->pool;
  uint64_t seen = 0;
  pthread_mutex_lock(&p->mu);
  for (;;) {
    while (p->gen == seen && !p->quit)
      pthread_cond_wait(&p->go, &p->mu);
    if (p->quit)
      break;
    seen = p->gen;
    pthread_mutex_unlock(&p->mu);
    pool_work(p, w);
    pthread_mutex_lock(&p->mu);
    if (--p->busy == 0)
      pthread_cond_signal(&p->done);
  }
  pthread_mutex_unlock(&p->mu);
  return NULL;
}

/* Rewrites slots[0, n) on every worker and returns when all are done. */
static void pool_run(opt_pool_t *p, size_t n) {
  pthread_mutex_lock(&p->mu);
  p->n = n;
  p->next = 0;
  p->busy = p->n_threads;
  p->gen++;
  pthread_cond_broadcast(&p->go);
  pthread_mutex_unlock(&p->mu);
  pool_work(p, &p->workers[0]);
  pthread_mutex_lock(&p->mu);
  while (p->busy > 0)
    pthread_cond_wait(&p->done, &p->mu);
  pthread_mutex_unlock(&p->mu);
}

static void pool_close(opt_pool_t *p) {
  pthread_mutex_lock(&p->mu);
  p->quit = true;
  pthread_cond_broadcast(&p->go);
  pthread_mutex_unlock(&p->mu);
  for (int i = 0; i < p->n_threads; i++)
    pthread_join(p->tids[i], NULL);
  for (int i = 0; i < p->n_workers; i++)
    ferry__jpeg_free(p->workers[i].jpeg);
  for (size_t i = 0; i < (size_t)p->n_workers * OPT_BATCH_PER_THREAD; i++)
    ferry__free(p->slots[i].data);
  ferry__free(p->workers);
  ferry__free(p->tids);
  ferry__free(p->slots);
  pthread_cond_destroy(&p->go);
  pthread_cond_destroy(&p->done);
  pthread_mutex_destroy(&p->mu);
}

/* Starts n workers (the caller and n - 1 threads). Returns 0 or a
 * negative code, with the pool closed. */
static int pool_open(opt_pool_t *p, int n, ferry_error_t *err) {
  memset(p, 0, sizeof(*p));
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->go, NULL);
  pthread_cond_init(&p->done, NULL);
  p->n_workers = n;
  p->workers = ferry__calloc((size_t)n, sizeof(*p->workers));
  p->tids = ferry__calloc((size_t)n, sizeof(*p->tids));
  p->slots = ferry__calloc((size_t)n * OPT_BATCH_PER_THREAD,
                           sizeof(*p->slots));
  if (p->workers == NULL || p->tids == NULL || p->slots == NULL) {
    p->n_workers = 0;
    pool_close(p);
    return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
  }
  for (int i = 0; i < n; i++) {
    p->workers[i].pool = p;
    int rc = ferry__jpeg_new(&p->workers[i].jpeg, err);
    if (rc < 0) {
      pool_close(p);
      return rc;
    }
  }
  for (int i = 1; i < n; i++) {
    int rc = pthread_create(&p->tids[i - 1], NULL, pool_thread,
                            &p->workers[i]);
    if (rc != 0) {
      pool_close(p);
      return ferry__seterr(err, -rc, "cannot start a thread: %s",
                           strerror(rc));
    }
    p->n_threads = i;
  }
  return 0;
}

static bool is_bad_data(int rc) {
  return is_framing_error(rc) || rc == FERRY_ECOMPRESS;
}

/* Copies record `rec` into slot s. */
static int slot_fill(opt_slot_t *s, const ferry_record_t *rec) {
  if (rec->len > s->cap || s->data == NULL) {
    uint8_t *d = ferry__malloc(rec->len ? rec->len : 1);
    if (d == NULL)
      return FERRY_ENOMEM;
    ferry__free(s->data);
    s->data = d;
    s->cap = rec->len;
  }
  memcpy(s->data, rec->data, rec->len);
  s->len = rec->len;
  s->offset = rec->offset;
  s->index = rec->index;
  return 0;
}

/* Writes the rewritten records of slots[0, n) in order and adds their
 * counts to c. */
static int write_batch(opt_pool_t *p, size_t n, const opt_file_t *f,
                       ferry_tfr_writer_t *w, opt_counts_t *c,
                       ferry_error_t *err) {
  int rc = 0;
  for (size_t i = 0; i < n; i++) {
    opt_slot_t *s = &p->slots[i];
    if (rc == 0 && s->rc < 0)
      rc = ferry__seterr(err, s->rc, "%s: record %llu at byte offset %llu: "
                         "%s", f->in, (unsigned long long)s->index,
                         (unsigned long long)s->offset, s->err.msg);
    if (rc == 0) {
      rc = s->out != NULL ? ferry__tfr_writer_write(w, s->out, s->out_len,
                                                    err)
                          : ferry__tfr_writer_write(w, s->data, s->len, err);
      counts_add(c, &s->counts);
    }
    ferry__free(s->out);
    s->out = NULL;
  }
  return rc;
}

/* Reads f->in and writes its records, rewritten, to f->tmp. */
static int optimize_records(opt_pool_t *p, const opt_file_t *f,
                            const optimize_opts_t *o,
                            ferry_compression_t *compression,
                            opt_counts_t *c, ferry_error_t *err) {
  ferry_tfr_options_t ro;
  ferry__tfr_options_init(&ro);
  ro.file_bytes_in_errors = true; /* the file's owner reads these */
  ferry_tfr_reader_t *r = NULL;
  int rc = ferry__tfr_reader_open(f->in, &ro, &r, err);
  if (rc < 0)
    return rc;
  *compression = compression_of_output[o->compression];
  if (*compression == FERRY_COMPRESSION_AUTO)
    *compression = ferry__tfr_reader_compression(r);
  ferry_tfr_writer_t *w = NULL;
  rc = ferry__tfr_writer_open(f->tmp, *compression, &w, err);
  size_t cap = (size_t)p->n_workers * OPT_BATCH_PER_THREAD;
  bool eof = false;
  while (rc == 0 && !eof) {
    size_t n = 0, bytes = 0;
    while (n < cap && bytes < OPT_BATCH_BYTES) {
      ferry_record_t rec;
      rc = ferry__tfr_reader_next(r, &rec, err);
      if (rc == FERRY_EOF) {
        rc = 0;
        eof = true;
        break;
      }
      if (rc == 0 && slot_fill(&p->slots[n], &rec) < 0)
        rc = ferry__seterr(err, FERRY_ENOMEM, "%s: record %llu at byte "
                           "offset %llu: out of memory", f->in,
                           (unsigned long long)rec.index,
                           (unsigned long long)rec.offset);
      if (rc < 0)
        break;
      n++;
      bytes += rec.len;
    }
    if (rc == 0 && n > 0) {
      pool_run(p, n);
      rc = write_batch(p, n, f, w, c, err);
    }
  }
  if (w != NULL) {
    ferry_error_t close_err;
    int crc = ferry__tfr_writer_close(w, &close_err);
    if (rc == 0 && crc < 0) {
      rc = crc;
      *err = close_err;
    }
  }
  ferry__tfr_reader_free(r);
  return rc;
}

/* Optimizes one file into f->tmp (and f->idx_tmp), then renames them to
 * their final names. Returns 0 or an exit status; the error is printed. */
static int optimize_one(opt_pool_t *p, const opt_file_t *f,
                        const optimize_opts_t *o, opt_counts_t *c,
                        ferry_error_t *err) {
  memset(c, 0, sizeof(*c));
  c->files = 1;
  c->bytes_in = (uint64_t)f->st.st_size;
  ferry_compression_t comp;
  int rc = optimize_records(p, f, o, &comp, c, err);
  struct stat st;
  if (rc == 0 && stat(f->tmp, &st) != 0)
    rc = ferry__seterr(err, -errno, "%s: %s", f->tmp, strerror(errno));
  if (rc == 0)
    c->bytes_out = (uint64_t)st.st_size;
  if (rc == 0 && comp == FERRY_COMPRESSION_NONE) {
    ferry_tfr_index_entry_t *e = NULL;
    size_t n = 0;
    rc = ferry__tfr_index_build(f->tmp, &e, &n, err);
    if (rc == 0)
      rc = ferry__tfr_index_write(f->idx_tmp, e, n, err);
    ferry_free(e);
  }
  if (rc == 0 && rename(f->tmp, f->out) != 0)
    rc = ferry__seterr(err, -errno, "cannot rename %s to %s: %s", f->tmp,
                       f->out, strerror(errno));
  if (rc == 0 && comp == FERRY_COMPRESSION_NONE &&
      rename(f->idx_tmp, f->idx) != 0)
    rc = ferry__seterr(err, -errno, "cannot rename %s to %s: %s",
                       f->idx_tmp, f->idx, strerror(errno));
  /* A compressed output has no index: one left by an earlier run would
   * describe another file. */
  if (rc == 0 && comp != FERRY_COMPRESSION_NONE && unlink(f->idx) != 0 &&
      errno != ENOENT)
    rc = ferry__seterr(err, -errno, "cannot remove the stale %s: %s",
                       f->idx, strerror(errno));
  if (rc < 0) {
    unlink(f->tmp);
    unlink(f->idx_tmp);
    records_error("optimize", f->in, err, rc);
    return is_bad_data(rc) ? FERRYCTL_EXIT_BAD : FERRYCTL_EXIT_USAGE;
  }
  return FERRYCTL_EXIT_OK;
}

static double change_pct(const opt_counts_t *c) {
  if (c->bytes_in == 0)
    return 0.0;
  return 100.0 * ((double)c->bytes_out - (double)c->bytes_in) /
         (double)c->bytes_in;
}

static void text_counts(FILE *out, const opt_counts_t *c) {
  fprintf(out, "%llu records", (unsigned long long)c->records);
  if (c->not_examples)
    fprintf(out, " (%llu not Examples)",
            (unsigned long long)c->not_examples);
  uint64_t copied = c->jpegs - c->reasons[FERRY_JOPT_REWRITTEN];
  fprintf(out, ", %llu JPEGs: %llu rewritten, %llu copied",
          (unsigned long long)c->jpegs,
          (unsigned long long)c->reasons[FERRY_JOPT_REWRITTEN],
          (unsigned long long)copied);
  if (copied) {
    const char *sep = " (reasons: ";
    for (int i = 1; i < FERRY_JOPT_NREASONS; i++) {
      if (c->reasons[i] == 0)
        continue;
      fprintf(out, "%s%s %llu", sep,
              ferry__jopt_reason_name((ferry_jopt_reason_t)i),
              (unsigned long long)c->reasons[i]);
      sep = ", ";
    }
    putc(')', out);
  }
  fprintf(out, ", bytes %llu -> %llu (%+.2f%%)\n",
          (unsigned long long)c->bytes_in, (unsigned long long)c->bytes_out,
          change_pct(c));
}

static void json_counts(FILE *out, const opt_counts_t *c) {
  fprintf(out,
          "\"records\": %llu, \"not_examples\": %llu, \"jpegs\": %llu, "
          "\"rewritten\": %llu, \"copied\": %llu, \"reasons\": {",
          (unsigned long long)c->records,
          (unsigned long long)c->not_examples, (unsigned long long)c->jpegs,
          (unsigned long long)c->reasons[FERRY_JOPT_REWRITTEN],
          (unsigned long long)(c->jpegs - c->reasons[FERRY_JOPT_REWRITTEN]));
  for (int i = 1; i < FERRY_JOPT_NREASONS; i++)
    fprintf(out, "%s\"%s\": %llu", i > 1 ? ", " : "",
            ferry__jopt_reason_name((ferry_jopt_reason_t)i),
            (unsigned long long)c->reasons[i]);
  fprintf(out, "}, \"bytes_in\": %llu, \"bytes_out\": %llu, "
          "\"change_pct\": %.2f",
          (unsigned long long)c->bytes_in, (unsigned long long)c->bytes_out,
          change_pct(c));
}

/* The --json document: every file written, the total, and the error
 * that stopped the run (if one did). */
static void json_optimize(FILE *out, const char *out_dir,
                          const opt_file_t *files, const opt_counts_t *counts,
                          size_t done, const opt_counts_t *total, int rc,
                          const ferry_error_t *err) {
  fprintf(out, "{\"schema\": %d, \"kind\": \"records_optimize\", "
          "\"out\": ", JSON_SCHEMA);
  ferryctl_json_string(out, out_dir, strlen(out_dir));
  fputs(", \"files\": [", out);
  for (size_t i = 0; i < done; i++) {
    fputs(i ? ", {\"in\": " : "{\"in\": ", out);
    ferryctl_json_string(out, files[i].in, strlen(files[i].in));
    fputs(", \"out\": ", out);
    ferryctl_json_string(out, files[i].out, strlen(files[i].out));
    fputs(", ", out);
    json_counts(out, &counts[i]);
    putc('}', out);
  }
  fprintf(out, "], \"total\": {\"files\": %llu, ",
          (unsigned long long)total->files);
  json_counts(out, total);
  putc('}', out);
  if (rc < 0) {
    fprintf(out, ", \"error\": \"%s\", \"message\": ", ferry_err_name(rc));
    ferryctl_json_string(out, err->msg, strlen(err->msg));
  }
  fputs("}\n", out);
}

/* A file a directory IN contributes: *.tfrecord, *.tfrecords, *.record,
 * each also with .gz or .zz after it. */
static bool is_record_name(const char *name) {
  static const char *const kinds[] = {".tfrecord", ".tfrecords", ".record"};
  static const char *const comps[] = {"", ".gz", ".zz"};
  size_t len = strlen(name);
  if (name[0] == '.')
    return false;
  for (size_t k = 0; k < 3; k++) {
    for (size_t c = 0; c < 3; c++) {
      char suffix[32];
      size_t n = (size_t)snprintf(suffix, sizeof(suffix), "%s%s", kinds[k],
                                  comps[c]);
      if (len > n && strcmp(name + len - n, suffix) == 0)
        return true;
    }
  }
  return false;
}

static char *path_join(const char *dir, const char *prefix, const char *name,
                       const char *suffix) {
  size_t dl = strlen(dir);
  size_t len = dl + strlen(prefix) + strlen(name) + strlen(suffix) + 2;
  char *p = ferry__malloc(len);
  if (p != NULL)
    snprintf(p, len, "%s%s%s%s%s", dir, dl && dir[dl - 1] == '/' ? "" : "/",
             prefix, name, suffix);
  return p;
}

typedef struct opt_plan_s {
  opt_file_t *files;
  size_t n, cap;
} opt_plan_t;

static void plan_free(opt_plan_t *pl) {
  for (size_t i = 0; i < pl->n; i++) {
    opt_file_t *f = &pl->files[i];
    ferry__free(f->in);
    ferry__free(f->out);
    ferry__free(f->tmp);
    ferry__free(f->idx);
    ferry__free(f->idx_tmp);
  }
  ferry__free(pl->files);
}

/* Adds the input file `path` (taken over) with its output names in
 * out_dir. Returns 0, an exit status, or FERRY_ENOMEM. */
static int plan_add(opt_plan_t *pl, char *path, const char *out_dir) {
  if (!FERRY__GROW(pl->files, pl->cap, pl->n + 1, 16)) {
    ferry__free(path);
    return FERRY_ENOMEM;
  }
  opt_file_t *f = &pl->files[pl->n++];
  memset(f, 0, sizeof(*f));
  f->in = path;
  const char *slash = strrchr(path, '/');
  f->base = slash ? slash + 1 : path;
  if (stat(path, &f->st) != 0) {
    fprintf(stderr, "ferryctl records optimize: %s: %s\n", path,
            strerror(errno));
    return FERRYCTL_EXIT_USAGE;
  }
  if (!S_ISREG(f->st.st_mode)) {
    fprintf(stderr, "ferryctl records optimize: %s: not a regular file\n",
            path);
    return FERRYCTL_EXIT_USAGE;
  }
  char pid[32];
  snprintf(pid, sizeof(pid), ".tmp.%ld", (long)getpid());
  char idx_pid[40];
  snprintf(idx_pid, sizeof(idx_pid), ".idx%s", pid);
  f->out = path_join(out_dir, "", f->base, "");
  f->tmp = path_join(out_dir, ".", f->base, pid);
  f->idx = path_join(out_dir, "", f->base, ".idx");
  f->idx_tmp = path_join(out_dir, ".", f->base, idx_pid);
  if (f->out == NULL || f->tmp == NULL || f->idx == NULL ||
      f->idx_tmp == NULL)
    return FERRY_ENOMEM;
  return 0;
}

static int by_string(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Adds IN: a file, or the record files of a directory in name order. */
static int plan_input(opt_plan_t *pl, const char *in, const char *out_dir) {
  struct stat st;
  if (stat(in, &st) != 0) {
    fprintf(stderr, "ferryctl records optimize: %s: %s\n", in,
            strerror(errno));
    return FERRYCTL_EXIT_USAGE;
  }
  if (!S_ISDIR(st.st_mode)) {
    char *copy = ferry__strdup(in);
    return copy != NULL ? plan_add(pl, copy, out_dir) : FERRY_ENOMEM;
  }
  DIR *d = opendir(in);
  if (d == NULL) {
    fprintf(stderr, "ferryctl records optimize: %s: %s\n", in,
            strerror(errno));
    return FERRYCTL_EXIT_USAGE;
  }
  char **names = NULL;
  size_t n = 0, cap = 0;
  int rc = 0;
  struct dirent *e;
  while (rc == 0 && (e = readdir(d)) != NULL) {
    if (!is_record_name(e->d_name))
      continue;
    if (!FERRY__GROW(names, cap, n + 1, 64) ||
        (names[n] = path_join(in, "", e->d_name, "")) == NULL)
      rc = FERRY_ENOMEM;
    else
      n++;
  }
  closedir(d);
  if (rc == 0 && n == 0) {
    fprintf(stderr, "ferryctl records optimize: %s: no *.tfrecord, "
            "*.tfrecords or *.record files in the directory\n", in);
    rc = FERRYCTL_EXIT_USAGE;
  }
  if (n > 0)
    qsort(names, n, sizeof(*names), by_string);
  size_t i = 0;
  for (; rc == 0 && i < n; i++)
    rc = plan_add(pl, names[i], out_dir);
  for (; i < n; i++)
    ferry__free(names[i]);
  ferry__free(names);
  return rc;
}

/* Refuses a run that would write over an input: OUT an IN directory, an
 * output that is an input (by device and inode), two inputs with one
 * basename. */
static int plan_check(const opt_plan_t *pl, char **ins, int n_in,
                      const char *out_dir) {
  struct stat od;
  if (stat(out_dir, &od) == 0) {
    if (!S_ISDIR(od.st_mode)) {
      fprintf(stderr, "ferryctl records optimize: OUT %s: not a "
              "directory\n", out_dir);
      return FERRYCTL_EXIT_USAGE;
    }
    for (int i = 0; i < n_in; i++) {
      struct stat st;
      if (stat(ins[i], &st) == 0 && st.st_dev == od.st_dev &&
          st.st_ino == od.st_ino) {
        fprintf(stderr, "ferryctl records optimize: OUT %s is the input "
                "directory %s: the outputs would overwrite the inputs\n",
                out_dir, ins[i]);
        return FERRYCTL_EXIT_USAGE;
      }
    }
  }
  for (size_t i = 0; i < pl->n; i++) {
    const opt_file_t *f = &pl->files[i];
    struct stat st;
    bool exists = stat(f->out, &st) == 0;
    for (size_t k = 0; k < pl->n; k++) {
      const opt_file_t *g = &pl->files[k];
      if (exists && st.st_dev == g->st.st_dev &&
          st.st_ino == g->st.st_ino) {
        fprintf(stderr, "ferryctl records optimize: %s would overwrite the "
                "input %s\n", f->out, g->in);
        return FERRYCTL_EXIT_USAGE;
      }
      if (k < i && strcmp(f->base, g->base) == 0) {
        fprintf(stderr, "ferryctl records optimize: %s and %s are both "
                "named %s: their outputs would be one file\n", g->in, f->in,
                f->base);
        return FERRYCTL_EXIT_USAGE;
      }
    }
  }
  return 0;
}

/* mkdir -p. */
static int make_dirs(const char *path) {
  char *p = ferry__strdup(path);
  if (p == NULL)
    return FERRY_ENOMEM;
  int rc = 0;
  for (char *s = p + 1; rc == 0; s++) {
    if (*s != '/' && *s != '\0')
      continue;
    char c = *s;
    *s = '\0';
    struct stat st;
    if (stat(p, &st) != 0 && mkdir(p, 0777) != 0 && errno != EEXIST)
      rc = -errno;
    *s = c;
    if (c == '\0')
      break;
  }
  ferry__free(p);
  return rc;
}

static int cpu_count(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n < 1 ? 1 : n > OPT_MAX_THREADS ? OPT_MAX_THREADS : (int)n;
}

static int cmd_optimize(int argc, char **argv) {
  optimize_opts_t o;
  memset(&o, 0, sizeof(o));
  int npos = 0;
  int rc = ferryctl_parse_options("records optimize", optimize_usage,
                                  optimize_footer, optimize_table,
                                  OPTIMIZE_N, &o,
                                  offsetof(optimize_opts_t, help), argc,
                                  argv, &npos);
  if (rc != FERRYCTL_CONTINUE) {
    ferry__options_free(optimize_table, OPTIMIZE_N, &o);
    return rc;
  }
  if (npos < 2) {
    fprintf(stderr, "ferryctl records optimize: give IN... and OUT\n\n%s",
            optimize_usage);
    ferry__options_free(optimize_table, OPTIMIZE_N, &o);
    return FERRYCTL_EXIT_USAGE;
  }
  const char *out_dir = argv[npos - 1];
  if (out_dir[0] == '\0') {
    fprintf(stderr, "ferryctl records optimize: OUT is empty\n");
    ferry__options_free(optimize_table, OPTIMIZE_N, &o);
    return FERRYCTL_EXIT_USAGE;
  }
  opt_plan_t pl = {0};
  rc = 0;
  for (int i = 0; rc == 0 && i < npos - 1; i++)
    rc = plan_input(&pl, argv[i], out_dir);
  if (rc == 0)
    rc = plan_check(&pl, argv, npos - 1, out_dir);
  if (rc == 0) {
    int mk = make_dirs(out_dir);
    if (mk < 0) {
      fprintf(stderr, "ferryctl records optimize: cannot create OUT %s: "
              "%s\n", out_dir, ferry_strerror(mk));
      rc = FERRYCTL_EXIT_USAGE;
    }
  }
  if (rc == FERRY_ENOMEM) {
    fprintf(stderr, "ferryctl records optimize: out of memory\n");
    rc = FERRYCTL_EXIT_USAGE;
  }
  if (rc != 0) {
    plan_free(&pl);
    ferry__options_free(optimize_table, OPTIMIZE_N, &o);
    return rc;
  }

  int threads = o.threads > 0 ? (int)o.threads : cpu_count();
  opt_pool_t pool;
  ferry_error_t err;
  ferry_error_clear(&err);
  int prc = pool_open(&pool, threads, &err);
  if (prc < 0) {
    records_error("optimize", NULL, &err, prc);
    plan_free(&pl);
    ferry__options_free(optimize_table, OPTIMIZE_N, &o);
    return FERRYCTL_EXIT_USAGE;
  }
  opt_counts_t *counts = ferry__calloc(pl.n, sizeof(*counts));
  if (counts == NULL) {
    fprintf(stderr, "ferryctl records optimize: out of memory\n");
    pool_close(&pool);
    plan_free(&pl);
    ferry__options_free(optimize_table, OPTIMIZE_N, &o);
    return FERRYCTL_EXIT_USAGE;
  }
  opt_counts_t total;
  memset(&total, 0, sizeof(total));
  int status = FERRYCTL_EXIT_OK;
  int first_rc = 0;
  size_t done = 0;
  for (; done < pl.n; done++) {
    status = optimize_one(&pool, &pl.files[done], &o, &counts[done], &err);
    if (status != FERRYCTL_EXIT_OK) {
      first_rc = err.code < 0 ? err.code : FERRY_EIO;
      break;
    }
    counts_add(&total, &counts[done]);
    if (!o.json) {
      printf("%s -> %s: ", pl.files[done].in, pl.files[done].out);
      text_counts(stdout, &counts[done]);
      fflush(stdout);
    }
  }
  if (o.json)
    json_optimize(stdout, out_dir, pl.files, counts, done, &total, first_rc,
                  &err);
  else if (pl.n > 1 && status == FERRYCTL_EXIT_OK) {
    printf("total (%llu files): ", (unsigned long long)total.files);
    text_counts(stdout, &total);
  }
  pool_close(&pool);
  ferry__free(counts);
  plan_free(&pl);
  ferry__options_free(optimize_table, OPTIMIZE_N, &o);
  return status;
}

/* ---- dispatch --------------------------------------------------------- */

int ferryctl_records(int argc, char **argv) {
  if (argc < 2) {
    fputs(records_usage, stderr);
    return FERRYCTL_EXIT_USAGE;
  }
  const char *sub = argv[1];
  if (strcmp(sub, "--help") == 0 || strcmp(sub, "-h") == 0) {
    fputs(records_usage, stdout);
    return FERRYCTL_EXIT_OK;
  }
  if (strcmp(sub, "inspect") == 0)
    return cmd_inspect(argc - 2, argv + 2);
  if (strcmp(sub, "index") == 0)
    return cmd_index(argc - 2, argv + 2);
  if (strcmp(sub, "optimize") == 0)
    return cmd_optimize(argc - 2, argv + 2);
  fprintf(stderr, "ferryctl records: unknown command '%s'\n\n%s", sub,
          records_usage);
  return FERRYCTL_EXIT_USAGE;
}
