"""Numbered schema migrations, the same steps for SQLite and PostgreSQL.

A database records the steps applied to it in ``schema_version`` (one row per step). Opening a
store applies the steps after the database's version, each in one transaction with its row, so
a crash mid-upgrade leaves the previous version; several processes opening one PostgreSQL
database at once take turns (an advisory lock), and a step is never applied twice.

- **Version 1** is the schema of the release that had no version (the DDL of ``schema.py``,
  ``findings``, ``bisections``, ``probes``, ``tokens`` and ``outbox`` as it was then; those
  modules' ``SCHEMA`` constants are frozen at version 1: a change to a table is a new step here).
  A database with no ``schema_version`` table is upgraded by step 1, which is idempotent: with
  that release's tables it changes nothing; with the pre-release layout (``attempts`` with
  ``last_step`` and ``n_records``, which answered 500 on every push) it rebuilds ``attempts``;
  an empty database gets every table.
- **Version 2** adds ``leases``: which replica owns a run, with a fencing token.
- **Version 3** adds the outbox's claim (``claimed_until``), so deliveries are claimed by one
  replica at a time (``FOR UPDATE SKIP LOCKED`` on PostgreSQL).
- **Version 4** stores chunk payloads (compressed already) without PostgreSQL's compression.
- **Version 5** adds ``rank_progress``: the ranks each attempt has seen and which of them
  finished, written by replicas sharing a database (a replica sees only the pushes it was sent,
  so whether the whole run finished is the database's to say; see ``ControlWrites.submit_finish``).
- **Version 6** adds ``incarnations``: which process (the client's ``incarnation``) sent each
  rank's records in each attempt, so a restart is told by the trainer rather than by step numbers
  (``healthsvc.store.runstate``), on every replica and after a reload.
- **Version 7** adds ``runs.created_by``: the id of the token whose request created the run (NULL
  in open mode, for admin tokens and for runs made before it), so ``max_runs_per_token`` counts a
  token's runs on every replica and across restarts.
- **Version 8** adds ``findings.observed_at``: when the input that raised a finding reached the
  service (NULL for findings stored before it, and for ones stored by hand), so a finding judged
  late (a takeover's or a restart's replay) is alerted on as it would have been live.

A database newer than the code (a downgrade) is refused: :class:`SchemaTooNew`, whose message
says what to do; the server does not start on it.

Steps are written in SQLite's dialect; PostgreSQL runs them translated (``dialect.pg_ddl``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from healthsvc.store import bisections, findings, outbox_tables, probes, schema, tokens
from healthsvc.store.dialect import split_script


class SchemaTooNew(RuntimeError):
    """The database was migrated by a newer healthsvc than this one."""

    def __init__(self, where: str, found: int, known: int) -> None:
        super().__init__(
            f"the store {where} has schema version {found}, but this healthsvc knows versions up to {known}: "
            f"it was upgraded by a newer healthsvc. Run that version (or newer), or point --db at another "
            f"database; this one is left untouched.")
        self.found, self.known = found, known


def _pre_release_attempts(conn: Any, kind: str) -> None:
    """The layout before version 1 kept per-attempt progress in ``attempts`` (6 columns) and the
    last push in ``runs``; both are derived from the chunks since. Rebuild ``attempts`` with the
    columns version 1 has, keeping every attempt."""
    if kind != "sqlite":  # PostgreSQL stores began at version 1
        return
    columns = [r[1] for r in conn.execute("PRAGMA table_info(attempts)").fetchall()]
    if "last_step" in columns:
        for sql in split_script("""
            ALTER TABLE attempts RENAME TO attempts_before_v1;
            CREATE TABLE attempts (
                run_id     TEXT NOT NULL,
                attempt    INTEGER NOT NULL,
                start_step INTEGER NOT NULL,
                opened_at  REAL NOT NULL,
                PRIMARY KEY (run_id, attempt)
            ) WITHOUT ROWID;
            INSERT INTO attempts SELECT run_id, attempt, start_step, opened_at FROM attempts_before_v1;
            DROP TABLE attempts_before_v1"""):
            conn.execute(sql)
    if "last_push" in [r[1] for r in conn.execute("PRAGMA table_info(runs)").fetchall()]:
        conn.execute("ALTER TABLE runs DROP COLUMN last_push")


def _payload_storage_external(conn: Any, kind: str) -> None:
    """A chunk is compressed already (blosc2): PostgreSQL's TOAST would try to compress it again
    on every insert and gain nothing; EXTERNAL stores it out of line as it is. SQLite: nothing."""
    if kind == "postgresql":
        conn.execute("ALTER TABLE chunks ALTER COLUMN payload SET STORAGE EXTERNAL")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    ddl: str                                          # SQLite dialect; translated for PostgreSQL
    then: Callable[[Any, str], None] | None = None    # (conn, "sqlite" | "postgresql") after the DDL


STEPS: tuple[Migration, ...] = (
    Migration(1, "the schema of the unversioned release",
              schema.SCHEMA + findings.SCHEMA + bisections.SCHEMA + probes.SCHEMA + tokens.SCHEMA + outbox_tables.SCHEMA,
              _pre_release_attempts),
    Migration(2, "leases: which replica owns a run", """
        CREATE TABLE leases (
            run_id     TEXT PRIMARY KEY,
            owner      TEXT NOT NULL,
            token      INTEGER NOT NULL,
            expires_at DOUBLE NOT NULL
        );"""),
    Migration(3, "the outbox's claims: one replica delivers each notification", """
        ALTER TABLE alert_outbox ADD COLUMN claimed_until REAL;"""),
    Migration(4, "chunks' payloads are not compressed again by PostgreSQL", "", _payload_storage_external),
    Migration(5, "rank progress shared by replicas: the ranks an attempt has seen, which finished", """
        CREATE TABLE rank_progress (
            run_id   TEXT NOT NULL,
            attempt  INTEGER NOT NULL,
            rank     INTEGER NOT NULL,
            finished INTEGER NOT NULL,
            PRIMARY KEY (run_id, attempt, rank)
        );"""),
    Migration(6, "incarnations: the process that sent each rank's records in each attempt", """
        CREATE TABLE incarnations (
            run_id      TEXT NOT NULL,
            rank        INTEGER NOT NULL,
            incarnation TEXT NOT NULL,
            attempt     INTEGER NOT NULL,
            PRIMARY KEY (run_id, rank, incarnation)
        ) WITHOUT ROWID;"""),
    Migration(7, "who created each run: the token's id, for the cap on runs per token", """
        ALTER TABLE runs ADD COLUMN created_by TEXT;
        CREATE INDEX runs_created_by ON runs (created_by);"""),
    Migration(8, "when the input that raised each finding arrived: alerts are timed by it", """
        ALTER TABLE findings ADD COLUMN observed_at REAL;"""),
)
LATEST = STEPS[-1].version

VERSION_TABLE = """
CREATE TABLE IF NOT EXISTS schema_version (
    version    INTEGER PRIMARY KEY,
    name       TEXT NOT NULL,
    applied_at REAL NOT NULL
)"""


def current_version(conn: Any) -> int:
    """The database's version (0: none recorded). The table must exist."""
    (version,) = conn.execute("SELECT coalesce(max(version), 0) FROM schema_version").fetchone()
    return int(version)


