"""Readiness only moves forward (starting → ready → draining), and its drain steps run once, in order,
even when one of them fails."""

from __future__ import annotations

import logging

from bot.fleet.readiness import Phase, Readiness


async def test_readiness_moves_forward_only_and_says_why_it_is_not_ready():
    readiness = Readiness("starting: not connected to Discord yet")
    assert (readiness.phase, readiness.is_ready, readiness.reason) == (
        Phase.STARTING, False, "starting: not connected to Discord yet")
    readiness.ready()
    assert (readiness.phase, readiness.is_ready, readiness.reason) == (Phase.READY, True, "ready")
    await readiness.drain("draining: shutting down")
    readiness.ready()
    assert (readiness.phase, readiness.is_ready, readiness.reason) == (Phase.DRAINING, False, "draining: shutting down")
    await readiness.drain("draining again")
    assert readiness.reason == "draining: shutting down"  # the first reason stands


async def test_a_process_that_drains_before_it_was_ready_is_never_ready():
    readiness = Readiness()
    await readiness.drain("stopping: the Discord connection ended")
    readiness.ready()
    assert not readiness.is_ready and readiness.phase is Phase.DRAINING


async def test_drain_steps_run_once_in_order_after_the_state_turned_and_a_failing_one_does_not_stop_the_rest(caplog):
    readiness = Readiness()
    readiness.ready()
    ran: list[tuple[str, bool]] = []

    async def first() -> None:
        ran.append(("first", readiness.is_ready))
        raise RuntimeError("the peer did not answer")

    async def second() -> None:
        ran.append(("second", readiness.is_ready))

    readiness.on_drain(first)
    readiness.on_drain(second)
    with caplog.at_level(logging.ERROR):
        await readiness.drain("draining: shutting down")
        await readiness.drain("draining: shutting down")
    assert ran == [("first", False), ("second", False)]
    assert "a drain step failed" in caplog.text
