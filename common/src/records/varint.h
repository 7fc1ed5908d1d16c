/* Protocol-buffer varints: the one copy of writing and reading them
 * (chunk encoder and parser, the Example parser, the tests' message
 * builders). */
#ifndef FERRY_VARINT_H
#define FERRY_VARINT_H

#include <stddef.h>
#include <stdint.h>

/* The most bytes a 64-bit varint takes. */
#define FERRY_VARINT_MAX 10

/* Bytes v takes as a varint (1 to 10). */
static inline size_t ferry__varint_len(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    n++;
  }
  return n;
}

/* Writes v at out (room for ferry__varint_len(v) bytes); returns the
 * bytes written. */
static inline size_t ferry__varint_put(uint8_t *out, uint64_t v) {
  size_t n = 0;
  while (v >= 0x80) {
    out[n++] = (uint8_t)(v | 0x80);
    v >>= 7;
  }
  out[n++] = (uint8_t)v;
  return n;
}

/* Reads a varint of at most `max` bytes at p (p <= end). Returns its
 * length, 0 when it runs into `end`, -1 when it is longer than `max`
 * bytes. Bits past the 64th are dropped, as protobuf does. */
static inline int ferry__varint_get(const uint8_t *p, const uint8_t *end,
                                    int max, uint64_t *out) {
  uint64_t v = 0;
  size_t avail = (size_t)(end - p);
  int i;

  if (avail > 0 && p[0] < 0x80) {
    *out = p[0];
    return 1;
  }
  for (i = 0; i < max; i++) {
    if ((size_t)i == avail)
      return 0;
    v |= (uint64_t)(p[i] & 0x7f) << (7 * i);
    if (p[i] < 0x80) {
      *out = v;
      return i + 1;
    }
  }
  return -1;
}

#endif /* FERRY_VARINT_H */
