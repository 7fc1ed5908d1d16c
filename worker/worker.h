/* ferry-worker internals: the data-plane daemon (docs/ARCHITECTURE.md,
 * "The service" and "Chunks").
 *
 *   heartbeat thread --Tasks--> task table --> pipeline threads
 *        (heartbeat.c)          (tasks.c)        (run.c: read, order,
 *                                                  pipeline, pack chunks)
 *   pipeline threads --chunks--> inbox --uv_async--> loop thread
 *                                                   (stream.c: one queue
 *                                                   per (job, client), one
 *                                                   send in flight per
 *                                                   StreamChunks call)
 *
 * Threads and ownership.
 * - The libuv loop thread owns the RPC server, the stream queues and the
 *   calls (no lock). Other threads reach it only through the inbox
 *   (ferry__winbox_*: a mutex-protected list plus uv_async_send).
 * - The task table (ferry__wtasks_t) is shared by the heartbeat thread,
 *   the pipeline threads and the loop; its mutex guards the task list, the
 *   pending queue, every task's progress fields and the pipeline cache.
 * - The chunk pool (ferry__wpool_t) has its own mutex and condvar; chunk
 *   buffers go back to it from any thread (gRPC's slice free callbacks).
 *   It also keeps one key per stream (job, client): the bytes its chunks
 *   hold, bounded by the stream's share of the pool (ferry__wpool_share).
 * - Isolation: a pipeline thread never waits on a full share or a full
 *   pool. The task parks (its run state: reader, position, the one record
 *   already processed) and the thread takes another; the release of one
 *   of the stream's chunks (or any chunk, when the whole pool was full)
 *   puts it back at the head of the pending queue. So a stalled client
 *   holds at most its share and no thread.
 * - A task is reference-counted (atomic): the table, the thread running it
 *   and each of its chunks hold one. Its `cancelled` flag is atomic.
 *
 * Lock order: tasks -> pool. The tasks lock is held while the pool's is
 * taken (park, unpark, wake_parked: the parked count), never the other
 * way: the pool calls its release callback (wake_parked, which takes the
 * tasks lock) after dropping its own, counted in in_cb. The inbox mutex
 * and the heartbeat thread's hb_lock are leaves: nothing else is taken
 * while one is held, and neither is taken under tasks or pool
 * (ferry__wtasks_mark_resend drops the tasks lock before it wakes the
 * heartbeat).
 */
#ifndef FERRY_WORKER_H
#define FERRY_WORKER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "chunk.h"
#include "ferry/error.h"
#include "ferry/v1/dispatcher.pb-c.h"
#include "ferry/v1/worker.pb-c.h"
#include "imgops.h"
#include "pipeline.h"
#include "roots.h"
#include "rpc.h"
#include "rpc_methods.h"
#include "transport.h"
#include "cache.h"
#include "share.h"

/* Settings (the options table in main.c fills this). */
typedef struct ferry__wconfig_s {
  char *dispatcher;      /* host:port; NULL or "": no heartbeats (tests) */
  int64_t port;          /* 0: any */
  char *host;            /* bind address */
  char *advertise;       /* host the dispatcher gives to clients */
  int64_t threads;       /* pipeline threads; 0: one per core */
  uint64_t buffer_bytes; /* chunk pool bound */
  int64_t jpeg_max_pixels; /* per image; 0: no limit */
  int64_t jpeg_max_scans;  /* per image; 0: no limit */
  uint64_t decode_bytes;   /* all pipeline threads' decodes; 0: buffer */
  int64_t heartbeat_ms;
  uint64_t chunk_bytes;  /* target chunk payload size */
  char *spill_dir;       /* shuffled compressed shards; NULL: $TMPDIR */
  char *cache_dir;       /* the prefix cache; NULL: none */
  uint64_t cache_bytes;  /* its bound */
  uint64_t share_bytes;  /* the shared-production window; 0: off */
  char *data_roots;      /* --data-root, one per line; NULL: any file */
  char *config;
  int log_level;
  bool help;
  bool version;          /* --version: print it and exit */
  /* TLS: the Worker service serves TLS with tls_cert/tls_key
   * (tls_client_auth: clients need a certificate signed by tls_ca); the
   * channel to the dispatcher uses TLS when tls_ca is set (verifying the
   * dispatcher with it, presenting tls_cert/tls_key as client cert). */
  char *tls_cert, *tls_key, *tls_ca;
  bool tls_client_auth;
  char *worker_token_file; /* sent to the dispatcher as a bearer token */
  char *client_token_file; /* StreamChunks callers must send it (NULL:
                              open; the client secret still applies) */
  int64_t metrics_port;    /* -1: no metrics server */
  char *metrics_host;      /* NULL: host */
  /* gRPC connection lifetimes (ferry_rpc_options_t); 0: never. */
  int64_t idle_connection_ms, connection_age_ms, handshake_timeout_ms;
  /* Tests only: each record's processing takes this much longer (a
   * producer slower than --client-stall-ms without huge images). */
  int64_t test_record_delay_ms;
} ferry__wconfig_t;

