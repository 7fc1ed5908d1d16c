/* The integration tests' harness (see harness.h). */
#include "harness.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netdb.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "alloc.h"
#include "ferry/log.h"
#include "ferry/v1/dispatcher.pb-c.h"
#include "rpc.h"
#include "rpc_methods.h"
#include "spec.h"
#include "tfrecord.h"
#include "transport.h"
#include "tsan.h"
#include "varint.h"

extern char **environ;

static hx_proc_t procs[HX_MAX_PROCS];
static bool forgotten[HX_MAX_PROCS]; /* slots hx_forget handed back */
static int nprocs;
static char tmpdir[256];
static bool atexit_set;

/* The NAME-ucx copies of the suites (FERRY_IT_UCX_PROBE=1 set
 * by tests/integration/CMakeLists.txt) skip, exit 77, on a machine where
 * UCX cannot start: the probe makes a UCX client context (a UCP context,
 * a worker and its progress thread) and frees it. Called by
 * suite_hooks.c's PRE_ALL hook, in the runner before any test: Criterion
 * runs each test in a process of its own that it execs, which starts
 * with no UCX state. (It once ran in a child forked from a constructor;
 * under ThreadSanitizer that child's first UCX calls jumped to address 0,
 * and a fork from the runner, which has threads, may not start any.) */
void hx_ucx_probe(void) {
  if (getenv("FERRY_IT_UCX_PROBE") == NULL)
    return;
  char why[512] = "UCX is not built in (FERRY_HAVE_UCX unset)";
#ifdef FERRY_HAVE_UCX
  ferry_error_t err = {0};
  ferry_transport_client_t *cl = NULL;
  if (ferry__transport_ucx.client_new(NULL, &cl, &err) == 0) {
    ferry__transport_ucx.client_free(cl);
    return;
  }
  snprintf(why, sizeof(why), "%s", err.msg);
#endif
  fprintf(stderr, "SKIP: UCX cannot start on this machine: %s\n", why);
  fflush(stderr);
  _exit(77);
}

bool hx_figures_asserted(const char *what) {
#ifdef FERRY_TSAN
  fprintf(stderr, "%s: not asserted under ThreadSanitizer (memory and "
          "rates are its own, not Ferry's)\n", what);
  return false;
#else
  (void)what;
  return true;
#endif
}

double hx_now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

unsigned hx_seed(const char *test) {
  const char *env = getenv("FERRY_IT_SEED");
  unsigned seed = env != NULL ? (unsigned)strtoul(env, NULL, 0)
                              : (unsigned)(hx_now_ms() * 1000.0);
  fprintf(stderr, "%s: seed %u (FERRY_IT_SEED=%u replays it)\n", test, seed,
          seed);
  return seed;
}

const char *hx_dispatcher_bin(void) {
  const char *e = getenv("FERRY_IT_DISPATCHER");
  return e && *e ? e : FERRY_DISPATCHER_BIN;
}

const char *hx_worker_bin(void) {
  const char *e = getenv("FERRY_IT_WORKER");
  return e && *e ? e : FERRY_WORKER_BIN;
}

const char *hx_ferryctl_bin(void) {
  const char *e = getenv("FERRY_IT_FERRYCTL");
  return e && *e ? e : FERRYCTL_BIN;
}

/* The file the runner's POST_ALL hook sweeps; named after the runner (our
 * parent while a test runs). */
static void pids_file(pid_t runner, char *out, size_t cap) {
  snprintf(out, cap, "/tmp/ferry-it-pids-%d", (int)runner);
}

bool hx_track_runner_pids;

static void note_pid(pid_t pid) {
  char path[64];
  if (!hx_track_runner_pids)
    return;
  pids_file(getppid(), path, sizeof(path));
  FILE *f = fopen(path, "a");
  if (f != NULL) {
    fprintf(f, "%d\n", (int)pid);
    fclose(f);
  }
}

/* Kills the daemons a killed test left behind: called by the runner once
 * all tests ran. Only processes whose command line names a Ferry daemon
 * are touched, so a reused pid is safe. */
void hx_sweep_runner_pids(void) {
  char path[64];
  pids_file(getpid(), path, sizeof(path));
  FILE *f = fopen(path, "r");
  if (f == NULL)
    return;
  int pid;
  while (fscanf(f, "%d", &pid) == 1) {
    char proc[64], cmd[256] = {0};
    snprintf(proc, sizeof(proc), "/proc/%d/cmdline", pid);
    FILE *c = fopen(proc, "r");
    if (c == NULL)
      continue;
    size_t n = fread(cmd, 1, sizeof(cmd) - 1, c);
    fclose(c);
    cmd[n] = '\0';
    if (strstr(cmd, "ferry-dispatcher") || strstr(cmd, "ferry-worker"))
      kill(pid, SIGKILL);
  }
  fclose(f);
  unlink(path);
}

static void at_exit(void) { hx_reap_all(); }

const char *hx_tmpdir(void) {
  if (tmpdir[0] == '\0') {
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/ferry-it-XXXXXX");
    if (mkdtemp(tmpdir) == NULL) {
      tmpdir[0] = '\0';
      return "/tmp";
    }
  }
  if (!atexit_set) {
    atexit(at_exit);
    atexit_set = true;
  }
  return tmpdir;
}

static int rm_entry(const char *path, const struct stat *st, int flag,
                    struct FTW *ftw) {
  (void)st;
  (void)flag;
  (void)ftw;
  remove(path);
  return 0;
}

/* Waits for `pid` to exit, at most `wait_ms`; returns true and fills
 * *status when it did. Uses a pidfd so the wait is a poll(), not a nap
 * loop. */
static bool wait_exit(pid_t pid, int wait_ms, int *status) {
  int pfd = (int)syscall(SYS_pidfd_open, pid, 0);
  if (pfd >= 0) {
    struct pollfd p = {.fd = pfd, .events = POLLIN};
    double deadline = hx_now_ms() + wait_ms;
    for (;;) {
      int left = (int)(deadline - hx_now_ms());
      if (left < 0)
        left = 0;
      int r = poll(&p, 1, left);
      if (r > 0 || left == 0)
        break;
      if (r < 0 && errno != EINTR)
        break;
    }
    close(pfd);
    return waitpid(pid, status, WNOHANG) == pid;
  }
  /* No pidfd (old kernel): poll waitpid every millisecond. */
  double deadline = hx_now_ms() + wait_ms;
  do {
    if (waitpid(pid, status, WNOHANG) == pid)
      return true;
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  } while (hx_now_ms() < deadline);
  return waitpid(pid, status, WNOHANG) == pid;
}

static void reap_proc(hx_proc_t *p) {
  if (p->pid > 0) {
    kill(p->pid, SIGKILL);
    if (!wait_exit(p->pid, 5000, &p->status))
      waitpid(p->pid, &p->status, 0);
    p->pid = 0;
  }
  if (p->out_fd >= 0)
    close(p->out_fd);
  p->out_fd = -1;
}

