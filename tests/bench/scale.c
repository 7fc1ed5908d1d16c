/* bench_scale: the dispatcher's control plane at scale.
 *
 * A real ferry-dispatcher (a subprocess, on a journal in a directory on
 * disk: --dir, default a fresh one under /tmp) driven by simulated workers
 * and clients: threads of this process that speak the real protocol
 * (WorkerHeartbeat, GetOrCreateJob, ClientHeartbeat through common/rpc)
 * without running pipelines or opening data streams.
 *
 * - The dataset: one TFRecord file of --splits records of one byte each,
 *   registered with records_per_split 1, so it has --splits splits (the
 *   dispatcher's split is a record range of one file; one file keeps the
 *   dataset a few MB and its scan one sequential read).
 * - --workers simulated workers, one thread each, heartbeat like
 *   ferry-worker (worker/heartbeat.c): every task they know is listed,
 *   reported finished at once with the split's record count, and dropped
 *   when the dispatcher cancels it; the next beat leaves at once after an
 *   answer that changed the task table, else one interval after the
 *   previous one left (the dispatcher holds idle beats back for that long).
 * - --probes more workers that say they are draining: the dispatcher never
 *   holds their beats back nor leases to them, so the round trip of their
 *   beats (one every 100 ms each) is the heartbeat latency as the 1,000
 *   workers load the dispatcher.
 * - --clients simulated clients of one named distributed_epoch job over
 *   the dataset (infinite epochs), one thread each, beating back to back:
 *   each beat reports every split of the previous answer as delivered and
 *   asks for --want more. A grant is an assignment to a worker that the
 *   client sees for the first time in an answer; the dispatcher answers
 *   after the journal write of what the call changed, so every grant
 *   counted is durable.
 *
 * Reported: grants/s, client beat round trips, heartbeat latency (probe
 * round trips; and for the loaded workers the round trip of answers with
 * news and the lateness of idle answers past their interval), the
 * dispatcher's CPU seconds (utime + stime, /proc/PID/stat) and peak RSS
 * (VmHWM), its RSS after the start, the registration and the job's first
 * epoch (rows), bytes per split from those deltas, the journal's size,
 * and the restart time on that journal: the dispatcher is killed (-9) and
 * started again on it, timed from the spawn to the first answered
 * GetStatus. Then sanity: no RPC failed, the job is running, and the
 * records the dispatcher counts as delivered equal the grants the clients
 * counted (one record per split, each delivered once), else exit 1.
 *
 * Usage: bench_scale [--quick] [--workers N] [--clients N] [--splits N]
 *                    [--seconds S] [--want N] [--probes N]
 *                    [--heartbeat-ms MS] [--dir DIR] [--keep]
 *                    [--connections N]
 * Defaults: the full run (1000 workers, 100 clients, 1,000,000 splits,
 * 20 s, want 16, 4 probes, heartbeat 1000 ms). --quick: 50 workers, 5
 * clients, 10,000 splits, 3 s (the ctest smoke run). --dir DIR: the
 * dataset and the dispatcher's work dir go there and stay (e.g. a tmpfs,
 * to see the dispatcher without the disk's fdatasync); without it they go
 * in the harness's temporary directory, removed at the end unless
 * --keep. The dispatcher's logs are always in that temporary directory.
 */
#include <errno.h>
#include <stddef.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "alloc.h"
#include "error_internal.h"
#include "ferry/v1/dispatcher.pb-c.h"
#include "harness.h"
#include "pb_alloc.h"
#include "rpc.h"
#include "rpc_methods.h"
#include "spec.h"
#include "tfrecord.h"
#include "varint.h"

#define JOB_NAME "scale"
#define PROBE_EVERY_MS 100
#define CALL_DEADLINE_MS 30000
#define THREAD_STACK (256u << 10)

static struct {
  int workers, clients, probes;
  uint32_t splits, want;
  double seconds;
  int hb_ms;
  const char *dir;
  bool keep;
  int connections; /* 0: one per simulated peer */
} cfg = {1000, 100, 4, 1000000, 16, 20.0, 1000, NULL, false, 0};

static char disp_addr[64];
static ferry_rpc_channel_t *chan; /* setup and status calls */
/* The peers' channels: peer i uses peer_chans[i % npeer_chans]. Channels
 * with the same arguments share one connection (gRPC's subchannel pool),
 * so each gets its own max_message_bytes: one TCP connection per channel,
 * as separate worker and client processes would have. */
static ferry_rpc_channel_t **peer_chans;
static int npeer_chans;

static ferry_rpc_channel_t *peer_chan(int peer) {
  return peer_chans[peer % npeer_chans];
}
static atomic_bool stop_workers, stop_clients;
static atomic_int registered;

/* ---- Samples ------------------------------------------------------------- */

typedef struct samples_s {
  double *v;
  size_t n, cap;
} samples_t;

static void add_sample(samples_t *s, double x) {
  if (s->n == s->cap) {
    size_t cap = s->cap ? s->cap * 2 : 256;
    double *v = realloc(s->v, cap * sizeof(double));
    if (v == NULL)
      return; /* a lost sample, never a crash */
    s->v = v;
    s->cap = cap;
  }
  s->v[s->n++] = x;
}

