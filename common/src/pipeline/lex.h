/* The one lexer of Ferry's two little languages: the pipeline spec
 * (spec.h; grammar in docs/PROTOCOL.md, "Pipeline spec") and the
 * augmentation spec (ferry/augment.h). Both have names, numbers and
 * one-byte punctuation between blanks; they differ in a few choices that
 * a ferry__lex_syntax_t makes, one for each language below. Each parser
 * keeps its grammar and its messages' wording; the tokens, their byte
 * offsets and how a message shows a token come from here. The pipeline
 * folder's own header, which the client's augment.c includes too (this
 * folder is on the include path of what links ferry-pipeline); not
 * installed.
 */
#ifndef FERRY_PIPELINE_LEX_H
#define FERRY_PIPELINE_LEX_H

#include <stdbool.h>
#include <stddef.h>

#include "ferry/error.h"

typedef enum {
  FERRY__TOK_END,    /* the end of the text; len 0 */
  FERRY__TOK_IDENT,  /* [A-Za-z_][A-Za-z0-9_]* */
  FERRY__TOK_NUMBER, /* see ferry__lex */
  FERRY__TOK_STRING, /* "...", quotes included (syntax.strings only) */
  FERRY__TOK_PUNCT,  /* one byte of syntax.punct */
  FERRY__TOK_BAD     /* what no rule takes: one byte, or one whole UTF-8
                        character when one starts there */
} ferry__tok_kind_t;

typedef struct {
  ferry__tok_kind_t kind;
  size_t pos; /* byte offset in the text */
  size_t len; /* bytes */
  char punct; /* FERRY__TOK_PUNCT: its byte; 0 for any other kind */
  bool is_int; /* FERRY__TOK_NUMBER without '.' or exponent */
} ferry__token_t;

/* Where the two languages differ. */
typedef struct {
  const char *blanks; /* the bytes skipped between tokens */
  const char *punct;  /* the one-byte punctuation */
  bool plus;          /* a number may start with '+' (always with '-') */
  bool strings;       /* "..." strings: UTF-8 without control bytes, and
                         the escapes \" \\ \n \t */
  /* How ferry__lex_describe shows a token. */
  const char *end;    /* FERRY__TOK_END, and "found ..." in string errors */
  size_t shown;       /* a token's first bytes shown; more become "..." */
  bool quote_numbers; /* numbers in quotes too (strings never are) */
} ferry__lex_syntax_t;

/* The pipeline spec: blanks " \t\n\r\f\v", punctuation "(),|=", strings,
 * numbers with '-' only; messages say "end of input", show 40 bytes, and
 * numbers bare. */
extern const ferry__lex_syntax_t ferry__lex_pipeline_spec;
/* The augmentation spec: blanks " \t\n\r", punctuation "()|/,", no
 * strings, numbers with '+' or '-'; messages say "the end of the text",
 * show 24 bytes, and quote numbers. */
extern const ferry__lex_syntax_t ferry__lex_augment_spec;

/* Lexes the token at `pos`, after any blanks, into *t. NUMBER is
 *   sign? (digits ('.' digits?)? | '.' digits) (('e'|'E') sign? digits)?
 * where sign is '-', or '+' too with syntax.plus; an exponent without
 * digits is not part of the number ("1e" is 1 then the name e). Returns
 * 0, or FERRY_ESPEC when a string is malformed: then *err (if not NULL)
 * says where and why ("column C: expected ..., found ..."), and *t is a
 * FERRY__TOK_BAD of the opening quote. A STRING returned is always well
 * formed. `text` is NUL-terminated; pos <= its length. */
int ferry__lex(const ferry__lex_syntax_t *syn, const char *text, size_t pos,
               ferry__token_t *t, ferry_error_t *err);

/* Whether t is the name `word`. */
bool ferry__tok_is(const char *text, const ferry__token_t *t,
                   const char *word);

/* The token as a message shows it: syntax.end for FERRY__TOK_END, "byte
 * 0xNN" for a bad byte outside printable ASCII, else its first
 * syntax.shown bytes ("..." after them when there are more), other bytes
 * than printable ASCII as \xNN, between single quotes unless a string or
 * (without syntax.quote_numbers) a number. The whole of it takes at most
 * 4 * shown + 6 bytes of buf; a smaller cap cuts it short. Returns the
 * text (buf, or a constant). */
const char *ferry__lex_describe(const ferry__lex_syntax_t *syn,
                                const char *text, const ferry__token_t *t,
                                char *buf, size_t cap);

/* "column C" of a byte offset, or "line L, column C" past a newline (both
 * 1-based; a newline starts a line). Returns buf. */
const char *ferry__lex_where(const char *text, size_t pos, char *buf,
                             size_t cap);

/* The length of the well-formed UTF-8 sequence at s (1..4: shortest
 * form, no surrogates, at most U+10FFFF), 0 if none. Stops at a NUL. */
size_t ferry__lex_utf8_seq(const unsigned char *s);

/* A control byte: below 0x20, or 0x7F. */
static inline bool ferry__lex_is_ctl(unsigned c) {
  return c < 0x20 || c == 0x7F;
}

#endif /* FERRY_PIPELINE_LEX_H */
