/* libferry's client internals: the chunk header parser, the batch
 * assembler and the client object shared by the heartbeat thread, the
 * stream readers and the trainer's thread. Exposed to the tests in
 * client/tests, which drive the assembler without daemons.
 *
 * Locking: one mutex (`mu`) guards the split table, the slot ring, the
 * dispatcher's view and the stats. Readers reserve record ranges under it
 * and copy outside it; `ready_cv` wakes ferry_next, `space_cv` wakes
 * readers waiting for a free slot, `hb_cv` wakes the heartbeat thread.
 */
#ifndef FERRY_CLIENT_INTERNAL_H
#define FERRY_CLIENT_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include "chunk.h"
#include "cursor.h"
#include "ferry/augment.h"
#include "ferry/client.h"
#include "ferry/dlpack.h"
#include "ferry/error.h"
#include "ferry/v1/dispatcher.pb-c.h"
#include "lease.h"
#include "rpc.h"
#include "transport.h"

/* ---- Chunk header ------------------------------------------------------ */

/* The parser, its source and the parsed header are the Chunk contract's
 * (chunk.h): ferry__chunk_parse, ferry_chunk_src_t, ferry_chunk_t
 * (worker_id is set by the stream reader). */

/* ---- The client -------------------------------------------------------- */

/* One (epoch, split) the client holds or held; in parallel_epochs one
 * (epoch, split, worker), as every worker produces its own copy. */
typedef struct ferry__split_s {
  uint32_t epoch, split;
  uint64_t worker_id; /* the lease holder */
  uint64_t key;       /* ferry__client_split_key: the worker, or the part */
  bool has_total;
  uint64_t total;     /* records in the split, once known */
  uint64_t received;  /* next position expected (reserved in a slot) */
  uint64_t delivered; /* records handed to the trainer */
  bool assigned;      /* listed in the latest heartbeat answer */
  bool was_assigned;  /* listed in the answer before (apply_locked) */
  uint64_t lease;     /* the newest lease generation seen (answer, chunk) */
  /* Restart (records lost in transit: the lease cannot complete): asked
   * for lease `restart_lease`, once per lease generation. PENDING goes
   * out with the next heartbeat, which makes it SENT (back to PENDING if
   * that heartbeat failed); an answer to it with a newer lease ends it. */
  uint64_t restart_lease;
  enum { FERRY__RESTART_NONE = 0, FERRY__RESTART_PENDING,
         FERRY__RESTART_SENT } restart;
  /* The restart is of whatever lease is current (SplitProgress
   * .restart_current): a fence or a broken stream, not a gap. */
  bool restart_current;
  /* Giving an unread split up (Assignment.unread): the lease the newest
   * answer listed, whether it marked it unread (its worker saw no stream
   * of ours for --client-idle-ms), the newest lease of which a chunk with
   * records was taken, and the lease given up (SplitProgress.release),
   * none of whose chunks is taken from then on. */
  uint64_t grant_lease;
  bool unread;
  uint64_t got_lease;
  bool released;
  uint64_t released_lease;
  /* The binding ends at this position (Assignment.end; 0: the
   * split's end): records from here on are another rank's. */
  uint64_t cut;
  uint64_t last_total; /* the split's records per its last chunk (0: not
                          seen yet) */
  /* Deterministic order (client det): position p of the split
   * is the rank's position det_base + p of the epoch (Assignment
   * .rank_index); det_end: the rank's position after the binding's last
   * record. `assembled`: the next position to go into a slot; records
   * [assembled, received) arrived ahead of their turn and wait in `held`
   * (blocks in position order, each `ready` once copied). */
  bool det;
  int64_t det_base;
  uint64_t det_end;
  uint64_t assembled;
  struct ferry__held_s *held;
} ferry__split_t;

/* Records of one split that arrived before their turn (deterministic
 * order): positions [first, first + count), images, labels, ids. */
typedef struct ferry__held_s {
  struct ferry__held_s *next;
  uint64_t first;
  uint32_t count;
  bool ready;
  uint8_t *images;
  int64_t *labels;
  int64_t *ids;
} ferry__held_t;

/* A chunk dropped because the client was fenced or its split was not
 * listed for it (yet): should an answer list the split at that lease
 * after all, the client asks for a restart, as the records are lost. */
