/* Tests for the zero-copy Example parser (common/src/records/example.c).
 *
 * protobuf-c's generated code is the oracle: random Examples are packed
 * with it and every feature ferry finds is compared with what protobuf-c
 * unpacks. Handmade wire bytes cover what protobuf-c never writes
 * (unpacked lists, unknown fields, odd orders, repeats) and each kind of
 * damage, with the exact error code and byte offset. The conformance test
 * walks the real TFRecord files of ../shared/testdata itself (the TFRecord
 * reader is another component) and checks the MANIFEST's facts.
 */
#include <criterion/criterion.h>

#include <dirent.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "alloc.h"
#include "example.h"
#include "tensorflow/core/example/example.pb-c.h"
#include "varint.h"

/* ---- Wire-format builder (plain malloc: the tests count ferry's
 * allocations, not their own). ---- */

typedef struct {
  uint8_t *p;
  size_t n;
  size_t cap;
} wb_t;

static void wb_put(wb_t *b, const void *d, size_t n) {
  if (b->n + n > b->cap) {
    b->cap = (b->n + n) * 2 + 64;
    b->p = realloc(b->p, b->cap);
    cr_assert_not_null(b->p);
  }
  if (n > 0)
    memcpy(b->p + b->n, d, n);
  b->n += n;
}

static void wb_varint(wb_t *b, uint64_t v) {
  uint8_t tmp[FERRY_VARINT_MAX];
  wb_put(b, tmp, ferry__varint_put(tmp, v));
}

static void wb_tag(wb_t *b, uint32_t field, unsigned wire) {
  wb_varint(b, (uint64_t)field << 3 | wire);
}

static void wb_lenf(wb_t *b, uint32_t field, const void *d, size_t n) {
  wb_tag(b, field, 2);
  wb_varint(b, n);
  wb_put(b, d, n);
}

static void wb_sub(wb_t *b, uint32_t field, const wb_t *sub) {
  wb_lenf(b, field, sub->p, sub->n);
}

static void wb_str(wb_t *b, uint32_t field, const char *s) {
  wb_lenf(b, field, s, strlen(s));
}

static void wb_fixed32(wb_t *b, uint32_t field, uint32_t v) {
  uint8_t le[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16),
                   (uint8_t)(v >> 24)};
  wb_tag(b, field, 5);
  wb_put(b, le, 4);
}

static void wb_fixed64(wb_t *b, uint32_t field, uint64_t v) {
  uint8_t le[8];
  int i;

  for (i = 0; i < 8; i++)
    le[i] = (uint8_t)(v >> (8 * i));
  wb_tag(b, field, 1);
  wb_put(b, le, 8);
}

static void wb_free(wb_t *b) {
  free(b->p);
  memset(b, 0, sizeof(*b));
}

static uint32_t fbits(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return u;
}

/* Adds one unknown field of each skippable wire type. */
static void wb_unknowns(wb_t *b, uint32_t field) {
  wb_tag(b, field, 0);
  wb_varint(b, UINT64_MAX);
  wb_fixed64(b, field + 1, 0x0102030405060708ull);
  wb_str(b, field + 2, "junk");
  wb_fixed32(b, field + 3, 0xdeadbeef);
}

/* Appends an entry {key, value = feature}. */
static void wb_entry(wb_t *features, const char *key, const wb_t *feature) {
  wb_t e = {0};

  wb_str(&e, 1, key);
  wb_sub(&e, 2, feature);
  wb_sub(features, 1, &e);
  wb_free(&e);
}

/* Feature{int64_list{packed values}}. */
static void wb_int64_feature(wb_t *feature, const int64_t *v, size_t n) {
  wb_t list = {0}, packed = {0};
  size_t i;

  for (i = 0; i < n; i++)
    wb_varint(&packed, (uint64_t)v[i]);
  wb_sub(&list, 1, &packed);
  wb_sub(feature, 3, &list);
  wb_free(&list);
  wb_free(&packed);
}

static void wb_bytes_feature(wb_t *feature, const char *s) {
  wb_t list = {0};

  wb_str(&list, 1, s);
  wb_sub(feature, 1, &list);
  wb_free(&list);
}

/* ---- Oracle comparison ---- */

static Tensorflow__Example *oracle(const uint8_t *buf, size_t len) {
  return tensorflow__example__unpack(NULL, len, buf);
}

static int64_t get_int64(const ferry_feature_t *f, size_t i) {
  int64_t v[64];
  size_t n = 0;

  cr_assert_lt(i, 64);
  cr_assert_eq(ferry__feature_int64s(f, v, 64, &n), 0);
  cr_assert_lt(i, n);
  return v[i];
}

static void compare_feature(const ferry_feature_t *f,
                            const Tensorflow__Feature *v, const char *key) {
  int kind = v ? (int)v->kind_case : 0;
  size_t n = 0, i, total;

  cr_assert_eq((int)f->kind, kind, "key '%s': kind %d, oracle %d", key,
               (int)f->kind, kind);
  if (kind == TENSORFLOW__FEATURE__KIND_BYTES_LIST) {
    const Tensorflow__BytesList *l = v->bytes_list;
    const uint8_t *d;
    size_t dl;
    cr_assert_eq(f->count, l->n_value, "key '%s'", key);
    for (i = 0; i < l->n_value; i++) {
      cr_assert_eq(ferry__feature_bytes(f, i, &d, &dl), 0);
      cr_assert_eq(dl, l->value[i].len, "key '%s' value %zu", key, i);
      if (dl > 0)
        cr_assert_eq(memcmp(d, l->value[i].data, dl), 0);
    }
    cr_assert_eq(ferry__feature_bytes(f, l->n_value, &d, &dl), FERRY_ERANGE);
    cr_assert_eq(ferry__feature_int64s(f, NULL, 0, &n), FERRY_EFEATTYPE);
    cr_assert_eq(ferry__feature_floats(f, NULL, 0, &n), FERRY_EFEATTYPE);
  } else if (kind == TENSORFLOW__FEATURE__KIND_FLOAT_LIST) {
    const Tensorflow__FloatList *l = v->float_list;
    float *out = malloc((l->n_value + 1) * sizeof(float));
    cr_assert_eq(f->count, l->n_value, "key '%s'", key);
    cr_assert_eq(ferry__feature_floats(f, out, l->n_value, &n), 0);
    cr_assert_eq(n, l->n_value);
    for (i = 0; i < n; i++)
      cr_assert_eq(fbits(out[i]), fbits(l->value[i]), "key '%s' [%zu]", key,
                   i);
    /* A short buffer gets a prefix and the full count. */
    memset(out, 0, (l->n_value + 1) * sizeof(float));
    cr_assert_eq(ferry__feature_floats(f, out, l->n_value / 2, &total), 0);
    cr_assert_eq(total, l->n_value);
    for (i = 0; i < l->n_value / 2; i++)
      cr_assert_eq(fbits(out[i]), fbits(l->value[i]));
    cr_assert_eq(fbits(out[l->n_value / 2]), 0);
    cr_assert_eq(ferry__feature_int64s(f, NULL, 0, &n), FERRY_EFEATTYPE);
    free(out);
  } else if (kind == TENSORFLOW__FEATURE__KIND_INT64_LIST) {
    const Tensorflow__Int64List *l = v->int64_list;
    int64_t *out = malloc((l->n_value + 1) * sizeof(int64_t));
    cr_assert_eq(f->count, l->n_value, "key '%s'", key);
    cr_assert_eq(ferry__feature_int64s(f, out, l->n_value, &n), 0);
    cr_assert_eq(n, l->n_value);
    for (i = 0; i < n; i++)
      cr_assert_eq(out[i], l->value[i], "key '%s' [%zu]", key, i);
    memset(out, 0, (l->n_value + 1) * sizeof(int64_t));
    cr_assert_eq(ferry__feature_int64s(f, out, l->n_value / 2, &total), 0);
    cr_assert_eq(total, l->n_value);
    for (i = 0; i < l->n_value / 2; i++)
      cr_assert_eq(out[i], l->value[i]);
    cr_assert_eq(out[l->n_value / 2], 0);
    cr_assert_eq(ferry__feature_floats(f, NULL, 0, &n), FERRY_EFEATTYPE);
    free(out);
  } else {
    const uint8_t *d;
    size_t dl;
    cr_assert_eq(f->count, 0);
    cr_assert_eq(ferry__feature_int64s(f, NULL, 0, &n), 0);
    cr_assert_eq(n, 0);
    cr_assert_eq(ferry__feature_floats(f, NULL, 0, &n), 0);
    cr_assert_eq(n, 0);
    cr_assert_eq(ferry__feature_bytes(f, 0, &d, &dl), FERRY_ERANGE);
  }
}

static bool has_nul(const ferry_feature_t *f) {
  return memchr(f->key, 0, f->key_len) != NULL;
}

/* Compares ferry's parse of an accepted record with protobuf-c's: the same
 * distinct keys, and for each key the last entry's value. */
static void compare_parsed(const ferry_example_t *ex,
                           const Tensorflow__Example *pe) {
  size_t nent = pe->features ? pe->features->n_feature : 0;
  size_t i, j, distinct = 0;

  for (i = 0; i < nent; i++) {
    const Tensorflow__Features__FeatureEntry *e = pe->features->feature[i];
    const ferry_feature_t *f;
    bool last = true;
    for (j = i + 1; j < nent && last; j++)
      last = strcmp(e->key, pe->features->feature[j]->key) != 0;
    if (!last)
      continue;
    distinct++;
    f = ferry__example_find(ex, e->key);
    cr_assert_not_null(f, "key '%s' not found", e->key);
    cr_assert_eq(f->key_len, strlen(e->key));
    compare_feature(f, e->value, e->key);
  }
  cr_assert_eq(ex->n, distinct, "ferry %zu keys, oracle %zu", ex->n,
               distinct);
}

/* Parses with both; both must accept; compares everything. */
static void check_oracle(const uint8_t *buf, size_t len) {
  ferry_example_t ex;
  ferry_error_t err = {0};
  Tensorflow__Example *pe = oracle(buf, len);
  int rc;

  ferry__example_init(&ex);
  rc = ferry__example_parse(&ex, buf, len, &err);
  cr_assert_eq(rc, 0, "ferry rejects: %s", err.msg);
  cr_assert_not_null(pe, "protobuf-c rejects a record ferry accepts");
  compare_parsed(&ex, pe);
  tensorflow__example__free_unpacked(pe, NULL);
  ferry__example_close(&ex);
}

/* ---- Random Examples built with protobuf-c ---- */

