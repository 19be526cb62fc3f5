"""Wire types with the ranges the store and the service can hold, for every request model.

- Integers are 64-bit in SQLite: anything at or beyond 2**63 is a 422, not an OverflowError.
  They are strict: ``false``/``true`` and ``3.0`` are not integers.
- Floats are finite (JSON ``Infinity``/``NaN`` tokens are accepted by the parser, so they must
  be refused here where they are not data) and bounded, so sums and products downstream stay
  finite.
- Ranks and world sizes are bounded by the ``max_ranks`` setting (default 1,048,576), checked
  by :func:`check_rank` where the settings are at hand.
"""
from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, Strict

from healthsvc.errors import InvalidInput

INT64_MAX = 2**63 - 1
MAX_SECONDS = 1e9            # durations: ~31 years
MAX_UNIX_S = 1e11            # timestamps: year ~5100
MAX_VALUE = 1e15             # free numbers (probe values, ratios)

NonNegInt = Annotated[int, Strict(), Field(ge=0, le=INT64_MAX)]
PositiveInt = Annotated[int, Strict(), Field(ge=1, le=INT64_MAX)]
AnyInt = Annotated[int, Strict(), Field(ge=-INT64_MAX, le=INT64_MAX)]
Seconds = Annotated[float, Strict(), Field(ge=0, le=MAX_SECONDS, allow_inf_nan=False)]
PositiveSeconds = Annotated[float, Strict(), Field(gt=0, le=MAX_SECONDS, allow_inf_nan=False)]
UnixSeconds = Annotated[float, Strict(), Field(ge=0, le=MAX_UNIX_S, allow_inf_nan=False)]
FiniteFloat = Annotated[float, Strict(), Field(ge=-MAX_VALUE, le=MAX_VALUE, allow_inf_nan=False)]


def check_rank(value: Any, max_ranks: int, loc: tuple, what: str = "rank") -> None:
    """A rank id must be < max_ranks (a world size <= max_ranks): memory and work per run are
    sized by it."""
    if value is None:
        return
    limit = max_ranks - 1 if what == "rank" else max_ranks
    if value > limit:
        raise InvalidInput(f"{what} {value} is beyond this service's limit of {limit} "
                           f"(setting max_ranks = {max_ranks})", loc=loc,
                           hint="raise HEALTHSVC_MAX_RANKS if the job really is that large")


def check_storable(value: Any, depth: int = 0) -> None:
    """Free-form JSON (event data, tags) must be storable: integers within 64 bits, at most 32
    levels deep. Raises ValueError (pydantic turns it into a 422 naming the field)."""
    if depth > 32:
        raise ValueError("nested too deeply (at most 32 levels)")
    if type(value) is int:
        if not -INT64_MAX <= value <= INT64_MAX:
            raise ValueError(f"integer {value} is beyond the 64-bit range")
    elif isinstance(value, dict):
        for v in value.values():
            check_storable(v, depth + 1)
    elif isinstance(value, list):
        for v in value:
            check_storable(v, depth + 1)
