/* Fuzz target for the chunk header parser (chunk.h), the one parser
 * that reads bytes a worker (a network peer) sent. The input is split into
 * slices of a size taken from its first byte, as gRPC delivers messages
 * in slices, so window refills across slice boundaries are exercised. An
 * accepted header must describe a payload inside the message, and
 * protobuf-c must accept the same message and agree on its scalar fields.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "chunk.h"
#include "ferry/v1/worker.pb-c.h"

typedef struct {
  const uint8_t *data;
  size_t len;
  size_t slice; /* bytes per slice: copies never cross more than needed */
} sliced_t;

static size_t sliced_copy(const ferry_chunk_src_t *src, size_t off, void *dst,
                          size_t n) {
  const sliced_t *s = src->ctx;
  size_t done = 0;
  while (done < n && off + done < s->len) {
    size_t pos = off + done;
    size_t in_slice = s->slice - pos % s->slice;
    size_t take = n - done < in_slice ? n - done : in_slice;
    if (take > s->len - pos)
      take = s->len - pos;
    memcpy((uint8_t *)dst + done, s->data + pos, take);
    done += take;
  }
  return done;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static ferry_chunk_parser_t parser;
  static int ready;
  sliced_t s;
  ferry_chunk_src_t src;
  ferry_chunk_t ch;
  ferry_error_t err;

  if (size == 0)
    return 0;
  if (!ready) {
    ferry__chunk_parser_init(&parser);
    ready = 1;
  }
  s.slice = 1 + data[0] % 64 * 97; /* 1 .. ~6 KiB */
  s.data = data + 1;
  s.len = size - 1;
  src.len = s.len;
  src.copy = sliced_copy;
  src.ctx = &s;
  if (ferry__chunk_parse(&parser, &src, &ch, &err) != 0)
    return 0;
  if (ch.payload_off > s.len || ch.payload_len > s.len - ch.payload_off)
    abort();
  Ferry__V1__Chunk *pb = ferry__v1__chunk__unpack(NULL, s.len, s.data);
  if (pb == NULL)
    abort();
  if (pb->epoch != ch.epoch || pb->split != ch.split ||
      pb->first != ch.first || pb->count != ch.count ||
      pb->payload.len != ch.payload_len)
    abort();
  ferry__v1__chunk__free_unpacked(pb, NULL);
  return 0;
}
