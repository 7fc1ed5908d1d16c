/* Chunk layout and encoding.
 *
 * A chunk lives in one pool block: the struct, the header area, the labels
 * and ids, then the payload (64-byte aligned). The wire message is a valid
 * ferry.v1.Chunk written by the Chunk contract's encoder (chunk.h):
 * the header (fields 1-14 and the payload's tag and length) in the header
 * area, then the pixels as their own piece without a copy.
 */
#include <string.h>

#include "worker.h"

#define ALIGN_UP(x, a) (((x) + (a) - 1) & ~((size_t)(a) - 1))

/* The error string's storage (512 bytes), then room for the largest
 * header of `cap` records with that string (511 bytes). */
#define ERROR_STORAGE 512u

static size_t hdr_cap_for(uint32_t cap) {
  return ALIGN_UP(
      ERROR_STORAGE + ferry__chunk_header_bound(cap, ERROR_STORAGE - 1), 64);
}

size_t ferry__wchunk_block_size(uint32_t cap, size_t rec_bytes) {
  size_t n = ALIGN_UP(sizeof(ferry__wchunk_t), 64);
  n += hdr_cap_for(cap);
  n += ALIGN_UP((size_t)cap * 2 * sizeof(int64_t), 64);
  n += (size_t)cap * rec_bytes;
  return n;
}

ferry__wchunk_t *ferry__wchunk_layout(void *block, size_t block_size,
                                      uint32_t cap, size_t rec_bytes) {
  uint8_t *p = block;
  ferry__wchunk_t *c = block;
  ferry__wpool_t *pool = c->pool;
  memset(c, 0, sizeof(*c));
  c->pool = pool;
  c->block_size = block_size;
  c->cap = cap;
  c->rec_bytes = rec_bytes;
  p += ALIGN_UP(sizeof(ferry__wchunk_t), 64);
  c->hdr = p;
  c->hdr_cap = hdr_cap_for(cap);
  p += c->hdr_cap;
  c->labels = (int64_t *)p;
  c->ids = c->labels + cap;
  p += ALIGN_UP((size_t)cap * 2 * sizeof(int64_t), 64);
  c->payload = p;
  /* The error string is kept at the end of the header area, which the
   * packed header never reaches (see ferry__wchunk_encode). */
  c->error = (char *)c->hdr + c->hdr_cap - ERROR_STORAGE;
  c->error[0] = '\0';
  return c;
}

int ferry__wchunk_encode(ferry__wchunk_t *c) {
  ferry_chunk_t h = {
      .job_id = c->job_id,
      .epoch = c->epoch,
      .split = c->split,
      .lease = c->lease,
      .first = c->first,
      .count = c->count,
      .height = (uint32_t)c->h,
      .width = (uint32_t)c->w,
      .channels = (uint32_t)c->c,
      .labels = c->labels,
      .n_labels = c->count,
      .ids = c->ids,
      .n_ids = c->count,
      .last = c->last,
      .error_code = c->error_code,
      .error = c->error,
      .payload_len = (size_t)c->count * c->rec_bytes,
  };
  /* The header must end before the error string it refers to. */
  int n = ferry__chunk_encode(&h, c->payload, c->hdr,
                              c->hdr_cap - ERROR_STORAGE, c->pieces);
  if (n < 0)
    return n;
  c->n_pieces = (size_t)n;
  return 0;
}
