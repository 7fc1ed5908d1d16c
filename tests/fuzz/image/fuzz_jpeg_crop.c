/* Fuzzes the JPEG decode fused with a crop (ferry__jpeg_decode_crop): the
 * first 8 bytes choose the op (random_resized_crop, resize(S) |
 * center_crop, center_crop), the output size (1..64 a side), the sampler's
 * key, the DCT-scale gap and the exact path; the rest is the JPEG. The
 * output goes to a buffer of exactly out_h * out_w * 3 bytes (so
 * AddressSanitizer sees any write past it), then the same call with one
 * byte less must fail with FERRY_ERANGE. One decoder lives across inputs,
 * as in a worker thread, so a handle left broken by a bad input shows on
 * the next one. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "crop.h"
#include "ferry/error.h"
#include "imgops.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Images above this are skipped: a few corrupt bytes can declare a huge
 * image, and decoding megapixels of garbage makes the fuzzer crawl. */
#define MAX_SIDE 4096
#define MAX_PIXELS (1 << 20)

static ferry_jpeg_t *jpeg;

static int is_jpeg_error(int rc) {
  return rc == FERRY_EJPEG || rc == FERRY_EJPEGTRUNC || rc == FERRY_ENOMEM;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ferry_error_t err;
  ferry_crop_op_t op;
  ferry_jpeg_crop_info_t info;
  int h = 0, w = 0, oh = 0, ow = 0, rc;
  size_t n;
  uint8_t *out;

  if (jpeg == NULL && ferry__jpeg_new(&jpeg, NULL) != 0)
    __builtin_trap();
  if (size < 8)
    return 0;
  memset(&op, 0, sizeof(op));
  op.kind = (ferry_crop_kind_t)(1 + data[0] % 3);
  op.out_h = 1 + data[1] % 64;
  op.out_w = 1 + data[2] % 64;
  if (op.kind == FERRY_CROP_RESIZE_CENTER && (data[0] & 8))
    op.out_h = op.out_w = 0; /* resize(S) alone */
  op.shorter = 1 + data[3] % 96;
  op.rrc.scale_min = 0.01 + (data[4] & 15) / 16.0 * 0.9;
  op.rrc.scale_max = 1.0;
  op.rrc.ratio_min = 0.5;
  op.rrc.ratio_max = 2.0;
  op.key = (uint64_t)data[5] << 8 | data[6];
  op.gap = (data[7] & 3) == 3 ? 2.0 : 1.0;
  op.exact = (data[7] & 4) != 0;
  data += 8;
  size -= 8;

  if (ferry__jpeg_header(jpeg, data, size, &h, &w, &err) != 0) {
    if (!is_jpeg_error(err.code))
      __builtin_trap();
    return 0;
  }
  if (h > MAX_SIDE || w > MAX_SIDE || (long)h * w > MAX_PIXELS)
    return 0;
  /* The output size the plan gives (resize(S) alone: from the image). */
  {
    ferry_window_t win;
    if (ferry__crop_plan(&op, h, w, &win, &oh, &ow, &err) != 0)
      __builtin_trap();
    if (oh <= 0 || ow <= 0 || oh > 8192 || ow > 8192)
      return 0;
  }
  n = (size_t)oh * (size_t)ow * 3;
  out = malloc(n);
  if (out == NULL)
    return 0;
  rc = ferry__jpeg_decode_crop(jpeg, data, size, &op, out, n, &oh, &ow, &info,
                               &err);
  if (rc != 0 && !is_jpeg_error(rc)) {
#ifdef FUZZ_DEBUG
    fprintf(stderr, "rc %d: %s\n", rc, err.msg);
#endif
    __builtin_trap();
  }
  if (rc == 0) {
    volatile uint8_t sink = out[0] ^ out[n - 1];
    (void)sink;
    if ((size_t)oh * (size_t)ow * 3 != n || info.scale < 1 || info.scale > 8)
      __builtin_trap();
  }
  free(out);
  /* One byte short of the output: an error, never a write past the end. */
  out = malloc(n - 1 > 0 ? n - 1 : 1);
  if (out == NULL)
    return 0;
  rc = ferry__jpeg_decode_crop(jpeg, data, size, &op, out, n - 1, &oh, &ow,
                               NULL, &err);
  if (rc == 0)
    __builtin_trap();
  free(out);
  return 0;
}
