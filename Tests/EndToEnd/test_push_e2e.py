"""Push notifications end to end (issue 36): real accounts-service, social-service and gateway
processes, social's providers pointed (PUSH_*) at Tests/PushProviders/fake_providers.py, which checks
every request as APNs, FCM and a Web Push service document it. A browser-like client registers its
targets and preferences through the gateway (Connect JSON), another user's actions notify it, and
the pushes arrive verified; a deleted account's targets get nothing more."""
import json
import sqlite3
import os
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from conftest import BIN, ROOT, Proc, free_port
from tasks_cluster import auth, eventually, start_cluster

PASSWORD = "correct horse battery staple"


class Fake:
    """fake_providers.py as a child process (it exits when its stdin pipe closes)."""

    def __init__(self, directory):
        self.dir = Path(directory)
        self.p = subprocess.Popen([sys.executable, str(ROOT / "Tests/PushProviders/fake_providers.py"), "--dir", str(self.dir), "--port", "0"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        line = self.p.stdout.readline().decode()
        assert line.startswith("READY "), f"fake providers did not start: {line!r}"
        self.port = json.loads(line[6:])["port"]
        self.base = f"https://127.0.0.1:{self.port}"
        self.tls = ssl.create_default_context(cafile=str(self.dir / "ca.pem"))

    def control(self, method, path, body=None):
        req = urllib.request.Request(self.base + path, method=method, data=None if body is None else json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, context=self.tls, timeout=10) as r:
            data = r.read()
            return json.loads(data) if data else {}

    def received(self):
        return self.control("GET", "/control/received")

    def wait_for(self, what, predicate, timeout=20):
        deadline = time.time() + timeout
        while time.time() < deadline:
            got = self.received()
            if predicate(got):
                return got
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}: {self.received()}")

    def settings(self):
        """social's PUSH_* environment pointing every provider here."""
        apns = json.loads((self.dir / "apns.json").read_text())
        return {
            "PUSH_APNS_KEY_FILE": str(self.dir / "apns-key.p8"), "PUSH_APNS_KEY_ID": apns["key_id"], "PUSH_APNS_TEAM_ID": apns["team_id"],
            "PUSH_APNS_URL": self.base, "PUSH_APNS_SANDBOX_URL": self.base,
            "PUSH_FCM_SERVICE_ACCOUNT_FILE": str(self.dir / "fcm-service-account.json"), "PUSH_FCM_URL": self.base,
            "PUSH_VAPID_KEY_FILE": str(self.dir / "vapid-private.pem"), "PUSH_VAPID_SUBJECT": "mailto:ops@example.com",
            "PUSH_TLS_CA": str(self.dir / "ca.pem"), "PUSH_ALLOW_PRIVATE_ENDPOINTS": "on",
        }

    def stop(self):
        self.p.stdin.close()
        self.p.terminate()
        self.p.wait(10)


@pytest.fixture
def pushed(tmp_path):
    for name in ("accounts-service", "social-service", "gateway"):
        if not (BIN / name).exists():
            pytest.skip(f"{name} is not built")
    fake = Fake(tmp_path / "fake")
    accounts_port, social_port, gateway_port = free_port(), free_port(), free_port()
    env = dict(os.environ)
    env.update({
        "DATA_DIR": str(tmp_path), "LOG_LEVEL": "info", "ACCOUNTS_SCRYPT_N": "1024",
        "SERVICE_TOKEN": "e2e-service-credential-0123456789abcdef", "GATEWAY_TOKEN": "e2e-gateway-credential-0123456789abcdef",
        "ACCOUNTS_ADDR": f"127.0.0.1:{accounts_port}", "SOCIAL_ADDR": f"127.0.0.1:{social_port}", "TASKS_ADDR": f"127.0.0.1:{free_port()}",
        "GATEWAY_UPSTREAMS": "accounts,social",
    })
    env.update(fake.settings())
    procs = []
    try:
        for name, port in (("accounts-service", accounts_port), ("social-service", social_port)):
            proc = Proc(name, ["--host", "127.0.0.1", "--port", str(port), "--data-dir", str(tmp_path / name)], env, port)
            procs.append(proc)
            proc.start()
        gw = Proc("gateway", ["--host", "127.0.0.1", "--port", str(gateway_port)], env, gateway_port)
        procs.append(gw)
        gw.start()
        yield {"fake": fake, "gateway": gateway_port, "social": procs[1], "social_db": tmp_path / "social-service" / "social.sqlite"}
    finally:
        for p in reversed(procs):
            p.stop()
        fake.stop()


def connect(port, service, method, body, token=None):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/{service}/{method}", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "Connect-Protocol-Version": "1"})
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def ok(result):
    status, body = result
    assert status == 200, body
    return body


def sign_up(port, prefix):
    name = f"{prefix}{uuid.uuid4().hex[:8]}"
    r = ok(connect(port, "accounts.v1.Accounts", "SignUp", {"username": name, "email": f"{name}@example.com", "password": PASSWORD,
                                                             "displayName": prefix.capitalize()}))
    return {"id": r["user"]["userId"], "username": name, "token": r["session"]["accessToken"]}


def test_pushes_reach_every_device_through_the_gateway_and_stop_with_the_account(pushed):
    port, fake = pushed["gateway"], pushed["fake"]
    social = lambda method, body, user: connect(port, "social.v1.Social", method, body, user["token"])
    anna, ben = sign_up(port, "anna"), sign_up(port, "ben")

    # Ben's iPhone, Android phone and browser register (the browser's subscription comes from the push service).
    apns_token = os.urandom(32).hex()
    fcm_token = "fcm:" + uuid.uuid4().hex
    sub = fake.control("POST", "/control/webpush/subscriptions", {})
    for target in ({"apns": {"deviceToken": apns_token, "topic": "com.example.tasks", "environment": "APNS_ENVIRONMENT_SANDBOX"}, "label": "iPhone"},
                   {"fcm": {"registrationToken": fcm_token}, "label": "Pixel"},
                   {"webPush": {"endpoint": sub["endpoint"], "p256dh": sub["p256dh"], "auth": sub["auth"]}, "label": "Firefox"}):
        ok(social("RegisterPushTarget", {"target": target}, ben))
    assert len(ok(social("ListPushTargets", {}, ben))["targets"]) == 3

    # Anna adds Ben as a friend: FRIEND_ADDED reaches all three devices, each verified by the fake.
    ok(social("AddFriend", {"user": {"userId": ben["id"]}}, anna))
    got = fake.wait_for("three pushes", lambda r: len(r) >= 3)
    by = {r["provider"]: r for r in got}
    assert set(by) == {"apns", "fcm", "webpush"}
    assert by["apns"]["token"] == apns_token and by["apns"]["headers"]["apns-topic"] == "com.example.tasks"
    assert by["apns"]["payload"]["kind"] == "FRIEND_ADDED" and by["apns"]["payload"]["aps"]["badge"] == 1
    assert by["fcm"]["payload"]["message"]["token"] == fcm_token
    assert by["webpush"]["payload"]["kind"] == "FRIEND_ADDED" and by["webpush"]["token"] == sub["id"]
    note = ok(social("ListNotifications", {}, ben))["notifications"][0]
    assert by["apns"]["headers"]["apns-collapse-id"] == note["notificationId"] == by["webpush"]["headers"]["topic"]
    assert fake.control("GET", "/control/rejected") == []

    # Ben turns follow requests off for pushes; the request still reaches his inbox, no push leaves.
    prefs = ok(social("SetPushPreferences", {"preferences": {"disabledKinds": ["NOTIFICATION_KIND_FOLLOW_REQUEST"]}}, ben))
    assert prefs["settings"]["push"]["disabledKinds"] == ["NOTIFICATION_KIND_FOLLOW_REQUEST"]
    ok(social("RequestFollow", {"user": {"userId": ben["id"]}}, anna))
    time.sleep(1)
    assert len(fake.received()) == 3
    kinds = [n["kind"] for n in ok(social("ListNotifications", {}, ben))["notifications"]]
    assert "NOTIFICATION_KIND_FOLLOW_REQUEST" in kinds

    # A bad preference is refused naming the field (Connect: 400 invalid_argument).
    status, body = social("SetPushPreferences", {"preferences": {"quietHours": {"startMinute": 60, "endMinute": 60, "timeZone": "Mars/Olympus"}}}, ben)
    assert status == 400 and body["code"] == "invalid_argument"
    assert "preferences.quiet_hours.end_minute" in body["message"] and "preferences.quiet_hours.time_zone" in body["message"], body

    # Ben deletes his account: EraseUser (through accounts' outbox) removes his targets; nothing more is pushed.
    ok(connect(port, "accounts.v1.Accounts", "DeleteAccount", {"password": PASSWORD}, ben["token"]))
    deadline = time.time() + 15
    while time.time() < deadline:
        status, _ = social("ListPushTargets", {}, ben)
        if status == 401:
            break
        time.sleep(0.1)
    db = sqlite3.connect(f"file:{pushed['social_db']}?mode=ro", uri=True)
    try:
        deadline = time.time() + 15
        while time.time() < deadline and db.execute("SELECT count(*) FROM push_targets WHERE user_id = ?", (ben["id"],)).fetchone()[0]:
            time.sleep(0.1)
        assert db.execute("SELECT count(*) FROM push_targets WHERE user_id = ?", (ben["id"],)).fetchone()[0] == 0
        assert db.execute("SELECT count(*) FROM push_outbox").fetchone()[0] == 0
    finally:
        db.close()
    assert len(fake.received()) == 3
    assert fake.control("GET", "/control/rejected") == []


@pytest.fixture
def team(tmp_path, stubs):
    fake = Fake(tmp_path / "fake")
    c = start_cluster(tmp_path, social_env=fake.settings())
    try:
        yield c, fake
    finally:
        c.stop()
        fake.stop()


def test_help_request_pushes_each_device_once_through_outage_and_kill_9(team):
    """Seed A UC11: B registers an iPhone, an Android phone and a browser and closes the app; A asks
    for help on their shared team task; each device gets exactly one push with the title, body and
    badge; muted, snoozed and blocked get none; a provider outage and a kill -9 of social between
    the commit and the send each end with every push delivered once."""
    c, fake = team
    spb, ttpb = c.spb, c.ttpb
    a, b = c.sign_up("alice", "Alice Martin"), c.sign_up("bob", "Bob Kowalski")
    social = lambda method, body, user: connect(c.ports["gateway"], "social.v1.Social", method, body, user["token"])
    apns_token, fcm_token = os.urandom(32).hex(), "fcm:" + uuid.uuid4().hex
    sub = fake.control("POST", "/control/webpush/subscriptions", {})
    for target in ({"apns": {"deviceToken": apns_token, "topic": "com.example.tasks", "environment": "APNS_ENVIRONMENT_PRODUCTION"}},
                   {"fcm": {"registrationToken": fcm_token}},
                   {"webPush": {"endpoint": sub["endpoint"], "p256dh": sub["p256dh"], "auth": sub["auth"]}}):
        ok(social("RegisterPushTarget", {"target": target}, b))
    c.social.CreateTeam(spb.CreateTeamRequest(name="Checkout squad", member_usernames=[b["username"]]), metadata=auth(a), timeout=10)
    task = c.tasks.CreateTeamTask(ttpb.CreateTeamTaskRequest(idempotency_key=uuid.uuid4().hex, name="Prepare the demo",
                                                             participant_usernames=[b["username"]]), metadata=auth(a), timeout=10).task
    time.sleep(1)  # TEAM_JOINED / TASK_ASSIGNED pushes arrive first
    base = len(fake.received())

    def help_request(note):
        c.tasks.RequestTeamTaskHelp(ttpb.RequestTeamTaskHelpRequest(task_id=task.task_id, message=note), metadata=auth(a), timeout=10)

    def pushes_since(n):
        return fake.received()[n:]

    def unread():
        return c.social.ListNotifications(spb.ListNotificationsRequest(unread_only=True), metadata=auth(b), timeout=10).notifications

    help_request("Can you review slide 3?")
    got = fake.wait_for("three help pushes", lambda r: len(r) >= base + 3)[base:]
    time.sleep(0.5)
    assert len(fake.received()) == base + 3, "each device exactly once"
    assert sorted(r["provider"] for r in got) == ["apns", "fcm", "webpush"]
    badge = len(unread())
    by = {r["provider"]: r for r in got}
    alert = by["apns"]["payload"]["aps"]
    assert alert["alert"] == {"title": "Alice Martin asks for help with Prepare the demo", "body": "Can you review slide 3?"}
    assert alert["badge"] == badge and by["apns"]["payload"]["kind"] == "HELP_REQUEST"
    assert by["fcm"]["payload"]["message"]["notification"] == {"title": "Alice Martin asks for help with Prepare the demo",
                                                               "body": "Can you review slide 3?"}
    assert by["fcm"]["payload"]["message"]["android"]["notification"]["notification_count"] == badge
    assert by["webpush"]["payload"]["title"] == "Alice Martin asks for help with Prepare the demo"
    assert by["webpush"]["payload"]["badge"] == badge

    # Muted help, then a snooze, then a block: stored silenced (or dropped) and never pushed. The
    # requests reach social through tasks' outbox, so each setting stays until social has them.
    def stored(body, user=b):
        return lambda: any(n.body == body and n.silenced for n in
                           c.social.ListNotifications(spb.ListNotificationsRequest(), metadata=auth(user), timeout=10).notifications)

    c.social.MuteHelpNotifications(spb.MuteHelpNotificationsRequest(muted=True), metadata=auth(b), timeout=10)
    help_request("muted")
    eventually(stored("muted"))
    c.social.MuteHelpNotifications(spb.MuteHelpNotificationsRequest(muted=False), metadata=auth(b), timeout=10)
    c.social.SnoozeNotifications(spb.SnoozeNotificationsRequest(duration={"seconds": 3600}), metadata=auth(b), timeout=10)
    help_request("snoozed")
    eventually(stored("snoozed"))
    c.social.SnoozeNotifications(spb.SnoozeNotificationsRequest(duration={"seconds": 0}), metadata=auth(b), timeout=10)
    c.social.BlockUser(spb.BlockUserRequest(user=spb.UserSelector(user_id=a["id"])), metadata=auth(b), timeout=10)
    help_request("blocked")
    # tasks' outbox delivers to social in order: once B's offer reached A, the blocked request was handled.
    c.tasks.OfferTeamTaskHelp(ttpb.OfferTeamTaskHelpRequest(task_id=task.task_id, message="sentinel"), metadata=auth(b), timeout=10)
    eventually(lambda: any(n.body == "sentinel" for n in
                           c.social.ListNotifications(spb.ListNotificationsRequest(), metadata=auth(a), timeout=10).notifications))
    c.social.UnblockUser(spb.UnblockUserRequest(user=spb.UserSelector(user_id=a["id"])), metadata=auth(b), timeout=10)
    time.sleep(0.5)
    assert len(fake.received()) == base + 3
    assert not any(n.body == "blocked" for n in c.social.ListNotifications(spb.ListNotificationsRequest(), metadata=auth(b), timeout=10).notifications)

    # Every provider down for a while, then back: each push arrives once.
    for provider in ("apns", "fcm", "webpush"):
        fake.control("POST", "/control/script", {"provider": provider, "status": 503, "reason": "ServiceUnavailable" if provider == "apns"
                                                 else "UNAVAILABLE", "times": -1})
    help_request("during the outage")
    eventually(lambda: len(fake.control("GET", "/control/scripted")) >= 3)
    fake.control("POST", "/control/reset", {})
    got = fake.wait_for("three pushes after the outage", lambda r: len(r) >= 3, timeout=30)
    time.sleep(1)
    assert sorted(r["provider"] for r in fake.received()) == ["apns", "fcm", "webpush"]
    assert all(r["payload"].get("aps", {}).get("alert", {}).get("body", "during the outage") == "during the outage" for r in got)

    # kill -9 social between the commit and the send (the providers refuse, so the pushes wait), restart: once each.
    fake.control("POST", "/control/reset", {})
    for provider in ("apns", "fcm", "webpush"):
        fake.control("POST", "/control/script", {"provider": provider, "status": 503, "reason": "ServiceUnavailable" if provider == "apns"
                                                 else "UNAVAILABLE", "times": -1})
    help_request("across kill -9")
    eventually(lambda: len(fake.control("GET", "/control/scripted")) >= 3)
    soc = c.proc("social-service")
    soc.p.kill()
    soc.p.wait(10)
    fake.control("POST", "/control/reset", {})
    soc.start()
    got = fake.wait_for("three pushes after the restart", lambda r: len(r) >= 3, timeout=30)
    time.sleep(1.5)
    got = fake.received()
    assert sorted(r["provider"] for r in got) == ["apns", "fcm", "webpush"], got
    assert by["apns"]["headers"]["apns-collapse-id"] != got[0]["headers"].get("apns-collapse-id")
    assert fake.control("GET", "/control/rejected") == []


def test_a_chore_due_today_reminds_its_assignee_at_the_household_time_once_across_a_restart(team):
    """Seed B UC-18 while the app is closed: a chore due today reminds its assignee's phone at the
    household's chosen local time (the next minute of Tokyo's clock, so the test waits at most
    about a minute of real time) and not again after tasks restarts."""
    import datetime
    from zoneinfo import ZoneInfo

    c, fake = team
    spb, cpb, types = c.spb, c.cpb, c.types
    anna = c.sign_up("anna", "Anna")
    apns_token = os.urandom(32).hex()
    ok(connect(c.ports["gateway"], "social.v1.Social", "RegisterPushTarget",
               {"target": {"apns": {"deviceToken": apns_token, "topic": "com.example.chores", "environment": "APNS_ENVIRONMENT_PRODUCTION"}}},
               anna["token"]))
    hh = c.social.CreateHousehold(spb.CreateHouseholdRequest(name="Flat 7"), metadata=auth(anna), timeout=10).household.household_id
    zone = ZoneInfo("Asia/Tokyo")
    now = datetime.datetime.now(zone)
    if now.second > 45 or (now.hour == 23 and now.minute == 59):
        time.sleep(61 - now.second)  # leave room before the chosen minute, and stay on today's date
        now = datetime.datetime.now(zone)
    at = (now + datetime.timedelta(minutes=1)).replace(second=0, microsecond=0)
    today = now.date()
    # The household's time first: a time already past when the chore is written (the default
    # 09:00 after 09:00 in Tokyo) is passed over for that day, even if moved later (tasks README).
    settings = c.tasks.SetChoreReminderSettings(cpb.SetChoreReminderSettingsRequest(household_id=hh, reminder_time=at.strftime("%H:%M")),
                                                metadata=auth(anna), timeout=10).settings
    assert settings.reminder_time == at.strftime("%H:%M")
    chore = c.tasks.CreateChore(cpb.CreateChoreRequest(idempotency_key=uuid.uuid4().hex, household_id=hh, name="Water the plants",
                                                       due_date=types.Date(year=today.year, month=today.month, day=today.day),
                                                       assignee_user_ids=[anna["id"]], recurrence=cpb.ChoreRecurrence(weekly=cpb.ChoreWeekly()),
                                                       time_zone="Asia/Tokyo"), metadata=auth(anna), timeout=10).chore
    time.sleep(1)
    base = [r for r in fake.received() if r["token"] == apns_token]
    assert base == [], "nothing before the chosen time"

    got = fake.wait_for("the due-today reminder", lambda r: any(x["token"] == apns_token for x in r), timeout=100)
    reminder = next(x for x in got if x["token"] == apns_token)
    arrived = datetime.datetime.fromtimestamp(reminder["at"] / 1000, zone)
    assert arrived >= at, f"arrived at {arrived}, before {at}"
    assert (arrived - at).total_seconds() < 30, f"arrived at {arrived}, long after {at}"
    assert reminder["payload"]["aps"]["alert"]["title"] == "Chore due today: Water the plants"
    assert reminder["payload"]["kind"] == "TASK_REMINDER"

    # tasks restarts: the reminder is not sent again (nor stored twice in the inbox).
    tasks = c.proc("tasks-service")
    tasks.stop()
    tasks.start()
    time.sleep(3)
    assert len([r for r in fake.received() if r["token"] == apns_token]) == 1
    notes = c.social.ListNotifications(spb.ListNotificationsRequest(), metadata=auth(anna), timeout=10).notifications
    assert [n.title for n in notes if n.kind == spb.NOTIFICATION_KIND_TASK_REMINDER] == ["Chore due today: Water the plants"]
    assert chore.chore_id
