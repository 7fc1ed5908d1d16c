/* The zero-copy tf.train.Example parser: a hand-written walker over the
 * protobuf wire format of Example, Features, the map entries, Feature and
 * the three list messages (see example.h for the contract), and the
 * rewrite of bytes values, which walks a record with the same steps.
 *
 * Parsing validates the whole record, nested lists included, and counts
 * the values of each list, so the ferry_feature_* accessors can walk a list
 * without checking it again. Where the wire format allows more than one
 * reading, the parser follows protobuf-c, its test oracle:
 *  - a known field with an unexpected wire type is an error (protobuf-c
 *    fails the unpack; the C++ library would keep it as an unknown field);
 *  - a Feature's oneof seen twice keeps the last list, and a map entry's
 *    value seen twice keeps the last value that has a kind (protobuf-c
 *    merges the two Feature messages that way; C++ protobuf would also
 *    concatenate two lists of the same kind, which no record written by
 *    TensorFlow contains and which cannot be expressed without copying);
 *  - a field tag must fit 32 bits in at most 5 bytes, and a length must fit
 *    5 bytes and 2 GiB (protobuf-c's limits); field number 0 is invalid.
 * Strings are not checked for UTF-8, as protobuf-c and TensorFlow's fast
 * Example parser do not check them either.
 *
 * Errors: a bad varint (too long, or cut by the end of its message) is
 * FERRY_EVARINT at the varint's first byte; a bad wire type, a group, a
 * known field with the wrong wire type or field number 0 is FERRY_EWIRETYPE
 * at the field's tag; a length or fixed-size value running past its
 * enclosing message, or a packed float list whose length is not a multiple
 * of 4, is FERRY_EOVERRUN at the field's tag.
 */
#include "example.h"

#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "varint.h"

enum {
  WT_VARINT = 0,
  WT_I64 = 1,
  WT_LEN = 2,
  WT_SGROUP = 3,
  WT_EGROUP = 4,
  WT_I32 = 5
};

/* Records with more features than this deduplicate keys (and find them)
 * through a hash index instead of a linear scan, so that a record with
 * 100,000 keys costs linear time rather than quadratic. The index lives in
 * the same allocation as the feature array, after its `cap` elements. */
#define INDEX_MIN 32

/* The nesting levels of the schema; error paths are built from them. */
typedef enum { L_EXAMPLE, L_FEATURES, L_ENTRY, L_FEATURE, L_LIST } level_t;

typedef struct {
  const uint8_t *base;       /* start of the record, for byte offsets */
  ferry_error_t *err;        /* NULL: no message is formatted */
  size_t entry;              /* index of the current map entry */
  ferry_feature_kind_t list; /* kind of the list being walked */
} walk_t;

typedef struct {
  uint32_t num;        /* field number */
  unsigned wire;       /* wire type */
  const uint8_t *tag;  /* where the field starts */
  const uint8_t *body; /* the varint, the fixed bytes or the delimited body */
  size_t len;          /* their length */
} field_t;

static const char *const list_names[] = {"", "bytes_list", "float_list",
                                         "int64_list"};

/* Writes the path of field `num` of the message at `level` into `buf`, or
 * the message's own path when num is 0. */
static void format_path(const walk_t *w, level_t level, uint32_t num,
                        char *buf, size_t cap) {
  char parent[128];
  char name[64];
  const char *list = list_names[w->list <= 3 ? w->list : 0];

  switch (level) {
  case L_EXAMPLE:
    parent[0] = '\0';
    break;
  case L_FEATURES:
    snprintf(parent, sizeof(parent), "features");
    break;
  case L_ENTRY:
    snprintf(parent, sizeof(parent), "features.feature[%zu]", w->entry);
    break;
  case L_FEATURE:
    snprintf(parent, sizeof(parent), "features.feature[%zu].value", w->entry);
    break;
  default:
    snprintf(parent, sizeof(parent), "features.feature[%zu].value.%s",
             w->entry, list);
    break;
  }
  if (num == 0) {
    snprintf(buf, cap, "%s", parent[0] ? parent : "top level");
    return;
  }
  if (level == L_EXAMPLE && num == 1)
    snprintf(name, sizeof(name), "features");
  else if (level == L_FEATURES && num == 1)
    snprintf(name, sizeof(name), "feature[%zu]", w->entry);
  else if (level == L_ENTRY && (num == 1 || num == 2))
    snprintf(name, sizeof(name), "%s", num == 1 ? "key" : "value");
  else if (level == L_FEATURE && num <= 3)
    snprintf(name, sizeof(name), "%s", list_names[num]);
  else if (level == L_LIST && num == 1)
    snprintf(name, sizeof(name), "value");
  else
    snprintf(name, sizeof(name), "field %u", (unsigned)num);
  snprintf(buf, cap, "%s%s%s", parent, parent[0] ? "." : "", name);
}

