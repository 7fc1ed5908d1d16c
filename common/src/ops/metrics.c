/* Metrics registry and the Prometheus text exposition writer
 * (metrics.h). */
#include "metrics.h"

#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "alloc.h"
#include "clocale.h"
#include "ferry/error.h"

#define MAX_COLLECTORS 8

struct ferry_metric_family_s {
  ferry_metric_family_t *next;
  ferry_metrics_t *registry;
  ferry_metric_type_t type;
  char *name, *help;
  char *label_names[FERRY_METRIC_MAX_LABELS];
  size_t n_labels;
  double scale;
  double bounds[FERRY_METRIC_MAX_BUCKETS];   /* exported unit */
  int64_t raw_bounds[FERRY_METRIC_MAX_BUCKETS];
  size_t n_bounds;
  pthread_mutex_t lock; /* children list */
  ferry_metric_t *children, *children_tail;
  size_t n_children;
};

struct ferry_metrics_s {
  pthread_mutex_t lock; /* families and collectors; held while rendering */
  ferry_metric_family_t *families, *families_tail;
  struct {
    ferry_metrics_collect_fn fn;
    void *arg;
  } collectors[MAX_COLLECTORS];
  size_t n_collectors;
};

int64_t ferry__metrics_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

ferry_metrics_t *ferry__metrics_new(void) {
  ferry_metrics_t *r = ferry__calloc(1, sizeof(*r));
  if (r != NULL)
    pthread_mutex_init(&r->lock, NULL);
  return r;
}

static void free_children(ferry_metric_family_t *f) {
  ferry_metric_t *m = f->children;
  while (m != NULL) {
    ferry_metric_t *next = m->next;
    for (size_t i = 0; i < FERRY_METRIC_MAX_LABELS; i++)
      ferry__free(m->labels[i]);
    ferry__free(m);
    m = next;
  }
  f->children = f->children_tail = NULL;
  f->n_children = 0;
}

static void free_family(ferry_metric_family_t *f) {
  free_children(f);
  for (size_t i = 0; i < f->n_labels; i++)
    ferry__free(f->label_names[i]);
  ferry__free(f->name);
  ferry__free(f->help);
  pthread_mutex_destroy(&f->lock);
  ferry__free(f);
}

void ferry__metrics_free(ferry_metrics_t *r) {
  if (r == NULL)
    return;
  ferry_metric_family_t *f = r->families;
  while (f != NULL) {
    ferry_metric_family_t *next = f->next;
    free_family(f);
    f = next;
  }
  pthread_mutex_destroy(&r->lock);
  ferry__free(r);
}

static ferry_metrics_t *default_registry;
static pthread_once_t default_once = PTHREAD_ONCE_INIT;
static void default_init(void) { default_registry = ferry__metrics_new(); }

ferry_metrics_t *ferry__metrics_default(void) {
  pthread_once(&default_once, default_init);
  return default_registry;
}

/* [a-zA-Z_:][a-zA-Z0-9_:]* for metric names; labels without ':' and not
 * starting with "__" (reserved). */
static bool valid_name(const char *s, size_t n, bool label) {
  if (n == 0)
    return false;
  if (label && n >= 2 && s[0] == '_' && s[1] == '_')
    return false;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
              (!label && c == ':') || (i > 0 && c >= '0' && c <= '9');
    if (!ok)
      return false;
  }
  return true;
}

