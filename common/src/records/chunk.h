/* The Chunk contract: ferry.v1.Chunk (proto/ferry/v1/worker.proto) as the
 * worker writes it and the client reads it, whatever the transport.
 *
 * The field numbers, the encoder and the parser live here and nowhere
 * else. The encoder writes the header (fields 1-14, then the tag and
 * length of field 15, the payload) into a small buffer and describes the
 * message as pieces: the header, then the payload where it already lies
 * (the worker's chunk pool), so the pixels are never copied to build the
 * message. The bytes are those protobuf-c packs for the same message
 * (fields in number order, proto3 defaults left out, labels and ids
 * packed); tests/unit/test_chunk.c checks that byte for byte.
 *
 * The parser reads a message through a copy callback (gRPC slices, a
 * transport's message view, plain memory), taking only the header bytes
 * through a small window: the payload is located, never touched, so the
 * receiver can copy it once, straight to where it goes.
 */
#ifndef FERRY_CHUNK_H
#define FERRY_CHUNK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ferry/error.h"

/* ferry.v1.Chunk's field numbers. */
enum {
  FERRY_CHUNK_JOB_ID = 1,
  FERRY_CHUNK_EPOCH = 2,
  FERRY_CHUNK_SPLIT = 3,
  FERRY_CHUNK_LEASE = 4,
  FERRY_CHUNK_FIRST = 5,
  FERRY_CHUNK_COUNT = 6,
  FERRY_CHUNK_HEIGHT = 7,
  FERRY_CHUNK_WIDTH = 8,
  FERRY_CHUNK_CHANNELS = 9,
  FERRY_CHUNK_LABELS = 10,
  FERRY_CHUNK_IDS = 11,
  FERRY_CHUNK_LAST = 12,
  FERRY_CHUNK_ERROR_CODE = 13,
  FERRY_CHUNK_ERROR = 14,
  FERRY_CHUNK_PAYLOAD = 15
};

/* The error text the parser keeps (longer ones are cut to this - 1). */
#define FERRY_CHUNK_ERROR_MAX 400

/* One chunk's header. For the encoder: the fields to write, `error` NULL
 * or "" for none, payload_len the payload bytes that follow (count *
 * height * width * channels). From the parser: labels, ids and error
 * point into the parser (valid until its next parse), payload_off and
 * payload_len say where the payload lies in the message. */
typedef struct ferry_chunk_s {
  uint64_t job_id;
  uint32_t epoch, split;
  uint64_t lease;
  uint64_t first;
  uint32_t count;
  uint32_t height, width, channels;
  const int64_t *labels;
  size_t n_labels;
  const int64_t *ids;
  size_t n_ids;
  bool last;
  int32_t error_code;
  const char *error;
  bool has_payload; /* parser: field 15 was present */
  size_t payload_off, payload_len;
  /* Not on the wire: the receiver's note of the worker whose stream
   * brought the chunk (the parser sets 0, the encoder ignores it). */
  uint64_t worker_id;
} ferry_chunk_t;

/* ---- Encoder ------------------------------------------------------------ */

/* The header's exact size in bytes for `ch` (with the payload's tag and
 * length when payload_len > 0). */
size_t ferry__chunk_header_size(const ferry_chunk_t *ch);

/* At most this many header bytes for n_records labels and ids and an
 * error of error_len bytes, whatever the values. */
size_t ferry__chunk_header_bound(size_t n_records, size_t error_len);

/* One piece of an encoded message: bytes that are not copied. */
typedef struct ferry_chunk_piece_s {
  const void *ptr;
  size_t len;
} ferry_chunk_piece_t;

#define FERRY_CHUNK_MAX_PIECES 2

/* Writes the header of `ch` into hdr[0, cap) and fills `out` with the
 * message as pieces, in order: out[0] the header (hdr, its length), out[1]
 * the payload (payload, ch->payload_len) when payload_len > 0. Sending
 * the pieces back to back is one valid ferry.v1.Chunk. Returns the number
 * of pieces (1 or 2), or FERRY_ERANGE (nothing written that matters) when
 * the header needs more than cap bytes. */
int ferry__chunk_encode(const ferry_chunk_t *ch, const void *payload,
                        uint8_t *hdr, size_t cap,
                        ferry_chunk_piece_t out[FERRY_CHUNK_MAX_PIECES]);

/* ---- Parser ------------------------------------------------------------- */

/* Where a message's bytes come from: copy() gathers n bytes at `off` into
 * dst and returns how many it copied (fewer only at the end); ctx is the
 * source's own (a gRPC message, a transport's message view, memory). */
typedef struct ferry_chunk_src_s ferry_chunk_src_t;
struct ferry_chunk_src_s {
  size_t len;
  size_t (*copy)(const ferry_chunk_src_t *src, size_t off, void *dst, size_t n);
  const void *ctx;
};

/* A source over len contiguous bytes at buf (kept by the caller). */
void ferry__chunk_src_bytes(ferry_chunk_src_t *src, const void *buf,
                            size_t len);

/* The parser's reusable buffers: a window over the message's header bytes,
 * the label and id arrays and the error text. They grow to the largest
 * header seen and are reused, so a steady stream allocates nothing. */
typedef struct ferry_chunk_parser_s {
  uint8_t *win;
  size_t win_cap;
  size_t win_base, win_len; /* bytes [win_base, win_base + win_len) */
  int64_t *labels, *ids;
  size_t labels_cap, ids_cap;
  char error[FERRY_CHUNK_ERROR_MAX];
} ferry_chunk_parser_t;

void ferry__chunk_parser_init(ferry_chunk_parser_t *p);
void ferry__chunk_parser_close(ferry_chunk_parser_t *p);

/* Parses the header of one Chunk message without copying its payload:
 * only the header bytes pass through the window (fields in any order,
 * labels and ids packed or not, unknown fields skipped). Checks that the
 * payload holds count * height * width * channels bytes and that labels
 * and ids number count or 0 (not for an error chunk). Returns 0,
 * FERRY_EOVERRUN / FERRY_EVARINT / FERRY_EWIRETYPE / FERRY_EINVAL for a
 * malformed message (err names the byte offset), FERRY_ENOMEM. */
int ferry__chunk_parse(ferry_chunk_parser_t *p, const ferry_chunk_src_t *src,
                       ferry_chunk_t *out, ferry_error_t *err);

#endif /* FERRY_CHUNK_H */
