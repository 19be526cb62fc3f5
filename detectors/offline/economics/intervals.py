r"""Optimum checkpoint intervals and the expected cost of checkpointing at a given interval.

Symbols (all seconds):

- ``C`` (δ in Daly's paper): the time to write one checkpoint;
- ``R``: the time to restart after a failure (reschedule, load the checkpoint, warm up);
- ``M``: the mean time between failures (failures arrive as a Poisson process);
- ``τ`` (tau): compute time between two checkpoints, excluding the write itself.

**Young (1974)**, first order: overhead ≈ C/τ + τ/(2M) is smallest at

    τ_Young = √(2 C M)

**Daly (2006)**, "A higher order estimate of the optimum checkpoint interval for restart dumps",
FGCS 22(3), eq. (37):

    τ_Daly = √(2 C M) · [1 + ⅓ √(C/(2M)) + (1/9) (C/(2M))] − C     for C < 2M
    τ_Daly = M                                                    for C ≥ 2M

**Expected overhead.** Daly's expected wall time model (eq. (13)): with exponential failures and
a restart that may itself be interrupted, finishing one segment of τ + C seconds takes on
average ``M · e^{R/M} · (e^{(τ+C)/M} − 1)`` seconds of wall time. Per second of useful work the
wall time is that divided by τ, so the *overhead fraction* — the share of wall time that is not
useful work (checkpoint writes, restarts and recomputation) — is

    overhead(τ) = 1 − τ / (M · e^{R/M} · (e^{(τ+C)/M} − 1))

in [0, 1). ``1 − overhead`` is the goodput the model expects.

Example (the issue's case, C = 60 s, M = 4 h):
    >>> round(young_interval_s(60.0, 4 * 3600.0), 1)
    1314.5
    >>> round(daly_interval_s(60.0, 4 * 3600.0), 1)
    1274.8
"""
from __future__ import annotations

import math


def _check_positive(name: str, value: float) -> None:
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be a positive finite number of seconds, got {value!r}")


def young_interval_s(checkpoint_cost_s: float, mtbf_s: float) -> float:
    """Young's optimum compute time between checkpoints, √(2CM), in seconds."""
    _check_positive("checkpoint_cost_s", checkpoint_cost_s)
    _check_positive("mtbf_s", mtbf_s)
    return math.sqrt(2.0 * checkpoint_cost_s * mtbf_s)


def daly_interval_s(checkpoint_cost_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimum compute time between checkpoints, in seconds.

    Equal to ``mtbf_s`` when a checkpoint costs at least two MTBFs (checkpointing cannot pay
    for itself any more, Daly's cut-off).
    """
    _check_positive("checkpoint_cost_s", checkpoint_cost_s)
    _check_positive("mtbf_s", mtbf_s)
    c, m = checkpoint_cost_s, mtbf_s
    if c >= 2.0 * m:
        return m
    x = c / (2.0 * m)
    return math.sqrt(2.0 * c * m) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - c


def expected_wall_per_work(interval_s: float, checkpoint_cost_s: float, restart_cost_s: float,
                           mtbf_s: float) -> float:
    """Expected wall seconds per second of useful work under Daly's model (≥ 1).

    >>> round(expected_wall_per_work(600.0, 1000 * math.log(2) - 600.0, 0.0, 1000.0), 6)
    1.666667
    """
    _check_positive("interval_s", interval_s)
    _check_positive("mtbf_s", mtbf_s)
    if checkpoint_cost_s < 0 or restart_cost_s < 0:
        raise ValueError("checkpoint_cost_s and restart_cost_s must be >= 0 seconds")
    m = mtbf_s
    # expm1 keeps precision when (τ + C) << M, the usual regime.
    try:
        segment_wall_s = m * math.exp(restart_cost_s / m) * math.expm1((interval_s + checkpoint_cost_s) / m)
    except OverflowError:  # costs hundreds of MTBFs long: no useful work is expected at all
        return math.inf
    return segment_wall_s / interval_s


def expected_overhead_fraction(interval_s: float, checkpoint_cost_s: float, restart_cost_s: float,
                               mtbf_s: float) -> float:
    """Share of wall time not spent on useful work at this interval, in [0, 1) (Daly's model).

    >>> round(expected_overhead_fraction(600.0, 1000 * math.log(2) - 600.0, 0.0, 1000.0), 6)
    0.4
    """
    return 1.0 - 1.0 / expected_wall_per_work(interval_s, checkpoint_cost_s, restart_cost_s, mtbf_s)
