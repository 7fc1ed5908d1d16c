/* torchvision-style crop and resize ops on uint8 HWC images, and the JPEG
 * decode fused with them (semantics in docs/TORCHVISION_OPS.md):
 *
 *   - the crop sampler of RandomResizedCrop (torchvision's get_params,
 *     drawn from Ferry's own counter-based generator keyed by (seed,
 *     epoch, record), not torch's RNG);
 *   - the geometry of Resize(shorter) and CenterCrop(h, w);
 *   - an antialiased resampler (PIL / torchvision antialias=True: a
 *     triangle filter whose support grows with the downscale factor,
 *     plain bilinear when upscaling) of a fractional source window;
 *   - ferry__jpeg_decode_crop: the decoder is told the window and the
 *     output size before it runs, decodes only the iMCU rows and columns
 *     the window touches, at the smallest DCT scale s/8 (s = 1, 2, 4 or
 *     8, the ones libjpeg-turbo has SIMD for) that leaves at least the
 *     output resolution, then resamples the rest.
 *
 * Everything here is deterministic: the same (op, image, key) gives the
 * same pixels on every machine.
 */
#ifndef FERRY_CROP_H
#define FERRY_CROP_H

#include <stddef.h>
#include <stdint.h>

#include "ferry/error.h"
#include "imgops.h"

/* An integer box of an image: rows [top, top + height), columns
 * [left, left + width). torchvision's (i, j, h, w). */
typedef struct ferry_box_s {
  int top, left, height, width;
} ferry_box_t;

/* What the resampler reads: the output's pixels are spread evenly over
 * the fractional source window [x, x + w) x [y, y + h) (output pixel
 * (ox, oy) is centred at x + (ox + 0.5) * w / out_w, ...), and the filter
 * reads only source pixels inside the integer box `clip` (its taps are
 * renormalised at the box's edges, as PIL and torchvision do at the
 * image's edges). Source pixels are those of the whole image. */
typedef struct ferry_window_s {
  double x, y, w, h;
  ferry_box_t clip;
} ferry_window_t;

/* RandomResizedCrop's parameters (torchvision defaults: scale (0.08, 1),
 * ratio (3/4, 4/3)). Valid ranges (docs/TORCHVISION_OPS.md): 0 < scale_min <=
 * scale_max <= 1, 0 < ratio_min <= ratio_max, both ratios in
 * [1/100, 100]. */
typedef struct ferry_rrc_s {
  double scale_min, scale_max;
  double ratio_min, ratio_max;
} ferry_rrc_t;

/* The key of one image's random draws: a hash of (seed, epoch, record),
 * where record is the record's identity in the dataset (the worker uses
 * file_index << 40 | index in file), so a split leased again replays the
 * same crops. */
uint64_t ferry__crop_key(uint64_t seed, uint64_t epoch, uint64_t record);

/* torchvision.transforms.RandomResizedCrop.get_params for an h x w image
 * (h, w >= 1): 10 tries of area fraction ~ U(scale), log-aspect ~
 * U(log ratio), w = round(sqrt(A * r)), h = round(sqrt(A / r)), accepted
 * when 0 < w <= W and 0 < h <= H, then top ~ U{0..H-h}, left ~ U{0..W-w};
 * else the centre crop clamped to the ratio range. Draws come from `key`
 * (ferry__crop_key). */
void ferry__rrc_sample(const ferry_rrc_t *p, int h, int w, uint64_t key,
                       ferry_box_t *out);

/* torchvision Resize(shorter) output size of an h x w image: the shorter
 * side becomes `shorter`, the longer int(shorter * long / short). */
void ferry__resize_shorter_size(int h, int w, int shorter, int *oh, int *ow);

/* torchvision CenterCrop(ch, cw) of an h x w image: the box, whose
 * top/left are int(round((h - ch) / 2.0)) with Python's round (half to
 * even); negative where the crop is larger than the image (torchvision
 * pads with zeros there; so does ferry__resample: pixels of the output
 * outside the image are 0). */
