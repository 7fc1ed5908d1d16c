/* Fuzzes the window path (jpeg_restart.h): the first 4 bytes choose a box
 * of MCUs, the rest is a JPEG. When its markers say it has tiles, the
 * tiles are found and the box cut; a cut must itself be a tiled JPEG of
 * the box's size whose tiles are found again, and whole image's cut is
 * the image. Then the fused decode runs on the JPEG with its window path
 * (which cuts by the crop) and on the cut. Everything reads and writes
 * inside its buffers (AddressSanitizer); no input crashes or leaks. One
 * decoder lives across inputs, as in a worker thread. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "crop.h"
#include "ferry/error.h"
#include "imgops.h"
#include "jpeg_restart.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Images above this are not decoded (garbage megapixels crawl). */
#define MAX_PIXELS (1 << 20)

static ferry_jpeg_t *jpeg;
static ferry_jpeg_tiles_t tiles, tiles2;
static uint8_t *cut;
static size_t cut_cap;

static void decode(const uint8_t *d, size_t n, uint8_t sel) {
  static uint8_t out[64 * 64 * 3];
  ferry_crop_op_t op;
  ferry_error_t err;
  int oh, ow;
  memset(&op, 0, sizeof(op));
  op.kind = FERRY_CROP_RANDOM_RESIZED;
  op.out_h = op.out_w = 1 + sel % 64;
  op.rrc = (ferry_rrc_t){0.08, 1.0, 0.75, 4.0 / 3};
  op.key = sel;
  op.gap = sel & 1 ? 2.0 : 0.0;
  (void)ferry__jpeg_decode_crop(jpeg, d, n, &op, out, sizeof(out), &oh, &ow,
                                NULL, &err);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ferry_jpeg_layout_t l, l2;
  char why[200];
  int mx0, my0, mx1, my1;
  long n;

  if (jpeg == NULL && ferry__jpeg_new(&jpeg, NULL) != 0)
    __builtin_trap();
  if (size < 4)
    return 0;
  const uint8_t *sel = data;
  data += 4;
  size -= 4;
  if (ferry__jpeg_layout(data, size, &l, why, sizeof(why)) != 1)
    return 0;
  if (l.restart <= 0 || l.mcus_x % l.restart != 0 || l.scan > size ||
      l.sos >= l.scan || l.sof + 5 > l.sos)
    __builtin_trap();
  if ((long long)l.width * l.height > MAX_PIXELS)
    return 0;
  int rc = ferry__jpeg_tiles_find(data, size, &l, &tiles, why, sizeof(why));
  if (rc == -1 && why[0] == '\0')
    __builtin_trap(); /* a refusal always says why */
  if (rc == 0) {
    int cols = l.mcus_x / l.restart;
    mx0 = sel[0] % cols * l.restart;
    mx1 = mx0 + (1 + sel[2] % (cols - mx0 / l.restart)) * l.restart;
    my0 = sel[1] % l.mcus_y;
    my1 = my0 + 1 + sel[3] % (l.mcus_y - my0);
    n = ferry__jpeg_window_cut(data, size, &l, &tiles, mx0, my0, mx1, my1,
                               &cut, &cut_cap);
    if (n < 0 || (size_t)n > cut_cap)
      __builtin_trap();
    /* The cut is a tiled JPEG of the box, its tiles in order. */
    if (ferry__jpeg_layout(cut, (size_t)n, &l2, why, sizeof(why)) != 1 ||
        l2.mcus_x != mx1 - mx0 || l2.mcus_y != my1 - my0 ||
        ferry__jpeg_tiles_find(cut, (size_t)n, &l2, &tiles2, why,
                               sizeof(why)) != 0)
      __builtin_trap();
    if (mx0 == 0 && my0 == 0 && mx1 == l.mcus_x && my1 == l.mcus_y &&
        (size_t)n > size)
      __builtin_trap();
    decode(cut, (size_t)n, sel[1]);
  }
  decode(data, size, sel[0]);
  return 0;
}
