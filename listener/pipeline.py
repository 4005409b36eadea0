"""One Smartnumbers event → download, parse, archive, memory and jobs, a call card → its ack.

The transcript is archived (committed) before anything is acknowledged or dispatched. After that,
two things happen side by side: durable-fact memory (one model request, validated in code) and the
jobs — the review, each enabled callback, each named command — each claimed in the execution
ledger (`listener.ledger.ExecutionLedger`) under a stable key before it starts, so a replayed event
finds the same archived call and the same jobs and starts nothing twice. A step that failed (a model
down, a runs service that refused, a card Discord would not take) is retried by the next delivery of
the event, and only that step. Then the call card is posted once, naming the jobs (one not started
yet says so; its result still goes under the card when a later delivery starts it). Who the user is
comes from the local direction mapping, never from the payload.

Several listeners may share the store and be offered the same event. A claim records who holds it:
a job slot another live process is starting (or a call's facts or card it is working on) is waited
for, briefly, and otherwise reported as not done yet; one whose owner is gone is taken again, and its
start asks for the same run (`Job.intent`), so a crash between recording a run and the ledger
hearing of it never starts a second one. An ack says success only when every job of its call has a
run. `resume()`, at start, dispatches what a crash left without a run.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from listener.archive import Archive
from listener.callbacks import Callbacks, MutationTokens
from listener.download import TranscriptDownloadError
from listener.extract import ExtractionError, FactExtractor
from listener.jobs import Job, JobStarter, about_callbacks, callback_job, command_job, review_job
from listener.ledger import Claim, ExecutionLedger, process_alive
from listener.memory import Memory, validate
from listener.model import Transcript, user_label_for
from listener.named_commands import CallCommand, find_commands
from listener.text import quote_untrusted
from listener.transcript import TranscriptError, parse_transcript

log = logging.getLogger(__name__)

Download = Callable[[str, str | None], Awaitable[bytes]]
HELD_POLL_S = 0.2  # how often a delivery looks again at a claim another process holds…
HELD_POLLS = 50  # …and how many times, before its ack says that step is not done yet


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
                 auto_review: bool = True, clock: Callable[[], float] | None = None, owner: str | None = None,
                 alive: Callable[[str], bool] = process_alive,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        """`owner` names this process on the claims it takes, and `alive(owner)` says whether another
        claim's owner still runs (default: a process of this host by that pid). `clock`: for tests; the
        ledger's claims then use it too, else the store's clock (the database server's on PostgreSQL)."""
        self.archive = archive
        self.ledger = ExecutionLedger(archive.db, owner=owner, alive=alive, clock=clock)
        clock = clock or time.time
        self._sleep = sleep
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
        if isinstance(raw, bytes):  # decoded once: the bytes and the text are never both kept
            try:
                raw = raw.decode("utf-8-sig")
            except UnicodeDecodeError:
                return failed("parse", "the transcript is not UTF-8 text")
        try:
            transcript = parse_transcript(raw, conversation_id=conversation_id,
                                          metadata={**metadata, "source": event.get("source") or ""})
        except TranscriptError as exc:
            return failed("parse", str(exc))
        stages["parse"] = "ok"
        user_label = user_label_for(transcript.direction, inbound=self._labels["inbound"],
                                    outbound=self._labels["outbound"])
        text = raw if isinstance(raw, str) else json.dumps(raw)
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
                    log.error("call %s: the %s step failed: %s", quote_untrusted(conversation_id), stage,
                              quote_untrusted(f"{type(outcome).__name__}: {outcome}", 300))
                    log.debug("call %s: the %s step's traceback", quote_untrusted(conversation_id), stage,
                              exc_info=outcome)
                    stages[stage] = "error"
                    errors.append({"stage": stage, "message": f"{type(outcome).__name__}: {outcome}"[:300]})
            job_ids = await self.job_ids(tid)
            await self._card(transcript, tid, stages, errors)
        return ack(job_ids)

    async def resume(self) -> dict[str, list[str]]:
        """When the listener starts: each archived call with a job that has no run — a start a crash
        cut short, or one that failed and whose event never came again — gets its jobs dispatched
        again (only those: a job with a run is never started twice). Returns each such call's
        conversation id with the job ids it has now; failures are logged, as the ack would say."""
        resumed: dict[str, list[str]] = {}
        for tid in await self.ledger.calls_without_runs():
            transcript, user_label = await self.archive.load(tid)
            stages: dict[str, str] = {}
            errors: list[dict[str, str]] = []
            async with self._conversation(transcript.conversation_id):
                await self._dispatch_all(transcript, tid, user_label, stages, errors)
            for error in errors:
                log.warning("call %s: %s still not started: %s", quote_untrusted(transcript.conversation_id), error["stage"],
                            error["message"])
            resumed[transcript.conversation_id] = await self.job_ids(tid)
        return resumed

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
        """Every job of the call that truly started (its run exists)."""
        return await self.ledger.job_ids(transcript_id)

    async def _claim(self, take: Callable[[], Awaitable[Claim]]) -> Claim:
        """Take a claim; while another live process holds it, look again (bounded) until it is done
        or given up. A claim still held after that is reported as not done (the ack says so)."""
        claim = await take()
        for _ in range(HELD_POLLS):
            if claim.won or claim.done:
                break
            await self._sleep(HELD_POLL_S)
            claim = await take()
        return claim

    async def _release(self, tid: int, step: str) -> None:
        await asyncio.shield(self.ledger.release_step(tid, step))

    # -- memory ------------------------------------------------------------------------------------

    async def _remember(self, transcript: Transcript, tid: int, user_label: str | None, stages: dict[str, str],
                        errors: list[dict[str, str]]) -> None:
        if self._extractor is None:  # nothing to learn with: nothing to claim
            stages["memory"] = "already done" if await self.memory.status(tid) == "done" else \
                "skipped (no text model configured)"
            return
        await self._once(tid, "memory", "memory", "already done", "learning from this call", stages, errors,
                         lambda: self._learn(transcript, tid, user_label, stages, errors))

    async def _once(self, tid: int, step: str, stage: str, done: str, doing: str, stages: dict[str, str],
                    errors: list[dict[str, str]], work: Callable[[], Awaitable[None]]) -> None:
        """`work` for this call's `step` by exactly one process: claimed in the ledger, released after."""
        claim = await self._claim(lambda: self.ledger.claim_step(tid, step))
        if claim.done:
            stages[stage] = done
            return
        if not claim.won:
            stages[stage] = "error"
            errors.append({"stage": stage, "message": f"another Switchboard process is still {doing}; the next "
                                                      "delivery reports it"})
            return
        try:
            await work()
        finally:
            await self._release(tid, step)

    async def _learn(self, transcript: Transcript, tid: int, user_label: str | None, stages: dict[str, str],
                     errors: list[dict[str, str]]) -> None:
        assert self._extractor is not None
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
            log.info("call %s: fact not kept (%s)", quote_untrusted(transcript.conversation_id), rejected.reason)
        added = await self.memory.save(tid, checked.accepted)
        stages["memory"] = f"{added} fact{'s' * (added != 1)} kept, {len(checked.rejected)} rejected"

    # -- jobs --------------------------------------------------------------------------------------

    async def _dispatch_all(self, transcript: Transcript, tid: int, user_label: str | None,
                            stages: dict[str, str], errors: list[dict[str, str]]) -> None:
        review_started = callbacks_started = 0
        review_seen = False
        callbacks_seen = 0
        for callback in await self.callbacks.due_for_call(tid, auto_review=self._auto_review):
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
            prepare = None
            if about_callbacks(command.text):
                prepare = functools.partial(self._with_token, command, transcript, user_label)
            outcome = await self._dispatch(command_job(command, transcript, user_label, None), tid, errors,
                                           f"turn {command.turn_index + 1}'s command", prepare)
            started += outcome == "started"
        stages["commands"] = "error" if any(e["stage"] == "command" for e in errors) else \
            f"{len(commands)} found, {started} started"

    async def _with_token(self, command: CallCommand, transcript: Transcript, user_label: str | None) -> Job:
        """The command's job with a fresh token — issued only once this delivery holds the slot, so a
        token exists only for a start that is really being made."""
        return command_job(command, transcript, user_label, await self.tokens.issue(command.dedupe_key))

    async def _dispatch(self, job: Job, tid: int, errors: list[dict[str, str]], what: str,
                        prepare: Callable[[], Awaitable[Job]] | None = None) -> str:
        """Claim the job's slot and start it: "started", "known" (it has its run), or "error" (added
        to `errors`: it could not start, or another process is still starting it)."""
        if self._jobs is None:  # nothing claimed: a process that can start jobs takes the slot later
            errors.append({"stage": job.kind, "message": f"{what}: not started (no job runner in this process)"})
            return "error"
        claim = await self._claim(lambda: self.ledger.claim_job(key=job.key, transcript_id=tid, kind=job.kind,
                                                                label=job.label, deliver=job.deliver))
        if claim.done:
            return "known"  # a replay, or a revised transcript: this slot already has its run
        if not claim.won:
            errors.append({"stage": job.kind, "message": f"{what}: another Switchboard process is still starting "
                                                         "it; the next delivery reports its run"})
            return "error"
        try:
            if prepare is not None:
                job = await prepare()
            job_id = await self._jobs.start_job(job)
        except Exception as exc:  # the slot is released: a retry of the event may take it again
            await self.ledger.failed(job.key, f"{type(exc).__name__}: {exc}")
            if prepare is not None:
                await self.tokens.revoke(job.key)
            errors.append({"stage": job.kind, "message": f"{what}: could not start it ({exc})"[:300]})
            return "error"
        except BaseException:  # cancelled (shutting down) mid-start: the next delivery retries it, same intent
            await asyncio.shield(self.ledger.failed(job.key, "interrupted while starting"))
            raise
        await self.ledger.started(job.key, job_id)
        return "started"

    async def _review_status(self, tid: int, status: str) -> None:
        # never over a review that has already landed (a quick run can be delivered before this line)
        await self.archive.queue_review(tid, status)

    # -- the call card -----------------------------------------------------------------------------

    async def _card(self, transcript: Transcript, tid: int, stages: dict[str, str],
                    errors: list[dict[str, str]]) -> None:
        if self._notifier is None:
            return
        await self._once(tid, "card", "post", "already posted", "posting the call card", stages, errors,
                         lambda: self._post_card(transcript, tid, stages, errors))

    async def _post_card(self, transcript: Transcript, tid: int, stages: dict[str, str],
                         errors: list[dict[str, str]]) -> None:
        received_at = await self.archive.received_at(tid)
        # Every job slot, started or not: one that could not start yet is named as such (the next
        # delivery retries it, and its result still goes under this card).
        jobs = await self.ledger.card_jobs(tid)
        facts = await self.memory.facts_of(tid)
        ends = [t.end_s for t in transcript.turns if t.end_s is not None]
        starts = [t.start_s for t in transcript.turns if t.start_s is not None]
        card = CallCard(tid, transcript.conversation_id, transcript.direction, transcript.from_number,
                        transcript.to_number, received_at if received_at is not None else self._clock(),
                        (max(ends) - min(starts)) if ends and starts else None, len(transcript.turns),
                        tuple(facts), tuple(jobs))
        try:
            reference = await self._notifier.post_card(card)
        except Exception as exc:  # the next delivery of the event posts it again
            log.warning("call %s: the call card was not posted: %s", quote_untrusted(transcript.conversation_id),
                        quote_untrusted(str(exc), 300))
            stages["post"] = "error"
            errors.append({"stage": "post", "message": f"the call card was not posted ({exc})"[:300]})
            return
        await self.ledger.card_posted(tid, reference or "posted")  # the notifier may have recorded it already
        stages["post"] = "ok"