static uint64_t rng_next(uint64_t *s) {
  /* splitmix64: deterministic for a fixed seed. */
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static size_t rng_below(uint64_t *s, size_t n) {
  return (size_t)(rng_next(s) % n);
}

typedef struct {
  void **p;
  size_t n, cap;
} arena_t;

static void *arena_alloc(arena_t *a, size_t size) {
  void *p = calloc(1, size ? size : 1);
  cr_assert_not_null(p);
  if (a->n == a->cap) {
    a->cap = a->cap ? a->cap * 2 : 64;
    a->p = realloc(a->p, a->cap * sizeof(void *));
  }
  a->p[a->n++] = p;
  return p;
}

static void arena_free(arena_t *a) {
  size_t i;
  for (i = 0; i < a->n; i++)
    free(a->p[i]);
  free(a->p);
  memset(a, 0, sizeof(*a));
}

static const char *const key_pool[] = {
    "image/encoded", "image/class/label", "label", "image/width",
    "image/height", "a", "ab", "", "x", "image/object/bbox/xmin"};

static size_t rand_count(uint64_t *s) {
  size_t r = rng_below(s, 100);
  if (r < 15)
    return 0;
  if (r < 90)
    return 1 + rng_below(s, 8);
  if (r < 98)
    return rng_below(s, 200);
  return rng_below(s, 3000);
}

static Tensorflow__Feature *rand_feature(uint64_t *s, arena_t *a) {
  Tensorflow__Feature *f = arena_alloc(a, sizeof(*f));
  size_t n = rand_count(s), i;

  tensorflow__feature__init(f);
  switch (rng_below(s, 10)) {
  case 0:
    break; /* no kind */
  case 1:
  case 2:
  case 3: {
    Tensorflow__BytesList *l = arena_alloc(a, sizeof(*l));
    tensorflow__bytes_list__init(l);
    l->n_value = n;
    l->value = arena_alloc(a, n * sizeof(*l->value));
    for (i = 0; i < n; i++) {
      size_t len = rng_below(s, 20) == 0 ? 0 : rng_below(s, 60);
      size_t k;
      if (rng_below(s, 200) == 0)
        len = 100000 + rng_below(s, 100000);
      l->value[i].len = len;
      l->value[i].data = arena_alloc(a, len);
      for (k = 0; k < len; k++)
        l->value[i].data[k] = (uint8_t)rng_next(s);
    }
    f->kind_case = TENSORFLOW__FEATURE__KIND_BYTES_LIST;
    f->bytes_list = l;
    break;
  }
  case 4:
  case 5:
  case 6: {
    Tensorflow__FloatList *l = arena_alloc(a, sizeof(*l));
    tensorflow__float_list__init(l);
    l->n_value = n;
    l->value = arena_alloc(a, n * sizeof(float));
    for (i = 0; i < n; i++) {
      uint32_t u = (uint32_t)rng_next(s);
      if (rng_below(s, 2))
        l->value[i] = (float)((int)rng_below(s, 2000) - 1000) / 8.0f;
      else
        memcpy(&l->value[i], &u, 4);
    }
    f->kind_case = TENSORFLOW__FEATURE__KIND_FLOAT_LIST;
    f->float_list = l;
    break;
  }
  default: {
    Tensorflow__Int64List *l = arena_alloc(a, sizeof(*l));
    tensorflow__int64_list__init(l);
    l->n_value = n;
    l->value = arena_alloc(a, n * sizeof(int64_t));
    for (i = 0; i < n; i++) {
      /* Two statements: the order of the two draws must be fixed. */
      int64_t v = (int64_t)rng_next(s);
      l->value[i] = v >> rng_below(s, 64);
    }
    f->kind_case = TENSORFLOW__FEATURE__KIND_INT64_LIST;
    f->int64_list = l;
    break;
  }
  }
  return f;
}

/* A random Example packed by protobuf-c; the caller frees the buffer. */
static uint8_t *rand_example(uint64_t *s, size_t *len) {
  arena_t a = {0};
  Tensorflow__Example ex = TENSORFLOW__EXAMPLE__INIT;
  Tensorflow__Features fs = TENSORFLOW__FEATURES__INIT;
  size_t n = rng_below(s, 25), i, k;
  uint8_t *buf;

  fs.n_feature = n;
  fs.feature = arena_alloc(&a, n * sizeof(*fs.feature));
  for (i = 0; i < n; i++) {
    Tensorflow__Features__FeatureEntry *e = arena_alloc(&a, sizeof(*e));
    tensorflow__features__feature_entry__init(e);
    if (rng_below(s, 3) == 0) {
      e->key = (char *)key_pool[rng_below(s, 10)];
    } else {
      size_t kl = 1 + rng_below(s, 30);
      e->key = arena_alloc(&a, kl + 1);
      for (k = 0; k < kl; k++)
        e->key[k] = (char)(1 + rng_below(s, 255)); /* no NUL */
    }
    e->value = rng_below(s, 12) == 0 ? NULL : rand_feature(s, &a);
    fs.feature[i] = e;
  }
  ex.features = rng_below(s, 15) == 0 ? NULL : &fs;
  *len = tensorflow__example__get_packed_size(&ex);
  buf = malloc(*len + 1);
  cr_assert_eq(tensorflow__example__pack(&ex, buf), *len);
  arena_free(&a);
  return buf;
}

Test(example, random_vs_protobuf_c) {
  uint64_t seed = 20261129;
  int iter;

  for (iter = 0; iter < 3000; iter++) {
    size_t len;
    uint8_t *buf = rand_example(&seed, &len);
    check_oracle(buf, len);
    free(buf);
  }
}

/* Damaged random records: ferry accepts exactly when protobuf-c does
 * (except where ferry is documented stricter), and when both accept they
 * agree on every value. Every prefix of a record is tried too. */
static bool ferry_stricter(const ferry_error_t *err) {
  /* protobuf-c accepts a tag whose field number is 0 if its first byte has
   * the continuation bit, and silently truncates tags over 32 bits. */
  return strstr(err->msg, "field number 0") != NULL ||
         strstr(err->msg, "does not fit 32 bits") != NULL;
}

/* protobuf-c 1.4 fails to merge two values of one map entry when neither
 * has a kind (merge_messages looks up oneof case 0 and gives up), while
 * protobuf and ferry accept it. True when a record that ferry accepted has
 * such an entry. The walk trusts the framing, which ferry checked. */
static unsigned wire_next(const uint8_t **p, uint32_t *num,
                          const uint8_t **body, size_t *len) {
  uint64_t tag = 0, v = 0;
  int shift = 0;
  unsigned wire;

  do
    tag |= (uint64_t)(**p & 0x7f) << shift, shift += 7;
  while (*(*p)++ & 0x80);
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
    do
      v |= (uint64_t)(**p & 0x7f) << shift, shift += 7;
    while (*(*p)++ & 0x80);
    *body = *p;
    *p += v;
  }
  *len = (size_t)(*p - *body);
  return wire;
}

/* Calls fn on the body of every length-delimited field `want` of the
 * message [p, p + len); stops early when fn returns true. */
static bool each_field(const uint8_t *p, size_t len, uint32_t want,
                       bool (*fn)(const uint8_t *, size_t, void *),
                       void *arg) {
  const uint8_t *end = p + len, *b;
  uint32_t num;
  size_t l;

  while (p < end)
    if (wire_next(&p, &num, &b, &l) == 2 && num == want && fn(b, l, arg))
      return true;
  return false;
}

static bool is_true(const uint8_t *b, size_t l, void *arg) {
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
  return each_field(b, l, 2, on_value, &st);
}

static bool on_features(const uint8_t *b, size_t l, void *arg) {
  return each_field(b, l, 1, on_entry, NULL);
}

static bool pbc_merge_bug(const uint8_t *p, size_t len) {
  return each_field(p, len, 1, on_features, NULL);
}

Test(example, protobuf_c_merge_bug) {
  static const uint8_t rec[] = {0x0a, 0x06, 0x0a, 0x04, 0x12, 0x00, 0x12, 0x00};
  static const uint8_t ok[] = {0x0a, 0x08, 0x0a, 0x06, 0x12, 0x00,
                               0x12, 0x02, 0x1a, 0x00};
  ferry_example_t ex;

  ferry__example_init(&ex);
  cr_assert_eq(ferry__example_parse(&ex, rec, sizeof(rec), NULL), 0);
  cr_assert_eq(ex.n, 1);
  cr_assert_eq(ex.features[0].kind, FERRY_FEATURE_NONE);
  cr_assert_null(oracle(rec, sizeof(rec)));
  cr_assert(pbc_merge_bug(rec, sizeof(rec)));
  cr_assert(!pbc_merge_bug(ok, sizeof(ok)));
  check_oracle(ok, sizeof(ok));
  ferry__example_close(&ex);
}

static int differential(const uint8_t *buf, size_t len, ferry_example_t *ex) {
  ferry_error_t err = {0};
  Tensorflow__Example *pe = oracle(buf, len);
  int rc = ferry__example_parse(ex, buf, len, &err);
  size_t i;
  bool nul = false;

  if (rc == 0) {
    cr_assert(pe != NULL || pbc_merge_bug(buf, len),
              "ferry accepts what protobuf-c rejects");
    if (pe == NULL)
      return rc;
    for (i = 0; i < ex->n; i++)
      nul |= has_nul(&ex->features[i]);
    /* protobuf-c cuts keys at a NUL byte; skip those records. */
    if (!nul)
      compare_parsed(ex, pe);
  } else {
    cr_assert_eq(ex->n, 0);
    cr_assert(rc == FERRY_EVARINT || rc == FERRY_EWIRETYPE ||
              rc == FERRY_EOVERRUN, "code %d", rc);
    cr_assert_eq(strncmp(err.msg, "Example: byte ", 14), 0, "%s", err.msg);
    if (pe != NULL)
      cr_assert(ferry_stricter(&err), "protobuf-c accepts, ferry: %s",
                err.msg);
  }
  if (pe != NULL)
    tensorflow__example__free_unpacked(pe, NULL);
  return rc;
}

Test(example, mutations_vs_protobuf_c) {
  uint64_t seed = 77;
  ferry_example_t ex;
  int iter, k;
  size_t accepted = 0, rejected = 0;

  ferry__example_init(&ex);
  for (iter = 0; iter < 1500; iter++) {
    size_t len, pos;
    uint8_t *buf = rand_example(&seed, &len);
    if (len > 4000) {
      free(buf);
      continue;
    }
    if (iter % 10 == 0 && len < 1500)
      for (pos = 0; pos < len; pos++)
        *(differential(buf, pos, &ex) == 0 ? &accepted : &rejected) += 1;
    for (k = 0; k < 8 && len > 0; k++) {
      uint8_t *m = malloc(len);
      int flips = 1 + (int)rng_below(&seed, 3), j;
      memcpy(m, buf, len);
      for (j = 0; j < flips; j++) {
        pos = rng_below(&seed, len);
        switch (rng_below(&seed, 4)) {
        case 0:
          m[pos] = (uint8_t)rng_next(&seed);
          break;
        case 1:
          m[pos] ^= (uint8_t)(1u << rng_below(&seed, 8));
          break;
        case 2:
          m[pos] = (uint8_t)(m[pos] + 1);
          break;
        default:
          m[pos] = (uint8_t)(m[pos] - 1);
          break;
        }
      }
      *(differential(m, len, &ex) == 0 ? &accepted : &rejected) += 1;
      free(m);
    }
    free(buf);
  }
  ferry__example_close(&ex);
  /* Both outcomes must be well represented for the test to mean much. */
  cr_assert_gt(accepted, 1000, "accepted %zu", accepted);
  cr_assert_gt(rejected, 1000, "rejected %zu", rejected);
  printf("example: mutations: %zu accepted, %zu rejected\n", accepted,
         rejected);
}

/* ---- Handmade wire bytes ---- */

static void parse_ok(ferry_example_t *ex, const wb_t *b) {
  ferry_error_t err = {0};
  int rc = ferry__example_parse(ex, b->p, b->n, &err);
  cr_assert_eq(rc, 0, "%s", err.msg);
}

