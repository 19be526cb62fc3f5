"""The store behind one narrow interface: SQLiteStore and PostgresStore implement every method of
``healthsvc.store.interface.Store`` with the same parameters, and each table the store holds as an
attribute (``store.findings``, ...) every method of that attribute's protocol; no SQL is written
outside the store package."""
from __future__ import annotations

import inspect
import re
import typing
from pathlib import Path

from healthsvc.store import interface
import pytest

from healthsvc.store.postgres import PostgresStore
from healthsvc.store.sqlite import SQLiteStore

ROOT = Path(__file__).resolve().parents[2] / "healthsvc"
SQL = re.compile(r"""["'](SELECT|INSERT|UPDATE|DELETE|CREATE|REPLACE)\s""")


def protocol_methods(protocol: type) -> dict[str, inspect.Signature]:
    out = {}
    for proto in protocol.__mro__:
        if proto is object or not getattr(proto, "_is_protocol", False):
            continue
        for name, member in vars(proto).items():
            if callable(member) and not name.startswith("_"):
                out[name] = inspect.signature(member)
    return out


def table_protocols() -> dict[str, type]:
    """The store's attributes that are tables of their own: name -> the protocol it implements."""
    return {name: typing.get_type_hints(member.fget)["return"]
            for name, member in vars(interface.Tables).items() if isinstance(member, property)}


def assert_implements(impl_class: type, protocol: type) -> None:
    for name, sig in protocol_methods(protocol).items():
        impl = getattr(impl_class, name, None)
        assert impl is not None, f"{impl_class.__name__} lacks {name}"
        assert list(inspect.signature(impl).parameters) == list(sig.parameters), f"{impl_class.__name__}.{name}"


@pytest.mark.parametrize("store", [SQLiteStore, PostgresStore])
def test_each_store_implements_every_method_of_the_interface(store):
    assert {"open", "chunks_after", "save_snapshot"} <= set(protocol_methods(interface.Store))
    assert_implements(store, interface.Store)


@pytest.mark.parametrize("store", [SQLiteStore, PostgresStore])
def test_each_table_the_store_holds_implements_its_protocol(store):
    tables = table_protocols()
    assert set(tables) == {"ingest", "reads", "control", "findings", "bisections", "probes", "tokens", "audit"}
    held = typing.get_type_hints(store)   # the class each attribute is (StoreBase annotates them)
    for name, protocol in tables.items():
        assert name in held, f"{store.__name__} does not declare its table {name}"
        assert_implements(held[name], protocol)
    assert "submit_update" in protocol_methods(interface.BisectionStore)


def test_no_sql_outside_the_store_package():
    offenders = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*.py")
                 if "store" not in p.relative_to(ROOT).parts[:1] and SQL.search(p.read_text())]
    assert offenders == []
