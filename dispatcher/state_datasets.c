/* RegisterDataset, the steps that run on the loop (state.h): checking the
 * request, reusing the splits of files this process scanned already, and
 * committing the dataset. The file I/O runs in scan.c, outside the state. */
#include "state_internal.h"
#include "state_apply.h"

/* Registrations of at least this many splits trim the heap after. */
#define TRIM_SPLITS 65536

/* FERRY_ENOSPC when the dispatcher holds its limit of datasets: checked
 * when a registration starts and again when it commits. */
static int dataset_room(const ferry_disp_t *d, ferry_error_t *err) {
  if (d->nds < d->cfg.max_datasets)
    return 0;
  return ferry__seterr(err, FERRY_ENOSPC,
                       "the dispatcher holds %zu datasets (its limit); a "
                       "dataset no job uses is dropped after --job-gc-ms",
                       d->nds);
}

/* Copies into *out the splits of `path` (file index `file` in the new
 * dataset) from a dataset this process scanned with the same parameters,
 * if the file did not change since `f` (its identity, stat'ed for this
 * registration). Returns true when the splits were copied (*rc: 0 or
 * FERRY_ENOMEM). Loop thread: reads d->ds. */
static bool reuse_scan(ferry_disp_t *d, const char *path, uint32_t file,
                       ferry_compression_t c, uint32_t per, const scanned_t *f,
                       splits_t *out, int *rc) {
  if (!f->valid)
    return false;
  for (size_t i = 0; i < d->nds; i++) {
    const dataset_t *ds = d->ds[i];
    if (ds->scanned == NULL || ds->scan_per != per ||
        ds->scan_compression != (int)c)
      continue;
    for (uint32_t k = 0; k < ds->nfiles; k++) {
      if (!ferry__disp_same_file(&ds->scanned[k], f) ||
          strcmp(ds->files[k], path) != 0)
        continue;
      *rc = 0;
      for (uint32_t s = 0; s < ds->nsplits && *rc == 0; s++)
        if (ds->splits[s].file == k) {
          split_t sp = ds->splits[s];
          sp.file = file;
          *rc = ferry__disp_push_split(out, &sp);
        }
      FERRY_LOG(FERRY_LOG_DEBUG, "%s: splits of dataset %s reused", path,
                ds->id);
      return true;
    }
  }
  return false;
}

static void fill_register_resp(const dataset_t *ds,
                               Ferry__V1__RegisterDatasetResponse *resp) {
  resp->dataset_id = ds->id;
  resp->num_records = ds->known_records;
  resp->num_files = ds->nfiles;
  resp->num_splits = ds->nsplits;
}

/* Builds and commits the RegisterDataset entry for the scanned splits. */
static int commit_dataset(ferry_disp_t *d, const char *id, const uint8_t *spec,
                          size_t spec_len, char **files, size_t nfiles,
                          const splits_t *sp, ferry_error_t *err) {
  Ferry__V1__JournalRegisterDataset m =
      FERRY__V1__JOURNAL_REGISTER_DATASET__INIT;
  Ferry__V1__Split *msgs = ferry__calloc(sp->n, sizeof(*msgs));
  Ferry__V1__Split **ptrs = ferry__calloc(sp->n, sizeof(*ptrs));
  int rc;

  if (msgs == NULL || ptrs == NULL) {
    ferry__free(msgs);
    ferry__free(ptrs);
    return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
  }
  for (size_t i = 0; i < sp->n; i++) {
    ferry__v1__split__init(&msgs[i]);
    msgs[i].index = (uint32_t)i;
    msgs[i].file_index = sp->v[i].file;
    msgs[i].byte_offset = sp->v[i].offset;
    msgs[i].byte_end = sp->v[i].end;
    msgs[i].first_record = sp->v[i].first;
    msgs[i].num_records = sp->v[i].count;
    ptrs[i] = &msgs[i];
  }
  m.dataset_id = (char *)id;
  m.spec.data = (uint8_t *)spec;
  m.spec.len = spec_len;
  m.files = files;
  m.n_files = nfiles;
  m.splits = ptrs;
  m.n_splits = sp->n;
  ENTRY(e, REGISTER_DATASET, register_dataset, m);
  rc = ferry__disp_commit(d, &e, err);
  ferry__free(msgs);
  ferry__free(ptrs);
  return rc;
}

/* Unpacks the request's spec by round-tripping it through its canonical
 * serialization (which validates it). */
static int request_spec(const Ferry__V1__PipelineSpec *pb, ferry_spec_t *spec,
                        ferry_error_t *err) {
  size_t n;
  uint8_t *buf;
  int rc;

  ferry__spec_init(spec);
  if (pb == NULL)
    return ferry__seterr(err, FERRY_ESPEC, "no pipeline spec in the request");
  n = protobuf_c_message_get_packed_size(&pb->base);
  if ((buf = ferry__malloc(n ? n : 1)) == NULL)
    return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
  protobuf_c_message_pack(&pb->base, buf);
  rc = ferry__spec_unpack(buf, n, spec, err);
  ferry__free(buf);
  return rc;
}

