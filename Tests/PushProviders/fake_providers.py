#!/usr/bin/env python3
"""Local stand-ins for APNs, FCM HTTP v1 and Web Push, for tests that cannot reach the real ones.

One TLS port (hypercorn, ALPN h2 and http/1.1, 127.0.0.1 only) serves:
  POST /3/device/<hex token>                   APNs provider API (token-based auth, HTTP/2 only)
  POST /token                                  Google OAuth 2.0 token endpoint (service-account JWT bearer)
  POST /v1/projects/<project>/messages:send    FCM HTTP v1
  POST /push/<subscription id>                 a Web Push service (RFC 8030, 8291, 8292)
  /control/...                                 JSON control API for the tests
Every provider request is checked as the provider documents it; one that fails is answered as the
provider would and recorded in /control/rejected with the reason. README.md beside this file says
exactly what is checked and answered.

Usage: python fake_providers.py --dir DIR [--port 0] [--exit-after 1800]
Prints `READY {"port": N}` on stdout once listening and writes DIR/ready.json. Exits by itself when
its parent process dies, when its stdin (if a pipe or socket) reaches end of file, or after
--exit-after seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import datetime
import http
import ipaddress
import json
import logging
import os
import re
import secrets
import signal
import socket
import stat
import struct
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

import http_ece
import jwt
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from hypercorn.asyncio import serve
from hypercorn.config import Config

# ---- limits and vocabularies ---------------------------------------------------------------------

APNS_PUSH_TYPES = {
    "alert", "background", "voip", "complication", "fileprovider", "mdm", "location",
    "liveactivity", "pushtotalk",
}
# Apple: for these push types the apns-topic is the bundle ID with this suffix.
APNS_TOPIC_SUFFIX = {
    "voip": ".voip",
    "complication": ".complication",
    "fileprovider": ".pushkit.fileprovider",
    "liveactivity": ".push-type.liveactivity",
    "location": ".location-query",
    "pushtotalk": ".voip-ptt",
}
APNS_MAX_PAYLOAD = 4096
APNS_MAX_VOIP_PAYLOAD = 5120
APNS_TOKEN_MAX_AGE = 3600
CLOCK_SKEW = 60
APNS_DEFAULT_REASON = {
    400: "BadDeviceToken", 403: "Forbidden", 404: "BadPath", 405: "MethodNotAllowed",
    410: "Unregistered", 413: "PayloadTooLarge", 429: "TooManyRequests",
    500: "InternalServerError", 503: "ServiceUnavailable",
}
UUID_RE = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
APNS_TOKEN_RE = re.compile(r"[0-9a-fA-F]{64,200}")
TOPIC_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9.\-_]*")

FCM_SCOPE = "https://www.googleapis.com/auth/firebase.messaging"
CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
# Google documents the assertion's aud for token requests as always this value (google-auth signs
# it whatever token_uri says); the service account's own token_uri is accepted too.
GOOGLE_TOKEN_AUDIENCE = "https://oauth2.googleapis.com/token"
JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
FCM_TOKEN_LIFETIME = 3599
FCM_MAX_PAYLOAD = 4096
# FcmError.errorCode → (HTTP status, google.rpc status, message), as FCM documents them.
FCM_ERRORS = {
    "UNSPECIFIED_ERROR": (500, "INTERNAL", "Internal error encountered."),
    "INVALID_ARGUMENT": (400, "INVALID_ARGUMENT", "Request contains an invalid argument."),
    "UNREGISTERED": (404, "NOT_FOUND", "Requested entity was not found."),
    "SENDER_ID_MISMATCH": (403, "PERMISSION_DENIED", "SenderId mismatch"),
    "QUOTA_EXCEEDED": (429, "RESOURCE_EXHAUSTED", "Quota exceeded for the message rate."),
    "UNAVAILABLE": (503, "UNAVAILABLE", "The service is currently unavailable."),
    "INTERNAL": (500, "INTERNAL", "Internal error encountered."),
    "THIRD_PARTY_AUTH_ERROR": (401, "UNAUTHENTICATED", "Auth error from APNS or Web Push Service"),
}
FCM_CODE_FOR_STATUS = {
    400: "INVALID_ARGUMENT", 401: "THIRD_PARTY_AUTH_ERROR", 403: "SENDER_ID_MISMATCH",
    404: "UNREGISTERED", 429: "QUOTA_EXCEEDED", 500: "INTERNAL", 503: "UNAVAILABLE",
}
GOOGLE_STATUS = {
    400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
    409: "ABORTED", 429: "RESOURCE_EXHAUSTED", 499: "CANCELLED", 500: "INTERNAL",
    501: "UNIMPLEMENTED", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED",
}
GOOGLE_UNAUTHENTICATED = (
    "Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie "
    "or other valid authentication credential. See "
    "https://developers.google.com/identity/sign-in/web/devconsole-project."
)
FCM_MESSAGE_FIELDS = {
    "name", "data", "notification", "android", "webpush", "apns", "fcm_options", "fcmOptions",
    "token", "topic", "condition",
}
FCM_NOTIFICATION_FIELDS = {"title", "body", "image"}
FCM_RESERVED_DATA_KEYS = {"from", "notification", "message_type"}
DURATION_RE = re.compile(r"\d{1,12}(\.\d{1,9})?s")
FCM_TOKEN_RE = re.compile(r"[A-Za-z0-9_\-:.]{1,4096}")

WEBPUSH_MAX_BODY = 4096
WEBPUSH_URGENCIES = {"very-low", "low", "normal", "high"}
WEBPUSH_TOPIC_RE = re.compile(r"[A-Za-z0-9_\-]{1,32}")
VAPID_MAX_EXP = 24 * 3600

MAX_BODY = 1 << 20  # read at most this much of any request body; more is "too large"


def now_ms() -> int:
    return int(time.time() * 1000)


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64url_decode(text: str) -> bytes:
    """Base64url, with or without padding; anything else (e.g. '+' or '/') raises ValueError."""
    if not re.fullmatch(r"[A-Za-z0-9_\-]*={0,2}", text):
        raise ValueError("not base64url")
    stripped = text.rstrip("=")
    return base64.urlsafe_b64decode(stripped + "=" * (-len(stripped) % 4))


def write_atomic(path: str, data: bytes, private: bool = False) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def pkcs8_pem(key: Any) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def uncompressed_point(public_key: ec.EllipticCurvePublicKey) -> bytes:
    return public_key.public_bytes(
        serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
    )


# ---- credentials on disk -------------------------------------------------------------------------


class Credentials:
    """Creates what is missing in DIR and loads the rest, so a restart reuses the same keys."""

    def __init__(self, directory: str):
        self.dir = directory
        os.makedirs(directory, exist_ok=True)
        self.ca_path = self.path("ca.pem")
        self.ca_key_path = self.path("ca-key.pem")
        self.cert_path = self.path("server.pem")
        self.key_path = self.path("server-key.pem")
        self._ensure_tls()
        self._ensure_apns()
        self._ensure_vapid()
        self._load_or_make_service_account()

    def path(self, name: str) -> str:
        return os.path.join(self.dir, name)

    # TLS: a CA and a server certificate for 127.0.0.1 / localhost signed by it.
    def _ensure_tls(self) -> None:
        names = (self.ca_path, self.ca_key_path, self.cert_path, self.key_path)
        if all(os.path.exists(p) for p in names) and self._server_cert_usable():
            return
        if os.path.exists(self.ca_path) and os.path.exists(self.ca_key_path):
            ca_cert = x509.load_pem_x509_certificate(open(self.ca_path, "rb").read())
            ca_key = serialization.load_pem_private_key(open(self.ca_key_path, "rb").read(), None)
        else:
            ca_key = ec.generate_private_key(ec.SECP256R1())
            ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fake push providers test CA")])
            start = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(hours=1)
            ca_cert = (
                x509.CertificateBuilder()
                .subject_name(ca_name)
                .issuer_name(ca_name)
                .public_key(ca_key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(start)
                .not_valid_after(start + datetime.timedelta(days=3650))
                .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                .add_extension(
                    x509.KeyUsage(
                        digital_signature=True, content_commitment=False, key_encipherment=False,
                        data_encipherment=False, key_agreement=False, key_cert_sign=True,
                        crl_sign=True, encipher_only=False, decipher_only=False,
                    ),
                    critical=True,
                )
                .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
                .sign(ca_key, hashes.SHA256())
            )
            write_atomic(self.ca_key_path, pkcs8_pem(ca_key), private=True)
            write_atomic(self.ca_path, ca_cert.public_bytes(serialization.Encoding.PEM))
        key = ec.generate_private_key(ec.SECP256R1())
        start = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(hours=1)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(start + datetime.timedelta(days=825))
            .add_extension(
                x509.SubjectAlternativeName([
                    x509.DNSName("localhost"),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                ]),
                critical=False,
            )
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True, content_commitment=False, key_encipherment=False,
                    data_encipherment=False, key_agreement=False, key_cert_sign=False,
                    crl_sign=False, encipher_only=False, decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
            )
            .sign(ca_key, hashes.SHA256())
        )
        write_atomic(self.key_path, pkcs8_pem(key), private=True)
        write_atomic(self.cert_path, cert.public_bytes(serialization.Encoding.PEM))

    def _server_cert_usable(self) -> bool:
        try:
            cert = x509.load_pem_x509_certificate(open(self.cert_path, "rb").read())
        except ValueError:
            return False
        left = cert.not_valid_after_utc - datetime.datetime.now(datetime.timezone.utc)
        return left > datetime.timedelta(days=1)

    # APNs: an Apple-style .p8 (PKCS#8 EC P-256) and its key ID / team ID.
    def _ensure_apns(self) -> None:
        key_path, meta_path = self.path("apns-key.p8"), self.path("apns.json")
        if not os.path.exists(key_path):
            write_atomic(key_path, pkcs8_pem(ec.generate_private_key(ec.SECP256R1())), private=True)
        if not os.path.exists(meta_path):
            alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
            meta = {
                "key_id": "".join(secrets.choice(alphabet) for _ in range(10)),
                "team_id": "".join(secrets.choice(alphabet) for _ in range(10)),
            }
            write_atomic(meta_path, (json.dumps(meta, indent=2) + "\n").encode())
        key = serialization.load_pem_private_key(open(key_path, "rb").read(), None)
        if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name != "secp256r1":
            raise SystemExit(f"{key_path} is not an EC P-256 private key")
        self.apns_public_key = key.public_key()
        meta = json.load(open(meta_path))
        self.apns_key_id, self.apns_team_id = meta["key_id"], meta["team_id"]

    # Web Push: the application server's VAPID key (the Swift side signs with it; the server only
    # ever uses the k= key that a request carries).
    def _ensure_vapid(self) -> None:
        path = self.path("vapid-private.pem")
        if not os.path.exists(path):
            write_atomic(path, pkcs8_pem(ec.generate_private_key(ec.SECP256R1())), private=True)

    # FCM: Google's service-account JSON; the key is kept, token_uri follows the bound port.
    def _load_or_make_service_account(self) -> None:
        path = self.path("fcm-service-account.json")
        info = None
        if os.path.exists(path):
            try:
                info = json.load(open(path))
                key = serialization.load_pem_private_key(info["private_key"].encode(), None)
                if not isinstance(key, rsa.RSAPrivateKey):
                    info = None
            except (ValueError, KeyError, TypeError):
                info = None
        if info is None:
            key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
            info = {
                "type": "service_account",
                "project_id": "fake-project",
                "private_key_id": secrets.token_hex(20),
                "private_key": pkcs8_pem(key).decode(),
                "client_email": "fake-push@fake-project.iam.gserviceaccount.com",
                "client_id": str(secrets.randbelow(10**21 - 10**20) + 10**20),
                "token_uri": "",
                "universe_domain": "googleapis.com",
            }
        self.service_account = info
        self.sa_public_key = key.public_key()

    def write_service_account(self, port: int) -> None:
        self.service_account["token_uri"] = f"https://127.0.0.1:{port}/token"
        data = json.dumps(self.service_account, indent=2) + "\n"
        write_atomic(self.path("fcm-service-account.json"), data.encode(), private=True)


# ---- requests, answers, state --------------------------------------------------------------------


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: list[tuple[str, str]]
    body: bytes
    body_too_large: bool
    http_version: str

    def header(self, name: str) -> str | None:
        values = [v for n, v in self.headers if n == name]
        return ", ".join(values) if values else None

    def header_count(self, name: str) -> int:
        return sum(1 for n, _ in self.headers if n == name)

    def recorded_headers(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for name, value in self.headers:
            if name == "authorization":
                continue
            out[name] = f"{out[name]}, {value}" if name in out else value
        return out


@dataclass
class Answer:
    status: int
    body: Any = None  # dict/list → JSON; bytes → as is; None → empty
    headers: list[tuple[str, str]] = field(default_factory=list)

    def encoded(self) -> tuple[bytes, list[tuple[str, str]]]:
        headers = list(self.headers)
        if self.body is None:
            return b"", headers
        if isinstance(self.body, bytes):
            return self.body, headers
        headers.append(("content-type", "application/json; charset=UTF-8"))
        return json.dumps(self.body).encode(), headers


class Refusal(Exception):
    """A provider request that failed a check: answered with `answer`, recorded with `reason`."""

    def __init__(self, answer: Answer, reason: str):
        super().__init__(reason)
        self.answer, self.reason = answer, reason


@dataclass
class Script:
    provider: str
    token: str
    status: int | None
    reason: str | None
    retry_after: int | None
    delay_ms: int
    times: int


@dataclass
class Subscription:
    id: str
    private_key: ec.EllipticCurvePrivateKey
    auth: bytes
    application_server_key: bytes | None


class ControlError(Exception):
    pass


# ---- the providers -------------------------------------------------------------------------------


class FakeProviders:
    def __init__(self, creds: Credentials, port: int):
        self.creds = creds
        self.port = port
        self.origin = f"https://127.0.0.1:{port}"
        self.token_uri = f"{self.origin}/token"
        self.subscriptions: dict[str, Subscription] = {}
        self.subscriptions_path = creds.path("webpush-subscriptions.json")
        self._load_subscriptions()
        # Issued access tokens outlive reset (a client caches its token across test cases);
        # /control/fcm/expire-tokens is how a test expires them.
        self.fcm_tokens: dict[str, float] = {}  # access token → expiry (epoch s)
        self.reset()

    def reset(self) -> None:
        self.received: list[dict] = []
        self.rejected: list[dict] = []
        self.scripted: list[dict] = []
        self.scripts: list[Script] = []
        self.fcm_tokens_issued = 0
        self.apns_jwts: set[str] = set()
        self.requests = {"apns": 0, "fcm": 0, "webpush": 0, "token": 0}

    # -- dispatch --
    async def handle(self, req: Request) -> Answer:
        path = req.path
        if path == "/control" or path.startswith("/control/"):
            try:
                return self.control(req)
            except ControlError as e:
                return Answer(400, {"error": str(e)})
        if path.startswith("/3/"):
            provider, handler = "apns", self.apns
        elif path == "/token":
            provider, handler = "token", self.oauth_token
        elif path.startswith("/v1/"):
            provider, handler = "fcm", self.fcm_send
        elif path.startswith("/push/"):
            provider, handler = "webpush", self.webpush
        else:
            return self.record_rejection(
                "unknown", req, Refusal(Answer(404, {"error": "not found"}), f"no such endpoint: {req.method} {path}")
            )
        self.requests[provider] += 1
        try:
            return await handler(req)
        except Refusal as refusal:
            return self.record_rejection(provider, req, refusal)

    def record_rejection(self, provider: str, req: Request, refusal: Refusal) -> Answer:
        entry = {
            "provider": provider, "path": req.path, "status": refusal.answer.status,
            "reason": refusal.reason, "at": now_ms(),
        }
        self.rejected.append(entry)
        print(f"fake_providers: rejected {provider} {req.method} {req.path} HTTP/{req.http_version}: "
              f"{refusal.answer.status} {refusal.reason}", file=sys.stderr, flush=True)
        return refusal.answer

    def record_received(self, provider: str, token: str, req: Request, payload: Any) -> None:
        self.received.append({
            "provider": provider, "token": token, "headers": req.recorded_headers(),
            "payload": payload, "at": now_ms(), "http_version": req.http_version,
        })

    # -- scripts --
    def _matching_script(self, provider: str, token: str, want_status: bool) -> Script | None:
        for script in self.scripts:
            if script.provider != provider or (script.status is not None) != want_status:
                continue
            if script.token not in ("*", token) and not (
                provider == "apns" and script.token.lower() == token.lower()
            ):
                continue
            if script.times > 0:
                script.times -= 1
                if script.times == 0:
                    self.scripts.remove(script)
            return script
        return None

    async def delay(self, provider: str, token: str) -> None:
        # Delays (scripts without a status) stack with an answer script: both may apply.
        script = self._matching_script(provider, token, want_status=False)
        if script is not None and script.delay_ms > 0:
            await asyncio.sleep(script.delay_ms / 1000)

    async def scripted_answer(self, provider: str, token: str, req: Request, payload: Any,
                              build: Any) -> Answer | None:
        script = self._matching_script(provider, token, want_status=True)
        if script is None:
            return None
        if script.delay_ms > 0:
            await asyncio.sleep(script.delay_ms / 1000)
        answer = build(script)
        if script.retry_after is not None:
            answer.headers.append(("retry-after", str(script.retry_after)))
        self.scripted.append({
            "provider": provider, "token": token, "path": req.path, "status": answer.status,
            "reason": script.reason, "answer": answer.body, "headers": req.recorded_headers(),
            "payload": payload, "at": now_ms(), "http_version": req.http_version,
        })
        return answer

    # -- APNs --
    async def apns(self, req: Request) -> Answer:
        apns_id = req.header("apns-id")
        answer_id = apns_id if apns_id is not None and UUID_RE.fullmatch(apns_id) else str(uuid.uuid4())
        id_headers = [("apns-id", answer_id), ("apns-unique-id", str(uuid.uuid4()))]

        def refuse(status: int, reason: str, detail: str) -> Refusal:
            body: dict[str, Any] = {"reason": reason}
            if status == 410:
                body["timestamp"] = now_ms()
            return Refusal(Answer(status, body, [("apns-id", answer_id)]), f"{reason}: {detail}")

        token = req.path[len("/3/device/"):] if req.path.startswith("/3/device/") else ""
        await self.delay("apns", token)
        if req.http_version != "2":
            raise Refusal(
                Answer(505, {"reason": "HTTP2Required"}, [("apns-id", answer_id)]),
                f"HTTP2Required: APNs accepts only HTTP/2 and this request came over HTTP/{req.http_version}",
            )
        if not req.path.startswith("/3/device/"):
            raise refuse(404, "BadPath", f"path {req.path!r} is not /3/device/<token>")
        if req.method != "POST":
            raise refuse(405, "MethodNotAllowed", f"method {req.method}, only POST is supported")
        if token == "":
            raise refuse(400, "MissingDeviceToken", "no device token in the path")
        if not APNS_TOKEN_RE.fullmatch(token) or len(token) % 2:
            raise refuse(400, "BadDeviceToken", f"device token {token[:80]!r} is not 64..200 hex digits (whole bytes)")
        for name in ("authorization", "apns-topic", "apns-push-type", "apns-priority",
                     "apns-expiration", "apns-collapse-id", "apns-id"):
            if req.header_count(name) > 1:
                raise refuse(400, "DuplicateHeaders", f"header {name} repeated")

        # Provider token (JWT, ES256, signed with apns-key.p8).
        auth = req.header("authorization")
        if auth is None:
            raise refuse(403, "MissingProviderToken", "no authorization header")
        scheme, _, provider_token = auth.partition(" ")
        provider_token = provider_token.strip()
        if scheme.lower() != "bearer" or not provider_token:
            raise refuse(403, "MissingProviderToken", "authorization is not 'bearer <JWT>'")
        try:
            jwt_header = jwt.get_unverified_header(provider_token)
        except jwt.PyJWTError as e:
            raise refuse(403, "InvalidProviderToken", f"not a JWT ({e})") from None
        if jwt_header.get("alg") != "ES256":
            raise refuse(403, "InvalidProviderToken", f"JWT alg {jwt_header.get('alg')!r}, expected ES256")
        if jwt_header.get("kid") != self.creds.apns_key_id:
            raise refuse(403, "InvalidProviderToken",
                         f"JWT kid {jwt_header.get('kid')!r}, expected key_id {self.creds.apns_key_id!r}")
        try:
            claims = jwt.decode(
                provider_token, self.creds.apns_public_key, algorithms=["ES256"],
                options={"verify_exp": False, "verify_iat": False, "verify_nbf": False,
                         "verify_aud": False, "verify_iss": False, "verify_sub": False,
                         "verify_jti": False},
            )
        except jwt.InvalidSignatureError:
            raise refuse(403, "InvalidProviderToken", "ES256 signature does not verify with apns-key.p8") from None
        except jwt.PyJWTError as e:
            raise refuse(403, "InvalidProviderToken", f"JWT does not decode ({e})") from None
        if claims.get("iss") != self.creds.apns_team_id:
            raise refuse(403, "InvalidProviderToken",
                         f"JWT iss {claims.get('iss')!r}, expected team_id {self.creds.apns_team_id!r}")
        iat = claims.get("iat")
        if not isinstance(iat, int) or isinstance(iat, bool):
            raise refuse(403, "InvalidProviderToken", f"JWT iat {iat!r} is not an integer")
        now = time.time()
        if iat < now - APNS_TOKEN_MAX_AGE:
            raise refuse(403, "ExpiredProviderToken", f"JWT iat is {int(now - iat)} s old (more than {APNS_TOKEN_MAX_AGE})")
        if iat > now + CLOCK_SKEW:
            raise refuse(403, "ExpiredProviderToken", f"JWT iat is {int(iat - now)} s in the future")
        self.apns_jwts.add(provider_token)

        # Headers.
        topic = req.header("apns-topic")
        if topic is None:
            raise refuse(400, "MissingTopic", "no apns-topic header")
        if not TOPIC_RE.fullmatch(topic):
            raise refuse(400, "BadTopic", f"apns-topic {topic!r} is not a bundle identifier")
        push_type = req.header("apns-push-type")
        if push_type not in APNS_PUSH_TYPES:
            raise refuse(400, "InvalidPushType", f"apns-push-type {push_type!r} is not one of {sorted(APNS_PUSH_TYPES)}")
        suffix = APNS_TOPIC_SUFFIX.get(push_type)
        if suffix is not None and (not topic.endswith(suffix) or topic == suffix):
            raise refuse(400, "DeviceTokenNotForTopic",
                         f"apns-push-type {push_type} needs apns-topic <bundle ID>{suffix}, got {topic!r}")
        priority = req.header("apns-priority")
        if priority is not None and priority not in ("10", "5", "1"):
            raise refuse(400, "BadPriority", f"apns-priority {priority!r} is not 10, 5 or 1")
        if push_type == "background" and priority != "5":
            raise refuse(400, "BadPriority",
                         f"a background push must have apns-priority 5 (got {priority!r}; absent means 10)")
        expiration = req.header("apns-expiration")
        if expiration is not None and not re.fullmatch(r"\d{1,12}", expiration):
            raise refuse(400, "BadExpirationDate", f"apns-expiration {expiration!r} is not a UNIX time in seconds")
        collapse_id = req.header("apns-collapse-id")
        if collapse_id is not None and len(collapse_id.encode("utf-8", "surrogateescape")) > 64:
            raise refuse(400, "BadCollapseId", f"apns-collapse-id is {len(collapse_id.encode())} bytes (more than 64)")
        if apns_id is not None and not UUID_RE.fullmatch(apns_id):
            raise refuse(400, "BadMessageId", f"apns-id {apns_id!r} is not a canonical UUID")

        # Payload.
        limit = APNS_MAX_VOIP_PAYLOAD if push_type == "voip" else APNS_MAX_PAYLOAD
        if req.body_too_large or len(req.body) > limit:
            raise refuse(413, "PayloadTooLarge", f"payload is {len(req.body)} bytes (more than {limit})")
        if not req.body:
            raise refuse(400, "PayloadEmpty", "empty body")
        try:
            payload = json.loads(req.body)
        except (ValueError, UnicodeDecodeError) as e:
            raise refuse(400, "BadPayload", f"body is not JSON ({e})") from None
        if not isinstance(payload, dict) or not isinstance(payload.get("aps"), dict):
            raise refuse(400, "BadPayload", "body is not a JSON object with an \"aps\" dictionary")

        def build(script: Script) -> Answer:
            status = script.status or 400
            body: dict[str, Any] = {"reason": script.reason or APNS_DEFAULT_REASON.get(status, "InternalServerError")}
            if status == 410:
                body["timestamp"] = now_ms()
            return Answer(status, body, list(id_headers))

        answer = await self.scripted_answer("apns", token, req, payload, build)
        if answer is not None:
            return answer
        self.record_received("apns", token, req, payload)
        return Answer(200, None, id_headers)

    # -- Google OAuth 2.0 token endpoint --
    async def oauth_token(self, req: Request) -> Answer:
        await self.delay("token", "")

        def refuse(status: int, error: str, description: str) -> Refusal:
            return Refusal(Answer(status, {"error": error, "error_description": description}),
                           f"{error}: {description}")

        if req.method != "POST":
            raise refuse(405, "invalid_request", f"method {req.method}, only POST")
        content_type = (req.header("content-type") or "").split(";")[0].strip().lower()
        if content_type != "application/x-www-form-urlencoded":
            raise refuse(400, "invalid_request",
                         f"content-type {content_type!r}, expected application/x-www-form-urlencoded")
        try:
            pairs = parse_qsl(req.body.decode("utf-8"), keep_blank_values=True, strict_parsing=True)
        except (ValueError, UnicodeDecodeError):
            raise refuse(400, "invalid_request", "body is not a form") from None
        form: dict[str, str] = {}
        for name, value in pairs:
            if name in form:
                raise refuse(400, "invalid_request", f"parameter {name} repeated")
            form[name] = value
        grant_type = form.get("grant_type")
        if grant_type != JWT_BEARER:
            raise refuse(400, "unsupported_grant_type", f"Invalid grant_type: {grant_type or ''}")
        assertion = form.get("assertion")
        if not assertion:
            raise refuse(400, "invalid_request", "Missing required parameter: assertion")
        sa = self.creds.service_account
        try:
            header = jwt.get_unverified_header(assertion)
        except jwt.PyJWTError as e:
            raise refuse(400, "invalid_grant", f"Invalid JWT: not a JWT ({e})") from None
        if header.get("alg") != "RS256":
            raise refuse(400, "invalid_grant", f"Invalid JWT: alg {header.get('alg')!r}, expected RS256")
        if "kid" in header and header["kid"] != sa["private_key_id"]:
            raise refuse(400, "invalid_grant", f"Invalid JWT Signature: kid {header['kid']!r} is not private_key_id")
        try:
            claims = jwt.decode(
                assertion, self.creds.sa_public_key, algorithms=["RS256"],
                options={"verify_exp": False, "verify_iat": False, "verify_nbf": False,
                         "verify_aud": False, "verify_iss": False, "verify_sub": False,
                         "verify_jti": False},
            )
        except jwt.InvalidSignatureError:
            raise refuse(400, "invalid_grant", "Invalid JWT Signature.") from None
        except jwt.PyJWTError as e:
            raise refuse(400, "invalid_grant", f"Invalid JWT: {e}") from None
        if claims.get("iss") != sa["client_email"]:
            raise refuse(400, "invalid_grant", f"Invalid JWT: iss {claims.get('iss')!r} is not client_email")
        if claims.get("aud") not in (self.token_uri, GOOGLE_TOKEN_AUDIENCE):
            raise refuse(400, "invalid_grant",
                         f"Invalid JWT: aud {claims.get('aud')!r} is neither {self.token_uri} nor {GOOGLE_TOKEN_AUDIENCE}")
        iat, exp = claims.get("iat"), claims.get("exp")
        now = time.time()
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (iat, exp)):
            raise refuse(400, "invalid_grant", f"Invalid JWT: iat {iat!r} / exp {exp!r} are not integers")
        short_lived = ("Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable "
                       "timeframe. Check your iat and exp values in the JWT claim.")
        if exp <= iat or exp - iat > 3600 or iat > now + CLOCK_SKEW or exp < now - CLOCK_SKEW:
            raise refuse(400, "invalid_grant", f"{short_lived} (iat {iat}, exp {exp}, now {int(now)})")
        scope = claims.get("scope")
        scopes = scope.split() if isinstance(scope, str) else []
        if FCM_SCOPE not in scopes and CLOUD_PLATFORM_SCOPE not in scopes:
            raise refuse(400, "invalid_scope",
                         f"Invalid OAuth scope or ID token audience provided (scope {scope!r} lacks {FCM_SCOPE}).")

        def build(script: Script) -> Answer:
            error = script.reason or ("invalid_grant" if (script.status or 400) < 500 else "internal_failure")
            return Answer(script.status or 400, {"error": error, "error_description": "scripted answer"})

        answer = await self.scripted_answer("token", "", req, claims, build)
        if answer is not None:
            return answer
        access_token = "ya29.fake-" + secrets.token_urlsafe(48)
        self.fcm_tokens[access_token] = time.time() + FCM_TOKEN_LIFETIME
        self.fcm_tokens_issued += 1
        return Answer(200, {"access_token": access_token, "expires_in": FCM_TOKEN_LIFETIME,
                            "token_type": "Bearer"},
                      [("cache-control", "no-cache, no-store, max-age=0, must-revalidate")])

    # -- FCM HTTP v1 --
    async def fcm_send(self, req: Request) -> Answer:
        def refuse(status: int, message: str, error_code: str | None = None,
                   violation: tuple[str, str] | None = None) -> Refusal:
            details = []
            if error_code is not None:
                details.append({"@type": "type.googleapis.com/google.firebase.fcm.v1.FcmError",
                                "errorCode": error_code})
            if violation is not None:
                details.append({"@type": "type.googleapis.com/google.rpc.BadRequest",
                                "fieldViolations": [{"field": violation[0], "description": violation[1]}]})
            error: dict[str, Any] = {"code": status, "message": message,
                                     "status": GOOGLE_STATUS.get(status, "UNKNOWN")}
            if details:
                error["details"] = details
            return Refusal(Answer(status, {"error": error}),
                           f"{error_code or error['status']}: {message}")

        m = re.fullmatch(r"/v1/projects/([^/]+)/messages:send", req.path)
        body_token = ""
        parsed: Any = None
        try:
            parsed = json.loads(req.body) if req.body else None
            if isinstance(parsed, dict) and isinstance(parsed.get("message"), dict):
                t = parsed["message"].get("token")
                body_token = t if isinstance(t, str) else ""
        except (ValueError, UnicodeDecodeError):
            pass
        await self.delay("fcm", body_token)
        if m is None:
            raise refuse(404, f"The requested URL {req.path} was not found on this server.")
        if req.method != "POST":
            raise refuse(404, f"Method {req.method} is not served at {req.path}; messages:send takes POST.")

        auth = req.header("authorization")
        scheme, _, bearer = (auth or "").partition(" ")
        bearer = bearer.strip()
        expiry = self.fcm_tokens.get(bearer) if scheme.lower() == "bearer" else None
        if expiry is None or expiry <= time.time():
            why = ("no authorization header" if auth is None else
                   "not 'Bearer <token>'" if scheme.lower() != "bearer" or not bearer else
                   "access token expired" if expiry is not None else "access token was not issued by /token")
            raise Refusal(
                Answer(401, {"error": {"code": 401, "message": GOOGLE_UNAUTHENTICATED, "status": "UNAUTHENTICATED"}},
                       [("www-authenticate", 'Bearer realm="https://accounts.google.com/", error="invalid_token"')]),
                f"UNAUTHENTICATED: {why}",
            )
        project = m.group(1)
        if project != self.creds.service_account["project_id"]:
            raise refuse(403, "SenderId mismatch", "SENDER_ID_MISMATCH")
        content_type = (req.header("content-type") or "").split(";")[0].strip().lower()
        if content_type != "application/json":
            raise refuse(400, f"Invalid content-type {content_type!r}: messages:send takes application/json",
                         "INVALID_ARGUMENT")
        if req.body_too_large:
            raise refuse(400, "Request payload size exceeds the limit", "INVALID_ARGUMENT")
        if not isinstance(parsed, dict):
            raise refuse(400, "Invalid JSON payload received: the body is not a JSON object.", "INVALID_ARGUMENT")
        problem = fcm_check_request(parsed)
        if problem is not None:
            field_name, description = problem
            raise refuse(400, description, "INVALID_ARGUMENT", (field_name, description))
        token = parsed["message"]["token"]

        def build(script: Script) -> Answer:
            code = script.reason or FCM_CODE_FOR_STATUS.get(script.status or 500, "UNSPECIFIED_ERROR")
            default_status, rpc_status, message = FCM_ERRORS.get(code, (500, "INTERNAL", code))
            status = script.status or default_status
            return Answer(status, {"error": {
                "code": status, "message": message, "status": GOOGLE_STATUS.get(status, rpc_status),
                "details": [{"@type": "type.googleapis.com/google.firebase.fcm.v1.FcmError", "errorCode": code}],
            }})

        answer = await self.scripted_answer("fcm", token, req, parsed, build)
        if answer is not None:
            return answer
        self.record_received("fcm", token, req, parsed)
        if parsed.get("validate_only", parsed.get("validateOnly")) is True:
            return Answer(200, {"name": f"projects/{project}/messages/fake_message_id"})
        message_id = f"0:{time.time_ns() // 1000}%{secrets.token_hex(8)}"
        return Answer(200, {"name": f"projects/{project}/messages/{message_id}"})

    # -- Web Push --
    async def webpush(self, req: Request) -> Answer:
        sub_id = req.path[len("/push/"):]
        await self.delay("webpush", sub_id)

        def refuse(status: int, detail: str) -> Refusal:
            phrase = http.HTTPStatus(status).phrase
            return Refusal(Answer(status, {"code": status, "error": phrase, "message": detail}), detail)

        if req.method != "POST":
            raise refuse(405, f"method {req.method}, push messages take POST")
        sub = self.subscriptions.get(sub_id)
        if sub is None:
            raise refuse(410, f"no subscription {sub_id!r} (unknown or deleted)")

        # VAPID (RFC 8292 §3): Authorization: vapid t=<JWT>, k=<public key>.
        auth = req.header("authorization")
        if auth is None:
            raise refuse(401, "no Authorization header (RFC 8292 vapid t=..., k=...)")
        scheme, _, params_text = auth.strip().partition(" ")
        if scheme.lower() != "vapid":
            raise refuse(401, f"Authorization scheme {scheme!r}, expected vapid (RFC 8292)")
        params: dict[str, str] = {}
        for part in params_text.split(","):
            name, eq, value = part.strip().partition("=")
            if not eq:
                raise refuse(401, f"Authorization parameter {part.strip()!r} is not name=value")
            value = value.strip()
            if len(value) >= 2 and value[0] == value[-1] == '"':
                value = value[1:-1]
            if name.strip().lower() in params:
                raise refuse(401, f"Authorization parameter {name.strip()} repeated")
            params[name.strip().lower()] = value
        if "t" not in params or "k" not in params:
            raise refuse(401, "Authorization lacks t= or k=")
        try:
            k = b64url_decode(params["k"])
            if len(k) != 65 or k[0] != 4:
                raise ValueError("not 65 bytes starting 0x04")
            vapid_key = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), k)
        except ValueError as e:
            raise refuse(401, f"k= is not a base64url uncompressed P-256 point ({e})") from None
        try:
            jwt_header = jwt.get_unverified_header(params["t"])
        except jwt.PyJWTError as e:
            raise refuse(401, f"t= is not a JWT ({e})") from None
        if jwt_header.get("alg") != "ES256":
            raise refuse(403, f"VAPID JWT alg {jwt_header.get('alg')!r}, expected ES256")
        try:
            claims = jwt.decode(
                params["t"], vapid_key, algorithms=["ES256"],
                options={"verify_exp": False, "verify_iat": False, "verify_nbf": False,
                         "verify_aud": False, "verify_iss": False, "verify_sub": False,
                         "verify_jti": False},
            )
        except jwt.InvalidSignatureError:
            raise refuse(403, "VAPID JWT signature does not verify with the k= key") from None
        except jwt.PyJWTError as e:
            raise refuse(403, f"VAPID JWT does not decode ({e})") from None
        if claims.get("aud") != self.origin:
            raise refuse(403, f"VAPID JWT aud {claims.get('aud')!r}, expected the push resource's origin {self.origin}")
        exp = claims.get("exp")
        now = time.time()
        if not isinstance(exp, int) or isinstance(exp, bool):
            raise refuse(403, f"VAPID JWT exp {exp!r} is not an integer")
        if exp <= now:
            raise refuse(403, f"VAPID JWT expired {int(now - exp)} s ago")
        if exp > now + VAPID_MAX_EXP + CLOCK_SKEW:
            raise refuse(403, f"VAPID JWT exp is {int(exp - now)} s ahead (more than 24 h)")
        sub_claim = claims.get("sub")
        if not isinstance(sub_claim, str) or not (sub_claim.startswith("mailto:") or sub_claim.startswith("https:")):
            raise refuse(403, f"VAPID JWT sub {sub_claim!r} is not a mailto: or https: URI")
        if sub.application_server_key is not None and k != sub.application_server_key:
            raise refuse(403, "k= is not the applicationServerKey this subscription was restricted to")

        # RFC 8030 headers.
        ttl = req.header("ttl")
        if ttl is None:
            raise refuse(400, "no TTL header (RFC 8030 §5.2)")
        if not re.fullmatch(r"\d{1,10}", ttl):
            raise refuse(400, f"TTL {ttl!r} is not a non-negative integer")
        urgency = req.header("urgency")
        if urgency is not None and urgency not in WEBPUSH_URGENCIES:
            raise refuse(400, f"Urgency {urgency!r} is not one of very-low, low, normal, high")
        topic = req.header("topic")
        if topic is not None and not WEBPUSH_TOPIC_RE.fullmatch(topic):
            raise refuse(400, f"Topic {topic!r} is not 1..32 characters of the base64url alphabet")

        # Body: aes128gcm (RFC 8188) as RFC 8291 uses it, one record, at most 4096 bytes.
        encoding = req.header("content-encoding")
        payload: Any = None
        if req.body or encoding is not None:
            if encoding is None or encoding.strip().lower() != "aes128gcm":
                raise refuse(415, f"Content-Encoding {encoding!r}, expected aes128gcm (RFC 8291)")
            if req.body_too_large or len(req.body) > WEBPUSH_MAX_BODY:
                raise refuse(413, f"body is {len(req.body)} bytes (more than {WEBPUSH_MAX_BODY})")
            body = req.body
            if len(body) < 21 or len(body) < 21 + body[20]:
                raise refuse(400, "body is shorter than an aes128gcm header")
            rs = struct.unpack("!L", body[16:20])[0]
            id_len = body[20]
            if id_len != 65:
                raise refuse(400, f"aes128gcm keyid is {id_len} bytes; RFC 8291 puts the 65-byte sender key there")
            if rs < 18 or len(body) - 21 - id_len > rs:
                raise refuse(400, f"aes128gcm record size {rs} does not hold the body in one record (RFC 8291 §4)")
            try:
                plaintext = http_ece.decrypt(body, private_key=sub.private_key, auth_secret=sub.auth,
                                             version="aes128gcm")
            except Exception as e:  # http_ece raises ECEException, InvalidTag, ValueError, struct.error...
                raise refuse(400, f"body does not decrypt with this subscription's keys ({type(e).__name__}: {e})") from None
            try:
                payload = json.loads(plaintext)
            except ValueError:
                try:
                    payload = {"text": plaintext.decode("utf-8")}
                except UnicodeDecodeError:
                    payload = {"base64": base64.b64encode(plaintext).decode()}

        def build(script: Script) -> Answer:
            status = script.status or 500
            phrase = http.HTTPStatus(status).phrase if status in http.HTTPStatus._value2member_map_ else "Error"
            return Answer(status, {"code": status, "error": phrase, "message": script.reason or phrase})

        answer = await self.scripted_answer("webpush", sub_id, req, payload, build)
        if answer is not None:
            return answer
        self.record_received("webpush", sub_id, req, payload)
        return Answer(201, None, [("location", f"{self.origin}/message/{uuid.uuid4()}"), ("ttl", ttl)])

    # -- subscriptions (kept in DIR so a restart on the same port keeps them working) --
    def _load_subscriptions(self) -> None:
        try:
            stored = json.load(open(self.subscriptions_path))
        except (OSError, ValueError):
            return
        for item in stored if isinstance(stored, list) else []:
            try:
                key = serialization.load_pem_private_key(item["private_key"].encode(), None)
                asks = item.get("application_server_key")
                self.subscriptions[item["id"]] = Subscription(
                    item["id"], key, b64url_decode(item["auth"]), b64url_decode(asks) if asks else None
                )
            except (KeyError, ValueError, TypeError):
                continue

    def _save_subscriptions(self) -> None:
        data = [{
            "id": s.id, "private_key": pkcs8_pem(s.private_key).decode(), "auth": b64url(s.auth),
            "application_server_key": b64url(s.application_server_key) if s.application_server_key else None,
        } for s in self.subscriptions.values()]
        write_atomic(self.subscriptions_path, json.dumps(data).encode(), private=True)

    def subscription_json(self, sub: Subscription) -> dict:
        p256dh = b64url(uncompressed_point(sub.private_key.public_key()))
        auth = b64url(sub.auth)
        return {"id": sub.id, "endpoint": f"{self.origin}/push/{sub.id}", "p256dh": p256dh, "auth": auth,
                "keys": {"p256dh": p256dh, "auth": auth}}

    # -- control API --
    def control(self, req: Request) -> Answer:
        route = (req.method, req.path.rstrip("/"))
        if route == ("GET", "/control/received"):
            return Answer(200, self._filtered(self.received, req))
        if route == ("GET", "/control/rejected"):
            return Answer(200, self._filtered(self.rejected, req))
        if route == ("GET", "/control/scripted"):
            return Answer(200, self._filtered(self.scripted, req))
        if route == ("GET", "/control/stats"):
            return Answer(200, {"fcm_tokens_issued": self.fcm_tokens_issued,
                                "apns_tokens_seen": len(self.apns_jwts), "requests": dict(self.requests)})
        if route == ("POST", "/control/reset"):
            self.reset()
            return Answer(200, {"ok": True})
        if route == ("POST", "/control/script"):
            self.scripts.append(self._parse_script(self._json_body(req)))
            return Answer(200, {"ok": True})
        if route == ("POST", "/control/webpush/subscriptions"):
            body = self._json_body(req, optional=True) or {}
            asks = body.get("application_server_key")
            try:
                restricted = b64url_decode(asks) if asks is not None else None
            except (ValueError, TypeError):
                raise ControlError("application_server_key is not base64url") from None
            if restricted is not None and (len(restricted) != 65 or restricted[0] != 4):
                raise ControlError("application_server_key is not an uncompressed P-256 point")
            sub = Subscription(secrets.token_urlsafe(16), ec.generate_private_key(ec.SECP256R1()),
                               secrets.token_bytes(16), restricted)
            self.subscriptions[sub.id] = sub
            self._save_subscriptions()
            return Answer(200, self.subscription_json(sub))
        m = re.fullmatch(r"/control/webpush/subscriptions/([^/]+)", route[1])
        if m is not None and req.method == "DELETE":
            if self.subscriptions.pop(m.group(1), None) is None:
                return Answer(404, {"error": f"no subscription {m.group(1)!r}"})
            self._save_subscriptions()
            return Answer(204)
        if route == ("POST", "/control/fcm/expire-tokens"):
            for token in self.fcm_tokens:
                self.fcm_tokens[token] = 0
            return Answer(200, {"expired": len(self.fcm_tokens)})
        return Answer(404, {"error": f"no control endpoint {req.method} {req.path}"})

    @staticmethod
    def _filtered(items: list[dict], req: Request) -> list[dict]:
        provider = req.query.get("provider")
        return [i for i in items if provider is None or i["provider"] == provider]

    @staticmethod
    def _json_body(req: Request, optional: bool = False) -> Any:
        if not req.body and optional:
            return None
        try:
            body = json.loads(req.body)
        except ValueError:
            raise ControlError("body is not JSON") from None
        if not isinstance(body, dict):
            raise ControlError("body is not a JSON object")
        return body

    @staticmethod
    def _parse_script(body: dict) -> Script:
        known = {"provider", "token", "status", "reason", "retry_after", "times", "delay_ms"}
        unknown = set(body) - known
        if unknown:
            raise ControlError(f"unknown fields {sorted(unknown)}; known: {sorted(known)}")
        provider = body.get("provider")
        if provider not in ("apns", "fcm", "webpush", "token"):
            raise ControlError("provider must be apns, fcm, webpush or token")

        def int_field(name: str, low: int, high: int) -> int | None:
            value = body.get(name)
            if value is None:
                return None
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
                raise ControlError(f"{name} must be an integer in {low}..{high}")
            return value

        status = int_field("status", 200, 599)
        delay_ms = int_field("delay_ms", 0, 600_000) or 0
        retry_after = int_field("retry_after", 0, 86_400)
        reason = body.get("reason")
        if reason is not None and not isinstance(reason, str):
            raise ControlError("reason must be a string")
        if status is None and reason is not None and provider == "fcm":
            if reason not in FCM_ERRORS:
                raise ControlError(f"fcm reason {reason!r} is not an FcmError code: {sorted(FCM_ERRORS)}")
            status = FCM_ERRORS[reason][0]
        if status is None and reason is not None:
            raise ControlError("status is required with reason (except for fcm, where it follows the errorCode)")
        if status is None and delay_ms == 0:
            raise ControlError("a script needs status (an answer) or delay_ms (a slow answer)")
        times = int_field("times", -1, 1_000_000)
        if times is None:
            times = 1 if status is not None else -1
        if times == 0:
            raise ControlError("times must be -1 (until reset) or at least 1")
        token = body.get("token", "*")
        if not isinstance(token, str) or not token:
            raise ControlError("token must be a non-empty string ('*' for any)")
        return Script(provider, token, status, reason, retry_after, delay_ms, times)


def fcm_check_request(body: dict) -> tuple[str, str] | None:
    """The checks FCM's messages:send makes on its JSON body; (field, description) of the first problem."""
    for name in body:
        if name not in ("message", "validate_only", "validateOnly"):
            return name, f'Invalid JSON payload received. Unknown name "{name}": Cannot find field.'
    validate_only = body.get("validate_only", body.get("validateOnly"))
    if validate_only is not None and not isinstance(validate_only, bool):
        return "validate_only", "Invalid value at 'validate_only' (TYPE_BOOL)"
    message = body.get("message")
    if not isinstance(message, dict):
        return "message", "Invalid value at 'message': a message object is required"
    for name in message:
        if name not in FCM_MESSAGE_FIELDS:
            return f"message.{name}", f'Invalid JSON payload received. Unknown name "{name}" at \'message\': Cannot find field.'
    targets = [t for t in ("token", "topic", "condition") if t in message]
    if len(targets) != 1:
        return "message", f"Exactly one of message.token, message.topic or message.condition is required (got {targets})"
    if targets != ["token"]:
        return f"message.{targets[0]}", "This stand-in only takes token targets (message.token)"
    token = message["token"]
    if not isinstance(token, str) or not FCM_TOKEN_RE.fullmatch(token):
        return "message.token", "The registration token is not a valid FCM registration token"

    def string_map(value: Any, where: str) -> tuple[str, str] | None:
        if not isinstance(value, dict):
            return where, f"Invalid value at '{where}': a map of strings is required"
        for key, item in value.items():
            if not isinstance(item, str):
                return f"{where}[{key}]", f"Invalid value at '{where}[{key}]' (TYPE_STRING), {json.dumps(item)}"
        return None

    size = 0
    if "data" in message:
        problem = string_map(message["data"], "message.data")
        if problem:
            return problem
        for key, value in message["data"].items():
            if key in FCM_RESERVED_DATA_KEYS or key.startswith("google.") or key.startswith("gcm."):
                return f"message.data[{key}]", f"Invalid data payload key: {key}"
            size += len(key.encode()) + len(value.encode())
    if "notification" in message:
        notification = message["notification"]
        if not isinstance(notification, dict):
            return "message.notification", "Invalid value at 'message.notification': an object is required"
        for key, value in notification.items():
            if key not in FCM_NOTIFICATION_FIELDS:
                return f"message.notification.{key}", f'Invalid JSON payload received. Unknown name "{key}" at \'message.notification\': Cannot find field.'
            if not isinstance(value, str):
                return f"message.notification.{key}", f"Invalid value at 'message.notification.{key}' (TYPE_STRING)"
            size += len(value.encode())
    if size > FCM_MAX_PAYLOAD:
        return "message", f"Message is too big: data and notification take {size} bytes (more than {FCM_MAX_PAYLOAD})"
    android = message.get("android")
    if android is not None:
        if not isinstance(android, dict):
            return "message.android", "Invalid value at 'message.android': an object is required"
        priority = android.get("priority")
        if priority is not None and (not isinstance(priority, str) or priority.upper() not in ("NORMAL", "HIGH")):
            return "message.android.priority", f"Invalid value at 'message.android.priority' (type.googleapis.com/google.firebase.fcm.v1.AndroidMessagePriority), {json.dumps(priority)}"
        ttl = android.get("ttl")
        if ttl is not None and (not isinstance(ttl, str) or not DURATION_RE.fullmatch(ttl)):
            return "message.android.ttl", f"Invalid value at 'message.android.ttl' (type.googleapis.com/google.protobuf.Duration), {json.dumps(ttl)}"
        if "data" in android:
            problem = string_map(android["data"], "message.android.data")
            if problem:
                return problem
    apns = message.get("apns")
    if apns is not None:
        if not isinstance(apns, dict):
            return "message.apns", "Invalid value at 'message.apns': an object is required"
        if "headers" in apns:
            problem = string_map(apns["headers"], "message.apns.headers")
            if problem:
                return problem
        if "payload" in apns and not isinstance(apns["payload"], dict):
            return "message.apns.payload", "Invalid value at 'message.apns.payload': an object is required"
    webpush = message.get("webpush")
    if webpush is not None:
        if not isinstance(webpush, dict):
            return "message.webpush", "Invalid value at 'message.webpush': an object is required"
        for name in ("headers", "data"):
            if name in webpush:
                problem = string_map(webpush[name], f"message.webpush.{name}")
                if problem:
                    return problem
    return None


