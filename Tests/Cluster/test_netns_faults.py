"""Separate hosts, tested (issue 20): every service and the gateway in a Linux network namespace
of its own — a host of its own, with its own address — joined by veth pairs to a bridge, over
mutual TLS; then one service is cut off, and brought back.

The network, all made here and removed at the end (also when a test fails; what a killed earlier
run left is removed at the start):

- a namespace holding the bridge `br0` (10.231.0.1/24): the test itself runs there (its main
  thread joins it, so the grpcio client's threads and every subprocess it starts are there too);
  nothing is added to the machine's own network;
- one namespace per process: gateway 10.231.0.10, accounts .11, tasks .12, finance .13, social .14,
  matchmaking .15 (social moves to .24 in the last test), each with an `eth0` whose other end is
  a port of the bridge.

The project's rule "servers bind to 127.0.0.1" is for tests on one host. Here each namespace is a
host, so each server binds to its namespace's own address. Processes reach each other by name
(`SOCIAL_ADDR=social:9104`), resolved through a hosts file per namespace (`ip netns exec` mounts
`/etc/netns/<ns>/hosts` over `/etc/hosts`; the files are rewritten in place, so a running process
sees a moved host), and every certificate (dev-certs) is valid for its name. Every service
requires a client certificate of the CA; the gateway reaches them over TLS with its own; its public
port speaks TLS too.

The flow whose events are counted: GeoTask bids. bob bids on alice's market task (tasks, which
needs no social to take it); each bid queues a NEW_BID notification to social through tasks'
outbox; alice lists them through the gateway (social's ListNotifications). The bid amounts number
the events, so what arrives shows duplicates, gaps and order.

For each fault of social (link down; nftables dropping all its packets; dropping a random share;
killed with SIGKILL and started again in a new namespace at a new address):
  - gateway calls to social answer UNAVAILABLE quickly (measured; bound 5 s), calls to the other
    four services go on succeeding, and the gateway reports social, and only social, as not
    serving (its /status.json and its grpc.health.v1 per service);
  - bids acknowledged meanwhile wait in tasks' outbox (its `outbox_backlog` gauge for social,
    read from its /metrics over mutual TLS);
  - once social is back, every acknowledged bid's notification arrives once, in order.
Under the random share's loss the other four services keep answering too. And a second service,
finance, is cut off (link down): its calls answer UNAVAILABLE quickly, the other four (social
included) answer, only finance is reported down while the gateway process stays ready (its health
name "gateway"), and finance's calls work again once the link is back.

Needs root, `ip` (iproute2), `nft` (nftables) and network namespaces, plus the built binaries
(BIN_DIR, default .build/debug). Without them it skips, and fails under E2E_STRICT=1 (CI).
Run alone: `E2E_STRICT=1 .venv/bin/python -m pytest -q -s Tests/Cluster/test_netns_faults.py`
(`-s` prints the measured figures). It must run in a pytest process of its own: its main thread
moves to the bridge's namespace, and grpcio threads made before that would stay outside.
"""
import ctypes
import os
import re
import secrets
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("BIN_DIR", ROOT / ".build" / "debug"))
SERVICES = {"accounts": 9101, "tasks": 9102, "finance": 9103, "social": 9104, "matchmaking": 9105}
ADDRESSES = {"gateway": "10.231.0.10", "accounts": "10.231.0.11", "tasks": "10.231.0.12", "finance": "10.231.0.13",
             "social": "10.231.0.14", "matchmaking": "10.231.0.15"}
NEW_SOCIAL_ADDRESS = "10.231.0.24"
BRIDGE_ADDRESS = "10.231.0.1"
GATEWAY_PORT = 8080
PREFIX = "nftest"  # namespaces are nftest<pid>x<random>-<node>
HEALTH_NAMES = {"accounts": "accounts.v1.Accounts", "tasks": "tasks.v1.Tasks", "finance": "finance.v1.Finance",
                "social": "social.v1.Social", "matchmaking": "matchmaking.v1.Matchmaking"}
