/* The integration tests' harness: real ferry-dispatcher and ferry-worker
 * processes on 127.0.0.1, synthetic datasets written with the Ferry
 * TFRecord writer, and a client loop that collects record identities.
 *
 * Every wait is bounded. Daemons are registered as they start; hx_reap_all
 * (run by the tests' .fini fixture and by atexit) kills and reaps whatever
 * is left, so a failed assertion never leaks a process. Each started
 * process's pid is also appended to a file named after the Criterion
 * runner, which the runner's POST_ALL hook sweeps: that covers a test
 * killed by its timeout, where no fini or atexit runs.
 */
#ifndef FERRY_TESTS_HARNESS_H
#define FERRY_TESTS_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "ferry/client.h"
#include "ferry/error.h"

/* Daemons registered at once: bench_trainer runs a dispatcher and up to
 * 64 workers (hx_forget frees the slots of stopped ones). */
#define HX_MAX_PROCS 72

/* A started daemon. */
typedef struct hx_proc_s {
  pid_t pid;          /* 0 once reaped */
  int out_fd;         /* read end of its stdout */
  int status;         /* wait status once reaped */
  char name[32];      /* "dispatcher", "worker1", ... */
  char log[512];      /* its stderr */
  char addr[64];      /* "127.0.0.1:PORT" from its listening line */
  /* What its stdout said after the line hx_spawn waited for, not yet
   * read by hx_read_line. */
  char pending[512];
  size_t npending;
} hx_proc_t;

/* Settings for hx_start_dispatcher / hx_start_worker; zero means the
 * default given here. */
typedef struct hx_daemon_opts_s {
  int heartbeat_ms;         /* 100 */
  int worker_timeout_ms;    /* dispatcher: 2000 */
  int client_timeout_ms;    /* dispatcher: 5000 */
  int threads;              /* worker: 1 */
  uint64_t buffer_bytes;    /* worker: 64 MiB */
  const char *host;         /* --host ("127.0.0.1"); a worker given one
                               also gets --advertise HOST */
  int client_stall_ms;      /* dispatcher: its default (30000) */
  const char *const *extra_argv; /* More flags for the daemon
                                    (NULL-terminated; NULL: none), e.g.
                                    --tls-cert FILE */
  char *const *prefix_argv; /* What runs the daemon
                               (NULL-terminated; NULL: none), e.g. `ip
                               netns exec NS` (netns.h's hx_net_argv) */
} hx_daemon_opts_t;

/* A generated dataset: nfiles files of `per_file` records each, named
 * DIR/data-NNN.tfrecord, with features image (raw h*w*c bytes), label and
 * id. Record r of file f has id (f << 40 | r), label (f * 7 + r) % 10 and
 * pixel i equal to (f * 131 + r * 31 + i) & 0xff. */
typedef struct hx_dataset_s {
  char dir[512];
  char glob[600];
  int nfiles, per_file;
  int h, w, c;
  char (*files)[600]; /* nfiles paths */
  /* Byte offset of every record, per file (per_file entries each). */
  uint64_t **offsets;
  /* Records whose data CRC was corrupted (excluded from the expected
   * ids under policy skip). */
  uint64_t corrupt[64];
  int ncorrupt;
} hx_dataset_t;

/* Records received by a client, in order of arrival. */
typedef struct hx_ids_s {
  uint64_t *ids;
  int64_t *labels;
  size_t n, cap;
  uint32_t batches;
  bool bad_pixels;      /* an image differed from what was written */
  uint64_t bad_pixel_id;
} hx_ids_t;

/* The per-test temporary directory (created on first use, removed by
 * hx_reap_all unless FERRY_IT_KEEP is set). */
const char *hx_tmpdir(void);

/* What hx_run_capture saw of a program: its exit status (-1 when killed
 * or not started), its stdout and stderr (malloc'ed, NUL-terminated, the
 * first MiB of each) and the time from its start to its exit. */
typedef struct hx_run_s {
  int status;
  char *out, *err;
  double ms;
} hx_run_t;

