/* CRC-32C with the SSE4.2 crc32 instruction. Compiled with -msse4.2
 * -mpclmul (see common/CMakeLists.txt); callers check
 * ferry__crc32c_have_hw() first.
 *
 * The instruction has a 3-cycle latency and a 1-cycle throughput, so one
 * dependent chain runs at a third of the unit's speed. ferry__crc32c_hw3
 * splits each block into three equal streams, runs three chains, and joins
 * them: with the raw (uninverted) register, crc(A || B) = crc(A) * x^(8|B|)
 * + crc(B) mod P, and the multiplication by the constant x^(8n) is one
 * carry-less multiply followed by a crc32 of the 64-bit product. */
#include "crc32c.h"

#include <nmmintrin.h>
#include <pthread.h>
#include <wmmintrin.h>

#define POLY 0x82F63B78u

/* Bytes per stream in the long and short blocks. Long blocks make the join
 * negligible; short ones keep mid-sized buffers on three chains. */
#define LONG_BLOCK 4096
#define SHORT_BLOCK 256

/* k_long1 shifts by LONG_BLOCK bytes, k_long2 by twice that; same for the
 * short ones. Each is x^(8n - 33) mod P, bit-reflected: the carry-less
 * product of two reflected values carries one extra factor of x, and the
 * crc32 reduction of a 64-bit word multiplies by x^32. */
static uint32_t k_long1, k_long2, k_short1, k_short2;
static pthread_once_t k_once = PTHREAD_ONCE_INIT;

/* x^n mod P, reflected (bit 31 is the coefficient of x^0). */
static uint32_t xpow_mod(uint64_t n) {
  uint32_t v = 0x80000000u;
  for (uint64_t i = 0; i < n; i++)
    v = (v & 1) ? (v >> 1) ^ POLY : v >> 1;
  return v;
}

static void k_init(void) {
  k_long1 = xpow_mod(8 * LONG_BLOCK - 33);
  k_long2 = xpow_mod(16 * LONG_BLOCK - 33);
  k_short1 = xpow_mod(8 * SHORT_BLOCK - 33);
  k_short2 = xpow_mod(16 * SHORT_BLOCK - 33);
}

/* Returns crc * x^(8n) mod P, where k is the constant for n. */
static inline uint32_t shift(uint32_t crc, uint32_t k) {
  __m128i prod = _mm_clmulepi64_si128(_mm_cvtsi32_si128((int)crc),
                                      _mm_cvtsi32_si128((int)k), 0);
  return (uint32_t)_mm_crc32_u64(0, (uint64_t)_mm_cvtsi128_si64(prod));
}

static inline uint64_t load64(const unsigned char *p) {
  uint64_t v;
  __builtin_memcpy(&v, p, 8);
  return v;
}

/* Runs the raw register `c` over `len` bytes on one chain. */
static inline uint32_t one_chain(uint32_t c, const unsigned char *p,
                                 size_t len) {
  uint64_t c64 = c;
  while (len > 0 && ((uintptr_t)p & 7) != 0) {
    c64 = _mm_crc32_u8((uint32_t)c64, *p++);
    len--;
  }
  while (len >= 8) {
    c64 = _mm_crc32_u64(c64, load64(p));
    p += 8;
    len -= 8;
  }
  while (len > 0) {
    c64 = _mm_crc32_u8((uint32_t)c64, *p++);
    len--;
  }
  return (uint32_t)c64;
}

uint32_t ferry__crc32c_hw1(uint32_t crc, const void *buf, size_t len) {
  return ~one_chain(~crc, buf, len);
}

/* Three chains over consecutive thirds of a 3 * `block`-byte block,
 * joined into `c`. */
static inline uint32_t three_chains(uint32_t c, const unsigned char *p,
                                    size_t block, uint32_t k1,
                                    uint32_t k2) {
  uint64_t c0 = c, c1 = 0, c2 = 0;
  const unsigned char *p1 = p + block, *p2 = p + 2 * block;
  for (size_t i = 0; i < block; i += 8) {
    c0 = _mm_crc32_u64(c0, load64(p + i));
    c1 = _mm_crc32_u64(c1, load64(p1 + i));
    c2 = _mm_crc32_u64(c2, load64(p2 + i));
  }
  return shift((uint32_t)c0, k2) ^ shift((uint32_t)c1, k1) ^ (uint32_t)c2;
}

uint32_t ferry__crc32c_hw3(uint32_t crc, const void *buf, size_t len) {
  const unsigned char *p = buf;
  uint32_t c = ~crc;

  if (len < 3 * SHORT_BLOCK)
    return ~one_chain(c, p, len);
  pthread_once(&k_once, k_init);
  while (((uintptr_t)p & 7) != 0) {
    c = _mm_crc32_u8(c, *p++);
    len--;
  }
  while (len >= 3 * LONG_BLOCK) {
    c = three_chains(c, p, LONG_BLOCK, k_long1, k_long2);
    p += 3 * LONG_BLOCK;
    len -= 3 * LONG_BLOCK;
  }
  while (len >= 3 * SHORT_BLOCK) {
    c = three_chains(c, p, SHORT_BLOCK, k_short1, k_short2);
    p += 3 * SHORT_BLOCK;
    len -= 3 * SHORT_BLOCK;
  }
  return ~one_chain(c, p, len);
}
