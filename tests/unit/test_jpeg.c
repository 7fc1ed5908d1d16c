/* JPEG decoding: conformance over ../shared/testdata/jpeg (outcomes as
 * MANIFEST.md section C, under Ferry's TF-like policy: truncation fails,
 * other warnings are accepted), and generated images: round trip, corrupt
 * and truncated data, small buffers, CMYK and grayscale. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <turbojpeg.h>

#include "../../common/src/image/imgops_internal.h"
#include "crop.h"
#include "imgops.h"
#include "unit_files.h"

enum { OK, TRUNC, FAIL };

typedef struct {
  const char *name;
  int want, w, h;
} jcase_t;

/* C1 must decode; C2 decodes with warnings (accepted) or is truncated
 * (refused, as TF does by default); C3 and C4 must fail. */
static const jcase_t cases[] = {
    {"ljt_testorig.jpg", OK, 227, 149},
    {"ljt_testimgint.jpg", OK, 227, 149},
    {"ljt_testimgari.jpg", OK, 227, 149},
    {"ljt_testimgp.jpg", OK, 227, 149},
    {"ljt_testimggray.jpg", OK, 227, 149},
    {"tf_jpeg_merge_test1.jpg", OK, 128, 256},
    {"tf_jpeg_merge_test1_cmyk.jpg", OK, 128, 256},
    {"jd_jpg-cmyk-1.jpg", OK, 32, 32},
    {"jd_ycck.jpg", OK, 500, 333},
    {"jd_jpg-gray.jpg", OK, 32, 32},
    {"jd_jpg-srgb-icc.jpg", OK, 1, 1},
    {"jd_grayscale_16x24_sampling2x2.jpg", OK, 16, 24},
    {"jd_jpg-progressive.jpg", OK, 32, 32},
    {"jd_non-interleaved-mcu.jpg", OK, 64, 16},
    {"jd_progressive-missing-ac.jpg", OK, 8, 8},
    {"jd_restarts.jpg", OK, 33, 33},
    {"jd_jpg-size-1x1.jpg", OK, 1, 1},
    {"jd_jpg-size-15x15.jpg", OK, 15, 15},
    {"jd_jpg-size-33x33.jpg", OK, 33, 33},
    {"jd_16bit-qtables.jpg", OK, 1, 1},
    {"jd_multiple-0xff-before-eoi.jpg", OK, 640, 480},
    {"tf_bad_huffman.jpg", OK, 1024, 768},
    {"tf_corrupt34_2.jpg", TRUNC, 2544, 3300},
    {"tf_corrupt34_3.jpg", TRUNC, 2544, 3300},
    {"tf_corrupt34_4.jpg", TRUNC, 2544, 3300},
    {"jd_194531363df5b73f59c4c0517422f917.jpg", TRUNC, 193, 31423},
    {"jd_dc-predictor-overflow.jpg", OK, 144, 144},
    {"jd_extraneous-data.jpg", OK, 16, 16},
    {"jd_partial_progressive.jpg", OK, 4, 4},
    {"jd_progressive-missing-dc.jpg", OK, 8, 8},
    {"jd_subtract-with-overflow.jpg", OK, 546, 340},
    {"jd_empty.jpg", FAIL, 0, 0},
    {"jd_missing-frame-image-1410.jpg", FAIL, 0, 0},
    {"jd_missing-sof.jpg", FAIL, 0, 0},
    {"jd_missing-sos.jpg", FAIL, 0, 0},
    {"jd_f012a4321f00f12af6b1eee7580ffb9c.jpg", FAIL, 0, 0},
    {"jd_invalid-dimensions.jpg", FAIL, 0, 0},
    {"jd_null_height.jpg", FAIL, 0, 0},
    {"jd_28968137f4fc75fbf56f16d7a7a8551a.jpg", FAIL, 0, 0},
    {"jd_max_size.jpg", FAIL, 0, 0},
    {"jd_derive-huffman-codes-overflow.jpg", FAIL, 0, 0},
    {"jd_c52ffdd6a0346c4d09271f8ccbdfd5a3.jpg", FAIL, 0, 0},
    {"jd_21a84b8472f6d18f5bb5c0026e97cfaa.jpg", FAIL, 0, 0},
    {"jd_3ea649db8e81a46ca4f92fb3238f78ff.jpg", FAIL, 0, 0},
    {"tf_corrupt.jpg", FAIL, 0, 0},
    {"ljt_monkey12.jpg", FAIL, 0, 0},
    {"ljt_testorig12.jpg", FAIL, 0, 0},
    {"jd_jpeg_lossless_sel1.jpg", FAIL, 0, 0},
    {"jd_invalid-prediction-shift.jpg", FAIL, 0, 0},
};


