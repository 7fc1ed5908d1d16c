/* sd_notify wrappers (notify.h). libsystemd does the protocol:
 * $NOTIFY_SOCKET (a path, or @abstract), one datagram per call, with the
 * sender's credentials the manager checks against NotifyAccess=. */
#include "notify.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "ferry/log.h"

/* One failure is worth a warning; the same one every 100 ms is not. */
static atomic_bool warned;

static void send_state(const char *what, const char *fmt, va_list ap) {
  char status[512], msg[700];
  const char *sock = getenv("NOTIFY_SOCKET");
  if (sock == NULL || sock[0] == '\0')
    return;
  status[0] = '\0';
  if (fmt != NULL)
    vsnprintf(status, sizeof(status), fmt, ap);
  /* A newline would start another assignment. */
  for (char *p = status; *p != '\0'; p++)
    if (*p == '\n')
      *p = ' ';
  snprintf(msg, sizeof(msg), "%s%sSTATUS=%s", what, what[0] ? "\n" : "",
           status);
  int rc = sd_notify(0, msg);
  if (rc < 0 && !atomic_exchange(&warned, true))
    FERRY_LOG(FERRY_LOG_WARN, "sd_notify to NOTIFY_SOCKET=%s failed: %s "
              "(the service manager does not hear from this daemon)",
              sock, strerror(-rc));
}

void ferry__notify_ready(const char *fmt, ...) {
  char what[64];
  va_list ap;
  snprintf(what, sizeof(what), "READY=1\nMAINPID=%ld", (long)getpid());
  va_start(ap, fmt);
  send_state(what, fmt, ap);
  va_end(ap);
}

void ferry__notify_status(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  send_state("", fmt, ap);
  va_end(ap);
}

void ferry__notify_stopping(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  send_state("STOPPING=1", fmt, ap);
  va_end(ap);
}

static void on_watchdog(uv_timer_t *t) {
  (void)t;
  int rc = sd_notify(0, "WATCHDOG=1");
  if (rc < 0 && !atomic_exchange(&warned, true))
    FERRY_LOG(FERRY_LOG_WARN, "sd_notify WATCHDOG=1 failed: %s",
              strerror(-rc));
}

uint64_t ferry__notify_watchdog_start(ferry_notify_watchdog_t *wd,
                                      uv_loop_t *loop) {
  uint64_t usec = 0;
  memset(wd, 0, sizeof(*wd));
  int rc = sd_watchdog_enabled(0, &usec);
  if (rc < 0) {
    FERRY_LOG(FERRY_LOG_WARN, "WATCHDOG_USEC/WATCHDOG_PID unreadable (%s): "
              "no watchdog pings", strerror(-rc));
    return 0;
  }
  if (rc == 0 || usec == 0)
    return 0;
  wd->interval_ms = usec / 2000 > 0 ? usec / 2000 : 1;
  if ((rc = uv_timer_init(loop, &wd->timer)) != 0) {
    FERRY_LOG(FERRY_LOG_WARN, "watchdog timer: %s: no watchdog pings",
              uv_strerror(rc));
    wd->interval_ms = 0;
    return 0;
  }
  wd->started = true;
  uv_unref((uv_handle_t *)&wd->timer);
  on_watchdog(&wd->timer);
  uv_timer_start(&wd->timer, on_watchdog, wd->interval_ms, wd->interval_ms);
  FERRY_LOG(FERRY_LOG_INFO, "watchdog: WATCHDOG=1 every %llu ms (half of "
            "WATCHDOG_USEC=%llu)", (unsigned long long)wd->interval_ms,
            (unsigned long long)usec);
  return wd->interval_ms;
}

static void on_closed(uv_handle_t *h) { (void)h; }

void ferry__notify_watchdog_stop(ferry_notify_watchdog_t *wd) {
  if (!wd->started)
    return;
  wd->started = false;
  uv_close((uv_handle_t *)&wd->timer, on_closed);
}