/* Fills w->err with "Example: byte N: PATH: DETAIL" and returns `code`. */
static int fail(const walk_t *w, int code, const uint8_t *at, level_t level,
                uint32_t num, const char *fmt, ...) FERRY_PRINTF(6, 7);
static int fail(const walk_t *w, int code, const uint8_t *at, level_t level,
                uint32_t num, const char *fmt, ...) {
  char path[200];
  char detail[256];
  va_list ap;

  if (w->err == NULL)
    return code;
  format_path(w, level, num, path, sizeof(path));
  va_start(ap, fmt);
  vsnprintf(detail, sizeof(detail), fmt, ap);
  va_end(ap);
  return ferry__seterr(w->err, code, "Example: byte %zu: %s: %s",
                       (size_t)(at - w->base), path, detail);
}

static size_t off(const walk_t *w, const uint8_t *p) {
  return (size_t)(p - w->base);
}

static const char *wire_name(unsigned wire) {
  switch (wire) {
  case WT_VARINT:
    return "varint";
  case WT_I64:
    return "fixed64";
  case WT_LEN:
    return "length-delimited";
  case WT_I32:
    return "fixed32";
  default:
    return "invalid";
  }
}

/* Reads the field at *pp (which is before `end`, the end of the enclosing
 * message), checks that it lies inside the message and advances *pp past
 * it. */
static inline int next_field(const walk_t *w, level_t level,
                             const uint8_t **pp, const uint8_t *end,
                             field_t *f) {
  const uint8_t *p = *pp;
  uint64_t v;
  int k;

  f->tag = p;
  k = ferry__varint_get(p, end, 5, &v);
  if (k <= 0) {
    if (k == 0)
      return fail(w, FERRY_EVARINT, p, level, 0,
                  "field tag varint runs past the end of the enclosing "
                  "message (ends at byte %zu)", off(w, end));
    return fail(w, FERRY_EVARINT, p, level, 0,
                "field tag varint is longer than 5 bytes");
  }
  if (v > UINT32_MAX)
    return fail(w, FERRY_EVARINT, p, level, 0,
                "field tag %llu does not fit 32 bits", (unsigned long long)v);
  f->num = (uint32_t)(v >> 3);
  f->wire = (unsigned)(v & 7);
  if (f->num == 0)
    return fail(w, FERRY_EWIRETYPE, p, level, 0, "field number 0 is invalid");
  p += k;
  /* An if-chain, most frequent wire type first: a switch compiles to an
   * indirect jump that mispredicts on every record. */
  if (f->wire == WT_LEN) {
    k = ferry__varint_get(p, end, 5, &v);
    if (k <= 0) {
      if (k == 0)
        return fail(w, FERRY_EVARINT, p, level, f->num,
                    "length varint runs past the end of the enclosing "
                    "message (ends at byte %zu)", off(w, end));
      return fail(w, FERRY_EVARINT, p, level, f->num,
                  "length varint is longer than 5 bytes");
    }
    if (v > INT_MAX)
      return fail(w, FERRY_EOVERRUN, f->tag, level, f->num,
                  "length %llu is over the 2 GiB protobuf limit",
                  (unsigned long long)v);
    p += k;
    if (v > (uint64_t)(end - p))
      return fail(w, FERRY_EOVERRUN, f->tag, level, f->num,
                  "length %llu runs past the end of the enclosing message "
                  "(ends at byte %zu)", (unsigned long long)v, off(w, end));
    f->body = p;
    f->len = (size_t)v;
  } else if (f->wire == WT_VARINT) {
    k = ferry__varint_get(p, end, 10, &v);
    if (k <= 0) {
      if (k == 0)
        return fail(w, FERRY_EVARINT, p, level, f->num,
                    "varint runs past the end of the enclosing message "
                    "(ends at byte %zu)", off(w, end));
      return fail(w, FERRY_EVARINT, p, level, f->num,
                  "varint is longer than 10 bytes");
    }
    f->body = p;
    f->len = (size_t)k;
  } else if (f->wire == WT_I32 || f->wire == WT_I64) {
    f->len = f->wire == WT_I64 ? 8 : 4;
    if ((size_t)(end - p) < f->len)
      return fail(w, FERRY_EOVERRUN, f->tag, level, f->num,
                  "%s value needs %zu bytes but the enclosing message ends "
                  "at byte %zu", wire_name(f->wire), f->len, off(w, end));
    f->body = p;
  } else if (f->wire == WT_SGROUP || f->wire == WT_EGROUP) {
    return fail(w, FERRY_EWIRETYPE, f->tag, level, f->num,
                "wire type %u (%s group) is not supported", f->wire,
                f->wire == WT_SGROUP ? "start" : "end");
  } else {
    return fail(w, FERRY_EWIRETYPE, f->tag, level, f->num,
                "wire type %u is invalid", f->wire);
  }
  *pp = f->body + f->len;
  return 0;
}

