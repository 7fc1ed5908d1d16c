/* A thin layer over the gRPC core C API: a server that runs its handlers on
 * a libuv loop, and a blocking client (unary calls and server-streaming
 * readers) usable from any thread. The dispatcher, the workers, the client
 * library and ferryctl all speak gRPC through this header only; gRPC status
 * codes become FERRY_EGRPC_* codes here and nowhere else.
 *
 * Threads. A server belongs to the libuv loop it was created on: every
 * ferry_rpc_server_* and ferry_rpc_call-side function (reply, stream_send,
 * stream_finish, on_cancel) must be called on that loop's thread, and every
 * callback (handlers, on_sent, cancel, shutdown done) runs there. A private
 * thread blocks on the gRPC completion queue and hands events to the loop.
 * Client objects (channels, streams) are used from any thread; a channel may
 * be shared, a stream is used by one thread at a time (ferry__rpc_stream_cancel
 * excepted).
 *
 * Messages are opaque bytes here; callers pack and unpack them with
 * protobuf-c (or by hand for the chunk payload, see DESIGN.md section 3).
 */
#ifndef FERRY_RPC_H
#define FERRY_RPC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "ferry/error.h"

/* Default receive/send limit: a chunk is up to 64 MiB plus its header. */
#define FERRY_RPC_DEFAULT_MAX_MESSAGE (80 << 20)

/* Flags for client calls. */
#define FERRY_RPC_WAIT_FOR_READY 1u /* queue until the channel connects */

/* gRPC status codes, as on the wire (grpc_status_code). */
#define FERRY_RPC_OK 0
#define FERRY_RPC_CANCELLED 1
#define FERRY_RPC_INVALID_ARGUMENT 3
#define FERRY_RPC_DEADLINE_EXCEEDED 4
#define FERRY_RPC_NOT_FOUND 5
#define FERRY_RPC_FAILED_PRECONDITION 9
#define FERRY_RPC_UNIMPLEMENTED 12
#define FERRY_RPC_INTERNAL 13
#define FERRY_RPC_UNAVAILABLE 14
#define FERRY_RPC_PERMISSION_DENIED 7
#define FERRY_RPC_RESOURCE_EXHAUSTED 8
#define FERRY_RPC_UNAUTHENTICATED 16

/* Bytes of the secret the dispatcher gives each client of a job:
 * its ClientHeartbeat and StreamChunks calls carry it. */
#define FERRY_CLIENT_SECRET_BYTES 16

/* TLS settings: PEM files, read when the server or channel is created
 * (an unreadable or empty file fails then, naming it). A server re-reads
 * them when they change (checked at each new connection, and forced by
 * ferry__rpc_server_reload_tls): connections already open keep their
 * session, so streams are not dropped. A channel reads them once. */
typedef struct ferry_rpc_tls_s {
  const char *ca_file;      /* server: the CA bundle client certificates must
                               chain to (needed with require_client_cert);
                               channel: the CA bundle the server must chain
                               to (NULL: gRPC's default roots) */
  const char *cert_file;    /* server: its certificate chain (required);
                               channel: a client certificate for mutual TLS,
                               or NULL */
  const char *key_file;     /* the private key of cert_file */
  bool require_client_cert; /* server: mutual TLS, a client without a
                               certificate signed by ca_file is refused */
} ferry_rpc_tls_t;

/* Settings shared by servers and channels. Zero-initialise and set what
 * you need; 0 means the default. Keepalive values must agree on both
 * sides, so use the same struct (or the defaults) for both. */
