/* The augmentation's CPU twin and its spec: the text parser (over the
 * lexer the pipeline spec shares, common/src/pipeline/lex.h) and
 * formatter, argument checks shared with the CUDA launcher, and the batch
 * loop over the per-pixel routine of augment.h. Built with
 * -ffp-contract=off so that its float arithmetic is the kernel's, bit
 * for bit.
 */
#include "augment.h"

#include <locale.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "clocale.h"
#include "lex.h"

/* ---------------------------------------------------------------------
 * The spec.
 */

void ferry_augment_spec_init(ferry_augment_spec_t *spec) {
  memset(spec, 0, sizeof(*spec));
  spec->flip = FERRY_FLIP_NONE;
  spec->scale = 1.0f;
}

void ferry_augment_spec_close(ferry_augment_spec_t *spec) {
  if (spec != NULL)
    ferry_augment_spec_init(spec);
}

typedef struct {
  const char *text;
  size_t pos; /* where the next token starts (blanks may come first) */
  ferry_error_t *err;
} parser;

/* Reads the token at p->pos (lex.h, the augmentation spec's syntax:
 * no strings, so it cannot fail) without consuming it. */
static ferry__token_t peek(const parser *p) {
  ferry__token_t t;
  ferry__lex(&ferry__lex_augment_spec, p->text, p->pos, &t, NULL);
  return t;
}

static void consume(parser *p, const ferry__token_t *t) {
  p->pos = t->pos + t->len;
}

static int spec_err(const parser *p, size_t pos, const char *fmt, ...)
    FERRY_PRINTF(3, 4);

static int spec_err(const parser *p, size_t pos, const char *fmt, ...) {
  if (p->err != NULL) {
    char at[48], what[400];
    va_list ap;
    ferry__lex_where(p->text, pos, at, sizeof(at));
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    ferry__seterr(p->err, FERRY_ESPEC, "augment spec: %s: %s", at, what);
  }
  return FERRY_ESPEC;
}

static int expected(const parser *p, const ferry__token_t *t,
                    const char *what) {
  char b[104]; /* 4 * 24 + 6: ferry__lex_describe */
  return spec_err(p, t->pos, "expected %s, found %s", what,
                  ferry__lex_describe(&ferry__lex_augment_spec, p->text, t,
                                      b, sizeof(b)));
}

static bool tok_is(const parser *p, const ferry__token_t *t,
                   const char *word) {
  return ferry__tok_is(p->text, t, word);
}

static int expect_punct(parser *p, char ch, const char *what) {
  ferry__token_t t = peek(p);
  if (t.punct != ch)
    return expected(p, &t, what);
  consume(p, &t);
  return 0;
}

/* Reads a number token into *out (a finite double). */
static int read_number(parser *p, const char *what, double *out,
                       size_t *pos) {
  ferry__token_t t = peek(p);
  char buf[64], *end;
  locale_t old;
  if (t.kind != FERRY__TOK_NUMBER)
    return expected(p, &t, what);
  if (t.len >= sizeof(buf))
    return spec_err(p, t.pos, "%s: number too long", what);
  memcpy(buf, p->text + t.pos, t.len);
  buf[t.len] = '\0';
  old = ferry__c_locale_enter();
  *out = strtod(buf, &end);
  ferry__c_locale_leave(old);
  if (*end != '\0' || !(*out - *out == 0.0))
    return spec_err(p, t.pos, "%s: '%s' is not a finite number", what, buf);
  *pos = t.pos;
  consume(p, &t);
  return 0;
}

/* The ops in the order they must appear. */
enum { OP_FLIP, OP_ROTATE, OP_ZOOM, OP_RESCALE, OP_EXACT, N_OPS };
static const char *const op_names[N_OPS] = {"flip", "rotate", "zoom",
                                            "rescale", "exact"};

