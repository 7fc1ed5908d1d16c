/* The dispatcher's gRPC glue (see rpc_handlers.h). */
#include "rpc_handlers.h"

#include <inttypes.h>
#include <string.h>

#include "ferry/alloc.h"
#include "ferry/log.h"
#include "ferry/pb_alloc.h"
#include "ferry/rpc_methods.h"
#include "dmetrics.h"
#include "snapshot.h"

typedef int (*op_fn)(ferry_disp_service_t *svc, const void *req, void *resp,
                     ferry_arena_t *a, int64_t now, ferry_error_t *err);

typedef struct method_s {
  const char *name;
  const ProtobufCMessageDescriptor *req, *resp;
  op_fn fn;
  size_t max_request; /* bytes; larger requests are refused unread */
} method_t;

int64_t ferry__disp_now_ms(void) { return (int64_t)(uv_hrtime() / 1000000); }

static int op_register(ferry_disp_service_t *svc, const void *req, void *resp,
                       ferry_arena_t *a, int64_t now, ferry_error_t *err) {
  return ferry__disp_register_dataset(svc->state, req, resp, a, now, err);
}

static int op_job(ferry_disp_service_t *svc, const void *req, void *resp,
                  ferry_arena_t *a, int64_t now, ferry_error_t *err) {
  return ferry__disp_get_or_create_job(svc->state, req, resp, a, now, err);
}

static int op_client(ferry_disp_service_t *svc, const void *req, void *resp,
                     ferry_arena_t *a, int64_t now, ferry_error_t *err) {
  return ferry__disp_client_heartbeat(svc->state, req, resp, a, now, err);
}

static int op_worker(ferry_disp_service_t *svc, const void *req, void *resp,
                     ferry_arena_t *a, int64_t now, ferry_error_t *err) {
  return ferry__disp_worker_heartbeat(svc->state, req, resp, a, now, err);
}

static int op_status(ferry_disp_service_t *svc, const void *req, void *resp,
                     ferry_arena_t *a, int64_t now, ferry_error_t *err) {
  int rc = ferry__disp_status(svc->state, svc->version, resp, a, now);
  if (rc != 0)
    return ferry__seterr(err, rc, "out of memory");
  /* A job's error names its files: only the status credential (and the
   * job's own clients, through their heartbeats) may read it. A cancel's
   * text ("job J cancelled by the operator") names none. */
  if (!svc->call_sees_errors) {
    Ferry__V1__GetStatusResponse *s = resp;
    for (size_t i = 0; i < s->n_jobs; i++)
      if (s->jobs[i]->error != NULL && s->jobs[i]->error[0] != '\0' &&
          s->jobs[i]->state != FERRY__V1__JOB_STATE__JOB_STATE_CANCELLED)
        s->jobs[i]->error = (char *)"(hidden: needs the status credential)";
  }
  return 0;
}

static int op_drain(ferry_disp_service_t *svc, const void *req, void *resp,
                    ferry_arena_t *a, int64_t now, ferry_error_t *err) {
  return ferry__disp_drain_worker(svc->state, req, resp, a, now, err);
}

static int op_cancel(ferry_disp_service_t *svc, const void *req, void *resp,
                     ferry_arena_t *a, int64_t now, ferry_error_t *err) {
  return ferry__disp_cancel_job(svc->state, req, resp, a, now, err);
}

/* The order is the method index authorize() maps to roles. */
static const method_t methods[] = {
    {FERRY_METHOD_REGISTER_DATASET,
     &ferry__v1__register_dataset_request__descriptor,
     &ferry__v1__register_dataset_response__descriptor, op_register,
     1 << 20},
    {FERRY_METHOD_GET_OR_CREATE_JOB,
     &ferry__v1__get_or_create_job_request__descriptor,
     &ferry__v1__get_or_create_job_response__descriptor, op_job, 64 << 10},
    {FERRY_METHOD_CLIENT_HEARTBEAT,
     &ferry__v1__client_heartbeat_request__descriptor,
     &ferry__v1__client_heartbeat_response__descriptor, op_client,
     8 << 20},
    {FERRY_METHOD_WORKER_HEARTBEAT,
     &ferry__v1__worker_heartbeat_request__descriptor,
     &ferry__v1__worker_heartbeat_response__descriptor, op_worker,
     64 << 20},
    {FERRY_METHOD_GET_STATUS,
     &ferry__v1__get_status_request__descriptor,
     &ferry__v1__get_status_response__descriptor, op_status, 4 << 10},
    {FERRY_METHOD_DRAIN_WORKER,
     &ferry__v1__drain_worker_request__descriptor,
     &ferry__v1__drain_worker_response__descriptor, op_drain, 4 << 10},
    {FERRY_METHOD_CANCEL_JOB,
     &ferry__v1__cancel_job_request__descriptor,
     &ferry__v1__cancel_job_response__descriptor, op_cancel, 4 << 10},
};
_Static_assert(sizeof(methods) / sizeof(methods[0]) ==
                   FERRY_DISP_N_METHODS,
               "one binding per method");

