/* Tests of the options table (defaults, flags, config files, bounds) and
 * of the HOST:PORT parser the options that take addresses use. */
#include <criterion/criterion.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "alloc.h"
#include "hostport.h"
#include "options.h"

struct settings {
  bool verbose;
  int64_t threads;
  uint64_t buffer;
  double ratio;
  char *name;
  int mode;
};

static const ferry_option_t table[] = {
    {"verbose", FERRY_OPT_BOOL, offsetof(struct settings, verbose), "false",
     0, 0, NULL, "log more"},
    {"threads", FERRY_OPT_INT, offsetof(struct settings, threads), "4", 1, 64,
     NULL, "pipeline threads"},
    {"buffer-bytes", FERRY_OPT_SIZE, offsetof(struct settings, buffer), "64M",
     0, 0, NULL, "chunk buffer"},
    {"ratio", FERRY_OPT_DOUBLE, offsetof(struct settings, ratio), "0.5", 0, 1,
     NULL, "a fraction"},
    {"name", FERRY_OPT_STRING, offsetof(struct settings, name), "ferry", 0, 0,
     NULL, "a name"},
    {"mode", FERRY_OPT_ENUM, offsetof(struct settings, mode), "gzip", 0, 0,
     "none|gzip|zlib", "compression"},
};
#define N (sizeof(table) / sizeof(table[0]))

Test(options, defaults) {
  struct settings s = {0};
  cr_assert_eq(ferry__options_defaults(table, N, &s, NULL), 0);
  cr_assert_eq(s.verbose, false);
  cr_assert_eq(s.threads, 4);
  cr_assert_eq(s.buffer, 64u << 20);
  cr_assert_float_eq(s.ratio, 0.5, 1e-12);
  cr_assert_str_eq(s.name, "ferry");
  cr_assert_eq(s.mode, 1);
  ferry__options_free(table, N, &s);
  cr_assert_null(s.name);
}

Test(options, argv_forms_and_positionals) {
  struct settings s = {0};
  char *argv[] = {"file1", "--threads=8", "--buffer-bytes", "1.5G",
                  "--verbose", "--name", "x y", "file2", "--mode=zlib",
                  "--", "--not-an-option"};
  int npos = -1;
  ferry_error_t err;
  ferry__options_defaults(table, N, &s, NULL);
  cr_assert_eq(ferry__options_parse_argv(table, N, &s, 11, argv, &npos, &err),
               0, "%s", err.msg);
  cr_assert_eq(npos, 3);
  cr_assert_str_eq(argv[0], "file1");
  cr_assert_str_eq(argv[1], "file2");
  cr_assert_str_eq(argv[2], "--not-an-option");
  cr_assert_eq(s.threads, 8);
  cr_assert_eq(s.buffer, (uint64_t)(1.5 * 1024 * 1024 * 1024));
  cr_assert(s.verbose);
  cr_assert_str_eq(s.name, "x y");
  cr_assert_eq(s.mode, 2);
  char *argv2[] = {"--no-verbose"};
  cr_assert_eq(ferry__options_parse_argv(table, N, &s, 1, argv2, &npos, NULL),
               0);
  cr_assert_not(s.verbose);
  ferry__options_free(table, N, &s);
}

