/* The transports built in and the choice between them (ferry/transport.h).
 */
#include <stdio.h>
#include <string.h>

#include "ferry/transport.h"

static const ferry_transport_ops_t *const all[] = {
    &ferry_transport_grpc,
#ifdef FERRY_HAVE_UCX
    &ferry_transport_ucx,
#endif
};

const ferry_transport_ops_t *ferry_transport_find(const char *name) {
  if (name == NULL)
    return NULL;
  for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
    if (strcmp(all[i]->name, name) == 0)
      return all[i];
  return NULL;
}

static void say(char *why, size_t why_len, const char *msg) {
  if (why != NULL && why_len > 0)
    snprintf(why, why_len, "%s", msg);
}

const ferry_transport_ops_t *ferry_transport_choose(const char *want,
                                                    bool peer_has_ucx,
                                                    char *why, size_t why_len,
                                                    ferry_error_t *err) {
  const ferry_transport_ops_t *ucx = ferry_transport_find("ucx");
  if (want == NULL || want[0] == '\0' || strcmp(want, "auto") == 0) {
    if (ucx != NULL && peer_has_ucx) {
      say(why, why_len, "auto: both ends offer ucx");
      return ucx;
    }
    say(why, why_len,
        ucx == NULL ? "auto: grpc, this libferry was built without UCX"
                    : "auto: grpc, the worker offers no UCX address");
    return &ferry_transport_grpc;
  }
  if (strcmp(want, "grpc") == 0) {
    say(why, why_len, "grpc: asked for");
    return &ferry_transport_grpc;
  }
  if (strcmp(want, "ucx") == 0) {
    if (ucx == NULL) {
      ferry__seterr(err, FERRY_ENOTSUP, "transport ucx: this libferry was "
                    "built without UCX (FERRY_WITH_UCX)");
      return NULL;
    }
    if (!peer_has_ucx) {
      ferry__seterr(err, FERRY_ENOTSUP, "transport ucx: the worker offers "
                    "no UCX address (built without UCX?)");
      return NULL;
    }
    say(why, why_len, "ucx: asked for");
    return ucx;
  }
  ferry__seterr(err, FERRY_EINVAL, "transport '%s': expected auto, grpc or "
                "ucx", want);
  return NULL;
}
