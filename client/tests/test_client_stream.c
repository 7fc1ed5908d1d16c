/* The networked client end to end against a fake cluster in the test
 * process: one gRPC server on a libuv loop plays the dispatcher (two
 * splits of one epoch, FINISHED once the client reports both delivered)
 * and a worker (StreamChunks sends every chunk, with an overlapping
 * duplicate, then ends the stream, so the client reopens it and gets
 * everything again). The trainer must see each record exactly once, a
 * flushed partial batch, one end of epoch and the end of the job.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <uv.h>

#include "client_test_util.h"
#include "rpc.h"
#include "rpc_methods.h"
#include "spec.h"
#include "tsan.h"

#define SPEC "tfrecord(\"/fake/train-*.tfrecord\") | decode(raw, 2, 3, 1) | " \
             "batch(4)"
static const uint64_t totals[2] = {10, 7};

typedef struct fake_s {
  uv_loop_t loop;
  uv_async_t stop;
  ferry_rpc_server_t *server;
  int port;
  char addr[64];
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool ready;
  /* Loop thread only. */
  uint64_t delivered[2];
  bool assigned;
  bool left;
  int streams;
} fake_t;

static fake_t fake;

typedef struct stream_s {
  ferry_rpc_call_t *call;
  int next;
  bool sending, cancelled, finished;
} stream_t;

/* The chunks a stream sends: split 0 in one chunk, split 1 in three with
 * positions 2..4 twice. */
static const struct {
  uint32_t split;
  uint64_t first;
  uint32_t count;
  bool last;
} chunks[] = {{1, 0, 5, false}, {0, 0, 10, true}, {1, 2, 3, false},
              {1, 5, 2, true}};
#define N_CHUNKS (sizeof(chunks) / sizeof(chunks[0]))

static void finish(stream_t *s, int status) {
  if (s->finished)
    return;
  s->finished = true;
  ferry__rpc_stream_finish(s->call, status, NULL);
  free(s);
}

/* A sent chunk's free_fn (ferry_rpc_piece_t). */
static void free_sent(void *buf) {
  FERRY_TSAN_ACQUIRE(buf);
  ferry__free(buf);
}

static void send_next(stream_t *s);

static void on_sent(ferry_rpc_call_t *call, int ok, void *arg) {
  stream_t *s = arg;
  s->sending = false;
  if (!ok || s->cancelled) {
    finish(s, FERRY_RPC_CANCELLED);
    return;
  }
  send_next(s);
}

static void send_next(stream_t *s) {
  if (s->next == (int)N_CHUNKS) {
    finish(s, FERRY_RPC_OK);
    return;
  }
  tu_chunk_opts_t o = {.epoch = 0, .split = chunks[s->next].split,
                       .first = chunks[s->next].first,
                       .count = chunks[s->next].count, .h = 2, .w = 3,
                       .c = 1, .last = chunks[s->next].last};
  size_t len;
  uint8_t *buf = tu_chunk(&o, &len);
  ferry_rpc_piece_t piece = {buf, len, free_sent, buf};
  s->next++;
  s->sending = true;
  if (ferry__rpc_stream_send(s->call, &piece, 1, on_sent, s) != 0) {
    s->sending = false;
    finish(s, FERRY_RPC_CANCELLED);
  }
}

static void on_cancel(ferry_rpc_call_t *call, void *arg) {
  stream_t *s = arg;
  s->cancelled = true;
  if (!s->sending)
    finish(s, FERRY_RPC_CANCELLED);
}

static void on_stream(ferry_rpc_call_t *call, const uint8_t *req, size_t len,
                      void *user) {
  Ferry__V1__StreamChunksRequest *r =
      ferry__v1__stream_chunks_request__unpack(NULL, len, req);
  cr_assert_not_null(r);
  cr_assert_eq(r->job_id, 7);
  cr_assert_eq(r->client_id, 1);
  ferry__v1__stream_chunks_request__free_unpacked(r, NULL);
  stream_t *s = calloc(1, sizeof(*s));
  s->call = call;
  fake.streams++;
  ferry__rpc_call_on_cancel(call, on_cancel, s);
  if (!s->finished)
    send_next(s);
}

static void reply_msg(ferry_rpc_call_t *call, const ProtobufCMessage *m) {
  size_t n = protobuf_c_message_get_packed_size(m);
  uint8_t *buf = malloc(n + 1);
  protobuf_c_message_pack(m, buf);
  ferry__rpc_reply(call, buf, n);
  free(buf);
}

