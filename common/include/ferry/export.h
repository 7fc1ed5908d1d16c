/* FERRY_API marks the functions libferry exports: the public API that
 * trainers and bindings call. libferry is compiled with hidden visibility
 * (-fvisibility=hidden, C and CUDA), so every other symbol, the internal
 * functions and the code it links statically included, stays inside the
 * library. ABI rules (docs/ARCHITECTURE.md, "libferry's ABI"):
 * a FERRY_API function is never removed or changed incompatibly within a
 * major version (the SONAME's number); public structs that callers
 * allocate only grow at their end, and the ones the library reads carry
 * their size (ferry_client_options_t.struct_size).
 */
#ifndef FERRY_EXPORT_H
#define FERRY_EXPORT_H

#if defined(__GNUC__) || defined(__clang__)
#define FERRY_API __attribute__((visibility("default")))
#else
#define FERRY_API
#endif

#endif /* FERRY_EXPORT_H */
