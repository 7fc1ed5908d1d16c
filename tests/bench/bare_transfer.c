/* bare_transfer: the same bytes between two processes of this machine, by
 * a bare gRPC server stream and by bare UCX, with no Ferry logic.
 *
 * The sender is this program re-executed (--serve grpc|ucx, its address
 * printed on a pipe); the receiver, this process, copies every message
 * into a ring of buffers as a client copies into its staging slots, and
 * counts its own CPU time (getrusage: the receiving process only).
 *
 *   (a) gRPC: common/rpc on both ends (a server-streaming call, each
 *       message a small header slice and the shared payload slice, as the
 *       workers send chunks); the receiver gather-copies each message.
 *   (b) UCX: UCP active messages, the header as the AM header and the
 *       payload as data from ucp_mem_map-ed memory, at most --window sends
 *       in flight; above UCX's rendezvous threshold the receiver posts
 *       ucp_am_recv_data_nbx straight into its ring buffer (zero copy on
 *       the sender, one copy by whatever transport UCX picks: cma on one
 *       host when the kernel allows process_vm_readv, else shared memory).
 *
 * Prints GB/s and receiver CPU s/GB for each message size (default 1 MiB
 * and 2 MiB, the chunk size). Usage:
 *   bare_transfer [--quick] [--bytes N] [--msg-bytes N[,N...]]
 *                 [--window N] [--only grpc|ucx]
 * UCX_TLS, UCX_NET_DEVICES and the rest of UCX's environment apply to both
 * ends. Exit 0 when every transfer moved every byte.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "alloc.h"
#include "bare_ucx.h"
#include "ferry/log.h"
#include "rpc.h"
#include "varint.h"

extern char **environ;

#define RING 8 /* receive buffers */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static double cpu_s(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 +
         (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
}

/* ---- The sender: gRPC ------------------------------------------------- */

static struct {
  uv_loop_t loop;
  ferry_rpc_server_t *server;
  uint8_t *payload;
  uint64_t msg_bytes, count, sent;
} G;

static void no_free(void *arg) { (void)arg; }

static void grpc_send(ferry_rpc_call_t *call);

static void grpc_sent(ferry_rpc_call_t *call, int ok, void *arg) {
  (void)arg;
  if (!ok) {
    ferry__rpc_stream_finish(call, FERRY_RPC_CANCELLED, "peer gone");
    return;
  }
  grpc_send(call);
}

static void grpc_send(ferry_rpc_call_t *call) {
  if (G.sent == G.count) {
    ferry__rpc_stream_finish(call, FERRY_RPC_OK, NULL);
    return;
  }
  /* Field 1 (index), then field 2's tag and length: valid protobuf with
   * the payload last, as a chunk. */
  uint8_t hdr[24];
  size_t n = 0;
  hdr[n++] = 0x08;
  n += ferry__varint_put(hdr + n, G.sent);
  hdr[n++] = 0x12;
  n += ferry__varint_put(hdr + n, G.msg_bytes);
  ferry_rpc_piece_t pieces[2] = {
      {hdr, n, NULL, NULL},
      {G.payload, G.msg_bytes, no_free, NULL},
  };
  G.sent++;
  if (ferry__rpc_stream_send(call, pieces, 2, grpc_sent, NULL) != 0)
    ferry__rpc_stream_finish(call, FERRY_RPC_INTERNAL, "send failed");
}

static void grpc_handler(ferry_rpc_call_t *call, const uint8_t *req,
                         size_t len, void *user) {
  (void)req;
  (void)len;
  (void)user;
  G.sent = 0;
  grpc_send(call);
}

static uv_poll_t stdin_poll;

static void on_stdin(uv_poll_t *h, int status, int events) {
  (void)status;
  (void)events;
  /* The receiver closed the pipe: it is done. */
  uv_poll_stop(h);
  uv_close((uv_handle_t *)h, NULL);
  ferry__rpc_server_shutdown(G.server, NULL, NULL);
}

static int serve_grpc(int out_fd) {
  ferry_error_t err = {0};
  int port = 0;
  ferry__rpc_init();
  if (uv_loop_init(&G.loop) != 0 ||
      ferry__rpc_server_new(&G.loop, NULL, &G.server, &err) != 0 ||
      ferry__rpc_server_register(G.server, "/bench.Bare/Stream",
                                 FERRY_RPC_SERVER_STREAM, grpc_handler, NULL,
                                 &err) != 0 ||
      ferry__rpc_server_start(G.server, "127.0.0.1:0", &port, &err) != 0) {
    fprintf(stderr, "bare_transfer: gRPC sender: %s\n", err.msg);
    return 1;
  }
  dprintf(out_fd, "%d\n", port);
  close(out_fd);
  uv_poll_init(&G.loop, &stdin_poll, 0);
  uv_poll_start(&stdin_poll, UV_READABLE | UV_DISCONNECT, on_stdin);
  uv_run(&G.loop, UV_RUN_DEFAULT);
  uv_loop_close(&G.loop);
  ferry__rpc_shutdown();
  return 0;
}

/* ---- The receiver: gRPC ----------------------------------------------- */

static uint64_t recv_grpc(const char *port, uint64_t msg_bytes,
                          uint64_t count, uint8_t **ring, double *secs) {
  ferry_error_t err = {0};
  char target[64];
  snprintf(target, sizeof(target), "127.0.0.1:%.16s", port);
  ferry_rpc_channel_t *ch = NULL;
  ferry_rpc_stream_t *s = NULL;
  uint64_t got = 0, i = 0;
  double t0 = now_s();
  if (ferry__rpc_channel_new(target, NULL, &ch, &err) != 0 ||
      ferry__rpc_stream_open(ch, "/bench.Bare/Stream", "", 0, 0,
                             FERRY_RPC_WAIT_FOR_READY, &s, &err) != 0) {
    fprintf(stderr, "bare_transfer: gRPC receiver: %s\n", err.msg);
  } else {
    for (;;) {
      ferry_rpc_msg_t m;
      int rc = ferry__rpc_stream_next(s, &m, 30000, &err);
      if (rc != 0) {
        if (rc != FERRY_EOF)
          fprintf(stderr, "bare_transfer: gRPC stream: %s\n", err.msg);
        break;
      }
      /* The payload is the last msg_bytes of the message. */
      if (m.len >= msg_bytes)
        got += ferry__rpc_msg_copy(&m, m.len - msg_bytes, ring[i++ % RING],
                                   msg_bytes);
      ferry__rpc_msg_release(&m);
    }
  }
  *secs = now_s() - t0;
  (void)count;
  ferry__rpc_stream_free(s);
  ferry__rpc_channel_free(ch);
  return got;
}

/* ---- Running one transfer ---------------------------------------------- */

typedef struct result_s {
  const char *transport;
  uint64_t msg_bytes, bytes;
  double secs, cpu;
} result_t;

/* Starts `self --serve KIND --msg-bytes M --count N`, reads the line it
 * prints (its address), runs the receiver, closes the sender's stdin and
 * reaps it. */
static int run_one(const char *self, const char *kind, uint64_t msg_bytes,
                   uint64_t count, int window, uint8_t **ring,
                   result_t *r) {
  int to_child[2], from_child[2];
  if (pipe(to_child) != 0 || pipe(from_child) != 0)
    return -1;
  char m[32], n[32], wnd[32];
  snprintf(m, sizeof(m), "%llu", (unsigned long long)msg_bytes);
  snprintf(n, sizeof(n), "%llu", (unsigned long long)count);
  snprintf(wnd, sizeof(wnd), "%d", window);
  char *argv[] = {(char *)self, "--serve", (char *)kind, "--msg-bytes", m,
                  "--count", n, "--window", wnd, NULL};
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, to_child[0], 0);
  posix_spawn_file_actions_adddup2(&fa, from_child[1], 3);
  posix_spawn_file_actions_addclose(&fa, to_child[1]);
  posix_spawn_file_actions_addclose(&fa, from_child[0]);
  pid_t pid;
  int rc = posix_spawn(&pid, self, &fa, NULL, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  close(to_child[0]);
  close(from_child[1]);
  if (rc != 0) {
    fprintf(stderr, "bare_transfer: spawn %s: %s\n", self, strerror(rc));
    close(to_child[1]);
    close(from_child[0]);
    return -1;
  }
  /* The address line: bounded wait. */
  char line[8192];
  size_t len = 0;
  struct pollfd pfd = {.fd = from_child[0], .events = POLLIN};
  while (len < sizeof(line) - 1 && poll(&pfd, 1, 10000) == 1) {
    ssize_t k = read(from_child[0], line + len, sizeof(line) - 1 - len);
    if (k <= 0)
      break;
    len += (size_t)k;
    if (line[len - 1] == '\n')
      break;
  }
  line[len] = '\0';
  close(from_child[0]);
  r->transport = kind;
  r->msg_bytes = msg_bytes;
  r->bytes = 0;
  if (len == 0 || line[len - 1] != '\n') {
    fprintf(stderr, "bare_transfer: the %s sender printed no address\n",
            kind);
  } else {
    line[len - 1] = '\0';
    double c0 = cpu_s();
    if (strcmp(kind, "grpc") == 0)
      r->bytes = recv_grpc(line, msg_bytes, count, ring, &r->secs);
    else
      r->bytes = ferry_bare_ucx_recv(line, msg_bytes, count, ring, RING,
                                     &r->secs);
    r->cpu = cpu_s() - c0;
  }
  close(to_child[1]);
  int st = 0;
  /* The sender exits once its stdin closes; bounded. */
  for (int i = 0; i < 1000; i++) {
    if (waitpid(pid, &st, WNOHANG) == pid)
      return 0;
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL); /* polling a child's exit, not synchronising */
  }
  kill(pid, SIGKILL);
  waitpid(pid, &st, 0);
  fprintf(stderr, "bare_transfer: the %s sender did not exit: killed\n",
          kind);
  return 0;
}

