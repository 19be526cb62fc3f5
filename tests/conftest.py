"""Shared fixtures: a real healthsvc server (uvicorn on 127.0.0.1, SQLite file in tmp_path).

Both stores: a module with ``pytestmark = pytest.mark.both_stores`` runs its tests that use
``db_uri`` (and ``server``, ``http``, ``shared_server``, ``shared_http``, which use it) once on
SQLite and once on PostgreSQL, each on a fresh database (``tests/pg.py``); ``--stores sqlite``
(or ``postgresql``) runs one of them only. Other tests get a SQLite file.

``server``/``http``: a server process of the test's own (``server.kill()`` is a crash).
``shared_server``/``shared_http``: one server per module, in this process on its own clock
(``tests/harness.py``), so ``shared_http.drain()`` waits until everything sent so far is
processed; tests only add their own runs to it."""
from __future__ import annotations

import os

import httpx
import pytest

from tests.pg import database_for
from tests.server_process import ServerProcess

# The tests' webhook receivers listen on loopback, which the service refuses by default (a webhook
# must not reach the service's own host or network); servers started by tests inherit this.
os.environ.setdefault("HEALTHSVC_WEBHOOK_ALLOWED_NETWORKS", "127.0.0.0/8,::1/128")

# Bodies must be application/json (the service answers 415 otherwise); tests that post raw bytes
# with ``content=`` get the header from the client.
JSON = {"content-type": "application/json"}


STORES = ("sqlite", "postgresql")


@pytest.fixture(scope="session")
def wheels(tmp_path_factory):
    """The client and service distributions as wheels, built once a session, offline
    (``tests/packaging/dists.py``)."""
    from tests.packaging.dists import build_wheels
    return build_wheels(tmp_path_factory.mktemp("dists"))


def pytest_addoption(parser):
    parser.addoption("--stores", default=",".join(STORES),
                     help="the stores both_stores tests run on (comma-separated: sqlite,postgresql)")


def pytest_configure(config):
    config.addinivalue_line("markers", "both_stores: the module's db_uri tests run on SQLite and PostgreSQL")


def pytest_generate_tests(metafunc):
    if "db_kind" in metafunc.fixturenames and metafunc.definition.get_closest_marker("both_stores"):
        kinds = [k for k in metafunc.config.getoption("stores").split(",") if k]
        unknown = set(kinds) - set(STORES)
        if unknown:
            raise pytest.UsageError(f"--stores: unknown store {sorted(unknown)} (know {', '.join(STORES)})")
        # Module scope: a module's servers (shared_server, its own module fixtures) are started
        # once per store; db_uri is still a fresh database per test.
        metafunc.parametrize("db_kind", kinds, indirect=True, scope="module")


@pytest.fixture(scope="module")
def db_kind(request):
    return getattr(request, "param", "sqlite")


@pytest.fixture
def db_uri(db_kind, tmp_path):
    """A fresh database of the test's store: a SQLite path, or a PostgreSQL URI (dropped after)."""
    with database_for(db_kind, tmp_path) as uri:
        yield uri


@pytest.fixture
def server(db_uri, tmp_path):
    """A running server on a fresh database; ``server.kill()`` / ``server.start()`` to crash/restart."""
    proc = ServerProcess(db_uri, log_path=tmp_path / "healthsvc.server.log")
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture
def http(server):
    with httpx.Client(base_url=server.url, timeout=30, headers=JSON) as client:
        yield client


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory, db_kind):
    """One server for a whole module (for tests that only add their own runs)."""
    from tests.harness import ServedService   # the server stack, only for modules that use it
    directory = tmp_path_factory.mktemp("shared")
    with database_for(db_kind, directory) as uri, ServedService(directory, db=uri, real_time=True) as service:
        yield service


@pytest.fixture(scope="module")
def shared_http(shared_server):
    """A client of the shared server that can also ``drain()`` it."""
    return shared_server.http


# -- running the suite on several workers (pytest-xdist; ``./dev test`` passes -n and --dist) ----
# ``--dist loadfile``: a module's tests run on one worker, so a module fixture (a server, a
# training, the quality corpus's replay) is set up once, not once per worker. (``loadgroup`` would
# group finer, but its markers do not reach the scheduler under pytest 9: xdist 3.8 renames
# ``item._nodeid``, which pytest 9 no longer reads.)
# The slowest modules go first so the run's tail is short (measured with --durations on the
# 2-core machine: each holds a test or a module fixture of a minute or more).
SLOW_FIRST = (
    "tests/supervise/test_supervise_trainer.py", "tests/replicas/test_soak_short.py",
    "tests/quality/test_real_data.py", "tests/bench/test_smoke.py", "tests/e2e/test_e2e_training.py",
    "tests/integrations/", "tests/e2e/", "tests/service/test_monitor.py", "tests/notebooks/",
    "tests/detectors/test_quality_timing.py", "tests/detectors/test_quality_values.py",
    "tests/detectors/test_rollback_eval.py", "tests/service/test_run_release.py", "tests/supervise/",
)


def pytest_collection_modifyitems(config, items):
    """The slowest modules first (stable: collection order otherwise, a module's tests together)."""
    def rank(item) -> int:
        path = item.nodeid.split("::")[0]
        return next((i for i, prefix in enumerate(SLOW_FIRST) if path.startswith(prefix)), len(SLOW_FIRST))
    items.sort(key=rank)
