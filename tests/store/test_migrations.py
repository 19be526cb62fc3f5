"""Upgrades that migrate: a database of an earlier schema opens and is upgraded in place, with its
data; a database newer than the code is refused with a clear message. On SQLite and PostgreSQL.

The earlier schemas are frozen in ``fixtures/`` (the DDL as the release had it); the databases
are filled with that release's SQL, then opened by the service as it is now."""
from __future__ import annotations

import functools
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from healthsvc.store.batch import MetricBatch
from healthsvc.store import migrations
from healthsvc.store.codec import encode_chunk
from healthsvc.store.dialect import pg_ddl, split_script
from healthsvc.store.migrations import LATEST, SchemaTooNew
from healthsvc.store.open import open_store
from tests.harness import InProcessService

pytestmark = pytest.mark.both_stores

FIXTURES = Path(__file__).parent / "fixtures"
T0 = 1_700_000_000.0


class Raw:
    """A plain connection to the test's database (autocommit), ``?`` placeholders on both."""

    def __init__(self, uri: str) -> None:
        self.pg = uri.startswith("postgresql://")
        if self.pg:
            import psycopg
            self.conn = psycopg.connect(uri, autocommit=True)
        else:
            self.conn = sqlite3.connect(uri, isolation_level=None)

    def script(self, ddl: str) -> None:
        for sql in split_script(pg_ddl(ddl) if self.pg else ddl):
            self.conn.execute(sql)

    def execute(self, sql: str, args: tuple = ()) -> list[tuple]:
        cur = self.conn.execute(sql.replace("?", "%s") if self.pg else sql, args)
        return cur.fetchall() if cur.description else []

    def close(self) -> None:
        self.conn.close()


def old_batch() -> MetricBatch:
    b = MetricBatch(steps=np.array([1, 1, 1, 2, 2, 2]), ranks=np.array([0, 1, 2, 0, 1, 2]))
    b.values["loss"] = np.array([1.5, np.nan, np.inf, 1.25, -np.inf, 0.0])
    b.present["loss"] = np.array([True, True, True, True, True, False])
    return b


def fill_release_bc4ca46(db: Raw) -> None:
    """What the unversioned release stored for one run: metrics (NaN, ±Inf, missing), a finding,
    a checkpoint, an event, an outbox row and a token, in that release's columns."""
    payload = encode_chunk(old_batch())
    db.execute("INSERT INTO runs (run_id, created_at, updated_at, config) VALUES (?, ?, ?, ?)",
               ("old", T0, T0 + 2, '{"lr": 0.1}'))
    db.execute("INSERT INTO attempts VALUES (?, ?, ?, ?)", ("old", 1, 1, T0))
    db.execute("INSERT INTO batches VALUES (?, ?, ?, ?)", ("old", "digest-1", 6, T0))
    db.execute("INSERT INTO chunks (run_id, attempt, step_min, step_max, n_records, n_points, fields, has_hosts,"
               " received_at, payload) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
               ("old", 1, 1, 2, 6, 6, "loss", 0, T0, payload))
    db.execute("INSERT INTO checkpoints (run_id, step, uri, attempt, created_at) VALUES (?, ?, ?, ?, ?)",
               ("old", 2, "s3://ckpt/2", 1, T0 + 1))
    db.execute("INSERT INTO events (run_id, kind, step, attempt, ts, data) VALUES (?, ?, ?, ?, ?, ?)",
               ("old", "note", 2, 1, T0 + 1, '{"text": "before the upgrade"}'))
    db.execute("INSERT INTO findings (run_id, attempt, kind, metric, ranks, hosts, step, status, severity, score,"
               " onset_step, evidence, created_at, identity) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
               ("old", 1, "non_finite", "loss", "[1]", "[null]", 1, "firing", "critical", 1.0, 1,
                '{"value": "NaN"}', T0 + 1, "1:non_finite:loss:1"))
    db.execute("INSERT INTO alert_outbox (webhook_id, subscription_id, url, body, created_at, next_attempt_at)"
               " VALUES (?, ?, ?, ?, ?, ?)", ("msg_old", "oncall", "http://127.0.0.1:1/hook", b"{}", T0, T0))


