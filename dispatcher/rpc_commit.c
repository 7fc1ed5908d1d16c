/* The dispatcher's group commit: answers held until the journal made
 * their changes durable, the batch on libuv's pool, compaction, and the
 * rebuild from disk after a failed batch (see rpc_commit.h). */
#include "rpc_commit.h"

#include <inttypes.h>
#include <string.h>

#include "alloc.h"
#include "ferry/log.h"
#include "snapshot.h"

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
  ferry__disp_rpc_flush(svc);
}

/* Packs the response into one buffer and answers the call now. */
void ferry__disp_rpc_reply_msg(ferry_rpc_call_t *call,
                               const ProtobufCMessage *msg, ferry_arena_t *a) {
  size_t n = protobuf_c_message_get_packed_size(msg);
  uint8_t *buf = ferry__arena_alloc(a, n ? n : 1);
  if (buf == NULL) {
    ferry__rpc_reply_error(call, FERRY_RPC_INTERNAL, "out of memory");
    return;
  }
  protobuf_c_message_pack(msg, buf);
  ferry__rpc_reply(call, buf, n);
}

/* Answers `call` with `msg` once what the state shows is durable. */
void ferry__disp_rpc_answer(ferry_disp_service_t *svc, ferry_rpc_call_t *call,
                   const ProtobufCMessage *msg, ferry_arena_t *a) {
  ferry_disp_held_t *h;
  size_t n;

  if (!must_hold(svc)) {
    ferry__disp_rpc_reply_msg(call, msg, a);
    return;
  }
  n = protobuf_c_message_get_packed_size(msg);
  if ((h = ferry__malloc(sizeof(*h) + 1 + n)) == NULL) {
    ferry__rpc_reply_error(call, FERRY_RPC_INTERNAL, "out of memory");
    return;
  }
  h->call = call;
  h->status = 0;
  h->msg[0] = '\0';
  h->buf = (uint8_t *)h->msg + 1;
  h->len = protobuf_c_message_pack(msg, h->buf);
  hold(svc, h);
}

void ferry__disp_rpc_answer_error(ferry_disp_service_t *svc,
                                  ferry_rpc_call_t *call, int status,
                                  const char *text) {
  ferry_disp_held_t *h;
  size_t n = strlen(text);

  if (!must_hold(svc) || (h = ferry__malloc(sizeof(*h) + n + 1)) == NULL) {
    ferry__rpc_reply_error(call, status, text);
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
      ferry__rpc_reply_error(h->call, FERRY_RPC_UNAVAILABLE, why);
    else if (h->status != 0)
      ferry__rpc_reply_error(h->call, h->status, h->msg);
    else
      ferry__rpc_reply(h->call, h->buf, h->len);
    ferry__free(h);
  }
  if (svc->held == NULL)
    svc->held_tail = &svc->held;
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
  ferry__metric_add(svc->metrics.write_failures, 1);
  release_held(svc, 0, msg);
  if (svc->on_failed != NULL)
    svc->on_failed(svc, msg);
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
  ferry__metric_observe(svc->metrics.fsync, ferry__journal_batch_ns(j));
  ferry__disp_snapshot_release(svc->state, svc->snap); /* before a rebuild */
  svc->snap = NULL;
  if (rc != 0) {
    rebuild(svc, err);
    return;
  }
  if (compacted) {
    ferry__metric_add(svc->metrics.snapshots, 1);
    ferry__disp_set_segment(svc->state, svc->compact_segment);
    FERRY_LOG(FERRY_LOG_INFO,
              "journal: snapshot of %" PRIu64 " bytes written (captured "
              "in %" PRId64 " ms on the loop), journal segment %" PRIu64
              " started",
              ferry__journal_snapshot_size(j), svc->compact_ms,
              svc->compact_segment);
  }
  release_held(svc, ferry__journal_durable(j), NULL);
  /* Long polls hear only of what is durable (or wait for it,
   * ferry__disp_rpc_answer()). */
  if (svc->on_durable != NULL)
    svc->on_durable(svc);
  ferry__disp_rpc_flush(svc);
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
void ferry__disp_rpc_flush(ferry_disp_service_t *svc) {
  ferry_journal_t *j = svc->journal;
  ferry_error_t err = {0};

  if (svc->failed)
    return;
  if (!must_hold(svc)) {
    /* Everything is durable: a change that journaled nothing (a
     * re-lease) may still be news to a waiting heartbeat. */
    if (svc->on_durable != NULL)
      svc->on_durable(svc);
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