/* ---- Chunk pool and chunks (pool.c, chunk.c) ----------------------------- */

typedef struct ferry__wtask_s ferry__wtask_t;
typedef struct ferry__wpool_s ferry__wpool_t;

/* One stream (job, client) as the pool sees it. Counts under the pool
 * lock; stall_since_ms is written by the loop thread (stream.c) and read
 * by the heartbeat thread. */
typedef struct ferry__wkey_s {
  struct ferry__wkey_s *next;
  uint64_t job_id, client_id;
  int refs;      /* tasks, queues and chunks pointing here */
  int tasks;     /* live tasks: the stream is active while > 0 */
  uint64_t used; /* bytes in its chunks handed out */
  /* CLOCK_MONOTONIC ms since when the stream has had chunks queued or in
   * flight without gRPC taking one; 0 while it flows or is empty. */
  atomic_int_least64_t stall_since_ms;
  /* Whether the client has a stream open to this worker, and when it last
   * had one (CLOCK_MONOTONIC ms; 0: never), both written by the loop
   * thread. A task of a key without a stream does not start (the daemon
   * gates tasks on it), and TaskProgress.unread_ms counts from here. */
  atomic_bool reader;
  atomic_int_least64_t read_ms;
  /* Tasks of the stream holding run state (started, not ended), under the
   * tasks lock: at most FERRY__WKEY_MAX_RUNS, so no client's tasks hold
   * more than that many readers and records whatever it asks for. */
  int runs;
} ferry__wkey_t;

/* Started tasks one stream may hold at once (ferry__wkey_t.runs). */
#define FERRY__WKEY_MAX_RUNS 8

/* A chunk: up to `cap` records of one split, laid out in one pool block:
 * this struct, the packed header area, labels, ids, then the payload. */
typedef struct ferry__wchunk_s {
  struct ferry__wchunk_s *next; /* queue link (inbox, stream queue) */
  ferry__wpool_t *pool;
  size_t block_size;            /* the whole block, for the pool's count */
  ferry__wtask_t *task;         /* a reference; NULL once handed to gRPC */
  ferry__wkey_t *key;           /* a reference; NULL for unkeyed acquires */

  uint64_t job_id, client_id, lease;
  uint32_t epoch, split;
  uint64_t first;     /* position of the first record in split order */
  uint32_t count, cap;
  int h, w, c;
  size_t rec_bytes;   /* h * w * c */
  bool last;
  int error_code;
  char *error;        /* in the block; "" when none */
  int64_t *labels, *ids;
  uint8_t *payload;
  uint8_t *hdr;       /* packed header, then payload tag and length */
  size_t hdr_cap;
  /* The encoded message (ferry__wchunk_encode): the header in hdr, then
   * the payload when not empty. */
  ferry_chunk_piece_t pieces[FERRY_CHUNK_MAX_PIECES];
  size_t n_pieces;
  /* A view: payload points into memory the chunk does not own (a shared
   * production window's chunk); view_release(view_arg) at release. */
  void (*view_release)(void *arg);
  void *view_arg;
} ferry__wchunk_t;

/* The pool of chunk blocks, bounded in bytes: blocks handed out plus free
 * blocks kept for reuse never exceed `cap` (except one block larger than
 * the cap when nothing else is out, so a huge record cannot deadlock, and
 * record-less chunks: `last` and error markers of ~1.6 KiB). Keyed
 * acquires also keep each stream within its share. */
