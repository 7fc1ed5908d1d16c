/* The heartbeat thread: WorkerHeartbeat to the dispatcher every
 * heartbeat_ms, off the loop (the unary call blocks).
 *
 * The first heartbeat carries worker_id 0 and registers; the answer's id
 * is kept (and replaced if the dispatcher ever assigns another one, e.g.
 * after it declared this worker lost). Calls wait for the channel to be
 * ready (WAIT_FOR_READY) within a deadline, so a dispatcher that is down
 * or restarting is retried every interval; the log says so once per change
 * between reachable and unreachable. Every heartbeat lists every task the
 * worker knows (pending, running, finished) with its progress; finished
 * tasks are listed until the dispatcher cancels them. The answer's
 * cancellations are applied before its new tasks.
 */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "ferry/alloc.h"
#include "ferry/log.h"
#include "worker.h"

/* The last heartbeat, on SIGTERM: short, and without waiting for a
 * connection. */
#define FINAL_DEADLINE_MS 300

static void *pb_alloc(void *data, size_t size) {
  (void)data;
  return ferry__malloc(size);
}

static void pb_free(void *data, void *p) {
  (void)data;
  ferry__free(p);
}

static ProtobufCAllocator pb_allocator = {pb_alloc, pb_free, NULL};

/* Applies an answer. */
static void apply(ferry__worker_t *w,
                  const Ferry__V1__WorkerHeartbeatResponse *resp) {
  uint64_t id = atomic_load(&w->worker_id);
  if (resp->worker_id != 0 && resp->worker_id != id) {
    FERRY_LOG(FERRY_LOG_INFO, "registered with %s as worker %llu (%s)",
              w->cfg.dispatcher, (unsigned long long)resp->worker_id,
              w->address);
    atomic_store(&w->worker_id, resp->worker_id);
  }
  if (resp->heartbeat_ms != 0)
    atomic_store(&w->heartbeat_ms, (int)resp->heartbeat_ms);
  size_t cancelled = 0;
  for (size_t i = 0; i < resp->n_cancelled; i++) {
    const Ferry__V1__TaskRef *r = resp->cancelled[i];
    if (ferry__wtasks_cancel(&w->tasks, r->job_id, r->epoch, r->split,
                             r->lease))
      cancelled++;
  }
  if (cancelled > 0)
    ferry__winbox_purge(w);
  if (atomic_load(&w->draining))
    return;
  for (size_t i = 0; i < resp->n_new_tasks; i++) {
    const Ferry__V1__Task *t = resp->new_tasks[i];
    int rc = ferry__wtasks_add(&w->tasks, t);
    if (rc < 0)
      FERRY_LOG(FERRY_LOG_ERROR, "task job %llu split %u: %s",
                (unsigned long long)t->job_id,
                t->split != NULL ? t->split->index : 0, ferry_strerror(rc));
    else if (rc == 1)
      FERRY_LOG(FERRY_LOG_DEBUG, "task job %llu epoch %u split %u lease %llu "
                "from %llu: %s", (unsigned long long)t->job_id, t->epoch,
                t->split != NULL ? t->split->index : 0,
                (unsigned long long)t->lease, (unsigned long long)t->start,
                t->file);
  }
}

/* One heartbeat (`final`: the last one, which always says draining).
 * Returns 0 or the call's error (in err). */
static int beat(ferry__worker_t *w, ferry_rpc_channel_t *ch, bool final,
                int deadline_ms, unsigned flags, ferry_error_t *err) {
  Ferry__V1__WorkerHeartbeatRequest req =
      FERRY__V1__WORKER_HEARTBEAT_REQUEST__INIT;
  void *mem = NULL;
  uint8_t *buf = NULL, *reply = NULL;
  size_t reply_len = 0;
  uint64_t used = ferry__wpool_used(&w->pool);
  int rc;

  req.worker_id = atomic_load(&w->worker_id);
  req.address = w->address;
  req.threads = (uint32_t)w->tasks.nthreads;
  req.buffer_bytes = w->pool.cap;
  req.buffer_free_bytes = used < w->pool.cap ? w->pool.cap - used : 0;
  req.draining = final || atomic_load(&w->draining);
  rc = ferry__wtasks_report(&w->tasks, &req, &mem);
  if (rc != 0)
    return ferry__seterr(err, rc, "heartbeat: out of memory");
  size_t len = ferry__v1__worker_heartbeat_request__get_packed_size(&req);
  buf = ferry__malloc(len + 1);
  if (buf == NULL) {
    ferry__free(mem);
    return ferry__seterr(err, FERRY_ENOMEM, "heartbeat: out of memory");
  }
  ferry__v1__worker_heartbeat_request__pack(&req, buf);
  ferry__free(mem);
  rc = ferry_rpc_unary(ch, FERRY_WORKER_HB_METHOD, buf, len, deadline_ms,
                       flags, &reply, &reply_len, err);
  ferry__free(buf);
  if (rc != 0)
    return rc;
  Ferry__V1__WorkerHeartbeatResponse *resp =
      ferry__v1__worker_heartbeat_response__unpack(&pb_allocator, reply_len,
                                                   reply);
  ferry_free(reply);
  if (resp == NULL)
    return ferry__seterr(err, FERRY_EINVAL,
                         "heartbeat: malformed WorkerHeartbeatResponse");
  apply(w, resp);
  ferry__v1__worker_heartbeat_response__free_unpacked(resp, &pb_allocator);
  atomic_fetch_add(&w->heartbeats_ok, 1);
  return 0;
}

