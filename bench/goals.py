"""Each bench's goals, one line each, and the table `make bench` ends with.

A bench states each goal with `goal(bench, figure, target, met)`: one `goal:` line in its own output
and, when `make bench` runs it (BENCH_SUMMARY names a file), one JSON row appended there.
`python bench/goals.py FILE BENCH...` prints the table: each bench, its figure, its goal, met or not;
a bench with no row (it failed, or stopped `make bench` before it ran) says so.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

SUMMARY = "BENCH_SUMMARY"


def goal(bench: str, figure: str, target: str, met: bool) -> bool:
    """Print `goal: FIGURE (goal TARGET): met|MISSED` and record the row for `make bench`'s table."""
    print(f"goal: {figure} (goal {target}): {'met' if met else 'MISSED'}")
    if path := os.environ.get(SUMMARY):
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps({"bench": bench, "figure": figure, "goal": target, "met": met}) + "\n")
    return met


def rows(path: Path, benches: list[str]) -> list[dict]:
    """The recorded rows in bench order, and one 'no goal recorded' row for each bench without any."""
    found = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()] if path.exists() else []
    ordered = []
    for bench in benches or list(dict.fromkeys(r["bench"] for r in found)):
        mine = [r for r in found if r["bench"] == bench]
        ordered += mine or [{"bench": bench, "figure": "-", "goal": "no goal recorded (failed or did not run)",
                             "met": None}]
    return ordered


def table(rows: list[dict]) -> str:
    cells = [("bench", "figure", "goal", "met")] + [
        (r["bench"], r["figure"], r["goal"], {True: "met", False: "MISSED", None: "-"}[r["met"]]) for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(4)]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * width for width in widths))
    missed = sum(r["met"] is False for r in rows)
    lines.append(f"{sum(r['met'] is True for r in rows)} met, {missed} missed"
                 + (" (a loaded machine misses time goals: see each bench's output)" if missed else ""))
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python bench/goals.py SUMMARY_FILE [BENCH ...]", file=sys.stderr)
        return 2
    print(f"\n== make bench: each goal (load average {os.getloadavg()[0]:.1f})")
    print(table(rows(Path(argv[0]), argv[1:])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
