"""Silences: label matchers (``=``, ``!=``, ``=~``, ``!~``) with a start and an expiry, and the
set of them an alert is matched against (after Alertmanager).

Matching stays bounded in time however many silences there are:

- a regex is compiled once, when its matcher is made (kept with the matcher), never per match;
- :class:`Silences` indexes each silence by one of its exact-match pairs (``run="r1"``), so an
  alert is matched only against the silences that name one of its own label pairs, plus those
  with no such pair (regex-only or negative matchers), which are scanned;
- the number of silences not yet expired is capped (``alert_max_silences``, default
  :data:`DEFAULT_MAX_SILENCES`): one more is refused with :class:`TooManySilences`, whose message
  says the limit and how to free room.

Example::

    >>> s = Silences([Silence("sil_1", (Matcher("run", "r1"),), 0.0, 60.0)])
    >>> s.matching({"run": "r1", "alertname": "stall"}, now=1.0), s.matching({"run": "r2"}, now=1.0)
    (['sil_1'], [])
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Iterable, Literal, Mapping

from healthsvc.alerting.model import Alert

log = logging.getLogger(__name__)

MAX_PATTERN_CHARS = 1000
DEFAULT_MAX_SILENCES = 1000   # active or pending; each scanned one costs a few microseconds per alert

MatchOp = Literal["=", "!=", "=~", "!~"]


def compile_pattern(pattern: str):
    """An RE2 pattern (google-re2): matching is linear in the input, so no pattern can backtrack
    catastrophically (``(a+)+b`` on a long run id costs microseconds, not minutes). RE2 has no
    backreferences or lookaround; a pattern using them is refused when the matcher is made."""
    import re2

    if len(pattern) > MAX_PATTERN_CHARS:
        raise ValueError(f"regex longer than {MAX_PATTERN_CHARS} characters")
    options = re2.Options()
    options.log_errors = False
    try:
        return re2.compile(pattern, options)
    except re2.error as exc:
        msg = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        raise ValueError(f"invalid regex {pattern[:80]!r}: {msg} (RE2 syntax: no backreferences or lookaround)") from None


@dataclass(frozen=True)
class Matcher:
    """A label matcher; regex matchers are anchored, as in Alertmanager, and compiled here once."""

    name: str
    value: str
    op: MatchOp = "="
    _regex: Any = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.op not in ("=", "!=", "=~", "!~"):
            raise ValueError(f"matcher op must be one of =, !=, =~, !~; got {self.op!r}")
        if self.op in ("=~", "!~"):
            object.__setattr__(self, "_regex", compile_pattern(self.value))  # fails at creation

    def matches(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.name, "")
        if self.op == "=":
            return value == self.value
        if self.op == "!=":
            return value != self.value
        hit = self._regex.fullmatch(value) is not None
        return hit if self.op == "=~" else not hit

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "value": self.value, "op": self.op}


@dataclass(frozen=True)
class Silence:
    """Mutes notifications of matching alerts between ``starts_at`` and ``ends_at`` (unix s).

    Alerts keep firing and are listed by the API; only notifications are muted.
    """

    id: str
    matchers: tuple[Matcher, ...]
    starts_at: float
    ends_at: float
    created_by: str = ""
    comment: str = ""

    def __post_init__(self) -> None:
        if not self.matchers:
            raise ValueError("a silence needs at least one matcher (it would mute everything)")
        if self.ends_at <= self.starts_at:
            raise ValueError("silence ends_at must be after starts_at")

    def active(self, now: float) -> bool:
        return self.starts_at <= now < self.ends_at

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(m.matches(labels) for m in self.matchers)

    def index_key(self) -> tuple[str, str] | None:
        """A label pair every alert it matches has: its first ``=`` matcher with a value (an
        empty one also matches an absent label, which no lookup by pair finds)."""
        return next(((m.name, m.value) for m in self.matchers if m.op == "=" and m.value), None)

    def to_dict(self, now: float | None = None) -> dict[str, Any]:
        d: dict[str, Any] = {
            "id": self.id, "matchers": [m.to_dict() for m in self.matchers],
            "starts_at": self.starts_at, "ends_at": self.ends_at,
            "created_by": self.created_by, "comment": self.comment,
        }
        if now is not None:
            d["state"] = "active" if self.active(now) else ("pending" if now < self.starts_at else "expired")
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Silence":
        return cls(
            id=d["id"], matchers=tuple(Matcher(m["name"], m["value"], m.get("op", "=")) for m in d["matchers"]),
            starts_at=float(d["starts_at"]), ends_at=float(d["ends_at"]),
            created_by=d.get("created_by", ""), comment=d.get("comment", ""),
        )


class TooManySilences(ValueError):
    """The cap on silences not yet expired is reached."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"at most {limit} silences may be active or pending at once (setting alert_max_silences); "
            f"expire one with DELETE /v1/silences/{{id}}, or widen an existing silence's matchers "
            f"(one =~ matcher can cover many runs)")
        self.limit = limit


