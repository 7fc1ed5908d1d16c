/* The shipped configuration and the README agree with the daemons'
 * flags: every credential deploy/systemd/dispatcher.env names under
 * /run/credentials/ is also in its LoadCredential= list (status.token was
 * missing, so --status-token-file pointed at a file systemd never
 * copied), and the README's TLS cluster example configures an admin
 * token (without one, drain and cancel are refused to everyone there). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"

static char *slurp(const char *rel) {
  char path[1024];
  snprintf(path, sizeof(path), "%s/%s", FERRY_SOURCE_DIR, rel);
  FILE *f = fopen(path, "rb");
  cr_assert_not_null(f, "cannot open %s", path);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = ferry__malloc((size_t)n + 1);
  cr_assert_not_null(buf);
  size_t got = fread(buf, 1, (size_t)n, f);
  buf[got] = '\0';
  fclose(f);
  return buf;
}

Test(docs, dispatcher_env_loads_every_credential_it_names) {
  static const char dir[] = "/run/credentials/ferry-dispatcher.service/";
  char *env = slurp("deploy/systemd/dispatcher.env");
  int checked = 0;
  for (const char *p = strstr(env, dir); p != NULL;
       p = strstr(p + 1, dir)) {
    const char *name = p + strlen(dir);
    size_t n = strcspn(name, " \t\n\"");
    char want[160];
    snprintf(want, sizeof(want), "LoadCredential=%.*s:", (int)n, name);
    cr_assert(strstr(env, want) != NULL,
              "dispatcher.env names %s%.*s but has no '%s' line", dir, (int)n,
              name, want);
    checked++;
  }
  cr_assert_geq(checked, 6, "only %d credentials found", checked);
  ferry__free(env);
}

Test(docs, readme_tls_example_has_an_admin_token) {
  char *readme = slurp("README.md");
  const char *ex = strstr(readme, "ferry-dispatcher --work-dir /var/lib/ferry \\\n"
                                  "  --tls-cert");
  cr_assert_not_null(ex, "the README's TLS example moved");
  const char *end = strstr(ex, "```");
  cr_assert_not_null(end);
  const char *admin = strstr(ex, "--admin-token-file");
  cr_assert(admin != NULL && admin < end,
            "the README's TLS example starts the dispatcher without "
            "--admin-token-file: drain and cancel are refused there");
  ferry__free(readme);
}
