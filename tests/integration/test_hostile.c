/* Hostile specs against real daemons: a
 * dispatcher and a worker with --data-root, and a caller that names files
 * outside the root, probes for files with globs, names a FIFO, or names a
 * secret file inside the root hoping to read it back through the error
 * text. Each attack must do no harm, and the cluster must then still
 * serve a real job exactly once.
 *
 * End to end: the warning about metrics on a public address,
 * the daemons' --handshake-timeout-ms and --idle-connection-ms on raw
 * connections, and a JPEG over the worker's --jpeg-max-pixels under
 * policies fail and skip. */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <criterion/hooks.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <turbojpeg.h>
#include <unistd.h>

#include "harness.h"
#include "tfrecord.h"
#include "varint.h"

static hx_proc_t *D, *W;
static hx_dataset_t DS;

HX_SUITE(hostile, 120, NULL, NULL);

/* A cluster whose data root is the dataset's directory. */
static void rooted_cluster(void) {
  char why[512];
  cr_assert_eq(hx_make_dataset(&DS, "root", 2, 200, 8, 8, 3), 0);
  const char *extra[] = {"--data-root", DS.dir, NULL};
  hx_daemon_opts_t d = {.extra_argv = extra};
  cr_assert_eq(hx_start_dispatcher(&D, &d, why, sizeof(why)), 0, "%s", why);
  cr_assert_eq(hx_start_worker(&W, D->addr, &d, why, sizeof(why)), 0, "%s",
               why);
  cr_assert_eq(hx_wait_workers(D->addr, 1, 10000), 1);
}

/* True for a refusal as PERMISSION_DENIED (the client keeps gRPC's code). */
static bool denied(int rc) {
  return rc == FERRY_EACCES || rc == FERRY_EGRPC_PERMISSION_DENIED;
}

/* ferry_client_new over `pattern`: its code, and the error in `err`. */
static int try_spec(const char *pattern, int timeout_ms, ferry_error_t *err) {
  char spec[1024];
  ferry_client_options_t o;
  ferry_client_t *c = NULL;
  snprintf(spec, sizeof(spec),
           "tfrecord(\"%s\") | decode(raw, 8, 8, 3) | batch(10)", pattern);
  hx_client_options(&o, D->addr, spec);
  o.num_epochs = 1;
  o.connect_timeout_ms = (uint32_t)timeout_ms;
  int rc = ferry_client_new(&o, &c, err);
  if (rc == 0) {
    /* Registration passed: the job may still fail on its records. */
    const ferry_batch_t *b;
    rc = ferry_next(c, &b, timeout_ms, err);
    while (rc == 0) {
      ferry_batch_release(c, b);
      rc = ferry_next(c, &b, timeout_ms, err);
    }
    ferry_client_free(c);
  }
  return rc;
}

/* The cluster still serves a real job, every record once. */
static void still_serves(void) {
  char spec[1024];
  ferry_client_options_t o;
  ferry_client_t *c;
  ferry_error_t err = {0};
  hx_spec(&DS, NULL, 32, spec, sizeof(spec));
  hx_client_options(&o, D->addr, spec);
  o.num_epochs = 1;
  cr_assert_eq(ferry_client_new(&o, &c, &err), 0, "%s", err.msg);
  hx_ids_t got = {0};
  cr_assert_eq(hx_collect_epoch(c, &got, &DS, true, 10000, NULL, NULL, &err),
               FERRY_EPOCH_END, "%s", err.msg);
  size_t n;
  uint64_t *want = hx_expected_ids(&DS, false, &n);
  char why[256];
  cr_assert(hx_same_multiset(got.ids, got.n, want, n, why, sizeof(why)),
            "%s", why);
  free(want);
  hx_ids_free(&got);
  ferry_client_free(c);
}

