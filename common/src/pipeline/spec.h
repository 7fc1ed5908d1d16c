/* The pipeline spec: what a dataset is. Two equivalent forms, the protobuf
 * ferry.v1.PipelineSpec (proto/ferry/v1/common.proto) and a one-line text
 * form for the CLI and config files:
 *
 *   tfrecord("/data/train-*.tfrecord") | decode(raw, 32, 32, 3) |
 *   dilate(3) | blur(11, 0.8) | shuffle(seed=7, buffer=10000) | batch(1024)
 *
 * Grammar and every stage's arguments: docs/PROTOCOL.md. The canonical
 * text (ferry__spec_format) and the canonical serialization
 * (ferry__spec_pack) are deterministic, and the fingerprint is a hash of
 * the latter, so registering the same spec twice yields one dataset.
 */
#ifndef FERRY_SPEC_H
#define FERRY_SPEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ferry/error.h"
#include "tfrecord.h"

typedef enum { FERRY_IMAGE_RAW = 0, FERRY_IMAGE_JPEG = 1 } ferry_image_format_t;

typedef enum {
  FERRY_OP_RESIZE = 1, /* resize(H, W): TF bilinear */
  FERRY_OP_DILATE = 2,
  FERRY_OP_BLUR = 3,
  FERRY_OP_RANDOM_RESIZED_CROP = 4, /* torchvision RandomResizedCrop */
  FERRY_OP_RESIZE_SHORTER = 5,      /* resize(S): torchvision Resize(S) */
  FERRY_OP_CENTER_CROP = 6          /* torchvision CenterCrop */
} ferry_op_kind_t;

typedef struct ferry_image_op_s {
  ferry_op_kind_t kind;
  int a;       /* resize: height; dilate: size; blur: size;
                  random_resized_crop, center_crop: height;
                  resize(S): S */
  int b;       /* resize, random_resized_crop, center_crop: width */
  float sigma; /* blur */
  float scale[2], ratio[2]; /* random_resized_crop: (min, max) */
  bool exact; /* random_resized_crop, resize(S): no fused decode */
} ferry_image_op_t;

#define FERRY_SPEC_MAX_OPS 16

typedef struct ferry_spec_s {
  char **patterns; /* file globs, at least one */
  size_t n_patterns;
  ferry_compression_t compression; /* default NONE */

  ferry_image_format_t format;
  int height, width, channels; /* raw: required; jpeg: 0 = any, channels 3 */
  char *image_key;             /* default "image" */
  char *label_key;             /* default "label"; NULL: no label */

  ferry_image_op_t ops[FERRY_SPEC_MAX_OPS]; /* in order, after decode */
  size_t n_ops;

  bool shuffle;
  uint64_t shuffle_seed;
  uint32_t shuffle_buffer;

  uint32_t batch_size; /* 0: no batch stage (a client must then set one) */
  bool drop_remainder;
  int64_t repeat; /* epochs, >= 1; -1 infinite */
} ferry_spec_t;

/* Sets the defaults (no patterns, raw, keys "image" and "label",
 * shuffle off with buffer 10000, repeat 1). Allocates nothing: the
 * default keys are static strings that ferry__spec_close recognises and
 * does not free; any other pattern or key must be ferry__malloc'd. */
void ferry__spec_init(ferry_spec_t *spec);
/* Frees what the spec owns (patterns, keys) and re-initialises it; the
 * struct itself is the caller's. Safe on an init'ed, parsed or already
 * closed spec. */
void ferry__spec_close(ferry_spec_t *spec);

/* Deep copy into `dst` (not initialised first: its old contents are not
 * freed). Returns 0 or FERRY_ENOMEM (then `dst` holds nothing to free). */
int ferry__spec_copy(ferry_spec_t *dst, const ferry_spec_t *src);

/* Field-by-field equality of what the spec means: shuffle seed and buffer
 * only count when shuffling, op fields only those of the op's kind. */
bool ferry__spec_equal(const ferry_spec_t *a, const ferry_spec_t *b);

/* Parses the text form into `spec` (which it initialises first). Errors
 * give FERRY_ESPEC with "column N: expected X, found Y" (1-based column)
 * or which argument is out of range. On error `spec` holds nothing to
 * free. */
int ferry__spec_parse(const char *text, ferry_spec_t *spec, ferry_error_t *err);

/* Checks the spec's semantics (decode sizes, op arguments, blur needing
 * images larger than its radius when sizes are known). */
int ferry__spec_validate(const ferry_spec_t *spec, ferry_error_t *err);

/* Canonical text form in a ferry_free()-able string; parse(format(s)) == s.
 * FERRY_ESPEC when the spec does not validate, FERRY_ENOMEM. */
int ferry__spec_format(const ferry_spec_t *spec, char **out);

/* Canonical protobuf serialization (ferry.v1.PipelineSpec) in a
 * ferry_free()-able buffer (FERRY_ESPEC when the spec does not validate),
 * and its inverse (which validates, and refuses unknown fields). */
int ferry__spec_pack(const ferry_spec_t *spec, uint8_t **out, size_t *len);
int ferry__spec_unpack(const uint8_t *buf, size_t len, ferry_spec_t *spec,
                       ferry_error_t *err);

/* 64-bit fingerprint of the canonical serialization; stable across
 * versions for the same spec. Allocates nothing; 0 for a spec that does
 * not validate. */
uint64_t ferry__spec_fingerprint(const ferry_spec_t *spec);

/* Output image shape after decode and ops: returns 0 and sets h, w, c, or
 * FERRY_ESHAPE when it depends on the record (JPEG of any size and no
 * resize). */
int ferry__spec_output_shape(const ferry_spec_t *spec, int *h, int *w, int *c);

/* The deterministic prefix (spec_prefix.c): how many leading ops, after
 * the decode, depend only on the record (resize, dilate, blur,
 * resize(S), center_crop; not random_resized_crop, whose crop is drawn
 * per epoch). The decode always belongs to it, except where a JPEG
 * decode fuses with a random first crop: then nothing does and the
 * result is -1. *why (may be NULL) gets a static sentence saying so. */
int ferry__spec_det_prefix(const ferry_spec_t *spec, const char **why);
/* The first n_ops ops as a spec of their own into `out` (initialised
 * here; ferry__spec_close it): no shuffle, batch or repeat, one "*"
 * pattern (a cache entry is keyed by the shard, not the globs). */
int ferry__spec_prefix(const ferry_spec_t *spec, size_t n_ops,
                       ferry_spec_t *out);
/* The fingerprint of that prefix, mixed with the prefix format version;
 * never 0 for a valid spec (0: invalid). */
uint64_t ferry__spec_prefix_fingerprint(const ferry_spec_t *spec,
                                        size_t n_ops);

/* Expands the patterns (glob(3), sorted, deduplicated) into a
 * ferry_free()-able array of ferry_free()-able paths. Directories and
 * files whose name ends in ".idx" (DALI index files next to the shards)
 * are left out. No match for a pattern (or only those) is FERRY_ENOENT
 * naming the pattern. */
int ferry__spec_expand_files(const ferry_spec_t *spec, char ***files, size_t *n,
                             ferry_error_t *err);
void ferry__spec_free_files(char **files, size_t n);

#endif /* FERRY_SPEC_H */
