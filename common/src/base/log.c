#include "ferry/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

int ferry__log_level = -1; /* nothing is formatted until a callback is set */
static int wanted_level = FERRY_LOG_INFO;
static ferry_log_cb log_cb;
static void *log_ud;

static const char *const level_names[] = {"error", "warn", "info", "debug"};

void ferry_log_set_callback(ferry_log_cb cb, void *userdata) {
  log_cb = cb;
  log_ud = userdata;
  ferry__log_level = cb != NULL ? wanted_level : -1;
}

void ferry_log_set_level(int level) {
  wanted_level = level;
  if (log_cb != NULL)
    ferry__log_level = level;
}

int ferry_log_level_parse(const char *name) {
  for (int i = 0; i < 4; i++)
    if (strcmp(name, level_names[i]) == 0)
      return i;
  return -1;
}

void ferry__log(int level, const char *fmt, ...) {
  char buf[1024];
  va_list ap;
  if (log_cb == NULL)
    return;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  log_cb(level, buf, log_ud);
}

void ferry_log_to_stderr(int level, const char *msg, void *userdata) {
  struct timespec ts;
  struct tm tm;
  char when[32];
  const char *name = level >= 0 && level < 4 ? level_names[level] : "?";
  (void)userdata;
  clock_gettime(CLOCK_REALTIME, &ts);
  gmtime_r(&ts.tv_sec, &tm);
  strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S", &tm);
  fprintf(stderr, "%s.%03ldZ %-5s %s\n", when, ts.tv_nsec / 1000000L, name,
          msg);
}
