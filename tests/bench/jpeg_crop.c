/* bench_jpeg_crop: RandomResizedCrop(224) on ImageNet-like JPEGs, per
 * core: Ferry's decode fused with the crop and the DCT scale
 * against Ferry's full decode followed by the same antialiased resize
 * (and the fused decode with gap 2: a DCT scale that keeps twice the
 * output's resolution, more accurate), on the same images with the same
 * crops, in the same run, on one thread pinned to one CPU.
 *
 *   bench_jpeg_crop --data 'DIR/train-*.tfrecord' [--records N]
 *                   [--seconds S] [--size 224] [--export DIR] [--quick]
 *
 * The records are tf.train.Examples whose "image" feature is a JPEG (as
 * `ferryctl gen --format jpeg --content photo --size imagenet` writes
 * them); they are read into memory first, so the figures are decode and
 * crop alone. Every pass first checks every image: it must decode to
 * 224x224x3 on both paths, else the benchmark fails naming the record.
 * The images are also rewritten as `ferryctl records optimize` does
 * (restart-interval tiles, in memory, the same code), and the window
 * path's pixels on them are compared with the fused path's on the
 * originals, every image.
 * Then the paths alternate in rounds of one pass over the images
 * (round r crops image i with ferry__crop_key(7, r, i), the same crop on
 * both paths), until each has run for --seconds; the figure of each is
 * images per second of the thread's CPU time over all its rounds (and
 * per second of wall time, next to it).
 *
 * Lines starting "RESULT" are for tests/bench/imagenet.sh, which puts
 * them in one table with the tf.data and PyTorch baselines:
 *   RESULT <name> <images per CPU second> <images per wall second> <label>
 * --export DIR writes the JPEGs as DIR/NNNNNN.jpg for those baselines.
 * Prints "bench jpeg_crop: ok" on success.
 */
#include <errno.h>
#include <glob.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <turbojpeg.h>

#include "alloc.h"
#include "crop.h"
#include "example.h"
#include "imgops.h"
#include "jpeg_restart.h"
#include "tfrecord.h"

#define MAX_SIZES 32
#define NPATHS 5

static struct {
  const char *data;
  long records;   /* 0: all */
  double seconds; /* per path */
  int size;
  const char *export_dir;
  const char *only; /* time this path alone (profiling) */
  bool scales;      /* also: whole-image decodes at every DCT scale */
} opt = {.seconds = 3.0, .size = 224};

static void usage(FILE *f) {
  fprintf(f,
          "usage: bench_jpeg_crop --data GLOB [options]\n"
          "  --data GLOB      TFRecord files of Examples with a JPEG \"image\"\n"
          "  --records N      use the first N records (default: all)\n"
          "  --seconds S      CPU seconds per path (default 3)\n"
          "  --size N         RandomResizedCrop's output size (default 224)\n"
          "  --export DIR     also write the JPEGs as DIR/NNNNNN.jpg\n"
          "  --only NAME      time only this path (ferry-fused,\n"
          "                   ferry-fused-gap2, ferry-full, ferry-window,\n"
          "                   floor-entropy),\n"
          "                   e.g. under perf; the sanity pass runs all\n"
          "  --scales         also time TurboJPEG decoding the whole images\n"
          "                   at each DCT scale s/8 (what each scale costs)\n"
          "  --quick          a smoke run: 0.3 s per path\n");
}

