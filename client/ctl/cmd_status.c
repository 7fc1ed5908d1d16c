/* ferryctl's cluster commands: status, workers, jobs, watch,
 * drain, job cancel.
 *
 * Every command asks the dispatcher (GetStatus, DrainWorker, CancelJob),
 * turns the answer into one view (view_t below: the numbers people read,
 * e.g. a finished job's epoch and delivered count, are decided there
 * once) and renders that view as text or as JSON, one document per line,
 * each with "schema": 1. Exit statuses: ctl.h (0 ok, 1 failure, 2 usage,
 * 3 dispatcher unreachable, 4 timed out). */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "alloc.h"
#include "ctl.h"
#include "ferry/v1/dispatcher.pb-c.h"
#include "job_names.h"
#include "pb_alloc.h"
#include "rpc.h"
#include "rpc_methods.h"

/* How long the dispatcher has to answer one call. */
#define CALL_DEADLINE_MS 5000
#define BAR_WIDTH 30
#define JSON_SCHEMA 1

/* ---- Options ------------------------------------------------------------ */

typedef struct cl_opts_s {
  char *dispatcher;
  bool json;
  bool watch;
  bool help;
  double interval; /* watch: seconds between refreshes */
  int64_t count;   /* watch: refreshes, 0 = until interrupted */
  double timeout;  /* drain: seconds */
  char *tls_ca, *tls_cert, *tls_key, *token_file;
} cl_opts_t;

#define OPT(name, type, field, def, lo, hi, help)                             \
  { name, type, offsetof(cl_opts_t, field), def, lo, hi, NULL, help }
#define COMMON_OPTS                                                           \
  OPT("dispatcher", FERRY_OPT_STRING, dispatcher, "127.0.0.1:5050", 0, 0,     \
      "the dispatcher's HOST:PORT"),                                          \
  OPT("json", FERRY_OPT_BOOL, json, "false", 0, 0,                            \
      "print JSON, one document per line, each with \"schema\": 1"),          \
  OPT("tls-ca", FERRY_OPT_STRING, tls_ca, NULL, 0, 0,                         \
      "PEM CA bundle: talk TLS to the dispatcher and verify it"),             \
  OPT("tls-cert", FERRY_OPT_STRING, tls_cert, NULL, 0, 0,                     \
      "PEM client certificate (mutual TLS)"),                                 \
  OPT("tls-key", FERRY_OPT_STRING, tls_key, NULL, 0, 0,                       \
      "private key of --tls-cert"),                                           \
  OPT("token-file", FERRY_OPT_STRING, token_file, NULL, 0, 0,                 \
      "file holding a bearer token (drain and job cancel need the admin "     \
      "token)"),                                                              \
  OPT("help", FERRY_OPT_BOOL, help, "false", 0, 0, "print this help")
#define WATCH_OPTS                                                            \
  OPT("interval", FERRY_OPT_DOUBLE, interval, "1", 0.05, 3600,                \
      "seconds between refreshes"),                                           \
  OPT("count", FERRY_OPT_INT, count, "0", 0, 1000000000,                      \
      "stop after this many refreshes (0: until interrupted)")

static const ferry_option_t status_table[] = {
    COMMON_OPTS,
    OPT("watch", FERRY_OPT_BOOL, watch, "false", 0, 0,
        "refresh until interrupted (as 'ferryctl watch')"),
    WATCH_OPTS,
};
static const ferry_option_t list_table[] = {COMMON_OPTS};
static const ferry_option_t watch_table[] = {COMMON_OPTS, WATCH_OPTS};
static const ferry_option_t drain_table[] = {
    COMMON_OPTS,
    OPT("timeout", FERRY_OPT_DOUBLE, timeout, "300", 0, 1e6,
        "give up (exit 4) after this many seconds; 0: ask and return at "
        "once"),
};
#define N(t) (sizeof(t) / sizeof((t)[0]))

static const char footer[] =
    "\nExit status: 0 ok, 1 failure (the dispatcher refused the call), 2 "
    "usage,\n3 dispatcher unreachable, 4 timed out (drain).\n";

static const char status_usage[] =
    "usage: ferryctl status [--dispatcher HOST:PORT] [--json] [--watch]\n"
    "\n"
    "The cluster as the dispatcher sees it (Dispatcher/GetStatus): workers\n"
    "with their state and load; jobs with mode, epoch, records delivered,\n"
    "stall fraction, batches/s and workers wanted; skipped records per file;\n"
    "errors; each job's clients.\n";
static const char workers_usage[] =
    "usage: ferryctl workers [--dispatcher HOST:PORT] [--json]\n"
    "\n"
    "One line per worker: id, address, state (alive, draining, drained,\n"
    "left: exited after draining, lost: silent without having drained,\n"
    "unknown: not heard from since the dispatcher started), leases,\n"
    "threads, buffer, last heartbeat.\n";
static const char jobs_usage[] =
    "usage: ferryctl jobs [--dispatcher HOST:PORT] [--json]\n"
    "\n"
    "One line per job: id, name, mode, state, epoch, progress of the epoch,\n"
    "clients, stall fraction, batches/s and workers wanted.\n";
