"""A machine that cannot run the store's PostgreSQL half runs the SQLite half and says so, once."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support.paths import ROOT
from tests.support.postgres import SKIPPED


def test_without_postgresql_the_sqlite_half_runs_and_the_run_says_once_that_the_other_did_not():
    env = {**os.environ, "SWITCHBOARD_TEST_POSTGRES": "off"}
    env.pop("SWITCHBOARD_TEST_DATABASE_URL", None)
    result = subprocess.run([sys.executable, "-m", "pytest", "-n", "0", "-p", "no:cacheprovider", "-rN",
                             "tests/common/test_store_engines.py::test_the_interface_is_the_same_on_both_engines"],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:]
    assert "1 passed, 1 skipped" in result.stdout, result.stdout[-2000:]
    assert result.stdout.count("PostgreSQL half NOT RUN") == 1 and SKIPPED in result.stdout, result.stdout[-2000:]
