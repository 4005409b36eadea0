"""Sans-I/O receive core: Discord voice UDP datagrams in, per-speaker 48 kHz stereo PCM out.

One datagram, in order: parse RTP -> filter (RTCP, non-Opus, own, video) -> transport decrypt
-> replay window -> strip extension body and padding -> attribute to a user (op 5 / op 12, else
buffer and try DAVE keys) -> DAVE decrypt -> Opus decode -> `on_audio(user_id, ssrc, pcm)`.
Every attributed packet also lands in the per-member hearing ledger (`hearing.py`): decoded to
sound, or failed DAVE/Opus.

The receiver owns no socket, thread or clock. `on_packet` is called on discord.py's socket
reader thread and `on_ws_message` on the event loop, so both take one uncontended lock.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import davey

from voice.media.deaf import DeafDetector
from voice.media.hearing import MemberHearing
from voice.media.opus import OpusDecoder
from voice.media.rtp import (
    DAVE_MAGIC,
    NONCE_SUFFIX_SIZE,
    OPUS_PAYLOAD_TYPE,
    OPUS_SILENCE,
    TAG_SIZE,
    is_rtcp,
    parse_header,
    strip_padding,
)
from voice.media.transport_cipher import TransportCipher, UnsupportedMode

log = logging.getLogger(__name__)

AudioCallback = Callable[[int, int, bytes], None]

_AUDIO = davey.MediaType.audio
_WINDOW_BITS = 64
_WINDOW_MASK = (1 << _WINDOW_BITS) - 1
_CAMEL = re.compile(r"\b[A-Z][a-z][A-Za-z]*\b")
_RESTART_GAP = 1000  # a sequence jump back this far means the sender restarted its stream

COUNTERS = (
    "ok",
    "rtcp",
    "malformed",
    "not_opus",
    "own",
    "video",
    "no_key",
    "transport_fail",
    "duplicate",
    "stale",
    "bad_extension",
    "bad_padding",
    "unmapped_buffered",
    "unmapped_dropped",
    "unmapped_flushed",
    "identified_by_dave",
    "dave_not_ready",
    "opus_fail",
    "ws_malformed",
    "error",
    "speaking_events",
    "deaf",
    "deaf_events",
    "unheard_events",
)


class VoiceConnection(Protocol):
    """What the receiver reads per packet; discord.py's VoiceConnectionState has exactly these."""

    mode: str
    secret_key: Any
    ssrc: int
    dave_session: Any
    dave_protocol_version: int


class _Stream:
    """Per-SSRC state: owner, decoder, replay window."""

    __slots__ = ("user_id", "decoder", "top", "mask")

    def __init__(self) -> None:
        self.user_id: int | None = None
        self.decoder: OpusDecoder | None = None
        self.top = -1
        self.mask = 0

    def accept(self, seq: int) -> int:
        """0 = new packet, 1 = duplicate, 2 = too old."""
        top = self.top
        if top < 0:
            self.top, self.mask = seq, 1
            return 0
        ahead = (seq - top) & 0xFFFF
        if ahead == 0:
            return 1
        if ahead < 0x8000:
            self.mask = ((self.mask << ahead) | 1) & _WINDOW_MASK
            self.top = seq
            return 0
        back = 0x10000 - ahead
        if back >= _RESTART_GAP:
            self.top, self.mask = seq, 1
            return 0
        if back >= _WINDOW_BITS:
            return 2
        bit = 1 << back
        if self.mask & bit:
            return 1
        self.mask |= bit
        return 0


