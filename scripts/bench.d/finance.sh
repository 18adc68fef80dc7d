# scripts/bench hook (sourced): finance-service.
#  - durable CreateCharge calls/s with distinct idempotency keys, 8 in flight (grpcio aio; each
#    answer comes after its group-committed fsync), which is also how the big household is filled;
#  - GetBalances latency (h2load, 1 in flight) in a household with 10 transactions and in one
#    with 100,000 (20,000 with --quick), in this run, and their ratio (goal ≤ 1.2: balances are
#    running per-pair rows, never a sum over history);
#  - GetBalances req/s (h2load throughput shape) in the big household.
# Needs accounts.sh's accounts-service (ACC_PORT: users and token keys). The membership peer is
# the real social-service (households created and joined through its API).
if [ $BUILD = 1 ]; then
  echo "bench: scripts/swift-release --product finance-service --product social-service" >&2
  "$ROOT"/scripts/swift-release --product finance-service >&2
  "$ROOT"/scripts/swift-release --product social-service >&2
fi
FIN_BIN=${FINANCE_BINARY:-$ROOT/.build/release/finance-service}
SOC_BIN=${SOCIAL_BINARY:-$ROOT/.build/release/social-service}
if [ ! -x "$FIN_BIN" ] || [ ! -x "$SOC_BIN" ] || [ -z "${ACC_PORT:-}" ]; then
  echo "bench: finance rows skipped ($FIN_BIN or $SOC_BIN missing, or no accounts-service from accounts.sh)" >&2
else
  FIN_PORT=$(free_port)
  SOC_PORT=$(free_port)
  mkdir -p "$WORK/finance-data" "$WORK/finance-py" "$WORK/finance-social-data"
  "$PY" -m grpc_tools.protoc -IProto -I"$("$PY" -c 'import grpc_tools, os; print(os.path.dirname(grpc_tools.__file__))')/_proto" \
    --python_out="$WORK/finance-py" --grpc_python_out="$WORK/finance-py" \
    accounts/v1/accounts.proto social/v1/social.proto finance/v1/finance.proto common/v1/options.proto common/v1/types.proto
  SERVICE_TOKEN=$BENCH_SERVICE_TOKEN GATEWAY_TOKEN=$BENCH_GATEWAY_TOKEN LOG_LEVEL=warning ACCOUNTS_ADDR=127.0.0.1:$ACC_PORT \
    start_bg social-bench "$SOC_BIN" --host 127.0.0.1 --port "$SOC_PORT" --data-dir "$WORK/finance-social-data"
  wait_port "$SOC_PORT" 60 || { tail -20 "$WORK"/social-*.log >&2; exit 1; }
  SERVICE_TOKEN=$BENCH_SERVICE_TOKEN GATEWAY_TOKEN=$BENCH_GATEWAY_TOKEN LOG_LEVEL=warning \
    ACCOUNTS_ADDR=127.0.0.1:$ACC_PORT SOCIAL_ADDR=127.0.0.1:$SOC_PORT \
    start_bg finance-bench "$FIN_BIN" --host 127.0.0.1 --port "$FIN_PORT" --data-dir "$WORK/finance-data"
  FIN_PID=$BG_PID
  wait_port "$FIN_PORT" 60 || { tail -20 "$WORK/finance-bench.log" >&2; exit 1; }

  FIN_BIG=100000; [ $QUICK = 1 ] && FIN_BIG=20000
  # Users, two households, 10 charges in the small one, FIN_BIG in the big one (8 in flight,
  # distinct keys: the CreateCharge row); checks the balances; prints
  # "charges/s|mean ms|token|small household|big household".
  FIN_RESULT=$(PYTHONPATH="$WORK/finance-py" "$PY" - "$ACC_PORT" "$SOC_PORT" "$FIN_PORT" "$FIN_BIG" <<'PYEOF'
import asyncio, sys, time, uuid
import grpc
from accounts.v1 import accounts_pb2 as apb, accounts_pb2_grpc as arpc
from social.v1 import social_pb2 as spb, social_pb2_grpc as srpc
from finance.v1 import finance_pb2 as fpb, finance_pb2_grpc as frpc
from common.v1 import types_pb2
acc_port, soc_port, fin_port, big = sys.argv[1:5]
big = int(big)
run = uuid.uuid4().hex[:6]
accounts = arpc.AccountsStub(grpc.insecure_channel(f"127.0.0.1:{acc_port}"))
users = []
for i in range(4):
    name = f"fin{run}{i}"
    s = accounts.SignUp(apb.SignUpRequest(username=name, email=f"{name}@example.com", password="correct horse battery"), timeout=60)
    users.append((s.user.user_id, s.session.access_token))
md = lambda u: [("authorization", f"Bearer {u[1]}")]

def household(name):
    social = srpc.SocialStub(grpc.insecure_channel(f"127.0.0.1:{soc_port}"))
    created = social.CreateHousehold(spb.CreateHouseholdRequest(name=name, invite_emails=[f"fin{run}{i}@example.com" for i in range(1, 4)]),
                                     metadata=md(users[0]), timeout=10)
    for i, invite in zip(range(1, 4), created.invites):
        social.JoinHousehold(spb.JoinHouseholdRequest(invite_code=invite.invite_code), metadata=md(users[i]), timeout=10)
    return created.household.household_id

small, large = household("small"), household("big")

async def fill(hid, n, in_flight=8):
    async with grpc.aio.insecure_channel(f"127.0.0.1:{fin_port}") as ch:
        stub = frpc.FinanceStub(ch)
        next_i, latencies = [0], []
        async def worker():
            while next_i[0] < n:
                i = next_i[0]; next_i[0] += 1
                r = fpb.CreateChargeRequest(household_id=hid, description=f"Bench {i}", amount=types_pb2.Money(amount_cents=100 + i % 900, currency="EUR"),
                                            split_mode=fpb.SPLIT_MODE_EQUAL, housemate_user_ids=[users[1][0], users[2][0], users[3][0]],
                                            idempotency_key=f"bench-{hid}-{i}")
                t = time.perf_counter()
                resp = await stub.CreateCharge(r, metadata=md(users[0]), timeout=30)
                assert not resp.replayed
                latencies.append(time.perf_counter() - t)
        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(in_flight)))
        return n / (time.perf_counter() - start), 1000 * sum(latencies) / len(latencies)

