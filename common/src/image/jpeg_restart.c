/* The lossless rewrite that lays a JPEG out in restart-interval tiles for
 * cropping (jpeg_restart.h): libjpeg's transcoding API, as jpegtran uses
 * it, then a decode of both files compared pixel for pixel. */
#include "jpeg_restart.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
/* jpeglib.h needs stdio.h (FILE) before it. */
#include <jerror.h>
#include <jpeglib.h>

#include "alloc.h"

static const char *const reason_names[FERRY_JOPT_NREASONS] = {
    "rewritten", "already", "unreadable", "warnings",
    "too_small", "grows",   "differs"};

const char *ferry__jopt_reason_name(ferry_jopt_reason_t r) {
  return (unsigned)r < FERRY_JOPT_NREASONS ? reason_names[r] : "unknown";
}

typedef struct {
  struct jpeg_error_mgr pub;
  jmp_buf jb;
  int warnings;
  char msg[JMSG_LENGTH_MAX];
} opt_err_t;

static void opt_error_exit(j_common_ptr c) {
  opt_err_t *e = (opt_err_t *)(void *)c->err;
  (*c->err->format_message)(c, e->msg);
  longjmp(e->jb, 1);
}

static void opt_emit_message(j_common_ptr c, int level) {
  opt_err_t *e = (opt_err_t *)(void *)c->err;
  if (level < 0 && e->warnings++ == 0)
    (*c->err->format_message)(c, e->msg);
}

static void opt_output_message(j_common_ptr c) { (void)c; }

