/* bench_pipeline: `ferryctl bench pipeline` as a program of its own, so
 * the benchmark builds and runs without the rest of ferryctl. */
#include <stdio.h>
#include <unistd.h>

#include "alloc.h"
#include "ctl.h"
#include "ferry/log.h"

int ferryctl_isatty(void) { return isatty(STDOUT_FILENO); }

int main(int argc, char **argv) {
  char **args = ferry__calloc((size_t)argc + 2, sizeof(char *));
  int rc;

  if (args == NULL) {
    fputs("bench_pipeline: out of memory\n", stderr);
    return 1;
  }
  ferry_log_set_callback(ferry_log_to_stderr, NULL);
  args[0] = (char *)"bench";
  args[1] = (char *)"pipeline";
  for (int i = 1; i < argc; i++)
    args[i + 1] = argv[i];
  rc = ferryctl_bench(argc + 1, args);
  ferry__free(args);
  return rc;
}
