/* The Chunk contract (chunk.h): the header encoder and the
 * zero-copy parser of ferry.v1.Chunk.
 *
 * Encoder: writes what protobuf-c's pack writes for the same message, in
 * field order, with the proto3 rules it follows: a scalar is left out when
 * 0 (false), the string when empty, a repeated field when it has no
 * values; labels and ids are packed; negative int32 and int64 values take
 * ten bytes (sign-extended). The payload (field 15) is written as its tag
 * and length only: its bytes are the second piece.
 *
 * Parser: walks the message field by field through a small window of
 * copied bytes, so the payload (the bulk of the message) is located but
 * never touched here.
 */
#include "chunk.h"

#include <string.h>

#include "alloc.h"
#include "varint.h"

enum { WT_VARINT = 0, WT_I64 = 1, WT_LEN = 2, WT_I32 = 5 };

#define TAG(field, wt) ((uint64_t)(field) << 3 | (wt))

/* ---- Encoder ------------------------------------------------------------ */

static size_t packed_body_len(const int64_t *v, size_t n) {
  size_t len = 0;
  for (size_t i = 0; i < n; i++)
    len += ferry__varint_len((uint64_t)v[i]);
  return len;
}

/* A varint field when v != 0 (tags of fields 1-15 take one byte). */
static size_t varint_field_len(uint64_t v) {
  return v != 0 ? 1 + ferry__varint_len(v) : 0;
}

/* A length-delimited field of body length len when len != 0. */
static size_t len_field_len(size_t len) {
  return len != 0 ? 1 + ferry__varint_len(len) + len : 0;
}

/* int32 values are sign-extended to 64 bits on the wire. */
static uint64_t int32_wire(int32_t v) { return (uint64_t)(int64_t)v; }

static size_t error_len(const ferry_chunk_t *ch) {
  return ch->error != NULL ? strlen(ch->error) : 0;
}

size_t ferry__chunk_header_size(const ferry_chunk_t *ch) {
  size_t n = 0;
  n += varint_field_len(ch->job_id);
  n += varint_field_len(ch->epoch);
  n += varint_field_len(ch->split);
  n += varint_field_len(ch->lease);
  n += varint_field_len(ch->first);
  n += varint_field_len(ch->count);
  n += varint_field_len(ch->height);
  n += varint_field_len(ch->width);
  n += varint_field_len(ch->channels);
  n += len_field_len(packed_body_len(ch->labels, ch->n_labels));
  n += len_field_len(packed_body_len(ch->ids, ch->n_ids));
  n += varint_field_len(ch->last ? 1 : 0);
  n += varint_field_len(int32_wire(ch->error_code));
  n += len_field_len(error_len(ch));
  if (ch->payload_len > 0)
    n += 1 + ferry__varint_len(ch->payload_len);
  return n;
}

size_t ferry__chunk_header_bound(size_t n_records, size_t error_len) {
  /* Nine scalars of at most 10 bytes plus a tag each, last, error_code,
   * then three length-delimited fields (labels, ids, error) and the
   * payload's tag and length: 11 bytes of tag and length each. */
  return 9 * 11 + 2 + 11 + 4 * 11 + error_len +
         2 * FERRY_VARINT_MAX * n_records;
}

static size_t put_varint_field(uint8_t *p, unsigned field, uint64_t v) {
  if (v == 0)
    return 0;
  p[0] = (uint8_t)TAG(field, WT_VARINT);
  return 1 + ferry__varint_put(p + 1, v);
}

static size_t put_packed(uint8_t *p, unsigned field, const int64_t *v,
                         size_t n) {
  size_t body = packed_body_len(v, n);
  if (body == 0)
    return 0;
  size_t k = 0;
  p[k++] = (uint8_t)TAG(field, WT_LEN);
  k += ferry__varint_put(p + k, body);
  for (size_t i = 0; i < n; i++)
    k += ferry__varint_put(p + k, (uint64_t)v[i]);
  return k;
}

