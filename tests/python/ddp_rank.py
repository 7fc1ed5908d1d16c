"""One rank of test_ddp.py, started by torchrun: runs the DDP loop of
docs/PYTHON.md ("Data-parallel training (ranks)", its first python block)
as written, with the dispatcher's address, the file pattern and the job
name substituted, and writes what the rank saw to OUT/rank<R>.json:

  {"env_rank": R, "env_world": W, "rank": client.rank, "world_size": ...,
   "steps_per_epoch": S, "dropped_per_epoch": D,
   "epochs": {"0": {"steps": n, "sizes": [...], "num_real": [...],
                    "real": [ids], "padded": [ids]}, ...},
   "printed": [{"epoch": e, "steps": n, "records": r, "loss": l}, ...],
   "seconds": t}

or {"error": traceback} (exit status 1). To see the batches without
changing the loop, ferry.torch.IterableDataset is replaced by a subclass
that records every item it yields (and appends a line to OUT/progress.<R>
after each, which the test watches to place its fault; --sleep-ms pauses
there), and print() by one that parses the loop's per-epoch line.

Usage: ddp_rank.py --dispatcher ADDR --pattern GLOB --job NAME --out DIR
                   [--sleep-ms MS]
"""
import argparse
import json
import os
import re
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
DOC = os.path.join(HERE, "..", "..", "docs", "PYTHON.md")
SECTION = "## Data-parallel training (ranks)"
# What the test substitutes in the block (each must occur in it).
ADDR, PATTERN, JOB = '"10.0.0.1:5050"', "/data/train-*.tfrecord", '"run-42"'
PRINTED = re.compile(r"rank (\d+) epoch (\d+): (\d+) steps, (\d+) records, "
                     r"mean loss ([0-9.]+|nan|inf)")


def doc_block():
    """The first python block of the section, as docs/PYTHON.md has it."""
    with open(DOC, encoding="utf-8") as f:
        text = f.read()
    assert SECTION in text, "docs/PYTHON.md has no %r section" % SECTION
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert blocks, "no python block in docs/PYTHON.md's %r" % SECTION
    return blocks[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dispatcher", required=True)
    ap.add_argument("--pattern", required=True)
    ap.add_argument("--job", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--sleep-ms", type=float, default=0.0)
    a = ap.parse_args()

    env_rank = int(os.environ["RANK"])
    res = {"env_rank": env_rank, "env_world": int(os.environ["WORLD_SIZE"]),
           "pid": os.getpid(), "printed": []}
    t0 = time.monotonic()
    try:
        import ferry.torch

        code = doc_block()
        for old, new in ((ADDR, repr(a.dispatcher)), (PATTERN, a.pattern),
                         (JOB, repr(a.job))):
            assert old in code, "the doc's block no longer has %s" % old
            code = code.replace(old, new)
        epochs = {}
        progress = open(os.path.join(a.out, "progress.%d" % env_rank), "a")

        class Recording(ferry.torch.IterableDataset):
            def __iter__(self):
                c = self.client
                res.update(rank=c.rank, world_size=c.world_size,
                           steps_per_epoch=c.steps_per_epoch,
                           dropped_per_epoch=c.dropped_per_epoch)
                for item in super().__iter__():
                    images, labels, ids, ep, n = item
                    ids = ids.tolist()
                    e = epochs.setdefault(str(int(ep)), {
                        "steps": 0, "sizes": [], "num_real": [], "real": [],
                        "padded": []})
                    e["steps"] += 1
                    e["sizes"].append(len(ids))
                    e["num_real"].append(n)
                    e["real"].extend(ids[:n])
                    e["padded"].extend(ids[n:])
                    progress.write("%d\n" % len(ids))
                    progress.flush()
                    if a.sleep_ms:
                        time.sleep(a.sleep_ms / 1000.0)
                    yield item

        def record_print(*args, **kw):
            line = " ".join(str(x) for x in args)
            m = PRINTED.fullmatch(line)
            assert m, "the loop printed %r, not its epoch line" % line
            r, e, steps, records, loss = m.groups()
            res["printed"].append({"rank": int(r), "epoch": int(e),
                                   "steps": int(steps),
                                   "records": int(records),
                                   "loss": float(loss)})
            print(line, flush=True)

        ferry.torch.IterableDataset = Recording
        exec(compile(code, "<docs/PYTHON.md's DDP loop>", "exec"),
             {"__name__": "__main__", "print": record_print})
        progress.close()
        res["epochs"] = epochs
    except BaseException:  # noqa: B902 - written for the test
        res["error"] = traceback.format_exc()
        print(res["error"], file=sys.stderr, flush=True)
    res["seconds"] = round(time.monotonic() - t0, 3)
    out = os.path.join(a.out, "rank%d.json" % env_rank)
    with open(out + ".tmp", "w") as f:
        json.dump(res, f)
    os.replace(out + ".tmp", out)
    return 1 if "error" in res else 0


if __name__ == "__main__":
    sys.exit(main())
