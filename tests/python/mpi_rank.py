"""One rank of test_mpirun.py, launched by Open MPI's mpirun: reads a
ranked Ferry job whose rank and world size ferry.Client takes from the
launcher's environment (OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE; no
MPI call is made, the ranks exchange nothing) and writes what it got to
OUT/rank<R>.json:

  {"env_rank": R, "env_size": W, "rank": client.rank or null,
   "world_size": ..., "steps_per_epoch": S, "dropped_per_epoch": D,
   "epochs": {"0": {"steps": n, "sizes": [...], "real": [ids],
                    "padded": [ids]}, ...}, "seconds": t}

or {"error": traceback} (exit status 1). After each batch it appends one
line to OUT/progress.<R>, which the test watches to place its fault.

Usage: mpi_rank.py --dispatcher ADDR --spec SPEC --job NAME --batch-size B
                   --epochs E (--drop | --pad) --out DIR [--sleep-ms MS]
                   [--timeout S]
"""
import argparse
import json
import os
import sys
import time
import traceback


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dispatcher", required=True)
    ap.add_argument("--spec", required=True)
    ap.add_argument("--job", required=True)
    ap.add_argument("--batch-size", type=int, required=True)
    ap.add_argument("--epochs", type=int, default=2)
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--drop", action="store_true")
    g.add_argument("--pad", action="store_true")
    ap.add_argument("--out", required=True)
    ap.add_argument("--sleep-ms", type=float, default=0.0)
    ap.add_argument("--timeout", type=float, default=30.0)
    a = ap.parse_args()

    env_rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    env_size = int(os.environ["OMPI_COMM_WORLD_SIZE"])
    out = os.path.join(a.out, "rank%d.json" % env_rank)
    res = {"env_rank": env_rank, "env_size": env_size, "pid": os.getpid()}
    t0 = time.monotonic()
    try:
        import ferry
        epochs = {}
        with open(os.path.join(a.out, "progress.%d" % env_rank), "a") as prog:
            # rank and world_size left out: the environment gives them.
            with ferry.Client(a.dispatcher, a.spec, job_name=a.job,
                              batch_size=a.batch_size,
                              drop_remainder=a.drop, epochs=a.epochs,
                              timeout=a.timeout) as c:
                res["rank"] = getattr(c, "rank", None)
                res["world_size"] = getattr(c, "world_size", None)
                res["steps_per_epoch"] = c.steps_per_epoch
                res["dropped_per_epoch"] = c.dropped_per_epoch
                for b in c:
                    ids = _ids(b)
                    n_real = getattr(b, "num_real", len(ids))
                    e = epochs.setdefault(str(int(b.epoch)), {
                        "steps": 0, "sizes": [], "real": [], "padded": []})
                    e["steps"] += 1
                    e["sizes"].append(len(ids))
                    e["real"].extend(ids[:n_real])
                    e["padded"].extend(ids[n_real:])
                    del b
                    prog.write("%s\n" % len(ids))
                    prog.flush()
                    if a.sleep_ms:
                        time.sleep(a.sleep_ms / 1000.0)
        res["epochs"] = epochs
    except BaseException:
        res["error"] = traceback.format_exc()
    res["seconds"] = round(time.monotonic() - t0, 3)
    tmp = out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(res, f)
    os.replace(tmp, out)
    return 1 if "error" in res else 0


def _ids(b):
    import numpy
    return [int(i) for i in numpy.asarray(b.ids)]


if __name__ == "__main__":
    sys.exit(main())
