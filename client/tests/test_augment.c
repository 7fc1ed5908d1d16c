/* The augmentation's CPU twin: the spec parser, the generator, each op
 * against values computed by hand or by a separate double-precision
 * implementation of the OPS.md formulas (written here, not shared with
 * the library), the conversions against known bit patterns, the layouts,
 * exact against fused mode, memory and size limits.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "augment.h"
#include "ferry/augment.h"

/* ---------------------------------------------------------------------
 * Helpers and the double-precision reference.
 */

static uint64_t lcg_state = 1;

static uint32_t lcg(void) {
  lcg_state = lcg_state * 6364136223846793005ull + 1442695040888963407ull;
  return (uint32_t)(lcg_state >> 33);
}

static uint8_t *random_images(size_t n, int h, int w, int c) {
  size_t len = n * (size_t)h * w * c;
  uint8_t *p = malloc(len);
  for (size_t i = 0; i < len; i++)
    p[i] = (uint8_t)lcg();
  return p;
}

/* Smooth images: nearby pixels differ by a few levels, so two
 * resamplings and one stay close. */
static uint8_t *smooth_images(size_t n, int h, int w, int c) {
  uint8_t *p = malloc(n * (size_t)h * w * c);
  for (size_t i = 0; i < n; i++)
    for (int y = 0; y < h; y++)
      for (int x = 0; x < w; x++)
        for (int k = 0; k < c; k++)
          p[((i * h + y) * w + x) * c + k] = (uint8_t)(
              127.5 + 120 * sin(0.15 * x + 0.1 * k + (double)i) *
                          cos(0.11 * y - 0.2 * k));
  return p;
}

static ferry_augment_spec_t parse_ok(const char *text) {
  ferry_augment_spec_t s;
  ferry_error_t err = {0};
  cr_assert_eq(ferry_augment_spec_parse(text, &s, &err), 0, "%s: %s", text,
               err.msg);
  return s;
}

/* OPS.md's reflect (edge repeated), then the clamp, in double. */
static double ref_reflect(double x, int len) {
  double l2 = 2.0 * len;
  if (x < 0) {
    x = l2 * trunc(-x / l2) + x;
    x = (x < -len) ? x + l2 : -x - 1;
  }
  if (x > len - 1) {
    x -= l2 * trunc(x / l2);
    if (x >= len)
      x = l2 - x - 1;
  }
  return x < 0 ? 0 : (x > len - 1 ? len - 1 : x);
}

/* Reads a double image (h x w x c); taps off the image are 0. */
static double ref_px(const double *img, int h, int w, int c, int x, int y,
                     int k) {
  if (x < 0 || y < 0 || x >= w || y >= h)
    return 0;
  return img[((size_t)y * w + x) * c + k];
}

static double ref_bilinear(const double *img, int h, int w, int c, double x,
                           double y, int k) {
  x = ref_reflect(x, w);
  y = ref_reflect(y, h);
  double x0 = floor(x), y0 = floor(y), fx = x - x0, fy = y - y0;
  int ix = (int)x0, iy = (int)y0;
  return (1 - fy) * ((1 - fx) * ref_px(img, h, w, c, ix, iy, k) +
                     fx * ref_px(img, h, w, c, ix + 1, iy, k)) +
         fy * ((1 - fx) * ref_px(img, h, w, c, ix, iy + 1, k) +
               fx * ref_px(img, h, w, c, ix + 1, iy + 1, k));
}

/* One image through flip, rotate, zoom and rescale in double, as Keras
 * would (exact: two resamplings) or composed into one map. */
static void ref_image(const uint8_t *in, int h, int w, int c,
                      const ferry_augment_params_t *p, bool rot, bool zoom,
                      bool exact, double scale, double *out) {
  size_t len = (size_t)h * w * c;
  double *src = malloc(len * sizeof(double));
  double *mid = malloc(len * sizeof(double));
  double t = p->angle, z = p->zoom, ct = cos(t), st = sin(t);
  double W1 = w - 1, H1 = h - 1;
  double a2 = (W1 - (ct * W1 - st * H1)) / 2;
  double b2 = (H1 - (st * W1 + ct * H1)) / 2;
  for (int y = 0; y < h; y++)
    for (int x = 0; x < w; x++)
      for (int k = 0; k < c; k++)
        src[((size_t)y * w + x) * c + k] =
            in[((size_t)y * w + (p->flip ? w - 1 - x : x)) * c + k];
  for (int y = 0; y < h; y++)
    for (int x = 0; x < w; x++) {
      double xz = x, yz = y;
      if (zoom) {
        xz = z * x + W1 / 2 * (1 - z);
        yz = z * y + H1 / 2 * (1 - z);
      }
      for (int k = 0; k < c; k++) {
        double v;
        size_t o = ((size_t)y * w + x) * c + k;
        if (!rot && !zoom) {
          v = src[o];
        } else if (!exact || !rot || !zoom) {
          double xr = xz, yr = yz;
          if (rot) {
            xr = ct * xz - st * yz + a2;
            yr = st * xz + ct * yz + b2;
          }
          v = ref_bilinear(src, h, w, c, xr, yr, k);
        } else {
          v = 0; /* second pass below */
        }
        out[o] = v;
        if (rot) /* exact mode's first pass: rotation of the flipped image */
          mid[o] = ref_bilinear(src, h, w, c, ct * x - st * y + a2,
                                st * x + ct * y + b2, k);
      }
    }
  if (exact && rot && zoom)
    for (int y = 0; y < h; y++)
      for (int x = 0; x < w; x++)
        for (int k = 0; k < c; k++)
          out[((size_t)y * w + x) * c + k] = ref_bilinear(
              mid, h, w, c, z * x + W1 / 2 * (1 - z),
              z * y + H1 / 2 * (1 - z), k);
  for (size_t i = 0; i < len; i++)
    out[i] *= scale;
  free(src);
  free(mid);
}

