"""A lean libopus decoder: one `opus_decode` call per frame into a reused buffer.

discord.py's `opus.Decoder.decode` copies every frame through a 1,920-item Python list;
this decoder returns the PCM straight from the C buffer. It loads the same libopus that
discord.py loads, so `doctor` and playback agree on which library is in use.
"""

from __future__ import annotations

import ctypes
import ctypes.util

import discord.opus

SAMPLE_RATE = 48_000
CHANNELS = 2
FRAME_SAMPLES = 960  # 20 ms per channel
FRAME_BYTES = FRAME_SAMPLES * CHANNELS * 2  # 3840
_MAX_SAMPLES = 5760  # 120 ms, the longest Opus packet


class OpusUnavailable(RuntimeError):
    """libopus could not be loaded; on Debian: `apt-get install -y libopus0`."""


class OpusDecodeError(ValueError):
    """libopus rejected a packet (corrupt or not Opus)."""


_lib: ctypes.CDLL | None = None


def load_libopus() -> ctypes.CDLL:
    """Load libopus once (the library discord.py uses) with typed, check-free bindings."""
    global _lib
    if _lib is not None:
        return _lib
    if not discord.opus.is_loaded():
        try:
            discord.opus._load_default()
        except Exception as exc:  # pragma: no cover - depends on the machine
            raise OpusUnavailable(f"libopus failed to load: {exc}") from exc
    dpy_lib = getattr(discord.opus, "_lib", None)
    name = getattr(dpy_lib, "_name", None) or ctypes.util.find_library("opus")
    if not name:
        raise OpusUnavailable("libopus not found; install it with `apt-get install -y libopus0`")
    lib = ctypes.CDLL(name)
    lib.opus_decoder_create.argtypes = [ctypes.c_int32, ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
    lib.opus_decoder_create.restype = ctypes.c_void_p
    lib.opus_decoder_destroy.argtypes = [ctypes.c_void_p]
    lib.opus_decoder_destroy.restype = None
    lib.opus_decode.argtypes = [
        ctypes.c_void_p,
        ctypes.c_char_p,
        ctypes.c_int32,
        ctypes.POINTER(ctypes.c_int16),
        ctypes.c_int,
        ctypes.c_int,
    ]
    lib.opus_decode.restype = ctypes.c_int
    _lib = lib
    return lib


class OpusDecoder:
    """A stateful decoder for one stream (one SSRC), 48 kHz stereo unless asked otherwise. Not thread-safe.

    Opus decodes at any of 8/12/16/24/48 kHz, mono or stereo, from the same packets: asking for the
    model's 24 kHz mono costs about half a 48 kHz stereo decode and needs no downmix or resampler."""

    __slots__ = ("_lib", "_state", "_buf", "_decode", "_sample_bytes")

    def __init__(self, rate: int = SAMPLE_RATE, channels: int = CHANNELS) -> None:
        lib = load_libopus()
        err = ctypes.c_int()
        state = lib.opus_decoder_create(rate, channels, ctypes.byref(err))
        if err.value != 0 or not state:
            raise OpusUnavailable(f"opus_decoder_create failed ({err.value})")
        self._lib = lib
        self._state = state
        self._buf = (ctypes.c_int16 * (_MAX_SAMPLES * CHANNELS))()
        self._decode = lib.opus_decode
        self._sample_bytes = 2 * channels

    def decode(self, packet: bytes | None) -> bytes:
        """Decode one Opus packet (None = packet-loss concealment) to s16le PCM (interleaved if stereo)."""
        n = self._decode(
            self._state, packet, len(packet) if packet else 0, self._buf, _MAX_SAMPLES, 0
        )
        if n < 0:
            raise OpusDecodeError(f"opus_decode error {n}")
        return ctypes.string_at(self._buf, n * self._sample_bytes)

    def __del__(self) -> None:
        state = getattr(self, "_state", None)
        if state:
            self._lib.opus_decoder_destroy(state)
            self._state = None
