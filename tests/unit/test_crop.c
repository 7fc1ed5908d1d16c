/* The crop ops (crop.h, docs/TORCHVISION_OPS.md): torchvision's
 * RandomResizedCrop sampler, Resize(shorter) and CenterCrop geometry, the
 * antialiased resampler against a double-precision reference of
 * torchvision's antialias=True resize, and the JPEG decode fused with the
 * crop and the DCT scale: its accuracy against the reference (full
 * TurboJPEG decode, integer crop, antialiased resize in double) over the
 * real photographs of ../shared/testdata, printed per image, and its
 * error policy on bad JPEGs. Random tests print their seed. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <turbojpeg.h>

#include "crop.h"
#include "example.h"
#include "imgops.h"
#include "tfrecord.h"
#include "unit_files.h"

/* ---------------------------------------------------------------------
 * The reference: torchvision's antialiased bilinear resize
 * (aten _upsample_bilinear2d_aa, as PIL's ImagingResample) of an integer
 * box of an image, written from the formulas, in double, one rounding.
 */
typedef struct {
  int xmin, n;
  double w[1300];
} ref_taps_t;

static void ref_taps(int in_size, int out_size, int i, ref_taps_t *t) {
  double scale = (double)in_size / out_size;
  double support = scale >= 1.0 ? scale : 1.0;
  double invscale = scale >= 1.0 ? 1.0 / scale : 1.0;
  double center = scale * (i + 0.5);
  double total = 0;
  long xmin = (long)(center - support + 0.5);
  long xmax = (long)(center + support + 0.5);
  if (xmin < 0)
    xmin = 0;
  if (xmax > in_size)
    xmax = in_size;
  t->xmin = (int)xmin;
  t->n = (int)(xmax - xmin);
  cr_assert(t->n <= 1300);
  for (int j = 0; j < t->n; j++) {
    double x = (j + xmin - center + 0.5) * invscale;
    double v = 1.0 - fabs(x);
    t->w[j] = v > 0 ? v : 0;
    total += t->w[j];
  }
  for (int j = 0; j < t->n; j++)
    t->w[j] = total != 0 ? t->w[j] / total : 0;
}

/* Box b of the h x w x 3 image, resized to oh x ow, into out (uint8,
 * rounded half up, clamped). */
static void ref_resize(const uint8_t *img, int w, const ferry_box_t *b,
                       uint8_t *out, int oh, int ow) {
  double *tmp = malloc(sizeof(double) * (size_t)b->height * ow * 3);
  ref_taps_t t;
  for (int ox = 0; ox < ow; ox++) {
    ref_taps(b->width, ow, ox, &t);
    for (int y = 0; y < b->height; y++)
      for (int c = 0; c < 3; c++) {
        double a = 0;
        for (int k = 0; k < t.n; k++)
          a += t.w[k] * img[((size_t)(b->top + y) * w + b->left + t.xmin +
                             k) * 3 + c];
        tmp[((size_t)y * ow + ox) * 3 + c] = a;
      }
  }
  for (int oy = 0; oy < oh; oy++) {
    ref_taps(b->height, oh, oy, &t);
    for (int ox = 0; ox < ow; ox++)
      for (int c = 0; c < 3; c++) {
        double a = 0;
        for (int k = 0; k < t.n; k++)
          a += t.w[k] * tmp[((size_t)(t.xmin + k) * ow + ox) * 3 + c];
        a = floor(a + 0.5);
        out[((size_t)oy * ow + ox) * 3 + c] =
            (uint8_t)(a < 0 ? 0 : a > 255 ? 255 : a);
      }
  }
  free(tmp);
}

/* ---------------------------------------------------------------------
 * Sampler and geometry.
 */

