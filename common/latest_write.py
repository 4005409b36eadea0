"""Keeping a stored total up to date as it changes, without a write per change: `LatestWrite` runs at
most one write at a time, and every `request()` made while one is in flight folds into one more write
after it. The write reads the value when it starts, so the last write always carries the newest total:
a burst of changes costs at most two writes, and nothing reported before a `request()` is left unwritten
once the writes in flight have ended (`settled()`). A write that fails is handed to `on_error` and the
next request writes again."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable


class LatestWrite:
    def __init__(self, write: Callable[[], Awaitable[None]], on_error: Callable[[Exception], None], *,
                 name: str = "latest-write") -> None:
        self._write = write  # reads the newest value itself when it runs
        self._on_error = on_error
        self._name = name
        self._wanted = False
        self._task: asyncio.Task | None = None

    def request(self) -> None:
        """The value changed: write it now, or once the write in flight ends."""
        self._wanted = True
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name=self._name)

    async def settled(self) -> None:
        """Wait until no write is in flight or wanted."""
        while self._task is not None and not self._task.done():
            await asyncio.shield(self._task)

    async def _run(self) -> None:
        while self._wanted:
            self._wanted = False
            try:
                await self._write()
            except Exception as exc:
                self._on_error(exc)
