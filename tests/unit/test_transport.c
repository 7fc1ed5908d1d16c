/* Tests of the transport seam's registry and rules (transport.h):
 * the registry's positions and names, the bounds on published endpoints,
 * and the client's choice (the job's option, TLS, the fallback before a
 * first chunk, the last resort). The rules are stated over capabilities,
 * so the cases read the registry rather than name transports: they hold
 * for whatever this build registered (with UCX: grpc and ucx; without:
 * grpc alone, where the cases that need two transports skip). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "transport.h"

static ferry_transport_endpoint_t ep(const char *name, const void *addr,
                                     size_t len) {
  ferry_transport_endpoint_t e = {name, strlen(name), addr, len};
  return e;
}

/* Every built transport offered: an address for those that need one. */
static size_t offer_all(ferry_transport_endpoint_t *out) {
  static const char addr[] = "opaque";
  size_t n = 0;
  for (size_t i = 0; i < ferry__transport_count(); i++) {
    const ferry_transport_ops_t *t = ferry__transport_at(i);
    out[n++] = ep(t->name, (t->caps & FERRY_TRANSPORT_NEEDS_ADDRESS) ? addr
                                                                      : NULL,
                  (t->caps & FERRY_TRANSPORT_NEEDS_ADDRESS) ? 6 : 0);
  }
  return n;
}

/* The position of the offered transport of highest priority among those
 * `ok` allows (-1: none). */
static int best_of(bool (*ok)(const ferry_transport_ops_t *)) {
  int best = -1;
  for (size_t i = 0; i < ferry__transport_count(); i++) {
    const ferry_transport_ops_t *t = ferry__transport_at(i);
    if (ok(t) &&
        (best < 0 || t->priority > ferry__transport_at((size_t)best)->priority))
      best = (int)i;
  }
  return best;
}
static bool any(const ferry_transport_ops_t *t) { return t != NULL; }
static bool encrypts(const ferry_transport_ops_t *t) {
  return (t->caps & FERRY_TRANSPORT_ENCRYPTS) != 0;
}
static bool addressless(const ferry_transport_ops_t *t) {
  return !(t->caps & FERRY_TRANSPORT_NEEDS_ADDRESS);
}
static int lowest(void) {
  int low = 0;
  for (size_t i = 1; i < ferry__transport_count(); i++)
    if (ferry__transport_at(i)->priority <
        ferry__transport_at((size_t)low)->priority)
      low = (int)i;
  return low;
}

Test(transport, the_registry_has_stable_positions_and_valid_names) {
  size_t n = ferry__transport_count();
  cr_assert(n >= 1 && n <= FERRY_TRANSPORTS_MAX, "%zu transports", n);
  cr_assert_null(ferry__transport_at(n));
  cr_assert_eq(ferry__transport_index("no_such_transport"), -1);
  cr_assert_null(ferry__transport_find("no_such_transport"));
  cr_assert_null(ferry__transport_find(NULL));
  bool reachable_by_grpc_address = false;
  for (size_t i = 0; i < n; i++) {
    const ferry_transport_ops_t *t = ferry__transport_at(i);
    cr_assert_not_null(t);
    cr_assert_eq(ferry__transport_index(t->name), (int)i, "%s", t->name);
    cr_assert_eq(ferry__transport_find(t->name), t);
    ferry_transport_endpoint_t e = ep(t->name, NULL, 0);
    cr_assert_eq(ferry__transport_endpoints_check(&e, 1, NULL), 0,
                 "the registry's name %s is not a valid endpoint name",
                 t->name);
    for (size_t k = 0; k < i; k++)
      cr_assert_neq(ferry__transport_at(k)->priority, t->priority,
                    "%s and %s share a priority: auto would be arbitrary",
                    ferry__transport_at(k)->name, t->name);
    reachable_by_grpc_address |= addressless(t);
    /* The worker side at the same position is this transport's. */
    const ferry_transport_server_ops_t *srv = ferry__transport_server_at(i);
    cr_assert_not_null(srv, "%s has no worker side", t->name);
    cr_assert_eq(srv->transport, t, "position %zu: the worker side of %s "
                 "belongs to %s", i, t->name, srv->transport->name);
    cr_assert_not_null(srv->server_new);
    cr_assert_not_null(srv->send);
  }
  cr_assert_null(ferry__transport_server_at(n));
  /* Workers that publish nothing (a release before endpoint lists) are
   * still reached by some transport. */
  cr_assert(reachable_by_grpc_address);
}