static void *hb_main(void *arg) {
  ferry__worker_t *w = arg;
  ferry_rpc_channel_t *ch = NULL;
  ferry_error_t err;
  int reachable = -1; /* unknown */

  if (ferry_rpc_channel_new(w->cfg.dispatcher, NULL, &ch, &err) != 0) {
    FERRY_LOG(FERRY_LOG_ERROR, "dispatcher %s: %s", w->cfg.dispatcher,
              err.msg);
    return NULL;
  }
  for (;;) {
    pthread_mutex_lock(&w->hb_lock);
    bool final = w->hb_quit;
    pthread_mutex_unlock(&w->hb_lock);

    /* A dispatcher that did not answer the last one will not hear the
     * final one either: do not hold up the exit for it. */
    if (final && reachable == 0)
      break;
    int hb_ms = atomic_load(&w->heartbeat_ms);
    int deadline = hb_ms * 2 < 500 ? 500 : hb_ms * 2 > 5000 ? 5000 : hb_ms * 2;
    ferry_error_clear(&err);
    int rc = final ? beat(w, ch, true, FINAL_DEADLINE_MS, 0, &err)
                   : beat(w, ch, false, deadline, FERRY_RPC_WAIT_FOR_READY,
                          &err);
    if (rc == 0 && reachable != 1) {
      FERRY_LOG(FERRY_LOG_INFO, "dispatcher %s reachable",
                w->cfg.dispatcher);
      reachable = 1;
    } else if (rc != 0 && reachable != 0) {
      FERRY_LOG(FERRY_LOG_WARN, "dispatcher %s unreachable (%s); retrying "
                "every %d ms", w->cfg.dispatcher, err.msg, hb_ms);
      reachable = 0;
    }
    if (final)
      break;

    /* Wait for the next beat, or for the quit signal. */
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += hb_ms / 1000;
    until.tv_nsec += (long)(hb_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
      until.tv_sec++;
      until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&w->hb_lock);
    while (!w->hb_quit &&
           pthread_cond_timedwait(&w->hb_cv, &w->hb_lock, &until) == 0)
      ;
    pthread_mutex_unlock(&w->hb_lock);
  }
  ferry_rpc_channel_free(ch);
  return NULL;
}

int ferry__whb_start(ferry__worker_t *w, ferry_error_t *err) {
  if (pthread_create(&w->hb_thread, NULL, hb_main, w) != 0)
    return ferry__seterr(err, FERRY_EIO, "cannot start the heartbeat thread");
  w->hb_started = true;
  return 0;
}

void ferry__whb_quit(ferry__worker_t *w) {
  pthread_mutex_lock(&w->hb_lock);
  w->hb_quit = true;
  pthread_cond_broadcast(&w->hb_cv);
  pthread_mutex_unlock(&w->hb_lock);
}

bool ferry__whb_join(ferry__worker_t *w, int ms) {
  struct timespec until;
  ferry__whb_quit(w);
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += ms / 1000;
  until.tv_nsec += (long)(ms % 1000) * 1000000L;
  if (until.tv_nsec >= 1000000000L) {
    until.tv_sec++;
    until.tv_nsec -= 1000000000L;
  }
  if (pthread_timedjoin_np(w->hb_thread, NULL, &until) != 0)
    return false;
  w->hb_started = false;
  return true;
}
