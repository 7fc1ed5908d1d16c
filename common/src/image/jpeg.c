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
#include "imgops.h"

#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include <turbojpeg.h>
/* jpeglib.h needs stdio.h (FILE) before it. */
#include <jerror.h>
#include <jpeglib.h>

#include "alloc.h"
#include "crop.h"
#include "imgops_internal.h"
#include "jpeg_huff.h"
#include "jpeg_restart.h"

/* TensorFlow refuses images of 2^29 samples or more before decoding
 * ("Image too large"); so does Ferry, which also bounds what a tiny
 * corrupt file can make the decoder write. */
#define MAX_SAMPLES (1LL << 29)

/* libjpeg's error manager for the fused decode (ferry__jpeg_decode_crop):
 * errors longjmp back, warnings are counted (the first one's text and
 * whether the data ran out are kept) and never stop the decode. */
typedef struct {
  struct jpeg_error_mgr pub;
  jmp_buf jb;
  int warnings;
  int eof; /* JWRN_JPEG_EOF: the data ended before the image did */
  char first[JMSG_LENGTH_MAX];
  char msg[JMSG_LENGTH_MAX];
} crop_err_t;

struct ferry_jpeg_s {
  tjhandle tj;
  uint8_t *cmyk; /* CMYK scratch when dst is too small for 4 channels */
  size_t cmyk_cap;
  /* The fused decode: a libjpeg decompressor (created on first use), the
   * region libjpeg produced, the full image of the exact path, the
   * resampler and the counters. */
  struct jpeg_decompress_struct cinfo;
  crop_err_t cerr;
  int have_cinfo;
  uint8_t *region;
  size_t region_cap;
  ferry_resampler_t *rs;
  ferry_jpeg_crop_stats_t stats;
  ferry_jpeg_limits_t lim;
  /* The window path (jpeg_restart.h): on unless switched off, the tiles
   * of the last image, its entropy decoder and why the last attempt fell
   * back. */
  int window;
  ferry_jpeg_tiles_t tiles;
  ferry_jpeg_huff_t huff;
  char window_why[320];
};

int ferry__jpeg_new(ferry_jpeg_t **out, ferry_error_t *err) {
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
  j->lim.max_pixels = FERRY_JPEG_MAX_PIXELS;
  j->lim.max_scans = FERRY_JPEG_MAX_SCANS;
  j->window = 1;
  *out = j;
  return 0;
}

void ferry__jpeg_set_limits(ferry_jpeg_t *j, const ferry_jpeg_limits_t *l) {
  j->lim = *l;
}

void ferry__jpeg_trim(ferry_jpeg_t *j, size_t keep) {
  if (j->region_cap > keep) {
    ferry__free(j->region);
    j->region = NULL;
    j->region_cap = 0;
  }
  if (j->cmyk_cap > keep) {
    ferry__free(j->cmyk);
    j->cmyk = NULL;
    j->cmyk_cap = 0;
  }
  if (j->tiles.cap * sizeof(*j->tiles.start) > keep)
    ferry__jpeg_tiles_free(&j->tiles);
  if (j->huff.coef_cap > keep)
    ferry__jpeg_huff_free(&j->huff);
}