static int bad_wire(const walk_t *w, level_t level, const field_t *f,
                    const char *expected) {
  return fail(w, FERRY_EWIRETYPE, f->tag, level, f->num,
              "wire type %u (%s), expected %s", f->wire, wire_name(f->wire),
              expected);
}

/* Checks the packed varints of an Int64List and adds their number to
 * *count. A varint may not run past the list or exceed 10 bytes. */
static int scan_packed_varints(const walk_t *w, const field_t *f,
                               size_t *count) {
  const uint8_t *q = f->body;
  const uint8_t *e = q + f->len;
  size_t n = 0;
  unsigned run = 0;

  for (; q < e; q++) {
    if (*q < 0x80) {
      run = 0;
      n++;
    } else if (++run == 10) {
      return fail(w, FERRY_EVARINT, q - 9, L_LIST, 1,
                  "value %zu: varint is longer than 10 bytes", *count + n);
    }
  }
  if (run != 0)
    return fail(w, FERRY_EVARINT, e - run, L_LIST, 1,
                "value %zu: varint runs past the end of the packed list "
                "(ends at byte %zu)", *count + n, off(w, e));
  *count += n;
  return 0;
}

/* Validates a BytesList, FloatList or Int64List body and counts its
 * values. */
static int parse_list(walk_t *w, ferry_feature_kind_t kind,
                      const uint8_t *body, size_t len, size_t *count) {
  const uint8_t *p = body;
  const uint8_t *end = body + len;
  field_t f = {0};
  size_t n = 0;
  int rc;

  w->list = kind;
  while (p < end) {
    rc = next_field(w, L_LIST, &p, end, &f);
    if (rc != 0)
      return rc;
    if (f.num != 1)
      continue;
    if (kind == FERRY_FEATURE_BYTES) {
      if (f.wire != WT_LEN)
        return bad_wire(w, L_LIST, &f, "2 (length-delimited)");
      n++;
    } else if (kind == FERRY_FEATURE_FLOAT) {
      if (f.wire == WT_I32) {
        n++;
      } else if (f.wire == WT_LEN) {
        if (f.len % 4 != 0)
          return fail(w, FERRY_EOVERRUN, f.tag, L_LIST, 1,
                      "packed float list of %zu bytes is not a multiple "
                      "of 4", f.len);
        n += f.len / 4;
      } else {
        return bad_wire(w, L_LIST, &f, "5 (fixed32) or 2 (packed)");
      }
    } else {
      if (f.wire == WT_VARINT) {
        n++;
      } else if (f.wire == WT_LEN) {
        rc = scan_packed_varints(w, &f, &n);
        if (rc != 0)
          return rc;
      } else {
        return bad_wire(w, L_LIST, &f, "0 (varint) or 2 (packed)");
      }
    }
  }
  *count = n;
  return 0;
}

/* Parses a Feature into the kind and list fields of `ft`; the last list of
 * the oneof wins. */
static int parse_feature(walk_t *w, const uint8_t *body, size_t len,
                         ferry_feature_t *ft) {
  const uint8_t *p = body;
  const uint8_t *end = body + len;
  field_t f = {0};
  size_t count;
  int rc;

  ft->kind = FERRY_FEATURE_NONE;
  ft->list = NULL;
  ft->list_len = 0;
  ft->count = 0;
  while (p < end) {
    rc = next_field(w, L_FEATURE, &p, end, &f);
    if (rc != 0)
      return rc;
    if (f.num < 1 || f.num > 3)
      continue;
    if (f.wire != WT_LEN)
      return bad_wire(w, L_FEATURE, &f, "2 (length-delimited)");
    rc = parse_list(w, (ferry_feature_kind_t)f.num, f.body, f.len, &count);
    if (rc != 0)
      return rc;
    ft->kind = (ferry_feature_kind_t)f.num;
    ft->list = f.body;
    ft->list_len = f.len;
    ft->count = count;
  }
  return 0;
}