static int have_testdata(char *dir, size_t cap) {
  snprintf(dir, cap, "%s/jpeg", FERRY_TESTDATA_DIR);
  char probe[600];
  snprintf(probe, sizeof(probe), "%s/ljt_testorig.jpg", dir);
  FILE *f = fopen(probe, "rb");
  if (f == NULL)
    return 0;
  fclose(f);
  return 1;
}

Test(jpeg, conformance_testdata) {
  char dir[512];
  if (!have_testdata(dir, sizeof(dir))) {
    printf("skip: %s/jpeg is absent\n", FERRY_TESTDATA_DIR);
    cr_skip_test("%s/jpeg is absent", FERRY_TESTDATA_DIR);
  }
  size_t cap = 32u << 20;
  uint8_t *dst = malloc(cap);
  ferry_jpeg_t *j;
  cr_assert_eq(ferry__jpeg_new(&j, NULL), 0);
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    char path[700];
    size_t len;
    int h = -1, w = -1, rc;
    ferry_error_t err = {0};
    snprintf(path, sizeof(path), "%s/%s", dir, cases[i].name);
    uint8_t *b = tu_slurp(path, &len);
    cr_assert_not_null(b, "cannot read %s", path);
    rc = ferry__jpeg_decode(j, b, len, dst, cap, &h, &w, &err);
    switch (cases[i].want) {
    case OK:
      cr_assert_eq(rc, 0, "%s: %s", cases[i].name, err.msg);
      cr_assert(h == cases[i].h && w == cases[i].w, "%s: %dx%d",
                cases[i].name, w, h);
      break;
    case TRUNC:
      cr_assert_eq(rc, FERRY_EJPEGTRUNC, "%s: %s", cases[i].name, err.msg);
      cr_assert(h == cases[i].h && w == cases[i].w);
      break;
    default:
      cr_assert(rc == FERRY_EJPEG || rc == FERRY_EJPEGTRUNC, "%s: rc %d",
                cases[i].name, rc);
      cr_assert_eq(err.code, rc);
      cr_assert(strlen(err.msg) > 6, "%s: message", cases[i].name);
      break;
    }
    free(b);
  }
  ferry__jpeg_free(j);
  free(dst);
}

static uint8_t *decode_file(ferry_jpeg_t *j, const char *dir,
                            const char *name, int accurate, int *h, int *w) {
  char path[700];
  size_t len, cap = 4u << 20;
  uint8_t *dst = malloc(cap);
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  uint8_t *b = tu_slurp(path, &len);
  cr_assert_not_null(b);
  cr_assert_eq(
      ferry__jpeg_decode_dct(j, b, len, dst, cap, h, w, accurate, NULL), 0);
  free(b);
  return dst;
}

/* MANIFEST: testimgint, testimgari (arithmetic) and testimgp (progressive)
 * decode to identical pixels; also TF's test: the CMYK version of
 * jpeg_merge_test1 is within mean error 4 of the RGB one. */
