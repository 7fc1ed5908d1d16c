/* The chunk streams to clients and the chunk queues (loop thread).
 *
 * Pipeline threads push finished chunks into the inbox; the loop moves
 * them into one FIFO per (job, client), where they wait for that client's
 * stream, opened through any registered transport (transport.h).
 * Each stream has at most the transport's window of sends in flight;
 * on_sent sends the next chunk. Chunks queued
 * before the stream opens, or while a client reconnects, wait in the
 * queue (the pool bounds them); chunks of cancelled tasks are dropped when
 * the inbox is drained or a purge is asked for.
 *
 * Stall clock: each queue publishes in its pool key (stall_since_ms) since
 * when it has had chunks queued or a send in flight without the transport
 * taking one (a completed send); 0 while empty. Heartbeats report it per task
 * as TaskProgress.stalled_ms, and the dispatcher takes the splits of a client
 * whose stream stalls past --client-stall-ms.
 */
#include <string.h>
#include <time.h>

#include "alloc.h"
#include "ferry/log.h"
#include "transport.h"
#include "wmetrics.h"
#include "worker.h"

struct ferry__wqueue_s {
  struct ferry__wqueue_s *next;
  ferry__worker_t *w;
  uint64_t job_id, client_id;
  ferry__wchunk_t *head, *tail;
  size_t n;
  ferry_transport_stream_t *call; /* the client's open stream, or NULL */
  unsigned sending;       /* sends of `call` in flight */
  /* The client's secret as its tasks give it (known once a chunk
   * of one was queued), and the secret `call` presented. */
  uint8_t secret[FERRY_CLIENT_SECRET_BYTES];
  bool has_secret;
  uint8_t call_secret[FERRY_CLIENT_SECRET_BYTES];
  ferry__wkey_t *key;     /* the stream's pool key (a reference) */
  uint64_t gen;           /* `call`'s number (ferry__worker_t.call_gen) */
};

/* A stream stalled this long when its last task ends is reclaimed. */
#define RECLAIM_STALL_MS 1000

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  int64_t ms = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
  return ms > 0 ? ms : 1;
}

/* Publishes the stall clock: restarted on `progress` (the transport took a
 * chunk),
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
    ferry__metric_add(ferry__wmetrics()->client_wait, now - since);
  atomic_store(&q->key->stall_since_ms, idle ? 0 : now);
}

/* Publishes whether the client has a stream open here (the tasks' gate
 * and TaskProgress.unread_ms, worker.h) as `call` becomes the queue's
 * stream (NULL: it has none). */