# ---- ASGI application ----------------------------------------------------------------------------


class App:
    def __init__(self, providers: FakeProviders):
        self.providers = providers

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        chunks: list[bytes] = []
        size, too_large = 0, False
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > MAX_BODY:
                too_large = True
            elif chunk:
                chunks.append(chunk)
            if not message.get("more_body", False):
                break
        query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
        req = Request(
            method=scope["method"],
            path=scope["path"],
            query=query,
            headers=[(n.decode("latin-1").lower(), v.decode("latin-1")) for n, v in scope["headers"]],
            body=b"".join(chunks),
            body_too_large=too_large,
            http_version=scope.get("http_version", "1.1"),
        )
        try:
            answer = await self.providers.handle(req)
        except Exception as e:  # a bug here must be visible, not a hung request
            print(f"fake_providers: internal error on {req.method} {req.path}: {e!r}", file=sys.stderr, flush=True)
            self.providers.rejected.append({"provider": "internal", "path": req.path, "status": 500,
                                            "reason": f"fake server error: {e!r}", "at": now_ms()})
            answer = Answer(500, {"error": f"fake server error: {e!r}"})
        body, headers = answer.encoded()
        headers.append(("content-length", str(len(body))))
        await send({
            "type": "http.response.start",
            "status": answer.status,
            "headers": [(n.encode("latin-1"), v.encode("latin-1")) for n, v in headers],
        })
        await send({"type": "http.response.body", "body": body})


