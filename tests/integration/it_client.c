/* A trainer as a process of its own, for the client-fault tests
 * (test_client_faults.c), which kill it, stop it or let it leave early:
 *
 *   it_client DISPATCHER SPEC JOB_NAME EPOCHS OUT STEP_US LEAVE_AFTER
 *
 * Joins the named job, prints "it_client ready: job J client C" once the
 * client exists, then takes batches until the job ends. After each batch
 * it appends one record to OUT with a single write(): a header {uint32
 * epoch, uint32 n, double t_ms (CLOCK_MONOTONIC, comparable across
 * processes), uint64 acked (ferry_client_stats' records_acked)} and the
 * batch's n record ids, then simulates a training
 * step of STEP_US microseconds and releases the batch. With LEAVE_AFTER
 * >= 0 it frees the client after that many batches (a clean, early
 * leave). Exits 0 at the end of the job or after leaving, 3 on an error
 * (printed to stderr). FERRY_IT_CLIENT_TRANSPORT (auto, grpc, ucx) picks
 * the data-plane transport (default: auto). Ranks:
 * FERRY_IT_CLIENT_WORLD, FERRY_IT_CLIENT_RANK, FERRY_IT_CLIENT_BATCH and
 * FERRY_IT_CLIENT_DROP (1: drop_remainder) set those options; a batch's
 * record holds its real records only (num_real). FERRY_IT_CLIENT_ORDER=
 * deterministic sets that order; FERRY_IT_CLIENT_SHARE=1 shares
 * production (options.share); FERRY_IT_CLIENT_SEED=N shuffles with seed
 * N. A rank still held by a
 * client that was killed is asked for again (every 100 ms, for up to
 * 15 s) until the dispatcher declares that client lost.
 */
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ferry/client.h"
#include "ferry/log.h"

typedef struct rec_s {
  uint32_t epoch, n;
  double t_ms;
  uint64_t acked;
} rec_t;

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

int main(int argc, char **argv) {
  if (argc != 8) {
    fprintf(stderr, "usage: it_client DISPATCHER SPEC JOB_NAME EPOCHS OUT "
                    "STEP_US LEAVE_AFTER\n");
    return 2;
  }
  long step_us = atol(argv[6]), leave_after = atol(argv[7]);
  int out = open(argv[5], O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (out < 0) {
    perror(argv[5]);
    return 2;
  }
  /* The library's warnings (fences, restarts) go to the test's log. */
  ferry_log_set_callback(ferry_log_to_stderr, NULL);
  const char *lvl = getenv("FERRY_IT_CLIENT_LOG");
  ferry_log_set_level(lvl != NULL ? ferry_log_level_parse(lvl)
                                  : FERRY_LOG_INFO);
  ferry_client_options_t o;
  ferry_client_options_init(&o);
  o.dispatcher = argv[1];
  o.spec = argv[2];
  o.job_name = argv[3];
  o.num_epochs = atoll(argv[4]);
  o.heartbeat_ms = 50;
  o.splits_in_flight = 4;
  const char *world = getenv("FERRY_IT_CLIENT_WORLD");
  if (world != NULL) {
    const char *rank = getenv("FERRY_IT_CLIENT_RANK");
    const char *batch = getenv("FERRY_IT_CLIENT_BATCH");
    const char *drop = getenv("FERRY_IT_CLIENT_DROP");
    o.world_size = (uint32_t)atoi(world);
    o.rank = rank != NULL ? (uint32_t)atoi(rank) : 0;
    o.batch_size = batch != NULL ? (uint32_t)atoi(batch) : 0;
    o.drop_remainder = drop != NULL && atoi(drop) != 0;
  }
  const char *share = getenv("FERRY_IT_CLIENT_SHARE");
  o.share = share != NULL && strcmp(share, "1") == 0;
  const char *seed = getenv("FERRY_IT_CLIENT_SEED");
  if (seed != NULL) {
    o.shuffle = 1;
    o.shuffle_seed = strtoull(seed, NULL, 10);
  }
  const char *order = getenv("FERRY_IT_CLIENT_ORDER");
  if (order != NULL && strcmp(order, "deterministic") == 0)
    o.order = FERRY_ORDER_DETERMINISTIC;
  const char *transport = getenv("FERRY_IT_CLIENT_TRANSPORT");
  if (transport != NULL && transport[0] != '\0')
    o.transport = transport;
  ferry_client_t *c;
  ferry_error_t err = {0};
  double give_up = now_ms() + 15000;
  while (ferry_client_new(&o, &c, &err) != 0) {
    if (world == NULL || strstr(err.msg, "is held by live client") == NULL ||
        now_ms() > give_up) {
      fprintf(stderr, "it_client: %s\n", err.msg);
      return 3;
    }
    usleep(100000);
  }
  printf("it_client ready: job %" PRIu64 " client %" PRIu64 "\n",
         ferry_client_job_id(c), ferry_client_id(c));
  fflush(stdout);
  uint8_t *buf = NULL;
  size_t cap = 0;
  long batches = 0;
  int rc, status = 0;
  for (;;) {
    const ferry_batch_t *b;
    if (leave_after >= 0 && batches >= leave_after)
      break;
    rc = ferry_next(c, &b, 30000, &err);
    if (rc == FERRY_END)
      break;
    if (rc == FERRY_EPOCH_END)
      continue;
    if (rc != 0) {
      fprintf(stderr, "it_client: ferry_next: %s\n", err.msg);
      status = 3;
      break;
    }
    size_t need = sizeof(rec_t) + b->num_real * sizeof(uint64_t);
    if (need > cap) {
      free(buf);
      cap = need * 2;
      if ((buf = malloc(cap)) == NULL) {
        status = 3;
        break;
      }
    }
    ferry_client_stats_t st;
    ferry_client_stats(c, &st);
    rec_t h = {b->epoch, b->num_real, now_ms(), st.records_acked};
    memcpy(buf, &h, sizeof(h));
    memcpy(buf + sizeof(h), b->ids, b->num_real * sizeof(uint64_t));
    if (write(out, buf, need) != (ssize_t)need) {
      perror("it_client: write");
      status = 3;
      break;
    }
    if (step_us > 0) /* the simulated training step */
      usleep((useconds_t)step_us);
    ferry_batch_release(c, b);
    batches++;
  }
  ferry_client_free(c);
  free(buf);
  close(out);
  fprintf(stderr, "it_client: %ld batches, exit %d\n", batches, status);
  return status;
}
