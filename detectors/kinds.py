"""What a finding kind means, declared once, next to the detector that reports it.

A :class:`Kind` says everything a consumer needs to know about a kind: how its alert resolves,
what it mutes, whether it is evidence of corruption and how its onset is dated, whether a
replay probe can check the rank it names, what incident it is to the run's economics, and how
it is drawn. Every field is required, so a new kind cannot leave one undeclared and silently
become "not latched, not corruption, not probed". Each detector module declares the kinds it
reports (``kinds`` on the detector class); :func:`healthsvc_detectors.registry.register` adds them here.
Alerting, rollback, probes, economics, the plots and the service's ``GET /v1/kinds`` all read
this table, and nothing else lists kinds.

>>> from healthsvc_detectors.registry import REGISTRY       # registers the built-in kinds
>>> kind("non_finite").resolves, kind("non_finite").corruption
('latched', 'abrupt')
>>> sorted(k.name for k in kinds() if k.probe)
['grad_spike', 'loss_spike', 'rank_outlier', 'replica_mismatch']
>>> kind("toy")
Traceback (most recent call last):
...
KeyError: "unknown finding kind 'toy'; expected one of ..."
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Resolves = Literal["condition", "latched", "explicit"]
Corruption = Literal["abrupt", "drift"]
Incident = Literal["stall", "non_finite", "corruption"]


@dataclass(frozen=True)
class Kind:
    """One finding kind (also the alert name) and its meaning to every consumer.

    - ``resolves``: how its alert resolves. ``condition``: once the condition stays clear for the
      resolve timeout; ``latched``: only by hand or by a rollback (the state it proves wrong does
      not heal by itself); ``explicit``: only on the detector's own resolved finding (silence
      that ends is news, its absence is not).
    - ``mutes``: the kinds whose alerts of the same run it inhibits while it fires (a NaN explains
      the spikes that follow it).
    - ``corruption``: ``None`` when the kind says nothing about the weights; else it is rollback
      evidence, and its onset is searched for in the ``abrupt`` window (seen within a step or two:
      32 steps or twice the detection delay) or the ``drift`` one (256 steps or four times it).
      ``drift`` is the widest a finding of the kind may need: an episode whose rise the history
      shows began with a jump of the loss within a few steps of its onset (an LR blow-up seen
      as a divergence) takes the abrupt window
      (:func:`healthsvc_detectors.offline.onset_signals.rise_began_abruptly`).
    - ``heals``: whether an episode that recovered within the transient window may be dismissed
      as a transient (a proof or a slow drift never heals).
    - ``onset_guessed``: the detector's ``onset_step`` is a guess that may fall after the first
      corrupted update, so only its detection step bounds the onset.
    - ``probe``: a warning or critical finding names a rank a replay probe can check.
    - ``incident``: what it is to the run's economics (MTBF and goodput), or ``None``.
    - ``restarts_at``: the lowest severity at which a supervisor restarts the run for it by
      default (``healthsvc/supervise/``), or ``None`` (it costs pace, not correctness, or a
      restart would not help).
    - ``blames_host``: the ranks it names point at their machine, so a restart leaves those
      hosts out (a NaN or a spike on one rank may be its batch: its host stays in).
    - ``label``, ``colour``: how plots and pages show it.
    """

    name: str
    meaning: str
    resolves: Resolves
    mutes: frozenset[str]
    corruption: Corruption | None
    heals: bool
    onset_guessed: bool
    probe: bool
    incident: Incident | None
    restarts_at: Literal["info", "warning", "critical"] | None
    blames_host: bool
    label: str
    colour: str


_KINDS: dict[str, Kind] = {}


def add(new: Kind) -> None:
    """Add a kind to the table (the registry does, for each detector it registers). Declaring a
    name twice with another meaning is refused: one kind, one meaning."""
    old = _KINDS.get(new.name)
    if old is not None and old != new:
        raise ValueError(f"finding kind {new.name!r} is already declared with another meaning")
    _KINDS[new.name] = new


def remove(name: str) -> None:
    """Take a kind out of the table again (for a registration that is undone)."""
    _KINDS.pop(name, None)


def kind(name: str) -> Kind:
    """The kind named ``name``; a KeyError naming the known kinds otherwise."""
    try:
        return _KINDS[name]
    except KeyError:
        raise KeyError(f"unknown finding kind {name!r}; expected one of {tuple(_KINDS)}") from None


def known(name: str) -> bool:
    return name in _KINDS


def kinds() -> tuple[Kind, ...]:
    """Every declared kind, in declaration order."""
    return tuple(_KINDS.values())


def names() -> tuple[str, ...]:
    return tuple(_KINDS)


def corruption_kinds() -> frozenset[str]:
    """The kinds that are rollback evidence (``corruption`` declared)."""
    return frozenset(k.name for k in _KINDS.values() if k.corruption is not None)