void hx_dump_logs(void) {
  for (int i = 0; i < nprocs; i++) {
    FILE *f = fopen(procs[i].log, "r");
    if (f == NULL)
      continue;
    fprintf(stderr, "---- %s (%s) ----\n", procs[i].name, procs[i].log);
    char line[1024];
    /* The last 40 lines: keep a ring of them. */
    static char ring[40][1024];
    int n = 0;
    while (fgets(line, sizeof(line), f) != NULL)
      snprintf(ring[n++ % 40], sizeof(ring[0]), "%s", line);
    for (int k = n > 40 ? n - 40 : 0; k < n; k++)
      fputs(ring[k % 40], stderr);
    fclose(f);
  }
}

double hx_proc_cpu_s(pid_t pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  if (f == NULL)
    return -1;
  size_t n = fread(buf, 1, sizeof(buf) - 1, f);
  fclose(f);
  buf[n] = '\0';
  /* Fields after the command name, which ends at the last ')': state is
   * field 3, utime and stime fields 14 and 15. */
  char *p = strrchr(buf, ')');
  unsigned long long ut, st;
  if (p == NULL ||
      sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu",
             &ut, &st) != 2)
    return -1;
  return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

void hx_client_log_from_env(void) {
  const char *lvl = getenv("FERRY_IT_CLIENT_LOG");
  if (lvl == NULL)
    return;
  ferry_log_set_callback(ferry_log_to_stderr, NULL);
  ferry_log_set_level(ferry_log_level_parse(lvl));
}

void hx_reap_all(void) {
  if (getenv("FERRY_IT_LOGS") != NULL)
    hx_dump_logs();
  for (int i = 0; i < nprocs; i++) {
    reap_proc(&procs[i]);
    forgotten[i] = false;
  }
  nprocs = 0;
  if (tmpdir[0] != '\0') {
    if (getenv("FERRY_IT_KEEP") == NULL)
      nftw(tmpdir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    else
      fprintf(stderr, "harness: kept %s\n", tmpdir);
    tmpdir[0] = '\0';
  }
}

int hx_spawn(hx_proc_t **out, const char *name, char *const argv[],
             int wait_ms, char *why, size_t why_len) {
  return hx_spawn_marked(out, name, argv, "listening on ", wait_ms, why,
                         why_len);
}

int hx_spawn_marked(hx_proc_t **out, const char *name, char *const argv[],
                    const char *marker, int wait_ms, char *why,
                    size_t why_len) {
  *out = NULL;
  int slot = 0;
  while (slot < nprocs && !forgotten[slot])
    slot++;
  if (slot == HX_MAX_PROCS) {
    snprintf(why, why_len, "too many processes");
    return -1;
  }
  hx_proc_t *p = &procs[slot];
  memset(p, 0, sizeof(*p));
  p->out_fd = -1;
  snprintf(p->name, sizeof(p->name), "%s", name);
  snprintf(p->log, sizeof(p->log), "%s/%s.log", hx_tmpdir(), name);
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    snprintf(why, why_len, "pipe: %s", strerror(errno));
    return -1;
  }
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t at;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  posix_spawn_file_actions_addopen(&fa, 2, p->log,
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  /* Criterion's own pipes must not leak into the daemons. */
  posix_spawn_file_actions_addclosefrom_np(&fa, 3);
  posix_spawnattr_init(&at);
  sigset_t none, dflt;
  sigemptyset(&none);
  sigemptyset(&dflt);
  sigaddset(&dflt, SIGTERM);
  sigaddset(&dflt, SIGINT);
  sigaddset(&dflt, SIGPIPE);
  sigaddset(&dflt, SIGCHLD);
  posix_spawnattr_setsigmask(&at, &none);
  posix_spawnattr_setsigdefault(&at, &dflt);
  posix_spawnattr_setpgroup(&at, 0);
  posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGMASK |
                                    POSIX_SPAWN_SETSIGDEF |
                                    POSIX_SPAWN_SETPGROUP);
  pid_t pid;
  int rc = posix_spawn(&pid, argv[0], &fa, &at, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&at);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    snprintf(why, why_len, "%s: cannot start %s: %s", name, argv[0],
             strerror(rc));
    return -1;
  }
  p->pid = pid;
  p->out_fd = fds[0];
  if (slot == nprocs)
    nprocs++;
  forgotten[slot] = false;
  note_pid(pid);

  /* The listening line, bounded by wait_ms. */
  char line[512];
  size_t used = 0;
  double deadline = hx_now_ms() + wait_ms;
  for (;;) {
    char *nl = memchr(line, '\n', used);
    if (nl != NULL) {
      *nl = '\0';
      const char *at_ = strstr(line, marker);
      if (at_ != NULL) {
        snprintf(p->addr, sizeof(p->addr), "%s", at_ + strlen(marker));
        /* The lines after it (read in the same chunk) for hx_read_line. */
        p->npending = used - (size_t)(nl + 1 - line);
        memcpy(p->pending, nl + 1, p->npending);
        *out = p;
        return 0;
      }
      /* Another line: drop it. */
      size_t rest = used - (size_t)(nl + 1 - line);
      memmove(line, nl + 1, rest);
      used = rest;
      continue;
    }
    int left = (int)(deadline - hx_now_ms());
    if (left <= 0 || used == sizeof(line) - 1) {
      snprintf(why, why_len, "%s printed no line with '%s' within %d ms "
               "(log %s)", name, marker, wait_ms, p->log);
      hx_dump_logs();
      reap_proc(p);
      return -1;
    }
    struct pollfd pfd = {.fd = p->out_fd, .events = POLLIN};
    int r = poll(&pfd, 1, left);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      continue;
    ssize_t k = read(p->out_fd, line + used, sizeof(line) - 1 - used);
    if (k <= 0) {
      int st = 0;
      wait_exit(p->pid, 2000, &st);
      snprintf(why, why_len, "%s exited before listening (status 0x%x, "
               "log %s)", name, st, p->log);
      hx_dump_logs();
      p->pid = 0;
      reap_proc(p);
      return -1;
    }
    used += (size_t)k;
  }
}

int hx_read_line(hx_proc_t *p, const char *marker, int wait_ms, char *out,
                 size_t cap) {
  char line[sizeof(p->pending)];
  size_t used = p->npending;
  memcpy(line, p->pending, used);
  p->npending = 0;
  double deadline = hx_now_ms() + wait_ms;
  int rc = -1;
  for (;;) {
    char *nl = memchr(line, '\n', used);
    if (nl != NULL) {
      *nl = '\0';
      const char *at = strstr(line, marker);
      size_t rest = used - (size_t)(nl + 1 - line);
      if (at != NULL)
        snprintf(out, cap, "%s", at + strlen(marker));
      memmove(line, nl + 1, rest);
      used = rest;
      if (at != NULL) {
        rc = 0;
        break;
      }
      continue;
    }
    int left = (int)(deadline - hx_now_ms());
    if (left <= 0 || used == sizeof(line) - 1 || p->out_fd < 0)
      break;
    struct pollfd pfd = {.fd = p->out_fd, .events = POLLIN};
    int r = poll(&pfd, 1, left);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      continue;
    ssize_t k = read(p->out_fd, line + used, sizeof(line) - 1 - used);
    if (k <= 0)
      break;
    used += (size_t)k;
  }
  /* Unread lines (or a partial one) stay for the next call. */
  memcpy(p->pending, line, used);
  p->npending = used;
  return rc;
}

