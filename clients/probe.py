"""The trainer's side of a replay probe: ask the service for one, report what it measured.

When a rank is suspected (``replica_mismatch``, ``rank_outlier``, a per-rank spike), someone (or
an automation) asks for a probe with ``POST /v1/runs/{run_id}/probes``. The trainer polls
``GET /v1/runs/{run_id}/probes/next`` every few steps; the probe names a suspect rank, a healthy
rank and a step. Both ranks recompute one step's gradient norm on the same fixed batch (the one
the suspect trained on at that step) and report it with :func:`report_probe`. The service
compares: the same number on both says the data or the code is to blame; different numbers say
the suspect's hardware (its compute or the state in its memory), and the answer names its host.

``examples/train.py`` (``answer_probes``) shows the whole exchange: rank 0 polls and broadcasts
the probe to every rank, so all ranks take part at the same step.

Standard library only; never raises into the training loop.
"""
from __future__ import annotations

import json
from typing import Any

from healthsvc_client.transport import Request

_last_seen: dict[int, int] = {}   # id(run) -> newest probe id this process has taken


def next_probe(run: Any, upto_step: int | None = None, timeout_s: float | None = None) -> dict[str, Any] | None:
    """The oldest probe of the run that this process has not taken yet (with ``upto_step``: of a
    step the trainer has reached), or None (none waiting, offline, disabled, or the service
    unreachable). Runs on the calling thread (one short GET)."""
    transport = getattr(run, "_transport", None)
    if transport is None:
        return None
    after = _last_seen.get(id(run), 0)
    try:
        resp = transport.request(
            Request("GET", f"{run._base_path}/probes/next?after={after}"
                    + ("" if upto_step is None else f"&upto_step={int(upto_step)}"), b"",
                    {"Accept": "application/json"}),
            run.timeout_s if timeout_s is None else timeout_s)
        if resp.status != 200:
            if resp.status != 204:
                run._problem("probe", f"GET probes/next answered {resp.status}: {resp.body[:200]!r}")
            return None
        probe = json.loads(resp.body)
    except Exception as exc:
        run._problem("probe", f"GET probes/next failed: {exc!r}")
        return None
    if not isinstance(probe, dict) or not isinstance(probe.get("id"), int):
        return None
    _last_seen[id(run)] = max(after, probe["id"])
    return probe


def report_probe(run: Any, probe_id: int, rank: int, grad_norm: float) -> None:
    """Queue this rank's measurement for probe ``probe_id`` (sent by the sender thread)."""
    try:
        run._enqueue_control("POST", f"/probes/{int(probe_id)}/reports",
                             {"rank": int(rank), "grad_norm": float(grad_norm)})
    except Exception as exc:
        run._problem("probe", f"report_probe() ignored a call: {exc!r}")
