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

#include "alloc.h"

#define FB FERRY_HUFF_FAST_BITS
#define FA FERRY_HUFF_AC_BITS

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
    /* The FF bytes of w (the zero bytes of ~w; a FE just before an FF
     * may be flagged too, which only takes fewer bytes). */
    uint64_t ff = ((~w) - 0x0101010101010101ULL) & w & 0x8080808080808080ULL;
    int n = (63 - b->bits) >> 3;
    if (ff == 0) {
      b->acc |= w >> b->bits;
      b->p += n;
      b->bits += 8 * n;
      return;
    }
    /* The bytes before the first FF, if they are enough: only those go
     * in (the FF may be followed by a stuffed 00). */
    int before = __builtin_clzll(ff) >> 3;
    n = n < before ? n : before;
    if (b->bits + 8 * n >= 32) {
      b->acc |= (w & ~(~0ULL >> (8 * n))) >> b->bits;
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
  /* Without a branch (a DC difference's sign is a coin toss): the top
   * bit set (a positive value) makes `pos` all ones. */
  int pos = (int)((int64_t)b->acc >> 63);
  int v = (int)(b->acc >> (64 - n));
  consume(b, n);
  return v + (~pos & (1 - (1 << n)));
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
    b->acc <<= f & 63; /* as in ac_step */
    b->bits -= (int)(f & 255);
    return (int)(f >> 8);
  }
  return symbol_slow(b, t);
}

enum { BAD_CODE = 1, PAST_63 = 2 };

/* Zigzag order to natural order: jpeg_natural_order's first 64, copied
 * because libjpeg's table is reached through the GOT at every store. A
 * block's position is a pointer into it; runs can take that pointer up
 * to 16 past the 64th entry (a run past the 64th coefficient: PAST_63,
 * never read), so the table goes on that far. */
static const uint8_t natural[64 + 16] = {
    0,  1,  8,  16, 9,  2,  3,  10, 17, 24, 32, 25, 18, 11, 4,  5,
    12, 19, 26, 33, 40, 48, 41, 34, 27, 20, 13, 6,  7,  14, 21, 28,
    35, 42, 49, 56, 57, 50, 43, 36, 29, 22, 15, 23, 30, 37, 44, 51,
    58, 59, 52, 45, 38, 31, 39, 46, 53, 60, 61, 54, 47, 55, 62, 63};
#define LAST (natural + 63)

/* A block's DC (F.2.2.1): the difference onto *pred, stored quantized as
 * libjpeg stores it. */
static inline __attribute__((always_inline)) int
dc_step(br_t *b, const ferry_huff_table_t *dc, int *pred, JCOEF *blk) {
  int s;
  if (b->bits < 32)
    fill(b);
  if ((s = symbol(b, dc)) < 0)
    return -BAD_CODE;
  if (s != 0)
    *pred += value(b, s);
  blk[0] = (JCOEF)*pred;
  return 0;
}

/* One AC symbol of a block (F.2.2.2) at zigzag position *zp (a pointer
 * into natural): 0 while the block goes on, 1 when it is done (end of
 * block, or the 64th coefficient), -BAD_CODE or -PAST_63. Stores in
 * natural order. A coefficient before the 64th, the common case, stores
 * and returns 0 after one test of the position. */
static inline __attribute__((always_inline)) int
ac_store(const uint8_t **zp, const uint8_t *z, JCOEF *blk, int v) {
  if (__builtin_expect(z >= LAST, 0)) {
    if (z > LAST)
      return -PAST_63;
    blk[63] = (JCOEF)v;
    return 1;
  }
  blk[*z] = (JCOEF)v;
  *zp = z + 1;
  return 0;
}

