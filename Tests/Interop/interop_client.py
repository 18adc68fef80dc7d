#!/usr/bin/env python3
"""gRPC interop client (Python grpcio) for any server of grpc.testing.TestService.

The cases follow the public gRPC interop test descriptions (doc/interop-test-descriptions.md in
grpc/grpc). Where grpcio hides what a case must check (the compressed flag of each message) or
cannot do what it asks (compress one message of a stream and not the next), the case adds a check
over a hand-driven HTTP/2 connection (rawh2.py). Beyond TestService it checks grpc.health.v1.Health
and server reflection (v1alpha through grpcio-reflection's descriptor database, v1 with raw stubs).

Usage:
  interop_client.py --host 127.0.0.1 --port P --test_case all|NAME[,NAME...]
Prints one `PASS name` / `FAIL name: reason` line per case, then `interop: N passed, N failed`;
exits 1 if any case failed. `--list` prints the case names.
"""

from __future__ import annotations

import argparse
import gzip
import os
import queue
import sys
import time
import traceback
from typing import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import grpc  # noqa: E402
from google.protobuf import descriptor_pb2, descriptor_pool  # noqa: E402
from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (  # noqa: E402
    ProtoReflectionDescriptorDatabase,
)

import rawh2  # noqa: E402
import testproto as tp  # noqa: E402

messages = tp.messages_pb2
Empty = tp.empty_pb2.Empty
CALL_TIMEOUT = 10.0
SPECIAL_MESSAGE = "\t\ntest with whitespace\r\nand Unicode BMP \u263a and non-BMP \U0001f608\t\n"
ECHO_INITIAL = ("x-grpc-test-echo-initial", "test_initial_metadata_value")
ECHO_TRAILING = ("x-grpc-test-echo-trailing-bin", b"\xab\xab\xab")


class CaseFailure(AssertionError):
    pass


def check(condition: bool, message: str) -> None:
    if not condition:
        raise CaseFailure(message)


def zeros(n: int) -> messages.Payload:
    return messages.Payload(body=bytes(n))


def expect_rpc_error(fn: Callable[[], object], code: grpc.StatusCode, details: str | None = None) -> grpc.RpcError:
    """Runs fn, which must fail with `code` (and `details`, if given)."""
    try:
        result = fn()
        if hasattr(result, "__iter__") and not isinstance(result, (bytes, str)):
            for _ in result:  # drain a response stream: the status comes at its end
                pass
    except grpc.RpcError as err:
        check(err.code() == code, f"expected {code.name}, got {err.code().name}: {err.details()!r}")
        if details is not None:
            check(err.details() == details, f"expected message {details!r}, got {err.details()!r}")
        return err
    raise CaseFailure(f"expected {code.name}, the call succeeded")


class RequestQueue:
    """A request iterator fed step by step (ping-pong, cancellation); `close()` half-closes."""

    _END = object()

    def __init__(self) -> None:
        self._q: queue.Queue = queue.Queue()

    def put(self, request) -> None:
        self._q.put(request)

    def close(self) -> None:
        self._q.put(self._END)

    def __iter__(self):
        return self

    def __next__(self):
        item = self._q.get()
        if item is self._END:
            raise StopIteration
        return item