void ferry__jpeg_free(ferry_jpeg_t *j) {
  if (j == NULL)
    return;
  tjDestroy(j->tj);
  ferry__free(j->cmyk);
  if (j->have_cinfo)
    jpeg_destroy_decompress(&j->cinfo);
  ferry__free(j->region);
  ferry__resampler_free(j->rs);
  ferry__jpeg_tiles_free(&j->tiles);
  ferry__jpeg_huff_free(&j->huff);
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

/* Called by markers() for each marker segment in order: the marker, its
 * payload (after the two length bytes) and the payload's size. Nonzero
 * stops the walk. */
typedef int (*segment_fn)(void *ctx, unsigned m, const uint8_t *payload,
                          size_t size);

/* Walks the marker structure: segments by their lengths, entropy-coded
 * data up to the next marker that is not a stuffed byte or a restart.
 * Returns WALK_TRUNCATED when the data ends before EOI, WALK_NOT_JPEG when
 * it does not start with SOI, else WALK_COMPLETE (also when `seg` stops
 * the walk, and for structures too broken to follow: libjpeg reports
 * those itself). Reads only inside [d, d + n). */
static int markers(const uint8_t *d, size_t n, segment_fn seg, void *ctx) {
  size_t pos = 2;
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
    if (seg(ctx, m, d + pos + 2, len - 2) != 0)
      return WALK_COMPLETE;
    pos += len;
    if (m != 0xDA)
      continue;
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

/* walk()'s visitor: an Adobe APP14 segment before the first scan. */
typedef struct {
  int in_header, adobe;
} adobe_t;

static int adobe_segment(void *ctx, unsigned m, const uint8_t *p,
                         size_t size) {
  adobe_t *a = ctx;
  if (m == 0xEE && a->in_header && size >= 12 && memcmp(p, "Adobe", 5) == 0)
    a->adobe = 1;
  if (m == 0xDA)
    a->in_header = 0;
  return 0;
}

/* markers() over the whole image; sets *adobe when an Adobe APP14 segment
 * comes before the first scan, as libjpeg's saw_Adobe_marker. */
static int walk(const uint8_t *d, size_t n, int *adobe) {
  adobe_t a = {1, 0};
  int rc = markers(d, n, adobe_segment, &a);
  *adobe = a.adobe;
  return rc;
}

/* What the markers say an image will cost (survey()). */
typedef struct {
  int have_sof, progressive, ncomp;
  unsigned h, w;
  uint8_t hs[4], vs[4]; /* sampling factors of the first 4 components */
  uint32_t scans;       /* SOS markers seen (counting stops at limit + 1) */
  uint32_t max_scans;
  ferry_jpeg_tables_t tables;
} survey_t;

static int survey_segment(void *ctx, unsigned m, const uint8_t *f,
                          size_t size) {
  survey_t *s = ctx;
  ferry__jpeg_tables_see(&s->tables, m, f, size);
  if (ferry__jpeg_is_sof(m) && !s->have_sof && size >= 6) {
    s->have_sof = 1;
    s->progressive = (m & 3) == 2; /* SOF2, SOF6, SOF10, SOF14 */
    s->h = (unsigned)f[1] << 8 | f[2];
    s->w = (unsigned)f[3] << 8 | f[4];
    s->ncomp = f[5];
    for (int c = 0; c < s->ncomp && c < 4 && 6 + 3 * (size_t)c + 1 < size;
         c++) {
      s->hs[c] = f[6 + 3 * c + 1] >> 4;
      s->vs[c] = f[6 + 3 * c + 1] & 15;
    }
  }
  return m == 0xDA && ++s->scans > s->max_scans && s->max_scans > 0;
}

/* Walks the markers, reading the frame header and counting scans, up to
 * EOI, the end of the data or `max_scans` + 1 scans. A file libjpeg
 * cannot follow stops the walk early: libjpeg fails on it too. */
static void survey(const uint8_t *d, size_t n, uint32_t max_scans,
                   survey_t *s) {
  memset(s, 0, sizeof(*s));
  s->max_scans = max_scans;
  (void)markers(d, n, survey_segment, s);
}

/* The decode's memory for `s` (see ferry_jpeg_limits_t). */
static uint64_t decode_bytes(const survey_t *s) {
  uint64_t px = (uint64_t)s->h * s->w, bytes, hmax = 1, vmax = 1;
  bytes = px * (s->ncomp == 4 ? 7 : 4);
  if (!s->progressive && s->scans <= 1)
    return bytes; /* single scan: libjpeg decodes an iMCU row at a time */
  for (int c = 0; c < s->ncomp && c < 4; c++) {
    hmax = s->hs[c] > hmax ? s->hs[c] : hmax;
    vmax = s->vs[c] > vmax ? s->vs[c] : vmax;
  }
  for (int c = 0; c < s->ncomp; c++) {
    uint64_t hc = c < 4 && s->hs[c] ? s->hs[c] : 1;
    uint64_t vc = c < 4 && s->vs[c] ? s->vs[c] : 1;
    uint64_t bw = ((s->w * hc + hmax - 1) / hmax + 7) / 8 + 2;
    uint64_t bh = ((s->h * vc + vmax - 1) / vmax + 7) / 8 + 2;
    bytes += bw * bh * 64 * 2;
  }
  return bytes;
}

/* Refuses an image over the decoder's limits before anything is
 * allocated for it. The errors name the limit and the option. */
static int limits_of(const ferry_jpeg_t *j, const survey_t *sv,
                     ferry_error_t *err) {
  const ferry_jpeg_limits_t *l = &j->lim;
  const survey_t s = *sv;
  uint64_t need;
  if (l->max_scans > 0 && s.scans > l->max_scans)
    return ferry__seterr(err, FERRY_EJPEG,
                         "jpeg: more than %" PRIu32 " scans, over the limit "
                         "(--jpeg-max-scans %" PRIu32 ")",
                         l->max_scans, l->max_scans);
  if (!s.have_sof)
    return 0; /* the decoder says what is wrong */
  if (l->max_pixels > 0 && (uint64_t)s.h * s.w > l->max_pixels)
    return ferry__seterr(err, FERRY_EJPEG,
                         "jpeg: image %ux%u has %" PRIu64 " pixels, over the "
                         "limit (--jpeg-max-pixels %" PRIu64 ")",
                         s.w, s.h, (uint64_t)s.h * s.w, l->max_pixels);
  need = decode_bytes(&s);
  if (l->max_bytes > 0 && need > l->max_bytes)
    return ferry__seterr(err, FERRY_EJPEG,
                         "jpeg: decoding image %ux%u (%s) needs about "
                         "%" PRIu64 " MiB, over this thread's limit of "
                         "%" PRIu64 " MiB (--decode-bytes / threads)",
                         s.w, s.h,
                         s.progressive ? "progressive"
                         : s.scans > 1 ? "multi-scan"
                                       : "baseline",
                         (need + (1u << 20) - 1) >> 20, l->max_bytes >> 20);
  return 0;
}

/* A fresh TurboJPEG handle and libjpeg decompressor: what an image that
 * uses tables it does not define must be decoded with (jpeg_restart.h). */
static int renew(ferry_jpeg_t *j, ferry_error_t *err) {
  if (j->have_cinfo) {
    jpeg_destroy_decompress(&j->cinfo);
    j->have_cinfo = 0;
  }
  if (reset_handle(j) != 0)
    return ferry__seterr(err, FERRY_ENOMEM, "jpeg: out of memory");
  return 0;
}

/* What every decode path refuses before libjpeg sees the data: nothing,
 * more than libjpeg's memory source takes, an image over the limits. An
 * image that uses tables it does not define gets fresh decoders. */
static int check_data(ferry_jpeg_t *j, const uint8_t *src, size_t len,
                      ferry_error_t *err) {
  const ferry_jpeg_limits_t *l = &j->lim;
  survey_t s;
  if (len == 0 || src == NULL)
    return ferry__seterr(err, FERRY_EJPEG, "jpeg: empty data");
  if (len > ULONG_MAX)
    return ferry__seterr(err, FERRY_EJPEG, "jpeg: %zu bytes is too large",
                         len);
  survey(src, len, l->max_scans, &s);
  if (s.tables.missing && renew(j, err) != 0)
    return FERRY_ENOMEM;
  if (l->max_pixels == 0 && l->max_scans == 0 && l->max_bytes == 0)
    return 0;
  return limits_of(j, &s, err);
}

static int read_header(ferry_jpeg_t *j, const uint8_t *src, size_t len,
                       int *h, int *w, int *cs, ferry_error_t *err) {
  int ww = 0, hh = 0, sub = 0, adobe, rc;
  /* The sizes are defined on every path (0 on failure): callers' error
   * paths then never read an unset size, and GCC 12 can prove it. */
  *h = 0;
  *w = 0;
  *cs = -1;
  if ((rc = check_data(j, src, len, err)) != 0)
    return rc;
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

int ferry__jpeg_header(ferry_jpeg_t *j, const uint8_t *src, size_t len, int *h,
                       int *w, ferry_error_t *err) {
  int cs;
  return read_header(j, src, len, h, w, &cs, err);
}

/* TensorFlow's CMYK to RGB (jpeg_mem.cc) of one pixel: Adobe files store
 * inverted CMYK. Reads all 4 bytes before writing, so out may be in. */
static inline void cmyk_pixel(const uint8_t *in, uint8_t *out, int adobe) {
  int c = in[0], m = in[1], y = in[2], k = in[3];
  if (adobe) {
    out[0] = (uint8_t)(k * c / 255);
    out[1] = (uint8_t)(k * m / 255);
    out[2] = (uint8_t)(k * y / 255);
  } else {
    out[0] = (uint8_t)((255 - k) * (255 - c) / 255);
    out[1] = (uint8_t)((255 - k) * (255 - m) / 255);
    out[2] = (uint8_t)((255 - k) * (255 - y) / 255);
  }
}

/* In place is safe: pixel i is read before its 3 bytes are written and
 * writes never reach a later pixel's 4 bytes. */
static void cmyk_to_rgb(const uint8_t *in, uint8_t *out, size_t npix,
                        int adobe) {
  for (size_t i = 0; i < npix; i++)
    cmyk_pixel(in + 4 * i, out + 3 * i, adobe);
}

/* In place, 4 bytes a pixel (the 4th left as it is: RGBX). */
static void cmyk_to_rgbx(uint8_t *p, size_t npix, int adobe) {
  for (size_t i = 0; i < npix; i++)
    cmyk_pixel(p + 4 * i, p + 4 * i, adobe);
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

/* Decodes as ferry__jpeg_decode; `accurate` selects ISLOW (tests only). */
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

int ferry__jpeg_decode(ferry_jpeg_t *j, const uint8_t *src, size_t len,
                       uint8_t *dst, size_t cap, int *h, int *w,
                       ferry_error_t *err) {
  return ferry__jpeg_decode_dct(j, src, len, dst, cap, h, w, 0, err);
}

/* ---------------------------------------------------------------------
 * The decode fused with a crop and a DCT scale (crop.h), through
 * libjpeg-turbo's libjpeg API: TurboJPEG 2.1 has no crop or skip. The
 * settings are TurboJPEG's for TJFLAG_FASTDCT (IFAST, fancy upsampling),
 * so at scale 8/8 the pixels libjpeg produces are the full decode's
 * (except one column or row at the edge of the decoded region, where the
 * upsampler lacks its neighbour: the region reaches 2 scaled pixels past
 * the clip on each side, so those never reach the filter).
 *
 * The warning policy is ferry__jpeg_decode's: data that ends before the
 * image is truncated (the JWRN_JPEG_EOF warning, or the marker walk not
 * reaching EOI: decoding stops after the window's last row, so the walk
 * is what sees a file cut below the window), any other warning is
 * accepted, a libjpeg error is a corrupt JPEG. Corrupt entropy-coded data
 * below the window's last iMCU row is not seen (it is never decoded).
 */

static void crop_error_exit(j_common_ptr c) {
  crop_err_t *e = (crop_err_t *)(void *)c->err;
  (*c->err->format_message)(c, e->msg);
  longjmp(e->jb, 1);
}

static void crop_emit_message(j_common_ptr c, int level) {
  crop_err_t *e = (crop_err_t *)(void *)c->err;
  if (level >= 0)
    return; /* trace messages */
  if (e->warnings++ == 0)
    (*c->err->format_message)(c, e->first);
  if (c->err->msg_code == JWRN_JPEG_EOF)
    e->eof = 1;
}

static void crop_output_message(j_common_ptr c) { (void)c; }

static int ensure_cinfo(ferry_jpeg_t *j, ferry_error_t *err) {
  if (j->rs == NULL && ferry__resampler_new(&j->rs, err) != 0)
    return FERRY_ENOMEM;
  if (j->have_cinfo)
    return 0;
  j->cinfo.err = jpeg_std_error(&j->cerr.pub);
  j->cerr.pub.error_exit = crop_error_exit;
  j->cerr.pub.emit_message = crop_emit_message;
  j->cerr.pub.output_message = crop_output_message;
  if (setjmp(j->cerr.jb))
    return ferry__seterr(err, FERRY_ENOMEM, "jpeg: %s", j->cerr.msg);
  jpeg_create_decompress(&j->cinfo);
  j->have_cinfo = 1;
  return 0;
}

static int grow_region(ferry_jpeg_t *j, size_t need, ferry_error_t *err) {
  uint8_t *p;
  if (need <= j->region_cap)
    return 0;
  if (need < j->region_cap + j->region_cap / 2)
    need = j->region_cap + j->region_cap / 2;
  p = ferry__malloc(need);
  if (p == NULL)
    return ferry__seterr(err, FERRY_ENOMEM,
                         "jpeg: out of memory for %zu bytes of pixels", need);
  ferry__free(j->region);
  j->region = p;
  j->region_cap = need;
  return 0;
}

static int check_out(int oh, int ow, size_t cap, ferry_error_t *err) {
  if ((size_t)oh * (size_t)ow * 3 > cap)
    return ferry__seterr(err, FERRY_ERANGE,
                         "jpeg: a %dx%d output needs %zu bytes, the buffer "
                         "holds %zu",
                         ow, oh, (size_t)oh * (size_t)ow * 3, cap);
  return 0;
}

/* The exact path: the full decode (ferry__jpeg_decode), then the
 * resampler over the plan's window. */
static int decode_crop_exact(ferry_jpeg_t *j, const uint8_t *src, size_t len,
                             const ferry_crop_op_t *op, uint8_t *dst,
                             size_t cap, int *oh, int *ow,
                             ferry_jpeg_crop_info_t *info,
                             ferry_error_t *err) {
  int h, w, rc;
  ferry_window_t win;
  if ((rc = ferry__jpeg_header(j, src, len, &h, &w, err)) != 0)
    return rc;
  if ((rc = ferry__crop_plan(op, h, w, &win, oh, ow, err)) != 0 ||
      (rc = check_out(*oh, *ow, cap, err)) != 0)
    return rc;
  if ((long long)h * w * 3 >= MAX_SAMPLES)
    return ferry__seterr(err, FERRY_EJPEG,
                         "jpeg: image %dx%d is too large (TensorFlow's limit "
                         "is 2^29 samples)", w, h);
  if ((rc = grow_region(j, (size_t)h * (size_t)w * 3, err)) != 0 ||
      (rc = ferry__jpeg_decode(j, src, len, j->region, j->region_cap, &h, &w,
                               err)) != 0)
    return rc;
  rc = ferry__resample(j->rs, j->region, h, w, (size_t)w * 3, 3, &win, dst, *oh,
                       *ow, err);
  if (rc != 0)
    return rc;
  if (info != NULL) {
    info->src_h = h;
    info->src_w = w;
    info->win = win;
    info->scale = 8;
    info->progressive = 0;
    info->decoded = (ferry_box_t){0, 0, h, w};
  }
  j->stats.images++;
  j->stats.full++;
  j->stats.pixels_decoded += (uint64_t)h * (uint64_t)w;
  return 0;
}

/* The smallest s of 1, 2, 4 and 8 whose scaled window still has `gap`
 * times the output's resolution on both axes (8 when upscaling). Only
 * those: libjpeg-turbo has SIMD inverse DCTs for them alone; 3/8, 5/8,
 * 6/8 and 7/8 run its scalar ones (and, with 4:2:0, inverse-transform
 * the chroma at twice the scale), which measured slower than the full
 * 8/8 decode of the same window at 224x224 outputs, and less accurate. */
static int pick_scale(const ferry_window_t *win, int oh, int ow, double gap) {
  double g = gap >= 1.0 ? gap : 1.0;
  for (int s = 1; s < 8; s *= 2)
    if (win->w * s >= 8.0 * g * ow * (1.0 - 1e-12) &&
        win->h * s >= 8.0 * g * oh * (1.0 - 1e-12))
      return s;
  return 8;
}

static int clampi(int v, int lo, int hi) {
  return v < lo ? lo : v > hi ? hi : v;
}

/* Scaled pixels decoded past the clip on each side: fancy upsampling at
 * the decoded region's edge lacks its neighbour, so those pixels never
 * reach the resampler. The window path's box covers them too. */
#define CONTEXT 2

/* The window's clip in whole pixels at DCT scale s/8 (the image sw x sh
 * scaled pixels). */
static void scaled_clip(const ferry_window_t *win, int s, int sw, int sh,
                        int *x0, int *x1, int *y0, int *y1) {
  double f = s / 8.0;
  const ferry_box_t *cl = &win->clip;
  *x0 = clampi((int)floor(cl->left * f), 0, sw - 1);
  *x1 = clampi((int)ceil((cl->left + cl->width) * f), *x0 + 1, sw);
  *y0 = clampi((int)floor(cl->top * f), 0, sh - 1);
  *y1 = clampi((int)ceil((cl->top + cl->height) * f), *y0 + 1, sh);
}

enum { FALLBACK = 1 }; /* the window path failed: take the image's path */

/* Decodes op's window of src fused with the crop. On the window path
 * (`hw` not NULL: the tiles and the box), hw decodes the entropy-coded
 * data, and any libjpeg warning or error returns FALLBACK: the image's
 * own path then decides (and reports) what the damage means. */
static int decode_fused(ferry_jpeg_t *j, const uint8_t *src, size_t len,
                        const ferry_crop_op_t *op, ferry_jpeg_huff_t *hw,
                        uint8_t *dst, size_t cap, int *oh, int *ow,
                        ferry_jpeg_crop_info_t *info, ferry_error_t *err) {
  struct jpeg_decompress_struct *ci = &j->cinfo;
  crop_err_t *e = &j->cerr;
  ferry_window_t win, rwin;
  int rc, h, w, s, cmyk, adobe, progressive, sw, sh;
  int cx0, cx1, cy0, cy1, dy0, dy1, rows;
  JDIMENSION xoff, cw;
  size_t rowbytes;

  e->warnings = 0;
  e->eof = 0;
  e->first[0] = '\0';
  if (setjmp(e->jb)) {
    int code = e->eof ? FERRY_EJPEGTRUNC : FERRY_EJPEG;
    jpeg_abort_decompress(ci);
    if (hw != NULL)
      return FALLBACK;
    if (e->warnings > 0 && strcmp(e->msg, e->first) != 0)
      return ferry__seterr(err, code, "jpeg: %s (after: %s)", e->msg,
                           e->first);
    return ferry__seterr(err, code, "jpeg: %s", e->msg);
  }
  jpeg_mem_src(ci, src, (unsigned long)len);
  if (jpeg_read_header(ci, TRUE) != JPEG_HEADER_OK) {
    jpeg_abort_decompress(ci);
    if (hw != NULL)
      return FALLBACK;
    return ferry__seterr(err, FERRY_EJPEG, "jpeg: no image in the data");
  }
  h = (int)ci->image_height;
  w = (int)ci->image_width;
  if (h <= 0 || w <= 0) {
    jpeg_abort_decompress(ci);
    return ferry__seterr(err, FERRY_EJPEG, "jpeg: no image (size %dx%d)", w,
                         h);
  }
  cmyk = ci->jpeg_color_space == JCS_CMYK || ci->jpeg_color_space == JCS_YCCK;
  if ((long long)h * w * (cmyk ? 4 : 3) >= MAX_SAMPLES) {
    jpeg_abort_decompress(ci);
    return ferry__seterr(err, FERRY_EJPEG,
                         "jpeg: image %dx%d is too large (TensorFlow's limit "
                         "is 2^29 samples)", w, h);
  }
  if ((rc = ferry__crop_plan(op, h, w, &win, oh, ow, err)) != 0 ||
      (rc = check_out(*oh, *ow, cap, err)) != 0) {
    jpeg_abort_decompress(ci);
    return rc;
  }
  s = pick_scale(&win, *oh, *ow, op->gap);
  ci->scale_num = (unsigned)s;
  ci->scale_denom = 8;
  ci->dct_method = JDCT_IFAST;
  ci->do_fancy_upsampling = TRUE;
  /* RGBX: 4 bytes a pixel, which the resampler reads as one vector. */
  ci->out_color_space = cmyk ? JCS_CMYK : JCS_EXT_RGBX;
  jpeg_start_decompress(ci);
  if (hw != NULL && ferry__jpeg_huff_attach(hw, ci) != 0) {
    jpeg_abort_decompress(ci);
    return FALLBACK;
  }
  progressive = jpeg_has_multiple_scans(ci) ? 1 : 0;
  sw = (int)ci->output_width;
  sh = (int)ci->output_height;

  /* The clip in scaled pixels of src, and the region to decode: CONTEXT
   * more on each side. */
  scaled_clip(&win, s, sw, sh, &cx0, &cx1, &cy0, &cy1);
  {
    double f = s / 8.0;
    rwin.x = win.x * f;
    rwin.y = win.y * f;
    rwin.w = win.w * f;
    rwin.h = win.h * f;
  }
  xoff = (JDIMENSION)(cx0 >= CONTEXT ? cx0 - CONTEXT : 0);
  cw = (JDIMENSION)(clampi(cx1 + CONTEXT, 0, sw)) - xoff;
  if (xoff != 0 || cw != (JDIMENSION)sw)
    jpeg_crop_scanline(ci, &xoff, &cw); /* aligns to iMCU columns */
  dy0 = cy0 >= CONTEXT ? cy0 - CONTEXT : 0;
  dy1 = clampi(cy1 + CONTEXT, 0, sh);
  if (dy0 > 0 &&
      jpeg_skip_scanlines(ci, (JDIMENSION)dy0) != (JDIMENSION)dy0) {
    jpeg_abort_decompress(ci);
    if (hw != NULL)
      return FALLBACK;
    return ferry__seterr(err, FERRY_EJPEG,
                         "jpeg: cannot skip to row %d of %d", dy0, sh);
  }
  rows = dy1 - dy0;
  rowbytes = (size_t)cw * (size_t)ci->output_components;
  if ((rc = grow_region(j, (size_t)rows * rowbytes, err)) != 0) {
    jpeg_abort_decompress(ci);
    return rc;
  }
  while ((int)ci->output_scanline < dy1) {
    JSAMPROW rp[16];
    int at = (int)ci->output_scanline - dy0, n = dy1 - (int)ci->output_scanline;
    if (n > 16)
      n = 16;
    for (int i = 0; i < n; i++)
      rp[i] = j->region + (size_t)(at + i) * rowbytes;
    if (jpeg_read_scanlines(ci, rp, (JDIMENSION)n) == 0)
      break; /* suspension: impossible with the memory source */
  }
  adobe = ci->saw_Adobe_marker ? 1 : 0;
  jpeg_abort_decompress(ci);
  if (hw != NULL) {
    if (e->warnings > 0)
      return FALLBACK;
  } else {
    int adobe2;
    if (e->eof)
      return ferry__seterr(err, FERRY_EJPEGTRUNC, "jpeg: %s", e->first);
    if (walk(src, len, &adobe2) == WALK_TRUNCATED)
      return ferry__seterr(err, FERRY_EJPEGTRUNC,
                           "jpeg: data ends before the end-of-image marker%s%s",
                           e->warnings ? " (first warning: " : "",
                           e->warnings ? e->first : "");
  }
  if (cmyk)
    cmyk_to_rgbx(j->region, (size_t)rows * cw, adobe);

  rwin.x -= (double)xoff;
  rwin.y -= (double)dy0;
  rwin.clip.left = cx0 - (int)xoff;
  rwin.clip.top = cy0 - dy0;
  rwin.clip.width = cx1 - cx0;
  rwin.clip.height = cy1 - cy0;
  rc = ferry__resample_x(j->rs, j->region, rows, (int)cw, rowbytes, 4, 3,
                         &rwin, dst, *oh, *ow, err);
  if (rc != 0)
    return rc;
  if (info != NULL) {
    info->src_h = h;
    info->src_w = w;
    info->win = win;
    info->scale = s;
    info->progressive = progressive;
    info->decoded = (ferry_box_t){dy0, (int)xoff, rows, (int)cw};
    info->window = hw != NULL;
    info->window_fallback = 0;
  }
  j->stats.images++;
  if (hw != NULL) {
    j->stats.window++;
    j->stats.by_scale[s]++;
  } else if (s < 8 || rows < sh || (int)cw < sw) {
    j->stats.fused++;
    j->stats.by_scale[s]++;
    j->stats.progressive += (uint64_t)progressive;
  } else {
    j->stats.full++;
  }
  j->stats.pixels_decoded += (uint64_t)rows * (uint64_t)cw;
  return 0;
}

/* The window path: when src is laid out in restart-interval tiles,
 * decode_fused runs with jpeg_huff.h's entropy decoder, which decodes only
 * the MCUs of the box that covers op's window (the clip and the CONTEXT
 * scaled pixels decode_fused reads), entering each row at the tile that
 * holds the box's first column. Returns FALLBACK when the image's own
 * path must run (no tiles, a limit, or damage: then counted, with the
 * reason kept in j->window_why). */
static int decode_window(ferry_jpeg_t *j, const uint8_t *src, size_t len,
                         const ferry_crop_op_t *op, uint8_t *dst, size_t cap,
                         int *oh, int *ow, ferry_jpeg_crop_info_t *info,
                         ferry_error_t *err) {
  ferry_jpeg_huff_t *hw = &j->huff;
  ferry_jpeg_layout_t l;
  ferry_window_t win;
  int s, sw, sh, x0, x1, y0, y1, mx0, mx1, my0, my1, rc;

  if (!j->window || ferry__jpeg_layout(src, len, &l, NULL, 0) != 1)
    return FALLBACK;
  if ((long long)l.height * l.width * 4 >= MAX_SAMPLES ||
      ferry__crop_plan(op, l.height, l.width, &win, oh, ow, err) != 0)
    return FALLBACK; /* the image's path says what is wrong */
  s = pick_scale(&win, *oh, *ow, op->gap);
  sw = (l.width * s + 7) / 8;
  sh = (l.height * s + 7) / 8;
  /* decode_fused's region: the clip and its context. */
  scaled_clip(&win, s, sw, sh, &x0, &x1, &y0, &y1);
  x0 = x0 >= CONTEXT ? x0 - CONTEXT : 0;
  x1 = clampi(x1 + CONTEXT, 0, sw);
  y0 = y0 >= CONTEXT ? y0 - CONTEXT : 0;
  y1 = clampi(y1 + CONTEXT, 0, sh);
  /* Scaled pixels to MCUs (an MCU is mcu_w * s / 8 scaled pixels wide):
   * the region's MCUs, the first column rounded down to a tile's. The
   * MCUs around the box that libjpeg's upsampler reads come out zero;
   * they reach only the CONTEXT pixels. */
  mx0 = x0 * 8 / (l.mcu_w * s) / l.restart * l.restart;
  mx1 = (x1 * 8 + l.mcu_w * s - 1) / (l.mcu_w * s);
  mx1 = mx1 < l.mcus_x ? mx1 : l.mcus_x;
  my0 = y0 * 8 / (l.mcu_h * s);
  my1 = (y1 * 8 + l.mcu_h * s - 1) / (l.mcu_h * s);
  my1 = my1 < l.mcus_y ? my1 : l.mcus_y;
  if (mx1 <= mx0 || my1 <= my0)
    return FALLBACK;
  rc = ferry__jpeg_tiles_find(src, len, &l, &j->tiles, j->window_why,
                              sizeof(j->window_why));
  if (rc == -2)
    return ferry__seterr(err, FERRY_ENOMEM, "jpeg: out of memory");
  if (rc != 0) {
    j->stats.window_fallback++;
    return FALLBACK;
  }
  /* The tiles are the one scan, up to EOI: what check_data's survey of
   * the whole file would find. Over a limit, the image's path says so. */
  {
    survey_t sv = {.have_sof = 1, .ncomp = l.ncomp, .h = (unsigned)l.height,
                   .w = (unsigned)l.width, .scans = 1};
    ferry_error_t scratch;
    if (limits_of(j, &sv, &scratch) != 0)
      return FALLBACK;
  }
  hw->src = src;
  hw->layout = &l;
  hw->tiles = &j->tiles;
  hw->mx0 = mx0;
  hw->mx1 = mx1;
  hw->my0 = my0;
  hw->my1 = my1;
  hw->why[0] = '\0';
  rc = decode_fused(j, src, len, op, hw, dst, cap, oh, ow, info, err);
  if (rc == FALLBACK) {
    snprintf(j->window_why, sizeof(j->window_why),
             "the window of MCUs [%d, %d) x [%d, %d) decodes with a "
             "warning or an error: %.200s", mx0, mx1, my0, my1,
             hw->why[0] != '\0' ? hw->why
             : j->cerr.warnings ? j->cerr.first : j->cerr.msg);
    j->stats.window_fallback++;
  }
  hw->layout = NULL;
  return rc;
}

int ferry__jpeg_decode_crop(ferry_jpeg_t *j, const uint8_t *src, size_t len,
                            const ferry_crop_op_t *op, uint8_t *dst, size_t cap,
                            int *oh, int *ow, ferry_jpeg_crop_info_t *info,
                            ferry_error_t *err) {
  int rc;
  *oh = 0;
  *ow = 0;
  if (op->exact) {
    if (j->rs == NULL && (rc = ferry__resampler_new(&j->rs, err)) != 0)
      return rc;
    return decode_crop_exact(j, src, len, op, dst, cap, oh, ow, info, err);
  }
  if ((rc = ensure_cinfo(j, err)) != 0)
    return rc;
  if (len == 0 || src == NULL || len > ULONG_MAX)
    return check_data(j, src, len, err);
  if (info != NULL)
    info->window = info->window_fallback = 0;
  uint64_t fallbacks = j->stats.window_fallback;
  rc = decode_window(j, src, len, op, dst, cap, oh, ow, info, err);
  if (rc != FALLBACK)
    return rc;
  *oh = *ow = 0;
  if ((rc = check_data(j, src, len, err)) != 0 ||
      (rc = ensure_cinfo(j, err)) != 0)
    return rc;
  rc = decode_fused(j, src, len, op, NULL, dst, cap, oh, ow, info, err);
  if (info != NULL)
    info->window_fallback = j->stats.window_fallback != fallbacks;
  return rc;
}

void ferry__jpeg_set_window(ferry_jpeg_t *j, int on) { j->window = on; }

const char *ferry__jpeg_window_why(const ferry_jpeg_t *j) {
  return j->window_why;
}

void ferry__jpeg_crop_stats(const ferry_jpeg_t *j,
                            ferry_jpeg_crop_stats_t *out) {
  *out = j->stats;
}
