/* Hosts in network namespaces (netns.h). */
#include "netns.h"

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

/* The networks of this process not destroyed yet: torn down at exit (a
 * failed assertion ends the test process). */
static hx_net_t *live[4];

static const char *ip_bin(void) {
  static const char *const paths[] = {"/usr/sbin/ip", "/sbin/ip",
                                      "/usr/bin/ip", "/bin/ip"};
  for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++)
    if (access(paths[i], X_OK) == 0)
      return paths[i];
  return NULL;
}

/* Runs a shell command (at most 10 s); returns its exit status (-1: did
 * not run), with its stderr's first line in `why` when it failed. */
static int sh(char *why, size_t why_len, const char *fmt, ...) {
  char cmd[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof(cmd), fmt, ap);
  va_end(ap);
  char *argv[] = {"/bin/sh", "-c", cmd, NULL};
  hx_run_t r;
  if (hx_run_capture(argv, 10000, &r) != 0) {
    if (why != NULL)
      snprintf(why, why_len, "cannot run /bin/sh");
    return -1;
  }
  int st = r.status;
  if (st != 0 && why != NULL) {
    char *nl = r.err != NULL ? strchr(r.err, '\n') : NULL;
    if (nl != NULL)
      *nl = '\0';
    snprintf(why, why_len, "%s: %s", cmd,
             r.err != NULL && r.err[0] ? r.err : "failed");
  }
  hx_run_free(&r);
  return st;
}

/* Namespaces of earlier test processes that died without tearing theirs
 * down (a test killed by its timeout): "fyPID-..." whose PID is gone. */
static void sweep_stale(void) {
  FILE *f = popen("ip netns list 2>/dev/null", "r");
  char line[256];
  if (f == NULL)
    return;
  while (fgets(line, sizeof(line), f) != NULL) {
    int pid = 0, len = 0;
    if (sscanf(line, "fy%d-%*s%n", &pid, &len) < 1 || pid <= 0)
      continue;
    if (kill(pid, 0) == 0 || errno != ESRCH)
      continue;
    char ns[64];
    if (sscanf(line, "%63s", ns) == 1) {
      sh(NULL, 0, "ip netns del %s", ns);
      sh(NULL, 0, "rm -rf /etc/netns/%s", ns);
    }
  }
  pclose(f);
}

static void destroy_all(void) {
  for (size_t i = 0; i < sizeof(live) / sizeof(live[0]); i++)
    if (live[i] != NULL)
      hx_net_destroy(live[i]);
}

int hx_net_create(hx_net_t *n, const char *const *names, int count,
                  char *why, size_t why_len) {
  static bool atexit_set;
  memset(n, 0, sizeof(*n));
  if (geteuid() != 0) {
    snprintf(why, why_len, "network namespaces need root");
    return -1;
  }
  if (ip_bin() == NULL) {
    snprintf(why, why_len, "no ip(8) (Debian: iproute2)");
    return -1;
  }
  if (sh(NULL, 0, "command -v iptables") != 0) {
    snprintf(why, why_len, "no iptables(8)");
    return -1;
  }
  if (count < 1 || count > HX_NET_MAX_HOSTS) {
    snprintf(why, why_len, "%d hosts (1 to %d)", count, HX_NET_MAX_HOSTS);
    return -1;
  }
  sweep_stale();
  if (!atexit_set) {
    atexit(destroy_all);
    atexit_set = true;
  }
  for (size_t i = 0; i < sizeof(live) / sizeof(live[0]); i++)
    if (live[i] == NULL) {
      live[i] = n;
      break;
    }
  snprintf(n->prefix, sizeof(n->prefix), "fy%d", (int)getpid());
  n->nhosts = count;
  n->up = true;
  const char *p = n->prefix;
  if (sh(why, why_len, "ip netns add %s-sw && ip -n %s-sw link set lo up && "
         "ip -n %s-sw link add br0 type bridge && "
         "ip -n %s-sw link set br0 up", p, p, p, p) != 0)
    goto fail;
  /* iptables inside a namespace (nf_tables, or the legacy tables). */
  if (sh(why, why_len, "ip netns exec %s-sw iptables -w -S >/dev/null", p) !=
      0)
    goto fail;
  for (int i = 0; i < count; i++) {
    snprintf(n->name[i], sizeof(n->name[i]), "%s", names[i]);
    snprintf(n->ns[i], sizeof(n->ns[i]), "%s-%s", p, names[i]);
    snprintf(n->addr[i], sizeof(n->addr[i]), "192.0.2.%d", 10 + i);
    const char *ns = n->ns[i];
    if (sh(why, why_len,
           "ip netns add %s && ip link add %sa%d type veth peer name %sb%d "
           "&& ip link set %sa%d netns %s && ip link set %sb%d netns %s-sw "
           "&& ip -n %s link set %sa%d name eth0 && "
           "ip -n %s addr add %s/24 dev eth0 && ip -n %s link set eth0 up "
           "&& ip -n %s link set lo up && "
           "ip -n %s-sw link set %sb%d master br0 && "
           "ip -n %s-sw link set %sb%d up",
           ns, p, i, p, i, p, i, ns, p, i, p, ns, p, i, ns, n->addr[i], ns,
           ns, p, p, i, p, p, i) != 0)
      goto fail;
  }
  /* Every host's hosts file names every host. */
  for (int i = 0; i < count; i++) {
    char dir[96], path[128];
    snprintf(dir, sizeof(dir), "/etc/netns/%s", n->ns[i]);
    if (mkdir("/etc/netns", 0755) != 0 && errno != EEXIST)
      goto fail_io;
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
      goto fail_io;
    snprintf(path, sizeof(path), "%s/hosts", dir);
    FILE *f = fopen(path, "w");
    if (f == NULL)
      goto fail_io;
    fprintf(f, "127.0.0.1 localhost\n");
    for (int k = 0; k < count; k++)
      fprintf(f, "%s %s\n", n->addr[k], n->name[k]);
    fclose(f);
  }
  return 0;
fail_io:
  snprintf(why, why_len, "/etc/netns: %s", strerror(errno));
fail:
  hx_net_destroy(n);
  return -1;
}

