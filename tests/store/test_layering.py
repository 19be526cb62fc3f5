"""The store is the bottom layer of the service: it imports nothing above it.

Every import in ``healthsvc/store/`` (at module level or inside a function) names the store
itself, the few modules below it (what a finding is: ``healthsvc_detectors.finding``, ``healthsvc_detectors.kinds``,
``healthsvc.identity``; how values become JSON: ``healthsvc.encode``; the wire contract's field
names: ``healthsvc_client.wire``), the standard library or a third-party package. The monitor, alerting, ingest, ownership and the features import the store,
never the other way round, so the store can be read, tested and replaced on its own.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STORE = ROOT / "healthsvc" / "store"
BELOW_THE_STORE = ("healthsvc.store", "healthsvc.encode", "healthsvc.identity", "healthsvc_detectors.finding",
                   "healthsvc_detectors.kinds", "healthsvc_client.wire")
OURS = ("healthsvc", "healthsvc_detectors", "healthsvc_client", "simulation")


def imported_modules(path: Path) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module))
        elif isinstance(node, ast.ImportFrom) and node.level:
            out.append((node.lineno, "healthsvc.store"))   # relative: within the store
    return out


def above_the_store(module: str) -> bool:
    ours = module.split(".")[0] in OURS
    return ours and not any(module == b or module.startswith(b + ".") for b in BELOW_THE_STORE)


@pytest.mark.parametrize("path", sorted(STORE.glob("*.py")), ids=lambda p: p.name)
def test_the_store_imports_nothing_above_it(path):
    upward = [f"{path.name}:{line} imports {module}" for line, module in imported_modules(path)
              if above_the_store(module)]
    assert not upward, "the store must not import a layer above it: " + "; ".join(upward)


def test_the_check_sees_an_upward_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from healthsvc.monitor.hub import MonitorHub\n")
    assert [m for _, m in imported_modules(bad) if above_the_store(m)] == ["healthsvc.monitor.hub"]


def live_state_reads(path: Path) -> list[int]:
    """Lines of ``path`` that ask a store for the live run state (``.run_state(...)``)."""
    return [node.lineno for node in ast.walk(ast.parse(path.read_text(), str(path)))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "run_state"]


def test_no_live_run_state_leaves_the_store():
    # RunState is the writer thread's: it changes on every push. Every other thread (API
    # handlers, the monitor, the dashboard, Prometheus scrapes) reads the copy store.reads.run_view gives.
    outside = [f"{p.relative_to(ROOT)}:{line}" for p in sorted((ROOT / "healthsvc").rglob("*.py"))
               if STORE not in p.parents for line in live_state_reads(p)]
    assert not outside, "the live RunState read outside the store: " + ", ".join(outside)


def test_the_live_state_check_sees_a_call(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f(store):\n    return store.run_state('r').attempt\n")
    assert live_state_reads(bad) == [2]
