"""The analyst's read API: a run as pandas DataFrames in one line.

from healthsvc_client import read
    df = read.metrics("llama-70b-r3")                       # long: step, rank, attempt, host, loss, ...
    wide = read.metrics("llama-70b-r3", fields=["loss"], layout="wide")   # step x (field, rank)

Every function takes ``url=`` (default: the ``HEALTHSVC_URL`` environment variable, else
http://127.0.0.1:8080); :class:`Reader` holds one base URL for many calls. HTTP is the standard
library's; pandas (and pyarrow, when installed) are imported inside the functions, so
``import healthsvc_client`` and ``import healthsvc_client.read`` stay free of them — the trainer never pays for the
analyst's stack.

Column types of :func:`metrics` (docs/analysis.md has the reasoning):

- ``step``, ``rank``, ``attempt``: ``int64``; ``host``: pandas ``str`` (missing: NA);
- every metric: ``double[pyarrow]`` (``pd.ArrowDtype(pa.float64())``). It keeps the two absences
  apart: a value the trainer did not report is NA (``isna()`` is True), a NaN the trainer reported
  is NaN (``isna()`` is False, ``s != s`` is True), ±inf stay ±inf. pandas' ``Float64`` cannot:
  it turns NaN into NA on conversion and in arithmetic. ``s.to_numpy(float, na_value=np.nan)``
  gives a plain array when the distinction no longer matters (plotting).

Without pyarrow the history comes as CSV and metric columns are ``Float64`` built with an explicit
mask (NaN unmasked, missing masked); NaN and NA are told apart on arrival but pandas' arithmetic
on ``Float64`` may merge them later.
"""
from __future__ import annotations

import io
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from typing import TYPE_CHECKING, Any, Callable, Iterable, Literal, Sequence

from healthsvc_client.auth import auth_headers
from healthsvc_client.wire import LABEL_FIELDS

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

DEFAULT_URL = "http://127.0.0.1:8080"
KEY_COLUMNS = ("step", "rank", "attempt")
ARROW_MEDIA_TYPE = "application/vnd.apache.arrow.stream"


class ReadError(Exception):
    """The service answered with an error (``status`` and its ``detail``) or could not be reached."""

    def __init__(self, message: str, *, status: int | None = None, detail: Any = None) -> None:
        super().__init__(message)
        self.status = status
        self.detail = detail


ANALYSIS_EXTRA = "pip install 'healthsvc-client[analysis]'"


def _pandas() -> Any:
    """pandas, or an ImportError that says which extra brings it: the client installs without
    the analyst's stack (a training job never needs it), so a bare ``No module named 'pandas'``
    would not tell the reader what to do."""
    try:
        import pandas
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            f"{__name__} returns pandas DataFrames; {exc.name} is missing, the client installs without the "
            f"analysis stack: {ANALYSIS_EXTRA}", name=exc.name) from exc
    return pandas


def _has_pyarrow() -> bool:
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        return False
    return True


def _query(params: dict[str, Any]) -> str:
    clean = {}
    for key, value in params.items():
        if value is None:
            continue
        if isinstance(value, bool):
            value = "true" if value else "false"
        elif isinstance(value, (list, tuple, set, frozenset)):
            value = ",".join(str(v) for v in (sorted(value) if isinstance(value, (set, frozenset)) else value))
        clean[key] = value
    return ("?" + urllib.parse.urlencode(clean)) if clean else ""