/* Runs argv (NULL-terminated; argv[0] a path) with stdin from /dev/null
 * and stdout and stderr captured in files under hx_tmpdir(), waiting at
 * most `wait_ms` (then SIGKILL). Returns 0, or posix_spawn's error (then
 * r->status is -1). Free with hx_run_free. */
int hx_run_capture(char *const *argv, int wait_ms, hx_run_t *r);
/* The first MiB of the file at `path`, NUL-terminated and malloc'ed (an
 * empty string when it cannot be read; NULL only without memory). */
char *hx_slurp(const char *path);
void hx_run_free(hx_run_t *r);

/* How many lines of the file at `path` (a daemon's log) contain
 * `needle`; 0 when it cannot be read. */
size_t hx_count_lines(const char *path, const char *needle);

/* Makes the tests' certificates with make_certs.sh (`script`) in
 * hx_tmpdir()/certs. Returns 0, 77 when openssl is missing, else the
 * script's exit status. */
int hx_make_certs(const char *script);
/* DIR/NAME in hx_make_certs's directory (static, 16 rotating buffers). */
const char *hx_cert(const char *name);
/* Writes `value` and a newline to hx_tmpdir()/NAME, mode 0600, as a token
 * file. Returns its path (static, 4 rotating buffers), NULL on failure. */
const char *hx_write_token(const char *name, const char *value);

/* Milliseconds on the monotonic clock. */
double hx_now_ms(void);

/* A random seed for `test` (FERRY_IT_SEED when set), printed with the
 * line that replays it. */
unsigned hx_seed(const char *test);

/* Starts `argv[0]` with posix_spawn: stdout to a pipe, stderr to
 * TMP/NAME.log. Waits up to `wait_ms` for a line containing
 * "listening on HOST:PORT" and stores HOST:PORT in p->addr. Returns 0,
 * or -1 with `why` filled (the process is then reaped). */
int hx_spawn(hx_proc_t **out, const char *name, char *const argv[],
             int wait_ms, char *why, size_t why_len);

/* hx_spawn waiting for a line containing `marker` instead (the rest of
 * the line goes to p->addr): for programs that are not servers, such as
 * the client processes of the client-fault tests. */
int hx_spawn_marked(hx_proc_t **out, const char *name, char *const argv[],
                    const char *marker, int wait_ms, char *why,
                    size_t why_len);

/* Reads the started process's stdout (after the line hx_spawn waited
 * for) until a line containing `marker`, at most `wait_ms`, and copies
 * the rest of that line into `out`: e.g. "metrics on http://" for the
 * address a daemon started with --metrics-port 0 serves /metrics on.
 * Returns 0, or -1 (timeout, or the process closed its stdout). */
int hx_read_line(hx_proc_t *p, const char *marker, int wait_ms, char *out,
                 size_t cap);

/* HTTP/1.0 GET of `path` from `hostport` ("127.0.0.1:PORT"), at most
 * `wait_ms` in all: returns the status code and the body in *body
 * (malloc'ed, NUL-terminated; the first 4 MiB), or -1 (*body NULL). */
int hx_http_get(const char *hostport, const char *path, int wait_ms,
                char **body);

/* One map entry of tf.train.Features at p: `key` and a Feature holding
 * either bytes (kind 1) or one int64 (kind 3), as hx_make_dataset writes
 * them. Returns the bytes written. */
size_t hx_put_feature(uint8_t *p, const char *key, int kind,
                      const uint8_t *bytes, size_t blen, int64_t v);

/* The HOST:PORT of a daemon's metrics server (started with --metrics-port)
 * from its "metrics on http://HOST:PORT/metrics" line, read within
 * wait_ms. 0, or -1 when it printed none. */
int hx_metrics_address(hx_proc_t *p, int wait_ms, char *out, size_t cap);

/* The value of the sample `name` (with its labels, e.g.
 * `ferry_worker_share_records_total{what="served"}`) in one scrape of
 * http://HOSTPORT/metrics; -1 when absent or the scrape failed. */
