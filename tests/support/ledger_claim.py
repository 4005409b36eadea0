"""One process's claim on a shared store, run as `sys.executable ledger_claim.py HOME WHAT [DATABASE_URL]`.

Opens the store in HOME (or at DATABASE_URL), prints "ready", waits for a line on stdin (the go signal, so that every
process claims at the same moment), makes one claim, prints the answer as one JSON line, then
holds on (alive, so its claim stays held) until stdin closes.

  job        ExecutionLedger.claim_job on the slot `["command","call_1","turn",0]` of call_1
  delivery   RunRepository.claim of run 1 (the right to deliver it)
  create     RunRepository.create_once under the key `listener-once`
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))

from common.store import open_store  # noqa: E402
from listener.ledger import ExecutionLedger  # noqa: E402
from listener.repository import MIGRATIONS as LISTENER  # noqa: E402
from runs.procs import owner_token  # noqa: E402
from runs.repository import MIGRATIONS as RUNS  # noqa: E402
from runs.repository import RunRepository  # noqa: E402

STORE_MIGRATIONS = (*RUNS, *LISTENER)  # bot.services's, without its imports

JOB_KEY = '["command","call_1","turn",0]'


async def main(home: str, what: str, database_url: str | None) -> None:
    store = await open_store(Path(home), STORE_MIGRATIONS, database_url=database_url)
    loop = asyncio.get_running_loop()
    print("ready", flush=True)
    await loop.run_in_executor(None, sys.stdin.readline)
    owner = owner_token()
    if what == "job":
        claim = await ExecutionLedger(store, owner=owner).claim_job(key=JOB_KEY, transcript_id=1, kind="command",
                                                                     label="book it", deliver="")
        answer = {"won": claim.won, "done": claim.done, "holder": claim.holder}
    elif what == "delivery":
        answer = {"won": await RunRepository(store).claim(1, owner)}
    else:
        ticket, created = await RunRepository(store).create_once(lane="command", task="t", requester_id=None,
                                                                 owner=owner, idempotency_key="listener-once", now=1.0)
        answer = {"won": created, "run": ticket.id}
    print(json.dumps(answer), flush=True)
    await loop.run_in_executor(None, sys.stdin.read)  # hold on until the test lets go
    await store.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None))
