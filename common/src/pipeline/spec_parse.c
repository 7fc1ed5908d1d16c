/* The pipeline spec's text form: the parser (ferry__spec_parse), over the
 * lexer the augmentation spec shares (lex.h). The grammar is in
 * docs/PROTOCOL.md ("Pipeline spec").
 */
#include "spec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "clocale.h"
#include "spec_internal.h"

/* ---------------------------------------------------------------------
 * Tokens (lex.h, the pipeline spec's syntax).
 */

/* A token as messages show it (ferry__lex_describe: 40 bytes at most,
 * each up to 4 as \xNN, quotes and "..."). */
typedef struct {
  char s[200];
} tokbuf;

static const char *describe(const parser *p, const ferry__token_t *t,
                            tokbuf *b) {
  return ferry__lex_describe(&ferry__lex_pipeline_spec, p->text, t, b->s,
                             sizeof(b->s));
}

/* Lexes the token at or after `pos` into *t; a malformed string is
 * FERRY_ESPEC with where and why. */
static int lex(parser *p, size_t pos, ferry__token_t *t) {
  return ferry__lex(&ferry__lex_pipeline_spec, p->text, pos, t, p->err);
}

static int advance(parser *p) {
  return lex(p, p->tok.pos + p->tok.len, &p->tok);
}

static int expected(parser *p, const ferry__token_t *t, const char *what) {
  locbuf lb;
  tokbuf tb;
  return ferry__spec_err(p->err, "%sexpected %s, found %s", ferry__spec_loc(p, t->pos, &lb),
                  what, describe(p, t, &tb));
}

static bool tok_is(const parser *p, const ferry__token_t *t,
                   const char *word) {
  return ferry__tok_is(p->text, t, word);
}

/* Decodes a string token into a ferry__malloc'd string; NULL: no
 * memory. */
