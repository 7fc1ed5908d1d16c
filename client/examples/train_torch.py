#!/usr/bin/env python3
"""Train a small CNN on a generated dataset fed by Ferry.

    # on an existing cluster (the dataset's files must be readable by its workers):
    python3 client/examples/train_torch.py --dispatcher 127.0.0.1:5050 --data /tmp/d

    # or let the example start a local cluster (a dispatcher and a worker on
    # 127.0.0.1, port 0) from a build tree, and generate the dataset:
    FERRY_BUILD_DIR=build-release python3 client/examples/train_torch.py --steps 300

The batches come out of ferry.Client already augmented, as float32 NCHW, on
the GPU when torch.cuda is available (device="cuda:0": the tensors made with
torch.from_dlpack are already on the device) and on the host otherwise. The
loop prints the loss every --log-every steps and, at the end, the input stall
fraction (the share of the time spent waiting for data) and the records/s.
Whatever it started (the cluster), it stops before exiting and says whether
every process has exited.
"""

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import ferry

HEIGHT = WIDTH = 32
CHANNELS = 3
CLASSES = 10


class LocalCluster:
    """A dispatcher and N workers on 127.0.0.1 (port 0) run from a build tree.

    Used as a context manager; stop() sends SIGTERM to every process started,
    waits up to 10 s each, SIGKILLs what is left, and raises RuntimeError if
    any process still exists afterwards (so "stopped" is only said when true).
    """

    def __init__(self, build_dir, workers=1, worker_threads=None, log_dir=None):
        self.build_dir = os.path.abspath(build_dir)
        self.nworkers = workers
        self.worker_threads = worker_threads
        self.procs = []  # (name, Popen)
        self._own_dir = log_dir is None
        self.dir = log_dir or tempfile.mkdtemp(prefix="ferry-cluster-")
        os.makedirs(self.dir, exist_ok=True)
        self.dispatcher = None
        self.workers = []
        for name in ("dispatcher/ferry-dispatcher", "worker/ferry-worker"):
            path = os.path.join(self.build_dir, name)
            if not os.access(path, os.X_OK):
                raise FileNotFoundError(
                    f"{path}: not found or not executable (build the tree "
                    f"with `cmake --build {build_dir} --target ferry-dispatcher "
                    f"ferry-worker`, or give --build-dir / FERRY_BUILD_DIR)")

    def _start(self, name, argv, timeout=10.0):
        """Start a daemon and return the HOST:PORT of its 'listening on' line."""
        with open(os.path.join(self.dir, name + ".err"), "wb") as err:
            p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err,
                                 stdin=subprocess.DEVNULL)
        self.procs.append((name, p))
        found = []
        seen = threading.Event()

        def drain():  # copy stdout to NAME.out; never let the daemon block
            with p.stdout, open(os.path.join(self.dir, name + ".out"),
                                "wb") as out:
                for line in p.stdout:
                    out.write(line)
                    out.flush()
                    text = line.decode(errors="replace")
                    if not found and "listening on " in text:
                        found.append(text.split("listening on ", 1)[1].strip())
                        seen.set()
            seen.set()  # EOF: the daemon exited

        threading.Thread(target=drain, name=f"{name}-stdout",
                         daemon=True).start()
        seen.wait(timeout)
        if found:
            return found[0]
        with open(os.path.join(self.dir, name + ".err"), "rb") as f:
            log = f.read().decode(errors="replace")[-2000:]
        raise RuntimeError(f"{name} did not print 'listening on' within "
                           f"{timeout:.0f} s (exit status {p.poll()}); its "
                           f"stderr:\n{log}")

    def start(self):
        try:
            self.dispatcher = self._start("dispatcher", [
                os.path.join(self.build_dir, "dispatcher/ferry-dispatcher"),
                "--host", "127.0.0.1", "--port", "0",
                "--work-dir", os.path.join(self.dir, "dispatcher-state")])
            for i in range(self.nworkers):
                self.workers.append(self._start(f"worker{i + 1}", [
                    os.path.join(self.build_dir, "worker/ferry-worker"),
                    "--dispatcher", self.dispatcher, "--host", "127.0.0.1",
                    "--port", "0"] + ([] if self.worker_threads is None else
                                      ["--threads", str(self.worker_threads)])))
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self):
        """Stop every process started; raise RuntimeError if one is left."""
        for _, p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        left = []
        for name, p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                print(f"{name} (pid {p.pid}) ignored SIGTERM for 10 s: SIGKILL",
                      file=sys.stderr)
                p.kill()
                try:
                    p.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
            if p.poll() is None:
                left.append(f"{name} (pid {p.pid})")
        pids = [p.pid for _, p in self.procs]
        n = len(self.procs)
        self.procs = []
        if left:
            raise RuntimeError("still running after the shutdown: " +
                               ", ".join(left))
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)
        return n, pids

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        n, pids = self.stop()
        if n:
            print(f"stopped the local cluster: all {n} processes it started "
                  f"have exited (pids {' '.join(map(str, pids))})")
        return False


