/* JPEG restart intervals laid out for cropping: the lossless rewrite that
 * adds them (ferryctl records optimize) and where the tiles are for the
 * window path that uses them (the fused decode's entropy decoder,
 * jpeg_huff.h). The layout rule lives here and nowhere else.
 *
 * A baseline JPEG's entropy-coded data is one bit stream; a restart marker
 * (RSTn, FF D0..D7) every R MCUs ends one and resets the DC predictors, so
 * the decoder can be started at any interval. When R divides the number of
 * MCUs in a row, every MCU row is R-MCU tiles in a fixed grid: a crop
 * window's MCUs are decoded by entering each of its rows at the tile that
 * holds its first column, and nothing else of the image is read.
 *
 * The rewrite (ferry__jpeg_optimize) is jpegtran's: libjpeg reads the
 * DCT coefficients and writes them back unchanged, as one interleaved
 * baseline scan with optimal Huffman tables (which pays for the markers)
 * and the interval chosen by ferry__jpeg_restart_choose; then both files
 * are decoded and compared, and any difference keeps the original.
 */
#ifndef FERRY_JPEG_RESTART_H
#define FERRY_JPEG_RESTART_H

#include <stddef.h>
#include <stdint.h>

#include "ferry/error.h"
#include "imgops.h"

/* The restart interval (in MCUs) the rewrite gives an image with
 * `mcus_x` MCUs in a row of `mcu_w` pixels: the largest divisor of mcus_x
 * whose tile is at most FERRY_JPEG_TILE_PX wide (at least 1 MCU). A
 * narrower tile cuts closer to a crop but costs a marker, the byte
 * padding before it and a DC coded in full per tile. */
#define FERRY_JPEG_TILE_PX 32
int ferry__jpeg_restart_choose(int mcus_x, int mcu_w);

/* Why an image was copied unchanged instead of rewritten. */
typedef enum {
  FERRY_JOPT_REWRITTEN = 0, /* rewritten: *out holds the new image */
  FERRY_JOPT_ALREADY,       /* already laid out for cropping (by this rule
                               or another interval that tiles the rows) */
  FERRY_JOPT_UNREADABLE,    /* libjpeg cannot read it (corrupt, 12-bit,
                               lossless, hierarchical, truncated), or it
                               is over FERRY_JPEG_MAX_PIXELS */
  FERRY_JOPT_WARNINGS,      /* it decodes with warnings (damaged data):
                               what a damaged file decodes to is kept */
  FERRY_JOPT_TOO_SMALL,     /* one MCU row or column: nothing to skip */
  FERRY_JOPT_GROWS,         /* the rewrite is over FERRY_JOPT_MAX_GROWTH
                               larger than the original */
  FERRY_JOPT_DIFFERS,       /* the rewrite decodes to other pixels */
  FERRY_JOPT_NREASONS
} ferry_jopt_reason_t;

/* The largest growth of one image the rewrite accepts, in percent. */
#define FERRY_JOPT_MAX_GROWTH 10

/* A short name of each reason ("rewritten", "already", "unreadable",
 * "warnings", "too_small", "grows", "differs"), for reports and JSON. */
const char *ferry__jopt_reason_name(ferry_jopt_reason_t r);

typedef struct ferry_jopt_result_s {
  ferry_jopt_reason_t reason;
  int restart;      /* the interval written (REWRITTEN) or found (ALREADY) */
  int progressive;  /* the input had several scans (converted to one) */
  int arithmetic;   /* the input was arithmetic-coded (now Huffman) */
  char detail[160]; /* what libjpeg said, or the sizes, when not rewritten */
} ferry_jopt_result_t;

/* Rewrites the JPEG at src (len bytes) losslessly with restart intervals
 * for cropping. On FERRY_JOPT_REWRITTEN, *out (allocated with
 * ferry__malloc, *out_len bytes) holds the new image; otherwise *out is
 * NULL and res says why the original stays as it is. `j` decodes both
 * for the comparison (ferry__jpeg_decode: the coefficients are the same,
 * so any other DCT agrees too; unit/test_jpeg_restart checks ISLOW).
 * Returns 0 whenever res is filled in (a copied image is not an error),
 * FERRY_ENOMEM otherwise. */