struct ferry__wpool_s {
  pthread_mutex_t lock;
  pthread_cond_t cv;
  uint64_t cap;
  uint64_t used;   /* bytes in blocks handed out */
  uint64_t cached; /* bytes in free blocks */
  ferry__wchunk_t *free_list;
  uint64_t waits;  /* times an acquire had to wait (tests, stats) */
  ferry__wkey_t *keys;
  uint64_t gen;    /* releases so far (parking races) */
  int parked;      /* tasks parked on the pool (the task table's count) */
  int in_cb;       /* on_release calls running */
  /* Called after a release while tasks are parked (no lock held). */
  void (*on_release)(void *arg, uint64_t job_id, uint64_t client_id);
  void *on_release_arg;
};

int ferry__wpool_init(ferry__wpool_t *p, uint64_t cap);
/* Frees the free blocks; every block must have been released. */
void ferry__wpool_close(ferry__wpool_t *p);

/* A chunk for `cap` records of `rec_bytes` each (header fields zeroed).
 * Blocks while the pool is full until a release makes room or `*cancel_a`
 * or `*cancel_b` (either may be NULL) becomes true: then NULL. Also NULL
 * when out of memory (*oom set). */
ferry__wchunk_t *ferry__wpool_acquire(ferry__wpool_t *p, uint32_t cap,
                                      size_t rec_bytes,
                                      const atomic_bool *cancel_a,
                                      const atomic_bool *cancel_b,
                                      bool *oom);
/* The stream's key, created at the first reference; `task` also counts a
 * live task (the stream is active). NULL when out of memory. */
ferry__wkey_t *ferry__wpool_key_get(ferry__wpool_t *p, uint64_t job_id,
                                    uint64_t client_id, bool task);
void ferry__wpool_key_put(ferry__wpool_t *p, ferry__wkey_t *k, bool task);
/* The bytes stream `k` may hold in blocks of `need` bytes: the cap divided
 * by one more than the number of active streams (live tasks or chunks
 * out, `k` included; one share stays free for a stream that becomes
 * active), at least two blocks (one chunk filling while one is sent). */
uint64_t ferry__wpool_share(ferry__wpool_t *p, ferry__wkey_t *k, size_t need);
/* Live tasks of the stream `k` on this worker (its chunks may still be out). */
int ferry__wpool_key_tasks(ferry__wpool_t *p, ferry__wkey_t *k);
/* Like ferry__wpool_acquire for stream `key` (NULL: no share), within its
 * share. Record-less chunks (cap 0) are always granted. With `wait` false
 * it returns NULL at once when the share or the pool is full: then *gen is
 * the pool's release count seen and *key_full says which bound it was. */
ferry__wchunk_t *ferry__wpool_acquire_key(ferry__wpool_t *p,
                                          ferry__wkey_t *key, uint32_t cap,
                                          size_t rec_bytes, bool wait,
                                          const atomic_bool *cancel_a,
                                          const atomic_bool *cancel_b,
                                          uint64_t *gen, bool *key_full,
                                          bool *oom);
/* Returns a block (any thread). Drops the chunk's task and key
 * references; wakes the tasks parked on its stream or on the pool. */
void ferry__wpool_release(ferry__wchunk_t *c);
/* Wakes every waiter so it rechecks its cancel flags. */
void ferry__wpool_wake(ferry__wpool_t *p);
/* Bytes handed out (for heartbeats and tests). */
uint64_t ferry__wpool_used(ferry__wpool_t *p);

/* Block size needed for `cap` records of `rec_bytes` (chunk.c). */
size_t ferry__wchunk_block_size(uint32_t cap, size_t rec_bytes);
/* Lays a chunk out in a block of at least that size (chunk.c). */
ferry__wchunk_t *ferry__wchunk_layout(void *block, size_t block_size,
                                      uint32_t cap, size_t rec_bytes);

/* Encodes the message with ferry__chunk_encode (chunk.h): the
 * header into c->hdr, and c->pieces / c->n_pieces the message (the
 * header, then payload[0, count * rec_bytes) when not empty, not copied).
 * Returns 0 or FERRY_ERANGE. */
