/* CRC-32C: known vectors, the three implementations against each other on
 * every length up to 1 KiB at every alignment, large buffers (which take
 * the long three-stream blocks), and incremental extension. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "crc32c.h"

typedef uint32_t (*crc_fn)(uint32_t, const void *, size_t);

/* A small deterministic generator, so failures reproduce. */
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rng(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}

static void fill(uint8_t *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    p[i] = (uint8_t)rng();
}

/* Bit-at-a-time reference, straight from the definition. */
static uint32_t crc_ref(uint32_t crc, const uint8_t *p, size_t n) {
  uint32_t c = ~crc;
  for (size_t i = 0; i < n; i++) {
    c ^= p[i];
    for (int k = 0; k < 8; k++)
      c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
  }
  return ~c;
}

Test(crc32c, check_value) {
  cr_assert_eq(ferry__crc32c(0, "123456789", 9), 0xE3069283u);
  cr_assert_eq(ferry__crc32c_portable(0, "123456789", 9), 0xE3069283u);
  cr_assert_eq(ferry__crc32c(0, "", 0), 0u);
  if (ferry__crc32c_have_hw()) {
    cr_assert_eq(ferry__crc32c_hw1(0, "123456789", 9), 0xE3069283u);
    cr_assert_eq(ferry__crc32c_hw3(0, "123456789", 9), 0xE3069283u);
  }
}

/* RFC 3720 (iSCSI) B.4 vectors: 32 bytes of zeros, of 0xff, ascending. */
Test(crc32c, rfc3720_vectors) {
  uint8_t b[32];
  memset(b, 0, sizeof(b));
  cr_assert_eq(ferry__crc32c(0, b, 32), 0x8A9136AAu);
  memset(b, 0xff, sizeof(b));
  cr_assert_eq(ferry__crc32c(0, b, 32), 0x62A8AB43u);
  for (int i = 0; i < 32; i++)
    b[i] = (uint8_t)i;
  cr_assert_eq(ferry__crc32c(0, b, 32), 0x46DD794Eu);
}

Test(crc32c, masking) {
  uint32_t c = ferry__crc32c(0, "hello", 5);
  cr_assert_eq(ferry__crc32c_unmask(ferry__crc32c_mask(c)), c);
  /* The data CRC of the "hello" record in OPS.md: bytes bb 1f 1c 19. */
  cr_assert_eq(ferry__crc32c_mask(c), 0x191c1fbbu);
  cr_assert_eq(ferry__crc32c_mask(ferry__crc32c(0, "", 0)), 0xa282ead8u);
}

Test(crc32c, impl_name) {
  const char *name = ferry__crc32c_impl();
  cr_assert(strcmp(name, ferry__crc32c_have_hw() ? "sse42x3" : "portable") ==
            0);
}

/* Every length 0..1024 at every offset 0..15 (alignment), all three
 * implementations and the dispatching entry point against the bitwise
 * reference, starting from random CRCs. */
Test(crc32c, all_lengths_and_alignments) {
  enum { MAXLEN = 1024, SLACK = 16 };
  uint8_t *buf = malloc(MAXLEN + SLACK);
  int hw = ferry__crc32c_have_hw();
  fill(buf, MAXLEN + SLACK);
  for (size_t len = 0; len <= MAXLEN; len++) {
    for (size_t off = 0; off < SLACK; off++) {
      uint32_t init = (off & 1) ? (uint32_t)rng() : 0;
      const uint8_t *p = buf + off;
      uint32_t want = crc_ref(init, p, len);
      cr_assert_eq(ferry__crc32c_portable(init, p, len), want,
                   "portable len %zu off %zu", len, off);
      cr_assert_eq(ferry__crc32c(init, p, len), want, "len %zu off %zu", len,
                   off);
      if (hw) {
        cr_assert_eq(ferry__crc32c_hw1(init, p, len), want,
                     "hw1 len %zu off %zu", len, off);
        cr_assert_eq(ferry__crc32c_hw3(init, p, len), want,
                     "hw3 len %zu off %zu", len, off);
      }
    }
  }
  free(buf);
}

/* Large random lengths cross the long (3 x 4 KiB) and short (3 x 256 B)
 * block boundaries of the three-stream path. */
Test(crc32c, large_buffers_agree) {
  enum { MAXLEN = 300000 };
  uint8_t *buf = malloc(MAXLEN + 8);
  fill(buf, MAXLEN + 8);
  for (int i = 0; i < 300; i++) {
    size_t len = i < 20 ? (size_t)(3 * 4096 * (i + 1) + i - 10)
                        : (size_t)(rng() % MAXLEN);
    size_t off = (size_t)(rng() % 8);
    uint32_t init = (uint32_t)rng();
    uint32_t want = ferry__crc32c_portable(init, buf + off, len);
    if (i < 40)
      cr_assert_eq(crc_ref(init, buf + off, len), want, "len %zu", len);
    cr_assert_eq(ferry__crc32c(init, buf + off, len), want, "len %zu", len);
    if (ferry__crc32c_have_hw()) {
      cr_assert_eq(ferry__crc32c_hw1(init, buf + off, len), want, "len %zu",
                   len);
      cr_assert_eq(ferry__crc32c_hw3(init, buf + off, len), want, "len %zu",
                   len);
    }
  }
  free(buf);
}

/* crc(a || b) == extend(crc(a), b), for each implementation, at random
 * split points. */
Test(crc32c, incremental_extension) {
  enum { LEN = 70000 };
  crc_fn fns[4] = {ferry__crc32c, ferry__crc32c_portable, ferry__crc32c_hw1,
                   ferry__crc32c_hw3};
  int nfns = ferry__crc32c_have_hw() ? 4 : 2;
  uint8_t *buf = malloc(LEN);
  fill(buf, LEN);
  for (int f = 0; f < nfns; f++) {
    uint32_t whole = fns[f](0, buf, LEN);
    for (int i = 0; i < 200; i++) {
      size_t cut = i < 2 ? (size_t)(i * LEN) : (size_t)(rng() % LEN);
      uint32_t part = fns[f](0, buf, cut);
      cr_assert_eq(fns[f](part, buf + cut, LEN - cut), whole,
                   "impl %d cut %zu", f, cut);
    }
    /* Byte at a time, the slowest way. */
    uint32_t c = 0;
    for (size_t k = 0; k < 3000; k++)
      c = fns[f](c, buf + k, 1);
    cr_assert_eq(c, fns[f](0, buf, 3000), "impl %d bytewise", f);
  }
  free(buf);
}