def migrate(conn: Any, kind: str, where: str, now: float, *, ddl: Callable[[str], str] = lambda s: s,
            lock: str | None = None, steps: tuple[Migration, ...] = STEPS) -> list[int]:
    """Bring the database on ``conn`` (autocommit: this function opens its transactions) to the
    newest version; returns the versions applied. ``lock``: a statement run first in each
    transaction that makes concurrent migrators wait (PostgreSQL's advisory lock)."""
    known = steps[-1].version
    applied: list[int] = []
    while True:
        conn.execute("BEGIN IMMEDIATE" if kind == "sqlite" else "BEGIN")
        try:
            if lock:
                conn.execute(lock)
            conn.execute(ddl(VERSION_TABLE))
            version = current_version(conn)
            if version > known:
                raise SchemaTooNew(where, version, known)
            if version == known:
                conn.execute("COMMIT")
                return applied
            step = steps[version]   # steps are numbered 1..n in order
            assert step.version == version + 1, "migration steps must be numbered 1, 2, 3, ..."
            for sql in split_script(ddl(step.ddl)):
                conn.execute(sql)
            if step.then is not None:
                step.then(conn, kind)
            conn.execute("INSERT INTO schema_version (version, name, applied_at) VALUES (?, ?, ?)",
                         (step.version, step.name, now))
            conn.execute("COMMIT")
            applied.append(step.version)
        except BaseException:
            conn.execute("ROLLBACK")
            raise


def check_version(conn: Any, kind: str, where: str, known: int = LATEST) -> int:
    """The database's version; raises :class:`SchemaTooNew` if it is newer than the code.
    Reads only (the server's command line asks before it starts serving)."""
    tables = conn.execute(
        "SELECT count(*) FROM sqlite_master WHERE name='schema_version'" if kind == "sqlite"
        else "SELECT count(*) FROM information_schema.tables WHERE table_name='schema_version'"
        " AND table_schema=current_schema()").fetchone()[0]
    version = current_version(conn) if tables else 0
    if version > known:
        raise SchemaTooNew(where, version, known)
    return version
