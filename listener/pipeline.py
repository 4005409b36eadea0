"""One Smartnumbers event → download, parse, archive, memory and jobs, a call card → its ack.

The transcript is archived (committed) before anything is acknowledged or dispatched. After that,
two things happen side by side: durable-fact memory (one model request, validated in code) and the
jobs — the review, each enabled callback, each named command — each claimed in the execution
ledger under a stable key before it starts, so a replayed event finds the same archived call and
the same jobs and starts nothing twice. A step that failed (a model down, a runs service that
refused, a card Discord would not take) is retried by the next delivery of the event, and only
that step. Then the call card is posted once, naming the jobs (one not started yet says so; its
result still goes under the card when a later delivery starts it). Who the user is comes from the
local direction mapping, never from the payload.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .archive import Archive
from .callbacks import Callbacks, MutationTokens
from .commands import find_commands
from .download import TranscriptDownloadError
from .extract import ExtractionError, FactExtractor
from .jobs import Job, JobStarter, about_callbacks, callback_job, command_job, review_job
from .memory import Memory, validate
from .model import Transcript, user_label_for
from .transcript import TranscriptError, parse_transcript

log = logging.getLogger(__name__)

Download = Callable[[str, str | None], Awaitable[bytes]]
STALE_CLAIM_S = 600.0  # a claim with no job this old was left by a crash mid-start: it may be taken again


@dataclass(frozen=True)
class CallCard:
    """What the post for one call says: who called whom, when, how long, what it learned, its jobs."""

    transcript_id: int
    conversation_id: str
    direction: str | None
    from_number: str | None
    to_number: str | None
    received_at: float
    duration_s: float | None
    turns: int
    facts: tuple[str, ...]
    jobs: tuple[tuple[str, str, str], ...]  # (job id, kind, label)


class CallNotifier(Protocol):
    """Posts a call card (Discord, the terminal); returns a reference to keep (e.g. the message) or
    raises when the post failed (the next delivery of the event posts it again)."""

    async def post_card(self, card: CallCard) -> str | None: ...


class TranscriptPipeline:
    def __init__(self, archive: Archive, *, download: Download, jobs: JobStarter | None, agent_name: str,
                 aliases: Sequence[str] = (), inbound_user: str = "TO", outbound_user: str = "FROM",
                 extractor: FactExtractor | None = None, notifier: CallNotifier | None = None,
                 auto_review: bool = True, clock: Callable[[], float] = time.time) -> None:
        self.archive = archive
        self.callbacks = Callbacks(archive.db, clock=clock)
        self.tokens = MutationTokens(archive.db, clock=clock)
        self.memory = Memory(archive.db, clock=clock)
        self._download = download
        self._jobs = jobs
        self._agent_name = agent_name
        self._aliases = tuple(aliases)
        self._labels = {"inbound": inbound_user, "outbound": outbound_user}
        self._extractor = extractor
        self._notifier = notifier
        self._auto_review = auto_review
        self._clock = clock
        self._locks: dict[str, list] = {}  # conversation id -> [lock, users]

    async def handle(self, event: dict[str, Any]) -> dict[str, Any]:
        """The ack body for one event: success, per-stage results, errors, and every job id known."""
        event_id = str(event.get("event_id") or "")
        conversation_id = str(event.get("conversation_id") or "")
        stages: dict[str, str] = {}
        errors: list[dict[str, str]] = []

        def ack(job_ids: list[str] | None = None) -> dict[str, Any]:
            ids = job_ids or []
            return {"event_id": event_id, "conversation_id": conversation_id, "success": not errors,
                    "stages": stages, "errors": errors, "job_id": ids[0] if ids else None, "job_ids": ids}

        def failed(stage: str, message: str) -> dict[str, Any]:
            stages[stage] = "error"
            errors.append({"stage": stage, "message": message[:300]})
            return ack()

        if not conversation_id:
            return failed("parse", "the event has no conversation_id")
        metadata = event.get("metadata") if isinstance(event.get("metadata"), dict) else {}
        if "turns" in event:  # a direct transcript (local development)
            raw: str | bytes | dict = event
            stages["download"] = "skipped"
        else:
            url = event.get("url")
            if not isinstance(url, str) or not url:
                return failed("download", "the event has no transcript url")
            try:
                raw = await self._download(url, event.get("expires_at"))
            except TranscriptDownloadError as exc:
                return failed("download", str(exc))
            stages["download"] = "ok"
        try:
            transcript = parse_transcript(raw, conversation_id=conversation_id,
                                          metadata={**metadata, "source": event.get("source") or ""})
        except TranscriptError as exc:
            return failed("parse", str(exc))
        stages["parse"] = "ok"
        user_label = user_label_for(transcript.direction, inbound=self._labels["inbound"],
                                    outbound=self._labels["outbound"])
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw if isinstance(raw, str) \
            else json.dumps(raw)
        async with self._conversation(conversation_id):  # two deliveries of one call never interleave
            archived = await self.archive.archive(transcript, text, received_at=self._clock(), user_label=user_label)
            stages["archive"] = "ok" if archived.created else "already archived"
            tid = archived.transcript_id
            if not archived.created:  # act only on what was archived, whatever this delivery carried
                transcript, user_label = await self.archive.load(tid)
            outcomes = await asyncio.gather(self._remember(transcript, tid, user_label, stages, errors),
                                            self._dispatch_all(transcript, tid, user_label, stages, errors),
                                            return_exceptions=True)
            for stage, outcome in zip(("memory", "jobs"), outcomes, strict=True):
                if isinstance(outcome, BaseException):
                    if isinstance(outcome, asyncio.CancelledError):
                        raise outcome
                    log.error("call %s: the %s step failed", conversation_id, stage, exc_info=outcome)
                    stages[stage] = "error"
                    errors.append({"stage": stage, "message": f"{type(outcome).__name__}: {outcome}"[:300]})
            job_ids = await self.job_ids(tid)
            await self._card(transcript, tid, stages, errors)
        return ack(job_ids)

    @contextlib.asynccontextmanager
    async def _conversation(self, conversation_id: str) -> AsyncIterator[None]:
        entry = self._locks.setdefault(conversation_id, [asyncio.Lock(), 0])
        entry[1] += 1
        try:
            async with entry[0]:
                yield
        finally:
            entry[1] -= 1
            if entry[1] == 0:
                del self._locks[conversation_id]

    async def job_ids(self, transcript_id: int) -> list[str]:
        rows = await self.archive.db.fetchall(
            "SELECT job_id FROM listener_jobs WHERE transcript_id = ? AND job_id IS NOT NULL ORDER BY rowid",
            (transcript_id,))
        return [row["job_id"] for row in rows]

    # -- memory ------------------------------------------------------------------------------------

    async def _remember(self, transcript: Transcript, tid: int, user_label: str | None, stages: dict[str, str],
                        errors: list[dict[str, str]]) -> None:
        row = await self.archive.db.fetchone("SELECT memory_status FROM transcripts WHERE id = ?", (tid,))
        if row is not None and row["memory_status"] == "done":
            stages["memory"] = "already done"
            return
        if self._extractor is None:
            stages["memory"] = "skipped (no text model configured)"
            return
        if user_label is None:
            stages["memory"] = "skipped (direction unknown: nobody in the call is the user)"
            await self.memory.save(tid, ())
            return
        try:
            answer = await self._extractor.extract(transcript, user_label)
            checked = validate(answer, transcript, user_label)
        except Exception as exc:  # the model or its answer: the next delivery asks again
            await self.memory.mark(tid, "error")
            stages["memory"] = "error"
            message = str(exc) if isinstance(exc, ExtractionError) else f"the model's answer was unusable " \
                f"({type(exc).__name__})"
            errors.append({"stage": "memory", "message": message[:300]})
            return
        for rejected in checked.rejected:
            log.info("call %s: fact not kept (%s)", transcript.conversation_id, rejected.reason)
        added = await self.memory.save(tid, checked.accepted)
        stages["memory"] = f"{added} fact{'s' * (added != 1)} kept, {len(checked.rejected)} rejected"

    # -- jobs --------------------------------------------------------------------------------------

    async def _dispatch_all(self, transcript: Transcript, tid: int, user_label: str | None,
                            stages: dict[str, str], errors: list[dict[str, str]]) -> None:
        review_started = callbacks_started = 0
        review_seen = False
        callbacks_seen = 0
        row = await self.archive.db.fetchone("SELECT received_at FROM transcripts WHERE id = ?", (tid,))
        for callback in await self.callbacks.due(auto_review=self._auto_review, received_at=float(row["received_at"])):
            job = (review_job if callback.is_review else callback_job)(callback, transcript, user_label)
            outcome = await self._dispatch(job, tid, errors, f"{job.kind} {callback.id}")
            if callback.is_review:
                review_seen = True
                review_started += outcome == "started"
                if outcome == "started":
                    await self._review_status(tid, "queued")
            else:
                callbacks_seen += 1
                callbacks_started += outcome == "started"
        if review_seen:
            stages["review"] = "error" if any(e["stage"] == "review" for e in errors) else \
                "started" if review_started else "already started"
        else:
            stages["review"] = "off"
        if callbacks_seen:
            stages["callbacks"] = "error" if any(e["stage"] == "callback" for e in errors) else \
                f"{callbacks_seen} due, {callbacks_started} started"
        commands = find_commands(transcript, user_label=user_label, agent_name=self._agent_name,
                                 aliases=self._aliases)
        started = 0
        for command in commands:
            token = None
            if self._jobs is not None and about_callbacks(command.text) and not await self._claimed_done(command.dedupe_key):
                token = await self.tokens.issue(command.dedupe_key)
            outcome = await self._dispatch(command_job(command, transcript, user_label, token), tid, errors,
                                           f"turn {command.turn_index + 1}'s command")
            if outcome != "started" and token is not None:
                await self.tokens.revoke(command.dedupe_key)
            started += outcome == "started"
        stages["commands"] = "error" if any(e["stage"] == "command" for e in errors) else \
            f"{len(commands)} found, {started} started"

    async def _dispatch(self, job: Job, tid: int, errors: list[dict[str, str]], what: str) -> str:
        if not await self._claim(job, tid):
            return "known"  # a replay, or a revised transcript: this slot already has its job
        if self._jobs is None:
            await self._settle(job.key, None, "skipped", "no job runner in this process")
            return "skipped"
        try:
            job_id = await self._jobs.start_job(job)
        except Exception as exc:  # the claim stays in `error`: a retry of the event may take it again
            await self._settle(job.key, None, "error", f"{type(exc).__name__}: {exc}")
            errors.append({"stage": job.kind, "message": f"{what}: could not start it ({exc})"[:300]})
            return "error"
        except BaseException:  # cancelled (shutting down) mid-start: leave the slot retryable
            await asyncio.shield(self._settle(job.key, None, "error", "interrupted while starting"))
            raise
        await self._settle(job.key, job_id, "started", "")
        return "started"

    async def _claimed_done(self, key: str) -> bool:
        row = await self.archive.db.fetchone("SELECT state FROM listener_jobs WHERE dedupe_key = ?", (key,))
        return row is not None and row["state"] != "error"

    async def _claim(self, job: Job, tid: int) -> bool:
        """Atomically claim a job slot; an `error` claim may be taken again (a retry)."""
        async with self.archive.db.transaction() as conn:
            async with conn.execute("SELECT state, job_id, created_at FROM listener_jobs WHERE dedupe_key = ?",
                                    (job.key,)) as cursor:
                row = await cursor.fetchone()
            if row is None:
                await conn.execute("INSERT INTO listener_jobs (dedupe_key, transcript_id, kind, label, deliver, "
                                   "created_at) VALUES (?, ?, ?, ?, ?, ?)",
                                   (job.key, tid, job.kind, job.label[:200], job.deliver, self._clock()))
                return True
            stale = row[0] == "claimed" and row[1] is None and row[2] < self._clock() - STALE_CLAIM_S
            if row[0] == "error" or stale:  # a failed start, or one a crash left half-done
                await conn.execute("UPDATE listener_jobs SET state = 'claimed', created_at = ? WHERE dedupe_key = ?",
                                   (self._clock(), job.key))
                return True
            return False

    async def _settle(self, key: str, job_id: str | None, state: str, detail: str) -> None:
        async with self.archive.db.transaction() as conn:
            await conn.execute("UPDATE listener_jobs SET job_id = ?, state = ?, detail = ? WHERE dedupe_key = ?",
                               (job_id, state, detail[:300], key))

    async def _review_status(self, tid: int, status: str) -> None:
        async with self.archive.db.transaction() as conn:
            await conn.execute("UPDATE transcripts SET review_status = ? WHERE id = ?", (status, tid))

    # -- the call card -----------------------------------------------------------------------------

    async def _card(self, transcript: Transcript, tid: int, stages: dict[str, str],
                    errors: list[dict[str, str]]) -> None:
        if self._notifier is None:
            return
        row = await self.archive.db.fetchone("SELECT card, received_at FROM transcripts WHERE id = ?", (tid,))
        if row is not None and row["card"]:
            stages["post"] = "already posted"
            return
        # Every job slot, started or not: one that could not start yet is named as such (the next
        # delivery retries it, and its result still goes under this card).
        jobs = await self.archive.db.fetchall(
            "SELECT COALESCE(job_id, 'not started') AS job_id, kind, label FROM listener_jobs WHERE transcript_id = ? "
            "AND state != 'skipped' ORDER BY rowid", (tid,))
        facts = await self.archive.db.fetchall("SELECT fact FROM listener_facts WHERE transcript_id = ? ORDER BY id",
                                               (tid,))
        ends = [t.end_s for t in transcript.turns if t.end_s is not None]
        starts = [t.start_s for t in transcript.turns if t.start_s is not None]
        card = CallCard(tid, transcript.conversation_id, transcript.direction, transcript.from_number,
                        transcript.to_number, float(row["received_at"]) if row else self._clock(),
                        (max(ends) - min(starts)) if ends and starts else None, len(transcript.turns),
                        tuple(f["fact"] for f in facts), tuple((j["job_id"], j["kind"], j["label"]) for j in jobs))
        try:
            reference = await self._notifier.post_card(card)
        except Exception as exc:  # the next delivery of the event posts it again
            log.warning("call %s: the call card was not posted: %s", transcript.conversation_id, exc)
            stages["post"] = "error"
            errors.append({"stage": "post", "message": f"the call card was not posted ({exc})"[:300]})
            return
        async with self.archive.db.transaction() as conn:  # the notifier may have recorded it already
            await conn.execute("UPDATE transcripts SET card = COALESCE(card, ?) WHERE id = ?", (reference or "posted",
                                                                                              tid))
        stages["post"] = "ok"