static int parse_factor(parser *p, const char *op, float *out) {
  double v;
  size_t pos;
  char what[48];
  int rc;
  snprintf(what, sizeof(what), "a factor in [0, 1) for %s", op);
  if ((rc = read_number(p, what, &v, &pos)) != 0)
    return rc;
  if (!(v >= 0.0 && v < 1.0))
    return spec_err(p, pos, "%s factor %g is outside [0, 1)", op, v);
  /* -0 is 0 (the op is off); + 0.0 makes it +0 so the spec has one
   * form (fuzz_augment compares specs bit for bit after a round trip). */
  *out = (float)v + 0.0f;
  /* A factor just below 1 must not round up to 1 in float. */
  if (*out >= 1.0f)
    *out = 0.99999994f;
  return 0;
}

static int parse_rescale(parser *p, ferry_augment_spec_t *spec) {
  double a, b = 1.0, v;
  size_t pos_a, pos_b;
  ferry__token_t t;
  int rc;
  if ((rc = read_number(p, "a number or a fraction A/B for rescale", &a,
                        &pos_a)) != 0)
    return rc;
  t = peek(p);
  if (t.punct == '/') {
    consume(p, &t);
    if ((rc = read_number(p, "a denominator after '/'", &b, &pos_b)) != 0)
      return rc;
    if (b == 0.0)
      return spec_err(p, pos_b, "rescale denominator is 0");
  }
  v = a / b;
  if (!(v - v == 0.0) || v > 3.4028234663852886e38 ||
      v < -3.4028234663852886e38)
    return spec_err(p, pos_a, "rescale factor %g is not a finite float", v);
  spec->rescale = true;
  spec->scale = (float)v;
  return 0;
}

int ferry_augment_spec_parse(const char *text, ferry_augment_spec_t *spec,
                             ferry_error_t *err) {
  parser p;
  int last = -1, rc = 0;
  bool seen[N_OPS] = {false};
  if (spec == NULL || text == NULL) {
    if (spec != NULL)
      ferry_augment_spec_init(spec);
    return ferry__seterr(err, FERRY_EINVAL, "augment spec: NULL argument");
  }
  ferry_augment_spec_init(spec);
  p.text = text;
  p.pos = 0;
  p.err = err;
  if (peek(&p).kind == FERRY__TOK_END)
    return 0;
  for (;;) {
    ferry__token_t t = peek(&p);
    int op;
    for (op = 0; op < N_OPS; op++)
      if (tok_is(&p, &t, op_names[op]))
        break;
    if (op == N_OPS) {
      rc = expected(&p, &t, "an op (flip, rotate, zoom, rescale or exact)");
      break;
    }
    if (seen[op]) {
      rc = spec_err(&p, t.pos, "%s given twice", op_names[op]);
      break;
    }
    if (op != OP_EXACT && op < last) {
      rc = spec_err(&p, t.pos,
                    "%s after %s: ops run in the order flip, rotate, zoom, "
                    "rescale",
                    op_names[op], op_names[last]);
      break;
    }
    seen[op] = true;
    if (op != OP_EXACT)
      last = op;
    consume(&p, &t);
    if (op == OP_EXACT) {
      ferry__token_t l = peek(&p);
      if (l.punct == '(') {
        consume(&p, &l);
        if ((rc = expect_punct(&p, ')', "')' (exact takes no argument)")))
          break;
      }
    } else {
      if ((rc = expect_punct(&p, '(', "'('")) != 0)
        break;
      if (op == OP_FLIP) {
        ferry__token_t m = peek(&p);
        if (tok_is(&p, &m, "horizontal")) {
          spec->flip = FERRY_FLIP_HORIZONTAL;
        } else if (tok_is(&p, &m, "none")) {
          spec->flip = FERRY_FLIP_NONE;
        } else if (tok_is(&p, &m, "vertical") ||
                   tok_is(&p, &m, "horizontal_and_vertical")) {
          rc = spec_err(&p, m.pos,
                        "flip mode '%.*s' is not supported (horizontal or "
                        "none)",
                        (int)m.len, text + m.pos);
          break;
        } else {
          rc = expected(&p, &m, "horizontal or none for flip");
          break;
        }
        consume(&p, &m);
      } else if (op == OP_ROTATE) {
        if ((rc = parse_factor(&p, "rotate", &spec->rotate)) != 0)
          break;
      } else if (op == OP_ZOOM) {
        if ((rc = parse_factor(&p, "zoom", &spec->zoom)) != 0)
          break;
      } else if ((rc = parse_rescale(&p, spec)) != 0) {
        break;
      }
      if ((rc = expect_punct(&p, ')', "')'")) != 0)
        break;
    }
    t = peek(&p);
    if (t.kind == FERRY__TOK_END)
      break;
    if (t.punct != '|') {
      rc = expected(&p, &t, "'|' or the end of the spec");
      break;
    }
    consume(&p, &t);
  }
  if (rc != 0)
    ferry_augment_spec_init(spec);
  else
    spec->exact = seen[OP_EXACT];
  return rc;
}

