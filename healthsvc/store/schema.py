"""The store's own tables as version 1 of the schema has them (``migrations``: step 1 runs this
DDL, written in SQLite's dialect and translated for PostgreSQL by ``dialect.pg_ddl``). Frozen at
version 1, like the other modules' ``SCHEMA``: a change to a table is a new numbered step in
``migrations``, so every existing database gets it too."""

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id      TEXT PRIMARY KEY,
    created_at  REAL NOT NULL,
    updated_at  REAL NOT NULL,
    config      TEXT NOT NULL DEFAULT '{}',
    status      TEXT NOT NULL DEFAULT 'running',
    finished_at REAL
);
CREATE TABLE IF NOT EXISTS attempts (
    run_id     TEXT NOT NULL,
    attempt    INTEGER NOT NULL,
    start_step INTEGER NOT NULL,
    opened_at  REAL NOT NULL,
    PRIMARY KEY (run_id, attempt)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS batches (
    run_id      TEXT NOT NULL,
    digest      TEXT NOT NULL,
    n_records   INTEGER NOT NULL,
    received_at REAL NOT NULL,
    PRIMARY KEY (run_id, digest)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS batches_by_time ON batches (received_at);
CREATE TABLE IF NOT EXISTS chunks (
    id          INTEGER PRIMARY KEY,
    run_id      TEXT NOT NULL,
    attempt     INTEGER NOT NULL,
    step_min    INTEGER NOT NULL,
    step_max    INTEGER NOT NULL,
    n_records   INTEGER NOT NULL,
    n_points    INTEGER NOT NULL,
    fields      TEXT NOT NULL,
    has_hosts   INTEGER NOT NULL,
    received_at REAL NOT NULL,
    payload     BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS chunks_by_run_step ON chunks (run_id, step_min);
CREATE TABLE IF NOT EXISTS hosts (
    run_id TEXT NOT NULL,
    rank   INTEGER NOT NULL,
    host   TEXT NOT NULL,
    PRIMARY KEY (run_id, rank)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS checkpoints (
    id         INTEGER PRIMARY KEY,
    run_id     TEXT NOT NULL,
    step       INTEGER NOT NULL,
    uri        TEXT NOT NULL,
    attempt    INTEGER NOT NULL,
    duration_s REAL,
    bytes      INTEGER,
    created_at REAL NOT NULL,
    status     TEXT NOT NULL DEFAULT 'ok',
    note       TEXT,
    UNIQUE (run_id, step, uri)
);
CREATE TABLE IF NOT EXISTS events (
    id      INTEGER PRIMARY KEY,
    run_id  TEXT NOT NULL,
    kind    TEXT NOT NULL,
    step    INTEGER,
    attempt INTEGER NOT NULL,
    ts      REAL NOT NULL,
    data    TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS events_by_run ON events (run_id, id);
CREATE TABLE IF NOT EXISTS heartbeats (
    run_id TEXT NOT NULL,
    rank   INTEGER NOT NULL,
    step   INTEGER,
    phase  TEXT,
    ts     REAL NOT NULL,
    PRIMARY KEY (run_id, rank)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS run_state (
    run_id    TEXT NOT NULL,
    kind      TEXT NOT NULL,
    watermark INTEGER NOT NULL,
    state     BLOB NOT NULL,
    PRIMARY KEY (run_id, kind)
) WITHOUT ROWID;
"""
