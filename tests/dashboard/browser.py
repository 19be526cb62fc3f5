"""A real headless Chromium (Debian's ``chromium`` + ``chromium-driver``) driven by Selenium.

Selenium is pointed at ``/usr/bin/chromedriver`` so Selenium Manager never downloads a driver;
the flags keep Chromium off the network (no sync, no component updates, no QUIC) and the fresh
``--user-data-dir`` keeps runs independent. Console messages are collected (``goog:loggingPrefs``)
so a test can assert there were no errors.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Callable

from tests.barriers import wait_until

CHROMIUM = os.environ.get("HEALTHSVC_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("HEALTHSVC_CHROMEDRIVER", "/usr/bin/chromedriver")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1400,1800"]


def available() -> str | None:
    """None when the browser can run here, else why not."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if not shutil.which(path):
            return f"{path} is missing: ./dev test installs chromium and chromium-driver"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed: ./dev test installs the test extras"
    return None


def start_browser(profile_dir: Path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in FLAGS:
        opts.add_argument(flag)
    opts.add_argument(f"--user-data-dir={profile_dir}")
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)


def wait_for(driver, js: str, timeout_s: float = 15.0, what: str = "") -> Any:
    """Poll ``return <js>`` until it is truthy; its value, or AssertionError with ``what``."""
    last: list[Any] = [None]

    def value() -> Any:
        last[0] = driver.execute_script(f"return {js}")
        return last[0]
    try:
        return wait_until(value, timeout_s=timeout_s, interval_s=0.05, what=what or js)
    except AssertionError as exc:
        raise AssertionError(f"{exc} (last: {last[0]!r})") from None


def console_errors(driver) -> list[dict]:
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def poll(fn: Callable[[], Any], timeout_s: float = 15.0, what: str = "") -> Any:
    return wait_until(fn, timeout_s, what)
