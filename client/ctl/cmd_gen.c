/* ferryctl gen: a deterministic synthetic image dataset.
 *
 * Every record is a tf.train.Example with "image" (raw HxWxC uint8 or a
 * JPEG), "label" and "id", written here by hand in protobuf wire format.
 * Each image is a function of (seed, id) alone: a splitmix64 stream keyed
 * by both draws a smooth four-corner gradient, a few flat shapes (the
 * first one's colour comes from the label, so the task is learnable) and
 * mild per-pixel noise. Same arguments, same bytes, on any machine. */
#include <endian.h>
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <turbojpeg.h>

#include "alloc.h"
#include "ctl.h"
#include "options.h"
#include "tfrecord.h"
#include "varint.h"

#define MAX_CHANNELS 16
#define MAX_IMAGE_BYTES (256ull << 20)
#define JPEG_MAX_DIM 65500

typedef struct gen_opts_s {
  char *out;
  int64_t shards;
  int64_t records;
  int format; /* "raw|jpeg" */
  char *size;
  int64_t channels;
  int64_t seed;
  int compression; /* "none|gzip|zlib" */
  int64_t classes;
  int64_t quality;
  int content; /* "shapes|photo" */
  char *prefix;
  bool help;
} gen_opts_t;

static const ferry_option_t gen_table[] = {
    {"out", FERRY_OPT_STRING, offsetof(gen_opts_t, out), NULL, 0, 0, NULL,
     "output directory (created if missing); required"},
    {"shards", FERRY_OPT_INT, offsetof(gen_opts_t, shards), "1", 1, 100000,
     NULL, "number of files; records are spread evenly over them"},
    {"records", FERRY_OPT_INT, offsetof(gen_opts_t, records), "1000", 0,
     1e12, NULL, "number of records in total"},
    {"format", FERRY_OPT_ENUM, offsetof(gen_opts_t, format), "raw", 0, 0,
     "raw|jpeg", "image encoding: raw HxWxC uint8 bytes, or a JPEG"},
    {"size", FERRY_OPT_STRING, offsetof(gen_opts_t, size), "32x32", 0, 0,
     NULL, "image height x width, e.g. 224x224, or imagenet: ImageNet's "
     "spread of sizes (mostly 375x500; JPEG only)"},
    {"channels", FERRY_OPT_INT, offsetof(gen_opts_t, channels), "3", 1,
     MAX_CHANNELS, NULL, "channels per pixel (jpeg: 1 or 3)"},
    {"seed", FERRY_OPT_INT, offsetof(gen_opts_t, seed), "0", 0, 0, NULL,
     "seed; the output is a function of all options"},
    {"compression", FERRY_OPT_ENUM, offsetof(gen_opts_t, compression),
     "none", 0, 0, "none|gzip|zlib", "file compression"},
    {"classes", FERRY_OPT_INT, offsetof(gen_opts_t, classes), "10", 1,
     2147483647.0, NULL, "labels are drawn from [0, classes)"},
    {"quality", FERRY_OPT_INT, offsetof(gen_opts_t, quality), "90", 1, 100,
     NULL, "JPEG quality (4:2:0 chroma subsampling)"},
    {"content", FERRY_OPT_ENUM, offsetof(gen_opts_t, content), "shapes", 0,
     0, "shapes|photo",
     "shapes: a gradient, flat shapes, noise; photo: a natural-looking "
     "scene (3 channels; about 0.5 bytes per pixel as a quality-90 JPEG)"},
    {"prefix", FERRY_OPT_STRING, offsetof(gen_opts_t, prefix), "train", 0, 0,
     NULL, "file name prefix"},
    {"help", FERRY_OPT_BOOL, offsetof(gen_opts_t, help), "false", 0, 0, NULL,
     "print this help"},
};
#define GEN_N (sizeof(gen_table) / sizeof(gen_table[0]))

static const char gen_usage[] =
    "usage: ferryctl gen --out DIR [options]\n"
    "\n"
    "Writes a deterministic synthetic image dataset: --records\n"
    "tf.train.Examples spread evenly over --shards files named\n"
    "DIR/PREFIX-00000-of-0000N.tfrecord (with a .gz suffix added for gzip\n"
    "and .zz for zlib). Each Example has the features \"image\" (bytes: raw\n"
    "HxWxC uint8, or a JPEG), \"label\" (int64 in [0, classes)) and \"id\"\n"
    "(int64, the record's global index, unique). Shard s holds the ids\n"
    "after those of shards 0..s-1, in order. The same options always\n"
    "produce the same bytes.\n";

/* The SplitMix64 output function. */
static inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static inline uint64_t next64(uint64_t *s) {
  *s += 0x9E3779B97F4A7C15ull;
  return mix64(*s);
}

/* A generator keyed by (seed, id, stream): independent of everything
 * generated before, so any record can be produced alone. */
static uint64_t rng_key(uint64_t seed, uint64_t id, uint64_t stream) {
  return mix64(mix64(seed ^ 0x6A09E667F3BCC909ull) ^ mix64(id) ^
               (stream * 0xD1B54A32D192ED03ull));
}

static inline uint8_t clamp_u8(int v) {
  return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
}

typedef struct image_spec_s {
  int h, w, c;
  uint64_t seed;
  uint64_t classes;
  /* Scratch of one row (w*c values each; noise rounded up to 8 bytes). */
  int16_t *top, *diff;
  uint8_t *noise;
} image_spec_t;

/* Fills `shape_color` with the label's colour: the same for every image of
 * a class, different between classes. */
