"""Audio through the fake SFU: simulated users' genuine packets to the bot, and the bot's packets back.

A simulated user's datagrams come from discord.py's own send path (`tests.support.packets.DiscordSender`:
`VoiceClient._get_voice_packet`, DAVE-encrypted with the user's real `davey` session once it is
ready), transport-encrypted with the key of the bot connection they are relayed to — as the SFU
does. A speaker marked `broken` is a client whose DAVE state diverged from the channel's group:
its frames are genuine DAVE frames under keys nobody else holds, so the bot cannot decrypt them
(`NoValidCryptorFound`) while everyone else is heard. The bot's datagrams are opened with the key
the fake issued and its DAVE frames decrypted by a simulated member, so a test hears what the bot
said.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import davey
import discord.opus
import nacl.secret

from tests.support.dave_group import diverged_session
from tests.support.fake_discord.voice_gateway import VoiceSession
from tests.support.packets import DiscordSender

OPUS_SILENCE = b"\xf8\xff\xfe"


@dataclass
class Speaker:
    """A simulated user in the voice channel: their SSRC and one continuous RTP stream."""

    user_id: int
    ssrc: int
    dave: davey.DaveSession
    broken: bool = False
    """Set to make this member's client encrypt in a diverged group (see the module doc): the
    same RTP stream, same transport key, DAVE frames the bot's group has no key for."""
    sender: DiscordSender = field(init=False)
    _diverged: davey.DaveSession | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.sender = DiscordSender(self.ssrc, dave_session=self.dave)

    def packets_for(self, session: VoiceSession, opus_frames: list[bytes]) -> list[bytes]:
        """The datagrams the SFU relays to `session` (its transport key) for these Opus frames."""
        self.sender.secret_key = list(session.secret_key)
        self.sender.dave_session = self._diverged_session() if self.broken else self.dave
        return [self.sender.packet(frame) for frame in opus_frames]

    def _diverged_session(self) -> davey.DaveSession:
        """This user's ready session in a group of their own on the same channel (made once, so
        its sender ratchet runs on like a real client's)."""
        if self._diverged is None:
            self._diverged = diverged_session(self.dave.channel_id, self.user_id)
        return self._diverged


def open_bot_packet(session: VoiceSession, datagram: bytes) -> bytes:
    """Transport-decrypt one RTP datagram the bot sent over `session` (xchacha20, as negotiated)."""
    if session.mode != "aead_xchacha20_poly1305_rtpsize":
        raise NotImplementedError(f"the fake opens only xchacha20 packets, not {session.mode}")
    header, sealed, nonce = datagram[:12], datagram[12:-4], datagram[-4:]
    if datagram[0] & 0x3F:  # discord.py never sets X, P or CSRCs; a change would need parsing here
        raise ValueError(f"unexpected RTP header flags {datagram[0]:#x}")
    return nacl.secret.Aead(session.secret_key).decrypt(sealed, header, nonce + bytes(20))


def hear_bot(sessions: list[VoiceSession], datagrams: list[tuple[int, bytes]], listener: davey.DaveSession,
             bot_id: int) -> tuple[list[bytes], int]:
    """PCM frames a simulated member decodes from the bot's datagrams, and how many were plain Opus."""
    by_ssrc = {s.ssrc: s for s in sessions}
    decoder = discord.opus.Decoder()
    pcm, plain = [], 0
    for ssrc, datagram in sorted(datagrams, key=lambda d: (d[0], struct.unpack(">H", d[1][2:4])[0])):
        frame = open_bot_packet(by_ssrc[ssrc], datagram)
        if frame == OPUS_SILENCE:
            continue
        try:
            frame = listener.decrypt(bot_id, davey.MediaType.audio, frame)
        except Exception:
            plain += 1  # sent before the bot's DAVE session was ready: not end-to-end encrypted
            continue
        pcm.append(decoder.decode(frame))
    return pcm, plain