static char *tok_string(const parser *p, const ferry__token_t *t) {
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
static bool tok_int(const parser *p, const ferry__token_t *t, bool *neg,
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

static int range_err(parser *p, const ferry__token_t *t, const stage_def *sd,
                     const param_def *pd) {
  locbuf lb;
  tokbuf tb;
  if (pd->rule != NULL)
    return ferry__spec_err(p->err, "%s%s %s %s, found %s", ferry__spec_loc(p, t->pos, &lb),
                    sd->name, pd->name, pd->rule, describe(p, t, &tb));
  if (pd->type == P_FLOAT)
    return ferry__spec_err(p->err, "%s%s %s must be in %g..%g, found %s",
                    ferry__spec_loc(p, t->pos, &lb), sd->name, pd->name, pd->flo,
                    pd->fhi, describe(p, t, &tb));
  if (pd->type == P_U64)
    return ferry__spec_err(p->err, "%s%s %s must be in 0..%llu, found %s",
                    ferry__spec_loc(p, t->pos, &lb), sd->name, pd->name,
                    (unsigned long long)UINT64_MAX, describe(p, t, &tb));
  return ferry__spec_err(p->err, "%s%s %s must be in %lld..%lld, found %s",
                  ferry__spec_loc(p, t->pos, &lb), sd->name, pd->name,
                  (long long)pd->lo, (long long)pd->hi, describe(p, t, &tb));
}

/* Token t (a NUMBER) as a float32 in pd's bounds; does not move. */
static int token_float(parser *p, const ferry__token_t *t, const stage_def *sd,
                       const param_def *pd, float *out) {
  locale_t old;
  char num[128], what[160], *end;
  if (t->kind != FERRY__TOK_NUMBER) {
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
  /* Bounds as float32, as ferry__spec_validate_impl checks them (0.01 is below
   * 0.01 in double once it is a float). */
  if (*end != '\0' || !(*out >= (float)pd->flo && *out <= (float)pd->fhi))
    return range_err(p, t, sd, pd);
  return 0;
}

/* Converts the current token into `av` by the parameter's type, checks
 * its bounds, and moves past it. */
static int read_value(parser *p, const stage_def *sd, const param_def *pd,
                      argval *av) {
  ferry__token_t t = p->tok;
  char what[160];
  bool neg;
  uint64_t mag;

  av->set = true;
  av->pos = t.pos;
  switch (pd->type) {
  case P_INT:
    if (t.kind != FERRY__TOK_NUMBER || !t.is_int) {
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
    if (t.kind != FERRY__TOK_NUMBER || !t.is_int) {
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
    if (t.punct != '(')
      return expected(p, &t, what);
    if ((rc = advance(p)) != 0 ||
        (rc = token_float(p, &p->tok, sd, pd, &av->f)) != 0 ||
        (rc = advance(p)) != 0)
      return rc;
    if (p->tok.punct != ',')
      return expected(p, &p->tok, "',' between min and max");
    if ((rc = advance(p)) != 0 ||
        (rc = token_float(p, &p->tok, sd, pd, &av->f2)) != 0 ||
        (rc = advance(p)) != 0)
      return rc;
    if (p->tok.punct != ')')
      return expected(p, &p->tok, "')' after max");
    if (!(av->f <= av->f2) || (pd->flo == 0.0 && !(av->f > 0.0f))) {
      locbuf lb;
      return ferry__spec_err(p->err, "%s%s %s %s, found (%g, %g)",
                      ferry__spec_loc(p, t.pos, &lb), sd->name, pd->name, pd->rule,
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
    if (t.kind != FERRY__TOK_STRING) {
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
      return ferry__spec_err(p->err, "%s%s %s must not be empty%s",
                      ferry__spec_loc(p, t.pos, &lb), sd->name, pd->name,
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
  if (p->tok.kind != FERRY__TOK_STRING)
    return expected(p, &p->tok, "a \"file pattern\" for tfrecord");
  if (p->tok.len == 2)
    return ferry__spec_err(p->err, "%stfrecord pattern must not be empty",
                    ferry__spec_loc(p, p->tok.pos, &lb));
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

static int find_param(const parser *p, const stage_def *sd,
                      const ferry__token_t *t) {
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

  if (p->tok.punct != '(')
    return expected(p, &p->tok, "'('");
  if ((rc = advance(p)) != 0)
    return rc;
  if (p->tok.punct == ')')
    return advance(p);
  for (;;) {
    ferry__token_t t = p->tok, next;
    bool named = false;
    if (t.kind != FERRY__TOK_IDENT && t.kind != FERRY__TOK_STRING &&
        t.kind != FERRY__TOK_NUMBER)
      return expected(p, &t,
                      first_arg ? "an argument or ')'" : "an argument");
    first_arg = false;
    if (t.kind == FERRY__TOK_IDENT) {
      if ((rc = lex(p, t.pos + t.len, &next)) != 0)
        return rc;
      named = next.punct == '=';
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
        return ferry__spec_err(p->err,
                        "%sexpected an argument name of %s (%s), found %s",
                        ferry__spec_loc(p, t.pos, &lb), sd->name, list,
                        describe(p, &t, &tb));
      }
      if (av[k].set)
        return ferry__spec_err(p->err, "%s%s argument '%s' given twice",
                        ferry__spec_loc(p, t.pos, &lb), sd->name, sd->params[k].name);
      named_seen = true;
      p->tok = next;
      if ((rc = advance(p)) != 0)
        return rc;
      if (p->tok.kind != FERRY__TOK_IDENT && p->tok.kind != FERRY__TOK_STRING &&
          p->tok.kind != FERRY__TOK_NUMBER &&
          !(p->tok.punct == '(' && sd->params[k].type == P_PAIR))
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
    if (p->tok.punct == ')')
      return advance(p);
    if (p->tok.punct != ',')
      return expected(p, &p->tok, "',' or ')'");
    if ((rc = advance(p)) != 0)
      return rc;
  }
}

/* Moves a parsed key into *slot, using the static default when it is
 * one. */
static void set_key(char **slot, argval *av, char *deflt) {
  ferry__spec_free_key(*slot);
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
  const char *at = ferry__spec_loc(p, pos, &lb);
  ferry_image_op_t *op = &spec->ops[spec->n_ops];

  switch (id) {
  case ST_TFRECORD:
    if (spec->n_patterns == 0)
      return ferry__spec_err(p->err,
                      "%stfrecord needs at least one \"file pattern\"", at);
    if (av[0].set)
      spec->compression = (ferry_compression_t)av[0].e;
    break;
  case ST_DECODE:
    if (!av[0].set)
      return ferry__spec_err(p->err,
                      "%sdecode needs a format: decode(raw, H, W, C) or "
                      "decode(jpeg)",
                      at);
    spec->format = (ferry_image_format_t)av[0].e;
    if (spec->format == FERRY_IMAGE_RAW) {
      if (!av[1].set || !av[2].set || !av[3].set)
        return ferry__spec_err(p->err,
                        "%sdecode(raw) needs height, width and channels: "
                        "decode(raw, H, W, C)",
                        at);
      spec->channels = (int)av[3].i;
    } else {
      if (av[1].set != av[2].set)
        return ferry__spec_err(p->err,
                        "%sdecode(jpeg) needs both height and width, or "
                        "neither",
                        at);
      if (av[3].set && av[3].i != 3)
        return ferry__spec_err(p->err,
                        "%sdecode channels must be 3 for jpeg, found %lld",
                        ferry__spec_loc(p, av[3].pos, &lb), (long long)av[3].i);
      spec->channels = 3;
    }
    spec->height = av[1].set ? (int)av[1].i : 0;
    spec->width = av[2].set ? (int)av[2].i : 0;
    if (av[4].set)
      set_key(&spec->image_key, &av[4], ferry__spec_default_image_key);
    break;
  case ST_LABEL:
    if (!av[0].set)
      return ferry__spec_err(p->err,
                      "%slabel needs a key: label(\"name\") or label(none)",
                      at);
    set_key(&spec->label_key, &av[0], ferry__spec_default_label_key);
    break;
  case ST_RESIZE:
    if (!av[0].set)
      return ferry__spec_err(p->err,
                      "%sresize needs height and width, resize(H, W), or "
                      "the shorter side, resize(S)",
                      at);
    if (av[1].set) {
      if (av[2].set)
        return ferry__spec_err(p->err,
                        "%sresize exact applies to resize(S) only "
                        "(resize(H, W) is never fused with the decode)",
                        ferry__spec_loc(p, av[2].pos, &lb));
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
      return ferry__spec_err(p->err,
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
      return ferry__spec_err(p->err,
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
      return ferry__spec_err(p->err, "%sdilate needs a size: dilate(3)", at);
    op->kind = FERRY_OP_DILATE;
    op->a = (int)av[0].i;
    spec->n_ops++;
    break;
  case ST_BLUR:
    if (!av[0].set || !av[1].set)
      return ferry__spec_err(p->err,
                      "%sblur needs a size and a sigma: blur(11, 0.8)", at);
    if (av[0].i % 2 == 0)
      return ferry__spec_err(p->err,
                      "%sblur size must be an odd integer in 3..31, "
                      "found %lld",
                      ferry__spec_loc(p, av[0].pos, &lb), (long long)av[0].i);
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
      return ferry__spec_err(p->err, "%sbatch needs a size: batch(N)", at);
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
  const char *at = ferry__spec_loc(p, p->tok.pos, &lb);
  const char *name = stages[id].name;

  if (!seen[ST_TFRECORD] && id != ST_TFRECORD)
    return ferry__spec_err(p->err,
                    "%sexpected tfrecord(...) as the first stage, found "
                    "'%s'",
                    at, name);
  if (!is_op_stage(id) && seen[id]) {
    /* Only the column of the first one is wanted: drop "column " and
     * the trailing ": " from the location. */
    const char *first_at = ferry__spec_loc(p, first[id], &lb2);
    size_t n = strlen(first_at);
    return ferry__spec_err(p->err, "%sduplicate stage '%s' (first at %.*s)", at,
                    name, (int)(n >= 2 ? n - 2 : n), first_at);
  }
  if (id == ST_TFRECORD || id == ST_DECODE)
    return 0;
  if (id == ST_LABEL) {
    if (n_ops > 0 || seen[ST_SHUFFLE] || seen[ST_BATCH] || seen[ST_REPEAT])
      return ferry__spec_err(p->err,
                      "%sexpected label right before or after decode, "
                      "found it after the %s",
                      at, n_ops > 0 ? "image ops" : "shuffle/batch/repeat");
    return 0;
  }
  if (!seen[ST_DECODE])
    return ferry__spec_err(p->err,
                    "%sexpected decode(...) after tfrecord, found '%s'", at,
                    name);
  if (is_op_stage(id)) {
    const char *after = seen[ST_SHUFFLE] ? "shuffle"
                        : seen[ST_BATCH] ? "batch"
                        : seen[ST_REPEAT] ? "repeat"
                                          : NULL;
    if (after != NULL)
      return ferry__spec_err(p->err,
                      "%sexpected image ops before shuffle, batch and "
                      "repeat, found '%s' after '%s'",
                      at, name, after);
    if (n_ops >= FERRY_SPEC_MAX_OPS)
      return ferry__spec_err(p->err, "%stoo many image ops (at most %d)", at,
                      FERRY_SPEC_MAX_OPS);
    return 0;
  }
  if (id == ST_SHUFFLE && (seen[ST_BATCH] || seen[ST_REPEAT]))
    return ferry__spec_err(p->err,
                    "%sexpected shuffle before batch and repeat, found it "
                    "after '%s'",
                    at, seen[ST_BATCH] ? "batch" : "repeat");
  if (id == ST_BATCH && seen[ST_REPEAT])
    return ferry__spec_err(p->err,
                    "%sexpected batch before repeat, found it after "
                    "'repeat'",
                    at);
  return 0;
}

int ferry__spec_parse(const char *text, ferry_spec_t *spec,
                      ferry_error_t *err) {
  parser p = {.text = text, .err = err};
  stage_pos sp;
  bool seen[ST_COUNT] = {false};
  size_t first[ST_COUNT] = {0};
  int rc;

  if (spec == NULL || text == NULL)
    return ferry__seterr(err, FERRY_EINVAL, "spec parse: NULL argument");
  ferry__spec_init(spec);
  memset(&sp, 0, sizeof(sp));
  if ((rc = lex(&p, 0, &p.tok)) != 0)
    goto fail;
  for (;;) {
    argval av[MAX_PARAMS];
    stage_id id;
    size_t pos = p.tok.pos, n_ops = spec->n_ops;
    int i;

    if (p.tok.kind != FERRY__TOK_IDENT) {
      rc = expected(&p, &p.tok, "a stage name");
      goto fail;
    }
    for (id = 0; id < ST_COUNT; id++)
      if (tok_is(&p, &p.tok, stages[id].name))
        break;
    if (id == ST_COUNT) {
      char what[192];
      snprintf(what, sizeof(what), "a stage name (%s)", ferry__spec_stage_names);
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
    if (p.tok.kind == FERRY__TOK_END)
      break;
    if (p.tok.punct != '|') {
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
  if ((rc = ferry__spec_validate_impl(spec, &p, &sp, err)) != 0)
    goto fail;
  return 0;
fail:
  ferry__spec_close(spec);
  return rc;
}
