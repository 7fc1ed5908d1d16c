/* bare_ucx.h without UCX: every transfer reports "not built". */
#include "bare_ucx.h"

bool ferry_bare_ucx_available(void) { return false; }

const char *ferry_bare_ucx_version(void) { return "not built"; }

int ferry_bare_ucx_serve(int out_fd, int in_fd, const uint8_t *payload,
                         uint64_t msg_bytes, uint64_t count, int window) {
  (void)out_fd, (void)in_fd, (void)payload, (void)msg_bytes, (void)count,
      (void)window;
  return 1;
}

uint64_t ferry_bare_ucx_recv(const char *addr_hex, uint64_t msg_bytes,
                             uint64_t count, uint8_t **ring, int nring,
                             double *secs) {
  (void)addr_hex, (void)msg_bytes, (void)count, (void)ring, (void)nring;
  *secs = 0;
  return 0;
}