class Client:
    def __init__(self, host: str, port: int, compression_probe: bool = True, raw_checks: bool = True):
        self.host, self.port = host, port
        self.compression_probe = compression_probe
        self.raw_checks = raw_checks
        self.channel = grpc.insecure_channel(
            f"{host}:{port}",
            options=[("grpc.max_receive_message_length", 16 * 1024 * 1024), ("grpc.enable_retries", 0)],
        )
        self.stub = tp.test_pb2_grpc.TestServiceStub(self.channel)

    def close(self) -> None:
        self.channel.close()

    # ---- raw HTTP/2 helpers for what grpcio hides -------------------------------------------------

    def raw_call(self, method: str, body: bytes, extra: list[tuple[str, str]] | None = None) -> rawh2.StreamResult:
        return rawh2.unary(
            self.host,
            self.port,
            f"/{tp.TEST_SERVICE}/{method}",
            body,
            extra_headers=[("grpc-accept-encoding", "identity,gzip")] + (extra or []),
            timeout=CALL_TIMEOUT,
        )

    def raw_messages(self, result: rawh2.StreamResult, what: str) -> list[tuple[int, bytes]]:
        """(compressed flag, decompressed payload) of each response message of an OK call."""
        check(result.grpc_status == 0, f"{what}: raw call failed: {result.describe()}")
        out = []
        for flag, payload in result.messages():
            if flag == 1:
                encoding = result.header("grpc-encoding")
                check(encoding == "gzip", f"{what}: compressed message with grpc-encoding {encoding!r}")
                payload = gzip.decompress(payload)
            out.append((flag, payload))
        return out

    # ---- cases --------------------------------------------------------------------------------

    def empty_unary(self) -> None:
        response = self.stub.EmptyCall(Empty(), timeout=CALL_TIMEOUT)
        check(response is not None and response.ByteSize() == 0, "response is not an empty message")

    def large_unary(self) -> None:
        request = messages.SimpleRequest(response_size=314159, payload=zeros(271828))
        response = self.stub.UnaryCall(request, timeout=CALL_TIMEOUT)
        check(response.payload.body == bytes(314159), f"payload is {len(response.payload.body)} bytes, not 314159 zeros")

    def client_compressed_unary(self) -> None:
        def request(expect: bool) -> messages.SimpleRequest:
            return messages.SimpleRequest(
                expect_compressed=messages.BoolValue(value=expect), response_size=314159, payload=zeros(271828)
            )

        if self.compression_probe:
            expect_rpc_error(
                lambda: self.stub.UnaryCall(request(True), timeout=CALL_TIMEOUT), grpc.StatusCode.INVALID_ARGUMENT
            )
        for expect, compression in ((True, grpc.Compression.Gzip), (False, grpc.Compression.NoCompression)):
            response = self.stub.UnaryCall(request(expect), timeout=CALL_TIMEOUT, compression=compression)
            check(len(response.payload.body) == 314159, f"payload is {len(response.payload.body)} bytes")

    def server_compressed_unary(self) -> None:
        for compressed in (True, False):
            request = messages.SimpleRequest(
                response_compressed=messages.BoolValue(value=compressed), response_size=314159, payload=zeros(271828)
            )
            response = self.stub.UnaryCall(request, timeout=CALL_TIMEOUT)
            check(len(response.payload.body) == 314159, f"payload is {len(response.payload.body)} bytes")
            if self.raw_checks:  # grpcio hides the compressed flag: look at the wire
                got = self.raw_messages(self.raw_call("UnaryCall", rawh2.grpc_frame(request.SerializeToString())), "raw")
                check(len(got) == 1, f"raw: {len(got)} response messages")
                check(got[0][0] == int(compressed), f"raw: compressed flag {got[0][0]} with response_compressed={compressed}")
                size = len(messages.SimpleResponse.FromString(got[0][1]).payload.body)
                check(size == 314159, f"raw: payload is {size} bytes")

    def client_streaming(self) -> None:
        requests = [messages.StreamingInputCallRequest(payload=zeros(n)) for n in (27182, 8, 1828, 45904)]
        response = self.stub.StreamingInputCall(iter(requests), timeout=CALL_TIMEOUT)
        check(response.aggregated_payload_size == 74922, f"aggregated_payload_size {response.aggregated_payload_size}")

    def client_compressed_streaming(self) -> None:
        def request(expect: bool, n: int) -> messages.StreamingInputCallRequest:
            return messages.StreamingInputCallRequest(expect_compressed=messages.BoolValue(value=expect), payload=zeros(n))

        if self.compression_probe:
            expect_rpc_error(
                lambda: self.stub.StreamingInputCall(iter([request(True, 27182)]), timeout=CALL_TIMEOUT),
                grpc.StatusCode.INVALID_ARGUMENT,
            )
        # grpcio compresses all messages of a call or none: send the mixed stream by hand.
        body = rawh2.gzip_frame(request(True, 27182).SerializeToString()) + rawh2.grpc_frame(
            request(False, 45904).SerializeToString()
        )
        result = self.raw_call("StreamingInputCall", body, extra=[("grpc-encoding", "gzip")])
        got = self.raw_messages(result, "compressed stream")
        check(len(got) == 1, f"{len(got)} response messages")
        total = messages.StreamingInputCallResponse.FromString(got[0][1]).aggregated_payload_size
        check(total == 73086, f"aggregated_payload_size {total}")

    def server_streaming(self) -> None:
        sizes = [31415, 9, 2653, 58979]
        request = messages.StreamingOutputCallRequest(
            response_parameters=[messages.ResponseParameters(size=n) for n in sizes]
        )
        got = [len(r.payload.body) for r in self.stub.StreamingOutputCall(request, timeout=CALL_TIMEOUT)]
        check(got == sizes, f"response sizes {got}")

    def server_compressed_streaming(self) -> None:
        request = messages.StreamingOutputCallRequest(
            response_parameters=[
                messages.ResponseParameters(size=31415, compressed=messages.BoolValue(value=True)),
                messages.ResponseParameters(size=92653, compressed=messages.BoolValue(value=False)),
            ]
        )
        got = [len(r.payload.body) for r in self.stub.StreamingOutputCall(request, timeout=CALL_TIMEOUT)]
        check(got == [31415, 92653], f"response sizes {got}")
        if self.raw_checks:
            raw = self.raw_messages(
                self.raw_call("StreamingOutputCall", rawh2.grpc_frame(request.SerializeToString())), "raw"
            )
            flags = [flag for flag, _ in raw]
            sizes = [len(messages.StreamingOutputCallResponse.FromString(p).payload.body) for _, p in raw]
            check(flags == [1, 0], f"raw: compressed flags {flags}, expected [1, 0]")
            check(sizes == [31415, 92653], f"raw: response sizes {sizes}")

    def ping_pong(self) -> None:
        requests = RequestQueue()
        responses = self.stub.FullDuplexCall(requests, timeout=CALL_TIMEOUT)
        try:
            for response_size, request_size in ((31415, 27182), (9, 8), (2653, 1828), (58979, 45904)):
                requests.put(
                    messages.StreamingOutputCallRequest(
                        response_parameters=[messages.ResponseParameters(size=response_size)],
                        payload=zeros(request_size),
                    )
                )
                response = next(responses)
                check(len(response.payload.body) == response_size, f"response of {len(response.payload.body)} bytes, expected {response_size}")
            requests.close()
            rest = list(responses)
            check(not rest, f"{len(rest)} extra responses after half-close")
        finally:
            requests.close()
            responses.cancel()

    def empty_stream(self) -> None:
        got = list(self.stub.FullDuplexCall(iter([]), timeout=CALL_TIMEOUT))
        check(not got, f"{len(got)} responses to an empty stream")

    def cancel_after_begin(self) -> None:
        requests = RequestQueue()
        future = self.stub.StreamingInputCall.future(requests, timeout=CALL_TIMEOUT)
        future.cancel()
        requests.close()
        check(future.cancelled(), "call is not cancelled")
        try:
            future.result()
        except grpc.FutureCancelledError:
            return
        except grpc.RpcError as err:
            check(err.code() == grpc.StatusCode.CANCELLED, f"status {err.code().name}")
            return
        raise CaseFailure("cancelled call returned a result")

    def cancel_after_first_response(self) -> None:
        requests = RequestQueue()
        responses = self.stub.FullDuplexCall(requests, timeout=CALL_TIMEOUT)
        requests.put(
            messages.StreamingOutputCallRequest(
                response_parameters=[messages.ResponseParameters(size=31415)], payload=zeros(27182)
            )
        )
        first = next(responses)
        check(len(first.payload.body) == 31415, f"first response of {len(first.payload.body)} bytes")
        responses.cancel()
        requests.close()
        expect_rpc_error(lambda: list(responses), grpc.StatusCode.CANCELLED)

    def timeout_on_sleeping_server(self) -> None:
        requests = RequestQueue()
        requests.put(messages.StreamingOutputCallRequest(payload=zeros(27182)))
        try:
            expect_rpc_error(
                lambda: list(self.stub.FullDuplexCall(requests, timeout=0.001)), grpc.StatusCode.DEADLINE_EXCEEDED
            )
        finally:
            requests.close()
        # Same with a deadline the server has to enforce itself (the request reaches it first).
        requests = RequestQueue()
        requests.put(messages.StreamingOutputCallRequest(payload=zeros(27182)))
        try:
            started = time.monotonic()
            expect_rpc_error(
                lambda: list(self.stub.FullDuplexCall(requests, timeout=0.3)), grpc.StatusCode.DEADLINE_EXCEEDED
            )
            check(time.monotonic() - started < 5, "deadline took far longer than 300 ms")
        finally:
            requests.close()

    def custom_metadata(self) -> None:
        metadata = (ECHO_INITIAL, ECHO_TRAILING)

        def verify(initial, trailing, what: str) -> None:
            initial, trailing = list(initial or ()), list(trailing or ())
            check(
                (ECHO_INITIAL[0], ECHO_INITIAL[1]) in [(m.key, m.value) for m in initial],
                f"{what}: initial metadata {initial} lacks {ECHO_INITIAL}",
            )
            check(
                (ECHO_TRAILING[0], ECHO_TRAILING[1]) in [(m.key, m.value) for m in trailing],
                f"{what}: trailing metadata {trailing} lacks {ECHO_TRAILING}",
            )

        request = messages.SimpleRequest(response_size=314159, payload=zeros(271828))
        response, call = self.stub.UnaryCall.with_call(request, metadata=metadata, timeout=CALL_TIMEOUT)
        check(len(response.payload.body) == 314159, "unary: wrong payload size")
        verify(call.initial_metadata(), call.trailing_metadata(), "UnaryCall")

        stream_request = messages.StreamingOutputCallRequest(
            response_parameters=[messages.ResponseParameters(size=314159)], payload=zeros(271828)
        )
        responses = self.stub.FullDuplexCall(iter([stream_request]), metadata=metadata, timeout=CALL_TIMEOUT)
        sizes = [len(r.payload.body) for r in responses]
        check(sizes == [314159], f"FullDuplexCall: response sizes {sizes}")
        verify(responses.initial_metadata(), responses.trailing_metadata(), "FullDuplexCall")

    def status_code_and_message(self) -> None:
        self._echo_status("test status message")

    def special_status_message(self) -> None:
        self._echo_status(SPECIAL_MESSAGE, streaming=False)

    def _echo_status(self, message: str, streaming: bool = True) -> None:
        status = messages.EchoStatus(code=2, message=message)
        expect_rpc_error(
            lambda: self.stub.UnaryCall(messages.SimpleRequest(response_status=status), timeout=CALL_TIMEOUT),
            grpc.StatusCode.UNKNOWN,
            message,
        )
        if streaming:
            expect_rpc_error(
                lambda: self.stub.FullDuplexCall(
                    iter([messages.StreamingOutputCallRequest(response_status=status)]), timeout=CALL_TIMEOUT
                ),
                grpc.StatusCode.UNKNOWN,
                message,
            )

    def unimplemented_method(self) -> None:
        expect_rpc_error(lambda: self.stub.UnimplementedCall(Empty(), timeout=CALL_TIMEOUT), grpc.StatusCode.UNIMPLEMENTED)

    def unimplemented_service(self) -> None:
        stub = tp.test_pb2_grpc.UnimplementedServiceStub(self.channel)
        expect_rpc_error(lambda: stub.UnimplementedCall(Empty(), timeout=CALL_TIMEOUT), grpc.StatusCode.UNIMPLEMENTED)

    # ---- standard services --------------------------------------------------------------------

    def health_check(self) -> None:
        stub = health_pb2_grpc.HealthStub(self.channel)
        for service in ("", tp.TEST_SERVICE):
            response = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=CALL_TIMEOUT)
            check(
                response.status == health_pb2.HealthCheckResponse.SERVING,
                f"Check({service!r}) is {health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)}",
            )
        expect_rpc_error(
            lambda: stub.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=CALL_TIMEOUT),
            grpc.StatusCode.NOT_FOUND,
        )

    REQUIRED_SERVICES = {tp.TEST_SERVICE, "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection"}
    TEST_PROTO_FILES = {"grpc/testing/test.proto", "grpc/testing/empty.proto", "grpc/testing/messages.proto"}

    def reflection_v1alpha(self) -> None:
        database = ProtoReflectionDescriptorDatabase(self.channel)
        services = set(database.get_services())
        missing = self.REQUIRED_SERVICES - services
        check(not missing, f"list_services lacks {sorted(missing)} (got {sorted(services)})")
        file = database.FindFileContainingSymbol(tp.TEST_SERVICE)
        check(file.name == "grpc/testing/test.proto", f"TestService is in {file.name!r}")
        # Building a pool from the server's answers fetches the imports and resolves every type.
        pool = descriptor_pool.DescriptorPool(database)
        service = pool.FindServiceByName(tp.TEST_SERVICE)
        methods = {m.name: m for m in service.methods}
        check({"EmptyCall", "UnaryCall", "FullDuplexCall"} <= set(methods), f"methods {sorted(methods)}")
        check(methods["UnaryCall"].input_type.full_name == "grpc.testing.SimpleRequest", "UnaryCall input type")
        check(methods["FullDuplexCall"].client_streaming and methods["FullDuplexCall"].server_streaming, "FullDuplexCall is not bidi")
        pool.FindMessageTypeByName("grpc.testing.Empty")

    def reflection_v1(self) -> None:
        stub = tp.reflection_v1_pb2_grpc.ServerReflectionStub(self.channel)
        rpb = tp.reflection_v1_pb2
        requests = [
            rpb.ServerReflectionRequest(list_services=""),
            rpb.ServerReflectionRequest(file_containing_symbol=tp.TEST_SERVICE),
            rpb.ServerReflectionRequest(file_containing_symbol="no.such.Symbol"),
        ]
        responses = list(stub.ServerReflectionInfo(iter(requests), timeout=CALL_TIMEOUT))
        check(len(responses) == 3, f"{len(responses)} responses to 3 requests")
        listed, found, missing_symbol = responses
        check(listed.HasField("list_services_response"), f"list_services answered {listed.WhichOneof('message_response')}")
        services = {s.name for s in listed.list_services_response.service}
        missing = self.REQUIRED_SERVICES - services
        check(not missing, f"list_services lacks {sorted(missing)} (got {sorted(services)})")
        check(found.HasField("file_descriptor_response"), f"file_containing_symbol answered {found.WhichOneof('message_response')}")
        files = [descriptor_pb2.FileDescriptorProto.FromString(b) for b in found.file_descriptor_response.file_descriptor_proto]
        names = [f.name for f in files]
        check(names and names[0] == "grpc/testing/test.proto", f"first file is {names[:1]}, expected grpc/testing/test.proto")
        check(self.TEST_PROTO_FILES <= set(names), f"files {names} lack the imports of test.proto")
        pool = descriptor_pool.DescriptorPool()
        _add_files(pool, files)
        pool.FindServiceByName(tp.TEST_SERVICE)
        check(missing_symbol.HasField("error_response"), "an unknown symbol did not get an error_response")
        check(
            missing_symbol.error_response.error_code == grpc.StatusCode.NOT_FOUND.value[0],
            f"unknown symbol: error code {missing_symbol.error_response.error_code}",
        )