Test(hostile, files_outside_the_root_and_glob_probes_are_refused_alike) {
  ferry_error_t e1 = {0}, e2 = {0}, e3 = {0};
  rooted_cluster();
  cr_assert(denied(try_spec("/etc/passwd", 5000, &e1)), "%s", e1.msg);
  cr_assert(strstr(e1.msg, "outside every --data-root") != NULL, "%s",
            e1.msg);
  /* Before: /etc/pass[w-z]* found 2 files and /etc/pass[a-v]* answered
   * NOT_FOUND, an oracle for what exists. Now both answer the same. */
  cr_assert(denied(try_spec("/etc/pass[w-z]*", 5000, &e2)), "%s", e2.msg);
  cr_assert(denied(try_spec("/etc/pass[a-v]*", 5000, &e3)), "%s", e3.msg);
  cr_assert(strstr(e2.msg, "outside every --data-root") != NULL &&
                strstr(e3.msg, "outside every --data-root") != NULL,
            "%s | %s", e2.msg, e3.msg);
  /* A symlink inside the root to a file outside it. */
  char link[700];
  snprintf(link, sizeof(link), "%s/shadow.tfrecord", DS.dir);
  cr_assert_eq(symlink("/etc/passwd", link), 0);
  cr_assert(denied(try_spec(link, 5000, &e1)), "%s", e1.msg);
  unlink(link);
  still_serves();
}

Test(hostile, a_fifo_is_refused_at_once_and_the_dispatcher_keeps_serving) {
  ferry_error_t err = {0};
  char fifo[700];
  rooted_cluster();
  snprintf(fifo, sizeof(fifo), "%s/pipe.tfrecord", DS.dir);
  cr_assert_eq(mkfifo(fifo, 0600), 0);
  double t0 = hx_now_ms();
  cr_assert_eq(try_spec(fifo, 5000, &err), FERRY_EINVAL, "%s", err.msg);
  double took = hx_now_ms() - t0;
  cr_assert(strstr(err.msg, "not a regular file") != NULL, "%s", err.msg);
  cr_assert_lt(took, 2000, "refused in %.0f ms", took);
  unlink(fifo);
  /* Before, the scan blocked in open() on the loop thread and heartbeats
   * went unanswered (one worker showed up as 14). */
  cr_assert_eq(hx_wait_workers(D->addr, 1, 5000), 1);
  still_serves();
}

/* A secret inside the root (a stand-in for /etc/shadow: text, not a
 * TFRecord): the job fails naming the file and offset, and the message
 * quotes none of its bytes (before: the "length field" and "stored CRC"
 * numbers decoded to "root:*:20228"). */
Test(hostile, error_text_quotes_no_file_bytes) {
  ferry_error_t err = {0};
  char path[700];
  const char *secret = "root:*:20228:0:99999:7:::\n";
  rooted_cluster();
  snprintf(path, sizeof(path), "%s/secret.tfrecord", DS.dir);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  cr_assert_geq(fd, 0);
  cr_assert_eq(write(fd, secret, strlen(secret)), (ssize_t)strlen(secret));
  close(fd);
  int rc = try_spec(path, 10000, &err);
  cr_assert_neq(rc, 0);
  cr_assert(strstr(err.msg, "secret.tfrecord") != NULL, "%s", err.msg);
  uint64_t len = 0;
  uint32_t stored = 0;
  memcpy(&len, secret, 8);
  memcpy(&stored, secret + 8, 4);
  char num[32], hex[16], dec[16];
  snprintf(num, sizeof(num), "%llu", (unsigned long long)len);
  snprintf(hex, sizeof(hex), "%08x", stored);
  snprintf(dec, sizeof(dec), "%u", stored);
  cr_assert(strstr(err.msg, num) == NULL && strstr(err.msg, hex) == NULL &&
                strstr(err.msg, dec) == NULL && strstr(err.msg, "root:") ==
                NULL,
            "the error quotes file bytes: %s", err.msg);
  fprintf(stderr, "secret file: the caller saw \"%s\"\n", err.msg);
  still_serves();
}