static int parse_args(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "--quick") == 0) {
      opt.seconds = 0.3;
      continue;
    }
    if (strcmp(a, "--scales") == 0) {
      opt.scales = true;
      continue;
    }
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      usage(stdout);
      exit(0);
    }
    if (v == NULL) {
      fprintf(stderr, "bench_jpeg_crop: %s needs a value (--help)\n", a);
      return -1;
    }
    i++;
    char *end = NULL;
    if (strcmp(a, "--data") == 0) {
      opt.data = v;
    } else if (strcmp(a, "--export") == 0) {
      opt.export_dir = v;
    } else if (strcmp(a, "--only") == 0) {
      opt.only = v;
    } else if (strcmp(a, "--records") == 0) {
      opt.records = strtol(v, &end, 10);
      if (*end != '\0' || opt.records < 1) {
        fprintf(stderr, "bench_jpeg_crop: --records '%s': expected a "
                        "positive integer\n", v);
        return -1;
      }
    } else if (strcmp(a, "--seconds") == 0) {
      opt.seconds = strtod(v, &end);
      if (*end != '\0' || !(opt.seconds > 0 && opt.seconds < 3600)) {
        fprintf(stderr, "bench_jpeg_crop: --seconds '%s': expected a "
                        "number in (0, 3600)\n", v);
        return -1;
      }
    } else if (strcmp(a, "--size") == 0) {
      long n = strtol(v, &end, 10);
      if (*end != '\0' || n < 1 || n > 4096) {
        fprintf(stderr, "bench_jpeg_crop: --size '%s': expected 1..4096\n",
                v);
        return -1;
      }
      opt.size = (int)n;
    } else {
      fprintf(stderr, "bench_jpeg_crop: unknown argument '%s' (--help)\n",
              a);
      return -1;
    }
  }
  if (opt.data == NULL) {
    fprintf(stderr, "bench_jpeg_crop: --data GLOB is required (--help)\n");
    return -1;
  }
  return 0;
}

/* ---- The images, in memory --------------------------------------------- */

typedef struct image_s {
  uint8_t *jpeg;
  size_t len;
  int h, w;
  char where[96]; /* "FILE at offset N", for errors */
} image_t;

typedef struct images_s {
  image_t *v;
  size_t n, cap;
  uint64_t bytes, pixels;
  struct {
    int h, w;
    size_t count;
  } sizes[MAX_SIZES];
  int nsizes;
} images_t;

static void images_free(images_t *im) {
  for (size_t i = 0; i < im->n; i++)
    ferry__free(im->v[i].jpeg);
  ferry__free(im->v);
}

static void count_size(images_t *im, int h, int w) {
  for (int i = 0; i < im->nsizes; i++)
    if (im->sizes[i].h == h && im->sizes[i].w == w) {
      im->sizes[i].count++;
      return;
    }
  if (im->nsizes < MAX_SIZES)
    im->sizes[im->nsizes++] = (typeof(im->sizes[0])){h, w, 1};
}

/* Appends the JPEG of one record. Returns 0 or -1 (printed). */
static int add_record(images_t *im, ferry_jpeg_t *j, ferry_example_t *ex,
                      const char *path, const ferry_record_t *rec) {
  ferry_error_t err = {0};
  const uint8_t *d;
  size_t len;
  if (ferry__example_parse(ex, rec->data, rec->len, &err) != 0 ||
      ferry__feature_bytes(ferry__example_find(ex, "image"), 0, &d, &len) !=
          0) {
    fprintf(stderr, "bench_jpeg_crop: %s, record at offset %llu: no "
            "\"image\" bytes feature%s%s\n", path,
            (unsigned long long)rec->offset, err.msg[0] ? ": " : "",
            err.msg);
    return -1;
  }
  image_t m = {0};
  snprintf(m.where, sizeof(m.where), "%.60s at offset %llu", path,
           (unsigned long long)rec->offset);
  if (ferry__jpeg_header(j, d, len, &m.h, &m.w, &err) != 0) {
    fprintf(stderr, "bench_jpeg_crop: %s: %s\n", m.where, err.msg);
    return -1;
  }
  if (im->n == im->cap) {
    size_t cap = im->cap ? im->cap * 2 : 1024;
    image_t *v = ferry__realloc(im->v, cap * sizeof(*v));
    if (v == NULL)
      goto nomem;
    im->v = v;
    im->cap = cap;
  }
  m.jpeg = ferry__malloc(len);
  if (m.jpeg == NULL)
    goto nomem;
  memcpy(m.jpeg, d, len);
  m.len = len;
  im->v[im->n++] = m;
  im->bytes += len;
  im->pixels += (uint64_t)m.h * (uint64_t)m.w;
  count_size(im, m.h, m.w);
  return 0;
nomem:
  fprintf(stderr, "bench_jpeg_crop: out of memory reading %s\n", path);
  return -1;
}

