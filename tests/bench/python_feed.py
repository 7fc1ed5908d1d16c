#!/usr/bin/env python3
"""Python feed benchmark: records/s of one cluster feeding

  (a) the C example trainer (ferry-example-trainer),
  (b) a Python loop over ferry.Client that makes torch tensors of each batch
      with torch.from_dlpack (zero copy) and reads one element of the images
      and of the labels,
  (c) the same pipeline without Ferry, the way a PyTorch user writes it: a
      DataLoader with 2 worker processes reading the same TFRecord files with
      the `tfrecord` package, parsing the Examples, decoding the raw images
      and doing dilate and blur with torch ops, batched the same way,

and (c') once, (c) with F.max_pool2d as the dilate instead of 8 torch.maximum
of shifted views (the same result, but ~9x slower in Debian's torch 1.13),
over one generated dataset and one local cluster (a dispatcher and 2 workers
with one pipeline thread each, on 127.0.0.1, port 0). (a) and (b) run
alternately --reps times, (c) --reps-c times; the medians are reported with
the ratios (b)/(a) (goal >= 0.95) and (b)/(c). tests/bench/python_feed.sh
builds the daemons (Release) and picks the venv; run this directly with
--build-dir when both are at hand.

Records/s of (a) and (b) is the client's own figure: records delivered over
the time since ferry_client_new (stats: records / total_seconds), taken as
soon as the job ended; (c)'s is records over the time from iter(loader) to
its last batch (the persistent workers were started, untimed, by a warm-up
epoch). Checks (unless --no-check): every run delivers records x epochs;
(a)'s checksum (first byte of each record plus its label) is what an untimed
epoch through ferry.Client read; (c)'s first byte of every record is Ferry's
within the +-1 OPS.md allows for blur. `--role loop --profile` prints where
(b)'s time goes per batch. Exit status: 0 on success, 1 on a failed check,
77 when something it needs is missing (printed: SKIP ...).
"""

import argparse
import glob
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

SKIP = 77
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
H = W = 32
C = 3
DILATE = 3
BLUR_SIZE, BLUR_SIGMA = 11, 0.8


def spec_for(data, batch):
    return (f'tfrecord("{data}/train-*.tfrecord") | decode(raw, {H}, {W}, {C})'
            f" | dilate({DILATE}) | blur({BLUR_SIZE}, {BLUR_SIGMA}) | "
            f"batch({batch})")


# ---- (b): the Python loop, run in a process of its own (like (a)) ---------

def loop_main(args):
    import torch
    import ferry
    if args.profile:
        return loop_profile(args)
    touched = 0
    with ferry.Client(args.dispatcher, args.spec, epochs=args.epochs,
                      prefetch=args.prefetch, timeout=60.0) as client:
        for batch in client:
            images = torch.from_dlpack(batch.images)  # uint8 NHWC, no copy
            labels = torch.from_dlpack(batch.labels)  # int64 [n]
            # A minimal touch: one element of each. (Reading what (a) reads,
            # a byte per record, takes 3 more torch ops: ~15 us per batch
            # alone, ~60 us next to the workers on 2 cores; see --profile.)
            touched += int(images[0, 0, 0, 0]) + int(labels[0])
            # (a) releases each batch before its next ferry_next: so does
            # this loop (the slot goes back once the tensors are gone).
            del images, labels, batch
        st = client.stats()
    print(json.dumps({"records": st["records"], "batches": st["batches"],
                      "seconds": st["total_seconds"],
                      "wait": st["wait_seconds"], "touched": touched}))
    return 0


