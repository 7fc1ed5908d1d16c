#!/usr/bin/env python3
"""Checks the layers of common/ in a build, with nm.

1. Each layer's archive (common/libferry-<layer>.a) calls only functions
   defined in itself or in the layers below it (the order of LAYERS, as
   common/CMakeLists.txt links them): a call upwards is reported with the
   object that makes it and the layer that defines it.
2. libferry.so holds only the objects of common/ the client reaches: the
   objects it contains are listed, and those no client path may need
   (NOT_IN_LIBFERRY) must be absent, as must the transports' worker
   sides inside the objects it holds (NOT_IN_LIBFERRY_SYMBOLS).
3. Names say what is public: every symbol common/ defines with the
   prefix ferry_ is one libferry.so exports (FERRY_API); internal ones
   are ferry__.

Usage: check_layers.py BUILD_DIR [SANITIZERS]   (exit 1 on a violation)

SANITIZERS is the build's FERRY_SANITIZE. With address, the objects and
symbols of the transports' worker sides are listed but not checked:
AddressSanitizer registers every global from a constructor, so each
global and what it points at stays reachable and --gc-sections keeps
the server tables (the shipped build, without sanitizers, is checked).
"""
import os
import subprocess
import sys

LAYERS = ["base", "records", "image", "ops", "pipeline", "rpc", "transport"]

# Objects of common/ that only the daemons, ferryctl or the tests call:
# data roots, option files, TFRecord reading and writing, Example
# parsing, the per-record pipeline and its image ops, the prefix cache's
# files and the prefix rule, the RPC server and its health service (the
# transports' worker sides), /metrics, systemd.
NOT_IN_LIBFERRY = ["roots.c.o", "options.c.o", "tfrecord.c.o",
                   "tfrecord_index.c.o", "tfrecord_scan.c.o", "example.c.o",
                   "pipeline.c.o", "jpeg.c.o", "blur.c.o", "dilate.c.o",
                   "pcache.c.o", "spec_prefix.c.o",
                   "rpc_server.c.o", "rpc_health.c.o",
                   "metrics_http.c.o", "notify.c.o"]
# The objects above that only the transports' worker sides reach (kept
# out by --gc-sections, so not under AddressSanitizer).
SERVER_OBJECTS = ["rpc_server.c.o", "rpc_health.c.o"]
# Functions of objects libferry.so holds that belong to the worker side
# of a transport: --gc-sections must have dropped them.
NOT_IN_LIBFERRY_SYMBOLS = ["ferry__transport_server_at",
                           "ferry__transport_grpc_server",
                           "ferry__transport_ucx_server",
                           "ferry__rpc_server_new"]


def nm(path, *flags):
    out = subprocess.run(["nm", *flags, path], check=True,
                         capture_output=True, text=True).stdout
    return out.splitlines()


def archive_symbols(path):
    """{object: (defined, undefined)} of an archive's members."""
    objs, cur = {}, None
    for line in nm(path, "-A"):
        # path:member.o: addr T name   or   path:member.o:  U name
        head, _, rest = line.rpartition(":")
        member = head.rsplit(":", 1)[-1]
        parts = rest.split()
        if len(parts) < 2:
            continue
        kind, name = parts[-2], parts[-1]
        d, u = objs.setdefault(member, (set(), set()))
        if kind == "U":
            u.add(name)
        elif kind in "TDBRCVW" or kind in "tdbr":
            if kind.isupper():
                d.add(name)
    return objs


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else "build"
    asan = len(sys.argv) > 2 and "address" in sys.argv[2]
    arch = {}
    for layer in LAYERS:
        p = os.path.join(build, "common", "libferry-%s.a" % layer)
        if not os.path.exists(p):
            print("check_layers: no %s (built?)" % p)
            return 1
        arch[layer] = archive_symbols(p)
    defined_in = {}
    for layer in LAYERS:
        for obj, (d, _) in arch[layer].items():
            for s in d:
                defined_in.setdefault(s, (layer, obj))
    bad = 0
    for i, layer in enumerate(LAYERS):
        for obj, (_, u) in sorted(arch[layer].items()):
            for s in sorted(u):
                if s in defined_in and LAYERS.index(defined_in[s][0]) > i:
                    print("layer %s: %s calls %s, defined above it in %s (%s)"
                          % (layer, obj, s, defined_in[s][0],
                             defined_in[s][1]))
                    bad += 1
    print("layers: %s, %d call(s) upwards" % (" < ".join(LAYERS), bad))

    so = os.path.join(build, "client", "libferry.so")
    held = set(l.split()[-1] for l in nm(so, "--defined-only")
               if len(l.split()) >= 3)
    inside, total = [], 0
    for layer in LAYERS:
        for obj, (d, _) in sorted(arch[layer].items()):
            total += 1
            if d & held:
                inside.append("%s/%s" % (layer, obj))
    print("libferry.so holds %d of common's %d objects:" % (len(inside), total))
    for o in inside:
        print("  " + o)
    exported = set(l.split()[-1] for l in nm(so, "-D", "--defined-only")
                   if len(l.split()) >= 3)
    # The daemons' own parts of ops/ are named by the same rule.
    for extra in ("metrics-http", "notify"):
        p = os.path.join(build, "common", "libferry-%s.a" % extra)
        if os.path.exists(p):
            for obj, (d, _) in archive_symbols(p).items():
                for s in d:
                    defined_in.setdefault(s, ("ops", obj))
    misnamed = sorted(s for s in defined_in
                      if s.startswith("ferry_") and not s.startswith("ferry__")
                      and s not in exported)
    for s in misnamed:
        print("%s (%s) is internal but named ferry_, not ferry__"
              % (s, "/".join(defined_in[s])))
    bad += len(misnamed)
    print("names: %d internal symbol(s) named as public" % len(misnamed))
    server_side = set(SERVER_OBJECTS)
    for o in NOT_IN_LIBFERRY:
        if any(x.endswith("/" + o) for x in inside):
            if asan and o in server_side:
                print("libferry.so holds %s: not checked under "
                      "AddressSanitizer (it keeps every global)" % o)
                continue
            print("libferry.so holds %s, which no client path needs" % o)
            bad += 1
    for sym in NOT_IN_LIBFERRY_SYMBOLS:
        if sym in held:
            if asan:
                print("libferry.so holds %s: not checked under "
                      "AddressSanitizer (it keeps every global)" % sym)
                continue
            print("libferry.so holds %s, a worker's part" % sym)
            bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