PASSWORD = "correct horse battery staple"
UNAVAILABLE_BOUND = 5.0  # seconds: generous; the figures are printed
CLONE_NEWNET = 0x40000000
FIGURES = {}


def unavailable(reason):
    (pytest.fail if os.environ.get("E2E_STRICT") == "1" else pytest.skip)(reason)


def run(*args, check=True, input=None):
    r = subprocess.run([str(a) for a in args], capture_output=True, text=True, input=input, timeout=30)
    if check and r.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, args))} failed ({r.returncode}): {r.stderr.strip()}")
    return r


def pid_alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def remove_namespace(ns):
    run("ip", "netns", "del", ns, check=False)
    shutil.rmtree(f"/etc/netns/{ns}", ignore_errors=True)


def clean_stale():
    """Namespaces (and their /etc/netns files) of earlier runs whose process is gone."""
    listed = run("ip", "netns", "list", check=False).stdout.split()
    names = {n for n in listed if n.startswith(PREFIX)}
    if os.path.isdir("/etc/netns"):
        names |= {n for n in os.listdir("/etc/netns") if n.startswith(PREFIX)}
    for ns in names:
        m = re.match(rf"{PREFIX}(\d+)x", ns)
        if m and not pid_alive(int(m.group(1))):
            remove_namespace(ns)


def setns(path):
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns({path})")
    finally:
        os.close(fd)


