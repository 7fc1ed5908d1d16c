/* The pipeline spec: text parser, validation, canonical text, protobuf
 * pack/unpack, fingerprint, output shape and file expansion. The grammar,
 * every stage's arguments and their bounds are documented in
 * docs/PROTOCOL.md ("Pipeline spec"); keep the two in step.
 */
#include "ferry/spec.h"

#include <errno.h>
#include <glob.h>
#include <limits.h>
#include <locale.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/alloc.h"
#include "ferry/clocale.h"
#include "ferry/crop.h"
#include "ferry/pb_alloc.h"
#include "ferry/v1/common.pb-c.h"

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

/* The defaults ferry_spec_init puts in: static, so init cannot fail, and
 * ferry_spec_close knows not to free them. */
static char default_image_key[] = "image";
static char default_label_key[] = "label";

static const char *const stage_names =
    "tfrecord, decode, label, resize, dilate, blur, random_resized_crop, "
    "center_crop, shuffle, batch, repeat";

/* ---------------------------------------------------------------------
 * Small helpers: ownership of keys, the C locale, UTF-8, text checks.
 */

static bool is_default_key(const char *s) {
  return s == default_image_key || s == default_label_key;
}

static void free_key(char *s) {
  if (s != NULL && !is_default_key(s))
    ferry__free(s);
}

/* Length of the well-formed UTF-8 sequence at `s` (shortest form, no
 * surrogates, at most U+10FFFF), or 0. Stops at a NUL, which is never a
 * continuation byte. */
static size_t utf8_seq(const unsigned char *s) {
  unsigned c = s[0];
  size_t n, i;
  unsigned lo = 0x80, hi = 0xBF;
  if (c < 0x80)
    return 1;
  if (c >= 0xC2 && c <= 0xDF)
    n = 2;
  else if (c >= 0xE0 && c <= 0xEF)
    n = 3;
  else if (c >= 0xF0 && c <= 0xF4)
    n = 4;
  else
    return 0;
  if (c == 0xE0)
    lo = 0xA0;
  else if (c == 0xED)
    hi = 0x9F;
  else if (c == 0xF0)
    lo = 0x90;
  else if (c == 0xF4)
    hi = 0x8F;
  if (s[1] < lo || s[1] > hi)
    return 0;
  for (i = 2; i < n; i++)
    if (s[i] < 0x80 || s[i] > 0xBF)
      return 0;
  return n;
}

static bool is_ctl(unsigned c) { return c < 0x20 || c == 0x7F; }

/* Why a spec string (pattern or key) is unacceptable, or NULL. Strings
 * are UTF-8 (they travel in proto3 `string` fields, which strict parsers
 * check) without control characters other than tab and newline (the
 * only ones the text form can escape). */
static const char *text_problem(const char *s) {
  const unsigned char *u = (const unsigned char *)s;
  if (s == NULL)
    return "is missing";
  if (*u == 0)
    return "is empty";
  while (*u != 0) {
    size_t n = utf8_seq(u);
    if (n == 0)
      return "is not valid UTF-8";
    if (n == 1 && is_ctl(*u) && *u != '\t' && *u != '\n')
      return "contains a control character";
    u += n;
  }
  return NULL;
}

/* ---------------------------------------------------------------------
 * Init, close, copy, equality.
 */

void ferry_spec_init(ferry_spec_t *spec) {
  memset(spec, 0, sizeof(*spec));
  spec->compression = FERRY_COMPRESSION_NONE;
  spec->format = FERRY_IMAGE_RAW;
  spec->image_key = default_image_key;
  spec->label_key = default_label_key;
  spec->shuffle_buffer = DEFAULT_SHUFFLE_BUFFER;
  spec->repeat = 1;
}

void ferry_spec_close(ferry_spec_t *spec) {
  size_t i;
  if (spec == NULL)
    return;
  if (spec->patterns != NULL) {
    for (i = 0; i < spec->n_patterns; i++)
      ferry__free(spec->patterns[i]);
    ferry__free(spec->patterns);
  }
  free_key(spec->image_key);
  free_key(spec->label_key);
  ferry_spec_init(spec);
}

static bool str_eq(const char *a, const char *b) {
  if (a == NULL || b == NULL)
    return a == b;
  return strcmp(a, b) == 0;
}

static bool op_eq(const ferry_image_op_t *a, const ferry_image_op_t *b) {
  if (a->kind != b->kind)
    return false;
  switch (a->kind) {
  case FERRY_OP_RESIZE:
    return a->a == b->a && a->b == b->b;
  case FERRY_OP_DILATE:
    return a->a == b->a;
  case FERRY_OP_BLUR:
    return a->a == b->a && memcmp(&a->sigma, &b->sigma, sizeof(float)) == 0;
  case FERRY_OP_RANDOM_RESIZED_CROP:
    return a->a == b->a && a->b == b->b && a->exact == b->exact &&
           memcmp(a->scale, b->scale, sizeof(a->scale)) == 0 &&
           memcmp(a->ratio, b->ratio, sizeof(a->ratio)) == 0;
  case FERRY_OP_RESIZE_SHORTER:
    return a->a == b->a && a->exact == b->exact;
  case FERRY_OP_CENTER_CROP:
    return a->a == b->a && a->b == b->b;
  }
  return false;
}

bool ferry_spec_equal(const ferry_spec_t *a, const ferry_spec_t *b) {
  size_t i;
  if (a->n_patterns != b->n_patterns || a->compression != b->compression ||
      a->format != b->format || a->height != b->height ||
      a->width != b->width || a->channels != b->channels ||
      !str_eq(a->image_key, b->image_key) ||
      !str_eq(a->label_key, b->label_key) || a->n_ops != b->n_ops ||
      a->n_ops > FERRY_SPEC_MAX_OPS || a->shuffle != b->shuffle ||
      a->batch_size != b->batch_size ||
      a->drop_remainder != b->drop_remainder || a->repeat != b->repeat)
    return false;
  if (a->shuffle && (a->shuffle_seed != b->shuffle_seed ||
                     a->shuffle_buffer != b->shuffle_buffer))
    return false;
  if (a->n_patterns > 0 && (a->patterns == NULL || b->patterns == NULL))
    return a->patterns == b->patterns;
  for (i = 0; i < a->n_patterns; i++)
    if (!str_eq(a->patterns[i], b->patterns[i]))
      return false;
  for (i = 0; i < a->n_ops; i++)
    if (!op_eq(&a->ops[i], &b->ops[i]))
      return false;
  return true;
}

static int dup_key(const char *s, char **out) {
  if (s == NULL || is_default_key(s)) {
    *out = (char *)s;
    return 0;
  }
  *out = ferry__strdup(s);
  return *out != NULL ? 0 : FERRY_ENOMEM;
}

int ferry_spec_copy(ferry_spec_t *dst, const ferry_spec_t *src) {
  size_t i;
  *dst = *src;
  /* Until each is copied, the pointers are ones close may free. */
  dst->patterns = NULL;
  dst->n_patterns = 0;
  dst->image_key = NULL;
  dst->label_key = NULL;
  if (src->n_patterns > 0) {
    dst->patterns = ferry__calloc(src->n_patterns, sizeof(char *));
    if (dst->patterns == NULL)
      goto oom;
    dst->n_patterns = src->n_patterns;
    for (i = 0; i < src->n_patterns; i++) {
      if (src->patterns[i] == NULL)
        continue;
      dst->patterns[i] = ferry__strdup(src->patterns[i]);
      if (dst->patterns[i] == NULL)
        goto oom;
    }
  }
  if (dup_key(src->image_key, &dst->image_key) != 0 ||
      dup_key(src->label_key, &dst->label_key) != 0)
    goto oom;
  return 0;
oom:
  ferry_spec_close(dst);
  return FERRY_ENOMEM;
}

/* ---------------------------------------------------------------------
 * Validation. Shared by ferry_spec_validate, the parser (which passes
 * the stage positions so that messages carry a column) and unpack.
 */

typedef enum {
  T_EOF,
  T_IDENT,
  T_STRING,
  T_NUMBER,
  T_LPAREN,
  T_RPAREN,
  T_COMMA,
  T_PIPE,
  T_EQUALS,
  T_BAD
} tok_kind;

typedef struct {
  tok_kind kind;
  size_t pos; /* byte offset in the text */
  size_t len;
  bool is_int; /* T_NUMBER without '.' or exponent */
} token;

