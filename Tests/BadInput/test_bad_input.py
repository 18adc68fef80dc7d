"""Bad input over raw HTTP/2 against a gRPC server: each case must fail cleanly, never crash it.

Frames are built by hand (Tests/Interop/rawh2.py on hyperframe + hpack), everything on loopback,
every loop bounded. Each test ends by checking that the server still runs and that a fresh grpcio
EmptyCall on a new connection succeeds.

Run: .venv/bin/python -m pytest Tests/BadInput [--port P | --server-cmd "cmd ... {port}"]
"""

from __future__ import annotations

import socket
import struct
import time

import rawh2
import testproto as tp
from rawh2 import RawH2

UNARY = "/grpc.testing.TestService/UnaryCall"
EMPTY = "/grpc.testing.TestService/EmptyCall"
DUPLEX = "/grpc.testing.TestService/FullDuplexCall"

OK, UNKNOWN, RESOURCE_EXHAUSTED, UNIMPLEMENTED, INTERNAL = 0, 2, 8, 12, 13


def connect(server) -> RawH2:
    conn = RawH2(server.host, server.port, timeout=5)
    assert conn.wait_settings(5), "the server sent no SETTINGS after our preface"
    return conn


def empty_call_on(conn: RawH2) -> rawh2.StreamResult:
    """A well-formed EmptyCall on an existing connection (is the connection still usable?)."""
    sid = conn.new_stream()
    conn.send_headers(sid, conn.grpc_headers(EMPTY))
    conn.send_data(sid, rawh2.grpc_frame(b""), end_stream=True)
    return conn.wait_stream(sid, 5)


def test_garbage_instead_of_preface(server):
    garbage = b"XYZ this is not an HTTP/2 connection preface \x00\xff\x10" * 8
    with socket.create_connection((server.host, server.port), timeout=5) as sock:
        sock.sendall(garbage)
        received = bytearray()
        deadline = time.monotonic() + 5
        closed = False
        while time.monotonic() < deadline:
            sock.settimeout(max(deadline - time.monotonic(), 0.01))
            try:
                chunk = sock.recv(65536)
            except socket.timeout:
                break
            except (ConnectionResetError, OSError):
                closed = True
                break
            if not chunk:
                closed = True
                break
            received += chunk
    assert closed, f"connection still open 5 s after a bad preface ({len(received)} bytes received)"
    # If the server said anything, it was HTTP/2 frames (SETTINGS, then a GOAWAY), not HTTP/1.
    if received:
        assert not received.startswith(b"HTTP/1"), f"answered a bad preface with HTTP/1: {bytes(received[:40])!r}"
    server.assert_alive()


def test_truncated_message_is_internal(server):
    with connect(server) as conn:
        sid = conn.new_stream()
        conn.send_headers(sid, conn.grpc_headers(UNARY))
        conn.send_data(sid, struct.pack(">BI", 0, 100) + bytes(10), end_stream=True)
        result = conn.wait_stream(sid, 5)
        assert result.grpc_status == INTERNAL, f"truncated message: {result.describe()}"
    server.assert_alive()


def test_oversized_message_is_resource_exhausted(server):
    size = 5 * 1024 * 1024
    request = tp.messages_pb2.SimpleRequest(response_size=1, payload=tp.messages_pb2.Payload(body=bytes(size)))
    body = rawh2.grpc_frame(request.SerializeToString())
    with connect(server) as conn:
        sid = conn.new_stream()
        conn.send_headers(sid, conn.grpc_headers(UNARY))
        conn.send_data(sid, body, end_stream=True, timeout=5)
        result = conn.wait_stream(sid, 5)
        assert result.grpc_status == RESOURCE_EXHAUSTED, f"{len(body)}-byte message: {result.describe()}"
    server.assert_alive()


