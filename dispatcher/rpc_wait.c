/* The dispatcher's long-polled worker heartbeats (see rpc_wait.h). */
#include "rpc_wait.h"

#include "alloc.h"
#include "pb_alloc.h"
#include "rpc_commit.h"

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

void ferry__disp_rpc_free_request(ProtobufCMessage *m) {
  protobuf_c_message_free_unpacked(m, &ferry__pb_allocator);
}

/* Answers a waiting call with the diff of leases as it stands now; with
 * `only_news`, only when that diff carries something. Returns true when
 * it answered: the entry is then unlinked and freed. */
bool ferry__disp_wait_answer(ferry_disp_service_t *svc, ferry_disp_wait_t *w,
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
  ferry__rpc_call_on_cancel(w->call, NULL, NULL);
  if (err.code != 0)
    ferry__disp_rpc_answer_error(svc, w->call,
                                 ferry__rpc_status_from_err(err.code), err.msg);
  else
    ferry__disp_rpc_answer(svc, w->call, &resp.base, &a);
  ferry__arena_free(&a);
  ferry__disp_rpc_free_request(&w->req->base);
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
      ferry__disp_wait_answer(svc, w, false);
    w = next;
  }
  wait_arm(svc);
}

/* Answers the waiting calls that the changes since the last check gave
 * something to say. */
void ferry__disp_wait_check(ferry_disp_service_t *svc) {
  uint64_t changes = ferry__disp_changes(svc->state);
  bool any = false;
  if (svc->waiting == NULL || changes == svc->waiting_changes)
    return;
  svc->waiting_changes = changes;
  ferry_disp_wait_t *w = svc->waiting;
  while (w != NULL) {
    ferry_disp_wait_t *next = w->next;
    any |= ferry__disp_wait_answer(svc, w, true);
    w = next;
  }
  if (any)
    wait_arm(svc);
}

/* A failed batch: every waiting heartbeat fails (what it reported may be
 * undone), and the workers call again. */
void ferry__disp_wait_fail_all(ferry_disp_service_t *svc, const char *why) {
  while (svc->waiting != NULL) {
    ferry_disp_wait_t *w = svc->waiting;
    svc->waiting = w->next;
    ferry__rpc_call_on_cancel(w->call, NULL, NULL);
    ferry__rpc_reply_error(w->call, FERRY_RPC_UNAVAILABLE, why);
    ferry__disp_rpc_free_request(&w->req->base);
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
  ferry__disp_wait_answer(svc, w, false);
  wait_arm(svc);
}

/* Holds back `call`, taking ownership of `req`. An older call of the same
 * worker still waiting is answered first: the worker moved on. Returns
 * false (nothing taken) when out of memory. */
bool ferry__disp_wait_start(ferry_disp_service_t *svc, ferry_rpc_call_t *call,
                       Ferry__V1__WorkerHeartbeatRequest *req,
                       uint32_t interval_ms) {
  ferry_disp_wait_t *w = ferry__calloc(1, sizeof(*w));
  if (w == NULL)
    return false;
  for (ferry_disp_wait_t *o = svc->waiting; o != NULL; o = o->next)
    if (o->req->worker_id == req->worker_id) {
      ferry__disp_wait_answer(svc, o, false);
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
  ferry__rpc_call_on_cancel(call, on_wait_cancel, w);
  /* on_wait_cancel may have answered it already: the timer copes. */
  wait_arm(svc);
  return true;
}
