/* Response memory freed in one go: the state machine builds its
 * responses (protobuf-c messages) in a caller-owned arena, and everything
 * they point to lives until ferry__arena_free. Knows nothing of the state.
 */
#ifndef FERRY_DISPATCHER_ARENA_H
#define FERRY_DISPATCHER_ARENA_H

#include <stddef.h>

#include <protobuf-c/protobuf-c.h>

typedef struct ferry_arena_s {
  void *head; /* private: singly linked list of blocks */
} ferry_arena_t;

/* Zeroed memory that lives until ferry__arena_free; NULL when out of
 * memory. */
void *ferry__arena_alloc(ferry_arena_t *a, size_t size);
/* Frees every block; the arena is then empty and reusable. */
void ferry__arena_free(ferry_arena_t *a);

/* A copy of `s` in the arena; NULL when out of memory. */
char *ferry__arena_strdup(ferry_arena_t *a, const char *s);

/* Protobuf-c allocator over an arena (free is a no-op); the one over the
 * Ferry heap is ferry__pb_allocator (pb_alloc.h). */
void ferry__disp_arena_allocator(ferry_arena_t *a, ProtobufCAllocator *out);

/* Hands the heap's free memory back to the system (glibc's malloc_trim;
 * a no-op elsewhere): after a large transient, such as the registration
 * of a dataset of a million splits or a replay, whose freed memory the
 * daemon's malloc settings (ferry__rpc_tune_malloc) would otherwise keep
 * resident. Costs a walk of the heap: only after such transients. */
void ferry__disp_trim_heap(void);

#endif /* FERRY_DISPATCHER_ARENA_H */
