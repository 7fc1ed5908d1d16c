/* The worker's prefix cache (--cache-dir) with real daemons: later epochs
 * are served from it and give exactly the pixels recomputing gives (every
 * record of every epoch compared with a cluster without a cache, random
 * ops after the prefix included); a shard changed after it was cached is
 * not served from the cache; entries cut short or damaged are detected
 * and recomputed; a worker killed mid-epoch while serving from its cache
 * leaves every record delivered once. Counts come from the workers'
 * /metrics. Seeds are printed (FERRY_IT_SEED replays). */
#include <criterion/criterion.h>
#include <criterion/hooks.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "it_cluster.h"

#define NEXT_TIMEOUT_MS 20000
#define FILES 4
#define PER_FILE 300
#define N_RECORDS (FILES * PER_FILE)

static void reset(void) {}

HX_SUITE(cache, 600, reset, NULL);

static size_t slot_of(uint64_t id) {
  size_t f = (size_t)(id >> 40), r = (size_t)(id & ((1ull << 40) - 1));
  cr_assert(f < FILES && r < PER_FILE, "unexpected id %llx",
            (unsigned long long)id);
  return f * PER_FILE + r;
}

/* One epoch: every id once (asserted), each record's digest by id into
 * dig[N_RECORDS]. `kill_at` > 0: after that many batches, `on_batch`
 * runs once. Returns the batches. */
static uint32_t epoch(ferry_client_t *c, uint64_t *dig, const char *what,
                      uint32_t kill_at, void (*on_batch)(void)) {
  static uint8_t seen[N_RECORDS];
  memset(seen, 0, sizeof(seen));
  uint32_t batches = 0;
  for (;;) {
    const ferry_batch_t *b = NULL;
    ferry_error_t err = {0};
    int rc = ferry_next(c, &b, NEXT_TIMEOUT_MS, &err);
    if (rc == FERRY_EPOCH_END || rc == FERRY_END)
      break;
    if (rc != 0)
      hx_dump_logs();
    cr_assert_eq(rc, 0, "%s: ferry_next: %d (%s)", what, rc, err.msg);
    size_t img = (size_t)b->height * b->width * b->channels;
    for (uint32_t i = 0; i < b->size; i++) {
      size_t s = slot_of(b->ids[i]);
      cr_assert_eq(seen[s], 0, "%s: record %llx delivered twice", what,
                   (unsigned long long)b->ids[i]);
      seen[s] = 1;
      dig[s] = it_digest(b->images + i * img, img, b->labels[i]);
    }
    ferry_batch_release(c, b);
    if (++batches == kill_at && on_batch != NULL)
      on_batch();
  }
  for (size_t s = 0; s < N_RECORDS; s++)
    cr_assert_eq(seen[s], 1, "%s: record of file %zu index %zu missing",
                 what, s / PER_FILE, s % PER_FILE);
  return batches;
}

/* The entries (*.fpc) in dir, their paths into paths[] (up to max). */
static int entries(const char *dir, char paths[][1024], int max) {
  DIR *d = opendir(dir);
  int n = 0;
  if (d == NULL)
    return 0;
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    size_t l = strlen(e->d_name);
    if (l > 4 && strcmp(e->d_name + l - 4, ".fpc") == 0) {
      if (n < max)
        snprintf(paths[n], 1024, "%.600s/%.300s", dir, e->d_name);
      n++;
    }
  }
  closedir(d);
  return n;
}

typedef struct {
  hx_proc_t *d;
  hx_proc_t *w[2];
  char metrics[2][64];
  char cache_dir[2][600];
} cluster_t;

/* A dispatcher and n workers (2 threads each), with a cache directory
 * each when `cached`, and metrics. */