class Reader:
    """Read-only access to one healthsvc service.

    Arguments: ``url`` (default ``HEALTHSVC_URL``, else http://127.0.0.1:8080), ``timeout_s`` per
    request. Example::

        r = Reader("http://healthsvc:8080")
        r.metrics("exp-42", steps=(1000, 2000), ranks=[0, 3], fields=["loss", "grad_norm"])
    """

    def __init__(self, url: str | None = None, *, timeout_s: float = 60.0) -> None:
        self.url = (url or os.environ.get("HEALTHSVC_URL") or DEFAULT_URL).rstrip("/")
        self.timeout_s = timeout_s

    def __repr__(self) -> str:
        return f"Reader(url={self.url!r})"

    # ---- HTTP ------------------------------------------------------------------------------------

    def _request(self, method: str, path: str, params: dict[str, Any] | None = None,
                 body: Any = None) -> tuple[bytes, str]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path + _query(params or {}), data=data, method=method,
                                     headers={**auth_headers(), **({"content-type": "application/json"} if data else {})})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return resp.read(), resp.headers.get("content-type", "")
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                detail = json.loads(raw).get("detail")
            except (ValueError, AttributeError):
                detail = raw.decode(errors="replace")
            first = detail[0] if isinstance(detail, list) and detail and isinstance(detail[0], dict) else {}
            msg = first.get("msg") or detail
            raise ReadError(f"{method} {path}: HTTP {exc.code}: {msg}", status=exc.code, detail=detail) from None
        except (urllib.error.URLError, OSError) as exc:
            raise ReadError(f"{method} {self.url}{path}: cannot reach the service ({exc}); "
                            f"is it running? (set HEALTHSVC_URL or pass url=)") from None

    def get_json(self, path: str, **params: Any) -> Any:
        """GET ``path`` (e.g. ``/v1/runs``) and decode the JSON answer."""
        return json.loads(self._request("GET", path, params)[0])

    def post_json(self, path: str, body: Any) -> Any:
        return json.loads(self._request("POST", path, None, body)[0] or b"null")

    def _run_path(self, run_id: str, tail: str = "") -> str:
        return f"/v1/runs/{urllib.parse.quote(run_id, safe='')}{tail}"

    # ---- runs ------------------------------------------------------------------------------------

    def runs(self) -> "pd.DataFrame":
        """All runs, one row each: run_id, status, attempt, last_step, world_size, ranks_seen, ..."""
        pd = _pandas()
        return pd.DataFrame(self.get_json("/v1/runs"))

    def run(self, run_id: str) -> dict[str, Any]:
        """One run's summary: status, attempts, health, active findings, timeline (a dict)."""
        return self.get_json(self._run_path(run_id))

    # ---- history ---------------------------------------------------------------------------------

    def metrics(self, run_id: str, steps: int | tuple[int | None, int | None] | None = None,
                ranks: Iterable[int] | None = None, fields: Sequence[str] | None = None,
                layout: Literal["long", "wide"] = "long", attempt: int | Literal["all"] | None = None,
                format: Literal["arrow", "csv"] | None = None) -> "pd.DataFrame":
        """A run's per-rank history as a DataFrame.

        ``steps``: one step or an inclusive ``(lo, hi)`` range (either end None = open);
        ``ranks``, ``fields``: subsets (default all); ``attempt``: one attempt's records (default:
        the effective history, the newest attempt winning each step; ``"all"``: every attempt's
        records, sorted by (attempt, step, rank), long layout only); ``format``: the transfer
        (default Arrow when pyarrow is installed, else CSV).

        ``layout="long"``: one row per (step, rank), sorted by (step, rank), columns ``step, rank,
        attempt, [host], <fields>``. ``layout="wide"``: one row per step (index ``step``), columns a
        MultiIndex ``(field, rank)``; a (step, rank) that reported nothing is NA.
        """
        if layout not in ("long", "wide"):
            raise ValueError(f"layout must be 'long' or 'wide', not {layout!r}")
        if attempt == "all":
            if layout != "long":
                raise ValueError("attempt='all' repeats steps: use layout='long'")
            pd = _pandas()
            parts = [self.metrics(run_id, steps, ranks, fields, attempt=a["attempt"], format=format)
                     for a in self.run(run_id).get("attempts", [])]
            return pd.concat(parts, ignore_index=True) if parts else self.metrics(run_id, steps, ranks, fields,
                                                                                  format=format)
        lo = hi = None
        if isinstance(steps, int):
            lo = hi = steps
        elif steps is not None:
            lo, hi = steps
        fmt = format or ("arrow" if _has_pyarrow() else "csv")
        params = {"format": fmt, "step_min": lo, "step_max": hi,
                  "ranks": list(ranks) if ranks is not None else None,
                  "fields": list(fields) if fields is not None else None, "attempt": attempt}
        body, _ = self._request("GET", self._run_path(run_id, "/metrics"), params)
        df = _arrow_to_frame(body) if fmt == "arrow" else _csv_to_frame(body)
        df = df.sort_values(["step", "rank"], kind="stable", ignore_index=True)
        if layout == "wide":
            return to_wide(df)
        return df

    # ---- what the service decided ----------------------------------------------------------------

    def findings(self, run_id: str, **filters: Any) -> "pd.DataFrame":
        """Findings, oldest first. Filters: kind, status, since_step, since, min_severity, limit.

        Columns: id, run_id, attempt, kind, step, ranks (list), hosts, severity, score, metric,
        status, onset_step (Int64, NA when none), evidence (dict), created_at (unix s).
        """
        rows = self.get_json(self._run_path(run_id, "/findings"), **filters)
        return _frame(rows, _FINDING_COLUMNS, nullable_ints=("onset_step",))

    def alerts(self, **filters: Any) -> "pd.DataFrame":
        """Alerts, newest first. Filters: run, kind, status, min_severity, acknowledged, limit."""
        rows = self.get_json("/v1/alerts", **filters)["alerts"]
        return _frame(rows, (), nullable_ints=("onset_step",))

    def checkpoints(self, run_id: str) -> "pd.DataFrame":
        """Registered checkpoints: id, step, uri, attempt, duration_s, bytes, created_at, status, note."""
        return _frame(self.get_json(self._run_path(run_id, "/checkpoints")), _CHECKPOINT_COLUMNS,
                      nullable_ints=("bytes",))

    def events(self, run_id: str) -> "pd.DataFrame":
        """Trainer events (restart, world_size_change, rollback, ...): kind, step, data (dict), ts."""
        return _frame(self.get_json(self._run_path(run_id, "/events")), (), nullable_ints=("step",))

    def heartbeats(self, run_id: str) -> "pd.DataFrame":
        """Each rank's latest heartbeat."""
        return _frame(self.get_json(self._run_path(run_id, "/heartbeats")), ())

    def timeline(self, run_id: str, *, findings: bool = True) -> "pd.DataFrame":
        """The run's timeline entries in time order (docs/economics.md): one row per entry, a
        ``kind`` column (attempt_started, checkpoint, finding, world_size_change, ...), ``at_s``,
        ``step``, ``attempt`` and each kind's own columns (NA where an entry has none)."""
        answer = self.get_json(self._run_path(run_id, "/timeline"), findings=findings)
        return _frame(answer["entries"], ("kind", "at_s", "step", "attempt"),
                      nullable_ints=("step", "attempt", "world_size", "effective_batch_size",
                                     "resumed_from_step", "old_world_size", "new_world_size",
                                     "old_effective_batch_size", "new_effective_batch_size", "onset_step"))

    def rollback(self, run_id: str) -> dict[str, Any]:
        """Where to resume from: checkpoint, onset {step, low, high, ...}, reason, findings, evidence."""
        return self.get_json(self._run_path(run_id, "/rollback"))

    def advice(self, run_id: str, **params: Any) -> dict[str, Any]:
        """Checkpoint interval advice (Young, Daly, current, overheads, warning); params as the API."""
        return self.get_json(self._run_path(run_id, "/advice"), **params)

    def retention(self, run_id: str, **policy: Any) -> dict[str, Any]:
        """The retention plan (keep/delete per checkpoint with reasons); policy as the API's query."""
        return self.get_json(self._run_path(run_id, "/retention"), **policy)

    def goodput(self, run_id: str) -> dict[str, Any]:
        """Wall time split: productive, checkpoint, downtime, recompute, corrupted progress (s)."""
        return self.get_json(self._run_path(run_id, "/goodput"))

    # ---- bisection ---------------------------------------------------------------------------------

    def bisection(self, run_id: str) -> dict[str, Any]:
        """The bisection's state: done, next_probe, last_good, first_bad, probes, reports."""
        return self.get_json(self._run_path(run_id, "/bisection"))

    def bisect(self, run_id: str, probe: Callable[[int, str], bool | tuple[bool, float | None]], *,
               steps: Sequence[int] | None = None, known_good: int | None = None,
               known_bad: int | None = None, max_probes: int = 64) -> dict[str, Any]:
        """Run an active bisection to its end with ``probe(step, uri) -> good`` (or ``(good, value)``).

        Starts a bisection (replacing any earlier one of the run), reports each verdict, and returns
        the final state. The service proposes each checkpoint; see docs/rollback.md.
        """
        body = {k: v for k, v in (("steps", list(steps) if steps is not None else None),
                                  ("known_good", known_good), ("known_bad", known_bad)) if v is not None}
        state = self.post_json(self._run_path(run_id, "/bisection"), body)
        for _ in range(max_probes):
            if state.get("done") or not state.get("next_probe"):
                return state
            nxt = state["next_probe"]
            verdict = probe(nxt["step"], nxt["uri"])
            good, value = verdict if isinstance(verdict, tuple) else (verdict, None)
            report = {"step": nxt["step"], "good": bool(good)}
            if value is not None:
                report["value"] = float(value)
            self.post_json(self._run_path(run_id, "/bisection/reports"), report)
            state = self.bisection(run_id)
        raise ReadError(f"bisection of {run_id!r} not done after {max_probes} probes")


