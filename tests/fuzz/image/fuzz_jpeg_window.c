/* Fuzzes the window path (jpeg_restart.h, jpeg_huff.h): the first 4 bytes
 * choose a crop, the rest is a JPEG. When its markers say it has tiles,
 * they are found (a refusal always says why, the tiles lie inside the
 * data, in order, and the last ends at EOI). Then the fused decode runs
 * with the window path and without it: when the window path decoded the
 * image, the path without it decodes it too, to the same pixels. Nothing
 * reads or writes outside its buffers (AddressSanitizer), crashes or
 * leaks. The decoders live across inputs, as in a worker thread. */
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

static ferry_jpeg_t *win, *plain;
static ferry_jpeg_tiles_t tiles;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static uint8_t a[64 * 64 * 3], b[64 * 64 * 3];
  ferry_jpeg_layout_t l;
  ferry_jpeg_crop_info_t info;
  ferry_crop_op_t op;
  ferry_error_t err;
  char why[200];
  int ha, wa, hb, wb;

  if (win == NULL) {
    if (ferry__jpeg_new(&win, NULL) != 0 ||
        ferry__jpeg_new(&plain, NULL) != 0)
      __builtin_trap();
    ferry__jpeg_set_window(plain, 0);
  }
  if (size < 4)
    return 0;
  const uint8_t *sel = data;
  data += 4;
  size -= 4;
  if (ferry__jpeg_layout(data, size, &l, why, sizeof(why)) == 1) {
    if (l.restart <= 0 || l.mcus_x % l.restart != 0 || l.scan > size ||
        l.ncomp < 1 || l.ncomp > 4)
      __builtin_trap();
    if ((long long)l.width * l.height > MAX_PIXELS)
      return 0;
    int rc = ferry__jpeg_tiles_find(data, size, &l, &tiles, why, sizeof(why));
    if (rc == -1 && why[0] == '\0')
      __builtin_trap(); /* a refusal always says why */
    if (rc == 0) {
      if (tiles.start[0] != l.scan || tiles.start[tiles.n] + 2 > size ||
          data[tiles.start[tiles.n]] != 0xFF ||
          data[tiles.start[tiles.n] + 1] != 0xD9)
        __builtin_trap();
      for (size_t i = 0; i < tiles.n; i++)
        if (ferry__jpeg_tile_end(&tiles, i) < tiles.start[i])
          __builtin_trap();
    }
  } else if ((size_t)l.width * (size_t)l.height > MAX_PIXELS) {
    return 0;
  }

  memset(&op, 0, sizeof(op));
  op.kind = FERRY_CROP_RANDOM_RESIZED;
  op.out_h = op.out_w = 1 + sel[0] % 64;
  op.rrc = (ferry_rrc_t){0.08, 1.0, 0.75, 4.0 / 3};
  op.key = (uint64_t)sel[1] << 16 | (uint64_t)sel[2] << 8 | sel[3];
  op.gap = sel[1] & 1 ? 2.0 : 0.0;
  memset(&info, 0, sizeof(info));
  int ra = ferry__jpeg_decode_crop(win, data, size, &op, a, sizeof(a), &ha,
                                   &wa, &info, &err);
  if (ra == 0 && info.window) {
    int rb = ferry__jpeg_decode_crop(plain, data, size, &op, b, sizeof(b),
                                     &hb, &wb, NULL, &err);
    if (rb != 0 || ha != hb || wa != wb ||
        memcmp(a, b, (size_t)ha * (size_t)wa * 3) != 0)
      __builtin_trap(); /* the window's pixels are the image path's */
  }
  return 0;
}
