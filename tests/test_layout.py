"""The dependency direction, checked on the source: bot -> voice, bot -> listener; inside voice,
media (Discord RTP in and out) may use the call engine's interfaces, never the other way round."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


_SCAN = """
import ast, json, sys
tree = ast.parse(open(sys.argv[1]).read(), filename=sys.argv[1])
found = set()
for node in ast.walk(tree):
    if isinstance(node, ast.Import):
        found.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        found.add(node.module)
print(json.dumps(sorted(found)))
"""


def imported_modules(path: Path) -> set[str]:
    """The absolute imports of one file. Parsed in a fresh interpreter: CPython 3.11.7's AST builder
    can fail with "recursion depth mismatch" in a process whose earlier work upset its counter."""
    out = subprocess.run([sys.executable, "-c", _SCAN, str(path)], check=True, capture_output=True, text=True)
    return set(json.loads(out.stdout))


def offenders(folder: str, banned: tuple[str, ...]) -> list[str]:
    bad = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        for module in imported_modules(path):
            if any(module == b or module.startswith(b + ".") for b in banned):
                bad.append(f"{path.relative_to(ROOT)} imports {module}")
    return bad


def test_voice_and_listener_never_import_bot_and_never_each_other():
    assert offenders("voice", ("bot", "listener")) == []
    assert offenders("listener", ("bot", "voice")) == []


def test_the_call_engine_never_imports_discord_media():
    assert offenders("voice/call", ("voice.media", "discord", "davey", "nacl")) == []


def test_the_checker_sees_imports():  # the check above can fail: it finds what is there
    assert "voice.call.transports.base" in imported_modules(ROOT / "voice/media/channel.py")
