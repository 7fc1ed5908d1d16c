/* In process: the worker's Worker service on 127.0.0.1:0 with injected
 * tasks, read by the rpc client through StreamChunks. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>

#include "rpc.h"
#include "rpc_methods.h"
#include "wtest_util.h"

#define WAIT_MS 20000

typedef struct {
  uv_loop_t loop;
  ferry__worker_t w;
  pthread_t thread;
  ferry_rpc_channel_t *ch;
  /* open_calls(): asks the loop thread, which owns the queues. */
  uv_async_t probe;
  pthread_mutex_t probe_mu;
  pthread_cond_t probe_cv;
  int probe_answer; /* -1 while asked */
} srv_t;

static int64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void on_probe(uv_async_t *a) {
  srv_t *s = a->data;
  pthread_mutex_lock(&s->probe_mu);
  s->probe_answer = ferry__wstream_open_calls(&s->w);
  pthread_cond_broadcast(&s->probe_cv);
  pthread_mutex_unlock(&s->probe_mu);
}

/* The number of queues with a client's stream open, as the loop sees it
 * now (every event queued before the question was handled). */
static int open_calls(srv_t *s) {
  pthread_mutex_lock(&s->probe_mu);
  s->probe_answer = -1;
  uv_async_send(&s->probe);
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_sec += WAIT_MS / 1000;
  while (s->probe_answer < 0 &&
         pthread_cond_timedwait(&s->probe_cv, &s->probe_mu, &ts) == 0)
    ;
  int n = s->probe_answer;
  pthread_mutex_unlock(&s->probe_mu);
  cr_assert_geq(n, 0, "the loop did not answer in %d ms", WAIT_MS);
  return n;
}

static void *loop_main(void *arg) {
  srv_t *s = arg;
  uv_run(&s->loop, UV_RUN_DEFAULT);
  return NULL;
}

static void srv_start(srv_t *s, uint64_t buffer_bytes, uint64_t chunk_bytes) {
  ferry__wconfig_t cfg;
  ferry_error_t err;
  char target[64];
  memset(&cfg, 0, sizeof(cfg));
  cfg.host = "127.0.0.1";
  cfg.threads = 2;
  cfg.buffer_bytes = buffer_bytes;
  cfg.chunk_bytes = chunk_bytes;
  cfg.heartbeat_ms = 1000;
  ferry__rpc_init();
  cr_assert_eq(uv_loop_init(&s->loop), 0);
  cr_assert_eq(ferry__worker_start(&s->w, &cfg, &s->loop, false, &err), 0,
               "%s", err.msg);
  cr_assert_gt(s->w.port, 0);
  pthread_mutex_init(&s->probe_mu, NULL);
  pthread_cond_init(&s->probe_cv, NULL);
  cr_assert_eq(uv_async_init(&s->loop, &s->probe, on_probe), 0);
  s->probe.data = s;
  uv_unref((uv_handle_t *)&s->probe); /* the loop may run out around it */
  cr_assert_eq(pthread_create(&s->thread, NULL, loop_main, s), 0);
  snprintf(target, sizeof(target), "127.0.0.1:%d", s->w.port);
  cr_assert_eq(ferry__rpc_channel_new(target, NULL, &s->ch, &err), 0);
}

static void srv_stop(srv_t *s) {
  ferry__rpc_channel_free(s->ch);
  ferry__worker_request_stop(&s->w);
  pthread_join(s->thread, NULL);
  uv_close((uv_handle_t *)&s->probe, NULL);
  uv_run(&s->loop, UV_RUN_NOWAIT);
  pthread_mutex_destroy(&s->probe_mu);
  pthread_cond_destroy(&s->probe_cv);
  cr_assert(ferry__worker_close(&s->w, 1000));
  cr_assert_eq(uv_loop_close(&s->loop), 0);
  ferry__rpc_shutdown();
}

