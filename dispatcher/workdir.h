/* One dispatcher per work directory: WORKDIR/lock, held with flock for
 * the life of the process, holds the owner's pid as text.
 *
 * flock is released by the kernel when its holder dies, however it dies
 * (kill -9 included), so a lock left by a dead dispatcher is simply
 * taken over; the pid in the file is only there to name the owner in
 * messages. Two dispatchers on one journal would both append to it and
 * both hand out splits (duplicates, and a journal that no longer
 * replays), hence the check before the replay.
 */
#ifndef FERRY_DISPATCHER_WORKDIR_H
#define FERRY_DISPATCHER_WORKDIR_H

#include "ferry/error.h"

/* Creates `dir` and its missing parents if needed (mkdir -p; a failure
 * names the directory that could not be made) and takes DIR/lock (flock
 * LOCK_EX | LOCK_NB), writing this process's pid into it. On success *fd
 * is the open, locked file (close-on-exec), kept open until
 * ferry__workdir_unlock.
 * When a live process holds the lock, fails with FERRY_EIO and a message
 * naming the lock file and the holder's pid. A previous owner that is
 * gone is logged (warning) with its pid. Other failures name the path. */
int ferry__workdir_lock(const char *dir, int *fd, ferry_error_t *err);

/* Empties the lock file (a clean exit leaves no owner's pid behind) and
 * closes it, which releases the lock. fd < 0 is a no-op. */
void ferry__workdir_unlock(int fd);

#endif /* FERRY_DISPATCHER_WORKDIR_H */