/* Runs the twin on one batch and checks every image against ref_image. */
static void check_against_ref(const char *text, uint64_t seed, int n, int h,
                              int w, int c, double tol) {
  ferry_augment_spec_t s = parse_ok(text);
  uint8_t *in = random_images(n, h, w, c);
  size_t img = (size_t)h * w * c;
  float *out = malloc(n * img * sizeof(float));
  double *ref = malloc(img * sizeof(double));
  ferry_error_t err = {0};
  cr_assert_eq(ferry_augment_batch_cpu(&s, seed, 3, 7, in, n, h, w, c, out,
                                       FERRY_DTYPE_FLOAT32,
                                       FERRY_LAYOUT_NHWC, &err),
               0, "%s", err.msg);
  for (int i = 0; i < n; i++) {
    ferry_augment_params_t p;
    ferry_augment_params(&s, seed, 3, 7, i, &p);
    ref_image(in + i * img, h, w, c, &p, s.rotate > 0, s.zoom > 0, s.exact,
              s.rescale ? s.scale : 1.0, ref);
    for (size_t j = 0; j < img; j++)
      cr_assert(fabs(out[i * img + j] - ref[j]) <= tol,
                "%s: image %d element %zu: %.6f vs reference %.6f", text, i,
                j, out[i * img + j], ref[j]);
  }
  free(in);
  free(out);
  free(ref);
}

/* ---------------------------------------------------------------------
 * The spec.
 */

Test(augment_spec, parses_the_full_form) {
  ferry_augment_spec_t s = parse_ok(
      "flip(horizontal) | rotate(0.1) | zoom(0.1) | rescale(1/255)");
  cr_assert_eq(s.flip, FERRY_FLIP_HORIZONTAL);
  cr_assert_eq(s.rotate, 0.1f);
  cr_assert_eq(s.zoom, 0.1f);
  cr_assert(s.rescale);
  cr_assert_eq(s.scale, (float)(1.0 / 255.0));
  cr_assert(!s.exact);
  char buf[200];
  ferry_augment_spec_format(&s, buf, sizeof(buf));
  cr_assert_str_eq(buf, "flip(horizontal) | rotate(0.100000001) | "
                        "zoom(0.100000001) | rescale(0.00392156886)");
  ferry_augment_spec_t again = parse_ok(buf);
  cr_assert(again.flip == s.flip && again.rotate == s.rotate &&
            again.zoom == s.zoom && again.rescale == s.rescale &&
            again.scale == s.scale && again.exact == s.exact);
  ferry_augment_spec_close(&s);
}

Test(augment_spec, other_forms) {
  ferry_augment_spec_t s = parse_ok("  flip( none )|zoom(.5)|exact  ");
  cr_assert_eq(s.flip, FERRY_FLIP_NONE);
  cr_assert_eq(s.zoom, 0.5f);
  cr_assert(s.exact);
  s = parse_ok("exact() | rotate(0) | rescale(0.5)");
  cr_assert(s.exact);
  cr_assert_eq(s.rotate, 0.0f);
  cr_assert_eq(s.scale, 0.5f);
  s = parse_ok("rescale(2e-1/4)");
  cr_assert_eq(s.scale, (float)(0.2 / 4));
  s = parse_ok("");
  cr_assert(!s.rescale && s.rotate == 0 && s.zoom == 0 && !s.exact);
  cr_assert_eq(s.scale, 1.0f);
  s = parse_ok("rotate(0.99999999)");
  cr_assert_lt(s.rotate, 1.0f);
}

static void parse_fails(const char *text, const char *needle) {
  ferry_augment_spec_t s;
  ferry_error_t err = {0};
  cr_assert_eq(ferry_augment_spec_parse(text, &s, &err), FERRY_ESPEC,
               "accepted: %s", text);
  cr_assert_eq(err.code, FERRY_ESPEC);
  cr_assert(strstr(err.msg, needle) != NULL, "%s: message '%s' lacks '%s'",
            text, err.msg, needle);
  /* A failed parse leaves the identity behind. */
  cr_assert(s.flip == FERRY_FLIP_NONE && s.rotate == 0 && !s.rescale);
}

Test(augment_spec, negative_zero_is_zero) {
  /* Found by fuzz_augment: "rotate(-0)" parsed to -0.0f, formatted as no
   * rotate at all, and read back as +0.0f: two forms of one spec. */
  ferry_augment_spec_t s;
  ferry_error_t err;
  ferry_augment_spec_init(&s);
  cr_assert_eq(ferry_augment_spec_parse("rotate(-0) | zoom(-0.0)", &s, &err),
               0, "%s", err.msg);
  cr_assert_not(signbit(s.rotate));
  cr_assert_not(signbit(s.zoom));
  ferry_augment_spec_close(&s);
}