/* ---- The metrics server's warning ---------------------
 * A daemon whose metrics server (plain HTTP) binds a non-loopback address
 * says so in its log, naming the address, the port and --metrics-host; on
 * loopback (the harness's --host 127.0.0.1, the default metrics host) it
 * says nothing. */

/* The daemon's "metrics on http://HOST:PORT/metrics" line: HOST:PORT. */
static void metrics_hostport(hx_proc_t *p, char *out, size_t cap) {
  cr_assert_eq(hx_metrics_address(p, 5000, out, cap), 0,
               "%s printed no metrics line", p->name);
}

/* The warning in p's log for metrics on HOSTPORT (host `host`): present
 * or absent as `want`. */
static void expect_metrics_warning(hx_proc_t *p, const char *hostport,
                                   const char *host, bool want) {
  char line[512];
  snprintf(line, sizeof(line),
           "PLAIN HTTP metrics on %s (--metrics-host %s)", hostport, host);
  /* The warning is logged (stderr, unbuffered) before the metrics line
   * is printed on stdout, which the caller has read. */
  char *log = hx_slurp(p->log);
  cr_assert_not_null(log);
  if (want)
    cr_assert(strstr(log, line) != NULL &&
                  strstr(log, "use --metrics-host 127.0.0.1") != NULL,
              "%s: no warning \"%s\" in its log:\n%s", p->name, line, log);
  else
    cr_assert(strstr(log, "PLAIN HTTP metrics") == NULL,
              "%s warns about metrics on loopback:\n%s", p->name, log);
  free(log);
}

Test(hostile, metrics_on_a_public_address_are_warned_about) {
  char why[512], dhp[128], whp[128];
  hx_proc_t *d, *w;
  const char *pub[] = {"--metrics-host", "0.0.0.0", "--metrics-port", "0",
                       NULL};
  hx_daemon_opts_t o = {.extra_argv = pub};
  cr_assert_eq(hx_start_dispatcher(&d, &o, why, sizeof(why)), 0, "%s", why);
  cr_assert_eq(hx_start_worker(&w, d->addr, &o, why, sizeof(why)), 0, "%s",
               why);
  metrics_hostport(d, dhp, sizeof(dhp));
  metrics_hostport(w, whp, sizeof(whp));
  cr_assert(strncmp(dhp, "0.0.0.0:", 8) == 0 &&
                strncmp(whp, "0.0.0.0:", 8) == 0,
            "metrics on %s and %s", dhp, whp);
  expect_metrics_warning(d, dhp, "0.0.0.0", true);
  expect_metrics_warning(w, whp, "0.0.0.0", true);
  /* The warned-about server does serve. */
  char local[200];
  char *body = NULL;
  snprintf(local, sizeof(local), "127.0.0.1:%s", strchr(dhp, ':') + 1);
  cr_assert_eq(hx_http_get(local, "/healthz", 5000, &body), 200);
  free(body);
  hx_stop(w, SIGTERM, 3000, NULL);
  hx_stop(d, SIGTERM, 3000, NULL);

  /* Loopback (metrics on --host 127.0.0.1): no warning. */
  const char *lo[] = {"--metrics-port", "0", NULL};
  o.extra_argv = lo;
  cr_assert_eq(hx_start_dispatcher(&d, &o, why, sizeof(why)), 0, "%s", why);
  cr_assert_eq(hx_start_worker(&w, d->addr, &o, why, sizeof(why)), 0, "%s",
               why);
  metrics_hostport(d, dhp, sizeof(dhp));
  metrics_hostport(w, whp, sizeof(whp));
  cr_assert(strncmp(dhp, "127.0.0.1:", 10) == 0 &&
                strncmp(whp, "127.0.0.1:", 10) == 0,
            "metrics on %s and %s", dhp, whp);
  expect_metrics_warning(d, dhp, "127.0.0.1", false);
  expect_metrics_warning(w, whp, "127.0.0.1", false);
}

