"""The rollback tests' shared service: real uvicorn on 127.0.0.1 in this process, on a fake clock,
so a test can settle it (every push judged, every finding and alert stored) before it reads."""
from __future__ import annotations

import pytest

from tests.harness import ServedService
from tests.pg import database_for


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory, db_kind):
    directory = tmp_path_factory.mktemp("rollback")
    with database_for(db_kind, directory) as db, ServedService(directory, db=db) as service:
        yield service


@pytest.fixture(scope="module")
def shared_http(shared_server):
    return shared_server.http
