/* Worker/StreamChunks and the chunk queues (loop thread).
 *
 * Pipeline threads push finished chunks into the inbox; the loop moves
 * them into one FIFO per (job, client), where they wait for that client's
 * StreamChunks call. Each call has at most one send in flight; its on_sent
 * callback sends the next chunk. Chunks queued before the call opens, or
 * while a client reconnects, wait in the queue (the pool bounds them);
 * chunks of cancelled tasks are dropped when the inbox is drained or a
 * purge is asked for.
 *
 * Stall clock: each queue publishes in its pool key (stall_since_ms) since
 * when it has had chunks queued or a send in flight without gRPC taking
 * one (a completed send); 0 while empty. Heartbeats report it per task as
 * TaskProgress.stalled_ms, and the dispatcher takes the splits of a client
 * whose stream stalls past --client-stall-ms.
 */
#include <string.h>
#include <time.h>

#include "ferry/alloc.h"
#include "ferry/log.h"
#include "worker.h"
#include "wmetrics.h"

struct ferry__wqueue_s {
  struct ferry__wqueue_s *next;
  ferry__worker_t *w;
  uint64_t job_id, client_id;
  ferry__wchunk_t *head, *tail;
  size_t n;
  ferry_rpc_call_t *call; /* the open StreamChunks call, or NULL */
  bool sending;           /* a send of `call` is in flight */
  /* Issue 8: the client's secret as its tasks give it (known once a chunk
   * of one was queued), and the secret `call` presented. */
  uint8_t secret[FERRY_CLIENT_SECRET_BYTES];
  bool has_secret;
  uint8_t call_secret[FERRY_CLIENT_SECRET_BYTES];
  ferry__wkey_t *key;     /* the stream's pool key (a reference) */
};

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  int64_t ms = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
  return ms > 0 ? ms : 1;
}

/* Publishes the stall clock: restarted on `progress` (gRPC took a chunk),
 * started when the queue begins to wait, stopped when it is idle. */
static void queue_mark(ferry__wqueue_t *q, bool progress) {
  if (q->key == NULL)
    return;
  int64_t since = atomic_load(&q->key->stall_since_ms);
  bool idle = q->head == NULL && !q->sending;
  if (!idle && !progress && since != 0)
    return; /* still waiting */
  int64_t now = idle && since == 0 ? 0 : now_ms();
  /* The wait that ends here counts as time blocked on the client. */
  if (since != 0 && now > since)
    ferry_metric_add(ferry__wmetrics()->client_wait, now - since);
  atomic_store(&q->key->stall_since_ms, idle ? 0 : now);
}

static ferry__wqueue_t *queue_get(ferry__worker_t *w, uint64_t job_id,
                                  uint64_t client_id, bool create) {
  for (ferry__wqueue_t *q = w->queues; q != NULL; q = q->next)
    if (q->job_id == job_id && q->client_id == client_id)
      return q;
  if (!create)
    return NULL;
  ferry__wqueue_t *q = ferry__calloc(1, sizeof(*q));
  if (q == NULL)
    return NULL;
  q->w = w;
  q->job_id = job_id;
  q->client_id = client_id;
  q->key = ferry__wpool_key_get(&w->pool, job_id, client_id, false);
  q->next = w->queues;
  w->queues = q;
  return q;
}

/* Frees queues with neither a call nor chunks. */
static void queues_trim(ferry__worker_t *w) {
  for (ferry__wqueue_t **pp = &w->queues; *pp != NULL;) {
    ferry__wqueue_t *q = *pp;
    if (q->call == NULL && q->head == NULL) {
      *pp = q->next;
      if (q->key != NULL)
        atomic_store(&q->key->stall_since_ms, 0);
      ferry__wpool_key_put(&w->pool, q->key, false);
      ferry__free(q);
    } else {
      pp = &q->next;
    }
  }
}

static bool chunk_dead(const ferry__wchunk_t *c) {
  return c->task != NULL && atomic_load(&c->task->cancelled);
}

/* Drops the queued chunks of cancelled tasks (all of them with `all`). */
static void queue_purge(ferry__wqueue_t *q, bool all) {
  ferry__wchunk_t **pp = &q->head, *prev = NULL;
  while (*pp != NULL) {
    ferry__wchunk_t *c = *pp;
    if (all || chunk_dead(c)) {
      *pp = c->next;
      q->n--;
      ferry__wpool_release(c);
    } else {
      prev = c;
      pp = &c->next;
    }
  }
  q->tail = prev;
  queue_mark(q, false);
}

static void send_next(ferry__wqueue_t *q);

static void on_sent(ferry_rpc_call_t *call, int ok, void *arg) {
  ferry__wqueue_t *q = arg;
  if (q->call != call)
    return;
  q->sending = false;
  if (ok)
    ferry_metric_add(ferry__wmetrics()->chunks_sent, 1);
  if (!ok) {
    /* The client is gone; the chunk that was in flight is lost with the
     * call. The queue waits for a reconnect. */
    q->call = NULL;
    ferry_rpc_stream_finish(call, FERRY_RPC_CANCELLED, "stream broken");
    queue_mark(q, false);
    return;
  }
  send_next(q);
  queue_mark(q, true);
}

