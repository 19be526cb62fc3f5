"""Soak: a simulated job for N minutes against replicas on PostgreSQL, with faults on a schedule,
replicas killed and restarted and the webhook receiver flapping; then the invariants.

The job is ``--ranks`` ranks pushing through a per-host relay (8 ranks a host: one columnar push
per host and step, as ``bench/scale.py`` does) through nginx to ``--replicas`` replicas (real
``healthsvc serve`` processes, one fresh PostgreSQL database). The job runs as a sequence of
episodes, each a run of its own (``soak-0``, ``soak-1``, ... : a job restarted from scratch) of
``--episode-steps`` steps built by :func:`simulation.simulate_run`, with one fault two thirds of
the way in, in turn: a NaN (rank r's loss and local gradient norm), a loss spike (every rank, x3
for ten steps), a straggler (rank r computes 2x slower from then on) and a hang (rank r stops
pushing until the episode ends). An episode ends with ``finish`` (silence after it is normal).

Meanwhile: every ``--kill-every`` seconds one replica other than the first is SIGKILLed and
started again ``--down`` seconds later on its port (so the first replica lives the whole run and
its memory is a clean series); every ``--flap-every`` seconds the receiver is down for
``--flap-down`` seconds (the outbox retries; pages must arrive once it is back).

At the end (after the outbox has nothing pending), what must hold:

- every fault found once: one firing finding of the injected kind at or after the fault's step
  per episode (others are reported as "other findings");
- every page delivered at least once, with a stable id: every outbox row's webhook-id reached the
  receiver with a 2xx, every fault whose finding is a warning or worse was paged (info findings
  are recorded, never paged), and one notification body never arrived
  under two ids (a receiver deduplicating on webhook-id sees each page once);
- memory flat after warm-up (runs of 10 minutes or more): the RSS (from /proc) of every server
  process that lived through the last two thirds of the run (after at least its first minute) grew
  less than 5 % over them;
- 0 acknowledged records lost: every (run, step, rank) acknowledged with a 202 is read back;
- finished runs let go: after the last episode and ``--release-after`` (plus the release pass),
  no replica holds a run's detector state, ingest state or dashboard rollups
  (``healthsvc_runs_held`` on /metrics: a count, which a short run can check where RSS cannot).

    .venv/bin/python bench/soak.py [--minutes 30] [--ranks 1024] [--replicas 3] [--smoke]
        [--faults hang] [--log-dir DIR] [--keep-db] [--server-log-level info] [--memtrace DIR]

To find what goes wrong: ``--faults hang`` injects one kind only (five hangs in an 8-minute run);
``--log-dir`` and ``--keep-db`` keep the replicas' logs and the database; ``--memtrace`` has replica 0
write its memory from inside (``bench/memtrace/sitecustomize.py``: pymalloc arenas and live
blocks, malloc, objects by type, stage queues; tracemalloc diffs unless
``HEALTHSVC_BENCH_MEMTRACE_FRAMES=0``, at a large cost in CPU). A missed hang is reported with what
the run's last saved hang detector state says of its rank (silence, push interval, timeout).

Exit status 1 when an invariant does not hold. ``--smoke`` (the tests): a few seconds, 16 ranks.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from simulation import LossSpike, NonFinite, Straggler, simulate_run  # noqa: E402
from tests.alerting.receiver import Receiver  # noqa: E402
from tests.pg import fresh_database  # noqa: E402
from tests.replicas.balancer import Balancer  # noqa: E402
from tests.server_process import ServerProcess, free_port  # noqa: E402

FIELDS = ("loss", "grad_norm", "local_grad_norm", "step_time", "compute_time", "comm_time")
FAULTS = ("non_finite", "loss_spike", "straggler", "hang")
PER_HOST = 8
HANG_S = 5.0
PUSH_GIVE_UP_S = 60.0      # a push not acknowledged within this is counted as not acknowledged
# The holders (healthsvc_runs_held) that must hold nothing of a finished run after the release window.
HELD_PER_RUN = ("monitor_monitors", "store_run_states", "dashboard_feeds")


def wire(x: float) -> float | str:
    """JSON has no NaN: the wire contract's string forms for non-finite values."""
    if math.isfinite(x):
        return x
    return "NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity")