static int load(images_t *im, ferry_jpeg_t *j) {
  glob_t g;
  int grc = glob(opt.data, 0, NULL, &g);
  if (grc != 0) {
    fprintf(stderr, "bench_jpeg_crop: --data '%s' matches no file\n",
            opt.data);
    if (grc != GLOB_NOMATCH)
      globfree(&g);
    return -1;
  }
  int rc = 0;
  ferry_example_t ex;
  ferry__example_init(&ex);
  ferry_tfr_options_t o;
  ferry__tfr_options_init(&o);
  for (size_t f = 0; f < g.gl_pathc && rc == 0; f++) {
    ferry_tfr_reader_t *rd;
    ferry_error_t err = {0};
    if (ferry__tfr_reader_open(g.gl_pathv[f], &o, &rd, &err) != 0) {
      fprintf(stderr, "bench_jpeg_crop: %s\n", err.msg);
      rc = -1;
      break;
    }
    ferry_record_t rec;
    while (rc == 0 && (opt.records == 0 || im->n < (size_t)opt.records)) {
      int r = ferry__tfr_reader_next(rd, &rec, &err);
      if (r == FERRY_EOF)
        break;
      if (r != 0) {
        fprintf(stderr, "bench_jpeg_crop: %s: %s\n", g.gl_pathv[f],
                err.msg);
        rc = -1;
      } else if (add_record(im, j, &ex, g.gl_pathv[f], &rec) != 0) {
        rc = -1;
      }
    }
    ferry__tfr_reader_free(rd);
  }
  ferry__example_close(&ex);
  globfree(&g);
  if (rc == 0 && im->n == 0) {
    fprintf(stderr, "bench_jpeg_crop: no records in %s\n", opt.data);
    rc = -1;
  }
  return rc;
}

static int export_jpegs(const images_t *im) {
  if (mkdir(opt.export_dir, 0777) != 0 && errno != EEXIST) {
    fprintf(stderr, "bench_jpeg_crop: cannot create %s: %s\n",
            opt.export_dir, strerror(errno));
    return -1;
  }
  char path[4096];
  for (size_t i = 0; i < im->n; i++) {
    snprintf(path, sizeof(path), "%s/%06zu.jpg", opt.export_dir, i);
    FILE *f = fopen(path, "wb");
    bool ok = f != NULL && fwrite(im->v[i].jpeg, 1, im->v[i].len, f) ==
                               im->v[i].len;
    if (f != NULL && fclose(f) != 0)
      ok = false;
    if (!ok) {
      fprintf(stderr, "bench_jpeg_crop: cannot write %s: %s\n", path,
              strerror(errno));
      return -1;
    }
  }
  return 0;
}

/* ---- The paths ---------------------------------------------------------- */

static double thread_cpu_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double wall_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct path_s {
  const char *name, *label;
  int exact;
  double gap;
  bool floor; /* the whole image at 1/8 scale, no crop (a bound) */
  bool tiled; /* on the images ferryctl records optimize rewrote */
  double cpu, wall; /* accumulated over the timed rounds */
  uint64_t images;
} path_t;

/* One pass over every image with the crops of round `round`. Returns 0,
 * or -1 naming the image that failed or came out the wrong shape. */
/* The entropy-decoding bound: TurboJPEG decodes the whole image at 1/8
 * scale (every coefficient is still Huffman-decoded; the IDCT keeps only
 * the DC term). Without restart markers a crop must entropy-decode every
 * iMCU row down to its last one, all columns: a crop reaching the
 * image's bottom pays all of this. */
