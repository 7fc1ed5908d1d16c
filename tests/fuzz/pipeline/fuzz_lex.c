/* Fuzz target for the lexer of both spec languages
 * (common/src/pipeline/lex.h): under each syntax, arbitrary text lexes
 * to tokens that cover it in order, only blanks between them, each of the
 * shape its kind says, up to the end or a malformed string; every
 * token's description fits the room the header promises.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lex.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond) ((cond) ? (void)0 : abort())

static void check_token(const ferry__lex_syntax_t *syn, const char *text,
                        const ferry__token_t *t) {
  const char *s = text + t->pos;
  char small[4 * 40 + 6], big[1024];
  size_t cap = 4 * syn->shown + 6;
  CHECK(cap <= sizeof(small));
  CHECK(strcmp(ferry__lex_describe(syn, text, t, small, cap),
               ferry__lex_describe(syn, text, t, big, sizeof(big))) == 0);
  CHECK((t->punct != 0) == (t->kind == FERRY__TOK_PUNCT));
  switch (t->kind) {
  case FERRY__TOK_END:
    CHECK(t->len == 0 && s[0] == '\0');
    break;
  case FERRY__TOK_PUNCT:
    CHECK(t->len == 1 && t->punct == s[0] &&
          strchr(syn->punct, s[0]) != NULL);
    break;
  case FERRY__TOK_STRING:
    CHECK(syn->strings && t->len >= 2 && s[0] == '"' &&
          s[t->len - 1] == '"');
    break;
  case FERRY__TOK_IDENT:
  case FERRY__TOK_NUMBER:
  case FERRY__TOK_BAD:
    CHECK(t->len >= 1 && t->len <= strlen(s));
    break;
  }
}

static void lex_all(const ferry__lex_syntax_t *syn, const char *text,
                    size_t len) {
  size_t pos = 0, n = 0;
  for (;;) {
    ferry__token_t t;
    ferry_error_t err;
    int rc = ferry__lex(syn, text, pos, &t, &err);
    CHECK(t.pos >= pos && t.pos <= len);
    for (; pos < t.pos; pos++)
      CHECK(strchr(syn->blanks, text[pos]) != NULL && text[pos] != '\0');
    if (rc != 0) {
      CHECK(rc == FERRY_ESPEC && err.code == FERRY_ESPEC && syn->strings &&
            t.kind == FERRY__TOK_BAD && t.len == 1 && text[t.pos] == '"');
      CHECK(strncmp(err.msg, "column ", 7) == 0 ||
            strncmp(err.msg, "line ", 5) == 0);
      return;
    }
    check_token(syn, text, &t);
    if (t.kind == FERRY__TOK_END) {
      CHECK(t.pos == len);
      CHECK(ferry__lex_where(text, len, err.msg, 48) == err.msg);
      return;
    }
    pos = t.pos + t.len;
    CHECK(++n <= len);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = malloc(size + 1);
  if (text == NULL)
    return 0;
  memcpy(text, data, size);
  text[size] = '\0';
  lex_all(&ferry__lex_pipeline_spec, text, strlen(text));
  lex_all(&ferry__lex_augment_spec, text, strlen(text));
  free(text);
  return 0;
}