Test(augment_spec, errors_name_the_column) {
  parse_fails("flip(horizontal) | rotate(1.5)", "column 27: rotate factor");
  parse_fails("rotate(-0.1)", "column 8: rotate factor -0.1 is outside");
  parse_fails("zoom(0.1) | rotate(0.1)", "column 13: rotate after zoom");
  parse_fails("rotate(0.1) | rotate(0.2)", "column 15: rotate given twice");
  parse_fails("flip(horizontal) | blur(3)", "column 20: expected an op");
  parse_fails("flip(vertical)", "column 6: flip mode 'vertical'");
  parse_fails("flip(sideways)", "column 6: expected horizontal or none");
  parse_fails("rotate(0.1", "column 11: expected ')', found the end");
  parse_fails("rotate 0.1", "column 8: expected '('");
  parse_fails("rescale(1/0)", "column 11: rescale denominator is 0");
  parse_fails("rescale(1e39)", "not a finite float");
  parse_fails("rescale(1/)", "column 11: expected a denominator");
  parse_fails("zoom(abc)", "column 6: expected a factor in [0, 1) for zoom");
  parse_fails("zoom(0.1) zoom", "column 11: expected '|' or the end");
  parse_fails("zoom(0.1) |", "column 12: expected an op");
  parse_fails("exact(1)", "column 7: expected ')'");
  parse_fails("flip(horizontal) |\n  rotate(2)", "line 2, column 10");
  parse_fails("zoom(0.1) | \x01", "byte 0x01");
  ferry_error_t err = {0};
  ferry_augment_spec_t s;
  cr_assert_eq(ferry_augment_spec_parse(NULL, &s, &err), FERRY_EINVAL);
}

/* ---------------------------------------------------------------------
 * The generator.
 */

Test(augment_params, reproducible_and_keyed) {
  ferry_augment_spec_t s = parse_ok("flip(horizontal) | rotate(0.1) | "
                                    "zoom(0.1)");
  ferry_augment_params_t a, b;
  ferry_augment_params(&s, 42, 1, 2, 3, &a);
  ferry_augment_params(&s, 42, 1, 2, 3, &b);
  cr_assert(a.flip == b.flip && a.angle == b.angle && a.zoom == b.zoom);
  /* Each key component changes the draws. */
  uint64_t keys[4][4] = {{43, 1, 2, 3}, {42, 2, 2, 3}, {42, 1, 3, 3},
                         {42, 1, 2, 4}};
  for (int i = 0; i < 4; i++) {
    ferry_augment_params(&s, keys[i][0], keys[i][1], keys[i][2], keys[i][3],
                         &b);
    cr_assert(a.angle != b.angle && a.zoom != b.zoom, "key %d", i);
  }
  /* Turning an op off leaves the other ops' draws alone. */
  ferry_augment_spec_t only_zoom = parse_ok("zoom(0.1)");
  ferry_augment_params(&only_zoom, 42, 1, 2, 3, &b);
  cr_assert_eq(b.zoom, a.zoom);
  cr_assert_eq(b.angle, 0.0f);
  cr_assert(!b.flip);
}

Test(augment_params, distribution) {
  ferry_augment_spec_t s = parse_ok("flip(horizontal) | rotate(0.1) | "
                                    "zoom(0.1)");
  const float bound = 0.1f * 6.28318548f;
  int flips = 0;
  double asum = 0, amin = 10, amax = -10, zmin = 10, zmax = -10;
  for (int i = 0; i < 10000; i++) {
    ferry_augment_params_t p;
    ferry_augment_params(&s, 7, 0, (uint64_t)i / 100, (uint64_t)i % 100, &p);
    flips += p.flip;
    cr_assert(p.angle >= -bound && p.angle < bound, "%g", p.angle);
    cr_assert(p.zoom >= 0.9f && p.zoom < 1.1f, "%g", p.zoom);
    asum += p.angle;
    amin = fmin(amin, p.angle);
    amax = fmax(amax, p.angle);
    zmin = fmin(zmin, p.zoom);
    zmax = fmax(zmax, p.zoom);
  }
  /* Binomial(10000, 0.5): sd 50; 4 sd either side. */
  cr_assert(flips > 4800 && flips < 5200, "%d flips", flips);
  /* The mean of U(-b, b) over 10000 draws: sd b / sqrt(30000). */
  cr_assert_lt(fabs(asum / 10000), 4 * bound / sqrt(30000.0));
  cr_assert(amin < -0.99 * bound && amax > 0.99 * bound);
  cr_assert(zmin < 0.901 && zmax > 1.099);
}

Test(augment_params, sincos_matches_libm) {
  for (int i = -2000; i <= 2000; i++) {
    double t = i * (6.2831853 / 2000), s, c;
    ferry__aug_sincos(t, &s, &c);
    cr_assert(fabs(s - sin(t)) < 1e-15 && fabs(c - cos(t)) < 1e-15,
              "t=%.17g: %.17g %.17g", t, s, c);
  }
}

/* ---------------------------------------------------------------------
 * The ops, one by one.
 */

