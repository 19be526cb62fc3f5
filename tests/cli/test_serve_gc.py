"""``healthsvc serve`` leaves what start-up built out of the garbage collector's full
collections (``gc.freeze``), once the app is built and before the server runs: the collections
walk every tracked object, and start-up's are most of them and live as long as the process."""
from __future__ import annotations

import gc

from healthsvc import cli


def test_serve_freezes_the_start_up_objects_before_the_server_runs(tmp_path, monkeypatch):
    events: list[str] = []
    monkeypatch.setattr(gc, "freeze", lambda: events.append("freeze"))

    def run(app, **kwargs):
        events.append("run")
        assert callable(app) and kwargs["host"] == "127.0.0.1"
    monkeypatch.setattr("uvicorn.run", run)
    monkeypatch.setattr("healthsvc.ops.allocator.tune", lambda arena_max: False)   # not this process's
    assert cli.main(["serve", "--db", str(tmp_path / "serve.db"), "--host", "127.0.0.1", "--port", "1"]) == 0
    assert events == ["freeze", "run"]