static void on_register(ferry_rpc_call_t *call, const uint8_t *req,
                        size_t len, void *user) {
  Ferry__V1__RegisterDatasetRequest *r =
      ferry__v1__register_dataset_request__unpack(NULL, len, req);
  cr_assert_not_null(r);
  cr_assert_not_null(r->spec);
  cr_assert_eq(r->spec->batch_size, 4);
  ferry__v1__register_dataset_request__free_unpacked(r, NULL);
  Ferry__V1__RegisterDatasetResponse resp =
      FERRY__V1__REGISTER_DATASET_RESPONSE__INIT;
  resp.dataset_id = (char *)"00000000000000ab";
  resp.num_splits = 2;
  reply_msg(call, &resp.base);
}

static void on_job(ferry_rpc_call_t *call, const uint8_t *req, size_t len,
                   void *user) {
  Ferry__V1__GetOrCreateJobRequest *r =
      ferry__v1__get_or_create_job_request__unpack(NULL, len, req);
  cr_assert_not_null(r);
  cr_assert_str_eq(r->dataset_id, "00000000000000ab");
  cr_assert_str_eq(r->options->job_name, "fake-job");
  cr_assert_eq(r->options->num_epochs, 1);
  ferry__v1__get_or_create_job_request__free_unpacked(r, NULL);
  Ferry__V1__GetOrCreateJobResponse resp =
      FERRY__V1__GET_OR_CREATE_JOB_RESPONSE__INIT;
  resp.job_id = 7;
  resp.client_id = 1;
  resp.num_epochs = 1;
  resp.records_per_epoch = totals[0] + totals[1];
  resp.created = 1;
  reply_msg(call, &resp.base);
}

static void on_heartbeat(ferry_rpc_call_t *call, const uint8_t *req,
                         size_t len, void *user) {
  Ferry__V1__ClientHeartbeatRequest *r =
      ferry__v1__client_heartbeat_request__unpack(NULL, len, req);
  cr_assert_not_null(r);
  cr_assert_eq(r->job_id, 7);
  for (size_t i = 0; i < r->n_progress; i++) {
    cr_assert_lt(r->progress[i]->split, 2);
    cr_assert_leq(r->progress[i]->delivered,
                  totals[r->progress[i]->split]);
    fake.delivered[r->progress[i]->split] = r->progress[i]->delivered;
  }
  if (r->want_splits >= 2)
    fake.assigned = true;
  if (r->leaving)
    fake.left = true;
  ferry__v1__client_heartbeat_request__free_unpacked(r, NULL);

  bool done = fake.delivered[0] == totals[0] &&
              fake.delivered[1] == totals[1];
  Ferry__V1__ClientHeartbeatResponse resp =
      FERRY__V1__CLIENT_HEARTBEAT_RESPONSE__INIT;
  Ferry__V1__Assignment a[2], *pa[2];
  Ferry__V1__WorkerInfo wi = FERRY__V1__WORKER_INFO__INIT, *pw = &wi;
  wi.worker_id = 1;
  wi.address = fake.addr;
  resp.state = done ? FERRY__V1__JOB_STATE__JOB_STATE_FINISHED
                    : FERRY__V1__JOB_STATE__JOB_STATE_RUNNING;
  resp.epoch = done ? 1 : 0;
  resp.epoch_exhausted = fake.assigned;
  resp.epochs_done = done ? 1 : 0;
  resp.n_workers = 1;
  resp.workers = &pw;
  if (fake.assigned && !done) {
    for (int i = 0; i < 2; i++) {
      ferry__v1__assignment__init(&a[i]);
      a[i].epoch = 0;
      a[i].split = (uint32_t)i;
      a[i].num_records = totals[i];
      a[i].worker_id = 1;
      a[i].worker_address = fake.addr;
      a[i].lease = 1;
      pa[i] = &a[i];
    }
    resp.n_assignments = 2;
    resp.assignments = pa;
  }
  reply_msg(call, &resp.base);
}

static void server_done(void *arg) {
  uv_close((uv_handle_t *)&fake.stop, NULL);
}

static void on_stop(uv_async_t *h) {
  ferry__rpc_server_shutdown(fake.server, server_done, NULL);
}

