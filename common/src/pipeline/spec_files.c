/* A spec's file patterns expanded to the sorted list of files
 * (ferry__spec_expand_files): the only part of the spec that touches the
 * file system.
 */
#include "spec.h"

#include <errno.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "spec_internal.h"

/* glob(3)'s error callback has no user pointer: the failure is kept per
 * thread. Missing directories are "no match", not errors. */
static _Thread_local int glob_errno;
static _Thread_local char glob_errpath[256];

static int glob_error(const char *path, int eerrno) {
  if (eerrno == ENOENT || eerrno == ENOTDIR)
    return 0;
  glob_errno = eerrno;
  snprintf(glob_errpath, sizeof(glob_errpath), "%s", path);
  return 1;
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

void ferry__spec_free_files(char **files, size_t n) {
  size_t i;
  if (files == NULL)
    return;
  for (i = 0; i < n; i++)
    ferry__free(files[i]);
  ferry__free(files);
}

int ferry__spec_expand_files(const ferry_spec_t *spec, char ***files, size_t *n,
                             ferry_error_t *err) {
  char **out = NULL;
  size_t cnt = 0, cap = 0, i, j;
  int rc = 0;

  if (spec == NULL || files == NULL || n == NULL)
    return ferry__seterr(err, FERRY_EINVAL, "expand files: NULL argument");
  *files = NULL;
  *n = 0;
  if (spec->n_patterns == 0 || spec->patterns == NULL)
    return ferry__spec_err(err, "tfrecord: needs at least one file pattern");
  for (i = 0; i < spec->n_patterns && rc == 0; i++) {
    const char *pat = spec->patterns[i];
    glob_t g;
    size_t added = 0;
    int grc;

    memset(&g, 0, sizeof(g));
    glob_errno = 0;
    glob_errpath[0] = '\0';
    /* GLOB_MARK flags directories with a trailing '/' so they can be left
     * out: only files are records. */
    grc = glob(pat, GLOB_MARK, glob_error, &g);
    if (grc == GLOB_NOMATCH) {
      rc = ferry__seterr(err, FERRY_ENOENT,
                         "tfrecord: no file matches pattern '%.300s'", pat);
    } else if (grc == GLOB_NOSPACE) {
      rc = ferry__seterr(err, FERRY_ENOMEM,
                         "tfrecord: out of memory expanding '%.300s'", pat);
    } else if (grc != 0) {
      int e = glob_errno ? glob_errno : EIO;
      rc = ferry__seterr(err, ferry__err_from_errno(e),
                         "tfrecord: cannot read directory '%s' while "
                         "expanding '%.200s': %s",
                         glob_errpath, pat, strerror(e));
    }
    for (j = 0; rc == 0 && j < g.gl_pathc; j++) {
      const char *path = g.gl_pathv[j];
      size_t len = strlen(path);
      if (len > 0 && path[len - 1] == '/')
        continue;
      /* DALI index files (FILE.idx, `ferryctl records index`) sit next
       * to the shards and match their globs: never a shard. */
      if (len >= 4 && strcmp(path + len - 4, ".idx") == 0)
        continue;
      if (!FERRY__GROW(out, cap, cnt + 1, 16)) {
        rc = ferry__seterr(err, FERRY_ENOMEM,
                           "tfrecord: out of memory expanding patterns");
        break;
      }
      out[cnt] = ferry__strdup(path);
      if (out[cnt] == NULL) {
        rc = ferry__seterr(err, FERRY_ENOMEM,
                           "tfrecord: out of memory expanding patterns");
        break;
      }
      cnt++;
      added++;
    }
    if (rc == 0 && added == 0)
      rc = ferry__seterr(err, FERRY_ENOENT,
                         "tfrecord: pattern '%.300s' matches only "
                         "directories and .idx index files",
                         pat);
    globfree(&g);
  }
  if (rc != 0) {
    ferry__spec_free_files(out, cnt);
    return rc;
  }
  /* Byte order, not the locale's collation: the file list numbers the
   * splits, so every process must see the same order. */
  qsort(out, cnt, sizeof(char *), cmp_str);
  for (i = 0, j = 0; i < cnt; i++) {
    if (j > 0 && strcmp(out[j - 1], out[i]) == 0)
      ferry__free(out[i]);
    else
      out[j++] = out[i];
  }
  *files = out;
  *n = j;
  return 0;
}
