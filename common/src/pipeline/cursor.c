/* Checkpoint cursors: "FERRYCUR" then a ferry.v1.Cursor (cursor.h). */
#include "cursor.h"

#include <stdio.h>
#include <string.h>

#include "error_internal.h"
#include "ferry/v1/common.pb-c.h"
#include "pb_alloc.h"

static const char magic[8] = {'F', 'E', 'R', 'R', 'Y', 'C', 'U', 'R'};

int ferry__cursor_encode(const ferry_cursor_t *cur, uint8_t *buf, size_t cap,
                         size_t *len) {
  Ferry__V1__Cursor m = FERRY__V1__CURSOR__INIT;
  m.version = FERRY_CURSOR_VERSION;
  m.dataset_id = (char *)cur->dataset_id;
  m.shuffle = cur->shuffle;
  m.seed = cur->seed;
  m.epoch = cur->epoch;
  m.step = cur->step;
  m.world_size = cur->world_size;
  m.batch_size = cur->batch_size;
  m.pad = cur->pad;
  m.records_per_epoch = cur->records_per_epoch;
  Ferry__V1__CursorSegment segs[FERRY_CURSOR_MAX_CUTS];
  Ferry__V1__CursorSegment *ptrs[FERRY_CURSOR_MAX_CUTS];
  uint32_t nc = cur->ncuts < FERRY_CURSOR_MAX_CUTS ? cur->ncuts
                                                   : FERRY_CURSOR_MAX_CUTS;
  for (uint32_t i = 0; i < nc; i++) {
    ferry__v1__cursor_segment__init(&segs[i]);
    segs[i].world_size = cur->cuts[i].world_size;
    segs[i].step = cur->cuts[i].step;
    ptrs[i] = &segs[i];
  }
  m.n_earlier = nc;
  m.earlier = ptrs;
  size_t n = ferry__v1__cursor__get_packed_size(&m);
  *len = sizeof(magic) + n;
  if (cap < *len)
    return FERRY_ERANGE;
  memcpy(buf, magic, sizeof(magic));
  ferry__v1__cursor__pack(&m, buf + sizeof(magic));
  return 0;
}

int ferry__cursor_decode(const void *buf, size_t len, ferry_cursor_t *cur,
                         ferry_error_t *err) {
  const uint8_t *p = buf;
  memset(cur, 0, sizeof(*cur));
  if (len > FERRY_CURSOR_MAX_BYTES)
    return ferry__seterr(err, FERRY_EINVAL,
                         "cursor: %zu bytes, more than a cursor's %d", len,
                         FERRY_CURSOR_MAX_BYTES);
  if (len < sizeof(magic) || memcmp(p, magic, sizeof(magic)) != 0)
    return ferry__seterr(err, FERRY_EINVAL,
                         "cursor: not a Ferry cursor (%zu bytes not starting "
                         "with FERRYCUR)", len);
  Ferry__V1__Cursor *m = ferry__v1__cursor__unpack(
      &ferry__pb_allocator, len - sizeof(magic), p + sizeof(magic));
  if (m == NULL)
    return ferry__seterr(err, FERRY_EINVAL,
                         "cursor: malformed (%zu bytes)", len);
  int rc = 0;
  if (m->version != FERRY_CURSOR_VERSION)
    rc = ferry__seterr(err, FERRY_EINVAL,
                       "cursor: format version %u, this libferry reads %d",
                       m->version, FERRY_CURSOR_VERSION);
  else if (strlen(m->dataset_id) >= sizeof(cur->dataset_id))
    rc = ferry__seterr(err, FERRY_EINVAL,
                       "cursor: dataset id of %zu characters",
                       strlen(m->dataset_id));
  else if (m->world_size == 0 || m->batch_size == 0)
    rc = ferry__seterr(err, FERRY_EINVAL,
                       "cursor: world_size %u, batch_size %u",
                       m->world_size, m->batch_size);
  else if (m->n_earlier > FERRY_CURSOR_MAX_CUTS)
    rc = ferry__seterr(err, FERRY_EINVAL,
                       "cursor: %zu changes of world size in one epoch "
                       "(at most %d)", m->n_earlier, FERRY_CURSOR_MAX_CUTS);
  for (size_t i = 0; rc == 0 && i < m->n_earlier; i++)
    if (m->earlier[i]->world_size == 0)
      rc = ferry__seterr(err, FERRY_EINVAL,
                         "cursor: earlier cut %zu has world_size 0", i);
  if (rc == 0) {
    cur->version = m->version;
    snprintf(cur->dataset_id, sizeof(cur->dataset_id), "%s", m->dataset_id);
    cur->shuffle = m->shuffle;
    cur->seed = m->seed;
    cur->epoch = m->epoch;
    cur->step = m->step;
    cur->world_size = m->world_size;
    cur->batch_size = m->batch_size;
    cur->pad = m->pad;
    cur->records_per_epoch = m->records_per_epoch;
    cur->ncuts = (uint32_t)m->n_earlier;
    for (size_t i = 0; i < m->n_earlier; i++) {
      cur->cuts[i].world_size = m->earlier[i]->world_size;
      cur->cuts[i].step = m->earlier[i]->step;
    }
  }
  ferry__v1__cursor__free_unpacked(m, &ferry__pb_allocator);
  return rc;
}
