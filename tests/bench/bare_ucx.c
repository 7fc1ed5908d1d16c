/* A bare UCX transfer (UCP active messages) between two processes, for
 * bare_transfer.c. The receiver creates an endpoint to the sender's worker
 * address and sends a request (AM 1, with UCP_AM_SEND_FLAG_REPLY so the
 * sender answers on the reply endpoint); the sender sends `count` AM 2
 * messages, each an 8-byte header (the index) and the payload from
 * ucp_mem_map-ed memory, at most `window` in flight. Above the rendezvous
 * threshold the receiver's handler posts ucp_am_recv_data_nbx into its
 * ring buffer; below it copies the eager data there. Progress is polled
 * (busy), as a bare baseline should be. */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <ucp/api/ucp.h>

#include "bare_ucx.h"

#define AM_REQUEST 1
#define AM_DATA 2

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

bool ferry_bare_ucx_available(void) { return true; }

const char *ferry_bare_ucx_version(void) { return ucp_get_version_string(); }

static int ucx_open(ucp_context_h *ctx, ucp_worker_h *worker) {
  ucp_params_t p = {.field_mask = UCP_PARAM_FIELD_FEATURES,
                    .features = UCP_FEATURE_AM};
  ucs_status_t st = ucp_init(&p, NULL, ctx);
  if (st != UCS_OK) {
    fprintf(stderr, "bare_transfer: ucp_init: %s\n", ucs_status_string(st));
    return -1;
  }
  ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                            .thread_mode = UCS_THREAD_MODE_SINGLE};
  st = ucp_worker_create(*ctx, &wp, worker);
  if (st != UCS_OK) {
    fprintf(stderr, "bare_transfer: ucp_worker_create: %s\n",
            ucs_status_string(st));
    ucp_cleanup(*ctx);
    return -1;
  }
  return 0;
}

static void ep_close(ucp_worker_h worker, ucp_ep_h ep) {
  ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                           .flags = UCP_EP_CLOSE_FLAG_FORCE};
  void *req = ucp_ep_close_nbx(ep, &p);
  if (UCS_PTR_IS_PTR(req)) {
    double until = now_s() + 5;
    while (ucp_request_check_status(req) == UCS_INPROGRESS &&
           now_s() < until)
      ucp_worker_progress(worker);
    ucp_request_free(req);
  }
}

/* ---- The sender ---------------------------------------------------------- */

static struct {
  ucp_ep_h reply_ep;
  int inflight;
  uint64_t completed;
  bool failed;
} S;

static ucs_status_t on_request(void *arg, const void *header, size_t hlen,
                               void *data, size_t len,
                               const ucp_am_recv_param_t *param) {
  (void)arg, (void)header, (void)hlen, (void)data, (void)len;
  if (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)
    S.reply_ep = param->reply_ep;
  return UCS_OK;
}

static void on_sent(void *req, ucs_status_t st, void *user) {
  (void)user;
  S.inflight--;
  S.completed++;
  if (st != UCS_OK) {
    fprintf(stderr, "bare_transfer: UCX send: %s\n", ucs_status_string(st));
    S.failed = true;
  }
  ucp_request_free(req);
}

int ferry_bare_ucx_serve(int out_fd, int in_fd, const uint8_t *payload,
                         uint64_t msg_bytes, uint64_t count, int window) {
  ucp_context_h ctx;
  ucp_worker_h worker;
  if (ucx_open(&ctx, &worker) != 0)
    return 1;
  ucp_mem_map_params_t mp = {
      .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS |
                    UCP_MEM_MAP_PARAM_FIELD_LENGTH,
      .address = (void *)payload,
      .length = msg_bytes};
  ucp_mem_h memh = NULL;
  ucs_status_t st = ucp_mem_map(ctx, &mp, &memh);
  if (st != UCS_OK) {
    fprintf(stderr, "bare_transfer: ucp_mem_map: %s\n",
            ucs_status_string(st));
    memh = NULL;
  }
  ucp_am_handler_param_t hp = {
      .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID |
                    UCP_AM_HANDLER_PARAM_FIELD_CB,
      .id = AM_REQUEST,
      .cb = on_request};
  ucp_worker_set_am_recv_handler(worker, &hp);
  ucp_address_t *addr;
  size_t alen;
  if (ucp_worker_get_address(worker, &addr, &alen) != UCS_OK)
    return 1;
  char *hex = malloc(alen * 2 + 2);
  for (size_t i = 0; i < alen; i++)
    sprintf(hex + 2 * i, "%02x", ((const uint8_t *)addr)[i]);
  hex[2 * alen] = '\n';
  hex[2 * alen + 1] = '\0';
  if (write(out_fd, hex, 2 * alen + 1) != (ssize_t)(2 * alen + 1))
    return 1;
  close(out_fd);
  free(hex);
  ucp_worker_release_address(worker, addr);

  uint64_t sent = 0;
  struct pollfd pfd = {.fd = in_fd, .events = POLLIN};
  for (unsigned spin = 0;; spin++) {
    ucp_worker_progress(worker);
    while (S.reply_ep != NULL && !S.failed && sent < count &&
           S.inflight < window) {
      ucp_request_param_t p = {
          .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                          (memh != NULL ? UCP_OP_ATTR_FIELD_MEMH : 0),
          .cb.send = on_sent,
          .memh = memh};
      uint64_t idx = sent;
      void *req = ucp_am_send_nbx(S.reply_ep, AM_DATA, &idx, sizeof(idx),
                                  payload, msg_bytes, &p);
      sent++;
      if (UCS_PTR_IS_ERR(req)) {
        fprintf(stderr, "bare_transfer: ucp_am_send_nbx: %s\n",
                ucs_status_string(UCS_PTR_STATUS(req)));
        S.failed = true;
      } else if (req != NULL) {
        S.inflight++;
      } else {
        S.completed++;
      }
    }
    /* The receiver closes our stdin when it is done (or gone). */
    if ((spin & 1023) == 0 || S.completed == count || S.failed) {
      int timeout = S.completed == count || S.failed ? 1 : 0;
      if (poll(&pfd, 1, timeout) == 1)
        break;
    }
  }
  if (S.reply_ep != NULL)
    ep_close(worker, S.reply_ep);
  if (memh != NULL)
    ucp_mem_unmap(ctx, memh);
  ucp_worker_destroy(worker);
  ucp_cleanup(ctx);
  return S.failed ? 1 : 0;
}