class Network:
    """The bridge's namespace and one namespace per host, named with this run's pid and a random
    part (parallel runs never clash; a dead run's are recognised by its pid)."""

    def __init__(self):
        self.tag = f"{PREFIX}{os.getpid()}x{secrets.token_hex(3)}"
        self.bridge = self.ns("br")
        self.hosts = {}  # node -> (namespace, address)
        self.names = {}  # DNS name -> address, what every hosts file says

    def ns(self, node):
        return f"{self.tag}-{node}"

    def create_bridge(self):
        run("ip", "netns", "add", self.bridge)
        run("ip", "-n", self.bridge, "link", "set", "lo", "up")
        run("ip", "-n", self.bridge, "link", "add", "br0", "type", "bridge")
        run("ip", "-n", self.bridge, "addr", "add", f"{BRIDGE_ADDRESS}/24", "dev", "br0")
        run("ip", "-n", self.bridge, "link", "set", "br0", "up")

    def add_host(self, node, address, name=None):
        ns = self.ns(node)
        run("ip", "netns", "add", ns)
        os.makedirs(f"/etc/netns/{ns}", exist_ok=True)
        # No DNS in here: a name not in the hosts file fails at once (lo answers port 53 with a reset).
        Path(f"/etc/netns/{ns}/resolv.conf").write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
        run("ip", "-n", ns, "link", "set", "lo", "up")
        run("ip", "-n", self.bridge, "link", "add", f"v-{node}", "type", "veth", "peer", "name", "eth0", "netns", ns)
        run("ip", "-n", self.bridge, "link", "set", f"v-{node}", "master", "br0", "up")
        run("ip", "-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
        run("ip", "-n", ns, "link", "set", "eth0", "up")
        self.hosts[node] = (ns, address)
        self.names[name or node] = address
        self.write_hosts()
        return ns

    def remove_host(self, node):
        ns, _ = self.hosts.pop(node)
        run("ip", "-n", self.bridge, "link", "del", f"v-{node}", check=False)
        remove_namespace(ns)

    def write_hosts(self):
        """Every namespace's hosts file, rewritten in place (the same inode: `ip netns exec`
        bind-mounted it over /etc/hosts in the processes already running there)."""
        text = "127.0.0.1 localhost\n" + "".join(f"{a} {n}\n" for n, a in sorted(self.names.items()))
        for ns, _ in self.hosts.values():
            with open(f"/etc/netns/{ns}/hosts", "w") as f:
                f.write(text)

    def link(self, node, up):
        """The cable of `node` at the bridge: carrier off on both ends, nothing closed."""
        run("ip", "-n", self.bridge, "link", "set", f"v-{node}", "up" if up else "down")

    def drop(self, node, percent):
        """nftables in `node`'s namespace: drop every packet in and out (100) or a random share."""
        ns, _ = self.hosts[node]
        verdict = "drop" if percent >= 100 else f"numgen random mod 100 < {percent} drop"
        rules = (f"table inet netns_faults {{\n"
                 f"  chain in {{ type filter hook input priority 0; policy accept; {verdict}; }}\n"
                 f"  chain out {{ type filter hook output priority 0; policy accept; {verdict}; }}\n"
                 f"}}\n")
        run("ip", "netns", "exec", ns, "nft", "-f", "-", input=rules)

    def undrop(self, node):
        ns, _ = self.hosts[node]
        run("ip", "netns", "exec", ns, "nft", "delete", "table", "inet", "netns_faults")

    def destroy(self):
        for node in list(self.hosts):
            self.remove_host(node)
        remove_namespace(self.bridge)


class Process:
    def __init__(self, name, ns, args, env, log_dir):
        self.name, self.ns, self.args, self.env = name, ns, args, env
        self.log = open(log_dir / f"{name}-{time.time():.0f}.log", "w")
        self.p = subprocess.Popen(["ip", "netns", "exec", ns, "env", "-i", *[f"{k}={v}" for k, v in env.items()], *args],
                                  stdout=self.log, stderr=subprocess.STDOUT)

    def tail(self):
        self.log.flush()
        return Path(self.log.name).read_text()[-3000:]

    def stop(self, kill=False):
        if self.p.poll() is None:
            self.p.kill() if kill else self.p.terminate()
            try:
                self.p.wait(15)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()


def wait_for(check, timeout=30, interval=0.1, what="condition"):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except Exception as e:  # noqa: BLE001 - the last error is reported
            last = e
        time.sleep(interval)
    raise AssertionError(f"{what} not met within {timeout} s (last: {last!r})")


def generate_stubs():
    from grpc_tools import protoc
    import grpc_tools

    out = Path(tempfile.mkdtemp(prefix="netns-stubs-"))
    wkt = Path(grpc_tools.__file__).parent / "_proto"
    protos = [str(p.relative_to(ROOT / "Proto")) for p in (ROOT / "Proto").rglob("*.proto")]
    rc = protoc.main(["protoc", f"-I{ROOT / 'Proto'}", f"-I{wkt}", f"--python_out={out}", f"--grpc_python_out={out}", *protos])
    assert rc == 0, "grpc_tools.protoc failed"
    sys.path.insert(0, str(out))
    return out


class Cluster:
    """The processes, their certificates and a client (in the bridge's namespace)."""

    def __init__(self, net, tmp):
        self.net, self.tmp = net, tmp
        self.certs = tmp / "certs"
        self.procs = {}
        self.base_env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "SERVICE_TOKEN": secrets.token_hex(24), "GATEWAY_TOKEN": secrets.token_hex(24),
            "PEER_TLS_CA": str(self.certs / "ca.pem"),
            "ACCOUNTS_SCRYPT_N": "1024", "LOG_LEVEL": "info", "ACCESS_LOG": "off",
            # Short waits, so the test takes seconds: peers' keepalive (a silent peer's
            # connection ends within 2 s) and the outbox's retries (at most 1 s apart).
            "PEER_KEEPALIVE_TIME_MS": "1000", "PEER_KEEPALIVE_TIMEOUT_MS": "1000",
            "OUTBOX_RETRY_INITIAL_MS": "200", "OUTBOX_RETRY_MAX_MS": "1000",
            "GATEWAY_HEALTH_INTERVAL_MS": "500", "GATEWAY_STATUS_SCRAPE_MS": "1000",
        }
        for s, port in SERVICES.items():
            self.base_env[f"{s.upper()}_ADDR"] = f"{s}:{port}"

    def start(self, name, node=None):
        node = node or name
        ns, address = self.net.hosts[node]
        env = dict(self.base_env)
        env.update({"PEER_TLS_CERT": str(self.certs / f"{name}.pem"), "PEER_TLS_KEY": str(self.certs / f"{name}-key.pem")})
        tls = ["--tls-cert", self.certs / f"{name}.pem", "--tls-key", self.certs / f"{name}-key.pem"]
        if name == "gateway":
            args = [BIN / "gateway", "--host", address, "--port", GATEWAY_PORT, *tls]
        else:
            args = [BIN / f"{name}-service", "--host", address, "--port", SERVICES[name], "--data-dir", self.tmp / "data" / name,
                    *tls, "--tls-client-ca", self.certs / "ca.pem"]
        p = Process(name, ns, [str(a) for a in args], env, self.tmp)
        self.procs[name] = p
        return p

    def wait_serving(self, name, node=None, timeout=60):
        _, address = self.net.hosts[node or name]
        port = GATEWAY_PORT if name == "gateway" else SERVICES[name]
        probe = [BIN / "health-probe", "--addr", f"{address}:{port}", "--ca-file", self.certs / "ca.pem", "--server-name", name,
                 "--timeout", "1"]
        if name != "gateway":
            probe += ["--cert-file", self.certs / "probe.pem", "--key-file", self.certs / "probe-key.pem"]
        p = self.procs[name]

        def serving():
            assert p.p.poll() is None, f"{name} exited ({p.p.returncode}): {p.tail()}"
            return run(*probe, check=False).returncode == 0
        wait_for(serving, timeout=timeout, interval=0.2, what=f"{name} SERVING")

    # ---- reading over TLS -------------------------------------------------------------------

    def https_get(self, node, port, path, name, client_cert=True, timeout=3):
        ctx = ssl.create_default_context(cafile=str(self.certs / "ca.pem"))
        ctx.set_alpn_protocols(["http/1.1"])
        if client_cert:
            ctx.load_cert_chain(str(self.certs / "probe.pem"), str(self.certs / "probe-key.pem"))
        _, address = self.net.hosts[node]
        with socket.create_connection((address, port), timeout=timeout) as raw, ctx.wrap_socket(raw, server_hostname=name) as s:
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: {name}\r\nConnection: close\r\n\r\n".encode())
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head[:200]
        if b"transfer-encoding: chunked" in head.lower():
            out, rest = b"", body
            while rest:
                size, _, rest = rest.partition(b"\r\n")
                n = int(size, 16)
                if n == 0:
                    break
                out, rest = out + rest[:n], rest[n + 2:]
            body = out
        return body.decode()

    def backlog(self, producer="tasks", destination="social"):
        """`outbox_backlog` of `producer` for `destination`, from its /metrics (mutual TLS)."""
        text = self.https_get(producer, SERVICES[producer], "/metrics", producer)
        for line in text.splitlines():
            if line.startswith("outbox_backlog") and f'destination="{destination}"' in line:
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def status(self):
        import json
        return json.loads(self.https_get("gateway", GATEWAY_PORT, "/status.json", "gateway", client_cert=False))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    if sys.platform != "linux" or os.geteuid() != 0:
        unavailable("needs root on Linux (network namespaces, veth pairs, a bridge, nftables)")
    for tool in ("ip", "nft"):
        if not shutil.which(tool):
            unavailable(f"`{tool}` not found (Debian's {'iproute2' if tool == 'ip' else 'nftables'}; scripts/setup installs it)")
    missing = [e for e in [*(f"{s}-service" for s in SERVICES), "gateway", "health-probe", "dev-certs"] if not (BIN / e).exists()]
    if missing:
        unavailable(f"not built in {BIN}: {', '.join(missing)}")
    if len(os.listdir("/proc/self/task")) != 1:
        unavailable("run this file in a pytest process of its own: threads already running (grpcio's) would stay outside "
                    "the test's network namespace")
    clean_stale()
    net = Network()
    tmp = tmp_path_factory.mktemp("netns")
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    cluster = None
    try:
        try:
            net.create_bridge()
        except AssertionError as e:
            unavailable(f"cannot make network namespaces here: {e}")
        for node, address in ADDRESSES.items():
            net.add_host(node, address)
        setns(f"/run/netns/{net.bridge}")
        cluster = Cluster(net, tmp)
        run(BIN / "dev-certs", "--dir", cluster.certs, *SERVICES, "gateway", "probe")
        generate_stubs()
        for name in SERVICES:
            cluster.start(name)
        for name in SERVICES:
            cluster.wait_serving(name)
        cluster.start("gateway")
        cluster.wait_serving("gateway")
        cluster.client = Client(cluster)
        wait_for(lambda: cluster.status()["serving"], timeout=30, what="the gateway serving every upstream")
        yield cluster
    finally:
        if cluster is not None:
            if getattr(cluster, "client", None):
                cluster.client.close()
            for p in cluster.procs.values():
                p.stop()
            if os.environ.get("KEEP_LOGS") == "1":
                print(f"\nlogs kept in {tmp}")
        libc = ctypes.CDLL(None, use_errno=True)
        libc.setns(home, CLONE_NEWNET)
        os.close(home)
        net.destroy()
        if FIGURES:
            print("\nfigures: " + "; ".join(f"{k} {v}" for k, v in FIGURES.items()))


