"""The voice gateway's DAVE role for one channel: MLS external sender and commit/welcome relay.

Members are simulated users (local `davey.DaveSession`s) and the bot (remote, over its voice
websocket). Each membership change is one round, as on Discord: signed proposals (op 27, via
`tests.support.dave_group.ExternalSender`) go to every member; the first commit wins — a simulated
member's if there is one (the bot's op 28 is then the losing answer, recorded and dropped), else the
bot's op 28 — and is announced to members (op 29) while the newcomer gets the welcome (op 30).
Transitions carry ids; the bot's op 23 for an id is answered with op 22 by its voice session.
"""

from __future__ import annotations

import asyncio
import itertools
import struct
from typing import Protocol

import davey

from tests.support.dave_group import PROTOCOL_VERSION, ExternalSender, add_proposal, remove_proposal

MLS_PROPOSALS, MLS_ANNOUNCE_COMMIT, MLS_WELCOME = 27, 29, 30
APPEND = 0


class BotLink(Protocol):
    """The bot's current voice connection, as the relay needs it."""

    user_id: int

    async def send_binary(self, op: int, payload: bytes) -> None: ...
    def expect_transition(self, transition_id: int) -> None: ...


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def take(self, n: int) -> bytes:
        if self.at + n > len(self.data):
            raise ValueError("truncated MLS message")
        chunk = self.data[self.at:self.at + n]
        self.at += n
        return chunk

    def u8(self) -> int:
        return self.take(1)[0]

    def u16(self) -> int:
        return struct.unpack(">H", self.take(2))[0]

    def vector(self) -> bytes:
        prefix = self.data[self.at] >> 6 if self.at < len(self.data) else 3
        if prefix == 3:
            raise ValueError("bad MLS varint")
        size = 1 << prefix
        length = int.from_bytes(self.take(size), "big") & ((1 << (8 * size - 2)) - 1)
        return self.take(length)


def split_commit_welcome(data: bytes) -> tuple[bytes, bytes | None]:
    """Split op 28 (`MLSMessage(PublicMessage commit) ‖ Welcome?`) by parsing the commit (RFC 9420)."""
    r = _Reader(data)
    if r.u16() != 1 or r.u16() != 1:  # mls10, mls_public_message
        raise ValueError("op 28 does not start with an MLS PublicMessage")
    r.vector()  # group_id
    r.take(8)  # epoch
    if r.u8() != 1:  # sender type member
        raise ValueError("commit not sent by a member")
    r.take(4)  # leaf index
    r.vector()  # authenticated_data
    if r.u8() != 3:  # content type commit
        raise ValueError("op 28 PublicMessage is not a commit")
    r.vector()  # proposals
    if r.u8():  # optional<UpdatePath>: its LeafNode, then the path nodes
        r.vector(), r.vector()  # encryption key, signature key
        if r.u16() != 1:  # basic credential
            raise ValueError("unexpected credential type")
        r.vector()  # identity
        for _ in range(5):  # capabilities: versions, cipher suites, extensions, proposals, credentials
            r.vector()
        source = r.u8()
        if source == 1:
            r.take(16)  # lifetime
        elif source == 3:
            r.vector()  # parent hash
        r.vector(), r.vector()  # extensions, signature
        r.vector()  # path nodes
    r.vector(), r.vector(), r.vector()  # signature, confirmation tag, membership tag
    welcome = data[r.at:]
    return data[:r.at], welcome or None


def commit_epoch(data: bytes) -> int:
    """The epoch a PublicMessage (e.g. an op 28 commit) was made in."""
    r = _Reader(data)
    r.take(4)
    r.vector()
    return struct.unpack(">Q", r.take(8))[0]