def loop_profile(args):
    """(b)'s loop with time.perf_counter splits: where a batch's time goes
    outside of the library's wait (what (b) costs over (a))."""
    import torch
    import ferry
    pc = time.perf_counter
    t = dict.fromkeys(("next", "images", "labels", "dlpack_images",
                       "dlpack_labels", "touch", "drop"), 0.0)
    n = 0
    with ferry.Client(args.dispatcher, args.spec, epochs=args.epochs,
                      prefetch=args.prefetch, timeout=60.0) as client:
        it = iter(client)
        t0 = pc()
        while True:
            a = pc()
            try:
                batch = next(it)
            except StopIteration:
                break
            b = pc()
            ai = batch.images
            c = pc()
            al = batch.labels
            d = pc()
            images = torch.from_dlpack(ai)
            e = pc()
            labels = torch.from_dlpack(al)
            f = pc()
            if args.touch == "record":  # what (a) reads
                _ = int(images.view(images.shape[0], -1)[:, 0].sum())
                _ += int(labels.sum())
            else:  # what (b) reads
                _ = int(images[0, 0, 0, 0]) + int(labels[0])
            g = pc()
            del images, labels, ai, al, batch
            h = pc()
            for k, v in (("next", b - a), ("images", c - b),
                         ("labels", d - c), ("dlpack_images", e - d),
                         ("dlpack_labels", f - e), ("touch", g - f),
                         ("drop", h - g)):
                t[k] += v
            n += 1
        loop = pc() - t0
        st = client.stats()
    us = 1e6 / max(n, 1)
    print(f"{n} batches, loop {loop:.3f} s, library wait "
          f"{st['wait_seconds']:.3f} s; per batch (us):")
    print(f"  next() {t['next'] * us:.1f} (of which waiting "
          f"{st['wait_seconds'] * us:.1f}, the rest "
          f"{(t['next'] - st['wait_seconds']) * us:.1f})")
    for k in ("images", "labels", "dlpack_images", "dlpack_labels", "touch",
              "drop"):
        print(f"  {k} {t[k] * us:.1f}")
    rest = loop - sum(t.values())
    print(f"  loop bookkeeping {rest * us:.1f}; all but the wait "
          f"{(loop - st['wait_seconds']) * us:.1f}")
    return 0


# ---- (c): DataLoader + tfrecord + torch ops --------------------------------

def gaussian_taps(size, sigma):
    import math
    r = size // 2
    e = [math.exp(-(x * x) / (2.0 * sigma * sigma)) for x in range(-r, r + 1)]
    s = sum(e)
    return [v / s for v in e]


def make_dataset_class():
    import numpy as np
    import torch
    import torch.nn.functional as F
    from tfrecord.reader import example_loader

    class TFRecordBatches(torch.utils.data.IterableDataset):
        """Each DataLoader worker reads its share of the files (file i goes to
        worker i % num_workers) and yields whole batches: (images uint8
        [n, C, H, W] after dilate and blur, labels int64 [n], ids int64 [n]
        numbered as Ferry's: file index << 40 | record index)."""

        def __init__(self, files, batch_size, dilate_op="maximum"):
            self.files = files
            self.batch_size = batch_size
            self.dilate_op = dilate_op
            taps = torch.tensor(gaussian_taps(BLUR_SIZE, BLUR_SIGMA),
                                dtype=torch.float32)
            # Separable blur: a vertical then a horizontal depthwise conv.
            self.kv = taps.view(1, 1, BLUR_SIZE, 1).repeat(C, 1, 1, 1)
            self.kh = taps.view(1, 1, 1, BLUR_SIZE).repeat(C, 1, 1, 1)

        def transform(self, images, labels, ids):
            x = torch.from_numpy(np.stack(images)).view(-1, H, W, C)
            x = x.permute(0, 3, 1, 2).float()           # NCHW float32
            # dilate(3): max over the 3x3 window, out-of-image taps skipped.
            r = DILATE // 2
            if self.dilate_op == "max_pool2d":  # pads with -inf
                x = F.max_pool2d(x, DILATE, stride=1, padding=r)
            else:
                # The same maxima as DILATE^2 shifted views of the image
                # padded by repeating its edge (an edge tap is already in
                # every window that reaches past it): ~9x faster than
                # max_pool2d in Debian's torch 1.13 on this CPU.
                p = F.pad(x, (r, r, r, r), mode="replicate")
                m = p[:, :, 0:H, 0:W]
                for dy in range(DILATE):
                    for dx in range(DILATE):
                        if dy or dx:
                            m = torch.maximum(m, p[:, :, dy:dy + H, dx:dx + W])
                x = m
            # blur(11, 0.8): reflect padding without the edge, as tfa.
            r = BLUR_SIZE // 2
            x = F.pad(x, (r, r, r, r), mode="reflect")
            x = F.conv2d(x, self.kv, groups=C)
            x = F.conv2d(x, self.kh, groups=C)
            x = x.clamp_(0, 255).to(torch.uint8)        # truncation
            return (x, torch.tensor(labels, dtype=torch.int64),
                    torch.tensor(ids, dtype=torch.int64))

        def __iter__(self):
            info = torch.utils.data.get_worker_info()
            wid, nw = (info.id, info.num_workers) if info else (0, 1)
            images, labels, ids = [], [], []
            for fi in range(wid, len(self.files), nw):
                recs = example_loader(self.files[fi], None,
                                      {"image": "byte", "label": "int"})
                for ri, ex in enumerate(recs):
                    images.append(np.frombuffer(ex["image"], dtype=np.uint8))
                    labels.append(int(ex["label"][0]))
                    ids.append(fi << 40 | ri)
                    if len(images) == self.batch_size:
                        yield self.transform(images, labels, ids)
                        images, labels, ids = [], [], []
            if images:
                yield self.transform(images, labels, ids)

    return TFRecordBatches


