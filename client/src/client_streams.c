/* The client's worker streams: which transport reaches each worker (the
 * seam's choice, and the transports that fell back), the workers it could
 * not reach, the reader thread per stream that parses chunks and hands
 * them to the assembler (client_assemble.c), and the set of streams kept
 * in step with the dispatcher's view.
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

/* ---- Stream readers ---------------------------------------------------- */

/* The chunk parser and the assembler read a transport's message. */
static size_t tmsg_copy(const ferry_chunk_src_t *src, size_t off, void *dst,
                        size_t n) {
  const ferry_transport_msg_t *m = src->ctx;
  return m->copy(m, off, dst, n);
}

/* The transports whose streams to `address` fell back (mu held). */
static uint32_t fallbacks_locked(const ferry_client_t *c,
                                 const char *address) {
  for (size_t i = 0; i < c->n_fallbacks; i++)
    if (strcmp(c->fallbacks[i].address, address) == 0)
      return c->fallbacks[i].failed;
  return 0;
}

/* Adds transport `index` to them (mu held; out of memory: the next
 * stream tries it again, which fails the same way). */
static void fallback_add_locked(ferry_client_t *c, const char *address,
                                int index) {
  for (size_t i = 0; i < c->n_fallbacks; i++)
    if (strcmp(c->fallbacks[i].address, address) == 0) {
      c->fallbacks[i].failed |= 1u << index;
      return;
    }
  char *a = ferry__strdup(address);
  if (a == NULL ||
      !FERRY__GROW(c->fallbacks, c->cap_fallbacks, c->n_fallbacks + 1, 4)) {
    ferry__free(a);
    return;
  }
  c->fallbacks[c->n_fallbacks].address = a;
  c->fallbacks[c->n_fallbacks++].failed = 1u << index;
}

/* ---- Workers the client cannot reach ------------------------------------ */

static ferry__unreach_t *unreach_find_locked(ferry_client_t *c,
                                             const char *address) {
  for (uint32_t i = 0; i < c->n_unreach; i++)
    if (strcmp(c->unreach[i].address, address) == 0)
      return &c->unreach[i];
  return NULL;
}

void ferry__client_unreach_failed_locked(ferry_client_t *c, uint64_t worker_id,
                                         const char *address,
                                         const char *reason) {
  ferry__unreach_t *u = unreach_find_locked(c, address);
  if (u == NULL) {
    if (c->n_unreach == FERRY__UNREACH_MAX ||
        strlen(address) >= sizeof(u->address))
      return; /* the first sixteen tell the story */
    u = &c->unreach[c->n_unreach++];
    memset(u, 0, sizeof(*u));
    snprintf(u->address, sizeof(u->address), "%s", address);
  }
  u->worker_id = worker_id;
  if (u->failures < UINT32_MAX)
    u->failures++;
  /* Printable ASCII only: it travels in a proto3 string and is shown. */
  size_t n = 0;
  for (const char *p = reason != NULL ? reason : "";
       *p != '\0' && n + 1 < sizeof(u->reason); p++) {
    unsigned char ch = (unsigned char)*p;
    u->reason[n++] = ch >= 0x20 && ch < 0x7f ? (char)ch : '?';
  }
  u->reason[n] = '\0';
}

void ferry__client_unreach_reached_locked(ferry_client_t *c,
                                          const char *address) {
  ferry__unreach_t *u = unreach_find_locked(c, address);
  if (u == NULL)
    return;
  FERRY_LOG(FERRY_LOG_INFO, "client: worker %s reachable again", address);
  *u = c->unreach[--c->n_unreach];
}

void ferry__client_why_locked(const ferry_client_t *c, char *out,
                              size_t cap) {
  const ferry__unreach_t *u = NULL;
  out[0] = '\0';
  for (uint32_t i = 0; i < c->n_unreach && u == NULL; i++)
    u = &c->unreach[i];
  if (c->hb_down_since > 0) {
    snprintf(out, cap, "no answer from the dispatcher %s for %.1f s: %s",
             c->dispatcher != NULL ? c->dispatcher : "",
             ferry__client_now() - c->hb_down_since, c->hb_error);
  } else if (c->d_has_counts && c->d_serving == 0) {
    if (c->d_draining + c->d_left + c->d_lost == 0)
      snprintf(out, cap, "no worker is serving this job: none has "
               "registered with the dispatcher");
    else
      snprintf(out, cap, "no worker is serving this job: %" PRIu32
               " draining, %" PRIu32 " stopped, %" PRIu32 " lost",
               c->d_draining, c->d_left, c->d_lost);
  } else if (u != NULL) {
    int n = snprintf(out, cap, "worker %s unreachable: %s", u->address,
                     u->reason);
    if (c->n_unreach > 1 && n > 0 && (size_t)n < cap)
      snprintf(out + n, cap - (size_t)n, " (and %" PRIu32 " more)",
               c->n_unreach - 1);
  }
}