class DaveRelay:
    """Keeps one DAVE group consistent across simulated users and the bot (see module doc)."""

    def __init__(self, channel_id: int, bot_id: int) -> None:
        self.channel_id, self.bot_id = channel_id, bot_id
        self.external_sender = ExternalSender(identity=b"fake-discord-voice")
        self.local: dict[int, davey.DaveSession] = {}
        self.bot: BotLink | None = None
        self.epoch = 0
        self._leaves: list[int | None] = []
        self._lock = asyncio.Lock()
        self._transitions = itertools.count(1)
        self._bot_commit: asyncio.Future[bytes] | None = None
        self.losing_commits: list[bytes] = []  # bot op 28s that lost to a simulated member's commit

    def package(self) -> bytes:
        """Op 25 payload."""
        return self.external_sender.package()

    @property
    def members(self) -> list[int]:
        return [uid for uid in self._leaves if uid is not None]

    async def add_user(self, user_id: int) -> davey.DaveSession:
        async with self._lock:
            session = davey.DaveSession(PROTOCOL_VERSION, user_id, self.channel_id)
            session.set_external_sender(self.package())
            await self._add(user_id, session.get_serialized_key_package(), session=session)
            self.local[user_id] = session
            return session

    async def remove_user(self, user_id: int) -> None:
        async with self._lock:
            self.local.pop(user_id)
            await self._remove(user_id)

    async def bot_key_package(self, link: BotLink, key_package: bytes) -> None:
        """Op 26 from the bot: it joins the group; a stale leaf of an earlier connection leaves first."""
        async with self._lock:
            if self.bot_id in self._leaves:  # the bot re-initialised its session (reconnect, op 24)
                self.bot = None
                await self._remove(self.bot_id)
            self.bot = link
            await self._add(self.bot_id, key_package, session=None)

    async def bot_gone(self, link: BotLink) -> None:
        """The bot's voice websocket closed: its leaf leaves the group."""
        async with self._lock:
            if self.bot is link:
                self.bot = None
                if self.bot_id in self._leaves:
                    await self._remove(self.bot_id)

    def bot_commit(self, data: bytes) -> None:
        """Op 28 from the bot: used if the current round waits for it, else it lost the race."""
        waiting = self._bot_commit is not None and not self._bot_commit.done()
        if waiting and commit_epoch(data) == self.epoch:
            self._bot_commit.set_result(data)
        else:
            self.losing_commits.append(data)

    # -- rounds ----------------------------------------------------------------------------

    async def _add(self, user_id: int, key_package: bytes, *, session: davey.DaveSession | None) -> None:
        if not self.members:  # alone: pending at leaf 0 until someone joins
            self._leaves, self.epoch = [user_id], 0
            return
        commit, welcome, tid = await self._round([add_proposal(key_package)])
        if welcome is None:
            raise RuntimeError("a commit adding a member came without a welcome")
        if session is not None:
            session.process_welcome(welcome)
        else:
            self.bot.expect_transition(tid)
            await self.bot.send_binary(MLS_WELCOME, struct.pack(">H", tid) + welcome)
        if None in self._leaves:  # RFC 9420: an Add takes the leftmost blank leaf
            self._leaves[self._leaves.index(None)] = user_id
        else:
            self._leaves.append(user_id)

    async def _remove(self, user_id: int) -> None:
        leaf = self._leaves.index(user_id)
        self._leaves[leaf] = None
        if not self.members or self.epoch == 0:
            self._leaves = [uid for uid in self._leaves if uid is not None]
            self.epoch = 0
            return
        await self._round([remove_proposal(leaf)], removed_leaf=leaf)
        while self._leaves and self._leaves[-1] is None:
            self._leaves.pop()

    async def _round(self, proposals: list[bytes], removed_leaf: int | None = None) -> tuple[bytes, bytes | None, int]:
        payload = self.external_sender.proposals(self.channel_id, self.epoch, proposals)
        bot_member = self.bot is not None and self.bot_id in self.members
        results = {uid: s.process_proposals(davey.ProposalsOperationType.append, payload)
                   for uid, s in self.local.items() if uid in self.members}
        if bot_member:
            if not results:
                self._bot_commit = asyncio.get_running_loop().create_future()
            await self.bot.send_binary(MLS_PROPOSALS, bytes([APPEND]) + payload)
        if results:
            result = results[min(results)]
            commit, welcome = result.commit, result.welcome
        elif bot_member:
            try:
                commit, welcome = split_commit_welcome(await asyncio.wait_for(self._bot_commit, 15))
            finally:
                self._bot_commit = None
        else:
            raise RuntimeError("no member left to commit")
        for uid, session in self.local.items():
            if uid in self.members:
                session.process_commit(commit)
        tid = next(self._transitions)
        if bot_member:
            self.bot.expect_transition(tid)
            await self.bot.send_binary(MLS_ANNOUNCE_COMMIT, struct.pack(">H", tid) + commit)
        self.epoch += 1
        return commit, welcome, tid