/* Parses one map entry {key = 1; value = 2} in either order. */
static int parse_entry(walk_t *w, const uint8_t *body, size_t len,
                       ferry_feature_t *ft) {
  const uint8_t *p = body;
  const uint8_t *end = body + len;
  ferry_feature_t value;
  field_t f = {0};
  int rc;

  ft->key = (const char *)body;
  ft->key_len = 0;
  ft->kind = FERRY_FEATURE_NONE;
  ft->list = NULL;
  ft->list_len = 0;
  ft->count = 0;
  while (p < end) {
    rc = next_field(w, L_ENTRY, &p, end, &f);
    if (rc != 0)
      return rc;
    if (f.num != 1 && f.num != 2)
      continue;
    if (f.wire != WT_LEN)
      return bad_wire(w, L_ENTRY, &f, "2 (length-delimited)");
    if (f.num == 1) {
      ft->key = (const char *)f.body;
      ft->key_len = f.len;
      continue;
    }
    rc = parse_feature(w, f.body, f.len, &value);
    if (rc != 0)
      return rc;
    /* A second value merges into the first: one without a kind leaves the
     * earlier list in place. */
    if (value.kind != FERRY_FEATURE_NONE) {
      ft->kind = value.kind;
      ft->list = value.list;
      ft->list_len = value.list_len;
      ft->count = value.count;
    }
  }
  return 0;
}

static size_t index_slots(size_t cap) {
  size_t s = 64;

  if (cap <= INDEX_MIN)
    return 0;
  while (s < 2 * cap)
    s *= 2;
  return s;
}

static size_t *index_of(const ferry_example_t *ex) {
  return (size_t *)(void *)(ex->features + ex->cap);
}

