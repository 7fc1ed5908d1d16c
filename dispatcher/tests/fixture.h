/* Shared helpers of the dispatcher's tests: temporary TFRecord files,
 * specs, and one-call wrappers around the state machine's RPCs whose
 * responses live in a per-test arena. */
#ifndef FERRY_DISPATCHER_TEST_FIXTURE_H
#define FERRY_DISPATCHER_TEST_FIXTURE_H

#include <stdbool.h>
#include <stdint.h>

#include "ferry/v1/journal.pb-c.h"
#include "state.h"
#include "tfrecord.h"

extern ferry_arena_t fx_arena; /* responses; freed by fx_teardown */
extern char fx_dir[64];        /* this test's temporary directory */

/* Creates the temporary directory; fx_teardown removes it and frees the
 * arena. */
void fx_setup(void);
void fx_teardown(void);

/* A suite's init and fini: fx_begin notes the allocation count, then
 * fx_setup; fx_end frees *d (NULL after), calls fx_teardown and expects
 * every block Ferry allocated since fx_begin to be back. */
void fx_begin(void);
void fx_end(ferry_disp_t **d);

/* Job modes and error policies, short. */
#define DIST FERRY__V1__JOB_MODE__JOB_MODE_DISTRIBUTED_EPOCH
#define PARALLEL FERRY__V1__JOB_MODE__JOB_MODE_PARALLEL_EPOCHS
#define FAIL FERRY__V1__ERROR_POLICY__ERROR_POLICY_FAIL
#define SKIP FERRY__V1__ERROR_POLICY__ERROR_POLICY_SKIP

/* Writes `n` records (record i holds 1 + (i * 7) % 50 bytes) to DIR/name
 * and returns the path (static buffer rotation: copy it if kept). */
const char *fx_write(const char *name, int n, ferry_compression_t c);

/* A state with the given timeouts (ms), records per split and a sink that
 * keeps every entry (fx_entries). */
ferry_disp_t *fx_state(int64_t worker_to, int64_t client_to, int64_t gc,
                       uint32_t per_split);

/* Every entry the state committed so far, serialized. */
typedef struct fx_entries_s {
  uint8_t **e;
  size_t *len;
  size_t n;
} fx_entries_t;
extern fx_entries_t fx_entries;

/* Registers the spec text; returns the code and fills *resp. */
int fx_register(ferry_disp_t *d, const char *spec_text, uint32_t per_split,
                Ferry__V1__RegisterDatasetResponse **resp, int64_t now,
                ferry_error_t *err);

/* The splits of the last RegisterDataset entry committed (arena). */
Ferry__V1__JournalRegisterDataset *fx_last_dataset(void);

Ferry__V1__GetOrCreateJobResponse *fx_job(ferry_disp_t *d, const char *id,
                                          const char *name, int mode,
                                          int64_t epochs, int policy,
                                          int64_t now);

/* GetOrCreateJob with a hand-built request (ranks); returns the
 * code, keeps the secret for fx_sign on success. */
int fx_job_req(ferry_disp_t *d, const Ferry__V1__GetOrCreateJobRequest *req,
               Ferry__V1__GetOrCreateJobResponse **out, int64_t now,
               ferry_error_t *err);

/* Puts the secret fx_job got for (req->job_id, req->client_id)
 * into a hand-built ClientHeartbeat request. */
void fx_sign(Ferry__V1__ClientHeartbeatRequest *req);

/* A client heartbeat with `n` progress reports (epoch, split, delivered,
 * worker) given as a flat array of 4-tuples. */
/* Unless 0 (the default), every progress report fx_client sends gives its
 * split up at this lease (SplitProgress.release). */
extern uint64_t fx_release_lease;
/* When set, fx_client's progress entry i names lease fx_prog_leases[i]
 * (the part of its split it is about). */
extern const uint64_t *fx_prog_leases;

Ferry__V1__ClientHeartbeatResponse *fx_client(ferry_disp_t *d, uint64_t job,
                                              uint64_t client, uint32_t want,
                                              const uint64_t *prog, size_t n,
                                              bool leaving, int64_t now);

/* One task as a worker reports it. */
typedef struct fx_task_s {
  uint64_t job;
  uint32_t epoch, split;
  uint64_t lease, produced, skipped;
  bool finished;
  int32_t error_code;
  const char *error;
  uint64_t stalled_ms; /* its client's stream took nothing this long */
  bool resend; /* its chunks went into a stream that ended early */
} fx_task_t;

/* TaskProgress.unread_ms of every task fx_worker reports (0 unless a test
 * sets it): its client had no stream open this long. */
extern uint64_t fx_unread_ms;


Ferry__V1__WorkerHeartbeatResponse *fx_worker(ferry_disp_t *d, uint64_t id,
                                              const char *addr,
                                              const fx_task_t *tasks,
                                              size_t n, bool draining,
                                              int64_t now);

Ferry__V1__GetStatusResponse *fx_status(ferry_disp_t *d, int64_t now);

/* The status with its volatile fields (times, load, client stats)
 * zeroed, serialized: equal for equal journaled state. */
uint8_t *fx_status_bytes(ferry_disp_t *d, int64_t now, size_t *len);

/* Replays every entry d committed (fx_entries) into a new state and
 * asserts its status at `now` is d's, byte for byte. */
void fx_replay_matches(ferry_disp_t *d, int64_t now);

#endif /* FERRY_DISPATCHER_TEST_FIXTURE_H */
