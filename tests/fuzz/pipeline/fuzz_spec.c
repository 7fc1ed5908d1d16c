/* Fuzz target for the pipeline spec. The input is tried twice: as spec
 * text (NUL-terminated copy) and as a serialized PipelineSpec. Whatever
 * is accepted must survive text and protobuf round trips unchanged, and
 * nothing may stay allocated either way.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "spec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                           \
  do {                                                                        \
    if (!(cond))                                                              \
      abort();                                                                \
  } while (0)

/* Checks that an accepted spec formats, re-parses to the same spec and
 * the same canonical text, and packs and unpacks to the same fingerprint.
 */
static void round_trips(const ferry_spec_t *s) {
  ferry_spec_t t, u;
  ferry_error_t err;
  char *c1 = NULL, *c2 = NULL;
  uint8_t *buf = NULL;
  size_t len = 0;

  CHECK(ferry__spec_validate(s, &err) == 0);
  CHECK(ferry__spec_format(s, &c1) == 0);
  CHECK(ferry__spec_parse(c1, &t, &err) == 0);
  CHECK(ferry__spec_equal(s, &t));
  CHECK(ferry__spec_format(&t, &c2) == 0);
  CHECK(strcmp(c1, c2) == 0);

  CHECK(ferry__spec_pack(s, &buf, &len) == 0);
  CHECK(ferry__spec_unpack(buf, len, &u, &err) == 0);
  CHECK(ferry__spec_equal(s, &u));
  CHECK(ferry__spec_fingerprint(s) == ferry__spec_fingerprint(&u));
  CHECK(ferry__spec_fingerprint(s) == ferry__spec_fingerprint(&t));

  ferry_free(c1);
  ferry_free(c2);
  ferry_free(buf);
  ferry__spec_close(&t);
  ferry__spec_close(&u);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ferry_alloc_stats_t before, after;
  ferry_spec_t s;
  ferry_error_t err;
  char *text;
  int rc;

  ferry__alloc_stats(&before);
  text = malloc(size + 1);
  if (text == NULL)
    return 0;
  memcpy(text, data, size);
  text[size] = '\0';

  rc = ferry__spec_parse(text, &s, &err);
  if (rc == 0) {
    round_trips(&s);
  } else {
    /* Every parse error says where. */
    CHECK(rc == FERRY_ESPEC && err.code == FERRY_ESPEC);
    CHECK(strncmp(err.msg, "column ", 7) == 0 ||
          strncmp(err.msg, "line ", 5) == 0);
    CHECK(s.patterns == NULL && s.n_patterns == 0);
  }
  ferry__spec_close(&s);
  free(text);

  rc = ferry__spec_unpack(data, size, &s, &err);
  if (rc == 0)
    round_trips(&s);
  else
    CHECK(rc == FERRY_ESPEC && s.patterns == NULL);
  ferry__spec_close(&s);

  ferry__alloc_stats(&after);
  CHECK(after.blocks == before.blocks && after.bytes == before.bytes);
  return 0;
}
