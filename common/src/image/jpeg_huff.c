/* The window path's entropy decoder (jpeg_huff.h): baseline Huffman
 * decoding (ITU T.81 F.2.2) of the restart intervals that hold a box of
 * MCUs, inside libjpeg's decompressor.
 *
 * The bit reader keeps the next bits left-aligned in a 64-bit word and
 * loads 8 bytes at once when none of them is FF (so none is stuffed);
 * the bytes of such a load past the whole ones counted are the stream's
 * own next bits, so the next load ORs the same bits over them. Past the
 * interval's data (its end, or an FF not followed by a stuffed 00) it
 * shifts in zeros and counts them: consuming one is an error here, where
 * libjpeg would warn and go on with zeros. */
#include "jpeg_huff.h"

#include <stdarg.h>
#include <string.h>

#include <jerror.h>

#define FB FERRY_HUFF_FAST_BITS

typedef struct {
  uint64_t acc;
  int bits, pad;
  const uint8_t *p, *end;
} br_t;

/* Byte by byte, unstuffing; by value, so that the caller's reader stays
 * in registers. */
static br_t __attribute__((noinline)) fill_slow(br_t r) {
  br_t *b = &r;
  while (b->bits <= 56) {
    unsigned c = 0;
    if (b->p < b->end) {
      c = b->p[0];
      if (c != 0xFF)
        b->p++;
      else if (b->end - b->p >= 2 && b->p[1] == 0x00)
        b->p += 2;
      else {
        b->end = b->p; /* fill bytes before the marker: the data ends */
        c = 0;
        b->pad += 8;
      }
    } else {
      b->pad += 8;
    }
    b->acc |= (uint64_t)c << (56 - b->bits);
    b->bits += 8;
  }
  return r;
}

/* At least 32 bits in acc afterwards: a code (16) and a value (15). */
static inline __attribute__((always_inline)) void fill(br_t *b) {
  if (b->end - b->p >= 8) {
    uint64_t w;
    memcpy(&w, b->p, 8);
    w = __builtin_bswap64(w);
    /* No byte of w is FF (no zero byte in ~w). */
    if ((((~w) - 0x0101010101010101ULL) & w & 0x8080808080808080ULL) == 0) {
      int n = (63 - b->bits) >> 3;
      b->acc |= w >> b->bits;
      b->p += n;
      b->bits += 8 * n;
      return;
    }
  }
  *b = fill_slow(*b);
}

static inline __attribute__((always_inline)) void consume(br_t *b, int n) {
  b->acc <<= n;
  b->bits -= n;
}

/* The n-bit value that follows a magnitude category n (1..15), sign
 * extended (F.2.2.1). */
static inline __attribute__((always_inline)) int value(br_t *b, int n) {
  int v = (int)(b->acc >> (64 - n));
  consume(b, n);
  return v < (1 << (n - 1)) ? v - (1 << n) + 1 : v;
}

static int symbol_slow(br_t *b, const ferry_huff_table_t *t) {
  uint32_t c = (uint32_t)(b->acc >> 48);
  int l = FB + 1;
  while (c >= t->maxcode[l])
    l++;
  if (l > 16)
    return -1;
  consume(b, l);
  return t->val[(int)(c >> (16 - l)) + t->delta[l]];
}

static inline __attribute__((always_inline)) int
symbol(br_t *b, const ferry_huff_table_t *t) {
  unsigned f = t->fast[b->acc >> (64 - FB)];
  if (f != 0) {
    consume(b, (int)(f >> 8));
    return (int)(f & 255);
  }
  return symbol_slow(b, t);
}

enum { BAD_CODE = 1, PAST_63 = 2 };

/* Zigzag order to natural order (jpeg_natural_order's first 64: a run
 * past the 64th coefficient is PAST_63 here, never stored). */
static const uint8_t natural[64] = {
    0,  1,  8,  16, 9,  2,  3,  10, 17, 24, 32, 25, 18, 11, 4,  5,
    12, 19, 26, 33, 40, 48, 41, 34, 27, 20, 13, 6,  7,  14, 21, 28,
    35, 42, 49, 56, 57, 50, 43, 36, 29, 22, 15, 23, 30, 37, 44, 51,
    58, 59, 52, 45, 38, 31, 39, 46, 53, 60, 61, 54, 47, 55, 62, 63};

/* One block (F.2.2): the DC difference onto *pred, then the ACs in
 * zigzag order, stored where libjpeg stores them (quantized, natural
 * order; the caller zeroed the block). */
