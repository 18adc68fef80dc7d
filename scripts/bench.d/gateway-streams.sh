# scripts/bench hook (sourced; `--only gateway-streams`): what a relayed server stream costs
# (issue 18, the streaming half). social.v1.Social/SubscribeNotifications held open by
# RELAY_STREAMS clients (100 per HTTP/2 connection, the gateway's and nghttpx's default limit; 10
# users holding 1,000 each), straight to social-service (the reference: a service holding the
# streams itself), through the gateway, and through nghttpx (the reference proxy, as in
# gateway.sh), each proxy a fresh process, in this run:
#  - memory: the proxy's VmRSS before and with every stream open and idle, per stream; its open
#    descriptors and threads while they are held;
#  - CPU: social then pushes RELAY_ROUNDS notifications to every stream (SendNotification to the
#    10 users, straight to social); the proxy's /proc utime+stime over them, per relayed message,
#    against nghttpx's (and social's own per message delivered).
# The client is raw HTTP/2 in Python (scripts/bench.d/relay_streams.py) with windows of 2^31-1,
# so it never sends WINDOW_UPDATE and costs little per message. social-service runs with
# SOCIAL_SUBSCRIPTIONS_PER_USER=1000 and SOCIAL_MAX_CONCURRENT_STREAMS=1000 (kept from when the
# gateway's upstream pool opened at most 16 connections per event loop; it now opens up to 128,
# docs/gateway.md, "Upstream connections"). Needs accounts.sh's accounts-service (ACC_PORT).
if [ $BUILD = 1 ]; then
  echo "bench: scripts/swift-release --product gateway --product social-service" >&2
  "$ROOT"/scripts/swift-release --product gateway >&2
  "$ROOT"/scripts/swift-release --product social-service >&2
fi
RS_SOC_BIN=${SOCIAL_BINARY:-$ROOT/.build/release/social-service}
RS_GW_BIN=${GATEWAY_BINARY:-$ROOT/.build/release/gateway}
if [ ! -x "$RS_SOC_BIN" ] || [ ! -x "$RS_GW_BIN" ] || [ -z "${ACC_PORT:-}" ]; then
  echo "bench: relayed-stream rows skipped ($RS_SOC_BIN or $RS_GW_BIN missing, or no accounts-service from accounts.sh)" >&2
else
  RELAY_STREAMS=10000; RELAY_ROUNDS=20; [ $QUICK = 1 ] && { RELAY_STREAMS=2000; RELAY_ROUNDS=10; }
  RELAY_USERS=10
  RS_SOC_PORT=$(free_port)
  mkdir -p "$WORK/relay-social-data"
  SERVICE_TOKEN=$BENCH_SERVICE_TOKEN GATEWAY_TOKEN=$BENCH_GATEWAY_TOKEN LOG_LEVEL=warning ACCESS_LOG=off \
    ACCOUNTS_ADDR=127.0.0.1:$ACC_PORT TASKS_ADDR=127.0.0.1:$(free_port) \
    SOCIAL_SUBSCRIPTIONS_PER_USER=1000 SOCIAL_MAX_CONCURRENT_STREAMS=1000 \
    start_bg relay-social "$RS_SOC_BIN" --host 127.0.0.1 --port "$RS_SOC_PORT" --data-dir "$WORK/relay-social-data"
  RS_SOC_PID=$BG_PID
  wait_port "$RS_SOC_PORT" 60 || { tail -20 "$WORK/relay-social.log" >&2; exit 1; }

  mkdir -p "$WORK/relay-py"
  "$PY" -m grpc_tools.protoc -IProto -I/usr/include --python_out="$WORK/relay-py" --grpc_python_out="$WORK/relay-py" \
    accounts/v1/accounts.proto social/v1/social.proto common/v1/options.proto common/v1/types.proto
  # The users (accounts directly), their tokens and ids.
  PYTHONPATH="$WORK/relay-py" "$PY" - "$ACC_PORT" "$RELAY_USERS" "$WORK/relay-tokens.txt" "$WORK/relay-users.txt" <<'PYEOF'
import sys, time, grpc
from accounts.v1 import accounts_pb2 as apb, accounts_pb2_grpc as arpc
port, n, tokens_file, users_file = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
acc = arpc.AccountsStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
stamp = int(time.time())
users = [acc.SignUp(apb.SignUpRequest(username=f"r{stamp}x{i}", email=f"r{stamp}x{i}@example.com",
                                      password="correct horse battery staple"), timeout=60) for i in range(n)]
