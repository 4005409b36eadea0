"""`tests/support/warm.py`: what the controller compiles before the workers start is what a worker would
have written itself, and a broken file is left for the worker to report."""

from __future__ import annotations

import sys

import pytest
from _pytest.assertion.rewrite import _read_pyc

from tests.support.warm import rewritten_pyc, rewritten_sources, warm


def tree(root):
    (root / "tests" / "support").mkdir(parents=True)
    (root / "tests" / "test_sample.py").write_text("def test_it():\n    x = 1\n    assert x == 2\n")
    (root / "tests" / "test_broken.py").write_text("def test_it(:\n")
    (root / "tests" / "support" / "helper.py").write_text("VALUE = 1\n")
    (root / "bot").mkdir()
    (root / "bot" / "module.py").write_text("VALUE = 2\n")


def test_test_modules_get_pytests_rewritten_bytecode_and_packages_their_own(tmp_path, pytestconfig):
    tree(tmp_path)
    assert [p.name for p in rewritten_sources(tmp_path)] == ["test_broken.py", "test_sample.py"]
    warm(pytestconfig, root=tmp_path, processes=1)

    sample = tmp_path / "tests" / "test_sample.py"
    code = _read_pyc(sample, rewritten_pyc(sample))
    assert code is not None  # pytest accepts it as its own (hash-checked against the source)
    namespace: dict = {}
    exec(code, namespace)
    with pytest.raises(AssertionError, match="assert 1 == 2"):  # pytest's explanation: the asserts were rewritten
        namespace["test_it"]()
    assert not rewritten_pyc(tmp_path / "tests" / "test_broken.py").exists()
    tag = sys.implementation.cache_tag
    assert (tmp_path / "bot" / "__pycache__" / f"module.{tag}.pyc").exists()
    assert (tmp_path / "tests" / "support" / "__pycache__" / f"helper.{tag}.pyc").exists()


def test_a_changed_test_module_is_not_read_from_stale_bytecode(tmp_path, pytestconfig):
    tree(tmp_path)
    warm(pytestconfig, root=tmp_path, processes=1)
    sample = tmp_path / "tests" / "test_sample.py"
    sample.write_text("def test_it():\n    assert True\n")
    assert _read_pyc(sample, rewritten_pyc(sample)) is None  # pytest rewrites it again
    warm(pytestconfig, root=tmp_path, processes=1)
    assert _read_pyc(sample, rewritten_pyc(sample)) is not None
