"""The Smartnumbers listener in the app: the stream client over the transcript pipeline, whose jobs
(the review, callbacks, named commands) start as background runs.

`switchboard listen` runs it alone (`bot.cli.listen`); `switchboard run` runs it beside the Discord
bot (`bot.cli.run`). Both build it through `bot.services.Services.listener`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from bot.settings import Settings, text_model_key
from common.store import Store
from listener.archive import Archive
from listener.download import TranscriptDownloader
from listener.extract import FactExtractor
from listener.jobs import Job
from listener.pipeline import CallNotifier, TranscriptPipeline
from listener.text import quote_untrusted
from runs import Refused, RunService

log = logging.getLogger(__name__)



class RunJobs:
    """Listener jobs (the review, callbacks, named commands) as background runs. The job's context —
    the transcript, a named command's token — reaches the agent but is never stored with the run."""

    def __init__(self, runs: RunService) -> None:
        self._runs = runs

    async def start_job(self, job: Job) -> str:
        answer = await self._runs.delegate(job.task, context=job.context, scrub=job.secrets,
                                           idempotency_key=job.intent)
        if isinstance(answer, Refused):
            raise RuntimeError(answer.reason)
        return f"run-{answer.run}"


def listener_problem(settings: Settings) -> str | None:
    """Why the listener cannot start (one line, no secrets), or None. (A stream URL the key may not go to
    is a settings problem, which stops every command: `bot.settings`.)"""
    key = settings.listener_key.get_secret_value() if settings.listener_key is not None else ""
    if not key:
        return ("TRANSCRIPT_LISTENER_API_KEY is not set: put the Smartnumbers transcript listener key in .env "
                "(the rest of Switchboard runs without it)")
    return None


def build_extractor(settings: Settings) -> FactExtractor | None:
    """The durable-fact model, or None (memory is then skipped, and the ack and doctor say why)."""
    key, _ = text_model_key(settings)
    return FactExtractor(url=settings.text_url, key=key, model=settings.text_model) if key else None


def build_pipeline(settings: Settings, archive: Archive, runs: RunService | None, *,
                   notifier: CallNotifier | None = None, extractor: FactExtractor | None = None) -> TranscriptPipeline:
    download = TranscriptDownloader(max_bytes=settings.max_transcript_bytes, allowed_hosts=settings.transcript_hosts,
                                    allow_insecure_local=settings.allow_insecure_local)
    return TranscriptPipeline(archive, download=download, jobs=RunJobs(runs) if runs is not None else None,
                              agent_name=settings.agent_name, aliases=settings.activation_names,
                              extractor=extractor, notifier=notifier, auto_review=settings.auto_review)


KeySource = Callable[[], "str | None"]


def rotating_key(env_file: Path | None, environ: Mapping[str, str] | None = None) -> KeySource:
    """TRANSCRIPT_LISTENER_API_KEY read afresh at every connect — the environment over the env file,
    as at start-up — so a key rotated in `.env` works without a restart. A file that cannot be read
    or a malformed key gives None (the client then waits and retries; nothing is sent)."""
    from bot.environment import EnvFileError, read_variables
    from bot.setting_rules import check_token

    def read() -> str | None:
        try:
            variables = read_variables(env_file, environ)
        except EnvFileError as exc:  # the file went away or broke: the environment alone still counts
            log.error("cannot read the env file again (%s); using the environment alone", str(exc).split(":")[0])
            variables = {k: v.strip() for k, v in (os.environ if environ is None else environ).items()}
        value = variables.get("TRANSCRIPT_LISTENER_API_KEY") or None
        try:
            if value:
                check_token(value)
        except ValueError as exc:
            log.error("TRANSCRIPT_LISTENER_API_KEY is unusable now: %s", exc)
            return None
        return value

    return read


class Listener:
    """The stream client over the pipeline, and what must be closed with it."""

    def __init__(self, settings: Settings, store: Store, runs: RunService | None,
                 notifier: CallNotifier | None = None, key: KeySource | None = None) -> None:
        from listener.stream import StreamClient

        self.extractor = build_extractor(settings)
        self.pipeline = build_pipeline(settings, Archive(store), runs, notifier=notifier, extractor=self.extractor)
        fixed = settings.listener_key
        key = key or (lambda: fixed.get_secret_value() if fixed else None)
        self.stream = StreamClient(settings.stream_url, key=key,
                                   allowed_hosts=settings.stream_hosts,
                                   allow_insecure_local=settings.allow_insecure_local,
                                   handle=_logged(self.pipeline.handle), max_message_bytes=settings.max_message_bytes)
        if self.extractor is None:
            log.info("durable-fact memory is off: %s is not set", text_model_key(settings)[1])

    async def start(self) -> None:
        await self.stream.start()

    async def run(self) -> None:
        await self.stream.run()

    async def stop(self) -> None:
        await self.stream.stop()
        if self.extractor is not None:
            await self.extractor.aclose()


def _logged(handle):
    async def wrapped(event: dict[str, Any]) -> dict[str, Any]:
        ack = await handle(event)
        log.info("call %s (event %s): %s%s", quote_untrusted(ack.get("conversation_id")),
                 quote_untrusted(ack.get("event_id")),
                 "ok" if ack.get("success") else "failed", f", jobs {', '.join(ack['job_ids'])}" if ack.get("job_ids")
                 else "")
        for error in ack.get("errors", []):
            log.warning("call %s: %s failed: %s", quote_untrusted(ack.get("conversation_id")), error["stage"],
                        quote_untrusted(error["message"], 300))
        return ack

    return wrapped
