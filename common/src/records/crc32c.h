/* CRC-32C (Castagnoli) and TFRecord's CRC masking.
 *
 * ferry__crc32c picks its implementation once, at first use, from the CPU's
 * features: SSE4.2 with three interleaved instruction streams combined at
 * the end (the crc32 instruction has a 3-cycle latency and a 1-cycle
 * throughput), else a portable slicing-by-8 table. */
#ifndef FERRY_CRC32C_H
#define FERRY_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* Extends `crc` (0 to start, or a previous result) over `len` bytes at
 * `buf` and returns the finalised CRC, like zlib's crc32(). Thread-safe. */
uint32_t ferry__crc32c(uint32_t crc, const void *buf, size_t len);

/* TFRecord masking: ((c >> 15) | (c << 17)) + 0xA282EAD8, and its inverse. */
static inline uint32_t ferry__crc32c_mask(uint32_t c) {
  return ((c >> 15) | (c << 17)) + 0xA282EAD8u;
}
static inline uint32_t ferry__crc32c_unmask(uint32_t m) {
  uint32_t r = m - 0xA282EAD8u;
  return (r >> 17) | (r << 15);
}

/* The name of the implementation in use: "sse42x3" or "portable". */
const char *ferry__crc32c_impl(void);

/* Individual implementations, for tests and the benchmark's baselines.
 * Same contract as ferry__crc32c. The hardware ones must only be called
 * when ferry__crc32c_have_hw() is true. */
uint32_t ferry__crc32c_portable(uint32_t crc, const void *buf, size_t len);
uint32_t ferry__crc32c_hw1(uint32_t crc, const void *buf, size_t len);
uint32_t ferry__crc32c_hw3(uint32_t crc, const void *buf, size_t len);
int ferry__crc32c_have_hw(void);

#endif /* FERRY_CRC32C_H */
