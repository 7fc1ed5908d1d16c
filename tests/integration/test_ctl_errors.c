/* What ferryctl and the daemons say when they are pointed at the wrong
 * thing, with real processes on 127.0.0.1:
 *
 * - a TLS dispatcher dialed without TLS flags: a hint to pass --tls-ca
 *   (gRPC says only "Socket closed"), and the reverse;
 * - a worker's port given as --dispatcher: "is not a Ferry dispatcher"
 *   (gRPC says "unknown method");
 * - drain and job cancel on a dispatcher with tokens but no admin token:
 *   the refusal says the admin token is needed and that none is
 *   configured;
 * - ferry-worker refuses a malformed --dispatcher or --advertise (exit 2),
 *   and says why a dispatcher does not answer (a host that does not
 *   resolve, a port nobody listens on);
 * - ferry-dispatcher creates a --work-dir's missing parents, and names
 *   the directory it cannot create. */
#include <criterion/criterion.h>
#include <criterion/hooks.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

extern char **environ;

HX_SUITE(ctl_errors, 120, NULL, NULL);

typedef hx_run_t out_t;

/* Runs argv (NULL-terminated) with stdout and stderr in files, waiting at
 * most `wait_ms` (then SIGKILL). */
static out_t run(int wait_ms, char *const *argv) {
  out_t r;
  int rc = hx_run_capture(argv, wait_ms, &r);
  cr_assert_eq(rc, 0, "cannot run %s: %s", argv[0], strerror(rc));
  return r;
}

static void out_free(out_t *r) { hx_run_free(r); }

static const char *C(const char *name) { return hx_cert(name); }

static void make_certs(void) {
  int st = hx_make_certs(FERRY_IT_CERTS_SCRIPT);
  if (st == 77)
    cr_skip_test("openssl is not installed: no certificates to test with");
  cr_assert_eq(st, 0, "make_certs.sh failed (status %d)", st);
}

/* gRPC said "did not answer ... Socket closed" (exit 3) and nothing about
 * TLS: the hint names --tls-ca. And a plaintext dispatcher dialed with
 * --tls-ca says it does not serve TLS. */
Test(ctl_errors, tls_mismatch_is_named) {
  make_certs();
  const char *tls[] = {"--tls-cert", C("server.pem"), "--tls-key",
                       C("server.key"), "--tls-ca", C("ca.pem"), NULL};
  hx_daemon_opts_t o = {.extra_argv = tls};
  hx_proc_t *d;
  char why[512];
  cr_assert_eq(hx_start_dispatcher(&d, &o, why, sizeof(why)), 0, "%s", why);
  char *a[] = {(char *)hx_ferryctl_bin(), "status", "--dispatcher", d->addr,
               NULL};
  out_t r = run(20000, a);
  cr_assert_eq(r.status, 3, "exit %d: %s", r.status, r.err);
  cr_assert(strstr(r.err, "the dispatcher may require TLS: pass --tls-ca") !=
                NULL, "no TLS hint: %s", r.err);
  out_free(&r);
  /* With the CA it works: the hint was right. */
  char *ok[] = {(char *)hx_ferryctl_bin(), "status", "--dispatcher", d->addr,
                "--tls-ca", (char *)C("ca.pem"), NULL};
  r = run(20000, ok);
  cr_assert_eq(r.status, 0, "with --tls-ca: exit %d: %s", r.status, r.err);
  out_free(&r);

  hx_proc_t *plain;
  cr_assert_eq(hx_start_dispatcher(&plain, NULL, why, sizeof(why)), 0, "%s",
               why);
  char *b[] = {(char *)hx_ferryctl_bin(), "status", "--dispatcher",
               plain->addr, "--tls-ca", (char *)C("ca.pem"), NULL};
  r = run(20000, b);
  cr_assert_eq(r.status, 3, "exit %d: %s", r.status, r.err);
  cr_assert(strstr(r.err, "does not serve TLS: drop --tls-ca") != NULL,
            "no plaintext hint: %s", r.err);
  out_free(&r);
}

