"""``committed``: a push's wait for its group commit, bounded, with the write resolved on another
thread as the store's writer resolves it."""
from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import Future

import pytest

from healthsvc.errors import StoreUnavailable
from healthsvc.ingest.committed import committed


def resolve_later(write: Future, delay_s: float, *, result=None, error: BaseException | None = None) -> threading.Thread:
    def run() -> None:
        time.sleep(delay_s)
        if error is not None:
            write.set_exception(error)
        else:
            write.set_result(result)
    t = threading.Thread(target=run)
    t.start()
    return t


def test_the_result_once_the_writer_thread_commits():
    write: Future = Future()
    t = resolve_later(write, 0.05, result="stored")
    assert asyncio.run(committed(write)) == "stored"
    t.join()


def test_a_write_done_before_the_wait_answers_at_once():
    write: Future = Future()
    write.set_result(7)
    assert asyncio.run(committed(write, wait_s=0.01)) == 7


def test_the_write_error_reaches_the_request():
    write: Future = Future()
    t = resolve_later(write, 0.02, error=ValueError("disk"))
    with pytest.raises(ValueError, match="disk"):
        asyncio.run(committed(write))
    t.join()


def test_a_write_not_committed_in_time_is_a_503_and_may_still_commit():
    write: Future = Future()

    async def wait() -> float:
        started = time.monotonic()
        with pytest.raises(StoreUnavailable) as err:
            await committed(write, wait_s=0.1)
        assert err.value.status_code == 503
        return time.monotonic() - started

    assert 0.1 <= asyncio.run(wait()) < 5
    write.set_exception(RuntimeError("late"))   # after the loop closed: nobody hears it, nothing raises
    assert not write.cancelled()


def test_many_waits_on_one_loop_each_get_their_own_write():
    writes = [Future() for _ in range(50)]

    async def all_of_them():
        threads = [resolve_later(w, 0.001 * (i % 5), result=i) for i, w in enumerate(writes)]
        out = await asyncio.gather(*(committed(w) for w in writes))
        for t in threads:
            t.join()
        return out

    assert asyncio.run(all_of_them()) == list(range(50))
