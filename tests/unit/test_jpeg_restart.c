/* Restart-interval tiles (jpeg_restart.h): the lossless rewrite keeps
 * every pixel of every JPEG it rewrites (the real files of
 * ../shared/testdata and generated ones of every subsampling, baseline and
 * progressive), says why it copies the others, and the window path of
 * the fused decode gives the pixels of the path without it, for random
 * crops, and falls back on damaged tiles. Random tests print their seed. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <turbojpeg.h>

#include "alloc.h"
#include "crop.h"
#include "example.h"
#include "imgops.h"
#include "imgops_internal.h"
#include "jpeg_restart.h"
#include "tfrecord.h"
#include "unit_files.h"

typedef struct {
  char name[96];
  uint8_t *data;
  size_t len;
} img_t;

#define MAX_IMGS 256

static uint64_t rng_next(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static uint64_t test_seed(void) {
  const char *e = getenv("FERRY_TEST_SEED");
  uint64_t s = e ? strtoull(e, NULL, 0) : (uint64_t)time(NULL);
  printf("seed %llu (FERRY_TEST_SEED=%llu repeats it)\n",
         (unsigned long long)s, (unsigned long long)s);
  return s;
}

/* A photo-like image: smooth gradients, edges and noise. */
static uint8_t *make_pixels(int h, int w, int c, uint64_t seed) {
  uint8_t *p = malloc((size_t)h * w * c);
  for (int y = 0; y < h; y++)
    for (int x = 0; x < w; x++)
      for (int k = 0; k < c; k++) {
        int v = (x * (3 + k) + y * (5 - k)) / 4 + ((x / 23 + y / 17) % 2) * 60 +
                (int)(rng_next(&seed) % 24);
        p[((size_t)y * w + x) * c + k] = (uint8_t)(v & 255);
      }
  return p;
}

/* Generated JPEGs: sizes that do and do not fill whole MCUs, every
 * subsampling TurboJPEG writes, baseline and progressive. */
static size_t gen_jpegs(img_t *out, size_t cap) {
  static const int sizes[][2] = {{375, 500}, {333, 500}, {61, 97},
                                 {224, 224}, {17, 300}, {300, 13}};
  static const int subs[] = {TJSAMP_444, TJSAMP_422, TJSAMP_420,
                             TJSAMP_440, TJSAMP_411, TJSAMP_GRAY};
  static const char *const subname[] = {"444", "422", "420",
                                        "440", "411", "gray"};
  size_t n = 0;
  for (size_t si = 0; si < 6; si++)
    for (size_t k = 0; k < 6; k++)
      for (int prog = 0; prog < 2 && n < cap; prog++) {
        int h = sizes[si][0], w = sizes[si][1];
        uint8_t *px = make_pixels(h, w, 3, si * 100 + k);
        unsigned char *jb = NULL;
        unsigned long jl = 0;
        /* A handle per image: TurboJPEG 2.1 keeps a progressive scan
         * script into the next image's baseline compression. */
        tjhandle tj = tjInitCompress();
        cr_assert(tjCompress2(tj, px, w, 0, h, TJPF_RGB, &jb, &jl, subs[k], 88,
                              prog ? TJFLAG_PROGRESSIVE : 0) == 0,
                  "tjCompress2: %s", tjGetErrorStr2(tj));
        snprintf(out[n].name, sizeof(out[n].name), "gen %dx%d %s%s", w, h,
                 subname[k], prog ? " progressive" : "");
        out[n].data = malloc(jl);
        memcpy(out[n].data, jb, jl);
        out[n].len = jl;
        n++;
        tjFree(jb);
        tjDestroy(tj);
        free(px);
      }
  return n;
}

