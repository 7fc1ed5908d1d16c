/* Shared helpers of the client tests: Chunk messages built the way the
 * worker builds them (header with protobuf-c, payload field written by
 * hand) and a message source made of many separately allocated slices, as
 * gRPC hands them over, so reads across slice ends are checked by ASan.
 */
#ifndef FERRY_CLIENT_TEST_UTIL_H
#define FERRY_CLIENT_TEST_UTIL_H

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "alloc.h"
#include "client_internal.h"
#include "ferry/v1/worker.pb-c.h"
#include "varint.h"

/* The pixel byte `i` of the record at `pos` of `split`. */
static inline uint8_t tu_pixel(uint32_t epoch, uint32_t split, uint64_t pos,
                               size_t i) {
  return (uint8_t)(epoch * 101 + split * 31 + pos * 7 + i * 3 + 1);
}
static inline int64_t tu_label(uint32_t split, uint64_t pos) {
  return (int64_t)split * 1000 + (int64_t)pos;
}
static inline uint64_t tu_id(uint32_t split, uint64_t pos) {
  return (uint64_t)split << 40 | pos;
}

typedef struct tu_chunk_opts_s {
  uint32_t epoch, split;
  uint64_t first;
  uint32_t count;
  uint32_t h, w, c;
  bool last;
  int32_t error_code;
  const char *error;
  bool no_labels;
  bool payload_first; /* the payload field before the header fields */
  uint64_t lease;     /* 0: lease 3 */
} tu_chunk_opts_t;

/* Builds a Chunk message in a ferry__malloc'd buffer. */
static inline uint8_t *tu_chunk(const tu_chunk_opts_t *o, size_t *len) {
  Ferry__V1__Chunk m = FERRY__V1__CHUNK__INIT;
  size_t rec = (size_t)o->h * o->w * o->c, plen = rec * o->count;
  int64_t *labels = ferry__calloc(o->count + 1, sizeof(int64_t));
  int64_t *ids = ferry__calloc(o->count + 1, sizeof(int64_t));
  for (uint32_t r = 0; r < o->count; r++) {
    labels[r] = tu_label(o->split, o->first + r);
    ids[r] = (int64_t)tu_id(o->split, o->first + r);
  }
  m.job_id = 7;
  m.epoch = o->epoch;
  m.split = o->split;
  m.lease = o->lease ? o->lease : 3;
  m.first = o->first;
  m.count = o->count;
  m.height = o->h;
  m.width = o->w;
  m.channels = o->c;
  m.n_labels = o->no_labels ? 0 : o->count;
  m.labels = labels;
  m.n_ids = o->count;
  m.ids = ids;
  m.last = o->last;
  m.error_code = o->error_code;
  m.error = (char *)(o->error ? o->error : "");
  size_t hlen = ferry__v1__chunk__get_packed_size(&m);
  uint8_t *buf = ferry__malloc(hlen + 16 + plen);
  uint8_t pfx[16];
  size_t np = 0;
  pfx[np++] = FERRY_CHUNK_PAYLOAD << 3 | 2;
  np += ferry__varint_put(pfx + np, plen);
  size_t at = 0;
  if (o->error_code == 0 && o->payload_first) {
    memcpy(buf, pfx, np);
    at = np + plen;
    ferry__v1__chunk__pack(&m, buf + at);
    at += hlen;
  } else {
    ferry__v1__chunk__pack(&m, buf);
    at = hlen;
    if (o->error_code == 0) {
      memcpy(buf + at, pfx, np);
      at += np + plen;
    }
  }
  if (o->error_code == 0) {
    uint8_t *p = o->payload_first ? buf + np : buf + hlen + np;
    for (uint32_t r = 0; r < o->count; r++)
      for (size_t i = 0; i < rec; i++)
        p[r * rec + i] = tu_pixel(o->epoch, o->split, o->first + r, i);
  }
  ferry__free(labels);
  ferry__free(ids);
  *len = at;
  return buf;
}

/* A message cut into slices of `slice` bytes, each its own allocation. */
typedef struct tu_slices_s {
  uint8_t **s;
  size_t *lens;
  size_t n;
  size_t len;
} tu_slices_t;