Test(augment_ops, reflect_edges) {
  /* Integer coordinates in [-2L, 3L]: d c b a | a b c d | d c b a. */
  for (int len = 2; len <= 6; len++) {
    for (int x = -2 * len; x <= 3 * len; x++) {
      int m = ((x % (2 * len)) + 2 * len) % (2 * len);
      int want = m < len ? m : 2 * len - 1 - m;
      cr_assert_eq(ferry__aug_reflect((float)x, len), (float)want,
                   "L=%d x=%d", len, x);
      cr_assert_eq(ref_reflect(x, len), want);
    }
  }
  /* Hand-computed for L = 4: a coordinate between the edge and its
   * mirror clamps to the edge. */
  cr_assert_eq(ferry__aug_reflect(-0.25f, 4), 0.0f);
  cr_assert_eq(ferry__aug_reflect(-1.25f, 4), 0.25f);
  cr_assert_eq(ferry__aug_reflect(3.5f, 4), 3.0f);
  cr_assert_eq(ferry__aug_reflect(4.5f, 4), 2.5f);
  cr_assert_eq(ferry__aug_reflect(-4.5f, 4), 3.0f);
  cr_assert_eq(ferry__aug_reflect(-5.5f, 4), 2.5f);
  cr_assert_eq(ferry__aug_reflect(9.0f, 4), 1.0f);
  /* Fractional coordinates against the double formula. */
  for (int i = -400; i <= 600; i++) {
    float x = i * 0.0625f + 0.03125f;
    cr_assert(fabs(ferry__aug_reflect(x, 5) - ref_reflect(x, 5)) < 1e-6,
              "x=%g", x);
  }
}

Test(augment_ops, flip_is_exact) {
  ferry_augment_spec_t s = parse_ok("flip(horizontal) | rescale(1/255)");
  const int n = 16, h = 3, w = 5, c = 3;
  uint8_t *in = random_images(n, h, w, c);
  float out[16 * 3 * 5 * 3];
  const float scale = (float)(1.0 / 255.0);
  int flipped = 0;
  cr_assert_eq(ferry_augment_batch_cpu(&s, 9, 0, 0, in, n, h, w, c, out,
                                       FERRY_DTYPE_FLOAT32,
                                       FERRY_LAYOUT_NHWC, NULL),
               0);
  for (int i = 0; i < n; i++) {
    ferry_augment_params_t p;
    ferry_augment_params(&s, 9, 0, 0, i, &p);
    flipped += p.flip;
    for (int y = 0; y < h; y++)
      for (int x = 0; x < w; x++)
        for (int k = 0; k < c; k++) {
          int sx = p.flip ? w - 1 - x : x;
          float want = (float)in[((i * h + y) * w + sx) * c + k] * scale;
          cr_assert_eq(out[((i * h + y) * w + x) * c + k], want);
        }
  }
  cr_assert(flipped > 0 && flipped < n, "%d of %d flipped", flipped, n);
  /* flip(none) never flips; rescale multiplies, exactly. */
  s = parse_ok("flip(none) | rescale(1/255)");
  cr_assert_eq(ferry_augment_batch_cpu(&s, 9, 0, 0, in, n, h, w, c, out,
                                       FERRY_DTYPE_FLOAT32,
                                       FERRY_LAYOUT_NHWC, NULL),
               0);
  for (int j = 0; j < n * h * w * c; j++)
    cr_assert_eq(out[j], (float)in[j] * scale);
  cr_assert_eq((float)255 * scale, 1.0f);
  free(in);
}

/* A hand-made image whose value is 10 x + 50 y + k: bilinear reads of a
 * linear function are exact, so the expected pixels are the map's
 * coordinates. */
static void linear_image(uint8_t *img, int h, int w, int c) {
  for (int y = 0; y < h; y++)
    for (int x = 0; x < w; x++)
      for (int k = 0; k < c; k++)
        img[(y * w + x) * c + k] = (uint8_t)(10 * x + 50 * y + k);
}

static float pixel(const ferry_augment_spec_t *s,
                   const ferry_augment_params_t *p, const uint8_t *img, int h,
                   int w, int c, int x, int y, int k) {
  ferry__aug_img_t im;
  float out[16];
  ferry__aug_setup(s, p, w, h, &im);
  ferry__aug_pixel(&im, img, w, h, c, x, y, out, 0, 1, FERRY_DTYPE_FLOAT32);
  return out[k];
}

Test(augment_ops, rotation_by_hand) {
  /* 90 degrees counter-clockwise on 3x3 (rotate(0.3) allows it): with
   * a2 = 2, b2 = 0 the map is xin = 2 - y, yin = x. */
  ferry_augment_spec_t s = parse_ok("rotate(0.3)");
  ferry_augment_params_t p = {false, (float)(M_PI / 2), 1.0f};
  uint8_t img[3 * 3 * 2];
  linear_image(img, 3, 3, 2);
  for (int y = 0; y < 3; y++)
    for (int x = 0; x < 3; x++)
      for (int k = 0; k < 2; k++)
        cr_assert(fabsf(pixel(&s, &p, img, 3, 3, 2, x, y, k) -
                        (float)img[(x * 3 + (2 - y)) * 2 + k]) < 1e-4f,
                  "(%d, %d, %d)", x, y, k);
  /* 36 degrees on 5 wide x 4 high: output (0, 0) maps to
   * xin = a2 = (4 - (4 cos t - 3 sin t)) / 2 = 1.2636439,
   * yin = b2 = (3 - (4 sin t + 3 cos t)) / 2 = -0.8890960, which the
   * reflect takes to -yin - 1 = -0.1109040 and the clamp to 0: the value
   * is 10 * 1.2636439 = 12.636439 (channel 0). */
  p.angle = (float)(M_PI / 5);
  uint8_t img2[4 * 5 * 1];
  linear_image(img2, 4, 5, 1);
  cr_assert(fabsf(pixel(&s, &p, img2, 4, 5, 1, 0, 0, 0) - 12.636439f) <
            1e-4f);
  /* Output (2, 1) near the centre: xin = 2 cos t - sin t + a2 = 2.2938926,
   * yin = 2 sin t + cos t + b2 = 1.0954915; value 10 xin + 50 yin. */
  double t = M_PI / 5, a2 = (4 - (4 * cos(t) - 3 * sin(t))) / 2,
         b2 = (3 - (4 * sin(t) + 3 * cos(t))) / 2;
  double xin = 2 * cos(t) - sin(t) + a2, yin = 2 * sin(t) + cos(t) + b2;
  cr_assert(fabs(xin - 2.2938926) < 1e-6 && fabs(yin - 1.0954915) < 1e-6);
  cr_assert(fabsf(pixel(&s, &p, img2, 4, 5, 1, 2, 1, 0) - 77.713501f) < 1e-3f);
  cr_assert(fabsf(pixel(&s, &p, img2, 4, 5, 1, 2, 1, 0) -
                  (float)(10 * xin + 50 * yin)) < 1e-3f);
}

