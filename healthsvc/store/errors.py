"""What a store raises when the database (not the request) failed: ``STORE_ERRORS`` is every
such exception class of the stores this install can open (sqlite3's, and psycopg's when the
PostgreSQL driver is installed), for the ``except`` clauses and the app's error handler."""
from __future__ import annotations

import sqlite3

STORE_ERRORS: tuple[type[Exception], ...] = (sqlite3.Error,)
try:
    import psycopg
except ImportError:  # a SQLite-only install
    pass
else:
    STORE_ERRORS = (sqlite3.Error, psycopg.Error)