def test_oversized_header_block_is_refused(server):
    with connect(server) as conn:
        limit = conn.remote_settings.get(rawh2.MAX_HEADER_LIST_SIZE)
        assert limit is not None, f"server does not advertise SETTINGS_MAX_HEADER_LIST_SIZE: {conn.remote_settings}"
        assert limit < 64 * 1024, f"advertised max header list size {limit} is not below 64 KiB"
        big = [(f"x-big-{i}", "v" * 1000) for i in range(64)]  # ~66 KiB uncompressed
        sid = conn.new_stream()
        conn.send_headers(sid, conn.grpc_headers(UNARY, extra=big))
        conn.send_data(sid, rawh2.grpc_frame(b""), end_stream=True)
        result = conn.wait_stream(sid, 5)
        refused = (
            result.reset is not None
            or (result.http_status is not None and result.http_status >= 400)
            or (result.grpc_status is not None and result.grpc_status != OK)
            or conn.goaway is not None
            or conn.closed
        )
        assert refused, f"a 64 KiB header block (limit {limit}) was not refused: {result.describe()}"
        assert result.grpc_status != OK, f"a 64 KiB header block was served: {result.describe()}"
        if conn.goaway is None and not conn.closed:
            # Refusing one stream must leave the connection (and its HPACK state) usable.
            after = empty_call_on(conn)
            assert after.grpc_status == OK, f"connection unusable after a refused header block: {after.describe()}"
    server.assert_alive()


def test_streams_beyond_max_concurrent_are_refused(server):
    with connect(server) as conn:
        limit = conn.remote_settings.get(rawh2.MAX_CONCURRENT_STREAMS)
        assert limit is not None, f"server does not advertise SETTINGS_MAX_CONCURRENT_STREAMS: {conn.remote_settings}"
        assert 0 < limit <= 10000, f"advertised max concurrent streams {limit}"
        excess = 10
        # FullDuplexCall without END_STREAM: each stream stays open until we end it.
        ids, frames = [], bytearray()
        for _ in range(limit + excess):
            sid = conn.new_stream()
            ids.append(sid)
            frames += conn.header_frames(sid, conn.grpc_headers(DUPLEX))
        conn.send(bytes(frames))
        refused_count = lambda: sum(1 for s in ids if conn.streams[s].reset is not None)  # noqa: E731
        conn.wait(lambda: refused_count() >= excess or conn.goaway is not None, 5)
        conn.wait(lambda: False, 0.2)  # let a REFUSED_STREAM straggler or a GOAWAY arrive
        refused = [s for s in ids if conn.streams[s].reset is not None]
        codes = sorted({conn.streams[s].reset for s in refused})
        if conn.goaway is not None and len(refused) < excess:
            # libnghttp2's way once our SETTINGS ACK is in: a connection error (RFC 9113 §5.1.2
            # allows only a stream error, but it is safe). The streams within the limit must have
            # been taken, and the error must name the protocol violation.
            code, last, debug = conn.goaway
            assert code in (rawh2.PROTOCOL_ERROR, rawh2.REFUSED_STREAM, rawh2.ENHANCE_YOUR_CALM), f"GOAWAY {conn.goaway}"
            assert last >= ids[limit - 1], f"GOAWAY last stream {last} drops streams within the limit ({ids[limit - 1]})"
            assert last < ids[-1], f"GOAWAY last stream {last} claims every stream was processed"
            print(f"excess streams: GOAWAY {code} last_stream_id={last} {debug!r}")
        else:
            # The RFC's way: each excess stream is reset with REFUSED_STREAM, the rest go on.
            accepted = [s for s in ids if conn.streams[s].reset is None]
            assert len(accepted) <= limit, f"{len(accepted)} streams accepted with a limit of {limit}"
            assert len(refused) >= excess, f"{len(refused)} of {excess} excess streams refused (codes {codes}, goaway {conn.goaway})"
            assert codes == [rawh2.REFUSED_STREAM], f"excess streams reset with codes {codes}, expected REFUSED_STREAM"
            print(f"excess streams: {len(refused)} × RST_STREAM REFUSED_STREAM")
            if conn.goaway is None:
                # The streams within the limit still work: end one and get its (empty) answer.
                conn.send_data(accepted[0], b"", end_stream=True)
                done = conn.wait_stream(accepted[0], 5)
                assert done.grpc_status == OK, f"a stream within the limit failed: {done.describe()}"
                for sid in accepted[1:]:
                    conn.send_rst(sid)
    server.assert_alive()