int ferry__disp_reg_begin(ferry_disp_t *d,
                          const Ferry__V1__RegisterDatasetRequest *req,
                          Ferry__V1__RegisterDatasetResponse *resp,
                          ferry_arena_t *a, int64_t now_ms,
                          ferry_disp_reg_t **out, ferry_error_t *err) {
  ferry_disp_reg_t *r;
  dataset_t *ds;
  int rc;

  *out = NULL;
  d->now = now_ms;
  if (req->records_per_split > (1u << 24))
    return ferry__seterr(err, FERRY_EINVAL, "records_per_split %u is over %u",
                         req->records_per_split, 1u << 24);
  if ((r = ferry__calloc(1, sizeof(*r))) == NULL)
    return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
  atomic_init(&r->cancel, false);
  r->per = req->records_per_split ? req->records_per_split
                                  : d->cfg.records_per_split;
  r->max_record_len = d->cfg.max_record_len;
  r->max_files = FERRY_DISP_MAX_FILES;
  r->roots = d->cfg.roots;
  if ((rc = request_spec(req->spec, &r->spec, err)) != 0)
    goto fail;
  if (r->spec.n_patterns > FERRY_DISP_MAX_PATTERNS) {
    rc = ferry__seterr(err, FERRY_EINVAL, "spec: over %d file patterns",
                       FERRY_DISP_MAX_PATTERNS);
    goto fail;
  }
  for (size_t i = 0; i < r->spec.n_patterns; i++)
    if ((rc = ferry__disp_check_len(r->spec.patterns[i],
                                    FERRY_DISP_MAX_PATTERN_LEN,
                                    "a file pattern", err)) != 0)
      goto fail;
  if ((rc = ferry__disp_check_len(r->spec.image_key, FERRY_DISP_MAX_NAME_LEN,
                                  "image key", err)) != 0 ||
      (rc = ferry__disp_check_len(r->spec.label_key, FERRY_DISP_MAX_NAME_LEN,
                                  "label key", err)) != 0)
    goto fail;
  if ((rc = ferry__spec_pack(&r->spec, &r->canon, &r->clen)) != 0) {
    ferry__seterr(err, rc, "pipeline spec: %s", ferry_strerror(rc));
    goto fail;
  }
  snprintf(r->id, sizeof(r->id), "%016" PRIx64,
           ferry__spec_fingerprint(&r->spec));
  if ((ds = ferry__disp_find_dataset(d, r->id)) != NULL) {
    fill_register_resp(ds, resp);
    if ((resp->dataset_id = ferry__arena_strdup(a, r->id)) == NULL)
      rc = ferry__seterr(err, FERRY_ENOMEM, "out of memory");
    goto fail; /* answered: nothing to scan */
  }
  if ((rc = dataset_room(d, err)) != 0)
    goto fail;
  *out = r;
  return 0;
fail:
  ferry__disp_reg_free(r);
  return rc;
}

bool ferry__disp_reg_same(const ferry_disp_reg_t *a,
                          const ferry_disp_reg_t *b) {
  return a->per == b->per && strcmp(a->id, b->id) == 0;
}

const char *ferry__disp_reg_id(const ferry_disp_reg_t *r) { return r->id; }

void ferry__disp_reg_reuse(ferry_disp_t *d, ferry_disp_reg_t *r) {
  if (r->rc != 0)
    return;
  for (size_t i = 0; i < r->nfiles; i++) {
    int rc = 0;
    if (reuse_scan(d, r->files[i], (uint32_t)i, r->spec.compression, r->per,
                   &r->scanned[i], &r->reused[i], &rc))
      r->reuse[i] = rc != 0 ? 2 : 1;
  }
}

int ferry__disp_reg_finish(ferry_disp_t *d, ferry_disp_reg_t *r,
                           Ferry__V1__RegisterDatasetResponse *resp,
                           ferry_arena_t *a, int64_t now_ms,
                           ferry_error_t *err) {
  dataset_t *ds;
  int rc;

  d->now = now_ms;
  if (r->rc != 0) {
    *err = r->err;
    return r->rc;
  }
  /* Registered meanwhile by a concurrent call of the same spec. */
  if ((ds = ferry__disp_find_dataset(d, r->id)) != NULL) {
    fill_register_resp(ds, resp);
  } else if ((rc = dataset_room(d, err)) != 0) {
    return rc;
  } else if ((rc = commit_dataset(d, r->id, r->canon, r->clen, r->files,
                                  r->nfiles, &r->sp, err)) != 0) {
    return rc;
  } else {
    ds = ferry__disp_find_dataset(d, r->id);
    ds->scanned = r->scanned;
    ds->scan_per = r->per;
    ds->scan_compression = (int)r->spec.compression;
    r->scanned = NULL;
    fill_register_resp(ds, resp);
    FERRY_LOG(FERRY_LOG_INFO,
              "dataset %s: %zu files, %zu splits, %" PRIu64 " known records",
              r->id, r->nfiles, r->sp.n, ds->known_records);
    /* The scan's list, the journal entry and its serialization were
     * transient copies of the split list (1,000,000 splits left ~150 MB
     * resident otherwise). */
    if (r->sp.n >= TRIM_SPLITS)
      ferry__disp_trim_heap();
  }
  if ((resp->dataset_id = ferry__arena_strdup(a, r->id)) == NULL)
    return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
  return 0;
}

int ferry__disp_register_dataset(ferry_disp_t *d,
                                 const Ferry__V1__RegisterDatasetRequest *req,
                                 Ferry__V1__RegisterDatasetResponse *resp,
                                 ferry_arena_t *a, int64_t now_ms,
                                 ferry_error_t *err) {
  ferry_disp_reg_t *r;
  int rc = ferry__disp_reg_begin(d, req, resp, a, now_ms, &r, err);
  if (rc != 0 || r == NULL)
    return rc;
  ferry__disp_reg_expand(r);
  ferry__disp_reg_reuse(d, r);
  ferry__disp_reg_scan(r);
  rc = ferry__disp_reg_finish(d, r, resp, a, now_ms, err);
  ferry__disp_reg_free(r);
  return rc;
}
