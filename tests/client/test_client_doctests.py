"""The examples in the client's docstrings run."""
from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = ["clients.encode", "clients.queue", "clients.retry", "clients.spool", "clients.stats",
           "clients.sync", "clients.transport"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0 and result.failed == 0
