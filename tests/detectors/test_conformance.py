"""The conformance suite: every detector of :mod:`healthsvc_detectors.registry` keeps the protocol's promises.

Generated from the registry, so a detector registered there runs all of it without a line here.
The block detectors' checks are a library, :mod:`healthsvc_detectors.checks` (``check_block_detector``,
after river's ``check_estimator``), run here for every entry with its defaults (what the service
builds) and with the non-default set its entry declares (``alt_params``), on one trace where it
fires *and* resolves, so "the same findings" compares something. Hypothesis adds random cuts.

Block detectors (:class:`~healthsvc_detectors.base.BlockDetector`), on one seeded trace that carries every
value and timing fault at once (5 % of cells missing, the trainer's clock ``ts`` on every rank):

- split anywhere: the trace in one block, or cut anywhere, gives the same findings;
- permuted ranks: relabelling rank ids (a permutation, so the columns reorder too) maps every
  finding's ranks through the same permutation and changes nothing else;
- constants: constant healthy series never fire;
- missing is not NaN: whatever sits in a cell that is not present is ignored, a block with
  nothing present fires nothing, and a field left out equals a field present nowhere;
- state round trip: a snapshot (strict JSON, as the service stores it) restored mid-trace into
  a fresh detector gives the same findings afterwards, at random cuts and at cuts inside each of
  the detector's own episodes (where its mid-episode state must survive);
- the input is read, never written: one block is handed to every aligned detector in turn;
- every kind it reports is declared on its registry entry (:mod:`healthsvc_detectors.kinds`);
- repr and clone: ``repr`` names the class and every hyper-parameter; a clone is fresh, shares
  nothing and behaves as a new detector.

Absence detectors (:class:`~healthsvc_detectors.base.AbsenceDetector`): the library
:mod:`healthsvc_detectors.absence_checks` (``check_absence_detector``), run for every entry with its
defaults and its ``alt_params``, drives each with a scripted job on the caller's clock (8 ranks
pushing every second; a rank falls silent and comes back; the whole job stops with one rank
outside the collective; a checkpoint pause; an elastic shrink; the finish) and holds it to the
same findings under split pushes, extra ticks, permuted rank ids, a snapshot restored mid-script
(downtime shifted away) and a clock offset; a steady job never fires; an unknown step is no
progress; repr and clone. Hypothesis adds random restore points and ticks.
"""
from __future__ import annotations

import doctest
import importlib
import inspect
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from healthsvc_detectors.base import AbsenceDetector, BlockDetector
from healthsvc_detectors.frame import StepBlock
from healthsvc_detectors.absence_checks import ABSENCE_CHECKS, drive, flat, identity, job_script
from healthsvc_detectors.checks import BLOCK_CHECKS, input_unchanged, state_round_trip
from healthsvc_detectors.registry import REGISTRY
from healthsvc_detectors.replica import ReplicaMismatchDetector
from simulation import (CorruptRank, Divergence, GradSpike, LossSpike, NonFinite, Straggler,
                        iter_blocks, simulate_run, split_at)

BLOCK = [name for name, entry in REGISTRY.items() if entry.role != "absence"]
SERVICE_SOURCES = sorted((Path(__file__).resolve().parents[2] / "healthsvc").rglob("*.py"))
ABSENCE = [name for name, entry in REGISTRY.items() if entry.role == "absence"]
FEW = settings(max_examples=4, deadline=None, derandomize=True)


def fresh(name: str):
    return REGISTRY[name].cls()


# ----------------------------------------------------------------------------- the protocols
@pytest.mark.parametrize("name", list(REGISTRY))
def test_the_registry_says_the_protocol_and_the_class_keeps_it(name):
    entry = REGISTRY[name]
    det = fresh(name)
    assert isinstance(det, entry.protocol)
    other = BlockDetector if entry.protocol is AbsenceDetector else AbsenceDetector
    assert not isinstance(det, other), f"{name} has both shapes: pick one"
    assert det.kind == name


@pytest.mark.parametrize("name", list(REGISTRY))
def test_every_hook_a_detector_offers_is_declared_on_its_protocol(name):
    # The service calls a detector only through its protocol: a method of the class alone that
    # the service calls would be reached by getattr, and a detector lacking it silently skipped.
    entry = REGISTRY[name]
    declared = {n for n in dir(entry.protocol) if not n.startswith("_")} | {"params", "clone"}
    offered = {n for n, _ in inspect.getmembers(entry.cls, callable) if not n.startswith("_")}
    called = [n for n in sorted(offered - declared)
              if any(re.search(rf"[.\"']{n}\b", p.read_text()) for p in SERVICE_SOURCES)]
    assert not called, f"{name}: the service calls {called}, not declared on {entry.protocol.__name__}"


