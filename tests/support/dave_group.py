"""Offline DAVE (MLS) group rig: plays Discord's voice gateway as MLS external sender.

Lets real :class:`davey.DaveSession` objects form one DAVE group on one machine,
without any network.  The rig builds the binary payloads the voice gateway
would send (op 25 external sender package, op 27 proposals) and routes the
results (op 28 commit/welcome) back to members as op 29 / op 30 would.

Wire formats produced (RFC 9420 TLS presentation language, ``<V>`` = MLS varint):

* op 25 payload: ``ExternalSender { SignaturePublicKey signature_key<V>;
  Credential credential; }`` with a basic credential.
* op 27 ``append`` payload (the bytes after the 1-byte operation type, which is
  what ``davey`` takes; libdave takes the operation byte too):
  ``MLSMessage proposal_messages<V>``, i.e. one varint length followed by
  concatenated ``MLSMessage(PublicMessage)`` values, each carrying one
  Add/Remove proposal from sender type *external* (index 0), signed with
  ``SignWithLabel(key, "FramedContentTBS", FramedContentTBS)``.
"""

from __future__ import annotations

import struct
from typing import Any, Dict, Iterable, List, Mapping, Optional, Protocol

import davey
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

__all__ = ["PROTOCOL_VERSION", "ExternalSender", "DaveGroup", "GroupMember", "diverged_session", "mls_varint",
           "mls_vector"]

#: DAVE protocol version used for every session the rig creates.
PROTOCOL_VERSION: int = davey.DAVE_PROTOCOL_VERSION or 1

_MLS10 = 1  # ProtocolVersion mls10
_WIRE_PUBLIC_MESSAGE = 1  # WireFormat mls_public_message
_SENDER_EXTERNAL = 2  # SenderType external
_CONTENT_PROPOSAL = 2  # ContentType proposal
_PROPOSAL_ADD = 1
_PROPOSAL_REMOVE = 3
_CREDENTIAL_BASIC = 1


def mls_varint(n: int) -> bytes:
    """Encode ``n`` as an RFC 9420 §2.1.2 variable-size length prefix."""
    if n < 0x40:
        return bytes([n])
    if n < 0x4000:
        return struct.pack(">H", 0x4000 | n)
    if n < 0x40000000:
        return struct.pack(">I", 0x80000000 | n)
    raise ValueError("length too large for an MLS varint")


def mls_vector(data: bytes) -> bytes:
    """Encode ``data`` as an MLS ``opaque <V>`` (varint length + bytes)."""
    return mls_varint(len(data)) + data


def add_proposal(key_package: bytes) -> bytes:
    """Serialized ``Proposal`` of type add for a serialized KeyPackage (op 26 bytes)."""
    return struct.pack(">H", _PROPOSAL_ADD) + key_package


def remove_proposal(leaf_index: int) -> bytes:
    """Serialized ``Proposal`` of type remove for ``leaf_index``."""
    return struct.pack(">HI", _PROPOSAL_REMOVE, leaf_index)


