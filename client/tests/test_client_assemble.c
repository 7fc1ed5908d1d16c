/* The batch assembler without daemons: chunks go in through
 * ferry__client_on_chunk, heartbeat answers through
 * ferry__client_apply_heartbeat, batches come out of ferry_next. Checks
 * exact record placement, exactly-once dedupe, epoch ends and partial
 * batches, delivered accounting, failures, and concurrent readers.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#include "client_test_util.h"

#define H 2
#define W 3
#define C 1
#define REC (H * W * C)

static ferry_client_t *local(uint32_t batch, uint32_t prefetch, bool drop) {
  ferry__asm_params_t ap = {.batch_size = batch, .height = H, .width = W,
                            .channels = C, .prefetch = prefetch,
                            .drop_remainder = drop};
  ferry_client_t *c;
  ferry_error_t err = {0};
  cr_assert_eq(ferry__client_new_local(&ap, &c, &err), 0, "%s", err.msg);
  return c;
}

/* Feeds one chunk of (epoch, split) positions [first, first + count), as
 * if it came on the stream of `worker`. */
static int feed_w(ferry_client_t *c, uint64_t worker, uint32_t epoch,
                  uint32_t split, uint64_t first, uint32_t count, bool last) {
  tu_chunk_opts_t o = {.epoch = epoch, .split = split, .first = first,
                       .count = count, .h = H, .w = W, .c = C, .last = last};
  return tu_feed(c, &o, worker, 5);
}

static int feed(ferry_client_t *c, uint32_t epoch, uint32_t split,
                uint64_t first, uint32_t count, bool last) {
  return feed_w(c, 1, epoch, split, first, count, last);
}

/* A heartbeat answer: `n` assignments of `epoch` with their totals and
 * workers (NULL: worker 1 for all). */
static void beat_w(ferry_client_t *c, int state, uint32_t epoch,
                   bool exhausted, uint32_t epochs_done,
                   const uint32_t *splits, const uint64_t *totals,
                   const uint64_t *workers, size_t n) {
  Ferry__V1__ClientHeartbeatResponse r =
      FERRY__V1__CLIENT_HEARTBEAT_RESPONSE__INIT;
  Ferry__V1__Assignment a[8], *pa[8];
  cr_assert_leq(n, 8);
  for (size_t i = 0; i < n; i++) {
    ferry__v1__assignment__init(&a[i]);
    a[i].epoch = epoch;
    a[i].split = splits[i];
    a[i].num_records = totals[i];
    a[i].worker_id = workers != NULL ? workers[i] : 1;
    pa[i] = &a[i];
  }
  r.state = state;
  r.epoch = epoch;
  r.epoch_exhausted = exhausted;
  r.epochs_done = epochs_done;
  r.n_assignments = n;
  r.assignments = pa;
  r.error = (char *)"";
  ferry__client_apply_heartbeat(c, &r);
}

static void beat(ferry_client_t *c, int state, uint32_t epoch,
                 bool exhausted, uint32_t epochs_done, const uint32_t *splits,
                 const uint64_t *totals, size_t n) {
  beat_w(c, state, epoch, exhausted, epochs_done, splits, totals, NULL, n);
}

/* Takes the next batch (there must be one) and checks every record is the
 * one its id names, with the right pixels and label. */
static const ferry_batch_t *take(ferry_client_t *c, uint32_t size,
                                 uint32_t epoch) {
  const ferry_batch_t *b;
  ferry_error_t err = {0};
  int rc = ferry_next(c, &b, 0, &err);
  cr_assert_eq(rc, 0, "ferry_next: %d %s", rc, err.msg);
  cr_assert_eq(b->size, size);
  cr_assert_eq(b->epoch, epoch);
  cr_assert_eq(b->height, H);
  cr_assert_eq(b->width, W);
  cr_assert_eq(b->channels, C);
  for (uint32_t r = 0; r < b->size; r++) {
    uint32_t split = (uint32_t)(b->ids[r] >> 40);
    uint64_t pos = b->ids[r] & ((1ull << 40) - 1);
    cr_assert_eq(b->labels[r], tu_label(split, pos));
    for (size_t i = 0; i < REC; i++)
      cr_assert_eq(b->images[r * REC + i], tu_pixel(epoch, split, pos, i),
                   "record %u byte %zu", r, i);
  }
  return b;
}

static int next_rc(ferry_client_t *c) {
  const ferry_batch_t *b;
  return ferry_next(c, &b, 0, NULL);
}

