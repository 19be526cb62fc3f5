"""The conformance checks of an absence detector, as a library (the twin of :mod:`healthsvc_detectors.checks`).

An absence detector (:class:`~healthsvc_detectors.base.AbsenceDetector`: ``observe``, ``heartbeat``,
``set_world``, ``tick``, ``finish``, ``shift_clock``) is driven by a script of events on the
caller's clock. ``check_absence_detector(make, script)`` runs every check on detectors built by
``make()`` (a fresh one each call) over ``script`` (default :func:`job_script`, which makes every
absence detector fire and resolve), and raises ``AssertionError`` naming the check that failed.
``ABSENCE_CHECKS`` lists them by name, so a suite can report each on its own:

- **fires and resolves**: the script makes it fire and resolve, so "the same findings" compares
  something;
- **split pushes**: a push of many ranks, or the same records in several arrivals at the same
  instant, find the same (only the grouping of the resolved findings may differ);
- **extra ticks**: ticks in between find the same findings, none later;
- **permuted ranks**: relabelling rank ids maps every finding's ranks through the relabelling;
- **steady job**: a job pushing and beating steadily never fires;
- **unknown step**: a heartbeat that does not tell its step says "alive", never "moved";
- **state round trip**: a snapshot (strict JSON) restored mid-script, with the downtime shifted
  away by ``shift_clock``, finds the same afterwards;
- **clock offset**: only clock differences matter, never the clock's origin;
- **clone**: a clone is fresh, shares nothing, and behaves as a new detector;
- **kinds declared**: every kind it reports is one it declares.

>>> from healthsvc_detectors.hang import HangDetector
>>> check_absence_detector(HangDetector)
"""
from __future__ import annotations

import json
from dataclasses import replace
from typing import Any, Callable, Sequence

import numpy as np

from healthsvc_detectors.base import AbsenceDetector
from healthsvc_detectors.finding import Finding

Make = Callable[[], AbsenceDetector]
# ("observe", ranks, steps, t) | ("heartbeat", rank, step, phase, t) | ("set_world", ranks, t)
# | ("tick", t) | ("finish", t)
Event = tuple


def job_script() -> list[Event]:
    """8 ranks push every second and send heartbeats; rank 3 falls silent at 40 s and comes back
    at 160 s; at 260 s the job stops with rank 5 outside the collective (the others wait in it)
    and resumes at 330 s; a checkpoint pauses every rank from 420 s to 520 s; the world shrinks
    to 6 ranks at 560 s (ranks 6 and 7 leave); the run finishes at 700 s."""
    events: list[Event] = []
    step = 0
    for t in range(0, 700):
        now = float(t)
        world = 8 if t < 560 else 6
        if t == 560:
            events.append(("set_world", tuple(range(6)), now))
        stopped = 260 <= t < 330
        paused = 420 <= t < 520
        if not stopped and not paused:
            step += 1
            ranks = [r for r in range(world) if not (r == 3 and 40 <= t < 160)]
            events.append(("observe", tuple(ranks), tuple([step] * len(ranks)), now))
        for r in range(world):
            if r == 3 and 40 <= t < 160:
                continue
            phase = ("checkpoint" if paused else "data" if (stopped and r == 5)
                     else "collective" if stopped else "forward")
            events.append(("heartbeat", r, step if not stopped or r != 5 else step - 1, phase, now + 0.5))
        events.append(("tick", now + 0.9))
    events.append(("finish", 700.0))
    events += [("tick", 700.0 + 10 * k) for k in range(1, 60)]
    return events


def drive(det: AbsenceDetector, events: Sequence[Event]) -> list[list[Finding]]:
    """The findings of each event, in order."""
    out: list[list[Finding]] = []
    for ev in events:
        kind = ev[0]
        if kind == "observe":
            out.append(det.observe(np.asarray(ev[1], dtype=np.int64), np.asarray(ev[2], dtype=np.int64), ev[3]))
        elif kind == "heartbeat":
            out.append(det.heartbeat(*ev[1:]))
        elif kind == "set_world":
            out.append(det.set_world(ev[1], ev[2]))
        elif kind == "tick":
            out.append(det.tick(ev[1]))
        elif kind == "finish":
            out.append(det.finish(ev[1]))
        else:
            raise ValueError(f"unknown event {kind!r}")
    return out


