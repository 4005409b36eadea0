"""`switchboard talk`: the call engine on the terminal's microphone and speaker, or on WAV files.

Everything a user can get wrong — the key, the provider, IN.wav, where OUT.wav and the metrics go —
is checked before the call starts and reported in one line with exit code 2. Exit codes: 0 done,
1 the call failed (provider/network), 2 usage or configuration, 3 `--timeout`, 130 Ctrl-C in file
mode (143 SIGTERM). On the terminal, Ctrl-C is how a call ends: exit 0. Ctrl-C before the call has
started (while the voice service's handshake is pending) ends it at once: 130 in either mode.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from bot.cli.doctor import wav_hint
from bot.services import Services, build_services
from bot.settings import Settings, SettingsError, realtime_api_key
from bot.tools import call_tools
from bot.tools.phone import KnownFacts, known_facts
from common.paths import output_problem
from common.store import StoreError
from common.urls import display_url
from runs import RunService
from voice.audio import AudioFileError
from voice.call.core import CallOptions, CallState, ShowTranscript
from voice.call.engine import CallEngine, CallFailed, speech_detector
from voice.call.identity import build_identity
from voice.call.providers import ProviderConfigError, RealtimeProvider, make_provider
from voice.call.telemetry import Telemetry
from voice.call.tools import AllowKnownSpeakers, ToolCatalogue
from voice.call.usage import NO_USAGE, CallUsage
from voice.call.vad import SpeechDetector, VadConfig

log = logging.getLogger(__name__)

EXIT_FAILED, EXIT_USAGE, EXIT_TIMEOUT = 1, 2, 3


def run(settings: Settings, args) -> int:
    try:
        return asyncio.run(_talk(settings, args))
    except KeyboardInterrupt:  # before the signal handlers were installed
        return 130


class Refusal(Exception):
    """A mistake found before the call starts; the message is the one line to print (exit 2)."""


async def _talk(settings: Settings, args) -> int:
    try:
        provider, transport, metrics = _prepare(settings, args)
    except Refusal as exc:
        return _refuse(str(exc))
    try:
        async with build_services(settings) as services:
            return await _call(settings, args, provider, transport, metrics, services)
    except StoreError as exc:
        return _refuse(str(exc))


async def _call(settings: Settings, args, provider: RealtimeProvider, transport, metrics: Path | None,
                services: Services) -> int:
    runs = services.runs
    file_mode = bool(args.input_wav)
    endpointing = args.endpointing or settings.endpointing
    telemetry = Telemetry(path=metrics)
    # A file call stays open until the runs it started have landed and been spoken (or --timeout).
    memory = await known_facts(services.archive)
    # loading the trained VAD takes ~0.2 s: off the event loop, as the Discord calls do
    detector = await asyncio.to_thread(speech_detector, VadConfig(), log) if endpointing == "local" else None
    engine = _build_engine(provider, transport, settings, endpointing, telemetry, runs, memory=memory,
                           detector=detector, hold_open=(lambda: runs.busy) if file_mode else None)
    detach = runs.attach(engine)
    signals: list[int] = []
    calls: list[asyncio.Task[None]] = []

    def on_signal(signum: int) -> None:
        signals.append(signum)
        engine.stop()
        if engine.core.state is CallState.NEW:  # still in the provider handshake, which stop() cannot end:
            for call in calls:  # it would wait out the handshake's own timeout (15 s)
                call.cancel()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        await transport.__aenter__()
    except RuntimeError as exc:  # e.g. no usable audio device
        return _refuse(terminal_audio_message(exc))
    except OSError as exc:  # OUT.wav could not be created or its header written (a full disk, /proc, …)
        return _refuse(f"--output-wav {args.output_wav}: cannot write it ({exc.strerror or type(exc).__name__}); "
                       "pick a file on a disk with space that you can write to")
    try:
        print(f"switchboard talk: {provider.name} {provider.model}, voice {provider.voice}, "
              f"{endpointing} endpointing" + ("" if file_mode else " — Ctrl-C to stop"), file=sys.stderr)
        if file_mode and (warning := transport.input_warning):
            print(f"switchboard talk: warning: {warning}", file=sys.stderr)
        if not file_mode and callable(hint := getattr(transport, "headphones_hint", None)):
            print(hint(), file=sys.stderr)
        code = None  # None: interrupted before the call started
        if not signals:  # a Ctrl-C while the transport opened ends it here
            calls.append(asyncio.ensure_future(engine.run()))
            code = await _hold_call(calls[0], args.timeout)
    finally:
        detach()
        await transport.__aexit__(None, None, None)
    if code is None:
        print(f"switchboard talk: interrupted while connecting to the voice service at "
              f"{display_url(provider.url())}; nothing was said", file=sys.stderr)
        if file_mode:
            transport.discard_empty_output()
        return 128 + signals[0]
    if signals and code == 0:  # Ctrl-C ends a terminal call normally; a file call it interrupts
        code = 0 if signals[0] == signal.SIGINT and not file_mode else 128 + signals[0]
    if file_mode:
        if code in (EXIT_FAILED, EXIT_TIMEOUT):
            transport.discard_empty_output()  # a failed call leaves no empty OUT.wav behind
        elif signals and transport.discard_empty_output():  # nor does one interrupted before any answer
            print(f"switchboard talk: interrupted before the assistant said anything; {args.output_wav} not written",
                  file=sys.stderr)
        else:
            silent = args.input_wav if transport.input_silent else None
            line = summary(args.output_wav, transport.output_ms, telemetry.count, silent_input=silent, usage=engine.usage)
            print(f"switchboard talk: {line}", file=sys.stderr)
    return code


def _prepare(settings: Settings, args) -> tuple[RealtimeProvider, object, Path | None]:
    """The provider, the transport and the metrics path, or Refusal for the first mistake found."""
    if bool(args.input_wav) != bool(args.output_wav):
        raise Refusal("--input-wav and --output-wav go together")
    try:
        key = realtime_api_key(settings)
        provider = make_provider(settings.provider, api_key=key.get_secret_value(), model=settings.model,
                                 voice=settings.voice, url=settings.realtime_url)
    except (SettingsError, ProviderConfigError) as exc:
        raise Refusal(str(exc)) from None
    metrics = args.metrics_json or settings.latency_log
    label = "--metrics-json" if args.metrics_json else "SWITCHBOARD_LATENCY_LOG"
    if problem := check_outputs(args, metrics, metrics_label=label):
        raise Refusal(problem)
    try:
        return provider, _make_transport(args), metrics
    except AudioFileError as exc:
        raise Refusal(str(exc)) from None
    except RuntimeError as exc:  # terminal audio unavailable
        raise Refusal(terminal_audio_message(exc)) from None


def _build_engine(provider: RealtimeProvider, transport, settings: Settings, endpointing: str,
                  telemetry: Telemetry, runs: RunService, *, memory: KnownFacts | None = None,
                  detector: SpeechDetector | None = None,
                  hold_open: Callable[[], bool] | None = None) -> CallEngine:
    identity = build_identity(settings.home, settings.identity_include, memory=memory)
    # The terminal has one person at the keyboard, who may run every tool they ask for themselves;
    # the catalogue still refuses calls whose origin the core could not trace to their turn.
    catalogue = ToolCatalogue(AllowKnownSpeakers(), call_tools(runs, owner=AllowKnownSpeakers(),
                                                               requester_of=_no_user_id))
    return CallEngine(provider, transport, catalogue, identity,
                      options=CallOptions(endpointing=endpointing, vad=VadConfig(),
                                          min_interruption_ms=settings.min_interruption_ms,
                                          rollover_s=settings.session_rollover_s),
                      telemetry=telemetry, on_transcript=_print_transcript, hold_open=hold_open, detector=detector)


def _no_user_id(call) -> None:
    """The terminal's one speaker has no Discord user id: runs it starts record no requester."""
    return None