typedef struct ferry__dropped_s {
  uint32_t epoch, split;
  uint64_t kw, lease;
  bool used;
} ferry__dropped_t;
#define FERRY__DROPPED 64

/* A run of records of one split inside a batch slot. */
typedef struct ferry__seg_s {
  uint32_t epoch, split;
  uint32_t count;
  uint64_t key; /* the split entry's key (ferry__client_split_key) */
} ferry__seg_t;

typedef enum {
  FERRY__SLOT_FREE = 0,
  FERRY__SLOT_FILLING, /* taking reservations */
  FERRY__SLOT_CLOSED,  /* full or flushed: ready once every copy is done */
  FERRY__SLOT_HANDED,  /* held by the trainer */
  FERRY__SLOT_DISCARDED /* dropped by a fence while a reader still copied
                         * into it or a thread prepared it: free once the
                         * last of them is done */
} ferry__slot_state_t;

/* A slot's DLPack export: the tensor the consumer holds and its shape
 * (static storage per slot: exporting allocates nothing). */
typedef struct ferry__dl_s {
  DLManagedTensor mt;
  int64_t shape[4];
  struct ferry_client_s *client;
  struct ferry__slot_s *slot;
} ferry__dl_t;

typedef struct ferry__slot_s {
  ferry_batch_t batch; /* images, labels, ids point at the buffers below */
  uint8_t *images;     /* from the staging allocator (staging.c) */
  void *out;           /* the augmented output: host buffer, device buffer
                          (GPU) or NULL (raw host batches) */
  int64_t *labels;
  uint64_t *ids;
  ferry__slot_state_t state;
  uint32_t size;   /* records reserved */
  uint32_t copied; /* records copied */
  uint32_t epoch;
  bool drop;       /* a flushed remainder under drop_remainder */
  ferry__seg_t *segs;
  uint32_t n_segs;
  uint64_t index;  /* the batch index, fixed when the slot closes */
  bool prepared;   /* augmented / enqueued to the device */
  bool preparing;  /* a thread is preparing it (outside the lock) */
  bool exported;   /* held by a DLPack tensor */
  /* Padding (ranks without drop_remainder): the slot's first
   * num_real records are real; padded: filled up to batch_size (after
   * the copies, before preparing). pad_only: a batch of no real record,
   * filled from the client's pad record when handed out. */
  uint32_t num_real;
  bool padded;
  bool pad_only;
  /* The rank's position of the slot's first record (epoch
   * `epoch`), once one was reserved in it. Deterministic order places
   * records at their offsets, not only at the end: det_bits marks the
   * offsets reserved (batch_size bits), det_at is the offset of the
   * rank's next position while the slot is the fill slot. */
  bool det_has_first;
  uint64_t det_first;
  uint64_t *det_bits;
  uint32_t det_at;
  ferry__dl_t dl;
} ferry__slot_t;

/* One worker stream and its reader thread. */
typedef struct ferry__worker_s {
  struct ferry_client_s *client;
  uint64_t worker_id;
  char *address;
  ferry_transport_cstream_t *stream; /* through c->transports[] */
  int transport;                     /* its registry position */
  pthread_t thread;
  bool thread_started;
  bool stop;  /* asked to end (mu) */
  bool ended; /* the reader returned (mu) */
  bool seen;  /* scratch for the heartbeat's sweep */
  ferry_chunk_parser_t parser;
} ferry__worker_t;

/* A worker the client cannot reach: its streams failed before their
 * first chunk (a wrong --advertise, a TLS certificate that does not name
 * its address). Reported to the dispatcher in every heartbeat once
 * `failures` reaches FERRY__UNREACH_REPORT (ClientHeartbeatRequest
 * .unreachable) until a stream to it delivers a chunk or the dispatcher
 * no longer lists the worker; the dispatcher then moves this client's
 * splits off it. */
#define FERRY__UNREACH_MAX 16
#define FERRY__UNREACH_REASON 256 /* bytes kept of the transport's text */
#define FERRY__UNREACH_REPORT 2   /* one failure may be a worker dying */
typedef struct ferry__unreach_s {
  uint64_t worker_id;
  char address[256];
  char reason[FERRY__UNREACH_REASON];
  uint32_t failures; /* consecutive streams that failed before a chunk */
} ferry__unreach_t;

