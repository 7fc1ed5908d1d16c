/* The worker's chunk encoding, its shuffle order and its buffer pool. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "worker.h"

/* Joins the pieces into one message. */
static uint8_t *join(ferry__wchunk_t *c, size_t *len) {
  const ferry_chunk_piece_t *pieces = c->pieces;
  size_t n = c->n_pieces;
  size_t total = 0;
  for (size_t i = 0; i < n; i++)
    total += pieces[i].len;
  uint8_t *buf = malloc(total + 1);
  cr_assert_not_null(buf);
  size_t off = 0;
  for (size_t i = 0; i < n; i++) {
    memcpy(buf + off, pieces[i].ptr, pieces[i].len);
    off += pieces[i].len;
  }
  /* As the transport would once it let go of the message. */
  ferry__wpool_release(c);
  *len = total;
  return buf;
}

static void check_roundtrip(uint32_t count, int h, int w, int ch,
                            int error_code, const char *error, bool last) {
  ferry__wpool_t pool;
  bool oom;
  cr_assert_eq(ferry__wpool_init(&pool, 64 << 20), 0);
  size_t rb = (size_t)h * w * ch;
  ferry__wchunk_t *c = ferry__wpool_acquire(&pool, count, rb, NULL, NULL,
                                            &oom);
  cr_assert_not_null(c);
  c->job_id = 0x123456789abcull;
  c->client_id = 7;
  c->epoch = 3;
  c->split = 4000000000u;
  c->lease = 99;
  c->first = 1ull << 33;
  c->h = h;
  c->w = w;
  c->c = ch;
  c->last = last;
  c->error_code = error_code;
  snprintf(c->error, 512, "%s", error);
  for (uint32_t i = 0; i < count; i++) {
    c->labels[i] = (int64_t)i * 1000003 - 5000; /* negatives too */
    c->ids[i] = (int64_t)((uint64_t)(i % 5) << 40 | (uint64_t)i * 77);
    for (size_t j = 0; j < rb; j++)
      c->payload[i * rb + j] = (uint8_t)(i * 31 + j * 7);
  }
  c->count = count;
  cr_assert_eq(ferry__wchunk_encode(c), 0);
  size_t len;
  uint8_t *msg = join(c, &len);
  cr_assert_eq(ferry__wpool_used(&pool), 0, "both pieces released");

  Ferry__V1__Chunk *m = ferry__v1__chunk__unpack(NULL, len, msg);
  cr_assert_not_null(m, "a valid protobuf message");
  cr_assert_eq(m->job_id, 0x123456789abcull);
  cr_assert_eq(m->epoch, 3);
  cr_assert_eq(m->split, 4000000000u);
  cr_assert_eq(m->lease, 99);
  cr_assert_eq(m->first, 1ull << 33);
  cr_assert_eq(m->count, count);
  cr_assert_eq(m->height, (uint32_t)h);
  cr_assert_eq(m->width, (uint32_t)w);
  cr_assert_eq(m->channels, (uint32_t)ch);
  cr_assert_eq(m->last, last);
  cr_assert_eq(m->error_code, error_code);
  cr_assert_str_eq(m->error, error);
  cr_assert_eq(m->n_labels, count);
  cr_assert_eq(m->n_ids, count);
  for (uint32_t i = 0; i < count; i++) {
    cr_assert_eq(m->labels[i], (int64_t)i * 1000003 - 5000);
    cr_assert_eq(m->ids[i],
                 (int64_t)((uint64_t)(i % 5) << 40 | (uint64_t)i * 77));
  }
  cr_assert_eq(m->payload.len, count * rb);
  for (size_t k = 0; k < count * rb; k++)
    cr_assert_eq(m->payload.data[k], (uint8_t)((k / rb) * 31 + (k % rb) * 7),
                 "payload byte %zu", k);
  /* The payload is the last field: its bytes end the message. */
  if (count > 0)
    cr_assert_eq(memcmp(msg + len - count * rb, m->payload.data, count * rb),
                 0);
  ferry__v1__chunk__free_unpacked(m, NULL);
  free(msg);
  ferry__wpool_close(&pool);
}