Test(jpeg, testdata_pixel_relations) {
  char dir[512];
  int h, w, h2, w2;
  if (!have_testdata(dir, sizeof(dir)))
    cr_skip_test("%s/jpeg is absent", FERRY_TESTDATA_DIR);
  ferry_jpeg_t *j;
  cr_assert_eq(ferry__jpeg_new(&j, NULL), 0);
  for (int acc = 0; acc <= 1; acc++) {
    uint8_t *a = decode_file(j, dir, "ljt_testimgint.jpg", acc, &h, &w);
    uint8_t *b = decode_file(j, dir, "ljt_testimgari.jpg", acc, &h2, &w2);
    uint8_t *c = decode_file(j, dir, "ljt_testimgp.jpg", acc, &h2, &w2);
    cr_assert(memcmp(a, b, (size_t)h * w * 3) == 0, "int vs ari");
    cr_assert(memcmp(a, c, (size_t)h * w * 3) == 0, "int vs progressive");
    free(a);
    free(b);
    free(c);
  }
  uint8_t *rgb = decode_file(j, dir, "tf_jpeg_merge_test1.jpg", 0, &h, &w);
  uint8_t *cm = decode_file(j, dir, "tf_jpeg_merge_test1_cmyk.jpg", 0, &h2,
                            &w2);
  cr_assert(h == h2 && w == w2);
  double sum = 0;
  for (size_t i = 0; i < (size_t)h * w * 3; i++)
    sum += fabs((double)rgb[i] - cm[i]);
  cr_assert_lt(sum / ((double)h * w * 3), 4.0);
  free(rgb);
  free(cm);
  /* Grayscale comes out as RGB with equal channels. */
  uint8_t *g = decode_file(j, dir, "ljt_testimggray.jpg", 0, &h, &w);
  for (size_t i = 0; i < (size_t)h * w; i++)
    cr_assert(g[3 * i] == g[3 * i + 1] && g[3 * i] == g[3 * i + 2]);
  free(g);
  ferry__jpeg_free(j);
}

/* A smooth synthetic photo-like image. */
static void synth(uint8_t *img, int h, int w) {
  for (int y = 0; y < h; y++)
    for (int x = 0; x < w; x++) {
      uint8_t *p = img + ((size_t)y * w + x) * 3;
      p[0] = (uint8_t)(128 + 100 * sin(x * 0.11) * cos(y * 0.07));
      p[1] = (uint8_t)(x * 255 / (w - 1));
      p[2] = (uint8_t)(y * 255 / (h - 1));
    }
}

static uint8_t *encode(const uint8_t *img, int h, int w, int pf, int samp,
                       int q, size_t *len) {
  tjhandle t = tjInitCompress();
  unsigned char *out = NULL;
  unsigned long n = 0;
  cr_assert_not_null(t);
  cr_assert_eq(tjCompress2(t, img, w, 0, h, pf, &out, &n, samp, q, 0), 0,
               "%s", tjGetErrorStr2(t));
  tjDestroy(t);
  uint8_t *copy = malloc(n);
  memcpy(copy, out, n);
  tjFree(out);
  *len = n;
  return copy;
}

static double psnr(const uint8_t *a, const uint8_t *b, size_t n) {
  double se = 0;
  for (size_t i = 0; i < n; i++)
    se += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
  if (se == 0)
    return 99.0;
  return 10 * log10(255.0 * 255.0 / (se / n));
}

Test(jpeg, round_trip_and_header) {
  enum { H = 48, W = 64 };
  static uint8_t img[H * W * 3], out[H * W * 3];
  static const int samps[] = {TJSAMP_444, TJSAMP_420, TJSAMP_422};
  ferry_jpeg_t *j;
  int h, w;
  synth(img, H, W);
  cr_assert_eq(ferry__jpeg_new(&j, NULL), 0);
  for (int s = 0; s < 3; s++) {
    size_t len;
    uint8_t *jp = encode(img, H, W, TJPF_RGB, samps[s], 95, &len);
    cr_assert_eq(ferry__jpeg_header(j, jp, len, &h, &w, NULL), 0);
    cr_assert(h == H && w == W);
    cr_assert_eq(ferry__jpeg_decode(j, jp, len, out, sizeof(out), &h, &w, NULL),
                 0);
    cr_assert(h == H && w == W);
    double p = psnr(img, out, sizeof(out));
    cr_assert_gt(p, 30.0, "sampling %d: PSNR %.1f dB", samps[s], p);
    free(jp);
  }
  ferry__jpeg_free(j);
}