Test(client_assemble, records_land_in_order_across_chunks) {
  ferry_client_t *c = local(4, 4, false);
  beat(c, 0, 0, false, 0, (uint32_t[]){0}, (uint64_t[]){0}, 1);
  cr_assert_eq(feed(c, 0, 0, 0, 3, false), 0);
  cr_assert_eq(next_rc(c), FERRY_ETIMEDOUT); /* 3 of 4 */
  cr_assert_eq(feed(c, 0, 0, 3, 6, false), 0);
  const ferry_batch_t *b1 = take(c, 4, 0);
  const ferry_batch_t *b2 = take(c, 4, 0);
  for (uint32_t r = 0; r < 4; r++) {
    cr_assert_eq(b1->ids[r], tu_id(0, r));
    cr_assert_eq(b2->ids[r], tu_id(0, 4 + r));
  }
  cr_assert_eq(b1->index, 0);
  cr_assert_eq(b2->index, 1);
  cr_assert_eq(next_rc(c), FERRY_ETIMEDOUT); /* position 8 waits */
  /* Handed out records count as delivered; the waiting one does not. */
  cr_assert_eq(ferry__client_split(c, 0, 0)->delivered, 8);
  cr_assert_eq(ferry__client_split(c, 0, 0)->received, 9);
  ferry_batch_release(c, b1);
  ferry_batch_release(c, b2);
  ferry_client_stats_t st;
  ferry_client_stats(c, &st);
  cr_assert_eq(st.batches, 2);
  cr_assert_eq(st.records, 8);
  cr_assert_eq(st.bytes, 8 * REC);
  ferry_client_free(c);
}

Test(client_assemble, overlapping_repeated_and_stale_chunks_once) {
  ferry_client_t *c = local(5, 4, false);
  beat(c, 0, 0, true, 0, (uint32_t[]){6}, (uint64_t[]){0}, 1);
  cr_assert_eq(feed(c, 0, 6, 0, 6, false), 0);  /* 0..5 */
  cr_assert_eq(feed(c, 0, 6, 3, 6, false), 0);  /* 3..8: 6..8 new */
  cr_assert_eq(feed(c, 0, 6, 0, 6, false), 0);  /* repeated: dropped */
  cr_assert_eq(feed(c, 0, 6, 2, 2, false), 0);  /* stale: dropped */
  cr_assert_eq(feed(c, 0, 6, 12, 2, false), 0); /* gap: dropped */
  cr_assert_eq(ferry__client_split(c, 0, 6)->received, 9);
  cr_assert_eq(feed(c, 0, 6, 9, 1, true), 0);   /* 9, last: total 10 */
  const ferry_batch_t *b1 = take(c, 5, 0), *b2 = take(c, 5, 0);
  for (uint32_t r = 0; r < 5; r++) {
    cr_assert_eq(b1->ids[r], tu_id(6, r));
    cr_assert_eq(b2->ids[r], tu_id(6, 5 + r));
  }
  cr_assert_eq(next_rc(c), FERRY_ETIMEDOUT);
  ferry__split_t *s = ferry__client_split(c, 0, 6);
  cr_assert(s->has_total);
  cr_assert_eq(s->total, 10);
  cr_assert_eq(s->delivered, 10);
  cr_assert_eq(ferry__client_held_locked(c), 0);
  /* A re-leased worker replaying the whole split changes nothing. */
  cr_assert_eq(feed(c, 0, 6, 0, 10, true), 0);
  cr_assert_eq(next_rc(c), FERRY_ETIMEDOUT);
  ferry_batch_release(c, b1);
  ferry_batch_release(c, b2);
  ferry_client_free(c);
}

Test(client_assemble, epoch_flush_partial_batch_then_epoch_end_then_end) {
  ferry_client_t *c = local(4, 4, false);
  beat(c, 0, 0, false, 0, (uint32_t[]){0, 1}, (uint64_t[]){10, 3}, 2);
  cr_assert_eq(feed(c, 0, 0, 0, 10, true), 0);
  cr_assert_eq(feed(c, 0, 1, 0, 3, true), 0);
  const ferry_batch_t *b[4];
  b[0] = take(c, 4, 0);
  b[1] = take(c, 4, 0);
  b[2] = take(c, 4, 0);
  /* Records 12 of 13 are in; the 13th waits for the epoch to run dry. */
  cr_assert_eq(next_rc(c), FERRY_ETIMEDOUT);
  beat(c, 0, 0, true, 0, (uint32_t[]){0, 1}, (uint64_t[]){10, 3}, 2);
  b[3] = take(c, 1, 0);
  cr_assert_eq(b[3]->ids[0], tu_id(1, 2));
  cr_assert_eq(ferry__client_split(c, 0, 0)->delivered, 10);
  cr_assert_eq(ferry__client_split(c, 0, 1)->delivered, 3);
  cr_assert(c->hb_kick); /* finished splits ask for a heartbeat */
  for (int i = 0; i < 4; i++)
    ferry_batch_release(c, b[i]);
  /* Not the end of the epoch until the dispatcher counts it done. */
  cr_assert_eq(next_rc(c), FERRY_ETIMEDOUT);
  beat(c, 0, 1, false, 1, NULL, NULL, 0);
  cr_assert_eq(next_rc(c), FERRY_EPOCH_END);
  cr_assert_eq(next_rc(c), FERRY_ETIMEDOUT);
  /* Epoch 1: records of epoch 1 never share a batch with epoch 0's. */
  beat(c, 0, 1, true, 1, (uint32_t[]){0}, (uint64_t[]){2}, 1);
  cr_assert_eq(feed(c, 1, 0, 0, 2, true), 0);
  const ferry_batch_t *e1 = take(c, 2, 1);
  cr_assert_eq(e1->ids[1], tu_id(0, 1));
  ferry_batch_release(c, e1);
  beat(c, 1 /* FINISHED */, 2, true, 2, NULL, NULL, 0);
  cr_assert_eq(next_rc(c), FERRY_EPOCH_END);
  cr_assert_eq(next_rc(c), FERRY_END);
  cr_assert_eq(next_rc(c), FERRY_END);
  /* Finished epochs' entries are gone from the split table. */
  cr_assert_eq(c->n_splits, 0);
  ferry_client_free(c);
}