void ferry__center_crop_box(int h, int w, int ch, int cw, ferry_box_t *out);

/* The window that resamples a box of an image to any output size
 * (RandomResizedCrop: crop, then resize the crop). */
void ferry__window_of_box(const ferry_box_t *b, ferry_window_t *win);

/* The window of Resize(shorter) then CenterCrop(ch, cw) on an h x w image,
 * in source pixels. torchvision resizes the whole image first, so its
 * filter reads past the crop: the clip is the window grown by the
 * filter's support, inside the image (the same taps as the whole image's
 * resize). ch = cw = 0: Resize alone (output = the resized size). Sets
 * the output size in *oh, *ow. Output pixels outside the resized image
 * (crop larger than it) are zeros. */
void ferry__window_resize_center(int h, int w, int shorter, int ch, int cw,
                                 ferry_window_t *win, int *oh, int *ow);

/* The antialiased resampler. Holds the per-output-row and -column taps
 * and a float row of scratch; one per thread, reused (grows to the
 * largest image, then allocates nothing). */
typedef struct ferry_resampler_s ferry_resampler_t;
int ferry__resampler_new(ferry_resampler_t **out, ferry_error_t *err);
void ferry__resampler_free(ferry_resampler_t *r);

/* Resamples `win` of the sh x sw x c image at `src` (rows `stride` bytes
 * apart) into dst (dh x dw x c, packed). The window's clip must lie
 * inside the image (FERRY_EINVAL otherwise); output pixels whose centre
 * falls outside the clip are 0 (torchvision's zero padding of a centre
 * crop larger than the resized image).
 * Separable float passes (vertical first), rounded to the nearest uint8
 * once at the end; within +-1 of a double-precision evaluation of the
 * same filter. FERRY_ENOMEM, FERRY_EINVAL (sizes, c not 1..4). */
int ferry__resample(ferry_resampler_t *r, const uint8_t *src, int sh, int sw,
                    size_t stride, int c, const ferry_window_t *win,
                    uint8_t *dst, int dh, int dw, ferry_error_t *err);

/* What ferry__jpeg_decode_crop does to one image. */
typedef enum {
  FERRY_CROP_RANDOM_RESIZED = 1, /* RandomResizedCrop(out_h, out_w) */
  FERRY_CROP_RESIZE_CENTER = 2,  /* Resize(shorter), then CenterCrop
                                    (out_h, out_w) when out_h > 0 */
  FERRY_CROP_CENTER = 3          /* CenterCrop(out_h, out_w) alone */
} ferry_crop_kind_t;

typedef struct ferry_crop_op_s {
  ferry_crop_kind_t kind;
  int out_h, out_w; /* RANDOM_RESIZED, CENTER: required; RESIZE_CENTER:
                       the centre crop, or 0, 0 for none */
  int shorter;      /* RESIZE_CENTER: Resize's shorter side */
  ferry_rrc_t rrc;  /* RANDOM_RESIZED */
  uint64_t key;     /* RANDOM_RESIZED: ferry__crop_key(seed, epoch, record) */
  int exact;        /* 1: full decode, then the resampler (no DCT scaling,
                       no partial decode): the reference path */
  double gap;       /* DCT scale choice: the smallest s/8 with the scaled
                       window >= gap x the output on both axes; 0 means 1
                       (the fastest; PIL's draft). 2 is Pillow's
                       reducing_gap for thumbnails: more accurate, slower
                       (docs/PERFORMANCE.md has both) */
} ferry_crop_op_t;

/* Plans op on an h x w image: the window in source pixels and the output
 * size. FERRY_ETOOSMALL naming the sizes when the output would be empty;
 * FERRY_EINVAL for a malformed op. */
int ferry__crop_plan(const ferry_crop_op_t *op, int h, int w,
                     ferry_window_t *win, int *oh, int *ow, ferry_error_t *err);

