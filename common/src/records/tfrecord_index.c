/* DALI index files: one "<offset> <size>\n" line per record, size being
 * the whole framed record (16 framing bytes included). */
#include "tfrecord.h"

#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "alloc.h"

/* Appends one entry, growing the array geometrically. */
static int push(ferry_tfr_index_entry_t **v, size_t *n, size_t *cap,
                uint64_t offset, uint64_t size) {
  if (!ferry__grow(v, cap, *n + 1, sizeof(**v), 64))
    return FERRY_ENOMEM;
  (*v)[*n].offset = offset;
  (*v)[*n].size = size;
  (*n)++;
  return 0;
}

int ferry__tfr_index_build(const char *path, ferry_tfr_index_entry_t **out,
                           size_t *n, ferry_error_t *err) {
  ferry_tfr_options_t opts;
  ferry_tfr_reader_t *r;
  ferry_tfr_index_entry_t *v = NULL;
  size_t len = 0, cap = 0;
  ferry_record_t rec;
  int rc;

  *out = NULL;
  *n = 0;
  ferry__tfr_options_init(&opts);
  opts.max_record_len = UINT64_MAX; /* an index describes what is there */
  rc = ferry__tfr_reader_open(path, &opts, &r, err);
  if (rc != 0)
    return rc;
  if (ferry__tfr_reader_compression(r) != FERRY_COMPRESSION_NONE) {
    rc = ferry__seterr(
        err, FERRY_ENOTSUP,
        "%s: index files describe uncompressed TFRecord "
        "files, and this one is %s",
        path, ferry__compression_name(ferry__tfr_reader_compression(r)));
    ferry__tfr_reader_free(r);
    return rc;
  }
  while ((rc = ferry__tfr_reader_next(r, &rec, err)) == 0) {
    if (push(&v, &len, &cap, rec.offset, (uint64_t)rec.len + 16) != 0) {
      rc = ferry__seterr(err, FERRY_ENOMEM, "%s: out of memory", path);
      break;
    }
  }
  ferry__tfr_reader_free(r);
  if (rc != FERRY_EOF) {
    ferry__free(v);
    return rc;
  }
  *out = v;
  *n = len;
  return 0;
}

int ferry__tfr_index_write(const char *path,
                           const ferry_tfr_index_entry_t *entries, size_t n,
                           ferry_error_t *err) {
  FILE *f = fopen(path, "we");
  int code;

  if (f == NULL) {
    code = ferry__err_from_errno(errno);
    return ferry__seterr(err, code, "%s: open: %s", path, strerror(errno));
  }
  for (size_t i = 0; i < n; i++) {
    if (fprintf(f, "%" PRIu64 " %" PRIu64 "\n", entries[i].offset,
                entries[i].size) < 0)
      break;
  }
  code = ferror(f) ? errno : 0;
  if (fclose(f) != 0 && code == 0)
    code = errno != 0 ? errno : EIO;
  if (code != 0)
    return ferry__seterr(err, ferry__err_from_errno(code), "%s: write: %s",
                         path, strerror(code));
  return 0;
}

/* Parses a decimal uint64 at *p (digits only); advances *p. */
static bool parse_u64(const char **p, const char *end, uint64_t *out) {
  const char *s = *p;
  uint64_t v = 0;
  if (s == end || *s < '0' || *s > '9')
    return false;
  while (s < end && *s >= '0' && *s <= '9') {
    unsigned d = (unsigned)(*s - '0');
    if (v > (UINT64_MAX - d) / 10)
      return false;
    v = v * 10 + d;
    s++;
  }
  *p = s;
  *out = v;
  return true;
}

/* Reads all of `fd` (closed either way). */
static int read_all(int fd, const char *path, char **out, size_t *len,
                    ferry_error_t *err) {
  struct stat st;
  char *buf;
  size_t got = 0;
  int code;

  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return ferry__seterr(err, FERRY_EINVAL, "%s: not a regular file", path);
  }
  buf = ferry__malloc((size_t)st.st_size + 1);
  if (buf == NULL) {
    close(fd);
    return ferry__seterr(err, FERRY_ENOMEM, "%s: out of memory", path);
  }
  while (got < (size_t)st.st_size) {
    ssize_t k = read(fd, buf + got, (size_t)st.st_size - got);
    if (k < 0 && errno == EINTR)
      continue;
    if (k < 0) {
      code = ferry__err_from_errno(errno);
      ferry__seterr(err, code, "%s: read: %s", path, strerror(errno));
      close(fd);
      ferry__free(buf);
      return code;
    }
    if (k == 0)
      break;
    got += (size_t)k;
  }
  close(fd);
  buf[got] = '\0';
  *out = buf;
  *len = got;
  return 0;
}

int ferry__tfr_index_read(const char *path, ferry_tfr_index_entry_t **out,
                          size_t *n, ferry_error_t *err) {
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  *out = NULL;
  *n = 0;
  if (fd < 0) {
    int code = ferry__err_from_errno(errno);
    return ferry__seterr(err, code, "%s: open: %s", path, strerror(errno));
  }
  return ferry__tfr_index_read_fd(fd, path, out, n, err);
}

int ferry__tfr_index_read_fd(int fd, const char *path,
                             ferry_tfr_index_entry_t **out, size_t *n,
                             ferry_error_t *err) {
  ferry_tfr_index_entry_t *v = NULL;
  size_t len = 0, cap = 0, size = 0;
  char *text = NULL;
  const char *p, *end;
  uint64_t line = 0;
  int rc;

  *out = NULL;
  *n = 0;
  rc = read_all(fd, path, &text, &size, err);
  if (rc != 0)
    return rc;
  p = text;
  end = text + size;
  while (p < end) {
    const char *eol = memchr(p, '\n', (size_t)(end - p));
    const char *q = p;
    uint64_t off, sz;
    if (eol == NULL)
      eol = end; /* the last line may lack its newline */
    line++;
    /* "<offset> <size>", blanks between and around, CR tolerated. */
    while (q < eol && (*q == ' ' || *q == '\t'))
      q++;
    if (!parse_u64(&q, eol, &off) || q == eol || (*q != ' ' && *q != '\t'))
      goto bad;
    while (q < eol && (*q == ' ' || *q == '\t'))
      q++;
    if (!parse_u64(&q, eol, &sz))
      goto bad;
    while (q < eol && (*q == ' ' || *q == '\t' || *q == '\r'))
      q++;
    if (q != eol)
      goto bad;
    if (sz < 16) {
      rc = ferry__seterr(err, FERRY_EINDEX,
                         "%s: line %" PRIu64 ": record size %" PRIu64
                         " is under the 16 framing bytes",
                         path, line, sz);
      goto fail;
    }
    if (push(&v, &len, &cap, off, sz) != 0) {
      rc = ferry__seterr(err, FERRY_ENOMEM, "%s: out of memory", path);
      goto fail;
    }
    p = eol < end ? eol + 1 : end;
  }
  ferry__free(text);
  *out = v;
  *n = len;
  return 0;

bad: {
  const char *eol = memchr(p, '\n', (size_t)(end - p));
  int shown = (int)((eol != NULL ? eol : end) - p);
  if (shown > 60)
    shown = 60;
  rc = ferry__seterr(err, FERRY_EINDEX,
                     "%s: line %" PRIu64
                     ": expected \"<offset> <size>\", got \"%.*s\"",
                     path, line, shown, p);
}
fail:
  ferry__free(text);
  ferry__free(v);
  return rc;
}