/* Policy skip over a file whose last record is truncated: the scan makes
 * the cut record's tail a split of unknown count, the worker skips it and
 * reports a total of 0, and the dispatcher counts that row done at once
 * and stops listing it, maybe before its empty last chunk reaches the
 * client (which then drops it, as it is no longer listed). The split the
 * dispatcher no longer lists is done: the partial batch must flush and
 * the epoch end. Before the fix the trainer waited for ever. */
Test(client_assemble, a_split_done_at_the_dispatcher_no_longer_holds_the_flush) {
  ferry_client_t *c = local(4, 4, false);
  /* Split 0: 6 good records; split 1: a truncated file's tail (count
   * unknown); split 2: 4 records by the scan, the last one skipped, whose
   * empty last chunk was lost. */
  beat(c, 0, 0, false, 0, (uint32_t[]){0, 1, 2}, (uint64_t[]){6, 0, 4}, 3);
  cr_assert_eq(feed(c, 0, 2, 0, 3, false), 0);
  cr_assert_eq(feed(c, 0, 0, 0, 6, true), 0);
  ferry_batch_release(c, take(c, 4, 0));
  ferry_batch_release(c, take(c, 4, 0));
  cr_assert_eq(next_rc(c), FERRY_ETIMEDOUT);
  /* Split 1 is done at the dispatcher on the worker's total of 0, split
   * 2 on its total of 3, delivered: only split 0 is listed, and no row
   * is left to assign. The last record must come now. */
  beat(c, 0, 0, true, 0, (uint32_t[]){0}, (uint64_t[]){6}, 1);
  const ferry_batch_t *b = take(c, 1, 0);
  cr_assert_eq(b->ids[0], tu_id(0, 5));
  ferry_batch_release(c, b);
  /* The tail's empty last chunk, late, changes nothing. */
  cr_assert_eq(feed(c, 0, 1, 0, 0, true), 0);
  cr_assert_eq(next_rc(c), FERRY_ETIMEDOUT);
  cr_assert_eq(ferry__client_split(c, 0, 0)->delivered, 6);
  cr_assert_eq(ferry__client_split(c, 0, 2)->delivered, 3);
  beat(c, 1 /* FINISHED */, 1, true, 1, NULL, NULL, 0);
  cr_assert_eq(next_rc(c), FERRY_EPOCH_END);
  cr_assert_eq(next_rc(c), FERRY_END);
  ferry_client_free(c);
}

/* A chunk-created entry the dispatcher never listed is not taken for a
 * done one: in local mode chunks come before any answer. */
Test(client_assemble, a_split_never_listed_still_holds_the_flush) {
  ferry_client_t *c = local(8, 4, false);
  cr_assert_eq(feed(c, 0, 3, 0, 2, false), 0);
  beat(c, 0, 0, true, 0, (uint32_t[]){0}, (uint64_t[]){1}, 1);
  cr_assert_eq(feed(c, 0, 0, 0, 1, true), 0);
  beat(c, 0, 0, true, 0, (uint32_t[]){0}, (uint64_t[]){1}, 1);
  cr_assert_eq(next_rc(c), FERRY_ETIMEDOUT);
  cr_assert_eq(feed(c, 0, 3, 2, 1, true), 0);
  ferry_batch_release(c, take(c, 4, 0));
  ferry_client_free(c);
}

Test(client_assemble, drop_remainder_still_counts_delivered) {
  ferry_client_t *c = local(4, 4, true);
  beat(c, 0, 0, true, 0, (uint32_t[]){3}, (uint64_t[]){6}, 1);
  cr_assert_eq(feed(c, 0, 3, 0, 6, true), 0);
  const ferry_batch_t *b = take(c, 4, 0);
  cr_assert_eq(next_rc(c), FERRY_ETIMEDOUT); /* the 2 left are dropped */
  cr_assert_eq(ferry__client_split(c, 0, 3)->delivered, 6);
  ferry_client_stats_t st;
  ferry_client_stats(c, &st);
  cr_assert_eq(st.records, 4);
  ferry_batch_release(c, b);
  ferry_client_free(c);
}

Test(client_assemble, batches_never_straddle_epochs) {
  ferry_client_t *c = local(4, 4, false);
  beat(c, 0, 0, false, 0, (uint32_t[]){0}, (uint64_t[]){0}, 1);
  cr_assert_eq(feed(c, 0, 0, 0, 2, true), 0);
  /* A chunk of epoch 1 closes epoch 0's partial batch. */
  cr_assert_eq(feed(c, 1, 0, 0, 4, true), 0);
  const ferry_batch_t *b0 = take(c, 2, 0);
  cr_assert_eq(next_rc(c), FERRY_EPOCH_END);
  const ferry_batch_t *b1 = take(c, 4, 1);
  ferry_batch_release(c, b0);
  ferry_batch_release(c, b1);
  ferry_client_free(c);
}