/* Counters of one decoder (ferry_jpeg_t), cumulative: how each image
 * decoded by ferry__jpeg_decode_crop went. */
typedef struct ferry_jpeg_crop_stats_s {
  uint64_t images;         /* ferry__jpeg_decode_crop calls that succeeded */
  uint64_t fused;          /* of which decoded partially and/or scaled */
  uint64_t by_scale[9];    /* fused images by DCT scale numerator s (s/8) */
  uint64_t progressive;    /* fused progressive (multi-scan) files: their
                              whole entropy-coded data is decoded, rows above
                              the window are inverse-transformed and dropped
                              (libjpeg-turbo cannot skip them) */
  uint64_t full;           /* decoded whole at full scale: exact option, or
                              a fallback (e.g. an image too small to gain) */
  uint64_t window;         /* decoded from a window cut out of the image's
                              restart-interval tiles (jpeg_restart.h) */
  uint64_t window_fallback; /* tiled images whose window could not be used
                              (damaged or out-of-order markers, a warning
                              in the window): decoded by the paths above */
  uint64_t pixels_decoded; /* pixels libjpeg produced (after scaling and
                              cropping); with `images`, the saving */
} ferry_jpeg_crop_stats_t;

/* Per-image details, for tests and benchmarks (may be NULL). */
typedef struct ferry_jpeg_crop_info_s {
  int src_h, src_w;   /* the JPEG's size */
  ferry_window_t win; /* the plan, in source pixels */
  int scale;          /* DCT scale numerator s (s/8); 8 when full */
  int progressive;
  ferry_box_t decoded; /* what libjpeg produced, in scaled pixels */
  int window;          /* 1: from a window of restart-interval tiles */
  int window_fallback; /* 1: the image has tiles, but its window could not
                          be used (ferry__jpeg_window_why says why) */
} ferry_jpeg_crop_info_t;

/* Decodes the JPEG at src (as ferry__jpeg_decode: TF's IFAST DCT, fancy
 * upsampling, RGB; grayscale replicated, CMYK/YCCK converted with TF's
 * formula) fused with `op`: the decoder is given the window before it
 * runs, decodes only the iMCU rows and columns the window's clip touches
 * (plus two rows/columns of context for the upsampler), at the smallest
 * DCT scale s/8 of s = 1, 2, 4, 8 with window * s/8 >= gap x the output
 * on both axes, and resamples that to the output. dst holds *oh x *ow x 3 bytes
 * (cap bytes at least). Errors as ferry__jpeg_decode (FERRY_EJPEG,
 * FERRY_EJPEGTRUNC: the data must still reach its end-of-image marker, checked
 * by a walk of the marker structure even when decoding stops early),
 * FERRY_ERANGE when cap is too small, FERRY_ETOOSMALL from the plan. */
int ferry__jpeg_decode_crop(ferry_jpeg_t *j, const uint8_t *src, size_t len,
                            const ferry_crop_op_t *op, uint8_t *dst, size_t cap,
                            int *oh, int *ow, ferry_jpeg_crop_info_t *info,
                            ferry_error_t *err);

/* The window path (jpeg_restart.h): ferry__jpeg_decode_crop decodes an
 * image laid out in restart-interval tiles (ferryctl records optimize)
 * from the tiles that cover the crop alone, cut out into a JPEG of their
 * own: the same pixels as the path above, without entropy-decoding the
 * rest. Any doubt (markers out of order or missing, a warning in the
 * window) falls back to the path above, which then decides. On by
 * default; off for comparisons. */
void ferry__jpeg_set_window(ferry_jpeg_t *j, int on);
/* Why the last window attempt that fell back did: the byte offset in
 * the JPEG and what was there ("" until one has). */
const char *ferry__jpeg_window_why(const ferry_jpeg_t *j);

/* The decoder's counters (zeros for a decoder that never cropped). */
void ferry__jpeg_crop_stats(const ferry_jpeg_t *j,
                            ferry_jpeg_crop_stats_t *out);

#endif /* FERRY_CROP_H */