# ---- process lifetime ----------------------------------------------------------------------------


def watch_for_exit(exit_after: float, watch_stdin: bool) -> None:
    """Exit when the parent dies, when stdin (a pipe or socket) closes, or after exit_after seconds."""
    parent = os.getppid()

    def parent_watch() -> None:
        while True:
            time.sleep(0.5)
            if os.getppid() != parent:
                print("fake_providers: parent process gone; exiting", file=sys.stderr, flush=True)
                os._exit(0)

    threading.Thread(target=parent_watch, daemon=True).start()
    if watch_stdin:
        try:
            mode = os.fstat(0).st_mode
        except OSError:
            mode = 0
        if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
            def stdin_watch() -> None:
                try:
                    while os.read(0, 65536):
                        pass
                except OSError:
                    pass
                print("fake_providers: stdin closed; exiting", file=sys.stderr, flush=True)
                os._exit(0)

            threading.Thread(target=stdin_watch, daemon=True).start()
    if exit_after > 0:
        def deadline() -> None:
            time.sleep(exit_after)
            print(f"fake_providers: --exit-after {exit_after:g} s reached; exiting", file=sys.stderr, flush=True)
            os._exit(0)

        threading.Thread(target=deadline, daemon=True).start()


class ReadyHandler(logging.Handler):
    """Hypercorn logs 'Running on https://...' once its listener is serving: then say READY."""

    def __init__(self, on_ready: Any):
        super().__init__(logging.INFO)
        self.on_ready = on_ready
        self.done = False

    def emit(self, record: logging.LogRecord) -> None:
        if not self.done and record.getMessage().startswith("Running on"):
            self.done = True
            self.on_ready()


