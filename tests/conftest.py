"""Suite-wide settings: a throwaway home folder (`tests/support/home.py`), the property tests' examples, and for parallel runs (`-n`, pyproject.toml): bytecode
is compiled once before the workers start, the `xdist_group` marks take effect under pytest 9.2, and the
tests that pace real-time audio through a bot process get the CPU first."""

from __future__ import annotations

import os

import pytest
from _pytest.nodeid import NodeId
from hypothesis import settings as hypothesis_settings

from tests.support.home import isolate_home, remove_home
from tests.support.warm import warm

# The xdist groups of the tests that pace real-time audio through a bot process (`discord_room.real_time`, the
# fake Discord's voice rig): their timing is what they test; every other test only needs the CPU eventually.
REAL_TIME_PREFIX = "real_time"
YIELDING_NICENESS = 10
_yielding = pytest.StashKey[bool]()


def _groups(item: pytest.Item) -> set[str]:
    return {str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
            for mark in item.iter_markers("xdist_group")}


# Property tests draw the same fixed examples on every run (derandomized: a red run is red again on any
# machine), 100 per test; `pytest --hypothesis-profile=thorough` draws 2,000 fresh ones per test instead.
hypothesis_settings.register_profile("suite", derandomize=True, deadline=None, max_examples=100)
hypothesis_settings.register_profile("thorough", derandomize=False, deadline=None, max_examples=2000)
hypothesis_settings.load_profile("suite")


def pytest_configure(config: pytest.Config) -> None:
    """Before any worker starts (they inherit the environment): point HOME and the XDG folders at a
    throwaway folder, then compile what every worker and test process would compile for itself
    (`tests/support/warm.py`)."""
    if not hasattr(config, "workerinput"):
        isolate_home()
        warm(config)


def pytest_unconfigure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):
        remove_home()


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With `--dist loadgroup`, pytest-xdist 3.8 tells its scheduler a test's group by renaming the test
    `NODEID@GROUP` on the worker, but it writes `item._nodeid`, which pytest 9.2's structured node ids
    no longer read (pytest-dev/pytest-xdist#1386): every group would be scattered over the workers
    without a word. Rename them as xdist means to, and stop the run if even that does not take."""
    if not getattr(config.option, "loadgroup", False):  # set on xdist workers by `--dist loadgroup`
        return
    for item in items:
        if not (groups := _groups(item)):
            continue
        suffix = f"@{'_'.join(sorted(groups))}"
        if not item.nodeid.endswith(suffix):
            item._id = NodeId.parse(item.nodeid + suffix)
        if not item.nodeid.endswith(suffix):
            raise pytest.UsageError(f"{item.nodeid}: its xdist_group does not reach the scheduler; the tests "
                                    "that must not overlap would run at once (see tests/conftest.py)")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """On an xdist worker, the first test outside the real-time groups lowers the worker's CPU priority (and so
    its children's) for the rest of the run: on two cores, a room's bot process then never waits behind
    another worker's busy test. A group is its worker's first work, so a real-time group runs at normal
    priority; a process may lower its own priority, but not raise it again."""
    config = item.config
    if not hasattr(config, "workerinput") or config.stash.get(_yielding, False) or any(
            group.startswith(REAL_TIME_PREFIX) for group in _groups(item)):
        return
    os.nice(YIELDING_NICENESS)
    config.stash[_yielding] = True


# -- the store's two engines (tests/support/postgres.py) -------------------------------------------------

@pytest.fixture(scope="session")
def postgres_server(request: pytest.FixtureRequest):
    """The run's shared throwaway PostgreSQL (started by the first test that needs it), or None when
    there is none here (the PostgreSQL half is then skipped, and said once at the end)."""
    from tests.support.postgres import SharedServer, available

    if not available():
        return None
    server = SharedServer(os.environ.get("PYTEST_XDIST_TESTRUNUID") or f"solo-{os.getpid()}")
    request.addfinalizer(server.leave)
    return server


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, postgres_server) -> str | None:
    """Each test that takes it runs on both engines: None (SQLite in the test's home), then the URL of a
    fresh PostgreSQL database of its own."""
    if request.param == "sqlite":
        return None
    if postgres_server is None:
        from tests.support.postgres import SKIPPED

        pytest.skip(SKIPPED)
    return postgres_server.new_database()


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """Say once, at the end, when the PostgreSQL half of the suite could not run here."""
    from tests.support.postgres import SKIPPED, available

    if not hasattr(config, "workerinput") and not available():
        terminalreporter.write_line(SKIPPED, yellow=True, bold=True)
