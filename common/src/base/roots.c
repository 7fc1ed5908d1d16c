/* Data roots (see roots.h). */
#include "roots.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/openat2.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "alloc.h"

int ferry__roots_init(ferry_roots_t *r, const char *list, ferry_error_t *err) {
  memset(r, 0, sizeof(*r));
  if (list == NULL || list[0] == '\0')
    return 0;
  size_t lines = 1;
  for (const char *p = list; *p != '\0'; p++)
    lines += *p == '\n';
  if ((r->dirs = ferry__calloc(lines, sizeof(char *))) == NULL ||
      (r->fds = ferry__malloc(lines * sizeof(int))) == NULL)
    return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
  const char *p = list;
  while (*p != '\0') {
    const char *nl = strchr(p, '\n');
    size_t len = nl != NULL ? (size_t)(nl - p) : strlen(p);
    char given[PATH_MAX], real[PATH_MAX];
    struct stat st;
    if (len == 0 || len >= sizeof(given))
      return ferry__seterr(err, FERRY_EINVAL,
                           "--data-root: an empty or overlong path");
    memcpy(given, p, len);
    given[len] = '\0';
    if (realpath(given, real) == NULL || stat(real, &st) != 0 ||
        !S_ISDIR(st.st_mode))
      return ferry__seterr(err, FERRY_EINVAL,
                           "--data-root %s: not an existing directory",
                           given);
    size_t rl = strlen(real);
    while (rl > 1 && real[rl - 1] == '/')
      real[--rl] = '\0';
    if ((r->dirs[r->n] = ferry__strdup(real)) == NULL)
      return ferry__seterr(err, FERRY_ENOMEM, "out of memory");
    /* Files are opened below this descriptor, not below the name: what
     * the name points to later cannot move a root. */
    r->fds[r->n] = open(real, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (r->fds[r->n] < 0) {
      int e = errno;
      ferry__free(r->dirs[r->n]);
      r->dirs[r->n] = NULL;
      return ferry__seterr(err, FERRY_EINVAL, "--data-root %s: open: %s",
                           given, strerror(e));
    }
    r->n++;
    p += len + (nl != NULL);
  }
  return 0;
}

void ferry__roots_close(ferry_roots_t *r) {
  for (size_t i = 0; i < r->n; i++) {
    ferry__free(r->dirs[i]);
    close(r->fds[i]);
  }
  ferry__free(r->dirs);
  ferry__free(r->fds);
  memset(r, 0, sizeof(*r));
}

bool ferry__roots_open(const ferry_roots_t *r) {
  return r == NULL || r->n == 0;
}

/* The root that the real path `real` is or lies below (-1: none); *rel
 * gets the part of `real` below it ("." for the root itself). */
static int root_of(const ferry_roots_t *r, const char *real,
                   const char **rel) {
  for (size_t i = 0; i < r->n; i++) {
    const char *d = r->dirs[i];
    size_t n = strcmp(d, "/") == 0 ? 0 : strlen(d);
    if (strncmp(real, d, n) == 0 && (real[n] == '\0' || real[n] == '/')) {
      *rel = real[n] == '\0' || real[n + 1] == '\0' ? "." : real + n + 1;
      return (int)i;
    }
  }
  return -1;
}

static bool inside(const ferry_roots_t *r, const char *real) {
  const char *rel;
  return root_of(r, real, &rel) >= 0;
}

/* Test-only: false makes every open take the fallback walk. */
static atomic_bool use_openat2 = true;

void ferry__roots_use_openat2(bool use) { atomic_store(&use_openat2, use); }

/* openat(2) one component at a time from `dirfd`, refusing every symlink
 * (O_NOFOLLOW) and every "..": the fallback for kernels before 5.6 (or
 * seccomp filters) without openat2. -1 with errno. */
static int walk_beneath(int dirfd, const char *rel, int flags) {
  char buf[PATH_MAX];
  char *save = NULL, *comp, *next;
  int cur = -1, fd;
  size_t n = strlen(rel);

  if (n >= sizeof(buf)) {
    errno = ENAMETOOLONG;
    return -1;
  }
  memcpy(buf, rel, n + 1);
  if (strcmp(buf, ".") == 0)
    return openat(dirfd, ".", flags);
  comp = strtok_r(buf, "/", &save);
  while (comp != NULL) {
    next = strtok_r(NULL, "/", &save);
    if (strcmp(comp, "..") == 0 || strcmp(comp, ".") == 0) {
      errno = EXDEV;
      fd = -1;
    } else if (next != NULL) {
      /* O_PATH | O_NOFOLLOW opens a symlink itself; O_DIRECTORY then
       * refuses it (ENOTDIR), so no directory is reached through one. */
      fd = openat(cur >= 0 ? cur : dirfd, comp,
                  O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    } else {
      fd = openat(cur >= 0 ? cur : dirfd, comp, flags | O_NOFOLLOW);
    }
    if (cur >= 0) {
      int e = errno;
      close(cur);
      errno = e;
    }
    if (fd < 0)
      return -1;
    cur = fd;
    comp = next;
  }
  return cur;
}

/* Opens `rel` below `dirfd` without following any symlink and without
 * leaving it: openat2 (RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS) where the
 * kernel has it, else the component walk. -1 with errno. */
static int open_beneath(int dirfd, const char *rel, int flags) {
  if (atomic_load(&use_openat2)) {
    struct open_how how;
    memset(&how, 0, sizeof(how));
    how.flags = (uint64_t)flags;
    how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
                  RESOLVE_NO_MAGICLINKS;
    for (int tries = 0; tries < 3; tries++) {
      long fd = syscall(SYS_openat2, dirfd, rel, &how, sizeof(how));
      if (fd >= 0)
        return (int)fd;
      /* EAGAIN: a concurrent rename the kernel could not rule out. */
      if (errno != EAGAIN)
        break;
    }
    if (errno != ENOSYS)
      return -1;
  }
  return walk_beneath(dirfd, rel, flags);
}

int ferry__roots_open_file(const ferry_roots_t *r, const char *path, int *fd,
                           ferry_error_t *err) {
  /* O_NONBLOCK: a FIFO or device named by a spec must not block the
   * thread in open(); callers refuse anything but a regular file. */
  const int flags = O_RDONLY | O_CLOEXEC | O_NONBLOCK;
  char real[PATH_MAX];
  const char *rel;
  int i, e;

  *fd = -1;
  if (ferry__roots_open(r)) {
    if ((*fd = open(path, flags)) >= 0)
      return 0;
    e = errno;
    return ferry__seterr(err, ferry__err_from_errno(e), "%s: open: %s", path,
                         strerror(e));
  }
  if (realpath(path, real) == NULL || (i = root_of(r, real, &rel)) < 0)
    return ferry__seterr(err, FERRY_EACCES,
                         "%s is outside every --data-root", path);
  /* The real path was checked; the file opened must be the one it names.
   * Resolving it again by name would follow a symlink swapped into it
   * meanwhile, so it is walked below the root's descriptor, where any
   * symlink (none was there a moment ago) is refused. */
  if ((*fd = open_beneath(r->fds[i], rel, flags)) >= 0)
    return 0;
  e = errno;
  if (e == ELOOP || e == EXDEV || e == ENOTDIR)
    return ferry__seterr(err, FERRY_EACCES,
                         "%s: its real path below --data-root %s changed "
                         "while it was opened (a symlink appeared in it); "
                         "refused",
                         path, r->dirs[i]);
  return ferry__seterr(err, ferry__err_from_errno(e), "%s: open: %s", path,
                       strerror(e));
}

int ferry__roots_check(const ferry_roots_t *r, const char *path,
                       ferry_error_t *err) {
  char real[PATH_MAX];
  if (ferry__roots_open(r))
    return 0;
  if (realpath(path, real) == NULL || !inside(r, real))
    return ferry__seterr(err, FERRY_EACCES,
                         "%s is outside every --data-root", path);
  return 0;
}

int ferry__roots_check_pattern(const ferry_roots_t *r, const char *pattern,
                               ferry_error_t *err) {
  char dir[PATH_MAX], real[PATH_MAX];
  if (ferry__roots_open(r))
    return 0;
  size_t wild = strcspn(pattern, "*?[{\\");
  size_t cut = 0;
  for (size_t i = 0; i < wild && pattern[i] != '\0'; i++)
    if (pattern[i] == '/')
      cut = i;
  if (pattern[0] != '/' || cut >= sizeof(dir))
    return ferry__seterr(err, FERRY_EACCES,
                         "%s is outside every --data-root (give an absolute "
                         "path inside one)", pattern);
  memcpy(dir, pattern, cut == 0 ? 1 : cut);
  dir[cut == 0 ? 1 : cut] = '\0';
  if (realpath(dir, real) == NULL || !inside(r, real))
    return ferry__seterr(err, FERRY_EACCES,
                         "%s is outside every --data-root", pattern);
  return 0;
}