typedef struct ferry_rpc_options_s {
  int max_message_bytes;      /* receive and send limit; -1: unlimited;
                                 0: FERRY_RPC_DEFAULT_MAX_MESSAGE */
  int keepalive_time_ms;      /* ping a connection that received nothing
                                 this long; 0: 30000; at least
                                 FERRY_RPC_MIN_KEEPALIVE_MS */
  int keepalive_timeout_ms;   /* drop it without an answer (and a socket
                                 whose sent bytes go unacknowledged this
                                 long: gRPC's TCP_USER_TIMEOUT); 0: 10000 */
  int request_slots;          /* server: calls pre-requested per method;
                                 0: 8 */
  const ferry_rpc_tls_t *tls; /* NULL: insecure (plaintext); the files it
                                 names are copied, not the struct */
  const char *bearer_token;   /* channel: sent on every call as
                                 "authorization: Bearer TOKEN" (copied);
                                 NULL: none */
  /* Server: how long a connection may live without doing anything a
   * client of ours does, so that idle or unauthenticated connections do
   * not pile up (docs/ARCHITECTURE.md, "Connection lifetimes"). -1:
   * never. */
  int idle_connection_ms;    /* no call in flight this long: GOAWAY and
                                close; 0: FERRY_RPC_DEFAULT_IDLE_MS */
  int max_connection_age_ms; /* this old: GOAWAY, no new calls; calls in
                                flight (streams too) run to their end,
                                then it closes; 0:
                                FERRY_RPC_DEFAULT_MAX_AGE_MS */
  int handshake_timeout_ms;  /* TCP accepted but the TLS handshake or
                                HTTP/2 preface unfinished this long:
                                closed; 0: FERRY_RPC_DEFAULT_HANDSHAKE_MS
                                (-1: gRPC's own 120 s) */
} ferry_rpc_options_t;

#define FERRY_RPC_DEFAULT_IDLE_MS 20000
/* The shortest keepalive time a channel uses; servers accept pings from
 * a connection this often (half of it, for timer jitter) whatever their
 * own keepalive time, so a client that must notice a dead peer sooner
 * than the server's default may ping at its own rate. */
#define FERRY_RPC_MIN_KEEPALIVE_MS 1000
#define FERRY_RPC_DEFAULT_MAX_AGE_MS 3600000
#define FERRY_RPC_DEFAULT_HANDSHAKE_MS 10000

/* Reference-counted wrappers around grpc_init/grpc_shutdown. Every user of
 * this header calls ferry__rpc_init once before anything else and
 * ferry__rpc_shutdown once after destroying all its servers, channels and
 * streams. Thread-safe. */
void ferry__rpc_init(void);
void ferry__rpc_shutdown(void);

/* Raises glibc's mmap and trim thresholds and top pad (DESIGN.md section
 * 8): gRPC allocates a fresh buffer per socket read, and with the default
 * thresholds glibc keeps returning and refaulting that memory. Daemons and
 * the client call it once at start-up, before starting threads. Returns 0,
 * or FERRY_ENOTSUP if the allocator refused a setting (sanitizer builds
 * replace malloc); harmless either way. */
int ferry__rpc_tune_malloc(void);

/* Maps a gRPC status code to 0 (OK) or a FERRY_EGRPC_* code, and a Ferry
 * code to the gRPC status a server should answer with (FERRY_EGRPC_* map
 * back, FERRY_EINVAL to INVALID_ARGUMENT, FERRY_ENOENT to NOT_FOUND, ...,
 * anything else to INTERNAL). */
int ferry__rpc_err_from_status(int status);
int ferry__rpc_status_from_err(int code);

/* ---- Server ------------------------------------------------------------ */

typedef struct ferry_rpc_server_s ferry_rpc_server_t;
typedef struct ferry_rpc_call_s ferry_rpc_call_t;

typedef enum {
  FERRY_RPC_UNARY,        /* one request, one reply */
  FERRY_RPC_SERVER_STREAM /* one request, a stream of replies */
} ferry_rpc_kind_t;

/* A new call. `req` (the request message, contiguous, `len` bytes) is
 * valid only during the callback. The handler, now or later on the loop
 * thread, must answer the call exactly once: ferry__rpc_reply or
 * ferry__rpc_reply_error for unary methods, ferry__rpc_stream_finish for
 * streaming ones. That holds also after the call was cancelled (the answer
 * then goes nowhere and costs nothing); the call handle stays valid until
 * the answer and must not be used after it. A server's shutdown completes
 * only when every call has been answered. */
typedef void (*ferry_rpc_handler_cb)(ferry_rpc_call_t *call, const uint8_t *req,
                                     size_t len, void *user);

/* The call ended before its answer completed: the client cancelled, its
 * deadline passed, the connection broke or the server is shutting down.
 * Runs at most once, on the loop, never after the handler answered, and
 * before the on_sent(ok=0) of a send that failed for that reason. The
 * handler still has to answer. */
typedef void (*ferry_rpc_cancel_cb)(ferry_rpc_call_t *call, void *arg);

