"""compose/: the file is valid for docker-compose, and it runs every executable of the system."""
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose" / "docker-compose.yml"
DOCKERFILE = ROOT / "compose" / "Dockerfile"
SERVICES = {"accounts": 9101, "tasks": 9102, "finance": 9103, "social": 9104, "matchmaking": 9105}


def test_docker_compose_config_accepts_the_file():
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.skip("docker-compose is not installed (scripts/setup installs it)")
    env = dict(os.environ, SERVICE_TOKEN="s" * 40, GATEWAY_TOKEN="g" * 40)
    out = subprocess.run([exe, "-f", str(COMPOSE), "config"], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    resolved = yaml.safe_load(out.stdout)
    assert set(resolved["services"]) == set(SERVICES) | {"gateway", "certs"}
    # Both credentials are required: no well-known default to run with by mistake.
    bare = {k: v for k, v in os.environ.items() if k not in ("SERVICE_TOKEN", "GATEWAY_TOKEN")}
    missing = subprocess.run([exe, "-f", str(COMPOSE), "config"], capture_output=True, text=True, timeout=60, env=bare)
    assert missing.returncode != 0 and "SERVICE_TOKEN" in missing.stderr + missing.stdout


def test_the_gateway_never_gets_the_service_credential():
    doc = yaml.safe_load(COMPOSE.read_text())
    gateway_env = doc["services"]["gateway"]["environment"]
    assert "SERVICE_TOKEN" not in gateway_env and "GATEWAY_TOKEN" in gateway_env
    for name in SERVICES:
        env = doc["services"][name].get("environment") or doc["x-service"]["environment"]
        assert "SERVICE_TOKEN" in env and "GATEWAY_TOKEN" in env
        assert "change-me" not in str(env)


def test_every_executable_runs_in_a_container_with_its_volume_and_health_check():
    doc = yaml.safe_load(COMPOSE.read_text())
    services = doc["services"]
    for name, port in SERVICES.items():
        svc = services[name]
        assert svc["command"][0] == f"{name}-service"
        assert str(port) in svc["command"]
        assert any(v.startswith(f"{name}-data:") for v in svc["volumes"]), name
        assert "health-probe" in svc["healthcheck"]["test"]
        assert f"{name}-data" in doc["volumes"]
    gw = services["gateway"]
    assert gw["command"][0] == "gateway"
    assert set(gw["depends_on"]) == set(SERVICES)
    for name, port in SERVICES.items():
        assert gw["environment"][f"{name.upper()}_ADDR"] == f"{name}:{port}"


def test_services_speak_mutual_tls_with_certificates_from_the_certs_volume():
    """TLS between services as scripts/run INTERNAL_TLS=1 runs it: each service serves mutual TLS
    with its own certificate and presents it to its peers; the gateway presents its own to them and
    keeps its public port as it is; the files come from the `certs` volume, filled once by the
    dev-certs job unless they are there already."""
    doc = yaml.safe_load(COMPOSE.read_text())
    services = doc["services"]
    assert "certs" in doc["volumes"]
    job = services["certs"]
    assert job["command"][:4] == ["dev-certs", "--dir", "/certs", "--if-missing"]
    assert set(job["command"][4:]) == set(SERVICES) | {"gateway"}
    assert job["restart"] == "no" and "certs:/certs" in job["volumes"]
    for name, port in SERVICES.items():
        svc = services[name]
        command = svc["command"]
        flags = {command[i]: command[i + 1] for i in range(len(command) - 1) if command[i].startswith("--")}
        assert flags["--tls-cert"] == f"/certs/{name}.pem" and flags["--tls-key"] == f"/certs/{name}-key.pem", name
        assert flags["--tls-client-ca"] == "/certs/ca.pem", name
        env = svc["environment"]
        assert env["PEER_TLS_CA"] == "/certs/ca.pem", name
        assert (env["PEER_TLS_CERT"], env["PEER_TLS_KEY"]) == (f"/certs/{name}.pem", f"/certs/{name}-key.pem"), name
        assert "certs:/certs:ro" in svc["volumes"], name
        assert svc["depends_on"]["certs"]["condition"] == "service_completed_successfully", name
        # Health checked on the process's health-only port (plaintext h2c, grpc.health.v1 alone),
        # as the Kubernetes probes do: no certificate needed there.
        probe = svc["healthcheck"]["test"]
        assert probe[probe.index("--addr") + 1] == f"127.0.0.1:{flags['--health-port']}", name
        assert flags["--health-port"] != str(port) and "--ca-file" not in probe, name
    gw = services["gateway"]
    assert "--tls-client-ca" not in gw["command"]
    assert gw["environment"]["PEER_TLS_CA"] == "/certs/ca.pem"
    assert (gw["environment"]["PEER_TLS_CERT"], gw["environment"]["PEER_TLS_KEY"]) == ("/certs/gateway.pem", "/certs/gateway-key.pem")
    assert "certs:/certs:ro" in gw["volumes"]


def test_dockerfile_copies_every_shipped_executable_and_fails_without_one():
    """The image holds what scripts/swift-release builds (its --shipped list: every service, the
    gateway, health-probe, dev-certs) and its build fails when one is missing: no stand-in that
    would start and print "not built" in a deployed image."""
    package = (ROOT / "Package.swift").read_text()
    declared = set(re.findall(r'\.executable\(name: "([a-z-]+)"', package))
    wanted = {e for e in declared if e.endswith("-service") or e in ("gateway", "health-probe", "dev-certs")}
    shipped = set(subprocess.run([str(ROOT / "scripts" / "swift-release"), "--shipped"], capture_output=True, text=True,
                                 check=True).stdout.split())
    assert wanted | {f"{s}-service" for s in SERVICES} | {"gateway", "health-probe", "dev-certs"} <= shipped
    assert shipped <= declared, "a shipped executable the package does not declare"
    docker = DOCKERFILE.read_text()
    assert "RUN scripts/swift-release" in docker and "$(scripts/swift-release --shipped)" in docker
    assert "COPY scripts/swift-release" in docker
    assert "not built yet" not in docker and "printf" not in docker, "the image must not write stand-ins"
    assert 'exit 1' in docker
    # Everything compose runs is in the image.
    doc = yaml.safe_load(COMPOSE.read_text())
    for name, svc in doc["services"].items():
        if svc.get("command"):
            assert svc["command"][0] in shipped, name