"""Traces exported with OTLP/gRPC across real processes (issue 19): accounts-service and the gateway
with TRACE_EXPORT=otlp://127.0.0.1:PORT and TRACE_SAMPLE_RATIO=1 send their spans to a collector
written here in Python with grpcio, an implementation independent of ours: its stubs come from the
same Proto/opentelemetry files through grpc_tools.protoc at test time (conftest's `stubs`). One
call through the gateway with a chosen `traceparent` must reach the collector as the gateway's span
(child of the client's) and accounts' span (child of the gateway's), both of that trace, each under
its own `service.name`. Also: with the collector down, calls answer as usual and the spans are
counted as dropped; the spans still buffered when a process is stopped are sent before it exits."""
import os
import re
import threading
import time
import urllib.request
import uuid
from concurrent import futures

import grpc
import pytest

from conftest import BIN, Proc, free_port

PASSWORD = "correct horse battery staple"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
SPAN_KIND_SERVER = 2


class Collector:
    """An OTLP/gRPC trace receiver on 127.0.0.1 that keeps every Export request."""

    def __init__(self):
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

        self.lock = threading.Lock()
        self.requests = []
        collector = self

        class Servicer(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request, context):
                with collector.lock:
                    collector.requests.append(request)
                return trace_service_pb2.ExportTraceServiceResponse()

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Servicer(), self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def spans(self):
        """(service.name, span) for every span received."""
        with self.lock:
            requests = list(self.requests)
        out = []
        for request in requests:
            for rs in request.resource_spans:
                service = next((a.value.string_value for a in rs.resource.attributes if a.key == "service.name"), "")
                for ss in rs.scope_spans:
                    out.extend((service, s) for s in ss.spans)
        return out

    def stop(self):
        self.server.stop(0)


def wait_for(find, what, timeout=15):
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = find()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"not found in time: {what}")


def base_env(tmp_path, ports):
    env = dict(os.environ)
    env.update({
        "DATA_DIR": str(tmp_path),
        "SERVICE_TOKEN": "e2e-service-credential-0123456789abcdef",
        "GATEWAY_TOKEN": "e2e-gateway-credential-0123456789abcdef",
        "ACCOUNTS_ADDR": f"127.0.0.1:{ports['accounts']}",
        "SOCIAL_ADDR": f"127.0.0.1:{free_port()}",
        "TASKS_ADDR": f"127.0.0.1:{free_port()}",
        "GATEWAY_UPSTREAMS": "accounts",
        "ACCOUNTS_SCRYPT_N": "1024",
        "TRACE_SAMPLE_RATIO": "1",
    })
    return env


def start(tmp_path, env, ports):
    accounts = Proc("accounts-service", ["--host", "127.0.0.1", "--port", str(ports["accounts"]),
                                         "--data-dir", str(tmp_path / "accounts")], env, ports["accounts"]).start()
    gateway = Proc("gateway", ["--host", "127.0.0.1", "--port", str(ports["gateway"])], env, ports["gateway"]).start()
    return accounts, gateway


def sign_up(port, traceparent):
    from accounts.v1 import accounts_pb2, accounts_pb2_grpc
    name = f"otlp{uuid.uuid4().hex[:8]}"
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        return accounts_pb2_grpc.AccountsStub(channel).SignUp(
            accounts_pb2.SignUpRequest(username=name, email=f"{name}@example.com", password=PASSWORD, display_name="O"),
            metadata=[("traceparent", traceparent), ("tracestate", "e2e=1")], timeout=10)


