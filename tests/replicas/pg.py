"""A fresh PostgreSQL database per test, on the server of this machine (127.0.0.1:5432, trust)."""
from __future__ import annotations

import secrets
from contextlib import contextmanager
from typing import Iterator

ADMIN_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"


@contextmanager
def fresh_database(prefix: str = "hs_test") -> Iterator[str]:
    """Create a database, yield its DSN, drop it (with whatever is still connected to it)."""
    import psycopg

    name = f"{prefix}_{secrets.token_hex(4)}"
    with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    try:
        yield f"postgresql://postgres@127.0.0.1:5432/{name}"
    finally:
        with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
