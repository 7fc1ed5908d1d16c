/* The options' ABI rule (client.h): a caller's ferry_client_options_t may
 * be shorter than the library's (a binding built against an older
 * header): ferry_client_options_init_sized fills only what fits,
 * ferry_client_new reads only struct_size bytes and defaults the rest;
 * sizes that cannot be a real struct (0, below the first release's, inside
 * a field, a longer struct with unknown options set) are refused with
 * FERRY_EINVAL. No daemons: a cut-short struct is shown to work by
 * reaching the (unreachable) dispatcher where the bytes beyond its size
 * would have failed before any RPC.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "client_internal.h"

static const char *spec_ok =
    "tfrecord(\"/nonexistent/train-*.tfrecord\") | decode(raw, 4, 4, 3) | "
    "batch(8)";

/* A caller struct with room beyond the library's, for "newer header"
 * cases. */
typedef struct {
  ferry_client_options_t o;
  uint64_t newer[2];
} bigger_t;

Test(client_options, init_sized_fills_only_what_fits) {
  bigger_t b;
  size_t cut = offsetof(ferry_client_options_t, tls_ca);
  memset(&b, 0xAB, sizeof(b));
  ferry_client_options_init_sized(&b.o, cut);
  cr_assert_eq(b.o.struct_size, cut);
  cr_assert_eq(b.o.prefetch, 3);
  cr_assert_eq(b.o.shuffle, -1);
  cr_assert_eq(b.o.dispatcher_timeout_ms, 30000);
  cr_assert_null(b.o.augment);
  /* Not one byte past the caller's size is written. */
  const unsigned char *p = (const unsigned char *)&b;
  for (size_t i = cut; i < sizeof(b); i++)
    cr_assert_eq(p[i], 0xAB, "byte %zu written", i);

  /* The macro passes the caller's sizeof. */
  ferry_client_options_t o;
  memset(&o, 0xCD, sizeof(o));
  ferry_client_options_init(&o);
  cr_assert_eq(o.struct_size, sizeof(o));
  cr_assert_null(o.token_file);
  cr_assert_eq(o.dtype, FERRY_DTYPE_FLOAT32);

  /* A newer caller's struct: its unknown tail is zeroed too. */
  memset(&b, 0xAB, sizeof(b));
  ferry_client_options_init_sized(&b.o, sizeof(b));
  cr_assert_eq(b.o.struct_size, sizeof(b));
  cr_assert_eq(b.newer[0], 0);
  cr_assert_eq(b.newer[1], 0);
  cr_assert_null(b.o.tls_key);
}

Test(client_options, a_short_struct_gets_defaults_for_the_rest) {
  /* The caller's memory past struct_size holds junk that must not be
   * read: pointers that would crash, a device, a dtype out of range. */
  ferry_client_options_t in, out;
  ferry_error_t err = {0};
  memset(&in, 0x5A, sizeof(in));
  size_t cut = offsetof(ferry_client_options_t, tls_ca);
  ferry_client_options_init_sized(&in, cut);
  in.dispatcher = "127.0.0.1:1";
  in.spec = spec_ok;
  in.batch_size = 17;
  in.gpu = false;
  in.augment = "flip(horizontal)";
  cr_assert_eq(ferry__client_options_copy(&in, &out, &err), 0, "%s", err.msg);
  cr_assert_eq(out.struct_size, sizeof(out));
  cr_assert_str_eq(out.dispatcher, "127.0.0.1:1");
  cr_assert_eq(out.batch_size, 17);
  cr_assert_str_eq(out.augment, "flip(horizontal)");
  cr_assert_eq(out.heartbeat_ms, 250);
  cr_assert_null(out.tls_ca);
  cr_assert_null(out.tls_cert);
  cr_assert_null(out.tls_key);
  cr_assert_null(out.token_file);

  /* Cut before the GPU fields (the first layout, the minimum). */
  memset(&in, 0x5A, sizeof(in));
  ferry_client_options_init_sized(&in, FERRY_CLIENT_OPTIONS_MIN_SIZE);
  in.dispatcher = "127.0.0.1:1";
  cr_assert_eq(ferry__client_options_copy(&in, &out, &err), 0, "%s", err.msg);
  cr_assert_eq(out.gpu, false);
  cr_assert_eq(out.device, 0);
  cr_assert_null(out.augment);
  cr_assert_eq(out.dtype, FERRY_DTYPE_FLOAT32);
  cr_assert_eq(out.layout, FERRY_LAYOUT_NHWC);
  cr_assert_eq(out.augment_seed, 0);
}

