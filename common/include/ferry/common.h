/* What libferry's public headers share: the record error policy (used by
 * ferry_client_options_t and the TFRecord reader) and ferry_free. */
#ifndef FERRY_COMMON_H
#define FERRY_COMMON_H

#include "ferry/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What to do with a record that fails its checks (CRC, framing, parse). */
typedef enum {
  FERRY_ON_ERROR_FAIL = 0, /* stop at the first bad record */
  FERRY_ON_ERROR_SKIP = 1  /* skip bad records, count them, go on */
} ferry_error_policy_t;

/* Frees memory the library handed to the caller (NULL is fine). */
FERRY_API void ferry_free(void *p);

#ifdef __cplusplus
}
#endif

#endif /* FERRY_COMMON_H */