size_t ferry_augment_spec_format(const ferry_augment_spec_t *spec, char *buf,
                                 size_t cap) {
  char tmp[256];
  size_t o = 0, n;
  locale_t old = ferry__c_locale_enter();
  const char *sep = "";
  tmp[0] = '\0';
  if (spec->flip == FERRY_FLIP_HORIZONTAL) {
    o += (size_t)snprintf(tmp + o, sizeof(tmp) - o, "flip(horizontal)");
    sep = " | ";
  }
  if (spec->rotate > 0.0f) {
    o += (size_t)snprintf(tmp + o, sizeof(tmp) - o, "%srotate(%.9g)", sep,
                          (double)spec->rotate);
    sep = " | ";
  }
  if (spec->zoom > 0.0f) {
    o += (size_t)snprintf(tmp + o, sizeof(tmp) - o, "%szoom(%.9g)", sep,
                          (double)spec->zoom);
    sep = " | ";
  }
  if (spec->rescale) {
    o += (size_t)snprintf(tmp + o, sizeof(tmp) - o, "%srescale(%.9g)", sep,
                          (double)spec->scale);
    sep = " | ";
  }
  if (spec->exact)
    o += (size_t)snprintf(tmp + o, sizeof(tmp) - o, "%sexact", sep);
  ferry__c_locale_leave(old);
  n = strlen(tmp);
  if (cap > 0) {
    size_t k = n < cap - 1 ? n : cap - 1;
    memcpy(buf, tmp, k);
    buf[k] = '\0';
  }
  return n;
}

/* ---------------------------------------------------------------------
 * Parameters, checks, the batch loop.
 */

void ferry_augment_params(const ferry_augment_spec_t *spec, uint64_t seed,
                          uint64_t epoch, uint64_t batch, uint64_t image,
                          ferry_augment_params_t *out) {
  ferry__aug_params(spec, seed, epoch, batch, image, out);
}

static size_t dtype_size(ferry_dtype_t dtype) {
  switch (dtype) {
  case FERRY_DTYPE_FLOAT32:
    return 4;
  case FERRY_DTYPE_FLOAT16:
  case FERRY_DTYPE_BFLOAT16:
    return 2;
  }
  return 0;
}

size_t ferry_augment_out_bytes(size_t n, uint32_t h, uint32_t w, uint32_t c,
                               ferry_dtype_t dtype) {
  size_t es = dtype_size(dtype), px = (size_t)h * w * c;
  if (es == 0 || (px != 0 && n > SIZE_MAX / es / px))
    return 0;
  return n * px * es;
}