/* Packs the response into one buffer and answers the call now. */
static void reply_msg(ferry_rpc_call_t *call, const ProtobufCMessage *msg,
                      ferry_arena_t *a) {
  size_t n = protobuf_c_message_get_packed_size(msg);
  uint8_t *buf = ferry__arena_alloc(a, n ? n : 1);
  if (buf == NULL) {
    ferry_rpc_reply_error(call, FERRY_RPC_INTERNAL, "out of memory");
    return;
  }
  protobuf_c_message_pack(msg, buf);
  ferry_rpc_reply(call, buf, n);
}

/* ---- Group commit ----------------------------------------------------------
 * A call's changes are applied in memory and appended to the journal; its
 * answer is held (with the journal's appended position at the time) until
 * a batch made that position durable. Every answer goes through here, reads
 * included: an answer computed while entries are pending may show them
 * (a lease another call just granted), so it waits for them too. One batch
 * is in flight at a time, on libuv's thread pool; what is appended
 * meanwhile goes in the next one. A failed batch fails every held call
 * and rebuilds the state from disk (rebuild()). */

struct ferry_disp_held_s {
  ferry_disp_held_t *next;
  ferry_rpc_call_t *call;
  uint64_t pos;
  int status; /* 0: `buf` is the answer; else the gRPC status of `msg` */
  uint8_t *buf;
  size_t len;
  char msg[];
};

static void kick(ferry_disp_service_t *svc);

static bool must_hold(const ferry_disp_service_t *svc) {
  return svc->journal != NULL && ferry__journal_appended(svc->journal) >
                                     ferry__journal_durable(svc->journal);
}

static void hold(ferry_disp_service_t *svc, ferry_disp_held_t *h) {
  h->pos = ferry__journal_appended(svc->journal);
  h->next = NULL;
  if (svc->held_tail == NULL)
    svc->held_tail = &svc->held;
  *svc->held_tail = h;
  svc->held_tail = &h->next;
  svc->n_held++;
  kick(svc);
}

/* Answers `call` with `msg` once what the state shows is durable. */
static void answer(ferry_disp_service_t *svc, ferry_rpc_call_t *call,
                   const ProtobufCMessage *msg, ferry_arena_t *a) {
  ferry_disp_held_t *h;
  size_t n;

  if (!must_hold(svc)) {
    reply_msg(call, msg, a);
    return;
  }
  n = protobuf_c_message_get_packed_size(msg);
  if ((h = ferry__malloc(sizeof(*h) + 1 + n)) == NULL) {
    ferry_rpc_reply_error(call, FERRY_RPC_INTERNAL, "out of memory");
    return;
  }
  h->call = call;
  h->status = 0;
  h->msg[0] = '\0';
  h->buf = (uint8_t *)h->msg + 1;
  h->len = protobuf_c_message_pack(msg, h->buf);
  hold(svc, h);
}

static void answer_error(ferry_disp_service_t *svc, ferry_rpc_call_t *call,
                         int status, const char *text) {
  ferry_disp_held_t *h;
  size_t n = strlen(text);

  if (!must_hold(svc) || (h = ferry__malloc(sizeof(*h) + n + 1)) == NULL) {
    ferry_rpc_reply_error(call, status, text);
    return;
  }
  h->call = call;
  h->status = status;
  h->buf = NULL;
  h->len = 0;
  memcpy(h->msg, text, n + 1);
  hold(svc, h);
}

/* Answers the held calls up to `pos` (all: `pos` UINT64_MAX), or fails
 * them all with UNAVAILABLE and `why` when `why` is not NULL. */
static void release_held(ferry_disp_service_t *svc, uint64_t pos,
                         const char *why) {
  while (svc->held != NULL && (why != NULL || svc->held->pos <= pos)) {
    ferry_disp_held_t *h = svc->held;
    svc->held = h->next;
    svc->n_held--;
    if (why != NULL)
      ferry_rpc_reply_error(h->call, FERRY_RPC_UNAVAILABLE, why);
    else if (h->status != 0)
      ferry_rpc_reply_error(h->call, h->status, h->msg);
    else
      ferry_rpc_reply(h->call, h->buf, h->len);
    ferry__free(h);
  }
  if (svc->held == NULL)
    svc->held_tail = &svc->held;
}

/* ---- Held-back worker heartbeats ------------------------------------------
 * A worker heartbeat whose answer would carry nothing waits here with its
 * request until a change gives it something (checked after each journal
 * sync, so what the worker hears is durable), its interval passed, its
 * worker sent a newer one, the worker cancelled it, or the daemon stops.
 * One entry per worker at most: a list. */

struct ferry_disp_wait_s {
  ferry_disp_wait_t *next;
  ferry_disp_service_t *svc;
  ferry_rpc_call_t *call;
  Ferry__V1__WorkerHeartbeatRequest *req; /* on the Ferry heap */
  int64_t due;                            /* ferry__disp_now_ms */
};

static void wait_unlink(ferry_disp_service_t *svc, ferry_disp_wait_t *w) {
  for (ferry_disp_wait_t **pp = &svc->waiting; *pp != NULL;
       pp = &(*pp)->next)
    if (*pp == w) {
      *pp = w->next;
      return;
    }
}