/* Every file of testdata/jpeg and the JPEGs of two TFRecord files. */
static size_t real_jpegs(img_t *out, size_t cap) {
  char path[800];
  size_t n = 0;
  snprintf(path, sizeof(path), "%s/jpeg", FERRY_TESTDATA_DIR);
  DIR *d = opendir(path);
  if (d == NULL)
    return 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL && n < cap) {
    if (strstr(e->d_name, ".jpg") == NULL)
      continue;
    snprintf(path, sizeof(path), "%s/jpeg/%s", FERRY_TESTDATA_DIR, e->d_name);
    out[n].data = tu_slurp(path, &out[n].len);
    if (out[n].data == NULL)
      continue;
    snprintf(out[n].name, sizeof(out[n].name), "%.90s", e->d_name);
    n++;
  }
  closedir(d);
  static const char *const recs[] = {"tfmodels_pets_examples.record",
                                     "nitishkiitk_test.tfrecord",
                                     "shapes_test.record"};
  for (size_t f = 0; f < 3; f++) {
    ferry_tfr_reader_t *rd;
    ferry_tfr_options_t o;
    ferry_record_t rec;
    ferry_example_t ex;
    int i = 0;
    snprintf(path, sizeof(path), "%s/tfrecord/%s", FERRY_TESTDATA_DIR,
             recs[f]);
    ferry__tfr_options_init(&o);
    if (ferry__tfr_reader_open(path, &o, &rd, NULL) != 0)
      continue;
    ferry__example_init(&ex);
    while (n < cap && i < 40 && ferry__tfr_reader_next(rd, &rec, NULL) == 0) {
      const ferry_feature_t *ft;
      const uint8_t *v;
      size_t vl;
      if (ferry__example_parse(&ex, rec.data, rec.len, NULL) != 0 ||
          (ft = ferry__example_find(&ex, "image/encoded")) == NULL ||
          ferry__feature_bytes(ft, 0, &v, &vl) != 0)
        continue;
      out[n].data = malloc(vl);
      memcpy(out[n].data, v, vl);
      out[n].len = vl;
      snprintf(out[n].name, sizeof(out[n].name), "%s #%d", recs[f], i++);
      n++;
    }
    ferry__example_close(&ex);
    ferry__tfr_reader_free(rd);
  }
  return n;
}

static void free_imgs(img_t *im, size_t n) {
  for (size_t i = 0; i < n; i++)
    free(im[i].data);
}

/* The decoded pixels of a JPEG (ferry__jpeg_decode_dct), malloc'd. */
static uint8_t *decode(ferry_jpeg_t *j, const uint8_t *d, size_t len,
                       int accurate, int *h, int *w) {
  ferry_error_t e;
  uint8_t *p;
  ferry_error_clear(&e);
  cr_assert(ferry__jpeg_header(j, d, len, h, w, &e) == 0, "%s", e.msg);
  p = malloc((size_t)*h * *w * 3);
  cr_assert(ferry__jpeg_decode_dct(j, d, len, p, (size_t)*h * *w * 3, h, w,
                                   accurate, &e) == 0,
            "%s", e.msg);
  return p;
}

/* Rewrites im; checks the pixels itself (both DCTs) and the tiles. */
static ferry_jopt_reason_t check_rewrite(ferry_jpeg_t *j, const img_t *im,
                                         uint8_t **out, size_t *out_len) {
  ferry_jopt_result_t r;
  ferry_error_t e;
  ferry_error_clear(&e);
  cr_assert(ferry__jpeg_optimize(j, im->data, im->len, out, out_len, &r,
                                 &e) == 0,
            "%s: %s", im->name, e.msg);
  if (r.reason != FERRY_JOPT_REWRITTEN) {
    cr_assert((*out == NULL && r.detail[0] != '\0') || r.reason ==
              FERRY_JOPT_ALREADY, "%s: %s without a detail", im->name,
              ferry__jopt_reason_name(r.reason));
    printf("%s: copied (%s: %s)\n", im->name,
           ferry__jopt_reason_name(r.reason), r.detail);
    return r.reason;
  }
  for (int accurate = 0; accurate < 2; accurate++) {
    int h1, w1, h2, w2;
    uint8_t *a = decode(j, im->data, im->len, accurate, &h1, &w1);
    uint8_t *b = decode(j, *out, *out_len, accurate, &h2, &w2);
    cr_assert(h1 == h2 && w1 == w2 && memcmp(a, b, (size_t)h1 * w1 * 3) == 0,
              "%s: the rewrite decodes to other pixels (%s DCT)", im->name,
              accurate ? "ISLOW" : "IFAST");
    free(a);
    free(b);
  }
  ferry_jpeg_layout_t l;
  ferry_jpeg_tiles_t t = {0};
  char why[200];
  cr_assert(ferry__jpeg_layout(*out, *out_len, &l, why, sizeof(why)) == 1,
            "%s: the rewrite has no tiles: %s", im->name, why);
  cr_assert(l.restart == r.restart && l.mcus_x % l.restart == 0);
  cr_assert(ferry__jpeg_tiles_find(*out, *out_len, &l, &t, why,
                                   sizeof(why)) == 0,
            "%s: %s", im->name, why);
  ferry__jpeg_tiles_free(&t);
  return r.reason;
}

