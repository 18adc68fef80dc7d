"""Issue 11, defect 2: memory before authentication. Many h2c connections at once, each opening 100
streams that declare a 4 MiB (or 1 MiB) request message and send it, against the real gateway and
accounts-service processes: their resident memory (VmRSS from /proc) must stay under 150 MB, and a
well-behaved client's calls must keep succeeding meanwhile.

The attack clients speak raw HTTP/2 (Tests/Interop/rawh2.py): they send within the flow-control
windows the server grants, as fast as it grants them, whatever the server answers (a refused
stream's remaining bytes are still sent), until every byte is sent or `ATTACK_SECONDS` pass. The numbers printed (`-s` shows them) are the peak RSS seen during each run.

ATTACK_CONNECTIONS (default 10) sets the connections per run.
"""
import os
import struct
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "Interop"))
import rawh2  # noqa: E402

CONNECTIONS = int(os.environ.get("ATTACK_CONNECTIONS", "10"))
STREAMS = 100
ATTACK_SECONDS = float(os.environ.get("ATTACK_SECONDS", "15"))
RSS_LIMIT_MB = 150
FRAME = 16384
CHUNK = b"\0" * FRAME


def rss_mb(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def data_frame(stream_id, payload, end_stream=False):
    return struct.pack(">I", len(payload))[1:] + bytes([0x0, 0x1 if end_stream else 0]) + struct.pack(">I", stream_id) + payload


class Attacker(threading.Thread):
    """One connection: STREAMS streams to `path`, each declaring `size` bytes and sending them."""

    def __init__(self, port, path, size, deadline, extra_headers=()):
        super().__init__(daemon=True)
        self.port, self.path, self.size, self.deadline = port, path, size, deadline
        self.extra = list(extra_headers)
        self.sent = 0
        self.statuses = {}
        self.error = None
        self.goaway = None

    def run(self):
        try:
            self._run()
        except Exception as e:  # noqa: BLE001 - reported by the test
            self.error = e

    def _run(self):
        c = rawh2.RawH2("127.0.0.1", self.port, timeout=10)
        try:
            c.wait_settings(10)
            ids = []
            for _ in range(STREAMS):
                sid = c.new_stream()
                c.send_headers(sid, c.grpc_headers(self.path, extra=self.extra))
                ids.append(sid)
            remaining = {sid: self.size + 5 for sid in ids}
            prefix = struct.pack(">BI", 0, self.size)
            first = {sid: True for sid in ids}
            while remaining and time.monotonic() < self.deadline and not c.closed:
                c.poll_now()
                progressed = False
                for sid in list(remaining):
                    s = c.streams[sid]
                    if s.reset is not None:  # an answer alone does not stop it: it sends it all
                        del remaining[sid]
                        continue
                    window = min(c.conn_send_window, s.send_window, FRAME)
                    if window <= 0:
                        continue
                    n = min(window, remaining[sid])
                    payload = (prefix + CHUNK[: n - 5]) if first[sid] else CHUNK[:n]
                    first[sid] = False
                    remaining[sid] -= n
                    end = remaining[sid] == 0
                    c.sock.settimeout(10)  # pump() leaves a short timeout: a full socket buffer is not an error
                    if not c.send(data_frame(sid, payload, end)):
                        break
                    c.conn_send_window -= n
                    s.send_window -= n
                    self.sent += n
                    progressed = True
                    if end:
                        del remaining[sid]
                if not progressed:
                    c.pump(0.05)
            c.wait(lambda: all(c.streams[s].ended for s in ids), timeout=max(0.1, min(5, self.deadline - time.monotonic())))
            for sid in ids:
                st = c.streams[sid].grpc_status
                self.statuses[st] = self.statuses.get(st, 0) + 1
            self.goaway = c.goaway
        finally:
            c.close()


def run_attack(target, path, size, check_call, extra_headers=()):
    """Attacks `target` (a conftest Proc) with CONNECTIONS attackers at once while a
    well-behaved client calls `check_call()`; returns (peak RSS MB, baseline MB, attackers)."""
    pid = target.p.pid
    baseline = rss_mb(pid)
    deadline = time.monotonic() + ATTACK_SECONDS
    attackers = [Attacker(target.port, path, size, deadline, extra_headers) for _ in range(CONNECTIONS)]
    for a in attackers:
        a.start()
    peak = baseline
    calls, failures = 0, []
    next_call = time.monotonic()
    while any(a.is_alive() for a in attackers):
        peak = max(peak, rss_mb(pid))
        if time.monotonic() >= next_call:
            next_call = time.monotonic() + 0.5
            calls += 1
            try:
                check_call()
            except grpc.RpcError as e:
                failures.append(f"{e.code()}: {e.details()}")
        time.sleep(0.05)
    for a in attackers:
        a.join(30)
    peak = max(peak, rss_mb(pid))
    sent = sum(a.sent for a in attackers) / (1 << 20)
    statuses = {}
    for a in attackers:
        for k, v in a.statuses.items():
            statuses[k] = statuses.get(k, 0) + v
    print(f"\n{target.name} {path} {size >> 10} KiB x {STREAMS} streams x {CONNECTIONS} connections: "
          f"RSS {baseline:.0f} MB -> peak {peak:.0f} MB; {sent:.0f} MiB sent; grpc-status counts {statuses}; "
          f"{calls - len(failures)}/{calls} well-behaved calls succeeded")
    assert target.p.poll() is None, f"{target.name} died: {target.tail()}"
    goaways = [a.goaway for a in attackers if a.goaway]
    if goaways:
        print(f"GOAWAYs: {goaways[:3]}")
    errors = [a.error for a in attackers if a.error]
    assert not errors, errors
    assert not failures, failures[:5]
    assert calls > 0
    return peak, baseline, statuses


@pytest.fixture
def accounts_stub(stubs):
    pb, pb_grpc = stubs

    def make(proc):
        ch = grpc.insecure_channel(f"127.0.0.1:{proc.port}")
        return pb, pb_grpc.AccountsStub(ch), ch

    return make


def test_gateway_signup_floods_stay_bounded(system, accounts_stub):
    gw = system["gateway"]
    pb, stub, ch = accounts_stub(gw)
    try:
        peak, _, statuses = run_attack(gw, "/accounts.v1.Accounts/SignUp", 4 << 20,
                                       lambda: stub.GetSigningKeys(pb.GetSigningKeysRequest(), timeout=10))
        assert peak < RSS_LIMIT_MB
        # Refused from the length prefix: the method takes at most 64 KiB.
        assert statuses.get(8, 0) == CONNECTIONS * STREAMS, statuses
    finally:
        ch.close()


def test_gateway_anonymous_uploads_refused_at_headers(system, accounts_stub):
    gw = system["gateway"]
    pb, stub, ch = accounts_stub(gw)
    try:
        peak, _, statuses = run_attack(gw, "/accounts.v1.Accounts/UploadAvatar", 1 << 20,
                                       lambda: stub.GetSigningKeys(pb.GetSigningKeysRequest(), timeout=10))
        assert peak < RSS_LIMIT_MB
        assert statuses.get(16, 0) == CONNECTIONS * STREAMS, statuses  # UNAUTHENTICATED
    finally:
        ch.close()


def test_gateway_public_upload_floods_stay_bounded(system, accounts_stub):
    """UploadTeamTaskAttachment is public (the upload token is the credential) and takes 5 MiB:
    4 MiB messages are admitted against the request budgets, relayed (the tasks upstream is not
    running here: UNAVAILABLE) or refused with RESOURCE_EXHAUSTED past the budget. The relayed ones
    pass the policy, so this gateway has no per-address limit (the well-behaved client shares the
    attackers' address)."""
    gw = system["start_gateway"]({"GATEWAY_ADDRESS_RATE": "0"})
    pb, stub, ch = accounts_stub(gw)
    try:
        peak, _, statuses = run_attack(gw, "/tasks.v1.Tasks/UploadTeamTaskAttachment", 4 << 20,
                                       lambda: stub.GetSigningKeys(pb.GetSigningKeysRequest(), timeout=10))
        assert peak < RSS_LIMIT_MB
        # None: still waiting for admission when the attack stopped (backpressure).
        assert set(statuses) <= {8, 14, None}, statuses
    finally:
        ch.close()


def test_accounts_service_floods_stay_bounded(system, accounts_stub):
    """The same against accounts-service directly (what any service inherits from the transport):
    SignUp declaring 4 MiB (refused from the prefix), and UploadAvatar declaring 1 MiB, its own
    limit, without a token: admitted against the request budgets (the service's interceptor
    refuses them only once they arrive), so memory is bounded by the budgets and windows."""
    acc = system["accounts"]
    pb, stub, ch = accounts_stub(acc)
    check = lambda: stub.GetSigningKeys(pb.GetSigningKeysRequest(), timeout=10)  # noqa: E731
    try:
        peak, _, statuses = run_attack(acc, "/accounts.v1.Accounts/SignUp", 4 << 20, check)
        assert peak < RSS_LIMIT_MB
        assert statuses.get(8, 0) == CONNECTIONS * STREAMS, statuses
        peak, _, statuses = run_attack(acc, "/accounts.v1.Accounts/UploadAvatar", 1 << 20, check)
        assert peak < RSS_LIMIT_MB
        assert None not in statuses and 0 not in statuses, statuses  # every stream answered, none accepted
    finally:
        ch.close()