static inline __attribute__((always_inline)) int
ac_step(br_t *b, const ferry_huff_table_t *ac, const uint8_t **zp,
        JCOEF *blk) {
  int f, s;
  /* The lookup needs FA bits (the slow path, up to 31, fills again for
   * itself). Filling only when fewer than FA are left, not 32, halves
   * the fills and so the mispredictions of this branch (when a fill
   * falls due depends on the data). */
  if (b->bits < FA)
    fill(b);
  f = ac->fast_ac[b->acc >> (64 - FA)];
  if (f != 0) {
    /* x86's shifts count modulo 64: the mask costs nothing, and the
     * lookup feeds the shift directly (the chain from one symbol to the
     * next is the decoder's speed). */
    b->acc <<= f & 63;
    b->bits -= f & 255;
    if (f >> 16 == 0) { /* no value: sixteen zeros, or the end of block */
      if (f >> 8 != 15)
        return 1;
      *zp += 16;
      return *zp > LAST;
    }
    return ac_store(zp, *zp + ((f >> 8) & 255), blk, f >> 16);
  }
  if (b->bits < 32)
    fill(b);
  if ((s = symbol(b, ac)) < 0)
    return -BAD_CODE;
  if ((s & 15) != 0)
    return ac_store(zp, *zp + (s >> 4), blk, value(b, s & 15));
  if (s >> 4 == 15) { /* sixteen zeros */
    *zp += 16;
    return *zp > LAST;
  }
  return 1; /* end of block */
}

/* One stream: an interval being decoded. */
typedef struct {
  br_t b;
  int pred[MAX_COMPS_IN_SCAN];
  size_t interval;
  int err; /* -BAD_CODE, -PAST_63 or 0 */
} stream_t;

/* Block n of an MCU in one stream, or in two at once: the two bit
 * streams are independent, so each one's table lookups and shifts run
 * while the other's wait (Huffman decoding is one long chain of them).
 * The readers are the caller's locals, whose addresses go nowhere else:
 * they live in registers. */
static inline __attribute__((always_inline)) int
block1(const ferry_jpeg_huff_t *h, int n, br_t *b, stream_t *x, JCOEF *bx) {
  const uint8_t *k = natural + 1;
  int r;
  if ((r = dc_step(b, h->dc_of[n], &x->pred[h->comp_of[n]], bx)) < 0)
    return x->err = r;
  while ((r = ac_step(b, h->ac_of[n], &k, bx)) == 0)
    ;
  return x->err = r < 0 ? r : 0;
}

static inline __attribute__((always_inline)) int
block2(const ferry_jpeg_huff_t *h, int n, br_t *b, stream_t *x, JCOEF *bx,
       br_t *c, stream_t *y, JCOEF *by) {
  const ferry_huff_table_t *ac = h->ac_of[n];
  const uint8_t *kx = natural + 1, *ky = natural + 1;
  int rx, ry;
  if ((x->err = dc_step(b, h->dc_of[n], &x->pred[h->comp_of[n]], bx)) < 0 ||
      (y->err = dc_step(c, h->dc_of[n], &y->pred[h->comp_of[n]], by)) < 0)
    return -1;
  do {
    rx = ac_step(b, ac, &kx, bx);
    ry = ac_step(c, ac, &ky, by);
  } while ((rx | ry) == 0);
  while (rx == 0)
    rx = ac_step(b, ac, &kx, bx);
  while (ry == 0)
    ry = ac_step(c, ac, &ky, by);
  x->err = rx < 0 ? rx : 0;
  y->err = ry < 0 ? ry : 0;
  return x->err | y->err;
}