static const char watch_usage[] =
    "usage: ferryctl watch [--dispatcher HOST:PORT] [--json] [--interval S]\n"
    "\n"
    "'ferryctl status' refreshed every --interval seconds until interrupted\n"
    "(or --count refreshes). With --json: one status document per refresh,\n"
    "one per line.\n";
static const char drain_usage[] =
    "usage: ferryctl drain WORKER_ID_OR_ADDR [--timeout S] [--json]\n"
    "\n"
    "Drains a worker (Dispatcher/DrainWorker, the admin role): it gets no\n"
    "new lease, and every split leased to it moves at once to other workers\n"
    "from what its client acknowledged, so every record is still delivered\n"
    "exactly once (in parallel_epochs jobs its copy of the epoch ends, as\n"
    "if it were lost). Its running tasks are cancelled. Returns once\n"
    "nothing runs on it; exit 4 after --timeout seconds. The worker stays\n"
    "drained, across dispatcher restarts, until it restarts itself.\n"
    "WORKER_ID_OR_ADDR: a worker id, or the HOST:PORT it advertises.\n";
static const char cancel_usage[] =
    "usage: ferryctl job cancel JOB_ID [--dispatcher HOST:PORT] [--json]\n"
    "\n"
    "Cancels a running job (Dispatcher/CancelJob, the admin role): it ends\n"
    "as cancelled, its clients' next ferry_next fails with \"job JOB_ID\n"
    "cancelled by the operator\" within a heartbeat, its workers stop its\n"
    "tasks. Cancelling a cancelled job succeeds; a finished or failed one\n"
    "is refused (exit 1).\n";

/* ---- The channel and the calls ------------------------------------------ */

typedef struct session_s {
  const char *cmd;
  cl_opts_t o;
  ferry_rpc_channel_t *ch;
  const char *method; /* of the last call, for call_failed */
} session_t;

/* Parses the options and opens the channel. Returns FERRYCTL_CONTINUE, or
 * the exit status (help, usage). `npos` gets the positional count. */
static int session_open(session_t *s, const char *cmd, const char *usage,
                        const ferry_option_t *t, size_t n, int argc,
                        char **argv, int *npos) {
  ferry_error_t err = {0};
  char *token = NULL;
  memset(s, 0, sizeof(*s));
  s->cmd = cmd;
  int rc = ferryctl_parse_options(cmd, usage, footer, t, n, &s->o,
                                  offsetof(cl_opts_t, help), argc, argv,
                                  npos);
  if (rc != FERRYCTL_CONTINUE)
    return rc;
  ferry_rpc_tls_t tls = {s->o.tls_ca, s->o.tls_cert, s->o.tls_key, false};
  ferry_rpc_options_t ro = {0};
  ro.tls = s->o.tls_ca != NULL || s->o.tls_cert != NULL ? &tls : NULL;
  if (s->o.token_file != NULL &&
      ferry__rpc_read_token(s->o.token_file, &token, &err) != 0) {
    fprintf(stderr, "ferryctl %s: --token-file: %s\n", cmd, err.msg);
    return FERRYCTL_EXIT_USAGE;
  }
  ro.bearer_token = token;
  if ((rc = ferryctl_check_dispatcher(cmd, s->o.dispatcher)) !=
      FERRYCTL_CONTINUE) {
    ferry_free(token);
    return rc;
  }
  ferry__rpc_init();
  rc = ferry__rpc_channel_new(s->o.dispatcher, &ro, &s->ch, &err);
  ferry_free(token); /* the channel keeps a copy */
  if (rc != 0) {
    fprintf(stderr, "ferryctl %s: --dispatcher %s: %s\n", cmd,
            s->o.dispatcher, err.msg);
    ferry__rpc_shutdown();
    s->ch = NULL;
    return FERRYCTL_EXIT_USAGE;
  }
  return FERRYCTL_CONTINUE;
}

static void session_close(session_t *s, const ferry_option_t *t, size_t n) {
  if (s->ch != NULL) {
    ferry__rpc_channel_free(s->ch);
    ferry__rpc_shutdown();
  }
  ferry__options_free(t, n, &s->o);
}

/* True for the codes that mean nobody answered (exit 3), as opposed to a
 * dispatcher that answered with an error (exit 1). */
static bool unreachable(int rc) {
  return rc == FERRY_EGRPC_UNAVAILABLE || rc == FERRY_EGRPC_DEADLINE_EXCEEDED;
}

/* One unary call: packs `req`, unpacks the answer as `desc` into *out
 * (free with protobuf_c_message_free_unpacked and ferry__pb_allocator). Returns
 * 0 or the FERRY_EGRPC_* code with `err` set. */
