/* The one allocation wrapper. Every allocation in Ferry goes through these
 * functions so that tests can count live bytes (leak and growth checks) and
 * inject failures. They return NULL on failure and never abort. */
#ifndef FERRY_ALLOC_H
#define FERRY_ALLOC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ferry/common.h" /* ferry_free, the public free */

void *ferry__malloc(size_t size);
void *ferry__calloc(size_t n, size_t size);
void *ferry__realloc(void *p, size_t size);
void ferry__free(void *p);
char *ferry__strdup(const char *s);
char *ferry__strndup(const char *s, size_t n);

/* The one array growth: makes room for `need` elements of `elem` bytes
 * in the array whose address is `arrp` (a T **) with capacity *cap
 * (elements). The capacity doubles, starting from `min`, until it holds
 * `need`; a byte count that would overflow size_t fails. False when out
 * of memory, with the array and *cap unchanged. FERRY__GROW(a, cap, need,
 * min) passes &a and sizeof(*a). */
bool ferry__grow(void *arrp, size_t *cap, size_t need, size_t elem, size_t min);
#define FERRY__GROW(arr, cap, need, min)                                       \
  ferry__grow(&(arr), &(cap), (need), sizeof(*(arr)), (min))

/* Memory aligned to `align` (a power of two, at least 16), e.g. page-aligned
 * staging buffers or 64-byte SIMD rows. Free with ferry__aligned_free. */
void *ferry__aligned_alloc(size_t align, size_t size);
void ferry__aligned_free(void *p);

/* Live bytes and live allocations made through the wrapper, process-wide.
 * Thread-safe (relaxed atomics). */
typedef struct ferry_alloc_stats_s {
  int64_t bytes;
  int64_t blocks;
} ferry_alloc_stats_t;
void ferry__alloc_stats(ferry_alloc_stats_t *out);

/* Test hook: the n-th allocation from now (0 = the next) and every later
 * one fail until ferry__alloc_fail_reset(). */
void ferry__alloc_fail_after(int64_t n);
void ferry__alloc_fail_reset(void);

#endif /* FERRY_ALLOC_H */