static void start(cluster_t *cl, int n, bool cached, const char *tag) {
  memset(cl, 0, sizeof(*cl));
  const char *argv[2][8];
  hx_daemon_opts_t wo = {.threads = 2};
  char why[512];
  cr_assert_eq(hx_start_dispatcher(&cl->d, NULL, why, sizeof(why)), 0, "%s",
               why);
  for (int i = 0; i < n; i++) {
    int a = 0;
    argv[i][a++] = "--metrics-port";
    argv[i][a++] = "0";
    if (cached) {
      snprintf(cl->cache_dir[i], sizeof(cl->cache_dir[i]), "%s/cache-%s-%d",
               hx_tmpdir(), tag, i);
      argv[i][a++] = "--cache-dir";
      argv[i][a++] = cl->cache_dir[i];
    }
    argv[i][a] = NULL;
    wo.extra_argv = argv[i];
    cr_assert_eq(hx_start_worker(&cl->w[i], cl->d->addr, &wo, why,
                                 sizeof(why)),
                 0, "%s", why);
    cr_assert_eq(hx_metrics_address(cl->w[i], 5000, cl->metrics[i],
                                    sizeof(cl->metrics[i])),
                 0, "%s printed no metrics line", cl->w[i]->name);
  }
  cr_assert_eq(hx_wait_workers(cl->d->addr, n, 10000), n);
}

static void stop(cluster_t *cl) {
  for (int i = 0; i < 2; i++)
    if (cl->w[i] != NULL)
      hx_stop(cl->w[i], SIGTERM, 5000, NULL);
  hx_stop(cl->d, SIGTERM, 5000, NULL);
}

static ferry_client_t *client(const cluster_t *cl, const char *spec,
                              int epochs, uint64_t seed) {
  ferry_client_options_t o;
  hx_client_options(&o, cl->d->addr, spec);
  o.num_epochs = epochs;
  o.shuffle = 1;
  o.shuffle_seed = seed;
  return it_new_client(&o);
}

/* `epochs` epochs of spec on a cluster with or without the cache, every
 * record's digest per epoch into dig[e][...]. */
static void run(const char *spec, int epochs, bool cached, uint64_t seed,
                uint64_t (*dig)[N_RECORDS], long long *hits,
                long long *misses) {
  cluster_t cl;
  start(&cl, 1, cached, cached ? "on" : "off");
  ferry_client_t *c = client(&cl, spec, epochs, seed);
  for (int e = 0; e < epochs; e++) {
    char what[64];
    snprintf(what, sizeof(what), "%s, epoch %d", cached ? "cache" : "none",
             e);
    epoch(c, dig[e], what, 0, NULL);
  }
  ferry_client_free(c);
  if (hits != NULL)
    *hits = hx_metric(cl.metrics[0], "ferry_worker_cache_hits_total");
  if (misses != NULL)
    *misses = hx_metric(cl.metrics[0], "ferry_worker_cache_misses_total");
  if (cached) {
    char paths[8][1024];
    int n = entries(cl.cache_dir[0], paths, 8);
    cr_assert_eq(n, FILES, "%d entries in %s, expected one per split (%d)",
                 n, cl.cache_dir[0], FILES);
  }
  stop(&cl);
}

static void same_digests(uint64_t (*a)[N_RECORDS], uint64_t (*b)[N_RECORDS],
                         int epochs, const char *what) {
  for (int e = 0; e < epochs; e++)
    for (size_t s = 0; s < N_RECORDS; s++)
      cr_assert_eq(a[e][s], b[e][s],
                   "%s: epoch %d, file %zu record %zu: the cached run's "
                   "pixels differ from the recomputed run's",
                   what, e, s / PER_FILE, s % PER_FILE);
}

static uint64_t dig_on[3][N_RECORDS], dig_off[3][N_RECORDS];

/* The seed pipeline (all of it deterministic): epochs 2 and 3 come from
 * the cache, bit for bit what recomputing gives. */
Test(cache, later_epochs_are_served_from_the_cache_bit_for_bit) {
  hx_dataset_t ds;
  cr_assert_eq(hx_make_dataset(&ds, "seed", FILES, PER_FILE, 32, 32, 3), 0);
  char spec[1024];
  hx_spec(&ds, "dilate(3) | blur(5, 1.0)", 32, spec, sizeof(spec));
  long long hits, misses;
  run(spec, 3, true, 11, dig_on, &hits, &misses);
  run(spec, 3, false, 11, dig_off, NULL, NULL);
  same_digests(dig_on, dig_off, 3, "dilate | blur");
  fprintf(stderr, "seed pipeline: %lld hits, %lld misses over 3 epochs of "
          "%d records\n", hits, misses, N_RECORDS);
  cr_assert_eq(misses, N_RECORDS, "misses: %lld, expected the first epoch",
               misses);
  cr_assert_eq(hits, 2 * N_RECORDS, "hits: %lld, expected two epochs",
               hits);
  hx_dataset_free(&ds);
}

