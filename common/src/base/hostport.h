/* HOST:PORT addresses as users type them (ferryctl --dispatcher,
 * ferry-worker --dispatcher and --advertise, the client's `dispatcher`
 * option). One parser, so that every program refuses the same bad
 * addresses with the same words before gRPC sees them: gRPC takes a
 * missing port as port 0 and wraps a port past 65535 around, and answers
 * an empty target with its internals. */
#ifndef FERRY_HOSTPORT_H
#define FERRY_HOSTPORT_H

#include <stddef.h>

#include "ferry/error.h"

/* Longest host accepted (a DNS name is at most 253 characters). */
#define FERRY_HOST_MAX 255

/* ferry__hostport_parse flags. */
#define FERRY_HOSTPORT_PORT_OPTIONAL 1u /* "HOST" alone is fine: *port 0 */

/* Splits `s` into host and port: "HOST:PORT", "[V6]:PORT" (an IPv6
 * address needs the brackets), and "HOST" or "[V6]" alone with
 * FERRY_HOSTPORT_PORT_OPTIONAL. The host is stored without brackets into
 * `host` (`cap` bytes, at most FERRY_HOST_MAX + 1 needed; may be NULL);
 * the port (1..65535, or 0 when absent) into *port (may be NULL).
 * Returns 0, or FERRY_EINVAL with a message that says what is wrong and
 * what to write instead (it quotes `s`, at most 64 characters of it). */
int ferry__hostport_parse(const char *s, unsigned flags, char *host, size_t cap,
                          int *port, ferry_error_t *err);

#endif /* FERRY_HOSTPORT_H */
