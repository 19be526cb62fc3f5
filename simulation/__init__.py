"""Seeded synthetic training runs with injected faults: for tests, benchmarks and notebooks.

Not shipped (``pyproject.toml`` installs ``healthsvc``, ``detectors`` and ``clients`` only): the
service never simulates, so this lives beside the packages it exercises. Pure numpy; the traces
and the faults are described in :mod:`simulation.traces`.

>>> from simulation import simulate_run, NonFinite
>>> run = simulate_run(n_steps=100, n_ranks=4, seed=0, faults=[NonFinite(step=50, rank=1)])
>>> run.truth[0].kind, run.truth[0].step
('non_finite', 50)
"""
from simulation.traces import (METRICS, CorruptRank, Divergence, Fault, GradSpike, LossSpike,
                               NonFinite, SimulatedRun, Straggler, Truth, iter_blocks, simulate_run,
                               split_at)

__all__ = ["METRICS", "CorruptRank", "Divergence", "Fault", "GradSpike", "LossSpike", "NonFinite",
           "SimulatedRun", "Straggler", "Truth", "iter_blocks", "simulate_run", "split_at"]
