/* The data-plane seam: how a worker streams Chunk messages to a client.
 *
 * The control plane (registration, heartbeats, leases) stays on gRPC
 * (rpc.h). Only the chunk stream goes through this header:
 * worker/stream.c and client/src/client_streams.c open, send and read
 * streams only through it, and never name a transport. An implementation
 * is two const tables of function pointers: its client side with a name,
 * capabilities and a priority (ferry_transport_ops_t) and its worker side
 * (ferry_transport_server_ops_t), both listed on one line of the registry
 * (common/src/transport/transport.c): ferry__transport_grpc ("grpc", over
 * rpc.h, keeping its TLS and bearer tokens) and, when built with UCX,
 * ferry__transport_ucx ("ucx", UCP), each with its _server table. The
 * worker starts every registered transport and publishes the endpoints
 * they return; the client picks one per worker with
 * ferry__transport_choose, whose rules (the job's choice, TLS, the
 * fallback before a first chunk) are the seam's, stated once below
 * ("Choosing").
 *
 * What travels is one ferry.v1.Chunk message per chunk (PROTOCOL.md): the
 * header bytes (fields 1-14 and the tag and length of field 15, the
 * payload) followed by the payload bytes. A transport moves those bytes
 * and never interprets them, except that it may keep the header and the
 * payload apart (the worker hands them over as separate pieces, and the
 * client reads them through one message view, see ferry_transport_msg_t).
 *
 * ---- Worker side (server) ------------------------------------------------
 *
 * Threads. A server belongs to a libuv loop (the worker's loop): every
 * server-side function below is called on that loop's thread, and every
 * server-side callback (on_open, on_sent, on_end, shutdown's done) runs
 * on it, except `release` (see ferry_transport_send_t), which runs on any
 * thread. An implementation that needs progress (UCX) hooks itself into
 * the loop (uv_poll on its event fd, uv_async for its own threads).
 *
 * Life of a stream:
 *   1. A client opens it with a request (job, client id, secret, bearer
 *      token). on_open runs with a new stream handle; the handler answers
 *      at once (before returning) or later on the loop: it either accepts
 *      (ferry__transport_accept, then sends) or refuses (finish with a
 *      status, without accept). Every stream handed to on_open must be finished
 * exactly once (ferry__transport_finish), also after on_end reported it dead;
 *      the handle stays valid until then and must not be used after.
 *   2. send: one chunk per call, as pieces pointing into the chunk pool
 *      (no copy). At most `window` sends (ferry__transport_window, >= 1;
 *      gRPC: 1) may be outstanding per stream: a send is outstanding from
 *      the call until its on_sent. on_sent(ok=1) means the transport took
 *      the message (it passed flow control: the caller may send one more),
 *      on_sent(ok=0) that it cannot be delivered (the peer is gone; stop
 *      sending and finish the stream). on_sent never runs for a send that
 *      returned an error, nor after finish was called.
 *   3. end: on_end runs at most once, on the loop, when the stream ended
 *      before it was finished: the client cancelled, its connection broke
 *      or its process died (noticed by the transport's keepalive within
 *      the heartbeat timeout at the latest), or the server is shutting
 *      down. It runs before the on_sent(ok=0) of sends that failed for
 *      that reason. The caller still has to finish the stream.
 *   4. finish(status, msg): ends the stream with a gRPC status code
 *      (FERRY_RPC_OK or FERRY_RPC_* from rpc.h, for every transport)
 *      and a message the client sees in its error. Sends still outstanding
 *      complete first (their release runs; their on_sent does not).
 *
 * Memory. The pieces of a send stay referenced by the transport until it
 * calls release(release_arg) exactly once, whether the send succeeds,
 * fails at once or fails later, possibly after on_sent ran and at the
 * latest when the server's shutdown completes; the caller frees the pool
 * slot there. release runs on any thread (a gRPC thread, a UCX progress
 * callback, the loop, or inside send itself on failure): keep it short,
 * thread-safe, and do not call back into the transport from it. on_sent
 * and on_end may call send, finish and accept on any stream.
 *
 * ---- Client side ---------------------------------------------------------
 *
 * Threads. A client context (ferry_transport_client_t) is created once per
 * ferry_client_t and shared by its streams; streams are opened from any
 * thread. A stream is read by one thread at a time (libferry runs one
 * reader thread per worker stream, blocked in next); cancel may be called
 * from any thread at any time before free. Nothing runs on a loop: the
 * client side is blocking, with bounded waits.
 *
 * Receiving. next() waits for the next message and fills a
 * ferry_transport_msg_t: a view of the message's `len` bytes (header then
 * payload) read through copy(). The chunk parser reads the header through
 * small copies, then the assembler copies payload ranges straight into the
 * staging ring's slots. This is the "header first, then tell me where the
 * payload goes" shape: an implementation that receives the header before
 * the payload (UCX active messages with rendezvous) may leave the payload
 * on the sender until the first copy() of a payload byte, then receive it
 * straight into that copy's dst when the copy covers the rest of the
 * payload, or into a bounce buffer otherwise. Payload ranges are usually
 * copied once each, in increasing order, but may be copied in any order,
 * more than once, or not at all (a dropped chunk); release must cope.
 *
 * ---- Addresses and endpoints ---------------------------------------------
 *
 * Every worker has a gRPC address ("host:port", its name in messages).
 * A transport may need more to reach it (FERRY_TRANSPORT_NEEDS_ADDRESS;
 * UCX: the UCP worker address): ferry__transport_server_address gives
 * those bytes on the worker, and the client passes them back to connect.
 * gRPC needs none (connects to the gRPC address). The worker publishes
 * one endpoint per transport it serves (name and address bytes, bounded
 * by the FERRY_TRANSPORT_*_MAX below) in its heartbeats; the dispatcher
 * checks them with ferry__transport_endpoints_check, keeps them and hands
 * them to clients with the worker's address, never reading them.
 *
 * ---- Choosing ------------------------------------------------------------
 *
 * A job asks for "auto" (the default) or a transport by name. By name:
 * that transport, if built in and the worker offers it, else an error.
 * auto: the offered transport of highest priority, skipping those that do
 * not encrypt when the client is configured for TLS, and those whose
 * stream to this worker failed before its first chunk (most likely they
 * cannot work between these two processes: another user's shared memory,
 * no common network transport). The lowest-priority offered transport is
 * the last resort and is never skipped for a failure. A transport that
 * needs no address is offered by every worker (it reaches the gRPC
 * address); one that needs an address, by a worker publishing it.
 */
