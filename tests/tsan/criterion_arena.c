/*
 * Criterion under ThreadSanitizer: BoxFort's arena placed where TSan
 * lets a program map memory.
 *
 * Criterion (through BoxFort 0.1.2, Debian 12's) maps an arena that each
 * test's process maps again at the same address. It draws the address
 * with rand_r(): 0x2000'0000'0000 plus a 22-bit draw times 16 MiB, up to
 * 0x7f00'0000'0000, and keeps the first of 10 draws whose pages
 * mincore() finds unmapped. Under TSan's x86-64 layout most of that range
 * is TSan's shadow (mapped) or a hole its mmap() refuses, so the test
 * programs abort with "Could not initialize inheritable arena" (Criterion
 * issue 274, open upstream).
 *
 * Linked into each Criterion program of a FERRY_SANITIZE=thread build
 * only (ferry::criterion in cmake/Dependencies.cmake). A program's own
 * rand_r comes first in symbol lookup; a call from libcriterion gets a
 * draw inside the range TSan keeps for PIE programs, [0x5500'0000'0000,
 * 0x5680'0000'0000), where the kernel's mincore() then decides as
 * before. The heap and module ranges are avoided: a test's process maps
 * the arena at the same address, where its own heap or libraries may be.
 * Every other caller (the chaos and fault tests draw their fault points
 * with rand_r) gets libc's.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* dladdr, RTLD_NEXT */
#endif
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

/* BoxFort: base 0x2000'0000'0000, step 1 << 24, draw masked with 0x3fffff. */
enum {
  PIE_FIRST_DRAW = (0x550000000000 - 0x200000000000) >> 24,
  PIE_DRAWS = (0x568000000000 - 0x550000000000) >> 24,
};

static int called_from_criterion(const void *caller) {
  Dl_info info;
  return dladdr(caller, &info) && info.dli_fname &&
         strstr(info.dli_fname, "libcriterion") != NULL;
}

static int (*libc_rand_r)(unsigned *);

/* Before main, so before any thread draws. */
__attribute__((constructor)) static void find_libc_rand_r(void) {
  libc_rand_r = (int (*)(unsigned *))dlsym(RTLD_NEXT, "rand_r");
}

int rand_r(unsigned *seed) {
  int r = libc_rand_r(seed);
  if (called_from_criterion(__builtin_return_address(0)))
    r = PIE_FIRST_DRAW + r % PIE_DRAWS;
  return r;
}
