"""`switchboard listen`: the Smartnumbers listener alone — stream, archive, memory, and the review,
callbacks and named commands as runs.

Works without Discord: call cards and results go to the archive, the log and the terminal. The
same listener runs inside `switchboard run` when it is configured, posting in Discord instead.
Exit codes: 0 stopped (Ctrl-C / SIGTERM), 2 configuration (no key, a stream URL that would leak it).
"""

from __future__ import annotations

import asyncio
import sys

from bot.cli.args import EXIT_USAGE, serve_unless
from bot.phone.listener import KeySource, listener_problem
from bot.services import Services, build_services, stop_on_signals
from bot.settings import Settings
from common.store import StoreError


def run(settings: Settings, key: KeySource | None = None) -> int:
    problem = listener_problem(settings)
    return serve_unless("listen", [problem] if problem else [], lambda: serve(settings, key=key))


async def serve(settings: Settings, stopping: asyncio.Event | None = None, key: KeySource | None = None) -> int:
    stopping = stopping or asyncio.Event()
    try:
        async with build_services(settings) as services:
            with stop_on_signals(stopping):
                return await _listen(services, stopping, key)
    except StoreError as exc:
        print(f"switchboard listen: {exc}", file=sys.stderr)
        return EXIT_USAGE


async def _listen(services: Services, stopping: asyncio.Event, key: KeySource | None) -> int:
    """Post what waited for a card, start the jobs a crash left, then listen until `stopping`."""
    listener = services.listener(key)
    await services.delivery.flush_waiting()
    await listener.pipeline.resume()
    print(f"switchboard listen: listening on {services.settings.stream_url.split('?')[0]} (Ctrl-C to stop)",
          file=sys.stderr)
    streaming = asyncio.create_task(listener.run(), name="smartnumbers-stream")
    stop_wait = asyncio.create_task(stopping.wait())
    try:
        await asyncio.wait({streaming, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop_wait.cancel()
        await listener.stop()
        streaming.cancel()
        await asyncio.gather(streaming, return_exceptions=True)
    return 0