typedef struct {
  const char *text;
  ferry_error_t *err;
  token tok; /* the current token */
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

/* "column N: " (or "line L, column N: " past a newline) for a byte
 * offset, or "" without a parser. */
static const char *loc(const parser *p, size_t pos, locbuf *b) {
  size_t i, line = 1, col = 1;
  if (p == NULL)
    return "";
  for (i = 0; i < pos && p->text[i] != '\0'; i++) {
    if (p->text[i] == '\n') {
      line++;
      col = 1;
    } else {
      col++;
    }
  }
  if (line == 1)
    snprintf(b->s, sizeof(b->s), "column %zu: ", col);
  else
    snprintf(b->s, sizeof(b->s), "line %zu, column %zu: ", line, col);
  return b->s;
}

static int spec_err(ferry_error_t *err, const char *fmt, ...)
    FERRY_PRINTF(2, 3);

static int spec_err(ferry_error_t *err, const char *fmt, ...) {
  if (err != NULL) {
    va_list ap;
    err->code = FERRY_ESPEC;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
    va_end(ap);
  }
  return FERRY_ESPEC;
}

static int check_bytes(const parser *p, size_t pos, const char *what,
                       uint64_t h, uint64_t w, uint64_t c,
                       ferry_error_t *err) {
  locbuf lb;
  if (h * w * c > MAX_IMAGE_BYTES)
    return spec_err(err,
                    "%s%s: a %llux%llux%llu image is over the %llu-byte "
                    "limit",
                    loc(p, pos, &lb), what, (unsigned long long)h,
                    (unsigned long long)w, (unsigned long long)c,
                    MAX_IMAGE_BYTES);
  return 0;
}

static int validate_impl(const ferry_spec_t *s, const parser *p,
                         const stage_pos *sp, ferry_error_t *err) {
  static const stage_pos none;
  locbuf lb;
  size_t i;
  int h, w, c, rc;
  const char *why;

  if (sp == NULL)
    sp = &none;
  if (s->n_patterns == 0 || s->patterns == NULL)
    return spec_err(err, "%stfrecord: needs at least one file pattern",
                    loc(p, sp->tfrecord, &lb));
  for (i = 0; i < s->n_patterns; i++) {
    if ((why = text_problem(s->patterns[i])) != NULL)
      return spec_err(err, "%stfrecord: pattern %zu %s",
                      loc(p, sp->tfrecord, &lb), i + 1, why);
  }
  if ((unsigned)s->compression > FERRY_COMPRESSION_AUTO)
    return spec_err(err, "tfrecord: unknown compression %d",
                    (int)s->compression);

  if (s->format == FERRY_IMAGE_RAW) {
    if (s->height < 1 || s->height > MAX_DECODE_DIM || s->width < 1 ||
        s->width > MAX_DECODE_DIM || s->channels < 1 ||
        s->channels > MAX_CHANNELS)
      return spec_err(err,
                      "%sdecode(raw): height and width must be in 1..%d "
                      "and channels in 1..%d, found %d, %d, %d",
                      loc(p, sp->decode, &lb), MAX_DECODE_DIM, MAX_CHANNELS,
                      s->height, s->width, s->channels);
  } else if (s->format == FERRY_IMAGE_JPEG) {
    if (s->channels != 3)
      return spec_err(err, "%sdecode(jpeg): channels must be 3, found %d",
                      loc(p, sp->decode, &lb), s->channels);
    if ((s->height == 0) != (s->width == 0))
      return spec_err(err,
                      "%sdecode(jpeg): give both height and width or "
                      "neither, found %d, %d",
                      loc(p, sp->decode, &lb), s->height, s->width);
    if (s->height != 0 &&
        (s->height < 1 || s->height > MAX_DECODE_DIM || s->width < 1 ||
         s->width > MAX_DECODE_DIM))
      return spec_err(err,
                      "%sdecode(jpeg): height and width must be in 1..%d, "
                      "found %d, %d",
                      loc(p, sp->decode, &lb), MAX_DECODE_DIM, s->height,
                      s->width);
  } else {
    return spec_err(err, "decode: unknown image format %d", (int)s->format);
  }
  h = s->height;
  w = s->width;
  c = s->channels;
  if (h != 0 && (rc = check_bytes(p, sp->decode, "decode", (uint64_t)h,
                                  (uint64_t)w, (uint64_t)c, err)) != 0)
    return rc;
  if ((why = text_problem(s->image_key)) != NULL)
    return spec_err(err, "%sdecode: image key %s", loc(p, sp->decode, &lb),
                    why);
  if (s->label_key != NULL && (why = text_problem(s->label_key)) != NULL)
    return spec_err(err, "%slabel: key %s", loc(p, sp->label, &lb), why);

  if (s->n_ops > FERRY_SPEC_MAX_OPS)
    return spec_err(err, "too many image ops: %zu (at most %d)", s->n_ops,
                    FERRY_SPEC_MAX_OPS);
  for (i = 0; i < s->n_ops; i++) {
    const ferry_image_op_t *op = &s->ops[i];
    const char *at = loc(p, sp->ops[i], &lb);
    switch (op->kind) {
    case FERRY_OP_RESIZE:
      if (op->a < 1 || op->a > MAX_RESIZE_DIM || op->b < 1 ||
          op->b > MAX_RESIZE_DIM)
        return spec_err(err,
                        "%sresize (op %zu): height and width must be in "
                        "1..%d, found %d, %d",
                        at, i + 1, MAX_RESIZE_DIM, op->a, op->b);
      h = op->a;
      w = op->b;
      if ((rc = check_bytes(p, sp->ops[i], "resize", (uint64_t)h,
                            (uint64_t)w, (uint64_t)c, err)) != 0)
        return rc;
      break;
    case FERRY_OP_DILATE:
      if (op->a != 3)
        return spec_err(err,
                        "%sdilate (op %zu): size must be 3 (the only size "
                        "supported for now), found %d",
                        at, i + 1, op->a);
      break;
    case FERRY_OP_BLUR:
      if (op->a < MIN_BLUR || op->a > MAX_BLUR || op->a % 2 == 0)
        return spec_err(err,
                        "%sblur (op %zu): size must be an odd integer in "
                        "%d..%d, found %d",
                        at, i + 1, MIN_BLUR, MAX_BLUR, op->a);
      /* Written so that NaN fails too. */
      if (!(op->sigma >= (float)MIN_SIGMA && op->sigma <= (float)MAX_SIGMA))
        return spec_err(err,
                        "%sblur (op %zu): sigma must be in %g..%g, found %g",
                        at, i + 1, MIN_SIGMA, MAX_SIGMA, (double)op->sigma);
      /* REFLECT padding without the edge needs more pixels than the
       * kernel's radius on each side. */
      if (h != 0 && (h <= op->a / 2 || w <= op->a / 2))
        return spec_err(err,
                        "%sblur (op %zu): a %dx%d image is too small for "
                        "size %d (height and width must be > %d)",
                        at, i + 1, h, w, op->a, op->a / 2);
      break;
    case FERRY_OP_RANDOM_RESIZED_CROP:
    case FERRY_OP_CENTER_CROP: {
      const char *name = op->kind == FERRY_OP_CENTER_CROP
                             ? "center_crop"
                             : "random_resized_crop";
      if (c > 4)
        return spec_err(err,
                        "%s%s (op %zu): images of 1 to 4 channels, this "
                        "one has %d",
                        at, name, i + 1, c);
      if (op->a < 1 || op->a > MAX_RESIZE_DIM || op->b < 1 ||
          op->b > MAX_RESIZE_DIM)
        return spec_err(err,
                        "%s%s (op %zu): height and width must be in "
                        "1..%d, found %d, %d",
                        at, name, i + 1, MAX_RESIZE_DIM, op->a, op->b);
      if (op->kind == FERRY_OP_RANDOM_RESIZED_CROP) {
        /* Written so that NaN fails too. */
        if (!(op->scale[0] > 0.0f && op->scale[0] <= op->scale[1] &&
              op->scale[1] <= 1.0f))
          return spec_err(err,
                          "%srandom_resized_crop (op %zu): scale must be "
                          "(min, max) with 0 < min <= max <= 1, found "
                          "(%g, %g)",
                          at, i + 1, (double)op->scale[0],
                          (double)op->scale[1]);
        if (!(op->ratio[0] >= (float)MIN_RATIO &&
              op->ratio[0] <= op->ratio[1] &&
              op->ratio[1] <= (float)MAX_RATIO))
          return spec_err(err,
                          "%srandom_resized_crop (op %zu): ratio must be "
                          "(min, max) with %g <= min <= max <= %g, found "
                          "(%g, %g)",
                          at, i + 1, MIN_RATIO, MAX_RATIO,
                          (double)op->ratio[0], (double)op->ratio[1]);
      }
      h = op->a;
      w = op->b;
      if ((rc = check_bytes(p, sp->ops[i], name, (uint64_t)h, (uint64_t)w,
                            (uint64_t)c, err)) != 0)
        return rc;
      break;
    }
    case FERRY_OP_RESIZE_SHORTER:
      if (c > 4)
        return spec_err(err,
                        "%sresize (op %zu): resize(S) takes images of 1 to "
                        "4 channels, this one has %d",
                        at, i + 1, c);
      if (op->a < 1 || op->a > MAX_RESIZE_DIM)
        return spec_err(err,
                        "%sresize (op %zu): the shorter side must be in "
                        "1..%d, found %d",
                        at, i + 1, MAX_RESIZE_DIM, op->a);
      if (h != 0) {
        ferry_resize_shorter_size(h, w, op->a, &h, &w);
        if ((rc = check_bytes(p, sp->ops[i], "resize", (uint64_t)h,
                              (uint64_t)w, (uint64_t)c, err)) != 0)
          return rc;
      }
      break;
    default:
      return spec_err(err, "%sop %zu: unknown kind %d", at, i + 1,
                      (int)op->kind);
    }
  }

  if (s->shuffle && (s->shuffle_buffer < 1 ||
                     s->shuffle_buffer > MAX_SHUFFLE_BUFFER))
    return spec_err(err, "%sshuffle: buffer must be in 1..%d, found %u",
                    loc(p, sp->shuffle, &lb), MAX_SHUFFLE_BUFFER,
                    s->shuffle_buffer);
  if (s->batch_size > MAX_BATCH)
    return spec_err(err, "%sbatch: size must be in 1..%d, found %u",
                    loc(p, sp->batch, &lb), MAX_BATCH, s->batch_size);
  if (s->batch_size == 0 && s->drop_remainder)
    return spec_err(err, "batch: drop_remainder without a batch size");
  if (s->repeat != -1 && s->repeat < 1)
    return spec_err(err,
                    "%srepeat: count must be >= 1 or -1 (infinite), "
                    "found %lld",
                    loc(p, sp->repeat, &lb), (long long)s->repeat);
  return 0;
}

int ferry_spec_validate(const ferry_spec_t *spec, ferry_error_t *err) {
  if (spec == NULL)
    return ferry__seterr(err, FERRY_EINVAL, "spec: NULL");
  return validate_impl(spec, NULL, NULL, err);
}

/* ---------------------------------------------------------------------
 * Lexer.
 */

static bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' ||
         c == '\v';
}
static bool is_digit(char c) { return c >= '0' && c <= '9'; }
static bool is_ident_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
static bool is_ident(char c) { return is_ident_start(c) || is_digit(c); }

/* What a token looks like in a message: 'x' for punctuation and names,
 * the literal for numbers and strings (cut at 40 bytes, non-ASCII as
 * \xNN), "end of input". */
typedef struct {
  char s[200];
} tokbuf;

static const char *describe(const parser *p, const token *t, tokbuf *b) {
  const unsigned char *src = (const unsigned char *)p->text + t->pos;
  size_t n = t->len, i, o = 0;
  bool quote = t->kind != T_NUMBER && t->kind != T_STRING;
  if (t->kind == T_EOF)
    return "end of input";
  if (t->kind == T_BAD && (src[0] < 0x20 || src[0] >= 0x7F)) {
    snprintf(b->s, sizeof(b->s), "byte 0x%02x", src[0]);
    return b->s;
  }
  if (quote)
    b->s[o++] = '\'';
  for (i = 0; i < n && i < 40; i++) {
    if (src[i] >= 0x20 && src[i] < 0x7F) {
      b->s[o++] = (char)src[i];
    } else {
      snprintf(b->s + o, sizeof(b->s) - o, "\\x%02x", src[i]);
      o += 4;
    }
  }
  if (i < n) {
    memcpy(b->s + o, "...", 3);
    o += 3;
  }
  if (quote)
    b->s[o++] = '\'';
  b->s[o] = '\0';
  return b->s;
}

