"""The tracker's --web-port: /api/status, /metrics, and the live page in a real headless Chromium."""
import json
import os
import platform
import shutil
import socket
import threading
import urllib.error
import urllib.request

import pytest

from kernelrpc.rpc import connect_tracker
from kernelrpc.wire.tracker_codec import MAGIC_BYTES, TrackerCode, encode_frame
from conftest import wait_until
from servicectl import SRC, queue, start_server

CHROMEDRIVER = "/usr/bin/chromedriver"
CHROMIUM = "/usr/bin/chromium"


def start_tracker_with_page(start_service, **kwargs):
    tracker = start_service("kernelrpc.tracker", ["--port", "0", "--web-port", "0"], **kwargs)
    line = tracker.wait_for_line(r"status page on http://")
    return tracker, line.split("status page on ", 1)[1].strip()


def get(url: str) -> tuple[str, str]:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.headers["Content-Type"], response.read().decode()


def status(page: str) -> dict:
    return json.loads(get(page + "api/status")[1])


def register_raw(tracker, key: str, arch: str) -> socket.socket:
    """A peer registering the way any TVM-protocol server may, with an architecture in its info."""
    sock = socket.create_connection(tracker.address, timeout=10)
    sock.sendall(MAGIC_BYTES)
    assert sock.recv(4) == MAGIC_BYTES
    sock.sendall(encode_frame([TrackerCode.UPDATE_INFO, {"key": f"server:{key}", "addr": [None, 9],
                                                         "device": {"machine": arch}}]))
    sock.recv(64)
    return sock


class Waiter(threading.Thread):
    """A client waiting in the tracker's queue for a board; it gets one when the holder lets go."""

    def __init__(self, tracker):
        super().__init__(daemon=True)
        self.tracker = tracker
        self.error = None
        self.got = threading.Event()

    def run(self):
        try:
            with connect_tracker(*self.tracker.address) as t:
                with t.request("board", session_timeout=30, timeout=60):
                    self.got.set()
        except Exception as exc:  # reported by the test
            self.error = exc


def test_status_json_and_metrics_follow_the_fleet(start_service):
    tracker, page = start_tracker_with_page(start_service)
    assert status(page)["servers"] == []
    server = start_server(start_service, tracker)
    wait_until(lambda: queue(tracker)["free"] == 1)
    (row,) = status(page)["servers"]
    assert row["key"] == "board" and row["state"] == "free" and row["address"].endswith(f":{server.port}")

    with connect_tracker(*tracker.address) as t, t.request("board", session_timeout=30, timeout=30):
        wait_until(lambda: status(page)["servers"][0]["state"] != "free")
        waiter = Waiter(tracker)
        waiter.start()
        wait_until(lambda: status(page)["waiting"])
        st = status(page)
        assert st["waiting"][0]["key"] == "board" and st["waiting"][0]["waited"] >= 0
        assert st["queues"][0]["waiting"] == 1 and st["servers"][0]["held_by"]
    assert waiter.got.wait(30) and (waiter.join(30) or waiter.error is None)
    st = status(page)
    assert len(st["sessions"]) == 2 and {s["key"] for s in st["sessions"]} == {"board"}

    kind, metrics = get(page + "metrics")
    assert kind.startswith("text/plain")
    assert 'kernelrpc_tracker_servers{key="board"} 1.0' in metrics
    assert 'kernelrpc_tracker_matches_total{key="board"} 2.0' in metrics
    assert 'kernelrpc_tracker_queue_wait_seconds_count{key="board"} 2.0' in metrics
    assert "kernelrpc_tracker_lease_expiries_total" in metrics
    kind, html = get(page)
    assert kind.startswith("text/html") and 'id="servers"' in html


def test_web_port_without_the_extra_names_it(start_service, tmp_path):
    hidden = tmp_path / "hide"
    (hidden / "tornado").mkdir(parents=True)
    (hidden / "tornado" / "__init__.py").write_text("raise ImportError(\"No module named 'tornado'\")\n")
    with pytest.raises(RuntimeError, match=r"needs tornado: pip install 'kernelrpc\[web\]'"):
        start_service("kernelrpc.tracker", ["--port", "0", "--web-port", "0"], timeout=20,
                      env={"PYTHONPATH": os.pathsep.join([str(hidden), SRC])})


def chromium(tmp_path):
    webdriver = pytest.importorskip("selenium.webdriver")
    if not (os.access(CHROMEDRIVER, os.X_OK) and shutil.which(CHROMIUM)):
        pytest.skip("needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)")
    from selenium.webdriver.chrome.service import Service as DriverService

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--window-size=1200,900", f"--user-data-dir={tmp_path / 'profile'}"):
        options.add_argument(flag)
    return webdriver.Chrome(service=DriverService(executable_path=CHROMEDRIVER), options=options)