Test(crop, rrc_sampler_matches_torchvision_rules) {
  ferry_rrc_t p = {0.08, 1.0, 3.0 / 4.0, 4.0 / 3.0};
  uint64_t seed = 20261201;
  int fallbacks = 0;
  printf("rrc sampler: seed %llu\n", (unsigned long long)seed);
  for (uint64_t rec = 0; rec < 20000; rec++) {
    int h = 100 + (int)(rec % 400), w = 100 + (int)((rec * 7) % 500);
    ferry_box_t b, b2;
    uint64_t key = ferry__crop_key(seed, rec % 3, rec);
    ferry__rrc_sample(&p, h, w, key, &b);
    ferry__rrc_sample(&p, h, w, key, &b2);
    cr_assert(memcmp(&b, &b2, sizeof(b)) == 0, "not deterministic");
    cr_assert(b.top >= 0 && b.left >= 0 && b.height >= 1 && b.width >= 1 &&
                  b.top + b.height <= h && b.left + b.width <= w,
              "record %llu: box %d,%d %dx%d outside %dx%d",
              (unsigned long long)rec, b.top, b.left, b.height, b.width, h,
              w);
    /* A sampled crop has its area in the scale range and its aspect in
     * the ratio range, both up to the rounding of w and h. */
    double area = (double)b.width * b.height / ((double)h * w);
    double ar = (double)b.width / b.height;
    int in_range = area >= 0.08 * 0.9 && area <= 1.0 &&
                   ar >= 0.75 * 0.9 && ar <= 4.0 / 3.0 * 1.1;
    if (b.height == h && b.width == w)
      fallbacks++;
    else
      cr_assert(in_range, "record %llu: area %g aspect %g", (unsigned long long)rec,
                area, ar);
  }
  /* Keys differ by epoch and record. */
  ferry_box_t a, b;
  ferry__rrc_sample(&p, 375, 500, ferry__crop_key(1, 0, 5), &a);
  ferry__rrc_sample(&p, 375, 500, ferry__crop_key(1, 1, 5), &b);
  cr_assert(memcmp(&a, &b, sizeof(a)) != 0, "epoch does not change the crop");
  printf("rrc sampler: %d of 20000 whole-image crops\n", fallbacks);
}

/* The fallback: no try can succeed when the ratio range excludes every
 * crop that fits; torchvision then takes the centre crop clamped to it. */
Test(crop, rrc_fallback_is_torchvision_centre_crop) {
  ferry_rrc_t p = {0.99, 1.0, 3.0, 4.0}; /* wide crops of a tall image */
  ferry_box_t b;
  ferry__rrc_sample(&p, 400, 100, ferry__crop_key(3, 0, 0), &b);
  /* in_ratio 0.25 < 3: w = W = 100, h = round(100 / 3) = 33, centred. */
  cr_assert(b.width == 100 && b.height == 33 && b.left == 0 &&
                b.top == (400 - 33) / 2,
            "%d,%d %dx%d", b.top, b.left, b.height, b.width);
  ferry_rrc_t q = {0.99, 1.0, 0.2, 0.25}; /* tall crops of a wide image */
  ferry__rrc_sample(&q, 100, 400, ferry__crop_key(3, 0, 0), &b);
  /* in_ratio 4 > 0.25: h = H = 100, w = round(100 * 0.25) = 25. */
  cr_assert(b.height == 100 && b.width == 25 && b.top == 0 &&
            b.left == (400 - 25) / 2);
  ferry_rrc_t r = {1.0, 1.0, 0.5, 2.0}; /* only the whole image */
  ferry__rrc_sample(&r, 300, 200, ferry__crop_key(3, 0, 0), &b);
  cr_assert(b.height == 300 && b.width == 200 && b.top == 0 && b.left == 0);
}

Test(crop, resize_and_center_crop_geometry) {
  int oh, ow;
  ferry_box_t b;
  ferry__resize_shorter_size(375, 500, 256, &oh, &ow);
  cr_assert(oh == 256 && ow == 341, "%dx%d", oh, ow); /* int(341.33) */
  ferry__resize_shorter_size(500, 333, 256, &oh, &ow);
  cr_assert(ow == 256 && oh == 384, "%dx%d", oh, ow); /* int(384.38) */
  ferry__resize_shorter_size(100, 100, 7, &oh, &ow);
  cr_assert(oh == 7 && ow == 7);
  /* round((341 - 224) / 2) = round(58.5) = 58 (half to even);
   * round((256 - 224) / 2) = 16; round(2.5) = 2; round(3.5) = 4. */
  ferry__center_crop_box(256, 341, 224, 224, &b);
  cr_assert(b.top == 16 && b.left == 58, "%d %d", b.top, b.left);
  ferry__center_crop_box(229, 231, 224, 224, &b);
  cr_assert(b.top == 2 && b.left == 4, "%d %d", b.top, b.left);
  /* Larger than the image: torchvision pads (c - n) // 2 on the left. */
  ferry__center_crop_box(10, 20, 15, 10, &b);
  cr_assert(b.top == -2 && b.left == 5, "%d %d", b.top, b.left);
}

static uint32_t lcg(uint64_t *s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return (uint32_t)(*s >> 33);
}

/* The resampler against the double reference: within 1 on random boxes,
 * sizes and scales (down and up), on random and smooth images. */