static void *reader_main(void *arg) {
  ferry__worker_t *w = arg;
  ferry_client_t *c = w->client;
  ferry_error_t e;
  uint64_t chunks = 0;
  for (;;) {
    ferry_transport_msg_t msg;
    ferry_chunk_src_t src;
    ferry_chunk_t ch;
    int rc = ferry__transport_next(w->stream, &msg, -1, &e);
    if (rc != 0) {
      pthread_mutex_lock(&c->mu);
      bool asked_to_stop = w->stop || c->stopping;
      pthread_mutex_unlock(&c->mu);
      /* A lost worker is the dispatcher's business: it re-leases the
       * splits, and the next heartbeat reopens a stream if needed. */
      if (rc != FERRY_EOF && !asked_to_stop) {
        FERRY_LOG(FERRY_LOG_WARN, "client: worker %s: %s", w->address,
                  e.msg);
        /* The seam's fallback rule (transport.h, "Choosing"):
         * pick_transport avoids this transport for this worker. */
        if (ferry__transport_falls_back(c->transport, w->transport, chunks)) {
          pthread_mutex_lock(&c->mu);
          fallback_add_locked(c, w->address, w->transport);
          pthread_mutex_unlock(&c->mu);
        }
        /* If the worker is alive it goes on with later chunks on the
         * reopened stream: what was in flight is lost for good, so its
         * leases of our splits must start again from delivered. */
        pthread_mutex_lock(&c->mu);
        ferry__client_restart_worker_locked(
            c, __atomic_load_n(&w->worker_id, __ATOMIC_RELAXED));
        /* Nothing ever came: the client may not reach this worker at all
         * (a wrong --advertise, a certificate without its address); the
         * dispatcher hears of it (ClientHeartbeatRequest.unreachable). A
         * worker's refusal of a cancelled or replaced stream is no sign.
         * Every transport's stream counts: each opens through the
         * worker's gRPC address. Counting only some, a client on auto
         * whose first stream (a preferred transport) failed could see
         * one more failure before the dispatcher's backoff kept the
         * worker's leases away, and never report it. A worker that only
         * cannot reach us on the preferred transport is reached on the
         * next one (auto), whose first chunk clears it. */
        if (chunks == 0 &&
            (rc == FERRY_EGRPC_UNAVAILABLE ||
             rc == FERRY_EGRPC_UNAUTHENTICATED ||
             rc == FERRY_EGRPC_PERMISSION_DENIED))
          ferry__client_unreach_failed_locked(
              c, __atomic_load_n(&w->worker_id, __ATOMIC_RELAXED),
              w->address, e.msg);
        pthread_mutex_unlock(&c->mu);
      }
      break;
    }
    if (chunks++ == 0) {
      pthread_mutex_lock(&c->mu);
      ferry__client_unreach_reached_locked(c, w->address);
      pthread_mutex_unlock(&c->mu);
    }
    src.len = msg.len;
    src.copy = tmsg_copy;
    src.ctx = &msg;
    rc = ferry__chunk_parse(&w->parser, &src, &ch, &e);
    if (rc != 0) {
      pthread_mutex_lock(&c->mu);
      ferry__client_fail_locked(c, rc, "worker %s: %s", w->address, e.msg);
      pthread_mutex_unlock(&c->mu);
    } else if (ch.job_id != c->job_id) {
      FERRY_LOG(FERRY_LOG_WARN,
                "client: worker %s sent a chunk of job %llu, not %llu",
                w->address, (unsigned long long)ch.job_id,
                (unsigned long long)c->job_id);
    } else {
      /* The stream says whose copy of the split this is. */
      ch.worker_id = __atomic_load_n(&w->worker_id, __ATOMIC_RELAXED);
      rc = ferry__client_on_chunk(c, &ch, &src, &w->stop);
    }
    ferry__transport_msg_release(&msg);
    if (rc != 0)
      break;
    pthread_mutex_lock(&c->mu);
    bool stop = w->stop || c->stopping;
    pthread_mutex_unlock(&c->mu);
    if (stop)
      break;
  }
  pthread_mutex_lock(&c->mu);
  w->ended = true;
  pthread_mutex_unlock(&c->mu);
  return NULL;
}

