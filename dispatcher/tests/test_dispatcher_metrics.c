/* The workers-wanted formula (docs/OPERATIONS.md, "How many
 * workers") and the dispatcher's counters. */
#include <criterion/criterion.h>
#include <ctype.h>
#include <string.h>

#include "ferry/v1/dispatcher.pb-c.h"
#include "job_names.h"
#include "state.h"

Test(workers_wanted, stalled_trainer_asks_for_more) {
  /* 4 workers, one trainer stalled half the time at 10 batches/s: it
   * could take 20/s, a worker gives 2.5/s: ceil(4 * 0.95 * 20 / 10). */
  double s[1] = {0.5}, r[1] = {10};
  cr_assert_eq(ferry__disp_workers_wanted(4, s, r, 1, 0.05), 8);
  cr_assert_eq(ferry__disp_workers_wanted(4, s, r, 1, 0), 8);
  cr_assert_eq(ferry__disp_workers_wanted(4, s, r, 1, 0.5), 4);
}

Test(workers_wanted, never_below_n_and_bounded) {
  double s0[1] = {0}, r[1] = {10};
  cr_assert_eq(ferry__disp_workers_wanted(20, s0, r, 1, 0.05), 20);
  double s1[1] = {1.0};
  cr_assert_eq(ferry__disp_workers_wanted(1, s1, r, 1, 0), 100); /* 0.99 */
  cr_assert_eq(ferry__disp_workers_wanted(0, s0, r, 0, 0.05), 1);
  double none[1] = {0};
  cr_assert_eq(ferry__disp_workers_wanted(3, s1, none, 1, 0.05), 3);
}

Test(workers_wanted, clients_weigh_by_their_rates) {
  /* Two clients of one job on 2 workers: 30/s unstalled and 10/s stalled
   * 75%: demand 30 + 40 = 70 of 40 delivered: ceil(2 * 70 / 40) = 4. */
  double s[2] = {0, 0.75}, r[2] = {30, 10};
  cr_assert_eq(ferry__disp_workers_wanted(2, s, r, 2, 0), 4);
}

/* job_names.h is the one table of the names ferryctl prints and the
 * ferry_dispatcher_jobs{state} labels use: each must be the .proto value's
 * name without its prefix, in lower case, for every value the proto has. */
static void check_names(const ProtobufCEnumDescriptor *desc,
                        const char *prefix, const char *(*name)(int)) {
  cr_assert_gt(desc->n_values, 1);
  for (unsigned v = 0; v < desc->n_values; v++) {
    const char *pb = desc->values[v].name, *got = name(desc->values[v].value);
    char want[64];
    size_t i = 0;
    cr_assert_eq(strncmp(pb, prefix, strlen(prefix)), 0, "%s", pb);
    for (pb += strlen(prefix); pb[i] != '\0' && i + 1 < sizeof(want); i++)
      want[i] = (char)tolower((unsigned char)pb[i]);
    want[i] = '\0';
    cr_assert_str_eq(got, want, "value %d", desc->values[v].value);
  }
  cr_assert_str_eq(name(1000), "unknown");
}

Test(job_names, match_the_proto_enums) {
  check_names(&ferry__v1__job_state__descriptor, "JOB_STATE_",
              ferry__job_state_name);
  check_names(&ferry__v1__job_mode__descriptor, "JOB_MODE_",
              ferry__job_mode_name);
}