class Silences:
    """Every silence by id (expired ones kept, for listing), indexed for matching."""

    def __init__(self, silences: Iterable[Silence] = ()) -> None:
        self._by_id: dict[str, Silence] = {}
        self._by_pair: dict[tuple[str, str], dict[str, Silence]] = {}
        self._scanned: dict[str, Silence] = {}
        self._unreadable: set[str] = set()   # stored silences this release cannot parse (said once)
        for s in silences:
            self.put(s)

    def __repr__(self) -> str:
        return f"Silences({len(self._by_id)}, indexed={len(self._by_id) - len(self._scanned)})"

    def __len__(self) -> int:
        return len(self._by_id)

    def get(self, silence_id: str) -> Silence | None:
        return self._by_id.get(silence_id)

    def values(self) -> list[Silence]:
        return list(self._by_id.values())

    def put(self, s: Silence) -> None:
        """Add a silence, or replace the one with its id."""
        self._drop(s.id)
        self._by_id[s.id] = s
        key = s.index_key()
        (self._scanned if key is None else self._by_pair.setdefault(key, {}))[s.id] = s

    def _drop(self, silence_id: str) -> None:
        old = self._by_id.pop(silence_id, None)
        if old is None:
            return
        key = old.index_key()
        bucket = self._scanned if key is None else self._by_pair[key]
        del bucket[silence_id]
        if key is not None and not bucket:
            del self._by_pair[key]

    def reload(self, stored: Mapping[str, Mapping[str, Any]]) -> None:
        """Follow the stored silences (replicas: any replica may change them), parsing (and
        compiling) only those that are new or changed since the last reload. One this release
        cannot parse (a regex an earlier release's engine took, RE2 does not) is skipped with a
        WARNING, never a reason not to start."""
        for sid in [sid for sid in self._by_id if sid not in stored]:
            self._drop(sid)
        for sid, d in stored.items():
            known = self._by_id.get(sid)
            if (known is None and sid in self._unreadable) or (known is not None and known.to_dict() == d):
                continue
            try:
                self.put(Silence.from_dict(d))
            except (ValueError, KeyError, TypeError) as exc:
                self._unreadable.add(sid)
                log.warning("stored silence %s cannot be read (%s); it mutes nothing and is not listed: make "
                            "it again in RE2 syntax", sid, exc)

    def unexpired(self, now: float) -> int:
        return sum(1 for s in self._by_id.values() if s.ends_at > now)

    def check_room(self, now: float, limit: int) -> None:
        """Raise :class:`TooManySilences` if one more silence would exceed ``limit``."""
        if self.unexpired(now) >= limit:
            raise TooManySilences(limit)

    def candidates(self, labels: Mapping[str, str]) -> Iterable[Silence]:
        """The silences that may match ``labels``: those indexed by one of its pairs, and the
        scanned ones."""
        for pair in labels.items():
            bucket = self._by_pair.get(pair)
            if bucket:
                yield from bucket.values()
        yield from self._scanned.values()

    def matching(self, labels: Mapping[str, str], now: float) -> list[str]:
        """Ids of the active silences that match ``labels``."""
        return [s.id for s in self.candidates(labels) if s.active(now) and s.matches(labels)]

    def muted(self, alerts: Iterable[Alert], now: float) -> set[str]:
        """Fingerprints of the alerts muted by an active silence at ``now``."""
        if not self._by_id:
            return set()
        return {a.fingerprint for a in alerts if self.matching(a.routing_labels(), now)}


def silenced(alerts: Iterable[Alert], silences: Iterable[Silence], now: float) -> set[str]:
    """Fingerprints of the alerts muted by an active silence at ``now`` (over a plain list)."""
    return Silences(silences).muted(alerts, now)
