/* Fuzz target for checkpoint cursors (cursor.h): bytes a trainer
 * hands back as options.resume, from a checkpoint file. Whatever is
 * accepted must encode and decode to the same cursor; nothing may stay
 * allocated.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "cursor.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                           \
  do {                                                                        \
    if (!(cond))                                                              \
      abort();                                                                \
  } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ferry_cursor_t a, b;
  ferry_error_t err;
  uint8_t buf[FERRY_CURSOR_MAX_BYTES];
  size_t len = 0;
  ferry_alloc_stats_t before, after;
  ferry__alloc_stats(&before);
  if (ferry__cursor_decode(data, size, &a, &err) != 0) {
    CHECK(err.msg[0] != '\0');
  } else {
    CHECK(ferry__cursor_encode(&a, buf, sizeof(buf), &len) == 0);
    CHECK(len <= FERRY_CURSOR_MAX_BYTES);
    CHECK(ferry__cursor_decode(buf, len, &b, &err) == 0);
    CHECK(memcmp(&a, &b, sizeof(a)) == 0);
  }
  ferry__alloc_stats(&after);
  CHECK(after.blocks == before.blocks && after.bytes == before.bytes);
  return 0;
}
