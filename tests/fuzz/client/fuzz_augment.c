/* Fuzz target for the augmentation spec parser: arbitrary text must parse
 * or fail cleanly; a spec that parses must format to text that parses
 * back to the same spec, bit for bit. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/augment.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int same(const ferry_augment_spec_t *a, const ferry_augment_spec_t *b) {
  return a->flip == b->flip && a->rescale == b->rescale &&
         a->exact == b->exact &&
         memcmp(&a->rotate, &b->rotate, sizeof(float)) == 0 &&
         memcmp(&a->zoom, &b->zoom, sizeof(float)) == 0 &&
         (!a->rescale || memcmp(&a->scale, &b->scale, sizeof(float)) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = malloc(size + 1);
  char canon[512];
  ferry_augment_spec_t a, b;
  ferry_error_t err;

  if (text == NULL)
    return 0;
  memcpy(text, data, size);
  text[size] = '\0';
  ferry_augment_spec_init(&a);
  if (ferry_augment_spec_parse(text, &a, &err) == 0) {
    if (ferry_augment_spec_format(&a, canon, sizeof(canon)) >= sizeof(canon))
      abort();
    ferry_augment_spec_init(&b);
    if (ferry_augment_spec_parse(canon, &b, &err) != 0 || !same(&a, &b))
      abort();
    ferry_augment_spec_close(&b);
  }
  ferry_augment_spec_close(&a);
  free(text);
  return 0;
}
