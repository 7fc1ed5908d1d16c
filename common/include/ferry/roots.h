/* Data roots: the directories a daemon may read datasets from
 * (--data-root, repeatable). A path is inside when its real path (every
 * symlink and `..` resolved) is a root or lies below one. With no root
 * configured every path is allowed (the loopback demo; the daemons warn).
 *
 * The dispatcher checks a spec's patterns before it expands them (so a
 * glob cannot probe for files outside the roots) and every file after;
 * workers check each file again before they open it.
 */
#ifndef FERRY_ROOTS_H
#define FERRY_ROOTS_H

#include <stdbool.h>
#include <stddef.h>

#include "ferry/error.h"

typedef struct ferry_roots_s {
  char **dirs; /* real paths, without a trailing slash (except "/") */
  size_t n;
} ferry_roots_t;

/* Resolves the roots in `list` (one per line, as FERRY_OPT_LIST keeps
 * them; NULL or "": none). Each must be an existing directory: otherwise
 * FERRY_EINVAL naming it. Returns 0 or the error; free with
 * ferry_roots_close either way. */
int ferry_roots_init(ferry_roots_t *r, const char *list, ferry_error_t *err);
void ferry_roots_close(ferry_roots_t *r);

/* True when no root is configured. */
bool ferry_roots_open(const ferry_roots_t *r);

/* Checks that `path` (an existing file) resolves inside a root: 0, or
 * FERRY_EACCES "PATH is outside every --data-root" (naming only the path
 * as given), or the errno of realpath (FERRY_ENOENT...). */
int ferry_roots_check(const ferry_roots_t *r, const char *path,
                      ferry_error_t *err);

/* Checks a glob pattern before it is expanded: its literal directory
 * part (up to the last '/' before the first wildcard) must resolve
 * inside a root. A directory that does not exist is refused the same way
 * as one outside the roots, so the answer tells nothing about what exists
 * outside them. */
int ferry_roots_check_pattern(const ferry_roots_t *r, const char *pattern,
                              ferry_error_t *err);

#endif /* FERRY_ROOTS_H */