Test(jpeg, gray_and_cmyk_generated) {
  enum { H = 16, W = 24 };
  static uint8_t gray[H * W], cmyk[H * W * 4], out[H * W * 3];
  ferry_jpeg_t *j;
  size_t len;
  int h, w;
  for (int i = 0; i < H * W; i++)
    gray[i] = 90;
  cr_assert_eq(ferry__jpeg_new(&j, NULL), 0);
  uint8_t *jp = encode(gray, H, W, TJPF_GRAY, TJSAMP_GRAY, 95, &len);
  cr_assert_eq(ferry__jpeg_decode(j, jp, len, out, sizeof(out), &h, &w, NULL),
               0);
  for (int i = 0; i < H * W * 3; i++)
    cr_assert(abs(out[i] - 90) <= 1, "%d", out[i]);
  free(jp);
  /* Constant CMYK stored as written (TurboJPEG adds an Adobe marker, so
   * TF's inverted formula applies: r = k * c / 255). */
  for (int i = 0; i < H * W; i++) {
    cmyk[4 * i] = 200;
    cmyk[4 * i + 1] = 100;
    cmyk[4 * i + 2] = 50;
    cmyk[4 * i + 3] = 255;
  }
  jp = encode(cmyk, H, W, TJPF_CMYK, TJSAMP_444, 100, &len);
  /* A buffer too small for 4 channels uses the decoder's scratch. */
  cr_assert_eq(ferry__jpeg_decode(j, jp, len, out, sizeof(out), &h, &w, NULL),
               0);
  for (int i = 0; i < H * W; i++) {
    cr_assert(abs(out[3 * i] - 200) <= 2, "r %d", out[3 * i]);
    cr_assert(abs(out[3 * i + 1] - 100) <= 2, "g %d", out[3 * i + 1]);
    cr_assert(abs(out[3 * i + 2] - 50) <= 2, "b %d", out[3 * i + 2]);
  }
  free(jp);
  ferry__jpeg_free(j);
}

