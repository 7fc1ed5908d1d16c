/* ferryctl bench pipeline: the seed pipeline measured stage by stage.
 *
 * One run generates a dataset (one shard per thread, the record layout of
 * ferryctl gen: "image", "label", "id"), then measures, for 32x32x3 raw
 * and 224x224x3 JPEG images, images/s per core of each stage (read+CRC,
 * parse, decode, dilate, blur, decode+blur, the whole pipeline) with one
 * thread and with every core, each thread on its own shard. Next to each
 * figure is a plain scalar reference measured in the same run, because
 * shared machines drift and only ratios within one run compare. Each
 * figure is the median of its repetitions; each repetition runs for a
 * fixed time over items cached in memory or over a page-cache-warm file.
 */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <turbojpeg.h>
#include <unistd.h>

#include "alloc.h"
#include "crc32c.h"
#include "ctl.h"
#include "example.h"
#include "imgops.h"
#include "pipeline.h"
#include "spec.h"
#include "tensorflow/core/example/example.pb-c.h"
#include "tfrecord.h"
#include "varint.h"

static const char bench_usage[] =
    "usage: ferryctl bench pipeline [--records N] [--size HxW]\n"
    "                               [--format raw|jpeg] [--threads N]\n"
    "                               [--dir DIR] [--quick]\n"
    "\n"
    "Measures the seed pipeline (read+CRC, parse, decode, dilate(3),\n"
    "blur(11, 0.8)) stage by stage in images/s per core, with one thread\n"
    "and with N threads (default: every core), against scalar references\n"
    "measured in the same run, and checks the targets.\n"
    "\n"
    "  --records N   records per shard (default 10000 at 32x32, 400 at\n"
    "                224x224; --quick: a tenth)\n"
    "  --size HxW    only this size (default: 32x32 raw and 224x224 jpeg)\n"
    "  --format F    raw or jpeg (default: raw at 32x32, jpeg otherwise)\n"
    "  --threads N   threads for the all-cores figures\n"
    "  --dir DIR     where to write the shards (default: a temporary\n"
    "                directory); the shards are removed at the end\n"
    "  --quick       a short smoke run (~10 s)\n";

/* The targets from the issue. */
#define TARGET_PIPELINE_32 250000.0 /* images/s per core, 32x32 raw */
#define TARGET_CRC_GBPS 20.0        /* GB/s per core */
#define TARGET_JPEG_224 2500.0      /* decode + blur, images/s per core */

#define CRC_BUF_BYTES (256u << 10)
#define MAX_THREADS 256
#define MAX_ROWS 256

