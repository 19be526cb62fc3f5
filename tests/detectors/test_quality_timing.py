"""Fault-injection quality of the timing detectors over realistic traces.

Block-driven detectors (straggler, slowdown) run over 10,000-step, 64/128-rank seeded traces from
:mod:`simulation` (warm-up, 2 % jitter — 6 % in three "noisy" traces —, per-rank hardware
offsets, a 5x slow step every 500 steps, some traces with 2 % of values missing), streamed in
blocks of 1..64 steps.
The hang detector is driven by an event simulation on a fake clock: 64 ranks, 10,000 steps of
~0.5 s (log-normal jitter), pushes every 10 steps (8 requests per round, each with delivery jitter),
a 20 s checkpoint pause every 2,000 steps, a 1 s service ticker, heartbeats every 10 s; each
run ends with ``finish``.

The block scenarios also run with the trainer's clock (``ts``, the ``+ts`` rows: each step's
median step time accumulated): then a timing finding is ``info`` when it is first named and pages
(``warning`` or worse) only once it has lasted ``min_duration_s`` of trainer time (30 s for a
straggler, 300 s for a slowdown), so their limits grow by that many steps at the fastest pace.

Prints precision, recall and detection delay per fault kind (``pytest -s`` shows the table) and
asserts the issue's targets. Delays are in steps for block detectors and, for hangs and stalls, the
silence in seconds at detection (since the last progress), checked against the detector's own
adaptive timeout (``max(floor, 10 x push interval)``) plus one tick (and one peer push for a
hang, which must see the job go on without the rank).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

from healthsvc_detectors.finding import SEVERITY_ORDER, Finding
from healthsvc_detectors.hang import HangDetector
from simulation import Straggler, iter_blocks, simulate_run
from healthsvc_detectors.slowdown import SlowdownDetector
from healthsvc_detectors.straggler import StragglerDetector

N_STEPS = 10_000


@dataclass
class Scenario:
    name: str
    kind: str | None            # the fault kind expected (None: a clean run)
    onset: float = 0.0          # step (block detectors) or seconds (hang)
    ranks: tuple[int, ...] = ()
    findings: list[tuple[float, Finding]] = field(default_factory=list)  # (when, finding)
    limit: float = 0.0          # maximal acceptable delay


def _alarming(f: Finding) -> bool:
    return f.status == "firing" and SEVERITY_ORDER[f.severity] >= SEVERITY_ORDER["warning"]


# ----------------------------------------------------------------------------- block scenarios
def _block_scenario(name: str, seed: int, n_ranks: int, *, straggler: float | None = None,
                    slowdown: float | None = None, missing: float = 0.0,
                    jitter: float = 0.02, with_ts: bool = False) -> Scenario:
    rng = np.random.default_rng(seed)
    onset = int(rng.integers(2_000, 8_000))
    rank = int(rng.integers(0, n_ranks))
    faults = [Straggler(step=onset, rank=rank, factor=straggler)] if straggler else []
    run = simulate_run(n_steps=N_STEPS, n_ranks=n_ranks, seed=seed, faults=faults,
                       missing_fraction=missing, time_jitter=jitter)
    if slowdown:
        run.block.values["step_time"][onset:] *= slowdown
    extra = 0
    if with_ts:
        # The trainer's clock: the job advances by its (median) step time each step.
        st = run.block.values["step_time"]
        ts = 1_000.0 + np.cumsum(np.nanmedian(np.where(run.block.present["step_time"], st, np.nan), axis=1))
        run.block.values["ts"] = np.repeat(ts[:, None], n_ranks, axis=1)
        run.block.present["ts"] = np.ones(st.shape, dtype=bool)
        fastest = float(np.min(np.diff(ts)))
        min_s = (StragglerDetector().min_duration_s if straggler else SlowdownDetector().min_duration_s)
        extra = int(np.ceil(min_s / fastest)) + 1
    dets = [StragglerDetector(), SlowdownDetector()]
    out: list[tuple[float, Finding]] = []
    for block in iter_blocks(run.block, seed=seed, max_size=64):
        for det in dets:
            out += [(f.step, f) for f in det.update(block)]
    if straggler:
        return Scenario(name, "straggler", onset, (rank,), out, (50 if straggler >= 1.3 else 200) + extra)
    if slowdown:
        return Scenario(name, "slowdown", onset, (), out, 50 + extra)
    return Scenario(name, None, findings=out)


# ------------------------------------------------------------------------------ hang scenarios
def _hang_scenario(name: str, seed: int, *, dead_rank: int | None = None,
                   stuck_rank: int | None = None, finish_at: float | None = None,
                   n_ranks: int = 64) -> Scenario:
    """Event simulation. ``dead_rank``: that rank's process dies (no pushes, no heartbeats) while
    the others go on (an asynchronous job). ``stuck_rank``: synchronous job; that rank is stuck
    in ``compute`` and the others block in the all-reduce (heartbeats keep coming, steps stop)."""
    rng = np.random.default_rng(seed)
    det = HangDetector(timeout_floor_s=30.0)
    det.set_world(range(n_ranks), 0.0)
    step_s = 0.5 * np.exp(rng.normal(0.0, 0.1, N_STEPS))
    step_s[1999::2000] += 20.0                              # checkpoint pauses
    done_at = np.cumsum(step_s)                              # when step i completes
    end_t = float(done_at[-1])
    finish_at = end_t + 1.0 if finish_at is None else finish_at   # every run ends with finish
    fault_step = int(rng.integers(3_000, 8_000))
    fault_t = float(done_at[fault_step - 1])
    events: list[tuple[float, int, str, tuple]] = []
    seq = 0
    groups = np.array_split(np.arange(n_ranks), 8)           # HTTP deliveries per push round
    for i in range(9, N_STEPS, 10):                          # each rank pushes every 10 steps
        if done_at[i] >= finish_at:
            break
        for g in groups:
            if stuck_rank is not None and done_at[i] >= fault_t:
                continue
            g = g[g != dead_rank] if dead_rank is not None and done_at[i] >= fault_t else g
            t = float(done_at[i] + rng.exponential(0.05))
            events.append((t, seq, "push", (g, np.full(len(g), i))))
            seq += 1
    for t in np.arange(10.0, min(end_t, finish_at), 10.0):   # heartbeats every 10 s
        stepping = int(np.searchsorted(done_at, t))
        for r in range(n_ranks):
            if dead_rank == r and t >= fault_t:
                continue
            if stuck_rank is not None and t >= fault_t:
                phase = "compute" if r == stuck_rank else "collective"
                events.append((float(t), seq, "hb", (r, fault_step, phase)))
            else:
                events.append((float(t), seq, "hb", (r, stepping, "compute")))
            seq += 1
    for t in np.arange(1.0, end_t + 120.0, 1.0):             # the service ticker
        events.append((float(t), seq, "tick", ()))
        seq += 1
    events.append((finish_at, seq, "finish", ()))
    events.sort()
    out: list[tuple[float, Finding]] = []
    for t, _, kind, payload in events:
        if kind == "push":
            out += [(t, f) for f in det.observe(payload[0], payload[1], t)]
        elif kind == "hb":
            out += [(t, f) for f in det.heartbeat(*payload, t)]
        elif kind == "tick":
            out += [(t, f) for f in det.tick(t)]
        else:
            out += [(t, f) for f in det.finish(t)]
    last_push = float(done_at[(fault_step // 10) * 10 - 1])
    if dead_rank is not None:
        return Scenario(name, "hang", last_push, (dead_rank,), out)
    if stuck_rank is not None:
        return Scenario(name, "stall", last_push, (stuck_rank,), out)
    return Scenario(name, None, findings=out)


# ------------------------------------------------------------------------------------ scoring
def _score(sc: Scenario) -> dict:
    """TP/FN for the expected fault, FP for every other alarming finding, delay of the first hit."""
    hits, fps, explained = [], [], 0
    for when, f in sc.findings:
        if not _alarming(f):
            continue
        if sc.kind == "straggler" and f.kind == "straggler" and f.ranks == sc.ranks and when >= sc.onset:
            hits.append(when)
        elif sc.kind == "slowdown" and f.kind == "slowdown" and when >= sc.onset:
            hits.append(when)
        elif sc.kind == "hang" and f.kind == "hang" and f.ranks == sc.ranks and when >= sc.onset:
            hits.append(when)
        elif sc.kind == "stall" and f.kind in ("stall", "hang") and when >= sc.onset:
            if f.kind == "stall" or (f.ranks == sc.ranks and f.evidence.get("culprit")):
                hits.append(when)
            else:
                fps.append(f)
        elif sc.kind == "straggler" and f.kind == "slowdown" and when >= sc.onset:
            explained += 1      # a straggler in synchronous training slows the whole job: true
        else:
            fps.append(f)
    culprit = None
    if sc.kind == "stall":
        culprit = any(f.kind == "hang" and f.ranks == sc.ranks and f.evidence.get("culprit")
                      for _, f in sc.findings)
    delay = (min(hits) - sc.onset) if hits else None
    if hits and sc.kind in ("hang", "stall"):
        # "Within the timeout": the silence at detection against the detector's own adaptive
        # timeout, plus one tick (1 s) and, for a hang, one peer push (it must see the job go on).
        first = next(f for w, f in sc.findings if w == min(hits) and f.kind in ("hang", "stall"))
        delay = first.evidence["silent_s"]
        sc.limit = first.evidence["timeout_s"] + 1.0 + (first.evidence.get("interval_s") or 0.0)
    return {"hit": bool(hits), "fps": fps, "delay": delay, "explained": explained, "culprit": culprit}


def _scenarios() -> list[Scenario]:
    out = []
    for seed in range(3):
        out.append(_block_scenario(f"clean/{seed}", seed, 64))
        out.append(_block_scenario(f"straggler1.3/{seed}", 100 + seed, 64, straggler=1.3))
        out.append(_block_scenario(f"straggler1.1/{seed}", 200 + seed, 64, straggler=1.1))
        out.append(_block_scenario(f"slowdown1.2/{seed}", 300 + seed, 64, slowdown=1.2))
    out.append(_block_scenario("clean/128r-missing", 7, 128, missing=0.02))
    out.append(_block_scenario("straggler1.1/128r-missing", 207, 128, straggler=1.1, missing=0.02))
    # 6 % step-to-step jitter: three times the default; the 1.1x delay grows towards its limit.
    out.append(_block_scenario("clean/noisy", 800, 64, jitter=0.06))
    out.append(_block_scenario("straggler1.1/noisy", 900, 64, straggler=1.1, jitter=0.06))
    out.append(_block_scenario("straggler1.3/noisy", 901, 64, straggler=1.3, jitter=0.06))
    # The same traces with the trainer's clock.
    for seed in range(3):
        out.append(_block_scenario(f"clean+ts/{seed}", seed, 64, with_ts=True))
        out.append(_block_scenario(f"straggler1.3+ts/{seed}", 100 + seed, 64, straggler=1.3, with_ts=True))
        out.append(_block_scenario(f"straggler1.1+ts/{seed}", 200 + seed, 64, straggler=1.1, with_ts=True))
        out.append(_block_scenario(f"slowdown1.2+ts/{seed}", 300 + seed, 64, slowdown=1.2, with_ts=True))
    out.append(_block_scenario("clean+ts/noisy", 800, 64, jitter=0.06, with_ts=True))
    for seed in range(2):
        out.append(_hang_scenario(f"hang-clean/{seed}", 400 + seed))
        out.append(_hang_scenario(f"hang/{seed}", 500 + seed, dead_rank=13 + seed))
        out.append(_hang_scenario(f"stall-culprit/{seed}", 600 + seed, stuck_rank=40 + seed))
    out.append(_hang_scenario("finished", 700, finish_at=2_000.0))
    return out


@pytest.fixture(scope="module")
def results():
    scored = [(sc, _score(sc)) for sc in _scenarios()]
    _print_table(scored)
    return scored


def _print_table(scored) -> None:
    kinds = ["straggler1.3", "straggler1.1", "slowdown1.2", "straggler1.3+ts", "straggler1.1+ts",
             "slowdown1.2+ts", "hang", "stall-culprit"]
    print("\n| fault | runs | recall | precision | delay median | delay max | limit | culprit named |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for k in kinds:
        rows = [(sc, s) for sc, s in scored if sc.name.split("/")[0] == k]
        tp = sum(s["hit"] for _, s in rows)
        fp = sum(len(s["fps"]) for _, s in rows)
        delays = [s["delay"] for _, s in rows if s["delay"] is not None]
        unit = "s" if k.startswith(("hang", "stall")) else " steps"
        culprits = [s["culprit"] for _, s in rows if s["culprit"] is not None]
        print(f"| {k} | {len(rows)} | {tp / len(rows):.2f} | {tp / max(1, tp + fp):.2f} | "
              f"{np.median(delays):.1f}{unit} | {max(delays):.1f}{unit} | "
              f"{max(sc.limit for sc, _ in rows):.0f}{unit} | "
              f"{(f'{sum(culprits)}/{len(culprits)}') if culprits else '-'} |")
    clean = [(sc, s) for sc, s in scored if sc.kind is None]
    print(f"| clean runs (block + block+ts + hang + finished) | {len(clean)} | - | - | - | - | - | - |")
    print(f"\nwarning-or-above findings on clean runs: {sum(len(s['fps']) for _, s in clean)}")


def test_clean_runs_raise_no_warning_or_above(results):
    for sc, s in results:
        if sc.kind is None:
            assert s["fps"] == [], sc.name


def test_no_false_alarms_in_fault_runs(results):
    for sc, s in results:
        assert s["fps"] == [], (sc.name, s["fps"])


@pytest.mark.parametrize("kind", ["straggler1.3", "straggler1.1", "slowdown1.2", "straggler1.3+ts",
                                  "straggler1.1+ts", "slowdown1.2+ts", "hang", "stall-culprit"])
def test_every_fault_is_found_within_its_limit(results, kind):
    rows = [(sc, s) for sc, s in results if sc.name.split("/")[0] == kind]
    assert rows
    for sc, s in rows:
        assert s["hit"], sc.name
        assert 0 <= s["delay"] <= sc.limit, (sc.name, s["delay"], sc.limit)


def test_stragglers_are_named_at_once(results):
    for sc, s in results:
        if sc.kind == "straggler":
            first = next(f for _, f in sc.findings if f.kind == "straggler" and f.status == "firing")
            assert first.ranks == sc.ranks and first.step >= sc.onset, sc.name


def test_stragglers_are_named_with_their_magnitude(results):
    for sc, s in results:
        if sc.kind == "straggler":
            first = next(f for _, f in sc.findings if f.kind == "straggler" and f.status == "firing")
            factor = float(sc.name.split("/")[0].removeprefix("straggler").removesuffix("+ts"))
            assert first.ranks == sc.ranks
            assert first.evidence["ratio"] == pytest.approx(factor, rel=0.06), sc.name


def test_with_the_trainer_clock_the_first_finding_is_info_and_the_page_waits_min_duration_s(results):
    for sc, s in results:
        if "+ts/" not in sc.name or sc.kind is None:
            continue
        mine = [f for _, f in sc.findings if f.kind == sc.kind and f.status == "firing" and f.ranks == sc.ranks]
        assert mine[0].severity == "info", sc.name
        page = next(f for f in mine if f.severity != "info")
        lasted = page.evidence["lasted_s"] if sc.kind == "straggler" else page.evidence["slow_for_s"]
        assert lasted >= page.evidence["min_duration_s"], sc.name
        assert page.onset_step == mine[0].onset_step, sc.name


def test_stall_names_the_culprit_from_heartbeats(results):
    for sc, s in results:
        if sc.kind == "stall":
            assert s["culprit"] is True, sc.name
