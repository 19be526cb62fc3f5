"""Every earlier release's database migrates and starts (issue 25, finding 6), the first release
included: the current server, a real process, starts on each and reads its run back, takes new
pushes, and starts again. A snapshot it cannot read is replayed past with a WARNING line.

The databases in ``fixtures/releases/`` were written by each release's own code
(``fixtures/releases/make_release_db.py``, run in a worktree of that commit), one per schema
version that release had (``schema0``: before versioned schemas), gzipped (a few KB each):

- ``d0bbc5d``: the first release (first-release chunks ``HSC1``, ``attempts`` with 6 columns);
- ``91dd201``: one-block chunks, detector snapshots without state added since;
- ``bc4ca46``: the unversioned release (version 1's tables);
- ``5e91fc9`` (schema 3), ``f760ad4`` (4), ``1132a48`` (5), ``b9805de`` (6).
"""
from __future__ import annotations

import gzip
import sqlite3
from pathlib import Path

import httpx
import pytest

from healthsvc.store.migrations import LATEST
from tests.server_process import ServerProcess

RELEASES = sorted((Path(__file__).parent / "fixtures" / "releases").glob("*.db.gz"))
SNAPSHOTS_OF_EARLIER_FORM = {"91dd201"}   # its monitor snapshots lack the spike detector's peers


def test_there_is_a_database_of_the_first_release_and_of_each_schema_version():
    names = {p.name.split(".")[0] for p in RELEASES}
    assert "d0bbc5d-schema0" in names
    assert {int(n.rsplit("schema", 1)[1]) for n in names} >= {0, 3, 4, 5, 6}


def _read_back(url: str) -> None:
    with httpx.Client(base_url=url, timeout=30) as c:
        assert [r["run_id"] for r in c.get("/v1/runs").json()] == ["old"]
        cols = c.get("/v1/runs/old/metrics").json()["columns"]
        assert cols["step"] == [0, 0, 1, 1, 2, 2, 3, 3] and cols["rank"] == [0, 1] * 4
        assert cols["loss"] == [2.0, 2.0, 1.9, "NaN", "Infinity", 1.8, 1.7, None]   # NaN, Inf, missing kept
        assert cols["host"] == ["node0", "node1"] * 4
        assert [ck["uri"] for ck in c.get("/v1/runs/old/checkpoints").json()] == ["s3://ckpt/2"]
        assert [e["data"] for e in c.get("/v1/runs/old/events").json()] == [{"text": "before the upgrade"}]


@pytest.mark.parametrize("fixture", RELEASES, ids=[p.name.split(".")[0] for p in RELEASES])
def test_the_current_server_starts_on_a_release_database_and_reads_its_run(tmp_path, fixture):
    db = tmp_path / "release.db"
    db.write_bytes(gzip.decompress(fixture.read_bytes()))
    log = tmp_path / "server.log"
    with ServerProcess(db, log_path=log) as srv:
        _read_back(srv.url)
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            r = c.post("/v1/runs/old/metrics", json={"records": [{"step": 4, "rank": k, "loss": 1.5} for k in (0, 1)]})
            assert r.status_code == 202, r.text
            assert r.json()["attempt"] == 1   # the run goes on in its attempt
    with ServerProcess(db, log_path=log) as srv:   # and every later start works as well
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            assert c.get("/v1/runs/old/metrics").json()["columns"]["step"][-2:] == [4, 4]
    text = log.read_text()
    assert "Traceback" not in text and "ERROR" not in text, text[-3000:]
    if fixture.name.split("-")[0] in SNAPSHOTS_OF_EARLIER_FORM:
        assert "WARNING" in text and "monitor snapshot of run old unreadable" in text and "replaying" in text
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("SELECT max(version) FROM schema_version").fetchone() == (LATEST,)
    finally:
        conn.close()


def test_snapshots_the_restore_cannot_read_are_replayed_past(tmp_path):
    """Every owner's snapshot unreadable (the ingest's, the monitor's, the dashboard's): the
    server starts anyway, one WARNING line each, and the history replayed tells the same run."""
    db = tmp_path / "release.db"
    db.write_bytes(gzip.decompress(next(p for p in RELEASES if p.name.startswith("b9805de")).read_bytes()))
    conn = sqlite3.connect(db)
    try:
        kinds = {k for (k,) in conn.execute("SELECT kind FROM run_state")}
        conn.execute("UPDATE run_state SET state = ?", (b"\x00not json",))
        conn.commit()
    finally:
        conn.close()
    assert kinds == {"ingest", "monitor", "dashboard"}
    log = tmp_path / "server.log"
    with ServerProcess(db, log_path=log) as srv:
        _read_back(srv.url)
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            assert c.get("/v1/runs/old").json()["last_step"] == 3
    text = log.read_text()
    assert "Traceback" not in text and "ERROR" not in text, text[-3000:]
    for kind in sorted(kinds):
        assert f"{kind} snapshot of run old unreadable" in text
