/* Tests of the common basics: the error table, the allocation wrapper and
 * logging through a callback. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "ferry/error.h"
#include "ferry/log.h"

Test(error, table_has_names_and_texts) {
  cr_assert_str_eq(ferry_err_name(FERRY_EDATACRC), "EDATACRC");
  cr_assert_str_eq(ferry_strerror(FERRY_EDATACRC),
                   "record data CRC mismatch");
  cr_assert_str_eq(ferry_err_name(FERRY_ENOMEM), "ENOMEM");
  cr_assert_eq(FERRY_ENOMEM, -ENOMEM);
  cr_assert_str_eq(ferry_err_name(0), "OK");
  cr_assert_str_eq(ferry_strerror(-123456), "unknown error");
}

Test(error, codes_are_unique) {
  static const int codes[] = {
#define XX(name, value, text) value,
      FERRY_ERRNO_MAP(XX)
#undef XX
  };
  size_t n = sizeof(codes) / sizeof(codes[0]);
  for (size_t i = 0; i < n; i++) {
    cr_assert_lt(codes[i], 0);
    for (size_t j = i + 1; j < n; j++)
      cr_assert_neq(codes[i], codes[j], "codes %zu and %zu collide", i, j);
  }
}

Test(error, seterr_and_prefix) {
  ferry_error_t err;
  int rc = ferry__seterr(&err, FERRY_EDATACRC, "record %d at byte %d", 3,
                         4096);
  cr_assert_eq(rc, FERRY_EDATACRC);
  cr_assert_eq(err.code, FERRY_EDATACRC);
  cr_assert_eq(ferry__prefixerr(&err, "%s", "a.tfrecord"), FERRY_EDATACRC);
  cr_assert_str_eq(err.msg, "a.tfrecord: record 3 at byte 4096");
  cr_assert_eq(ferry__seterr(NULL, FERRY_EIO, "ignored"), FERRY_EIO);
  ferry_error_clear(&err);
  cr_assert_eq(err.code, 0);
  cr_assert_str_eq(err.msg, "");
  cr_assert_eq(ferry__err_from_errno(ENOENT), FERRY_ENOENT);
  cr_assert_eq(ferry__err_from_errno(EXDEV), FERRY_EIO);
}

Test(alloc, accounts_bytes_and_blocks) {
  ferry_alloc_stats_t a, b;
  ferry__alloc_stats(&a);
  void *p = ferry__malloc(100);
  char *s = ferry__strdup("hello");
  void *q = ferry__aligned_alloc(4096, 10000);
  cr_assert_not_null(p);
  cr_assert_str_eq(s, "hello");
  cr_assert_eq((uintptr_t)q % 4096, 0);
  ferry__alloc_stats(&b);
  cr_assert_eq(b.bytes - a.bytes, 100 + 6 + 10000);
  cr_assert_eq(b.blocks - a.blocks, 3);
  p = ferry__realloc(p, 1000);
  cr_assert_not_null(p);
  ferry__alloc_stats(&b);
  cr_assert_eq(b.bytes - a.bytes, 1000 + 6 + 10000);
  ferry__free(p);
  ferry_free(s);
  ferry__aligned_free(q);
  ferry__alloc_stats(&b);
  cr_assert_eq(b.bytes, a.bytes);
  cr_assert_eq(b.blocks, a.blocks);
}

Test(alloc, failure_injection) {
  void *p, *q;
  ferry__alloc_fail_after(1);
  p = ferry__malloc(8);
  q = ferry__malloc(8);
  cr_assert_not_null(p);
  cr_assert_null(q);
  cr_assert_null(ferry__calloc(1, 8));
  ferry__alloc_fail_reset();
  q = ferry__malloc(8);
  cr_assert_not_null(q);
  ferry__free(p);
  ferry__free(q);
  cr_assert_null(ferry__calloc(SIZE_MAX / 2, 4));
}

Test(alloc, grow_doubles_from_min_and_checks_overflow) {
  uint64_t *a = NULL;
  size_t cap = 0;
  cr_assert(FERRY__GROW(a, cap, 1, 16));
  cr_assert_eq(cap, 16);
  a[15] = 7;
  cr_assert(FERRY__GROW(a, cap, 16, 16)); /* fits: unchanged */
  cr_assert_eq(cap, 16);
  cr_assert(FERRY__GROW(a, cap, 17, 16));
  cr_assert_eq(cap, 32);
  cr_assert_eq(a[15], 7, "the contents moved with the array");
  cr_assert(FERRY__GROW(a, cap, 100, 16));
  cr_assert_eq(cap, 128);
  /* A byte count past SIZE_MAX fails and leaves the array as it was. */
  uint64_t *before = a;
  cr_assert_not(FERRY__GROW(a, cap, SIZE_MAX / 4, 16));
  cr_assert_eq(a, before);
  cr_assert_eq(cap, 128);
  /* So does an allocation that fails. */
  ferry__alloc_fail_after(0);
  bool ok = FERRY__GROW(a, cap, 129, 16);
  ferry__alloc_fail_reset();
  cr_assert_not(ok);
  cr_assert_eq(a, before);
  cr_assert_eq(cap, 128);
  ferry__free(a);
  /* No minimum: starts at one element. */
  char *s = NULL;
  size_t scap = 0;
  cr_assert(FERRY__GROW(s, scap, 1, 0));
  cr_assert_eq(scap, 1);
  ferry__free(s);
}

static char last_msg[256];
static int last_level = -1;
static int calls;

static void capture(int level, const char *msg, void *ud) {
  (void)ud;
  last_level = level;
  calls++;
  snprintf(last_msg, sizeof(last_msg), "%s", msg);
}

Test(log, callback_and_level_filter) {
  FERRY_LOG(FERRY_LOG_ERROR, "dropped %d", 1); /* no callback: nothing */
  cr_assert_eq(calls, 0);
  ferry_log_set_callback(capture, NULL);
  ferry_log_set_level(FERRY_LOG_INFO);
  FERRY_LOG(FERRY_LOG_WARN, "disk %s", "full");
  cr_assert_eq(calls, 1);
  cr_assert_eq(last_level, FERRY_LOG_WARN);
  cr_assert_str_eq(last_msg, "disk full");
  FERRY_LOG(FERRY_LOG_DEBUG, "too chatty");
  cr_assert_eq(calls, 1);
  cr_assert_eq(ferry_log_level_parse("debug"), FERRY_LOG_DEBUG);
  cr_assert_eq(ferry_log_level_parse("loud"), -1);
  ferry_log_set_callback(NULL, NULL);
}
