"""The rollback tests' shared service: real uvicorn on 127.0.0.1 in this process, on a fake clock,
so a test can settle it (every push judged, every finding and alert stored) before it reads."""
from __future__ import annotations

import pytest

from tests.harness import ServedService


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory):
    with ServedService(tmp_path_factory.mktemp("rollback")) as service:
        yield service


@pytest.fixture(scope="module")
def shared_http(shared_server):
    return shared_server.http