class Client:
    """grpcio through the gateway's TLS port (in the bridge's namespace, as the whole test is)."""

    def __init__(self, c):
        import grpc
        from accounts.v1 import accounts_pb2, accounts_pb2_grpc
        from finance.v1 import finance_pb2, finance_pb2_grpc
        from matchmaking.v1 import matchmaking_pb2, matchmaking_pb2_grpc
        from social.v1 import social_pb2, social_pb2_grpc
        from tasks.v1 import marketplace_pb2, tasks_pb2_grpc
        from common.v1 import types_pb2
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        self.grpc = grpc
        creds = grpc.ssl_channel_credentials(root_certificates=(c.certs / "ca.pem").read_bytes())
        self.channel = grpc.secure_channel(f"{ADDRESSES['gateway']}:{GATEWAY_PORT}", creds,
                                           options=[("grpc.ssl_target_name_override", "gateway")])
        self.apb, self.fpb, self.mpb, self.spb, self.mkt, self.types, self.hpb = (
            accounts_pb2, finance_pb2, matchmaking_pb2, social_pb2, marketplace_pb2, types_pb2, health_pb2)
        self.accounts = accounts_pb2_grpc.AccountsStub(self.channel)
        self.finance = finance_pb2_grpc.FinanceStub(self.channel)
        self.matchmaking = matchmaking_pb2_grpc.MatchmakingStub(self.channel)
        self.social = social_pb2_grpc.SocialStub(self.channel)
        self.tasks = tasks_pb2_grpc.TasksStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)

    def close(self):
        self.channel.close()

    def sign_up(self, prefix):
        name = f"{prefix}{uuid.uuid4().hex[:8]}"
        r = self.accounts.SignUp(self.apb.SignUpRequest(username=name, email=f"{name}@example.com", password=PASSWORD,
                                                        display_name=prefix.capitalize()), timeout=10)
        return {"id": r.user.user_id, "meta": [("authorization", f"Bearer {r.session.access_token}")]}

    def timed(self, fn, *args, **kwargs):
        """(status code, seconds): OK or the RpcError's code."""
        t0 = time.monotonic()
        try:
            fn(*args, **kwargs)
            code = self.grpc.StatusCode.OK
        except self.grpc.RpcError as e:
            code = e.code()
        return code, time.monotonic() - t0

    def notifications(self, user):
        r = self.social.ListNotifications(self.spb.ListNotificationsRequest(kinds=[self.spb.NOTIFICATION_KIND_NEW_BID], page_size=100),
                                          metadata=user["meta"], timeout=5)
        return list(r.notifications)

    def reads(self, user):
        """One public read of each service through the gateway, by name."""
        return {
            "accounts": lambda: self.accounts.GetMyProfile(self.apb.GetMyProfileRequest(), metadata=user["meta"], timeout=5),
            "tasks": lambda: self.tasks.ListMarketTasks(self.mkt.ListMarketTasksRequest(scope=self.mkt.MARKET_TASK_SCOPE_BID_ON_BY_ME),
                                                        metadata=user["meta"], timeout=5),
            "finance": lambda: self.finance.GetBalances(self.fpb.GetBalancesRequest(), metadata=user["meta"], timeout=5),
            "social": lambda: self.notifications(user),
            "matchmaking": lambda: self.matchmaking.ListMyMatches(self.mpb.ListMyMatchesRequest(), metadata=user["meta"], timeout=5),
        }

    def others_work(self, user, down="social"):
        """One read of each service but `down` through the gateway: all OK."""
        return {name: self.timed(call)[0] for name, call in self.reads(user).items() if name != down}

    def health_of(self, service):
        return self.health.Check(self.hpb.HealthCheckRequest(service=HEALTH_NAMES[service]), timeout=5).status


