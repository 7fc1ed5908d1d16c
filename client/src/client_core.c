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

#include "alloc.h"
#include "client_internal.h"
#include "hostport.h"
#include "pb_alloc.h"
#include "rpc_methods.h"
#include "spec.h"
#include "varint.h"

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
    OPT_FIELD(share),
};
#undef OPT_FIELD
#define N_OPT_FIELDS (sizeof(opt_fields) / sizeof(opt_fields[0]))
_Static_assert(sizeof(ferry_client_options_t) -
                       (offsetof(ferry_client_options_t, share) +
                        sizeof(int)) <
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
  rc = ferry__cursor_encode(&cur, buf, cap, len);
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
static void tune(void) { (void)ferry__rpc_tune_malloc(); }

/* Packs a protobuf-c message into a ferry__malloc'd buffer. */
uint8_t *ferry__client_pack(const ProtobufCMessage *m, size_t *len) {
  *len = protobuf_c_message_get_packed_size(m);
  uint8_t *buf = ferry__malloc(*len > 0 ? *len : 1);
  if (buf != NULL)
    protobuf_c_message_pack(m, buf);
  return buf;
}

/* Milliseconds left of the connect budget that started at t0, at least 1
 * (0 would mean no deadline to ferry__rpc_unary). */
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
     * resolver and the port what is there (ferry__rpc_probe). */
    char why[320];
    bool tls = c->rpc_opts.tls != NULL;
    const char *hint = tls ? "down, or the TLS handshake failed: does "
                             "tls_ca sign its certificate, is that "
                             "certificate valid, is tls_cert accepted?"
                           : "down, or it serves TLS and this client "
                             "plaintext (set tls_ca)";
    switch (ferry__rpc_probe(c->dispatcher, 1000, why, sizeof(why))) {
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
  n += ferry__varint_put(req + n, spec_len);
  memcpy(req + n, spec, spec_len);
  n += spec_len;
  int rc = ferry__rpc_unary(c->dch, FERRY_METHOD_REGISTER_DATASET, req, n,
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
  jo.share = c->opts.share != 0;
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
  if ((buf = ferry__client_pack(&req.base, &len)) == NULL)
    return ferry__seterr(err, FERRY_ENOMEM, "client: out of memory");
  int rc = ferry__rpc_unary(c->dch, FERRY_METHOD_GET_OR_CREATE_JOB, buf, len,
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
    rc = ferry__spec_copy(spec, parsed);
    if (rc != 0)
      ferry__seterr(err, rc, "client: out of memory");
  } else if (r->spec == NULL) {
    rc = ferry__seterr(err, FERRY_EGRPC_INTERNAL,
                       "get or create job: dispatcher %s sent no spec for "
                       "dataset %s", c->dispatcher, c->dataset_id);
  } else if ((buf = ferry__client_pack(&r->spec->base, &len)) == NULL) {
    rc = ferry__seterr(err, FERRY_ENOMEM, "client: out of memory");
  } else {
    rc = ferry__spec_unpack(buf, len, spec, err);
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

/* ---- Life cycle -------------------------------------------------------- */

/* The goodbye's deadline when the dispatcher did not answer lately. */
#define GOODBYE_SHORT_MS 50

/* The batch's shape and size from the spec and the options. */
static int batch_shape(ferry_client_t *c, const ferry_spec_t *spec,
                       ferry_error_t *err) {
  int h, w, ch;
  if (ferry__spec_output_shape(spec, &h, &w, &ch) != 0)
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
  ferry__spec_init(&spec);
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
  if ((rc = ferry__hostport_parse(opts->dispatcher, 0, NULL, 0, NULL, err)) !=
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
  if (has_resume && (rc = ferry__cursor_decode(opts->resume, opts->resume_len,
                                               &resume_cur, err)) != 0)
    return ferry__prefixerr(err, "client: option 'resume'");
  /* A bad spec fails here, before any RPC. */
  if (has_spec) {
    if ((rc = ferry__spec_parse(opts->spec, &parsed, err)) != 0)
      return ferry__prefixerr(err, "spec");
    have_parsed = true;
    if ((rc = ferry__spec_pack(&parsed, &packed, &packed_len)) != 0) {
      ferry__spec_close(&parsed);
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
  /* The data-plane transport. FERRY_TRANSPORT (auto or a name)
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
  if ((rc = ferry__transport_want_check(c->transport, err)) != 0) {
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
    if ((rc = ferry__rpc_read_token(opts->token_file, &c->token, err)) != 0) {
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
  ferry__rpc_init();
  c->rpc_inited = true;
  __atomic_store_n(&g_rpc_pid, getpid(), __ATOMIC_RELEASE);
  __atomic_add_fetch(&g_rpc_users, 1, __ATOMIC_ACQ_REL);
  if ((rc = ferry__rpc_channel_new(c->dispatcher, &c->rpc_opts, &c->dch,
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
  if (pthread_create(&c->hb_thread, NULL, ferry__client_hb_main, c) != 0) {
    rc = ferry__seterr(err, FERRY_ENOMEM, "client: cannot start a thread");
    goto fail;
  }
  c->hb_started = true;
  ferry__spec_close(&spec);
  if (have_parsed)
    ferry__spec_close(&parsed);
  ferry__free(packed);
  *out = c;
  return 0;
fail:
  ferry_client_free(c);
fail_early:
  ferry__spec_close(&spec);
  if (have_parsed)
    ferry__spec_close(&parsed);
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
   * its threads crashed the child), transport and CUDA objects are the
   * parent's, and `mu` may have been held by a parent thread at the
   * fork. So the child leaks the client deliberately: its pages are the
   * parent's, copy-on-write, and cost nothing until written. */
  if (ferry__client_forked(c, NULL) != 0)
    return;
  if (c->slots != NULL) {
    pthread_mutex_lock(&c->mu);
    c->stopping = true;
    if (c->hb_call != NULL) {
      __atomic_store_n(&c->hb_cancelled, true, __ATOMIC_RELEASE);
      ferry__rpc_stream_cancel(c->hb_call);
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
    if (ferry__client_heartbeat(c, true, deadline, &r, &records, NULL) == 0)
      ferry__v1__client_heartbeat_response__free_unpacked(
          r, &ferry__pb_allocator);
  }
  for (size_t i = 0; i < c->n_workers; i++)
    if (c->workers[i]->stream != NULL)
      ferry__transport_cancel(c->workers[i]->stream);
  for (size_t i = 0; i < c->n_workers; i++)
    ferry__client_worker_free(c, c->workers[i]);
  ferry__free(c->workers);
  for (size_t i = 0; i < FERRY_TRANSPORTS_MAX; i++)
    if (c->transports[i] != NULL)
      c->transports[i]->ops->client_free(c->transports[i]);
  ferry__free(c->transport);
  for (size_t i = 0; i < c->n_fallbacks; i++)
    ferry__free(c->fallbacks[i].address);
  ferry__free(c->fallbacks);
  ferry__rpc_channel_free(c->dch);
  if (c->rpc_inited) {
    ferry__rpc_shutdown();
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