/* A random op after the prefix: the cached prefix feeds the crop drawn
 * for (seed, epoch, record), the same crop as recomputing. */
Test(cache, random_ops_after_the_prefix_draw_what_recomputing_draws) {
  hx_dataset_t ds;
  cr_assert_eq(hx_make_dataset(&ds, "rrc", FILES, PER_FILE, 32, 32, 3), 0);
  char spec[1024];
  hx_spec(&ds, "blur(5, 1.0) | random_resized_crop(24, 24)", 32, spec,
          sizeof(spec));
  long long hits;
  run(spec, 3, true, 5, dig_on, &hits, NULL);
  run(spec, 3, false, 5, dig_off, NULL, NULL);
  same_digests(dig_on, dig_off, 3, "blur | random_resized_crop");
  cr_assert_eq(hits, 2 * N_RECORDS, "hits: %lld", hits);
  /* And the crops do change from one epoch to the next. */
  size_t differ = 0;
  for (size_t s = 0; s < N_RECORDS; s++)
    differ += dig_on[0][s] != dig_on[1][s];
  cr_assert_gt(differ, N_RECORDS / 2, "only %zu records changed crops",
               differ);
  hx_dataset_free(&ds);
}

/* Copies file `from` of the dataset over file `to` (same size: the same
 * record layout, other labels and pixels), with a new modification
 * time. */
static void overwrite(const hx_dataset_t *ds, int from, int to) {
  char *src = NULL;
  FILE *f = fopen(ds->files[from], "rb");
  cr_assert_not_null(f);
  cr_assert_eq(fseek(f, 0, SEEK_END), 0);
  long n = ftell(f);
  rewind(f);
  src = malloc((size_t)n);
  cr_assert_eq(fread(src, 1, (size_t)n, f), (size_t)n);
  fclose(f);
  struct stat before;
  cr_assert_eq(stat(ds->files[to], &before), 0);
  f = fopen(ds->files[to], "r+b");
  cr_assert_not_null(f);
  cr_assert_eq(fwrite(src, 1, (size_t)n, f), (size_t)n);
  fclose(f);
  free(src);
  /* Another mtime even on a file system of coarse timestamps. */
  struct timespec ts[2] = {{before.st_atim.tv_sec, 0},
                           {before.st_mtim.tv_sec + 5, 0}};
  cr_assert_eq(utimensat(AT_FDCWD, ds->files[to], ts, 0), 0);
}

/* A shard rewritten between epochs (same size, new mtime) is read again,
 * not served from its old entry; the other shards still are. */
Test(cache, a_changed_shard_is_not_served_from_the_cache) {
  hx_dataset_t ds;
  cr_assert_eq(hx_make_dataset(&ds, "changed", FILES, PER_FILE, 32, 32, 3),
               0);
  char spec[1024];
  hx_spec(&ds, "blur(3, 0.8)", 32, spec, sizeof(spec));
  cluster_t cl;
  start(&cl, 1, true, "changed");
  /* One job per epoch: a job may produce its next epoch ahead, before
   * the shard changes. */
  ferry_client_t *c = client(&cl, spec, 1, 3);
  epoch(c, dig_on[0], "epoch 0", 0, NULL);
  ferry_client_free(c);
  overwrite(&ds, 1, 0);
  c = client(&cl, spec, 1, 3);
  epoch(c, dig_on[1], "epoch 0 of a second job", 0, NULL);
  ferry_client_free(c);
  long long hits = hx_metric(cl.metrics[0], "ferry_worker_cache_hits_total");
  stop(&cl);
  /* File 0 now holds file 1's records: its records must be file 1's. */
  for (size_t r = 0; r < PER_FILE; r++) {
    cr_assert_eq(dig_on[1][r], dig_on[0][PER_FILE + r],
                 "record %zu of the rewritten shard: stale pixels (served "
                 "from the old entry?)", r);
    cr_assert_neq(dig_on[1][r], dig_on[0][r]);
  }
  for (size_t s = PER_FILE; s < N_RECORDS; s++)
    cr_assert_eq(dig_on[1][s], dig_on[0][s]);
  cr_assert_eq(hits, N_RECORDS - PER_FILE,
               "hits %lld: only the unchanged shards come from the cache",
               hits);
  hx_dataset_free(&ds);
}