class Market:
    """alice's market task and bob's bids: each bid acknowledged queues one NEW_BID to alice."""

    def __init__(self, client):
        self.c = client
        self.alice, self.bob = client.sign_up("alice"), client.sign_up("bob")
        self.task = client.tasks.CreateMarketTask(client.mkt.CreateMarketTaskRequest(idempotency_key=uuid.uuid4().hex, title="Fix the fence"),
                                                  metadata=self.alice["meta"], timeout=10).task
        self.acknowledged = []  # (cents, bid id), in the order tasks acknowledged them
        self.next_cents = 100

    def bid(self):
        cents = self.next_cents
        self.next_cents += 1
        r = self.c.tasks.PlaceBid(self.c.mkt.PlaceBidRequest(idempotency_key=uuid.uuid4().hex, task_id=self.task.task_id,
                                                             amount=self.c.types.Money(amount_cents=cents, currency="CAD")),
                                  metadata=self.bob["meta"], timeout=10)
        self.acknowledged.append((cents, r.bid.bid_id))

    def delivered(self):
        """The bids alice was told about, oldest first (notification ids sort by creation)."""
        notes = sorted(self.c.notifications(self.alice), key=lambda n: n.notification_id)
        return [n.data["bid_id"] for n in notes]

    def all_delivered(self):
        return len(self.delivered()) >= len(self.acknowledged)

    def check_once_in_order(self):
        got = self.delivered()
        want = [b for _, b in self.acknowledged]
        assert len(got) == len(set(got)), f"a notification arrived twice: {got}"
        assert got == want, f"notifications {got} != acknowledged bids in order {want}"


