/* Image ops: decode_raw, dilate 3x3, Gaussian blur, bilinear resize and
 * the SIMD level switch. Goldens come from the formulas of OPS.md; every
 * SIMD level is checked against the scalar references on random images. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "imgops.h"

static const char *isas[] = {"scalar", "avx2", "avx512"};

static uint32_t rng = 12345;
static uint8_t rnd8(void) {
  rng = rng * 1103515245u + 12345u;
  return (uint8_t)(rng >> 16);
}

/* OPS.md's sigma 0.8 constants, centre first. */
static const double ops_k[6] = {0.498674597, 0.228309867, 0.0219102327,
                                4.40741727e-4, 1.85838727e-6, 1.64e-9};

Test(imgops, decode_raw_copies_and_checks_size) {
  uint8_t src[24], dst[24];
  ferry_error_t err;
  for (int i = 0; i < 24; i++)
    src[i] = (uint8_t)(i * 7);
  cr_assert_eq(ferry__decode_raw(src, 24, 2, 4, 3, dst, &err), 0);
  cr_assert_arr_eq(src, dst, 24);
  cr_assert_eq(ferry__decode_raw(src, 23, 2, 4, 3, dst, &err), FERRY_EIMGSIZE);
  cr_assert_eq(err.code, FERRY_EIMGSIZE);
  cr_assert(strstr(err.msg, "24") != NULL && strstr(err.msg, "23") != NULL,
            "message names both sizes: %s", err.msg);
  cr_assert_eq(ferry__decode_raw(src, 24, 0, 4, 3, dst, &err), FERRY_EINVAL);
}

Test(imgops, isa_names) {
  const char *now = ferry__imgops_isa();
  cr_assert(strcmp(now, "scalar") == 0 || strcmp(now, "avx2") == 0 ||
            strcmp(now, "avx512") == 0);
  cr_assert_eq(ferry__imgops_set_isa("scalar"), 0);
  cr_assert_str_eq(ferry__imgops_isa(), "scalar");
  cr_assert_eq(ferry__imgops_set_isa("sse9"), FERRY_EINVAL);
  cr_assert_eq(ferry__imgops_set_isa(NULL), FERRY_EINVAL);
}

/* 6x6x1: two bright pixels, one in a corner; the max spreads to the
 * clipped 3x3 neighbourhood. */
Test(imgops, dilate_golden_6x6x1) {
  uint8_t in[36] = {0}, out[36];
  static const uint8_t want[36] = {
      9, 9, 0,   0,   0,   0,   //
      9, 9, 200, 200, 200, 0,   //
      0, 0, 200, 200, 200, 0,   //
      0, 0, 200, 200, 200, 0,   //
      0, 0, 0,   0,   0,   0,   //
      0, 0, 0,   0,   0,   0};
  in[0] = 9;
  in[2 * 6 + 3] = 200;
  for (int l = 0; l < 3; l++) {
    if (ferry__imgops_set_isa(isas[l]) != 0)
      continue;
    memset(out, 0xAA, sizeof(out));
    ferry__dilate3x3(in, out, 6, 6, 1);
    cr_assert_arr_eq(out, want, 36, "isa %s", isas[l]);
  }
}

/* 7x9x3: channel 0 rises with y*W+x, so its max sits at the bottom-right
 * of the clipped window; channel 1 falls, so at the top-left; channel 2 is
 * constant. */
Test(imgops, dilate_golden_7x9x3) {
  enum { H = 7, W = 9, C = 3 };
  uint8_t in[H * W * C], out[H * W * C];
  for (int y = 0; y < H; y++)
    for (int x = 0; x < W; x++) {
      in[(y * W + x) * C + 0] = (uint8_t)(y * W + x);
      in[(y * W + x) * C + 1] = (uint8_t)(255 - (y * W + x));
      in[(y * W + x) * C + 2] = 7;
    }
  for (int l = 0; l < 3; l++) {
    if (ferry__imgops_set_isa(isas[l]) != 0)
      continue;
    ferry__dilate3x3(in, out, H, W, C);
    for (int y = 0; y < H; y++)
      for (int x = 0; x < W; x++) {
        int yb = y + 1 < H ? y + 1 : y, xb = x + 1 < W ? x + 1 : x;
        int yt = y > 0 ? y - 1 : y, xt = x > 0 ? x - 1 : x;
        cr_assert_eq(out[(y * W + x) * C + 0], yb * W + xb);
        cr_assert_eq(out[(y * W + x) * C + 1], 255 - (yt * W + xt));
        cr_assert_eq(out[(y * W + x) * C + 2], 7);
      }
  }
}