static void class_color(const image_spec_t *sp, uint64_t label,
                        uint8_t *color) {
  uint64_t s = rng_key(sp->seed, label, 1);
  for (int c = 0; c < sp->c; c++)
    color[c] = (uint8_t)(40 + next64(&s) % 176);
}

/* The row loops below work in blocks of a constant BLOCK bytes through
 * restrict pointers: in that form the compiler vectorises them even at
 * -O2's cheap cost model. */
#define BLOCK 32

static inline void blend_block(uint8_t *restrict row,
                               const int16_t *restrict top,
                               const int16_t *restrict diff, int16_t ty,
                               size_t n) {
  /* top + floor(diff * ty / 128), in 16-bit lanes: diff * ty lies in
   * [-32640, 32640], so adding 255 * 128 makes it a uint16_t. */
  for (size_t i = 0; i < n; i++) {
    uint16_t q = (uint16_t)((int16_t)(diff[i] * ty) + 32640);
    row[i] = (uint8_t)(top[i] + (int16_t)(q >> 7) - 255);
  }
}

static inline void noise_block(uint8_t *restrict row,
                               const uint8_t *restrict noise, size_t n) {
  for (size_t i = 0; i < n; i++) {
    int16_t d = (int16_t)((int16_t)(noise[i] & 7) -
                          (int16_t)((noise[i] >> 3) & 7));
    int16_t v = (int16_t)(row[i] + d);
    row[i] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
  }
}

/* Fills `total` bytes at dst with copies of the `plen`-byte pattern,
 * doubling the filled part with each memcpy. */
static void fill_pattern(uint8_t *dst, const uint8_t *pat, size_t plen,
                         size_t total) {
  size_t n = plen < total ? plen : total;
  memcpy(dst, pat, n);
  while (n < total) {
    size_t k = n < total - n ? n : total - n;
    memcpy(dst + n, dst, k);
    n += k;
  }
}

/* The label of record `id`: the first draw of its stream. */
static uint64_t label_of(const image_spec_t *sp, uint64_t id) {
  uint64_t s = rng_key(sp->seed, id, 0);
  return next64(&s) % sp->classes;
}

/* Draws the image of record `id` into px (h*w*c bytes) and returns its
 * label. */
static uint64_t render(const image_spec_t *sp, uint64_t id, uint8_t *px) {
  const int h = sp->h, w = sp->w, nc = sp->c;
  uint64_t s = rng_key(sp->seed, id, 0);
  uint64_t label = next64(&s) % sp->classes; /* as label_of() */

  /* Background: bilinear blend of four random corner colours. The top
   * and bottom rows are laid out once, every row is their blend with a
   * 7-bit weight: one multiply-add per byte, in a loop that vectorises. */
  int16_t corner[4][MAX_CHANNELS];
  for (int k = 0; k < 4; k++)
    for (int c = 0; c < nc; c++)
      corner[k][c] = (int16_t)(next64(&s) & 0xFF);
  const size_t row_len = (size_t)w * (size_t)nc;
  int16_t *top = sp->top, *diff = sp->diff;
  for (int x = 0; x < w; x++) {
    int tx = w > 1 ? (int)(((int64_t)x << 8) / (w - 1)) : 0;
    for (int c = 0; c < nc; c++) {
      int t = (corner[0][c] * (256 - tx) + corner[1][c] * tx) >> 8;
      int b = (corner[2][c] * (256 - tx) + corner[3][c] * tx) >> 8;
      top[x * nc + c] = (int16_t)t;
      diff[x * nc + c] = (int16_t)(b - t);
    }
  }
  for (int y = 0; y < h; y++) {
    int16_t ty = (int16_t)(h > 1 ? ((int64_t)y << 7) / (h - 1) : 0);
    uint8_t *row = px + (size_t)y * row_len;
    size_t i = 0;
    for (; i + BLOCK <= row_len; i += BLOCK)
      blend_block(row + i, top + i, diff + i, ty, BLOCK);
    blend_block(row + i, top + i, diff + i, ty, row_len - i);
  }

  /* Shapes: the first is the class object, the others distractors. */
  int n_shapes = 1 + (int)(next64(&s) % 3);
  int dim = h < w ? h : w;
  for (int k = 0; k < n_shapes; k++) {
    uint8_t color[MAX_CHANNELS];
    if (k == 0) {
      class_color(sp, label, color);
    } else {
      for (int c = 0; c < nc; c++)
        color[c] = (uint8_t)(next64(&s) & 0xFF);
    }
    uint64_t r = next64(&s);
    int cy = (int)(r % (uint64_t)h);
    int cx = (int)((r >> 20) % (uint64_t)w);
    int rad = 1 + (int)((r >> 40) % (uint64_t)(dim / 3 + 1));
    bool circle = (r >> 62) & 1;
    for (int y = cy - rad; y <= cy + rad; y++) {
      if (y < 0 || y >= h)
        continue;
      int dy = y - cy;
      int half = circle ? (int)sqrt((double)((int64_t)rad * rad -
                                                (int64_t)dy * dy))
                         : rad;
      int x0 = cx - half < 0 ? 0 : cx - half;
      int x1 = cx + half >= w ? w - 1 : cx + half;
      /* Light from above: the shape darkens towards its bottom. */
      int shade = (dy * 24) / rad;
      uint8_t shaded[MAX_CHANNELS];
      for (int c = 0; c < nc; c++)
        shaded[c] = clamp_u8(color[c] - shade);
      uint8_t *row = px + (size_t)y * (size_t)w * (size_t)nc;
      if (x1 >= x0)
        fill_pattern(row + (size_t)x0 * (size_t)nc, shaded, (size_t)nc,
                     (size_t)(x1 - x0 + 1) * (size_t)nc);
    }
  }

  /* Noise in [-7, 7], triangular: each byte of a draw gives its low
   * three bits minus the next three. Drawn a row at a time into scratch,
   * then added in a loop that vectorises. */
  uint64_t ns = rng_key(sp->seed, id, 2);
  uint8_t *noise = sp->noise;
  for (int y = 0; y < h; y++) {
    for (size_t i = 0; i < row_len; i += 8) {
      uint64_t r = htole64(next64(&ns)); /* the same bytes on any host */
      memcpy(noise + i, &r, 8);
    }
    uint8_t *row = px + (size_t)y * row_len;
    size_t i = 0;
    for (; i + BLOCK <= row_len; i += BLOCK)
      noise_block(row + i, noise + i, BLOCK);
    noise_block(row + i, noise + i, row_len - i);
  }
  return label;
}

