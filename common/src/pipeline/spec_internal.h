/* What the pipeline spec's files share (spec.c: the model, its
 * validation and the shared helpers; spec_parse.c: the parser, over the
 * lexer of lex.h; spec_format.c: canonical text; spec_proto.c:
 * protobuf form and fingerprint; spec_files.c: file expansion). Not
 * installed. */
#ifndef FERRY_SPEC_INTERNAL_H
#define FERRY_SPEC_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "error_internal.h"
#include "ferry/error.h"
#include "lex.h"
#include "spec.h"

#define DEFAULT_SHUFFLE_BUFFER 10000u
#define MAX_SHUFFLE_BUFFER 100000000
#define MAX_BATCH 1000000
#define MAX_DECODE_DIM 65535
#define MAX_RESIZE_DIM 16384
#define MAX_CHANNELS 16
#define MAX_IMAGE_BYTES (256ull << 20)
#define MIN_BLUR 3
#define MAX_BLUR 31
/* Below this the Gaussian's 2*sigma^2 underflows float32 arithmetic on
 * the way to a NaN kernel; such a blur is the identity anyway. */
#define MIN_SIGMA 0.001
#define MAX_SIGMA 100.0
/* random_resized_crop's aspect ratio bounds (scale is in (0, 1]). */
#define MIN_RATIO 0.01
#define MAX_RATIO 100.0

/* The defaults ferry__spec_init puts in: static storage, so init cannot
 * fail, and ferry__spec_close knows not to free them. */
extern char ferry__spec_default_image_key[];
extern char ferry__spec_default_label_key[];

/* The stage names, for messages. */
extern const char *const ferry__spec_stage_names;

typedef struct {
  const char *text;
  ferry_error_t *err;
  ferry__token_t tok; /* the current token */
  size_t patterns_cap; /* of the spec being parsed */
} parser;

/* Where each stage starts in the text (byte offsets). */
typedef struct {
  size_t tfrecord, decode, label, shuffle, batch, repeat;
  size_t ops[FERRY_SPEC_MAX_OPS];
} stage_pos;

typedef struct {
  char s[64];
} locbuf;

/* Keys: the defaults are never freed; a copy of a default stays the
 * default. */
bool ferry__spec_is_default_key(const char *s);
void ferry__spec_free_key(char *s);
int ferry__spec_dup_key(const char *s, char **out);

/* NULL when s is acceptable text, else what is wrong with it. */
const char *ferry__spec_text_problem(const char *s);

/* "column N: " (or "line L, column N: " past a newline) for a byte
 * offset, or "" without a parser. */
const char *ferry__spec_loc(const parser *p, size_t pos, locbuf *b);
/* FERRY_ESPEC with the message; returns the code. */
int ferry__spec_err(ferry_error_t *err, const char *fmt, ...)
    FERRY_PRINTF(2, 3);
/* Validation shared by ferry__spec_validate, the parser (p and pos give
 * messages a column; NULL without) and unpack. */
int ferry__spec_validate_impl(const ferry_spec_t *s, const parser *p,
                              const stage_pos *pos, ferry_error_t *err);

#endif /* FERRY_SPEC_INTERNAL_H */