@dataclass
class Episode:
    index: int
    run_id: str
    kind: str
    step: int        # the fault's first step
    rank: int
    block: object    # simulation StepBlock
    hosts: list[np.ndarray]

    def body(self, local_step: int, ranks: np.ndarray) -> bytes | None:
        if self.kind == "hang" and local_step >= self.step:
            ranks = ranks[ranks != self.rank]
            if not len(ranks):
                return None
        cols: dict[str, list] = {"step": [local_step] * len(ranks), "rank": ranks.tolist()}
        for f in FIELDS:
            cols[f] = [wire(float(v)) for v in self.block.values[f][local_step, ranks]]
        cols["host"] = [f"node{r // PER_HOST:04d}" for r in ranks.tolist()]
        cols["incarnation"] = [f"{self.run_id}-p{r}" for r in ranks.tolist()]
        return orjson.dumps({"columns": cols})


def make_episode(k: int, ranks: int, steps: int, faults: tuple[str, ...] = FAULTS) -> Episode:
    kind = faults[k % len(faults)]
    rng = np.random.default_rng(1000 + k)
    step, rank = (2 * steps) // 3, int(rng.integers(ranks))
    fault = {"non_finite": NonFinite(step=step, rank=rank, in_loss=True),
             # Lasting (longer than the detector's 5 confirming steps): a warning, which pages; a
             # spike that recovers at once is an info finding, recorded and never paged.
             "loss_spike": LossSpike(step=step, factor=3.0, duration=10),
             "straggler": Straggler(step=step, rank=rank, factor=2.0)}.get(kind)
    sim = simulate_run(n_steps=steps, n_ranks=ranks, seed=k, faults=[fault] if fault else [], warmup_steps=10)
    hosts = [np.arange(i, min(i + PER_HOST, ranks)) for i in range(0, ranks, PER_HOST)]
    return Episode(k, f"soak-{k}", kind, step, rank, sim.block, hosts)


