/* Workers that clients cannot reach (ClientHeartbeatRequest.unreachable):
 * a worker whose advertised address is wrong, or whose TLS certificate
 * does not name it, heartbeats to the dispatcher and looks alive, yet
 * every stream a trainer opens to it fails. The clients say so; the
 * dispatcher counts them per worker for GetStatus and the metrics, warns
 * once per worker, and keeps each such client's splits off the worker for
 * a backoff that doubles with each further failure. All of it is
 * volatile: clients list the workers again in every heartbeat. Here: the
 * reports; the lists and what reads them (leasing, GetStatus, the tick)
 * are state.c's, below the leases this moves. */
#include "state_unreach.h"
#include "state_leases.h"

int ferry__disp_check_unreachable(const Ferry__V1__ClientHeartbeatRequest *req,
                                  ferry_error_t *err) {
  int rc;
  if (req->n_unreachable > FERRY_DISP_MAX_UNREACHABLE)
    return ferry__seterr(err, FERRY_EINVAL,
                         "client heartbeat: over %d unreachable workers",
                         FERRY_DISP_MAX_UNREACHABLE);
  for (size_t i = 0; i < req->n_unreachable; i++) {
    const Ferry__V1__UnreachableWorker *u = req->unreachable[i];
    if ((rc = ferry__disp_check_str(u->address, FERRY_DISP_MAX_ADDRESS_LEN,
                                    false, "an unreachable worker's address",
                                    err)) != 0 ||
        (rc = ferry__disp_check_str(u->reason, FERRY_DISP_MAX_REASON_LEN,
                                    false, "an unreachable worker's reason",
                                    err)) != 0)
      return rc;
  }
  return 0;
}

static unreach_t *add_entry(worker_t *w, uint64_t job, uint64_t client) {
  if (!FERRY__GROW(w->unreach, w->unreach_cap, (size_t)w->nunreach + 1, 4))
    return NULL;
  unreach_t *u = &w->unreach[w->nunreach++];
  memset(u, 0, sizeof(*u));
  u->job = job;
  u->client = client;
  return u;
}

/* Keeps the reason as printable ASCII of at most FERRY_DISP_REASON_KEPT
 * bytes: it is shown and logged as is, and a client may send anything. */
static void set_reason(worker_t *w, const char *reason) {
  char clean[FERRY_DISP_REASON_KEPT + 1];
  size_t n = 0;
  for (const char *p = reason != NULL ? reason : ""; *p != '\0' &&
                                                     n < FERRY_DISP_REASON_KEPT;
       p++) {
    unsigned char ch = (unsigned char)*p;
    clean[n++] = ch >= 0x20 && ch < 0x7f ? (char)ch : '?';
  }
  clean[n] = '\0';
  if (n == 0)
    snprintf(clean, sizeof(clean), "no reason given");
  if (w->unreach_reason != NULL && strcmp(w->unreach_reason, clean) == 0)
    return;
  char *copy = ferry__strdup(clean);
  if (copy == NULL)
    return; /* the previous reason stays */
  ferry__free(w->unreach_reason);
  w->unreach_reason = copy;
}

static int64_t backoff_ms(uint32_t strikes) {
  int64_t b = FERRY_DISP_UNREACH_BACKOFF_MS;
  for (uint32_t k = 1; k < strikes && b < FERRY_DISP_UNREACH_BACKOFF_MAX_MS;
       k++)
    b *= 2;
  return b < FERRY_DISP_UNREACH_BACKOFF_MAX_MS
             ? b
             : FERRY_DISP_UNREACH_BACKOFF_MAX_MS;
}

/* Drops every entry of (job, client) not stamped `gen` (all with 0). */
static void drop_unlisted(ferry_disp_t *d, job_t *j, client_t *c,
                          uint64_t gen) {
  for (size_t i = 0; i < d->nworkers && c->nunreach > 0; i++) {
    worker_t *w = d->workers[i];
    for (uint32_t k = w->nunreach; k-- > 0;) {
      const unreach_t *u = &w->unreach[k];
      if (u->job != j->id || u->client != c->id || (gen != 0 && u->gen == gen))
        continue;
      FERRY_LOG(FERRY_LOG_INFO,
                "worker %" PRIu64 " (%s): job %" PRIu64 " client %" PRIu64
                " reaches it again",
                w->id, w->address, j->id, c->id);
      ferry__disp_unreach_drop(d, w, k);
    }
  }
}

void ferry__disp_record_unreachable(
    ferry_disp_t *d, job_t *j, client_t *c,
    const Ferry__V1__ClientHeartbeatRequest *req) {
  uint64_t gen = ++d->unreach_gen;
  if (req->leaving || !c->active) {
    drop_unlisted(d, j, c, 0);
    return;
  }
  for (size_t i = 0; i < req->n_unreachable; i++) {
    const Ferry__V1__UnreachableWorker *r = req->unreachable[i];
    worker_t *w = ferry__disp_live_worker(d, r->worker_id);
    /* An entry for another address is about a worker that registered
     * again since (a new process): it says nothing about this one. */
    if (w == NULL || r->address == NULL || strcmp(r->address, w->address) != 0)
      continue;
    unreach_t *u = ferry__disp_unreach_find(w, j->id, c->id);
    uint32_t failures = r->failures > 0 ? r->failures : 1;
    bool fresh = u == NULL || failures > u->failures;
    if (u == NULL) {
      if ((u = add_entry(w, j->id, c->id)) == NULL)
        continue; /* out of memory: the next heartbeat tries again */
      c->nunreach++;
    }
    u->gen = gen;
    w->unreach_at = d->now;
    set_reason(w, r->reason);
    if (!fresh)
      continue;
    u->failures = failures;
    u->strikes++;
    u->avoid_until = d->now + backoff_ms(u->strikes);
    if (!w->unreach_warned) {
      w->unreach_warned = true;
      FERRY_LOG(FERRY_LOG_WARN,
                "worker %" PRIu64 " advertises %s, which job %" PRIu64
                " client %" PRIu64 " cannot reach: %s (check its --advertise "
                "and TLS certificate); that client's splits go to other "
                "workers",
                w->id, w->address, j->id, c->id,
                w->unreach_reason != NULL ? w->unreach_reason : "");
    }
    uint32_t moved = PAR(j) ? 0 : ferry__disp_move_client_rows(d, j, c->id, w);
    FERRY_LOG(FERRY_LOG_INFO,
              "worker %" PRIu64 " (%s) unreachable by job %" PRIu64
              " client %" PRIu64 " (%u failures): %u splits moved, avoided "
              "for %" PRId64 " ms",
              w->id, w->address, j->id, c->id, failures, moved,
              u->avoid_until - d->now);
  }
  if (c->nunreach > 0)
    drop_unlisted(d, j, c, gen);
}
