"""Replay probes in the service: stored requests, the trainer's reports, the verdict.

A probe is a row of the store's ``probes`` table (:mod:`healthsvc.store.probes`): who is
suspected, whom to compare it with, which step's batch to replay, and the reports so far (rank ->
gradient norm). Once both ranks reported,
:func:`healthsvc_detectors.offline.replay.judge_replay` decides and the suspect's host is named.
"""
from __future__ import annotations

import math
from typing import Any, TYPE_CHECKING

from healthsvc_detectors import kinds as kind_table
from healthsvc_detectors.offline.replay import judge_replay
from healthsvc.errors import Conflict, InvalidInput, NotFound
from healthsvc.limits import INT64_MAX
from healthsvc.store.probes import NoProbe, ProbeRow

if TYPE_CHECKING:  # pragma: no cover
    from healthsvc.context import ServiceContext


def _finding(ctx: ServiceContext, run_id: str, finding_id: int):
    for sf in ctx.findings.query(run_id, limit=1_000_000):
        if sf.id == finding_id:
            return sf.finding
    raise NotFound(f"run {run_id!r} has no finding {finding_id}", loc=("body", "finding_id"))


def request_probe(ctx: ServiceContext, run_id: str, suspect: int | None, healthy: int | None, step: int | None,
                  finding_id: int | None, reason: str | None) -> dict[str, Any]:
    """Store a probe request (validated against the run) and return it."""
    store = ctx.store
    if not store.reads.run_exists(run_id):
        raise NotFound(f"run {run_id!r} does not exist", loc=("path", "run_id"))
    blamed: tuple[int, ...] = ()
    if finding_id is not None:
        finding = _finding(ctx, run_id, finding_id)
        blamed = finding.ranks
        step = finding.step if step is None else step
        if suspect is None:
            if not blamed:
                raise InvalidInput(f"finding {finding_id} blames no rank: give suspect_rank",
                                   loc=("body", "suspect_rank"))
            suspect = blamed[0]
    if suspect is None:
        raise InvalidInput("give suspect_rank (or finding_id of a finding that blames a rank)",
                           loc=("body", "suspect_rank"))
    st = store.reads.run_view(run_id)
    seen = [] if st is None else list(st.ranks)
    if healthy is None:
        healthy = next((r for r in seen if r != suspect and r not in blamed), None)
        if healthy is None:
            raise Conflict(f"run {run_id!r} has no other rank to compare rank {suspect} with",
                           loc=("body", "healthy_rank"))
    if healthy == suspect:
        raise InvalidInput("healthy_rank must differ from suspect_rank", loc=("body", "healthy_rank"))
    if step is None:
        step = max(0, st.max_step) if st is not None else 0
    probe_id = store.probes.submit(run_id, suspect, healthy, step, finding_id, reason,
                                  ctx.clock()).result()
    return get_probe(ctx, run_id, probe_id)




def auto_probe_listener(ctx: ServiceContext):
    """A findings listener (writer thread, after commit) that asks for a probe of the first rank a
    new warning or critical finding of a kind a probe can check (``Kind.probe``) blames, unless that rank already has
    one pending. It only queues a write: it never waits on the writer it runs on."""

    def on_findings(stored: list) -> None:
        for sf in stored:
            f = sf.finding
            if (not (kind_table.known(f.kind) and kind_table.kind(f.kind).probe) or f.status != "firing" or not f.ranks
                    or f.severity not in ("warning", "critical")):
                continue
            st = ctx.store.reads.run_view(sf.run_id)
            seen = [] if st is None else list(st.ranks)
            healthy = next((r for r in seen if r not in f.ranks), None)
            if healthy is not None:
                ctx.store.probes.submit(sf.run_id, int(f.ranks[0]), healthy, int(f.step), sf.id,
                                       f"asked for by the service: {f.kind} (finding {sf.id})",
                                       ctx.clock(), unless_pending=True)
    return on_findings


