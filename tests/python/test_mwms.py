"""TensorFlow MultiWorkerMirroredStrategy over Ferry ranks: two worker
processes (mwms_worker.py) on 127.0.0.1, each with
TF_CONFIG {"cluster": {"worker": [a, b]}, "task": {"type": "worker",
"index": i}}, train a small Keras model for two epochs on
ferry.tf.dataset, whose Ferry rank comes from TF_CONFIG too. Both must
take the same number of steps per epoch, the dataset's cardinality
(steps_per_epoch), each of batch_size records, and every record of an
epoch (less the dropped remainder) must reach exactly one of them; the
loss must go down. Then the same with one of the two Ferry workers
SIGKILLed after a random number of batches (seeded, printed: FERRY_PY_SEED replays it).

The workers run in the TensorFlow venv: this interpreter when it has
TensorFlow (run.sh tensorflow), else FERRY_TF_VENV or
~/.cache/ferry/venv-tf (tests/python/setup-venv.sh --tf makes it and
installs this tree's wheel there). Skipped, with the reason, when no such
venv has TensorFlow and a ferry with ranks.
"""
import collections
import importlib.util
import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid

import pytest

import ferrytest

HERE = os.path.dirname(os.path.abspath(__file__))
WORKERS = 2
BATCH = 16
RECORDS = 300        # 9 rounds of 2 x 16, 12 records dropped per epoch
EPOCHS = 2
CLASSES = 10
RUN_TIMEOUT_S = 150  # both TensorFlow processes, start to end
PROBE_TIMEOUT_S = 120
SLEEP_MS = 50        # per step under a fault: the run lasts long enough
OTHER_LAUNCHERS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "HOROVOD_RANK",
                   "HOROVOD_SIZE", "OMPI_COMM_WORLD_RANK",
                   "OMPI_COMM_WORLD_SIZE", "TF_CONFIG")

PROBE = r"""
import json, sys
import tensorflow as tf
import ferry, ferry.tf
why = None
try:
    ferry.Client("127.0.0.1:1", "x", rank=0, world_size=1, timeout=0.5)
except TypeError as e:
    if "rank" in str(e) or "world_size" in str(e):
        why = "ferry.Client has no rank/world_size parameter (%s)" % e
except Exception:
    pass
print(json.dumps({"tf": tf.__version__, "ferry": ferry.__file__,
                  "why": why}))
"""


def _env():
    env = {k: v for k, v in os.environ.items() if k not in OTHER_LAUNCHERS}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONDONTWRITEBYTECODE="1",
               CUDA_VISIBLE_DEVICES="", TF_NUM_INTEROP_THREADS="2",
               TF_NUM_INTRAOP_THREADS="1")
    return env


_python = {}


def tf_python():
    """(python, None) of an interpreter with TensorFlow and a ferry with
    ranks, or (None, reason)."""
    if "v" in _python:
        return _python["v"]
    if importlib.util.find_spec("tensorflow") is not None:
        py = sys.executable
    else:
        venv = os.environ.get("FERRY_TF_VENV",
                              os.path.expanduser("~/.cache/ferry/venv-tf"))
        py = os.path.join(venv, "bin", "python")
        if not os.access(py, os.X_OK):
            _python["v"] = (None, "no TensorFlow here and no TensorFlow "
                            "venv at %s (tests/python/setup-venv.sh --tf "
                            "makes it)" % venv)
            return _python["v"]
    try:
        p = subprocess.run([py, "-c", PROBE], capture_output=True,
                           timeout=PROBE_TIMEOUT_S, env=_env(), cwd="/")
    except subprocess.TimeoutExpired:
        _python["v"] = (None, "%s: importing tensorflow and ferry took "
                        "over %d s" % (py, PROBE_TIMEOUT_S))
        return _python["v"]
    lines = p.stdout.decode(errors="replace").strip().splitlines()
    if p.returncode != 0 or not lines:
        _python["v"] = (None, "%s cannot import tensorflow and ferry "
                        "(exit %s): %s" % (
                            py, p.returncode,
                            p.stderr.decode(errors="replace")[-600:]))
        return _python["v"]
    info = json.loads(lines[-1])
    if info["why"]:
        _python["v"] = (None, "%s (ferry at %s; tests/python/setup-venv.sh "
                        "--tf installs this tree's)" % (info["why"],
                                                        info["ferry"]))
        return _python["v"]
    print("TensorFlow %s, ferry %s, in %s" % (info["tf"], info["ferry"], py))
    _python["v"] = (py, None)
    return _python["v"]