void hx_net_destroy(hx_net_t *n) {
  if (!n->up)
    return;
  n->up = false;
  for (int i = 0; i < n->nhosts; i++) {
    if (n->ns[i][0] == '\0')
      continue;
    sh(NULL, 0, "ip netns del %s 2>/dev/null; rm -rf /etc/netns/%s",
       n->ns[i], n->ns[i]);
  }
  sh(NULL, 0, "ip netns del %s-sw 2>/dev/null", n->prefix);
  for (size_t i = 0; i < sizeof(live) / sizeof(live[0]); i++)
    if (live[i] == n)
      live[i] = NULL;
}

static int host_index(const hx_net_t *n, const char *host) {
  for (int i = 0; i < n->nhosts; i++)
    if (strcmp(n->name[i], host) == 0)
      return i;
  return -1;
}

const char *hx_net_addr(const hx_net_t *n, const char *host) {
  int i = host_index(n, host);
  return i >= 0 ? n->addr[i] : NULL;
}

char **hx_net_argv(const hx_net_t *n, const char *host, char *const *cmd,
                   char **argv, size_t cap) {
  int i = host_index(n, host);
  if (i < 0 || cap < 5)
    return NULL;
  size_t k = 0;
  argv[k++] = (char *)ip_bin();
  argv[k++] = "netns";
  argv[k++] = "exec";
  argv[k++] = (char *)n->ns[i];
  for (size_t j = 0; cmd[j] != NULL && k + 1 < cap; j++)
    argv[k++] = cmd[j];
  argv[k] = NULL;
  return argv;
}

int hx_net_cut(const hx_net_t *n, const char *host, const char *peer,
               bool both_ways) {
  int i = host_index(n, host), k = host_index(n, peer);
  if (i < 0 || k < 0)
    return -1;
  char why[512];
  int rc = sh(why, sizeof(why), "ip netns exec %s iptables -w -A OUTPUT -d "
              "%s -j DROP", n->ns[i], n->addr[k]);
  if (rc == 0 && both_ways)
    rc = sh(why, sizeof(why), "ip netns exec %s iptables -w -A INPUT -s %s "
            "-j DROP", n->ns[i], n->addr[k]);
  if (rc != 0)
    fprintf(stderr, "hx_net_cut: %s\n", why);
  return rc == 0 ? 0 : -1;
}

int hx_net_heal(const hx_net_t *n, const char *host) {
  int i = host_index(n, host);
  if (i < 0)
    return -1;
  return sh(NULL, 0, "ip netns exec %s iptables -w -F && ip netns exec %s "
            "iptables -w -t nat -F", n->ns[i], n->ns[i]) == 0 ? 0 : -1;
}

#define RELAY_MARK "0x66"

int hx_net_delay(const hx_net_t *n, const char *host, const char *peer,
                 int delay_ms, double loss, char *why, size_t why_len) {
  int i = host_index(n, host), k = host_index(n, peer);
  if (i < 0 || k < 0) {
    snprintf(why, why_len, "unknown host %s or %s", host, peer);
    return -1;
  }
  if (delay_ms > 0) {
    char ms[16], *argv[16];
    snprintf(ms, sizeof(ms), "%d", delay_ms);
    char *cmd[] = {"/usr/bin/python3", FERRY_DELAY_RELAY, "--delay-ms", ms,
                   "--mark", RELAY_MARK, NULL};
    hx_proc_t *relay;
    if (hx_net_argv(n, host, cmd, argv, 16) == NULL ||
        hx_spawn(&relay, "delay-relay", argv, 10000, why, why_len) != 0)
      return -1;
    const char *port = strrchr(relay->addr, ':');
    if (port == NULL) {
      snprintf(why, why_len, "delay relay: no port in %s", relay->addr);
      return -1;
    }
    if (sh(why, why_len, "ip netns exec %s iptables -w -t nat -A OUTPUT -p "
           "tcp -d %s -m mark ! --mark " RELAY_MARK " -j REDIRECT "
           "--to-ports %s", n->ns[i], n->addr[k], port + 1) != 0)
      return -1;
  }
  if (loss > 0 &&
      sh(why, why_len, "ip netns exec %s iptables -w -A OUTPUT -d %s -m "
         "statistic --mode random --probability %.4f -j DROP", n->ns[i],
         n->addr[k], loss) != 0)
    return -1;
  return 0;
}

int hx_net_shape(const hx_net_t *n, const char *host, unsigned mbit) {
  int i = host_index(n, host);
  if (i < 0)
    return -1;
  char why[512];
  int rc;
  if (mbit == 0) {
    rc = sh(why, sizeof(why), "ip netns exec %s-sw tc qdisc del dev %sb%d "
            "root", n->prefix, n->prefix, i);
  } else {
    /* The bucket holds at least 10 ms of the rate (the kernel's timer
     * granularity) and 64 KiB. */
    unsigned long burst = (unsigned long)mbit * 1000000 / 8 / 100;
    if (burst < 65536)
      burst = 65536;
    rc = sh(why, sizeof(why), "ip netns exec %s-sw tc qdisc replace dev "
            "%sb%d root tbf rate %umbit burst %lu latency 100ms",
            n->prefix, n->prefix, i, mbit, burst);
  }
  if (rc != 0)
    fprintf(stderr, "hx_net_shape: %s\n", why);
  return rc == 0 ? 0 : -1;
}
