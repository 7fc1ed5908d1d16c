/* Tests of the lexer both spec languages share
 * (common/src/pipeline/lex.h): token kinds, offsets and lengths under
 * each language's syntax, numbers at the edges of each, bad bytes,
 * malformed strings, how messages show tokens, line and column of an
 * offset.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "lex.h"

static const ferry__lex_syntax_t *const SPEC = &ferry__lex_pipeline_spec;
static const ferry__lex_syntax_t *const AUG = &ferry__lex_augment_spec;

/* The whole text as tokens, "<kind><pos>:<len>" each, space-separated:
 * I name, N integer, F other number, S string, B bad, E end, the byte
 * itself for punctuation; a malformed string ends it as "!". */
static const char *tokens(const ferry__lex_syntax_t *syn, const char *text) {
  static char out[1024];
  size_t o = 0, pos = 0;
  for (;;) {
    ferry__token_t t;
    char k;
    if (ferry__lex(syn, text, pos, &t, NULL) != 0) {
      cr_assert_eq(t.kind, FERRY__TOK_BAD);
      o += (size_t)snprintf(out + o, sizeof(out) - o, "%s!", o ? " " : "");
      return out;
    }
    switch (t.kind) {
    case FERRY__TOK_END: k = 'E'; break;
    case FERRY__TOK_IDENT: k = 'I'; break;
    case FERRY__TOK_NUMBER: k = t.is_int ? 'N' : 'F'; break;
    case FERRY__TOK_STRING: k = 'S'; break;
    case FERRY__TOK_PUNCT: k = t.punct; break;
    default: k = 'B'; break;
    }
    cr_assert_eq(t.punct != 0, t.kind == FERRY__TOK_PUNCT);
    cr_assert(t.pos >= pos && t.pos + t.len <= strlen(text));
    o += (size_t)snprintf(out + o, sizeof(out) - o, "%s%c%zu:%zu",
                          o ? " " : "", k, t.pos, t.len);
    if (t.kind == FERRY__TOK_END)
      return out;
    cr_assert_gt(t.len, 0);
    pos = t.pos + t.len;
  }
}

#define TOKENS(syn, text, want) cr_assert_str_eq(tokens(syn, text), want, \
                                                 "<%s>", text)

Test(lex, offsets_and_kinds) {
  TOKENS(SPEC, "  decode(raw, 32,\n\t\"k\") |x=_1",
         "I2:6 (8:1 I9:3 ,12:1 N14:2 ,16:1 S19:3 )22:1 |24:1 I25:1 =26:1 "
         "I27:2 E29:0");
  TOKENS(AUG, "flip(horizontal) | rescale(1/255)",
         "I0:4 (4:1 I5:10 )15:1 |17:1 I19:7 (26:1 N27:1 /28:1 N29:3 )32:1 "
         "E33:0");
  TOKENS(SPEC, "", "E0:0");
  TOKENS(AUG, " \t\r\n ", "E5:0");
}

Test(lex, blanks_and_punctuation_differ) {
  /* \f and \v are blanks of the pipeline spec only. */
  TOKENS(SPEC, "a\f\vb", "I0:1 I3:1 E4:0");
  TOKENS(AUG, "a\f\vb", "I0:1 B1:1 B2:1 I3:1 E4:0");
  /* '=' is the pipeline spec's, '/' the augmentation spec's. */
  TOKENS(SPEC, "=/", "=0:1 B1:1 E2:0");
  TOKENS(AUG, "=/", "B0:1 /1:1 E2:0");
  /* No strings in the augmentation spec: '"' is a bad byte. */
  TOKENS(AUG, "\"a\"", "B0:1 I1:1 B2:1 E3:0");
}

Test(lex, numbers_of_the_pipeline_spec) {
  TOKENS(SPEC, "0 007 -5 1. .5 -.5 1e5 1E-3 2e+0",
         "N0:1 N2:3 N6:2 F9:2 F12:2 F15:3 F19:3 F23:4 F28:4 E32:0");
  /* No '+' sign; '.' or '-' alone is no number. */
  TOKENS(SPEC, "+5", "B0:1 N1:1 E2:0");
  TOKENS(SPEC, ". -. -", "B0:1 B2:1 B3:1 B5:1 E6:0");
  /* An exponent without digits is not part of the number. */
  TOKENS(SPEC, "1e", "N0:1 I1:1 E2:0");
  TOKENS(SPEC, "1e+x", "N0:1 I1:1 B2:1 I3:1 E4:0");
  TOKENS(SPEC, "1.e5", "F0:4 E4:0");
  /* Two points: the second starts a new number. */
  TOKENS(SPEC, "1.2.3", "F0:3 F3:2 E5:0");
  /* As long as digits come: range checks are the parser's. */
  TOKENS(SPEC, "99999999999999999999999", "N0:23 E23:0");
}

