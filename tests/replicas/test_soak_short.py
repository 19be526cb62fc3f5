"""The soak's two-minute form: ``bench/soak.py --minutes 2 --ranks 64`` (three replicas on a fresh
PostgreSQL database behind nginx, a NaN, a loss spike, a straggler and a hang injected, replicas
SIGKILLed and restarted, the receiver flapping), and its invariants read from its tables.

The script itself checks every invariant and exits 1 when one does not hold; this test also reads
the figures, so a script that stopped checking (or printing) one fails here. Modest CPU: 64 ranks
are 8 host pushes per step at 4 steps a second. The long form (30 minutes, 1,024 ranks) is run
by hand; its figures are in docs/reliability.md.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.tables import parse
from tests.bench.test_smoke import user_env

pytestmark = pytest.mark.e2e


# Not asserted here, because they do not hold yet (docs/reliability.md, "Open defects"): every
# fault paged (a hang found while its run's replica was killed and restarted was once stored but
# never paged), and memory flat (finished runs stay in memory: about 20 MiB a 1,024-rank run). The
# script's own exit status includes them, so it is not asserted either; the figures are.

ROOT = Path(__file__).resolve().parents[2]


def test_two_minute_soak_finds_every_fault_once_and_loses_nothing():
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "soak.py"), "--minutes", "2", "--ranks", "64",
                           "--kill-every", "30", "--flap-every", "25"],
                          cwd=ROOT, env=user_env(), capture_output=True, text=True, timeout=420)
    out = proc.stdout
    assert proc.returncode in (0, 1), f"soak exited {proc.returncode}:\n{out[-4000:]}\n{proc.stderr[-3000:]}"
    figures = {(f.table, f.row, f.column): f.value for f in parse(out)}
    for kind in ("non_finite", "loss_spike", "straggler", "hang"):
        injected = figures[("fault", kind, "injected")]
        assert injected >= 1, kind
        assert figures[("fault", kind, "found once")] == injected, out
    assert figures[("delivery", "rows not delivered", "figure")] == 0
    assert figures[("delivery", "bodies seen under two ids", "figure")] == 0
    assert figures[("delivery", "receiver outages", "figure")] >= 2        # it did flap
    assert figures[("records", "acknowledged records lost", "figure")] == 0
    assert figures[("records", "records acknowledged", "figure")] > 0
    assert "SIGKILLed" in out and "started again" in out                    # replicas were killed