Test(transport, published_endpoints_are_bounded) {
  static char big[FERRY_TRANSPORT_ADDRESS_MAX + 1];
  char name[FERRY_TRANSPORT_NAME_MAX + 2];
  ferry_transport_endpoint_t e[FERRY_TRANSPORT_ENDPOINTS_MAX + 1];
  ferry_error_t err;

  e[0] = ep("grpc", NULL, 0);
  e[1] = ep("some_future_1", big, FERRY_TRANSPORT_ADDRESS_MAX);
  cr_assert_eq(ferry__transport_endpoints_check(e, 2, &err), 0, "%s", err.msg);
  cr_assert_eq(ferry__transport_endpoints_check(NULL, 0, &err), 0);

  e[1] = ep("x", big, FERRY_TRANSPORT_ADDRESS_MAX + 1);
  cr_assert_eq(ferry__transport_endpoints_check(e, 2, &err), FERRY_EINVAL);
  cr_assert(strstr(err.msg, "endpoints[1].address") != NULL, "%s", err.msg);

  const char *bad_names[] = {"", "UCX", "u-x", "a b", "é"};
  for (size_t i = 0; i < sizeof(bad_names) / sizeof(bad_names[0]); i++) {
    e[1] = ep(bad_names[i], NULL, 0);
    cr_assert_eq(ferry__transport_endpoints_check(e, 2, &err), FERRY_EINVAL,
                 "'%s' accepted", bad_names[i]);
    cr_assert(strstr(err.msg, "endpoints[1].transport") != NULL, "%s",
              err.msg);
  }
  memset(name, 'a', sizeof(name) - 1);
  name[sizeof(name) - 1] = '\0';
  e[1] = ep(name, NULL, 0); /* one byte over */
  cr_assert_eq(ferry__transport_endpoints_check(e, 2, &err), FERRY_EINVAL);
  name[FERRY_TRANSPORT_NAME_MAX] = '\0';
  e[1] = ep(name, NULL, 0); /* at the bound */
  cr_assert_eq(ferry__transport_endpoints_check(e, 2, &err), 0, "%s", err.msg);

  e[1] = ep("grpc", NULL, 0);
  cr_assert_eq(ferry__transport_endpoints_check(e, 2, &err), FERRY_EINVAL);
  cr_assert(strstr(err.msg, "also at 0") != NULL, "%s", err.msg);

  for (size_t i = 0; i <= FERRY_TRANSPORT_ENDPOINTS_MAX; i++) {
    static char names[FERRY_TRANSPORT_ENDPOINTS_MAX + 1][8];
    snprintf(names[i], sizeof(names[i]), "t%zu", i);
    e[i] = ep(names[i], NULL, 0);
  }
  cr_assert_eq(
      ferry__transport_endpoints_check(e, FERRY_TRANSPORT_ENDPOINTS_MAX, &err),
      0, "%s", err.msg);
  cr_assert_eq(ferry__transport_endpoints_check(
                   e, FERRY_TRANSPORT_ENDPOINTS_MAX + 1, &err),
               FERRY_EINVAL);
}

Test(transport, the_jobs_option_names_a_built_transport_or_auto) {
  ferry_error_t err;
  cr_assert_eq(ferry__transport_want_check(NULL, &err), 0);
  cr_assert_eq(ferry__transport_want_check("", &err), 0);
  cr_assert_eq(ferry__transport_want_check("auto", &err), 0);
  for (size_t i = 0; i < ferry__transport_count(); i++)
    cr_assert_eq(
        ferry__transport_want_check(ferry__transport_at(i)->name, &err), 0);
  cr_assert_eq(ferry__transport_want_check("carrier_pigeon", &err),
               FERRY_EINVAL);
  cr_assert(strstr(err.msg, "carrier_pigeon") != NULL, "%s", err.msg);
  for (size_t i = 0; i < ferry__transport_count(); i++)
    cr_assert(strstr(err.msg, ferry__transport_at(i)->name) != NULL,
              "the choices are not listed: %s", err.msg);
#ifndef FERRY_HAVE_UCX
  /* Registered but not built: the message says how to build it. */
  cr_assert_eq(ferry__transport_want_check("ucx", &err), FERRY_ENOTSUP);
  cr_assert(strstr(err.msg, "FERRY_WITH_UCX") != NULL, "%s", err.msg);
#endif
}

