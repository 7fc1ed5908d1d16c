/* Fuzzes the JPEG decoder: the input is a whole file, sized with
 * ferry__jpeg_header and decoded with ferry__jpeg_decode into a buffer of
 * exactly h * w * 3 bytes (so AddressSanitizer sees any write past it),
 * then decoded again into a buffer one byte short, which must fail with
 * FERRY_ERANGE. Decoded images big enough for blur(11) are blurred too,
 * covering the SIMD blur on odd shapes. One decoder and one blur object
 * live across inputs, as in a worker thread, so a handle left broken by a
 * bad input shows on the next one. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/error.h"
#include "imgops.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Images above this are skipped: a few corrupt bytes can declare a huge
 * image, and decoding megapixels of garbage makes the fuzzer crawl. */
#define MAX_SIDE 4096
#define MAX_PIXELS (1 << 20)

static ferry_jpeg_t *jpeg;
static ferry_blur_t *blur;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ferry_error_t err;
  int h = 0, w = 0, dh = 0, dw = 0, rc;
  size_t n;
  uint8_t *img, *out;

  if (jpeg == NULL && ferry__jpeg_new(&jpeg, NULL) != 0)
    __builtin_trap();
  if (blur == NULL && ferry__blur_new(11, 0.8f, &blur, NULL) != 0)
    __builtin_trap();
  if (ferry__jpeg_header(jpeg, data, size, &h, &w, &err) != 0) {
    if (err.code != FERRY_EJPEG && err.code != FERRY_EJPEGTRUNC &&
        err.code != FERRY_ENOMEM)
      __builtin_trap();
    return 0;
  }
  if (h <= 0 || w <= 0)
    __builtin_trap();
  if (h > MAX_SIDE || w > MAX_SIDE || (long)h * w > MAX_PIXELS)
    return 0;
  n = (size_t)h * w * 3;
  img = malloc(n);
  if (img == NULL)
    return 0;
  rc = ferry__jpeg_decode(jpeg, data, size, img, n, &dh, &dw, &err);
  if (rc != 0 && rc != FERRY_EJPEG && rc != FERRY_EJPEGTRUNC &&
      rc != FERRY_ERANGE && rc != FERRY_ENOMEM)
    __builtin_trap();
  if (rc == 0) {
    volatile uint8_t sink = 0;
    /* The decoder reports the size the header gave. */
    if (dh != h || dw != w)
      __builtin_trap();
    sink ^= img[0] ^ img[n - 1];
    (void)sink;
    if (h > 5 && w > 5) {
      out = malloc(n);
      if (out != NULL) {
        if (ferry__blur_apply(blur, img, out, h, w, 3, &err) != 0)
          __builtin_trap();
        sink ^= out[0] ^ out[n - 1];
        free(out);
      }
    }
  }
  free(img);
  /* One byte short of the image: an error, never a write past the end. */
  img = malloc(n - 1);
  if (img == NULL)
    return 0;
  rc = ferry__jpeg_decode(jpeg, data, size, img, n - 1, &dh, &dw, &err);
  if (rc == 0)
    __builtin_trap();
  free(img);
  return 0;
}