Test(crop, resampler_within_one_of_reference) {
  uint64_t seed = 77, s;
  ferry_resampler_t *r;
  int worst = 0;
  cr_assert_eq(ferry__resampler_new(&r, NULL), 0);
  printf("resampler: seed %llu\n", (unsigned long long)seed);
  s = seed;
  for (int it = 0; it < 300; it++) {
    int h = 1 + (int)(lcg(&s) % 300), w = 1 + (int)(lcg(&s) % 300);
    int oh = 1 + (int)(lcg(&s) % 250), ow = 1 + (int)(lcg(&s) % 250);
    uint8_t *img = malloc((size_t)h * w * 3);
    uint8_t *a = malloc((size_t)oh * ow * 3), *b = malloc((size_t)oh * ow * 3);
    int smooth = it % 2;
    for (int y = 0; y < h; y++)
      for (int x = 0; x < w * 3; x++)
        img[(size_t)y * w * 3 + x] =
            smooth ? (uint8_t)(127 + 120 * sin(x * 0.05 + y * 0.03))
                   : (uint8_t)lcg(&s);
    ferry_box_t box;
    box.height = 1 + (int)(lcg(&s) % h);
    box.width = 1 + (int)(lcg(&s) % w);
    box.top = (int)(lcg(&s) % (h - box.height + 1));
    box.left = (int)(lcg(&s) % (w - box.width + 1));
    ferry_window_t win;
    ferry__window_of_box(&box, &win);
    cr_assert_eq(
        ferry__resample(r, img, h, w, (size_t)w * 3, 3, &win, a, oh, ow, NULL),
        0);
    ref_resize(img, w, &box, b, oh, ow);
    for (size_t i = 0; i < (size_t)oh * ow * 3; i++) {
      int d = abs((int)a[i] - (int)b[i]);
      if (d > worst)
        worst = d;
      cr_assert_leq(d, 1,
                    "seed %llu iteration %d: %dx%d box %d,%d %dx%d to %dx%d, "
                    "byte %zu: %d vs %d",
                    (unsigned long long)seed, it, h, w, box.top, box.left,
                    box.height, box.width, oh, ow, i, a[i], b[i]);
    }
    free(img);
    free(a);
    free(b);
  }
  printf("resampler: max |fast - reference| = %d over 300 cases\n", worst);
  ferry__resampler_free(r);
}

/* Resize(shorter) | CenterCrop through the window equals resizing the
 * whole image with the reference, then cropping. */
Test(crop, resize_center_window_equals_resize_then_crop) {
  int h = 150, w = 200, oh, ow;
  uint8_t *img = malloc((size_t)h * w * 3);
  uint64_t s = 5;
  for (size_t i = 0; i < (size_t)h * w * 3; i++)
    img[i] = (uint8_t)lcg(&s);
  ferry_resampler_t *r;
  cr_assert_eq(ferry__resampler_new(&r, NULL), 0);
  ferry_window_t win;
  ferry__window_resize_center(h, w, 100, 90, 90, &win, &oh, &ow);
  cr_assert(oh == 90 && ow == 90);
  uint8_t *a = malloc(90 * 90 * 3);
  cr_assert_eq(
      ferry__resample(r, img, h, w, (size_t)w * 3, 3, &win, a, 90, 90, NULL),
      0);
  int nh, nw;
  ferry__resize_shorter_size(h, w, 100, &nh, &nw);
  cr_assert(nh == 100 && nw == 133);
  uint8_t *full = malloc((size_t)nh * nw * 3);
  ferry_box_t whole = {0, 0, h, w}, cc;
  ref_resize(img, w, &whole, full, nh, nw);
  ferry__center_crop_box(nh, nw, 90, 90, &cc);
  for (int y = 0; y < 90; y++)
    for (int x = 0; x < 90 * 3; x++) {
      int d = abs((int)a[(size_t)y * 270 + x] -
                  (int)full[((size_t)(y + cc.top) * nw + cc.left) * 3 + x]);
      cr_assert_leq(d, 1, "pixel %d,%d", y, x / 3);
    }
  /* A centre crop larger than the resized image: zeros around it. */
  ferry__window_resize_center(h, w, 20, 40, 40, &win, &oh, &ow);
  uint8_t *z = malloc(40 * 40 * 3);
  cr_assert_eq(
      ferry__resample(r, img, h, w, (size_t)w * 3, 3, &win, z, 40, 40, NULL),
      0);
  /* Resized to 20x26: 10 rows of zeros above and below, 7 columns left. */
  for (int x = 0; x < 40 * 3; x++)
    cr_assert(z[x] == 0 && z[(size_t)39 * 120 + x] == 0);
  cr_assert_eq(z[(size_t)20 * 120 + 6 * 3], 0);
  cr_assert_neq(z[(size_t)20 * 120 + 20 * 3] + z[(size_t)20 * 120 + 20 * 3 + 1] +
                    z[(size_t)20 * 120 + 20 * 3 + 2],
                0);
  free(z);
  free(a);
  free(full);
  free(img);
  ferry__resampler_free(r);
}

