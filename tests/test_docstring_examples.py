"""The docstring examples of the client and the detectors, run under their import names.

``healthsvc`` and ``simulation`` are pytest's ``--doctest-modules`` test paths (pyproject.toml).
``clients/`` and ``detectors/`` cannot be: pytest imports a file under its folder's name (module
``kinds`` of a package ``detectors``), a second copy beside the installed
``healthsvc_detectors.kinds``, and an example that registers something in one copy reads it from
the other. So every module of both
packages with an example is run here, found by walking the packages (none is left out of a
hand-kept list), with the project's doctest flags."""
from __future__ import annotations

import doctest
import importlib
import pkgutil
from pathlib import Path

import pytest

import healthsvc_client
import healthsvc_detectors

FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE   # pyproject.toml's doctest_optionflags


def _modules_with_examples() -> list[str]:
    names = []
    for package in (healthsvc_client, healthsvc_detectors):
        found = [package.__name__] + [m.name for m in pkgutil.walk_packages(package.__path__, f"{package.__name__}.")]
        for name in found:
            spec = importlib.util.find_spec(name)
            if spec and spec.origin and ">>>" in Path(spec.origin).read_text():
                names.append(name)
    return sorted(names)


MODULES = _modules_with_examples()


def test_the_examples_are_found():
    assert {"healthsvc_detectors.kinds", "healthsvc_client.sync"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    report: list[str] = []
    tests = [t for t in doctest.DocTestFinder().find(module, name) if t.examples]
    assert tests, f"{name} has '>>>' but no example doctest finds"
    for test in tests:
        runner.run(test, out=report.append)
    assert runner.failures == 0, "".join(report)
