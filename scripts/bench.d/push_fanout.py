"""The push fan-out row of scripts/bench (sourced from social.sh): USERS users, each with one push
target (a third APNs, a third FCM, a third Web Push) on a social-service whose providers point at
Tests/PushProviders/fake_providers.py; one notification per user (SendNotification, 100 recipients a
call, all calls at once); pushes/s until the fake providers accepted every push, and p50/p99 from the
call's start to the provider's acceptance. The fake providers verify every request (JWTs, the OAuth
exchange, VAPID, RFC 8291 decryption) in Python, so their own rate bounds this row: it is printed
beside it (the same fake fed by 32 concurrent HTTP/2 APNs requests from Python, no social), and
social's resident memory before and at its peak during the fan-out.
Prints key=value lines."""
import json
import os
import ssl
import sys
import threading
import time
import urllib.request
import uuid

import grpc
from accounts.v1 import accounts_pb2 as apb, accounts_pb2_grpc as arpc
from social.v1 import social_pb2 as spb, social_pb2_grpc as srpc

acc_port, soc_port, fake_port, fake_dir, service_token, users_n, soc_pid = sys.argv[1:8]
users_n = int(users_n)
service = [("x-service-token", service_token)]
tls = ssl.create_default_context(cafile=os.path.join(fake_dir, "ca.pem"))
base = f"https://127.0.0.1:{fake_port}"


def control(method, path, body=None):
    req = urllib.request.Request(base + path, method=method, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, context=tls, timeout=60) as r:
        data = r.read()
        return json.loads(data) if data else {}


acc = arpc.AccountsStub(grpc.insecure_channel(f"127.0.0.1:{acc_port}"))
soc = srpc.SocialStub(grpc.insecure_channel(f"127.0.0.1:{soc_port}"))
stamp = uuid.uuid4().hex[:6]
users, lock, nxt = [None] * users_n, threading.Lock(), [0]


def signer():
    while True:
        with lock:
            i = nxt[0]
            nxt[0] += 1
        if i >= users_n:
            return
        r = acc.SignUp(apb.SignUpRequest(username=f"p{stamp}x{i}", email=f"p{stamp}x{i}@example.com", password="correct horse battery staple"),
                       timeout=60)
        token = r.session.access_token
        bearer = [("authorization", f"Bearer {token}")]
        if i % 3 == 0:
            target = spb.PushTarget(apns=spb.ApnsTarget(device_token=os.urandom(32).hex(), topic="com.example.bench",
                                                        environment=spb.APNS_ENVIRONMENT_PRODUCTION))
        elif i % 3 == 1:
            target = spb.PushTarget(fcm=spb.FcmTarget(registration_token=f"bench:{uuid.uuid4().hex}"))
        else:
            sub = control("POST", "/control/webpush/subscriptions", {})
            target = spb.PushTarget(web_push=spb.WebPushTarget(endpoint=sub["endpoint"], p256dh=sub["p256dh"], auth=sub["auth"]))
        soc.RegisterPushTarget(spb.RegisterPushTargetRequest(target=target), metadata=bearer, timeout=30)
        users[i] = r.user.user_id


threads = [threading.Thread(target=signer) for _ in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
control("POST", "/control/reset", {})


def rss():
    for line in open(f"/proc/{soc_pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])


rss_before, rss_peak, sampling = rss(), [0], [True]


def sampler():
    while sampling[0]:
        rss_peak[0] = max(rss_peak[0], rss())
        time.sleep(0.05)


threading.Thread(target=sampler, daemon=True).start()
internal = srpc.SocialInternalStub(grpc.insecure_channel(f"127.0.0.1:{soc_port}"))
sent_at = {}
t0 = time.time()
calls = []
for n in range(0, users_n, 100):
    batch = users[n:n + 100]
    for uid in batch:
        sent_at[uid] = time.time()
    calls.append(internal.SendNotification.future(
        spb.SendNotificationRequest(event_id=f"push-bench:{stamp}:{n}", recipient_user_ids=batch, kind=spb.NOTIFICATION_KIND_TASK_REMINDER,
                                    title="Bench reminder", body="Take out the recycling"), metadata=service, timeout=120))
ids = {}
for c in calls:
    for uid, nid in c.result().notification_ids.items():
        ids[nid] = uid
deadline = time.time() + 300
while time.time() < deadline:
    got = control("GET", "/control/stats")["requests"]
    if got["apns"] + got["fcm"] + got["webpush"] >= users_n:
        break
    time.sleep(0.2)
sampling[0] = False
received = control("GET", "/control/received")
rejected = control("GET", "/control/rejected")
assert not rejected, f"the fake providers refused pushes: {rejected[:3]}"
assert len(received) == users_n, f"{len(received)} of {users_n} pushes accepted"


def notification_id(r):
    p = r["payload"]
    if r["provider"] == "fcm":
        return p["message"]["data"]["notification_id"]
    return p["notification_id"]


lat = sorted(r["at"] - sent_at[ids[notification_id(r)]] * 1000 for r in received)
last = max(r["at"] for r in received) / 1000
rate = users_n / (last - t0)
print(f"push_rss={rss_before}|{rss_peak[0]}")
print(f"push_fanout={rate:.0f}|{lat[len(lat) // 2]:.0f}|{lat[min(len(lat) - 1, int(0.99 * (len(lat) - 1)))]:.0f}")

# The fake's own ceiling: APNs requests from Python (httpx, HTTP/2, 32 at once), no social.
import asyncio  # noqa: E402

import httpx  # noqa: E402
import jwt  # noqa: E402

apns = json.load(open(os.path.join(fake_dir, "apns.json")))
key = open(os.path.join(fake_dir, "apns-key.p8")).read()
token = jwt.encode({"iss": apns["team_id"], "iat": int(time.time())}, key, algorithm="ES256", headers={"kid": apns["key_id"]})
body = json.dumps({"aps": {"alert": {"title": "Bench reminder", "body": "Take out the recycling"}, "badge": 1}}).encode()


async def ceiling(n):
    async with httpx.AsyncClient(http2=True, verify=tls) as client:
        sem = asyncio.Semaphore(32)

        async def one(i):
            async with sem:
                r = await client.post(f"{base}/3/device/{os.urandom(32).hex()}", content=body, headers={
                    "authorization": f"bearer {token}", "apns-topic": "com.example.bench", "apns-push-type": "alert"})
                assert r.status_code == 200, r.text
        t = time.time()
        await asyncio.gather(*[one(i) for i in range(n)])
        return n / (time.time() - t)


print(f"push_ceiling={asyncio.run(ceiling(users_n)):.0f}")
