/* The library's logging macro (not installed; log.h includes this in
 * in-tree builds). FERRY_LOG checks the level before formatting, so a
 * disabled debug line costs one load and a branch. */
#ifndef FERRY_LOG_INTERNAL_H
#define FERRY_LOG_INTERNAL_H

#include "error_internal.h"
#include "ferry/log.h"

extern int ferry__log_level;
void ferry__log(int level, const char *fmt, ...) FERRY_PRINTF(2, 3);

#define FERRY_LOG(level, ...)                                                  \
  do {                                                                         \
    if ((level) <= ferry__log_level)                                           \
      ferry__log((level), __VA_ARGS__);                                        \
  } while (0)

#endif /* FERRY_LOG_INTERNAL_H */
