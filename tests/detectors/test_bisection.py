"""Active bisection: equals a linear scan, needs ceil(log2) probes, refuses contradictions."""
from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings, strategies as st

from healthsvc_detectors.offline.bisection import (Bisection, BisectionError, ContradictoryReport, ProbeNotProposed,
                                         UnknownCheckpoint)


def linear_scan(steps, good):
    """The reference answer: walk from the oldest checkpoint while it is good."""
    last = None
    for s in steps:
        if not good(s):
            return last, s
        last = s
    return last, None


def drive(b: Bisection, good, roundtrip: bool = False) -> Bisection:
    while (step := b.next_probe()) is not None:
        b.report(step, good(step), value=float(step))
        if roundtrip:
            b = Bisection.from_dict(json.loads(json.dumps(b.to_dict())))
    return b


@pytest.mark.parametrize("n", range(1, 18))
def test_equals_linear_scan_for_every_monotone_oracle(n):
    steps = [100 * (i + 1) for i in range(n)]
    worst = 0
    for boundary in range(n + 1):          # the first `boundary` checkpoints are good
        good = lambda s, b=boundary: s <= 100 * b  # noqa: E731
        b = drive(Bisection.start(steps), good)
        assert b.done
        assert (b.result(), b.first_bad()) == linear_scan(steps, good)
        worst = max(worst, b.n_probes)
    # n + 1 possible answers: exactly ceil(log2(n + 1)) probes in the worst case.
    assert worst == math.ceil(math.log2(n + 1))


@pytest.mark.parametrize("n", range(2, 18))
def test_known_endpoints_need_at_most_ceil_log2_n_probes(n):
    steps = [10 * i for i in range(n)]
    worst = 0
    for boundary in range(1, n):           # first known good, last known bad
        good = lambda s, b=boundary: s < 10 * b  # noqa: E731
        b = drive(Bisection.start(steps, known_good=steps[0], known_bad=steps[-1]), good)
        assert (b.result(), b.first_bad()) == linear_scan(steps, good)
        worst = max(worst, b.n_probes)
    assert worst == (math.ceil(math.log2(n - 1)) if n > 2 else 0)
    assert worst <= math.ceil(math.log2(n))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 10**6), min_size=1, max_size=60, unique=True),
       st.integers(0, 60), st.booleans())
def test_any_steps_any_boundary_with_persisted_state(raw_steps, boundary, roundtrip):
    steps = sorted(raw_steps)
    cut = steps[min(boundary, len(steps)) - 1] if boundary else -1
    good = lambda s: s <= cut  # noqa: E731
    b = drive(Bisection.start(raw_steps), good, roundtrip=roundtrip)
    assert (b.result(), b.first_bad()) == linear_scan(steps, good)
    assert b.n_probes <= math.ceil(math.log2(len(steps) + 1))


def test_known_bounds_outside_the_list_decide_the_ends():
    b = Bisection.start([200, 300, 400], known_good=250, known_bad=300)
    assert b.next_probe() is None and b.done
    assert (b.result(), b.first_bad()) == (200, 300)
    assert Bisection.start([200, 300], known_good=150).result() == 150


def test_next_probe_is_stable_until_reported_and_values_are_kept():
    b = Bisection.start([1, 2, 3, 4, 5, 6, 7])
    first = b.next_probe()
    assert b.next_probe() == first
    b.report(first, good=True, value=2.31)
    assert b.reports[0].value == 2.31 and b.next_probe() != first


def test_a_bad_checkpoint_before_a_good_one_is_refused_with_both_steps_named():
    b = Bisection.start([100, 200, 300, 400, 500, 600, 700])
    step = b.next_probe()                  # 400
    b.report(step, good=True)
    with pytest.raises(ContradictoryReport, match=r"checkpoint 200 reported bad.*checkpoint 400"):
        b.report(200, good=False)
    step = b.next_probe()                  # 600
    b.report(step, good=False)
    with pytest.raises(ContradictoryReport, match=r"checkpoint 700 reported good.*checkpoint 600"):
        b.report(700, good=True)
    with pytest.raises(ContradictoryReport):
        b.report(400, good=False)          # flips an earlier verdict


def test_reports_for_unproposed_or_unknown_steps_are_refused():
    b = Bisection.start([100, 200, 300, 400, 500, 600, 700])
    proposed = b.next_probe()
    other = 200 if proposed != 200 else 600
    with pytest.raises(ProbeNotProposed, match=f"proposed probe {proposed}"):
        b.report(other, good=True)
    with pytest.raises(UnknownCheckpoint, match="250 is not a checkpoint"):
        b.report(250, good=True)
    assert isinstance(ProbeNotProposed("x"), BisectionError)
    assert isinstance(BisectionError("x"), ValueError)


def test_a_repeated_consistent_report_is_a_safe_retry():
    b = Bisection.start([100, 200, 300])
    step = b.next_probe()
    b.report(step, good=True)
    b.report(step, good=True)              # an HTTP retry
    b.report(100, good=True)               # implied by the first report
    assert b.n_probes == 1


def test_invalid_starts_are_refused():
    with pytest.raises(ContradictoryReport, match="known_good=500 is not before known_bad=400"):
        Bisection.start([100, 200], known_good=500, known_bad=400)
    with pytest.raises(BisectionError, match="unique"):
        Bisection.start([100, 100, 200])


def test_corrupt_persisted_state_is_refused():
    state = Bisection.start([1, 2, 3]).to_dict()
    state["good_index"], state["bad_index"] = 2, 1
    with pytest.raises(BisectionError, match="corrupt bisection state"):
        Bisection.from_dict(state)