/* ---- photo-like content (--content photo) ------------------------------ */

/* ImageNet's geometry, as (height, width, share in percent): most images
 * are 500x375 landscape, then 500x333, portraits, squares, and a tail of
 * smaller and larger ones (mean about 400x350, like ImageNet's). */
static const struct {
  int h, w, percent;
} imagenet_sizes[] = {
    {375, 500, 40}, {333, 500, 14}, {500, 375, 12}, {500, 333, 6},
    {500, 500, 6},  {400, 500, 6},  {480, 640, 6},  {225, 300, 4},
    {300, 400, 3},  {600, 800, 2},  {768, 1024, 1},
};
#define N_IMAGENET_SIZES (sizeof(imagenet_sizes) / sizeof(imagenet_sizes[0]))
#define IMAGENET_MAX_H 768
#define IMAGENET_MAX_W 1024

/* The geometry of record `id` under --size imagenet. */
static void imagenet_size(uint64_t seed, uint64_t id, int *h, int *w) {
  uint64_t s = rng_key(seed, id, 3);
  int pick = (int)(next64(&s) % 100), acc = 0;
  for (size_t i = 0; i < N_IMAGENET_SIZES; i++) {
    acc += imagenet_sizes[i].percent;
    if (pick < acc) {
      *h = imagenet_sizes[i].h;
      *w = imagenet_sizes[i].w;
      return;
    }
  }
  *h = imagenet_sizes[0].h;
  *w = imagenet_sizes[0].w;
}

/* Octaves of value noise: cell sizes 2, 4, ..., 128 pixels. */
#define PHOTO_OCTAVES 7
/* The knobs that set the bytes per pixel at quality 90 (0.53 with these,
 * about 105 KB per image at ImageNet's sizes, as its photographs): leaves
 * per image, the largest texture and grain amplitudes (out of 256) and
 * the sensor noise. */
#define PHOTO_LEAVES_MIN 100
#define PHOTO_LEAVES_SPAN 100
#define PHOTO_TEXTURE 128
#define PHOTO_GRAIN 256
#define PHOTO_NOISE 5

/* One leaf of the scene: an ellipse or a box, its colour, shading ramp
 * (1/256ths per pixel) and texture amplitudes (out of 256). */
typedef struct leaf_s {
  int cy, cx, ry, rx, box;
  int col[3];
  int sx, sy;
  int oct, amp, grain;
} leaf_t;

/* Scratch of the photo renderer, sized for the largest image. */
typedef struct photo_scratch_s {
  leaf_t leaves[PHOTO_LEAVES_MIN + PHOTO_LEAVES_SPAN + 1];
  uint8_t *mask;                  /* h*w: covered by a leaf already */
  int *open;                      /* h: pixels of the row not covered */
  int16_t *acc;                   /* h*w*3 working pixels */
  int16_t *keep;                  /* 2 rows of w*3 (soften) */
  int16_t *field[PHOTO_OCTAVES];  /* h*w value noise per octave, +-256 */
  int32_t *top, *bot;             /* a lattice row interpolated along x */
} photo_scratch_t;

static void photo_scratch_free(photo_scratch_t *ps) {
  ferry__free(ps->mask);
  ferry__free(ps->open);
  ferry__free(ps->acc);
  ferry__free(ps->keep);
  for (int k = 0; k < PHOTO_OCTAVES; k++)
    ferry__free(ps->field[k]);
  ferry__free(ps->top);
  ferry__free(ps->bot);
  memset(ps, 0, sizeof(*ps));
}

static int photo_scratch_init(photo_scratch_t *ps, int max_h, int max_w) {
  size_t px = (size_t)max_h * (size_t)max_w;
  memset(ps, 0, sizeof(*ps));
  ps->mask = ferry__malloc(px);
  ps->open = ferry__malloc((size_t)max_h * sizeof(int));
  ps->acc = ferry__malloc(px * 3 * sizeof(int16_t));
  ps->keep = ferry__malloc((size_t)max_w * 6 * sizeof(int16_t));
  for (int k = 0; k < PHOTO_OCTAVES; k++)
    ps->field[k] = ferry__malloc(px * sizeof(int16_t));
  ps->top = ferry__malloc(((size_t)max_w + 1) * sizeof(int32_t));
  ps->bot = ferry__malloc(((size_t)max_w + 1) * sizeof(int32_t));
  bool ok = ps->mask && ps->open && ps->acc && ps->keep && ps->top && ps->bot;
  for (int k = 0; k < PHOTO_OCTAVES; k++)
    ok = ok && ps->field[k] != NULL;
  if (!ok) {
    photo_scratch_free(ps);
    return FERRY_ENOMEM;
  }
  return 0;
}

