/* The client's heartbeat thread: ClientHeartbeat to the dispatcher (its
 * splits, their progress, the workers it could not reach), the answers
 * applied to the split table, and the worker streams opened or closed
 * to match (client_streams.c).
 */
#include <inttypes.h>
#include <protobuf-c/protobuf-c.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "alloc.h"
#include "client_internal.h"
#include "ferry/log.h"
#include "pb_alloc.h"
#include "rpc_methods.h"

/* ---- Heartbeats -------------------------------------------------------- */

/* ferry__rpc_unary for the heartbeat thread's beats: the call is kept in
 * c->hb_call while it runs so that ferry_client_free can cancel it
 * (`cancellable`; the goodbye is not) instead of waiting out its
 * deadline. Notes in c->hb_failed whether the beat failed. */
static int hb_unary(ferry_client_t *c, bool cancellable, const uint8_t *req,
                    size_t len, int deadline_ms, unsigned flags,
                    uint8_t **reply, size_t *reply_len, ferry_error_t *err) {
  const char *method = FERRY_METHOD_CLIENT_HEARTBEAT;
  ferry_rpc_stream_t *s;
  ferry_rpc_msg_t msg;
  *reply = NULL;
  *reply_len = 0;
  int rc = ferry__rpc_stream_open(c->dch, method, req, len, deadline_ms, flags,
                                  &s, err);
  if (rc != 0)
    return rc;
  if (cancellable) {
    pthread_mutex_lock(&c->mu);
    if (c->stopping) {
      __atomic_store_n(&c->hb_cancelled, true, __ATOMIC_RELEASE);
      ferry__rpc_stream_cancel(s);
    } else {
      c->hb_call = s;
    }
    pthread_mutex_unlock(&c->mu);
  }
  rc = ferry__rpc_stream_next(s, &msg, -1, err);
  if (rc == 0) {
    size_t n = msg.len;
    uint8_t *out = ferry__malloc(n > 0 ? n : 1);
    if (out != NULL)
      ferry__rpc_msg_copy(&msg, 0, out, n);
    ferry__rpc_msg_release(&msg);
    /* The status follows the one message. */
    rc = ferry__rpc_stream_next(s, &msg, -1, err);
    if (rc == 0) {
      ferry__rpc_msg_release(&msg);
      rc = ferry__seterr(err, FERRY_EGRPC_INTERNAL, "%s: more than one reply",
                         method);
    } else if (rc == FERRY_EOF) {
      rc = out != NULL ? 0
                       : ferry__seterr(err, FERRY_ENOMEM, "%s: out of memory",
                                       method);
    }
    if (rc == 0) {
      *reply = out;
      *reply_len = n;
    } else {
      ferry__free(out);
    }
  } else if (rc == FERRY_EOF) {
    rc = ferry__seterr(err, FERRY_EGRPC_INTERNAL, "%s: no reply", method);
  }
  pthread_mutex_lock(&c->mu);
  if (cancellable)
    c->hb_call = NULL;
  c->hb_failed = rc != 0;
  pthread_mutex_unlock(&c->mu);
  ferry__rpc_stream_free(s);
  return rc;
}