static void dilate_check(int h, int w, int c) {
  size_t n = (size_t)h * w * c;
  uint8_t *in = malloc(n), *ref = malloc(n), *out = malloc(n);
  for (size_t i = 0; i < n; i++)
    in[i] = rnd8();
  ferry__dilate3x3_reference(in, ref, h, w, c);
  for (int l = 0; l < 3; l++) {
    if (ferry__imgops_set_isa(isas[l]) != 0)
      continue;
    memset(out, 0x55, n);
    ferry__dilate3x3(in, out, h, w, c);
    cr_assert(memcmp(ref, out, n) == 0, "dilate %s differs at %dx%dx%d",
              isas[l], h, w, c);
  }
  free(in);
  free(ref);
  free(out);
}

Test(imgops, dilate_all_levels_bitwise) {
  static const int cs[] = {1, 3, 4};
  for (int ci = 0; ci < 3; ci++)
    for (int h = 1; h <= 12; h++)
      for (int w = 1; w <= 70; w++)
        dilate_check(h, w, cs[ci]);
  for (int h = 13; h <= 70; h += 7)
    for (int w = 1; w <= 70; w += 3)
      dilate_check(h, w, 3);
  /* Rows wider than the AVX2 segment buffer, odd and many channels. */
  dilate_check(3, 1500, 3);
  dilate_check(4, 4096, 1);
  dilate_check(5, 17, 2);
  dilate_check(5, 17, 6);
  dilate_check(4, 9, 40);
}

Test(imgops, blur_kernel_matches_ops_constants) {
  float k[11], sum = 0.0f;
  ferry__blur_kernel(11, 0.8f, k);
  for (int j = 0; j <= 5; j++) {
    /* OPS.md gives k5 = 1.64e-9 to three digits only. */
    double tol = j == 5 ? 5e-3 : 1e-7;
    cr_assert(fabs(k[5 + j] - ops_k[j]) <= tol * ops_k[j],
              "k%d = %.9g, OPS.md %.9g", j, k[5 + j], ops_k[j]);
    cr_assert_eq(k[5 + j], k[5 - j], "symmetric");
  }
  for (int i = 0; i < 11; i++)
    sum += k[i];
  cr_assert(fabsf(sum - 1.0f) < 1e-6f);
}

/* An impulse: out = trunc(v * Ky(y) * Kx(x)), where Ky sums the taps whose
 * reflect-101 tap row is the impulse's row; near the edges two taps land
 * on it (zero padding would give one). Separable float order: +-1. */
static double reflect_weight(int pos, int at, int n) {
  double s = 0.0;
  for (int i = -5; i <= 5; i++) {
    int t = pos + i;
    t = t < 0 ? -t : t >= n ? 2 * n - 2 - t : t;
    if (t == at)
      s += ops_k[abs(i)];
  }
  return s;
}

static void blur_impulse(int h, int w, int c, int py, int px, int ch,
                         int v) {
  size_t n = (size_t)h * w * c;
  uint8_t *in = calloc(n, 1), *out = malloc(n), *ref = malloc(n);
  ferry_blur_t *b;
  cr_assert_eq(ferry__blur_new(11, 0.8f, &b, NULL), 0);
  in[((size_t)py * w + px) * c + ch] = (uint8_t)v;
  cr_assert_eq(ferry__blur_reference(11, 0.8f, in, ref, h, w, c), 0);
  for (int l = 0; l < 3; l++) {
    if (ferry__imgops_set_isa(isas[l]) != 0)
      continue;
    cr_assert_eq(ferry__blur_apply(b, in, out, h, w, c, NULL), 0);
    for (int y = 0; y < h; y++)
      for (int x = 0; x < w; x++)
        for (int q = 0; q < c; q++) {
          double e = q == ch ? v * reflect_weight(y, py, h) *
                                   reflect_weight(x, px, w)
                             : 0.0;
          int want = (int)e, got = out[((size_t)y * w + x) * c + q];
          int gr = ref[((size_t)y * w + x) * c + q];
          cr_assert(abs(got - want) <= 1 && abs(gr - want) <= 1,
                    "%s (%d,%d,%d): got %d ref %d formula %.4f", isas[l], y,
                    x, q, got, gr, e);
        }
  }
  ferry__blur_free(b);
  free(in);
  free(out);
  free(ref);
}