/* A streamed message left (ok=1: it passed flow control) or could not be
 * sent (ok=0: the peer is gone; stop producing and finish the call).
 * Does not run if the handler answered the call meanwhile. */
typedef void (*ferry_rpc_sent_cb)(ferry_rpc_call_t *call, int ok, void *arg);

/* The server is gone (all memory released); runs on the loop. */
typedef void (*ferry_rpc_done_cb)(void *arg);

/* Creates a server on `loop` (owned by the caller, which must keep it
 * running until the server's shutdown completed). `opts` may be NULL and
 * is copied. On success *out is a server the caller must eventually pass
 * to ferry__rpc_server_shutdown, whether or not it was started. Loop
 * thread only. */
int ferry__rpc_server_new(uv_loop_t *loop, const ferry_rpc_options_t *opts,
                          ferry_rpc_server_t **out, ferry_error_t *err);

/* Registers a method by its full name ("/ferry.v1.Dispatcher/Heartbeat",
 * copied) before ferry__rpc_server_start. `user` is passed to the handler.
 * Calls to names never registered are answered UNIMPLEMENTED. */
int ferry__rpc_server_register(ferry_rpc_server_t *server, const char *method,
                               ferry_rpc_kind_t kind,
                               ferry_rpc_handler_cb handler, void *user,
                               ferry_error_t *err);

/* Binds `addr` ("127.0.0.1:0", "[::]:7070"), starts serving and stores the
 * bound port in *port (may be NULL). Fails with FERRY_EIO naming the
 * address when it cannot bind; the server then stays unstarted and must
 * still be shut down. The socket is bound without SO_REUSEPORT, so a port
 * another process listens on is refused (gRPC's default would share it).
 * Call once. */
int ferry__rpc_server_start(ferry_rpc_server_t *server, const char *addr,
                            int *port, ferry_error_t *err);

/* Stops accepting calls, cancels the calls in flight (their cancel
 * callbacks run), waits until every call has been answered and finished,
 * tears gRPC down, joins the completion-queue thread and closes the loop
 * handle; then calls done(arg) on the loop. `server` is invalid from the
 * moment done runs. Idle, this takes a few milliseconds. Call once. */
void ferry__rpc_server_shutdown(ferry_rpc_server_t *server,
                                ferry_rpc_done_cb done, void *arg);

/* Sets the callback for the end of `call` before its answer (see
 * ferry_rpc_cancel_cb). If the call already ended, `cb` runs before this
 * function returns. */
void ferry__rpc_call_on_cancel(ferry_rpc_call_t *call, ferry_rpc_cancel_cb cb,
                               void *arg);

/* True once the call ended early (client cancel, deadline, lost peer). */
bool ferry__rpc_call_cancelled(const ferry_rpc_call_t *call);

/* Answers a unary call with `len` bytes (copied) and status OK. */
int ferry__rpc_reply(ferry_rpc_call_t *call, const void *bytes, size_t len);

/* Answers a unary or streaming call with a non-OK gRPC `status` and a
 * message for the client (copied; may be NULL). */
int ferry__rpc_reply_error(ferry_rpc_call_t *call, int status, const char *msg);

/* One piece of a streamed message. gRPC keeps a reference on `ptr` until
 * the bytes are written (possibly after on_sent ran, and until the server
 * is shut down at the latest, where a gRPC thread may drop it just after
 * the shutdown's done callback) and then calls free_fn(free_arg) exactly
 * once, on whatever thread drops the last reference (a gRPC thread, the
 * loop, or the caller on failure): keep free_fn short and thread-safe,
 * and begin it with FERRY_TSAN_ACQUIRE(free_arg) (tsan.h), or
 * ThreadSanitizer, which cannot see gRPC's hand-off, reports what it
 * touches as racing with the sender. With free_fn NULL the bytes are
 * copied at once (small headers). */
typedef struct ferry_rpc_piece_s {
  const void *ptr;
  size_t len;
  void (*free_fn)(void *free_arg);
  void *free_arg;
} ferry_rpc_piece_t;

/* Sends one message made of `n` pieces, in order, without copying them.
 * At most one send may be outstanding per call; on_sent (may be NULL)
 * runs on the loop when it completed. Whether this succeeds or not, each
 * piece's free_fn runs exactly once; on failure on_sent never runs.
 * Fails with FERRY_EINVAL (send outstanding, call answered, not a
 * streaming call) or FERRY_ECANCELED (the call already ended). */