/* Lexes the token at or after `pos` into *t. Strings are checked here
 * (escapes, control characters, UTF-8, termination), so a T_STRING is
 * always decodable. */
static int lex(parser *p, size_t pos, token *t) {
  const char *s = p->text;
  locbuf lb;
  size_t i;
  while (is_space(s[pos]))
    pos++;
  t->pos = pos;
  t->len = 1;
  t->is_int = false;
  switch (s[pos]) {
  case '\0':
    t->kind = T_EOF;
    t->len = 0;
    return 0;
  case '(':
    t->kind = T_LPAREN;
    return 0;
  case ')':
    t->kind = T_RPAREN;
    return 0;
  case ',':
    t->kind = T_COMMA;
    return 0;
  case '|':
    t->kind = T_PIPE;
    return 0;
  case '=':
    t->kind = T_EQUALS;
    return 0;
  case '"':
    for (i = pos + 1;;) {
      unsigned char c = (unsigned char)s[i];
      if (c == '"')
        break;
      if (c == '\0')
        return spec_err(p->err,
                        "%sexpected '\"' to end the string that starts at "
                        "byte %zu, found end of input",
                        loc(p, i, &lb), pos + 1);
      if (c == '\\') {
        char e = s[i + 1];
        if (e != '"' && e != '\\' && e != 'n' && e != 't') {
          if (e == '\0' || is_ctl((unsigned char)e) ||
              (unsigned char)e >= 0x80)
            return spec_err(p->err,
                            "%sexpected an escape (\\\" \\\\ \\n \\t) after "
                            "'\\', found %s",
                            loc(p, i, &lb),
                            e == '\0' ? "end of input" : "a special byte");
          return spec_err(p->err,
                          "%sexpected an escape (\\\" \\\\ \\n \\t), found "
                          "'\\%c'",
                          loc(p, i, &lb), e);
        }
        i += 2;
        continue;
      }
      if (is_ctl(c))
        return spec_err(p->err,
                        "%sexpected a printable character or an escape in "
                        "a string, found byte 0x%02x",
                        loc(p, i, &lb), c);
      {
        size_t n = utf8_seq((const unsigned char *)s + i);
        if (n == 0)
          return spec_err(p->err,
                          "%sexpected UTF-8 text in a string, found byte "
                          "0x%02x",
                          loc(p, i, &lb), c);
        i += n;
      }
    }
    t->kind = T_STRING;
    t->len = i + 1 - pos;
    return 0;
  default:
    break;
  }
  if (is_ident_start(s[pos])) {
    for (i = pos; is_ident(s[i]); i++)
      ;
    t->kind = T_IDENT;
    t->len = i - pos;
    return 0;
  }
  i = pos;
  if (s[i] == '-')
    i++;
  if (is_digit(s[i]) || (s[i] == '.' && is_digit(s[i + 1]))) {
    bool is_int = true;
    while (is_digit(s[i]))
      i++;
    if (s[i] == '.') {
      is_int = false;
      for (i++; is_digit(s[i]); i++)
        ;
    }
    if ((s[i] == 'e' || s[i] == 'E') &&
        (is_digit(s[i + 1]) ||
         ((s[i + 1] == '+' || s[i + 1] == '-') && is_digit(s[i + 2])))) {
      is_int = false;
      for (i += 2; is_digit(s[i]); i++)
        ;
    }
    t->kind = T_NUMBER;
    t->len = i - pos;
    t->is_int = is_int;
    return 0;
  }
  /* Anything else is a token of one character (a whole UTF-8 sequence
   * when there is one) that no rule accepts; the parser reports it. */
  t->kind = T_BAD;
  {
    size_t n = utf8_seq((const unsigned char *)s + pos);
    t->len = n > 1 ? n : 1;
  }
  return 0;
}

static int advance(parser *p) {
  return lex(p, p->tok.pos + p->tok.len, &p->tok);
}

static int expected(parser *p, const token *t, const char *what) {
  locbuf lb;
  tokbuf tb;
  return spec_err(p->err, "%sexpected %s, found %s", loc(p, t->pos, &lb),
                  what, describe(p, t, &tb));
}

static bool tok_is(const parser *p, const token *t, const char *word) {
  size_t n = strlen(word);
  return t->kind == T_IDENT && t->len == n &&
         memcmp(p->text + t->pos, word, n) == 0;
}

/* Decodes a string token into a ferry__malloc'd string; NULL: no
 * memory. */
static char *tok_string(const parser *p, const token *t) {
  const char *s = p->text + t->pos + 1;
  size_t n = t->len - 2, i, o = 0;
  char *out = ferry__malloc(n + 1);
  if (out == NULL)
    return NULL;
  for (i = 0; i < n; i++) {
    if (s[i] == '\\') {
      i++;
      out[o++] = s[i] == 'n' ? '\n' : s[i] == 't' ? '\t' : s[i];
    } else {
      out[o++] = s[i];
    }
  }
  out[o] = '\0';
  return out;
}

/* An integer token as sign and magnitude; false when it does not fit in
 * 64 bits. */
static bool tok_int(const parser *p, const token *t, bool *neg,
                    uint64_t *mag) {
  const char *s = p->text + t->pos;
  size_t i = 0;
  uint64_t v = 0;
  *neg = s[0] == '-';
  if (*neg)
    i++;
  for (; i < t->len; i++) {
    unsigned d = (unsigned)(s[i] - '0');
    if (v > (UINT64_MAX - d) / 10)
      return false;
    v = v * 10 + d;
  }
  *mag = v;
  return true;
}

/* ---------------------------------------------------------------------
 * Stages and their parameters.
 */

typedef enum {
  P_INT,    /* int64 in lo..hi */
  P_U64,    /* any uint64 */
  P_FLOAT,  /* float32 in flo..fhi */
  P_PAIR,   /* (NUMBER, NUMBER): two float32 in flo..fhi */
  P_BOOL,   /* true | false */
  P_STRING, /* "..." */
  P_ENUM,   /* one of words */
  P_KEY     /* "..." or none */
} ptype;

typedef struct {
  const char *name;
  ptype type;
  bool named_only;
  int64_t lo, hi;
  double flo, fhi;
  const char *const *words;
  const char *rule; /* the out-of-range message, when not "in lo..hi" */
} param_def;

typedef struct {
  const char *name;
  const param_def *params;
  int n_params;
  bool variadic; /* tfrecord: any number of positional strings */
} stage_def;

typedef enum {
  ST_TFRECORD,
  ST_DECODE,
  ST_LABEL,
  ST_RESIZE,
  ST_DILATE,
  ST_BLUR,
  ST_RRC,
  ST_CENTER_CROP,
  ST_SHUFFLE,
  ST_BATCH,
  ST_REPEAT,
  ST_COUNT
} stage_id;

static const char *const compression_words[] = {"none", "gzip", "zlib",
                                                "auto", NULL};
static const char *const format_words[] = {"raw", "jpeg", NULL};

static const param_def tfrecord_params[] = {
    {.name = "compression", .type = P_ENUM, .named_only = true,
     .words = compression_words}};
static const param_def decode_params[] = {
    {.name = "format", .type = P_ENUM, .words = format_words},
    {.name = "height", .type = P_INT, .lo = 1, .hi = MAX_DECODE_DIM},
    {.name = "width", .type = P_INT, .lo = 1, .hi = MAX_DECODE_DIM},
    {.name = "channels", .type = P_INT, .lo = 1, .hi = MAX_CHANNELS},
    {.name = "key", .type = P_STRING, .named_only = true}};
static const param_def label_params[] = {{.name = "key", .type = P_KEY}};
static const param_def resize_params[] = {
    {.name = "height", .type = P_INT, .lo = 1, .hi = MAX_RESIZE_DIM},
    {.name = "width", .type = P_INT, .lo = 1, .hi = MAX_RESIZE_DIM},
    {.name = "exact", .type = P_BOOL, .named_only = true}};
static const param_def rrc_params[] = {
    {.name = "height", .type = P_INT, .lo = 1, .hi = MAX_RESIZE_DIM},
    {.name = "width", .type = P_INT, .lo = 1, .hi = MAX_RESIZE_DIM},
    {.name = "scale", .type = P_PAIR, .named_only = true, .flo = 0.0,
     .fhi = 1.0, .rule = "must be (min, max) with 0 < min <= max <= 1"},
    {.name = "ratio", .type = P_PAIR, .named_only = true, .flo = MIN_RATIO,
     .fhi = MAX_RATIO,
     .rule = "must be (min, max) with 0.01 <= min <= max <= 100"},
    {.name = "exact", .type = P_BOOL, .named_only = true}};
static const param_def center_crop_params[] = {
    {.name = "height", .type = P_INT, .lo = 1, .hi = MAX_RESIZE_DIM},
    {.name = "width", .type = P_INT, .lo = 1, .hi = MAX_RESIZE_DIM}};
static const param_def dilate_params[] = {
    {.name = "size", .type = P_INT, .lo = 3, .hi = 3,
     .rule = "must be 3 (the only size supported for now)"}};
static const param_def blur_params[] = {
    {.name = "size", .type = P_INT, .lo = MIN_BLUR, .hi = MAX_BLUR,
     .rule = "must be an odd integer in 3..31"},
    {.name = "sigma", .type = P_FLOAT, .flo = MIN_SIGMA, .fhi = MAX_SIGMA}};
static const param_def shuffle_params[] = {
    {.name = "seed", .type = P_U64, .named_only = true},
    {.name = "buffer", .type = P_INT, .named_only = true, .lo = 1,
     .hi = MAX_SHUFFLE_BUFFER}};
static const param_def batch_params[] = {
    {.name = "size", .type = P_INT, .lo = 1, .hi = MAX_BATCH},
    {.name = "drop_remainder", .type = P_BOOL, .named_only = true}};
static const param_def repeat_params[] = {
    {.name = "count", .type = P_INT, .lo = 1, .hi = INT64_MAX,
     .rule = "must be >= 1 (repeat() repeats forever)"}};