Test(imgops, blur_golden_impulses) {
  blur_impulse(6, 6, 1, 2, 3, 0, 255);
  blur_impulse(6, 6, 1, 0, 0, 0, 200);
  blur_impulse(7, 9, 3, 1, 7, 1, 255);
  blur_impulse(7, 9, 3, 6, 0, 2, 250);
  /* The reflected edge doubles the weight: at (0, 3) of the first case
   * 255 * 2 k2 * k0 = 5.57, where zero padding would give 2.78. */
  uint8_t in[36] = {0}, out[36];
  ferry_blur_t *b;
  in[2 * 6 + 3] = 255;
  cr_assert_eq(ferry__blur_new(11, 0.8f, &b, NULL), 0);
  cr_assert_eq(ferry__blur_apply(b, in, out, 6, 6, 1, NULL), 0);
  cr_assert(out[3] == 5 || out[3] == 4, "got %d", out[3]);
  ferry__blur_free(b);
}

Test(imgops, blur_all_levels_within_one_of_reference) {
  static const int sizes[] = {6, 7, 8, 9, 13, 16, 17, 23, 31, 32, 33, 47,
                              64, 70};
  static const int cs[] = {1, 3, 4};
  int ns = (int)(sizeof(sizes) / sizeof(sizes[0]));
  int maxdiff[3] = {0, 0, 0};
  ferry_blur_t *b;
  cr_assert_eq(ferry__blur_new(11, 0.8f, &b, NULL), 0);
  for (int ci = 0; ci < 3; ci++)
    for (int hi = 0; hi < ns; hi++)
      for (int wi = 0; wi < ns; wi++) {
        int h = sizes[hi], w = sizes[wi], c = cs[ci];
        if (c != 3 && (hi + wi) % 2) /* keep the run short */
          continue;
        size_t n = (size_t)h * w * c;
        uint8_t *in = malloc(n), *ref = malloc(n), *out = malloc(n);
        for (size_t i = 0; i < n; i++)
          in[i] = rnd8();
        cr_assert_eq(ferry__blur_reference(11, 0.8f, in, ref, h, w, c), 0);
        for (int l = 0; l < 3; l++) {
          if (ferry__imgops_set_isa(isas[l]) != 0)
            continue;
          cr_assert_eq(ferry__blur_apply(b, in, out, h, w, c, NULL), 0);
          for (size_t i = 0; i < n; i++) {
            int d = abs((int)out[i] - (int)ref[i]);
            if (d > maxdiff[l])
              maxdiff[l] = d;
            cr_assert(d <= 1, "%s %dx%dx%d at %zu: %d vs ref %d", isas[l], h,
                      w, c, i, out[i], ref[i]);
          }
        }
        free(in);
        free(ref);
        free(out);
      }
  cr_log_info("blur max |diff| vs reference: scalar %d, avx2 %d, avx512 %d",
              maxdiff[0], maxdiff[1], maxdiff[2]);
  printf("blur max |diff| vs reference: scalar %d, avx2 %d, avx512 %d\n",
         maxdiff[0], maxdiff[1], maxdiff[2]);
  ferry__blur_free(b);
}

Test(imgops, blur_other_sizes_and_channels) {
  /* Kernel 5 and 1, two and six channels (scalar padding paths). */
  static const int ks[] = {5, 1, 11, 11};
  static const int cs[] = {2, 3, 6, 2};
  for (int t = 0; t < 4; t++)
    for (int h = 6; h <= 20; h += 7)
      for (int w = 6; w <= 40; w += 5) {
        int c = cs[t];
        size_t n = (size_t)h * w * c;
        uint8_t *in = malloc(n), *ref = malloc(n), *out = malloc(n);
        ferry_blur_t *b;
        cr_assert_eq(ferry__blur_new(ks[t], 1.3f, &b, NULL), 0);
        for (size_t i = 0; i < n; i++)
          in[i] = rnd8();
        cr_assert_eq(ferry__blur_reference(ks[t], 1.3f, in, ref, h, w, c), 0);
        for (int l = 0; l < 3; l++) {
          if (ferry__imgops_set_isa(isas[l]) != 0)
            continue;
          cr_assert_eq(ferry__blur_apply(b, in, out, h, w, c, NULL), 0);
          for (size_t i = 0; i < n; i++)
            cr_assert(abs((int)out[i] - (int)ref[i]) <= 1,
                      "%s k%d %dx%dx%d at %zu", isas[l], ks[t], h, w, c, i);
        }
        ferry__blur_free(b);
        free(in);
        free(ref);
        free(out);
      }
}

