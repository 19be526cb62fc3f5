"""The examples in the docstrings of the CLI and subscription modules run."""
from __future__ import annotations

import doctest
import importlib

import pytest


@pytest.mark.parametrize("name", ["healthsvc.run_cli", "healthsvc.alerting.subscription"])
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0 and result.failed == 0