Test(example, unpacked_and_mixed_lists) {
  wb_t ints = {0}, floats = {0}, packed = {0}, feat = {0}, fs = {0},
       rec = {0};
  ferry_example_t ex;
  const ferry_feature_t *f;
  int64_t iv[8];
  float fv[8];
  size_t n, i;

  /* Int64List: unpacked 1, packed [-2, 300], unpacked INT64_MIN, packed
   * [5]. */
  wb_tag(&ints, 1, 0);
  wb_varint(&ints, 1);
  wb_varint(&packed, (uint64_t)-2);
  wb_varint(&packed, 300);
  wb_sub(&ints, 1, &packed);
  wb_tag(&ints, 1, 0);
  wb_varint(&ints, (uint64_t)INT64_MIN);
  packed.n = 0;
  wb_varint(&packed, 5);
  wb_sub(&ints, 1, &packed);
  wb_sub(&feat, 3, &ints);
  wb_entry(&fs, "ints", &feat);
  /* FloatList: unpacked 1.5, packed [2.5, -3], unpacked 4. */
  feat.n = 0;
  packed.n = 0;
  wb_fixed32(&floats, 1, fbits(1.5f));
  {
    uint32_t a = fbits(2.5f), c = fbits(-3.0f);
    uint8_t le[8];
    for (i = 0; i < 4; i++) {
      le[i] = (uint8_t)(a >> (8 * i));
      le[4 + i] = (uint8_t)(c >> (8 * i));
    }
    wb_lenf(&floats, 1, le, 8);
  }
  wb_fixed32(&floats, 1, fbits(4.0f));
  wb_sub(&feat, 2, &floats);
  wb_entry(&fs, "floats", &feat);
  wb_sub(&rec, 1, &fs);

  ferry__example_init(&ex);
  parse_ok(&ex, &rec);
  cr_assert_eq(ex.n, 2);
  f = ferry__example_find(&ex, "ints");
  cr_assert_not_null(f);
  cr_assert_eq(f->kind, FERRY_FEATURE_INT64);
  cr_assert_eq(f->count, 5);
  cr_assert_eq(ferry__feature_int64s(f, iv, 8, &n), 0);
  cr_assert_eq(n, 5);
  cr_assert_eq(iv[0], 1);
  cr_assert_eq(iv[1], -2);
  cr_assert_eq(iv[2], 300);
  cr_assert_eq(iv[3], INT64_MIN);
  cr_assert_eq(iv[4], 5);
  /* A short buffer stops early but still reports the count. */
  iv[2] = 99;
  cr_assert_eq(ferry__feature_int64s(f, iv, 2, &n), 0);
  cr_assert_eq(n, 5);
  cr_assert_eq(iv[2], 99);
  f = ferry__example_find(&ex, "floats");
  cr_assert_not_null(f);
  cr_assert_eq(f->count, 4);
  cr_assert_eq(ferry__feature_floats(f, fv, 8, &n), 0);
  cr_assert_eq(n, 4);
  cr_assert_float_eq(fv[0], 1.5f, 0);
  cr_assert_float_eq(fv[1], 2.5f, 0);
  cr_assert_float_eq(fv[2], -3.0f, 0);
  cr_assert_float_eq(fv[3], 4.0f, 0);
  cr_assert_eq(ferry__feature_floats(f, fv, 3, &n), 0);
  cr_assert_eq(n, 4);
  check_oracle(rec.p, rec.n);
  ferry__example_close(&ex);
  wb_free(&ints);
  wb_free(&floats);
  wb_free(&packed);
  wb_free(&feat);
  wb_free(&fs);
  wb_free(&rec);
}

/* The same content, with unknown fields at every level, parses the same. */
Test(example, unknown_fields_every_level) {
  wb_t bl = {0}, il = {0}, feat = {0}, entry = {0}, fs = {0}, rec = {0},
       packed = {0};
  ferry_example_t ex;
  const ferry_feature_t *f;
  const uint8_t *d;
  size_t dl, n;
  int64_t v[4];

  wb_unknowns(&bl, 2);
  wb_str(&bl, 1, "first");
  wb_unknowns(&bl, 7);
  wb_str(&bl, 1, "second");
  wb_unknowns(&feat, 4);
  wb_sub(&feat, 1, &bl);
  wb_unknowns(&feat, 9);
  wb_unknowns(&entry, 3);
  wb_str(&entry, 1, "img");
  wb_unknowns(&entry, 20);
  wb_sub(&entry, 2, &feat);
  wb_unknowns(&entry, 100000);
  wb_unknowns(&fs, 2);
  wb_sub(&fs, 1, &entry);
  wb_unknowns(&fs, 6);
  feat.n = 0;
  wb_varint(&packed, 42);
  wb_unknowns(&il, 2);
  wb_sub(&il, 1, &packed);
  wb_unknowns(&il, 8);
  wb_sub(&feat, 3, &il);
  wb_entry(&fs, "label", &feat);
  wb_unknowns(&rec, 2);
  wb_sub(&rec, 1, &fs);
  wb_unknowns(&rec, 536870900); /* the largest field numbers */

  ferry__example_init(&ex);
  parse_ok(&ex, &rec);
  cr_assert_eq(ex.n, 2);
  f = ferry__example_find(&ex, "img");
  cr_assert_not_null(f);
  cr_assert_eq(f->kind, FERRY_FEATURE_BYTES);
  cr_assert_eq(f->count, 2);
  cr_assert_eq(ferry__feature_bytes(f, 0, &d, &dl), 0);
  cr_assert_eq(dl, 5);
  cr_assert_eq(memcmp(d, "first", 5), 0);
  /* Zero copy: the value points into the record. */
  cr_assert(d > rec.p && d < rec.p + rec.n);
  cr_assert_eq(ferry__feature_bytes(f, 1, &d, &dl), 0);
  cr_assert_eq(dl, 6);
  cr_assert_eq(memcmp(d, "second", 6), 0);
  cr_assert_eq(ferry__feature_bytes(f, 2, &d, &dl), FERRY_ERANGE);
  f = ferry__example_find(&ex, "label");
  cr_assert_not_null(f);
  cr_assert_eq(ferry__feature_int64s(f, v, 4, &n), 0);
  cr_assert_eq(n, 1);
  cr_assert_eq(v[0], 42);
  check_oracle(rec.p, rec.n);
  ferry__example_close(&ex);
  wb_free(&bl);
  wb_free(&il);
  wb_free(&feat);
  wb_free(&entry);
  wb_free(&fs);
  wb_free(&rec);
  wb_free(&packed);
}

Test(example, entry_orders_repeats_and_merges) {
  wb_t feat = {0}, entry = {0}, fs = {0}, fs2 = {0}, rec = {0}, e2 = {0};
  ferry_example_t ex;
  const ferry_feature_t *f;
  const uint8_t *d;
  size_t dl;
  int64_t one = 1, two = 2, three = 3;

  /* Value before key. */
  wb_int64_feature(&feat, &one, 1);
  wb_sub(&entry, 2, &feat);
  wb_str(&entry, 1, "rev");
  wb_sub(&fs, 1, &entry);
  /* A repeated key: the later entry wins, even with another kind. */
  feat.n = 0;
  wb_int64_feature(&feat, &two, 1);
  wb_entry(&fs, "dup", &feat);
  feat.n = 0;
  wb_bytes_feature(&feat, "later");
  wb_entry(&fs, "dup", &feat);
  /* An entry without a key, and one without a value. */
  entry.n = 0;
  feat.n = 0;
  wb_int64_feature(&feat, &three, 1);
  wb_sub(&entry, 2, &feat);
  wb_sub(&fs, 1, &entry);
  entry.n = 0;
  wb_str(&entry, 1, "novalue");
  wb_sub(&fs, 1, &entry);
  /* A key twice inside one entry: the last wins. */
  entry.n = 0;
  wb_str(&entry, 1, "old");
  wb_str(&entry, 1, "new");
  wb_sub(&fs, 1, &entry);
  /* A oneof twice in a Feature: the last list wins. */
  feat.n = 0;
  {
    wb_t il = {0}, bl = {0}, p = {0};
    wb_varint(&p, 7);
    wb_sub(&il, 1, &p);
    wb_str(&bl, 1, "b");
    wb_sub(&feat, 3, &il);
    wb_sub(&feat, 1, &bl);
    wb_free(&il);
    wb_free(&bl);
    wb_free(&p);
  }
  wb_entry(&fs, "oneof", &feat);
  /* A value twice in an entry: a second value without a kind keeps the
   * first one's list; one with a kind replaces it. */
  entry.n = 0;
  feat.n = 0;
  wb_str(&entry, 1, "merge");
  wb_int64_feature(&feat, &two, 1);
  wb_sub(&entry, 2, &feat);
  wb_lenf(&entry, 2, "", 0);
  wb_sub(&fs, 1, &entry);
  entry.n = 0;
  wb_str(&entry, 1, "merge2");
  wb_sub(&entry, 2, &feat);
  feat.n = 0;
  wb_bytes_feature(&feat, "z");
  wb_sub(&entry, 2, &feat);
  wb_sub(&fs, 1, &entry);
  /* An empty Feature (the `12 00` of the TFX taxi data). */
  entry.n = 0;
  wb_str(&entry, 1, "empty");
  wb_lenf(&entry, 2, "", 0);
  wb_sub(&fs, 1, &entry);
  wb_sub(&rec, 1, &fs);
  /* A second `features` field: its entries add to the first's, and its
   * "rev" replaces the earlier one. */
  feat.n = 0;
  wb_int64_feature(&feat, &three, 1);
  wb_entry(&fs2, "second", &feat);
  wb_entry(&fs2, "rev", &feat);
  wb_sub(&rec, 1, &fs2);

  ferry__example_init(&ex);
  parse_ok(&ex, &rec);
  cr_assert_eq(ex.n, 10);
  f = ferry__example_find(&ex, "rev");
  cr_assert_not_null(f);
  cr_assert_eq(get_int64(f, 0), 3);
  f = ferry__example_find(&ex, "dup");
  cr_assert_not_null(f);
  cr_assert_eq(f->kind, FERRY_FEATURE_BYTES);
  cr_assert_eq(ferry__feature_bytes(f, 0, &d, &dl), 0);
  cr_assert_eq(dl, 5);
  cr_assert_eq(memcmp(d, "later", 5), 0);
  f = ferry__example_find(&ex, "");
  cr_assert_not_null(f);
  cr_assert_eq(f->key_len, 0);
  cr_assert_eq(get_int64(f, 0), 3);
  f = ferry__example_find(&ex, "novalue");
  cr_assert_not_null(f);
  cr_assert_eq(f->kind, FERRY_FEATURE_NONE);
  cr_assert_eq(f->count, 0);
  cr_assert_null(ferry__example_find(&ex, "old"));
  cr_assert_not_null(ferry__example_find(&ex, "new"));
  f = ferry__example_find(&ex, "oneof");
  cr_assert_not_null(f);
  cr_assert_eq(f->kind, FERRY_FEATURE_BYTES);
  cr_assert_eq(f->count, 1);
  f = ferry__example_find(&ex, "merge");
  cr_assert_not_null(f);
  cr_assert_eq(f->kind, FERRY_FEATURE_INT64);
  cr_assert_eq(get_int64(f, 0), 2);
  f = ferry__example_find(&ex, "merge2");
  cr_assert_not_null(f);
  cr_assert_eq(f->kind, FERRY_FEATURE_BYTES);
  f = ferry__example_find(&ex, "empty");
  cr_assert_not_null(f);
  cr_assert_eq(f->kind, FERRY_FEATURE_NONE);
  cr_assert_str_eq(ferry__feature_kind_name(f->kind), "none");
  f = ferry__example_find(&ex, "second");
  cr_assert_not_null(f);
  cr_assert_eq(get_int64(f, 0), 3);
  check_oracle(rec.p, rec.n);
  ferry__example_close(&ex);
  wb_free(&feat);
  wb_free(&entry);
  wb_free(&fs);
  wb_free(&fs2);
  wb_free(&rec);
  wb_free(&e2);
}

