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
    ok = re.search(r"status codes: (\d+) 2xx", out)
    data = re.search(r"traffic: .*?\((\d+)\) data", out)
    rps = re.search(r"finished in [^,]+, ([\d.]+) req/s", out)
    if not (ok and data and rps and int(ok.group(1)) == n and int(data.group(1)) >= min_bytes * n):
        sys.exit(f"bench: {what}: port {port}: not {n} answers: {out[-500:]}")
    return float(rps.group(1))


def nanoseconds(pids):
    """CPU time of every thread of `pids` in nanoseconds (schedstat)."""
    total = 0
    for pid in pids:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
    return total
