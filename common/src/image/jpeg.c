/* JPEG decoding through TurboJPEG 2.1, matching tf.io.decode_jpeg with its
 * defaults and channels=3: IFAST DCT (TJFLAG_FASTDCT), fancy upsampling,
 * RGB output, CMYK/YCCK converted to RGB with TensorFlow's formula,
 * grayscale replicated to RGB.
 *
 * Warning policy, as TensorFlow's decoder: data that ends before the
 * image is complete is an error (TF fails unless try_recover_truncated is
 * set), any other libjpeg warning (e.g. extraneous bytes before a marker)
 * is accepted. TurboJPEG's memory source turns running out of data into
 * the warning "Premature end of JPEG file" and a fake EOI, and keeps only
 * the first warning's text, so the decoder runs with STOPONWARNING first:
 * clean files (nearly all) decode once; a file whose first warning is the
 * premature end is truncated; a file with another warning is decoded again
 * without stopping, and is truncated when its marker structure ends
 * before EOI (checked by a small marker walker below). */
#include "ferry/imgops.h"

#include <limits.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include <turbojpeg.h>

#include "ferry/alloc.h"
#include "imgops_internal.h"

/* TensorFlow refuses images of 2^29 samples or more before decoding
 * ("Image too large"); so does Ferry, which also bounds what a tiny
 * corrupt file can make the decoder write. */
#define MAX_SAMPLES (1LL << 29)

struct ferry_jpeg_s {
  tjhandle tj;
  uint8_t *cmyk; /* CMYK scratch when dst is too small for 4 channels */
  size_t cmyk_cap;
};

int ferry_jpeg_new(ferry_jpeg_t **out, ferry_error_t *err) {
  ferry_jpeg_t *j;
  *out = NULL;
  j = ferry__calloc(1, sizeof(*j));
  if (j == NULL)
    return ferry__seterr(err, FERRY_ENOMEM, "jpeg: out of memory");
  j->tj = tjInitDecompress();
  if (j->tj == NULL) {
    ferry__free(j);
    return ferry__seterr(err, FERRY_ENOMEM, "jpeg: tjInitDecompress: %s",
                         tjGetErrorStr2(NULL));
  }
  *out = j;
  return 0;
}

void ferry_jpeg_free(ferry_jpeg_t *j) {
  if (j == NULL)
    return;
  tjDestroy(j->tj);
  ferry__free(j->cmyk);
  ferry__free(j);
}

/* After a failed call TurboJPEG 2.1 can leave the libjpeg state mid-way
 * (the header path does not abort it), and every later call then fails:
 * replace the handle after any call that did not return 0. Rare. */
static int reset_handle(ferry_jpeg_t *j) {
  tjhandle t = tjInitDecompress();
  if (t == NULL)
    return FERRY_ENOMEM;
  tjDestroy(j->tj);
  j->tj = t;
  return 0;
}

enum { WALK_COMPLETE = 0, WALK_TRUNCATED = 1, WALK_NOT_JPEG = 2 };

/* Walks the marker structure: segments by their lengths, entropy-coded
 * data up to the next marker that is not a stuffed byte or a restart.
 * Returns WALK_TRUNCATED when the data ends before EOI, WALK_NOT_JPEG when
 * it does not start with SOI, else WALK_COMPLETE (also for structures too
 * broken to follow: libjpeg reports those itself). Sets *adobe when an
 * Adobe APP14 segment comes before the first scan, as libjpeg's
 * saw_Adobe_marker. Reads only inside [d, d + n). */
static int walk(const uint8_t *d, size_t n, int *adobe) {
  size_t pos = 2;
  int in_header = 1;
  *adobe = 0;
  if (n < 2 || d[0] != 0xFF || d[1] != 0xD8)
    return WALK_NOT_JPEG;
  for (;;) {
    unsigned m;
    size_t len;
    while (pos < n && d[pos] != 0xFF)
      pos++;
    while (pos < n && d[pos] == 0xFF)
      pos++;
    if (pos >= n)
      return WALK_TRUNCATED;
    m = d[pos++];
    if (m == 0xD9)
      return WALK_COMPLETE;
    if (m == 0x00 || m == 0x01 || m == 0xD8 || (m >= 0xD0 && m <= 0xD7))
      continue;
    if (n - pos < 2)
      return WALK_TRUNCATED;
    len = (size_t)d[pos] << 8 | d[pos + 1];
    if (len < 2)
      return WALK_COMPLETE;
    if (n - pos < len)
      return WALK_TRUNCATED;
    if (m == 0xEE && in_header && len >= 2 + 12 &&
        memcmp(d + pos + 2, "Adobe", 5) == 0)
      *adobe = 1;
    pos += len;
    if (m != 0xDA)
      continue;
    in_header = 0;
    /* Entropy-coded data: FF 00 is a stuffed byte, FF D0..D7 a restart. */
    for (;;) {
      const uint8_t *ff = memchr(d + pos, 0xFF, n - pos);
      if (ff == NULL)
        return WALK_TRUNCATED;
      pos = (size_t)(ff - d);
      if (n - pos < 2)
        return WALK_TRUNCATED;
      if (d[pos + 1] == 0x00 || (d[pos + 1] >= 0xD0 && d[pos + 1] <= 0xD7)) {
        pos += 2;
        continue;
      }
      break;
    }
  }
}

