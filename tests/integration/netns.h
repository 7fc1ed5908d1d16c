/* Hosts in network namespaces for the integration tests: each
 * "host" is a namespace with one interface, eth0, on a bridge in a
 * namespace of its own (the switch), and an address in the documentation
 * range 192.0.2.0/24; nothing is routed anywhere else. Each host's
 * /etc/netns/NS/hosts names every host, so programs started in it with
 * hx_net_argv (`ip netns exec`, which binds that file over /etc/hosts)
 * reach the others by name, as the README's "Running a cluster" says.
 *
 * Links are cut with iptables rules inside a host's namespace (DROP, so
 * a cut link is silent, as a pulled cable or a firewall is, not refused)
 * and healed by removing them. Everything is torn down by hx_net_destroy
 * (and by hx_reap_all's sweep of processes first: a daemon in a namespace
 * is an ordinary child of the test).
 *
 * Needs root, ip(8) and iptables(8); hx_net_create says why when it
 * cannot, and the tests skip with that reason. */
#ifndef FERRY_TESTS_NETNS_H
#define FERRY_TESTS_NETNS_H

#include <stdbool.h>
#include <stddef.h>

#define HX_NET_MAX_HOSTS 8

typedef struct hx_net_s {
  int nhosts;
  char prefix[16];                    /* namespaces PREFIX-NAME */
  char name[HX_NET_MAX_HOSTS][16];    /* "dispatcher", "worker1", ... */
  char ns[HX_NET_MAX_HOSTS][40];      /* its namespace */
  char addr[HX_NET_MAX_HOSTS][16];    /* "192.0.2.N" */
  bool up;
} hx_net_t;

/* Creates one host per name (at most HX_NET_MAX_HOSTS, names of at most
 * 15 characters) and the switch joining them. Returns 0, or -1 with `why`
 * saying what failed (nothing is left behind). */
int hx_net_create(hx_net_t *n, const char *const *names, int count,
                  char *why, size_t why_len);

/* Deletes every namespace, link and hosts file hx_net_create made.
 * Safe to call twice. */
void hx_net_destroy(hx_net_t *n);

/* The host's address, or NULL for a name it does not have. */
const char *hx_net_addr(const hx_net_t *n, const char *host);

/* argv (NULL-terminated, at most `cap` entries) that runs `cmd` (also
 * NULL-terminated; cmd[0] a path) in host `host`'s namespace. Returns
 * argv, or NULL for an unknown host. */
char **hx_net_argv(const hx_net_t *n, const char *host, char *const *cmd,
                   char **argv, size_t cap);

/* Cuts what `host` sends to and (both) receives from `peer`: DROP rules
 * in `host`'s namespace. Returns 0 or -1. */
int hx_net_cut(const hx_net_t *n, const char *host, const char *peer,
               bool both_ways);

/* Removes every rule hx_net_cut added in `host`'s namespace. */
int hx_net_heal(const hx_net_t *n, const char *host);

/* Delays the TCP connections `host` opens to `peer` by `delay_ms` each
 * way (tests/integration/delay_relay.py in host's namespace, behind an
 * iptables REDIRECT of them: this kernel has no netem), and drops a
 * fraction `loss` (0 to 1) of the packets host sends to peer. Call it
 * both ways for a link whose ends both connect (UCX: the worker dials
 * the trainer). The relay runs until hx_reap_all; hx_net_heal removes
 * the rules. Returns 0, or -1 with `why` (no nat table, no statistic
 * match, no python3). */
int hx_net_delay(const hx_net_t *n, const char *host, const char *peer,
                 int delay_ms, double loss, char *why, size_t why_len);

/* Caps what reaches `host` from the others at `mbit` Mbit/s (a token
 * bucket on its switch port, as a narrow link to that host); 0 removes
 * the cap. Returns 0 or -1. */
int hx_net_shape(const hx_net_t *n, const char *host, unsigned mbit);

#endif
