/* The worker's metrics (wmetrics.h). */
#include "wmetrics.h"

#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "worker.h"

static ferry__wmetrics_t wm;
static ferry_metric_family_t *f_pool_used, *f_pool_limit, *f_tasks,
    *f_streams;
/* The prefix cache (worker/cache.h), copied from its counters at scrape
 * time. */
static ferry_metric_family_t *f_cache_hits, *f_cache_misses,
    *f_cache_read_bytes, *f_cache_written_bytes, *f_cache_corrupt,
    *f_cache_full, *f_cache_held, *f_cache_limit, *f_cache_policy;
/* Shared production (worker/share.h). */
static ferry_metric_family_t *f_share_records, *f_share_bytes,
    *f_share_limit;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void init(void) {
  ferry_metrics_t *r = ferry__metrics_default();
  /* 10 us to 10 s, roughly x3 per bucket. */
  static const double stage_bounds[] = {1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3,
                                        1e-2, 3e-2, 0.1,  0.3,  1,    3,
                                        10};
  static const char *const stages[FERRY_WSTAGE_N] = {
      [FERRY_STAGE_PARSE] = "parse",   [FERRY_STAGE_DECODE] = "decode",
      [FERRY_STAGE_OPS] = "ops",       [FERRY_STAGE_DILATE] = "dilate",
      [FERRY_STAGE_BLUR] = "blur",     [FERRY_WSTAGE_READ] = "read"};
  wm.records = ferry__metric_get(ferry__metrics_family(
      r, FERRY_METRIC_COUNTER, "ferry_worker_records_total",
      "Records produced into chunks (all jobs).", NULL, 1, NULL, 0));
  wm.produced = ferry__metric_get(ferry__metrics_family(
      r, FERRY_METRIC_COUNTER, "ferry_worker_records_produced_total",
      "Records this worker produced: run through the pipeline, or read from "
      "the prefix cache (not those sent from the shared-production "
      "window).",
      NULL, 1, NULL, 0));
  wm.bytes = ferry__metric_get(ferry__metrics_family(
      r, FERRY_METRIC_COUNTER, "ferry_worker_bytes_total",
      "Bytes of record payload produced into chunks.", NULL, 1, NULL, 0));
  wm.chunks_sent = ferry__metric_get(ferry__metrics_family(
      r, FERRY_METRIC_COUNTER, "ferry_worker_chunks_sent_total",
      "Chunks gRPC took for sending to clients.", NULL, 1, NULL, 0));
  wm.skipped = ferry__metrics_family(
      r, FERRY_METRIC_COUNTER, "ferry_worker_records_skipped_total",
      "Bad records skipped under on_error=skip, by cause (the error's "
      "name).",
      "cause", 1, NULL, 0);
  ferry_metric_family_t *st = ferry__metrics_family(
      r, FERRY_METRIC_HISTOGRAM, "ferry_worker_stage_seconds",
      "Seconds one record spends in a pipeline stage (one record in 16 is "
      "timed; ops = resize + dilate + blur).",
      "stage", 1e-9, stage_bounds,
      sizeof(stage_bounds) / sizeof(stage_bounds[0]));
  for (int i = 0; i < FERRY_WSTAGE_N; i++)
    wm.stage[i] = ferry__metric_get1(st, stages[i]);
  wm.client_wait = ferry__metric_get(ferry__metrics_family(
      r, FERRY_METRIC_COUNTER, "ferry_worker_client_wait_seconds_total",
      "Seconds streams had chunks ready that their client did not take "
      "(summed over streams): time blocked on slow clients.",
      NULL, 1e-3, NULL, 0));
  ferry_metric_family_t *jd = ferry__metrics_family(
      r, FERRY_METRIC_COUNTER, "ferry_worker_jpeg_decodes_total",
      "JPEGs decoded, by path: full (whole, at full scale), fused (only "
      "the crop's rows and columns, at a reduced DCT scale where it "
      "keeps the output's resolution), progressive (fused, but a "
      "progressive file: all its coefficients decoded), window (fused, "
      "entropy-decoding only the restart-interval tiles that cover the "
      "crop: ferryctl records optimize), window_fallback (tiles whose "
      "window could not be used, damaged markers: decoded fused or full).",
      "path", 1, NULL, 0);
  wm.jpeg[FERRY_DECODE_FULL] = ferry__metric_get1(jd, "full");
  wm.jpeg[FERRY_DECODE_FUSED] = ferry__metric_get1(jd, "fused");
  wm.jpeg[FERRY_DECODE_PROGRESSIVE] = ferry__metric_get1(jd, "progressive");
  wm.jpeg[FERRY_DECODE_WINDOW] = ferry__metric_get1(jd, "window");
  wm.jpeg[FERRY_DECODE_WINDOW_FALLBACK] =
      ferry__metric_get1(jd, "window_fallback");
  f_pool_used = ferry__metrics_family(
      r, FERRY_METRIC_GAUGE, "ferry_worker_chunk_pool_bytes",
      "Bytes of chunk buffers handed out (queued or being sent).", NULL, 1,
      NULL, 0);
  f_pool_limit = ferry__metrics_family(
      r, FERRY_METRIC_GAUGE, "ferry_worker_chunk_pool_limit_bytes",
      "The chunk pool's bound (--buffer-bytes).", NULL, 1, NULL, 0);
  f_tasks = ferry__metrics_family(
      r, FERRY_METRIC_GAUGE, "ferry_worker_tasks_open",
      "Tasks (leased splits) the worker holds.", NULL, 1, NULL, 0);
  f_cache_hits = ferry__metrics_family(
      r, FERRY_METRIC_COUNTER, "ferry_worker_cache_hits_total",
      "Records served from the prefix cache (--cache-dir).", NULL, 1, NULL,
      0);
  f_cache_misses = ferry__metrics_family(
      r, FERRY_METRIC_COUNTER, "ferry_worker_cache_misses_total",
      "Records whose pipeline has a deterministic prefix, recomputed.", NULL,
      1, NULL, 0);
  f_cache_read_bytes = ferry__metrics_family(
      r, FERRY_METRIC_COUNTER, "ferry_worker_cache_read_bytes_total",
      "Pixel bytes read from prefix cache entries.", NULL, 1, NULL, 0);
  f_cache_written_bytes = ferry__metrics_family(
      r, FERRY_METRIC_COUNTER, "ferry_worker_cache_written_bytes_total",
      "Bytes of prefix cache entries committed.", NULL, 1, NULL, 0);
  f_cache_corrupt = ferry__metrics_family(
      r, FERRY_METRIC_COUNTER, "ferry_worker_cache_corrupt_total",
      "Prefix cache entries found damaged (cut short, bad checksum): "
      "removed and recomputed.",
      NULL, 1, NULL, 0);
  f_cache_full = ferry__metrics_family(
      r, FERRY_METRIC_COUNTER, "ferry_worker_cache_full_total",
      "Entries not written because --cache-bytes was reached.", NULL, 1,
      NULL, 0);
  f_cache_held = ferry__metrics_family(
      r, FERRY_METRIC_GAUGE, "ferry_worker_cache_bytes",
      "Bytes of prefix cache entries in --cache-dir.", NULL, 1, NULL, 0);
  f_cache_limit = ferry__metrics_family(
      r, FERRY_METRIC_GAUGE, "ferry_worker_cache_limit_bytes",
      "The prefix cache's bound (--cache-bytes).", NULL, 1, NULL, 0);
  f_cache_policy = ferry__metrics_family(
      r, FERRY_METRIC_GAUGE, "ferry_worker_cache_policy",
      "1 for each dataset's current choice of the prefix cache's policy "
      "(cache, recompute, measuring, no_prefix).",
      "dataset,choice", 1, NULL, 0);
  f_share_records = ferry__metrics_family(
      r, FERRY_METRIC_COUNTER, "ferry_worker_share_records_total",
      "Shared production: records producers kept in the window (stored), "
      "records sent from it to other jobs (served), and tasks that "
      "produced the rest of a split themselves, the window having no room "
      "for it (own, in tasks).",
      "what", 1, NULL, 0);
  f_share_bytes = ferry__metrics_family(
      r, FERRY_METRIC_GAUGE, "ferry_worker_share_bytes",
      "Bytes the shared-production window holds.", NULL, 1, NULL, 0);
  f_share_limit = ferry__metrics_family(
      r, FERRY_METRIC_GAUGE, "ferry_worker_share_limit_bytes",
      "The shared-production window's bound (--share-bytes).", NULL, 1, NULL,
      0);
  f_streams = ferry__metrics_family(
      r, FERRY_METRIC_GAUGE, "ferry_worker_streams_open",
      "Streams (job, client) with live tasks or chunks out.", NULL, 1, NULL, 0);
}