/* ---------------------------------------------------------------------
 * JPEG: accuracy of the fused decode over real photographs.
 */

typedef struct {
  char name[96];
  uint8_t *data;
  size_t len;
} photo_t;


/* Photographs of ../shared/testdata (MANIFEST.md): the ImageNet-like
 * JPEGs inside two TFRecord files, and the files of jpeg/ that decode
 * without a warning (4:2:0, 4:2:2, 4:4:4, grayscale, CMYK, YCCK,
 * progressive, restarts). Files with corrupt data are left out: what
 * libjpeg makes of corrupt coefficients depends on the DCT scale. */
static const char *const photo_files[] = {
    "ljt_testorig.jpg",       "ljt_testimgp.jpg",
    "ljt_testimggray.jpg",    "tf_jpeg_merge_test1.jpg",
    "tf_jpeg_merge_test1_cmyk.jpg", "jd_ycck.jpg",
    "jd_multiple-0xff-before-eoi.jpg", "jd_restarts.jpg",
    "jd_jpg-cmyk-1.jpg",      "jd_non-interleaved-mcu.jpg",
};

static size_t load_photos(photo_t *out, size_t cap, char *why,
                          size_t whycap) {
  size_t n = 0;
  char path[700];
  for (size_t i = 0; i < sizeof(photo_files) / sizeof(photo_files[0]); i++) {
    snprintf(path, sizeof(path), "%s/jpeg/%s", FERRY_TESTDATA_DIR,
             photo_files[i]);
    uint8_t *b = tu_slurp(path, &out[n].len);
    if (b == NULL) {
      snprintf(why, whycap, "%s is absent", path);
      return 0;
    }
    out[n].data = b;
    snprintf(out[n].name, sizeof(out[n].name), "%s", photo_files[i]);
    n++;
  }
  static const char *const recs[] = {"tfmodels_pets_examples.record",
                                     "nitishkiitk_test.tfrecord"};
  for (size_t f = 0; f < 2; f++) {
    ferry_tfr_reader_t *rd;
    ferry_tfr_options_t o;
    ferry_record_t rec;
    ferry_example_t ex;
    snprintf(path, sizeof(path), "%s/tfrecord/%s", FERRY_TESTDATA_DIR,
             recs[f]);
    ferry__tfr_options_init(&o);
    if (ferry__tfr_reader_open(path, &o, &rd, NULL) != 0) {
      snprintf(why, whycap, "%s is absent", path);
      return 0;
    }
    ferry__example_init(&ex);
    while (n < cap && ferry__tfr_reader_next(rd, &rec, NULL) == 0) {
      const ferry_feature_t *ft;
      const uint8_t *d;
      size_t dl;
      cr_assert_eq(ferry__example_parse(&ex, rec.data, rec.len, NULL), 0);
      ft = ferry__example_find(&ex, "image/encoded");
      cr_assert_not_null(ft);
      cr_assert_eq(ferry__feature_bytes(ft, 0, &d, &dl), 0);
      out[n].data = malloc(dl);
      memcpy(out[n].data, d, dl);
      out[n].len = dl;
      snprintf(out[n].name, sizeof(out[n].name), "%s#%llu", recs[f],
               (unsigned long long)rec.index);
      n++;
    }
    ferry__example_close(&ex);
    ferry__tfr_reader_free(rd);
  }
  return n;
}

/* Stated bounds of the fused path against the reference
 * (docs/TORCHVISION_OPS.md): with the default scale choice (gap 1) every photo's PSNR >= 33 dB, all
 * photos together >= 40 dB, no byte off by more than 64 (the DCT
 * scaling's ringing at strong edges); with gap 2 (Pillow's reducing_gap)
 * >= 42 dB per photo, 48 dB together and 32 at most. */
typedef struct {
  double min_psnr_image, min_psnr_all;
  int max_err;
} bounds_t;
static const bounds_t gap1_bounds = {33.0, 40.0, 64};
static const bounds_t gap2_bounds = {42.0, 48.0, 32};