def _row_to_probe(ctx: ServiceContext, row: ProbeRow) -> dict[str, Any]:
    pid, run_id, suspect, healthy, step = row.id, row.run_id, row.suspect_rank, row.healthy_rank, row.step
    finding_id, reason, created_at, verdict = row.finding_id, row.reason, row.created_at, row.verdict
    got = {int(k): v for k, v in row.reports.items()}
    host = ctx.store.reads.hosts(run_id).get(suspect)
    out = {"id": pid, "run_id": run_id, "status": "done" if verdict else "pending",
           "suspect_rank": suspect, "healthy_rank": healthy, "step": step, "finding_id": finding_id,
           "reason": reason, "created_at": created_at,
           "reports": {str(k): (v if isinstance(v, float) else str(v)) for k, v in got.items()},
           "verdict": verdict, "host": host, "explanation": None}
    if verdict:
        a, b = float(got[suspect]), float(got[healthy])
        where = f" (host {host})" if host else ""
        if verdict == "hardware":
            out["explanation"] = (
                f"On the same batch (step {step}) rank {suspect}{where} computed a gradient norm of "
                f"{a:.9g} and healthy rank {healthy} {b:.9g}: the suspect's hardware (its compute, "
                f"or the state in its memory) is to blame; drain{where or ' it'}.")
        else:
            out["explanation"] = (
                f"On the same batch (step {step}) rank {suspect} and healthy rank {healthy} computed "
                f"the same gradient norm ({a:.9g}): the hardware computes as its peer does, so the "
                f"data of that step or the code is to blame.")
    return out


def get_probe(ctx: ServiceContext, run_id: str, probe_id: int) -> dict[str, Any]:
    row = ctx.store.probes.get(run_id, probe_id)
    if row is None:
        raise NotFound(f"run {run_id!r} has no probe {probe_id}", loc=("path", "probe_id"))
    return _row_to_probe(ctx, row)


def list_probes(ctx: ServiceContext, run_id: str) -> list[dict[str, Any]]:
    return [_row_to_probe(ctx, r) for r in ctx.store.probes.of_run(run_id)]


def next_probe(ctx: ServiceContext, run_id: str, after: int, upto_step: int | None = None) -> dict[str, Any] | None:
    """The oldest pending probe with an id above ``after`` (what the trainer has not taken yet)
    and, with ``upto_step``, a step the trainer has reached."""
    row = ctx.store.probes.next_pending(run_id, after, INT64_MAX if upto_step is None else upto_step)
    return None if row is None else _row_to_probe(ctx, row)


def report(ctx: ServiceContext, run_id: str, probe_id: int, rank: int, grad_norm: float) -> dict[str, Any]:
    """Store one rank's measurement; with both in, the verdict."""

    def decide(row: ProbeRow) -> tuple[dict[str, Any], str | None] | None:
        suspect, healthy, verdict = row.suspect_rank, row.healthy_rank, row.verdict
        if rank not in (suspect, healthy):
            raise InvalidInput(f"rank {rank} is neither the probe's suspect ({suspect}) nor its "
                               f"healthy rank ({healthy})", loc=("body", "rank"))
        got = dict(row.reports)
        if verdict is not None:
            if _same(got.get(str(rank)), grad_norm):
                return None  # a retried report
            raise Conflict(f"probe {probe_id} is already decided ({verdict}); rank {rank} reported "
                           f"{got.get(str(rank))!r} before", loc=("body", "grad_norm"))
        got[str(rank)] = _storable(grad_norm)
        if str(suspect) in got and str(healthy) in got:
            verdict = judge_replay(float(got[str(suspect)]), float(got[str(healthy)]))
        return got, verdict
    try:
        ctx.store.probes.submit_report(run_id, probe_id, decide).result()
    except NoProbe:
        raise NotFound(f"run {run_id!r} has no probe {probe_id}", loc=("path", "probe_id")) from None
    return get_probe(ctx, run_id, probe_id)


def _storable(x: float) -> float | str:
    # orjson writes NaN as null: keep non-finite values as their strings.
    return x if math.isfinite(x) else ("NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity"))


def _same(a: Any, b: float) -> bool:
    if a is None:
        return False
    a = float(a)
    return a == b or (math.isnan(a) and math.isnan(b))