/* The lattice value at (ix, iy) of a noise keyed by `key`: in [-256, 256). */
static inline int32_t lattice(uint64_t key, int ix, int iy) {
  return (int32_t)(mix64(key ^ ((uint64_t)(uint32_t)iy << 32 |
                                (uint32_t)ix)) & 511) - 256;
}

/* One lattice row `iy` interpolated along x into row[0..w). */
static void lattice_row(uint64_t key, int iy, int shift, int w,
                        int32_t *row) {
  const int cell = 1 << shift;
  for (int x0 = 0, ix = 0; x0 < w; x0 += cell, ix++) {
    int32_t a = lattice(key, ix, iy), b = lattice(key, ix + 1, iy);
    int n = w - x0 < cell ? w - x0 : cell;
    for (int f = 0; f < n; f++)
      row[x0 + f] = a * (cell - f) + b * f; /* scaled by cell */
  }
}

/* Value noise of cell 2^shift over an h x w image into out (h*w values
 * in [-256, 256)): the lattice bilinearly interpolated. */
static void value_noise(photo_scratch_t *ps, uint64_t key, int shift, int h,
                        int w, int16_t *out) {
  const int cell = 1 << shift;
  for (int y0 = 0, iy = 0; y0 < h; y0 += cell, iy++) {
    lattice_row(key, iy, shift, w, ps->top);
    lattice_row(key, iy + 1, shift, w, ps->bot);
    int n = h - y0 < cell ? h - y0 : cell;
    for (int f = 0; f < n; f++) {
      int16_t *o = out + (size_t)(y0 + f) * (size_t)w;
      for (int x = 0; x < w; x++)
        o[x] = (int16_t)((ps->top[x] * (cell - f) + ps->bot[x] * f) >>
                         (2 * shift));
    }
  }
}

/* A [1 2 1] / 4 blur along both axes of acc (h x w x 3; the softness of
 * a lens: edges spread over two or three pixels), edges repeated. Row by
 * row, with the original rows kept in `keep` (2 x w*3 values). */
static void soften(int16_t *acc, int16_t *keep, int h, int w) {
  const size_t row = (size_t)w * 3;
  int16_t *orig = keep, *up = keep + row;
  for (int y = 0; y < h; y++) {
    int16_t *r = acc + (size_t)y * row;
    memcpy(orig, r, row * sizeof(*r));
    for (size_t i = 0; i < row; i++) {
      int l = i >= 3 ? orig[i - 3] : orig[i];
      int n = i + 3 < row ? orig[i + 3] : orig[i];
      r[i] = (int16_t)((l + 2 * orig[i] + n + 2) >> 2);
    }
  }
  memcpy(up, acc, row * sizeof(*acc));
  for (int y = 0; y < h; y++) {
    int16_t *r = acc + (size_t)y * row;
    const int16_t *next = y + 1 < h ? r + row : r;
    memcpy(orig, r, row * sizeof(*r));
    for (size_t i = 0; i < row; i++)
      r[i] = (int16_t)((up[i] + 2 * orig[i] + next[i] + 2) >> 2);
    int16_t *t = up;
    up = orig;
    orig = t;
  }
}

/* Draws a photo-like image of record `id` (h x w x 3) into px and returns
 * its label. A "dead leaves" scene, whose statistics are close to natural
 * images' (scale invariance, an amplitude spectrum near 1/f): a sky-like
 * gradient behind overlapping ellipses and boxes whose sizes follow
 * a power law, each with its colour, a shading ramp and a texture from
 * one octave of value noise; the object of the record's class comes last,
 * near the middle. Then illumination at every octave (amplitude
 * proportional to the cell size), a lens-like softening and mild sensor
 * noise. Integer arithmetic only: the same bytes on every machine. */
