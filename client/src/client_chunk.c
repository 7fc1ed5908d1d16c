/* The chunk header parser: walks a ferry.v1.Chunk message field by field
 * through a small window of copied bytes, so the payload (field 15, the
 * bulk of the message) is located but never touched here. The assembler
 * then gathers the payload straight from the gRPC slices into a batch.
 */
#include <string.h>

#include "client_internal.h"
#include "ferry/alloc.h"

/* Bytes copied per window refill: a chunk header (without labels and ids)
 * is well under this. */
#define WINDOW_MIN 4096

static size_t msg_copy(const void *ctx, size_t off, void *dst, size_t n) {
  return ferry_rpc_msg_copy(ctx, off, dst, n);
}

void ferry__src_from_msg(ferry__src_t *src, const ferry_rpc_msg_t *msg) {
  src->len = msg->len;
  src->copy = msg_copy;
  src->ctx = msg;
}

void ferry__chunk_parser_init(ferry__chunk_parser_t *p) {
  memset(p, 0, sizeof(*p));
}

void ferry__chunk_parser_close(ferry__chunk_parser_t *p) {
  ferry__free(p->win);
  ferry__free(p->labels);
  ferry__free(p->ids);
  memset(p, 0, sizeof(*p));
}

/* Makes message bytes [pos, pos + n) available and points *out at them.
 * The caller guarantees pos + n <= src->len. */
static int need(ferry__chunk_parser_t *p, const ferry__src_t *src, size_t pos,
                size_t n, const uint8_t **out, ferry_error_t *err) {
  if (pos >= p->win_base && pos + n <= p->win_base + p->win_len) {
    *out = p->win + (pos - p->win_base);
    return 0;
  }
  size_t want = n > WINDOW_MIN ? n : WINDOW_MIN;
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
  p->win_len = src->copy(src->ctx, pos, p->win, take);
  if (p->win_len < n)
    return ferry__seterr(err, FERRY_EOVERRUN,
                         "chunk: byte offset %zu: message ends early", pos);
  *out = p->win;
  return 0;
}

/* Reads a varint at *pos and advances it. */
static int read_varint(ferry__chunk_parser_t *p, const ferry__src_t *src,
                       size_t *pos, uint64_t *v, ferry_error_t *err) {
  size_t avail = src->len - *pos;
  size_t n = avail < 10 ? avail : 10;
  const uint8_t *b = NULL;
  if (n == 0)
    return ferry__seterr(err, FERRY_EOVERRUN,
                         "chunk: byte offset %zu: varint past the end", *pos);
  int rc = need(p, src, *pos, n, &b, err);
  if (rc != 0)
    return rc;
  uint64_t x = 0;
  for (size_t i = 0; i < n; i++) {
    x |= (uint64_t)(b[i] & 0x7f) << (7 * i);
    if ((b[i] & 0x80) == 0) {
      *v = x;
      *pos += i + 1;
      return 0;
    }
  }
  return ferry__seterr(err, FERRY_EVARINT, "chunk: byte offset %zu: %s",
                       *pos, n < 10 ? "varint past the end" : "bad varint");
}

static int push(int64_t **arr, size_t *cap, size_t *n, int64_t v) {
  if (*n == *cap) {
    size_t nc = *cap ? *cap * 2 : 256;
    int64_t *a = ferry__realloc(*arr, nc * sizeof(*a));
    if (a == NULL)
      return FERRY_ENOMEM;
    *arr = a;
    *cap = nc;
  }
  (*arr)[(*n)++] = v;
  return 0;
}

/* Appends the varints of a packed field body [pos, pos + len). */
static int read_packed(ferry__chunk_parser_t *p, const ferry__src_t *src,
                       size_t pos, size_t len, int64_t **arr, size_t *cap,
                       size_t *n, ferry_error_t *err) {
  const uint8_t *b;
  int rc = need(p, src, pos, len, &b, err);
  if (rc != 0)
    return rc;
  size_t i = 0;
  while (i < len) {
    uint64_t x = 0;
    int shift = 0;
    for (;;) {
      if (i == len || shift > 63)
        return ferry__seterr(err, FERRY_EVARINT,
                             "chunk: byte offset %zu: bad packed varint",
                             pos + i);
      uint8_t byte = b[i++];
      x |= (uint64_t)(byte & 0x7f) << shift;
      shift += 7;
      if ((byte & 0x80) == 0)
        break;
    }
    if (push(arr, cap, n, (int64_t)x) != 0)
      return ferry__seterr(err, FERRY_ENOMEM, "chunk: out of memory");
  }
  return 0;
}

int ferry__chunk_parse(ferry__chunk_parser_t *p, const ferry__src_t *src,
                       ferry__chunk_t *out, ferry_error_t *err) {
  size_t pos = 0, n_labels = 0, n_ids = 0;
  int rc;
  memset(out, 0, sizeof(*out));
  p->win_base = 0;
  p->win_len = 0;
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
    case 0:
      if ((rc = read_varint(p, src, &pos, &v, err)) != 0)
        return rc;
      break;
    case 1:
    case 5:
      len = wt == 1 ? 8 : 4;
      if (len > src->len - pos)
        return ferry__seterr(err, FERRY_EOVERRUN,
                             "chunk: byte offset %zu: field %u past the end",
                             at, field);
      break;
    case 2: {
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
    bool varint_field = field <= 9 || field == 12 || field == 13;
    if ((varint_field && wt != 0) ||
        ((field == 14 || field == 15) && wt != 2) ||
        ((field == 10 || field == 11) && wt != 0 && wt != 2))
      return ferry__seterr(err, FERRY_EWIRETYPE,
                           "chunk: byte offset %zu: field %u has wire type %u",
                           at, field, wt);
    switch (field) {
    case 1: out->job_id = v; break;
    case 2: out->epoch = (uint32_t)v; break;
    case 3: out->split = (uint32_t)v; break;
    case 4: out->lease = v; break;
    case 5: out->first = v; break;
    case 6: out->count = (uint32_t)v; break;
    case 7: out->height = (uint32_t)v; break;
    case 8: out->width = (uint32_t)v; break;
    case 9: out->channels = (uint32_t)v; break;
    case 12: out->last = v != 0; break;
    case 13: out->error_code = (int32_t)v; break;
    case 10:
    case 11: {
      int64_t **arr = field == 10 ? &p->labels : &p->ids;
      size_t *cap = field == 10 ? &p->labels_cap : &p->ids_cap;
      size_t *n = field == 10 ? &n_labels : &n_ids;
      if (wt == 0)
        rc = push(arr, cap, n, (int64_t)v) != 0
                 ? ferry__seterr(err, FERRY_ENOMEM, "chunk: out of memory")
                 : 0;
      else
        rc = read_packed(p, src, pos, len, arr, cap, n, err);
      if (rc != 0)
        return rc;
      break;
    }
    case 14: {
      size_t take = len < sizeof(out->error) - 1 ? len
                                                 : sizeof(out->error) - 1;
      const uint8_t *b;
      if (take > 0 && (rc = need(p, src, pos, take, &b, err)) != 0)
        return rc;
      if (take > 0)
        memcpy(out->error, b, take);
      out->error[take] = '\0';
      break;
    }
    case 15:
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
  if ((n_labels != 0 && n_labels != out->count) ||
      (n_ids != 0 && n_ids != out->count))
    return ferry__seterr(err, FERRY_EINVAL,
                         "chunk: split %u first %llu: %zu labels and %zu ids "
                         "for %u records", out->split,
                         (unsigned long long)out->first, n_labels, n_ids,
                         out->count);
  return 0;
}
