"""Fixtures of the dashboard's browser tests: one headless Chromium for the session, a real
server per module, and a directory for screenshots (``$HEALTHSVC_ARTIFACTS``, else pytest's tmp)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.server_process import ServerProcess
from tests.dashboard import browser


@pytest.fixture(scope="session")
def artifacts(tmp_path_factory) -> Path:
    out = Path(os.environ.get("HEALTHSVC_ARTIFACTS") or tmp_path_factory.mktemp("dashboard-artifacts"))
    out.mkdir(parents=True, exist_ok=True)
    print(f"\ndashboard screenshots: {out}")
    return out


@pytest.fixture(scope="module")
def dash_server(tmp_path_factory):
    proc = ServerProcess(tmp_path_factory.mktemp("dash") / "healthsvc.db")
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture(scope="session")
def driver(tmp_path_factory):
    why = browser.available()
    if why:
        pytest.fail(why)
    d = browser.start_browser(tmp_path_factory.mktemp("chromium-profile"))
    yield d
    d.quit()


def open_page(driver, server, path: str) -> None:
    """Open a page afresh: the previous page stopped, and its console messages dropped (reading
    the log empties it), so a test sees only its own page's errors."""
    driver.get("about:blank")
    driver.get_log("browser")
    driver.get(server.url + path)
    browser.wait_for(driver, "window.dashboard && window.dashboard.ready", what=f"{path} ready")
