"""Identity sections, the tool catalogue, the local VAD and the xAI session shape."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from voice.call.identity import MEMORY_CAP, PERSONA_CAP, build_identity
from voice.call.providers import ProviderConfigError, SessionConfig, ToolSpec, XAIRealtime, make_provider
from voice.call.tools import Tool, ToolCatalogue
from voice.call.vad import EnergyVad, VadConfig


class Facts:
    def __init__(self, facts=None, boom=False):
        self._facts, self._boom = facts or [], boom

    def facts(self):
        if self._boom:
            raise RuntimeError("store offline")
        return self._facts


def test_identity_caps_each_section_and_reports_sizes(tmp_path):
    (tmp_path / "SOUL.md").write_text("Warm and dry.\n" * 1000)
    identity = build_identity(tmp_path, memory=Facts([f"fact {i} " + "x" * 50 for i in range(500)]))
    assert 0 < identity.sections["persona"] <= PERSONA_CAP and 0 < identity.sections["memory"] <= MEMORY_CAP
    assert "Warm and dry." in identity.instructions and "fact 0" in identity.instructions


def test_a_broken_section_costs_only_that_section(tmp_path):
    (tmp_path / "SOUL.md").write_text("Be kind.")
    identity = build_identity(tmp_path, memory=Facts(boom=True))
    assert identity.sections == {"persona": 8} and "memory" in identity.problems
    assert "store offline" not in json.dumps(identity.problems)  # only the error class is reported
    (tmp_path / "SOUL.md").unlink()
    (tmp_path / "SOUL.md").mkdir()  # unreadable as a file
    assert "persona" not in build_identity(tmp_path).sections


def test_identity_include_selects_sections(tmp_path):
    (tmp_path / "SOUL.md").write_text("Persona text.")
    identity = build_identity(tmp_path, include=("memory",), memory=Facts(["likes tea"]))
    assert "Persona text." not in identity.instructions and "likes tea" in identity.instructions


async def test_catalogue_answers_every_failure_with_a_speakable_error():
    async def hang(call):
        await asyncio.Event().wait()

    catalogue = ToolCatalogue()
    catalogue.add(Tool("echo", "d", {}, lambda call: {"got": call.arguments}))
    catalogue.add(Tool("hang", "d", {}, hang, timeout_s=0.01))
    assert json.loads((await catalogue.run("c1", "echo", '{"a": 1}')).output) == {"got": {"a": 1}}
    for name, args, expect in [("nope", "{}", "no tool called"), ("echo", "{not json", "not valid JSON"),
                               ("echo", "[1]", "JSON object"), ("hang", "{}", "did not finish")]:
        outcome = await catalogue.run("c", name, args)
        assert not outcome.ok and expect in json.loads(outcome.output)["error"]
    with pytest.raises(ValueError):
        catalogue.add(Tool("echo", "d", {}, lambda c: 1))


def test_vad_needs_voiced_audio_to_start_and_the_silence_window_to_end():
    vad = EnergyVad(VadConfig(start_ms=60, silence_ms=100))
    loud = (np.sin(np.arange(480) / 2) * 6000).astype("<i2").tobytes()
    quiet = bytes(960)
    assert [vad.push(loud), vad.push(quiet)] == [None, None]  # a click is not speech
    assert [vad.push(loud) for _ in range(3)] == [None, None, "start"]
    assert [vad.push(quiet) for _ in range(5)] == [None, None, None, None, "end"]


def test_xai_session_is_flat_and_voices_are_checked():
    provider = make_provider("xai", api_key="k", model="grok-voice-latest", voice="Ara")
    assert isinstance(provider, XAIRealtime) and provider.url().startswith("wss://api.x.ai/v1/realtime")
    event = provider.session_update(SessionConfig("hi", "Ara", (ToolSpec("t", "d", {}),), turn_detection=None))
    session = event["session"]
    assert session["voice"] == "Ara" and "type" not in session and session["turn_detection"] is None
    assert session["tools"][0]["type"] == "function"
    with pytest.raises(ProviderConfigError):
        make_provider("xai", api_key="k", model="m", voice="marin")


def test_openai_refuses_unknown_voice_retiring_model_and_missing_key():
    with pytest.raises(ProviderConfigError, match="unknown openai voice"):
        make_provider("openai", api_key="k", model="gpt-realtime-2.1-mini", voice="robot")
    with pytest.raises(ProviderConfigError, match="shuts down"):
        make_provider("openai", api_key="k", model="gpt-realtime", voice="marin")
    with pytest.raises(ProviderConfigError, match="API key"):
        make_provider("openai", api_key="", model="gpt-realtime-2.1-mini", voice="marin")
    provider = make_provider("openai", api_key="secret-k", model="gpt-realtime-2.1-mini", voice="cedar")
    assert "secret-k" not in repr(provider) and provider.headers() == {"Authorization": "Bearer secret-k"}


def test_xai_client_events_besides_the_session_follow_ga_names_and_shapes():
    from tests.support.realtime_schema import validate_client_event
    from voice.call.providers import ResponseRequest

    provider = XAIRealtime("k", "grok-voice-latest", "Eve")
    for event in (provider.append_audio(b"\0\0"), provider.commit_audio(), provider.cancel_response(),
                  provider.create_response(ResponseRequest({"turn": "1"}, "say hi", tools_off=True)),
                  provider.truncate("item_1", 120), provider.function_output("c1", "{}"),
                  provider.add_function_call("c1", "t", "{}"), provider.add_text_item("user", "hi")):
        validate_client_event(event)
