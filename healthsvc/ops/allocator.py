"""The C allocator under a long-lived server (glibc malloc): fewer arenas, and what was freed
given back to the system.

Why. In the 30-minute soak (docs/reliability.md) the RSS of a replica grew with every peak of
load and never came back, while the Python objects it held did not grow (``tracemalloc``
flat). Read from inside the process (``malloc_info``, ``sys._debugmallocstats``), at 1,024
ranks after the first runs: glibc malloc held 72 MiB from the system of which 42 MiB were free
chunks, spread over 16 arenas (glibc's default is 8 per core; every thread that allocates gets
one: the writer, the detectors, the dashboard, alerting, the web framework's worker threads).
glibc gives memory back only from the top of the main heap; what a burst freed inside a heap
(a takeover's restore, a snapshot blob, a queue of parsed pushes under load) stays resident,
and each new, higher peak raises the floor again. One ``malloc_trim(0)`` returned 15 MiB of
that process's 275 MiB at once.

So ``healthsvc serve`` (:func:`tune`, at start-up, before any thread allocates) caps the arenas
at ``malloc_arena_max`` (default 2: the server's threads mostly hold the GIL, so more arenas buy
little parallelism and cost memory) and a :class:`Trimmer` calls ``malloc_trim(0)``, which gives
back the free pages of every arena, also inside a heap: every ``malloc_trim_every_s`` (default
30 s), and as soon as the RSS grew ``malloc_trim_grown_mib`` (default 4 MiB) above what the last
trim left (read from ``/proc`` once a second: one small file read). Why both: in the 30-minute
soak a replica busy taking runs over freed 15-30 MiB between two trims 30 s apart, so its RSS
swung by that much with the moment it was read; trimmed when it grew, the RSS says what the
process holds, not how long ago the last trim was. A trim walks the free chunks of each arena
under its lock: milliseconds for a few hundred MiB. Growth that is live memory gives nothing
back, and the next trim waits for the RSS to grow again from there. Its count, the RSS it gave back and
the number of arenas are on ``/metrics`` (``healthsvc_malloc_*``).

Not glibc (macOS, musl): nothing is tuned, nothing trimmed, the gauges read 0.

What this does not reach: Python's own small-object allocator (pymalloc) keeps a 1 MiB arena
while any object in it lives; after a peak its arenas can stay partly empty (the soak: 92
arenas holding 55 MB of objects). That is bounded by the largest peak, not by the runs seen.
"""
from __future__ import annotations

import ctypes
import logging
import os
import re
import threading
import time
from typing import Any

log = logging.getLogger(__name__)

# mallopt parameters (glibc's malloc.h)
M_ARENA_MAX = -8


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


def _glibc() -> Any:
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.gnu_get_libc_version  # noqa: B018 - glibc only (musl has no such symbol)
        libc.mallopt.argtypes, libc.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
        libc.malloc_trim.argtypes, libc.malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
        libc.open_memstream.argtypes = [ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_size_t)]
        libc.open_memstream.restype = ctypes.c_void_p
        libc.malloc_info.argtypes, libc.malloc_info.restype = [ctypes.c_int, ctypes.c_void_p], ctypes.c_int
        libc.fclose.argtypes, libc.fclose.restype = [ctypes.c_void_p], ctypes.c_int
        libc.free.argtypes, libc.free.restype = [ctypes.c_void_p], None
        libc.mallinfo2.restype = _Mallinfo2
        return libc
    except (OSError, AttributeError):
        return None


_LIBC = _glibc()


def available() -> bool:
    return _LIBC is not None


def tune(arena_max: int) -> bool:
    """Cap glibc's malloc arenas (``mallopt(M_ARENA_MAX)``); 0 leaves glibc's default. Call it
    before threads allocate (an arena a thread already has is kept). True if it was applied."""
    if _LIBC is None or arena_max <= 0:
        return False
    return bool(_LIBC.mallopt(M_ARENA_MAX, arena_max))


