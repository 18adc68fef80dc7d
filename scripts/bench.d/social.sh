# scripts/bench hook (sourced): social-service. Needs accounts.sh's accounts-service (ACC_PORT):
# hooks run in name order.
#  - fan-out: SUBS live SubscribeNotifications streams (4 per user, over CONNS grpcio connections,
#    50 streams each) through a gateway, then one notification per user (SendNotification, 100
#    recipients a call, straight to social with the service credential) reaching every stream:
#    delivered/s and p50/p99 from the SendNotification call's start to arrival; the same fan-out
#    with the streams straight to social-service is the reference in the same run (ratio = the
#    gateway's cost). The client is Python (grpc.aio): its own time per element is in the figures.
#  - resident memory (VmRSS) of the gateway and of social per idle subscription: before and after
#    the streams are open and idle, divided by SUBS (goal ≤ 16 KiB each);
#  - CheckRelationship and CheckHouseholdMembership (internal reads on other services' request
#    paths) through h2load in both shapes, with the service credential.
if [ $BUILD = 1 ]; then
  echo "bench: scripts/swift-release --product social-service" >&2
  "$ROOT"/scripts/swift-release --product social-service >&2
fi
SOC_BIN=${SOCIAL_BINARY:-$ROOT/.build/release/social-service}
GW_BIN_S=${GATEWAY_BINARY:-$ROOT/.build/release/gateway}
if [ ! -x "$SOC_BIN" ] || [ ! -x "$GW_BIN_S" ] || [ -z "${ACC_PORT:-}" ]; then
  echo "bench: social rows skipped ($SOC_BIN or $GW_BIN_S missing, or no accounts-service from accounts.sh)" >&2
