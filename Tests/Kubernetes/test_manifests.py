"""deploy/kubernetes/: every manifest valid for Kubernetes 1.29 (kubernetes-validate, offline,
strict: an unknown or misspelt field fails), and the system they describe is the one the code and
compose/ describe: one writer per database, probes, resources, a locked-down security context,
credentials from Secrets, only the gateway open to the outside, and no environment variable that
no process reads.

`kubectl apply --dry-run=client` is not used: it needs an API server even for a dry run (it fetches
the cluster's OpenAPI document to validate and its discovery to map kinds), so it cannot run
offline. `kubectl kustomize` can, and is run when kubectl is installed."""
import re
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "kubernetes"
COMPOSE = ROOT / "compose" / "docker-compose.yml"
KUBERNETES_VERSION = "1.29.0"
SERVICES = {"accounts": 9101, "tasks": 9102, "finance": 9103, "social": 9104, "matchmaking": 9105}
PROCESSES = list(SERVICES) + ["gateway"]
# Read by the C library, not by our code: sanctioned by the image (compose/Dockerfile sets it).
NOT_OURS = {"GLIBC_TUNABLES"}


def manifest_files():
    return sorted(p for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")


def objects(path):
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def applied():
    """Every object `kubectl apply -k deploy/kubernetes` creates, by (kind, name)."""
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    out = {}
    for name in kustomization["resources"]:
        for d in objects(K8S / name):
            out[(d["kind"], d["metadata"]["name"])] = d
    return out


def workloads():
    return [d for d in applied().values() if d["kind"] in ("Deployment", "StatefulSet")]


def container(workload):
    (c,) = workload["spec"]["template"]["spec"]["containers"]
    return c


def env_of(workload):
    return {e["name"]: e for e in container(workload).get("env", [])}


# ---- schema -------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", manifest_files(), ids=lambda p: p.name)
def test_every_object_is_valid_against_the_kubernetes_schema(path):
    docs = objects(path)
    assert docs, f"{path.name} holds no object"
    for d in docs:
        try:
            kubernetes_validate.validate(d, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{path.name}: {d['kind']}/{d['metadata'].get('name')}: {e.message} at {list(e.path)}")


def test_the_validator_rejects_a_misspelt_field():
    """The check above can fail: strict validation refuses a field Kubernetes does not know."""
    sts = next(d for d in workloads() if d["kind"] == "StatefulSet")
    bad = yaml.safe_load(yaml.safe_dump(sts))
    bad["spec"]["template"]["spec"]["terminationGracePeriod"] = 30
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, KUBERNETES_VERSION, strict=True)
    bad = yaml.safe_load(yaml.safe_dump(sts))
    bad["spec"]["replicas"] = "one"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, KUBERNETES_VERSION, strict=True)