Test(client_assemble, joining_late_starts_at_the_dispatchers_epoch) {
  ferry_client_t *c = local(2, 2, false);
  beat(c, 0, 5, false, 5, (uint32_t[]){1}, (uint64_t[]){2}, 1);
  cr_assert_eq(next_rc(c), FERRY_ETIMEDOUT); /* no EPOCH_END for 0..4 */
  cr_assert_eq(feed(c, 5, 1, 0, 2, true), 0);
  ferry_batch_release(c, take(c, 2, 5));
  ferry_client_free(c);
}

Test(client_assemble, chunk_error_fails_the_client_with_its_text) {
  ferry_client_t *c = local(4, 4, false);
  ferry_chunk_t ch = {.split = 2, .error_code = FERRY_EDATACRC,
                     .error = "/d/train-1.tfrecord: record 3 at byte offset "
                              "4242: record data CRC mismatch"};
  cr_assert_eq(ferry__client_on_chunk(c, &ch, NULL, NULL), FERRY_EDATACRC);
  const ferry_batch_t *b;
  ferry_error_t err = {0};
  cr_assert_eq(ferry_next(c, &b, 1000, &err), FERRY_EDATACRC);
  cr_assert_not_null(strstr(err.msg, "byte offset 4242"));
  cr_assert_eq(ferry_next(c, &b, 0, &err), FERRY_EDATACRC);
  ferry_client_free(c);
}

Test(client_assemble, job_failed_and_wrong_shape) {
  ferry_client_t *c = local(4, 4, false);
  Ferry__V1__ClientHeartbeatResponse r =
      FERRY__V1__CLIENT_HEARTBEAT_RESPONSE__INIT;
  r.state = FERRY__V1__JOB_STATE__JOB_STATE_FAILED;
  r.error_code = FERRY_ETRUNCDATA;
  r.error = (char *)"a.tfrecord: byte offset 77: truncated record data";
  ferry__client_apply_heartbeat(c, &r);
  ferry_error_t err = {0};
  const ferry_batch_t *b;
  cr_assert_eq(ferry_next(c, &b, -1, &err), FERRY_ETRUNCDATA);
  cr_assert_not_null(strstr(err.msg, "byte offset 77"));
  ferry_client_free(c);

  c = local(4, 4, false);
  tu_chunk_opts_t o = {.split = 1, .count = 2, .h = 3, .w = 3, .c = 1};
  size_t len;
  uint8_t *buf = tu_chunk(&o, &len);
  tu_slices_t t;
  ferry_chunk_src_t src;
  ferry_chunk_parser_t p;
  ferry_chunk_t ch;
  tu_slices_init(&t, buf, len, 64);
  tu_src(&src, &t);
  ferry__chunk_parser_init(&p);
  cr_assert_eq(ferry__chunk_parse(&p, &src, &ch, NULL), 0);
  cr_assert_eq(ferry__client_on_chunk(c, &ch, &src, NULL), FERRY_ESHAPE);
  cr_assert_eq(ferry_next(c, &b, 0, &err), FERRY_ESHAPE);
  ferry__chunk_parser_close(&p);
  tu_slices_close(&t);
  ferry__free(buf);
  ferry_client_free(c);
}

Test(client_assemble, holding_every_slot_is_an_error_not_a_hang) {
  ferry_client_t *c = local(1, 2, false);
  beat(c, 0, 0, false, 0, (uint32_t[]){0}, (uint64_t[]){0}, 1);
  cr_assert_eq(feed(c, 0, 0, 0, 2, false), 0);
  const ferry_batch_t *a = take(c, 1, 0), *b = take(c, 1, 0), *x;
  ferry_error_t err = {0};
  cr_assert_eq(ferry_next(c, &x, -1, &err), FERRY_EINVAL);
  ferry_batch_release(c, b); /* out of order is fine */
  ferry_batch_release(c, a);
  cr_assert_eq(feed(c, 0, 0, 2, 1, false), 0);
  ferry_batch_release(c, take(c, 1, 0));
  ferry_client_free(c);
}

Test(client_assemble, no_leaks_and_no_allocation_per_batch) {
  ferry_alloc_stats_t s0, s1, s2;
  ferry__alloc_stats(&s0);
  ferry_client_t *c = local(4, 3, false);
  beat(c, 0, 0, false, 0, (uint32_t[]){0}, (uint64_t[]){0}, 1);
  cr_assert_eq(feed(c, 0, 0, 0, 4, false), 0);
  ferry_batch_release(c, take(c, 4, 0));
  /* Feeding allocates only the test's own message; the client nothing. */
  ferry__alloc_stats(&s1);
  for (uint64_t i = 1; i < 50; i++) {
    cr_assert_eq(feed(c, 0, 0, i * 4, 4, false), 0);
    ferry_batch_release(c, take(c, 4, 0));
  }
  ferry__alloc_stats(&s2);
  cr_assert_eq(s1.blocks, s2.blocks);
  cr_assert_eq(s1.bytes, s2.bytes);
  ferry_client_free(c);
  ferry__alloc_stats(&s1);
  cr_assert_eq(s0.blocks, s1.blocks);
  cr_assert_eq(s0.bytes, s1.bytes);
}