/* How batches are staged (staging.c). */
typedef enum {
  FERRY__STG_RAW = 0, /* host batches of uint8 images, no augmentation */
  FERRY__STG_CPU = 1, /* host batches augmented by the CPU twin */
  FERRY__STG_GPU = 2  /* pinned slots, copy and kernel on a CUDA device */
} ferry__stg_mode_t;

/* The assembler's parameters (tests build clients from these alone). */
typedef struct ferry__asm_params_s {
  uint32_t batch_size;
  uint32_t height, width, channels;
  uint32_t prefetch;
  bool drop_remainder;
  /* parallel_epochs: splits are tracked per (epoch, split, worker). */
  bool per_worker;
  /* Staging: has_augment false and gpu false keep raw host batches. */
  bool gpu;
  int device;
  bool has_augment;
  ferry_augment_spec_t augment;
  uint64_t augment_seed;
  ferry_dtype_t dtype;
  ferry_layout_t layout;
} ferry__asm_params_t;

struct ferry_client_s {
  ferry_client_options_t opts; /* strings below are owned copies */
  char *dispatcher, *spec_text, *dataset_id_opt, *job_name, *augment_text;
  char *dataset_id;
  uint64_t job_id, client_id;
  int64_t num_epochs;
  bool networked; /* false for ferry__client_new_local */
  /* The process that created the client. A forked child inherits the
   * memory but not the threads, and shares the sockets and gRPC's epoll
   * set with the parent: it must touch none of them (ferry__client_forked,
   * docs/ARCHITECTURE.md "Fork"). */
  pid_t pid;

  ferry__asm_params_t ap;
  size_t record_bytes;

  /* Ranks (options.world_size > 1). From GetOrCreateJob: the
   * batches every rank gets per epoch, this rank's real records per
   * epoch and the records dropped per epoch. rk_handed: batches handed
   * out of epoch rk_epoch (from the rank's taken records when this client
   * took over a rank mid-epoch). Padding (ap.drop_remainder false): once
   * the epoch can bring this rank no more records, ferry_next hands out
   * batches of no real record up to steps_per_epoch, filled from pad_*
   * (a copy of the first record of the last batch handed out,
   * has_pad_rec), and no reader takes a slot of a later epoch meanwhile
   * (mu). */
  bool ranked;
  uint32_t rk_world; /* W: options.world_size, or 1 (deterministic order
                        without ranks: the one rank of its job) */
  uint32_t rk_batch; /* the batch size the job was joined with */
  bool rk_pad;       /* padding, not drop_remainder */
  uint64_t steps_per_epoch, rank_records, dropped_per_epoch;
  /* Elastic: epoch ep_epoch (has_ep) was resumed with another
   * world size: its own steps and this rank's records in it
   * (ferry__client_rk_steps, _rk_records), and its earlier cuts, which
   * the cursors of that epoch carry. */
  bool has_ep;
  uint32_t ep_epoch;
  uint64_t ep_steps, ep_records;
  uint32_t ep_ncuts;
  ferry_cursor_cut_t ep_cuts[FERRY_CURSOR_MAX_CUTS];
  uint32_t rk_epoch;
  uint64_t rk_handed;
  /* Deterministic order (options.order). Slots take the rank's
   * records in position order: det_next is the next position of epoch
   * det_epoch to go into a slot. A reader whose chunk is not next keeps
   * its records (ferry__held_t) and whoever finds held records next
   * moves them into slots (det_feeding: one thread at a time).
   * det_held: records held now (det_held_peak: the most). */
  bool det;
  /* The job's effective shuffle and seed and its records per
   * epoch (for cursors), and the cursor this client resumes from. */
  bool job_shuffle;
  uint64_t job_seed, records_per_epoch;
  bool has_resume;
  ferry_cursor_t resume;
  uint32_t det_epoch;
  uint64_t det_next;
  bool det_feeding;
  uint64_t det_held, det_held_peak;
  /* Records that come before their turn go straight into the slots
   * their positions map to (the fill slot past det_at, whole batches
   * after it) while det_ahead: only where no position before them can be
   * skipped (not under policy skip; the rank's records per epoch known).
   * det_ahead_recs: placed so and not yet reached by det_next;
   * det_ahead_total: placed so since the start. */
  bool det_ahead;
  uint64_t det_ahead_recs, det_ahead_total;
  uint8_t *pad_image;
  int64_t pad_label;
  uint64_t pad_id;
  bool has_pad_rec;
  ferry__stg_mode_t stg_mode;
  struct ferry__stg_gpu_s *gpu; /* GPU staging's device side */
  size_t out_bytes;             /* a full batch's output */