static void queue_set_call(ferry__wqueue_t *q, ferry_transport_stream_t *call) {
  bool had = q->call != NULL;
  q->call = call;
  if (call != NULL)
    q->gen = ++q->w->call_gen;
  if (q->key == NULL)
    return;
  atomic_store(&q->key->read_ms, now_ms());
  atomic_store(&q->key->reader, call != NULL);
  if (call != NULL && !had)
    ferry__wtasks_reader_opened(&q->w->tasks, q->job_id, q->client_id);
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

/* The queue's stream ended early, not by the worker's finish: the client
 * cancelled it, went away or opened a newer one. Chunks that went out on
 * it may never have reached the client, and a lease granted after the
 * client saw its stream break (its chunks sent into it before this
 * worker knew) is one the client never asks for again: the tasks whose
 * last chunk went out on it are reported (TaskProgress.resend), and the
 * dispatcher leases them again from what the client acknowledged. */
static void queue_lost_call(ferry__wqueue_t *q) {
  if (q->call == NULL)
    return;
  size_t n = ferry__wtasks_mark_resend(&q->w->tasks, q->job_id, q->client_id,
                                       q->gen);
  if (n == 0)
    return;
  /* Debug: every trainer that exits before its leases end does this; the
   * dispatcher logs the leases it acts on. */
  FERRY_LOG(FERRY_LOG_DEBUG, "stream job %llu client %llu ended early: %zu "
            "of its tasks here sent chunks into it; reporting them for a "
            "new lease", (unsigned long long)q->job_id,
            (unsigned long long)q->client_id, n);
  ferry__whb_task_ended(q->w, true);
}

/* Ends the queue's stream, which waits for a reconnect. */
static void queue_end_call(ferry__wqueue_t *q, int status, const char *msg) {
  ferry_transport_stream_t *call = q->call;
  if (status != FERRY_RPC_OK && status != FERRY_RPC_UNAVAILABLE)
    queue_lost_call(q);
  queue_set_call(q, NULL);
  q->sending = 0;
  ferry__transport_finish(call, status, msg);
}

static void on_sent(ferry_transport_stream_t *call, int ok, void *arg) {
  ferry__wqueue_t *q = arg;
  if (q->call != call)
    return;
  q->sending--;
  if (ok)
    ferry__metric_add(ferry__wmetrics()->chunks_sent, 1);
  if (!ok) {
    /* The client is gone; the chunks that were in flight are lost with
     * the stream. The queue waits for a reconnect. */
    queue_end_call(q, FERRY_RPC_CANCELLED, "stream broken");
    queue_mark(q, false);
    return;
  }
  send_next(q);
  queue_mark(q, true);
}

/* The transport is done with a sent chunk's memory (any thread). */
static void chunk_release(void *arg) { ferry__wpool_release(arg); }

static void send_next(ferry__wqueue_t *q) {
  while (q->call != NULL && q->sending < ferry__transport_window(q->call) &&
         q->head != NULL) {
    if (ferry__transport_ended(q->call)) {
      queue_end_call(q, FERRY_RPC_CANCELLED, "cancelled");
      return;
    }
    ferry__wchunk_t *c = q->head;
    /* A chunk goes only to the call that carries its client's
     * secret; any other call is ended and the chunk waits. */
    if (c->task != NULL && c->task->has_secret &&
        !ferry__rpc_bytes_equal(c->task->secret, q->call_secret,
                                FERRY_CLIENT_SECRET_BYTES)) {
      FERRY_LOG(FERRY_LOG_WARN, "StreamChunks for job %llu client %llu "
                "without that client's secret: ended",
                (unsigned long long)q->job_id,
                (unsigned long long)q->client_id);
      queue_end_call(q, FERRY_RPC_PERMISSION_DENIED,
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
    /* The transport may free the pieces at any time from here on. */
    atomic_store(&c->task->sent_gen, q->gen);
    ferry__wtask_unref(c->task);
    c->task = NULL;
    ferry_transport_send_t m = {.release = chunk_release, .release_arg = c};
    m.n = c->n_pieces;
    for (size_t i = 0; i < m.n; i++)
      m.pieces[i] = (ferry_transport_piece_t){c->pieces[i].ptr,
                                              c->pieces[i].len};
    int rc = ferry__transport_send(q->call, &m);
    if (rc != 0) {
      FERRY_LOG(FERRY_LOG_DEBUG, "stream job %llu client %llu: send: %s",
                (unsigned long long)q->job_id,
                (unsigned long long)q->client_id, ferry_strerror(rc));
      queue_end_call(q, FERRY_RPC_CANCELLED, "stream broken");
      return;
    }
    q->sending++;
  }
}

/* After a purge: a stream with sends in flight but no live task left
 * (the dispatcher took the client's splits: a stalled client, a lost
 * lease) is ended. Its in-flight chunks are of leases that ended, and a
 * client whose reader is blocked never completes them: a transport whose
 * client pulls payloads (rendezvous) holds them, i.e. pool memory every
 * other stream waits for (one chunk block may be larger than the whole
 * pool). Ending the stream with an error makes the transport give them
 * back (its end reaches the client at once, which drops what it holds);
 * the client reopens a stream for what it is given next. */
static void queue_reclaim(ferry__wqueue_t *q) {
  if (q->call == NULL || q->sending == 0 || q->head != NULL ||
      q->key == NULL || ferry__wpool_key_tasks(&q->w->pool, q->key) > 0)
    return;
  /* Only a stream that has not completed a send for a while: a reading
   * client completes (drops) the chunks of its ended leases by itself, and
   * ending its stream would restart its other splits here. */
  int64_t since = atomic_load(&q->key->stall_since_ms);
  if (since == 0 || now_ms() - since < RECLAIM_STALL_MS)
    return;
  FERRY_LOG(FERRY_LOG_INFO, "stream job %llu client %llu: its tasks here "
            "ended with %u sends held: stream ended, their chunks reclaimed",
            (unsigned long long)q->job_id, (unsigned long long)q->client_id,
            q->sending);
  queue_end_call(q, FERRY_RPC_CANCELLED, "its leases on this worker ended");
  queue_mark(q, false);
}

/* The client cancelled, went away or the server is shutting down. */
static void on_call_end(ferry_transport_stream_t *call, void *arg) {
  ferry__wqueue_t *q = arg;
  if (q->call == call) {
    queue_lost_call(q);
    queue_set_call(q, NULL);
    q->sending = 0;
  }
  ferry__transport_finish(call, FERRY_RPC_CANCELLED, "cancelled");
}

static void on_stream(ferry_transport_stream_t *call,
                      const ferry_transport_open_t *req, void *user) {
  ferry__worker_t *w = user;
  uint64_t job_id = req->job_id, client_id = req->client_id;
  uint8_t secret[FERRY_CLIENT_SECRET_BYTES] = {0};
  bool secret_ok = req->secret != NULL;
  if (secret_ok)
    memcpy(secret, req->secret, FERRY_CLIENT_SECRET_BYTES);
  /* The client token when configured, then the client secret. */
  if (w->client_token != NULL) {
    const char *tok = req->bearer;
    if (tok == NULL ||
        !ferry__rpc_token_equal(tok, req->bearer_len, w->client_token)) {
      FERRY_LOG(FERRY_LOG_WARN, "StreamChunks: refused a caller with %s "
                "bearer token", tok == NULL ? "no" : "a wrong");
      ferry__transport_finish(call, FERRY_RPC_UNAUTHENTICATED,
                              "missing or invalid bearer token");
      return;
    }
  }
  if (!secret_ok) {
    FERRY_LOG(FERRY_LOG_WARN, "StreamChunks for job %llu client %llu "
              "without a client secret: refused",
              (unsigned long long)job_id, (unsigned long long)client_id);
    ferry__transport_finish(call, FERRY_RPC_PERMISSION_DENIED,
                            "not this client's stream");
    return;
  }
  if (w->stopping) {
    ferry__transport_finish(call, FERRY_RPC_UNAVAILABLE,
                            "worker shutting down");
    return;
  }
  ferry__wqueue_t *q = queue_get(w, job_id, client_id, true);
  if (q == NULL) {
    ferry__transport_finish(call, FERRY_RPC_INTERNAL, "out of memory");
    return;
  }
  if (q->has_secret &&
      !ferry__rpc_bytes_equal(q->secret, secret, FERRY_CLIENT_SECRET_BYTES)) {
    FERRY_LOG(FERRY_LOG_WARN, "StreamChunks for job %llu client %llu "
              "with a wrong client secret: refused",
              (unsigned long long)job_id, (unsigned long long)client_id);
    ferry__transport_finish(call, FERRY_RPC_PERMISSION_DENIED,
                            "not this client's stream");
    if (q->call == NULL && q->head == NULL)
      queues_trim(w);
    return;
  }
  if (q->call != NULL && !q->has_secret &&
      !ferry__rpc_bytes_equal(q->call_secret, secret,
                              FERRY_CLIENT_SECRET_BYTES)) {
    /* Two callers claim one stream before any task told the secret: the
     * first keeps it until a chunk shows which one is the client. */
    ferry__transport_finish(call, FERRY_RPC_UNAVAILABLE, "stream busy; retry");
    return;
  }
  if (q->call != NULL) /* a reconnect replaces the older stream */
    queue_end_call(q, FERRY_RPC_CANCELLED, "replaced by a newer stream");
  queue_set_call(q, call);
  memcpy(q->call_secret, secret, FERRY_CLIENT_SECRET_BYTES);
  q->sending = 0;
  FERRY_LOG(FERRY_LOG_DEBUG, "stream open: job %llu client %llu, %zu queued "
            "(%s)", (unsigned long long)job_id, (unsigned long long)client_id,
            q->n, call->ops->transport->name);
  ferry__transport_accept(call, on_sent, on_call_end, q);
  /* on_call_end may have run already (the client is gone). */
  if (q->call != call) {
    queue_mark(q, false);
    return;
  }
  send_next(q);
  queue_mark(q, false);
}

/* Publishes transport `i`'s endpoint (its address, if it needs one). */
static void publish(ferry__worker_t *w, size_t i) {
  const ferry_transport_ops_t *ops = ferry__transport_at(i);
  size_t n = 0;
  const void *a = ferry__transport_server_address(w->transports[i], &n);
  if ((ops->caps & FERRY_TRANSPORT_NEEDS_ADDRESS) &&
      (n == 0 || n > FERRY_TRANSPORT_ADDRESS_MAX)) {
    FERRY_LOG(FERRY_LOG_WARN, "worker: transport %s: an address of %zu "
              "bytes (1 to %d expected): not published, clients use the "
              "others", ops->name, n, FERRY_TRANSPORT_ADDRESS_MAX);
    return;
  }
  /* A copy: the heartbeat thread reads it until ferry__worker_close,
   * after the server that owns `a` is gone. */
  uint8_t *copy = NULL;
  if (n > 0) {
    copy = ferry__malloc(n);
    if (copy == NULL) {
      FERRY_LOG(FERRY_LOG_WARN, "worker: transport %s: out of memory for "
                "its %zu-byte address: not published", ops->name, n);
      return;
    }
    memcpy(copy, a, n);
  }
  Ferry__V1__TransportEndpoint *e = &w->endpoint_msgs[w->n_endpoints];
  ferry__v1__transport_endpoint__init(e);
  e->transport = (char *)ops->name;
  e->address.data = copy;
  e->address.len = n;
  w->endpoints[w->n_endpoints++] = e;
}

/* Starts every registered transport. One that needs no address is
 * reached at the worker's gRPC address, which clients count on: its
 * failure fails the worker. One that needs an address is published only
 * when it started (clients on auto use the others; those asking for it
 * by name are told why). */
int ferry__wstream_register(ferry__worker_t *w, ferry_error_t *err) {
  ferry_transport_server_config_t cfg = {0};
  cfg.loop = w->loop;
  cfg.rpc_server = w->server;
  cfg.on_open = on_stream;
  cfg.user = w;
  cfg.host = w->cfg.host;
  for (size_t i = 0; i < ferry__transport_count(); i++) {
    const ferry_transport_ops_t *ops = ferry__transport_at(i);
    const ferry_transport_server_ops_t *sops = ferry__transport_server_at(i);
    bool required = !(ops->caps & FERRY_TRANSPORT_NEEDS_ADDRESS);
    ferry_error_t e;
    if (sops->server_new(&cfg, &w->transports[i], required ? err : &e) != 0) {
      if (required)
        return ferry__prefixerr(err, "transport %s", ops->name);
      FERRY_LOG(FERRY_LOG_WARN, "worker: transport %s unavailable, not "
                "published: %s", ops->name, e.msg);
      continue;
    }
    publish(w, i);
  }
  return 0;
}

/* After the gRPC server's shutdown: no stream is open any more. */
static void transports_shutdown(ferry__worker_t *w) {
  for (size_t i = 0; i < FERRY_TRANSPORTS_MAX; i++) {
    ferry_transport_server_t *t = w->transports[i];
    w->transports[i] = NULL;
    if (t != NULL)
      ferry__transport_server_shutdown(t, NULL, NULL);
  }
}

void ferry__wstream_endpoints_free(ferry__worker_t *w) {
  for (size_t i = 0; i < w->n_endpoints; i++)
    ferry__free(w->endpoint_msgs[i].address.data);
  w->n_endpoints = 0;
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

int ferry__wstream_open_calls(const ferry__worker_t *w) {
  int n = 0;
  for (const ferry__wqueue_t *q = w->queues; q != NULL; q = q->next)
    n += q->call != NULL;
  return n;
}

void ferry__wstream_close_all(ferry__worker_t *w) {
  for (ferry__wqueue_t *q = w->queues; q != NULL; q = q->next) {
    queue_purge(q, true);
    if (q->call != NULL)
      queue_end_call(q, FERRY_RPC_UNAVAILABLE, "worker shutting down");
  }
  queues_trim(w);
  if (w->server_done)
    transports_shutdown(w);
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
    for (ferry__wqueue_t *q = w->queues; q != NULL; q = q->next) {
      queue_purge(q, false);
      queue_reclaim(q);
    }
  for (ferry__wqueue_t *q = w->queues; q != NULL; q = q->next) {
    send_next(q);
    queue_mark(q, false);
  }
  if (purge)
    queues_trim(w);
  if (stop)
    ferry__worker_shutdown(w);
}
