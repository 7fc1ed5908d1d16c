/* tf.io.decode_raw for uint8 images. */
#include "imgops.h"

#include <string.h>

int ferry__decode_raw(const uint8_t *src, size_t len, int h, int w, int c,
                      uint8_t *dst, ferry_error_t *err) {
  size_t want;
  if (h <= 0 || w <= 0 || c <= 0)
    return ferry__seterr(err, FERRY_EINVAL,
                         "decode_raw: invalid shape %dx%dx%d", h, w, c);
  want = (size_t)h * (size_t)w * (size_t)c;
  if (len != want)
    return ferry__seterr(err, FERRY_EIMGSIZE,
                         "decode_raw: expected %d*%d*%d = %zu bytes, got %zu",
                         h, w, c, want, len);
  if (want > 0)
    memcpy(dst, src, want);
  return 0;
}
