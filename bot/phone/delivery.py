"""Where the listener's runs land: each finished review, callback or named-command run goes to its
job's deliver target — under the call's card, in another channel, or only the archive and the log.

`ListenerDelivery` is a notification sink in front of the runs service's usual one: a run the
execution ledger does not know is passed on unchanged. A review's output becomes the call's review
in the archive. The run's callback-mutation token (a named command's) is revoked when it lands.
How a result is shown is a `ResultPoster`: Discord embeds in `switchboard run`, the terminal in
`switchboard listen`. What is read and recorded about a job goes through `listener.repository`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from dataclasses import dataclass
from typing import Protocol, TextIO

from common.store import Store
from common.visible import printable
from listener.callbacks import MutationTokens, deliver_channel
from listener.pipeline import CallCard
from listener.repository import POSTING, WAITING, JobRepository, JobRoute, TranscriptRepository
from listener.text import quote_untrusted
from runs import NotificationSink, RunState, RunTicket
from runs.procs import elsewhere, owner_alive, owner_token
from runs.repository import RunRepository
from runs.wording import STATE_WORDS, bounded, elapsed_words

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class JobResult:
    """A finished listener run with what it was for."""

    ticket: RunTicket
    kind: str  # review | callback | command
    label: str
    conversation_id: str
    from_number: str | None
    to_number: str | None
    channel_id: int | None  # None: archive and log only
    card: str | None  # the call card's reference ("channel/message"), when it was posted


class ResultPoster(Protocol):
    async def post_card(self, card: CallCard) -> str | None:
        """Show a call's card; return its reference (kept with the call). Raise when the post failed."""
        ...

    async def post_result(self, result: JobResult) -> str:
        """Show it; return where it went (for the ledger). Raise when the post failed."""
        ...


class ListenerDelivery:
    """The runs service's sink for listener jobs, and the pipeline's card notifier in front of the
    poster: a result that lands before its call's card waits, and the card, once posted, brings every
    waiting (or earlier refused) result out under it — so results are always under their card.

    Several processes share the store: a result is marked waiting only in the same statement that
    sees no card recorded (so a card recorded by another process at that moment cannot miss it),
    and each result is taken (compare-and-set, `POSTING` + this process) before it is posted, so two
    processes never post it twice. A result a crashed process was posting is taken again when the
    listener starts (`flush_waiting`)."""

    def __init__(self, store: Store, fallback: NotificationSink, poster: ResultPoster, *,
                 default_channel: int | None, owner: str | None = None) -> None:
        self._fallback = fallback
        self._poster = poster
        self._default_channel = default_channel
        self._tokens = MutationTokens(store)
        self._jobs = JobRepository(store)
        self._transcripts = TranscriptRepository(store)
        self._repo = RunRepository(store)
        self._owner = owner or owner_token()
        self._store = store
        self._lock = asyncio.Lock()  # a result and its card never cross in this process

    async def post_run(self, ticket: RunTicket) -> None:
        job = await self._job(ticket.id)
        if job is None:
            await self._fallback.post_run(ticket)
            return
        await self._tokens.revoke(job.dedupe_key)
        if job.kind == "review":
            done = ticket.state is RunState.COMPLETED
            await self._transcripts.record_review(job.transcript_id, ticket.output if done else ticket.error,
                                                  "done" if done else "failed")
        async with self._lock:  # checked and marked in one statement, against the card's recording (post_card)
            waiting = await self._jobs.wait_for_card(job.dedupe_key, job.transcript_id)
        if waiting:
            log.info("run %s (%s for call %s) waits for the call card", ticket.id, job.kind,
                     quote_untrusted(job.conversation_id))
            return
        await self._post(ticket, await self._job(ticket.id))

    async def post_card(self, card: CallCard) -> str | None:
        """Post the card (via the poster), record it, then every result that was waiting for it."""
        reference = await self._poster.post_card(card)  # raises: the pipeline records the stage
        async with self._lock:  # the card and the results held for it, read in one transaction
            held = await self._jobs.record_card(card.transcript_id, reference or "posted")
        await self._post_held(held)
        return reference

    async def flush_waiting(self) -> int:
        """Post results still waiting for a card that has since been recorded (a crash or a stop between
        the card and its results), and those a process that is gone was posting. Called when the
        listener starts; returns how many it posted."""
        return await self._post_held(await self._jobs.held_results())

    async def _post_held(self, job_ids: list[str]) -> int:
        """Post each held job's finished run; returns how many were posted."""
        posted = 0
        for job_id in job_ids:
            run_id = int(str(job_id).removeprefix("run-"))
            ticket, job = await self._repo.get(run_id), await self._job(run_id)
            if ticket is not None and job is not None:
                posted += await self._post(ticket, job)
        return posted

    async def _job(self, run_id: int) -> JobRoute | None:
        return await self._jobs.route(f"run-{run_id}")

    def _postable(self, delivered: str | None, sessions: frozenset[str] | None) -> bool:
        """Whether a result in this state is still to be posted: never posted, waiting, refused before,
        or left half-posted by a process that is gone (`sessions`: who is connected to a shared store)."""
        if delivered is None or delivered == WAITING or delivered.startswith("post failed"):
            return True
        if delivered.startswith(POSTING):
            owner = delivered.removeprefix(POSTING)
            return owner != self._owner and not owner_alive(owner, me=self._owner, sessions=sessions)
        return False

    async def _post(self, ticket: RunTicket, job: JobRoute) -> bool:
        """Take the result (exactly one process wins) and post it; False when it was not ours to post."""
        seen = job.delivered
        sessions = await self._store.sessions() if seen and elsewhere([seen.removeprefix(POSTING)]) else None
        if not self._postable(seen, sessions) or not await self._jobs.take_result(job.dedupe_key, seen, self._owner):
            return False
        result = JobResult(ticket, job.kind, job.label, job.conversation_id, job.from_number, job.to_number,
                           deliver_channel(job.deliver, self._default_channel), job.card)
        where = "post failed: interrupted"
        try:
            where = await self._poster.post_result(result)
        except Exception as exc:  # kept in the ledger; the run and the archive are untouched
            log.warning("run %s (%s for call %s) was not posted: %s", ticket.id, job.kind,
                        quote_untrusted(job.conversation_id), exc)
            where = f"post failed: {str(exc)[:200]}"
        finally:
            await asyncio.shield(self._jobs.settle_result(job.dedupe_key, where, self._owner))
        return True