/* Stops a reader (cancel, wake, join) and frees its stream. The entry
 * must already be out of c->workers. Heartbeat thread or free. */
void ferry__client_worker_free(ferry_client_t *c, ferry__worker_t *w) {
  if (w == NULL)
    return;
  pthread_mutex_lock(&c->mu);
  w->stop = true;
  pthread_cond_broadcast(&c->space_cv);
  pthread_mutex_unlock(&c->mu);
  if (w->stream != NULL)
    ferry__transport_cancel(w->stream);
  if (w->thread_started)
    pthread_join(w->thread, NULL);
  ferry__transport_cstream_free(w->stream);
  ferry__chunk_parser_close(&w->parser);
  ferry__free(w->address);
  ferry__free(w);
}

/* The transport for a stream to a worker that published `offered`
 * endpoints (ferry__transport_choose), and that transport's client
 * context. Logs the choice when it changes. Heartbeat thread. */
static int pick_transport(ferry_client_t *c, const char *address,
                          const ferry_transport_endpoint_t *offered,
                          size_t n_offered, ferry_transport_choice_t *choice,
                          ferry_transport_client_t **out, ferry_error_t *e) {
  pthread_mutex_lock(&c->mu);
  uint32_t failed = fallbacks_locked(c, address);
  pthread_mutex_unlock(&c->mu);
  int rc = ferry__transport_choose(c->transport, c->rpc_opts.tls != NULL,
                                   offered, n_offered, failed, choice, e);
  if (rc != 0)
    return ferry__prefixerr(e, "worker %s", address);
  if (strcmp(choice->why, c->transport_why) != 0) {
    FERRY_LOG(FERRY_LOG_INFO, "client: worker %s: transport %s", address,
              choice->why);
    snprintf(c->transport_why, sizeof(c->transport_why), "%s", choice->why);
  }
  const ferry_transport_ops_t *ops = ferry__transport_at((size_t)choice->index);
  ferry_transport_client_t **tc = &c->transports[choice->index];
  if (*tc == NULL) {
    ferry_transport_client_config_t cfg = {0};
    cfg.rpc_opts = &c->rpc_opts;
    cfg.peer_timeout_ms = (int)c->client_timeout_ms;
    if ((rc = ops->client_new(&cfg, tc, e)) != 0)
      return ferry__prefixerr(e, "transport %s", ops->name);
  }
  *out = *tc;
  return 0;
}

/* Opens the chunk stream to `address` and starts its reader. */
static int worker_start(ferry_client_t *c, uint64_t worker_id,
                        const char *address,
                        const ferry_transport_endpoint_t *offered,
                        size_t n_offered) {
  ferry_transport_open_t req = {0};
  ferry_transport_choice_t choice;
  ferry_transport_client_t *tc = NULL;
  ferry_error_t e;
  ferry__worker_t *w = ferry__calloc(1, sizeof(*w));
  if (w == NULL || (w->address = ferry__strdup(address)) == NULL) {
    ferry__free(w);
    return FERRY_ENOMEM;
  }
  w->client = c;
  w->worker_id = worker_id;
  ferry__chunk_parser_init(&w->parser);
  req.job_id = c->job_id;
  req.client_id = c->client_id;
  if (c->has_secret)
    req.secret = c->secret;
  int rc = pick_transport(c, address, offered, n_offered, &choice, &tc, &e);
  if (rc == 0) {
    ferry_transport_peer_t peer = {address, choice.address,
                                   choice.address_len};
    w->transport = choice.index;
    rc = tc->ops->open(tc, &peer, &req, &w->stream, &e);
  }
  if (rc == 0 && pthread_create(&w->thread, NULL, reader_main, w) != 0)
    rc = ferry__seterr(&e, FERRY_ENOMEM, "cannot start a reader thread");
  if (rc == 0)
    w->thread_started = true;
  pthread_mutex_lock(&c->mu);
  if (rc == 0 && !FERRY__GROW(c->workers, c->cap_workers, c->n_workers + 1, 8))
    rc = ferry__seterr(&e, FERRY_ENOMEM, "out of memory");
  if (rc == 0)
    c->workers[c->n_workers++] = w;
  pthread_mutex_unlock(&c->mu);
  if (rc != 0) {
    FERRY_LOG(FERRY_LOG_WARN, "client: worker %s: %s", address, e.msg);
    if (rc != FERRY_ENOMEM) {
      pthread_mutex_lock(&c->mu);
      ferry__client_unreach_failed_locked(c, worker_id, address, e.msg);
      pthread_mutex_unlock(&c->mu);
    }
    ferry__client_worker_free(c, w);
  }
  return rc;
}

