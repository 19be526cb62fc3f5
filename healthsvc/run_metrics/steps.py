"""``healthsvc_run_steps_total{run}``: steps trained, a counter that only goes up.

``healthsvc_run_last_step`` is a gauge: after a rollback or a restart it goes *down* to the
resumed step, and Prometheus' ``rate()`` reads any decrease as a counter reset, so
``rate(healthsvc_run_last_step[5m])`` jumps by the whole resumed span (0+15x40 then 300+15x40 at
one step a second reads 1.95 steps/s instead of 1). This counter counts the steps trained instead:

- within an attempt, each rise of the attempt's highest step (a step reported again in the same
  attempt, a late rank, a gap filled by a spool adds nothing);
- a new attempt (a restart or a rollback) counts its steps from its first one, so steps trained
  again after a rollback count again: they cost GPU time like any other step.

So ``rate(healthsvc_run_steps_total[5m])`` is the training speed whatever the run did. The count
lives in this process (it is derived from the committed pushes the writer thread hands on): a
service restart starts it again from 0, which Prometheus handles as the counter reset it is. The
first batch of an attempt that began before this process saw the run only sets the baseline.
"""
from __future__ import annotations

import threading
from typing import Any, Iterable

from healthsvc.run_metrics.feed import new_batches


class StepsTrained:
    """Steps trained per run (writer thread in, scrape thread out)."""

    def __init__(self) -> None:
        self._highest: dict[str, dict[int, int]] = {}   # run -> attempt -> highest step counted
        self._total: dict[str, int] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"StepsTrained(runs={len(self._total)})"

    def on_store_results(self, results: list[Any]) -> None:
        for r, batch in new_batches(results):
            top = int(batch.steps.max())
            with self._lock:
                highest = self._highest.setdefault(r.run_id, {})
                total = self._total.get(r.run_id, 0)
                before = highest.get(r.attempt)
                if before is not None:
                    total += max(0, top - before)
                elif r.new_attempt:   # the attempt opens with this batch: its steps from the first
                    total += top - int(batch.steps.min()) + 1
                # else: an attempt this process never saw open (it restarted): a baseline only
                highest[r.attempt] = max(top, before if before is not None else top)
                if len(highest) > 4:   # late spools go to recent attempts only; bounded memory
                    del highest[min(highest)]
                self._total[r.run_id] = total

    def total(self, run_id: str) -> int | None:
        with self._lock:
            return self._total.get(run_id)

    def forget(self, run_ids: Iterable[str]) -> None:
        """Let go of runs the store let go of (finished and quiet)."""
        with self._lock:
            for run_id in run_ids:
                self._total.pop(run_id, None)
                self._highest.pop(run_id, None)

    def keep_only(self, run_ids: set[str]) -> None:
        """Forget runs that are no longer exported (bounded memory): one that comes back starts
        again from 0, a counter reset to Prometheus."""
        with self._lock:
            for run_id in set(self._total) - run_ids:
                del self._total[run_id], self._highest[run_id]
