/* Fuzzes the TFRecord reader: the input is a whole file, read with AUTO
 * compression under both error policies and a small maximum record
 * length, every record touched so that out-of-bounds pointers show. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "alloc.h"
#include "tfrecord.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void run(const uint8_t *data, size_t size, ferry_error_policy_t pol,
                bool verify) {
  ferry_tfr_options_t o;
  ferry_tfr_reader_t *r;
  ferry_record_t rec;
  ferry_error_t err;
  ferry_tfr_stats_t st;
  uint64_t count = 0;
  int rc;

  ferry__tfr_options_init(&o);
  o.on_error = pol;
  o.verify_crc = verify;
  o.max_record_len = 64 << 10;
  if (ferry__tfr_reader_open_mem(data, size, "fuzz", &o, &r, &err) != 0)
    return;
  while ((rc = ferry__tfr_reader_next(r, &rec, &err)) == 0) {
    volatile uint8_t sink = 0;
    if (rec.len > o.max_record_len)
      __builtin_trap();
    if (rec.len > 0)
      sink ^= rec.data[0] ^ rec.data[rec.len - 1];
    (void)sink;
    count++;
  }
  /* A finished reader keeps answering the same way. */
  if (ferry__tfr_reader_next(r, &rec, &err) != rc)
    __builtin_trap();
  if (pol == FERRY_ON_ERROR_SKIP && rc != FERRY_EOF && rc != FERRY_ENOMEM)
    __builtin_trap();
  ferry__tfr_reader_stats(r, &st);
  if (st.records != count)
    __builtin_trap();
  ferry__tfr_reader_free(r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ferry_alloc_stats_t before, after;
  ferry__alloc_stats(&before);
  run(data, size, FERRY_ON_ERROR_FAIL, true);
  run(data, size, FERRY_ON_ERROR_SKIP, true);
  run(data, size, FERRY_ON_ERROR_SKIP, false);
  ferry__alloc_stats(&after);
  if (after.bytes != before.bytes || after.blocks != before.blocks)
    __builtin_trap();
  return 0;
}
