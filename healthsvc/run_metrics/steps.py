"""``healthsvc_run_steps_total{run}``: steps trained, a counter that only goes up.

``healthsvc_run_last_step`` is a gauge: after a rollback or a restart it goes *down* to the
resumed step, and Prometheus' ``rate()`` reads any decrease as a counter reset, so
``rate(healthsvc_run_last_step[5m])`` jumps by the whole resumed span (0+15x40 then 300+15x40 at
one step a second reads 1.95 steps/s instead of 1). This counter counts the steps trained instead:
each attempt (a start, a restart or a rollback) counts its steps from its first one to its
highest, so steps trained again after a rollback count again (they cost GPU time like any other
step), while a step reported again, a late rank or a gap filled by a spool adds nothing.

So ``rate(healthsvc_run_steps_total[5m])`` is the training speed whatever the run did. It is read
at scrape time from what the store keeps of every attempt anyway (its first step, its highest
step and its records: ``store.reads.attempts``, the same table ``/v1/runs/{run}/attempts``
answers): nothing is done per push, and a restarted service goes on from the same count.
"""
from __future__ import annotations

from typing import Iterable


def steps_trained(attempts: Iterable[dict]) -> int:
    """The steps trained over a run's attempts (``store.reads.attempts`` rows): each attempt's
    steps from its first to its highest, for those that stored records.

    >>> steps_trained([{"start_step": 0, "last_step": 99, "n_records": 200},
    ...                {"start_step": 50, "last_step": 79, "n_records": 60},
    ...                {"start_step": 80, "last_step": 80, "n_records": 0}])   # opened, nothing yet
    130
    """
    return sum(a["last_step"] - a["start_step"] + 1 for a in attempts if a["n_records"] > 0)