Test(jpeg, corrupt_truncated_and_small_buffer) {
  enum { H = 48, W = 64 };
  static uint8_t img[H * W * 3], out[H * W * 3];
  ferry_jpeg_t *j;
  ferry_error_t err;
  size_t len;
  int h, w, rc;
  synth(img, H, W);
  cr_assert_eq(ferry__jpeg_new(&j, NULL), 0);
  uint8_t *jp = encode(img, H, W, TJPF_RGB, TJSAMP_420, 90, &len);
  uint8_t *bad = malloc(len);

  /* Not a JPEG at all, or a PNG. */
  static const uint8_t png[] = {0x89, 'P', 'N', 'G', 13, 10, 26, 10, 0, 0};
  cr_assert_eq(
      ferry__jpeg_decode(j, png, sizeof(png), out, sizeof(out), &h, &w, &err),
      FERRY_EJPEG);
  cr_assert(strstr(err.msg, "Not a JPEG") != NULL, "%s", err.msg);
  cr_assert_eq(ferry__jpeg_header(j, png, sizeof(png), &h, &w, &err),
               FERRY_EJPEG);
  cr_assert_eq(ferry__jpeg_decode(j, jp, 0, out, sizeof(out), &h, &w, &err),
               FERRY_EJPEG);

  /* A broken SOI and a destroyed frame header. */
  memcpy(bad, jp, len);
  bad[1] = 0x00;
  cr_assert_eq(ferry__jpeg_decode(j, bad, len, out, sizeof(out), &h, &w, &err),
               FERRY_EJPEG);
  memcpy(bad, jp, len);
  for (size_t i = 2; i < 200 && i < len; i++)
    bad[i] = 0xFF;
  rc = ferry__jpeg_decode(j, bad, len, out, sizeof(out), &h, &w, &err);
  cr_assert(rc == FERRY_EJPEG || rc == FERRY_EJPEGTRUNC, "rc %d", rc);

  /* The handle still works after errors. */
  cr_assert_eq(ferry__jpeg_decode(j, jp, len, out, sizeof(out), &h, &w, &err),
               0, "%s", err.msg);

  /* Truncated anywhere: an error, never a crash; inside the entropy-coded
   * data it is EJPEGTRUNC. */
  for (size_t cut = 1; cut < len; cut += len / 37 + 1) {
    rc = ferry__jpeg_decode(j, jp, cut, out, sizeof(out), &h, &w, &err);
    cr_assert(rc == FERRY_EJPEG || rc == FERRY_EJPEGTRUNC,
              "cut %zu of %zu: rc %d", cut, len, rc);
  }
  for (int k = 6; k <= 9; k++) {
    size_t cut = len * k / 10;
    rc = ferry__jpeg_decode(j, jp, cut, out, sizeof(out), &h, &w, &err);
    cr_assert_eq(rc, FERRY_EJPEGTRUNC, "cut %zu: %s", cut, err.msg);
  }
  cr_assert_eq(
      ferry__jpeg_decode(j, jp, len - 2, out, sizeof(out), &h, &w, &err),
      FERRY_EJPEGTRUNC, "%s", err.msg);

  /* Random byte damage: any outcome but a crash (a damaged frame header
   * can also claim a size the buffer cannot hold). */
  uint32_t s = 7;
  for (int t = 0; t < 200; t++) {
    memcpy(bad, jp, len);
    for (int q = 0; q < 4; q++) {
      s = s * 1103515245u + 12345u;
      bad[(s >> 8) % len] = (uint8_t)(s >> 20);
    }
    rc = ferry__jpeg_decode(j, bad, len, out, sizeof(out), &h, &w, &err);
    cr_assert(rc == 0 || rc == FERRY_EJPEG || rc == FERRY_EJPEGTRUNC ||
                  rc == FERRY_ERANGE,
              "rc %d", rc);
  }

  /* Capacity too small: ERANGE, sizes still reported. */
  h = w = 0;
  cr_assert_eq(
      ferry__jpeg_decode(j, jp, len, out, sizeof(out) - 1, &h, &w, &err),
      FERRY_ERANGE);
  cr_assert(h == H && w == W);
  free(bad);
  free(jp);
  ferry__jpeg_free(j);
}

/* The decode fused with a crop (crop.h) over the same files: the
 * same outcome as the full decode for every file that decodes or is
 * truncated; files that fail must fail the fused way too, except where
 * the corruption lies below every window tried (never decoded: the
 * documented limit), which this test lists by name. */
