/* protobuf-c's allocator over the one allocation wrapper (alloc.h),
 * so that unpacked messages count in the leak checks and fail under the
 * failure injection like everything else. Pass &ferry__pb_allocator to
 * *__unpack and *__free_unpacked. */
#ifndef FERRY_PB_ALLOC_H
#define FERRY_PB_ALLOC_H

#include <protobuf-c/protobuf-c.h>
#include <stdbool.h>

extern ProtobufCAllocator ferry__pb_allocator;

/* The same allocator, also setting *oom when an allocation fails: after
 * an unpack returned NULL, tells out of memory from malformed input. */
ProtobufCAllocator ferry__pb_allocator_noting(bool *oom);

#endif /* FERRY_PB_ALLOC_H */