#define STAGE(n, params, v) {n, params, sizeof(params) / sizeof(params[0]), v}
static const stage_def stages[ST_COUNT] = {
    STAGE("tfrecord", tfrecord_params, true),
    STAGE("decode", decode_params, false),
    STAGE("label", label_params, false),
    STAGE("resize", resize_params, false),
    STAGE("dilate", dilate_params, false),
    STAGE("blur", blur_params, false),
    STAGE("random_resized_crop", rrc_params, false),
    STAGE("center_crop", center_crop_params, false),
    STAGE("shuffle", shuffle_params, false),
    STAGE("batch", batch_params, false),
    STAGE("repeat", repeat_params, false)};
#undef STAGE

#define MAX_PARAMS 5

/* One parsed argument. `s` is owned until a stage moves it into the
 * spec. */
typedef struct {
  bool set;
  size_t pos;
  int64_t i;
  uint64_t u;
  float f, f2; /* P_FLOAT; P_PAIR: f, f2 */
  bool b;
  int e;
  char *s; /* P_STRING, P_KEY (NULL with P_KEY: none) */
} argval;

static void words_list(const char *const *words, char *buf, size_t cap) {
  size_t o = 0;
  buf[0] = '\0';
  for (; *words != NULL; words++)
    o += (size_t)snprintf(buf + o, cap - o, "%s%s", o ? ", " : "", *words);
}

static int range_err(parser *p, const token *t, const stage_def *sd,
                     const param_def *pd) {
  locbuf lb;
  tokbuf tb;
  if (pd->rule != NULL)
    return spec_err(p->err, "%s%s %s %s, found %s", loc(p, t->pos, &lb),
                    sd->name, pd->name, pd->rule, describe(p, t, &tb));
  if (pd->type == P_FLOAT)
    return spec_err(p->err, "%s%s %s must be in %g..%g, found %s",
                    loc(p, t->pos, &lb), sd->name, pd->name, pd->flo,
                    pd->fhi, describe(p, t, &tb));
  if (pd->type == P_U64)
    return spec_err(p->err, "%s%s %s must be in 0..%llu, found %s",
                    loc(p, t->pos, &lb), sd->name, pd->name,
                    (unsigned long long)UINT64_MAX, describe(p, t, &tb));
  return spec_err(p->err, "%s%s %s must be in %lld..%lld, found %s",
                  loc(p, t->pos, &lb), sd->name, pd->name,
                  (long long)pd->lo, (long long)pd->hi, describe(p, t, &tb));
}

/* Token t (a NUMBER) as a float32 in pd's bounds; does not move. */
static int token_float(parser *p, const token *t, const stage_def *sd,
                       const param_def *pd, float *out) {
  locale_t old;
  char num[128], what[160], *end;
  if (t->kind != T_NUMBER) {
    snprintf(what, sizeof(what), "a number for %s %s", sd->name, pd->name);
    return expected(p, t, what);
  }
  /* A copy of just the token, so that strtof cannot read past what the
   * lexer took (hex floats, "inf"); parsing as float32 directly rounds
   * once. Absurdly long numbers are out of range. */
  if (t->len >= sizeof(num))
    return range_err(p, t, sd, pd);
  memcpy(num, p->text + t->pos, t->len);
  num[t->len] = '\0';
  old = ferry__c_locale_enter();
  *out = strtof(num, &end);
  ferry__c_locale_leave(old);
  /* Bounds as float32, as validate_impl checks them (0.01 is below
   * 0.01 in double once it is a float). */
  if (*end != '\0' || !(*out >= (float)pd->flo && *out <= (float)pd->fhi))
    return range_err(p, t, sd, pd);
  return 0;
}

/* Converts the current token into `av` by the parameter's type, checks
 * its bounds, and moves past it. */
static int read_value(parser *p, const stage_def *sd, const param_def *pd,
                      argval *av) {
  token t = p->tok;
  char what[160];
  bool neg;
  uint64_t mag;

  av->set = true;
  av->pos = t.pos;
  switch (pd->type) {
  case P_INT:
    if (t.kind != T_NUMBER || !t.is_int) {
      snprintf(what, sizeof(what), "an integer for %s %s", sd->name,
               pd->name);
      return expected(p, &t, what);
    }
    if (!tok_int(p, &t, &neg, &mag) || mag > (uint64_t)INT64_MAX)
      return range_err(p, &t, sd, pd);
    av->i = neg ? -(int64_t)mag : (int64_t)mag;
    if (av->i < pd->lo || av->i > pd->hi)
      return range_err(p, &t, sd, pd);
    break;
  case P_U64:
    if (t.kind != T_NUMBER || !t.is_int) {
      snprintf(what, sizeof(what), "an integer for %s %s", sd->name,
               pd->name);
      return expected(p, &t, what);
    }
    if (!tok_int(p, &t, &neg, &mag) || (neg && mag != 0))
      return range_err(p, &t, sd, pd);
    av->u = mag;
    break;
  case P_FLOAT: {
    int rc = token_float(p, &t, sd, pd, &av->f);
    if (rc != 0)
      return rc;
    break;
  }
  case P_PAIR: {
    int rc;
    snprintf(what, sizeof(what), "(min, max) for %s %s", sd->name,
             pd->name);
    if (t.kind != T_LPAREN)
      return expected(p, &t, what);
    if ((rc = advance(p)) != 0 ||
        (rc = token_float(p, &p->tok, sd, pd, &av->f)) != 0 ||
        (rc = advance(p)) != 0)
      return rc;
    if (p->tok.kind != T_COMMA)
      return expected(p, &p->tok, "',' between min and max");
    if ((rc = advance(p)) != 0 ||
        (rc = token_float(p, &p->tok, sd, pd, &av->f2)) != 0 ||
        (rc = advance(p)) != 0)
      return rc;
    if (p->tok.kind != T_RPAREN)
      return expected(p, &p->tok, "')' after max");
    if (!(av->f <= av->f2) || (pd->flo == 0.0 && !(av->f > 0.0f))) {
      locbuf lb;
      return spec_err(p->err, "%s%s %s %s, found (%g, %g)",
                      loc(p, t.pos, &lb), sd->name, pd->name, pd->rule,
                      (double)av->f, (double)av->f2);
    }
    break;
  }
  case P_BOOL:
    if (tok_is(p, &t, "true")) {
      av->b = true;
    } else if (tok_is(p, &t, "false")) {
      av->b = false;
    } else {
      snprintf(what, sizeof(what), "true or false for %s %s", sd->name,
               pd->name);
      return expected(p, &t, what);
    }
    break;
  case P_ENUM: {
    int k;
    for (k = 0; pd->words[k] != NULL; k++)
      if (tok_is(p, &t, pd->words[k]))
        break;
    if (pd->words[k] == NULL) {
      char list[80];
      words_list(pd->words, list, sizeof(list));
      snprintf(what, sizeof(what), "one of %s for %s %s", list, sd->name,
               pd->name);
      return expected(p, &t, what);
    }
    av->e = k;
    break;
  }
  case P_STRING:
  case P_KEY:
    if (pd->type == P_KEY && tok_is(p, &t, "none")) {
      av->s = NULL;
      break;
    }
    if (t.kind != T_STRING) {
      snprintf(what, sizeof(what), "a \"string\"%s for %s %s",
               pd->type == P_KEY ? " or none" : "", sd->name, pd->name);
      return expected(p, &t, what);
    }
    av->s = tok_string(p, &t);
    if (av->s == NULL)
      return ferry__seterr(p->err, FERRY_ENOMEM,
                           "out of memory parsing the spec");
    if (av->s[0] == '\0') {
      locbuf lb;
      return spec_err(p->err, "%s%s %s must not be empty%s",
                      loc(p, t.pos, &lb), sd->name, pd->name,
                      pd->type == P_KEY ? " (label(none) means no label)"
                                        : "");
    }
    break;
  }
  return advance(p);
}

/* Appends a pattern (the current string token) to the spec. */
static int add_pattern(parser *p, ferry_spec_t *spec) {
  char *s;
  locbuf lb;
  if (p->tok.kind != T_STRING)
    return expected(p, &p->tok, "a \"file pattern\" for tfrecord");
  if (p->tok.len == 2)
    return spec_err(p->err, "%stfrecord pattern must not be empty",
                    loc(p, p->tok.pos, &lb));
  if (!FERRY__GROW(spec->patterns, p->patterns_cap, spec->n_patterns + 1, 4))
    return ferry__seterr(p->err, FERRY_ENOMEM,
                         "out of memory parsing the spec");
  s = tok_string(p, &p->tok);
  if (s == NULL)
    return ferry__seterr(p->err, FERRY_ENOMEM,
                         "out of memory parsing the spec");
  spec->patterns[spec->n_patterns++] = s;
  return advance(p);
}

static int find_param(const parser *p, const stage_def *sd, const token *t) {
  int i;
  for (i = 0; i < sd->n_params; i++)
    if (tok_is(p, t, sd->params[i].name))
      return i;
  return -1;
}

/* Parses "( args )" after a stage name into av[] (and, for tfrecord,
 * straight into spec->patterns). */
