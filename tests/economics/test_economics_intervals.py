"""Young and Daly intervals and Daly's overhead model against hand arithmetic and a simulation."""
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import minimize_scalar

from healthsvc_detectors.offline.economics.intervals import (daly_interval_s, expected_overhead_fraction,
                                                   expected_wall_per_work, young_interval_s)

C_S = 60.0
M_S = 4 * 3600.0  # 14,400 s


def test_young_for_60s_checkpoint_and_4h_mtbf_is_about_22_minutes():
    # By hand: 2 * 60 * 14,400 = 1,728,000; sqrt(1,728,000) = 1314.534 (1314.534^2 = 1,727,999.6,
    # 1314.535^2 = 1,728,002.3). 1314.534 / 60 = 21.909 minutes -- not "roughly 10 minutes".
    tau = young_interval_s(C_S, M_S)
    assert tau == pytest.approx(1314.534, abs=1e-3)
    assert tau / 60 == pytest.approx(21.909, abs=1e-3)


def test_daly_for_60s_checkpoint_and_4h_mtbf():
    # By hand: C/(2M) = 60 / 28,800 = 1/480 = 0.00208333; sqrt(1/480) = 0.0456435.
    # Bracket: 1 + 0.0456435/3 + 0.00208333/9 = 1 + 0.0152145 + 0.0002315 = 1.0154460.
    # 1314.534 * 1.0154460 = 1334.838; minus C = 1274.838 s = 21.247 minutes.
    tau = daly_interval_s(C_S, M_S)
    assert tau == pytest.approx(1274.838, abs=2e-3)
    assert tau < young_interval_s(C_S, M_S)


def test_daly_falls_back_to_mtbf_when_a_checkpoint_costs_two_mtbfs():
    assert daly_interval_s(2 * 500.0, 500.0) == 500.0
    assert daly_interval_s(5000.0, 500.0) == 500.0
    # just below the cut-off the formula applies: x = 0.999/2... stays finite and positive
    assert daly_interval_s(999.0, 500.0) > 0


def test_overhead_hand_case_without_restart_cost():
    # Choose tau + C = M ln 2 so that e^((tau+C)/M) - 1 = 1: wall per segment = M = 1000 s for
    # tau = 600 s of work -> 1000/600 wall seconds per work second; overhead = 1 - 600/1000 = 0.4.
    m, tau = 1000.0, 600.0
    c = m * math.log(2) - tau  # 93.147 s
    assert expected_wall_per_work(tau, c, 0.0, m) == pytest.approx(1000 / 600, rel=1e-12)
    assert expected_overhead_fraction(tau, c, 0.0, m) == pytest.approx(0.4, rel=1e-12)


def test_overhead_hand_case_with_restart_cost():
    # R = M ln 1.25 multiplies the wall time by e^(R/M) = 1.25: 1250 s per 600 s of work.
    m, tau = 1000.0, 600.0
    c, r = m * math.log(2) - tau, m * math.log(1.25)
    assert expected_overhead_fraction(tau, c, r, m) == pytest.approx(1 - 600 / 1250, rel=1e-12)


def _simulate_wall_per_work(tau, c, r, m, segments, seed):
    """Exponential failures; a segment needs tau + C uninterrupted seconds, after a failure
    R + tau + C (the restart can fail too). Returns wall seconds per second of work."""
    rng = random.Random(seed)
    wall = 0.0
    for _ in range(segments):
        need = tau + c
        while True:
            t = rng.expovariate(1.0 / m)
            if t >= need:
                wall += need
                break
            wall += t
            need = r + tau + c
    return wall / (segments * tau)


def test_overhead_model_matches_a_monte_carlo_of_the_failure_process():
    tau, c, r, m = 600.0, 60.0, 120.0, 3000.0
    simulated = _simulate_wall_per_work(tau, c, r, m, segments=20_000, seed=7)
    assert simulated == pytest.approx(expected_wall_per_work(tau, c, r, m), rel=0.015)


@settings(max_examples=60, deadline=None)
@given(c=st.floats(1.0, 600.0), ratio=st.floats(20.0, 2000.0), r=st.floats(0.0, 600.0))
def test_daly_is_the_minimum_of_the_overhead_model_and_beats_young(c, ratio, r):
    m = c * ratio  # C/M <= 0.05: the regime Daly's expansion is for
    best = minimize_scalar(lambda t: expected_overhead_fraction(t, c, r, m), bounds=(1e-3, m),
                           method="bounded", options={"xatol": 1e-6})
    daly = daly_interval_s(c, m)
    assert daly == pytest.approx(best.x, rel=2e-3)
    assert (expected_overhead_fraction(daly, c, r, m)
            <= expected_overhead_fraction(young_interval_s(c, m), c, r, m) + 1e-12)


@pytest.mark.parametrize("call", [
    lambda: young_interval_s(0.0, 100.0), lambda: young_interval_s(10.0, -1.0),
    lambda: daly_interval_s(float("nan"), 100.0), lambda: expected_overhead_fraction(0.0, 1, 1, 10),
    lambda: expected_overhead_fraction(10.0, -1.0, 0.0, 10.0),
])
def test_invalid_inputs_raise_value_error(call):
    with pytest.raises(ValueError):
        call()
