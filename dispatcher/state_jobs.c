/* Jobs: GetOrCreateJob and the operator's CancelJob. */
#include "state_jobs.h"
#include "state_apply.h"
#include "state_leases.h"
#include "state_ranks.h"

#include "cursor.h"
#include "job_names.h"

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

int ferry__disp_check_rank(const job_t *j, uint64_t client, int64_t rank,
                           ferry_error_t *err) {
  for (size_t i = 0; i < j->nclients; i++) {
    const client_t *o = &j->clients[i];
    if (o->id != client && o->active && o->rank == rank)
      return ferry__seterr(
          err, FERRY_EINVAL,
          "job '%s': rank %" PRId64 " is held by live client %" PRIu64
          "; client %" PRIu64 " asked for it too (a rank is taken over only "
          "once its client left or was declared lost)",
          j->name, rank, o->id, client);
  }
  return 0;
}

/* A cursor's cuts and step lie inside its epoch: each earlier
 * cut's step inside what the cuts before it left, and resume_step inside
 * what they all left, shared among world_size ranks. */
static int check_resume(const dataset_t *ds, const Ferry__V1__JobOptions *o,
                        ferry_error_t *err) {
  uint32_t nc = (uint32_t)o->n_resume_earlier;
  uint64_t n = ds->known_records, ranks = 0;
  if (o->n_resume_earlier > FERRY_CURSOR_MAX_CUTS)
    return ferry__seterr(err, FERRY_EINVAL,
                         "resume: %zu changes of world size in epoch %u "
                         "(at most %u)", o->n_resume_earlier,
                         o->resume_epoch, FERRY_CURSOR_MAX_CUTS);
  uint32_t cw[FERRY_CURSOR_MAX_CUTS + 1];
  uint64_t cs[FERRY_CURSOR_MAX_CUTS + 1];
  for (uint32_t i = 0; i <= nc; i++) {
    /* Cut i of what the cuts before it left: n records. */
    uint32_t w = i < nc ? o->resume_earlier[i]->world_size : o->world_size;
    uint64_t step = i < nc ? o->resume_earlier[i]->step : o->resume_step;
    if (w == 0 || w > FERRY_DISP_MAX_WORLD_SIZE)
      return ferry__seterr(err, FERRY_EINVAL,
                           "resume: cut %u of epoch %u has world_size %u "
                           "(1 to %u)", i, o->resume_epoch, w,
                           FERRY_DISP_MAX_WORLD_SIZE);
    uint64_t steps = ferry__disp_cut_steps(n, w, o->batch_size,
                                           o->pad_remainder);
    if (i == nc && nc > 0 && steps == 0)
      return ferry__seterr(err, FERRY_EINVAL,
                           "resume: what is left of epoch %u, %" PRIu64
                           " records, makes no step of world_size %u x "
                           "batch %u under drop: resume with fewer ranks, "
                           "or with %u ranks and change at the next epoch",
                           o->resume_epoch, n, w, o->batch_size,
                           o->resume_earlier[nc - 1]->world_size);
    if (step >= steps)
      return ferry__seterr(err, FERRY_EINVAL,
                           "resume: step %" PRIu64 " of epoch %u, but %s "
                           "has %" PRIu64 " steps", step, o->resume_epoch,
                           nc == 0 ? "an epoch"
                           : i < nc ? "that cut of it"
                                    : "what its earlier cuts left",
                           steps);
    ranks += w;
    if (i == nc)
      break;
    cw[i] = w;
    cs[i] = step;
    ferry__span_t *sp;
    uint32_t nsp;
    n = ferry__disp_left_spans(ds->known_records, o->batch_size,
                               o->pad_remainder, cw, cs, i + 1, &sp, &nsp);
    ferry__free(sp);
    if (n == UINT64_MAX)
      return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
  }
  /* A split is cut at rank boundaries and around what earlier cuts took:
   * its parts must stay apart in their leases (lease.h). */
  if (ranks * 3 + 3 > FERRY_LEASE_MAX_PARTS)
    return ferry__seterr(err, FERRY_EINVAL,
                         "resume: %" PRIu64 " ranks over the cuts of epoch "
                         "%u (at most %u)", ranks, o->resume_epoch,
                         (FERRY_LEASE_MAX_PARTS - 3) / 3);
  return 0;
}

/* A ranked job needs every split's count (the quotas are cut
 * from the epoch's size before it starts), a name (its ranks are separate
 * processes) and at least one step per epoch. */
