#ifndef FERRY_LEASE_H
#define FERRY_LEASE_H

/* Lease generations: how the dispatcher numbers a row's leases, and how a
 * client tells the parts of one split apart. This file owns the layout.
 *
 *   bits 40..63  the dispatcher process (its boot count): the first lease
 *                of a process is above every lease an earlier one issued
 *   bits 24..39  the part of the split (ranked jobs: a split cut among
 *                ranks, or around records a resumed epoch already took,
 *                is several rows, each leased on its own)
 *   bits  0..23  re-leases of the row within one process
 *
 * A worker's task is (job, epoch, split, lease), so two parts of one
 * split never share a lease; a client holding two parts of one split (an
 * epoch resumed with another world size) keys them by their part. */

#include <stdbool.h>
#include <stdint.h>

#define FERRY_LEASE_PART_SHIFT 24
#define FERRY_LEASE_BOOT_SHIFT 40
/* Parts of one split a plan may make. */
#define FERRY_LEASE_MAX_PARTS                                                  \
  (1u << (FERRY_LEASE_BOOT_SHIFT - FERRY_LEASE_PART_SHIFT))

/* The lowest lease of part `part` of a split in dispatcher process
 * `boot`. */
static inline uint64_t ferry__lease_floor(uint64_t boot, uint32_t part) {
  return boot << FERRY_LEASE_BOOT_SHIFT |
         (uint64_t)(part % FERRY_LEASE_MAX_PARTS) << FERRY_LEASE_PART_SHIFT;
}

/* The part of its split a lease is of (0 for unranked jobs). */
static inline uint32_t ferry__lease_part(uint64_t lease) {
  return (uint32_t)(lease >> FERRY_LEASE_PART_SHIFT) &
         (FERRY_LEASE_MAX_PARTS - 1);
}

/* Whether a lease was issued: a row's lease before its first is its
 * part's floor in process 0. */
static inline bool ferry__lease_issued(uint64_t lease) {
  return (lease & ~((uint64_t)(FERRY_LEASE_MAX_PARTS - 1)
                    << FERRY_LEASE_PART_SHIFT)) != 0;
}

#endif
