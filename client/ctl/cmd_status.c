/* ferryctl status: the cluster as the dispatcher sees it.
 *
 * One Dispatcher/GetStatus call, printed as text (dispatcher, workers,
 * jobs with a progress bar, skipped records per file, clients) or as one
 * JSON document. --watch redraws the text every second until interrupted. */
#include <inttypes.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "ctl.h"
#include "ferry/alloc.h"
#include "ferry/rpc.h"
#include "ferry/v1/dispatcher.pb-c.h"

/* How long the dispatcher has to answer: an unreachable one is an exit
 * status 2 after at most this. */
#define STATUS_DEADLINE_MS 5000
#define BAR_WIDTH 30

typedef struct status_opts_s {
  char *dispatcher;
  bool json;
  bool watch;
  bool help;
  char *tls_ca, *tls_cert, *tls_key, *token_file; /* issue 8 */
} status_opts_t;

static const ferry_option_t status_table[] = {
    {"dispatcher", FERRY_OPT_STRING, offsetof(status_opts_t, dispatcher),
     "127.0.0.1:5050", 0, 0, NULL, "the dispatcher's HOST:PORT"},
    {"json", FERRY_OPT_BOOL, offsetof(status_opts_t, json), "false", 0, 0,
     NULL, "print one JSON document instead of text"},
    {"watch", FERRY_OPT_BOOL, offsetof(status_opts_t, watch), "false", 0, 0,
     NULL, "redraw every second until interrupted"},
    {"tls-ca", FERRY_OPT_STRING, offsetof(status_opts_t, tls_ca), NULL, 0, 0,
     NULL, "PEM CA bundle: talk TLS to the dispatcher and verify it"},
    {"tls-cert", FERRY_OPT_STRING, offsetof(status_opts_t, tls_cert), NULL, 0,
     0, NULL, "PEM client certificate (mutual TLS)"},
    {"tls-key", FERRY_OPT_STRING, offsetof(status_opts_t, tls_key), NULL, 0,
     0, NULL, "private key of --tls-cert"},
    {"token-file", FERRY_OPT_STRING, offsetof(status_opts_t, token_file), NULL,
     0, 0, NULL, "file holding a bearer token (status, client or worker)"},
    {"help", FERRY_OPT_BOOL, offsetof(status_opts_t, help), "false", 0, 0,
     NULL, "print this help"},
};
#define STATUS_N (sizeof(status_table) / sizeof(status_table[0]))

static const char status_usage[] =
    "usage: ferryctl status --dispatcher HOST:PORT [--json] [--watch]\n"
    "\n"
    "Asks the dispatcher (Dispatcher/GetStatus) for the cluster's state:\n"
    "workers with their state and load, jobs with their mode, epoch,\n"
    "records delivered of the epoch's total, skipped records per file,\n"
    "errors, and each job's clients. Exits 2 when the dispatcher does not\n"
    "answer within 5 s.\n";

static void *pb_alloc(void *data, size_t size) {
  (void)data;
  return ferry__malloc(size);
}

static void pb_free(void *data, void *p) {
  (void)data;
  ferry__free(p);
}

static ProtobufCAllocator pb_allocator = {pb_alloc, pb_free, NULL};

static const char *mode_name(Ferry__V1__JobMode m) {
  switch (m) {
  case FERRY__V1__JOB_MODE__JOB_MODE_DISTRIBUTED_EPOCH:
    return "distributed_epoch";
  case FERRY__V1__JOB_MODE__JOB_MODE_PARALLEL_EPOCHS:
    return "parallel_epochs";
  default:
    return "unknown";
  }
}

static const char *state_name(Ferry__V1__JobState s) {
  switch (s) {
  case FERRY__V1__JOB_STATE__JOB_STATE_RUNNING:
    return "running";
  case FERRY__V1__JOB_STATE__JOB_STATE_FINISHED:
    return "finished";
  case FERRY__V1__JOB_STATE__JOB_STATE_FAILED:
    return "failed";
  default:
    return "unknown";
  }
}

/* Asks the dispatcher once. Returns the unpacked answer (free it with
 * ferry__v1__get_status_response__free_unpacked) or NULL with `err` set. */