/* ---- The receiver -------------------------------------------------------- */

static struct {
  ucp_worker_h worker;
  uint8_t **ring;
  int nring;
  uint64_t msg_bytes, received, bytes;
  bool failed;
} R;

static void on_data_done(void *req, ucs_status_t st, size_t len, void *user) {
  (void)user;
  if (st == UCS_OK) {
    R.received++;
    R.bytes += len;
  } else {
    fprintf(stderr, "bare_transfer: UCX receive: %s\n",
            ucs_status_string(st));
    R.failed = true;
  }
  ucp_request_free(req);
}

static ucs_status_t on_data(void *arg, const void *header, size_t hlen,
                            void *data, size_t len,
                            const ucp_am_recv_param_t *param) {
  (void)arg;
  uint64_t idx = 0;
  if (hlen == sizeof(idx))
    memcpy(&idx, header, sizeof(idx));
  uint8_t *dst = R.ring[idx % (uint64_t)R.nring];
  if (len > R.msg_bytes) {
    R.failed = true;
    return UCS_ERR_MESSAGE_TRUNCATED;
  }
  if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK,
                             .cb.recv_am = on_data_done};
    void *req = ucp_am_recv_data_nbx(R.worker, data, dst, len, &p);
    if (UCS_PTR_IS_ERR(req)) {
      fprintf(stderr, "bare_transfer: ucp_am_recv_data_nbx: %s\n",
              ucs_status_string(UCS_PTR_STATUS(req)));
      R.failed = true;
    } else if (req == NULL) {
      R.received++;
      R.bytes += len;
    }
    return UCS_OK;
  }
  memcpy(dst, data, len);
  R.received++;
  R.bytes += len;
  return UCS_OK;
}

static void on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t st) {
  (void)arg, (void)ep;
  fprintf(stderr, "bare_transfer: UCX endpoint: %s\n", ucs_status_string(st));
  R.failed = true;
}

static size_t unhex(const char *s, uint8_t *out, size_t max) {
  size_t n = 0;
  while (s[0] != '\0' && s[1] != '\0' && n < max) {
    unsigned v;
    if (sscanf(s, "%2x", &v) != 1)
      break;
    out[n++] = (uint8_t)v;
    s += 2;
  }
  return n;
}

uint64_t ferry_bare_ucx_recv(const char *addr_hex, uint64_t msg_bytes,
                             uint64_t count, uint8_t **ring, int nring,
                             double *secs) {
  ucp_context_h ctx;
  *secs = 0;
  memset(&R, 0, sizeof(R));
  if (ucx_open(&ctx, &R.worker) != 0)
    return 0;
  R.ring = ring;
  R.nring = nring;
  R.msg_bytes = msg_bytes;
  ucp_am_handler_param_t hp = {
      .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID |
                    UCP_AM_HANDLER_PARAM_FIELD_CB,
      .id = AM_DATA,
      .cb = on_data};
  ucp_worker_set_am_recv_handler(R.worker, &hp);
  size_t alen = strlen(addr_hex) / 2;
  uint8_t *addr = malloc(alen + 1);
  unhex(addr_hex, addr, alen);
  double t0 = now_s();
  ucp_ep_params_t ep_params = {
      .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                    UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER,
      .address = (const ucp_address_t *)addr,
      .err_mode = getenv("FERRY_BENCH_UCX_PEER_ERRORS") != NULL
                      ? UCP_ERR_HANDLING_MODE_PEER
                      : UCP_ERR_HANDLING_MODE_NONE,
      .err_handler = {.cb = on_ep_error}};
  ucp_ep_h ep = NULL;
  ucs_status_t st = ucp_ep_create(R.worker, &ep_params, &ep);
  free(addr);
  if (st != UCS_OK) {
    fprintf(stderr, "bare_transfer: ucp_ep_create: %s\n",
            ucs_status_string(st));
    goto out;
  }
  ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                           .flags = UCP_AM_SEND_FLAG_REPLY};
  uint8_t one = 1;
  void *req = ucp_am_send_nbx(ep, AM_REQUEST, NULL, 0, &one, 1, &p);
  if (UCS_PTR_IS_ERR(req)) {
    fprintf(stderr, "bare_transfer: request: %s\n",
            ucs_status_string(UCS_PTR_STATUS(req)));
    goto out;
  }
  double until = now_s() + 60;
  unsigned spin = 0;
  while (R.received < count && !R.failed) {
    ucp_worker_progress(R.worker);
    if ((++spin & 4095) == 0 && now_s() > until) {
      fprintf(stderr, "bare_transfer: UCX: %llu of %llu messages in 60 s\n",
              (unsigned long long)R.received, (unsigned long long)count);
      break;
    }
  }
  *secs = now_s() - t0;
  if (req != NULL) {
    while (ucp_request_check_status(req) == UCS_INPROGRESS)
      ucp_worker_progress(R.worker);
    ucp_request_free(req);
  }
out:
  if (ep != NULL)
    ep_close(R.worker, ep);
  ucp_worker_destroy(R.worker);
  ucp_cleanup(ctx);
  return R.bytes;
}
