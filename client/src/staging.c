/* The staging ring: where batch slots get their memory and how a full
 * slot becomes the trainer's tensor.
 *
 * Every buffer is allocated once, in ferry__staging_alloc, `prefetch`
 * slots deep: the uint8 images the assembler copies records into (pinned
 * with GPU staging, so the copy to the device is a DMA; page-aligned
 * otherwise), labels, ids, and per mode the output: the CPU twin's host
 * buffer, or the device side (staging.h). Preparing and releasing a batch
 * allocate nothing.
 *
 * Also the DLPack export, whose tensor is static storage of the slot.
 */
#include <stddef.h>
#include <string.h>

#include "alloc.h"
#include "augment.h"
#include "client_internal.h"
#include "ferry/log.h"
#include "staging.h"

#define PAGE 4096

int ferry__staging_check(ferry_client_t *c, bool fallback,
                         ferry_error_t *err) {
  ferry__asm_params_t *ap = &c->ap;
  if ((unsigned)ap->dtype > FERRY_DTYPE_BFLOAT16)
    return ferry__seterr(err, FERRY_EINVAL, "client: unknown dtype %d",
                         (int)ap->dtype);
  if ((unsigned)ap->layout > FERRY_LAYOUT_NCHW)
    return ferry__seterr(err, FERRY_EINVAL, "client: unknown layout %d",
                         (int)ap->layout);
  if (ap->gpu) {
    ferry_error_t e = {0};
    int n = ferry_cuda_available(&e);
    if (n > 0 && (ap->device < 0 || ap->device >= n))
      return ferry__seterr(err, FERRY_EINVAL,
                           "client: CUDA device %d requested but %d "
                           "device%s present", ap->device, n,
                           n == 1 ? " is" : "s are");
    if (n <= 0 && !fallback)
      return ferry__seterr(err, FERRY_ENOTSUP,
                           "client: GPU staging on device %d: %s "
                           "(set device_fallback for host batches)",
                           ap->device, e.msg);
    if (n <= 0) {
      FERRY_LOG(FERRY_LOG_WARN,
                "client: GPU staging on device %d unavailable (%s): host "
                "batches instead", ap->device, e.msg);
      ap->gpu = false;
    }
  }
  /* The augmentation against the image shape (1-pixel images cannot be
   * rotated), once the shape is known. */
  if (ap->height > 0 && ap->width > 0 && ap->channels > 0 &&
      (ap->gpu || ap->has_augment)) {
    static const uint8_t probe;
    int rc = ferry__augment_check(&ap->augment, &probe,
                                  ap->batch_size ? ap->batch_size : 1,
                                  ap->height,
                                  ap->width, ap->channels, &probe, ap->dtype,
                                  ap->layout, "client: augment", err);
    if (rc != 0)
      return rc;
  }
  c->stg_mode = ap->gpu           ? FERRY__STG_GPU
                : ap->has_augment ? FERRY__STG_CPU
                                  : FERRY__STG_RAW;
  return 0;
}

/* The batch fields that stay fixed for a slot's life. */
static void fill_batch(ferry_client_t *c, uint32_t i) {
  ferry__slot_t *s = &c->slots[i];
  ferry_batch_t *b = &s->batch;
  b->images = s->images;
  b->labels = s->labels;
  b->ids = s->ids;
  b->height = c->ap.height;
  b->width = c->ap.width;
  b->channels = c->ap.channels;
  b->raw = c->stg_mode == FERRY__STG_RAW;
  b->output = b->raw ? (const void *)s->images : s->out;
  b->dtype = c->ap.dtype;
  b->layout = b->raw ? FERRY_LAYOUT_NHWC : c->ap.layout;
  b->device = c->stg_mode == FERRY__STG_GPU ? c->ap.device : -1;
  b->ready_event = c->stg_mode == FERRY__STG_GPU
                       ? ferry__stg_gpu_ready(c->gpu, i)
                       : NULL;
}

