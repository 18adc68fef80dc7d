"""What a newcomer does first, on a tree with no build folder: `scripts/run` with its defaults
(only the ports moved to free ones), which builds release exactly as the image does and starts
everything. Then every process must be SERVING, one real call per service must work through the
gateway, a service killed with -9 must come back by itself while the rest keep serving, and
Ctrl-C (SIGTERM) must stop everything and leave no process behind.

The tree is a copy of the checkout's files (what git tracks, plus new files it does not ignore),
so the build starts from nothing, as on a fresh clone; only the Python virtualenv is shared.
NEWCOMER_KEEP=1 keeps the copy (and its build) for a look afterwards."""
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import grpc
import pytest

ROOT = Path(__file__).resolve().parents[2]
NAMES = ("accounts", "tasks", "finance", "social", "matchmaking")
BUILD_MINUTES = 45  # a clean release build with the dependencies on 2 busy cores (≈ 8 quiet)


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def copy_tree(dest: Path):
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, check=True).stdout.split(b"\0")
    for f in files:
        if not f:
            continue
        src = ROOT / f.decode()
        if not src.exists():  # deleted in the work tree, not yet in git
            continue
        dst = dest / f.decode()
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)
    (dest / ".venv").symlink_to(ROOT / ".venv")


@pytest.fixture(scope="module")
def stubs():
    from grpc_tools import protoc
    import grpc_tools

    out = Path(tempfile.mkdtemp(prefix="newcomer-stubs-"))
    wkt = Path(grpc_tools.__file__).parent / "_proto"
    protos = [str(p.relative_to(ROOT / "Proto")) for p in (ROOT / "Proto").rglob("*.proto")]
    assert protoc.main(["protoc", f"-I{ROOT / 'Proto'}", f"-I{wkt}", f"--python_out={out}", f"--grpc_python_out={out}", *protos]) == 0
    sys.path.insert(0, str(out))
    yield out
    shutil.rmtree(out, ignore_errors=True)


class Run:
    """scripts/run in the copy, its output in run.log."""

    def __init__(self, tree: Path, ports: dict):
        self.tree, self.ports = tree, ports
        self.log_path = tree / "run.log"
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("PEER_TLS_", "GATEWAY_", "ACCOUNTS_", "TASKS_", "FINANCE_", "SOCIAL_", "MATCHMAKING_"))
               and k not in ("BIN_DIR", "NO_BUILD", "DATA_DIR", "TLS", "INTERNAL_TLS", "CI")}
        env.update({f"{n.upper()}_PORT": str(p) for n, p in ports.items()})
        self.log = open(self.log_path, "w")
        self.p = subprocess.Popen([str(tree / "scripts" / "run")], cwd=tree, env=env, stdout=self.log,
                                  stderr=subprocess.STDOUT, start_new_session=True)

    def text(self):
        return self.log_path.read_text(errors="replace")

    def tail(self, n=4000):
        lines = [l for l in self.text().splitlines() if not l.startswith("[")]  # not the compiler's progress
        return "\n".join(lines)[-n:]

    def wait_for(self, needle, seconds, after=0):
        deadline = time.time() + seconds
        while needle not in self.text()[after:]:
            assert self.p.poll() is None, f"scripts/run exited ({self.p.returncode}) before '{needle}':\n{self.tail()}"
            assert time.time() < deadline, f"no '{needle}' within {seconds} s:\n{self.tail()}"
            time.sleep(0.5)

    def bin(self):
        return self.tree / ".build" / "release"

    def serving(self, port):
        return subprocess.run([str(self.bin() / "health-probe"), "--addr", f"127.0.0.1:{port}", "--timeout", "2"],
                              capture_output=True).returncode == 0


def pids_of(binary_dir: Path):
    """Processes whose executable lies in binary_dir (.build/release is a symbolic link)."""
    binary_dir = binary_dir.resolve()
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if os.readlink(d / "exe").startswith(str(binary_dir) + "/"):
                    out.append(int(d.name))
            except OSError:
                pass
    return out


