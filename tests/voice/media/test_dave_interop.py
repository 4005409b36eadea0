"""Interop: libdave (dave-py) and davey members in one DAVE group driven by the test gateway."""

from __future__ import annotations

import pytest

pytest.importorskip("dave")

import davey  # noqa: E402

from tests.support.dave_group import DaveGroup  # noqa: E402
from tests.support.libdave_member import LibdaveMember  # noqa: E402

CHANNEL_ID = 987_654_321_098_765_432
OPUS = bytes(range(7, 87))
AUDIO = davey.MediaType.audio


def _davey_members(group: DaveGroup) -> dict[int, davey.DaveSession]:
    return {uid: s for uid, s in group.members.items() if isinstance(s, davey.DaveSession)}


def _assert_consistent(group: DaveGroup) -> None:
    assert all(s.ready for s in group.members.values())
    for uid, s in _davey_members(group).items():
        assert s.epoch == group.epoch
        assert s.own_leaf_index == group.leaf_index(uid)
        assert sorted(map(int, s.get_user_ids())) == sorted(group.members)


def test_libdave_newcomer_frames_decrypt_in_davey() -> None:
    group = DaveGroup(CHANNEL_ID)
    alice, bob = group.join(1), group.join(2)
    lib = LibdaveMember.join(group, 3)  # welcomed via alice's (davey) commit
    _assert_consistent(group)
    assert group.epoch == 2

    frame = lib.encrypt_opus(OPUS)
    assert frame != OPUS
    assert alice.decrypt(3, AUDIO, frame) == OPUS
    assert bob.decrypt(3, AUDIO, frame) == OPUS
    with pytest.raises(ValueError):
        alice.decrypt(2, AUDIO, frame)
    assert lib.decrypt(1, alice.encrypt_opus(OPUS)) == OPUS


def test_libdave_commits_for_davey_members() -> None:
    group = DaveGroup(CHANNEL_ID)
    lib = LibdaveMember.join(group, 1)  # lowest id: libdave makes every commit
    assert not lib.ready
    bob = group.join(2)  # davey processes libdave's welcome (group creation, epoch 1)
    carol = group.join(3)  # davey processes libdave's commit
    _assert_consistent(group)
    assert group.epoch == 2

    frame = lib.encrypt_opus(OPUS)
    assert bob.decrypt(1, AUDIO, frame) == OPUS
    assert carol.decrypt(1, AUDIO, frame) == OPUS
    assert lib.decrypt(3, carol.encrypt_opus(OPUS)) == OPUS

    group.leave(2)
    _assert_consistent(group)
    frame = lib.encrypt_opus(OPUS)
    assert carol.decrypt(1, AUDIO, frame) == OPUS
    with pytest.raises(ValueError):
        bob.decrypt(1, AUDIO, frame)


def test_libdave_reinit_in_place() -> None:
    group = DaveGroup(CHANNEL_ID)
    alice = group.join(1)
    lib = LibdaveMember.join(group, 2)
    before = group.epoch
    assert group.reinit(2) is lib
    _assert_consistent(group)
    assert group.epoch == before + 1
    assert alice.decrypt(2, AUDIO, lib.encrypt_opus(OPUS)) == OPUS
    assert lib.decrypt(1, alice.encrypt_opus(OPUS)) == OPUS


def test_libdave_rejects_tampered_proposals() -> None:
    group = DaveGroup(CHANNEL_ID)
    lib = LibdaveMember.join(group, 1)
    group.join(2)
    key_package = davey.DaveSession(1, 3, CHANNEL_ID).get_serialized_key_package()
    good = group.external_sender.add_proposals(CHANNEL_ID, group.epoch, [key_package])
    tampered = good[:-1] + bytes([good[-1] ^ 0x01])
    with pytest.raises(RuntimeError, match="libdave process_proposals failed"):
        lib.process_proposals(davey.ProposalsOperationType.append, tampered, [1, 2, 3])
    assert lib.process_proposals(davey.ProposalsOperationType.append, good, [1, 2, 3]).welcome