open(tokens_file, "w").write("".join(f"{u.session.access_token}\n" for u in users))
open(users_file, "w").write("".join(f"{u.user.user_id}\n" for u in users))
PYEOF

  # relay_target LABEL PORT PIDS: one run of relay_streams.py; its key=value lines in RS_OUT.
  relay_target() {
    RS_OUT=$(PYTHONPATH="$WORK/relay-py" "$PY" "$ROOT/scripts/bench.d/relay_streams.py" "$2" "$3" "$RS_SOC_PID" \
      "$WORK/relay-tokens.txt" "$WORK/relay-users.txt" "$RELAY_STREAMS" 100 "$RELAY_ROUNDS" "$RS_SOC_PORT" "$BENCH_SERVICE_TOKEN") ||
      { echo "bench: relayed streams ($1) failed" >&2; tail -n 20 "$WORK/relay-social.log" >&2; return 1; }
    echo "bench: relayed streams, $1: $(echo "$RS_OUT" | tr '\n' ' ')" >&2
  }
  rs_value() { printf '%s\n' "$RS_OUT" | awk -F= -v k="$1" '$1 == k {print $2}'; }
  declare -A RS_KIB=() RS_CPU=() RS_SVC=() RS_FDS=() RS_THREADS=() RS_RATE=()
  RS_LABELS=()
  relay_record() {
    RS_LABELS+=("$1")
    RS_KIB[$1]=$(rs_value kib_per_stream); RS_CPU[$1]=$(rs_value cpu_us_per_message)
    RS_SVC[$1]=$(rs_value service_cpu_us_per_message); RS_FDS[$1]=$(rs_value fds); RS_THREADS[$1]=$(rs_value threads)
    RS_RATE[$1]=$(awk -v m="$(rs_value messages)" -v s="$(rs_value seconds)" 'BEGIN { printf "%.0f", m / s }')
    RSS_ROWS+=("$1, before the streams|$(rs_value rss_before)" "$1 + $RELAY_STREAMS idle streams|$(rs_value rss_held)")
  }

  # The reference first, while social is fresh (memory freed by earlier streams would hide the cost).
  relay_target "social-service direct" "$RS_SOC_PORT" "$RS_SOC_PID" && relay_record "social-service direct"

  RS_GW_PORT=$(free_port)
  mkdir -p "$WORK/relay-gateway-data"
  DATA_DIR=$WORK/relay-gateway-data GATEWAY_TOKEN=$BENCH_GATEWAY_TOKEN LOG_LEVEL=warning ACCESS_LOG=off \
    ACCOUNTS_ADDR=127.0.0.1:$ACC_PORT SOCIAL_ADDR=127.0.0.1:$RS_SOC_PORT GATEWAY_UPSTREAMS=accounts,social \
    GATEWAY_ADDRESS_RATE=0 GATEWAY_USER_RATE=0 \
    start_bg relay-gateway "$RS_GW_BIN" --host 127.0.0.1 --port "$RS_GW_PORT"
  RS_GW_PID=$BG_PID
  wait_port "$RS_GW_PORT" || { tail -20 "$WORK/relay-gateway.log" >&2; exit 1; }
  relay_target gateway "$RS_GW_PORT" "$RS_GW_PID" && relay_record gateway
  kill -TERM "$RS_GW_PID" 2>/dev/null; wait "$RS_GW_PID" 2>/dev/null || true  # not beside nghttpx's run

  RS_NGHTTPX_BIN=$(nghttpx_binary)
  if [ -n "$RS_NGHTTPX_BIN" ]; then
    RS_NX_PORT=$(free_port)
    start_bg relay-nghttpx "$RS_NGHTTPX_BIN" --conf=/dev/null "--frontend=127.0.0.1,$RS_NX_PORT;no-tls" \
      "--backend=127.0.0.1,$RS_SOC_PORT;;proto=h2" "--workers=$(nproc)" --no-ocsp \
      --errorlog-file="$WORK/relay-nghttpx-error.log"
    RS_NX_PID=$BG_PID
    if wait_port "$RS_NX_PORT" && sleep 0.5; then
      # nghttpx's master forks a worker process that serves (its threads are the workers).
      RS_NX_PIDS=$RS_NX_PID$(pgrep -P "$RS_NX_PID" | sed 's/^/,/' | tr -d '\n')
      relay_target nghttpx "$RS_NX_PORT" "$RS_NX_PIDS" && relay_record nghttpx
    else
      echo "bench: nghttpx did not start: no reference proxy row" >&2
    fi
  else
    echo "bench: nghttpx (Debian's nghttp2-proxy) unavailable: no reference proxy row" >&2
  fi

  EXTRA_LINES+=("$(printf '%-26s %10s %8s %8s %14s %12s %14s %12s' "$RELAY_STREAMS relayed streams" "KiB/stream" "fds" "threads" \
                   "CPU µs/message" "vs nghttpx" "social µs/msg" "messages/s")")
  for label in "${RS_LABELS[@]}"; do
    EXTRA_LINES+=("$(printf '%-26s %10s %8s %8s %14s %12s %14s %12s' "$label" "${RS_KIB[$label]}" "${RS_FDS[$label]}" \
      "${RS_THREADS[$label]}" "${RS_CPU[$label]}" \
      "$(awk -v a="${RS_CPU[$label]}" -v b="${RS_CPU[nghttpx]:-}" -v direct="${label%% *}" \
         'BEGIN { if (b > 0 && direct != "social-service") printf "%.2f", a / b; else print "-" }')" \
      "${RS_SVC[$label]}" "${RS_RATE[$label]}")")
  done
  EXTRA_LINES+=("  (100 streams per connection; $RELAY_ROUNDS notifications to every stream for the CPU figures; social's row: the service itself, no proxy)")
  if [ -n "${RS_CPU[gateway]:-}" ] && [ -n "${RS_CPU[nghttpx]:-}" ]; then
    echo "bench: relayed server streams: gateway ${RS_KIB[gateway]} KiB per idle stream (nghttpx ${RS_KIB[nghttpx]}), ${RS_CPU[gateway]} µs per relayed message (nghttpx ${RS_CPU[nghttpx]})" >&2
  fi
  kill -0 "$RS_SOC_PID" || { echo "bench: social-service died" >&2; tail -n 20 "$WORK/relay-social.log" >&2; exit 1; }
fi