static void fail(j_decompress_ptr ci, ferry_jpeg_huff_t *h, size_t interval,
                 const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void fail(j_decompress_ptr ci, ferry_jpeg_huff_t *h, size_t interval,
                 const char *fmt, ...) {
  va_list ap;
  int n = snprintf(h->why, sizeof(h->why), "restart interval %zu at byte %u: ",
                   interval, h->tiles->start[interval]);
  va_start(ap, fmt);
  if (n > 0 && (size_t)n < sizeof(h->why))
    vsnprintf(h->why + n, sizeof(h->why) - (size_t)n, fmt, ap);
  va_end(ap);
  ci->err->msg_code = JWRN_HUFF_BAD_CODE;
  (*ci->err->error_exit)((j_common_ptr)ci); /* longjmps */
}

static void begin(const ferry_jpeg_huff_t *h, stream_t *x, size_t i) {
  x->interval = i;
  memset(x->pred, 0, sizeof(x->pred));
  x->b = (br_t){0, 0, 0, h->src + h->tiles->start[i],
                h->src + ferry__jpeg_tile_end(h->tiles, i)};
}

/* After a stream's MCUs: its data must not have run out; after an
 * interval's last MCU, nothing but the padding of its last byte may
 * follow. */
static void check(j_decompress_ptr ci, ferry_jpeg_huff_t *h,
                  const stream_t *x, int whole) {
  if (x->err == -BAD_CODE)
    fail(ci, h, x->interval, "no Huffman code matches the bits");
  if (x->err == -PAST_63)
    fail(ci, h, x->interval, "a run goes past the 64th coefficient");
  if (x->b.bits < x->b.pad)
    fail(ci, h, x->interval, "the data ends before its MCUs do");
  if (whole) {
    size_t extra =
        (size_t)(x->b.bits - x->b.pad) / 8 + (size_t)(x->b.end - x->b.p);
    if (extra != 0)
      fail(ci, h, x->interval, "%zu bytes after its last MCU", extra);
  }
}

/* Decodes MCU row `row` of the box into h->coef: its tiles two at a time
 * (the first half's with the second half's), a lone one alone. */
static inline __attribute__((always_inline)) void
decode_row_with(j_decompress_ptr ci, ferry_jpeg_huff_t *h, int row) {
  const int r = h->layout->restart, nb = h->blocks;
  const int t0 = h->mx0 / r, nt = (h->mx1 - h->mx0 + r - 1) / r;
  const int half = nt / 2;
  const size_t first = (size_t)row * (size_t)(h->layout->mcus_x / r);
  const size_t mcu = (size_t)nb * DCTSIZE2;
  stream_t x, y;
  memset(h->coef, 0, (size_t)(h->mx1 - h->mx0) * mcu * sizeof(JCOEF));
  for (int i = 0; i < nt - half; i++) {
    int tx = t0 + i, ty = t0 + i + (nt - half);
    int mx = (tx + 1) * r < h->mx1 ? r : h->mx1 - tx * r;
    int my = i < half ? ((ty + 1) * r < h->mx1 ? r : h->mx1 - ty * r) : 0;
    JCOEF *cx = h->coef + (size_t)(tx * r - h->mx0) * mcu;
    JCOEF *cy = h->coef + (size_t)(ty * r - h->mx0) * mcu;
    int j = 0, rc = 0;
    x.err = y.err = 0;
    begin(h, &x, first + (size_t)tx);
    if (my > 0)
      begin(h, &y, first + (size_t)ty);
    br_t bx = x.b, by = y.b;
    for (; j < my && j < mx && rc == 0; j++)
      for (int n = 0; n < nb && rc == 0; n++)
        rc = block2(h, n, &bx, &x, cx + (size_t)j * mcu + (size_t)n * DCTSIZE2,
                    &by, &y, cy + (size_t)j * mcu + (size_t)n * DCTSIZE2);
    for (int k = j; k < mx && rc == 0; k++)
      for (int n = 0; n < nb && rc == 0; n++)
        rc = block1(h, n, &bx, &x,
                    cx + (size_t)k * mcu + (size_t)n * DCTSIZE2);
    for (int k = j; k < my && rc == 0; k++)
      for (int n = 0; n < nb && rc == 0; n++)
        rc = block1(h, n, &by, &y,
                    cy + (size_t)k * mcu + (size_t)n * DCTSIZE2);
    x.b = bx;
    y.b = by;
    check(ci, h, &x, mx == r && rc == 0);
    if (my > 0)
      check(ci, h, &y, my == r && rc == 0);
  }
}

/* The same code twice: for any x86-64, and with BMI2's shifts by a
 * register count (shlx, shrx: one instruction each, any register), which
 * the bit reader does at every symbol. */
static void decode_row_base(j_decompress_ptr ci, ferry_jpeg_huff_t *h,
                            int row) {
  decode_row_with(ci, h, row);
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("bmi2"))) static void
decode_row_bmi2(j_decompress_ptr ci, ferry_jpeg_huff_t *h, int row) {
  decode_row_with(ci, h, row);
}
#endif

static void decode_row(j_decompress_ptr ci, ferry_jpeg_huff_t *h, int row) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (h->bmi2) {
    decode_row_bmi2(ci, h, row);
    return;
  }
#endif
  decode_row_base(ci, h, row);
}

/* Gives libjpeg's MCU block pointers back their own blocks. */
static void unlend(ferry_jpeg_huff_t *h) {
  if (h->lent != NULL)
    memcpy(h->lent, h->own, (size_t)h->blocks * sizeof(JBLOCKROW));
  h->lent = NULL;
}