static void send_next(ferry__wqueue_t *q) {
  while (q->call != NULL && !q->sending && q->head != NULL) {
    if (ferry_rpc_call_cancelled(q->call)) {
      ferry_rpc_call_t *call = q->call;
      q->call = NULL;
      ferry_rpc_stream_finish(call, FERRY_RPC_CANCELLED, "cancelled");
      return;
    }
    ferry__wchunk_t *c = q->head;
    /* Issue 8: a chunk goes only to the call that carries its client's
     * secret; any other call is ended and the chunk waits. */
    if (c->task != NULL && c->task->has_secret &&
        !ferry_rpc_bytes_equal(c->task->secret, q->call_secret,
                               FERRY_CLIENT_SECRET_BYTES)) {
      ferry_rpc_call_t *call = q->call;
      q->call = NULL;
      FERRY_LOG(FERRY_LOG_WARN, "StreamChunks for job %llu client %llu "
                "without that client's secret: ended",
                (unsigned long long)q->job_id,
                (unsigned long long)q->client_id);
      ferry_rpc_stream_finish(call, FERRY_RPC_PERMISSION_DENIED,
                              "not this client's stream");
      return;
    }
    q->head = c->next;
    if (q->head == NULL)
      q->tail = NULL;
    q->n--;
    c->next = NULL;
    if (chunk_dead(c)) {
      ferry__wpool_release(c);
      continue;
    }
    /* gRPC may free the pieces at any time from here on. */
    ferry__wtask_unref(c->task);
    c->task = NULL;
    ferry_rpc_piece_t pieces[2];
    size_t n = ferry__wchunk_pieces(c, pieces);
    int rc = ferry_rpc_stream_send(q->call, pieces, n, on_sent, q);
    if (rc != 0) {
      ferry_rpc_call_t *call = q->call;
      q->call = NULL;
      FERRY_LOG(FERRY_LOG_DEBUG, "stream job %llu client %llu: send: %s",
                (unsigned long long)q->job_id,
                (unsigned long long)q->client_id, ferry_strerror(rc));
      ferry_rpc_stream_finish(call, FERRY_RPC_CANCELLED, "stream broken");
      return;
    }
    q->sending = true;
  }
}

static void on_call_cancel(ferry_rpc_call_t *call, void *arg) {
  ferry__wqueue_t *q = arg;
  if (q->call == call) {
    q->call = NULL;
    q->sending = false;
  }
  ferry_rpc_stream_finish(call, FERRY_RPC_CANCELLED, "cancelled");
}

static void on_stream(ferry_rpc_call_t *call, const uint8_t *req, size_t len,
                      void *user) {
  ferry__worker_t *w = user;
  Ferry__V1__StreamChunksRequest *m =
      ferry__v1__stream_chunks_request__unpack(NULL, len, req);
  if (m == NULL) {
    ferry_rpc_reply_error(call, FERRY_RPC_INVALID_ARGUMENT,
                          "StreamChunksRequest: malformed protobuf");
    return;
  }
  uint64_t job_id = m->job_id, client_id = m->client_id;
  uint8_t secret[FERRY_CLIENT_SECRET_BYTES] = {0};
  bool secret_ok = m->client_secret.len == FERRY_CLIENT_SECRET_BYTES;
  if (secret_ok)
    memcpy(secret, m->client_secret.data, FERRY_CLIENT_SECRET_BYTES);
  ferry__v1__stream_chunks_request__free_unpacked(m, NULL);
  /* Issue 8: the client token when configured, then the client secret. */
  if (w->client_token != NULL) {
    size_t n;
    const char *tok = ferry_rpc_call_bearer(call, &n);
    if (tok == NULL || !ferry_rpc_token_equal(tok, n, w->client_token)) {
      FERRY_LOG(FERRY_LOG_WARN, "StreamChunks: refused a caller with %s "
                "bearer token", tok == NULL ? "no" : "a wrong");
      ferry_rpc_reply_error(call, FERRY_RPC_UNAUTHENTICATED,
                            "missing or invalid bearer token");
      return;
    }
  }
  if (!secret_ok) {
    FERRY_LOG(FERRY_LOG_WARN, "StreamChunks for job %llu client %llu "
              "without a client secret: refused",
              (unsigned long long)job_id, (unsigned long long)client_id);
    ferry_rpc_reply_error(call, FERRY_RPC_PERMISSION_DENIED,
                          "not this client's stream");
    return;
  }
  if (w->stopping) {
    ferry_rpc_reply_error(call, FERRY_RPC_UNAVAILABLE,
                          "worker shutting down");
    return;
  }
  ferry__wqueue_t *q = queue_get(w, job_id, client_id, true);
  if (q == NULL) {
    ferry_rpc_reply_error(call, FERRY_RPC_INTERNAL, "out of memory");
    return;
  }
  if (q->has_secret &&
      !ferry_rpc_bytes_equal(q->secret, secret, FERRY_CLIENT_SECRET_BYTES)) {
    FERRY_LOG(FERRY_LOG_WARN, "StreamChunks for job %llu client %llu "
              "with a wrong client secret: refused",
              (unsigned long long)job_id, (unsigned long long)client_id);
    ferry_rpc_reply_error(call, FERRY_RPC_PERMISSION_DENIED,
                          "not this client's stream");
    if (q->call == NULL && q->head == NULL)
      queues_trim(w);
    return;
  }
  if (q->call != NULL && !q->has_secret &&
      !ferry_rpc_bytes_equal(q->call_secret, secret,
                             FERRY_CLIENT_SECRET_BYTES)) {
    /* Two callers claim one stream before any task told the secret: the
     * first keeps it until a chunk shows which one is the client. */
    ferry_rpc_reply_error(call, FERRY_RPC_UNAVAILABLE,
                          "stream busy; retry");
    return;
  }
  if (q->call != NULL) {
    /* A reconnect replaces the older call. */
    ferry_rpc_call_t *old = q->call;
    q->call = NULL;
    ferry_rpc_stream_finish(old, FERRY_RPC_CANCELLED,
                            "replaced by a newer stream");
  }
  q->call = call;
  memcpy(q->call_secret, secret, FERRY_CLIENT_SECRET_BYTES);
  q->sending = false;
  FERRY_LOG(FERRY_LOG_DEBUG, "stream open: job %llu client %llu, %zu queued",
            (unsigned long long)job_id, (unsigned long long)client_id, q->n);
  ferry_rpc_call_on_cancel(call, on_call_cancel, q);
  send_next(q);
  queue_mark(q, false);
}

