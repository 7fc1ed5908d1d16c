"""Signals and threads: Ctrl-C interrupts a waiting next() within 200 ms;
one thread in next() at a time (RuntimeError); close() from another thread
wakes a waiting next() with ClosedError within 200 ms; batches and tensors
dropped in another thread give their slots back.

A next() that can never produce: a dispatcher without workers (the job
exists, nobody makes its records). Every such next() is bounded by the
client's timeout, so a failure fails instead of hanging."""
import gc
import signal
import threading
import time

import pytest

import ferry

WAIT_TIMEOUT = 10.0  # bounds a next() that should have been interrupted
BOUND_S = 0.200      # the contract: within 200 ms
SETTLE_S = 0.3       # let next() reach its wait before acting on it


def test_sigint_interrupts_a_waiting_next(make_cluster, small):
    cl = make_cluster(workers=0)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    main = threading.main_thread().ident
    assert threading.get_ident() == main
    c = ferry.Client(cl.addr, small.spec(batch=10), timeout=WAIT_TIMEOUT)
    sent = []
    entered = threading.Event()

    def send():
        entered.wait(WAIT_TIMEOUT)
        time.sleep(SETTLE_S)  # a delay, not synchronisation: see below
        sent.append(time.monotonic())
        signal.pthread_kill(main, signal.SIGINT)

    t = threading.Thread(target=send)
    t.start()
    try:
        t_enter = time.monotonic()
        entered.set()
        with pytest.raises(KeyboardInterrupt):
            c.next()
        t_raised = time.monotonic()
    finally:
        t.join(WAIT_TIMEOUT)
    assert sent, "the timer thread sent nothing"
    # next() was already waiting when the signal came (else this test
    # would prove nothing) ...
    assert sent[0] - t_enter >= SETTLE_S * 0.9
    took = t_raised - sent[0]
    print("KeyboardInterrupt %.1f ms after SIGINT" % (took * 1e3))
    assert took < BOUND_S, "KeyboardInterrupt after %.3f s" % took
    # ... and the client still closes cleanly and promptly.
    t0 = time.monotonic()
    c.close()
    c.close()  # idempotent
    assert time.monotonic() - t0 < 3.0
    with pytest.raises(ferry.ClosedError):
        c.next()


def _waiter(c, result, entered):
    entered.set()
    t0 = time.monotonic()
    try:
        c.next()
        result.append(("batch", time.monotonic(), t0))
    except BaseException as e:  # noqa: B902 - recorded for the assertions
        result.append((e, time.monotonic(), t0))


def test_concurrent_next_and_close_from_another_thread(make_cluster, small):
    cl = make_cluster(workers=0)
    c = ferry.Client(cl.addr, small.spec(batch=10), timeout=WAIT_TIMEOUT)
    result, entered = [], threading.Event()
    t = threading.Thread(target=_waiter, args=(c, result, entered))
    t.start()
    try:
        assert entered.wait(WAIT_TIMEOUT)
        time.sleep(SETTLE_S)
        assert not result, "the waiting next() returned: %r" % result
        # A second thread in next(): RuntimeError at once.
        t0 = time.monotonic()
        with pytest.raises(RuntimeError):
            c.next(timeout=5.0)
        assert time.monotonic() - t0 < 1.0
        assert not result, "the first next() was disturbed: %r" % result
        # close() from this thread wakes the waiter with ClosedError.
        t_close = time.monotonic()
        c.close()
        t.join(WAIT_TIMEOUT)
        assert not t.is_alive()
    finally:
        c.close()
        t.join(WAIT_TIMEOUT)
    exc, t_raised, _ = result[0]
    assert isinstance(exc, ferry.ClosedError), repr(exc)
    took = t_raised - t_close
    print("ClosedError %.1f ms after close()" % (took * 1e3))
    assert took < BOUND_S, "ClosedError after %.3f s" % took


def test_next_timeout_raises_timeout_error(make_cluster, small):
    cl = make_cluster(workers=0)
    with ferry.Client(cl.addr, small.spec(batch=10), timeout=5.0) as c:
        t0 = time.monotonic()
        with pytest.raises(ferry.TimeoutError) as ei:
            c.next(timeout=0.3)
        took = time.monotonic() - t0
        assert isinstance(ei.value, TimeoutError)
        assert 0.25 <= took < 0.3 + BOUND_S, took


def test_tensors_dropped_in_another_thread_release_slots(as_tensor, cluster,
                                                         small):
    with ferry.Client(cluster.addr, small.spec(batch=10), epochs=1,
                      prefetch=3, timeout=30.0) as c:
        for _ in range(5):  # 5 rounds of a full ring
            batches = [c.next() for _ in range(3)]
            tensors = [as_tensor(b.images) for b in batches]
            labels = [b.labels for b in batches]  # ferry.Array objects
            assert c.stats()["held"] == 3
            box = [batches, tensors, labels]
            del batches, tensors, labels

            def drop():
                box.clear()
                gc.collect()

            t = threading.Thread(target=drop)
            t.start()
            t.join(10)
            assert not t.is_alive()
            assert c.stats()["held"] == 0