/* ---- Concurrency: readers and a trainer -------------------------------- */

#define NSPLITS 4
#define PER_SPLIT 997
#define PER_CHUNK 13

typedef struct reader_arg_s {
  ferry_client_t *c;
  uint32_t split;
} reader_arg_t;

static void *reader(void *arg) {
  reader_arg_t *a = arg;
  /* Chunks of 13 records, every third one sent twice (a duplicate from a
   * re-lease), the split's last one marked. */
  for (uint64_t first = 0; first < PER_SPLIT; first += PER_CHUNK) {
    uint32_t n = first + PER_CHUNK > PER_SPLIT
                     ? (uint32_t)(PER_SPLIT - first) : PER_CHUNK;
    bool last = first + n == PER_SPLIT;
    if (feed(a->c, 0, a->split, first, n, last) != 0)
      break;
    if ((first / PER_CHUNK) % 3 == 0)
      feed(a->c, 0, a->split, first, n, last);
  }
  return NULL;
}

Test(client_assemble, concurrent_readers_exactly_once_with_backpressure) {
  ferry_client_t *c = local(64, 2, false);
  uint32_t splits[NSPLITS];
  uint64_t totals[NSPLITS];
  for (uint32_t i = 0; i < NSPLITS; i++) {
    splits[i] = i;
    totals[i] = PER_SPLIT;
  }
  beat(c, 0, 0, true, 0, splits, totals, NSPLITS);
  pthread_t th[NSPLITS];
  reader_arg_t args[NSPLITS];
  for (uint32_t i = 0; i < NSPLITS; i++) {
    args[i] = (reader_arg_t){c, i};
    pthread_create(&th[i], NULL, reader, &args[i]);
  }
  static uint8_t seen[NSPLITS][PER_SPLIT];
  memset(seen, 0, sizeof(seen));
  uint64_t got = 0;
  uint32_t partial = 0;
  while (got < NSPLITS * PER_SPLIT) {
    const ferry_batch_t *b;
    ferry_error_t err = {0};
    int rc = ferry_next(c, &b, 10000, &err);
    cr_assert_eq(rc, 0, "after %llu records: %s", (unsigned long long)got,
                 err.msg);
    if (b->size != 64)
      partial++;
    for (uint32_t r = 0; r < b->size; r++) {
      uint32_t split = (uint32_t)(b->ids[r] >> 40);
      uint64_t pos = b->ids[r] & ((1ull << 40) - 1);
      cr_assert_lt(split, NSPLITS);
      cr_assert_lt(pos, PER_SPLIT);
      cr_assert_eq(seen[split][pos], 0, "split %u pos %llu twice", split,
                   (unsigned long long)pos);
      seen[split][pos] = 1;
      cr_assert_eq(b->labels[r], tu_label(split, pos));
      cr_assert_eq(b->images[r * REC + REC - 1],
                   tu_pixel(0, split, pos, REC - 1));
    }
    got += b->size;
    ferry_batch_release(c, b);
  }
  for (uint32_t i = 0; i < NSPLITS; i++)
    pthread_join(th[i], NULL);
  cr_assert_eq(got, NSPLITS * PER_SPLIT);
  cr_assert_eq(partial, 1); /* only the epoch's flushed remainder */
  for (uint32_t i = 0; i < NSPLITS; i++)
    cr_assert_eq(ferry__client_split(c, 0, i)->delivered, PER_SPLIT);
  ferry_client_free(c);
}

Test(client_assemble, a_stopped_reader_takes_nothing) {
  ferry_client_t *c = local(2, 1, false);
  beat(c, 0, 0, false, 0, (uint32_t[]){0}, (uint64_t[]){0}, 1);
  cr_assert_eq(feed(c, 0, 0, 0, 2, false), 0); /* the only slot is full */
  bool stop = false;
  /* A reader whose stop flag is already set gives up instead of waiting. */
  tu_chunk_opts_t o = {.split = 0, .first = 2, .count = 2, .h = H, .w = W,
                       .c = C};
  size_t len;
  uint8_t *buf = tu_chunk(&o, &len);
  tu_slices_t t;
  ferry_chunk_src_t src;
  ferry_chunk_parser_t p;
  ferry_chunk_t ch;
  tu_slices_init(&t, buf, len, 7);
  tu_src(&src, &t);
  ferry__chunk_parser_init(&p);
  cr_assert_eq(ferry__chunk_parse(&p, &src, &ch, NULL), 0);
  stop = true;
  cr_assert_eq(ferry__client_on_chunk(c, &ch, &src, &stop), 0);
  /* Nothing was taken: a later lease redelivers those positions. */
  cr_assert_eq(ferry__client_split(c, 0, 0)->received, 2);
  ferry__chunk_parser_close(&p);
  tu_slices_close(&t);
  ferry__free(buf);
  ferry_client_free(c);
}

