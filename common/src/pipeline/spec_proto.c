/* The pipeline spec's protobuf form (ferry.v1.PipelineSpec: pack,
 * unpack) and its fingerprint.
 */
#include "spec.h"

#include <string.h>

#include "alloc.h"
#include "ferry/v1/common.pb-c.h"
#include "pb_alloc.h"
#include "spec_internal.h"

/* ---------------------------------------------------------------------
 * Protobuf form. The message is built on the stack, pointing into the
 * spec, so packing (and the fingerprint) allocate nothing but the output.
 */

typedef struct {
  Ferry__V1__PipelineSpec msg;
  Ferry__V1__Source source;
  Ferry__V1__Decode decode;
  Ferry__V1__Label label;
  Ferry__V1__Shuffle shuffle;
  Ferry__V1__ImageOp op[FERRY_SPEC_MAX_OPS];
  Ferry__V1__ImageOp *opp[FERRY_SPEC_MAX_OPS];
  Ferry__V1__Resize resize[FERRY_SPEC_MAX_OPS];
  Ferry__V1__Dilate dilate[FERRY_SPEC_MAX_OPS];
  Ferry__V1__Blur blur[FERRY_SPEC_MAX_OPS];
  Ferry__V1__RandomResizedCrop rrc[FERRY_SPEC_MAX_OPS];
  Ferry__V1__ResizeShorter rshort[FERRY_SPEC_MAX_OPS];
  Ferry__V1__CenterCrop ccrop[FERRY_SPEC_MAX_OPS];
} pb_spec;

/* Canonical choices: every sub-message is present (Label with an empty
 * key means no label); the shuffle message only when shuffling; scalars
 * as the spec has them, so proto3 leaves out the zeros. */
static void build_msg(const ferry_spec_t *s, pb_spec *m) {
  size_t i;
  ferry__v1__pipeline_spec__init(&m->msg);
  ferry__v1__source__init(&m->source);
  ferry__v1__decode__init(&m->decode);
  ferry__v1__label__init(&m->label);
  ferry__v1__shuffle__init(&m->shuffle);

  m->source.n_patterns = s->n_patterns;
  m->source.patterns = s->patterns;
  m->source.compression = (Ferry__V1__Compression)s->compression;
  m->msg.source = &m->source;

  m->decode.format = (Ferry__V1__ImageFormat)s->format;
  m->decode.height = (uint32_t)s->height;
  m->decode.width = (uint32_t)s->width;
  m->decode.channels = (uint32_t)s->channels;
  m->decode.key = s->image_key;
  m->msg.decode = &m->decode;

  m->label.key =
      s->label_key != NULL ? s->label_key : (char *)protobuf_c_empty_string;
  m->msg.label = &m->label;

  for (i = 0; i < s->n_ops; i++) {
    const ferry_image_op_t *op = &s->ops[i];
    ferry__v1__image_op__init(&m->op[i]);
    switch (op->kind) {
    case FERRY_OP_RESIZE:
      ferry__v1__resize__init(&m->resize[i]);
      m->resize[i].height = (uint32_t)op->a;
      m->resize[i].width = (uint32_t)op->b;
      m->op[i].op_case = FERRY__V1__IMAGE_OP__OP_RESIZE;
      m->op[i].resize = &m->resize[i];
      break;
    case FERRY_OP_DILATE:
      ferry__v1__dilate__init(&m->dilate[i]);
      m->dilate[i].size = (uint32_t)op->a;
      m->op[i].op_case = FERRY__V1__IMAGE_OP__OP_DILATE;
      m->op[i].dilate = &m->dilate[i];
      break;
    case FERRY_OP_BLUR:
      ferry__v1__blur__init(&m->blur[i]);
      m->blur[i].size = (uint32_t)op->a;
      m->blur[i].sigma = op->sigma;
      m->op[i].op_case = FERRY__V1__IMAGE_OP__OP_BLUR;
      m->op[i].blur = &m->blur[i];
      break;
    case FERRY_OP_RANDOM_RESIZED_CROP:
      ferry__v1__random_resized_crop__init(&m->rrc[i]);
      m->rrc[i].height = (uint32_t)op->a;
      m->rrc[i].width = (uint32_t)op->b;
      m->rrc[i].scale_min = op->scale[0];
      m->rrc[i].scale_max = op->scale[1];
      m->rrc[i].ratio_min = op->ratio[0];
      m->rrc[i].ratio_max = op->ratio[1];
      m->rrc[i].exact = op->exact;
      m->op[i].op_case = FERRY__V1__IMAGE_OP__OP_RANDOM_RESIZED_CROP;
      m->op[i].random_resized_crop = &m->rrc[i];
      break;
    case FERRY_OP_RESIZE_SHORTER:
      ferry__v1__resize_shorter__init(&m->rshort[i]);
      m->rshort[i].size = (uint32_t)op->a;
      m->rshort[i].exact = op->exact;
      m->op[i].op_case = FERRY__V1__IMAGE_OP__OP_RESIZE_SHORTER;
      m->op[i].resize_shorter = &m->rshort[i];
      break;
    case FERRY_OP_CENTER_CROP:
      ferry__v1__center_crop__init(&m->ccrop[i]);
      m->ccrop[i].height = (uint32_t)op->a;
      m->ccrop[i].width = (uint32_t)op->b;
      m->op[i].op_case = FERRY__V1__IMAGE_OP__OP_CENTER_CROP;
      m->op[i].center_crop = &m->ccrop[i];
      break;
    }
    m->opp[i] = &m->op[i];
  }
  m->msg.n_ops = s->n_ops;
  m->msg.ops = s->n_ops > 0 ? m->opp : NULL;

  if (s->shuffle) {
    m->shuffle.enabled = 1;
    m->shuffle.seed = s->shuffle_seed;
    m->shuffle.buffer = s->shuffle_buffer;
    m->msg.shuffle = &m->shuffle;
  }
  m->msg.batch_size = s->batch_size;
  m->msg.drop_remainder = s->drop_remainder;
  m->msg.repeat = s->repeat;
}

