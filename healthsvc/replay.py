"""A recorded run: export what a service holds about a run to a directory, and push it into another
service through the public API, in its original order and at its original pace.

    # a newcomer, no cluster: a local service with the committed recording loaded
    svc = connect_or_serve("notebooks/data")        # or HEALTHSVC_URL, loaded there if missing
    svc.url, svc.run_id

The directory holds ``manifest.json`` (run id, run config, what was launched and when, the faults
injected: the ground truth), ``metrics.arrow`` (every attempt's records, an Arrow IPC file: nulls
are missing, NaN is NaN; with the trainer's ``ts``), ``checkpoints.json`` and ``events.json``.

Replaying sends, in time order: the run config (``PUT``), each step's records of all ranks as one
columnar batch (consecutive steps within ``batch_s`` of each other share a batch; a batch never
splits a step, so repeated steps open a new attempt exactly as they did), checkpoints, events and
``finish`` at the end of each launch that finished. Times are the trainer's clock (``ts``) for
records and the recording service's clock for the rest: one machine, one clock. With ``speed=1``
(the default) the service sees the run at its real pace, so its wall-clock views (timeline,
goodput, advice) match the original; a higher speed compresses wall time but not the step times
the records carry, which skews goodput and the MTBF. The detectors run live in the new service.
"""
from __future__ import annotations

import atexit
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, TextIO

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.ipc as paipc

from healthsvc.encode import float_column_to_json
from healthsvc.local_server import LocalServer

MANIFEST = "manifest.json"
METRICS = "metrics.arrow"
CHECKPOINTS = "checkpoints.json"
EVENTS = "events.json"
_KEYS = ("step", "rank", "attempt")


# ---- export ------------------------------------------------------------------------------------------

