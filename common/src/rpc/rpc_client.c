/* The blocking gRPC client: channels, server-streaming readers and unary
 * calls built on them.
 *
 * Each stream owns a completion queue that only the thread using the
 * stream polls, so streams need no locks and never wait on each other.
 * A stream has at most three batches in flight, each with its own tag
 * (the address of a field of the stream): the start batch (request and
 * initial metadata), the status batch (started at once, so a failure is
 * seen even while no message is requested) and the current message read.
 */
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "rpc_internal.h"
#include "tsan.h"

struct ferry_rpc_channel_s {
  grpc_channel *channel;
  char *authorization; /* "Bearer TOKEN", or NULL */
};

struct ferry_rpc_stream_s {
  grpc_completion_queue *cq;
  grpc_call *call;
  char *method;
  const char *authorization; /* the channel's */
  grpc_metadata_array initial_md, trailing_md;
  grpc_byte_buffer *recv_bb;
  grpc_status_code status;
  grpc_slice details;
  /* Tags; each also records whether its batch is in flight. */
  bool start_pending, msg_pending, status_pending;
  bool eof;   /* no more messages */
  int result; /* 1 while running, then 0 or FERRY_EGRPC_* */
};

/* ---- Channels ---------------------------------------------------------- */

int ferry__rpc_channel_new(const char *target, const ferry_rpc_options_t *opts,
                           ferry_rpc_channel_t **out, ferry_error_t *err) {
  grpc_arg args[FERRY__RPC_MAX_ARGS];
  ferry_rpc_options_t o;
  int rc = ferry__rpc_options(opts, &o, err);
  *out = NULL;
  if (rc != 0)
    return rc;
  ferry_rpc_channel_t *ch = ferry__calloc(1, sizeof(*ch));
  if (ch == NULL)
    return ferry__seterr(err, FERRY_ENOMEM, "rpc: out of memory");
  grpc_channel_args cargs = {ferry__rpc_channel_args(&o, false, args), args};
  grpc_channel_credentials *creds = NULL;
  if (o.bearer_token != NULL) {
    size_t n = strlen(o.bearer_token) + 8;
    if ((ch->authorization = ferry__malloc(n)) == NULL) {
      ferry__free(ch);
      return ferry__seterr(err, FERRY_ENOMEM, "rpc: out of memory");
    }
    snprintf(ch->authorization, n, "Bearer %s", o.bearer_token);
  }
  if (o.tls != NULL) {
    if ((rc = ferry__rpc_channel_creds(o.tls, &creds, err)) != 0) {
      ferry__free(ch->authorization);
      ferry__free(ch);
      return rc;
    }
  } else {
    creds = grpc_insecure_credentials_create();
  }
  ch->channel = grpc_channel_create(target, creds, &cargs);
  grpc_channel_credentials_release(creds);
  if (ch->channel == NULL) {
    ferry__free(ch->authorization);
    ferry__free(ch);
    return ferry__seterr(err, FERRY_EINVAL, "rpc: bad target %s", target);
  }
  *out = ch;
  return 0;
}

void ferry__rpc_channel_free(ferry_rpc_channel_t *ch) {
  if (ch == NULL)
    return;
  grpc_channel_destroy(ch->channel);
  if (ch->authorization != NULL)
    explicit_bzero(ch->authorization, strlen(ch->authorization));
  ferry__free(ch->authorization);
  ferry__free(ch);
}

/* ---- Messages ---------------------------------------------------------- */

/* Messages are handed out as raw, uncompressed byte buffers whose slices
 * can be indexed; anything else (a compressed buffer) is flattened. */
static grpc_byte_buffer *plain_bb(grpc_byte_buffer *bb) {
  grpc_byte_buffer_reader r;
  if (bb->type == GRPC_BB_RAW &&
      bb->data.raw.compression == GRPC_COMPRESS_NONE)
    return bb;
  if (!grpc_byte_buffer_reader_init(&r, bb)) {
    grpc_byte_buffer_destroy(bb);
    return NULL;
  }
  grpc_slice all = grpc_byte_buffer_reader_readall(&r);
  grpc_byte_buffer_reader_destroy(&r);
  grpc_byte_buffer_destroy(bb);
  grpc_byte_buffer *flat = grpc_raw_byte_buffer_create(&all, 1);
  grpc_slice_unref(all);
  return flat;
}

static void msg_set(ferry_rpc_msg_t *msg, grpc_byte_buffer *bb) {
  msg->impl_ = bb;
  msg->len = bb->data.raw.slice_buffer.length;
  msg->nslices = bb->data.raw.slice_buffer.count;
}

const uint8_t *ferry__rpc_msg_slice(const ferry_rpc_msg_t *msg, size_t i,
                                    size_t *len) {
  const grpc_byte_buffer *bb = msg->impl_;
  const grpc_slice *s = &bb->data.raw.slice_buffer.slices[i];
  *len = GRPC_SLICE_LENGTH(*s);
  return GRPC_SLICE_START_PTR(*s);
}

