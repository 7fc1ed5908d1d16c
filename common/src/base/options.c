#include "options.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"

static const ferry_option_t *find(const ferry_option_t *t, size_t n,
                                  const char *name, size_t len) {
  for (size_t i = 0; i < n; i++)
    if (strlen(t[i].name) == len && strncmp(t[i].name, name, len) == 0)
      return &t[i];
  return NULL;
}

static int has_bounds(const ferry_option_t *o) {
  return o->min != 0 || o->max != 0;
}

int ferry__parse_size(const char *s, uint64_t *out) {
  char *end;
  double v, mult = 1;
  errno = 0;
  v = strtod(s, &end);
  if (end == s || errno != 0 || v < 0 || isnan(v))
    return FERRY_EINVAL;
  switch (toupper((unsigned char)*end)) {
  case 'K': mult = 1024.0; end++; break;
  case 'M': mult = 1024.0 * 1024; end++; break;
  case 'G': mult = 1024.0 * 1024 * 1024; end++; break;
  case 'T': mult = 1024.0 * 1024 * 1024 * 1024; end++; break;
  default: break;
  }
  if (*end == 'i' || *end == 'B')
    end += *end == 'i' && end[1] == 'B' ? 2 : 1;
  if (*end != '\0' || v * mult >= 18446744073709551615.0)
    return FERRY_EINVAL;
  *out = (uint64_t)(v * mult);
  return 0;
}

static int parse_bool(const char *s, bool *out) {
  static const char *const yes[] = {"1", "true", "yes", "on"};
  static const char *const no[] = {"0", "false", "no", "off"};
  for (size_t i = 0; i < 4; i++) {
    if (strcasecmp(s, yes[i]) == 0) {
      *out = true;
      return 0;
    }
    if (strcasecmp(s, no[i]) == 0) {
      *out = false;
      return 0;
    }
  }
  return FERRY_EINVAL;
}

/* Finds `value` in "a|b|c"; returns its index or -1. */
static int choice_index(const char *choices, const char *value) {
  size_t len = strlen(value);
  int i = 0;
  for (const char *p = choices; p != NULL; i++) {
    const char *bar = strchr(p, '|');
    size_t n = bar != NULL ? (size_t)(bar - p) : strlen(p);
    if (n == len && strncmp(p, value, n) == 0)
      return i;
    p = bar != NULL ? bar + 1 : NULL;
  }
  return -1;
}

/* Formats bound or value `v` of option `o` the way users write it:
 * integers as integers, sizes as bytes with a binary unit when exact
 * ("1 PiB", "256 MiB"; %g printed 2^50 as 1.12589990684262e+15). */
static const char *fmt_bound(const ferry_option_t *o, double v, char *buf,
                             size_t cap) {
  static const char *const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB",
                                      "EiB"};
  bool integral = o->type == FERRY_OPT_INT || o->type == FERRY_OPT_SIZE;
  if (!integral || v != floor(v) || fabs(v) >= 9.2e18) {
    snprintf(buf, cap, "%.15g", v);
    return buf;
  }
  long long x = (long long)v;
  if (o->type == FERRY_OPT_SIZE && x >= 1024) {
    int u = -1;
    while (x % 1024 == 0 && x >= 1024 && u + 1 < 6) {
      x /= 1024;
      u++;
    }
    if (u >= 0) {
      snprintf(buf, cap, "%lld %s", x, units[u]);
      return buf;
    }
  }
  snprintf(buf, cap, "%lld", (long long)v);
  return buf;
}

static int out_of_bounds(const ferry_option_t *o, double v,
                         ferry_error_t *err) {
  char a[48], b[48], c[48];
  if (!has_bounds(o) || (v >= o->min && v <= o->max))
    return 0;
  if (o->type == FERRY_OPT_DOUBLE)
    snprintf(a, sizeof(a), "%.17g", v);
  else
    fmt_bound(o, v, a, sizeof(a));
  return ferry__seterr(err, FERRY_EOPTION, "option '%s': %s is outside %s..%s",
                       o->name, a, fmt_bound(o, o->min, b, sizeof(b)),
                       fmt_bound(o, o->max, c, sizeof(c)));
}