/* A worker's port read "unknown method /ferry.v1.Dispatcher/GetStatus". */
Test(ctl_errors, worker_port_is_not_a_dispatcher) {
  hx_proc_t *d, *w;
  char why[512];
  cr_assert_eq(hx_start_dispatcher(&d, NULL, why, sizeof(why)), 0, "%s", why);
  cr_assert_eq(hx_start_worker(&w, d->addr, NULL, why, sizeof(why)), 0, "%s",
               why);
  char *a[] = {(char *)hx_ferryctl_bin(), "status", "--dispatcher", w->addr,
               NULL};
  out_t r = run(20000, a);
  char want[200];
  snprintf(want, sizeof(want), "%s is not a Ferry dispatcher (it does not "
           "serve ferry.v1.Dispatcher; is it a worker?)", w->addr);
  cr_assert_eq(r.status, 3, "exit %d: %s", r.status, r.err);
  cr_assert(strstr(r.err, want) != NULL, "no '%s' in: %s", want, r.err);
  cr_assert(strstr(r.err, "unknown method") == NULL, "%s", r.err);
  out_free(&r);
}

/* A worker whose --dispatcher does not resolve logged only "dispatcher
 * H:P unreachable (/ferry.v1.Dispatcher/WorkerHeartbeat: Deadline
 * Exceeded)": gRPC reports a failed resolution as a deadline. The warning
 * names the resolver's answer, and for a port nobody listens on says so. */
