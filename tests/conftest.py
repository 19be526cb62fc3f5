"""Shared fixtures: a real healthsvc server (uvicorn on 127.0.0.1, SQLite file in tmp_path).

``server``/``http``: a server process of the test's own (``server.kill()`` is a crash).
``shared_server``/``shared_http``: one server per module, in this process on its own clock
(``tests/harness.py``), so ``shared_http.drain()`` waits until everything sent so far is
processed; tests only add their own runs to it."""
from __future__ import annotations

import os

import httpx
import pytest

from tests.server_process import ServerProcess

# The tests' webhook receivers listen on loopback, which the service refuses by default (a webhook
# must not reach the service's own host or network); servers started by tests inherit this.
os.environ.setdefault("HEALTHSVC_WEBHOOK_ALLOWED_NETWORKS", "127.0.0.0/8,::1/128")

# Bodies must be application/json (the service answers 415 otherwise); tests that post raw bytes
# with ``content=`` get the header from the client.
JSON = {"content-type": "application/json"}


@pytest.fixture
def server(tmp_path):
    """A running server on a fresh database; ``server.kill()`` / ``server.start()`` to crash/restart."""
    proc = ServerProcess(tmp_path / "healthsvc.db")
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture
def http(server):
    with httpx.Client(base_url=server.url, timeout=30, headers=JSON) as client:
        yield client


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory):
    """One server for a whole module (for tests that only add their own runs)."""
    from tests.harness import ServedService   # the server stack, only for modules that use it
    with ServedService(tmp_path_factory.mktemp("shared"), real_time=True) as service:
        yield service


@pytest.fixture(scope="module")
def shared_http(shared_server):
    """A client of the shared server that can also ``drain()`` it."""
    return shared_server.http