static int call(session_t *s, const char *method, const ProtobufCMessage *req,
                const ProtobufCMessageDescriptor *desc, ProtobufCMessage **out,
                ferry_error_t *err) {
  size_t len = protobuf_c_message_get_packed_size(req);
  uint8_t *buf = ferry__malloc(len ? len : 1);
  uint8_t *reply = NULL;
  size_t reply_len = 0;
  *out = NULL;
  s->method = method;
  if (buf == NULL)
    return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
  protobuf_c_message_pack(req, buf);
  int rc = ferry__rpc_unary(s->ch, method, buf, len, CALL_DEADLINE_MS, 0,
                            &reply, &reply_len, err);
  ferry__free(buf);
  if (rc != 0)
    return rc;
  *out = protobuf_c_message_unpack(desc, &ferry__pb_allocator, reply_len,
                                   reply);
  ferry_free(reply);
  if (*out == NULL)
    return ferry__seterr(err, FERRY_EGRPC_DATA_LOSS,
                         "%s: the answer (%zu bytes) is not a valid %s",
                         method, reply_len, desc->name);
  return 0;
}

/* Prints why a call failed and returns the exit status for it. */
static int call_failed(const session_t *s, int rc, const ferry_error_t *err) {
  return ferryctl_call_failed(s->cmd, s->o.dispatcher,
                              s->o.tls_ca != NULL || s->o.tls_cert != NULL,
                              s->method, rc, err);
}

static int fetch_status(session_t *s, Ferry__V1__GetStatusResponse **st,
                        ferry_error_t *err) {
  Ferry__V1__GetStatusRequest req = FERRY__V1__GET_STATUS_REQUEST__INIT;
  return call(s, FERRY_METHOD_GET_STATUS, &req.base,
              &ferry__v1__get_status_response__descriptor,
              (ProtobufCMessage **)st, err);
}

/* ---- The view: what both renderings show -------------------------------- */

typedef struct vjob_s {
  const Ferry__V1__JobStatus *pb; /* ids, names, files, clients */
  const char *mode, *state;
  /* The epoch shown, from 1: the one being delivered, or the last one
   * once the job finished. */
  uint32_t epoch;
  int64_t num_epochs; /* -1: infinite */
  /* Records of that epoch delivered, of `total`; a finished job's last
   * epoch is whole (the dispatcher drops its table). */
  uint64_t delivered, total, delivered_all;
  double fraction;
} vjob_t;

typedef struct view_s {
  const Ferry__V1__GetStatusResponse *pb;
  const char *dispatcher;
  vjob_t *jobs;
} view_t;

static int view_build(view_t *v, const Ferry__V1__GetStatusResponse *st,
                      const char *dispatcher) {
  v->pb = st;
  v->dispatcher = dispatcher;
  v->jobs = ferry__calloc(st->n_jobs + 1, sizeof(vjob_t));
  if (v->jobs == NULL)
    return FERRY_ENOMEM;
  for (size_t i = 0; i < st->n_jobs; i++) {
    const Ferry__V1__JobStatus *j = st->jobs[i];
    vjob_t *vj = &v->jobs[i];
    bool finished = j->state == FERRY__V1__JOB_STATE__JOB_STATE_FINISHED;
    vj->pb = j;
    vj->mode = ferry__job_mode_name(j->mode);
    vj->state = ferry__job_state_name(j->state);
    vj->epoch = j->epoch + 1;
    vj->num_epochs = j->num_epochs;
    vj->total = j->total;
    vj->delivered = finished ? j->total : j->delivered;
    vj->delivered_all = j->delivered_all;
    vj->fraction = finished ? 1.0
                   : vj->total ? (double)vj->delivered / (double)vj->total
                               : 0.0;
    if (vj->fraction > 1.0)
      vj->fraction = 1.0;
  }
  return 0;
}

static void view_free(view_t *v) { ferry__free(v->jobs); }

static uint64_t used_bytes(const Ferry__V1__WorkerStatus *w) {
  return w->buffer_bytes > w->buffer_free_bytes
             ? w->buffer_bytes - w->buffer_free_bytes
             : 0;
}

/* ---- Text --------------------------------------------------------------- */

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

static void print_bar(FILE *out, double f) {
  int fill = (int)(f * BAR_WIDTH + 0.5);
  putc('[', out);
  for (int i = 0; i < BAR_WIDTH; i++)
    putc(i < fill ? '#' : '.', out);
  fprintf(out, "] %5.1f%%", f * 100.0);
}

static void text_epoch(FILE *out, const vjob_t *j) {
  fprintf(out, "%" PRIu32 "/", j->epoch);
  if (j->num_epochs < 0)
    fputs("inf", out);
  else
    fprintf(out, "%" PRId64, j->num_epochs);
}

/* A worker's prefix cache: its counters, then each dataset's choice. */
static void text_cache(FILE *out, const Ferry__V1__CacheReport *c) {
  char b1[32], b2[32], b3[32], b4[32];
  fprintf(out, "         cache %s: %s of %s in %" PRIu64 " entries; %" PRIu64
               " hits, %" PRIu64 " misses; read %s, written %s",
          c->dir ? c->dir : "",
          ferryctl_human_bytes(c->held_bytes, b1, sizeof(b1)),
          ferryctl_human_bytes(c->limit_bytes, b2, sizeof(b2)), c->entries,
          c->hits, c->misses,
          ferryctl_human_bytes(c->read_bytes, b3, sizeof(b3)),
          ferryctl_human_bytes(c->written_bytes, b4, sizeof(b4)));
  if (c->corrupt > 0)
    fprintf(out, "; %" PRIu64 " damaged entries recomputed", c->corrupt);
  if (c->full > 0)
    fprintf(out, "; %" PRIu64 " entries not written (full)", c->full);
  fputc('\n', out);
  for (size_t k = 0; k < c->n_policies; k++) {
    const Ferry__V1__CachePolicy *p = c->policies[k];
    fprintf(out, "           dataset %s: %s: %s\n",
            p->dataset_id ? p->dataset_id : "", p->choice ? p->choice : "",
            p->reason ? p->reason : "");
  }
}

