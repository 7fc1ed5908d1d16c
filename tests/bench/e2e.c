/* bench_e2e: the service end to end against its baselines, in one run.
 *
 * Writes a 32x32x3 raw dataset, starts ferry-dispatcher and one, then two
 * ferry-workers as subprocesses, and measures the records/s and MB/s one
 * client receives for
 *   (a) passthrough: decode(raw, 32, 32, 3) | batch(1024), transport and
 *       assembly only, and
 *   (b) the seed pipeline: + dilate(3) | blur(11, 0.8),
 * next to the same pipeline run in-process (ferry_pipeline over the same
 * files on as many threads as the workers have in all) and a bare gRPC
 * core server-stream of the same number of bytes in 2 MiB messages
 * (common/rpc on both ends, no Ferry logic). Prints a table and the
 * ratios: passthrough / bare stream (target >= 0.8) and seed service /
 * in-process (target >= 0.9).
 *
 * Every service row runs once per transport (--transports,
 * default grpc,ucx when UCX is built in: the client's `transport`
 * option), next to bare_transfer's two-process bare gRPC stream and bare
 * UCX transfer of the same bytes in 2 MiB messages (run as a child,
 * FERRY_BARE_TRANSFER or the path compiled in), with the client's CPU
 * seconds per GB received (getrusage of this process: the daemons are
 * children). Targets: UCX passthrough >= 5 GB/s and >= 0.8 of bare UCX,
 * gRPC passthrough >= 0.8 of bare gRPC, client CPU on UCX <= 0.15 s/GB,
 * and the seed pipeline's CPU per record in process over the workers'
 * (utime + stime of their processes, /proc/PID/stat, around each epoch;
 * column "pipe us/rec") >= 0.9.
 *
 * Every service row runs in both orders (--orders), the
 * client's default (arrival) and order=deterministic (one rank, the
 * epoch's order), alternating run by run; the ratio deterministic /
 * arrival in records/s has the target >= 0.9, and each deterministic row
 * prints the most records its client held back waiting for their turn.
 *
 * Every service row times an epoch of a registered dataset (its header
 * scan runs before the first row) from ferry_client_new to the last
 * batch; column "first s" is the time to the first batch within it.
 *
 * Usage: bench_e2e [--quick] [--records N] [--worker-threads T]
 *                  [--heartbeat-ms MS] [--splits-in-flight N]
 *                  [--dispatcher PATH] [--worker PATH]
 *                  [--transports grpc|ucx|grpc,ucx] (default: both when built)
 *                  [--pipelines passthrough,seed] (default: both)
 *                  [--max-workers 1|2] (default 2: rows for 1 and 2)
 *                  [--repeat N] (service epochs per row, 1..15; the run of
 *                  median time stands, the range is printed)
 *                  [--orders arrival|arrival,deterministic] (default both)
 *                  [--batch N] (default 1024: with 2 MiB chunks of 682
 *                  records and 1024-record splits, chunks never straddle
 *                  two batches; 1000 makes most of them straddle)
 * --heartbeat-ms sets the daemons' interval (default 100); the client's is
 * half of it. Workers learn new leases from their heartbeats, so both it
 * and --splits-in-flight (the client's; 0: its default) bound the rate.
 */
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <uv.h>

#include "alloc.h"
#include "ferry/client.h"
#include "ferry/log.h"
#include "harness.h"
#include "pipeline.h"
#include "rpc.h"
#include "spec.h"
#include "tfrecord.h"
#include "transport.h"
#include "varint.h"

#define H 32
#define W 32
#define C 3
#define IMG (H * W * C)
#define MAX_BATCH 65536
static int opt_batch = 1024; /* --batch */
#define MSG_BYTES (2u << 20)
#define MAX_REPEAT 15

static const char *seed_ops = "dilate(3) | blur(11, 0.8)";

typedef struct result_s {
  char name[128];
  uint64_t records;
  double seconds;
  double stall; /* client's wait fraction; < 0: not a client run */
  double cpu;   /* client CPU seconds; < 0: not measured */
  double wcpu;  /* the pipeline's CPU seconds: the workers' processes, or
                   this one for an in-process row; < 0: not measured */
  double first; /* service rows: seconds to the first batch; < 0: none */
} result_t;

static result_t results[32];
static int nresults;

static result_t *add_result(const char *name, uint64_t records,
                            double seconds, double stall) {
  result_t *r = &results[nresults++];
  snprintf(r->name, sizeof(r->name), "%s", name);
  r->records = records;
  r->seconds = seconds;
  r->stall = stall;
  r->cpu = -1;
  r->wcpu = -1;
  r->first = -1;
  return r;
}

