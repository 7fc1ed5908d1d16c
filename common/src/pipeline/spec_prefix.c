/* The deterministic prefix of a pipeline (spec.h): the rule that says which
 * leading stages depend only on the record, the prefix as a spec of its
 * own, and its fingerprint, which keys the worker's prefix cache. */
#include <string.h>

#include "alloc.h"
#include "spec.h"

/* Bumped when what a prefix produces changes for the same spec (an op's
 * arithmetic), so old cache entries stop matching. */
#define PREFIX_FORMAT_VERSION 1u

static bool op_is_deterministic(const ferry_image_op_t *op) {
  switch (op->kind) {
  case FERRY_OP_RESIZE:
  case FERRY_OP_DILATE:
  case FERRY_OP_BLUR:
  case FERRY_OP_RESIZE_SHORTER:
  case FERRY_OP_CENTER_CROP:
    return true;
  case FERRY_OP_RANDOM_RESIZED_CROP:
  default:
    return false;
  }
}

int ferry__spec_det_prefix(const ferry_spec_t *spec, const char **why) {
  static const char *fused =
      "decode(jpeg) fuses with random_resized_crop (the decode depends on "
      "the crop drawn for the epoch)";
  if (why != NULL)
    *why = NULL;
  /* The fused JPEG decode and a random first crop are one step whose
   * pixels depend on the crop: decoding the whole image instead would
   * give other pixels (the DCT scale), so nothing before the random op
   * can be cached. */
  if (spec->format == FERRY_IMAGE_JPEG && spec->n_ops > 0 &&
      spec->ops[0].kind == FERRY_OP_RANDOM_RESIZED_CROP &&
      !spec->ops[0].exact) {
    if (why != NULL)
      *why = fused;
    return -1;
  }
  size_t n = 0;
  while (n < spec->n_ops && op_is_deterministic(&spec->ops[n]))
    n++;
  if (n == spec->n_ops && why != NULL)
    *why = "the whole pipeline depends only on the record";
  else if (why != NULL)
    *why = "the ops up to the first random one depend only on the record";
  return (int)n;
}

int ferry__spec_prefix(const ferry_spec_t *spec, size_t n_ops,
                       ferry_spec_t *out) {
  char star[] = "*";
  char *any[1] = {star};
  ferry_spec_t tmp = *spec;
  if (n_ops > spec->n_ops)
    return FERRY_EINVAL;
  /* The shard's identity keys an entry, not the dataset's globs; the
   * stages after the prefix and the epoch-level stages are not part of
   * what it produces. */
  tmp.patterns = any;
  tmp.n_patterns = 1;
  tmp.n_ops = n_ops;
  tmp.shuffle = false;
  tmp.shuffle_seed = 0;
  tmp.batch_size = 0;
  tmp.drop_remainder = false;
  tmp.repeat = 1;
  /* A later resize makes any JPEG size acceptable to the whole pipeline;
   * the prefix must accept the same records. */
  for (size_t i = n_ops; i < spec->n_ops; i++)
    if (spec->ops[i].kind != FERRY_OP_DILATE &&
        spec->ops[i].kind != FERRY_OP_BLUR &&
        spec->format == FERRY_IMAGE_JPEG) {
      bool resized = false;
      for (size_t j = 0; j < n_ops; j++)
        if (spec->ops[j].kind != FERRY_OP_DILATE &&
            spec->ops[j].kind != FERRY_OP_BLUR)
          resized = true;
      if (!resized)
        tmp.height = tmp.width = 0;
      break;
    }
  return ferry__spec_copy(out, &tmp);
}

uint64_t ferry__spec_prefix_fingerprint(const ferry_spec_t *spec,
                                        size_t n_ops) {
  ferry_spec_t p;
  if (ferry__spec_prefix(spec, n_ops, &p) != 0)
    return 0;
  uint64_t h = ferry__spec_fingerprint(&p);
  ferry__spec_close(&p);
  if (h == 0)
    return 0;
  h ^= (uint64_t)PREFIX_FORMAT_VERSION * 0x9E3779B97F4A7C15ull;
  h = (h ^ (h >> 31)) * 0xBF58476D1CE4E5B9ull;
  h ^= h >> 29;
  return h != 0 ? h : 1;
}
