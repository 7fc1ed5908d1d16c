/* The shared-production window (worker/share.h) without daemons: who
 * produces, what a consumer finds at each position, taking over, the
 * sliding window's bound, views that outlive their entry, no leaks. */
#include <criterion/criterion.h>
#include <string.h>

#include "alloc.h"
#include "share.h"

#define REC 12 /* 2 x 2 x 3 */

static ferry__wshare_key_t key_of(uint32_t split) {
  ferry__wshare_key_t k = {.pipe_id = 1, .seed = 7, .shuffle = true,
                           .epoch = 2, .split = split, .num_records = 100};
  return k;
}

/* Appends records [first, first + n), record p's pixels all p & 0xff. */
static bool add(ferry__wshare_t *s, ferry__wshare_entry_t *e, uint64_t first,
                uint32_t n, bool *wake) {
  int64_t labels[64], ids[64];
  uint8_t pix[64 * REC];
  for (uint32_t i = 0; i < n; i++) {
    labels[i] = (int64_t)(first + i) % 10;
    ids[i] = (int64_t)(first + i);
    memset(pix + i * REC, (int)((first + i) & 0xff), REC);
  }
  return ferry__wshare_append(s, e, first, n, 2, 2, 3, labels, ids, pix, wake);
}

static int64_t live(void) {
  ferry_alloc_stats_t a;
  ferry__alloc_stats(&a);
  return a.bytes;
}

Test(worker_share, producer_consumers_and_the_end) {
  int64_t before = live();
  ferry__wshare_t s;
  cr_assert_eq(ferry__wshare_init(&s, 1 << 20), 0);
  ferry__wshare_key_t k = key_of(3);
  bool producer, wake;
  ferry__wshare_entry_t *p = ferry__wshare_get(&s, &k, true, &producer);
  cr_assert(producer);
  ferry__wshare_entry_t *c = ferry__wshare_get(&s, &k, true, &producer);
  cr_assert_not(producer);
  cr_assert_eq(c, p);
  cr_assert_null(ferry__wshare_get(&s, &(ferry__wshare_key_t){.split = 4},
                                   false, &producer));
  const ferry__wshare_chunk_t *ch;
  uint64_t gen;
  cr_assert_eq(ferry__wshare_at(&s, c, 0, &ch, &gen), FERRY__WSHARE_WAIT);
  cr_assert(add(&s, p, 0, 5, &wake));
  cr_assert(add(&s, p, 5, 5, &wake));
  for (uint64_t pos = 0; pos < 10; pos++) {
    cr_assert_eq(ferry__wshare_at(&s, c, pos, &ch, &gen),
                 FERRY__WSHARE_CHUNK);
    cr_assert(pos >= ch->first && pos < ch->first + ch->count);
    cr_assert_eq(ch->ids[pos - ch->first], (int64_t)pos);
    cr_assert_eq(ch->payload[(pos - ch->first) * REC], pos & 0xff);
  }
  cr_assert_eq(ferry__wshare_at(&s, c, 10, &ch, &gen), FERRY__WSHARE_WAIT);
  /* A position past what is held: the consumer produces it. */
  cr_assert_eq(ferry__wshare_at(&s, c, 11, &ch, &gen), FERRY__WSHARE_OWN);
  /* A chunk overlapping what the entry holds adds only its new records. */
  cr_assert(add(&s, p, 8, 4, &wake));
  cr_assert_eq(ferry__wshare_at(&s, c, 11, &ch, &gen), FERRY__WSHARE_CHUNK);
  cr_assert_eq(ch->first, 10);
  /* The producer stops short: the next consumer at the end takes over. */
  ferry__wshare_end(&s, p, false, &wake);
  cr_assert_eq(ferry__wshare_at(&s, c, 12, &ch, &gen), FERRY__WSHARE_TAKE);
  cr_assert_eq(ferry__wshare_at(&s, c, 12, &ch, &gen), FERRY__WSHARE_WAIT,
               "one taker");
  cr_assert(add(&s, c, 12, 3, &wake));
  ferry__wshare_end(&s, c, true, &wake);
  cr_assert_eq(ferry__wshare_at(&s, p, 15, &ch, &gen), FERRY__WSHARE_END);
  ferry__wshare_put(&s, p);
  ferry__wshare_put(&s, c);
  ferry__wshare_close(&s);
  cr_assert_eq(live(), before);
}

