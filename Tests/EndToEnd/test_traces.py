"""Traces across real processes (issue 19): accounts-service, social-service and the gateway, each
writing its spans to its own file (TRACE_EXPORT=file:…, TRACE_SAMPLE_RATIO=1) and its logs as JSON
lines. One call through the gateway with a chosen `traceparent` makes social queue a mail in its
outbox; the mail reaches accounts' AccountsInternal/SendMail through social's delivery loop, later
and outside the request. The trace id the client chose must be found at the gateway, on social's
server span, on the delivery's client span and on accounts' server span, each the parent of the
next; and in accounts' access-log line of the delivery. Also: with no `traceparent` the gateway
starts the trace; a malformed one starts a new trace and the call still succeeds; a gateway that
does not trace passes the client's header through unchanged."""
import json
import os
import time
import uuid
from pathlib import Path

import grpc
import pytest

from conftest import BIN, Proc, free_port

PASSWORD = "correct horse battery staple"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
SERVER, CLIENT = 2, 3


def spans_of(path):
    """The spans in a span file: one JSON object per line, attributes flattened to a dict."""
    out = []
    if not Path(path).exists():
        return out
    for line in Path(path).read_text().splitlines():
        s = json.loads(line)
        s["attrs"] = {a["key"]: next(iter(a["value"].values())) for a in s["attributes"]}
        s["service"] = s["resource"]["attributes"][0]["value"]["stringValue"]
        out.append(s)
    return out


@pytest.fixture
def traced(tmp_path, stubs):
    if not (BIN / "social-service").exists():
        pytest.skip(f"{BIN / 'social-service'} is not built")
    ports = {n: free_port() for n in ("accounts", "social", "gateway")}
    env = dict(os.environ)
    env.update({
        "DATA_DIR": str(tmp_path),
        "SERVICE_TOKEN": "e2e-service-credential-0123456789abcdef",
        "GATEWAY_TOKEN": "e2e-gateway-credential-0123456789abcdef",
        "ACCOUNTS_ADDR": f"127.0.0.1:{ports['accounts']}",
        "SOCIAL_ADDR": f"127.0.0.1:{ports['social']}",
        "TASKS_ADDR": f"127.0.0.1:{free_port()}",
        "GATEWAY_UPSTREAMS": "accounts,social",
        "ACCOUNTS_SCRYPT_N": "1024",
        "LOG_LEVEL": "info",
        "LOG_FORMAT": "json",
        "TRACE_SAMPLE_RATIO": "1",
    })
    files = {n: tmp_path / f"{n}-spans.jsonl" for n in ports}
    files["relaying"] = tmp_path / "relaying-gateway-spans.jsonl"
    procs = []
    try:
        for name in ("accounts", "social"):
            penv = dict(env, TRACE_EXPORT=f"file:{files[name]}")
            procs.append(Proc(f"{name}-service", ["--host", "127.0.0.1", "--port", str(ports[name]),
                                                   "--data-dir", str(tmp_path / name)], penv, ports[name]).start())
        # The gateway takes its settings as flags too.
        gw = Proc("gateway", ["--host", "127.0.0.1", "--port", str(ports["gateway"]), "--trace-export", f"file:{files['gateway']}",
                              "--trace-sample-ratio", "1"], env, ports["gateway"]).start()
        procs.append(gw)
        plain_port = free_port()
        plain = Proc("gateway", ["--host", "127.0.0.1", "--port", str(plain_port)], env, plain_port).start()
        procs.append(plain)
        # No access log: unary calls its tracer takes no part in are relayed without a context.
        relaying_port = free_port()
        relaying = Proc("gateway", ["--host", "127.0.0.1", "--port", str(relaying_port), "--trace-export",
                                    f"file:{files['relaying']}", "--trace-sample-ratio", "1"],
                        dict(env, ACCESS_LOG="off"), relaying_port).start()
        procs.append(relaying)
        from accounts.v1 import accounts_pb2, accounts_pb2_grpc
        from social.v1 import social_pb2, social_pb2_grpc
        channel = grpc.insecure_channel(f"127.0.0.1:{ports['gateway']}")
        plain_channel = grpc.insecure_channel(f"127.0.0.1:{plain_port}")
        relaying_channel = grpc.insecure_channel(f"127.0.0.1:{relaying_port}")
        direct = grpc.insecure_channel(f"127.0.0.1:{ports['accounts']}")
        yield {
            "files": files, "procs": dict(zip(("accounts", "social", "gateway", "plain", "relaying"), procs)), "env": env,
            "apb": accounts_pb2, "spb": social_pb2,
            "accounts": accounts_pb2_grpc.AccountsStub(channel), "social": social_pb2_grpc.SocialStub(channel),
            "plain_social": social_pb2_grpc.SocialStub(plain_channel),
            "relaying_social": social_pb2_grpc.SocialStub(relaying_channel),
            "mail": accounts_pb2_grpc.AccountsInternalStub(direct),
        }
        channel.close()
        plain_channel.close()
        relaying_channel.close()
        direct.close()
    finally:
        for p in reversed(procs):
            p.stop()


