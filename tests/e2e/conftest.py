"""The e2e tests' service: real uvicorn on 127.0.0.1 in this process, on the service's own clock
and default settings (the trainers are real processes in real time), so a test can drain it:
every finding the training caused is stored before the test reads, or asserts that there is none."""
from __future__ import annotations

import pytest

from tests.harness import ServedService


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory):
    with ServedService(tmp_path_factory.mktemp("e2e"), real_time=True) as service:
        yield service


@pytest.fixture(scope="module")
def shared_http(shared_server):
    return shared_server.http