/* Finds a batch index whose image 0 draws an angle beyond `limit` times
 * the bound, on the side of `sign`. */
static uint64_t find_angle(const ferry_augment_spec_t *s, uint64_t seed,
                           int sign, double limit) {
  double bound = s->rotate * 2 * M_PI;
  for (uint64_t b = 0; b < 100000; b++) {
    ferry_augment_params_t p;
    ferry_augment_params(s, seed, 3, b, 0, &p);
    if (sign * p.angle > limit * bound)
      return b;
  }
  cr_assert_fail("no angle found");
  return 0;
}

Test(augment_ops, rotation_near_36_degrees) {
  ferry_augment_spec_t s = parse_ok("rotate(0.1)");
  const int h = 7, w = 5, c = 2;
  uint8_t *in = random_images(1, h, w, c);
  float out[7 * 5 * 2];
  double ref[7 * 5 * 2];
  for (int sign = -1; sign <= 1; sign += 2) {
    uint64_t b = find_angle(&s, 11, sign, 0.995);
    ferry_augment_params_t p;
    ferry_augment_params(&s, 11, 3, b, 0, &p);
    cr_assert(fabs(fabs(p.angle) * 180 / M_PI - 36) < 0.2, "%g", p.angle);
    cr_assert_eq(ferry_augment_batch_cpu(&s, 11, 3, b, in, 1, h, w, c, out,
                                         FERRY_DTYPE_FLOAT32,
                                         FERRY_LAYOUT_NHWC, NULL),
                 0);
    ref_image(in, h, w, c, &p, true, false, false, 1.0, ref);
    for (int j = 0; j < h * w * c; j++)
      cr_assert(fabs(out[j] - ref[j]) < 1e-2, "sign %d element %d: %g vs %g",
                sign, j, out[j], ref[j]);
  }
  free(in);
}

Test(augment_ops, zoom_by_hand) {
  /* 5x5, centre 2: xin = z x + 2 (1 - z). */
  ferry_augment_spec_t s = parse_ok("zoom(0.2)");
  ferry_augment_params_t p = {false, 0.0f, 1.1f};
  uint8_t img[5 * 5];
  linear_image(img, 5, 5, 1);
  /* z = 1.1: x = 0 -> -0.2, reflected to -0.8, clamped to 0; x = 1 ->
   * 0.9; x = 4 -> 4.2, reflected to 5.8 - 1... past L-1 with L = 5:
   * 4.2 < 5 stays, clamped to 4. Same for y. */
  cr_assert(fabsf(pixel(&s, &p, img, 5, 5, 1, 0, 0, 0) - 0.0f) < 1e-4f);
  cr_assert(fabsf(pixel(&s, &p, img, 5, 5, 1, 1, 0, 0) - 9.0f) < 1e-4f);
  cr_assert(fabsf(pixel(&s, &p, img, 5, 5, 1, 4, 4, 0) - 240.0f) < 1e-4f);
  cr_assert(fabsf(pixel(&s, &p, img, 5, 5, 1, 3, 1, 0) -
                  (10 * 3.1f + 50 * 0.9f)) < 1e-4f);
  /* z = 0.9 (zoom in): x = 0 -> 0.2, x = 4 -> 3.8. */
  p.zoom = 0.9f;
  cr_assert(fabsf(pixel(&s, &p, img, 5, 5, 1, 0, 0, 0) -
                  (10 * 0.2f + 50 * 0.2f)) < 1e-4f);
  cr_assert(fabsf(pixel(&s, &p, img, 5, 5, 1, 4, 2, 0) -
                  (10 * 3.8f + 50 * 2.0f)) < 1e-4f);
  /* And against the reference on random images, both factors. */
  for (int side = 0; side < 2; side++) {
    uint8_t *in = random_images(1, 6, 9, 3);
    float out[6 * 9 * 3];
    double ref[6 * 9 * 3];
    p.zoom = side ? 1.1f : 0.9f;
    ferry__aug_img_t im;
    ferry__aug_setup(&s, &p, 9, 6, &im);
    for (int y = 0; y < 6; y++)
      for (int x = 0; x < 9; x++)
        ferry__aug_pixel(&im, in, 9, 6, 3, x, y, out, (y * 9 + x) * 3, 1,
                         FERRY_DTYPE_FLOAT32);
    ref_image(in, 6, 9, 3, &p, false, true, false, 1.0, ref);
    for (int j = 0; j < 6 * 9 * 3; j++)
      cr_assert(fabs(out[j] - ref[j]) < 1e-3, "z %g element %d", p.zoom, j);
    free(in);
  }
}