Test(options, errors_name_the_option) {
  struct settings s = {0};
  ferry_error_t err;
  ferry__options_defaults(table, N, &s, NULL);
  char *a1[] = {"--threads=0"};
  cr_assert_eq(ferry__options_parse_argv(table, N, &s, 1, a1, NULL, &err),
               FERRY_EOPTION);
  cr_assert(strstr(err.msg, "threads") && strstr(err.msg, "1..64"), "%s",
            err.msg);
  char *a2[] = {"--bogus"};
  cr_assert_eq(ferry__options_parse_argv(table, N, &s, 1, a2, NULL, &err),
               FERRY_EOPTION);
  cr_assert(strstr(err.msg, "--bogus"), "%s", err.msg);
  char *a3[] = {"--mode=lz4"};
  cr_assert_eq(ferry__options_parse_argv(table, N, &s, 1, a3, NULL, &err),
               FERRY_EOPTION);
  cr_assert(strstr(err.msg, "none|gzip|zlib"), "%s", err.msg);
  char *a4[] = {"--threads"};
  cr_assert_eq(ferry__options_parse_argv(table, N, &s, 1, a4, NULL, &err),
               FERRY_EOPTION);
  cr_assert(strstr(err.msg, "needs a value"), "%s", err.msg);
  char *a5[] = {"--buffer-bytes=12Q"};
  cr_assert_eq(ferry__options_parse_argv(table, N, &s, 1, a5, NULL, &err),
               FERRY_EOPTION);
  char *a6[] = {"--threads=7x"};
  cr_assert_eq(ferry__options_parse_argv(table, N, &s, 1, a6, NULL, &err),
               FERRY_EOPTION);
  cr_assert_eq(s.threads, 4, "a failed set leaves the old value");
  ferry__options_free(table, N, &s);
}

Test(options, config_file) {
  struct settings s = {0};
  ferry_error_t err;
  char path[] = "/tmp/ferry-opts-XXXXXX";
  int fd = mkstemp(path);
  FILE *f = fdopen(fd, "w");
  fputs("# a comment\n  threads = 16  \n\nname = worker-a # trailing\n"
        "ratio=0.25\n",
        f);
  fclose(f);
  ferry__options_defaults(table, N, &s, NULL);
  cr_assert_eq(ferry__options_parse_file(table, N, &s, path, &err), 0, "%s",
               err.msg);
  cr_assert_eq(s.threads, 16);
  cr_assert_str_eq(s.name, "worker-a");
  cr_assert_float_eq(s.ratio, 0.25, 1e-12);

  f = fopen(path, "w");
  fputs("threads = 2\nthreads 3\n", f);
  fclose(f);
  cr_assert_eq(ferry__options_parse_file(table, N, &s, path, &err),
               FERRY_EOPTION);
  cr_assert(strstr(err.msg, ":2:"), "message names the line: %s", err.msg);
  f = fopen(path, "w");
  fputs("ratio = 2\n", f);
  fclose(f);
  cr_assert_eq(ferry__options_parse_file(table, N, &s, path, &err),
               FERRY_EOPTION);
  cr_assert(strstr(err.msg, path) && strstr(err.msg, "ratio"), "%s",
            err.msg);
  unlink(path);
  cr_assert_eq(ferry__options_parse_file(table, N, &s, path, &err),
               FERRY_ENOENT);
  ferry__options_free(table, N, &s);
}

Test(options, help_lists_everything) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  ferry__options_help(table, N, f);
  fclose(f);
  cr_assert(strstr(buf, "--threads N") && strstr(buf, "[1..64]") &&
                strstr(buf, "(default 64M)") && strstr(buf, "none|gzip|zlib"),
            "%s", buf);
  free(buf);
}

Test(options, parse_size) {
  uint64_t v;
  cr_assert_eq(ferry__parse_size("4096", &v), 0);
  cr_assert_eq(v, 4096);
  cr_assert_eq(ferry__parse_size("2KiB", &v), 0);
  cr_assert_eq(v, 2048);
  cr_assert_eq(ferry__parse_size("1g", &v), 0);
  cr_assert_eq(v, 1u << 30);
  cr_assert_eq(ferry__parse_size("-1", &v), FERRY_EINVAL);
  cr_assert_eq(ferry__parse_size("", &v), FERRY_EINVAL);
}