typedef struct {
  double sq;
  size_t n;
  int maxerr;
} acc_t;

static void acc_add(acc_t *a, const uint8_t *x, const uint8_t *y, size_t n) {
  for (size_t i = 0; i < n; i++) {
    int d = abs((int)x[i] - (int)y[i]);
    a->sq += (double)d * d;
    if (d > a->maxerr)
      a->maxerr = d;
  }
  a->n += n;
}

static double psnr(const acc_t *a) {
  double mse = a->sq / (double)a->n;
  return mse == 0 ? 99.0 : 10.0 * log10(255.0 * 255.0 / mse);
}

/* One op over every photo, several keys each: the fused path within the
 * stated bounds, the exact option within 1, of the reference. */
static void accuracy_run(const char *label, ferry_crop_op_t op, int crops,
                         const bounds_t *bd) {
  static photo_t photos[64];
  char why[800] = "";
  size_t n = load_photos(photos, 64, why, sizeof(why));
  if (n == 0) {
    printf("skip: %s\n", why);
    cr_skip_test("%s", why);
  }
  ferry_jpeg_t *j;
  cr_assert_eq(ferry__jpeg_new(&j, NULL), 0);
  size_t cap = 64u << 20;
  uint8_t *full = malloc(cap), *fused = malloc(cap), *exact = malloc(cap),
          *ref = malloc(cap);
  acc_t all = {0}, all_exact = {0};
  double worst_psnr = 99;
  printf("accuracy %s: image, size, scales used, PSNR dB, max err (fused); "
         "max err (exact)\n",
         label);
  for (size_t i = 0; i < n; i++) {
    int h, w, oh, ow, oh2, ow2;
    ferry_error_t err = {0};
    acc_t a = {0}, ax = {0};
    char scales[64] = "";
    cr_assert_eq(ferry__jpeg_decode(j, photos[i].data, photos[i].len, full, cap,
                                    &h, &w, &err),
                 0, "%s: %s", photos[i].name, err.msg);
    for (int k = 0; k < crops; k++) {
      ferry_jpeg_crop_info_t info;
      ferry_window_t win;
      op.key = ferry__crop_key(11, 0, (uint64_t)i * 1000 + (uint64_t)k);
      op.exact = 0;
      cr_assert_eq(ferry__jpeg_decode_crop(j, photos[i].data, photos[i].len,
                                           &op, fused, cap, &oh, &ow, &info,
                                           &err),
                   0, "%s: %s", photos[i].name, err.msg);
      op.exact = 1;
      cr_assert_eq(ferry__jpeg_decode_crop(j, photos[i].data, photos[i].len,
                                           &op, exact, cap, &oh2, &ow2, NULL,
                                           &err),
                   0, "%s: %s", photos[i].name, err.msg);
      cr_assert(oh == oh2 && ow == ow2);
      cr_assert_eq(ferry__crop_plan(&op, h, w, &win, &oh2, &ow2, NULL), 0);
      if (op.kind == FERRY_CROP_RANDOM_RESIZED) {
        ref_resize(full, w, &win.clip, ref, oh, ow);
      } else {
        /* Resize the whole image, then crop (torchvision's order). */
        int nh, nw;
        ferry_box_t whole = {0, 0, h, w}, cc;
        ferry__resize_shorter_size(h, w, op.shorter, &nh, &nw);
        uint8_t *rs = malloc((size_t)nh * nw * 3);
        ref_resize(full, w, &whole, rs, nh, nw);
        ferry__center_crop_box(nh, nw, oh, ow, &cc);
        cr_assert(cc.top >= 0 && cc.left >= 0);
        for (int y = 0; y < oh; y++)
          memcpy(ref + (size_t)y * ow * 3,
                 rs + ((size_t)(y + cc.top) * nw + cc.left) * 3,
                 (size_t)ow * 3);
        free(rs);
      }
      acc_add(&a, fused, ref, (size_t)oh * ow * 3);
      acc_add(&ax, exact, ref, (size_t)oh * ow * 3);
      char sc[8];
      snprintf(sc, sizeof(sc), "%d", info.scale);
      if (strstr(scales, sc) == NULL && strlen(scales) < 50) {
        strcat(scales, sc);
        strcat(scales, info.progressive ? "p " : " ");
      }
    }
    printf("  %-38s %4dx%-4d s/8 {%s} %6.2f %3d ; %d\n", photos[i].name, w,
           h, scales, psnr(&a), a.maxerr, ax.maxerr);
    if (psnr(&a) < worst_psnr)
      worst_psnr = psnr(&a);
    all.sq += a.sq;
    all.n += a.n;
    if (a.maxerr > all.maxerr)
      all.maxerr = a.maxerr;
    all_exact.sq += ax.sq;
    all_exact.n += ax.n;
    if (ax.maxerr > all_exact.maxerr)
      all_exact.maxerr = ax.maxerr;
  }
  ferry_jpeg_crop_stats_t st;
  ferry__jpeg_crop_stats(j, &st);
  printf("accuracy %s: %zu photos x %d crops: fused PSNR %.2f dB (worst "
         "image %.2f), max err %d; exact max err %d; fused %llu, "
         "progressive %llu, full %llu\n",
         label, n, crops, psnr(&all), worst_psnr, all.maxerr,
         all_exact.maxerr, (unsigned long long)st.fused,
         (unsigned long long)st.progressive, (unsigned long long)st.full);
  cr_assert_leq(all_exact.maxerr, 1, "exact path off by %d",
                all_exact.maxerr);
  cr_assert_geq(worst_psnr, bd->min_psnr_image);
  cr_assert_geq(psnr(&all), bd->min_psnr_all);
  cr_assert_leq(all.maxerr, bd->max_err);
  for (size_t i = 0; i < n; i++)
    free(photos[i].data);
  free(full);
  free(fused);
  free(exact);
  free(ref);
  ferry__jpeg_free(j);
}