def _add_files(pool: descriptor_pool.DescriptorPool, files: list[descriptor_pb2.FileDescriptorProto]) -> None:
    """Adds files to a pool dependencies first; fails if an import is missing."""
    pending = {f.name: f for f in files}
    added: set[str] = set()
    while pending:
        ready = [f for f in pending.values() if all(d in added for d in f.dependency)]
        check(ready, f"unresolvable imports among {sorted(pending)}")
        for f in ready:
            pool.Add(f)
            added.add(f.name)
            del pending[f.name]


CASES = [
    "empty_unary",
    "large_unary",
    "client_streaming",
    "server_streaming",
    "ping_pong",
    "empty_stream",
    "cancel_after_begin",
    "cancel_after_first_response",
    "timeout_on_sleeping_server",
    "custom_metadata",
    "status_code_and_message",
    "special_status_message",
    "unimplemented_method",
    "unimplemented_service",
    "client_compressed_unary",
    "server_compressed_unary",
    "client_compressed_streaming",
    "server_compressed_streaming",
    "health_check",
    "reflection_v1alpha",
    "reflection_v1",
]


def wait_for_server(host: str, port: int, timeout: float) -> bool:
    channel = grpc.insecure_channel(f"{host}:{port}")
    try:
        grpc.channel_ready_future(channel).result(timeout=timeout)
        return True
    except grpc.FutureTimeoutError:
        return False
    finally:
        channel.close()