/* ---- The daemons' connection limits -------------------
 * Raw TCP connections to the dispatcher's gRPC port: one that never
 * finishes the HTTP/2 preface is closed after --handshake-timeout-ms, one
 * that finishes it and never calls after --idle-connection-ms. Under the
 * defaults (10 s, 20 s) both are still open after 1.5 s. */

/* A TCP connection to "127.0.0.1:PORT". */
static int connect_to(const char *hostport) {
  const char *colon = strrchr(hostport, ':');
  cr_assert_not_null(colon, "%s", hostport);
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_port = htons((uint16_t)atoi(colon + 1))};
  cr_assert_eq(inet_pton(AF_INET, "127.0.0.1", &a.sin_addr), 1);
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  cr_assert_geq(fd, 0);
  cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0, "%s",
               strerror(errno));
  return fd;
}

/* Reads (and drops) what the server sends until it closes the
 * connection (EOF or ECONNRESET), at most `wait_ms`: the time from
 * `t0` to the close, or -1 when it is still open. *got gets the bytes
 * read. */
static double closed_after(int fd, double t0, int wait_ms, size_t *got) {
  char buf[4096];
  double deadline = hx_now_ms() + wait_ms;
  *got = 0;
  for (;;) {
    int left = (int)(deadline - hx_now_ms());
    if (left <= 0)
      return -1;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int pr = poll(&p, 1, left);
    if (pr < 0 && errno == EINTR)
      continue;
    if (pr <= 0)
      return -1;
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n > 0) {
      *got += (size_t)n;
      continue;
    }
    if (n < 0 && errno == EINTR)
      continue;
    if (n == 0 || errno == ECONNRESET)
      return hx_now_ms() - t0;
    cr_assert_fail("read: %s", strerror(errno));
  }
}

/* The client's HTTP/2 connection preface and an empty SETTINGS frame. */
static void send_preface(int fd) {
  static const char preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
  static const uint8_t settings[9] = {0, 0, 0, 4, 0, 0, 0, 0, 0};
  cr_assert_eq(write(fd, preface, 24), 24);
  cr_assert_eq(write(fd, settings, 9), 9);
}

/* `ferryctl status` against `addr` succeeds. */
static void status_works(const char *addr) {
  int st = -1;
  char *json = hx_ferryctl_status_json(addr, &st);
  cr_assert_not_null(json, "cannot run %s", hx_ferryctl_bin());
  cr_assert_eq(st, 0, "ferryctl status exited %d:\n%s", st, json);
  cr_assert(hx_json_valid(json), "%s", json);
  free(json);
}

Test(hostile, a_connection_that_never_finishes_its_handshake_is_closed) {
  char why[512];
  hx_proc_t *d;
  const char *extra[] = {"--handshake-timeout-ms", "300", NULL};
  hx_daemon_opts_t o = {.extra_argv = extra};
  cr_assert_eq(hx_start_dispatcher(&d, &o, why, sizeof(why)), 0, "%s", why);
  /* One socket sends nothing, one half the preface. */
  double t0 = hx_now_ms();
  int silent = connect_to(d->addr);
  int partial = connect_to(d->addr);
  cr_assert_eq(write(partial, "PRI * HTTP/2.0\r\n", 16), 16);
  status_works(d->addr); /* a real client meanwhile */
  size_t got;
  double a = closed_after(silent, t0, 5000, &got);
  double b = closed_after(partial, t0, 5000, &got);
  fprintf(stderr, "handshake timeout 300 ms: silent closed after %.0f ms, "
          "partial preface after %.0f ms\n", a, b);
  cr_assert(a >= 0, "a silent connection still open after 5 s");
  cr_assert(b >= 0, "a half-sent preface still open after 5 s");
  cr_assert_geq(a, 250, "closed after %.0f ms, before the timeout", a);
  close(silent);
  close(partial);
  status_works(d->addr);
  hx_stop(d, SIGTERM, 3000, NULL);

  /* The default (10 s): the same connection still open after 1.5 s. */
  cr_assert_eq(hx_start_dispatcher(&d, NULL, why, sizeof(why)), 0, "%s", why);
  silent = connect_to(d->addr);
  a = closed_after(silent, hx_now_ms(), 1500, &got);
  cr_assert(a < 0, "closed after %.0f ms under the default timeout", a);
  close(silent);
}