Test(ctl_errors, worker_names_why_its_dispatcher_is_unreachable) {
  struct {
    const char *dispatcher, *says;
  } cases[] = {
      {"no-such-host.invalid:5050",
       "cannot resolve host 'no-such-host.invalid'"},
      {"127.0.0.1:1", "nothing listens on 127.0.0.1:1"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    hx_proc_t *w;
    char why[512];
    cr_assert_eq(hx_start_worker(&w, cases[i].dispatcher, NULL, why,
                                 sizeof(why)),
                 0, "%s", why);
    /* The warning comes after the first heartbeat's deadline (about 1 s
     * at the harness's 100 ms interval) and the probe (1 s at most). */
    char *log = NULL;
    bool found = false;
    for (double until = hx_now_ms() + 15000; !found && hx_now_ms() < until;) {
      free(log);
      log = hx_slurp(w->log);
      found = log != NULL && strstr(log, "unreachable") != NULL &&
              strstr(log, cases[i].says) != NULL;
      if (!found) {
        struct timespec ts = {0, 50000000};
        nanosleep(&ts, NULL); /* polling its log, bounded above */
      }
    }
    cr_assert(hx_stop(w, SIGTERM, 5000, NULL) != -1, "the worker ignored "
              "SIGTERM");
    cr_assert(found, "--dispatcher %s: no '%s' in its log within 15 s: %s",
              cases[i].dispatcher, cases[i].says, log ? log : "");
    free(log);
    hx_forget(w);
  }
}

static const char *write_token(const char *name, const char *value) {
  const char *p = hx_write_token(name, value);
  cr_assert_not_null(p, "cannot write the token file %s", name);
  return p;
}

/* Tokens on, no --admin-token-file: drain and cancel are refused to every
 * caller; the refusal now says why and what would allow it. */
Test(ctl_errors, admin_refusal_names_the_admin_token) {
  const char *client = write_token("client.token", "client-secret-token-1");
  const char *dargs[] = {"--client-token-file", client, NULL};
  hx_daemon_opts_t o = {.extra_argv = dargs};
  hx_proc_t *d;
  char why[512];
  cr_assert_eq(hx_start_dispatcher(&d, &o, why, sizeof(why)), 0, "%s", why);
  char *drain[] = {(char *)hx_ferryctl_bin(), "drain", "127.0.0.1:9",
                   "--dispatcher", d->addr, "--token-file", (char *)client,
                   NULL};
  char *cancel[] = {(char *)hx_ferryctl_bin(), "job", "cancel", "1",
                    "--dispatcher", d->addr, NULL};
  char *const *cmds[] = {drain, cancel};
  for (int i = 0; i < 2; i++) {
    out_t r = run(20000, cmds[i]);
    cr_assert_eq(r.status, 1, "exit %d: %s", r.status, r.err);
    cr_assert(strstr(r.err, "needs the admin token: the dispatcher was "
                            "started without --admin-token-file") != NULL,
              "%s", r.err);
    out_free(&r);
  }
  /* With an admin token configured, a client token is told it needs it. */
  const char *admin = write_token("admin.token", "admin-secret-token-2");
  const char *dargs2[] = {"--client-token-file", client,
                          "--admin-token-file", admin, NULL};
  hx_daemon_opts_t o2 = {.extra_argv = dargs2};
  hx_proc_t *d2;
  cr_assert_eq(hx_start_dispatcher(&d2, &o2, why, sizeof(why)), 0, "%s",
               why);
  drain[4] = d2->addr;
  out_t r = run(20000, drain);
  cr_assert_eq(r.status, 1, "exit %d: %s", r.status, r.err);
  cr_assert(strstr(r.err, "does not allow this method") != NULL &&
                strstr(r.err, "needs the admin token") != NULL &&
                strstr(r.err, "--token-file") != NULL,
            "%s", r.err);
  out_free(&r);
}

/* ferry-worker dialed port 0 for `--dispatcher 127.0.0.2`. */
Test(ctl_errors, worker_refuses_malformed_addresses) {
  struct {
    const char *flag, *value, *says;
  } cases[] = {
      {"--dispatcher", "127.0.0.2", "has no port"},
      {"--dispatcher", "127.0.0.1:99999", "from 1 to 65535"},
      {"--advertise", "host:0", "from 1 to 65535"},
      {"--advertise", "http://host", "without a scheme"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    char *a[] = {(char *)hx_worker_bin(), "--host", "127.0.0.1", "--port",
                 "0", "--dispatcher", "127.0.0.1:5050", (char *)cases[i].flag,
                 (char *)cases[i].value, NULL};
    out_t r = run(20000, a);
    cr_assert_eq(r.status, 2, "%s %s: exit %d: %s", cases[i].flag,
                 cases[i].value, r.status, r.err);
    cr_assert(strstr(r.err, cases[i].flag) != NULL &&
                  strstr(r.err, cases[i].says) != NULL,
              "%s %s: %s", cases[i].flag, cases[i].value, r.err);
    out_free(&r);
  }
}

/* --work-dir made one level only: a fresh machine's
 * /var/lib/ferry/cluster-a failed when /var/lib/ferry did not exist. */
Test(ctl_errors, work_dir_parents_are_created) {
  char wd[700], why[512];
  snprintf(wd, sizeof(wd), "%s/a/b/c", hx_tmpdir());
  hx_proc_t *d;
  cr_assert_eq(hx_start_dispatcher_at(&d, NULL, 0, wd, why, sizeof(why)), 0,
               "%s", why);
  struct stat st;
  char lock[800];
  snprintf(lock, sizeof(lock), "%s/lock", wd);
  cr_assert_eq(stat(lock, &st), 0, "no %s", lock);
  /* A parent that is a file: the error names it. */
  char file[700], bad[800];
  snprintf(file, sizeof(file), "%s/plain", hx_tmpdir());
  FILE *f = fopen(file, "w");
  cr_assert_not_null(f);
  fclose(f);
  snprintf(bad, sizeof(bad), "%s/sub/dir", file);
  char *a[] = {(char *)hx_dispatcher_bin(), "--host", "127.0.0.1", "--port",
               "0", "--work-dir", bad, NULL};
  out_t r = run(20000, a);
  cr_assert_eq(r.status, 1, "exit %d: %s", r.status, r.err);
  char want[1700];
  snprintf(want, sizeof(want), "--work-dir %s: %s exists and is not a "
           "directory", bad, file);
  cr_assert(strstr(r.err, want) != NULL, "no '%s' in: %s", want, r.err);
  out_free(&r);
}
