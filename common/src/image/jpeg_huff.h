/* The window path's entropy decoder: Huffman-decodes only the MCUs of a
 * box of a JPEG laid out in restart-interval tiles (jpeg_restart.h), in
 * place of libjpeg's own, inside libjpeg's decompressor.
 *
 * libjpeg's single-scan decompressor asks its entropy module for every MCU
 * of the image in raster order (decode_mcu, jpegint.h), then runs the
 * inverse DCT, upsampling and colour conversion on the MCUs inside the
 * crop set by jpeg_crop_scanline. Attached after jpeg_start_decompress,
 * this decoder answers MCUs inside the box with their coefficients: at a
 * box row's first MCU it decodes the row's tiles (each restart interval
 * entered at its first byte with the DC predictors reset) into `coef`,
 * and hands the MCUs out from there. Every other MCU stays zero, and no
 * bit of it is read. So the decompressor's
 * pixels are libjpeg's own wherever the blocks they come from lie inside
 * the box, and the box is chosen (jpeg.c) so that every pixel the resampler
 * reads does.
 *
 * Why not libjpeg's decoder on a JPEG cut to the box: libjpeg-turbo 2.1
 * turns its fast Huffman path off for any scan with restart markers, and a
 * cut is whole tiles wide; this decoder runs one path, stops at the box's
 * last MCU column and copies none of the file.
 *
 * Anything a well-formed interval cannot hold (a code no table has, a run
 * past the 64th coefficient, an interval whose data ends before its MCUs
 * or goes on after them) stops the decode through libjpeg's error exit
 * with the reason in `why`: the caller then takes the image's own path,
 * which decides what the damage means. */
#ifndef FERRY_JPEG_HUFF_H
#define FERRY_JPEG_HUFF_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
/* jpeglib.h needs stdio.h (FILE) before it, jpegint.h (the decoder
 * modules' interfaces, installed by libjpeg-turbo's -dev package) needs
 * jpeglib.h. */
#include <jpeglib.h>
#include <jpegint.h>

#include "jpeg_restart.h"

/* The lookaheads of the fast tables, in bits: a code this short (nearly
 * all of a photo's) decodes with one lookup of `fast`, and an AC
 * coefficient whose code and value fit in FERRY_HUFF_AC_BITS decodes
 * whole with one lookup of `fast_ac` (12 bits: 16 KB a table; 10 and 11
 * send more coefficients down the slow path, a mispredicted branch). */
#define FERRY_HUFF_FAST_BITS 10
#define FERRY_HUFF_AC_BITS 12

typedef struct {
  uint16_t fast[1 << FERRY_HUFF_FAST_BITS]; /* symbol << 8 | length; 0:
                                               a longer code */
  int32_t fast_ac[1 << FERRY_HUFF_AC_BITS]; /* value << 16 | run << 8 |
                                                 length of code and value
                                                 (value 0: ZRL or EOB);
                                                 0: not decoded whole. The
                                                 length's byte is below 64:
                                                 the shift that consumes it
                                                 takes the entry as is */
  uint32_t maxcode[18]; /* codes of length l, left-aligned in 16 bits, are
                           below maxcode[l]; maxcode[17] ends the search */
  int32_t delta[17];    /* symbol index of a code of length l: its value
                           plus delta[l] */
  uint8_t val[256];
} ferry_huff_table_t;

typedef struct ferry_jpeg_huff_s {
  /* The tiles and the box, in MCUs: columns [mx0, mx1), rows [my0, my1);
   * mx0 a multiple of the restart interval. */
  const uint8_t *src;
  const ferry_jpeg_layout_t *layout;
  const ferry_jpeg_tiles_t *tiles;
  int mx0, mx1, my0, my1;

  /* The decoder's state (ferry__jpeg_huff_attach sets it up). */
  ferry_huff_table_t dc[NUM_HUFF_TBLS], ac[NUM_HUFF_TBLS];
  const ferry_huff_table_t *dc_of[D_MAX_BLOCKS_IN_MCU];
  const ferry_huff_table_t *ac_of[D_MAX_BLOCKS_IN_MCU];
  int comp_of[D_MAX_BLOCKS_IN_MCU];
  int blocks;              /* blocks in an MCU */
  int bmi2;                /* the CPU has BMI2 (jpeg_huff.c) */
  int irow, row, col;      /* the iMCU row, the MCU libjpeg asks for next */
  int rows_per_irow;       /* MCU rows in an iMCU row */
  JCOEF *coef;             /* the box's MCUs of row coef_row, decoded */
  size_t coef_cap;         /* bytes at coef */
  int coef_row;
  /* libjpeg's MCU block pointers (jdcoefct.c's MCU_buffer, passed to
   * decode_mcu) point into coef while a box MCU is handed out: `lent` is
   * that array (NULL: none), `own` its pointers as libjpeg set them. */
  JBLOCKROW *lent;
  JBLOCKROW own[D_MAX_BLOCKS_IN_MCU];
  char why[200];
} ferry_jpeg_huff_t;

/* Takes over the entropy decoding of `ci` (after jpeg_start_decompress,
 * before any scanline is read or skipped) for h's box. Returns 0, or -1
 * with h->why set when the decompressor is not the one the tiles describe
 * (its geometry, interval, precision or coding differ): then nothing is
 * changed. h and the data must outlive the decompression. */
int ferry__jpeg_huff_attach(ferry_jpeg_huff_t *h, j_decompress_ptr ci);

/* Frees what h holds (h itself is the caller's); h stays usable. */
void ferry__jpeg_huff_free(ferry_jpeg_huff_t *h);

#endif /* FERRY_JPEG_HUFF_H */
