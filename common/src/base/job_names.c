/* Job state and mode names (job_names.h). */
#include "job_names.h"

#include "ferry/v1/dispatcher.pb-c.h"

const char *ferry__job_state_name(int state) {
  switch (state) {
  case FERRY__V1__JOB_STATE__JOB_STATE_RUNNING:
    return "running";
  case FERRY__V1__JOB_STATE__JOB_STATE_FINISHED:
    return "finished";
  case FERRY__V1__JOB_STATE__JOB_STATE_FAILED:
    return "failed";
  case FERRY__V1__JOB_STATE__JOB_STATE_CANCELLED:
    return "cancelled";
  default:
    return "unknown";
  }
}

const char *ferry__job_mode_name(int mode) {
  switch (mode) {
  case FERRY__V1__JOB_MODE__JOB_MODE_DISTRIBUTED_EPOCH:
    return "distributed_epoch";
  case FERRY__V1__JOB_MODE__JOB_MODE_PARALLEL_EPOCHS:
    return "parallel_epochs";
  default:
    return "unknown";
  }
}