static void free_request(ProtobufCMessage *m) {
  protobuf_c_message_free_unpacked(m, &ferry__pb_allocator);
}

/* Answers a waiting call with the diff of leases as it stands now; with
 * `only_news`, only when that diff carries something. Returns true when
 * it answered: the entry is then unlinked and freed. */
static bool wait_answer(ferry_disp_service_t *svc, ferry_disp_wait_t *w,
                        bool only_news) {
  Ferry__V1__WorkerHeartbeatResponse resp =
      FERRY__V1__WORKER_HEARTBEAT_RESPONSE__INIT;
  ferry_arena_t a = {0};
  ferry_error_t err = {0};
  bool news = ferry__disp_worker_poll(svc->state, w->req, &resp, &a,
                                      ferry__disp_now_ms(), &err);
  if (!news && only_news) {
    ferry__arena_free(&a);
    return false;
  }
  wait_unlink(svc, w);
  /* The answer may be held (group commit) and `w` is freed below: a
   * cancel of the call from here on must not reach it. */
  ferry_rpc_call_on_cancel(w->call, NULL, NULL);
  if (err.code != 0)
    answer_error(svc, w->call, ferry_rpc_status_from_err(err.code), err.msg);
  else
    answer(svc, w->call, &resp.base, &a);
  ferry__arena_free(&a);
  free_request(&w->req->base);
  ferry__free(w);
  return true;
}

static void on_wait_timer(uv_timer_t *t);

/* Points the timer at the earliest due time, or stops it. */
static void wait_arm(ferry_disp_service_t *svc) {
  int64_t due = INT64_MAX, now = ferry__disp_now_ms();
  for (ferry_disp_wait_t *w = svc->waiting; w != NULL; w = w->next)
    if (w->due < due)
      due = w->due;
  if (due == INT64_MAX)
    uv_timer_stop(&svc->wait_timer);
  else
    uv_timer_start(&svc->wait_timer, on_wait_timer,
                   due > now ? (uint64_t)(due - now) : 0, 0);
}

static void on_wait_timer(uv_timer_t *t) {
  ferry_disp_service_t *svc = t->data;
  int64_t now = ferry__disp_now_ms();
  ferry_disp_wait_t *w = svc->waiting;
  while (w != NULL) {
    ferry_disp_wait_t *next = w->next;
    if (w->due <= now)
      wait_answer(svc, w, false);
    w = next;
  }
  wait_arm(svc);
}

/* Answers the waiting calls that the changes since the last check gave
 * something to say. */
static void wait_check(ferry_disp_service_t *svc) {
  uint64_t changes = ferry__disp_changes(svc->state);
  bool any = false;
  if (svc->waiting == NULL || changes == svc->waiting_changes)
    return;
  svc->waiting_changes = changes;
  ferry_disp_wait_t *w = svc->waiting;
  while (w != NULL) {
    ferry_disp_wait_t *next = w->next;
    any |= wait_answer(svc, w, true);
    w = next;
  }
  if (any)
    wait_arm(svc);
}

/* A failed batch: every waiting heartbeat fails (what it reported may be
 * undone), and the workers call again. */
static void wait_fail_all(ferry_disp_service_t *svc, const char *why) {
  while (svc->waiting != NULL) {
    ferry_disp_wait_t *w = svc->waiting;
    svc->waiting = w->next;
    ferry_rpc_call_on_cancel(w->call, NULL, NULL);
    ferry_rpc_reply_error(w->call, FERRY_RPC_UNAVAILABLE, why);
    free_request(&w->req->base);
    ferry__free(w);
  }
  if (svc->can_wait)
    wait_arm(svc);
}

/* The worker cancelled its call (it has news of its own), or the server
 * is shutting down: answer it, to nobody. */
static void on_wait_cancel(ferry_rpc_call_t *call, void *arg) {
  ferry_disp_wait_t *w = arg;
  ferry_disp_service_t *svc = w->svc;
  (void)call;
  wait_answer(svc, w, false);
  wait_arm(svc);
}

/* Holds back `call`, taking ownership of `req`. An older call of the same
 * worker still waiting is answered first: the worker moved on. Returns
 * false (nothing taken) when out of memory. */
static bool wait_start(ferry_disp_service_t *svc, ferry_rpc_call_t *call,
                       Ferry__V1__WorkerHeartbeatRequest *req,
                       uint32_t interval_ms) {
  ferry_disp_wait_t *w = ferry__calloc(1, sizeof(*w));
  if (w == NULL)
    return false;
  for (ferry_disp_wait_t *o = svc->waiting; o != NULL; o = o->next)
    if (o->req->worker_id == req->worker_id) {
      wait_answer(svc, o, false);
      break;
    }
  w->svc = svc;
  w->call = call;
  w->req = req;
  w->due = ferry__disp_now_ms() + interval_ms;
  /* The first waiter sets the mark; a later one must not move it: changes
   * made while a batch is pending are checked for the earlier waiters
   * once that batch is durable (this one's answer was computed just now). */
  if (svc->waiting == NULL)
    svc->waiting_changes = ferry__disp_changes(svc->state);
  w->next = svc->waiting;
  svc->waiting = w;
  ferry_rpc_call_on_cancel(call, on_wait_cancel, w);
  /* on_wait_cancel may have answered it already: the timer copes. */
  wait_arm(svc);
  return true;
}