int ferry__client_heartbeat(ferry_client_t *c, bool leaving,
                            int deadline_ms,
                            Ferry__V1__ClientHeartbeatResponse **out,
                            uint64_t *records, ferry_error_t *err) {
  Ferry__V1__ClientHeartbeatRequest req =
      FERRY__V1__CLIENT_HEARTBEAT_REQUEST__INIT;
  Ferry__V1__ClientStats st = FERRY__V1__CLIENT_STATS__INIT;
  Ferry__V1__SplitProgress *prog = NULL, **pp = NULL;
  /* The unreachable workers, copied under the lock (the readers change
   * the list). */
  Ferry__V1__UnreachableWorker uw[FERRY__UNREACH_MAX];
  Ferry__V1__UnreachableWorker *uwp[FERRY__UNREACH_MAX];
  ferry__unreach_t ucopy[FERRY__UNREACH_MAX];
  uint8_t *buf = NULL, *reply = NULL;
  size_t len, reply_len;
  int rc = FERRY_ENOMEM;
  *out = NULL;
  *records = 0;
  req.job_id = c->job_id;
  req.client_id = c->client_id;
  if (c->has_secret) {
    req.client_secret.data = c->secret;
    req.client_secret.len = FERRY_CLIENT_SECRET_BYTES;
  }
  req.leaving = leaving;
  req.stats = &st;
  pthread_mutex_lock(&c->mu);
  size_t n = c->n_splits;
  prog = ferry__calloc(n ? n : 1, sizeof(*prog));
  pp = ferry__calloc(n ? n : 1, sizeof(*pp));
  if (prog != NULL && pp != NULL) {
    req.n_progress = ferry__client_progress_locked(c, prog, pp);
    req.progress = pp;
    uint32_t held = ferry__client_held_locked(c);
    /* No new splits while the trainer holds every slot: none of their
     * records could be taken, and a trainer that stalls so would only
     * take them from the job's other clients again and again. Nor before
     * the trainer's first ferry_next: a job's claim on workers is earned
     * by reading. */
    req.want_splits = leaving || !c->reading ||
                              held >= c->opts.splits_in_flight ||
                              c->handed >= c->ap.prefetch
                          ? 0
                          : c->opts.splits_in_flight - held;
    /* The wait of a ferry_next still running counts: a trainer starved
     * of its first batch is 100% stalled, not 0%. */
    double now = ferry__client_now(), total = now - c->t0;
    double waited = ferry__client_waited_locked(c, now);
    st.stall_fraction = total > 0 ? waited / total : 0;
    if (st.stall_fraction > 1)
      st.stall_fraction = 1;
    st.batches_per_second = total > 0 ? (double)c->batches / total : 0;
    st.batches = c->batches;
    /* The same since the previous heartbeat (the job gauges). */
    if (c->hb_at > 0 && now > c->hb_at) {
      st.interval_seconds = now - c->hb_at;
      st.interval_stall_fraction =
          (waited - c->hb_wait_s) / st.interval_seconds;
      if (st.interval_stall_fraction > 1)
        st.interval_stall_fraction = 1;
      if (st.interval_stall_fraction < 0)
        st.interval_stall_fraction = 0;
      st.interval_batches_per_second =
          (double)(c->batches - c->hb_batches) / st.interval_seconds;
    }
    c->hb_at = now;
    c->hb_wait_s = waited;
    c->hb_batches = c->batches;
    *records = c->records; /* what this request reports as handed out */
    if (c->space_wait_since > 0)
      req.stalled_ms =
          (uint64_t)((ferry__client_now() - c->space_wait_since) * 1e3);
    c->hb_kick = false;
    for (uint32_t i = 0; i < c->n_unreach; i++) {
      if (c->unreach[i].failures < FERRY__UNREACH_REPORT)
        continue;
      size_t k = req.n_unreachable++;
      ucopy[k] = c->unreach[i];
      ferry__v1__unreachable_worker__init(&uw[k]);
      uw[k].worker_id = ucopy[k].worker_id;
      uw[k].address = ucopy[k].address;
      uw[k].reason = ucopy[k].reason;
      uw[k].failures = ucopy[k].failures;
      uwp[k] = &uw[k];
    }
    req.unreachable = uwp;
  }
  pthread_mutex_unlock(&c->mu);
  if (prog != NULL && pp != NULL)
    buf = ferry__client_pack(&req.base, &len);
  ferry__free(prog);
  ferry__free(pp);
  if (buf == NULL)
    return ferry__seterr(err, FERRY_ENOMEM, "client: out of memory");
  /* Wait for ready (within the beat's deadline), except when leaving: a
   * client has no thread that polls gRPC between its calls, and a call
   * failing fast on a channel in TRANSIENT_FAILURE polls for nothing, so
   * the reconnection to a restarted dispatcher (its SETTINGS frame) was
   * driven only by whatever else the client happened to wait on: with
   * no stream open, heartbeats failed for 8 to 25 s after the restart
   * (tests/chaos seed 5061, its connection's receive queue full of
   * unread bytes), long enough to be declared lost and have its job
   * collected. A beat that waits for ready polls the handshake itself. */
  rc = hb_unary(c, !leaving, buf, len, deadline_ms,
                leaving ? 0 : FERRY_RPC_WAIT_FOR_READY, &reply, &reply_len,
                err);
  ferry__free(buf);
  if (rc != 0) {
    /* The dispatcher may not have seen the restarts: ask again. */
    pthread_mutex_lock(&c->mu);
    ferry__client_restart_unsent_locked(c);
    pthread_mutex_unlock(&c->mu);
    return rc;
  }
  *out = ferry__v1__client_heartbeat_response__unpack(&ferry__pb_allocator,
                                                      reply_len, reply);
  ferry__free(reply);
  if (*out == NULL)
    return ferry__seterr(err, FERRY_EGRPC_INTERNAL,
                         "%s: malformed answer",
                         FERRY_METHOD_CLIENT_HEARTBEAT);
  return 0;
}