static uint64_t render_photo(const image_spec_t *sp, photo_scratch_t *ps,
                             uint64_t id, uint8_t *px) {
  const int h = sp->h, w = sp->w;
  const size_t npx = (size_t)h * (size_t)w;
  uint64_t s = rng_key(sp->seed, id, 0);
  uint64_t label = next64(&s) % sp->classes; /* as label_of() */
  uint64_t noise_key = rng_key(sp->seed, id, 4);
  for (int k = 0; k < PHOTO_OCTAVES; k++)
    value_noise(ps, noise_key + (uint64_t)k, k + 1, h, w, ps->field[k]);

  /* The scene is drawn front to back: a pixel takes the first leaf that
   * covers it (ps->mask), the background where none does. */
  int c0[3], c1[3];
  for (int c = 0; c < 3; c++) {
    c0[c] = (int)(next64(&s) & 0xFF);
    c1[c] = (int)(next64(&s) & 0xFF);
  }
  const int dim = h < w ? h : w;
  const int rmin = 3, rmax = dim / 2 > rmin ? dim / 2 : rmin + 1;
  int n_leaves = PHOTO_LEAVES_MIN + (int)(next64(&s) % PHOTO_LEAVES_SPAN);
  leaf_t *lv = ps->leaves;
  for (int k = 0; k <= n_leaves; k++) {
    leaf_t *l = &lv[k];
    bool object = k == n_leaves; /* the last drawn: in front */
    uint64_t r = next64(&s);
    /* Radius rmin + (rmax - rmin) u^3: many small leaves, few large. */
    int64_t u = (int64_t)(r & 1023);
    int rad = rmin + (int)((rmax - rmin) * u * u * u / (1024ll * 1024 * 1024));
    if (object) {
      rad = dim / 5 + (int)(r % (uint64_t)(dim / 6 + 1));
      l->cy = h / 2 + (int)((r >> 10) % (uint64_t)(h / 4 + 1)) - h / 8;
      l->cx = w / 2 + (int)((r >> 20) % (uint64_t)(w / 4 + 1)) - w / 8;
    } else {
      l->cy = (int)((r >> 10) % (uint64_t)h);
      l->cx = (int)((r >> 30) % (uint64_t)w);
    }
    if (rad < 1)
      rad = 1;
    /* Aspect in [1/2, 2]; shape: 0 ellipse, 1 box. */
    int asp = 8 + (int)((r >> 50) % 25); /* rx/ry in 16ths */
    l->ry = rad;
    l->rx = rad * asp / 16 < 1 ? 1 : rad * asp / 16;
    l->box = (int)((r >> 62) & 1);
    uint64_t q = next64(&s);
    if (object) {
      uint64_t cs = rng_key(sp->seed, label, 1);
      for (int c = 0; c < 3; c++)
        l->col[c] = 30 + (int)(next64(&cs) % 196);
    } else {
      int base = (int)(q & 0xFF);
      for (int c = 0; c < 3; c++)
        l->col[c] = base + (int)((q >> (8 + 8 * c)) & 0x7F) - 64;
    }
    /* Shading ramp: up to +-40 across the leaf, in a random direction,
     * in 1/256ths per pixel. */
    int gx = (int)((q >> 32) % 81) - 40, gy = (int)((q >> 40) % 81) - 40;
    l->sx = gx * 256 / (l->rx + 1);
    l->sy = gy * 256 / (l->ry + 1);
    /* Texture: a coarse octave (cells of 2 to 32 pixels) and the finest
     * grain, each with its amplitude (out of 256). */
    l->oct = (int)((q >> 48) % 5);
    l->amp = (int)((q >> 52) % (PHOTO_TEXTURE + 1));
    l->grain = (int)((4 + (q >> 60)) * PHOTO_GRAIN / 19);
  }
  uint8_t *mask = ps->mask;
  memset(mask, 0, npx);
  int *open = ps->open; /* per row: pixels no leaf covers yet */
  for (int y = 0; y < h; y++)
    open[y] = w;
  for (int k = n_leaves; k >= 0; k--) {
    const leaf_t *l = &lv[k];
    const int16_t *tex = ps->field[l->oct], *fine = ps->field[0];
    int y0 = l->cy - l->ry < 0 ? 0 : l->cy - l->ry;
    int y1 = l->cy + l->ry >= h ? h - 1 : l->cy + l->ry;
    for (int y = y0; y <= y1; y++) {
      if (open[y] == 0)
        continue;
      int dy = y - l->cy, half = l->rx;
      if (!l->box) {
        /* x extent of the ellipse at dy: rx * sqrt(1 - (dy/ry)^2). */
        int64_t t = (int64_t)l->ry * l->ry - (int64_t)dy * dy;
        int64_t v = t * l->rx * l->rx / ((int64_t)l->ry * l->ry);
        half = (int)sqrt((double)v); /* exact: v < 2^52 */
        while ((int64_t)half * half > v)
          half--;
        while ((int64_t)(half + 1) * (half + 1) <= v)
          half++;
      }
      int x0 = l->cx - half < 0 ? 0 : l->cx - half;
      int x1 = l->cx + half >= w ? w - 1 : l->cx + half;
      size_t o = (size_t)y * (size_t)w;
      int16_t *row = ps->acc + o * 3;
      int shade = l->sy * dy + l->sx * (x0 - l->cx);
      for (int x = x0; x <= x1; x++, shade += l->sx) {
        if (mask[o + (size_t)x])
          continue;
        mask[o + (size_t)x] = 1;
        open[y]--;
        int v = (shade + l->amp * tex[o + (size_t)x] +
                 l->grain * fine[o + (size_t)x]) >> 8;
        row[x * 3 + 0] = (int16_t)(l->col[0] + v);
        row[x * 3 + 1] = (int16_t)(l->col[1] + v);
        row[x * 3 + 2] = (int16_t)(l->col[2] + v);
      }
    }
  }
  /* The background behind them: a vertical two-colour gradient (sky to
   * ground). */
  for (int y = 0; y < h; y++) {
    size_t o = (size_t)y * (size_t)w;
    int16_t *row = ps->acc + o * 3;
    int16_t v[3];
    for (int c = 0; c < 3; c++)
      v[c] = (int16_t)(c0[c] + (c1[c] - c0[c]) * y / (h > 1 ? h - 1 : 1));
    for (int x = 0; x < w; x++)
      if (!mask[o + (size_t)x]) {
        row[x * 3 + 0] = v[0];
        row[x * 3 + 1] = v[1];
        row[x * 3 + 2] = v[2];
      }
  }

  /* Illumination at every octave, amplitude proportional to the cell:
   * the 1/f part of natural images' spectrum. */
  for (size_t i = 0; i < npx; i++) {
    int v = 0;
    for (int k = 0; k < PHOTO_OCTAVES; k++)
      v += ps->field[k][i] * (1 << k); /* cell 2^(k+1) */
    v >>= 8; /* +-64 at most, mostly from the coarse octaves */
    for (int c = 0; c < 3; c++)
      ps->acc[i * 3 + c] = (int16_t)(ps->acc[i * 3 + c] + v);
  }
  soften(ps->acc, ps->keep, h, w);

  /* Sensor noise, triangular in [-PHOTO_NOISE, PHOTO_NOISE], and the
   * clamp to uint8. */
  uint64_t ns = rng_key(sp->seed, id, 2), bits = 0;
  for (size_t i = 0; i < npx * 3; i++) {
    if ((i & 7) == 0)
      bits = next64(&ns);
    int d = (int)(((bits & 15) * (PHOTO_NOISE + 1)) >> 4) -
            (int)((((bits >> 4) & 15) * (PHOTO_NOISE + 1)) >> 4);
    bits >>= 8;
    px[i] = clamp_u8(ps->acc[i] + d);
  }
  return label;
}

