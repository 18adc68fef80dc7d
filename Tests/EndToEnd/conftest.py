"""Real processes on loopback for end-to-end tests: accounts-service, social-service (when built) and
the gateway, started from
the built binaries (BIN_DIR, default .build/debug), each with its own temporary data directory,
stopped (SIGTERM, then SIGKILL) at the end. Python stubs are generated from Proto/ at test time."""
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("BIN_DIR", ROOT / ".build" / "debug"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def stubs():
    """accounts.v1 (+ common, google.rpc) Python modules generated with grpcio-tools."""
    from grpc_tools import protoc
    import grpc_tools

    out = Path(tempfile.mkdtemp(prefix="e2e-stubs-"))
    wkt = Path(grpc_tools.__file__).parent / "_proto"
    protos = [str(p.relative_to(ROOT / "Proto")) for p in (ROOT / "Proto").rglob("*.proto")]
    rc = protoc.main(["protoc", f"-I{ROOT / 'Proto'}", f"-I{wkt}", f"--python_out={out}", f"--grpc_python_out={out}", *protos])
    assert rc == 0, "grpc_tools.protoc failed"
    # No __init__.py: `google` must stay a namespace package so google.protobuf still imports.
    sys.path.insert(0, str(out))
    from accounts.v1 import accounts_pb2, accounts_pb2_grpc  # noqa: E402

    return accounts_pb2, accounts_pb2_grpc


class Proc:
    def __init__(self, name, args, env, port):
        self.name, self.args, self.env, self.port = name, args, env, port
        self.log = tempfile.NamedTemporaryFile(prefix=f"{name}-", suffix=".log", delete=False)
        self.p = None

    def start(self, wait_serving=True):
        exe = BIN / self.name
        if not exe.exists():
            pytest.skip(f"{exe} is not built")
        self.p = subprocess.Popen([str(exe), *self.args], env=self.env, stdout=self.log, stderr=subprocess.STDOUT)
        if wait_serving:
            probe = BIN / "health-probe"
            deadline = time.time() + 30
            while time.time() < deadline:
                assert self.p.poll() is None, f"{self.name} exited: {self.tail()}"
                if subprocess.run([str(probe), "--addr", f"127.0.0.1:{self.port}", "--timeout", "1"],
                                  capture_output=True).returncode == 0:
                    return self
                time.sleep(0.1)
            self.stop()  # not left running behind the failure
            raise AssertionError(f"{self.name} did not become SERVING: {self.tail()}")
        return self

    def stop(self):
        if self.p and self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(15)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()

    def tail(self):
        self.log.flush()
        return Path(self.log.name).read_text()[-3000:]


@pytest.fixture
def system(tmp_path):
    """accounts + social (when its binary exists) + gateway; yields a dict with their processes, the
    environment and a function to start more gateways. tasks is not running (its port is closed)."""
    procs = []
    accounts_port, social_port, gateway_port = free_port(), free_port(), free_port()
    has_social = (BIN / "social-service").exists()
    env = dict(os.environ)
    env.update({
        "DATA_DIR": str(tmp_path),
        "SERVICE_TOKEN": "e2e-service-credential-0123456789abcdef",
        "GATEWAY_TOKEN": "e2e-gateway-credential-0123456789abcdef",
        "ACCOUNTS_ADDR": f"127.0.0.1:{accounts_port}",
        "SOCIAL_ADDR": f"127.0.0.1:{social_port}",
        "TASKS_ADDR": f"127.0.0.1:{free_port()}",
        "GATEWAY_UPSTREAMS": "accounts,social" if has_social else "accounts",
        "ACCOUNTS_SCRYPT_N": "1024",
        "LOG_LEVEL": "info",
    })

    def launch(proc):
        procs.append(proc)  # before it starts: one that fails to become SERVING is stopped too
        return proc.start()

    def gateway(extra_env=None):
        port = free_port()
        genv = dict(env)
        genv.update(extra_env or {})
        return launch(Proc("gateway", ["--host", "127.0.0.1", "--port", str(port)], genv, port))

    # Whatever fails while starting, the processes already started are stopped (they were once
    # left running when a later start failed).
    try:
        accounts = launch(Proc("accounts-service", ["--host", "127.0.0.1", "--port", str(accounts_port),
                                                    "--data-dir", str(tmp_path / "accounts")], env, accounts_port))
        social = None
        if has_social:
            social = launch(Proc("social-service", ["--host", "127.0.0.1", "--port", str(social_port),
                                                    "--data-dir", str(tmp_path / "social")], env, social_port))
        gw = gateway()
        yield {"accounts": accounts, "social": social, "gateway": gw, "start_gateway": gateway, "env": env}
    finally:
        for p in reversed(procs):
            p.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """E2E_STRICT=1 (scripts/test sets it): a test that skips itself because something it needs is
    missing (a service binary, chromium, selenium) fails instead, so CI cannot pass by skipping."""
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("E2E_STRICT") == "1" and report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.longrepr = f"skipped under E2E_STRICT=1: {reason}"