# ---- conversions -----------------------------------------------------------------------------------

_FINDING_COLUMNS = ("id", "run_id", "attempt", "kind", "step", "ranks", "hosts", "severity", "score",
                    "metric", "status", "onset_step", "evidence", "created_at")
_CHECKPOINT_COLUMNS = ("id", "step", "uri", "attempt", "duration_s", "bytes", "created_at", "status", "note")


def _frame(rows: list[dict], columns: Sequence[str], nullable_ints: Sequence[str] = ()) -> "pd.DataFrame":
    """Rows of JSON objects as a DataFrame with ``columns`` first (present even when empty);
    integer columns that may be null become ``Int64``."""
    pd = _pandas()
    df = pd.DataFrame(rows)
    for col in columns:
        if col not in df.columns:
            df[col] = pd.Series(dtype=object)
    df = df[list(columns) + [c for c in df.columns if c not in columns]]
    for col in nullable_ints:
        if col in df.columns:
            df[col] = pd.array([None if v is None or v != v else int(v) for v in df[col]], dtype="Int64")
    return df


_STRING_COLUMNS = frozenset({"host", *LABEL_FIELDS})   # the others are float64


def _arrow_to_frame(body: bytes) -> "pd.DataFrame":
    pd = _pandas()
    import pyarrow as pa
    import pyarrow.ipc as paipc

    table = paipc.open_stream(pa.py_buffer(body)).read_all()
    cols: dict[str, Any] = {}
    for name, column in zip(table.column_names, table.columns):
        if name in KEY_COLUMNS:
            cols[name] = column.to_numpy()
        elif name in _STRING_COLUMNS:
            cols[name] = pd.array(column.to_pylist() if column.null_count else column.to_numpy(zero_copy_only=False),
                                  dtype="str")
        else:
            # Zero-copy wrap: nulls stay null (missing), NaN stays NaN.
            cols[name] = pd.array(column.combine_chunks() if column.num_chunks != 1 else column.chunk(0),
                                  dtype=pd.ArrowDtype(pa.float64()))
    return pd.DataFrame(cols, copy=False) if cols else pd.DataFrame(columns=list(table.column_names))


