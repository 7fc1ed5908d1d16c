/* The Criterion runner's hooks of every HX_SUITE program, linked into
 * each (tests/integration/CMakeLists.txt). Apart from HX_SUITE's own
 * POST_ALL hook because Criterion names a hook after its line, and two
 * in one macro share one. */
#include <criterion/criterion.h>
#include <criterion/hooks.h>

#include "harness.h"

/* Before the first test is forked: the -ucx suites skip where UCX cannot
 * start (hx_ucx_probe). */
ReportHook(PRE_ALL)(struct criterion_test_set *set) {
  (void)set;
  hx_ucx_probe();
}