static void *fake_main(void *arg) {
  ferry_error_t err = {0};
  uv_loop_init(&fake.loop);
  uv_async_init(&fake.loop, &fake.stop, on_stop);
  cr_assert_eq(ferry__rpc_server_new(&fake.loop, NULL, &fake.server, &err), 0);
  ferry__rpc_server_register(fake.server, FERRY_METHOD_REGISTER_DATASET,
                             FERRY_RPC_UNARY, on_register, NULL, &err);
  ferry__rpc_server_register(fake.server, FERRY_METHOD_GET_OR_CREATE_JOB,
                             FERRY_RPC_UNARY, on_job, NULL, &err);
  ferry__rpc_server_register(fake.server, FERRY_METHOD_CLIENT_HEARTBEAT,
                             FERRY_RPC_UNARY, on_heartbeat, NULL, &err);
  ferry__rpc_server_register(fake.server, FERRY_METHOD_STREAM_CHUNKS,
                             FERRY_RPC_SERVER_STREAM, on_stream, NULL, &err);
  cr_assert_eq(
      ferry__rpc_server_start(fake.server, "127.0.0.1:0", &fake.port, &err), 0,
      "%s", err.msg);
  snprintf(fake.addr, sizeof(fake.addr), "127.0.0.1:%d", fake.port);
  pthread_mutex_lock(&fake.mu);
  fake.ready = true;
  pthread_cond_signal(&fake.cv);
  pthread_mutex_unlock(&fake.mu);
  uv_run(&fake.loop, UV_RUN_DEFAULT);
  uv_loop_close(&fake.loop);
  return NULL;
}

Test(client_stream, exactly_once_through_a_fake_cluster, .timeout = 60) {
  ferry_alloc_stats_t a0, a1;
  ferry__alloc_stats(&a0);
  pthread_mutex_init(&fake.mu, NULL);
  pthread_cond_init(&fake.cv, NULL);
  ferry__rpc_init();
  pthread_create(&fake.thread, NULL, fake_main, NULL);
  pthread_mutex_lock(&fake.mu);
  while (!fake.ready)
    pthread_cond_wait(&fake.cv, &fake.mu);
  pthread_mutex_unlock(&fake.mu);

  ferry_client_options_t o;
  ferry_client_t *c;
  ferry_error_t err = {0};
  ferry_client_options_init(&o);
  o.dispatcher = fake.addr;
  o.spec = SPEC;
  o.job_name = "fake-job";
  o.num_epochs = 1;
  o.heartbeat_ms = 20;
  cr_assert_eq(ferry_client_new(&o, &c, &err), 0, "%s", err.msg);
  cr_assert_eq(ferry_client_job_id(c), 7);
  cr_assert_eq(ferry_client_id(c), 1);

  uint8_t seen[2][10] = {{0}};
  int sizes[8], nb = 0, epoch_ends = 0, rc;
  uint64_t records = 0;
  for (;;) {
    const ferry_batch_t *b;
    rc = ferry_next(c, &b, 20000, &err);
    if (rc == FERRY_EPOCH_END) {
      epoch_ends++;
      cr_assert_eq(records, totals[0] + totals[1]);
      continue;
    }
    if (rc != 0)
      break;
    cr_assert_lt(nb, 8);
    sizes[nb++] = (int)b->size;
    for (uint32_t r = 0; r < b->size; r++) {
      uint32_t split = (uint32_t)(b->ids[r] >> 40);
      uint64_t pos = b->ids[r] & 0xffffffffffull;
      cr_assert_lt(split, 2);
      cr_assert_lt(pos, totals[split]);
      cr_assert_eq(seen[split][pos], 0);
      seen[split][pos] = 1;
      cr_assert_eq(b->labels[r], tu_label(split, pos));
      for (size_t i = 0; i < 6; i++)
        cr_assert_eq(b->images[r * 6 + i], tu_pixel(0, split, pos, i));
    }
    records += b->size;
    ferry_batch_release(c, b);
  }
  cr_assert_eq(rc, FERRY_END, "%d %s", rc, err.msg);
  cr_assert_eq(epoch_ends, 1);
  cr_assert_eq(records, 17);
  cr_assert_eq(nb, 5);
  cr_assert_eq(sizes[4], 1); /* the flushed remainder */
  ferry_client_stats_t st;
  ferry_client_stats(c, &st);
  cr_assert_eq(st.batches, 5);
  cr_assert_eq(st.records, 17);
  cr_assert_gt(st.total_seconds, 0);
  cr_assert_leq(st.stall_fraction, 1.0);
  ferry_client_free(c);

  uv_async_send(&fake.stop);
  pthread_join(fake.thread, NULL);
  ferry__rpc_shutdown();
  cr_assert(fake.left, "no leaving heartbeat");
  cr_assert_geq(fake.streams, 1);
  ferry__alloc_stats(&a1);
  cr_assert_eq(a0.blocks, a1.blocks);
  cr_assert_eq(a0.bytes, a1.bytes);
}