static inline __attribute__((always_inline)) int
block(br_t *b, const ferry_huff_table_t *dc, const ferry_huff_table_t *ac,
      int *pred, JCOEF *blk) {
  int s;
  if (b->bits < 32)
    fill(b);
  if ((s = symbol(b, dc)) < 0)
    return BAD_CODE;
  if (s != 0)
    *pred += value(b, s);
  blk[0] = (JCOEF)*pred;
  for (int k = 1; k < 64; k++) {
    int f;
    if (b->bits < 32)
      fill(b);
    f = ac->fast_ac[b->acc >> (64 - FB)];
    if (f != 0) {
      k += (f >> 4) & 15;
      consume(b, f & 15);
      if (k > 63)
        return PAST_63;
      blk[natural[k]] = (JCOEF)(f >> 8);
      continue;
    }
    if ((s = symbol(b, ac)) < 0)
      return BAD_CODE;
    if ((s & 15) != 0) {
      k += s >> 4;
      if (k > 63)
        return PAST_63;
      blk[natural[k]] = (JCOEF)value(b, s & 15);
    } else if (s >> 4 == 15) {
      k += 15; /* sixteen zeros */
    } else {
      break; /* end of block */
    }
  }
  return 0;
}

static void fail(j_decompress_ptr ci, ferry_jpeg_huff_t *h, const char *fmt,
                 ...) __attribute__((format(printf, 3, 4)));
static void fail(j_decompress_ptr ci, ferry_jpeg_huff_t *h, const char *fmt,
                 ...) {
  va_list ap;
  int n = snprintf(h->why, sizeof(h->why), "restart interval %zu at byte %u: ",
                   h->interval, h->tiles->start[h->interval]);
  va_start(ap, fmt);
  if (n > 0 && (size_t)n < sizeof(h->why))
    vsnprintf(h->why + n, sizeof(h->why) - (size_t)n, fmt, ap);
  va_end(ap);
  ci->err->msg_code = JWRN_HUFF_BAD_CODE;
  (*ci->err->error_exit)((j_common_ptr)ci); /* longjmps */
}

static void begin(ferry_jpeg_huff_t *h, br_t *b, size_t i) {
  h->interval = i;
  h->left = h->layout->restart;
  memset(h->pred, 0, sizeof(h->pred));
  *b = (br_t){0, 0, 0, h->src + h->tiles->start[i],
              h->src + ferry__jpeg_tile_end(h->tiles, i)};
}

/* libjpeg's decode_mcu: called for every MCU in raster order (data NULL
 * when libjpeg skips rows and wants the bits passed over). */
static boolean decode_mcu(j_decompress_ptr ci, JBLOCKROW *data) {
  ferry_jpeg_huff_t *h = ci->client_data;
  const ferry_jpeg_layout_t *l = h->layout;
  int row, col, rc = 0;
  br_t b;
  /* A single component's iMCU row is v_samp_factor rows of MCUs. */
  if ((int)ci->input_iMCU_row != h->irow) {
    h->irow = (int)ci->input_iMCU_row;
    h->row = h->irow * h->rows_per_irow;
    h->col = 0;
    h->left = 0;
  } else if (h->col == l->mcus_x) {
    h->row++;
    h->col = 0;
    h->left = 0;
  }
  row = h->row;
  col = h->col++;
  if (row < h->my0 || row >= h->my1 || col < h->mx0 || col >= h->mx1)
    return TRUE; /* outside the box: left zero, not read */
  b = (br_t){h->acc, h->bits, h->pad, h->p, h->end};
  if (col % l->restart == 0)
    begin(h, &b, (size_t)row * (size_t)(l->mcus_x / l->restart) +
                     (size_t)(col / l->restart));
  else if (h->left == 0)
    fail(ci, h, "MCU %d of row %d asked for outside a begun interval", col,
         row);
  for (int n = 0; n < h->blocks && rc == 0; n++)
    rc = block(&b, h->dc_of[n], h->ac_of[n], &h->pred[h->comp_of[n]],
               data != NULL ? data[n][0] : h->scratch[n]);
  h->acc = b.acc;
  h->bits = b.bits;
  h->pad = b.pad;
  h->p = b.p;
  h->end = b.end;
  if (rc == BAD_CODE)
    fail(ci, h, "no Huffman code matches the bits in MCU %d of row %d", col,
         row);
  if (rc == PAST_63)
    fail(ci, h, "a run goes past the 64th coefficient in MCU %d of row %d",
         col, row);
  if (b.bits < b.pad)
    fail(ci, h, "the data ends inside MCU %d of row %d", col, row);
  h->mcus++;
  if (--h->left == 0) {
    size_t extra = (size_t)(b.bits - b.pad) / 8 + (size_t)(b.end - b.p);
    if (extra != 0)
      fail(ci, h, "%zu bytes after its last MCU", extra);
  }
  return TRUE;
}

/* The lookup tables of a DHT table (C.2), refusing what libjpeg refuses
 * (jpeg_make_d_derived_tbl): more than 256 symbols, a code length
 * overfull, a DC category over 15. */