int ferry__chunk_encode(const ferry_chunk_t *ch, const void *payload,
                        uint8_t *hdr, size_t cap,
                        ferry_chunk_piece_t out[FERRY_CHUNK_MAX_PIECES]) {
  if (ferry__chunk_header_size(ch) > cap)
    return FERRY_ERANGE;
  size_t k = 0;
  k += put_varint_field(hdr + k, FERRY_CHUNK_JOB_ID, ch->job_id);
  k += put_varint_field(hdr + k, FERRY_CHUNK_EPOCH, ch->epoch);
  k += put_varint_field(hdr + k, FERRY_CHUNK_SPLIT, ch->split);
  k += put_varint_field(hdr + k, FERRY_CHUNK_LEASE, ch->lease);
  k += put_varint_field(hdr + k, FERRY_CHUNK_FIRST, ch->first);
  k += put_varint_field(hdr + k, FERRY_CHUNK_COUNT, ch->count);
  k += put_varint_field(hdr + k, FERRY_CHUNK_HEIGHT, ch->height);
  k += put_varint_field(hdr + k, FERRY_CHUNK_WIDTH, ch->width);
  k += put_varint_field(hdr + k, FERRY_CHUNK_CHANNELS, ch->channels);
  k += put_packed(hdr + k, FERRY_CHUNK_LABELS, ch->labels, ch->n_labels);
  k += put_packed(hdr + k, FERRY_CHUNK_IDS, ch->ids, ch->n_ids);
  k += put_varint_field(hdr + k, FERRY_CHUNK_LAST, ch->last ? 1 : 0);
  k += put_varint_field(hdr + k, FERRY_CHUNK_ERROR_CODE,
                        int32_wire(ch->error_code));
  size_t elen = error_len(ch);
  if (elen > 0) {
    hdr[k++] = (uint8_t)TAG(FERRY_CHUNK_ERROR, WT_LEN);
    k += ferry__varint_put(hdr + k, elen);
    memcpy(hdr + k, ch->error, elen);
    k += elen;
  }
  if (ch->payload_len > 0) {
    hdr[k++] = (uint8_t)TAG(FERRY_CHUNK_PAYLOAD, WT_LEN);
    k += ferry__varint_put(hdr + k, ch->payload_len);
  }
  out[0].ptr = hdr;
  out[0].len = k;
  if (ch->payload_len == 0)
    return 1;
  out[1].ptr = payload;
  out[1].len = ch->payload_len;
  return 2;
}

/* ---- Parser ------------------------------------------------------------- */

/* Bytes copied per window refill: a chunk header (without labels and ids)
 * is well under this. */
#define WINDOW_MIN 4096

static size_t bytes_copy(const ferry_chunk_src_t *src, size_t off,
                         void *dst, size_t n) {
  if (off >= src->len)
    return 0;
  if (n > src->len - off)
    n = src->len - off;
  memcpy(dst, (const uint8_t *)src->ctx + off, n);
  return n;
}

void ferry__chunk_src_bytes(ferry_chunk_src_t *src, const void *buf,
                            size_t len) {
  src->len = len;
  src->copy = bytes_copy;
  src->ctx = buf;
}

void ferry__chunk_parser_init(ferry_chunk_parser_t *p) {
  memset(p, 0, sizeof(*p));
}

void ferry__chunk_parser_close(ferry_chunk_parser_t *p) {
  ferry__free(p->win);
  ferry__free(p->labels);
  ferry__free(p->ids);
  memset(p, 0, sizeof(*p));
}

/* Makes message bytes [pos, pos + n) available and points *out at them.
 * The caller guarantees pos + n <= src->len. */
static int need(ferry_chunk_parser_t *p, const ferry_chunk_src_t *src,
                size_t pos, size_t n, const uint8_t **out,
                ferry_error_t *err) {
  if (pos >= p->win_base && pos + n <= p->win_base + p->win_len) {
    *out = p->win + (pos - p->win_base);
    return 0;
  }
  size_t want = n > WINDOW_MIN ? n : WINDOW_MIN;
  /* A scratch window of exactly what is asked for (not array growth: a
   * big record's window should not cost twice its size). */
  if (want > p->win_cap) {
    uint8_t *w = ferry__realloc(p->win, want);
    if (w == NULL)
      return ferry__seterr(err, FERRY_ENOMEM, "chunk: out of memory");
    p->win = w;
    p->win_cap = want;
  }
  /* Copy what was asked for (at least a small window), not the whole
   * capacity: after a large packed field the next refill is the payload's
   * tag, and the payload itself must not pass through here. */
  size_t avail = src->len - pos;
  size_t take = want < avail ? want : avail;
  p->win_base = pos;
  p->win_len = src->copy(src, pos, p->win, take);
  if (p->win_len < n)
    return ferry__seterr(err, FERRY_EOVERRUN,
                         "chunk: byte offset %zu: message ends early", pos);
  *out = p->win;
  return 0;
}

