"""A listener process that dies mid-start, run as `sys.executable listener_crash.py HOME WHEN [DATABASE_URL]`.

It handles one direct-transcript event (call_crash: one named command by the user) on the store in
HOME, and its job starter kills the process (`os._exit`, no cleanup, like SIGKILL or a power cut):

  before-run   after the ledger claimed the job's slot, before any run was recorded
  after-run    after the run was recorded under the job's intent (the runs table), before the
               ledger heard its id
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))

from bot.services import STORE_MIGRATIONS  # noqa: E402
from common.store import open_store  # noqa: E402
from listener.archive import Archive  # noqa: E402
from listener.pipeline import TranscriptPipeline  # noqa: E402
from runs.repository import RunRepository  # noqa: E402

EVENT = {"conversation_id": "call_crash", "event_id": "evt_crash", "source": "local",
         "metadata": {"direction": "outbound", "from": "+15550001", "to": "+15550002"},
         "turns": [{"speaker": "FROM", "text": "Ares, book the plumber for Friday."}]}


class DyingStarter:
    def __init__(self, repo: RunRepository, when: str) -> None:
        self.repo, self.when = repo, when

    async def start_job(self, job) -> str:
        if self.when == "after-run":
            await self.repo.create_once(lane="command", task=job.task, requester_id=None, owner="crashed",
                                        idempotency_key=job.intent, now=1.0)
        os._exit(9)


async def main(home: str, when: str, database_url: str | None) -> None:
    store = await open_store(Path(home), STORE_MIGRATIONS, database_url=database_url)
    pipeline = TranscriptPipeline(Archive(store), download=None, jobs=DyingStarter(RunRepository(store), when),
                                  agent_name="Ares")
    await pipeline.handle(EVENT)
    raise AssertionError("the starter should have ended the process")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None))
