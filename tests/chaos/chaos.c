/* Chaos on a schedule.
 *
 *   ferry_chaos [--schedules N] [--seed S] [--epochs E] [--keep-going]
 *
 * Each schedule is drawn from one seed (S, S+1, ...; without --seed, one
 * from the clock, printed): a cluster of a dispatcher and 3 workers
 * (tests/integration/harness.c) and 2 trainer processes (it_client) run a
 * distributed_epoch job of several epochs, either one named job the two
 * share, or one private job each, or a named job of two ranks
 * in deterministic order (world_size 2, the default padding), while the
 * schedule, printed before it runs, applies at random times:
 *
 *   - kill -9 of a worker, restarted after a while (a fresh process);
 *   - SIGSTOP of a worker, SIGCONT after a while (past the worker timeout
 *     or not);
 *   - kill -9 of the dispatcher, restarted on the same port and work
 *     directory (its journal) after a while;
 *   - kill -9 of a client, replaced after a while by a new process (in
 *     the named job: joining it again; private: a new private job);
 *   - SIGSTOP of a client, SIGCONT after a while (past the client timeout
 *     or not).
 *
 * What is checked, per job and per epoch, over every record id the
 * trainers of the job took (it_client logs each batch with one write):
 * the guarantee of docs/ARCHITECTURE.md, "Exactly once":
 *
 *   - no id outside the dataset;
 *   - in a job some client finished (FERRY_END), every id of every epoch
 *     at least once;
 *   - a second copy of an id only from the documented exception: a copy
 *     in the unacknowledged tail of a killed or stopped client at its
 *     fault (hx_in_unacked_tail), at most one extra copy per such tail;
 *   - a private job whose only client was killed cannot finish: the
 *     epochs its client completed hold every id exactly once, and the
 *     dispatcher garbage-collects the job (--job-gc-ms) within a bound.
 *
 * In a deterministic job, the order: every client process of rank k
 * hands out, in each epoch, a run of consecutive records of the rank's
 * share of the epoch's order (the files' order: no shuffle; rank k's
 * share is records [k x N / 2, (k + 1) x N / 2)) starting at a batch
 * boundary of the share: what a fault-free run gives, batch for batch
 * (a killed rank's heir starts again at its acknowledged batch).
 *
 * And every job ends: every client process that was not killed exits 0
 * (FERRY_END) within a bound; a named job keeps one job id across its
 * clients (a re-created job would start over).
 *
 * Every wait is bounded. After each schedule every process it started is
 * killed and reaped (hx_reap_all) and checked gone; tests/chaos/run.sh
 * also sweeps the pids the harness noted, so a driver killed by its
 * timeout leaves nothing behind. Exit 0 when every schedule passed, 1
 * otherwise (each failure names its seed: --seed S --schedules 1 replays
 * it; FERRY_IT_KEEP=1 keeps its logs). */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#define WORKERS 3
#define CLIENTS 2
#define FILES 12
#define PER_FILE 300
#define RECORDS_PER_SPLIT "100"
#define BATCH 32
#define STEP_US 8000
#define WORKER_TIMEOUT_MS 1500
#define CLIENT_TIMEOUT_MS 1500
#define JOB_GC_MS 3000
/* A client hands out nothing past its lease, 3/4 of the client timeout
 * after the send of its last answered heartbeat, which precedes its
 * first unacknowledged record: no duplicate may come from a batch taken
 * longer than that after it (slack: the log's clock reads). */
#define LEASE_MS (CLIENT_TIMEOUT_MS * 3 / 4)
#define LEASE_SLACK_MS 150
/* Faults start within this window after the clients start. */
#define WINDOW_MS 2500
/* A schedule's clients must all end this long after the last fault. */
#define END_WAIT_MS 60000
#define MAX_EVENTS 6
#define MAX_CPROCS 16
#define MAX_FAULTS 16

static int g_epochs = 3; /* --epochs */

typedef enum {
  EV_WORKER_KILL,
  EV_WORKER_STOP,
  EV_DISPATCHER_KILL,
  EV_CLIENT_KILL,
  EV_CLIENT_STOP,
  EV_KINDS
} ev_kind_t;

static const char *const ev_name[] = {"kill -9 worker", "SIGSTOP worker",
                                      "kill -9 dispatcher", "kill -9 client",
                                      "SIGSTOP client"};

/* A fault: at `at_ms` after the clients started, on `target`, undone
 * (restart, replacement, SIGCONT) `dur_ms` later. */
typedef struct event_s {
  ev_kind_t kind;
  int target;
  int at_ms, dur_ms;
} event_t;

typedef struct schedule_s {
  unsigned seed;
  bool named;
  bool det; /* named, two ranks, deterministic order */
  int nevents;
  event_t ev[MAX_EVENTS];
} schedule_t;

/* A fault a client process suffered, for the tail check: killed or
 * stopped by the schedule, or cut off by a dispatcher outage (fault_ms:
 * the latest it may be declared lost after the restart). */
