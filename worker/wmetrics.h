/* The worker's Prometheus metrics (docs/OPERATIONS.md, "Metrics"): the
 * families live in the process's registry (ferry__metrics_default); hot
 * paths update the children below, looked up once. */
#ifndef FERRY_WMETRICS_H
#define FERRY_WMETRICS_H

#include "metrics.h"
#include "pipeline.h"

/* Stages of the seconds-per-stage histogram: read, then the pipeline's. */
enum { FERRY_WSTAGE_READ = FERRY_STAGE_COUNT, FERRY_WSTAGE_N };

typedef struct ferry__wmetrics_s {
  ferry_metric_t *records;          /* ferry_worker_records_total */
  ferry_metric_t *produced;   /* ferry_worker_records_produced_total */
  ferry_metric_t *bytes;            /* ferry_worker_bytes_total */
  ferry_metric_t *chunks_sent;      /* ferry_worker_chunks_sent_total */
  ferry_metric_family_t *skipped;   /* ..._records_skipped_total{cause} */
  ferry_metric_t *stage[FERRY_WSTAGE_N]; /* ..._stage_seconds{stage} */
  ferry_metric_t *client_wait;      /* ..._client_wait_seconds_total (ms) */
  /* ..._jpeg_decodes_total{path}, indexed by ferry_decode_path_t (0
   * unused). */
  ferry_metric_t *jpeg[6]; /* by ferry_decode_path_t */
} ferry__wmetrics_t;

/* Every record in 2^FERRY_WSTAGE_SAMPLE_SHIFT is timed per stage. */
#define FERRY_WSTAGE_SAMPLE_SHIFT 4

/* The children, created on first use (thread-safe); never NULL itself,
 * though its members may be (out of memory; updates then do nothing). */
const ferry__wmetrics_t *ferry__wmetrics(void);

/* Counts `n` skipped records of one cause: an error code (its name in
 * lower case without the E: "jpeg", "nofeature"), or 0 for records the
 * TFRecord reader skipped ("framing": a bad length or CRC). */
void ferry__wmetrics_skipped(int code, uint64_t n);

struct ferry__worker_s;
/* Adds (removes) the collector of the scrape-time gauges of `w`: chunk
 * pool bytes in use and limit, tasks and streams open. */
int ferry__wmetrics_attach(struct ferry__worker_s *w);
void ferry__wmetrics_detach(struct ferry__worker_s *w);

#endif /* FERRY_WMETRICS_H */