def run_baseline(files, batch, epochs, reps, workers=2, collect=False,
                 dilate_op="maximum"):
    """Returns ([records/s per rep], checksum, {id: first byte} if collect)."""
    import torch
    ds = make_dataset_class()(files, batch, dilate_op)
    loader = torch.utils.data.DataLoader(ds, batch_size=None,
                                         num_workers=workers,
                                         persistent_workers=True)
    for _ in loader:  # warm-up epoch: starts the workers (untimed)
        pass
    rates, checksum, first = [], None, {}
    for rep in range(reps):
        records, cs = 0, 0
        t0 = time.perf_counter()
        for _ in range(epochs):
            for images, labels, ids in loader:
                cs += int(images[:, 0, 0, 0].sum()) + int(labels.sum())
                records += labels.shape[0]
                if collect and rep == 0:
                    first.update(zip(ids.tolist(),
                                     images[:, 0, 0, 0].tolist()))
        dt = time.perf_counter() - t0
        rates.append(records / dt)
        checksum = cs
    del loader  # shuts the workers down
    return rates, checksum, first


def collect_ferry_first_bytes(dispatcher, spec):
    """One epoch through ferry.Client (untimed): {id: first byte} and the
    checksum (a) prints for one epoch (first bytes plus labels)."""
    import torch
    import ferry
    first = {}
    labels = 0
    with ferry.Client(dispatcher, spec, epochs=1, timeout=60.0) as client:
        for batch in client:
            images = torch.from_dlpack(batch.images)
            ids = torch.from_dlpack(batch.ids)
            first.update(zip(ids.tolist(),
                             images.view(images.shape[0], -1)[:, 0].tolist()))
            labels += int(torch.from_dlpack(batch.labels).sum())
    return first, sum(first.values()) + labels


# ---- the orchestration ------------------------------------------------------

TRAINER_RE = re.compile(
    r"batches (\d+), records (\d+), .* wait ([0-9.]+) s of ([0-9.]+) s "
    r".*checksum (\d+)")


def run_c_trainer(build, dispatcher, spec, epochs, prefetch):
    exe = os.path.join(build, "client/examples/ferry-example-trainer")
    p = subprocess.run([exe, "--dispatcher", dispatcher, "--spec", spec,
                        "--epochs", str(epochs), "--prefetch", str(prefetch),
                        "--timeout-ms", "60000"],
                       capture_output=True, text=True, timeout=600)
    m = TRAINER_RE.search(p.stdout)
    if p.returncode != 0 or not m:
        raise RuntimeError(f"ferry-example-trainer failed (exit {p.returncode})"
                           f":\n{p.stdout}\n{p.stderr}")
    return {"records": int(m.group(2)), "batches": int(m.group(1)),
            "seconds": float(m.group(4)), "wait": float(m.group(3)),
            "checksum": int(m.group(5))}


def run_py_loop(dispatcher, spec, epochs, prefetch):
    p = subprocess.run([sys.executable, os.path.abspath(__file__), "--role",
                        "loop", "--dispatcher", dispatcher, "--spec", spec,
                        "--epochs", str(epochs), "--prefetch", str(prefetch)],
                       capture_output=True, text=True, timeout=600)
    last = p.stdout.strip().splitlines()[-1:] or [""]
    if p.returncode != 0 or not last[0].startswith("{"):
        raise RuntimeError(f"the Python loop failed (exit {p.returncode}):\n"
                           f"{p.stdout}\n{p.stderr}")
    return json.loads(last[0])


