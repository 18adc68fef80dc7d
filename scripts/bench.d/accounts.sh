# scripts/bench hook (sourced): accounts-service.
#  - GetProfile (an authenticated read: token check + one SQLite read) through h2load in both
#    shapes, the request built by `protoc --encode`, the access token in `authorization`;
#  - sign-ups and log-ins per second at 4 calls in flight (grpcio), bounded by scrypt at the
#    service's default cost, which the row labels name (N, r, p).
if [ $BUILD = 1 ]; then
  echo "bench: scripts/swift-release --product accounts-service" >&2
  "$ROOT"/scripts/swift-release --product accounts-service >&2
fi
ACC_BIN=${ACCOUNTS_BINARY:-$ROOT/.build/release/accounts-service}
if [ ! -x "$ACC_BIN" ]; then
  echo "bench: accounts rows skipped ($ACC_BIN missing)" >&2
else
  ACC_PORT=$(free_port)
  mkdir -p "$WORK/accounts-data"
  # ACCESS_LOG=off: a line per call on stderr would be measured instead of the service (every
  # other process here runs at LOG_LEVEL=warning, which hides access lines too).
  SERVICE_TOKEN=$BENCH_SERVICE_TOKEN GATEWAY_TOKEN=$BENCH_GATEWAY_TOKEN LOG_LEVEL=info ACCESS_LOG=off ACCOUNTS_SIGNUPS_PER_ADDRESS=1000000 \
    start_bg accounts-bench "$ACC_BIN" --host 127.0.0.1 --port "$ACC_PORT" --data-dir "$WORK/accounts-data"
  ACC_PID=$BG_PID
  wait_port "$ACC_PORT" 60 || { tail -20 "$WORK/accounts-bench.log" >&2; exit 1; }
  ACC_SCRYPT=$(grep -o 'scrypt(N=[0-9]*, r=[0-9]*, p=[0-9]*' "$WORK/accounts-bench.log" | head -1 | sed 's/scrypt(//')

  # Python stubs for the checked calls and the sign-up/log-in loop.
  mkdir -p "$WORK/accounts-py"
  "$PY" -m grpc_tools.protoc -IProto -I/usr/include --python_out="$WORK/accounts-py" --grpc_python_out="$WORK/accounts-py" \
    accounts/v1/accounts.proto common/v1/options.proto common/v1/types.proto

  # Sign-ups, then log-ins, 4 in flight; prints "signups/s|mean ms|logins/s|mean ms|token".
  ACC_N=200; [ $QUICK = 1 ] && ACC_N=40
  ACC_RESULT=$(PYTHONPATH="$WORK/accounts-py" "$PY" - "$ACC_PORT" "$ACC_N" <<'PYEOF'
import sys, time, threading
import grpc
from accounts.v1 import accounts_pb2 as pb, accounts_pb2_grpc as rpc
port, n = int(sys.argv[1]), int(sys.argv[2])
stub = rpc.AccountsStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
password = "correct horse battery staple"

def run(make_call):
    latencies, lock, next_i = [], threading.Lock(), [0]
    def worker():
        while True:
            with lock:
                i = next_i[0]; next_i[0] += 1
            if i >= n: return
            t = time.perf_counter()
            make_call(i)
            with lock: latencies.append(time.perf_counter() - t)
    threads = [threading.Thread(target=worker) for _ in range(4)]
    start = time.perf_counter()
    for t in threads: t.start()
    for t in threads: t.join()
    elapsed = time.perf_counter() - start
    return n / elapsed, 1000 * sum(latencies) / len(latencies)

signup = run(lambda i: stub.SignUp(pb.SignUpRequest(username=f"bench{i}", email=f"bench{i}@example.com", password=password), timeout=30))
login = run(lambda i: stub.LogIn(pb.LogInRequest(username=f"bench{i}", password=password), timeout=30))
token = stub.LogIn(pb.LogInRequest(username="bench0", password=password), timeout=30).session.access_token
# Checked GetProfile first (h2load counts any HTTP 200 as success).
profile = stub.GetProfile(pb.GetProfileRequest(username="bench1"), metadata=[("authorization", f"Bearer {token}")], timeout=10)
assert profile.profile.username == "bench1", profile
print(f"{signup[0]:.1f}|{signup[1]:.1f}|{login[0]:.1f}|{login[1]:.1f}|{token}")
PYEOF
  ) || { echo "bench: accounts sign-up/log-in loop failed" >&2; tail -20 "$WORK/accounts-bench.log" >&2; exit 1; }
  IFS='|' read -r ACC_SIGNUPS ACC_SIGNUP_MS ACC_LOGINS ACC_LOGIN_MS ACC_TOKEN <<<"$ACC_RESULT"
  # Rows in the report: req/s and mean latency (µs), shape "4 in flight".
  ROWS+=("accounts SignUp ($ACC_SCRYPT)|4 in flight|$ACC_SIGNUPS|$(awk -v m="$ACC_SIGNUP_MS" 'BEGIN{printf "%.0f", m*1000}')")
  ROWS+=("accounts LogIn ($ACC_SCRYPT)|4 in flight|$ACC_LOGINS|$(awk -v m="$ACC_LOGIN_MS" 'BEGIN{printf "%.0f", m*1000}')")
  echo "bench: accounts sign-ups $ACC_SIGNUPS/s (mean $ACC_SIGNUP_MS ms), log-ins $ACC_LOGINS/s (mean $ACC_LOGIN_MS ms), scrypt $ACC_SCRYPT, $(nproc) cores" >&2

  PROFILE_BODY=$WORK/getprofile.bin
  grpc_body "$PROFILE_BODY" accounts.v1.GetProfileRequest 'username: "bench1"' accounts/v1/accounts.proto -IProto -I/usr/include
  PROFILE_URL="http://127.0.0.1:$ACC_PORT/accounts.v1.Accounts/GetProfile"
  for shape in throughput latency; do
    # A GetProfileResponse for bench1 is ~60 bytes of DATA; errors carry none.
    MIN_DATA_PER_REQUEST=40 h2load_row "accounts GetProfile" $shape "$PROFILE_URL" "$PROFILE_BODY" \
      "${GRPC_HEADERS[@]}" -H "authorization: Bearer $ACC_TOKEN"
  done
  rss_row "accounts-service after load" "$ACC_PID"
  kill -0 "$ACC_PID" || { echo "bench: accounts-service died" >&2; tail -20 "$WORK/accounts-bench.log" >&2; exit 1; }
fi