static Ferry__V1__GetStatusResponse *fetch_status(ferry_rpc_channel_t *ch,
                                                  ferry_error_t *err) {
  Ferry__V1__GetStatusRequest req = FERRY__V1__GET_STATUS_REQUEST__INIT;
  uint8_t buf[16];
  size_t len = ferry__v1__get_status_request__pack(&req, buf);
  uint8_t *reply = NULL;
  size_t reply_len = 0;
  int rc = ferry_rpc_unary(ch, "/ferry.v1.Dispatcher/GetStatus", buf, len,
                           STATUS_DEADLINE_MS, 0, &reply, &reply_len, err);
  if (rc != 0)
    return NULL;
  Ferry__V1__GetStatusResponse *st = ferry__v1__get_status_response__unpack(
      &pb_allocator, reply_len, reply);
  ferry_free(reply);
  if (st == NULL)
    ferry__seterr(err, FERRY_EGRPC_DATA_LOSS,
                  "GetStatus: the answer (%zu bytes) is not a valid "
                  "GetStatusResponse", reply_len);
  return st;
}

static void print_duration(FILE *out, int64_t ms) {
  int64_t s = ms / 1000;
  if (s >= 3600)
    fprintf(out, "%" PRId64 "h%02" PRId64 "m%02" PRId64 "s", s / 3600,
            s / 60 % 60, s % 60);
  else if (s >= 60)
    fprintf(out, "%" PRId64 "m%02" PRId64 "s", s / 60, s % 60);
  else
    fprintf(out, "%.1fs", (double)ms / 1000.0);
}

static void print_bar(FILE *out, uint64_t done, uint64_t total) {
  double f = total ? (double)done / (double)total : 0.0;
  if (f > 1.0)
    f = 1.0;
  int fill = (int)(f * BAR_WIDTH + 0.5);
  putc('[', out);
  for (int i = 0; i < BAR_WIDTH; i++)
    putc(i < fill ? '#' : '.', out);
  fprintf(out, "] %5.1f%%", f * 100.0);
}

static void print_text(FILE *out, const Ferry__V1__GetStatusResponse *st,
                       const char *target) {
  char b1[32], b2[32];
  fprintf(out, "dispatcher %s  version %s  up ", target,
          st->version ? st->version : "?");
  print_duration(out, st->uptime_ms);
  fprintf(out, "  datasets %" PRIu32 "\n", st->datasets);

  fprintf(out, "\nworkers (%zu)\n", st->n_workers);
  if (st->n_workers)
    fprintf(out, "  %-6s %-22s %-9s %5s %7s  %-21s %s\n", "id", "address",
            "state", "tasks", "threads", "buffer used", "last beat");
  for (size_t i = 0; i < st->n_workers; i++) {
    const Ferry__V1__WorkerStatus *w = st->workers[i];
    uint64_t used = w->buffer_bytes > w->buffer_free_bytes
                        ? w->buffer_bytes - w->buffer_free_bytes
                        : 0;
    char buf[64];
    snprintf(buf, sizeof(buf), "%s / %s",
             ferryctl_human_bytes(used, b1, sizeof(b1)),
             ferryctl_human_bytes(w->buffer_bytes, b2, sizeof(b2)));
    fprintf(out, "  %-6" PRIu64 " %-22s %-9s %5" PRIu32 " %7" PRIu32
                 "  %-21s %" PRId64 " ms ago\n",
            w->worker_id, w->address ? w->address : "",
            w->state ? w->state : "",
            w->tasks, w->threads, buf, w->last_heartbeat_ms_ago);
  }

  fprintf(out, "\njobs (%zu)\n", st->n_jobs);
  for (size_t i = 0; i < st->n_jobs; i++) {
    const Ferry__V1__JobStatus *j = st->jobs[i];
    fprintf(out, "  job %" PRIu64 " %s%s%s  %s  %s  epoch %" PRIu32 "/",
            j->job_id, j->name && *j->name ? "\"" : "",
            j->name && *j->name ? j->name : "(anonymous)",
            j->name && *j->name ? "\"" : "", mode_name(j->mode),
            state_name(j->state), j->epoch + (j->num_epochs != 0 ? 1 : 0));
    if (j->num_epochs < 0)
      fputs("inf\n", out);
    else
      fprintf(out, "%" PRId64 "\n", j->num_epochs);
    fputs("    ", out);
    if (j->state == FERRY__V1__JOB_STATE__JOB_STATE_FINISHED) {
      /* The epoch counter has moved past the last epoch: show the job. */
      print_bar(out, 1, 1);
      fprintf(out, "  every epoch delivered, %" PRIu64 " records in all\n",
              j->delivered_all);
    } else {
      print_bar(out, j->delivered, j->total);
      fprintf(out, "  %" PRIu64 " of %" PRIu64 " records this epoch, %" PRIu64
                   " in all\n",
              j->delivered, j->total, j->delivered_all);
    }
    fprintf(out, "    dataset %s  skipped %" PRIu64 "\n",
            j->dataset_id ? j->dataset_id : "", j->skipped);
    for (size_t k = 0; k < j->n_skipped_by_file; k++)
      fprintf(out, "      %" PRIu64 " skipped in %s\n",
              j->skipped_by_file[k]->skipped,
              j->skipped_by_file[k]->file ? j->skipped_by_file[k]->file : "");
    if (j->error && *j->error)
      fprintf(out, "    error: %s\n", j->error);
    for (size_t k = 0; k < j->n_clients; k++) {
      const Ferry__V1__ClientStatus *c = j->clients[k];
      double stall = c->stats ? c->stats->stall_fraction : 0.0;
      double bps = c->stats ? c->stats->batches_per_second : 0.0;
      uint64_t nb = c->stats ? c->stats->batches : 0;
      fprintf(out, "    client %" PRIu64 ": %" PRIu32 " splits in flight, %"
                   PRIu64 " batches, %.1f batches/s, stalled %.1f%%, last "
                   "beat %" PRId64 " ms ago\n",
              c->client_id, c->splits_in_flight, nb, bps, stall * 100.0,
              c->last_heartbeat_ms_ago);
    }
  }
}

