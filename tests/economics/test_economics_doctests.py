"""The docstring examples of healthsvc.economics are run, so they stay true."""
import doctest
import importlib

import pytest

MODULES = ["advice", "goodput", "intervals", "records", "retention", "timeline"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(f"healthsvc.economics.{name}")
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
