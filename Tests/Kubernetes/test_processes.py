"""The manifests' processes run as the manifests describe them: each workload's command, its
environment and its files laid out as its Secrets mount them (`/certs/tls.crt`, `tls.key`,
`ca.crt`; `/secrets/<name>/token`), on this machine with the paths moved under a temporary
directory and the ports moved to free ones. Every readiness and liveness probe then passes (the
services' native gRPC probes of their health-only h2c ports, the gateway's of its own port), with
one service stopped the gateway's still pass, a plain h2c health check of a service's main port
fails (why the services have a health port),
and every process exits 0 on SIGTERM well within its terminationGracePeriodSeconds.

Needs the built binaries (BIN_DIR, default .build/debug): run by the end-to-end stage, skipped by
the kubernetes stage, which needs no build."""
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "kubernetes"
BIN = Path(os.environ.get("BIN_DIR", ROOT / ".build" / "debug"))
SERVICES = {"accounts": 9101, "tasks": 9102, "finance": 9103, "social": 9104, "matchmaking": 9105}
EXES = [f"{s}-service" for s in SERVICES] + ["gateway", "health-probe", "dev-certs"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def workload(name):
    return next(d for d in yaml.safe_load_all((K8S / f"{name}.yaml").read_text()) if d and d["kind"] in ("StatefulSet", "Deployment"))


@pytest.fixture
def cluster(tmp_path):
    missing = [e for e in EXES if not (BIN / e).exists()]
    if missing:
        (pytest.fail if os.environ.get("E2E_STRICT") == "1" else pytest.skip)(f"not built in {BIN}: {', '.join(missing)} (the end-to-end stage runs this)")
    secrets = tmp_path / "secrets"
    subprocess.run([BIN / "dev-certs", "--dir", secrets, *SERVICES, "gateway"], check=True, capture_output=True)
    for t in ("service-token", "gateway-token"):
        (secrets / t).write_text(os.urandom(24).hex())
    container_ports = {p["containerPort"] for n in [*SERVICES, "gateway"] for p in workload(n)["spec"]["template"]["spec"]["containers"][0]["ports"]}
    ports = {str(p): str(free_port()) for p in sorted(container_ports)}

    def local(pod, value):
        host, _, port = value.partition(":")
        if host in SERVICES and port.isdigit():  # a headless Service's name: this machine here
            value = f"127.0.0.1:{port}"
        for p, q in ports.items():
            value = value.replace(f":{p}", f":{q}") if ":" in value else (q if value == p else value)
        if value.startswith(("/certs", "/secrets", "/data")):
            return f"{tmp_path}/{pod}{value}"
        return value.replace("0.0.0.0", "127.0.0.1")

    procs = []
    for name in [*SERVICES, "gateway"]:
        w = workload(name)
        c = w["spec"]["template"]["spec"]["containers"][0]
        pod = tmp_path / name
        (pod / "certs").mkdir(parents=True)
        for src, dst in ((f"{name}.pem", "tls.crt"), (f"{name}-key.pem", "tls.key"), ("ca.pem", "ca.crt")):
            shutil.copy(secrets / src, pod / "certs" / dst)
        # Only the Secrets the pod mounts.
        mounted = {v["secret"]["secretName"] for v in w["spec"]["template"]["spec"]["volumes"] if "secret" in v}
        for t in ("service-token", "gateway-token"):
            if t in mounted:
                (pod / "secrets" / t).mkdir(parents=True)
                shutil.copy(secrets / t, pod / "secrets" / t / "token")
        env = {"PATH": os.environ["PATH"]}
        env.update({e["name"]: local(name, e["value"]) for e in c["env"] if "value" in e})
        # Peers are dialled at 127.0.0.1 here: check their certificates for the names they carry.
        env.update({f"{s.upper()}_TLS_SERVER_NAME": s for s in SERVICES})
        cmd = [str(BIN / c["command"][0])] + [local(name, a) for a in c["command"][1:]]
        log = open(tmp_path / f"{name}.log", "w")
        procs.append((name, subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT), c, w))
    yield procs, ports, tmp_path, local
    for _, p, _, _ in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


def probe(c, kind, pod, ports, local):
    spec = c[kind]
    if "exec" in spec:
        cmd = [str(BIN / spec["exec"]["command"][0])] + [local(pod, a) for a in spec["exec"]["command"][1:]]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).returncode == 0
    if "grpc" in spec:
        port = ports[str(spec["grpc"]["port"])]
        service = ["--service", spec["grpc"]["service"]] if spec["grpc"].get("service") else []
        return subprocess.run([BIN / "health-probe", "--addr", f"127.0.0.1:{port}", *service], capture_output=True, timeout=30).returncode == 0
    port = ports[str(next(p["containerPort"] for p in c["ports"] if p["name"] == spec["httpGet"]["port"]))]
    with socket.create_connection(("127.0.0.1", int(port)), timeout=5) as s:
        s.sendall(f"GET {spec['httpGet']['path']} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        return s.recv(64).startswith(b"HTTP/1.1 200")


def test_every_probe_passes_and_every_process_stops_in_time(cluster):
    procs, ports, tmp_path, local = cluster
    deadline = time.monotonic() + 120
    pending = {name for name, *_ in procs}
    while pending and time.monotonic() < deadline:
        for name, p, c, _ in procs:
            assert p.poll() is None, f"{name} exited ({p.returncode}):\n" + (tmp_path / f"{name}.log").read_text()[-2000:]
            if name in pending and all(probe(c, k, name, ports, local) for k in ("startupProbe", "readinessProbe", "livenessProbe")):
                pending.discard(name)
        time.sleep(0.5)
    assert not pending, f"probes still failing for {sorted(pending)}: " + "; ".join(
        (tmp_path / f"{n}.log").read_text()[-500:] for n in pending)
    # kubelet's native gRPC probe is plaintext h2c: a service's mutual-TLS port refuses it.
    plain = subprocess.run([BIN / "health-probe", "--addr", f"127.0.0.1:{ports['9101']}"], capture_output=True, timeout=30)
    assert plain.returncode != 0
    # One service down: the gateway stays ready and live (its probes ask for the process itself),
    # while its overall health ("") turns NOT_SERVING.
    social = next(p for name, p, _, _ in procs if name == "social")
    social.terminate()
    assert social.wait(timeout=30) == 0
    gw = next(c for name, _, c, _ in procs if name == "gateway")

    def overall_serving():
        return subprocess.run([BIN / "health-probe", "--addr", f"127.0.0.1:{ports['8080']}"], capture_output=True, timeout=30).returncode == 0

    deadline = time.monotonic() + 20
    while overall_serving() and time.monotonic() < deadline:
        time.sleep(0.3)
    assert not overall_serving(), "the gateway's overall health ignores a stopped service"
    for k in ("readinessProbe", "livenessProbe"):
        assert probe(gw, k, "gateway", ports, local), f"gateway {k} fails with one service down"
    for name, p, _, w in procs:
        if name == "social":
            continue
        grace = w["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        t0 = time.monotonic()
        p.terminate()
        assert p.wait(timeout=grace) == 0, name
        assert time.monotonic() - t0 < grace, name