int ferry__jpeg_optimize(ferry_jpeg_t *j, const uint8_t *src, size_t len,
                         uint8_t **out, size_t *out_len,
                         ferry_jopt_result_t *res, ferry_error_t *err);

/* ---- the tables an image uses ---------------------------------------- */

/* True for a frame header's marker: SOF0..SOF15 (FF C0..CF) but DHT
 * (C4), JPG (C8) and DAC (CC). */
static inline int ferry__jpeg_is_sof(unsigned m) {
  return m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC;
}

/* libjpeg keeps the quantization and Huffman tables of one image for the
 * next (abbreviated streams rely on it), and a decoder that has seen no
 * tables takes the standard Huffman ones (motion JPEG) or fails. So an
 * image that uses a table it does not define decodes with whatever the
 * decoder read before it, unless the decoder is fresh: the decoders are
 * renewed for such images (jpeg.c), and the window path leaves them to
 * the image's path. ferry__jpeg_tables_see takes each marker segment
 * (payload after the length) in file order. */
typedef struct {
  unsigned q, dc, ac; /* tables defined so far, a bit each */
  unsigned frame_q;   /* the quantization tables the frame's components
                         use */
  int missing;        /* a scan (or the frame) uses an undefined table */
} ferry_jpeg_tables_t;
void ferry__jpeg_tables_see(ferry_jpeg_tables_t *t, unsigned marker,
                            const uint8_t *p, size_t size);

/* ---- the window ----------------------------------------------------- */

/* Where an image's parts are, for decoding windows of it. */
typedef struct ferry_jpeg_layout_s {
  int width, height;  /* the image */
  int ncomp;          /* components (all in the one scan) */
  int mcu_w, mcu_h;   /* pixels of one MCU */
  int mcus_x, mcus_y; /* MCUs in a row, MCU rows */
  int restart;        /* MCUs per interval; divides mcus_x */
  size_t scan;        /* first byte of the entropy-coded data */
} ferry_jpeg_layout_t;

/* Reads the markers of src: 1 when the image has windows to decode (a
 * single baseline or extended-sequential Huffman scan holding every
 * component, a restart interval that divides the MCUs of a row), with
 * *l filled in; 0 when not, with the reason in why (naming the byte
 * offset where one applies). Reads only inside [src, src + len). */
int ferry__jpeg_layout(const uint8_t *src, size_t len, ferry_jpeg_layout_t *l,
                       char *why, size_t whylen);

/* The intervals' offsets of one image, found by one pass over its
 * entropy-coded data; reused from image to image. */
typedef struct ferry_jpeg_tiles_s {
  uint32_t *start; /* start[i]: first byte of interval i; start[n]: one
                      past the last interval's data (its EOI marker) */
  size_t n, cap;
} ferry_jpeg_tiles_t;
void ferry__jpeg_tiles_free(ferry_jpeg_tiles_t *t);

/* One past interval i's entropy-coded data (its marker not included). */
static inline size_t ferry__jpeg_tile_end(const ferry_jpeg_tiles_t *t,
                                          size_t i) {
  return i + 1 < t->n ? t->start[i + 1] - 2 : t->start[t->n];
}

/* Finds every interval of the scan: the markers must be RST0..RST7 in
 * sequence, their number ceil(MCUs / restart), and the scan must end at
 * EOI. -1 with why (the byte offset and what was there) when not, 0 when
 * they are. FERRY_ENOMEM is -2. */
int ferry__jpeg_tiles_find(const uint8_t *src, size_t len,
                           const ferry_jpeg_layout_t *l,
                           ferry_jpeg_tiles_t *t, char *why, size_t whylen);

#endif /* FERRY_JPEG_RESTART_H */
