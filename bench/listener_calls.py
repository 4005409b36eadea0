"""The listener end to end on each store engine: phone calls handled per second, from an event to its ack.

Each call is one Smartnumbers event through `listener.pipeline.TranscriptPipeline.handle`, as the
stream hands it over: the transcript (60 turns of Markdown, one named command in it) is parsed and
archived, the review and the command are claimed in the execution ledger and started as runs (a
run ticket written under the job's idempotency key, as the runs service does first), the call card is
claimed and posted, and the ack is built. What cannot exist here stands in at no cost: the download
(the body is in memory), the model (no fact extraction), Discord (the card is taken at once) and the
agent (the run is recorded, not executed). So the figure is the store-bound work of each call.
`--concurrency` events are in flight at once, as deliveries of several calls would be.

Baseline in the same run: SQLite. Run: .venv/bin/python bench/listener_calls.py [--calls 300]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.engines import load, new_database, postgres_admin_url, server_version  # noqa: E402
from bench.goals import goal  # noqa: E402
from bot.services import STORE_MIGRATIONS  # noqa: E402
from common.store import open_store  # noqa: E402
from listener.archive import Archive  # noqa: E402
from listener.callbacks import Callbacks  # noqa: E402
from listener.jobs import Job  # noqa: E402
from listener.pipeline import TranscriptPipeline  # noqa: E402
from runs.repository import RunRepository  # noqa: E402

TURNS = 60


def body(n: int) -> bytes:
    lines = []
    for i in range(TURNS):
        speaker = "FROM" if i % 2 else "TO"
        text = (f"Ares, add the follow-up for order {48000 + n} to my calendar." if i == 5 else
                f"Line {i} of call {n}: the delivery window, the invoice and who signs for it.")
        lines.append(f"{i + 1}\n[00:00:{i:02d},000 --> 00:00:{i:02d},900]\n**{speaker}**: {text}\n")
    return "\n".join(lines).encode()


class RunTickets:
    """The runs service's first step for a job: a ticket under its idempotency key (`runs.repository`)."""

    def __init__(self, store) -> None:
        self.runs = RunRepository(store)

    async def start_job(self, job: Job) -> str:
        ticket, _ = await self.runs.create_once(lane="command", task=job.task[:200], requester_id=None,
                                                owner="bench:1:listen", idempotency_key=job.intent, now=time.time())
        return f"run-{ticket.id}"


class Cards:
    def __init__(self) -> None:
        self.posted = 0

    async def post_card(self, card) -> str:
        self.posted += 1
        return f"card-{self.posted}"


async def calls_per_second(url: str | None, calls: int, concurrency: int) -> tuple[float, float]:
    """(calls per second, median ms per call) over `calls` events, `concurrency` at a time."""
    bodies = {f"https://transcripts.example/{n}.md": body(n) for n in range(calls)}

    async def download(url: str, expires_at: str | None) -> bytes:
        return bodies[url]

    with tempfile.TemporaryDirectory() as tmp:
        store = await open_store(Path(tmp), STORE_MIGRATIONS, database_url=url)
        try:
            await Callbacks(store).set_review("Note who called and what they want")
            pipeline = TranscriptPipeline(Archive(store), download=download, jobs=RunTickets(store),
                                          agent_name="Ares", notifier=Cards())
            queue: asyncio.Queue[int] = asyncio.Queue()
            for n in range(calls):
                queue.put_nowait(n)
            each: list[float] = []

            async def worker() -> None:
                while not queue.empty():
                    n = queue.get_nowait()
                    t = time.perf_counter()
                    ack = await pipeline.handle({"type": "transcript_url", "event_id": f"evt_{n}",
                                                 "conversation_id": f"call_{n:06d}", "source": "bench",
                                                 "metadata": {"direction": "outbound", "from": "+15550001",
                                                              "to": "+15550002"},
                                                 "url": f"https://transcripts.example/{n}.md",
                                                 "expires_at": "2099-01-01T00:00:00Z"})
                    each.append((time.perf_counter() - t) * 1000)
                    assert ack["success"] and len(ack["job_ids"]) == 2, ack

            start = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(concurrency)))
            spent = time.perf_counter() - start
        finally:
            await store.close()
    return calls / spent, statistics.median(each)


FLOOR_CALLS_PER_S = 10


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    print(f"machine: {load()} at the start (a shared machine: other work runs beside this)")
    figures = {}
    with postgres_admin_url() as admin_url:
        figures["sqlite"] = await calls_per_second(None, args.calls, args.concurrency)
        if admin_url is None:
            print("postgresql: NOT RUN (no PostgreSQL binaries and no SWITCHBOARD_BENCH_DATABASE_URL)")
        else:
            print(f"postgresql: server {server_version(admin_url)}")
            figures["postgresql"] = await calls_per_second(new_database(admin_url), args.calls, args.concurrency)
    print(f"machine: {load()} at the end")
    for engine, (rate, median) in figures.items():
        print(f"  {engine:<10} {rate:7.1f} calls/s  ({median:.1f} ms per call, median; {args.concurrency} at once, "
              f"{TURNS} turns, 2 jobs and a card each)")
        # A busy phone line brings a call every few seconds; 10 a second per process is far above any.
        goal("listener_calls", f"{engine} {rate:.1f} calls/s", f">= {FLOOR_CALLS_PER_S} calls/s",
             rate >= FLOOR_CALLS_PER_S)
    if len(figures) == 2:
        print(f"  ratio postgresql/sqlite: {figures['postgresql'][0] / figures['sqlite'][0]:.2f}x calls/s")


if __name__ == "__main__":
    asyncio.run(main())
