"""Self-test of fake_providers.py against clients we did not write.

APNs through httpx over HTTP/2 with PyJWT-made provider tokens; FCM through google-auth's
service-account flow (its own JWT assertion, its own token request) and requests; Web Push through
pywebpush (http_ece encryption, py_vapid signatures), plus hand-made variants of each to prove that
what the real provider refuses is refused here too and shows up in /control/rejected.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import select
import ssl
import subprocess
import sys
import time
import uuid

import google.auth.transport.requests
import http_ece
import httpx
import jwt
import pytest
import requests
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from google.auth.exceptions import RefreshError
from google.oauth2 import service_account
from py_vapid import Vapid
from pywebpush import WebPushException, webpush

HERE = os.path.dirname(os.path.abspath(__file__))
SERVER = os.path.join(HERE, "fake_providers.py")
FCM_SCOPE = "https://www.googleapis.com/auth/firebase.messaging"


class Server:
    def __init__(self, directory: str, extra_args: tuple[str, ...] = ()):
        self.dir = directory
        self.stderr = open(os.path.join(directory, "server.stderr"), "ab")
        self.proc = subprocess.Popen(
            [sys.executable, SERVER, "--dir", directory, "--port", "0", *extra_args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr,
        )
        line = self._read_line(timeout=20)
        assert line.startswith("READY "), f"expected READY, got {line!r}; stderr: {self.stderr_text()}"
        self.port = json.loads(line[len("READY "):])["port"]
        assert json.load(open(os.path.join(directory, "ready.json"))) == {"port": self.port}
        self.origin = f"https://127.0.0.1:{self.port}"
        self.ca = os.path.join(directory, "ca.pem")
        self.ssl = ssl.create_default_context(cafile=self.ca)
        self.h2 = httpx.Client(http1=False, http2=True, verify=self.ssl, timeout=10)
        self.h1 = httpx.Client(http1=True, http2=False, verify=self.ssl, timeout=10)

    def _read_line(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        data = b""
        while not data.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.proc.stdout], [], [], left)[0]:
                return data.decode(errors="replace")
            byte = os.read(self.proc.stdout.fileno(), 1)  # unbuffered: select() sees what is left
            if not byte:
                return data.decode(errors="replace")
            data += byte
        return data.decode().rstrip("\n")

    def stderr_text(self) -> str:
        self.stderr.flush()
        return open(os.path.join(self.dir, "server.stderr"), errors="replace").read()[-3000:]

    def control(self, method: str, path: str, body: dict | None = None) -> object:
        response = self.h1.request(method, f"{self.origin}/control/{path}", json=body)
        assert response.status_code == 200, (path, response.status_code, response.text)
        return response.json()

    def received(self) -> list[dict]:
        return self.control("GET", "received")

    def rejected(self) -> list[dict]:
        return self.control("GET", "rejected")

    def stop(self) -> int:
        """Closing stdin is how a test stops it: the server must exit by itself."""
        self.h2.close()
        self.h1.close()
        self.proc.stdin.close()
        try:
            return self.proc.wait(timeout=10)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self.proc.stdout.close()
            self.stderr.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Server(str(tmp_path_factory.mktemp("providers")))
    yield s
    assert s.stop() == 0, "the server did not exit cleanly when its stdin closed"


@pytest.fixture(autouse=True)
def clean(request):
    if "server" in request.fixturenames:
        request.getfixturevalue("server").control("POST", "reset")


# ---- APNs ----------------------------------------------------------------------------------------


def apns_credentials(server: Server) -> tuple[bytes, str, str]:
    key = open(os.path.join(server.dir, "apns-key.p8"), "rb").read()
    meta = json.load(open(os.path.join(server.dir, "apns.json")))
    return key, meta["key_id"], meta["team_id"]


def apns_jwt(server: Server, key: bytes | None = None, iat: int | None = None, kid: str | None = None,
             iss: str | None = None) -> str:
    own_key, key_id, team_id = apns_credentials(server)
    return jwt.encode({"iss": iss or team_id, "iat": int(time.time()) if iat is None else iat},
                      key or own_key, algorithm="ES256", headers={"kid": kid or key_id})


def apns_push(server: Server, token: str | None = None, provider_token: str | None = None,
              client: httpx.Client | None = None, body: bytes | None = None, **headers: str) -> httpx.Response:
    token = token or secrets.token_hex(32)
    h = {"authorization": f"bearer {provider_token or apns_jwt(server)}", "apns-topic": "com.example.social",
         "apns-push-type": "alert", "apns-priority": "10"}
    h.update({k.replace("_", "-"): v for k, v in headers.items()})
    h = {k: v for k, v in h.items() if v is not None}
    payload = body if body is not None else json.dumps({"aps": {"alert": {"title": "Hi", "body": "there"}}}).encode()
    return (client or server.h2).post(f"{server.origin}/3/device/{token}", content=payload, headers=h)


def test_apns_accepts_a_valid_notification_over_http2(server):
    token = secrets.token_hex(32)
    apns_id = str(uuid.uuid4())
    r = apns_push(server, token, apns_id=apns_id, apns_collapse_id="c" * 64, apns_expiration="0")
    assert r.status_code == 200, r.text
    assert r.http_version == "HTTP/2"
    assert r.headers["apns-id"] == apns_id
    assert r.content == b""
    [got] = server.received()
    assert got["provider"] == "apns" and got["token"] == token and got["http_version"] == "2"
    assert got["payload"] == {"aps": {"alert": {"title": "Hi", "body": "there"}}}
    assert got["headers"]["apns-topic"] == "com.example.social"
    assert got["headers"]["apns-id"] == apns_id
    assert "authorization" not in got["headers"]
    assert server.rejected() == []
    # Without apns-id the server makes one.
    r = apns_push(server, token)
    assert r.status_code == 200 and uuid.UUID(r.headers["apns-id"])
    stats = server.control("GET", "stats")
    assert stats["requests"]["apns"] == 2
    assert stats["apns_tokens_seen"] == 2  # two JWTs (ES256 signatures differ even with one iat)


def test_apns_counts_distinct_provider_tokens(server):
    provider_token = apns_jwt(server)
    for _ in range(3):
        assert apns_push(server, provider_token=provider_token).status_code == 200
    assert server.control("GET", "stats")["apns_tokens_seen"] == 1


def test_apns_refuses_a_token_signed_by_another_key(server):
    other = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    r = apns_push(server, provider_token=apns_jwt(server, key=other))
    assert r.status_code == 403
    assert r.json() == {"reason": "InvalidProviderToken"}
    [rej] = server.rejected()
    assert rej["provider"] == "apns" and rej["status"] == 403 and rej["reason"].startswith("InvalidProviderToken")
    assert server.received() == []


def test_apns_refuses_a_token_two_hours_old(server):
    r = apns_push(server, provider_token=apns_jwt(server, iat=int(time.time()) - 7200))
    assert (r.status_code, r.json()) == (403, {"reason": "ExpiredProviderToken"})
    assert [x["reason"].split(":")[0] for x in server.rejected()] == ["ExpiredProviderToken"]


def test_apns_refuses_http1(server):
    r = apns_push(server, client=server.h1)
    assert r.http_version == "HTTP/1.1"
    assert r.status_code == 505
    [rej] = server.rejected()
    assert rej["status"] == 505 and "HTTP/2" in rej["reason"]
    assert server.received() == []


@pytest.mark.parametrize("change, status, reason", [
    ({"authorization": None}, 403, "MissingProviderToken"),
    ({"kid": "WRONGKEYID"}, 403, "InvalidProviderToken"),
    ({"iss": "WRONGTEAM0"}, 403, "InvalidProviderToken"),
    ({"apns_topic": None}, 400, "MissingTopic"),
    ({"apns_push_type": None}, 400, "InvalidPushType"),
    ({"apns_push_type": "banner"}, 400, "InvalidPushType"),
    ({"apns_push_type": "voip"}, 400, "DeviceTokenNotForTopic"),
    ({"apns_priority": "7"}, 400, "BadPriority"),
    ({"apns_push_type": "background", "apns_priority": "10"}, 400, "BadPriority"),
    ({"apns_expiration": "tomorrow"}, 400, "BadExpirationDate"),
    ({"apns_collapse_id": "c" * 65}, 400, "BadCollapseId"),
    ({"apns_id": "not-a-uuid"}, 400, "BadMessageId"),
    ({"token": "abc"}, 400, "BadDeviceToken"),
    ({"token": "zz" * 32}, 400, "BadDeviceToken"),
    ({"body": b""}, 400, "PayloadEmpty"),
    ({"body": b"{not json"}, 400, "BadPayload"),
    ({"body": b'{"alert": "no aps"}'}, 400, "BadPayload"),
    ({"body": json.dumps({"aps": {}, "x": "y" * 4090}).encode()}, 413, "PayloadTooLarge"),
])
def test_apns_refuses_what_apple_refuses(server, change, status, reason):
    change = dict(change)
    kwargs: dict = {}
    if "kid" in change or "iss" in change:
        kwargs["provider_token"] = apns_jwt(server, kid=change.pop("kid", None), iss=change.pop("iss", None))
    if "token" in change:
        kwargs["token"] = change.pop("token")
    if "body" in change:
        kwargs["body"] = change.pop("body")
    if "authorization" in change:
        change.pop("authorization")
        r = server.h2.post(f"{server.origin}/3/device/{secrets.token_hex(32)}", content=b'{"aps":{}}',
                           headers={"apns-topic": "com.example.social", "apns-push-type": "alert"})
    else:
        r = apns_push(server, **kwargs, **change)
    assert r.status_code == status, r.text
    assert r.json()["reason"] == reason
    assert "apns-id" in r.headers
    [rej] = server.rejected()
    assert rej["provider"] == "apns" and rej["status"] == status and rej["reason"].startswith(reason)
    assert server.received() == []


def test_apns_voip_with_its_topic_and_background_with_priority_5_are_accepted(server):
    assert apns_push(server, apns_push_type="voip", apns_topic="com.example.social.voip").status_code == 200
    assert apns_push(server, apns_push_type="background", apns_priority="5",
                     body=b'{"aps":{"content-available":1}}').status_code == 200
    assert server.rejected() == []


def test_apns_scripted_unregistered(server):
    token = secrets.token_hex(32)
    server.control("POST", "script", {"provider": "apns", "token": token, "status": 410, "reason": "Unregistered"})
    before = int(time.time() * 1000)
    r = apns_push(server, token)
    assert r.status_code == 410
    body = r.json()
    assert body["reason"] == "Unregistered"
    assert isinstance(body["timestamp"], int) and before <= body["timestamp"] <= int(time.time() * 1000)
    [scripted] = server.control("GET", "scripted")
    assert scripted["token"] == token and scripted["status"] == 410 and scripted["answer"] == body
    assert server.received() == [] and server.rejected() == []
    # times defaults to 1: the next one is delivered; another token was never affected.
    assert apns_push(server, token).status_code == 200
    assert len(server.received()) == 1


def test_apns_scripted_retry_after_and_until_reset(server):
    server.control("POST", "script", {"provider": "apns", "token": "*", "status": 429,
                                      "reason": "TooManyRequests", "retry_after": 7, "times": -1})
    for _ in range(3):
        r = apns_push(server)
        assert (r.status_code, r.json(), r.headers["retry-after"]) == (429, {"reason": "TooManyRequests"}, "7")
    server.control("POST", "reset")
    assert apns_push(server).status_code == 200


def test_delay_script_answers_slowly(server):
    server.control("POST", "script", {"provider": "apns", "delay_ms": 600})
    start = time.monotonic()
    assert apns_push(server).status_code == 200
    assert time.monotonic() - start >= 0.6
    server.control("POST", "reset")
    start = time.monotonic()
    assert apns_push(server).status_code == 200
    assert time.monotonic() - start < 0.6


# ---- FCM -----------------------------------------------------------------------------------------


def fcm_session(server: Server) -> requests.Session:
    session = requests.Session()
    # Without this, REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE from the environment replace session.verify.
    session.trust_env = False
    session.verify = server.ca
    return session


def fcm_credentials(server: Server, info: dict | None = None) -> service_account.Credentials:
    if info is None:
        return service_account.Credentials.from_service_account_file(
            os.path.join(server.dir, "fcm-service-account.json"), scopes=[FCM_SCOPE])
    return service_account.Credentials.from_service_account_info(info, scopes=[FCM_SCOPE])


def fcm_send(server: Server, bearer: str, message: dict, project: str = "fake-project") -> requests.Response:
    return fcm_session(server).post(
        f"{server.origin}/v1/projects/{project}/messages:send",
        headers={"authorization": f"Bearer {bearer}"}, json={"message": message}, timeout=10)


def test_fcm_token_from_google_auth_then_send(server):
    info = json.load(open(os.path.join(server.dir, "fcm-service-account.json")))
    assert info["type"] == "service_account" and info["project_id"] == "fake-project"
    assert info["token_uri"] == f"{server.origin}/token"
    credentials = fcm_credentials(server)
    credentials.refresh(google.auth.transport.requests.Request(fcm_session(server)))
    assert credentials.token and credentials.valid
    assert server.control("GET", "stats")["fcm_tokens_issued"] == 1

    # google-auth's AuthorizedSession sends the bearer itself.
    authed = google.auth.transport.requests.AuthorizedSession(
        credentials, auth_request=google.auth.transport.requests.Request(fcm_session(server)))
    authed.trust_env = False
    authed.verify = server.ca
    message = {"token": "device-token-1", "notification": {"title": "Hi", "body": "there"},
               "data": {"kind": "friend_request"}, "android": {"priority": "high", "ttl": "3600s"},
               "apns": {"headers": {"apns-priority": "10"}, "payload": {"aps": {"sound": "default"}}}}
    r = authed.post(f"{server.origin}/v1/projects/fake-project/messages:send", json={"message": message}, timeout=10)
    assert r.status_code == 200, r.text
    assert r.json()["name"].startswith("projects/fake-project/messages/")
    [got] = server.received()
    assert got["provider"] == "fcm" and got["token"] == "device-token-1"
    assert got["payload"] == {"message": message}
    assert "authorization" not in got["headers"]
    assert server.rejected() == []
    assert server.control("GET", "stats")["requests"] == {"apns": 0, "fcm": 1, "webpush": 0, "token": 1}


def test_fcm_refuses_a_made_up_bearer(server):
    r = fcm_send(server, "ya29.made-up", {"token": "device-token-1"})
    assert r.status_code == 401
    assert r.json()["error"]["status"] == "UNAUTHENTICATED" and r.json()["error"]["code"] == 401
    [rej] = server.rejected()
    assert rej["provider"] == "fcm" and rej["status"] == 401


def fresh_token(server: Server) -> str:
    credentials = fcm_credentials(server)
    credentials.refresh(google.auth.transport.requests.Request(fcm_session(server)))
    return credentials.token


def test_fcm_scripted_unregistered(server):
    bearer = fresh_token(server)
    server.control("POST", "script", {"provider": "fcm", "token": "gone-token", "reason": "UNREGISTERED"})
    r = fcm_send(server, bearer, {"token": "gone-token", "data": {"a": "b"}})
    assert r.status_code == 404
    error = r.json()["error"]
    assert error["code"] == 404 and error["status"] == "NOT_FOUND"
    assert error["details"] == [{"@type": "type.googleapis.com/google.firebase.fcm.v1.FcmError",
                                 "errorCode": "UNREGISTERED"}]
    assert server.received() == [] and server.rejected() == []
    assert [s["status"] for s in server.control("GET", "scripted")] == [404]


@pytest.mark.parametrize("reason, status, rpc", [
    ("QUOTA_EXCEEDED", 429, "RESOURCE_EXHAUSTED"), ("UNAVAILABLE", 503, "UNAVAILABLE"),
    ("INTERNAL", 500, "INTERNAL"),
])
def test_fcm_scripted_transient_errors(server, reason, status, rpc):
    bearer = fresh_token(server)
    server.control("POST", "script", {"provider": "fcm", "token": "*", "reason": reason, "retry_after": 3})
    r = fcm_send(server, bearer, {"token": "t1"})
    assert (r.status_code, r.json()["error"]["status"], r.headers["retry-after"]) == (status, rpc, "3")
    assert r.json()["error"]["details"][0]["errorCode"] == reason


def test_fcm_refuses_another_project_and_bad_messages(server):
    bearer = fresh_token(server)
    r = fcm_send(server, bearer, {"token": "t1"}, project="other-project")
    assert r.status_code == 403 and r.json()["error"]["details"][0]["errorCode"] == "SENDER_ID_MISMATCH"
    for message in ({"topic": "news"}, {"token": "t1", "topic": "news"}, {"token": "t1", "data": {"n": 1}},
                    {"token": "t1", "data": {"from": "x"}}, {"token": "t1", "bogus": 1},
                    {"token": "t1", "android": {"ttl": "1 hour"}}):
        r = fcm_send(server, bearer, message)
        assert r.status_code == 400, message
        assert r.json()["error"]["status"] == "INVALID_ARGUMENT"
        assert r.json()["error"]["details"][0]["errorCode"] == "INVALID_ARGUMENT"
    assert len(server.rejected()) == 7 and server.received() == []


def test_fcm_token_endpoint_refuses_an_assertion_signed_by_another_key(server):
    info = json.load(open(os.path.join(server.dir, "fcm-service-account.json")))
    info["private_key"] = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode()
    with pytest.raises(RefreshError) as failure:
        fcm_credentials(server, info).refresh(google.auth.transport.requests.Request(fcm_session(server)))
    assert "invalid_grant" in str(failure.value)
    [rej] = server.rejected()
    assert rej["provider"] == "token" and rej["status"] == 400 and rej["reason"].startswith("invalid_grant")
    assert server.control("GET", "stats")["fcm_tokens_issued"] == 0


def test_fcm_expired_tokens_are_refused(server):
    bearer = fresh_token(server)
    assert fcm_send(server, bearer, {"token": "t1"}).status_code == 200
    server.control("POST", "reset")  # keeps issued tokens
    assert fcm_send(server, bearer, {"token": "t1"}).status_code == 200
    server.control("POST", "fcm/expire-tokens")
    assert fcm_send(server, bearer, {"token": "t1"}).status_code == 401


# ---- Web Push ------------------------------------------------------------------------------------


def new_subscription(server: Server) -> dict:
    sub = server.control("POST", "webpush/subscriptions")
    assert sub["endpoint"] == f"{server.origin}/push/{sub['id']}"
    return sub


def subscription_info(sub: dict) -> dict:
    return {"endpoint": sub["endpoint"], "keys": {"p256dh": sub["p256dh"], "auth": sub["auth"]}}


@pytest.fixture
def vapid_key_file(tmp_path) -> str:
    path = tmp_path / "vapid.pem"
    path.write_bytes(ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return str(path)


def test_webpush_delivery_through_pywebpush(server, vapid_key_file):
    sub = new_subscription(server)
    plaintext = json.dumps({"type": "friend_request", "from": "alice"})
    r = webpush(subscription_info(sub), plaintext, vapid_private_key=vapid_key_file,
                vapid_claims={"sub": "mailto:t@example.com"}, ttl=60,
                headers={"Urgency": "high", "Topic": "friend_requests"}, requests_session=fcm_session(server))
    assert r.status_code == 201, r.text
    assert r.headers["location"].startswith(f"{server.origin}/message/")
    [got] = server.received()
    assert got["provider"] == "webpush" and got["token"] == sub["id"]
    assert got["payload"] == json.loads(plaintext)
    assert got["headers"]["ttl"] == "60" and got["headers"]["urgency"] == "high"
    assert got["headers"]["content-encoding"] == "aes128gcm"
    assert server.rejected() == []


def test_webpush_plain_text_payload(server, vapid_key_file):
    sub = new_subscription(server)
    webpush(subscription_info(sub), "not json", vapid_private_key=vapid_key_file,
            vapid_claims={"sub": "https://example.com"}, requests_session=fcm_session(server))
    assert server.received()[0]["payload"] == {"text": "not json"}


def vapid_headers(server: Server, key_file: str, aud: str | None = None) -> dict:
    return Vapid.from_file(key_file).sign({"sub": "mailto:t@example.com", "aud": aud or server.origin})


def encrypt_for(sub: dict, plaintext: bytes) -> bytes:
    receiver = ec.EllipticCurvePublicKey.from_encoded_point(
        ec.SECP256R1(), http_ece_b64(sub["p256dh"]))
    sender = ec.generate_private_key(ec.SECP256R1())
    return http_ece.encrypt(plaintext, salt=os.urandom(16), private_key=sender,
                            dh=receiver.public_bytes(serialization.Encoding.X962,
                                                     serialization.PublicFormat.UncompressedPoint),
                            auth_secret=http_ece_b64(sub["auth"]), version="aes128gcm")


def http_ece_b64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def test_webpush_refuses_a_body_encrypted_for_another_subscription(server, vapid_key_file):
    mine, other = new_subscription(server), new_subscription(server)
    headers = {**vapid_headers(server, vapid_key_file), "TTL": "30", "Content-Encoding": "aes128gcm"}
    r = server.h2.post(mine["endpoint"], content=encrypt_for(other, b'{"x":1}'), headers=headers)
    assert r.status_code == 400, r.text
    # The same body to the subscription it was made for is delivered (the check can pass).
    r = server.h2.post(other["endpoint"], content=encrypt_for(other, b'{"x":1}'), headers=headers)
    assert r.status_code == 201
    [rej] = server.rejected()
    assert rej["provider"] == "webpush" and rej["status"] == 400 and "decrypt" in rej["reason"]
    assert [x["token"] for x in server.received()] == [other["id"]]


def test_webpush_refuses_missing_ttl_and_bad_headers(server, vapid_key_file):
    sub = new_subscription(server)
    body = encrypt_for(sub, b"{}")
    base = {**vapid_headers(server, vapid_key_file), "TTL": "30", "Content-Encoding": "aes128gcm"}
    cases = [
        ({"TTL": None}, 400), ({"TTL": "-1"}, 400), ({"Urgency": "urgent"}, 400),
        ({"Topic": "a" * 33}, 400), ({"Topic": "no spaces"}, 400), ({"Content-Encoding": "aesgcm"}, 415),
        ({"Content-Encoding": None}, 415), ({"Authorization": None}, 401),
    ]
    for change, status in cases:
        headers = {k: v for k, v in {**base, **change}.items() if v is not None}
        r = server.h1.post(sub["endpoint"], content=body, headers=headers)
        assert r.status_code == status, (change, r.status_code, r.text)
    assert [x["status"] for x in server.rejected()] == [status for _, status in cases]
    assert server.received() == []


def test_webpush_refuses_a_vapid_token_for_another_audience(server, vapid_key_file):
    sub = new_subscription(server)
    with pytest.raises(WebPushException) as failure:
        webpush(subscription_info(sub), "hi", vapid_private_key=vapid_key_file,
                vapid_claims={"sub": "mailto:t@example.com", "aud": "https://push.example.net"},
                requests_session=fcm_session(server))
    assert failure.value.response.status_code in (401, 403)
    [rej] = server.rejected()
    assert rej["provider"] == "webpush" and "aud" in rej["reason"]
    assert server.received() == []


def test_webpush_unknown_or_deleted_subscription_is_gone(server, vapid_key_file):
    sub = new_subscription(server)
    r = server.h1.delete(f"{server.origin}/control/webpush/subscriptions/{sub['id']}")
    assert r.status_code == 204
    with pytest.raises(WebPushException) as failure:
        webpush(subscription_info(sub), "hi", vapid_private_key=vapid_key_file,
                vapid_claims={"sub": "mailto:t@example.com"}, requests_session=fcm_session(server))
    assert failure.value.response.status_code == 410
    assert [x["status"] for x in server.rejected()] == [410]


def test_webpush_scripted_gone(server, vapid_key_file):
    sub = new_subscription(server)
    server.control("POST", "script", {"provider": "webpush", "token": sub["id"], "status": 410})
    with pytest.raises(WebPushException) as failure:
        webpush(subscription_info(sub), "hi", vapid_private_key=vapid_key_file,
                vapid_claims={"sub": "mailto:t@example.com"}, requests_session=fcm_session(server))
    assert failure.value.response.status_code == 410
    assert server.rejected() == [] and server.received() == []
    assert server.control("GET", "scripted")[0]["payload"] == {"text": "hi"}


# ---- control API and lifetime --------------------------------------------------------------------


def test_unknown_paths_are_recorded_and_bad_scripts_refused(server):
    assert server.h1.get(f"{server.origin}/nothing-here").status_code == 404
    assert [x["provider"] for x in server.rejected()] == ["unknown"]
    for bad in ({"provider": "sms", "status": 500}, {"provider": "apns"}, {"provider": "apns", "status": 99},
                {"provider": "fcm", "reason": "NOT_A_CODE"}, {"provider": "apns", "status": 410, "times": 0},
                {"provider": "apns", "status": 410, "color": "red"}):
        assert server.h1.post(f"{server.origin}/control/script", json=bad).status_code == 400, bad


def test_restart_reuses_credentials_and_moves_token_uri(tmp_path):
    first = Server(str(tmp_path))
    before = {name: open(tmp_path / name, "rb").read()
              for name in ("ca.pem", "server.pem", "apns-key.p8", "apns.json", "vapid-private.pem")}
    info_before = json.load(open(tmp_path / "fcm-service-account.json"))
    sub = first.control("POST", "webpush/subscriptions")
    assert first.stop() == 0
    second = Server(str(tmp_path))
    try:
        for name, data in before.items():
            assert open(tmp_path / name, "rb").read() == data, name
        info_after = json.load(open(tmp_path / "fcm-service-account.json"))
        assert info_after["private_key"] == info_before["private_key"]
        assert info_after["token_uri"] == f"https://127.0.0.1:{second.port}/token"
        # The TLS certificate made by the first run is trusted by the second's clients.
        assert second.control("GET", "stats")["requests"]["apns"] == 0
        # Subscriptions are kept: the old id and keys still work on the new port.
        key = tmp_path / "vapid-test.pem"
        key.write_bytes(ec.generate_private_key(ec.SECP256R1()).private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
        moved = dict(sub, endpoint=f"{second.origin}/push/{sub['id']}")
        r = webpush(subscription_info(moved), "kept", vapid_private_key=str(key),
                    vapid_claims={"sub": "mailto:t@example.com"}, requests_session=fcm_session(second))
        assert r.status_code == 201
        assert second.received()[0]["payload"] == {"text": "kept"}
    finally:
        assert second.stop() == 0


def test_exit_after(tmp_path):
    start = time.monotonic()
    s = Server(str(tmp_path), ("--exit-after", "1"))
    assert s.proc.wait(timeout=10) == 0
    assert time.monotonic() - start < 10
    s.stop()