Test(crop, accuracy_random_resized_crop_224, .timeout = 240) {
  ferry_crop_op_t op = {.kind = FERRY_CROP_RANDOM_RESIZED,
                        .out_h = 224,
                        .out_w = 224,
                        .rrc = {0.08, 1.0, 3.0 / 4.0, 4.0 / 3.0}};
  accuracy_run("random_resized_crop(224)", op, 8, &gap1_bounds);
}

Test(crop, accuracy_random_resized_crop_112, .timeout = 240) {
  /* Half of 224: the 500x375 photos reach the scales 4/8 and 2/8 here. */
  ferry_crop_op_t op = {.kind = FERRY_CROP_RANDOM_RESIZED,
                        .out_h = 112,
                        .out_w = 112,
                        .rrc = {0.08, 1.0, 3.0 / 4.0, 4.0 / 3.0}};
  accuracy_run("random_resized_crop(112)", op, 8, &gap1_bounds);
}

Test(crop, accuracy_random_resized_crop_40_gap2, .timeout = 240) {
  /* 40, not 224: these photos are small enough that gap 2 at 224 is
   * always scale 8/8, bitwise the exact path. */
  ferry_crop_op_t op = {.kind = FERRY_CROP_RANDOM_RESIZED,
                        .out_h = 40,
                        .out_w = 40,
                        .rrc = {0.08, 1.0, 3.0 / 4.0, 4.0 / 3.0},
                        .gap = 2.0};
  accuracy_run("random_resized_crop(40), gap 2", op, 8, &gap2_bounds);
}

Test(crop, accuracy_resize_256_center_crop_224, .timeout = 240) {
  ferry_crop_op_t op = {.kind = FERRY_CROP_RESIZE_CENTER,
                        .out_h = 224,
                        .out_w = 224,
                        .shorter = 256};
  accuracy_run("resize(256) | center_crop(224)", op, 1, &gap1_bounds);
}

Test(crop, accuracy_random_resized_crop_64, .timeout = 240) {
  /* Small outputs: the DCT scales 1/8 and 2/8 do most of the work. */
  ferry_crop_op_t op = {.kind = FERRY_CROP_RANDOM_RESIZED,
                        .out_h = 64,
                        .out_w = 48,
                        .rrc = {0.08, 1.0, 3.0 / 4.0, 4.0 / 3.0}};
  accuracy_run("random_resized_crop(64, 48)", op, 8, &gap1_bounds);
}

/* ---------------------------------------------------------------------
 * Cross-check against the real torchvision (Debian's python3-torchvision
 * under /usr/bin/python3), skipped with a reason when it is absent: the
 * resampler against F.resized_crop(antialias=True) on float tensors, and
 * Resize(S) / CenterCrop geometry against F.resize / F.center_crop.
 */
#define TV_PYTHON "/usr/bin/python3"