async def _hold_call(call: asyncio.Task[None], timeout: float | None) -> int | None:
    """The call's exit code once `call` (the engine's run) ends; None when it was cancelled before it
    started (Ctrl-C in the handshake)."""
    try:
        if timeout is not None:
            await asyncio.wait_for(call, timeout)
        else:
            await call
        return 0
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if not call.cancelled() or (current is not None and current.cancelling()):
            raise  # we are being cancelled ourselves
        return None
    except TimeoutError:
        print(f"switchboard talk: stopped after --timeout {timeout:g} s", file=sys.stderr)
        return EXIT_TIMEOUT
    except CallFailed as exc:
        print(f"switchboard talk: {exc}", file=sys.stderr)
        return EXIT_FAILED


def check_outputs(args, metrics: Path | None, metrics_label: str = "--metrics-json") -> str | None:
    """Why the call's output files cannot be written (one line), or None. Nothing is created."""
    outputs = [("--output-wav", args.output_wav), (metrics_label, metrics)]
    for label, path in outputs:
        if path is not None and (problem := output_problem(path, label)):
            return problem
    named = [(label, path) for label, path in [("--input-wav", args.input_wav), *outputs] if path is not None]
    for i, (label, path) in enumerate(named):
        for other_label, other in named[i + 1:]:
            if path.resolve() == other.resolve():
                return f"{other_label} {other} is the same file as {label}; pick another file name"
    return None


def summary(output: Path, output_ms: int, turns: int, *, silent_input: Path | None = None,
            usage: CallUsage = NO_USAGE) -> str:
    """The last line of a file call; `silent_input`: IN.wav, when it held nothing louder than -60 dBFS;
    `usage`: what the provider reported the call used (left out when it reported nothing)."""
    said = f"wrote {output_ms} ms of assistant audio to {output} ({turns} turn{'s' if turns != 1 else ''}"
    if turns == 0 and silent_input is not None:
        return f"{said}: {silent_input} holds no speech, it is silent; record or pick a file with speech in it)"
    return f"{said}; {usage.describe()})" if usage.reported else f"{said})"


def terminal_audio_message(exc: BaseException) -> str:
    """The transport's message with commands that work outside the venv, and the no-device way."""
    text = str(exc).replace("`python -m ", f"`{shlex.quote(sys.executable)} -m ")
    text = text.replace("`pip install ", f"`{shlex.quote(sys.executable)} -m pip install ")
    return f"{text}; to try it without audio devices: {wav_hint()}"


def _refuse(message: str) -> int:
    print(f"switchboard talk: {message}", file=sys.stderr)
    return EXIT_USAGE


def _make_transport(args):
    if args.input_wav:
        from voice.call.transports.file import FileTransport

        return FileTransport(args.input_wav, args.output_wav)
    from voice.call.transports.terminal import TerminalTransport

    return TerminalTransport(echo_gate=not args.no_echo_gate)


def _print_transcript(line: ShowTranscript) -> None:
    label = "you" if line.role == "user" else "assistant"
    try:
        print(f"{label}: {line.text}", flush=True)
    except BrokenPipeError:  # `talk | head`: the reader has gone; the call and OUT.wav go on without it
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