Test(lex, numbers_of_the_augment_spec) {
  TOKENS(AUG, "+5 +.5 -0 1. .5 1e-3 +2E+2",
         "N0:2 F3:3 N7:2 F10:2 F13:2 F16:4 F21:5 E26:0");
  /* A sign or a point without a digit is a bad byte of its own. */
  TOKENS(AUG, "+ +. - .", "B0:1 B2:1 B3:1 B5:1 B7:1 E8:0");
  TOKENS(AUG, "1e+", "N0:1 I1:1 B2:1 E3:0");
  TOKENS(AUG, "0.5)", "F0:3 )3:1 E4:0");
}

Test(lex, bad_bytes) {
  /* A bad token is one byte, or one whole UTF-8 character. */
  TOKENS(SPEC, "\x01%\xc3\xa9\xff\xe2\x82", "B0:1 B1:1 B2:2 B4:1 B5:1 B6:1 "
                                           "E7:0");
  TOKENS(AUG, "\x7f\xc3\xa9", "B0:1 B1:2 E3:0");
}

Test(lex, strings) {
  TOKENS(SPEC, "\"\" \"a\\\"b\\\\\\n\\t\" \"\xc3\xa9\"",
         "S0:2 S3:12 S16:4 E20:0");
}

static void bad_string(const char *text, const char *msg) {
  ferry__token_t t;
  ferry_error_t err = {0};
  cr_assert_eq(ferry__lex(SPEC, text, 0, &t, &err), FERRY_ESPEC, "<%s>",
               text);
  cr_assert_eq(t.kind, FERRY__TOK_BAD);
  cr_assert_eq(t.pos, strspn(text, " \n"));
  cr_assert_eq(err.code, FERRY_ESPEC);
  cr_assert_str_eq(err.msg, msg);
  /* Without a place for the message it fails the same. */
  cr_assert_eq(ferry__lex(SPEC, text, 0, &t, NULL), FERRY_ESPEC);
}

Test(lex, malformed_strings) {
  bad_string(" \"abc",
             "column 6: expected '\"' to end the string that starts at "
             "byte 2, found end of input");
  bad_string("\"ab\\",
             "column 4: expected an escape (\\\" \\\\ \\n \\t) after "
             "'\\', found end of input");
  bad_string("\"\\\x01\"",
             "column 2: expected an escape (\\\" \\\\ \\n \\t) after "
             "'\\', found a special byte");
  bad_string("\"\\q\"",
             "column 2: expected an escape (\\\" \\\\ \\n \\t), found "
             "'\\q'");
  bad_string("\"a\tb\"",
             "column 3: expected a printable character or an escape in a "
             "string, found byte 0x09");
  bad_string("\n\"a\xc3(\"",
             "line 2, column 3: expected UTF-8 text in a string, found byte "
             "0xc3");
  /* Mid-text, after good tokens. */
  TOKENS(SPEC, "x(\"ok\", \"no", "I0:1 (1:1 S2:4 ,6:1 !");
}

static const char *show(const ferry__lex_syntax_t *syn, const char *text,
                        size_t cap) {
  static char buf[200];
  ferry__token_t t;
  cr_assert_leq(cap, sizeof(buf));
  memset(buf, '#', sizeof(buf));
  ferry__lex(syn, text, 0, &t, NULL);
  return ferry__lex_describe(syn, text, &t, buf, cap);
}

