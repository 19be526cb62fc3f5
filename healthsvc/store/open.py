"""The store a URI names: ``sqlite:///PATH`` (or a plain path) or ``postgresql://user@host:port/db``.

>>> type(open_store("sqlite:///x.db")).__name__
'SQLiteStore'
"""
from __future__ import annotations

from typing import Any

from healthsvc.store.base import StoreBase


def is_postgres_uri(uri: str) -> bool:
    """Whether ``uri`` names a PostgreSQL database (several replicas may share it)."""
    return uri.startswith(("postgresql://", "postgres://"))


def open_store(uri: str, **options: Any) -> StoreBase:
    """A store for ``uri``, not yet opened (``store.open()`` migrates and starts the writer)."""
    if is_postgres_uri(uri):
        try:
            from healthsvc.store.postgres import PostgresStore
        except ImportError as exc:
            raise RuntimeError("a postgresql:// store needs psycopg 3 and psycopg_pool: "
                               "pip install 'healthsvc[server]'") from exc
        return PostgresStore(uri, **options)
    from healthsvc.store.sqlite import SQLiteStore
    return SQLiteStore(uri, **options)
