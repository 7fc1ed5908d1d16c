/* The per-record data path of a worker: parse the Example, take the image
 * and label features, decode, run the image ops in spec order. One
 * ferry_pipeline_t is shared (read-only) by many threads; each thread owns
 * a ferry_pipeline_ctx_t with its scratch buffers, so a steady-state
 * record allocates nothing. */
#ifndef FERRY_PIPELINE_H
#define FERRY_PIPELINE_H

#include <stddef.h>
#include <stdint.h>

#include "crop.h"
#include "ferry/error.h"
#include "imgops.h"
#include "spec.h"

typedef struct ferry_pipeline_s ferry_pipeline_t;
typedef struct ferry_pipeline_ctx_s ferry_pipeline_ctx_t;

/* Stage timings, accumulated by a ctx when timing is on (benchmarks). */
typedef enum {
  FERRY_STAGE_PARSE = 0,
  FERRY_STAGE_DECODE,
  FERRY_STAGE_OPS,    /* resize + dilate + blur */
  FERRY_STAGE_DILATE, /* part of OPS */
  FERRY_STAGE_BLUR,   /* part of OPS */
  FERRY_STAGE_COUNT
} ferry_stage_t;

/* Compiles a validated spec (copied: the caller keeps its spec). */
int ferry__pipeline_new(const ferry_spec_t *spec, ferry_pipeline_t **out,
                        ferry_error_t *err);
void ferry__pipeline_free(ferry_pipeline_t *p);

/* Output shape; FERRY_ESHAPE when it varies per record. */
int ferry__pipeline_shape(const ferry_pipeline_t *p, int *h, int *w, int *c);

int ferry__pipeline_ctx_new(const ferry_pipeline_t *p,
                            ferry_pipeline_ctx_t **out, ferry_error_t *err);
void ferry__pipeline_ctx_free(ferry_pipeline_ctx_t *ctx);
void ferry__pipeline_ctx_set_timing(ferry_pipeline_ctx_t *ctx, int on);
/* On: when no op changes a raw record's pixels (decode(raw) alone, or
 * identity resizes), ferry__pipeline_process hands out *pixels pointing
 * into the record it was given, valid as long as that record is, instead
 * of a copy in the ctx. A caller that copies the pixels before reading
 * the next record (the worker puts them straight into a chunk) saves a
 * copy per record. Off by default. */
void ferry__pipeline_ctx_set_borrow(ferry_pipeline_ctx_t *ctx, int on);

/* The key of the random ops (random_resized_crop) for the next records:
 * the job's seed, the epoch and the record's identity in the dataset
 * (the worker uses file_index << 40 | index in the file), so a split
 * leased again replays the same crops. Zeros until set. */
void ferry__pipeline_ctx_set_key(ferry_pipeline_ctx_t *ctx, uint64_t seed,
                                 uint64_t epoch, uint64_t record);

/* How the last record's JPEG was decoded (ferry__pipeline_process). */
typedef enum {
  FERRY_DECODE_NONE = 0,       /* no JPEG (raw), or the record failed */
  FERRY_DECODE_FULL = 1,       /* whole, at full scale */
  FERRY_DECODE_FUSED = 2,      /* fused: partial and/or DCT-scaled */
  FERRY_DECODE_PROGRESSIVE = 3, /* fused, but a progressive file: all its
                                   coefficients were decoded */
  FERRY_DECODE_WINDOW = 4,      /* fused, from the restart-interval tiles
                                   covering the crop (jpeg_restart.h) */
  FERRY_DECODE_WINDOW_FALLBACK = 5 /* tiles whose window could not be used
                                      (damaged markers): fused or full */
} ferry_decode_path_t;
ferry_decode_path_t
ferry__pipeline_ctx_last_decode(const ferry_pipeline_ctx_t *ctx);

/* Sets the limits of the ctx's JPEG decoder (imgops.h; a new ctx
 * has the decoder's defaults). */
void ferry__pipeline_ctx_set_jpeg_limits(ferry_pipeline_ctx_t *ctx,
                                         const ferry_jpeg_limits_t *l);

/* Frees the ctx's scratch buffers (decoded images, the decoder's) that
 * hold more than `keep` bytes; they grow again when needed. */
void ferry__pipeline_ctx_trim(ferry_pipeline_ctx_t *ctx, size_t keep);

/* Why the ctx's last window decode fell back (FERRY_DECODE_WINDOW_
 * FALLBACK): the byte offset in the JPEG and what was there. */
const char *ferry__pipeline_ctx_window_why(const ferry_pipeline_ctx_t *ctx);

/* The ctx's fused-decode counters (crop.h): how many JPEGs were
 * decoded partially or scaled, progressive ones, full decodes. */
void ferry__pipeline_ctx_jpeg_stats(const ferry_pipeline_ctx_t *ctx,
                                    ferry_jpeg_crop_stats_t *out);
void ferry__pipeline_ctx_times(const ferry_pipeline_ctx_t *ctx,
                               double seconds[FERRY_STAGE_COUNT]);

/* Runs one record. On success the image is at *pixels (h*w*c bytes owned
 * by the ctx, valid until its next call; or in `record`, see
 * ferry__pipeline_ctx_set_borrow) and the label in *label (0 when
 * the spec has none). Errors (missing feature, wrong type, bad image, too
 * small) name the feature or the op; callers prefix file and offset. */
int ferry__pipeline_process(ferry_pipeline_ctx_t *ctx, const uint8_t *record,
                            size_t len, const uint8_t **pixels, int *h, int *w,
                            int *c, int64_t *label, ferry_error_t *err);

/* Runs the ops from index `from` (of the spec's ops) on an image that
 * the first `from` ops already produced (a prefix cache entry), with the
 * ctx's random-op key (set_key). *pixels: in the ctx, or `in` itself
 * when no op from `from` changes it. The ops a JPEG decode fuses cannot
 * start here (FERRY_EINVAL): a cached prefix never ends inside a
 * fusion. */
int ferry__pipeline_process_from(ferry_pipeline_ctx_t *ctx, size_t from,
                                 const uint8_t *in, int h, int w, int c,
                                 const uint8_t **pixels, int *oh, int *ow,
                                 ferry_error_t *err);

#endif /* FERRY_PIPELINE_H */
