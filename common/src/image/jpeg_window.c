/* Where the tiles of a JPEG laid out in restart-interval tiles
 * (jpeg_restart.h) are: the layout from the markers, the tiles from one
 * pass over the entropy-coded data. Everything reads only inside the data
 * it is given: these functions see the bytes of records from any file
 * (fuzz_jpeg_window covers them). */
#include "jpeg_restart.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "alloc.h"

static int why_set(char *why, size_t whylen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int why_set(char *why, size_t whylen, const char *fmt, ...) {
  va_list ap;
  if (why != NULL && whylen > 0) {
    va_start(ap, fmt);
    vsnprintf(why, whylen, fmt, ap);
    va_end(ap);
  }
  return 0;
}

void ferry__jpeg_tables_see(ferry_jpeg_tables_t *t, unsigned m,
                            const uint8_t *p, size_t size) {
  size_t at = 0;
  if (m == 0xDB) { /* DQT: (precision, table) and 64 or 128 bytes, again */
    while (at < size) {
      t->q |= 1u << (p[at] & 3);
      at += 1 + ((p[at] >> 4) ? 128 : 64);
    }
  } else if (m == 0xC4) { /* DHT: (class, table), 16 counts, symbols */
    while (at < size && size - at >= 17) {
      size_t n = 0;
      for (int i = 1; i <= 16; i++)
        n += p[at + (size_t)i];
      if (p[at] >> 4)
        t->ac |= 1u << (p[at] & 3);
      else
        t->dc |= 1u << (p[at] & 3);
      at += 17 + n;
    }
  } else if (ferry__jpeg_is_sof(m)) { /* each component's quantization
                                        table */
    for (size_t c = 0; size >= 6 && c < p[5] && 8 + 3 * c < size; c++)
      t->frame_q |= 1u << (p[8 + 3 * c] & 3);
  } else if (m == 0xDA && size >= 1) { /* a scan: its Huffman tables */
    for (size_t c = 0; c < p[0] && 2 + 2 * c < size; c++) {
      unsigned sel = p[2 + 2 * c];
      if (!(t->dc >> (sel >> 4 & 3) & 1) || !(t->ac >> (sel & 3) & 1))
        t->missing = 1;
    }
    if ((t->frame_q & ~t->q) != 0)
      t->missing = 1;
  }
}

int ferry__jpeg_restart_choose(int mcus_x, int mcu_w) {
  int best = 1;
  for (int r = 1; r <= mcus_x; r++)
    if (mcus_x % r == 0 && (long)r * mcu_w <= FERRY_JPEG_TILE_PX)
      best = r;
  return best;
}

static unsigned be16(const uint8_t *p) { return (unsigned)p[0] << 8 | p[1]; }

/* The frame header's payload (after the length): the geometry. 0 with why
 * when the frame is not one the window path takes. */
static int read_frame(const uint8_t *f, size_t size, size_t at,
                      ferry_jpeg_layout_t *l, char *why, size_t whylen) {
  int nc, hmax = 1, vmax = 1;
  if (size < 6)
    return why_set(why, whylen, "frame header at byte %zu is %zu bytes", at,
                   size);
  if (f[0] != 8)
    return why_set(why, whylen, "%d-bit samples", f[0]);
  l->height = (int)be16(f + 1);
  l->width = (int)be16(f + 3);
  nc = f[5];
  if (l->height == 0 || l->width == 0)
    return why_set(why, whylen, "image size %dx%d in the frame header",
                   l->width, l->height);
  if (nc < 1 || nc > 4 || size < 6 + 3 * (size_t)nc)
    return why_set(why, whylen, "%d components in a %zu-byte frame header",
                   nc, size);
  for (int c = 0; c < nc; c++) {
    int hs = f[6 + 3 * c + 1] >> 4, vs = f[6 + 3 * c + 1] & 15;
    if (hs < 1 || hs > 4 || vs < 1 || vs > 4)
      return why_set(why, whylen, "sampling factors %dx%d", hs, vs);
    hmax = hs > hmax ? hs : hmax;
    vmax = vs > vmax ? vs : vmax;
  }
  if (nc == 1)
    hmax = vmax = 1; /* a lone component's scan has one block an MCU */
  l->ncomp = nc;
  l->mcu_w = 8 * hmax;
  l->mcu_h = 8 * vmax;
  l->mcus_x = (l->width + l->mcu_w - 1) / l->mcu_w;
  l->mcus_y = (l->height + l->mcu_h - 1) / l->mcu_h;
  return nc;
}

int ferry__jpeg_layout(const uint8_t *d, size_t n, ferry_jpeg_layout_t *l,
                       char *why, size_t whylen) {
  size_t pos = 2;
  int ncomp = 0;
  ferry_jpeg_tables_t tab = {0};
  memset(l, 0, sizeof(*l));
  if (why != NULL && whylen > 0)
    why[0] = '\0';
  if (n < 4 || d[0] != 0xFF || d[1] != 0xD8)
    return why_set(why, whylen, "no start-of-image marker");
  if (n > UINT32_MAX)
    return why_set(why, whylen, "%zu bytes", n);
  for (;;) {
    unsigned m;
    size_t len;
    if (n - pos < 4 || d[pos] != 0xFF)
      return why_set(why, whylen, "no marker at byte %zu", pos);
    while (pos < n && d[pos] == 0xFF)
      pos++;
    if (n - pos < 3)
      return why_set(why, whylen, "the data ends at byte %zu", pos);
    m = d[pos++];
    len = be16(d + pos);
    if (len < 2 || n - pos < len)
      return why_set(why, whylen,
                     "marker FF %02X at byte %zu: length %zu past the data",
                     m, pos - 2, len);
    ferry__jpeg_tables_see(&tab, m, d + pos + 2, len - 2);
    if (m == 0xC0 || m == 0xC1) {
      if (ncomp != 0)
        return why_set(why, whylen, "a second frame header at byte %zu",
                       pos - 2);
      if ((ncomp = read_frame(d + pos + 2, len - 2, pos - 2, l, why,
                              whylen)) == 0)
        return 0;
    } else if ((ferry__jpeg_is_sof(m) && m >= 0xC2) || m == 0xDC) {
      return why_set(why, whylen, "%s (marker FF %02X at byte %zu)",
                     (m & 3) == 2 ? "progressive"
                     : m >= 0xC9 && m != 0xDC ? "arithmetic-coded"
                                              : "not baseline sequential",
                     m, pos - 2);
    } else if (m == 0xDD) {
      if (len != 4)
        return why_set(why, whylen, "restart interval at byte %zu is %zu "
                       "bytes", pos - 2, len);
      l->restart = (int)be16(d + pos + 2);
    } else if (m == 0xDA) {
      if (ncomp == 0)
        return why_set(why, whylen, "a scan at byte %zu before the frame "
                       "header", pos - 2);
      if (len < 3 || d[pos + 2] != ncomp)
        return why_set(why, whylen, "the scan at byte %zu holds %d of %d "
                       "components", pos - 2, len < 3 ? 0 : d[pos + 2],
                       ncomp);
      if (tab.missing)
        return why_set(why, whylen, "the scan at byte %zu uses a table "
                       "the file does not define", pos - 2);
      if (l->restart == 0)
        return why_set(why, whylen, "no restart interval");
      if (l->mcus_x % l->restart != 0)
        return why_set(why, whylen, "restart interval %d does not divide "
                       "the %d MCUs of a row", l->restart, l->mcus_x);
      l->scan = pos + len;
      return 1;
    } else if (m == 0xD9 || m == 0xD8 || (m >= 0xD0 && m <= 0xD7) ||
               m == 0x01) {
      return why_set(why, whylen, "marker FF %02X at byte %zu before the "
                     "scan", m, pos - 2);
    }
    pos += len;
  }
}

void ferry__jpeg_tiles_free(ferry_jpeg_tiles_t *t) {
  ferry__free(t->start);
  t->start = NULL;
  t->n = t->cap = 0;
}

/* The first FF at or after pos, or n: memchr inline (a scan has an FF
 * every 60 to 90 bytes, a marker or a stuffed byte, and memchr's call
 * cost more than its search there). */
static size_t next_ff(const uint8_t *d, size_t pos, size_t n) {
#ifdef __SSE2__
  const __m128i ff = _mm_set1_epi8((char)0xFF);
  for (; n - pos >= 16; pos += 16) {
    __m128i v = _mm_loadu_si128((const __m128i *)(const void *)(d + pos));
    unsigned m = (unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(v, ff));
    if (m != 0)
      return pos + (unsigned)__builtin_ctz(m);
  }
#endif
  while (pos < n && d[pos] != 0xFF)
    pos++;
  return pos;
}

int ferry__jpeg_tiles_find(const uint8_t *d, size_t n,
                           const ferry_jpeg_layout_t *l,
                           ferry_jpeg_tiles_t *t, char *why, size_t whylen) {
  size_t want = (size_t)(l->mcus_x / l->restart) * (size_t)l->mcus_y;
  size_t pos = l->scan, i = 0;
  t->n = 0;
  if (want + 1 > t->cap) {
    uint32_t *p = ferry__malloc((want + 1) * sizeof(*p));
    if (p == NULL)
      return -2;
    ferry__free(t->start);
    t->start = p;
    t->cap = want + 1;
  }
  t->start[0] = (uint32_t)pos;
  for (;;) {
    size_t at = pos < n ? next_ff(d, pos, n) : n;
    unsigned m;
    if (at >= n) {
      why_set(why, whylen, "the scan ends at byte %zu without an "
              "end-of-image marker (truncated)", n);
      return -1;
    }
    pos = at + 1;
    while (pos < n && d[pos] == 0xFF)
      pos++; /* fill bytes before a marker */
    if (pos >= n) {
      why_set(why, whylen, "the scan ends at byte %zu inside a marker "
              "(truncated)", n);
      return -1;
    }
    m = d[pos++];
    if (m == 0x00)
      continue; /* a stuffed FF */
    if (m >= 0xD0 && m <= 0xD7) {
      if (i + 1 >= want) {
        why_set(why, whylen, "restart marker at byte %zu after the %zu "
                "intervals of %d MCUs the image holds", pos - 2, want,
                l->restart);
        return -1;
      }
      if (m - 0xD0 != i % 8) {
        why_set(why, whylen, "restart marker RST%u at byte %zu where RST%zu "
                "belongs (after interval %zu)", m - 0xD0, pos - 2, i % 8, i);
        return -1;
      }
      t->start[++i] = (uint32_t)pos;
      continue;
    }
    if (m != 0xD9) {
      why_set(why, whylen, "marker FF %02X at byte %zu inside the scan (a "
              "second scan, or damaged data)", m, pos - 2);
      return -1;
    }
    if (i + 1 != want) {
      why_set(why, whylen, "%zu restart intervals end at byte %zu, the "
              "image holds %zu of %d MCUs", i + 1, pos - 2, want,
              l->restart);
      return -1;
    }
    t->start[want] = (uint32_t)(pos - 2);
    t->n = want;
    return 0;
  }
}