static int set_one(const ferry_option_t *o, void *base, const char *value,
                   ferry_error_t *err) {
  char *field = (char *)base + o->offset;
  char *end;
  const char *v = value != NULL ? value : "";
  int rc;

  switch (o->type) {
  case FERRY_OPT_BOOL: {
    bool b;
    if (parse_bool(v, &b) != 0)
      return ferry__seterr(err, FERRY_EOPTION,
                           "option '%s': expected true or false, got '%s'",
                           o->name, v);
    *(bool *)field = b;
    return 0;
  }
  case FERRY_OPT_INT: {
    long long x;
    errno = 0;
    x = strtoll(v, &end, 0);
    if (*v == '\0' || *end != '\0' || errno != 0)
      return ferry__seterr(err, FERRY_EOPTION,
                           "option '%s': expected an integer, got '%s'",
                           o->name, v);
    if ((rc = out_of_bounds(o, (double)x, err)) != 0)
      return rc;
    *(int64_t *)field = x;
    return 0;
  }
  case FERRY_OPT_SIZE: {
    uint64_t x;
    if (ferry__parse_size(v, &x) != 0)
      return ferry__seterr(err, FERRY_EOPTION,
                           "option '%s': expected a size like 64M, got '%s'",
                           o->name, v);
    if ((rc = out_of_bounds(o, (double)x, err)) != 0)
      return rc;
    *(uint64_t *)field = x;
    return 0;
  }
  case FERRY_OPT_DOUBLE: {
    double x;
    errno = 0;
    x = strtod(v, &end);
    if (*v == '\0' || *end != '\0' || errno != 0 || isnan(x))
      return ferry__seterr(err, FERRY_EOPTION,
                           "option '%s': expected a number, got '%s'",
                           o->name, v);
    if ((rc = out_of_bounds(o, x, err)) != 0)
      return rc;
    *(double *)field = x;
    return 0;
  }
  case FERRY_OPT_STRING: {
    char *copy = value != NULL ? ferry__strdup(value) : NULL;
    if (value != NULL && copy == NULL)
      return ferry__seterr(err, FERRY_ENOMEM, "option '%s': out of memory",
                           o->name);
    ferry__free(*(char **)field);
    *(char **)field = copy;
    return 0;
  }
  case FERRY_OPT_LIST: {
    char **list = (char **)field;
    if (value == NULL) {
      ferry__free(*list);
      *list = NULL;
      return 0;
    }
    size_t old = *list != NULL ? strlen(*list) : 0, add = strlen(value);
    char *grown = ferry__realloc(*list, old + add + 2);
    if (grown == NULL)
      return ferry__seterr(err, FERRY_ENOMEM, "option '%s': out of memory",
                           o->name);
    if (old > 0)
      grown[old++] = '\n';
    memcpy(grown + old, value, add + 1);
    *list = grown;
    return 0;
  }
  case FERRY_OPT_ENUM: {
    int i = choice_index(o->choices, v);
    if (i < 0)
      return ferry__seterr(err, FERRY_EOPTION,
                           "option '%s': expected one of %s, got '%s'",
                           o->name, o->choices, v);
    *(int *)field = i;
    return 0;
  }
  }
  return ferry__seterr(err, FERRY_EINVAL, "option '%s': bad table entry",
                       o->name);
}

int ferry__options_defaults(const ferry_option_t *t, size_t n, void *base,
                            ferry_error_t *err) {
  for (size_t i = 0; i < n; i++) {
    const char *def = t[i].def;
    int rc;
    if (def == NULL) {
      if (t[i].type == FERRY_OPT_STRING || t[i].type == FERRY_OPT_LIST) {
        ferry__free(*(char **)((char *)base + t[i].offset));
        *(char **)((char *)base + t[i].offset) = NULL;
        continue;
      }
      def = t[i].type == FERRY_OPT_BOOL ? "false" : "0";
      if (t[i].type == FERRY_OPT_ENUM) {
        *(int *)((char *)base + t[i].offset) = 0;
        continue;
      }
    }
    if ((rc = set_one(&t[i], base, def, err)) != 0)
      return rc;
  }
  return 0;
}

int ferry__options_set(const ferry_option_t *t, size_t n, void *base,
                       const char *name, const char *value,
                       ferry_error_t *err) {
  const ferry_option_t *o = find(t, n, name, strlen(name));
  if (o == NULL)
    return ferry__seterr(err, FERRY_EOPTION, "unknown option '%s'", name);
  return set_one(o, base, value, err);
}

