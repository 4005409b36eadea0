"""The Realtime endpoint rule: `wss://`, or `ws://` to a loopback address (`common.urls`)."""

from __future__ import annotations

from common.urls import UnsafeEndpoint, check_key_endpoint
from voice.call.providers.base import ProviderConfigError


class UnsafeRealtimeEndpoint(UnsafeEndpoint, ProviderConfigError):
    """The Realtime URL is malformed, carries credentials, or would send the key in clear text."""


def check_realtime_url(url: str) -> str:
    """A Realtime websocket endpoint: `wss://`, or `ws://` to a loopback address."""
    try:
        return check_key_endpoint(url, tls="wss")
    except UnsafeEndpoint as exc:
        raise UnsafeRealtimeEndpoint(str(exc)) from None