static int table_build(ferry_huff_table_t *t, const JHUFF_TBL *ht, int dc) {
  uint32_t code = 0;
  int k = 0;
  memset(t->fast, 0, sizeof(t->fast));
  memset(t->fast_ac, 0, sizeof(t->fast_ac));
  for (int len = 1; len <= 16; len++) {
    int n = ht->bits[len];
    if (n > 256 - k)
      return -1;
    t->delta[len] = k - (int)code;
    for (int i = 0; i < n; i++, k++, code++) {
      int sym = ht->huffval[k];
      if (dc && sym > 15)
        return -1;
      if (len <= FB) {
        uint32_t first = code << (FB - len);
        for (uint32_t j = 0; j < (1u << (FB - len)); j++)
          t->fast[first + j] = (uint16_t)(len << 8 | sym);
      }
    }
    if (code >= (1u << len))
      return -1;
    t->maxcode[len] = code << (16 - len);
    code <<= 1;
  }
  t->maxcode[17] = UINT32_MAX;
  memcpy(t->val, ht->huffval, sizeof(t->val));
  if (dc)
    return 0;
  for (int i = 0; i < (1 << FB); i++) {
    int len = t->fast[i] >> 8, run = (t->fast[i] >> 4) & 15,
        s = t->fast[i] & 15, v;
    if (t->fast[i] == 0 || s == 0 || len + s > FB)
      continue;
    v = (i >> (FB - len - s)) & ((1 << s) - 1);
    if (v < (1 << (s - 1)))
      v -= (1 << s) - 1;
    if (v >= -128 && v <= 127)
      t->fast_ac[i] = (int16_t)(v * 256 + run * 16 + len + s);
  }
  return 0;
}

static int refuse(ferry_jpeg_huff_t *h, const char *what) {
  snprintf(h->why, sizeof(h->why), "the decompressor is not the tiles' (%s)",
           what);
  return -1;
}

int ferry__jpeg_huff_attach(ferry_jpeg_huff_t *h, j_decompress_ptr ci) {
  const ferry_jpeg_layout_t *l = h->layout;
  unsigned built = 0;
  h->why[0] = '\0';
  if (ci->entropy == NULL || ci->entropy->decode_mcu == NULL ||
      ci->progressive_mode || ci->arith_code || ci->buffered_image ||
      ci->inputctl->has_multiple_scans)
    return refuse(h, "not one sequential Huffman scan");
  if (ci->data_precision != 8)
    return refuse(h, "not 8-bit");
  if (ci->comps_in_scan != ci->num_components ||
      ci->restart_interval != (unsigned)l->restart ||
      ci->MCUs_per_row != (JDIMENSION)l->mcus_x ||
      ci->MCU_rows_in_scan != (JDIMENSION)l->mcus_y ||
      ci->blocks_in_MCU < 1 || ci->blocks_in_MCU > D_MAX_BLOCKS_IN_MCU)
    return refuse(h, "its MCUs");
  if (h->mx0 < 0 || h->mx0 % l->restart != 0 || h->mx1 <= h->mx0 ||
      h->mx1 > l->mcus_x || h->my0 < 0 || h->my1 <= h->my0 ||
      h->my1 > l->mcus_y ||
      h->tiles->n != (size_t)(l->mcus_x / l->restart) * (size_t)l->mcus_y)
    return refuse(h, "the box");
  for (int i = 0; i < ci->comps_in_scan; i++) {
    const jpeg_component_info *c = ci->cur_comp_info[i];
    int d = c->dc_tbl_no, a = c->ac_tbl_no;
    if (d < 0 || d >= NUM_HUFF_TBLS || a < 0 || a >= NUM_HUFF_TBLS ||
        ci->dc_huff_tbl_ptrs[d] == NULL || ci->ac_huff_tbl_ptrs[a] == NULL)
      return refuse(h, "a table missing");
    if (!(built & 1u << d) &&
        table_build(&h->dc[d], ci->dc_huff_tbl_ptrs[d], 1) != 0)
      return refuse(h, "a bad DC table");
    if (!(built & 16u << a) &&
        table_build(&h->ac[a], ci->ac_huff_tbl_ptrs[a], 0) != 0)
      return refuse(h, "a bad AC table");
    built |= 1u << d | 16u << a;
  }
  h->blocks = ci->blocks_in_MCU;
  for (int n = 0; n < h->blocks; n++) {
    int c = ci->MCU_membership[n];
    if (c < 0 || c >= ci->comps_in_scan)
      return refuse(h, "its MCUs");
    h->comp_of[n] = c;
    h->dc_of[n] = &h->dc[ci->cur_comp_info[c]->dc_tbl_no];
    h->ac_of[n] = &h->ac[ci->cur_comp_info[c]->ac_tbl_no];
  }
  h->rows_per_irow =
      ci->comps_in_scan > 1 ? 1 : ci->cur_comp_info[0]->v_samp_factor;
  if ((JDIMENSION)h->rows_per_irow * (ci->total_iMCU_rows - 1) >=
      ci->MCU_rows_in_scan)
    return refuse(h, "its MCU rows");
  h->irow = -1;
  h->row = h->col = h->left = 0;
  h->mcus = 0;
  h->interval = 0;
  ci->client_data = h;
  ci->entropy->decode_mcu = decode_mcu;
  return 0;
}