static uint64_t hash_key(const char *key, size_t len) {
  uint64_t h = 0xcbf29ce484222325ull;
  size_t i;

  for (i = 0; i < len; i++) {
    h ^= (uint8_t)key[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

static bool same_key(const ferry_feature_t *f, const char *key, size_t len) {
  return f->key_len == len && memcmp(f->key, key, len) == 0;
}

/* The index slot that holds `key`, or the empty slot where it would go.
 * Slots hold a feature's position plus one; 0 is empty. */
static size_t *index_slot(const ferry_example_t *ex, const char *key,
                          size_t len) {
  size_t *slots = index_of(ex);
  size_t mask = index_slots(ex->cap) - 1;
  size_t i = (size_t)hash_key(key, len) & mask;

  while (slots[i] != 0 && !same_key(&ex->features[slots[i] - 1], key, len))
    i = (i + 1) & mask;
  return &slots[i];
}

static void index_build(ferry_example_t *ex) {
  size_t i;

  memset(index_of(ex), 0, index_slots(ex->cap) * sizeof(size_t));
  for (i = 0; i < ex->n; i++)
    *index_slot(ex, ex->features[i].key, ex->features[i].key_len) = i + 1;
}

static int grow(ferry_example_t *ex, const walk_t *w, const uint8_t *at) {
  size_t cap = ex->cap ? ex->cap * 2 : 8;
  size_t slots;
  void *p;

  if (cap < ex->cap || cap > SIZE_MAX / (2 * sizeof(ferry_feature_t)))
    return fail(w, FERRY_ENOMEM, at, L_FEATURES, 1,
                "too many features (%zu)", ex->n);
  slots = index_slots(cap);
  p = ferry__realloc(ex->features,
                     cap * sizeof(ferry_feature_t) + slots * sizeof(size_t));
  if (p == NULL)
    return fail(w, FERRY_ENOMEM, at, L_FEATURES, 1,
                "out of memory for %zu features", cap);
  ex->features = p;
  ex->cap = cap;
  return 0;
}

/* Adds a parsed entry to `ex`, replacing an earlier one with the same key
 * (protobuf maps keep the last entry for a key). */
static int insert(ferry_example_t *ex, const walk_t *w,
                  const ferry_feature_t *ft, const uint8_t *at) {
  bool grew = false;
  size_t *slot = NULL;
  size_t i;
  int rc;

  if (ex->n > INDEX_MIN) {
    slot = index_slot(ex, ft->key, ft->key_len);
    if (*slot != 0) {
      ex->features[*slot - 1] = *ft;
      return 0;
    }
  } else {
    for (i = 0; i < ex->n; i++) {
      if (same_key(&ex->features[i], ft->key, ft->key_len)) {
        ex->features[i] = *ft;
        return 0;
      }
    }
  }
  if (ex->n == ex->cap) {
    rc = grow(ex, w, at);
    if (rc != 0)
      return rc;
    grew = true;
  }
  ex->features[ex->n++] = *ft;
  if (ex->n > INDEX_MIN) {
    if (grew || slot == NULL)
      index_build(ex);
    else
      *slot = ex->n;
  }
  return 0;
}

static int parse_features(ferry_example_t *ex, walk_t *w, const uint8_t *body,
                          size_t len) {
  const uint8_t *p = body;
  const uint8_t *end = body + len;
  ferry_feature_t ft;
  field_t f = {0};
  int rc;

  while (p < end) {
    rc = next_field(w, L_FEATURES, &p, end, &f);
    if (rc != 0)
      return rc;
    if (f.num != 1)
      continue;
    if (f.wire != WT_LEN)
      return bad_wire(w, L_FEATURES, &f, "2 (length-delimited)");
    rc = parse_entry(w, f.body, f.len, &ft);
    if (rc == 0)
      rc = insert(ex, w, &ft, f.tag);
    if (rc != 0)
      return rc;
    w->entry++;
  }
  return 0;
}

void ferry__example_init(ferry_example_t *ex) {
  ex->features = NULL;
  ex->n = 0;
  ex->cap = 0;
}

void ferry__example_close(ferry_example_t *ex) {
  if (ex == NULL)
    return;
  ferry__free(ex->features);
  ferry__example_init(ex);
}

int ferry__example_parse(ferry_example_t *ex, const uint8_t *buf, size_t len,
                         ferry_error_t *err) {
  walk_t w = {buf, err, 0, FERRY_FEATURE_NONE};
  const uint8_t *p = buf;
  const uint8_t *end;
  field_t f = {0};
  int rc = 0;

  ex->n = 0;
  if (len == 0)
    return 0;
  end = buf + len;
  while (p < end) {
    rc = next_field(&w, L_EXAMPLE, &p, end, &f);
    if (rc != 0)
      break;
    if (f.num != 1)
      continue;
    if (f.wire != WT_LEN) {
      rc = bad_wire(&w, L_EXAMPLE, &f, "2 (length-delimited)");
      break;
    }
    /* A repeated `features` field merges: its entries add to the map. */
    rc = parse_features(ex, &w, f.body, f.len);
    if (rc != 0)
      break;
  }
  if (rc != 0)
    ex->n = 0;
  return rc;
}

const ferry_feature_t *ferry__example_find(const ferry_example_t *ex,
                                           const char *key) {
  size_t len;
  size_t i;

  if (key == NULL)
    return NULL;
  len = strlen(key);
  if (ex->n > INDEX_MIN) {
    const size_t *slot = index_slot(ex, key, len);
    return *slot ? &ex->features[*slot - 1] : NULL;
  }
  for (i = 0; i < ex->n; i++)
    if (same_key(&ex->features[i], key, len))
      return &ex->features[i];
  return NULL;
}

/* The accessors read a Feature with no kind as an empty list of any type,
 * as TensorFlow does, rather than as a type mismatch.
 *
 * A walk over a list that parsing validated: no error can occur, but the
 * checks stay so that a hand-made feature cannot cause an overread. */
static int next_list_field(const uint8_t **pp, const uint8_t *end,
                           field_t *f) {
  static const walk_t quiet = {NULL, NULL, 0, FERRY_FEATURE_NONE};

  return next_field(&quiet, L_LIST, pp, end, f);
}

int ferry__feature_bytes(const ferry_feature_t *f, size_t i,
                         const uint8_t **data, size_t *len) {
  const uint8_t *p;
  const uint8_t *end;
  field_t fl;

  if (f->kind != FERRY_FEATURE_BYTES)
    return f->kind == FERRY_FEATURE_NONE ? FERRY_ERANGE : FERRY_EFEATTYPE;
  if (i >= f->count)
    return FERRY_ERANGE;
  p = f->list;
  end = p + f->list_len;
  while (p < end) {
    if (next_list_field(&p, end, &fl) != 0)
      break;
    if (fl.num == 1 && fl.wire == WT_LEN && i-- == 0) {
      *data = fl.body;
      *len = fl.len;
      return 0;
    }
  }
  return FERRY_ERANGE;
}

int ferry__feature_int64s(const ferry_feature_t *f, int64_t *out, size_t cap,
                          size_t *n) {
  const uint8_t *p;
  const uint8_t *end;
  size_t k = 0;
  field_t fl;
  uint64_t v;
  int len;

  if (f->kind != FERRY_FEATURE_INT64 && f->kind != FERRY_FEATURE_NONE)
    return FERRY_EFEATTYPE;
  *n = f->count;
  if (f->kind == FERRY_FEATURE_NONE)
    return 0;
  p = f->list;
  end = p + f->list_len;
  while (p < end && k < cap) {
    if (next_list_field(&p, end, &fl) != 0)
      break;
    if (fl.num != 1)
      continue;
    if (fl.wire == WT_VARINT) {
      if (ferry__varint_get(fl.body, fl.body + fl.len, 10, &v) > 0)
        out[k++] = (int64_t)v;
    } else if (fl.wire == WT_LEN) {
      const uint8_t *q = fl.body;
      const uint8_t *e = q + fl.len;
      while (q < e && k < cap) {
        len = ferry__varint_get(q, e, 10, &v);
        if (len <= 0)
          break;
        out[k++] = (int64_t)v;
        q += len;
      }
    }
  }
  return 0;
}

static float load_float(const uint8_t *p) {
  uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
               (uint32_t)p[3] << 24;
  float x;

  memcpy(&x, &u, sizeof(x));
  return x;
}

int ferry__feature_floats(const ferry_feature_t *f, float *out, size_t cap,
                          size_t *n) {
  const uint8_t *p;
  const uint8_t *end;
  size_t k = 0;
  size_t i;
  size_t m;
  field_t fl;

  if (f->kind != FERRY_FEATURE_FLOAT && f->kind != FERRY_FEATURE_NONE)
    return FERRY_EFEATTYPE;
  *n = f->count;
  if (f->kind == FERRY_FEATURE_NONE)
    return 0;
  p = f->list;
  end = p + f->list_len;
  while (p < end && k < cap) {
    if (next_list_field(&p, end, &fl) != 0)
      break;
    if (fl.num != 1)
      continue;
    if (fl.wire == WT_I32) {
      out[k++] = load_float(fl.body);
    } else if (fl.wire == WT_LEN) {
      m = fl.len / 4;
      if (m > cap - k)
        m = cap - k;
      for (i = 0; i < m; i++)
        out[k + i] = load_float(fl.body + 4 * i);
      k += m;
    }
  }
  return 0;
}

const char *ferry__feature_kind_name(ferry_feature_kind_t kind) {
  switch (kind) {
  case FERRY_FEATURE_NONE:
    return "none";
  case FERRY_FEATURE_BYTES:
    return "bytes";
  case FERRY_FEATURE_FLOAT:
    return "float";
  case FERRY_FEATURE_INT64:
    return "int64";
  }
  return "unknown";
}

/* ---- Rewriting bytes values ----
 *
 * The rewrite walks the record as the parser does, with the same checks
 * in the same order, so it fails where the parser fails. It writes
 * nothing while walking: each change is an edit of the input (a span of
 * it replaced by a length varint and, for a value, the new bytes), kept
 * in input order, and the output is the input with the edits applied. A
 * nested message's length edit is reserved before its body is walked (it
 * comes first in the output) and dropped when the body's length stays as
 * it was. */

typedef struct {
  const uint8_t *at;  /* the replaced span of the input */
  size_t old_len;
  uint8_t varint[5];  /* the new length varint */
  size_t varint_len;
  uint8_t *data;      /* a new value (owned), or NULL */
  size_t data_len;
} edit_t;

typedef struct {
  walk_t w;
  ferry_bytes_rewrite_fn fn;
  void *ctx;
  const char *key;    /* the current map entry's key */
  size_t key_len;
  edit_t *edits;
  size_t n, cap;
} rewrite_t;

/* Walks the body of a message and sets *new_len to its rewritten length. */
typedef int (*rewrite_body_fn)(rewrite_t *rw, const uint8_t *body,
                               size_t len, uint64_t *new_len);

static int add_edit(rewrite_t *rw, const uint8_t *at) {
  if (!FERRY__GROW(rw->edits, rw->cap, rw->n + 1, 16))
    return FERRY_ENOMEM;
  rw->edits[rw->n++] = (edit_t){.at = at};
  return 0;
}

/* The start of the length varint of length-delimited field f. */
static const uint8_t *length_at(const field_t *f) {
  uint64_t v;

  return f->tag + ferry__varint_get(f->tag, f->body, 5, &v);
}

/* Sets edit e to replace f's length varint (and, with data, its body). */
static void edit_field(edit_t *e, const field_t *f, uint64_t len,
                       bool with_body) {
  e->old_len = (size_t)(f->body - e->at) + (with_body ? f->len : 0);
  e->varint_len = ferry__varint_put(e->varint, len);
}

static int too_long(const rewrite_t *rw, level_t level, const field_t *f,
                    uint64_t len) {
  return fail(&rw->w, FERRY_EOVERRUN, f->tag, level, f->num,
              "rewritten length %llu is over the 2 GiB protobuf limit",
              (unsigned long long)len);
}

/* Rewrites the message in length-delimited field f with `body_fn` and
 * adds the change of the field's size to *msg_len (modulo 2^64: the sum
 * comes out right). */
static int rewrite_nested(rewrite_t *rw, level_t level, const field_t *f,
                          rewrite_body_fn body_fn, uint64_t *msg_len) {
  size_t slot = rw->n;
  uint64_t body_len;
  edit_t *e;
  int rc;

  rc = add_edit(rw, length_at(f));
  if (rc != 0)
    return fail(&rw->w, rc, f->tag, level, f->num, "out of memory");
  rc = body_fn(rw, f->body, f->len, &body_len);
  if (rc != 0)
    return rc;
  if (body_len == f->len) {
    if (rw->n == slot + 1)
      rw->n = slot; /* nothing inside changed */
    return 0;
  }
  if (body_len > INT_MAX)
    return too_long(rw, level, f, body_len);
  e = &rw->edits[slot];
  edit_field(e, f, body_len, false);
  *msg_len += e->varint_len - e->old_len + body_len - f->len;
  return 0;
}

/* Offers value `index` (field f of a BytesList) to the callback. */
static int rewrite_value(rewrite_t *rw, const field_t *f, size_t index,
                         uint64_t *list_len) {
  uint8_t *repl = NULL;
  size_t repl_len = 0;
  edit_t *e;
  int rc;

  rc = rw->fn(rw->ctx, rw->key, rw->key_len, index, f->body, f->len, &repl,
              &repl_len);
  if (rc < 0) {
    ferry__free(repl);
    return fail(&rw->w, rc, f->tag, L_LIST, 1, "value %zu: %s", index,
                ferry_strerror(rc));
  }
  if (repl == NULL)
    return 0;
  if (repl_len > INT_MAX) {
    ferry__free(repl);
    return too_long(rw, L_LIST, f, repl_len);
  }
  rc = add_edit(rw, length_at(f));
  if (rc != 0) {
    ferry__free(repl);
    return fail(&rw->w, rc, f->tag, L_LIST, 1, "out of memory");
  }
  e = &rw->edits[rw->n - 1];
  edit_field(e, f, repl_len, true);
  e->data = repl;
  e->data_len = repl_len;
  *list_len += e->varint_len + repl_len - e->old_len;
  return 0;
}

static int rewrite_bytes_list(rewrite_t *rw, const uint8_t *body, size_t len,
                              uint64_t *new_len) {
  const uint8_t *p = body;
  const uint8_t *end = body + len;
  size_t index = 0;
  field_t f = {0};
  int rc;

  *new_len = len;
  rw->w.list = FERRY_FEATURE_BYTES;
  while (p < end) {
    rc = next_field(&rw->w, L_LIST, &p, end, &f);
    if (rc != 0)
      return rc;
    if (f.num != 1)
      continue;
    if (f.wire != WT_LEN)
      return bad_wire(&rw->w, L_LIST, &f, "2 (length-delimited)");
    rc = rewrite_value(rw, &f, index++, new_len);
    if (rc != 0)
      return rc;
  }
  return 0;
}

static int rewrite_feature(rewrite_t *rw, const uint8_t *body, size_t len,
                           uint64_t *new_len) {
  const uint8_t *p = body;
  const uint8_t *end = body + len;
  size_t count;
  field_t f = {0};
  int rc;

  *new_len = len;
  while (p < end) {
    rc = next_field(&rw->w, L_FEATURE, &p, end, &f);
    if (rc != 0)
      return rc;
    if (f.num < 1 || f.num > 3)
      continue;
    if (f.wire != WT_LEN)
      return bad_wire(&rw->w, L_FEATURE, &f, "2 (length-delimited)");
    if (f.num == FERRY_FEATURE_BYTES)
      rc = rewrite_nested(rw, L_FEATURE, &f, rewrite_bytes_list, new_len);
    else
      rc = parse_list(&rw->w, (ferry_feature_kind_t)f.num, f.body, f.len,
                      &count);
    if (rc != 0)
      return rc;
  }
  return 0;
}

static int rewrite_entry(rewrite_t *rw, const uint8_t *body, size_t len,
                         uint64_t *new_len) {
  const uint8_t *p = body;
  const uint8_t *end = body + len;
  walk_t quiet = rw->w;
  field_t f = {0};
  int rc;

  /* The key first (the last one wins, as in parse_entry), wherever it
   * is; a fault found here is reported by the walk below, in order. */
  quiet.err = NULL;
  rw->key = (const char *)body;
  rw->key_len = 0;
  while (p < end && next_field(&quiet, L_ENTRY, &p, end, &f) == 0) {
    if (f.num == 1 && f.wire == WT_LEN) {
      rw->key = (const char *)f.body;
      rw->key_len = f.len;
    }
  }
  *new_len = len;
  p = body;
  while (p < end) {
    rc = next_field(&rw->w, L_ENTRY, &p, end, &f);
    if (rc != 0)
      return rc;
    if (f.num != 1 && f.num != 2)
      continue;
    if (f.wire != WT_LEN)
      return bad_wire(&rw->w, L_ENTRY, &f, "2 (length-delimited)");
    if (f.num == 2) {
      rc = rewrite_nested(rw, L_ENTRY, &f, rewrite_feature, new_len);
      if (rc != 0)
        return rc;
    }
  }
  return 0;
}

/* Features and Example alike: field 1 is the message one level down
 * (the map's entries, counted; the Features), anything else is copied. */
static int rewrite_field1(rewrite_t *rw, level_t level, const uint8_t *body,
                          size_t len, rewrite_body_fn inner,
                          uint64_t *new_len) {
  const uint8_t *p = body;
  const uint8_t *end = body + len;
  field_t f = {0};
  int rc;

  *new_len = len;
  while (p < end) {
    rc = next_field(&rw->w, level, &p, end, &f);
    if (rc != 0)
      return rc;
    if (f.num != 1)
      continue;
    if (f.wire != WT_LEN)
      return bad_wire(&rw->w, level, &f, "2 (length-delimited)");
    rc = rewrite_nested(rw, level, &f, inner, new_len);
    if (rc != 0)
      return rc;
    if (level == L_FEATURES)
      rw->w.entry++;
  }
  return 0;
}

static int rewrite_features(rewrite_t *rw, const uint8_t *body, size_t len,
                            uint64_t *new_len) {
  return rewrite_field1(rw, L_FEATURES, body, len, rewrite_entry, new_len);
}

static int rewrite_example(rewrite_t *rw, const uint8_t *body, size_t len,
                           uint64_t *new_len) {
  return rewrite_field1(rw, L_EXAMPLE, body, len, rewrite_features, new_len);
}

int ferry__example_rewrite_bytes(const uint8_t *in, size_t len,
                                 ferry_bytes_rewrite_fn fn, void *ctx,
                                 uint8_t **out, size_t *out_len,
                                 ferry_error_t *err) {
  rewrite_t rw = {{in, err, 0, FERRY_FEATURE_NONE}, fn, ctx, NULL, 0,
                  NULL, 0, 0};
  const uint8_t *from = in;
  uint64_t new_len;
  uint8_t *buf = NULL;
  uint8_t *q;
  size_t i;
  int rc;

  *out = NULL;
  *out_len = 0;
  if (len == 0) {
    *out = ferry__malloc(1);
    return *out != NULL ? 0 : ferry__seterr(err, FERRY_ENOMEM,
                                            "Example: out of memory");
  }
  rc = rewrite_example(&rw, in, len, &new_len);
  if (rc == 0 && new_len > SIZE_MAX - 1)
    rc = ferry__seterr(err, FERRY_ENOMEM, "Example: rewritten record of "
                       "%llu bytes", (unsigned long long)new_len);
  if (rc == 0) {
    buf = ferry__malloc(new_len ? (size_t)new_len : 1);
    if (buf == NULL)
      rc = ferry__seterr(err, FERRY_ENOMEM, "Example: out of memory for "
                         "the rewritten record (%llu bytes)",
                         (unsigned long long)new_len);
  }
  if (rc == 0) {
    q = buf;
    for (i = 0; i < rw.n; i++) {
      const edit_t *e = &rw.edits[i];
      memcpy(q, from, (size_t)(e->at - from));
      q += e->at - from;
      memcpy(q, e->varint, e->varint_len);
      q += e->varint_len;
      if (e->data_len > 0)
        memcpy(q, e->data, e->data_len);
      q += e->data_len;
      from = e->at + e->old_len;
    }
    memcpy(q, from, (size_t)(in + len - from));
    q += in + len - from;
    *out = buf;
    *out_len = (size_t)(q - buf);
  }
  for (i = 0; i < rw.n; i++)
    ferry__free(rw.edits[i].data);
  ferry__free(rw.edits);
  return rc;
}
