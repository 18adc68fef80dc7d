"""Fixtures for the bad-input tests: the server under test and a liveness check.

The server is, in order of preference:
  --port P (or INTEROP_PORT=P)           a server already running on --host (default 127.0.0.1);
  INTEROP_SERVER_CMD="cmd ... {port}"    a command started here on a free loopback port;
  .build/release/interop-server          the Swift interop server, started here.
A server started here is stopped at the end of the session, and each test also checks it is still
running (a crash is a failure even if a later process would answer).
"""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "Tests", "Interop"))

import grpc  # noqa: E402

import testproto as tp  # noqa: E402


def pytest_addoption(parser):
    parser.addoption("--host", default=os.environ.get("INTEROP_HOST", "127.0.0.1"))
    parser.addoption("--port", type=int, default=int(os.environ["INTEROP_PORT"]) if os.environ.get("INTEROP_PORT") else None)
    parser.addoption("--server-cmd", default=os.environ.get("INTEROP_SERVER_CMD"), help="command with {port}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_accepting(host: str, port: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.05)
    return False


class Server:
    def __init__(self, host: str, port: int, process: subprocess.Popen | None):
        self.host, self.port, self.process = host, port, process

    @property
    def target(self) -> str:
        return f"{self.host}:{self.port}"

    def assert_alive(self) -> None:
        """The process still runs and a fresh grpcio EmptyCall on a new connection succeeds."""
        if self.process is not None:
            code = self.process.poll()
            assert code is None, f"server process exited with {code}"
        channel = grpc.insecure_channel(self.target)
        try:
            stub = tp.test_pb2_grpc.TestServiceStub(channel)
            stub.EmptyCall(tp.empty_pb2.Empty(), timeout=5, wait_for_ready=True)
        finally:
            channel.close()


@pytest.fixture(scope="session")
def server(request):
    host = request.config.getoption("--host")
    port = request.config.getoption("--port")
    if port:
        yield Server(host, port, None)
        return
    cmd = request.config.getoption("--server-cmd")
    port = free_port()
    if cmd:
        argv = shlex.split(cmd.replace("{port}", str(port)))
    else:
        binary = os.environ.get("INTEROP_SERVER") or os.path.join(ROOT, ".build", "release", "interop-server")
        if not os.access(binary, os.X_OK):
            pytest.fail(f"{binary} not built (scripts/swift-release --product interop-server), and no --port given")
        argv = [binary, "--host", "127.0.0.1", "--port", str(port)]
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    try:
        if not wait_accepting("127.0.0.1", port, 15):
            pytest.fail(f"server {argv} did not accept on port {port} within 15 s")
        yield Server("127.0.0.1", port, process)
    finally:
        process.terminate()
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

