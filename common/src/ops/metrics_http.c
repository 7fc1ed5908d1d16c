/* The daemons' metrics endpoint on libmicrohttpd (metrics.h):
 * /metrics, /healthz, /readyz on one internal polling thread. Only the
 * daemons link it (ferry-metrics-http in common/CMakeLists.txt), so
 * libferry and the Python package do not depend on libmicrohttpd. */
#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "alloc.h"
#include "metrics.h"

#define CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"
/* Scrapers keep one connection each and probes open one at a time, so an
 * address that holds more is not one of them. */
#define METRICS_PER_IP_CONNECTIONS 16
#define METRICS_CONNECTIONS 1024
#define METRICS_TIMEOUT_S 5

struct ferry_metrics_http_s {
  struct MHD_Daemon *mhd;
  ferry_metrics_t *registry;
  atomic_bool ready;
  /* Set while the server already answers: ready_arg first, then
   * ready_fn with release; requests load ready_fn with acquire. */
  bool (*ready_fn)(void *arg);
  void *ready_arg;
};

static enum MHD_Result reply(struct MHD_Connection *conn, unsigned status,
                             const char *text) {
  struct MHD_Response *resp = MHD_create_response_from_buffer(
      strlen(text), (void *)text, MHD_RESPMEM_PERSISTENT);
  if (resp == NULL)
    return MHD_NO;
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE,
                          "text/plain; charset=utf-8");
  if (status == MHD_HTTP_METHOD_NOT_ALLOWED)
    MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
  enum MHD_Result r = MHD_queue_response(conn, status, resp);
  MHD_destroy_response(resp);
  return r;
}

static void free_cb(void *p) { ferry__free(p); }

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn,
                                  const char *url, const char *method,
                                  const char *version,
                                  const char *upload_data,
                                  size_t *upload_data_size, void **con_cls) {
  ferry_metrics_http_t *h = cls;
  (void)version;
  (void)upload_data;
  (void)upload_data_size;
  (void)con_cls;
  if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 &&
      strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
    return reply(conn, MHD_HTTP_METHOD_NOT_ALLOWED,
                 "method not allowed: GET or HEAD only\n");
  if (strcmp(url, "/healthz") == 0)
    return reply(conn, MHD_HTTP_OK, "ok\n");
  if (strcmp(url, "/readyz") == 0) {
    bool (*ready_fn)(void *) = __atomic_load_n(&h->ready_fn, __ATOMIC_ACQUIRE);
    return atomic_load(&h->ready) ||
                   (ready_fn != NULL && ready_fn(h->ready_arg))
               ? reply(conn, MHD_HTTP_OK, "ready\n")
               : reply(conn, MHD_HTTP_SERVICE_UNAVAILABLE, "not ready\n");
  }
  if (strcmp(url, "/metrics") != 0)
    return reply(conn, MHD_HTTP_NOT_FOUND,
                 "not found: /metrics, /healthz and /readyz exist\n");
  size_t len = 0;
  char *text = ferry__metrics_render(h->registry, &len);
  if (text == NULL)
    return reply(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n");
  struct MHD_Response *resp =
      MHD_create_response_from_buffer_with_free_callback(len, text, free_cb);
  if (resp == NULL) {
    ferry__free(text);
    return MHD_NO;
  }
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, CONTENT_TYPE);
  enum MHD_Result r = MHD_queue_response(conn, MHD_HTTP_OK, resp);
  MHD_destroy_response(resp);
  return r;
}

/* Binds and listens ourselves, so that errors name the address and the
 * errno (MHD_start_daemon only returns NULL). */
