"""One module owns every SQL statement on the listener's tables: `listener/repository.py`. Checked on
the source of listener/, bot/ and runs/: no other string literal there is a statement on one of them."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from listener.repository import MIGRATIONS
from tests.support.paths import ROOT

OWNERS = {"listener/repository.py", "runs/repository.py"}  # the repository modules: statements belong there

# Every string literal of each file, an f-string's parts joined around `{}`, with its line. Parsed in a
# fresh interpreter (as tests/test_layout.py does): CPython 3.11.7's AST builder can fail with "recursion
# depth mismatch" in a process whose earlier work upset its counter.
_LITERALS = """
import ast, json, sys
found = []
for path in sys.argv[1:]:
    tree = ast.parse(open(path, encoding="utf-8").read(), filename=path)
    parts = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            parts.update(id(v) for v in node.values)
            text = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
            found.append([path, node.lineno, text])
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in parts:
            found.append([path, node.lineno, node.value])
print(json.dumps(found))
"""


def listener_tables() -> list[str]:
    """Every table the listener's migrations create (FTS5 indexes included)."""
    return sorted({name for m in MIGRATIONS for sql in (m.sql, m.sqlite, m.postgresql)
                   for name in re.findall(r"CREATE\s+(?:VIRTUAL\s+)?TABLE\s+(\w+)", sql, re.IGNORECASE)})


def statement_pattern(tables: list[str]) -> re.Pattern[str]:
    table = "(?:" + "|".join(map(re.escape, tables)) + r")\b"
    return re.compile(rf"\bSELECT\b[^;]*?\b(?:FROM|JOIN)\s+{table}|\bINSERT\s+(?:OR\s+\w+\s+)?INTO\s+{table}|"
                      rf"\bUPDATE\s+{table}\s+SET\b|\bDELETE\s+FROM\s+{table}", re.IGNORECASE)


def statements(folders: tuple[str, ...]) -> list[tuple[str, int, str]]:
    """(file, line, statement) of each string literal under `folders` that is a statement on a
    listener table."""
    files = sorted(str(path) for folder in folders for path in (ROOT / folder).rglob("*.py"))
    out = subprocess.run([sys.executable, "-c", _LITERALS, *files], check=True, capture_output=True, text=True)
    pattern = statement_pattern(listener_tables())
    return [(str(Path(path).relative_to(ROOT)), line, " ".join(text.split()))
            for path, line, text in json.loads(out.stdout) if pattern.search(text)]


def test_only_the_listener_repository_holds_statements_on_the_listener_tables():
    found = statements(("listener", "bot", "runs"))
    assert [hit for hit in found if hit[0] not in OWNERS] == []
    # the scan can fail: it finds the statements where they are, of every kind, on every table
    owned = [text for path, _, text in found if path == "listener/repository.py"]
    assert len(owned) >= 30
    for verb in ("SELECT", "INSERT", "UPDATE", "DELETE"):
        assert any(text.startswith(verb) for text in owned), verb
    tables = listener_tables()
    assert {"transcripts", "transcript_turns", "listener_jobs", "listener_callbacks", "listener_tokens",
            "listener_facts", "listener_steps"} <= set(tables)
    for table in tables:
        assert any(re.search(rf"\b{table}\b", text) for text in owned), table
