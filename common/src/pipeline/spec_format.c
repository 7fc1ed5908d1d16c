/* The pipeline spec's canonical text (ferry__spec_format): what
 * ferry__spec_parse reads back to an equal spec.
 */
#include "spec.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "clocale.h"
#include "spec_internal.h"

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

int ferry__spec_format(const ferry_spec_t *spec, char **out) {
  static const char *const comp[] = {"none", "gzip", "zlib", "auto"};
  sbuf b = {0};
  size_t i;
  int rc;

  if (out == NULL || spec == NULL)
    return FERRY_EINVAL;
  *out = NULL;
  if ((rc = ferry__spec_validate_impl(spec, NULL, NULL, NULL)) != 0)
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
  if (strcmp(spec->image_key, ferry__spec_default_image_key) != 0) {
    sb_str(&b, ", key=");
    sb_quote(&b, spec->image_key);
  }
  sb_str(&b, ")");
  if (spec->label_key == NULL) {
    sb_str(&b, " | label(none)");
  } else if (strcmp(spec->label_key, ferry__spec_default_label_key) != 0) {
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