int ferry__wchunk_encode(ferry__wchunk_t *c);

/* ---- Tasks (tasks.c; one task's run: run.c) ------------------------------ */

/* WT_HELD: not started, waiting for its client's stream to open or for a
 * run slot of its stream (the gate; no run state, no thread). */
typedef enum {
  WT_PENDING, WT_RUNNING, WT_PARKED, WT_DONE, WT_HELD
} ferry__wtask_state_t;

/* A compiled pipeline shared by tasks with the same spec bytes. */
typedef struct ferry__wpipe_s {
  struct ferry__wpipe_s *next;
  uint8_t *spec_bytes;
  size_t spec_len;
  uint64_t id;          /* unique, keys the threads' ctx caches */
  ferry_spec_t spec;
  ferry_pipeline_t *pipeline;
  int refs;             /* tasks and thread ctxs using it (tasks lock) */
  ferry__wpolicy_t *pol; /* the prefix cache's policy; NULL: no cache */
  /* No op drawn per epoch (the whole pipeline is its deterministic
   * prefix): unshuffled, every epoch's records are the same. */
  bool deterministic;
} ferry__wpipe_t;

struct ferry__wtask_s {
  struct ferry__wtask_s *next;  /* the table's list */
  struct ferry__wtask_s *qnext; /* the pending queue or the parked list */
  atomic_int refs;
  atomic_bool cancelled;

  /* Immutable after creation. */
  uint64_t job_id, client_id, lease;
  uint32_t epoch, split;
  uint32_t file_index;
  uint64_t byte_offset, first_record, num_records, byte_end;
  char *file;
  uint64_t start;
  uint64_t end; /* Task.end: 0, or where the task ends in split order */
  bool shuffle;
  uint64_t seed;
  int policy;               /* FERRY_ON_ERROR_* */
  bool share;               /* Task.share: its job shares production */
  ferry__wpipe_t *pipe;     /* NULL when the spec did not compile */
  ferry__wpool_t *pool;
  ferry__wkey_t *key;       /* its stream's key (a task reference) */
  uint8_t secret[FERRY_CLIENT_SECRET_BYTES]; /* Task.client_secret: only a
                               stream that carries it gets the chunks */
  bool has_secret;

  /* The run state while started and not ended (the thread running it, or
   * nobody while parked or queued again); freed with the task. */
  struct ferry__wrun_s *run;
  bool park_pool;           /* parked on the whole pool, not its share */
  /* Parked waiting for this shared-production entry's producer (tasks
   * lock); NULL otherwise. */
  ferry__wshare_entry_t *share_wait;
  bool has_run_slot;        /* counted in key->runs (tasks lock) */
  int64_t added_ms;         /* CLOCK_MONOTONIC ms when it was added */
  bool key_active;          /* counted in key->tasks (until it ends) */
  /* The stream its last chunk went out on (ferry__worker_t.call_gen; 0:
   * none yet), and whether that stream then ended early, so the client
   * may never have got them (TaskProgress.resend). Loop thread writes,
   * the heartbeat thread reads. */
  atomic_uint_least64_t sent_gen;
  atomic_bool resend;
  /* Progress (tasks lock). */
  ferry__wtask_state_t state;
  uint64_t produced; /* positions done, counted from 0 */
  uint64_t skipped;
  bool finished;
  int error_code;
  bool worker_fault; /* error_code is this worker's fault (run.c) */
  char error[512];
};

/* Where finished chunks go: the loop's inbox in the daemon, a list in
 * tests. Called from pipeline threads, in split order per task. */
typedef void (*ferry__wemit_cb)(ferry__wchunk_t *c, void *arg);

/* Called from a pipeline thread (no lock held) when a task it ran ended:
 * finished, failed or stopped. `news` is true when the dispatcher wants to
 * hear of it soon: an error, skipped records, or a total it cannot know
 * from the split (unknown count, or fewer records than the split holds). */
typedef void (*ferry__wend_cb)(void *arg, bool news);

