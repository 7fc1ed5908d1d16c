/* CRC-32C: the portable slicing-by-8 implementation and the run-time
 * choice between it and the SSE4.2 paths in crc32c_sse42.c. */
#include "crc32c.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

/* Reflected Castagnoli polynomial. */
#define POLY 0x82F63B78u

/* table[k][b] is the CRC register after feeding byte b followed by k zero
 * bytes, so eight bytes can be folded with eight independent look-ups. */
static uint32_t table[8][256];
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static void table_init(void) {
  for (uint32_t b = 0; b < 256; b++) {
    uint32_t c = b;
    for (int i = 0; i < 8; i++)
      c = (c & 1) ? (c >> 1) ^ POLY : c >> 1;
    table[0][b] = c;
  }
  for (uint32_t b = 0; b < 256; b++)
    for (int k = 1; k < 8; k++)
      table[k][b] = (table[k - 1][b] >> 8) ^ table[0][table[k - 1][b] & 0xff];
}

static inline uint64_t load_le64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--)
    v = (v << 8) | p[i];
  return v;
}

uint32_t ferry__crc32c_portable(uint32_t crc, const void *buf, size_t len) {
  const unsigned char *p = buf;
  uint32_t c = ~crc;

  pthread_once(&table_once, table_init);
  while (len > 0 && ((uintptr_t)p & 7) != 0) {
    c = (c >> 8) ^ table[0][(c ^ *p++) & 0xff];
    len--;
  }
  while (len >= 8) {
    uint64_t v = load_le64(p) ^ c;
    c = table[7][v & 0xff] ^ table[6][(v >> 8) & 0xff] ^
        table[5][(v >> 16) & 0xff] ^ table[4][(v >> 24) & 0xff] ^
        table[3][(v >> 32) & 0xff] ^ table[2][(v >> 40) & 0xff] ^
        table[1][(v >> 48) & 0xff] ^ table[0][v >> 56];
    p += 8;
    len -= 8;
  }
  while (len > 0) {
    c = (c >> 8) ^ table[0][(c ^ *p++) & 0xff];
    len--;
  }
  return ~c;
}

int ferry__crc32c_have_hw(void) {
  __builtin_cpu_init();
  return __builtin_cpu_supports("sse4.2") && __builtin_cpu_supports("pclmul");
}

typedef uint32_t (*crc_fn)(uint32_t, const void *, size_t);

static uint32_t resolve(uint32_t crc, const void *buf, size_t len);

/* Starts at the resolver, which replaces itself with the chosen
 * implementation. Threads racing through the resolver store the same
 * value, so relaxed ordering is enough. */
static _Atomic(crc_fn) impl = resolve;

static crc_fn choose(void) {
  return ferry__crc32c_have_hw() ? ferry__crc32c_hw3 : ferry__crc32c_portable;
}

static uint32_t resolve(uint32_t crc, const void *buf, size_t len) {
  crc_fn f = choose();
  atomic_store_explicit(&impl, f, memory_order_relaxed);
  return f(crc, buf, len);
}

uint32_t ferry__crc32c(uint32_t crc, const void *buf, size_t len) {
  return atomic_load_explicit(&impl, memory_order_relaxed)(crc, buf, len);
}

const char *ferry__crc32c_impl(void) {
  return choose() == ferry__crc32c_hw3 ? "sse42x3" : "portable";
}