int ferry__rpc_stream_send(ferry_rpc_call_t *call,
                           const ferry_rpc_piece_t *pieces, size_t n,
                           ferry_rpc_sent_cb on_sent, void *arg);

/* Ends a streaming call with `status` (FERRY_RPC_OK or an error code) and
 * a message (copied; may be NULL). If a send is still outstanding, the
 * status follows once it completed. */
int ferry__rpc_stream_finish(ferry_rpc_call_t *call, int status,
                             const char *msg);

/* The call's method name, e.g. "/ferry.v1.Worker/StreamChunks". */
const char *ferry__rpc_call_method(const ferry_rpc_call_t *call);

/* ---- Health (grpc.health.v1) -------------------------------------------- */

/* Registers /grpc.health.v1.Health/Check on `server` (before start). It
 * answers SERVING (NOT_SERVING while draining) for "" and for each of the
 * `n` service names (copied), and NOT_FOUND for others. Watch answers
 * UNIMPLEMENTED. Loop thread. */
int ferry__rpc_health_register(ferry_rpc_server_t *server,
                               const char *const *services, size_t n,
                               ferry_error_t *err);

/* Switches the health answers between SERVING and NOT_SERVING. */
void ferry__rpc_health_set_serving(ferry_rpc_server_t *server, bool serving);

/* ---- Client ------------------------------------------------------------ */

typedef struct ferry_rpc_channel_s ferry_rpc_channel_t;
typedef struct ferry_rpc_stream_s ferry_rpc_stream_t;

/* One received message: a list of gRPC slices (about 64 KiB each for large
 * messages), owned by the caller until ferry__rpc_msg_release. */
typedef struct ferry_rpc_msg_s {
  size_t len;     /* total bytes */
  size_t nslices; /* number of slices */
  void *impl_;    /* private: the grpc_byte_buffer */
} ferry_rpc_msg_t;

/* Slice `i` (< nslices): a pointer into the message and its length. */
const uint8_t *ferry__rpc_msg_slice(const ferry_rpc_msg_t *msg, size_t i,
                                    size_t *len);

/* Copies `n` bytes starting at byte `offset` of the message into `dst`,
 * gathering across slices; returns the bytes copied (fewer at the end). */
size_t ferry__rpc_msg_copy(const ferry_rpc_msg_t *msg, size_t offset, void *dst,
                           size_t n);

/* Releases the message's slices; `msg` is then empty. NULL-safe. */
void ferry__rpc_msg_release(ferry_rpc_msg_t *msg);

/* Opens a channel to `target` ("host:port"). Connecting is lazy. `opts`
 * may be NULL and is copied. Free with ferry__rpc_channel_free after all
 * its streams were freed. Any thread. */
int ferry__rpc_channel_new(const char *target, const ferry_rpc_options_t *opts,
                           ferry_rpc_channel_t **out, ferry_error_t *err);
void ferry__rpc_channel_free(ferry_rpc_channel_t *ch);

/* A unary call that blocks the calling thread until the answer, at most
 * `deadline_ms` (<= 0: no deadline). `flags`: FERRY_RPC_WAIT_FOR_READY or
 * 0. On success returns 0 and the reply in *reply (ferry__malloc'ed, the
 * caller frees it with ferry_free; a 0-byte reply is a non-NULL pointer)
 * and *reply_len. Otherwise returns FERRY_EGRPC_* (or FERRY_ENOMEM) with
 * err->msg "METHOD: <server's message>", and *reply NULL. */
int ferry__rpc_unary(ferry_rpc_channel_t *ch, const char *method,
                     const void *req, size_t len, int deadline_ms,
                     unsigned flags, uint8_t **reply, size_t *reply_len,
                     ferry_error_t *err);

/* Starts a server-streaming call with one request message (copied).
 * `deadline_ms` <= 0: no deadline. Free with ferry__rpc_stream_free. */
int ferry__rpc_stream_open(ferry_rpc_channel_t *ch, const char *method,
                           const void *req, size_t len, int deadline_ms,
                           unsigned flags, ferry_rpc_stream_t **out,
                           ferry_error_t *err);