int ferry__wstream_register(ferry__worker_t *w, ferry_error_t *err) {
  return ferry_rpc_server_register(w->server, FERRY_WORKER_METHOD,
                                   FERRY_RPC_SERVER_STREAM, on_stream, w,
                                   err);
}

void ferry__winbox_push(ferry__wchunk_t *c, void *arg) {
  ferry__worker_t *w = arg;
  c->next = NULL;
  pthread_mutex_lock(&w->inbox_lock);
  if (w->inbox_closed) {
    pthread_mutex_unlock(&w->inbox_lock);
    ferry__wpool_release(c);
    return;
  }
  if (w->inbox_tail != NULL)
    w->inbox_tail->next = c;
  else
    w->inbox_head = c;
  w->inbox_tail = c;
  /* Under the lock, so the handle cannot be closing meanwhile. */
  uv_async_send(&w->inbox_async);
  pthread_mutex_unlock(&w->inbox_lock);
}

void ferry__winbox_purge(ferry__worker_t *w) {
  pthread_mutex_lock(&w->inbox_lock);
  if (!w->inbox_closed) {
    w->inbox_purge = true;
    uv_async_send(&w->inbox_async);
  }
  pthread_mutex_unlock(&w->inbox_lock);
}

void ferry__wstream_close_all(ferry__worker_t *w) {
  for (ferry__wqueue_t *q = w->queues; q != NULL; q = q->next) {
    queue_purge(q, true);
    if (q->call != NULL) {
      ferry_rpc_call_t *call = q->call;
      q->call = NULL;
      q->sending = false;
      ferry_rpc_stream_finish(call, FERRY_RPC_UNAVAILABLE,
                              "worker shutting down");
    }
  }
  queues_trim(w);
}

void ferry__winbox_on_async(uv_async_t *a) {
  ferry__worker_t *w = a->data;
  pthread_mutex_lock(&w->inbox_lock);
  ferry__wchunk_t *c = w->inbox_head;
  bool purge = w->inbox_purge, stop = w->inbox_stop;
  w->inbox_head = w->inbox_tail = NULL;
  w->inbox_purge = w->inbox_stop = false;
  pthread_mutex_unlock(&w->inbox_lock);

  ferry__wqueue_t *touched = NULL;
  while (c != NULL) {
    ferry__wchunk_t *next = c->next;
    c->next = NULL;
    ferry__wqueue_t *q = NULL;
    if (!w->stopping && !chunk_dead(c))
      q = touched != NULL && touched->job_id == c->job_id &&
                  touched->client_id == c->client_id
              ? touched
              : queue_get(w, c->job_id, c->client_id, true);
    if (q == NULL) {
      ferry__wpool_release(c);
    } else {
      if (!q->has_secret && c->task != NULL && c->task->has_secret) {
        memcpy(q->secret, c->task->secret, FERRY_CLIENT_SECRET_BYTES);
        q->has_secret = true;
      }
      if (q->tail != NULL)
        q->tail->next = c;
      else
        q->head = c;
      q->tail = c;
      q->n++;
      touched = q;
    }
    c = next;
  }
  if (purge)
    for (ferry__wqueue_t *q = w->queues; q != NULL; q = q->next)
      queue_purge(q, false);
  for (ferry__wqueue_t *q = w->queues; q != NULL; q = q->next) {
    send_next(q);
    queue_mark(q, false);
  }
  if (purge)
    queues_trim(w);
  if (stop)
    ferry__worker_shutdown(w);
}