/* A repeatable option (--data-root) keeps every value, one per line. */
Test(options, list_option_keeps_every_value) {
  struct lsettings {
    char *roots;
  } s = {0};
  static const ferry_option_t lt[] = {
      {"data-root", FERRY_OPT_LIST, offsetof(struct lsettings, roots), NULL,
       0, 0, NULL, "a root"},
  };
  cr_assert_eq(ferry__options_defaults(lt, 1, &s, NULL), 0);
  cr_assert_null(s.roots);
  cr_assert_eq(ferry__options_set(lt, 1, &s, "data-root", "/a", NULL), 0);
  cr_assert_eq(ferry__options_set(lt, 1, &s, "data-root", "/b c", NULL), 0);
  cr_assert_str_eq(s.roots, "/a\n/b c");
  ferry__options_free(lt, 1, &s);
  cr_assert_null(s.roots);
}

/* --help printed --snapshot-bytes' range as [0..1.12589990684262e+15]:
 * integer bounds print as integers, byte sizes with an exact binary unit,
 * in --help and in the out-of-range error alike. */
Test(options, bounds_print_as_integers_and_sizes) {
  struct bsettings {
    int64_t big;
    uint64_t bytes, odd;
  } s = {0};
  static const ferry_option_t bt[] = {
      {"big", FERRY_OPT_INT, offsetof(struct bsettings, big), "0", 0,
       4294967296.0, NULL, "an integer"},
      {"snapshot-bytes", FERRY_OPT_SIZE, offsetof(struct bsettings, bytes),
       "0", 0, (double)(1ull << 50), NULL, "a size"},
      {"odd", FERRY_OPT_SIZE, offsetof(struct bsettings, odd), "1000", 1000,
       (double)(3ull << 20), NULL, "a size"},
  };
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  ferry__options_help(bt, 3, f);
  fclose(f);
  cr_assert(strstr(buf, "[0..4294967296]") != NULL, "%s", buf);
  cr_assert(strstr(buf, "[0..1 PiB]") != NULL, "%s", buf);
  cr_assert(strstr(buf, "[1000..3 MiB]") != NULL, "%s", buf);
  cr_assert(strstr(buf, "e+") == NULL, "%s", buf);
  free(buf);
  ferry_error_t err = {0};
  cr_assert_eq(ferry__options_defaults(bt, 3, &s, &err), 0);
  cr_assert_eq(ferry__options_set(bt, 3, &s, "snapshot-bytes", "2048T", &err),
               FERRY_EOPTION);
  cr_assert(strstr(err.msg, "2 PiB is outside 0..1 PiB") != NULL, "%s",
            err.msg);
  cr_assert_eq(ferry__options_set(bt, 3, &s, "big", "5000000000", &err),
               FERRY_EOPTION);
  cr_assert(strstr(err.msg, "5000000000 is outside 0..4294967296") != NULL,
            "%s", err.msg);
}

/* The same on the real ferry-dispatcher --help (the test above uses a
 * table of its own; the dispatcher's flag is an INT, not a SIZE): the
 * --snapshot-bytes range is an integer (or an exact binary size), and no
 * bound of any flag prints in e+ notation. FERRY_IT_DISPATCHER names
 * another binary. */
Test(options, dispatcher_help_prints_snapshot_bytes_range_as_an_integer) {
  const char *bin = getenv("FERRY_IT_DISPATCHER");
  char cmd[1024];
  snprintf(cmd, sizeof(cmd), "%s --help 2>&1",
           bin != NULL && *bin != '\0'
               ? bin
               : FERRY_BINARY_DIR "/dispatcher/ferry-dispatcher");
  FILE *p = popen(cmd, "r");
  cr_assert_not_null(p, "%s", cmd);
  static char out[1 << 16];
  size_t n = fread(out, 1, sizeof(out) - 1, p);
  out[n] = '\0';
  int st = pclose(p);
  cr_assert_eq(st, 0, "%s: status %d:\n%s", cmd, st, out);
  const char *line = strstr(out, "\n  --snapshot-bytes ");
  cr_assert_not_null(line, "no --snapshot-bytes in --help:\n%s", out);
  line++;
  size_t len = strcspn(line, "\n");
  char *l = strndup(line, len);
  cr_assert_not_null(l);
  const char *open = strstr(l, " [0..");
  cr_assert_not_null(open, "no range: %s", l);
  char range[64] = "";
  cr_assert_eq(sscanf(open, " [%63[^]]]", range), 1, "%s", l);
  cr_assert(strcmp(range, "0..1125899906842624") == 0 ||
                strcmp(range, "0..1 PiB") == 0,
            "--snapshot-bytes range [%s], not [0..1125899906842624] or "
            "[0..1 PiB]: %s", range, l);
  free(l);
  /* A digit, e+, a digit: a bound in %g's exponent notation. */
  for (const char *e = strstr(out, "e+"); e != NULL; e = strstr(e + 1, "e+"))
    cr_assert(e == out || e[-1] < '0' || e[-1] > '9' || e[2] < '0' ||
                  e[2] > '9',
              "e+ notation in --help: %.40s", e > out + 20 ? e - 20 : out);
}