static int parse_args(parser *p, const stage_def *sd, argval *av,
                      ferry_spec_t *spec) {
  bool named_seen = false, first_arg = true;
  int n_pos = 0, rc;
  locbuf lb;
  tokbuf tb;

  if (p->tok.kind != T_LPAREN)
    return expected(p, &p->tok, "'('");
  if ((rc = advance(p)) != 0)
    return rc;
  if (p->tok.kind == T_RPAREN)
    return advance(p);
  for (;;) {
    token t = p->tok, next;
    bool named = false;
    if (t.kind != T_IDENT && t.kind != T_STRING && t.kind != T_NUMBER)
      return expected(p, &t,
                      first_arg ? "an argument or ')'" : "an argument");
    first_arg = false;
    if (t.kind == T_IDENT) {
      if ((rc = lex(p, t.pos + t.len, &next)) != 0)
        return rc;
      named = next.kind == T_EQUALS;
    }
    if (named) {
      int k = find_param(p, sd, &t);
      if (k < 0) {
        char list[120];
        size_t o = 0;
        int i;
        list[0] = '\0';
        for (i = 0; i < sd->n_params; i++)
          o += (size_t)snprintf(list + o, sizeof(list) - o, "%s%s",
                                i ? ", " : "", sd->params[i].name);
        return spec_err(p->err,
                        "%sexpected an argument name of %s (%s), found %s",
                        loc(p, t.pos, &lb), sd->name, list,
                        describe(p, &t, &tb));
      }
      if (av[k].set)
        return spec_err(p->err, "%s%s argument '%s' given twice",
                        loc(p, t.pos, &lb), sd->name, sd->params[k].name);
      named_seen = true;
      p->tok = next;
      if ((rc = advance(p)) != 0)
        return rc;
      if (p->tok.kind != T_IDENT && p->tok.kind != T_STRING &&
          p->tok.kind != T_NUMBER &&
          !(p->tok.kind == T_LPAREN && sd->params[k].type == P_PAIR))
        return expected(p, &p->tok, "a value after '='");
      if ((rc = read_value(p, sd, &sd->params[k], &av[k])) != 0)
        return rc;
    } else if (named_seen) {
      return expected(p, &t,
                      "a named argument (positional ones come first)");
    } else if (sd->variadic) {
      if ((rc = add_pattern(p, spec)) != 0)
        return rc;
    } else {
      int i, k = -1, seen = 0, total = 0;
      for (i = 0; i < sd->n_params; i++) {
        if (sd->params[i].named_only)
          continue;
        if (seen++ == n_pos)
          k = i;
        total++;
      }
      if (k < 0) {
        char what[160];
        if (total == 0) {
          size_t o = (size_t)snprintf(what, sizeof(what),
                                      "a named argument (");
          for (i = 0; i < sd->n_params; i++)
            o += (size_t)snprintf(what + o, sizeof(what) - o, "%s%s=",
                                  i ? ", " : "", sd->params[i].name);
          snprintf(what + o, sizeof(what) - o, ")");
        } else {
          snprintf(what, sizeof(what),
                   "')' (%s takes at most %d positional argument%s)",
                   sd->name, total, total == 1 ? "" : "s");
        }
        return expected(p, &t, what);
      }
      n_pos++;
      if ((rc = read_value(p, sd, &sd->params[k], &av[k])) != 0)
        return rc;
    }
    if (p->tok.kind == T_RPAREN)
      return advance(p);
    if (p->tok.kind != T_COMMA)
      return expected(p, &p->tok, "',' or ')'");
    if ((rc = advance(p)) != 0)
      return rc;
  }
}

/* Moves a parsed key into *slot, using the static default when it is
 * one. */
static void set_key(char **slot, argval *av, char *deflt) {
  free_key(*slot);
  if (av->s != NULL && strcmp(av->s, deflt) == 0) {
    ferry__free(av->s);
    *slot = deflt;
  } else {
    *slot = av->s;
  }
  av->s = NULL;
}

/* Stores a stage's arguments in the spec, with the checks that involve
 * more than one argument. */
static int finish_stage(parser *p, stage_id id, size_t pos, argval *av,
                        ferry_spec_t *spec) {
  locbuf lb;
  const char *at = loc(p, pos, &lb);
  ferry_image_op_t *op = &spec->ops[spec->n_ops];

  switch (id) {
  case ST_TFRECORD:
    if (spec->n_patterns == 0)
      return spec_err(p->err,
                      "%stfrecord needs at least one \"file pattern\"", at);
    if (av[0].set)
      spec->compression = (ferry_compression_t)av[0].e;
    break;
  case ST_DECODE:
    if (!av[0].set)
      return spec_err(p->err,
                      "%sdecode needs a format: decode(raw, H, W, C) or "
                      "decode(jpeg)",
                      at);
    spec->format = (ferry_image_format_t)av[0].e;
    if (spec->format == FERRY_IMAGE_RAW) {
      if (!av[1].set || !av[2].set || !av[3].set)
        return spec_err(p->err,
                        "%sdecode(raw) needs height, width and channels: "
                        "decode(raw, H, W, C)",
                        at);
      spec->channels = (int)av[3].i;
    } else {
      if (av[1].set != av[2].set)
        return spec_err(p->err,
                        "%sdecode(jpeg) needs both height and width, or "
                        "neither",
                        at);
      if (av[3].set && av[3].i != 3)
        return spec_err(p->err,
                        "%sdecode channels must be 3 for jpeg, found %lld",
                        loc(p, av[3].pos, &lb), (long long)av[3].i);
      spec->channels = 3;
    }
    spec->height = av[1].set ? (int)av[1].i : 0;
    spec->width = av[2].set ? (int)av[2].i : 0;
    if (av[4].set)
      set_key(&spec->image_key, &av[4], default_image_key);
    break;
  case ST_LABEL:
    if (!av[0].set)
      return spec_err(p->err,
                      "%slabel needs a key: label(\"name\") or label(none)",
                      at);
    set_key(&spec->label_key, &av[0], default_label_key);
    break;
  case ST_RESIZE:
    if (!av[0].set)
      return spec_err(p->err,
                      "%sresize needs height and width, resize(H, W), or "
                      "the shorter side, resize(S)",
                      at);
    if (av[1].set) {
      if (av[2].set)
        return spec_err(p->err,
                        "%sresize exact applies to resize(S) only "
                        "(resize(H, W) is never fused with the decode)",
                        loc(p, av[2].pos, &lb));
      op->kind = FERRY_OP_RESIZE;
      op->b = (int)av[1].i;
    } else {
      op->kind = FERRY_OP_RESIZE_SHORTER;
      op->exact = av[2].set && av[2].b;
    }
    op->a = (int)av[0].i;
    spec->n_ops++;
    break;
  case ST_RRC:
    if (!av[0].set)
      return spec_err(p->err,
                      "%srandom_resized_crop needs a size: "
                      "random_resized_crop(224) or (H, W)",
                      at);
    op->kind = FERRY_OP_RANDOM_RESIZED_CROP;
    op->a = (int)av[0].i;
    op->b = av[1].set ? (int)av[1].i : op->a;
    op->scale[0] = av[2].set ? av[2].f : 0.08f;
    op->scale[1] = av[2].set ? av[2].f2 : 1.0f;
    op->ratio[0] = av[3].set ? av[3].f : 0.75f;
    op->ratio[1] = av[3].set ? av[3].f2 : (float)(4.0 / 3.0);
    op->exact = av[4].set && av[4].b;
    spec->n_ops++;
    break;
  case ST_CENTER_CROP:
    if (!av[0].set)
      return spec_err(p->err,
                      "%scenter_crop needs a size: center_crop(224) or "
                      "(H, W)",
                      at);
    op->kind = FERRY_OP_CENTER_CROP;
    op->a = (int)av[0].i;
    op->b = av[1].set ? (int)av[1].i : op->a;
    spec->n_ops++;
    break;
  case ST_DILATE:
    if (!av[0].set)
      return spec_err(p->err, "%sdilate needs a size: dilate(3)", at);
    op->kind = FERRY_OP_DILATE;
    op->a = (int)av[0].i;
    spec->n_ops++;
    break;
  case ST_BLUR:
    if (!av[0].set || !av[1].set)
      return spec_err(p->err,
                      "%sblur needs a size and a sigma: blur(11, 0.8)", at);
    if (av[0].i % 2 == 0)
      return spec_err(p->err,
                      "%sblur size must be an odd integer in 3..31, "
                      "found %lld",
                      loc(p, av[0].pos, &lb), (long long)av[0].i);
    op->kind = FERRY_OP_BLUR;
    op->a = (int)av[0].i;
    op->sigma = av[1].f;
    spec->n_ops++;
    break;
  case ST_SHUFFLE:
    spec->shuffle = true;
    spec->shuffle_seed = av[0].set ? av[0].u : 0;
    spec->shuffle_buffer =
        av[1].set ? (uint32_t)av[1].i : DEFAULT_SHUFFLE_BUFFER;
    break;
  case ST_BATCH:
    if (!av[0].set)
      return spec_err(p->err, "%sbatch needs a size: batch(N)", at);
    spec->batch_size = (uint32_t)av[0].i;
    spec->drop_remainder = av[1].set && av[1].b;
    break;
  case ST_REPEAT:
    spec->repeat = av[0].set ? av[0].i : -1;
    break;
  case ST_COUNT:
    break;
  }
  return 0;
}

static bool is_op_stage(stage_id id) {
  return id == ST_RESIZE || id == ST_DILATE || id == ST_BLUR ||
         id == ST_RRC || id == ST_CENTER_CROP;
}

/* Where each stage may appear: tfrecord first; decode and label (in
 * either order) next; then the image ops; then shuffle, batch and repeat
 * in that order. Each stage but the image ops at most once. */
static int check_order(parser *p, stage_id id, const bool *seen,
                       const size_t *first, size_t n_ops) {
  locbuf lb, lb2;
  const char *at = loc(p, p->tok.pos, &lb);
  const char *name = stages[id].name;

  if (!seen[ST_TFRECORD] && id != ST_TFRECORD)
    return spec_err(p->err,
                    "%sexpected tfrecord(...) as the first stage, found "
                    "'%s'",
                    at, name);
  if (!is_op_stage(id) && seen[id]) {
    /* Only the column of the first one is wanted: drop "column " and
     * the trailing ": " from the location. */
    const char *first_at = loc(p, first[id], &lb2);
    size_t n = strlen(first_at);
    return spec_err(p->err, "%sduplicate stage '%s' (first at %.*s)", at,
                    name, (int)(n >= 2 ? n - 2 : n), first_at);
  }
  if (id == ST_TFRECORD || id == ST_DECODE)
    return 0;
  if (id == ST_LABEL) {
    if (n_ops > 0 || seen[ST_SHUFFLE] || seen[ST_BATCH] || seen[ST_REPEAT])
      return spec_err(p->err,
                      "%sexpected label right before or after decode, "
                      "found it after the %s",
                      at, n_ops > 0 ? "image ops" : "shuffle/batch/repeat");
    return 0;
  }
  if (!seen[ST_DECODE])
    return spec_err(p->err,
                    "%sexpected decode(...) after tfrecord, found '%s'", at,
                    name);
  if (is_op_stage(id)) {
    const char *after = seen[ST_SHUFFLE] ? "shuffle"
                        : seen[ST_BATCH] ? "batch"
                        : seen[ST_REPEAT] ? "repeat"
                                          : NULL;
    if (after != NULL)
      return spec_err(p->err,
                      "%sexpected image ops before shuffle, batch and "
                      "repeat, found '%s' after '%s'",
                      at, name, after);
    if (n_ops >= FERRY_SPEC_MAX_OPS)
      return spec_err(p->err, "%stoo many image ops (at most %d)", at,
                      FERRY_SPEC_MAX_OPS);
    return 0;
  }
  if (id == ST_SHUFFLE && (seen[ST_BATCH] || seen[ST_REPEAT]))
    return spec_err(p->err,
                    "%sexpected shuffle before batch and repeat, found it "
                    "after '%s'",
                    at, seen[ST_BATCH] ? "batch" : "repeat");
  if (id == ST_BATCH && seen[ST_REPEAT])
    return spec_err(p->err,
                    "%sexpected batch before repeat, found it after "
                    "'repeat'",
                    at);
  return 0;
}