static void json_str(FILE *out, const char *s) {
  if (s == NULL)
    s = "";
  ferryctl_json_string(out, s, strlen(s));
}

/* JSON has no NaN or infinity: print those as null. */
static void json_double(FILE *out, double v) {
  if (v != v || v - v != 0.0)
    fputs("null", out);
  else
    fprintf(out, "%.6g", v);
}

static void print_json(FILE *out, const Ferry__V1__GetStatusResponse *st,
                       const char *target) {
  fputs("{\"dispatcher\": {\"address\": ", out);
  json_str(out, target);
  fputs(", \"version\": ", out);
  json_str(out, st->version);
  fprintf(out, ", \"uptime_ms\": %" PRId64 ", \"datasets\": %" PRIu32 "},\n",
          st->uptime_ms, st->datasets);
  fputs(" \"workers\": [", out);
  for (size_t i = 0; i < st->n_workers; i++) {
    const Ferry__V1__WorkerStatus *w = st->workers[i];
    fprintf(out, "%s\n  {\"id\": %" PRIu64 ", \"address\": ", i ? "," : "",
            w->worker_id);
    json_str(out, w->address);
    fputs(", \"state\": ", out);
    json_str(out, w->state);
    fprintf(out, ", \"tasks\": %" PRIu32 ", \"threads\": %" PRIu32
                 ", \"buffer_bytes\": %" PRIu64 ", \"buffer_free_bytes\": %"
                 PRIu64 ", \"last_heartbeat_ms_ago\": %" PRId64 "}",
            w->tasks, w->threads, w->buffer_bytes, w->buffer_free_bytes,
            w->last_heartbeat_ms_ago);
  }
  fputs("],\n \"jobs\": [", out);
  for (size_t i = 0; i < st->n_jobs; i++) {
    const Ferry__V1__JobStatus *j = st->jobs[i];
    fprintf(out, "%s\n  {\"id\": %" PRIu64 ", \"name\": ", i ? "," : "",
            j->job_id);
    json_str(out, j->name);
    fputs(", \"dataset_id\": ", out);
    json_str(out, j->dataset_id);
    fprintf(out, ", \"mode\": \"%s\", \"state\": \"%s\", \"epoch\": %" PRIu32
                 ", \"num_epochs\": %" PRId64 ", \"delivered\": %" PRIu64
                 ", \"total\": %" PRIu64 ", \"delivered_all\": %" PRIu64
                 ", \"skipped\": %" PRIu64 ",\n   \"skipped_by_file\": [",
            mode_name(j->mode), state_name(j->state), j->epoch,
            j->num_epochs, j->delivered, j->total, j->delivered_all,
            j->skipped);
    for (size_t k = 0; k < j->n_skipped_by_file; k++) {
      fputs(k ? ", {\"file\": " : "{\"file\": ", out);
      json_str(out, j->skipped_by_file[k]->file);
      fprintf(out, ", \"skipped\": %" PRIu64 "}",
              j->skipped_by_file[k]->skipped);
    }
    fputs("],\n   \"error\": ", out);
    json_str(out, j->error);
    fputs(",\n   \"clients\": [", out);
    for (size_t k = 0; k < j->n_clients; k++) {
      const Ferry__V1__ClientStatus *c = j->clients[k];
      fprintf(out, "%s{\"id\": %" PRIu64 ", \"splits_in_flight\": %" PRIu32
                   ", \"last_heartbeat_ms_ago\": %" PRId64
                   ", \"batches\": %" PRIu64 ", \"stall_fraction\": ",
              k ? ", " : "", c->client_id, c->splits_in_flight,
              c->last_heartbeat_ms_ago, c->stats ? c->stats->batches : 0);
      json_double(out, c->stats ? c->stats->stall_fraction : 0.0);
      fputs(", \"batches_per_second\": ", out);
      json_double(out, c->stats ? c->stats->batches_per_second : 0.0);
      putc('}', out);
    }
    fputs("]}", out);
  }
  fputs("]}\n", out);
}

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig) {
  (void)sig;
  interrupted = 1;
}