static const char tv_script[] =
    "import sys, struct, torch\n"
    "import torchvision.transforms.functional as F\n"
    "d = open(sys.argv[1], 'rb').read()\n"
    "h, w, t, l, bh, bw, oh, ow = struct.unpack('8i', d[:32])\n"
    "x = torch.frombuffer(bytearray(d[32:]), dtype=torch.uint8)\n"
    "x = x.reshape(h, w, 3).permute(2, 0, 1).float()\n"
    "y = F.resized_crop(x, t, l, bh, bw, [oh, ow], antialias=True)\n"
    "y = y.round().clamp(0, 255).to(torch.uint8).permute(1, 2, 0)\n"
    "open(sys.argv[2], 'wb').write(y.contiguous().numpy().tobytes())\n"
    "g = []\n"
    "for (H, W, S, C) in [(375, 500, 256, 224), (500, 333, 256, 224),\n"
    "                     (100, 100, 7, 5), (229, 231, 229, 224),\n"
    "                     (10, 20, 10, 15), (768, 256, 113, 100)]:\n"
    "    r = F.resize(torch.zeros(1, H, W), S, antialias=True)\n"
    "    idx = torch.arange(1, H * W + 1, dtype=torch.float64)\n"
    "    c = F.center_crop(idx.reshape(1, H, W), [C, C])\n"
    "    nz = (c[0] > 0).nonzero()\n"
    "    first = int(c[0][nz[0][0], nz[0][1]].item()) - 1\n"
    "    top = first // W - int(nz[0][0]); left = first % W - int(nz[0][1])\n"
    "    g.append('%d %d %d %d' % (r.shape[1], r.shape[2], top, left))\n"
    "open(sys.argv[3], 'w').write('\\n'.join(g) + '\\n')\n";

static int have_torchvision(void) {
  return system(TV_PYTHON " -c 'import torchvision' > /dev/null 2>&1") == 0;
}

Test(crop, cross_check_with_torchvision, .timeout = 240) {
  if (!have_torchvision()) {
    printf("skip: " TV_PYTHON " cannot import torchvision "
           "(apt-get install python3-torchvision)\n");
    cr_skip_test("torchvision is absent");
  }
  char dir[] = "/tmp/ferry-tv-XXXXXX";
  cr_assert_not_null(mkdtemp(dir));
  char py[300], in[300], out[300], geo[300], cmd[1400];
  snprintf(py, sizeof(py), "%s/check.py", dir);
  snprintf(in, sizeof(in), "%s/in.bin", dir);
  snprintf(out, sizeof(out), "%s/out.bin", dir);
  snprintf(geo, sizeof(geo), "%s/geo.txt", dir);
  FILE *f = fopen(py, "w");
  cr_assert_not_null(f);
  fputs(tv_script, f);
  fclose(f);
  ferry_resampler_t *r;
  cr_assert_eq(ferry__resampler_new(&r, NULL), 0);
  uint64_t s = 99;
  printf("torchvision cross-check: seed 99\n");
  /* A smooth and a noisy image; downscales, upscales, odd boxes. */
  static const int cfg[][8] = {
      {150, 200, 10, 20, 120, 170, 224, 224}, {150, 200, 0, 0, 150, 200, 37, 61},
      {150, 200, 30, 40, 20, 30, 224, 200},   {150, 200, 5, 7, 143, 9, 64, 64},
      {64, 48, 0, 0, 64, 48, 1, 1},           {64, 48, 3, 2, 59, 41, 130, 20}};
  for (size_t t = 0; t < sizeof(cfg) / sizeof(cfg[0]); t++) {
    int h = cfg[t][0], w = cfg[t][1], oh = cfg[t][6], ow = cfg[t][7];
    size_t n = (size_t)h * w * 3;
    uint8_t *img = malloc(n), *mine = malloc((size_t)oh * ow * 3),
            *theirs = malloc((size_t)oh * ow * 3);
    for (size_t i = 0; i < n; i++)
      img[i] = t % 2 ? (uint8_t)lcg(&s)
                     : (uint8_t)(128 + 100 * sin((double)i * 0.013));
    f = fopen(in, "wb");
    fwrite(cfg[t], sizeof(int), 8, f);
    fwrite(img, 1, n, f);
    fclose(f);
    snprintf(cmd, sizeof(cmd), TV_PYTHON " %s %s %s %s", py, in, out, geo);
    cr_assert_eq(system(cmd), 0, "%s failed", cmd);
    f = fopen(out, "rb");
    cr_assert_eq(fread(theirs, 1, (size_t)oh * ow * 3, f),
                 (size_t)oh * ow * 3);
    fclose(f);
    ferry_box_t box = {cfg[t][2], cfg[t][3], cfg[t][4], cfg[t][5]};
    ferry_window_t win;
    ferry__window_of_box(&box, &win);
    cr_assert_eq(ferry__resample(r, img, h, w, (size_t)w * 3, 3, &win, mine, oh,
                                 ow, NULL),
                 0);
    int worst = 0;
    for (size_t i = 0; i < (size_t)oh * ow * 3; i++) {
      int d = abs((int)mine[i] - (int)theirs[i]);
      if (d > worst)
        worst = d;
    }
    printf("torchvision cross-check: %dx%d box %d,%d %dx%d -> %dx%d: max "
           "|ferry - torchvision| = %d\n",
           h, w, box.top, box.left, box.height, box.width, oh, ow, worst);
    cr_assert_leq(worst, 1);
    free(img);
    free(mine);
    free(theirs);
  }
  /* Geometry. */
  static const int geo_in[][4] = {{375, 500, 256, 224}, {500, 333, 256, 224},
                                  {100, 100, 7, 5},     {229, 231, 229, 224},
                                  {10, 20, 10, 15},     {768, 256, 113, 100}};
  f = fopen(geo, "r");
  cr_assert_not_null(f);
  for (size_t t = 0; t < sizeof(geo_in) / sizeof(geo_in[0]); t++) {
    int th, tw, ttop, tleft, mh, mw;
    ferry_box_t b;
    cr_assert_eq(fscanf(f, "%d %d %d %d", &th, &tw, &ttop, &tleft), 4);
    ferry__resize_shorter_size(geo_in[t][0], geo_in[t][1], geo_in[t][2], &mh,
                               &mw);
    ferry__center_crop_box(geo_in[t][0], geo_in[t][1], geo_in[t][3],
                           geo_in[t][3], &b);
    cr_assert(mh == th && mw == tw, "resize(%d) of %dx%d: %dx%d, torchvision "
              "%dx%d", geo_in[t][2], geo_in[t][0], geo_in[t][1], mh, mw, th,
              tw);
    cr_assert(b.top == ttop && b.left == tleft,
              "center_crop(%d) of %dx%d: (%d, %d), torchvision (%d, %d)",
              geo_in[t][3], geo_in[t][0], geo_in[t][1], b.top, b.left, ttop,
              tleft);
  }
  fclose(f);
  printf("torchvision cross-check: Resize(S) and CenterCrop geometry equal on "
         "6 shapes\n");
  snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
  cr_assert_eq(system(cmd), 0);
  ferry__resampler_free(r);
}

