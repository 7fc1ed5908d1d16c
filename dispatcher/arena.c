/* Response memory freed in one go (arena.h), and the protobuf-c allocator
 * over it (the one over the Ferry heap is common's: pb_alloc.h). */
#include "arena.h"

#include <malloc.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "alloc.h"

/* Blocks carved from the front (a response is many small messages: a
 * client's heartbeat answer has one WorkerInfo per worker), so that a
 * response costs a few mallocs rather than one per object (the
 * profile of a million splits). Block sizes double from ARENA_FIRST up
 * to ARENA_MAX, so a small answer (most held heartbeats) zeroes little;
 * a request over half the next block's size gets a block of its own,
 * linked behind the current one so the current one keeps filling. */
#define ARENA_FIRST 512
#define ARENA_MAX 65536

typedef struct block_s {
  struct block_s *next;
  size_t used, cap; /* bytes of data[] handed out, and its size */
  max_align_t data[];
} block_t;

void *ferry__arena_alloc(ferry_arena_t *a, size_t size) {
  const size_t al = sizeof(max_align_t);
  block_t *b = a->head;
  if (size > SIZE_MAX - sizeof(block_t) - al)
    return NULL;
  size = size == 0 ? al : (size + al - 1) / al * al;
  if (b != NULL && b->cap - b->used >= size) {
    void *p = (char *)b->data + b->used;
    b->used += size;
    return p; /* zeroed: calloc'ed and never handed out before */
  }
  size_t next = b == NULL ? ARENA_FIRST
                : b->cap >= ARENA_MAX / 2 ? ARENA_MAX
                                          : b->cap * 2;
  bool own = size > next / 2;
  size_t cap = own ? size : next;
  block_t *n = ferry__calloc(1, sizeof(*n) + cap);
  if (n == NULL)
    return NULL;
  n->cap = cap;
  n->used = size;
  if (own && b != NULL) {
    n->next = b->next;
    b->next = n;
  } else {
    n->next = b;
    a->head = n;
  }
  return n->data;
}

void ferry__disp_trim_heap(void) {
#ifdef __GLIBC__
  malloc_trim(0);
#endif
}

void ferry__arena_free(ferry_arena_t *a) {
  block_t *b = a->head;
  while (b != NULL) {
    block_t *next = b->next;
    ferry__free(b);
    b = next;
  }
  a->head = NULL;
}

static void *arena_pb_alloc(void *data, size_t n) {
  return ferry__arena_alloc(data, n);
}
static void arena_pb_free(void *data, void *p) {}

void ferry__disp_arena_allocator(ferry_arena_t *a, ProtobufCAllocator *out) {
  out->alloc = arena_pb_alloc;
  out->free = arena_pb_free;
  out->allocator_data = a;
}

char *ferry__arena_strdup(ferry_arena_t *a, const char *s) {
  size_t n = strlen(s) + 1;
  char *p = ferry__arena_alloc(a, n);
  if (p != NULL)
    memcpy(p, s, n);
  return p;
}