Test(transport, auto_takes_the_highest_priority_both_ends_offer) {
  ferry_transport_endpoint_t e[FERRY_TRANSPORTS_MAX];
  ferry_transport_choice_t ch;
  ferry_error_t err;
  size_t n = offer_all(e);

  cr_assert_eq(ferry__transport_choose("auto", false, e, n, 0, &ch, &err), 0,
               "%s", err.msg);
  cr_assert_eq(ch.index, best_of(any), "%s", ch.why);
  const ferry_transport_ops_t *t = ferry__transport_at((size_t)ch.index);
  if (t->caps & FERRY_TRANSPORT_NEEDS_ADDRESS)
    cr_assert(ch.address_len == 6 && memcmp(ch.address, "opaque", 6) == 0);
  else
    cr_assert(ch.address == NULL && ch.address_len == 0);
  cr_assert(strstr(ch.why, t->name) != NULL, "%s", ch.why);

  /* A worker that published nothing: only what needs no address. */
  cr_assert_eq(ferry__transport_choose(NULL, false, NULL, 0, 0, &ch, &err), 0);
  cr_assert_eq(ch.index, best_of(addressless), "%s", ch.why);
  /* An endpoint with an empty address offers nothing that needs one. */
  for (size_t i = 0; i < n; i++)
    e[i].address_len = 0;
  cr_assert_eq(ferry__transport_choose("", false, e, n, 0, &ch, &err), 0);
  cr_assert_eq(ch.index, best_of(addressless), "%s", ch.why);
}

Test(transport, auto_under_tls_takes_only_what_encrypts) {
  ferry_transport_endpoint_t e[FERRY_TRANSPORTS_MAX];
  ferry_transport_choice_t ch;
  ferry_error_t err;
  size_t n = offer_all(e);
  cr_assert_eq(ferry__transport_choose("auto", true, e, n, 0, &ch, &err), 0);
  cr_assert_eq(ch.index, best_of(encrypts), "%s", ch.why);
  if (best_of(any) != best_of(encrypts))
    cr_assert(strstr(ch.why, "does not encrypt") != NULL, "%s", ch.why);
}

Test(transport, a_failure_before_the_first_chunk_falls_back) {
  ferry_transport_endpoint_t e[FERRY_TRANSPORTS_MAX];
  ferry_transport_choice_t ch;
  ferry_error_t err;
  size_t n = offer_all(e);
  int first = best_of(any);

  cr_assert(ferry__transport_falls_back("auto", first, 0));
  cr_assert(ferry__transport_falls_back(NULL, first, 0));
  cr_assert_not(ferry__transport_falls_back("auto", first, 1),
                "a stream that delivered proved the transport works");
  cr_assert_not(ferry__transport_falls_back(ferry__transport_at(0)->name, 0, 0),
                "a transport asked for by name is never replaced");

  /* Every transport failed: the lowest priority is the last resort. */
  uint32_t all = (1u << ferry__transport_count()) - 1;
  cr_assert_eq(ferry__transport_choose("auto", false, e, n, all, &ch, &err), 0);
  cr_assert_eq(ch.index, lowest(), "%s", ch.why);

  if (ferry__transport_count() < 2)
    cr_skip_test("one transport built: nothing to fall back to");
  cr_assert_eq(
      ferry__transport_choose("auto", false, e, n, 1u << first, &ch, &err), 0);
  cr_assert_neq(ch.index, first, "%s", ch.why);
  cr_assert(strstr(ch.why, "failed before its first chunk") != NULL, "%s",
            ch.why);
}

Test(transport, a_transport_asked_for_by_name_must_be_offered) {
  ferry_transport_endpoint_t e[FERRY_TRANSPORTS_MAX];
  ferry_transport_choice_t ch;
  ferry_error_t err;
  size_t n = offer_all(e);
  for (size_t i = 0; i < ferry__transport_count(); i++) {
    const ferry_transport_ops_t *t = ferry__transport_at(i);
    /* Offered: chosen, whatever failed, TLS or not. */
    cr_assert_eq(ferry__transport_choose(t->name, true, e, n, ~0u, &ch, &err),
                 0, "%s: %s", t->name, err.msg);
    cr_assert_eq(ch.index, (int)i);
    if (!encrypts(t))
      cr_assert(strstr(ch.why, "does not encrypt") != NULL, "%s", ch.why);
    /* Not offered: an error naming it, never another transport. */
    int rc = ferry__transport_choose(t->name, false, NULL, 0, 0, &ch, &err);
    if (t->caps & FERRY_TRANSPORT_NEEDS_ADDRESS) {
      cr_assert_eq(rc, FERRY_ENOTSUP);
      cr_assert(strstr(err.msg, t->name) != NULL, "%s", err.msg);
    } else {
      cr_assert_eq(rc, 0);
    }
  }
  cr_assert_eq(
      ferry__transport_choose("carrier_pigeon", false, e, n, 0, &ch, &err),
      FERRY_EINVAL);
}