static int pass_whole(const images_t *im, tjhandle tj, int num,
                      uint8_t **buf, size_t *cap, volatile uint64_t *sink) {
  for (size_t i = 0; i < im->n; i++) {
    int w = (im->v[i].w * num + 7) / 8, h = (im->v[i].h * num + 7) / 8;
    size_t need = (size_t)w * (size_t)h * 3;
    if (need > *cap) {
      uint8_t *b = ferry__realloc(*buf, need);
      if (b == NULL) {
        fprintf(stderr, "bench_jpeg_crop: out of memory\n");
        return -1;
      }
      *buf = b;
      *cap = need;
    }
    if (tjDecompress2(tj, im->v[i].jpeg, (unsigned long)im->v[i].len, *buf,
                      w, 0, h, TJPF_RGB, TJFLAG_FASTDCT) != 0) {
      fprintf(stderr, "bench_jpeg_crop: whole decode at %d/8: %s: %s\n",
              num, im->v[i].where, tjGetErrorStr2(tj));
      return -1;
    }
    *sink += (*buf)[need / 2];
  }
  return 0;
}

static int pass(path_t *p, const images_t *plain, const images_t *tiled,
                ferry_jpeg_t *j,
                uint8_t *out, size_t cap, uint64_t round,
                volatile uint64_t *sink) {
  ferry_crop_op_t op = {.kind = FERRY_CROP_RANDOM_RESIZED,
                        .out_h = opt.size,
                        .out_w = opt.size,
                        .rrc = {0.08, 1.0, 3.0 / 4.0, 4.0 / 3.0},
                        .exact = p->exact,
                        .gap = p->gap};
  const images_t *im = p->tiled ? tiled : plain;
  /* The other paths never cut windows, even from a dataset that was
   * optimized already. */
  ferry__jpeg_set_window(j, p->tiled);
  for (size_t i = 0; i < im->n; i++) {
    ferry_error_t err = {0};
    int oh = 0, ow = 0;
    op.key = ferry__crop_key(7, round, i);
    int rc = ferry__jpeg_decode_crop(j, im->v[i].jpeg, im->v[i].len, &op, out,
                                     cap, &oh, &ow, NULL, &err);
    if (rc != 0) {
      fprintf(stderr, "bench_jpeg_crop: %s: record %zu (%s): %s\n", p->name,
              i, im->v[i].where, err.msg);
      return -1;
    }
    if (oh != opt.size || ow != opt.size) {
      fprintf(stderr, "bench_jpeg_crop: %s: record %zu (%s) came out "
              "%dx%d, not %dx%d\n", p->name, i, im->v[i].where, oh, ow,
              opt.size, opt.size);
      return -1;
    }
    *sink += out[(size_t)(oh / 2) * (size_t)ow * 3 + (size_t)ow / 2 * 3];
  }
  return 0;
}

/* The images as `ferryctl records optimize` rewrites them (in memory,
 * the same code), and what it did: printed. Returns 0 or -1. */
static int optimize_images(const images_t *im, images_t *out,
                           ferry_jpeg_t *j) {
  size_t count[FERRY_JOPT_NREASONS] = {0};
  uint64_t bytes = 0;
  *out = *im;
  out->v = ferry__calloc(im->n ? im->n : 1, sizeof(*out->v));
  if (out->v == NULL)
    return -1;
  for (size_t i = 0; i < im->n; i++) {
    ferry_jopt_result_t r;
    ferry_error_t err = {0};
    uint8_t *o;
    size_t ol;
    out->v[i] = im->v[i];
    out->v[i].jpeg = NULL; /* until its own copy is made */
    if (ferry__jpeg_optimize(j, im->v[i].jpeg, im->v[i].len, &o, &ol, &r,
                             &err) != 0) {
      fprintf(stderr, "bench_jpeg_crop: optimize %s: %s\n", im->v[i].where,
              err.msg);
      return -1;
    }
    count[r.reason]++;
    if (o == NULL) {
      o = ferry__malloc(im->v[i].len);
      if (o == NULL)
        return -1;
      memcpy(o, im->v[i].jpeg, im->v[i].len);
      ol = im->v[i].len;
    }
    out->v[i].jpeg = o;
    out->v[i].len = ol;
    bytes += ol;
  }
  out->bytes = bytes;
  printf("optimized (ferryctl records optimize): %zu of %zu rewritten with "
         "restart-interval tiles,", count[FERRY_JOPT_REWRITTEN], im->n);
  for (int r = 1; r < FERRY_JOPT_NREASONS; r++)
    if (count[r] > 0)
      printf(" %zu %s,", count[r],
             ferry__jopt_reason_name((ferry_jopt_reason_t)r));
  printf(" %.0f bytes per image (%+.2f%%)\n",
         (double)bytes / (double)(im->n ? im->n : 1),
         100.0 * ((double)bytes / (double)im->bytes - 1));
  return 0;
}

