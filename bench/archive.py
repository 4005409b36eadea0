"""Archive benchmark: ingest synthetic calls, then search them with FTS5 and with a LIKE scan.

Calls of 300 turns each are drawn from a seeded Zipf-like vocabulary (so some words are common and
some rare, as in speech) and archived through `listener.archive.Archive` on a real SQLite file (the
service's store: WAL, synchronous=FULL). At 100k and at 1M turns, the same queries (two words each,
mid-frequency and rare) run through `Archive.search` (FTS5, bm25, first page of 20) and through a
`LIKE '%w%'` scan of the same table for the same page; medians over all queries are printed, and the
ratio LIKE / FTS5. Goals: ingest >= 20k turns/s; at 1M turns FTS5 >= 50x faster than LIKE with p50
under 10 ms.

Run: .venv/bin/python bench/archive.py [--turns 1000000] [--queries 40]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.goals import goal  # noqa: E402
from bot.services import LISTENER_MIGRATIONS  # noqa: E402
from common.store import open_store  # noqa: E402
from listener.archive import Archive  # noqa: E402
from listener.model import Transcript, Turn  # noqa: E402

TURNS_PER_CALL = 300
VOCABULARY = 20_000


def vocabulary(rng: random.Random) -> list[str]:
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = set()
    while len(words) < VOCABULARY:
        words.add("".join(rng.choice(letters) for _ in range(rng.randint(3, 9))))
    return sorted(words)


def make_call(n: int, rng: random.Random, words: list[str], cum_weights: list[float]) -> Transcript:
    turns = []
    for i in range(TURNS_PER_CALL):
        length = rng.randint(4, 18)
        turns.append(Turn(i, "TO" if i % 2 else "FROM", " ".join(rng.choices(words, cum_weights=cum_weights, k=length))))
    return Transcript(f"call_{n:07d}", tuple(turns), source="bench", direction="inbound",
                      from_number=f"+1555{n % 10_000:04d}", to_number="+15550000")


async def ingest(archive: Archive, start: int, calls: int, rng: random.Random, words, weights) -> float:
    made = [make_call(start + i, rng, words, weights) for i in range(calls)]  # build outside the timer
    t = time.perf_counter()
    for i, call in enumerate(made):
        await archive.archive(call, "{}", received_at=1_750_000_000.0 + start + i, user_label="TO")
    return time.perf_counter() - t


async def timed_searches(archive: Archive, queries: list[str]) -> tuple[list[float], list[float], int]:
    fts_ms, like_ms, mismatched = [], [], 0
    for q in queries:
        t = time.perf_counter()
        page = await archive.search(q, limit=20)
        fts_ms.append((time.perf_counter() - t) * 1000)
        a, b = q.split()
        t = time.perf_counter()
        rows = await archive.db.fetchall(
            "SELECT id FROM transcript_turns WHERE text LIKE ? AND text LIKE ? LIMIT 21", (f"%{a}%", f"%{b}%"))
        like_ms.append((time.perf_counter() - t) * 1000)
        # LIKE matches substrings, FTS whole words: the page sizes can differ; count where both are empty
        mismatched += (not page["results"]) != (not rows)
    return fts_ms, like_ms, mismatched


def report(turns: int, fts: list[float], like: list[float], mismatched: int) -> tuple[float, float]:
    """Print one size's line; return FTS5's p50 (ms) and the LIKE/FTS5 ratio."""
    f50, l50 = statistics.median(fts), statistics.median(like)
    f90 = sorted(fts)[int(len(fts) * 0.9) - 1]
    print(f"{turns:>9,} turns: FTS5 p50 {f50:7.2f} ms (p90 {f90:.2f})   LIKE p50 {l50:9.2f} ms   "
          f"ratio LIKE/FTS5 {l50 / f50:7.1f}x   (empty-result disagreements: {mismatched})")
    return f50, l50 / f50


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=1_000_000)
    parser.add_argument("--queries", type=int, default=40)
    args = parser.parse_args()
    rng = random.Random(20261201)
    words = vocabulary(rng)
    weights = list(itertools.accumulate(1.0 / (rank + 1) for rank in range(len(words))))  # Zipf, cumulated once
    middle, rare = words[200:2000], words[8000:]
    queries = [f"{rng.choice(middle)} {rng.choice(rare if i % 2 else middle)}" for i in range(args.queries)]
    checkpoints = sorted({min(100_000, args.turns), args.turns})
    with tempfile.TemporaryDirectory() as tmp:
        store = await open_store(Path(tmp), LISTENER_MIGRATIONS)
        archive = Archive(store)
        done, spent = 0, 0.0
        try:
            for target in checkpoints:
                calls = (target - done) // TURNS_PER_CALL
                spent += await ingest(archive, done // TURNS_PER_CALL, calls, rng, words, weights)
                done += calls * TURNS_PER_CALL
                print(f"ingested {done:,} turns in {spent:.1f} s: {done / spent:,.0f} turns/s (goal >= 20,000)")
                f50, ratio = report(done, *await timed_searches(archive, queries))
        finally:
            await store.close()
    print(f"ratio: {ratio:.1f}  (LIKE/FTS5 at {done:,} turns)")
    goal("archive", f"ingest {done / spent:,.0f} turns/s", ">= 20,000", done / spent >= 20_000)
    goal("archive", f"LIKE/FTS5 at {done:,} turns {ratio:.1f}x", ">= 50x", ratio >= 50)
    goal("archive", f"FTS5 p50 at {done:,} turns {f50:.2f} ms", "< 10 ms", f50 < 10)


if __name__ == "__main__":
    asyncio.run(main())
