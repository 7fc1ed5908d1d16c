/* ferryctl: the user's tool for Ferry clusters and record files. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "ctl.h"
#include "ferry/log.h"

static const char usage[] =
    "usage: ferryctl COMMAND [ARGS]\n"
    "\n"
    "Record files:\n"
    "  records inspect FILE... [--json]   counts, CRC failures, features\n"
    "  records index FILE...              write DALI-compatible index files\n"
    "  gen --out DIR ...                  generate a synthetic image dataset\n"
    "\n"
    "Cluster:\n"
    "  status --dispatcher HOST:PORT      workers, jobs, progress, errors\n"
    "\n"
    "Benchmarks:\n"
    "  bench pipeline [...]               the seed pipeline, stage by stage\n"
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
  if (strcmp(argv[1], "status") == 0)
    return ferryctl_status(argc - 1, argv + 1);
  fprintf(stderr, "ferryctl: unknown command '%s'\n\n%s", argv[1], usage);
  return 2;
}