KIND_WORDS = {"review": "review", "callback": "callback", "command": "call command"}


class TerminalPoster:
    """`switchboard listen`: cards and results printed (and logged); nothing goes to Discord."""

    def __init__(self, stream: TextIO | None = None, output_chars: int = 2000) -> None:
        self._stream = stream
        self._output_chars = output_chars

    async def post_card(self, card: CallCard) -> str | None:
        out = self._stream or sys.stderr
        print(f"\n── {card_title(card)}: {card_summary(card)}", file=out)
        for fact in card.facts:
            print(f"   learned: {printable(fact)}", file=out)
        for job_id, kind, label in card.jobs:
            print(f"   {job_id}: {KIND_WORDS.get(kind, kind)} \u201c{printable(bounded(label, 80))}\u201d", file=out)
        out.flush()
        return None

    async def post_result(self, result: JobResult) -> str:
        out = self._stream or sys.stderr
        ticket = result.ticket
        took = elapsed_words(ticket.elapsed(ticket.finished_at or ticket.updated_at))
        print(f"\n── {KIND_WORDS.get(result.kind, result.kind)} \u201c{printable(bounded(result.label, 60))}\u201d for "
              f"call {quote_untrusted(result.conversation_id, 64)} {STATE_WORDS[ticket.state]} after {took} "
              f"(run {ticket.id})", file=out)
        if result.channel_id is not None:
            print(f"   (meant for Discord channel {result.channel_id}; `switchboard run` posts there)", file=out)
        body = ticket.output or ticket.error or ""
        if body:
            print(printable(body) if len(body) <= self._output_chars else
                  printable(body[: self._output_chars]) + f"\n   … (`switchboard runs show {ticket.id}` has the rest)",
                  file=out)
        out.flush()
        return "terminal"


def number(value: str | None) -> str:
    """A phone number from the payload, printable and bounded (it is the caller's data)."""
    text = "".join(c for c in (value or "") if c.isprintable())
    return bounded(text, 40) or "?"


def card_title(card: CallCard) -> str:
    arrow = {"inbound": "Call from", "outbound": "Call to"}.get(card.direction or "")
    other = card.from_number if card.direction == "inbound" else card.to_number
    return f"{arrow} {number(other) if other else 'an unknown number'}" if arrow else \
        f"Call {number(card.from_number)} \u2192 {number(card.to_number)}"


def card_summary(card: CallCard) -> str:
    length = f"{elapsed_words(card.duration_s)}, " if card.duration_s else ""
    return (f"{number(card.from_number)} \u2192 {number(card.to_number)}, {card.direction or 'direction unknown'}, "
            f"{length}{card.turns} turns, {len(card.jobs)} job{'s' * (len(card.jobs) != 1)}")




def card_reference(channel_id: int, message_id: int) -> str:
    return json.dumps({"channel": channel_id, "message": message_id})


def parse_reference(reference: str | None) -> tuple[int, int] | None:
    try:
        value = json.loads(reference or "")
        return int(value["channel"]), int(value["message"])
    except (ValueError, KeyError, TypeError):
        return None