/* ------------------------------------------------------------------ */
/* Small utilities. */

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* splitmix64: a fast, well-mixed generator for synthetic pixels. */
static uint64_t rnd(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof(*v), cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Formats a rate: thousands separators for images/s, two decimals for
 * GB/s. */
static const char *fmt_value(char *out, size_t cap, double v, bool gbps) {
  char digits[32];
  size_t n, j = 0;

  if (gbps || v < 100) {
    snprintf(out, cap, "%.2f", v);
    return out;
  }
  snprintf(digits, sizeof(digits), "%.0f", v);
  n = strlen(digits);
  for (size_t i = 0; i < n && j + 2 < cap; i++) {
    if (i > 0 && (n - i) % 3 == 0)
      out[j++] = ',';
    out[j++] = digits[i];
  }
  out[j] = '\0';
  return out;
}

/* ------------------------------------------------------------------ */
/* Synthetic data: photo-like images and Examples in the layout of
 * ferryctl gen. */

typedef struct {
  uint8_t *p;
  size_t n, cap;
} buf_t;

static int buf_put(buf_t *b, const void *data, size_t len) {
  if (len > SIZE_MAX - b->n || !FERRY__GROW(b->p, b->cap, b->n + len, 256))
    return FERRY_ENOMEM;
  if (len > 0)
    memcpy(b->p + b->n, data, len);
  b->n += len;
  return 0;
}

static int buf_varint(buf_t *b, uint64_t v) {
  uint8_t tmp[FERRY_VARINT_MAX];
  return buf_put(b, tmp, ferry__varint_put(tmp, v));
}

/* A length-delimited field: tag, length, bytes. */
static int buf_ld(buf_t *b, int field, const void *data, size_t len) {
  int rc;
  if ((rc = buf_varint(b, (uint64_t)field << 3 | 2)) < 0 ||
      (rc = buf_varint(b, len)) < 0)
    return rc;
  return buf_put(b, data, len);
}

/* Scratch buffers for encoding one Example. */
typedef struct {
  buf_t list, feature, entry, features, out;
} enc_t;

static void enc_free(enc_t *e) {
  ferry__free(e->list.p);
  ferry__free(e->feature.p);
  ferry__free(e->entry.p);
  ferry__free(e->features.p);
  ferry__free(e->out.p);
}

/* Appends one map entry key -> Feature{kind: list} to e->features. */
static int enc_entry(enc_t *e, const char *key, int kind) {
  int rc;
  e->feature.n = e->entry.n = 0;
  if ((rc = buf_ld(&e->feature, kind, e->list.p, e->list.n)) < 0 ||
      (rc = buf_ld(&e->entry, 1, key, strlen(key))) < 0 ||
      (rc = buf_ld(&e->entry, 2, e->feature.p, e->feature.n)) < 0)
    return rc;
  return buf_ld(&e->features, 1, e->entry.p, e->entry.n);
}

static int enc_int64(enc_t *e, const char *key, int64_t v) {
  uint8_t tmp[FERRY_VARINT_MAX];
  size_t n = ferry__varint_put(tmp, (uint64_t)v);
  int rc;

  e->list.n = 0;
  if ((rc = buf_ld(&e->list, 1, tmp, n)) < 0)
    return rc;
  return enc_entry(e, key, 3);
}

/* Encodes Example{image, label, id} into e->out. */
static int enc_example(enc_t *e, const uint8_t *img, size_t len,
                       int64_t label, int64_t id) {
  int rc;
  e->features.n = e->out.n = e->list.n = 0;
  if ((rc = buf_ld(&e->list, 1, img, len)) < 0 ||
      (rc = enc_entry(e, "image", 1)) < 0 ||
      (rc = enc_int64(e, "label", label)) < 0 ||
      (rc = enc_int64(e, "id", id)) < 0)
    return rc;
  return buf_ld(&e->out, 1, e->features.p, e->features.n);
}

static uint8_t clamp_u8(int v) {
  return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
}

/* A photo-like image: a smooth two-colour gradient, a few discs and boxes
 * each with a texture (a triangle wave of its own period and direction),
 * and mild sensor noise, so JPEG sizes and decode cost are like real
 * photographs' (neither flat nor white noise). */
static void synth_image(uint8_t *px, int h, int w, int c, uint64_t seed) {
  uint64_t s = seed * 0x2545F4914F6CDD1Dull + 1;
  int c0[4], c1[4], gx, gy, nshapes, span;
  struct {
    int kind, x0, y0, x1, y1, r2, tx, ty, amp;
    int col[4];
  } sh[8];

  for (int k = 0; k < 4; k++) {
    c0[k] = (int)(rnd(&s) % 256);
    c1[k] = (int)(rnd(&s) % 256);
  }
  gx = (int)(rnd(&s) % 201) - 100;
  gy = (int)(rnd(&s) % 201) - 100;
  if (gx == 0 && gy == 0)
    gx = 1;
  nshapes = 3 + (int)(rnd(&s) % 6);
  for (int i = 0; i < nshapes; i++) {
    int r = 1 + (int)(rnd(&s) % (unsigned)(w / 4 + 1));
    sh[i].kind = (int)(rnd(&s) % 2);
    sh[i].x0 = (int)(rnd(&s) % (unsigned)w);
    sh[i].y0 = (int)(rnd(&s) % (unsigned)h);
    sh[i].x1 = sh[i].x0 + r + (int)(rnd(&s) % (unsigned)(w / 3 + 1));
    sh[i].y1 = sh[i].y0 + r + (int)(rnd(&s) % (unsigned)(h / 3 + 1));
    sh[i].r2 = r * r;
    /* Texture: phase advances tx, ty per pixel (period 64/|t| pixels). */
    sh[i].tx = (int)(rnd(&s) % 17) - 8;
    sh[i].ty = (int)(rnd(&s) % 17) - 8;
    sh[i].amp = (int)(rnd(&s) % 24);
    for (int k = 0; k < 4; k++)
      sh[i].col[k] = (int)(rnd(&s) % 256);
  }
  /* The gradient's parameter runs over [0, span] across the image. */
  span = abs(gx) * (w - 1) + abs(gy) * (h - 1);
  if (span == 0)
    span = 1;
  for (int y = 0; y < h; y++) {
    for (int x = 0; x < w; x++) {
      uint8_t *p = px + ((size_t)y * (size_t)w + (size_t)x) * (size_t)c;
      int t = (gx >= 0 ? gx * x : -gx * (w - 1 - x)) +
              (gy >= 0 ? gy * y : -gy * (h - 1 - y));
      int inside = -1, tex = 0;
      uint64_t noise = rnd(&s);

      for (int i = nshapes - 1; i >= 0 && inside < 0; i--) {
        if (sh[i].kind == 0) {
          int dx = x - sh[i].x0, dy = y - sh[i].y0;
          if (dx * dx + dy * dy <= sh[i].r2)
            inside = i;
        } else if (x >= sh[i].x0 && x < sh[i].x1 && y >= sh[i].y0 &&
                   y < sh[i].y1) {
          inside = i;
        }
      }
      if (inside >= 0) {
        /* A triangle wave of period 64 phase units, in [-amp, amp]. */
        int ph = (x * sh[inside].tx + y * sh[inside].ty) & 63;
        tex = ((ph < 32 ? ph : 63 - ph) - 16) * sh[inside].amp / 16;
      }
      for (int k = 0; k < c; k++) {
        int v = inside >= 0 ? sh[inside].col[k] + tex
                            : (c0[k] * (span - t) + c1[k] * t) / span;
        /* Sensor noise: a triangle from two 4-bit draws (sd ~6). */
        v += (int)((noise >> (8 * k)) & 15) +
             (int)((noise >> (8 * k + 4)) & 15) - 15;
        p[k] = clamp_u8(v);
      }
    }
  }
}

/* ------------------------------------------------------------------ */
/* Configuration, workers and the table. */

typedef struct row_s {
  char section[64];
  char name[64];
  double value;     /* per core */
  bool gbps;        /* value in GB/s, else images/s */
  char base_name[40];
  double base;      /* 0: no baseline */
  double target;    /* 0: none */
} row_t;

typedef struct cfg_s {
  int h, w, c;
  ferry_image_format_t fmt;
  long records;     /* per shard */
  int nshards;
  char **paths;
  ferry_pipeline_t *pipe;
  char label[48];   /* "32x32x3 raw" */
} cfg_t;

typedef struct bench_s {
  bool quick;
  int reps;
  double budget;  /* seconds per repetition */
  int threads;
  long records;   /* 0: default per config */
  char dir[PATH_MAX];
  bool own_dir;
  bool progress;
  row_t rows[MAX_ROWS];
  int nrows;
  char notes[8][240];
  int nnotes;
} bench_t;

/* Per-thread state: its shard, its in-memory records and images, and its
 * own decoder, blur object and pipeline ctx. */
typedef struct worker_s {
  const cfg_t *cfg;
  const char *path;
  ferry_tfr_reader_t *reader;
  bool verify_crc;
  /* In-memory records (copied from the shard) and decoded images. */
  uint8_t *recs;
  size_t *rec_off, *rec_len;
  size_t *img_off, *img_len; /* the image feature inside each record */
  int nrec, ri;
  uint8_t *imgs;
  int nimg, ii;
  size_t img_bytes;
  uint8_t *out, *tmp; /* scratch images */
  uint8_t *crcbuf;
  ferry_example_t ex;
  ferry_jpeg_t *jpeg;
  ferry_blur_t *blur;
  ferry_pipeline_ctx_t *ctx;
  uint64_t bytes;
  volatile uint64_t sink; /* keeps results observable */
  ferry_error_t err;
} worker_t;

typedef int (*step_fn)(worker_t *w);

static void add_row(bench_t *b, const char *section, const char *name,
                    double value, bool gbps, const char *base_name,
                    double base, double target) {
  row_t *r;
  if (b->nrows >= MAX_ROWS)
    return;
  r = &b->rows[b->nrows++];
  snprintf(r->section, sizeof(r->section), "%s", section);
  snprintf(r->name, sizeof(r->name), "%s", name);
  r->value = value;
  r->gbps = gbps;
  snprintf(r->base_name, sizeof(r->base_name), "%s",
           base_name ? base_name : "");
  r->base = base;
  r->target = target;
}

/* ------------------------------------------------------------------ */
/* Stage steps: each processes one item and returns 0 or a negative code
 * with w->err filled. */

static int reader_reopen(worker_t *w) {
  ferry_tfr_options_t o;
  ferry__tfr_reader_free(w->reader);
  w->reader = NULL;
  ferry__tfr_options_init(&o);
  o.compression = FERRY_COMPRESSION_NONE;
  o.verify_crc = w->verify_crc;
  return ferry__tfr_reader_open(w->path, &o, &w->reader, &w->err);
}

/* The next record of the shard, starting over at its end. */
static int next_record(worker_t *w, ferry_record_t *rec) {
  int rc;
  if (w->reader == NULL && (rc = reader_reopen(w)) < 0)
    return rc;
  rc = ferry__tfr_reader_next(w->reader, rec, &w->err);
  if (rc == FERRY_EOF) {
    if ((rc = reader_reopen(w)) < 0)
      return rc;
    rc = ferry__tfr_reader_next(w->reader, rec, &w->err);
  }
  return rc;
}

static int step_read(worker_t *w) {
  ferry_record_t rec;
  int rc = next_record(w, &rec);
  if (rc < 0)
    return rc;
  w->bytes += rec.len + 16;
  w->sink += rec.data[0];
  return 0;
}

/* Baseline: the reader without its CRC check, and the portable CRC of
 * the length and the data computed here instead. */
static int step_read_base(worker_t *w) {
  ferry_record_t rec;
  uint64_t len;
  int rc = next_record(w, &rec);
  if (rc < 0)
    return rc;
  len = rec.len;
  w->sink += ferry__crc32c_portable(0, &len, sizeof(len));
  w->sink += ferry__crc32c_portable(0, rec.data, rec.len);
  w->bytes += rec.len + 16;
  return 0;
}

static void cur_record(worker_t *w, const uint8_t **p, size_t *len) {
  *p = w->recs + w->rec_off[w->ri];
  *len = w->rec_len[w->ri];
  if (++w->ri == w->nrec)
    w->ri = 0;
}

static int step_parse(worker_t *w) {
  const uint8_t *p, *img;
  const ferry_feature_t *fi, *fl;
  size_t len, ilen, n;
  int64_t label;
  int rc;

  cur_record(w, &p, &len);
  if ((rc = ferry__example_parse(&w->ex, p, len, &w->err)) < 0)
    return rc;
  fi = ferry__example_find(&w->ex, "image");
  fl = ferry__example_find(&w->ex, "label");
  if (fi == NULL || fl == NULL ||
      ferry__feature_bytes(fi, 0, &img, &ilen) < 0 ||
      ferry__feature_int64s(fl, &label, 1, &n) < 0)
    return ferry__seterr(&w->err, FERRY_ENOFEATURE, "parse: no image");
  w->sink += ilen + (uint64_t)label;
  return 0;
}

/* Baseline: protobuf-c's unpack (which copies every bytes field and
 * allocates each message), then the same look-ups. */
static int step_parse_base(worker_t *w) {
  const uint8_t *p;
  size_t len;
  Tensorflow__Example *m;
  Tensorflow__Features *fs;
  int found = 0;

  cur_record(w, &p, &len);
  m = tensorflow__example__unpack(NULL, len, p);
  if (m == NULL)
    return ferry__seterr(&w->err, FERRY_EOVERRUN, "protobuf-c unpack");
  fs = m->features;
  for (size_t i = 0; fs != NULL && i < fs->n_feature; i++) {
    Tensorflow__Features__FeatureEntry *e = fs->feature[i];
    if (e->value == NULL)
      continue;
    if (strcmp(e->key, "image") == 0 &&
        e->value->kind_case == TENSORFLOW__FEATURE__KIND_BYTES_LIST &&
        e->value->bytes_list->n_value > 0) {
      w->sink += e->value->bytes_list->value[0].len;
      found++;
    } else if (strcmp(e->key, "label") == 0 &&
               e->value->kind_case == TENSORFLOW__FEATURE__KIND_INT64_LIST &&
               e->value->int64_list->n_value > 0) {
      w->sink += (uint64_t)e->value->int64_list->value[0];
      found++;
    }
  }
  tensorflow__example__free_unpacked(m, NULL);
  if (found != 2)
    return ferry__seterr(&w->err, FERRY_ENOFEATURE, "protobuf-c: no image");
  return 0;
}

/* The image bytes of the next in-memory record, located once at set-up so
 * that decode steps measure decoding only. */
static void cur_image_bytes(worker_t *w, const uint8_t **img, size_t *len) {
  *img = w->recs + w->img_off[w->ri];
  *len = w->img_len[w->ri];
  if (++w->ri == w->nrec)
    w->ri = 0;
}

static int decode_into(worker_t *w, uint8_t *dst) {
  const cfg_t *cfg = w->cfg;
  const uint8_t *img;
  size_t len;
  int h, wd;

  cur_image_bytes(w, &img, &len);
  if (cfg->fmt == FERRY_IMAGE_RAW)
    return ferry__decode_raw(img, len, cfg->h, cfg->w, cfg->c, dst, &w->err);
  return ferry__jpeg_decode(w->jpeg, img, len, dst, w->img_bytes, &h, &wd,
                            &w->err);
}

static int step_decode(worker_t *w) { return decode_into(w, w->out); }

static const uint8_t *cur_image(worker_t *w) {
  const uint8_t *p = w->imgs + (size_t)w->ii * w->img_bytes;
  if (++w->ii == w->nimg)
    w->ii = 0;
  return p;
}

static int step_dilate(worker_t *w) {
  ferry__dilate3x3(cur_image(w), w->out, w->cfg->h, w->cfg->w, w->cfg->c);
  w->sink += w->out[0];
  return 0;
}

static int step_dilate_base(worker_t *w) {
  ferry__dilate3x3_reference(cur_image(w), w->out, w->cfg->h, w->cfg->w,
                             w->cfg->c);
  w->sink += w->out[0];
  return 0;
}

static int step_blur(worker_t *w) {
  int rc = ferry__blur_apply(w->blur, cur_image(w), w->out, w->cfg->h,
                             w->cfg->w, w->cfg->c, &w->err);
  w->sink += w->out[0];
  return rc;
}

static int step_blur_base(worker_t *w) {
  int rc = ferry__blur_reference(11, 0.8f, cur_image(w), w->out, w->cfg->h,
                                 w->cfg->w, w->cfg->c);
  w->sink += w->out[0];
  return rc < 0 ? ferry__seterr(&w->err, rc, "blur reference") : 0;
}

static int step_decode_blur(worker_t *w) {
  int rc = decode_into(w, w->tmp);
  if (rc < 0)
    return rc;
  return ferry__blur_apply(w->blur, w->tmp, w->out, w->cfg->h, w->cfg->w,
                           w->cfg->c, &w->err);
}

static int step_decode_blur_base(worker_t *w) {
  int rc = decode_into(w, w->tmp);
  if (rc < 0)
    return rc;
  rc = ferry__blur_reference(11, 0.8f, w->tmp, w->out, w->cfg->h, w->cfg->w,
                             w->cfg->c);
  return rc < 0 ? ferry__seterr(&w->err, rc, "blur reference") : 0;
}

static int step_pipeline(worker_t *w) {
  ferry_record_t rec;
  const uint8_t *px;
  int h, wd, c, rc;
  int64_t label;

  if ((rc = next_record(w, &rec)) < 0)
    return rc;
  rc = ferry__pipeline_process(w->ctx, rec.data, rec.len, &px, &h, &wd, &c,
                               &label, &w->err);
  if (rc < 0) {
    ferry__prefixerr(&w->err, "%s, offset %llu", w->path,
                     (unsigned long long)rec.offset);
    return rc;
  }
  w->sink += px[0];
  return 0;
}

/* Baseline: every stage in its plain form: portable CRC, protobuf-c,
 * a copy (raw) or the same TurboJPEG decode, the reference dilate and the
 * direct 2-D blur. */
static int step_pipeline_base(worker_t *w) {
  const cfg_t *cfg = w->cfg;
  ferry_record_t rec;
  Tensorflow__Example *m;
  Tensorflow__Features *fs;
  const ProtobufCBinaryData *img = NULL;
  int rc, h, wd;

  if ((rc = next_record(w, &rec)) < 0)
    return rc;
  w->sink += ferry__crc32c_portable(0, rec.data, rec.len);
  m = tensorflow__example__unpack(NULL, rec.len, rec.data);
  if (m == NULL)
    return ferry__seterr(&w->err, FERRY_EOVERRUN, "protobuf-c unpack");
  fs = m->features;
  for (size_t i = 0; fs != NULL && i < fs->n_feature; i++) {
    Tensorflow__Features__FeatureEntry *e = fs->feature[i];
    if (e->value != NULL && strcmp(e->key, "image") == 0 &&
        e->value->kind_case == TENSORFLOW__FEATURE__KIND_BYTES_LIST &&
        e->value->bytes_list->n_value > 0)
      img = &e->value->bytes_list->value[0];
    else if (e->value != NULL && strcmp(e->key, "label") == 0 &&
             e->value->kind_case == TENSORFLOW__FEATURE__KIND_INT64_LIST &&
             e->value->int64_list->n_value > 0)
      w->sink += (uint64_t)e->value->int64_list->value[0];
  }
  if (img == NULL) {
    tensorflow__example__free_unpacked(m, NULL);
    return ferry__seterr(&w->err, FERRY_ENOFEATURE, "protobuf-c: no image");
  }
  if (cfg->fmt == FERRY_IMAGE_RAW) {
    if (img->len != w->img_bytes)
      rc = ferry__seterr(&w->err, FERRY_EIMGSIZE, "raw size");
    else
      memcpy(w->tmp, img->data, img->len);
  } else {
    rc = ferry__jpeg_decode(w->jpeg, img->data, img->len, w->tmp, w->img_bytes,
                            &h, &wd, &w->err);
  }
  tensorflow__example__free_unpacked(m, NULL);
  if (rc < 0)
    return rc;
  ferry__dilate3x3_reference(w->tmp, w->out, cfg->h, cfg->w, cfg->c);
  rc = ferry__blur_reference(11, 0.8f, w->out, w->tmp, cfg->h, cfg->w, cfg->c);
  w->sink += w->tmp[0];
  return rc < 0 ? ferry__seterr(&w->err, rc, "blur reference") : 0;
}

static int step_crc_portable(worker_t *w) {
  w->sink += ferry__crc32c_portable(0, w->crcbuf, CRC_BUF_BYTES);
  w->bytes += CRC_BUF_BYTES;
  return 0;
}

static int step_crc_hw1(worker_t *w) {
  w->sink += ferry__crc32c_hw1(0, w->crcbuf, CRC_BUF_BYTES);
  w->bytes += CRC_BUF_BYTES;
  return 0;
}

static int step_crc_hw3(worker_t *w) {
  w->sink += ferry__crc32c_hw3(0, w->crcbuf, CRC_BUF_BYTES);
  w->bytes += CRC_BUF_BYTES;
  return 0;
}

static int step_crc(worker_t *w) {
  w->sink += ferry__crc32c(0, w->crcbuf, CRC_BUF_BYTES);
  w->bytes += CRC_BUF_BYTES;
  return 0;
}

/* ------------------------------------------------------------------ */
/* The timing harness: `n` threads, each on its own worker, start together
 * and run a step for the budget; a repetition's figure is the mean of the
 * threads' rates (per core), the figure is the median of repetitions. */

typedef struct run_s {
  worker_t *w;
  step_fn f;
  double budget;
  pthread_barrier_t *bar;
  double rate, gbps, cpu, wall;
  int rc;
} run_t;

static double thread_cpu(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Rates are per second of the thread's own CPU time, so that other
 * processes sharing the cores slow the run down but do not lower the
 * figures (a rep also ends after 4 budgets of wall time, so a starved run
 * still finishes). */
static void *run_thread(void *arg) {
  run_t *r = arg;
  worker_t *w = r->w;
  uint64_t n = 0, batch = 1;
  double c0, w0, c = 0, t = 0;

  pthread_barrier_wait(r->bar);
  w->bytes = 0;
  w0 = now();
  c0 = thread_cpu();
  for (;;) {
    for (uint64_t k = 0; k < batch; k++) {
      int rc = r->f(w);
      if (rc < 0) {
        r->rc = rc;
        return NULL;
      }
    }
    n += batch;
    c = thread_cpu() - c0;
    t = now() - w0;
    if (c >= r->budget || t >= 4 * r->budget)
      break;
    /* Check the clocks less often for fast steps, never overshooting the
     * budget by more than about an eighth. */
    if (c < r->budget / 16)
      batch *= 2;
  }
  if (c <= 0)
    c = t;
  r->rate = (double)n / c;
  r->gbps = (double)w->bytes / c / 1e9;
  r->cpu = c;
  r->wall = t;
  r->rc = 0;
  return NULL;
}

/* CPU seconds the measuring threads got, and the wall seconds they ran:
 * their ratio says how quiet the machine was. */
static double total_cpu, total_wall;

/* Runs one repetition on `n` workers; returns 0 and the per-core rate. */
static int run_once(worker_t *ws, int n, step_fn f, double budget,
                    double *rate, double *gbps) {
  pthread_t tid[MAX_THREADS];
  run_t runs[MAX_THREADS];
  pthread_barrier_t bar;
  int rc = 0;

  pthread_barrier_init(&bar, NULL, (unsigned)n);
  for (int i = 0; i < n; i++) {
    runs[i] = (run_t){.w = &ws[i], .f = f, .budget = budget, .bar = &bar};
    if (pthread_create(&tid[i], NULL, run_thread, &runs[i]) != 0) {
      /* The barrier can never open now: give up loudly. */
      fprintf(stderr, "bench: pthread_create failed\n");
      exit(1);
    }
  }
  *rate = *gbps = 0;
  for (int i = 0; i < n; i++) {
    pthread_join(tid[i], NULL);
    if (runs[i].rc < 0 && rc == 0) {
      rc = runs[i].rc;
      fprintf(stderr, "bench: %s (%s)\n", ws[i].err.msg,
              ferry_err_name(rc));
    }
    *rate += runs[i].rate / n;
    *gbps += runs[i].gbps / n;
    total_cpu += runs[i].cpu;
    total_wall += runs[i].wall;
  }
  pthread_barrier_destroy(&bar);
  return rc;
}

/* Measures a figure: a short warm-up, then the median of the
 * repetitions. Returns 0 and the per-core value (GB/s when `gbps`). */
static int measure(bench_t *b, worker_t *ws, int n, step_fn f, bool gbps,
                   const char *what, double *out) {
  double vals[16], rate, gb;
  int rc;

  if (b->progress)
    fprintf(stderr, "\r\033[K  measuring %s ...", what);
  if ((rc = run_once(ws, n, f, b->budget / 4, &rate, &gb)) < 0)
    return rc;
  for (int i = 0; i < b->reps; i++) {
    if ((rc = run_once(ws, n, f, b->budget, &rate, &gb)) < 0)
      return rc;
    vals[i] = gbps ? gb : rate;
  }
  *out = median(vals, b->reps);
  return 0;
}

/* ------------------------------------------------------------------ */
/* Dataset generation and worker set-up. */

static int write_shard(const cfg_t *cfg, int shard, const char *path) {
  size_t npx = (size_t)cfg->h * (size_t)cfg->w * (size_t)cfg->c;
  uint8_t *px = ferry__malloc(npx);
  ferry_tfr_writer_t *wr = NULL;
  ferry_error_t err = {0};
  enc_t enc = {0};
  tjhandle tj = NULL;
  int rc = 0;

  if (px == NULL)
    return FERRY_ENOMEM;
  if (cfg->fmt == FERRY_IMAGE_JPEG && (tj = tjInitCompress()) == NULL) {
    ferry__free(px);
    fprintf(stderr, "bench: tjInitCompress: %s\n", tjGetErrorStr2(NULL));
    return FERRY_EJPEG;
  }
  rc = ferry__tfr_writer_open(path, FERRY_COMPRESSION_NONE, &wr, &err);
  for (long i = 0; rc == 0 && i < cfg->records; i++) {
    int64_t id = (int64_t)shard * cfg->records + i;
    synth_image(px, cfg->h, cfg->w, cfg->c, (uint64_t)id + 1);
    if (cfg->fmt == FERRY_IMAGE_RAW) {
      rc = enc_example(&enc, px, npx, id % 1000, id);
    } else {
      unsigned char *jpeg = NULL;
      unsigned long jlen = 0;
      if (tjCompress2(tj, px, cfg->w, 0, cfg->h, TJPF_RGB, &jpeg, &jlen,
                      TJSAMP_420, 90, 0) != 0) {
        fprintf(stderr, "bench: tjCompress2: %s\n", tjGetErrorStr2(tj));
        rc = FERRY_EJPEG;
        tjFree(jpeg);
        break;
      }
      rc = enc_example(&enc, jpeg, jlen, id % 1000, id);
      tjFree(jpeg);
    }
    if (rc == 0)
      rc = ferry__tfr_writer_write(wr, enc.out.p, enc.out.n, &err);
  }
  if (wr != NULL) {
    int rc2 = ferry__tfr_writer_close(wr, rc == 0 ? &err : NULL);
    if (rc == 0)
      rc = rc2;
  }
  if (rc < 0 && err.msg[0])
    fprintf(stderr, "bench: %s\n", err.msg);
  if (tj != NULL)
    tjDestroy(tj);
  enc_free(&enc);
  ferry__free(px);
  return rc;
}

static void worker_free(worker_t *w) {
  ferry__tfr_reader_free(w->reader);
  ferry__free(w->recs);
  ferry__free(w->rec_off);
  ferry__free(w->rec_len);
  ferry__free(w->img_off);
  ferry__free(w->img_len);
  ferry__aligned_free(w->imgs);
  ferry__aligned_free(w->out);
  ferry__aligned_free(w->tmp);
  ferry__aligned_free(w->crcbuf);
  ferry__example_close(&w->ex);
  ferry__jpeg_free(w->jpeg);
  ferry__blur_free(w->blur);
  ferry__pipeline_ctx_free(w->ctx);
  memset(w, 0, sizeof(*w));
}

/* Loads up to `nrec` records of the worker's shard into memory and
 * decodes `nimg` of them; makes its decoder, blur and pipeline ctx. */
static int worker_init(worker_t *w, const cfg_t *cfg, const char *path,
                       int nrec, int nimg) {
  ferry_tfr_options_t o;
  ferry_tfr_reader_t *r = NULL;
  ferry_record_t rec;
  size_t used = 0, cap = 0;
  int rc;

  memset(w, 0, sizeof(*w));
  w->cfg = cfg;
  w->path = path;
  w->verify_crc = true;
  ferry__example_init(&w->ex);
  w->img_bytes = (size_t)cfg->h * (size_t)cfg->w * (size_t)cfg->c;
  w->rec_off = ferry__calloc((size_t)nrec, sizeof(size_t));
  w->rec_len = ferry__calloc((size_t)nrec, sizeof(size_t));
  w->img_off = ferry__calloc((size_t)nrec, sizeof(size_t));
  w->img_len = ferry__calloc((size_t)nrec, sizeof(size_t));
  w->imgs = ferry__aligned_alloc(64, w->img_bytes * (size_t)nimg + 64);
  w->out = ferry__aligned_alloc(64, w->img_bytes + 64);
  w->tmp = ferry__aligned_alloc(64, w->img_bytes + 64);
  w->crcbuf = ferry__aligned_alloc(64, CRC_BUF_BYTES);
  if (!w->rec_off || !w->rec_len || !w->img_off || !w->img_len ||
      !w->imgs || !w->out || !w->tmp || !w->crcbuf)
    return ferry__seterr(&w->err, FERRY_ENOMEM, "bench: out of memory");
  for (size_t i = 0; i < CRC_BUF_BYTES; i++)
    w->crcbuf[i] = (uint8_t)(i * 131 + (i >> 9));

  if ((rc = ferry__blur_new(11, 0.8f, &w->blur, &w->err)) < 0 ||
      (rc = ferry__pipeline_ctx_new(cfg->pipe, &w->ctx, &w->err)) < 0)
    return rc;
  if (cfg->fmt == FERRY_IMAGE_JPEG &&
      (rc = ferry__jpeg_new(&w->jpeg, &w->err)) < 0)
    return rc;

  ferry__tfr_options_init(&o);
  if ((rc = ferry__tfr_reader_open(path, &o, &r, &w->err)) < 0)
    return rc;
  while (w->nrec < nrec &&
         (rc = ferry__tfr_reader_next(r, &rec, &w->err)) == 0) {
    if (!FERRY__GROW(w->recs, cap, used + rec.len, 4096)) {
      ferry__tfr_reader_free(r);
      return ferry__seterr(&w->err, FERRY_ENOMEM, "bench: out of memory");
    }
    memcpy(w->recs + used, rec.data, rec.len);
    w->rec_off[w->nrec] = used;
    w->rec_len[w->nrec] = rec.len;
    used += rec.len;
    w->nrec++;
  }
  ferry__tfr_reader_free(r);
  if (rc < 0 && rc != FERRY_EOF)
    return rc;
  if (w->nrec == 0)
    return ferry__seterr(&w->err, FERRY_EOF, "bench: %s is empty", path);
  for (int i = 0; i < w->nrec; i++) {
    const uint8_t *p = w->recs + w->rec_off[i], *img;
    const ferry_feature_t *f;
    size_t len;
    if ((rc = ferry__example_parse(&w->ex, p, w->rec_len[i], &w->err)) < 0)
      return rc;
    f = ferry__example_find(&w->ex, "image");
    if (f == NULL || ferry__feature_bytes(f, 0, &img, &len) < 0)
      return ferry__seterr(&w->err, FERRY_ENOFEATURE,
                           "bench: record %d has no image", i);
    w->img_off[i] = (size_t)(img - w->recs);
    w->img_len[i] = len;
  }
  for (int i = 0; i < nimg; i++) {
    if ((rc = decode_into(w, w->imgs + (size_t)i * w->img_bytes)) < 0)
      return rc;
    w->nimg++;
  }
  w->ri = 0;
  return 0;
}

/* Replaces each worker's blur object (after an ISA change, so that the
 * blur picks up the level now in force). */
static int renew_blur(worker_t *ws, int n) {
  for (int i = 0; i < n; i++) {
    ferry__blur_free(ws[i].blur);
    ws[i].blur = NULL;
    int rc = ferry__blur_new(11, 0.8f, &ws[i].blur, &ws[i].err);
    if (rc < 0)
      return rc;
  }
  return 0;
}

static void set_verify(worker_t *ws, int n, bool on) {
  for (int i = 0; i < n; i++) {
    ws[i].verify_crc = on;
    ferry__tfr_reader_free(ws[i].reader);
    ws[i].reader = NULL;
  }
}

/* ------------------------------------------------------------------ */
/* The figures of one configuration at `n` threads. */

#define TRY(expr)                                                             \
  do {                                                                        \
    int rc_ = (expr);                                                         \
    if (rc_ < 0)                                                              \
      return rc_;                                                             \
  } while (0)

static int bench_cfg_threads(bench_t *b, const cfg_t *cfg, worker_t *ws,
                             int n) {
  char sec[64], name[64];
  double v, base;
  bool seed32 = cfg->fmt == FERRY_IMAGE_RAW && cfg->h == 32 && cfg->w == 32;
  bool jpeg224 =
      cfg->fmt == FERRY_IMAGE_JPEG && cfg->h == 224 && cfg->w == 224;
  static const char *isas[] = {"avx512", "avx2", "scalar"};
  char best[16];

  snprintf(best, sizeof(best), "%s", ferry__imgops_isa());
  snprintf(sec, sizeof(sec), "%s, %d thread%s", cfg->label, n,
           n == 1 ? "" : "s");

  set_verify(ws, n, true);
  TRY(measure(b, ws, n, step_read, false, "read+CRC", &v));
  set_verify(ws, n, false);
  TRY(measure(b, ws, n, step_read_base, false, "read+CRC base", &base));
  set_verify(ws, n, true);
  add_row(b, sec, "read+CRC", v, false, "portable CRC", base, 0);

  TRY(measure(b, ws, n, step_parse, false, "parse", &v));
  TRY(measure(b, ws, n, step_parse_base, false, "protobuf-c", &base));
  add_row(b, sec, "parse (zero-copy)", v, false, "protobuf-c unpack", base,
          0);

  TRY(measure(b, ws, n, step_decode, false, "decode", &v));
  add_row(b, sec,
          cfg->fmt == FERRY_IMAGE_RAW ? "decode (raw)" : "decode (jpeg)", v,
          false, NULL, 0, 0);

  /* Dilate and blur at every ISA level with one thread; at the best level
   * only with more. */
  TRY(measure(b, ws, n, step_dilate_base, false, "dilate ref", &base));
  for (size_t i = 0; i < sizeof(isas) / sizeof(isas[0]); i++) {
    if (n > 1 && strcmp(isas[i], best) != 0)
      continue;
    if (ferry__imgops_set_isa(isas[i]) < 0)
      continue;
    snprintf(name, sizeof(name), "dilate 3x3 [%s]", isas[i]);
    TRY(measure(b, ws, n, step_dilate, false, name, &v));
    add_row(b, sec, name, v, false, "scalar reference", base, 0);
  }
  ferry__imgops_set_isa(best);

  TRY(measure(b, ws, n, step_blur_base, false, "blur ref", &base));
  for (size_t i = 0; i < sizeof(isas) / sizeof(isas[0]); i++) {
    if (n > 1 && strcmp(isas[i], best) != 0)
      continue;
    if (ferry__imgops_set_isa(isas[i]) < 0)
      continue;
    TRY(renew_blur(ws, n));
    snprintf(name, sizeof(name), "blur 11x11 [%s]", isas[i]);
    TRY(measure(b, ws, n, step_blur, false, name, &v));
    add_row(b, sec, name, v, false, "direct 2-D reference", base, 0);
  }
  ferry__imgops_set_isa(best);
  TRY(renew_blur(ws, n));

  TRY(measure(b, ws, n, step_decode_blur, false, "decode+blur", &v));
  TRY(measure(b, ws, n, step_decode_blur_base, false, "decode+blur base",
              &base));
  add_row(b, sec, "decode+blur", v, false, "decode + reference blur", base,
          jpeg224 && n == 1 ? TARGET_JPEG_224 : 0);

  TRY(measure(b, ws, n, step_pipeline, false, "pipeline", &v));
  set_verify(ws, n, false);
  TRY(measure(b, ws, n, step_pipeline_base, false, "pipeline base", &base));
  set_verify(ws, n, true);
  add_row(b, sec, "whole pipeline", v, false, "all-scalar pipeline", base,
          seed32 && n == 1 ? TARGET_PIPELINE_32 : 0);
  return 0;
}

/* Where one thread's pipeline time goes, from the ctx's stage timers. */
static int pipeline_split(bench_t *b, const cfg_t *cfg, worker_t *w) {
  double t[FERRY_STAGE_COUNT] = {0}, t0, total, rest;
  uint64_t n = 0;
  int rc;

  ferry__pipeline_ctx_set_timing(w->ctx, 1);
  t0 = now();
  do {
    for (int k = 0; k < 64; k++, n++)
      if ((rc = step_pipeline(w)) < 0)
        return rc;
  } while (now() - t0 < b->budget);
  total = now() - t0;
  ferry__pipeline_ctx_set_timing(w->ctx, 0);
  ferry__pipeline_ctx_times(w->ctx, t);
  rest = total - t[FERRY_STAGE_PARSE] - t[FERRY_STAGE_DECODE] -
         t[FERRY_STAGE_OPS];
  if (b->nnotes < 8)
    snprintf(b->notes[b->nnotes++], sizeof(b->notes[0]),
             "%s, 1 thread, %.2f us/image with stage timers on: read+CRC "
             "%.0f%%, parse %.0f%%, decode %.0f%%, dilate %.0f%%, blur "
             "%.0f%%, timers %.0f%%",
             cfg->label, total / (double)n * 1e6, 100 * rest / total,
             100 * t[FERRY_STAGE_PARSE] / total,
             100 * t[FERRY_STAGE_DECODE] / total,
             100 * t[FERRY_STAGE_DILATE] / total,
             100 * t[FERRY_STAGE_BLUR] / total,
             100 *
                 (t[FERRY_STAGE_OPS] - t[FERRY_STAGE_DILATE] -
                  t[FERRY_STAGE_BLUR]) /
                 total);
  return 0;
}

static int bench_cfg(bench_t *b, cfg_t *cfg) {
  ferry_spec_t spec;
  ferry_error_t err = {0};
  worker_t *ws = NULL;
  int rc = 0, nthreads = b->threads;
  bool big = (long)cfg->h * cfg->w > 64 * 64;
  int nrec = b->quick ? (big ? 32 : 256) : (big ? 128 : 1024);
  int nimg = big ? 4 : 64;
  double t0;

  /* The pipeline: decode, dilate(3), blur(11, 0.8). */
  ferry__spec_init(&spec); /* keys "image" and "label" */
  spec.format = cfg->fmt;
  spec.height = cfg->h;
  spec.width = cfg->w;
  spec.channels = cfg->c;
  spec.ops[0] = (ferry_image_op_t){.kind = FERRY_OP_DILATE, .a = 3};
  spec.ops[1] =
      (ferry_image_op_t){.kind = FERRY_OP_BLUR, .a = 11, .sigma = 0.8f};
  spec.n_ops = 2;
  if ((rc = ferry__pipeline_new(&spec, &cfg->pipe, &err)) < 0) {
    fprintf(stderr, "bench: %s\n", err.msg);
    return rc;
  }

  cfg->nshards = nthreads;
  cfg->paths = ferry__calloc((size_t)nthreads, sizeof(char *));
  if (cfg->paths == NULL)
    return FERRY_ENOMEM;
  if (b->progress)
    fprintf(stderr, "\r\033[K  writing %d shard%s of %ld %s records ...",
            nthreads, nthreads == 1 ? "" : "s", cfg->records, cfg->label);
  t0 = now();
  for (int i = 0; i < nthreads; i++) {
    char path[PATH_MAX + 64];
    snprintf(path, sizeof(path), "%s/bench-%dx%d-%s-%05d.tfrecord", b->dir,
             cfg->h, cfg->w, cfg->fmt == FERRY_IMAGE_JPEG ? "jpeg" : "raw",
             i);
    if ((cfg->paths[i] = ferry__strdup(path)) == NULL)
      return FERRY_ENOMEM;
    if ((rc = write_shard(cfg, i, path)) < 0)
      return rc;
  }
  if (b->nnotes < 8) {
    struct stat st;
    if (stat(cfg->paths[0], &st) == 0)
      snprintf(b->notes[b->nnotes++], sizeof(b->notes[0]),
               "%s: %d shard(s) x %ld records, %.1f KiB per record, "
               "written in %.1f s",
               cfg->label, nthreads, cfg->records,
               (double)st.st_size / (double)cfg->records / 1024,
               now() - t0);
  }

  ws = ferry__calloc((size_t)nthreads, sizeof(*ws));
  if (ws == NULL)
    return FERRY_ENOMEM;
  for (int i = 0; i < nthreads; i++)
    if ((rc = worker_init(&ws[i], cfg, cfg->paths[i], nrec, nimg)) < 0) {
      fprintf(stderr, "bench: %s\n", ws[i].err.msg);
      goto out;
    }

  if ((rc = bench_cfg_threads(b, cfg, ws, 1)) < 0)
    goto out;
  if ((rc = pipeline_split(b, cfg, &ws[0])) < 0) {
    fprintf(stderr, "bench: %s\n", ws[0].err.msg);
    goto out;
  }
  if (nthreads > 1 && (rc = bench_cfg_threads(b, cfg, ws, nthreads)) < 0)
    goto out;

out:
  for (int i = 0; i < nthreads; i++)
    worker_free(&ws[i]);
  ferry__free(ws);
  return rc;
}

static void cfg_close(cfg_t *cfg) {
  for (int i = 0; cfg->paths != NULL && i < cfg->nshards; i++) {
    if (cfg->paths[i] != NULL)
      unlink(cfg->paths[i]);
    ferry__free(cfg->paths[i]);
  }
  ferry__free(cfg->paths);
  ferry__pipeline_free(cfg->pipe);
  cfg->paths = NULL;
  cfg->pipe = NULL;
}

static int bench_crc(bench_t *b) {
  worker_t *ws;
  double port, v;
  int n = b->threads, rc = 0;
  char sec[64];

  ws = ferry__calloc((size_t)n, sizeof(*ws));
  if (ws == NULL)
    return FERRY_ENOMEM;
  for (int i = 0; i < n; i++) {
    ws[i].crcbuf = ferry__aligned_alloc(64, CRC_BUF_BYTES);
    if (ws[i].crcbuf == NULL) {
      rc = FERRY_ENOMEM;
      goto out;
    }
    for (size_t k = 0; k < CRC_BUF_BYTES; k++)
      ws[i].crcbuf[k] = (uint8_t)(k * 131 + (k >> 9));
  }
  snprintf(sec, sizeof(sec), "CRC-32C, 256 KiB buffer, 1 thread");
  if ((rc = measure(b, ws, 1, step_crc_portable, true, "crc", &port)) < 0)
    goto out;
  add_row(b, sec, "portable (slicing-by-8)", port, true, "portable", port,
          0);
  if (ferry__crc32c_have_hw()) {
    if ((rc = measure(b, ws, 1, step_crc_hw1, true, "crc hw1", &v)) < 0)
      goto out;
    add_row(b, sec, "hw1 (one crc32 chain)", v, true, "portable", port, 0);
    if ((rc = measure(b, ws, 1, step_crc_hw3, true, "crc hw3", &v)) < 0)
      goto out;
    add_row(b, sec, "hw3 (three chains)", v, true, "portable", port, 0);
  }
  if ((rc = measure(b, ws, 1, step_crc, true, "crc", &v)) < 0)
    goto out;
  {
    char name[64];
    snprintf(name, sizeof(name), "ferry__crc32c (%s)", ferry__crc32c_impl());
    add_row(b, sec, name, v, true, "portable", port, TARGET_CRC_GBPS);
    if (n > 1) {
      snprintf(sec, sizeof(sec), "CRC-32C, 256 KiB buffer, %d threads", n);
      if ((rc = measure(b, ws, n, step_crc_portable, true, "crc", &port)) <
              0 ||
          (rc = measure(b, ws, n, step_crc, true, "crc", &v)) < 0)
        goto out;
      add_row(b, sec, name, v, true, "portable", port, 0);
    }
  }
out:
  for (int i = 0; i < n; i++)
    ferry__aligned_free(ws[i].crcbuf);
  ferry__free(ws);
  return rc;
}

/* ------------------------------------------------------------------ */
/* Output. */

static void cpu_info(char *model, size_t mcap, char *flags, size_t fcap) {
  FILE *f = fopen("/proc/cpuinfo", "r");
  char line[8192];
  static const char *want[] = {"sse4_2",   "pclmulqdq", "avx2",
                               "fma",      "bmi2",      "avx512f",
                               "avx512bw", "avx512vl",  "vpclmulqdq"};

  snprintf(model, mcap, "unknown");
  flags[0] = '\0';
  if (f == NULL)
    return;
  while (fgets(line, sizeof(line), f) != NULL) {
    char *colon = strchr(line, ':');
    if (colon == NULL)
      continue;
    if (strncmp(line, "model name", 10) == 0 && strcmp(model, "unknown") == 0)
      snprintf(model, mcap, "%.*s", (int)strcspn(colon + 2, "\n"),
               colon + 2);
    if (strncmp(line, "flags", 5) == 0 && flags[0] == '\0') {
      size_t used = 0;
      for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        char pat[32];
        snprintf(pat, sizeof(pat), " %s", want[i]);
        char *hit = strstr(colon, pat);
        if (hit != NULL && (hit[strlen(pat)] == ' ' ||
                            hit[strlen(pat)] == '\n')) {
          int k = snprintf(flags + used, fcap - used, "%s%s",
                           used ? " " : "", want[i]);
          if (k > 0 && (size_t)k < fcap - used)
            used += (size_t)k;
        }
      }
    }
  }
  fclose(f);
}

static void print_table(const bench_t *b) {
  const char *last = "";
  int pass = 0, miss = 0;
  char v[32], base[32], ratio[16];

  printf("\n%-30s %13s %-5s  %13s  %-24s %8s  %s\n", "figure (per core)",
         "value", "unit", "baseline", "(baseline is)", "ratio", "target");
  for (int i = 0; i < b->nrows; i++) {
    const row_t *r = &b->rows[i];
    char target[48] = "";
    if (strcmp(r->section, last) != 0) {
      printf("%s\n", r->section);
      last = r->section;
    }
    fmt_value(v, sizeof(v), r->value, r->gbps);
    if (r->base > 0) {
      fmt_value(base, sizeof(base), r->base, r->gbps);
      snprintf(ratio, sizeof(ratio), "%.2fx", r->value / r->base);
    } else {
      snprintf(base, sizeof(base), "-");
      ratio[0] = '\0';
    }
    if (r->target > 0) {
      char t[32];
      bool ok = r->value >= r->target;
      fmt_value(t, sizeof(t), r->target, r->gbps);
      snprintf(target, sizeof(target), ">= %s %s", t, ok ? "PASS" : "MISS");
      ok ? pass++ : miss++;
    }
    {
      char line[256];
      size_t len;
      snprintf(line, sizeof(line), "  %-28s %13s %-5s  %13s  %-24s %8s  %s",
               r->name, v, r->gbps ? "GB/s" : "img/s", base,
               r->base > 0 ? r->base_name : "", ratio, target);
      len = strlen(line);
      while (len > 0 && line[len - 1] == ' ')
        line[--len] = '\0';
      printf("%s\n", line);
    }
  }
  printf("\n");
  for (int i = 0; i < b->nnotes; i++)
    printf("note: %s\n", b->notes[i]);
  if (total_wall > 0)
    printf("note: the measuring threads got %.0f%% of their wall time on "
           "a CPU (100%%: a quiet machine)\n",
           100 * total_cpu / total_wall);
  printf("targets: %d PASS, %d MISS\n", pass, miss);
}

/* ------------------------------------------------------------------ */
/* Arguments and main. */

static int parse_size(const char *s, int *h, int *w) {
  char *end;
  long a = strtol(s, &end, 10), c;
  if (end == s || (*end != 'x' && *end != 'X'))
    return -1;
  c = strtol(end + 1, &end, 10);
  if (*end != '\0' || a < 6 || c < 6 || a > 4096 || c > 4096)
    return -1;
  *h = (int)a;
  *w = (int)c;
  return 0;
}

static int bench_pipeline(int argc, char **argv) {
  static bench_t bench;
  bench_t *b = &bench;
  cfg_t cfgs[2];
  int ncfg = 0, size_h = 0, size_w = 0, fmt = -1, rc = 0;
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  char model[128], flags[256], date[64];
  time_t tnow = time(NULL);
  struct tm tm;
  double t_start = now();

  memset(b, 0, sizeof(*b));
  b->threads = cores > 0 ? (int)cores : 1;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *val = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      fputs(bench_usage, stdout);
      return 0;
    } else if (strcmp(a, "--quick") == 0) {
      b->quick = true;
      continue;
    }
    if (strcmp(a, "--records") != 0 && strcmp(a, "--size") != 0 &&
        strcmp(a, "--format") != 0 && strcmp(a, "--threads") != 0 &&
        strcmp(a, "--dir") != 0) {
      fprintf(stderr, "bench: unknown option '%s'\n\n%s", a, bench_usage);
      return 2;
    }
    if (val == NULL) {
      fprintf(stderr, "bench: %s needs a value\n\n%s", a, bench_usage);
      return 2;
    }
    i++;
    if (strcmp(a, "--records") == 0) {
      b->records = strtol(val, NULL, 10);
      if (b->records < 1 || b->records > 100000000) {
        fprintf(stderr, "bench: --records %s: out of range\n", val);
        return 2;
      }
    } else if (strcmp(a, "--size") == 0) {
      if (parse_size(val, &size_h, &size_w) < 0) {
        fprintf(stderr, "bench: --size %s: expected HxW, 6..4096\n", val);
        return 2;
      }
    } else if (strcmp(a, "--format") == 0) {
      if (strcmp(val, "raw") == 0)
        fmt = FERRY_IMAGE_RAW;
      else if (strcmp(val, "jpeg") == 0)
        fmt = FERRY_IMAGE_JPEG;
      else {
        fprintf(stderr, "bench: --format %s: expected raw or jpeg\n", val);
        return 2;
      }
    } else if (strcmp(a, "--threads") == 0) {
      long t = strtol(val, NULL, 10);
      if (t < 1 || t > MAX_THREADS) {
        fprintf(stderr, "bench: --threads %s: expected 1..%d\n", val,
                MAX_THREADS);
        return 2;
      }
      b->threads = (int)t;
    } else {
      snprintf(b->dir, sizeof(b->dir), "%s", val);
    }
  }
  b->reps = 5;
  b->budget = b->quick ? 0.02 : 0.12;
  b->progress = isatty(STDERR_FILENO);

  /* The configurations: the two of the issue, or the one asked for. */
  memset(cfgs, 0, sizeof(cfgs));
  if (size_h == 0) {
    cfgs[0] = (cfg_t){.h = 32, .w = 32, .c = 3, .fmt = FERRY_IMAGE_RAW};
    cfgs[1] = (cfg_t){.h = 224, .w = 224, .c = 3, .fmt = FERRY_IMAGE_JPEG};
    ncfg = 2;
    if (fmt >= 0)
      cfgs[0].fmt = cfgs[1].fmt = (ferry_image_format_t)fmt;
  } else {
    cfgs[0] = (cfg_t){.h = size_h, .w = size_w, .c = 3};
    cfgs[0].fmt = fmt >= 0                     ? (ferry_image_format_t)fmt
                  : size_h == 32 && size_w == 32 ? FERRY_IMAGE_RAW
                                                 : FERRY_IMAGE_JPEG;
    ncfg = 1;
  }
  for (int i = 0; i < ncfg; i++) {
    cfg_t *c = &cfgs[i];
    bool big = (long)c->h * c->w > 64 * 64;
    c->records = b->records ? b->records : big ? 400 : 10000;
    if (b->quick && b->records == 0)
      c->records /= 10;
    snprintf(c->label, sizeof(c->label), "%dx%dx%d %s", c->h, c->w, c->c,
             c->fmt == FERRY_IMAGE_JPEG ? "jpeg q90" : "raw");
  }

  if (b->dir[0] == '\0') {
    snprintf(b->dir, sizeof(b->dir), "/tmp/ferry-bench-XXXXXX");
    if (mkdtemp(b->dir) == NULL) {
      fprintf(stderr, "bench: mkdtemp: %s\n", strerror(errno));
      return 1;
    }
    b->own_dir = true;
  } else if (mkdir(b->dir, 0755) < 0 && errno != EEXIST) {
    fprintf(stderr, "bench: mkdir %s: %s\n", b->dir, strerror(errno));
    return 1;
  }

  cpu_info(model, sizeof(model), flags, sizeof(flags));
  localtime_r(&tnow, &tm);
  strftime(date, sizeof(date), "%Y-%m-%d %H:%M %Z", &tm);
  printf("ferry bench pipeline%s: %s\n", b->quick ? " --quick" : "", date);
  printf("cpu: %s, %ld cores online; flags: %s\n", model, cores, flags);
  printf("imgops: %s, crc32c: %s; threads: %d; each figure: median of "
         "%d x %.0f ms of thread CPU time, per core\n",
         ferry__imgops_isa(), ferry__crc32c_impl(), b->threads, b->reps,
         b->budget * 1e3);
  printf("pipeline: decode | dilate(3) | blur(11, 0.8); shards in %s\n",
         b->dir);
  fflush(stdout);

  rc = bench_crc(b);
  for (int i = 0; rc == 0 && i < ncfg; i++)
    rc = bench_cfg(b, &cfgs[i]);
  for (int i = 0; i < ncfg; i++)
    cfg_close(&cfgs[i]);
  if (b->own_dir)
    rmdir(b->dir);
  if (b->progress)
    fprintf(stderr, "\r\033[K");
  if (rc < 0) {
    fprintf(stderr, "bench: failed: %s\n", ferry_strerror(rc));
    return 1;
  }
  print_table(b);
  printf("bench pipeline: ok in %.1f s\n", now() - t_start);
  return 0;
}

/* `ferryctl bench pipeline ...`: argv[0] is "bench". Returns the exit
 * status: 0 when every figure was measured (whether or not targets were
 * met), 1 on a failure, 2 on a usage error. */
int ferryctl_bench(int argc, char **argv) {
  if (argc < 2 || strcmp(argv[1], "--help") == 0 ||
      strcmp(argv[1], "-h") == 0) {
    fputs(bench_usage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (strcmp(argv[1], "pipeline") == 0)
    return bench_pipeline(argc - 1, argv + 1);
  fprintf(stderr, "bench: unknown benchmark '%s'\n\n%s", argv[1],
          bench_usage);
  return 2;
}
