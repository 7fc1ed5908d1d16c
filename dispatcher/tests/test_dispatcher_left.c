/* A worker stopped with SIGTERM says draining in its last heartbeat, then
 * falls silent: once --worker-timeout-ms passes it is recorded as having
 * left ("left"), not as lost, and counted apart from lost workers, live
 * and after a replay of the journal. A worker silent without having said
 * so is still lost. */
#include <criterion/criterion.h>
#include <string.h>

#include "fixture.h"

static ferry_disp_t *D;

static void setup(void) { fx_begin(); }

/* Frees the state and checks that everything Ferry allocated came back. */
static void teardown(void) { fx_end(&D); }

TestSuite(workers_left, .init = setup, .fini = teardown);

static const char *state_of(ferry_disp_t *d, uint64_t id, int64_t now) {
  Ferry__V1__GetStatusResponse *s = fx_status(d, now);
  for (size_t i = 0; i < s->n_workers; i++)
    if (s->workers[i]->worker_id == id)
      return s->workers[i]->state;
  cr_assert_fail("worker %llu not in the status", (unsigned long long)id);
  return NULL;
}

static int replay_entries(ferry_disp_t *d) {
  ferry_error_t err = {0};
  for (size_t i = 0; i < fx_entries.n; i++) {
    int rc = ferry__disp_apply(d, fx_entries.e[i], fx_entries.len[i], 5000,
                               &err);
    if (rc != 0)
      return rc;
  }
  return 0;
}

Test(workers_left, drained_worker_left_silent_worker_lost) {
  ferry_disp_counters_t c;
  Ferry__V1__WorkerHeartbeatResponse *a, *b;

  D = fx_state(1000, 1000, 60000, 8);
  a = fx_worker(D, 0, "a:1", NULL, 0, false, 0);
  b = fx_worker(D, 0, "b:1", NULL, 0, false, 0);
  /* a gets SIGTERM: its last heartbeat says draining. b just stops. */
  fx_worker(D, a->worker_id, "a:1", NULL, 0, true, 300);
  fx_worker(D, b->worker_id, "b:1", NULL, 0, false, 300);
  cr_assert_str_eq(state_of(D, a->worker_id, 400), "draining");
  ferry__disp_tick(D, 1000); /* 700 ms of silence: not yet */
  cr_assert_str_eq(state_of(D, a->worker_id, 1000), "draining");
  cr_assert_str_eq(state_of(D, b->worker_id, 1000), "alive");
  ferry__disp_tick(D, 1400);
  cr_assert_str_eq(state_of(D, a->worker_id, 1400), "left");
  cr_assert_str_eq(state_of(D, b->worker_id, 1400), "lost");
  ferry__disp_counters(D, &c);
  cr_assert_eq(c.workers_left, 1, "the drained worker is counted as left");
  cr_assert_eq(c.workers_lost, 1, "only the silent worker is counted as lost");

  /* The journal says so too: a replay gives the same states. */
  ferry_disp_config_t cfg;
  ferry_disp_t *r;
  ferry__disp_config_init(&cfg);
  cfg.worker_timeout_ms = 1000;
  cr_assert_eq(ferry__disp_new(&cfg, 0, &r), 0);
  cr_assert_eq(replay_entries(r), 0);
  ferry__disp_replayed(r, 5000);
  cr_assert_str_eq(state_of(r, a->worker_id, 5000), "left");
  cr_assert_str_eq(state_of(r, b->worker_id, 5000), "lost");
  ferry__disp_free(r);

  /* A worker that left and starts again registers anew: alive. */
  a = fx_worker(D, a->worker_id, "a:1", NULL, 0, false, 1500);
  cr_assert_str_eq(state_of(D, a->worker_id, 1500), "alive");
}

/* A worker that said draining but heartbeats again without it (it did not
 * stop after all) and then falls silent is lost. */
Test(workers_left, draining_then_serving_again_is_lost) {
  Ferry__V1__WorkerHeartbeatResponse *a;

  D = fx_state(1000, 1000, 60000, 8);
  a = fx_worker(D, 0, "a:1", NULL, 0, false, 0);
  fx_worker(D, a->worker_id, "a:1", NULL, 0, true, 100);
  fx_worker(D, a->worker_id, "a:1", NULL, 0, false, 200);
  ferry__disp_tick(D, 1300);
  cr_assert_str_eq(state_of(D, a->worker_id, 1300), "lost");
}
