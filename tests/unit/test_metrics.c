/* The metrics registry and its Prometheus text writer (metrics.h). */
#include <criterion/criterion.h>
#include <pthread.h>
#include <string.h>

#include "alloc.h"
#include "metrics.h"

static char *render(ferry_metrics_t *r) {
  size_t len = 0;
  char *s = ferry__metrics_render(r, &len);
  cr_assert_not_null(s);
  cr_assert_eq(strlen(s), len);
  return s;
}

static void assert_has(const char *text, const char *line) {
  cr_assert_not_null(strstr(text, line), "missing:\n%s\nin:\n%s", line, text);
}

Test(metrics, counter_and_gauge_lines) {
  ferry_metrics_t *r = ferry__metrics_new();
  ferry_metric_family_t *c =
      ferry__metrics_family(r, FERRY_METRIC_COUNTER, "ferry_test_records_total",
                            "Records produced.", NULL, 1, NULL, 0);
  ferry_metric_family_t *g =
      ferry__metrics_family(r, FERRY_METRIC_GAUGE, "ferry_test_fraction",
                            "A fraction.", NULL, 1e-6, NULL, 0);
  ferry__metric_add(ferry__metric_get(c), 41);
  ferry__metric_add(ferry__metric_get(c), 1);
  ferry__metric_set_double(ferry__metric_get(g), 0.25);
  char *s = render(r);
  cr_assert_str_eq(s, "# HELP ferry_test_records_total Records produced.\n"
                      "# TYPE ferry_test_records_total counter\n"
                      "ferry_test_records_total 42\n"
                      "# HELP ferry_test_fraction A fraction.\n"
                      "# TYPE ferry_test_fraction gauge\n"
                      "ferry_test_fraction 0.25\n");
  ferry__free(s);
  ferry__metrics_free(r);
}

Test(metrics, label_values_and_help_are_escaped) {
  ferry_metrics_t *r = ferry__metrics_new();
  ferry_metric_family_t *f = ferry__metrics_family(
      r, FERRY_METRIC_COUNTER, "ferry_test_rpcs_total",
      "Back\\slash and\nnewline \"quoted\".", "method,code", 1, NULL, 0);
  const char *v[2] = {"a\"b\\c\nd", "OK"};
  ferry__metric_add(ferry__metric_child(f, v), 3);
  /* The same values find the same child. */
  ferry__metric_add(ferry__metric_child(f, v), 2);
  char *s = render(r);
  /* HELP escapes \ and newline but not quotes; values escape all three. */
  assert_has(s, "# HELP ferry_test_rpcs_total Back\\\\slash and\\nnewline "
                "\"quoted\".\n");
  assert_has(s, "ferry_test_rpcs_total{method=\"a\\\"b\\\\c\\nd\","
                "code=\"OK\"} 5\n");
  ferry__free(s);
  ferry__metrics_free(r);
}

Test(metrics, histogram_buckets_are_cumulative) {
  ferry_metrics_t *r = ferry__metrics_new();
  static const double bounds[] = {0.001, 0.01, 0.1};
  ferry_metric_family_t *h = ferry__metrics_family(
      r, FERRY_METRIC_HISTOGRAM, "ferry_test_stage_seconds",
      "Seconds per stage.", "stage", 1e-9, bounds, 3);
  ferry_metric_t *m = ferry__metric_get1(h, "decode");
  ferry__metric_observe(m, 500000);     /* 0.5 ms */
  ferry__metric_observe(m, 1000000);    /* 1 ms: le is inclusive */
  ferry__metric_observe(m, 50000000);   /* 50 ms */
  ferry__metric_observe(m, 2000000000); /* 2 s */
  char *s = render(r);
  assert_has(s, "# TYPE ferry_test_stage_seconds histogram\n");
  assert_has(s, "ferry_test_stage_seconds_bucket{stage=\"decode\","
                "le=\"0.001\"} 2\n"
                "ferry_test_stage_seconds_bucket{stage=\"decode\","
                "le=\"0.01\"} 2\n"
                "ferry_test_stage_seconds_bucket{stage=\"decode\","
                "le=\"0.1\"} 3\n"
                "ferry_test_stage_seconds_bucket{stage=\"decode\","
                "le=\"+Inf\"} 4\n"
                "ferry_test_stage_seconds_sum{stage=\"decode\"} 2.0515\n"
                "ferry_test_stage_seconds_count{stage=\"decode\"} 4\n");
  ferry__free(s);
  ferry__metrics_free(r);
}