def wait_for(find, what, timeout=15):
    """`find()` until it returns something (span files are written about once a second)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = find()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"not found in time: {what}")


def one(spans, **match):
    found = [s for s in spans if all(s.get(k) == v for k, v in match.items())]
    assert len(found) == 1, f"{len(found)} spans match {match}: {found}"
    return found[0]


def test_one_trace_from_the_gateway_through_social_into_its_outbox_delivery_to_accounts(traced):
    t = traced
    apb, spb = t["apb"], t["spb"]
    name = f"tr{uuid.uuid4().hex[:8]}"
    # No traceparent: the gateway starts the trace (sampled at ratio 1) and accounts continues it.
    user = t["accounts"].SignUp(apb.SignUpRequest(username=name, email=f"{name}@example.com", password=PASSWORD, display_name="T"),
                                timeout=10)
    token = user.session.access_token
    invitee = f"inv{uuid.uuid4().hex[:8]}@example.com"

    # The call with a trace id the client chose, sampled.
    traceparent = f"00-{TRACE_ID}-{CLIENT_SPAN}-01"
    created = t["social"].CreateHousehold(
        spb.CreateHouseholdRequest(name="Traced House", invite_emails=[invitee]),
        metadata=[("authorization", f"Bearer {token}"), ("traceparent", traceparent), ("tracestate", "e2e=1")], timeout=10)
    assert created.household.household_id

    # The invite mail leaves through social's outbox, after the call has answered.
    wait_for(lambda: t["mail"].ListSentMail(apb.ListSentMailRequest(to_email=invitee), metadata=[("x-service-token", t["env"]["SERVICE_TOKEN"])],
                                            timeout=10).mails, "the invite mail")

    files = t["files"]
    send_mail = wait_for(lambda: [s for s in spans_of(files["accounts"]) if s["traceId"] == TRACE_ID
                                  and s["name"] == "accounts.v1.AccountsInternal/SendMail"], "accounts' SendMail span in the trace")[0]
    gw = wait_for(lambda: [s for s in spans_of(files["gateway"]) if s["traceId"] == TRACE_ID], "the gateway's span")
    gw = one(gw, traceId=TRACE_ID, name="social.v1.Social/CreateHousehold")
    social_spans = wait_for(lambda: [s for s in spans_of(files["social"]) if s["traceId"] == TRACE_ID and s["kind"] == CLIENT]
                            and [s for s in spans_of(files["social"]) if s["traceId"] == TRACE_ID], "social's spans")
    server = one(social_spans, kind=SERVER, name="social.v1.Social/CreateHousehold")
    delivery = one(social_spans, kind=CLIENT, name="accounts.v1.AccountsInternal/SendMail")

    # gateway (child of the client's span) → social → delivery → accounts.
    assert gw["kind"] == SERVER and gw["parentSpanId"] == CLIENT_SPAN and gw["service"] == "gateway"
    assert gw["traceState"] == "e2e=1"
    assert server["parentSpanId"] == gw["spanId"] and server["service"] == "social"
    assert delivery["parentSpanId"] == server["spanId"]
    assert send_mail["kind"] == SERVER and send_mail["parentSpanId"] == delivery["spanId"] and send_mail["service"] == "accounts"
    for s in (gw, server, delivery, send_mail):
        assert s["attrs"]["rpc.system"] == "grpc"
        assert s["attrs"]["rpc.grpc.status_code"] == "0"
        assert s["status"]["code"] != 2
    assert server["attrs"]["rpc.service"] == "social.v1.Social" and server["attrs"]["rpc.method"] == "CreateHousehold"
    # The delivery started after the request had been answered (it is the outbox's, not the call's).
    assert int(delivery["startTimeUnixNano"]) >= int(server["startTimeUnixNano"])

    # accounts' access-log line of the delivery is a JSON line with the trace id and its span.
    log = Path(t["procs"]["accounts"].log.name).read_text()
    lines = [json.loads(l) for l in log.splitlines() if l.startswith("{")]
    access = [l for l in lines if l.get("logger") == "access" and l.get("rpc.method") == "accounts.v1.AccountsInternal/SendMail"]
    assert any(l.get("trace_id") == TRACE_ID and l.get("span_id") == send_mail["spanId"] for l in access), access

    # The sign-up without a traceparent: a trace the gateway started, continued by accounts.
    signup = [s for s in spans_of(files["gateway"]) if s["name"] == "accounts.v1.Accounts/SignUp"]
    assert len(signup) == 1 and "parentSpanId" not in signup[0]
    root = signup[0]
    assert root["traceId"] != TRACE_ID
    acc = one(spans_of(files["accounts"]), traceId=root["traceId"], name="accounts.v1.Accounts/SignUp")
    assert acc["parentSpanId"] == root["spanId"]


@pytest.mark.parametrize("header", [
    "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",  # uppercase
    "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # all-zero trace id
    "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # another version
    "garbage",
])
def test_a_malformed_traceparent_starts_a_new_trace_and_the_call_succeeds(traced, header):
    t = traced
    apb, spb = t["apb"], t["spb"]
    name = f"mf{uuid.uuid4().hex[:8]}"
    user = t["accounts"].SignUp(apb.SignUpRequest(username=name, email=f"{name}@example.com", password=PASSWORD, display_name="M"),
                                timeout=10)
    got = t["social"].ListFriends(spb.ListFriendsRequest(),
                                     metadata=[("authorization", f"Bearer {user.session.access_token}"), ("traceparent", header)],
                                     timeout=10)
    assert list(got.friends) == []
    gw = wait_for(lambda: [s for s in spans_of(t["files"]["gateway"]) if s["name"] == "social.v1.Social/ListFriends"], "gateway span")
    assert len(gw) == 1
    assert "parentSpanId" not in gw[0], "a new trace, not the malformed one"
    assert gw[0]["traceId"] != TRACE_ID and gw[0]["traceId"] != "0" * 32
    server = wait_for(lambda: [s for s in spans_of(t["files"]["social"]) if s["name"] == "social.v1.Social/ListFriends"], "social span")
    assert server[0]["traceId"] == gw[0]["traceId"] and server[0]["parentSpanId"] == gw[0]["spanId"]


def test_a_gateway_that_does_not_trace_passes_the_clients_traceparent_through(traced):
    t = traced
    apb, spb = t["apb"], t["spb"]
    name = f"pt{uuid.uuid4().hex[:8]}"
    user = t["accounts"].SignUp(apb.SignUpRequest(username=name, email=f"{name}@example.com", password=PASSWORD, display_name="P"),
                                timeout=10)
    trace_id = uuid.uuid4().hex
    t["plain_social"].ListFriends(spb.ListFriendsRequest(),
                                     metadata=[("authorization", f"Bearer {user.session.access_token}"),
                                               ("traceparent", f"00-{trace_id}-{CLIENT_SPAN}-01")], timeout=10)
    # (Other spans of the trace may come first: the policy runs inside the call's span, and its
    # first token check fetches accounts' keys, a client span of its own.)
    server = wait_for(lambda: [s for s in spans_of(t["files"]["social"])
                               if s["traceId"] == trace_id and s["name"] == "social.v1.Social/ListFriends"], "social span")
    assert server[0]["parentSpanId"] == CLIENT_SPAN, "the client's own span is social's parent: the plain gateway added nothing"
    assert not [s for s in spans_of(t["files"]["gateway"]) if s["traceId"] == trace_id]


def test_a_gateway_that_relays_without_a_context_still_traces_the_calls_it_samples(traced):
    """Without an access log the gateway relays a unary call without a context when its tracer
    takes no part in it (no `traceparent`, a new trace not sampled); at ratio 1 it takes part in
    every call, so each trace is whole: the client's span, the gateway's, social's; and a call
    without a `traceparent` is a trace the gateway starts, its sampling drawn once."""
    t = traced
    apb, spb = t["apb"], t["spb"]
    name = f"rl{uuid.uuid4().hex[:8]}"
    user = t["accounts"].SignUp(apb.SignUpRequest(username=name, email=f"{name}@example.com", password=PASSWORD, display_name="R"),
                                timeout=10)
    auth = ("authorization", f"Bearer {user.session.access_token}")
    trace_id = uuid.uuid4().hex
    t["relaying_social"].ListFriends(spb.ListFriendsRequest(), metadata=[auth, ("traceparent", f"00-{trace_id}-{CLIENT_SPAN}-01")],
                                     timeout=10)
    gw = wait_for(lambda: [s for s in spans_of(t["files"]["relaying"])
                           if s["traceId"] == trace_id and s["name"] == "social.v1.Social/ListFriends"], "the gateway's span")
    assert gw[0]["parentSpanId"] == CLIENT_SPAN and gw[0]["kind"] == SERVER
    server = wait_for(lambda: [s for s in spans_of(t["files"]["social"])
                               if s["traceId"] == trace_id and s["name"] == "social.v1.Social/ListFriends"], "social's span")
    assert server[0]["parentSpanId"] == gw[0]["spanId"]

    t["relaying_social"].ListFriends(spb.ListFriendsRequest(), metadata=[auth], timeout=10)
    started = wait_for(lambda: [s for s in spans_of(t["files"]["relaying"])
                                if s["name"] == "social.v1.Social/ListFriends" and "parentSpanId" not in s], "a trace the gateway started")
    assert len(started) == 1
    child = wait_for(lambda: [s for s in spans_of(t["files"]["social"])
                              if s["traceId"] == started[0]["traceId"] and s["name"] == "social.v1.Social/ListFriends"], "its child")
    assert child[0]["parentSpanId"] == started[0]["spanId"]


def test_browser_calls_have_access_log_lines_with_their_trace(traced):
    """Calls in the browser protocols (Connect JSON, gRPC-Web) end in the gateway's HTTP handler,
    not in its gRPC transport: they get the same access-log line (method, status, duration, peer,
    the verified user) with the client's trace. A call refused for a bad token (checked in the
    policy's chain) has its line with its trace; one refused at its headers for having no token
    at all has its line without one (refused before any span, as on the gRPC path). No token
    appears in the log."""
    import urllib.error
    import urllib.request
    t = traced
    apb = t["apb"]
    gw_port = t["procs"]["gateway"].port
    name = f"bl{uuid.uuid4().hex[:8]}"
    user = t["accounts"].SignUp(apb.SignUpRequest(username=name, email=f"{name}@example.com", password=PASSWORD, display_name="B"),
                                timeout=10)
    token = user.session.access_token
    connect_trace, web_trace = uuid.uuid4().hex, uuid.uuid4().hex
    bad_token = token[:-6] + ("AAAAAA" if not token.endswith("AAAAAA") else "BBBBBB")

    def post(path, body, headers):
        req = urllib.request.Request(f"http://127.0.0.1:{gw_port}{path}", data=body, method="POST", headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
        except urllib.error.HTTPError as e:
            return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()

    def grpc_status(headers, body):
        return headers.get("grpc-status") or (body.split(b"grpc-status:")[1][:2].strip().decode() if b"grpc-status:" in body else None)

    status, _, body = post("/social.v1.Social/ListFriends", b"{}", {
        "Content-Type": "application/json", "Connect-Protocol-Version": "1", "Authorization": f"Bearer {token}",
        "traceparent": f"00-{connect_trace}-00f067aa0ba902b7-01"})
    assert status == 200, body
    web = {"Content-Type": "application/grpc-web+proto", "X-Grpc-Web": "1"}
    status, headers, body = post("/social.v1.Social/ListFriends", b"\x00\x00\x00\x00\x00", {
        **web, "Authorization": f"Bearer {bad_token}", "traceparent": f"00-{web_trace}-00f067aa0ba902b7-01"})
    assert status == 200 and grpc_status(headers, body) == "16", (headers, body)
    status, headers, body = post("/social.v1.Social/ListFriends", b"\x00\x00\x00\x00\x00", web)
    assert status == 200 and grpc_status(headers, body) == "16", (headers, body)

    def access_lines():
        log = Path(t["procs"]["gateway"].log.name).read_text()
        lines = [json.loads(l) for l in log.splitlines() if l.startswith("{")]
        return [l for l in lines if l.get("logger") == "access" and l.get("rpc.method") == "social.v1.Social/ListFriends"]

    lines = wait_for(lambda: (lambda got: got if len(got) >= 3 else None)(access_lines()), "three browser access lines", timeout=10)
    by_trace = {l.get("trace_id"): l for l in lines}
    ok, bad, missing = by_trace[connect_trace], by_trace[web_trace], by_trace[None]
    assert ok["rpc.code"] == "OK" and ok["user"] == user.user.user_id, ok
    assert bad["rpc.code"] == "UNAUTHENTICATED" and "user" not in bad, bad
    assert missing["rpc.code"] == "UNAUTHENTICATED" and "user" not in missing, missing
    for line in (ok, bad, missing):
        assert line["peer"].startswith("127.0.0.1:") and float(line["duration_ms"]) >= 0, line
    text = Path(t["procs"]["gateway"].log.name).read_text()
    assert token not in text and bad_token not in text
