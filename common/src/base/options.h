/* One options table serves command-line flags, config files and --help
 * (Redis' config.c model). Each entry names a field of a settings struct
 * by offset; values are parsed, bounds-checked and stored there. */
#ifndef FERRY_OPTIONS_H
#define FERRY_OPTIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ferry/error.h"

typedef enum {
  FERRY_OPT_BOOL,   /* bool;      "true/false/1/0/yes/no"; --x, --no-x */
  FERRY_OPT_INT,    /* int64_t;   decimal, bounds min..max */
  FERRY_OPT_SIZE,   /* uint64_t;  with K/M/G/T suffix (powers of 1024) */
  FERRY_OPT_DOUBLE, /* double;    bounds min..max */
  FERRY_OPT_STRING, /* char *;    owned, freed by ferry__options_free */
  FERRY_OPT_ENUM,   /* int;       index into `choices` ("a|b|c") */
  FERRY_OPT_LIST    /* char *;    repeatable: each value is appended, one
                       per line; owned, freed by ferry__options_free */
} ferry_opt_type_t;

typedef struct ferry_option_s {
  const char *name; /* long flag and config key, e.g. "buffer-bytes" */
  ferry_opt_type_t type;
  size_t offset;       /* offsetof(settings struct, field) */
  const char *def;     /* default, in text form (NULL: empty/0) */
  double min, max;     /* bounds for INT, SIZE and DOUBLE (both 0: none) */
  const char *choices; /* ENUM: "none|gzip|zlib" */
  const char *help;
} ferry_option_t;

/* Sets every field to its default. */
int ferry__options_defaults(const ferry_option_t *t, size_t n, void *base,
                            ferry_error_t *err);

/* Sets one option by name from text. FERRY_EOPTION naming the option and
 * the bound or choice on failure. */
int ferry__options_set(const ferry_option_t *t, size_t n, void *base,
                       const char *name, const char *value, ferry_error_t *err);

/* Parses "--name=value", "--name value", "--flag" and "--no-flag" from
 * argv[0..argc). Arguments that are not options are moved, in order, to
 * the front of argv and their count stored in *n_positional. "--" ends
 * option parsing. Unknown options are errors. */
int ferry__options_parse_argv(const ferry_option_t *t, size_t n, void *base,
                              int argc, char **argv, int *n_positional,
                              ferry_error_t *err);

/* Parses a config file of "name = value" lines ('#' starts a comment).
 * Errors name the file and line. */
int ferry__options_parse_file(const ferry_option_t *t, size_t n, void *base,
                              const char *path, ferry_error_t *err);

/* Prints one line per option: flag, type, default, bounds and help. */
void ferry__options_help(const ferry_option_t *t, size_t n, FILE *out);

/* Frees the strings the table stored in `base`. */
void ferry__options_free(const ferry_option_t *t, size_t n, void *base);

/* Parses sizes like "64M" or "1.5G" (exported for other parsers). */
int ferry__parse_size(const char *s, uint64_t *out);

#endif /* FERRY_OPTIONS_H */