/* ---- RegisterDataset on the thread pool -----------------------------------
 * ferry__disp_reg_begin runs in handle(); the expansion and the scan run on
 * libuv's thread pool, the reuse of earlier scans and the commit on the
 * loop (state.h), so a slow file system never stalls the other calls. The
 * call stays open meanwhile. A client cancel or the daemon stopping answers
 * it at once; its work then ends early and commits nothing. */

/* A call for a dataset that another call is registering (the same
 * fingerprint and split size): it waits for that one's outcome instead
 * of scanning the same files again. Every rank of a data-parallel job
 * registers the job's dataset as it starts; 500 ranks at once would
 * otherwise run 500 scans, and all but FERRY_DISP_MAX_REGISTERING of
 * them be refused. */
typedef struct reg_follower_s {
  struct reg_follower_s *next;
  ferry_rpc_call_t *call; /* NULL once answered */
  ferry_disp_regcall_t *p;
} reg_follower_t;

struct ferry_disp_regcall_s {
  ferry_disp_regcall_t *next;
  ferry_disp_service_t *svc;
  ferry_rpc_call_t *call; /* NULL once answered */
  ferry_disp_reg_t *reg;
  reg_follower_t *followers;
  uint32_t nfollowers;
  uv_work_t work;
  bool queued;   /* the work is on the pool (uv_cancel may be called) */
  bool scanning; /* the work is the scan (else the expansion) */
};

static void reg_free(ferry_disp_regcall_t *p) {
  ferry_disp_service_t *svc = p->svc;
  for (ferry_disp_regcall_t **pp = &svc->registering; *pp != NULL;
       pp = &(*pp)->next)
    if (*pp == p) {
      *pp = p->next;
      svc->n_registering--;
      break;
    }
  while (p->followers != NULL) {
    reg_follower_t *f = p->followers;
    p->followers = f->next;
    ferry__free(f);
  }
  ferry__disp_reg_free(p->reg);
  ferry__free(p);
}

/* True while a call waits for the registration's outcome. */
static bool reg_waited(const ferry_disp_regcall_t *p) {
  if (p->call != NULL)
    return true;
  for (const reg_follower_t *f = p->followers; f != NULL; f = f->next)
    if (f->call != NULL)
      return true;
  return false;
}

/* Nobody waits any more: the work stops early and commits nothing. */
static void reg_stop_work(ferry_disp_regcall_t *p) {
  ferry__disp_reg_cancel(p->reg);
  if (p->queued)
    uv_cancel((uv_req_t *)&p->work);
}

static void reg_expand_work(uv_work_t *w) {
  ferry_disp_regcall_t *p = w->data;
  ferry__disp_reg_expand(p->reg);
}

static void reg_scan_work(uv_work_t *w) {
  ferry_disp_regcall_t *p = w->data;
  ferry__disp_reg_scan(p->reg);
}

/* Answers the call now with `status`; the work, if queued, is cancelled
 * or stops early, and its after callback frees `p`. */
static void reg_abandon(ferry_disp_regcall_t *p, int status,
                        const char *msg) {
  if (!reg_waited(p))
    return;
  if (p->call != NULL) {
    ferry_rpc_reply_error(p->call, status, msg);
    p->call = NULL;
  }
  for (reg_follower_t *f = p->followers; f != NULL; f = f->next)
    if (f->call != NULL) {
      ferry_rpc_call_on_cancel(f->call, NULL, NULL);
      ferry_rpc_reply_error(f->call, status, msg);
      f->call = NULL;
    }
  reg_stop_work(p);
}

/* A caller of `p` went away (*call: the first caller's or a
 * follower's): the registration goes on while another call waits for
 * it. */
static void reg_cancelled(ferry_disp_regcall_t *p, ferry_rpc_call_t **call) {
  if (*call == NULL)
    return;
  ferry_rpc_reply_error(*call, FERRY_RPC_CANCELLED, "the call was cancelled");
  *call = NULL;
  if (!reg_waited(p))
    reg_stop_work(p);
}

static void on_reg_cancel(ferry_rpc_call_t *call, void *arg) {
  ferry_disp_regcall_t *p = arg;
  (void)call;
  reg_cancelled(p, &p->call);
}

static void on_follower_cancel(ferry_rpc_call_t *call, void *arg) {
  reg_follower_t *f = arg;
  (void)call;
  reg_cancelled(f->p, &f->call);
}

/* Answers *call (if still open) with the registration's outcome. */
static void reg_answer(ferry_disp_service_t *svc, ferry_rpc_call_t **call,
                       int rc, const Ferry__V1__RegisterDatasetResponse *resp,
                       ferry_arena_t *a, const ferry_error_t *err) {
  if (*call == NULL)
    return;
  ferry_rpc_call_on_cancel(*call, NULL, NULL);
  if (rc != 0)
    answer_error(svc, *call, ferry_rpc_status_from_err(rc), err->msg);
  else
    answer(svc, *call, &resp->base, a);
  *call = NULL;
}