  /* Lock order: mu and the transports' locks (a transport's client
   * mutex) are never held together. Every call into a transport
   * (next, copy, release, cancel, free; a chunk's copy into a slot too)
   * is made with mu dropped, and a transport calls nothing of the
   * client's while it holds its own. */
  pthread_mutex_t mu;
  pthread_cond_t ready_cv, space_cv, hb_cv;

  /* Split table, in arrival order. */
  ferry__split_t *splits;
  size_t n_splits, cap_splits;

  /* Slot ring: `queue` lists slot indices in fill order. */
  ferry__slot_t *slots;
  uint32_t *queue;
  uint32_t qhead, qlen;
  int fill; /* slot taking reservations, or -1 */
  uint32_t handed;

  /* The dispatcher's view, from the latest heartbeat answer. */
  bool hb_seen;
  int job_state;  /* Ferry__V1__JobState */
  uint32_t d_epoch;
  bool d_exhausted;
  uint32_t d_epochs_done;
  uint32_t cur_epoch; /* the epoch ferry_next is delivering */
  bool ended;         /* FERRY_END returned */

  /* Fencing (docs/ARCHITECTURE.md, "Exactly once"): the client hands out
   * batches only before `lease_until` (monotonic seconds): the send time
   * of the last heartbeat the dispatcher answered without `fenced`, plus
   * 3/4 of the dispatcher's client timeout. Past it, or when an answer
   * says `fenced`, the client drops every record it has not handed out
   * and waits for a renewal (`fenced` true meanwhile). An answer with
   * another incarnation means the dispatcher took every split away: the
   * split table is dropped too. */
  bool networked_lease; /* fencing on (a dispatcher that told a timeout) */
  int64_t client_timeout_ms;
  double lease_until;
  bool fenced;
  bool have_incarnation;
  uint64_t incarnation;
  uint64_t fences;     /* times the client fenced itself (tests, stats) */
  uint32_t hb_applied; /* heartbeat answers applied */
  bool rejoined;       /* the last answer applied had a new incarnation */
  ferry__dropped_t dropped[FERRY__DROPPED]; /* a ring of recent drops */
  uint32_t n_dropped;
  uint64_t records_acked; /* see ferry_client_stats_t */
  /* Readers waiting for a free slot, and since when no slot was taken
   * while one waited (monotonic seconds, 0: none waits): the client does
   * not read its streams (reported as ClientHeartbeatRequest.stalled_ms). */
  uint32_t space_waiters;
  double space_wait_since;

  /* A sticky failure: ferry_next returns it. */
  int fail_code;
  char fail_msg[sizeof(((ferry_error_t *)0)->msg)];

  /* Stats. */
  uint64_t batches, records, bytes;
  double wait_s;
  /* When the running ferry_next started (0: none runs): a trainer that
   * waits for its first batch is stalled before any call returns. */
  double next_since;
  double t0;
  /* The previous heartbeat's figures (ClientStats.interval_*). */
  double hb_at, hb_wait_s;
  uint64_t hb_batches;
  uint64_t next_index;

