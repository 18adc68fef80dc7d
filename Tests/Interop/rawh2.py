"""A small HTTP/2 client over a plain socket, for checks a gRPC library hides or refuses to do.

grpcio never shows the per-message compressed flag and will not send malformed or abusive traffic,
so the interop client (compression flags, per-message compression) and the bad-input tests build
frames themselves with hyperframe and hpack (both come with the `h2` package). Everything here is
synchronous and single-threaded: `pump()` reads what has arrived and answers SETTINGS and PING, and
`wait()` pumps until a condition holds, the connection closes, or a deadline passes.
"""

from __future__ import annotations

import gzip
import select
import socket
import struct
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

import hpack
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    RstStreamFrame,
    SettingsFrame,
    WindowUpdateFrame,
)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# RFC 9113 error codes used by the tests.
NO_ERROR = 0x0
PROTOCOL_ERROR = 0x1
INTERNAL_ERROR = 0x2
FLOW_CONTROL_ERROR = 0x3
STREAM_CLOSED = 0x5
FRAME_SIZE_ERROR = 0x6
REFUSED_STREAM = 0x7
CANCEL = 0x8
COMPRESSION_ERROR = 0x9
ENHANCE_YOUR_CALM = 0xB

# SETTINGS identifiers.
HEADER_TABLE_SIZE = 0x1
ENABLE_PUSH = 0x2
MAX_CONCURRENT_STREAMS = 0x3
INITIAL_WINDOW_SIZE = 0x4
MAX_FRAME_SIZE = 0x5
MAX_HEADER_LIST_SIZE = 0x6

_BIG_WINDOW = (1 << 31) - 1


def grpc_frame(payload: bytes, compressed: bool = False) -> bytes:
    """One length-prefixed gRPC message (flag byte, 4-byte big-endian length, payload)."""
    return struct.pack(">BI", 1 if compressed else 0, len(payload)) + payload


def gzip_frame(payload: bytes) -> bytes:
    """A gRPC message compressed with gzip and flagged as compressed."""
    return grpc_frame(gzip.compress(payload), compressed=True)


def parse_grpc_messages(data: bytes) -> list[tuple[int, bytes]]:
    """Splits a DATA byte stream into (flag, payload) pairs; raises ValueError on a truncated one."""
    out, i = [], 0
    while i < len(data):
        if len(data) - i < 5:
            raise ValueError(f"truncated gRPC prefix ({len(data) - i} bytes)")
        flag, length = struct.unpack_from(">BI", data, i)
        i += 5
        if len(data) - i < length:
            raise ValueError(f"truncated gRPC message: prefix says {length}, {len(data) - i} bytes")
        out.append((flag, bytes(data[i : i + length])))
        i += length
    return out


@dataclass
class StreamResult:
    """What the peer sent on one stream."""

    headers: list[tuple[str, str]] | None = None
    trailers: list[tuple[str, str]] | None = None
    data: bytearray = field(default_factory=bytearray)
    reset: int | None = None  # RST_STREAM error code
    ended: bool = False  # END_STREAM seen or the stream was reset
    send_window: int = 65535

    def _find(self, block: list[tuple[str, str]] | None, name: str) -> str | None:
        for k, v in block or []:
            if k == name:
                return v
        return None

    def header(self, name: str) -> str | None:
        return self._find(self.headers, name)

    def trailer(self, name: str) -> str | None:
        """A trailer; for a Trailers-Only response the single header block serves as trailers."""
        value = self._find(self.trailers, name)
        if value is None and self.trailers is None and self.ended:
            value = self._find(self.headers, name)
        return value

    @property
    def http_status(self) -> int | None:
        s = self.header(":status")
        return int(s) if s is not None else None

    @property
    def grpc_status(self) -> int | None:
        s = self.trailer("grpc-status")
        return int(s) if s is not None else None

    @property
    def grpc_message(self) -> str | None:
        return self.trailer("grpc-message")

    def messages(self) -> list[tuple[int, bytes]]:
        return parse_grpc_messages(bytes(self.data))

    def describe(self) -> str:
        return (
            f"status={self.http_status} grpc-status={self.grpc_status} grpc-message={self.grpc_message!r} "
            f"reset={self.reset} ended={self.ended} data={len(self.data)}B"
        )


