/* Fuzzes the prefix cache's reader (pcache.h): the input is a whole cache
 * file, written under the entry name of a fixed key in a directory under
 * /tmp, opened with that key and read entry by entry (forwards, then
 * backwards), every returned pixel block touched at both ends so that
 * out-of-bounds pointers show. Whatever is served must have a sane shape;
 * nothing may stay allocated. The seeds (corpus/pcache/, written by
 * corpus/make_pcache_seeds.py) use the same key.
 *
 * An input starting with 0xff is "framed": the rest is pieces, each a u16
 * (LE) length and that many bytes (the last may be short), which the
 * target frames as records with valid CRCs, then adds a valid trailer
 * pointing at the last piece. So mutations get past the checksums to the
 * checks behind them (magic, key, count, offsets, positions, shapes).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "alloc.h"
#include "pcache.h"
#include "tfrecord.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond))                                                               \
      __builtin_trap();                                                        \
  } while (0)

static const ferry_pcache_key_t key = {
    .prefix_fp = UINT64_C(0x0123456789abcdef),
    .path = "shard-00000.tfrecord",
    .file_size = 1000,
    .mtime_ns = 1,
    .byte_offset = 0,
    .byte_end = 1000,
    .first_record = 0,
    .max_records = 0,
};

static char dir[64];
static char file[128];

static void cleanup(void) {
  unlink(file);
  rmdir(dir);
}

static void setup(void) {
  char name[FERRY_PCACHE_NAME_MAX];
  strcpy(dir, "/tmp/ferry-fuzz-pcache-XXXXXX");
  CHECK(mkdtemp(dir) != NULL);
  ferry__pcache_entry_name(&key, name, sizeof(name));
  snprintf(file, sizeof(file), "%s/%s", dir, name);
  atexit(cleanup);
}

static void get(ferry_pcache_reader_t *r, uint64_t pos) {
  ferry_pcache_record_t rec;
  ferry_error_t err;
  int rc = ferry__pcache_reader_get(r, pos, &rec, &err);
  if (rc != 0) {
    CHECK(ferry__pcache_damaged(rc) || rc == FERRY_ENOMEM);
    CHECK(err.msg[0] != '\0');
    return;
  }
  CHECK(rec.h > 0 && rec.w > 0 && rec.c > 0 && rec.c <= 4);
  size_t n = (size_t)rec.h * (size_t)rec.w * (size_t)rec.c;
  volatile uint8_t sink = rec.pixels[0] ^ rec.pixels[n - 1];
  (void)sink;
}

/* Frames one record of n bytes at out (n + 16 bytes). */
static size_t frame(uint8_t *out, const uint8_t *p, size_t n) {
  ferry__tfr_frame_header(n, out);
  memcpy(out + 12, p, n);
  ferry__tfr_frame_footer(p, n, out + 12 + n);
  return n + 16;
}

/* The file of a framed input (see above), in a malloc'd buffer. */
static uint8_t *framed(const uint8_t *data, size_t size, size_t *len) {
  /* Each piece takes at least one input byte and adds 16 of framing. */
  uint8_t *out = malloc(size * 17 + 64), t[16];
  size_t o = 0, last = 0;
  CHECK(out != NULL);
  for (size_t i = 1; i < size;) {
    size_t n = data[i++];
    if (i < size)
      n |= (size_t)data[i++] << 8;
    if (n > size - i)
      n = size - i;
    last = o;
    o += frame(out + o, data + i, n);
    i += n;
  }
  memcpy(t, "FERRYPCT", 8);
  for (int k = 0; k < 8; k++)
    t[8 + k] = (uint8_t)((uint64_t)last >> (8 * k));
  o += frame(out + o, t, sizeof(t));
  *len = o;
  return out;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ferry_alloc_stats_t before, after;
  ferry_pcache_reader_t *r;
  ferry_error_t err;
  uint8_t *owned = NULL;
  if (dir[0] == '\0')
    setup();
  if (size > 0 && data[0] == 0xff)
    data = owned = framed(data, size, &size);
  FILE *f = fopen(file, "wb");
  CHECK(f != NULL);
  CHECK(fwrite(data, 1, size, f) == size);
  CHECK(fclose(f) == 0);
  free(owned);

  ferry__alloc_stats(&before);
  int rc = ferry__pcache_reader_open(dir, &key, &r, &err);
  if (rc != 0) {
    CHECK(ferry__pcache_damaged(rc) || rc == FERRY_ENOMEM);
    CHECK(err.msg[0] != '\0');
  } else {
    uint64_t n = ferry__pcache_reader_count(r);
    /* The offset table is 8 bytes an entry, inside the file. */
    CHECK(n <= size / 8);
    for (uint64_t p = 0; p < n; p++)
      get(r, p);
    for (uint64_t p = n; p-- > 0;)
      get(r, p);
    ferry_pcache_record_t rec;
    CHECK(ferry__pcache_reader_get(r, n, &rec, &err) == FERRY_EINVAL);
    ferry__pcache_reader_close(r);
  }
  ferry__alloc_stats(&after);
  CHECK(after.bytes == before.bytes && after.blocks == before.blocks);
  return 0;
}
