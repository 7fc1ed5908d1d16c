/* libFuzzer target for the zero-copy Example parser.
 *
 * Parses the input, then reads every feature back through find, bytes,
 * int64s and floats. protobuf-c is the cross-check: when ferry accepts,
 * protobuf-c must accept too (except for one protobuf-c merge bug, see
 * pbc_merge_bug) and agree on the distinct keys and, for each key, on the
 * last entry's kind and values. When protobuf-c accepts and ferry rejects,
 * the reason must be one where ferry is documented stricter. The rewrite
 * of bytes values must fail where the parser fails and otherwise write a
 * record the parser accepts (the input itself when nothing is replaced).
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "example.h"
#include "tensorflow/core/example/example.pb-c.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                           \
  do {                                                                        \
    if (!(cond))                                                              \
      __builtin_trap();                                                       \
  } while (0)

/* A walk over a record ferry accepted, so its framing is trusted. */
static unsigned wire_next(const uint8_t **p, uint32_t *num,
                          const uint8_t **body, size_t *len) {
  uint64_t tag = 0, v = 0;
  int shift = 0;
  unsigned wire;

  do {
    tag |= (uint64_t)(**p & 0x7f) << (shift & 63);
    shift += 7;
  } while (*(*p)++ & 0x80);
  *num = (uint32_t)(tag >> 3);
  wire = (unsigned)(tag & 7);
  *body = *p;
  if (wire == 0) {
    while (*(*p)++ & 0x80)
      ;
  } else if (wire == 1 || wire == 5) {
    *p += wire == 1 ? 8 : 4;
  } else {
    shift = 0;
    do {
      v |= (uint64_t)(**p & 0x7f) << (shift & 63);
      shift += 7;
    } while (*(*p)++ & 0x80);
    *body = *p;
    *p += v;
  }
  *len = (size_t)(*p - *body);
  return wire;
}

typedef bool (*field_fn)(const uint8_t *, size_t, void *);

static bool each_field(const uint8_t *p, size_t len, uint32_t want,
                       field_fn fn, void *arg) {
  const uint8_t *end = p + len, *b;
  uint32_t num;
  size_t l;

  while (p < end)
    if (wire_next(&p, &num, &b, &l) == 2 && num == want && fn(b, l, arg))
      return true;
  return false;
}

static bool is_true(const uint8_t *b, size_t l, void *arg) {
  (void)b;
  (void)l;
  (void)arg;
  return true;
}

static bool has_kind(const uint8_t *p, size_t len) {
  return each_field(p, len, 1, is_true, NULL) ||
         each_field(p, len, 2, is_true, NULL) ||
         each_field(p, len, 3, is_true, NULL);
}

typedef struct {
  bool seen, kinded;
} merge_state_t;

static bool on_value(const uint8_t *b, size_t l, void *arg) {
  merge_state_t *st = arg;
  bool k = has_kind(b, l);

  if (st->seen && !st->kinded && !k)
    return true;
  st->seen = true;
  st->kinded |= k;
  return false;
}

static bool on_entry(const uint8_t *b, size_t l, void *arg) {
  merge_state_t st = {false, false};
  (void)arg;
  return each_field(b, l, 2, on_value, &st);
}

static bool on_features(const uint8_t *b, size_t l, void *arg) {
  (void)arg;
  return each_field(b, l, 1, on_entry, NULL);
}

/* protobuf-c 1.4 rejects a map entry whose value appears twice with no kind
 * in either (merge_messages looks up oneof case 0 and fails); protobuf and
 * ferry accept it. */
static bool pbc_merge_bug(const uint8_t *p, size_t len) {
  return each_field(p, len, 1, on_features, NULL);
}

/* Reads every value of `f` through the accessors. */
static void exercise(const ferry_feature_t *f) {
  static int64_t iv[256];
  static float fv[256];
  const uint8_t *d;
  size_t n, i, len;
  int rc;

  rc = ferry__feature_int64s(f, iv, 256, &n);
  CHECK(rc == (f->kind == FERRY_FEATURE_INT64 || f->kind == FERRY_FEATURE_NONE
                   ? 0 : FERRY_EFEATTYPE));
  if (rc == 0)
    CHECK(n == f->count);
  rc = ferry__feature_floats(f, fv, 256, &n);
  CHECK(rc == (f->kind == FERRY_FEATURE_FLOAT || f->kind == FERRY_FEATURE_NONE
                   ? 0 : FERRY_EFEATTYPE));
  if (rc == 0)
    CHECK(n == f->count);
  for (i = 0; f->kind == FERRY_FEATURE_BYTES && i < f->count && i < 1024;
       i++) {
    CHECK(ferry__feature_bytes(f, i, &d, &len) == 0);
    CHECK(len <= f->list_len && d >= f->list &&
          d + len <= f->list + f->list_len);
  }
  rc = ferry__feature_bytes(f, f->count, &d, &len);
  CHECK(rc == (f->kind == FERRY_FEATURE_BYTES || f->kind == FERRY_FEATURE_NONE
                   ? FERRY_ERANGE : FERRY_EFEATTYPE));
}

