"""The cluster the tasks end-to-end and browser tests run against: real accounts-service,
social-service, tasks-service and gateway processes on loopback (conftest.Proc), each with its own
data directory under the test's tmp_path, stopped at the end. Without a built social-service the
tests are skipped (team scoring, memberships and notifications are social's)."""
import os
import time
import uuid
from pathlib import Path

import grpc
import pytest

from conftest import BIN, Proc, free_port

PASSWORD = "correct horse battery staple"


def start_cluster(tmp_path, tasks_env=None, with_finance=False, social_env=None):
    if not (BIN / "social-service").exists():
        pytest.skip(f"{BIN / 'social-service'} is not built (social lands from its own branch)")
    services = ("accounts", "social", "finance", "tasks") if with_finance else ("accounts", "social", "tasks")
    ports = {n: free_port() for n in services + ("gateway",)}
    env = dict(os.environ)
    env.update({
        "DATA_DIR": str(tmp_path),
        "SERVICE_TOKEN": "e2e-service-credential-0123456789abcdef",
        "GATEWAY_TOKEN": "e2e-gateway-credential-0123456789abcdef",
        "ACCOUNTS_ADDR": f"127.0.0.1:{ports['accounts']}",
        "SOCIAL_ADDR": f"127.0.0.1:{ports['social']}",
        "TASKS_ADDR": f"127.0.0.1:{ports['tasks']}",
        "GATEWAY_UPSTREAMS": ",".join(services),
        "ACCOUNTS_SCRYPT_N": "1024",
        "LOG_LEVEL": "info",
    })
    procs = []
    try:
        if with_finance:
            env["FINANCE_ADDR"] = f"127.0.0.1:{ports['finance']}"
        for name in services:
            penv = dict(env)
            if name == "tasks":
                penv.update(tasks_env or {})
            if name == "social":
                penv.update(social_env or {})
            p = Proc(f"{name}-service", ["--host", "127.0.0.1", "--port", str(ports[name]), "--data-dir", str(tmp_path / name)], penv,
                     ports[name])
            procs.append(p.start())
        gw = Proc("gateway", ["--host", "127.0.0.1", "--port", str(ports["gateway"])], env, ports["gateway"])
        procs.append(gw.start())
    except BaseException:
        for p in reversed(procs):
            p.stop()
        raise
    return Cluster(procs, ports, env, tmp_path)


class Cluster:
    def __init__(self, procs, ports, env, tmp_path):
        self.procs, self.ports, self.env, self.tmp_path = procs, ports, env, tmp_path
        self.gateway_url = f"http://127.0.0.1:{ports['gateway']}"
        self.gw = grpc.insecure_channel(f"127.0.0.1:{ports['gateway']}", options=[
            ("grpc.max_receive_message_length", 8 << 20), ("grpc.max_send_message_length", 8 << 20)])
        self.accounts_direct = grpc.insecure_channel(f"127.0.0.1:{ports['accounts']}")
        self.tasks_direct = grpc.insecure_channel(f"127.0.0.1:{ports['tasks']}")
        from accounts.v1 import accounts_pb2, accounts_pb2_grpc
        from social.v1 import social_pb2, social_pb2_grpc
        from tasks.v1 import tasks_pb2, tasks_pb2_grpc, team_tasks_pb2, chores_pb2
        from common.v1 import types_pb2
        self.apb, self.spb, self.tpb, self.ttpb, self.cpb, self.types = accounts_pb2, social_pb2, tasks_pb2, team_tasks_pb2, chores_pb2, types_pb2
        self.accounts = accounts_pb2_grpc.AccountsStub(self.gw)
        self.social = social_pb2_grpc.SocialStub(self.gw)
        self.tasks = tasks_pb2_grpc.TasksStub(self.gw)
        self.mail = accounts_pb2_grpc.AccountsInternalStub(self.accounts_direct)
        self.tasks_internal = tasks_pb2_grpc.TasksInternalStub(self.tasks_direct)
        self.service_meta = [("x-service-token", env["SERVICE_TOKEN"])]

    def stop(self):
        self.gw.close()
        self.accounts_direct.close()
        self.tasks_direct.close()
        for p in reversed(self.procs):
            p.stop()

    def proc(self, name):
        return next(p for p in self.procs if p.name == name)

    def sign_up(self, prefix, display_name=None):
        name = f"{prefix}{uuid.uuid4().hex[:8]}"
        r = self.accounts.SignUp(self.apb.SignUpRequest(username=name, email=f"{name}@example.com", password=PASSWORD,
                                                        display_name=display_name if display_name is not None else prefix.capitalize()),
                                 timeout=10)
        return {"id": r.user.user_id, "username": name, "email": f"{name}@example.com", "token": r.session.access_token,
                "password": PASSWORD}

    def invite_code(self, email, timeout=10):
        deadline = time.time() + timeout
        while time.time() < deadline:
            mails = self.mail.ListSentMail(self.apb.ListSentMailRequest(to_email=email, kind=self.apb.MAIL_KIND_HOUSEHOLD_INVITE),
                                           metadata=self.service_meta, timeout=10).mails
            if mails:
                return mails[0].data["invite_code"]
            time.sleep(0.05)
        raise AssertionError(f"no invite mail to {email}")


def auth(user):
    return [("authorization", f"Bearer {user['token']}")]


def eventually(check, timeout=15, interval=0.05):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        try:
            last = check()
            if last:
                return last
        except grpc.RpcError as e:  # noqa: PERF203
            last = e
        time.sleep(interval)
    raise AssertionError(f"condition not met in {timeout} s (last: {last})")


def artifacts_dir(tmp_path):
    """Where screenshots go: $E2E_ARTIFACTS if set (kept after the run), else the test's tmp_path."""
    d = Path(os.environ.get("E2E_ARTIFACTS", tmp_path / "artifacts"))
    d.mkdir(parents=True, exist_ok=True)
    return d