static int listen_on(const char *host, int port, int *fd_out, bool *v6,
                     ferry_error_t *err) {
  struct addrinfo hints, *res = NULL;
  char service[16];
  memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  snprintf(service, sizeof(service), "%d", port);
  int gai = getaddrinfo(host, service, &hints, &res);
  if (gai != 0)
    return ferry__seterr(err, FERRY_EINVAL, "metrics host '%s': %s", host,
                         gai_strerror(gai));
  int fd = -1, e = 0;
  for (struct addrinfo *a = res; a != NULL && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      e = errno;
      continue;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 256) != 0) {
      e = errno;
      close(fd);
      fd = -1;
      continue;
    }
    *v6 = a->ai_family == AF_INET6;
  }
  freeaddrinfo(res);
  if (fd < 0)
    return ferry__seterr(err, FERRY_EIO, "metrics: cannot listen on %s:%d: %s",
                         host, port, strerror(e));
  *fd_out = fd;
  return 0;
}

int ferry__metrics_http_start(ferry_metrics_t *r, const char *host, int port,
                              ferry_metrics_http_t **out, int *bound_port,
                              ferry_error_t *err) {
  int fd = -1, rc;
  bool v6 = false;
  *out = NULL;
  if (r == NULL)
    return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
  if ((rc = listen_on(host, port, &fd, &v6, err)) != 0)
    return rc;
  struct sockaddr_storage ss;
  socklen_t sl = sizeof(ss);
  if (getsockname(fd, (struct sockaddr *)&ss, &sl) != 0) {
    rc = ferry__seterr(err, FERRY_EIO, "metrics: getsockname: %s",
                       strerror(errno));
    close(fd);
    return rc;
  }
  *bound_port = ntohs(ss.ss_family == AF_INET6
                          ? ((struct sockaddr_in6 *)&ss)->sin6_port
                          : ((struct sockaddr_in *)&ss)->sin_port);
  ferry_metrics_http_t *h = ferry__calloc(1, sizeof(*h));
  if (h == NULL) {
    close(fd);
    return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
  }
  h->registry = r;
  atomic_init(&h->ready, false);
  /* The kubelet probes /healthz and /readyz here, so a few slow clients
   * must not take every connection: with 64 connections and a 10 s idle
   * timeout, 300 connections dripping header bytes made 20 of 20 probes
   * fail. Each address now gets at most METRICS_PER_IP_CONNECTIONS, the
   * whole server METRICS_CONNECTIONS (epoll: select() would also refuse
   * any descriptor above 1023, which a busy worker reaches), and a
   * connection that sends nothing for METRICS_TIMEOUT_S is closed. */
  h->mhd = MHD_start_daemon(
      MHD_USE_AUTO_INTERNAL_THREAD | (v6 ? MHD_USE_IPv6 : 0), 0, NULL, NULL,
      on_request, h, MHD_OPTION_LISTEN_SOCKET, fd,
      MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)METRICS_TIMEOUT_S,
      MHD_OPTION_CONNECTION_LIMIT, (unsigned)METRICS_CONNECTIONS,
      MHD_OPTION_PER_IP_CONNECTION_LIMIT,
      (unsigned)METRICS_PER_IP_CONNECTIONS, MHD_OPTION_END);
  if (h->mhd == NULL) {
    close(fd);
    ferry__free(h);
    return ferry__seterr(err, FERRY_EIO,
                         "metrics: libmicrohttpd could not start on %s:%d",
                         host, *bound_port);
  }
  *out = h;
  return 0;
}

void ferry__metrics_http_set_ready(ferry_metrics_http_t *h, bool ready) {
  if (h != NULL)
    atomic_store(&h->ready, ready);
}

void ferry__metrics_http_set_ready_fn(ferry_metrics_http_t *h,
                                      bool (*fn)(void *arg), void *arg) {
  if (h == NULL)
    return;
  h->ready_arg = arg;
  __atomic_store_n(&h->ready_fn, fn, __ATOMIC_RELEASE);
}

void ferry__metrics_http_stop(ferry_metrics_http_t *h) {
  if (h == NULL)
    return;
  /* Closes the listening socket and joins the polling thread. */
  MHD_stop_daemon(h->mhd);
  ferry__free(h);
}
