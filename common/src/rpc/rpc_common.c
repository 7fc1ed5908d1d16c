/* What the server and the client side share: library start-up, malloc
 * tuning, status-code translation and channel arguments. */
#include <grpc/support/log.h>
#include <limits.h>
#include <malloc.h>

#include "ferry/error.h"
#include "ferry/log.h"
#include "rpc_internal.h"

#define DEFAULT_KEEPALIVE_TIME_MS 30000
#define DEFAULT_KEEPALIVE_TIMEOUT_MS 10000
#define DEFAULT_REQUEST_SLOTS 8
#define RECONNECT_BACKOFF_MIN_MS 100
#define RECONNECT_BACKOFF_MAX_MS 1000
#define CONNECT_TIMEOUT_MIN_MS 5000

/* gRPC logs through gpr_log, to stderr by default; the library never
 * writes there, so its lines join Ferry's log. Its errors are warnings
 * here: whatever matters also comes back as an error code. */
static void log_to_ferry(gpr_log_func_args *a) {
  int level = FERRY_LOG_DEBUG;
  if (a->severity == GPR_LOG_SEVERITY_ERROR)
    level = FERRY_LOG_WARN;
  else if (a->severity == GPR_LOG_SEVERITY_INFO)
    level = FERRY_LOG_INFO;
  FERRY_LOG(level, "grpc: %s:%d: %s", a->file, a->line, a->message);
}

void ferry__rpc_init(void) {
  gpr_set_log_function(log_to_ferry);
  grpc_init();
}

void ferry__rpc_shutdown(void) { grpc_shutdown(); }

int ferry__rpc_tune_malloc(void) {
  int ok = 1;
  /* 32 MiB is glibc's largest mmap threshold on 64-bit systems: gRPC's
   * read buffers and control messages then always come from the heap,
   * which is neither trimmed nor unmapped between reads. */
  ok &= mallopt(M_MMAP_THRESHOLD, 32 << 20);
  ok &= mallopt(M_TRIM_THRESHOLD, 512 << 20);
  ok &= mallopt(M_TOP_PAD, 64 << 20);
  /* Sanitizer runtimes replace malloc and refuse mallopt. */
  return ok ? 0 : FERRY_ENOTSUP;
}

int ferry__rpc_err_from_status(int status) {
  if (status == GRPC_STATUS_OK)
    return 0;
  if (status < 1 || status > 16)
    return FERRY_EGRPC_UNKNOWN;
  return -1100 - status;
}

int ferry__rpc_status_from_err(int code) {
  if (code == 0)
    return GRPC_STATUS_OK;
  if (code <= FERRY_EGRPC_CANCELLED && code >= FERRY_EGRPC_UNAUTHENTICATED)
    return -1100 - code;
  switch (code) {
  case FERRY_EINVAL:
  case FERRY_ESPEC:
  case FERRY_EOPTION:
    return GRPC_STATUS_INVALID_ARGUMENT;
  case FERRY_ENOENT: return GRPC_STATUS_NOT_FOUND;
  case FERRY_EACCES: return GRPC_STATUS_PERMISSION_DENIED;
  case FERRY_ENOMEM:
  case FERRY_ENOSPC:
    return GRPC_STATUS_RESOURCE_EXHAUSTED;
  case FERRY_ETIMEDOUT: return GRPC_STATUS_DEADLINE_EXCEEDED;
  case FERRY_ECANCELED: return GRPC_STATUS_CANCELLED;
  case FERRY_ERANGE: return GRPC_STATUS_OUT_OF_RANGE;
  case FERRY_ENOTSUP: return GRPC_STATUS_UNIMPLEMENTED;
  default: return GRPC_STATUS_INTERNAL;
  }
}

int ferry__rpc_options(const ferry_rpc_options_t *opts,
                       ferry_rpc_options_t *out, ferry_error_t *err) {
  ferry_rpc_options_t o = {0};
  if (opts != NULL)
    o = *opts;
  if (o.max_message_bytes < -1 || o.keepalive_time_ms < 0 ||
      o.keepalive_timeout_ms < 0 || o.request_slots < 0 ||
      o.idle_connection_ms < -1 || o.max_connection_age_ms < -1 ||
      o.handshake_timeout_ms < -1)
    return ferry__seterr(err, FERRY_EINVAL, "rpc: negative option value");
  if (o.max_message_bytes == 0)
    o.max_message_bytes = FERRY_RPC_DEFAULT_MAX_MESSAGE;
  if (o.keepalive_time_ms == 0)
    o.keepalive_time_ms = DEFAULT_KEEPALIVE_TIME_MS;
  if (o.keepalive_time_ms < FERRY_RPC_MIN_KEEPALIVE_MS)
    o.keepalive_time_ms = FERRY_RPC_MIN_KEEPALIVE_MS;
  if (o.keepalive_timeout_ms == 0)
    o.keepalive_timeout_ms = DEFAULT_KEEPALIVE_TIMEOUT_MS;
  if (o.request_slots == 0)
    o.request_slots = DEFAULT_REQUEST_SLOTS;
  if (o.idle_connection_ms == 0)
    o.idle_connection_ms = FERRY_RPC_DEFAULT_IDLE_MS;
  if (o.max_connection_age_ms == 0)
    o.max_connection_age_ms = FERRY_RPC_DEFAULT_MAX_AGE_MS;
  if (o.handshake_timeout_ms == 0)
    o.handshake_timeout_ms = FERRY_RPC_DEFAULT_HANDSHAKE_MS;
  *out = o;
  return 0;
}