static inline void tu_slices_init(tu_slices_t *t, const uint8_t *buf,
                                  size_t len, size_t slice) {
  t->n = (len + slice - 1) / slice;
  t->s = ferry__calloc(t->n + 1, sizeof(*t->s));
  t->lens = ferry__calloc(t->n + 1, sizeof(*t->lens));
  t->len = len;
  for (size_t i = 0; i < t->n; i++) {
    size_t take = len - i * slice < slice ? len - i * slice : slice;
    t->s[i] = ferry__malloc(take);
    memcpy(t->s[i], buf + i * slice, take);
    t->lens[i] = take;
  }
}

static inline void tu_slices_close(tu_slices_t *t) {
  for (size_t i = 0; i < t->n; i++)
    ferry__free(t->s[i]);
  ferry__free(t->s);
  ferry__free(t->lens);
}

static inline size_t tu_slices_copy(const ferry_chunk_src_t *src, size_t off,
                                    void *dst, size_t n) {
  const tu_slices_t *t = src->ctx;
  uint8_t *out = dst;
  size_t done = 0;
  for (size_t i = 0; i < t->n && done < n; i++) {
    if (off >= t->lens[i]) {
      off -= t->lens[i];
      continue;
    }
    size_t take = t->lens[i] - off < n - done ? t->lens[i] - off : n - done;
    memcpy(out + done, t->s[i] + off, take);
    done += take;
    off = 0;
  }
  return done;
}

static inline void tu_src(ferry_chunk_src_t *src, const tu_slices_t *t) {
  src->len = t->len;
  src->copy = tu_slices_copy;
  src->ctx = t;
}

/* Builds the chunk `o` describes, cuts it into slices of `slice` bytes,
 * parses it as the stream reader does and hands it to the client as if it
 * came on the stream of `worker`. Returns the parser's code if it refused
 * the message, else ferry__client_on_chunk's. */
static inline int tu_feed(ferry_client_t *c, const tu_chunk_opts_t *o,
                          uint64_t worker, size_t slice) {
  size_t len;
  uint8_t *buf = tu_chunk(o, &len);
  tu_slices_t t;
  ferry_chunk_src_t src;
  ferry_chunk_parser_t p;
  ferry_chunk_t ch;
  tu_slices_init(&t, buf, len, slice);
  tu_src(&src, &t);
  ferry__chunk_parser_init(&p);
  int rc = ferry__chunk_parse(&p, &src, &ch, NULL);
  if (rc == 0) {
    ch.worker_id = worker;
    rc = ferry__client_on_chunk(c, &ch, &src, NULL);
  }
  ferry__chunk_parser_close(&p);
  tu_slices_close(&t);
  ferry__free(buf);
  return rc;
}

/* Applies a heartbeat answer of `epoch` listing its `split` (`records`
 * records) on worker 1 at `lease`. */
static inline void tu_answer(ferry_client_t *c, uint32_t epoch,
                             uint32_t split, uint64_t records, uint64_t lease,
                             bool exhausted, uint32_t client_timeout_ms) {
  Ferry__V1__ClientHeartbeatResponse r =
      FERRY__V1__CLIENT_HEARTBEAT_RESPONSE__INIT;
  Ferry__V1__Assignment a = FERRY__V1__ASSIGNMENT__INIT, *pa = &a;
  a.epoch = epoch;
  a.split = split;
  a.num_records = records;
  a.worker_id = 1;
  a.lease = lease;
  r.epoch = epoch;
  r.epoch_exhausted = exhausted;
  r.n_assignments = 1;
  r.assignments = &pa;
  r.error = (char *)"";
  r.client_timeout_ms = client_timeout_ms;
  ferry__client_apply_heartbeat(c, &r);
}

/* The progress a heartbeat would send now for the client's one split
 * entry (a PENDING restart in it becomes SENT). */
static inline Ferry__V1__SplitProgress tu_progress1(ferry_client_t *c) {
  Ferry__V1__SplitProgress prog[1], *pp[1];
  pthread_mutex_lock(&c->mu);
  cr_assert_eq(c->n_splits, 1);
  cr_assert_eq(ferry__client_progress_locked(c, prog, pp), 1);
  cr_assert_eq(pp[0], &prog[0]);
  pthread_mutex_unlock(&c->mu);
  return prog[0];
}

#endif /* FERRY_CLIENT_TEST_UTIL_H */