size_t ferry__rpc_msg_copy(const ferry_rpc_msg_t *msg, size_t offset, void *dst,
                           size_t n) {
  uint8_t *out = dst;
  size_t done = 0;
  for (size_t i = 0; i < msg->nslices && done < n; i++) {
    size_t len;
    const uint8_t *p = ferry__rpc_msg_slice(msg, i, &len);
    if (offset >= len) {
      offset -= len;
      continue;
    }
    size_t take = len - offset < n - done ? len - offset : n - done;
    memcpy(out + done, p + offset, take);
    done += take;
    offset = 0;
  }
  return done;
}

void ferry__rpc_msg_release(ferry_rpc_msg_t *msg) {
  if (msg == NULL || msg->impl_ == NULL)
    return;
  grpc_byte_buffer_destroy(msg->impl_);
  memset(msg, 0, sizeof(*msg));
}

/* ---- Streams ----------------------------------------------------------- */

static gpr_timespec deadline_after(int ms) {
  if (ms < 0)
    return gpr_inf_future(GPR_CLOCK_REALTIME);
  return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                      gpr_time_from_millis(ms, GPR_TIMESPAN));
}

static int start_ops(ferry_rpc_stream_t *s, const grpc_op *ops, size_t n,
                     bool *pending) {
  FERRY_TSAN_RELEASE(pending);
  if (grpc_call_start_batch(s->call, ops, n, pending, NULL) != GRPC_CALL_OK)
    return FERRY_EIO;
  *pending = true;
  return 0;
}

static int start_call(ferry_rpc_stream_t *s, const void *req, size_t len,
                      unsigned flags) {
  grpc_op ops[4];
  grpc_metadata auth;
  grpc_slice slice = grpc_slice_from_copied_buffer(req, len);
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&slice, 1);
  int rc;
  grpc_slice_unref(slice);
  memset(ops, 0, sizeof(ops));
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  if (flags & FERRY_RPC_WAIT_FOR_READY)
    ops[0].flags = GRPC_INITIAL_METADATA_WAIT_FOR_READY;
  if (s->authorization != NULL) {
    memset(&auth, 0, sizeof(auth));
    auth.key = grpc_slice_from_static_string("authorization");
    auth.value = grpc_slice_from_static_string(s->authorization);
    ops[0].data.send_initial_metadata.count = 1;
    ops[0].data.send_initial_metadata.metadata = &auth;
  }
  ops[1].op = GRPC_OP_SEND_MESSAGE;
  ops[1].data.send_message.send_message = bb;
  ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[3].data.recv_initial_metadata.recv_initial_metadata = &s->initial_md;
  rc = start_ops(s, ops, 4, &s->start_pending);
  /* gRPC took its own reference on the message. */
  grpc_byte_buffer_destroy(bb);
  if (rc != 0)
    return rc;
  memset(ops, 0, sizeof(ops));
  ops[0].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  ops[0].data.recv_status_on_client.trailing_metadata = &s->trailing_md;
  ops[0].data.recv_status_on_client.status = &s->status;
  ops[0].data.recv_status_on_client.status_details = &s->details;
  return start_ops(s, ops, 1, &s->status_pending);
}

int ferry__rpc_stream_open(ferry_rpc_channel_t *ch, const char *method,
                           const void *req, size_t len, int deadline_ms,
                           unsigned flags, ferry_rpc_stream_t **out,
                           ferry_error_t *err) {
  ferry_rpc_stream_t *s = ferry__calloc(1, sizeof(*s));
  *out = NULL;
  if (s == NULL || (s->method = ferry__strdup(method)) == NULL) {
    ferry__free(s);
    return ferry__seterr(err, FERRY_ENOMEM, "rpc: out of memory");
  }
  s->result = 1;
  s->authorization = ch->authorization;
  s->details = grpc_empty_slice();
  grpc_metadata_array_init(&s->initial_md);
  grpc_metadata_array_init(&s->trailing_md);
  s->cq = grpc_completion_queue_create_for_next(NULL);
  s->call = grpc_channel_create_call(
      ch->channel, NULL, GRPC_PROPAGATE_DEFAULTS, s->cq,
      grpc_slice_from_static_string(s->method), NULL,
      deadline_after(deadline_ms <= 0 ? -1 : deadline_ms), NULL);
  if (s->call == NULL || start_call(s, req, len, flags) != 0) {
    ferry__rpc_stream_free(s);
    return ferry__seterr(err, FERRY_EIO, "rpc: %s: cannot start the call",
                         method);
  }
  *out = s;
  return 0;
}

/* Waits for one event until `deadline` and books it. Returns false on
 * timeout. */
static bool wait_event(ferry_rpc_stream_t *s, gpr_timespec deadline) {
  grpc_event ev = grpc_completion_queue_next(s->cq, deadline, NULL);
  if (ev.type != GRPC_OP_COMPLETE)
    return false;
  FERRY_TSAN_ACQUIRE(ev.tag);
  *(bool *)ev.tag = false; /* the tag is the batch's pending flag */
  if (ev.tag == &s->status_pending)
    s->result = ferry__rpc_err_from_status(s->status);
  return true;
}