int ferry__spec_pack(const ferry_spec_t *spec, uint8_t **out, size_t *len) {
  pb_spec m;
  size_t n;
  uint8_t *buf;
  int rc;

  if (spec == NULL || out == NULL || len == NULL)
    return FERRY_EINVAL;
  *out = NULL;
  *len = 0;
  if ((rc = ferry__spec_validate_impl(spec, NULL, NULL, NULL)) != 0)
    return rc;
  build_msg(spec, &m);
  n = ferry__v1__pipeline_spec__get_packed_size(&m.msg);
  /* One byte more so that an empty message still gets a buffer. */
  buf = ferry__malloc(n + 1);
  if (buf == NULL)
    return FERRY_ENOMEM;
  ferry__v1__pipeline_spec__pack(&m.msg, buf);
  *out = buf;
  *len = n;
  return 0;
}

static int unknown_fields(const ProtobufCMessage *m, const char *name,
                          ferry_error_t *err) {
  if (m != NULL && m->n_unknown_fields > 0)
    return ferry__spec_err(err,
                    "%s: unknown field %u (from a newer version?); refusing "
                    "to ignore it",
                    name, m->unknown_fields[0].tag);
  return 0;
}

static int u32_to_int(uint32_t v, const char *what, int *out,
                      ferry_error_t *err) {
  if (v > INT_MAX)
    return ferry__spec_err(err, "%s: %u is out of range", what, v);
  *out = (int)v;
  return 0;
}

static int pb_key(const char *s, char *deflt, char **slot) {
  ferry__spec_free_key(*slot);
  *slot = NULL;
  if (strcmp(s, deflt) == 0) {
    *slot = deflt;
    return 0;
  }
  *slot = ferry__strdup(s);
  return *slot != NULL ? 0 : FERRY_ENOMEM;
}

/* The spec from an unpacked message, with proto3's defaults mapped:
 * decode key "" is "image", JPEG channels 0 are 3, shuffle buffer 0 is
 * the default, repeat 0 is 1, an absent Label is "label". */
