"""The outbox's tables as version 1 of the schema has them (``migrations``); what they hold is
described in :mod:`healthsvc.store.outbox`. Apart from it so the migrations need not import the
alerting package."""

SCHEMA = """
CREATE TABLE IF NOT EXISTS alert_outbox (
    seq             INTEGER PRIMARY KEY AUTOINCREMENT,
    webhook_id      TEXT NOT NULL UNIQUE,
    subscription_id TEXT NOT NULL,
    url             TEXT NOT NULL,
    secret          TEXT NOT NULL DEFAULT '',
    content_type    TEXT NOT NULL DEFAULT 'application/json',
    body            BLOB NOT NULL,
    group_key       TEXT NOT NULL DEFAULT '',
    reason          TEXT NOT NULL DEFAULT '',
    state           TEXT NOT NULL DEFAULT 'pending',
    created_at      REAL NOT NULL,
    next_attempt_at REAL NOT NULL,
    attempts        INTEGER NOT NULL DEFAULT 0,
    last_attempt_at REAL,
    last_status     INTEGER,
    last_error      TEXT,
    delivered_at    REAL
);
CREATE INDEX IF NOT EXISTS alert_outbox_due ON alert_outbox (state, next_attempt_at);
CREATE INDEX IF NOT EXISTS alert_outbox_subscription ON alert_outbox (subscription_id, state);
CREATE TABLE IF NOT EXISTS alert_records (
    kind       TEXT NOT NULL,
    key        TEXT NOT NULL,
    value      TEXT NOT NULL,
    updated_at REAL NOT NULL,
    PRIMARY KEY (kind, key)
);
"""
