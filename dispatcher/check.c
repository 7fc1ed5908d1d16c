/* Checks of request strings (check.h). */
#include "check.h"

#include <string.h>

/* Length of the valid UTF-8 sequence at s (1 to 4), or 0. */
static size_t utf8_char(const unsigned char *s) {
  if (s[0] < 0x80)
    return 1;
  if (s[0] >= 0xc2 && s[0] <= 0xdf)
    return (s[1] & 0xc0) == 0x80 ? 2 : 0;
  if (s[0] >= 0xe0 && s[0] <= 0xef) {
    if ((s[1] & 0xc0) != 0x80 || (s[2] & 0xc0) != 0x80 ||
        (s[0] == 0xe0 && s[1] < 0xa0) || (s[0] == 0xed && s[1] > 0x9f))
      return 0;
    return 3;
  }
  if (s[0] >= 0xf0 && s[0] <= 0xf4) {
    if ((s[1] & 0xc0) != 0x80 || (s[2] & 0xc0) != 0x80 ||
        (s[3] & 0xc0) != 0x80 || (s[0] == 0xf0 && s[1] < 0x90) ||
        (s[0] == 0xf4 && s[1] > 0x8f))
      return 0;
    return 4;
  }
  return 0;
}

bool ferry__disp_utf8_valid(const char *s) {
  for (const unsigned char *p = (const unsigned char *)s; *p != '\0';) {
    size_t n = utf8_char(p);
    if (n == 0)
      return false;
    p += n;
  }
  return true;
}

void ferry__disp_utf8_clean(const char *s, char *out, size_t cap) {
  size_t o = 0;
  for (const unsigned char *p = (const unsigned char *)s;
       *p != '\0' && o + 5 < cap;) {
    size_t n = utf8_char(p);
    if (n == 0) {
      out[o++] = '?';
      p++;
    } else {
      memcpy(out + o, p, n);
      o += n;
      p += n;
    }
  }
  out[o] = '\0';
}

int ferry__disp_check_str(const char *s, size_t max, bool utf8,
                          const char *what, ferry_error_t *err) {
  size_t n = s != NULL ? strnlen(s, max + 1) : 0;
  if (n > max)
    return ferry__seterr(err, FERRY_EINVAL, "%s is longer than %zu bytes", what,
                         max);
  if (utf8 && s != NULL && !ferry__disp_utf8_valid(s))
    return ferry__seterr(err, FERRY_EINVAL, "%s is not valid UTF-8", what);
  return 0;
}

int ferry__disp_check_len(const char *s, size_t max, const char *what,
                          ferry_error_t *err) {
  return ferry__disp_check_str(s, max, true, what, err);
}