/* Sleeps about a second, returning early on SIGINT. */
static void nap(void) {
  struct timespec ts = {1, 0};
  nanosleep(&ts, NULL);
}

/* ferryctl status: see status_usage. */
int ferryctl_status(int argc, char **argv) {
  status_opts_t o;
  memset(&o, 0, sizeof(o));
  int npos = 0;
  int rc = ferryctl_parse_options("status", status_usage, NULL, status_table,
                                  STATUS_N, &o, offsetof(status_opts_t, help),
                                  argc - 1, argv + 1, &npos);
  if (rc != FERRYCTL_CONTINUE) {
    ferry_options_free(status_table, STATUS_N, &o);
    return rc;
  }
  if (npos != 0) {
    fprintf(stderr, "ferryctl status: unexpected argument '%s'\n", argv[1]);
    ferry_options_free(status_table, STATUS_N, &o);
    return FERRYCTL_EXIT_USAGE;
  }
  ferry_error_t err = {0};
  ferry_rpc_channel_t *ch = NULL;
  ferry_rpc_tls_t tls = {o.tls_ca, o.tls_cert, o.tls_key, false};
  ferry_rpc_options_t ro = {0};
  char *token = NULL;
  ro.tls = o.tls_ca != NULL || o.tls_cert != NULL ? &tls : NULL;
  if (o.token_file != NULL &&
      ferry_rpc_read_token(o.token_file, &token, &err) != 0) {
    fprintf(stderr, "ferryctl status: --token-file: %s\n", err.msg);
    ferry_options_free(status_table, STATUS_N, &o);
    return FERRYCTL_EXIT_USAGE;
  }
  ro.bearer_token = token;
  ferry_rpc_init();
  rc = ferry_rpc_channel_new(o.dispatcher, &ro, &ch, &err);
  ferry_free(token); /* the channel keeps a copy */
  if (rc != 0) {
    fprintf(stderr, "ferryctl status: %s\n", err.msg);
    ferry_rpc_shutdown();
    ferry_options_free(status_table, STATUS_N, &o);
    return FERRYCTL_EXIT_USAGE;
  }
  if (o.watch) {
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_sigint;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
  }
  int status = FERRYCTL_EXIT_OK;
  do {
    Ferry__V1__GetStatusResponse *st = fetch_status(ch, &err);
    if (st == NULL) {
      fprintf(stderr,
              "ferryctl status: the dispatcher at %s did not answer: %s\n",
              o.dispatcher, err.msg);
      status = FERRYCTL_EXIT_USAGE;
      break;
    }
    if (o.watch && !o.json && ferryctl_isatty())
      fputs("\033[H\033[2J", stdout); /* home and clear the screen */
    if (o.json)
      print_json(stdout, st, o.dispatcher);
    else
      print_text(stdout, st, o.dispatcher);
    fflush(stdout);
    ferry__v1__get_status_response__free_unpacked(st, &pb_allocator);
    if (o.watch && !interrupted)
      nap();
  } while (o.watch && !interrupted);
  ferry_rpc_channel_free(ch);
  ferry_rpc_shutdown();
  ferry_options_free(status_table, STATUS_N, &o);
  return status;
}