ferry_metric_family_t *
ferry__metrics_family(ferry_metrics_t *r, ferry_metric_type_t type,
                      const char *name, const char *help, const char *labels,
                      double scale, const double *bounds, size_t n_bounds) {
  if (r == NULL || name == NULL || !valid_name(name, strlen(name), false) ||
      n_bounds > FERRY_METRIC_MAX_BUCKETS ||
      (type != FERRY_METRIC_HISTOGRAM && n_bounds > 0))
    return NULL;
  if (scale == 0)
    scale = 1;
  pthread_mutex_lock(&r->lock);
  for (ferry_metric_family_t *f = r->families; f != NULL; f = f->next)
    if (strcmp(f->name, name) == 0) {
      pthread_mutex_unlock(&r->lock);
      return f->type == type ? f : NULL;
    }
  ferry_metric_family_t *f = ferry__calloc(1, sizeof(*f));
  bool ok = f != NULL;
  if (ok) {
    pthread_mutex_init(&f->lock, NULL);
    f->registry = r;
    f->type = type;
    f->scale = scale;
    f->name = ferry__strdup(name);
    f->help = ferry__strdup(help != NULL ? help : "");
    ok = f->name != NULL && f->help != NULL;
  }
  /* Label names. */
  const char *p = labels != NULL ? labels : "";
  while (ok && *p != '\0') {
    const char *e = strchr(p, ',');
    size_t n = e != NULL ? (size_t)(e - p) : strlen(p);
    if (f->n_labels == FERRY_METRIC_MAX_LABELS || !valid_name(p, n, true) ||
        (type == FERRY_METRIC_HISTOGRAM && n == 2 && memcmp(p, "le", 2) == 0))
      ok = false;
    else if ((f->label_names[f->n_labels++] = ferry__strndup(p, n)) == NULL)
      ok = false;
    p += n;
    if (*p == ',')
      p++;
  }
  for (size_t i = 0; ok && i < n_bounds; i++) {
    if (!isfinite(bounds[i]) || (i > 0 && bounds[i] <= bounds[i - 1]))
      ok = false;
    f->bounds[i] = bounds[i];
    f->raw_bounds[i] = (int64_t)floor(bounds[i] / scale + 1e-9);
  }
  if (!ok) {
    if (f != NULL)
      free_family(f);
    pthread_mutex_unlock(&r->lock);
    return NULL;
  }
  f->n_bounds = n_bounds;
  if (r->families_tail != NULL)
    r->families_tail->next = f;
  else
    r->families = f;
  r->families_tail = f;
  pthread_mutex_unlock(&r->lock);
  return f;
}

ferry_metric_t *ferry__metric_child(ferry_metric_family_t *f,
                                    const char *const *values) {
  if (f == NULL)
    return NULL;
  pthread_mutex_lock(&f->lock);
  for (ferry_metric_t *m = f->children; m != NULL; m = m->next) {
    size_t i = 0;
    while (i < f->n_labels && strcmp(m->labels[i], values[i]) == 0)
      i++;
    if (i == f->n_labels) {
      pthread_mutex_unlock(&f->lock);
      return m;
    }
  }
  ferry_metric_t *m = NULL;
  if (f->n_children < FERRY_METRIC_MAX_CHILDREN &&
      (m = ferry__calloc(1, sizeof(*m))) != NULL) {
    m->family = f;
    for (size_t i = 0; i < f->n_labels; i++)
      if ((m->labels[i] = ferry__strdup(values[i] != NULL ? values[i]
                                                          : "")) == NULL) {
        for (size_t j = 0; j < i; j++)
          ferry__free(m->labels[j]);
        ferry__free(m);
        m = NULL;
        break;
      }
  }
  if (m != NULL) {
    if (f->children_tail != NULL)
      f->children_tail->next = m;
    else
      f->children = m;
    f->children_tail = m;
    f->n_children++;
  }
  pthread_mutex_unlock(&f->lock);
  return m;
}

ferry_metric_t *ferry__metric_get(ferry_metric_family_t *f) {
  static const char *const none[1] = {""};
  return ferry__metric_child(f, none);
}

ferry_metric_t *ferry__metric_get1(ferry_metric_family_t *f,
                                   const char *value) {
  const char *v[1] = {value};
  return ferry__metric_child(f, v);
}

void ferry__metric_family_clear(ferry_metric_family_t *f) {
  if (f == NULL)
    return;
  pthread_mutex_lock(&f->lock);
  free_children(f);
  pthread_mutex_unlock(&f->lock);
}