def rss_bytes() -> int:
    """This process's resident set size, from /proc (0 where there is none)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def arenas() -> int:
    """How many malloc arenas the process has (``malloc_info``'s heaps); 0 when not glibc."""
    if _LIBC is None:
        return 0
    buf, size = ctypes.c_char_p(), ctypes.c_size_t()
    fp = _LIBC.open_memstream(ctypes.byref(buf), ctypes.byref(size))
    if not fp:
        return 0
    try:
        _LIBC.malloc_info(0, fp)
    finally:
        _LIBC.fclose(fp)
    try:
        text = ctypes.string_at(buf, size.value).decode("ascii", "replace")
    finally:
        _LIBC.free(ctypes.cast(buf, ctypes.c_void_p))
    return len(re.findall(r"<heap nr=", text))


def heap() -> tuple[int, int]:
    """(bytes malloc holds from the system in its arenas and big mappings, bytes of it free),
    summed over every arena (``mallinfo2``); (0, 0) when not glibc."""
    if _LIBC is None:
        return 0, 0
    m = _LIBC.mallinfo2()
    return m.arena + m.hblkhd, m.fordblks + m.fsmblks


class Trimmer:
    """``malloc_trim(0)`` on a daemon thread, until :meth:`stop`: every ``every_s``, and when the
    RSS grew ``grown_bytes`` above what the last trim left (checked every ``check_s``; 0: only
    on the period). Counts the trims and the RSS they gave back (one owner of these figures:
    this object)."""

    def __init__(self, every_s: float, grown_bytes: int = 0, check_s: float = 1.0) -> None:
        self.every_s = every_s
        self.grown_bytes = grown_bytes
        self.check_s = check_s
        self._left_bytes = 0   # the RSS the last trim left
        self.trims = 0
        self.returned_bytes = 0
        self.last_s = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "Trimmer":
        if _LIBC is not None and (self.every_s > 0 or self.grown_bytes > 0):
            self._thread = threading.Thread(target=self._loop, name="healthsvc-malloc-trim", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def trim(self) -> int:
        """One trim now; the RSS it gave back, bytes."""
        if _LIBC is None:
            return 0
        before, t0 = rss_bytes(), time.perf_counter()
        _LIBC.malloc_trim(0)
        self.last_s = time.perf_counter() - t0
        returned = max(0, before - rss_bytes())
        self.trims += 1
        self.returned_bytes += returned
        self._left_bytes = rss_bytes()
        return returned

    def _loop(self) -> None:
        waits = [w for w, on in ((self.every_s, self.every_s > 0), (self.check_s, self.grown_bytes > 0)) if on]
        last = time.monotonic()
        self._left_bytes = rss_bytes()
        while not self._stop.wait(min(waits)):
            now = time.monotonic()
            grown = self.grown_bytes > 0 and rss_bytes() - self._left_bytes >= self.grown_bytes
            if not grown and not (self.every_s > 0 and now - last >= self.every_s):
                continue
            last = now
            try:
                self.trim()
            except Exception:  # noqa: BLE001 - never let the trimmer take the process down
                log.exception("malloc_trim failed")


class AllocatorCollector:
    """``/metrics``: the trims, the RSS they gave back, and the arenas malloc has."""

    def __init__(self, trimmer: Trimmer) -> None:
        self.trimmer = trimmer

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
        yield CounterMetricFamily("healthsvc_malloc_trims", "malloc_trim(0) calls (healthsvc.ops.allocator).",
                                  value=self.trimmer.trims)
        yield CounterMetricFamily("healthsvc_malloc_trimmed_bytes", "RSS the trims gave back to the system, bytes.",
                                  value=self.trimmer.returned_bytes)
        yield GaugeMetricFamily("healthsvc_malloc_trim_last_seconds", "How long the last trim took, seconds.",
                                value=self.trimmer.last_s)
        held, free = heap()
        yield GaugeMetricFamily("healthsvc_malloc_held_bytes", "Bytes glibc malloc holds from the system (mallinfo2).",
                                value=held)
        yield GaugeMetricFamily("healthsvc_malloc_free_bytes", "Bytes of them in free chunks (some of their pages "
                                "already given back by a trim).", value=free)
        yield GaugeMetricFamily("healthsvc_malloc_arenas", "glibc malloc arenas of the process (0: not glibc).",
                                value=arenas())