static int ended(ferry_rpc_stream_t *s, ferry_error_t *err) {
  if (s->result == 0)
    return FERRY_EOF;
  char *details = grpc_slice_to_c_string(s->details);
  ferry__seterr(err, s->result, "%s: %s", s->method, details);
  gpr_free(details);
  return s->result;
}

int ferry__rpc_stream_next(ferry_rpc_stream_t *s, ferry_rpc_msg_t *msg,
                           int timeout_ms, ferry_error_t *err) {
  gpr_timespec deadline = deadline_after(timeout_ms);
  memset(msg, 0, sizeof(*msg));
  if (!s->eof && !s->msg_pending) {
    grpc_op op;
    memset(&op, 0, sizeof(op));
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &s->recv_bb;
    if (start_ops(s, &op, 1, &s->msg_pending) != 0)
      s->eof = true;
  }
  while (s->msg_pending)
    if (!wait_event(s, deadline))
      return FERRY_ETIMEDOUT;
  if (s->recv_bb != NULL) {
    grpc_byte_buffer *bb = plain_bb(s->recv_bb);
    s->recv_bb = NULL;
    if (bb == NULL)
      return ferry__seterr(err, FERRY_ENOMEM, "%s: cannot read a message",
                           s->method);
    msg_set(msg, bb);
    return 0;
  }
  /* No message: the stream is over, and the status says how. */
  s->eof = true;
  while (s->status_pending)
    if (!wait_event(s, deadline))
      return FERRY_ETIMEDOUT;
  return ended(s, err);
}

int ferry__rpc_stream_status(const ferry_rpc_stream_t *s) { return s->result; }

void ferry__rpc_stream_cancel(ferry_rpc_stream_t *s) {
  grpc_call_cancel(s->call, NULL);
}

void ferry__rpc_stream_free(ferry_rpc_stream_t *s) {
  gpr_timespec forever = gpr_inf_future(GPR_CLOCK_REALTIME);
  if (s == NULL)
    return;
  if (s->call != NULL) {
    if (s->status_pending)
      grpc_call_cancel(s->call, NULL);
    /* Every started batch delivers its event, promptly after a cancel. */
    while (s->start_pending || s->msg_pending || s->status_pending)
      wait_event(s, forever);
    if (s->recv_bb != NULL)
      grpc_byte_buffer_destroy(s->recv_bb);
    grpc_call_unref(s->call);
  }
  grpc_completion_queue_shutdown(s->cq);
  while (grpc_completion_queue_next(s->cq, forever, NULL).type !=
         GRPC_QUEUE_SHUTDOWN)
    ;
  grpc_completion_queue_destroy(s->cq);
  grpc_metadata_array_destroy(&s->initial_md);
  grpc_metadata_array_destroy(&s->trailing_md);
  grpc_slice_unref(s->details);
  ferry__free(s->method);
  ferry__free(s);
}

/* ---- Unary calls ------------------------------------------------------- */

int ferry__rpc_unary(ferry_rpc_channel_t *ch, const char *method,
                     const void *req, size_t len, int deadline_ms,
                     unsigned flags, uint8_t **reply, size_t *reply_len,
                     ferry_error_t *err) {
  ferry_rpc_stream_t *s;
  ferry_rpc_msg_t msg;
  uint8_t *out = NULL;
  size_t out_len = 0;
  *reply = NULL;
  *reply_len = 0;
  int rc =
      ferry__rpc_stream_open(ch, method, req, len, deadline_ms, flags, &s, err);
  if (rc != 0)
    return rc;
  rc = ferry__rpc_stream_next(s, &msg, -1, err);
  if (rc == 0) {
    out_len = msg.len;
    out = ferry__malloc(out_len > 0 ? out_len : 1);
    if (out != NULL)
      ferry__rpc_msg_copy(&msg, 0, out, out_len);
    ferry__rpc_msg_release(&msg);
    /* The status follows the one message. */
    rc = ferry__rpc_stream_next(s, &msg, -1, err);
    if (rc == 0) {
      ferry__rpc_msg_release(&msg);
      rc = ferry__seterr(err, FERRY_EGRPC_INTERNAL,
                         "%s: more than one reply", method);
    } else if (rc == FERRY_EOF) {
      rc = out != NULL ? 0 : ferry__seterr(err, FERRY_ENOMEM,
                                           "%s: out of memory", method);
    }
  } else if (rc == FERRY_EOF) {
    rc = ferry__seterr(err, FERRY_EGRPC_INTERNAL, "%s: no reply", method);
  }
  ferry__rpc_stream_free(s);
  if (rc != 0) {
    ferry__free(out);
    return rc;
  }
  *reply = out;
  *reply_len = out_len;
  return 0;
}
