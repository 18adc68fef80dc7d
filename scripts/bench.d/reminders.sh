# scripts/bench hook (sourced): tasks' automatic reminders, in-process (`tasks-bench reminders`,
# release build; Sources/Tasks/README.md, "Automatic reminders"): 100,000 chores stored as before
# reminders existed, 1,000 due on every other day; the backfill that gives each its
# pending reminder at the start; one scan pass when nothing is due (p50 and mean of 200 passes:
# what the scanner costs per wake-up); one pass that fires 1,000 due reminders (each queues its
# notification in the outbox and advances its row; mean of three rounds, each checked to send
# exactly 1,000). Wall time on the shared machine.
if [ $BUILD = 1 ]; then
  echo "bench: scripts/swift-release --product tasks-bench" >&2
  "$ROOT"/scripts/swift-release --product tasks-bench >&2
fi
TB_BIN=$ROOT/.build/release/tasks-bench
if [ ! -x "$TB_BIN" ]; then
  echo "bench: reminder rows skipped ($TB_BIN missing)" >&2
else
  TB_N=100000
  TB_OUT=$("$TB_BIN" reminders "$TB_N")
  tbv() { printf '%s\n' "$TB_OUT" | sed -n "s/^$1=//p" | head -1; }
  EXTRA_LINES+=(
    "reminders: $(tbv reminders_chores) chores pending: one scan pass with nothing due p50 $(tbv reminders_idle_pass_p50_us) µs (mean $(tbv reminders_idle_pass_mean_us) µs); one pass firing 1,000 due $(tbv reminders_fire_1000_ms) ms (rounds $(tbv reminders_fire_1000_rounds_ms) ms); backfill of every chore's pending reminder at the start $(tbv reminders_backfill_s) s"
  )
fi
