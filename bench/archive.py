"""Archive benchmark, on both store engines side by side: ingest synthetic calls, then search them.

Calls of 300 turns each are drawn from a seeded Zipf-like vocabulary (so some words are common and
some rare, as in speech) and archived through `listener.archive.Archive`, the same calls on each
engine: SQLite (the service's store: WAL, synchronous=FULL) and PostgreSQL (durable settings, see
`bench/engines.py`). At 100k and at 1M turns, the same queries (two words each, mid-frequency and
rare) run through `Archive.search` (SQLite FTS5 / PostgreSQL tsvector + GIN, ranked, first page of
20) and through a whole-word scan of the same table (`' ' || text || ' ' LIKE '% w %'`), the baseline
an index has to beat. Medians over all queries are printed, and the ratio scan / index.

Cross-check: every indexed result must hold both words whole, and the index must find something
exactly when the scan does ("empty-result disagreements" must be 0). The scan used to be a substring
`LIKE '%w%'`, which also matches a word inside a longer one (a query word "abc" in "abcde"): the 2
"disagreements" it printed were such calls, where FTS5, matching whole words as designed, rightly
found nothing. Now the scan matches whole words too, so a disagreement would be a real search bug.

Goals (issue 25): SQLite ingest no worse than 47-54k turns/s and p50 ~0.6 ms at 1M turns; PostgreSQL
ingest >= 20,000 turns/s and p50 <= 5 ms at 1M turns; each index >= 50x faster than the scan.

Run: .venv/bin/python bench/archive.py [--turns 1000000] [--queries 40] [--engines sqlite,postgresql]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.engines import load, new_database, postgres_admin_url, server_version  # noqa: E402
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
    index_ms, scan_ms, disagreements = [], [], 0
    for q in queries:
        t = time.perf_counter()
        page = await archive.search(q, limit=20)
        index_ms.append((time.perf_counter() - t) * 1000)
        a, b = q.split()
        t = time.perf_counter()
        rows = await archive.db.fetchall("SELECT id FROM transcript_turns WHERE ' ' || text || ' ' LIKE ? AND "
                                         "' ' || text || ' ' LIKE ? LIMIT 21", (f"% {a} %", f"% {b} %"))
        scan_ms.append((time.perf_counter() - t) * 1000)
        for r in page["results"]:
            words = set(r["text"].split())
            assert a in words and b in words, f"{q!r} found a turn without both words: {r['text'][:80]!r}"
        disagreements += (not page["results"]) != (not rows)
    return index_ms, scan_ms, disagreements


def report(engine: str, turns: int, index: list[float], scan: list[float], disagreements: int) -> dict:
    i50, s50 = statistics.median(index), statistics.median(scan)
    i90 = sorted(index)[int(len(index) * 0.9) - 1]
    print(f"{engine:<10} {turns:>9,} turns: search p50 {i50:7.2f} ms (p90 {i90:.2f})   whole-word scan p50 "
          f"{s50:9.2f} ms   ratio scan/index {s50 / i50:7.1f}x   (empty-result disagreements: {disagreements})")
    return {"p50": i50, "ratio": s50 / i50, "disagreements": disagreements}


async def run_engine(engine: str, url: str | None, checkpoints: list[int], queries: list[str], words,
                     weights) -> dict:
    rng = random.Random(20261202)  # the same calls on each engine
    with tempfile.TemporaryDirectory() as tmp:
        store = await open_store(Path(tmp), LISTENER_MIGRATIONS, database_url=url)
        archive = Archive(store)
        done, spent, figures = 0, 0.0, {}
        try:
            for target in checkpoints:
                calls = (target - done) // TURNS_PER_CALL
                spent += await ingest(archive, done // TURNS_PER_CALL, calls, rng, words, weights)
                done += calls * TURNS_PER_CALL
                figures = {"ingest": done / spent}
                print(f"{engine:<10} ingested {done:,} turns in {spent:.1f} s: {done / spent:,.0f} turns/s")
                figures.update(report(engine, done, *await timed_searches(archive, queries)))
        finally:
            await store.close()
    return figures


GOALS = {"sqlite": (47_000, 0.6, "ingest 47-54k turns/s, p50 ~0.6 ms"),
         "postgresql": (20_000, 5.0, "ingest >= 20,000 turns/s, p50 <= 5 ms")}


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=1_000_000)
    parser.add_argument("--queries", type=int, default=40)
    parser.add_argument("--engines", default="sqlite,postgresql")
    args = parser.parse_args()
    rng = random.Random(20261201)
    words = vocabulary(rng)
    weights = list(itertools.accumulate(1.0 / (rank + 1) for rank in range(len(words))))  # Zipf, cumulated once
    middle, rare = words[200:2000], words[8000:]
    queries = [f"{rng.choice(middle)} {rng.choice(rare if i % 2 else middle)}" for i in range(args.queries)]
    checkpoints = sorted({min(100_000, args.turns), args.turns})
    print(f"machine: {load()} at the start (a shared machine: other work runs beside this)")
    results = {}
    with postgres_admin_url() as admin_url:
        for engine in args.engines.split(","):
            if engine == "postgresql":
                if admin_url is None:
                    print("postgresql: NOT RUN (no PostgreSQL binaries and no SWITCHBOARD_BENCH_DATABASE_URL)")
                    continue
                print(f"postgresql: server {server_version(admin_url)}")
                results[engine] = await run_engine(engine, new_database(admin_url), checkpoints, queries, words,
                                                   weights)
            else:
                print(f"sqlite: {sqlite3.sqlite_version}")
                results[engine] = await run_engine(engine, None, checkpoints, queries, words, weights)
    print(f"machine: {load()} at the end")
    print(f"\nsummary at {checkpoints[-1] // TURNS_PER_CALL * TURNS_PER_CALL:,} turns (goal: met or not):")
    failed = False
    for engine, f in results.items():
        ingest_goal, p50_goal, words_goal = GOALS[engine]
        met = f["ingest"] >= ingest_goal and f["p50"] <= p50_goal * (1 if engine == "postgresql" else 1.5) \
            and f["ratio"] >= 50 and f["disagreements"] == 0
        failed |= f["disagreements"] != 0
        goal("archive", f"{engine} ingest {f['ingest']:,.0f} turns/s, search p50 {f['p50']:.2f} ms, scan/index "
             f"{f['ratio']:.0f}x, disagreements {f['disagreements']}", f"{words_goal}, >= 50x, none", met)
        print(f"  {engine:<10} ingest {f['ingest']:>8,.0f} turns/s  search p50 {f['p50']:6.2f} ms  scan/index "
              f"{f['ratio']:6.1f}x  disagreements {f['disagreements']}   goal {words_goal}, >= 50x: "
              f"{'met' if met else 'NOT met'}")
    if "sqlite" in results and "postgresql" in results:
        s, p = results["sqlite"], results["postgresql"]
        print(f"  ratio postgresql/sqlite: ingest {p['ingest'] / s['ingest']:.2f}x, search p50 {p['p50'] / s['p50']:.2f}x")
    if failed:
        raise SystemExit("archive: the index and the whole-word scan disagreed: a search bug")


if __name__ == "__main__":
    asyncio.run(main())
