"""The pipeline is built in one place (``healthsvc/pipeline.py``): its stages, in order, are the
store's one after-commit listener and the drain barrier's order; after-commit callbacks are
registered in at most three places in the service."""
from __future__ import annotations

import ast
import threading
from pathlib import Path

from tests.harness import InProcessService

ROOT = Path(__file__).resolve().parents[1]

# The calls that register something to run after a commit: a store listener, the findings'
# stage (which folds them before their job), a change's callback for once its job is durable.
REGISTRATIONS = ("subscribe", "set_stage", "after_commit")


def registration_sites() -> list[str]:
    sites = []
    for path in sorted((ROOT / "healthsvc").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in REGISTRATIONS):
                sites.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.func.attr}")
    return sites


def test_after_commit_callbacks_are_registered_in_at_most_three_places():
    sites = registration_sites()
    assert len(sites) <= 3, sites
    assert [s.split()[-1] for s in sites if s.startswith("healthsvc/pipeline.py")] == ["subscribe"]


def test_the_stages_in_order_are_the_stores_one_listener_and_the_drain_order(tmp_path):
    with InProcessService(tmp_path) as svc:
        pipeline = svc.app.state.pipeline
        assert [s.name for s in pipeline.stages] == [
            "replay probes", "monitor", "dashboard rollups", "run metrics", "webhook delivery worker"]
        assert svc.app.state.store._listeners == [pipeline._committed]
        drained: list[str] = []
        for i, stage in enumerate(pipeline.stages):
            if stage.drain is not None:
                def spy(timeout_s, tick, real=stage.drain, name=stage.name):
                    drained.append(name)
                    return real(timeout_s, tick)
                pipeline.stages[i] = type(stage)(stage.name, stage.committed, spy)
        svc.drain()
        assert drained == ["monitor", "dashboard rollups", "webhook delivery worker"]


def test_no_thread_of_its_own_for_alerting(tmp_path):
    # A run's alerts are its owner's: the monitor thread folds its findings into them, ticks
    # them and hands them rollbacks; alerting adds the delivery worker's threads, nothing else.
    with InProcessService(tmp_path):
        names = {t.name for t in threading.enumerate()}
        assert "healthsvc-monitor" in names and "alerting" not in names
