/* Service-manager notification (systemd's sd_notify protocol, through
 * libsystemd): the daemons say READY=1 once their gRPC port accepts
 * connections, STOPPING=1 when a shutdown starts, and ping WATCHDOG=1
 * from their event loop while the manager asks for it (WatchdogSec=).
 * Without $NOTIFY_SOCKET (not started by systemd as Type=notify) every
 * call does nothing. In-tree only: the daemons link ferry-notify, which
 * libferry does not carry. */
#ifndef FERRY_NOTIFY_H
#define FERRY_NOTIFY_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

/* READY=1, STATUS=<fmt...> and MAINPID=<this pid>. Call it once, after the
 * listening socket is bound and listening. */
void ferry__notify_ready(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));

/* STATUS=<fmt...>: a line `systemctl status` shows. Thread-safe. */
void ferry__notify_status(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));

/* STOPPING=1 and STATUS=<fmt...>: call it first thing in a shutdown. */
void ferry__notify_stopping(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));

/* WATCHDOG=1 pings every half of the manager's watchdog interval
 * (sd_watchdog_enabled: $WATCHDOG_USEC, for this pid when $WATCHDOG_PID
 * is set), from a timer on `loop`: a loop that stops turning stops the
 * pings and the manager restarts the daemon. The timer is unreferenced,
 * so it never keeps uv_run going; after uv_run returns, call
 * ferry__notify_watchdog_stop and run the loop once more to close it. */
typedef struct ferry_notify_watchdog_s {
  uv_timer_t timer;
  uint64_t interval_ms; /* 0: no watchdog asked for */
  bool started;
} ferry_notify_watchdog_t;

/* Returns the ping interval in ms (0: the manager asked for none, nothing
 * started). */
uint64_t ferry__notify_watchdog_start(ferry_notify_watchdog_t *wd,
                                      uv_loop_t *loop);
void ferry__notify_watchdog_stop(ferry_notify_watchdog_t *wd);

#endif /* FERRY_NOTIFY_H */