Test(jpeg, conformance_testdata_fused) {
  char dir[512];
  if (!have_testdata(dir, sizeof(dir))) {
    printf("skip: %s/jpeg is absent\n", FERRY_TESTDATA_DIR);
    cr_skip_test("%s/jpeg is absent", FERRY_TESTDATA_DIR);
  }
  size_t cap = 1u << 20;
  uint8_t *dst = malloc(cap);
  ferry_jpeg_t *j;
  cr_assert_eq(ferry__jpeg_new(&j, NULL), 0);
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    char path[700];
    size_t len;
    snprintf(path, sizeof(path), "%s/%s", dir, cases[i].name);
    uint8_t *b = tu_slurp(path, &len);
    cr_assert_not_null(b, "cannot read %s", path);
    for (int k = 0; k < 6; k++) {
      ferry_crop_op_t op = {.kind = k < 4 ? FERRY_CROP_RANDOM_RESIZED
                                          : FERRY_CROP_RESIZE_CENTER,
                            .out_h = k < 5 ? 16 : 0,
                            .out_w = k < 5 ? 16 : 0,
                            .shorter = 20,
                            .rrc = {0.08, 1.0, 0.75, 4.0 / 3.0},
                            .key = ferry__crop_key(1, 0, (uint64_t)k),
                            .exact = k == 3};
      ferry_error_t err = {0};
      int oh, ow;
      int rc = ferry__jpeg_decode_crop(j, b, len, &op, dst, cap, &oh, &ow, NULL,
                                       &err);
      switch (cases[i].want) {
      case OK:
        cr_assert_eq(rc, 0, "%s (try %d): %s", cases[i].name, k, err.msg);
        break;
      case TRUNC:
        cr_assert_eq(rc, FERRY_EJPEGTRUNC, "%s (try %d): %s", cases[i].name,
                     k, err.msg);
        break;
      default:
        if (rc == 0) {
          printf("fused: %s (try %d) decodes: its corruption lies outside "
                 "the window\n",
                 cases[i].name, k);
          cr_assert(k != 3, "%s: the exact path must fail", cases[i].name);
          break;
        }
        cr_assert(rc == FERRY_EJPEG || rc == FERRY_EJPEGTRUNC,
                  "%s (try %d): rc %d", cases[i].name, k, rc);
        cr_assert(strlen(err.msg) > 6, "%s: message", cases[i].name);
        break;
      }
    }
    free(b);
  }
  ferry__jpeg_free(j);
  free(dst);
}

/* ---- Limits: scans, pixels, decode memory (ferry_jpeg_limits_t) ------- */

