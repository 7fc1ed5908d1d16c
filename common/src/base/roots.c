/* Data roots (see ferry/roots.h). */
#include "ferry/roots.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ferry/alloc.h"

int ferry_roots_init(ferry_roots_t *r, const char *list, ferry_error_t *err) {
  memset(r, 0, sizeof(*r));
  if (list == NULL || list[0] == '\0')
    return 0;
  size_t lines = 1;
  for (const char *p = list; *p != '\0'; p++)
    lines += *p == '\n';
  if ((r->dirs = ferry__calloc(lines, sizeof(char *))) == NULL)
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
    r->n++;
    p += len + (nl != NULL);
  }
  return 0;
}

void ferry_roots_close(ferry_roots_t *r) {
  for (size_t i = 0; i < r->n; i++)
    ferry__free(r->dirs[i]);
  ferry__free(r->dirs);
  memset(r, 0, sizeof(*r));
}

bool ferry_roots_open(const ferry_roots_t *r) { return r == NULL || r->n == 0; }

/* True when the real path `real` is a root or below one. */
static bool inside(const ferry_roots_t *r, const char *real) {
  for (size_t i = 0; i < r->n; i++) {
    const char *d = r->dirs[i];
    size_t n = strlen(d);
    if (strcmp(d, "/") == 0)
      return true;
    if (strncmp(real, d, n) == 0 && (real[n] == '\0' || real[n] == '/'))
      return true;
  }
  return false;
}

int ferry_roots_check(const ferry_roots_t *r, const char *path,
                      ferry_error_t *err) {
  char real[PATH_MAX];
  if (ferry_roots_open(r))
    return 0;
  if (realpath(path, real) == NULL || !inside(r, real))
    return ferry__seterr(err, FERRY_EACCES,
                         "%s is outside every --data-root", path);
  return 0;
}

int ferry_roots_check_pattern(const ferry_roots_t *r, const char *pattern,
                              ferry_error_t *err) {
  char dir[PATH_MAX], real[PATH_MAX];
  if (ferry_roots_open(r))
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