def _csv_to_frame(body: bytes) -> "pd.DataFrame":
    """CSV without pyarrow: ``nan``/``inf``/``-inf`` are values, an empty field is missing."""
    pd = _pandas()   # first: it brings numpy, and says what to install when missing
    import numpy as np

    raw = pd.read_csv(io.BytesIO(body), dtype=str, keep_default_na=False, na_filter=False)
    cols: dict[str, Any] = {}
    for name in raw.columns:
        text = raw[name].to_numpy(dtype=object)
        if name in KEY_COLUMNS:
            cols[name] = text.astype(np.int64)
        elif name in _STRING_COLUMNS:
            cols[name] = pd.array([t if t != "" else None for t in text], dtype="str")
        else:
            missing = text == ""
            values = np.where(missing, "0", text).astype(np.float64)
            cols[name] = pd.arrays.FloatingArray(values, missing)
    return pd.DataFrame(cols)


def to_wide(df: "pd.DataFrame") -> "pd.DataFrame":
    """Long (one row per step and rank) to wide: index ``step``, columns ``(field, rank)``.

    Expects one row per (step, rank), as the effective history or one attempt gives.
    """
    value_cols = [c for c in df.columns if c not in ("step", "rank", "attempt", "host")]
    wide = df.set_index(["step", "rank"])[value_cols].unstack("rank")
    wide.columns = wide.columns.set_names(["field", "rank"])
    return wide