/* ---- Example wire format ---------------------------------------------- */

/* Length of a length-delimited field (tag, length, body of `len`). */
static size_t ld_len(size_t len) { return 1 + ferry__varint_len(len) + len; }

/* Sizes of one map entry {key, Feature}: its body and the Feature's. */
static size_t entry_body(size_t key_len, size_t feature_body) {
  return ld_len(key_len) + ld_len(feature_body);
}

static size_t int64_feature_body(uint64_t v) {
  return ld_len(ld_len(ferry__varint_len(v))); /* Feature{int64_list{value}} */
}

static size_t bytes_feature_body(size_t len) {
  return ld_len(ld_len(len)); /* Feature{bytes_list{value}} */
}

static uint8_t *put_ld(uint8_t *p, uint8_t tag, size_t len) {
  *p++ = tag;
  return p + ferry__varint_put(p, len);
}

static uint8_t *put_int64_entry(uint8_t *p, const char *key, uint64_t v) {
  size_t kl = strlen(key), fb = int64_feature_body(v);
  p = put_ld(p, 0x0A, entry_body(kl, fb)); /* Features.feature */
  p = put_ld(p, 0x0A, kl);                 /* entry.key */
  memcpy(p, key, kl);
  p += kl;
  p = put_ld(p, 0x12, fb);                    /* entry.value */
  p = put_ld(p, 0x1A, ld_len(ferry__varint_len(v))); /* Feature.int64_list */
  p = put_ld(p, 0x0A, ferry__varint_len(v)); /* Int64List.value, packed */
  return p + ferry__varint_put(p, v);
}

/* Total size of the Example {image: bytes[img_len], label, id}. */
static size_t features_len(size_t img_len, uint64_t label, uint64_t id) {
  return ld_len(entry_body(5, bytes_feature_body(img_len))) +
         ld_len(entry_body(5, int64_feature_body(label))) +
         ld_len(entry_body(2, int64_feature_body(id)));
}

static size_t example_len(size_t img_len, uint64_t label, uint64_t id) {
  return ld_len(features_len(img_len, label, id));
}

/* Writes the Example into `buf` (example_len bytes) leaving the image
 * bytes out; returns the offset where they go. */
static size_t put_example(uint8_t *buf, size_t img_len, uint64_t label,
                          uint64_t id) {
  uint8_t *p = put_ld(buf, 0x0A, features_len(img_len, label, id));
  size_t fb = bytes_feature_body(img_len);
  p = put_ld(p, 0x0A, entry_body(5, fb));
  p = put_ld(p, 0x0A, 5);
  memcpy(p, "image", 5);
  p += 5;
  p = put_ld(p, 0x12, fb);
  p = put_ld(p, 0x0A, ld_len(img_len)); /* Feature.bytes_list */
  p = put_ld(p, 0x0A, img_len);         /* BytesList.value */
  size_t img_off = (size_t)(p - buf);
  p += img_len;
  p = put_int64_entry(p, "label", label);
  put_int64_entry(p, "id", id);
  return img_off;
}

/* ---- the command ------------------------------------------------------ */

static int parse_size(const char *s, int *h, int *w) {
  char *end;
  errno = 0;
  long a = strtol(s, &end, 10);
  if (errno || end == s || (*end != 'x' && *end != 'X'))
    return -1;
  const char *t = end + 1;
  long b = strtol(t, &end, 10);
  if (errno || end == t || *end != '\0' || a < 1 || b < 1 || a > 1 << 20 ||
      b > 1 << 20)
    return -1;
  *h = (int)a;
  *w = (int)b;
  return 0;
}

/* mkdir -p. Returns 0 or -1 with errno set. */
static int make_dirs(const char *path) {
  char *p = ferry__strdup(path);
  if (p == NULL) {
    errno = ENOMEM;
    return -1;
  }
  int rc = 0;
  for (char *q = p + 1;; q++) {
    if (*q == '/' || *q == '\0') {
      char c = *q;
      *q = '\0';
      if (mkdir(p, 0777) != 0 && errno != EEXIST) {
        rc = -1;
        break;
      }
      *q = c;
      if (c == '\0')
        break;
    }
  }
  ferry__free(p);
  struct stat st;
  if (rc == 0 && (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))) {
    errno = ENOTDIR;
    rc = -1;
  }
  return rc;
}

typedef struct gen_state_s {
  image_spec_t sp;
  bool jpeg;
  bool photo;    /* --content photo */
  bool imagenet; /* --size imagenet: each record's own geometry */
  photo_scratch_t ps;
  uint64_t pixel_count; /* pixels of the records written */
  uint64_t image_bytes; /* their encoded bytes (JPEG) */
  int quality;
  tjhandle tj;
  uint8_t *pixels;   /* jpeg: the image before encoding */
  uint8_t *jbuf;     /* jpeg: the encoded image */
  unsigned long jcap;
  uint8_t *rec;      /* the Example being written */
  size_t rec_cap;
} gen_state_t;

static int ensure(uint8_t **buf, size_t *cap, size_t need) {
  return ferry__grow(buf, cap, need, 1, 4096) ? 0 : FERRY_ENOMEM;
}

