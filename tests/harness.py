"""The service in the test's own process, on a clock the test moves, with a drain barrier.

    with InProcessService(tmp_path) as svc:           # in-process ASGI (service logic)
        svc.http.post("/v1/runs/r/metrics", json=...)
        svc.drain()                                    # everything that push caused is stored
        assert svc.http.get("/v1/runs/r/findings").json() == []   # absence, after a barrier
        svc.advance(30)                                # 30 s pass: hang and stall checks run

    with ServedService(tmp_path) as svc:               # real uvicorn on 127.0.0.1, free port
        httpx.get(svc.url + "/v1/runs")

Both run the app ``healthsvc serve`` runs (:func:`healthsvc.app.create_asgi`: guard, fast path,
FastAPI) on a real SQLite file, with a :class:`FakeClock`. Time moves only when the test says so:
the service's real-time tickers are off, and :meth:`advance` moves the clock one tick interval
(the default, 1 s) at a time, running the time-driven checks (hang and stall timeouts, aligner
waits, alert group intervals, resolve timeouts, webhook retries falling due) after each, then
drains. :meth:`drain` is :func:`healthsvc.drain.drain`: it returns once every writer job, finding,
alert, notification and webhook attempt caused so far is stored.

``real_time=True`` keeps the service's own clock and tickers instead, for tests whose other side
is a real process in real time (the example trainer, a real Alertmanager): :meth:`drain` works
the same, :meth:`advance` jumps the clock ahead and ticks once.

Settings are the service's defaults (environment included) plus what a test passes; the
detectors are never tuned here.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx

from healthsvc.app import create_asgi
from healthsvc.clock import ServiceClock
from healthsvc.drain import drain
from healthsvc.local_server import free_port
from healthsvc.settings import Settings
from healthsvc.store.sqlite import SQLiteStore
from tests.barriers import wait_until

JSON = {"content-type": "application/json"}

# The service's tickers wait this long (real seconds) between ticks: never, within a test. The
# fake clock's advance() runs the ticks instead.
NO_REAL_TIME_TICKS_S = 1e6


class FakeClock:
    """Unix seconds that move only by :meth:`advance` (starting at the real time now)."""

    def __init__(self, start: float | None = None) -> None:
        self._now = time.time() if start is None else float(start)
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> float:
        if seconds < 0:
            raise ValueError("a clock the service trusts never goes back")
        with self._lock:
            self._now += seconds
            return self._now

    def wall(self) -> float:
        """Real wall time: webhook signatures are checked by real receivers against theirs."""
        return time.time()

    def __repr__(self) -> str:
        return f"FakeClock(now={self():.3f})"


class RealClock(ServiceClock):
    """The service's own clock (real time), which a test may also move forward at once."""

    def __init__(self) -> None:
        super().__init__()
        self._jumped = 0.0

    def __call__(self) -> float:
        return super().__call__() + self._jumped

    def advance(self, seconds: float) -> float:
        if seconds < 0:
            raise ValueError("a clock the service trusts never goes back")
        self._jumped += seconds
        return self()