  /* Threads. */
  bool stopping;
  pthread_t hb_thread;
  bool hb_started;
  ferry_rpc_channel_t *dch;
  ferry__worker_t **workers;
  size_t n_workers, cap_workers;
  double last_hb_ok;
  bool hb_kick; /* beat now (mu): a split was fully received (the client
                  * wants another) or fully delivered (the dispatcher may
                  * end the epoch) */
  bool rpc_inited;
  /* The trainer called ferry_next (mu). Until then the client asks for no
   * split: a trainer that compiles its model after ferry_client_new would
   * hold splits, and tasks on shared workers, that nobody reads. */
  bool reading;
  /* The heartbeat call in flight (mu), which ferry_client_free cancels:
   * joining a thread blocked in a wait-for-ready beat to an unreachable
   * dispatcher held a Ctrl-C'd trainer up to a beat's deadline (1 s).
   * hb_cancelled: that happened (atomic); hb_failed: the last beat
   * failed or was cancelled (mu), so the goodbye gets a short deadline. */
  ferry_rpc_stream_t *hb_call;
  bool hb_cancelled;
  bool hb_failed;
  /* Owned copies of the TLS paths, the token read from
   * opts.token_file, the channels' settings and the client secret from
   * GetOrCreateJob (sent in heartbeats and StreamChunks). */
  char *tls_ca, *tls_cert, *tls_key, *token;
  ferry_rpc_tls_t tls;
  ferry_rpc_options_t rpc_opts;
  uint8_t secret[FERRY_CLIENT_SECRET_BYTES];
  bool has_secret;
  /* The data-plane transport the job asks for ("auto" or a registered
   * name; NULL: auto) and one client context per transport, by registry
   * position, made when a stream first needs it (heartbeat thread; freed
   * last). */
  char *transport;
  ferry_transport_client_t *transports[FERRY_TRANSPORTS_MAX];
  char transport_why[160]; /* the last choice logged (heartbeat thread) */
  /* Workers (by address) and the transports (a bit per registry
   * position) whose streams to them fell back: they failed before their
   * first chunk (ferry__transport_falls_back), and auto avoids them for
   * that worker from then on (mu). */
  struct ferry__fallback_s {
    char *address;
    uint32_t failed;
  } *fallbacks;
  size_t n_fallbacks, cap_fallbacks;
  /* Workers this client cannot reach (mu). */
  ferry__unreach_t unreach[FERRY__UNREACH_MAX];
  uint32_t n_unreach;
  /* The dispatcher's worker counts from the latest answer (mu;
   * d_has_counts false: none yet, or an older dispatcher), and since when
   * heartbeats fail (monotonic seconds, 0: they do not) with the last
   * error: what a trainer that gets no batch is told. */
  bool d_has_counts;
  uint32_t d_serving, d_draining, d_lost, d_left, d_avoided;
  double hb_down_since;
  char hb_error[160];
};

/* Monotonic seconds. */
double ferry__client_now(void);

/* Whether a ranked client's trainer waits in ferry_next with
 * nothing held or queued (its rank is between epochs, or starved), when
 * the heartbeat thread asks every FERRY__EPOCH_POLL_MS. Lock held. */
#define FERRY__EPOCH_POLL_MS 20
bool ferry__client_between_epochs_locked(const ferry_client_t *c);
/* Seconds the trainer has waited in ferry_next, the running call's wait
 * so far included, at `now`. Lock held. */
double ferry__client_waited_locked(const ferry_client_t *c, double now);

/* The CLOCK_MONOTONIC time `ms` milliseconds from now, for the client's
 * condition variables (created on that clock). */
struct timespec ferry__client_deadline(uint32_t ms);

/* Creates a client with the assembler only: no channel, no threads. Tests
 * feed it with ferry__client_on_chunk and ferry__client_apply_heartbeat
 * and drain it with ferry_next. Free with ferry_client_free. */
int ferry__client_new_local(const ferry__asm_params_t *ap,
                            ferry_client_t **out, ferry_error_t *err);

/* 0 in the process that created the client; in a forked child
 * FERRY_EFORKED, with `err` (may be NULL) naming the creating process.
 * Every public entry point asks first, before it takes a lock: a parent
 * thread may have held `mu` at the fork, and no thread of the parent
 * exists in the child to release it. */
int ferry__client_forked(const ferry_client_t *c, ferry_error_t *err);

/* Allocates the slot ring and initialises locks (shared by both
 * constructors); frees it. */
int ferry__asm_init(ferry_client_t *c, ferry_error_t *err);
void ferry__asm_close(ferry_client_t *c);

/* ---- Staging (staging.c) ----------------------------------------------- */

/* Checks the staging parameters of c->ap (dtype, layout, the augmentation
 * against the image shape, the device) and settles c->stg_mode: a GPU
 * that cannot be used fails with FERRY_ENOTSUP naming the reason, or with
 * `fallback` gives host batches and a logged warning. No allocation. */
int ferry__staging_check(ferry_client_t *c, bool fallback,
                         ferry_error_t *err);

/* Allocates every slot's memory at once: images (pinned for GPU staging,
 * else 4096-aligned), labels, ids, segments, the host output buffers of
 * CPU staging and the device side of GPU staging; fills each slot's
 * fixed batch fields. Returns 0 or FERRY_ENOMEM / CUDA's error; on error
 * what was allocated stays for ferry__staging_free. */
int ferry__staging_alloc(ferry_client_t *c, ferry_error_t *err);
void ferry__staging_free(ferry_client_t *c);

