"""``healthsvc supervise``: run a training under the service's decisions.

    healthsvc supervise --run-id RUN [--url URL] [--max-restarts 3] [--grace-s 30]
        [--health-check CMD] [--poll-s 2] [--world-size N]
        -- torchrun ... train.py --resume {checkpoint} --exclude {exclude_hosts} --nproc {world_size}

It starts the command in its own process group and asks ``GET /v1/runs/{run}/action`` every
``--poll-s`` seconds (and at once when the job exits). On ``restart`` it sends SIGTERM to the
group, SIGKILL after ``--grace-s``, runs ``--health-check`` once per host the answer leaves out (a
host whose check exits 0 is taken back; ``{host}`` in the check is replaced, else the host is its
last argument), posts the answer's event (``POST .../events``: the timeline, the budget and the
cool-down read it), substitutes the placeholders and starts the command again. On ``stop`` it
stops the job and exits 3 with the reason. A job that exits non-zero is reported (``?exited=``)
and restarted when the answer says so (a crash, within the same budget); a job that exits 0 ends
the supervisor with 0.

The service unreachable is never a reason to touch the job: the supervisor says so once and keeps
watching; a crash while it is unreachable ends the supervisor with the job's status (it has no
checkpoint to choose). The placeholders are empty on the first start (``{world_size}``:
``--world-size``, else the run's from the service), so the job starts fresh.

Standard library only (``healthsvc.cli_http``), like the other client commands. One line per
decision on stderr, prefixed ``healthsvc supervise:``.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

from healthsvc.cli import command
from healthsvc.cli_http import OK, UNREACHABLE, add_url_arg, call

STOPPED = 3                 # exit status when the service says stop (or the local budget is spent)
ACTION_TIMEOUT_S = 10.0     # one question may not hold the watch loop longer than this
PLACEHOLDERS = ("{checkpoint}", "{exclude_hosts}", "{world_size}")


def say(text: str) -> None:
    print(f"healthsvc supervise: {text}", file=sys.stderr, flush=True)


@dataclass
class Job:
    """The supervised command: the template and the running process group."""
    template: list[str]
    proc: subprocess.Popen | None = None
    values: dict[str, str] = field(default_factory=lambda: dict.fromkeys(PLACEHOLDERS, ""))

    def argv(self) -> list[str]:
        out = []
        for arg in self.template:
            for name, value in self.values.items():
                arg = arg.replace(name, value)
            out.append(arg)
        return out

    def start(self) -> None:
        # Its own session, so one signal reaches torchrun and every rank it started.
        self.proc = subprocess.Popen(self.argv(), start_new_session=True)

    def started(self) -> subprocess.Popen:
        """The process :meth:`start` started."""
        if self.proc is None:
            raise RuntimeError("the job was not started")
        return self.proc

    def stop(self, grace_s: float) -> None:
        """SIGTERM to the group, SIGKILL to what is left after ``grace_s``; returns once the
        leader is reaped and no member of the group is left."""
        if self.proc is None:
            return
        pgid = self.proc.pid
        _signal_group(pgid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=0.1)
            if self.proc.poll() is not None and not _group_alive(pgid):
                return
        _signal_group(pgid, signal.SIGKILL)
        self.proc.wait()
        for _ in range(100):      # members are gone once the kernel has delivered SIGKILL
            if not _group_alive(pgid):
                return
            time.sleep(0.05)


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Service:
    """The service as the supervisor sees it: answers, or None while it cannot answer (said once
    per kind of trouble, not once per question)."""

    def __init__(self, url: str, run_id: str) -> None:
        self.url, self.run_id = url, run_id
        self.trouble: str | None = None

    def ask(self, method: str, path: str, body: dict | None = None,
            quiet_404: bool = False) -> dict | None:
        # ``call`` prints every failure; the supervisor says an outage once and keeps watching.
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            answer, rc = call(method, self.url, f"/v1/runs/{self.run_id}{path}", body,
                              timeout_s=ACTION_TIMEOUT_S)
        message = err.getvalue().strip().removeprefix("healthsvc: ")
        if rc == OK:
            if self.trouble is not None:
                say(f"the service at {self.url} answers again")
            self.trouble = None
            return answer
        if quiet_404 and message.startswith("404"):
            return None          # the run is created by the job's first push
        kind = "unreachable" if rc == UNREACHABLE else message
        if kind != self.trouble:
            say(f"{message}; the job is left running, still watching")
        self.trouble = kind
        return None

    def action(self, exited: int | None = None) -> dict | None:
        return self.ask("GET", "/action" + ("" if exited is None else f"?exited={exited}"),
                        quiet_404=exited is None)


def health_check(template: str, host: str, timeout_s: float) -> bool:
    """True when the check of ``host`` exits 0 within ``timeout_s``."""
    argv = shlex.split(template)
    argv = [a.replace("{host}", host) for a in argv] if "{host}" in template else [*argv, host]
    try:
        return subprocess.run(argv, timeout=timeout_s, stdin=subprocess.DEVNULL,
                              check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


class Supervisor:
    def __init__(self, args: argparse.Namespace, job: Job) -> None:
        self.args, self.job = args, job
        self.service = Service(args.url, args.run_id)
        self.restarts = 0
        self.last_decision: tuple | None = None

    def run(self) -> int:
        self.job.values["{world_size}"] = self._initial_world_size()
        self.job.start()
        say(f"started {shlex.join(self.job.argv())} (pid {self.job.started().pid})")
        while True:
            rc = self._wait(self.args.poll_s)
            if rc == 0:
                say("the job finished (exit status 0)")
                return 0
            answer = self.service.action(exited=rc)
            if answer is None:
                if rc is None:
                    continue
                say(f"the job exited with status {rc} and the service gave no answer to choose a "
                    "checkpoint by; giving up")
                return rc
            self._progress(answer)
            if answer["action"] == "stop":
                self.job.stop(self.args.grace_s)
                say(f"stopped ({answer['reason']}): {answer['message']}")
                return STOPPED
            if answer["action"] == "restart":
                if self.restarts >= self.args.max_restarts:
                    self.job.stop(self.args.grace_s)
                    say(f"stopped (max_restarts): --max-restarts {self.args.max_restarts} is spent, "
                        f"so the service's restart is not carried out: {answer['message']}")
                    return STOPPED
                self._restart(answer)
            elif rc is not None:
                if answer["reason"] == "cooling_down":
                    time.sleep(min(answer["retry_after_s"] or self.args.poll_s, self.args.poll_s))
                    continue
                say(f"the job exited with status {rc}: {answer['message']}")
                return rc

    def _wait(self, timeout_s: float) -> int | None:
        try:
            return self.job.started().wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def _initial_world_size(self) -> str:
        if self.args.world_size is not None:
            return str(self.args.world_size)
        run = self.service.ask("GET", "", quiet_404=True)
        size = None if run is None else run.get("world_size")
        return "" if size is None else str(size)

    def _progress(self, answer: dict) -> None:
        """One line per decision: printed when the action or its reason changes (a restart and a
        stop say theirs once carried out)."""
        decision = (answer["action"], answer["reason"])
        if decision != self.last_decision and answer["action"] == "continue":
            say(f"{answer['action']} ({answer['reason']}): {answer['message']}")
        self.last_decision = decision

    def _restart(self, answer: dict) -> None:
        self.job.stop(self.args.grace_s)
        ckpt, world = answer["checkpoint"], answer["world_size"]
        out = list(answer["exclude_hosts"])
        if self.args.health_check:
            for host in list(out):
                if health_check(self.args.health_check, host, self.args.grace_s):
                    out.remove(host)
                    say(f"health check of {host} passed: it is taken back")
                else:
                    say(f"health check of {host} failed: it stays out")
        old = world["old"]
        new = None if old is None else old - sum(len(world["ranks_by_host"].get(h, ())) for h in out)
        self.restarts += 1
        event = answer["event"]
        event["data"].update(exclude_hosts=out, world_size={"old": old, "new": new})
        self.service.ask("POST", "/events", event)
        if old is not None and new is not None and new != old:
            self.service.ask("POST", "/events", {"kind": "world_size_change", "step": ckpt["step"],
                                                  "data": {"old": old, "new": new,
                                                           "reason": "hosts left out: " + ", ".join(out)}})
        self.job.values.update({"{checkpoint}": ckpt["uri"], "{exclude_hosts}": ",".join(out),
                                "{world_size}": "" if new is None else str(new)})
        back = sorted(set(answer["exclude_hosts"]) - set(out))
        taken_back = f" Taken back after their health check: {', '.join(back)}." if back else ""
        sizes = f" World size {old} -> {new}." if new != old else ""
        say(f"restart {self.restarts}/{self.args.max_restarts} ({answer['reason']}): "
            f"{answer['message']}{taken_back}{sizes} Checkpoint: {ckpt['uri']}")
        self.job.start()
        self.last_decision = None


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run-id", required=True, help="the run the job reports to")
    add_url_arg(p)
    p.add_argument("--max-restarts", type=int, default=3,
                   help="restarts this supervisor performs at most (the run's own budget, "
                        "supervise.max_restarts, also holds; the lower wins; default %(default)s)")
    p.add_argument("--grace-s", type=float, default=30.0,
                   help="seconds between SIGTERM and SIGKILL to the job's process group; also "
                        "the time a health check may take (default %(default)s)")
    p.add_argument("--health-check", metavar="CMD",
                   help="command run per host a restart would leave out ({host} is replaced, else "
                        "the host is appended); exit 0 takes the host back")
    p.add_argument("--poll-s", type=float, default=2.0,
                   help="seconds between two questions to the service (default %(default)s)")
    p.add_argument("--world-size", type=int,
                   help="{world_size} on the first start (default: the run's, from the service)")
    p.add_argument("cmd", nargs=argparse.REMAINDER,
                   help="-- then the training command, with {checkpoint}, {exclude_hosts} and "
                        "{world_size} where a restart puts its values")


def supervise(args: argparse.Namespace) -> int:
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        say("no command to supervise: put it after --")
        return 2
    if args.poll_s <= 0 or args.grace_s < 0 or args.max_restarts < 0:
        say("--poll-s must be > 0, --grace-s and --max-restarts >= 0")
        return 2
    sup = Supervisor(args, Job(cmd))

    def _terminate(signum, frame):   # the supervisor's own stop (scancel, Ctrl-C) stops the job
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, _terminate)
    try:
        return sup.run()
    except KeyboardInterrupt:
        say("interrupted: stopping the job")
        sup.job.stop(args.grace_s)
        return 130


supervise.add_arguments = _args  # type: ignore[attr-defined]
command("supervise", "run a training command, restarting it from the right checkpoint without "
                     "the bad hosts when the service says so")(supervise)