Test(jpeg_restart, rewrite_keeps_every_pixel_of_real_and_generated_jpegs) {
  static img_t im[MAX_IMGS];
  ferry_jpeg_t *j;
  ferry_error_t e;
  size_t n, nreal, count[FERRY_JOPT_NREASONS] = {0}, bytes_in = 0,
                   bytes_out = 0;
  cr_assert(ferry__jpeg_new(&j, &e) == 0);
  n = gen_jpegs(im, MAX_IMGS);
  nreal = real_jpegs(im + n, MAX_IMGS - n);
  if (nreal == 0)
    printf("%s is absent: generated JPEGs only\n", FERRY_TESTDATA_DIR);
  for (size_t i = 0; i < n + nreal; i++) {
    uint8_t *out = NULL;
    size_t ol = 0;
    ferry_jopt_reason_t r = check_rewrite(j, &im[i], &out, &ol);
    count[r]++;
    bytes_in += im[i].len;
    bytes_out += r == FERRY_JOPT_REWRITTEN ? ol : im[i].len;
    /* Generated images are all rewritten, but small ones whose markers
     * cost more than FERRY_JOPT_MAX_GROWTH (progressive grayscale). */
    if (i < n)
      cr_assert(r == FERRY_JOPT_REWRITTEN ||
                    (r == FERRY_JOPT_GROWS && im[i].len < 8000),
                "%s: %s", im[i].name,
                ferry__jopt_reason_name(r));
    ferry__free(out);
  }
  printf("%zu JPEGs (%zu real):", n + nreal, nreal);
  for (int r = 0; r < FERRY_JOPT_NREASONS; r++)
    printf(" %s %zu", ferry__jopt_reason_name((ferry_jopt_reason_t)r),
           count[r]);
  printf("; bytes %zu -> %zu (%+.2f%%)\n", bytes_in, bytes_out,
         100.0 * ((double)bytes_out / (double)bytes_in - 1));
  if (nreal > 0)
    cr_assert(count[FERRY_JOPT_REWRITTEN] > n + 20 &&
              count[FERRY_JOPT_UNREADABLE] > 0 &&
              count[FERRY_JOPT_WARNINGS] > 0);
  free_imgs(im, n + nreal);
  ferry__jpeg_free(j);
}

/* The reasons the real files give, where they are known. */
Test(jpeg_restart, copied_inputs_say_why) {
  static const struct {
    const char *file;
    ferry_jopt_reason_t reason;
    int progressive, arithmetic;
  } want[] = {
      {"jd_jpg-progressive.jpg", FERRY_JOPT_REWRITTEN, 1, 0},
      {"jd_jpg-cmyk-1.jpg", FERRY_JOPT_REWRITTEN, 0, 0},
      {"ljt_testimgari.jpg", FERRY_JOPT_GROWS, 0, 1},
      {"ljt_testorig12.jpg", FERRY_JOPT_UNREADABLE, 0, 0},
      {"jd_jpeg_lossless_sel1.jpg", FERRY_JOPT_UNREADABLE, 0, 0},
      {"tf_corrupt34_2.jpg", FERRY_JOPT_WARNINGS, 0, 0},
      {"jd_restarts.jpg", FERRY_JOPT_ALREADY, 0, 0},
      {"jd_jpg-size-1x1.jpg", FERRY_JOPT_TOO_SMALL, 0, 0},
  };
  ferry_jpeg_t *j;
  ferry_error_t e;
  char path[800];
  cr_assert(ferry__jpeg_new(&j, &e) == 0);
  for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
    size_t len, ol;
    uint8_t *d, *out;
    ferry_jopt_result_t r;
    snprintf(path, sizeof(path), "%s/jpeg/%s", FERRY_TESTDATA_DIR,
             want[i].file);
    if ((d = tu_slurp(path, &len)) == NULL) {
      printf("%s is absent: skipped\n", path);
      continue;
    }
    cr_assert(ferry__jpeg_optimize(j, d, len, &out, &ol, &r, &e) == 0);
    printf("%s: %s %s\n", want[i].file, ferry__jopt_reason_name(r.reason),
           r.detail);
    cr_assert(r.reason == want[i].reason, "%s: %s, not %s", want[i].file,
              ferry__jopt_reason_name(r.reason),
              ferry__jopt_reason_name(want[i].reason));
    cr_assert(r.progressive == want[i].progressive &&
              r.arithmetic == want[i].arithmetic, "%s", want[i].file);
    cr_assert((out != NULL) == (r.reason == FERRY_JOPT_REWRITTEN));
    ferry__free(out);
    free(d);
  }
  ferry__jpeg_free(j);
}