def test_rapid_reset_flood_gets_goaway(server):
    streams, batch = 10_000, 500
    with connect(server) as conn:
        headers = conn.grpc_headers(UNARY)
        started = time.monotonic()
        opened = 0
        while opened < streams and conn.goaway is None and not conn.closed:
            frames = bytearray()
            for _ in range(batch):
                sid = conn.new_stream()
                frames += conn.header_frames(sid, headers)
                frames += rawh2.RstStreamFrame(sid, error_code=rawh2.CANCEL).serialize()
            if not conn.send(bytes(frames)):
                break
            opened += batch
            conn.poll_now()
            assert time.monotonic() - started < 10, "flood took over 10 s"
        conn.wait(lambda: conn.goaway is not None or conn.closed, 5)
        assert conn.goaway is not None or conn.closed, f"{opened} streams opened and reset without a GOAWAY"
        if conn.goaway is not None:
            assert conn.goaway[0] != rawh2.NO_ERROR, f"GOAWAY with NO_ERROR after a rapid-reset flood: {conn.goaway}"
    server.assert_alive()


def test_json_content_type_is_rejected(server):
    with connect(server) as conn:
        sid = conn.new_stream()
        conn.send_headers(sid, conn.grpc_headers(UNARY, content_type="application/json"))
        conn.send_data(sid, rawh2.grpc_frame(b""), end_stream=True)
        result = conn.wait_stream(sid, 5)
        assert result.ended, f"no answer to a request with content-type application/json: {result.describe()}"
        if result.http_status == 415:
            pass
        else:
            assert result.grpc_status in (UNKNOWN, INTERNAL), f"content-type application/json: {result.describe()}"
            assert result.grpc_message, f"content-type application/json rejected without a message: {result.describe()}"
    server.assert_alive()


def test_unknown_path_is_unimplemented(server):
    for path in ("/grpc.testing.TestService/NoSuchMethod", "/no.such.Service/Method"):
        result = rawh2.unary(server.host, server.port, path, rawh2.grpc_frame(b""), timeout=5)
        assert result.http_status == 200, f"{path}: {result.describe()}"
        assert result.grpc_status == UNIMPLEMENTED, f"{path}: {result.describe()}"
    server.assert_alive()


def test_response_headers_declare_gzip_only_when_compressing(server):
    """A client that accepts gzip (as every gRPC library does) gets `grpc-encoding: gzip` only
    on a response that is compressed: an uncompressed answer declares no encoding (one header
    fewer on nearly every call), and a compressed one still declares it."""
    accepts = [("grpc-accept-encoding", "gzip,identity")]
    for compressed in (False, True):
        request = tp.messages_pb2.SimpleRequest(
            response_size=2000, response_compressed=tp.messages_pb2.BoolValue(value=compressed))
        with connect(server) as conn:
            sid = conn.new_stream()
            conn.send_headers(sid, conn.grpc_headers(UNARY, extra=accepts))
            conn.send_data(sid, rawh2.grpc_frame(request.SerializeToString()), end_stream=True)
            result = conn.wait_stream(sid, 5)
        assert result.grpc_status == OK, result.describe()
        flags = [flag for flag, _ in result.messages()]
        if compressed:
            assert result.header("grpc-encoding") == "gzip", result.describe()
            assert flags == [1], f"compressed response sent with flags {flags}"
        else:
            assert result.header("grpc-encoding") in (None, "identity"), result.describe()
            assert flags == [0], f"uncompressed response sent with flags {flags}"
    server.assert_alive()
