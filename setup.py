"""Which packages the service distribution ships, under which import names (the rest is in
pyproject.toml). ``healthsvc`` as it is; the ``detectors/`` folder as ``healthsvc_detectors``: a
top-level ``detectors`` would collide with the PyPI project of that name and be shadowed by any
training repository's own ``detectors/`` folder. The folder keeps its name in the repository.
The trainer client (``clients/``) is a distribution of its own, ``healthsvc-client``
(``clients/pyproject.toml``), which this one depends on. ``simulation/``, ``tests/``, ``bench/``
and ``examples/`` are not shipped."""
from setuptools import find_packages, setup

DETECTORS = [name.replace("detectors", "healthsvc_detectors", 1)
             for name in find_packages(include=["detectors", "detectors.*"])]

setup(packages=find_packages(include=["healthsvc", "healthsvc.*"]) + DETECTORS,
      package_dir={"healthsvc_detectors": "detectors"})