class _Service:
    def __init__(self, tmp_path: str | Path, *, db: str | Path | None = None, clock: FakeClock | None = None,
                 real_time: bool = False, **settings: Any) -> None:
        """``real_time``: the service's own clock and tickers, for a test that drives it with
        real processes (the example trainer, a real Alertmanager); :meth:`advance` then jumps."""
        if real_time and clock is not None:
            raise ValueError("real_time runs on the service's own clock; pass no clock")
        self.real_time = real_time
        self.clock = RealClock() if real_time else clock or FakeClock()
        db = db or Path(tmp_path) / "healthsvc.db"
        self.tick_s = Settings().tick_interval_s   # the default the service ticks at (1 s)
        ticks = {} if real_time else {"tick_interval_s": NO_REAL_TIME_TICKS_S, "alert_tick_s": NO_REAL_TIME_TICKS_S}
        self.settings = Settings(**{"db": str(db), **ticks, **settings})
        self.asgi = create_asgi(self.settings, clock=self.clock)
        self.app = _fastapi_app(self.asgi)

    def drain(self, *, tick: bool = False, timeout_s: float = 30.0) -> None:
        """Wait until everything caused so far is processed (with ``tick``: the time-driven
        checks run once at the clock's time now, too)."""
        drain(self.app, tick=tick, timeout_s=timeout_s)

    def advance(self, seconds: float, step_s: float | None = None) -> None:
        """Let ``seconds`` pass, ticking every ``step_s`` (the service's tick interval) on the way
        (on a real-time service: jump its clock ahead, then tick once)."""
        if self.real_time:   # real time goes on meanwhile; the jump is seen at one tick
            self.clock.advance(seconds)
            self.drain(tick=True)
            return
        step_s = step_s or self.tick_s
        left = seconds
        while left > 1e-9:
            dt = min(step_s, left)
            self.clock.advance(dt)
            left -= dt
            self.drain(tick=True)

    def crash_image(self, path: str | Path) -> Path:
        """A copy of the database as a SIGKILL right now would leave it: every committed write,
        none of what a clean shutdown adds (final detector snapshots). Start another service on
        it to restart "after a crash" on the same fake clock."""
        import sqlite3
        if not isinstance(self.app.state.store, SQLiteStore):
            raise NotImplementedError("crash_image copies a SQLite file; on PostgreSQL kill a ServerProcess instead")
        src = sqlite3.connect(self.app.state.store.path)
        dst = sqlite3.connect(str(path))
        try:
            src.backup(dst)   # a consistent read of what is committed, WAL included
        finally:
            src.close()
            dst.close()
        return Path(path)

    @property
    def monitor(self):
        return self.app.state.monitor

    @property
    def alerting(self):
        return self.app.state.alerting


def _fastapi_app(asgi: Any) -> Any:
    """The FastAPI app inside create_asgi's wrappers (they keep it as ``.app``)."""
    app = asgi
    while not hasattr(app, "state"):
        app = app.app
    return app


class InProcessService(_Service):
    """The app in this process, called through ASGI (no socket); ``http`` is its client."""

    def __enter__(self) -> "InProcessService":
        from fastapi.testclient import TestClient
        self._client = TestClient(self.asgi, base_url="http://127.0.0.1", headers=JSON)
        self.http = self._client.__enter__()   # runs the lifespan: store open, threads started
        return self

    def __exit__(self, *exc: Any) -> None:
        self._client.__exit__(*exc)


class ServiceClient(httpx.Client):
    """An HTTP client of a :class:`ServedService` that can also drain it (for helpers that are
    handed only the client)."""

    def __init__(self, service: "_Service", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.service = service

    def drain(self, **kwargs: Any) -> None:
        self.service.drain(**kwargs)


class ServedService(_Service):
    """The app under real uvicorn on 127.0.0.1 (a free port), in a thread of this process."""

    def __init__(self, tmp_path: str | Path, **kwargs: Any) -> None:
        # The port is the service's setting too: links in alerts carry it.
        super().__init__(tmp_path, **{"host": "127.0.0.1", "port": free_port(), **kwargs})

    def __enter__(self) -> "ServedService":
        import uvicorn
        config = uvicorn.Config(self.asgi, host=self.settings.host, port=self.settings.port, log_level="warning",
                                access_log=False, timeout_graceful_shutdown=5)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="uvicorn", daemon=True)
        self._thread.start()
        wait_until(lambda: self._server.started or not self._thread.is_alive(), timeout_s=30,
                   what="uvicorn to start", interval_s=0.01)
        if not self._server.started:
            raise RuntimeError("uvicorn did not start (see the log above)")
        self.url = f"http://127.0.0.1:{self.settings.port}"
        self.http = ServiceClient(self, base_url=self.url, timeout=30, headers=JSON)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.http.close()
        self._server.should_exit = True
        self._thread.join(30)