int hx_http_get(const char *hostport, const char *path, int wait_ms,
                char **body) {
  *body = NULL;
  char host[64];
  const char *colon = strrchr(hostport, ':');
  if (colon == NULL || (size_t)(colon - hostport) >= sizeof(host))
    return -1;
  snprintf(host, sizeof(host), "%.*s", (int)(colon - hostport), hostport);
  struct addrinfo hints = {.ai_family = AF_UNSPEC,
                           .ai_socktype = SOCK_STREAM};
  struct addrinfo *ai = NULL;
  if (getaddrinfo(host, colon + 1, &hints, &ai) != 0 || ai == NULL)
    return -1;
  int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  double deadline = hx_now_ms() + wait_ms;
  struct timeval tv = {wait_ms / 1000, (wait_ms % 1000) * 1000};
  if (fd >= 0)
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  int ok = fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) == 0;
  freeaddrinfo(ai);
  char req[512];
  int n = snprintf(req, sizeof(req), "GET %s HTTP/1.0\r\nHost: %s\r\n\r\n",
                   path, hostport);
  if (!ok || n <= 0 || (size_t)n >= sizeof(req) ||
      write(fd, req, (size_t)n) != n) {
    if (fd >= 0)
      close(fd);
    return -1;
  }
  size_t cap = 1 << 16, used = 0, max = 4u << 20;
  char *buf = malloc(cap);
  bool eof = false;
  while (buf != NULL && !eof) {
    int left = (int)(deadline - hx_now_ms());
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    if (left <= 0)
      break;
    int r = poll(&pfd, 1, left);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      break;
    if (used + 1 == cap) {
      if (cap >= max)
        break;
      char *b = realloc(buf, cap * 2);
      if (b == NULL)
        break;
      buf = b;
      cap *= 2;
    }
    ssize_t k = read(fd, buf + used, cap - 1 - used);
    if (k < 0 && errno == EINTR)
      continue;
    if (k <= 0)
      eof = true;
    else
      used += (size_t)k;
  }
  close(fd);
  int code = -1;
  if (buf != NULL) {
    buf[used] = '\0';
    const char *end = strstr(buf, "\r\n\r\n");
    if (eof && end != NULL && sscanf(buf, "HTTP/%*s %d", &code) == 1) {
      memmove(buf, end + 4, strlen(end + 4) + 1);
      *body = buf;
      return code;
    }
  }
  free(buf);
  return -1;
}

int hx_start_dispatcher(hx_proc_t **out, const hx_daemon_opts_t *o,
                        char *why, size_t why_len) {
  return hx_start_dispatcher_at(out, o, 0, NULL, why, why_len);
}

/* argv = prefix, base, extra, then tail (each NULL-terminated; all but
 * base may be NULL), cut to `cap` - 1 entries. */
static void hx_join_argv(char **argv, size_t cap, char *const *prefix,
                         char *const *base, const char *const *extra,
                         char *const *tail) {
  size_t n = 0;
  for (size_t i = 0; prefix != NULL && prefix[i] != NULL && n + 1 < cap; i++)
    argv[n++] = prefix[i];
  for (size_t i = 0; base[i] != NULL && n + 1 < cap; i++)
    argv[n++] = base[i];
  for (size_t i = 0; extra != NULL && extra[i] != NULL && n + 1 < cap; i++)
    argv[n++] = (char *)extra[i];
  for (size_t i = 0; tail != NULL && tail[i] != NULL && n + 1 < cap; i++)
    argv[n++] = tail[i];
  argv[n] = NULL;
}

int hx_start_dispatcher_at(hx_proc_t **out, const hx_daemon_opts_t *o,
                           int port, const char *work_dir, char *why,
                           size_t why_len) {
  hx_daemon_opts_t d = {0};
  if (o != NULL)
    d = *o;
  char hb[16], wt[16], ct[16], pt[16], st[16], wd[600];
  snprintf(hb, sizeof(hb), "%d", d.heartbeat_ms ? d.heartbeat_ms : 100);
  snprintf(st, sizeof(st), "%d",
           d.client_stall_ms ? d.client_stall_ms : 30000);
  snprintf(wt, sizeof(wt), "%d",
           d.worker_timeout_ms ? d.worker_timeout_ms : 2000);
  snprintf(ct, sizeof(ct), "%d",
           d.client_timeout_ms ? d.client_timeout_ms : 5000);
  snprintf(pt, sizeof(pt), "%d", port);
  static int count;
  ++count;
  if (work_dir != NULL)
    snprintf(wd, sizeof(wd), "%s", work_dir);
  else
    snprintf(wd, sizeof(wd), "%s/dispatcher-%d", hx_tmpdir(), count);
  mkdir(wd, 0755);
  char *base[] = {(char *)hx_dispatcher_bin(), "--port", pt, "--host",
                  (char *)(d.host ? d.host : "127.0.0.1"), "--work-dir", wd,
                  "--worker-timeout-ms", wt,
                  "--client-timeout-ms", ct, "--heartbeat-ms", hb,
                  "--client-stall-ms", st, NULL};
  char *argv[64];
  hx_join_argv(argv, 64, d.prefix_argv, base, d.extra_argv, NULL);
  char name[32];
  snprintf(name, sizeof(name), "dispatcher%d", count);
  return hx_spawn(out, name, argv, 10000, why, why_len);
}

int hx_start_worker(hx_proc_t **out, const char *dispatcher,
                    const hx_daemon_opts_t *o, char *why, size_t why_len) {
  hx_daemon_opts_t d = {0};
  if (o != NULL)
    d = *o;
  char hb[16], th[16], bb[32];
  snprintf(hb, sizeof(hb), "%d", d.heartbeat_ms ? d.heartbeat_ms : 100);
  snprintf(th, sizeof(th), "%d", d.threads ? d.threads : 1);
  snprintf(bb, sizeof(bb), "%llu",
           (unsigned long long)(d.buffer_bytes ? d.buffer_bytes
                                               : 64ull << 20));
  char *base[] = {(char *)hx_worker_bin(), "--dispatcher", (char *)dispatcher,
                  "--port", "0", "--host",
                  (char *)(d.host ? d.host : "127.0.0.1"), "--threads", th,
                  "--buffer-bytes", bb, "--heartbeat-ms", hb, NULL};
  char *adv[] = {"--advertise", (char *)d.host, NULL};
  char *argv[64];
  hx_join_argv(argv, 64, d.prefix_argv, base, d.extra_argv,
               d.host ? adv : NULL);
  static int count;
  char name[32];
  snprintf(name, sizeof(name), "worker%d", ++count);
  return hx_spawn(out, name, argv, 10000, why, why_len);
}