static void set_int(grpc_arg *a, const char *key, int value) {
  a->type = GRPC_ARG_INTEGER;
  a->key = (char *)key;
  a->value.integer = value;
}

size_t ferry__rpc_channel_args(const ferry_rpc_options_t *o, bool server,
                               grpc_arg *args) {
  size_t n = 0;
  set_int(&args[n++], GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH,
          o->max_message_bytes);
  set_int(&args[n++], GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, o->max_message_bytes);
  set_int(&args[n++], GRPC_ARG_KEEPALIVE_TIME_MS, o->keepalive_time_ms);
  set_int(&args[n++], GRPC_ARG_KEEPALIVE_TIMEOUT_MS, o->keepalive_timeout_ms);
  /* Both sides ping idle connections, so that a dead dispatcher or worker
   * is noticed without a call in flight; the server must then accept
   * pings without data at the client's rate, or it answers GOAWAY
   * "too_many_pings" after two strikes and closes the connection, streams
   * and all. A client may ping faster than the server's own keepalive
   * (a trainer's streams follow its client timeout): the server accepts
   * any rate down to FERRY_RPC_MIN_KEEPALIVE_MS. */
  set_int(&args[n++], GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  set_int(&args[n++], GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  set_int(&args[n++], GRPC_ARG_HTTP2_MIN_SENT_PING_INTERVAL_WITHOUT_DATA_MS,
          o->keepalive_time_ms);
  if (server) {
    set_int(&args[n++], GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
            FERRY_RPC_MIN_KEEPALIVE_MS / 2);
    /* gRPC core closes nothing on its own: a socket that never finishes
     * TLS or the HTTP/2 preface waits 120 s, one that did and never calls
     * (or calls without a token, refused at once) lives forever, and
     * keepalive pings it answers keep it so. 2,000 such connections all
     * stayed open. The handshake timeout covers the first kind (plaintext
     * too: gRPC waits for the client's SETTINGS until then); the idle
     * timeout (no call in flight) sends GOAWAY and closes the second. A
     * connection that keeps making refused calls is not idle: its age
     * ends it. The age's grace stays infinite on purpose: after the
     * GOAWAY a client opens a new connection for new calls, but calls in
     * flight, a StreamChunks stream for a whole epoch or a long-polling
     * heartbeat, run to their end; a finite grace would cut them. */
    if (o->handshake_timeout_ms > 0)
      set_int(&args[n++], GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
              o->handshake_timeout_ms);
    if (o->idle_connection_ms > 0)
      set_int(&args[n++], GRPC_ARG_MAX_CONNECTION_IDLE_MS,
              o->idle_connection_ms);
    if (o->max_connection_age_ms > 0) {
      set_int(&args[n++], GRPC_ARG_MAX_CONNECTION_AGE_MS,
              o->max_connection_age_ms);
      set_int(&args[n++], GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS, INT_MAX);
    }
  } else {
    /* gRPC waits 1 s before reconnecting and 1.6 times longer after each
     * failure, up to 2 min: tuned for the internet. Ferry's peers are a
     * dispatcher and workers on the trainer's LAN, and a restarted one
     * is back within milliseconds; with the defaults every worker and
     * client stalled a whole second (and longer after a few failed
     * tries) after a dispatcher restart. Trying every 100 ms to 1 s
     * costs a LAN nothing.
     * GRPC_ARG_MIN_RECONNECT_BACKOFF_MS is not a backoff: gRPC core uses
     * it as the least time a connection attempt gets (its deadline is
     * max(next backoff, now + this); 20 s by default). Set to 100 ms it
     * cut TLS handshakes that took longer short, on a loaded machine or
     * when the caller polled its completion queue only now and then, and
     * such a peer could never be reached. A refused connection fails at
     * once whatever this is; 5 s bounds a black-holed address. */
    set_int(&args[n++], GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS,
            RECONNECT_BACKOFF_MIN_MS);
    set_int(&args[n++], GRPC_ARG_MIN_RECONNECT_BACKOFF_MS,
            CONNECT_TIMEOUT_MIN_MS);
    set_int(&args[n++], GRPC_ARG_MAX_RECONNECT_BACKOFF_MS,
            RECONNECT_BACKOFF_MAX_MS);
  }
  return n;
}
