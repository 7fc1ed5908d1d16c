/*
 * ThreadSanitizer annotations for hand-offs TSan cannot see.
 *
 * Debian's gRPC is not built with TSan and its locks sleep on futexes
 * through raw syscalls, so when a tag Ferry passes to gRPC comes back
 * from a completion queue on another thread, TSan does not know that the
 * completion happens after the call that started it, and reads the
 * tag's fields (and the call context around it) as racing. gRPC
 * guarantees that order; these macros state it: FERRY_TSAN_RELEASE(tag)
 * right before handing a tag to gRPC, FERRY_TSAN_ACQUIRE(tag) right
 * after a completion queue returns it. Outside a TSan build they are
 * nothing.
 */
#ifndef FERRY_TSAN_H
#define FERRY_TSAN_H

#if defined(__SANITIZE_THREAD__)
#define FERRY_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define FERRY_TSAN 1
#endif
#endif

/* How many times slower a program runs under TSan, for the time bounds
 * tests assert (a daemon's exit after SIGTERM): 1 elsewhere. */
#ifdef FERRY_TSAN
#define FERRY_TSAN_SLOWDOWN 5
#else
#define FERRY_TSAN_SLOWDOWN 1
#endif

#ifdef FERRY_TSAN
void __tsan_acquire(void *addr);
void __tsan_release(void *addr);
#define FERRY_TSAN_RELEASE(p) __tsan_release((void *)(p))
#define FERRY_TSAN_ACQUIRE(p) __tsan_acquire((void *)(p))
#else
#define FERRY_TSAN_RELEASE(p) ((void)(p))
#define FERRY_TSAN_ACQUIRE(p) ((void)(p))
#endif

#endif
