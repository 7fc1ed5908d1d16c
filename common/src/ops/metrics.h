/* Metrics: a small registry of counters, gauges and histograms and the one
 * writer of the Prometheus text exposition format (version 0.0.4). The
 * daemons define their families once at start-up; the HTTP server
 * (metrics_http.c) renders the registry on every scrape.
 *
 * Values are integers in a family's raw unit: a family's `scale` turns
 * them into the exported base unit (a seconds family stores nanoseconds
 * with scale 1e-9, a fraction stores millionths with scale 1e-6). So every
 * update is one relaxed atomic add or store: no lock, no allocation.
 *
 * A family with labels has one child per label-value tuple. Looking a
 * child up takes the family's mutex (and may allocate): do it once and
 * keep the pointer on hot paths. Every update function accepts NULL (a
 * child that could not be created), so callers need not check.
 *
 * Naming (docs/OPERATIONS.md, "Metrics"): ferry_ prefix, base units,
 * counters end in _total, durations in _seconds, sizes in _bytes. */
#ifndef FERRY_METRICS_H
#define FERRY_METRICS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
  FERRY_METRIC_COUNTER,
  FERRY_METRIC_GAUGE,
  FERRY_METRIC_HISTOGRAM
} ferry_metric_type_t;

#define FERRY_METRIC_MAX_LABELS 4
#define FERRY_METRIC_MAX_BUCKETS 24
/* Children per family; lookups beyond it give NULL (a bound on label
 * cardinality: job ids, methods and codes come from the outside). */
#define FERRY_METRIC_MAX_CHILDREN 4096

typedef struct ferry_metrics_s ferry_metrics_t;
typedef struct ferry_metric_family_s ferry_metric_family_t;

/* One time series (or, for a histogram, one set of buckets). */
typedef struct ferry_metric_s {
  struct ferry_metric_s *next;
  ferry_metric_family_t *family;
  char *labels[FERRY_METRIC_MAX_LABELS]; /* values, owned */
  atomic_int_least64_t value;            /* counter, gauge; histogram sum */
  atomic_uint_least64_t buckets[FERRY_METRIC_MAX_BUCKETS + 1]; /* +Inf last;
                                            not cumulative */
} ferry_metric_t;

/* A registry. Thread-safe. */
ferry_metrics_t *ferry__metrics_new(void);
/* Frees the registry, its families and their children. */
void ferry__metrics_free(ferry_metrics_t *r);

/* The process's registry (created on first use, never freed: the daemons'
 * code paths reach it without plumbing). NULL when out of memory. */
ferry_metrics_t *ferry__metrics_default(void);

/* Defines a family. `labels`: comma-separated label names ("stage",
 * "method,code"; NULL or "": none). `scale`: exported value = raw *
 * scale (0 means 1). `bounds`: a histogram's upper bounds in the exported
 * unit, ascending, at most FERRY_METRIC_MAX_BUCKETS (+Inf is implicit).
 * Defining the same name twice returns the first family. NULL when out of
 * memory or when the arguments are invalid (a bad name, too many labels
 * or buckets, bounds not ascending). */
ferry_metric_family_t *
ferry__metrics_family(ferry_metrics_t *r, ferry_metric_type_t type,
                      const char *name, const char *help, const char *labels,
                      double scale, const double *bounds, size_t n_bounds);

/* The child for these label values (as many as the family has names;
 * NULL or ignored for a family without labels), created on first use.
 * NULL when out of memory or past FERRY_METRIC_MAX_CHILDREN. */
ferry_metric_t *ferry__metric_child(ferry_metric_family_t *f,
                                    const char *const *values);
/* Shortcuts: no labels, one label. */
ferry_metric_t *ferry__metric_get(ferry_metric_family_t *f);
ferry_metric_t *ferry__metric_get1(ferry_metric_family_t *f, const char *value);

/* Drops every child of the family. Only for families that a scrape-time
 * collector fills alone (per-job gauges), since it frees the children:
 * nobody else may hold their pointers. */
