"""`LatestWrite`: one write in flight, the newest value wins, a failure is reported and the next request
writes again. Each write is held on an event, so "in flight" is exact, not timed."""

from __future__ import annotations

import asyncio

from common.latest_write import LatestWrite


class Store:
    """A value written by a write that waits for `release` (set it to let writes through)."""

    def __init__(self) -> None:
        self.value = 0  # what the caller holds now
        self.written: list[int] = []  # what each write stored, in order
        self.release = asyncio.Event()
        self.started = asyncio.Event()
        self.in_flight = 0
        self.most_in_flight = 0
        self.fail = False

    async def write(self) -> None:
        value = self.value  # read when the write starts, as a row's totals are
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        self.started.set()
        try:
            await self.release.wait()
            if self.fail:
                raise OSError("disk I/O error")
            self.written.append(value)
        finally:
            self.in_flight -= 1


async def test_a_burst_of_changes_while_a_write_is_in_flight_ends_in_one_more_write_of_the_newest_value():
    store, errors = Store(), []
    writes = LatestWrite(store.write, errors.append)
    store.value = 1
    writes.request()
    await store.started.wait()  # the first write holds the store
    for value in range(2, 52):
        store.value = value
        writes.request()
    store.release.set()
    await writes.settled()
    assert store.written == [1, 51]  # 50 changes, one more write, the newest
    assert store.most_in_flight == 1 and errors == []
    store.value = 52
    writes.request()
    await writes.settled()
    assert store.written[-1] == 52  # idle again: a change is written at once


async def test_a_failed_write_is_reported_and_the_next_request_writes_again():
    store, errors = Store(), []
    writes = LatestWrite(store.write, errors.append)
    store.fail, store.value = True, 7
    store.release.set()
    writes.request()
    await writes.settled()
    assert store.written == [] and [str(e) for e in errors] == ["disk I/O error"]
    store.fail, store.value = False, 8
    writes.request()
    await writes.settled()
    assert store.written == [8] and len(errors) == 1


async def test_settled_returns_at_once_when_nothing_was_asked():
    store = Store()
    await LatestWrite(store.write, lambda exc: None).settled()
    assert store.written == []
