/* The lexer of the pipeline spec and the augmentation spec (lex.h):
 * tokens and their offsets, strings checked whole, a token as messages
 * show it, line and column of an offset.
 */
#include "lex.h"

#include <stdio.h>
#include <string.h>

#include "error_internal.h"

const ferry__lex_syntax_t ferry__lex_pipeline_spec = {
    .blanks = " \t\n\r\f\v",
    .punct = "(),|=",
    .plus = false,
    .strings = true,
    .end = "end of input",
    .shown = 40,
    .quote_numbers = false};

const ferry__lex_syntax_t ferry__lex_augment_spec = {
    .blanks = " \t\n\r",
    .punct = "()|/,",
    .plus = true,
    .strings = false,
    .end = "the end of the text",
    .shown = 24,
    .quote_numbers = true};

static bool is_digit(char c) { return c >= '0' && c <= '9'; }
static bool is_ident_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
static bool is_ident(char c) { return is_ident_start(c) || is_digit(c); }

size_t ferry__lex_utf8_seq(const unsigned char *s) {
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

/* The string that opens at s[pos] ('"'): its length, quotes included,
 * or 0 with *err filled when it is malformed. */
static size_t lex_string(const ferry__lex_syntax_t *syn, const char *s,
                         size_t pos, ferry_error_t *err) {
  char at[64];
  size_t i;
  for (i = pos + 1;;) {
    unsigned char c = (unsigned char)s[i];
    size_t n;
    if (c == '"')
      return i + 1 - pos;
    if (c == '\0') {
      ferry__seterr(err, FERRY_ESPEC,
                    "%s: expected '\"' to end the string that starts at "
                    "byte %zu, found %s",
                    ferry__lex_where(s, i, at, sizeof(at)), pos + 1,
                    syn->end);
      return 0;
    }
    if (c == '\\') {
      unsigned char x = (unsigned char)s[i + 1];
      if (x == '"' || x == '\\' || x == 'n' || x == 't') {
        i += 2;
        continue;
      }
      if (x == '\0' || ferry__lex_is_ctl(x) || x >= 0x80)
        ferry__seterr(err, FERRY_ESPEC,
                      "%s: expected an escape (\\\" \\\\ \\n \\t) after "
                      "'\\', found %s",
                      ferry__lex_where(s, i, at, sizeof(at)),
                      x == '\0' ? syn->end : "a special byte");
      else
        ferry__seterr(err, FERRY_ESPEC,
                      "%s: expected an escape (\\\" \\\\ \\n \\t), found "
                      "'\\%c'",
                      ferry__lex_where(s, i, at, sizeof(at)), x);
      return 0;
    }
    if (ferry__lex_is_ctl(c)) {
      ferry__seterr(err, FERRY_ESPEC,
                    "%s: expected a printable character or an escape in a "
                    "string, found byte 0x%02x",
                    ferry__lex_where(s, i, at, sizeof(at)), c);
      return 0;
    }
    if ((n = ferry__lex_utf8_seq((const unsigned char *)s + i)) == 0) {
      ferry__seterr(err, FERRY_ESPEC,
                    "%s: expected UTF-8 text in a string, found byte 0x%02x",
                    ferry__lex_where(s, i, at, sizeof(at)), c);
      return 0;
    }
    i += n;
  }
}

int ferry__lex(const ferry__lex_syntax_t *syn, const char *text, size_t pos,
               ferry__token_t *t, ferry_error_t *err) {
  const char *s = text;
  size_t i;
  while (s[pos] != '\0' && strchr(syn->blanks, s[pos]) != NULL)
    pos++;
  t->pos = pos;
  t->len = 1;
  t->punct = 0;
  t->is_int = false;
  if (s[pos] == '\0') {
    t->kind = FERRY__TOK_END;
    t->len = 0;
    return 0;
  }
  if (strchr(syn->punct, s[pos]) != NULL) {
    t->kind = FERRY__TOK_PUNCT;
    t->punct = s[pos];
    return 0;
  }
  if (syn->strings && s[pos] == '"') {
    if ((t->len = lex_string(syn, s, pos, err)) == 0) {
      t->kind = FERRY__TOK_BAD;
      t->len = 1;
      return FERRY_ESPEC;
    }
    t->kind = FERRY__TOK_STRING;
    return 0;
  }
  if (is_ident_start(s[pos])) {
    for (i = pos; is_ident(s[i]); i++)
      ;
    t->kind = FERRY__TOK_IDENT;
    t->len = i - pos;
    return 0;
  }
  i = pos;
  if (s[i] == '-' || (syn->plus && s[i] == '+'))
    i++;
  if (is_digit(s[i]) || (s[i] == '.' && is_digit(s[i + 1]))) {
    t->is_int = true;
    while (is_digit(s[i]))
      i++;
    if (s[i] == '.') {
      t->is_int = false;
      for (i++; is_digit(s[i]); i++)
        ;
    }
    if ((s[i] == 'e' || s[i] == 'E') &&
        (is_digit(s[i + 1]) ||
         ((s[i + 1] == '+' || s[i + 1] == '-') && is_digit(s[i + 2])))) {
      t->is_int = false;
      for (i += 2; is_digit(s[i]); i++)
        ;
    }
    t->kind = FERRY__TOK_NUMBER;
    t->len = i - pos;
    return 0;
  }
  /* Anything else is a token of one character (a whole UTF-8 sequence
   * when there is one) that no rule accepts; the parser reports it. */
  t->kind = FERRY__TOK_BAD;
  i = ferry__lex_utf8_seq((const unsigned char *)s + pos);
  t->len = i > 1 ? i : 1;
  return 0;
}

bool ferry__tok_is(const char *text, const ferry__token_t *t,
                   const char *word) {
  size_t n = strlen(word);
  return t->kind == FERRY__TOK_IDENT && t->len == n &&
         memcmp(text + t->pos, word, n) == 0;
}

/* Appends what fits of s[0..n) to buf, keeping a byte for the NUL. */
static void put(char *buf, size_t cap, size_t *o, const char *s, size_t n) {
  for (; n > 0 && *o + 1 < cap; n--)
    buf[(*o)++] = *s++;
}

const char *ferry__lex_describe(const ferry__lex_syntax_t *syn,
                                const char *text, const ferry__token_t *t,
                                char *buf, size_t cap) {
  const unsigned char *src = (const unsigned char *)text + t->pos;
  bool quote = t->kind != FERRY__TOK_STRING &&
               (t->kind != FERRY__TOK_NUMBER || syn->quote_numbers);
  size_t i, o = 0;
  if (t->kind == FERRY__TOK_END)
    return syn->end;
  if (cap == 0)
    return "";
  if (t->kind == FERRY__TOK_BAD && (src[0] < 0x20 || src[0] >= 0x7F)) {
    snprintf(buf, cap, "byte 0x%02x", src[0]);
    return buf;
  }
  if (quote)
    put(buf, cap, &o, "'", 1);
  for (i = 0; i < t->len && i < syn->shown; i++) {
    char x[5];
    if (src[i] >= 0x20 && src[i] < 0x7F) {
      put(buf, cap, &o, (const char *)src + i, 1);
    } else {
      snprintf(x, sizeof(x), "\\x%02x", src[i]);
      put(buf, cap, &o, x, 4);
    }
  }
  if (i < t->len)
    put(buf, cap, &o, "...", 3);
  if (quote)
    put(buf, cap, &o, "'", 1);
  buf[o] = '\0';
  return buf;
}

const char *ferry__lex_where(const char *text, size_t pos, char *buf,
                             size_t cap) {
  size_t i, line = 1, col = 1;
  for (i = 0; i < pos && text[i] != '\0'; i++) {
    if (text[i] == '\n') {
      line++;
      col = 1;
    } else {
      col++;
    }
  }
  if (line == 1)
    snprintf(buf, cap, "column %zu", col);
  else
    snprintf(buf, cap, "line %zu, column %zu", line, col);
  return buf;
}