@pytest.fixture
def tfpy():
    py, why = tf_python()
    if py is None:
        pytest.skip(why)
    return py


@pytest.fixture(scope="module")
def mwms_data(tmp_path_factory):
    return ferrytest.Dataset(str(tmp_path_factory.mktemp("mwms")), 6,
                             RECORDS)


def progress(out_dir):
    n = 0
    for i in range(WORKERS):
        try:
            with open(os.path.join(out_dir, "progress.%d" % i)) as f:
                n += sum(1 for _ in f)
        except FileNotFoundError:
            pass
    return n


def run_workers(py, cluster, data, out_dir, rng=None, fault_kind="worker"):
    """Runs the two TensorFlow workers; with rng, SIGKILLs one Ferry worker
    after a random number of batches taken from Ferry by both. Returns ({task: result},
    seconds, fault description or None)."""
    os.makedirs(out_dir)
    job = "mwms-" + uuid.uuid4().hex[:8]
    hosts = ["127.0.0.1:%d" % p for p in ferrytest.free_ports(WORKERS)]
    procs, logs = [], []
    t0 = time.monotonic()
    fault = None
    try:
        for i in range(WORKERS):
            env = _env()
            env["TF_CONFIG"] = json.dumps({
                "cluster": {"worker": hosts},
                "task": {"type": "worker", "index": i}})
            log = os.path.join(out_dir, "worker%d.log" % i)
            logs.append(log)
            with open(log, "wb") as logf:
                procs.append(subprocess.Popen(
                    [py, os.path.join(HERE, "mwms_worker.py"),
                     "--dispatcher", cluster.addr, "--spec", data.spec(),
                     "--job", job, "--batch-size", str(BATCH),
                     "--epochs", str(EPOCHS), "--classes", str(CLASSES),
                     "--image", "%dx%dx%d" % (data.h, data.w, data.c),
                     "--out", os.path.join(out_dir, "result%d.json" % i),
                     "--progress", os.path.join(out_dir, "progress.%d" % i),
                     "--sleep-ms", str(SLEEP_MS if rng else 0),
                     "--timeout", "30"],
                    stdin=subprocess.DEVNULL, stdout=logf,
                    stderr=subprocess.STDOUT, env=env, cwd=HERE,
                    process_group=0, close_fds=True))
        deadline = t0 + RUN_TIMEOUT_S
        if rng is not None:
            total = WORKERS * EPOCHS * (RECORDS // (WORKERS * BATCH))
            kill_at = rng.randrange(1, total - 2 * WORKERS)
            while True:
                seen = progress(out_dir)
                if seen >= kill_at:
                    break
                ended = [p.returncode for p in procs if p.poll() is not None]
                assert not ended, (
                    "a TensorFlow worker ended (exit %s) after %d batches, "
                    "before the fault at %d:\n%s" % (
                        ended, seen, kill_at, tails(logs)))
                assert time.monotonic() < deadline, (
                    "%d of %d batches within %d s:\n%s"
                    % (seen, kill_at, RUN_TIMEOUT_S, tails(logs)))
                time.sleep(0.01)
            running = all(p.poll() is None for p in procs)
            what = ferrytest.inject(cluster, rng, fault_kind)
            fault = ("Ferry: %s after %d of %d batches (%.1f s into the "
                     "run)" % (what, seen, total, time.monotonic() - t0))
            print(fault)
            assert running, "the workers ended before the fault"
        for p in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
    except BaseException:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=10)
        print(tails(logs))
        raise
    seconds = time.monotonic() - t0
    results = {}
    for i, p in enumerate(procs):
        path = os.path.join(out_dir, "result%d.json" % i)
        assert os.path.exists(path), (
            "worker %d wrote no result (exit %s):\n%s\n%s"
            % (i, p.returncode, tails(logs), cluster.logs()))
        with open(path) as f:
            results[i] = json.load(f)
        assert "error" not in results[i], (
            "worker %d failed:\n%s\n%s\n%s" % (
                i, results[i]["error"], tails(logs), cluster.logs()))
        assert p.returncode == 0, (i, p.returncode, tails(logs))
    return results, seconds, fault