#ifndef FERRY_TRANSPORT_H
#define FERRY_TRANSPORT_H

/* Bounds on what a worker publishes (its endpoints), which the worker
 * keeps to and the dispatcher enforces: address bytes per endpoint,
 * bytes of a transport's name, endpoints per worker. */
#define FERRY_TRANSPORT_ADDRESS_MAX 4096
#define FERRY_TRANSPORT_NAME_MAX 32
#define FERRY_TRANSPORT_ENDPOINTS_MAX 8

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "ferry/error.h"
#include "rpc.h"

typedef struct ferry_transport_ops_s ferry_transport_ops_t;
typedef struct ferry_transport_server_ops_s ferry_transport_server_ops_t;
typedef struct ferry_transport_server_s ferry_transport_server_t;
typedef struct ferry_transport_stream_s ferry_transport_stream_t;
typedef struct ferry_transport_client_s ferry_transport_client_t;
typedef struct ferry_transport_cstream_s ferry_transport_cstream_t;

/* Every object starts with its table, so the generic calls below dispatch
 * on it (an implementation embeds the struct as its first member). */
struct ferry_transport_server_s {
  const ferry_transport_server_ops_t *ops;
};
struct ferry_transport_stream_s {
  const ferry_transport_server_ops_t *ops;
  ferry_transport_server_t *server;
};
struct ferry_transport_client_s {
  const ferry_transport_ops_t *ops;
};
struct ferry_transport_cstream_s {
  const ferry_transport_ops_t *ops;
};

/* What a client asks for when it opens a stream (StreamChunksRequest's
 * fields plus the bearer token). Pointers are valid during on_open only;
 * copy what you keep. */