int ferry__augment_check(const ferry_augment_spec_t *spec, const void *in,
                         size_t n, uint32_t h, uint32_t w, uint32_t c,
                         const void *out, ferry_dtype_t dtype,
                         ferry_layout_t layout, const char *who,
                         ferry_error_t *err) {
  if (spec == NULL)
    return ferry__seterr(err, FERRY_EINVAL, "%s: NULL spec", who);
  if (!(spec->rotate >= 0.0f && spec->rotate < 1.0f) ||
      !(spec->zoom >= 0.0f && spec->zoom < 1.0f))
    return ferry__seterr(err, FERRY_EINVAL,
                         "%s: rotate %g and zoom %g must lie in [0, 1)", who,
                         (double)spec->rotate, (double)spec->zoom);
  if (spec->rescale && !(spec->scale - spec->scale == 0.0f))
    return ferry__seterr(err, FERRY_EINVAL, "%s: rescale factor %g is not "
                         "finite", who, (double)spec->scale);
  if (spec->flip != FERRY_FLIP_NONE && spec->flip != FERRY_FLIP_HORIZONTAL)
    return ferry__seterr(err, FERRY_EINVAL, "%s: unknown flip mode %d", who,
                         (int)spec->flip);
  if (dtype_size(dtype) == 0)
    return ferry__seterr(err, FERRY_EINVAL, "%s: unknown dtype %d", who,
                         (int)dtype);
  if (layout != FERRY_LAYOUT_NHWC && layout != FERRY_LAYOUT_NCHW)
    return ferry__seterr(err, FERRY_EINVAL, "%s: unknown layout %d", who,
                         (int)layout);
  if (h == 0 || w == 0 || c == 0 || h > FERRY__AUG_MAX_DIM ||
      w > FERRY__AUG_MAX_DIM || c > FERRY__AUG_MAX_CHANNELS ||
      (uint64_t)h * w * c > INT32_MAX)
    return ferry__seterr(err, FERRY_EINVAL,
                         "%s: image shape %ux%ux%u (h x w x c) is outside "
                         "1..%d per side, 1..%d channels, under 2^31 "
                         "elements",
                         who, h, w, c, FERRY__AUG_MAX_DIM,
                         FERRY__AUG_MAX_CHANNELS);
  if ((spec->rotate > 0.0f || spec->zoom > 0.0f) && (h < 2 || w < 2))
    return ferry__seterr(err, FERRY_ETOOSMALL,
                         "%s: %s needs images of at least 2x2 pixels (reflect "
                         "fill), got %ux%u (h x w)",
                         who, spec->rotate > 0.0f ? "rotate" : "zoom", h, w);
  if (n == 0)
    return 0;
  if (n > INT32_MAX || ferry_augment_out_bytes(n, h, w, c, dtype) == 0)
    return ferry__seterr(err, FERRY_EINVAL,
                         "%s: a batch of %zu images of %ux%ux%u is too large",
                         who, n, h, w, c);
  if (in == NULL || out == NULL)
    return ferry__seterr(err, FERRY_EINVAL, "%s: NULL %s buffer", who,
                         in == NULL ? "input" : "output");
  return 0;
}

int ferry_augment_batch_cpu(const ferry_augment_spec_t *spec, uint64_t seed,
                            uint64_t epoch, uint64_t batch_index,
                            const uint8_t *in, size_t n, uint32_t h,
                            uint32_t w, uint32_t c, void *out,
                            ferry_dtype_t dtype, ferry_layout_t layout,
                            ferry_error_t *err) {
  size_t i, hw = (size_t)h * w, img_px = hw * c;
  int rc = ferry__augment_check(spec, in, n, h, w, c, out, dtype, layout,
                                "augment", err);
  if (rc != 0)
    return rc;
  for (i = 0; i < n; i++) {
    ferry_augment_params_t prm;
    ferry__aug_img_t img;
    const uint8_t *src = in + i * img_px;
    int x, y;
    ferry__aug_params(spec, seed, epoch, batch_index, i, &prm);
    ferry__aug_setup(spec, &prm, (int)w, (int)h, &img);
    for (y = 0; y < (int)h; y++) {
      for (x = 0; x < (int)w; x++) {
        size_t pix = (size_t)y * w + (size_t)x;
        if (layout == FERRY_LAYOUT_NCHW)
          ferry__aug_pixel(&img, src, (int)w, (int)h, (int)c, x, y, out,
                           i * img_px + pix, hw, (int)dtype);
        else
          ferry__aug_pixel(&img, src, (int)w, (int)h, (int)c, x, y, out,
                           i * img_px + pix * c, 1, (int)dtype);
      }
    }
  }
  return 0;
}