def generate(build_dir, out, records, shards=4, seed=7):
    ferryctl = os.path.join(build_dir, "client/ctl/ferryctl")
    subprocess.run([ferryctl, "gen", "--out", out, "--shards", str(shards),
                    "--records", str(records), "--format", "raw",
                    "--size", f"{HEIGHT}x{WIDTH}", "--channels", str(CHANNELS),
                    "--classes", str(CLASSES), "--seed", str(seed)],
                   check=True, stdout=subprocess.DEVNULL)


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        def block(cin, cout):  # conv, batch norm, ReLU, halve the size
            return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False),
                                 nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
                                 nn.MaxPool2d(2))
        self.features = nn.Sequential(block(CHANNELS, 32), block(32, 64),
                                      block(64, 64))      # 32 -> 4
        self.fc = nn.Linear(64 * 4 * 4, CLASSES)

    def forward(self, x):
        return self.fc(torch.flatten(self.features(x), 1))


def train(args, dispatcher, data):
    cuda = torch.cuda.is_available() and not args.cpu
    device = "cuda:0" if cuda else "cpu"
    spec = (f'tfrecord("{data}/train-*.tfrecord") | '
            f"decode(raw, {HEIGHT}, {WIDTH}, {CHANNELS}) | shuffle(seed=7, buffer=4096) | "
            f"batch({args.batch_size})")
    model = SmallCNN().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    print(f"training on {device}, {args.steps} steps of {args.batch_size}; "
          f"spec: {spec}; augment: {args.augment}")
    step = 0
    t0 = time.perf_counter()
    # epochs=None: as many epochs as the steps need; the loop stops the job.
    with ferry.Client(dispatcher, spec, epochs=None, drop_remainder=True,
                      augment=args.augment,
                      dtype="float32", layout="NCHW", device=device,
                      timeout=args.timeout) as client:
        for batch in client:
            x = torch.from_dlpack(batch.images)   # float32 NCHW on `device`
            y = torch.from_dlpack(batch.labels).to(device)  # host int64
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            del x, y, batch  # the ring slot goes back once these are gone
            step += 1
            if step % args.log_every == 0 or step == args.steps:
                print(f"step {step:5d}  loss {loss.item():.4f}")
            if step >= args.steps:
                break
        st = client.stats()
    elapsed = time.perf_counter() - t0
    print(f"input stall fraction: {st['stall_fraction']:.3f} "
          f"(waited {st['wait_seconds']:.2f} s of {st['total_seconds']:.2f} s)")
    print(f"records/s: {st['records'] / max(st['total_seconds'], 1e-9):.0f} "
          f"({st['records']} records in {st['batches']} batches, "
          f"{elapsed:.2f} s of training loop)")
    return st


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dispatcher",
                    help="HOST:PORT of an existing cluster (default: start a "
                         "local one from --build-dir)")
    ap.add_argument("--build-dir", default=os.environ.get("FERRY_BUILD_DIR"),
                    help="build tree with the daemons and ferryctl "
                         "(default: $FERRY_BUILD_DIR)")
    ap.add_argument("--data",
                    help="dataset directory with train-*.tfrecord (32x32x3 raw "
                         "images); default: generate one with ferryctl gen")
    ap.add_argument("--records", type=int, default=20000,
                    help="records to generate when --data is not given")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--augment",
                    default="flip(horizontal) | rotate(0.1) | zoom(0.1) | "
                            "rescale(1/255)")
    ap.add_argument("--timeout", type=float, default=60.0,
                    help="seconds to wait for the dispatcher and each batch")
    ap.add_argument("--cpu", action="store_true",
                    help="train on the CPU even when CUDA is available")
    args = ap.parse_args(argv)
    if args.steps < 1 or args.batch_size < 1 or args.log_every < 1:
        ap.error("--steps, --batch-size and --log-every must be >= 1")
    if not args.dispatcher and not args.build_dir:
        ap.error("give --dispatcher (an existing cluster) or --build-dir / "
                 "FERRY_BUILD_DIR (to start a local one)")
    if not args.data and not args.build_dir:
        ap.error("give --data, or --build-dir / FERRY_BUILD_DIR for ferryctl gen")
    torch.manual_seed(0)

    tmp = None
    try:
        data = args.data
        if not data:
            tmp = tempfile.mkdtemp(prefix="ferry-train-torch-")
            data = os.path.join(tmp, "data")
            generate(args.build_dir, data, args.records)
            print(f"generated {args.records} records in {data}")
        data = os.path.abspath(data)
        if args.dispatcher:
            train(args, args.dispatcher, data)
        else:
            with LocalCluster(args.build_dir, workers=1) as cluster:
                print(f"local cluster: dispatcher {cluster.dispatcher}, "
                      f"worker {cluster.workers[0]}")
                train(args, cluster.dispatcher, data)
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