static void set_detail(ferry_jopt_result_t *res, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void set_detail(ferry_jopt_result_t *res, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(res->detail, sizeof(res->detail), fmt, ap);
  va_end(ap);
}

/* The interval for `in` (ferry__jpeg_restart_choose over its MCUs), and
 * how many tiles that makes. */
static int choose_interval(const struct jpeg_decompress_struct *in,
                           long *tiles, int *mcu_w, int *mcu_h) {
  int hmax = 1, vmax = 1, mcus_x, mcus_y, r;
  for (int c = 0; c < in->num_components; c++) {
    if (in->comp_info[c].h_samp_factor > hmax)
      hmax = in->comp_info[c].h_samp_factor;
    if (in->comp_info[c].v_samp_factor > vmax)
      vmax = in->comp_info[c].v_samp_factor;
  }
  if (in->num_components == 1)
    hmax = vmax = 1;
  *mcu_w = 8 * hmax;
  *mcu_h = 8 * vmax;
  mcus_x = (int)((in->image_width + (unsigned)*mcu_w - 1) / (unsigned)*mcu_w);
  mcus_y = (int)((in->image_height + (unsigned)*mcu_h - 1) / (unsigned)*mcu_h);
  r = ferry__jpeg_restart_choose(mcus_x, *mcu_w);
  *tiles = (long)(mcus_x / r) * mcus_y;
  return r;
}

/* The libjpeg side: everything that can longjmp, with no locals of the
 * caller live across it. */
typedef struct {
  struct jpeg_decompress_struct in;
  struct jpeg_compress_struct out;
  opt_err_t ein, eout;
  int have_in, have_out;
  unsigned char *mem; /* jpeg_mem_dest's buffer (malloc) */
  unsigned long mem_len;
} transcode_t;

static void transcode_close(transcode_t *t) {
  if (t->have_out)
    jpeg_destroy_compress(&t->out);
  if (t->have_in)
    jpeg_destroy_decompress(&t->in);
  free(t->mem);
  t->mem = NULL;
}

/* Reads src's coefficients and writes them with restart intervals. Sets
 * res (UNREADABLE, WARNINGS or TOO_SMALL stop early); t->mem holds the
 * new file when res->reason is REWRITTEN. */
static void transcode(transcode_t *t, const uint8_t *src, size_t len,
                      ferry_jopt_result_t *res) {
  jvirt_barray_ptr *coefs;
  int mcu_w, mcu_h, r;
  long tiles;
  struct jpeg_decompress_struct *in = &t->in;
  struct jpeg_compress_struct *out = &t->out;

  in->err = jpeg_std_error(&t->ein.pub);
  t->ein.pub.error_exit = opt_error_exit;
  t->ein.pub.emit_message = opt_emit_message;
  t->ein.pub.output_message = opt_output_message;
  out->err = jpeg_std_error(&t->eout.pub);
  t->eout.pub.error_exit = opt_error_exit;
  t->eout.pub.emit_message = opt_emit_message;
  t->eout.pub.output_message = opt_output_message;
  if (setjmp(t->ein.jb)) {
    res->reason = FERRY_JOPT_UNREADABLE;
    set_detail(res, "%s", t->ein.msg);
    return;
  }
  jpeg_create_decompress(in);
  t->have_in = 1;
  jpeg_mem_src(in, src, (unsigned long)len);
  jpeg_save_markers(in, JPEG_COM, 0xFFFF);
  for (int m = 0; m < 16; m++)
    jpeg_save_markers(in, JPEG_APP0 + m, 0xFFFF);
  jpeg_read_header(in, TRUE);
  res->progressive = jpeg_has_multiple_scans(in) ? 1 : 0;
  res->arithmetic = in->arith_code ? 1 : 0;
  if (in->num_components > 4) {
    res->reason = FERRY_JOPT_UNREADABLE;
    set_detail(res, "%d components", in->num_components);
    return;
  }
  /* libjpeg holds every coefficient of the image: the decoders' bound. */
  if ((uint64_t)in->image_width * in->image_height > FERRY_JPEG_MAX_PIXELS) {
    res->reason = FERRY_JOPT_UNREADABLE;
    set_detail(res, "%ux%u: over the limit of %u pixels", in->image_width,
               in->image_height, FERRY_JPEG_MAX_PIXELS);
    return;
  }
  coefs = jpeg_read_coefficients(in);
  if (t->ein.warnings > 0) {
    res->reason = FERRY_JOPT_WARNINGS;
    set_detail(res, "%s", t->ein.msg);
    return;
  }
  r = choose_interval(in, &tiles, &mcu_w, &mcu_h);
  if (tiles < 2) {
    res->reason = FERRY_JOPT_TOO_SMALL;
    set_detail(res, "%ux%u: a single tile of %dx%d MCUs", in->image_width,
               in->image_height, mcu_w, mcu_h);
    return;
  }

  if (setjmp(t->eout.jb)) {
    res->reason = FERRY_JOPT_UNREADABLE;
    set_detail(res, "rewriting: %s", t->eout.msg);
    return;
  }
  jpeg_create_compress(out);
  t->have_out = 1;
  jpeg_mem_dest(out, &t->mem, &t->mem_len);
  jpeg_copy_critical_parameters(in, out);
  /* The original's own JFIF and Adobe segments are copied below as they
   * are (the Adobe transform flag decides how CMYK decodes). */
  out->write_JFIF_header = FALSE;
  out->write_Adobe_marker = FALSE;
  out->optimize_coding = TRUE;
  out->restart_interval = (unsigned)r;
  jpeg_write_coefficients(out, coefs);
  for (jpeg_saved_marker_ptr m = in->marker_list; m != NULL; m = m->next)
    jpeg_write_marker(out, m->marker, m->data, m->data_length);
  jpeg_finish_compress(out);
  jpeg_finish_decompress(in);
  res->reason = FERRY_JOPT_REWRITTEN;
  res->restart = r;
}

/* Decodes both and compares; 0 when the pixels are the same. */
static int same_pixels(ferry_jpeg_t *j, const uint8_t *a, size_t alen,
                       const uint8_t *b, size_t blen, ferry_jopt_result_t *res,
                       ferry_error_t *err) {
  int ha, wa, hb, wb, rc;
  uint8_t *pa = NULL, *pb = NULL;
  size_t n;
  ferry_error_t e;
  ferry_error_clear(&e);
  if (ferry__jpeg_header(j, a, alen, &ha, &wa, &e) != 0) {
    res->reason = FERRY_JOPT_UNREADABLE;
    set_detail(res, "%s", e.msg);
    return 1;
  }
  n = (size_t)ha * (size_t)wa * 3;
  pa = ferry__malloc(n);
  pb = ferry__malloc(n);
  if (pa == NULL || pb == NULL) {
    ferry__free(pa);
    ferry__free(pb);
    return ferry__seterr(err, FERRY_ENOMEM, "jpeg: out of memory for two "
                         "%dx%d images", wa, ha);
  }
  rc = 1;
  if (ferry__jpeg_decode(j, a, alen, pa, n, &ha, &wa, &e) != 0) {
    res->reason = FERRY_JOPT_UNREADABLE;
    set_detail(res, "%s", e.msg);
  } else if (ferry__jpeg_decode(j, b, blen, pb, n, &hb, &wb, &e) != 0) {
    res->reason = FERRY_JOPT_DIFFERS;
    set_detail(res, "the rewrite: %s", e.msg);
  } else if (hb != ha || wb != wa || memcmp(pa, pb, n) != 0) {
    res->reason = FERRY_JOPT_DIFFERS;
    set_detail(res, "the rewrite decodes to other pixels");
  } else {
    rc = 0;
  }
  ferry__free(pa);
  ferry__free(pb);
  return rc;
}

int ferry__jpeg_optimize(ferry_jpeg_t *j, const uint8_t *src, size_t len,
                         uint8_t **out, size_t *out_len,
                         ferry_jopt_result_t *res, ferry_error_t *err) {
  ferry_jpeg_layout_t l;
  ferry_jpeg_tiles_t tiles = {0};
  transcode_t *t;
  int rc;

  *out = NULL;
  *out_len = 0;
  memset(res, 0, sizeof(*res));
  if (ferry__jpeg_layout(src, len, &l, NULL, 0) == 1) {
    rc = ferry__jpeg_tiles_find(src, len, &l, &tiles, NULL, 0);
    ferry__jpeg_tiles_free(&tiles);
    if (rc == -2)
      return ferry__seterr(err, FERRY_ENOMEM, "jpeg: out of memory");
    if (rc == 0) {
      res->reason = FERRY_JOPT_ALREADY;
      res->restart = l.restart;
      return 0;
    }
  }
  if (len == 0 || len > 0xFFFFFFFFu) {
    res->reason = FERRY_JOPT_UNREADABLE;
    set_detail(res, "%zu bytes", len);
    return 0;
  }
  t = ferry__calloc(1, sizeof(*t));
  if (t == NULL)
    return ferry__seterr(err, FERRY_ENOMEM, "jpeg: out of memory");
  transcode(t, src, len, res);
  if (res->reason == FERRY_JOPT_REWRITTEN &&
      (uint64_t)t->mem_len * 100 > (uint64_t)len * (100 + FERRY_JOPT_MAX_GROWTH)) {
    res->reason = FERRY_JOPT_GROWS;
    set_detail(res, "%zu bytes to %lu (+%.1f%%)",
             len, t->mem_len, 100.0 * ((double)t->mem_len / (double)len - 1));
  }
  rc = 0;
  if (res->reason == FERRY_JOPT_REWRITTEN &&
      (rc = same_pixels(j, src, len, t->mem, t->mem_len, res, err)) == 0) {
    *out = ferry__malloc(t->mem_len);
    if (*out == NULL) {
      rc = ferry__seterr(err, FERRY_ENOMEM, "jpeg: out of memory");
    } else {
      memcpy(*out, t->mem, t->mem_len);
      *out_len = t->mem_len;
    }
  }
  transcode_close(t);
  ferry__free(t);
  if (rc == 1)
    rc = 0; /* not rewritten: res says why */
  if (res->reason != FERRY_JOPT_REWRITTEN)
    res->restart = 0;
  return rc;
}