Test(lex, describe) {
  cr_assert_str_eq(show(SPEC, "  ", 200), "end of input");
  cr_assert_str_eq(show(AUG, "  ", 200), "the end of the text");
  cr_assert_str_eq(show(SPEC, "decode", 200), "'decode'");
  cr_assert_str_eq(show(SPEC, "|", 200), "'|'");
  /* Numbers bare in the pipeline spec, quoted in the augmentation one. */
  cr_assert_str_eq(show(SPEC, "-1.5", 200), "-1.5");
  cr_assert_str_eq(show(AUG, "+1.5", 200), "'+1.5'");
  cr_assert_str_eq(show(SPEC, "%", 200), "'%'");
  cr_assert_str_eq(show(SPEC, "\x01", 200), "byte 0x01");
  cr_assert_str_eq(show(AUG, "\xc3\xa9", 200), "byte 0xc3");
  /* A string as written, other bytes than printable ASCII as \xNN. */
  cr_assert_str_eq(show(SPEC, "\"a\xc3\xa9\"", 200), "\"a\\xc3\\xa9\"");
  /* 40 bytes shown in the pipeline spec, 24 in the augmentation spec. */
  cr_assert_str_eq(show(SPEC, "a123456789b123456789c123456789d123456789", 200),
                   "'a123456789b123456789c123456789d123456789'");
  cr_assert_str_eq(show(SPEC, "a123456789b123456789c123456789d123456789e",
                        200),
                   "'a123456789b123456789c123456789d123456789...'");
  cr_assert_str_eq(show(AUG, "a123456789b123456789c123", 200),
                   "'a123456789b123456789c123'");
  cr_assert_str_eq(show(AUG, "a123456789b123456789c1234", 200),
                   "'a123456789b123456789c123...'");
  /* The room documented (4 * shown + 6) holds the longest there is... */
  {
    char s[64] = "\"", want[200] = "\"";
    for (int i = 0; i < 20; i++)
      strcat(s, "\xc3\xa9");
    strcat(s, "\"");
    for (int i = 0; i < 19; i++)
      strcat(want, "\\xc3\\xa9");
    strcat(want, "\\xc3...");
    cr_assert_str_eq(show(SPEC, s, 4 * 40 + 6), want);
  }
  /* ...and a smaller buffer cuts the text short, NUL-terminated. */
  cr_assert_str_eq(show(SPEC, "decode", 5), "'dec");
  cr_assert_str_eq(show(SPEC, "\x01", 5), "byte");
  cr_assert_str_eq(show(SPEC, "decode", 1), "");
}

Test(lex, where) {
  char b[64];
  const char *text = "ab\ncd\n\nef";
  cr_assert_str_eq(ferry__lex_where(text, 0, b, sizeof(b)), "column 1");
  cr_assert_str_eq(ferry__lex_where(text, 2, b, sizeof(b)), "column 3");
  cr_assert_str_eq(ferry__lex_where(text, 3, b, sizeof(b)),
                   "line 2, column 1");
  cr_assert_str_eq(ferry__lex_where(text, 7, b, sizeof(b)),
                   "line 4, column 1");
  /* Past the end: where the text ends. */
  cr_assert_str_eq(ferry__lex_where("ab", 99, b, sizeof(b)), "column 3");
}

Test(lex, tok_is) {
  const char *text = "none nonex 1";
  ferry__token_t t;
  ferry__lex(SPEC, text, 0, &t, NULL);
  cr_assert(ferry__tok_is(text, &t, "none"));
  cr_assert_not(ferry__tok_is(text, &t, "non"));
  ferry__lex(SPEC, text, 4, &t, NULL);
  cr_assert_not(ferry__tok_is(text, &t, "none"));
  ferry__lex(SPEC, text, 10, &t, NULL);
  cr_assert_not(ferry__tok_is(text, &t, "1"));
}

Test(lex, utf8_seq) {
  static const struct {
    const char *s;
    size_t n;
  } cases[] = {
      {"a", 1},          {"\xc2\x80", 2},     {"\xc1\xbf", 0},
      {"\xdf\xbf", 2},   {"\xe0\xa0\x80", 3}, {"\xe0\x9f\xbf", 0},
      {"\xed\x9f\xbf", 3}, {"\xed\xa0\x80", 0}, {"\xf0\x90\x80\x80", 4},
      {"\xf0\x8f\xbf\xbf", 0}, {"\xf4\x8f\xbf\xbf", 4},
      {"\xf4\x90\x80\x80", 0}, {"\xf5\x80\x80\x80", 0}, {"\xe2\x82", 0},
      {"\x80", 0}};
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
    cr_assert_eq(ferry__lex_utf8_seq((const unsigned char *)cases[i].s),
                 cases[i].n, "case %zu", i);
}