Test(example, find_is_exact) {
  wb_t feat = {0}, fs = {0}, rec = {0};
  ferry_example_t ex;
  int64_t v = 1;

  wb_int64_feature(&feat, &v, 1);
  wb_entry(&fs, "ab", &feat);
  wb_entry(&fs, "abc", &feat);
  wb_entry(&fs, "b", &feat);
  wb_sub(&rec, 1, &fs);
  ferry__example_init(&ex);
  parse_ok(&ex, &rec);
  cr_assert_eq(ex.n, 3);
  cr_assert_null(ferry__example_find(&ex, "a"));
  cr_assert_null(ferry__example_find(&ex, ""));
  cr_assert_null(ferry__example_find(&ex, "abcd"));
  cr_assert_null(ferry__example_find(&ex, "B"));
  cr_assert_null(ferry__example_find(&ex, NULL));
  cr_assert_eq(ferry__example_find(&ex, "ab")->key_len, 2);
  cr_assert_eq(ferry__example_find(&ex, "abc")->key_len, 3);
  cr_assert_eq(ferry__example_find(&ex, "b")->key_len, 1);
  /* An empty record and a record without features have no keys. */
  cr_assert_eq(ferry__example_parse(&ex, rec.p, 0, NULL), 0);
  cr_assert_eq(ex.n, 0);
  cr_assert_null(ferry__example_find(&ex, "ab"));
  cr_assert_eq(ferry__example_parse(&ex, (const uint8_t *)"\x0a\x00", 2, NULL),
               0);
  cr_assert_eq(ex.n, 0);
  ferry__example_close(&ex);
  wb_free(&feat);
  wb_free(&fs);
  wb_free(&rec);
}

Test(example, accessor_types) {
  wb_t feat = {0}, fs = {0}, rec = {0}, fl = {0};
  ferry_example_t ex;
  const ferry_feature_t *f;
  const uint8_t *d;
  size_t dl, n;
  int64_t iv[2];
  float fv[2];

  wb_bytes_feature(&feat, "s");
  wb_entry(&fs, "bytes", &feat);
  feat.n = 0;
  wb_fixed32(&fl, 1, fbits(0.5f));
  wb_sub(&feat, 2, &fl);
  wb_entry(&fs, "float", &feat);
  wb_sub(&rec, 1, &fs);
  ferry__example_init(&ex);
  parse_ok(&ex, &rec);
  f = ferry__example_find(&ex, "bytes");
  cr_assert_eq(ferry__feature_int64s(f, iv, 2, &n), FERRY_EFEATTYPE);
  cr_assert_eq(ferry__feature_floats(f, fv, 2, &n), FERRY_EFEATTYPE);
  cr_assert_eq(ferry__feature_bytes(f, 1, &d, &dl), FERRY_ERANGE);
  f = ferry__example_find(&ex, "float");
  cr_assert_eq(ferry__feature_bytes(f, 0, &d, &dl), FERRY_EFEATTYPE);
  cr_assert_eq(ferry__feature_int64s(f, iv, 2, &n), FERRY_EFEATTYPE);
  cr_assert_eq(ferry__feature_floats(f, fv, 2, &n), 0);
  cr_assert_eq(n, 1);
  cr_assert_float_eq(fv[0], 0.5f, 0);
  cr_assert_str_eq(ferry__feature_kind_name(FERRY_FEATURE_BYTES), "bytes");
  cr_assert_str_eq(ferry__feature_kind_name(FERRY_FEATURE_FLOAT), "float");
  cr_assert_str_eq(ferry__feature_kind_name(FERRY_FEATURE_INT64), "int64");
  cr_assert_str_eq(ferry__feature_kind_name((ferry_feature_kind_t)9),
                   "unknown");
  ferry__example_close(&ex);
  wb_free(&feat);
  wb_free(&fs);
  wb_free(&rec);
  wb_free(&fl);
}

/* ---- Malformed records ---- */

/* Parses `len` bytes that must fail with `code`, a message starting
 * "Example: byte <at>: <path>", and (when oracle_rejects) a NULL from
 * protobuf-c. */
static void expect_bad(const void *buf, size_t len, int code, size_t at,
                       const char *path, bool oracle_rejects) {
  ferry_example_t ex;
  ferry_error_t err = {0};
  char want[256];
  int rc;

  ferry__example_init(&ex);
  rc = ferry__example_parse(&ex, buf, len, &err);
  cr_assert_eq(rc, code, "code %d (%s), want %d: %s", rc, ferry_err_name(rc),
               code, err.msg);
  cr_assert_eq(err.code, code);
  cr_assert_eq(ex.n, 0);
  snprintf(want, sizeof(want), "Example: byte %zu: %s: ", at, path);
  cr_assert_eq(strncmp(err.msg, want, strlen(want)), 0,
               "message '%s', want prefix '%s'", err.msg, want);
  /* Without an error object the code is the same. */
  cr_assert_eq(ferry__example_parse(&ex, buf, len, NULL), code);
  if (oracle_rejects) {
    Tensorflow__Example *pe = oracle(buf, len);
    cr_assert_null(pe, "protobuf-c accepts a malformed record (%s)", err.msg);
  }
  ferry__example_close(&ex);
}

#define BAD(code, at, path, bytes)                                            \
  expect_bad(bytes, sizeof(bytes) - 1, code, at, path, true)

Test(example, bad_varints) {
  BAD(FERRY_EVARINT, 0, "top level", "\x8a");
  BAD(FERRY_EVARINT, 1, "field 2", "\x10\x80\x80");
  /* An 11-byte varint. */
  BAD(FERRY_EVARINT, 1, "field 2",
      "\x10\x80\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01");
  /* A 10-byte varint is fine. */
  expect_bad("\x10\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01\x8a", 12,
             FERRY_EVARINT, 11, "top level", true);
  /* A tag longer than 5 bytes, a tag over 32 bits, a length longer than 5
   * bytes. */
  BAD(FERRY_EVARINT, 0, "top level", "\x80\x80\x80\x80\x80\x01");
  expect_bad("\x80\x80\x80\x80\x10\x00", 6, FERRY_EVARINT, 0, "top level",
             false);
  BAD(FERRY_EVARINT, 1, "field 2", "\x12\x80\x80\x80\x80\x80\x00");
  /* Inside an entry: the key's length varint runs off the entry. */
  BAD(FERRY_EVARINT, 5, "features.feature[0].key", "\x0a\x04\x0a\x02\x0a\x80");
  /* Packed int64: a varint running off the list, and one of 11 bytes. */
  BAD(FERRY_EVARINT, 11, "features.feature[0].value.int64_list.value",
      "\x0a\x0a\x0a\x08\x12\x06\x1a\x04\x0a\x02\x01\x81\x0a\x00");
  BAD(FERRY_EVARINT, 10, "features.feature[0].value.int64_list.value",
      "\x0a\x13\x0a\x11\x12\x0f\x1a\x0d\x0a\x0b"
      "\x80\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01");
  /* Unpacked int64 running off the list. */
  BAD(FERRY_EVARINT, 9, "features.feature[0].value.int64_list.value",
      "\x0a\x09\x0a\x07\x12\x05\x1a\x03\x08\x80\x80");
}

Test(example, bad_wire_types) {
  BAD(FERRY_EWIRETYPE, 0, "features", "\x0e");
  BAD(FERRY_EWIRETYPE, 0, "field 3", "\x1f");
  BAD(FERRY_EWIRETYPE, 0, "features", "\x0b\x0c");
  BAD(FERRY_EWIRETYPE, 0, "field 2", "\x14");
  BAD(FERRY_EWIRETYPE, 4, "features.feature[0].key", "\x0a\x03\x0a\x01\x0f");
  BAD(FERRY_EWIRETYPE, 6, "features.feature[0].value.field 5",
      "\x0a\x05\x0a\x03\x12\x01\x2b");
  BAD(FERRY_EWIRETYPE, 8, "features.feature[0].value.bytes_list.field 2",
      "\x0a\x07\x0a\x05\x12\x03\x0a\x01\x16");
  /* Field number 0. */
  BAD(FERRY_EWIRETYPE, 0, "top level", "\x00");
  BAD(FERRY_EWIRETYPE, 2, "top level", "\x0a\x00\x02\x00");
  /* A known field with the wrong wire type. */
  BAD(FERRY_EWIRETYPE, 0, "features", "\x08\x01");
  BAD(FERRY_EWIRETYPE, 2, "features.feature[0]", "\x0a\x02\x08\x00");
  BAD(FERRY_EWIRETYPE, 4, "features.feature[0].value",
      "\x0a\x04\x0a\x02\x10\x01");
  BAD(FERRY_EWIRETYPE, 6, "features.feature[0].value.int64_list",
      "\x0a\x06\x0a\x04\x12\x02\x18\x01");
  BAD(FERRY_EWIRETYPE, 8, "features.feature[0].value.bytes_list.value",
      "\x0a\x08\x0a\x06\x12\x04\x0a\x02\x08\x01");
  BAD(FERRY_EWIRETYPE, 8, "features.feature[0].value.float_list.value",
      "\x0a\x08\x0a\x06\x12\x04\x12\x02\x08\x01");
  BAD(FERRY_EWIRETYPE, 8, "features.feature[0].value.int64_list.value",
      "\x0a\x0b\x0a\x09\x12\x07\x1a\x05\x0d\x01\x02\x03\x04");
}

Test(example, lengths_past_the_end) {
  BAD(FERRY_EOVERRUN, 0, "features", "\x0a\x05\x0a\x00");
  BAD(FERRY_EOVERRUN, 2, "features.feature[0]", "\x0a\x02\x0a\x05");
  BAD(FERRY_EOVERRUN, 4, "features.feature[0].key", "\x0a\x04\x0a\x02\x0a\x09");
  BAD(FERRY_EOVERRUN, 4, "features.feature[0].value",
      "\x0a\x04\x0a\x02\x12\x09");
  BAD(FERRY_EOVERRUN, 6, "features.feature[0].value.int64_list",
      "\x0a\x06\x0a\x04\x12\x02\x1a\x07");
  BAD(FERRY_EOVERRUN, 8, "features.feature[0].value.bytes_list.value",
      "\x0a\x08\x0a\x06\x12\x04\x0a\x02\x0a\x05");
  BAD(FERRY_EOVERRUN, 0, "field 9", "\x4a\x01");
  /* A length the size of 2^35 - 1, over protobuf's 2 GiB limit. */
  BAD(FERRY_EOVERRUN, 0, "field 2", "\x12\xff\xff\xff\xff\x7f");
  /* A length inside a message that would fit the record but not the
   * message: the entry ends at byte 6 although the record goes on. */
  BAD(FERRY_EOVERRUN, 4, "features.feature[0].key",
      "\x0a\x04\x0a\x02\x0a\x01\x22\x01\x78");
  /* A truncated fixed32 in an unpacked float list, a truncated fixed64. */
  BAD(FERRY_EOVERRUN, 8, "features.feature[0].value.float_list.value",
      "\x0a\x09\x0a\x07\x12\x05\x12\x03\x0d\x00\x00");
  BAD(FERRY_EOVERRUN, 0, "field 2", "\x11\x01\x02\x03");
  /* A packed float list of 7 bytes. */
  BAD(FERRY_EOVERRUN, 8, "features.feature[0].value.float_list.value",
      "\x0a\x0f\x0a\x0d\x12\x0b\x12\x09\x0a\x07\x00\x00\x80\x3f\x00\x00\x00");
}

/* The message names the entry by position and says where its parent
 * ends. */