Test(worker_share, waiting_tasks_are_reported) {
  ferry__wshare_t s;
  cr_assert_eq(ferry__wshare_init(&s, 1 << 20), 0);
  ferry__wshare_key_t k = key_of(1);
  bool producer, wake;
  ferry__wshare_entry_t *e = ferry__wshare_get(&s, &k, true, &producer);
  cr_assert_not(ferry__wshare_waiting(&s, e));
  e->waiting = 1; /* what park_share does under the tasks lock */
  cr_assert(ferry__wshare_waiting(&s, e));
  cr_assert(add(&s, e, 0, 1, &wake));
  cr_assert(wake, "an append wakes the tasks waiting");
  cr_assert(ferry__wshare_has(&s, 1, 2, 1));
  cr_assert_not(ferry__wshare_has(&s, 1, 3, 1), "another epoch");
  ferry__wshare_end(&s, e, true, &wake);
  cr_assert(wake);
  ferry__wshare_put(&s, e);
  ferry__wshare_close(&s);
}

/* The bound: unread entries go first (least recently used), then the
 * oldest chunks of the others; a consumer behind the window produces
 * the rest; a view keeps its chunk's memory after it left the window. */
Test(worker_share, the_window_slides_within_its_bound) {
  int64_t before = live();
  size_t chunk = sizeof(ferry__wshare_chunk_t) + 16 * 10 + REC * 10;
  ferry__wshare_t s;
  cr_assert_eq(ferry__wshare_init(&s, 3 * chunk), 0);
  bool producer, wake;
  ferry__wshare_key_t k1 = key_of(1), k2 = key_of(2);
  ferry__wshare_entry_t *a = ferry__wshare_get(&s, &k1, true, &producer);
  cr_assert(add(&s, a, 0, 10, &wake));
  ferry__wshare_end(&s, a, true, &wake);
  ferry__wshare_put(&s, a); /* unread now */
  ferry__wshare_entry_t *b = ferry__wshare_get(&s, &k2, true, &producer);
  cr_assert(add(&s, b, 0, 10, &wake));
  cr_assert(add(&s, b, 10, 10, &wake));
  /* Full: the unread entry of split 1 goes. */
  cr_assert(add(&s, b, 20, 10, &wake));
  cr_assert_null(ferry__wshare_get(&s, &k1, false, &producer));
  const ferry__wshare_chunk_t *ch, *held;
  uint64_t gen;
  cr_assert_eq(ferry__wshare_at(&s, b, 0, &ch, &gen), FERRY__WSHARE_CHUNK);
  held = ch;
  ferry__wshare_chunk_ref(held); /* a view in flight */
  /* Still full: the oldest chunk of the entry itself slides out. */
  cr_assert(add(&s, b, 30, 10, &wake));
  cr_assert_eq(ferry__wshare_at(&s, b, 5, &ch, &gen), FERRY__WSHARE_OWN);
  cr_assert_eq(ferry__wshare_at(&s, b, 15, &ch, &gen), FERRY__WSHARE_CHUNK);
  cr_assert_leq(s.used, 3 * chunk);
  cr_assert_eq(held->ids[3], 3, "the view's chunk is alive");
  cr_assert_eq(held->payload[3 * REC], 3);
  ferry__wshare_chunk_unref((void *)held);
  ferry__wshare_end(&s, b, true, &wake);
  ferry__wshare_put(&s, b);
  ferry__wshare_close(&s);
  cr_assert_eq(live(), before);
}
