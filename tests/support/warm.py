"""Compile once, before the workers start, what every worker and every process a test starts would
otherwise compile for itself.

A fresh clone has no bytecode, and this environment sets `PYTHONDONTWRITEBYTECODE=1`, so nothing is
ever cached: each of the four xdist workers rewrites the asserts of every test module (about half of
its collection time) and each of the ~80 processes the tests start (`switchboard …`, the rig bots)
compiles every module of ours it imports. Bytecode that exists is still read under that setting. So
the controller writes it once, split over two processes:

- our packages and `tests/support` as ordinary `.pyc` files (`compileall`);
- the test modules and `conftest.py` files as the assert-rewritten `.pyc` files pytest itself would
  write (its hash-checked format, `__pycache__/NAME.cpython-311-pytest-9.2.0.pyc`), made with its own
  rewriter so a worker cannot tell them from its own.

A stale or foreign file costs nothing: pytest checks each against its source's hash and rewrites
when it does not match. If pytest's private rewriter is not what this expects (another pytest
version), the test modules are left alone and the run is only slower.
"""

from __future__ import annotations

import compileall
import multiprocessing
from collections.abc import Iterable
from pathlib import Path

import pytest

from tests.support.paths import ROOT

PACKAGES = ("bot", "voice", "runs", "listener", "common", "tests/support")


def rewritten_sources(root: Path = ROOT) -> list[Path]:
    """The files pytest rewrites: test modules and conftest files under `tests/`."""
    tests = root / "tests"
    return sorted(p for p in tests.rglob("*.py")
                  if "support" not in p.relative_to(tests).parts and (p.name.startswith("test_") or p.name == "conftest.py"))


def rewritten_pyc(source: Path) -> Path:
    from _pytest.assertion.rewrite import PYC_TAIL, get_cache_dir
    return get_cache_dir(source) / (source.name[:-3] + PYC_TAIL)


def _rewrite(config: pytest.Config, sources: Iterable[Path]) -> None:
    from _pytest.assertion.rewrite import _read_pyc, _rewrite_test, _write_pyc, assertstate_key
    state = config.stash[assertstate_key]
    for source in sources:
        pyc = rewritten_pyc(source)
        if _read_pyc(source, pyc) is not None:
            continue
        try:
            pyc.parent.mkdir(exist_ok=True)
            source_hash, code = _rewrite_test(source, config)
        except (OSError, SyntaxError, ValueError):  # the worker that imports it reports it as pytest would
            continue
        _write_pyc(state, code, source_hash, pyc)


def _compile(root: Path, share: int, of: int) -> None:
    for i, package in enumerate(PACKAGES):
        if i % of == share:
            compileall.compile_dir(str(root / package), quiet=2, workers=1)


def _half(config: pytest.Config, root: Path, sources: list[Path], share: int, of: int) -> None:
    _compile(root, share, of)
    _rewrite(config, sources[share::of])


def warm(config: pytest.Config, root: Path = ROOT, processes: int = 2) -> None:
    """Write the bytecode described above; `processes` share the work (fork, so each has `config`)."""
    try:
        from _pytest.assertion.rewrite import (  # noqa: F401  every private name `_rewrite` uses
            PYC_TAIL,
            _read_pyc,
            _rewrite_test,
            _write_pyc,
            assertstate_key,
            get_cache_dir,
        )
        config.stash[assertstate_key]
    except (ImportError, KeyError):  # another pytest, or asserts not rewritten (--assert=plain)
        _compile(root, 0, 1)
        return
    sources = rewritten_sources(root)
    context = multiprocessing.get_context("fork")
    children = [context.Process(target=_half, args=(config, root, sources, i, processes)) for i in range(1, processes)]
    for child in children:
        child.start()
    _half(config, root, sources, 0, processes)
    for child in children:
        child.join()