static int read_header(ferry_jpeg_t *j, const uint8_t *src, size_t len,
                       int *h, int *w, int *cs, ferry_error_t *err) {
  int ww = 0, hh = 0, sub = 0, adobe;
  *cs = -1;
  if (len == 0 || src == NULL)
    return ferry__seterr(err, FERRY_EJPEG, "jpeg: empty data");
  if (len > ULONG_MAX)
    return ferry__seterr(err, FERRY_EJPEG, "jpeg: %zu bytes is too large",
                         len);
  if (tjDecompressHeader3(j->tj, src, (unsigned long)len, &ww, &hh, &sub,
                          cs) != 0) {
    /* The sizes are only set when the header was read: then the failure
     * is a warning only, accepted here as in the decoder. Otherwise a
     * warning before the failure is most often the data running out. */
    const char *msg = tjGetErrorStr2(j->tj);
    int warn = tjGetErrorCode(j->tj) == TJERR_WARNING;
    int code = warn && walk(src, len, &adobe) == WALK_TRUNCATED
                   ? FERRY_EJPEGTRUNC
                   : FERRY_EJPEG;
    /* TurboJPEG also refuses headers whose sampling factors match none of
     * its subsampling types (e.g. TF's CMYK test image), after reading
     * the sizes; libjpeg decodes those, so does TF, so does Ferry. */
    int odd_sampling = strstr(msg, "subsampling type") != NULL && *cs >= 0;
    if (!((warn || odd_sampling) && ww > 0 && hh > 0)) {
      ferry__seterr(err, code, "jpeg: header: %s", msg);
      if (reset_handle(j) != 0)
        return ferry__seterr(err, FERRY_ENOMEM, "jpeg: out of memory");
      return code;
    }
    if (reset_handle(j) != 0)
      return ferry__seterr(err, FERRY_ENOMEM, "jpeg: out of memory");
  }
  if (ww <= 0 || hh <= 0)
    return ferry__seterr(err, FERRY_EJPEG, "jpeg: no image (size %dx%d)",
                         ww, hh);
  *h = hh;
  *w = ww;
  return 0;
}

int ferry_jpeg_header(ferry_jpeg_t *j, const uint8_t *src, size_t len,
                      int *h, int *w, ferry_error_t *err) {
  int cs;
  return read_header(j, src, len, h, w, &cs, err);
}

/* TensorFlow's CMYK to RGB (jpeg_mem.cc): Adobe files store inverted
 * CMYK. In place is safe: pixel i is read before its 3 bytes are written
 * and writes never reach a later pixel's 4 bytes. */
static void cmyk_to_rgb(const uint8_t *in, uint8_t *out, size_t npix,
                        int adobe) {
  for (size_t i = 0; i < npix; i++) {
    int c = in[4 * i], m = in[4 * i + 1], y = in[4 * i + 2];
    int k = in[4 * i + 3];
    if (adobe) {
      out[3 * i] = (uint8_t)(k * c / 255);
      out[3 * i + 1] = (uint8_t)(k * m / 255);
      out[3 * i + 2] = (uint8_t)(k * y / 255);
    } else {
      out[3 * i] = (uint8_t)((255 - k) * (255 - c) / 255);
      out[3 * i + 1] = (uint8_t)((255 - k) * (255 - m) / 255);
      out[3 * i + 2] = (uint8_t)((255 - k) * (255 - y) / 255);
    }
  }
}

/* Handles a first pass that failed (see the top of the file). Returns 0
 * when the file decoded with acceptable warnings only. */