typedef struct ferry__wtasks_s {
  pthread_mutex_t lock;
  pthread_cond_t cv;   /* a task was queued, or stop */
  ferry__wtask_t *list;
  ferry__wtask_t *qhead, *qtail;
  ferry__wtask_t *parked;  /* parked tasks (linked by qnext) */
  ferry__wtask_t *held;    /* WT_HELD tasks (linked by qnext) */
  /* The daemon's gate: a task starts only while its client has a stream
   * open here (ferry__wtasks_reader_opened), and its stream has fewer
   * than FERRY__WKEY_MAX_RUNS started tasks. Off in tests without
   * streams. */
  bool gate;
  char *spill_dir;         /* owned copy; NULL: $TMPDIR or /tmp */
  ferry_roots_t roots;     /* files a task may open (none: any) */
  /* The JPEG limits every ctx gets (jpeg_set; else the decoder's
   * defaults); max_bytes is decode_bytes / threads, set by start. */
  ferry_jpeg_limits_t jpeg;
  uint64_t decode_bytes;
  bool jpeg_set;
  ferry__wpipe_t *pipes;
  uint64_t next_pipe_id;
  atomic_bool stop;
  bool draining;       /* take no new tasks */
  ferry__wpool_t *pool;
  uint64_t chunk_bytes;
  int64_t test_record_delay_ms; /* --test-record-delay-ms (tests only) */
  ferry__wcache_t *cache;  /* the prefix cache (--cache-dir); NULL: none */
  ferry__wshare_t *share;  /* the shared-production window; NULL: none */
  ferry__wemit_cb emit;
  void *emit_arg;
  ferry__wend_cb on_end; /* may be NULL; set before the threads start */
  void *end_arg;
  pthread_t *threads;
  struct ferry__wthread_s **thread_states;
  size_t nthreads; /* started; read by the heartbeat thread, fixed after
                    * start (stop leaves it) */
} ferry__wtasks_t;

int ferry__wtasks_init(ferry__wtasks_t *t, ferry__wpool_t *pool,
                       uint64_t chunk_bytes, ferry__wemit_cb emit,
                       void *emit_arg);
/* Starts `n` pipeline threads. */
int ferry__wtasks_start(ferry__wtasks_t *t, size_t n, ferry_error_t *err);
/* Cancels every task, stops and joins the threads. Idempotent. */
void ferry__wtasks_stop(ferry__wtasks_t *t);
/* Stops, then frees every task and pipeline. */
void ferry__wtasks_close(ferry__wtasks_t *t);

/* Adds a task from the dispatcher (fields copied) and queues it, unless
 * one with the same (job, epoch, split, lease) exists or the table is
 * draining. Returns 1 when added, 0 when ignored, or FERRY_ENOMEM. A spec
 * that does not compile gives a task that reports the error at once. */
int ferry__wtasks_add(ferry__wtasks_t *t, const Ferry__V1__Task *task);
/* Cancels the task (it stops at its next record, its chunks are dropped)
 * and forgets it. Returns true when it was known. */
bool ferry__wtasks_cancel(ferry__wtasks_t *t, uint64_t job_id,
                          uint32_t epoch, uint32_t split, uint64_t lease);
/* The client (job, client) opened a stream: its held tasks are queued. */
void ferry__wtasks_reader_opened(ferry__wtasks_t *t, uint64_t job_id,
                                 uint64_t client_id);
/* Marks the table draining: no new tasks from now on. */
void ferry__wtasks_drain(ferry__wtasks_t *t);

/* A copy of one task's progress (tests). Returns false when unknown. */
/* (TaskProgress.stalled_ms in heartbeats comes from the task's key.) */
typedef struct ferry__wprogress_s {
  ferry__wtask_state_t state;
  uint64_t produced, skipped;
  bool finished;
  int error_code;
  char error[512];
} ferry__wprogress_t;
bool ferry__wtasks_progress(ferry__wtasks_t *t, uint64_t job_id,
                            uint32_t epoch, uint32_t split, uint64_t lease,
                            ferry__wprogress_t *out);

/* Fills `req->tasks` with every task's progress, allocated in one block
 * returned in *mem (ferry__free it after packing). */
int ferry__wtasks_report(ferry__wtasks_t *t,
                         Ferry__V1__WorkerHeartbeatRequest *req, void **mem);

void ferry__wtask_unref(ferry__wtask_t *task);

