/* resize(H, W): tf.image.resize(method="bilinear", antialias=False), i.e.
 * ResizeBilinear with half_pixel_centers=True, on uint8 HWC images.
 * TensorFlow computes in float32 and returns float32. Ferry's data path is
 * uint8, so the result is rounded half away from zero and clamped to
 * [0, 255]: the nearest uint8 to TF's float, which is what a model would
 * see after tf.cast(tf.round(x), tf.uint8) (plain tf.cast would
 * truncate; rounding halves the error against TF's float output). */
#include "imgops.h"

#include <math.h>

typedef struct {
  int lo, hi;
  float lerp;
} interp_t;

/* As TF's compute_interpolation_weights with HalfPixelScaler. */
static inline interp_t weights(int out, float scale, int in_size) {
  interp_t it;
  float in = ((float)out + 0.5f) * scale - 0.5f;
  float in_f = floorf(in);
  it.lo = in_f > 0.0f ? (int)in_f : 0;
  it.hi = (int)ceilf(in);
  if (it.hi > in_size - 1)
    it.hi = in_size - 1;
  if (it.hi < 0)
    it.hi = 0;
  if (it.lo > in_size - 1)
    it.lo = in_size - 1;
  it.lerp = in - in_f;
  return it;
}

static inline uint8_t round_u8(float v) {
  v = roundf(v);
  if (!(v > 0.0f))
    return 0;
  if (v >= 255.0f)
    return 255;
  return (uint8_t)v;
}

void ferry__resize_bilinear(const uint8_t *src, int sh, int sw, int c,
                            uint8_t *dst, int dh, int dw) {
  float ys, xs;
  if (sh <= 0 || sw <= 0 || c <= 0 || dh <= 0 || dw <= 0)
    return;
  ys = (float)sh / (float)dh;
  xs = (float)sw / (float)dw;
  for (int y = 0; y < dh; y++) {
    interp_t iy = weights(y, ys, sh);
    const uint8_t *top = src + (size_t)iy.lo * sw * c;
    const uint8_t *bot = src + (size_t)iy.hi * sw * c;
    uint8_t *o = dst + (size_t)y * dw * c;
    for (int x = 0; x < dw; x++) {
      interp_t ix = weights(x, xs, sw);
      for (int ch = 0; ch < c; ch++) {
        float tl = top[(size_t)ix.lo * c + ch];
        float tr = top[(size_t)ix.hi * c + ch];
        float bl = bot[(size_t)ix.lo * c + ch];
        float br = bot[(size_t)ix.hi * c + ch];
        float t = tl + (tr - tl) * ix.lerp;
        float b = bl + (br - bl) * ix.lerp;
        o[(size_t)x * c + ch] = round_u8(t + (b - t) * iy.lerp);
      }
    }
  }
}