static ferry_rpc_stream_t *open_stream(srv_t *s, uint64_t job,
                                       uint64_t client) {
  Ferry__V1__StreamChunksRequest req = FERRY__V1__STREAM_CHUNKS_REQUEST__INIT;
  uint8_t buf[64];
  ferry_rpc_stream_t *st;
  ferry_error_t err;
  req.job_id = job;
  req.client_id = client;
  /* A stream carries a client secret; these tests' tasks carry
   * none, so any one is accepted (test_security checks the refusals). */
  static uint8_t secret[FERRY_CLIENT_SECRET_BYTES];
  req.client_secret.data = secret;
  req.client_secret.len = sizeof(secret);
  size_t len = ferry__v1__stream_chunks_request__pack(&req, buf);
  cr_assert_eq(ferry__rpc_stream_open(s->ch, FERRY_METHOD_STREAM_CHUNKS, buf,
                                      len, -1, FERRY_RPC_WAIT_FOR_READY, &st,
                                      &err),
               0, "%s", err.msg);
  return st;
}

static Ferry__V1__Chunk *next_chunk(ferry_rpc_stream_t *st) {
  ferry_rpc_msg_t msg;
  ferry_error_t err;
  int rc = ferry__rpc_stream_next(st, &msg, WAIT_MS, &err);
  cr_assert_eq(rc, 0, "stream_next: %s", ferry_strerror(rc));
  size_t len = msg.len;
  uint8_t *buf = malloc(len + 1);
  cr_assert_eq(ferry__rpc_msg_copy(&msg, 0, buf, len), len);
  ferry__rpc_msg_release(&msg);
  Ferry__V1__Chunk *m = ferry__v1__chunk__unpack(NULL, len, buf);
  cr_assert_not_null(m);
  free(buf);
  return m;
}

/* Receives the split's chunks until `last`; checks every record once in
 * order with the right pixels. Returns the chunk count. */
static size_t receive_split(ferry_rpc_stream_t *st, const wt_file_t *f,
                            uint32_t split, uint64_t n) {
  uint64_t pos = 0;
  size_t chunks = 0;
  uint8_t want[WT_BYTES];
  for (;;) {
    Ferry__V1__Chunk *m = next_chunk(st);
    chunks++;
    cr_assert_eq(m->error_code, 0, "%s", m->error);
    cr_assert_eq(m->split, split, "split %u job %llu count %u first %llu len %zu", m->split, (unsigned long long)m->job_id, m->count, (unsigned long long)m->first, m->payload.len);
    cr_assert_eq(m->first, pos);
    for (uint32_t j = 0; j < m->count; j++) {
      int64_t label;
      uint64_t rec = m->ids[j] & ((1ull << 40) - 1);
      cr_assert_eq(rec, pos + j, "record order");
      wt_expected(f, rec, want, &label);
      cr_assert_eq(m->labels[j], label);
      cr_assert_eq(memcmp(m->payload.data + (size_t)j * WT_BYTES, want,
                          WT_BYTES),
                   0);
    }
    pos += m->count;
    bool last = m->last;
    ferry__v1__chunk__free_unpacked(m, NULL);
    if (last)
      break;
  }
  cr_assert_eq(pos, n, "every record of the split");
  return chunks;
}

Test(stream, receives_every_chunk, .timeout = 120) {
  wt_file_t f;
  srv_t s;
  wt_file_make(&f, 300, FERRY_COMPRESSION_NONE, SIZE_MAX);
  srv_start(&s, 64 << 20, 16 * WT_BYTES);
  /* The task runs before the stream opens: its chunks wait queued. */
  wt_task_t t;
  wt_task(&t, &f, 0, 300, false);
  cr_assert_eq(ferry__wtasks_add(&s.w.tasks, &t.task), 1);
  ferry_rpc_stream_t *st = open_stream(&s, 11, 22);
  size_t chunks = receive_split(st, &f, 3, 300);
  cr_assert_eq(chunks, 19, "ceil(300 / 16)");
  ferry__wprogress_t p;
  cr_assert(ferry__wtasks_progress(&s.w.tasks, 11, 1, 3, 5, &p));
  cr_assert(p.finished);
  cr_assert_eq(p.produced, 300);
  ferry__rpc_stream_cancel(st);
  ferry__rpc_stream_free(st);
  srv_stop(&s);
  wt_file_free(&f);
}

