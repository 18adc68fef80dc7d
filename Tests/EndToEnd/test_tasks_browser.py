"""The gateway's team-task pages in a real browser: headless Chromium (Debian's chromium, driven by
Debian's chromedriver through Selenium) against real accounts, social, tasks and gateway
processes. The upload form is filled and sent as a person would (type the token, choose a file,
press the button); the bytes are then read back through gRPC and compared. An expired token's page
and the public link page are checked too. Screenshots of every page are kept (paths printed; under
$E2E_ARTIFACTS when set)."""
import hashlib
import os
import time
import urllib.error
import urllib.request

import pytest

from tasks_cluster import artifacts_dir, auth, start_cluster
from headless import chromium



@pytest.fixture
def browser():
    yield from chromium("430,900")


@pytest.fixture
def cluster(tmp_path, stubs):
    c = start_cluster(tmp_path)
    yield c
    c.stop()


def shot(driver, tmp_path, name):
    path = artifacts_dir(tmp_path) / f"{name}.png"
    # The whole page, at a phone's width.
    height = driver.execute_script("return Math.max(document.body.scrollHeight, 600)")
    driver.set_window_size(430, min(height + 120, 2400))
    driver.save_screenshot(str(path))
    print(f"screenshot: {path}")
    return path


def team_task(c, name, members):
    creator = members[0]
    t = c.tasks.CreateTeamTask(c.ttpb.CreateTeamTaskRequest(idempotency_key=os.urandom(8).hex(), name=name,
                                                             description="Record the checkout flow walkthrough.\nCollect screenshots.",
                                                             participant_usernames=[m["username"] for m in members[1:]]),
                               metadata=auth(creator), timeout=10).task
    return t


