#!/usr/bin/env python3
"""grpc.testing.TestService in Python grpcio: a reference peer for our Swift gRPC client.

Implements the server features of the public gRPC interop test descriptions
(doc/interop-test-descriptions.md in grpc/grpc): EmptyCall, UnaryCall, CacheableUnaryCall,
StreamingOutputCall, StreamingInputCall, FullDuplexCall, HalfDuplexCall, Echo Status, Echo Metadata,
CompressedResponse, interval_us. Also serves grpc.health.v1.Health and server reflection
(v1alpha, and v1 through the same servicer: the two protocols are identical on the wire).

Known limit: grpcio never tells a servicer whether a request message was compressed, so the
CompressedRequest feature (`expect_compressed`) cannot be checked here: such requests are accepted
as they come. Run clients' client_compressed_* cases without their feature probe against this server.

Usage: interop_server.py --port P [--max-seconds 600]   (binds 127.0.0.1; --port 0 picks a port,
printed as `listening on 127.0.0.1:PORT`). Stops by itself after --max-seconds, or on SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from concurrent import futures

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import grpc  # noqa: E402
from grpc_health.v1 import health, health_pb2, health_pb2_grpc  # noqa: E402
from grpc_reflection.v1alpha import reflection  # noqa: E402
from grpc_reflection.v1alpha import reflection_pb2 as reflection_v1alpha_pb2  # noqa: E402

import testproto as tp  # noqa: E402

messages = tp.messages_pb2
ECHO_INITIAL = "x-grpc-test-echo-initial"
ECHO_TRAILING = "x-grpc-test-echo-trailing-bin"
MAX_RESPONSE = 16 * 1024 * 1024


def _payload(size: int, context) -> messages.Payload:
    if size < 0 or size > MAX_RESPONSE:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"response size {size} outside 0…{MAX_RESPONSE}")
    return messages.Payload(type=messages.COMPRESSABLE, body=bytes(size))


def _check_type(response_type: int, context) -> None:
    if response_type != messages.COMPRESSABLE:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unsupported response_type {response_type}")


def _echo_metadata(context) -> None:
    """Echo Metadata: initial key back in initial metadata, trailing key back in trailers."""
    initial, trailing = [], []
    for key, value in context.invocation_metadata():
        if key == ECHO_INITIAL:
            initial.append((key, value))
        elif key == ECHO_TRAILING:
            trailing.append((key, value))
    if initial:
        context.send_initial_metadata(initial)
    if trailing:
        context.set_trailing_metadata(trailing)


def _echo_status(request, context) -> None:
    """Echo Status: end the call with the requested code and message."""
    if request.HasField("response_status") and request.response_status.code != 0:
        context.abort(tp.status_code(request.response_status.code), request.response_status.message)


class TestService(tp.test_pb2_grpc.TestServiceServicer):
    def EmptyCall(self, request, context):
        _echo_metadata(context)
        return tp.empty_pb2.Empty()

    def UnaryCall(self, request, context):
        _echo_metadata(context)
        _echo_status(request, context)
        _check_type(request.response_type, context)
        # expect_compressed cannot be verified with grpcio (see the module doc): accepted as is.
        if request.response_compressed.value:
            context.set_compression(grpc.Compression.Gzip)
        return messages.SimpleResponse(payload=_payload(request.response_size, context))

    def CacheableUnaryCall(self, request, context):
        context.send_initial_metadata([("cache-control", "max-age=60, public")])
        return messages.SimpleResponse(payload=messages.Payload(body=str(time.time_ns()).encode()))

    def _respond(self, request, context):
        """Responses for one StreamingOutputCallRequest, honouring compression and interval_us."""
        _echo_status(request, context)
        _check_type(request.response_type, context)
        for params in request.response_parameters:
            if params.interval_us > 0:
                time.sleep(params.interval_us / 1e6)
            if params.compressed.value:
                context.set_compression(grpc.Compression.Gzip)
            else:
                context.disable_next_message_compression()
            yield messages.StreamingOutputCallResponse(payload=_payload(params.size, context))

    def StreamingOutputCall(self, request, context):
        _echo_metadata(context)
        yield from self._respond(request, context)

    def StreamingInputCall(self, request_iterator, context):
        _echo_metadata(context)
        total = 0
        for request in request_iterator:
            total += len(request.payload.body)
        return messages.StreamingInputCallResponse(aggregated_payload_size=total)

    def FullDuplexCall(self, request_iterator, context):
        _echo_metadata(context)
        for request in request_iterator:
            yield from self._respond(request, context)

    def HalfDuplexCall(self, request_iterator, context):
        _echo_metadata(context)
        requests = list(request_iterator)
        for request in requests:
            yield from self._respond(request, context)


def build_server(port: int, max_concurrent_streams: int = 100) -> tuple[grpc.Server, int]:
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=32),
        options=[("grpc.max_concurrent_streams", max_concurrent_streams)],
    )
    tp.test_pb2_grpc.add_TestServiceServicer_to_server(TestService(), server)

    health_servicer = health.HealthServicer()
    for name in ("", tp.TEST_SERVICE):
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)

    services = [
        tp.TEST_SERVICE,
        health.SERVICE_NAME,
        reflection.SERVICE_NAME,
        "grpc.reflection.v1.ServerReflection",
    ]
    reflection_servicer = reflection.ReflectionServicer(services)
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                reflection.SERVICE_NAME,
                {
                    "ServerReflectionInfo": grpc.stream_stream_rpc_method_handler(
                        reflection_servicer.ServerReflectionInfo,
                        request_deserializer=reflection_v1alpha_pb2.ServerReflectionRequest.FromString,
                        response_serializer=reflection_v1alpha_pb2.ServerReflectionResponse.SerializeToString,
                    )
                },
            ),
            # v1 has the same messages and field numbers as v1alpha: serve it with the same code.
            grpc.method_handlers_generic_handler(
                "grpc.reflection.v1.ServerReflection",
                {
                    "ServerReflectionInfo": grpc.stream_stream_rpc_method_handler(
                        reflection_servicer.ServerReflectionInfo,
                        request_deserializer=reflection_v1alpha_pb2.ServerReflectionRequest.FromString,
                        response_serializer=reflection_v1alpha_pb2.ServerReflectionResponse.SerializeToString,
                    )
                },
            ),
        )
    )
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    if bound == 0:
        raise SystemExit(f"cannot bind 127.0.0.1:{port}")
    return server, bound


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, required=True, help="port on 127.0.0.1 (0: pick one)")
    parser.add_argument("--max-seconds", type=float, default=600.0, help="exit after this long (default 600)")
    parser.add_argument("--max-concurrent-streams", type=int, default=100)
    parser.add_argument("--use_tls", default="false", help="accepted for interop compatibility; only false")
    args = parser.parse_args(argv)
    if args.use_tls.lower() not in ("false", "0", "no"):
        parser.error("TLS is not supported by this test server")

    server, port = build_server(args.port, args.max_concurrent_streams)
    server.start()
    print(f"listening on 127.0.0.1:{port}", flush=True)

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stopped_early = stop.wait(args.max_seconds)
    server.stop(grace=1).wait()
    if not stopped_early:
        print(f"stopping after --max-seconds {args.max_seconds:g}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