class Receiver:
    """Turns Discord voice datagrams into per-user PCM. See the module docstring for the order.

    `stats` maps every counter name (including each `dave_fail:<reason>`) to an int.
    Two detectors share `deaf_after_s`: `check_deaf` (nothing decodes for anyone) and
    `poll_members` (one member's packets keep failing while nothing of theirs is heard).
    """

    def __init__(
        self,
        connection: VoiceConnection,
        on_audio: AudioCallback,
        *,
        pending_packets: int = 50,
        max_pending_ssrcs: int = 32,
        deaf_after_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        pcm_rate: int = 48_000,
        pcm_channels: int = 2,
    ) -> None:
        """`pcm_rate`/`pcm_channels`: what `on_audio` gets (Opus decodes straight to it) — Discord's own
        48 kHz stereo by default; a call asks for the model's 24 kHz mono and skips a resampler."""
        self._conn = connection
        self._pcm_rate, self._pcm_channels = pcm_rate, pcm_channels
        self._frame_bytes = pcm_rate // 50 * 2 * pcm_channels  # 20 ms
        self._on_audio = on_audio
        self._pending_limit = pending_packets
        self._max_pending_ssrcs = max_pending_ssrcs
        self._clock = clock
        self._lock = threading.Lock()
        self.stats: dict[str, int] = dict.fromkeys(COUNTERS, 0)
        self._streams: dict[int, _Stream] = {}
        self._ssrc_user: dict[int, int] = {}
        self._ignored: set[int] = set()
        self._pending: dict[int, deque[bytes]] = {}
        self.roster: set[int] = set()
        self._key_obj: Any = None
        self._key_mode: Any = None
        self._cipher: TransportCipher | None = None
        self._activity = 0
        self._deaf = DeafDetector(deaf_after_s)
        self._sound = 0  # decoded frames other than the silence frame
        self._hearing = MemberHearing(deaf_after_s)
        self._logged_errors: set[str] = set()

    # -- public -----------------------------------------------------------------------------

    def user_for_ssrc(self, ssrc: int) -> int | None:
        return self._ssrc_user.get(ssrc)

    def on_packet(self, datagram: bytes) -> None:
        """Handle one UDP datagram. Never raises; every drop is counted in `stats`."""
        try:
            with self._lock:
                self._handle(datagram)
        except Exception as exc:  # a bad datagram must never kill the reader thread
            self.stats["error"] += 1
            self._log_once("packet", exc)

    def on_ws_message(self, msg: dict) -> None:
        """Handle one voice-websocket JSON op ({"op": .., "d": ..}). Never raises."""
        try:
            with self._lock:
                self._handle_ws(msg)
        except Exception as exc:
            self.stats["ws_malformed"] += 1
            self._log_once("ws", exc)

    def check_deaf(self, now: float | None = None) -> bool:
        """Poll the deaf detector; True exactly when the receiver has just gone deaf."""
        stats = self.stats
        went_deaf = self._deaf.poll(
            self._clock() if now is None else now,
            self._activity,
            self._sound,  # frames with sound: the unencrypted silence frame proves nothing decrypts
        )
        stats["deaf"] = int(self._deaf.deaf)
        if went_deaf:
            stats["deaf_events"] += 1
            log.warning("voice receive is deaf: packets or SPEAKING arrive but no audio decodes; stats=%s",
                        self.nonzero_stats())
        return went_deaf

    def poll_members(self, now: float | None = None) -> list[int]:
        """User ids that have just become unheard: for `deaf_after_s` seconds their packets kept
        arriving and failing (DAVE decrypt or Opus decode) while nothing of theirs was heard.

        Each member once per episode; a frame of theirs heard ends it, op 13 forgets them. Packets
        of an SSRC with no known user are never attributed. While the channel-wide detector says
        deaf (`check_deaf`; call it first), reports wait: that one message covers everyone.
        """
        with self._lock:
            unheard = self._hearing.poll(self._clock() if now is None else now, hold=self._deaf.deaf)
            health = self._hearing.health() if unheard else {}
            self.stats["unheard_events"] += len(unheard)
        for user_id in unheard:
            log.warning("voice receive cannot hear user %s: their packets arrive but do not decode; %s",
                        user_id, health[user_id])
        return unheard

    def member_health(self) -> dict[int, dict]:
        """user id -> {"state": "ok"|"failing"|"unheard", "ok": n, "failed": n, "reason": str|None}
        for every member with attributed packets: `ok` packets of theirs heard (the silence frame
        excluded), `failed` ones dropped, `reason` the latest drop's counter name ("dave_fail:…" or
        "opus_fail"). `state` is as of the last `poll_members`."""
        with self._lock:
            return self._hearing.health()

    def nonzero_stats(self) -> dict[str, int]:
        return {k: v for k, v in self.stats.items() if v}

    # -- datagrams --------------------------------------------------------------------------

    def _handle(self, d: bytes) -> None:
        stats = self.stats
        if type(d) is not bytes:
            d = bytes(d)
        if is_rtcp(d):
            stats["rtcp"] += 1
            return
        header = parse_header(d)
        if header is None:
            stats["malformed"] += 1
            return
        if header.payload_type != OPUS_PAYLOAD_TYPE:
            stats["not_opus"] += 1
            return
        conn = self._conn
        ssrc = header.ssrc
        if ssrc == conn.ssrc:
            stats["own"] += 1
            return
        if ssrc in self._ignored:
            stats["video"] += 1
            return
        owner = self._ssrc_user.get(ssrc)
        if owner is None or not self._sound or self._hearing.ever_heard(owner):
            # Channel-wide deafness is about us: one member who was never heard while others are is
            # their own problem (`poll_members` names them), not a reason to rejoin on everyone.
            self._activity += 1
        aad_len = header.aad_len
        if len(d) < aad_len + TAG_SIZE + NONCE_SUFFIX_SIZE:
            stats["malformed"] += 1
            return
        key = conn.secret_key
        mode = conn.mode
        cipher = self._cipher
        if key is not self._key_obj or mode is not self._key_mode:
            cipher = self._new_cipher(key, mode)
        if cipher is None:
            stats["no_key"] += 1
            return
        plain = cipher.decrypt(d[:aad_len], d[aad_len:-NONCE_SUFFIX_SIZE], d[-NONCE_SUFFIX_SIZE:])
        if plain is None:
            stats["transport_fail"] += 1
            return
        stream = self._streams.get(ssrc)
        if stream is None:
            stream = self._streams[ssrc] = _Stream()
        verdict = stream.accept(header.sequence)
        if verdict:
            stats["duplicate" if verdict == 1 else "stale"] += 1
            return
        ext_len = header.ext_words << 2
        if ext_len:
            if ext_len > len(plain):
                stats["bad_extension"] += 1
                return
            plain = plain[ext_len:]
        if header.padded:
            unpadded = strip_padding(plain)
            if unpadded is None:
                stats["bad_padding"] += 1
                return
            plain = unpadded
        user_id = self._ssrc_user.get(ssrc)
        if user_id is None:
            self._unmapped(ssrc, stream, plain)
            return
        self._deliver(ssrc, stream, user_id, plain)

    def _new_cipher(self, key: Any, mode: Any) -> TransportCipher | None:
        self._key_obj, self._key_mode, self._cipher = key, mode, None
        if not key or not mode or not isinstance(mode, str):
            return None
        try:
            self._cipher = TransportCipher(mode, bytes(key))
        except (UnsupportedMode, ValueError, TypeError) as exc:
            self._log_once("cipher", exc)
        return self._cipher

    def _deliver(self, ssrc: int, stream: _Stream, user_id: int, frame: bytes) -> None:
        if frame != OPUS_SILENCE:
            conn = self._conn
            session = conn.dave_session
            if session is not None and session.ready:
                try:
                    frame = session.decrypt(user_id, _AUDIO, frame)
                except Exception as exc:
                    self._count_dave_failure(user_id, exc)
                    return
            elif conn.dave_protocol_version and frame[-2:] == DAVE_MAGIC:
                self.stats["dave_not_ready"] += 1
                return
        self._decode(ssrc, stream, user_id, frame)

    def _decode(self, ssrc: int, stream: _Stream, user_id: int, opus: bytes) -> None:
        decoder = stream.decoder
        if decoder is None:
            decoder = stream.decoder = OpusDecoder(self._pcm_rate, self._pcm_channels)
        try:
            pcm = decoder.decode(opus)
        except ValueError:
            self.stats["opus_fail"] += 1
            self._hearing.failed(user_id, "opus_fail")
            return
        self.stats["ok"] += 1
        if opus != OPUS_SILENCE:  # sent unencrypted after every utterance: it proves nothing about them
            self._hearing.heard(user_id)
            self._sound += 1
        frame_bytes = self._frame_bytes
        if len(pcm) == frame_bytes:
            self._on_audio(user_id, ssrc, pcm)
            return
        for i in range(0, len(pcm) - frame_bytes + 1, frame_bytes):  # 40/60 ms packets
            self._on_audio(user_id, ssrc, pcm[i : i + frame_bytes])

    def _count_dave_failure(self, user_id: int, exc: Exception) -> None:
        key = "dave_fail:" + _dave_reason(exc)
        self.stats[key] = self.stats.get(key, 0) + 1
        self._hearing.failed(user_id, key)  # every reason: brief ones are told apart by time

    # -- unmapped speakers ---------------------------------------------------------------------

    def _unmapped(self, ssrc: int, stream: _Stream, frame: bytes) -> None:
        session = self._conn.dave_session
        if frame != OPUS_SILENCE and session is not None and session.ready:
            me = session.user_id
            for candidate in session.get_user_ids():
                uid = int(candidate)
                if uid == me:
                    continue
                try:
                    opus = session.decrypt(uid, _AUDIO, frame)
                except Exception:
                    continue  # only the true sender's key authenticates; a failed try leaves no state
                self.stats["identified_by_dave"] += 1
                self._assign(ssrc, uid)
                self._flush(ssrc)
                self._decode(ssrc, stream, uid, opus)
                return
        pending = self._pending.get(ssrc)
        if pending is None:
            if len(self._pending) >= self._max_pending_ssrcs:
                self.stats["unmapped_dropped"] += 1
                return
            pending = self._pending[ssrc] = deque()
        if len(pending) >= self._pending_limit:
            pending.popleft()
            self.stats["unmapped_dropped"] += 1
        pending.append(frame)
        self.stats["unmapped_buffered"] += 1

    def _assign(self, ssrc: int, user_id: int) -> None:
        previous = self._ssrc_user.get(ssrc)
        self._ssrc_user[ssrc] = user_id
        self._ignored.discard(ssrc)
        stream = self._streams.get(ssrc)
        if stream is not None and previous is not None and previous != user_id:
            # a new owner is a new stream: a fresh decoder, and their own RTP sequence numbers (those the
            # previous owner used are not replays of theirs)
            stream.decoder = None
            stream.top, stream.mask = -1, 0
        if stream is not None:
            stream.user_id = user_id

    def _flush(self, ssrc: int) -> None:
        pending = self._pending.pop(ssrc, None)
        if not pending:
            return
        user_id = self._ssrc_user[ssrc]
        stream = self._streams.get(ssrc) or self._streams.setdefault(ssrc, _Stream())
        for frame in pending:
            self.stats["unmapped_flushed"] += 1
            self._deliver(ssrc, stream, user_id, frame)

    # -- voice websocket ops ---------------------------------------------------------------------

    def _handle_ws(self, msg: dict) -> None:
        op = msg.get("op")
        data = msg.get("d")
        if op not in (5, 11, 12, 13) or not isinstance(data, dict):
            return
        if op == 5:
            ssrc = int(data["ssrc"])
            user_id = int(data["user_id"])
            if data.get("speaking"):
                self.stats["speaking_events"] += 1
                if not self._sound or self._hearing.ever_heard(user_id):
                    self._activity += 1  # see `_handle`: a member never heard is theirs to report, not ours
            self._map(ssrc, user_id)
        elif op == 12:
            user_id = int(data["user_id"])
            audio = int(data.get("audio_ssrc") or 0)
            for key in ("video_ssrc", "rtx_ssrc"):
                if data.get(key):
                    self._ignored.add(int(data[key]))
            for stream in data.get("streams") or ():
                for key in ("ssrc", "rtx_ssrc"):
                    if isinstance(stream, dict) and stream.get(key):
                        self._ignored.add(int(stream[key]))
            if audio:
                self._map(audio, user_id)
        elif op == 11:
            self.roster.update(int(u) for u in data.get("user_ids") or ())
        elif op == 13:
            self._forget_user(int(data["user_id"]))

    def _map(self, ssrc: int, user_id: int) -> None:
        if ssrc == self._conn.ssrc or ssrc <= 0:
            return
        self.roster.add(user_id)
        self._assign(ssrc, user_id)
        self._flush(ssrc)

    def _forget_user(self, user_id: int) -> None:
        self.roster.discard(user_id)
        self._hearing.forget(user_id)
        for ssrc in [s for s, u in self._ssrc_user.items() if u == user_id]:
            del self._ssrc_user[ssrc]
            self._streams.pop(ssrc, None)
            self._pending.pop(ssrc, None)

    def _log_once(self, where: str, exc: Exception) -> None:
        key = f"{where}:{type(exc).__name__}"
        if key not in self._logged_errors:
            self._logged_errors.add(key)
            log.warning("voice receive %s error (further ones only counted): %r", where, exc)


def _dave_reason(exc: Exception) -> str:
    """A short, stable counter suffix from a davey error, e.g. 'NoValidCryptorFound' out of
    "Failed to decrypt: DecryptionFailed(NoValidCryptorFound { ... })"."""
    names = [n for n in _CAMEL.findall(str(exc)) if n != "Failed"]
    return names[-1] if names else type(exc).__name__