void *ferry__client_hb_main(void *arg) {
  ferry_client_t *c = arg;
  uint32_t period = c->opts.heartbeat_ms;
  /* A beat may take longer than a period, never longer than the connect
   * budget. */
  int deadline = period * 4 > 1000 ? (int)period * 4 : 1000;
  if (deadline > (int)c->opts.connect_timeout_ms)
    deadline = (int)c->opts.connect_timeout_ms;
  if (deadline < 1)
    deadline = 1;
  c->last_hb_ok = ferry__client_now();
  pthread_mutex_lock(&c->mu);
  while (!c->stopping) {
    pthread_mutex_unlock(&c->mu);
    Ferry__V1__ClientHeartbeatResponse *r;
    ferry_error_t e;
    double t_send = ferry__client_now();
    uint64_t records = 0;
    int rc = ferry__client_heartbeat(c, false, deadline, &r, &records, &e);
    if (rc != 0 && __atomic_load_n(&c->hb_cancelled, __ATOMIC_ACQUIRE)) {
      /* ferry_client_free cancelled the beat: leaving, not failing. */
      pthread_mutex_lock(&c->mu);
      break;
    }
    if (rc == 0) {
      c->last_hb_ok = ferry__client_now();
      pthread_mutex_lock(&c->mu);
      c->hb_down_since = 0;
      pthread_mutex_unlock(&c->mu);
      ferry__client_answer(c, t_send, records, r);
      ferry__client_sync_workers(c, r);
      ferry__v1__client_heartbeat_response__free_unpacked(
          r, &ferry__pb_allocator);
    } else {
      double down = ferry__client_now() - c->last_hb_ok;
      FERRY_LOG(FERRY_LOG_WARN, "client: heartbeat: %s", e.msg);
      pthread_mutex_lock(&c->mu);
      if (c->hb_down_since == 0)
        c->hb_down_since = c->last_hb_ok;
      size_t n = strnlen(e.msg, sizeof(c->hb_error) - 1);
      memcpy(c->hb_error, e.msg, n);
      c->hb_error[n] = '\0';
      pthread_mutex_unlock(&c->mu);
      if (down * 1e3 > c->opts.dispatcher_timeout_ms) {
        pthread_mutex_lock(&c->mu);
        ferry__client_fail_locked(c, rc,
                                  "dispatcher %s unreachable for %.0f s: %s",
                                  c->dispatcher, down, e.msg);
        pthread_mutex_unlock(&c->mu);
      }
    }
    pthread_mutex_lock(&c->mu);
    /* A rank waiting for the next epoch, which starts when the slowest
     * rank reports its last records: asking every FERRY__EPOCH_POLL_MS
     * meanwhile, rather than every heartbeat_ms, cut the gap between
     * epochs at 250 ms heartbeats from about 270 ms to one poll. */
    uint32_t wait = ferry__client_between_epochs_locked(c) &&
                            period > FERRY__EPOCH_POLL_MS
                        ? FERRY__EPOCH_POLL_MS
                        : period;
    struct timespec ts = ferry__client_deadline(wait);
    while (!c->stopping && !c->hb_kick &&
           pthread_cond_timedwait(&c->hb_cv, &c->mu, &ts) != ETIMEDOUT)
      ;
  }
  pthread_mutex_unlock(&c->mu);
  return NULL;
}