class ExternalSender:
    """The voice gateway's MLS external-sender identity (P-256 / ECDSA-SHA256).

    Callers may rely on: :meth:`package` being stable for one instance, and
    :meth:`add_proposals` / :meth:`remove_proposals` returning bytes accepted
    by ``DaveSession.process_proposals(ProposalsOperationType.append, ...)``
    for sessions whose external sender is this instance's :meth:`package`.
    """

    def __init__(
        self,
        identity: bytes = b"switchboard-test-gateway",
        private_key: Optional[ec.EllipticCurvePrivateKey] = None,
    ) -> None:
        self.private_key: ec.EllipticCurvePrivateKey = private_key or ec.generate_private_key(ec.SECP256R1())
        self.identity = identity

    @property
    def public_key(self) -> bytes:
        """Uncompressed SEC1 point (65 bytes), as MLS SignaturePublicKey expects."""
        return self.private_key.public_key().public_bytes(
            serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
        )

    def package(self) -> bytes:
        """Op 25 payload (pass to ``DaveSession.set_external_sender``)."""
        credential = struct.pack(">H", _CREDENTIAL_BASIC) + mls_vector(self.identity)
        return mls_vector(self.public_key) + credential

    def sign_with_label(self, label: str, content: bytes) -> bytes:
        """RFC 9420 SignWithLabel; returns a DER-encoded ECDSA signature."""
        sign_content = mls_vector(b"MLS 1.0 " + label.encode()) + mls_vector(content)
        return self.private_key.sign(sign_content, ec.ECDSA(hashes.SHA256()))

    def proposal_message(self, channel_id: int, epoch: int, proposal: bytes) -> bytes:
        """One serialized ``MLSMessage(PublicMessage)`` carrying ``proposal`` (a serialized Proposal)."""
        framed_content = (
            mls_vector(channel_id.to_bytes(8, "big"))  # group_id
            + struct.pack(">Q", epoch)
            + struct.pack(">BI", _SENDER_EXTERNAL, 0)  # sender: external, sender_index 0
            + mls_vector(b"")  # authenticated_data
            + bytes([_CONTENT_PROPOSAL])
            + proposal
        )
        header = struct.pack(">HH", _MLS10, _WIRE_PUBLIC_MESSAGE)
        # FramedContentTBS for an external sender carries no GroupContext.
        signature = self.sign_with_label("FramedContentTBS", header + framed_content)
        # PublicMessage = content + auth (signature only: no confirmation tag for
        # proposals, no membership tag for external senders).
        return header + framed_content + mls_vector(signature)

    def proposals(self, channel_id: int, epoch: int, proposals: Iterable[bytes]) -> bytes:
        """Op 27 ``append`` payload for arbitrary serialized Proposals (e.g. removes + adds)."""
        return mls_vector(b"".join(self.proposal_message(channel_id, epoch, p) for p in proposals))

    def add_proposals(self, channel_id: int, epoch: int, key_packages: List[bytes]) -> bytes:
        """Op 27 ``append`` payload adding each serialized KeyPackage (op 26 bytes)."""
        return self.proposals(channel_id, epoch, map(add_proposal, key_packages))

    def remove_proposals(self, channel_id: int, epoch: int, leaf_indices: List[int]) -> bytes:
        """Op 27 ``append`` payload removing each leaf index."""
        return self.proposals(channel_id, epoch, map(remove_proposal, leaf_indices))


class GroupMember(Protocol):
    """What :class:`DaveGroup` needs from a member; ``davey.DaveSession`` satisfies it.

    ``process_proposals`` must return an object with ``commit`` / ``welcome``
    attributes (like ``davey.CommitWelcome``) or ``None``.
    """

    @property
    def user_id(self) -> int: ...
    @property
    def channel_id(self) -> int: ...
    def set_external_sender(self, external_sender_data: bytes) -> None: ...
    def get_serialized_key_package(self) -> bytes: ...
    def process_proposals(
        self,
        operation_type: davey.ProposalsOperationType,
        proposals: bytes,
        expected_user_ids: Optional[List[int]] = None,
    ) -> Any: ...
    def process_commit(self, commit: bytes) -> None: ...
    def process_welcome(self, welcome: bytes) -> None: ...
    def reinit(self, protocol_version: int, user_id: int, channel_id: int) -> None: ...


