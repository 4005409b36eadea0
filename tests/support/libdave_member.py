"""A libdave (``dave`` module from dave-py) member for :class:`~tests.support.dave_group.DaveGroup`.

:class:`LibdaveMember` wraps ``dave.Session`` + ``dave.Encryptor`` /
``dave.Decryptor`` behind the davey-shaped :class:`GroupMember` interface, so
``group.attach(LibdaveMember(...))`` puts Discord's reference C++
implementation into the same MLS group as ``davey`` sessions (as newcomer,
existing member or committer).

Callers may rely on: after the group operation returns, ``ready`` is True,
:meth:`encrypt_opus` produces DAVE audio frames that ``davey`` members decrypt
with ``decrypt(member.user_id, MediaType.audio, frame)``, and :meth:`decrypt`
opens frames from ``davey`` members.  libdave does not expose the epoch or leaf
index; use ``DaveGroup.epoch`` / ``DaveGroup.leaf_index``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Optional, Tuple

import dave
import davey

from tests.support.dave_group import PROTOCOL_VERSION, DaveGroup

__all__ = ["LibdaveMember", "CommitWelcome", "split_commit_welcome"]

_WELCOME_CIPHERSUITE = b"\x00\x02"  # Welcome.cipher_suite for DAVE v1


@dataclass
class CommitWelcome:
    """Same shape as ``davey.CommitWelcome``."""

    commit: bytes
    welcome: Optional[bytes]


def _read_vector(data: bytes, pos: int) -> Optional[int]:
    """Return the end offset of the MLS ``<V>`` vector at ``pos`` (None if malformed)."""
    if pos >= len(data):
        return None
    prefix = data[pos] >> 6
    if prefix == 3:
        return None
    size = 1 << prefix
    if pos + size > len(data):
        return None
    length = int.from_bytes(data[pos : pos + size], "big") & ~(0xC0 << (8 * (size - 1)))
    end = pos + size + length
    return end if end <= len(data) else None


def _is_group_secrets(data: bytes, start: int, end: int) -> bool:
    """True if ``data[start:end]`` is a sequence of EncryptedGroupSecrets
    (``new_member<V> kem_output<V> ciphertext<V>``), with at least one entry."""
    pos, count = start, 0
    while pos < end:
        for _ in range(3):
            nxt = _read_vector(data, pos)
            if nxt is None or nxt > end:
                return False
            pos = nxt
        count += 1
    return count > 0 and pos == end


def split_commit_welcome(op28: bytes) -> Tuple[bytes, Optional[bytes]]:
    """Split libdave's op 28 output (``MLSMessage commit || [Welcome]``).

    A ``Welcome`` is ``cipher_suite(u16) secrets<V> encrypted_group_info<V>``
    and must end exactly at the end of the buffer; the earliest offset where
    that parses (with well-formed secrets) is the split point.
    """
    for i in range(4, len(op28) - 4):
        if op28[i : i + 2] != _WELCOME_CIPHERSUITE:
            continue
        secrets_end = _read_vector(op28, i + 2)
        if (
            secrets_end is not None
            and _read_vector(op28, secrets_end) == len(op28)
            and _is_group_secrets(op28, i + 2 + (1 << (op28[i + 2] >> 6)), secrets_end)
        ):
            return op28[:i], op28[i:]
    return op28, None


class LibdaveMember:
    """A ``dave.Session``-backed group member (duck-types ``davey.DaveSession`` for the rig;
    note :meth:`decrypt` is audio-only and takes no media type)."""

    def __init__(
        self, user_id: int, channel_id: int, recognized_user_ids: Optional[Callable[[], Iterable[int]]] = None
    ) -> None:
        """``recognized_user_ids`` supplies the ids libdave accepts in a welcome
        (defaults to ids seen in proposals plus this member)."""
        self.user_id = user_id
        self.channel_id = channel_id
        self.ssrc = user_id & 0xFFFFFFFF
        self.errors: List[Tuple[str, str]] = []
        self._recognized = recognized_user_ids
        self._seen: set[int] = {user_id}
        self.session = dave.Session(lambda source, reason: self.errors.append((source, reason)))
        # Mirror of libdave's internal roster (user id -> signature key).  libdave reports
        # roster *diffs* and Session.reset()/init() do not clear its roster, so neither do we.
        self.roster: Dict[int, bytes] = {}
        self._init()

    @classmethod
    def join(cls, group: DaveGroup, user_id: int) -> "LibdaveMember":
        """Create a libdave member and add it to ``group`` (recognizing the group's members)."""
        member = cls(user_id, group.channel_id, recognized_user_ids=lambda: group.members)
        group.attach(member)
        return member

    def _init(self) -> None:
        self.session.init(PROTOCOL_VERSION, self.channel_id, str(self.user_id))
        self.encryptor = dave.Encryptor()
        self.encryptor.assign_ssrc_to_codec(self.ssrc, dave.Codec.opus)
        self.decryptors: Dict[int, dave.Decryptor] = {}

    def _fail(self, what: str) -> RuntimeError:
        return RuntimeError(f"libdave {what} failed: {self.errors[-1:]}")

    # -- GroupMember interface -------------------------------------------

    @property
    def ready(self) -> bool:
        return self.session.has_established_group()

    def set_external_sender(self, external_sender_data: bytes) -> None:
        self.session.set_external_sender(external_sender_data)

    def get_serialized_key_package(self) -> bytes:
        kp = self.session.get_marshalled_key_package()
        if kp is None:
            raise self._fail("key package")
        return kp

    def process_proposals(
        self,
        operation_type: davey.ProposalsOperationType,
        proposals: bytes,
        expected_user_ids: Optional[List[int]] = None,
    ) -> Optional[CommitWelcome]:
        # libdave takes the whole op 27 body, including the operation-type byte.
        self._seen.update(expected_user_ids or [])
        op = bytes([int(operation_type)]) + proposals
        out = self.session.process_proposals(op, self._recognized_ids())
        if out is None:
            raise self._fail("process_proposals")
        return CommitWelcome(*split_commit_welcome(out))

    def process_commit(self, commit: bytes) -> None:
        result = self.session.process_commit(commit)
        if isinstance(result, dave.RejectType):
            raise self._fail(f"process_commit ({result.name})")
        self._update_keys(result)

    def process_welcome(self, welcome: bytes) -> None:
        result = self.session.process_welcome(welcome, self._recognized_ids())
        if result is None:
            raise self._fail("process_welcome")
        self._update_keys(result)

    def reinit(self, protocol_version: int, user_id: int, channel_id: int) -> None:
        self.user_id, self.channel_id = user_id, channel_id
        self._init()  # Session.init keeps the external sender and creates a pending group

    # -- media -------------------------------------------------------------

    def encrypt_opus(self, frame: bytes) -> bytes:
        out = self.encryptor.encrypt(dave.MediaType.audio, self.ssrc, frame)
        if out is None:
            raise RuntimeError("libdave encrypt failed")
        return out

    def decrypt(self, user_id: int, frame: bytes) -> bytes:
        decryptor = self.decryptors.get(user_id)
        out = decryptor.decrypt(dave.MediaType.audio, frame) if decryptor else None
        if out is None:
            raise ValueError(f"libdave could not decrypt frame from {user_id}")
        return out

    # -- internals -----------------------------------------------------------

    def _recognized_ids(self) -> set[str]:
        ids = set(self._seen) | set(self._recognized() if self._recognized else ())
        return {str(uid) for uid in ids}

    def _update_keys(self, roster_changes: Dict[int, List[int]]) -> None:
        """Apply libdave's roster diff and move every ratchet to the new epoch."""
        for uid, key in roster_changes.items():
            if key:
                self.roster[uid] = bytes(key)
            else:
                self.roster.pop(uid, None)
        self.encryptor.set_key_ratchet(self.session.get_key_ratchet(str(self.user_id)))
        self.decryptors = {uid: d for uid, d in self.decryptors.items() if uid in self.roster}
        for uid in self.roster:
            if uid != self.user_id:
                decryptor = self.decryptors.setdefault(uid, dave.Decryptor())
                decryptor.transition_to_key_ratchet(self.session.get_key_ratchet(str(uid)))