def unavailable_fast(c, call, label, service):
    """Right after the fault: the first call to `service` through the gateway, then a second one,
    both UNAVAILABLE within the bound."""
    grpc = c.client.grpc
    first, t_first = c.client.timed(call)
    second, t_second = c.client.timed(call)
    FIGURES[f"{label}: first call UNAVAILABLE after"] = f"{t_first:.2f} s"
    FIGURES[f"{label}: next call after"] = f"{t_second:.2f} s"
    print(f"\n{label}: first {service} call {first} in {t_first:.2f} s, next {second} in {t_second:.2f} s")
    assert first == grpc.StatusCode.UNAVAILABLE and second == grpc.StatusCode.UNAVAILABLE, (first, second)
    assert t_first < UNAVAILABLE_BOUND and t_second < UNAVAILABLE_BOUND, (t_first, t_second)


def social_unavailable_fast(c, market, label):
    unavailable_fast(c, lambda: c.client.notifications(market.alice), label, "social")


def only_social_down(c, market):
    only_down(c, market.bob, "social")


def only_down(c, user, service):
    """The other four services answer; /status.json and the gateway's gRPC health report `service`,
    and only it, as down; the gateway process itself stays ready (its probes' name, "gateway")."""
    grpc = c.client.grpc
    others = [s for s in SERVICES if s != service]
    assert c.client.others_work(user, down=service) == {s: grpc.StatusCode.OK for s in others}

    def reported():
        r = c.status()
        # The gateway's overall health is not serving (it requires every upstream); of the
        # upstreams, only `service` is down.
        down = {p["name"] for p in r["processes"] if p["name"] != "gateway" and p["health"] != "up"}
        assert r["serving"] is False and r["requiredDown"] == [service] and down == {service}, (
            r["serving"], r["requiredDown"], {p["name"]: p["health"] for p in r["processes"]})
        return True
    wait_for(reported, timeout=10, what=f"/status.json: {service}, and only {service}, down")
    serving, not_serving = c.client.hpb.HealthCheckResponse.SERVING, c.client.hpb.HealthCheckResponse.NOT_SERVING
    assert c.client.health_of(service) == not_serving
    assert [c.client.health_of(s) for s in others] == [serving] * 4
    assert c.client.health.Check(c.client.hpb.HealthCheckRequest(service="gateway"), timeout=5).status == serving


