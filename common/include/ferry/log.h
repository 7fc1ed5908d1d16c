/* Logging. The library never writes to stderr: messages go to a callback
 * the application installs (daemons and ferryctl install
 * ferry_log_to_stderr). FERRY_LOG checks the level before formatting, so a
 * disabled debug line costs one load and a branch. */
#ifndef FERRY_LOG_H
#define FERRY_LOG_H

#include "ferry/export.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  FERRY_LOG_ERROR = 0,
  FERRY_LOG_WARN = 1,
  FERRY_LOG_INFO = 2,
  FERRY_LOG_DEBUG = 3
} ferry_log_level_t;

typedef void (*ferry_log_cb)(int level, const char *msg, void *userdata);

/* Installs the callback (NULL: discard everything). Not thread-safe with
 * concurrent logging: call it at start-up. */
FERRY_API void ferry_log_set_callback(ferry_log_cb cb, void *userdata);

/* Messages above `level` (a ferry_log_level_t) are dropped before they are
 * formatted. Default FERRY_LOG_INFO. */
FERRY_API void ferry_log_set_level(int level);

/* Parses "error", "warn", "info" or "debug"; returns the level or -1. */
FERRY_API int ferry_log_level_parse(const char *name);

/* A ready callback: "2026-11-29T10:00:00.123Z INFO msg" lines on stderr. */
FERRY_API void ferry_log_to_stderr(int level, const char *msg, void *userdata);

#ifdef __cplusplus
}
#endif

/* FERRY_LOG and the logger behind it: in-tree code only, where the build
 * defines FERRY_INTERNAL_HEADERS. */
#ifdef FERRY_INTERNAL_HEADERS
#include "log_internal.h"
#endif

#endif /* FERRY_LOG_H */