/* Prepares a closed, fully copied slot for the trainer: CPU staging runs
 * the CPU twin into the slot's output, GPU staging enqueues the copy and
 * the kernel. Called without the lock by the one thread that marked the
 * slot `preparing`. Returns 0 or the error. */
int ferry__staging_prepare(ferry_client_t *c, ferry__slot_t *s,
                           ferry_error_t *err);

/* The release side: lets the slot's host memory be refilled (waits for
 * its copy) and, when `ordered`, orders the next write of its device
 * buffers after `stream`. Called without the lock. */
int ferry__staging_release(ferry_client_t *c, ferry__slot_t *s, bool ordered,
                           void *stream, ferry_error_t *err);

/* Copies the caller's options (in->struct_size bytes of them) over a
 * defaulted full struct (out->struct_size = this library's sizeof).
 * Refuses, with FERRY_EINVAL naming the size, a struct_size of 0, below
 * FERRY_CLIENT_OPTIONS_MIN_SIZE, ending inside a field, or beyond this
 * library's struct with a non-zero byte in the unknown tail. */
int ferry__client_options_copy(const ferry_client_options_t *in,
                               ferry_client_options_t *out,
                               ferry_error_t *err);

/* Makes `stream` wait (on the device) for slot s's output (GPU staging);
 * 0 and nothing for host batches. */
int ferry__staging_wait_stream(ferry_client_t *c, ferry__slot_t *s,
                               void *stream, ferry_error_t *err);

/* Places a parsed chunk's new records into batch slots: drops positions
 * below the split's received count, reserves ranges under the lock and
 * copies the payload, labels and ids outside it. Blocks while every slot
 * is taken, until a slot frees, the client stops or *stop turns true
 * (stop may be NULL). Returns 0, or the client's failure for a chunk
 * carrying an error. */
int ferry__client_on_chunk(ferry_client_t *c, const ferry_chunk_t *ch,
                           const ferry_chunk_src_t *src, const bool *stop);

/* Applies a heartbeat answer's state, assignments and epoch counters to
 * the split table and the assembler (flushing a finished epoch's partial
 * batch). Takes the lock. */
void ferry__client_apply_heartbeat(ferry_client_t *c,
                                   const Ferry__V1__ClientHeartbeatResponse *r);

/* The share of the dispatcher's client timeout after which a client
 * whose heartbeats go unanswered stops handing out batches. */
#define FERRY__LEASE_FRACTION 0.75

/* The length of the client's lease, in seconds: FERRY__LEASE_FRACTION of
 * the dispatcher's client timeout, counted from a heartbeat's send. */
double ferry__client_lease_s(const ferry_client_t *c);

/* Fences the client: every slot not handed to the trainer is dropped (a
 * slot a reader still copies into, or a thread prepares, is freed when
 * that ends), each split's received count falls back to its delivered
 * count, and with `drop_splits` the split table is emptied (the splits
 * moved to other clients); without it each split still held asks for a
 * restart from delivered. `why` is logged. Lock held. */
void ferry__client_fence_locked(ferry_client_t *c, bool drop_splits,
                                const char *why);

/* After a heartbeat sent at `t_send` (monotonic seconds), reporting the
 * first `records` records handed out, was answered with `r` (applied
 * first): counts those records acknowledged unless the answer took the
 * client's splits away, and renews the lease (and lifts a fence) unless
 * the answer says `fenced`, in which case the client fences itself at
 * once. Takes the lock. */
void ferry__client_renew(ferry_client_t *c, double t_send, uint64_t records,
                         const Ferry__V1__ClientHeartbeatResponse *r);

/* ferry__client_apply_heartbeat and ferry__client_renew in one critical
 * section: the heartbeat thread's way to take an answer. */
void ferry__client_answer(ferry_client_t *c, double t_send, uint64_t records,
                          const Ferry__V1__ClientHeartbeatResponse *r);

/* Marks every split the worker holds for the client and has not fully
 * received for a restart at its current lease (its stream broke: records
 * in flight are lost) and wakes the heartbeat thread. Lock held. */
void ferry__client_restart_worker_locked(ferry_client_t *c,
                                         uint64_t worker_id);

