/* Logging. The library never writes to stderr: messages go to a callback
 * the application installs (daemons and ferryctl install
 * ferry_log_to_stderr). FERRY_LOG checks the level before formatting, so a
 * disabled debug line costs one load and a branch. */
#ifndef FERRY_LOG_H
#define FERRY_LOG_H

#include "ferry/error.h"

typedef enum {
  FERRY_LOG_ERROR = 0,
  FERRY_LOG_WARN = 1,
  FERRY_LOG_INFO = 2,
  FERRY_LOG_DEBUG = 3
} ferry_log_level_t;

typedef void (*ferry_log_cb)(int level, const char *msg, void *userdata);

/* Installs the callback (NULL: discard everything). Not thread-safe with
 * concurrent logging: call it at start-up. */
void ferry_log_set_callback(ferry_log_cb cb, void *userdata);
void ferry_log_set_level(int level);

/* Parses "error", "warn", "info" or "debug"; returns the level or -1. */
int ferry_log_level_parse(const char *name);

/* A ready callback: "2026-11-29T10:00:00.123Z INFO msg" lines on stderr. */
void ferry_log_to_stderr(int level, const char *msg, void *userdata);

extern int ferry__log_level;
void ferry__log(int level, const char *fmt, ...) FERRY_PRINTF(2, 3);

#define FERRY_LOG(level, ...)                                                 \
  do {                                                                        \
    if ((level) <= ferry__log_level)                                          \
      ferry__log((level), __VA_ARGS__);                                       \
  } while (0)

#endif /* FERRY_LOG_H */