/* The baseline and AVX2 paths of the resampler give the same bits (the
 * same float operations in the same order, no contraction). */
Test(crop, resampler_paths_are_bitwise_equal) {
  if (ferry__imgops_set_isa("avx2") != 0) {
    printf("skip: the CPU has no AVX2\n");
    cr_skip_test("no AVX2");
  }
  uint64_t s = 4242;
  ferry_resampler_t *r;
  cr_assert_eq(ferry__resampler_new(&r, NULL), 0);
  for (int it = 0; it < 60; it++) {
    int h = 1 + (int)(lcg(&s) % 200), w = 1 + (int)(lcg(&s) % 200);
    int oh = 1 + (int)(lcg(&s) % 150), ow = 1 + (int)(lcg(&s) % 150);
    int c = 1 + it % 4;
    uint8_t *img = malloc((size_t)h * w * c), *a = malloc((size_t)oh * ow * c),
            *b = malloc((size_t)oh * ow * c);
    for (size_t i = 0; i < (size_t)h * w * c; i++)
      img[i] = (uint8_t)lcg(&s);
    ferry_box_t box = {0, 0, h, w};
    ferry_window_t win;
    ferry__window_of_box(&box, &win);
    cr_assert_eq(ferry__imgops_set_isa("avx2"), 0);
    cr_assert_eq(
        ferry__resample(r, img, h, w, (size_t)w * c, c, &win, a, oh, ow, NULL),
        0);
    cr_assert_eq(ferry__imgops_set_isa("scalar"), 0);
    cr_assert_eq(
        ferry__resample(r, img, h, w, (size_t)w * c, c, &win, b, oh, ow, NULL),
        0);
    cr_assert(memcmp(a, b, (size_t)oh * ow * c) == 0,
              "seed 4242 iteration %d: %dx%dx%d to %dx%d differs", it, h, w,
              c, oh, ow);
    free(img);
    free(a);
    free(b);
  }
  ferry__resampler_free(r);
}
