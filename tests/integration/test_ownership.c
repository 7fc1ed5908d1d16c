/* Exclusive ownership and addresses, with real
 * daemons: a daemon whose port is taken exits 1 at once naming the
 * address (gRPC's default SO_REUSEPORT is off), a dispatcher whose work
 * directory is locked by a live process exits 1 naming that process, a
 * lock left by a process killed with -9 is taken over, and a cluster on
 * distinct loopback addresses (dispatcher 127.0.0.2, workers 127.0.0.3 and
 * 127.0.0.4 with --advertise, the client dialling 127.0.0.2) delivers an
 * epoch exactly once.
 *
 * Every wait is bounded (hx_spawn's listening line, hx_stop, ferry_next
 * timeouts); every daemon is stopped by the fini fixture. */
#include <criterion/criterion.h>
#include <criterion/hooks.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "tsan.h"

#define NEXT_TIMEOUT_MS 10000
#define REFUSE_BUDGET_MS (1000.0 * FERRY_TSAN_SLOWDOWN)

HX_SUITE(ownership, 60, NULL, NULL);

/* The port of a "HOST:PORT" address. */
static const char *port_of(const char *addr) {
  const char *c = strrchr(addr, ':');
  cr_assert_not_null(c, "no port in '%s'", addr);
  return c + 1;
}

/* Reads TMP/NAME.log (stderr of a process hx_spawn started) into buf. */
static const char *read_log(const char *name, char *buf, size_t cap) {
  char path[600];
  snprintf(path, sizeof(path), "%s/%s.log", hx_tmpdir(), name);
  FILE *f = fopen(path, "r");
  cr_assert_not_null(f, "no log %s", path);
  size_t n = fread(buf, 1, cap - 1, f);
  buf[n] = '\0';
  fclose(f);
  return buf;
}

/* Runs argv (a daemon that must refuse to start) through hx_spawn: it
 * must exit with status 1 before printing a listening line, within
 * REFUSE_BUDGET_MS; returns its stderr in `log`. */
static void expect_refused(const char *name, char *const argv[], char *log,
                           size_t cap) {
  hx_proc_t *p = NULL;
  char why[1024];
  double t0 = hx_now_ms();
  int rc = hx_spawn(&p, name, argv, 5000, why, sizeof(why));
  double elapsed = hx_now_ms() - t0;
  cr_assert_eq(rc, -1, "%s started although it should not have (%s)", name,
               p != NULL ? p->addr : "");
  read_log(name, log, cap);
  /* hx_spawn reports the wait status of a process that exited before
   * its listening line: exit status 1 is 0x100. */
  cr_assert(strstr(why, "exited before listening (status 0x100,") != NULL,
            "%s: %s; its log:\n%s", name, why, log);
  cr_expect_lt(elapsed, REFUSE_BUDGET_MS, "%s took %.0f ms to give up",
               name, elapsed);
  cr_log_info("%s refused in %.0f ms", name, elapsed);
}

Test(ownership, second_dispatcher_on_the_same_port_exits_1) {
  hx_proc_t *d1;
  char why[512], log[8192], wd[600], want[128];
  cr_assert_eq(hx_start_dispatcher(&d1, NULL, why, sizeof(why)), 0, "%s",
               why);
  snprintf(wd, sizeof(wd), "%s/second-dispatcher", hx_tmpdir());
  char *argv[] = {(char *)hx_dispatcher_bin(),
                  "--port",
                  (char *)port_of(d1->addr),
                  "--host",
                  "127.0.0.1",
                  "--work-dir",
                  wd,
                  NULL};
  expect_refused("dispatcher-same-port", argv, log, sizeof(log));
  snprintf(want, sizeof(want), "cannot listen on 127.0.0.1:%s",
           port_of(d1->addr));
  cr_assert(strstr(log, want) != NULL, "the log does not name %s:\n%s",
            d1->addr, log);
  /* The first one still serves. */
  cr_assert_eq(hx_wait_workers(d1->addr, 0, 5000), 0);
  cr_assert_eq(kill(d1->pid, 0), 0, "the first dispatcher died");
}