int hx_stop(hx_proc_t *p, int sig, int wait_ms, double *elapsed_ms) {
  if (elapsed_ms != NULL)
    *elapsed_ms = -1;
  if (p == NULL || p->pid <= 0)
    return -1;
  double t0 = hx_now_ms();
  kill(p->pid, sig);
  int st = 0;
  bool exited = wait_exit(p->pid, wait_ms, &st);
  double t1 = hx_now_ms();
  if (!exited) {
    reap_proc(p);
    return -1;
  }
  if (elapsed_ms != NULL)
    *elapsed_ms = t1 - t0;
  p->status = st;
  p->pid = 0;
  if (p->out_fd >= 0)
    close(p->out_fd);
  p->out_fd = -1;
  return st;
}

void hx_forget(hx_proc_t *p) {
  if (p == NULL || p < procs || p >= procs + nprocs || p->pid > 0)
    return;
  if (p->out_fd >= 0)
    close(p->out_fd);
  memset(p, 0, sizeof(*p));
  p->out_fd = -1;
  forgotten[p - procs] = true;
}

/* ---- Status over gRPC ---------------------------------------------------- */

/* One GetStatus on `ch`: 0 and *out filled, or -1. */
static int status_once(ferry_rpc_channel_t *ch, hx_status_counts_t *out) {
  ferry_error_t err = {0};
  Ferry__V1__GetStatusRequest req = FERRY__V1__GET_STATUS_REQUEST__INIT;
  uint8_t buf[8];
  size_t len = ferry__v1__get_status_request__pack(&req, buf);
  uint8_t *reply = NULL;
  size_t rlen = 0;
  if (ferry__rpc_unary(ch, FERRY_METHOD_GET_STATUS, buf, len, 2000,
                       FERRY_RPC_WAIT_FOR_READY, &reply, &rlen, &err) != 0)
    return -1;
  Ferry__V1__GetStatusResponse *st =
      ferry__v1__get_status_response__unpack(NULL, rlen, reply);
  ferry_free(reply);
  if (st == NULL)
    return -1;
  memset(out, 0, sizeof(*out));
  out->workers = (int)st->n_workers;
  for (size_t i = 0; i < st->n_workers; i++)
    if (st->workers[i]->state && strcmp(st->workers[i]->state, "alive") == 0)
      out->alive = out->alive + 1;
  out->jobs = (int)st->n_jobs;
  out->datasets = (int)st->datasets;
  ferry__v1__get_status_response__free_unpacked(st, NULL);
  return 0;
}

int hx_status_counts(const char *dispatcher, hx_status_counts_t *out) {
  ferry_rpc_channel_t *ch = NULL;
  ferry_error_t err = {0};
  ferry__rpc_init();
  int rc = ferry__rpc_channel_new(dispatcher, NULL, &ch, &err) == 0
               ? status_once(ch, out)
               : -1;
  ferry__rpc_channel_free(ch);
  ferry__rpc_shutdown();
  return rc;
}

int hx_wait_workers(const char *dispatcher, int n, int wait_ms) {
  ferry_rpc_channel_t *ch = NULL;
  ferry_error_t err = {0};
  int seen = 0;
  ferry__rpc_init();
  if (ferry__rpc_channel_new(dispatcher, NULL, &ch, &err) != 0) {
    ferry__rpc_shutdown();
    return 0;
  }
  double deadline = hx_now_ms() + wait_ms;
  do {
    hx_status_counts_t c;
    if (status_once(ch, &c) == 0)
      seen = c.alive;
    if (seen >= n)
      break;
    /* The workers register on their next heartbeat (100 ms): ask again
     * shortly. */
    struct timespec ts = {0, 20000000};
    nanosleep(&ts, NULL);
  } while (hx_now_ms() < deadline);
  ferry__rpc_channel_free(ch);
  ferry__rpc_shutdown();
  return seen;
}

/* ---- Datasets ------------------------------------------------------------ */

/* harness.h. */
size_t hx_put_feature(uint8_t *p, const char *key, int kind,
                      const uint8_t *bytes, size_t blen, int64_t v) {
  size_t klen = strlen(key);
  /* The list: BytesList{1: bytes} or Int64List{1: packed [v]}. */
  size_t list_len;
  if (kind == 1)
    list_len = 1 + ferry__varint_len(blen) + blen;
  else
    list_len = 1 + ferry__varint_len(ferry__varint_len((uint64_t)v)) +
               ferry__varint_len((uint64_t)v);
  size_t feat_len = 1 + ferry__varint_len(list_len) + list_len;
  size_t entry_len = 1 + ferry__varint_len(klen) + klen + 1 +
                     ferry__varint_len(feat_len) + feat_len;
  size_t n = 0;
  p[n++] = 0x0a; /* Features.feature, a map entry */
  n += ferry__varint_put(p + n, entry_len);
  p[n++] = 0x0a; /* key */
  n += ferry__varint_put(p + n, klen);
  memcpy(p + n, key, klen);
  n += klen;
  p[n++] = 0x12; /* value: Feature */
  n += ferry__varint_put(p + n, feat_len);
  p[n++] = kind == 1 ? 0x0a : 0x1a; /* bytes_list = 1, int64_list = 3 */
  n += ferry__varint_put(p + n, list_len);
  if (kind == 1) {
    p[n++] = 0x0a;
    n += ferry__varint_put(p + n, blen);
    memcpy(p + n, bytes, blen);
    n += blen;
  } else {
    p[n++] = 0x0a; /* packed */
    n += ferry__varint_put(p + n, ferry__varint_len((uint64_t)v));
    n += ferry__varint_put(p + n, (uint64_t)v);
  }
  return n;
}

static void fill_pixels(uint8_t *px, size_t n, int file, int rec) {
  for (size_t i = 0; i < n; i++)
    px[i] = (uint8_t)((size_t)file * 131 + (size_t)rec * 31 + i);
}

static int64_t label_of(int file, int rec) { return (file * 7 + rec) % 10; }