static void text_workers(FILE *out, const view_t *v) {
  const Ferry__V1__GetStatusResponse *st = v->pb;
  char b1[32], b2[32], buf[64];
  fprintf(out, "  %-6s %-22s %-9s %5s %7s  %-21s %s\n", "id", "address",
          "state", "tasks", "threads", "buffer used", "last beat");
  for (size_t i = 0; i < st->n_workers; i++) {
    const Ferry__V1__WorkerStatus *w = st->workers[i];
    snprintf(buf, sizeof(buf), "%s / %s",
             ferryctl_human_bytes(used_bytes(w), b1, sizeof(b1)),
             ferryctl_human_bytes(w->buffer_bytes, b2, sizeof(b2)));
    fprintf(out, "  %-6" PRIu64 " %-22s %-9s %5" PRIu32 " %7" PRIu32
                 "  %-21s %" PRId64 " ms ago\n",
            w->worker_id, w->address ? w->address : "",
            w->state ? w->state : "", w->tasks, w->threads, buf,
            w->last_heartbeat_ms_ago);
    /* Alive to the dispatcher is not reachable by trainers: say so. */
    if (w->unreachable_clients > 0) {
      fprintf(out, "         unreachable by %" PRIu32 " client%s: %s\n",
              w->unreachable_clients, w->unreachable_clients == 1 ? "" : "s",
              w->unreachable_reason ? w->unreachable_reason : "");
    }
    if (w->cache != NULL)
      text_cache(out, w->cache);
  }
}

/* The policy each worker reports for `dataset` (text). */
static void text_job_cache(FILE *out, const Ferry__V1__GetStatusResponse *st,
                           const char *dataset) {
  for (size_t i = 0; i < st->n_workers; i++) {
    const Ferry__V1__CacheReport *c = st->workers[i]->cache;
    for (size_t k = 0; c != NULL && k < c->n_policies; k++) {
      const Ferry__V1__CachePolicy *p = c->policies[k];
      if (p->dataset_id == NULL || dataset == NULL ||
          strcmp(p->dataset_id, dataset) != 0)
        continue;
      fprintf(out, "    cache on worker %" PRIu64 ": %s (%" PRIu64
                   " hits, %" PRIu64 " misses): %s\n",
              st->workers[i]->worker_id, p->choice ? p->choice : "",
              p->hits, p->misses, p->reason ? p->reason : "");
    }
  }
}

/* Whether the job's stall and rate figures are current: a dispatcher that
 * says no client is live sends those of the last report, figures_ms_ago
 * old (-1: none ever); one that predates the field sends 0 for both. */
static bool figures_current(const Ferry__V1__JobStatus *j) {
  return j->live_clients > 0 || j->figures_ms_ago == 0;
}

static const char *job_name(const Ferry__V1__JobStatus *j) {
  return j->name && *j->name ? j->name : "(anonymous)";
}

static void text_jobs_table(FILE *out, const view_t *v) {
  fprintf(out, "  %-6s %-16s %-17s %-9s %-8s %7s %-23s %7s %6s %9s %6s\n",
          "id", "name", "mode", "state", "epoch", "done", "records", "clients",
          "stall", "batches/s", "wanted");
  for (size_t i = 0; i < v->pb->n_jobs; i++) {
    const vjob_t *j = &v->jobs[i];
    char ep[32], rec[48];
    if (j->num_epochs < 0)
      snprintf(ep, sizeof(ep), "%" PRIu32 "/inf", j->epoch);
    else
      snprintf(ep, sizeof(ep), "%" PRIu32 "/%" PRId64, j->epoch,
               j->num_epochs);
    snprintf(rec, sizeof(rec), "%" PRIu64 "/%" PRIu64, j->delivered,
             j->total);
    /* With no live client: the last report's stall, and no rate or
     * worker count as if they were current. */
    char stall[16], bps[24], wanted[16];
    bool cur = figures_current(j->pb);
    if (cur || j->pb->figures_ms_ago > 0)
      snprintf(stall, sizeof(stall), "%5.1f%%", j->pb->stall_fraction * 100.0);
    else
      snprintf(stall, sizeof(stall), "-");
    if (cur) {
      snprintf(bps, sizeof(bps), "%.1f", j->pb->batches_per_second);
      snprintf(wanted, sizeof(wanted), "%" PRIu32, j->pb->workers_wanted);
    } else {
      snprintf(bps, sizeof(bps), "-");
      snprintf(wanted, sizeof(wanted), "-");
    }
    fprintf(out, "  %-6" PRIu64 " %-16s %-17s %-9s %-8s %6.1f%% %-23s %7zu "
                 "%6s %9s %6s\n",
            j->pb->job_id, job_name(j->pb), j->mode, j->state, ep,
            j->fraction * 100.0, rec, j->pb->n_clients, stall, bps, wanted);
  }
}

