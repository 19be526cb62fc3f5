"""Types and ranges of every detector parameter, checked before a detector is built.

A run's config carries ``detectors: {name: {param: value}}`` from anyone who can ``PUT`` a run,
and the stored config is rebuilt at every start of the service, so a value that crashes a
detector later (``Infinity``, ``0``, ``-1``, ``10**12``) must be refused when it is sent, with a
422 naming the parameter.

The parameters and their types are read from each detector's constructor (its signature and
annotations), so a parameter the detector package adds is validated without a change here; what
the signature cannot say (ranges) comes from :data:`RANGES`, matched by parameter name:

- every number must be finite; a boolean is never a number;
- EWMA weights (``alpha``, ``*_alpha``, ``beta``) and shares (``*_fraction``, ``*_share``) lie in
  (0, 1];
- step counts are integers from 1 to 100,000 and rank counts from 1 to 2**21;
- a ``Literal[...]`` parameter takes one of its values;
- other numbers are > 0 when their default is, >= 0 otherwise, and at most 1e9;
- metric names are field names (what ingest accepts), lists of them are 1 to 64 long.

``(detector, parameter)`` entries in :data:`OVERRIDES` win over the name rules. After the checks
the detector is built and fed a small probe block (a few steps of 8 ranks, with a NaN), so a
combination the ranges do not catch but the detector cannot run with is still a 422, not a
monitor that fails on every push.
"""
from __future__ import annotations

import inspect
import math
import re
import types
import typing
from dataclasses import dataclass
from typing import Any

from healthsvc.errors import InvalidInput

FIELD_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]{0,63}$")
MAX_NUMBER = 1e9
MAX_COUNT = 100_000
MAX_NAMES = 64

# Constructor arguments a run config may not set (the registry fixes them).
FIXED_PARAMS = frozenset({"kind"})


@dataclass(frozen=True)
class Range:
    """Bounds of a number: ``low < x`` (or ``<=`` when ``low_inclusive``) and ``x <= high``."""
    low: float
    high: float
    low_inclusive: bool = False

    def check(self, x: float) -> str | None:
        if self.low_inclusive and x < self.low:
            return f"must be >= {self.low:g}"
        if not self.low_inclusive and x <= self.low:
            return f"must be > {self.low:g}"
        if x > self.high:
            return f"must be <= {self.high:g}"
        return None


UNIT = Range(0.0, 1.0)
COUNT = Range(1, MAX_COUNT, low_inclusive=True)
RANK_COUNT = Range(1, 1 << 21, low_inclusive=True)   # above the default max_ranks

# (regex on the parameter name, range): the first match wins.
RANGES: list[tuple[re.Pattern, Range]] = [
    (re.compile(r"^(alpha|beta|.*_alpha)$"), UNIT),
    (re.compile(r".*_(fraction|share)$"), UNIT),
    (re.compile(r".*_steps$"), COUNT),
    (re.compile(r".*_ranks$"), RANK_COUNT),
]

# (detector, parameter) -> range, for what the name rules get wrong.
OVERRIDES: dict[tuple[str, str], Range] = {
    ("straggler", "min_ranks"): Range(3, MAX_COUNT, low_inclusive=True),
    ("hang", "timeout_floor_s"): Range(0.0, 365 * 86400.0),
    ("hang", "startup_timeout_s"): Range(0.0, 365 * 86400.0),
    ("hang", "heartbeat_timeout_s"): Range(0.0, 365 * 86400.0),
}


def _range_for(detector: str, name: str, default: Any) -> Range:
    if (detector, name) in OVERRIDES:
        return OVERRIDES[(detector, name)]
    for pattern, rng in RANGES:
        if pattern.match(name):
            return rng
    positive = isinstance(default, (int, float)) and not isinstance(default, bool) and default > 0
    return Range(0.0, MAX_NUMBER, low_inclusive=not positive)


def constructor_params(cls: type) -> dict[str, tuple[Any, Any]]:
    """``{name: (type annotation, default)}`` of a detector's constructor, following ``**kwargs``
    up the class hierarchy (``LossSpikeDetector(z_threshold, **kwargs)`` -> ``SpikeDetector``)."""
    out: dict[str, tuple[Any, Any]] = {}
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        hints = typing.get_type_hints(init)
        more = False
        for p in inspect.signature(init).parameters.values():
            if p.name == "self":
                continue
            if p.kind is p.VAR_KEYWORD:
                more = True
                continue
            if p.kind is p.VAR_POSITIONAL or p.name in out or p.name in FIXED_PARAMS:
                continue
            out[p.name] = (hints.get(p.name, Any), p.default)
        if not more:
            break
    return out


