/* ferryctl: the user's tool for Ferry clusters and record files. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "ctl.h"
#include "ferry/log.h"
#include "ferry/version.h"

static const char usage[] =
    "usage: ferryctl COMMAND [ARGS]\n"
    "\n"
    "Record files:\n"
    "  records inspect FILE... [--json]   counts, CRC failures, features\n"
    "  records index FILE...              write DALI-compatible index files\n"
    "  records optimize IN... OUT         rewrite JPEGs for cropped decodes\n"
    "  gen --out DIR ...                  generate a synthetic image dataset\n"
    "\n"
    "Cluster (each with --dispatcher HOST:PORT and --json):\n"
    "  status                             workers, jobs, progress, errors\n"
    "  workers                            one line per worker\n"
    "  jobs                               one line per job\n"
    "  watch [--interval S]               status, refreshed until interrupted\n"
    "  drain WORKER_ID_OR_ADDR [--timeout S]\n"
    "                                     move a worker's splits away; wait\n"
    "  job cancel JOB_ID                  end a job; its clients fail\n"
    "\n"
    "Benchmarks:\n"
    "  bench pipeline [...]               the seed pipeline, stage by stage\n"
    "\n"
    "  --version                          print 'ferryctl VERSION'\n"
    "\n"
    "--json prints one JSON document per line, each with \"schema\": 1.\n"
    "Exit status: 0 ok, 1 failure (bad input, or the dispatcher refused the\n"
    "call), 2 usage error, 3 dispatcher unreachable, 4 timed out (drain).\n"
    "\n"
    "Run 'ferryctl COMMAND --help' for a command's options.\n";

int ferryctl_isatty(void) { return isatty(STDOUT_FILENO); }

int main(int argc, char **argv) {
  ferry_log_set_callback(ferry_log_to_stderr, NULL);
  if (argc < 2 || strcmp(argv[1], "--help") == 0 ||
      strcmp(argv[1], "-h") == 0) {
    fputs(usage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (strcmp(argv[1], "records") == 0)
    return ferryctl_records(argc - 1, argv + 1);
  if (strcmp(argv[1], "gen") == 0)
    return ferryctl_gen(argc - 1, argv + 1);
  if (strcmp(argv[1], "bench") == 0)
    return ferryctl_bench(argc - 1, argv + 1);
  if (strcmp(argv[1], "--version") == 0) {
    printf("ferryctl %s\n", FERRY_VERSION_STRING);
    return 0;
  }
  if (strcmp(argv[1], "status") == 0)
    return ferryctl_status(argc - 1, argv + 1);
  if (strcmp(argv[1], "workers") == 0)
    return ferryctl_workers(argc - 1, argv + 1);
  if (strcmp(argv[1], "jobs") == 0)
    return ferryctl_jobs(argc - 1, argv + 1);
  if (strcmp(argv[1], "watch") == 0)
    return ferryctl_watch(argc - 1, argv + 1);
  if (strcmp(argv[1], "drain") == 0)
    return ferryctl_drain(argc - 1, argv + 1);
  if (strcmp(argv[1], "job") == 0)
    return ferryctl_job(argc - 1, argv + 1);
  fprintf(stderr, "ferryctl: unknown command '%s'\n\n%s", argv[1], usage);
  return 2;
}