def tails(logs, n=3000):
    out = []
    for log in logs:
        try:
            with open(log, errors="replace") as f:
                out.append("---- %s\n%s" % (log, f.read()[-n:]))
        except OSError:
            pass
    return "\n".join(out)


def check(results, data):
    s = RECORDS // (WORKERS * BATCH)
    lines = []
    for i, r in sorted(results.items()):
        assert r["replicas"] == WORKERS, r["replicas"]
        assert r["pipeline"] == [i, WORKERS], r["pipeline"]
        # TF_CONFIG's worker i is Ferry rank i (ferry.launcher_rank()).
        assert (r["rank"], r["world_size"]) == (i, WORKERS), (
            i, r["rank"], r["world_size"])
        assert r["cardinality"] == s * EPOCHS, (
            "worker %d: cardinality %s, steps per epoch %d"
            % (i, r["cardinality"], s))
        assert r["steps_per_epoch"] == s, (i, r["steps_per_epoch"], s)
        steps = [e["steps"] for e in r["epochs"]]
        lines.append("worker %d (rank %s): steps per epoch %s, loss %s, "
                     "cardinality %d (%.1f s)" % (
                         i, r.get("rank"), steps,
                         ["%.3f" % e["loss"] for e in r["epochs"]],
                         r["cardinality"], r["seconds"]))
        assert steps == [s] * EPOCHS, (i, steps)
        assert r["exhausted"], "worker %d: batches left after %d epochs" % (
            i, EPOCHS)
        fes = []
        for k, e in enumerate(r["epochs"]):
            assert set(e["sizes"]) == {BATCH}, (i, k, sorted(set(e["sizes"])))
            assert len(set(e["ferry_epochs"])) == 1, (
                "worker %d: Keras epoch %d holds Ferry epochs %s"
                % (i, k, sorted(set(e["ferry_epochs"]))))
            fes.append(e["ferry_epochs"][0])
        assert len(set(fes)) == EPOCHS, (i, fes)
        assert r["epochs"][-1]["loss"] < r["epochs"][0]["loss"], (
            "worker %d: loss did not go down: %s" % (
                i, [e["loss"] for e in r["epochs"]]))
    print("\n".join(lines))
    # The loss is all-reduced: the workers see the same one.
    l0, l1 = results[0]["losses"], results[1]["losses"]
    assert len(l0) == len(l1) and all(
        abs(a - b) <= 1e-4 * max(1.0, abs(a)) for a, b in zip(l0, l1)), (
        l0, l1)
    for k in range(EPOCHS):
        counts = collections.Counter()
        for r in results.values():
            counts.update(r["epochs"][k]["ids"])
        dup = sorted(i for i, c in counts.items() if c != 1)
        assert not dup, "epoch %d: %d ids twice, e.g. %s" % (
            k, len(dup), dup[:5])
        assert set(counts) <= data.ids()
        assert len(counts) == s * WORKERS * BATCH, (k, len(counts))


def test_mwms_two_workers(tfpy, make_cluster, mwms_data, tmp_path):
    cluster = make_cluster(workers=2)
    results, secs, _ = run_workers(tfpy, cluster, mwms_data,
                                   str(tmp_path / "out"))
    print("MultiWorkerMirroredStrategy, %d workers, %d records, batch %d: "
          "%.1f s" % (WORKERS, RECORDS, BATCH, secs))
    check(results, mwms_data)


@pytest.mark.parametrize("kind", ferrytest.FAULTS)
def test_mwms_fault(tfpy, make_cluster, mwms_data, tmp_path, kind):
    seed = int(os.environ.get("FERRY_PY_SEED",
                              random.SystemRandom().randrange(1 << 32)))
    print("seed %d (FERRY_PY_SEED=%d replays it)" % (seed, seed))
    cluster = make_cluster(workers=2)
    results, secs, fault = run_workers(tfpy, cluster, mwms_data,
                                       str(tmp_path / "out"),
                                       rng=random.Random(seed),
                                       fault_kind=kind)
    print("MultiWorkerMirroredStrategy, %d workers, %d records, batch %d, "
          "%s: %.1f s" % (WORKERS, RECORDS, BATCH, fault, secs))
    effects = ferrytest.fault_effects(cluster)
    print("dispatcher log: %d split restart(s) or lost/unreachable "
          "worker line(s) after the fault%s"
          % (len(effects), "".join("\n  " + ln for ln in effects)))
    check(results, mwms_data)
