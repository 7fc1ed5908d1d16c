#!/usr/bin/python3
"""Calls a ferry-dispatcher that serves mutual TLS with per-role tokens
from Python grpcio. With the CA, a client certificate and the
status token, GetStatus succeeds; without the token or with a wrong one it
is UNAUTHENTICATED; the status token on a client method is
PERMISSION_DENIED; a plaintext channel, a channel trusting another CA and
one without a client certificate get no answer; Health/Check needs no
token.

Usage: grpcio_tls.py --target HOST:PORT --proto-dir DIR --certs DIR
                     [--work DIR]
Prints one line per check and "grpcio_tls: N passed, M failed"; exits 1
when anything failed, 77 when grpcio or protoc is missing.
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
    ap.add_argument("--certs", required=True)
    ap.add_argument("--work")
    args = ap.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="ferry-grpcio-tls-")
    rc = ferry_interop.generate("grpcio_tls", args.proto_dir, work)
    if rc != 0:
        return rc
    import grpc
    from ferry.v1 import dispatcher_pb2
    from ferry_health import health_pb2

    def read(name):
        with open(os.path.join(args.certs, name), "rb") as f:
            return f.read()

    def token(name):
        return read(name).decode().strip()

    check = ferry_interop.Checks("grpcio_tls")

    def creds(ca="ca.pem", client=True):
        if client:
            return grpc.ssl_channel_credentials(
                root_certificates=read(ca), private_key=read("client.key"),
                certificate_chain=read("client.pem"))
        return grpc.ssl_channel_credentials(root_certificates=read(ca))

    def status_call(ch, tok, method="GetStatus"):
        req = dispatcher_pb2.GetStatusRequest()
        resp = dispatcher_pb2.GetStatusResponse
        if method == "GetOrCreateJob":
            req = dispatcher_pb2.GetOrCreateJobRequest(dataset_id="x")
            resp = dispatcher_pb2.GetOrCreateJobResponse
        call = ch.unary_unary(f"/ferry.v1.Dispatcher/{method}",
                              request_serializer=type(req).SerializeToString,
                              response_deserializer=resp.FromString)
        md = [("authorization", f"Bearer {tok}")] if tok else None
        return call(req, timeout=5, metadata=md)

    def expect_code(name, ch, tok, code, method="GetStatus"):
        try:
            status_call(ch, tok, method)
            check(name, False, "answered OK")
        except grpc.RpcError as e:
            check(name, e.code() == code, f"{e.code()}: {e.details()}")

    with grpc.secure_channel(args.target, creds()) as ch:
        try:
            r = status_call(ch, token("status.token"))
            check("GetStatus with the CA, a client cert and the status token",
                  bool(r.version), repr(r.version))
        except grpc.RpcError as e:
            check("GetStatus with the CA, a client cert and the status token",
                  False, f"{e.code()}: {e.details()}")
        try:
            status_call(ch, token("client.token"))
            check("GetStatus with the client token", True)
        except grpc.RpcError as e:
            check("GetStatus with the client token", False, str(e.code()))
        expect_code("GetStatus without a token is UNAUTHENTICATED", ch, None,
                    grpc.StatusCode.UNAUTHENTICATED)
        expect_code("GetStatus with a wrong token is UNAUTHENTICATED", ch,
                    token("wrong.token"), grpc.StatusCode.UNAUTHENTICATED)
        expect_code("the status token on GetOrCreateJob is PERMISSION_DENIED",
                    ch, token("status.token"),
                    grpc.StatusCode.PERMISSION_DENIED, "GetOrCreateJob")
        health = ch.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
            response_deserializer=health_pb2.HealthCheckResponse.FromString)
        try:
            r = health(health_pb2.HealthCheckRequest(service=""), timeout=5)
            check("Health/Check needs no token",
                  r.status == health_pb2.HealthCheckResponse.SERVING,
                  str(r.status))
        except grpc.RpcError as e:
            check("Health/Check needs no token", False, str(e.code()))

    for name, ch in (
            ("plaintext", grpc.insecure_channel(args.target)),
            ("trusting another CA",
             grpc.secure_channel(args.target, creds("other-ca.pem"))),
            ("without a client certificate",
             grpc.secure_channel(args.target, creds(client=False)))):
        with ch:
            try:
                status_call(ch, token("status.token"))
                check(f"GetStatus {name} fails", False, "answered OK")
            except grpc.RpcError as e:
                check(f"GetStatus {name} fails",
                      e.code() in (grpc.StatusCode.UNAVAILABLE,
                                   grpc.StatusCode.DEADLINE_EXCEEDED),
                      f"{e.code()}: {e.details()}")

    return check.summary()


if __name__ == "__main__":
    sys.exit(main())
