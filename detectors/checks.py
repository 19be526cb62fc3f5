"""The conformance checks of a block detector, as a library (after river's ``check_estimator``).

``check_block_detector(make, trace)`` runs every check on a detector built by ``make()`` (a
fresh one each time it is called) over ``trace``, a block on which the detector fires, and
raises ``AssertionError`` naming the check that failed. ``BLOCK_CHECKS`` lists them by name, so a
test suite can report each on its own. What they hold a detector to:

- **split anywhere**: the trace in one block, or cut into blocks anywhere, gives the same findings;
- **one-step blocks**: fed one step at a time, the same findings;
- **permuted ranks**: relabelling rank ids maps every finding's ranks through the relabelling;
- **constants**: constant healthy series never fire;
- **missing is not NaN**: whatever sits in a cell that is not present is ignored, and a block with
  nothing present fires nothing; a field left out equals a field present nowhere;
- **state round trip**: a snapshot (strict JSON, as the service stores it) restored into a fresh
  detector gives the same findings afterwards, at seeded random cuts and at cuts inside each of
  the detector's own episodes (state it holds only mid-episode must survive);
- **input unchanged**: ``update`` never writes into the block (one block goes to every detector);
- **clone**: a clone is fresh, shares nothing, and behaves as a new detector;
- **kinds declared**: every kind it reports is one it declares (``kinds``, :mod:`healthsvc_detectors.kinds`).

>>> from healthsvc_detectors.non_finite import NonFiniteDetector
>>> from healthsvc_detectors.frame import StepBlock
>>> import numpy as np
>>> loss = np.full((40, 4), 1.0); loss[30, 2] = np.nan
>>> check_block_detector(NonFiniteDetector, StepBlock.from_dense(np.arange(40), np.arange(4), loss=loss))
"""
from __future__ import annotations

import json
from dataclasses import replace
from typing import Any, Callable, Iterable

import numpy as np

from healthsvc_detectors.base import BlockDetector
from healthsvc_detectors.finding import Finding
from healthsvc_detectors.frame import StepBlock

Make = Callable[[], BlockDetector]


def blocks(trace: StepBlock, cuts: Iterable[int]) -> list[StepBlock]:
    """``trace`` cut at the given step positions (indices into its rows)."""
    edges = [0, *sorted({int(c) for c in cuts if 0 < c < trace.n_steps}), trace.n_steps]
    return [trace.slice_steps(a, b) for a, b in zip(edges, edges[1:]) if b > a]


def every(trace: StepBlock, n: int) -> list[StepBlock]:
    """``trace`` in blocks of ``n`` steps."""
    return blocks(trace, range(n, trace.n_steps, n))


def feed(det: BlockDetector, parts: Iterable[StepBlock]) -> list[Finding]:
    return [f for b in parts for f in det.update(b)]


def snapshot(det: Any) -> dict[str, Any]:
    """The state as the service stores it: strict JSON, which has no NaN or infinity, so a
    detector writes non-finite numbers as strings (``stats.state_json.array_to_json``); the
    service writes the state with orjson, which would turn them into null. A raw one fails here."""
    return json.loads(json.dumps(det.state_dict(), allow_nan=False))


def _key(f: Finding) -> tuple:
    return (f.step, f.kind, f.metric or "", f.status, f.ranks, f.severity, f.score, f.onset_step or -1)


def _copy(trace: StepBlock) -> StepBlock:
    return StepBlock(steps=trace.steps.copy(), ranks=trace.ranks.copy(),
                     values={m: v.copy() for m, v in trace.values.items()},
                     present={m: p.copy() for m, p in trace.present.items()})


# ------------------------------------------------------------------------------------ the checks
def split_anywhere(make: Make, trace: StepBlock, seed: int = 0) -> None:
    whole = make().update(trace)
    rng = np.random.default_rng(seed)
    for n_cuts in (1, 7, 40):
        cuts = rng.integers(1, trace.n_steps, size=n_cuts)
        assert feed(make(), blocks(trace, cuts)) == whole, f"cut at {sorted(cuts.tolist())}"


def one_step_blocks(make: Make, trace: StepBlock, seed: int = 0) -> None:
    head = trace.slice_steps(0, min(trace.n_steps, 1_050))
    assert feed(make(), every(head, 1)) == make().update(head)


def permuted_ranks(make: Make, trace: StepBlock, seed: int = 0) -> None:
    mapping = 100 + np.random.default_rng(seed).permutation(int(trace.ranks.max()) + 1)
    ids = mapping[trace.ranks]
    order = np.argsort(ids)
    relabelled = StepBlock(steps=trace.steps, ranks=ids[order],
                           values={m: v[:, order] for m, v in trace.values.items()},
                           present={m: p[:, order] for m, p in trace.present.items()})
    got = feed(make(), every(relabelled, 64))
    want = [replace(f, ranks=tuple(sorted(int(mapping[r]) for r in f.ranks))) for f in make().update(trace)]
    assert sorted(map(_key, got)) == sorted(map(_key, want))


def constants_never_fire(make: Make, trace: StepBlock, seed: int = 0) -> None:
    n, r = 1_500, 16
    for value in (1e-3, 1.0, 1e3):
        block = StepBlock.from_dense(np.arange(n), np.arange(r), **{
            m: np.full((n, r), value) for m in ("loss", "grad_norm", "local_grad_norm", "step_time",
                                                "compute_time", "comm_time", "data_time", "lr")})
        block.values["ts"] = np.repeat((1_000.0 + np.arange(n) * value)[:, None], r, axis=1)
        block.present["ts"] = np.ones((n, r), dtype=bool)
        assert feed(make(), every(block, 50)) == [], f"constant {value}"