int ferry_spec_parse(const char *text, ferry_spec_t *spec,
                     ferry_error_t *err) {
  parser p = {.text = text, .err = err};
  stage_pos sp;
  bool seen[ST_COUNT] = {false};
  size_t first[ST_COUNT] = {0};
  int rc;

  if (spec == NULL || text == NULL)
    return ferry__seterr(err, FERRY_EINVAL, "spec parse: NULL argument");
  ferry_spec_init(spec);
  memset(&sp, 0, sizeof(sp));
  if ((rc = lex(&p, 0, &p.tok)) != 0)
    goto fail;
  for (;;) {
    argval av[MAX_PARAMS];
    stage_id id;
    size_t pos = p.tok.pos, n_ops = spec->n_ops;
    int i;

    if (p.tok.kind != T_IDENT) {
      rc = expected(&p, &p.tok, "a stage name");
      goto fail;
    }
    for (id = 0; id < ST_COUNT; id++)
      if (tok_is(&p, &p.tok, stages[id].name))
        break;
    if (id == ST_COUNT) {
      char what[192];
      snprintf(what, sizeof(what), "a stage name (%s)", stage_names);
      rc = expected(&p, &p.tok, what);
      goto fail;
    }
    if ((rc = check_order(&p, id, seen, first, spec->n_ops)) != 0)
      goto fail;
    memset(av, 0, sizeof(av));
    rc = advance(&p);
    if (rc == 0)
      rc = parse_args(&p, &stages[id], av, spec);
    if (rc == 0)
      rc = finish_stage(&p, id, pos, av, spec);
    for (i = 0; i < MAX_PARAMS; i++)
      ferry__free(av[i].s);
    if (rc != 0)
      goto fail;
    seen[id] = true;
    if (first[id] == 0)
      first[id] = pos;
    switch (id) {
    case ST_TFRECORD: sp.tfrecord = pos; break;
    case ST_DECODE: sp.decode = pos; break;
    case ST_LABEL: sp.label = pos; break;
    case ST_SHUFFLE: sp.shuffle = pos; break;
    case ST_BATCH: sp.batch = pos; break;
    case ST_REPEAT: sp.repeat = pos; break;
    default: sp.ops[n_ops] = pos; break;
    }
    if (p.tok.kind == T_EOF)
      break;
    if (p.tok.kind != T_PIPE) {
      rc = expected(&p, &p.tok, "'|' or end of input");
      goto fail;
    }
    if ((rc = advance(&p)) != 0)
      goto fail;
  }
  if (!seen[ST_DECODE]) {
    rc = expected(&p, &p.tok, "'| decode(...)'");
    goto fail;
  }
  if ((rc = validate_impl(spec, &p, &sp, err)) != 0)
    goto fail;
  return 0;
fail:
  ferry_spec_close(spec);
  return rc;
}

/* ---------------------------------------------------------------------
 * Canonical text.
 */

typedef struct {
  char *buf;
  size_t len, cap;
  bool oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
  if (b->oom)
    return;
  if (n > SIZE_MAX - 1 - b->len ||
      !FERRY__GROW(b->buf, b->cap, b->len + n + 1, 128)) {
    b->oom = true;
    return;
  }
  memcpy(b->buf + b->len, s, n);
  b->len += n;
  b->buf[b->len] = '\0';
}

static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

static void sb_printf(sbuf *b, const char *fmt, ...) FERRY_PRINTF(2, 3);
static void sb_printf(sbuf *b, const char *fmt, ...) {
  char tmp[96];
  va_list ap;
  int n;
  va_start(ap, fmt);
  n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
  va_end(ap);
  if (n > 0)
    sb_put(b, tmp, (size_t)n < sizeof(tmp) ? (size_t)n : sizeof(tmp) - 1);
}

static void sb_quote(sbuf *b, const char *s) {
  sb_put(b, "\"", 1);
  for (; *s != '\0'; s++) {
    switch (*s) {
    case '"': sb_put(b, "\\\"", 2); break;
    case '\\': sb_put(b, "\\\\", 2); break;
    case '\n': sb_put(b, "\\n", 2); break;
    case '\t': sb_put(b, "\\t", 2); break;
    default: sb_put(b, s, 1); break;
    }
  }
  sb_put(b, "\"", 1);
}

/* The shortest "%.Ng" without an exponent that reads back as the same
 * float32; "%.9g" (which always reads back) when there is none. */
static void format_float(float f, char *out, size_t cap) {
  locale_t old = ferry__c_locale_enter();
  int prec;
  for (prec = 1; prec <= 9; prec++) {
    snprintf(out, cap, "%.*g", prec, (double)f);
    if (strchr(out, 'e') == NULL && strtof(out, NULL) == f)
      break;
  }
  if (prec > 9)
    snprintf(out, cap, "%.9g", (double)f);
  ferry__c_locale_leave(old);
}

int ferry_spec_format(const ferry_spec_t *spec, char **out) {
  static const char *const comp[] = {"none", "gzip", "zlib", "auto"};
  sbuf b = {0};
  size_t i;
  int rc;

  if (out == NULL || spec == NULL)
    return FERRY_EINVAL;
  *out = NULL;
  if ((rc = validate_impl(spec, NULL, NULL, NULL)) != 0)
    return rc;
  sb_str(&b, "tfrecord(");
  for (i = 0; i < spec->n_patterns; i++) {
    if (i > 0)
      sb_str(&b, ", ");
    sb_quote(&b, spec->patterns[i]);
  }
  if (spec->compression != FERRY_COMPRESSION_NONE)
    sb_printf(&b, ", compression=%s", comp[spec->compression]);
  sb_str(&b, ") | decode(");
  if (spec->format == FERRY_IMAGE_RAW)
    sb_printf(&b, "raw, %d, %d, %d", spec->height, spec->width,
              spec->channels);
  else if (spec->height != 0)
    sb_printf(&b, "jpeg, %d, %d", spec->height, spec->width);
  else
    sb_str(&b, "jpeg");
  if (strcmp(spec->image_key, default_image_key) != 0) {
    sb_str(&b, ", key=");
    sb_quote(&b, spec->image_key);
  }
  sb_str(&b, ")");
  if (spec->label_key == NULL) {
    sb_str(&b, " | label(none)");
  } else if (strcmp(spec->label_key, default_label_key) != 0) {
    sb_str(&b, " | label(");
    sb_quote(&b, spec->label_key);
    sb_str(&b, ")");
  }
  for (i = 0; i < spec->n_ops; i++) {
    const ferry_image_op_t *op = &spec->ops[i];
    char num[32];
    switch (op->kind) {
    case FERRY_OP_RESIZE:
      sb_printf(&b, " | resize(%d, %d)", op->a, op->b);
      break;
    case FERRY_OP_DILATE:
      sb_printf(&b, " | dilate(%d)", op->a);
      break;
    case FERRY_OP_BLUR:
      format_float(op->sigma, num, sizeof(num));
      sb_printf(&b, " | blur(%d, %s)", op->a, num);
      break;
    case FERRY_OP_RANDOM_RESIZED_CROP: {
      char n1[32], n2[32], n3[32];
      format_float(op->scale[0], num, sizeof(num));
      format_float(op->scale[1], n1, sizeof(n1));
      format_float(op->ratio[0], n2, sizeof(n2));
      format_float(op->ratio[1], n3, sizeof(n3));
      sb_printf(&b,
                " | random_resized_crop(%d, %d, scale=(%s, %s), "
                "ratio=(%s, %s)%s)",
                op->a, op->b, num, n1, n2, n3,
                op->exact ? ", exact=true" : "");
      break;
    }
    case FERRY_OP_RESIZE_SHORTER:
      sb_printf(&b, " | resize(%d%s)", op->a,
                op->exact ? ", exact=true" : "");
      break;
    case FERRY_OP_CENTER_CROP:
      sb_printf(&b, " | center_crop(%d, %d)", op->a, op->b);
      break;
    }
  }
  if (spec->shuffle) {
    const char *sep = "";
    sb_str(&b, " | shuffle(");
    if (spec->shuffle_seed != 0) {
      sb_printf(&b, "seed=%llu", (unsigned long long)spec->shuffle_seed);
      sep = ", ";
    }
    if (spec->shuffle_buffer != DEFAULT_SHUFFLE_BUFFER)
      sb_printf(&b, "%sbuffer=%u", sep, spec->shuffle_buffer);
    sb_str(&b, ")");
  }
  if (spec->batch_size != 0)
    sb_printf(&b, " | batch(%u%s)", spec->batch_size,
              spec->drop_remainder ? ", drop_remainder=true" : "");
  if (spec->repeat == -1)
    sb_str(&b, " | repeat()");
  else if (spec->repeat != 1)
    sb_printf(&b, " | repeat(%lld)", (long long)spec->repeat);
  if (b.oom) {
    ferry__free(b.buf);
    return FERRY_ENOMEM;
  }
  *out = b.buf;
  return 0;
}

/* ---------------------------------------------------------------------
 * Protobuf form. The message is built on the stack, pointing into the
 * spec, so packing (and the fingerprint) allocate nothing but the output.
 */