def test_page_shows_servers_and_queued_requests_live(start_service, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    tracker, page = start_tracker_with_page(start_service)
    browser = chromium(tmp_path)
    try:
        browser.get(page)
        wait = WebDriverWait(browser, 30, poll_frequency=0.1)
        text = lambda table: browser.find_element(By.ID, table).text  # noqa: E731
        wait.until(lambda _: "updated" in browser.find_element(By.ID, "updated").text)
        assert "none" in text("servers")

        server = start_server(start_service, tracker)              # registers after the page opened
        wait.until(lambda _: f":{server.port}" in text("servers"))
        assert "board" in text("servers") and "free" in text("servers")
        wait.until(lambda _: platform.machine() in text("servers"))   # from the server's own report
        odd = register_raw(tracker, "<i>odd</i>", "aarch64")      # shown as text, never as markup
        wait.until(lambda _: "aarch64" in text("servers"))
        assert "<i>odd</i>" in text("servers")
        odd.close()

        with connect_tracker(*tracker.address) as t, t.request("board", session_timeout=30, timeout=30):
            waiter = Waiter(tracker)
            waiter.start()
            wait.until(lambda _: "board" in text("waiting"))
            wait.until(lambda _: "in session" in text("servers") or "leased" in text("servers"))
            shot = os.path.join(os.environ.get("KERNELRPC_ARTIFACTS", str(tmp_path)), "status-page.png")
            os.makedirs(os.path.dirname(shot), exist_ok=True)
            assert browser.save_screenshot(shot) and os.path.getsize(shot) > 1000
            print(f"screenshot: {shot}")
        assert waiter.got.wait(30)
        waiter.join(30)
        wait.until(lambda _: "none" in text("waiting"))
        wait.until(lambda _: text("sessions").count("board") >= 2)
    finally:
        browser.quit()


TOKEN = "page-token-0123456789abcdef"


def start_tracker_with_token(start_service, tmp_path, *extra):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    tracker = start_service("kernelrpc.tracker", ["--port", "0", "--web-port", "0", "--auth-token-file",
                                                  str(token_file), *extra])
    line = tracker.wait_for_line(r"status page on http://")
    return tracker, line.split("status page on ", 1)[1].strip()


def fetch(url: str, authorization: str | None = None):
    """``(status, headers, body)`` of a GET, with an ``Authorization`` header when given."""
    request = urllib.request.Request(url, headers={"Authorization": authorization} if authorization else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, exc.read().decode()


def basic(user: str, password: str) -> str:
    import base64

    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_with_an_auth_token_every_path_requires_it(start_service, tmp_path):
    tracker, page = start_tracker_with_token(start_service, tmp_path)
    for path in ("", "api/status", "metrics"):
        code, headers, body = fetch(page + path)
        assert code == 401 and "auth token" in body
        challenges = headers.get_all("WWW-Authenticate")
        assert any(c.startswith('Basic realm="kernelrpc tracker"') for c in challenges)
        assert any(c.startswith("Bearer") for c in challenges)
        for wrong in (basic("lab", "not-the-token"), "Bearer not-the-token", "Bearer ", basic("lab", ""),
                      "Basic !!!", "Digest " + TOKEN, basic(TOKEN, "")):
            assert fetch(page + path, wrong)[0] == 401, wrong
        for right in (basic("anyone", TOKEN), basic("", TOKEN), "Bearer " + TOKEN, "bearer  " + TOKEN):
            code, headers, body = fetch(page + path, right)
            assert code == 200, right
    assert json.loads(fetch(page + "api/status", "Bearer " + TOKEN)[2])["servers"] == []
    assert "# TYPE kernelrpc_tracker_servers gauge" in fetch(page + "metrics", "Bearer " + TOKEN)[2]
    assert not any("status page" in line and "clear text" in line for line in tracker.lines)


def test_a_plain_http_page_beyond_loopback_warns_that_the_token_crosses_the_wire(start_service, tmp_path):
    tracker, _ = start_tracker_with_token(start_service, tmp_path, "--web-host", "0.0.0.0")
    assert tracker.wait_for_line(r"plain HTTP on an address other than loopback.*clear text")


def test_a_browser_is_asked_for_the_token_and_shows_the_page_with_it(start_service, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    tracker, page = start_tracker_with_token(start_service, tmp_path)
    browser = chromium(tmp_path)
    try:
        browser.get(page)                              # headless: the prompt stays unanswered
        assert browser.find_elements(By.ID, "updated") == [] and "Servers" not in browser.page_source
        host_port = page.split("//", 1)[1]
        browser.get(f"http://lab:{TOKEN}@{host_port}")  # what the prompt's answer sends
        wait = WebDriverWait(browser, 30, poll_frequency=0.1)
        wait.until(lambda _: "tracker up" in browser.find_element(By.ID, "updated").text)
        server = start_service("kernelrpc.server", ["--port", "0", "--tracker", f"127.0.0.1:{tracker.port}",
                                                    "--key", "board", "--auth-token-file", str(tmp_path / "token")])
        wait.until(lambda _: f":{server.port}" in browser.find_element(By.ID, "servers").text)
    finally:
        browser.quit()


def test_the_page_is_served_over_https_with_the_trackers_certificate(tls_files):
    import asyncio
    import http.client
    import ssl

    from kernelrpc.wire.tls import TLSConfig
    from kernelrpc.tracker import web
    from kernelrpc.tracker.service import TrackerService

    ready, stop = threading.Event(), threading.Event()
    found = {}

    def serve():
        async def main():
            service = TrackerService(auth_token=TOKEN.encode())
            tls = TLSConfig(cafile=tls_files.ca, certfile=tls_files.cert)
            server, found["address"] = web.start(service, "127.0.0.1", 0, tls=tls)
            ready.set()
            while not stop.is_set():
                await asyncio.sleep(0.05)
            server.stop()
        asyncio.run(main())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        assert ready.wait(30)
        host, port = found["address"]
        context = ssl.create_default_context(cafile=tls_files.ca)
        request = urllib.request.Request(f"https://{host}:{port}/api/status",
                                         headers={"Authorization": "Bearer " + TOKEN})
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            assert response.status == 200 and json.loads(response.read())["servers"] == []
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED|wrong version|EOF"):
            urllib.request.urlopen(f"https://{host}:{port}/", timeout=10,
                                   context=ssl.create_default_context())   # a CA that did not sign it
        with pytest.raises((urllib.error.URLError, ConnectionError, http.client.RemoteDisconnected)):
            urllib.request.urlopen(f"http://{host}:{port}/", timeout=10)    # plain HTTP gets nothing
    finally:
        stop.set()
        thread.join(30)