typedef struct cfault_s {
  double fault_ms, resume_ms; /* resume_ms 0: killed (or never resumed) */
} cfault_t;

/* A trainer process. */
typedef struct cproc_s {
  hx_proc_t *p;
  pid_t pid;
  int slot, job; /* its client slot and job (index into the schedule's) */
  unsigned long long job_id, client_id;
  char out[600];
  bool killed, stopped, exited;
  int status;
  int nfaults;
  cfault_t faults[MAX_FAULTS];
} cproc_t;

/* One schedule's run. */
typedef struct run_s {
  const schedule_t *s;
  hx_daemon_opts_t dopts;
  const char *dextra[8];
  hx_proc_t *d;
  bool d_up;
  int port;
  char workdir[600];
  char dlogs[8][512]; /* the log of every dispatcher process */
  int ndlogs;
  hx_proc_t *w[WORKERS];
  bool w_stopped[WORKERS];
  cproc_t c[MAX_CPROCS];
  int nc;
  int slot_proc[CLIENTS]; /* the slot's current process */
  /* A replacement due while the dispatcher was down: started when it is
   * back (a client cannot start without it: connect_timeout_ms). */
  bool pending[CLIENTS];
  int njobs;
  hx_dataset_t ds;
  char spec[1024];
  double t0;
  pid_t pids[64]; /* every process started, checked gone at the end */
  int npids;
  char why[2048];
  /* Figures for the summary line. */
  size_t records, extra;
} run_t;

static unsigned next(unsigned *seed) { return (unsigned)rand_r(seed); }

static int between(unsigned *seed, int lo, int hi) {
  return lo + (int)(next(seed) % (unsigned)(hi - lo + 1));
}

static void draw(schedule_t *s, unsigned seed) {
  unsigned r = seed;
  memset(s, 0, sizeof(*s));
  s->seed = seed;
  s->named = next(&r) % 2 == 0;
  /* From the seed alone, so that the draws below (and the schedules of
   * earlier seeds) stay as they were. */
  s->det = s->named && (seed * 2654435761u) >> 31 == 1;
  s->nevents = between(&r, 2, MAX_EVENTS);
  for (int i = 0; i < s->nevents; i++) {
    event_t *e = &s->ev[i];
    e->kind = (ev_kind_t)(next(&r) % EV_KINDS);
    e->at_ms = between(&r, 0, WINDOW_MS);
    switch (e->kind) {
    case EV_WORKER_KILL: /* restarted after */
      e->target = between(&r, 0, WORKERS - 1);
      e->dur_ms = between(&r, 0, 2000);
      break;
    case EV_WORKER_STOP: /* past the worker timeout about half the time */
      e->target = between(&r, 0, WORKERS - 1);
      e->dur_ms = between(&r, 100, 2 * WORKER_TIMEOUT_MS);
      break;
    case EV_DISPATCHER_KILL: /* down for */
      e->dur_ms = between(&r, 0, 1500);
      break;
    case EV_CLIENT_KILL: /* replaced after */
      e->target = between(&r, 0, CLIENTS - 1);
      e->dur_ms = between(&r, 0, 500);
      break;
    case EV_CLIENT_STOP:
      /* Past the client timeout about half the time; short of the job's
       * garbage collection (client timeout + --job-gc-ms), after which a
       * private job is gone. */
      e->target = between(&r, 0, CLIENTS - 1);
      e->dur_ms = between(&r, 100, 2 * CLIENT_TIMEOUT_MS);
      break;
    default:
      break;
    }
  }
}

static void print_schedule(const schedule_t *s, FILE *f) {
  fprintf(f, "seed %u: %s job%s, %d faults:", s->seed,
          s->det     ? "one named deterministic"
          : s->named ? "one named"
                     : "a private",
          s->det ? " of 2 ranks" : s->named ? "" : " per client",
          s->nevents);
  for (int i = 0; i < s->nevents; i++) {
    const event_t *e = &s->ev[i];
    const char *undo = e->kind == EV_WORKER_KILL       ? "restart"
                       : e->kind == EV_DISPATCHER_KILL ? "restart"
                       : e->kind == EV_CLIENT_KILL     ? "replace"
                                                       : "SIGCONT";
    if (e->kind == EV_DISPATCHER_KILL)
      fprintf(f, " [%s @%d ms, %s +%d ms]", ev_name[e->kind], e->at_ms, undo,
              e->dur_ms);
    else
      fprintf(f, " [%s %d @%d ms, %s +%d ms]", ev_name[e->kind], e->target,
              e->at_ms, undo, e->dur_ms);
  }
  fputc('\n', f);
}

/* ---- Processes ---------------------------------------------------------- */

static void note(run_t *r, const hx_proc_t *p) {
  if (p != NULL && r->npids < (int)(sizeof(r->pids) / sizeof(r->pids[0])))
    r->pids[r->npids++] = p->pid;
}