/* The window path on the optimized images gives the fused path's pixels
 * on the originals, for round `round`'s crops. Returns 0 or -1. */
static int same_pixels(const images_t *plain, const images_t *tiled,
                       ferry_jpeg_t *j, uint8_t *a, uint8_t *b, size_t cap) {
  ferry_crop_op_t op = {.kind = FERRY_CROP_RANDOM_RESIZED,
                        .out_h = opt.size,
                        .out_w = opt.size,
                        .rrc = {0.08, 1.0, 3.0 / 4.0, 4.0 / 3.0}};
  for (size_t i = 0; i < plain->n; i++) {
    ferry_error_t err = {0};
    int h1, w1, h2 = 0, w2 = 0;
    op.key = ferry__crop_key(7, 0, i);
    ferry__jpeg_set_window(j, 0);
    int rc = ferry__jpeg_decode_crop(j, plain->v[i].jpeg, plain->v[i].len,
                                     &op, a, cap, &h1, &w1, NULL, &err);
    ferry__jpeg_set_window(j, 1);
    if (rc == 0)
      rc = ferry__jpeg_decode_crop(j, tiled->v[i].jpeg, tiled->v[i].len, &op,
                                   b, cap, &h2, &w2, NULL, &err);
    if (rc != 0 || h1 != h2 || w1 != w2 ||
        memcmp(a, b, (size_t)h1 * w1 * 3) != 0) {
      fprintf(stderr, "bench_jpeg_crop: %s: the window path on the "
              "optimized image gives other pixels than the fused path on "
              "the original%s%s\n", plain->v[i].where, err.msg[0] ? ": " : "",
              err.msg);
      return -1;
    }
  }
  return 0;
}

/* Pins the thread to the CPU it runs on now; returns that CPU or -1. */
static int pin_to_one_cpu(void) {
  int cpu = sched_getcpu();
  if (cpu < 0)
    return -1;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return sched_setaffinity(0, sizeof(set), &set) == 0 ? cpu : -1;
}