def need(module, why):
    try:
        __import__(module)
    except Exception as e:  # noqa: BLE001 (any import failure is a skip)
        print(f"SKIP: cannot import {module} ({why}): {e}")
        sys.exit(SKIP)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--role", choices=["main", "loop"], default="main",
                    help="loop: only (b), on --dispatcher and --spec")
    ap.add_argument("--dispatcher", help="with --role loop")
    ap.add_argument("--spec", help="with --role loop")
    ap.add_argument("--profile", action="store_true",
                    help="with --role loop: per batch time splits")
    ap.add_argument("--touch", choices=["one", "record"], default="one",
                    help="with --profile: what the loop reads")
    ap.add_argument("--build-dir", default=os.environ.get("FERRY_BUILD_DIR"),
                    help="build tree with the daemons, ferryctl and "
                         "ferry-example-trainer (default $FERRY_BUILD_DIR)")
    ap.add_argument("--records", type=int, default=100000)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=5,
                    help="epochs per run of (a) and (b)")
    ap.add_argument("--epochs-c", type=int, default=1,
                    help="epochs per run of (c) (~15x slower than Ferry here)")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--prefetch", type=int, default=4,
                    help="ring slots of (a) and (b) (the C trainer's default)")
    ap.add_argument("--reps", type=int, default=5,
                    help="runs of (a) and of (b), alternated")
    ap.add_argument("--reps-c", type=int, default=3, help="runs of (c)")
    ap.add_argument("--no-maxpool", action="store_true",
                    help="skip the run of (c) with max_pool2d as the dilate")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 8,192 records, 1 epoch, 1 rep each")
    ap.add_argument("--no-check", action="store_true",
                    help="skip the per-record comparison of (c) with Ferry")
    args = ap.parse_args(argv)
    if args.role == "loop":
        return loop_main(args)

    need("torch", "Debian's python3-torch seen through --system-site-packages")
    need("numpy", "python3-numpy")
    need("tfrecord", "pip install tfrecord")
    need("ferry", "pip install ./client/python")
    if args.quick:
        args.records, args.epochs, args.reps, args.reps_c = 8192, 1, 1, 1
        args.epochs_c, args.no_maxpool = 1, True
    if not args.build_dir:
        print("SKIP: no build tree (--build-dir or FERRY_BUILD_DIR)")
        return SKIP
    build = os.path.abspath(args.build_dir)
    for exe in ("client/ctl/ferryctl", "client/examples/ferry-example-trainer",
                "dispatcher/ferry-dispatcher", "worker/ferry-worker"):
        if not os.access(os.path.join(build, exe), os.X_OK):
            print(f"SKIP: {build}/{exe} is not built")
            return SKIP

    import torch
    import ferry
    sys.path.insert(0, os.path.join(ROOT, "client", "examples"))
    from train_torch import LocalCluster

    tmp = tempfile.mkdtemp(prefix="ferry-python-feed-")
    status = 0
    try:
        data = os.path.join(tmp, "data")
        subprocess.run([os.path.join(build, "client/ctl/ferryctl"), "gen",
                        "--out", data, "--shards", str(args.shards),
                        "--records", str(args.records), "--format", "raw",
                        "--size", f"{H}x{W}", "--channels", str(C),
                        "--seed", "7"], check=True, stdout=subprocess.DEVNULL)
        files = sorted(glob.glob(os.path.join(data, "train-*.tfrecord")))
        spec = spec_for(data, args.batch_size)
        print(f"python feed benchmark: {args.records} records of {H}x{W}x{C} "
              f"raw in {len(files)} files, {args.epochs} epochs, batch "
              f"{args.batch_size}, prefetch {args.prefetch}; {os.cpu_count()} "
              f"cores; torch {torch.__version__} ({torch.get_num_threads()} "
              f"threads), ferry {ferry.__version__}")
        print(f"spec: {spec}")

        res_a, res_b = [], []
        with LocalCluster(build, workers=2, worker_threads=1,
                          log_dir=os.path.join(tmp, "logs")) as cluster:
            print(f"cluster: dispatcher {cluster.dispatcher}, workers "
                  f"{' '.join(cluster.workers)} (1 pipeline thread each)")
            first_ferry = epoch_sum = None
            if not args.no_check:
                first_ferry, epoch_sum = collect_ferry_first_bytes(
                    cluster.dispatcher, spec)
            else:  # still warm the cluster (dataset scan, page cache)
                run_c_trainer(build, cluster.dispatcher, spec, 1,
                              args.prefetch)
            for rep in range(args.reps):
                order = ("a", "b") if rep % 2 == 0 else ("b", "a")
                for which in order:
                    if which == "a":
                        r = run_c_trainer(build, cluster.dispatcher, spec,
                                          args.epochs, args.prefetch)
                        res_a.append(r)
                    else:
                        r = run_py_loop(cluster.dispatcher, spec, args.epochs,
                                        args.prefetch)
                        res_b.append(r)
                    print(f"  rep {rep + 1} ({which}): {r['records']} records"
                          f" in {r['seconds']:.3f} s = "
                          f"{r['records'] / r['seconds']:,.0f} records/s, "
                          f"waiting {r['wait'] / r['seconds']:.1%}",
                          flush=True)
        # The cluster is stopped (checked) before (c) so that its idle
        # daemons share nothing with the DataLoader.
        rates_c, checksum_c, first_c = run_baseline(
            files, args.batch_size, args.epochs_c, args.reps_c,
            collect=not args.no_check)
        for i, rc in enumerate(rates_c):
            print(f"  rep {i + 1} (c): {rc:,.0f} records/s", flush=True)
        rates_cm = []
        if not args.no_maxpool:
            rates_cm, _, first_cm = run_baseline(
                files, args.batch_size, args.epochs_c, 1,
                collect=not args.no_check, dilate_op="max_pool2d")
            print(f"  rep 1 (c'): {rates_cm[0]:,.0f} records/s", flush=True)
            if first_cm and first_cm != first_c:
                print("FAIL: (c) with max_pool2d and with torch.maximum "
                      "differ")
                status = 1

        expect = args.records * args.epochs
        for name, rs in (("a", res_a), ("b", res_b)):
            for r in rs:
                if r["records"] != expect:
                    print(f"FAIL: ({name}) delivered {r['records']} records, "
                          f"expected {expect}")
                    status = 1
        sums = {r["checksum"] for r in res_a}
        if len(sums) != 1 or (epoch_sum is not None and
                               sums != {epoch_sum * args.epochs}):
            print(f"FAIL: (a)'s checksums {sums} are not what the Python "
                  f"client read ({epoch_sum} per epoch)")
            status = 1
        if first_ferry is not None:
            common = set(first_ferry) & set(first_c)
            diff = [abs(first_ferry[i] - first_c[i]) for i in common]
            worst = max(diff) if diff else None
            print(f"check: first byte of {len(common)} records compared, "
                  f"(c) equal to Ferry for {diff.count(0)}, worst "
                  f"difference {worst} (OPS.md allows 1 for blur)")
            if len(common) != args.records or worst is None or worst > 1:
                print(f"FAIL: (c) does not compute Ferry's pipeline "
                      f"({len(first_ferry)} Ferry ids, {len(first_c)} (c) "
                      f"ids, {len(common)} in common)")
                status = 1

        ra = statistics.median(r["records"] / r["seconds"] for r in res_a)
        rb = statistics.median(r["records"] / r["seconds"] for r in res_b)
        rc = statistics.median(rates_c)
        sa = statistics.median(r["wait"] / r["seconds"] for r in res_a)
        sb = statistics.median(r["wait"] / r["seconds"] for r in res_b)
        print()
        ua = statistics.median((r["seconds"] - r["wait"]) / r["batches"] * 1e6
                               for r in res_a)
        ub = statistics.median((r["seconds"] - r["wait"]) / r["batches"] * 1e6
                               for r in res_b)
        print("| feed | records/s (median) | runs | stall | not waiting, "
              "us/batch |")
        print("|---|---:|---:|---:|---:|")
        print(f"| (a) C example trainer | {ra:,.0f} | {len(res_a)} | "
              f"{sa:.1%} | {ua:.0f} |")
        print(f"| (b) Python loop, torch.from_dlpack | {rb:,.0f} | "
              f"{len(res_b)} | {sb:.1%} | {ub:.0f} |")
        print(f"| (c) DataLoader(2 workers) + tfrecord + torch ops | "
              f"{rc:,.0f} | {len(rates_c)} | - | - |")
        if rates_cm:
            print(f"| (c') (c) with F.max_pool2d as the dilate | "
                  f"{rates_cm[0]:,.0f} | 1 | - | - |")
        print()
        verdict = "PASS" if rb / ra >= 0.95 else "BELOW GOAL"
        print(f"ratios: (b)/(a) = {rb / ra:.3f} (goal >= 0.95: {verdict}), "
              f"(b)/(c) = {rb / rc:.2f}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("python feed: ok" if status == 0 else "python feed: FAILED")
    return status


if __name__ == "__main__":
    sys.exit(main())