/* parallel_epochs: every worker sends its own copy of a split, and the
 * client keeps both (keyed by the stream's worker), each counted apart. */
Test(client_assemble, parallel_epochs_keep_every_workers_copy) {
  ferry__asm_params_t ap = {.batch_size = 5, .height = H, .width = W,
                            .channels = C, .prefetch = 4,
                            .per_worker = true};
  ferry_client_t *c;
  ferry_error_t err = {0};
  cr_assert_eq(ferry__client_new_local(&ap, &c, &err), 0, "%s", err.msg);
  beat_w(c, 0, 0, true, 0, (uint32_t[]){0, 0}, (uint64_t[]){4, 4},
         (uint64_t[]){1, 2}, 2);
  cr_assert_eq(ferry__client_held_locked(c), 2);
  cr_assert_eq(feed_w(c, 1, 0, 0, 0, 4, true), 0);
  cr_assert_eq(feed_w(c, 2, 0, 0, 0, 2, false), 0);
  cr_assert_eq(feed_w(c, 2, 0, 0, 2, 2, true), 0);
  /* 8 records: one full batch and the flushed remainder. */
  const ferry_batch_t *b1 = take(c, 5, 0), *b2 = take(c, 3, 0);
  uint32_t seen[4] = {0};
  for (uint32_t r = 0; r < 5; r++)
    seen[b1->ids[r] & 3]++;
  for (uint32_t r = 0; r < 3; r++)
    seen[b2->ids[r] & 3]++;
  for (int i = 0; i < 4; i++)
    cr_assert_eq(seen[i], 2, "position %d came %u times, not once per "
                 "worker", i, seen[i]);
  cr_assert_eq(ferry__client_split_of(c, 0, 0, 1)->delivered, 4);
  cr_assert_eq(ferry__client_split_of(c, 0, 0, 2)->delivered, 4);
  cr_assert_eq(ferry__client_held_locked(c), 0);
  /* A repeated chunk of one worker is still dropped. */
  cr_assert_eq(feed_w(c, 2, 0, 0, 0, 4, true), 0);
  cr_assert_eq(next_rc(c), FERRY_ETIMEDOUT);
  ferry_batch_release(c, b1);
  ferry_batch_release(c, b2);
  ferry_client_free(c);
}

/* A split counts against splits_in_flight until it is fully received, not
 * until delivered: its last records may wait in a partial batch that only
 * the end of the epoch flushes, and the client must be able to ask for
 * the next split meanwhile (with splits_in_flight = 1 it would deadlock).
 * Full receipt also wakes the heartbeat thread to ask at once. */
Test(client_assemble, a_fully_received_split_is_no_longer_held) {
  ferry_client_t *c = local(4, 2, false);
  beat(c, 0, 0, false, 0, (uint32_t[]){0, 1}, (uint64_t[]){6, 6}, 2);
  cr_assert_eq(ferry__client_held_locked(c), 2);
  c->hb_kick = false;
  cr_assert_eq(feed(c, 0, 0, 0, 5, false), 0);
  cr_assert_not(c->hb_kick, "no beat before the split is whole");
  cr_assert_eq(feed(c, 0, 0, 5, 1, true), 0);
  cr_assert_eq(ferry__client_held_locked(c), 1,
               "the received split still counts as held");
  cr_assert(c->hb_kick, "full receipt did not wake the heartbeat");
  const ferry_batch_t *b = take(c, 4, 0);
  /* Two records wait in the partial batch: delivered 4 of 6. */
  cr_assert_eq(ferry__client_split(c, 0, 0)->delivered, 4);
  cr_assert_eq(ferry__client_held_locked(c), 1);
  cr_assert_eq(next_rc(c), FERRY_ETIMEDOUT);
  ferry_batch_release(c, b);
  ferry_client_free(c);
}

/* Once the dispatcher counts an epoch delivered, the client forgets its
 * splits: a late copy of one of them (a stream replaying, a re-leased
 * duplicate) must be dropped, not taken for a new split. */
Test(client_assemble, chunks_of_a_finished_epoch_are_dropped) {
  ferry_client_t *c = local(4, 4, false);
  beat(c, 0, 0, true, 0, (uint32_t[]){0}, (uint64_t[]){4}, 1);
  cr_assert_eq(feed(c, 0, 0, 0, 4, true), 0);
  const ferry_batch_t *b = take(c, 4, 0);
  ferry_batch_release(c, b);
  beat(c, FERRY__V1__JOB_STATE__JOB_STATE_FINISHED, 1, true, 1, NULL, NULL,
       0);
  cr_assert_eq(feed(c, 0, 0, 0, 4, true), 0);
  cr_assert_eq(next_rc(c), FERRY_EPOCH_END);
  cr_assert_eq(next_rc(c), FERRY_END, "a late copy was delivered again");
  ferry_client_free(c);
}

