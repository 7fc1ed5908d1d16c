/* Hostile specs against real daemons (issue 8, points 3 to 5): a
 * dispatcher and a worker with --data-root, and a caller that names files
 * outside the root, probes for files with globs, names a FIFO, or names a
 * secret file inside the root hoping to read it back through the error
 * text. Each attack must do no harm, and the cluster must then still
 * serve a real job exactly once. */
#include <criterion/criterion.h>
#include <criterion/hooks.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

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