typedef struct {
  Ferry__V1__PipelineSpec msg;
  Ferry__V1__Source source;
  Ferry__V1__Decode decode;
  Ferry__V1__Label label;
  Ferry__V1__Shuffle shuffle;
  Ferry__V1__ImageOp op[FERRY_SPEC_MAX_OPS];
  Ferry__V1__ImageOp *opp[FERRY_SPEC_MAX_OPS];
  Ferry__V1__Resize resize[FERRY_SPEC_MAX_OPS];
  Ferry__V1__Dilate dilate[FERRY_SPEC_MAX_OPS];
  Ferry__V1__Blur blur[FERRY_SPEC_MAX_OPS];
  Ferry__V1__RandomResizedCrop rrc[FERRY_SPEC_MAX_OPS];
  Ferry__V1__ResizeShorter rshort[FERRY_SPEC_MAX_OPS];
  Ferry__V1__CenterCrop ccrop[FERRY_SPEC_MAX_OPS];
} pb_spec;

/* Canonical choices: every sub-message is present (Label with an empty
 * key means no label); the shuffle message only when shuffling; scalars
 * as the spec has them, so proto3 leaves out the zeros. */
static void build_msg(const ferry_spec_t *s, pb_spec *m) {
  size_t i;
  ferry__v1__pipeline_spec__init(&m->msg);
  ferry__v1__source__init(&m->source);
  ferry__v1__decode__init(&m->decode);
  ferry__v1__label__init(&m->label);
  ferry__v1__shuffle__init(&m->shuffle);

  m->source.n_patterns = s->n_patterns;
  m->source.patterns = s->patterns;
  m->source.compression = (Ferry__V1__Compression)s->compression;
  m->msg.source = &m->source;

  m->decode.format = (Ferry__V1__ImageFormat)s->format;
  m->decode.height = (uint32_t)s->height;
  m->decode.width = (uint32_t)s->width;
  m->decode.channels = (uint32_t)s->channels;
  m->decode.key = s->image_key;
  m->msg.decode = &m->decode;

  m->label.key =
      s->label_key != NULL ? s->label_key : (char *)protobuf_c_empty_string;
  m->msg.label = &m->label;

  for (i = 0; i < s->n_ops; i++) {
    const ferry_image_op_t *op = &s->ops[i];
    ferry__v1__image_op__init(&m->op[i]);
    switch (op->kind) {
    case FERRY_OP_RESIZE:
      ferry__v1__resize__init(&m->resize[i]);
      m->resize[i].height = (uint32_t)op->a;
      m->resize[i].width = (uint32_t)op->b;
      m->op[i].op_case = FERRY__V1__IMAGE_OP__OP_RESIZE;
      m->op[i].resize = &m->resize[i];
      break;
    case FERRY_OP_DILATE:
      ferry__v1__dilate__init(&m->dilate[i]);
      m->dilate[i].size = (uint32_t)op->a;
      m->op[i].op_case = FERRY__V1__IMAGE_OP__OP_DILATE;
      m->op[i].dilate = &m->dilate[i];
      break;
    case FERRY_OP_BLUR:
      ferry__v1__blur__init(&m->blur[i]);
      m->blur[i].size = (uint32_t)op->a;
      m->blur[i].sigma = op->sigma;
      m->op[i].op_case = FERRY__V1__IMAGE_OP__OP_BLUR;
      m->op[i].blur = &m->blur[i];
      break;
    case FERRY_OP_RANDOM_RESIZED_CROP:
      ferry__v1__random_resized_crop__init(&m->rrc[i]);
      m->rrc[i].height = (uint32_t)op->a;
      m->rrc[i].width = (uint32_t)op->b;
      m->rrc[i].scale_min = op->scale[0];
      m->rrc[i].scale_max = op->scale[1];
      m->rrc[i].ratio_min = op->ratio[0];
      m->rrc[i].ratio_max = op->ratio[1];
      m->rrc[i].exact = op->exact;
      m->op[i].op_case = FERRY__V1__IMAGE_OP__OP_RANDOM_RESIZED_CROP;
      m->op[i].random_resized_crop = &m->rrc[i];
      break;
    case FERRY_OP_RESIZE_SHORTER:
      ferry__v1__resize_shorter__init(&m->rshort[i]);
      m->rshort[i].size = (uint32_t)op->a;
      m->rshort[i].exact = op->exact;
      m->op[i].op_case = FERRY__V1__IMAGE_OP__OP_RESIZE_SHORTER;
      m->op[i].resize_shorter = &m->rshort[i];
      break;
    case FERRY_OP_CENTER_CROP:
      ferry__v1__center_crop__init(&m->ccrop[i]);
      m->ccrop[i].height = (uint32_t)op->a;
      m->ccrop[i].width = (uint32_t)op->b;
      m->op[i].op_case = FERRY__V1__IMAGE_OP__OP_CENTER_CROP;
      m->op[i].center_crop = &m->ccrop[i];
      break;
    }
    m->opp[i] = &m->op[i];
  }
  m->msg.n_ops = s->n_ops;
  m->msg.ops = s->n_ops > 0 ? m->opp : NULL;

  if (s->shuffle) {
    m->shuffle.enabled = 1;
    m->shuffle.seed = s->shuffle_seed;
    m->shuffle.buffer = s->shuffle_buffer;
    m->msg.shuffle = &m->shuffle;
  }
  m->msg.batch_size = s->batch_size;
  m->msg.drop_remainder = s->drop_remainder;
  m->msg.repeat = s->repeat;
}

int ferry_spec_pack(const ferry_spec_t *spec, uint8_t **out, size_t *len) {
  pb_spec m;
  size_t n;
  uint8_t *buf;
  int rc;

  if (spec == NULL || out == NULL || len == NULL)
    return FERRY_EINVAL;
  *out = NULL;
  *len = 0;
  if ((rc = validate_impl(spec, NULL, NULL, NULL)) != 0)
    return rc;
  build_msg(spec, &m);
  n = ferry__v1__pipeline_spec__get_packed_size(&m.msg);
  /* One byte more so that an empty message still gets a buffer. */
  buf = ferry__malloc(n + 1);
  if (buf == NULL)
    return FERRY_ENOMEM;
  ferry__v1__pipeline_spec__pack(&m.msg, buf);
  *out = buf;
  *len = n;
  return 0;
}

static int unknown_fields(const ProtobufCMessage *m, const char *name,
                          ferry_error_t *err) {
  if (m != NULL && m->n_unknown_fields > 0)
    return spec_err(err,
                    "%s: unknown field %u (from a newer version?); refusing "
                    "to ignore it",
                    name, m->unknown_fields[0].tag);
  return 0;
}

static int u32_to_int(uint32_t v, const char *what, int *out,
                      ferry_error_t *err) {
  if (v > INT_MAX)
    return spec_err(err, "%s: %u is out of range", what, v);
  *out = (int)v;
  return 0;
}

static int pb_key(const char *s, char *deflt, char **slot) {
  free_key(*slot);
  *slot = NULL;
  if (strcmp(s, deflt) == 0) {
    *slot = deflt;
    return 0;
  }
  *slot = ferry__strdup(s);
  return *slot != NULL ? 0 : FERRY_ENOMEM;
}

/* The spec from an unpacked message, with proto3's defaults mapped:
 * decode key "" is "image", JPEG channels 0 are 3, shuffle buffer 0 is
 * the default, repeat 0 is 1, an absent Label is "label". */
static int from_msg(const Ferry__V1__PipelineSpec *m, ferry_spec_t *s,
                    ferry_error_t *err) {
  size_t i;
  int rc;

  if ((rc = unknown_fields(&m->base, "PipelineSpec", err)) != 0)
    return rc;
  if (m->source == NULL)
    return spec_err(err, "PipelineSpec: source is missing");
  if (m->decode == NULL)
    return spec_err(err, "PipelineSpec: decode is missing");
  if ((rc = unknown_fields(&m->source->base, "Source", err)) != 0 ||
      (rc = unknown_fields(&m->decode->base, "Decode", err)) != 0 ||
      (m->label != NULL &&
       (rc = unknown_fields(&m->label->base, "Label", err)) != 0) ||
      (m->shuffle != NULL &&
       (rc = unknown_fields(&m->shuffle->base, "Shuffle", err)) != 0))
    return rc;

  if (m->source->n_patterns == 0)
    return spec_err(err, "tfrecord: needs at least one file pattern");
  s->patterns = ferry__calloc(m->source->n_patterns, sizeof(char *));
  if (s->patterns == NULL)
    return FERRY_ENOMEM;
  for (i = 0; i < m->source->n_patterns; i++) {
    s->patterns[i] = ferry__strdup(m->source->patterns[i]);
    if (s->patterns[i] == NULL)
      return FERRY_ENOMEM;
    s->n_patterns = i + 1;
  }
  s->compression = (ferry_compression_t)m->source->compression;

  s->format = (ferry_image_format_t)m->decode->format;
  if ((rc = u32_to_int(m->decode->height, "decode height", &s->height,
                       err)) != 0 ||
      (rc = u32_to_int(m->decode->width, "decode width", &s->width,
                       err)) != 0 ||
      (rc = u32_to_int(m->decode->channels, "decode channels", &s->channels,
                       err)) != 0)
    return rc;
  if (s->format == FERRY_IMAGE_JPEG && s->channels == 0)
    s->channels = 3;
  if (m->decode->key[0] != '\0' &&
      (rc = pb_key(m->decode->key, default_image_key, &s->image_key)) != 0)
    return rc;
  if (m->label != NULL) {
    if (m->label->key[0] == '\0') {
      free_key(s->label_key);
      s->label_key = NULL;
    } else if ((rc = pb_key(m->label->key, default_label_key,
                            &s->label_key)) != 0) {
      return rc;
    }
  }

  if (m->n_ops > FERRY_SPEC_MAX_OPS)
    return spec_err(err, "too many image ops: %zu (at most %d)", m->n_ops,
                    FERRY_SPEC_MAX_OPS);
  for (i = 0; i < m->n_ops; i++) {
    const Ferry__V1__ImageOp *o = m->ops[i];
    ferry_image_op_t *op = &s->ops[i];
    const ProtobufCMessage *inner = NULL;
    memset(op, 0, sizeof(*op));
    switch (o->op_case) {
    case FERRY__V1__IMAGE_OP__OP_RESIZE:
      op->kind = FERRY_OP_RESIZE;
      inner = &o->resize->base;
      if ((rc = u32_to_int(o->resize->height, "resize height", &op->a,
                           err)) != 0 ||
          (rc = u32_to_int(o->resize->width, "resize width", &op->b,
                           err)) != 0)
        return rc;
      break;
    case FERRY__V1__IMAGE_OP__OP_DILATE:
      op->kind = FERRY_OP_DILATE;
      inner = &o->dilate->base;
      if ((rc = u32_to_int(o->dilate->size, "dilate size", &op->a, err)) !=
          0)
        return rc;
      break;
    case FERRY__V1__IMAGE_OP__OP_BLUR:
      op->kind = FERRY_OP_BLUR;
      inner = &o->blur->base;
      if ((rc = u32_to_int(o->blur->size, "blur size", &op->a, err)) != 0)
        return rc;
      op->sigma = o->blur->sigma;
      break;
    case FERRY__V1__IMAGE_OP__OP_RANDOM_RESIZED_CROP: {
      const Ferry__V1__RandomResizedCrop *q = o->random_resized_crop;
      op->kind = FERRY_OP_RANDOM_RESIZED_CROP;
      inner = &q->base;
      if ((rc = u32_to_int(q->height, "random_resized_crop height", &op->a,
                           err)) != 0 ||
          (rc = u32_to_int(q->width, "random_resized_crop width", &op->b,
                           err)) != 0)
        return rc;
      op->scale[0] = q->scale_min;
      op->scale[1] = q->scale_max;
      op->ratio[0] = q->ratio_min;
      op->ratio[1] = q->ratio_max;
      op->exact = q->exact != 0;
      break;
    }
    case FERRY__V1__IMAGE_OP__OP_RESIZE_SHORTER:
      op->kind = FERRY_OP_RESIZE_SHORTER;
      inner = &o->resize_shorter->base;
      if ((rc = u32_to_int(o->resize_shorter->size, "resize size", &op->a,
                           err)) != 0)
        return rc;
      op->exact = o->resize_shorter->exact != 0;
      break;
    case FERRY__V1__IMAGE_OP__OP_CENTER_CROP:
      op->kind = FERRY_OP_CENTER_CROP;
      inner = &o->center_crop->base;
      if ((rc = u32_to_int(o->center_crop->height, "center_crop height",
                           &op->a, err)) != 0 ||
          (rc = u32_to_int(o->center_crop->width, "center_crop width",
                           &op->b, err)) != 0)
        return rc;
      break;
    default:
      return spec_err(err, "ops[%zu]: no op set", i);
    }
    if ((rc = unknown_fields(&o->base, "ImageOp", err)) != 0 ||
        (rc = unknown_fields(inner, "ImageOp op", err)) != 0)
      return rc;
    s->n_ops = i + 1;
  }

  if (m->shuffle != NULL && m->shuffle->enabled) {
    s->shuffle = true;
    s->shuffle_seed = m->shuffle->seed;
    s->shuffle_buffer =
        m->shuffle->buffer != 0 ? m->shuffle->buffer : DEFAULT_SHUFFLE_BUFFER;
  }
  s->batch_size = m->batch_size;
  s->drop_remainder = m->drop_remainder != 0;
  s->repeat = m->repeat != 0 ? m->repeat : 1;
  return validate_impl(s, NULL, NULL, err);
}

