"""End to end through the gateway, against the real accounts-service and gateway processes: a gRPC
client we did not write (grpcio) and plain HTTP/JSON (urllib, Connect protocol)."""
import base64
import json
import time
import urllib.error
import urllib.request
import uuid

import grpc
import pytest


def unique():
    return uuid.uuid4().hex[:10]


def channel(proc):
    return grpc.insecure_channel(f"127.0.0.1:{proc.port}")


def bearer(token):
    return [("authorization", f"Bearer {token}")]


def test_grpc_flow_signup_login_profile_refresh_logout(system, stubs):
    pb, pb_grpc = stubs
    stub = pb_grpc.AccountsStub(channel(system["gateway"]))
    name = f"e2e{unique()}"
    signed = stub.SignUp(pb.SignUpRequest(username=name, email=f"{name}@Example.com", password="correct horse 1",
                                          display_name="E2E User"), timeout=10)
    assert signed.user.username == name and signed.session.access_token

    login = stub.LogIn(pb.LogInRequest(email=f"{name}@example.com", password="correct horse 1"), timeout=10)
    token = login.session.access_token
    me = stub.GetMyProfile(pb.GetMyProfileRequest(), metadata=bearer(token), timeout=10)
    assert me.user.username == name and me.user.display_name == "E2E User"

    refreshed = stub.RefreshSession(pb.RefreshSessionRequest(refresh_token=login.session.refresh_token), timeout=10)
    new_token = refreshed.session.access_token
    assert refreshed.session.refresh_token != login.session.refresh_token
    # The rotated refresh token is spent: using it again fails (and revokes the session).
    with pytest.raises(grpc.RpcError) as e:
        stub.RefreshSession(pb.RefreshSessionRequest(refresh_token=login.session.refresh_token), timeout=10)
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED

    # A fresh session, logged out: its tokens no longer work.
    login2 = stub.LogIn(pb.LogInRequest(username=name, password="correct horse 1"), timeout=10)
    stub.LogOut(pb.LogOutRequest(), metadata=bearer(login2.session.access_token), timeout=10)
    with pytest.raises(grpc.RpcError) as e:
        stub.GetMyProfile(pb.GetMyProfileRequest(), metadata=bearer(login2.session.access_token), timeout=10)
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.RpcError) as e:
        stub.RefreshSession(pb.RefreshSessionRequest(refresh_token=login2.session.refresh_token), timeout=10)
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    del new_token


def test_grpc_missing_forged_token_and_internal_rpc(system, stubs):
    pb, pb_grpc = stubs
    ch = channel(system["gateway"])
    stub = pb_grpc.AccountsStub(ch)
    with pytest.raises(grpc.RpcError) as e:
        stub.GetMyProfile(pb.GetMyProfileRequest(), timeout=10)
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED

    # A token signed with a key accounts never published.
    header = base64.urlsafe_b64encode(json.dumps({"alg": "EdDSA", "typ": "JWT", "kid": "forged"}).encode()).rstrip(b"=")
    claims = base64.urlsafe_b64encode(json.dumps({"sub": "u1", "sid": "s1", "iat": int(time.time()),
                                                  "exp": int(time.time()) + 600, "kind": "user"}).encode()).rstrip(b"=")
    forged = (header + b"." + claims + b"." + base64.urlsafe_b64encode(b"\x00" * 64).rstrip(b"=")).decode()
    with pytest.raises(grpc.RpcError) as e:
        stub.GetMyProfile(pb.GetMyProfileRequest(), metadata=bearer(forged), timeout=10)
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED

    # Internal RPCs are never reachable from outside, even with a guessed service credential.
    internal = pb_grpc.AccountsInternalStub(ch)
    with pytest.raises(grpc.RpcError) as e:
        internal.ResolveUsernames(pb.ResolveUsernamesRequest(usernames=["x"]),
                                  metadata=[("x-service-token", "e2e-service-token")], timeout=10)
    assert e.value.code() in (grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.PERMISSION_DENIED)


def post_json(port, path, body, token=None, http_version=None):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "Connect-Protocol-Version": "1"})
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def test_json_flow_over_http1(system):
    port = system["gateway"].port
    name = f"json{unique()}"
    status, body = post_json(port, "/accounts.v1.Accounts/SignUp",
                             {"username": name, "email": f"{name}@example.com", "password": "correct horse 2",
                              "displayName": "JSON User"})
    assert status == 200, body
    status, body = post_json(port, "/accounts.v1.Accounts/LogIn", {"username": name, "password": "correct horse 2"})
    assert status == 200, body
    token, refresh = body["session"]["accessToken"], body["session"]["refreshToken"]
    status, body = post_json(port, "/accounts.v1.Accounts/GetMyProfile", {}, token)
    assert status == 200 and body["user"]["username"] == name, body
    status, body = post_json(port, "/accounts.v1.Accounts/RefreshSession", {"refreshToken": refresh})
    assert status == 200, body
    new_token = body["session"]["accessToken"]
    status, body = post_json(port, "/accounts.v1.Accounts/LogOut", {}, new_token)
    assert status == 200, body
    status, body = post_json(port, "/accounts.v1.Accounts/GetMyProfile", {}, new_token)
    assert status == 401 and body["code"] == "unauthenticated", body
    # Errors carry Connect's JSON shape and HTTP code, naming the rejected fields.
    status, body = post_json(port, "/accounts.v1.Accounts/SignUp", {"username": "", "email": "nope", "password": "x"})
    assert status == 400 and body["code"] == "invalid_argument", body
    for field in ("username", "email", "password"):
        assert field in body["message"], body
    status, body = post_json(port, "/accounts.v1.AccountsInternal/ResolveUsernames", {"usernames": ["x"]})
    assert status in (404, 501) and body["code"] in ("unimplemented", "not_found"), body
    status, body = post_json(port, "/grpc.health.v1.Health/Check", {})
    assert status == 200 and body == {"status": "SERVING"}, body


def test_stopped_upstream_is_unavailable_fast(system, stubs):
    pb, pb_grpc = stubs
    stub = pb_grpc.AccountsStub(channel(system["gateway"]))
    system["accounts"].stop()
    start = time.monotonic()
    with pytest.raises(grpc.RpcError) as e:
        stub.LogIn(pb.LogInRequest(username="nobody", password="whatever1"), timeout=10)
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    # The upstream named; its address and the transport's inner errors stay in the gateway.
    assert e.value.details() == "accounts is unavailable right now: try again shortly", e.value.details()
    assert time.monotonic() - start < 3, "UNAVAILABLE must come fast, not at the deadline"


def test_rate_limit_is_resource_exhausted(system, stubs):
    pb, pb_grpc = stubs
    gw = system["start_gateway"]({"GATEWAY_ADDRESS_RATE": "1", "GATEWAY_ADDRESS_BURST": "3"})
    stub = pb_grpc.AccountsStub(channel(gw))
    codes = []
    for _ in range(10):
        try:
            stub.LogIn(pb.LogInRequest(username="nobody", password="whatever1"), timeout=10)
            codes.append(grpc.StatusCode.OK)
        except grpc.RpcError as e:
            codes.append(e.code())
    assert grpc.StatusCode.RESOURCE_EXHAUSTED in codes, codes
