"""Genuine Discord voice packets for tests.

`DiscordSender` borrows discord.py's own send path (`VoiceClient._get_voice_packet` and its
transport encryption) so the bytes are exactly what discord.py would put on the wire.
`ClientPacketBuilder` makes the client-shaped variants discord.py never sends (header extension,
padding, CSRCs, AES-GCM); with none of those it is checked byte-for-byte against discord.py.
"""

from __future__ import annotations

import math
import os
import struct
from dataclasses import dataclass, field

import discord
import discord.opus
import nacl.bindings
import numpy as np
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

XCHACHA = "aead_xchacha20_poly1305_rtpsize"
AES_GCM = "aead_aes256_gcm_rtpsize"


def sine_pcm(freq: float, frames: int, amplitude: float = 0.3, rate: int = 48_000) -> list[bytes]:
    """`frames` 20 ms frames of a stereo s16le sine tone."""
    n = 960 * frames
    t = np.arange(n) / rate
    mono = (amplitude * 32767 * np.sin(2 * math.pi * freq * t)).astype("<i2")
    stereo = np.repeat(mono, 2).tobytes()
    return [stereo[i * 3840 : (i + 1) * 3840] for i in range(frames)]


def opus_frames(freq: float = 440.0, frames: int = 50, amplitude: float = 0.3) -> list[bytes]:
    """Real libopus-encoded 20 ms frames of a sine tone (discord.py's encoder, its settings)."""
    encoder = discord.opus.Encoder()
    return [encoder.encode(pcm, 960) for pcm in sine_pcm(freq, frames, amplitude)]


@dataclass
class _Connection:
    dave_session: object = None
    can_encrypt: bool = False


@dataclass
class DiscordSender:
    """One simulated speaker whose packets come from discord.py's own VoiceClient code."""

    ssrc: int
    secret_key: list[int] = field(default_factory=lambda: list(os.urandom(32)))
    dave_session: object = None
    mode: str = XCHACHA
    sequence: int = 0
    timestamp: int = 0
    _incr_nonce: int = 0

    _get_voice_packet = discord.VoiceClient._get_voice_packet
    _encrypt_aead_xchacha20_poly1305_rtpsize = discord.VoiceClient._encrypt_aead_xchacha20_poly1305_rtpsize
    checked_add = discord.VoiceClient.checked_add

    @property
    def _connection(self) -> _Connection:
        session = self.dave_session
        return _Connection(session, bool(session is not None and session.ready))

    def packet(self, opus: bytes) -> bytes:
        """The datagram discord.py would send for this Opus frame; advances seq and timestamp."""
        data = self._get_voice_packet(opus)
        self.checked_add("sequence", 1, 65535)
        self.checked_add("timestamp", 960, 4294967295)
        return data


@dataclass
class ClientPacketBuilder:
    """Client-shaped packets: optional CSRCs, a 0xBEDE extension, RTP padding, AES-GCM."""

    ssrc: int
    secret_key: bytes
    mode: str = XCHACHA
    sequence: int = 0
    timestamp: int = 0
    nonce: int = 0

    def packet(self, payload: bytes, *, csrcs: tuple[int, ...] = (), ext_words: int = 0,
               padding: int = 0, payload_type: int = 0x78, marker: bool = False) -> bytes:
        b0 = 0x80 | len(csrcs) | (0x10 if ext_words else 0) | (0x20 if padding else 0)
        b1 = payload_type | (0x80 if marker else 0)
        header = struct.pack(">BBHII", b0, b1, self.sequence, self.timestamp, self.ssrc)
        header += b"".join(struct.pack(">I", c) for c in csrcs)
        body = payload
        if ext_words:
            header += struct.pack(">HH", 0xBEDE, ext_words)
            ext_body = bytes([0x10, 0xAB]) + bytes(ext_words * 4 - 2)  # one-byte header element
            body = ext_body + body
        if padding:
            body = body + bytes(padding - 1) + bytes([padding])
        nonce4 = struct.pack(">I", self.nonce)
        if self.mode == XCHACHA:
            sealed = nacl.bindings.crypto_aead_xchacha20poly1305_ietf_encrypt(
                body, header, nonce4 + bytes(20), self.secret_key)
        else:
            sealed = AESGCM(self.secret_key).encrypt(nonce4 + bytes(8), body, header)
        self.sequence = (self.sequence + 1) & 0xFFFF
        self.timestamp = (self.timestamp + 960) & 0xFFFFFFFF
        self.nonce += 1
        return header + sealed + nonce4


@dataclass
class FakeConnection:
    """The attributes `Receiver` reads, as discord.py's VoiceConnectionState has them."""

    secret_key: list[int]
    ssrc: int = 1
    mode: str = XCHACHA
    dave_session: object = None
    dave_protocol_version: int = 0


def dominant_frequency(pcm: bytes, rate: int = 48_000) -> tuple[float, float]:
    """(frequency in Hz of the strongest bin, RMS of the left channel as a fraction of full scale)."""
    samples = np.frombuffer(pcm, dtype="<i2").reshape(-1, 2)[:, 0].astype(np.float64)
    spectrum = np.abs(np.fft.rfft(samples * np.hanning(len(samples))))
    freq = float(np.argmax(spectrum) * rate / len(samples))
    rms = float(np.sqrt(np.mean(samples**2)) / 32767)
    return freq, rms
