"""The one virtual clock for tests: time that moves only when the test (or, with `auto`, a sleeper) moves it.

    clock = VirtualClock()
    thing = Thing(clock=clock, sleep=clock.sleep)    # `clock.clock` is the same reading as `clock()`
    clock.advance(5)                                 # wakes every sleeper whose deadline has passed
    await clock.run_for(1.0)                         # …one deadline at a time, letting each woken task run
    await clock.wait_sleeper(lambda left: left > 9)  # until something sleeps that long

With `auto=True`, `sleep(d)` moves the clock forward by `d` itself (for a single paced worker, such as
the captions thread, whose pacing the test only reads).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable


class VirtualClock:
    def __init__(self, start: float = 0.0, *, auto: bool = False) -> None:
        self.now = start
        self.auto = auto
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()
        self._changed = asyncio.Condition()

    def __call__(self) -> float:
        return self.now

    def clock(self) -> float:
        return self.now

    async def sleep(self, delay: float) -> None:
        if self.auto:
            self.now += max(0.0, delay)
            await asyncio.sleep(0)
            return
        future = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self.now + max(0.0, delay), next(self._seq), future))
        async with self._changed:
            self._changed.notify_all()
        await future

    def pending(self) -> list[float]:
        """Remaining delays of everything asleep now."""
        return sorted(deadline - self.now for deadline, _, f in self._sleepers if not f.done())

    async def wait_sleeper(self, predicate: Callable[[float], bool] = lambda left: True) -> None:
        """Until something sleeps with a remaining delay that satisfies `predicate`."""
        async with self._changed:
            await self._changed.wait_for(lambda: any(predicate(left) for left in self.pending()))

    def advance(self, seconds: float) -> None:
        """Move `seconds` ahead at once; every sleeper due by then wakes (when the loop next runs)."""
        self.now += seconds
        while self._sleepers and self._sleepers[0][0] <= self.now:
            _, _, future = heapq.heappop(self._sleepers)
            if not future.done():
                future.set_result(None)

    async def run_for(self, seconds: float, *, turns: int = 5) -> None:
        """Move `seconds` ahead one deadline at a time: each sleeper wakes at its own time and its task
        gets `turns` loop iterations to run up to its next sleep before time moves on."""
        end = self.now + seconds
        while self._sleepers and self._sleepers[0][0] <= end + 1e-9:
            deadline, _, future = heapq.heappop(self._sleepers)
            self.now = max(self.now, deadline)
            if not future.done():
                future.set_result(None)
            for _ in range(turns):
                await asyncio.sleep(0)
        self.now = end
