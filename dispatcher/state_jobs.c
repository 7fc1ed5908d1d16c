/* Jobs: GetOrCreateJob and the operator's CancelJob. */
#include "state_internal.h"

#include "ferry/job_names.h"

static job_t *find_named_job(ferry_disp_t *d, const char *name) {
  for (size_t i = 0; i < d->njobs; i++)
    if (RUNNING(d->jobs[i]) && strcmp(d->jobs[i]->name, name) == 0)
      return d->jobs[i];
  return NULL;
}

static int check_options(const Ferry__V1__JobOptions *o, ferry_error_t *err) {
  if (o->mode != FERRY__V1__JOB_MODE__JOB_MODE_DISTRIBUTED_EPOCH &&
      o->mode != FERRY__V1__JOB_MODE__JOB_MODE_PARALLEL_EPOCHS)
    return ferry__seterr(err, FERRY_EINVAL, "job options: unknown mode %d",
                         (int)o->mode);
  if (o->error_policy != FERRY__V1__ERROR_POLICY__ERROR_POLICY_FAIL &&
      o->error_policy != FERRY__V1__ERROR_POLICY__ERROR_POLICY_SKIP)
    return ferry__seterr(err, FERRY_EINVAL,
                         "job options: unknown error policy %d",
                         (int)o->error_policy);
  if (o->num_epochs < -1)
    return ferry__seterr(err, FERRY_EINVAL,
                         "job options: num_epochs %" PRId64
                         " (want >= 1, 0 for the spec's, -1 infinite)",
                         o->num_epochs);
  return 0;
}

static int create_job(ferry_disp_t *d, dataset_t *ds,
                      const Ferry__V1__JobOptions *o, job_t **out,
                      ferry_error_t *err) {
  Ferry__V1__JournalCreateJob m = FERRY__V1__JOURNAL_CREATE_JOB__INIT;
  int rc;

  m.job_id = d->next_job;
  m.dataset_id = ds->id;
  m.name = o->job_name;
  m.mode = o->mode;
  m.num_epochs = o->num_epochs;
  if (m.num_epochs == 0)
    m.num_epochs = ds->spec.repeat == 0 ? 1 : ds->spec.repeat;
  /* The job's shuffle overrides the spec's when set. */
  m.shuffle = o->shuffle || ds->spec.shuffle;
  m.seed = o->shuffle ? o->shuffle_seed : ds->spec.shuffle_seed;
  m.error_policy = o->error_policy;
  ENTRY(e, CREATE_JOB, create_job, m);
  if ((rc = ferry__disp_commit(d, &e, err)) != 0)
    return rc;
  *out = ferry__disp_find_job(d, m.job_id);
  return 0;
}

int ferry__disp_get_or_create_job(ferry_disp_t *d,
                                  const Ferry__V1__GetOrCreateJobRequest *req,
                                  Ferry__V1__GetOrCreateJobResponse *resp,
                                  ferry_arena_t *a, int64_t now_ms,
                                  ferry_error_t *err) {
  Ferry__V1__JobOptions defaults = FERRY__V1__JOB_OPTIONS__INIT;
  const Ferry__V1__JobOptions *o = req->options ? req->options : &defaults;
  dataset_t *ds = ferry__disp_find_dataset(d, req->dataset_id);
  ProtobufCAllocator al;
  job_t *j = NULL;
  uint64_t client;
  int rc;

  d->now = now_ms;
  if ((rc = ferry__disp_check_len(req->dataset_id, FERRY_DISP_MAX_NAME_LEN,
                                  "dataset_id", err)) != 0 ||
      (rc = ferry__disp_check_len(o->job_name, FERRY_DISP_MAX_NAME_LEN,
                                  "job_name", err)) != 0)
    return rc;
  if (ds == NULL)
    return ferry__seterr(err, FERRY_ENOENT, "dataset %s is not registered",
                         req->dataset_id);
  if ((rc = check_options(o, err)) != 0)
    return rc;
  if (o->job_name[0] != '\0' && (j = find_named_job(d, o->job_name))) {
    if (j->ds != ds || j->mode != (int)o->mode)
      return ferry__seterr(err, FERRY_EINVAL,
                           "job '%s' already runs dataset %s in mode %s",
                           o->job_name, j->ds->id,
                           ferry__job_mode_name(j->mode));
  } else {
    if ((rc = create_job(d, ds, o, &j, err)) != 0)
      return rc;
    resp->created = true;
  }
  client = d->next_client;
  uint8_t *secret = ferry__arena_alloc(a, FERRY_CLIENT_SECRET_BYTES);
  if (secret == NULL)
    return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
  if ((rc = ferry_rpc_random(secret, FERRY_CLIENT_SECRET_BYTES)) != 0)
    return ferry__seterr(err, rc, "getrandom: %s", ferry_strerror(rc));
  if ((rc = ferry__disp_emit_client_joined(d, j, client, secret, err)) != 0)
    return rc;
  resp->client_secret.data = secret;
  resp->client_secret.len = FERRY_CLIENT_SECRET_BYTES;
  ferry__disp_schedule(d);
  resp->job_id = j->id;
  resp->client_id = client;
  resp->num_epochs = j->num_epochs;
  resp->records_per_epoch = ds->known_records;
  resp->client_timeout_ms = d->cfg.client_timeout_ms;
  ferry__disp_arena_allocator(a, &al);
  resp->spec =
      ferry__v1__pipeline_spec__unpack(&al, ds->spec_len, ds->spec_bytes);
  if (resp->spec == NULL)
    return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
  return 0;
}

int ferry__disp_cancel_job(ferry_disp_t *d,
                           const Ferry__V1__CancelJobRequest *req,
                           Ferry__V1__CancelJobResponse *resp, ferry_arena_t *a,
                           int64_t now_ms, ferry_error_t *err) {
  job_t *j = ferry__disp_find_job(d, req->job_id);
  Ferry__V1__JournalJobCancelled m = FERRY__V1__JOURNAL_JOB_CANCELLED__INIT;
  int rc;

  (void)a;
  d->now = now_ms;
  if (j == NULL)
    return ferry__seterr(err, FERRY_ENOENT, "CancelJob: no job %" PRIu64,
                         req->job_id);
  resp->job_id = j->id;
  resp->state = j->state;
  if (j->state == FERRY__V1__JOB_STATE__JOB_STATE_CANCELLED) {
    resp->already = true;
    return 0;
  }
  if (!RUNNING(j))
    return ferry__seterr(err, FERRY_EGRPC_FAILED_PRECONDITION,
                         "CancelJob: job %" PRIu64 " already %s; nothing to "
                         "cancel",
                         j->id, ferry__job_state_name(j->state));
  m.job_id = j->id;
  ENTRY(e, JOB_CANCELLED, job_cancelled, m);
  if ((rc = ferry__disp_commit(d, &e, err)) != 0)
    return rc;
  FERRY_LOG(FERRY_LOG_WARN, "job %" PRIu64 " cancelled by the operator", j->id);
  resp->state = j->state;
  return 0;
}