static void merge_samples(samples_t *into, const samples_t *s) {
  for (size_t i = 0; i < s->n; i++)
    add_sample(into, s->v[i]);
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* The q-quantile (nearest rank) of the sorted samples; NAN when none. */
static double quantile(const samples_t *s, double q) {
  if (s->n == 0)
    return NAN;
  size_t k = (size_t)ceil(q * (double)s->n);
  return s->v[k > 0 ? k - 1 : 0];
}

static void print_samples(const char *name, samples_t *s) {
  qsort(s->v, s->n, sizeof(double), cmp_double);
  printf("  %-44s %9zu  p50 %8.2f  p99 %8.2f  max %8.2f ms\n", name, s->n,
         quantile(s, 0.5), quantile(s, 0.99), s->n ? s->v[s->n - 1] : NAN);
}

/* ---- RPC helpers ----------------------------------------------------------- */

static uint8_t *pack(const ProtobufCMessage *m, size_t *len) {
  *len = protobuf_c_message_get_packed_size(m);
  uint8_t *b = malloc(*len ? *len : 1);
  if (b != NULL)
    protobuf_c_message_pack(m, b);
  return b;
}

/* One unary call of `m`; the answer unpacked with `desc` into *out. */
static int call(ferry_rpc_channel_t *ch, const char *method,
                const ProtobufCMessage *m,
                const ProtobufCMessageDescriptor *desc, ProtobufCMessage **out,
                ferry_error_t *err) {
  size_t len, rlen;
  uint8_t *buf = pack(m, &len), *reply = NULL;
  *out = NULL;
  if (buf == NULL)
    return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
  int rc = ferry__rpc_unary(ch, method, buf, len, CALL_DEADLINE_MS,
                            FERRY_RPC_WAIT_FOR_READY, &reply, &rlen, err);
  free(buf);
  if (rc != 0)
    return rc;
  *out = protobuf_c_message_unpack(desc, &ferry__pb_allocator, rlen, reply);
  ferry_free(reply);
  if (*out == NULL)
    return ferry__seterr(err, FERRY_EGRPC_INTERNAL, "%s: malformed answer",
                         method);
  return 0;
}

static void free_msg(ProtobufCMessage *m) {
  if (m != NULL)
    protobuf_c_message_free_unpacked(m, &ferry__pb_allocator);
}

/* Sleeps `ms` (pacing, never synchronisation). */
static void sleep_ms(double ms) {
  if (ms <= 0)
    return;
  struct timespec ts = {(time_t)(ms / 1e3),
                        (long)(fmod(ms, 1e3) * 1e6)};
  nanosleep(&ts, NULL);
}

/* ---- The dispatcher process --------------------------------------------- */

typedef struct proc_stats_s {
  double cpu_s;           /* utime + stime */
  uint64_t rss, hwm;      /* bytes */
} proc_stats_t;

/* CPU from the harness (hx_proc_cpu_s); RSS and its peak from
 * /proc/PID/status. */
static int read_proc_stats(pid_t pid, proc_stats_t *st) {
  char path[64];
  FILE *f;
  memset(st, 0, sizeof(*st));
  if ((st->cpu_s = hx_proc_cpu_s(pid)) < 0)
    return -1;
  snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
  if ((f = fopen(path, "r")) == NULL)
    return -1;
  char line[256];
  while (fgets(line, sizeof(line), f) != NULL) {
    unsigned long long kb;
    if (sscanf(line, "VmRSS: %llu kB", &kb) == 1)
      st->rss = kb << 10;
    else if (sscanf(line, "VmHWM: %llu kB", &kb) == 1)
      st->hwm = kb << 10;
  }
  fclose(f);
  return 0;
}

static Ferry__V1__GetStatusResponse *get_status(ferry_error_t *err) {
  Ferry__V1__GetStatusRequest req = FERRY__V1__GET_STATUS_REQUEST__INIT;
  ProtobufCMessage *out;
  if (call(chan, FERRY_METHOD_GET_STATUS, &req.base,
           &ferry__v1__get_status_response__descriptor, &out, err) != 0)
    return NULL;
  return (Ferry__V1__GetStatusResponse *)out;
}

/* ---- Simulated workers ------------------------------------------------------ */

typedef struct task_s {
  uint64_t job, lease, produced;
  uint32_t epoch, split;
} task_t;

typedef struct sim_worker_s {
  int index;
  bool probe;
  pthread_t th;
  uint64_t id;
  task_t *tasks;
  size_t ntasks, cap;
  samples_t reg_ms, news_ms, idle_late_ms, probe_ms;
  uint64_t beats, new_tasks, cancelled, errors;
  char err[600];
} sim_worker_t;

static void drop_task(sim_worker_t *w, const Ferry__V1__TaskRef *c) {
  for (size_t i = 0; i < w->ntasks; i++) {
    task_t *t = &w->tasks[i];
    if (t->job == c->job_id && t->epoch == c->epoch && t->split == c->split &&
        t->lease == c->lease) {
      w->tasks[i] = w->tasks[--w->ntasks];
      return;
    }
  }
}

static int add_task(sim_worker_t *w, const Ferry__V1__Task *t) {
  if (w->ntasks == w->cap) {
    size_t cap = w->cap ? w->cap * 2 : 16;
    task_t *v = realloc(w->tasks, cap * sizeof(task_t));
    if (v == NULL)
      return -1;
    w->tasks = v;
    w->cap = cap;
  }
  task_t *n = &w->tasks[w->ntasks++];
  n->job = t->job_id;
  n->epoch = t->epoch;
  n->split = t->split != NULL ? t->split->index : 0;
  n->lease = t->lease;
  /* Produced at once: the split's records (known for uncompressed). */
  n->produced = t->split != NULL ? t->split->num_records : 0;
  return 0;
}

/* One heartbeat listing every task as finished. Returns the call's rc. */
static int worker_beat(sim_worker_t *w, const char *address,
                       Ferry__V1__WorkerHeartbeatResponse **out,
                       ferry_error_t *err) {
  Ferry__V1__WorkerHeartbeatRequest req =
      FERRY__V1__WORKER_HEARTBEAT_REQUEST__INIT;
  Ferry__V1__TaskProgress *tp = calloc(w->ntasks + 1, sizeof(*tp));
  Ferry__V1__TaskProgress **pp = calloc(w->ntasks + 1, sizeof(*pp));
  int rc;
  if (tp == NULL || pp == NULL) {
    free(tp);
    free(pp);
    return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
  }
  req.worker_id = w->id;
  req.address = (char *)address;
  req.threads = 4;
  req.buffer_bytes = 1ull << 30;
  req.buffer_free_bytes = 1ull << 30;
  req.draining = w->probe;
  for (size_t i = 0; i < w->ntasks; i++) {
    ferry__v1__task_progress__init(&tp[i]);
    tp[i].job_id = w->tasks[i].job;
    tp[i].epoch = w->tasks[i].epoch;
    tp[i].split = w->tasks[i].split;
    tp[i].lease = w->tasks[i].lease;
    tp[i].produced = w->tasks[i].produced;
    tp[i].finished = true;
    pp[i] = &tp[i];
  }
  req.tasks = pp;
  req.n_tasks = w->ntasks;
  rc = call(peer_chan(w->index), FERRY_METHOD_WORKER_HEARTBEAT, &req.base,
            &ferry__v1__worker_heartbeat_response__descriptor,
            (ProtobufCMessage **)out, err);
  free(tp);
  free(pp);
  return rc;
}

static void *worker_main(void *arg) {
  sim_worker_t *w = arg;
  char address[64];
  /* Never dialled: the simulated workers open no data stream. */
  snprintf(address, sizeof(address), "127.0.0.1:%d", 20000 + w->index);
  double next = hx_now_ms();
  int every = w->probe ? PROBE_EVERY_MS : cfg.hb_ms;
  while (!atomic_load(&stop_workers)) {
    double now = hx_now_ms();
    if (now < next) {
      sleep_ms(next - now < 50 ? next - now : 50);
      continue;
    }
    Ferry__V1__WorkerHeartbeatResponse *r;
    ferry_error_t err = {0};
    int rc = worker_beat(w, address, &r, &err);
    double t1 = hx_now_ms(), rtt = t1 - now;
    if (rc != 0) {
      if (w->errors++ == 0)
        snprintf(w->err, sizeof(w->err), "%s", err.msg);
      next = t1 + every;
      continue;
    }
    w->beats++;
    if (w->id == 0) {
      w->id = r->worker_id;
      add_sample(&w->reg_ms, rtt);
      atomic_fetch_add(&registered, 1);
    }
    for (size_t i = 0; i < r->n_cancelled; i++)
      drop_task(w, r->cancelled[i]);
    for (size_t i = 0; i < r->n_new_tasks; i++)
      if (add_task(w, r->new_tasks[i]) != 0 && w->errors++ == 0)
        snprintf(w->err, sizeof(w->err), "out of memory");
    w->new_tasks += r->n_new_tasks;
    w->cancelled += r->n_cancelled;
    bool changed = r->n_new_tasks > 0 || r->n_cancelled > 0;
    if (w->probe)
      add_sample(&w->probe_ms, rtt);
    else if (w->beats > 1 && changed)
      add_sample(&w->news_ms, rtt);
    else if (w->beats > 1)
      add_sample(&w->idle_late_ms, rtt > cfg.hb_ms ? rtt - cfg.hb_ms : 0);
    free_msg(&r->base);
    next = changed && !w->probe ? t1 : now + every;
  }
  return NULL;
}

/* ---- Simulated clients ----------------------------------------------------- */

typedef struct asg_s {
  uint64_t worker, lease, num;
  uint32_t epoch, split;
} asg_t;

typedef struct sim_client_s {
  int index;
  pthread_t th;
  uint64_t job, id;
  uint8_t secret[FERRY_CLIENT_SECRET_BYTES];
  size_t secret_len;
  asg_t *held; /* the previous answer's splits, reported delivered next */
  size_t nheld;
  uint32_t waiting; /* the previous answer's splits without a worker yet */
  uint64_t grants, records, beats, errors;
  samples_t rtt_ms;
  char err[600];
} sim_client_t;

static int join_job(sim_client_t *c, const char *dataset_id,
                    ferry_error_t *err) {
  Ferry__V1__GetOrCreateJobRequest req =
      FERRY__V1__GET_OR_CREATE_JOB_REQUEST__INIT;
  Ferry__V1__JobOptions o = FERRY__V1__JOB_OPTIONS__INIT;
  Ferry__V1__GetOrCreateJobResponse *r;
  o.job_name = JOB_NAME;
  o.mode = FERRY__V1__JOB_MODE__JOB_MODE_DISTRIBUTED_EPOCH;
  o.num_epochs = -1;
  req.dataset_id = (char *)dataset_id;
  req.options = &o;
  int rc = call(peer_chan(cfg.workers + cfg.probes + c->index),
                FERRY_METHOD_GET_OR_CREATE_JOB, &req.base,
                &ferry__v1__get_or_create_job_response__descriptor,
                (ProtobufCMessage **)&r, err);
  if (rc != 0)
    return rc;
  c->job = r->job_id;
  c->id = r->client_id;
  c->secret_len = r->client_secret.len;
  if (c->secret_len != FERRY_CLIENT_SECRET_BYTES)
    c->secret_len = 0;
  else
    memcpy(c->secret, r->client_secret.data, c->secret_len);
  free_msg(&r->base);
  return 0;
}

/* One heartbeat: every held split delivered, `want` more asked for.
 * Counts the answer's new grants and keeps them as the held ones. */
static int client_beat(sim_client_t *c, bool leaving, ferry_error_t *err) {
  Ferry__V1__ClientHeartbeatRequest req =
      FERRY__V1__CLIENT_HEARTBEAT_REQUEST__INIT;
  Ferry__V1__ClientStats st = FERRY__V1__CLIENT_STATS__INIT;
  Ferry__V1__SplitProgress *sp = calloc(c->nheld + 1, sizeof(*sp));
  Ferry__V1__SplitProgress **pp = calloc(c->nheld + 1, sizeof(*pp));
  Ferry__V1__ClientHeartbeatResponse *r = NULL;
  asg_t *next = NULL;
  size_t nnext = 0;
  int rc;
  if (sp == NULL || pp == NULL) {
    rc = ferry__seterr(err, FERRY_ENOMEM, "out of memory");
    goto out;
  }
  req.job_id = c->job;
  req.client_id = c->id;
  req.client_secret.data = c->secret;
  req.client_secret.len = c->secret_len;
  /* Like ferry_client: at most `want` splits in flight, the ones still
   * waiting for a worker included. */
  req.want_splits = leaving || c->waiting >= cfg.want ? 0
                                                      : cfg.want - c->waiting;
  req.leaving = leaving;
  req.stats = &st;
  for (size_t i = 0; i < c->nheld; i++) {
    ferry__v1__split_progress__init(&sp[i]);
    sp[i].epoch = c->held[i].epoch;
    sp[i].split = c->held[i].split;
    sp[i].delivered = c->held[i].num;
    sp[i].worker_id = c->held[i].worker;
    sp[i].lease = c->held[i].lease;
    pp[i] = &sp[i];
  }
  req.progress = pp;
  req.n_progress = c->nheld;
  double t0 = hx_now_ms();
  rc = call(peer_chan(cfg.workers + cfg.probes + c->index),
            FERRY_METHOD_CLIENT_HEARTBEAT, &req.base,
            &ferry__v1__client_heartbeat_response__descriptor,
            (ProtobufCMessage **)&r, err);
  if (rc != 0)
    goto out;
  add_sample(&c->rtt_ms, hx_now_ms() - t0);
  c->beats++;
  /* What was reported is now acknowledged as delivered. */
  for (size_t i = 0; i < c->nheld; i++)
    c->records += c->held[i].num;
  if (r->state != FERRY__V1__JOB_STATE__JOB_STATE_RUNNING) {
    rc = ferry__seterr(err, FERRY_EIO, "job %" PRIu64 " is in state %d: %s",
                       c->job, r->state, r->error);
    goto out;
  }
  if ((next = calloc(r->n_assignments + 1, sizeof(*next))) == NULL) {
    rc = ferry__seterr(err, FERRY_ENOMEM, "out of memory");
    goto out;
  }
  uint32_t waiting = 0;
  for (size_t i = 0; i < r->n_assignments; i++) {
    const Ferry__V1__Assignment *a = r->assignments[i];
    if (a->worker_id == 0) {
      waiting++; /* bound, waiting for a worker: not a grant yet */
      continue;
    }
    asg_t *n = &next[nnext++];
    n->epoch = a->epoch;
    n->split = a->split;
    n->worker = a->worker_id;
    n->lease = a->lease;
    n->num = a->num_records;
    bool seen = false;
    for (size_t k = 0; k < c->nheld && !seen; k++)
      seen = c->held[k].epoch == n->epoch && c->held[k].split == n->split;
    if (seen) {
      rc = ferry__seterr(err, FERRY_EIO,
                         "epoch %u split %u listed again after it was "
                         "reported delivered",
                         n->epoch, n->split);
      goto out;
    }
    c->grants++;
  }
  free(c->held);
  c->held = next;
  c->nheld = nnext;
  c->waiting = waiting;
  next = NULL;
out:
  free(next);
  free(sp);
  free(pp);
  free_msg(r ? &r->base : NULL);
  return rc;
}

static void *client_main(void *arg) {
  sim_client_t *c = arg;
  while (!atomic_load(&stop_clients)) {
    ferry_error_t err = {0};
    if (client_beat(c, false, &err) != 0) {
      if (c->errors++ == 0)
        snprintf(c->err, sizeof(c->err), "%s", err.msg);
      sleep_ms(100);
    }
  }
  /* The last beat delivers what it holds and leaves. */
  ferry_error_t err = {0};
  if (client_beat(c, true, &err) != 0 && c->errors++ == 0)
    snprintf(c->err, sizeof(c->err), "leaving: %s", err.msg);
  return NULL;
}

/* ---- Setup ------------------------------------------------------------------- */

/* One file of `n` one-byte records. */
static int write_dataset(const char *path, uint32_t n) {
  ferry_tfr_writer_t *w;
  ferry_error_t err = {0};
  if (ferry__tfr_writer_open(path, FERRY_COMPRESSION_NONE, &w, &err) != 0) {
    fprintf(stderr, "bench_scale: %s\n", err.msg);
    return -1;
  }
  for (uint32_t i = 0; i < n; i++) {
    uint8_t b = (uint8_t)i;
    if (ferry__tfr_writer_write(w, &b, 1, &err) != 0) {
      fprintf(stderr, "bench_scale: %s\n", err.msg);
      ferry__tfr_writer_close(w, &err);
      return -1;
    }
  }
  if (ferry__tfr_writer_close(w, &err) != 0) {
    fprintf(stderr, "bench_scale: %s\n", err.msg);
    return -1;
  }
  return 0;
}

/* RegisterDataset with records_per_split 1; fills the id and split count. */
static int register_dataset(const char *path, char *id, size_t id_cap,
                            uint32_t *nsplits, ferry_error_t *err) {
  char text[1200];
  ferry_spec_t spec;
  uint8_t *canon = NULL;
  size_t clen;
  snprintf(text, sizeof(text),
           "tfrecord(\"%s\") | decode(raw, 1, 1, 1) | batch(1)", path);
  ferry__spec_init(&spec);
  int rc = ferry__spec_parse(text, &spec, err);
  if (rc == 0 && (rc = ferry__spec_pack(&spec, &canon, &clen)) != 0)
    ferry__seterr(err, rc, "cannot pack the spec");
  ferry__spec_close(&spec);
  if (rc != 0)
    return rc;
  /* RegisterDatasetRequest{spec = 1 (the canonical bytes as they are),
   * records_per_split = 2}. */
  uint8_t *req = malloc(clen + 32), *reply = NULL;
  size_t n = 0, rlen;
  if (req == NULL) {
    ferry_free(canon);
    return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
  }
  req[n++] = 0x0a;
  n += ferry__varint_put(req + n, clen);
  memcpy(req + n, canon, clen);
  n += clen;
  req[n++] = 0x10;
  n += ferry__varint_put(req + n, 1);
  ferry_free(canon);
  rc = ferry__rpc_unary(chan, FERRY_METHOD_REGISTER_DATASET, req, n,
                        10 * CALL_DEADLINE_MS, FERRY_RPC_WAIT_FOR_READY, &reply,
                        &rlen, err);
  free(req);
  if (rc != 0)
    return rc;
  Ferry__V1__RegisterDatasetResponse *r =
      ferry__v1__register_dataset_response__unpack(&ferry__pb_allocator, rlen,
                                                   reply);
  ferry_free(reply);
  if (r == NULL)
    return ferry__seterr(err, FERRY_EGRPC_INTERNAL,
                         "RegisterDataset: malformed answer");
  snprintf(id, id_cap, "%s", r->dataset_id);
  *nsplits = r->num_splits;
  free_msg(&r->base);
  return 0;
}

static int start_threads(pthread_t *th, int n, void *(*fn)(void *),
                         void *items, size_t item_size, size_t th_off) {
  pthread_attr_t at;
  pthread_attr_init(&at);
  pthread_attr_setstacksize(&at, THREAD_STACK);
  for (int i = 0; i < n; i++) {
    void *item = (char *)items + (size_t)i * item_size;
    if (pthread_create((pthread_t *)((char *)item + th_off), &at, fn, item) !=
        0) {
      pthread_attr_destroy(&at);
      return i;
    }
  }
  (void)th;
  pthread_attr_destroy(&at);
  return n;
}

static void usage(void) {
  fprintf(stderr,
          "usage: bench_scale [--quick] [--workers N] [--clients N] "
          "[--splits N] [--seconds S] [--want N] [--probes N] "
          "[--heartbeat-ms MS] [--dir DIR] [--keep] [--connections N]\n");
}

static int parse_args(int argc, char **argv) {
  static const struct option opts[] = {
      {"quick", no_argument, NULL, 'q'},
      {"workers", required_argument, NULL, 'w'},
      {"clients", required_argument, NULL, 'c'},
      {"splits", required_argument, NULL, 's'},
      {"seconds", required_argument, NULL, 't'},
      {"want", required_argument, NULL, 'n'},
      {"probes", required_argument, NULL, 'p'},
      {"heartbeat-ms", required_argument, NULL, 'h'},
      {"dir", required_argument, NULL, 'd'},
      {"keep", no_argument, NULL, 'k'},
      {"connections", required_argument, NULL, 'C'},
      {NULL, 0, NULL, 0}};
  int o;
  while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
    switch (o) {
    case 'q':
      cfg.workers = 50;
      cfg.clients = 5;
      cfg.splits = 10000;
      cfg.seconds = 3;
      break;
    case 'w': cfg.workers = atoi(optarg); break;
    case 'c': cfg.clients = atoi(optarg); break;
    case 's': cfg.splits = (uint32_t)strtoul(optarg, NULL, 10); break;
    case 't': cfg.seconds = atof(optarg); break;
    case 'n': cfg.want = (uint32_t)strtoul(optarg, NULL, 10); break;
    case 'p': cfg.probes = atoi(optarg); break;
    case 'h': cfg.hb_ms = atoi(optarg); break;
    case 'd': cfg.dir = optarg; break;
    case 'k': cfg.keep = true; break;
    case 'C': cfg.connections = atoi(optarg); break;
    default: usage(); return -1;
    }
  }
  if (optind != argc || cfg.workers < 1 || cfg.clients < 1 ||
      cfg.splits < 1 || cfg.seconds <= 0 || cfg.want < 1 ||
      cfg.want > 4096 || cfg.probes < 0 || cfg.hb_ms < 10 ||
      cfg.connections < 0) {
    usage();
    return -1;
  }
  return 0;
}

