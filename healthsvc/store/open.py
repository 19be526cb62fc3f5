"""The store a URI names: ``sqlite:///PATH`` (or a plain path) or ``postgresql://user@host:port/db``.

>>> type(open_store("sqlite:///x.db")).__name__
'SQLiteStore'
"""
from __future__ import annotations

import re
from typing import Any

from healthsvc.store.base import StoreBase

# The password of a URI: in its user-info (``user:PASSWORD@``; the last ``@`` ends it, since
# libpq splits there too) or a ``password=`` query parameter.
_USERINFO_PASSWORD = re.compile(r"(://[^:/@?#]*):[^/?#]*@")
_QUERY_PASSWORD = re.compile(r"([?&]password=)[^&#]*", re.IGNORECASE)


def is_postgres_uri(uri: str) -> bool:
    """Whether ``uri`` names a PostgreSQL database (several replicas may share it)."""
    return uri.startswith(("postgresql://", "postgres://"))


def redact(uri: str) -> str:
    """The URI without its password: what logs, errors and ``store.path`` show.

    >>> redact("postgresql://hs:secret@db:5432/healthsvc")
    'postgresql://hs:***@db:5432/healthsvc'
    >>> redact("postgresql://hs@db/healthsvc?sslmode=require&password=secret")
    'postgresql://hs@db/healthsvc?sslmode=require&password=***'
    >>> redact("postgresql://hs:p@ss@db/healthsvc")
    'postgresql://hs:***@db/healthsvc'
    """
    return _QUERY_PASSWORD.sub(r"\1***", _USERINFO_PASSWORD.sub(r"\1:***@", uri))


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