def check_migrated(uri: str, tmp_path: Path) -> None:
    """The service opens the old database: the data is all there, and it takes new pushes."""
    with InProcessService(tmp_path, db=uri) as svc:
        http = svc.http
        assert [r["run_id"] for r in http.get("/v1/runs").json()] == ["old"]
        cols = http.get("/v1/runs/old/metrics").json()["columns"]
        assert cols["step"] == [1, 1, 1, 2, 2, 2]
        assert cols["loss"] == [1.5, "NaN", "Infinity", 1.25, "-Infinity", None]
        stored = http.get("/v1/runs/old/findings").json()[0]   # (the monitor may find it again: no snapshot)
        assert (stored["id"], stored["kind"], stored["evidence"]) == (1, "non_finite", {"value": "NaN"})
        assert [c["uri"] for c in http.get("/v1/runs/old/checkpoints").json()] == ["s3://ckpt/2"]
        assert [e["data"] for e in http.get("/v1/runs/old/events").json()] == [{"text": "before the upgrade"}]
        r = http.post("/v1/runs/old/metrics", json={"records": [{"step": 3, "rank": r, "loss": 1.0} for r in range(3)]})
        assert r.status_code == 202, r.text
        assert r.json()["attempt"] == 1
        svc.drain()
        assert http.get("/v1/runs/old/metrics").json()["columns"]["step"][-3:] == [3, 3, 3]
        run = http.get("/v1/runs/old").json()
        assert [(a["attempt"], a["start_step"], a["last_step"]) for a in run["attempts"]] == [(1, 1, 3)]
        assert svc.app.state.store.reads.get_run_row("old")["config"] == {"lr": 0.1}
    db = Raw(uri)
    try:
        assert [v for (v,) in db.execute("SELECT version FROM schema_version ORDER BY version")] == \
            list(range(1, LATEST + 1))
        assert db.execute("SELECT webhook_id FROM alert_outbox") == [("msg_old",)]
        # The table of version 2 is there; on PostgreSQL the service took the lease of the run it
        # was pushed to (replicas: healthsvc.ownership.leases), SQLite has no leases.
        assert db.execute("SELECT run_id FROM leases") == ([("old",)] if uri.startswith("postgresql") else [])
    finally:
        db.close()


def test_a_database_of_the_unversioned_release_is_upgraded_in_place(db_uri, tmp_path):
    db = Raw(db_uri)
    db.script((FIXTURES / "schema_bc4ca46.sql").read_text())
    fill_release_bc4ca46(db)
    db.close()
    check_migrated(db_uri, tmp_path)


def create_at_version(uri: str, version: int) -> None:
    """A database as the release with schema ``version`` made it: the steps up to it (steps are
    frozen: a change to a table is a new step), and the tables the store adds after them."""
    real = migrations.migrate
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(migrations, "migrate", functools.partial(real, steps=migrations.STEPS[:version]))
        store = open_store(uri)
        store.open()
        store.close()


def records(steps, ranks, incarnation=None):
    return {"records": [{"step": s, "rank": r, "loss": 1.0 + s / 100,
                         **({"incarnation": f"{incarnation}-{r}"} if incarnation else {})}
                        for s in steps for r in ranks]}