/* Builds record `id` into g->rec; sets *len. */
static int make_record(gen_state_t *g, uint64_t id, size_t *len,
                       ferry_error_t *err) {
  if (g->imagenet)
    imagenet_size(g->sp.seed, id, &g->sp.h, &g->sp.w);
  size_t img_len = (size_t)g->sp.h * (size_t)g->sp.w * (size_t)g->sp.c;
  g->pixel_count += (uint64_t)g->sp.h * (uint64_t)g->sp.w;
  if (!g->jpeg) {
    /* The layout depends on the label (its varint's size), so learn the
     * label first, then draw the image straight into the record. */
    uint64_t label = label_of(&g->sp, id);
    size_t n = example_len(img_len, label, id);
    if (ensure(&g->rec, &g->rec_cap, n) < 0)
      return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
    size_t off = put_example(g->rec, img_len, label, id);
    if (g->photo)
      render_photo(&g->sp, &g->ps, id, g->rec + off);
    else
      render(&g->sp, id, g->rec + off);
    *len = n;
    return 0;
  }
  uint64_t label = g->photo ? render_photo(&g->sp, &g->ps, id, g->pixels)
                            : render(&g->sp, id, g->pixels);
  unsigned long jsize = g->jcap;
  unsigned char *jb = g->jbuf;
  int pf = g->sp.c == 1 ? TJPF_GRAY : TJPF_RGB;
  int samp = g->sp.c == 1 ? TJSAMP_GRAY : TJSAMP_420;
  if (tjCompress2(g->tj, g->pixels, g->sp.w, 0, g->sp.h, pf, &jb, &jsize,
                  samp, g->quality, TJFLAG_NOREALLOC) != 0)
    return ferry__seterr(err, FERRY_EJPEG, "JPEG encoding of record %llu: "
                         "%s", (unsigned long long)id,
                         tjGetErrorStr2(g->tj));
  size_t n = example_len(jsize, label, id);
  if (ensure(&g->rec, &g->rec_cap, n) < 0)
    return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
  g->image_bytes += jsize;
  size_t off = put_example(g->rec, jsize, label, id);
  memcpy(g->rec + off, jb, jsize);
  *len = n;
  return 0;
}

static int write_shard(gen_state_t *g, const char *path,
                       ferry_compression_t comp, uint64_t first,
                       uint64_t count, ferryctl_progress_t *prog,
                       uint64_t *done, ferry_error_t *err) {
  ferry_tfr_writer_t *w = NULL;
  int rc = ferry__tfr_writer_open(path, comp, &w, err);
  if (rc < 0)
    return rc;
  for (uint64_t i = 0; i < count; i++) {
    size_t len = 0;
    rc = make_record(g, first + i, &len, err);
    if (rc < 0)
      break;
    rc = ferry__tfr_writer_write(w, g->rec, len, err);
    if (rc < 0)
      break;
    ++*done;
    if ((*done & 255) == 0)
      ferryctl_progress_update(prog, *done);
  }
  ferry_error_t cerr;
  ferry_error_clear(&cerr);
  int crc = ferry__tfr_writer_close(w, &cerr);
  if (rc == 0 && crc < 0) {
    if (err != NULL)
      *err = cerr;
    rc = crc;
  }
  return rc;
}

