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

/* mkdir -p: creates `dir` and its missing parents (0755, as the work
 * directory always was). A first start on a fresh machine names a
 * directory such as /var/lib/ferry/cluster-a whose parents do not exist
 * yet. The error names the directory that could not be made, which may
 * be a parent of `dir`, and why. */
static int make_dirs(const char *dir, ferry_error_t *err) {
  char path[4096];
  struct stat st;
  size_t len = strlen(dir);
  if (len == 0 || len >= sizeof(path))
    return ferry__seterr(err, FERRY_EINVAL,
                         "--work-dir: the path is empty or too long");
  memcpy(path, dir, len + 1);
  /* Each prefix that ends before a '/', then the whole path. */
  for (size_t i = 1; i <= len; i++) {
    if (i < len && path[i] != '/')
      continue;
    if (i < len && path[i - 1] == '/')
      continue; /* "a//b" */
    char saved = path[i];
    path[i] = '\0';
    if (mkdir(path, 0755) != 0 && errno != EEXIST) {
      int e = errno;
      return ferry__seterr(
          err, ferry__err_from_errno(e),
          "--work-dir %s: cannot create %s: %s%s", dir, path, strerror(e),
          e == EACCES || e == EPERM ? " (create it as a user who may, and give "
                                      "the dispatcher's user ownership of it)"
                                    : "");
    }
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) {
      return ferry__seterr(err, FERRY_EINVAL,
                           "--work-dir %s: %s exists and is not a directory",
                           dir, path);
    }
    path[i] = saved;
  }
  return 0;
}

int ferry__workdir_lock(const char *dir, int *fd, ferry_error_t *err) {
  char path[4096], text[32];
  int f, e, n, rc;
  long prev;

  *fd = -1;
  if ((rc = make_dirs(dir, err)) != 0)
    return rc;
  snprintf(path, sizeof(path), "%s/lock", dir);
  f = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (f < 0)
    return ferry__seterr(err, ferry__err_from_errno(errno), "%s: open: %s",
                         path, strerror(errno));
  while (flock(f, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EINTR)
      continue;
    e = errno;
    prev = read_pid(f);
    close(f);
    if (e != EWOULDBLOCK)
      return ferry__seterr(err, ferry__err_from_errno(e), "%s: flock: %s", path,
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
    return ferry__seterr(err, ferry__err_from_errno(e), "%s: write: %s", path,
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
