#!/usr/bin/env python3
"""Checks for tests/compat/run.sh.

    check.py ids OUT EPOCHS SHARDS PER_SHARD
        OUT is an it_client output file (its format is
        tests/integration/it_client.c's: per batch a header {uint32 epoch,
        uint32 n, double t_ms, uint64 acked} and n uint64 record ids).
        Passes when it holds exactly EPOCHS epochs and each of them every
        id of a `ferryctl gen --shards SHARDS` dataset of SHARDS x
        PER_SHARD records exactly once (id = shard << 40 | record).
    check.py metric URL NAME
        Prints the value of the unlabelled metric NAME served at URL.
    check.py alive STATUS_JSON
        Prints how many workers `ferryctl status --json` lists as alive.
Exits 1, saying why, on a failed check.
"""
import collections
import json
import struct
import sys
import urllib.request

HEADER = struct.Struct("<IIdQ")


def ids(path, epochs, shards, per_shard):
    with open(path, "rb") as f:
        data = f.read()
    seen = collections.defaultdict(collections.Counter)
    off = batches = 0
    while off < len(data):
        if off + HEADER.size > len(data):
            return f"{path}: torn batch header at byte {off}"
        epoch, n, _, _ = HEADER.unpack_from(data, off)
        off += HEADER.size
        if off + 8 * n > len(data):
            return f"{path}: torn batch of {n} ids at byte {off}"
        seen[epoch].update(struct.unpack_from(f"<{n}Q", data, off))
        off += 8 * n
        batches += 1
    want = {(s << 40) | r for s in range(shards) for r in range(per_shard)}
    if len(seen) != epochs:
        return (f"{path}: records of epochs {sorted(seen)}, expected "
                f"{epochs} epochs")
    for e in sorted(seen):
        got = seen[e]
        dup = sorted(i for i, c in got.items() if c > 1)
        missing = sorted(want - set(got))
        extra = sorted(set(got) - want)
        if dup or missing or extra:
            def show(v):
                return ", ".join(f"{i >> 40}:{i & ((1 << 40) - 1)}"
                                 for i in v[:5]) + (" ..." if len(v) > 5 else "")
            return (f"{path}: epoch {e}: {len(dup)} ids more than once "
                    f"[{show(dup)}], {len(missing)} missing [{show(missing)}], "
                    f"{len(extra)} unexpected [{show(extra)}] "
                    f"(shard:record)")
        print(f"  epoch {e}: {sum(got.values())} records, each of the "
              f"{len(want)} ids exactly once")
    print(f"  {batches} batches in {len(seen)} epochs")
    return None


def metric(url, name):
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == name:
            print(int(float(parts[1])))
            return None
    return f"{url}: no metric {name}"


def alive(path):
    with open(path) as f:
        st = json.load(f)
    print(sum(1 for w in st.get("workers", []) if w.get("state") == "alive"))
    return None


def main(argv):
    try:
        if len(argv) == 6 and argv[1] == "ids":
            err = ids(argv[2], *(int(a) for a in argv[3:6]))
        elif len(argv) == 4 and argv[1] == "metric":
            err = metric(argv[2], argv[3])
        elif len(argv) == 3 and argv[1] == "alive":
            err = alive(argv[2])
        else:
            print(__doc__, file=sys.stderr)
            return 2
    except (OSError, ValueError) as e:
        err = f"{argv[1]}: {e}"
    if err:
        print(f"FAIL: {err}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
