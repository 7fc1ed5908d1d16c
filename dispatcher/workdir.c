/* The work directory's lock (see workdir.h). */
#include "workdir.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ferry/log.h"

/* The pid text in the lock file, 0 when there is none. */
static long read_pid(int fd) {
  char b[32];
  ssize_t n = pread(fd, b, sizeof(b) - 1, 0);
  char *end;
  long pid;
  if (n <= 0)
    return 0;
  b[n] = '\0';
  pid = strtol(b, &end, 10);
  return end != b && pid > 0 ? pid : 0;
}

int ferry__workdir_lock(const char *dir, int *fd, ferry_error_t *err) {
  char path[4096], text[32];
  int f, e, n;
  long prev;

  *fd = -1;
  if (mkdir(dir, 0755) != 0 && errno != EEXIST)
    return ferry__seterr(err, ferry_err_from_errno(errno),
                         "%s: cannot create the work directory: %s", dir,
                         strerror(errno));
  snprintf(path, sizeof(path), "%s/lock", dir);
  f = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (f < 0)
    return ferry__seterr(err, ferry_err_from_errno(errno), "%s: open: %s", path,
                         strerror(errno));
  while (flock(f, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EINTR)
      continue;
    e = errno;
    prev = read_pid(f);
    close(f);
    if (e != EWOULDBLOCK)
      return ferry__seterr(err, ferry_err_from_errno(e), "%s: flock: %s", path,
                           strerror(e));
    if (prev > 0)
      return ferry__seterr(err, FERRY_EIO,
                           "%s: the work directory is in use by process %ld "
                           "(another ferry-dispatcher); stop it or choose "
                           "another --work-dir",
                           path, prev);
    return ferry__seterr(err, FERRY_EIO,
                         "%s: the work directory is in use by a process "
                         "that is still starting (no pid written yet)",
                         path);
  }
  /* The lock is ours: whoever wrote the pid in the file is gone. */
  if ((prev = read_pid(f)) > 0 && prev != (long)getpid())
    FERRY_LOG(FERRY_LOG_WARN,
              "%s: the previous owner, pid %ld, is gone; taking over", path,
              prev);
  n = snprintf(text, sizeof(text), "%ld\n", (long)getpid());
  if (ftruncate(f, 0) != 0 || pwrite(f, text, (size_t)n, 0) != n) {
    e = errno;
    close(f);
    return ferry__seterr(err, ferry_err_from_errno(e), "%s: write: %s", path,
                         strerror(e));
  }
  *fd = f;
  return 0;
}

void ferry__workdir_unlock(int fd) {
  if (fd < 0)
    return;
  if (ftruncate(fd, 0) != 0)
    FERRY_LOG(FERRY_LOG_WARN, "work directory lock: ftruncate: %s",
              strerror(errno));
  close(fd);
}