static double cpu_s(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 +
         (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
}

static double cpu_per_gb(const result_t *r) {
  double gb = (double)r->records * IMG / 1e9;
  return r->cpu >= 0 && gb > 0 ? r->cpu / gb : -1;
}

/* The pipeline's CPU microseconds per record. */
static double wcpu_us(const result_t *r) {
  return r->wcpu >= 0 && r->records > 0 ? r->wcpu * 1e6 / (double)r->records
                                        : -1;
}

/* CPU seconds of the workers' processes so far. */
static double workers_cpu(hx_proc_t *const *w, int n) {
  double sum = 0;
  for (int i = 0; i < n; i++) {
    double c = hx_proc_cpu_s(w[i]->pid);
    if (c < 0)
      return -1;
    sum += c;
  }
  return sum;
}

static double mbps(const result_t *r) {
  return r->seconds > 0
             ? (double)r->records * IMG / 1e6 / r->seconds
             : 0.0;
}

static int cmp_seconds(const void *a, const void *b) {
  double x = ((const result_t *)a)->seconds, y = ((const result_t *)b)->seconds;
  return x < y ? -1 : x > y;
}

static double rps(const result_t *r) {
  return r->seconds > 0 ? (double)r->records / r->seconds : 0.0;
}

/* ---- The service --------------------------------------------------------- */

/* One epoch through a fresh anonymous job. Returns records received, or 0
 * with a message on stderr. */
static int opt_heartbeat_ms = 100;
static int opt_splits_in_flight;

static uint64_t service_epoch(const char *dispatcher, const char *spec,
                              const char *transport, ferry_order_t order,
                              double *seconds, double *stall, double *cpu,
                              double *first) {
  ferry_client_options_t o;
  hx_client_options(&o, dispatcher, spec);
  o.transport = transport;
  o.order = order;
  double c0 = cpu_s();
  o.num_epochs = 1;
  o.heartbeat_ms = (uint32_t)(opt_heartbeat_ms > 1 ? opt_heartbeat_ms / 2 : 1);
  if (opt_splits_in_flight > 0)
    o.splits_in_flight = (uint32_t)opt_splits_in_flight;
  ferry_client_t *c = NULL;
  ferry_error_t err = {0};
  double t0 = hx_now_ms();
  if (ferry_client_new(&o, &c, &err) != 0) {
    fprintf(stderr, "bench_e2e: ferry_client_new: %s\n", err.msg);
    return 0;
  }
  uint64_t records = 0;
  volatile uint8_t sink = 0;
  for (;;) {
    const ferry_batch_t *b;
    int rc = ferry_next(c, &b, 30000, &err);
    if (rc == FERRY_EPOCH_END || rc == FERRY_END)
      break;
    if (rc != 0) {
      fprintf(stderr, "bench_e2e: ferry_next: %s (%s)\n", err.msg,
              ferry_strerror(rc));
      records = 0;
      break;
    }
    if (records == 0)
      *first = (hx_now_ms() - t0) / 1e3;
    /* Touch the batch as a trainer would start to. */
    sink ^= b->images[(size_t)b->size * IMG - 1];
    records += b->size;
    ferry_batch_release(c, b);
  }
  *seconds = (hx_now_ms() - t0) / 1e3;
  ferry_client_stats_t st;
  ferry_client_stats(c, &st);
  *stall = st.stall_fraction;
  if (order == FERRY_ORDER_DETERMINISTIC)
    printf("  deterministic order, %s: %llu records placed in their "
           "batches before their turn, at most %llu (%.1f MiB) held for "
           "it\n", transport, (unsigned long long)st.records_placed_ahead,
           (unsigned long long)st.held_records_peak,
           (double)st.held_records_peak * IMG / (1 << 20));
  ferry_client_free(c);
  *cpu = cpu_s() - c0;
  (void)sink;
  return records;
}

/* ---- In process ---------------------------------------------------------- */

typedef struct inproc_s {
  const hx_dataset_t *ds;
  const ferry_pipeline_t *p;
  int index, nthreads;
  uint64_t records;
  int rc;
  char msg[600];
} inproc_t;

static void *inproc_main(void *arg) {
  inproc_t *t = arg;
  ferry_pipeline_ctx_t *ctx = NULL;
  ferry_error_t err = {0};
  uint8_t *batch = ferry__malloc((size_t)opt_batch * IMG);
  int64_t *labels = ferry__malloc((size_t)opt_batch * sizeof(int64_t));
  uint32_t fill = 0;
  if (batch == NULL || labels == NULL ||
      ferry__pipeline_ctx_new(t->p, &ctx, &err) != 0) {
    t->rc = -1;
    snprintf(t->msg, sizeof(t->msg), "ctx: %s", err.msg);
    ferry__free(batch);
    ferry__free(labels);
    return NULL;
  }
  ferry__pipeline_ctx_set_borrow(ctx, 1); /* as the worker's */
  /* Files round-robin over the threads, like splits over workers. */
  for (int f = t->index; f < t->ds->nfiles && t->rc == 0; f += t->nthreads) {
    ferry_tfr_reader_t *r;
    ferry_tfr_options_t ro;
    ferry__tfr_options_init(&ro);
    if (ferry__tfr_reader_open(t->ds->files[f], &ro, &r, &err) != 0) {
      t->rc = -1;
      snprintf(t->msg, sizeof(t->msg), "%s", err.msg);
      break;
    }
    ferry_record_t rec;
    int rc;
    while ((rc = ferry__tfr_reader_next(r, &rec, &err)) == 0) {
      const uint8_t *px;
      int h, w, c;
      int64_t label;
      if (ferry__pipeline_process(ctx, rec.data, rec.len, &px, &h, &w, &c,
                                  &label, &err) != 0) {
        t->rc = -1;
        snprintf(t->msg, sizeof(t->msg), "%s", err.msg);
        break;
      }
      /* Assembly into a batch, as the client does. */
      memcpy(batch + (size_t)fill * IMG, px, IMG);
      labels[fill] = label;
      if (++fill == (uint32_t)opt_batch)
        fill = 0;
      t->records++;
    }
    if (rc != FERRY_EOF && t->rc == 0) {
      t->rc = rc;
      snprintf(t->msg, sizeof(t->msg), "%s", err.msg);
    }
    ferry__tfr_reader_free(r);
  }

  ferry__pipeline_ctx_free(ctx);
  ferry__free(batch);
  ferry__free(labels);
  return NULL;
}

static uint64_t inproc_epoch(const hx_dataset_t *ds, const char *spec_text,
                             int nthreads, double *seconds) {
  ferry_spec_t spec;
  ferry_error_t err = {0};
  ferry_pipeline_t *p = NULL;
  if (ferry__spec_parse(spec_text, &spec, &err) != 0 ||
      ferry__pipeline_new(&spec, &p, &err) != 0) {
    fprintf(stderr, "bench_e2e: in-process pipeline: %s\n", err.msg);
    return 0;
  }
  ferry__spec_close(&spec);
  inproc_t t[64];
  pthread_t th[64];
  double t0 = hx_now_ms();
  for (int i = 0; i < nthreads; i++) {
    t[i] = (inproc_t){.ds = ds, .p = p, .index = i, .nthreads = nthreads};
    pthread_create(&th[i], NULL, inproc_main, &t[i]);
  }
  uint64_t records = 0;
  for (int i = 0; i < nthreads; i++) {
    pthread_join(th[i], NULL);
    if (t[i].rc != 0)
      fprintf(stderr, "bench_e2e: in-process thread %d: %s\n", i, t[i].msg);
    records += t[i].records;
  }
  *seconds = (hx_now_ms() - t0) / 1e3;
  ferry__pipeline_free(p);
  return records;
}

/* ---- A bare gRPC core stream --------------------------------------------- */

static struct {
  uv_loop_t loop;
  uv_async_t wake;
  pthread_t thread;
  ferry_rpc_server_t *server;
  int port;
  uint8_t *payload;
  uint64_t total; /* messages per call */
  uint64_t sent;
  atomic_bool stop;
} B;

static void no_free(void *arg) { (void)arg; }

static void bare_send(ferry_rpc_call_t *call);

static void bare_sent(ferry_rpc_call_t *call, int ok, void *arg) {
  (void)arg;
  if (!ok) {
    ferry__rpc_stream_finish(call, FERRY_RPC_CANCELLED, "peer gone");
    return;
  }
  bare_send(call);
}

/* One message: field 1 (the index) and field 2 (the payload's tag and
 * length) as a small copied header, then the shared payload, not copied,
 * as the workers send chunks. */
static void bare_send(ferry_rpc_call_t *call) {
  if (B.sent == B.total) {
    ferry__rpc_stream_finish(call, FERRY_RPC_OK, NULL);
    return;
  }
  uint8_t hdr[24];
  size_t n = 0;
  hdr[n++] = 0x08;
  n += ferry__varint_put(hdr + n, B.sent);
  hdr[n++] = 0x12;
  n += ferry__varint_put(hdr + n, MSG_BYTES);
  ferry_rpc_piece_t pieces[2] = {
      {hdr, n, NULL, NULL},
      {B.payload, MSG_BYTES, no_free, NULL},
  };
  B.sent++;
  if (ferry__rpc_stream_send(call, pieces, 2, bare_sent, NULL) != 0)
    ferry__rpc_stream_finish(call, FERRY_RPC_INTERNAL, "send failed");
}

static void bare_handler(ferry_rpc_call_t *call, const uint8_t *req,
                         size_t len, void *user) {
  (void)req;
  (void)len;
  (void)user;
  B.sent = 0;
  bare_send(call);
}

static void bare_done(void *arg) {
  (void)arg;
  uv_close((uv_handle_t *)&B.wake, NULL);
}

static void bare_wake(uv_async_t *h) {
  (void)h;
  if (atomic_load(&B.stop))
    ferry__rpc_server_shutdown(B.server, bare_done, NULL);
}

static void *bare_loop(void *arg) {
  (void)arg;
  uv_run(&B.loop, UV_RUN_DEFAULT);
  return NULL;
}

/* Streams `bytes` (rounded up to whole 2 MiB messages) and returns the
 * bytes received, or 0. */
static uint64_t bare_stream(uint64_t bytes, double *seconds) {
  ferry_error_t err = {0};
  uint64_t got = 0;
  B.payload = ferry__malloc(MSG_BYTES);
  if (B.payload == NULL)
    return 0;
  for (size_t i = 0; i < MSG_BYTES; i++)
    B.payload[i] = (uint8_t)(i * 131 + 7);
  B.total = (bytes + MSG_BYTES - 1) / MSG_BYTES;
  atomic_store(&B.stop, false);
  if (uv_loop_init(&B.loop) != 0 ||
      uv_async_init(&B.loop, &B.wake, bare_wake) != 0 ||
      ferry__rpc_server_new(&B.loop, NULL, &B.server, &err) != 0 ||
      ferry__rpc_server_register(B.server, "/bench.Bare/Stream",
                                 FERRY_RPC_SERVER_STREAM, bare_handler, NULL,
                                 &err) != 0 ||
      ferry__rpc_server_start(B.server, "127.0.0.1:0", &B.port, &err) != 0) {
    fprintf(stderr, "bench_e2e: bare server: %s\n", err.msg);
    return 0;
  }
  pthread_create(&B.thread, NULL, bare_loop, NULL);
  char target[64];
  snprintf(target, sizeof(target), "127.0.0.1:%d", B.port);
  ferry_rpc_channel_t *ch = NULL;
  ferry_rpc_stream_t *s = NULL;
  double t0 = hx_now_ms();
  if (ferry__rpc_channel_new(target, NULL, &ch, &err) == 0 &&
      ferry__rpc_stream_open(ch, "/bench.Bare/Stream", "", 0, 0,
                             FERRY_RPC_WAIT_FOR_READY, &s, &err) == 0) {
    for (;;) {
      ferry_rpc_msg_t m;
      int rc = ferry__rpc_stream_next(s, &m, 30000, &err);
      if (rc != 0) {
        if (rc != FERRY_EOF)
          fprintf(stderr, "bench_e2e: bare stream: %s\n", err.msg);
        break;
      }
      got += m.len;
      ferry__rpc_msg_release(&m);
    }
  } else {
    fprintf(stderr, "bench_e2e: bare client: %s\n", err.msg);
  }
  *seconds = (hx_now_ms() - t0) / 1e3;
  ferry__rpc_stream_free(s);
  ferry__rpc_channel_free(ch);
  atomic_store(&B.stop, true);
  uv_async_send(&B.wake);
  pthread_join(B.thread, NULL);
  uv_loop_close(&B.loop);
  ferry__free(B.payload);
  return got;
}

/* ---- Main ---------------------------------------------------------------- */

static void print_row(const result_t *r) {
  char stall[16] = "-", cpu[16] = "-", wcpu[16] = "-", first[16] = "-";
  if (r->first >= 0)
    snprintf(first, sizeof(first), "%.3f", r->first);
  if (r->stall >= 0)
    snprintf(stall, sizeof(stall), "%.1f%%", r->stall * 100.0);
  if (cpu_per_gb(r) >= 0)
    snprintf(cpu, sizeof(cpu), "%.3f", cpu_per_gb(r));
  if (wcpu_us(r) >= 0)
    snprintf(wcpu, sizeof(wcpu), "%.2f", wcpu_us(r));
  printf("  %-42s %12.0f %10.1f %8.2f %8s %10s %10s %10s\n", r->name, rps(r),
         mbps(r), r->seconds, first, stall, cpu, wcpu);
}

/* Runs bare_transfer for `bytes` in 2 MiB messages and adds its rows
 * ("bare gRPC, 2 processes", "bare UCX, 2 processes"). */
static void bare_transfers(uint64_t bytes) {
  const char *bin = getenv("FERRY_BARE_TRANSFER");
#ifdef FERRY_BARE_TRANSFER_BIN
  if (bin == NULL)
    bin = FERRY_BARE_TRANSFER_BIN;
#endif
  if (bin == NULL)
    return;
  char cmd[4096];
  snprintf(cmd, sizeof(cmd), "%s --bytes %llu --msg-bytes 2M", bin,
           (unsigned long long)bytes);
  FILE *f = popen(cmd, "r");
  if (f == NULL)
    return;
  char line[512];
  while (fgets(line, sizeof(line), f) != NULL) {
    char kind[16];
    double kib, gbps, secs, cpu;
    if (sscanf(line, " %15s %lf KiB %lf %lf %lf", kind, &kib, &gbps, &secs,
               &cpu) != 5 || gbps <= 0)
      continue;
    result_t *r = add_result(strcmp(kind, "ucx") == 0
                                 ? "bare UCX, 2 processes, 2 MiB"
                                 : "bare gRPC, 2 processes, 2 MiB",
                             (uint64_t)(gbps * 1e9 * secs / IMG), secs, -1);
    r->cpu = cpu * gbps * secs;
  }
  if (pclose(f) != 0)
    fprintf(stderr, "bench_e2e: %s failed\n", cmd);
}

static const result_t *find(const char *name) {
  for (int i = 0; i < nresults; i++)
    if (strcmp(results[i].name, name) == 0)
      return &results[i];
  return NULL;
}

/* The in-process pipeline's CPU per record over the service's (its
 * workers' processes, everything they do for the stream included). */
static void cpu_ratio(const char *what, const char *service,
                      const char *inproc, double target, int *pass,
                      int *fail) {
  const result_t *x = find(service), *y = find(inproc);
  double sx = x != NULL ? wcpu_us(x) : -1, sy = y != NULL ? wcpu_us(y) : -1;
  if (sx <= 0 || sy <= 0) {
    printf("  %-52s    n/a\n", what);
    (*fail)++;
    return;
  }
  double r = sy / sx;
  bool ok = r >= target;
  printf("  %-52s %6.2f  (%.2f / %.2f us per record; target >= %.1f: %s)\n",
         what, r, sy, sx, target, ok ? "PASS" : "below");
  if (ok)
    (*pass)++;
  else
    (*fail)++;
}

static void ratio(const char *what, const char *a, const char *b,
                  double target, int *pass, int *fail) {
  const result_t *x = find(a), *y = find(b);
  if (x == NULL || y == NULL || mbps(y) <= 0 || x->records == 0) {
    printf("  %-52s    n/a\n", what);
    (*fail)++;
    return;
  }
  double r = mbps(x) / mbps(y);
  bool ok = r >= target;
  printf("  %-52s %6.2f  (target >= %.1f: %s)\n", what, r, target,
         ok ? "PASS" : "below");
  if (ok)
    (*pass)++;
  else
    (*fail)++;
}

int main(int argc, char **argv) {
  bool quick = false;
  long records = 100000;
  int wthreads = 1;
  const char *transports[2] = {"grpc", "ucx"};
  int ntransports = ferry__transport_find("ucx") != NULL ? 2 : 1;
  static const struct option longopts[] = {
      {"quick", no_argument, NULL, 'q'},
      {"records", required_argument, NULL, 'n'},
      {"worker-threads", required_argument, NULL, 't'},
      {"heartbeat-ms", required_argument, NULL, 'b'},
      {"splits-in-flight", required_argument, NULL, 's'},
      {"dispatcher", required_argument, NULL, 'd'},
      {"worker", required_argument, NULL, 'w'},
      {"transports", required_argument, NULL, 'T'},
      {"pipelines", required_argument, NULL, 'P'},
      {"max-workers", required_argument, NULL, 'M'},
      {"repeat", required_argument, NULL, 'R'},
      {"batch", required_argument, NULL, 'B'},
      {"orders", required_argument, NULL, 'O'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0}};
  int ch;
  bool records_set = false, run_pass = true, run_seed = true;
  int max_workers = 2, repeat = 1, norders = 2;
  while ((ch = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
    switch (ch) {
    case 'q': quick = true; break;
    case 'n': records = atol(optarg); records_set = true; break;
    case 't': wthreads = atoi(optarg); break;
    case 'b': opt_heartbeat_ms = atoi(optarg); break;
    case 's': opt_splits_in_flight = atoi(optarg); break;
    case 'd': setenv("FERRY_IT_DISPATCHER", optarg, 1); break;
    case 'w': setenv("FERRY_IT_WORKER", optarg, 1); break;
    case 'P':
      run_pass = strstr(optarg, "passthrough") != NULL;
      run_seed = strstr(optarg, "seed") != NULL;
      if (!run_pass && !run_seed) {
        fprintf(stderr, "bench_e2e: --pipelines passthrough, seed or "
                "passthrough,seed\n");
        return 2;
      }
      break;
    case 'M': max_workers = atoi(optarg); break;
    case 'R': repeat = atoi(optarg); break;
    case 'B': opt_batch = atoi(optarg); break;
    case 'O':
      if (strcmp(optarg, "arrival") == 0) {
        norders = 1;
      } else if (strcmp(optarg, "arrival,deterministic") == 0) {
        norders = 2;
      } else {
        fprintf(stderr, "bench_e2e: --orders arrival or "
                "arrival,deterministic\n");
        return 2;
      }
      break;
    case 'T':
      if (strcmp(optarg, "grpc") == 0 || strcmp(optarg, "ucx") == 0) {
        transports[0] = strcmp(optarg, "grpc") == 0 ? "grpc" : "ucx";
        ntransports = 1;
      } else if (strcmp(optarg, "grpc,ucx") == 0) {
        ntransports = 2;
      } else {
        fprintf(stderr, "bench_e2e: --transports grpc, ucx or grpc,ucx\n");
        return 2;
      }
      break;
    default:
      fprintf(ch == 'h' ? stdout : stderr,
              "usage: bench_e2e [--quick] [--records N] "
              "[--worker-threads T] [--heartbeat-ms MS]\n"
              "                 [--splits-in-flight N] [--dispatcher PATH] "
              "[--worker PATH]\n"
              "                 [--transports grpc|ucx|grpc,ucx] "
              "[--pipelines passthrough,seed]\n"
              "                 [--max-workers 1|2] [--repeat N] [--batch N]\n"
              "                 [--orders arrival|arrival,deterministic]\n");
      return ch == 'h' ? 0 : 2;
    }
  }
  if (quick && !records_set)
    records = 8192;
  if (records < 1024 || wthreads < 1 || wthreads > 16 ||
      opt_heartbeat_ms < 10 || opt_splits_in_flight < 0 || max_workers < 1 ||
      max_workers > 2 || repeat < 1 || repeat > MAX_REPEAT || opt_batch < 1 ||
      opt_batch > MAX_BATCH) {
    fprintf(stderr, "bench_e2e: --records >= 1024, --worker-threads 1..16, "
            "--heartbeat-ms >= 10, --max-workers 1..2, --repeat 1..15, "
            "--batch 1..65536\n");
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  ferry_log_set_callback(ferry_log_to_stderr, NULL);
  hx_client_log_from_env(); /* FERRY_IT_CLIENT_LOG=debug */
  ferry__rpc_init();

  int nfiles = 8;
  int per_file = (int)((records + nfiles - 1) / nfiles);
  hx_dataset_t ds;
  double t0 = hx_now_ms();
  if (hx_make_dataset(&ds, "e2e", nfiles, per_file, H, W, C) != 0) {
    fprintf(stderr, "bench_e2e: cannot write the dataset in %s\n",
            hx_tmpdir());
    return 1;
  }
  uint64_t total = (uint64_t)nfiles * per_file;
  printf("bench e2e: %llu records of %dx%dx%d raw (%.1f MB) in %d files, "
         "written in %.1f s; workers --threads %d, heartbeats %d ms\n",
         (unsigned long long)total, H, W, C, (double)total * IMG / 1e6,
         nfiles, (hx_now_ms() - t0) / 1e3, wthreads, opt_heartbeat_ms);
  fflush(stdout);

  char pass_spec[1024], seed_spec[1024];
  hx_spec(&ds, NULL, opt_batch, pass_spec, sizeof(pass_spec));
  hx_spec(&ds, seed_ops, opt_batch, seed_spec, sizeof(seed_spec));

  int status = 0;
  double secs = 0, stall = -1;
  uint64_t n;
  /* Baselines first, while nothing else runs. The bare stream sends at
   * least 512 MiB so that connection set-up does not dominate. */
  uint64_t bare_bytes = total * IMG;
  if (bare_bytes < (512ull << 20))
    bare_bytes = 512ull << 20;
  n = bare_stream(bare_bytes, &secs);
  add_result("bare gRPC stream, 2 MiB messages", n / IMG, secs, -1);
  bare_transfers(bare_bytes);
  for (int k = 1; k <= max_workers; k++) {
    char name[64];
    double c0 = cpu_s();
    if (run_pass) {
      n = inproc_epoch(&ds, pass_spec, k * wthreads, &secs);
      snprintf(name, sizeof(name), "in-process passthrough, %d thr",
               k * wthreads);
      add_result(name, n, secs, -1)->wcpu = cpu_s() - c0;
    }
    if (run_seed) {
      c0 = cpu_s();
      n = inproc_epoch(&ds, seed_spec, k * wthreads, &secs);
      snprintf(name, sizeof(name), "in-process seed, %d thr", k * wthreads);
      add_result(name, n, secs, -1)->wcpu = cpu_s() - c0;
    }
  }

  char why[512];
  hx_proc_t *d = NULL, *w[2] = {NULL, NULL};
  hx_daemon_opts_t dopt = {.heartbeat_ms = opt_heartbeat_ms};
  hx_daemon_opts_t wopt = {.heartbeat_ms = opt_heartbeat_ms,
                           .threads = wthreads,
                           .buffer_bytes = 256ull << 20};
  if (hx_start_dispatcher(&d, &dopt, why, sizeof(why)) != 0) {
    fprintf(stderr, "bench_e2e: %s\n", why);
    status = 1;
    goto out;
  }
  /* The dataset's header scan is a one-off of its first job (262,144
   * records: 0.14 s); register it first so that each row times an epoch
   * of a registered dataset, as every epoch but a job's first is. */
  if (hx_register_dataset(d->addr, pass_spec, NULL, why, sizeof(why)) != 0) {
    fprintf(stderr, "bench_e2e: %s\n", why);
    status = 1;
    goto out;
  }
  for (int k = 1; k <= max_workers; k++) {
    if (hx_start_worker(&w[k - 1], d->addr, &wopt, why, sizeof(why)) != 0) {
      fprintf(stderr, "bench_e2e: %s\n", why);
      status = 1;
      goto out;
    }
    if (hx_wait_workers(d->addr, k, 10000) < k) {
      fprintf(stderr, "bench_e2e: %d workers did not register\n", k);
      hx_dump_logs();
      status = 1;
      goto out;
    }
    for (int t = 0; t < ntransports; t++) {
      for (int pl = 0; pl < 2; pl++) {
        if (!(pl == 0 ? run_pass : run_seed))
          continue;
        char name[2][64];
        const char *tr = transports[t];
        snprintf(name[0], sizeof(name[0]), "service %s, %d worker%s, %s",
                 pl == 0 ? "passthrough" : "seed", k, k > 1 ? "s" : "", tr);
        snprintf(name[1], sizeof(name[1]), "%.58s, det", name[0]);
        /* --repeat: the run of median time stands for the row; the orders
         * alternate run by run. */
        result_t runs[2][MAX_REPEAT];
        for (int i = 0; i < repeat; i++) {
          for (int od = 0; od < norders; od++) {
            double cpu = -1, first = -1;
            double w0 = workers_cpu(w, k), w1;
            n = service_epoch(d->addr, pl == 0 ? pass_spec : seed_spec, tr,
                              od ? FERRY_ORDER_DETERMINISTIC
                                 : FERRY_ORDER_ARRIVAL,
                              &secs, &stall, &cpu, &first);
            w1 = workers_cpu(w, k);
            runs[od][i] = (result_t){
                .records = n, .seconds = secs, .stall = stall, .cpu = cpu,
                .first = first,
                .wcpu = w0 >= 0 && w1 >= 0 ? w1 - w0 : -1};
            if (n != total) {
              fprintf(stderr, "bench_e2e: %s: the service delivered %llu "
                      "of %llu records\n", name[od], (unsigned long long)n,
                      (unsigned long long)total);
              status = 1;
            }
          }
        }
        for (int od = 0; od < norders; od++) {
          qsort(runs[od], (size_t)repeat, sizeof(runs[od][0]), cmp_seconds);
          result_t *r = add_result(name[od], 0, 0, -1);
          *r = runs[od][repeat / 2];
          snprintf(r->name, sizeof(r->name), "%s", name[od]);
          if (repeat > 1)
            printf("  %s: %d runs, %.0f to %.0f MB/s; the median stands\n",
                   name[od], repeat, mbps(&runs[od][repeat - 1]),
                   mbps(&runs[od][0]));
        }
      }
    }
  }

out:
  printf("\n  %-42s %12s %10s %8s %8s %10s %10s %10s\n", "configuration",
         "records/s", "MB/s", "seconds", "first s", "stalled", "CPU s/GB",
         "pipe us/rec");
  for (int i = 0; i < nresults; i++)
    print_row(&results[i]);
  printf("\nratios (MB/s):\n");
  int pass = 0, fail = 0;
  char a[64], b[64];
  ratio("grpc passthrough 1 worker / bare stream",
        "service passthrough, 1 worker, grpc",
        "bare gRPC stream, 2 MiB messages", 0.8, &pass, &fail);
  ratio("grpc passthrough 1 worker / bare gRPC, 2 processes",
        "service passthrough, 1 worker, grpc",
        "bare gRPC, 2 processes, 2 MiB", 0.8, &pass, &fail);
  ratio("grpc passthrough 2 workers / bare stream",
        "service passthrough, 2 workers, grpc",
        "bare gRPC stream, 2 MiB messages", 0.8, &pass, &fail);
  /* Service against in process as CPU per record: on a
   * 2-core machine a wall-clock ratio mostly measures the client, the
   * workers and the dispatcher sharing the cores. */
  printf("ratios (pipeline CPU per record, in process / the workers):\n");
  for (int t = 0; t < ntransports; t++) {
    for (int k = 1; k <= 2; k++) {
      char what[80];
      snprintf(b, sizeof(b), "in-process seed, %d thr", k * wthreads);
      snprintf(a, sizeof(a), "service seed, %d worker%s, %s", k,
               k > 1 ? "s" : "", transports[t]);
      snprintf(what, sizeof(what), "%s seed %d worker%s, CPU per record",
               transports[t], k, k > 1 ? "s" : "");
      cpu_ratio(what, a, b, 0.9, &pass, &fail);
    }
  }
  for (int t = 0; t < ntransports; t++) {
    if (strcmp(transports[t], "ucx") != 0)
      continue;
    ratio("ucx passthrough 1 worker / bare UCX, 2 processes",
          "service passthrough, 1 worker, ucx",
          "bare UCX, 2 processes, 2 MiB", 0.8, &pass, &fail);
    const result_t *u = find("service passthrough, 1 worker, ucx");
    double gbps = u != NULL ? mbps(u) / 1e3 : 0;
    bool ok = gbps >= 5.0;
    printf("  %-52s %6.2f  (target >= 5.0 GB/s: %s)\n",
           "ucx passthrough 1 worker, GB/s", gbps, ok ? "PASS" : "below");
    if (ok)
      pass++;
    else
      fail++;
    double cg = u != NULL ? cpu_per_gb(u) : -1;
    ok = cg >= 0 && cg <= 0.15;
    printf("  %-52s %6.3f  (target <= 0.15 s/GB: %s)\n",
           "ucx passthrough 1 worker, client CPU s/GB", cg,
           ok ? "PASS" : "above");
    if (ok)
      pass++;
    else
      fail++;
  }
  /* What the deterministic order costs, per row. */
  for (int i = 0; norders > 1 && i < nresults; i++) {
    const char *det = strstr(results[i].name, ", det");
    if (det == NULL || det[5] != '\0')
      continue;
    char arr[64], what[128];
    snprintf(arr, sizeof(arr), "%.*s", (int)(det - results[i].name),
             results[i].name);
    snprintf(what, sizeof(what), "deterministic / arrival: %s", arr + 8);
    ratio(what, results[i].name, arr, 0.9, &pass, &fail);
  }
  printf("targets: %d PASS, %d below\n", pass, fail);
  if (w[1])
    hx_stop(w[1], SIGTERM, 3000, NULL);
  if (w[0])
    hx_stop(w[0], SIGTERM, 3000, NULL);
  if (d)
    hx_stop(d, SIGTERM, 3000, NULL);
  hx_reap_all();
  hx_dataset_free(&ds);
  ferry__rpc_shutdown();
  if (status == 0)
    printf("bench e2e: ok\n");
  return status;
}