static int check_ranked(const dataset_t *ds, const Ferry__V1__JobOptions *o,
                        uint32_t rank, ferry_error_t *err) {
  uint64_t round;
  if (o->world_size == 0)
    return 0;
  if (o->mode != FERRY__V1__JOB_MODE__JOB_MODE_DISTRIBUTED_EPOCH)
    return ferry__seterr(err, FERRY_EINVAL,
                         "job options: world_size needs mode "
                         "distributed_epoch");
  /* One rank (deterministic order for one trainer) may be a
   * private job. */
  if (o->job_name[0] == '\0' && o->world_size > 1)
    return ferry__seterr(err, FERRY_EINVAL,
                         "job options: world_size needs a job_name that "
                         "every rank joins");
  if (o->batch_size == 0)
    return ferry__seterr(err, FERRY_EINVAL,
                         "job options: world_size needs the batch size");
  if (o->world_size > FERRY_DISP_MAX_WORLD_SIZE)
    return ferry__seterr(err, FERRY_EINVAL,
                         "job options: world_size %u (at most %u)",
                         o->world_size, FERRY_DISP_MAX_WORLD_SIZE);
  if (rank >= o->world_size)
    return ferry__seterr(err, FERRY_EINVAL,
                         "rank %u out of range for world_size %u", rank,
                         o->world_size);
  for (uint32_t i = 0; i < ds->nsplits; i++)
    if (ds->splits[i].count == 0)
      return ferry__seterr(
          err, FERRY_ENOTSUP,
          "world_size: dataset %s has splits of unknown record count "
          "(%s: compressed, or a tail after a corrupt header); ranks need "
          "every count to cut equal steps",
          ds->id, ds->files[ds->splits[i].file]);
  round = (uint64_t)o->world_size * o->batch_size;
  if (ds->known_records == 0 ||
      (!o->pad_remainder && ds->known_records < round))
    return ferry__seterr(err, FERRY_EINVAL,
                         "world_size %u x batch %u = %" PRIu64 " records a "
                         "round, but dataset %s holds %" PRIu64 " a epoch: "
                         "no step under drop",
                         o->world_size, o->batch_size, round, ds->id,
                         ds->known_records);
  return check_resume(ds, o, err);
}

/* A client joining a ranked job (or an unranked one) agrees with
 * the job's world_size, batch size and policy, and its rank is free. */
static int check_join(const job_t *j, const Ferry__V1__JobOptions *o,
                      uint32_t rank, uint64_t client, ferry_error_t *err) {
  const client_t *first = j->nclients > 0 ? &j->clients[0] : NULL;
  if (o->world_size != j->world_size ||
      (j->world_size > 0 &&
       (o->batch_size != j->batch || o->pad_remainder != j->pad)))
    return ferry__seterr(
        err, FERRY_EINVAL,
        "job '%s': client %" PRIu64 " (rank %u) asks world_size %u, batch "
        "%u, %s; the job was created by client %" PRIu64 " (rank %" PRId64
        ") with world_size %u, batch %u, %s",
        j->name, client, rank, o->world_size, o->batch_size,
        o->pad_remainder ? "pad" : "drop", first ? first->id : 0,
        first ? first->rank : -1, j->world_size, j->batch,
        j->pad ? "pad" : "drop");
  if (j->world_size > 0)
    return ferry__disp_check_rank(j, client, rank, err);
  return 0;
}

/* Whether a resume at the options' cursor can join the running
 * job j as rank `rank`: j resumed at the same cursor, still runs its
 * epoch, and the rank is free and took nothing past the cursor (another
 * rank of the same restart made j). Else j is a run the restart
 * replaces. */
static bool resume_joins(const job_t *j, const Ferry__V1__JobOptions *o,
                         uint32_t rank) {
  if (j->world_size == 0 || j->resume_epoch != o->resume_epoch ||
      j->resume_step != o->resume_step || j->epoch != o->resume_epoch ||
      rank >= j->world_size || j->ncuts != o->n_resume_earlier)
    return false;
  for (uint32_t i = 0; i < j->ncuts; i++)
    if (j->cut_world[i] != o->resume_earlier[i]->world_size ||
        j->cut_step[i] != o->resume_earlier[i]->step)
      return false;
  for (size_t i = 0; i < j->nclients; i++)
    if (j->clients[i].active && j->clients[i].rank == (int64_t)rank)
      return false;
  uint64_t taken = j->started && j->rank_taken != NULL
                       ? j->rank_taken[rank]
                       : ferry__disp_resume_taken(j, rank);
  return taken == ferry__disp_resume_taken(j, rank);
}

/* Cancels job j, superseded by the job id next to be made. */
static int supersede(ferry_disp_t *d, job_t *j, ferry_error_t *err) {
  Ferry__V1__JournalJobCancelled m = FERRY__V1__JOURNAL_JOB_CANCELLED__INIT;
  m.job_id = j->id;
  m.superseded_by = d->next_job;
  ENTRY(e, JOB_CANCELLED, job_cancelled, m);
  int rc = ferry__disp_commit(d, &e, err);
  if (rc == 0)
    FERRY_LOG(FERRY_LOG_INFO, "job %" PRIu64 " ('%s'): superseded by job "
              "%" PRIu64 ", resumed from a cursor", j->id, j->name,
              m.superseded_by);
  return rc;
}