class RawH2:
    """One HTTP/2 (h2c, prior knowledge) connection driven by hand."""

    def __init__(
        self,
        host: str,
        port: int,
        timeout: float = 5.0,
        preface: bool = True,
        settings: dict[int, int] | None = None,
    ):
        self.host, self.port = host, port
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder(max_header_list_size=1 << 24)
        self.remote_settings: dict[int, int] = {}
        self.settings_received = False
        self.settings_acked = 0  # ACKs of our SETTINGS
        self.goaway: tuple[int, int, bytes] | None = None  # (error code, last stream id, debug data)
        self.closed = False
        self.streams: dict[int, StreamResult] = {}
        self.next_stream_id = 1
        self.conn_send_window = 65535
        self.frames_received = 0
        self._buf = bytearray()
        self._header_block: tuple[int, bool, bytearray] | None = None  # (stream, end_stream, bytes)
        if preface:
            ours = {ENABLE_PUSH: 0, INITIAL_WINDOW_SIZE: _BIG_WINDOW}
            ours.update(settings or {})
            self.send(
                PREFACE
                + SettingsFrame(0, settings=ours).serialize()
                + WindowUpdateFrame(0, window_increment=_BIG_WINDOW - 65535).serialize()
            )

    # ---- sending -------------------------------------------------------------------------------

    def send(self, data: bytes) -> bool:
        """Writes bytes; returns False (and marks the connection closed) if the peer has gone."""
        if self.closed:
            return False
        try:
            self.sock.sendall(data)
            return True
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, socket.timeout, OSError):
            self.closed = True
            return False

    def new_stream(self) -> int:
        sid = self.next_stream_id
        self.next_stream_id += 2
        self.streams[sid] = StreamResult(send_window=self.remote_settings.get(INITIAL_WINDOW_SIZE, 65535))
        return sid

    def grpc_headers(
        self,
        path: str,
        content_type: str = "application/grpc",
        extra: Iterable[tuple[str, str]] = (),
    ) -> list[tuple[str, str]]:
        return [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path),
            (":authority", f"{self.host}:{self.port}"),
            ("content-type", content_type),
            ("te", "trailers"),
            *extra,
        ]

    def header_frames(self, stream_id: int, headers: list[tuple[str, str]], end_stream: bool = False) -> bytes:
        """HEADERS (+ CONTINUATION) frames carrying one encoded header block."""
        block = self.encoder.encode(headers)
        size = self.remote_settings.get(MAX_FRAME_SIZE, 16384)
        chunks = [block[i : i + size] for i in range(0, len(block), size)] or [b""]
        out = bytearray()
        first = HeadersFrame(stream_id, chunks[0])
        if end_stream:
            first.flags.add("END_STREAM")
        if len(chunks) == 1:
            first.flags.add("END_HEADERS")
        out += first.serialize()
        for i, chunk in enumerate(chunks[1:], start=1):
            cont = ContinuationFrame(stream_id, chunk)
            if i == len(chunks) - 1:
                cont.flags.add("END_HEADERS")
            out += cont.serialize()
        return bytes(out)

    def send_headers(self, stream_id: int, headers: list[tuple[str, str]], end_stream: bool = False) -> bool:
        return self.send(self.header_frames(stream_id, headers, end_stream))

    def send_data(
        self, stream_id: int, data: bytes, end_stream: bool = False, timeout: float = 5.0
    ) -> int:
        """Sends DATA within the peer's flow-control windows, waiting for WINDOW_UPDATEs as needed.

        Stops early (returning the bytes sent) if the stream or connection ends, or on timeout.
        """
        stream = self.streams[stream_id]
        size = self.remote_settings.get(MAX_FRAME_SIZE, 16384)
        deadline = time.monotonic() + timeout
        sent = 0
        while True:
            self.poll_now()
            if stream.ended or self.closed:  # the peer answered (or reset) before the end
                return sent
            remaining = len(data) - sent
            if remaining == 0 and sent > 0 and not end_stream:
                return sent
            window = min(self.conn_send_window, stream.send_window, size)
            if remaining > 0 and window <= 0:
                if stream.ended or self.closed or time.monotonic() > deadline:
                    return sent
                self.pump(0.05)
                continue
            n = min(remaining, window)
            frame = DataFrame(stream_id, data[sent : sent + n])
            last = sent + n == len(data)
            if last and end_stream:
                frame.flags.add("END_STREAM")
            if not self.send(frame.serialize()):
                return sent
            sent += n
            self.conn_send_window -= n
            stream.send_window -= n
            if last:
                return sent

    def send_rst(self, stream_id: int, code: int = CANCEL) -> bool:
        return self.send(RstStreamFrame(stream_id, error_code=code).serialize())

    # ---- receiving -----------------------------------------------------------------------------

    def pump(self, timeout: float = 0.1) -> bool:
        """Reads once (up to `timeout`) and handles every complete frame; False once closed."""
        if self.closed:
            return False
        self.sock.settimeout(max(timeout, 0.001))
        try:
            chunk = self.sock.recv(1 << 20)
        except socket.timeout:
            return True
        except (ConnectionResetError, ConnectionAbortedError, OSError):
            self.closed = True
            return False
        if not chunk:
            self.closed = True
            return False
        self._buf += chunk
        while len(self._buf) >= 9:
            length = int.from_bytes(self._buf[0:3], "big")
            if len(self._buf) < 9 + length:
                break
            frame, _ = Frame.parse_frame_header(memoryview(bytes(self._buf[:9])))
            frame.parse_body(memoryview(bytes(self._buf[9 : 9 + length])))
            del self._buf[: 9 + length]
            self.frames_received += 1
            self._handle(frame)
        return not self.closed

    def poll_now(self) -> bool:
        """Handles whatever has already arrived, without waiting."""
        if self.closed:
            return False
        try:
            readable, _, _ = select.select([self.sock], [], [], 0)
        except (OSError, ValueError):
            self.closed = True
            return False
        return self.pump(0.001) if readable else True

    def wait(self, predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
        """Pumps until `predicate()` is true, the connection closes, or `timeout` passes."""
        deadline = time.monotonic() + timeout
        while not predicate():
            left = deadline - time.monotonic()
            if left <= 0 or not self.pump(min(left, 0.2)):
                return predicate()
        return True

    def wait_settings(self, timeout: float = 5.0) -> bool:
        return self.wait(lambda: self.settings_received, timeout)

    def wait_stream(self, stream_id: int, timeout: float = 5.0) -> StreamResult:
        stream = self.streams[stream_id]
        self.wait(lambda: stream.ended or self.goaway is not None, timeout)
        return stream

    def wait_closed(self, timeout: float = 5.0) -> bool:
        return self.wait(lambda: self.closed, timeout)

    def _stream(self, sid: int) -> StreamResult:
        if sid not in self.streams:
            self.streams[sid] = StreamResult()
        return self.streams[sid]

    def _handle(self, frame: Frame) -> None:
        if isinstance(frame, SettingsFrame):
            if "ACK" in frame.flags:
                self.settings_acked += 1
                return
            old = self.remote_settings.get(INITIAL_WINDOW_SIZE, 65535)
            self.remote_settings.update(frame.settings)
            delta = self.remote_settings.get(INITIAL_WINDOW_SIZE, 65535) - old
            for s in self.streams.values():
                s.send_window += delta
            self.settings_received = True
            ack = SettingsFrame(0)
            ack.flags.add("ACK")
            self.send(ack.serialize())
        elif isinstance(frame, PingFrame):
            if "ACK" not in frame.flags:
                pong = PingFrame(0, opaque_data=frame.opaque_data)
                pong.flags.add("ACK")
                self.send(pong.serialize())
        elif isinstance(frame, WindowUpdateFrame):
            if frame.stream_id == 0:
                self.conn_send_window += frame.window_increment
            else:
                self._stream(frame.stream_id).send_window += frame.window_increment
        elif isinstance(frame, HeadersFrame):
            self._header_block = (frame.stream_id, "END_STREAM" in frame.flags, bytearray(frame.data))
            if "END_HEADERS" in frame.flags:
                self._finish_headers()
        elif isinstance(frame, ContinuationFrame):
            if self._header_block is not None:
                self._header_block[2].extend(frame.data)
                if "END_HEADERS" in frame.flags:
                    self._finish_headers()
        elif isinstance(frame, DataFrame):
            stream = self._stream(frame.stream_id)
            stream.data += frame.data
            if "END_STREAM" in frame.flags:
                stream.ended = True
        elif isinstance(frame, RstStreamFrame):
            stream = self._stream(frame.stream_id)
            stream.reset = frame.error_code
            stream.ended = True
        elif isinstance(frame, GoAwayFrame):
            self.goaway = (frame.error_code, frame.last_stream_id, bytes(frame.additional_data))

    def _finish_headers(self) -> None:
        assert self._header_block is not None
        sid, end_stream, block = self._header_block
        self._header_block = None
        decoded = [(str(k), str(v)) for k, v in self.decoder.decode(bytes(block), raw=False)]
        stream = self._stream(sid)
        if stream.headers is None:
            stream.headers = decoded
        else:
            stream.trailers = decoded
        if end_stream:
            stream.ended = True

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
        self.closed = True

    def __enter__(self) -> "RawH2":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def unary(
    host: str,
    port: int,
    path: str,
    message: bytes,
    extra_headers: Iterable[tuple[str, str]] = (),
    timeout: float = 10.0,
) -> StreamResult:
    """One gRPC call of a single already-framed request message; returns what came back."""
    with RawH2(host, port, timeout=timeout) as conn:
        conn.wait_settings(timeout)
        sid = conn.new_stream()
        conn.send_headers(sid, conn.grpc_headers(path, extra=list(extra_headers)))
        conn.send_data(sid, message, end_stream=True, timeout=timeout)
        return conn.wait_stream(sid, timeout)