def missing_is_not_nan(make: Make, trace: StepBlock, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    junk = [np.nan, np.inf, -np.inf, 0.0, -3.0, 1e9]
    garbage = StepBlock(steps=trace.steps, ranks=trace.ranks, values={
        m: np.where(trace.present[m], v, rng.choice(junk, size=v.shape)) for m, v in trace.values.items()},
        present={m: p.copy() for m, p in trace.present.items()})
    assert feed(make(), every(garbage, 64)) == make().update(trace), "a cell not present was read"
    nothing = StepBlock(steps=trace.steps, ranks=trace.ranks, values=garbage.values,
                        present={m: np.zeros_like(p) for m, p in trace.present.items()})
    assert feed(make(), every(nothing, 64)) == [], "a block with nothing present fired"
    for metric in [m for m in ("ts", "compute_time", "local_grad_norm") if m in trace.values]:
        absent = {m: p if m != metric else np.zeros_like(p) for m, p in trace.present.items()}
        masked = StepBlock(steps=trace.steps, ranks=trace.ranks, values=dict(trace.values), present=absent)
        left_out = StepBlock(steps=trace.steps, ranks=trace.ranks,
                             values={m: v for m, v in trace.values.items() if m != metric},
                             present={m: p for m, p in trace.present.items() if m != metric})
        assert make().update(masked) == make().update(left_out), f"{metric} left out differs from absent"


def episode_cuts(findings: list[Finding], n_steps: int, limit: int = 12) -> list[int]:
    """Cuts inside a detector's own episodes: a step after each firing finding, and halfway to
    the resolution that closes it (findings' steps are used as row positions of a trace whose
    steps start at 0)."""
    cuts: set[int] = set()
    for f in (f for f in findings if f.status == "firing"):
        cuts.add(f.step + 1)
        end = next((g.step for g in findings if g.status == "resolved" and g.kind == f.kind
                    and g.metric == f.metric and g.step > f.step), None)
        if end is not None and end - f.step > 2:
            cuts.add((f.step + end) // 2)
    ordered = sorted(c for c in cuts if 0 < c < n_steps)
    if len(ordered) > limit:   # evenly over the trace's episodes, first and last kept
        ordered = [ordered[round(i * (len(ordered) - 1) / (limit - 1))] for i in range(limit)]
    return ordered


def state_round_trip(make: Make, trace: StepBlock, seed: int = 0) -> None:
    whole = make().update(trace)
    rng = np.random.default_rng(seed)
    inside = episode_cuts(whole, trace.n_steps)
    assert inside or not whole, "no episode to cut inside"
    for cut in [*rng.integers(1, trace.n_steps, size=4).tolist(), *inside]:
        first = make()
        head = feed(first, every(trace.slice_steps(0, cut), 97))
        restored = make()
        restored.load_state_dict(snapshot(first))
        tail = feed(restored, every(trace.slice_steps(cut, trace.n_steps), 97))
        assert head + tail == whole, f"restored at step {cut} finds otherwise"


def input_unchanged(make: Make, trace: StepBlock, seed: int = 0) -> None:
    block = _copy(trace)
    feed(make(), every(block, 211))
    make().update(block)
    assert np.array_equal(block.steps, trace.steps) and np.array_equal(block.ranks, trace.ranks)
    assert block.values.keys() == trace.values.keys() and block.present.keys() == trace.present.keys()
    for m in trace.values:
        assert np.array_equal(block.values[m], trace.values[m], equal_nan=True), f"wrote into {m}"
        assert np.array_equal(block.present[m], trace.present[m]), f"wrote into present[{m}]"


def clone_is_fresh(make: Make, trace: StepBlock, seed: int = 0) -> None:
    used = make()
    used.update(trace.slice_steps(0, trace.n_steps // 2))
    before = json.dumps(used.state_dict(), allow_nan=True)
    twin = used.clone()  # type: ignore[attr-defined]
    assert twin is not used and twin.update(trace) == make().update(trace)
    assert json.dumps(used.state_dict(), allow_nan=True) == before, "the clone shares state"


def kinds_declared(make: Make, trace: StepBlock, seed: int = 0) -> None:
    det = make()
    declared = {k.name for k in getattr(det, "kinds", ())}
    reported = {f.kind for f in det.update(trace)}
    assert reported <= declared, f"reports {sorted(reported - declared)} without declaring them"


BLOCK_CHECKS: dict[str, Callable[..., None]] = {
    "split_anywhere": split_anywhere, "one_step_blocks": one_step_blocks, "permuted_ranks": permuted_ranks,
    "constants_never_fire": constants_never_fire, "missing_is_not_nan": missing_is_not_nan,
    "state_round_trip": state_round_trip, "input_unchanged": input_unchanged, "clone_is_fresh": clone_is_fresh,
    "kinds_declared": kinds_declared,
}


def check_block_detector(make: Make, trace: StepBlock, seed: int = 0) -> None:
    """Run every check of :data:`BLOCK_CHECKS`; the first that fails raises, named."""
    for name, check in BLOCK_CHECKS.items():
        try:
            check(make, trace, seed)
        except AssertionError as exc:
            raise AssertionError(f"{name}: {exc}") from exc