/* Fills the heartbeat's progress: prog[i] for every split entry, pp[i]
 * pointing at it (both hold c->n_splits entries); returns the count. A
 * pending restart goes out here (restart, lease) and becomes sent, so
 * each lease generation is restarted once. A split the answer marked
 * unread, of whose lease no record was taken, is given up here (release,
 * lease) and none of that lease's chunks is taken after. Lock held. */
size_t ferry__client_progress_locked(ferry_client_t *c,
                                     Ferry__V1__SplitProgress *prog,
                                     Ferry__V1__SplitProgress **pp);

/* The heartbeat that carried the sent restarts failed: they are pending
 * again. Lock held. */
void ferry__client_restart_unsent_locked(ferry_client_t *c);

/* Why no batch may come, for ferry_next's timeout message: the dispatcher
 * does not answer, no worker serves the job (all draining or lost), or a
 * worker the client's splits went to cannot be reached (with the
 * transport's reason). Writes "" when nothing explains it. Lock held. */
void ferry__client_why_locked(const ferry_client_t *c, char *out, size_t cap);

/* A stream to the worker at `address` failed before its first chunk
 * (`reason`: the transport's text, kept bounded): counts a consecutive
 * failure. Lock held. */
void ferry__client_unreach_failed_locked(ferry_client_t *c, uint64_t worker_id,
                                         const char *address,
                                         const char *reason);

/* A stream to `address` delivered a chunk: it is reachable. Lock held. */
void ferry__client_unreach_reached_locked(ferry_client_t *c,
                                          const char *address);

/* Fails the client (first failure wins) and wakes every waiter. Lock
 * held. */
void ferry__client_fail_locked(ferry_client_t *c, int code, const char *fmt,
                               ...) FERRY_PRINTF(3, 4);

/* Splits held against splits_in_flight, under the lock: those the
 * dispatcher lists for the client that are not fully received yet. A
 * fully received split's records wait in batch slots (bounded by
 * prefetch), so it need not keep the client from asking for the next
 * one; counting it until delivered deadlocks small splits_in_flight,
 * as its last records may wait in a partial batch that only the end of
 * the epoch flushes. */
uint32_t ferry__client_held_locked(const ferry_client_t *c);

/* The key of a split's entry besides (epoch, split): the worker under
 * ap.per_worker (parallel_epochs), else the part of the split a lease is
 * of (lease.h: an epoch resumed with another world size may give a
 * rank two parts of one split; 0 for unranked jobs). */
uint64_t ferry__client_split_key(const ferry_client_t *c, uint64_t worker,
                                 uint64_t lease);

/* The first split entry for (epoch, split), whatever its key, or NULL.
 * Lock held. */
ferry__split_t *ferry__client_split(ferry_client_t *c, uint32_t epoch,
                                    uint32_t split);

/* The split entry for (epoch, split, key) or NULL. Lock held. */
ferry__split_t *ferry__client_split_of(ferry_client_t *c, uint32_t epoch,
                                       uint32_t split, uint64_t key);

/* A rank's batches in `epoch`, and its real records in it. */
uint64_t ferry__client_rk_steps(const ferry_client_t *c, uint32_t epoch);
uint64_t ferry__client_rk_records(const ferry_client_t *c, uint32_t epoch);

/* ---- The client's files (client_core.c, client_heartbeat.c,
 * client_streams.c) ------------------------------------------------------- */

/* Packs a protobuf-c message into a ferry__malloc'd buffer (NULL: out of
 * memory). */
uint8_t *ferry__client_pack(const ProtobufCMessage *m, size_t *len);
/* One ClientHeartbeat (`leaving`: the goodbye); applies the answer, which
 * *out receives when not NULL. Returns 0 or the RPC's error. */
int ferry__client_heartbeat(ferry_client_t *c, bool leaving,
                            int deadline_ms,
                            Ferry__V1__ClientHeartbeatResponse **out,
                            uint64_t *records, ferry_error_t *err);
/* The heartbeat thread. */
void *ferry__client_hb_main(void *arg);
/* Keeps one stream per worker the client's splits are leased to, none to
 * workers gone (heartbeat thread). */
void ferry__client_sync_workers(ferry_client_t *c,
                                const Ferry__V1__ClientHeartbeatResponse *r);
/* Stops a reader (cancel, wake, join) and frees its stream; the entry is
 * already out of c->workers (heartbeat thread or free). */
void ferry__client_worker_free(ferry_client_t *c, ferry__worker_t *w);

#endif /* FERRY_CLIENT_INTERNAL_H */
