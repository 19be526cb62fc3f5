"""Nothing imports the repository's folders by their folder names: ``clients/`` is
``healthsvc_client`` and ``detectors/`` is ``healthsvc_detectors`` once installed, and an import of
``clients`` or ``detectors`` would work in the checkout (the folder is on the path) and break in an
install, or pick up a training repository's own folder. Code of every kind is checked: packages,
tests, bench, examples, simulation, and the notebooks' code cells."""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDER_NAMES = {"clients", "detectors"}
# ... and by name in strings: `python -m clients.relay`, importlib, `python -c "import clients"`
# (and code inside a multi-line string, and docstring examples: any line that is an import of them)
IN_STRINGS = re.compile(r"""["']-m["'],\s*["'](?:clients|detectors)\.|import_module\(f?["'](?:clients|detectors)\b"""
                        r"""|["'][^"'\n]*\b(?:from|import) (?:clients|detectors)\b"""
                        r"""|^\s*(?:>>> )?(?:from (?:clients|detectors)[\s.]"""
                        r"""|import (?:[\w.]+(?:\s+as\s+\w+)?,\s*)*(?:clients|detectors)\b)""", re.MULTILINE)


def _sources() -> list[tuple[str, str]]:
    out = []
    for top in ("healthsvc", "clients", "detectors", "tests", "bench", "examples", "simulation"):
        out += [(str(p.relative_to(ROOT)), p.read_text()) for p in (ROOT / top).rglob("*.py")
                if p.parent != Path(__file__).parent]   # these tests import a training repo's own on purpose
    for nb in (ROOT / "notebooks").glob("*.ipynb"):
        cells = json.loads(nb.read_text())["cells"]
        code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        out.append((str(nb.relative_to(ROOT)), "\n".join(l for l in code.splitlines() if not l.startswith("%"))))
    return out


def _imports(source: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_no_code_imports_a_folder_by_its_folder_name():
    offenders = {path: sorted(_imports(src) & FOLDER_NAMES) for path, src in _sources()}
    assert not {p: n for p, n in offenders.items() if n}
    in_strings = {path: IN_STRINGS.findall(src) for path, src in _sources()}
    assert not {p: found for p, found in in_strings.items() if found}


def test_the_check_sees_an_import_by_folder_name():
    assert _imports("import clients as health\nfrom detectors.kinds import Kind\n") == FOLDER_NAMES
    assert not _imports("import healthsvc_client as health\nfrom healthsvc_detectors import kinds\n") & FOLDER_NAMES
    assert IN_STRINGS.search('subprocess.run([python, "-m", "clients.relay"])')
    assert IN_STRINGS.search('importlib.import_module("detectors.kinds")')
    assert IN_STRINGS.search('run([python, "-c", "import clients; clients.init"])')
    assert IN_STRINGS.search('run_python(f"""\n    import time, clients\n    clients.init()""")')
    assert IN_STRINGS.search('"""Usage::\n\n    >>> from detectors.frame import StepBlock\n"""')
    assert not IN_STRINGS.search('run([python, "-m", "healthsvc_client.relay"]); "the clients of a service"')