Test(augment_ops, whole_chain_against_reference) {
  check_against_ref("flip(horizontal) | rotate(0.1) | zoom(0.1) | "
                    "rescale(1/255)",
                    5, 12, 9, 13, 3, 1e-4);
  check_against_ref("flip(horizontal) | rotate(0.1) | zoom(0.1) | exact",
                    6, 12, 9, 13, 3, 1e-2);
  check_against_ref("rotate(0.45) | zoom(0.5)", 8, 12, 2, 3, 1, 1e-2);
  check_against_ref("zoom(0.3) | exact", 9, 4, 16, 16, 4, 1e-2);
}

/* ---------------------------------------------------------------------
 * Conversions and layouts.
 */

static float from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

Test(augment_convert, float16_bit_patterns) {
  struct {
    float f;
    uint16_t h;
  } cases[] = {
      {1.0f, 0x3C00},
      {-2.0f, 0xC000},
      {0.5f, 0x3800},
      {0.0f, 0x0000},
      {-0.0f, 0x8000},
      {0.1f, 0x2E66},
      {1.0f / 3, 0x3555},
      {65504.0f, 0x7BFF},
      {65519.0f, 0x7BFF},
      {65520.0f, 0x7C00}, /* the tie above the largest float16: even = inf */
      {1e10f, 0x7C00},
      {INFINITY, 0x7C00},
      {-INFINITY, 0xFC00},
      {1.0f + 0x1p-11f, 0x3C00},     /* tie: down to even */
      {1.0f + 3 * 0x1p-11f, 0x3C02}, /* tie: up to even */
      {1.0f + 0x1p-11f + 0x1p-20f, 0x3C01},
      {0x1p-14f, 0x0400},           /* smallest normal */
      {0x1p-24f, 0x0001},           /* smallest subnormal */
      {0x1p-25f, 0x0000},           /* tie: down to even 0 */
      {0x1p-25f + 0x1p-40f, 0x0001},
      {3 * 0x1p-25f, 0x0002},       /* tie: up to even */
      {5 * 0x1p-25f, 0x0002},       /* tie: down to even */
      {1023 * 0x1p-24f, 0x03FF},    /* largest subnormal */
      {2047 * 0x1p-25f, 0x0400},    /* rounds up into the normals */
      {-0x1p-24f, 0x8001},
      {1e-10f, 0x0000},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
    cr_assert_eq(ferry__aug_f32_to_f16(cases[i].f), cases[i].h,
                 "%a: 0x%04x, want 0x%04x", cases[i].f,
                 ferry__aug_f32_to_f16(cases[i].f), cases[i].h);
  uint16_t n = ferry__aug_f32_to_f16(NAN);
  cr_assert((n & 0x7C00) == 0x7C00 && (n & 0x3FF) != 0, "0x%04x", n);
  n = ferry__aug_f32_to_f16(from_bits(0x7F800001)); /* signalling NaN */
  cr_assert((n & 0x7C00) == 0x7C00 && (n & 0x200) != 0, "0x%04x", n);
#ifdef __FLT16_MAX__
  /* The compiler's own conversion rounds to nearest even too. */
  for (int i = 0; i < 2000000; i++) {
    uint32_t u = (uint32_t)lcg() << 1 ^ lcg();
    float f = from_bits(u);
    _Float16 g = (_Float16)f;
    uint16_t want;
    memcpy(&want, &g, 2);
    if (f != f)
      continue;
    cr_assert_eq(ferry__aug_f32_to_f16(f), want, "%a", f);
  }
#endif
}

Test(augment_convert, bfloat16_bit_patterns) {
  struct {
    float f;
    uint16_t b;
  } cases[] = {
      {1.0f, 0x3F80},
      {-1.5f, 0xBFC0},
      {0.1f, 0x3DCD},
      {1.0f + 0x1p-8f, 0x3F80},     /* tie: down to even */
      {1.0f + 3 * 0x1p-8f, 0x3F82}, /* tie: up to even */
      {1.0f + 0x1p-8f + 0x1p-20f, 0x3F81},
      {INFINITY, 0x7F80},
      {-INFINITY, 0xFF80},
      {3.4028235e38f, 0x7F80}, /* the largest float rounds to inf */
      {0x1p-133f, 0x0001},     /* float subnormals round like the rest */
      {0x1p-134f, 0x0000},     /* tie: down to even 0 */
      {3 * 0x1p-134f, 0x0002}, /* tie: up to even */
      {-0.0f, 0x8000},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
    cr_assert_eq(ferry__aug_f32_to_bf16(cases[i].f), cases[i].b,
                 "%a: 0x%04x, want 0x%04x", cases[i].f,
                 ferry__aug_f32_to_bf16(cases[i].f), cases[i].b);
  uint16_t n = ferry__aug_f32_to_bf16(from_bits(0x7F800001));
  cr_assert((n & 0x7F80) == 0x7F80 && (n & 0x7F) != 0, "0x%04x", n);
  cr_assert_eq(ferry__aug_f32_to_bf16(from_bits(0xFFC00000)), 0xFFC0);
}

Test(augment_convert, dtypes_and_layouts_agree) {
  ferry_augment_spec_t s = parse_ok("flip(horizontal) | rotate(0.1) | "
                                    "zoom(0.1) | rescale(1/255)");
  const int n = 5, h = 7, w = 9, c = 3;
  size_t len = (size_t)n * h * w * c;
  uint8_t *in = random_images(n, h, w, c);
  float *f32 = malloc(len * 4), *f32c = malloc(len * 4);
  uint16_t *half = malloc(len * 2), *halfc = malloc(len * 2);
  uint16_t *bf = malloc(len * 2), *bfc = malloc(len * 2);
  ferry_dtype_t dt[3] = {FERRY_DTYPE_FLOAT32, FERRY_DTYPE_FLOAT16,
                         FERRY_DTYPE_BFLOAT16};
  void *nhwc[3] = {f32, half, bf}, *nchw[3] = {f32c, halfc, bfc};
  for (int d = 0; d < 3; d++) {
    cr_assert_eq(ferry_augment_batch_cpu(&s, 1, 2, 3, in, n, h, w, c,
                                         nhwc[d], dt[d], FERRY_LAYOUT_NHWC,
                                         NULL),
                 0);
    cr_assert_eq(ferry_augment_batch_cpu(&s, 1, 2, 3, in, n, h, w, c,
                                         nchw[d], dt[d], FERRY_LAYOUT_NCHW,
                                         NULL),
                 0);
  }
  for (int i = 0; i < n; i++)
    for (int y = 0; y < h; y++)
      for (int x = 0; x < w; x++)
        for (int k = 0; k < c; k++) {
          size_t a = (((size_t)i * h + y) * w + x) * c + k;
          size_t b = (((size_t)i * c + k) * h + y) * w + x;
          cr_assert_eq(memcmp(&f32[a], &f32c[b], 4), 0);
          cr_assert_eq(half[a], halfc[b]);
          cr_assert_eq(bf[a], bfc[b]);
          cr_assert_eq(half[a], ferry__aug_f32_to_f16(f32[a]));
          cr_assert_eq(bf[a], ferry__aug_f32_to_bf16(f32[a]));
        }
  free(in);
  free(f32);
  free(f32c);
  free(half);
  free(halfc);
  free(bf);
  free(bfc);
}

/* ---------------------------------------------------------------------
 * Exact mode, memory, limits.
 */

Test(augment_exact, differs_but_stays_close) {
  ferry_augment_spec_t fused = parse_ok("rotate(0.1) | zoom(0.1)");
  ferry_augment_spec_t exact = parse_ok("rotate(0.1) | zoom(0.1) | exact");
  const int n = 16, h = 32, w = 32, c = 3;
  size_t len = (size_t)n * h * w * c;
  uint8_t *in = smooth_images(n, h, w, c);
  float *a = malloc(len * 4), *b = malloc(len * 4);
  cr_assert_eq(ferry_augment_batch_cpu(&fused, 4, 0, 0, in, n, h, w, c, a,
                                       FERRY_DTYPE_FLOAT32,
                                       FERRY_LAYOUT_NHWC, NULL),
               0);
  cr_assert_eq(ferry_augment_batch_cpu(&exact, 4, 0, 0, in, n, h, w, c, b,
                                       FERRY_DTYPE_FLOAT32,
                                       FERRY_LAYOUT_NHWC, NULL),
               0);
  double sum = 0;
  size_t differ = 0;
  for (size_t j = 0; j < len; j++) {
    sum += fabs(a[j] - b[j]);
    differ += a[j] != b[j];
  }
  cr_assert_gt(differ, len / 2, "%zu of %zu differ", differ, len);
  cr_assert_lt(sum / len, 2.0, "mean |fused - exact| = %g levels",
               sum / len);
  /* With a single op the two modes are the same computation. */
  fused = parse_ok("rotate(0.1)");
  exact = parse_ok("rotate(0.1) | exact");
  ferry_augment_batch_cpu(&fused, 4, 0, 0, in, n, h, w, c, a,
                          FERRY_DTYPE_FLOAT32, FERRY_LAYOUT_NHWC, NULL);
  ferry_augment_batch_cpu(&exact, 4, 0, 0, in, n, h, w, c, b,
                          FERRY_DTYPE_FLOAT32, FERRY_LAYOUT_NHWC, NULL);
  cr_assert_eq(memcmp(a, b, len * 4), 0);
  free(in);
  free(a);
  free(b);
}

Test(augment_limits, no_memory_growth) {
  ferry_augment_spec_t s = parse_ok("flip(horizontal) | rotate(0.1) | "
                                    "zoom(0.1) | rescale(1/255) | exact");
  uint8_t *in = random_images(2, 4, 4, 3);
  uint16_t out[2 * 4 * 4 * 3];
  ferry_alloc_stats_t before, after;
  ferry_augment_batch_cpu(&s, 1, 0, 0, in, 2, 4, 4, 3, out,
                          FERRY_DTYPE_FLOAT16, FERRY_LAYOUT_NCHW, NULL);
  ferry__alloc_stats(&before);
  for (int b = 0; b < 10000; b++)
    cr_assert_eq(ferry_augment_batch_cpu(&s, 1, 0, b, in, 2, 4, 4, 3, out,
                                         FERRY_DTYPE_FLOAT16,
                                         FERRY_LAYOUT_NCHW, NULL),
                 0);
  ferry__alloc_stats(&after);
  cr_assert_eq(after.bytes, before.bytes);
  cr_assert_eq(after.blocks, before.blocks);
  free(in);
}

Test(augment_limits, one_pixel_images) {
  uint8_t in[1 * 1 * 5 * 3];
  float out[1 * 1 * 5 * 3];
  ferry_error_t err = {0};
  for (int i = 0; i < 15; i++)
    in[i] = (uint8_t)(i * 17);
  ferry_augment_spec_t s = parse_ok("rotate(0.1)");
  cr_assert_eq(ferry_augment_batch_cpu(&s, 1, 0, 0, in, 1, 1, 5, 3, out,
                                       FERRY_DTYPE_FLOAT32,
                                       FERRY_LAYOUT_NHWC, &err),
               FERRY_ETOOSMALL);
  cr_assert(strstr(err.msg, "rotate") && strstr(err.msg, "got 1x5"), "%s",
            err.msg);
  s = parse_ok("zoom(0.1)");
  cr_assert_eq(ferry_augment_batch_cpu(&s, 1, 0, 0, in, 1, 5, 1, 3, out,
                                       FERRY_DTYPE_FLOAT32,
                                       FERRY_LAYOUT_NHWC, &err),
               FERRY_ETOOSMALL);
  cr_assert(strstr(err.msg, "zoom") && strstr(err.msg, "got 5x1"), "%s",
            err.msg);
  /* Flip and rescale apply to any size. */
  s = parse_ok("flip(horizontal) | rescale(2)");
  cr_assert_eq(ferry_augment_batch_cpu(&s, 1, 0, 0, in, 1, 1, 1, 3, out,
                                       FERRY_DTYPE_FLOAT32,
                                       FERRY_LAYOUT_NHWC, &err),
               0, "%s", err.msg);
  for (int k = 0; k < 3; k++)
    cr_assert_eq(out[k], 2.0f * in[k]);
  /* 2x2 is enough for both. */
  s = parse_ok("rotate(0.1) | zoom(0.1)");
  cr_assert_eq(ferry_augment_batch_cpu(&s, 1, 0, 0, in, 1, 2, 2, 3, out,
                                       FERRY_DTYPE_FLOAT32,
                                       FERRY_LAYOUT_NHWC, &err),
               0, "%s", err.msg);
}

Test(augment_limits, bad_arguments) {
  ferry_augment_spec_t s = parse_ok("zoom(0.1)");
  uint8_t in[12];
  float out[12];
  ferry_error_t err = {0};
  cr_assert_eq(ferry_augment_batch_cpu(NULL, 1, 0, 0, in, 1, 2, 2, 3, out,
                                       FERRY_DTYPE_FLOAT32,
                                       FERRY_LAYOUT_NHWC, &err),
               FERRY_EINVAL);
  cr_assert_eq(ferry_augment_batch_cpu(&s, 1, 0, 0, NULL, 1, 2, 2, 3, out,
                                       FERRY_DTYPE_FLOAT32,
                                       FERRY_LAYOUT_NHWC, &err),
               FERRY_EINVAL);
  cr_assert_eq(ferry_augment_batch_cpu(&s, 1, 0, 0, in, 1, 2, 2, 0, out,
                                       FERRY_DTYPE_FLOAT32,
                                       FERRY_LAYOUT_NHWC, &err),
               FERRY_EINVAL);
  cr_assert_eq(ferry_augment_batch_cpu(&s, 1, 0, 0, in, 1, 2, 2, 3, out,
                                       (ferry_dtype_t)7, FERRY_LAYOUT_NHWC,
                                       &err),
               FERRY_EINVAL);
  cr_assert_eq(ferry_augment_batch_cpu(&s, 1, 0, 0, in, 1, 2, 2, 3, out,
                                       FERRY_DTYPE_FLOAT32,
                                       (ferry_layout_t)2, &err),
               FERRY_EINVAL);
  cr_assert_eq(ferry_augment_batch_cpu(&s, 1, 0, 0, in, 1, 40000, 2, 3, out,
                                       FERRY_DTYPE_FLOAT32,
                                       FERRY_LAYOUT_NHWC, &err),
               FERRY_EINVAL);
  s.rotate = NAN;
  cr_assert_eq(ferry_augment_batch_cpu(&s, 1, 0, 0, in, 1, 2, 2, 3, out,
                                       FERRY_DTYPE_FLOAT32,
                                       FERRY_LAYOUT_NHWC, &err),
               FERRY_EINVAL);
  /* An empty batch is fine with no buffers. */
  s = parse_ok("zoom(0.1)");
  cr_assert_eq(ferry_augment_batch_cpu(&s, 1, 0, 0, NULL, 0, 2, 2, 3, NULL,
                                       FERRY_DTYPE_FLOAT32,
                                       FERRY_LAYOUT_NHWC, &err),
               0);
  cr_assert_eq(ferry_augment_out_bytes(256, 224, 224, 3,
                                       FERRY_DTYPE_BFLOAT16),
               256u * 224 * 224 * 3 * 2);
  cr_assert_eq(ferry_augment_out_bytes(SIZE_MAX / 2, 224, 224, 3,
                                       FERRY_DTYPE_FLOAT32),
               0);
}

Test(augment_limits, cuda_stub_says_why) {
  ferry_error_t err = {0};
  ferry_augment_spec_t s = parse_ok("zoom(0.1)");
  cr_assert_eq(ferry_cuda_available(&err), FERRY_ENOTSUP);
  cr_assert(strstr(err.msg, "without CUDA") != NULL, "%s", err.msg);
  cr_assert_eq(ferry_augment_batch_cuda(&s, 1, 0, 0, NULL, 0, 2, 2, 3, NULL,
                                        FERRY_DTYPE_FLOAT32,
                                        FERRY_LAYOUT_NHWC, NULL, &err),
               FERRY_ENOTSUP);
}
