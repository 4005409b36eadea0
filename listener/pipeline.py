"""One Smartnumbers event → download, parse, archive, named commands → its acknowledgement.

The transcript is archived (committed) before anything is acknowledged or dispatched; a replayed
event finds the same archived call and the same jobs, so nothing is archived or started twice.
Named commands are the user speaker's own direct requests ("Ares, add that to my calendar"): each
becomes one job through the injected `JobStarter`, claimed first in the execution ledger under its
stable dedupe key. The user speaker comes from the local direction mapping, never from the payload.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from .archive import Archive
from .commands import CallCommand, find_commands
from .download import TranscriptDownloadError
from .model import Transcript, user_label_for
from .transcript import TranscriptError, parse_transcript


class JobStarter(Protocol):
    """Starts a named command as a background run; returns its job id (the service implements it)."""

    async def start_command(self, command: CallCommand, transcript: Transcript) -> str: ...


Download = Callable[[str, str | None], Awaitable[bytes]]


class TranscriptPipeline:
    def __init__(self, archive: Archive, *, download: Download, jobs: JobStarter | None, agent_name: str,
                 aliases: Sequence[str] = (), inbound_user: str = "TO", outbound_user: str = "FROM",
                 clock: Callable[[], float] = time.time) -> None:
        self.archive = archive
        self._download = download
        self._jobs = jobs
        self._agent_name = agent_name
        self._aliases = tuple(aliases)
        self._labels = {"inbound": inbound_user, "outbound": outbound_user}
        self._clock = clock

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
        archived = await self.archive.archive(transcript, text, received_at=self._clock(), user_label=user_label)
        stages["archive"] = "ok" if archived.created else "already archived"
        job_ids = await self._commands(transcript, archived.transcript_id, user_label, stages, errors)
        return ack(job_ids)

    async def _commands(self, transcript: Transcript, transcript_id: int, user_label: str | None,
                        stages: dict[str, str], errors: list[dict[str, str]]) -> list[str]:
        commands = find_commands(transcript, user_label=user_label, agent_name=self._agent_name,
                                 aliases=self._aliases)
        started = 0
        for command in commands:
            if not await self._claim(command.dedupe_key, transcript_id):
                continue  # a replay, or a revised transcript: this address already has its job
            if self._jobs is None:
                await self._settle(command.dedupe_key, None, "skipped", "no job runner in this process")
                continue
            try:
                job_id = await self._jobs.start_command(command, transcript)
            except Exception as exc:  # the claim stays in `error`: a retry of the event may take it again
                await self._settle(command.dedupe_key, None, "error", f"{type(exc).__name__}: {exc}")
                errors.append({"stage": "commands", "message": f"turn {command.turn_index}: could not start the "
                                                              f"command ({type(exc).__name__})"})
                continue
            await self._settle(command.dedupe_key, job_id, "started", "")
            started += 1
        stages["commands"] = "error" if any(e["stage"] == "commands" for e in errors) else \
            f"{len(commands)} found, {started} started"
        rows = await self.archive.db.fetchall(
            "SELECT job_id FROM listener_jobs WHERE transcript_id = ? AND job_id IS NOT NULL ORDER BY created_at, "
            "dedupe_key", (transcript_id,))
        return [row["job_id"] for row in rows]

    async def _claim(self, key: str, transcript_id: int) -> bool:
        """Atomically claim a job slot; an `error` claim may be taken again (a retry)."""
        async with self.archive.db.transaction() as conn:
            async with conn.execute("SELECT state FROM listener_jobs WHERE dedupe_key = ?", (key,)) as cursor:
                row = await cursor.fetchone()
            if row is None:
                await conn.execute("INSERT INTO listener_jobs (dedupe_key, transcript_id, kind, created_at) "
                                   "VALUES (?, ?, 'command', ?)", (key, transcript_id, self._clock()))
                return True
            if row[0] == "error":
                await conn.execute("UPDATE listener_jobs SET state = 'claimed' WHERE dedupe_key = ?", (key,))
                return True
            return False

    async def _settle(self, key: str, job_id: str | None, state: str, detail: str) -> None:
        async with self.archive.db.transaction() as conn:
            await conn.execute("UPDATE listener_jobs SET job_id = ?, state = ?, detail = ? WHERE dedupe_key = ?",
                               (job_id, state, detail[:300], key))