class DaveGroup:
    """Simulated voice gateway for one channel's DAVE group.

    Callers may rely on:

    * after :meth:`join` / :meth:`attach` / :meth:`leave` / :meth:`reinit`
      return with two or more members, every davey session in :attr:`members`
      is ``ready`` and reports ``epoch == group.epoch``;
    * a lone member stays *pending* (not ready, epoch 0), as on Discord; the
      group is created (epoch 1) when the second member joins;
    * every membership change is exactly one commit (epoch + 1), made by the
      member with the lowest user id; leaf indices are tracked gateway-side
      (:meth:`leaf_index`) following RFC 9420 (leftmost blank leaf).
    """

    def __init__(self, channel_id: int, external_sender: Optional[ExternalSender] = None) -> None:
        self.channel_id = channel_id
        self.external_sender = external_sender or ExternalSender()
        self._members: Dict[int, GroupMember] = {}
        self._leaves: List[Optional[int]] = []  # leaf index -> user id (None = blank)
        self._epoch = 0

    @property
    def members(self) -> Mapping[int, Any]:
        """Snapshot: user id -> session (``davey.DaveSession`` or other :class:`GroupMember`)."""
        return dict(self._members)

    @property
    def epoch(self) -> int:
        """Current group epoch (0 while no group is established)."""
        return self._epoch

    def leaf_index(self, user_id: int) -> int:
        """The member's MLS leaf index in the current epoch."""
        return self._leaves.index(user_id)

    def join(self, user_id: int) -> davey.DaveSession:
        """Create a ``davey.DaveSession`` for ``user_id`` and add it to the group."""
        session = davey.DaveSession(PROTOCOL_VERSION, user_id, self.channel_id)
        self.attach(session)
        return session

    def attach(self, session: GroupMember) -> None:
        """Add an externally constructed, not-yet-joined session (inactive or pending)."""
        if session.channel_id != self.channel_id:
            raise ValueError("session belongs to a different channel")
        if session.user_id in self._members:
            raise ValueError(f"user {session.user_id} is already a member")
        session.set_external_sender(self.external_sender.package())  # op 25
        self._add(session)

    def leave(self, user_id: int) -> None:
        """Remove ``user_id`` (Remove proposal, committed by a remaining member)."""
        del self._members[user_id]
        leaf = self.leaf_index(user_id)
        if not self._members or self._epoch == 0:
            self._reset()
            return
        self._commit([remove_proposal(leaf)], newcomer=None)

    def reinit(self, user_id: int) -> Any:
        """Re-initialise ``user_id``'s session in place (op 24 / re-join) and re-add it.

        Returns the same session object, ready in a new epoch if others remain.
        """
        session = self._members.pop(user_id)
        leaf = self.leaf_index(user_id)
        session.reinit(PROTOCOL_VERSION, user_id, self.channel_id)  # keeps external sender -> pending
        if not self._members or self._epoch == 0:
            self._reset()
            self._add(session)
        else:  # drop the stale leaf and add the fresh key package in one commit
            self._add(session, remove_leaves=[leaf])
        return session

    # -- internals -------------------------------------------------------

    def _reset(self) -> None:
        self._leaves = [uid for uid in self._leaves if uid in self._members]
        self._epoch = 0

    def _add(self, session: GroupMember, remove_leaves: Iterable[int] = ()) -> None:
        if not self._members:  # alone: its pending group has just itself at leaf 0, epoch 0
            self._members[session.user_id] = session
            self._leaves = [session.user_id]
            return
        proposals = [*map(remove_proposal, remove_leaves), add_proposal(session.get_serialized_key_package())]
        self._commit(proposals, newcomer=session)
        self._members[session.user_id] = session

    def _commit(self, proposals: List[bytes], newcomer: Optional[GroupMember]) -> None:
        """Op 27 to every member, lowest id commits, op 29 to members, op 30 to ``newcomer``."""
        payload = self.external_sender.proposals(self.channel_id, self._epoch, proposals)
        expected = [*self._members, *([newcomer.user_id] if newcomer else [])]
        results = {
            uid: m.process_proposals(davey.ProposalsOperationType.append, payload, expected)
            for uid, m in self._members.items()
        }
        result = results[min(results)]
        if result is None:
            raise RuntimeError("committer produced no commit")
        for member in self._members.values():  # the committer merges its own commit here
            member.process_commit(result.commit)
        if newcomer is not None:
            if result.welcome is None:
                raise RuntimeError("commit adding a member produced no welcome")
            newcomer.process_welcome(result.welcome)
        self._apply(proposals, newcomer)
        self._epoch += 1

    def _apply(self, proposals: List[bytes], newcomer: Optional[GroupMember]) -> None:
        """Mirror the tree change: removes blank their leaf, the add takes the leftmost blank."""
        for p in proposals:
            if p[:2] == struct.pack(">H", _PROPOSAL_REMOVE):
                self._leaves[struct.unpack(">I", p[2:6])[0]] = None
        if newcomer is not None:
            if None in self._leaves:
                self._leaves[self._leaves.index(None)] = newcomer.user_id
            else:
                self._leaves.append(newcomer.user_id)
        while self._leaves and self._leaves[-1] is None:
            self._leaves.pop()


def diverged_session(channel_id: int, user_id: int, peer_id: int = 1) -> davey.DaveSession:
    """A ready session for ``user_id`` in a group of its own on ``channel_id``: a client whose MLS
    state diverged from the channel's. Its frames are genuine DAVE frames that no member of the
    real group can decrypt (davey: ``NoValidCryptorFound``). ``peer_id`` is the other member a
    group needs before it is ready."""
    group = DaveGroup(channel_id)
    session = group.join(user_id)
    group.join(peer_id)
    return session
