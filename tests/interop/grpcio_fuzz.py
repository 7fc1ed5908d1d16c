#!/usr/bin/python3
"""A bounded RPC-level fuzz test from Python grpcio: random bytes
and mutated valid protobuf bodies for every method of a running dispatcher
and worker (their Dispatcher, Worker and Health services). Passes when both
daemons still answer Health/Check SERVING and GetStatus afterwards, and
their resident memory grew by less than --max-growth-mb.

Usage: grpcio_fuzz.py --dispatcher HOST:PORT --dispatcher-pid PID
                      --worker HOST:PORT --worker-pid PID --proto-dir DIR
                      [--work DIR] [--calls N] [--seed S]
Prints one line per check and "grpcio_fuzz: N passed, M failed"; exits 1
when anything failed, 77 when grpcio or protoc is missing.
"""
import argparse
import os
import random
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ferry_interop  # noqa: E402


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


def mutate(rng, body):
    b = bytearray(body)
    for _ in range(rng.randint(1, 8)):
        op = rng.randrange(4)
        if op == 0 and b:
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        elif op == 1:
            b.insert(rng.randrange(len(b) + 1), rng.randrange(256))
        elif op == 2 and b:
            del b[rng.randrange(len(b))]
        else:
            # A varint field with a huge length prefix, or a repeat.
            b += bytes([rng.randrange(1, 16) << 3 | 2, 0xff, 0xff, 0xff, 0x0f])
    return bytes(b)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dispatcher", required=True)
    ap.add_argument("--dispatcher-pid", type=int, required=True)
    ap.add_argument("--worker", required=True)
    ap.add_argument("--worker-pid", type=int, required=True)
    ap.add_argument("--proto-dir", required=True)
    ap.add_argument("--work")
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--seed", type=int, default=int(time.time()))
    ap.add_argument("--max-growth-mb", type=int, default=64)
    args = ap.parse_args()
    print(f"grpcio_fuzz: seed {args.seed} (--seed {args.seed} replays it), "
          f"{args.calls} calls per method and kind")
    work = args.work or tempfile.mkdtemp(prefix="ferry-fuzz-")
    rc = ferry_interop.generate("grpcio_fuzz", args.proto_dir, work)
    if rc != 0:
        return rc
    import grpc
    from ferry.v1 import dispatcher_pb2 as d
    from ferry.v1 import worker_pb2 as w
    from ferry_health import health_pb2 as h

    rng = random.Random(args.seed)
    check = ferry_interop.Checks("grpcio_fuzz")

    # Valid bodies to mutate, one or more per method.
    seeds = {
        "/ferry.v1.Dispatcher/RegisterDataset": [
            d.RegisterDatasetRequest(records_per_split=10).SerializeToString()],
        "/ferry.v1.Dispatcher/GetOrCreateJob": [
            d.GetOrCreateJobRequest(
                dataset_id="0123456789abcdef",
                options=d.JobOptions(job_name="fuzz", num_epochs=2))
            .SerializeToString()],
        "/ferry.v1.Dispatcher/ClientHeartbeat": [
            d.ClientHeartbeatRequest(
                job_id=1, client_id=1, want_splits=4,
                progress=[d.SplitProgress(epoch=0, split=i, delivered=9,
                                          restart=True, lease=1)
                          for i in range(4)]).SerializeToString()],
        "/ferry.v1.Dispatcher/WorkerHeartbeat": [
            d.WorkerHeartbeatRequest(
                worker_id=0, address="127.0.0.1:9", threads=2,
                tasks=[d.TaskProgress(job_id=1, epoch=0, split=1, lease=1,
                                      produced=5, error_code=-1000,
                                      error="x")]).SerializeToString()],
        "/ferry.v1.Dispatcher/GetStatus": [b""],
        "/grpc.health.v1.Health/Check": [
            h.HealthCheckRequest(service="").SerializeToString()],
    }
    worker_seeds = {
        "/ferry.v1.Worker/StreamChunks": [
            w.StreamChunksRequest(job_id=1, client_id=1).SerializeToString()],
        "/grpc.health.v1.Health/Check": [
            h.HealthCheckRequest(service="").SerializeToString()],
    }

    def fuzz(target, table, streaming):
        codes = {}
        with grpc.insecure_channel(target) as ch:
            grpc.channel_ready_future(ch).result(timeout=5)
            for method, bodies in table.items():
                stream = method in streaming
                call = (ch.unary_stream if stream else ch.unary_unary)(method)
                for k in range(2 * args.calls):
                    if k % 2 == 0:
                        body = bytes(rng.randrange(256)
                                     for _ in range(rng.choice(
                                         (0, 1, 5, 40, 300, 4000))))
                    else:
                        body = mutate(rng, rng.choice(bodies))
                    try:
                        r = call(body, timeout=2)
                        if stream:
                            for _ in r:  # a stream ends or times out
                                pass
                        codes["OK"] = codes.get("OK", 0) + 1
                    except grpc.RpcError as e:
                        c = e.code().name
                        codes[c] = codes.get(c, 0) + 1
        return codes

    rss0 = (rss_kb(args.dispatcher_pid), rss_kb(args.worker_pid))
    t0 = time.time()
    dc = fuzz(args.dispatcher, seeds, ())
    wc = fuzz(args.worker, worker_seeds, ("/ferry.v1.Worker/StreamChunks",))
    print(f"grpcio_fuzz: {time.time() - t0:.1f} s; dispatcher answers {dc}; "
          f"worker answers {wc}")
    rss1 = (rss_kb(args.dispatcher_pid), rss_kb(args.worker_pid))
    for name, target in (("dispatcher", args.dispatcher),
                         ("worker", args.worker)):
        with grpc.insecure_channel(target) as ch:
            health = ch.unary_unary(
                "/grpc.health.v1.Health/Check",
                request_serializer=h.HealthCheckRequest.SerializeToString,
                response_deserializer=h.HealthCheckResponse.FromString)
            try:
                r = health(h.HealthCheckRequest(service=""), timeout=5)
                check(f"{name} still SERVING", r.status == r.SERVING,
                      str(r.status))
            except grpc.RpcError as e:
                check(f"{name} still SERVING", False, str(e.code()))
    with grpc.insecure_channel(args.dispatcher) as ch:
        status = ch.unary_unary(
            "/ferry.v1.Dispatcher/GetStatus",
            request_serializer=d.GetStatusRequest.SerializeToString,
            response_deserializer=d.GetStatusResponse.FromString)
        try:
            r = status(d.GetStatusRequest(), timeout=5)
            check("GetStatus answers after the fuzz", True)
            check("no dataset came from random bytes", r.datasets == 0,
                  str(r.datasets))
        except grpc.RpcError as e:
            check("GetStatus answers after the fuzz", False, str(e.code()))
    for name, a, b in (("dispatcher", rss0[0], rss1[0]),
                       ("worker", rss0[1], rss1[1])):
        grew = (b - a) / 1024
        print(f"grpcio_fuzz: {name} resident {a / 1024:.1f} -> "
              f"{b / 1024:.1f} MB")
        check(f"{name} memory grew by {grew:.1f} MB (< "
              f"{args.max_growth_mb} MB)", a > 0 and b > 0 and
              grew < args.max_growth_mb)
    return check.summary()


if __name__ == "__main__":
    sys.exit(main())
