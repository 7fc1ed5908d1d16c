/* Response memory freed in one go (state.h), and the protobuf-c allocator
 * over it (the one over the Ferry heap is common's: ferry/pb_alloc.h). */
#include <stddef.h>
#include <string.h>

#include "ferry/alloc.h"
#include "state_internal.h"

typedef struct block_s {
  struct block_s *next;
  max_align_t data[];
} block_t;

void *ferry__arena_alloc(ferry_arena_t *a, size_t size) {
  block_t *b = ferry__calloc(1, sizeof(*b) + size);
  if (b == NULL)
    return NULL;
  b->next = a->head;
  a->head = b;
  return b->data;
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