/* ---- HOST:PORT (hostport.h) ---------------------------------------- */

static void addr_ok(const char *s, unsigned flags, const char *host,
                    int port) {
  char h[FERRY_HOST_MAX + 1];
  int p = -1;
  ferry_error_t err = {0};
  cr_assert_eq(ferry__hostport_parse(s, flags, h, sizeof(h), &p, &err), 0,
               "%s: %s", s, err.msg);
  cr_assert_str_eq(h, host, "%s", s);
  cr_assert_eq(p, port, "%s", s);
}

static void addr_bad(const char *s, unsigned flags, const char *says) {
  ferry_error_t err = {0};
  cr_assert_eq(ferry__hostport_parse(s, flags, NULL, 0, NULL, &err),
               FERRY_EINVAL, "'%s' was accepted", s ? s : "(null)");
  cr_assert(strstr(err.msg, says) != NULL, "'%s': %s", s ? s : "(null)",
            err.msg);
}

Test(hostport, accepts_host_port_and_bracketed_v6) {
  addr_ok("127.0.0.1:5050", 0, "127.0.0.1", 5050);
  addr_ok("dispatcher.example.com:1", 0, "dispatcher.example.com", 1);
  addr_ok("[::1]:65535", 0, "::1", 65535);
  addr_ok("[fe80::1%eth0]:80", 0, "fe80::1%eth0", 80);
  addr_ok("worker-3", FERRY_HOSTPORT_PORT_OPTIONAL, "worker-3", 0);
  addr_ok("[::1]", FERRY_HOSTPORT_PORT_OPTIONAL, "::1", 0);
  addr_ok("10.0.0.2:5051", FERRY_HOSTPORT_PORT_OPTIONAL, "10.0.0.2", 5051);
}

/* The report's cases: no port dialed port 0, :99999 dialed 34463, ''
 * printed gRPC internals. */
Test(hostport, refuses_what_grpc_would_misread) {
  addr_bad("127.0.0.2", 0, "has no port: give HOST:PORT, e.g. "
                           "127.0.0.2:5050");
  addr_bad("127.0.0.1:99999", 0, "port 99999 is out of range: give a port "
                                 "from 1 to 65535");
  addr_bad("127.0.0.1:0", 0, "out of range");
  addr_bad("", 0, "empty address");
  addr_bad(NULL, 0, "empty address");
  addr_bad(":5050", 0, "has no host");
  addr_bad("127.0.0.1:", 0, "empty port");
  addr_bad("127.0.0.1:50x", 0, "not a number");
  addr_bad("::1:5050", 0, "in brackets, e.g. [::1]:5050");
  addr_bad("[::1:5050", 0, "no closing ']'");
  addr_bad("[::1]5050", 0, "expected ':PORT'");
  addr_bad("http://h:5050", 0, "without a scheme");
  addr_bad("h st:5050", 0, "not a host name");
  addr_bad("[::1]", 0, "has no port");
  addr_bad("", FERRY_HOSTPORT_PORT_OPTIONAL, "give HOST or HOST:PORT");
}