int hx_make_dataset(hx_dataset_t *ds, const char *sub, int nfiles,
                    int per_file, int h, int w, int c) {
  memset(ds, 0, sizeof(*ds));
  if (nfiles < 1)
    return -1;
  ds->files = calloc((size_t)nfiles, sizeof(ds->files[0]));
  ds->offsets = calloc((size_t)nfiles, sizeof(ds->offsets[0]));
  if (ds->files == NULL || ds->offsets == NULL) {
    hx_dataset_free(ds);
    return -1;
  }
  snprintf(ds->dir, sizeof(ds->dir), "%s/%s", hx_tmpdir(), sub);
  if (mkdir(ds->dir, 0755) != 0 && errno != EEXIST) {
    hx_dataset_free(ds);
    return -1;
  }
  snprintf(ds->glob, sizeof(ds->glob), "%s/data-*.tfrecord", ds->dir);
  ds->nfiles = nfiles;
  ds->per_file = per_file;
  ds->h = h;
  ds->w = w;
  ds->c = c;
  size_t img = (size_t)h * w * c;
  uint8_t *px = malloc(img);
  uint8_t *rec = malloc(img + 256);
  uint8_t *feats = malloc(img + 256);
  if (px == NULL || rec == NULL || feats == NULL)
    goto fail;
  for (int f = 0; f < nfiles; f++) {
    snprintf(ds->files[f], sizeof(ds->files[f]), "%s/data-%03d.tfrecord",
             ds->dir, f);
    ds->offsets[f] = calloc((size_t)per_file, sizeof(uint64_t));
    ferry_tfr_writer_t *wr;
    ferry_error_t err = {0};
    if (ds->offsets[f] == NULL ||
        ferry__tfr_writer_open(ds->files[f], FERRY_COMPRESSION_NONE, &wr,
                               &err) != 0)
      goto fail;
    uint64_t off = 0;
    for (int r = 0; r < per_file; r++) {
      fill_pixels(px, img, f, r);
      size_t n = 0;
      n += hx_put_feature(feats + n, "image", 1, px, img, 0);
      n += hx_put_feature(feats + n, "label", 3, NULL, 0, label_of(f, r));
      n += hx_put_feature(feats + n, "id", 3, NULL, 0,
                       (int64_t)f * per_file + r);
      /* Example{1: Features} */
      size_t m = 0;
      rec[m++] = 0x0a;
      m += ferry__varint_put(rec + m, n);
      memcpy(rec + m, feats, n);
      m += n;
      ds->offsets[f][r] = off;
      off += 16 + m;
      if (ferry__tfr_writer_write(wr, rec, m, &err) != 0) {
        ferry__tfr_writer_close(wr, NULL);
        goto fail;
      }
    }
    if (ferry__tfr_writer_close(wr, &err) != 0)
      goto fail;
  }
  free(px);
  free(rec);
  free(feats);
  return 0;
fail:
  free(px);
  free(rec);
  free(feats);
  hx_dataset_free(ds);
  return -1;
}

void hx_dataset_free(hx_dataset_t *ds) {
  /* Only the files hx_make_dataset got to have offsets (calloc'ed: the
   * rest are NULL). */
  for (int f = 0; ds->offsets != NULL && f < ds->nfiles; f++)
    free(ds->offsets[f]);
  free(ds->offsets);
  free(ds->files);
  ds->offsets = NULL;
  ds->files = NULL;
}

int hx_corrupt_record(hx_dataset_t *ds, int file, int rec) {
  if (file >= ds->nfiles || rec >= ds->per_file ||
      ds->ncorrupt == (int)(sizeof(ds->corrupt) / sizeof(ds->corrupt[0])))
    return -1;
  uint64_t start = ds->offsets[file][rec];
  /* The data CRC is the record's last four bytes: it ends where the next
   * record starts (or at the end of the file). */
  uint64_t end;
  if (rec + 1 < ds->per_file) {
    end = ds->offsets[file][rec + 1];
  } else {
    struct stat st;
    if (stat(ds->files[file], &st) != 0)
      return -1;
    end = (uint64_t)st.st_size;
  }
  if (end < start + 16)
    return -1;
  int fd = open(ds->files[file], O_RDWR);
  if (fd < 0)
    return -1;
  uint8_t b;
  int rc = -1;
  if (pread(fd, &b, 1, (off_t)(end - 2)) == 1) {
    b ^= 0x10;
    if (pwrite(fd, &b, 1, (off_t)(end - 2)) == 1)
      rc = 0;
  }
  close(fd);
  if (rc == 0)
    ds->corrupt[ds->ncorrupt++] = ((uint64_t)file << 40) | (uint64_t)rec;
  return rc;
}

