/* A zero-copy tf.train.Example parser.
 *
 * ferry__example_parse walks the protobuf wire format of an Example and
 * records, for each feature, its key and the location of its list inside
 * the record: nothing is copied and nothing is allocated once the
 * example's feature array has grown to the record's feature count. It
 * accepts what protobuf accepts: packed and unpacked numbers, unknown
 * fields (skipped), map entries in any order, a repeated key (the last one
 * wins). It rejects malformed input with an error giving the byte offset
 * inside the record. The protobuf-c code generated from
 * proto/tensorflow/core/example is its test oracle.
 *
 * ferry__example_rewrite_bytes walks a record the same way and writes a
 * copy with some bytes values replaced (ferryctl records optimize).
 */
#ifndef FERRY_EXAMPLE_H
#define FERRY_EXAMPLE_H

#include <stddef.h>
#include <stdint.h>

#include "ferry/error.h"

typedef enum {
  FERRY_FEATURE_NONE = 0, /* a Feature with no kind set */
  FERRY_FEATURE_BYTES = 1,
  FERRY_FEATURE_FLOAT = 2,
  FERRY_FEATURE_INT64 = 3
} ferry_feature_kind_t;

typedef struct ferry_feature_s {
  const char *key; /* points into the record; not NUL-terminated */
  size_t key_len;
  ferry_feature_kind_t kind;
  const uint8_t *list; /* body of the BytesList/FloatList/Int64List */
  size_t list_len;
  size_t count; /* number of values in the list */
} ferry_feature_t;

/* Caller-owned and reusable across records (init once, parse many). */
typedef struct ferry_example_s {
  ferry_feature_t *features;
  size_t n;
  size_t cap;
} ferry_example_t;

void ferry__example_init(ferry_example_t *ex);
void ferry__example_close(ferry_example_t *ex);

/* Parses `len` bytes at `buf` into `ex` (replacing its previous content).
 * Pointers in `ex` point into `buf`. Returns 0, or FERRY_EVARINT,
 * FERRY_EWIRETYPE, FERRY_EOVERRUN (message names the byte offset and the
 * field), or FERRY_ENOMEM. */
int ferry__example_parse(ferry_example_t *ex, const uint8_t *buf, size_t len,
                         ferry_error_t *err);

/* The feature named `key`, or NULL. */
const ferry_feature_t *ferry__example_find(const ferry_example_t *ex,
                                           const char *key);

/* The i-th value of a BytesList feature. Returns 0, FERRY_EFEATTYPE or
 * FERRY_ERANGE. */
int ferry__feature_bytes(const ferry_feature_t *f, size_t i,
                         const uint8_t **data, size_t *len);

/* Copies up to `cap` values of an Int64List / FloatList feature into
 * `out` and sets *n to the number of values in the list (which may exceed
 * cap). Returns 0 or FERRY_EFEATTYPE. */
int ferry__feature_int64s(const ferry_feature_t *f, int64_t *out, size_t cap,
                          size_t *n);
int ferry__feature_floats(const ferry_feature_t *f, float *out, size_t cap,
                          size_t *n);

const char *ferry__feature_kind_name(ferry_feature_kind_t kind);

/* Called by ferry__example_rewrite_bytes for one bytes value: `key` is
 * the key of its map entry (not NUL-terminated; empty when the entry has
 * none), value_index its place in its BytesList. *replacement is NULL on
 * entry; leave it NULL to keep the value, or set it to a buffer from
 * ferry__malloc of *replacement_len bytes, which the rewriter owns from
 * then on (failure included). Returns 0, or a negative code that stops
 * the rewrite. */
typedef int (*ferry_bytes_rewrite_fn)(void *ctx, const char *key,
                                      size_t key_len, size_t value_index,
                                      const uint8_t *value, size_t value_len,
                                      uint8_t **replacement,
                                      size_t *replacement_len);

/* Writes into *out (from ferry__malloc, *out_len bytes) the Example at
 * `in` with the bytes values that `fn` replaces replaced, and every
 * length that encloses one encoded again. fn is called for every value of
 * every BytesList in wire order, values a later entry or list shadows
 * included. Every other byte (unknown fields, other features, the order
 * of fields and entries, a length's non-minimal varint where nothing
 * inside changed) is copied as it was: with no replacement the output is
 * the input. Accepts what ferry__example_parse accepts and fails as it
 * does (FERRY_EVARINT, FERRY_EWIRETYPE, FERRY_EOVERRUN, the message
 * naming the byte offset); also FERRY_EOVERRUN when a rewritten length
 * is over 2 GiB, fn's own code (the message naming the value), or
 * FERRY_ENOMEM. */
int ferry__example_rewrite_bytes(const uint8_t *in, size_t len,
                                 ferry_bytes_rewrite_fn fn, void *ctx,
                                 uint8_t **out, size_t *out_len,
                                 ferry_error_t *err);

#endif /* FERRY_EXAMPLE_H */