typedef struct ferry_transport_open_s {
  uint64_t job_id;
  uint64_t client_id;
  const uint8_t *secret; /* FERRY_CLIENT_SECRET_BYTES, or NULL: none or
                            a malformed one (refuse the stream) */
  const char *bearer;    /* the client token the caller presented (not
                            NUL-terminated), NULL: none */
  size_t bearer_len;
  const char *peer; /* for logs: the client's address, or NULL */
} ferry_transport_open_t;

/* One piece of a message: bytes the transport reads until release. */
typedef struct ferry_transport_piece_s {
  const void *ptr;
  size_t len;
} ferry_transport_piece_t;

/* One send: a Chunk message as pieces in order (the header, then the
 * payload; the payload piece is absent when empty). The transport may
 * treat pieces[n - 1] as the bulk payload (zero copy, registered memory)
 * and copy smaller earlier pieces at once. `release` (not NULL) runs
 * exactly once when the transport no longer reads any piece. */
#define FERRY_TRANSPORT_MAX_PIECES 4
typedef struct ferry_transport_send_s {
  ferry_transport_piece_t pieces[FERRY_TRANSPORT_MAX_PIECES];
  size_t n;
  void (*release)(void *release_arg);
  void *release_arg;
} ferry_transport_send_t;

/* Server-side callbacks (loop thread; see the contract above). `arg` is
 * the one given to ferry__transport_accept (on_open: the server's user). */
typedef void (*ferry_transport_open_cb)(ferry_transport_stream_t *s,
                                        const ferry_transport_open_t *req,
                                        void *user);
typedef void (*ferry_transport_sent_cb)(ferry_transport_stream_t *s, int ok,
                                        void *arg);
typedef void (*ferry_transport_end_cb)(ferry_transport_stream_t *s, void *arg);
typedef void (*ferry_transport_done_cb)(void *arg);

/* How a worker serves streams. Zero-initialise, set what applies. */
typedef struct ferry_transport_server_config_s {
  uv_loop_t *loop;                 /* the worker's loop (required) */
  ferry_rpc_server_t *rpc_server;  /* the worker's gRPC server, before its
                                      start: gRPC registers StreamChunks
                                      on it; others may ignore it */
  ferry_transport_open_cb on_open; /* required */
  void *user;                      /* passed to on_open */
  const char *host;                /* the address the worker binds (for
                                      transports that listen themselves) */
  int peer_timeout_ms;             /* a client silent this long is dead
                                      (on_end); 0: 10000 (gRPC: its
                                      keepalive settings rule) */
} ferry_transport_server_config_t;

/* How a client reaches workers (one per ferry_client_t). */
typedef struct ferry_transport_client_config_s {
  const ferry_rpc_options_t *rpc_opts; /* TLS, bearer token, keepalive
                                          (copied by gRPC; UCX may use the
                                          token) */
  int peer_timeout_ms;                 /* a worker silent this long is dead
                                          (next fails); 0: 10000 (gRPC:
                                          its keepalive, where rpc_opts
                                          leave it 0) */
  int slow_fetch_ms;                   /* UCX: a payload receive this slow
                                          marks a slow link, where the
                                          next payloads are fetched ahead
                                          of the reader; 0: the
                                          environment's
                                          FERRY_UCX_SLOW_FETCH_MS, else
                                          5 ms; < 0: every link */
} ferry_transport_client_config_t;

/* Where to open a stream: the worker's gRPC address (always; gRPC
 * connects there, others use it in messages) and the transport's own
 * address bytes from the dispatcher (NULL/0 for gRPC). */
typedef struct ferry_transport_peer_s {
  const char *name;
  const void *address;
  size_t address_len;
} ferry_transport_peer_t;

/* A received message (client side): `len` bytes, read through copy().
 * Filled by next, owned by the reader until its release. */