static const Ferry__V1__JobStatus *find_job(
    const Ferry__V1__GetStatusResponse *s) {
  for (size_t i = 0; s != NULL && i < s->n_jobs; i++)
    if (strcmp(s->jobs[i]->name, JOB_NAME) == 0)
      return s->jobs[i];
  return NULL;
}

/* Polls GetStatus until it answers, at most `wait_ms`; the answer or NULL. */
static Ferry__V1__GetStatusResponse *wait_status(int wait_ms,
                                                 ferry_error_t *err) {
  double until = hx_now_ms() + wait_ms;
  for (;;) {
    Ferry__V1__GetStatusResponse *s = get_status(err);
    if (s != NULL || hx_now_ms() > until)
      return s;
    sleep_ms(5);
  }
}

static double mib(uint64_t b) { return (double)b / (1 << 20); }

/* The 1-minute load average (the machine is shared: say how busy). */
static double load1(void) {
  double l = NAN;
  FILE *f = fopen("/proc/loadavg", "r");
  if (f != NULL) {
    if (fscanf(f, "%lf", &l) != 1)
      l = NAN;
    fclose(f);
  }
  return l;
}

static double self_cpu_s(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 +
         (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
}

static void target(const char *what, double v, double limit, bool above,
                   int *missed) {
  bool ok = above ? v >= limit : v <= limit;
  printf("  %-44s %12.1f  target %s %.0f  %s\n", what, v, above ? ">=" : "<=",
         limit, ok ? "PASS" : "MISS");
  *missed += !ok;
}

int main(int argc, char **argv) {
  char dir[520], data[600], wd[600], why[512];
  ferry_error_t err = {0};
  int failures = 0, missed = 0;
  if (parse_args(argc, argv) != 0)
    return 2;
  signal(SIGPIPE, SIG_IGN);
  ferry__rpc_init();
  if (cfg.dir != NULL) {
    mkdir(cfg.dir, 0755);
    snprintf(dir, sizeof(dir), "%s", cfg.dir);
  } else {
    snprintf(dir, sizeof(dir), "%s", hx_tmpdir());
  }
  snprintf(data, sizeof(data), "%s/scale.tfrecord", dir);
  snprintf(wd, sizeof(wd), "%s/dispatcher", dir);
  printf("bench scale: %d workers (+%d probes), %d clients, %u splits, "
         "%.0f s, want %u, heartbeat %d ms, %d connections; data and "
         "journal in %s\n",
         cfg.workers, cfg.probes, cfg.clients, cfg.splits, cfg.seconds,
         cfg.want, cfg.hb_ms,
         cfg.connections > 0 ? cfg.connections
                             : cfg.workers + cfg.probes + cfg.clients,
         dir);
  fflush(stdout);

  double t = hx_now_ms();
  if (write_dataset(data, cfg.splits) != 0)
    return 1;
  double write_ms = hx_now_ms() - t;

  /* Timeouts far above the interval: a loaded 2-core machine must not
   * make simulated peers look lost. */
  hx_daemon_opts_t o = {.heartbeat_ms = cfg.hb_ms,
                        .worker_timeout_ms = 30000,
                        .client_timeout_ms = 30000};
  hx_proc_t *p;
  if (hx_start_dispatcher_at(&p, &o, 0, wd, why, sizeof(why)) != 0) {
    fprintf(stderr, "bench_scale: dispatcher: %s\n", why);
    return 1;
  }
  if (ferry__rpc_channel_new(p->addr, NULL, &chan, &err) != 0) {
    fprintf(stderr, "bench_scale: %s\n", err.msg);
    return 1;
  }
  snprintf(disp_addr, sizeof(disp_addr), "%s", p->addr);
  npeer_chans = cfg.connections > 0
                    ? cfg.connections
                    : cfg.workers + cfg.probes + cfg.clients;
  if ((peer_chans = calloc((size_t)npeer_chans, sizeof(*peer_chans))) ==
      NULL)
    return 1;
  for (int i = 0; i < npeer_chans; i++) {
    ferry_rpc_options_t ro = {0};
    ro.max_message_bytes = FERRY_RPC_DEFAULT_MAX_MESSAGE + i;
    if (ferry__rpc_channel_new(p->addr, &ro, &peer_chans[i], &err) != 0) {
      fprintf(stderr, "bench_scale: %s\n", err.msg);
      return 1;
    }
  }
  Ferry__V1__GetStatusResponse *st = wait_status(10000, &err);
  if (st == NULL) {
    fprintf(stderr, "bench_scale: GetStatus: %s\n", err.msg);
    return 1;
  }
  free_msg(&st->base);
  proc_stats_t s0, s1, s1b, s2, s3;
  read_proc_stats(p->pid, &s0);

  /* The dataset. */
  char dsid[64];
  uint32_t nsplits = 0;
  t = hx_now_ms();
  if (register_dataset(data, dsid, sizeof(dsid), &nsplits, &err) != 0) {
    fprintf(stderr, "bench_scale: RegisterDataset: %s\n", err.msg);
    return 1;
  }
  double reg_ms = hx_now_ms() - t;
  read_proc_stats(p->pid, &s1);
  if (nsplits != cfg.splits) {
    fprintf(stderr, "bench_scale: %u splits registered, %u expected\n",
            nsplits, cfg.splits);
    return 1;
  }

  /* The workers, registered before any client asks for splits. */
  int nw = cfg.workers + cfg.probes;
  sim_worker_t *ws = calloc((size_t)nw, sizeof(*ws));
  sim_client_t *cs = calloc((size_t)cfg.clients, sizeof(*cs));
  if (ws == NULL || cs == NULL)
    return 1;
  for (int i = 0; i < nw; i++) {
    ws[i].index = i;
    ws[i].probe = i >= cfg.workers;
  }
  t = hx_now_ms();
  int started_w = start_threads(NULL, nw, worker_main, ws, sizeof(*ws),
                                offsetof(sim_worker_t, th));
  if (started_w < nw)
    fprintf(stderr, "bench_scale: only %d of %d worker threads started\n",
            started_w, nw);
  double until = hx_now_ms() + 60000;
  while (atomic_load(&registered) < started_w && hx_now_ms() < until)
    sleep_ms(10);
  double wreg_ms = hx_now_ms() - t;
  if (atomic_load(&registered) < nw) {
    fprintf(stderr, "bench_scale: %d of %d workers registered in 60 s\n",
            atomic_load(&registered), nw);
    failures++;
  }

  /* The split table's memory: RSS across the job's creation and its
   * epoch's start alone (the peers' connections and registrations come
   * before). */
  read_proc_stats(p->pid, &s1b);

  /* The clients join one named job (the first creates it and starts its
   * epoch). */
  for (int i = 0; i < cfg.clients; i++) {
    cs[i].index = i;
    if (join_job(&cs[i], dsid, &err) != 0) {
      fprintf(stderr, "bench_scale: GetOrCreateJob: %s\n", err.msg);
      return 1;
    }
  }
  t = hx_now_ms();
  if (client_beat(&cs[0], false, &err) != 0) {
    fprintf(stderr, "bench_scale: first ClientHeartbeat: %s\n", err.msg);
    return 1;
  }
  double first_beat_ms = hx_now_ms() - t;
  read_proc_stats(p->pid, &s2);

  /* The run. */
  double load_start = load1(), cpu_start = self_cpu_s();
  double t0 = hx_now_ms();
  int started_c = start_threads(NULL, cfg.clients, client_main, cs,
                                sizeof(*cs), offsetof(sim_client_t, th));
  if (started_c < cfg.clients) {
    fprintf(stderr, "bench_scale: only %d of %d client threads started\n",
            started_c, cfg.clients);
    failures++;
  }
  while (hx_now_ms() - t0 < cfg.seconds * 1e3)
    sleep_ms(50);
  atomic_store(&stop_clients, true);
  for (int i = 0; i < started_c; i++)
    pthread_join(cs[i].th, NULL);
  double run_s = (hx_now_ms() - t0) / 1e3;
  double load_end = load1(), bench_cpu = self_cpu_s() - cpu_start;
  read_proc_stats(p->pid, &s3);
  atomic_store(&stop_workers, true);
  for (int i = 0; i < started_w; i++)
    pthread_join(ws[i].th, NULL);

  /* What the dispatcher counts, next to what the peers counted. */
  uint64_t grants = 0, records = 0, cbeats = 0, cerr = 0, wbeats = 0,
           werr = 0, wtasks = 0;
  samples_t crtt = {0}, reg = {0}, news = {0}, late = {0}, probe = {0};
  for (int i = 0; i < cfg.clients; i++) {
    grants += cs[i].grants;
    records += cs[i].records;
    cbeats += cs[i].beats;
    cerr += cs[i].errors;
    merge_samples(&crtt, &cs[i].rtt_ms);
    if (cs[i].errors > 0)
      fprintf(stderr, "client %d: %" PRIu64 " errors, first: %s\n", i,
              cs[i].errors, cs[i].err);
  }
  for (int i = 0; i < nw; i++) {
    wbeats += ws[i].beats;
    werr += ws[i].errors;
    wtasks += ws[i].new_tasks;
    merge_samples(&reg, &ws[i].reg_ms);
    merge_samples(&news, &ws[i].news_ms);
    merge_samples(&late, &ws[i].idle_late_ms);
    merge_samples(&probe, &ws[i].probe_ms);
    if (ws[i].errors > 0 && werr == ws[i].errors)
      fprintf(stderr, "worker %d: %" PRIu64 " errors, first: %s\n", i,
              ws[i].errors, ws[i].err);
  }
  st = get_status(&err);
  const Ferry__V1__JobStatus *js = find_job(st);
  uint64_t disp_delivered = js != NULL ? js->delivered_all : 0;
  uint32_t disp_epoch = js != NULL ? js->epoch : 0;
  bool running =
      js != NULL && js->state == FERRY__V1__JOB_STATE__JOB_STATE_RUNNING;
  free_msg(st ? &st->base : NULL);

  struct stat jst;
  char jpath[700];
  snprintf(jpath, sizeof(jpath), "%s/journal", wd);
  uint64_t jbytes = stat(jpath, &jst) == 0 ? (uint64_t)jst.st_size : 0;

  for (int i = 0; i < npeer_chans; i++)
    ferry__rpc_channel_free(peer_chans[i]);
  free(peer_chans);

  /* Restart on the journal of the run: kill -9, start, first answer. */
  hx_stop(p, SIGKILL, 5000, NULL);
  ferry__rpc_channel_free(chan);
  chan = NULL;
  t = hx_now_ms();
  hx_proc_t *p2;
  double restart_ms = NAN, listen_ms = NAN;
  uint64_t re_delivered = 0;
  proc_stats_t s4 = {0};
  if (hx_start_dispatcher_at(&p2, &o, 0, wd, why, sizeof(why)) != 0) {
    fprintf(stderr, "bench_scale: restart: %s\n", why);
    failures++;
  } else {
    listen_ms = hx_now_ms() - t;
    if (ferry__rpc_channel_new(p2->addr, NULL, &chan, &err) == 0 &&
        (st = wait_status(60000, &err)) != NULL) {
      restart_ms = hx_now_ms() - t;
      js = find_job(st);
      re_delivered = js != NULL ? js->delivered_all : 0;
      free_msg(&st->base);
    } else {
      fprintf(stderr, "bench_scale: restart: GetStatus: %s\n", err.msg);
      failures++;
    }
    read_proc_stats(p2->pid, &s4);
    ferry__rpc_channel_free(chan);
    chan = NULL;
    hx_stop(p2, SIGTERM, 10000, NULL);
  }

  /* The report. */
  printf("setup: dataset written in %.0f ms, registered in %.0f ms, %d "
         "workers registered in %.0f ms, first client beat %.0f ms\n",
         write_ms, reg_ms, nw, wreg_ms, first_beat_ms);
  printf("run: %.1f s, %" PRIu64 " client beats, %" PRIu64 " worker beats, "
         "%" PRIu64 " tasks handed to workers, epoch %u reached\n",
         run_s, cbeats, wbeats, wtasks, disp_epoch);
  printf("latency (round trips):\n");
  print_samples("client beat", &crtt);
  print_samples("worker registration (first beat)", &reg);
  print_samples("worker beat answered with news", &news);
  print_samples("worker idle beat, lateness past interval", &late);
  print_samples("heartbeat latency (probe workers, unheld)", &probe);
  uint64_t ds_bytes = s1.rss > s0.rss ? s1.rss - s0.rss : 0;
  uint64_t job_bytes = s2.rss > s1b.rss ? s2.rss - s1b.rss : 0;
  printf("dispatcher memory: RSS %.1f MiB at start, %.1f after the "
         "registration, %.1f with the peers connected, %.1f after the "
         "epoch's start, %.1f after the run; peak %.1f MiB\n",
         mib(s0.rss), mib(s1.rss), mib(s1b.rss), mib(s2.rss), mib(s3.rss),
         mib(s3.hwm));
  printf("  per split: dataset %.1f B, job rows %.1f B, both %.1f B\n",
         (double)ds_bytes / cfg.splits, (double)job_bytes / cfg.splits,
         (double)(ds_bytes + job_bytes) / cfg.splits);
  printf("dispatcher CPU: %.2f s in all, %.2f s during the run (%.0f%% of "
         "one core)\n",
         s3.cpu_s, s3.cpu_s - s2.cpu_s,
         100 * (s3.cpu_s - s2.cpu_s) / run_s);
  double run_cpu = s3.cpu_s - s2.cpu_s;
  if (grants > 0)
    printf("dispatcher CPU per grant (every heartbeat of the run included): "
           "%.1f us, i.e. %.0f grants per CPU second\n",
           1e6 * run_cpu / (double)grants,
           run_cpu > 0 ? (double)grants / run_cpu : NAN);
  printf("machine: %ld CPUs, load average %.1f at the run's start, %.1f at "
         "its end; the simulated peers (this process) used %.2f CPU s during "
         "the run\n",
         sysconf(_SC_NPROCESSORS_ONLN), load_start, load_end, bench_cpu);
  printf("journal: %.1f MiB; restart on it: listening after %.0f ms, first "
         "answer after %.0f ms, RSS %.1f MiB\n",
         mib(jbytes), listen_ms, restart_ms, mib(s4.rss));
  printf("targets:\n");
  double gps = (double)grants / run_s;
  target("durable lease grants/s", gps, 20000, true, &missed);
  qsort(probe.v, probe.n, sizeof(double), cmp_double);
  target("heartbeat p99 (ms)", quantile(&probe, 0.99), 50, false, &missed);
  target("bytes per split", (double)(ds_bytes + job_bytes) / cfg.splits, 200,
         false, &missed);
  target("restart (ms)", restart_ms, 2000, false, &missed);
  printf("targets: %d MISS\n", missed);

  /* Sanity: the run is valid only if these hold. */
  if (cerr > 0 || werr > 0) {
    fprintf(stderr, "FAIL: %" PRIu64 " client and %" PRIu64
            " worker calls failed\n", cerr, werr);
    failures++;
  }
  if (!running) {
    fprintf(stderr, "FAIL: job %s is not running\n", JOB_NAME);
    failures++;
  }
  if (grants == 0 || records != grants || disp_delivered != records) {
    fprintf(stderr, "FAIL: %" PRIu64 " grants, %" PRIu64 " records "
            "acknowledged, the dispatcher counts %" PRIu64 "\n",
            grants, records, disp_delivered);
    failures++;
  }
  if (re_delivered != disp_delivered) {
    fprintf(stderr, "FAIL: after the restart the dispatcher counts %" PRIu64
            " records delivered, %" PRIu64 " before\n",
            re_delivered, disp_delivered);
    failures++;
  }
  printf("sanity: %" PRIu64 " grants = %" PRIu64 " records acknowledged = "
         "%" PRIu64 " counted by the dispatcher (and after its restart: "
         "%" PRIu64 "); %" PRIu64 " failed calls\n",
         grants, records, disp_delivered, re_delivered, cerr + werr);
  for (int i = 0; i < cfg.clients; i++) {
    free(cs[i].held);
    free(cs[i].rtt_ms.v);
  }
  for (int i = 0; i < nw; i++) {
    free(ws[i].tasks);
    free(ws[i].reg_ms.v);
    free(ws[i].news_ms.v);
    free(ws[i].idle_late_ms.v);
    free(ws[i].probe_ms.v);
  }
  free(crtt.v);
  free(reg.v);
  free(news.v);
  free(late.v);
  free(probe.v);
  free(cs);
  free(ws);
  ferry__rpc_shutdown();
  if (cfg.keep)
    setenv("FERRY_IT_KEEP", "1", 1);
  if (failures > 0) {
    hx_dump_logs();
    return 1;
  }
  printf("bench scale: ok\n");
  return 0;
}
