"""A fresh PostgreSQL database per test, on the server this machine runs (127.0.0.1:5432, user
postgres, trust auth). Unreachable is a failure, not a skip: CI runs where it is running.

    with fresh_database() as uri:   # postgresql://postgres@127.0.0.1:5432/hs_test_<random>
        ...
"""
from __future__ import annotations

import os
import secrets
from contextlib import contextmanager
from typing import Iterator

import psycopg

ADMIN_URI = os.environ.get("HEALTHSVC_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


def database_uri(name: str) -> str:
    return ADMIN_URI.rsplit("/", 1)[0] + "/" + name


@contextmanager
def fresh_database() -> Iterator[str]:
    name = f"hs_test_{secrets.token_hex(6)}"
    with psycopg.connect(ADMIN_URI, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    try:
        yield database_uri(name)
    finally:
        with psycopg.connect(ADMIN_URI, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