def test_a_run_of_the_release_before_incarnations_goes_on_after_the_upgrade(db_uri, tmp_path):
    """Schema 5 (the release before incarnations) with a run in the middle of its first attempt,
    its ingest snapshot in that release's form (no incarnations) and, as replicas wrote it, its
    ranks' progress: after the upgrade the run goes on in its attempt, records without an
    incarnation and a client's first records with one alike, and a restart opens attempt 2."""
    create_at_version(db_uri, 5)
    db = Raw(db_uri)
    try:
        assert db.execute("SELECT max(version) FROM schema_version") == [(5,)]
        db.execute("INSERT INTO runs (run_id, created_at, updated_at) VALUES (?, ?, ?)", ("r", T0, T0))
        db.execute("INSERT INTO attempts VALUES (?, ?, ?, ?)", ("r", 1, 0, T0))
        b = MetricBatch(steps=np.repeat(np.arange(5), 2), ranks=np.tile([0, 1], 5))
        b.values["loss"] = np.ones(10)
        b.present["loss"] = np.ones(10, dtype=bool)
        db.execute("INSERT INTO chunks (run_id, attempt, step_min, step_max, n_records, n_points, fields,"
                   " has_hosts, received_at, payload) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                   ("r", 1, 0, 4, 10, 10, "loss", 0, T0, encode_chunk(b)))
        (watermark,) = db.execute("SELECT max(id) FROM chunks")[0]
        state = {"attempt": 1, "start_step": 0, "finished": False, "finished_ranks": [], "ranks": [0, 1],
                 "last_step": [4, 4], "host_code": [-1, -1], "host_names": []}
        db.execute("INSERT INTO run_state VALUES (?, ?, ?, ?)", ("r", "ingest", watermark, json.dumps(state).encode()))
        for rank in (0, 1):
            db.execute("INSERT INTO rank_progress VALUES (?, ?, ?, ?)", ("r", 1, rank, 0))
    finally:
        db.close()
    with InProcessService(tmp_path, db=db_uri) as svc:
        http = svc.http
        for body, attempt in ((records([5], [0, 1]), 1),              # an old client
                              (records([6, 7], [0, 1], "p1"), 1),     # an upgraded one, going on
                              (records([3], [0, 1], "p2"), 2)):       # resumed from step 3
            r = http.post("/v1/runs/r/metrics", json=body)
            assert (r.status_code, r.json()["attempt"]) == (202, attempt), r.text
        run = http.get("/v1/runs/r").json()
        assert [(a["attempt"], a["start_step"], a["last_step"]) for a in run["attempts"]] == [(1, 0, 7), (2, 3, 3)]
        assert [http.post("/v1/runs/r/finish", json={"rank": rank}).status_code for rank in (0, 1)] == [200, 200]
        assert http.get("/v1/runs/r").json()["status"] == "finished"
    db = Raw(db_uri)
    try:
        assert [v for (v,) in db.execute("SELECT version FROM schema_version ORDER BY version")] == \
            list(range(1, LATEST + 1))
    finally:
        db.close()


def test_the_first_releases_attempts_table_is_rebuilt(tmp_path):
    """The layout that answered 500 on every push (attempts with 6 columns; SQLite only: no
    PostgreSQL store had it)."""
    db_uri = str(tmp_path / "first.db")
    db = Raw(db_uri)
    db.script((FIXTURES / "schema_d0bbc5d.sql").read_text())
    db.execute("INSERT INTO runs (run_id, created_at, updated_at, last_push) VALUES (?, ?, ?, ?)", ("old", T0, T0, T0))
    db.execute("INSERT INTO attempts VALUES (?, ?, ?, ?, ?, ?)", ("old", 1, 1, 2, 6, T0))
    db.execute("INSERT INTO chunks (run_id, attempt, step_min, step_max, n_records, n_points, fields, has_hosts,"
               " received_at, payload) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
               ("old", 1, 1, 2, 6, 6, "loss", 0, T0, encode_chunk(old_batch())))
    db.close()
    with InProcessService(tmp_path, db=db_uri) as svc:
        r = svc.http.post("/v1/runs/old/metrics", json={"records": [{"step": 3, "rank": 0, "loss": 1.0}]})
        assert r.status_code == 202, r.text
        run = svc.http.get("/v1/runs/old").json()
        assert [(a["attempt"], a["start_step"], a["last_step"]) for a in run["attempts"]] == [(1, 1, 3)]


def test_a_fresh_database_and_an_upgraded_one_have_the_same_schema(db_uri, db_kind):
    def columns(uri: str) -> dict[str, list[tuple]]:
        db = Raw(uri)
        try:
            if db.pg:
                rows = db.execute("SELECT table_name, column_name, data_type, is_nullable FROM information_schema.columns"
                                  " WHERE table_schema = current_schema() ORDER BY table_name, ordinal_position")
            else:
                rows = [(t, *c[1:4]) for (t,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")
                        for c in db.execute(f"PRAGMA table_info({t})")]
            out: dict[str, list[tuple]] = {}
            for table, *col in rows:
                out.setdefault(table, []).append(tuple(col))
            return out
        finally:
            db.close()

    store = open_store(db_uri)
    store.open()
    store.close()
    fresh = columns(db_uri)
    from contextlib import nullcontext
    if db_kind == "postgresql":
        from tests.pg import fresh_database
        other = fresh_database()
    else:
        other = nullcontext(db_uri + ".old.db")
    with other as old_uri:
        db = Raw(old_uri)
        db.script((FIXTURES / "schema_bc4ca46.sql").read_text())
        db.close()
        store = open_store(old_uri)
        store.open()
        store.close()
        assert columns(old_uri) == fresh
    assert {"leases", "schema_version", "alert_outbox", "chunks"} <= set(fresh)


def mark_newer(uri: str) -> None:
    store = open_store(uri)
    store.open()
    store.close()
    db = Raw(uri)
    db.execute("INSERT INTO schema_version (version, name, applied_at) VALUES (?, ?, ?)", (LATEST + 1, "from the future", T0))
    db.close()


def test_a_database_newer_than_the_code_is_refused(db_uri):
    mark_newer(db_uri)
    with pytest.raises(SchemaTooNew, match=rf"schema version {LATEST + 1}.*up to {LATEST}"):
        open_store(db_uri).open()
    with pytest.raises(SchemaTooNew):
        open_store(db_uri).check_schema()
    db = Raw(db_uri)   # nothing was changed
    try:
        assert db.execute("SELECT max(version) FROM schema_version") == [(LATEST + 1,)]
    finally:
        db.close()


def test_the_server_refuses_a_newer_database_with_a_message_not_a_traceback(db_uri):
    mark_newer(db_uri)
    proc = subprocess.run([sys.executable, "-m", "healthsvc", "serve", "--db", db_uri, "--port", "1"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert f"has schema version {LATEST + 1}, but this healthsvc knows versions up to {LATEST}" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_migration_steps_are_numbered_in_order():
    assert [s.version for s in migrations.STEPS] == list(range(1, LATEST + 1))


def test_replicas_starting_together_apply_each_step_once(db_uri):
    import threading
    stores = [open_store(db_uri) for _ in range(3)]
    start = threading.Barrier(len(stores))
    errors: list[BaseException] = []

    def opener(store) -> None:
        start.wait()
        try:
            store.open()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=opener, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for s in stores:
        s.close()
    assert errors == []
    db = Raw(db_uri)
    try:
        assert db.execute("SELECT version, count(*) FROM schema_version GROUP BY version ORDER BY version") == \
            [(v, 1) for v in range(1, LATEST + 1)]
    finally:
        db.close()


def test_the_server_says_when_its_store_cannot_be_opened(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "healthsvc", "serve", "--port", "1", "--db",
                           "postgresql://postgres:secret@127.0.0.1:5432/hs_no_such_database"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "cannot open the store postgresql://postgres:***@127.0.0.1:5432/hs_no_such_database" in proc.stderr
    assert "hs_no_such_database\" does not exist" in proc.stderr
    assert "Traceback" not in proc.stderr and "secret" not in proc.stderr
