"""Tokens hold on every replica (issue 25, defect 2): two real replicas over one PostgreSQL
database; a token created or revoked on one is accepted or refused by the other within a second
(before, the other knew only what it read at its start), and the last admin token of exposed
replicas is kept even when two replicas revoke the last two at once."""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.barriers import wait_until
from tests.pg import fresh_database
from tests.server_process import ServerProcess

PROPAGATION_S = 1.0     # the promise: a change holds on every replica within this


def _bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


@pytest.fixture
def replicas(tmp_path, request):
    """Two replicas on one fresh database (parametrized ``exposed``: ``--host 0.0.0.0 --insecure``,
    open at the start but listening beyond loopback)."""
    extra = ["--host", "0.0.0.0", "--insecure"] if getattr(request, "param", "") == "exposed" else []
    with fresh_database() as dsn:
        pair = [ServerProcess(dsn, log_path=tmp_path / f"replica{i}.log", extra_args=extra) for i in range(2)]
        pair[0].start()       # the first migrates the fresh database
        pair[1].start()
        try:
            yield pair
        finally:
            for rep in pair:
                rep.stop()


def _status(url: str, path: str, token: str | None = None) -> int:
    return httpx.get(url + path, headers=_bearer(token) if token else {}, timeout=10).status_code


def _within(what: str, predicate) -> float:
    """Seconds until ``predicate()`` held (failing if it did not within PROPAGATION_S)."""
    start = time.monotonic()
    wait_until(predicate, timeout_s=PROPAGATION_S, what=what, interval_s=0.02)
    return time.monotonic() - start


def test_a_token_made_or_revoked_on_one_replica_holds_on_the_other_within_a_second(replicas):
    a, b = (rep.url for rep in replicas)
    assert _status(b, "/v1/runs") == 200                                    # both start open
    admin = httpx.post(a + "/v1/tokens", json={"name": "oncall", "scopes": ["admin"]}, timeout=10).json()
    # The first token switches access control on everywhere, and works everywhere.
    _within("b to close", lambda: _status(b, "/v1/runs") == 401)
    _within("b to accept a's admin token", lambda: _status(b, "/v1/tokens", admin["token"]) == 200)
    reader = httpx.post(a + "/v1/tokens", json={"name": "analyst", "scopes": ["read"]},
                        headers=_bearer(admin["token"]), timeout=10).json()
    _within("b to accept a's read token", lambda: _status(b, "/v1/runs", reader["token"]) == 200)
    assert _status(b, "/v1/tokens", reader["token"]) == 403                 # with its scopes, not more
    r = httpx.delete(f"{a}/v1/tokens/{reader['id']}", headers=_bearer(admin["token"]), timeout=10)
    assert r.status_code == 200
    _within("b to refuse the revoked token", lambda: _status(b, "/v1/runs", reader["token"]) == 401)
    # And the other way round: made on b, revoked on b, seen by a.
    other = httpx.post(b + "/v1/tokens", json={"name": "trainer", "scopes": ["ingest", "read"]},
                       headers=_bearer(admin["token"]), timeout=10).json()
    _within("a to accept b's token", lambda: _status(a, "/v1/runs", other["token"]) == 200)
    assert httpx.delete(f"{b}/v1/tokens/{other['id']}", headers=_bearer(admin["token"]), timeout=10).status_code == 200
    _within("a to refuse b's revoked token", lambda: _status(a, "/v1/runs", other["token"]) == 401)


@pytest.mark.parametrize("replicas", ["exposed"], indirect=True)
def test_two_replicas_revoking_the_last_two_admin_tokens_at_once_keep_one(replicas):
    a, b = (rep.url for rep in replicas)
    keeper: dict = {}   # the admin token that survived the last round (none before the first)
    for round_ in range(3):
        first = httpx.post(a + "/v1/tokens", json={"name": f"one-{round_}", "scopes": ["admin"]},
                           headers=_bearer(keeper["token"]) if round_ else {}, timeout=10).json()
        second = httpx.post(a + "/v1/tokens", json={"name": f"two-{round_}", "scopes": ["admin"]},
                            headers=_bearer(first["token"]), timeout=10).json()
        if round_:   # the survivor of the last round goes, leaving exactly these two
            assert httpx.delete(f"{a}/v1/tokens/{keeper['id']}", headers=_bearer(first["token"]),
                                timeout=10).status_code == 200
        _within("b to know both", lambda: _status(b, "/v1/tokens", second["token"]) == 200)
        with ThreadPoolExecutor(2) as pool:   # each revokes itself: the loser's token stays valid
            answers = list(pool.map(
                lambda job: httpx.delete(f"{job[0]}/v1/tokens/{job[1]['id']}", headers=_bearer(job[1]["token"]),
                                         timeout=10),
                [(a, first), (b, second)]))
        assert sorted(r.status_code for r in answers) == [200, 409], [r.text for r in answers]
        keeper = second if answers[0].status_code == 200 else first
        assert _status(a, "/v1/tokens", keeper["token"]) == 200
        assert _status(b, "/v1/runs") == 401 and _status(a, "/v1/runs") == 401