int ferry_spec_unpack(const uint8_t *buf, size_t len, ferry_spec_t *spec,
                      ferry_error_t *err) {
  bool oom = false;
  ProtobufCAllocator a = ferry__pb_allocator_noting(&oom);
  Ferry__V1__PipelineSpec *m;
  int rc;

  if (spec == NULL || (buf == NULL && len > 0))
    return ferry__seterr(err, FERRY_EINVAL, "spec unpack: NULL argument");
  ferry_spec_init(spec);
  m = ferry__v1__pipeline_spec__unpack(&a, len, buf);
  if (m == NULL) {
    if (oom)
      return ferry__seterr(err, FERRY_ENOMEM,
                           "out of memory unpacking the spec");
    return spec_err(err, "PipelineSpec: malformed protobuf (%zu bytes)",
                    len);
  }
  rc = from_msg(m, spec, err);
  if (rc == FERRY_ENOMEM)
    ferry__seterr(err, rc, "out of memory unpacking the spec");
  ferry__v1__pipeline_spec__free_unpacked(m, &a);
  if (rc != 0)
    ferry_spec_close(spec);
  return rc;
}

/* ---------------------------------------------------------------------
 * Fingerprint: FNV-1a-64 over the canonical serialization, then
 * MurmurHash3's 64-bit finalizer so that every input bit reaches every
 * output bit. Streamed from protobuf-c's packer: no allocation.
 */

typedef struct {
  ProtobufCBuffer base;
  uint64_t h;
} hash_buffer;

static void hash_append(ProtobufCBuffer *b, size_t len,
                        const uint8_t *data) {
  hash_buffer *hb = (hash_buffer *)b;
  uint64_t h = hb->h;
  size_t i;
  for (i = 0; i < len; i++) {
    h ^= data[i];
    h *= 0x100000001b3ull;
  }
  hb->h = h;
}

uint64_t ferry_spec_fingerprint(const ferry_spec_t *spec) {
  pb_spec m;
  hash_buffer hb = {{hash_append}, 0xcbf29ce484222325ull};
  uint64_t h;

  if (spec == NULL || validate_impl(spec, NULL, NULL, NULL) != 0)
    return 0;
  build_msg(spec, &m);
  ferry__v1__pipeline_spec__pack_to_buffer(&m.msg, &hb.base);
  h = hb.h;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 33;
  return h;
}

/* ---------------------------------------------------------------------
 * Output shape and file expansion.
 */

int ferry_spec_output_shape(const ferry_spec_t *spec, int *h, int *w,
                            int *c) {
  int hh = spec->height, ww = spec->width;
  size_t i;
  for (i = 0; i < spec->n_ops && i < FERRY_SPEC_MAX_OPS; i++) {
    const ferry_image_op_t *op = &spec->ops[i];
    if (op->kind == FERRY_OP_RESIZE ||
        op->kind == FERRY_OP_RANDOM_RESIZED_CROP ||
        op->kind == FERRY_OP_CENTER_CROP) {
      hh = op->a;
      ww = op->b;
    } else if (op->kind == FERRY_OP_RESIZE_SHORTER && hh > 0 && ww > 0) {
      ferry_resize_shorter_size(hh, ww, op->a, &hh, &ww);
    }
  }
  if (hh <= 0 || ww <= 0)
    return FERRY_ESHAPE;
  *h = hh;
  *w = ww;
  *c = spec->format == FERRY_IMAGE_JPEG ? 3 : spec->channels;
  return 0;
}

/* glob(3)'s error callback has no user pointer: the failure is kept per
 * thread. Missing directories are "no match", not errors. */
static _Thread_local int glob_errno;
static _Thread_local char glob_errpath[256];

static int glob_error(const char *path, int eerrno) {
  if (eerrno == ENOENT || eerrno == ENOTDIR)
    return 0;
  glob_errno = eerrno;
  snprintf(glob_errpath, sizeof(glob_errpath), "%s", path);
  return 1;
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

void ferry_spec_free_files(char **files, size_t n) {
  size_t i;
  if (files == NULL)
    return;
  for (i = 0; i < n; i++)
    ferry__free(files[i]);
  ferry__free(files);
}

int ferry_spec_expand_files(const ferry_spec_t *spec, char ***files,
                            size_t *n, ferry_error_t *err) {
  char **out = NULL;
  size_t cnt = 0, cap = 0, i, j;
  int rc = 0;

  if (spec == NULL || files == NULL || n == NULL)
    return ferry__seterr(err, FERRY_EINVAL, "expand files: NULL argument");
  *files = NULL;
  *n = 0;
  if (spec->n_patterns == 0 || spec->patterns == NULL)
    return spec_err(err, "tfrecord: needs at least one file pattern");
  for (i = 0; i < spec->n_patterns && rc == 0; i++) {
    const char *pat = spec->patterns[i];
    glob_t g;
    size_t added = 0;
    int grc;

    memset(&g, 0, sizeof(g));
    glob_errno = 0;
    glob_errpath[0] = '\0';
    /* GLOB_MARK flags directories with a trailing '/' so they can be left
     * out: only files are records. */
    grc = glob(pat, GLOB_MARK, glob_error, &g);
    if (grc == GLOB_NOMATCH) {
      rc = ferry__seterr(err, FERRY_ENOENT,
                         "tfrecord: no file matches pattern '%.300s'", pat);
    } else if (grc == GLOB_NOSPACE) {
      rc = ferry__seterr(err, FERRY_ENOMEM,
                         "tfrecord: out of memory expanding '%.300s'", pat);
    } else if (grc != 0) {
      int e = glob_errno ? glob_errno : EIO;
      rc = ferry__seterr(err, ferry_err_from_errno(e),
                         "tfrecord: cannot read directory '%s' while "
                         "expanding '%.200s': %s",
                         glob_errpath, pat, strerror(e));
    }
    for (j = 0; rc == 0 && j < g.gl_pathc; j++) {
      const char *path = g.gl_pathv[j];
      size_t len = strlen(path);
      if (len > 0 && path[len - 1] == '/')
        continue;
      /* DALI index files (FILE.idx, `ferryctl records index`) sit next
       * to the shards and match their globs: never a shard. */
      if (len >= 4 && strcmp(path + len - 4, ".idx") == 0)
        continue;
      if (!FERRY__GROW(out, cap, cnt + 1, 16)) {
        rc = ferry__seterr(err, FERRY_ENOMEM,
                           "tfrecord: out of memory expanding patterns");
        break;
      }
      out[cnt] = ferry__strdup(path);
      if (out[cnt] == NULL) {
        rc = ferry__seterr(err, FERRY_ENOMEM,
                           "tfrecord: out of memory expanding patterns");
        break;
      }
      cnt++;
      added++;
    }
    if (rc == 0 && added == 0)
      rc = ferry__seterr(err, FERRY_ENOENT,
                         "tfrecord: pattern '%.300s' matches only "
                         "directories and .idx index files",
                         pat);
    globfree(&g);
  }
  if (rc != 0) {
    ferry_spec_free_files(out, cnt);
    return rc;
  }
  /* Byte order, not the locale's collation: the file list numbers the
   * splits, so every process must see the same order. */
  qsort(out, cnt, sizeof(char *), cmp_str);
  for (i = 0, j = 0; i < cnt; i++) {
    if (j > 0 && strcmp(out[j - 1], out[i]) == 0)
      ferry__free(out[i]);
    else
      out[j++] = out[i];
  }
  *files = out;
  *n = j;
  return 0;
}