/* An image whose frame header claims more pixels than the decoders take
 * is not read (libjpeg would hold all its coefficients). */
Test(jpeg_restart, a_huge_frame_is_not_read) {
  static img_t im[1];
  ferry_jpeg_t *j;
  ferry_error_t e;
  ferry_jopt_result_t r;
  uint8_t *out;
  size_t ol, p;
  cr_assert(ferry__jpeg_new(&j, &e) == 0);
  cr_assert(gen_jpegs(im, 1) == 1);
  for (p = 2; p + 9 < im[0].len; p++)
    if (im[0].data[p] == 0xFF && im[0].data[p + 1] == 0xC0)
      break;
  cr_assert(p + 9 < im[0].len, "no SOF0");
  /* 30000 x 30000: 900 M pixels. */
  im[0].data[p + 5] = 0x75;
  im[0].data[p + 6] = 0x30;
  im[0].data[p + 7] = 0x75;
  im[0].data[p + 8] = 0x30;
  cr_assert(ferry__jpeg_optimize(j, im[0].data, im[0].len, &out, &ol, &r,
                                 &e) == 0);
  cr_assert(r.reason == FERRY_JOPT_UNREADABLE && out == NULL &&
                strstr(r.detail, "30000x30000: over the limit") != NULL,
            "%s: %s", ferry__jopt_reason_name(r.reason), r.detail);
  free_imgs(im, 1);
  ferry__jpeg_free(j);
}

/* One random crop op: RandomResizedCrop of random size, or Resize then
 * CenterCrop, or CenterCrop; the default scale choice or gap 2. */
static ferry_crop_op_t random_op(uint64_t *s) {
  ferry_crop_op_t op;
  memset(&op, 0, sizeof(op));
  switch (rng_next(s) % 4) {
  case 0:
  case 1:
    op.kind = FERRY_CROP_RANDOM_RESIZED;
    op.out_h = op.out_w = (int)(16 + rng_next(s) % 240);
    op.rrc = (ferry_rrc_t){0.08, 1.0, 3.0 / 4, 4.0 / 3};
    op.key = rng_next(s);
    break;
  case 2:
    op.kind = FERRY_CROP_RESIZE_CENTER;
    op.shorter = (int)(8 + rng_next(s) % 300);
    op.out_h = op.out_w = op.shorter;
    break;
  default:
    op.kind = FERRY_CROP_CENTER;
    op.out_h = (int)(4 + rng_next(s) % 200);
    op.out_w = (int)(4 + rng_next(s) % 200);
  }
  op.gap = rng_next(s) % 3 == 0 ? 2.0 : 0.0;
  return op;
}

/* Decodes d with op on both paths: the same rc, the same pixels. */
static void same_both_ways(ferry_jpeg_t *win, ferry_jpeg_t *plain,
                           const uint8_t *d, size_t len,
                           const ferry_crop_op_t *op, const char *what) {
  static uint8_t a[320 * 320 * 3], b[320 * 320 * 3];
  int ha, wa, hb, wb;
  ferry_error_t e1, e2;
  ferry_error_clear(&e1);
  ferry_error_clear(&e2);
  int r1 = ferry__jpeg_decode_crop(win, d, len, op, a, sizeof(a), &ha, &wa,
                                   NULL, &e1);
  int r2 = ferry__jpeg_decode_crop(plain, d, len, op, b, sizeof(b), &hb, &wb,
                                   NULL, &e2);
  cr_assert(r1 == r2, "%s: rc %d with the window, %d without (%s | %s)", what,
            r1, r2, e1.msg, e2.msg);
  if (r1 == 0)
    cr_assert(ha == hb && wa == wb &&
                  memcmp(a, b, (size_t)ha * (size_t)wa * 3) == 0,
              "%s: other pixels with the window (kind %d, %dx%d, gap %g; "
              "why: %s)",
              what, op->kind, op->out_w, op->out_h, op->gap,
              ferry__jpeg_window_why(win));
  else
    cr_assert(strcmp(e1.msg, e2.msg) == 0, "%s: '%s' against '%s'", what,
              e1.msg, e2.msg);
}

