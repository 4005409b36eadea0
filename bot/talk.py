"""`switchboard talk`: the call engine on the terminal's microphone and speaker, or on WAV files."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from pathlib import Path

from voice.audio import AudioFileError
from voice.call import CallOptions
from voice.engine import CallEngine, CallFailed
from voice.identity import build_identity
from voice.providers import ProviderConfigError, make_provider
from voice.telemetry import Telemetry
from voice.tools import ToolCatalogue
from voice.vad import VadConfig

from .settings import Settings, SettingsError, realtime_api_key

log = logging.getLogger(__name__)


def add_parser(sub) -> None:
    talk = sub.add_parser("talk", help="talk with the assistant: microphone and speaker, or WAV in / WAV out")
    talk.add_argument("--input-wav", type=Path, help="feed this WAV as if spoken (any rate/channels)")
    talk.add_argument("--output-wav", type=Path, help="write what the assistant says here (24 kHz mono)")
    talk.add_argument("--metrics-json", type=Path, help="write per-turn latency records here (JSON lines)")
    talk.add_argument("--timeout", type=float, default=None, help="give up after this many seconds")
    talk.add_argument("--endpointing", choices=("server", "local"), help="override SWITCHBOARD_ENDPOINTING")
    talk.add_argument("--no-echo-gate", action="store_true", help="terminal: do not suppress speaker echo")


def run(settings: Settings, args) -> int:
    try:
        return asyncio.run(_talk(settings, args))
    except KeyboardInterrupt:
        return 130


async def _talk(settings: Settings, args) -> int:
    if bool(args.input_wav) != bool(args.output_wav):
        print("switchboard talk: --input-wav and --output-wav go together", file=sys.stderr)
        return 2
    try:
        key = realtime_api_key(settings)
        provider = make_provider(settings.provider, api_key=key.reveal(), model=settings.model,
                                 voice=settings.voice, url=settings.realtime_url)
    except (SettingsError, ProviderConfigError) as exc:
        print(f"switchboard talk: {exc}", file=sys.stderr)
        return 2
    endpointing = args.endpointing or settings.endpointing
    identity = build_identity(settings.home, settings.identity_include)
    metrics = args.metrics_json or settings.latency_log
    telemetry = Telemetry(path=metrics)
    try:
        transport = _make_transport(args)
    except (AudioFileError, RuntimeError) as exc:
        print(f"switchboard talk: {exc}", file=sys.stderr)
        return 2
    engine = CallEngine(provider, transport, ToolCatalogue(), identity,
                        options=CallOptions(endpointing=endpointing, vad=VadConfig()),
                        telemetry=telemetry, on_transcript=_print_transcript)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, engine.stop)
        except (NotImplementedError, RuntimeError):  # pragma: no cover - non-POSIX
            pass
    print(f"switchboard talk: {provider.name} {provider.model}, voice {provider.voice}, "
          f"{endpointing} endpointing" + ("" if args.input_wav else " — Ctrl-C to stop"), file=sys.stderr)
    if not args.input_wav:
        hint = getattr(transport, "headphones_hint", None)
        if callable(hint):
            print(hint(), file=sys.stderr)
    try:
        try:
            await transport.__aenter__()
        except RuntimeError as exc:  # e.g. no usable audio device
            print(f"switchboard talk: {exc}", file=sys.stderr)
            return 2
        try:
            if args.timeout:
                await asyncio.wait_for(engine.run(), args.timeout)
            else:
                await engine.run()
        finally:
            await transport.__aexit__(None, None, None)
    except TimeoutError:
        print(f"switchboard talk: stopped after --timeout {args.timeout:g} s", file=sys.stderr)
        return 3
    except CallFailed as exc:
        print(f"switchboard talk: {exc}", file=sys.stderr)
        return 1
    if args.output_wav:
        turns = len(telemetry.recent)
        print(f"switchboard talk: wrote {transport.output_ms} ms of assistant audio to {args.output_wav} "
              f"({turns} turn{'s' if turns != 1 else ''})", file=sys.stderr)
    return 0


def _make_transport(args):
    if args.input_wav:
        from voice.transports.file import FileTransport

        return FileTransport(args.input_wav, args.output_wav)
    from voice.transports.terminal import TerminalTransport

    return TerminalTransport(echo_gate=not args.no_echo_gate)


def _print_transcript(role: str, text: str) -> None:
    label = "you" if role == "user" else "assistant"
    print(f"{label}: {text}", flush=True)