static void text_status(FILE *out, const view_t *v) {
  const Ferry__V1__GetStatusResponse *st = v->pb;
  fprintf(out, "dispatcher %s  version %s  up ", v->dispatcher,
          st->version ? st->version : "?");
  print_duration(out, st->uptime_ms);
  fprintf(out, "  datasets %" PRIu32 "\n", st->datasets);

  fprintf(out, "\nworkers (%zu)\n", st->n_workers);
  if (st->n_workers)
    text_workers(out, v);

  fprintf(out, "\njobs (%zu)\n", st->n_jobs);
  for (size_t i = 0; i < st->n_jobs; i++) {
    const vjob_t *vj = &v->jobs[i];
    const Ferry__V1__JobStatus *j = vj->pb;
    bool named = j->name && *j->name;
    fprintf(out, "  job %" PRIu64 " %s%s%s  %s%s  %s  epoch ", j->job_id,
            named ? "\"" : "", job_name(j), named ? "\"" : "", vj->mode,
            j->share ? " (shares production)" : "", vj->state);
    text_epoch(out, vj);
    fputs("\n    ", out);
    print_bar(out, vj->fraction);
    fprintf(out, "  %" PRIu64 " of %" PRIu64 " records this epoch, %" PRIu64
                 " in all\n",
            vj->delivered, vj->total, vj->delivered_all);
    if (figures_current(j)) {
      fprintf(out, "    stall %.1f%%  %.1f batches/s  workers wanted %" PRIu32
                   "\n",
              j->stall_fraction * 100.0, j->batches_per_second,
              j->workers_wanted);
    } else if (j->figures_ms_ago < 0) {
      fputs("    no live client; no client reported figures yet\n", out);
    } else {
      fputs("    no live client; as of the last report ", out);
      print_duration(out, j->figures_ms_ago);
      fprintf(out, " ago: stall %.1f%%  %.1f batches/s\n",
              j->stall_fraction * 100.0, j->batches_per_second);
    }
    fprintf(out, "    dataset %s  skipped %" PRIu64 "\n",
            j->dataset_id ? j->dataset_id : "", j->skipped);
    for (size_t k = 0; k < j->n_skipped_by_file; k++)
      fprintf(out, "      %" PRIu64 " skipped in %s\n",
              j->skipped_by_file[k]->skipped,
              j->skipped_by_file[k]->file ? j->skipped_by_file[k]->file : "");
    text_job_cache(out, st, j->dataset_id);
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

/* ---- JSON (one document per line) --------------------------------------- */

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

static void json_begin(FILE *out, const char *kind, const char *dispatcher) {
  fprintf(out, "{\"schema\": %d, \"kind\": \"%s\", \"dispatcher\": ",
          JSON_SCHEMA, kind);
  json_str(out, dispatcher);
}

static void json_workers(FILE *out, const view_t *v) {
  const Ferry__V1__GetStatusResponse *st = v->pb;
  fputs("\"workers\": [", out);
  for (size_t i = 0; i < st->n_workers; i++) {
    const Ferry__V1__WorkerStatus *w = st->workers[i];
    fprintf(out, "%s{\"id\": %" PRIu64 ", \"address\": ", i ? ", " : "",
            w->worker_id);
    json_str(out, w->address);
    fputs(", \"state\": ", out);
    json_str(out, w->state);
    fprintf(out, ", \"operator_drained\": %s, \"tasks\": %" PRIu32
                 ", \"threads\": %" PRIu32 ", \"buffer_bytes\": %" PRIu64
                 ", \"buffer_used_bytes\": %" PRIu64
                 ", \"last_heartbeat_ms_ago\": %" PRId64
                 ", \"unreachable_clients\": %" PRIu32
                 ", \"unreachable_ms_ago\": %" PRId64
                 ", \"unreachable_reason\": ",
            w->operator_drained ? "true" : "false", w->tasks, w->threads,
            w->buffer_bytes, used_bytes(w), w->last_heartbeat_ms_ago,
            w->unreachable_clients, w->unreachable_ms_ago);
    json_str(out, w->unreachable_reason);
    const Ferry__V1__CacheReport *c = w->cache;
    if (c != NULL) {
      fputs(", \"cache\": {\"dir\": ", out);
      json_str(out, c->dir);
      fprintf(out, ", \"limit_bytes\": %" PRIu64 ", \"held_bytes\": %" PRIu64
                   ", \"entries\": %" PRIu64 ", \"hits\": %" PRIu64
                   ", \"misses\": %" PRIu64 ", \"read_bytes\": %" PRIu64
                   ", \"written_bytes\": %" PRIu64 ", \"corrupt\": %" PRIu64
                   ", \"full\": %" PRIu64 ", \"policies\": [",
              c->limit_bytes, c->held_bytes, c->entries, c->hits, c->misses,
              c->read_bytes, c->written_bytes, c->corrupt, c->full);
      for (size_t k = 0; k < c->n_policies; k++) {
        const Ferry__V1__CachePolicy *p = c->policies[k];
        fputs(k ? ", {\"dataset_id\": " : "{\"dataset_id\": ", out);
        json_str(out, p->dataset_id);
        fputs(", \"choice\": ", out);
        json_str(out, p->choice);
        fputs(", \"reason\": ", out);
        json_str(out, p->reason);
        fprintf(out, ", \"hits\": %" PRIu64 ", \"misses\": %" PRIu64 "}",
                p->hits, p->misses);
      }
      fputs("]}", out);
    }
    putc('}', out);
  }
  putc(']', out);
}

static void json_jobs(FILE *out, const view_t *v) {
  fputs("\"jobs\": [", out);
  for (size_t i = 0; i < v->pb->n_jobs; i++) {
    const vjob_t *vj = &v->jobs[i];
    const Ferry__V1__JobStatus *j = vj->pb;
    fprintf(out, "%s{\"id\": %" PRIu64 ", \"name\": ", i ? ", " : "",
            j->job_id);
    json_str(out, j->name);
    fputs(", \"dataset_id\": ", out);
    json_str(out, j->dataset_id);
    fprintf(out, ", \"share\": %s", j->share ? "true" : "false");
    fprintf(out, ", \"mode\": \"%s\", \"state\": \"%s\", \"epoch\": %" PRIu32
                 ", \"num_epochs\": ",
            vj->mode, vj->state, vj->epoch);
    if (vj->num_epochs < 0)
      fputs("null", out);
    else
      fprintf(out, "%" PRId64, vj->num_epochs);
    fprintf(out, ", \"delivered\": %" PRIu64 ", \"total\": %" PRIu64
                 ", \"delivered_all\": %" PRIu64 ", \"fraction\": ",
            vj->delivered, vj->total, vj->delivered_all);
    json_double(out, vj->fraction);
    fputs(", \"stall_fraction\": ", out);
    json_double(out, j->stall_fraction);
    fputs(", \"batches_per_second\": ", out);
    json_double(out, j->batches_per_second);
    fprintf(out, ", \"workers_wanted\": %" PRIu32 ", \"live_clients\": %"
                 PRIu32 ", \"figures_ms_ago\": %" PRId64
                 ", \"skipped\": %" PRIu64 ", \"skipped_by_file\": [",
            j->workers_wanted, j->live_clients, j->figures_ms_ago, j->skipped);
    for (size_t k = 0; k < j->n_skipped_by_file; k++) {
      fputs(k ? ", {\"file\": " : "{\"file\": ", out);
      json_str(out, j->skipped_by_file[k]->file);
      fprintf(out, ", \"skipped\": %" PRIu64 "}",
              j->skipped_by_file[k]->skipped);
    }
    fputs("], \"error\": ", out);
    json_str(out, j->error);
    fputs(", \"clients\": [", out);
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
  putc(']', out);
}

typedef enum { SHOW_STATUS, SHOW_WORKERS, SHOW_JOBS } show_t;

static void render(FILE *out, const view_t *v, show_t what, bool json) {
  const Ferry__V1__GetStatusResponse *st = v->pb;
  if (!json) {
    if (what == SHOW_STATUS)
      text_status(out, v);
    else if (what == SHOW_WORKERS)
      text_workers(out, v);
    else
      text_jobs_table(out, v);
    return;
  }
  json_begin(out, what == SHOW_STATUS    ? "status"
                  : what == SHOW_WORKERS ? "workers"
                                         : "jobs",
             v->dispatcher);
  if (what == SHOW_STATUS) {
    fputs(", \"version\": ", out);
    json_str(out, st->version);
    fprintf(out, ", \"uptime_ms\": %" PRId64 ", \"datasets\": %" PRIu32,
            st->uptime_ms, st->datasets);
  }
  if (what != SHOW_JOBS) {
    fputs(", ", out);
    json_workers(out, v);
  }
  if (what != SHOW_WORKERS) {
    fputs(", ", out);
    json_jobs(out, v);
  }
  fputs("}\n", out);
}

/* ---- status, workers, jobs, watch --------------------------------------- */

static volatile sig_atomic_t interrupted;

static void on_signal(int sig) {
  (void)sig;
  interrupted = 1;
}

/* Sleeps `s` seconds, returning early on SIGINT or SIGTERM. */
static void nap(double s) {
  struct timespec ts;
  ts.tv_sec = (time_t)s;
  ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
  nanosleep(&ts, NULL);
}

static int show(int argc, char **argv, const char *cmd, const char *usage,
                const ferry_option_t *t, size_t n, show_t what, bool watch) {
  session_t s;
  int npos = 0;
  int rc = session_open(&s, cmd, usage, t, n, argc - 1, argv + 1, &npos);
  if (rc != FERRYCTL_CONTINUE)
    goto out;
  if (npos != 0) {
    fprintf(stderr, "ferryctl %s: unexpected argument '%s'\n", cmd, argv[1]);
    rc = FERRYCTL_EXIT_USAGE;
    goto out;
  }
  watch = watch || s.o.watch;
  if (watch) {
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
  }
  rc = FERRYCTL_EXIT_OK;
  for (int64_t round = 1;; round++) {
    Ferry__V1__GetStatusResponse *st = NULL;
    ferry_error_t err = {0};
    int crc = fetch_status(&s, &st, &err);
    if (crc != 0) {
      /* Once watching, a dispatcher restart is a line, not the end. */
      if (!watch || round == 1) {
        rc = call_failed(&s, crc, &err);
        break;
      }
      fprintf(stderr, "ferryctl %s: %s\n", cmd, err.msg);
    } else {
      view_t v;
      if (view_build(&v, st, s.o.dispatcher) != 0) {
        fprintf(stderr, "ferryctl %s: out of memory\n", cmd);
        protobuf_c_message_free_unpacked(&st->base, &ferry__pb_allocator);
        rc = FERRYCTL_EXIT_BAD;
        break;
      }
      if (watch && !s.o.json && ferryctl_isatty())
        fputs("\033[H\033[2J", stdout); /* home and clear the screen */
      render(stdout, &v, what, s.o.json);
      if (watch && !s.o.json)
        putc('\n', stdout);
      fflush(stdout);
      view_free(&v);
      protobuf_c_message_free_unpacked(&st->base, &ferry__pb_allocator);
    }
    if (!watch || interrupted || (s.o.count > 0 && round >= s.o.count))
      break;
    nap(s.o.interval);
    if (interrupted)
      break;
  }
out:
  session_close(&s, t, n);
  return rc;
}

int ferryctl_status(int argc, char **argv) {
  return show(argc, argv, "status", status_usage, status_table,
              N(status_table), SHOW_STATUS, false);
}

int ferryctl_workers(int argc, char **argv) {
  return show(argc, argv, "workers", workers_usage, list_table,
              N(list_table), SHOW_WORKERS, false);
}

int ferryctl_jobs(int argc, char **argv) {
  return show(argc, argv, "jobs", jobs_usage, list_table, N(list_table),
              SHOW_JOBS, false);
}

int ferryctl_watch(int argc, char **argv) {
  return show(argc, argv, "watch", watch_usage, watch_table, N(watch_table),
              SHOW_STATUS, true);
}

/* ---- drain -------------------------------------------------------------- */

/* Parses a decimal id (no sign, no junk); 0 when `s` is not one. */
static uint64_t parse_id(const char *s) {
  char *end;
  if (s[0] < '0' || s[0] > '9')
    return 0;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  return *end == '\0' && errno == 0 ? (uint64_t)v : 0;
}

static int drain_call(session_t *s, const char *target,
                      Ferry__V1__DrainWorkerResponse **out,
                      ferry_error_t *err) {
  Ferry__V1__DrainWorkerRequest req = FERRY__V1__DRAIN_WORKER_REQUEST__INIT;
  req.worker_id = parse_id(target);
  req.address = req.worker_id != 0 ? (char *)"" : (char *)target;
  return call(s, FERRY_METHOD_DRAIN_WORKER, &req.base,
              &ferry__v1__drain_worker_response__descriptor,
              (ProtobufCMessage **)out, err);
}

static void drain_json(const session_t *s,
                       const Ferry__V1__DrainWorkerResponse *r,
                       uint32_t moved, double secs, bool timed_out) {
  json_begin(stdout, "drain", s->o.dispatcher);
  fprintf(stdout, ", \"worker\": {\"id\": %" PRIu64 ", \"address\": ",
          r->worker_id);
  json_str(stdout, r->address);
  fputs(", \"state\": ", stdout);
  json_str(stdout, r->state);
  fprintf(stdout, "}, \"moved\": %" PRIu32 ", \"tasks\": %" PRIu32
                  ", \"other_workers\": %" PRIu32 ", \"drained\": %s, "
                  "\"timed_out\": %s, \"seconds\": ",
          moved, r->tasks, r->other_workers, r->drained ? "true" : "false",
          timed_out ? "true" : "false");
  json_double(stdout, secs);
  fputs("}\n", stdout);
}

int ferryctl_drain(int argc, char **argv) {
  session_t s;
  int npos = 0;
  int rc = session_open(&s, "drain", drain_usage, drain_table,
                        N(drain_table), argc - 1, argv + 1, &npos);
  if (rc != FERRYCTL_CONTINUE)
    goto out;
  if (npos != 1) {
    fprintf(stderr, "ferryctl drain: %s (see 'ferryctl drain --help')\n",
            npos == 0 ? "name the worker: WORKER_ID_OR_ADDR"
                      : "one worker at a time");
    rc = FERRYCTL_EXIT_USAGE;
    goto out;
  }
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);

  const char *target = argv[1];
  double t0 = ferryctl_now(), deadline = t0 + s.o.timeout;
  Ferry__V1__DrainWorkerResponse *r = NULL;
  ferry_error_t err = {0};
  int crc = drain_call(&s, target, &r, &err);
  if (crc != 0) {
    rc = call_failed(&s, crc, &err);
    goto out;
  }
  uint32_t moved = r->moved;
  if (!s.o.json) {
    printf("worker %" PRIu64 " (%s): draining; %" PRIu32 " lease%s moved",
           r->worker_id, r->address, moved, moved == 1 ? "" : "s");
    if (moved > 0 && r->other_workers > 0)
      printf(" to %" PRIu32 " other worker%s", r->other_workers,
             r->other_workers == 1 ? "" : "s");
    putchar('\n');
    fflush(stdout);
  }
  if (moved > 0 && r->other_workers == 0)
    fprintf(stderr, "ferryctl drain: warning: no other worker can take its "
            "splits: they wait until one registers\n");
  /* Polls (the call is idempotent) until nothing runs on the worker. A
   * dispatcher that stops answering meanwhile (a restart) is waited for
   * until the deadline: the drain is journaled. */
  while (!r->drained && !interrupted && ferryctl_now() < deadline) {
    double left = deadline - ferryctl_now();
    nap(left < 0.1 ? left : 0.1);
    Ferry__V1__DrainWorkerResponse *n = NULL;
    crc = drain_call(&s, target, &n, &err);
    if (crc == 0) {
      protobuf_c_message_free_unpacked(&r->base, &ferry__pb_allocator);
      r = n;
    } else if (!unreachable(crc)) {
      rc = call_failed(&s, crc, &err);
      protobuf_c_message_free_unpacked(&r->base, &ferry__pb_allocator);
      goto out;
    }
  }
  double secs = ferryctl_now() - t0;
  if (s.o.json)
    drain_json(&s, r, moved, secs, !r->drained);
  if (r->drained || s.o.timeout == 0) {
    if (!s.o.json && !r->drained)
      printf("worker %" PRIu64 " (%s): %s; not waiting (--timeout 0)\n",
             r->worker_id, r->address, r->state);
    else if (!s.o.json && strcmp(r->state, "drained") == 0)
      printf("worker %" PRIu64 " (%s): drained in %.1f s\n", r->worker_id,
             r->address, secs);
    else if (!s.o.json)
      printf("worker %" PRIu64 " (%s): drained (%s) in %.1f s\n",
             r->worker_id, r->address, r->state, secs);
    rc = FERRYCTL_EXIT_OK;
  } else {
    fprintf(stderr, "ferryctl drain: worker %" PRIu64 " (%s) is not drained "
            "after %.1f s (%s; %" PRIu32 " leases on it)%s\n", r->worker_id,
            r->address, secs, r->state, r->tasks,
            interrupted ? ": interrupted" : "");
    rc = interrupted ? FERRYCTL_EXIT_BAD : FERRYCTL_EXIT_TIMEOUT;
  }
  protobuf_c_message_free_unpacked(&r->base, &ferry__pb_allocator);
out:
  session_close(&s, drain_table, N(drain_table));
  return rc;
}

/* ---- job cancel --------------------------------------------------------- */

static int job_cancel(int argc, char **argv) {
  session_t s;
  int npos = 0;
  int rc = session_open(&s, "job cancel", cancel_usage, list_table,
                        N(list_table), argc - 1, argv + 1, &npos);
  if (rc != FERRYCTL_CONTINUE)
    goto out;
  uint64_t id = npos == 1 ? parse_id(argv[1]) : 0;
  if (id == 0) {
    fprintf(stderr, "ferryctl job cancel: %s (see 'ferryctl job cancel "
            "--help')\n", npos == 1 ? "JOB_ID is a job id, a number"
                                    : "name one job: JOB_ID");
    rc = FERRYCTL_EXIT_USAGE;
    goto out;
  }
  Ferry__V1__CancelJobRequest req = FERRY__V1__CANCEL_JOB_REQUEST__INIT;
  Ferry__V1__CancelJobResponse *r = NULL;
  ferry_error_t err = {0};
  req.job_id = id;
  int crc = call(&s, FERRY_METHOD_CANCEL_JOB, &req.base,
                 &ferry__v1__cancel_job_response__descriptor,
                 (ProtobufCMessage **)&r, &err);
  if (crc != 0) {
    rc = call_failed(&s, crc, &err);
    goto out;
  }
  if (s.o.json) {
    json_begin(stdout, "job_cancel", s.o.dispatcher);
    printf(", \"job_id\": %" PRIu64 ", \"state\": \"%s\", \"already\": %s}\n",
           r->job_id, ferry__job_state_name(r->state),
           r->already ? "true" : "false");
  } else {
    printf("job %" PRIu64 ": %s\n", r->job_id,
           r->already ? "already cancelled" : "cancelled");
  }
  protobuf_c_message_free_unpacked(&r->base, &ferry__pb_allocator);
  rc = FERRYCTL_EXIT_OK;
out:
  session_close(&s, list_table, N(list_table));
  return rc;
}

int ferryctl_job(int argc, char **argv) {
  if (argc >= 2 && strcmp(argv[1], "cancel") == 0)
    return job_cancel(argc - 1, argv + 1);
  if (argc >= 2 && (strcmp(argv[1], "--help") == 0 ||
                    strcmp(argv[1], "-h") == 0)) {
    fputs(cancel_usage, stdout);
    fputs(footer, stdout);
    return FERRYCTL_EXIT_OK;
  }
  fprintf(stderr, "ferryctl job: %s (usage: ferryctl job cancel JOB_ID)\n",
          argc < 2 ? "name a subcommand" : "unknown subcommand");
  return FERRYCTL_EXIT_USAGE;
}