void hx_spec(const hx_dataset_t *ds, const char *extra, int batch, char *out,
             size_t cap) {
  snprintf(out, cap, "tfrecord(\"%s\") | decode(raw, %d, %d, %d)%s%s | "
           "batch(%d)", ds->glob, ds->h, ds->w, ds->c,
           extra && *extra ? " | " : "", extra && *extra ? extra : "", batch);
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

uint64_t *hx_expected_ids(const hx_dataset_t *ds, bool skip_corrupt,
                          size_t *n) {
  size_t total = (size_t)ds->nfiles * ds->per_file;
  uint64_t *v = malloc((total ? total : 1) * sizeof(uint64_t));
  size_t k = 0;
  if (v == NULL) {
    *n = 0;
    return NULL;
  }
  for (int f = 0; f < ds->nfiles; f++)
    for (int r = 0; r < ds->per_file; r++) {
      uint64_t id = ((uint64_t)f << 40) | (uint64_t)r;
      bool bad = false;
      for (int i = 0; skip_corrupt && i < ds->ncorrupt; i++)
        bad |= ds->corrupt[i] == id;
      if (!bad)
        v[k++] = id;
    }
  qsort(v, k, sizeof(uint64_t), cmp_u64);
  *n = k;
  return v;
}

/* ---- Clients ------------------------------------------------------------- */

void hx_client_options(ferry_client_options_t *o, const char *dispatcher,
                       const char *spec) {
  ferry_client_options_init(o);
  o->dispatcher = dispatcher;
  o->spec = spec;
  o->heartbeat_ms = 50;
  o->connect_timeout_ms = 5000;
}

static int ids_push(hx_ids_t *out, uint64_t id, int64_t label) {
  if (out->n == out->cap) {
    size_t cap = out->cap ? out->cap * 2 : 1024;
    uint64_t *ids = realloc(out->ids, cap * sizeof(uint64_t));
    if (ids == NULL)
      return -1;
    out->ids = ids;
    int64_t *labels = realloc(out->labels, cap * sizeof(int64_t));
    if (labels == NULL)
      return -1;
    out->labels = labels;
    out->cap = cap;
  }
  out->ids[out->n] = id;
  out->labels[out->n] = label;
  out->n++;
  return 0;
}

int hx_collect_epoch(ferry_client_t *c, hx_ids_t *out, const hx_dataset_t *ds,
                     bool check_pixels, int timeout_ms,
                     void (*after_batch)(uint32_t batches, void *arg),
                     void *arg, ferry_error_t *err) {
  uint8_t *want = NULL;
  size_t img = ds ? (size_t)ds->h * ds->w * ds->c : 0;
  if (check_pixels && ds != NULL)
    want = malloc(img);
  for (;;) {
    const ferry_batch_t *b = NULL;
    int rc = ferry_next(c, &b, timeout_ms, err);
    if (rc != 0) {
      free(want);
      return rc;
    }
    for (uint32_t i = 0; i < b->size; i++) {
      uint64_t id = b->ids[i];
      ids_push(out, id, b->labels[i]);
      int file = (int)(id >> 40), rec = (int)(id & ((1ull << 40) - 1));
      if (want != NULL && !out->bad_pixels && b->height == (uint32_t)ds->h &&
          b->width == (uint32_t)ds->w && b->channels == (uint32_t)ds->c) {
        fill_pixels(want, img, file, rec);
        if (memcmp(want, b->images + (size_t)i * img, img) != 0 ||
            b->labels[i] != label_of(file, rec)) {
          out->bad_pixels = true;
          out->bad_pixel_id = id;
        }
      }
    }
    ferry_batch_release(c, b);
    out->batches++;
    if (after_batch != NULL)
      after_batch(out->batches, arg);
  }
}

void hx_ids_free(hx_ids_t *ids) {
  free(ids->ids);
  free(ids->labels);
  memset(ids, 0, sizeof(*ids));
}

bool hx_same_multiset(const uint64_t *ids, size_t n, const uint64_t *expected,
                      size_t n_expected, char *why, size_t why_len) {
  uint64_t *s = malloc((n ? n : 1) * sizeof(uint64_t));
  if (s == NULL) {
    snprintf(why, why_len, "out of memory");
    return false;
  }
  memcpy(s, ids, n * sizeof(uint64_t));
  qsort(s, n, sizeof(uint64_t), cmp_u64);
  size_t i = 0, j = 0;
  bool ok = true;
  while (i < n || j < n_expected) {
    if (i < n && j < n_expected && s[i] == expected[j]) {
      i++;
      j++;
      continue;
    }
    ok = false;
    if (j == n_expected || (i < n && s[i] < expected[j])) {
      bool dup = i > 0 && s[i - 1] == s[i];
      snprintf(why, why_len, "%s id file %llu record %llu (got %zu ids, "
               "expected %zu)", dup ? "duplicate" : "unexpected",
               (unsigned long long)(s[i] >> 40),
               (unsigned long long)(s[i] & ((1ull << 40) - 1)), n,
               n_expected);
    } else {
      snprintf(why, why_len, "missing id file %llu record %llu (got %zu "
               "ids, expected %zu)", (unsigned long long)(expected[j] >> 40),
               (unsigned long long)(expected[j] & ((1ull << 40) - 1)), n,
               n_expected);
    }
    break;
  }
  free(s);
  return ok;
}

/* ---- ferryctl and JSON -------------------------------------------------- */

char *hx_ferryctl_status_json(const char *dispatcher, int *status) {
  char *argv[] = {(char *)hx_ferryctl_bin(), "status", "--json",
                  "--dispatcher", (char *)dispatcher, NULL};
  int fds[2];
  *status = -1;
  if (pipe2(fds, O_CLOEXEC) != 0)
    return NULL;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  posix_spawn_file_actions_addclosefrom_np(&fa, 3);
  pid_t pid;
  int rc = posix_spawn(&pid, argv[0], &fa, NULL, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    return NULL;
  }
  size_t cap = 4096, n = 0;
  char *buf = malloc(cap);
  double deadline = hx_now_ms() + 10000;
  while (buf != NULL) {
    int left = (int)(deadline - hx_now_ms());
    struct pollfd p = {.fd = fds[0], .events = POLLIN};
    if (left <= 0 || poll(&p, 1, left) <= 0)
      break;
    if (n + 1024 > cap) {
      char *b = realloc(buf, cap * 2);
      if (b == NULL)
        break;
      buf = b;
      cap *= 2;
    }
    ssize_t k = read(fds[0], buf + n, cap - n - 1);
    if (k <= 0)
      break;
    n += (size_t)k;
  }
  close(fds[0]);
  int st = 0;
  if (!wait_exit(pid, 5000, &st)) {
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
  }
  *status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  if (buf != NULL)
    buf[n] = '\0';
  return buf;
}

/* A recursive-descent JSON checker (RFC 8259 syntax, depth-limited). */
static const char *json_ws(const char *p) {
  while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
    p++;
  return p;
}

static const char *json_value(const char *p, int depth);

static const char *json_string(const char *p) {
  if (*p++ != '"')
    return NULL;
  while (*p != '"') {
    if ((unsigned char)*p < 0x20)
      return NULL;
    if (*p == '\\') {
      p++;
      if (*p == 'u') {
        for (int i = 1; i <= 4; i++)
          if (!strchr("0123456789abcdefABCDEF", p[i]) || p[i] == '\0')
            return NULL;
        p += 5;
        continue;
      }
      if (*p == '\0' || !strchr("\"\\/bfnrt", *p))
        return NULL;
    }
    p++;
  }
  return p + 1;
}

static const char *json_number(const char *p) {
  const char *s = p;
  if (*p == '-')
    p++;
  if (*p == '0')
    p++;
  else if (*p >= '1' && *p <= '9')
    while (*p >= '0' && *p <= '9')
      p++;
  else
    return NULL;
  if (*p == '.') {
    p++;
    if (!(*p >= '0' && *p <= '9'))
      return NULL;
    while (*p >= '0' && *p <= '9')
      p++;
  }
  if (*p == 'e' || *p == 'E') {
    p++;
    if (*p == '+' || *p == '-')
      p++;
    if (!(*p >= '0' && *p <= '9'))
      return NULL;
    while (*p >= '0' && *p <= '9')
      p++;
  }
  return p > s ? p : NULL;
}

static const char *json_value(const char *p, int depth) {
  if (depth > 64)
    return NULL;
  p = json_ws(p);
  if (*p == '{' || *p == '[') {
    char close = *p == '{' ? '}' : ']';
    bool obj = *p == '{';
    p = json_ws(p + 1);
    if (*p == close)
      return p + 1;
    for (;;) {
      if (obj) {
        p = json_string(json_ws(p));
        if (p == NULL)
          return NULL;
        p = json_ws(p);
        if (*p++ != ':')
          return NULL;
      }
      p = json_value(p, depth + 1);
      if (p == NULL)
        return NULL;
      p = json_ws(p);
      if (*p == ',') {
        p++;
        continue;
      }
      if (*p == close)
        return p + 1;
      return NULL;
    }
  }
  if (*p == '"')
    return json_string(p);
  if (strncmp(p, "true", 4) == 0)
    return p + 4;
  if (strncmp(p, "false", 5) == 0)
    return p + 5;
  if (strncmp(p, "null", 4) == 0)
    return p + 4;
  return json_number(p);
}

bool hx_json_valid(const char *text) {
  const char *p = json_value(text, 0);
  return p != NULL && *json_ws(p) == '\0';
}

bool hx_json_int_after(const char *text, const char *anchor, const char *key,
                       int64_t *value) {
  const char *p = strstr(text, anchor);
  if (p == NULL)
    return false;
  char pat[128];
  snprintf(pat, sizeof(pat), "\"%s\":", key);
  p = strstr(p + strlen(anchor), pat);
  if (p == NULL)
    return false;
  p = json_ws(p + strlen(pat));
  char *end;
  long long v = strtoll(p, &end, 10);
  if (end == p)
    return false;
  *value = v;
  return true;
}

int hx_compress_dataset(hx_dataset_t *ds, int c) {
  for (int f = 0; f < ds->nfiles; f++) {
    char tmp[700];
    snprintf(tmp, sizeof(tmp), "%s.z", ds->files[f]);
    ferry_tfr_options_t o;
    ferry__tfr_options_init(&o);
    o.compression = FERRY_COMPRESSION_NONE;
    ferry_tfr_reader_t *rd = NULL;
    ferry_tfr_writer_t *wr = NULL;
    ferry_error_t err = {0};
    ferry_record_t rec;
    int rc;
    if (ferry__tfr_reader_open(ds->files[f], &o, &rd, &err) != 0)
      return -1;
    if (ferry__tfr_writer_open(tmp, (ferry_compression_t)c, &wr, &err) != 0) {
      ferry__tfr_reader_free(rd);
      return -1;
    }
    while ((rc = ferry__tfr_reader_next(rd, &rec, &err)) == 0)
      if (ferry__tfr_writer_write(wr, rec.data, rec.len, &err) != 0)
        break;
    ferry__tfr_reader_free(rd);
    if (ferry__tfr_writer_close(wr, &err) != 0 || rc != FERRY_EOF ||
        rename(tmp, ds->files[f]) != 0)
      return -1;
  }
  return 0;
}

/* ---- it_client's output ------------------------------------------------- */

/* The header it_client writes before each batch's ids (it_client.c). */
typedef struct hx_batch_head_s {
  uint32_t epoch, n;
  double t_ms;
  uint64_t acked;
} hx_batch_head_t;

int hx_read_client_log(const char *path, bool killed, hx_client_log_t *out,
                       char *why, size_t why_len) {
  memset(out, 0, sizeof(*out));
  FILE *f = fopen(path, "rb");
  if (f == NULL) { /* it_client creates it before it says it is ready */
    snprintf(why, why_len, "%s: %s", path, strerror(errno));
    return -1;
  }
  hx_batch_head_t h;
  long off = 0;
  int rc = 0;
  while (fread(&h, sizeof(h), 1, f) == 1) {
    hx_taken_t *v = realloc(out->v, (out->n + h.n + 1) * sizeof(hx_taken_t));
    if (v == NULL) {
      snprintf(why, why_len, "%s: out of memory", path);
      rc = -1;
      break;
    }
    out->v = v;
    size_t at = out->n;
    bool torn = false;
    for (uint32_t i = 0; i < h.n && !torn; i++) {
      uint64_t id;
      if (fread(&id, sizeof(id), 1, f) != 1)
        torn = true;
      else
        out->v[out->n++] = (hx_taken_t){h.epoch, h.t_ms, id, h.acked};
    }
    if (torn && killed) {
      printf("%s: the killed client's last batch is torn at byte offset %ld "
             "(%zu of %u ids): left out\n", path, off, out->n - at, h.n);
      out->n = at;
      break;
    }
    if (torn) {
      snprintf(why, why_len, "%s: torn batch at byte offset %ld (%zu of %u "
               "ids)", path, off, out->n - at, h.n);
      rc = -1;
      break;
    }
    off += (long)(sizeof(h) + h.n * sizeof(uint64_t));
  }
  fclose(f);
  return rc;
}

void hx_client_log_free(hx_client_log_t *l) {
  free(l->v);
  memset(l, 0, sizeof(*l));
}

long hx_client_log_batches(const char *path) {
  FILE *f = fopen(path, "rb");
  hx_batch_head_t h;
  long k = 0;
  if (f == NULL)
    return 0;
  while (fread(&h, sizeof(h), 1, f) == 1 &&
         fseek(f, (long)h.n * 8, SEEK_CUR) == 0)
    k++;
  fclose(f);
  return k;
}

void hx_stop_process(pid_t pid) {
  char path[64], buf[256];
  if (kill(pid, SIGSTOP) != 0)
    return;
  snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
  double end = hx_now_ms() + 1000;
  do {
    FILE *f = fopen(path, "r");
    size_t n = f != NULL ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
    if (f != NULL)
      fclose(f);
    buf[n] = '\0';
    const char *rp = strrchr(buf, ')'); /* "pid (comm) S ..." */
    if (rp == NULL || (rp[1] == ' ' && (rp[2] == 'T' || rp[2] == 't')))
      return;
    usleep(200); /* the stop takes effect within microseconds */
  } while (hx_now_ms() < end);
}

uint64_t hx_acked_at(const hx_client_log_t *l, double t_ms) {
  uint64_t acked = 0;
  for (size_t i = 0; i < l->n && l->v[i].t_ms <= t_ms; i++)
    acked = l->v[i].acked;
  return acked;
}

bool hx_in_unacked_tail(const hx_client_log_t *l, uint32_t epoch, uint64_t id,
                        double span_ms, double fault_ms, double resume_ms) {
  uint64_t acked = hx_acked_at(l, fault_ms);
  if (acked >= l->n)
    return false;
  double first_unacked = l->v[acked].t_ms, first_after = -1;
  for (size_t i = 0; resume_ms > 0 && i < l->n; i++)
    if (l->v[i].t_ms >= resume_ms) {
      first_after = l->v[i].t_ms;
      break;
    }
  for (size_t i = acked; i < l->n; i++) {
    const hx_taken_t *t = &l->v[i];
    if (t->epoch != epoch || t->id != id)
      continue;
    if (t->t_ms <= fault_ms &&
        (span_ms <= 0 || t->t_ms <= first_unacked + span_ms))
      return true;
    if (first_after >= 0 && t->t_ms == first_after)
      return true;
  }
  return false;
}

/* ---- Resources of a process --------------------------------------------- */

long hx_status_kib(pid_t pid, const char *field) {
  char path[64], line[256];
  snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "r");
  long v = -1;
  if (f == NULL)
    return -1;
  size_t len = strlen(field);
  while (fgets(line, sizeof(line), f) != NULL)
    if (strncmp(line, field, len) == 0 && line[len] == ':') {
      v = strtol(line + len + 1, NULL, 10);
      break;
    }
  fclose(f);
  return v;
}