def outage(c, label, cut, restore, bids=10):
    """The common scenario: events before, the fault, bids while it lasts, the way back."""
    m = Market(c.client)
    for _ in range(3):
        m.bid()
    wait_for(m.all_delivered, timeout=15, what="the first bids' notifications")
    cut()
    try:
        social_unavailable_fast(c, m, label)
        only_social_down(c, m)
        for _ in range(bids):
            m.bid()  # tasks acknowledges: the notifications wait in its outbox
        backlog = wait_for(lambda: c.backlog() >= bids and c.backlog(), timeout=10, what="tasks' outbox backlog for social")
        FIGURES[f"{label}: backlog"] = f"{backlog:.0f} events"
    except BaseException:
        restore()  # the next tests start from a whole network
        raise
    t0 = time.monotonic()
    restore()
    wait_for(m.all_delivered, timeout=30, interval=0.1, what="every waiting notification delivered")
    took = time.monotonic() - t0
    FIGURES[f"{label}: backlog delivered after"] = f"{took:.2f} s"
    print(f"{label}: {bids} waiting events delivered {took:.2f} s after the way back")
    m.check_once_in_order()
    wait_for(lambda: c.backlog() == 0, timeout=10, what="tasks' outbox backlog for social back to 0")
    wait_for(lambda: c.status()["serving"], timeout=15, what="the gateway serving every upstream again")
    # And afterwards: a new bid arrives at once, the whole list still once and in order.
    m.bid()
    wait_for(m.all_delivered, timeout=10, what="a bid after the way back")
    m.check_once_in_order()
    return m


def test_link_down(cluster):
    c = cluster
    outage(c, "link down", lambda: c.net.link("social", False), lambda: c.net.link("social", True))


def test_nftables_drop_all(cluster):
    c = cluster
    outage(c, "nft drop all", lambda: c.net.drop("social", 100), lambda: c.net.undrop("social"))


