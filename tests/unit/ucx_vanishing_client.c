/* A trainer that dies holding chunks, for test_transport_ucx: opens a
 * UCX stream to the test's server, takes one message without copying its
 * payload, so that the server's window of rendezvous payloads stays
 * unfetched on this side, prints "holding" and waits for its SIGKILL.
 *
 *   ucx_vanishing_client HOST:PORT UCX-ADDRESS-HEX SECRET JOB CLIENT */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rpc.h"
#include "transport.h"

static int unhex(const char *hex, uint8_t *out, size_t cap) {
  size_t n = strlen(hex);
  if (n % 2 != 0 || n / 2 > cap)
    return -1;
  for (size_t i = 0; i < n / 2; i++) {
    unsigned v;
    if (sscanf(hex + 2 * i, "%2x", &v) != 1)
      return -1;
    out[i] = (uint8_t)v;
  }
  return (int)(n / 2);
}

int main(int argc, char **argv) {
  static uint8_t addr[4096];
  int len;
  if (argc != 6 || (len = unhex(argv[2], addr, sizeof(addr))) <= 0 ||
      strlen(argv[3]) != FERRY_CLIENT_SECRET_BYTES) {
    fprintf(stderr, "usage: ucx_vanishing_client HOST:PORT UCX-ADDRESS-HEX "
            "SECRET(%d bytes) JOB CLIENT\n", FERRY_CLIENT_SECRET_BYTES);
    return 2;
  }
  ferry__rpc_init();
  ferry_transport_client_t *cl = NULL;
  ferry_transport_cstream_t *s = NULL;
  ferry_transport_client_config_t cfg = {.peer_timeout_ms = 5000};
  ferry_transport_peer_t peer = {argv[1], addr, (size_t)len};
  ferry_transport_open_t req = {.job_id = strtoull(argv[4], NULL, 10),
                                .client_id = strtoull(argv[5], NULL, 10),
                                .secret = (const uint8_t *)argv[3]};
  ferry_transport_msg_t m;
  ferry_error_t err = {0};
  if (ferry__transport_ucx.client_new(&cfg, &cl, &err) != 0 ||
      cl->ops->open(cl, &peer, &req, &s, &err) != 0 ||
      ferry__transport_next(s, &m, 10000, &err) != 0) {
    fprintf(stderr, "ucx_vanishing_client: %s\n", err.msg);
    return 1;
  }
  printf("holding\n");
  fflush(stdout);
  for (;;)
    pause();
}