int hx_count_fds(pid_t pid) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
  DIR *d = opendir(path);
  if (d == NULL)
    return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL)
    n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

int hx_register_dataset(const char *dispatcher, const char *spec_text,
                        char id[17], char *why, size_t why_cap) {
  ferry_spec_t spec;
  ferry_error_t err = {0};
  ferry_rpc_channel_t *ch = NULL;
  uint8_t *sb = NULL, *buf = NULL, *reply = NULL;
  size_t sl = 0, n, len = 0;
  int rc = -1;
  Ferry__V1__RegisterDatasetRequest req =
      FERRY__V1__REGISTER_DATASET_REQUEST__INIT;
  if (ferry__spec_parse(spec_text, &spec, &err) != 0) {
    snprintf(why, why_cap, "spec: %s", err.msg);
    return -1;
  }
  int packed = ferry__spec_pack(&spec, &sb, &sl);
  ferry__spec_close(&spec);
  if (packed != 0 ||
      (req.spec = ferry__v1__pipeline_spec__unpack(NULL, sl, sb)) == NULL) {
    snprintf(why, why_cap, "spec: cannot pack");
    goto out;
  }
  n = ferry__v1__register_dataset_request__get_packed_size(&req);
  if ((buf = malloc(n)) == NULL) {
    snprintf(why, why_cap, "out of memory");
    goto out;
  }
  ferry__v1__register_dataset_request__pack(&req, buf);
  if (ferry__rpc_channel_new(dispatcher, NULL, &ch, &err) != 0 ||
      ferry__rpc_unary(ch, FERRY_METHOD_REGISTER_DATASET, buf, n, 60000,
                       FERRY_RPC_WAIT_FOR_READY, &reply, &len, &err) != 0) {
    snprintf(why, why_cap, "RegisterDataset: %s", err.msg);
    goto out;
  }
  Ferry__V1__RegisterDatasetResponse *resp =
      ferry__v1__register_dataset_response__unpack(NULL, len, reply);
  if (resp == NULL) {
    snprintf(why, why_cap, "RegisterDataset: malformed answer");
    goto out;
  }
  if (id != NULL)
    snprintf(id, 17, "%s", resp->dataset_id);
  ferry__v1__register_dataset_response__free_unpacked(resp, NULL);
  rc = 0;
out:
  ferry_free(reply);
  ferry__rpc_channel_free(ch);
  if (req.spec != NULL)
    ferry__v1__pipeline_spec__free_unpacked(req.spec, NULL);
  ferry_free(sb);
  free(buf);
  return rc;
}