/* A pool far smaller than the split: production follows consumption. */
Test(stream, backpressure_through_the_stream, .timeout = 120) {
  wt_file_t f;
  srv_t s;
  wt_file_make(&f, 500, FERRY_COMPRESSION_NONE, SIZE_MAX);
  size_t block = ferry__wchunk_block_size(4, WT_BYTES);
  srv_start(&s, 3 * block, 4 * WT_BYTES);
  ferry_rpc_stream_t *st = open_stream(&s, 11, 22);
  wt_task_t t;
  wt_task(&t, &f, 0, 500, false);
  cr_assert_eq(ferry__wtasks_add(&s.w.tasks, &t.task), 1);
  cr_assert_eq(receive_split(st, &f, 3, 500), 125);
  ferry__rpc_stream_cancel(st);
  ferry__rpc_stream_free(st);
  srv_stop(&s);
  wt_file_free(&f);
}

/* A client that goes away and comes back finds the queued chunks. */
Test(stream, reconnect_finds_queued_chunks, .timeout = 120) {
  wt_file_t f;
  srv_t s;
  wt_file_make(&f, 40, FERRY_COMPRESSION_NONE, SIZE_MAX);
  srv_start(&s, 64 << 20, 1 << 20);
  ferry_rpc_stream_t *st = open_stream(&s, 11, 22);
  ferry__rpc_stream_cancel(st);
  ferry__rpc_stream_free(st);
  /* The worker must have seen the stream end before the chunks come:
   * chunks sent into a stream that is being cancelled are lost with it
   * (the client asks for a restart), which is not what this tests. */
  int64_t until = mono_ms() + WAIT_MS;
  while (open_calls(&s) > 0 && mono_ms() < until)
    sched_yield();
  cr_assert_eq(open_calls(&s), 0, "the cancelled stream is still open");
  wt_task_t t;
  wt_task(&t, &f, 0, 40, false);
  cr_assert_eq(ferry__wtasks_add(&s.w.tasks, &t.task), 1);
  st = open_stream(&s, 11, 22);
  cr_assert_eq(receive_split(st, &f, 3, 40), 1);
  ferry__rpc_stream_cancel(st);
  ferry__rpc_stream_free(st);
  srv_stop(&s);
  wt_file_free(&f);
}

Test(stream, malformed_request_is_invalid_argument, .timeout = 60) {
  srv_t s;
  ferry_rpc_stream_t *st;
  ferry_error_t err;
  ferry_rpc_msg_t msg;
  srv_start(&s, 1 << 20, 1 << 20);
  uint8_t junk[] = {0xff, 0xff};
  cr_assert_eq(ferry__rpc_stream_open(s.ch, FERRY_METHOD_STREAM_CHUNKS, junk,
                                      sizeof(junk), -1,
                                      FERRY_RPC_WAIT_FOR_READY, &st, &err),
               0);
  cr_assert_eq(ferry__rpc_stream_next(st, &msg, WAIT_MS, &err),
               FERRY_EGRPC_INVALID_ARGUMENT);
  ferry__rpc_stream_free(st);
  srv_stop(&s);
}

/* ---- A fake dispatcher: registration, a task by heartbeat, draining ---- */

typedef struct {
  const Ferry__V1__Task *task;
  atomic_int beats;
  atomic_int registered; /* heartbeats that came with worker_id 42 */
  atomic_int draining;
  atomic_int finished;   /* heartbeats reporting the task finished */
} fake_t;

static void on_heartbeat(ferry_rpc_call_t *call, const uint8_t *req,
                         size_t len, void *user) {
  fake_t *f = user;
  Ferry__V1__WorkerHeartbeatRequest *m =
      ferry__v1__worker_heartbeat_request__unpack(NULL, len, req);
  cr_assert_not_null(m);
  atomic_fetch_add(&f->beats, 1);
  if (m->worker_id == 42)
    atomic_fetch_add(&f->registered, 1);
  if (m->draining)
    atomic_fetch_add(&f->draining, 1);
  bool listed = false;
  for (size_t i = 0; i < m->n_tasks; i++) {
    listed = true;
    if (m->tasks[i]->finished && m->tasks[i]->produced == 25)
      atomic_fetch_add(&f->finished, 1);
  }
  Ferry__V1__WorkerHeartbeatResponse r =
      FERRY__V1__WORKER_HEARTBEAT_RESPONSE__INIT;
  Ferry__V1__Task *tasks[1] = {(Ferry__V1__Task *)f->task};
  r.worker_id = 42;
  r.heartbeat_ms = 20;
  if (!listed && !m->draining) {
    r.n_new_tasks = 1;
    r.new_tasks = tasks;
  }
  uint8_t buf[4096];
  size_t n = ferry__v1__worker_heartbeat_response__pack(&r, buf);
  ferry__v1__worker_heartbeat_request__free_unpacked(m, NULL);
  ferry__rpc_reply(call, buf, n);
}

