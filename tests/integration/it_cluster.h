/* Criterion helpers the integration suites share (include after
 * criterion.h and harness.h): a cluster of a dispatcher and n workers,
 * and a client that must start. Failures dump the daemons' logs. */
#ifndef FERRY_IT_CLUSTER_H
#define FERRY_IT_CLUSTER_H

#include "ferry/client.h"
#include "harness.h"

/* Starts a dispatcher into *d (options `dopts`, may be NULL) and n
 * workers into w[0..n) (options `wopts`), and waits up to 10 s until all
 * n registered. */
static inline void it_cluster(hx_proc_t **d, hx_proc_t **w, int n,
                              const hx_daemon_opts_t *dopts,
                              const hx_daemon_opts_t *wopts) {
  char why[512];
  cr_assert_eq(hx_start_dispatcher(d, dopts, why, sizeof(why)), 0, "%s",
               why);
  for (int i = 0; i < n; i++)
    cr_assert_eq(hx_start_worker(&w[i], (*d)->addr, wopts, why, sizeof(why)),
                 0, "%s", why);
  int seen = hx_wait_workers((*d)->addr, n, 10000);
  if (seen != n)
    hx_dump_logs();
  cr_assert_eq(seen, n, "%d of %d workers registered within 10 s", seen, n);
}

/* A 64-bit FNV-1a digest of one record's pixels and label: records of
 * two runs compared by id. */
static inline uint64_t it_digest(const uint8_t *p, size_t n, int64_t label) {
  uint64_t h = 0xcbf29ce484222325ull ^ (uint64_t)label;
  for (size_t i = 0; i < n; i++)
    h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

/* ferry_client_new that must succeed. */
static inline ferry_client_t *it_new_client(const ferry_client_options_t *o) {
  ferry_client_t *c = NULL;
  ferry_error_t err = {0};
  int rc = ferry_client_new(o, &c, &err);
  if (rc != 0)
    hx_dump_logs();
  cr_assert_eq(rc, 0, "ferry_client_new: %s (%s)", err.msg,
               ferry_strerror(rc));
  return c;
}

#endif /* FERRY_IT_CLUSTER_H */