static int from_msg(const Ferry__V1__PipelineSpec *m, ferry_spec_t *s,
                    ferry_error_t *err) {
  size_t i;
  int rc;

  if ((rc = unknown_fields(&m->base, "PipelineSpec", err)) != 0)
    return rc;
  if (m->source == NULL)
    return ferry__spec_err(err, "PipelineSpec: source is missing");
  if (m->decode == NULL)
    return ferry__spec_err(err, "PipelineSpec: decode is missing");
  if ((rc = unknown_fields(&m->source->base, "Source", err)) != 0 ||
      (rc = unknown_fields(&m->decode->base, "Decode", err)) != 0 ||
      (m->label != NULL &&
       (rc = unknown_fields(&m->label->base, "Label", err)) != 0) ||
      (m->shuffle != NULL &&
       (rc = unknown_fields(&m->shuffle->base, "Shuffle", err)) != 0))
    return rc;

  if (m->source->n_patterns == 0)
    return ferry__spec_err(err, "tfrecord: needs at least one file pattern");
  s->patterns = ferry__calloc(m->source->n_patterns, sizeof(char *));
  if (s->patterns == NULL)
    return FERRY_ENOMEM;
  for (i = 0; i < m->source->n_patterns; i++) {
    s->patterns[i] = ferry__strdup(m->source->patterns[i]);
    if (s->patterns[i] == NULL)
      return FERRY_ENOMEM;
    s->n_patterns = i + 1;
  }
  s->compression = (ferry_compression_t)m->source->compression;

  s->format = (ferry_image_format_t)m->decode->format;
  if ((rc = u32_to_int(m->decode->height, "decode height", &s->height,
                       err)) != 0 ||
      (rc = u32_to_int(m->decode->width, "decode width", &s->width,
                       err)) != 0 ||
      (rc = u32_to_int(m->decode->channels, "decode channels", &s->channels,
                       err)) != 0)
    return rc;
  if (s->format == FERRY_IMAGE_JPEG && s->channels == 0)
    s->channels = 3;
  if (m->decode->key[0] != '\0' &&
      (rc = pb_key(m->decode->key, ferry__spec_default_image_key, &s->image_key)) != 0)
    return rc;
  if (m->label != NULL) {
    if (m->label->key[0] == '\0') {
      ferry__spec_free_key(s->label_key);
      s->label_key = NULL;
    } else if ((rc = pb_key(m->label->key, ferry__spec_default_label_key,
                            &s->label_key)) != 0) {
      return rc;
    }
  }

  if (m->n_ops > FERRY_SPEC_MAX_OPS)
    return ferry__spec_err(err, "too many image ops: %zu (at most %d)", m->n_ops,
                    FERRY_SPEC_MAX_OPS);
  for (i = 0; i < m->n_ops; i++) {
    const Ferry__V1__ImageOp *o = m->ops[i];
    ferry_image_op_t *op = &s->ops[i];
    const ProtobufCMessage *inner = NULL;
    memset(op, 0, sizeof(*op));
    switch (o->op_case) {
    case FERRY__V1__IMAGE_OP__OP_RESIZE:
      op->kind = FERRY_OP_RESIZE;
      inner = &o->resize->base;
      if ((rc = u32_to_int(o->resize->height, "resize height", &op->a,
                           err)) != 0 ||
          (rc = u32_to_int(o->resize->width, "resize width", &op->b,
                           err)) != 0)
        return rc;
      break;
    case FERRY__V1__IMAGE_OP__OP_DILATE:
      op->kind = FERRY_OP_DILATE;
      inner = &o->dilate->base;
      if ((rc = u32_to_int(o->dilate->size, "dilate size", &op->a, err)) !=
          0)
        return rc;
      break;
    case FERRY__V1__IMAGE_OP__OP_BLUR:
      op->kind = FERRY_OP_BLUR;
      inner = &o->blur->base;
      if ((rc = u32_to_int(o->blur->size, "blur size", &op->a, err)) != 0)
        return rc;
      op->sigma = o->blur->sigma;
      break;
    case FERRY__V1__IMAGE_OP__OP_RANDOM_RESIZED_CROP: {
      const Ferry__V1__RandomResizedCrop *q = o->random_resized_crop;
      op->kind = FERRY_OP_RANDOM_RESIZED_CROP;
      inner = &q->base;
      if ((rc = u32_to_int(q->height, "random_resized_crop height", &op->a,
                           err)) != 0 ||
          (rc = u32_to_int(q->width, "random_resized_crop width", &op->b,
                           err)) != 0)
        return rc;
      op->scale[0] = q->scale_min;
      op->scale[1] = q->scale_max;
      op->ratio[0] = q->ratio_min;
      op->ratio[1] = q->ratio_max;
      op->exact = q->exact != 0;
      break;
    }
    case FERRY__V1__IMAGE_OP__OP_RESIZE_SHORTER:
      op->kind = FERRY_OP_RESIZE_SHORTER;
      inner = &o->resize_shorter->base;
      if ((rc = u32_to_int(o->resize_shorter->size, "resize size", &op->a,
                           err)) != 0)
        return rc;
      op->exact = o->resize_shorter->exact != 0;
      break;
    case FERRY__V1__IMAGE_OP__OP_CENTER_CROP:
      op->kind = FERRY_OP_CENTER_CROP;
      inner = &o->center_crop->base;
      if ((rc = u32_to_int(o->center_crop->height, "center_crop height",
                           &op->a, err)) != 0 ||
          (rc = u32_to_int(o->center_crop->width, "center_crop width",
                           &op->b, err)) != 0)
        return rc;
      break;
    default:
      return ferry__spec_err(err, "ops[%zu]: no op set", i);
    }
    if ((rc = unknown_fields(&o->base, "ImageOp", err)) != 0 ||
        (rc = unknown_fields(inner, "ImageOp op", err)) != 0)
      return rc;
    s->n_ops = i + 1;
  }

  if (m->shuffle != NULL && m->shuffle->enabled) {
    s->shuffle = true;
    s->shuffle_seed = m->shuffle->seed;
    s->shuffle_buffer =
        m->shuffle->buffer != 0 ? m->shuffle->buffer : DEFAULT_SHUFFLE_BUFFER;
  }
  s->batch_size = m->batch_size;
  s->drop_remainder = m->drop_remainder != 0;
  s->repeat = m->repeat != 0 ? m->repeat : 1;
  return ferry__spec_validate_impl(s, NULL, NULL, err);
}