Test(ownership, second_dispatcher_on_the_same_work_dir_exits_1) {
  hx_proc_t *d1;
  char why[512], log[8192], wd[600], want[700];
  snprintf(wd, sizeof(wd), "%s/shared-work-dir", hx_tmpdir());
  cr_assert_eq(hx_start_dispatcher_at(&d1, NULL, 0, wd, why, sizeof(why)),
               0, "%s", why);
  char *argv[] = {(char *)hx_dispatcher_bin(),
                  "--port",
                  "0",
                  "--host",
                  "127.0.0.1",
                  "--work-dir",
                  wd,
                  NULL};
  expect_refused("dispatcher-same-dir", argv, log, sizeof(log));
  snprintf(want, sizeof(want), "%s/lock: the work directory is in use by "
           "process %d", wd, (int)d1->pid);
  cr_assert(strstr(log, want) != NULL, "the log lacks '%s':\n%s", want, log);
  cr_assert_eq(kill(d1->pid, 0), 0, "the first dispatcher died");
}

Test(ownership, lock_of_a_killed_dispatcher_is_taken_over) {
  hx_proc_t *d1, *d2, *d3;
  char why[512], log[8192], wd[600], want[200], lock[700], text[64] = "";
  snprintf(wd, sizeof(wd), "%s/taken-over", hx_tmpdir());
  cr_assert_eq(hx_start_dispatcher_at(&d1, NULL, 0, wd, why, sizeof(why)),
               0, "%s", why);
  pid_t old = d1->pid;
  cr_assert_eq(hx_stop(d1, SIGKILL, 5000, NULL) & 0x7f, SIGKILL);
  cr_assert_eq(hx_start_dispatcher_at(&d2, NULL, 0, wd, why, sizeof(why)),
               0, "%s", why);
  read_log(d2->name, log, sizeof(log));
  snprintf(want, sizeof(want), "the previous owner, pid %d, is gone",
           (int)old);
  cr_assert(strstr(log, want) != NULL, "the log lacks '%s':\n%s", want, log);
  /* The lock file names the new owner. */
  snprintf(lock, sizeof(lock), "%s/lock", wd);
  FILE *f = fopen(lock, "r");
  cr_assert_not_null(f);
  cr_assert_not_null(fgets(text, sizeof(text), f));
  fclose(f);
  cr_assert_eq(atoi(text), (int)d2->pid, "lock file holds '%s'", text);
  /* A clean stop leaves no owner behind: the next one starts silently. */
  double ms;
  int st = hx_stop(d2, SIGTERM, 5000, &ms);
  cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status 0x%x", st);
  cr_assert_eq(hx_start_dispatcher_at(&d3, NULL, 0, wd, why, sizeof(why)),
               0, "%s", why);
  read_log(d3->name, log, sizeof(log));
  cr_assert(strstr(log, "previous owner") == NULL, "%s", log);
}

Test(ownership, second_worker_on_the_same_port_exits_1) {
  hx_proc_t *d, *w1;
  char why[512], log[8192], want[128];
  cr_assert_eq(hx_start_dispatcher(&d, NULL, why, sizeof(why)), 0, "%s",
               why);
  cr_assert_eq(hx_start_worker(&w1, d->addr, NULL, why, sizeof(why)), 0,
               "%s", why);
  cr_assert_eq(hx_wait_workers(d->addr, 1, 10000), 1);
  char *argv[] = {(char *)hx_worker_bin(),
                  "--dispatcher",
                  d->addr,
                  "--port",
                  (char *)port_of(w1->addr),
                  "--host",
                  "127.0.0.1",
                  "--threads",
                  "1",
                  NULL};
  expect_refused("worker-same-port", argv, log, sizeof(log));
  snprintf(want, sizeof(want), "cannot listen on 127.0.0.1:%s",
           port_of(w1->addr));
  cr_assert(strstr(log, want) != NULL, "the log does not name %s:\n%s",
            w1->addr, log);
  cr_assert_eq(kill(w1->pid, 0), 0, "the first worker died");
  cr_assert_eq(hx_wait_workers(d->addr, 1, 5000), 1);
}

