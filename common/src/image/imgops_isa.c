/* Run-time choice of the SIMD level used by the image ops. */
#include "imgops.h"

#include <stdatomic.h>
#include <string.h>

#include "imgops_internal.h"

/* -1 until first use. Relaxed atomics: detection is idempotent, so racing
 * first calls agree on the value. */
static _Atomic int level = -1;

static int detect(void) {
  __builtin_cpu_init();
  /* The *_avx2.c files are built with -mavx2 -mfma -mbmi2 and the
   * *_avx512.c ones also with AVX-512 F/BW/VL/DQ: require all of them. */
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma") ||
      !__builtin_cpu_supports("bmi2"))
    return FERRY__ISA_SCALAR;
  if (__builtin_cpu_supports("avx512f") &&
      __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq"))
    return FERRY__ISA_AVX512;
  return FERRY__ISA_AVX2;
}

/* Returns the level in use, detecting it on first call. */
int ferry__imgops_level(void) {
  int l = atomic_load_explicit(&level, memory_order_relaxed);
  if (l < 0) {
    l = detect();
    atomic_store_explicit(&level, l, memory_order_relaxed);
  }
  return l;
}

const char *ferry__imgops_isa(void) {
  switch (ferry__imgops_level()) {
  case FERRY__ISA_AVX512:
    return "avx512";
  case FERRY__ISA_AVX2:
    return "avx2";
  default:
    return "scalar";
  }
}

int ferry__imgops_set_isa(const char *name) {
  int want;
  if (name == NULL)
    return FERRY_EINVAL;
  if (strcmp(name, "scalar") == 0)
    want = FERRY__ISA_SCALAR;
  else if (strcmp(name, "avx2") == 0)
    want = FERRY__ISA_AVX2;
  else if (strcmp(name, "avx512") == 0)
    want = FERRY__ISA_AVX512;
  else
    return FERRY_EINVAL;
  if (want > detect())
    return FERRY_ENOTSUP;
  atomic_store_explicit(&level, want, memory_order_relaxed);
  return 0;
}
