"""The layering rules, checked on the source (docs/ARCHITECTURE-level rules, see README "Layout"):

- the domains (`voice`, `runs`, `listener`) and the leaf helpers (`common`) never import `bot`;
- only `bot` imports more than one domain: a domain imports itself and `common`, nothing else of ours;
- `common` imports none of the domains;
- inside `voice`, the call engine (`voice/call`) never imports Discord media;
- no import cycles between modules, imports made only for type checking included;
- no module imports another module's private names (`from x import _y`);
- a test module never imports another test module: what tests share lives in `tests/support`.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

from tests.support.paths import ROOT

OURS = ("bot", "voice", "runs", "listener", "common")
DOMAINS = ("voice", "runs", "listener")

# CPython 3.11.7's AST builder can fail with "recursion depth mismatch" in a process whose earlier work
# upset its counter: every file is parsed in one fresh interpreter instead.
_SCAN = """
import ast, json, sys
out = {}
for path in sys.argv[1:]:
    tree = ast.parse(open(path).read(), filename=path)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [[alias.name, None] for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [[node.module, alias.name] for alias in node.names]
    out[path] = found
print(json.dumps(out))
"""


def module_name(path: Path) -> str:
    """`bot/cli/run.py` → `bot.cli.run`; a package's `__init__.py` is the package."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def scan(paths: Iterable[Path]) -> dict[str, list[tuple[str, str | None]]]:
    """For each module, every absolute import: (module, name) for `from module import name`, (module, None)
    for `import module`."""
    paths = sorted(paths)
    out = subprocess.run([sys.executable, "-c", _SCAN, *map(str, paths)], check=True, capture_output=True, text=True)
    found = json.loads(out.stdout)
    return {module_name(Path(p)): [(m, n) for m, n in imports] for p, imports in found.items()}


def source_files() -> list[Path]:
    return [p for package in OURS for p in (ROOT / package).rglob("*.py")]


@functools.cache
def imports_of_ours() -> dict[str, list[tuple[str, str | None]]]:
    """Scanned once per process, when a test first asks (not at collection, which every worker does)."""
    return scan(source_files())


def top(module: str) -> str:
    return module.split(".")[0]


def importing(package: str, banned: tuple[str, ...], imports=None) -> list[str]:
    imports = imports_of_ours() if imports is None else imports
    return [f"{m} imports {target}" for m, found in sorted(imports.items()) if top(m) == package or m.startswith(package + ".")
            for target, _ in found if any(target == b or target.startswith(b + ".") for b in banned)]


def test_domains_and_common_never_import_bot():
    for package in (*DOMAINS, "common"):
        assert importing(package, ("bot",)) == [], package


def test_only_bot_imports_more_than_one_domain():
    for domain in DOMAINS:
        others = tuple(d for d in DOMAINS if d != domain)
        assert importing(domain, others) == [], domain
    assert importing("common", DOMAINS) == []


def test_the_call_engine_never_imports_discord_media():
    assert importing("voice.call", ("voice.media", "discord", "davey", "nacl")) == []


def resolve(target: str, name: str | None) -> str | None:
    """The module of ours an import reaches: `from a.b import c` is module a.b.c when that is a module."""
    if top(target) not in OURS:
        return None
    if name is not None and f"{target}.{name}" in imports_of_ours():
        return f"{target}.{name}"
    return target if target in imports_of_ours() else None


def graph(imports) -> dict[str, set[str]]:
    return {m: {r for t, n in found if (r := resolve(t, n)) is not None and r != m} for m, found in imports.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan), as sorted lists."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def package_of(module: str) -> str:
    return module if (ROOT / module.replace(".", "/") / "__init__.py").exists() else module.rsplit(".", 1)[0]


def test_no_import_cycles_type_only_imports_included():
    edges = graph(imports_of_ours())
    # a package's __init__ re-exporting its own modules is not a cycle of design
    for m in edges:
        edges[m] = {t for t in edges[m] if not (m == package_of(t) and (ROOT / m.replace(".", "/") / "__init__.py").exists())}
    assert cycles(edges) == []


def test_no_module_imports_another_modules_private_names():
    private = [f"{m} imports {t}.{n}" for m, found in sorted(imports_of_ours().items()) for t, n in found
               if n is not None and n.startswith("_") and not n.startswith("__") and top(t) in OURS]
    assert private == []


def test_test_modules_share_only_through_tests_support():
    found = scan((ROOT / "tests").rglob("test_*.py"))
    shared = [f"{m} imports {t}" for m, imports in sorted(found.items()) for t, _ in imports
              if t.startswith("tests.") and t.rsplit(".", 1)[-1].startswith("test_")]
    assert shared == []


# -- the checks above can fail: each finds what it looks for -------------------------------------------


def test_the_checks_see_what_they_look_for():
    assert ("voice.call.transports.base", "FRAME_BYTES") in imports_of_ours()["voice.media.channel"]
    fake = {"runs.x": [("bot.services", "Services"), ("listener.archive", "_private")],
            "listener.archive": [("runs.x", None)], "bot.services": [("runs.x", "thing")]}
    assert importing("runs", ("bot",), fake) == ["runs.x imports bot.services"]
    assert importing("runs", ("listener",), fake) == ["runs.x imports listener.archive"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