/* Entries cut short at a random length and with one random byte flipped
 * (seed printed): detected by their checksums, removed, recomputed, and
 * the epoch's pixels are still the first epoch's. */
Test(cache, damaged_entries_are_recomputed_never_served) {
  unsigned seed = hx_seed("cache_damaged");
  srand(seed);
  hx_dataset_t ds;
  cr_assert_eq(hx_make_dataset(&ds, "damaged", FILES, PER_FILE, 32, 32, 3),
               0);
  char spec[1024];
  hx_spec(&ds, "dilate(3) | blur(5, 1.0)", 32, spec, sizeof(spec));
  cluster_t cl;
  start(&cl, 1, true, "damaged");
  /* One job per epoch, so that no entry is read while it is damaged. */
  ferry_client_t *c = client(&cl, spec, 1, 9);
  epoch(c, dig_on[0], "epoch 0", 0, NULL);
  ferry_client_free(c);
  char paths[8][1024];
  cr_assert_eq(entries(cl.cache_dir[0], paths, 8), FILES);
  struct stat st;
  cr_assert_eq(stat(paths[0], &st), 0);
  off_t cut = 1 + rand() % (int)(st.st_size - 1);
  cr_assert_eq(truncate(paths[0], cut), 0);
  cr_assert_eq(stat(paths[1], &st), 0);
  off_t at = rand() % (int)st.st_size;
  int fd = open(paths[1], O_RDWR);
  cr_assert_geq(fd, 0);
  uint8_t b;
  cr_assert_eq(pread(fd, &b, 1, at), 1);
  b ^= (uint8_t)(1u << (rand() % 8));
  cr_assert_eq(pwrite(fd, &b, 1, at), 1);
  close(fd);
  fprintf(stderr, "damaged entries: %s cut to %lld bytes, %s byte %lld "
          "flipped (FERRY_IT_SEED=%u)\n", paths[0], (long long)cut,
          paths[1], (long long)at, seed);
  for (int e = 1; e < 3; e++) {
    c = client(&cl, spec, 1, 9);
    epoch(c, dig_on[e], e == 1 ? "job 2 (damaged entries)" : "job 3", 0,
          NULL);
    ferry_client_free(c);
  }
  long long corrupt =
      hx_metric(cl.metrics[0], "ferry_worker_cache_corrupt_total");
  long long hits = hx_metric(cl.metrics[0], "ferry_worker_cache_hits_total");
  int left = entries(cl.cache_dir[0], paths, 8);
  stop(&cl);
  for (int e = 1; e < 3; e++)
    for (size_t s = 0; s < N_RECORDS; s++)
      cr_assert_eq(dig_on[e][s], dig_on[0][s],
                   "epoch %d, file %zu record %zu: not the first epoch's "
                   "pixels (FERRY_IT_SEED=%u)",
                   e, s / PER_FILE, s % PER_FILE, seed);
  cr_assert_eq(corrupt, 2, "%lld damaged entries counted, 2 made", corrupt);
  /* Job 2 served the two intact entries (and a damaged one's records
   * before its damage, when found reading it); an entry found damaged at
   * its opening is written again in the same pass, one found while read
   * in the next: job 3 served at least three. */
  cr_assert_geq(hits, 2 * PER_FILE + 3 * PER_FILE, "hits %lld", hits);
  cr_assert_eq(left, FILES, "%d entries after the rewrite", left);
  hx_dataset_free(&ds);
}

static hx_proc_t *victim;

static void kill_victim(void) { hx_stop(victim, SIGKILL, 5000, NULL); }

/* Two workers, each with its own cache: one killed at a random batch of
 * the second epoch (served from the caches): every record once, the same
 * pixels as the first epoch. */
