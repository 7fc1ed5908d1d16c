/* The pipeline spec's model: init, close, copy, equality, validation,
 * the output shape, and the helpers its other files share
 * (spec_internal.h). The grammar, every stage's arguments and their
 * bounds are documented in docs/PROTOCOL.md ("Pipeline spec"); keep the
 * two in step.
 */
#include "spec.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "crop.h"
#include "spec_internal.h"

/* The defaults ferry__spec_init puts in: static, so init cannot fail, and
 * ferry__spec_close knows not to free them. */
char ferry__spec_default_image_key[] = "image";
char ferry__spec_default_label_key[] = "label";

const char *const ferry__spec_stage_names =
    "tfrecord, decode, label, resize, dilate, blur, random_resized_crop, "
    "center_crop, shuffle, batch, repeat";

/* ---------------------------------------------------------------------
 * Small helpers: ownership of keys, text checks.
 */

bool ferry__spec_is_default_key(const char *s) {
  return s == ferry__spec_default_image_key || s == ferry__spec_default_label_key;
}

void ferry__spec_free_key(char *s) {
  if (s != NULL && !ferry__spec_is_default_key(s))
    ferry__free(s);
}

/* Why a spec string (pattern or key) is unacceptable, or NULL. Strings
 * are UTF-8 (they travel in proto3 `string` fields, which strict parsers
 * check) without control characters other than tab and newline (the
 * only ones the text form can escape). */
const char *ferry__spec_text_problem(const char *s) {
  const unsigned char *u = (const unsigned char *)s;
  if (s == NULL)
    return "is missing";
  if (*u == 0)
    return "is empty";
  while (*u != 0) {
    size_t n = ferry__lex_utf8_seq(u);
    if (n == 0)
      return "is not valid UTF-8";
    if (n == 1 && ferry__lex_is_ctl(*u) && *u != '\t' && *u != '\n')
      return "contains a control character";
    u += n;
  }
  return NULL;
}

/* ---------------------------------------------------------------------
 * Init, close, copy, equality.
 */

void ferry__spec_init(ferry_spec_t *spec) {
  memset(spec, 0, sizeof(*spec));
  spec->compression = FERRY_COMPRESSION_NONE;
  spec->format = FERRY_IMAGE_RAW;
  spec->image_key = ferry__spec_default_image_key;
  spec->label_key = ferry__spec_default_label_key;
  spec->shuffle_buffer = DEFAULT_SHUFFLE_BUFFER;
  spec->repeat = 1;
}