int ferry__staging_alloc(ferry_client_t *c, ferry_error_t *err) {
  const ferry__asm_params_t *ap = &c->ap;
  size_t img = c->record_bytes * ap->batch_size;
  int rc;
  c->out_bytes = 0;
  if (c->stg_mode != FERRY__STG_RAW) {
    c->out_bytes = ferry_augment_out_bytes(ap->batch_size, ap->height,
                                           ap->width, ap->channels,
                                           ap->dtype);
    if (c->out_bytes == 0)
      return ferry__seterr(err, FERRY_ERANGE,
                           "client: augmented batch too large");
  }
  for (uint32_t i = 0; i < ap->prefetch; i++) {
    ferry__slot_t *s = &c->slots[i];
    if (c->stg_mode == FERRY__STG_GPU) {
      rc = ferry__stg_pinned_alloc(img > 0 ? img : PAGE, (void **)&s->images,
                                   err);
      if (rc != 0)
        return rc;
    } else {
      s->images = ferry__aligned_alloc(PAGE, img > 0 ? img : PAGE);
    }
    if (c->stg_mode == FERRY__STG_CPU)
      s->out = ferry__aligned_alloc(PAGE, c->out_bytes);
    s->labels = ferry__calloc(ap->batch_size, sizeof(*s->labels));
    s->ids = ferry__calloc(ap->batch_size, sizeof(*s->ids));
    s->segs = ferry__calloc(ap->batch_size, sizeof(*s->segs));
    s->det_bits = ferry__calloc((ap->batch_size + 63) / 64, sizeof(uint64_t));
    if (s->images == NULL || s->labels == NULL || s->ids == NULL ||
        s->segs == NULL || s->det_bits == NULL ||
        (c->stg_mode == FERRY__STG_CPU && s->out == NULL))
      return ferry__seterr(err, FERRY_ENOMEM,
                           "client: out of memory for %u batch slots",
                           ap->prefetch);
  }
  if (c->stg_mode == FERRY__STG_GPU) {
    rc = ferry__stg_gpu_open(ap->device, ap->prefetch, img, c->out_bytes,
                             &c->gpu, err);
    if (rc != 0)
      return rc;
    for (uint32_t i = 0; i < ap->prefetch; i++)
      c->slots[i].out = ferry__stg_gpu_out(c->gpu, i);
  }
  for (uint32_t i = 0; i < ap->prefetch; i++)
    fill_batch(c, i);
  return 0;
}

void ferry__staging_free(ferry_client_t *c) {
  if (c->slots == NULL)
    return;
  /* The device first: it may still read the pinned slots. */
  ferry__stg_gpu_close(c->gpu);
  c->gpu = NULL;
  for (uint32_t i = 0; i < c->ap.prefetch; i++) {
    ferry__slot_t *s = &c->slots[i];
    if (c->stg_mode == FERRY__STG_GPU) {
      ferry__stg_pinned_free(s->images);
    } else {
      ferry__aligned_free(s->images);
      if (c->stg_mode == FERRY__STG_CPU)
        ferry__aligned_free(s->out);
    }
    ferry__free(s->labels);
    ferry__free(s->ids);
    ferry__free(s->segs);
    ferry__free(s->det_bits);
    s->det_bits = NULL;
    s->images = NULL;
    s->out = NULL;
    s->labels = NULL;
    s->ids = NULL;
    s->segs = NULL;
  }
}

int ferry__staging_prepare(ferry_client_t *c, ferry__slot_t *s,
                           ferry_error_t *err) {
  const ferry__asm_params_t *ap = &c->ap;
  switch (c->stg_mode) {
  case FERRY__STG_CPU:
    return ferry_augment_batch_cpu(&ap->augment, ap->augment_seed, s->epoch,
                                   s->index, s->images, s->size, ap->height,
                                   ap->width, ap->channels, s->out, ap->dtype,
                                   ap->layout, err);
  case FERRY__STG_GPU:
    return ferry__stg_gpu_submit(c->gpu, (uint32_t)(s - c->slots), s->images,
                                 s->size, ap->height, ap->width,
                                 ap->channels, &ap->augment, ap->augment_seed,
                                 s->epoch, s->index, ap->dtype, ap->layout,
                                 err);
  default:
    return 0;
  }
}