/* libjpeg's decode_mcu: called for every MCU in raster order (data NULL
 * when libjpeg skips rows). The box's rows are decoded whole at their
 * first MCU, then handed out: not copied, but lent, by pointing libjpeg's
 * MCU block pointers at them. libjpeg's single-pass coefficient
 * controller (jdcoefct.c, decompress_onepass: the only caller here, the
 * attach refuses a buffered image) zeroes the blocks those pointers
 * name before each call, runs the IDCT on them right after, and reads
 * them nowhere else: a lent MCU is zeroed at the next call, when it is
 * spent; an MCU outside the box gets libjpeg's own blocks back, which
 * nothing writes since that zeroing (the first call of the image had
 * them). The pointer array dies with the image's pool (jpeg_abort,
 * jpeg_finish_decompress): nothing needs giving back after the last
 * MCU or an error. */
static boolean decode_mcu(j_decompress_ptr ci, JBLOCKROW *data) {
  ferry_jpeg_huff_t *h = ci->client_data;
  int row, col;
  /* A single component's iMCU row is v_samp_factor rows of MCUs. */
  if ((int)ci->input_iMCU_row != h->irow) {
    h->irow = (int)ci->input_iMCU_row;
    h->row = h->irow * h->rows_per_irow;
    h->col = 0;
  } else if (h->col == h->layout->mcus_x) {
    h->row++;
    h->col = 0;
  }
  row = h->row;
  col = h->col++;
  if (row < h->my0 || row >= h->my1 || col < h->mx0 || col >= h->mx1) {
    if (data != NULL && data == h->lent)
      unlend(h);
    return TRUE; /* outside the box: left zero, not read */
  }
  if (row != h->coef_row) {
    h->coef_row = -1;
    decode_row(ci, h, row);
    h->coef_row = row;
  }
  if (data != NULL) {
    JCOEF *c = h->coef + (size_t)(col - h->mx0) * (size_t)h->blocks *
                             DCTSIZE2;
    if (data != h->lent) {
      unlend(h);
      memcpy(h->own, data, (size_t)h->blocks * sizeof(JBLOCKROW));
      h->lent = data;
    }
    for (int n = 0; n < h->blocks; n++)
      data[n] = (JBLOCKROW)(void *)(c + (size_t)n * DCTSIZE2);
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
      int sym = ht->huffval[k], run = sym >> 4, s = sym & 15;
      if (code >= (1u << len) || (dc && sym > 15))
        return -1;
      if (len <= FB) {
        uint32_t first = code << (FB - len);
        for (uint32_t j = 0; j < (1u << (FB - len)); j++)
          t->fast[first + j] = (uint16_t)(sym << 8 | len);
      }
      if (dc || len + s > FA)
        continue;
      uint32_t first = code << (FA - len);
      if (s == 0) { /* ZRL (run 15) or the end of block (any other run) */
        for (uint32_t j = 0; j < (1u << (FA - len)); j++)
          t->fast_ac[first + j] = run << 8 | len;
        continue;
      }
      /* Every value the code's next s bits can hold, sign-extended. */
      for (int x = 0; x < (1 << s); x++) {
        int v = x < (1 << (s - 1)) ? x - (1 << s) + 1 : x;
        uint32_t at = first | (uint32_t)x << (FA - len - s);
        for (uint32_t j = 0; j < (1u << (FA - len - s)); j++)
          t->fast_ac[at + j] = (int32_t)((uint32_t)v << 16) | run << 8 |
                               (len + s);
      }
    }
    if (code >= (1u << len))
      return -1;
    t->maxcode[len] = code << (16 - len);
    code <<= 1;
  }
  t->maxcode[17] = UINT32_MAX;
  memcpy(t->val, ht->huffval, sizeof(t->val));
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
  size_t need;
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
  need = (size_t)(h->mx1 - h->mx0) * (size_t)h->blocks * sizeof(JBLOCK);
  if (need > h->coef_cap) {
    JCOEF *c = ferry__malloc(need);
    if (c == NULL)
      return refuse(h, "out of memory");
    ferry__free(h->coef);
    h->coef = c;
    h->coef_cap = need;
  }
#if defined(__x86_64__) && defined(__GNUC__)
  h->bmi2 = __builtin_cpu_supports("bmi2");
#endif
  h->irow = -1;
  h->row = h->col = 0;
  h->coef_row = -1;
  h->lent = NULL;
  ci->client_data = h;
  ci->entropy->decode_mcu = decode_mcu;
  return 0;
}

void ferry__jpeg_huff_free(ferry_jpeg_huff_t *h) {
  ferry__free(h->coef);
  h->coef = NULL;
  h->coef_cap = 0;
}
