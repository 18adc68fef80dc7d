"""Issue 18's figure: the gateway against nghttpx (nghttp2's C reverse proxy, as many workers as the
gateway has event loops), both in front of the same accounts-service, in epochs of fresh proxies.

    fresh_proxies.py EPOCHS ROUNDS CALLS GATEWAY_BIN NGHTTPX_BIN ACCOUNTS_PORT ACCOUNTS_PID KEYS_BODY \
        [PROFILE_BODY TOKEN] WORK

Each epoch starts a gateway and an nghttpx afresh (a proxy instance keeps its luck, good or bad, for
its whole life on this VM: fresh_pairs.py), runs ROUNDS rounds of CALLS calls through each, alternating
which goes first, for the public read (`GetSigningKeys`) and, given a body and token, the authenticated
one (`GetProfile`: the gateway verifies the token, nghttpx passes it on), and stops them. Per round:
each proxy's calls per second, its CPU per relayed call, and that CPU divided by the accounts-service's
CPU per call in the same round (what repeats here: the host moves every process alike). Printed per
read: the medians over all rounds.

Then, per epoch and read, the latency each proxy adds at one call in flight, with every process on
CPU 0 for the while (h2load, the proxies, the accounts-service's threads): a lone call then costs its
CPU work and context switches only, no wakeup lands on another core by luck, and the figure holds to
a µs or two run to run (unpinned it moves ±15 µs: the single-round rows above say little). One round
of LONE_CALLS calls straight to the accounts-service, through the gateway and through nghttpx, in
alternating order; what a proxy adds is its mean less the direct one. Printed: the medians over the
epochs, and the goal (the gateway adds no more than nghttpx).
"""
import os
import shutil
import statistics
import sys

from bench_procs import (children, free_port, gateway_env, h2load, lone_latency, nanoseconds, nghttpx_cmd, nghttpx_env, pin, start,
                         stop)

epochs, rounds, calls = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
gateway_bin, nghttpx_bin, acc_port, acc_pid, keys_body = sys.argv[4:9]
rest = sys.argv[9:]
profile_body, token = (rest[0], rest[1]) if len(rest) == 3 else ("", "")
work = rest[-1]
env = dict(os.environ)
reads = [("public read", "/accounts.v1.Accounts/GetSigningKeys", keys_body, [], 32)]
if profile_body and token:
    reads.append(("authenticated read", "/accounts.v1.Accounts/GetProfile", profile_body, ["-H", f"authorization: Bearer {token}"], 40))


def start_proxies(epoch):
    d = f"{work}/proxies/{epoch}"
    os.makedirs(f"{d}/gateway")
    gw_port, nx_port = free_port(), free_port()
    gw = start([gateway_bin, "--host", "127.0.0.1", "--port", str(gw_port)], gateway_env(env, f"{d}/gateway", acc_port),
               f"{d}/gateway.log", gw_port, "issue 18 epochs")
    nx = start(nghttpx_cmd(nghttpx_bin, nx_port, acc_port, os.cpu_count(), f"{d}/nghttpx-error.log"), nghttpx_env(env),
               f"{d}/nghttpx.log", nx_port, "issue 18 epochs")
    return {"gateway": (gw_port, gw), "nghttpx": (nx_port, nx)}, [gw, nx]


LONE_CALLS = int(os.environ.get("LONE_CALLS", "5000"))
ACC_CPUS = ",".join(map(str, sorted(os.sched_getaffinity(int(acc_pid)))))  # restored after each pinned while


def run(port, pids, path, body, extra, min_bytes):
    p0, b0 = nanoseconds(pids), nanoseconds([acc_pid])
    rps = h2load(port, path, body, calls, extra, min_bytes, "issue 18 epochs")
    proxy, backend = nanoseconds(pids) - p0, nanoseconds([acc_pid]) - b0
    return rps, proxy / calls / 1000, proxy / backend


got = {label: {"ratio": [], "gateway": [], "nghttpx": [], "rel gateway": [], "rel nghttpx": [],
              "direct": [], "adds gateway": [], "adds nghttpx": []} for label, *_ in reads}
shutil.rmtree(f"{work}/proxies", ignore_errors=True)
for epoch in range(epochs):
    procs = []
    try:
        proxies, procs = start_proxies(epoch)
        pids = {k: children(p.pid) for k, (_, p) in proxies.items()}  # nghttpx's workers are its children
        for label, path, body, extra, min_bytes in reads:
            for k in proxies:
                h2load(proxies[k][0], path, body, max(2000, calls // 5), extra, min_bytes, "issue 18 epochs")  # warm
            for r in range(rounds):
                order = ["gateway", "nghttpx"] if (epoch + r) % 2 == 0 else ["nghttpx", "gateway"]
                one = {k: run(proxies[k][0], pids[k], path, body, extra, min_bytes) for k in order}
                g = got[label]
                g["ratio"].append(one["gateway"][0] / one["nghttpx"][0])
                for k in one:
                    g[k].append(one[k][1])
                    g[f"rel {k}"].append(one[k][2])
        # One call in flight, everything on CPU 0 for the while.
        try:
            pin([int(acc_pid), *[p for ps in pids.values() for p in ps]], "0")
            for label, path, body, extra, min_bytes in reads:
                ports = {"direct": int(acc_port), "gateway": proxies["gateway"][0], "nghttpx": proxies["nghttpx"][0]}
                order = list(ports) if epoch % 2 == 0 else list(ports)[::-1]
                mean = {k: lone_latency(ports[k], path, body, LONE_CALLS, extra, min_bytes, "issue 18 latency", cpu="0") for k in order}
                g = got[label]
                g["direct"].append(mean["direct"])
                g["adds gateway"].append(mean["gateway"] - mean["direct"])
                g["adds nghttpx"].append(mean["nghttpx"] - mean["direct"])
        finally:
            pin([int(acc_pid)], ACC_CPUS, check=False)
    finally:
        stop(procs)
m = statistics.median
for label, *_ in reads:
    g = got[label]
    print(f"bench: issue 18, {epochs} epochs of fresh proxies x {rounds} rounds, {label}: gateway {m(g['ratio']):.2f}x nghttpx's calls "
          f"per second (median of {len(g['ratio'])}; rounds {min(g['ratio']):.2f}-{max(g['ratio']):.2f}x); CPU per relayed call gateway "
          f"{m(g['gateway']):.2f} µs, nghttpx {m(g['nghttpx']):.2f} µs; per accounts-service call in the same round gateway "
          f"{m(g['rel gateway']):.3f}, nghttpx {m(g['rel nghttpx']):.3f} (gateway {m(g['rel gateway']) / m(g['rel nghttpx']):.2f}x "
          f"nghttpx's CPU) (goal >= 1.0x calls per second: {'met' if m(g['ratio']) >= 1.0 else 'NOT met'})")
for label, *_ in reads:
    g = got[label]
    diffs = [a - b for a, b in zip(g["adds gateway"], g["adds nghttpx"])]
    print(f"bench: issue 18, one call in flight, all on CPU 0, {epochs} epochs of {LONE_CALLS} calls, {label}: direct "
          f"{m(g['direct']):.1f} µs; the gateway adds {m(g['adds gateway']):.1f} µs, nghttpx {m(g['adds nghttpx']):.1f} µs "
          f"(gateway less nghttpx per epoch {min(diffs):+.1f} to {max(diffs):+.1f} µs) "
          f"(goal: the gateway adds no more: {'met' if m(g['adds gateway']) <= m(g['adds nghttpx']) else 'NOT met'})")
