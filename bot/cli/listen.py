"""`switchboard listen`: the Smartnumbers listener alone — stream, archive, memory, and the review,
callbacks and named commands as runs.

Works without Discord: call cards and results go to the archive, the log and the terminal. The
same listener runs inside `switchboard run` when it is configured, posting in Discord instead. With
SWITCHBOARD_HTTP_ADDR it serves `/healthz`, `/readyz` (ready once it listens, draining from Ctrl-C or
SIGTERM) and `/metrics` (runs by state, the listener's lag), as `switchboard run` does.
Exit codes: 0 stopped (Ctrl-C / SIGTERM), 2 configuration (no key, a stream URL that would leak it).
"""

from __future__ import annotations

import asyncio
import sys

from bot.cli.args import EXIT_USAGE, serve_unless
from bot.fleet.http import EndpointError
from bot.fleet.readiness import Readiness
from bot.fleet.readings import ProcessParts, serve_endpoints
from bot.phone.listener import KeySource, listener_problem
from bot.services import Services, build_services, stop_on_signals
from bot.settings import Settings
from common.store import StoreError


def run(settings: Settings, key: KeySource | None = None) -> int:
    problem = listener_problem(settings)
    return serve_unless("listen", [problem] if problem else [], lambda: serve(settings, key=key))


async def serve(settings: Settings, stopping: asyncio.Event | None = None, key: KeySource | None = None,
                readiness: Readiness | None = None) -> int:
    stopping = stopping or asyncio.Event()
    readiness = readiness or Readiness("starting: not listening yet")
    try:
        async with build_services(settings) as services:
            parts = ProcessParts(readiness, services.runs)
            async with serve_endpoints(settings.http_addr, parts):
                with stop_on_signals(stopping):
                    return await _listen(services, stopping, key, parts)
    except (StoreError, EndpointError) as exc:
        print(f"switchboard listen: {exc}", file=sys.stderr)
        return EXIT_USAGE


async def _listen(services: Services, stopping: asyncio.Event, key: KeySource | None, parts: ProcessParts) -> int:
    """Post what waited for a card, start the jobs a crash left, then listen until `stopping`."""
    listener = parts.listener = services.listener(key)
    await services.delivery.flush_waiting()
    await listener.pipeline.resume()
    print(f"switchboard listen: listening on {services.settings.stream_url.split('?')[0]} (Ctrl-C to stop)",
          file=sys.stderr)
    streaming = asyncio.create_task(listener.run(), name="smartnumbers-stream")
    parts.readiness.ready()
    stop_wait = asyncio.create_task(stopping.wait())
    try:
        await asyncio.wait({streaming, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop_wait.cancel()
        await parts.readiness.drain("draining: shutting down")
        await listener.stop()
        streaming.cancel()
        await asyncio.gather(streaming, return_exceptions=True)
    return 0