/* Feeds one chunk of lease `lease` (worker 1). */
static void feed_lease(ferry_client_t *c, uint32_t split, uint64_t lease,
                       uint64_t first, uint32_t count, bool last) {
  tu_chunk_opts_t o = {.split = split, .first = first, .count = count,
                       .h = H, .w = W, .c = C, .last = last, .lease = lease};
  cr_assert_eq(tu_feed(c, &o, 1, 7), 0);
}

/* An answer assigning epoch 0's `split` (10 records) to worker 1 at
 * `lease`. */
static void beat_lease(ferry_client_t *c, uint32_t split, uint64_t lease,
                       bool exhausted) {
  tu_answer(c, 0, split, 10, lease, exhausted, 0);
}

Test(client_assemble, a_gap_restarts_the_split_once_then_completes_it) {
  ferry_client_t *c = local(4, 4, false);
  Ferry__V1__SplitProgress p;
  beat_lease(c, 2, 3, false);
  feed_lease(c, 2, 3, 0, 4, false);
  ferry_batch_release(c, take(c, 4, 0));
  p = tu_progress1(c);
  cr_assert_not(p.restart, "no gap yet");
  cr_assert_eq(p.delivered, 4);

  /* Positions 4 and 5 were lost in transit; the worker went on. */
  c->hb_kick = false;
  feed_lease(c, 2, 3, 6, 2, false);
  cr_assert_eq(ferry__client_split(c, 0, 2)->received, 4, "gap dropped");
  cr_assert(c->hb_kick, "a restart wakes the heartbeat thread");
  p = tu_progress1(c);
  cr_assert(p.restart);
  cr_assert_eq(p.lease, 3);
  cr_assert_eq(p.delivered, 4);
  cr_assert_eq(p.split, 2);
  /* Once per lease generation: more of the gap asks nothing more. */
  feed_lease(c, 2, 3, 8, 2, true);
  p = tu_progress1(c);
  cr_assert_not(p.restart, "restart sent once");

  /* The heartbeat failed: the dispatcher may not have it, so it goes out
   * again. */
  pthread_mutex_lock(&c->mu);
  ferry__client_restart_unsent_locked(c);
  pthread_mutex_unlock(&c->mu);
  p = tu_progress1(c);
  cr_assert(p.restart);
  cr_assert_eq(p.lease, 3);

  /* The answer brings lease 4 (from the dispatcher's delivered, which
   * lags: 2); the restart is over. */
  beat_lease(c, 2, 4, true);
  cr_assert_eq(ferry__client_split(c, 0, 2)->restart, FERRY__RESTART_NONE);
  pthread_mutex_lock(&c->mu);
  ferry__client_restart_unsent_locked(c);
  pthread_mutex_unlock(&c->mu);
  cr_assert_not(tu_progress1(c).restart);
  /* A late chunk of the old lease past the gap asks for nothing. */
  feed_lease(c, 2, 3, 9, 1, true);
  cr_assert_not(tu_progress1(c).restart);
  cr_assert_eq(ferry__client_split(c, 0, 2)->received, 4);

  /* The new lease replays from 2: 2 and 3 are dropped, 4..9 taken once. */
  feed_lease(c, 2, 4, 2, 5, false);
  feed_lease(c, 2, 4, 7, 3, true);
  const ferry_batch_t *b1 = take(c, 4, 0), *b2 = take(c, 2, 0);
  for (uint32_t r = 0; r < 4; r++)
    cr_assert_eq(b1->ids[r], tu_id(2, 4 + r));
  for (uint32_t r = 0; r < 2; r++)
    cr_assert_eq(b2->ids[r], tu_id(2, 8 + r));
  ferry_batch_release(c, b1);
  ferry_batch_release(c, b2);
  cr_assert_eq(next_rc(c), FERRY_ETIMEDOUT);
  ferry__split_t *s = ferry__client_split(c, 0, 2);
  cr_assert_eq(s->received, 10);
  cr_assert_eq(s->delivered, 10);
  cr_assert_not(tu_progress1(c).restart);
  ferry_client_free(c);
}

Test(client_assemble, a_broken_stream_restarts_the_workers_open_splits) {
  ferry_client_t *c = local(4, 4, false);
  Ferry__V1__ClientHeartbeatResponse r =
      FERRY__V1__CLIENT_HEARTBEAT_RESPONSE__INIT;
  Ferry__V1__Assignment a[3], *pa[3];
  for (size_t i = 0; i < 3; i++) {
    ferry__v1__assignment__init(&a[i]);
    a[i].split = (uint32_t)i;
    a[i].num_records = 4;
    a[i].worker_id = i == 2 ? 9 : 1; /* split 2 is on another worker */
    a[i].lease = 5 + i;
    pa[i] = &a[i];
  }
  r.n_assignments = 3;
  r.assignments = pa;
  r.error = (char *)"";
  ferry__client_apply_heartbeat(c, &r);
  feed_lease(c, 0, 5, 0, 4, true); /* split 0 fully received */
  pthread_mutex_lock(&c->mu);
  ferry__client_restart_worker_locked(c, 1);
  cr_assert_eq(ferry__client_split(c, 0, 0)->restart, FERRY__RESTART_NONE,
               "nothing of a fully received split is lost");
  cr_assert_eq(ferry__client_split(c, 0, 1)->restart,
               FERRY__RESTART_PENDING);
  cr_assert_eq(ferry__client_split(c, 0, 1)->restart_lease, 6);
  cr_assert_eq(ferry__client_split(c, 0, 2)->restart, FERRY__RESTART_NONE,
               "another worker's split");
  cr_assert(c->hb_kick);
  pthread_mutex_unlock(&c->mu);
  const ferry_batch_t *b = take(c, 4, 0);
  ferry_batch_release(c, b);
  ferry_client_free(c);
}

