"""Fixtures of the Python suite (see ferrytest.py for the cluster and the
datasets).

  small       session dataset: 4 shards, 1,000 records of 8x8x3
  medium      session dataset: 8 shards, 6,000 records of 8x8x3
  tiny        session dataset: 2 shards, 4,000 records of 4x4x1 (memory)
  cluster     a dispatcher and one worker, stopped after the test
  make_cluster(workers=N, ...)  more clusters, all stopped after the test
"""
import os
import threading

import pytest

import ferrytest


def pytest_configure(config):
    missing = ferrytest.check_binaries()
    if missing:
        raise pytest.UsageError(
            "daemons not built: %s (set FERRY_PY_DISPATCHER, "
            "FERRY_PY_WORKER, FERRY_PY_FERRYCTL or FERRY_BUILD_DIR)"
            % ", ".join(missing))


def pytest_report_header(config):
    import ferry
    return ["ferry %s from %s (libferry %s)" % (
                getattr(ferry, "__version__", "?"), ferry.__file__,
                ferry.version()),
            "daemons: %s, %s, %s" % (ferrytest.DISPATCHER, ferrytest.WORKER,
                                     ferrytest.FERRYCTL)]


@pytest.fixture(scope="session")
def small(tmp_path_factory):
    return ferrytest.Dataset(str(tmp_path_factory.mktemp("small")), 4, 1000)


@pytest.fixture(scope="session")
def medium(tmp_path_factory):
    return ferrytest.Dataset(str(tmp_path_factory.mktemp("medium")), 8, 6000)


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    return ferrytest.Dataset(str(tmp_path_factory.mktemp("tiny")), 2, 4000,
                             size=(4, 4), channels=1)


@pytest.fixture
def make_cluster(tmp_path):
    made = []

    def make(workers=1, **kw):
        c = ferrytest.Cluster(str(tmp_path / ("cluster%d" % len(made))),
                              workers=workers, **kw)
        made.append(c)
        return c

    yield make
    for c in made:
        c.stop(check=False)
    left = [(d.name, d.pid) for c in made for d in c.daemons
            if d.alive() or not ferrytest.pid_gone(d.pid)]
    assert not left, "daemons left alive after the test: %s" % left


@pytest.fixture
def cluster(make_cluster):
    return make_cluster(workers=1)


@pytest.fixture(autouse=True)
def no_stray_threads():
    """Fails a test that leaves a thread of its own running."""
    before = set(threading.enumerate())
    yield
    left = [t for t in threading.enumerate()
            if t not in before and t.is_alive() and not t.daemon]
    for t in left:
        t.join(timeout=5)
    left = [t.name for t in left if t.is_alive()]
    assert not left, "threads left running: %s" % left


@pytest.fixture
def torch():
    return ferrytest.torch_or_skip()


@pytest.fixture
def as_tensor():
    """torch.from_dlpack when torch is there, else numpy.from_dlpack: for
    tests about holds and lifetimes, which must not skip without torch."""
    try:
        import torch as t
        return t.from_dlpack
    except Exception as e:
        import numpy
        print("no torch (%s): tensors are numpy.from_dlpack arrays" % e)
        return numpy.from_dlpack


os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
