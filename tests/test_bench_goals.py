"""`make bench` ends with a table of every bench's goals (bench/goals.py), and every bench states one."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from bench.goals import SUMMARY, goal, rows, table
from tests.support.paths import ROOT


def benches() -> list[str]:
    return re.search(r"^BENCHES := (.+)$", (ROOT / "Makefile").read_text(), re.M).group(1).split()


def test_every_bench_make_bench_runs_records_a_goal():
    silent = [b for b in benches() if f'goal("{b}", ' not in (ROOT / "bench" / f"{b}.py").read_text()]
    assert silent == []


def test_a_goal_is_printed_and_recorded_for_the_table(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(SUMMARY, str(tmp_path / "goals.jsonl"))
    assert goal("receive", "whole / raw 1.30", "<= 2", True) is True
    assert goal("resume", "READY→spoke 4.10 s", "<= 3 s", False) is False
    assert capsys.readouterr().out == ("goal: whole / raw 1.30 (goal <= 2): met\n"
                                       "goal: READY→spoke 4.10 s (goal <= 3 s): MISSED\n")
    recorded = [json.loads(line) for line in (tmp_path / "goals.jsonl").read_text().splitlines()]
    assert recorded == [{"bench": "receive", "figure": "whole / raw 1.30", "goal": "<= 2", "met": True},
                        {"bench": "resume", "figure": "READY→spoke 4.10 s", "goal": "<= 3 s", "met": False}]


def test_the_table_lists_each_bench_in_order_and_says_which_recorded_nothing(tmp_path):
    path = tmp_path / "goals.jsonl"
    path.write_text(json.dumps({"bench": "resume", "figure": "READY→spoke 4.10 s", "goal": "<= 3 s", "met": False})
                    + "\n" + json.dumps({"bench": "receive", "figure": "ratio 1.30", "goal": "<= 2", "met": True}) + "\n")
    lines = table(rows(path, ["receive", "archive", "resume"])).splitlines()
    assert [line.split()[0] for line in lines[2:5]] == ["receive", "archive", "resume"]
    assert lines[2].endswith("met") and lines[4].endswith("MISSED")
    assert "no goal recorded (failed or did not run)" in lines[3] and lines[3].endswith("-")
    assert lines[-1].startswith("1 met, 1 missed")
    # the columns line up: each row's goal starts where the header's does
    assert len({line.index(word) for line, word in zip(lines[:1] + lines[2:5], ["goal", "<= 2", "no goal", "<= 3 s"],
                                                         strict=True)}) == 1


def test_goals_py_prints_the_table_from_a_file():
    out = subprocess.run([sys.executable, "bench/goals.py", "/nonexistent/goals.jsonl", "receive"], cwd=ROOT,
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "== make bench: each goal" in out.stdout and "receive" in out.stdout
