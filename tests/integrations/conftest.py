"""The training scripts here (``*_train.py``) are what torchrun starts, not test modules, and hold
no doctests: they are left out of collection, where ``--doctest-modules`` imported each in every
worker, and with it transformers, accelerate or Lightning (3 CPU-s a worker)."""

collect_ignore_glob = ["*_train.py"]
