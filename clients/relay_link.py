"""A rank's side of the per-host relay (``healthsvc_client.relay``): hand a metrics body to the relay and wait
until the relay says the service has it; fall back to posting it directly when the relay is
missing, dead, stalled or refused.

Runs on the rank's sender thread only (never the training thread). Every failure ends in the
direct path (:class:`healthsvc_client.delivery.Delivery`: retries, then the spool), so a relay can lose a
rank nothing and never raises into it; what it costs is bounded by ``timeout_s`` per phase
(prepared, then done) and the run's close deadline. After a failure the relay is not tried again
for ``retry_s``: a missing relay costs one failed ``connect`` per ``retry_s``, not per batch.
The protocol and why fallbacks stay exactly once: ``healthsvc_client.relay``.
"""
from __future__ import annotations

import json
import os
import socket
import time
from typing import Any

from healthsvc_client import encode
from healthsvc_client.delivery import Delivery


class RelayLink:
    """The connection from one rank's sender to the relay listening on ``socket_path``."""

    def __init__(self, socket_path: str, delivery: Delivery, *, timeout_s: float = 10.0,
                 retry_s: float = 2.0) -> None:
        self.socket_path = socket_path
        self.delivery = delivery
        self.timeout_s = timeout_s
        self.retry_s = retry_s
        self._sock: socket.socket | None = None
        self._buffer = b""
        self._next_try = 0.0
        self._close_cap: float | None = None   # see _limit

    def __repr__(self) -> str:
        return f"RelayLink({self.socket_path!r}, connected={self._sock is not None})"

    def deliver(self, path: str, body: dict[str, Any], n_records: int, urgent: bool) -> bool:
        """Deliver a ``{"batch_id", "records"}`` metrics body through the relay, or directly."""
        c = self.delivery.counters
        sock = self._connected()
        if sock is not None:
            message = {"id": body["batch_id"], "path": path, "records": body["records"], "urgent": urgent}
            try:
                sock.sendall(encode.encode_json(message) + b"\n")
            except (OSError, ValueError, TypeError) as exc:
                self._drop(f"relay {self.socket_path}: send failed: {exc!r}")
            else:
                try:
                    status, prepared = self._await(body["batch_id"])
                except Exception as exc:  # noqa: BLE001 - a bug here must not lose the batch
                    self._drop(f"relay {self.socket_path}: {exc!r}")
                    status, prepared = "lost", None
                if status == "done":
                    c.relayed_requests += 1
                    c.sent_records += n_records
                    return True
                c.relay_fallbacks += 1
                if status != "rejected" and prepared is not None:
                    return self._resend_prepared(path, prepared, body, n_records)
                # Never prepared (the relay never posted it), or refused whole: ours alone, our key.
                return self.delivery.deliver("POST", path, body, n_records)
        c.relay_fallbacks += 1
        return self.delivery.deliver("POST", path, body, n_records)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _connected(self) -> socket.socket | None:
        if self._sock is not None:
            return self._sock
        now = time.monotonic()
        if now < self._next_try:
            return None
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(1.0)
        try:
            sock.connect(self.socket_path)
        except OSError as exc:
            sock.close()
            self._next_try = now + self.retry_s
            self.delivery.problem("relay", f"relay {self.socket_path} unreachable, posting directly: {exc!r}")
            return None
        self._sock, self._buffer = sock, b""
        return sock

    def _drop(self, why: str) -> None:
        self.close()
        self._next_try = time.monotonic() + self.retry_s
        self.delivery.problem("relay", why + "; posting directly")

    def _await(self, batch_id: str) -> tuple[str, str | None]:
        """The relay's last word on ``batch_id``: ("done" | "rejected" | "failed" | "lost", the
        prepared body's file or None). "lost": the relay died, stalled or spoke nonsense."""
        prepared: str | None = None
        deadline = self._deadline()
        while True:
            line = self._read_line(deadline)
            if line is None:
                self._drop(f"relay {self.socket_path} went silent or away")
                return "lost", prepared
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if not isinstance(message, dict) or message.get("id") != batch_id:
                continue
            if "prepared" in message:
                prepared = str(message["prepared"])
                deadline = self._deadline()   # now the push: its own time
            elif message.get("status") in ("done", "rejected", "failed"):
                return message["status"], prepared

    def _deadline(self) -> float:
        return time.monotonic() + self.timeout_s

    def _limit(self, deadline: float) -> float:
        """``deadline``, cut short once the run closes: the relay may use half of the close
        budget left when the close was first seen, so the direct fallback keeps the other half."""
        close = self.delivery.deadline
        if close is not None and self._close_cap is None:
            now = time.monotonic()
            self._close_cap = now + max(0.0, close - now) / 2
        return deadline if self._close_cap is None else min(deadline, self._close_cap)

    def _read_line(self, deadline: float) -> bytes | None:
        sock = self._sock
        while sock is not None and b"\n" not in self._buffer:
            left = self._limit(deadline) - time.monotonic()
            if left <= 0:
                return None
            # In short slices: a close that begins meanwhile shortens the wait (see _limit).
            sock.settimeout(min(left, 0.25))
            try:
                chunk = sock.recv(1 << 16)
            except TimeoutError:
                continue
            except OSError:   # reset
                return None
            if not chunk:
                return None   # the relay closed: it died or stopped
            self._buffer += chunk
        if sock is None:
            return None
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line

    def _resend_prepared(self, path: str, file: str, own: dict[str, Any], n_records: int) -> bool:
        """Post the relay's body holding our records, under the relay's key (the service stores
        it once, whoever sends it). A missing file means its body was accepted, unless the
        relay left a tombstone (``<key>.rejected``: refused) or we cannot see its directory;
        an unreadable file, or a body the service refuses (another rank's bad record), makes us
        post our own records: twice is better than never."""
        try:
            with open(file, "rb") as fh:
                body = json.loads(fh.read())
        except FileNotFoundError:
            tombstone = file[: -len(".json")] + ".rejected" if file.endswith(".json") else None
            if os.path.isdir(os.path.dirname(file) or ".") and not (tombstone and os.path.exists(tombstone)):
                self.delivery.counters.sent_records += n_records
                return True
            return self.delivery.deliver("POST", path, own, n_records)
        except (OSError, ValueError) as exc:
            self.delivery.problem("relay_file", f"relay body {file} unreadable: {exc!r}")
            return self.delivery.deliver("POST", path, own, n_records)
        outcome = self.delivery.send("POST", path, body, n_records)
        if outcome == "rejected":
            return self.delivery.deliver("POST", path, own, n_records)
        if outcome in ("sent", "spooled"):
            try:
                os.unlink(file)
            except OSError:
                pass
        return outcome == "sent"