void ferry__metric_set_double(ferry_metric_t *m, double v) {
  if (m == NULL)
    return;
  double raw = v / m->family->scale;
  if (!(raw == raw))
    raw = 0; /* NaN */
  if (raw > 9.2e18)
    raw = 9.2e18;
  if (raw < -9.2e18)
    raw = -9.2e18;
  ferry__metric_set(m, (int64_t)llround(raw));
}

void ferry__metric_observe(ferry_metric_t *m, int64_t raw) {
  if (m == NULL)
    return;
  const ferry_metric_family_t *f = m->family;
  size_t i = 0;
  while (i < f->n_bounds && raw > f->raw_bounds[i])
    i++;
  atomic_fetch_add_explicit(&m->buckets[i], 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&m->value, raw, memory_order_relaxed);
}

int ferry__metrics_add_collector(ferry_metrics_t *r,
                                 ferry_metrics_collect_fn fn, void *arg) {
  if (r == NULL)
    return FERRY_ENOMEM;
  int rc = 0;
  pthread_mutex_lock(&r->lock);
  if (r->n_collectors == MAX_COLLECTORS) {
    rc = FERRY_ERANGE;
  } else {
    r->collectors[r->n_collectors].fn = fn;
    r->collectors[r->n_collectors++].arg = arg;
  }
  pthread_mutex_unlock(&r->lock);
  return rc;
}

void ferry__metrics_remove_collector(ferry_metrics_t *r,
                                     ferry_metrics_collect_fn fn, void *arg) {
  if (r == NULL)
    return;
  pthread_mutex_lock(&r->lock);
  for (size_t i = 0; i < r->n_collectors; i++)
    if (r->collectors[i].fn == fn && r->collectors[i].arg == arg) {
      memmove(&r->collectors[i], &r->collectors[i + 1],
              (r->n_collectors - i - 1) * sizeof(r->collectors[0]));
      r->n_collectors--;
      break;
    }
  pthread_mutex_unlock(&r->lock);
}

/* ---- Writer ------------------------------------------------------------- */

typedef struct {
  char *p;
  size_t len, cap;
  bool oom;
} buf_t;