def dropped(port):
    """tracing_spans_dropped_total from a process's GET /metrics (0 when not yet counted)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    m = re.search(r"^tracing_spans_dropped_total(?:\{[^}]*\})? (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


@pytest.fixture
def collector(stubs):
    c = Collector()
    yield c
    c.stop()


def test_the_gateways_and_the_services_spans_reach_an_otlp_collector_in_one_trace(tmp_path, collector):
    ports = {"accounts": free_port(), "gateway": free_port()}
    env = dict(base_env(tmp_path, ports), TRACE_EXPORT=f"otlp://127.0.0.1:{collector.port}")
    procs = []
    try:
        procs.extend(start(tmp_path, env, ports))
        user = sign_up(ports["gateway"], f"00-{TRACE_ID}-{CLIENT_SPAN}-01")
        assert user.session.access_token

        def find():
            spans = [(svc, s) for svc, s in collector.spans()
                     if s.trace_id.hex() == TRACE_ID and s.name == "accounts.v1.Accounts/SignUp"]
            return spans if {svc for svc, _ in spans} >= {"gateway", "accounts"} else None

        spans = wait_for(find, "the gateway's and accounts' SignUp spans at the collector")
        gw = [s for svc, s in spans if svc == "gateway"]
        acc = [s for svc, s in spans if svc == "accounts"]
        assert len(gw) == 1 and len(acc) == 1, spans
        gw, acc = gw[0], acc[0]
        # client → gateway → accounts, one trace, ids as bytes of their sizes.
        assert len(gw.trace_id) == 16 and len(gw.span_id) == 8
        assert gw.parent_span_id.hex() == CLIENT_SPAN
        assert acc.parent_span_id == gw.span_id
        assert acc.span_id != gw.span_id
        for s in (gw, acc):
            assert s.kind == SPAN_KIND_SERVER
            assert s.trace_state == "e2e=1"
            assert s.flags & 0xFF == 1
            assert 0 < s.start_time_unix_nano <= s.end_time_unix_nano
            attrs = {a.key: a.value for a in s.attributes}
            assert attrs["rpc.system"].string_value == "grpc"
            assert attrs["rpc.grpc.status_code"].int_value == 0
            assert s.status.code != 2  # not ERROR
    finally:
        for p in reversed(procs):
            p.stop()


def test_a_collector_that_is_down_costs_the_calls_nothing_and_the_spans_are_counted(tmp_path, stubs):
    ports = {"accounts": free_port(), "gateway": free_port()}
    env = dict(base_env(tmp_path, ports), TRACE_EXPORT=f"otlp://127.0.0.1:{free_port()}")  # nobody listens
    procs = []
    try:
        procs.extend(start(tmp_path, env, ports))
        t0 = time.monotonic()
        for i in range(5):
            assert sign_up(ports["gateway"], f"00-{TRACE_ID}-{CLIENT_SPAN}-01").session.access_token
        took = time.monotonic() - t0
        assert took < 10, f"5 sign-ups took {took:.1f} s"
        # Batches go every second; each is tried a few times (backoff under ~2 s), then dropped.
        wait_for(lambda: dropped(ports["gateway"]) >= 5 and dropped(ports["accounts"]) >= 5, "spans counted as dropped", timeout=20)
        t0 = time.monotonic()
        for p in reversed(procs):
            p.stop()
            assert p.p.returncode == 0, p.tail()
        assert time.monotonic() - t0 < 15, "stopping waits a bounded time for the collector"
    finally:
        for p in reversed(procs):
            p.stop()


def test_spans_still_buffered_are_sent_when_a_process_stops(tmp_path, collector):
    ports = {"accounts": free_port(), "gateway": free_port()}
    env = dict(base_env(tmp_path, ports), TRACE_EXPORT=f"otlp://127.0.0.1:{collector.port}")
    procs = []
    try:
        procs.extend(start(tmp_path, env, ports))
        trace = uuid.uuid4().hex
        sign_up(ports["gateway"], f"00-{trace}-{CLIENT_SPAN}-01")
        # Stopped at once (batches go every second): SIGTERM, and the exit sends what is buffered.
        for p in reversed(procs):
            p.stop()
            assert p.p.returncode == 0, p.tail()
        services = {svc for svc, s in collector.spans() if s.trace_id.hex() == trace}
        assert services == {"gateway", "accounts"}
    finally:
        for p in reversed(procs):
            p.stop()