typedef struct ferry_transport_msg_s ferry_transport_msg_t;
struct ferry_transport_msg_s {
  size_t len; /* header and payload */
  /* Copies `n` bytes at byte `off` of the message into dst; returns the
   * bytes copied (fewer only at the end of the message, or 0 when the
   * payload could not be received: the stream then fails at the next
   * next()). Reader thread. */
  size_t (*copy)(const ferry_transport_msg_t *m, size_t off, void *dst,
                 size_t n);
  /* Gives the message back (the payload not copied is discarded); the
   * view is empty afterwards. Reader thread, before the next next(). */
  void (*release)(ferry_transport_msg_t *m);
  void *impl_[4]; /* the implementation's */
};

/* Capabilities (ferry_transport_ops_t.caps). */
enum {
  /* Carries the client's TLS (and so may run when TLS is configured). */
  FERRY_TRANSPORT_ENCRYPTS = 1u << 0,
  /* Reaches a worker through address bytes the worker publishes, not
   * through its gRPC address alone. */
  FERRY_TRANSPORT_NEEDS_ADDRESS = 1u << 1,
  /* Payloads go from registered memory to registered memory without a
   * copy (mem_map, client_mem_map). */
  FERRY_TRANSPORT_ZERO_COPY = 1u << 2,
};

/* A transport is two tables: its worker side (the server and its
 * streams) and its client side with its name, capabilities and priority.
 * They are apart so that libferry.so, which reaches only the client
 * tables, leaves every server out (linked with --gc-sections: nothing it
 * calls references a server table). */
struct ferry_transport_server_ops_s {
  const ferry_transport_ops_t *transport; /* its name, caps, priority */

  /* ---- Server (loop thread) ---- */
  /* Creates the server on cfg->loop; it serves once the worker's gRPC
   * server started (gRPC) or at once (others). */
  int (*server_new)(const ferry_transport_server_config_t *cfg,
                    ferry_transport_server_t **out, ferry_error_t *err);
  /* The address bytes clients need besides the gRPC address (*len 0 and
   * NULL: none). Valid until shutdown. */
  const void *(*server_address)(ferry_transport_server_t *srv, size_t *len);
  /* Ends every open stream (their on_end run; the owner must still
   * finish them), stops accepting, then calls done(arg) (may be NULL) on
   * the loop once every stream was finished and every release ran; the
   * server is freed then. gRPC: call it after the gRPC server's shutdown
   * completed (that shutdown ends the calls and releases their pieces;
   * the handler stays registered until then). */
  void (*server_shutdown)(ferry_transport_server_t *srv,
                          ferry_transport_done_cb done, void *arg);
  /* Optional (NULL: not needed): registers a region of the chunk pool for
   * zero-copy sends; *memh is passed back to unmap. */
  int (*mem_map)(ferry_transport_server_t *srv, void *ptr, size_t len,
                 void **memh, ferry_error_t *err);
  void (*mem_unmap)(ferry_transport_server_t *srv, void *memh);

  /* Accepts an opened stream: on_sent and on_end (either may be NULL)
   * get `arg`. If the stream already ended, on_end runs before this
   * returns. */
  void (*accept)(ferry_transport_stream_t *s, ferry_transport_sent_cb on_sent,
                 ferry_transport_end_cb on_end, void *arg);
  /* Sends per the contract: FERRY_EINVAL (window full, stream finished,
   * not accepted) or FERRY_ECANCELED (the stream ended); release has run
   * or will run either way. */
  int (*send)(ferry_transport_stream_t *s, const ferry_transport_send_t *m);
  /* How many sends may be outstanding (constant per stream, >= 1). */
  unsigned (*window)(const ferry_transport_stream_t *s);
  /* True once the stream ended early (on_end ran or is about to). */
  bool (*ended)(const ferry_transport_stream_t *s);
  /* Ends the stream with `status` (FERRY_RPC_*) and `msg` (copied; may
   * be NULL). Exactly once per stream; `s` is invalid afterwards. */
  void (*finish)(ferry_transport_stream_t *s, int status, const char *msg);
};

struct ferry_transport_ops_s {
  const char *name; /* [a-z0-9_]+, under FERRY_TRANSPORT_NAME_MAX */
  unsigned caps;    /* FERRY_TRANSPORT_* capabilities */
  int priority;     /* auto prefers the highest that applies */