/* A live worker's published endpoints, as the seam reads them (at most
 * FERRY_TRANSPORT_ENDPOINTS_MAX: the dispatcher checked them). */
static size_t endpoints_of(const Ferry__V1__WorkerInfo *wi,
                           ferry_transport_endpoint_t *out) {
  size_t n = 0;
  for (size_t i = 0;
       i < wi->n_endpoints && n < FERRY_TRANSPORT_ENDPOINTS_MAX; i++) {
    const Ferry__V1__TransportEndpoint *e = wi->endpoints[i];
    if (e->transport == NULL)
      continue;
    out[n].transport = e->transport;
    out[n].transport_len = strlen(e->transport);
    out[n].address = e->address.data;
    out[n].address_len = e->address.len;
    n++;
  }
  return n;
}

/* stopping is written under mu by the closing thread. */
static bool client_stopping(ferry_client_t *c) {
  pthread_mutex_lock(&c->mu);
  bool stopping = c->stopping;
  pthread_mutex_unlock(&c->mu);
  return stopping;
}

/* Brings the set of streams in line with a heartbeat answer: a stream per
 * worker address the client's splits are leased to (reopened if it
 * ended), none to workers gone from both the assignments and the live
 * workers list. */
void ferry__client_sync_workers(ferry_client_t *c,
                                const Ferry__V1__ClientHeartbeatResponse *r) {
  pthread_mutex_lock(&c->mu);
  /* A worker gone from the live list (lost, or registered again under a
   * new id) is no longer this client's to report. */
  for (uint32_t i = c->n_unreach; i-- > 0;) {
    bool live = false;
    for (size_t k = 0; k < r->n_workers && !live; k++)
      live = r->workers[k]->address != NULL &&
             r->workers[k]->worker_id == c->unreach[i].worker_id &&
             strcmp(r->workers[k]->address, c->unreach[i].address) == 0;
    if (!live)
      c->unreach[i] = c->unreach[--c->n_unreach];
  }
  for (size_t i = 0; i < c->n_workers; i++)
    c->workers[i]->seen = false;
  pthread_mutex_unlock(&c->mu);
  for (size_t i = 0; i < r->n_assignments && !client_stopping(c); i++) {
    const Ferry__V1__Assignment *a = r->assignments[i];
    if (a->worker_address == NULL || a->worker_address[0] == '\0')
      continue;
    ferry__worker_t *found = NULL, *dead = NULL;
    pthread_mutex_lock(&c->mu);
    for (size_t k = 0; k < c->n_workers; k++) {
      ferry__worker_t *w = c->workers[k];
      if (strcmp(w->address, a->worker_address) != 0)
        continue;
      if (w->ended) {
        dead = w;
        c->workers[k] = c->workers[--c->n_workers];
      } else {
        found = w;
        w->seen = true;
        /* A worker that registered again under a new id. */
        __atomic_store_n(&w->worker_id, a->worker_id, __ATOMIC_RELAXED);
      }
      break;
    }
    pthread_mutex_unlock(&c->mu);
    ferry__client_worker_free(c, dead);
    /* The worker's endpoints, from the live workers list. */
    ferry_transport_endpoint_t offered[FERRY_TRANSPORT_ENDPOINTS_MAX];
    size_t n_offered = 0;
    for (size_t k = 0; k < r->n_workers && found == NULL; k++)
      if (r->workers[k]->address != NULL &&
          strcmp(r->workers[k]->address, a->worker_address) == 0)
        n_offered = endpoints_of(r->workers[k], offered);
    if (found == NULL &&
        worker_start(c, a->worker_id, a->worker_address, offered,
                     n_offered) == 0) {
      pthread_mutex_lock(&c->mu);
      c->workers[c->n_workers - 1]->seen = true;
      pthread_mutex_unlock(&c->mu);
    }
  }
  for (size_t i = 0; i < r->n_workers; i++)
    for (size_t k = 0; k < c->n_workers; k++)
      if (r->workers[i]->address != NULL &&
          strcmp(c->workers[k]->address, r->workers[i]->address) == 0)
        c->workers[k]->seen = true;
  for (;;) {
    ferry__worker_t *gone = NULL;
    pthread_mutex_lock(&c->mu);
    for (size_t k = 0; k < c->n_workers; k++)
      if (!c->workers[k]->seen || c->workers[k]->ended) {
        gone = c->workers[k];
        c->workers[k] = c->workers[--c->n_workers];
        break;
      }
    pthread_mutex_unlock(&c->mu);
    if (gone == NULL)
      break;
    ferry__client_worker_free(c, gone);
  }
}
