/* Why a call found nobody to answer it (ferry__rpc_probe, rpc.h).
 *
 * gRPC reports a name that does not resolve as a deadline, and a TLS
 * server dialed in plaintext (or the reverse) as a closed socket: the
 * same words as a daemon that is down. The probe asks the system and
 * the port directly so that callers can say which it is. It never quotes
 * what the peer sent, only what kind of answer it was. */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "hostport.h"
#include "rpc.h"

/* The HTTP/2 client preface and an empty SETTINGS frame: a plaintext
 * HTTP/2 server answers with its own SETTINGS frame. */
static const char preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
                              "\x00\x00\x00\x04\x00\x00\x00\x00\x00";
#define PREFACE_LEN (sizeof(preface) - 1)

static int64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Connects a non-blocking socket to `ai` within `ms`. Returns the fd, -1
 * with errno (ETIMEDOUT when the time ran out). */
static int connect_within(const struct addrinfo *ai, int ms) {
  int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK |
                                     SOCK_CLOEXEC, ai->ai_protocol);
  if (fd < 0)
    return -1;
  if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0)
    return fd;
  if (errno != EINPROGRESS) {
    int e = errno;
    close(fd);
    errno = e;
    return -1;
  }
  struct pollfd p = {.fd = fd, .events = POLLOUT};
  int n = poll(&p, 1, ms);
  int soerr = 0;
  socklen_t sl = sizeof(soerr);
  if (n <= 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) != 0 ||
      soerr != 0) {
    close(fd);
    errno = n == 0 ? ETIMEDOUT : soerr != 0 ? soerr : EIO;
    return -1;
  }
  return fd;
}

/* Sends the preface and reads the first bytes of the answer within `ms`:
 * an HTTP/2 SETTINGS frame is plaintext gRPC; a TLS alert record (0x15),
 * or the connection closed or reset without a byte, is a TLS server
 * refusing a plaintext client hello. */
static ferry_rpc_probe_t classify(int fd, int ms) {
  uint8_t head[9];
  size_t got = 0;
  int64_t end = mono_ms() + ms;
  if (send(fd, preface, PREFACE_LEN, MSG_NOSIGNAL) != (ssize_t)PREFACE_LEN)
    return errno == ECONNRESET || errno == EPIPE ? FERRY_RPC_PROBE_TLS
                                                 : FERRY_RPC_PROBE_UNKNOWN;
  while (got < sizeof(head)) {
    int left = (int)(end - mono_ms());
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (left <= 0 || poll(&p, 1, left) <= 0)
      return got == 0 ? FERRY_RPC_PROBE_UNKNOWN : FERRY_RPC_PROBE_OTHER;
    ssize_t n = recv(fd, head + got, sizeof(head) - got, 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN))
      continue;
    if (n <= 0) {
      if (got == 0)
        return FERRY_RPC_PROBE_TLS;
      break;
    }
    if (got == 0 && head[0] == 0x15)
      return FERRY_RPC_PROBE_TLS;
    got += (size_t)n;
  }
  return got == sizeof(head) && head[3] == 0x04 ? FERRY_RPC_PROBE_PLAINTEXT
                                                : FERRY_RPC_PROBE_OTHER;
}

ferry_rpc_probe_t ferry__rpc_probe(const char *target, int timeout_ms,
                                   char *why, size_t cap) {
  char host[FERRY_HOST_MAX + 1], port_s[8];
  int port = 0;
  ferry_error_t err = {0};
  if (cap > 0)
    why[0] = '\0';
  if (ferry__hostport_parse(target, 0, host, sizeof(host), &port, &err) != 0) {
    snprintf(why, cap, "%s", err.msg);
    return FERRY_RPC_PROBE_BAD_ADDRESS;
  }
  snprintf(port_s, sizeof(port_s), "%d", port);
  struct addrinfo hints, *res = NULL;
  memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  int gai = getaddrinfo(host, port_s, &hints, &res);
  if (gai != 0) {
    snprintf(why, cap, "cannot resolve host '%s': %s", host,
             gai == EAI_SYSTEM ? strerror(errno) : gai_strerror(gai));
    return FERRY_RPC_PROBE_UNRESOLVED;
  }
  int64_t end = mono_ms() + timeout_ms;
  ferry_rpc_probe_t kind = FERRY_RPC_PROBE_UNKNOWN;
  int last = 0;
  for (const struct addrinfo *ai = res; ai != NULL; ai = ai->ai_next) {
    int left = (int)(end - mono_ms());
    if (left <= 0)
      break;
    int fd = connect_within(ai, left);
    if (fd < 0) {
      last = errno;
      continue;
    }
    left = (int)(end - mono_ms());
    kind = classify(fd, left > 0 ? left : 1);
    close(fd);
    break;
  }
  freeaddrinfo(res);
  switch (kind) {
  case FERRY_RPC_PROBE_UNKNOWN:
    if (last == ECONNREFUSED) {
      snprintf(why, cap, "nothing listens on %s (connection refused)",
               target);
      return FERRY_RPC_PROBE_REFUSED;
    }
    if (last == ETIMEDOUT) {
      snprintf(why, cap, "%s accepted no connection within %d ms", target,
               timeout_ms);
      return FERRY_RPC_PROBE_SILENT;
    }
    if (last != 0) {
      snprintf(why, cap, "cannot connect to %s: %s", target, strerror(last));
      return FERRY_RPC_PROBE_REFUSED;
    }
    snprintf(why, cap, "%s accepts connections but did not answer", target);
    break;
  case FERRY_RPC_PROBE_TLS:
    snprintf(why, cap, "%s closed a plaintext connection at once, as a TLS "
             "server does", target);
    break;
  case FERRY_RPC_PROBE_PLAINTEXT:
    snprintf(why, cap, "%s serves plaintext gRPC, not TLS", target);
    break;
  case FERRY_RPC_PROBE_OTHER:
    snprintf(why, cap, "%s accepts connections but does not speak gRPC "
             "(HTTP/2)", target);
    break;
  default:
    break;
  }
  return kind;
}