Test(chunk, encodes_valid_protobuf) {
  check_roundtrip(5, 4, 3, 3, 0, "", false);
  check_roundtrip(1, 1, 1, 1, 0, "", true);
  check_roundtrip(682, 32, 32, 3, 0, "", true); /* a 2 MiB chunk */
}

Test(chunk, empty_and_error_chunks) {
  check_roundtrip(0, 32, 32, 3, 0, "", true);
  char long_error[600];
  memset(long_error, 'x', sizeof(long_error));
  long_error[511] = '\0';
  check_roundtrip(0, 0, 0, 0, FERRY_EDATACRC, long_error, false);
  check_roundtrip(0, 0, 0, 0, FERRY_EJPEG,
                  "a.tfrecord: record 3 at byte offset 40960: corrupt JPEG",
                  false);
}

/* ---- Shuffle -------------------------------------------------------------- */

static bool is_permutation(const uint64_t *p, uint64_t n) {
  uint8_t *seen = calloc(n + 1, 1);
  bool ok = true;
  for (uint64_t i = 0; i < n && ok; i++) {
    ok = p[i] < n && !seen[p[i]];
    if (ok)
      seen[p[i]] = 1;
  }
  free(seen);
  return ok;
}

Test(shuffle, permutation_deterministic_and_keyed) {
  enum { N = 1000 };
  static uint64_t a[N], b[N], c[N], d[N], e[N];
  ferry__wshuffle(a, N, true, 7, 0, 5);
  ferry__wshuffle(b, N, true, 7, 0, 5);
  ferry__wshuffle(c, N, true, 7, 1, 5);
  ferry__wshuffle(d, N, true, 7, 0, 6);
  ferry__wshuffle(e, N, true, 8, 0, 5);
  cr_assert(is_permutation(a, N));
  cr_assert(is_permutation(c, N));
  cr_assert(is_permutation(d, N));
  cr_assert_eq(memcmp(a, b, sizeof(a)), 0, "same key, same order");
  cr_assert_neq(memcmp(a, c, sizeof(a)), 0, "epochs differ");
  cr_assert_neq(memcmp(a, d, sizeof(a)), 0, "splits differ");
  cr_assert_neq(memcmp(a, e, sizeof(a)), 0, "seeds differ");
  size_t fixed = 0;
  for (uint64_t i = 0; i < N; i++)
    fixed += a[i] == i;
  cr_assert_lt(fixed, 20, "a shuffle moves most records");

  ferry__wshuffle(a, N, false, 7, 3, 5);
  for (uint64_t i = 0; i < N; i++)
    cr_assert_eq(a[i], i, "no shuffle: identity");
  /* Small sizes. */
  ferry__wshuffle(a, 0, true, 1, 1, 1);
  ferry__wshuffle(a, 1, true, 1, 1, 1);
  cr_assert_eq(a[0], 0);
  ferry__wshuffle(a, 2, true, 1, 1, 1);
  cr_assert(is_permutation(a, 2));
}

/* A stable reference value: the generator is documented, so its output
 * must not change between versions (a resumed lease on another worker
 * build must replay the same order). */
Test(shuffle, stable_across_builds) {
  static const uint64_t want[8] = {0, 7, 2, 3, 6, 4, 5, 1};
  uint64_t a[8];
  ferry__wshuffle(a, 8, true, 42, 2, 9);
  for (int i = 0; i < 8; i++)
    cr_assert_eq(a[i], want[i], "position %d", i);
}

/* ---- Pool ----------------------------------------------------------------- */

typedef struct {
  ferry__wpool_t *pool;
  atomic_bool cancel;
  atomic_int state; /* 0 waiting to start, 1 acquiring, 2 got, 3 NULL */
  ferry__wchunk_t *got;
} acq_t;