# Waits ignore WebDriverException: while the next page replaces the old one, Chromium may report
# a node of the old page as "Node with given id does not belong to the document" (an error of
# its inspector, not a stale element), which failed this test once in a full run.
def test_upload_page_in_a_browser_then_bytes_back_through_grpc(cluster, browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.support.ui import WebDriverWait

    c = cluster
    alice, bob = c.sign_up("alice", "Alice Martin"), c.sign_up("bob", "Bob Kowalski")
    task = team_task(c, "Prepare sprint 12 demo", [alice, bob])
    token = c.tasks.CreateTeamTaskUploadToken(c.ttpb.CreateTeamTaskUploadTokenRequest(task_id=task.task_id), metadata=auth(bob),
                                              timeout=10).upload_token
    # A real PDF-looking file of 1 MiB with a name a person would have.
    data = b"%PDF-1.7\n" + os.urandom(1024 * 1024)
    path = tmp_path / "sprint 12 – notes <final>.pdf"
    path.write_bytes(data)

    browser.get(f"{c.gateway_url}/upload")
    assert "Attach a file" in browser.title
    shot(browser, tmp_path, "1-upload-form")
    browser.find_element(By.ID, "token").send_keys(token.lower())  # as typed on a phone
    browser.find_element(By.ID, "file").send_keys(str(path))
    browser.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    WebDriverWait(browser, 30, ignored_exceptions=[WebDriverException]).until(EC.title_is("File attached"))
    body = browser.find_element(By.TAG_NAME, "body").text
    assert "Attached" in body and "Prepare sprint 12 demo" in body and "sprint 12 – notes <final>.pdf" in body
    assert hashlib.sha256(data).hexdigest() in body
    shot(browser, tmp_path, "2-upload-confirmation")

    # The same bytes back through gRPC (the gateway), as a participant.
    got = c.tasks.GetTeamTask(c.ttpb.GetTeamTaskRequest(task_id=task.task_id), metadata=auth(alice), timeout=10).task
    assert [a.filename for a in got.attachments] == ["sprint 12 – notes <final>.pdf"]
    back = c.tasks.GetTeamTaskAttachment(c.ttpb.GetTeamTaskAttachmentRequest(task_id=task.task_id, attachment_id=got.attachments[0].attachment_id),
                                         metadata=auth(alice), timeout=20)
    assert back.data == data and back.attachment.content_type == "application/pdf"

    # A wrong token: the form again, saying so, nothing attached.
    browser.get(f"{c.gateway_url}/upload")
    browser.find_element(By.ID, "token").send_keys("ZZZZ-ZZZZZ")
    browser.find_element(By.ID, "file").send_keys(str(path))
    browser.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    WebDriverWait(browser, 30, ignored_exceptions=[WebDriverException]).until(EC.text_to_be_present_in_element((By.TAG_NAME, "body"), "Not attached"))
    assert "No task has this token" in browser.find_element(By.TAG_NAME, "body").text
    shot(browser, tmp_path, "3-upload-unknown-token")
    # A refused type (HTML) is named.
    html = tmp_path / "page.html"
    html.write_bytes(b"<html><script>alert(1)</script></html>")
    browser.get(f"{c.gateway_url}/upload?token={token}")
    assert browser.find_element(By.ID, "token").get_attribute("value") == token
    browser.find_element(By.ID, "file").send_keys(str(html))
    browser.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    WebDriverWait(browser, 30, ignored_exceptions=[WebDriverException]).until(EC.text_to_be_present_in_element((By.TAG_NAME, "body"), "Not attached"))
    assert "text/html files are not accepted" in browser.find_element(By.TAG_NAME, "body").text
    shot(browser, tmp_path, "4-upload-refused-type")
    assert len(c.tasks.GetTeamTask(c.ttpb.GetTeamTaskRequest(task_id=task.task_id), metadata=auth(alice), timeout=10).task.attachments) == 1

    # The page's headers: no script can run, no sniffing, nothing cached.
    with urllib.request.urlopen(f"{c.gateway_url}/upload", timeout=10) as r:
        assert r.headers["content-type"] == "text/html; charset=utf-8"
        assert r.headers["x-content-type-options"] == "nosniff"
        assert "default-src 'none'" in r.headers["content-security-policy"] and "script-src" not in r.headers["content-security-policy"]
        assert r.headers["cache-control"] == "no-store"


def test_expired_token_page(tmp_path, stubs, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.support.ui import WebDriverWait

    c = start_cluster(tmp_path, tasks_env={"TASKS_UPLOAD_TOKEN_LIFETIME_SECONDS": "1"})
    try:
        alice = c.sign_up("alice")
        task = team_task(c, "Quarterly report", [alice])
        token = c.tasks.CreateTeamTaskUploadToken(c.ttpb.CreateTeamTaskUploadTokenRequest(task_id=task.task_id), metadata=auth(alice),
                                                  timeout=10).upload_token
        time.sleep(1.5)
        f = tmp_path / "late.txt"
        f.write_text("too late")
        browser.get(f"{c.gateway_url}/upload")
        browser.find_element(By.ID, "token").send_keys(token)
        browser.find_element(By.ID, "file").send_keys(str(f))
        browser.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
        WebDriverWait(browser, 30, ignored_exceptions=[WebDriverException]).until(EC.text_to_be_present_in_element((By.TAG_NAME, "body"), "Not attached"))
        body = browser.find_element(By.TAG_NAME, "body").text
        assert "This task token has expired" in body and "Ask for a new token" in body
        shot(browser, tmp_path, "5-upload-expired-token")
        assert not c.tasks.GetTeamTask(c.ttpb.GetTeamTaskRequest(task_id=task.task_id), metadata=auth(alice), timeout=10).task.attachments
    finally:
        c.stop()


def test_public_link_page(cluster, browser, tmp_path):
    from selenium.webdriver.common.by import By

    c = cluster
    alice, bob = c.sign_up("alice", "Alice Martin"), c.sign_up("bob", "<img src=x onerror=alert(1)>")
    task = team_task(c, "Ship <b>v2</b> & celebrate", [alice, bob])
    for u in (alice, bob):
        c.tasks.SetTeamTaskCompletion(c.ttpb.SetTeamTaskCompletionRequest(task_id=task.task_id, completed=True), metadata=auth(u), timeout=10)
    link = c.tasks.CreateTeamTaskLink(c.ttpb.CreateTeamTaskLinkRequest(task_id=task.task_id), metadata=auth(alice), timeout=10)
    assert link.public_path == f"/t/{link.link_token}"

    browser.get(c.gateway_url + link.public_path)
    body = browser.find_element(By.TAG_NAME, "body").text
    assert "Ship <b>v2</b> & celebrate" in body  # shown as text, not markup
    assert "Completed" in body and "2 of 2 done" in body and "Alice Martin" in body
    assert "<img src=x onerror=alert(1)>" in body
    assert not browser.find_elements(By.TAG_NAME, "img") and not browser.find_elements(By.TAG_NAME, "b")
    assert "Collect screenshots." in body
    shot(browser, tmp_path, "6-public-link")

    # Revoked: the page says the link does not work (404).
    c.tasks.RevokeTeamTaskLink(c.ttpb.RevokeTeamTaskLinkRequest(task_id=task.task_id), metadata=auth(bob), timeout=10)
    browser.get(c.gateway_url + link.public_path)
    assert "This link does not work" in browser.find_element(By.TAG_NAME, "body").text
    shot(browser, tmp_path, "7-public-link-revoked")
    try:
        urllib.request.urlopen(c.gateway_url + link.public_path, timeout=10)
        raise AssertionError("a revoked link answered 200")
    except urllib.error.HTTPError as e:
        assert e.code == 404 and e.headers["cache-control"] == "no-store"
