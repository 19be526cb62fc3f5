"""A fresh PostgreSQL database per test, on the server this machine runs (127.0.0.1:5432, user
postgres, trust auth). Unreachable is a failure, not a skip: CI runs where it is running.

    with fresh_database() as uri:   # postgresql://postgres@127.0.0.1:5432/hs_test_<random>
        ...
"""
from __future__ import annotations

import os
import secrets
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator


ADMIN_URI = os.environ.get("HEALTHSVC_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


def database_uri(name: str) -> str:
    return ADMIN_URI.rsplit("/", 1)[0] + "/" + name


def database_for(kind: str, directory) -> Any:
    """A fresh database of ``kind`` ("sqlite": a file in ``directory``; "postgresql")."""
    from contextlib import nullcontext
    if kind == "postgresql":
        return fresh_database()
    return nullcontext(str(Path(directory) / "healthsvc.db"))


@contextmanager
def fresh_database() -> Iterator[str]:
    import psycopg   # (here: a SQLite-only install can still import this module)
    name = f"hs_test_{secrets.token_hex(6)}"
    with psycopg.connect(ADMIN_URI, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    try:
        yield database_uri(name)
    finally:
        with psycopg.connect(ADMIN_URI, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