static void *acquirer(void *arg) {
  acq_t *a = arg;
  bool oom;
  atomic_store(&a->state, 1);
  a->got = ferry__wpool_acquire(a->pool, 4, 1 << 20, &a->cancel, NULL, &oom);
  atomic_store(&a->state, a->got != NULL ? 2 : 3);
  return NULL;
}

/* Waits (bounded) until the pool saw `n` waits in total. */
static bool wait_waits(ferry__wpool_t *p, uint64_t n) {
  for (int i = 0; i < 2000000; i++) {
    pthread_mutex_lock(&p->lock);
    uint64_t w = p->waits;
    pthread_mutex_unlock(&p->lock);
    if (w >= n)
      return true;
    sched_yield();
  }
  return false;
}

Test(pool, blocks_at_bound_and_unblocks_on_release, .timeout = 30) {
  ferry__wpool_t pool;
  size_t block = ferry__wchunk_block_size(4, 1 << 20);
  cr_assert_eq(ferry__wpool_init(&pool, 2 * block), 0);
  bool oom;
  ferry__wchunk_t *c1 = ferry__wpool_acquire(&pool, 4, 1 << 20, NULL, NULL,
                                             &oom);
  ferry__wchunk_t *c2 = ferry__wpool_acquire(&pool, 4, 1 << 20, NULL, NULL,
                                             &oom);
  cr_assert(c1 != NULL && c2 != NULL);
  cr_assert_eq(ferry__wpool_used(&pool), 2 * block);

  acq_t a = {.pool = &pool};
  atomic_init(&a.cancel, false);
  atomic_init(&a.state, 0);
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, acquirer, &a), 0);
  cr_assert(wait_waits(&pool, 1), "the third acquire waits");
  cr_assert_eq(atomic_load(&a.state), 1, "still blocked at the bound");
  ferry__wpool_release(c1);
  pthread_join(th, NULL);
  cr_assert_eq(atomic_load(&a.state), 2, "a release unblocks it");
  cr_assert_eq(a.got, c1, "the released block is reused");
  cr_assert_eq(ferry__wpool_used(&pool), 2 * block);

  /* Cancelling a waiter returns NULL. */
  acq_t b = {.pool = &pool};
  atomic_init(&b.cancel, false);
  atomic_init(&b.state, 0);
  cr_assert_eq(pthread_create(&th, NULL, acquirer, &b), 0);
  cr_assert(wait_waits(&pool, 2));
  atomic_store(&b.cancel, true);
  ferry__wpool_wake(&pool);
  pthread_join(th, NULL);
  cr_assert_eq(atomic_load(&b.state), 3);
  cr_assert_null(b.got);

  ferry__wpool_release(a.got);
  ferry__wpool_release(c2);
  cr_assert_eq(ferry__wpool_used(&pool), 0);
  ferry__wpool_close(&pool);
}

Test(pool, oversized_block_when_empty_and_no_growth) {
  ferry__wpool_t pool;
  bool oom;
  cr_assert_eq(ferry__wpool_init(&pool, 1 << 20), 0);
  /* Larger than the whole bound: allowed when nothing else is out. */
  ferry__wchunk_t *c = ferry__wpool_acquire(&pool, 1, 4 << 20, NULL, NULL,
                                            &oom);
  cr_assert_not_null(c);
  ferry__wpool_release(c);
  /* Steady state: same-size chunks reuse blocks, no new allocation. */
  c = ferry__wpool_acquire(&pool, 8, 1000, NULL, NULL, &oom);
  ferry__wpool_release(c);
  ferry_alloc_stats_t before, after;
  ferry__alloc_stats(&before);
  for (int i = 0; i < 100; i++) {
    c = ferry__wpool_acquire(&pool, 8, 1000, NULL, NULL, &oom);
    cr_assert_not_null(c);
    ferry__wpool_release(c);
  }
  ferry__alloc_stats(&after);
  cr_assert_eq(after.blocks, before.blocks);
  cr_assert_leq(pool.cached, pool.cap, "free blocks stay within the bound");
  ferry__wpool_close(&pool);
}
