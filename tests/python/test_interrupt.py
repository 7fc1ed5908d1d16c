"""Interrupt and resume: a KeyboardInterrupt inside next() must not lose
the batch next() was handing out. A trainer that caught Ctrl-C and went
on (a notebook) silently missed batches: the interrupt that came while
next() waited was raised by the interpreter right after next() returned,
and the returned batch was dropped unseen.

SIGINT is sent to the main thread at random moments (seeded, printed:
FERRY_PY_SEED replays one) during the first 100 of 120 batches of an
epoch of 6,000 records; the loop catches KeyboardInterrupt and goes on.
Every record id must arrive exactly once and every SIGINT must surface as
one KeyboardInterrupt. Waits are bounded by the client's timeout.

The interpreter raises a pending KeyboardInterrupt at the next bytecode
that checks for it, which may be the loop's own back edge outside the
try. So the sender and the loop take turns: a SIGINT goes out only after
the loop has entered its try (`armed`), at most one is in flight, and the
loop joins the sender inside the try before the epoch can end."""
import collections
import os
import random
import signal
import threading
import time

import numpy

import ferry
import ferrytest


def test_interrupted_next_keeps_its_batch(make_cluster, medium):
    seed = int(os.environ.get("FERRY_PY_SEED", time.time_ns() % 2**32))
    print("seed %d (FERRY_PY_SEED=%d replays it)" % (seed, seed))
    rng = random.Random(seed)
    cl = make_cluster(workers=2)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    main = threading.main_thread().ident
    assert threading.get_ident() == main
    armed = threading.Event()  # the loop is inside its try
    done = threading.Event()
    sent = [0]

    def interrupter():
        while not done.is_set():
            if not armed.wait(0.1):
                continue
            armed.clear()
            if done.wait(rng.uniform(0.002, 0.025)):
                return
            sent[0] += 1
            signal.pthread_kill(main, signal.SIGINT)

    got = {}  # batch index -> ids: storing twice is harmless
    interrupts = 0
    b = None
    stopped = False
    c = ferry.Client(cl.addr, medium.spec(batch=50), timeout=30, prefetch=3)
    t = threading.Thread(target=interrupter, daemon=True)
    t.start()
    try:
        while True:
            try:
                armed.set()
                while True:
                    if b is not None:
                        # The loop's own bookkeeping, interrupted or not:
                        # a batch next() returned is recorded before the
                        # next one is asked for.
                        got[b.index] = numpy.asarray(b.ids).tolist()
                        b = None
                        time.sleep(0.004)  # a training step
                    if not stopped and len(got) >= 100:
                        done.set()
                        t.join(30)
                        assert not t.is_alive(), "the SIGINT sender hangs"
                        stopped = True
                    b = c.next()
            except StopIteration:
                break
            except KeyboardInterrupt:
                interrupts += 1
    finally:
        done.set()
    c.close()
    print("%d SIGINTs sent, %d KeyboardInterrupts caught, %d batches" %
          (sent[0], interrupts, len(got)))
    assert stopped, "the epoch ended before 100 batches"
    assert interrupts == sent[0], "a SIGINT was lost or raised twice"
    assert interrupts >= 3, "too few interrupts to test anything"
    ferrytest.assert_exactly_once(
        collections.Counter(i for ids in got.values() for i in ids),
        medium.ids())