/* Marks for TaskProgress.resend the live tasks of (job, client) whose
 * last chunk went out on the stream numbered `gen`, which ended early.
 * Returns how many it marked. */
size_t ferry__wtasks_mark_resend(ferry__wtasks_t *t, uint64_t job_id,
                                 uint64_t client_id, uint64_t gen);

/* Sets the directory of spill files (copied; NULL: $TMPDIR or /tmp). A
 * shuffled GZIP/ZLIB split is inflated once into an unlinked spill file
 * there and read back record by record in its permutation, so a worker's
 * memory stays within --buffer-bytes plus 40 bytes per record of the
 * split (docs/ARCHITECTURE.md). */
int ferry__wtasks_set_spill_dir(ferry__wtasks_t *t, const char *dir);

/* Sets the data roots (`list`: one per line, NULL: none, any file); a
 * task whose file resolves outside them fails with FERRY_EACCES before
 * anything is opened. Returns 0 or FERRY_EINVAL naming a bad root. */
int ferry__wtasks_set_roots(ferry__wtasks_t *t, const char *list,
                            ferry_error_t *err);

/* Runs one task to its end on the calling thread with `ctxs`, a thread's
 * ctx cache (exported for tests that drive a task without threads). Waits
 * when its share is full instead of parking. */
typedef struct ferry__wthread_s ferry__wthread_t;
ferry__wthread_t *ferry__wthread_new(ferry__wtasks_t *t);
void ferry__wthread_free(ferry__wthread_t *th);
void ferry__wthread_run_task(ferry__wthread_t *th, ferry__wtask_t *task);

/* The record order of a split: out[0..n) becomes the identity, or with
 * shuffle a Fisher-Yates permutation driven by splitmix64 whose state
 * starts at mix(seed ^ mix(epoch * G1 + 1) ^ mix(split * G2 + 2)) (mix: the
 * splitmix64 output function; G1, G2: odd 64-bit constants), taking each
 * draw modulo i + 1. Deterministic on every machine. */
void ferry__wshuffle(uint64_t *out, uint64_t n, bool shuffle, uint64_t seed,
                     uint32_t epoch, uint32_t split);

/* ---- The daemon (worker.c, stream.c, heartbeat.c) ------------------------ */

typedef struct ferry__wqueue_s ferry__wqueue_t;


typedef struct ferry__worker_s {
  ferry__wconfig_t cfg;
  uv_loop_t *loop;
  ferry_rpc_server_t *server;
  int port;
  char address[300]; /* advertise:port */

  ferry__wpool_t pool;
  ferry__wtasks_t tasks;
  ferry__wcache_t cache; /* open when cfg.cache_dir is set */
  bool cache_on;
  ferry__wshare_t share; /* the window, when cfg.share_bytes > 0 */
  bool share_on;

  /* Inbox: pipeline and heartbeat threads -> loop. */
  pthread_mutex_t inbox_lock;
  uv_async_t inbox_async;
  ferry__wchunk_t *inbox_head, *inbox_tail;
  bool inbox_purge;   /* drop chunks of cancelled tasks */
  bool inbox_stop;    /* begin shutdown */
  bool inbox_closed;  /* the async handle is closing */
  bool async_on;      /* loop-owned */

  ferry__wqueue_t *queues; /* loop-owned */
  uint64_t call_gen;       /* loop-owned: numbers the streams opened */
  /* The data-plane transports clients open streams through (stream.c),
   * by registry position (NULL: it did not start), and the endpoints the
   * heartbeats publish for them (set once before the heartbeat thread
   * starts, read by it, freed by ferry__worker_close after its join). */
  ferry_transport_server_t *transports[FERRY_TRANSPORTS_MAX];
  Ferry__V1__TransportEndpoint endpoint_msgs[FERRY_TRANSPORTS_MAX];
  Ferry__V1__TransportEndpoint *endpoints[FERRY_TRANSPORTS_MAX];
  size_t n_endpoints;
  bool stopping;           /* loop-owned */
  bool server_done;
  uv_signal_t sigterm, sigint;
  bool signals_on;

  /* Heartbeat thread. */
  pthread_t hb_thread;
  atomic_bool hb_started; /* set before the loop runs; cleared by the join,
                           which a test may call off the loop */
  pthread_mutex_t hb_lock;
  pthread_cond_t hb_cv;
  bool hb_quit;        /* hb_lock */
  bool hb_wake;        /* hb_lock: a task ended since the last report */
  bool hb_news;        /* hb_lock: ... with news for the dispatcher */
  bool hb_cancelled;   /* hb_lock: hb_call was cancelled for news or quit */
  ferry_rpc_stream_t *hb_call; /* hb_lock: the heartbeat in flight, which
                                * the dispatcher may hold back */
  atomic_bool draining;
  atomic_uint_least64_t worker_id;
  atomic_int heartbeat_ms;
  atomic_uint_least64_t heartbeats_ok;
  char *worker_token; /* Read from cfg.worker_token_file */
  char *client_token; /* ... and cfg.client_token_file */
  uv_signal_t sighup; /* forces a TLS reload (with signals_on) */
} ferry__worker_t;