static void fake_done(void *arg) { (void)arg; }

/* The fake dispatcher shares the worker's loop, whose thread is not the
 * test's: its shutdown, like every ferry_rpc_server call, runs there. */
typedef struct {
  uv_async_t async;
  ferry_rpc_server_t *disp;
} disp_stop_t;

static void disp_stop_cb(uv_async_t *a) {
  disp_stop_t *d = a->data;
  ferry__rpc_server_shutdown(d->disp, fake_done, NULL);
  uv_close((uv_handle_t *)a, NULL);
}

/* Before the loop thread starts. */
static void disp_stop_init(disp_stop_t *d, uv_loop_t *loop,
                           ferry_rpc_server_t *disp) {
  d->disp = disp;
  d->async.data = d;
  cr_assert_eq(uv_async_init(loop, &d->async, disp_stop_cb), 0);
}

Test(stream, heartbeat_registers_and_takes_tasks, .timeout = 120) {
  wt_file_t f;
  wt_file_make(&f, 25, FERRY_COMPRESSION_NONE, SIZE_MAX);
  wt_task_t t;
  wt_task(&t, &f, 0, 25, false);
  fake_t fake = {.task = &t.task};

  /* The fake dispatcher lives on the worker's loop. */
  srv_t s;
  ferry_error_t err;
  ferry_rpc_server_t *disp;
  int dport;
  ferry__rpc_init();
  cr_assert_eq(uv_loop_init(&s.loop), 0);
  cr_assert_eq(ferry__rpc_server_new(&s.loop, NULL, &disp, &err), 0);
  cr_assert_eq(ferry__rpc_server_register(disp, FERRY_METHOD_WORKER_HEARTBEAT,
                                          FERRY_RPC_UNARY, on_heartbeat, &fake,
                                          &err),
               0);
  cr_assert_eq(ferry__rpc_server_start(disp, "127.0.0.1:0", &dport, &err), 0);
  char daddr[64], target[64];
  snprintf(daddr, sizeof(daddr), "127.0.0.1:%d", dport);

  ferry__wconfig_t cfg;
  memset(&cfg, 0, sizeof(cfg));
  cfg.dispatcher = daddr;
  cfg.host = "127.0.0.1";
  cfg.threads = 1;
  cfg.buffer_bytes = 16 << 20;
  cfg.chunk_bytes = 1 << 20;
  cfg.heartbeat_ms = 20;
  cr_assert_eq(ferry__worker_start(&s.w, &cfg, &s.loop, false, &err), 0);
  disp_stop_t stop_disp;
  disp_stop_init(&stop_disp, &s.loop, disp);
  cr_assert_eq(pthread_create(&s.thread, NULL, loop_main, &s), 0);
  snprintf(target, sizeof(target), "127.0.0.1:%d", s.w.port);
  cr_assert_eq(ferry__rpc_channel_new(target, NULL, &s.ch, &err), 0);

  ferry_rpc_stream_t *st = open_stream(&s, 11, 22);
  cr_assert_eq(receive_split(st, &f, 3, 25), 1);
  ferry__rpc_stream_cancel(st);
  ferry__rpc_stream_free(st);
  /* The heartbeats after registration carry the id and the result. */
  ferry__wprogress_t p;
  while (atomic_load(&fake.finished) == 0) {
    cr_assert(ferry__wtasks_progress(&s.w.tasks, 11, 1, 3, 5, &p));
    sched_yield();
  }
  cr_assert_gt(atomic_load(&fake.registered), 0);
  cr_assert_eq(atomic_load(&s.w.worker_id), 42);
  cr_assert_eq(atomic_load(&fake.draining), 0);

  ferry__rpc_channel_free(s.ch);
  ferry__worker_request_stop(&s.w);
  /* The worker's part of the loop ends; the fake keeps it running until
   * the final heartbeat arrived. */
  cr_assert(ferry__whb_join(&s.w, 5000), "the heartbeat thread exits");
  cr_assert_geq(atomic_load(&fake.draining), 1, "draining reported (%d)",
                atomic_load(&fake.draining));
  uv_async_send(&stop_disp.async);
  pthread_join(s.thread, NULL);
  cr_assert(ferry__worker_close(&s.w, 1000));
  cr_assert_eq(uv_loop_close(&s.loop), 0);
  ferry__rpc_shutdown();
  wt_file_free(&f);
}