  /* ---- Client (any thread) ---- */
  int (*client_new)(const ferry_transport_client_config_t *cfg,
                    ferry_transport_client_t **out, ferry_error_t *err);
  /* After every stream of the client was freed. NULL-safe. */
  void (*client_free)(ferry_transport_client_t *cl);
  /* Optional: registers client memory payloads are received into (the
   * staging ring; pinned in GPU mode). */
  int (*client_mem_map)(ferry_transport_client_t *cl, void *ptr, size_t len,
                        void **memh, ferry_error_t *err);
  void (*client_mem_unmap)(ferry_transport_client_t *cl, void *memh);
  /* Connects to `peer` and opens a stream with `req` (job, client id,
   * secret; bearer ignored: the client's configured token is sent).
   * Returns quickly: a peer that cannot be reached fails at next(). */
  int (*open)(ferry_transport_client_t *cl, const ferry_transport_peer_t *peer,
              const ferry_transport_open_t *req,
              ferry_transport_cstream_t **out, ferry_error_t *err);
  /* Waits at most timeout_ms (< 0: no limit) for the next message: 0 with
   * *msg filled (release it before the next call), FERRY_EOF when the
   * worker finished with OK, FERRY_EGRPC_* when the stream failed (the
   * worker's finish status maps through ferry__rpc_err_from_status on every
   * transport; err names the peer and carries the worker's message), or
   * FERRY_ETIMEDOUT (call again). After FERRY_EOF or an error every later
   * call returns the same. */
  int (*next)(ferry_transport_cstream_t *s, ferry_transport_msg_t *msg,
              int timeout_ms, ferry_error_t *err);
  /* Makes a blocked or later next return FERRY_EGRPC_CANCELLED and tells
   * the worker (its on_end runs). Thread-safe, any time before free. */
  void (*cancel)(ferry_transport_cstream_t *s);
  /* Cancels if still running, waits for the transport to let go, frees.
   * NULL-safe. */
  void (*cstream_free)(ferry_transport_cstream_t *s);
};

/* The implementations' tables. The UCX ones exist when FERRY_HAVE_UCX;
 * FERRY__TRANSPORT_UCX and FERRY__TRANSPORT_UCX_SERVER are they or NULL,
 * for the registry. */
extern const ferry_transport_ops_t ferry__transport_grpc;
extern const ferry_transport_server_ops_t ferry__transport_grpc_server;
#ifdef FERRY_HAVE_UCX
extern const ferry_transport_ops_t ferry__transport_ucx;
extern const ferry_transport_server_ops_t ferry__transport_ucx_server;
#define FERRY__TRANSPORT_UCX (&ferry__transport_ucx)
#define FERRY__TRANSPORT_UCX_SERVER (&ferry__transport_ucx_server)
#else
#define FERRY__TRANSPORT_UCX NULL
#define FERRY__TRANSPORT_UCX_SERVER NULL
#endif

/* ---- The registry ---- */

/* The most transports a build registers. */
#define FERRY_TRANSPORTS_MAX 8

/* How many transports this build has (the registry's entries that were
 * built in), and the one at registry position i (< ferry__transport_count(),
 * else NULL); positions are fixed at build time, so callers index
 * per-transport state by them. */
size_t ferry__transport_count(void);
const ferry_transport_ops_t *ferry__transport_at(size_t i);
/* The worker side of the transport at registry position i (the worker's
 * call: libferry.so leaves it and every server out). */
const ferry_transport_server_ops_t *ferry__transport_server_at(size_t i);
/* The position of the transport called `name`, or -1 when unknown or not
 * built in. */
int ferry__transport_index(const char *name);
/* The table called `name`, or NULL when unknown or not built in. */
const ferry_transport_ops_t *ferry__transport_find(const char *name);

/* One endpoint a worker publishes: a transport's name and its address
 * bytes (none for a transport that needs no address). */
typedef struct ferry_transport_endpoint_s {
  const char *transport; /* not NUL-terminated: transport_len bytes */
  size_t transport_len;
  const void *address;
  size_t address_len;
} ferry_transport_endpoint_t;