/* Sets up everything on `loop` and binds the Worker service on
 * cfg->host:cfg->port (the bound port in w->port); starts the pipeline
 * threads and, when cfg->dispatcher is set, the heartbeat thread. With
 * `signals` it also handles SIGTERM and SIGINT. Loop thread. On failure
 * call ferry__worker_close after the loop ran out. */
int ferry__worker_start(ferry__worker_t *w, const ferry__wconfig_t *cfg,
                        uv_loop_t *loop, bool signals, ferry_error_t *err);
/* Asks the worker to drain and shut down (any thread); the loop then runs
 * out. */
void ferry__worker_request_stop(ferry__worker_t *w);
/* The same on the loop thread: reports draining, cancels the tasks and
 * joins the pipeline threads, ends the calls and shuts the server down.
 * Idempotent. */
void ferry__worker_shutdown(ferry__worker_t *w);
/* After uv_run returned: joins the heartbeat thread (waiting at most
 * `hb_wait_ms` for a heartbeat stuck on an unresponsive dispatcher) and
 * frees everything. Returns false when the heartbeat thread did not stop
 * in time: nothing was freed and the process should just exit. */
bool ferry__worker_close(ferry__worker_t *w, int hb_wait_ms);

/* stream.c (loop thread unless said otherwise). */
int ferry__wstream_register(ferry__worker_t *w, ferry_error_t *err);
/* Frees the published endpoints (once no heartbeat can read them). */
void ferry__wstream_endpoints_free(ferry__worker_t *w);
/* The emit callback of the daemon: hands a chunk to the loop (any thread;
 * a chunk that arrives after shutdown began is released). */
void ferry__winbox_push(ferry__wchunk_t *c, void *worker);
/* Asks the loop to drop the queued chunks of cancelled tasks (any
 * thread). */
void ferry__winbox_purge(ferry__worker_t *w);
void ferry__winbox_on_async(uv_async_t *a);
/* Finishes every open call and drops every queued chunk. */
void ferry__wstream_close_all(ferry__worker_t *w);
/* How many chunk queues have a client's stream open (tests). */
int ferry__wstream_open_calls(const ferry__worker_t *w);

/* heartbeat.c */
/* Starts the heartbeat thread: the first heartbeat registers (worker_id
 * 0); each carries every task's progress and applies the answer's
 * cancellations, then its new tasks. The dispatcher may hold a heartbeat
 * back until it has news for the worker (long poll, at most its interval).
 * The next heartbeat leaves at once when the answer changed the task
 * table or a task ended since the last one was built, else one interval
 * after the previous one left (at once after a held-back call that timed
 * out), or as soon as a task ends. */
int ferry__whb_start(ferry__worker_t *w, ferry_error_t *err);
/* Tells the thread to send one last heartbeat (draining) and exit, cutting
 * short a heartbeat the dispatcher holds back; does not wait. */
void ferry__whb_quit(ferry__worker_t *w);
/* The task table's end callback (any thread): wakes the heartbeat thread,
 * and with `news` also cuts short a held-back heartbeat so that the next
 * one reports the task at once. */
void ferry__whb_task_ended(void *worker, bool news);
/* Waits at most `ms` for the thread to exit; true when it did. */
bool ferry__whb_join(ferry__worker_t *w, int ms);

#endif /* FERRY_WORKER_H */