int ferry__options_parse_argv(const ferry_option_t *t, size_t n, void *base,
                              int argc, char **argv, int *n_positional,
                              ferry_error_t *err) {
  int npos = 0;
  int only_positional = 0;

  for (int i = 0; i < argc; i++) {
    char *arg = argv[i];
    const char *name, *eq, *value = NULL;
    const ferry_option_t *o;
    size_t len;
    int rc;

    if (only_positional || strncmp(arg, "--", 2) != 0 || arg[2] == '\0') {
      if (!only_positional && strcmp(arg, "--") == 0) {
        only_positional = 1;
        continue;
      }
      argv[npos++] = arg;
      continue;
    }
    name = arg + 2;
    eq = strchr(name, '=');
    len = eq != NULL ? (size_t)(eq - name) : strlen(name);
    o = find(t, n, name, len);
    if (o == NULL && eq == NULL && strncmp(name, "no-", 3) == 0) {
      o = find(t, n, name + 3, len - 3);
      if (o != NULL && o->type == FERRY_OPT_BOOL) {
        *(bool *)((char *)base + o->offset) = false;
        continue;
      }
      o = NULL;
    }
    if (o == NULL)
      return ferry__seterr(err, FERRY_EOPTION, "unknown option '--%.*s'",
                           (int)len, name);
    if (eq != NULL) {
      value = eq + 1;
    } else if (o->type == FERRY_OPT_BOOL) {
      value = "true";
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return ferry__seterr(err, FERRY_EOPTION, "option '--%s' needs a value",
                           o->name);
    }
    if ((rc = set_one(o, base, value, err)) != 0)
      return rc;
  }
  if (n_positional != NULL)
    *n_positional = npos;
  return 0;
}

static char *trim(char *s) {
  char *end;
  while (isspace((unsigned char)*s))
    s++;
  end = s + strlen(s);
  while (end > s && isspace((unsigned char)end[-1]))
    *--end = '\0';
  return s;
}

int ferry__options_parse_file(const ferry_option_t *t, size_t n, void *base,
                              const char *path, ferry_error_t *err) {
  FILE *f = fopen(path, "r");
  char *line = NULL;
  size_t cap = 0;
  int lineno = 0, rc = 0;

  if (f == NULL)
    return ferry__seterr(err, ferry__err_from_errno(errno), "%s: %s", path,
                         strerror(errno));
  while (getline(&line, &cap, f) != -1) {
    char *s, *eq, *hash;
    lineno++;
    if ((hash = strchr(line, '#')) != NULL)
      *hash = '\0';
    s = trim(line);
    if (*s == '\0')
      continue;
    eq = strchr(s, '=');
    if (eq == NULL) {
      rc = ferry__seterr(err, FERRY_EOPTION,
                         "%s:%d: expected 'name = value'", path, lineno);
      break;
    }
    *eq = '\0';
    if ((rc = ferry__options_set(t, n, base, trim(s), trim(eq + 1), err)) !=
        0) {
      ferry__prefixerr(err, "%s:%d", path, lineno);
      break;
    }
  }
  free(line); /* allocated by getline(3), not by the wrapper */
  fclose(f);
  return rc;
}

static const char *type_hint(const ferry_option_t *o) {
  switch (o->type) {
  case FERRY_OPT_BOOL: return "";
  case FERRY_OPT_INT: return " N";
  case FERRY_OPT_SIZE: return " BYTES";
  case FERRY_OPT_DOUBLE: return " X";
  case FERRY_OPT_STRING: return " STR";
  case FERRY_OPT_ENUM: return " CHOICE";
  case FERRY_OPT_LIST: return " STR (repeatable)";
  }
  return "";
}

void ferry__options_help(const ferry_option_t *t, size_t n, FILE *out) {
  for (size_t i = 0; i < n; i++) {
    const ferry_option_t *o = &t[i];
    char flag[64];
    snprintf(flag, sizeof(flag), "--%s%s", o->name, type_hint(o));
    fprintf(out, "  %-26s %s", flag, o->help != NULL ? o->help : "");
    if (o->type == FERRY_OPT_ENUM)
      fprintf(out, " (%s)", o->choices);
    if (has_bounds(o)) {
      char lo[48], hi[48];
      fprintf(out, " [%s..%s]", fmt_bound(o, o->min, lo, sizeof(lo)),
              fmt_bound(o, o->max, hi, sizeof(hi)));
    }
    if (o->def != NULL && o->def[0] != '\0')
      fprintf(out, " (default %s)", o->def);
    fputc('\n', out);
  }
}

void ferry__options_free(const ferry_option_t *t, size_t n, void *base) {
  for (size_t i = 0; i < n; i++) {
    if (t[i].type == FERRY_OPT_STRING || t[i].type == FERRY_OPT_LIST) {
      char **field = (char **)((char *)base + t[i].offset);
      ferry__free(*field);
      *field = NULL;
    }
  }
}
