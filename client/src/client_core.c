/* The client's life cycle and its threads: registration and job set-up in
 * ferry_client_new, the heartbeat thread that asks the dispatcher for
 * splits and opens a stream per worker, the stream readers that parse
 * chunks and hand them to the assembler, and the orderly goodbye in
 * ferry_client_free.
 */
#include <inttypes.h>
#include <protobuf-c/protobuf-c.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client_internal.h"
#include "ferry/alloc.h"
#include "ferry/hostport.h"
#include "ferry/log.h"
#include "ferry/pb_alloc.h"
#include "ferry/rpc_methods.h"
#include "ferry/spec.h"
#include "ferry/varint.h"
#include "ferry/v1/worker.pb-c.h"

/* Every field of ferry_client_options_t in order, for the struct_size
 * checks: a caller's struct may end after any field, never inside one. */
#define OPT_FIELD(f)                                                          \
  {offsetof(ferry_client_options_t, f),                                      \
   sizeof(((ferry_client_options_t *)0)->f), #f}
static const struct {
  size_t off, size;
  const char *name;
} opt_fields[] = {
    OPT_FIELD(struct_size),      OPT_FIELD(dispatcher),
    OPT_FIELD(spec),             OPT_FIELD(dataset_id),
    OPT_FIELD(job_name),         OPT_FIELD(mode),
    OPT_FIELD(num_epochs),       OPT_FIELD(shuffle),
    OPT_FIELD(shuffle_seed),     OPT_FIELD(error_policy),
    OPT_FIELD(batch_size),       OPT_FIELD(drop_remainder),
    OPT_FIELD(prefetch),         OPT_FIELD(splits_in_flight),
    OPT_FIELD(heartbeat_ms),     OPT_FIELD(connect_timeout_ms),
    OPT_FIELD(dispatcher_timeout_ms), OPT_FIELD(gpu),
    OPT_FIELD(device),           OPT_FIELD(device_fallback),
    OPT_FIELD(augment),          OPT_FIELD(augment_seed),
    OPT_FIELD(dtype),            OPT_FIELD(layout),
    OPT_FIELD(tls_ca),           OPT_FIELD(tls_cert),
    OPT_FIELD(tls_key),          OPT_FIELD(token_file),
    OPT_FIELD(transport),        OPT_FIELD(world_size),
    OPT_FIELD(rank),             OPT_FIELD(order),
    OPT_FIELD(resume),           OPT_FIELD(resume_len),
};
#undef OPT_FIELD
#define N_OPT_FIELDS (sizeof(opt_fields) / sizeof(opt_fields[0]))
_Static_assert(sizeof(ferry_client_options_t) -
                       (offsetof(ferry_client_options_t, resume_len) +
                        sizeof(size_t)) <
                   sizeof(void *),
               "opt_fields must list the options' last field");

/* Whether a field ends within the first `size` bytes. */
#define FITS(size, f)                                                         \
  (offsetof(ferry_client_options_t, f) +                                     \
       sizeof(((ferry_client_options_t *)0)->f) <=                           \
   (size))

void ferry_client_options_init_sized(ferry_client_options_t *o, size_t size) {
  if (o == NULL)
    return;
  if (size > sizeof(*o))
    /* A caller newer than this library: its unknown fields stay 0. */
    memset((char *)o + sizeof(*o), 0, size - sizeof(*o));
  size_t n = size < sizeof(*o) ? size : sizeof(*o);
  memset(o, 0, n);
  if (FITS(n, struct_size))
    o->struct_size = (uint32_t)size;
  if (FITS(n, mode))
    o->mode = FERRY_MODE_DISTRIBUTED_EPOCH;
  if (FITS(n, shuffle))
    o->shuffle = -1;
  if (FITS(n, error_policy))
    o->error_policy = FERRY_ON_ERROR_FAIL;
  if (FITS(n, prefetch))
    o->prefetch = 3;
  if (FITS(n, splits_in_flight))
    o->splits_in_flight = 8;
  if (FITS(n, heartbeat_ms))
    o->heartbeat_ms = 250;
  if (FITS(n, connect_timeout_ms))
    o->connect_timeout_ms = 5000;
  if (FITS(n, dispatcher_timeout_ms))
    o->dispatcher_timeout_ms = 30000;
}

int ferry__client_options_copy(const ferry_client_options_t *in,
                               ferry_client_options_t *out,
                               ferry_error_t *err) {
  ferry_client_options_init(out);
  if (in == NULL)
    return ferry__seterr(err, FERRY_EINVAL, "client: no options");
  size_t size = in->struct_size;
  if (size == 0)
    return ferry__seterr(err, FERRY_EINVAL,
                         "client: options.struct_size is 0: initialise the "
                         "options with ferry_client_options_init");
  if (size < FERRY_CLIENT_OPTIONS_MIN_SIZE)
    return ferry__seterr(err, FERRY_EINVAL,
                         "client: options.struct_size %zu is smaller than the "
                         "first release's options (%zu bytes): not "
                         "initialised with ferry_client_options_init?",
                         size, (size_t)FERRY_CLIENT_OPTIONS_MIN_SIZE);
  if (size > 65536)
    return ferry__seterr(err, FERRY_EINVAL,
                         "client: options.struct_size %zu is implausible "
                         "(this libferry's options are %zu bytes): not "
                         "initialised with ferry_client_options_init?",
                         size, sizeof(*out));
  if (size < sizeof(*out)) {
    for (size_t i = 0; i < N_OPT_FIELDS; i++)
      if (size > opt_fields[i].off &&
          size < opt_fields[i].off + opt_fields[i].size)
        return ferry__seterr(err, FERRY_EINVAL,
                             "client: options.struct_size %zu ends inside "
                             "field %s (bytes %zu..%zu)",
                             size, opt_fields[i].name, opt_fields[i].off,
                             opt_fields[i].off + opt_fields[i].size - 1);
    memcpy(out, in, size);
  } else {
    /* Fields this library does not know must be unset. */
    const unsigned char *tail = (const unsigned char *)in + sizeof(*out);
    for (size_t i = 0; i < size - sizeof(*out); i++)
      if (tail[i] != 0)
        return ferry__seterr(err, FERRY_EINVAL,
                             "client: options.struct_size %zu: byte %zu is "
                             "set, in an option this libferry (%zu-byte "
                             "options) does not know; a newer libferry is "
                             "needed",
                             size, sizeof(*out) + i, sizeof(*out));
    memcpy(out, in, sizeof(*out));
  }
  out->struct_size = (uint32_t)sizeof(*out);
  return 0;
}

void ferry_memory_stats(int64_t *bytes, int64_t *blocks) {
  ferry_alloc_stats_t st;
  ferry__alloc_stats(&st);
  if (bytes != NULL)
    *bytes = st.bytes;
  if (blocks != NULL)
    *blocks = st.blocks;
}

uint64_t ferry_client_job_id(const ferry_client_t *c) { return c->job_id; }

int ferry_client_state(ferry_client_t *c, void *buf, size_t cap,
                       size_t *len, ferry_error_t *err) {
  int rc;
  *len = 0;
  if ((rc = ferry__client_forked(c, err)) != 0)
    return rc;
  if (!c->det)
    return ferry__seterr(err, FERRY_ENOTSUP,
                         "client: a cursor needs order deterministic (in "
                         "arrival order a batch's records depend on the "
                         "run)");
  ferry_cursor_t cur;
  memset(&cur, 0, sizeof(cur));
  snprintf(cur.dataset_id, sizeof(cur.dataset_id), "%s", c->dataset_id);
  cur.shuffle = c->job_shuffle;
  cur.seed = c->job_shuffle ? c->job_seed : 0;
  cur.world_size = c->rk_world;
  cur.batch_size = c->rk_batch;
  cur.pad = c->rk_pad;
  cur.records_per_epoch = c->records_per_epoch;
  pthread_mutex_lock(&c->mu);
  /* The trainer's position: the batch after the last one handed out. */
  cur.epoch = c->cur_epoch;
  cur.step = c->rk_epoch == c->cur_epoch ? c->rk_handed : 0;
  pthread_mutex_unlock(&c->mu);
  uint64_t steps = ferry__client_rk_steps(c, cur.epoch);
  if (steps > 0 && cur.step >= steps) {
    cur.epoch++;
    cur.step = 0;
  }
  /* In an epoch resumed with another world size, its earlier cuts. */
  if (c->has_ep && cur.epoch == c->ep_epoch) {
    cur.ncuts = c->ep_ncuts;
    memcpy(cur.cuts, c->ep_cuts, c->ep_ncuts * sizeof(cur.cuts[0]));
  }
  rc = ferry_cursor_encode(&cur, buf, cap, len);
  if (rc != 0)
    return ferry__seterr(err, rc, "client: a cursor needs %zu bytes, the "
                         "buffer has %zu", *len, cap);
  return 0;
}

uint64_t ferry_client_steps_per_epoch(const ferry_client_t *c) {
  if (!c->ranked)
    return 0;
  pthread_mutex_lock((pthread_mutex_t *)&c->mu);
  uint64_t steps = ferry__client_rk_steps(c, c->cur_epoch);
  pthread_mutex_unlock((pthread_mutex_t *)&c->mu);
  return steps;
}
uint64_t ferry_client_dropped_per_epoch(const ferry_client_t *c) {
  return c->ranked ? c->dropped_per_epoch : 0;
}
uint64_t ferry_client_id(const ferry_client_t *c) { return c->client_id; }

/* This process's clients with gRPC initialised, and the process that
 * initialised it: a child forked while one was open inherits gRPC's state
 * without its threads (ferry_client_new refuses to run there). Atomics,
 * not a mutex, which a fork could copy locked. */
static int g_rpc_users;
static pid_t g_rpc_pid;

int ferry__client_forked(const ferry_client_t *c, ferry_error_t *err) {
  /* getpid() rather than a pthread_atfork flag: it is also right after a
   * raw clone() that runs no fork handlers, and a system call per batch
   * costs nothing next to a batch. pid 0: not created yet. */
  if (c->pid == 0 || c->pid == getpid())
    return 0;
  return ferry__seterr(err, FERRY_EFORKED,
                       "this ferry client was created in process %ld; a "
                       "forked child cannot use it: create a new Client in "
                       "the child (a child started with multiprocessing's "
                       "'spawn' or 'forkserver': gRPC cannot run in a child "
                       "forked while a client was open)",
                       (long)c->pid);
}

static pthread_once_t tune_once = PTHREAD_ONCE_INIT;
static void tune(void) { (void)ferry_rpc_tune_malloc(); }

/* Packs a protobuf-c message into a ferry__malloc'd buffer. */
static uint8_t *pack(const ProtobufCMessage *m, size_t *len) {
  *len = protobuf_c_message_get_packed_size(m);
  uint8_t *buf = ferry__malloc(*len > 0 ? *len : 1);
  if (buf != NULL)
    protobuf_c_message_pack(m, buf);
  return buf;
}

/* Milliseconds left of the connect budget that started at t0, at least 1
 * (0 would mean no deadline to ferry_rpc_unary). */
static int left_ms(const ferry_client_t *c, double t0) {
  double left = c->opts.connect_timeout_ms - (ferry__client_now() - t0) * 1e3;
  return left < 1 ? 1 : (int)left;
}

/* Turns a failed dispatcher call into the error the caller sees: the
 * dispatcher's verdicts on the request keep its text under a Ferry code
 * (NOT_FOUND: a missing file or pattern, INVALID_ARGUMENT: a spec or
 * option it refused), transport failures name the dispatcher. */
static int dispatcher_error(const ferry_client_t *c, int rc, const char *what,
                            ferry_error_t *err) {
  int code = rc;
  if (rc == FERRY_EGRPC_NOT_FOUND)
    code = FERRY_ENOENT;
  else if (rc == FERRY_EGRPC_INVALID_ARGUMENT ||
           rc == FERRY_EGRPC_FAILED_PRECONDITION)
    code = FERRY_EINVAL;
  if (err == NULL)
    return code;
  err->code = code;
  if (rc == FERRY_EGRPC_DEADLINE_EXCEEDED || rc == FERRY_EGRPC_UNAVAILABLE) {
    /* gRPC reports a host that does not resolve as a deadline: ask the
     * resolver and the port what is there (ferry_rpc_probe). */
    char why[320];
    bool tls = c->rpc_opts.tls != NULL;
    const char *hint = tls ? "down, or the TLS handshake failed: does "
                             "tls_ca sign its certificate, is that "
                             "certificate valid, is tls_cert accepted?"
                           : "down, or it serves TLS and this client "
                             "plaintext (set tls_ca)";
    switch (ferry_rpc_probe(c->dispatcher, 1000, why, sizeof(why))) {
    case FERRY_RPC_PROBE_UNRESOLVED:
    case FERRY_RPC_PROBE_REFUSED:
    case FERRY_RPC_PROBE_SILENT:
    case FERRY_RPC_PROBE_OTHER:
      hint = why;
      break;
    case FERRY_RPC_PROBE_TLS:
      if (!tls)
        hint = "it serves TLS and this client plaintext: set tls_ca";
      break;
    case FERRY_RPC_PROBE_PLAINTEXT:
      if (tls)
        hint = "it serves plaintext, not TLS: leave tls_ca, tls_cert and "
               "tls_key unset";
      break;
    default:
      break;
    }
    return ferry__prefixerr(err, "%s: dispatcher %s unreachable within %u ms "
                            "(%s)", what, c->dispatcher,
                            c->opts.connect_timeout_ms, hint);
  }
  return ferry__prefixerr(err, "%s at dispatcher %s", what, c->dispatcher);
}

static int register_dataset(ferry_client_t *c, const uint8_t *spec,
                            size_t spec_len, double t0, ferry_error_t *err) {
  /* RegisterDatasetRequest{spec = 1}: the canonical spec bytes are the
   * embedded message as they are. */
  uint8_t *req = ferry__malloc(spec_len + 16), *reply = NULL;
  size_t reply_len;
  if (req == NULL)
    return ferry__seterr(err, FERRY_ENOMEM, "client: out of memory");
  size_t n = 0;
  req[n++] = 0x0a;
  n += ferry_varint_put(req + n, spec_len);
  memcpy(req + n, spec, spec_len);
  n += spec_len;
  int rc = ferry_rpc_unary(c->dch, FERRY_METHOD_REGISTER_DATASET, req, n,
                           left_ms(c, t0), FERRY_RPC_WAIT_FOR_READY, &reply,
                           &reply_len, err);
  ferry__free(req);
  if (rc != 0)
    return dispatcher_error(c, rc, "register dataset", err);
  Ferry__V1__RegisterDatasetResponse *r =
      ferry__v1__register_dataset_response__unpack(&ferry__pb_allocator,
                                                   reply_len, reply);
  ferry__free(reply);
  if (r == NULL)
    return ferry__seterr(err, FERRY_EGRPC_INTERNAL,
                         "register dataset: malformed answer from %s",
                         c->dispatcher);
  c->dataset_id = ferry__strdup(r->dataset_id);
  ferry__v1__register_dataset_response__free_unpacked(r,
                                                      &ferry__pb_allocator);
  if (c->dataset_id == NULL)
    return ferry__seterr(err, FERRY_ENOMEM, "client: out of memory");
  return 0;
}

/* GetOrCreateJob; fills the job ids and, from the job's spec, `spec`. */
static int get_job(ferry_client_t *c, const ferry_spec_t *parsed,
                   ferry_spec_t *spec, double t0, ferry_error_t *err) {
  Ferry__V1__GetOrCreateJobRequest req =
      FERRY__V1__GET_OR_CREATE_JOB_REQUEST__INIT;
  Ferry__V1__JobOptions jo = FERRY__V1__JOB_OPTIONS__INIT;
  Ferry__V1__CursorSegment cuts[FERRY_CURSOR_MAX_CUTS];
  Ferry__V1__CursorSegment *cut_ptrs[FERRY_CURSOR_MAX_CUTS];
  uint8_t *buf, *reply = NULL;
  size_t len, reply_len;
  req.dataset_id = c->dataset_id;
  req.options = &jo;
  jo.job_name = c->job_name != NULL ? c->job_name : (char *)"";
  jo.mode = c->opts.mode == FERRY_MODE_PARALLEL_EPOCHS
                ? FERRY__V1__JOB_MODE__JOB_MODE_PARALLEL_EPOCHS
                : FERRY__V1__JOB_MODE__JOB_MODE_DISTRIBUTED_EPOCH;
  jo.num_epochs = c->opts.num_epochs;
  if (c->opts.shuffle > 0) {
    jo.shuffle = 1;
    jo.shuffle_seed = c->opts.shuffle_seed;
  } else if (c->opts.shuffle < 0 && parsed != NULL && parsed->shuffle) {
    jo.shuffle = 1;
    jo.shuffle_seed = parsed->shuffle_seed;
  }
  jo.error_policy = c->opts.error_policy == FERRY_ON_ERROR_SKIP
                        ? FERRY__V1__ERROR_POLICY__ERROR_POLICY_SKIP
                        : FERRY__V1__ERROR_POLICY__ERROR_POLICY_FAIL;
  if (c->ranked) {
    /* The batch size and the policy: the spec's or the
     * options' (batch_shape ran), or the options' alone with a dataset id
     * (ferry_client_new checked batch_size is set). */
    bool known = c->ap.batch_size > 0;
    c->rk_batch = known ? c->ap.batch_size : c->opts.batch_size;
    c->rk_pad = !(known ? c->ap.drop_remainder : c->opts.drop_remainder);
    jo.world_size = c->rk_world;
    jo.batch_size = c->rk_batch;
    jo.pad_remainder = c->rk_pad;
    req.rank = c->opts.rank;
  }
  if (c->has_resume) {
    /* The cursor must be of this job's dataset and ranks. */
    const ferry_cursor_t *cur = &c->resume;
    if (strcmp(cur->dataset_id, c->dataset_id) != 0)
      return ferry__seterr(err, FERRY_EINVAL,
                           "resume: the cursor is of dataset %s, this "
                           "client's is %s (another spec or other files)",
                           cur->dataset_id, c->dataset_id);
    if (cur->batch_size != c->rk_batch || cur->pad != c->rk_pad)
      return ferry__seterr(err, FERRY_EINVAL,
                           "resume: the cursor was saved with batch %u, "
                           "%s; this client has batch %u, %s (the world "
                           "size may change at a resume, the batch size "
                           "and the policy may not)", cur->batch_size,
                           cur->pad ? "pad" : "drop", c->rk_batch,
                           c->rk_pad ? "pad" : "drop");
    /* Another world size (elastic): what the cursor's ranks left of the
     * epoch is cut anew among this job's ranks, from its step 0. */
    bool recut = cur->world_size != c->rk_world;
    if (recut && cur->ncuts >= FERRY_CURSOR_MAX_CUTS)
      return ferry__seterr(err, FERRY_EINVAL,
                           "resume: the cursor's epoch %u already changed "
                           "world size %u times (at most %d in one epoch): "
                           "resume with world_size %u",
                           cur->epoch, cur->ncuts, FERRY_CURSOR_MAX_CUTS,
                           cur->world_size);
    if (jo.shuffle && (!cur->shuffle || cur->seed != jo.shuffle_seed))
      return ferry__seterr(err, FERRY_EINVAL,
                           "resume: the cursor was saved %s; this client "
                           "shuffles with seed %llu",
                           cur->shuffle ? "with another shuffle seed"
                                        : "without shuffle",
                           (unsigned long long)jo.shuffle_seed);
    jo.resume = true;
    jo.resume_epoch = cur->epoch;
    jo.resume_step = recut ? 0 : cur->step;
    for (uint32_t i = 0; i < cur->ncuts + (recut ? 1 : 0); i++) {
      ferry__v1__cursor_segment__init(&cuts[i]);
      cuts[i].world_size =
          i < cur->ncuts ? cur->cuts[i].world_size : cur->world_size;
      cuts[i].step = i < cur->ncuts ? cur->cuts[i].step : cur->step;
      cut_ptrs[i] = &cuts[i];
    }
    jo.n_resume_earlier = cur->ncuts + (recut ? 1 : 0);
    jo.resume_earlier = cut_ptrs;
  }
  if ((buf = pack(&req.base, &len)) == NULL)
    return ferry__seterr(err, FERRY_ENOMEM, "client: out of memory");
  int rc = ferry_rpc_unary(c->dch, FERRY_METHOD_GET_OR_CREATE_JOB, buf, len,
                           left_ms(c, t0), FERRY_RPC_WAIT_FOR_READY, &reply,
                           &reply_len, err);
  ferry__free(buf);
  if (rc != 0)
    return dispatcher_error(c, rc, "get or create job", err);
  Ferry__V1__GetOrCreateJobResponse *r =
      ferry__v1__get_or_create_job_response__unpack(&ferry__pb_allocator,
                                                    reply_len, reply);
  ferry__free(reply);
  if (r == NULL)
    return ferry__seterr(err, FERRY_EGRPC_INTERNAL,
                         "get or create job: malformed answer from %s",
                         c->dispatcher);
  c->job_id = r->job_id;
  c->client_id = r->client_id;
  c->num_epochs = r->num_epochs;
  c->steps_per_epoch = r->steps_per_epoch;
  c->rank_records = r->rank_records;
  c->dropped_per_epoch = r->dropped_per_epoch;
  /* An epoch resumed with another world size has its own
   * steps (an older dispatcher sends none: every epoch is alike). */
  c->has_ep = c->ranked && r->n_epoch_earlier > 0 &&
              r->n_epoch_earlier <= FERRY_CURSOR_MAX_CUTS;
  c->ep_epoch = r->epoch;
  c->ep_steps = r->epoch_steps;
  c->ep_records = r->epoch_rank_records;
  c->ep_ncuts = c->has_ep ? (uint32_t)r->n_epoch_earlier : 0;
  for (uint32_t i = 0; i < c->ep_ncuts; i++)
    c->ep_cuts[i] = (ferry_cursor_cut_t){r->epoch_earlier[i]->world_size,
                                         r->epoch_earlier[i]->step};
  /* A client taking over a rank mid-epoch owes only its remaining steps:
   * a batch the rank started counts as taken (only a padded last one is
   * short). */
  c->rk_epoch = r->epoch;
  c->rk_handed = c->ranked ? (r->rank_taken + c->rk_batch - 1) / c->rk_batch
                           : 0;
  /* Deterministic order: the rank's next position is the first one its
   * clients did not take. */
  c->det_epoch = r->epoch;
  c->det_next = c->det ? r->rank_taken : 0;
  if (c->ranked && c->steps_per_epoch == 0) {
    ferry__v1__get_or_create_job_response__free_unpacked(
        r, &ferry__pb_allocator);
    return ferry__seterr(err, FERRY_ENOTSUP,
                         "get or create job: dispatcher %s does not know "
                         "ranks (world_size %u): upgrade it", c->dispatcher,
                         c->opts.world_size);
  }
  if (r->client_secret.len == FERRY_CLIENT_SECRET_BYTES) {
    memcpy(c->secret, r->client_secret.data, FERRY_CLIENT_SECRET_BYTES);
    c->has_secret = true;
  }
  /* The dispatcher counts this client alive from the call's arrival: the
   * lease runs from when it was sent (t0 of the call, see get_job's
   * caller). */
  if (r->client_timeout_ms > 0) {
    c->networked_lease = true;
    c->client_timeout_ms = r->client_timeout_ms;
  }
  rc = 0;
  if (parsed != NULL) {
    rc = ferry_spec_copy(spec, parsed);
    if (rc != 0)
      ferry__seterr(err, rc, "client: out of memory");
  } else if (r->spec == NULL) {
    rc = ferry__seterr(err, FERRY_EGRPC_INTERNAL,
                       "get or create job: dispatcher %s sent no spec for "
                       "dataset %s", c->dispatcher, c->dataset_id);
  } else if ((buf = pack(&r->spec->base, &len)) == NULL) {
    rc = ferry__seterr(err, FERRY_ENOMEM, "client: out of memory");
  } else {
    rc = ferry_spec_unpack(buf, len, spec, err);
    ferry__free(buf);
    if (rc != 0)
      ferry__prefixerr(err, "dataset %s: the job's spec", c->dataset_id);
  }
  c->records_per_epoch = r->records_per_epoch;
  ferry__v1__get_or_create_job_response__free_unpacked(r,
                                                       &ferry__pb_allocator);
  /* The job's shuffle, as the dispatcher decides it. */
  if (rc == 0) {
    c->job_shuffle = jo.shuffle || spec->shuffle;
    c->job_seed = jo.shuffle ? jo.shuffle_seed : spec->shuffle_seed;
    if (c->has_resume && (c->resume.shuffle != c->job_shuffle ||
                          (c->job_shuffle && c->resume.seed != c->job_seed)))
      rc = ferry__seterr(err, FERRY_EINVAL,
                         "resume: the cursor was saved %s, the job %s",
                         c->resume.shuffle ? "with shuffle" : "without "
                                                              "shuffle",
                         c->job_shuffle ? "shuffles (another seed)"
                                        : "does not shuffle");
  }
  return rc;
}

/* ---- Stream readers ---------------------------------------------------- */

/* The chunk parser and the assembler read a transport's message. */
static size_t tmsg_copy(const ferry_chunk_src_t *src, size_t off, void *dst,
                        size_t n) {
  const ferry_transport_msg_t *m = src->ctx;
  return m->copy(m, off, dst, n);
}

/* True when `address` is on the list of workers whose UCX stream failed
 * before its first chunk (mu held). */
static bool ucx_failed_locked(const ferry_client_t *c, const char *address) {
  for (size_t i = 0; i < c->n_ucx_failed; i++)
    if (strcmp(c->ucx_failed[i], address) == 0)
      return true;
  return false;
}

/* Puts `address` on that list (mu held; out of memory: the next stream
 * tries UCX again, which fails the same way). */
static void ucx_failed_add_locked(ferry_client_t *c, const char *address) {
  if (ucx_failed_locked(c, address))
    return;
  char *a = ferry__strdup(address);
  if (a == NULL ||
      !FERRY__GROW(c->ucx_failed, c->cap_ucx_failed, c->n_ucx_failed + 1, 4)) {
    ferry__free(a);
    return;
  }
  c->ucx_failed[c->n_ucx_failed++] = a;
}

/* ---- Workers the client cannot reach ------------------------------------ */

static ferry__unreach_t *unreach_find_locked(ferry_client_t *c,
                                             const char *address) {
  for (uint32_t i = 0; i < c->n_unreach; i++)
    if (strcmp(c->unreach[i].address, address) == 0)
      return &c->unreach[i];
  return NULL;
}

void ferry__client_unreach_failed_locked(ferry_client_t *c, uint64_t worker_id,
                                         const char *address,
                                         const char *reason) {
  ferry__unreach_t *u = unreach_find_locked(c, address);
  if (u == NULL) {
    if (c->n_unreach == FERRY__UNREACH_MAX ||
        strlen(address) >= sizeof(u->address))
      return; /* the first sixteen tell the story */
    u = &c->unreach[c->n_unreach++];
    memset(u, 0, sizeof(*u));
    snprintf(u->address, sizeof(u->address), "%s", address);
  }
  u->worker_id = worker_id;
  if (u->failures < UINT32_MAX)
    u->failures++;
  /* Printable ASCII only: it travels in a proto3 string and is shown. */
  size_t n = 0;
  for (const char *p = reason != NULL ? reason : "";
       *p != '\0' && n + 1 < sizeof(u->reason); p++) {
    unsigned char ch = (unsigned char)*p;
    u->reason[n++] = ch >= 0x20 && ch < 0x7f ? (char)ch : '?';
  }
  u->reason[n] = '\0';
}

void ferry__client_unreach_reached_locked(ferry_client_t *c,
                                          const char *address) {
  ferry__unreach_t *u = unreach_find_locked(c, address);
  if (u == NULL)
    return;
  FERRY_LOG(FERRY_LOG_INFO, "client: worker %s reachable again", address);
  *u = c->unreach[--c->n_unreach];
}

void ferry__client_why_locked(const ferry_client_t *c, char *out,
                              size_t cap) {
  const ferry__unreach_t *u = NULL;
  out[0] = '\0';
  for (uint32_t i = 0; i < c->n_unreach && u == NULL; i++)
    u = &c->unreach[i];
  if (c->hb_down_since > 0) {
    snprintf(out, cap, "no answer from the dispatcher %s for %.1f s: %s",
             c->dispatcher != NULL ? c->dispatcher : "",
             ferry__client_now() - c->hb_down_since, c->hb_error);
  } else if (c->d_has_counts && c->d_serving == 0) {
    if (c->d_draining + c->d_left + c->d_lost == 0)
      snprintf(out, cap, "no worker is serving this job: none has "
               "registered with the dispatcher");
    else
      snprintf(out, cap, "no worker is serving this job: %" PRIu32
               " draining, %" PRIu32 " stopped, %" PRIu32 " lost",
               c->d_draining, c->d_left, c->d_lost);
  } else if (u != NULL) {
    int n = snprintf(out, cap, "worker %s unreachable: %s", u->address,
                     u->reason);
    if (c->n_unreach > 1 && n > 0 && (size_t)n < cap)
      snprintf(out + n, cap - (size_t)n, " (and %" PRIu32 " more)",
               c->n_unreach - 1);
  }
}

static bool transport_is_auto(const ferry_client_t *c) {
  return c->transport == NULL || c->transport[0] == '\0' ||
         strcmp(c->transport, "auto") == 0;
}

static void *reader_main(void *arg) {
  ferry__worker_t *w = arg;
  ferry_client_t *c = w->client;
  ferry_error_t e;
  uint64_t chunks = 0;
  for (;;) {
    ferry_transport_msg_t msg;
    ferry_chunk_src_t src;
    ferry_chunk_t ch;
    int rc = ferry_transport_next(w->stream, &msg, -1, &e);
    if (rc != 0) {
      pthread_mutex_lock(&c->mu);
      bool asked_to_stop = w->stop || c->stopping;
      pthread_mutex_unlock(&c->mu);
      /* A lost worker is the dispatcher's business: it re-leases the
       * splits, and the next heartbeat reopens a stream if needed. */
      if (rc != FERRY_EOF && !asked_to_stop) {
        FERRY_LOG(FERRY_LOG_WARN, "client: worker %s: %s", w->address,
                  e.msg);
        /* A UCX stream that failed before its first chunk most likely
         * cannot work between these two processes (another user's
         * shared memory, no common UCX transport): auto mode serves this
         * worker over gRPC from now on (pick_transport says so). */
        if (chunks == 0 && transport_is_auto(c) &&
            w->stream->ops != &ferry_transport_grpc) {
          pthread_mutex_lock(&c->mu);
          ucx_failed_add_locked(c, w->address);
          pthread_mutex_unlock(&c->mu);
        }
        /* If the worker is alive it goes on with later chunks on the
         * reopened stream: what was in flight is lost for good, so its
         * leases of our splits must start again from delivered. */
        pthread_mutex_lock(&c->mu);
        ferry__client_restart_worker_locked(
            c, __atomic_load_n(&w->worker_id, __ATOMIC_RELAXED));
        /* Nothing ever came: the client may not reach this worker at all
         * (a wrong --advertise, a certificate without its address); the
         * dispatcher hears of it (ClientHeartbeatRequest.unreachable). A
         * worker's refusal of a cancelled or replaced stream is no sign.
         * A UCX stream counts too: its control call goes to the same gRPC
         * address. Counting only gRPC streams, a client on auto whose
         * first stream (UCX) failed could see one gRPC failure before the
         * dispatcher's backoff kept the worker's leases away, and never
         * report it. A worker that only cannot reach our UCX address is
         * reached over gRPC next (auto), whose first chunk clears it. */
        if (chunks == 0 &&
            (rc == FERRY_EGRPC_UNAVAILABLE ||
             rc == FERRY_EGRPC_UNAUTHENTICATED ||
             rc == FERRY_EGRPC_PERMISSION_DENIED))
          ferry__client_unreach_failed_locked(
              c, __atomic_load_n(&w->worker_id, __ATOMIC_RELAXED),
              w->address, e.msg);
        pthread_mutex_unlock(&c->mu);
      }
      break;
    }
    if (chunks++ == 0) {
      pthread_mutex_lock(&c->mu);
      ferry__client_unreach_reached_locked(c, w->address);
      pthread_mutex_unlock(&c->mu);
    }
    src.len = msg.len;
    src.copy = tmsg_copy;
    src.ctx = &msg;
    rc = ferry_chunk_parse(&w->parser, &src, &ch, &e);
    if (rc != 0) {
      pthread_mutex_lock(&c->mu);
      ferry__client_fail_locked(c, rc, "worker %s: %s", w->address, e.msg);
      pthread_mutex_unlock(&c->mu);
    } else if (ch.job_id != c->job_id) {
      FERRY_LOG(FERRY_LOG_WARN,
                "client: worker %s sent a chunk of job %llu, not %llu",
                w->address, (unsigned long long)ch.job_id,
                (unsigned long long)c->job_id);
    } else {
      /* The stream says whose copy of the split this is. */
      ch.worker_id = __atomic_load_n(&w->worker_id, __ATOMIC_RELAXED);
      rc = ferry__client_on_chunk(c, &ch, &src, &w->stop);
    }
    ferry_transport_msg_release(&msg);
    if (rc != 0)
      break;
    pthread_mutex_lock(&c->mu);
    bool stop = w->stop || c->stopping;
    pthread_mutex_unlock(&c->mu);
    if (stop)
      break;
  }
  pthread_mutex_lock(&c->mu);
  w->ended = true;
  pthread_mutex_unlock(&c->mu);
  return NULL;
}

/* Stops a reader (cancel, wake, join) and frees its stream. The entry
 * must already be out of c->workers. Heartbeat thread or free. */
static void worker_free(ferry_client_t *c, ferry__worker_t *w) {
  if (w == NULL)
    return;
  pthread_mutex_lock(&c->mu);
  w->stop = true;
  pthread_cond_broadcast(&c->space_cv);
  pthread_mutex_unlock(&c->mu);
  if (w->stream != NULL)
    ferry_transport_cancel(w->stream);
  if (w->thread_started)
    pthread_join(w->thread, NULL);
  ferry_transport_cstream_free(w->stream);
  ferry_chunk_parser_close(&w->parser);
  ferry__free(w->address);
  ferry__free(w);
}

/* The transport for a stream to a worker that offers `peer_address`
 * bytes besides its gRPC address (UCX's), and that transport's client
 * context. Logs the choice when it changes. Heartbeat thread. */
static int pick_transport(ferry_client_t *c, const char *address,
                          bool peer_has_ucx,
                          ferry_transport_client_t **out, ferry_error_t *e) {
  char why[sizeof(c->transport_why)];
  const char *want = c->transport;
  const ferry_transport_ops_t *ops;
  bool automatic = transport_is_auto(c);
  pthread_mutex_lock(&c->mu);
  bool ucx_failed = ucx_failed_locked(c, address);
  pthread_mutex_unlock(&c->mu);
  if (automatic && c->rpc_opts.tls != NULL && peer_has_ucx) {
    /* UCX carries no TLS: a client configured for it stays on gRPC unless
     * the job asks for ucx by name. */
    ops = &ferry_transport_grpc;
    snprintf(why, sizeof(why), "auto: grpc, TLS is configured and UCX "
             "does not encrypt");
  } else if (automatic && peer_has_ucx && ucx_failed) {
    ops = &ferry_transport_grpc;
    snprintf(why, sizeof(why), "auto: grpc, the UCX stream to this worker "
             "failed before its first chunk");
  } else {
    ops = ferry_transport_choose(want, peer_has_ucx, why, sizeof(why), e);
  }
  if (ops == NULL)
    return ferry__prefixerr(e, "worker %s", address);
  if (strcmp(why, c->transport_why) != 0) {
    FERRY_LOG(FERRY_LOG_INFO, "client: worker %s: transport %s", address,
              why);
    memcpy(c->transport_why, why, sizeof(why));
  }
  size_t k = ops == &ferry_transport_grpc ? 0 : 1;
  if (c->transports[k] == NULL) {
    ferry_transport_client_config_t cfg = {0};
    cfg.rpc_opts = &c->rpc_opts;
    cfg.peer_timeout_ms = (int)c->client_timeout_ms;
    int rc = ops->client_new(&cfg, &c->transports[k], e);
    if (rc != 0)
      return ferry__prefixerr(e, "transport %s", ops->name);
  }
  *out = c->transports[k];
  return 0;
}

/* Opens the chunk stream to `address` and starts its reader. */
static int worker_start(ferry_client_t *c, uint64_t worker_id,
                        const char *address, const void *peer_address,
                        size_t peer_address_len) {
  ferry_transport_open_t req = {0};
  ferry_transport_peer_t peer = {address, peer_address, peer_address_len};
  ferry_transport_client_t *tc = NULL;
  ferry_error_t e;
  ferry__worker_t *w = ferry__calloc(1, sizeof(*w));
  if (w == NULL || (w->address = ferry__strdup(address)) == NULL) {
    ferry__free(w);
    return FERRY_ENOMEM;
  }
  w->client = c;
  w->worker_id = worker_id;
  ferry_chunk_parser_init(&w->parser);
  req.job_id = c->job_id;
  req.client_id = c->client_id;
  if (c->has_secret)
    req.secret = c->secret;
  int rc = pick_transport(c, address, peer_address_len > 0, &tc, &e);
  if (rc == 0)
    rc = tc->ops->open(tc, &peer, &req, &w->stream, &e);
  if (rc == 0 && pthread_create(&w->thread, NULL, reader_main, w) != 0)
    rc = ferry__seterr(&e, FERRY_ENOMEM, "cannot start a reader thread");
  if (rc == 0)
    w->thread_started = true;
  pthread_mutex_lock(&c->mu);
  if (rc == 0 && !FERRY__GROW(c->workers, c->cap_workers, c->n_workers + 1, 8))
    rc = ferry__seterr(&e, FERRY_ENOMEM, "out of memory");
  if (rc == 0)
    c->workers[c->n_workers++] = w;
  pthread_mutex_unlock(&c->mu);
  if (rc != 0) {
    FERRY_LOG(FERRY_LOG_WARN, "client: worker %s: %s", address, e.msg);
    if (rc != FERRY_ENOMEM) {
      pthread_mutex_lock(&c->mu);
      ferry__client_unreach_failed_locked(c, worker_id, address, e.msg);
      pthread_mutex_unlock(&c->mu);
    }
    worker_free(c, w);
  }
  return rc;
}

/* stopping is written under mu by the closing thread. */
static bool client_stopping(ferry_client_t *c) {
  pthread_mutex_lock(&c->mu);
  bool stopping = c->stopping;
  pthread_mutex_unlock(&c->mu);
  return stopping;
}

/* Brings the set of streams in line with a heartbeat answer: a stream per
 * worker address the client's splits are leased to (reopened if it
 * ended), none to workers gone from both the assignments and the live
 * workers list. */
static void sync_workers(ferry_client_t *c,
                         const Ferry__V1__ClientHeartbeatResponse *r) {
  pthread_mutex_lock(&c->mu);
  /* A worker gone from the live list (lost, or registered again under a
   * new id) is no longer this client's to report. */
  for (uint32_t i = c->n_unreach; i-- > 0;) {
    bool live = false;
    for (size_t k = 0; k < r->n_workers && !live; k++)
      live = r->workers[k]->address != NULL &&
             r->workers[k]->worker_id == c->unreach[i].worker_id &&
             strcmp(r->workers[k]->address, c->unreach[i].address) == 0;
    if (!live)
      c->unreach[i] = c->unreach[--c->n_unreach];
  }
  for (size_t i = 0; i < c->n_workers; i++)
    c->workers[i]->seen = false;
  pthread_mutex_unlock(&c->mu);
  for (size_t i = 0; i < r->n_assignments && !client_stopping(c); i++) {
    const Ferry__V1__Assignment *a = r->assignments[i];
    if (a->worker_address == NULL || a->worker_address[0] == '\0')
      continue;
    ferry__worker_t *found = NULL, *dead = NULL;
    pthread_mutex_lock(&c->mu);
    for (size_t k = 0; k < c->n_workers; k++) {
      ferry__worker_t *w = c->workers[k];
      if (strcmp(w->address, a->worker_address) != 0)
        continue;
      if (w->ended) {
        dead = w;
        c->workers[k] = c->workers[--c->n_workers];
      } else {
        found = w;
        w->seen = true;
        /* A worker that registered again under a new id. */
        __atomic_store_n(&w->worker_id, a->worker_id, __ATOMIC_RELAXED);
      }
      break;
    }
    pthread_mutex_unlock(&c->mu);
    worker_free(c, dead);
    /* The worker's UCX address, from the live workers list. */
    const ProtobufCBinaryData *ucx = NULL;
    for (size_t k = 0; k < r->n_workers && found == NULL; k++)
      if (r->workers[k]->address != NULL &&
          strcmp(r->workers[k]->address, a->worker_address) == 0)
        ucx = &r->workers[k]->ucx_address;
    if (found == NULL &&
        worker_start(c, a->worker_id, a->worker_address,
                     ucx != NULL ? ucx->data : NULL,
                     ucx != NULL ? ucx->len : 0) == 0) {
      pthread_mutex_lock(&c->mu);
      c->workers[c->n_workers - 1]->seen = true;
      pthread_mutex_unlock(&c->mu);
    }
  }
  for (size_t i = 0; i < r->n_workers; i++)
    for (size_t k = 0; k < c->n_workers; k++)
      if (r->workers[i]->address != NULL &&
          strcmp(c->workers[k]->address, r->workers[i]->address) == 0)
        c->workers[k]->seen = true;
  for (;;) {
    ferry__worker_t *gone = NULL;
    pthread_mutex_lock(&c->mu);
    for (size_t k = 0; k < c->n_workers; k++)
      if (!c->workers[k]->seen || c->workers[k]->ended) {
        gone = c->workers[k];
        c->workers[k] = c->workers[--c->n_workers];
        break;
      }
    pthread_mutex_unlock(&c->mu);
    if (gone == NULL)
      break;
    worker_free(c, gone);
  }
}

/* ---- Heartbeats -------------------------------------------------------- */

/* One ClientHeartbeat; applies the answer. Returns 0 or the RPC's error. */
/* ferry_rpc_unary for the heartbeat thread's beats: the call is kept in
 * c->hb_call while it runs so that ferry_client_free can cancel it
 * (`cancellable`; the goodbye is not) instead of waiting out its
 * deadline. Notes in c->hb_failed whether the beat failed. */
static int hb_unary(ferry_client_t *c, bool cancellable, const uint8_t *req,
                    size_t len, int deadline_ms, unsigned flags,
                    uint8_t **reply, size_t *reply_len, ferry_error_t *err) {
  const char *method = FERRY_METHOD_CLIENT_HEARTBEAT;
  ferry_rpc_stream_t *s;
  ferry_rpc_msg_t msg;
  *reply = NULL;
  *reply_len = 0;
  int rc = ferry_rpc_stream_open(c->dch, method, req, len, deadline_ms, flags,
                                 &s, err);
  if (rc != 0)
    return rc;
  if (cancellable) {
    pthread_mutex_lock(&c->mu);
    if (c->stopping) {
      __atomic_store_n(&c->hb_cancelled, true, __ATOMIC_RELEASE);
      ferry_rpc_stream_cancel(s);
    } else {
      c->hb_call = s;
    }
    pthread_mutex_unlock(&c->mu);
  }
  rc = ferry_rpc_stream_next(s, &msg, -1, err);
  if (rc == 0) {
    size_t n = msg.len;
    uint8_t *out = ferry__malloc(n > 0 ? n : 1);
    if (out != NULL)
      ferry_rpc_msg_copy(&msg, 0, out, n);
    ferry_rpc_msg_release(&msg);
    /* The status follows the one message. */
    rc = ferry_rpc_stream_next(s, &msg, -1, err);
    if (rc == 0) {
      ferry_rpc_msg_release(&msg);
      rc = ferry__seterr(err, FERRY_EGRPC_INTERNAL, "%s: more than one reply",
                         method);
    } else if (rc == FERRY_EOF) {
      rc = out != NULL ? 0
                       : ferry__seterr(err, FERRY_ENOMEM, "%s: out of memory",
                                       method);
    }
    if (rc == 0) {
      *reply = out;
      *reply_len = n;
    } else {
      ferry__free(out);
    }
  } else if (rc == FERRY_EOF) {
    rc = ferry__seterr(err, FERRY_EGRPC_INTERNAL, "%s: no reply", method);
  }
  pthread_mutex_lock(&c->mu);
  if (cancellable)
    c->hb_call = NULL;
  c->hb_failed = rc != 0;
  pthread_mutex_unlock(&c->mu);
  ferry_rpc_stream_free(s);
  return rc;
}

static int heartbeat(ferry_client_t *c, bool leaving, int deadline_ms,
                     Ferry__V1__ClientHeartbeatResponse **out,
                     uint64_t *records, ferry_error_t *err) {
  Ferry__V1__ClientHeartbeatRequest req =
      FERRY__V1__CLIENT_HEARTBEAT_REQUEST__INIT;
  Ferry__V1__ClientStats st = FERRY__V1__CLIENT_STATS__INIT;
  Ferry__V1__SplitProgress *prog = NULL, **pp = NULL;
  /* The unreachable workers, copied under the lock (the readers change
   * the list). */
  Ferry__V1__UnreachableWorker uw[FERRY__UNREACH_MAX];
  Ferry__V1__UnreachableWorker *uwp[FERRY__UNREACH_MAX];
  ferry__unreach_t ucopy[FERRY__UNREACH_MAX];
  uint8_t *buf = NULL, *reply = NULL;
  size_t len, reply_len;
  int rc = FERRY_ENOMEM;
  *out = NULL;
  *records = 0;
  req.job_id = c->job_id;
  req.client_id = c->client_id;
  if (c->has_secret) {
    req.client_secret.data = c->secret;
    req.client_secret.len = FERRY_CLIENT_SECRET_BYTES;
  }
  req.leaving = leaving;
  req.stats = &st;
  pthread_mutex_lock(&c->mu);
  size_t n = c->n_splits;
  prog = ferry__calloc(n ? n : 1, sizeof(*prog));
  pp = ferry__calloc(n ? n : 1, sizeof(*pp));
  if (prog != NULL && pp != NULL) {
    req.n_progress = ferry__client_progress_locked(c, prog, pp);
    req.progress = pp;
    uint32_t held = ferry__client_held_locked(c);
    /* No new splits while the trainer holds every slot: none of their
     * records could be taken, and a trainer that stalls so would only
     * take them from the job's other clients again and again. Nor before
     * the trainer's first ferry_next: a job's claim on workers is earned
     * by reading. */
    req.want_splits = leaving || !c->reading ||
                              held >= c->opts.splits_in_flight ||
                              c->handed >= c->ap.prefetch
                          ? 0
                          : c->opts.splits_in_flight - held;
    /* The wait of a ferry_next still running counts: a trainer starved
     * of its first batch is 100% stalled, not 0%. */
    double now = ferry__client_now(), total = now - c->t0;
    double waited = ferry__client_waited_locked(c, now);
    st.stall_fraction = total > 0 ? waited / total : 0;
    if (st.stall_fraction > 1)
      st.stall_fraction = 1;
    st.batches_per_second = total > 0 ? (double)c->batches / total : 0;
    st.batches = c->batches;
    /* The same since the previous heartbeat (the job gauges). */
    if (c->hb_at > 0 && now > c->hb_at) {
      st.interval_seconds = now - c->hb_at;
      st.interval_stall_fraction =
          (waited - c->hb_wait_s) / st.interval_seconds;
      if (st.interval_stall_fraction > 1)
        st.interval_stall_fraction = 1;
      if (st.interval_stall_fraction < 0)
        st.interval_stall_fraction = 0;
      st.interval_batches_per_second =
          (double)(c->batches - c->hb_batches) / st.interval_seconds;
    }
    c->hb_at = now;
    c->hb_wait_s = waited;
    c->hb_batches = c->batches;
    *records = c->records; /* what this request reports as handed out */
    if (c->space_wait_since > 0)
      req.stalled_ms =
          (uint64_t)((ferry__client_now() - c->space_wait_since) * 1e3);
    c->hb_kick = false;
    for (uint32_t i = 0; i < c->n_unreach; i++) {
      if (c->unreach[i].failures < FERRY__UNREACH_REPORT)
        continue;
      size_t k = req.n_unreachable++;
      ucopy[k] = c->unreach[i];
      ferry__v1__unreachable_worker__init(&uw[k]);
      uw[k].worker_id = ucopy[k].worker_id;
      uw[k].address = ucopy[k].address;
      uw[k].reason = ucopy[k].reason;
      uw[k].failures = ucopy[k].failures;
      uwp[k] = &uw[k];
    }
    req.unreachable = uwp;
  }
  pthread_mutex_unlock(&c->mu);
  if (prog != NULL && pp != NULL)
    buf = pack(&req.base, &len);
  ferry__free(prog);
  ferry__free(pp);
  if (buf == NULL)
    return ferry__seterr(err, FERRY_ENOMEM, "client: out of memory");
  /* Wait for ready (within the beat's deadline), except when leaving: a
   * client has no thread that polls gRPC between its calls, and a call
   * failing fast on a channel in TRANSIENT_FAILURE polls for nothing, so
   * the reconnection to a restarted dispatcher (its SETTINGS frame) was
   * driven only by whatever else the client happened to wait on: with
   * no stream open, heartbeats failed for 8 to 25 s after the restart
   * (tests/chaos seed 5061, its connection's receive queue full of
   * unread bytes), long enough to be declared lost and have its job
   * collected. A beat that waits for ready polls the handshake itself. */
  rc = hb_unary(c, !leaving, buf, len, deadline_ms,
                leaving ? 0 : FERRY_RPC_WAIT_FOR_READY, &reply, &reply_len,
                err);
  ferry__free(buf);
  if (rc != 0) {
    /* The dispatcher may not have seen the restarts: ask again. */
    pthread_mutex_lock(&c->mu);
    ferry__client_restart_unsent_locked(c);
    pthread_mutex_unlock(&c->mu);
    return rc;
  }
  *out = ferry__v1__client_heartbeat_response__unpack(&ferry__pb_allocator,
                                                      reply_len, reply);
  ferry__free(reply);
  if (*out == NULL)
    return ferry__seterr(err, FERRY_EGRPC_INTERNAL,
                         "%s: malformed answer",
                         FERRY_METHOD_CLIENT_HEARTBEAT);
  return 0;
}

static void *hb_main(void *arg) {
  ferry_client_t *c = arg;
  uint32_t period = c->opts.heartbeat_ms;
  /* A beat may take longer than a period, never longer than the connect
   * budget. */
  int deadline = period * 4 > 1000 ? (int)period * 4 : 1000;
  if (deadline > (int)c->opts.connect_timeout_ms)
    deadline = (int)c->opts.connect_timeout_ms;
  if (deadline < 1)
    deadline = 1;
  c->last_hb_ok = ferry__client_now();
  pthread_mutex_lock(&c->mu);
  while (!c->stopping) {
    pthread_mutex_unlock(&c->mu);
    Ferry__V1__ClientHeartbeatResponse *r;
    ferry_error_t e;
    double t_send = ferry__client_now();
    uint64_t records = 0;
    int rc = heartbeat(c, false, deadline, &r, &records, &e);
    if (rc != 0 && __atomic_load_n(&c->hb_cancelled, __ATOMIC_ACQUIRE)) {
      /* ferry_client_free cancelled the beat: leaving, not failing. */
      pthread_mutex_lock(&c->mu);
      break;
    }
    if (rc == 0) {
      c->last_hb_ok = ferry__client_now();
      pthread_mutex_lock(&c->mu);
      c->hb_down_since = 0;
      pthread_mutex_unlock(&c->mu);
      ferry__client_answer(c, t_send, records, r);
      sync_workers(c, r);
      ferry__v1__client_heartbeat_response__free_unpacked(
          r, &ferry__pb_allocator);
    } else {
      double down = ferry__client_now() - c->last_hb_ok;
      FERRY_LOG(FERRY_LOG_WARN, "client: heartbeat: %s", e.msg);
      pthread_mutex_lock(&c->mu);
      if (c->hb_down_since == 0)
        c->hb_down_since = c->last_hb_ok;
      size_t n = strnlen(e.msg, sizeof(c->hb_error) - 1);
      memcpy(c->hb_error, e.msg, n);
      c->hb_error[n] = '\0';
      pthread_mutex_unlock(&c->mu);
      if (down * 1e3 > c->opts.dispatcher_timeout_ms) {
        pthread_mutex_lock(&c->mu);
        ferry__client_fail_locked(c, rc,
                                  "dispatcher %s unreachable for %.0f s: %s",
                                  c->dispatcher, down, e.msg);
        pthread_mutex_unlock(&c->mu);
      }
    }
    pthread_mutex_lock(&c->mu);
    /* A rank waiting for the next epoch, which starts when the slowest
     * rank reports its last records: asking every FERRY__EPOCH_POLL_MS
     * meanwhile, rather than every heartbeat_ms, cut the gap between
     * epochs at 250 ms heartbeats from about 270 ms to one poll. */
    uint32_t wait = ferry__client_between_epochs_locked(c) &&
                            period > FERRY__EPOCH_POLL_MS
                        ? FERRY__EPOCH_POLL_MS
                        : period;
    struct timespec ts = ferry__client_deadline(wait);
    while (!c->stopping && !c->hb_kick &&
           pthread_cond_timedwait(&c->hb_cv, &c->mu, &ts) != ETIMEDOUT)
      ;
  }
  pthread_mutex_unlock(&c->mu);
  return NULL;
}

/* ---- Life cycle -------------------------------------------------------- */

/* The goodbye's deadline when the dispatcher did not answer lately. */
#define GOODBYE_SHORT_MS 50

/* The batch's shape and size from the spec and the options. */
static int batch_shape(ferry_client_t *c, const ferry_spec_t *spec,
                       ferry_error_t *err) {
  int h, w, ch;
  if (ferry_spec_output_shape(spec, &h, &w, &ch) != 0)
    return ferry__seterr(err, FERRY_ESHAPE,
                         "spec: images vary in size and a batch needs one "
                         "shape: add resize(height, width)");
  c->ap.height = (uint32_t)h;
  c->ap.width = (uint32_t)w;
  c->ap.channels = (uint32_t)ch;
  c->ap.batch_size = c->opts.batch_size ? c->opts.batch_size
                                        : spec->batch_size;
  c->ap.prefetch = c->opts.prefetch;
  c->ap.drop_remainder = c->opts.drop_remainder || spec->drop_remainder;
  c->ap.per_worker = c->opts.mode == FERRY_MODE_PARALLEL_EPOCHS;
  if (c->ap.batch_size == 0)
    return ferry__seterr(err, FERRY_EINVAL,
                         "client: no batch size: set batch_size or add "
                         "batch(N) to the spec");
  return 0;
}

static char *dup_opt(const char *s, bool *nomem) {
  if (s == NULL || s[0] == '\0')
    return NULL;
  char *d = ferry__strdup(s);
  if (d == NULL)
    *nomem = true;
  return d;
}

int ferry_client_new(const ferry_client_options_t *user_opts,
                     ferry_client_t **out, ferry_error_t *err) {
  double t0 = ferry__client_now();
  ferry_spec_t parsed, spec;
  bool have_parsed = false, nomem = false;
  uint8_t *packed = NULL;
  size_t packed_len = 0;
  int rc;
  *out = NULL;
  ferry_spec_init(&spec);
  ferry_client_options_t full_opts;
  if ((rc = ferry__client_options_copy(user_opts, &full_opts, err)) != 0)
    return rc;
  const ferry_client_options_t *opts = &full_opts;
  if (opts->dispatcher == NULL || opts->dispatcher[0] == 0)
    return ferry__seterr(err, FERRY_EINVAL,
                         "client: no dispatcher address: set the "
                         "'dispatcher' option to HOST:PORT");
  /* A malformed address is the caller's mistake, told now: gRPC would
   * dial port 0 or a wrapped-around port and time out much later. */
  if ((rc = ferry_hostport_parse(opts->dispatcher, 0, NULL, 0, NULL, err)) !=
      0)
    return ferry__prefixerr(err, "client: option 'dispatcher'");
  bool has_spec = opts->spec != NULL && opts->spec[0] != '\0';
  bool has_id = opts->dataset_id != NULL && opts->dataset_id[0] != '\0';
  if (has_spec == has_id)
    return ferry__seterr(err, FERRY_EINVAL,
                         "client: give either a spec or a dataset id "
                         "(options 'spec' and 'dataset_id')");
  if (opts->world_size > 1) {
    /* Ranks share one named distributed_epoch job. */
    if (opts->rank >= opts->world_size)
      return ferry__seterr(err, FERRY_EINVAL,
                           "client: rank %u is not below world_size %u",
                           opts->rank, opts->world_size);
    if (opts->job_name == NULL || opts->job_name[0] == '\0')
      return ferry__seterr(err, FERRY_EINVAL,
                           "client: rank %u of world_size %u needs a "
                           "job_name, the job every rank joins",
                           opts->rank, opts->world_size);
    if (opts->mode != FERRY_MODE_DISTRIBUTED_EPOCH)
      return ferry__seterr(err, FERRY_EINVAL,
                           "client: ranks (world_size %u) need mode "
                           "distributed_epoch", opts->world_size);
    if (has_id && opts->batch_size == 0)
      return ferry__seterr(err, FERRY_EINVAL,
                           "client: ranks (world_size %u) with a dataset "
                           "id need the option batch_size",
                           opts->world_size);
  }
  if (opts->order != FERRY_ORDER_ARRIVAL &&
      opts->order != FERRY_ORDER_DETERMINISTIC)
    return ferry__seterr(err, FERRY_EINVAL,
                         "client: order %d is neither arrival (0) nor "
                         "deterministic (1)", (int)opts->order);
  if (opts->resume != NULL && opts->resume_len > 0 &&
      opts->order != FERRY_ORDER_DETERMINISTIC)
    return ferry__seterr(err, FERRY_EINVAL,
                         "client: option 'resume' needs order "
                         "deterministic (a cursor is a position in that "
                         "order)");
  if (opts->order == FERRY_ORDER_DETERMINISTIC) {
    /* A rank's share of distributed epochs, in its order. */
    if (opts->mode != FERRY_MODE_DISTRIBUTED_EPOCH)
      return ferry__seterr(err, FERRY_EINVAL,
                           "client: order deterministic needs mode "
                           "distributed_epoch");
    if (has_id && opts->batch_size == 0)
      return ferry__seterr(err, FERRY_EINVAL,
                           "client: order deterministic with a dataset id "
                           "needs the option batch_size");
  }
  /* A cursor to resume from, read before any RPC. */
  ferry_cursor_t resume_cur;
  bool has_resume = opts->resume != NULL && opts->resume_len > 0;
  memset(&resume_cur, 0, sizeof(resume_cur));
  if (has_resume &&
      (rc = ferry_cursor_decode(opts->resume, opts->resume_len, &resume_cur,
                                err)) != 0)
    return ferry__prefixerr(err, "client: option 'resume'");
  /* A bad spec fails here, before any RPC. */
  if (has_spec) {
    if ((rc = ferry_spec_parse(opts->spec, &parsed, err)) != 0)
      return ferry__prefixerr(err, "spec");
    have_parsed = true;
    if ((rc = ferry_spec_pack(&parsed, &packed, &packed_len)) != 0) {
      ferry_spec_close(&parsed);
      return ferry__seterr(err, rc, "spec: cannot serialize it (%s)",
                           ferry_strerror(rc));
    }
  }
  pthread_once(&tune_once, tune);

  ferry_client_t *c = ferry__calloc(1, sizeof(*c));
  if (c == NULL) {
    rc = ferry__seterr(err, FERRY_ENOMEM, "client: out of memory");
    goto fail_early;
  }
  c->opts = *opts;
  c->networked = true;
  c->det = opts->order == FERRY_ORDER_DETERMINISTIC;
  c->det_ahead = c->det && opts->error_policy != FERRY_ON_ERROR_SKIP;
  c->resume = resume_cur;
  c->has_resume = has_resume;
  /* The caller's buffer is not ours to keep: the cursor was copied. */
  c->opts.resume = NULL;
  c->opts.resume_len = 0;
  c->ranked = opts->world_size > 1 || c->det;
  c->rk_world = opts->world_size > 1 ? opts->world_size : 1;
  c->pid = getpid();
  if (c->opts.prefetch == 0)
    c->opts.prefetch = 3;
  if (c->opts.splits_in_flight == 0)
    c->opts.splits_in_flight = 8;
  if (c->opts.heartbeat_ms == 0)
    c->opts.heartbeat_ms = 250;
  if (c->opts.connect_timeout_ms == 0)
    c->opts.connect_timeout_ms = 5000;
  if (c->opts.dispatcher_timeout_ms == 0)
    c->opts.dispatcher_timeout_ms = 30000;
  c->dispatcher = dup_opt(opts->dispatcher, &nomem);
  c->spec_text = dup_opt(opts->spec, &nomem);
  c->dataset_id_opt = dup_opt(opts->dataset_id, &nomem);
  c->job_name = dup_opt(opts->job_name, &nomem);
  c->augment_text = dup_opt(opts->augment, &nomem);
  c->tls_ca = dup_opt(opts->tls_ca, &nomem);
  c->tls_cert = dup_opt(opts->tls_cert, &nomem);
  c->tls_key = dup_opt(opts->tls_key, &nomem);
  /* The data-plane transport. FERRY_TRANSPORT (auto, grpc, ucx)
   * stands in for the job's option when that is unset, so a whole test
   * suite or a deployment can be switched without code. */
  c->transport = dup_opt(opts->transport != NULL && opts->transport[0] != '\0'
                             ? opts->transport
                             : getenv("FERRY_TRANSPORT"),
                         &nomem);
  c->opts.tls_ca = c->tls_ca;
  c->opts.tls_cert = c->tls_cert;
  c->opts.tls_key = c->tls_key;
  c->opts.token_file = NULL;
  c->tls.ca_file = c->tls_ca;
  c->tls.cert_file = c->tls_cert;
  c->tls.key_file = c->tls_key;
  if (c->tls_ca != NULL || c->tls_cert != NULL)
    c->rpc_opts.tls = &c->tls;
  c->opts.dispatcher = c->dispatcher;
  c->opts.augment = c->augment_text;
  c->opts.spec = c->spec_text;
  c->opts.dataset_id = c->dataset_id_opt;
  c->opts.job_name = c->job_name;
  if (nomem) {
    rc = ferry__seterr(err, FERRY_ENOMEM, "client: out of memory");
    goto fail;
  }
  if (c->transport != NULL && c->transport[0] != '\0' &&
      ferry_transport_choose(c->transport, true, NULL, 0, err) == NULL) {
    rc = ferry__prefixerr(err, "client");
    goto fail;
  }
  /* The staging options: a bad augment text or an unusable GPU fails
   * before any RPC. */
  ferry_augment_spec_init(&c->ap.augment);
  if (c->augment_text != NULL) {
    /* The parser's message starts "augment spec: column N". */
    if ((rc = ferry_augment_spec_parse(c->augment_text, &c->ap.augment,
                                       err)) != 0)
      goto fail;
    c->ap.has_augment = true;
  }
  c->ap.gpu = opts->gpu;
  c->ap.device = opts->device;
  c->ap.augment_seed = opts->augment_seed;
  c->ap.dtype = opts->dtype;
  c->ap.layout = opts->layout;
  if ((rc = ferry__staging_check(c, opts->device_fallback, err)) != 0)
    goto fail;
  /* With the spec in hand, what the batches cannot be fails before any
   * RPC too. */
  if (have_parsed && ((rc = batch_shape(c, &parsed, err)) != 0 ||
                      (rc = ferry__staging_check(c, false, err)) != 0))
    goto fail;
  if (opts->token_file != NULL && opts->token_file[0] != '\0') {
    if ((rc = ferry_rpc_read_token(opts->token_file, &c->token, err)) != 0) {
      ferry__prefixerr(err, "client: token file");
      goto fail;
    }
    c->rpc_opts.bearer_token = c->token;
  }
  /* gRPC 1.51 cannot run in a child forked while the parent ran it: its
   * timer and executor threads are gone and its epoll set is the
   * parent's, so the child's first call waited forever, past its
   * deadline (GRPC_ENABLE_FORK_SUPPORT=1 changed nothing: its fork
   * handlers skip a fork while threads wait in gRPC, as ours do). */
  if (__atomic_load_n(&g_rpc_users, __ATOMIC_ACQUIRE) > 0 &&
      __atomic_load_n(&g_rpc_pid, __ATOMIC_ACQUIRE) != getpid()) {
    rc = ferry__seterr(err, FERRY_EFORKED,
                       "client: this process was forked from process %ld "
                       "while a ferry client was open there, and gRPC "
                       "cannot run in such a child: create the Client in a "
                       "process started with multiprocessing's 'spawn' or "
                       "'forkserver', or fork before any Client exists",
                       (long)__atomic_load_n(&g_rpc_pid, __ATOMIC_ACQUIRE));
    goto fail;
  }
  ferry_rpc_init();
  c->rpc_inited = true;
  __atomic_store_n(&g_rpc_pid, getpid(), __ATOMIC_RELEASE);
  __atomic_add_fetch(&g_rpc_users, 1, __ATOMIC_ACQ_REL);
  if ((rc = ferry_rpc_channel_new(c->dispatcher, &c->rpc_opts, &c->dch,
                                  err)) != 0) {
    ferry__prefixerr(err, "client: dispatcher %s", c->dispatcher);
    goto fail;
  }
  if (has_spec) {
    if ((rc = register_dataset(c, packed, packed_len, t0, err)) != 0)
      goto fail;
  } else if ((c->dataset_id = ferry__strdup(opts->dataset_id)) == NULL) {
    rc = ferry__seterr(err, FERRY_ENOMEM, "client: out of memory");
    goto fail;
  }
  double t_job = ferry__client_now();
  if ((rc = get_job(c, have_parsed ? &parsed : NULL, &spec, t0, err)) != 0)
    goto fail;
  c->lease_until = t_job + ferry__client_lease_s(c);
  if (!have_parsed && ((rc = batch_shape(c, &spec, err)) != 0 ||
                       (rc = ferry__staging_check(c, false, err)) != 0))
    goto fail;
  if (c->ranked) {
    /* What the job was joined with, whatever the spec says. */
    c->ap.batch_size = c->rk_batch;
    c->ap.drop_remainder = !c->rk_pad;
  }
  if ((rc = ferry__asm_init(c, err)) != 0)
    goto fail;
  if (pthread_create(&c->hb_thread, NULL, hb_main, c) != 0) {
    rc = ferry__seterr(err, FERRY_ENOMEM, "client: cannot start a thread");
    goto fail;
  }
  c->hb_started = true;
  ferry_spec_close(&spec);
  if (have_parsed)
    ferry_spec_close(&parsed);
  ferry__free(packed);
  *out = c;
  return 0;
fail:
  ferry_client_free(c);
fail_early:
  ferry_spec_close(&spec);
  if (have_parsed)
    ferry_spec_close(&parsed);
  ferry__free(packed);
  return rc;
}

void ferry_client_free(ferry_client_t *c) {
  if (c == NULL)
    return;
  /* In a forked child everything here belongs to the parent too: the
   * heartbeat and reader threads do not exist (joining them hangs), the
   * gRPC channel's sockets and epoll set are shared (a goodbye heartbeat
   * from the child broke the parent's connection, and gRPC's state without
   * its threads crashed the child), UCX and CUDA objects are the parent's,
   * and `mu` may have been held by a parent thread at the fork. So the
   * child leaks the client deliberately: its pages are the parent's,
   * copy-on-write, and cost nothing until written. */
  if (ferry__client_forked(c, NULL) != 0)
    return;
  if (c->slots != NULL) {
    pthread_mutex_lock(&c->mu);
    c->stopping = true;
    if (c->hb_call != NULL) {
      __atomic_store_n(&c->hb_cancelled, true, __ATOMIC_RELEASE);
      ferry_rpc_stream_cancel(c->hb_call);
    }
    pthread_cond_broadcast(&c->hb_cv);
    pthread_cond_broadcast(&c->space_cv);
    pthread_cond_broadcast(&c->ready_cv);
    pthread_mutex_unlock(&c->mu);
  }
  if (c->hb_started)
    pthread_join(c->hb_thread, NULL);
  /* Goodbye: the splits go back to the pool from what the trainer got. */
  if (c->dch != NULL && c->hb_started) {
    Ferry__V1__ClientHeartbeatResponse *r = NULL;
    int deadline = c->opts.connect_timeout_ms < 2000
                       ? (int)c->opts.connect_timeout_ms
                       : 2000;
    /* A dispatcher that did not answer the last beat (or had not yet
     * when it was cancelled) gets a short goodbye: waiting for it held a
     * Ctrl-C'd trainer up to 2 s, and it times the client out anyway. */
    pthread_mutex_lock(&c->mu);
    if ((c->hb_failed || c->hb_cancelled) && deadline > GOODBYE_SHORT_MS)
      deadline = GOODBYE_SHORT_MS;
    pthread_mutex_unlock(&c->mu);
    uint64_t records;
    if (heartbeat(c, true, deadline, &r, &records, NULL) == 0)
      ferry__v1__client_heartbeat_response__free_unpacked(
          r, &ferry__pb_allocator);
  }
  for (size_t i = 0; i < c->n_workers; i++)
    if (c->workers[i]->stream != NULL)
      ferry_transport_cancel(c->workers[i]->stream);
  for (size_t i = 0; i < c->n_workers; i++)
    worker_free(c, c->workers[i]);
  ferry__free(c->workers);
  for (size_t i = 0; i < 2; i++)
    if (c->transports[i] != NULL)
      c->transports[i]->ops->client_free(c->transports[i]);
  ferry__free(c->transport);
  for (size_t i = 0; i < c->n_ucx_failed; i++)
    ferry__free(c->ucx_failed[i]);
  ferry__free(c->ucx_failed);
  ferry_rpc_channel_free(c->dch);
  if (c->rpc_inited) {
    ferry_rpc_shutdown();
    __atomic_sub_fetch(&g_rpc_users, 1, __ATOMIC_ACQ_REL);
  }
  ferry__asm_close(c);
  ferry__free(c->dispatcher);
  ferry__free(c->spec_text);
  ferry__free(c->dataset_id_opt);
  ferry__free(c->job_name);
  ferry__free(c->augment_text);
  ferry__free(c->tls_ca);
  ferry__free(c->tls_cert);
  ferry__free(c->tls_key);
  if (c->token != NULL)
    explicit_bzero(c->token, strlen(c->token));
  ferry__free(c->token);
  ferry__free(c->dataset_id);
  ferry__free(c);
}
