"""Admin actions send the pasted token, and a 401/403 says what to do.

Token checks are being added to the service separately; until they land, the service accepts
every request, so the refusals come from a small loopback proxy in front of the real server that
answers POSTs itself — 401 without ``Authorization: Bearer <TOKEN>``, 403 with another token —
and forwards everything else (and accepted POSTs) unchanged.
"""
from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from tests.dashboard import browser, replay
from tests.dashboard.conftest import open_page

TOKEN = "admin-token-123"
RUN = "auth-run"


class Proxy:
    def __init__(self, upstream: str) -> None:
        self.seen_auth: list[str | None] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _forward(self, body: bytes | None) -> None:
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
                r = httpx.request(self.command, upstream + self.path, content=body, headers=headers, timeout=30)
                self.send_response(r.status_code)
                for k, v in r.headers.items():
                    if k.lower() not in ("content-length", "transfer-encoding", "connection", "content-encoding"):
                        self.send_header(k, v)
                self.send_header("content-length", str(len(r.content)))
                self.end_headers()
                self.wfile.write(r.content)

            def do_GET(self):
                self._forward(None)

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                auth = self.headers.get("authorization")
                proxy.seen_auth.append(auth)
                status = None if auth == f"Bearer {TOKEN}" else (401 if auth is None else 403)
                if status is None:
                    return self._forward(body)
                out = b'{"detail": [{"loc": ["header", "authorization"], "msg": "admin token required", "type": "auth"}]}'
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


@pytest.fixture(scope="module")
def proxy(dash_server):
    with httpx.Client(base_url=dash_server.url, timeout=30) as http:
        replay.push_steps(http, RUN, replay.make_trace(320), 0, 320)
        browser.poll(lambda: http.get("/v1/alerts", params={"run": RUN}).json()["alerts"], what="an alert")
    p = Proxy(dash_server.url)
    yield p
    p.httpd.shutdown()


def click_ack(driver):
    browser.wait_for(driver, "document.querySelector('#alerts tr[data-fingerprint] .ack')", what="alert rows")
    driver.execute_script("document.querySelector('#alerts tr[data-fingerprint] .ack').click()")


def test_refusals_say_what_to_do_and_the_token_is_sent(driver, proxy):
    open_page(driver, proxy, f"/runs/{RUN}")
    driver.execute_script("localStorage.removeItem('healthsvc.token')")
    click_ack(driver)
    text = browser.wait_for(driver, "window.dashboard.lastActionError && document.getElementById('banner').innerText",
                            what="the 401 message")
    assert "not authorised (401)" in text and "Paste an admin token" in text and proxy.seen_auth == [None]

    # A wrong token: 403, named as such.
    box = driver.find_element("id", "token")
    box.send_keys("not-the-admin", "\n")
    driver.execute_script("window.dashboard.lastActionError = null")
    click_ack(driver)
    text = browser.wait_for(driver, "window.dashboard.lastActionError && document.getElementById('banner').innerText",
                            what="the 403 message")
    assert "forbidden (403)" in text and proxy.seen_auth[-1] == "Bearer not-the-admin"

    # The right token is kept in localStorage (survives a reload) and the action goes through.
    box = driver.find_element("id", "token")
    box.clear()
    box.send_keys(TOKEN, "\n")
    open_page(driver, proxy, f"/runs/{RUN}")
    assert driver.find_element("id", "token").get_attribute("value") == TOKEN
    click_ack(driver)
    assert "acknowledge: done" in browser.wait_for(
        driver, "document.getElementById('banner').innerText.includes('done') && document.getElementById('banner').innerText",
        what="the acknowledgement")
    assert proxy.seen_auth[-1] == f"Bearer {TOKEN}"
    errors = [e for e in browser.console_errors(driver) if " 401 " not in e["message"] and " 403 " not in e["message"]]
    assert errors == []  # only the refused requests themselves are logged by the browser
