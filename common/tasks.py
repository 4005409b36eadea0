"""Background tasks an object starts and must be able to wait for or cancel: each is held until it ends
(the event loop keeps only weak references), and one that fails is logged with its name — never lost
silently, never raised into whoever started it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Iterator
from typing import Any


class BackgroundTasks:
    def __init__(self, logger: logging.Logger, what: str = "task") -> None:
        self._log = logger
        self._what = what
        self._tasks: set[asyncio.Task] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self._log.error("%s %s failed", self._what, task.get_name(), exc_info=task.exception())

    @property
    def busy(self) -> bool:
        return any(not task.done() for task in self._tasks)

    def __iter__(self) -> Iterator[asyncio.Task]:
        return iter(list(self._tasks))

    def __len__(self) -> int:
        return len(self._tasks)
