/* Checks of the strings a request carries: length bounds, and UTF-8 for
 * the proto3 `string` fields other readers echo. */
#ifndef FERRY_DISPATCHER_CHECK_H
#define FERRY_DISPATCHER_CHECK_H

#include <stdbool.h>
#include <stddef.h>

#include "ferry/error.h"

/* check.c */

/* True when s is valid UTF-8: proto3 `string` fields must be, or every
 * reader of a message that echoes them (GetStatus) refuses it. */
bool ferry__disp_utf8_valid(const char *s);

/* A copy of `s` with every byte that is not valid UTF-8 replaced by '?'
 * (a worker's error text may carry a file name in another encoding). */
void ferry__disp_utf8_clean(const char *s, char *out, size_t cap);

/* FERRY_EINVAL when `s` is longer than `max` bytes, or (`utf8`) not
 * valid UTF-8 (no request field is quoted back: it may be huge). */
int ferry__disp_check_str(const char *s, size_t max, bool utf8,
                          const char *what, ferry_error_t *err);

int ferry__disp_check_len(const char *s, size_t max, const char *what,
                          ferry_error_t *err);

#endif /* FERRY_DISPATCHER_CHECK_H */
