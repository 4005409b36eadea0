"""The execution ledger: who starts each job of a call, and who does each of its steps.

Several processes share the store. A claim is taken in one transaction (`listener.repository.
JobRepository`), so of any number of tasks and processes exactly one wins; it names its owner
(`process_owner`: this process) and its time, so a claim whose owner is gone (`process_alive`), or
that is older than `STALE_CLAIM_S`, is taken again. A job slot with a run is never started again.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from common.process import this_process
from common.store import process_session
from listener.repository import Database, Found, JobRepository

STALE_CLAIM_S = 600.0  # a claim older than this is abandoned even when its owner still runs (a hung start)


def process_owner() -> str:
    """A claim owner naming this process: `host:pid:start:nonce` (the shape of the runs service's owner
    tokens, so the composition root may pass one of those instead)."""
    return f"{this_process()}:{secrets.token_hex(4)}"


def process_alive(owner: str) -> bool:
    """Whether the process named in a claim's owner still runs on this host. Another host's owner
    counts as gone here; the ledger also asks a shared store (`Store.sessions()`) about those."""
    host, _, rest = owner.partition(":")
    pid_text = rest.partition(":")[0]
    if host != socket.gethostname() or not pid_text.isdigit() or int(pid_text) <= 0:
        return False
    try:
        os.kill(int(pid_text), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass(frozen=True)
class Claim:
    """The answer to a claim: `won` (this caller must do it now, and settle or release it), or
    `done` (the job slot has its run: `job_id`; the step is recorded), or neither: `holder` is
    doing it right now (another live process, or another task of this one)."""

    won: bool
    done: bool = False
    job_id: str | None = None
    holder: str | None = None


def _claim(found: Found | None) -> Claim:
    if found is None:
        return Claim(True)
    return Claim(False, done=found.done, job_id=found.job_id, holder=found.owner)


class ExecutionLedger:
    """Claims on job slots (`listener_jobs`: one row per review, callback and named command of a
    call) and on a call's steps (`listener_steps`: learning its facts, posting its card).

    A claim is read and taken inside one `BEGIN IMMEDIATE` transaction, so of any number of tasks
    and processes exactly one wins. It records its owner (this process) and time — the intent to
    start: a slot claimed but still without a run is taken again when its owner is gone (`alive`),
    when its owner is this ledger but no task of it is working on it (a start interrupted here), or
    after `STALE_CLAIM_S`. A slot with a run is never started again."""

    def __init__(self, db: Database, *, owner: str | None = None, alive: Callable[[str], bool] = process_alive,
                 clock: Callable[[], float] | None = None) -> None:
        self.db = db
        self.owner = owner or process_owner()
        self._jobs = JobRepository(db)
        self._alive = alive
        self._clock = clock
        self._holding: set[tuple[str, Any]] = set()  # claims this ledger's tasks are working on now
        self._claiming: dict[tuple[str, Any], list] = {}  # what -> [lock, tasks asking]: one claim at a time

    def held_elsewhere(self, owner: str | None, since: float | None, what: tuple[str, Any], *, now: float,
                       sessions: frozenset[str] | None = None) -> bool:
        """Whether a claim by `owner` taken at `since` is being worked on right now by someone else (a
        process of this host that runs, or of another host connected to the shared store: `sessions`)."""
        if not owner or since is None or since < now - STALE_CLAIM_S:
            return False
        if owner == self.owner:
            return what in self._holding
        return self._alive(owner) or (sessions is not None and process_session(owner) in sessions)

    async def _now(self) -> tuple[float, frozenset[str] | None]:
        """The time a claim is taken and judged at — the store's clock (the database server's, which
        every host shares) unless one was injected — and who is connected to the store."""
        now = self._clock() if self._clock is not None else await self.db.now()
        return now, await self.db.sessions()

    async def _take(self, what: tuple[str, Any],
                    ask: Callable[[float, Callable[[str | None, float | None], bool]], Awaitable[Found | None]]
                    ) -> Claim:
        """One claim on `what`, the tasks of this process one at a time: a winner is among `_holding`
        before another task of this process reads the claim (the commit and that note are two steps)."""
        entry = self._claiming.setdefault(what, [asyncio.Lock(), 0])
        entry[1] += 1
        try:
            async with entry[0]:
                now, sessions = await self._now()
                claim = _claim(await ask(now, lambda owner, since: self.held_elsewhere(
                    owner, since, what, now=now, sessions=sessions)))
                if claim.won:
                    self._holding.add(what)
                return claim
        finally:
            entry[1] -= 1
            if not entry[1]:
                del self._claiming[what]

    async def claim_job(self, *, key: str, transcript_id: int, kind: str, label: str, deliver: str) -> Claim:
        """Claim a job slot: won (start it now, then `started` or `failed`), done (it has its run), or
        held by someone starting it right now."""
        return await self._take(("job", key), lambda now, held: self._jobs.claim_job(
            key, transcript_id=transcript_id, kind=kind, label=label, deliver=deliver, owner=self.owner, now=now,
            held=held))

    async def started(self, key: str, job_id: str) -> None:
        """The slot's job is running as `job_id`; from now on the slot is done, whoever asks."""
        await self._jobs.job_started(key, job_id)
        self._holding.discard(("job", key))

    async def failed(self, key: str, detail: str) -> None:
        """This claim's start failed: the slot may be taken again (a later delivery retries it)."""
        await self._jobs.job_failed(key, detail, self.owner)
        self._holding.discard(("job", key))

    async def job_ids(self, transcript_id: int) -> list[str]:
        """Every job that truly started for this call (a run exists), in the order they were claimed."""
        return await self._jobs.job_ids(transcript_id)

    async def calls_without_runs(self) -> list[int]:
        """Every archived call with a job slot still without a run — a start a crash cut short, or one
        that failed — in archive order."""
        return await self._jobs.calls_without_runs()

    async def card_jobs(self, transcript_id: int) -> list[tuple[str, str, str]]:
        """(run id, kind, label) of every job slot of the call, started or not ("not started"), in
        the order they were claimed: what its card names."""
        return await self._jobs.for_card(transcript_id)

    async def claim_step(self, transcript_id: int, step: str) -> Claim:
        """Claim a call's `step` ("memory", "card"): won (do it, then `release_step`), done (the
        archive records it as done), or held by someone doing it right now."""
        return await self._take((step, transcript_id), lambda now, held: self._jobs.claim_step(
            transcript_id, step, owner=self.owner, now=now, held=held))

    async def card_posted(self, transcript_id: int, reference: str) -> None:
        """Record the call's card (unless the notifier already did) and let go of the card's claim."""
        await self._jobs.card_posted(transcript_id, reference, self.owner)
        self._holding.discard(("card", transcript_id))

    async def release_step(self, transcript_id: int, step: str) -> None:
        """Done with `step` (recorded in the archive, or failed: the next delivery may claim it)."""
        if (step, transcript_id) not in self._holding:
            return  # let go already (`card_posted`)
        await self._jobs.release_step(transcript_id, step, self.owner)
        self._holding.discard((step, transcript_id))