/* Loop: after the expansion (reuse, then queue the scan) or the scan
 * (commit, sync the journal, answer). */
static void reg_after(uv_work_t *w, int status) {
  ferry_disp_regcall_t *p = w->data;
  ferry_disp_service_t *svc = p->svc;
  Ferry__V1__RegisterDatasetResponse resp =
      FERRY__V1__REGISTER_DATASET_RESPONSE__INIT;
  ferry_arena_t a = {0};
  ferry_error_t err = {0};
  int rc;

  p->queued = false;
  if (status != 0)
    reg_abandon(p, FERRY_RPC_UNAVAILABLE, "dispatcher: shutting down");
  if (!reg_waited(p)) {
    reg_free(p);
    return;
  }
  if (svc->failed) {
    reg_abandon(p, FERRY_RPC_UNAVAILABLE,
                "dispatcher: the journal failed; shutting down");
    reg_free(p);
    return;
  }
  if (!p->scanning) {
    ferry__disp_reg_reuse(svc->state, p->reg);
    p->scanning = true;
    if (uv_queue_work(svc->loop, &p->work, reg_scan_work, reg_after) == 0) {
      p->queued = true;
      return;
    }
    reg_abandon(p, FERRY_RPC_INTERNAL, "dispatcher: cannot queue the scan");
    reg_free(p);
    return;
  }
  rc = ferry__disp_reg_finish(svc->state, p->reg, &resp, &a,
                              ferry__disp_now_ms(), &err);
  /* `p` is freed below while the answers may be held (group commit): a
   * cancel from here on must not reach them. What the call changed is
   * durable before anyone hears of it; the calls that followed it hear
   * the same. */
  reg_answer(svc, &p->call, rc, &resp, &a, &err);
  for (reg_follower_t *f = p->followers; f != NULL; f = f->next)
    reg_answer(svc, &f->call, rc, &resp, &a, &err);
  if (rc != 0)
    FERRY_LOG(FERRY_LOG_DEBUG, "%s: %s", methods[0].name, err.msg);
  ferry__arena_free(&a);
  reg_free(p);
}

/* Starts a registration from handle(): returns its error, or 0 with
 * *later false and `resp` filled (the dataset exists), or 0 with *later
 * true: the call is answered from reg_after. */
static int reg_start(ferry_disp_service_t *svc, ferry_rpc_call_t *call,
                     const Ferry__V1__RegisterDatasetRequest *req,
                     Ferry__V1__RegisterDatasetResponse *resp,
                     ferry_arena_t *a, ferry_error_t *err, bool *later) {
  ferry_disp_reg_t *r;
  ferry_disp_regcall_t *p;
  int rc;

  rc = ferry__disp_reg_begin(svc->state, req, resp, a, ferry__disp_now_ms(),
                             &r, err);
  if (rc != 0 || r == NULL)
    return rc;
  for (p = svc->registering; p != NULL; p = p->next)
    if (ferry__disp_reg_same(p->reg, r) && reg_waited(p))
      break;
  if (p != NULL) {
    reg_follower_t *f;
    ferry__disp_reg_free(r);
    if (p->nfollowers >= FERRY_DISP_MAX_REG_FOLLOWERS)
      return ferry__seterr(err, FERRY_ENOSPC,
                           "%u calls wait for dataset %s's registration "
                           "(the limit); try again later",
                           p->nfollowers, ferry__disp_reg_id(p->reg));
    if ((f = ferry__calloc(1, sizeof(*f))) == NULL)
      return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
    f->call = call;
    f->p = p;
    f->next = p->followers;
    p->followers = f;
    p->nfollowers++;
    FERRY_LOG(FERRY_LOG_DEBUG, "dataset %s: a registration in progress "
              "answers this call too", ferry__disp_reg_id(p->reg));
    *later = true;
    ferry_rpc_call_on_cancel(call, on_follower_cancel, f);
    return 0;
  }
  if (svc->n_registering >= FERRY_DISP_MAX_REGISTERING) {
    ferry__disp_reg_free(r);
    return ferry__seterr(err, FERRY_ENOSPC,
                         "the dispatcher is registering %d datasets (its "
                         "limit); try again later",
                         FERRY_DISP_MAX_REGISTERING);
  }
  FERRY_LOG(FERRY_LOG_DEBUG, "dataset %s: expanding and scanning its files",
            ferry__disp_reg_id(r));
  if ((p = ferry__calloc(1, sizeof(*p))) == NULL) {
    ferry__disp_reg_free(r);
    return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
  }
  p->svc = svc;
  p->call = call;
  p->reg = r;
  p->work.data = p;
  if ((rc = uv_queue_work(svc->loop, &p->work, reg_expand_work,
                          reg_after)) != 0) {
    ferry__disp_reg_free(r);
    ferry__free(p);
    return ferry__seterr(err, FERRY_EIO, "cannot queue the scan: %s",
                         uv_strerror(rc));
  }
  p->queued = true;
  p->next = svc->registering;
  svc->registering = p;
  svc->n_registering++;
  *later = true;
  /* May run on_reg_cancel at once (the call ended): reg_after copes. */
  ferry_rpc_call_on_cancel(call, on_reg_cancel, p);
  return 0;
}