/* ---- Long poll: a fake dispatcher that holds idle heartbeats back ------- */

#define LP_INTERVAL_MS 5000
#define LP_MAX_HELD 8

/* Milliseconds on the monotonic clock. */
static int64_t lp_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

typedef struct {
  const Ferry__V1__Task *task;
  /* When (lp_now) the first heartbeat of each kind arrived; 0: none. */
  atomic_llong t_registered, t_listed, t_finished, t_draining;
  atomic_int cut; /* held calls the worker cancelled */
  ferry_rpc_call_t *held[LP_MAX_HELD]; /* loop thread only */
  int nheld;
} lp_fake_t;

static void lp_reply(ferry_rpc_call_t *call) {
  Ferry__V1__WorkerHeartbeatResponse r =
      FERRY__V1__WORKER_HEARTBEAT_RESPONSE__INIT;
  uint8_t buf[64];
  r.worker_id = 42;
  r.heartbeat_ms = LP_INTERVAL_MS;
  ferry__rpc_reply(call, buf,
                   ferry__v1__worker_heartbeat_response__pack(&r, buf));
}

/* The worker cancelled a held call (or the server stops): answer it. */
static void lp_on_cancel(ferry_rpc_call_t *call, void *arg) {
  lp_fake_t *f = arg;
  for (int i = 0; i < f->nheld; i++)
    if (f->held[i] == call) {
      f->held[i] = f->held[--f->nheld];
      atomic_fetch_add(&f->cut, 1);
      lp_reply(call);
      return;
    }
}

static void lp_first(atomic_llong *t, int64_t now) {
  long long zero = 0;
  atomic_compare_exchange_strong(t, &zero, now);
}

/* Registration gets the task; every other heartbeat but the final one is
 * held back for good (never answered unless the worker cancels it). */
static void lp_on_heartbeat(ferry_rpc_call_t *call, const uint8_t *req,
                            size_t len, void *user) {
  lp_fake_t *f = user;
  int64_t now = lp_now();
  Ferry__V1__WorkerHeartbeatRequest *m =
      ferry__v1__worker_heartbeat_request__unpack(NULL, len, req);
  cr_assert_not_null(m);
  bool finished = false;
  for (size_t i = 0; i < m->n_tasks; i++)
    finished |= m->tasks[i]->finished;
  uint64_t id = m->worker_id;
  bool draining = m->draining, listed = m->n_tasks > 0;
  ferry__v1__worker_heartbeat_request__free_unpacked(m, NULL);
  if (id == 0) {
    Ferry__V1__WorkerHeartbeatResponse r =
        FERRY__V1__WORKER_HEARTBEAT_RESPONSE__INIT;
    Ferry__V1__Task *tasks[1] = {(Ferry__V1__Task *)f->task};
    uint8_t buf[4096];
    r.worker_id = 42;
    r.heartbeat_ms = LP_INTERVAL_MS;
    r.n_new_tasks = 1;
    r.new_tasks = tasks;
    lp_first(&f->t_registered, now);
    ferry__rpc_reply(call, buf,
                     ferry__v1__worker_heartbeat_response__pack(&r, buf));
    return;
  }
  if (draining) {
    lp_first(&f->t_draining, now);
    lp_reply(call);
    return;
  }
  if (finished)
    lp_first(&f->t_finished, now);
  else if (listed)
    lp_first(&f->t_listed, now);
  cr_assert_lt(f->nheld, LP_MAX_HELD);
  f->held[f->nheld++] = call;
  ferry__rpc_call_on_cancel(call, lp_on_cancel, f);
}

/* Waits (bounded) until *t is set; returns it. */
static int64_t lp_wait(atomic_llong *t, int ms, const char *what) {
  int64_t t0 = lp_now();
  while (atomic_load(t) == 0) {
    cr_assert_lt(lp_now() - t0, ms, "%s within %d ms", what, ms);
    sched_yield();
  }
  return atomic_load(t);
}

