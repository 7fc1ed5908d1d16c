/* Error helpers for the code inside Ferry (not installed; error.h includes
 * this in in-tree builds). */
#ifndef FERRY_ERROR_INTERNAL_H
#define FERRY_ERROR_INTERNAL_H

#include "ferry/error.h"

#if defined(__GNUC__)
#define FERRY_PRINTF(fmt, args) __attribute__((format(printf, fmt, args)))
#else
#define FERRY_PRINTF(fmt, args)
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Maps an errno value (positive) to a Ferry code: known values to their
 * FERRY_E* twin, anything else to FERRY_EIO. */
int ferry__err_from_errno(int errnum);

/* Fills `err` (if not NULL) with `code` and the formatted message, and
 * returns `code` so callers can write `return ferry__seterr(err, ...)`. */
int ferry__seterr(ferry_error_t *err, int code, const char *fmt, ...)
    FERRY_PRINTF(3, 4);

/* Prepends "prefix: " to the message already in `err` (if not NULL) and
 * returns its code. Used to add the file name or record offset as an error
 * travels up. */
int ferry__prefixerr(ferry_error_t *err, const char *fmt, ...)
    FERRY_PRINTF(2, 3);

#ifdef __cplusplus
}
#endif

#endif /* FERRY_ERROR_INTERNAL_H */