def test_nftables_drop_a_random_share(cluster):
    """A third of social's packets lost each way: calls succeed or fail with a clear status within
    their deadlines (no hang), and every acknowledged bid's notification arrives once, in order."""
    c = cluster
    grpc = c.client.grpc
    m = Market(c.client)
    c.net.drop("social", 30)
    try:
        codes = {}
        worst = 0.0
        for _ in range(10):
            m.bid()
            code, took = c.client.timed(c.client.notifications, m.alice)
            codes[code.name] = codes.get(code.name, 0) + 1
            worst = max(worst, took)
            assert code in (grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED), code
            assert took < 5 + 1, f"a call with a 5 s deadline took {took:.2f} s"
        # Meanwhile the other services keep working, the loss on social's link notwithstanding.
        assert c.client.others_work(m.bob) == {s: grpc.StatusCode.OK for s in ("accounts", "tasks", "finance", "matchmaking")}
        FIGURES["30% drop: social calls"] = f"{codes} (slowest {worst:.2f} s)"
        print(f"\n30% drop: social calls through the gateway {codes}, slowest {worst:.2f} s")
        t0 = time.monotonic()
        wait_for(m.all_delivered, timeout=60, interval=0.2, what="every notification delivered through the lossy link")
        FIGURES["30% drop: 10 events delivered within"] = f"{time.monotonic() - t0:.2f} s of the last bid"
    finally:
        c.net.undrop("social")
    m.check_once_in_order()
    wait_for(lambda: c.backlog() == 0, timeout=10, what="tasks' outbox backlog for social back to 0")


def test_link_down_for_finance(cluster):
    """A second service cut off (finance, link down): its methods answer UNAVAILABLE fast, the
    other four (social included) answer, only finance is reported down, and its calls work again
    once the link is back."""
    c = cluster
    grpc = c.client.grpc
    carol = c.client.sign_up("carol")
    balances = c.client.reads(carol)["finance"]
    assert c.client.timed(balances)[0] == grpc.StatusCode.OK
    c.net.link("finance", False)
    try:
        unavailable_fast(c, balances, "finance link down", "finance")
        only_down(c, carol, "finance")
    finally:
        c.net.link("finance", True)
    t0 = time.monotonic()
    wait_for(lambda: c.client.timed(balances)[0] == grpc.StatusCode.OK, timeout=15, what="finance's calls working again")
    FIGURES["finance link down: calls work again after"] = f"{time.monotonic() - t0:.2f} s"
    wait_for(lambda: c.status()["serving"], timeout=15, what="the gateway serving every upstream again")
    assert c.client.others_work(carol, down="finance") == {s: grpc.StatusCode.OK for s in SERVICES if s != "finance"}


def test_killed_and_restarted_at_a_new_address(cluster):
    """SIGKILL, then social starts again on another host (a new namespace, address .24) with the
    same data; the hosts files now say so. The gateway and tasks find it by name."""
    c = cluster
    m = Market(c.client)
    for _ in range(3):
        m.bid()
    wait_for(m.all_delivered, timeout=15, what="the first bids' notifications")
    c.procs["social"].stop(kill=True)
    social_unavailable_fast(c, m, "killed")
    only_social_down(c, m)
    for _ in range(10):
        m.bid()
    wait_for(lambda: c.backlog() >= 10, timeout=10, what="tasks' outbox backlog for social")
    # The old host is gone; the new one answers to the same name at a new address.
    c.net.remove_host("social")
    del c.net.names["social"]
    c.net.add_host("social2", NEW_SOCIAL_ADDRESS, name="social")
    t0 = time.monotonic()
    c.start("social", node="social2")
    c.wait_serving("social", node="social2")
    wait_for(m.all_delivered, timeout=30, interval=0.1, what="every waiting notification delivered to the new address")
    took = time.monotonic() - t0
    FIGURES["moved: backlog delivered after the restart"] = f"{took:.2f} s"
    print(f"\nmoved: 10 waiting events delivered {took:.2f} s after social started at {NEW_SOCIAL_ADDRESS}")
    m.check_once_in_order()
    wait_for(lambda: c.status()["serving"], timeout=15, what="the gateway serving every upstream again")
    assert c.client.others_work(m.bob) == {s: c.client.grpc.StatusCode.OK for s in ("accounts", "tasks", "finance", "matchmaking")}
    m.bid()
    wait_for(m.all_delivered, timeout=10, what="a bid after the move")
    m.check_once_in_order()