/* Waits at most `timeout_ms` (< 0: no limit) for the next message.
 * Returns 0 with *msg filled (release it), FERRY_EOF when the server
 * finished with OK, FERRY_EGRPC_* when the call failed (err names the
 * method and carries the server's message), or FERRY_ETIMEDOUT when
 * nothing arrived in time (the stream stays usable: call again). After
 * FERRY_EOF or an error every later call returns the same. */
int ferry__rpc_stream_next(ferry_rpc_stream_t *s, ferry_rpc_msg_t *msg,
                           int timeout_ms, ferry_error_t *err);

/* The final status once the stream ended: 0 or FERRY_EGRPC_*; 1 while it
 * is still running. */
int ferry__rpc_stream_status(const ferry_rpc_stream_t *s);

/* Cancels the call; a blocked or later ferry__rpc_stream_next returns
 * FERRY_EGRPC_CANCELLED. Thread-safe, any time before free. */
void ferry__rpc_stream_cancel(ferry_rpc_stream_t *s);

/* Cancels the call if it still runs, waits for gRPC to let go of it and
 * frees the stream. NULL-safe. */
void ferry__rpc_stream_free(ferry_rpc_stream_t *s);

/* ---- Credentials ------------------------------------------------ */

/* Reads a bearer token from `path`: the file's text without trailing
 * white space; it must be 1 to 4096 printable ASCII characters. Warns
 * (naming the file) when the file is readable by group or others. On
 * success *out is ferry__malloc'ed (free with ferry_free). */
int ferry__rpc_read_token(const char *path, char **out, ferry_error_t *err);

/* The bearer token of the call's "authorization: Bearer TOKEN" metadata:
 * a pointer into the call's metadata (valid during the handler) and its
 * length; NULL and 0 when the call carries none. Loop thread. */
const char *ferry__rpc_call_bearer(const ferry_rpc_call_t *call, size_t *len);

/* True when the `n` bytes at `a` equal the NUL-terminated `b`, in time
 * that depends on the lengths only (never on where they differ). */
bool ferry__rpc_token_equal(const char *a, size_t n, const char *b);

/* The same for two buffers of `n` bytes each. */
bool ferry__rpc_bytes_equal(const void *a, const void *b, size_t n);

/* Fills `buf` with `n` bytes from the kernel's random generator
 * (getrandom). Returns 0 or a negative errno value. */
int ferry__rpc_random(void *buf, size_t n);

/* True for a host that only this machine can reach: 127.0.0.0/8, ::1,
 * localhost. Daemons warn loudly when they serve plaintext elsewhere. */
bool ferry__rpc_host_is_loopback(const char *host);

/* ---- Diagnosis -------------------------------------------------------- */

/* What ferry__rpc_probe found at an address nobody answered a call on. */
typedef enum {
  FERRY_RPC_PROBE_UNKNOWN = 0, /* nothing conclusive (e.g. a slow server) */
  FERRY_RPC_PROBE_BAD_ADDRESS, /* not HOST:PORT (hostport.h) */
  FERRY_RPC_PROBE_UNRESOLVED,  /* the host name does not resolve */
  FERRY_RPC_PROBE_REFUSED,     /* nothing listens there */
  FERRY_RPC_PROBE_SILENT,      /* no connection accepted in time */
  FERRY_RPC_PROBE_TLS,         /* a TLS server (it hung up on plaintext) */
  FERRY_RPC_PROBE_PLAINTEXT,   /* a plaintext HTTP/2 (gRPC) server */
  FERRY_RPC_PROBE_OTHER        /* something that does not speak HTTP/2 */
} ferry_rpc_probe_t;

/* After a call to `target` ("HOST:PORT") failed as UNAVAILABLE or
 * DEADLINE_EXCEEDED: resolves the host (getaddrinfo), connects and sends
 * the plaintext HTTP/2 preface, within about `timeout_ms` in all, and
 * says what answered. `why` gets one clause naming the address (and the
 * resolver's reason), never bytes the peer sent. Blocking; any thread. */
ferry_rpc_probe_t ferry__rpc_probe(const char *target, int timeout_ms,
                                   char *why, size_t cap);

/* Forces `server` to re-read its TLS files at the next connection, even if
 * they look unchanged (SIGHUP). Any thread. No-op without TLS. */
void ferry__rpc_server_reload_tls(ferry_rpc_server_t *server);

#endif /* FERRY_RPC_H */