void ferry__spec_close(ferry_spec_t *spec) {
  size_t i;
  if (spec == NULL)
    return;
  if (spec->patterns != NULL) {
    for (i = 0; i < spec->n_patterns; i++)
      ferry__free(spec->patterns[i]);
    ferry__free(spec->patterns);
  }
  ferry__spec_free_key(spec->image_key);
  ferry__spec_free_key(spec->label_key);
  ferry__spec_init(spec);
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

bool ferry__spec_equal(const ferry_spec_t *a, const ferry_spec_t *b) {
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

int ferry__spec_dup_key(const char *s, char **out) {
  if (s == NULL || ferry__spec_is_default_key(s)) {
    *out = (char *)s;
    return 0;
  }
  *out = ferry__strdup(s);
  return *out != NULL ? 0 : FERRY_ENOMEM;
}

int ferry__spec_copy(ferry_spec_t *dst, const ferry_spec_t *src) {
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
  if (ferry__spec_dup_key(src->image_key, &dst->image_key) != 0 ||
      ferry__spec_dup_key(src->label_key, &dst->label_key) != 0)
    goto oom;
  return 0;
oom:
  ferry__spec_close(dst);
  return FERRY_ENOMEM;
}

/* ---------------------------------------------------------------------
 * Validation. Shared by ferry__spec_validate, the parser (which passes
 * the stage positions so that messages carry a column) and unpack.
 */

/* "column N: " (or "line L, column N: " past a newline) for a byte
 * offset, or "" without a parser. */
const char *ferry__spec_loc(const parser *p, size_t pos, locbuf *b) {
  size_t n;
  if (p == NULL)
    return "";
  n = strlen(ferry__lex_where(p->text, pos, b->s, sizeof(b->s)));
  snprintf(b->s + n, sizeof(b->s) - n, ": ");
  return b->s;
}

int ferry__spec_err(ferry_error_t *err, const char *fmt, ...) {
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
    return ferry__spec_err(err,
                    "%s%s: a %llux%llux%llu image is over the %llu-byte "
                    "limit",
                    ferry__spec_loc(p, pos, &lb), what, (unsigned long long)h,
                    (unsigned long long)w, (unsigned long long)c,
                    MAX_IMAGE_BYTES);
  return 0;
}

int ferry__spec_validate_impl(const ferry_spec_t *s, const parser *p,
                         const stage_pos *sp, ferry_error_t *err) {
  static const stage_pos none;
  locbuf lb;
  size_t i;
  int h, w, c, rc;
  const char *why;

  if (sp == NULL)
    sp = &none;
  if (s->n_patterns == 0 || s->patterns == NULL)
    return ferry__spec_err(err, "%stfrecord: needs at least one file pattern",
                    ferry__spec_loc(p, sp->tfrecord, &lb));
  for (i = 0; i < s->n_patterns; i++) {
    if ((why = ferry__spec_text_problem(s->patterns[i])) != NULL)
      return ferry__spec_err(err, "%stfrecord: pattern %zu %s",
                      ferry__spec_loc(p, sp->tfrecord, &lb), i + 1, why);
  }
  if ((unsigned)s->compression > FERRY_COMPRESSION_AUTO)
    return ferry__spec_err(err, "tfrecord: unknown compression %d",
                    (int)s->compression);

  if (s->format == FERRY_IMAGE_RAW) {
    if (s->height < 1 || s->height > MAX_DECODE_DIM || s->width < 1 ||
        s->width > MAX_DECODE_DIM || s->channels < 1 ||
        s->channels > MAX_CHANNELS)
      return ferry__spec_err(err,
                      "%sdecode(raw): height and width must be in 1..%d "
                      "and channels in 1..%d, found %d, %d, %d",
                      ferry__spec_loc(p, sp->decode, &lb), MAX_DECODE_DIM, MAX_CHANNELS,
                      s->height, s->width, s->channels);
  } else if (s->format == FERRY_IMAGE_JPEG) {
    if (s->channels != 3)
      return ferry__spec_err(err, "%sdecode(jpeg): channels must be 3, found %d",
                      ferry__spec_loc(p, sp->decode, &lb), s->channels);
    if ((s->height == 0) != (s->width == 0))
      return ferry__spec_err(err,
                      "%sdecode(jpeg): give both height and width or "
                      "neither, found %d, %d",
                      ferry__spec_loc(p, sp->decode, &lb), s->height, s->width);
    if (s->height != 0 &&
        (s->height < 1 || s->height > MAX_DECODE_DIM || s->width < 1 ||
         s->width > MAX_DECODE_DIM))
      return ferry__spec_err(err,
                      "%sdecode(jpeg): height and width must be in 1..%d, "
                      "found %d, %d",
                      ferry__spec_loc(p, sp->decode, &lb), MAX_DECODE_DIM, s->height,
                      s->width);
  } else {
    return ferry__spec_err(err, "decode: unknown image format %d", (int)s->format);
  }
  h = s->height;
  w = s->width;
  c = s->channels;
  if (h != 0 && (rc = check_bytes(p, sp->decode, "decode", (uint64_t)h,
                                  (uint64_t)w, (uint64_t)c, err)) != 0)
    return rc;
  if ((why = ferry__spec_text_problem(s->image_key)) != NULL)
    return ferry__spec_err(err, "%sdecode: image key %s", ferry__spec_loc(p, sp->decode, &lb),
                    why);
  if (s->label_key != NULL && (why = ferry__spec_text_problem(s->label_key)) != NULL)
    return ferry__spec_err(err, "%slabel: key %s", ferry__spec_loc(p, sp->label, &lb), why);

  if (s->n_ops > FERRY_SPEC_MAX_OPS)
    return ferry__spec_err(err, "too many image ops: %zu (at most %d)", s->n_ops,
                    FERRY_SPEC_MAX_OPS);
  for (i = 0; i < s->n_ops; i++) {
    const ferry_image_op_t *op = &s->ops[i];
    const char *at = ferry__spec_loc(p, sp->ops[i], &lb);
    switch (op->kind) {
    case FERRY_OP_RESIZE:
      if (op->a < 1 || op->a > MAX_RESIZE_DIM || op->b < 1 ||
          op->b > MAX_RESIZE_DIM)
        return ferry__spec_err(err,
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
        return ferry__spec_err(err,
                        "%sdilate (op %zu): size must be 3 (the only size "
                        "supported for now), found %d",
                        at, i + 1, op->a);
      break;
    case FERRY_OP_BLUR:
      if (op->a < MIN_BLUR || op->a > MAX_BLUR || op->a % 2 == 0)
        return ferry__spec_err(err,
                        "%sblur (op %zu): size must be an odd integer in "
                        "%d..%d, found %d",
                        at, i + 1, MIN_BLUR, MAX_BLUR, op->a);
      /* Written so that NaN fails too. */
      if (!(op->sigma >= (float)MIN_SIGMA && op->sigma <= (float)MAX_SIGMA))
        return ferry__spec_err(err,
                        "%sblur (op %zu): sigma must be in %g..%g, found %g",
                        at, i + 1, MIN_SIGMA, MAX_SIGMA, (double)op->sigma);
      /* REFLECT padding without the edge needs more pixels than the
       * kernel's radius on each side. */
      if (h != 0 && (h <= op->a / 2 || w <= op->a / 2))
        return ferry__spec_err(err,
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
        return ferry__spec_err(err,
                        "%s%s (op %zu): images of 1 to 4 channels, this "
                        "one has %d",
                        at, name, i + 1, c);
      if (op->a < 1 || op->a > MAX_RESIZE_DIM || op->b < 1 ||
          op->b > MAX_RESIZE_DIM)
        return ferry__spec_err(err,
                        "%s%s (op %zu): height and width must be in "
                        "1..%d, found %d, %d",
                        at, name, i + 1, MAX_RESIZE_DIM, op->a, op->b);
      if (op->kind == FERRY_OP_RANDOM_RESIZED_CROP) {
        /* Written so that NaN fails too. */
        if (!(op->scale[0] > 0.0f && op->scale[0] <= op->scale[1] &&
              op->scale[1] <= 1.0f))
          return ferry__spec_err(err,
                          "%srandom_resized_crop (op %zu): scale must be "
                          "(min, max) with 0 < min <= max <= 1, found "
                          "(%g, %g)",
                          at, i + 1, (double)op->scale[0],
                          (double)op->scale[1]);
        if (!(op->ratio[0] >= (float)MIN_RATIO &&
              op->ratio[0] <= op->ratio[1] &&
              op->ratio[1] <= (float)MAX_RATIO))
          return ferry__spec_err(err,
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
        return ferry__spec_err(err,
                        "%sresize (op %zu): resize(S) takes images of 1 to "
                        "4 channels, this one has %d",
                        at, i + 1, c);
      if (op->a < 1 || op->a > MAX_RESIZE_DIM)
        return ferry__spec_err(err,
                        "%sresize (op %zu): the shorter side must be in "
                        "1..%d, found %d",
                        at, i + 1, MAX_RESIZE_DIM, op->a);
      if (h != 0) {
        ferry__resize_shorter_size(h, w, op->a, &h, &w);
        if ((rc = check_bytes(p, sp->ops[i], "resize", (uint64_t)h,
                              (uint64_t)w, (uint64_t)c, err)) != 0)
          return rc;
      }
      break;
    default:
      return ferry__spec_err(err, "%sop %zu: unknown kind %d", at, i + 1,
                      (int)op->kind);
    }
  }

  if (s->shuffle && (s->shuffle_buffer < 1 ||
                     s->shuffle_buffer > MAX_SHUFFLE_BUFFER))
    return ferry__spec_err(err, "%sshuffle: buffer must be in 1..%d, found %u",
                    ferry__spec_loc(p, sp->shuffle, &lb), MAX_SHUFFLE_BUFFER,
                    s->shuffle_buffer);
  if (s->batch_size > MAX_BATCH)
    return ferry__spec_err(err, "%sbatch: size must be in 1..%d, found %u",
                    ferry__spec_loc(p, sp->batch, &lb), MAX_BATCH, s->batch_size);
  if (s->batch_size == 0 && s->drop_remainder)
    return ferry__spec_err(err, "batch: drop_remainder without a batch size");
  if (s->repeat != -1 && s->repeat < 1)
    return ferry__spec_err(err,
                    "%srepeat: count must be >= 1 or -1 (infinite), "
                    "found %lld",
                    ferry__spec_loc(p, sp->repeat, &lb), (long long)s->repeat);
  return 0;
}

int ferry__spec_validate(const ferry_spec_t *spec, ferry_error_t *err) {
  if (spec == NULL)
    return ferry__seterr(err, FERRY_EINVAL, "spec: NULL");
  return ferry__spec_validate_impl(spec, NULL, NULL, err);
}

/* ---------------------------------------------------------------------
 * Output shape and file expansion.
 */

int ferry__spec_output_shape(const ferry_spec_t *spec, int *h, int *w, int *c) {
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
      ferry__resize_shorter_size(hh, ww, op->a, &hh, &ww);
    }
  }
  if (hh <= 0 || ww <= 0)
    return FERRY_ESHAPE;
  *h = hh;
  *w = ww;
  *c = spec->format == FERRY_IMAGE_JPEG ? 3 : spec->channels;
  return 0;
}