int ferry__disp_rpc_start(ferry_disp_service_t *svc, uv_loop_t *loop) {
  int rc = uv_timer_init(loop, &svc->wait_timer);
  if (rc != 0)
    return rc;
  svc->wait_timer.data = svc;
  svc->loop = loop;
  svc->can_wait = true;
  return 0;
}

static void timer_closed(uv_handle_t *h) { (void)h; }

void ferry__disp_rpc_stop(ferry_disp_service_t *svc) {
  if (!svc->can_wait)
    return;
  svc->can_wait = false;
  while (svc->waiting != NULL)
    wait_answer(svc, svc->waiting, false);
  /* Registrations in progress: answered now; their work ends without
   * committing, and the loop runs until its after callbacks freed them. */
  for (ferry_disp_regcall_t *p = svc->registering; p != NULL; p = p->next)
    reg_abandon(p, FERRY_RPC_UNAVAILABLE, "dispatcher: shutting down");
  uv_close((uv_handle_t *)&svc->wait_timer, timer_closed);
}

/* The batch failed: nothing held is acknowledged, and the state, ahead
 * of the disk, is rebuilt from it (the snapshot and the journal cut back
 * to its last durable entry). The boot entry that keeps lease generations
 * above the ones this process issued is committed by the next mutating
 * call (handle()), so reads keep being answered while the disk is full. */
static void rebuild(ferry_disp_service_t *svc, const ferry_error_t *why) {
  char msg[sizeof(why->msg) + 96];
  ferry_disp_restore_t st;
  ferry_error_t err = {0};
  int64_t t0 = ferry__disp_now_ms();
  int rc;

  snprintf(msg, sizeof(msg),
           "dispatcher: cannot write its journal (%s); the call was not "
           "applied",
           why->msg);
  FERRY_LOG(FERRY_LOG_ERROR, "journal: %s; failing %zu held calls and "
            "rebuilding the state from disk", why->msg, svc->n_held);
  ferry_metric_add(ferry__dmetrics()->write_failures, 1);
  release_held(svc, 0, msg);
  wait_fail_all(svc, msg);
  ferry__disp_set_sink(svc->state, NULL, NULL);
  ferry__disp_reset(svc->state, t0);
  rc = ferry__disp_restore(svc->state, svc->journal, false, t0, &st, &err);
  ferry__disp_set_sink(svc->state, ferry__journal_sink, svc->journal);
  if (rc != 0) {
    svc->failed = true;
    FERRY_LOG(FERRY_LOG_ERROR, "journal: cannot rebuild the state: %s",
              err.msg);
    if (svc->fatal != NULL)
      svc->fatal(&err, svc->fatal_arg);
    return;
  }
  svc->need_boot = true;
  FERRY_LOG(FERRY_LOG_WARN,
            "journal: state rebuilt from disk in %" PRId64 " ms (%" PRIu64
            " snapshot entries, %" PRIu64 " journal entries); serving, "
            "mutations retry the journal",
            ferry__disp_now_ms() - t0, st.snapshot_entries,
            st.journal_entries);
}

/* Loop: the batch in flight ended with `rc`. */
static void synced(ferry_disp_service_t *svc, int rc,
                   const ferry_error_t *err) {
  ferry_journal_t *j = svc->journal;
  bool compacted = svc->compacting;

  svc->compacting = false;
  ferry__journal_batch_end(j, rc);
  ferry__disp_snapshot_release(svc->state, svc->snap); /* before a rebuild */
  svc->snap = NULL;
  if (rc != 0) {
    rebuild(svc, err);
    return;
  }
  if (compacted) {
    ferry_metric_add(ferry__dmetrics()->snapshots, 1);
    ferry__disp_set_segment(svc->state, svc->compact_segment);
    FERRY_LOG(FERRY_LOG_INFO,
              "journal: snapshot of %" PRIu64 " bytes written (captured "
              "in %" PRId64 " ms on the loop), journal segment %" PRIu64
              " started",
              ferry__journal_snapshot_size(j), svc->compact_ms,
              svc->compact_segment);
  }
  release_held(svc, ferry__journal_durable(j), NULL);
  /* Long polls hear only of what is durable (or wait for it, answer()). */
  wait_check(svc);
  kick(svc);
}

static void sync_work(uv_work_t *w) {
  ferry_disp_service_t *svc = w->data;
  ferry_error_clear(&svc->sync_err);
  svc->sync_rc = ferry__journal_batch_write(svc->journal, &svc->sync_err);
}

static void sync_after(uv_work_t *w, int status) {
  ferry_disp_service_t *svc = w->data;
  (void)status; /* never cancelled */
  synced(svc, svc->sync_rc, &svc->sync_err);
}

static int pack_snapshot(void *arg, uint8_t **out, size_t *len,
                         ferry_error_t *err) {
  return ferry__disp_snapshot_pack(arg, out, len, err);
}

/* Starts a compaction when the journal outgrew max(--snapshot-bytes,
 * twice the last snapshot): restart work and disk use stay bounded by the
 * live state. The loop only captures the state (a copy of the jobs' rows
 * and the workers; datasets pinned); the batch's thread packs it. False:
 * a plain batch instead. */