Test(metrics, invalid_definitions_are_refused) {
  ferry_metrics_t *r = ferry__metrics_new();
  static const double down[] = {1, 0.5};
  cr_assert_null(ferry__metrics_family(r, FERRY_METRIC_COUNTER, "1bad", "",
                                       NULL, 1, NULL, 0));
  cr_assert_null(ferry__metrics_family(r, FERRY_METRIC_COUNTER, "ok_total", "",
                                       "__reserved", 1, NULL, 0));
  cr_assert_null(ferry__metrics_family(r, FERRY_METRIC_HISTOGRAM, "h", "", NULL,
                                       1, down, 2));
  cr_assert_null(ferry__metrics_family(r, FERRY_METRIC_HISTOGRAM, "h2", "",
                                       "le", 1, NULL, 0));
  /* Same name, same type: the same family; another type: refused. */
  ferry_metric_family_t *a = ferry__metrics_family(
      r, FERRY_METRIC_GAUGE, "ferry_x", "", NULL, 1, NULL, 0);
  cr_assert_not_null(a);
  cr_assert_eq(ferry__metrics_family(r, FERRY_METRIC_GAUGE, "ferry_x", "", NULL,
                                     1, NULL, 0),
               a);
  cr_assert_null(ferry__metrics_family(r, FERRY_METRIC_COUNTER, "ferry_x", "",
                                       NULL, 1, NULL, 0));
  /* NULL children are no-ops. */
  ferry__metric_add(NULL, 1);
  ferry__metric_observe(NULL, 1);
  ferry__metrics_free(r);
}

static void collect(void *arg) {
  ferry_metric_family_t *f = arg;
  ferry__metric_family_clear(f);
  ferry__metric_set(ferry__metric_get1(f, "7"), 3);
}

Test(metrics, collectors_run_before_rendering_and_clear_children) {
  ferry_metrics_t *r = ferry__metrics_new();
  ferry_metric_family_t *f =
      ferry__metrics_family(r, FERRY_METRIC_GAUGE, "ferry_job_workers_wanted",
                            "Workers.", "job", 1, NULL, 0);
  ferry__metric_set(ferry__metric_get1(f, "old"), 1);
  cr_assert_eq(ferry__metrics_add_collector(r, collect, f), 0);
  char *s = render(r);
  cr_assert_null(strstr(s, "old"));
  assert_has(s, "ferry_job_workers_wanted{job=\"7\"} 3\n");
  ferry__free(s);
  ferry__metrics_remove_collector(r, collect, f);
  ferry__metrics_free(r);
}

typedef struct {
  ferry_metric_t *c, *h;
} race_t;

static void *hammer(void *arg) {
  race_t *x = arg;
  for (int i = 0; i < 100000; i++) {
    ferry__metric_add(x->c, 1);
    ferry__metric_observe(x->h, i % 3);
  }
  return NULL;
}

Test(metrics, concurrent_updates_are_not_lost) {
  ferry_metrics_t *r = ferry__metrics_new();
  static const double b[] = {1};
  race_t x = {ferry__metric_get(ferry__metrics_family(
                  r, FERRY_METRIC_COUNTER, "c_total", "", NULL, 1, NULL, 0)),
              ferry__metric_get(ferry__metrics_family(r, FERRY_METRIC_HISTOGRAM,
                                                      "h", "", NULL, 1, b, 1))};
  pthread_t t[4];
  for (int i = 0; i < 4; i++)
    pthread_create(&t[i], NULL, hammer, &x);
  for (int i = 0; i < 4; i++)
    pthread_join(t[i], NULL);
  char *s = render(r);
  assert_has(s, "c_total 400000\n");
  assert_has(s, "h_count 400000\n");
  assert_has(s, "h_bucket{le=\"+Inf\"} 400000\n");
  ferry__free(s);
  ferry__metrics_free(r);
}

Test(metrics, no_leak) {
  ferry_alloc_stats_t a, b;
  ferry__alloc_stats(&a);
  ferry_metrics_t *r = ferry__metrics_new();
  ferry_metric_family_t *f = ferry__metrics_family(
      r, FERRY_METRIC_COUNTER, "x_total", "h", "a,b", 1, NULL, 0);
  const char *v[2] = {"1", "2"};
  ferry__metric_add(ferry__metric_child(f, v), 1);
  ferry__free(render(r));
  ferry__metrics_free(r);
  ferry__alloc_stats(&b);
  cr_assert_eq(a.bytes, b.bytes);
  cr_assert_eq(a.blocks, b.blocks);
}