Test(hostile, a_connection_that_never_calls_is_closed_when_idle) {
  char why[512];
  hx_proc_t *d;
  const char *extra[] = {"--idle-connection-ms", "300", NULL};
  hx_daemon_opts_t o = {.extra_argv = extra};
  cr_assert_eq(hx_start_dispatcher(&d, &o, why, sizeof(why)), 0, "%s", why);
  double t0 = hx_now_ms();
  int fd = connect_to(d->addr);
  send_preface(fd); /* the handshake is done: only the idle rule applies */
  status_works(d->addr);
  size_t got;
  double a = closed_after(fd, t0, 5000, &got);
  fprintf(stderr, "idle connection 300 ms: closed after %.0f ms (%zu bytes "
          "read)\n", a, got);
  cr_assert(a >= 0, "an idle connection still open after 5 s");
  /* The server answered the preface (its SETTINGS, then a GOAWAY). */
  cr_assert_geq(got, 9, "the server sent %zu bytes", got);
  cr_assert_geq(a, 250, "closed after %.0f ms, before the limit", a);
  close(fd);
  status_works(d->addr);
  hx_stop(d, SIGTERM, 3000, NULL);

  /* The default (20 s): still open after 1.5 s. */
  cr_assert_eq(hx_start_dispatcher(&d, NULL, why, sizeof(why)), 0, "%s", why);
  fd = connect_to(d->addr);
  send_preface(fd);
  a = closed_after(fd, hx_now_ms(), 1500, &got);
  cr_assert(a < 0, "closed after %.0f ms under the default idle limit", a);
  cr_assert_geq(got, 9, "the server sent %zu bytes", got);
  close(fd);
}

/* The worker's gRPC port under the same flags: 20 silent connections, 20
 * half prefaces and 20 that finish the preface and never call, all
 * closed within the bounds; meanwhile and afterwards the worker serves a
 * real job, every record once (its streams are calls in flight, which
 * neither limit cuts). */
Test(hostile, the_workers_connection_limits_close_idle_peers) {
  enum { EACH = 20 };
  char why[512];
  cr_assert_eq(hx_make_dataset(&DS, "limits", 2, 200, 8, 8, 3), 0);
  const char *extra[] = {"--handshake-timeout-ms", "300",
                         "--idle-connection-ms", "600", NULL};
  hx_daemon_opts_t wo = {.extra_argv = extra};
  cr_assert_eq(hx_start_dispatcher(&D, NULL, why, sizeof(why)), 0, "%s", why);
  cr_assert_eq(hx_start_worker(&W, D->addr, &wo, why, sizeof(why)), 0, "%s",
               why);
  cr_assert_eq(hx_wait_workers(D->addr, 1, 10000), 1);
  int fds[3 * EACH];
  double t0 = hx_now_ms();
  for (int i = 0; i < EACH; i++) {
    fds[i] = connect_to(W->addr);
    fds[EACH + i] = connect_to(W->addr);
    cr_assert_eq(write(fds[EACH + i], "PRI * HTTP/2.0\r\n", 16), 16);
    fds[2 * EACH + i] = connect_to(W->addr);
    send_preface(fds[2 * EACH + i]);
  }
  still_serves();
  double slowest[3] = {0, 0, 0}, fastest[3] = {1e9, 1e9, 1e9};
  for (int i = 0; i < 3 * EACH; i++) {
    size_t got;
    double a = closed_after(fds[i], t0, 5000, &got);
    int kind = i / EACH;
    cr_assert(a >= 0, "worker: connection %d (%s) still open after 5 s", i,
              kind == 0 ? "silent" : kind == 1 ? "half a preface"
                                               : "preface, no call");
    slowest[kind] = a > slowest[kind] ? a : slowest[kind];
    fastest[kind] = a < fastest[kind] ? a : fastest[kind];
    close(fds[i]);
  }
  fprintf(stderr, "worker, handshake timeout 300 ms and idle 600 ms: %d "
          "silent closed after %.0f-%.0f ms, %d half prefaces after "
          "%.0f-%.0f ms, %d idle after %.0f-%.0f ms\n", EACH, fastest[0],
          slowest[0], EACH, fastest[1], slowest[1], EACH, fastest[2],
          slowest[2]);
  cr_assert_geq(fastest[0], 250, "closed before the handshake timeout");
  cr_assert_geq(fastest[2], 550, "closed before the idle limit");
  still_serves();
  hx_dataset_free(&DS);
}