/* Compares ferry's feature with protobuf-c's value of the same key. */
static void compare(const ferry_feature_t *f, const Tensorflow__Feature *v) {
  static int64_t iv[256];
  static float fv[256];
  int kind = v ? (int)v->kind_case : 0;
  const uint8_t *d;
  size_t n, i, len;

  CHECK((int)f->kind == kind);
  if (kind == TENSORFLOW__FEATURE__KIND_BYTES_LIST) {
    CHECK(f->count == v->bytes_list->n_value);
    for (i = 0; i < f->count && i < 256; i++) {
      CHECK(ferry__feature_bytes(f, i, &d, &len) == 0);
      CHECK(len == v->bytes_list->value[i].len);
      CHECK(len == 0 || memcmp(d, v->bytes_list->value[i].data, len) == 0);
    }
  } else if (kind == TENSORFLOW__FEATURE__KIND_FLOAT_LIST) {
    CHECK(f->count == v->float_list->n_value);
    CHECK(ferry__feature_floats(f, fv, 256, &n) == 0);
    for (i = 0; i < n && i < 256; i++)
      CHECK(memcmp(&fv[i], &v->float_list->value[i], 4) == 0);
  } else if (kind == TENSORFLOW__FEATURE__KIND_INT64_LIST) {
    CHECK(f->count == v->int64_list->n_value);
    CHECK(ferry__feature_int64s(f, iv, 256, &n) == 0);
    for (i = 0; i < n && i < 256; i++)
      CHECK(iv[i] == v->int64_list->value[i]);
  } else {
    CHECK(f->count == 0);
  }
}

/* The rewrite's callback: keeps even-numbered values, replaces the others
 * with one more byte (a length may cross a varint size). */
static int grow_odd(void *ctx, const char *key, size_t key_len,
                    size_t index, const uint8_t *value, size_t len,
                    uint8_t **replacement, size_t *replacement_len) {
  (void)ctx;
  (void)key;
  (void)key_len;
  if (index % 2 == 0)
    return 0;
  *replacement = ferry__malloc(len + 1);
  if (*replacement == NULL)
    return FERRY_ENOMEM;
  if (len > 0)
    memcpy(*replacement, value, len);
  (*replacement)[len] = 'x';
  *replacement_len = len + 1;
  return 0;
}

static int keep_all(void *ctx, const char *key, size_t key_len,
                    size_t index, const uint8_t *value, size_t len,
                    uint8_t **replacement, size_t *replacement_len) {
  (void)ctx;
  (void)key;
  (void)key_len;
  (void)index;
  (void)value;
  (void)len;
  (void)replacement;
  (void)replacement_len;
  return 0;
}

/* ferry__example_rewrite_bytes fails exactly where the parser failed
 * (`rc`), gives the input back when nothing is replaced, and writes a
 * record the parser accepts when values are replaced. */
static void check_rewrite(const uint8_t *data, size_t size, int rc) {
  static ferry_example_t ex;
  uint8_t *out;
  size_t out_len;
  int r = ferry__example_rewrite_bytes(data, size, keep_all, NULL, &out,
                                       &out_len, NULL);

  CHECK(r == rc || r == FERRY_ENOMEM || rc == FERRY_ENOMEM);
  if (r == 0) {
    CHECK(out_len == size && (size == 0 || memcmp(out, data, size) == 0));
    ferry__free(out);
  }
  r = ferry__example_rewrite_bytes(data, size, grow_odd, NULL, &out,
                                   &out_len, NULL);
  CHECK(r == rc || r == FERRY_ENOMEM || rc == FERRY_ENOMEM);
  if (r == 0) {
    r = ferry__example_parse(&ex, out, out_len, NULL);
    CHECK(r == 0 || r == FERRY_ENOMEM);
    ferry__free(out);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static ferry_example_t ex; /* reused, as a worker reuses it */
  ferry_error_t err;
  Tensorflow__Example *pe;
  bool nul = false;
  size_t i, j;
  int rc;

  rc = ferry__example_parse(&ex, data, size, &err);
  check_rewrite(data, size, rc);
  pe = tensorflow__example__unpack(NULL, size, data);
  if (rc != 0) {
    CHECK(ex.n == 0);
    CHECK(rc == FERRY_EVARINT || rc == FERRY_EWIRETYPE ||
          rc == FERRY_EOVERRUN || rc == FERRY_ENOMEM);
    CHECK(strncmp(err.msg, "Example: byte ", 14) == 0);
    /* protobuf-c takes a non-minimal tag for field 0 and truncates tags
     * over 32 bits; ferry rejects both. */
    if (pe != NULL)
      CHECK(strstr(err.msg, "field number 0") != NULL ||
            strstr(err.msg, "does not fit 32 bits") != NULL);
    if (pe != NULL)
      tensorflow__example__free_unpacked(pe, NULL);
    return 0;
  }

  for (i = 0; i < ex.n; i++) {
    const ferry_feature_t *f = &ex.features[i];
    char *key;
    CHECK(f->key >= (const char *)data &&
          f->key + f->key_len <= (const char *)data + size);
    exercise(f);
    if (memchr(f->key, 0, f->key_len) != NULL) {
      nul = true;
      continue;
    }
    key = malloc(f->key_len + 1);
    memcpy(key, f->key, f->key_len);
    key[f->key_len] = '\0';
    CHECK(ferry__example_find(&ex, key) == f);
    free(key);
  }

  CHECK(pe != NULL || pbc_merge_bug(data, size));
  if (pe == NULL)
    return 0;
  /* protobuf-c keeps keys as C strings, cut at a NUL: skip those. */
  if (!nul) {
    size_t nent = pe->features ? pe->features->n_feature : 0, distinct = 0;
    for (i = 0; i < nent; i++) {
      const Tensorflow__Features__FeatureEntry *e = pe->features->feature[i];
      const ferry_feature_t *f;
      bool last = true;
      for (j = i + 1; j < nent && last; j++)
        last = strcmp(e->key, pe->features->feature[j]->key) != 0;
      if (!last)
        continue;
      distinct++;
      f = ferry__example_find(&ex, e->key);
      CHECK(f != NULL);
      compare(f, e->value);
    }
    CHECK(distinct == ex.n);
  }
  tensorflow__example__free_unpacked(pe, NULL);
  return 0;
}
