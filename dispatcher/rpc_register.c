/* RegisterDataset off the loop: expansion and scan on libuv's pool, one
 * scan shared by concurrent registrations of a dataset (see
 * rpc_register.h). */
#include "rpc_register.h"

#include "alloc.h"
#include "ferry/log.h"
#include "rpc_commit.h"
#include "rpc_methods.h"
#include "scan.h"

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
    ferry__rpc_reply_error(p->call, status, msg);
    p->call = NULL;
  }
  for (reg_follower_t *f = p->followers; f != NULL; f = f->next)
    if (f->call != NULL) {
      ferry__rpc_call_on_cancel(f->call, NULL, NULL);
      ferry__rpc_reply_error(f->call, status, msg);
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
  ferry__rpc_reply_error(*call, FERRY_RPC_CANCELLED, "the call was cancelled");
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
  ferry__rpc_call_on_cancel(*call, NULL, NULL);
  if (rc != 0)
    ferry__disp_rpc_answer_error(svc, *call, ferry__rpc_status_from_err(rc),
                                 err->msg);
  else
    ferry__disp_rpc_answer(svc, *call, &resp->base, a);
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
    FERRY_LOG(FERRY_LOG_DEBUG, "%s: %s", FERRY_METHOD_REGISTER_DATASET,
              err.msg);
  ferry__arena_free(&a);
  reg_free(p);
}

/* Starts a registration from handle(): returns its error, or 0 with
 * *later false and `resp` filled (the dataset exists), or 0 with *later
 * true: the call is answered from reg_after. */
int ferry__disp_rpc_reg_start(ferry_disp_service_t *svc, ferry_rpc_call_t *call,
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
    ferry__rpc_call_on_cancel(call, on_follower_cancel, f);
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
  ferry__rpc_call_on_cancel(call, on_reg_cancel, p);
  return 0;
}

void ferry__disp_rpc_reg_stop_all(ferry_disp_service_t *svc) {
  for (ferry_disp_regcall_t *p = svc->registering; p != NULL; p = p->next)
    reg_abandon(p, FERRY_RPC_UNAVAILABLE, "dispatcher: shutting down");
}
