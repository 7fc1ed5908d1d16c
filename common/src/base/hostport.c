/* HOST:PORT parsing (hostport.h). */
#include "hostport.h"

#include <ctype.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#include "error_internal.h"

/* The user's text, cut to a length that keeps a message on one line. */
#define SHOWN "'%.64s%s'"
#define SHOW(s) (s), strlen(s) > 64 ? "..." : ""

static int shown_len(ptrdiff_t n) { return n > 64 ? 64 : (int)n; }

/* Host names, IPv4 addresses and (inside brackets) IPv6 addresses use
 * only these characters; anything else (spaces, '/', a scheme's "://")
 * is a typo gRPC would turn into a confusing resolver error. */
static bool host_chars_ok(const char *h, size_t n, bool v6) {
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)h[i];
    if (isalnum(c) || c == '-' || c == '.' || c == '_')
      continue;
    if (v6 && (c == ':' || c == '%'))
      continue;
    return false;
  }
  return true;
}

int ferry__hostport_parse(const char *s, unsigned flags, char *host, size_t cap,
                          int *port, ferry_error_t *err) {
  bool optional = (flags & FERRY_HOSTPORT_PORT_OPTIONAL) != 0;
  const char *want = optional ? "HOST or HOST:PORT" : "HOST:PORT";
  const char *h, *rest;
  size_t hn;
  bool v6 = false;

  if (port != NULL)
    *port = 0;
  if (host != NULL && cap > 0)
    host[0] = '\0';
  if (s == NULL || s[0] == '\0')
    return ferry__seterr(err, FERRY_EINVAL,
                         "empty address: give %s, e.g. 127.0.0.1:5050",
                         want);
  if (strstr(s, "://") != NULL)
    return ferry__seterr(err, FERRY_EINVAL,
                         "address " SHOWN ": give %s without a scheme or "
                         "path, e.g. 127.0.0.1:5050", SHOW(s), want);
  if (s[0] == '[') {
    const char *close = strchr(s, ']');
    if (close == NULL)
      return ferry__seterr(err, FERRY_EINVAL,
                           "address " SHOWN " has no closing ']': write an "
                           "IPv6 address as [ADDR]:PORT, e.g. [::1]:5050",
                           SHOW(s));
    h = s + 1;
    hn = (size_t)(close - h);
    rest = close + 1;
    v6 = true;
    if (*rest != '\0' && *rest != ':')
      return ferry__seterr(err, FERRY_EINVAL,
                           "address " SHOWN ": expected ':PORT' after ']', "
                           "e.g. [::1]:5050", SHOW(s));
  } else {
    const char *colon = strchr(s, ':');
    if (colon != NULL && strchr(colon + 1, ':') != NULL)
      return ferry__seterr(err, FERRY_EINVAL,
                           "address " SHOWN " has more than one ':': write "
                           "an IPv6 address in brackets, e.g. [::1]:5050",
                           SHOW(s));
    h = s;
    hn = colon != NULL ? (size_t)(colon - s) : strlen(s);
    rest = s + hn;
  }
  if (hn == 0)
    return ferry__seterr(err, FERRY_EINVAL,
                         "address " SHOWN " has no host: give %s, e.g. "
                         "127.0.0.1:5050", SHOW(s), want);
  if (hn > FERRY_HOST_MAX || !host_chars_ok(h, hn, v6))
    return ferry__seterr(err, FERRY_EINVAL,
                         "address " SHOWN ": the host is not a host name or "
                         "IP address (give %s, e.g. 127.0.0.1:5050, without "
                         "a scheme or path)", SHOW(s), want);
  int p = 0;
  if (*rest == '\0') {
    if (!optional)
      return ferry__seterr(err, FERRY_EINVAL,
                           "address " SHOWN " has no port: give HOST:PORT, "
                           "e.g. %.*s:5050", SHOW(s), shown_len(rest - s), s);
  } else {
    const char *d = rest + 1; /* after the ':' */
    if (*d == '\0')
      return ferry__seterr(err, FERRY_EINVAL,
                           "address " SHOWN " has an empty port: give "
                           "HOST:PORT, e.g. %.*s:5050", SHOW(s),
                           shown_len(rest - s), s);
    long v = 0;
    for (const char *q = d; *q != '\0'; q++) {
      if (!isdigit((unsigned char)*q))
        return ferry__seterr(err, FERRY_EINVAL,
                             "address " SHOWN ": the port is not a number "
                             "from 1 to 65535", SHOW(s));
      if (v <= 65535)
        v = v * 10 + (*q - '0');
    }
    if (v < 1 || v > 65535)
      return ferry__seterr(err, FERRY_EINVAL,
                           "address " SHOWN ": port %s is out of range: give "
                           "a port from 1 to 65535", SHOW(s),
                           strlen(d) > 16 ? "(too long)" : d);
    p = (int)v;
  }
  if (host != NULL) {
    if (hn + 1 > cap)
      return ferry__seterr(err, FERRY_EINVAL,
                           "address " SHOWN ": the host is too long",
                           SHOW(s));
    memcpy(host, h, hn);
    host[hn] = '\0';
  }
  if (port != NULL)
    *port = p;
  return 0;
}
