/* The metrics HTTP server (metrics_http.c) under slow clients: the
 * kubelet probes /healthz and /readyz there (overlays/production), so a
 * few hosts that open connections and drip their headers must not make
 * the probes fail. Everything stays on loopback: the slow clients come
 * from 127.0.0.2 (another host, as far as per-address limits go), the
 * probes from 127.0.0.1. */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "metrics.h"

#define SLOW_CLIENTS 300
#define PROBES 20

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A non-blocking connection from `src` to 127.0.0.1:port; -1 on failure. */
static int dial(const char *src, int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -1;
  struct sockaddr_in a = {.sin_family = AF_INET};
  inet_pton(AF_INET, src, &a.sin_addr);
  if (bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
    close(fd);
    return -1;
  }
  a.sin_port = htons((uint16_t)port);
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0 &&
      errno != EINPROGRESS) {
    close(fd);
    return -1;
  }
  return fd;
}

/* Sends one byte of a never-ending header block; reopens a connection the
 * server closed (or refused), as an attacker would, to hold every slot it
 * can get. */
static void drip(int *fd, int port, bool first) {
  static const char start[] = "GET /metrics HTTP/1.1\r\nHost: x\r\n";
  char buf[512];
  if (*fd >= 0 && !first) {
    ssize_t n = recv(*fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) ||
        send(*fd, "x", 1, MSG_NOSIGNAL | MSG_DONTWAIT) < 0) {
      close(*fd);
      *fd = -1;
    }
    if (*fd >= 0)
      return;
  }
  if (*fd < 0 && (*fd = dial("127.0.0.2", port)) < 0)
    return;
  /* Connected or still connecting: either way the first bytes go once the
   * socket is writable; a failure shows at the next drip. */
  struct pollfd p = {*fd, POLLOUT, 0};
  if (poll(&p, 1, 0) == 1 && (p.revents & POLLOUT))
    (void)send(*fd, start, sizeof(start) - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
}

/* GET /healthz from 127.0.0.1: true when "200" came back within 1 s. */
static bool probe(int port) {
  int fd = dial("127.0.0.1", port);
  if (fd < 0)
    return false;
  double deadline = now_s() + 1.0;
  static const char req[] =
      "GET /healthz HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n";
  size_t sent = 0, got = 0;
  char buf[256];
  bool ok = false;
  while (!ok && now_s() < deadline) {
    struct pollfd p = {fd, sent < sizeof(req) - 1 ? POLLOUT : POLLIN, 0};
    int ms = (int)((deadline - now_s()) * 1000) + 1;
    if (poll(&p, 1, ms) <= 0)
      break;
    if (sent < sizeof(req) - 1) {
      ssize_t n = send(fd, req + sent, sizeof(req) - 1 - sent, MSG_NOSIGNAL);
      if (n <= 0)
        break;
      sent += (size_t)n;
      continue;
    }
    ssize_t n = recv(fd, buf + got, sizeof(buf) - 1 - got, 0);
    if (n <= 0)
      break;
    got += (size_t)n;
    buf[got] = '\0';
    ok = strstr(buf, "\r\n") != NULL && strncmp(buf, "HTTP/1.1 200", 12) == 0;
    if (got == sizeof(buf) - 1)
      break;
  }
  close(fd);
  return ok;
}

/* Issue: 300 slow header senders held all 64 of libmicrohttpd's
 * connections and /healthz failed 20 probes of 20. */
Test(metrics_http, slow_header_senders_do_not_starve_healthz,
     .timeout = 120) {
  struct rlimit rl;
  cr_assert_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
  if (rl.rlim_cur < SLOW_CLIENTS + 200) {
    rl.rlim_cur = rl.rlim_max < SLOW_CLIENTS + 200 ? rl.rlim_max
                                                    : SLOW_CLIENTS + 200;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  /* Loopback is 127.0.0.0/8 on Linux; elsewhere 127.0.0.2 may not exist. */
  int t = dial("127.0.0.2", 9);
  if (t < 0)
    cr_skip_test("cannot bind 127.0.0.2: %s", strerror(errno));
  close(t);

  ferry_metrics_t *reg = ferry__metrics_new();
  ferry_metrics_http_t *h = NULL;
  ferry_error_t err = {0};
  int port = 0;
  cr_assert_eq(ferry__metrics_http_start(reg, "127.0.0.1", 0, &h, &port, &err),
               0, "%s", err.msg);

  int slow[SLOW_CLIENTS];
  for (int i = 0; i < SLOW_CLIENTS; i++) {
    slow[i] = -1;
    drip(&slow[i], port, true);
  }
  /* Let the server take them all in before the first probe. */
  usleep(500 * 1000);
  int ok = 0;
  double start = now_s(), next_drip = start;
  for (int p = 0; p < PROBES; p++) {
    if (now_s() >= next_drip) {
      for (int i = 0; i < SLOW_CLIENTS; i++)
        drip(&slow[i], port, false);
      next_drip = now_s() + 1.0;
    }
    ok += probe(port);
    usleep(200 * 1000);
  }
  double took = now_s() - start;
  int open = 0;
  for (int i = 0; i < SLOW_CLIENTS; i++)
    if (slow[i] >= 0) {
      open++;
      close(slow[i]);
    }
  ferry__metrics_http_stop(h);
  ferry__metrics_free(reg);
  cr_log_info("%d of %d /healthz probes answered within 1 s under %d slow "
              "clients (%d sockets open at the end), %.1f s",
              ok, PROBES, SLOW_CLIENTS, open, took);
  cr_assert_geq(ok, PROBES - 1,
                "only %d of %d /healthz probes answered within 1 s while %d "
                "clients dripped their headers",
                ok, PROBES, SLOW_CLIENTS);
}