void ferry__metric_family_clear(ferry_metric_family_t *f);

/* Counter or gauge: raw += n. Histogram: not allowed (use observe). */
static inline void ferry__metric_add(ferry_metric_t *m, int64_t n) {
  if (m != NULL)
    atomic_fetch_add_explicit(&m->value, n, memory_order_relaxed);
}
/* Gauge: raw = v. */
static inline void ferry__metric_set(ferry_metric_t *m, int64_t v) {
  if (m != NULL)
    atomic_store_explicit(&m->value, v, memory_order_relaxed);
}
/* Gauge from a value in the exported unit (rounded to the raw unit). */
void ferry__metric_set_double(ferry_metric_t *m, double v);
/* Histogram: one observation of `raw` (in the raw unit). */
void ferry__metric_observe(ferry_metric_t *m, int64_t raw);

/* Reads a counter or gauge in the raw unit (tests, collectors). */
static inline int64_t ferry__metric_raw(const ferry_metric_t *m) {
  return m == NULL ? 0 : atomic_load_explicit(&m->value, memory_order_relaxed);
}

/* Called at the start of every render, before anything is written (the
 * daemons compute their scrape-time gauges here). At most 8 per
 * registry. Returns 0 or FERRY_ENOMEM/FERRY_ERANGE. */
typedef void (*ferry_metrics_collect_fn)(void *arg);
int ferry__metrics_add_collector(ferry_metrics_t *r,
                                 ferry_metrics_collect_fn fn, void *arg);
void ferry__metrics_remove_collector(ferry_metrics_t *r,
                                     ferry_metrics_collect_fn fn, void *arg);

/* Runs the collectors and renders every family in the text exposition
 * format: "# HELP", "# TYPE", then one line per child (histograms:
 * name_bucket{...,le="B"} cumulative, le="+Inf", name_sum, name_count).
 * Label values are escaped (\\, \", \n), HELP text too (\\, \n).
 * Returns a NUL-terminated ferry__malloc'ed string (length in *len), or
 * NULL when out of memory. */
char *ferry__metrics_render(ferry_metrics_t *r, size_t *len);

/* Turns ferry_rpc_handled_total{method,code} on for every RPC server of
 * the process (rpc_server.c; off by default, so that programs and tests
 * without metrics allocate nothing for it). */
void ferry__metrics_count_rpcs(bool on);

/* CLOCK_MONOTONIC in nanoseconds (for _seconds metrics with scale 1e-9). */
int64_t ferry__metrics_now_ns(void);

/* ---- HTTP server (metrics_http.c, libmicrohttpd) -------------------------
 * Serves GET/HEAD /metrics (the registry), /healthz (200 while the process
 * runs), /readyz (200 once ferry__metrics_http_set_ready(true), else 503);
 * 404 for other paths, 405 for other methods. Its own thread
 * (MHD_USE_INTERNAL_POLLING_THREAD). */
typedef struct ferry_metrics_http_s ferry_metrics_http_t;

#include "ferry/error.h"

/* Binds host:port (port 0: any free port; host: an IPv4 or IPv6 literal
 * or a name resolved with getaddrinfo) and starts serving `r`. The bound
 * port in *bound_port. Returns 0 or FERRY_EIO/FERRY_EINVAL/FERRY_ENOMEM
 * with `err` naming the address. */
int ferry__metrics_http_start(ferry_metrics_t *r, const char *host, int port,
                              ferry_metrics_http_t **out, int *bound_port,
                              ferry_error_t *err);
void ferry__metrics_http_set_ready(ferry_metrics_http_t *h, bool ready);
/* Or asks `fn(arg)` on every /readyz (the HTTP thread; it must be
 * thread-safe): ready when either says so. */
void ferry__metrics_http_set_ready_fn(ferry_metrics_http_t *h,
                                      bool (*fn)(void *arg), void *arg);
/* Stops the server (waits for the request in progress) and frees it.
 * NULL is fine. */
void ferry__metrics_http_stop(ferry_metrics_http_t *h);

#endif /* FERRY_METRICS_H */
