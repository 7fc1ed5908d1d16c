#include "ferry/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

const char *ferry_strerror(int code) {
  switch (code) {
  case 0:
    return "success";
#define XX(name, value, text)                                                 \
  case (value):                                                               \
    return text;
    FERRY_ERRNO_MAP(XX)
#undef XX
  default:
    return "unknown error";
  }
}

const char *ferry_err_name(int code) {
  switch (code) {
  case 0:
    return "OK";
#define XX(name, value, text)                                                 \
  case (value):                                                               \
    return #name;
    FERRY_ERRNO_MAP(XX)
#undef XX
  default:
    return "UNKNOWN";
  }
}

int ferry__err_from_errno(int errnum) {
  switch (errnum) {
  case ENOMEM: return FERRY_ENOMEM;
  case EINVAL: return FERRY_EINVAL;
  case ENOENT: return FERRY_ENOENT;
  case EACCES: return FERRY_EACCES;
  case EPERM: return FERRY_EACCES;
  case ERANGE: return FERRY_ERANGE;
  case ENOSPC: return FERRY_ENOSPC;
  case ETIMEDOUT: return FERRY_ETIMEDOUT;
  case ECANCELED: return FERRY_ECANCELED;
  /* Kept apart from EIO: a worker out of descriptors gives its split
   * back instead of failing the job (worker/run.c). */
  case EMFILE: return FERRY_EMFILE;
  case ENFILE: return FERRY_ENFILE;
  default: return FERRY_EIO;
  }
}

int ferry__seterr(ferry_error_t *err, int code, const char *fmt, ...) {
  if (err != NULL) {
    va_list ap;
    err->code = code;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
    va_end(ap);
  }
  return code;
}

int ferry__prefixerr(ferry_error_t *err, const char *fmt, ...) {
  char prefix[256];
  size_t plen, mlen, cap;
  va_list ap;
  int n;

  if (err == NULL)
    return 0;
  va_start(ap, fmt);
  n = vsnprintf(prefix, sizeof(prefix), fmt, ap);
  va_end(ap);
  plen = n < 0 ? 0 : (size_t)n < sizeof(prefix) ? (size_t)n : sizeof(prefix) - 1;
  /* The message moves right by "prefix: " and is cut at the end if need be. */
  cap = sizeof(err->msg) - 1;
  if (plen + 2 > cap)
    plen = cap - 2;
  mlen = strnlen(err->msg, cap);
  if (plen + 2 + mlen > cap)
    mlen = cap - plen - 2;
  memmove(err->msg + plen + 2, err->msg, mlen);
  memcpy(err->msg, prefix, plen);
  err->msg[plen] = ':';
  err->msg[plen + 1] = ' ';
  err->msg[plen + 2 + mlen] = '\0';
  return err->code;
}

void ferry_error_clear(ferry_error_t *err) {
  if (err != NULL) {
    err->code = 0;
    err->msg[0] = '\0';
  }
}