/* The job's epochs: the options', else the spec's repeat(). */
static int64_t job_epochs(const dataset_t *ds, const Ferry__V1__JobOptions *o) {
  if (o->num_epochs != 0)
    return o->num_epochs;
  return ds->spec.repeat == 0 ? 1 : ds->spec.repeat;
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
  m.num_epochs = job_epochs(ds, o);
  /* The job's shuffle overrides the spec's when set. */
  m.shuffle = o->shuffle || ds->spec.shuffle;
  m.seed = o->shuffle ? o->shuffle_seed : ds->spec.shuffle_seed;
  m.error_policy = o->error_policy;
  m.world_size = o->world_size;
  m.batch_size = o->world_size > 0 ? o->batch_size : 0;
  m.pad_remainder = o->world_size > 0 && o->pad_remainder;
  m.share = o->share;
  m.resume_epoch = o->world_size > 0 ? o->resume_epoch : 0;
  m.resume_step = o->world_size > 0 ? o->resume_step : 0;
  if (o->world_size > 0 && o->resume) {
    m.n_resume_earlier = o->n_resume_earlier;
    m.resume_earlier = o->resume_earlier;
  }
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
  if ((rc = check_options(o, err)) != 0 ||
      (rc = check_ranked(ds, o, req->rank, err)) != 0)
    return rc;
  client = d->next_client;
  bool resume = o->world_size > 0 && o->resume;
  if (resume && job_epochs(ds, o) >= 0 &&
      o->resume_epoch >= job_epochs(ds, o))
    return ferry__seterr(err, FERRY_EINVAL,
                         "resume: epoch %u, but the job has %" PRId64
                         " epochs", o->resume_epoch, job_epochs(ds, o));
  if (resume && o->job_name[0] != '\0' &&
      (j = find_named_job(d, o->job_name)) != NULL &&
      !resume_joins(j, o, req->rank)) {
    if ((rc = supersede(d, j, err)) != 0)
      return rc;
    j = NULL;
  }
  if (o->job_name[0] != '\0' && (j = find_named_job(d, o->job_name))) {
    if (j->ds != ds || j->mode != (int)o->mode)
      return ferry__seterr(err, FERRY_EINVAL,
                           "job '%s' already runs dataset %s in mode %s",
                           o->job_name, j->ds->id,
                           ferry__job_mode_name(j->mode));
    if ((rc = check_join(j, o, req->rank, client, err)) != 0)
      return rc;
  } else {
    if ((rc = create_job(d, ds, o, &j, err)) != 0)
      return rc;
    resp->created = true;
  }
  uint8_t *secret = ferry__arena_alloc(a, FERRY_CLIENT_SECRET_BYTES);
  if (secret == NULL)
    return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
  if ((rc = ferry__rpc_random(secret, FERRY_CLIENT_SECRET_BYTES)) != 0)
    return ferry__seterr(err, rc, "getrandom: %s", ferry_strerror(rc));
  if ((rc = ferry__disp_emit_client_joined(
           d, j, client, secret,
           j->world_size > 0 ? (int64_t)req->rank : -1, err)) != 0)
    return rc;
  resp->client_secret.data = secret;
  resp->client_secret.len = FERRY_CLIENT_SECRET_BYTES;
  ferry__disp_schedule_job(d, j);
  resp->job_id = j->id;
  resp->client_id = client;
  resp->num_epochs = j->num_epochs;
  resp->records_per_epoch = ds->known_records;
  resp->client_timeout_ms = d->cfg.client_timeout_ms;
  if (j->world_size > 0) {
    /* An epoch of the whole dataset, and the current one (an
     * epoch resumed with another world size shares only what its earlier
     * cuts left). */
    uint64_t n = ds->known_records;
    resp->steps_per_epoch =
        ferry__disp_cut_steps(n, j->world_size, j->batch, j->pad);
    resp->rank_records =
        ferry__disp_cut_quota(n, j->world_size, j->batch, j->pad, req->rank);
    resp->dropped_per_epoch =
        j->pad ? 0 : n - resp->steps_per_epoch * j->batch * j->world_size;
    resp->epoch_steps = ferry__disp_rank_steps(j);
    resp->epoch_rank_records = ferry__disp_rank_quota(j, req->rank);
    if (j->ncuts > 0 && j->epoch == j->resume_epoch) {
      Ferry__V1__CursorSegment *cs =
          ferry__arena_alloc(a, j->ncuts * sizeof(*cs));
      Ferry__V1__CursorSegment **cp =
          ferry__arena_alloc(a, j->ncuts * sizeof(*cp));
      if (cs == NULL || cp == NULL)
        return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
      for (uint32_t i = 0; i < j->ncuts; i++) {
        ferry__v1__cursor_segment__init(&cs[i]);
        cs[i].world_size = j->cut_world[i];
        cs[i].step = j->cut_step[i];
        cp[i] = &cs[i];
      }
      resp->n_epoch_earlier = j->ncuts;
      resp->epoch_earlier = cp;
    }
    resp->epoch = j->epoch;
    resp->rank_taken = j->started && j->rank_taken != NULL
                           ? j->rank_taken[req->rank]
                           : ferry__disp_resume_taken(j, req->rank);
  }
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