@pytest.mark.parametrize("name", list(REGISTRY))
def test_every_registered_detector_documents_a_running_example(name):
    # --doctest-modules runs them; this says every detector module has one to run.
    module = importlib.import_module(REGISTRY[name].cls.__module__)
    assert any(t.examples for t in doctest.DocTestFinder().find(module)), module.__name__


# ----------------------------------------------------------------------------- block detectors
N_STEPS, N_RANKS = 3_000, 16
FAULTS = [
    Straggler(step=600, rank=6), LossSpike(step=700, factor=2.0),
    LossSpike(step=800, factor=3.0, ranks=(3, 11), duration=30), GradSpike(step=1_000, factor=8.0),
    LossSpike(step=1_200, factor=2.0, duration=40), CorruptRank(step=1_400, rank=5, loss_scale=1.1),
    CorruptRank(step=1_500, rank=13, local_grad_scale=1.0, grad_norm_scale=1.2),
    Divergence(step=2_200, rate=1e-3), NonFinite(step=2_950, rank=9),
]


def _with_trainer_clock(block: StepBlock) -> StepBlock:
    st_ = np.where(block.present["step_time"], block.values["step_time"], np.nan)
    ts = 1_000.0 + np.cumsum(np.nanmedian(st_, axis=1))
    block.values["ts"] = np.repeat(ts[:, None], block.n_ranks, axis=1)
    block.present["ts"] = np.ones(st_.shape, dtype=bool)
    return block


@pytest.fixture(scope="module")
def trace() -> StepBlock:
    block = simulate_run(n_steps=N_STEPS, n_ranks=N_RANKS, seed=21, faults=FAULTS,
                         missing_fraction=0.05).block
    # The straggler recovers at 1,600 (the timings of the same seed without faults from then on:
    # the value faults leave timings alone), then the whole job is slower for a while.
    clean = simulate_run(n_steps=N_STEPS, n_ranks=N_RANKS, seed=21, missing_fraction=0.05).block
    for metric in ("step_time", "compute_time", "comm_time"):
        block.values[metric][1_600:] = clean.values[metric][1_600:]
    block.values["step_time"][1_700:2_100] *= 1.3
    return _with_exact_check_columns(_with_trainer_clock(block))


def _with_exact_check_columns(block: StepBlock) -> StepBlock:
    """What the exact checks read: replica digests (codes) every 10 steps, rank 4's replica
    diverging at 1,805 and re-synchronised at 2,005; the data position (8 samples a step) going
    back to the start at 2,500 (a sampler restarted in place); a decaying learning rate."""
    n, r = block.n_steps, block.n_ranks
    steps = block.steps
    codes = np.tile((steps * 3.0)[:, None], (1, r))
    codes[(steps >= 1_805) & (steps < 2_005), 4] += 1.0
    has = np.zeros((n, r), dtype=bool)
    has[steps % 10 == 9] = True
    cursor = np.where(steps < 2_500, steps + 1, steps - 2_499) * 8.0
    lr = 1e-3 * (1.0 - steps / (2.0 * n))
    for name, values, present in (("param_digest", codes, has & block.present["loss"]),
                                  ("data_cursor", np.tile(cursor[:, None], (1, r)), block.present["loss"]),
                                  ("lr", np.tile(lr[:, None], (1, r)), block.present["loss"])):
        block.values[name], block.present[name] = values, present.copy()
    return block


def feed(det, blocks) -> list:
    return [f for b in blocks for f in det.update(b)]


@pytest.fixture(scope="module")
def whole(trace) -> dict[str, list]:
    return {name: fresh(name).update(trace) for name in BLOCK}


@pytest.mark.parametrize("name", BLOCK)
def test_the_trace_makes_every_block_detector_fire_and_resolve(name, whole):
    statuses = {f.status for f in whole[name]}
    assert "firing" in statuses, f"{name} never fires on the conformance trace: add its fault to FAULTS"
    # A NaN poisons the weights: it stays. A resume that did not continue is one event: the run's
    # data position or schedule is wrong from then on, nothing clears it but another restart.
    if name not in ("non_finite", "resume_mismatch"):
        assert "resolved" in statuses, f"{name} never resolves on the conformance trace"


PARAM_SETS = ["defaults", "alt_params"]


def make_detector(name: str, params: str):
    """A factory of fresh detectors: the registry's defaults, or its entry's non-default set."""
    kwargs = REGISTRY[name].alt_params if params == "alt_params" else {}
    return lambda: REGISTRY[name].cls(**kwargs)


@pytest.mark.parametrize("name", list(REGISTRY))
def test_every_entry_declares_a_non_default_parameter_set(name):
    alt = REGISTRY[name].alt_params
    assert alt, f"{name}: declare alt_params on its registry entry"
    defaults = fresh(name).params()
    assert any(defaults[k] != v for k, v in alt.items()), f"{name}: alt_params are its defaults"