def test_scripts_run_on_a_fresh_tree_builds_serves_restarts_and_stops(stubs):
    tree = Path(tempfile.mkdtemp(prefix="newcomer-"))
    run = None
    try:
        copy_tree(tree)
        assert not (tree / ".build").exists()
        ports = dict(zip(("gateway", *NAMES), free_ports(6)))
        run = Run(tree, ports)
        run.wait_for("Ctrl-C stops everything", BUILD_MINUTES * 60)  # its last start-up line
        for name in (*NAMES, "gateway"):
            assert f"{name} SERVING on 127.0.0.1:{ports[name]}" in run.text()
            assert run.serving(ports[name]), name

        from accounts.v1 import accounts_pb2 as apb, accounts_pb2_grpc
        from social.v1 import social_pb2 as spb, social_pb2_grpc
        from finance.v1 import finance_pb2 as fpb, finance_pb2_grpc
        from tasks.v1 import tasks_pb2_grpc, habits_pb2 as hpb
        from matchmaking.v1 import matchmaking_pb2 as mpb, matchmaking_pb2_grpc
        from common.v1 import types_pb2

        gw = grpc.insecure_channel(f"127.0.0.1:{ports['gateway']}")
        name = "new" + uuid.uuid4().hex[:8]
        signed = accounts_pb2_grpc.AccountsStub(gw).SignUp(
            apb.SignUpRequest(username=name, email=f"{name}@example.com", password="correct horse battery staple",
                              display_name="Newcomer"), timeout=30)
        auth = [("authorization", f"Bearer {signed.session.access_token}")]
        social = social_pb2_grpc.SocialStub(gw)
        home = social.CreateHousehold(spb.CreateHouseholdRequest(name="First flat"), metadata=auth, timeout=10).household
        balances = finance_pb2_grpc.FinanceStub(gw).GetBalances(fpb.GetBalancesRequest(household_id=home.household_id),
                                                                metadata=auth, timeout=10)
        assert list(balances.balances) == []  # alone in the household: nobody to owe
        habit = tasks_pb2_grpc.TasksStub(gw).CreateHabit(
            hpb.CreateHabitRequest(idempotency_key=uuid.uuid4().hex, title="Stretch", days=[types_pb2.WEEKDAY_MONDAY],
                                   time_zone="Europe/Berlin"), metadata=auth, timeout=10).habit
        assert habit.title == "Stretch"
        matchmaking_pb2_grpc.MatchmakingStub(gw).GetLeaderboard(mpb.GetLeaderboardRequest(page_size=10), metadata=auth, timeout=10)
        profile = apb.GetProfileRequest(user_id=signed.user.user_id)
        assert accounts_pb2_grpc.AccountsStub(gw).GetProfile(profile, metadata=auth, timeout=10).profile.username == name

        # A crash: social killed with -9 comes back by itself; the rest kept serving meanwhile.
        social_pid = next(p for p in pids_of(run.bin()) if "social-service" in os.readlink(f"/proc/{p}/exe"))
        mark = len(run.text())
        os.kill(social_pid, signal.SIGKILL)
        run.wait_for("social exited (signal 9)", 10, after=mark)
        # Meanwhile the gateway keeps serving the other services.
        accounts_pb2_grpc.AccountsStub(gw).GetProfile(profile, metadata=auth, timeout=10)
        run.wait_for("social restarted", 10, after=mark)
        deadline = time.time() + 30
        while not run.serving(ports["social"]):
            assert time.time() < deadline, run.tail()
            time.sleep(0.2)
        mine = social.ListMyHouseholds(spb.ListMyHouseholdsRequest(), metadata=auth, timeout=10)
        assert [h.household_id for h in mine.households] == [home.household_id]
        gw.close()

        # Ctrl-C: everything stops, gracefully, nothing left behind.
        os.killpg(run.p.pid, signal.SIGINT)
        run.p.wait(40)
        assert "all stopped" in run.text(), run.tail()
        assert pids_of(run.bin()) == [], "processes left running"
    finally:
        if run and run.p.poll() is None:
            os.killpg(run.p.pid, signal.SIGKILL)
            run.p.wait()
        if run:
            for pid in pids_of(run.bin()):
                os.kill(pid, signal.SIGKILL)
        if os.environ.get("NEWCOMER_KEEP") != "1":
            shutil.rmtree(tree, ignore_errors=True)
            # SwiftPM's lock files for the tree's build folder, named after its path.
            for lock in Path(tempfile.gettempdir()).glob("_" + str(tree).strip("/").replace("/", "_") + "_*"):
                lock.unlink(missing_ok=True)
