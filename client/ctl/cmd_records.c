/* ferryctl records inspect|index: look inside TFRecord files and write
 * DALI-compatible index files.
 *
 * inspect reads each file with the reader's SKIP policy, so that one bad
 * record does not hide the next, and lists every bad record the reader
 * reports through its on_skip callback.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "alloc.h"
#include "ctl.h"
#include "example.h"
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
    "\n"
    "Run 'ferryctl records inspect --help' or 'ferryctl records index "
    "--help'.\n";

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

/* Prints `err` as "ferryctl records index: PATH: message", leaving out the
 * path when the message already names it. */
static void index_error(const char *path, const ferry_error_t *err, int rc) {
  const char *msg = err->msg[0] ? err->msg : ferry_strerror(rc);
  if (strstr(msg, path) != NULL)
    fprintf(stderr, "ferryctl records index: %s (%s)\n", msg,
            ferry_err_name(rc));
  else
    fprintf(stderr, "ferryctl records index: %s: %s (%s)\n", path, msg,
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
    index_error(path, &err, c);
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
    index_error(path, &err, rc);
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
    index_error(out, &err, rc);
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
  fprintf(stderr, "ferryctl records: unknown command '%s'\n\n%s", sub,
          records_usage);
  return FERRYCTL_EXIT_USAGE;
}
