# scripts/bench hook (sourced): the gateway's cost. The same read RPC,
# accounts.v1.Accounts/GetSigningKeys (public: no token, so the rows measure the relay, not
# signature checks), straight to accounts-service and through the gateway, in both shapes, in
# this run. Rate limits are off for the gateway here.
if [ $BUILD = 1 ]; then
  echo "bench: swift build -c release --product gateway / accounts-service" >&2
  swift build -c release --product accounts-service >&2
  swift build -c release --product gateway >&2
fi
GW_BIN=${GATEWAY_BINARY:-$ROOT/.build/release/gateway}
ACCOUNTS_BIN=${ACCOUNTS_BINARY:-$ROOT/.build/release/accounts-service}
if [ ! -x "$GW_BIN" ] || [ ! -x "$ACCOUNTS_BIN" ]; then
  echo "bench: gateway rows skipped ($GW_BIN or $ACCOUNTS_BIN missing)" >&2
else
  ACCOUNTS_PORT_B=$(free_port)
  GATEWAY_PORT_B=$(free_port)
  mkdir -p "$WORK/data"
  DATA_DIR=$WORK/data SERVICE_TOKEN=bench-token LOG_LEVEL=warning \
    start_bg accounts-service "$ACCOUNTS_BIN" --host 127.0.0.1 --port "$ACCOUNTS_PORT_B"
  ACCOUNTS_PID=$BG_PID
  DATA_DIR=$WORK/data SERVICE_TOKEN=bench-token LOG_LEVEL=warning ACCOUNTS_ADDR=127.0.0.1:$ACCOUNTS_PORT_B \
    GATEWAY_UPSTREAMS=accounts GATEWAY_ADDRESS_RATE=0 GATEWAY_USER_RATE=0 \
    start_bg gateway "$GW_BIN" --host 127.0.0.1 --port "$GATEWAY_PORT_B"
  GATEWAY_PID=$BG_PID
  wait_port "$ACCOUNTS_PORT_B" 60 || { tail -20 "$WORK/accounts-service.log" >&2; exit 1; }
  wait_port "$GATEWAY_PORT_B" || { tail -20 "$WORK/gateway.log" >&2; exit 1; }
  # Checked calls first, both ways (h2load counts any HTTP 200 as success).
  "$PY" - "$ACCOUNTS_PORT_B" "$GATEWAY_PORT_B" <<'PYEOF'
import sys, grpc
for port in sys.argv[1:]:
    call = grpc.insecure_channel(f"127.0.0.1:{port}").unary_unary("/accounts.v1.Accounts/GetSigningKeys")
    response = call(b"", timeout=10)
    assert len(response) > 32, f"port {port}: GetSigningKeys answered {len(response)} bytes"
PYEOF
  KEYS_BODY=$WORK/getsigningkeys.bin
  printf '\x00\x00\x00\x00\x00' >"$KEYS_BODY"
  KEYS_PATH=/accounts.v1.Accounts/GetSigningKeys
  for shape in throughput latency; do
    MIN_DATA_PER_REQUEST=32 h2load_row "GetSigningKeys direct" $shape "http://127.0.0.1:$ACCOUNTS_PORT_B$KEYS_PATH" \
      "$KEYS_BODY" "${GRPC_HEADERS[@]}"
    MIN_DATA_PER_REQUEST=32 h2load_row "GetSigningKeys via gateway" $shape "http://127.0.0.1:$GATEWAY_PORT_B$KEYS_PATH" \
      "$KEYS_BODY" "${GRPC_HEADERS[@]}"
  done
  rss_row "gateway after load" "$GATEWAY_PID"
  # The gateway's cost, from the four rows just measured.
  "$PY" - "${ROWS[@]}" <<'PYEOF' >&2
import sys
rows = {}
for r in sys.argv[1:]:
    label, shape, rps, mean = r.split("|")
    rows[(label, shape)] = (float(rps), float(mean))
d, g = rows[("GetSigningKeys direct", "throughput")], rows[("GetSigningKeys via gateway", "throughput")]
dl, gl = rows[("GetSigningKeys direct", "latency")], rows[("GetSigningKeys via gateway", "latency")]
print(f"bench: gateway throughput {g[0]:.0f} req/s = {100 * g[0] / d[0]:.0f}% of direct ({d[0]:.0f}); target >= 60%")
print(f"bench: gateway adds {gl[1] - dl[1]:.0f} µs at one call in flight ({dl[1]:.0f} -> {gl[1]:.0f} µs); target <= 100 µs")
PYEOF
fi