long long hx_metric(const char *hostport, const char *name);

/* CPU seconds (user + system) of the threads of `pid` whose name starts
 * with `prefix` (/proc/PID/task/TID/stat); -1 when unreadable. */
double hx_threads_cpu_s(pid_t pid, const char *prefix);

/* Starts ferry-dispatcher / ferry-worker (paths from FERRY_IT_DISPATCHER /
 * FERRY_IT_WORKER, else the build tree) with `o` (may be NULL). */
int hx_start_dispatcher(hx_proc_t **out, const hx_daemon_opts_t *o,
                        char *why, size_t why_len);
int hx_start_worker(hx_proc_t **out, const char *dispatcher,
                    const hx_daemon_opts_t *o, char *why, size_t why_len);

/* Starts ferry-dispatcher on `port` (0: any free port) with `work_dir` as
 * its --work-dir (created if absent; NULL: a fresh directory under
 * hx_tmpdir()): a dispatcher restarted on the port and journal of one
 * that died. */
int hx_start_dispatcher_at(hx_proc_t **out, const hx_daemon_opts_t *o,
                           int port, const char *work_dir, char *why,
                           size_t why_len);

/* Sends `sig` and waits up to `wait_ms` for the process to exit, then
 * SIGKILLs and reaps it. Returns the wait status (or -1 if it had to be
 * killed) and the time from the signal to the exit in *elapsed_ms (may
 * be NULL). */
int hx_stop(hx_proc_t *p, int sig, int wait_ms, double *elapsed_ms);

/* Frees the slot of a process that hx_stop has reaped, so that a later
 * hx_spawn may reuse it: for programs that start more daemons over their
 * life than HX_MAX_PROCS. `p` must not be used afterwards; NULL or a
 * process still running is left alone. */
void hx_forget(hx_proc_t *p);

/* SIGKILLs and reaps every daemon still running, closes their pipes, and
 * removes the temporary directory. Idempotent. */
void hx_reap_all(void);

/* Set by Criterion tests: note each pid for hx_sweep_runner_pids. */
extern bool hx_track_runner_pids;

/* Whether this build's memory and rate figures may be asserted: not
 * under ThreadSanitizer, whose shadow memory and access history grow
 * with the run (VmRSS) and under which code runs several times slower
 * (rates), so a test still prints them but checks only what it counts.
 * When not, prints that `what` is not asserted, and why. */
bool hx_figures_asserted(const char *what);

/* With FERRY_IT_UCX_PROBE set: exits 77 (a skip), saying why, when UCX
 * cannot start on this machine. In the Criterion runner, before any test
 * (suite_hooks.c's ReportHook(PRE_ALL)). */
void hx_ucx_probe(void);

/* In the Criterion runner (ReportHook(POST_ALL)): SIGKILLs the daemons
 * that tests killed by their timeout left behind. */
void hx_sweep_runner_pids(void);

/* An integration test executable's Criterion suite (once per file, after
 * including criterion.h): before each test the runner's pids are tracked
 * and `before` runs, after it every process the test started is reaped
 * and `after` runs (both `void f(void)` or NULL), and at the end of the
 * run the daemons of tests killed by their timeout are swept. */
#define HX_SUITE(name, timeout_s, before, after)                          \
  static void hx_suite_init_(void) {                                      \
    void (*hx_f_)(void) = (before);                                       \
    hx_track_runner_pids = true;                                          \
    hx_client_log_from_env();                                             \
    if (hx_f_ != NULL)                                                    \
      hx_f_();                                                            \
  }                                                                       \
  static void hx_suite_fini_(void) {                                      \
    void (*hx_f_)(void) = (after);                                        \
    hx_reap_all();                                                        \
    if (hx_f_ != NULL)                                                    \
      hx_f_();                                                            \
  }                                                                       \
  ReportHook(POST_ALL)(struct criterion_global_stats *hx_stats_) {        \
    (void)hx_stats_;                                                      \
    hx_sweep_runner_pids();                                               \
  }                                                                       \
  TestSuite(name, .init = hx_suite_init_, .fini = hx_suite_fini_,         \
            .timeout = (timeout_s))