Test(jpeg_restart, window_decode_gives_the_fused_pixels) {
  static img_t im[MAX_IMGS];
  ferry_jpeg_t *win, *plain;
  ferry_error_t e;
  ferry_jpeg_crop_stats_t st;
  uint64_t seed = test_seed();
  size_t n, decodes = 0;
  cr_assert(ferry__jpeg_new(&win, &e) == 0 &&
            ferry__jpeg_new(&plain, &e) == 0);
  ferry__jpeg_set_window(plain, 0);
  n = gen_jpegs(im, MAX_IMGS);
  n += real_jpegs(im + n, MAX_IMGS - n);
  for (size_t i = 0; i < n; i++) {
    uint8_t *out = NULL;
    size_t ol = 0;
    if (check_rewrite(win, &im[i], &out, &ol) != FERRY_JOPT_REWRITTEN)
      continue;
    for (int k = 0; k < 24; k++, decodes++) {
      ferry_crop_op_t op = random_op(&seed);
      same_both_ways(win, plain, out, ol, &op, im[i].name);
    }
    ferry__free(out);
  }
  ferry__jpeg_crop_stats(win, &st);
  printf("%zu decodes: window %llu, fused %llu, full %llu, fallbacks %llu\n",
         decodes, (unsigned long long)st.window,
         (unsigned long long)st.fused, (unsigned long long)st.full,
         (unsigned long long)st.window_fallback);
  cr_assert(st.window_fallback == 0 && st.window > decodes / 3,
            "the window path ran %llu times of %zu",
            (unsigned long long)st.window, decodes);
  free_imgs(im, n);
  ferry__jpeg_free(win);
  ferry__jpeg_free(plain);
}

/* The byte offsets of an image's restart markers. */
static size_t rst_offsets(const uint8_t *d, size_t len, size_t *at,
                          size_t cap) {
  ferry_jpeg_layout_t l;
  size_t n = 0;
  cr_assert(ferry__jpeg_layout(d, len, &l, NULL, 0) == 1);
  for (size_t p = l.scan; p + 1 < len && n < cap; p++)
    if (d[p] == 0xFF && d[p + 1] >= 0xD0 && d[p + 1] <= 0xD7)
      at[n++] = p;
  return n;
}

/* Damaged tiles: markers out of order, missing, intervals cut short or
 * grown, truncated scans, flipped bytes. Every case decodes as the path
 * without the window does (the same pixels, or the same error), and the
 * damage the markers show is counted as a fallback. */
