/* Helpers shared by ferryctl's subcommands: option parsing with --help,
 * JSON strings, byte formatting, a progress bar. */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "ctl.h"

int ferryctl_parse_options(const char *cmd, const char *usage,
                           const char *footer, const ferry_option_t *t,
                           size_t n, void *base, size_t help_offset,
                           int argc, char **argv, int *n_positional) {
  ferry_error_t err;
  ferry_error_clear(&err);
  *n_positional = 0;
  if (ferry__options_defaults(t, n, base, &err) < 0) {
    fprintf(stderr, "ferryctl %s: %s\n", cmd, err.msg);
    return FERRYCTL_EXIT_USAGE;
  }
  int rc =
      ferry__options_parse_argv(t, n, base, argc, argv, n_positional, &err);
  bool help = *(bool *)((char *)base + help_offset);
  /* A lone "-h" is not a long option, so it arrives as a positional. */
  for (int i = 0; rc == 0 && i < *n_positional; i++)
    if (strcmp(argv[i], "-h") == 0)
      help = true;
  if (rc == 0 && help) {
    fputs(usage, stdout);
    fputs("\nOptions:\n", stdout);
    ferry__options_help(t, n, stdout);
    if (footer != NULL)
      fputs(footer, stdout);
    return FERRYCTL_EXIT_OK;
  }
  if (rc < 0) {
    fprintf(stderr, "ferryctl %s: %s (see 'ferryctl %s --help')\n", cmd,
            err.msg[0] ? err.msg : ferry_strerror(rc), cmd);
    return FERRYCTL_EXIT_USAGE;
  }
  return FERRYCTL_CONTINUE;
}

/* Length of the valid UTF-8 sequence at s[0..len), or 0 if invalid. */
static size_t utf8_seq(const unsigned char *s, size_t len) {
  unsigned char c = s[0];
  size_t n;
  uint32_t cp;
  if (c < 0x80)
    return 1;
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
    cp = c & 0x1F;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    cp = c & 0x0F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    cp = c & 0x07;
  } else {
    return 0;
  }
  if (len < n)
    return 0;
  for (size_t i = 1; i < n; i++) {
    if ((s[i] & 0xC0) != 0x80)
      return 0;
    cp = (cp << 6) | (s[i] & 0x3F);
  }
  /* Overlong forms, surrogates and values past U+10FFFF are invalid. */
  if ((n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) ||
      (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF)
    return 0;
  return n;
}

void ferryctl_json_string(FILE *out, const void *s, size_t len) {
  const unsigned char *p = s;
  putc('"', out);
  for (size_t i = 0; i < len;) {
    unsigned char c = p[i];
    switch (c) {
    case '"':  fputs("\\\"", out); i++; continue;
    case '\\': fputs("\\\\", out); i++; continue;
    case '\n': fputs("\\n", out); i++; continue;
    case '\r': fputs("\\r", out); i++; continue;
    case '\t': fputs("\\t", out); i++; continue;
    default: break;
    }
    if (c < 0x20 || c == 0x7F) {
      fprintf(out, "\\u%04x", c);
      i++;
      continue;
    }
    size_t n = utf8_seq(p + i, len - i);
    if (n == 0) {
      fprintf(out, "\\u%04x", c);
      i++;
      continue;
    }
    fwrite(p + i, 1, n, out);
    i += n;
  }
  putc('"', out);
}

const char *ferryctl_human_bytes(uint64_t n, char *buf, size_t cap) {
  static const char *const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  if (n < 1024) {
    snprintf(buf, cap, "%llu B", (unsigned long long)n);
    return buf;
  }
  double v = (double)n / 1024.0;
  size_t u = 0;
  while (v >= 1024.0 && u + 1 < sizeof(units) / sizeof(units[0])) {
    v /= 1024.0;
    u++;
  }
  snprintf(buf, cap, "%.1f %s", v, units[u]);
  return buf;
}

double ferryctl_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void progress_draw(ferryctl_progress_t *p, uint64_t done, double now) {
  enum { WIDTH = 30 };
  double frac = p->total ? (double)done / (double)p->total : 1.0;
  if (frac > 1.0)
    frac = 1.0;
  int fill = (int)(frac * WIDTH);
  char bar[WIDTH + 1];
  for (int i = 0; i < WIDTH; i++)
    bar[i] = i < fill ? '#' : '.';
  bar[WIDTH] = '\0';
  double el = now - p->start;
  double rate = el > 0 ? (double)done / el : 0.0;
  fprintf(stderr, "\r%s [%s] %3d%% %llu/%llu  %.0f/s ", p->label, bar,
          (int)(frac * 100.0), (unsigned long long)done,
          (unsigned long long)p->total, rate);
  fflush(stderr);
  p->last_draw = now;
}

void ferryctl_progress_init(ferryctl_progress_t *p, const char *label,
                            uint64_t total, bool enabled) {
  p->enabled = enabled;
  p->label = label;
  p->total = total;
  p->start = ferryctl_now();
  p->last_draw = 0.0;
}

void ferryctl_progress_update(ferryctl_progress_t *p, uint64_t done) {
  if (!p->enabled)
    return;
  double now = ferryctl_now();
  if (now - p->last_draw >= 0.1)
    progress_draw(p, done, now);
}

void ferryctl_progress_finish(ferryctl_progress_t *p, uint64_t done) {
  if (!p->enabled)
    return;
  progress_draw(p, done, ferryctl_now());
  fputc('\n', stderr);
}
