/* The names of a job's state and mode (ferry.v1.JobState, JobMode) as
 * Ferry prints them: ferryctl's text and --json (a schema 1 contract), the
 * dispatcher's metrics labels and its messages. This file is their one
 * owner: each is the .proto value's name without its prefix, in lower
 * case (JOB_STATE_CANCELLED -> "cancelled"); the dispatcher's metrics test
 * checks the table against the descriptors. */
#ifndef FERRY_JOB_NAMES_H
#define FERRY_JOB_NAMES_H

/* "running", "finished", "failed", "cancelled"; "unknown" otherwise. */
const char *ferry__job_state_name(int state);

/* "distributed_epoch", "parallel_epochs"; "unknown" otherwise. */
const char *ferry__job_mode_name(int mode);

#endif /* FERRY_JOB_NAMES_H */