/* ---- Running programs ---------------------------------------------------- */

size_t hx_count_lines(const char *path, const char *needle) {
  FILE *f = fopen(path, "r");
  char line[2048];
  size_t n = 0;
  if (f == NULL)
    return 0;
  while (fgets(line, sizeof(line), f) != NULL)
    n += strstr(line, needle) != NULL;
  fclose(f);
  return n;
}

char *hx_slurp(const char *path) {
  enum { CAP = 1 << 20 };
  FILE *f = fopen(path, "r");
  char *buf = calloc(1, CAP);
  if (f != NULL && buf != NULL) {
    size_t n = fread(buf, 1, CAP - 1, f);
    buf[n] = '\0';
  }
  if (f != NULL)
    fclose(f);
  return buf;
}

int hx_run_capture(char *const *argv, int wait_ms, hx_run_t *r) {
  static int seq;
  char outp[600], errp[600];
  memset(r, 0, sizeof(*r));
  r->status = -1;
  snprintf(outp, sizeof(outp), "%s/run-%d.out", hx_tmpdir(), seq);
  snprintf(errp, sizeof(errp), "%s/run-%d.err", hx_tmpdir(), seq++);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, outp, O_WRONLY | O_CREAT | O_TRUNC,
                                   0600);
  posix_spawn_file_actions_addopen(&fa, 2, errp, O_WRONLY | O_CREAT | O_TRUNC,
                                   0600);
  pid_t pid;
  double t0 = hx_now_ms();
  int rc = posix_spawn(&pid, argv[0], &fa, NULL, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0)
    return rc;
  int st = 0;
  for (;;) {
    pid_t w = waitpid(pid, &st, WNOHANG);
    if (w == pid)
      break;
    if (hx_now_ms() - t0 > wait_ms) {
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
      st = -1;
      break;
    }
    struct timespec ts = {0, 2000000};
    nanosleep(&ts, NULL); /* polling a child's exit, bounded above */
  }
  r->ms = hx_now_ms() - t0;
  r->status = st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  r->out = hx_slurp(outp);
  r->err = hx_slurp(errp);
  return 0;
}

void hx_run_free(hx_run_t *r) {
  free(r->out);
  free(r->err);
  r->out = r->err = NULL;
}

static char certs_dir[600];

int hx_make_certs(const char *script) {
  char cmd[1400];
  snprintf(certs_dir, sizeof(certs_dir), "%s/certs", hx_tmpdir());
  snprintf(cmd, sizeof(cmd), "bash %s %s >/dev/null", script, certs_dir);
  int st = system(cmd);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

const char *hx_cert(const char *name) {
  static char buf[16][700];
  static int i;
  char *b = buf[i++ % 16];
  snprintf(b, sizeof(buf[0]), "%s/%s", certs_dir, name);
  return b;
}

const char *hx_write_token(const char *name, const char *value) {
  static char paths[4][600];
  static int k;
  char *p = paths[k++ % 4];
  snprintf(p, sizeof(paths[0]), "%s/%s", hx_tmpdir(), name);
  FILE *f = fopen(p, "w");
  if (f == NULL)
    return NULL;
  int ok = fprintf(f, "%s\n", value) > 0;
  ok = fclose(f) == 0 && ok && chmod(p, 0600) == 0;
  return ok ? p : NULL;
}

int hx_metrics_address(hx_proc_t *p, int wait_ms, char *out, size_t cap) {
  char url[128];
  if (hx_read_line(p, "metrics on http://", wait_ms, url, sizeof(url)) != 0)
    return -1;
  char *slash = strchr(url, '/');
  if (slash != NULL)
    *slash = '\0';
  size_t n = strlen(url);
  if (n >= cap)
    return -1;
  memcpy(out, url, n + 1);
  return 0;
}

long long hx_metric(const char *hostport, const char *name) {
  char *body = NULL;
  long long v = -1;
  if (hx_http_get(hostport, "/metrics", 5000, &body) != 200) {
    free(body);
    return -1;
  }
  size_t n = strlen(name);
  for (char *l = body; l != NULL && *l != '\0';) {
    char *nl = strchr(l, '\n');
    if (strncmp(l, name, n) == 0 && l[n] == ' ')
      v = atoll(l + n + 1);
    l = nl != NULL ? nl + 1 : NULL;
  }
  free(body);
  return v;
}

double hx_threads_cpu_s(pid_t pid, const char *prefix) {
  char path[128];
  snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
  DIR *d = opendir(path);
  double sum = 0;
  size_t plen = strlen(prefix);
  if (d == NULL)
    return -1;
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    if (e->d_name[0] == '.')
      continue;
    char buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/task/%.24s/stat", (int)pid,
             e->d_name);
    FILE *f = fopen(path, "r");
    if (f == NULL)
      continue;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *open = strchr(buf, '('), *close = strrchr(buf, ')');
    unsigned long long ut, st;
    if (open == NULL || close == NULL ||
        strncmp(open + 1, prefix, plen) != 0 ||
        sscanf(close + 1,
               " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut,
               &st) != 2)
      continue;
    sum += (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
  }
  closedir(d);
  return sum;
}