asyncio.run(fill(small, 10))
rate, mean_ms = asyncio.run(fill(large, big))
# Check: the caller's balances in the big household are the sums of what was charged.
fin = frpc.FinanceStub(grpc.insecure_channel(f"127.0.0.1:{fin_port}"))
total = sum(100 + i % 900 for i in range(big))
b = fin.GetBalances(fpb.GetBalancesRequest(household_id=large), metadata=md(users[0]), timeout=30)
assert sum(x.amount.amount_cents for x in b.balances) == total, (b, total)
print(f"{rate:.1f}|{mean_ms:.2f}|{users[0][1]}|{small}|{large}")
PYEOF
  ) || { echo "bench: finance driver failed" >&2; tail -20 "$WORK/finance-bench.log" >&2; exit 1; }
  IFS='|' read -r FIN_RATE FIN_MS FIN_TOKEN FIN_SMALL FIN_LARGE <<<"$FIN_RESULT"
  ROWS+=("finance CreateCharge (durable)|8 in flight|$FIN_RATE|$(awk -v m="$FIN_MS" 'BEGIN{printf "%.0f", m*1000}')")
  echo "bench: finance CreateCharge $FIN_RATE/s (mean $FIN_MS ms) at 8 in flight, $FIN_BIG charges in one household" >&2

  FIN_URL="http://127.0.0.1:$FIN_PORT/finance.v1.Finance/GetBalances"
  for which in small large; do
    hid=$FIN_SMALL
    [ $which = large ] && hid=$FIN_LARGE
    grpc_body "$WORK/getbalances-$which.bin" finance.v1.GetBalancesRequest "household_id: \"$hid\"" finance/v1/finance.proto -IProto -I/usr/include
  done
  # The two latency rows alternate, three rounds each, and the ratio is of their medians: on a
  # shared machine one row measured while something else ran would decide the ratio alone.
  for round in 1 2 3; do
    for which in small large; do
      label="finance GetBalances 10 tx (round $round)"
      [ $which = large ] && label="finance GetBalances $FIN_BIG tx (round $round)"
      # Three balances of ~60 bytes each; errors carry no DATA.
      MIN_DATA_PER_REQUEST=100 h2load_row "$label" latency "$FIN_URL" "$WORK/getbalances-$which.bin" "${GRPC_HEADERS[@]}" \
        -H "authorization: Bearer $FIN_TOKEN"
    done
  done
  MIN_DATA_PER_REQUEST=100 h2load_row "finance GetBalances $FIN_BIG tx" throughput "$FIN_URL" "$WORK/getbalances-large.bin" \
    "${GRPC_HEADERS[@]}" -H "authorization: Bearer $FIN_TOKEN"
  fin_median() { printf '%s\n' "${ROWS[@]}" | awk -F'|' -v pat="$1" '$1 ~ pat && $2 == "latency" {print $4}' | sort -n | sed -n 2p; }
  FIN_SMALL_US=$(fin_median "GetBalances 10 tx [(]round")
  FIN_LARGE_US=$(fin_median "GetBalances $FIN_BIG tx [(]round")
  echo "bench: finance GetBalances latency ratio $FIN_BIG tx / 10 tx = $(awk -v a="$FIN_LARGE_US" -v b="$FIN_SMALL_US" 'BEGIN{printf "%.3f", a/b}') (goal ≤ 1.2; medians of 3 alternating rounds: $FIN_LARGE_US µs vs $FIN_SMALL_US µs)" >&2
  rss_row "finance-service after load" "$FIN_PID"
  kill -0 "$FIN_PID" || { echo "bench: finance-service died" >&2; tail -20 "$WORK/finance-bench.log" >&2; exit 1; }
fi
