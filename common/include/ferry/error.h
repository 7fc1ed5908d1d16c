/* Ferry error codes: 0 is success, every failure is a negative FERRY_E*.
 *
 * One X-macro table generates the enum, ferry_strerror() and
 * ferry_err_name(). System errors are negated errno values; Ferry's own
 * codes live at -1000 and below, each foreign library (gRPC, CUDA, UCX,
 * TurboJPEG, zlib) is translated into them at one boundary. Never renumber
 * a code: they cross the wire in error messages and journals.
 */
#ifndef FERRY_ERROR_H
#define FERRY_ERROR_H

#include <errno.h>
#include <stddef.h>

#include "ferry/export.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FERRY_ERRNO_MAP(XX)                                                   \
  XX(ENOMEM, -ENOMEM, "out of memory")                                        \
  XX(EINVAL, -EINVAL, "invalid argument")                                     \
  XX(ENOENT, -ENOENT, "no such file or directory")                            \
  XX(EIO, -EIO, "i/o error")                                                  \
  XX(EACCES, -EACCES, "permission denied")                                    \
  XX(ERANGE, -ERANGE, "value out of range")                                   \
  XX(ENOSPC, -ENOSPC, "no space left on device")                              \
  XX(ETIMEDOUT, -ETIMEDOUT, "timed out")                                      \
  XX(ECANCELED, -ECANCELED, "operation canceled")                             \
  XX(EMFILE, -EMFILE, "too many open files")                                  \
  XX(ENFILE, -ENFILE, "too many open files in system")                        \
  XX(EOF, -1000, "end of file")                                               \
  XX(ETRUNCLEN, -1001, "truncated record length")                             \
  XX(ETRUNCDATA, -1002, "truncated record data")                              \
  XX(ELENCRC, -1003, "record length CRC mismatch")                            \
  XX(EDATACRC, -1004, "record data CRC mismatch")                             \
  XX(ETOOLONG, -1005, "record length over the maximum")                       \
  XX(ECOMPRESS, -1006, "corrupt compressed stream")                           \
  XX(EINDEX, -1007, "malformed index file")                                   \
  XX(EVARINT, -1010, "malformed Example: bad varint")                         \
  XX(EWIRETYPE, -1011, "malformed Example: bad wire type")                    \
  XX(EOVERRUN, -1012, "malformed Example: length past the end")               \
  XX(ENOFEATURE, -1013, "missing feature")                                    \
  XX(EFEATTYPE, -1014, "feature has the wrong type")                          \
  XX(EIMGSIZE, -1020, "raw image has the wrong size")                         \
  XX(EJPEG, -1021, "corrupt JPEG")                                            \
  XX(EJPEGTRUNC, -1022, "truncated JPEG")                                     \
  XX(ETOOSMALL, -1023, "image too small for the op")                          \
  XX(ESHAPE, -1024, "image shape does not fit the batch")                     \
  XX(ESPEC, -1030, "invalid pipeline spec")                                   \
  XX(EOPTION, -1031, "invalid option")                                        \
  XX(ENOTSUP, -1032, "not supported")                                       \
  XX(EFORKED, -1033, "client used in a forked child")                         \
  XX(EGRPC_CANCELLED, -1101, "gRPC: cancelled")                               \
  XX(EGRPC_UNKNOWN, -1102, "gRPC: unknown error")                             \
  XX(EGRPC_INVALID_ARGUMENT, -1103, "gRPC: invalid argument")                 \
  XX(EGRPC_DEADLINE_EXCEEDED, -1104, "gRPC: deadline exceeded")               \
  XX(EGRPC_NOT_FOUND, -1105, "gRPC: not found")                               \
  XX(EGRPC_ALREADY_EXISTS, -1106, "gRPC: already exists")                     \
  XX(EGRPC_PERMISSION_DENIED, -1107, "gRPC: permission denied")               \
  XX(EGRPC_RESOURCE_EXHAUSTED, -1108, "gRPC: resource exhausted")             \
  XX(EGRPC_FAILED_PRECONDITION, -1109, "gRPC: failed precondition")           \
  XX(EGRPC_ABORTED, -1110, "gRPC: aborted")                                   \
  XX(EGRPC_OUT_OF_RANGE, -1111, "gRPC: out of range")                         \
  XX(EGRPC_UNIMPLEMENTED, -1112, "gRPC: unimplemented")                       \
  XX(EGRPC_INTERNAL, -1113, "gRPC: internal error")                           \
  XX(EGRPC_UNAVAILABLE, -1114, "gRPC: unavailable")                           \
  XX(EGRPC_DATA_LOSS, -1115, "gRPC: data loss")                               \
  XX(EGRPC_UNAUTHENTICATED, -1116, "gRPC: unauthenticated")

typedef enum {
#define XX(name, value, text) FERRY_##name = (value),
  FERRY_ERRNO_MAP(XX)
#undef XX
  FERRY_OK = 0
} ferry_errno_t;

/* An error with its context. Functions that can fail on bad input take a
 * `ferry_error_t *` (which may be NULL) and fill it with the code and a
 * message naming the file, byte offset, peer or field at fault. */
typedef struct ferry_error_s {
  int code;
  char msg[512];
} ferry_error_t;

/* Returns a static description of `code` ("unknown error" for codes not in
 * the table). Thread-safe. */
FERRY_API const char *ferry_strerror(int code);

/* Returns the code's name without the FERRY_ prefix, e.g. "EDATACRC"
 * ("UNKNOWN" for codes not in the table). */
FERRY_API const char *ferry_err_name(int code);

/* Clears `err` (code 0, empty message). NULL is fine. */
FERRY_API void ferry_error_clear(ferry_error_t *err);

#ifdef __cplusplus
}
#endif

/* The library's own error helpers: in-tree code only, where the build
 * defines FERRY_INTERNAL_HEADERS. */
#ifdef FERRY_INTERNAL_HEADERS
#include "error_internal.h"
#endif

#endif /* FERRY_ERROR_H */
