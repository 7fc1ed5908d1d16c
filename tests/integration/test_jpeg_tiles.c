/* Datasets rewritten by `ferryctl records optimize` through the service:
 * the job over the optimized copy delivers exactly the pixels of the job
 * over the originals (every record compared by id), decoded through the
 * window path (the worker's ferry_worker_jpeg_decodes_total); and a copy
 * whose tiles were damaged (a restart marker renumbered in every image)
 * delivers every record once, each window it tries counted as a
 * window_fallback and the first logged with its file and byte offset. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "example.h"
#include "harness.h"
#include "it_cluster.h"
#include "jpeg_restart.h"
#include "tfrecord.h"

#define NEXT_TIMEOUT_MS 20000
#define FILES 2
#define PER_FILE 40
#define N_RECORDS (FILES * PER_FILE)

static void reset(void) {}

HX_SUITE(jpeg_tiles, 300, reset, NULL);

static void sh(const char *cmd) {
  hx_run_t r;
  char *argv[] = {"/bin/sh", "-c", (char *)cmd, NULL};
  cr_assert_eq(hx_run_capture(argv, 120000, &r), 0);
  cr_assert_eq(r.status, 0, "%s: exit %d: %s", cmd, r.status, r.err);
  hx_run_free(&r);
}

/* One epoch of random_resized_crop(64) over DIR on a worker with metrics;
 * every id once (asserted), digests by id into dig; the worker's decode
 * counts by path and its log. */
typedef struct {
  long long window, fused, fallback;
  char *log;
} counts_t;

static void run(const char *dir, uint64_t *dig, counts_t *n) {
  hx_proc_t *d, *w;
  char metrics[64], spec[900];
  const char *argv[] = {"--metrics-port", "0", NULL};
  hx_daemon_opts_t wo = {.threads = 2, .extra_argv = argv};
  it_cluster(&d, &w, 1, NULL, &wo);
  cr_assert_eq(hx_metrics_address(w, 5000, metrics, sizeof(metrics)), 0);
  snprintf(spec, sizeof(spec), "tfrecord(\"%s/*.tfrecord\") | decode(jpeg) "
           "| random_resized_crop(64) | batch(16)", dir);
  ferry_client_options_t o;
  hx_client_options(&o, d->addr, spec);
  o.num_epochs = 1;
  o.shuffle = 1;
  o.shuffle_seed = 3;
  ferry_client_t *c = it_new_client(&o);
  static uint8_t seen[N_RECORDS];
  memset(seen, 0, sizeof(seen));
  size_t got = 0;
  for (;;) {
    const ferry_batch_t *b = NULL;
    ferry_error_t err = {0};
    int rc = ferry_next(c, &b, NEXT_TIMEOUT_MS, &err);
    if (rc == FERRY_EPOCH_END || rc == FERRY_END)
      break;
    cr_assert_eq(rc, 0, "%s: ferry_next: %s", dir, err.msg);
    size_t one = (size_t)b->height * b->width * b->channels;
    for (uint32_t i = 0; i < b->size; i++) {
      size_t f = (size_t)(b->ids[i] >> 40);
      size_t r = (size_t)(b->ids[i] & ((1ull << 40) - 1));
      cr_assert(f < FILES && r < PER_FILE, "id %llx",
                (unsigned long long)b->ids[i]);
      size_t s = f * PER_FILE + r;
      cr_assert_eq(seen[s]++, 0, "%s: record %zu of file %zu twice", dir, r,
                   f);
      dig[s] = it_digest(b->images + i * one, one, b->labels[i]);
      got++;
    }
    ferry_batch_release(c, b);
  }
  cr_assert_eq(got, N_RECORDS, "%s: %zu records, not %d", dir, got,
               N_RECORDS);
  ferry_client_free(c);
  n->window = hx_metric(metrics, "ferry_worker_jpeg_decodes_total"
                                 "{path=\"window\"}");
  n->fused = hx_metric(metrics, "ferry_worker_jpeg_decodes_total"
                                "{path=\"fused\"}");
  n->fallback = hx_metric(metrics, "ferry_worker_jpeg_decodes_total"
                                   "{path=\"window_fallback\"}");
  hx_stop(w, SIGTERM, 5000, NULL);
  hx_stop(d, SIGTERM, 5000, NULL);
  n->log = hx_slurp(w->log);
}

static void make_datasets(char *orig, char *opt, size_t cap) {
  char cmd[2400];
  snprintf(orig, cap, "%s/orig", hx_tmpdir());
  snprintf(opt, cap, "%s/opt", hx_tmpdir());
  snprintf(cmd, sizeof(cmd), "%s gen --out %s --records %d --shards %d "
           "--format jpeg --content photo --size 120x160 --seed 9 "
           ">/dev/null && %s records optimize %s %s >/dev/null",
           hx_ferryctl_bin(), orig, N_RECORDS, FILES, hx_ferryctl_bin(), orig,
           opt);
  sh(cmd);
}

static uint64_t dig_a[N_RECORDS], dig_b[N_RECORDS];