#include <sys/resource.h>
#include <time.h>

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static long maxrss_kb(void) {
  struct rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

/* A progressive JPEG of HxW whose last scan (an AC refinement) is
 * repeated `copies` times in all: libjpeg only warns about the repeats
 * ("Inconsistent progression sequence") and runs each over the whole
 * image, which is the CPU bomb. A flat image makes each AC scan a few
 * bytes of end-of-band runs, whatever its size. */
static uint8_t *scan_bomb(int h, int w, int copies, int flat, size_t *len) {
  uint8_t *img = malloc((size_t)h * w * 3), *out, *jp;
  tjhandle t = tjInitCompress();
  unsigned char *buf = NULL;
  unsigned long n = 0;
  size_t last = 0, end, pos, o = 0;
  if (flat)
    memset(img, 128, (size_t)h * w * 3);
  else
    synth(img, h, w);
  cr_assert_eq(tjCompress2(t, img, w, 0, h, TJPF_RGB, &buf, &n, TJSAMP_420,
                           90, TJFLAG_PROGRESSIVE),
               0, "%s", tjGetErrorStr2(t));
  tjDestroy(t);
  free(img);
  jp = buf;
  /* The last SOS, and the EOI that ends its data. */
  for (pos = 2; pos + 1 < n; pos++)
    if (jp[pos] == 0xFF && jp[pos + 1] == 0xDA)
      last = pos;
  cr_assert_gt(last, 0);
  end = n - 2;
  cr_assert(jp[end] == 0xFF && jp[end + 1] == 0xD9);
  out = malloc(last + (end - last) * (size_t)copies + 2);
  memcpy(out, jp, last);
  o = last;
  for (int i = 0; i < copies; i++) {
    memcpy(out + o, jp + last, end - last);
    o += end - last;
  }
  out[o++] = 0xFF;
  out[o++] = 0xD9;
  tjFree(buf);
  *len = o;
  return out;
}

/* A small baseline JPEG whose frame header claims h x w: a few hundred
 * bytes that would make the decoder allocate h * w * 3 and more. */
static uint8_t *huge_header(int h, int w, size_t *len) {
  enum { H = 16, W = 16 };
  static uint8_t img[H * W * 3];
  uint8_t *jp;
  synth(img, H, W);
  jp = encode(img, H, W, TJPF_RGB, TJSAMP_444, 90, len);
  for (size_t p = 2; p + 9 < *len; p++)
    if (jp[p] == 0xFF && jp[p + 1] == 0xC0) {
      jp[p + 5] = (uint8_t)(h >> 8);
      jp[p + 6] = (uint8_t)h;
      jp[p + 7] = (uint8_t)(w >> 8);
      jp[p + 8] = (uint8_t)w;
      return jp;
    }
  cr_assert_fail("no SOF0 in the encoded image");
  return NULL;
}

static ferry_crop_op_t crop224(void) {
  ferry_crop_op_t op;
  memset(&op, 0, sizeof(op));
  op.out_h = op.out_w = 224;
  op.kind = FERRY_CROP_CENTER;
  op.gap = 1.0;
  return op;
}

/* 10,000 copies of the last scan: refused by the scan limit on every
 * path, naming it, before any scan is decoded. */
Test(jpeg, a_scan_bomb_is_refused_by_the_scan_limit) {
  size_t len;
  uint8_t *jp = scan_bomb(1024, 1024, 10000, 1, &len);
  static uint8_t out[1024 * 1024 * 3];
  ferry_jpeg_t *j;
  ferry_error_t err = {0};
  ferry_crop_op_t op = crop224();
  int h, w;
  double t0;

  cr_assert_eq(ferry__jpeg_new(&j, NULL), 0);
  t0 = now_s();
  cr_assert_eq(ferry__jpeg_decode(j, jp, len, out, sizeof(out), &h, &w, &err),
               FERRY_EJPEG);
  cr_assert(strstr(err.msg, "more than 100 scans") != NULL &&
                strstr(err.msg, "--jpeg-max-scans 100") != NULL,
            "%s", err.msg);
  cr_assert_eq(ferry__jpeg_header(j, jp, len, &h, &w, &err), FERRY_EJPEG);
  cr_assert(strstr(err.msg, "--jpeg-max-scans") != NULL, "%s", err.msg);
  cr_assert_eq(ferry__jpeg_decode_crop(j, jp, len, &op, out, sizeof(out), &h,
                                       &w, NULL, &err),
               FERRY_EJPEG);
  cr_assert(strstr(err.msg, "--jpeg-max-scans 100") != NULL, "%s", err.msg);
  op.exact = 1;
  cr_assert_eq(ferry__jpeg_decode_crop(j, jp, len, &op, out, sizeof(out), &h,
                                       &w, NULL, &err),
               FERRY_EJPEG);
  fprintf(stderr, "scan bomb: %zu bytes, refused 4 times in %.3f s\n", len,
          now_s() - t0);
  cr_assert_lt(now_s() - t0, 1.0);
  free(jp);

  /* The same file with 100 scans in all is within the limit and decodes
   * (a limit, not a ban on repeated scans). */
  {
    size_t n2, base;
    uint8_t *one = scan_bomb(256, 256, 1, 0, &base);
    uint32_t scans = 0;
    for (size_t p = 0; p + 1 < base; p++)
      scans += one[p] == 0xFF && one[p + 1] == 0xDA;
    free(one);
    jp = scan_bomb(256, 256, 100 - (int)scans + 1, 0, &n2);
    cr_assert_eq(ferry__jpeg_decode(j, jp, n2, out, sizeof(out), &h, &w, &err),
                 0, "%u + %d scans: %s", scans, 100 - (int)scans, err.msg);
    free(jp);
  }
  ferry__jpeg_free(j);
}

/* A 16000x11000 frame header in a few hundred bytes: refused by the pixel
 * limit from the header, with nothing allocated; with the pixel limit off
 * a byte limit refuses it naming both sizes. */
Test(jpeg, a_huge_frame_header_is_refused_before_allocating) {
  size_t len;
  uint8_t *jp = huge_header(11000, 16000, &len);
  static uint8_t out[224 * 224 * 3];
  ferry_jpeg_t *j;
  ferry_error_t err = {0};
  ferry_crop_op_t op = crop224();
  ferry_jpeg_limits_t lim = {0, FERRY_JPEG_MAX_SCANS, 64u << 20};
  long rss0 = maxrss_kb();
  int h, w;

  cr_assert_lt(len, 1024);
  cr_assert_eq(ferry__jpeg_new(&j, NULL), 0);
  cr_assert_eq(ferry__jpeg_header(j, jp, len, &h, &w, &err), FERRY_EJPEG);
  cr_assert(strstr(err.msg, "image 16000x11000 has 176000000 pixels") !=
                    NULL &&
                strstr(err.msg, "--jpeg-max-pixels 67108864") != NULL,
            "%s", err.msg);
  cr_assert_eq(h, 0);
  cr_assert_eq(ferry__jpeg_decode(j, jp, len, out, sizeof(out), &h, &w, &err),
               FERRY_EJPEG);
  cr_assert_eq(ferry__jpeg_decode_crop(j, jp, len, &op, out, sizeof(out), &h,
                                       &w, NULL, &err),
               FERRY_EJPEG);
  cr_assert(strstr(err.msg, "--jpeg-max-pixels") != NULL, "%s", err.msg);

  ferry__jpeg_set_limits(j, &lim);
  cr_assert_eq(ferry__jpeg_header(j, jp, len, &h, &w, &err), FERRY_EJPEG);
  cr_assert(strstr(err.msg, "decoding image 16000x11000 (baseline) needs "
                            "about 672 MiB, over this thread's limit of 64 "
                            "MiB (--decode-bytes / threads)") != NULL,
            "%s", err.msg);
  cr_assert_eq(ferry__jpeg_decode_crop(j, jp, len, &op, out, sizeof(out), &h,
                                       &w, NULL, &err),
               FERRY_EJPEG);
  cr_assert(strstr(err.msg, "--decode-bytes") != NULL, "%s", err.msg);
  fprintf(stderr, "huge header: %zu bytes; max RSS grew %ld KiB\n", len,
          maxrss_kb() - rss0);
  cr_assert_lt(maxrss_kb() - rss0, 32 << 10, "the decode allocated");
  ferry__jpeg_free(j);
  free(jp);
}

/* A progressive image counts its coefficient buffer; a baseline one of the
 * same size does not need it. */
Test(jpeg, the_byte_limit_counts_progressive_coefficients) {
  enum { H = 512, W = 512 };
  size_t lp, lb;
  uint8_t *prog = scan_bomb(H, W, 1, 0, &lp);
  static uint8_t img[H * W * 3], out[H * W * 3];
  uint8_t *base;
  ferry_jpeg_t *j;
  ferry_error_t err = {0};
  /* Pixels: 1 MiB at 4 bytes; 4:2:0 coefficients: about 0.75 MiB more. */
  ferry_jpeg_limits_t lim = {0, 0, (3u << 19) + (1u << 20) / 4};
  int h, w;
  synth(img, H, W);
  base = encode(img, H, W, TJPF_RGB, TJSAMP_420, 90, &lb);
  cr_assert_eq(ferry__jpeg_new(&j, NULL), 0);
  ferry__jpeg_set_limits(j, &lim);
  cr_assert_eq(ferry__jpeg_decode(j, base, lb, out, sizeof(out), &h, &w, &err),
               0, "%s", err.msg);
  cr_assert_eq(ferry__jpeg_decode(j, prog, lp, out, sizeof(out), &h, &w, &err),
               FERRY_EJPEG);
  cr_assert(strstr(err.msg, "(progressive) needs about") != NULL, "%s",
            err.msg);
  ferry__jpeg_free(j);
  free(prog);
  free(base);
}
