"""The store behind one narrow interface: SQLiteStore and PostgresStore implement every method of
``healthsvc.store.interface.Store`` with the same parameters, and no SQL is written outside the
store package."""
from __future__ import annotations

import inspect
import re
from pathlib import Path

from healthsvc.store import interface
import pytest

from healthsvc.store.postgres import PostgresStore
from healthsvc.store.sqlite import SQLiteStore

ROOT = Path(__file__).resolve().parents[2] / "healthsvc"
SQL = re.compile(r"""["'](SELECT|INSERT|UPDATE|DELETE|CREATE|REPLACE)\s""")


def protocol_methods() -> dict[str, inspect.Signature]:
    out = {}
    for proto in interface.Store.__mro__:
        if proto in (object, interface.Store) or not getattr(proto, "_is_protocol", False):
            continue
        for name, member in vars(proto).items():
            if callable(member) and not name.startswith("_"):
                out[name] = inspect.signature(member)
    return out


@pytest.mark.parametrize("store", [SQLiteStore, PostgresStore])
def test_each_store_implements_every_method_of_the_interface(store):
    methods = protocol_methods()
    assert {"submit_metrics", "chunks_after", "submit_findings", "submit_bisection_update", "audit_log"} <= set(methods)
    for name, sig in methods.items():
        impl = getattr(store, name, None)
        assert impl is not None, f"{store.__name__} lacks {name}"
        assert list(inspect.signature(impl).parameters) == list(sig.parameters), name


def test_no_sql_outside_the_store_package():
    offenders = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*.py")
                 if "store" not in p.relative_to(ROOT).parts[:1] and SQL.search(p.read_text())]
    assert offenders == []