/* FERRY_IT_CLIENT_LOG=LEVEL (debug, info, warn...) sends the in-process
 * client library's log lines to stderr at that level (debugging). */
void hx_client_log_from_env(void);

/* Prints the last lines of every daemon's log to stderr (debugging). */
void hx_dump_logs(void);

/* Asks the dispatcher (GetStatus) until at least `n` workers are "alive",
 * at most `wait_ms`. Returns the number seen last. */
int hx_wait_workers(const char *dispatcher, int n, int wait_ms);
/* RegisterDataset of `spec_text`'s source on `dispatcher` (its header
 * scan runs now, not in the first client's ferry_client_new). Copies the
 * dataset id into `id` (17 bytes) when not NULL. 0, or -1 with a message
 * in `why`. */
int hx_register_dataset(const char *dispatcher, const char *spec_text,
                        char id[17], char *why, size_t why_cap);

/* What one GetStatus of the dispatcher lists. */
typedef struct hx_status_counts_s {
  int workers;  /* every worker listed (lost ones too) */
  int alive;    /* those "alive" */
  int jobs;     /* jobs listed (garbage-collected ones are not) */
  int datasets; /* datasets registered */
} hx_status_counts_t;

/* One GetStatus (2 s deadline): 0 and *out filled, or -1. */
int hx_status_counts(const char *dispatcher, hx_status_counts_t *out);

/* Writes a dataset into a fresh directory under hx_tmpdir(), any number
 * of files. Free it with hx_dataset_free. */
int hx_make_dataset(hx_dataset_t *ds, const char *sub, int nfiles,
                    int per_file, int h, int w, int c);
void hx_dataset_free(hx_dataset_t *ds);

/* Rewrites every file of the dataset compressed with `c` (GZIP or ZLIB;
 * the same records, so offsets in the uncompressed stream and ids stay).
 * Returns 0 or -1. */
int hx_compress_dataset(hx_dataset_t *ds, int c);

/* Flips a bit of the data CRC of record `rec` of file `file`. */
int hx_corrupt_record(hx_dataset_t *ds, int file, int rec);

/* The pipeline spec text over the dataset: raw decode, `extra` stages
 * (may be NULL or "") and batch(batch). */
void hx_spec(const hx_dataset_t *ds, const char *extra, int batch, char *out,
             size_t cap);

/* The sorted expected ids of one epoch (corrupt records excluded when
 * `skip_corrupt`); *n gets the count. Free with free(). */
uint64_t *hx_expected_ids(const hx_dataset_t *ds, bool skip_corrupt,
                          size_t *n);

/* Client options with the harness's defaults: dispatcher, spec, heartbeat
 * 50 ms, connect timeout 5 s. */
void hx_client_options(ferry_client_options_t *o, const char *dispatcher,
                       const char *spec);

/* Runs ferry_next until the epoch ends, appending every record's id and
 * label to `out` and checking its pixels against `ds` (when not NULL and
 * the pipeline does not change pixels: `check_pixels`). `after_batch`
 * (may be NULL) runs after each batch with the number of batches so far.
 * Each ferry_next waits at most `timeout_ms`. Returns FERRY_EPOCH_END,
 * FERRY_END or the error (err filled). */
int hx_collect_epoch(ferry_client_t *c, hx_ids_t *out, const hx_dataset_t *ds,
                     bool check_pixels, int timeout_ms,
                     void (*after_batch)(uint32_t batches, void *arg),
                     void *arg, ferry_error_t *err);

void hx_ids_free(hx_ids_t *ids);

/* Sorts a copy of `ids` and compares it with the sorted `expected`. On a
 * mismatch writes the first difference (missing / duplicate / unexpected
 * id) into `why` and returns false. */