def flat(per_event: list[list[Finding]]) -> list[Finding]:
    return [f for fs in per_event for f in fs]


def identity(f: Finding) -> tuple:
    return (f.kind, f.status, f.step, f.ranks)


def _key(f: Finding) -> tuple:
    return (f.step, f.kind, f.metric or "", f.status, f.ranks, f.severity, f.score, f.onset_step or -1)


def _same(a: list[Finding], b: list[Finding]) -> bool:
    return sorted(map(_key, a)) == sorted(map(_key, b))


def _time(ev: Event) -> float:
    return ev[1] if ev[0] in ("tick", "finish") else ev[-1]


def _shifted(ev: Event, dt: float) -> Event:
    if ev[0] in ("tick", "finish"):
        return (ev[0], ev[1] + dt)
    return (*ev[:-1], ev[-1] + dt)


def snapshot(det: Any) -> dict[str, Any]:
    """The state as the service stores it: strict JSON, which has no NaN or infinity, so a
    detector writes non-finite numbers as strings (``stats.state_json.array_to_json``); the
    service writes the state with orjson, which would turn them into null. A raw one fails here."""
    return json.loads(json.dumps(det.state_dict(), allow_nan=False))


# ------------------------------------------------------------------------------------ the checks
def fires_and_resolves(make: Make, script: Sequence[Event], seed: int = 0) -> None:
    statuses = {f.status for f in flat(drive(make(), script))}
    assert {"firing", "resolved"} <= statuses, f"the script makes it {sorted(statuses) or 'silent'}: extend it"