@dataclass
class Ledger:
    """What the job had acknowledged: run -> set of (step, rank); counts of pushes."""
    acked: dict[str, set] = field(default_factory=lambda: defaultdict(set))
    pushes: int = 0
    retries: int = 0
    given_up: int = 0
    latencies: list[float] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class Job:
    """The simulated job: ``workers`` threads share the hosts and step in lockstep, as a
    data-parallel job does (its all-reduce waits for every rank): a barrier after each step, so no
    worker's ranks start step g+1 before every rank pushed step g, and a step clock at
    ``step_rate`` (a step late under load delays every rank alike). Episodes follow one another,
    each created (PUT) before its first push and finished once every rank pushed its last step.

    (Workers on their own clocks drift apart under a load near 30: one that pushed a run's last
    step while the others were still more than the hang timeout behind is a hang by the
    detector's definition, ranks silent while their peers progress, which no synchronous job
    shows: 256 such hangs in one soak.)"""

    def __init__(self, url: str, ranks: int, steps: int, step_rate: float, workers: int, ledger: Ledger,
                 faults: tuple[str, ...] = FAULTS) -> None:
        self.url, self.ranks, self.steps, self.step_rate, self.workers = url, ranks, steps, step_rate, workers
        self.faults = faults
        self.ledger = ledger
        self.episodes: dict[int, Episode] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.barrier = threading.Barrier(workers)

    def episode(self, k: int, http: httpx.Client) -> Episode:
        with self.lock:
            if k not in self.episodes:
                ep = make_episode(k, self.ranks, self.steps, self.faults)
                config = {"world_size": self.ranks,
                          "detectors": {"hang": {"timeout_floor_s": HANG_S, "startup_timeout_s": 30.0}}}
                self._until_ok(http, "PUT", f"/v1/runs/{ep.run_id}", orjson.dumps(config))
                self.episodes[k] = ep
            return self.episodes[k]

    def _until_ok(self, http: httpx.Client, method: str, path: str, content: bytes) -> bool:
        """Send until a 2xx (the same body every time: a re-sent push is recognised), or give up."""
        deadline = time.monotonic() + PUSH_GIVE_UP_S
        first = True
        while time.monotonic() < deadline:
            if not first:
                self.ledger.retries += 1
                time.sleep(0.2)
            first = False
            try:
                if 200 <= http.request(method, path, content=content).status_code < 300:
                    return True
            except httpx.HTTPError:
                pass
        return False

    def worker(self, w: int, start: float, total_steps: int) -> None:
        done = False
        try:
            self._steps(w, start, total_steps)
            done = not self.stop.is_set()
        finally:
            if not done:              # a worker that stops (or fails) releases the others' wait
                self.barrier.abort()

    def _steps(self, w: int, start: float, total_steps: int) -> None:
        with httpx.Client(base_url=self.url, timeout=30, headers={"content-type": "application/json"}) as http:
            for g in range(total_steps):
                if self.stop.is_set():
                    break
                pause = start + g / self.step_rate - time.perf_counter()
                if pause > 0:
                    time.sleep(pause)
                ep = self.episode(g // self.steps, http)
                local = g % self.steps
                for ranks in ep.hosts[w::self.workers]:
                    body = ep.body(local, ranks)
                    if body is None:
                        continue
                    t0 = time.perf_counter()
                    ok = self._until_ok(http, "POST", f"/v1/runs/{ep.run_id}/metrics", body)
                    with self.ledger.lock:
                        self.ledger.pushes += 1
                        if ok:
                            self.ledger.latencies.append(time.perf_counter() - t0)
                            sent = ranks[ranks != ep.rank] if ep.kind == "hang" and local >= ep.step else ranks
                            self.ledger.acked[ep.run_id].update((local, int(r)) for r in sent)
                        else:
                            self.ledger.given_up += 1
                try:
                    self.barrier.wait()          # every rank pushed step g before any pushes g+1
                except threading.BrokenBarrierError:
                    break
                if local == self.steps - 1 and w == 0:
                    self._until_ok(http, "POST", f"/v1/runs/{ep.run_id}/finish", b"{}")

    def run(self, seconds: float) -> int:
        total = max(self.steps, int(seconds * self.step_rate) // self.steps * self.steps)  # whole episodes
        start = time.perf_counter()
        threads = [threading.Thread(target=self.worker, args=(w, start, total), daemon=True) for w in range(self.workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return total // self.steps


class FlappingReceiver:
    """The webhook receiver on a fixed port, taken down and brought back on cue; every request
    any of its lives saw is kept."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/hook"
        self.lives: list[Receiver] = []
        self.current: Receiver | None = None
        self.flaps = 0

    def up(self) -> None:
        self.current = Receiver(port=self.port).__enter__()
        self.lives.append(self.current)

    def down(self) -> None:
        if self.current:
            self.current.__exit__(None, None, None)
            self.current = None

    def delivered(self) -> list:
        return [r for life in self.lives for r in life.delivered()]


class RssSampler:
    """RSS of the server processes, from /proc/<pid>/status, every ``every`` seconds: pid ->
    [(t, bytes)]."""

    def __init__(self, servers: list[ServerProcess], every: float) -> None:
        self.servers, self.every = servers, every
        self.samples: dict[int, list[tuple[float, int]]] = defaultdict(list)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(self.every):
            now = time.monotonic()
            for s in self.servers:
                pid = s.pid
                try:
                    with open(f"/proc/{pid}/status") as f:
                        kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
                except (OSError, StopIteration, TypeError):
                    continue
                self.samples[pid].append((now, kb * 1024))


START_S = 120.0   # a replica's start on the loaded machine (restoring what it owns) may take a while


def start_again(s: ServerProcess, i: int, clock, log: list[str], stop: threading.Event | None = None) -> None:
    """Start a killed replica again, trying until it is ready (a start that times out is logged
    and tried again: the chaos must go on, and the read-back needs every replica)."""
    while stop is None or not stop.is_set():
        try:
            s.start(timeout_s=START_S)
            log.append(f"{clock():7.1f} s: replica {i} started again")
            return
        except (TimeoutError, RuntimeError) as exc:
            log.append(f"{clock():7.1f} s: replica {i} did not start ({type(exc).__name__}); trying again")


def chaos(servers: list[ServerProcess], receiver: FlappingReceiver, args, stop: threading.Event, log: list[str]) -> None:
    """Replica kills and receiver flaps on their own clocks until ``stop``."""
    t0 = time.monotonic()
    next_kill, next_flap, victim = args.kill_every, args.flap_every, 0
    while not stop.wait(0.2):
        now = time.monotonic() - t0
        if len(servers) > 1 and now >= next_kill:
            s = servers[1 + victim % (len(servers) - 1)]
            victim += 1
            s.kill()
            log.append(f"{now:7.1f} s: replica {servers.index(s)} SIGKILLed")
            if not stop.wait(args.down):
                start_again(s, servers.index(s), lambda: time.monotonic() - t0, log, stop)
            next_kill = now + args.kill_every
        if now >= next_flap:
            receiver.down()
            receiver.flaps += 1       # (not the final shutdown)
            log.append(f"{now:7.1f} s: receiver down")
            stop.wait(args.flap_down)
            receiver.up()
            log.append(f"{time.monotonic() - t0:7.1f} s: receiver up")
            next_flap = now + args.flap_every


def runs_held(url: str) -> dict[str, int]:
    """A replica's ``healthsvc_runs_held`` gauge (/metrics), by holder."""
    out: dict[str, int] = {}
    try:
        text = httpx.get(url + "/metrics", timeout=30).text
    except httpx.HTTPError:
        return out
    for line in text.splitlines():
        if line.startswith("healthsvc_runs_held{"):
            holder = line.split('holder="', 1)[1].split('"', 1)[0]
            out[holder] = int(float(line.rsplit(" ", 1)[1]))
    return out


def allocator_figures(url: str) -> dict[str, float]:
    """A replica's C allocator figures (``healthsvc_malloc_*`` on /metrics: healthsvc.ops.allocator)."""
    try:
        text = httpx.get(url + "/metrics", timeout=30).text
    except httpx.HTTPError:
        return {}
    return {name: float(value) for name, value in
            (line.split(" ", 1) for line in text.splitlines() if line.startswith("healthsvc_malloc_"))}


def watch_metrics(url: str, path: Path, stop: threading.Event, every: float = 20.0) -> None:
    """--memtrace: replica 0's runs held and allocator figures every ``every`` seconds, one JSON line each."""
    t0 = time.monotonic()
    while not stop.wait(every):
        line = {"t": round(time.monotonic() - t0, 1), **runs_held(url), **allocator_figures(url)}
        with open(path, "a") as f:
            f.write(json.dumps(line) + "\n")


def hang_view(dsn: str, ep: Episode) -> str:
    """What the run's last saved hang detector state says of the hung rank (why a hang was or was
    not found): its last step, its silence until the run's last record, its push interval and the
    timeout that follows (the detector's defaults: 10 intervals, at least the soak's floor)."""
    import psycopg
    with psycopg.connect(dsn) as conn:
        snap = conn.execute("SELECT state FROM run_state WHERE run_id=%s AND kind='monitor'", (ep.run_id,)).fetchone()
        last = conn.execute("SELECT max(received_at) FROM chunks WHERE run_id=%s", (ep.run_id,)).fetchone()[0]
    if snap is None:
        return "no monitor snapshot"
    from healthsvc.monitor.hub import _load_state   # the snapshot as the service stores it (compressed)
    from healthsvc_detectors.stats.state_json import array_from_json
    state = _load_state(bytes(snap[0]))
    hang = state["detectors"].get("hang")
    if not hang:
        return "no hang detector in the state"
    ids = array_from_json(hang["ids"], np.dtype(np.int64)).tolist()
    if ep.rank not in ids:
        return "the rank is not in the hang detector's state"
    j = ids.index(ep.rank)

    def of_rank(name: str) -> float:   # a per-rank array, as a list or as bytes (stats.state_json)
        return float(array_from_json(hang[name], np.dtype(np.float64))[j])

    interval = of_rank("interval_s")
    timeout = max(HANG_S, 10 * interval)
    return (f"last snapshot: rank's last step {of_rank('last_step'):.0f}, silent {last - of_rank('progress_s'):.1f} s "
            f"until the run's last record, push interval {interval:.2f} s (timeout {timeout:.1f} s), hung "
            f"{bool(of_rank('hung'))}, stalled {hang['stalled']}, finished {state['finished']}")


def outbox(dsn: str) -> list[tuple[str, str]]:
    import psycopg
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT webhook_id, state FROM alert_outbox").fetchall()


def settle(dsn: str, receiver: FlappingReceiver, timeout_s: float) -> bool:
    """Wait (bounded) until the outbox has nothing pending and every row reached the receiver."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        rows = outbox(dsn)
        got = {r.headers.get("webhook-id") for r in receiver.delivered()}
        if rows and all(state != "pending" for _, state in rows) and {w for w, _ in rows} <= got:
            return True
        time.sleep(0.5)
    return False


def rss_growth(samples: list[tuple[float, int]], window: tuple[float, float], slack: float) -> float | None:
    """RSS growth over ``window`` (monotonic seconds): the median of the last tenth of the samples
    in it over the median of the first tenth, minus one; None when the process did not live
    through the whole window."""
    lo, hi = window
    inside = [b for t, b in samples if lo <= t <= hi]
    if not samples or samples[0][0] > lo + slack or samples[-1][0] < hi - slack or len(inside) < 4:
        return None
    n = max(1, len(inside) // 10)
    return float(np.median(inside[-n:]) / np.median(inside[:n]) - 1.0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--replicas", type=int, default=3, help="3: nginx's shipped config names three")
    ap.add_argument("--step-rate", type=float, default=0.0,
                    help="steps per second (0: 128 host pushes a second, at most 4 steps a second)")
    ap.add_argument("--episode-steps", type=int, default=90,
                    help="steps of a run (the fault at two thirds: after the detectors' 50-step warm-up)")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--kill-every", type=float, default=90.0, help="seconds between replica kills")
    ap.add_argument("--down", type=float, default=10.0, help="seconds a killed replica stays down")
    ap.add_argument("--flap-every", type=float, default=75.0, help="seconds between receiver outages")
    ap.add_argument("--flap-down", type=float, default=15.0, help="seconds the receiver stays down")
    ap.add_argument("--release-after", type=float, default=30.0,
                    help="seconds a finished run stays in memory without input (run_release_after_s)")
    ap.add_argument("--faults", default=",".join(FAULTS),
                    help="the faults injected, in turn, comma-separated (e.g. hang: every episode a hang)")
    ap.add_argument("--log-dir", type=Path, default=None, help="keep the replicas' logs here (default: dropped)")
    ap.add_argument("--memtrace", type=Path, default=None,
                    help="replica 0 writes a memory timeline and tracemalloc diffs here (bench/memtrace)")
    ap.add_argument("--keep-db", action="store_true",
                    help="keep the PostgreSQL database afterwards (its name is printed) to read what was stored")
    ap.add_argument("--server-log-level", default="warning", help="the replicas' --log-level (info: leases, restores)")
    ap.add_argument("--smoke", action="store_true", help="a few seconds, 16 ranks: proves it runs (tests)")
    args = ap.parse_args()
    if args.smoke:
        args.minutes, args.ranks, args.step_rate, args.episode_steps, args.workers = 0.2, 16, 8.0, 24, 2
        args.kill_every, args.down, args.flap_every, args.flap_down = 4.0, 1.0, 3.0, 1.0
        args.release_after = 2.0
    if args.step_rate <= 0:
        args.step_rate = min(4.0, 128 * PER_HOST / args.ranks)
    seconds = args.minutes * 60
    faults = tuple(f.strip() for f in args.faults.split(",") if f.strip())
    if not faults or set(faults) - set(FAULTS):
        ap.error(f"--faults: some of {', '.join(FAULTS)}")

    ledger, events = Ledger(), []
    receiver = FlappingReceiver()
    receiver.up()
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="hs-soak-") as tmp:
        if args.keep_db:
            from tests.pg import ADMIN_URI, database_uri
            import psycopg
            dsn = database_uri(f"hs_soak_{int(time.time())}")
            with psycopg.connect(ADMIN_URI, autocommit=True) as admin:
                admin.execute(f"CREATE DATABASE {dsn.rsplit('/', 1)[1]}")
            print("database kept:", dsn, flush=True)
        else:
            dsn = stack.enter_context(fresh_database())
        env = {"HEALTHSVC_LEASE_TTL_S": "2", "HEALTHSVC_SNAPSHOT_EVERY_S": "1",
               "HEALTHSVC_WEBHOOK_ALLOWED_NETWORKS": "127.0.0.0/8", "HEALTHSVC_ALERT_RETRY_CAP_S": "5",
               # Every group sent within a second of its first finding and of each change: a loss spike
               # (a warning) resolves within seconds, before the default group wait would send it.
               # Critical keeps its default wait of 0: its page is enqueued in the job that stores the
               # finding. (With a wait, a critical alert that resolves before its group's first flush
               # is never sent, by design: a hang found late, after a takeover, and resolved by the
               # run's finish within the wait was stored and never paged.)
               "HEALTHSVC_ALERT_TIMINGS": json.dumps({s: {"group_wait_s": 1.0, "group_interval_s": 1.0}
                                                      for s in ("info", "warning")}),
               "HEALTHSVC_RUN_RELEASE_AFTER_S": str(args.release_after),
               "HEALTHSVC_ALERT_WEBHOOKS": json.dumps([{"id": "soak", "url": receiver.url, "format": "json"}])}
        logs = Path(tmp)
        if args.log_dir:
            logs = args.log_dir
            logs.mkdir(parents=True, exist_ok=True)
        envs = [env] * args.replicas
        if args.memtrace:
            # Replica 0 (never killed) traces its memory from inside: bench/memtrace/sitecustomize.py.
            args.memtrace.mkdir(parents=True, exist_ok=True)
            path = [str(ROOT / "bench" / "memtrace"), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
            envs[0] = {**env, "HEALTHSVC_BENCH_MEMTRACE": str(args.memtrace.resolve()), "PYTHONPATH": os.pathsep.join(path)}
        servers = [ServerProcess(dsn, env=envs[i], log_path=logs / f"replica{i}.log",
                                 extra_args=["--log-level", args.server_log_level]) for i in range(args.replicas)]
        for s in servers:
            s.start()              # one at a time: the first migrates the fresh database
            stack.callback(s.stop)
        ports = [s.port for s in servers]
        lb = Balancer(Path(tmp) / "nginx", free_port(), (ports * 3)[:3]).start()
        stack.callback(lb.stop)
        stack.callback(receiver.down)

        rss = RssSampler(servers, every=max(0.5, seconds / 300))
        rss.thread.start()
        stop = threading.Event()
        chaos_thread = threading.Thread(target=chaos, args=(servers, receiver, args, stop, events), daemon=True)
        job = Job(lb.url, args.ranks, args.episode_steps, args.step_rate, args.workers, ledger, faults)
        if args.memtrace:
            threading.Thread(target=watch_metrics, args=(servers[0].url, args.memtrace / "metrics.jsonl", stop),
                             daemon=True).start()
        t_start = time.monotonic()
        chaos_thread.start()
        n_episodes = job.run(seconds)
        t_end = time.monotonic()
        stop.set()
        chaos_thread.join(60)
        rss.stop.set()
        rss.thread.join(10)
        if receiver.current is None:
            receiver.up()
        for i, s in enumerate(servers):   # every replica up for the read-back and the outbox to drain
            if s.proc.poll() is not None:
                start_again(s, i, lambda: time.monotonic() - t_start, events)
        settled = settle(dsn, receiver, timeout_s=60 if not args.smoke else 30)
        # Per-run state held at the end, once the last run had time to be let go (a count: RSS over
        # a short run says nothing).
        time.sleep(args.release_after + 15.0)   # the store's release pass runs every 10 s at most
        held = {i: runs_held(s.url) for i, s in enumerate(servers)}
        malloc = {i: allocator_figures(s.url) for i, s in enumerate(servers)}

        http = stack.enter_context(httpx.Client(base_url=lb.url, timeout=120))
        findings, lost, acked_total = {}, 0, 0
        for k, ep in sorted(job.episodes.items()):
            findings[k] = http.get(f"/v1/runs/{ep.run_id}/findings", params={"limit": 100_000}).json()
            cols = http.get(f"/v1/runs/{ep.run_id}/metrics", params={"fields": "loss"}).json()["columns"]
            have = set(zip(cols["step"], cols["rank"]))
            lost += len(ledger.acked[ep.run_id] - have)
            acked_total += len(ledger.acked[ep.run_id])
        rows = outbox(dsn)
        hang_views = {ep.run_id: hang_view(dsn, ep) for ep in job.episodes.values() if ep.kind == "hang"}

    # --- invariants
    delivered = receiver.delivered()
    by_id = {r.headers.get("webhook-id") for r in delivered}
    ids_by_body: dict[str, set] = defaultdict(set)
    paged: set[tuple[str, str]] = set()
    for r in delivered:
        ids_by_body[hashlib.sha256(r.body).hexdigest()].add(r.headers.get("webhook-id"))
        doc = json.loads(r.body)
        for a in doc.get("alerts", []):
            if a.get("status") == "firing":
                paged.add((doc.get("run"), a.get("kind")))
    undelivered = [w for w, _ in rows if w not in by_id]
    two_ids = sum(len(ids) > 1 for ids in ids_by_body.values())

    per_kind: dict[str, Counter] = defaultdict(Counter)
    delays: dict[str, list[float]] = defaultdict(list)
    others: Counter = Counter()
    misses: list[str] = []
    other_list: list[str] = []
    for k, ep in sorted(job.episodes.items()):
        firing = [f for f in findings[k] if f["status"] == "firing"]
        # Found: a finding of the fault's kind at or after its step. Once: no finding stored twice
        # (the same kind, step, metric and ranks: what a replica taking the run over would repeat);
        # a NaN shows on several metrics, each its own finding.
        hits = [f for f in firing if f["kind"] == ep.kind and f["step"] >= ep.step - 1]
        keys = Counter((f["kind"], f["step"], f.get("metric"), tuple(f["ranks"])) for f in firing)
        twice = sum(n > 1 for n in keys.values())
        c = per_kind[ep.kind]
        c["injected"] += 1
        c["findings"] += len(hits)
        c["missed" if not hits else ("found twice" if twice else "found once")] += 1
        # How long detection took: from the arrival of the input that raised the first finding of
        # the fault to its being stored (a takeover's replay shows here).
        first = min(hits, key=lambda f: f["id"], default=None)
        if first is not None and first.get("observed_at") is not None:
            delays[ep.kind].append(first["created_at"] - first["observed_at"])
        # Pages: findings of warning or worse (info is recorded, never paged).
        pages = any(f["severity"] in ("warning", "critical") for f in hits)
        c["paged"] += (ep.run_id, ep.kind) in paged
        c["to page"] += pages
        if not hits or twice or (pages and (ep.run_id, ep.kind) not in paged):
            misses.append(f"{ep.run_id} {ep.kind}@{ep.step} rank {ep.rank}: {len(hits)} findings, {twice} twice "
                          f"{[(f['kind'], f['step'], f['ranks']) for f in firing]}, paged {(ep.run_id, ep.kind) in paged}"
                          + (f"; {hang_views.get(ep.run_id)}" if ep.kind == "hang" else ""))
        for f in firing:
            if f not in hits:
                others[f["kind"]] += 1
                other_list.append(f"{ep.run_id} {f['kind']}@{f['step']} ranks {f['ranks']} ({ep.kind} episode)")

    # Warm-up: the first third, and at least the first minute of a short run (its first third
    # is over before the first episode has run every code path: caches still filling).
    warm = t_start + max((t_end - t_start) / 3, min(60.0, (t_end - t_start) / 2))
    growth = {pid: rss_growth(samples, (warm, t_end), 2 * rss.every) for pid, samples in rss.samples.items()}
    lived = {pid: g for pid, g in growth.items() if g is not None}

    lat = np.array(ledger.latencies) if ledger.latencies else np.array([np.nan])
    print(f"soak: {args.minutes:g} min, {args.ranks:,} ranks ({args.ranks // PER_HOST:,} hosts, one push per host and step) "
          f"at {args.step_rate:g} steps/s, {n_episodes} episodes of {args.episode_steps} steps, "
          f"{args.replicas} replicas on PostgreSQL behind nginx\n")
    print("| fault | injected | found once | found twice | missed | to page | paged | findings of the kind "
          "| detection s, median | detection s, max |\n"
          "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for kind in FAULTS:
        c = per_kind[kind]
        # A hang is found by a timer: no input raised it, so no delay is measured.
        d = np.array(delays[kind]) if delays[kind] else np.array([np.nan])
        print(f"| {kind} | {c['injected']} | {c['found once']} | {c['found twice']} | {c['missed']} | {c['to page']} | {c['paged']} "
              f"| {c['findings']} | {float(np.median(d)):.2f} | {float(np.max(d)):.2f} |")
    print("\n| other findings (not injected) | count |\n|---|---:|")
    for kind, n in sorted(others.items()) or [("none", 0)]:
        print(f"| {kind} | {n} |")
    print("\n| delivery | figure |\n|---|---:|")
    print(f"| outbox rows | {len(rows)} |\n| rows not delivered | {len(undelivered)} |"
          f"\n| deliveries received (2xx) | {len(delivered)} |\n| bodies seen under two ids | {two_ids} |"
          f"\n| receiver outages | {receiver.flaps} |\n| outbox settled | {int(settled)} |")
    print("\n| records | figure |\n|---|---:|")
    print(f"| pushes | {ledger.pushes:,} |\n| retried sends | {ledger.retries:,} |\n| given up | {ledger.given_up:,} |"
          f"\n| records acknowledged | {acked_total:,} |\n| acknowledged records lost | {lost:,} |"
          f"\n| push p50 ms | {1e3 * float(np.nanpercentile(lat, 50)):.1f} |\n| push p99 ms | {1e3 * float(np.nanpercentile(lat, 99)):.1f} |")
    print("\n| server process (pid) | RSS at warm-up MiB | RSS at end MiB | growth % over the last two thirds |\n|---|---:|---:|---:|")
    for pid, samples in sorted(rss.samples.items()):
        inside = [b for t, b in samples if t >= warm]
        g = growth[pid]
        if inside:
            print(f"| pid {pid}{'' if g is not None else ' (restarted within the window)'} | {inside[0] / 2**20:.1f} "
                  f"| {inside[-1] / 2**20:.1f} | {'' if g is None else f'{100 * g:.2f}'} |")
    holder_names = sorted({h for counts in held.values() for h in counts})
    print("\n| runs held in memory at the end | " + " | ".join(f"replica {i}" for i in held) + " |\n|---|"
          + "---:|" * len(held))
    for h in holder_names:
        print(f"| {h} | " + " | ".join(str(held[i].get(h, "")) for i in held) + " |")
    print(f"| episodes run | {n_episodes} |" + " |" * (len(held) - 1))
    print("\n| allocator at the end (MiB) | " + " | ".join(f"replica {i}" for i in malloc) + " |\n|---|" + "---:|" * len(malloc))
    for label, name in (("malloc holds", "healthsvc_malloc_held_bytes"), ("of it free", "healthsvc_malloc_free_bytes"),
                        ("given back by trims", "healthsvc_malloc_trimmed_bytes_total")):
        print(f"| {label} | " + " | ".join(f"{malloc[i].get(name, 0) / 2**20:.1f}" for i in malloc) + " |")
    for label, name in (("trims", "healthsvc_malloc_trims_total"), ("arenas", "healthsvc_malloc_arenas")):
        print(f"| {label} | " + " | ".join(f"{malloc[i].get(name, 0):.0f}" for i in malloc) + " |")
    print("\nother findings:", "; ".join(other_list) or "none")
    print("hang episodes, the detector's view:", "; ".join(f"{run}: {view}" for run, view in sorted(hang_views.items()))
          or "none")
    print("events:", "; ".join(e.strip() for e in events) or "none")

    failures = []
    if misses:
        failures.append("faults not found exactly once or not paged: " + " | ".join(misses))
    if undelivered or two_ids or not settled:
        failures.append(f"pages: {len(undelivered)} not delivered, {two_ids} bodies under two ids, settled {settled}")
    if lost or ledger.given_up:
        failures.append(f"records: {lost} acknowledged lost, {ledger.given_up} pushes given up")
    # Finished runs are let go: once every episode finished and the release window passed, no
    # replica holds a run's detector state, ingest state or dashboard rollups, whatever the number
    # of episodes. (A run whose latched alert still fires keeps its lease and alerts on its owner:
    # its reminders are owed; "monitor_parked" counts them.)
    kept = {i: {h: held[i].get(h, 0) for h in HELD_PER_RUN} for i in held}
    if any(any(counts.values()) for counts in kept.values()) or any(not counts for counts in held.values()):
        failures.append(f"per-run state still held after the release window: {held}")
    if not args.smoke and args.minutes >= 10 and (not lived or any(g >= 0.05 for g in lived.values())):
        failures.append(f"memory: growth {lived}")
    for f in failures:
        print("FAILED:", f)
    print("all invariants hold" if not failures else f"{len(failures)} invariant(s) broken")
    return 1 if failures and not args.smoke else 0


if __name__ == "__main__":
    raise SystemExit(main())