static int parse_sizes(const char *s, uint64_t *out, int max) {
  int n = 0;
  while (*s != '\0' && n < max) {
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s)
      return -1;
    if (*end == 'K' || *end == 'k')
      v <<= 10, end++;
    else if (*end == 'M' || *end == 'm')
      v <<= 20, end++;
    out[n++] = v;
    s = *end == ',' ? end + 1 : end;
    if (*end != ',' && *end != '\0')
      return -1;
  }
  return n;
}

int main(int argc, char **argv) {
  uint64_t bytes = 1ull << 30;
  uint64_t sizes[8] = {1u << 20, 2u << 20};
  int nsizes = 2, window = 8;
  uint64_t msg_bytes = 0, count = 0;
  const char *serve = NULL, *only = NULL;
  static const struct option longopts[] = {
      {"quick", no_argument, NULL, 'q'},
      {"bytes", required_argument, NULL, 'b'},
      {"msg-bytes", required_argument, NULL, 'm'},
      {"window", required_argument, NULL, 'w'},
      {"only", required_argument, NULL, 'o'},
      {"serve", required_argument, NULL, 's'},
      {"count", required_argument, NULL, 'c'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0}};
  int ch;
  while ((ch = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
    switch (ch) {
    case 'q': bytes = 256ull << 20; break;
    case 'b': bytes = strtoull(optarg, NULL, 10); break;
    case 'm':
      nsizes = parse_sizes(optarg, sizes, 8);
      msg_bytes = nsizes > 0 ? sizes[0] : 0;
      break;
    case 'w': window = atoi(optarg); break;
    case 'o': only = optarg; break;
    case 's': serve = optarg; break;
    case 'c': count = strtoull(optarg, NULL, 10); break;
    default:
      fprintf(ch == 'h' ? stdout : stderr,
              "usage: bare_transfer [--quick] [--bytes N] "
              "[--msg-bytes N[K|M][,N...]] [--window N] "
              "[--only grpc|ucx]\n");
      return ch == 'h' ? 0 : 2;
    }
  }
  if (nsizes < 1 || window < 1 || window > 64 || bytes == 0) {
    fprintf(stderr, "bare_transfer: bad --msg-bytes, --window (1..64) or "
            "--bytes\n");
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  ferry_log_set_callback(ferry_log_to_stderr, NULL);

  if (serve != NULL) {
    uint8_t *payload = ferry__malloc(msg_bytes);
    if (payload == NULL)
      return 1;
    for (uint64_t i = 0; i < msg_bytes; i++)
      payload[i] = (uint8_t)(i * 131 + 7);
    int rc;
    if (strcmp(serve, "grpc") == 0) {
      G.payload = payload;
      G.msg_bytes = msg_bytes;
      G.count = count;
      rc = serve_grpc(3);
    } else {
      rc = ferry_bare_ucx_serve(3, 0, payload, msg_bytes, count, window);
    }
    ferry__free(payload);
    return rc;
  }

  char self[4096];
  ssize_t k = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (k <= 0)
    return 1;
  self[k] = '\0';
  ferry__rpc_init();
  const char *env_tls = getenv("UCX_TLS");
  printf("bare transfer: %.0f MiB per run between two processes; UCX %s, "
         "UCX_TLS=%s, window %d\n",
         (double)bytes / (1 << 20), ferry_bare_ucx_version(),
         env_tls != NULL ? env_tls : "(default)", window);
  fflush(stdout);
  result_t res[32];
  int nres = 0, status = 0;
  for (int s = 0; s < nsizes; s++) {
    uint64_t mb = sizes[s];
    uint64_t n = (bytes + mb - 1) / mb;
    uint8_t *ring[RING];
    for (int i = 0; i < RING; i++) {
      ring[i] = ferry__malloc(mb);
      if (ring[i] == NULL)
        return 1;
      memset(ring[i], 0, mb); /* fault the pages in before timing */
    }
    const char *kinds[2] = {"grpc", "ucx"};
    for (int t = 0; t < 2; t++) {
      if (only != NULL && strcmp(only, kinds[t]) != 0)
        continue;
      if (t == 1 && !ferry_bare_ucx_available()) {
        printf("  ucx: not built (FERRY_WITH_UCX found no libucx)\n");
        continue;
      }
      result_t *r = &res[nres++];
      run_one(self, kinds[t], mb, n, window, ring, r);
      if (r->bytes != n * mb) {
        fprintf(stderr, "bare_transfer: %s with %llu-byte messages moved "
                "%llu of %llu bytes\n", kinds[t], (unsigned long long)mb,
                (unsigned long long)r->bytes,
                (unsigned long long)(n * mb));
        status = 1;
      }
    }
    for (int i = 0; i < RING; i++)
      ferry__free(ring[i]);
  }
  printf("\n  %-10s %12s %10s %8s %12s\n", "transport", "message",
         "GB/s", "seconds", "recv CPU s/GB");
  for (int i = 0; i < nres; i++) {
    const result_t *r = &res[i];
    double gb = (double)r->bytes / 1e9;
    printf("  %-10s %9.0f KiB %10.2f %8.2f %12.3f\n", r->transport,
           (double)r->msg_bytes / 1024,
           r->secs > 0 ? gb / r->secs : 0.0, r->secs,
           gb > 0 ? r->cpu / gb : 0.0);
  }
  ferry__rpc_shutdown();
  if (status == 0)
    printf("bare transfer: ok\n");
  return status;
}