static bool compact_begin(ferry_disp_service_t *svc) {
  ferry_journal_t *j = svc->journal;
  uint64_t size = ferry__journal_size(j);
  uint64_t snap = ferry__journal_snapshot_size(j);
  uint8_t hdr[16];
  size_t hlen;

  if (svc->compact_bytes == 0 || size < svc->compact_bytes ||
      size < 2 * snap)
    return false;
  svc->compact_segment = ferry__disp_segment(svc->state) + 1;
  svc->compact_ms = ferry__disp_now_ms();
  svc->snap = ferry__disp_snapshot_take(svc->state, svc->compact_segment);
  svc->compact_ms = ferry__disp_now_ms() - svc->compact_ms;
  if (svc->snap == NULL) {
    FERRY_LOG(FERRY_LOG_WARN, "journal: no compaction: out of memory");
    return false;
  }
  hlen = ferry__disp_segment_header(svc->compact_segment, hdr);
  svc->compacting =
      ferry__journal_compact_begin(j, pack_snapshot, svc->snap, hdr, hlen);
  if (!svc->compacting) {
    ferry__disp_snapshot_release(svc->state, svc->snap);
    svc->snap = NULL;
  }
  return svc->compacting;
}

/* Makes what is appended durable: starts a batch unless one is in flight
 * (its end starts the next). Without a loop (tests, shutdown) or with
 * --journal-sync-per-call, synchronously on this thread. */
static void kick(ferry_disp_service_t *svc) {
  ferry_journal_t *j = svc->journal;
  ferry_error_t err = {0};

  if (svc->failed)
    return;
  if (!must_hold(svc)) {
    /* Everything is durable: a change that journaled nothing (a
     * re-lease) may still be news to a waiting heartbeat. */
    wait_check(svc);
    return;
  }
  if (ferry__journal_busy(j))
    return;
  if (!compact_begin(svc) && !ferry__journal_batch_begin(j))
    return;
  svc->sync_req.data = svc;
  if (svc->loop == NULL || !svc->can_wait || svc->sync_per_call ||
      uv_queue_work(svc->loop, &svc->sync_req, sync_work, sync_after) != 0) {
    int rc = ferry__journal_batch_write(j, &err);
    synced(svc, rc, &err);
  }
}

void ferry__disp_rpc_flush(ferry_disp_service_t *svc) { kick(svc); }

/* Role checks. Returns 0 when the call may proceed, else the
 * gRPC status it was answered with. The refusal names no file and no
 * state; the log line says which method and role. */
enum { ROLE_CLIENT, ROLE_WORKER, ROLE_STATUS, ROLE_ADMIN };

static int authorize(ferry_disp_service_t *svc, ferry_rpc_call_t *call,
                     int method) {
  int role = method == 3   ? ROLE_WORKER
             : method == 4 ? ROLE_STATUS
             : method >= 5 ? ROLE_ADMIN
                           : ROLE_CLIENT;
  bool no_tokens = svc->worker_token == NULL && svc->client_token == NULL &&
                   svc->status_token == NULL && svc->admin_token == NULL;
  /* The admin role is open only on a cluster without any token;
   * once any role has one, DrainWorker and CancelJob need the admin token
   * (refused to everyone when --admin-token-file is not given). */
  const char *need = role == ROLE_WORKER   ? svc->worker_token
                     : role == ROLE_CLIENT ? svc->client_token
                     : role == ROLE_STATUS ? svc->status_token
                     : no_tokens           ? NULL
                                           : "";
  size_t n;
  const char *tok = ferry_rpc_call_bearer(call, &n);
  bool w, c, st, adm;
  adm = tok != NULL && svc->admin_token != NULL &&
        ferry_rpc_token_equal(tok, n, svc->admin_token);
  svc->call_sees_errors =
      no_tokens || adm ||
      (tok != NULL && svc->status_token != NULL &&
       ferry_rpc_token_equal(tok, n, svc->status_token));
  if (need == NULL)
    return 0;
  /* Every configured token is compared, whatever matches first. */
  w = tok != NULL && svc->worker_token != NULL &&
      ferry_rpc_token_equal(tok, n, svc->worker_token);
  c = tok != NULL && svc->client_token != NULL &&
      ferry_rpc_token_equal(tok, n, svc->client_token);
  st = tok != NULL && svc->status_token != NULL &&
       ferry_rpc_token_equal(tok, n, svc->status_token);
  if ((role == ROLE_WORKER && w) || (role == ROLE_CLIENT && c) ||
      (role == ROLE_STATUS && (st || w || c || adm)) ||
      (role == ROLE_ADMIN && adm))
    return 0;
  /* With tokens on but no admin token, everyone is refused: say so,
   * since no credential can succeed until the operator restarts the
   * dispatcher with one. Which role a
   * method needs is documented, so naming it tells a stranger nothing. */
  if (role == ROLE_ADMIN && svc->admin_token == NULL) {
    FERRY_LOG(FERRY_LOG_WARN, "%s: refused: no --admin-token-file is "
              "configured", methods[method].name);
    ferry_rpc_reply_error(call, FERRY_RPC_PERMISSION_DENIED,
                          "this method needs the admin token: the "
                          "dispatcher was started without "
                          "--admin-token-file");
    return FERRY_RPC_PERMISSION_DENIED;
  }
  if (w || c || st || adm) {
    FERRY_LOG(FERRY_LOG_WARN, "%s: refused a caller holding another role's "
              "token", methods[method].name);
    ferry_rpc_reply_error(call, FERRY_RPC_PERMISSION_DENIED,
                          role == ROLE_ADMIN
                              ? "this credential does not allow this "
                                "method: it needs the admin token"
                              : "this credential does not allow this method");
    return FERRY_RPC_PERMISSION_DENIED;
  }
  FERRY_LOG(FERRY_LOG_WARN, "%s: refused a caller with %s bearer token",
            methods[method].name, tok == NULL ? "no" : "a wrong");
  ferry_rpc_reply_error(call, FERRY_RPC_UNAUTHENTICATED,
                        role == ROLE_ADMIN
                            ? "missing or invalid bearer token: this method "
                              "needs the admin token"
                            : "missing or invalid bearer token");
  return FERRY_RPC_UNAUTHENTICATED;
}

