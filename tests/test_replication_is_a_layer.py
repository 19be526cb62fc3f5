"""Replication is a layer, not a flag: outside ``healthsvc/ownership/`` no module asks whether it
runs as one process or as replicas.

What one process and replicas do differently is asked of the run's ownership
(``healthsvc.ownership.RunOwnership``: ``restores``, ``restore``, ``catch_up``, ``fed_chunks``,
``let_go``, ``holds_every_run``), which the single-process server (``SoleOwner``) and the
PostgreSQL replicas (``PgLeases``) both implement; the store, which imports nothing above it,
has its one seam for it (``healthsvc/store/sharing.py``: who else writes the runs). The mode
flags those replaced must not come back: any identifier (a name, an attribute, an argument, a
definition) or ``getattr`` string naming one fails here.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "healthsvc"
OWNERSHIP = PACKAGE / "ownership"
FLAGS = frozenset({"replicated", "takes_over", "_restore_on_claim", "shared_database", "_owns"})


def flag_mentions(path: Path) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Name):
            names = [node.id]
        elif isinstance(node, ast.Attribute):
            names = [node.attr]
        elif isinstance(node, ast.arg):
            names = [node.arg]
        elif isinstance(node, ast.keyword) and node.arg:
            names = [node.arg]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names = [node.name]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names = [node.value]   # getattr(x, "takes_over"), hasattr, setattr
        out += [(node.lineno, n) for n in names if n in FLAGS]
    return out


def test_no_module_outside_ownership_asks_whether_it_is_replicated():
    found = [f"{p.relative_to(ROOT)}:{line} {name}" for p in sorted(PACKAGE.rglob("*.py"))
             if OWNERSHIP not in p.parents for line, name in flag_mentions(p)]
    assert not found, "a replication mode flag outside healthsvc/ownership: " + ", ".join(found)


def test_the_check_sees_each_way_of_asking(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f(own, store, replicated=False):\n"
                   "    if own.takes_over or store.shared_database or getattr(own, 'takes_over', 0):\n"
                   "        self._restore_on_claim = self._owns = replicated\n")
    assert sorted(n for _, n in flag_mentions(bad)) == sorted(
        ["replicated", "takes_over", "shared_database", "takes_over", "_restore_on_claim", "_owns", "replicated"])