Test(cache, a_worker_killed_while_serving_from_its_cache) {
  unsigned seed = hx_seed("cache_worker_killed");
  srand(seed);
  hx_dataset_t ds;
  cr_assert_eq(hx_make_dataset(&ds, "killed", FILES, PER_FILE, 32, 32, 3),
               0);
  char spec[1024];
  hx_spec(&ds, "dilate(3) | blur(5, 1.0)", 16, spec, sizeof(spec));
  cluster_t cl;
  start(&cl, 2, true, "killed");
  ferry_client_t *c = client(&cl, spec, 3, 21);
  uint32_t batches = epoch(c, dig_on[0], "epoch 0", 0, NULL);
  uint32_t at = 1 + (uint32_t)rand() % (batches - 1);
  fprintf(stderr, "killing worker1 after batch %u of %u of epoch 1 "
          "(FERRY_IT_SEED=%u)\n", at, batches, seed);
  victim = cl.w[0];
  epoch(c, dig_on[1], "epoch 1 (worker1 killed)", at, kill_victim);
  epoch(c, dig_on[2], "epoch 2", 0, NULL);
  ferry_client_free(c);
  cl.w[0] = NULL;
  stop(&cl);
  for (int e = 1; e < 3; e++)
    for (size_t s = 0; s < N_RECORDS; s++)
      cr_assert_eq(dig_on[e][s], dig_on[0][s],
                   "epoch %d, file %zu record %zu (FERRY_IT_SEED=%u)", e,
                   s / PER_FILE, s % PER_FILE, seed);
  hx_dataset_free(&ds);
}

/* `ferryctl status` shows each worker's cache and the policy's choice
 * with its measured costs, and the job the choice of its dataset. */
Test(cache, status_shows_the_cache_and_the_policy) {
  hx_dataset_t ds;
  cr_assert_eq(hx_make_dataset(&ds, "status", FILES, PER_FILE, 32, 32, 3), 0);
  char spec[1024], id[17], why[512];
  hx_spec(&ds, "dilate(3) | blur(11, 0.8)", 32, spec, sizeof(spec));
  cluster_t cl;
  start(&cl, 1, true, "status");
  cr_assert_eq(hx_register_dataset(cl.d->addr, spec, id, why, sizeof(why)), 0,
               "%s", why);
  ferry_client_t *c = client(&cl, spec, 2, 1);
  epoch(c, dig_on[0], "epoch 0", 0, NULL);
  epoch(c, dig_on[1], "epoch 1", 0, NULL);
  /* The report travels with the worker's heartbeats (100 ms here): poll
   * until it counts the second epoch, at most 10 s. */
  char *json = NULL;
  int64_t hits = -1;
  char want[128];
  snprintf(want, sizeof(want), "\"dataset_id\": \"%s\", \"choice\": \"", id);
  for (double t0 = hx_now_ms(); hx_now_ms() - t0 < 10000;) {
    int st;
    free(json);
    json = hx_ferryctl_status_json(cl.d->addr, &st);
    cr_assert_not_null(json);
    cr_assert_eq(st, 0);
    if (hx_json_int_after(json, "\"cache\": {", "hits", &hits) &&
        hits == N_RECORDS)
      break;
    usleep(50 * 1000);
  }
  cr_assert_eq(hits, N_RECORDS, "the status counted %lld hits:\n%s",
               (long long)hits, json);
  cr_assert(hx_json_valid(json), "%s", json);
  char *at = strstr(json, want);
  cr_assert_not_null(at, "no policy for dataset %s:\n%s", id, json);
  cr_assert(strncmp(at + strlen(want), "cache\"", 6) == 0,
            "the seed pipeline's choice: %.80s", at + strlen(want));
  cr_assert_not_null(strstr(json, "recompute "), "the reason's costs:\n%s",
                     json);
  free(json);
  /* The text form names the job's choice. */
  char cmd[1200];
  snprintf(cmd, sizeof(cmd), "%s status --dispatcher %s", hx_ferryctl_bin(),
           cl.d->addr);
  FILE *p = popen(cmd, "r");
  cr_assert_not_null(p);
  char line[2048];
  bool job_line = false;
  while (fgets(line, sizeof(line), p) != NULL)
    job_line |= strstr(line, "cache on worker 1: cache (") != NULL;
  cr_assert_eq(pclose(p), 0);
  cr_assert(job_line, "no \"cache on worker 1\" line in `ferryctl status`");
  ferry_client_free(c);
  stop(&cl);
  hx_dataset_free(&ds);
}
