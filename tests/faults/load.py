"""Pushers that keep pushing through a fault and account for every answer.

Each :class:`Pusher` is a thread pushing one step of ``world`` ranks per request to its own run,
with a client timeout. A 202 adds the step's records to ``acked``; any other answer (or a
timeout) is counted in ``answers`` and the same step is pushed again, as the client would retry.
"""
from __future__ import annotations

import collections
import json
import threading

import httpx

JSON = {"content-type": "application/json"}


class Pusher(threading.Thread):
    def __init__(self, url: str, run_id: str, *, world: int = 4, timeout_s: float = 10.0) -> None:
        super().__init__(daemon=True, name=f"pusher-{run_id}")
        self.run_id, self.world = run_id, world
        self.http = httpx.Client(base_url=url, timeout=timeout_s, headers=JSON)
        self.stopping = threading.Event()
        self.acked: list[tuple[int, int]] = []           # (rank, step) of every acknowledged record
        self.answers: collections.Counter[str] = collections.Counter()   # "202", "503", "timeout", ...
        self.step = 0

    def body(self, step: int) -> str:
        ranks = list(range(self.world))
        return json.dumps({"columns": {"step": [step] * self.world, "rank": ranks, "loss": [2.0] * self.world,
                                       "grad_norm": [1.0] * self.world, "ts": [1_000.0 + step] * self.world}})

    def push_once(self) -> str:
        try:
            r = self.http.post(f"/v1/runs/{self.run_id}/metrics", content=self.body(self.step))
        except httpx.TimeoutException:
            return "timeout"
        except httpx.TransportError as exc:
            return type(exc).__name__
        if r.status_code == 202:
            self.acked += [(rank, self.step) for rank in range(self.world)]
            self.step += 1
        return str(r.status_code)

    def run(self) -> None:
        while not self.stopping.is_set():
            answer = self.push_once()
            self.answers[answer] += 1
            self.stopping.wait(0.02 if answer == "202" else 0.1)

    def stop(self) -> None:
        self.stopping.set()
        self.join(30)
        self.http.close()


def stored_once(url: str, run_id: str, acked: list[tuple[int, int]]) -> str | None:
    """None when the store holds every acknowledged record of the run exactly once, else what is
    wrong. (A record answered 503 may still be stored: its commit can reach the disk as the
    database dies, before the answer. The pusher pushes that step again, so it is acked later.)"""
    cols = httpx.get(f"{url}/v1/runs/{run_id}/metrics", params={"fields": "loss"}, timeout=30).json()["columns"]
    stored = list(zip(cols["rank"], cols["step"]))
    if len(stored) != len(set(stored)):
        return f"{len(stored) - len(set(stored))} records stored twice"
    lost = set(acked) - set(stored)
    return f"{len(lost)} acknowledged records lost, e.g. {sorted(lost)[:5]}" if lost else None
