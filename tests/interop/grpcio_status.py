#!/usr/bin/python3
"""Calls a running ferry-dispatcher from Python grpcio (Debian's
python3-grpcio and python3-protobuf, no venv): grpc.health.v1.Health/Check
and ferry.v1.Dispatcher/GetStatus, with message classes generated here by
protoc from proto/. Passing proves the protocol is plain gRPC.

Usage: grpcio_status.py --target HOST:PORT --proto-dir DIR [--work DIR]
Prints one line per check and "grpcio: N passed, M failed"; exits 1 when
anything failed, 77 when grpcio or protoc is missing.
"""
import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ferry_interop  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--proto-dir", required=True)
    ap.add_argument("--work")
    args = ap.parse_args()

    work = args.work or tempfile.mkdtemp(prefix="ferry-grpcio-")
    rc = ferry_interop.generate("grpcio", args.proto_dir, work)
    if rc != 0:
        return rc
    import grpc
    from ferry.v1 import dispatcher_pb2
    from ferry_health import health_pb2

    check = ferry_interop.Checks("grpcio")

    with grpc.insecure_channel(args.target) as ch:
        try:
            grpc.channel_ready_future(ch).result(timeout=5)
            check("connect", True)
        except grpc.FutureTimeoutError:
            check("connect", False, f"{args.target} not ready within 5 s")
            return check.summary()

        health = ch.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
            response_deserializer=health_pb2.HealthCheckResponse.FromString)
        serving = health_pb2.HealthCheckResponse.SERVING
        for service in ("", "ferry.v1.Dispatcher"):
            try:
                r = health(health_pb2.HealthCheckRequest(service=service),
                           timeout=5)
                check(f"Health/Check({service!r}) is SERVING",
                      r.status == serving,
                      health_pb2.HealthCheckResponse.ServingStatus.Name(
                          r.status))
            except grpc.RpcError as e:
                check(f"Health/Check({service!r})", False,
                      f"{e.code()}: {e.details()}")
        try:
            health(health_pb2.HealthCheckRequest(service="no.such.Service"),
                   timeout=5)
            check("Health/Check(unknown) is NOT_FOUND", False,
                  "answered OK")
        except grpc.RpcError as e:
            check("Health/Check(unknown) is NOT_FOUND",
                  e.code() == grpc.StatusCode.NOT_FOUND, str(e.code()))

        status = ch.unary_unary(
            "/ferry.v1.Dispatcher/GetStatus",
            request_serializer=dispatcher_pb2.GetStatusRequest
            .SerializeToString,
            response_deserializer=dispatcher_pb2.GetStatusResponse.FromString)
        try:
            r = status(dispatcher_pb2.GetStatusRequest(), timeout=5)
            check("Dispatcher/GetStatus answers", True)
            check("GetStatus: version is set", bool(r.version),
                  repr(r.version))
            check("GetStatus: uptime >= 0", r.uptime_ms >= 0,
                  str(r.uptime_ms))
            # The wrapper starts a bare dispatcher: nothing registered yet.
            check("GetStatus: no jobs on a fresh dispatcher",
                  len(r.jobs) == 0, str(len(r.jobs)))
            # Re-encoding round-trips: the answer is well-formed protobuf
            # with no fields Python did not understand.
            again = dispatcher_pb2.GetStatusResponse.FromString(
                r.SerializeToString())
            check("GetStatus: round-trips through Python protobuf",
                  again == r)
        except grpc.RpcError as e:
            check("Dispatcher/GetStatus", False,
                  f"{e.code()}: {e.details()}")

        unknown = ch.unary_unary("/ferry.v1.Dispatcher/NoSuchMethod")
        try:
            unknown(b"", timeout=5)
            check("unknown method is UNIMPLEMENTED", False, "answered OK")
        except grpc.RpcError as e:
            check("unknown method is UNIMPLEMENTED",
                  e.code() == grpc.StatusCode.UNIMPLEMENTED, str(e.code()))

    return check.summary()


if __name__ == "__main__":
    sys.exit(main())
