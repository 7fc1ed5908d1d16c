#include "alloc.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "pb_alloc.h"

/* Each block carries a 16-byte header holding its size, so frees can be
 * accounted without a side table. 16 keeps malloc's alignment. */
#define HDR 16

static _Atomic int64_t live_bytes;
static _Atomic int64_t live_blocks;
static _Atomic int64_t fail_countdown = -1;

static int should_fail(void) {
  int64_t n = atomic_load_explicit(&fail_countdown, memory_order_relaxed);
  if (n < 0)
    return 0;
  if (n == 0)
    return 1;
  atomic_fetch_sub_explicit(&fail_countdown, 1, memory_order_relaxed);
  return 0;
}

static void account(int64_t bytes, int64_t blocks) {
  atomic_fetch_add_explicit(&live_bytes, bytes, memory_order_relaxed);
  atomic_fetch_add_explicit(&live_blocks, blocks, memory_order_relaxed);
}

void *ferry__malloc(size_t size) {
  unsigned char *p;
  if (size > SIZE_MAX - HDR || should_fail())
    return NULL;
  p = malloc(size + HDR);
  if (p == NULL)
    return NULL;
  memcpy(p, &size, sizeof(size));
  account((int64_t)size, 1);
  return p + HDR;
}

void *ferry__calloc(size_t n, size_t size) {
  void *p;
  if (size != 0 && n > SIZE_MAX / size)
    return NULL;
  p = ferry__malloc(n * size);
  if (p != NULL)
    memset(p, 0, n * size);
  return p;
}

void *ferry__realloc(void *ptr, size_t size) {
  unsigned char *base, *p;
  size_t old;
  if (ptr == NULL)
    return ferry__malloc(size);
  if (size > SIZE_MAX - HDR || should_fail())
    return NULL;
  base = (unsigned char *)ptr - HDR;
  memcpy(&old, base, sizeof(old));
  p = realloc(base, size + HDR);
  if (p == NULL)
    return NULL;
  memcpy(p, &size, sizeof(size));
  account((int64_t)size - (int64_t)old, 0);
  return p + HDR;
}

bool ferry__grow(void *arrp, size_t *cap, size_t need, size_t elem,
                 size_t min) {
  if (need <= *cap)
    return true;
  size_t n = *cap > min ? *cap : min > 0 ? min : 1;
  while (n < need)
    n = n > SIZE_MAX / 2 ? need : n * 2;
  if (elem != 0 && n > SIZE_MAX / elem)
    return false;
  void *old;
  memcpy(&old, arrp, sizeof(old));
  void *grown = ferry__realloc(old, n * elem);
  if (grown == NULL)
    return false;
  memcpy(arrp, &grown, sizeof(grown));
  *cap = n;
  return true;
}

void ferry__free(void *ptr) {
  unsigned char *base;
  size_t size;
  if (ptr == NULL)
    return;
  base = (unsigned char *)ptr - HDR;
  memcpy(&size, base, sizeof(size));
  account(-(int64_t)size, -1);
  free(base);
}

void ferry_free(void *p) { ferry__free(p); }

char *ferry__strdup(const char *s) { return ferry__strndup(s, strlen(s)); }

char *ferry__strndup(const char *s, size_t n) {
  size_t len = strnlen(s, n);
  char *d = ferry__malloc(len + 1);
  if (d != NULL) {
    memcpy(d, s, len);
    d[len] = '\0';
  }
  return d;
}

/* Aligned blocks keep the raw pointer and size just below the aligned
 * address. */
void *ferry__aligned_alloc(size_t align, size_t size) {
  unsigned char *raw;
  uintptr_t aligned;
  if (align < 16 || (align & (align - 1)) != 0)
    return NULL;
  if (size > SIZE_MAX - align - HDR || should_fail())
    return NULL;
  raw = malloc(size + align + HDR);
  if (raw == NULL)
    return NULL;
  aligned = ((uintptr_t)raw + HDR + align - 1) & ~(uintptr_t)(align - 1);
  memcpy((unsigned char *)aligned - 16, &raw, sizeof(raw));
  memcpy((unsigned char *)aligned - 8, &size, sizeof(size));
  account((int64_t)size, 1);
  return (void *)aligned;
}

void ferry__aligned_free(void *p) {
  unsigned char *raw;
  size_t size;
  if (p == NULL)
    return;
  memcpy(&raw, (unsigned char *)p - 16, sizeof(raw));
  memcpy(&size, (unsigned char *)p - 8, sizeof(size));
  account(-(int64_t)size, -1);
  free(raw);
}

void ferry__alloc_stats(ferry_alloc_stats_t *out) {
  out->bytes = atomic_load_explicit(&live_bytes, memory_order_relaxed);
  out->blocks = atomic_load_explicit(&live_blocks, memory_order_relaxed);
}

void ferry__alloc_fail_after(int64_t n) {
  atomic_store_explicit(&fail_countdown, n, memory_order_relaxed);
}

void ferry__alloc_fail_reset(void) {
  atomic_store_explicit(&fail_countdown, -1, memory_order_relaxed);
}

/* ---- protobuf-c (pb_alloc.h) --------------------------------------- */

/* data: NULL, or a bool set when an allocation fails. */
static void *pb_alloc(void *data, size_t size) {
  void *p = ferry__malloc(size);
  if (p == NULL && data != NULL)
    *(bool *)data = true;
  return p;
}

static void pb_free(void *data, void *p) {
  (void)data;
  ferry__free(p);
}

ProtobufCAllocator ferry__pb_allocator = {pb_alloc, pb_free, NULL};

ProtobufCAllocator ferry__pb_allocator_noting(bool *oom) {
  return (ProtobufCAllocator){pb_alloc, pb_free, oom};
}