def export_run(url: str, run_id: str, out_dir: str | os.PathLike, manifest: dict[str, Any]) -> Path:
    """Write the run's history (all attempts), checkpoints and events, and ``manifest``, to ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with httpx.Client(base_url=url, timeout=60) as http:
        summary = _ok(http.get(f"/v1/runs/{run_id}")).json()
        tables = []
        for a in summary["attempts"]:
            body = _ok(http.get(f"/v1/runs/{run_id}/metrics", params={"format": "arrow", "attempt": a["attempt"]})).content
            tables.append(paipc.open_stream(pa.py_buffer(body)).read_all())
        checkpoints = _ok(http.get(f"/v1/runs/{run_id}/checkpoints")).json()
        events = _ok(http.get(f"/v1/runs/{run_id}/events")).json()
    table = pa.concat_tables(tables, promote_options="default")
    if "ts" in table.column_names:  # arrival order, as the ranks sent them
        table = table.take(np.argsort(table.column("ts").to_numpy(zero_copy_only=False), kind="stable"))
    options = paipc.IpcWriteOptions(compression="zstd")
    with paipc.new_file(out / METRICS, table.schema, options=options) as writer:
        writer.write_table(table)
    (out / CHECKPOINTS).write_text(json.dumps(checkpoints, indent=1) + "\n")
    (out / EVENTS).write_text(json.dumps(events, indent=1) + "\n")
    (out / MANIFEST).write_text(json.dumps({"run_id": run_id, "config": summary["config"], **manifest},
                                           indent=1) + "\n")
    return out


def _ok(response: httpx.Response) -> httpx.Response:
    if response.status_code >= 300:
        raise RuntimeError(f"{response.request.method} {response.request.url}: {response.status_code} {response.text[:500]}")
    return response


# ---- the recording -----------------------------------------------------------------------------------

@dataclass
class RecordedRun:
    """A recorded run loaded from its directory. ``faults`` is the ground truth the recorder injected."""

    path: Path
    manifest: dict[str, Any]
    metrics: pa.Table
    checkpoints: list[dict[str, Any]]
    events: list[dict[str, Any]]

    @classmethod
    def load(cls, path: str | os.PathLike) -> "RecordedRun":
        p = Path(path)
        with paipc.open_file(p / METRICS) as reader:
            table = reader.read_all()
        return cls(path=p, manifest=json.loads((p / MANIFEST).read_text()), metrics=table,
                   checkpoints=json.loads((p / CHECKPOINTS).read_text()),
                   events=json.loads((p / EVENTS).read_text()))

    @property
    def run_id(self) -> str:
        return self.manifest["run_id"]

    @property
    def faults(self) -> list[dict[str, Any]]:
        return [launch["fault"] for launch in self.manifest.get("launches", []) if launch.get("fault")]

    def corruption_onset(self) -> int | None:
        """The first corrupted update the recorder injected (ground truth), if any."""
        steps = [f["step"] for f in self.faults if f["kind"] == "corrupt_grad"]
        return min(steps) if steps else None

    def ground_truth_probe(self, step: int, uri: str) -> bool:
        """A probe that knows the answer: the checkpoint of ``step`` is clean iff ``step`` is before
        the injected corruption (a checkpoint at c holds the update of step c). The recording's
        checkpoint files are gone; a real probe would load ``uri`` and test it."""
        onset = self.corruption_onset()
        return onset is None or step < onset

    def actions(self, batch_s: float = 0.25) -> list["Action"]:
        """Everything to send, in time order (see the module docstring)."""
        out = [Action(t, "metrics", cols) for t, cols in _metric_batches(self.metrics, batch_s)]
        for c in self.checkpoints:
            body = {k: c[k] for k in ("step", "uri", "duration_s", "bytes") if c.get(k) is not None}
            out.append(Action(c["created_at"], "checkpoint", body))
        for e in self.events:
            body = {"kind": e["kind"], "step": e["step"], "data": e.get("data") or {}}
            out.append(Action(e["ts"], "event", body))
        for launch in self.manifest.get("launches", []):
            if launch.get("finished"):
                out.append(Action(launch["finished_at"], "finish", {}))
        # Stable: a record batch sent at the same instant as an event goes first, as the client's
        # queue guarantees (an event never overtakes a held-back record).
        order = {"metrics": 0, "checkpoint": 1, "event": 2, "finish": 3}
        return sorted(out, key=lambda a: (a.at_s, order[a.kind]))


@dataclass(order=True)
class Action:
    at_s: float
    kind: str = field(compare=False)
    body: Any = field(compare=False, repr=False)


def _metric_batches(table: pa.Table, batch_s: float) -> Iterator[tuple[float, dict[str, list]]]:
    """Columnar batches of whole steps, each sent when its newest record was (trainer ``ts``)."""
    if table.num_rows == 0:
        return
    steps = table.column("step").to_numpy()
    attempts = table.column("attempt").to_numpy()
    if "ts" in table.column_names:
        ts = table.column("ts").to_numpy(zero_copy_only=False).astype(np.float64)
        ts = np.where(np.isnan(ts), np.nanmax(ts), ts)
    else:  # no trainer clock: one step every 50 ms, in recorded order
        ts = np.arange(table.num_rows) * 0.05
    # One unit per (attempt, step); send it when its last rank finished the step.
    unit_key = attempts.astype(np.int64) * (1 << 32) + steps
    keys, inverse = np.unique(unit_key, return_inverse=True)
    unit_time = np.full(len(keys), -np.inf)
    np.maximum.at(unit_time, inverse, ts)
    order = np.argsort(unit_time, kind="stable")
    names = [n for n in table.column_names if n not in ("attempt",)]
    arrays = {n: table.column(n) for n in names}
    numeric = {n: (arrays[n].to_numpy(zero_copy_only=False), arrays[n].is_null().to_numpy(zero_copy_only=False))
               for n in names if n not in ("step", "rank", "host")}
    hosts = arrays["host"].to_pylist() if "host" in arrays else None

    group: list[int] = []
    group_attempt = None
    start_t = 0.0

    def emit(units: list[int]) -> tuple[float, dict[str, list]]:
        rows = np.flatnonzero(np.isin(inverse, units))
        rows = rows[np.lexsort((table.column("rank").to_numpy()[rows], steps[rows]))]
        cols: dict[str, list] = {"step": steps[rows].tolist(), "rank": table.column("rank").to_numpy()[rows].tolist()}
        if hosts is not None:
            cols["host"] = [hosts[i] for i in rows]
        for n, (values, missing) in numeric.items():
            if not missing[rows].all():
                cols[n] = float_column_to_json(values[rows].astype(np.float64), ~missing[rows])
        return float(unit_time[units[-1]]), cols

    for u in order:
        a = int(keys[u] >> 32)
        if group and (a != group_attempt or unit_time[u] - start_t > batch_s):
            yield emit(group)
            group = []
        if not group:
            group_attempt, start_t = a, unit_time[u]
        group.append(int(u))
    if group:
        yield emit(group)


# ---- replay ------------------------------------------------------------------------------------------

def replay(recorded: RecordedRun, url: str, *, run_id: str | None = None, speed: float = 1.0,
           batch_s: float = 0.25, settle_s: float = 2.0, until_s: float | None = None,
           progress: TextIO | None = None) -> str:
    """Push ``recorded`` into the service at ``url`` under ``run_id`` (default: the recorded id).

    Blocks for the run's duration / ``speed``; returns the run id. ``settle_s``: time left at the
    end for the service's monitor to finish its detections. ``until_s``: stop before the first
    action at or after this time (the recording's clock): the run as it stood then.
    ``progress``: a stream to draw a progress bar on while it replays (:class:`ReplayProgress`).
    """
    run_id = run_id or recorded.run_id
    actions = [a for a in recorded.actions(batch_s) if until_s is None or a.at_s < until_s]
    bar = ReplayProgress(actions, speed, progress, run_id) if progress is not None else None
    with httpx.Client(base_url=url, timeout=60) as http:
        config = {k: v for k, v in (recorded.manifest.get("config") or {}).items() if v is not None}
        _ok(http.put(f"/v1/runs/{run_id}", json=config))
        t0_wall, t0_run = time.monotonic(), actions[0].at_s if actions else 0.0
        for action in actions:
            delay = (action.at_s - t0_run) / speed - (time.monotonic() - t0_wall)
            if delay > 0:
                time.sleep(delay)
            path = {"metrics": "metrics", "checkpoint": "checkpoints", "event": "events", "finish": "finish"}[action.kind]
            body = {"columns": action.body} if action.kind == "metrics" else action.body
            _ok(http.post(f"/v1/runs/{run_id}/{path}", content=json.dumps(body),
                          headers={"content-type": "application/json"}))
            if bar is not None:
                bar.sent(action)
        _settle(http, run_id, settle_s)
    if bar is not None:
        bar.done()
    return run_id


class ReplayProgress:
    """One text line redrawn in place while a recording replays (a notebook's output and a
    terminal both honour the carriage return)::

        replaying run-7  [############............]  52%  steps 124/239  records 496/956  26 s of 50 s

    Standard library only, so a notebook needs nothing more than the service's own packages.
    Redrawn at most every ``every_s`` seconds (a notebook keeps every redraw in its output), and
    once more, with a newline, at the end."""

    WIDTH = 24

    def __init__(self, actions: list[Action], speed: float, out: TextIO, run_id: str, every_s: float = 2.0) -> None:
        batches = [a.body for a in actions if a.kind == "metrics"]
        self.total_records = sum(len(b["step"]) for b in batches)
        # A batch holds whole steps of one attempt: its distinct steps are (attempt, step) units.
        self.total_steps = sum(len(set(b["step"])) for b in batches)
        self.total_s = (actions[-1].at_s - actions[0].at_s) / speed if actions else 0.0
        self.out, self.run_id, self.every_s = out, run_id, every_s
        self.records = self.steps = 0
        self.t0 = time.monotonic()
        self.last_draw = float("-inf")

    def sent(self, action: Action) -> None:
        if action.kind == "metrics":
            self.records += len(action.body["step"])
            self.steps += len(set(action.body["step"]))
        if time.monotonic() - self.last_draw >= self.every_s:
            self._draw()

    def done(self) -> None:
        self._draw(end="\n")

    def _draw(self, end: str = "") -> None:
        self.last_draw = time.monotonic()
        share = self.records / self.total_records if self.total_records else 1.0
        filled = round(share * self.WIDTH)
        self.out.write(f"\rreplaying {self.run_id}  [{'#' * filled}{'.' * (self.WIDTH - filled)}] {share:4.0%}  "
                       f"steps {self.steps}/{self.total_steps}  records {self.records}/{self.total_records}  "
                       f"{self.last_draw - self.t0:.0f} s of {self.total_s:.0f} s{end}")
        self.out.flush()


def _settle(http: httpx.Client, run_id: str, settle_s: float) -> None:
    """Wait until the run's findings stop changing (at most ``settle_s``)."""
    deadline = time.monotonic() + settle_s
    last = None
    while time.monotonic() < deadline:
        n = len(_ok(http.get(f"/v1/runs/{run_id}/findings", params={"limit": 100_000})).json())
        if n == last:
            return
        last = n
        time.sleep(0.5)


@dataclass
class LoadedService:
    """A service holding the recorded run: ``url``, ``run_id``, the ``recorded`` run; ``stop()``
    stops the service if this object started it."""

    url: str
    run_id: str
    recorded: RecordedRun
    server: LocalServer | None = None
    _tmp: Any = None

    def as_of(self, event_kind: str = "rollback", *, speed: float = 8.0) -> str:
        """A second run in the same service: the recording up to (not including) its first
        ``event_kind`` event, replayed ``speed`` times faster; returns its run id. The run as the
        on-call engineer saw it then: e.g. ``GET /rollback`` answers for the incident, not for
        the recovered run. Replayed once; later calls reuse it."""
        at = [e["ts"] for e in self.recorded.events if e["kind"] == event_kind]
        if not at:
            raise ValueError(f"the recording has no {event_kind!r} event")
        run_id = f"{self.run_id}-before-{event_kind}"
        if not _has_run(self.url, run_id):
            replay(self.recorded, self.url, run_id=run_id, speed=speed, until_s=min(at))
        return run_id

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None


def _has_run(url: str, run_id: str) -> bool:
    return httpx.get(f"{url.rstrip('/')}/v1/runs/{run_id}", timeout=30).status_code == 200


def connect_or_serve(data_dir: str | os.PathLike, *, url: str | None = None, speed: float = 1.0,
                     progress: TextIO | bool = True) -> LoadedService:
    """The service a notebook reads from, with the recorded run in it.

    ``url`` (default ``HEALTHSVC_URL``; ``""`` forces a local service): use that service, replaying the recording into it first
    if it does not hold the run. Neither set: start a local service on a temporary database and
    replay the recording into it (takes the run's duration / ``speed``), with a progress bar on
    ``progress`` (``True``, the default: standard output, i.e. the notebook cell's; ``False``: none).
    """
    # sys.stdout looked up now, not at import: a kernel replaces it after this module is imported
    out = progress if not isinstance(progress, bool) else sys.stdout if progress else None
    recorded = RecordedRun.load(data_dir)
    if url is None:
        url = os.environ.get("HEALTHSVC_URL")
    if url:
        url = url.rstrip("/")
        if not _has_run(url, recorded.run_id):
            replay(recorded, url, speed=speed, progress=out)
        return LoadedService(url, recorded.run_id, recorded)
    tmp = tempfile.TemporaryDirectory(prefix="healthsvc-replay-")
    server = LocalServer(Path(tmp.name) / "healthsvc.db").start()
    try:
        replay(recorded, server.url, speed=speed, progress=out)
    except BaseException:
        server.stop()
        tmp.cleanup()
        raise
    loaded = LoadedService(server.url, recorded.run_id, recorded, server, tmp)
    atexit.register(loaded.stop)  # the kernel exits: no service left running on its own
    return loaded


def main(argv: list[str] | None = None) -> int:
    import argparse
    parser = argparse.ArgumentParser(description="Replay a recorded run into a healthsvc service.")
    parser.add_argument("data_dir", help="a directory written by examples/record_run.py (e.g. notebooks/data)")
    parser.add_argument("--url", default=os.environ.get("HEALTHSVC_URL", "http://127.0.0.1:8080"))
    parser.add_argument("--run-id", default=None, help="store it under this id (default: the recorded one)")
    parser.add_argument("--speed", type=float, default=1.0, help="replay faster than real time (skews goodput)")
    args = parser.parse_args(argv)
    recorded = RecordedRun.load(args.data_dir)
    t0 = time.monotonic()
    run_id = replay(recorded, args.url, run_id=args.run_id, speed=args.speed, progress=sys.stderr)
    print(f"replayed {recorded.metrics.num_rows} records of run {run_id!r} into {args.url} in "
          f"{time.monotonic() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