/* Reads a varint at *pos and advances it. */
static int read_varint(ferry_chunk_parser_t *p, const ferry_chunk_src_t *src,
                       size_t *pos, uint64_t *v, ferry_error_t *err) {
  size_t avail = src->len - *pos;
  size_t n = avail < FERRY_VARINT_MAX ? avail : FERRY_VARINT_MAX;
  const uint8_t *b = NULL;
  if (n == 0)
    return ferry__seterr(err, FERRY_EOVERRUN,
                         "chunk: byte offset %zu: varint past the end", *pos);
  int rc = need(p, src, *pos, n, &b, err);
  if (rc != 0)
    return rc;
  int k = ferry__varint_get(b, b + n, FERRY_VARINT_MAX, v);
  if (k <= 0)
    return ferry__seterr(err, FERRY_EVARINT, "chunk: byte offset %zu: %s",
                         *pos, k == 0 ? "varint past the end" : "bad varint");
  *pos += (size_t)k;
  return 0;
}

static int push(int64_t **arr, size_t *cap, size_t *n, int64_t v) {
  if (!ferry__grow(arr, cap, *n + 1, sizeof(**arr), 256))
    return FERRY_ENOMEM;
  (*arr)[(*n)++] = v;
  return 0;
}

/* Appends the varints of a packed field body [pos, pos + len). */
static int read_packed(ferry_chunk_parser_t *p, const ferry_chunk_src_t *src,
                       size_t pos, size_t len, int64_t **arr, size_t *cap,
                       size_t *n, ferry_error_t *err) {
  const uint8_t *b;
  int rc = need(p, src, pos, len, &b, err);
  if (rc != 0)
    return rc;
  size_t i = 0;
  while (i < len) {
    uint64_t x;
    int k = ferry__varint_get(b + i, b + len, FERRY_VARINT_MAX, &x);
    if (k <= 0)
      return ferry__seterr(err, FERRY_EVARINT,
                           "chunk: byte offset %zu: bad packed varint",
                           pos + i);
    i += (size_t)k;
    if (push(arr, cap, n, (int64_t)x) != 0)
      return ferry__seterr(err, FERRY_ENOMEM, "chunk: out of memory");
  }
  return 0;
}

/* The wire type each known field must have (labels and ids: also 0, one
 * unpacked value). */
static bool wire_type_ok(uint32_t field, uint32_t wt) {
  switch (field) {
  case FERRY_CHUNK_LABELS:
  case FERRY_CHUNK_IDS:
    return wt == WT_VARINT || wt == WT_LEN;
  case FERRY_CHUNK_ERROR:
  case FERRY_CHUNK_PAYLOAD:
    return wt == WT_LEN;
  default:
    return field > FERRY_CHUNK_PAYLOAD || wt == WT_VARINT;
  }
}

/* Checks the parsed header against itself: the payload's size and the
 * number of labels and ids. */
static int check_shape(const ferry_chunk_t *out, ferry_error_t *err) {
  uint64_t rec, total;
  if (__builtin_mul_overflow((uint64_t)out->height, out->width, &rec) ||
      __builtin_mul_overflow(rec, (uint64_t)out->channels, &rec) ||
      __builtin_mul_overflow(rec, (uint64_t)out->count, &total))
    return ferry__seterr(err, FERRY_EINVAL,
                         "chunk: split %u: shape %ux%ux%u x %u overflows",
                         out->split, out->height, out->width, out->channels,
                         out->count);
  if (out->count > 0 && rec == 0)
    return ferry__seterr(err, FERRY_EINVAL,
                         "chunk: split %u first %llu: %u records of shape "
                         "%ux%ux%u", out->split,
                         (unsigned long long)out->first, out->count,
                         out->height, out->width, out->channels);
  if ((out->has_payload ? out->payload_len : 0) != total)
    return ferry__seterr(err, FERRY_EINVAL,
                         "chunk: split %u first %llu: payload has %zu bytes, "
                         "%u records of %ux%ux%u need %llu", out->split,
                         (unsigned long long)out->first,
                         out->has_payload ? out->payload_len : 0, out->count,
                         out->height, out->width, out->channels,
                         (unsigned long long)total);
  if ((out->n_labels != 0 && out->n_labels != out->count) ||
      (out->n_ids != 0 && out->n_ids != out->count))
    return ferry__seterr(err, FERRY_EINVAL,
                         "chunk: split %u first %llu: %zu labels and %zu ids "
                         "for %u records", out->split,
                         (unsigned long long)out->first, out->n_labels,
                         out->n_ids, out->count);
  return 0;
}