Test(jpeg_restart, damaged_tiles_fall_back_to_the_fused_path) {
  static img_t im[4];
  static size_t rst[4096];
  ferry_jpeg_t *win, *plain;
  ferry_error_t e;
  uint64_t seed = test_seed();
  uint8_t *opt = NULL, *bad = NULL;
  size_t ol, nr, cases = 0;
  ferry_jpeg_crop_stats_t st;
  cr_assert(ferry__jpeg_new(&win, &e) == 0 &&
            ferry__jpeg_new(&plain, &e) == 0);
  ferry__jpeg_set_window(plain, 0);
  cr_assert(gen_jpegs(im, 4) == 4);
  cr_assert(check_rewrite(win, &im[0], &opt, &ol) == FERRY_JOPT_REWRITTEN);
  nr = rst_offsets(opt, ol, rst, 4096);
  cr_assert(nr > 100, "%zu markers", nr);
  bad = malloc(ol + 64);
  for (int t = 0; t < 400; t++) {
    size_t bl = ol;
    int kind = t % 6;
    size_t m = rst[rng_next(&seed) % nr];
    memcpy(bad, opt, ol);
    switch (kind) {
    case 0: /* a marker out of sequence */
      bad[m + 1] = (uint8_t)(0xD0 + (bad[m + 1] - 0xD0 + 1 +
                                      rng_next(&seed) % 7) % 8);
      break;
    case 1: /* a marker missing */
      memmove(bad + m, bad + m + 2, ol - m - 2);
      bl = ol - 2;
      break;
    case 2: { /* an interval cut short: bytes before a marker removed */
      size_t k = 1 + rng_next(&seed) % 6;
      if (m < k + 1000)
        continue;
      memmove(bad + m - k, bad + m, ol - m);
      bl = ol - k;
      break;
    }
    case 3: { /* an interval grown: bytes repeated before a marker */
      size_t k = 1 + rng_next(&seed) % 6;
      memmove(bad + m + k, bad + m, ol - m);
      memset(bad + m, 0x5A, k);
      bl = ol + k;
      break;
    }
    case 4: /* the scan truncated */
      bl = rst[0] + rng_next(&seed) % (ol - rst[0]);
      break;
    default: /* a byte of entropy-coded data flipped */
      bad[rst[0] + rng_next(&seed) % (ol - rst[0] - 2)] ^=
          (uint8_t)(1 + rng_next(&seed) % 255);
    }
    for (int k = 0; k < 3; k++, cases++) {
      ferry_crop_op_t op = random_op(&seed);
      char what[64];
      snprintf(what, sizeof(what), "damage %d case %d", kind, t);
      same_both_ways(win, plain, bad, bl, &op, what);
    }
  }
  ferry__jpeg_crop_stats(win, &st);
  printf("%zu damaged decodes: window %llu, fallbacks %llu; last: %s\n",
         cases, (unsigned long long)st.window,
         (unsigned long long)st.window_fallback,
         ferry__jpeg_window_why(win));
  cr_assert(st.window_fallback > cases / 6);
  free(bad);
  ferry__free(opt);
  free_imgs(im, 4);
  ferry__jpeg_free(win);
  ferry__jpeg_free(plain);
}

Test(jpeg_restart, layout_and_tiles_name_what_is_wrong) {
  static img_t im[4];
  ferry_jpeg_t *j;
  ferry_error_t e;
  ferry_jpeg_layout_t l;
  ferry_jpeg_tiles_t t = {0};
  char why[200];
  uint8_t *opt = NULL;
  size_t ol;
  cr_assert(ferry__jpeg_new(&j, &e) == 0);
  cr_assert(gen_jpegs(im, 2) == 2);
  cr_assert(ferry__jpeg_layout(im[0].data, im[0].len, &l, why, sizeof(why)) ==
                0 && strstr(why, "no restart interval") != NULL, "%s", why);
  cr_assert(ferry__jpeg_layout(im[1].data, im[1].len, &l, why, sizeof(why)) ==
                0 && strstr(why, "progressive") != NULL, "%s", why);
  cr_assert(check_rewrite(j, &im[0], &opt, &ol) == FERRY_JOPT_REWRITTEN);
  cr_assert(ferry__jpeg_layout(opt, ol, &l, why, sizeof(why)) == 1);
  cr_assert(ferry__jpeg_tiles_find(opt, ol - 2, &l, &t, why, sizeof(why)) ==
                -1 && strstr(why, "truncated") != NULL, "%s", why);
  for (size_t cut = 0; cut < ol; cut += 1 + cut / 8) /* never out of bounds */
    if (ferry__jpeg_layout(opt, cut, &l, why, sizeof(why)) == 1)
      cr_assert(ferry__jpeg_tiles_find(opt, cut, &l, &t, why, sizeof(why)) ==
                -1 && strstr(why, "byte") != NULL, "%s", why);
  /* The tiles of the whole file: one a restart interval, each after its
   * marker, RST0..RST7 in turn, the last ending at EOI. */
  cr_assert(ferry__jpeg_layout(opt, ol, &l, why, sizeof(why)) == 1 &&
            ferry__jpeg_tiles_find(opt, ol, &l, &t, why, sizeof(why)) == 0);
  cr_assert(t.n == (size_t)(l.mcus_x / l.restart) * (size_t)l.mcus_y,
            "%zu tiles", t.n);
  cr_assert(t.start[0] == l.scan && t.start[t.n] == ol - 2 &&
            opt[ol - 2] == 0xFF && opt[ol - 1] == 0xD9);
  for (size_t i = 1; i < t.n; i++)
    cr_assert(t.start[i] > t.start[i - 1] && opt[t.start[i] - 2] == 0xFF &&
                  opt[t.start[i] - 1] == 0xD0 + (i - 1) % 8 &&
                  ferry__jpeg_tile_end(&t, i - 1) == t.start[i] - 2,
              "tile %zu at byte %u", i, t.start[i]);
  ferry__jpeg_tiles_free(&t);
  ferry__free(opt);
  free_imgs(im, 2);
  ferry__jpeg_free(j);
}