int main(int argc, char **argv) {
  if (parse_args(argc, argv) != 0)
    return 2;
  int status = 1;
  images_t im = {0}, tiled = {0};
  ferry_jpeg_t *j = NULL;
  uint8_t *out = NULL, *fbuf = NULL; /* fbuf: the floor's output */
  size_t fcap = 0;
  tjhandle tj = NULL;
  ferry_error_t err = {0};
  if (ferry__jpeg_new(&j, &err) != 0) {
    fprintf(stderr, "bench_jpeg_crop: %s\n", err.msg);
    goto done;
  }
  if (load(&im, j) != 0)
    goto done;
  if (opt.export_dir != NULL && export_jpegs(&im) != 0)
    goto done;
  if (optimize_images(&im, &tiled, j) != 0)
    goto done;

  printf("dataset: %zu JPEGs from %s, %.0f bytes per image, %.0f pixels "
         "per image, %.3f bytes per pixel\n", im.n, opt.data,
         (double)im.bytes / (double)im.n, (double)im.pixels / (double)im.n,
         (double)im.bytes / (double)im.pixels);
  printf("sizes (HxW: images):");
  for (int i = 0; i < im.nsizes; i++)
    printf(" %dx%d: %zu", im.sizes[i].h, im.sizes[i].w, im.sizes[i].count);
  printf("\n");
  int cpu = pin_to_one_cpu();
  if (cpu >= 0)
    printf("one thread, pinned to CPU %d; SIMD: %s\n", cpu,
           ferry__imgops_isa());
  else
    printf("one thread (not pinned: %s); SIMD: %s\n", strerror(errno),
           ferry__imgops_isa());

  size_t cap = (size_t)opt.size * (size_t)opt.size * 3;
  out = ferry__malloc(2 * cap);
  if (out == NULL) {
    fprintf(stderr, "bench_jpeg_crop: out of memory\n");
    goto done;
  }
  path_t paths[NPATHS] = {
      {.name = "ferry-fused",
       .label = "Ferry: decode fused with crop + DCT scale, resize",
       .exact = 0},
      {.name = "ferry-fused-gap2",
       .label = "Ferry: the same, DCT scale keeping 2x the output",
       .exact = 0,
       .gap = 2.0},
      {.name = "ferry-full",
       .label = "Ferry: full decode, crop, antialiased resize",
       .exact = 1},
      {.name = "ferry-window",
       .label = "Ferry: the same on the optimized JPEGs (window decode of "
                "the restart-interval tiles covering the crop)",
       .tiled = true},
      {.name = "floor-entropy",
       .label = "(bound) TurboJPEG, whole image at 1/8 scale: entropy "
                "decoding of the whole file",
       .floor = true},
  };
  tj = tjInitDecompress();
  if (tj == NULL) {
    fprintf(stderr, "bench_jpeg_crop: %s\n", tjGetErrorStr2(NULL));
    goto done;
  }
  volatile uint64_t sink = 0;

  /* Round 0: the sanity pass (every image, every path, right shape),
   * also warming caches; not timed. The decoder's counters after the
   * first (fused) pass say how it went. */
  ferry_jpeg_crop_stats_t st, st2;
  for (int p = 0; p < NPATHS; p++) {
    if (paths[p].floor
            ? pass_whole(&im, tj, 1, &fbuf, &fcap, &sink) != 0
            : pass(&paths[p], &im, &tiled, j, out, cap, 0, &sink) != 0)
      goto done;
    if (p == 0)
      ferry__jpeg_crop_stats(j, &st);
  }
  ferry__jpeg_crop_stats(j, &st2);
  if (same_pixels(&im, &tiled, j, out, out + cap, cap) != 0)
    goto done;
  printf("sanity: %zu images decoded to %dx%dx3 on all %d crop paths; "
         "fused path: %llu of %zu images decoded partially or scaled (by "
         "DCT scale s/8:", im.n, opt.size, opt.size, NPATHS - 1,
         (unsigned long long)(st.fused), im.n);
  for (int s = 1; s <= 8; s++)
    if (st.by_scale[s] > 0)
      printf(" %d/8: %llu", s, (unsigned long long)st.by_scale[s]);
  printf("), %llu progressive, %.0f decoded pixels per image; window "
         "path: %llu of %zu optimized images (%llu fell back); its pixels "
         "are the fused path's on the originals (all %zu compared)\n",
         (unsigned long long)st.progressive,
         (double)st.pixels_decoded / (double)im.n,
         (unsigned long long)st2.window, im.n,
         (unsigned long long)st2.window_fallback, im.n);

  /* Timed rounds, the paths alternating, until each has its seconds. */
  uint64_t round = 1;
  bool timed[NPATHS];
  int ntimed = 0;
  for (int p = 0; p < NPATHS; p++) {
    timed[p] = opt.only == NULL || strcmp(opt.only, paths[p].name) == 0;
    ntimed += timed[p];
  }
  if (ntimed == 0) {
    fprintf(stderr, "bench_jpeg_crop: --only '%s': no such path\n",
            opt.only);
    goto done;
  }
  for (;;) {
    bool enough = true;
    for (int p = 0; p < NPATHS; p++)
      enough = enough && (!timed[p] || paths[p].cpu >= opt.seconds);
    if (enough)
      break;
    for (int p = 0; p < NPATHS; p++) {
      if (!timed[p])
        continue;
      double c0 = thread_cpu_s(), w0 = wall_s();
      if (paths[p].floor
              ? pass_whole(&im, tj, 1, &fbuf, &fcap, &sink) != 0
              : pass(&paths[p], &im, &tiled, j, out, cap, round, &sink) != 0)
        goto done;
      paths[p].cpu += thread_cpu_s() - c0;
      paths[p].wall += wall_s() - w0;
      paths[p].images += im.n;
    }
    round++;
  }

  printf("\n| path | images/s per core (CPU time) | images/s (wall) | "
         "images |\n|---|---|---|---|\n");
  for (int p = 0; p < NPATHS; p++)
    if (timed[p])
      printf("| %s | %.0f | %.0f | %llu |\n", paths[p].label,
             (double)paths[p].images / paths[p].cpu,
             (double)paths[p].images / paths[p].wall,
             (unsigned long long)paths[p].images);
  if (timed[0] && timed[2])
    printf("fused / full decode: %.2fx\n",
           ((double)paths[0].images / paths[0].cpu) /
               ((double)paths[2].images / paths[2].cpu));
  if (timed[0] && timed[2] && timed[3]) {
    double wi = (double)paths[3].images / paths[3].cpu;
    double fu = (double)paths[0].images / paths[0].cpu;
    double fd = (double)paths[2].images / paths[2].cpu;
    printf("window on optimized JPEGs: %.0f images/s per core (target >= "
           "1800: %s); %.2fx the fused decode without tiles (target >= "
           "1.6x: %s); %.2fx Ferry's full decode (target >= 2x: %s)\n",
           wi, wi >= 1800 ? "PASS" : "MISS", wi / fu,
           wi >= 1.6 * fu ? "PASS" : "MISS", wi / fd,
           wi >= 2 * fd ? "PASS" : "MISS");
  }
  for (int p = 0; p < NPATHS; p++)
    if (timed[p])
      printf("RESULT %s %.1f %.1f %s\n", paths[p].name,
             (double)paths[p].images / paths[p].cpu,
             (double)paths[p].images / paths[p].wall, paths[p].label);
  if (opt.scales) {
    /* What each DCT scale costs on these files, whole images: the
     * scaled inverse DCTs other than 8/8, 4/8, 2/8 and 1/8 are scalar
     * C in libjpeg-turbo. Scales alternate in rounds, like the paths. */
    static const int nums[] = {8, 7, 6, 5, 4, 3, 2, 1};
    enum { NS = sizeof(nums) / sizeof(nums[0]) };
    double scpu[NS] = {0};
    uint64_t simg[NS] = {0};
    for (bool enough = false; !enough;) {
      enough = true;
      for (int k = 0; k < NS; k++) {
        double c0 = thread_cpu_s();
        if (pass_whole(&im, tj, nums[k], &fbuf, &fcap, &sink) != 0)
          goto done;
        scpu[k] += thread_cpu_s() - c0;
        simg[k] += im.n;
        enough = enough && scpu[k] >= opt.seconds;
      }
    }
    printf("\nTurboJPEG, whole images, by DCT scale (images/s per core):");
    for (int k = 0; k < NS; k++)
      printf(" %d/8: %.0f", nums[k], (double)simg[k] / scpu[k]);
    printf("\n");
  }
  printf("RESULT bytes-per-image %.1f %.4f bytes per image, bytes per "
         "pixel\n", (double)im.bytes / (double)im.n,
         (double)im.bytes / (double)im.pixels);
  printf("bench jpeg_crop: ok\n");
  status = 0;
done:
  if (tj != NULL)
    tjDestroy(tj);
  ferry__free(fbuf);
  ferry__free(out);
  ferry__jpeg_free(j);
  for (size_t i = 0; i < tiled.n && tiled.v != NULL; i++)
    ferry__free(tiled.v[i].jpeg);
  ferry__free(tiled.v);
  images_free(&im);
  return status;
}