def test_the_kustomization_applies_every_manifest_but_the_secrets_example():
    listed = set(yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"])
    assert listed == {p.name for p in manifest_files()} - {"secrets.example.yaml"}
    assert all(d["kind"] != "Secret" for d in applied().values()), "Secrets are made from files git ignores"
    for d in applied().values():
        if d["kind"] != "Namespace":
            assert d["metadata"]["namespace"] == "backend", d["metadata"]["name"]


def test_kubectl_kustomize_builds_the_base_offline():
    exe = shutil.which("kubectl")
    if exe is None:
        pytest.skip("kubectl is not installed (optional: the schema check above does not need it)")
    out = subprocess.run([exe, "kustomize", str(K8S)], capture_output=True, text=True, timeout=60,
                         env={"KUBECONFIG": "/nonexistent", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    built = {(d["kind"], d["metadata"]["name"]) for d in yaml.safe_load_all(out.stdout) if d}
    assert built == set(applied())


# ---- workloads ----------------------------------------------------------------------------------


def shutdown_grace_seconds():
    """ServerConfiguration.shutdownGracePeriod: how long a process drains after SIGTERM."""
    text = (ROOT / "Sources/RPCTransport/Server/ServerConfiguration.swift").read_text()
    m = re.search(r"shutdownGracePeriod: Duration = \.seconds\((\d+)\)", text)
    assert m, "shutdownGracePeriod's default moved: update this test"
    return int(m.group(1))


def test_every_workload_has_probes_resources_and_a_locked_down_security_context():
    assert {d["metadata"]["name"] for d in workloads()} == set(PROCESSES)
    for w in workloads():
        name = w["metadata"]["name"]
        pod = w["spec"]["template"]["spec"]
        c = container(w)
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert probe in c, f"{name}: no {probe}"
        for kind in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(c["resources"].get(kind, {})), f"{name}: resources.{kind}"
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert pod["securityContext"]["runAsUser"] == 10001, name  # the image's user
        assert c["securityContext"]["readOnlyRootFilesystem"] is True, name
        assert c["securityContext"]["allowPrivilegeEscalation"] is False, name
        assert c["securityContext"]["capabilities"]["drop"] == ["ALL"], name
        assert pod["automountServiceAccountToken"] is False, name
        # Service links would set GATEWAY_PORT=tcp://…, ACCOUNTS_PORT=… (Services of those names):
        # the processes read <NAME>_PORT as a port number and refuse to start.
        assert pod["enableServiceLinks"] is False, name
        # Termination: the drain, plus any preStop pause, plus room to stop the jobs and close.
        pre_stop = c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
        pause = int(pre_stop[1]) if pre_stop[:1] == ["sleep"] else 0
        assert pod["terminationGracePeriodSeconds"] >= shutdown_grace_seconds() + pause + 10, name
        for m in c.get("volumeMounts", []):
            if m["mountPath"].startswith(("/certs", "/secrets")):
                assert m.get("readOnly") is True, f"{name}: {m['mountPath']} must be read-only"


def test_each_service_is_one_statefulset_replica_with_its_own_volume_and_a_headless_service():
    objs = applied()
    for name, port in SERVICES.items():
        sts = objs[("StatefulSet", name)]["spec"]
        assert sts["replicas"] == 1, f"{name}: one writer per SQLite file"
        assert sts["podManagementPolicy"] in ("Parallel", "OrderedReady") and sts["updateStrategy"]["type"] == "RollingUpdate"
        (claim,) = sts["volumeClaimTemplates"]
        assert claim["spec"]["accessModes"] == ["ReadWriteOnce"], name
        c = container(objs[("StatefulSet", name)])
        mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
        assert mounts[claim["metadata"]["name"]] == f"/data/{name}", name
        args = c["command"]
        assert args[0] == f"{name}-service"
        flags = {args[i]: args[i + 1] for i in range(1, len(args) - 1, 2)}
        assert flags["--data-dir"] == f"/data/{name}" and flags["--port"] == str(port) and flags["--host"] == "0.0.0.0"
        # The volume is the data directory's, and nothing else keeps state: no emptyDir for it.
        headless = objs[("Service", sts["serviceName"])]["spec"]
        assert sts["serviceName"] == name and headless["clusterIP"] == "None"
        assert headless["publishNotReadyAddresses"] is True, name
        assert [p["port"] for p in headless["ports"]] == [port]
        assert headless["selector"] == sts["selector"]["matchLabels"]


def test_the_gateway_is_a_replicated_deployment_behind_a_service_with_a_disruption_budget():
    objs = applied()
    gw = objs[("Deployment", "gateway")]
    assert gw["spec"]["replicas"] >= 2
    assert not gw["spec"]["template"]["spec"].get("volumes") or all(
        "persistentVolumeClaim" not in v for v in gw["spec"]["template"]["spec"]["volumes"])
    svc = objs[("Service", "gateway")]["spec"]
    assert svc["selector"] == gw["spec"]["selector"]["matchLabels"] and svc["ports"][0]["port"] == 8080
    pdb = objs[("PodDisruptionBudget", "gateway")]["spec"]
    assert pdb["selector"] == gw["spec"]["selector"] and pdb["minAvailable"] >= 1
    c = container(gw)
    # Native gRPC probes (the public port is h2c) of the process-only health name, SERVING while
    # the gateway runs and is not draining: "" needs every upstream, and one service down must not
    # take every replica out of the Service (nor restart them).
    process_name = re.search(r'processService = "([^"]+)"', (ROOT / "Sources/Gateway/GatewayHealth.swift").read_text()).group(1)
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["grpc"]["port"] == 8080, probe
        assert c[probe]["grpc"].get("service") == process_name, f"{probe} must ask for the process-only name"


def test_service_probes_are_native_grpc_probes_of_the_health_only_port():
    """kubelet's native gRPC probe speaks h2c without a client certificate, which a mutual-TLS port
    refuses: each service serves grpc.health.v1 alone on a plaintext health port (--health-port),
    and its probes ask that port. The port is not published by the Service nor opened by the
    NetworkPolicy (kubelet probes from the node)."""
    objs = applied()
    for name, port in SERVICES.items():
        w = objs[("StatefulSet", name)]
        c = container(w)
        args = c["command"]
        assert args[args.index("--tls-client-ca") + 1] == "/certs/ca.crt", name
        health = int(args[args.index("--health-port") + 1])
        assert health != port, name
        assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"grpc": port, "health": health}, name
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert c[probe]["grpc"] == {"port": health}, f"{name} {probe}: the health port, the whole server's health"
            assert "exec" not in c[probe], name
        assert [p["port"] for p in objs[("Service", name)]["spec"]["ports"]] == [port], name
    for p in (d for d in objs.values() if d["kind"] == "NetworkPolicy"):
        for rule in p["spec"].get("ingress", []):
            ports = {x["port"] for x in rule.get("ports", [])}
            assert not ports & {port + 10 for port in SERVICES.values()}, "health ports stay internal"


# ---- credentials and TLS ------------------------------------------------------------------------


def secret_names(workload):
    pod = workload["spec"]["template"]["spec"]
    names = {v["secret"]["secretName"] for v in pod.get("volumes", []) if "secret" in v}
    names |= {e["valueFrom"]["secretKeyRef"]["name"] for e in env_of(workload).values() if "secretKeyRef" in e.get("valueFrom", {})}
    return names


def test_credentials_come_from_secrets_and_the_gateway_never_gets_the_service_credential():
    for w in workloads():
        name = w["metadata"]["name"]
        env = env_of(w)
        for var in ("SERVICE_TOKEN", "GATEWAY_TOKEN", "GATEWAY_METRICS_TOKEN"):
            assert "value" not in env.get(var, {}), f"{name}: {var} written into the manifest"
        if name == "gateway":
            assert "service-token" not in secret_names(w) and "SERVICE_TOKEN_FILE" not in env
            assert secret_names(w) >= {"gateway-token", "tls-gateway"}
        else:
            assert secret_names(w) == {"service-token", "gateway-token", f"tls-{name}"}
            assert env["SERVICE_TOKEN_FILE"]["value"] == "/secrets/service-token/token"
        assert env["GATEWAY_TOKEN_FILE"]["value"] == "/secrets/gateway-token/token"
        assert (env["PEER_TLS_CA"]["value"], env["PEER_TLS_CERT"]["value"], env["PEER_TLS_KEY"]["value"]) == (
            "/certs/ca.crt", "/certs/tls.crt", "/certs/tls.key"), name


def test_make_secrets_makes_every_secret_the_manifests_mount():
    script = (K8S / "make-secrets").read_text()
    names = re.search(r"NAMES=\(([^)]*)\)", script).group(1).split()
    made = {"service-token", "gateway-token"} | {f"tls-{n}" for n in names}
    example = {d["metadata"]["name"] for d in objects(K8S / "secrets.example.yaml")}
    for w in workloads():
        for s in secret_names(w):
            if s == "gateway-metrics-token":  # optional (secretKeyRef optional: true)
                continue
            assert s in made, f"{w['metadata']['name']} mounts {s}, which make-secrets does not make"
            assert s in example or s.startswith("tls-"), s
    assert "deploy/kubernetes/secrets/" in (ROOT / ".gitignore").read_text()


def test_peers_are_addressed_by_their_headless_services():
    for w in workloads():
        env = env_of(w)
        for peer, port in SERVICES.items():
            assert env[f"{peer.upper()}_ADDR"]["value"] == f"{peer}:{port}", w["metadata"]["name"]


# ---- environment: only what the code reads ------------------------------------------------------

SETTING_CALL = re.compile(r'\b(?:string|int|bool|onOff|list|choice|milliseconds|seconds|double)\("([^"]+)"')


def variables_the_code_reads():
    """Every environment variable a setting of ours is read from: the keys the sources pass to
    Settings' getters (`a.b.c` ↔ `A_B_C`), with `\\(name)`/`\\(peer)` for each process and
    `\\(key)` for the transport's keys."""
    keys = set()
    for path in (ROOT / "Sources").rglob("*.swift"):
        text = path.read_text(errors="replace")
        keys |= {k for k in SETTING_CALL.findall(text) if re.fullmatch(r"[a-z0-9.\\()]+", k) and "." in k or k.isalpha() and k.islower()}
        keys |= set(re.findall(r'"((?:service|gateway)\.token)"', text))
    plain = {k for k in keys if "\\(" not in k}
    expanded = set(plain)
    for k in keys - plain:
        for name in PROCESSES:
            v = k.replace("\\(name)", name).replace("\\(peer)", name)
            for token in ("service.token", "gateway.token"):
                w = v.replace("\\(kind.key)", token)
                if "\\(key)" in w:
                    expanded |= {w.replace("\\(key)", p) for p in plain}
                else:
                    expanded.add(w)
    return {k.upper().replace(".", "_") for k in expanded if "\\(" not in k}


def test_the_reader_of_settings_is_found():
    read = variables_the_code_reads()
    for var in ("LOG_FORMAT", "ACCESS_LOG", "METRICS", "PEER_TLS_CA", "ACCOUNTS_ADDR", "SERVICE_TOKEN_FILE",
                "GATEWAY_TOKEN_FILE", "GATEWAY_UPSTREAMS", "DATA_DIR", "ACCOUNTS_SCRYPT_N", "TASKS_MAX_CONNECTIONS"):
        assert var in read, var
    for var in ("ACCOUNTS_SCRYPT_NN", "LOG_FROMAT", "SERVICE_TOKEN_PATH", "PEER_TLS_CERTIFICATE"):
        assert var not in read, var


def test_every_variable_the_manifests_and_compose_set_is_read_by_the_code():
    read = variables_the_code_reads() | NOT_OURS
    assert "ENV GLIBC_TUNABLES=" in (ROOT / "compose" / "Dockerfile").read_text()
    for w in workloads():
        unknown = set(env_of(w)) - read
        assert not unknown, f"{w['metadata']['name']} sets {sorted(unknown)}, which no process reads"
    compose = yaml.safe_load(COMPOSE.read_text())
    for name, svc in compose["services"].items():
        unknown = set(svc.get("environment") or {}) - read
        assert not unknown, f"compose {name} sets {sorted(unknown)}, which no process reads"


# ---- network ------------------------------------------------------------------------------------


def test_only_the_gateway_is_reachable_from_outside():
    policies = [d for d in applied().values() if d["kind"] == "NetworkPolicy"]
    deny = [p for p in policies if p["spec"]["podSelector"] == {} and "ingress" not in p["spec"]]
    assert deny and deny[0]["spec"]["policyTypes"] == ["Ingress"], "no default deny of ingress"
    open_to_all = []
    for p in policies:
        for rule in p["spec"].get("ingress", []):
            sources = rule.get("from")
            if not sources:
                open_to_all.append((p["spec"]["podSelector"], [x["port"] for x in rule["ports"]]))
            else:
                for s in sources:
                    # the namespace's own pods, or a labelled monitoring namespace: never ipBlock
                    assert "ipBlock" not in s, p["metadata"]["name"]
                    if "namespaceSelector" in s:
                        assert s["namespaceSelector"]["matchLabels"] == {"backend.example/monitoring": "true"}
                    else:
                        assert s == {"podSelector": {}}, p["metadata"]["name"]
    assert open_to_all == [({"matchLabels": {"app.kubernetes.io/name": "gateway"}}, [8080])]
    internal = [p for p in policies if p["spec"]["podSelector"] == {"matchLabels": {"app.kubernetes.io/component": "service"}}]
    (rule,) = internal[0]["spec"]["ingress"]
    assert sorted(x["port"] for x in rule["ports"]) == sorted(SERVICES.values())
    for name in SERVICES:
        labels = applied()[("StatefulSet", name)]["spec"]["template"]["metadata"]["labels"]
        assert labels["app.kubernetes.io/component"] == "service"


# ---- compose describes the same system ----------------------------------------------------------


def test_compose_and_the_manifests_set_the_same_settings():
    """Same variables with the same values per process, but where they must differ: the
    credentials (compose passes them, Kubernetes mounts them: `_FILE`), the certificate paths (the
    `certs` volume's names, the Secrets' names) and the peers' hosts (compose service names, headless
    Services: both `<service>`)."""
    compose = yaml.safe_load(COMPOSE.read_text())
    paths = {"PEER_TLS_CA", "PEER_TLS_CERT", "PEER_TLS_KEY"}
    for w in workloads():
        name = w["metadata"]["name"]
        k8s = {k: e.get("value") for k, e in env_of(w).items()}
        dc = {k: str(v) for k, v in compose["services"][name]["environment"].items()}
        k8s_names = {k.removesuffix("_FILE") for k in k8s} - {"DATA_DIR", "GLIBC_TUNABLES", "GATEWAY_METRICS_TOKEN"}
        assert k8s_names == set(dc), f"{name}: only in Kubernetes {sorted(k8s_names - set(dc))}, only in compose {sorted(set(dc) - k8s_names)}"
        for k, v in dc.items():
            if k in paths or k.endswith("_TOKEN"):
                continue
            assert k8s[k] == v, f"{name}: {k} is {k8s[k]!r} in Kubernetes, {v!r} in compose"
        # The same command line, certificate paths aside.
        command = compose["services"][name]["command"]
        assert [a for a in command if not a.startswith("/certs/")] == [a for a in container(w)["command"] if not a.startswith("/certs/")]
        # Compose waits at least as long as Kubernetes before it kills a stopping process.
        grace = compose["services"][name].get("stop_grace_period", "10s")
        assert int(grace.rstrip("s")) >= w["spec"]["template"]["spec"]["terminationGracePeriodSeconds"], name
