"""Processes and h2load runs for the bench's epoch sections (fresh_pairs.py, fresh_proxies.py)."""
import os
import re
import socket
import subprocess
import sys
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd, env, log, port, what):
    """Starts `cmd` and waits until it listens on `port` (exits naming `what` if it dies first)."""
    proc = subprocess.Popen(cmd, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT)
    for _ in range(600):
        if proc.poll() is not None:
            sys.exit(f"bench: {what}: a process exited: {open(log).read()[-500:]}")
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    sys.exit(f"bench: {what}: port {port} never opened")


def stop(procs):
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait()


def children(pid):
    """`pid` and its direct children (nghttpx's workers)."""
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [pid] + [int(p) for p in out]


def h2load(port, path, body, n, extra, min_bytes, what):
    """Calls per second of `n` gRPC calls through `port`, each checked: a 2xx with at least
    `min_bytes` of DATA (a gRPC error is an HTTP 200 too). `H2LOAD_SHAPE` (e.g. "1 1") replaces
    the clients and calls in flight of each (4 and 32): `scripts/per-call counts` of a lone call."""
    clients, in_flight = (os.environ.get("H2LOAD_SHAPE") or "4 32").split()
    out = subprocess.run(
        ["h2load", "-t", "1", "-c", clients, "-m", in_flight, "-n", str(n), f"http://127.0.0.1:{port}{path}", "-d", body,
         "-H", "content-type: application/grpc", "-H", "te: trailers", *extra], capture_output=True, text=True).stdout
    rps = re.search(r"finished in [^,]+, ([\d.]+) req/s", out)
    if not (rps and answered(out, n, min_bytes)):
        sys.exit(f"bench: {what}: port {port}: not {n} answers: {out[-500:]}")
    return float(rps.group(1))


def answered(out, n, min_bytes):
    """Whether h2load's output shows `n` 2xx answers with at least `min_bytes` of DATA each."""
    ok = re.search(r"status codes: (\d+) 2xx", out)
    data = re.search(r"traffic: .*?\((\d+)\) data", out)
    return bool(ok and data and int(ok.group(1)) == n and int(data.group(1)) >= min_bytes * n)


def gateway_env(env, data_dir, accounts_port, **extra):
    """The gateway's environment when it relays to one accounts-service, the way every relay
    measurement here runs it: that upstream only, rate limits off, warnings logged."""
    return dict(env, LOG_LEVEL="warning", DATA_DIR=data_dir, ACCOUNTS_ADDR=f"127.0.0.1:{accounts_port}", GATEWAY_UPSTREAMS="accounts",
                GATEWAY_ADDRESS_RATE="0", GATEWAY_USER_RATE="0", **extra)


def nghttpx_cmd(binary, port, backend_port, workers, errorlog):
    """nghttpx, the reference proxy, in front of the accounts-service at `backend_port` (h2c both sides)."""
    return [binary, "--conf=/dev/null", f"--frontend=127.0.0.1,{port};no-tls", f"--backend=127.0.0.1,{backend_port};;proto=h2",
            f"--workers={workers}", "--no-ocsp", f"--errorlog-file={errorlog}"]


def nghttpx_env(env):
    """nghttpx's environment: glibc's tunables are ours, not jemalloc's."""
    return {k: v for k, v in env.items() if k != "GLIBC_TUNABLES"}


def pin(pids, cpus, check=True):
    """Every thread of `pids` on `cpus` (taskset's list form: "0", "0-1")."""
    for pid in pids:
        subprocess.run(["taskset", "-a", "-c", "-p", cpus, str(pid)], check=check, capture_output=True)


def lone_latency(port, path, body, n, extra, min_bytes, what, cpu=None):
    """Mean µs per call of `n` calls, one in flight (h2load on `cpu` if given), each checked as
    `h2load` checks them."""
    out = subprocess.run(
        [*(["taskset", "-c", cpu] if cpu is not None else []), "h2load", "-t", "1", "-c", "1", "-m", "1", "-n", str(n),
         f"http://127.0.0.1:{port}{path}", "-d", body, "-H", "content-type: application/grpc", "-H", "te: trailers", *extra],
        capture_output=True, text=True).stdout
    line = next((x for x in out.splitlines() if x.startswith("time for request:")), None)
    if line is None or not answered(out, n, min_bytes):
        sys.exit(f"bench: {what}: port {port}: not {n} answers: {out[-500:]}")
    value, unit = line.split()[5][:-2], line.split()[5][-2:]
    return float(value) * (1000 if unit == "ms" else 1)


def nanoseconds(pids):
    """CPU time of every thread of `pids` in nanoseconds (schedstat)."""
    total = 0
    for pid in pids:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
    return total