def split_pushes(make: Make, script: Sequence[Event], seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    events: list[Event] = []
    for ev in script:
        if ev[0] == "observe" and len(ev[1]) > 1:
            cut = sorted(rng.choice(np.arange(1, len(ev[1])), size=rng.integers(1, len(ev[1])), replace=False))
            events += [("observe", ev[1][lo:hi], ev[2][lo:hi], ev[3]) for lo, hi in zip([0, *cut], [*cut, len(ev[1])])]
        else:
            events.append(ev)
    assert _same(flat(drive(make(), events)), flat(drive(make(), script))), "a push split into arrivals differs"


def extra_ticks(make: Make, script: Sequence[Event], seed: int = 0) -> None:
    end = max(_time(ev) for ev in script)
    ticks = sorted(np.random.default_rng(seed).uniform(0.0, end, size=60).tolist())
    events: list[Event] = []
    i = 0
    for ev in script:
        while i < len(ticks) and ticks[i] < _time(ev):
            events.append(("tick", ticks[i]))
            i += 1
        events.append(ev)
    got = [identity(f) for f in flat(drive(make(), events))]
    assert got == [identity(f) for f in flat(drive(make(), script))], "extra ticks changed the findings"


def permuted_ranks(make: Make, script: Sequence[Event], seed: int = 0) -> None:
    ranks = {r for ev in script if ev[0] in ("observe", "set_world") for r in ev[1]}
    ranks |= {ev[1] for ev in script if ev[0] == "heartbeat"}
    mapping = 100 + np.random.default_rng(seed).permutation(max(ranks) + 1)

    def move(ev: Event) -> Event:
        if ev[0] == "observe":
            return ("observe", tuple(int(mapping[r]) for r in ev[1]), ev[2], ev[3])
        if ev[0] == "heartbeat":
            return ("heartbeat", int(mapping[ev[1]]), *ev[2:])
        if ev[0] == "set_world":
            return ("set_world", tuple(int(mapping[r]) for r in ev[1]), ev[2])
        return ev

    for g, w in zip(drive(make(), [move(ev) for ev in script]), drive(make(), script)):
        want = [replace(f, ranks=tuple(sorted(int(mapping[r]) for r in f.ranks))) for f in w]
        assert _same(g, want), "relabelled ranks find otherwise"


def steady_job_never_fires(make: Make, script: Sequence[Event], seed: int = 0) -> None:
    events: list[Event] = []
    for i, t in enumerate(range(0, 2_000, 2)):
        events.append(("observe", tuple(range(8)), tuple([i + 1] * 8), float(t)))
        events += [("heartbeat", r, i + 1, "forward", t + 0.5) for r in range(8)]
        events.append(("tick", t + 1.0))
    assert flat(drive(make(), events)) == [], "a steady job fired"


def unknown_step_is_no_progress(make: Make, script: Sequence[Event], seed: int = 0) -> None:
    # A rank silent in the middle of the script (its heartbeats stop, then come back) now sends
    # heartbeats that do not tell their step (-1) every second of its gap: they say "alive", never
    # "moved", so which findings fire is unchanged.
    beats: dict[int, set[int]] = {}
    for ev in script:
        if ev[0] == "heartbeat":
            beats.setdefault(ev[1], set()).add(int(ev[-1]))
    quiet = [("heartbeat", r, -1, "forward", t + 0.7) for r, seconds in beats.items()
             for t in range(min(seconds), max(seconds)) if t not in seconds]
    assert quiet, "the script has no rank that falls silent and comes back"
    events = sorted([*script, *quiet], key=_time)
    firing = {identity(f) for f in flat(drive(make(), events)) if f.status == "firing"}
    assert firing == {identity(f) for f in flat(drive(make(), script)) if f.status == "firing"}, \
        "a heartbeat with no step counted as progress"


def state_round_trip(make: Make, script: Sequence[Event], seed: int = 0) -> None:
    whole = [identity(f) for f in flat(drive(make(), script))]
    rng = np.random.default_rng(seed)
    for cut in sorted(rng.integers(1, len(script), size=5).tolist()):
        first = make()
        head = drive(first, script[:cut])
        restored = make()
        restored.load_state_dict(snapshot(first))
        # The service was down for 1,000 s: it shifts the detector's clock, then time goes on later.
        restored.shift_clock(1_000.0)
        tail = drive(restored, [_shifted(ev, 1_000.0) for ev in script[cut:]])
        assert [identity(f) for f in flat(head + tail)] == whole, f"restored at event {cut} finds otherwise"


def clock_offset(make: Make, script: Sequence[Event], seed: int = 0) -> None:
    for g, w in zip(drive(make(), [_shifted(ev, 12_345.0) for ev in script]), drive(make(), script)):
        assert [(identity(f), f.severity, f.score) for f in g] == [(identity(f), f.severity, f.score) for f in w], \
            "the clock's origin changed the findings"


def clone_is_fresh(make: Make, script: Sequence[Event], seed: int = 0) -> None:
    used = make()
    drive(used, script[: len(script) // 2])
    before = json.dumps(used.state_dict(), allow_nan=True)
    twin = used.clone()  # type: ignore[attr-defined]
    assert twin is not used
    assert [identity(f) for f in flat(drive(twin, script))] == [identity(f) for f in flat(drive(make(), script))]
    assert json.dumps(used.state_dict(), allow_nan=True) == before, "the clone shares state"


def kinds_declared(make: Make, script: Sequence[Event], seed: int = 0) -> None:
    det = make()
    declared = {k.name for k in getattr(det, "kinds", ())}
    reported = {f.kind for f in flat(drive(det, script))}
    assert reported <= declared, f"reports {sorted(reported - declared)} without declaring them"


ABSENCE_CHECKS: dict[str, Callable[..., None]] = {
    "fires_and_resolves": fires_and_resolves, "split_pushes": split_pushes, "extra_ticks": extra_ticks,
    "permuted_ranks": permuted_ranks, "steady_job_never_fires": steady_job_never_fires,
    "unknown_step_is_no_progress": unknown_step_is_no_progress, "state_round_trip": state_round_trip,
    "clock_offset": clock_offset, "clone_is_fresh": clone_is_fresh, "kinds_declared": kinds_declared,
}


def check_absence_detector(make: Make, script: Sequence[Event] | None = None, seed: int = 0) -> None:
    """Run every check of :data:`ABSENCE_CHECKS` over ``script`` (default :func:`job_script`);
    the first that fails raises, named."""
    events = job_script() if script is None else list(script)
    for name, check in ABSENCE_CHECKS.items():
        try:
            check(make, events, seed)
        except AssertionError as exc:
            raise AssertionError(f"{name}: {exc}") from exc