int ferry__chunk_parse(ferry_chunk_parser_t *p, const ferry_chunk_src_t *src,
                       ferry_chunk_t *out, ferry_error_t *err) {
  size_t pos = 0, n_labels = 0, n_ids = 0;
  int rc;
  memset(out, 0, sizeof(*out));
  p->win_base = 0;
  p->win_len = 0;
  p->error[0] = '\0';
  out->error = p->error;
  while (pos < src->len) {
    size_t at = pos;
    uint64_t key, v = 0, len = 0;
    if ((rc = read_varint(p, src, &pos, &key, err)) != 0)
      return rc;
    /* Tags are 32-bit varints: at most 5 bytes, as in protobuf-c and the
     * Example parser (fuzz_chunk cross-checks with protobuf-c). */
    if (pos - at > 5)
      return ferry__seterr(err, FERRY_EVARINT,
                           "chunk: byte offset %zu: tag longer than 5 bytes",
                           at);
    uint32_t field = (uint32_t)(key >> 3), wt = (uint32_t)(key & 7);
    if (field == 0 || key >> 3 > 0x1fffffff)
      return ferry__seterr(err, FERRY_EINVAL,
                           "chunk: byte offset %zu: bad field number", at);
    switch (wt) {
    case WT_VARINT:
      if ((rc = read_varint(p, src, &pos, &v, err)) != 0)
        return rc;
      break;
    case WT_I64:
    case WT_I32:
      len = wt == WT_I64 ? 8 : 4;
      if (len > src->len - pos)
        return ferry__seterr(err, FERRY_EOVERRUN,
                             "chunk: byte offset %zu: field %u past the end",
                             at, field);
      break;
    case WT_LEN: {
      size_t len_at = pos;
      if ((rc = read_varint(p, src, &pos, &len, err)) != 0)
        return rc;
      /* Lengths are 32-bit varints too (protobuf-c refuses longer ones;
       * found by fuzz_chunk). */
      if (pos - len_at > 5)
        return ferry__seterr(err, FERRY_EVARINT,
                             "chunk: byte offset %zu: length longer than 5 "
                             "bytes", len_at);
      if (len > src->len - pos)
        return ferry__seterr(err, FERRY_EOVERRUN,
                             "chunk: byte offset %zu: field %u length %llu "
                             "past the end", at, field,
                             (unsigned long long)len);
      break;
    }
    default:
      return ferry__seterr(err, FERRY_EWIRETYPE,
                           "chunk: byte offset %zu: wire type %u", at, wt);
    }
    if (!wire_type_ok(field, wt))
      return ferry__seterr(err, FERRY_EWIRETYPE,
                           "chunk: byte offset %zu: field %u has wire type %u",
                           at, field, wt);
    switch (field) {
    case FERRY_CHUNK_JOB_ID: out->job_id = v; break;
    case FERRY_CHUNK_EPOCH: out->epoch = (uint32_t)v; break;
    case FERRY_CHUNK_SPLIT: out->split = (uint32_t)v; break;
    case FERRY_CHUNK_LEASE: out->lease = v; break;
    case FERRY_CHUNK_FIRST: out->first = v; break;
    case FERRY_CHUNK_COUNT: out->count = (uint32_t)v; break;
    case FERRY_CHUNK_HEIGHT: out->height = (uint32_t)v; break;
    case FERRY_CHUNK_WIDTH: out->width = (uint32_t)v; break;
    case FERRY_CHUNK_CHANNELS: out->channels = (uint32_t)v; break;
    case FERRY_CHUNK_LAST: out->last = v != 0; break;
    case FERRY_CHUNK_ERROR_CODE: out->error_code = (int32_t)v; break;
    case FERRY_CHUNK_LABELS:
    case FERRY_CHUNK_IDS: {
      bool lab = field == FERRY_CHUNK_LABELS;
      int64_t **arr = lab ? &p->labels : &p->ids;
      size_t *cap = lab ? &p->labels_cap : &p->ids_cap;
      size_t *n = lab ? &n_labels : &n_ids;
      if (wt == WT_VARINT)
        rc = push(arr, cap, n, (int64_t)v) != 0
                 ? ferry__seterr(err, FERRY_ENOMEM, "chunk: out of memory")
                 : 0;
      else
        rc = read_packed(p, src, pos, len, arr, cap, n, err);
      if (rc != 0)
        return rc;
      break;
    }
    case FERRY_CHUNK_ERROR: {
      size_t take = len < sizeof(p->error) - 1 ? len : sizeof(p->error) - 1;
      const uint8_t *b;
      if (take > 0 && (rc = need(p, src, pos, take, &b, err)) != 0)
        return rc;
      if (take > 0)
        memcpy(p->error, b, take);
      p->error[take] = '\0';
      break;
    }
    case FERRY_CHUNK_PAYLOAD:
      out->has_payload = true;
      out->payload_off = pos;
      out->payload_len = len;
      break;
    default:
      break; /* unknown fields are skipped */
    }
    pos += len;
  }
  out->labels = p->labels;
  out->n_labels = n_labels;
  out->ids = p->ids;
  out->n_ids = n_ids;
  if (out->error_code != 0)
    return 0;
  return check_shape(out, err);
}
