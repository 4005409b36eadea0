"""Realtime providers behind one neutral interface."""

from __future__ import annotations

from .base import ProviderConfigError, RealtimeProvider, ResponseRequest, SessionConfig, ToolSpec
from .openai_ga import OpenAIRealtime
from .xai import XAIRealtime

__all__ = [
    "OpenAIRealtime",
    "ProviderConfigError",
    "RealtimeProvider",
    "ResponseRequest",
    "SessionConfig",
    "ToolSpec",
    "XAIRealtime",
    "make_provider",
]


def make_provider(name: str, *, api_key: str, model: str, voice: str, url: str | None = None) -> RealtimeProvider:
    if name == "openai":
        return OpenAIRealtime(api_key, model, voice, url)
    if name == "xai":
        return XAIRealtime(api_key, model, voice, url)
    raise ProviderConfigError(f"unknown provider {name!r}; use openai or xai")
