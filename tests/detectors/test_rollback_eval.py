"""Rollback accuracy on seeded simulated runs, from the findings of the real detectors.

Each incident: a seeded trace from :mod:`simulation` (16 ranks, loss / grad_norm /
local_grad_norm / lr) with one fault whose first corrupted update ``s`` is known. The service's
default corruption detectors (``healthsvc.monitor.suite.build_suite({})``: non_finite, loss and
gradient spikes, rank_outlier, divergence) watch it in 16-step blocks, as the aligner feeds them;
the stream stops 100 steps after the first evidence (a warning or critical episode that did not
recover as a transient) or at the horizon. The rollback is decided by the same function the
service calls (:func:`healthsvc_detectors.offline.rollback.decide_rollback`) for checkpoints every 50, 200 and
1000 steps, a seeded few deleted. Nothing in the findings is hand-made.

Kinds (x three magnitudes each):

- ``nan`` (abrupt): a rank's local gradient norm goes NaN / Inf (/ its loss too) at ``s``.
- ``lasting`` (abrupt, data): the loss of every rank jumps x1.3 / x1.6 / x2.5 at step ``s + 1``
  and stays up for 300 steps (the learning-rate blow-up of the real corpus); truth ``s``.
- ``rank`` (abrupt, hardware): one rank's local gradient norm is scaled x1.5 / x3 / x10 from ``s``.
- ``drift`` (gradual): the loss drifts up 2e-4 / 5e-4 / 1e-3 log-units per step from ``s``.
- ``burst`` (transient): the gradient norm of every rank spikes x4 / x10 / x100 at ``s`` and the
  loss bumps for a few steps, then recovers. A transient is no reason to throw progress away, so
  the newest checkpoint is accepted as well as the newest clean one (as in the real corpus's
  ``spike_data`` rule).
- ``clean``: no fault; the answer must be the newest checkpoint.

Metrics per cell: ``detected`` (some evidence), ``clean`` (the recommended checkpoint holds no
corrupted update, or for a transient is the newest), ``newest`` (it is the newest non-deleted
clean checkpoint; for a transient or a clean run, the newest one also counts), ``covered``
(``low <= s <= high``), the median onset error and the median and largest number of checkpoints
lost beyond the newest clean one.

``accuracy_table()`` / ``format_table()`` reproduce the table for the docs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pytest

from healthsvc_detectors.offline.bisection import Bisection
from healthsvc_detectors.finding import Finding
from healthsvc_detectors.frame import StepBlock
from healthsvc_detectors.offline.onset import OnsetEstimate
from healthsvc_detectors.kinds import corruption_kinds
from healthsvc_detectors.offline.rollback import (Checkpoint, RollbackDecision, choose_rollback,
                                        decide_rollback, episodes)
from simulation import (CorruptRank, Divergence, GradSpike, LossSpike, NonFinite,
                        iter_blocks, simulate_run)
from healthsvc.monitor.suite import build_suite

KINDS: tuple[str, ...] = ("nan", "lasting", "rank", "drift", "burst", "clean")
MAGNITUDES: dict[str, tuple[str, ...]] = {
    "nan": ("nan", "inf", "nan+loss"),
    "lasting": ("x1.3", "x1.6", "x2.5"),
    "rank": ("x1.5", "x3", "x10"),
    "drift": ("2e-4/step", "5e-4/step", "1e-3/step"),
    "burst": ("x4", "x10", "x100"),
    "clean": ("-",),
}
TRANSIENT_KINDS = ("burst", "clean")
INTERVALS: tuple[int, ...] = (50, 200, 1000)
SEEDS = range(4)
N_RANKS = 16
DELETED_SHARE = 0.1
HORIZON = 3000            # steps after the onset the detectors may take
AFTER_EVIDENCE = 100      # steps of history after the first evidence


@dataclass(frozen=True)
class Incident:
    kind: str
    magnitude: str
    seed: int
    onset_step: int | None        # the first corrupted update (ground truth); None: clean
    findings: list[Finding]
    block: StepBlock              # the history up to where the stream stopped
    detected: bool

    @property
    def history_end(self) -> int:
        return int(self.block.steps[-1])


@dataclass(frozen=True)
class Outcome:
    kind: str
    magnitude: str
    interval: int
    detected: bool
    clean: bool
    newest: bool
    covered: bool
    onset_error: float
    checkpoints_lost: int
    decision: RollbackDecision


def _fault(kind: str, level: int, s: int, rank: int):
    if kind == "nan":
        return NonFinite(step=s, rank=rank, value=float("inf") if level == 1 else float("nan"),
                         in_loss=level == 2)
    if kind == "lasting":
        return LossSpike(step=s + 1, factor=(1.3, 1.6, 2.5)[level], duration=300)
    if kind == "rank":
        return CorruptRank(step=s, rank=rank, local_grad_scale=(1.5, 3.0, 10.0)[level])
    if kind == "drift":
        rate = (2e-4, 5e-4, 1e-3)[level]
        return Divergence(step=s, rate=rate, grad_rate=rate / 2)
    if kind == "burst":
        factor, loss_factor = ((4.0, 1.1), (10.0, 1.3), (100.0, 2.0))[level]
        return GradSpike(step=s, factor=factor, loss_factor=loss_factor)
    return None


def watch(block: StepBlock) -> tuple[list[Finding], int]:
    """Findings of the default corruption detectors, and how many rows they had seen when the
    stream stopped (``AFTER_EVIDENCE`` steps after the first evidence, else the whole block)."""
    suite = build_suite({})
    detectors = [d for name, d in {**suite.arrival, **suite.aligned}.items()
                 if name in corruption_kinds()]
    found: list[Finding] = []
    first_evidence = None
    for b in iter_blocks(block, 16):
        for det in detectors:
            found.extend(det.update(b))
        last = int(b.steps[-1])
        if first_evidence is None and any(e.is_evidence for e in episodes(found)):
            first_evidence = last
        if first_evidence is not None and last >= first_evidence + AFTER_EVIDENCE:
            return found, int(np.searchsorted(block.steps, last, side="right"))
    return found, block.n_steps


def make_incident(kind: str, magnitude: str, seed: int) -> Incident:
    """One seeded incident of ``kind`` at ``magnitude``, watched by the real detectors."""
    level = MAGNITUDES[kind].index(magnitude)
    rng = np.random.default_rng([seed, KINDS.index(kind), level])
    s = int(rng.integers(1500, 2500))
    rank = int(rng.integers(0, N_RANKS))
    fault = _fault(kind, level, s, rank)
    run = simulate_run(n_steps=s + HORIZON, n_ranks=N_RANKS, seed=int(rng.integers(2**31)),
                       faults=[fault] if fault is not None else [],
                       metrics=("loss", "grad_norm", "local_grad_norm", "lr"))
    findings, rows = watch(run.block)
    detected = any(e.is_evidence for e in episodes(findings))
    return Incident(kind, magnitude, seed, None if fault is None else s, findings,
                    run.block.slice_steps(0, rows), detected)


def checkpoints_for(incident: Incident, interval: int) -> list[Checkpoint]:
    """Checkpoints every ``interval`` steps up to the end of the history, a seeded few deleted."""
    rng = np.random.default_rng([incident.seed, interval, 7])
    steps = np.arange(interval, incident.history_end + 1, interval)
    deleted = rng.random(steps.size) < DELETED_SHARE
    return [Checkpoint(int(c), f"mem://ckpt/{int(c)}", "deleted" if d else "ok")
            for c, d in zip(steps, deleted)]


def judge(incident: Incident, interval: int) -> Outcome:
    ckpts = checkpoints_for(incident, interval)
    decision = decide_rollback(incident.block, incident.findings, ckpts)
    s = incident.onset_step
    live = [c.step for c in ckpts if c.status != "deleted"]
    clean = [c for c in live if s is None or c < s]
    optimum = clean[-1] if clean else None
    chosen = None if decision.checkpoint is None else decision.checkpoint.step
    newest = live[-1] if live else None
    transient = incident.kind in TRANSIENT_KINDS
    ok = chosen == optimum or (transient and chosen == newest)
    est = decision.onset
    lost = 0 if ok or optimum is None else sum(1 for c in live if (chosen or 0) < c <= optimum)
    return Outcome(
        kind=incident.kind, magnitude=incident.magnitude, interval=interval,
        detected=incident.detected,
        clean=(chosen is None or s is None or chosen < s or (transient and chosen == newest)),
        newest=ok,
        # A transient that left no evidence has no onset to cover.
        covered=(s is None or (transient and est is None)
                 or (est is not None and est.low <= s <= est.high)),
        # No onset to err about: a clean run, or a transient that left no evidence.
        onset_error=(math.nan if s is None or (transient and est is None)
                     else math.inf if est is None else abs(est.step - s)),
        checkpoints_lost=lost,
        decision=decision,
    )


def evaluate(seeds: Sequence[int] = SEEDS, kinds: Sequence[str] = KINDS,
             intervals: Sequence[int] = INTERVALS) -> list[Outcome]:
    outcomes = []
    for kind in kinds:
        for magnitude in MAGNITUDES[kind]:
            for seed in seeds:
                incident = make_incident(kind, magnitude, seed)
                outcomes.extend(judge(incident, interval) for interval in intervals)
    return outcomes


def accuracy_table(outcomes: Sequence[Outcome]) -> list[dict]:
    """One row per (kind, magnitude, interval) plus an ``all`` row."""
    rows = []
    keys = sorted({(o.kind, o.magnitude, o.interval) for o in outcomes},
                  key=lambda k: (KINDS.index(k[0]), MAGNITUDES[k[0]].index(k[1]), k[2]))
    for key in keys + [("all", "", 0)]:
        group = [o for o in outcomes if key[0] == "all" or (o.kind, o.magnitude, o.interval) == key]
        rows.append({
            "kind": key[0], "magnitude": key[1], "interval": key[2] or "all", "runs": len(group),
            "detected": np.mean([o.detected for o in group]),
            "clean": np.mean([o.clean for o in group]),
            "newest": np.mean([o.newest for o in group]),
            "covered": np.mean([o.covered for o in group]),
            "median_onset_error": _median([o.onset_error for o in group]),
            "median_checkpoints_lost": float(np.median([o.checkpoints_lost for o in group])),
            "max_checkpoints_lost": int(max(o.checkpoints_lost for o in group)),
        })
    return rows


def _median(values: Sequence[float]) -> float:
    """Median of the values that are not NaN (NaN when none is)."""
    kept = [v for v in values if not math.isnan(v)]
    return float(np.median(kept)) if kept else math.nan


def format_table(rows: Sequence[dict]) -> str:
    """The table as GitHub markdown."""
    head = ("| kind | magnitude | ckpt every | runs | detected | clean | newest clean "
            "| onset in interval | median onset error | checkpoints lost (median / max) |")
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        lines.append(
            f"| {r['kind']} | {r['magnitude']} | {r['interval']} | {r['runs']} | "
            f"{r['detected']:.0%} | {r['clean']:.0%} | {r['newest']:.0%} | {r['covered']:.0%} | "
            f"{'-' if math.isnan(r['median_onset_error']) else format(r['median_onset_error'], 'g')} | "
            f"{r['median_checkpoints_lost']:g} / "
            f"{r['max_checkpoints_lost']} |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------- tests

_OUTCOMES: list[Outcome] | None = None


def _outcomes() -> list[Outcome]:
    global _OUTCOMES
    if _OUTCOMES is None:
        _OUTCOMES = evaluate()
    return _OUTCOMES


def _detected() -> list[Outcome]:
    return [o for o in _outcomes() if o.detected or o.kind in TRANSIENT_KINDS]


def test_recommended_checkpoint_is_always_clean():
    outcomes = _outcomes()
    print("\n" + format_table(accuracy_table(outcomes)))
    # The rollback cannot see what no detector reported: judge it where there was evidence.
    dirty = [(o.kind, o.magnitude, o.interval, o.decision.checkpoint, o.decision.onset)
             for o in _detected() if not o.clean]
    assert not dirty, dirty[:3]


def test_lasting_corruption_is_detected():
    missed = {(o.kind, o.magnitude) for o in _outcomes()
              if not o.detected and o.kind not in TRANSIENT_KINDS}
    assert not missed, format_table(accuracy_table(_outcomes()))


def test_recommended_checkpoint_is_the_newest_clean_one_in_90_percent():
    share = np.mean([o.newest for o in _detected()])
    assert share >= 0.90, format_table(accuracy_table(_outcomes()))


def test_true_onset_lies_in_the_interval_in_90_percent():
    share = np.mean([o.covered for o in _detected()])
    assert share >= 0.90, format_table(accuracy_table(_outcomes()))


def test_never_more_than_one_checkpoint_of_margin_on_abrupt_faults():
    lost = [(o.kind, o.magnitude, o.interval, o.checkpoints_lost) for o in _detected()
            if o.kind != "drift" and o.checkpoints_lost > 1]
    assert not lost, lost[:5]


def test_clean_runs_and_transients_resume_from_the_newest_checkpoint():
    for o in _outcomes():
        if o.kind == "clean":
            assert o.decision.onset is None and o.newest, o.decision.reason
            assert not o.detected
        if o.kind == "burst":  # recorded, recovered: carrying on is the answer
            assert o.newest, (o.magnitude, o.interval, o.decision.reason)


def test_hardware_is_blamed_on_the_rank_and_data_gets_a_skip_range():
    for o in _detected():
        if o.kind == "rank" and o.magnitude != "x1.5":
            assert o.decision.skip_data_range is None
            assert o.decision.evidence["origin"] == "hardware", o.decision.reason
        if o.kind == "nan":
            assert o.decision.evidence["origin"] == "hardware", o.decision.reason


# ------------------------------------------------------------------ the decision, case by case

def _ckpts(*steps, **status):
    """Checkpoints at ``steps``; ``status`` maps 's1200'='deleted' / 'verified', or a verdict."""
    out = []
    for s in steps:
        mark = status.get(f"s{s}", "ok")
        if mark in ("good", "bad"):
            out.append(Checkpoint(s, f"mem://{s}", "ok", mark))
        else:
            out.append(Checkpoint(s, f"mem://{s}", mark))
    return out


def _onset(step, low, high, origin="unknown", ranks=(), shape="abrupt", spike_end=None):
    return OnsetEstimate(step=step, low=low, high=high, confidence=0.9,
                         signals_used=["grad_norm"], per_signal={}, shape=shape, origin=origin,
                         ranks=ranks, spike_end=spike_end)


@pytest.mark.parametrize("ckpts, onset, expected, conservative", [
    # no corruption: the newest usable checkpoint
    (_ckpts(100, 200, 300), None, 300, False),
    (_ckpts(100, 200, 300, s300="deleted"), None, 200, False),
    # a checkpoint at c holds the update of c: c == s is NOT clean
    (_ckpts(100, 200, 300), _onset(200, 200, 200), 100, False),
    (_ckpts(100, 200, 300), _onset(201, 201, 201), 200, False),
    # never a deleted one
    (_ckpts(100, 200, 300, s200="deleted"), _onset(250, 250, 250), 100, False),
    # a wide interval passes over at most one checkpoint before the point estimate's, and says so
    (_ckpts(100, 200, 300, 400), _onset(350, 150, 380), 200, True),
    (_ckpts(100, 200, 300, 400), _onset(350, 250, 380), 200, True),
    (_ckpts(100, 200, 300, 400), _onset(350, 320, 380), 300, False),
    # none only when no checkpoint precedes the point estimate
    (_ckpts(100, 200), _onset(150, 40, 160), 100, False),
    # a probe's good verdict wins inside the interval; nothing at or after a bad one
    (_ckpts(100, 200, 300, 400, s300="good"), _onset(350, 150, 380), 300, False),
    (_ckpts(100, 200, 300, 400, s300="verified"), _onset(350, 150, 380), 300, False),
    (_ckpts(100, 200, 300, 400, s200="bad"), None, 100, False),
    # a good verdict after a bad one contradicts monotone corruption: ignored
    (_ckpts(100, 200, 300, 400, s200="bad", s300="good"), None, 100, False),
    # nothing clean at all
    (_ckpts(100, 200), _onset(50, 40, 60), None, False),
])
def test_decision_table(ckpts, onset, expected, conservative):
    d = choose_rollback(ckpts, onset)
    assert (None if d.checkpoint is None else d.checkpoint.step) == expected, d.reason
    assert d.conservative == conservative
    assert d.reason and "\n" not in d.reason


def test_wide_interval_reason_names_the_skipped_checkpoints_and_bisection():
    d = choose_rollback(_ckpts(100, 200, 300, 400), _onset(350, 150, 380))
    assert d.evidence["bisect_candidates"] == [300]
    assert "wide" in d.reason and "300" in d.reason and "bisection" in d.reason
    assert "one checkpoint of margin" in d.reason


def test_margin_is_one_checkpoint_however_wide_the_interval():
    # Checkpoints every 100 steps; the interval reaches back nine checkpoints before the point.
    ckpts = _ckpts(*range(100, 1100, 100))
    d = choose_rollback(ckpts, _onset(950, 120, 960))
    assert d.checkpoint.step == 800 and d.conservative
    assert d.evidence["bisect_candidates"] == [900]
    # A deleted checkpoint does not count as the margin: the next older live one is used.
    d = choose_rollback(_ckpts(*range(100, 1100, 100), s800="deleted"), _onset(950, 120, 960))
    assert d.checkpoint.step == 700


def test_bisection_verdicts_become_evidence():
    b = Bisection.start([100, 200, 300, 400])
    while (step := b.next_probe()) is not None:
        b.report(step, good=step <= 300)
    d = choose_rollback(_ckpts(100, 200, 300, 400), _onset(350, 150, 380), bisection=b)
    assert d.checkpoint.step == 300 and not d.conservative
    assert "verified good" in d.reason


def test_data_origin_suggests_a_skip_range_and_hardware_names_ranks():
    data = choose_rollback(_ckpts(100, 200), _onset(250, 250, 250, origin="data", spike_end=254))
    assert data.skip_data_range == (250, 254) and "skip the batches" in data.reason
    hw = choose_rollback(_ckpts(100, 200), _onset(250, 250, 250, origin="hardware", ranks=(7,)))
    assert hw.skip_data_range is None and "rank(s) 7" in hw.reason
    # Findings alone can tell too: a rank_outlier names hardware, a run-wide spike the data.
    f_hw = [Finding("rank_outlier", step=251, ranks=(3,))]
    assert choose_rollback(_ckpts(100), _onset(250, 250, 250), f_hw).evidence["ranks"] == [3]
    f_data = [Finding("grad_spike", step=250)]
    assert choose_rollback(_ckpts(100), _onset(250, 248, 250), f_data).skip_data_range == (248, 250)


def test_decision_is_json_serialisable():
    import json
    d = choose_rollback(_ckpts(100, 200), _onset(150, 140, 160), [Finding("grad_spike", step=150)])
    json.dumps(d.to_dict())