static int pass_failed(ferry_jpeg_t *j, const uint8_t *src, size_t len,
                       uint8_t *target, int ww, int hh, int pf, int flags,
                       int *adobe, ferry_error_t *err) {
  char first[200]; /* libjpeg messages fit in JMSG_LENGTH_MAX = 200 */
  const char *msg = tjGetErrorStr2(j->tj);
  int trunc = walk(src, len, adobe) == WALK_TRUNCATED, rc;
  /* A fatal error with no warning before it: data that ran out would
   * have warned first. */
  if (tjGetErrorCode(j->tj) != TJERR_WARNING)
    return ferry__seterr(err, FERRY_EJPEG, "jpeg: %s", msg);
  if (strstr(msg, "Premature end of JPEG file") != NULL)
    return ferry__seterr(err, FERRY_EJPEGTRUNC, "jpeg: %s", msg);
  /* A recoverable warning: decode again and let it complete. Only the
   * first warning's text is kept, so a different text afterwards means a
   * fatal error came later (the error code cannot tell: TurboJPEG reports
   * TJERR_WARNING whenever a warning happened). */
  snprintf(first, sizeof(first), "%s", msg);
  if (reset_handle(j) != 0)
    return ferry__seterr(err, FERRY_ENOMEM, "jpeg: out of memory");
  rc = tjDecompress2(j->tj, src, (unsigned long)len, target, ww, 0, hh, pf,
                     flags);
  if (rc != 0) {
    msg = tjGetErrorStr2(j->tj);
    if (tjGetErrorCode(j->tj) != TJERR_WARNING || strcmp(msg, first) != 0)
      return ferry__seterr(err, FERRY_EJPEG, "jpeg: %s (after: %s)", msg,
                           first);
  }
  if (trunc)
    return ferry__seterr(err, FERRY_EJPEGTRUNC,
                         "jpeg: data ends before the end-of-image marker "
                         "(first warning: %s)", first);
  return 0;
}

/* Decodes as ferry_jpeg_decode; `accurate` selects ISLOW (tests only). */
int ferry__jpeg_decode_dct(ferry_jpeg_t *j, const uint8_t *src, size_t len,
                           uint8_t *dst, size_t cap, int *h, int *w,
                           int accurate, ferry_error_t *err) {
  int hh = 0, ww = 0, cs = 0, rc, cmyk, pf, adobe = 0;
  int flags = (accurate ? TJFLAG_ACCURATEDCT : TJFLAG_FASTDCT);
  size_t npix, need;
  uint8_t *target;

  rc = read_header(j, src, len, &hh, &ww, &cs, err);
  if (rc != 0)
    return rc;
  *h = hh;
  *w = ww;
  cmyk = cs == TJCS_CMYK || cs == TJCS_YCCK;
  npix = (size_t)hh * (size_t)ww;
  if ((long long)npix * (cmyk ? 4 : cs == TJCS_GRAY ? 1 : 3) >= MAX_SAMPLES)
    return ferry__seterr(err, FERRY_EJPEG,
                         "jpeg: image %dx%d is too large (TensorFlow's limit "
                         "is 2^29 samples)", ww, hh);
  need = npix * 3;
  if (cap < need)
    return ferry__seterr(err, FERRY_ERANGE,
                         "jpeg: a %dx%d image needs %zu bytes, the buffer "
                         "holds %zu", ww, hh, need, cap);
  target = dst;
  pf = TJPF_RGB;
  if (cmyk) {
    pf = TJPF_CMYK;
    if (cap < npix * 4) {
      if (j->cmyk_cap < npix * 4) {
        uint8_t *p = ferry__malloc(npix * 4);
        if (p == NULL)
          return ferry__seterr(err, FERRY_ENOMEM,
                               "jpeg: out of memory for a %dx%d CMYK image",
                               ww, hh);
        ferry__free(j->cmyk);
        j->cmyk = p;
        j->cmyk_cap = npix * 4;
      }
      target = j->cmyk;
    }
  }

  rc = tjDecompress2(j->tj, src, (unsigned long)len, target, ww, 0, hh, pf,
                     flags | TJFLAG_STOPONWARNING);
  if (rc == 0) {
    if (cmyk)
      walk(src, len, &adobe);
  } else {
    rc = pass_failed(j, src, len, target, ww, hh, pf, flags, &adobe, err);
    if (reset_handle(j) != 0)
      return ferry__seterr(err, FERRY_ENOMEM, "jpeg: out of memory");
    if (rc != 0)
      return rc;
  }
  if (cmyk)
    cmyk_to_rgb(target, dst, npix, adobe);
  return 0;
}

int ferry_jpeg_decode(ferry_jpeg_t *j, const uint8_t *src, size_t len,
                      uint8_t *dst, size_t cap, int *h, int *w,
                      ferry_error_t *err) {
  return ferry__jpeg_decode_dct(j, src, len, dst, cap, h, w, 0, err);
}
