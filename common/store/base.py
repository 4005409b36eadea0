"""What both engines' stores share: the transaction interface (`Tx`), re-running a transaction after
a failure worth another try (`transact`), and applying migrations in order."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Iterable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from common.store.dialect import Migration, check_migrations, newer_than_known
from common.store.errors import StoreError

T = TypeVar("T")
log = logging.getLogger("switchboard.store")


class Tx(Protocol):
    """One open transaction (`Store.transaction()`, `Store.transact()`); SQL with `?` placeholders.
    Rows answer both `row["column"]` and `row[0]`."""

    engine: str

    async def execute(self, sql: str, params: Sequence = ()) -> int: ...  # rows changed
    async def executemany(self, sql: str, rows: Iterable[Sequence]) -> None: ...
    async def insert(self, sql: str, params: Sequence = ()) -> int: ...  # the new row's `id`
    async def fetchone(self, sql: str, params: Sequence = ()) -> Any: ...
    async def fetchall(self, sql: str, params: Sequence = ()) -> list[Any]: ...


def process_session(owner: str) -> str:
    """The name a process's connections carry on a shared server (PostgreSQL's application_name, at most
    63 bytes), from an owner token `host:pid:start[:nonce]`: what `Store.sessions()` lists while it runs."""
    host, pid, start = (owner.split(":") + ["", "", ""])[:3]
    return f"switchboard {host}:{pid}:{start}".encode()[:63].decode(errors="ignore")


class Retry(StoreError):
    """Raised inside a transaction by an engine when the whole transaction may simply run again
    (lost the connection before COMMIT, a serialization failure, a deadlock). `transact` catches it."""


@dataclass(frozen=True)
class Busy:
    """How long a write waits for another process (SQLite: its own busy wait, `timeout_s` per attempt),
    then up to `attempts` tries in all, with a jittered exponential pause between them; how long a
    PostgreSQL store keeps reconnecting after losing the server (`lost_s`). `sleep` and `random` are
    injectable so tests never wait for real."""

    timeout_s: float = 5.0
    attempts: int = 5
    first_pause_s: float = 0.05
    max_pause_s: float = 1.0
    lost_s: float = 120.0
    sleep: Callable[[float], Awaitable[None]] = field(default=asyncio.sleep, compare=False)
    random: Callable[[], float] = field(default=random.random, compare=False)

    def pause(self, attempt: int) -> float:
        """The pause after failed attempt `attempt` (0-based): between half and one and a half times
        the doubled step, so processes that collided do not collide again in lockstep."""
        step = min(self.max_pause_s, self.first_pause_s * (2 ** attempt))
        return step * (0.5 + self.random())


class Store:
    """The engine-independent half of a store; an engine supplies `transaction()`, the single
    statements and `_tx_attempts`/`_on_retry` for `transact`."""

    engine: str
    where: str  # the database, as a line names it (never a password)
    _busy: Busy
    _clock: Callable[[], float]

    def transaction(self) -> AbstractAsyncContextManager[Tx]:  # pragma: no cover - each engine's
        raise NotImplementedError

    async def fetchone(self, sql: str, params: Sequence = ()) -> Any:  # pragma: no cover
        raise NotImplementedError

    async def fetchall(self, sql: str, params: Sequence = ()) -> list[Any]:  # pragma: no cover
        raise NotImplementedError

    async def transact(self, body: Callable[[Tx], Awaitable[T]]) -> T:
        """Run `body(tx)` inside one transaction and commit; when the engine says the whole
        transaction may run again (`Retry`), run it again after a jittered pause. `body` must
        therefore do nothing but read and write through `tx` (a decision callable it consults is
        fine: it is asked again)."""
        attempt = 0
        while True:
            try:
                async with self.transaction() as tx:
                    return await body(tx)
            except Retry as exc:
                attempt += 1
                await self._on_retry(exc, attempt)

    async def _on_retry(self, exc: Retry, attempt: int) -> None:  # pragma: no cover - each engine's
        raise exc

    async def now(self) -> float:
        """The store's clock (seconds since the epoch), for what processes on two hosts compare: the
        database server's on PostgreSQL, this host's (or the injected clock) on SQLite, which one host
        shares."""
        return self._clock()

    async def sessions(self) -> frozenset[str] | None:
        """The processes connected to the store right now, each as `process_session(owner)` names it;
        None when the engine cannot tell (SQLite: only this host's processes share it; ask the OS)."""
        return None

    async def versions(self) -> dict[str, int]:
        """The highest applied version of every package."""
        rows = await self.fetchall("SELECT package, MAX(version) AS v FROM schema_migrations GROUP BY package")
        return {row["package"]: int(row["v"]) for row in rows}

    async def _migrate_package(self, tx: Tx, package: str, items: list[Migration]) -> list[Migration]:
        row = await tx.fetchone("SELECT MAX(version) FROM schema_migrations WHERE package = ?", (package,))
        current = int(row[0] or 0)
        if current > len(items):
            raise newer_than_known(self.where, package, current, len(items))
        for migration in items[current:]:
            for statement in migration.statements(self.engine):
                await tx.execute(statement)
            await tx.execute("INSERT INTO schema_migrations (package, version, applied_at) VALUES (?, ?, ?)",
                             (package, migration.version, self._clock()))
        return items[current:]

    async def migrate(self, migrations: Iterable[Migration]) -> list[Migration]:
        """Apply the migrations not yet recorded, each package's in one transaction (the version check
        inside it, under the engine's write lock); returns those applied now. Safe to call again."""
        applied: list[Migration] = []
        for package, items in check_migrations(migrations).items():
            async with self.transaction() as tx:
                applied += await self._migrate_package(tx, package, items)
        return applied

