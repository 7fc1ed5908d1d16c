/* Data roots: the directories a daemon may read datasets from
 * (--data-root, repeatable). A path is inside when its real path (every
 * symlink and `..` resolved) is a root or lies below one. With no root
 * configured every path is allowed (the loopback demo; the daemons warn).
 *
 * The dispatcher checks a spec's patterns before it expands them (so a
 * glob cannot probe for files outside the roots) and every file after;
 * the dispatcher's scan and the workers open each file through
 * ferry__roots_open_file, which checks again and opens without a race.
 */
#ifndef FERRY_ROOTS_H
#define FERRY_ROOTS_H

#include <stdbool.h>
#include <stddef.h>

#include "ferry/error.h"

typedef struct ferry_roots_s {
  char **dirs; /* real paths, without a trailing slash (except "/") */
  int *fds;    /* each root's directory, O_PATH: files open below it */
  size_t n;
} ferry_roots_t;

/* Resolves the roots in `list` (one per line, as FERRY_OPT_LIST keeps
 * them; NULL or "": none). Each must be an existing directory: otherwise
 * FERRY_EINVAL naming it. Returns 0 or the error; free with
 * ferry__roots_close either way. */
int ferry__roots_init(ferry_roots_t *r, const char *list, ferry_error_t *err);
void ferry__roots_close(ferry_roots_t *r);

/* True when no root is configured. */
bool ferry__roots_open(const ferry_roots_t *r);

/* Checks that `path` (an existing file) resolves inside a root: 0, or
 * FERRY_EACCES "PATH is outside every --data-root" (naming only the path
 * as given), or the errno of realpath (FERRY_ENOENT...). */
int ferry__roots_check(const ferry_roots_t *r, const char *path,
                       ferry_error_t *err);

/* Opens `path` for reading (O_RDONLY | O_CLOEXEC | O_NONBLOCK; the
 * caller checks that it is a regular file) into *fd, without a race:
 * the path's real path (symlinks and `..` resolved) must lie in a root,
 * and that real path is then opened below the root's directory
 * descriptor with openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS), or a
 * component walk with O_NOFOLLOW where the kernel lacks openat2. So
 * symlinks inside a root (to files in any root) work as before, while a
 * symlink swapped into the path between the check and the open is
 * refused (FERRY_EACCES, naming the path and the root) instead of
 * followed. Every read goes through this descriptor. Outside every root:
 * FERRY_EACCES as ferry__roots_check. With no root: a plain open(2). */
int ferry__roots_open_file(const ferry_roots_t *r, const char *path, int *fd,
                           ferry_error_t *err);

/* Test-only: false makes ferry__roots_open_file take the component walk
 * that stands in for openat2 on kernels without it. */
void ferry__roots_use_openat2(bool use);

/* Checks a glob pattern before it is expanded: its literal directory
 * part (up to the last '/' before the first wildcard) must resolve
 * inside a root. A directory that does not exist is refused the same way
 * as one outside the roots, so the answer tells nothing about what exists
 * outside them. */
int ferry__roots_check_pattern(const ferry_roots_t *r, const char *pattern,
                               ferry_error_t *err);

#endif /* FERRY_ROOTS_H */