Test(ownership, distinct_loopback_addresses_deliver_exactly_once) {
  hx_proc_t *d, *w[2];
  hx_daemon_opts_t dopts = {.host = "127.0.0.2"};
  hx_daemon_opts_t wopts[2] = {{.host = "127.0.0.3"}, {.host = "127.0.0.4"}};
  char why[512], log[8192], want[128], spec[1024];
  hx_dataset_t ds;

  cr_assert_eq(hx_make_dataset(&ds, "data", 4, 300, 8, 8, 3), 0);
  cr_assert_eq(hx_start_dispatcher(&d, &dopts, why, sizeof(why)), 0, "%s",
               why);
  cr_assert(strncmp(d->addr, "127.0.0.2:", 10) == 0, "%s", d->addr);
  for (int i = 0; i < 2; i++) {
    cr_assert_eq(hx_start_worker(&w[i], d->addr, &wopts[i], why,
                                 sizeof(why)),
                 0, "%s", why);
    /* The worker logs what it advertises: its own address and port. */
    snprintf(want, sizeof(want), "advertising %s:%s", wopts[i].host,
             port_of(w[i]->addr));
    read_log(w[i]->name, log, sizeof(log));
    cr_assert(strstr(log, want) != NULL, "the log lacks '%s':\n%s", want,
              log);
  }
  cr_assert_eq(hx_wait_workers(d->addr, 2, 10000), 2);
  /* The dispatcher hands out the advertised addresses. */
  int st = -1;
  char *json = hx_ferryctl_status_json(d->addr, &st);
  cr_assert_not_null(json);
  cr_assert_eq(st, 0, "%s", json);
  for (int i = 0; i < 2; i++) {
    snprintf(want, sizeof(want), "\"%s:%s\"", wopts[i].host,
             port_of(w[i]->addr));
    cr_assert(strstr(json, want) != NULL, "status lacks %s:\n%s", want,
              json);
  }
  free(json);

  hx_spec(&ds, NULL, 32, spec, sizeof(spec));
  ferry_client_options_t o;
  hx_client_options(&o, d->addr, spec);
  o.num_epochs = 1;
  ferry_client_t *c = NULL;
  ferry_error_t err = {0};
  cr_assert_eq(ferry_client_new(&o, &c, &err), 0, "%s", err.msg);
  hx_ids_t got = {0};
  int rc = hx_collect_epoch(c, &got, &ds, true, NEXT_TIMEOUT_MS, NULL, NULL,
                            &err);
  if (rc != FERRY_EPOCH_END)
    hx_dump_logs();
  cr_assert_eq(rc, FERRY_EPOCH_END, "ferry_next: %d (%s) after %zu records",
               rc, err.msg, got.n);
  size_t n;
  uint64_t *expected = hx_expected_ids(&ds, false, &n);
  cr_assert_eq(n, 1200);
  bool same = hx_same_multiset(got.ids, got.n, expected, n, why, sizeof(why));
  cr_expect(!got.bad_pixels, "record %#llx has wrong pixels",
            (unsigned long long)got.bad_pixel_id);
  cr_assert(same, "%s", why);
  const ferry_batch_t *b = NULL;
  cr_assert_eq(ferry_next(c, &b, NEXT_TIMEOUT_MS, &err), FERRY_END, "%s",
               err.msg);
  ferry_client_free(c);
  hx_ids_free(&got);
  free(expected);
  hx_dataset_free(&ds);
}