static void handle(ferry_rpc_call_t *call, const uint8_t *req, size_t len,
                   void *user) {
  ferry_disp_binding_t *b = user;
  const method_t *m = &methods[b->method];
  ferry_disp_service_t *svc = b->svc;
  ProtobufCMessage *rq, *rs;
  ferry_arena_t a = {0};
  ferry_error_t err = {0};
  bool held = false, later = false;
  int rc;

  if (svc->failed) {
    ferry_rpc_reply_error(call, FERRY_RPC_UNAVAILABLE,
                          "dispatcher: the journal failed; shutting down");
    return;
  }
  if (authorize(svc, call, b->method) != 0)
    return;
  /* Each method's requests are bounded in bytes before they are parsed
   * (the fields inside are bounded again by the state machine). */
  if (len > m->max_request) {
    ferry_rpc_reply_error(call, FERRY_RPC_RESOURCE_EXHAUSTED,
                          "request larger than this method accepts");
    return;
  }
  rq = protobuf_c_message_unpack(m->req, &ferry__pb_allocator, len, req);
  if (rq == NULL) {
    ferry_rpc_reply_error(call, FERRY_RPC_INVALID_ARGUMENT,
                          "malformed request message");
    return;
  }
  /* After a failed batch, the first mutating call journals the boot
   * entry again (rebuild()); GetStatus only reads. */
  if (svc->need_boot && m->fn != op_status) {
    if (ferry__disp_boot(svc->state, &err) != 0) {
      ferry_rpc_reply_error(call, FERRY_RPC_INTERNAL, err.msg);
      free_request(rq);
      return;
    }
    svc->need_boot = false;
  }
  if ((rs = ferry__arena_alloc(&a, m->resp->sizeof_message)) == NULL) {
    rc = ferry__seterr(&err, FERRY_ENOMEM, "out of memory");
  } else {
    m->resp->message_init(rs);
    /* With a loop, a registration's file I/O runs on its thread pool. */
    if (m->fn == op_register && svc->can_wait)
      rc = reg_start(svc, call, (void *)rq, (void *)rs, &a, &err, &later);
    else
      rc = m->fn(svc, rq, rs, &a, ferry__disp_now_ms(), &err);
  }
  if (later) { /* answered by reg_after; nothing was changed yet */
    free_request(rq);
    ferry__arena_free(&a);
    return;
  }
  /* What the call changed is durable before anyone hears of it: answer()
   * holds the answer until then. */
  if (rc != 0) {
    answer_error(svc, call, ferry_rpc_status_from_err(rc), err.msg);
  } else {
    /* A worker heartbeat with nothing to hear waits for news. */
    if (m->fn == op_worker && svc->can_wait) {
      Ferry__V1__WorkerHeartbeatRequest *wq = (void *)rq;
      Ferry__V1__WorkerHeartbeatResponse *wr = (void *)rs;
      held = ferry__disp_worker_may_wait(svc->state, wq, wr) &&
             wait_start(svc, call, wq, wr->heartbeat_ms);
    }
    if (!held)
      answer(svc, call, rs, &a);
  }
  if (!held)
    free_request(rq);
  if (rc != 0)
    FERRY_LOG(FERRY_LOG_DEBUG, "%s: %s", m->name, err.msg);
  ferry__arena_free(&a);
  kick(svc); /* a held heartbeat's changes too */
}

int ferry__disp_rpc_register(ferry_disp_service_t *svc,
                             ferry_rpc_server_t *server, ferry_error_t *err) {
  static const char *const services[] = {"ferry.v1.Dispatcher"};
  int rc;

  for (int i = 0; i < (int)(sizeof(methods) / sizeof(methods[0])); i++) {
    svc->bindings[i].svc = svc;
    svc->bindings[i].method = i;
    rc = ferry_rpc_server_register(server, methods[i].name, FERRY_RPC_UNARY,
                                   handle, &svc->bindings[i], err);
    if (rc != 0)
      return rc;
  }
  return ferry_rpc_health_register(server, services, 1, err);
}