/* Checks a list of published endpoints against the bounds above: at most
 * FERRY_TRANSPORT_ENDPOINTS_MAX, each name 1 to FERRY_TRANSPORT_NAME_MAX
 * bytes of [a-z0-9_] and named once, each address at most
 * FERRY_TRANSPORT_ADDRESS_MAX bytes. Names need not be registered here (a
 * worker may serve what this build lacks). FERRY_EINVAL naming the
 * endpoint's position and field otherwise. */
int ferry__transport_endpoints_check(const ferry_transport_endpoint_t *e,
                                     size_t n, ferry_error_t *err);

/* ---- Choosing (see "Choosing" above) ---- */

/* Checks a job's transport option: NULL, "", "auto" or the name of a
 * transport built in. FERRY_ENOTSUP for a registered transport this
 * build left out (err names its CMake option), FERRY_EINVAL for an
 * unknown name (err lists the choices). */
int ferry__transport_want_check(const char *want, ferry_error_t *err);

/* The client's choice for one worker. */
typedef struct ferry_transport_choice_s {
  int index;           /* registry position */
  const void *address; /* the endpoint's address bytes (NULL/0: none) */
  size_t address_len;
  char why[160]; /* for the log: what was chosen and why */
} ferry_transport_choice_t;

/* Picks the transport for a stream to a worker that published
 * `offered[0..n)`: `want` is the job's option, `tls` whether the client
 * is configured for TLS, `failed` a bit per registry position whose
 * stream to this worker failed before its first chunk. 0 with *out
 * filled, or FERRY_ENOTSUP (a transport asked for by name that is not
 * built in or not offered) / FERRY_EINVAL (an unknown name) with err. */
int ferry__transport_choose(const char *want, bool tls,
                            const ferry_transport_endpoint_t *offered, size_t n,
                            uint32_t failed, ferry_transport_choice_t *out,
                            ferry_error_t *err);

/* The fallback rule: whether a stream on registry position `index` that
 * ended with an error after `chunks` chunks makes auto avoid that
 * transport for that worker from now on (its bit in choose's `failed`).
 * True when the job asked for auto and nothing came. */
bool ferry__transport_falls_back(const char *want, int index, uint64_t chunks);

/* Generic calls: dispatch through the object's table. */
static inline void ferry__transport_accept(ferry_transport_stream_t *s,
                                           ferry_transport_sent_cb on_sent,
                                           ferry_transport_end_cb on_end,
                                           void *arg) {
  s->ops->accept(s, on_sent, on_end, arg);
}
static inline int ferry__transport_send(ferry_transport_stream_t *s,
                                        const ferry_transport_send_t *m) {
  return s->ops->send(s, m);
}
static inline unsigned
ferry__transport_window(const ferry_transport_stream_t *s) {
  return s->ops->window(s);
}
static inline bool ferry__transport_ended(const ferry_transport_stream_t *s) {
  return s->ops->ended(s);
}
static inline void ferry__transport_finish(ferry_transport_stream_t *s,
                                           int status, const char *msg) {
  s->ops->finish(s, status, msg);
}
static inline const void *
ferry__transport_server_address(ferry_transport_server_t *srv, size_t *len) {
  return srv->ops->server_address(srv, len);
}
static inline void
ferry__transport_server_shutdown(ferry_transport_server_t *srv,
                                 ferry_transport_done_cb done, void *arg) {
  srv->ops->server_shutdown(srv, done, arg);
}
static inline int ferry__transport_next(ferry_transport_cstream_t *s,
                                        ferry_transport_msg_t *msg,
                                        int timeout_ms, ferry_error_t *err) {
  return s->ops->next(s, msg, timeout_ms, err);
}
static inline void ferry__transport_cancel(ferry_transport_cstream_t *s) {
  s->ops->cancel(s);
}
static inline void ferry__transport_cstream_free(ferry_transport_cstream_t *s) {
  if (s != NULL)
    s->ops->cstream_free(s);
}
/* NULL-safe for a message next did not fill (release NULL). */
static inline void ferry__transport_msg_release(ferry_transport_msg_t *msg) {
  if (msg != NULL && msg->release != NULL)
    msg->release(msg);
}

#endif /* FERRY_TRANSPORT_H */