def run(host: str, port: int, names: list[str], compression_probe: bool = True, raw_checks: bool = True, verbose: bool = False) -> tuple[int, int]:
    client = Client(host, port, compression_probe=compression_probe, raw_checks=raw_checks)
    passed = failed = 0
    try:
        for name in names:
            started = time.monotonic()
            try:
                getattr(client, name)()
            except CaseFailure as err:
                failed += 1
                print(f"FAIL {name}: {err}", flush=True)
            except grpc.RpcError as err:
                failed += 1
                print(f"FAIL {name}: unexpected status {err.code().name}: {err.details()!r}", flush=True)
            except Exception as err:  # noqa: BLE001 - any other error is a failed case, with its reason
                failed += 1
                print(f"FAIL {name}: {type(err).__name__}: {err}", flush=True)
                if verbose:
                    traceback.print_exc()
            else:
                passed += 1
                print(f"PASS {name} ({(time.monotonic() - started) * 1000:.0f} ms)", flush=True)
    finally:
        client.close()
    return passed, failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", "--server_host", default="127.0.0.1")
    parser.add_argument("--port", "--server_port", type=int)
    parser.add_argument("--test_case", default="all", help="all, or names separated by commas")
    parser.add_argument("--no_compression_probe", action="store_true", help="skip the INVALID_ARGUMENT probe of client_compressed_* (for servers that cannot see the compressed flag, like grpcio)")
    parser.add_argument("--no_raw_checks", action="store_true", help="skip the compressed-flag checks over raw HTTP/2")
    parser.add_argument("--wait", type=float, default=10.0, help="seconds to wait for the server to accept (default 10)")
    parser.add_argument("--list", action="store_true", help="print the case names and exit")
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--use_tls", default="false", help="accepted for interop compatibility; only false")
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(CASES))
        return 0
    if args.port is None:
        parser.error("--port is required")
    if args.use_tls.lower() not in ("false", "0", "no"):
        parser.error("TLS is not supported by this client yet")
    names = CASES if args.test_case == "all" else [n.strip() for n in args.test_case.split(",") if n.strip()]
    unknown = [n for n in names if n not in CASES]
    if unknown:
        parser.error(f"unknown test case(s): {', '.join(unknown)}; --list shows them")
    if not wait_for_server(args.host, args.port, args.wait):
        print(f"FAIL connect: no server at {args.host}:{args.port} within {args.wait:g} s", flush=True)
        print(f"interop: 0 passed, {len(names)} failed")
        return 1
    passed, failed = run(args.host, args.port, names, not args.no_compression_probe, not args.no_raw_checks, args.verbose)
    print(f"interop: {passed} passed, {failed} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