# ---- module-level shortcuts: one line from a notebook ----------------------------------------------

def _reader(url: str | None) -> Reader:
    return Reader(url)


def runs(*, url: str | None = None) -> "pd.DataFrame":
    return _reader(url).runs()


def run(run_id: str, *, url: str | None = None) -> dict[str, Any]:
    return _reader(url).run(run_id)


def metrics(run_id: str, steps: int | tuple[int | None, int | None] | None = None,
            ranks: Iterable[int] | None = None, fields: Sequence[str] | None = None,
            layout: Literal["long", "wide"] = "long", attempt: int | Literal["all"] | None = None, *,
            url: str | None = None, format: Literal["arrow", "csv"] | None = None) -> "pd.DataFrame":
    return _reader(url).metrics(run_id, steps=steps, ranks=ranks, fields=fields, layout=layout,
                                attempt=attempt, format=format)


def findings(run_id: str, *, url: str | None = None, **filters: Any) -> "pd.DataFrame":
    return _reader(url).findings(run_id, **filters)


def alerts(*, url: str | None = None, **filters: Any) -> "pd.DataFrame":
    return _reader(url).alerts(**filters)


def checkpoints(run_id: str, *, url: str | None = None) -> "pd.DataFrame":
    return _reader(url).checkpoints(run_id)


def events(run_id: str, *, url: str | None = None) -> "pd.DataFrame":
    return _reader(url).events(run_id)


def heartbeats(run_id: str, *, url: str | None = None) -> "pd.DataFrame":
    return _reader(url).heartbeats(run_id)


def timeline(run_id: str, *, url: str | None = None, findings: bool = True) -> "pd.DataFrame":
    return _reader(url).timeline(run_id, findings=findings)


def rollback(run_id: str, *, url: str | None = None) -> dict[str, Any]:
    return _reader(url).rollback(run_id)


def advice(run_id: str, *, url: str | None = None, **params: Any) -> dict[str, Any]:
    return _reader(url).advice(run_id, **params)


def retention(run_id: str, *, url: str | None = None, **policy: Any) -> dict[str, Any]:
    return _reader(url).retention(run_id, **policy)


def goodput(run_id: str, *, url: str | None = None) -> dict[str, Any]:
    return _reader(url).goodput(run_id)