static int start_dispatcher(run_t *r) {
  char why[512];
  if (hx_start_dispatcher_at(&r->d, &r->dopts, r->port, r->workdir, why,
                             sizeof(why)) != 0) {
    snprintf(r->why, sizeof(r->why), "dispatcher (re)start: %s", why);
    return -1;
  }
  note(r, r->d);
  r->d_up = true;
  if (r->port == 0) {
    const char *colon = strrchr(r->d->addr, ':');
    r->port = colon != NULL ? atoi(colon + 1) : 0;
  }
  if (r->ndlogs < 8)
    snprintf(r->dlogs[r->ndlogs++], sizeof(r->dlogs[0]), "%s", r->d->log);
  return 0;
}

/* The dispatcher's address: fixed once the first one bound. */
static const char *daddr(const run_t *r) { return r->d->addr; }

static int start_worker(run_t *r, int i) {
  char why[512];
  if (hx_start_worker(&r->w[i], daddr(r), NULL, why, sizeof(why)) != 0) {
    snprintf(r->why, sizeof(r->why), "worker %d (re)start: %s", i, why);
    return -1;
  }
  note(r, r->w[i]);
  r->w_stopped[i] = false;
  return 0;
}

static bool running(const hx_proc_t *p) { return p != NULL && p->pid > 0; }

/* Notes a client process that exited on its own. */
static void poll_client(cproc_t *c) {
  if (c->exited || !running(c->p))
    return;
  int st;
  if (waitpid(c->p->pid, &st, WNOHANG) == c->p->pid) {
    c->p->pid = 0;
    c->exited = true;
    c->status = st;
  }
}

static int start_client(run_t *r, int slot) {
  if (r->nc == MAX_CPROCS) {
    snprintf(r->why, sizeof(r->why), "more than %d client processes",
             MAX_CPROCS);
    return -1;
  }
  cproc_t *c = &r->c[r->nc];
  memset(c, 0, sizeof(*c));
  c->slot = slot;
  c->job = r->s->named ? 0 : r->njobs++;
  char name[32], job[32], epochs[16], step[16], why[512];
  snprintf(name, sizeof(name), "client%d", r->nc);
  snprintf(c->out, sizeof(c->out), "%s/%s.ids", hx_tmpdir(), name);
  snprintf(job, sizeof(job), "%s", r->s->named ? "chaos" : "");
  snprintf(epochs, sizeof(epochs), "%d", g_epochs);
  snprintf(step, sizeof(step), "%d", STEP_US);
  /* FERRY_IT_CLIENT: another it_client (run.sh's soak uses a copy). */
  const char *bin = getenv("FERRY_IT_CLIENT");
  char *argv[] = {(char *)(bin != NULL ? bin : FERRY_IT_CLIENT_BIN),
                  (char *)daddr(r), r->spec, job, epochs, c->out, step, "-1",
                  NULL};
  /* A deterministic job: the client slot is the rank (a replacement
   * takes its slot's rank over). */
  char rank[16], batch[16];
  snprintf(rank, sizeof(rank), "%d", slot);
  snprintf(batch, sizeof(batch), "%d", BATCH);
  if (r->s->det) {
    setenv("FERRY_IT_CLIENT_WORLD", "2", 1);
    setenv("FERRY_IT_CLIENT_RANK", rank, 1);
    setenv("FERRY_IT_CLIENT_BATCH", batch, 1);
    setenv("FERRY_IT_CLIENT_ORDER", "deterministic", 1);
  }
  int spawned = hx_spawn_marked(&c->p, name, argv, "ready: ", 20000, why,
                                sizeof(why));
  unsetenv("FERRY_IT_CLIENT_WORLD");
  unsetenv("FERRY_IT_CLIENT_RANK");
  unsetenv("FERRY_IT_CLIENT_BATCH");
  unsetenv("FERRY_IT_CLIENT_ORDER");
  if (spawned != 0) {
    snprintf(r->why, sizeof(r->why), "client %d start: %s", r->nc, why);
    return -1;
  }
  note(r, c->p);
  c->pid = c->p->pid;
  if (sscanf(c->p->addr, "job %llu client %llu", &c->job_id,
             &c->client_id) != 2) {
    snprintf(r->why, sizeof(r->why), "client %d: ready line '%s'", r->nc,
             c->p->addr);
    return -1;
  }
  r->slot_proc[slot] = r->nc++;
  return 0;
}

/* ---- The schedule's actions --------------------------------------------- */

/* A fault's start (undo false) or its undoing, at `at_ms`. */
typedef struct action_s {
  int at_ms;
  bool undo;
  const event_t *e;
  pid_t pid; /* the process the start hit (0: none, nothing to undo) */
} action_t;

static int cmp_action(const void *a, const void *b) {
  const action_t *x = a, *y = b;
  if (x->at_ms != y->at_ms)
    return x->at_ms < y->at_ms ? -1 : 1;
  return (int)x->undo - (int)y->undo;
}

