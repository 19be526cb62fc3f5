"""Shared fixtures: a real healthsvc server (uvicorn on 127.0.0.1, SQLite file in tmp_path)."""
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
    proc = ServerProcess(tmp_path_factory.mktemp("shared") / "healthsvc.db")
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def shared_http(shared_server):
    with httpx.Client(base_url=shared_server.url, timeout=30, headers=JSON) as client:
        yield client