Test(example, error_message_format) {
  wb_t fs = {0}, rec = {0}, feat = {0}, entry = {0};
  ferry_example_t ex;
  ferry_error_t err = {0};
  int64_t v = 1;
  size_t at, end;
  char want[256];

  wb_int64_feature(&feat, &v, 1);
  wb_entry(&fs, "a", &feat);
  wb_entry(&fs, "b", &feat);
  wb_str(&entry, 1, "c");
  wb_tag(&entry, 2, 2);
  wb_varint(&entry, 900);
  wb_put(&entry, "\x1a\x00", 2);
  wb_sub(&fs, 1, &entry);
  wb_sub(&rec, 1, &fs);
  end = rec.n;
  at = end - 5;
  ferry__example_init(&ex);
  cr_assert_eq(ferry__example_parse(&ex, rec.p, rec.n, &err), FERRY_EOVERRUN);
  snprintf(want, sizeof(want),
           "Example: byte %zu: features.feature[2].value: length 900 runs "
           "past the end of the enclosing message (ends at byte %zu)",
           at, end);
  cr_assert_str_eq(err.msg, want);
  ferry__example_close(&ex);
  wb_free(&fs);
  wb_free(&rec);
  wb_free(&feat);
  wb_free(&entry);
}

/* The three non-protobuf payloads of magenta's TFRecord test file. */
Test(example, magenta_payloads) {
  BAD(FERRY_EWIRETYPE, 2, "field 13", "hello world");
  BAD(FERRY_EOVERRUN, 0, "field 6", "12345");
  BAD(FERRY_EWIRETYPE, 0, "field 14", "success");
}

/* ---- Allocation behaviour and scale ---- */

static void build_many(wb_t *rec, size_t nkeys, size_t ndup) {
  wb_t fs = {0}, feat = {0};
  char key[32];
  size_t i;

  for (i = 0; i < nkeys + ndup; i++) {
    int64_t v = (int64_t)i;
    feat.n = 0;
    wb_int64_feature(&feat, &v, 1);
    snprintf(key, sizeof(key), "key/%zu", i % nkeys);
    wb_entry(&fs, key, &feat);
  }
  wb_sub(rec, 1, &fs);
  wb_free(&fs);
  wb_free(&feat);
}

static void check_no_alloc(const wb_t *rec) {
  ferry_example_t ex;
  ferry_alloc_stats_t before, after;
  int i;

  ferry__example_init(&ex);
  parse_ok(&ex, rec);
  ferry__alloc_stats(&before);
  for (i = 0; i < 1000; i++)
    cr_assert_eq(ferry__example_parse(&ex, rec->p, rec->n, NULL), 0);
  ferry__alloc_stats(&after);
  cr_assert_eq(after.blocks, before.blocks);
  cr_assert_eq(after.bytes, before.bytes);
  ferry__example_close(&ex);
  ferry__alloc_stats(&after);
  cr_assert_lt(after.blocks, before.blocks);
}

Test(example, no_allocation_in_steady_state) {
  wb_t small = {0}, big = {0};

  build_many(&small, 5, 0);
  build_many(&big, 100, 20);
  check_no_alloc(&small);
  check_no_alloc(&big);
  wb_free(&small);
  wb_free(&big);
}

Test(example, out_of_memory) {
  wb_t rec = {0};
  ferry_example_t ex;
  ferry_error_t err = {0};

  build_many(&rec, 3, 0);
  ferry__example_init(&ex);
  ferry__alloc_fail_after(0);
  cr_assert_eq(ferry__example_parse(&ex, rec.p, rec.n, &err), FERRY_ENOMEM);
  ferry__alloc_fail_reset();
  cr_assert_eq(ex.n, 0);
  cr_assert_neq(strstr(err.msg, "out of memory"), NULL, "%s", err.msg);
  parse_ok(&ex, &rec);
  cr_assert_eq(ex.n, 3);
  ferry__example_close(&ex);
  wb_free(&rec);
}

/* Many keys go through the hash index: last-wins and lookups still hold
 * for 200,000 entries (a linear scan per entry would take about 10^10 key
 * comparisons here). */
Test(example, many_keys) {
  wb_t rec = {0};
  ferry_example_t ex;
  char key[32];
  size_t nkeys = 100000, i;

  build_many(&rec, nkeys, nkeys);
  ferry__example_init(&ex);
  parse_ok(&ex, &rec);
  cr_assert_eq(ex.n, nkeys);
  for (i = 0; i < nkeys; i += 997) {
    const ferry_feature_t *f;
    snprintf(key, sizeof(key), "key/%zu", i);
    f = ferry__example_find(&ex, key);
    cr_assert_not_null(f, "%s", key);
    cr_assert_eq(get_int64(f, 0), (int64_t)(i + nkeys));
  }
  cr_assert_null(ferry__example_find(&ex, "key/100000"));
  /* A small record after a big one drops back to the linear scan. */
  wb_free(&rec);
  build_many(&rec, 4, 4);
  parse_ok(&ex, &rec);
  cr_assert_eq(ex.n, 4);
  cr_assert_eq(get_int64(ferry__example_find(&ex, "key/3"), 0), 7);
  check_oracle(rec.p, rec.n);
  ferry__example_close(&ex);
  wb_free(&rec);
}

/* Parse speed of a 32x32x3 raw-image Example: image (3072 bytes), label
 * and id. Reports records/s; asserts only the parse result. */