/* ferry_next's timeout says why no batch comes when the client knows. */
static const char *timeout_text(ferry_client_t *c, ferry_error_t *err) {
  const ferry_batch_t *b;
  cr_assert_eq(ferry_next(c, &b, 20, err), FERRY_ETIMEDOUT, "%s", err->msg);
  cr_assert(strstr(err->msg, "client: no batch within 20 ms") == err->msg,
            "%s", err->msg);
  return err->msg;
}

Test(client_assemble, a_timeout_says_why_no_batch_comes) {
  ferry_client_t *c = local(4, 4, false);
  ferry_error_t err = {0};
  beat(c, 0, 0, false, 0, (uint32_t[]){0}, (uint64_t[]){0}, 1);
  cr_assert_str_eq(timeout_text(c, &err), "client: no batch within 20 ms",
                   "nothing known: no hint");
  /* Every worker draining (or drained by an operator), one lost. */
  Ferry__V1__ClientHeartbeatResponse r =
      FERRY__V1__CLIENT_HEARTBEAT_RESPONSE__INIT;
  Ferry__V1__WorkerCounts wc = FERRY__V1__WORKER_COUNTS__INIT;
  r.error = (char *)"";
  r.worker_counts = &wc;
  wc.draining = 2;
  wc.left = 3;
  wc.lost = 1;
  ferry__client_apply_heartbeat(c, &r);
  cr_assert(strstr(timeout_text(c, &err),
                   ": no worker is serving this job: 2 draining, 3 stopped, "
                   "1 lost") !=
                NULL,
            "%s", err.msg);
  /* A worker is serving, but this client cannot reach it. */
  wc.serving = 1;
  wc.avoided = 1;
  ferry__client_apply_heartbeat(c, &r);
  pthread_mutex_lock(&c->mu);
  ferry__client_unreach_failed_locked(
      c, 7, "127.0.0.4:5051",
      "failed to connect to all addresses; last error: Peer name "
      "127.0.0.4 is not in peer certificate\n");
  pthread_mutex_unlock(&c->mu);
  cr_assert(strstr(timeout_text(c, &err),
                   ": worker 127.0.0.4:5051 unreachable: failed to connect "
                   "to all addresses; last error: Peer name 127.0.0.4 is not "
                   "in peer certificate?") != NULL,
            "%s", err.msg);
  /* A chunk from it: reachable after all, nothing to say. */
  pthread_mutex_lock(&c->mu);
  ferry__client_unreach_reached_locked(c, "127.0.0.4:5051");
  pthread_mutex_unlock(&c->mu);
  cr_assert_str_eq(timeout_text(c, &err), "client: no batch within 20 ms");
  ferry_client_free(c);
}

/* A trainer waiting for a batch that does not come is stalled while it
 * waits, not only once ferry_next returns: a starved trainer's status
 * read 0% until its first batch. */
typedef struct waiter_s {
  ferry_client_t *c;
  int rc;
  _Atomic bool done;
} waiter_t;

static void *wait_for_a_batch(void *arg) {
  waiter_t *w = arg;
  const ferry_batch_t *b;
  ferry_error_t err = {0};
  w->rc = ferry_next(w->c, &b, 3000, &err);
  atomic_store(&w->done, true);
  return NULL;
}

Test(client_assemble, a_running_wait_counts_as_stall) {
  ferry_client_t *c = local(4, 4, false);
  waiter_t w = {.c = c};
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, wait_for_a_batch, &w), 0);
  ferry_client_stats_t st;
  double seen = 0;
  for (int i = 0; i < 250 && seen < 0.2 && !atomic_load(&w.done); i++) {
    ferry_client_stats(c, &st);
    seen = st.wait_seconds;
    usleep(10000); /* polling the figure, bounded by 250 rounds */
  }
  bool still_waiting = !atomic_load(&w.done);
  pthread_join(t, NULL);
  cr_assert(still_waiting, "ferry_next returned before the check");
  cr_assert_geq(seen, 0.2, "a trainer waiting in ferry_next shows %.3f s "
                "of waiting", seen);
  cr_assert_eq(w.rc, FERRY_ETIMEDOUT);
  ferry_client_stats(c, &st);
  cr_assert_geq(st.wait_seconds, 2.9, "%.3f", st.wait_seconds);
  cr_assert_leq(st.stall_fraction, 1.0, "%.3f", st.stall_fraction);
  ferry_client_free(c);
}