@pytest.mark.parametrize("check", list(BLOCK_CHECKS))
@pytest.mark.parametrize("params", PARAM_SETS)
@pytest.mark.parametrize("name", BLOCK)
def test_the_conformance_checks(name, params, check, trace):
    BLOCK_CHECKS[check](make_detector(name, params), trace)


@pytest.mark.parametrize("name", BLOCK)
def test_every_kind_a_detector_declares_has_every_field_written_down(name):
    for k in REGISTRY[name].kinds:   # a Kind has no defaults; only these may be None
        assert all(getattr(k, f) is not None or f in ("corruption", "incident", "restarts_at")
                   for f in k.__dataclass_fields__), k.name


def test_the_checks_catch_a_detector_that_forgets_state_on_restore(trace):
    # The mutation the round-trip cuts must catch: a replica check that forgets the ranks it
    # named (its _odd) when restored mid-episode.
    class Forgetful(ReplicaMismatchDetector):
        def load_state_dict(self, state):
            super().load_state_dict(state)
            self._odd = {}
    with pytest.raises(AssertionError, match="restored at step"):
        state_round_trip(Forgetful, trace)


def test_the_checks_catch_a_detector_that_writes_into_its_input(trace):
    class Scribbler(REGISTRY["loss_spike"].cls):
        def update(self, block):
            if "loss" in block.values:
                block.values["loss"][:1] = 0.0
            return super().update(block)
    with pytest.raises(AssertionError, match="wrote into loss"):
        input_unchanged(Scribbler, trace)


@pytest.mark.parametrize("name", BLOCK)
@FEW
@given(cuts=st.lists(st.integers(1, N_STEPS - 1), min_size=1, max_size=40))
def test_split_anywhere(name, cuts, trace, whole):
    assert feed(fresh(name), split_at(trace, cuts)) == whole[name]


def _snapshot(det) -> dict[str, Any]:
    """The state as the service stores it (``json`` keeps NaN/Infinity tokens)."""
    return json.loads(json.dumps(det.state_dict(), allow_nan=True))


@pytest.mark.parametrize("name", BLOCK)
@FEW
@given(cut=st.integers(1, N_STEPS - 1))
def test_state_round_trip(name, cut, trace, whole):
    first = fresh(name)
    head = feed(first, iter_blocks(trace.slice_steps(0, cut), 97))
    restored = fresh(name)
    restored.load_state_dict(_snapshot(first))
    assert head + feed(restored, iter_blocks(trace.slice_steps(cut, N_STEPS), 97)) == whole[name]


def _own_params(cls) -> list[str]:
    return [p.name for p in inspect.signature(cls.__init__).parameters.values()
            if p.name != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]


@pytest.mark.parametrize("name", list(REGISTRY))
def test_repr_names_the_class_and_every_hyper_parameter(name):
    det = fresh(name)
    text = repr(det)
    assert text.startswith(f"{type(det).__name__}(") and text.endswith(")")
    for param in _own_params(type(det)):
        assert f"{param}=" in text, f"{name}: {param} missing from repr"
    assert repr(det.clone()) == text


# --------------------------------------------------------------------------- absence detectors
@pytest.mark.parametrize("check", list(ABSENCE_CHECKS))
@pytest.mark.parametrize("params", PARAM_SETS)
@pytest.mark.parametrize("name", ABSENCE)
def test_the_absence_conformance_checks(name, params, check, script):
    ABSENCE_CHECKS[check](make_detector(name, params), script)


@pytest.fixture(scope="module")
def script() -> list:
    return job_script()


@pytest.mark.parametrize("name", ABSENCE)
@FEW
@given(cut=st.integers(1, 8_000), extra=st.lists(st.floats(0.0, 1_200.0), max_size=60))
def test_absence_random_cuts_and_ticks(name, cut, extra, script):
    # Hypothesis adds random restore points and ticks to the library's seeded ones.
    whole = [identity(f) for f in flat(drive(fresh(name), script))]
    first = fresh(name)
    head = drive(first, script[:cut])
    restored = fresh(name)
    restored.load_state_dict(_snapshot(first))
    tail = drive(restored, script[cut:])
    assert [identity(f) for f in flat(head + tail)] == whole
    events = sorted([*script, *(("tick", t) for t in extra)], key=lambda ev: ev[1] if ev[0] in ("tick", "finish") else ev[-1])
    assert [identity(f) for f in flat(drive(fresh(name), events))] == whole


def test_the_absence_checks_catch_a_detector_that_ignores_downtime(script):
    # The mutation the round trip must catch: a restored detector that does not shift its clock
    # past the service's downtime, so every rank looks silent for 1,000 s.
    class Amnesiac(REGISTRY["hang"].cls):
        def shift_clock(self, shift_s):
            pass
    with pytest.raises(AssertionError, match="restored at event"):
        ABSENCE_CHECKS["state_round_trip"](Amnesiac, script)

