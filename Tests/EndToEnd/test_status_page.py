"""The gateway's status page (`GET /status`, `/status.json`; docs/observability.md, "Status page")
against real accounts, social, finance, tasks, matchmaking and gateway processes: while calls go
through the gateway (OK ones and failing ones, to accounts and social), the page in headless
Chromium, at a phone's size (375×812, mobile emulation) and at a desktop's, shows every service,
a request rate for the ones called, an error rate where calls failed, and no horizontal scroll on
the phone; a stopped service then shows as down. Nothing secret is on the page. Screenshots go to
$E2E_ARTIFACTS (else the test's tmp_path) and are copied to /tmp/status-page-*.png."""
import json
import os
import shutil
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import grpc
import pytest

from conftest import Proc, free_port
from headless import chromium

PASSWORD = "correct horse battery staple"
SERVICES = ("accounts", "social", "finance", "tasks", "matchmaking")
SERVICE_TOKEN = "e2e-service-credential-0123456789abcdef"
GATEWAY_TOKEN = "e2e-gateway-credential-0123456789abcdef"


@pytest.fixture
def cluster(tmp_path, stubs):
    ports = {n: free_port() for n in SERVICES + ("gateway",)}
    env = dict(os.environ)
    env.update({
        "DATA_DIR": str(tmp_path),
        "SERVICE_TOKEN": SERVICE_TOKEN,
        "GATEWAY_TOKEN": GATEWAY_TOKEN,
        "GATEWAY_UPSTREAMS": ",".join(SERVICES),
        "ACCOUNTS_SCRYPT_N": "1024",
        "LOG_LEVEL": "info",
        # Scrape every second and poll health twice a second, so the test need not wait long.
        "GATEWAY_STATUS_SCRAPE_MS": "1000",
        "GATEWAY_HEALTH_INTERVAL_MS": "500",
    })
    for name in SERVICES:
        env[f"{name.upper()}_ADDR"] = f"127.0.0.1:{ports[name]}"
    procs = {}
    try:
        for name in SERVICES:
            procs[name] = Proc(f"{name}-service", ["--host", "127.0.0.1", "--port", str(ports[name]), "--data-dir", str(tmp_path / name)],
                               env, ports[name]).start()
        procs["gateway"] = Proc("gateway", ["--host", "127.0.0.1", "--port", str(ports["gateway"])], env, ports["gateway"]).start()
        yield {"procs": procs, "ports": ports, "url": f"http://127.0.0.1:{ports['gateway']}"}
    finally:
        for p in reversed(list(procs.values())):
            p.stop()


@pytest.fixture
def browser():
    yield from chromium("1280,900")


class Load:
    """Calls through the gateway on a thread until stopped: accounts LogIn with the right password
    (OK) and a wrong one (UNAUTHENTICATED), GetSigningKeys (OK), and social GetMyTeam without a token
    (refused by the gateway: UNAUTHENTICATED there, never reaching social) and with one (reaches
    social)."""

    def __init__(self, url_port):
        from accounts.v1 import accounts_pb2, accounts_pb2_grpc
        from social.v1 import social_pb2, social_pb2_grpc

        self.apb, self.spb = accounts_pb2, social_pb2
        self.channel = grpc.insecure_channel(f"127.0.0.1:{url_port}")
        self.accounts = accounts_pb2_grpc.AccountsStub(self.channel)
        self.social = social_pb2_grpc.SocialStub(self.channel)
        name = f"ops{uuid.uuid4().hex[:8]}"
        r = self.accounts.SignUp(self.apb.SignUpRequest(username=name, email=f"{name}@example.com", password=PASSWORD,
                                                        display_name="Ops"), timeout=10)
        self.username, self.token = name, r.session.access_token
        self.codes = {}
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def call(self, fn):
        try:
            fn()
            code = "OK"
        except grpc.RpcError as e:
            code = e.code().name
        self.codes[code] = self.codes.get(code, 0) + 1

    def run(self):
        a, s = self.apb, self.spb
        auth = [("authorization", f"Bearer {self.token}")]
        while not self.stopped.is_set():
            self.call(lambda: self.accounts.LogIn(a.LogInRequest(username=self.username, password=PASSWORD), timeout=5))
            self.call(lambda: self.accounts.LogIn(a.LogInRequest(username=self.username, password="wrong password"), timeout=5))
            self.call(lambda: self.accounts.GetSigningKeys(a.GetSigningKeysRequest(), timeout=5))
            self.call(lambda: self.social.GetMyTeam(s.GetMyTeamRequest(), timeout=5))
            self.call(lambda: self.social.GetMyTeam(s.GetMyTeamRequest(), metadata=auth, timeout=5))
            time.sleep(0.05)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stopped.set()
        self.thread.join(10)
        self.channel.close()


def status_json(c):
    with urllib.request.urlopen(c["url"] + "/status.json", timeout=5) as r:
        assert r.headers["content-type"] == "application/json"
        return json.loads(r.read())


def process(report, name):
    return next(p for p in report["processes"] if p["name"] == name)


def wait_for(check, timeout=30, interval=0.2):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"condition not met in {timeout} s (last: {last})")


