"""Issue 19's figure: what metrics and tracing at 1 % cost a relayed call, gateway and accounts-service
together, measured in epochs of fresh processes.

    fresh_pairs.py EPOCHS ROUNDS CALLS BODY GATEWAY_BIN ACCOUNTS_BIN WORK

Each epoch starts three pairs (a gateway in front of an accounts-service of its own): `off` (METRICS=0,
no tracing), `control` (the same as `off`) and `on` (metrics, tracing sampled at 1 % to a file, as
deployed); runs ROUNDS rounds of CALLS calls through each, in an order rotated every round; and stops
them. Per round: each pair's calls per second and CPU per call (both processes, from schedstat);
printed: the median over all rounds of `on` against the mean of `off` and `control` (configured
alike), and of `control`/`off` as the run's noise floor.

Why fresh processes: two instances of the same binaries, configured alike, differ by up to ±10 % in
calls per second for their whole life on this 2-core VM (thread placement, which loop gets which
connection, memory layout), so pairs started once measure their luck. `control` against `off` is the
run's own noise floor: what the figure would say if metrics and tracing cost nothing.
"""
import os
import shutil
import statistics
import sys

from bench_procs import free_port, gateway_env, h2load, nanoseconds, start, stop

epochs, rounds, calls = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
body, gateway_bin, accounts_bin, work = sys.argv[4:8]
CONFIGS = {
    "off": {"METRICS": "0"},
    "control": {"METRICS": "0"},
    "on": {"TRACE_EXPORT": "file:{dir}/spans.jsonl", "TRACE_SAMPLE_RATIO": "0.01"},
}
# Parts of `on`, for finding where a cost is (FRESH_PAIRS=off,metrics,tracing,on): not in the bench's run.
PARTS = {
    "metrics": {},
    "tracing": {"METRICS": "0", "TRACE_EXPORT": "file:{dir}/spans.jsonl", "TRACE_SAMPLE_RATIO": "0.01"},
}
env = dict(os.environ)


def start_pair(name, epoch):
    d = f"{work}/pairs/{epoch}-{name}"
    os.makedirs(f"{d}/accounts")
    os.makedirs(f"{d}/gateway")
    extra = {k: v.format(dir=d) for k, v in CONFIGS[name].items()}
    acc_port, gw_port = free_port(), free_port()
    acc = start([accounts_bin, "--host", "127.0.0.1", "--port", str(acc_port), "--data-dir", f"{d}/accounts"],
                dict(env, LOG_LEVEL="info", ACCESS_LOG="off", **extra), f"{d}/accounts.log", acc_port, "issue 19 epochs")
    gw = start([gateway_bin, "--host", "127.0.0.1", "--port", str(gw_port)],
               gateway_env(env, f"{d}/gateway", acc_port, **extra), f"{d}/gateway.log", gw_port, "issue 19 epochs")
    return gw_port, [gw, acc]


def run(port, procs, n):
    pids = [p.pid for p in procs]
    before = nanoseconds(pids)
    rps = h2load(port, "/accounts.v1.Accounts/GetSigningKeys", body, n, [], 32, "issue 19 epochs")
    return rps, (nanoseconds(pids) - before) / n / 1000


CONFIGS.update(PARTS)
names = os.environ.get("FRESH_PAIRS", "off,control,on").split(",")
assert names[0] == "off" and all(k in CONFIGS for k in names), names
ratios = {k: [] for k in names[1:]}
cpu_ratios = {k: [] for k in names[1:]}
cpu = {k: [] for k in names}
every = []  # each round's (calls per second, CPU per call) by pair
shutil.rmtree(f"{work}/pairs", ignore_errors=True)
for epoch in range(epochs):
    pairs = {}
    try:
        # Started in a rotated order too (the last started is not always the same pair).
        for k in names[epoch % len(names):] + names[:epoch % len(names)]:
            pairs[k] = start_pair(k, epoch)
        for k in names:
            run(*pairs[k], max(2000, calls // 5))  # connections, caches and the first page faults
        for r in range(rounds):
            shift = (epoch * rounds + r) % len(names)
            got = {k: run(*pairs[k], calls) for k in names[shift:] + names[:shift]}
            for k in ratios:
                ratios[k].append(got[k][0] / got["off"][0])
                cpu_ratios[k].append(got[k][1] / got["off"][1])
            for k in names:
                cpu[k].append(got[k][1])
            every.append(got)
    finally:
        stop([p for _, procs in pairs.values() for p in procs])
m = statistics.median
if names != ["off", "control", "on"]:
    for k in names[1:]:
        print(f"{k}/off: calls per second {m(ratios[k]):.3f} (rounds {min(ratios[k]):.3f}-{max(ratios[k]):.3f}), "
              f"CPU per call {m(cpu_ratios[k]):.3f} ({m(cpu['off']):.2f} -> {m(cpu[k]):.2f} µs)")
    sys.exit(0)
# `off` and `control` are configured alike: each round's baseline is their mean, and how far they
# are apart is the run's noise floor.
base = [((g["off"][0] + g["control"][0]) / 2, (g["off"][1] + g["control"][1]) / 2) for g in every]
on = [g["on"][0] / b[0] for g, b in zip(every, base)]
on_cpu = [g["on"][1] / b[1] for g, b in zip(every, base)]
cost = 100 * (1 - m(on))
floor = 100 * (1 - m(ratios["control"]))
verdict = "met" if cost <= 5 else "NOT met"
if abs(floor) > 1:
    verdict += f"; the noise floor is {abs(floor):.1f}%: more epochs (ISSUE19_EPOCHS) before drawing a conclusion"
print(f"bench: issue 19, {epochs} epochs of fresh processes x {rounds} rounds: metrics on and tracing at 1% against both off, "
      f"gateway and accounts: {abs(cost):.1f}% {'fewer' if cost >= 0 else 'more'} calls per second (median of {len(on)} rounds; "
      f"rounds {min(on):.3f}-{max(on):.3f}x), CPU per call {m(cpu['off'] + cpu['control']):.2f} -> {m(cpu['on']):.2f} µs "
      f"(median ratio {m(on_cpu):.3f}) (goal <= 5% fewer: {verdict})")
print(f"bench: issue 19, the run's noise floor: two pairs configured alike ('off' and 'control') differed by {floor:.1f}% "
      f"in calls per second (rounds {min(ratios['control']):.3f}-{max(ratios['control']):.3f}x), CPU per call ratio "
      f"{m(cpu_ratios['control']):.3f}")