int ferryctl_gen(int argc, char **argv) {
  gen_opts_t o;
  memset(&o, 0, sizeof(o));
  int npos = 0;
  int status = ferryctl_parse_options("gen", gen_usage, NULL, gen_table,
                                      GEN_N, &o, offsetof(gen_opts_t, help),
                                      argc - 1, argv + 1, &npos);
  if (status != FERRYCTL_CONTINUE) {
    ferry__options_free(gen_table, GEN_N, &o);
    return status;
  }
  status = FERRYCTL_EXIT_USAGE;
  gen_state_t g;
  memset(&g, 0, sizeof(g));
  char *path = NULL;
  int h = 0, w = 0;
  if (npos > 0) {
    fprintf(stderr, "ferryctl gen: unexpected argument '%s'\n\n%s", argv[1],
            gen_usage);
    goto out;
  }
  if (o.out == NULL || o.out[0] == '\0') {
    fprintf(stderr, "ferryctl gen: --out DIR is required\n\n%s", gen_usage);
    goto out;
  }
  g.jpeg = o.format == 1;
  g.photo = o.content == 1;
  g.imagenet = o.size != NULL && strcmp(o.size, "imagenet") == 0;
  if (g.imagenet) {
    if (!g.jpeg) {
      fprintf(stderr, "ferryctl gen: --size imagenet needs --format jpeg "
              "(raw records of one dataset share one size)\n");
      goto out;
    }
    h = IMAGENET_MAX_H;
    w = IMAGENET_MAX_W;
  } else if (o.size == NULL || parse_size(o.size, &h, &w) < 0) {
    fprintf(stderr, "ferryctl gen: --size '%s': expected HxW with positive "
            "integers, e.g. 32x32, or imagenet\n", o.size ? o.size : "");
    goto out;
  }
  if (g.photo && o.channels != 3) {
    fprintf(stderr, "ferryctl gen: --content photo needs --channels 3, not "
            "%lld\n", (long long)o.channels);
    goto out;
  }
  if (g.jpeg && o.channels != 1 && o.channels != 3) {
    fprintf(stderr, "ferryctl gen: --format jpeg needs --channels 1 or 3, "
            "not %lld\n", (long long)o.channels);
    goto out;
  }
  if (g.jpeg && (h > JPEG_MAX_DIM || w > JPEG_MAX_DIM)) {
    fprintf(stderr, "ferryctl gen: --size %s: JPEG images are at most "
            "%dx%d\n", o.size, JPEG_MAX_DIM, JPEG_MAX_DIM);
    goto out;
  }
  uint64_t img_bytes = (uint64_t)h * (uint64_t)w * (uint64_t)o.channels;
  if (img_bytes > MAX_IMAGE_BYTES) {
    fprintf(stderr, "ferryctl gen: --size %s with %lld channels makes "
            "%llu-byte images; the limit is %llu\n", o.size,
            (long long)o.channels, (unsigned long long)img_bytes,
            MAX_IMAGE_BYTES);
    goto out;
  }
  if (o.prefix == NULL || o.prefix[0] == '\0' || strchr(o.prefix, '/')) {
    fprintf(stderr, "ferryctl gen: --prefix must be a non-empty file name "
            "without '/'\n");
    goto out;
  }
  if (make_dirs(o.out) != 0) {
    fprintf(stderr, "ferryctl gen: cannot create directory %s: %s\n", o.out,
            strerror(errno));
    goto out;
  }

  g.sp = (image_spec_t){.h = h, .w = w, .c = (int)o.channels,
                        .seed = (uint64_t)o.seed,
                        .classes = (uint64_t)o.classes};
  g.quality = (int)o.quality;
  size_t row_len = (size_t)w * (size_t)o.channels;
  g.sp.top = ferry__malloc(row_len * sizeof(int16_t));
  g.sp.diff = ferry__malloc(row_len * sizeof(int16_t));
  g.sp.noise = ferry__malloc(row_len + 8);
  if (g.sp.top == NULL || g.sp.diff == NULL || g.sp.noise == NULL ||
      (g.photo && photo_scratch_init(&g.ps, h, w) != 0)) {
    fprintf(stderr, "ferryctl gen: out of memory\n");
    goto out;
  }
  if (g.jpeg) {
    g.tj = tjInitCompress();
    g.pixels = ferry__malloc((size_t)img_bytes);
    g.jcap = tjBufSize(w, h, o.channels == 1 ? TJSAMP_GRAY : TJSAMP_420);
    g.jbuf = g.jcap != (unsigned long)-1 ? ferry__malloc(g.jcap) : NULL;
    if (g.tj == NULL || g.pixels == NULL || g.jbuf == NULL) {
      fprintf(stderr, "ferryctl gen: cannot set up the JPEG encoder: %s\n",
              g.tj ? "out of memory" : tjGetErrorStr2(NULL));
      goto out;
    }
  }

  static const ferry_compression_t comps[] = {
      FERRY_COMPRESSION_NONE, FERRY_COMPRESSION_GZIP, FERRY_COMPRESSION_ZLIB};
  static const char *const suffix[] = {"", ".gz", ".zz"};
  ferry_compression_t comp = comps[o.compression];
  size_t plen = strlen(o.out) + strlen(o.prefix) + 64;
  path = ferry__malloc(plen);
  if (path == NULL) {
    fprintf(stderr, "ferryctl gen: out of memory\n");
    goto out;
  }

  uint64_t shards = (uint64_t)o.shards, total = (uint64_t)o.records;
  uint64_t base = total / shards, rem = total % shards;
  uint64_t done = 0, file_bytes = 0, first = 0;
  ferryctl_progress_t prog;
  ferryctl_progress_init(&prog, "gen", total, ferryctl_isatty());
  double t0 = ferryctl_now();
  status = FERRYCTL_EXIT_OK;
  for (uint64_t s = 0; s < shards; s++) {
    uint64_t count = base + (s < rem ? 1 : 0);
    snprintf(path, plen, "%s/%s-%05llu-of-%05llu.tfrecord%s", o.out,
             o.prefix, (unsigned long long)s, (unsigned long long)shards,
             suffix[o.compression]);
    ferry_error_t err;
    ferry_error_clear(&err);
    int rc = write_shard(&g, path, comp, first, count, &prog, &done, &err);
    if (rc < 0) {
      ferryctl_progress_finish(&prog, done);
      const char *msg = err.msg[0] ? err.msg : ferry_strerror(rc);
      if (strstr(msg, path) != NULL)
        fprintf(stderr, "ferryctl gen: %s\n", msg);
      else
        fprintf(stderr, "ferryctl gen: %s: %s\n", path, msg);
      status = FERRYCTL_EXIT_USAGE;
      goto out;
    }
    struct stat st;
    if (stat(path, &st) == 0)
      file_bytes += (uint64_t)st.st_size;
    first += count;
  }
  ferryctl_progress_finish(&prog, done);
  double secs = ferryctl_now() - t0;
  char hb[32];
  printf("wrote %llu records to %llu file%s in %s: %llu bytes (%s) in "
         "%.2f s (%.0f records/s)\n",
         (unsigned long long)done, (unsigned long long)shards,
         shards == 1 ? "" : "s", o.out,
         (unsigned long long)file_bytes,
         ferryctl_human_bytes(file_bytes, hb, sizeof(hb)), secs,
         secs > 0 ? (double)done / secs : 0.0);
  if (g.jpeg && done > 0)
    printf("JPEG quality %d: %.0f bytes per image, %.0f pixels per image, "
           "%.3f bytes per pixel\n", g.quality,
           (double)g.image_bytes / (double)done,
           (double)g.pixel_count / (double)done,
           g.pixel_count ? (double)g.image_bytes / (double)g.pixel_count
                         : 0.0);

out:
  if (g.tj != NULL)
    tjDestroy(g.tj);
  photo_scratch_free(&g.ps);
  ferry__free(g.sp.top);
  ferry__free(g.sp.diff);
  ferry__free(g.sp.noise);
  ferry__free(g.pixels);
  ferry__free(g.jbuf);
  ferry__free(g.rec);
  ferry__free(path);
  ferry__options_free(gen_table, GEN_N, &o);
  return status;
}