static void put(buf_t *b, const char *s, size_t n) {
  if (b->oom)
    return;
  if (n > SIZE_MAX - 1 - b->len ||
      !FERRY__GROW(b->p, b->cap, b->len + n + 1, 4096)) {
    b->oom = true;
    return;
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = '\0';
}

static void puts_(buf_t *b, const char *s) { put(b, s, strlen(s)); }

static void printf_(buf_t *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void printf_(buf_t *b, const char *fmt, ...) {
  char tmp[128];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
  va_end(ap);
  if (n > 0)
    put(b, tmp, (size_t)n < sizeof(tmp) ? (size_t)n : sizeof(tmp) - 1);
}

/* HELP escapes \ and newline; label values also ". */
static void escaped(buf_t *b, const char *s, bool quote) {
  for (; *s != '\0'; s++) {
    if (*s == '\\')
      puts_(b, "\\\\");
    else if (*s == '\n')
      puts_(b, "\\n");
    else if (quote && *s == '"')
      puts_(b, "\\\"");
    else
      put(b, s, 1);
  }
}

/* A float in Go's strconv 'g' style that Prometheus parses: integers
 * without exponent up to 2^53, otherwise %.17g trimmed to the shortest
 * form that reads back the same. */
static void number(buf_t *b, double v) {
  if (isnan(v)) {
    puts_(b, "NaN");
    return;
  }
  if (isinf(v)) {
    puts_(b, v > 0 ? "+Inf" : "-Inf");
    return;
  }
  char tmp[40];
  for (int prec = 1; prec <= 17; prec++) {
    snprintf(tmp, sizeof(tmp), "%.*g", prec, v);
    if (strtod(tmp, NULL) == v)
      break;
  }
  puts_(b, tmp);
}

/* raw * scale, as raw / (1 / scale) when that is a whole number (1e-9:
 * 2051500000 gives 2.0515, not 2.0515000000000003). */
static double scaled(const ferry_metric_family_t *f, int64_t raw) {
  double inv = 1 / f->scale, r = nearbyint(inv);
  return fabs(inv - r) < 1e-6 * r ? (double)raw / r : (double)raw * f->scale;
}

static void value(buf_t *b, const ferry_metric_family_t *f, int64_t raw) {
  if (f->scale == 1)
    printf_(b, "%" PRId64, raw);
  else
    number(b, scaled(f, raw));
}

/* name{l1="v1",...[,le="B"]} */
static void series(buf_t *b, const ferry_metric_family_t *f,
                   const ferry_metric_t *m, const char *suffix,
                   const char *le) {
  puts_(b, f->name);
  puts_(b, suffix);
  if (f->n_labels == 0 && le == NULL)
    return;
  put(b, "{", 1);
  for (size_t i = 0; i < f->n_labels; i++) {
    if (i > 0)
      put(b, ",", 1);
    puts_(b, f->label_names[i]);
    puts_(b, "=\"");
    escaped(b, m->labels[i], true);
    put(b, "\"", 1);
  }
  if (le != NULL) {
    if (f->n_labels > 0)
      put(b, ",", 1);
    puts_(b, "le=\"");
    puts_(b, le);
    put(b, "\"", 1);
  }
  put(b, "}", 1);
}

static void render_family(buf_t *b, ferry_metric_family_t *f) {
  static const char *const types[] = {"counter", "gauge", "histogram"};
  puts_(b, "# HELP ");
  puts_(b, f->name);
  put(b, " ", 1);
  escaped(b, f->help, false);
  put(b, "\n", 1);
  printf_(b, "# TYPE %s %s\n", f->name, types[f->type]);
  pthread_mutex_lock(&f->lock);
  for (ferry_metric_t *m = f->children; m != NULL; m = m->next) {
    if (f->type != FERRY_METRIC_HISTOGRAM) {
      series(b, f, m, "", NULL);
      put(b, " ", 1);
      value(b, f, ferry__metric_raw(m));
      put(b, "\n", 1);
      continue;
    }
    /* Buckets first, then the sum: an observation that lands in between
     * shows in _sum but not in _count, never a count above +Inf. */
    uint64_t cum = 0;
    for (size_t i = 0; i <= f->n_bounds; i++) {
      char le[40];
      cum += atomic_load_explicit(&m->buckets[i], memory_order_relaxed);
      if (i < f->n_bounds) {
        buf_t t = {0};
        number(&t, f->bounds[i]);
        snprintf(le, sizeof(le), "%s", t.p != NULL ? t.p : "0");
        ferry__free(t.p);
      } else {
        snprintf(le, sizeof(le), "+Inf");
      }
      series(b, f, m, "_bucket", le);
      printf_(b, " %" PRIu64 "\n", cum);
    }
    series(b, f, m, "_sum", NULL);
    put(b, " ", 1);
    value(b, f, ferry__metric_raw(m));
    put(b, "\n", 1);
    series(b, f, m, "_count", NULL);
    printf_(b, " %" PRIu64 "\n", cum);
  }
  pthread_mutex_unlock(&f->lock);
}

char *ferry__metrics_render(ferry_metrics_t *r, size_t *len) {
  buf_t b = {0};
  if (r == NULL)
    return NULL;
  /* %g and strtod in "C": a decimal comma is not Prometheus' format. */
  locale_t old = ferry__c_locale_enter();
  pthread_mutex_lock(&r->lock);
  for (size_t i = 0; i < r->n_collectors; i++)
    r->collectors[i].fn(r->collectors[i].arg);
  for (ferry_metric_family_t *f = r->families; f != NULL; f = f->next)
    render_family(&b, f);
  pthread_mutex_unlock(&r->lock);
  ferry__c_locale_leave(old);
  put(&b, "", 0);
  if (b.oom || b.p == NULL) {
    ferry__free(b.p);
    if (!b.oom && (b.p = ferry__strdup("")) != NULL) {
      if (len != NULL)
        *len = 0;
      return b.p;
    }
    return NULL;
  }
  if (len != NULL)
    *len = b.len;
  return b.p;
}