/* ferry_client_new on options whose fields past `size` would fail before
 * any RPC if read (a missing token file); cut before them the client gets
 * as far as the dispatcher, which nobody answers on port 1. */
static int new_with_size(size_t size, ferry_error_t *err) {
  ferry_client_options_t o;
  ferry_client_t *c = (ferry_client_t *)1;
  ferry_client_options_init(&o);
  o.dispatcher = "127.0.0.1:1";
  o.spec = spec_ok;
  o.connect_timeout_ms = 300;
  o.token_file = "/nonexistent/ferry-token";
  o.struct_size = (uint32_t)size;
  int rc = ferry_client_new(&o, &c, err);
  cr_assert_null(c);
  return rc;
}

Test(client_options, client_new_reads_only_struct_size_bytes) {
  ferry_error_t err = {0};
  ferry_alloc_stats_t a, b;
  ferry__alloc_stats(&a);
  /* All of it: the token file is read and missing. */
  int rc = new_with_size(sizeof(ferry_client_options_t), &err);
  cr_assert_neq(rc, 0);
  cr_assert_not_null(strstr(err.msg, "/nonexistent/ferry-token"), "%d %s",
                     rc, err.msg);
  /* Cut before the security fields: no token, so the dispatcher is
   * tried. */
  rc = new_with_size(offsetof(ferry_client_options_t, tls_ca), &err);
  cr_assert(rc == FERRY_EGRPC_DEADLINE_EXCEEDED ||
                rc == FERRY_EGRPC_UNAVAILABLE,
            "%d %s", rc, err.msg);
  cr_assert_not_null(strstr(err.msg, "127.0.0.1:1"), "%s", err.msg);
  ferry__alloc_stats(&b);
  cr_assert_eq(a.blocks, b.blocks);
}

Test(client_options, bad_sizes_fail_with_einval) {
  ferry_error_t err = {0};
  cr_assert_eq(new_with_size(0, &err), FERRY_EINVAL);
  cr_assert_not_null(strstr(err.msg, "struct_size is 0"), "%s", err.msg);
  cr_assert_not_null(strstr(err.msg, "ferry_client_options_init"), "%s",
                     err.msg);
  cr_assert_eq(new_with_size(4, &err), FERRY_EINVAL);
  cr_assert_not_null(strstr(err.msg, "smaller than the first release"), "%s",
                     err.msg);
  cr_assert_eq(new_with_size(FERRY_CLIENT_OPTIONS_MIN_SIZE - 4, &err),
               FERRY_EINVAL);
  cr_assert_eq(new_with_size(offsetof(ferry_client_options_t, augment) + 3,
                             &err),
               FERRY_EINVAL);
  cr_assert_not_null(strstr(err.msg, "inside field augment"), "%s", err.msg);
  cr_assert_eq(new_with_size(0x7fffffff, &err), FERRY_EINVAL);
  cr_assert_not_null(strstr(err.msg, "implausible"), "%s", err.msg);
  /* NULL options. */
  ferry_client_t *c;
  cr_assert_eq(ferry_client_new(NULL, &c, &err), FERRY_EINVAL);
}

Test(client_options, a_newer_callers_struct_needs_its_new_fields_unset) {
  bigger_t b;
  ferry_client_options_t out;
  ferry_error_t err = {0};
  ferry_client_options_init_sized(&b.o, sizeof(b));
  b.o.dispatcher = "127.0.0.1:1";
  b.o.prefetch = 5;
  cr_assert_eq(ferry__client_options_copy(&b.o, &out, &err), 0, "%s",
               err.msg);
  cr_assert_eq(out.prefetch, 5);
  cr_assert_eq(out.struct_size, sizeof(out));
  b.newer[1] = 1;
  cr_assert_eq(ferry__client_options_copy(&b.o, &out, &err), FERRY_EINVAL);
  cr_assert_not_null(strstr(err.msg, "newer libferry"), "%s", err.msg);
}

Test(client_options, memory_stats_follow_the_allocator) {
  int64_t bytes0, blocks0, bytes1, blocks1;
  ferry_memory_stats(&bytes0, &blocks0);
  void *p = ferry__malloc(1000);
  cr_assert_not_null(p);
  ferry_memory_stats(&bytes1, &blocks1);
  cr_assert_eq(blocks1, blocks0 + 1);
  cr_assert_geq(bytes1, bytes0 + 1000);
  ferry__free(p);
  ferry_memory_stats(&bytes1, NULL);
  ferry_memory_stats(NULL, &blocks1);
  cr_assert_eq(bytes1, bytes0);
  cr_assert_eq(blocks1, blocks0);
}