/* ---- A JPEG over --jpeg-max-pixels --------------------
 * A dataset of 8x8 JPEGs, one of which (file 1, record 7) is 32x32 (1024
 * pixels), served by a worker with --jpeg-max-pixels 256. */

#define JPG_FILES 2
#define JPG_PER_FILE 20
#define JPG_BAD_FILE 1
#define JPG_BAD_REC 7

static uint8_t *jpeg_of(int side, unsigned long *len) {
  uint8_t px[32 * 32 * 3];
  for (int i = 0; i < side * side * 3; i++)
    px[i] = (uint8_t)(i * 7);
  tjhandle t = tjInitCompress();
  cr_assert_not_null(t);
  uint8_t *out = NULL;
  *len = 0;
  cr_assert_eq(tjCompress2(t, px, side, 0, side, TJPF_RGB, &out, len,
                           TJSAMP_444, 90, 0),
               0, "%s", tjGetErrorStr2(t));
  tjDestroy(t);
  return out;
}

/* Writes the dataset; `ds` gets what hx_expected_ids needs (the big
 * record as its one "corrupt" record). */
static void make_jpeg_dataset(hx_dataset_t *ds) {
  memset(ds, 0, sizeof(*ds));
  snprintf(ds->dir, sizeof(ds->dir), "%s/jpegs", hx_tmpdir());
  cr_assert(mkdir(ds->dir, 0755) == 0 || errno == EEXIST);
  snprintf(ds->glob, sizeof(ds->glob), "%s/data-*.tfrecord", ds->dir);
  ds->nfiles = JPG_FILES;
  ds->per_file = JPG_PER_FILE;
  ds->h = ds->w = 8;
  ds->c = 3;
  ds->corrupt[0] = ((uint64_t)JPG_BAD_FILE << 40) | JPG_BAD_REC;
  ds->ncorrupt = 1;
  unsigned long small_len, big_len;
  uint8_t *small = jpeg_of(8, &small_len), *big = jpeg_of(32, &big_len);
  uint8_t feats[8192], rec[8192];
  for (int f = 0; f < JPG_FILES; f++) {
    char path[700];
    snprintf(path, sizeof(path), "%s/data-%03d.tfrecord", ds->dir, f);
    ferry_tfr_writer_t *wr;
    ferry_error_t err = {0};
    cr_assert_eq(
        ferry__tfr_writer_open(path, FERRY_COMPRESSION_NONE, &wr, &err), 0,
        "%s", err.msg);
    for (int r = 0; r < JPG_PER_FILE; r++) {
      bool bad = f == JPG_BAD_FILE && r == JPG_BAD_REC;
      size_t n = hx_put_feature(feats, "image", 1, bad ? big : small,
                             bad ? big_len : small_len, 0);
      n += hx_put_feature(feats + n, "label", 3, NULL, 0, (f * 7 + r) % 10);
      size_t m = 0;
      rec[m++] = 0x0a; /* Example{1: Features} */
      m += ferry__varint_put(rec + m, n);
      memcpy(rec + m, feats, n);
      m += n;
      cr_assert_eq(ferry__tfr_writer_write(wr, rec, m, &err), 0, "%s", err.msg);
    }
    cr_assert_eq(ferry__tfr_writer_close(wr, &err), 0, "%s", err.msg);
  }
  tjFree(small);
  tjFree(big);
}

