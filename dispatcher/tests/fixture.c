/* Shared helpers of the dispatcher's tests (see fixture.h). */
#include "fixture.h"

#include <criterion/criterion.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "alloc.h"
#include "spec.h"

ferry_arena_t fx_arena;
char fx_dir[64];
fx_entries_t fx_entries;

static int rm_one(const char *p, const struct stat *sb, int flag,
                  struct FTW *f) {
  return remove(p);
}

void fx_setup(void) {
  snprintf(fx_dir, sizeof(fx_dir), "/tmp/ferry-disp-XXXXXX");
  cr_assert_not_null(mkdtemp(fx_dir));
}

void fx_teardown(void) {
  for (size_t i = 0; i < fx_entries.n; i++)
    free(fx_entries.e[i]);
  free(fx_entries.e);
  free(fx_entries.len);
  memset(&fx_entries, 0, sizeof(fx_entries));
  ferry__arena_free(&fx_arena);
  nftw(fx_dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

static ferry_alloc_stats_t baseline;

void fx_begin(void) {
  ferry__alloc_stats(&baseline);
  fx_setup();
}

void fx_end(ferry_disp_t **d) {
  ferry_alloc_stats_t now;
  ferry__disp_free(*d);
  *d = NULL;
  fx_teardown();
  ferry__alloc_stats(&now);
  cr_expect_eq(now.blocks, baseline.blocks, "%lld blocks leaked",
               (long long)(now.blocks - baseline.blocks));
}

const char *fx_write(const char *name, int n, ferry_compression_t c) {
  static char paths[4][256];
  static int next;
  char *path = paths[next++ % 4];
  ferry_tfr_writer_t *w;
  ferry_error_t err = {0};
  uint8_t buf[64];

  snprintf(path, 256, "%s/%s", fx_dir, name);
  cr_assert_eq(ferry__tfr_writer_open(path, c, &w, &err), 0, "%s", err.msg);
  for (int i = 0; i < n; i++) {
    size_t len = 1 + (size_t)(i * 7) % 50;
    memset(buf, 'a' + i % 26, len);
    cr_assert_eq(ferry__tfr_writer_write(w, buf, len, &err), 0, "%s", err.msg);
  }
  cr_assert_eq(ferry__tfr_writer_close(w, &err), 0, "%s", err.msg);
  return path;
}

static void keep_entry(const uint8_t *e, size_t len, void *arg) {
  size_t n = fx_entries.n + 1;
  fx_entries.e = realloc(fx_entries.e, n * sizeof(uint8_t *));
  fx_entries.len = realloc(fx_entries.len, n * sizeof(size_t));
  fx_entries.e[n - 1] = malloc(len ? len : 1);
  memcpy(fx_entries.e[n - 1], e, len);
  fx_entries.len[n - 1] = len;
  fx_entries.n = n;
}

ferry_disp_t *fx_state(int64_t worker_to, int64_t client_to, int64_t gc,
                       uint32_t per_split) {
  ferry_disp_config_t cfg;
  ferry_disp_t *d;
  ferry__disp_config_init(&cfg);
  cfg.worker_timeout_ms = worker_to;
  cfg.client_timeout_ms = client_to;
  cfg.job_gc_ms = gc;
  cfg.records_per_split = per_split;
  cr_assert_eq(ferry__disp_new(&cfg, 0, &d), 0);
  ferry__disp_set_sink(d, keep_entry, NULL);
  return d;
}

int fx_register(ferry_disp_t *d, const char *spec_text, uint32_t per_split,
                Ferry__V1__RegisterDatasetResponse **resp, int64_t now,
                ferry_error_t *err) {
  Ferry__V1__RegisterDatasetRequest req =
      FERRY__V1__REGISTER_DATASET_REQUEST__INIT;
  ProtobufCAllocator al;
  ferry_spec_t spec;
  uint8_t *buf;
  size_t len;

  cr_assert_eq(ferry__spec_parse(spec_text, &spec, err), 0, "%s", err->msg);
  cr_assert_eq(ferry__spec_pack(&spec, &buf, &len), 0);
  ferry__spec_close(&spec);
  ferry__disp_arena_allocator(&fx_arena, &al);
  req.spec = ferry__v1__pipeline_spec__unpack(&al, len, buf);
  ferry_free(buf);
  cr_assert_not_null(req.spec);
  req.records_per_split = per_split;
  *resp = ferry__arena_alloc(&fx_arena, sizeof(**resp));
  ferry__v1__register_dataset_response__init(*resp);
  return ferry__disp_register_dataset(d, &req, *resp, &fx_arena, now, err);
}

Ferry__V1__JournalRegisterDataset *fx_last_dataset(void) {
  ProtobufCAllocator al;
  ferry__disp_arena_allocator(&fx_arena, &al);
  for (size_t i = fx_entries.n; i-- > 0;) {
    Ferry__V1__JournalEntry *e = ferry__v1__journal_entry__unpack(
        &al, fx_entries.len[i], fx_entries.e[i]);
    cr_assert_not_null(e);
    if (e->entry_case == FERRY__V1__JOURNAL_ENTRY__ENTRY_REGISTER_DATASET)
      return e->register_dataset;
  }
  cr_assert_fail("no RegisterDataset entry");
  return NULL;
}

/* The client secrets fx_job received, for fx_sign. */
static struct {
  uint64_t job, client;
  uint8_t secret[16];
} secrets[1024];
static size_t n_secrets;

Ferry__V1__GetOrCreateJobResponse *fx_job(ferry_disp_t *d, const char *id,
                                          const char *name, int mode,
                                          int64_t epochs, int policy,
                                          int64_t now) {
  Ferry__V1__GetOrCreateJobRequest req =
      FERRY__V1__GET_OR_CREATE_JOB_REQUEST__INIT;
  Ferry__V1__JobOptions o = FERRY__V1__JOB_OPTIONS__INIT;
  Ferry__V1__GetOrCreateJobResponse *resp;
  ferry_error_t err = {0};

  req.dataset_id = (char *)id;
  req.options = &o;
  o.job_name = (char *)name;
  o.mode = mode;
  o.num_epochs = epochs;
  o.error_policy = policy;
  resp = ferry__arena_alloc(&fx_arena, sizeof(*resp));
  ferry__v1__get_or_create_job_response__init(resp);
  cr_assert_eq(ferry__disp_get_or_create_job(d, &req, resp, &fx_arena, now,
                                             &err),
               0, "%s", err.msg);
  cr_assert_eq(resp->client_secret.len, 16);
  cr_assert_lt(n_secrets, sizeof(secrets) / sizeof(secrets[0]));
  secrets[n_secrets].job = resp->job_id;
  secrets[n_secrets].client = resp->client_id;
  memcpy(secrets[n_secrets++].secret, resp->client_secret.data, 16);
  return resp;
}

int fx_job_req(ferry_disp_t *d, const Ferry__V1__GetOrCreateJobRequest *req,
               Ferry__V1__GetOrCreateJobResponse **out, int64_t now,
               ferry_error_t *err) {
  Ferry__V1__GetOrCreateJobResponse *resp =
      ferry__arena_alloc(&fx_arena, sizeof(*resp));
  int rc;
  ferry__v1__get_or_create_job_response__init(resp);
  *out = resp;
  rc = ferry__disp_get_or_create_job(d, req, resp, &fx_arena, now, err);
  if (rc == 0) {
    cr_assert_lt(n_secrets, sizeof(secrets) / sizeof(secrets[0]));
    secrets[n_secrets].job = resp->job_id;
    secrets[n_secrets].client = resp->client_id;
    memcpy(secrets[n_secrets++].secret, resp->client_secret.data, 16);
  }
  return rc;
}

void fx_sign(Ferry__V1__ClientHeartbeatRequest *req) {
  /* The newest first: a test that starts a state again reuses the ids. */
  for (size_t i = n_secrets; i-- > 0;)
    if (secrets[i].job == req->job_id && secrets[i].client == req->client_id) {
      req->client_secret.data = secrets[i].secret;
      req->client_secret.len = 16;
      return;
    }
}

uint64_t fx_release_lease;
const uint64_t *fx_prog_leases;
uint64_t fx_unread_ms;

Ferry__V1__ClientHeartbeatResponse *fx_client(ferry_disp_t *d, uint64_t job,
                                              uint64_t client, uint32_t want,
                                              const uint64_t *prog, size_t n,
                                              bool leaving, int64_t now) {
  Ferry__V1__ClientHeartbeatRequest req =
      FERRY__V1__CLIENT_HEARTBEAT_REQUEST__INIT;
  Ferry__V1__SplitProgress *p = calloc(n + 1, sizeof(*p));
  Ferry__V1__SplitProgress **pp = calloc(n + 1, sizeof(*pp));
  Ferry__V1__ClientHeartbeatResponse *resp;
  ferry_error_t err = {0};
  int rc;

  for (size_t i = 0; i < n; i++) {
    ferry__v1__split_progress__init(&p[i]);
    p[i].epoch = (uint32_t)prog[4 * i];
    p[i].split = (uint32_t)prog[4 * i + 1];
    p[i].delivered = prog[4 * i + 2];
    p[i].worker_id = prog[4 * i + 3];
    p[i].release = fx_release_lease != 0;
    p[i].lease = fx_prog_leases != NULL ? fx_prog_leases[i]
                                        : fx_release_lease;
    pp[i] = &p[i];
  }
  req.job_id = job;
  req.client_id = client;
  req.want_splits = want;
  req.progress = pp;
  req.n_progress = n;
  req.leaving = leaving;
  fx_sign(&req);
  resp = ferry__arena_alloc(&fx_arena, sizeof(*resp));
  ferry__v1__client_heartbeat_response__init(resp);
  rc = ferry__disp_client_heartbeat(d, &req, resp, &fx_arena, now, &err);
  free(p);
  free(pp);
  cr_assert_eq(rc, 0, "%s", err.msg);
  return resp;
}

Ferry__V1__WorkerHeartbeatResponse *fx_worker(ferry_disp_t *d, uint64_t id,
                                              const char *addr,
                                              const fx_task_t *tasks,
                                              size_t n, bool draining,
                                              int64_t now) {
  Ferry__V1__WorkerHeartbeatRequest req =
      FERRY__V1__WORKER_HEARTBEAT_REQUEST__INIT;
  Ferry__V1__TaskProgress *t = calloc(n + 1, sizeof(*t));
  Ferry__V1__TaskProgress **tp = calloc(n + 1, sizeof(*tp));
  Ferry__V1__WorkerHeartbeatResponse *resp;
  ferry_error_t err = {0};
  int rc;

  for (size_t i = 0; i < n; i++) {
    ferry__v1__task_progress__init(&t[i]);
    t[i].job_id = tasks[i].job;
    t[i].epoch = tasks[i].epoch;
    t[i].split = tasks[i].split;
    t[i].lease = tasks[i].lease;
    t[i].produced = tasks[i].produced;
    t[i].finished = tasks[i].finished;
    t[i].skipped = tasks[i].skipped;
    t[i].error_code = tasks[i].error_code;
    t[i].stalled_ms = tasks[i].stalled_ms;
    t[i].resend = tasks[i].resend;
    t[i].unread_ms = fx_unread_ms;
    if (tasks[i].error != NULL)
      t[i].error = (char *)tasks[i].error;
    tp[i] = &t[i];
  }
  req.worker_id = id;
  req.address = (char *)addr;
  req.threads = 4;
  req.buffer_bytes = 1 << 20;
  req.buffer_free_bytes = 1 << 19;
  req.tasks = tp;
  req.n_tasks = n;
  req.draining = draining;
  resp = ferry__arena_alloc(&fx_arena, sizeof(*resp));
  ferry__v1__worker_heartbeat_response__init(resp);
  rc = ferry__disp_worker_heartbeat(d, &req, resp, &fx_arena, now, &err);
  free(t);
  free(tp);
  cr_assert_eq(rc, 0, "%s", err.msg);
  return resp;
}

Ferry__V1__GetStatusResponse *fx_status(ferry_disp_t *d, int64_t now) {
  Ferry__V1__GetStatusResponse *s = ferry__arena_alloc(&fx_arena, sizeof(*s));
  ferry__v1__get_status_response__init(s);
  cr_assert_eq(ferry__disp_status(d, "test", s, &fx_arena, now), 0);
  return s;
}

uint8_t *fx_status_bytes(ferry_disp_t *d, int64_t now, size_t *len) {
  Ferry__V1__GetStatusResponse *s = fx_status(d, now);
  uint8_t *buf;
  s->uptime_ms = 0;
  for (size_t i = 0; i < s->n_workers; i++) {
    s->workers[i]->last_heartbeat_ms_ago = 0;
    s->workers[i]->threads = 0;
    s->workers[i]->tasks = 0; /* leases are volatile too */
    s->workers[i]->buffer_bytes = s->workers[i]->buffer_free_bytes = 0;
    /* Only "lost" and "left" are journaled; alive/unknown,
     * draining/drained depend on heartbeats to this process
     * (operator_drained is journaled). */
    if (strcmp(s->workers[i]->state, "lost") != 0 &&
        strcmp(s->workers[i]->state, "left") != 0)
      s->workers[i]->state = (char *)"live";
  }
  for (size_t i = 0; i < s->n_jobs; i++)
    for (size_t c = 0; c < s->jobs[i]->n_clients; c++) {
      s->jobs[i]->clients[c]->last_heartbeat_ms_ago = 0;
      s->jobs[i]->clients[c]->stats = NULL;
    }
  *len = protobuf_c_message_get_packed_size(&s->base);
  buf = ferry__arena_alloc(&fx_arena, *len + 1);
  protobuf_c_message_pack(&s->base, buf);
  return buf;
}

void fx_replay_matches(ferry_disp_t *d, int64_t now) {
  ferry_error_t err = {0};
  size_t len1, len2;
  uint8_t *s1 = fx_status_bytes(d, now, &len1);
  ferry_disp_config_t cfg;
  ferry_disp_t *r2;
  ferry__disp_config_init(&cfg);
  cr_assert_eq(ferry__disp_new(&cfg, 0, &r2), 0);
  for (size_t i = 0; i < fx_entries.n; i++)
    cr_assert_eq(ferry__disp_apply(r2, fx_entries.e[i], fx_entries.len[i],
                                   now, &err),
                 0, "%s", err.msg);
  ferry__disp_replayed(r2, now);
  uint8_t *s2 = fx_status_bytes(r2, now, &len2);
  cr_assert_eq(len1, len2);
  cr_assert_eq(memcmp(s1, s2, len1), 0, "the replay gives the same status");
  ferry__disp_free(r2);
}