bool hx_same_multiset(const uint64_t *ids, size_t n, const uint64_t *expected,
                      size_t n_expected, char *why, size_t why_len);

/* Runs `ferryctl status --json --dispatcher ADDR` and returns its stdout
 * (malloc'ed, NUL-terminated) and exit status in *status. NULL if it
 * could not run. */
char *hx_ferryctl_status_json(const char *dispatcher, int *status);

/* True when `text` is one well-formed JSON value (and nothing else but
 * white space). */
bool hx_json_valid(const char *text);

/* Finds, after the first occurrence of `anchor` in `text`, the next
 * `"key":` and parses the integer after it. Returns false when absent. */
bool hx_json_int_after(const char *text, const char *anchor, const char *key,
                       int64_t *value);

/* CPU seconds (user + system) process `pid` has used so far, from
 * /proc/PID/stat; -1 when it cannot be read. */
double hx_proc_cpu_s(pid_t pid);

/* ---- it_client's output (the format is it_client.c's) ------------------- */

/* One record an it_client process handed its trainer: its epoch, the
 * time of its batch (CLOCK_MONOTONIC ms, as hx_now_ms), its id, and the
 * client's records_acked noted with its batch. */
typedef struct hx_taken_s {
  uint32_t epoch;
  double t_ms;
  uint64_t id;
  uint64_t acked;
} hx_taken_t;

/* Every record of one it_client output file, in the order handed out. */
typedef struct hx_client_log_s {
  hx_taken_t *v;
  size_t n;
} hx_client_log_t;

/* Reads an it_client output file. Returns 0, or -1 with `why` naming the
 * file and what failed (absent, unreadable, the byte offset of a torn
 * batch). `killed`: the client died by SIGKILL, which can cut its last
 * write() short (the kernel stops a write at a page boundary when a fatal
 * signal is pending): that torn batch is left out, with a printed line. */
int hx_read_client_log(const char *path, bool killed, hx_client_log_t *out,
                       char *why, size_t why_len);
void hx_client_log_free(hx_client_log_t *l);

/* Batches in an it_client output file so far. */
long hx_client_log_batches(const char *path);

/* Sends SIGSTOP to `pid` and returns once it is stopped (at most 1 s):
 * kill() returns before the stop takes effect, and the process may take
 * and log a batch in between. The time after this is the fault's time
 * for hx_in_unacked_tail, as is the time after hx_stop of a SIGKILL. */
void hx_stop_process(pid_t pid);

/* records_acked noted with the last batch logged at or before `t_ms` (a
 * lower bound of what the dispatcher had acknowledged then). */
uint64_t hx_acked_at(const hx_client_log_t *l, double t_ms);

/* True when the client of `l` handed out record `id` of `epoch` in its
 * unacknowledged tail at a fault (docs/ARCHITECTURE.md, "Exactly once"):
 * past its acknowledged count at `fault_ms`, and before the fault,
 * within `span_ms` of the first record past that count (the client's
 * lease, which starts before it, bounds how long it hands out
 * unacknowledged records; 0: no bound) or, when it was stopped and
 * resumed at `resume_ms` (> 0), in the one batch ferry_next may have been
 * returning when the stop hit (its first batch after resuming). */
bool hx_in_unacked_tail(const hx_client_log_t *l, uint32_t epoch, uint64_t id,
                        double span_ms, double fault_ms, double resume_ms);

/* ---- Resources of a process --------------------------------------------- */

/* A "Field:   N kB" line of /proc/PID/status (VmRSS, VmHWM, ...) in KiB;
 * -1 when absent. */
long hx_status_kib(pid_t pid, const char *field);

/* Open file descriptors of a process (entries of /proc/PID/fd); -1 when
 * it cannot be read. */
int hx_count_fds(pid_t pid);

/* Paths of the binaries the tests run. */
const char *hx_dispatcher_bin(void);
const char *hx_worker_bin(void);
const char *hx_ferryctl_bin(void);

#endif /* FERRY_TESTS_HARNESS_H */