else
  SOC_PORT=$(free_port)
  mkdir -p "$WORK/social-data" "$WORK/social-gateway-data"
  SERVICE_TOKEN=$BENCH_SERVICE_TOKEN GATEWAY_TOKEN=$BENCH_GATEWAY_TOKEN LOG_LEVEL=warning ACCOUNTS_ADDR=127.0.0.1:$ACC_PORT \
    TASKS_ADDR=127.0.0.1:$(free_port) start_bg social-bench "$SOC_BIN" --host 127.0.0.1 --port "$SOC_PORT" --data-dir "$WORK/social-data"
  SOC_PID=$BG_PID
  wait_port "$SOC_PORT" 60 || { tail -20 "$WORK/social-bench.log" >&2; exit 1; }
  SGW_PORT=$(free_port)
  DATA_DIR=$WORK/social-gateway-data GATEWAY_TOKEN=$BENCH_GATEWAY_TOKEN LOG_LEVEL=warning ACCOUNTS_ADDR=127.0.0.1:$ACC_PORT \
    SOCIAL_ADDR=127.0.0.1:$SOC_PORT GATEWAY_UPSTREAMS=accounts,social GATEWAY_ADDRESS_RATE=0 GATEWAY_USER_RATE=0 \
    start_bg social-gateway "$GW_BIN_S" --host 127.0.0.1 --port "$SGW_PORT"
  SGW_PID=$BG_PID
  wait_port "$SGW_PORT" || { tail -20 "$WORK/social-gateway.log" >&2; exit 1; }

  mkdir -p "$WORK/social-py"
  "$PY" -m grpc_tools.protoc -IProto -I/usr/include --python_out="$WORK/social-py" --grpc_python_out="$WORK/social-py" \
    accounts/v1/accounts.proto social/v1/social.proto common/v1/options.proto common/v1/types.proto

  SUBS=2000; CONNS=40; [ $QUICK = 1 ] && { SUBS=200; CONNS=4; }
  # Prints "key=value" lines: the figures and, for h2load, ids and a token.
  SOC_RESULT=$(PYTHONPATH="$WORK/social-py" "$PY" - "$ACC_PORT" "$SOC_PORT" "$SGW_PORT" "$SOC_PID" "$SGW_PID" "$SUBS" "$CONNS" \
                 "$BENCH_SERVICE_TOKEN" "$WORK/social-tokens.txt" <<'PYEOF'
import asyncio, sys, time, threading
import grpc
from accounts.v1 import accounts_pb2 as apb, accounts_pb2_grpc as arpc
from social.v1 import social_pb2 as spb, social_pb2_grpc as srpc
acc_port, soc_port, gw_port, soc_pid, gw_pid, subs, conns, service_token, tokens_file = sys.argv[1:10]
subs, conns = int(subs), int(conns)
PER_USER = 4
users_n = subs // PER_USER
service = [("x-service-token", service_token)]

def rss(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"): return int(line.split()[1])

# Users (accounts directly, 4 threads: scrypt at the service's default cost).
acc = arpc.AccountsStub(grpc.insecure_channel(f"127.0.0.1:{acc_port}"))
users, lock, nxt = [None] * users_n, threading.Lock(), [0]
stamp = int(time.time())
def signer():
    while True:
        with lock:
            i = nxt[0]; nxt[0] += 1
        if i >= users_n: return
        r = acc.SignUp(apb.SignUpRequest(username=f"s{stamp}x{i}", email=f"s{stamp}x{i}@example.com", password="correct horse battery staple"), timeout=60)
        users[i] = (r.user.user_id, r.session.access_token)
ts = [threading.Thread(target=signer) for _ in range(4)]
for t in ts: t.start()
for t in ts: t.join()
with open(tokens_file, "w") as f:
    f.write("".join(f"{tok}\n" for _, tok in users))

def percentile(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]

async def fanout(port, label, measure_rss):
    # A local subchannel pool per channel: otherwise grpcio shares one connection between them.
    channels = [grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)]) for _ in range(conns)]
    stubs = [srpc.SocialStub(c) for c in channels]
    before = (rss(soc_pid), rss(gw_pid)) if measure_rss else None
    arrivals = {}                      # user id -> [arrival times]
    started = asyncio.Event()
    ready = [0]
    calls = []
    async def reader(k, uid, token):
        call = stubs[k % conns].SubscribeNotifications(spb.SubscribeNotificationsRequest(), metadata=[("authorization", f"Bearer {token}")], timeout=600)
        calls.append(call)
        async for e in call:
            if e.WhichOneof("event") == "started":
                ready[0] += 1
                if ready[0] == subs: started.set()
            else:
                arrivals.setdefault(uid, []).append(time.perf_counter())
    tasks = []
    for k in range(subs):
        uid, token = users[k // PER_USER]
        tasks.append(asyncio.create_task(reader(k, uid, token)))
    await asyncio.wait_for(started.wait(), 120)
    await asyncio.sleep(2)             # idle
    after = (rss(soc_pid), rss(gw_pid)) if measure_rss else None
    # One notification per user, 100 recipients a call, all calls at once.
    internal = srpc.SocialInternalStub(grpc.aio.insecure_channel(f"127.0.0.1:{soc_port}"))
    sent_at = {}
    async def send(batch, n):
        t = time.perf_counter()
        for uid in batch: sent_at[uid] = t
        await internal.SendNotification(spb.SendNotificationRequest(event_id=f"bench:{stamp}:{label}:{n}", recipient_user_ids=batch,
                                        kind=spb.NOTIFICATION_KIND_TASK_REMINDER, title="Bench"), metadata=service, timeout=60)
    ids = [u[0] for u in users]
    t0 = time.perf_counter()
    await asyncio.gather(*[send(ids[i:i + 100], i) for i in range(0, len(ids), 100)])
    deadline = time.perf_counter() + 60
    while sum(len(v) for v in arrivals.values()) < subs and time.perf_counter() < deadline:
        await asyncio.sleep(0.01)
    got = sum(len(v) for v in arrivals.values())
    assert got == subs, f"{label}: {got} of {subs} notifications arrived"
    lat = [(a - sent_at[uid]) * 1000 for uid, v in arrivals.items() for a in v]
    last = max(a for v in arrivals.values() for a in v)
    for c in calls: c.cancel()
    for t in tasks: t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for c in channels: await c.close()
    return subs / (last - t0), percentile(lat, 50), percentile(lat, 99), before, after

gw = asyncio.run(fanout(gw_port, "gateway", True))
time.sleep(1)
direct = asyncio.run(fanout(soc_port, "direct", False))
(b_soc, b_gw), (a_soc, a_gw) = gw[3], gw[4]
print(f"fan_gw={gw[0]:.0f}|{gw[1]:.2f}|{gw[2]:.2f}")
print(f"fan_direct={direct[0]:.0f}|{direct[1]:.2f}|{direct[2]:.2f}")
print(f"rss_soc={b_soc}|{a_soc}|{(a_soc - b_soc) / subs:.1f}")
print(f"rss_gw={b_gw}|{a_gw}|{(a_gw - b_gw) / subs:.1f}")

# Data for the internal reads: two friends who follow each other one way, a household of three.
soc = srpc.SocialStub(grpc.insecure_channel(f"127.0.0.1:{soc_port}"))
(a_id, a_tok), (b_id, b_tok), (c_id, c_tok) = users[0], users[1], users[2]
bearer = lambda t: [("authorization", f"Bearer {t}")]
soc.AddFriend(spb.AddFriendRequest(user=spb.UserSelector(user_id=b_id)), metadata=bearer(a_tok), timeout=10)
soc.RequestFollow(spb.RequestFollowRequest(user=spb.UserSelector(user_id=b_id)), metadata=bearer(a_tok), timeout=10)
soc.AcceptFollowRequest(spb.AcceptFollowRequestRequest(requester_user_id=a_id), metadata=bearer(b_tok), timeout=10)
hid = soc.CreateHousehold(spb.CreateHouseholdRequest(name="Bench House"), metadata=bearer(a_tok), timeout=10).household.household_id
internal = srpc.SocialInternalStub(grpc.insecure_channel(f"127.0.0.1:{soc_port}"))
rel = internal.CheckRelationship(spb.CheckRelationshipRequest(user_id=a_id, other_user_id=b_id), metadata=service, timeout=10)
assert rel.friends and rel.user_follows_other, rel
mem = internal.CheckHouseholdMembership(spb.CheckHouseholdMembershipRequest(household_id=hid, user_ids=[a_id, b_id]), metadata=service, timeout=10)
assert mem.state == spb.HOUSEHOLD_STATE_ACTIVE and list(mem.member_user_ids) == [a_id], mem
print(f"ids={a_id}|{b_id}|{hid}")
PYEOF
  ) || { echo "bench: social fan-out failed" >&2; tail -n 20 "$WORK/social-bench.log" "$WORK/social-gateway.log" >&2; exit 1; }
  soc_value() { printf '%s\n' "$SOC_RESULT" | awk -F= -v k="$1" '$1 == k {print $2}'; }
  IFS='|' read -r FAN_GW_RATE FAN_GW_P50 FAN_GW_P99 <<<"$(soc_value fan_gw)"
  IFS='|' read -r FAN_D_RATE FAN_D_P50 FAN_D_P99 <<<"$(soc_value fan_direct)"
  IFS='|' read -r SOC_RSS0 SOC_RSS1 SOC_PER <<<"$(soc_value rss_soc)"
  IFS='|' read -r SGW_RSS0 SGW_RSS1 SGW_PER <<<"$(soc_value rss_gw)"
  IFS='|' read -r REL_A REL_B REL_H <<<"$(soc_value ids)"
  EXTRA_LINES+=("$(printf '%-34s %-24s %12s %10s %10s %14s' "notification fan-out" "streams / connections" "delivered/s" "p50 ms" "p99 ms" "vs direct")")
  EXTRA_LINES+=("$(printf '%-34s %-24s %12s %10s %10s %14s' "through the gateway" "$SUBS / $CONNS" "$FAN_GW_RATE" "$FAN_GW_P50" "$FAN_GW_P99" \
                   "$(awk -v a="$FAN_GW_RATE" -v b="$FAN_D_RATE" 'BEGIN { if (b > 0) printf "%.3f", a / b; else print "-" }')")")
  EXTRA_LINES+=("$(printf '%-34s %-24s %12s %10s %10s %14s' "straight to social-service" "$SUBS / $CONNS" "$FAN_D_RATE" "$FAN_D_P50" "$FAN_D_P99" "1.000")")
  RSS_ROWS+=("social-service idle (before streams)|$SOC_RSS0" "social-service + $SUBS idle streams|$SOC_RSS1"
             "gateway idle (before streams)|$SGW_RSS0" "gateway + $SUBS idle streams|$SGW_RSS1")
  SOCIAL_PER_SUB="social ${SOC_PER} KiB, gateway ${SGW_PER} KiB per idle subscription (goal ≤ 16 KiB each)"
  EXTRA_LINES+=("memory per idle subscription: $SOCIAL_PER_SUB")
  echo "bench: social fan-out: gateway $FAN_GW_RATE/s p50 $FAN_GW_P50 ms p99 $FAN_GW_P99 ms; direct $FAN_D_RATE/s p50 $FAN_D_P50 ms p99 $FAN_D_P99 ms; $SOCIAL_PER_SUB" >&2

  # Browser streams held through the gateway (issue 17): gRPC-Web over HTTP/1.1, Connect
  # streaming over HTTP/2; the gateway's RSS per held stream.
  # A gateway of their own: the fan-out's freed memory would otherwise be reused by the streams
  # and hide what they cost.
  BROWSER_STREAMS=1000; [ $QUICK = 1 ] && BROWSER_STREAMS=200
  BGW_PORT=$(free_port)
  mkdir -p "$WORK/browser-gateway-data"
  DATA_DIR=$WORK/browser-gateway-data GATEWAY_TOKEN=$BENCH_GATEWAY_TOKEN LOG_LEVEL=warning ACCOUNTS_ADDR=127.0.0.1:$ACC_PORT \
    SOCIAL_ADDR=127.0.0.1:$SOC_PORT GATEWAY_UPSTREAMS=accounts,social GATEWAY_ADDRESS_RATE=0 GATEWAY_USER_RATE=0 \
    start_bg browser-gateway "$GW_BIN_S" --host 127.0.0.1 --port "$BGW_PORT"
  BGW_PID=$BG_PID
  wait_port "$BGW_PORT" || { tail -20 "$WORK/browser-gateway.log" >&2; exit 1; }
  BROWSER_RESULT=$("$PY" "$ROOT/scripts/bench.d/browser_streams.py" "$BGW_PORT" "$BGW_PID" "$WORK/social-tokens.txt" "$BROWSER_STREAMS") ||
    { echo "bench: browser streams failed" >&2; tail -n 20 "$WORK/browser-gateway.log" >&2; exit 1; }
  kill -TERM "$BGW_PID" 2>/dev/null; wait "$BGW_PID" 2>/dev/null  # not beside the rows that follow
  br_value() { printf '%s\n' "$BROWSER_RESULT" | awk -F= -v k="$1" '$1 == k {print $2}'; }
  IFS='|' read -r BR1_0 BR1_1 BR1_PER <<<"$(br_value h1)"
  IFS='|' read -r BR2_0 BR2_1 BR2_PER <<<"$(br_value h2)"
  RSS_ROWS+=("gateway + $BROWSER_STREAMS gRPC-Web streams, HTTP/1.1|$BR1_1" "gateway + $BROWSER_STREAMS Connect streams, HTTP/2|$BR2_1"
             "gateway after they closed|$(br_value after)")
  EXTRA_LINES+=("memory per held browser stream (gateway): gRPC-Web over HTTP/1.1 ${BR1_PER} KiB ($BR1_0 -> $BR1_1 KiB), Connect over HTTP/2 ${BR2_PER} KiB ($BR2_0 -> $BR2_1 KiB), $BROWSER_STREAMS streams each")
  echo "bench: browser streams: gRPC-Web/HTTP1.1 ${BR1_PER} KiB, Connect/HTTP2 ${BR2_PER} KiB per stream; after close $(br_value after) KiB" >&2

  # Push fan-out (issue 36): a social-service of its own with APNs, FCM and Web Push pointed at the
  # fake providers (scripts/bench.d/push_fanout.py says what is measured); the stream fan-out
  # straight to social above is the reference.
  PUSH_USERS=2000; [ $QUICK = 1 ] && PUSH_USERS=200
  FAKE_DIR=$WORK/fake-push; mkdir -p "$FAKE_DIR" "$WORK/social-push-data"
  FAKE_PORT=$(free_port)
  start_bg fake-push "$PY" "$ROOT/Tests/PushProviders/fake_providers.py" --dir "$FAKE_DIR" --port "$FAKE_PORT" --no-stdin-watch
  FAKE_PID=$BG_PID
  wait_port "$FAKE_PORT" 60 || { tail -20 "$WORK/fake-push.log" >&2; exit 1; }
  for _ in $(seq 100); do [ -f "$FAKE_DIR/ready.json" ] && break; sleep 0.1; done
  SPUSH_PORT=$(free_port)
  SERVICE_TOKEN=$BENCH_SERVICE_TOKEN GATEWAY_TOKEN=$BENCH_GATEWAY_TOKEN LOG_LEVEL=warning ACCOUNTS_ADDR=127.0.0.1:$ACC_PORT \
    TASKS_ADDR=127.0.0.1:$(free_port) PUSH_TLS_CA=$FAKE_DIR/ca.pem PUSH_ALLOW_PRIVATE_ENDPOINTS=on \
    PUSH_APNS_KEY_FILE=$FAKE_DIR/apns-key.p8 PUSH_APNS_KEY_ID=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["key_id"])' "$FAKE_DIR/apns.json") \
    PUSH_APNS_TEAM_ID=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["team_id"])' "$FAKE_DIR/apns.json") \
    PUSH_APNS_URL=https://127.0.0.1:$FAKE_PORT PUSH_FCM_URL=https://127.0.0.1:$FAKE_PORT PUSH_FCM_SERVICE_ACCOUNT_FILE=$FAKE_DIR/fcm-service-account.json \
    PUSH_VAPID_KEY_FILE=$FAKE_DIR/vapid-private.pem PUSH_VAPID_SUBJECT=mailto:bench@example.com \
    start_bg social-push "$SOC_BIN" --host 127.0.0.1 --port "$SPUSH_PORT" --data-dir "$WORK/social-push-data"
  SPUSH_PID=$BG_PID
  wait_port "$SPUSH_PORT" 60 || { tail -20 "$WORK/social-push.log" >&2; exit 1; }
  PUSH_RESULT=$(PYTHONPATH="$WORK/social-py" "$PY" "$ROOT/scripts/bench.d/push_fanout.py" "$ACC_PORT" "$SPUSH_PORT" "$FAKE_PORT" "$FAKE_DIR" \
                  "$BENCH_SERVICE_TOKEN" "$PUSH_USERS" "$SPUSH_PID") ||
    { echo "bench: push fan-out failed" >&2; tail -n 20 "$WORK/social-push.log" "$WORK/fake-push.log" >&2; exit 1; }
  kill -TERM "$SPUSH_PID" "$FAKE_PID" 2>/dev/null; wait "$SPUSH_PID" "$FAKE_PID" 2>/dev/null
  push_value() { printf '%s\n' "$PUSH_RESULT" | awk -F= -v k="$1" '$1 == k {print $2}'; }
  IFS='|' read -r PUSH_RATE PUSH_P50 PUSH_P99 <<<"$(push_value push_fanout)"
  PUSH_CEIL=$(push_value push_ceiling)
  IFS='|' read -r PUSH_RSS0 PUSH_RSS1 <<<"$(push_value push_rss)"
  RSS_ROWS+=("social-service with push, idle|$PUSH_RSS0" "social-service, $PUSH_USERS pushes (peak)|$PUSH_RSS1")
  EXTRA_LINES+=("$(printf '%-34s %-24s %12s %10s %10s %14s' "push fan-out (fake providers)" "$PUSH_USERS users, 1 device" "$PUSH_RATE" "$PUSH_P50" "$PUSH_P99" \
                   "$(awk -v a="$PUSH_RATE" -v b="$FAN_D_RATE" 'BEGIN { if (b > 0) printf "%.3f", a / b; else print "-" }')")")
  EXTRA_LINES+=("push fan-out: $PUSH_RATE pushes/s accepted (a third each APNs, FCM, Web Push); the fake providers alone take $PUSH_CEIL APNs requests/s from Python (their ceiling: ratio $(awk -v a="$PUSH_RATE" -v b="$PUSH_CEIL" 'BEGIN { if (b > 0) printf "%.3f", a / b; else print "-" }'))")
  echo "bench: push fan-out: $PUSH_RATE/s p50 $PUSH_P50 ms p99 $PUSH_P99 ms; fake providers' ceiling $PUSH_CEIL/s" >&2

  REL_BODY=$WORK/checkrelationship.bin
  grpc_body "$REL_BODY" social.v1.CheckRelationshipRequest "user_id: \"$REL_A\" other_user_id: \"$REL_B\"" social/v1/social.proto -IProto -I/usr/include
  MEM_BODY=$WORK/checkhousehold.bin
  grpc_body "$MEM_BODY" social.v1.CheckHouseholdMembershipRequest "household_id: \"$REL_H\" user_ids: \"$REL_A\" user_ids: \"$REL_B\"" \
    social/v1/social.proto -IProto -I/usr/include
  for shape in throughput latency; do
    # Answers are ≥ 4 bytes of DATA (friends + follows set; state + a member); errors carry none.
    MIN_DATA_PER_REQUEST=9 h2load_row "social CheckRelationship" $shape "http://127.0.0.1:$SOC_PORT/social.v1.SocialInternal/CheckRelationship" \
      "$REL_BODY" "${GRPC_HEADERS[@]}" -H "x-service-token: $BENCH_SERVICE_TOKEN"
    MIN_DATA_PER_REQUEST=40 h2load_row "social CheckHouseholdMembership" $shape "http://127.0.0.1:$SOC_PORT/social.v1.SocialInternal/CheckHouseholdMembership" \
      "$MEM_BODY" "${GRPC_HEADERS[@]}" -H "x-service-token: $BENCH_SERVICE_TOKEN"
  done
  rss_row "social-service after load" "$SOC_PID"
  kill -0 "$SOC_PID" || { echo "bench: social-service died" >&2; tail -n 20 "$WORK/social-bench.log" >&2; exit 1; }
fi