Test(jpeg_tiles, the_optimized_copy_gives_the_originals_pixels) {
  char orig[700], opt[700];
  counts_t a, b;
  make_datasets(orig, opt, sizeof(orig));
  run(orig, dig_a, &a);
  run(opt, dig_b, &b);
  for (size_t s = 0; s < N_RECORDS; s++)
    cr_assert_eq(dig_a[s], dig_b[s], "file %zu record %zu: the optimized "
                 "copy delivered other pixels", s / PER_FILE, s % PER_FILE);
  fprintf(stderr, "original: window %lld, fused %lld; optimized: window "
          "%lld, fused %lld, fallback %lld\n", a.window, a.fused, b.window,
          b.fused, b.fallback);
  cr_assert(a.window <= 0 && a.fused == N_RECORDS);
  cr_assert(b.window > N_RECORDS / 2 && b.window + b.fused == N_RECORDS &&
                b.fallback <= 0,
            "window %lld, fused %lld, fallback %lld", b.window, b.fused,
            b.fallback);
  free(a.log);
  free(b.log);
}

/* Renumbers the third restart marker of every JPEG value. */
static int damage(void *ctx, const char *key, size_t key_len, size_t index,
                  const uint8_t *v, size_t len, uint8_t **out,
                  size_t *out_len) {
  (void)ctx;
  (void)key;
  (void)key_len;
  (void)index;
  int seen = 0;
  if (len < 4 || v[0] != 0xFF || v[1] != 0xD8)
    return 0;
  uint8_t *copy = ferry__malloc(len);
  cr_assert_not_null(copy);
  memcpy(copy, v, len);
  for (size_t p = 2; p + 1 < len; p++)
    if (copy[p] == 0xFF && copy[p + 1] >= 0xD0 && copy[p + 1] <= 0xD7 &&
        ++seen == 3) {
      copy[p + 1] = (uint8_t)(0xD0 + (copy[p + 1] - 0xD0 + 3) % 8);
      break;
    }
  cr_assert_eq(seen, 3, "an optimized JPEG of %zu bytes without 3 markers",
               len);
  *out = copy; /* the rewriter's from now on */
  *out_len = len;
  return 0;
}

Test(jpeg_tiles, damaged_tiles_fall_back_and_are_reported) {
  char orig[700], opt[700], bad[760], in[900], out[900];
  counts_t n;
  make_datasets(orig, opt, sizeof(orig));
  snprintf(bad, sizeof(bad), "%s/damaged", hx_tmpdir());
  snprintf(in, sizeof(in), "mkdir -p %s", bad);
  sh(in);
  for (int f = 0; f < FILES; f++) {
    ferry_tfr_options_t o;
    ferry_tfr_reader_t *rd;
    ferry_tfr_writer_t *wr;
    ferry_record_t rec;
    ferry_error_t err = {0};
    snprintf(in, sizeof(in), "%s/train-%05d-of-%05d.tfrecord", opt, f, FILES);
    snprintf(out, sizeof(out), "%s/train-%05d-of-%05d.tfrecord", bad, f,
             FILES);
    ferry__tfr_options_init(&o);
    cr_assert_eq(ferry__tfr_reader_open(in, &o, &rd, &err), 0, "%s", err.msg);
    cr_assert_eq(ferry__tfr_writer_open(out, FERRY_COMPRESSION_NONE, &wr,
                                        &err),
                 0, "%s", err.msg);
    while (ferry__tfr_reader_next(rd, &rec, &err) == 0) {
      uint8_t *ex;
      size_t exl;
      cr_assert_eq(ferry__example_rewrite_bytes(rec.data, rec.len, damage,
                                                NULL, &ex, &exl, &err),
                   0, "%s", err.msg);
      cr_assert_eq(ferry__tfr_writer_write(wr, ex, exl, &err), 0);
      ferry__free(ex);
    }
    ferry__tfr_reader_free(rd);
    cr_assert_eq(ferry__tfr_writer_close(wr, &err), 0);
  }
  run(bad, dig_a, &n);
  fprintf(stderr, "damaged: window %lld, fused %lld, fallback %lld\n",
          n.window, n.fused, n.fallback);
  /* Crops that cover nearly the whole image never try the window (the
   * old path costs the same): those count as fused. */
  cr_assert(n.window <= 0 && n.fallback > N_RECORDS / 2 &&
                n.fallback + n.fused == N_RECORDS,
            "window %lld, fused %lld, fallback %lld: every damaged image "
            "that tries its window falls back",
            n.window, n.fused, n.fallback);
  const char *l = strstr(n.log, "restart-interval tiles cannot be used");
  cr_assert_not_null(l, "the worker logged no fallback: %s", n.log);
  cr_assert(strstr(n.log, "/damaged/train-") != NULL &&
                strstr(n.log, "at byte offset") != NULL &&
                strstr(n.log, "RST") != NULL,
            "the fallback's log line names no file, offset or marker: %s",
            n.log);
  free(n.log);
}
