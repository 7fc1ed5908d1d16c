/* The heartbeat thread: WorkerHeartbeat to the dispatcher, off the loop
 * (the call blocks).
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
 *
 * Long poll: the dispatcher holds back a heartbeat that brings it nothing
 * to answer, until a lease or a cancellation for this worker appears or
 * its interval passed. So the next heartbeat leaves at once after an
 * answer that changed the task table (it acknowledges the new tasks and
 * waits for the next news), and otherwise one interval after the previous
 * one left, which after a held-back call is at once. A task that ends
 * wakes the thread; one whose end the dispatcher needs to hear of (an
 * error, skipped records, an unknown total) also cancels a held-back call
 * so that the report leaves at once. The call is opened as a stream (the
 * same on the wire as a unary call) because only a stream can be
 * cancelled from another thread.
 */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "alloc.h"
#include "ferry/log.h"
#include "notify.h"
#include "pb_alloc.h"
#include "rpc_methods.h"
#include "worker.h"

/* The last heartbeat, on SIGTERM: short, and without waiting for a
 * connection. */
#define FINAL_DEADLINE_MS 300

/* Applies an answer. Returns true when it changed something: the id, or
 * the task table (a task cancelled or added). */
static bool apply(ferry__worker_t *w,
                  const Ferry__V1__WorkerHeartbeatResponse *resp) {
  uint64_t id = atomic_load(&w->worker_id);
  bool changed = false;
  if (resp->worker_id != 0 && resp->worker_id != id) {
    changed = true;
    FERRY_LOG(FERRY_LOG_INFO, "registered with %s as worker %llu (%s)",
              w->cfg.dispatcher, (unsigned long long)resp->worker_id,
              w->address);
    ferry__notify_status("serving on %s, registered with %s as worker %llu",
                         w->address, w->cfg.dispatcher,
                         (unsigned long long)resp->worker_id);
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
  if (cancelled > 0) {
    ferry__winbox_purge(w);
    changed = true;
  }
  if (atomic_load(&w->draining))
    return changed;
  for (size_t i = 0; i < resp->n_new_tasks; i++) {
    const Ferry__V1__Task *t = resp->new_tasks[i];
    int rc = ferry__wtasks_add(&w->tasks, t);
    changed |= rc == 1;
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
  return changed;
}

/* The unary call, opened as a stream and published in w->hb_call (unless
 * `final`) so that news or quit can cancel it while the dispatcher holds
 * it back. Same contract as ferry__rpc_unary; a call cancelled that way
 * fails with FERRY_EGRPC_CANCELLED. */
static int call(ferry__worker_t *w, ferry_rpc_channel_t *ch, bool final,
                const uint8_t *req, size_t len, int deadline_ms,
                unsigned flags, uint8_t **reply, size_t *reply_len,
                ferry_error_t *err) {
  ferry_rpc_stream_t *s;
  ferry_rpc_msg_t msg;
  *reply = NULL;
  *reply_len = 0;
  int rc = ferry__rpc_stream_open(ch, FERRY_METHOD_WORKER_HEARTBEAT, req, len,
                                  deadline_ms, flags, &s, err);
  if (rc != 0)
    return rc;
  if (!final) {
    pthread_mutex_lock(&w->hb_lock);
    w->hb_call = s;
    /* News that came while the report was built may have missed it. */
    if (w->hb_quit || w->hb_news) {
      w->hb_cancelled = true;
      ferry__rpc_stream_cancel(s);
    }
    pthread_mutex_unlock(&w->hb_lock);
  }
  rc = ferry__rpc_stream_next(s, &msg, -1, err);
  if (!final) {
    /* No cancel from here on: the stream is ours to free. */
    pthread_mutex_lock(&w->hb_lock);
    w->hb_call = NULL;
    pthread_mutex_unlock(&w->hb_lock);
  }
  if (rc == 0) {
    uint8_t *out = ferry__malloc(msg.len > 0 ? msg.len : 1);
    size_t out_len = msg.len;
    if (out != NULL)
      ferry__rpc_msg_copy(&msg, 0, out, out_len);
    ferry__rpc_msg_release(&msg);
    /* The status follows the one message. A cancel that raced with the
     * answer's arrival leaves the answer whole: keep it. */
    ferry_error_t e2 = {0};
    rc = ferry__rpc_stream_next(s, &msg, -1, &e2);
    if (rc == 0) {
      ferry__rpc_msg_release(&msg);
      rc = ferry__seterr(err, FERRY_EGRPC_INTERNAL, "%s: more than one reply",
                         FERRY_METHOD_WORKER_HEARTBEAT);
    } else if (rc == FERRY_EOF || rc == FERRY_EGRPC_CANCELLED) {
      rc = out != NULL ? 0 : ferry__seterr(err, FERRY_ENOMEM,
                                           "heartbeat: out of memory");
    } else if (err != NULL) {
      *err = e2;
    }
    if (rc == 0) {
      *reply = out;
      *reply_len = out_len;
    } else {
      ferry__free(out);
    }
  } else if (rc == FERRY_EOF) {
    rc = ferry__seterr(err, FERRY_EGRPC_INTERNAL, "%s: no reply",
                       FERRY_METHOD_WORKER_HEARTBEAT);
  }
  ferry__rpc_stream_free(s);
  return rc;
}

/* The prefix cache's report (dispatcher.proto CacheReport): counters and
 * each compiled pipeline's policy, at most 64, in one block *mem. */
#define REPORT_POLICIES 64
typedef struct {
  Ferry__V1__CachePolicy msg;
  char dataset[17];
  char reason[sizeof(((ferry__wpolicy_t *)0)->reason)];
} policy_slot_t;

static int cache_report(ferry__worker_t *w, Ferry__V1__CacheReport *rep,
                        void **mem) {
  ferry__wcache_t *c = &w->cache;
  *mem = NULL;
  rep->dir = c->dir;
  rep->limit_bytes = c->budget;
  rep->held_bytes = atomic_load(&c->held);
  rep->entries = atomic_load(&c->entries);
  rep->hits = atomic_load(&c->hits);
  rep->misses = atomic_load(&c->misses);
  rep->read_bytes = atomic_load(&c->read_bytes);
  rep->written_bytes = atomic_load(&c->written_bytes);
  rep->corrupt = atomic_load(&c->corrupt);
  rep->full = atomic_load(&c->full);
  size_t cap = REPORT_POLICIES;
  uint8_t *block = ferry__malloc(cap * (sizeof(policy_slot_t) + sizeof(void *)));
  if (block == NULL)
    return FERRY_ENOMEM;
  Ferry__V1__CachePolicy **ptrs = (Ferry__V1__CachePolicy **)block;
  policy_slot_t *slots = (policy_slot_t *)(block + cap * sizeof(void *));
  size_t n = 0;
  pthread_mutex_lock(&w->tasks.lock);
  for (ferry__wpipe_t *p = w->tasks.pipes; p != NULL && n < cap;
       p = p->next) {
    if (p->pol == NULL)
      continue;
    policy_slot_t *sl = &slots[n];
    ferry__v1__cache_policy__init(&sl->msg);
    snprintf(sl->dataset, sizeof(sl->dataset), "%016llx",
             (unsigned long long)p->pol->dataset_fp);
    pthread_mutex_lock(&p->pol->mu);
    sl->msg.choice = (char *)ferry__wc_choice_name(p->pol->choice);
    memcpy(sl->reason, p->pol->reason, sizeof(sl->reason));
    sl->msg.hits = p->pol->hits;
    sl->msg.misses = p->pol->misses;
    pthread_mutex_unlock(&p->pol->mu);
    sl->reason[sizeof(sl->reason) - 1] = '\0';
    sl->msg.dataset_id = sl->dataset;
    sl->msg.reason = sl->reason;
    ptrs[n++] = &sl->msg;
  }
  pthread_mutex_unlock(&w->tasks.lock);
  rep->policies = ptrs;
  rep->n_policies = n;
  *mem = block;
  return 0;
}

/* One heartbeat (`final`: the last one, which always says draining).
 * Returns 0 or the call's error (in err); *changed tells whether the
 * answer changed the id or the task table. */
static int beat(ferry__worker_t *w, ferry_rpc_channel_t *ch, bool final,
                int deadline_ms, unsigned flags, bool *changed,
                ferry_error_t *err) {
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
  req.endpoints = w->endpoints;
  req.n_endpoints = w->n_endpoints;
  Ferry__V1__CacheReport cache = FERRY__V1__CACHE_REPORT__INIT;
  void *cache_mem = NULL;
  if (w->cache_on) {
    if (cache_report(w, &cache, &cache_mem) != 0)
      return ferry__seterr(err, FERRY_ENOMEM, "heartbeat: out of memory");
    req.cache = &cache;
  }
  rc = ferry__wtasks_report(&w->tasks, &req, &mem);
  if (rc != 0) {
    ferry__free(cache_mem);
    return ferry__seterr(err, rc, "heartbeat: out of memory");
  }
  size_t len = ferry__v1__worker_heartbeat_request__get_packed_size(&req);
  buf = ferry__malloc(len + 1);
  if (buf == NULL) {
    ferry__free(mem);
    ferry__free(cache_mem);
    return ferry__seterr(err, FERRY_ENOMEM, "heartbeat: out of memory");
  }
  ferry__v1__worker_heartbeat_request__pack(&req, buf);
  ferry__free(mem);
  ferry__free(cache_mem);
  rc = call(w, ch, final, buf, len, deadline_ms, flags, &reply, &reply_len,
            err);
  ferry__free(buf);
  if (rc != 0)
    return rc;
  Ferry__V1__WorkerHeartbeatResponse *resp =
      ferry__v1__worker_heartbeat_response__unpack(&ferry__pb_allocator,
                                                   reply_len, reply);
  ferry_free(reply);
  if (resp == NULL)
    return ferry__seterr(err, FERRY_EINVAL,
                         "heartbeat: malformed WorkerHeartbeatResponse");
  *changed = apply(w, resp);
  ferry__v1__worker_heartbeat_response__free_unpacked(resp,
                                                      &ferry__pb_allocator);
  atomic_fetch_add(&w->heartbeats_ok, 1);
  return 0;
}

/* `t` plus `ms` milliseconds. */
static struct timespec add_ms(struct timespec t, int ms) {
  t.tv_sec += ms / 1000;
  t.tv_nsec += (long)(ms % 1000) * 1000000L;
  if (t.tv_nsec >= 1000000000L) {
    t.tv_sec++;
    t.tv_nsec -= 1000000000L;
  }
  return t;
}

/* Why the dispatcher did not answer, for the log: gRPC reports a host
 * that does not resolve as "Deadline Exceeded" and a TLS mismatch as a
 * closed socket, the same words as a dispatcher that is down, so ask the
 * resolver and the port what is there (ferry__rpc_probe, at most about a
 * second; only when the state turns unreachable). Empty when the probe
 * learns nothing the error does not already say. */
static void unreachable_why(const ferry__worker_t *w, int rc, char *out,
                            size_t cap) {
  out[0] = '\0';
  if (rc != FERRY_EGRPC_DEADLINE_EXCEEDED && rc != FERRY_EGRPC_UNAVAILABLE)
    return;
  char why[320];
  bool tls = w->cfg.tls_ca != NULL;
  switch (ferry__rpc_probe(w->cfg.dispatcher, 1000, why, sizeof(why))) {
  case FERRY_RPC_PROBE_UNRESOLVED:
    snprintf(out, cap, ": %s: check --dispatcher's host name, or give the "
             "dispatcher's IP address", why);
    break;
  case FERRY_RPC_PROBE_REFUSED:
  case FERRY_RPC_PROBE_SILENT:
  case FERRY_RPC_PROBE_OTHER:
    snprintf(out, cap, ": %s: is the dispatcher running, and is "
             "--dispatcher its HOST:PORT?", why);
    break;
  case FERRY_RPC_PROBE_TLS:
    if (!tls)
      snprintf(out, cap, ": it serves TLS and this worker plaintext: give "
               "--tls-ca (and --tls-cert/--tls-key)");
    break;
  case FERRY_RPC_PROBE_PLAINTEXT:
    if (tls)
      snprintf(out, cap, ": it serves plaintext, not TLS: drop --tls-ca, "
               "--tls-cert and --tls-key, or start it with TLS");
    break;
  default:
    break;
  }
}

static void *hb_main(void *arg) {
  ferry__worker_t *w = arg;
  ferry_rpc_channel_t *ch = NULL;
  ferry_error_t err;
  int reachable = -1; /* unknown */

  ferry_rpc_tls_t tls = {w->cfg.tls_ca, w->cfg.tls_cert, w->cfg.tls_key,
                         false};
  ferry_rpc_options_t ro = {0};
  ro.tls = w->cfg.tls_ca != NULL ? &tls : NULL;
  ro.bearer_token = w->worker_token;
  if (ferry__rpc_channel_new(w->cfg.dispatcher, &ro, &ch, &err) != 0) {
    FERRY_LOG(FERRY_LOG_ERROR, "dispatcher %s: %s", w->cfg.dispatcher,
              err.msg);
    return NULL;
  }
  for (;;) {
    pthread_mutex_lock(&w->hb_lock);
    bool final = w->hb_quit;
    /* Tasks that end from here on are in this report, or wake the next. */
    w->hb_wake = w->hb_news = w->hb_cancelled = false;
    pthread_mutex_unlock(&w->hb_lock);

    /* A dispatcher that did not answer the last one will not hear the
     * final one either: do not hold up the exit for it. */
    if (final && reachable == 0)
      break;
    int hb_ms = atomic_load(&w->heartbeat_ms);
    /* Past the longest the dispatcher holds a call back (its interval,
     * which its first answer told): a deadline means it is unreachable. */
    int deadline = hb_ms + (hb_ms > 500 ? hb_ms : 500);
    struct timespec sent;
    clock_gettime(CLOCK_MONOTONIC, &sent);
    bool changed = false;
    ferry_error_clear(&err);
    int rc = final ? beat(w, ch, true, FINAL_DEADLINE_MS, 0, &changed, &err)
                   : beat(w, ch, false, deadline, FERRY_RPC_WAIT_FOR_READY,
                          &changed, &err);
    pthread_mutex_lock(&w->hb_lock);
    bool cut = w->hb_cancelled;
    pthread_mutex_unlock(&w->hb_lock);
    if (rc != 0 && cut) {
      /* Cancelled by us for news or quit: not the dispatcher's fault. */
    } else if (rc == 0 && reachable != 1) {
      FERRY_LOG(FERRY_LOG_INFO, "dispatcher %s reachable",
                w->cfg.dispatcher);
      reachable = 1;
    } else if (rc != 0 && reachable != 0) {
      char why[400];
      unreachable_why(w, rc, why, sizeof(why));
      FERRY_LOG(FERRY_LOG_WARN, "dispatcher %s unreachable (%s)%s; retrying "
                "every %d ms", w->cfg.dispatcher, err.msg, why, hb_ms);
      reachable = 0;
    }
    if (final)
      break;

    /* The next beat: now after changes or a cut-short call, else one
     * interval after this one left, or when a task ends or quit. */
    struct timespec until = add_ms(sent, hb_ms);
    pthread_mutex_lock(&w->hb_lock);
    while (!w->hb_quit && !w->hb_wake && !changed && !(rc != 0 && cut) &&
           pthread_cond_timedwait(&w->hb_cv, &w->hb_lock, &until) == 0)
      ;
    pthread_mutex_unlock(&w->hb_lock);
  }
  ferry__rpc_channel_free(ch);
  return NULL;
}

int ferry__whb_start(ferry__worker_t *w, ferry_error_t *err) {
  if (pthread_create(&w->hb_thread, NULL, hb_main, w) != 0)
    return ferry__seterr(err, FERRY_EIO, "cannot start the heartbeat thread");
  atomic_store(&w->hb_started, true);
  return 0;
}

void ferry__whb_quit(ferry__worker_t *w) {
  pthread_mutex_lock(&w->hb_lock);
  w->hb_quit = true;
  if (w->hb_call != NULL) {
    w->hb_cancelled = true;
    ferry__rpc_stream_cancel(w->hb_call);
  }
  pthread_cond_broadcast(&w->hb_cv);
  pthread_mutex_unlock(&w->hb_lock);
}

void ferry__whb_task_ended(void *arg, bool news) {
  ferry__worker_t *w = arg;
  pthread_mutex_lock(&w->hb_lock);
  w->hb_wake = true;
  if (news) {
    w->hb_news = true;
    if (w->hb_call != NULL && !w->hb_cancelled) {
      w->hb_cancelled = true;
      ferry__rpc_stream_cancel(w->hb_call);
    }
  }
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
  atomic_store(&w->hb_started, false);
  return true;
}