static void jpeg_limited_cluster(hx_dataset_t *ds) {
  char why[512];
  make_jpeg_dataset(ds);
  const char *extra[] = {"--jpeg-max-pixels", "256", NULL};
  hx_daemon_opts_t wo = {.extra_argv = extra};
  cr_assert_eq(hx_start_dispatcher(&D, NULL, why, sizeof(why)), 0, "%s", why);
  cr_assert_eq(hx_start_worker(&W, D->addr, &wo, why, sizeof(why)), 0, "%s",
               why);
  cr_assert_eq(hx_wait_workers(D->addr, 1, 10000), 1);
}

static ferry_client_t *jpeg_client(const hx_dataset_t *ds, int policy) {
  char spec[1024];
  ferry_client_options_t o;
  ferry_client_t *c = NULL;
  ferry_error_t err = {0};
  /* resize: without the limit the big image is a good record (as 8x8). */
  snprintf(spec, sizeof(spec), "tfrecord(\"%s\") | decode(jpeg) | "
           "resize(8, 8) | batch(4)", ds->glob);
  hx_client_options(&o, D->addr, spec);
  o.num_epochs = 1;
  o.error_policy = policy;
  cr_assert_eq(ferry_client_new(&o, &c, &err), 0, "%s", err.msg);
  return c;
}

Test(hostile, a_jpeg_over_max_pixels_fails_the_job_naming_file_and_record) {
  hx_dataset_t ds;
  jpeg_limited_cluster(&ds);
  ferry_client_t *c = jpeg_client(&ds, FERRY_ON_ERROR_FAIL);
  hx_ids_t got = {0};
  ferry_error_t err = {0};
  int rc = hx_collect_epoch(c, &got, NULL, false, 10000, NULL, NULL, &err);
  fprintf(stderr, "jpeg over the limit, policy fail: %d \"%s\"\n", rc,
          err.msg);
  cr_assert(rc != FERRY_EPOCH_END && rc != FERRY_END && rc != FERRY_ETIMEDOUT,
            "the job gave %d after %zu records: %s", rc, got.n, err.msg);
  char rec[64];
  snprintf(rec, sizeof(rec), "record %d at byte offset", JPG_BAD_REC);
  cr_assert(strstr(err.msg, "data-001.tfrecord") != NULL &&
                strstr(err.msg, rec) != NULL &&
                strstr(err.msg, "32x32") != NULL &&
                strstr(err.msg, "1024 pixels") != NULL &&
                strstr(err.msg, "--jpeg-max-pixels 256") != NULL,
            "the error does not name the file, record, size and limit: %s",
            err.msg);
  hx_ids_free(&got);
  ferry_client_free(c);
}

Test(hostile, a_jpeg_over_max_pixels_is_skipped_under_policy_skip) {
  hx_dataset_t ds;
  jpeg_limited_cluster(&ds);
  ferry_client_t *c = jpeg_client(&ds, FERRY_ON_ERROR_SKIP);
  hx_ids_t got = {0};
  ferry_error_t err = {0};
  cr_assert_eq(hx_collect_epoch(c, &got, NULL, false, 10000, NULL, NULL,
                                &err),
               FERRY_EPOCH_END, "%s", err.msg);
  size_t n;
  uint64_t *want = hx_expected_ids(&ds, true, &n);
  cr_assert_eq(n, JPG_FILES * JPG_PER_FILE - 1);
  char why[256];
  cr_assert(hx_same_multiset(got.ids, got.n, want, n, why, sizeof(why)),
            "%s", why);
  free(want);
  hx_ids_free(&got);
  ferry_client_free(c);
}
