/* File helpers the unit tests share (header-only: each test is its own
 * executable). */
#ifndef FERRY_TESTS_UNIT_FILES_H
#define FERRY_TESTS_UNIT_FILES_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* The whole file at `path` in a malloc'd buffer (one spare byte), or
 * NULL when it cannot be opened or read. */
static inline uint8_t *tu_slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  uint8_t *b;
  long n;
  if (f == NULL)
    return NULL;
  if (fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) < 0 ||
      fseek(f, 0, SEEK_SET) != 0) {
    fclose(f);
    return NULL;
  }
  b = malloc((size_t)n + 1);
  if (b == NULL || fread(b, 1, (size_t)n, f) != (size_t)n) {
    fclose(f);
    free(b);
    return NULL;
  }
  fclose(f);
  *len = (size_t)n;
  return b;
}

#endif /* FERRY_TESTS_UNIT_FILES_H */