const ferry__wmetrics_t *ferry__wmetrics(void) {
  pthread_once(&once, init);
  return &wm;
}

void ferry__wmetrics_skipped(int code, uint64_t n) {
  char cause[48];
  const char *name = ferry_err_name(code);
  size_t j = 0;
  ferry__wmetrics();
  if (code == 0)
    name = "framing"; /* the reader's: a bad length or CRC */
  if (name == NULL)
    name = "unknown";
  if (strncmp(name, "FERRY_", 6) == 0)
    name += 6;
  if (name[0] == 'E' && name[1] != '\0')
    name++;
  for (; *name != '\0' && j + 1 < sizeof(cause); name++)
    cause[j++] = (char)tolower((unsigned char)*name);
  cause[j] = '\0';
  ferry__metric_add(ferry__metric_get1(wm.skipped, cause), (int64_t)n);
}

static void collect(void *arg) {
  ferry__worker_t *w = arg;
  uint64_t used, cap;
  int64_t streams = 0, tasks = 0;
  pthread_mutex_lock(&w->pool.lock);
  used = w->pool.used;
  cap = w->pool.cap;
  for (ferry__wkey_t *k = w->pool.keys; k != NULL; k = k->next)
    if (k->tasks > 0 || k->used > 0)
      streams++;
  pthread_mutex_unlock(&w->pool.lock);
  pthread_mutex_lock(&w->tasks.lock);
  for (ferry__wtask_t *k = w->tasks.list; k != NULL; k = k->next)
    tasks++;
  pthread_mutex_unlock(&w->tasks.lock);
  ferry__metric_set(ferry__metric_get(f_pool_used), (int64_t)used);
  ferry__metric_set(ferry__metric_get(f_pool_limit), (int64_t)cap);
  ferry__metric_set(ferry__metric_get(f_tasks), tasks);
  ferry__metric_set(ferry__metric_get(f_streams), streams);
  if (w->share_on) {
    ferry__wshare_t *s = &w->share;
    ferry__metric_set(ferry__metric_get1(f_share_records, "stored"),
                      (int64_t)atomic_load(&s->stored));
    ferry__metric_set(ferry__metric_get1(f_share_records, "served"),
                      (int64_t)atomic_load(&s->served));
    ferry__metric_set(ferry__metric_get1(f_share_records, "own"),
                      (int64_t)atomic_load(&s->own));
    pthread_mutex_lock(&s->mu);
    int64_t held = (int64_t)s->used;
    pthread_mutex_unlock(&s->mu);
    ferry__metric_set(ferry__metric_get(f_share_bytes), held);
    ferry__metric_set(ferry__metric_get(f_share_limit), (int64_t)s->cap);
  }
  if (!w->cache_on)
    return;
  ferry__wcache_t *c = &w->cache;
  ferry__metric_set(ferry__metric_get(f_cache_hits),
                    (int64_t)atomic_load(&c->hits));
  ferry__metric_set(ferry__metric_get(f_cache_misses),
                    (int64_t)atomic_load(&c->misses));
  ferry__metric_set(ferry__metric_get(f_cache_read_bytes),
                    (int64_t)atomic_load(&c->read_bytes));
  ferry__metric_set(ferry__metric_get(f_cache_written_bytes),
                    (int64_t)atomic_load(&c->written_bytes));
  ferry__metric_set(ferry__metric_get(f_cache_corrupt),
                    (int64_t)atomic_load(&c->corrupt));
  ferry__metric_set(ferry__metric_get(f_cache_full),
                    (int64_t)atomic_load(&c->full));
  ferry__metric_set(ferry__metric_get(f_cache_held),
                    (int64_t)atomic_load(&c->held));
  ferry__metric_set(ferry__metric_get(f_cache_limit), (int64_t)c->budget);
  static const ferry__wc_choice_t choices[] = {
      FERRY__WC_NO_PREFIX, FERRY__WC_MEASURING, FERRY__WC_CACHE,
      FERRY__WC_RECOMPUTE};
  pthread_mutex_lock(&w->tasks.lock);
  for (ferry__wpipe_t *p = w->tasks.pipes; p != NULL; p = p->next) {
    if (p->pol == NULL)
      continue;
    char ds[17];
    snprintf(ds, sizeof(ds), "%016llx", (unsigned long long)p->pol->dataset_fp);
    pthread_mutex_lock(&p->pol->mu);
    ferry__wc_choice_t now = p->pol->choice;
    pthread_mutex_unlock(&p->pol->mu);
    for (size_t i = 0; i < sizeof(choices) / sizeof(choices[0]); i++) {
      const char *labels[2] = {ds, ferry__wc_choice_name(choices[i])};
      ferry__metric_set(ferry__metric_child(f_cache_policy, labels),
                        choices[i] == now);
    }
  }
  pthread_mutex_unlock(&w->tasks.lock);
}

int ferry__wmetrics_attach(struct ferry__worker_s *w) {
  ferry__wmetrics();
  return ferry__metrics_add_collector(ferry__metrics_default(), collect, w);
}

void ferry__wmetrics_detach(struct ferry__worker_s *w) {
  ferry__metrics_remove_collector(ferry__metrics_default(), collect, w);
}