Test(stream, heartbeats_leave_on_news_not_on_the_interval, .timeout = 120) {
  /* An unknown count (byte range only): its end is news for the
   * dispatcher. */
  wt_file_t f;
  wt_file_make(&f, 25, FERRY_COMPRESSION_NONE, SIZE_MAX);
  wt_task_t t;
  wt_task(&t, &f, 0, 25, true);
  lp_fake_t fake;
  memset(&fake, 0, sizeof(fake));
  fake.task = &t.task;

  srv_t s;
  ferry_error_t err;
  ferry_rpc_server_t *disp;
  int dport;
  ferry__rpc_init();
  cr_assert_eq(uv_loop_init(&s.loop), 0);
  cr_assert_eq(ferry__rpc_server_new(&s.loop, NULL, &disp, &err), 0);
  cr_assert_eq(ferry__rpc_server_register(disp, FERRY_METHOD_WORKER_HEARTBEAT,
                                          FERRY_RPC_UNARY, lp_on_heartbeat,
                                          &fake, &err),
               0);
  cr_assert_eq(ferry__rpc_server_start(disp, "127.0.0.1:0", &dport, &err), 0);
  char daddr[64], target[64];
  snprintf(daddr, sizeof(daddr), "127.0.0.1:%d", dport);

  ferry__wconfig_t cfg;
  memset(&cfg, 0, sizeof(cfg));
  cfg.dispatcher = daddr;
  cfg.host = "127.0.0.1";
  cfg.threads = 1;
  /* Room for about one chunk of two records: the task waits for the
   * stream, so it ends only after its listing was held back. */
  cfg.buffer_bytes = 4096;
  cfg.chunk_bytes = 2 * WT_BYTES;
  cfg.heartbeat_ms = LP_INTERVAL_MS;
  cr_assert_eq(ferry__worker_start(&s.w, &cfg, &s.loop, false, &err), 0);
  disp_stop_t stop_disp;
  disp_stop_init(&stop_disp, &s.loop, disp);
  cr_assert_eq(pthread_create(&s.thread, NULL, loop_main, &s), 0);
  snprintf(target, sizeof(target), "127.0.0.1:%d", s.w.port);
  cr_assert_eq(ferry__rpc_channel_new(target, NULL, &s.ch, &err), 0);

  /* An answer with a new task: the next heartbeat leaves at once (it
   * lists the task), not an interval later. */
  int64_t t_reg = lp_wait(&fake.t_registered, 5000, "registration");
  int64_t t_listed = lp_wait(&fake.t_listed, 2000, "the task listed");
  cr_assert_lt(t_listed - t_reg, 1000, "listed %lld ms after registration",
               (long long)(t_listed - t_reg));

  /* The task ends while that heartbeat is held back: the worker cuts it
   * short and reports at once. */
  ferry_rpc_stream_t *st = open_stream(&s, 11, 22);
  cr_assert_eq(receive_split(st, &f, 3, 25), 13);
  int64_t t_done = lp_now();
  int64_t t_fin = lp_wait(&fake.t_finished, 2000, "the finished report");
  cr_assert_lt(t_fin - t_done, 1000);
  cr_assert_geq(atomic_load(&fake.cut), 1, "the held call was cancelled");
  ferry__rpc_stream_cancel(st);
  ferry__rpc_stream_free(st);

  /* Quit cuts the held heartbeat short too: the final one leaves at
   * once. */
  ferry__rpc_channel_free(s.ch);
  int64_t t_stop = lp_now();
  ferry__worker_request_stop(&s.w);
  cr_assert(ferry__whb_join(&s.w, 3000), "the heartbeat thread exits");
  int64_t t_drain = lp_wait(&fake.t_draining, 1, "draining reported");
  cr_assert_lt(t_drain - t_stop, 1000, "the final heartbeat took %lld ms",
               (long long)(t_drain - t_stop));
  uv_async_send(&stop_disp.async);
  pthread_join(s.thread, NULL);
  cr_assert(ferry__worker_close(&s.w, 1000));
  cr_assert_eq(uv_loop_close(&s.loop), 0);
  ferry__rpc_shutdown();
  wt_file_free(&f);
}