def _options(annotation: Any) -> tuple[list[Any], bool]:
    """The non-None members of a (possibly optional) annotation, and whether None is allowed."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(annotation)
        return [a for a in args if a is not type(None)], type(None) in args
    return [annotation], False


def _check_value(detector: str, name: str, annotation: Any, default: Any, value: Any) -> tuple[Any, str | None]:
    """(the value to pass, or an error saying what is wrong)."""
    options, nullable = _options(annotation)
    if value is None:
        return (None, None) if nullable else (None, "must not be null")
    kind = options[0] if len(options) == 1 else None
    origin = typing.get_origin(kind)
    if kind is bool:
        return (value, None) if isinstance(value, bool) else (None, "must be true or false")
    if kind is int or kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None, "must be a number"
        if kind is int:
            if isinstance(value, float):
                if not value.is_integer():
                    return None, "must be an integer"
                value = int(value)
        elif not math.isfinite(value):
            return None, "must be a finite number"
        if abs(value) > 1e300:
            return None, "is out of range"
        problem = _range_for(detector, name, default).check(value)
        return (None, problem) if problem else (float(value) if kind is float else value, None)
    if origin is typing.Literal:
        allowed = typing.get_args(kind)
        if type(value) not in {type(a) for a in allowed} or value not in allowed:
            return None, f"must be one of {', '.join(map(repr, allowed))}"
        return value, None
    if kind is str:
        if not isinstance(value, str) or not FIELD_NAME.match(value):
            return None, "must be a field name (letters, digits, '_' and '.', up to 64 characters)"
        return value, None
    if origin is tuple or origin is list:
        if not isinstance(value, list) or not 1 <= len(value) <= MAX_NAMES:
            return None, f"must be a list of 1 to {MAX_NAMES} field names"
        if not all(isinstance(v, str) and FIELD_NAME.match(v) for v in value):
            return None, "must be a list of field names (letters, digits, '_' and '.')"
        return tuple(value), None
    return None, "cannot be set in a run config"  # a type this schema does not know: refuse


def validate_params(detector: str, cls: type, params: dict[str, Any], loc: tuple) -> dict[str, Any]:
    """Checked constructor kwargs for ``cls`` (``enabled`` excluded); raises InvalidInput."""
    if not isinstance(params, dict):
        raise InvalidInput(f"parameters of detector {detector!r} must be an object", loc=loc)
    known = constructor_params(cls)
    out: dict[str, Any] = {}
    for name, value in params.items():
        where = (*loc, name)
        if name == "enabled":
            if not isinstance(value, bool):
                raise InvalidInput("enabled must be true or false", loc=where)
            continue
        if name not in known:
            raise InvalidInput(f"detector {detector!r} has no parameter {name!r}; it has: "
                               f"{', '.join(sorted(known))}", loc=where)
        annotation, default = known[name]
        checked, problem = _check_value(detector, name, annotation, default, value)
        if problem:
            raise InvalidInput(f"{detector}.{name} {problem}, got {_show(value)}", loc=where)
        out[name] = checked
    return out


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def probe_block():
    """A few steps of 8 healthy ranks, then a NaN loss on rank 3: what every detector must take."""
    import numpy as np

    from healthsvc_detectors.frame import StepBlock

    steps, ranks = np.arange(6), np.arange(8)
    base = np.linspace(2.0, 1.9, len(steps))[:, None] + 0.01 * np.arange(len(ranks))[None, :]
    loss = base.copy()
    loss[-1, 3] = np.nan
    step_time = np.full((len(steps), len(ranks)), 0.5)
    return StepBlock.from_dense(steps, ranks, loss=loss, grad_norm=base / 2, local_grad_norm=base / 3,
                                step_time=step_time, compute_time=step_time * 0.8, comm_time=step_time * 0.2)


def probe_suite(suite) -> None:
    """Feed a fresh copy of each detector the probe block; a detector that raises is a 422."""
    import numpy as np

    block = probe_block()
    for role in ("arrival", "aligned", "absence"):
        for name, det in getattr(suite, role).items():
            try:
                if role == "absence":
                    for i, step in enumerate(block.steps):
                        det.observe(block.ranks, np.full(len(block.ranks), step), 1000.0 + i)
                    det.tick(1000.0 + 10 * 365 * 86400.0)
                else:
                    det.update(block)
            except Exception as exc:  # noqa: BLE001 - any failure means: this config cannot run
                raise InvalidInput(f"detector {name!r} cannot run with these parameters: "
                                   f"{type(exc).__name__}: {exc}"[:300], loc=("body", "detectors", name)) from None
            det.reset()