def main() -> None:
    parser = argparse.ArgumentParser(description="Local APNs / FCM HTTP v1 / Web Push stand-ins (see README.md)")
    parser.add_argument("--dir", required=True, help="folder for credentials and ready.json")
    parser.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (0: a free one)")
    parser.add_argument("--exit-after", type=float, default=1800, help="exit after this many seconds (0: never)")
    parser.add_argument("--no-stdin-watch", action="store_true", help="do not exit when stdin closes")
    parser.add_argument("--idle-timeout", type=float, default=600,
                        help="seconds an idle connection is kept open (APNs keeps them long)")
    args = parser.parse_args()

    watch_for_exit(args.exit_after, not args.no_stdin_watch)
    directory = os.path.abspath(args.dir)
    ready_path = os.path.join(directory, "ready.json")
    os.makedirs(directory, exist_ok=True)
    try:
        os.remove(ready_path)
    except FileNotFoundError:
        pass
    creds = Credentials(directory)

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    sock.listen(128)
    port = sock.getsockname()[1]
    creds.write_service_account(port)
    providers = FakeProviders(creds, port)

    def on_ready() -> None:
        write_atomic(ready_path, json.dumps({"port": port}).encode())
        sys.stdout.write("READY " + json.dumps({"port": port}) + "\n")
        sys.stdout.flush()

    log = logging.getLogger("fake_providers.hypercorn")
    log.setLevel(logging.INFO)
    log.propagate = False
    stderr_handler = logging.StreamHandler(sys.stderr)
    stderr_handler.setLevel(logging.WARNING)
    log.addHandler(stderr_handler)
    log.addHandler(ReadyHandler(on_ready))

    config = Config()
    config.bind = [f"fd://{sock.fileno()}"]
    config.certfile = creds.cert_path
    config.keyfile = creds.key_path
    config.alpn_protocols = ["h2", "http/1.1"]
    config.errorlog = log
    config.accesslog = None
    config.keep_alive_timeout = args.idle_timeout
    config.keep_alive_max_requests = 1_000_000_000
    config.graceful_timeout = 1
    config.include_server_header = False

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve(App(providers), config, shutdown_trigger=stop.wait)

    asyncio.run(run())


if __name__ == "__main__":
    main()