static void wait_until(const run_t *r, int at_ms) {
  double left = r->t0 + at_ms - hx_now_ms();
  if (left > 0) { /* the schedule's clock: faults happen at their time */
    struct timespec ts = {(time_t)(left / 1000),
                          (long)((left - (double)(long)(left / 1000) * 1000) *
                                 1e6)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
      ;
  }
}

/* The client process in `slot` when it still runs (NULL otherwise). */
static cproc_t *live_client(run_t *r, int slot) {
  cproc_t *c = &r->c[r->slot_proc[slot]];
  poll_client(c);
  return c->exited || c->killed || !running(c->p) ? NULL : c;
}

/* True once a client of job `job` finished it (exit 0). */
/* Whether a client of the job ended it (FERRY_END): any client of a
 * shared job; in a deterministic job, one of every rank (each rank ends
 * by itself). */
static bool job_finished(run_t *r, int job) {
  bool slot_done[CLIENTS] = {false};
  for (int i = 0; i < r->nc; i++) {
    poll_client(&r->c[i]);
    if (r->c[i].job == job && r->c[i].exited &&
        WIFEXITED(r->c[i].status) && WEXITSTATUS(r->c[i].status) == 0) {
      if (!r->s->det)
        return true;
      slot_done[r->c[i].slot] = true;
    }
  }
  for (int k = 0; r->s->det && k < CLIENTS; k++)
    if (!slot_done[k])
      return false;
  return r->s->det;
}

static int apply(run_t *r, action_t *a, action_t *undo_of) {
  const event_t *e = a->e;
  switch (e->kind) {
  case EV_WORKER_KILL:
    if (!a->undo) {
      hx_proc_t *w = r->w[e->target];
      if (!running(w))
        return 0;
      a->pid = w->pid;
      hx_stop(w, SIGKILL, 5000, NULL);
      hx_forget(w);
      r->w[e->target] = NULL;
      return 0;
    }
    if (undo_of->pid == 0 || running(r->w[e->target]))
      return 0;
    return start_worker(r, e->target);
  case EV_WORKER_STOP:
    if (!a->undo) {
      hx_proc_t *w = r->w[e->target];
      if (!running(w) || r->w_stopped[e->target])
        return 0;
      a->pid = w->pid;
      kill(w->pid, SIGSTOP);
      r->w_stopped[e->target] = true;
      return 0;
    }
    if (undo_of->pid == 0 || !running(r->w[e->target]) ||
        r->w[e->target]->pid != undo_of->pid)
      return 0;
    kill(undo_of->pid, SIGCONT);
    r->w_stopped[e->target] = false;
    return 0;
  case EV_DISPATCHER_KILL:
    if (!a->undo) {
      if (!r->d_up)
        return 0;
      a->pid = r->d->pid;
      hx_stop(r->d, SIGKILL, 5000, NULL);
      r->d_up = false;
      return 0;
    }
    if (undo_of->pid == 0 || r->d_up)
      return 0;
    if (start_dispatcher(r) != 0)
      return -1;
    /* Every trainer was cut off from the dispatcher meanwhile: one whose
     * heartbeats reach the new process later than a client timeout after
     * its start is declared lost, as if partitioned (the documented
     * exception), its unacknowledged tail then given to a new binding. */
    for (int i = 0; i < r->nc; i++) {
      cproc_t *c = &r->c[i];
      poll_client(c);
      if (!c->killed && !c->exited && c->nfaults < MAX_FAULTS)
        c->faults[c->nfaults++] =
            (cfault_t){hx_now_ms() + CLIENT_TIMEOUT_MS + 1000, 0};
    }
    for (int k = 0; k < CLIENTS; k++)
      if (r->pending[k]) {
        r->pending[k] = false;
        if (!(r->s->named && job_finished(r, 0)) && start_client(r, k) != 0)
          return -1;
      }
    return 0;
  case EV_CLIENT_KILL:
    if (!a->undo) {
      cproc_t *c = live_client(r, e->target);
      if (c == NULL)
        return 0;
      a->pid = c->p->pid;
      hx_stop(c->p, SIGKILL, 5000, NULL);
      c->killed = true;
      /* The fault's time: once it is gone (it may log a batch between
       * the signal and its end). */
      if (c->nfaults < MAX_FAULTS)
        c->faults[c->nfaults++] = (cfault_t){hx_now_ms(), 0};
      return 0;
    }
    /* A named job some client finished gets no new client: it would
     * meet a finished job (or, once collected, start a new one). */
    if (undo_of->pid == 0 || (r->s->named && job_finished(r, 0)))
      return 0;
    if (!r->d_up) {
      r->pending[e->target] = true;
      return 0;
    }
    return start_client(r, e->target);
  case EV_CLIENT_STOP:
    if (!a->undo) {
      cproc_t *c = live_client(r, e->target);
      if (c == NULL || c->stopped)
        return 0;
      a->pid = c->p->pid;
      c->stopped = true;
      /* The fault's time: once it is stopped (kill() returns before; seed
       * 12007 logged a batch 0.2 ms after it). */
      hx_stop_process(c->p->pid);
      if (c->nfaults < MAX_FAULTS)
        c->faults[c->nfaults++] = (cfault_t){hx_now_ms(), 0};
      return 0;
    }
    for (int i = 0; i < r->nc; i++) {
      cproc_t *c = &r->c[i];
      if (undo_of->pid == 0 || c->pid != undo_of->pid || !c->stopped)
        continue;
      c->stopped = false;
      if (running(c->p))
        kill(c->p->pid, SIGCONT);
      if (c->nfaults > 0 && !c->killed)
        c->faults[c->nfaults - 1].resume_ms = hx_now_ms();
    }
    return 0;
  default:
    return 0;
  }
}

/* ---- Checks ------------------------------------------------------------- */

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

static bool file_has(const char *path, const char *needle) {
  FILE *f = fopen(path, "r");
  char line[4096];
  bool found = false;
  if (f == NULL)
    return false;
  while (!found && fgets(line, sizeof(line), f) != NULL)
    found = strstr(line, needle) != NULL;
  fclose(f);
  return found;
}

/* Copies of (epoch, id) in the unacknowledged tails of the job's faulted
 * clients: how many extra copies the guarantee allows. */
static size_t tails_holding(const run_t *r, int job,
                            const hx_client_log_t *logs, uint32_t epoch,
                            uint64_t id) {
  size_t n = 0;
  for (int i = 0; i < r->nc; i++) {
    const cproc_t *c = &r->c[i];
    if (c->job != job)
      continue;
    for (int f = 0; f < c->nfaults; f++)
      n += hx_in_unacked_tail(&logs[i], epoch, id, LEASE_MS + LEASE_SLACK_MS,
                              c->faults[f].fault_ms, c->faults[f].resume_ms);
  }
  return n;
}

/* Where each copy of (epoch, id) came from, for a failure's report. */
static void describe_copies(const run_t *r, int job,
                            const hx_client_log_t *logs, uint32_t epoch,
                            uint64_t id) {
  for (int i = 0; i < r->nc; i++) {
    const cproc_t *c = &r->c[i];
    if (c->job != job)
      continue;
    for (size_t k = 0; k < logs[i].n; k++)
      if (logs[i].v[k].epoch == epoch && logs[i].v[k].id == id)
        fprintf(stderr, "  copy: client process %d (client %llu), record "
                "%zu of its log, taken at %.0f ms, records_acked %llu then\n",
                i, c->client_id, k, logs[i].v[k].t_ms - r->t0,
                (unsigned long long)logs[i].v[k].acked);
    for (int f = 0; f < c->nfaults; f++)
      fprintf(stderr, "  client process %d: fault at %.0f ms (resumed at "
              "%.0f ms), records_acked %llu then, %zu records taken in all\n",
              i, c->faults[f].fault_ms - r->t0,
              c->faults[f].resume_ms > 0 ? c->faults[f].resume_ms - r->t0
                                         : -1.0,
              (unsigned long long)hx_acked_at(&logs[i], c->faults[f].fault_ms),
              logs[i].n);
  }
}

static void fmt_id(char *out, size_t cap, uint64_t id) {
  snprintf(out, cap, "file %llu record %llu", (unsigned long long)(id >> 40),
           (unsigned long long)(id & ((1ull << 40) - 1)));
}

/* Checks one job's epochs; 0 or -1 with r->why. */
static int check_job(run_t *r, int job, hx_client_log_t *logs) {
  size_t n_expected;
  uint64_t *expected = hx_expected_ids(&r->ds, false, &n_expected);
  bool finished = job_finished(r, job);
  uint32_t last = 0; /* the last epoch any client of the job reached */
  size_t cap = 1;
  for (int i = 0; i < r->nc; i++)
    if (r->c[i].job == job) {
      cap += logs[i].n;
      for (size_t k = 0; k < logs[i].n; k++)
        last = logs[i].v[k].epoch > last ? logs[i].v[k].epoch : last;
    }
  uint64_t *ids = malloc(cap * sizeof(uint64_t));
  int rc = 0;
  char a[64];
  for (uint32_t e = 0; e < (uint32_t)g_epochs && rc == 0; e++) {
    /* An abandoned job is complete only in the epochs before its last. */
    bool complete = finished || e < last;
    size_t n = 0;
    for (int i = 0; i < r->nc; i++)
      for (size_t k = 0; r->c[i].job == job && k < logs[i].n; k++)
        if (logs[i].v[k].epoch == e)
          ids[n++] = logs[i].v[k].id;
    qsort(ids, n, sizeof(uint64_t), cmp_u64);
    r->records += n;
    size_t x = 0;
    for (size_t i = 0; i < n && rc == 0;) {
      size_t copies = 1;
      while (i + copies < n && ids[i + copies] == ids[i])
        copies++;
      while (x < n_expected && expected[x] < ids[i]) {
        if (complete) {
          fmt_id(a, sizeof(a), expected[x]);
          snprintf(r->why, sizeof(r->why), "job %d epoch %u: %s missing", job,
                   e, a);
          rc = -1;
        }
        x++;
      }
      if (rc != 0)
        break;
      fmt_id(a, sizeof(a), ids[i]);
      if (x == n_expected || expected[x] != ids[i]) {
        snprintf(r->why, sizeof(r->why), "job %d epoch %u: %s is not in the "
                 "dataset", job, e, a);
        rc = -1;
        break;
      }
      size_t allowed = tails_holding(r, job, logs, e, ids[i]);
      if (copies - 1 > allowed) {
        describe_copies(r, job, logs, e, ids[i]);
        snprintf(r->why, sizeof(r->why), "job %d epoch %u: %s delivered %zu "
                 "times; %zu copies lie in a faulted client's unacknowledged "
                 "tail", job, e, a, copies, allowed);
        rc = -1;
        break;
      }
      r->extra += copies - 1;
      x++;
      i += copies;
    }
    if (rc == 0 && complete && x < n_expected) {
      fmt_id(a, sizeof(a), expected[x]);
      snprintf(r->why, sizeof(r->why), "job %d epoch %u: %s missing (%zu of "
               "%zu ids)", job, e, a, n, n_expected);
      rc = -1;
    }
  }
  free(ids);
  free(expected);
  return rc;
}

/* In a deterministic job, each client process hands out, per
 * epoch, consecutive records of its rank's share from a batch boundary.
 * 0 or -1 with r->why. */
static int check_order(run_t *r, hx_client_log_t *logs) {
  size_t n_expected;
  uint64_t *order = hx_expected_ids(&r->ds, false, &n_expected);
  int rc = 0;
  for (int i = 0; i < r->nc && rc == 0; i++) {
    const hx_client_log_t *l = &logs[i];
    int k = r->c[i].slot;
    size_t lo = n_expected * (size_t)k / CLIENTS;
    size_t hi = n_expected * (size_t)(k + 1) / CLIENTS;
    for (size_t x = 0; x < l->n && rc == 0;) {
      uint32_t e = l->v[x].epoch;
      size_t p = lo;
      while (p < hi && order[p] != l->v[x].id)
        p++;
      char a[64];
      fmt_id(a, sizeof(a), l->v[x].id);
      if (p == hi || (p - lo) % BATCH != 0) {
        snprintf(r->why, sizeof(r->why), "deterministic job: client %d "
                 "(rank %d) epoch %u starts at %s, %s", i, k, e, a,
                 p == hi ? "outside its rank's share"
                         : "not at a batch boundary of its share");
        rc = -1;
        break;
      }
      for (; x < l->n && l->v[x].epoch == e; x++, p++)
        if (p == hi || order[p] != l->v[x].id) {
          fmt_id(a, sizeof(a), l->v[x].id);
          snprintf(r->why, sizeof(r->why), "deterministic job: client %d "
                   "(rank %d) epoch %u: %s at position %zu of its share, "
                   "out of order", i, k, e, a, p - lo);
          rc = -1;
          break;
        }
    }
  }
  free(order);
  return rc;
}

/* Waits (bounded) until a dispatcher log says the job was collected. */
static bool wait_collected(const run_t *r, unsigned long long job_id,
                           int wait_ms) {
  char needle[64];
  snprintf(needle, sizeof(needle), "job %llu garbage-collected", job_id);
  double end = hx_now_ms() + wait_ms;
  do {
    for (int i = 0; i < r->ndlogs; i++)
      if (file_has(r->dlogs[i], needle))
        return true;
    usleep(50000); /* polling a log file: bounded by wait_ms */
  } while (hx_now_ms() < end);
  return false;
}

/* Waits for every client still running; 0 or -1 with r->why. */
static int wait_clients(run_t *r) {
  double end = hx_now_ms() + END_WAIT_MS;
  for (int i = 0; i < r->nc; i++) {
    cproc_t *c = &r->c[i];
    poll_client(c);
    if (c->killed || c->exited)
      continue;
    int left = (int)(end - hx_now_ms());
    int st = hx_stop(c->p, 0, left > 0 ? left : 0, NULL);
    if (st == -1) {
      int js;
      char *json = hx_ferryctl_status_json(daddr(r), &js);
      fprintf(stderr, "status when client %d hung: %s\n", i,
              json != NULL ? json : "(ferryctl failed)");
      free(json);
      snprintf(r->why, sizeof(r->why), "client %d (job %llu) did not end "
               "within %d s of the last fault: killed", i, c->job_id,
               END_WAIT_MS / 1000);
      return -1;
    }
    c->exited = true;
    c->status = st;
  }
  for (int i = 0; i < r->nc; i++) {
    cproc_t *c = &r->c[i];
    if (c->killed)
      continue;
    if (!WIFEXITED(c->status) || WEXITSTATUS(c->status) != 0) {
      snprintf(r->why, sizeof(r->why), "client %d (job %llu, %d faults) "
               "did not finish its job: status %#x (its log: %s)", i,
               c->job_id, c->nfaults, c->status, c->p->log);
      return -1;
    }
  }
  return 0;
}

static int check(run_t *r) {
  if (wait_clients(r) != 0)
    return -1;
  /* A named job is one job: a client that met another id re-created it. */
  for (int i = 1; r->s->named && i < r->nc; i++)
    if (r->c[i].job_id != r->c[0].job_id) {
      snprintf(r->why, sizeof(r->why), "named job: client %d joined job "
               "%llu, client 0 job %llu", i, r->c[i].job_id,
               r->c[0].job_id);
      return -1;
    }
  hx_client_log_t logs[MAX_CPROCS];
  memset(logs, 0, sizeof(logs));
  int rc = 0;
  for (int i = 0; i < r->nc && rc == 0; i++) {
    char why[700];
    if (hx_read_client_log(r->c[i].out, r->c[i].killed, &logs[i], why,
                           sizeof(why)) != 0) {
      snprintf(r->why, sizeof(r->why), "%s", why);
      rc = -1;
    }
  }
  int njobs = r->s->named ? 1 : r->njobs;
  for (int j = 0; j < njobs && rc == 0; j++)
    rc = check_job(r, j, logs);
  if (rc == 0 && r->s->det)
    rc = check_order(r, logs);
  /* Jobs nobody finished (private, client killed): collected. */
  for (int j = 0; j < njobs && rc == 0; j++) {
    if (job_finished(r, j))
      continue;
    unsigned long long id = 0;
    for (int i = 0; i < r->nc; i++)
      if (r->c[i].job == j)
        id = r->c[i].job_id;
    int bound = CLIENT_TIMEOUT_MS + JOB_GC_MS + 5000;
    if (!wait_collected(r, id, bound)) {
      snprintf(r->why, sizeof(r->why), "job %llu lost its only client and "
               "was not garbage-collected within %d ms", id, bound);
      rc = -1;
    }
  }
  for (int i = 0; i < r->nc; i++)
    hx_client_log_free(&logs[i]);
  return rc;
}

/* ---- One schedule ------------------------------------------------------- */

static int run_schedule(const schedule_t *s, bool verbose) {
  static run_t r;
  memset(&r, 0, sizeof(r));
  r.s = s;
  double started = hx_now_ms();
  static char gc[16], rps[16];
  snprintf(gc, sizeof(gc), "%d", JOB_GC_MS);
  snprintf(rps, sizeof(rps), "%s", RECORDS_PER_SPLIT);
  r.dextra[0] = "--job-gc-ms";
  r.dextra[1] = gc;
  r.dextra[2] = "--records-per-split";
  r.dextra[3] = rps;
  r.dextra[4] = NULL;
  r.dopts = (hx_daemon_opts_t){.heartbeat_ms = 100,
                               .worker_timeout_ms = WORKER_TIMEOUT_MS,
                               .client_timeout_ms = CLIENT_TIMEOUT_MS,
                               .extra_argv = r.dextra};
  snprintf(r.workdir, sizeof(r.workdir), "%s/dispatcher", hx_tmpdir());
  print_schedule(s, stdout);
  fflush(stdout);
  int rc = start_dispatcher(&r);
  for (int i = 0; i < WORKERS && rc == 0; i++)
    rc = start_worker(&r, i);
  if (rc == 0 && hx_wait_workers(daddr(&r), WORKERS, 10000) != WORKERS) {
    snprintf(r.why, sizeof(r.why), "%d workers did not register within 10 s",
             WORKERS);
    rc = -1;
  }
  if (rc == 0 && hx_make_dataset(&r.ds, "data", FILES, PER_FILE, 8, 8, 3)) {
    snprintf(r.why, sizeof(r.why), "cannot write the dataset");
    rc = -1;
  }
  if (rc == 0)
    hx_spec(&r.ds, NULL, BATCH, r.spec, sizeof(r.spec));
  r.t0 = hx_now_ms();
  for (int k = 0; k < CLIENTS && rc == 0; k++)
    rc = start_client(&r, k);
  action_t acts[2 * MAX_EVENTS];
  int nacts = 0;
  for (int i = 0; i < s->nevents; i++) {
    acts[nacts++] = (action_t){s->ev[i].at_ms, false, &s->ev[i], 0};
    acts[nacts++] = (action_t){s->ev[i].at_ms + s->ev[i].dur_ms, true,
                               &s->ev[i], 0};
  }
  qsort(acts, (size_t)nacts, sizeof(action_t), cmp_action);
  for (int i = 0; i < nacts && rc == 0; i++) {
    wait_until(&r, acts[i].at_ms);
    action_t *start = NULL;
    for (int k = 0; acts[i].undo && k < nacts; k++)
      if (!acts[k].undo && acts[k].e == acts[i].e)
        start = &acts[k];
    rc = apply(&r, &acts[i], start);
    if (verbose)
      fprintf(stderr, "  %.0f ms: %s %s%s\n", hx_now_ms() - r.t0,
              acts[i].undo ? "undo" : "do", ev_name[acts[i].e->kind],
              !acts[i].undo && acts[i].pid == 0 ? " (no target)" : "");
  }
  if (rc == 0)
    rc = check(&r);
  if (rc != 0) {
    fprintf(stderr, "chaos: seed %u FAILED: %s\n", s->seed, r.why);
    hx_dump_logs();
  }
  hx_dataset_free(&r.ds);
  hx_reap_all();
  /* Nothing this schedule started may be left. */
  for (int i = 0; i < r.npids; i++)
    if (kill(r.pids[i], 0) == 0 || errno != ESRCH) {
      char proc[64], cmd[256] = {0};
      snprintf(proc, sizeof(proc), "/proc/%d/cmdline", (int)r.pids[i]);
      FILE *f = fopen(proc, "r");
      if (f != NULL) {
        size_t k = fread(cmd, 1, sizeof(cmd) - 1, f);
        fclose(f);
        cmd[k] = '\0';
      }
      if (strstr(cmd, "ferry") != NULL || strstr(cmd, "it_client") != NULL) {
        fprintf(stderr, "chaos: seed %u: process %d (%s) left running\n",
                s->seed, (int)r.pids[i], cmd);
        rc = -1;
      }
    }
  printf("seed %u: %s in %.1f s (%zu records taken, %zu extra copies from "
         "faulted clients' unacknowledged tails, %d client processes)\n",
         s->seed, rc == 0 ? "ok" : "FAILED", (hx_now_ms() - started) / 1000,
         r.records, r.extra, r.nc);
  fflush(stdout);
  return rc;
}

static void usage(void) {
  fprintf(stderr, "usage: ferry_chaos [--schedules N] [--seed S] [--epochs "
                  "E] [--keep-going] [--verbose]\n");
}

int main(int argc, char **argv) {
  long schedules = 20, epochs = 3;
  bool have_seed = false, keep_going = false, verbose = false;
  unsigned seed = 0;
  for (int i = 1; i < argc; i++) {
    char *end = NULL;
    if (strcmp(argv[i], "--schedules") == 0 && i + 1 < argc) {
      schedules = strtol(argv[++i], &end, 10);
    } else if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc) {
      seed = (unsigned)strtoul(argv[++i], &end, 0);
      have_seed = true;
    } else if (strcmp(argv[i], "--epochs") == 0 && i + 1 < argc) {
      epochs = strtol(argv[++i], &end, 10);
    } else if (strcmp(argv[i], "--keep-going") == 0) {
      continue;
    } else if (strcmp(argv[i], "--verbose") == 0) {
      verbose = true;
      continue;
    } else {
      usage();
      return 2;
    }
    if (end == NULL || *end != '\0' || schedules < 1 || epochs < 1 ||
        epochs > 100) {
      fprintf(stderr, "ferry_chaos: bad value '%s' for %s\n", argv[i],
              argv[i - 1]);
      return 2;
    }
  }
  for (int i = 1; i < argc; i++)
    keep_going |= strcmp(argv[i], "--keep-going") == 0;
  g_epochs = (int)epochs;
  if (!have_seed) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    seed = (unsigned)(ts.tv_sec ^ (ts.tv_nsec / 1000) ^ getpid());
  }
  /* The harness notes every pid it starts for tests/chaos/run.sh's
   * sweep (a file named after our parent). */
  hx_track_runner_pids = true;
  signal(SIGPIPE, SIG_IGN);
  printf("chaos: %ld schedules from seed %u (--seed %u replays them), %d "
         "epochs, %d workers, %d clients\n", schedules, seed, seed, g_epochs,
         WORKERS, CLIENTS);
  fflush(stdout);
  double t0 = hx_now_ms();
  long passed = 0, failed = 0;
  char failed_seeds[4096] = "";
  for (long i = 0; i < schedules; i++) {
    schedule_t s;
    draw(&s, seed + (unsigned)i);
    if (run_schedule(&s, verbose) == 0) {
      passed++;
    } else {
      failed++;
      size_t len = strlen(failed_seeds);
      snprintf(failed_seeds + len, sizeof(failed_seeds) - len, " %u",
               s.seed);
      if (!keep_going)
        break;
    }
  }
  printf("chaos: %ld schedules run, %ld passed, %ld failed%s%s%s, %.1f s\n",
         passed + failed, passed, failed, failed ? " (seeds:" : "",
         failed ? failed_seeds : "", failed ? ")" : "",
         (hx_now_ms() - t0) / 1000);
  return failed == 0 && passed == schedules ? 0 : 1;
}