/* One blur of `in` at every level the CPU has; *have says which ran. */
static void blur_levels(ferry_blur_t *b, const uint8_t *in, uint8_t **out,
                        int h, int w, int c, int *have) {
  size_t n = (size_t)h * w * c;
  for (int l = 0; l < 3; l++) {
    have[l] = ferry__imgops_set_isa(isas[l]) == 0;
    if (!have[l])
      continue;
    memset(out[l], 0x5a, n);
    cr_assert_eq(ferry__blur_apply(b, in, out[l], h, w, c, NULL), 0);
  }
}

Test(imgops, blur_paths_agree_bitwise) {
  /* The AVX2 and AVX-512 paths are one template (blur_rows.h) forming
   * the same sums in the same order: bitwise equal wherever AVX2 runs
   * (rows of w * c >= 8 floats; narrower ones take the scalar path, so
   * there AVX2 equals scalar). Scalar sums in another order: within 1.
   * Random shapes (odd widths, every tail of both vector widths, 1 to 9
   * channels) for each radius class (0, the compiled-in 2 and 5, the
   * lane-shift copies for blur 11 on 1 or 3 channels, any other), plus
   * the smallest image of each. */
  static const int ks[] = {1, 3, 5, 11, 15, 31};
  int ran[3] = {0, 0, 0};
  for (int t = 0; t < 6; t++) {
    int k = ks[t], r = k / 2;
    ferry_blur_t *b;
    cr_assert_eq(ferry__blur_new(k, k == 11 ? 0.8f : 0.3f * k, &b, NULL), 0);
    for (int it = 0; it < 120; it++) {
      int c = 1 + it % 9;
      int h = it < 9 ? r + 1 : r + 1 + rnd8() % 23;
      int w = it < 9 ? r + 1 : r + 1 + rnd8() % 75;
      size_t n = (size_t)h * w * c;
      uint8_t *in = malloc(n), *out[3];
      int have[3];
      for (int l = 0; l < 3; l++)
        out[l] = malloc(n);
      for (size_t i = 0; i < n; i++)
        in[i] = rnd8();
      blur_levels(b, in, out, h, w, c, have);
      cr_assert(have[0]);
      for (int l = 1; l < 3; l++) {
        if (!have[l])
          continue;
        ran[l]++;
        for (size_t i = 0; i < n; i++)
          cr_assert(abs((int)out[l][i] - (int)out[0][i]) <= 1,
                    "%s vs scalar, k%d %dx%dx%d at %zu: %d vs %d", isas[l],
                    k, h, w, c, i, out[l][i], out[0][i]);
      }
      if (have[1] && (size_t)w * c < 8)
        cr_assert(memcmp(out[1], out[0], n) == 0,
                  "avx2 vs scalar, k%d %dx%dx%d", k, h, w, c);
      if (have[1] && have[2] && (size_t)w * c >= 8)
        cr_assert(memcmp(out[1], out[2], n) == 0,
                  "avx2 vs avx512, k%d %dx%dx%d", k, h, w, c);
      for (int l = 0; l < 3; l++)
        free(out[l]);
      free(in);
    }
    ferry__blur_free(b);
  }
  cr_log_info("blur paths compared: avx2 %d, avx512 %d shapes", ran[1],
              ran[2]);
  printf("blur paths compared: avx2 %d, avx512 %d shapes\n", ran[1],
         ran[2]);
}

