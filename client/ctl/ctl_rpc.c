/* Why a cluster command's call failed, in words that say what to do
 * next (ferryctl_call_failed, ctl.h).
 *
 * gRPC's own text for the common mistakes is misleading: an unresolvable
 * host reads "Deadline Exceeded", a TLS dispatcher dialed without
 * --tls-ca reads "Socket closed", and a worker's port reads "unknown
 * method". The dispatcher's refusals name no credential on purpose
 * (docs/SECURITY.md), so the hint about --token-file is added here. */
#include <stdio.h>
#include <string.h>

#include "ctl.h"
#include "hostport.h"
#include "rpc.h"

/* How long the probe of an address nobody answered on may take. */
#define PROBE_MS 2000

static bool is_admin_method(const char *method) {
  return method != NULL && (strstr(method, "/DrainWorker") != NULL ||
                            strstr(method, "/CancelJob") != NULL);
}

static int unreachable_failed(const char *cmd, const char *dispatcher,
                              bool tls, const ferry_error_t *err) {
  char why[512];
  ferry_rpc_probe_t k =
      ferry__rpc_probe(dispatcher, PROBE_MS, why, sizeof(why));
  const char *hint = NULL;
  switch (k) {
  case FERRY_RPC_PROBE_UNRESOLVED:
    fprintf(stderr, "ferryctl %s: %s (--dispatcher %s): check the name, or "
            "give the dispatcher's IP address\n", cmd, why, dispatcher);
    return FERRYCTL_EXIT_UNREACHABLE;
  case FERRY_RPC_PROBE_REFUSED:
  case FERRY_RPC_PROBE_SILENT:
    fprintf(stderr, "ferryctl %s: the dispatcher at %s did not answer: %s; "
            "is it running, and is --dispatcher its HOST:PORT?\n", cmd,
            dispatcher, why);
    return FERRYCTL_EXIT_UNREACHABLE;
  case FERRY_RPC_PROBE_TLS:
    hint = tls ? "the TLS handshake failed: check that the dispatcher's "
                 "certificate is signed by --tls-ca and names the host you "
                 "dial, and pass --tls-cert/--tls-key if it requires client "
                 "certificates"
               : "the dispatcher may require TLS: pass --tls-ca CA.pem "
                 "(and --tls-cert/--tls-key if it requires client "
                 "certificates)";
    break;
  case FERRY_RPC_PROBE_PLAINTEXT:
    if (tls)
      hint = "the dispatcher does not serve TLS: drop --tls-ca, --tls-cert "
             "and --tls-key, or start it with --tls-cert/--tls-key";
    break;
  case FERRY_RPC_PROBE_OTHER:
    fprintf(stderr, "ferryctl %s: %s: is --dispatcher the dispatcher's "
            "HOST:PORT?\n", cmd, why);
    return FERRYCTL_EXIT_UNREACHABLE;
  case FERRY_RPC_PROBE_BAD_ADDRESS:
  case FERRY_RPC_PROBE_UNKNOWN:
    break;
  }
  if (hint != NULL)
    fprintf(stderr, "ferryctl %s: the dispatcher at %s did not answer: %s; "
            "%s\n", cmd, dispatcher, err->msg, hint);
  else
    fprintf(stderr, "ferryctl %s: the dispatcher at %s did not answer: %s\n",
            cmd, dispatcher, err->msg);
  return FERRYCTL_EXIT_UNREACHABLE;
}

int ferryctl_call_failed(const char *cmd, const char *dispatcher, bool tls,
                         const char *method, int rc,
                         const ferry_error_t *err) {
  const char *svc = "ferry.v1.Dispatcher";
  switch (rc) {
  case FERRY_EGRPC_UNAVAILABLE:
  case FERRY_EGRPC_DEADLINE_EXCEEDED:
    return unreachable_failed(cmd, dispatcher, tls, err);
  case FERRY_EGRPC_UNIMPLEMENTED:
    /* A worker (or any other gRPC server) answers every Dispatcher
     * method this way; an older dispatcher only the newer methods. */
    if (is_admin_method(method))
      fprintf(stderr, "ferryctl %s: %s does not serve %s: it is not a Ferry "
              "dispatcher (is it a worker?), or a dispatcher older than "
              "this ferryctl\n", cmd, dispatcher, method);
    else
      fprintf(stderr, "ferryctl %s: %s is not a Ferry dispatcher (it does "
              "not serve %s; is it a worker?): give the dispatcher's "
              "HOST:PORT with --dispatcher\n", cmd, dispatcher, svc);
    return FERRYCTL_EXIT_UNREACHABLE;
  case FERRY_EGRPC_UNAUTHENTICATED:
  case FERRY_EGRPC_PERMISSION_DENIED:
    if (strstr(err->msg, "--admin-token-file") != NULL)
      fprintf(stderr, "ferryctl %s: %s\n", cmd, err->msg);
    else if (is_admin_method(method))
      fprintf(stderr, "ferryctl %s: %s; %s needs the admin token: pass the "
              "file the dispatcher's --admin-token-file names with "
              "--token-file\n", cmd, err->msg, cmd);
    else
      fprintf(stderr, "ferryctl %s: %s; pass --token-file with the status, "
              "client, worker or admin token the dispatcher was given\n",
              cmd, err->msg);
    return FERRYCTL_EXIT_BAD;
  default:
    fprintf(stderr, "ferryctl %s: %s\n", cmd, err->msg);
    return FERRYCTL_EXIT_BAD;
  }
}

int ferryctl_check_dispatcher(const char *cmd, const char *dispatcher) {
  ferry_error_t err = {0};
  if (ferry__hostport_parse(dispatcher, 0, NULL, 0, NULL, &err) == 0)
    return FERRYCTL_CONTINUE;
  fprintf(stderr, "ferryctl %s: --dispatcher: %s (see 'ferryctl %s "
          "--help')\n", cmd, err.msg, cmd);
  return FERRYCTL_EXIT_USAGE;
}
