"""Realtime providers behind one neutral interface."""

from __future__ import annotations

from common.urls import display_url
from voice.call.providers.base import (
    ProviderConfigError,
    RealtimeProvider,
    ResponseRequest,
    SessionConfig,
    ToolSpec,
)
from voice.call.providers.endpoint import UnsafeRealtimeEndpoint, check_realtime_url
from voice.call.providers.openai_ga import OpenAIRealtime
from voice.call.providers.xai import XAIRealtime

__all__ = [
    "DEFAULT_MODEL",
    "DEFAULT_VOICE",
    "PROVIDERS",
    "OpenAIRealtime",
    "ProviderConfigError",
    "RealtimeProvider",
    "ResponseRequest",
    "SessionConfig",
    "ToolSpec",
    "UnsafeRealtimeEndpoint",
    "XAIRealtime",
    "check_model",
    "check_voice",
    "make_provider",
]

PROVIDERS: dict[str, type[OpenAIRealtime]] = {"openai": OpenAIRealtime, "xai": XAIRealtime}
DEFAULT_MODEL = {"openai": "gpt-realtime-2.1-mini", "xai": "grok-voice-latest"}
DEFAULT_VOICE = {"openai": "marin", "xai": "Ara"}
_NO_KEY = "-"  # stands in for a key when only the model or voice is being checked


def make_provider(name: str, *, api_key: str, model: str, voice: str, url: str | None = None) -> RealtimeProvider:
    """The provider `name`. Raises ProviderConfigError (UnsafeRealtimeEndpoint for `url`) saying what to change.

    The URL is checked here as well as in the settings: a key goes only over `wss://`, or `ws://`
    to a loopback address.
    """
    cls = PROVIDERS.get(name)
    if cls is None:
        raise ProviderConfigError(f"unknown provider {name!r}; use {' or '.join(PROVIDERS)}")
    if url is not None:
        try:
            check_realtime_url(url)
        except UnsafeRealtimeEndpoint as exc:
            raise UnsafeRealtimeEndpoint(f"realtime URL {display_url(url)}: {exc}") from None
    return cls(api_key, model, voice, url)


def check_voice(name: str, voice: str) -> None:
    """Raise ProviderConfigError when provider `name` would refuse `voice` (its own rule and list)."""
    PROVIDERS[name](_NO_KEY, DEFAULT_MODEL[name], voice)


def check_model(name: str, model: str) -> None:
    """Raise ProviderConfigError when provider `name` would refuse `model` (e.g. a retired one)."""
    PROVIDERS[name](_NO_KEY, model, DEFAULT_VOICE[name])