def artifacts(tmp_path):
    d = Path(os.environ.get("E2E_ARTIFACTS", tmp_path / "artifacts"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def phone(driver):
    """A phone's viewport: 375×812 CSS pixels, mobile (the viewport meta applies), 2× pixels."""
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {"width": 375, "height": 812, "deviceScaleFactor": 2, "mobile": True})


def desktop(driver):
    driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    driver.set_window_size(1280, 900)


def shot(driver, tmp_path, name, full_width=None):
    """The whole page (the viewport grown to the page's height), kept and copied to /tmp."""
    path = artifacts(tmp_path) / f"status-page-{name}.png"
    height = driver.execute_script("return Math.max(document.documentElement.scrollHeight, 600)")
    if full_width:
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                               {"width": full_width, "height": min(height, 4000), "deviceScaleFactor": 2, "mobile": True})
    else:
        driver.set_window_size(1280, min(height + 140, 4000))
    driver.save_screenshot(str(path))
    shutil.copy(path, f"/tmp/status-page-{name}.png")
    print(f"screenshot: {path} (copied to /tmp/status-page-{name}.png)")
    return path


def card(driver, name):
    from selenium.webdriver.common.by import By

    el = driver.find_element(By.ID, f"svc-{name}")
    return el, {k: el.get_attribute(f"data-{k}") for k in ("health", "metrics", "rps", "error-ratio", "server-error-ratio")}


def load_status(driver, c):
    driver.get(c["url"] + "/status")
    assert driver.title == "Backend status"


def test_status_page_on_a_phone_and_a_desktop_then_a_service_down(cluster, browser, tmp_path):
    from selenium.webdriver.common.by import By

    c = cluster
    with Load(c["ports"]["gateway"]) as load:
        # Two scrapes with calls between them: rates for accounts, social and the gateway.
        def rates_seen():
            r = status_json(c)
            acc, soc, gw = process(r, "accounts"), process(r, "social"), process(r, "gateway")
            # Each process is scraped on its own schedule: the gateway's rates may come a scrape later.
            return (acc["requestsPerSecond"] or 0) > 0 and (acc["errorRatio"] or 0) > 0 and (soc["requestsPerSecond"] or 0) > 0 \
                and (gw["requestsPerSecond"] or 0) > 0 and (gw["errorRatio"] or 0) > 0 and r
        report = wait_for(rates_seen)
        assert report["serving"] is True and report["requiredDown"] == []
        assert [p["name"] for p in report["processes"]] == ["gateway", *("accounts", "social", "tasks", "finance", "matchmaking")]
        for p in report["processes"]:
            assert p["health"] in ("up", "serving") and p["metrics"] == "ok", p
        acc = process(report, "accounts")
        # Wrong passwords are the clients' errors: in the error rate, not the server error rate.
        assert "UNAUTHENTICATED" in acc["codesPerSecond"] and acc["serverErrorRatio"] == 0
        assert acc["meanLatencySeconds"] > 0 and acc["p95LatencySeconds"] > 0
        gw = process(report, "gateway")
        assert gw["requestsPerSecond"] > 0 and gw["errorRatio"] > 0  # its own refusals count there
        # Without outbox_* series a service's outbox is null (the page shows "—").
        assert all(p["outbox"] is None or isinstance(p["outbox"], list) for p in report["processes"])

        # The phone.
        phone(browser)
        load_status(browser, c)
        assert browser.execute_script("return window.innerWidth") == 375
        assert browser.execute_script("return document.documentElement.scrollWidth") <= 375, "no horizontal scroll on a phone"
        for name in ("gateway",) + SERVICES:
            el, data = card(browser, name)
            assert el.is_displayed() and name in el.text
            assert data["health"] in ("up", "serving"), (name, data)
            box = browser.execute_script("const r = arguments[0].getBoundingClientRect(); return [r.left, r.right]", el)
            assert box[0] >= 0 and box[1] <= 375, f"card {name} fits the phone's width: {box}"
        el, data = card(browser, "accounts")
        assert float(data["rps"]) > 0 and float(data["error-ratio"]) > 0, data
        assert el.find_element(By.CSS_SELECTOR, "dd.rps").text.endswith("/s")
        assert "UNAUTHENTICATED" in el.text
        el, data = card(browser, "social")
        assert float(data["rps"]) > 0, data
        overall = browser.find_element(By.ID, "overall").text
        assert "Serving" in overall
        shot(browser, tmp_path, "phone", full_width=375)

        # The desktop.
        desktop(browser)
        load_status(browser, c)
        assert browser.execute_script("return document.documentElement.scrollWidth <= window.innerWidth")
        tops = {name: browser.execute_script("return arguments[0].getBoundingClientRect().top", card(browser, name)[0]) for name in ("gateway", "accounts", "social")}
        assert tops["gateway"] == tops["accounts"] == tops["social"], f"cards side by side on a desktop: {tops}"
        shot(browser, tmp_path, "desktop")

    # Nothing secret: no credentials, no addresses (clients' or upstreams').
    for text in (browser.page_source, json.dumps(status_json(c))):
        assert SERVICE_TOKEN not in text and GATEWAY_TOKEN not in text and load.token not in text
        assert "127.0.0.1" not in text

    # A stopped service shows as down, the others as before.
    c["procs"]["finance"].stop()

    def finance_down():
        r = status_json(c)
        f = process(r, "finance")
        return f["health"] == "down" and f["metrics"] == "failing" and r
    report = wait_for(finance_down)
    assert report["serving"] is False and report["requiredDown"] == ["finance"]
    assert process(report, "accounts")["health"] == "up"
    phone(browser)
    load_status(browser, c)
    el, data = card(browser, "finance")
    assert data["health"] == "down" and data["metrics"] == "failing", data
    assert "down" in el.text and "cannot connect" in el.text
    assert card(browser, "accounts")[1]["health"] == "up"
    assert "Not serving" in browser.find_element(By.ID, "overall").text and "finance" in browser.find_element(By.ID, "overall").text
    assert browser.execute_script("return document.documentElement.scrollWidth") <= 375
    shot(browser, tmp_path, "phone-finance-down", full_width=375)