/* src without its DHT segments (motion JPEG's way: a decoder that has
 * read no tables takes the standard ones, which TurboJPEG wrote). */
static uint8_t *strip_dht(const uint8_t *d, size_t n, size_t *out_len) {
  uint8_t *o = malloc(n);
  size_t pos = 2, at = 2;
  memcpy(o, d, 2);
  while (pos + 4 <= n && d[pos] == 0xFF && d[pos + 1] != 0xDA) {
    size_t len = (size_t)d[pos + 2] << 8 | d[pos + 3];
    cr_assert(len >= 2 && pos + 2 + len <= n);
    if (d[pos + 1] != 0xC4) {
      memcpy(o + at, d + pos, 2 + len);
      at += 2 + len;
    }
    pos += 2 + len;
  }
  cr_assert(pos < n && d[pos + 1] == 0xDA);
  memcpy(o + at, d + pos, n - pos);
  *out_len = at + n - pos;
  return o;
}

/* libjpeg keeps one image's tables for the next, so an image that uses
 * tables it does not define decodes with whatever its decoder read
 * before, unless the decoder is fresh. Every path decodes it as a fresh
 * decoder does, whatever came before it. */
Test(jpeg_restart, an_image_without_its_tables_decodes_as_on_a_fresh_one) {
  static img_t im[8];
  static uint8_t want[375 * 500 * 3], got[375 * 500 * 3];
  ferry_jpeg_t *used, *fresh;
  ferry_error_t e;
  uint8_t *opt = NULL, *bare;
  size_t ol, bl;
  int h1, w1, h2, w2;
  cr_assert(ferry__jpeg_new(&used, &e) == 0);
  cr_assert(gen_jpegs(im, 8) == 8);
  /* Optimal tables, other than the standard ones, left in `used`. */
  cr_assert(check_rewrite(used, &im[4], &opt, &ol) == FERRY_JOPT_REWRITTEN);
  bare = strip_dht(im[0].data, im[0].len, &bl);
  cr_assert(bl < im[0].len);
  for (int path = 0; path < 3; path++) {
    ferry_crop_op_t op = {.kind = FERRY_CROP_RANDOM_RESIZED,
                          .out_h = 224,
                          .out_w = 224,
                          .rrc = {0.08, 1.0, 3.0 / 4, 4.0 / 3},
                          .key = 7,
                          .exact = path == 2};
    cr_assert(ferry__jpeg_new(&fresh, &e) == 0);
    int r1 = path == 0 ? ferry__jpeg_decode(fresh, im[0].data, im[0].len,
                                            want, sizeof(want), &h1, &w1, &e)
                       : ferry__jpeg_decode_crop(fresh, im[0].data, im[0].len,
                                                 &op, want, sizeof(want), &h1,
                                                 &w1, NULL, &e);
    cr_assert(r1 == 0, "path %d: %s", path, e.msg);
    int r2 = path == 0 ? ferry__jpeg_decode(used, opt, ol, got, sizeof(got),
                                            &h2, &w2, &e)
                       : ferry__jpeg_decode_crop(used, opt, ol, &op, got,
                                                 sizeof(got), &h2, &w2, NULL,
                                                 &e);
    cr_assert(r2 == 0, "path %d: %s", path, e.msg);
    r2 = path == 0 ? ferry__jpeg_decode(used, bare, bl, got, sizeof(got), &h2,
                                        &w2, &e)
                   : ferry__jpeg_decode_crop(used, bare, bl, &op, got,
                                             sizeof(got), &h2, &w2, NULL, &e);
    cr_assert(r2 == 0 && h1 == h2 && w1 == w2 &&
                  memcmp(want, got, (size_t)h1 * (size_t)w1 * 3) == 0,
              "path %d: without its tables, after another image, the image "
              "decodes to other pixels (%s)", path, r2 ? e.msg : "");
    ferry__jpeg_free(fresh);
  }
  free(bare);
  ferry__free(opt);
  free_imgs(im, 8);
  ferry__jpeg_free(used);
}
