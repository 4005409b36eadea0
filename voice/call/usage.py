"""What a call used at the provider: tokens summed over every response and input transcription.

Pure. The provider translation folds each reported usage object into a `CallUsage` (one response's,
one transcription's), hands it to the core as a neutral event, and the core adds it to the call's
total. The fold never raises: a field that is missing, negative, a bool, a float or a string counts
as absent, and a total smaller than its reported parts is raised to their sum (never under-count).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any


@dataclass(frozen=True)
class CallUsage:
    """Token counts; `input_*`/`output_*`/`cached_*` come from responses (cached is a subset of input),
    `transcription_*` from input transcription (tokens, or seconds for duration-billed models)."""

    responses: int = 0
    input_tokens: int = 0
    input_text: int = 0
    input_audio: int = 0
    cached_tokens: int = 0
    cached_text: int = 0
    cached_audio: int = 0
    output_tokens: int = 0
    output_text: int = 0
    output_audio: int = 0
    transcriptions: int = 0
    transcription_input: int = 0
    transcription_output: int = 0
    transcription_seconds: float = 0.0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens + self.transcription_input + self.transcription_output

    @property
    def reported(self) -> bool:
        """Whether the provider reported any usage yet."""
        return bool(self.responses or self.transcriptions)

    def __add__(self, other: CallUsage) -> CallUsage:
        if not isinstance(other, CallUsage):
            return NotImplemented
        return CallUsage(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})

    def add_response(self, usage: Any) -> CallUsage:
        """This total plus one response's `usage` (GA `response.done`); unchanged if it is not an object."""
        if not isinstance(usage, Mapping):
            return self
        details = _mapping(usage.get("input_token_details"))
        cached = _mapping(details.get("cached_tokens_details"))
        out = _mapping(usage.get("output_token_details"))
        input_text, input_audio = _count(details, "text_tokens"), _count(details, "audio_tokens")
        cached_text, cached_audio = _count(cached, "text_tokens"), _count(cached, "audio_tokens")
        output_text, output_audio = _count(out, "text_tokens"), _count(out, "audio_tokens")
        input_tokens = max(_count(usage, "input_tokens"), input_text + input_audio + _count(details, "image_tokens"))
        cached_tokens = max(_count(details, "cached_tokens"),
                            cached_text + cached_audio + _count(cached, "image_tokens"))
        return self + CallUsage(
            responses=1, input_tokens=input_tokens, input_text=input_text, input_audio=input_audio,
            cached_tokens=min(cached_tokens, input_tokens), cached_text=cached_text, cached_audio=cached_audio,
            output_tokens=max(_count(usage, "output_tokens"), output_text + output_audio),
            output_text=output_text, output_audio=output_audio)

    def add_transcription(self, usage: Any) -> CallUsage:
        """This total plus one input transcription's `usage` (`tokens`, or `duration` in seconds)."""
        if not isinstance(usage, Mapping):
            return self
        if usage.get("type") == "duration" or ("seconds" in usage and usage.get("type") != "tokens"):
            seconds = usage.get("seconds")
            valid = isinstance(seconds, (int, float)) and not isinstance(seconds, bool) \
                and math.isfinite(seconds) and seconds >= 0
            return self + CallUsage(transcriptions=1, transcription_seconds=float(seconds) if valid else 0.0)
        details = _mapping(usage.get("input_token_details"))
        parts = _count(details, "audio_tokens") + _count(details, "text_tokens")
        return self + CallUsage(transcriptions=1, transcription_input=max(_count(usage, "input_tokens"), parts),
                                transcription_output=_count(usage, "output_tokens"))

    def to_json(self) -> dict:
        return {**asdict(self), "total_tokens": self.total_tokens}

    @classmethod
    def from_json(cls, data: Any) -> CallUsage:
        """What `to_json` wrote (a stored call's usage); unknown or malformed fields count as 0."""
        source = _mapping(data)
        counts = {f.name: _count(source, f.name) for f in fields(cls) if f.name != "transcription_seconds"}
        seconds = source.get("transcription_seconds")
        ok = isinstance(seconds, int | float) and not isinstance(seconds, bool) and math.isfinite(seconds) \
            and seconds >= 0
        return cls(**counts, transcription_seconds=float(seconds) if ok else 0.0)

    def describe(self) -> str:
        """One line for people: tokens in and out by modality, cached, transcription."""
        if not self.reported:
            return "none reported yet"
        line = (f"{self.input_tokens:,} tokens in (audio {self.input_audio:,}, text {self.input_text:,}; "
                f"cached {self.cached_tokens:,}), {self.output_tokens:,} out (audio {self.output_audio:,}, "
                f"text {self.output_text:,}) over {self.responses} response{'s' if self.responses != 1 else ''}")
        if self.transcription_input or self.transcription_output:
            line += f"; transcription {self.transcription_input:,} in, {self.transcription_output:,} out"
        if self.transcription_seconds:
            line += f"; transcription {self.transcription_seconds:.1f} s"
        return line


NO_USAGE = CallUsage()


def _mapping(value: Any) -> Mapping:
    return value if isinstance(value, Mapping) else {}


def _count(source: Mapping, key: str) -> int:
    """A token count, or 0 when it is absent or not a non-negative integer."""
    value = source.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0
