/* ferryctl's subcommands. Each takes the arguments after its name (argv[0]
 * is the subcommand's name) and returns the process exit status. */
#ifndef FERRY_CTL_H
#define FERRY_CTL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ferry/error.h"
#include "options.h"

int ferryctl_records(int argc, char **argv); /* records COMMAND */
int ferryctl_gen(int argc, char **argv);     /* gen */
int ferryctl_bench(int argc, char **argv);   /* bench pipeline */
int ferryctl_status(int argc, char **argv);  /* status */
/* cmd_status.c: the operator's commands. */
int ferryctl_workers(int argc, char **argv); /* workers */
int ferryctl_jobs(int argc, char **argv);    /* jobs */
int ferryctl_watch(int argc, char **argv);   /* watch */
int ferryctl_drain(int argc, char **argv);   /* drain WORKER */
int ferryctl_job(int argc, char **argv);     /* job cancel JOB */

/* True when stdout is a terminal (progress bars and colours). */
int ferryctl_isatty(void);

/* Shared helpers (ctl_util.c). */

/* Exit statuses every subcommand uses. */
#define FERRYCTL_EXIT_OK 0
#define FERRYCTL_EXIT_BAD 1   /* ran, and found bad input; or the
                               * dispatcher refused the call */
#define FERRYCTL_EXIT_USAGE 2 /* usage error, unreadable or unusable file */
#define FERRYCTL_EXIT_UNREACHABLE 3 /* the dispatcher did not answer */
#define FERRYCTL_EXIT_TIMEOUT 4     /* drain: not drained in --timeout */

/* Parses a subcommand's flags with the options table `t` into `base`
 * (defaults first). Positional arguments end up at the front of argv, their
 * count in *n_positional. "--help" (give the table a bool option named
 * "help" at `help_offset`) or a lone "-h" prints `usage`, the table's help
 * and `footer` (may be NULL) to stdout. Returns FERRYCTL_CONTINUE to go
 * on, or the exit status to return right away: 0 after help, 2 after a
 * usage error, which is printed to stderr as "ferryctl CMD: message". */
#define FERRYCTL_CONTINUE (-1)
int ferryctl_parse_options(const char *cmd, const char *usage,
                           const char *footer, const ferry_option_t *t,
                           size_t n, void *base, size_t help_offset,
                           int argc, char **argv, int *n_positional);

/* Prints why a call of `method` to the dispatcher at `dispatcher` failed
 * with `rc` and `err`, with what to do next (ctl_rpc.c: a host that does
 * not resolve, nothing listening, a TLS mismatch, a worker's port, a
 * missing token), and returns the exit status: 3 when no dispatcher
 * answered there, else 1. `tls`: the command was given TLS flags. */
int ferryctl_call_failed(const char *cmd, const char *dispatcher, bool tls,
                         const char *method, int rc,
                         const ferry_error_t *err);

/* Checks a --dispatcher value (HOST:PORT, hostport.h). Returns
 * FERRYCTL_CONTINUE, or prints the usage error and returns 2. */
int ferryctl_check_dispatcher(const char *cmd, const char *dispatcher);

/* Writes `len` bytes at `s` as a JSON string literal, quotes included.
 * Control characters and invalid UTF-8 bytes are escaped (an invalid byte
 * b becomes \u00bb), so the output is always valid JSON. */
void ferryctl_json_string(FILE *out, const void *s, size_t len);

/* Formats `n` bytes for people ("512 B", "1.5 MiB") into buf. */
const char *ferryctl_human_bytes(uint64_t n, char *buf, size_t cap);

/* Monotonic seconds. */
double ferryctl_now(void);

/* A one-line progress bar on stderr, redrawn at most ten times a second,
 * only when `enabled`. */
typedef struct ferryctl_progress_s {
  bool enabled;
  const char *label;
  uint64_t total;
  double start;
  double last_draw;
} ferryctl_progress_t;

void ferryctl_progress_init(ferryctl_progress_t *p, const char *label,
                            uint64_t total, bool enabled);
void ferryctl_progress_update(ferryctl_progress_t *p, uint64_t done);
/* Draws the final state and ends the line (if enabled). */
void ferryctl_progress_finish(ferryctl_progress_t *p, uint64_t done);

#endif /* FERRY_CTL_H */