int ferry__staging_release(ferry_client_t *c, ferry__slot_t *s, bool ordered,
                           void *stream, ferry_error_t *err) {
  if (c->stg_mode != FERRY__STG_GPU)
    return 0;
  return ferry__stg_gpu_release(c->gpu, (uint32_t)(s - c->slots), ordered,
                                stream, err);
}

int ferry__staging_wait_stream(ferry_client_t *c, ferry__slot_t *s,
                               void *stream, ferry_error_t *err) {
  if (c->stg_mode != FERRY__STG_GPU)
    return 0;
  return ferry__stg_gpu_wait(c->gpu, (uint32_t)(s - c->slots), stream, err);
}

/* ---- DLPack ------------------------------------------------------------ */

static void dl_deleter(DLManagedTensor *self) {
  ferry__dl_t *dl = self->manager_ctx;
  ferry_batch_release_after(dl->client, &dl->slot->batch, NULL);
}

int ferry_batch_to_dlpack(ferry_client_t *c, const ferry_batch_t *batch,
                          DLManagedTensor **out) {
  ferry__slot_t *s = NULL;
  if (out != NULL)
    *out = NULL;
  if (c == NULL || batch == NULL || out == NULL)
    return FERRY_EINVAL;
  int rc = ferry__client_forked(c, NULL);
  if (rc != 0)
    return rc;
  for (uint32_t i = 0; i < c->ap.prefetch; i++)
    if (&c->slots[i].batch == batch)
      s = &c->slots[i];
  if (s == NULL)
    return FERRY_EINVAL;
  pthread_mutex_lock(&c->mu);
  if (s->state != FERRY__SLOT_HANDED || s->exported) {
    pthread_mutex_unlock(&c->mu);
    return FERRY_EINVAL;
  }
  s->exported = true;
  pthread_mutex_unlock(&c->mu);

  const ferry_batch_t *b = &s->batch;
  ferry__dl_t *dl = &s->dl;
  DLTensor *t = &dl->mt.dl_tensor;
  memset(dl, 0, sizeof(*dl));
  dl->client = c;
  dl->slot = s;
  dl->shape[0] = b->size;
  if (!b->raw && b->layout == FERRY_LAYOUT_NCHW) {
    dl->shape[1] = b->channels;
    dl->shape[2] = b->height;
    dl->shape[3] = b->width;
  } else {
    dl->shape[1] = b->height;
    dl->shape[2] = b->width;
    dl->shape[3] = b->channels;
  }
  t->data = (void *)b->output;
  t->device.device_type = b->device >= 0 ? kDLCUDA : kDLCPU;
  t->device.device_id = b->device >= 0 ? b->device : 0;
  t->ndim = 4;
  t->shape = dl->shape;
  t->strides = NULL;
  t->byte_offset = 0;
  t->dtype.lanes = 1;
  if (b->raw) {
    t->dtype.code = kDLUInt;
    t->dtype.bits = 8;
  } else if (b->dtype == FERRY_DTYPE_FLOAT16) {
    t->dtype.code = kDLFloat;
    t->dtype.bits = 16;
  } else if (b->dtype == FERRY_DTYPE_BFLOAT16) {
    t->dtype.code = kDLBfloat;
    t->dtype.bits = 16;
  } else {
    t->dtype.code = kDLFloat;
    t->dtype.bits = 32;
  }
  dl->mt.manager_ctx = dl;
  dl->mt.deleter = dl_deleter;
  *out = &dl->mt;
  return 0;
}
