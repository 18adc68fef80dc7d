# scripts/bench hook (sourced): matchmaking-service. Needs accounts.sh's accounts-service (ACC_PORT:
# the user and the token keys). Rows (Sources/Matchmaking/README.md, "Measured"):
#  - the matchmaker (in-process, release build, `matchmaking-bench engine`; CPU time of the
#    measuring thread, as the machine is shared): one pairing pass at
#    1k / 10k / 100k queued players of spread ratings (µs, and ns per n·log2 n: flat = n log n);
#    100,000 players arriving over 10 s with a pass every 200 ms as the service ticks: pairs
#    formed per second of matchmaker time, and each player's wait until paired (p50/p99);
#  - the rules engine: µs per SubmitMove (validate + apply) on a 15 × 15 board late in a game;
#  - the leaderboard index at 100,000 ranked players: top 10 + my rank (µs), one rating update (µs);
#  - end to end over gRPC against matchmaking-service (`matchmaking-bench e2e`, 16 in flight):
#    SubmitMove req/s (each a durable write: the move, the event, the match), with GetMatch
#    req/s by the same client in the same run as the reference (ratio); GetLeaderboard with my
#    rank at 100,000 rated players (p50/p99 µs, one call at a time).
if [ $BUILD = 1 ]; then
  echo "bench: scripts/swift-release --product matchmaking-service --product matchmaking-bench" >&2
  "$ROOT"/scripts/swift-release --product matchmaking-service >&2
  "$ROOT"/scripts/swift-release --product matchmaking-bench >&2
fi
MM_BIN=${MATCHMAKING_BINARY:-$ROOT/.build/release/matchmaking-service}
MMB_BIN=$ROOT/.build/release/matchmaking-bench
if [ ! -x "$MM_BIN" ] || [ ! -x "$MMB_BIN" ] || [ -z "${ACC_PORT:-}" ]; then
  echo "bench: matchmaking rows skipped ($MM_BIN or $MMB_BIN missing, or no accounts-service from accounts.sh)" >&2
else
  MM_SECS=10; MM_PLAYERS=100000; [ $QUICK = 1 ] && { MM_SECS=3; MM_PLAYERS=20000; }
  ENGINE=$("$MMB_BIN" engine)
  mmv() { printf '%s\n' "$ENGINE" "${MM_E2E:-}" | sed -n "s/^$1=//p" | head -1; }
  MM_USER=$("$MMB_BIN" signup "$ACC_PORT")
  MM_USER_ID=$(printf '%s\n' "$MM_USER" | sed -n 's/^user_id=//p')
  MM_TOKEN=$(printf '%s\n' "$MM_USER" | sed -n 's/^token=//p')
  mkdir -p "$WORK/matchmaking-data"
  "$MMB_BIN" seed "$WORK/matchmaking-data" "$MM_USER_ID" "$MM_PLAYERS"
  MM_PORT=$(free_port)
  SERVICE_TOKEN=$BENCH_SERVICE_TOKEN GATEWAY_TOKEN=$BENCH_GATEWAY_TOKEN LOG_LEVEL=warning ACCOUNTS_ADDR=127.0.0.1:$ACC_PORT \
    SOCIAL_ADDR=127.0.0.1:$(free_port) start_bg matchmaking-bench "$MM_BIN" --host 127.0.0.1 --port "$MM_PORT" --data-dir "$WORK/matchmaking-data"
  MM_PID=$BG_PID
  wait_port "$MM_PORT" 60 || { tail -20 "$WORK/matchmaking-bench.log" >&2; exit 1; }
  MM_E2E=$("$MMB_BIN" e2e "$MM_PORT" "$MM_TOKEN" "$MM_SECS" 16)
  # Resident memory after the load (the basis of deploy/kubernetes/matchmaking.yaml's requests).
  rss_row "matchmaking-service after load" "$MM_PID"
  EXTRA_LINES+=(
    "matchmaking: one pairing pass: 1k $(mmv pass_1000_us) µs, 10k $(mmv pass_10000_us) µs, 100k $(mmv pass_100000_us) µs; per n·log2 n: $(mmv pass_1000_ns_per_nlogn) / $(mmv pass_10000_ns_per_nlogn) / $(mmv pass_100000_ns_per_nlogn) ns (flat = n log n)"
    "matchmaking: 100,000 players arriving over 10 s, a pass every 200 ms: $(mmv burst_pairs_per_s) pairs formed per second of matchmaker time; wait until paired p50 $(mmv burst_wait_p50_s) s, p99 $(mmv burst_wait_p99_s) s; unpaired at the end $(mmv burst_unpaired); largest queue $(mmv burst_max_queue)"
    "matchmaking: rules engine, SubmitMove on 15 × 15 at turn $(mmv move_turn) ($(mmv move_shapes) shapes, $(mmv move_free_cells) free cells, $(mmv move_steps) steps): $(mmv move_validate_us) µs"
    "matchmaking: leaderboard index at 100,000 ranked: top 10 + my rank $(mmv leaderboard_index_us) µs; one rating update $(mmv leaderboard_update_us) µs"
    "matchmaking: end to end (16 in flight): SubmitMove $(mmv submit_move_rps) req/s (p50 $(mmv submit_move_p50_ms) ms, p99 $(mmv submit_move_p99_ms) ms, errors $(mmv submit_move_errors)); GetMatch $(mmv get_match_rps) req/s; ratio $(awk -v a="$(mmv submit_move_rps)" -v b="$(mmv get_match_rps)" 'BEGIN{printf "%.2f", a/b}')"
    "matchmaking: GetLeaderboard with my rank at $(mmv leaderboard_ranked) ranked over gRPC: p50 $(mmv leaderboard_rpc_p50_us) µs, p99 $(mmv leaderboard_rpc_p99_us) µs"
  )
fi