Test(example, speed_raw_image) {
  wb_t fs = {0}, feat = {0}, rec = {0};
  uint8_t img[3072];
  ferry_example_t ex;
  struct timespec t0, t1;
  int64_t label = 7, id = 123456789, v;
  size_t i, n, iters = 200000;
  const uint8_t *d;
  double s;

  for (i = 0; i < sizeof(img); i++)
    img[i] = (uint8_t)i;
  {
    wb_t bl = {0};
    wb_lenf(&bl, 1, img, sizeof(img));
    wb_sub(&feat, 1, &bl);
    wb_free(&bl);
  }
  wb_entry(&fs, "image", &feat);
  feat.n = 0;
  wb_int64_feature(&feat, &label, 1);
  wb_entry(&fs, "label", &feat);
  feat.n = 0;
  wb_int64_feature(&feat, &id, 1);
  wb_entry(&fs, "id", &feat);
  wb_sub(&rec, 1, &fs);
  ferry__example_init(&ex);
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (i = 0; i < iters; i++) {
    const ferry_feature_t *f;
    cr_assert_eq(ferry__example_parse(&ex, rec.p, rec.n, NULL), 0);
    f = ferry__example_find(&ex, "image");
    cr_assert_eq(ferry__feature_bytes(f, 0, &d, &n), 0);
    cr_assert_eq(n, 3072);
    cr_assert_eq(
        ferry__feature_int64s(ferry__example_find(&ex, "label"), &v, 1, &n), 0);
    cr_assert_eq(v, 7);
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
  printf("example: %zu-byte raw-image record: parse+find+get %.0f records/s\n",
         rec.n, (double)iters / s);
  ferry__example_close(&ex);
  wb_free(&fs);
  wb_free(&feat);
  wb_free(&rec);
}

/* The fuzz seeds (tests/fuzz/records/corpus/example, written by
 * make_example_seeds.py) are valid Examples on which both parsers agree. */
Test(example, fuzz_seeds) {
  char dirpath[1024], path[1300];
  DIR *dir;
  struct dirent *de;
  size_t n = 0;

  snprintf(dirpath, sizeof(dirpath), "%s/tests/fuzz/records/corpus/example",
           FERRY_SOURCE_DIR);
  dir = opendir(dirpath);
  cr_assert_not_null(dir, "%s", dirpath);
  while ((de = readdir(dir)) != NULL) {
    FILE *fp;
    uint8_t buf[4096];
    size_t len;
    if (de->d_name[0] == '.')
      continue;
    snprintf(path, sizeof(path), "%s/%s", dirpath, de->d_name);
    fp = fopen(path, "rb");
    cr_assert_not_null(fp, "%s", path);
    len = fread(buf, 1, sizeof(buf), fp);
    cr_assert(feof(fp), "%s is over 4 KB", path);
    fclose(fp);
    check_oracle(buf, len);
    n++;
  }
  closedir(dir);
  cr_assert_geq(n, 5);
}

/* ---- Conformance with real TFRecord files ---- */

typedef struct {
  uint8_t *data;
  size_t len;
  size_t pos;
} tfr_t;

static const char *testdata_dir(void) {
  const char *env = getenv("FERRY_TESTDATA_DIR");
  return env && *env ? env : FERRY_TESTDATA_DIR;
}

static bool tfr_open(tfr_t *t, const char *name) {
  char path[1024];
  FILE *fp;
  struct stat st;

  snprintf(path, sizeof(path), "%s/tfrecord/%s", testdata_dir(), name);
  memset(t, 0, sizeof(*t));
  if (stat(path, &st) != 0)
    return false;
  fp = fopen(path, "rb");
  cr_assert_not_null(fp, "%s", path);
  t->len = (size_t)st.st_size;
  t->data = malloc(t->len + 1);
  cr_assert_eq(fread(t->data, 1, t->len, fp), t->len);
  fclose(fp);
  return true;
}

/* The next record's payload; the framing (8-byte LE length, 4-byte CRC,
 * data, 4-byte CRC) is walked without checking CRCs. Stops at a truncated
 * or implausible frame. */
static bool tfr_next(tfr_t *t, const uint8_t **rec, size_t *len) {
  uint64_t n = 0;
  int i;

  if (t->len - t->pos < 12)
    return false;
  for (i = 0; i < 8; i++)
    n |= (uint64_t)t->data[t->pos + i] << (8 * i);
  if (n > t->len - t->pos - 12 || t->len - t->pos - 12 - n < 4)
    return false;
  *rec = t->data + t->pos + 12;
  *len = (size_t)n;
  t->pos += 12 + (size_t)n + 4;
  return true;
}

static bool testdata_present(void) {
  char path[1024];
  struct stat st;

  snprintf(path, sizeof(path), "%s/tfrecord", testdata_dir());
  return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static const ferry_feature_t *need(const ferry_example_t *ex, const char *key,
                                   ferry_feature_kind_t kind, size_t count) {
  const ferry_feature_t *f = ferry__example_find(ex, key);
  cr_assert_not_null(f, "missing key %s", key);
  cr_assert_eq(f->kind, kind, "%s: kind %s", key,
               ferry__feature_kind_name(f->kind));
  if (count != SIZE_MAX)
    cr_assert_eq(f->count, count, "%s: count %zu", key, f->count);
  return f;
}

static int64_t int64_of(const ferry_example_t *ex, const char *key) {
  return get_int64(need(ex, key, FERRY_FEATURE_INT64, 1), 0);
}

static size_t bytes_of(const ferry_example_t *ex, const char *key,
                       const uint8_t **d) {
  size_t len;
  cr_assert_eq(
      ferry__feature_bytes(need(ex, key, FERRY_FEATURE_BYTES, 1), 0, d, &len),
      0);
  return len;
}

static bool bytes_is(const ferry_example_t *ex, const char *key,
                     const char *s) {
  const uint8_t *d;
  size_t len = bytes_of(ex, key, &d);
  return len == strlen(s) && memcmp(d, s, len) == 0;
}

/* File-specific facts from MANIFEST.md and reports/tfrecord_records.txt,
 * checked on record `i` of `name`. Returns the expected number of records
 * for the file, or -1 when nothing is known. */
static long check_facts(const char *name, size_t i, const ferry_example_t *ex,
                        int rc) {
  const uint8_t *d;
  size_t len, n, j;

  if (strcmp(name, "nitishkiitk_test.tfrecord") == 0) {
    static const int64_t angle[] = {-5, -1, -5, -3, -2, -3, 1, -2, -1, 1};
    static const size_t jpeg[] = {45649, 50786, 52886, 52825, 54404,
                                  54355, 42134, 36565, 51258, 46605};
    cr_assert_eq(rc, 0);
    cr_assert_eq(ex->n, 7);
    cr_assert_eq(int64_of(ex, "image/class/label"), 0);
    cr_assert_eq(int64_of(ex, "image/width"), 256);
    cr_assert_eq(int64_of(ex, "image/height"), 768);
    cr_assert_eq(int64_of(ex, "image/angle"), angle[i]);
    cr_assert(bytes_is(ex, "image/format", "jpg"));
    len = bytes_of(ex, "image/filename", &d);
    cr_assert(len > 3 && memcmp(d, "E:\\", 3) == 0);
    len = bytes_of(ex, "image/encoded", &d);
    cr_assert_eq(len, jpeg[i]);
    cr_assert(d[0] == 0xff && d[1] == 0xd8);
    return 10;
  }
  if (strcmp(name, "shapes_test.record") == 0) {
    static const int64_t first[] = {9, 8, 4, 7, 2, 7, 4, 5, 3, 6};
    static const char *const floats[] = {
        "image/object/bbox/xmin", "image/object/bbox/xmax",
        "image/object/bbox/ymin", "image/object/bbox/ymax"};
    int64_t label, w, h;
    cr_assert_eq(rc, 0);
    cr_assert_eq(ex->n, 12);
    label = int64_of(ex, "image/object/class/label");
    cr_assert(label >= 1 && label <= 9);
    if (i < 10)
      cr_assert_eq(label, first[i], "record %zu", i);
    if (i == 168)
      cr_assert_eq(label, 5);
    w = int64_of(ex, "image/width");
    h = int64_of(ex, "image/height");
    cr_assert(w >= 48 && w <= 250 && h >= 60 && h <= 250);
    for (j = 0; j < 4; j++)
      need(ex, floats[j], FERRY_FEATURE_FLOAT, 1);
    need(ex, "image/object/class/text", FERRY_FEATURE_BYTES, 1);
    need(ex, "image/format", FERRY_FEATURE_BYTES, 1);
    need(ex, "image/filename", FERRY_FEATURE_BYTES, 1);
    need(ex, "image/source_id", FERRY_FEATURE_BYTES, 1);
    bytes_of(ex, "image/encoded", &d);
    cr_assert(d[0] == 0xff && d[1] == 0xd8);
    return 169;
  }
  if (strcmp(name, "tfmodels_pets_examples.record") == 0) {
    static const int64_t label[] = {11, 33, 18, 22, 25, 20, 13, 37, 31, 30};
    static const int64_t w[] = {300, 500, 500, 300, 271,
                                500, 500, 300, 348, 500};
    static const int64_t h[] = {225, 375, 333, 225, 300,
                                352, 333, 187, 500, 333};
    static const size_t jpeg[] = {17828, 146502, 78199, 11405, 21553,
                                  138424, 131420, 10470, 220977, 90854};
    cr_assert_eq(rc, 0);
    cr_assert_eq(ex->n, 16);
    cr_assert_eq(int64_of(ex, "image/object/class/label"), label[i]);
    cr_assert_eq(int64_of(ex, "image/width"), w[i]);
    cr_assert_eq(int64_of(ex, "image/height"), h[i]);
    cr_assert_eq(bytes_of(ex, "image/encoded", &d), jpeg[i]);
    cr_assert_eq(bytes_of(ex, "image/key/sha256", &d), 64);
    need(ex, "image/object/difficult", FERRY_FEATURE_INT64, 1);
    need(ex, "image/object/truncated", FERRY_FEATURE_INT64, 1);
    cr_assert(bytes_is(ex, "image/object/view", "Frontal"));
    need(ex, "image/object/bbox/xmin", FERRY_FEATURE_FLOAT, 1);
    return 10;
  }
  if (strcmp(name, "fruit_classifier_test.tfrecords") == 0) {
    cr_assert_eq(rc, 0);
    cr_assert_eq(ex->n, 5);
    cr_assert_eq(bytes_of(ex, "image_raw", &d), 30000);
    cr_assert_eq(int64_of(ex, "height"), 100);
    cr_assert_eq(int64_of(ex, "width"), 100);
    cr_assert_eq(int64_of(ex, "depth"), 3);
    cr_assert_eq(int64_of(ex, "label"), i < 5 ? 0 : 1);
    return 10;
  }
  if (strcmp(name, "ptdata_example.tfrecord") == 0 ||
      strcmp(name, "ptdata_sequence_example.tfrecord") == 0) {
    int64_t iv[10];
    float fv[10];
    cr_assert_eq(rc, 0);
    cr_assert_eq(ex->n, 3);
    cr_assert_eq(ferry__feature_int64s(
                     need(ex, "x_int", FERRY_FEATURE_INT64, 10), iv, 10, &n),
                 0);
    cr_assert_eq(ferry__feature_floats(
                     need(ex, "x_float", FERRY_FEATURE_FLOAT, 10), fv, 10, &n),
                 0);
    for (j = 0; j < 10; j++) {
      cr_assert_eq(iv[j], (int64_t)(100 * i + 10 * j));
      cr_assert_float_eq(fv[j], (float)(10 * i + j), 0);
    }
    cr_assert(bytes_is(ex, "x_byte", "test str"));
    return 4;
  }
  if (strcmp(name, "tfmodels_snapshot_serengeti_sequence_examples.record") ==
      0) {
    cr_assert_eq(rc, 0);
    cr_assert_eq(int64_of(ex, "image/height"), 768);
    cr_assert_eq(int64_of(ex, "image/width"), 1024);
    cr_assert_eq(int64_of(ex, "image/channels"), 3);
    cr_assert(bytes_is(ex, "image/format", "JPG"));
    need(ex, "image/context_features", FERRY_FEATURE_FLOAT, 32912);
    cr_assert_null(ferry__example_find(ex, "image/encoded"));
    return 1;
  }
  if (strcmp(name, "zzw922cn_test.tfrecords") == 0) {
    static const double want[] = {1.0, 2.0, 3.5, 4.0, 5.0, 6.0};
    cr_assert_eq(rc, 0);
    cr_assert_eq(int64_of(ex, "feature1"), 10);
    cr_assert_eq(bytes_of(ex, "feature2", &d), 48);
    for (j = 0; j < 6; j++) {
      double x;
      memcpy(&x, d + 8 * j, 8);
      cr_assert_float_eq(x, want[j], 0);
    }
    return 1;
  }
  if (strcmp(name, "magenta_tfrecord_iterator_test.tfrecord") == 0) {
    static const int code[] = {FERRY_EWIRETYPE, FERRY_EOVERRUN,
                               FERRY_EWIRETYPE};
    cr_assert_eq(rc, code[i]);
    return 3;
  }
  if (strcmp(name, "jkh911208_test.tfrecords") == 0) {
    int64_t y;
    cr_assert_eq(rc, 0);
    cr_assert_eq(ex->n, 2);
    y = int64_of(ex, "y");
    cr_assert(y >= 0 && y <= 11);
    len = bytes_of(ex, "x", &d);
    cr_assert(len > 4 && memcmp(d + len - 4, ".png", 4) == 0);
    return 946;
  }
  if (strcmp(name, "DERIVED_tfds_mnist-test.tfrecord-00000-of-00001.first1000")
      == 0) {
    static const int64_t first[] = {2, 0, 4, 8, 7, 6, 0, 6, 3, 1};
    int64_t label;
    cr_assert_eq(rc, 0);
    cr_assert_eq(ex->n, 2);
    label = int64_of(ex, "label");
    if (i < 10)
      cr_assert_eq(label, first[i]);
    bytes_of(ex, "image", &d);
    cr_assert_eq(memcmp(d, "\x89PNG", 4), 0);
    return 1000;
  }
  if (strcmp(name, "deeplab_pascal_voc_seg_val-00000-of-00001.tfrecord") ==
      0) {
    cr_assert_eq(rc, 0);
    cr_assert_eq(ex->n, 8);
    cr_assert_eq(int64_of(ex, "image/channels"), 3);
    cr_assert_null(ferry__example_find(ex, "image/class/label"));
    if (i == 0)
      cr_assert(bytes_is(ex, "image/filename", "2007_000033"));
    cr_assert(bytes_is(ex, "image/format", "jpeg"));
    return 3;
  }
  if (strcmp(name, "coldrean_test.tfrecord") == 0) {
    const ferry_feature_t *f;
    int64_t v;
    cr_assert_eq(rc, 0);
    f = need(ex, "image/class/label", FERRY_FEATURE_BYTES, 1);
    cr_assert(bytes_is(ex, "image/class/label", "bankcard"));
    cr_assert_eq(ferry__feature_int64s(f, &v, 1, &n), FERRY_EFEATTYPE);
    return 5;
  }
  if (strcmp(name, "DAMAGED_crlf_pets_examples.record") == 0) {
    /* Record 0 lost its CR bytes: a truncated fixed32 inside. */
    cr_assert_neq(rc, 0);
    return 1;
  }
  if (strcmp(name, "DAMAGED_crlf_snapshot_serengeti_sequence_examples.record")
      == 0)
    return 0;
  return -1;
}

static int by_name(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

Test(example, conformance_testdata, .timeout = 240) {
  char dirpath[1024];
  char *names[64];
  size_t nnames = 0, k, total = 0;
  size_t checked = 0;
  DIR *dir;
  struct dirent *de;
  ferry_example_t ex;

  if (!testdata_present()) {
    printf("example: skipping conformance: no %s/tfrecord\n", testdata_dir());
    cr_skip_test("no testdata folder at %s", testdata_dir());
  }
  snprintf(dirpath, sizeof(dirpath), "%s/tfrecord", testdata_dir());
  dir = opendir(dirpath);
  cr_assert_not_null(dir);
  while ((de = readdir(dir)) != NULL && nnames < 64) {
    size_t l = strlen(de->d_name);
    if (de->d_name[0] == '.' || (l > 3 && !strcmp(de->d_name + l - 3, ".gz")) ||
        (l > 5 && !strcmp(de->d_name + l - 5, ".json")))
      continue;
    names[nnames++] = strdup(de->d_name);
  }
  closedir(dir);
  qsort(names, nnames, sizeof(names[0]), by_name);
  ferry__example_init(&ex);
  for (k = 0; k < nnames; k++) {
    tfr_t t;
    const uint8_t *rec;
    size_t len, i = 0;
    long want = -2;
    cr_assert(tfr_open(&t, names[k]));
    while (tfr_next(&t, &rec, &len)) {
      ferry_error_t err = {0};
      Tensorflow__Example *pe = oracle(rec, len);
      int rc = ferry__example_parse(&ex, rec, len, &err);
      /* ferry and protobuf-c agree on every record. */
      cr_assert_eq(rc == 0, pe != NULL, "%s record %zu: ferry %d (%s)",
                   names[k], i, rc, err.msg);
      if (pe != NULL) {
        compare_parsed(&ex, pe);
        tensorflow__example__free_unpacked(pe, NULL);
      }
      want = check_facts(names[k], i, &ex, rc);
      i++;
    }
    if (i == 0)
      want = check_facts(names[k], 0, &ex, -1);
    if (want >= 0) {
      cr_assert_eq(i, (size_t)want, "%s: %zu records", names[k], i);
      checked++;
    }
    total += i;
    free(t.data);
    free(names[k]);
  }
  ferry__example_close(&ex);
  cr_assert_geq(checked, 14, "only %zu files with known facts", checked);
  printf("example: conformance: %zu files, %zu records, %zu with facts\n",
         nnames, total, checked);
}

/* ---- Rewriting bytes values (ferry__example_rewrite_bytes) ---- */

/* The tests' replacement of a bytes value: none for some lengths, else a
 * value derived from it, longer (values under 1000 bytes) or shorter, so
 * that lengths cross varint sizes at every level. */
static bool replaced(size_t len) { return len % 5 != 4; }

/* The replacement (from ferry__malloc), or NULL when the value is kept or
 * memory ran out. */
static uint8_t *replacement_of(const uint8_t *v, size_t len, size_t index,
                               size_t *out_len) {
  size_t n, k;
  uint8_t *r;

  if (!replaced(len))
    return NULL;
  n = len < 1000 ? 2 * len + 1 + index % 7 : len / 3;
  r = ferry__malloc(n);
  if (r == NULL)
    return NULL;
  for (k = 0; k < n; k++)
    r[k] = (uint8_t)((len ? v[k % len] : 0x33) ^ 0x5a ^ k);
  *out_len = n;
  return r;
}

typedef struct {
  size_t calls;
  bool replace;
} rw_ctx_t;

static int rw_fn(void *ctx, const char *key, size_t key_len, size_t index,
                 const uint8_t *value, size_t value_len,
                 uint8_t **replacement, size_t *replacement_len) {
  rw_ctx_t *c = ctx;

  (void)key;
  (void)key_len;
  cr_assert_null(*replacement);
  c->calls++;
  if (!c->replace)
    return 0;
  *replacement = replacement_of(value, value_len, index, replacement_len);
  return *replacement == NULL && replaced(value_len) ? FERRY_ENOMEM : 0;
}

static void rewrite_ok(const uint8_t *in, size_t len, bool replace,
                       uint8_t **out, size_t *out_len, size_t *calls) {
  rw_ctx_t c = {0, replace};
  ferry_error_t err = {0};
  int rc = ferry__example_rewrite_bytes(in, len, rw_fn, &c, out, out_len,
                                        &err);

  cr_assert_eq(rc, 0, "%s", err.msg);
  cr_assert_not_null(*out);
  if (calls != NULL)
    *calls = c.calls;
}

/* Checks that `out` parses as `in` does with every value of every bytes
 * feature replaced by replacement_of, and every other feature's list
 * byte-identical. */
static void check_rewritten(const uint8_t *in, size_t len, const uint8_t *out,
                            size_t out_len) {
  ferry_example_t a, b;
  ferry_error_t err = {0};
  size_t i, j;

  ferry__example_init(&a);
  ferry__example_init(&b);
  cr_assert_eq(ferry__example_parse(&a, in, len, &err), 0, "%s", err.msg);
  cr_assert_eq(ferry__example_parse(&b, out, out_len, &err), 0,
               "the rewritten record does not parse: %s", err.msg);
  cr_assert_eq(a.n, b.n);
  for (i = 0; i < a.n; i++) {
    const ferry_feature_t *fa = &a.features[i], *fb = &b.features[i];
    cr_assert_eq(fa->key_len, fb->key_len);
    cr_assert_eq(memcmp(fa->key, fb->key, fa->key_len), 0);
    cr_assert_eq(fa->kind, fb->kind);
    cr_assert_eq(fa->count, fb->count);
    if (fa->kind != FERRY_FEATURE_BYTES) {
      cr_assert_eq(fa->list_len, fb->list_len);
      if (fa->list_len > 0)
        cr_assert_eq(memcmp(fa->list, fb->list, fa->list_len), 0);
      continue;
    }
    for (j = 0; j < fa->count; j++) {
      const uint8_t *da, *db;
      size_t la, lb, lr = 0;
      uint8_t *r;
      cr_assert_eq(ferry__feature_bytes(fa, j, &da, &la), 0);
      cr_assert_eq(ferry__feature_bytes(fb, j, &db, &lb), 0);
      r = replacement_of(da, la, j, &lr);
      cr_assert(r != NULL || !replaced(la));
      if (r == NULL) {
        cr_assert_eq(lb, la);
        cr_assert(la == 0 || memcmp(da, db, la) == 0);
      } else {
        cr_assert_eq(lb, lr, "value %zu: %zu bytes, want %zu", j, lb, lr);
        cr_assert_eq(memcmp(db, r, lr), 0);
      }
      ferry__free(r);
    }
  }
  ferry__example_close(&a);
  ferry__example_close(&b);
}

/* Every value protobuf-c packed, replaced in its unpacked message: the
 * rewritten record is exactly what protobuf-c packs for the new values
 * (its output is minimal, so every length was re-encoded as it should). */
static void check_vs_repacked(const uint8_t *in, size_t len,
                              const uint8_t *out, size_t out_len) {
  Tensorflow__Example *pe = oracle(in, len);
  ProtobufCBinaryData saved[4096];
  size_t ns = 0, i, j, want_len;
  uint8_t *want;

  cr_assert_not_null(pe);
  for (i = 0; pe->features && i < pe->features->n_feature; i++) {
    Tensorflow__Feature *v = pe->features->feature[i]->value;
    if (v == NULL || v->kind_case != TENSORFLOW__FEATURE__KIND_BYTES_LIST)
      continue;
    for (j = 0; j < v->bytes_list->n_value; j++) {
      ProtobufCBinaryData *d = &v->bytes_list->value[j];
      size_t rl = 0;
      uint8_t *r = replacement_of(d->data, d->len, j, &rl);
      cr_assert(r != NULL || !replaced(d->len));
      cr_assert_lt(ns, 4096);
      saved[ns++] = *d;
      if (r != NULL) {
        d->data = r;
        d->len = rl;
      }
    }
  }
  want_len = tensorflow__example__get_packed_size(pe);
  want = malloc(want_len + 1);
  cr_assert_eq(tensorflow__example__pack(pe, want), want_len);
  cr_assert_eq(out_len, want_len, "rewritten %zu bytes, repacked %zu",
               out_len, want_len);
  cr_assert_eq(memcmp(out, want, want_len), 0);
  free(want);
  ns = 0;
  for (i = 0; pe->features && i < pe->features->n_feature; i++) {
    Tensorflow__Feature *v = pe->features->feature[i]->value;
    if (v == NULL || v->kind_case != TENSORFLOW__FEATURE__KIND_BYTES_LIST)
      continue;
    for (j = 0; j < v->bytes_list->n_value; j++) {
      ProtobufCBinaryData *d = &v->bytes_list->value[j];
      if (d->data != saved[ns].data)
        ferry__free(d->data);
      *d = saved[ns++];
    }
  }
  tensorflow__example__free_unpacked(pe, NULL);
}

/* The number of bytes values protobuf-c finds. */
static size_t bytes_values(const uint8_t *buf, size_t len) {
  Tensorflow__Example *pe = oracle(buf, len);
  size_t i, n = 0;

  cr_assert_not_null(pe);
  for (i = 0; pe->features && i < pe->features->n_feature; i++) {
    Tensorflow__Feature *v = pe->features->feature[i]->value;
    if (v != NULL && v->kind_case == TENSORFLOW__FEATURE__KIND_BYTES_LIST)
      n += v->bytes_list->n_value;
  }
  tensorflow__example__free_unpacked(pe, NULL);
  return n;
}

Test(example, rewrite_random_vs_protobuf_c) {
  uint64_t seed = 4242;
  ferry_alloc_stats_t before, after;
  int iter;

  ferry__alloc_stats(&before);
  for (iter = 0; iter < 1500; iter++) {
    size_t len, out_len, calls;
    uint8_t *buf = rand_example(&seed, &len);
    uint8_t *out;

    /* Nothing replaced: the input, byte for byte, every value seen. */
    rewrite_ok(buf, len, false, &out, &out_len, &calls);
    cr_assert_eq(out_len, len);
    cr_assert(len == 0 || memcmp(out, buf, len) == 0, "iteration %d", iter);
    cr_assert_eq(calls, bytes_values(buf, len));
    ferry__free(out);

    rewrite_ok(buf, len, true, &out, &out_len, NULL);
    check_rewritten(buf, len, out, out_len);
    check_vs_repacked(buf, len, out, out_len);
    ferry__free(out);
    free(buf);
  }
  ferry__alloc_stats(&after);
  cr_assert_eq(after.blocks, before.blocks);
  cr_assert_eq(after.bytes, before.bytes);
}

/* Damaged records: the rewrite fails exactly where the parser fails, with
 * its code and message, and an accepted one rewrites right. Every prefix
 * of a record is tried too (a truncated record is an error, never a
 * crash), with and without replacements. */
static void rewrite_vs_parse(const uint8_t *buf, size_t len,
                             ferry_example_t *ex, size_t *accepted) {
  ferry_error_t pe = {0}, re = {0};
  int replace, prc, rrc;

  prc = ferry__example_parse(ex, buf, len, &pe);
  for (replace = 0; replace < 2; replace++) {
    rw_ctx_t c = {0, replace != 0};
    uint8_t *out = NULL;
    size_t out_len = 0;
    rrc = ferry__example_rewrite_bytes(buf, len, rw_fn, &c, &out, &out_len,
                                       &re);
    cr_assert_eq(rrc, prc, "rewrite %d (%s), parse %d (%s)", rrc, re.msg,
                 prc, pe.msg);
    if (rrc != 0) {
      cr_assert_str_eq(re.msg, pe.msg);
      cr_assert_null(out);
      continue;
    }
    if (replace)
      check_rewritten(buf, len, out, out_len);
    else
      cr_assert(out_len == len && (len == 0 || !memcmp(out, buf, len)));
    ferry__free(out);
  }
  *accepted += prc == 0;
}

Test(example, rewrite_fails_where_parse_fails) {
  uint64_t seed = 99;
  ferry_example_t ex;
  ferry_alloc_stats_t before, after;
  size_t accepted = 0, tried = 0;
  int iter, k;

  ferry__alloc_stats(&before);
  ferry__example_init(&ex);
  for (iter = 0; iter < 600; iter++) {
    size_t len, pos;
    uint8_t *buf = rand_example(&seed, &len);
    if (len > 4000) {
      free(buf);
      continue;
    }
    for (pos = 0; pos < len; pos++, tried++)
      rewrite_vs_parse(buf, pos, &ex, &accepted);
    for (k = 0; k < 8 && len > 0; k++, tried++) {
      uint8_t *m = malloc(len);
      memcpy(m, buf, len);
      m[rng_below(&seed, len)] = (uint8_t)rng_next(&seed);
      if (k % 2)
        m[rng_below(&seed, len)] ^= (uint8_t)(1u << rng_below(&seed, 8));
      rewrite_vs_parse(m, len, &ex, &accepted);
      free(m);
    }
    free(buf);
  }
  ferry__example_close(&ex);
  ferry__alloc_stats(&after);
  cr_assert_eq(after.blocks, before.blocks);
  cr_assert_eq(after.bytes, before.bytes);
  cr_assert_gt(accepted, 1000, "accepted %zu", accepted);
  cr_assert_gt(tried - accepted, 1000, "rejected %zu", tried - accepted);
}

/* Replaces value `index` of the feature keyed `key` with `with`. */
typedef struct {
  const char *key;
  size_t index;
  const char *with;
  size_t with_len;
  size_t calls;
} one_ctx_t;

static int replace_one(void *ctx, const char *key, size_t key_len,
                       size_t index, const uint8_t *value, size_t value_len,
                       uint8_t **replacement, size_t *replacement_len) {
  one_ctx_t *c = ctx;

  (void)value;
  (void)value_len;
  c->calls++;
  if (key_len != strlen(c->key) || memcmp(key, c->key, key_len) != 0 ||
      index != c->index)
    return 0;
  *replacement = ferry__malloc(c->with_len);
  cr_assert_not_null(*replacement);
  memcpy(*replacement, c->with, c->with_len);
  *replacement_len = c->with_len;
  return 0;
}

/* Example{features{a: bytes [v0, v1, v2] (key after the value), n: int64
 * [7], c: bytes ["x"]}} with unknown fields at every level; `a1` is a's
 * second value. */
static void build_several(wb_t *rec, const char *a1, size_t a1_len) {
  wb_t bl = {0}, feat = {0}, entry = {0}, fs = {0};
  int64_t seven = 7;

  wb_unknowns(rec, 5);
  wb_unknowns(&bl, 7);
  wb_str(&bl, 1, "v0");
  wb_lenf(&bl, 1, a1, a1_len);
  wb_unknowns(&bl, 2);
  wb_str(&bl, 1, "v2");
  wb_unknowns(&feat, 9);
  wb_sub(&feat, 1, &bl);
  wb_unknowns(&entry, 3);
  wb_sub(&entry, 2, &feat);
  wb_str(&entry, 1, "a");
  wb_unknowns(&fs, 4);
  wb_sub(&fs, 1, &entry);
  feat.n = 0;
  wb_int64_feature(&feat, &seven, 1);
  wb_entry(&fs, "n", &feat);
  feat.n = 0;
  wb_bytes_feature(&feat, "x");
  wb_entry(&fs, "c", &feat);
  wb_sub(rec, 1, &fs);
  wb_unknowns(rec, 11);
  wb_free(&bl);
  wb_free(&feat);
  wb_free(&entry);
  wb_free(&fs);
}

Test(example, rewrite_one_of_several_values) {
  wb_t rec = {0}, want = {0};
  one_ctx_t c = {"a", 1, "NEW VALUE", 9, 0};
  ferry_example_t ex;
  ferry_error_t err = {0};
  const uint8_t *d;
  size_t dl, out_len;
  uint8_t *out;

  build_several(&rec, "v1", 2);
  build_several(&want, "NEW VALUE", 9);
  cr_assert_eq(ferry__example_rewrite_bytes(rec.p, rec.n, replace_one, &c,
                                            &out, &out_len, &err), 0, "%s",
               err.msg);
  cr_assert_eq(c.calls, 4);
  cr_assert_eq(out_len, want.n);
  cr_assert_eq(memcmp(out, want.p, want.n), 0);
  ferry__example_init(&ex);
  cr_assert_eq(ferry__example_parse(&ex, out, out_len, &err), 0, "%s",
               err.msg);
  cr_assert_eq(ex.n, 3);
  cr_assert_eq(ferry__feature_bytes(ferry__example_find(&ex, "a"), 0, &d,
                                    &dl), 0);
  cr_assert(dl == 2 && memcmp(d, "v0", 2) == 0);
  cr_assert_eq(ferry__feature_bytes(ferry__example_find(&ex, "a"), 1, &d,
                                    &dl), 0);
  cr_assert(dl == 9 && memcmp(d, "NEW VALUE", 9) == 0);
  cr_assert_eq(ferry__feature_bytes(ferry__example_find(&ex, "a"), 2, &d,
                                    &dl), 0);
  cr_assert(dl == 2 && memcmp(d, "v2", 2) == 0);
  cr_assert_eq(get_int64(ferry__example_find(&ex, "n"), 0), 7);
  cr_assert_eq(ferry__feature_bytes(ferry__example_find(&ex, "c"), 0, &d,
                                    &dl), 0);
  cr_assert(dl == 1 && d[0] == 'x');
  ferry__example_close(&ex);
  ferry__free(out);
  wb_free(&rec);
  wb_free(&want);
}

/* A value grown or shrunk across every varint size boundary of its own
 * length and its enclosing ones (127/128, 16383/16384, 2097151/2097152
 * bytes): the output is the record built with the new value. */
Test(example, rewrite_lengths_cross_varint_sizes) {
  static const size_t edges[] = {127, 16383, 2097151};
  size_t e, small;
  int delta;
  char *big = malloc(2097151 + 64);

  cr_assert_not_null(big);
  memset(big, 'j', 2097151 + 64);
  for (e = 0; e < 3; e++) {
    for (delta = -24; delta <= 24; delta++) {
      size_t n = (size_t)((long)edges[e] + delta);
      for (small = 0; small < 3; small++) {
        /* From a short value up to n bytes, and from n bytes down. */
        size_t from = small == 2 ? n : small * 5;
        size_t to = small == 2 ? 3 : n;
        wb_t rec = {0}, want = {0};
        one_ctx_t c = {"a", 1, big, to, 0};
        uint8_t *out;
        size_t out_len;
        ferry_error_t err = {0};
        build_several(&rec, big, from);
        build_several(&want, big, to);
        cr_assert_eq(ferry__example_rewrite_bytes(rec.p, rec.n, replace_one,
                                                  &c, &out, &out_len, &err),
                     0, "%s", err.msg);
        cr_assert_eq(out_len, want.n, "%zu -> %zu bytes", from, to);
        cr_assert_eq(memcmp(out, want.p, want.n), 0, "%zu -> %zu bytes",
                     from, to);
        ferry__free(out);
        wb_free(&rec);
        wb_free(&want);
      }
    }
  }
  free(big);
}

/* A length written with more bytes than it needs stays as it is when
 * nothing inside changed, and is written minimally when it did. */
Test(example, rewrite_keeps_or_reencodes_long_varints) {
  /* Example{features (length 23 in 3 bytes){feature[0] (length 9 in 2
   * bytes){key "b", value{bytes_list{""}}}, feature[1]{key "a",
   * value{bytes_list{""}}}}} */
  static const uint8_t rec[] = {
      0x0A, 0x97, 0x80, 0x00,                               /* features */
      0x0A, 0x89, 0x00, 0x0A, 0x01, 'b', 0x12, 0x04, 0x0A, 0x02, 0x0A, 0x00,
      0x0A, 0x09, 0x0A, 0x01, 'a', 0x12, 0x04, 0x0A, 0x02, 0x0A, 0x00};
  /* a's value "hi": the lengths around it grow, b's entry stays. */
  static const uint8_t want[] = {
      0x0A, 0x19,
      0x0A, 0x89, 0x00, 0x0A, 0x01, 'b', 0x12, 0x04, 0x0A, 0x02, 0x0A, 0x00,
      0x0A, 0x0B, 0x0A, 0x01, 'a', 0x12, 0x06, 0x0A, 0x04, 0x0A, 0x02, 'h',
      'i'};
  one_ctx_t keep = {"c", 0, "", 0, 0}, hi = {"a", 0, "hi", 2, 0};
  uint8_t *out;
  size_t out_len;
  ferry_error_t err = {0};

  check_oracle(rec, sizeof(rec));
  cr_assert_eq(ferry__example_rewrite_bytes(rec, sizeof(rec), replace_one,
                                            &keep, &out, &out_len, &err), 0,
               "%s", err.msg);
  cr_assert_eq(keep.calls, 2);
  cr_assert_eq(out_len, sizeof(rec));
  cr_assert_eq(memcmp(out, rec, out_len), 0);
  ferry__free(out);
  cr_assert_eq(ferry__example_rewrite_bytes(rec, sizeof(rec), replace_one,
                                            &hi, &out, &out_len, &err), 0,
               "%s", err.msg);
  cr_assert_eq(out_len, sizeof(want));
  cr_assert_eq(memcmp(out, want, sizeof(want)), 0);
  ferry__free(out);
}

static int fail_second(void *ctx, const char *key, size_t key_len,
                       size_t index, const uint8_t *value, size_t value_len,
                       uint8_t **replacement, size_t *replacement_len) {
  size_t *calls = ctx;

  (void)key;
  (void)key_len;
  (void)index;
  *replacement = ferry__malloc(value_len + 1);
  cr_assert_not_null(*replacement);
  memcpy(*replacement, value, value_len);
  *replacement_len = value_len + 1;
  return ++*calls == 2 ? FERRY_EJPEG : 0;
}

/* The callback's error stops the rewrite: its code, the value's byte
 * offset and path; nothing leaks (its replacements are freed). */
Test(example, rewrite_callback_error) {
  wb_t rec = {0};
  size_t calls = 0, at, out_len = 7;
  uint8_t *out = (uint8_t *)&calls;
  ferry_error_t err = {0};
  ferry_alloc_stats_t before, after;
  char want[160];
  const uint8_t *v1;

  build_several(&rec, "v1", 2);
  v1 = memmem(rec.p, rec.n, "v1", 2);
  cr_assert_not_null(v1);
  at = (size_t)(v1 - rec.p) - 2; /* its tag and length */
  ferry__alloc_stats(&before);
  cr_assert_eq(ferry__example_rewrite_bytes(rec.p, rec.n, fail_second,
                                            &calls, &out, &out_len, &err),
               FERRY_EJPEG);
  ferry__alloc_stats(&after);
  cr_assert_eq(after.blocks, before.blocks);
  cr_assert_null(out);
  cr_assert_eq(out_len, 0);
  cr_assert_eq(err.code, FERRY_EJPEG);
  snprintf(want, sizeof(want), "Example: byte %zu: features.feature[0]."
           "value.bytes_list.value: value 1: corrupt JPEG", at);
  cr_assert_str_eq(err.msg, want);
  wb_free(&rec);
}

Test(example, rewrite_out_of_memory) {
  wb_t rec = {0};
  ferry_alloc_stats_t before, after;
  int64_t k;
  int rc = FERRY_ENOMEM;

  build_several(&rec, "v1", 2);
  ferry__alloc_stats(&before);
  for (k = 0; rc == FERRY_ENOMEM; k++) {
    rw_ctx_t c = {0, true};
    uint8_t *out = NULL;
    size_t out_len;
    ferry_error_t err = {0};
    ferry__alloc_fail_after(k);
    rc = ferry__example_rewrite_bytes(rec.p, rec.n, rw_fn, &c, &out,
                                      &out_len, &err);
    ferry__alloc_fail_reset();
    if (rc == 0) {
      check_rewritten(rec.p, rec.n, out, out_len);
      ferry__free(out);
    } else {
      cr_assert_eq(rc, FERRY_ENOMEM, "%s", err.msg);
      cr_assert_null(out);
    }
  }
  cr_assert_gt(k, 3);
  ferry__alloc_stats(&after);
  cr_assert_eq(after.blocks, before.blocks);
  wb_free(&rec);
}

/* Every record of the real files: rewritten with nothing replaced it is
 * itself; with every value replaced it parses to the new values. */
Test(example, rewrite_testdata, .timeout = 240) {
  char dirpath[1024];
  DIR *dir;
  struct dirent *de;
  size_t records = 0;
  ferry_example_t ex;

  if (!testdata_present()) {
    printf("example: skipping rewrite_testdata: no %s/tfrecord\n",
           testdata_dir());
    cr_skip_test("no testdata folder at %s", testdata_dir());
  }
  snprintf(dirpath, sizeof(dirpath), "%s/tfrecord", testdata_dir());
  dir = opendir(dirpath);
  cr_assert_not_null(dir);
  ferry__example_init(&ex);
  while ((de = readdir(dir)) != NULL) {
    size_t l = strlen(de->d_name);
    tfr_t t;
    const uint8_t *rec;
    size_t len;
    if (de->d_name[0] == '.' || (l > 3 && !strcmp(de->d_name + l - 3, ".gz")) ||
        (l > 5 && !strcmp(de->d_name + l - 5, ".json")))
      continue;
    cr_assert(tfr_open(&t, de->d_name));
    while (tfr_next(&t, &rec, &len)) {
      rewrite_vs_parse(rec, len, &ex, &records);
    }
    free(t.data);
  }
  closedir(dir);
  ferry__example_close(&ex);
  cr_assert_gt(records, 100, "only %zu Examples", records);
  printf("example: rewrite_testdata: %zu Examples rewritten\n", records);
}
