/* Chunk layout and encoding.
 *
 * A chunk lives in one pool block: the struct, the header area, the labels
 * and ids, then the payload (64-byte aligned). The wire message is a valid
 * ferry.v1.Chunk: fields 1-14 packed by protobuf-c into the header area,
 * then field 15 (payload) written by hand, tag 0x7a (15 << 3 | 2) and a
 * varint length, so the pixels follow as their own piece without a copy.
 */
#include <string.h>

#include "worker.h"

#define ALIGN_UP(x, a) (((x) + (a) - 1) & ~((size_t)(a) - 1))

/* The error string's storage (512 bytes), then room for the packed fixed
 * fields (at most ~70 bytes), two packed-field tags and lengths, the
 * packed error string (at most 511 bytes plus tag and length) and the
 * payload tag and length. */
#define HDR_FIXED 1408u
/* A packed int64 is at most 10 bytes. */
#define HDR_PER_RECORD 20u

static size_t hdr_cap_for(uint32_t cap) {
  return ALIGN_UP(HDR_FIXED + (size_t)HDR_PER_RECORD * cap, 64);
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
  c->error = (char *)c->hdr + c->hdr_cap - 512;
  c->error[0] = '\0';
  return c;
}

static size_t put_varint(uint8_t *out, uint64_t v) {
  size_t n = 0;
  while (v >= 0x80) {
    out[n++] = (uint8_t)(v | 0x80);
    v >>= 7;
  }
  out[n++] = (uint8_t)v;
  return n;
}

int ferry__wchunk_encode(ferry__wchunk_t *c) {
  Ferry__V1__Chunk m = FERRY__V1__CHUNK__INIT;
  size_t payload_len = (size_t)c->count * c->rec_bytes;
  m.job_id = c->job_id;
  m.epoch = c->epoch;
  m.split = c->split;
  m.lease = c->lease;
  m.first = c->first;
  m.count = c->count;
  m.height = (uint32_t)c->h;
  m.width = (uint32_t)c->w;
  m.channels = (uint32_t)c->c;
  m.n_labels = c->count;
  m.labels = c->labels;
  m.n_ids = c->count;
  m.ids = c->ids;
  m.last = c->last;
  m.error_code = c->error_code;
  /* protobuf-c emits a proto3 string only when non-empty. */
  m.error = c->error;
  /* The header must end before the error string it refers to, plus room
   * for the payload's tag and length (11 bytes). */
  size_t need = ferry__v1__chunk__get_packed_size(&m);
  if (need + 11 > c->hdr_cap - 512)
    return FERRY_ERANGE;
  size_t n = ferry__v1__chunk__pack(&m, c->hdr);
  if (payload_len > 0) {
    c->hdr[n++] = 15 << 3 | 2;
    n += put_varint(c->hdr + n, payload_len);
  }
  c->hdr_len = n;
  return 0;
}

/* A piece's free callback: the block goes back once both pieces are
 * released (any thread). */
static void piece_free(void *arg) {
  ferry__wchunk_t *c = arg;
  if (atomic_fetch_sub(&c->send_refs, 1) == 1)
    ferry__wpool_release(c);
}

size_t ferry__wchunk_pieces(ferry__wchunk_t *c, ferry_rpc_piece_t out[2]) {
  size_t payload_len = (size_t)c->count * c->rec_bytes;
  size_t n = payload_len > 0 ? 2 : 1;
  atomic_store(&c->send_refs, (int)n);
  out[0].ptr = c->hdr;
  out[0].len = c->hdr_len;
  out[0].free_fn = piece_free;
  out[0].free_arg = c;
  if (n == 2) {
    out[1].ptr = c->payload;
    out[1].len = payload_len;
    out[1].free_fn = piece_free;
    out[1].free_arg = c;
  }
  return n;
}
