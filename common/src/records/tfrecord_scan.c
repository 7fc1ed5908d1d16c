/* Finding whole, valid records in an uncompressed TFRecord file by
 * offset: the length CRC and the data CRC both checked. The dispatcher's
 * journal (a TFRecord file of entries) uses these to tell a torn tail
 * from damage that valid records follow. The streaming reader's own
 * resync (tfrecord.c) checks headers only, as TensorFlow's does. */
#include <errno.h>

#include "alloc.h"
#include "crc32c.h"
#include "tfrecord.h"

static uint32_t le32(const uint8_t *b) {
  return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 |
         (uint32_t)b[3] << 24;
}

/* ferry__tfr_valid_record_at with the header's bytes (hn of them, up to
 * 12) already read. */
static int valid_with_header(int fd, uint64_t off, uint64_t end,
                             const uint8_t *h, size_t hn, uint64_t *len_out) {
  uint8_t b[4096];
  uint64_t len, at;
  uint32_t crc = 0;

  if (hn < FERRY_TFR_HEADER_LEN || !ferry__tfr_header_check(h, &len))
    return 0;
  if (off > end || end - off < 16 || len > end - off - 16)
    return 0;
  for (at = off + 12; at < off + 12 + len;) {
    size_t want = (size_t)(off + 12 + len - at < sizeof(b)
                               ? off + 12 + len - at
                               : sizeof(b));
    if (ferry__pread_full(fd, b, want, at) != (int64_t)want)
      return -1;
    crc = ferry__crc32c(crc, b, want);
    at += want;
  }
  if (ferry__pread_full(fd, b, 4, at) != 4)
    return -1;
  if (ferry__crc32c_unmask(le32(b)) != crc)
    return 0;
  if (len_out != NULL)
    *len_out = len;
  return 1;
}

int ferry__tfr_valid_record_at(int fd, uint64_t off, uint64_t end,
                               uint64_t *len) {
  uint8_t h[FERRY_TFR_HEADER_LEN];
  int64_t n = ferry__pread_full(fd, h, sizeof(h), off);
  if (n < 0)
    return -1;
  return valid_with_header(fd, off, end, h, (size_t)n, len);
}

int64_t ferry__tfr_next_valid_record(int fd, uint64_t after, uint64_t end) {
  enum { WIN = 64 << 10 };
  uint8_t *w = ferry__malloc(WIN);
  uint64_t base = 0, off;
  size_t wlen = 0;
  int64_t found = (int64_t)end;

  if (w == NULL) {
    errno = ENOMEM;
    return -1;
  }
  /* The header CRC rejects almost every offset from 12 bytes already in
   * the window; only a header that verifies costs a read of its data. */
  for (off = after + 1; off < end; off++) {
    int v;
    if (off < base || off + 12 > base + wlen) {
      int64_t n = ferry__pread_full(fd, w, WIN, off);
      if (n < 0) {
        found = -1;
        break;
      }
      base = off;
      wlen = (size_t)n;
    }
    v = valid_with_header(fd, off, end, w + (off - base),
                          base + wlen - off < 12 ? base + wlen - off : 12,
                          NULL);
    if (v != 0) {
      found = v < 0 ? -1 : (int64_t)off;
      break;
    }
  }
  ferry__free(w);
  return found;
}
