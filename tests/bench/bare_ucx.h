/* Bare UCX transfer for bare_transfer.c: bare_ucx.c when UCX is built,
 * bare_ucx_none.c otherwise (CMake picks one). */
#ifndef FERRY_BENCH_BARE_UCX_H
#define FERRY_BENCH_BARE_UCX_H

#include <stdbool.h>
#include <stdint.h>

/* Whether UCX was built in. */
bool ferry_bare_ucx_available(void);
/* UCX's version string, or "not built". */
const char *ferry_bare_ucx_version(void);
/* The sender: prints its worker address in hex and a newline on out_fd,
 * waits for the receiver's request, sends `count` active messages of
 * `msg_bytes` from `payload` with at most `window` in flight, then runs
 * until in_fd reaches EOF. Returns the exit status. */
int ferry_bare_ucx_serve(int out_fd, int in_fd, const uint8_t *payload,
                         uint64_t msg_bytes, uint64_t count, int window);
/* The receiver: connects to the sender at `addr_hex`, asks for the
 * messages and receives each into ring[i % nring]. Returns the payload
 * bytes received and the seconds it took in *secs. */
uint64_t ferry_bare_ucx_recv(const char *addr_hex, uint64_t msg_bytes,
                             uint64_t count, uint8_t **ring, int nring,
                             double *secs);

#endif