Test(imgops, blur_too_small_and_bad_args) {
  uint8_t img[5 * 40 * 3] = {0}, out[5 * 40 * 3];
  ferry_blur_t *b;
  ferry_error_t err;
  cr_assert_eq(ferry__blur_new(11, 0.8f, &b, &err), 0);
  cr_assert_eq(ferry__blur_apply(b, img, out, 5, 40, 3, &err), FERRY_ETOOSMALL);
  cr_assert(strstr(err.msg, "11") != NULL && strstr(err.msg, ">= 6") != NULL,
            "%s", err.msg);
  cr_assert_eq(ferry__blur_apply(b, img, out, 40, 5, 3, &err), FERRY_ETOOSMALL);
  cr_assert_eq(ferry__blur_reference(11, 0.8f, img, out, 5, 40, 3),
               FERRY_ETOOSMALL);
  ferry__blur_free(b);
  cr_assert_eq(ferry__blur_new(10, 0.8f, &b, &err), FERRY_EINVAL);
  cr_assert_eq(ferry__blur_new(33, 0.8f, &b, &err), FERRY_EINVAL);
  cr_assert_eq(ferry__blur_new(11, 0.0f, &b, &err), FERRY_EINVAL);
}

Test(imgops, blur_no_allocation_in_steady_state) {
  enum { H = 32, W = 32, C = 3 };
  static uint8_t in[64 * 64 * C], out[64 * 64 * C];
  ferry_alloc_stats_t s0, s1, s2;
  ferry_blur_t *b;
  for (size_t i = 0; i < sizeof(in); i++)
    in[i] = rnd8();
  cr_assert_eq(ferry__blur_new(11, 0.8f, &b, NULL), 0);
  cr_assert_eq(ferry__blur_apply(b, in, out, H, W, C, NULL), 0);
  ferry__alloc_stats(&s0);
  for (int i = 0; i < 100; i++)
    cr_assert_eq(ferry__blur_apply(b, in, out, H, W, C, NULL), 0);
  ferry__alloc_stats(&s1);
  cr_assert_eq(s1.bytes, s0.bytes);
  cr_assert_eq(s1.blocks, s0.blocks);
  /* A bigger image grows the scratch once; smaller ones reuse it. */
  cr_assert_eq(ferry__blur_apply(b, in, out, 64, 64, C, NULL), 0);
  ferry__alloc_stats(&s1);
  cr_assert_gt(s1.bytes, s0.bytes);
  for (int i = 0; i < 10; i++)
    cr_assert_eq(ferry__blur_apply(b, in, out, 16 + i, 40, C, NULL), 0);
  ferry__alloc_stats(&s2);
  cr_assert_eq(s2.bytes, s1.bytes);
  cr_assert_eq(s2.blocks, s1.blocks);
  ferry__blur_free(b);
}

Test(imgops, resize_golden) {
  /* Upsample 1x2 -> 1x4: in = (x + 0.5) / 2 - 0.5 = -0.25, 0.25, 0.75,
   * 1.25 -> 0, 0.5, 1.5, 2 on [0, 2]; halves round away from zero. */
  uint8_t a[2] = {0, 2}, o[4];
  ferry__resize_bilinear(a, 1, 2, 1, o, 1, 4);
  cr_assert_eq(o[0], 0);
  cr_assert_eq(o[1], 1);
  cr_assert_eq(o[2], 2);
  cr_assert_eq(o[3], 2);
  /* 2x2 -> 4x4 in 2-D: rows lerp at 0, .25, .75, 1 of the way. */
  uint8_t b[4] = {0, 100, 200, 40}, ob[16];
  static const double f[4] = {0.0, 0.25, 0.75, 1.0};
  ferry__resize_bilinear(b, 2, 2, 1, ob, 4, 4);
  for (int y = 0; y < 4; y++)
    for (int x = 0; x < 4; x++) {
      double t = 0 + 100 * f[x], bo = 200 + (40 - 200) * f[x];
      double v = t + (bo - t) * f[y];
      cr_assert_eq(ob[y * 4 + x], (int)floor(v + 0.5), "(%d,%d) %f", y, x,
                   v);
    }
  /* Downsample 1x4 -> 1x2: samples at 0.5 and 2.5. */
  uint8_t c4[4] = {10, 20, 30, 41}, oc[2];
  ferry__resize_bilinear(c4, 1, 4, 1, oc, 1, 2);
  cr_assert_eq(oc[0], 15);
  cr_assert_eq(oc[1], 36); /* 35.5 rounds up */
  /* Same size: identity, three channels. */
  uint8_t d[5 * 7 * 3], od[5 * 7 * 3];
  for (size_t i = 0; i < sizeof(d); i++)
    d[i] = rnd8();
  ferry__resize_bilinear(d, 5, 7, 3, od, 5, 7);
  cr_assert_arr_eq(d, od, sizeof(d));
}