int ferry__spec_unpack(const uint8_t *buf, size_t len, ferry_spec_t *spec,
                       ferry_error_t *err) {
  bool oom = false;
  ProtobufCAllocator a = ferry__pb_allocator_noting(&oom);
  Ferry__V1__PipelineSpec *m;
  int rc;

  if (spec == NULL || (buf == NULL && len > 0))
    return ferry__seterr(err, FERRY_EINVAL, "spec unpack: NULL argument");
  ferry__spec_init(spec);
  m = ferry__v1__pipeline_spec__unpack(&a, len, buf);
  if (m == NULL) {
    if (oom)
      return ferry__seterr(err, FERRY_ENOMEM,
                           "out of memory unpacking the spec");
    return ferry__spec_err(err, "PipelineSpec: malformed protobuf (%zu bytes)",
                    len);
  }
  rc = from_msg(m, spec, err);
  if (rc == FERRY_ENOMEM)
    ferry__seterr(err, rc, "out of memory unpacking the spec");
  ferry__v1__pipeline_spec__free_unpacked(m, &a);
  if (rc != 0)
    ferry__spec_close(spec);
  return rc;
}

/* ---------------------------------------------------------------------
 * Fingerprint: FNV-1a-64 over the canonical serialization, then
 * MurmurHash3's 64-bit finalizer so that every input bit reaches every
 * output bit. Streamed from protobuf-c's packer: no allocation.
 */

typedef struct {
  ProtobufCBuffer base;
  uint64_t h;
} hash_buffer;

static void hash_append(ProtobufCBuffer *b, size_t len,
                        const uint8_t *data) {
  hash_buffer *hb = (hash_buffer *)b;
  uint64_t h = hb->h;
  size_t i;
  for (i = 0; i < len; i++) {
    h ^= data[i];
    h *= 0x100000001b3ull;
  }
  hb->h = h;
}

uint64_t ferry__spec_fingerprint(const ferry_spec_t *spec) {
  pb_spec m;
  hash_buffer hb = {{hash_append}, 0xcbf29ce484222325ull};
  uint64_t h;

  if (spec == NULL || ferry__spec_validate_impl(spec, NULL, NULL, NULL) != 0)
    return 0;
  build_msg(spec, &m);
  ferry__v1__pipeline_spec__pack_to_buffer(&m.msg, &hb.base);
  h = hb.h;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 33;
  return h;
}
