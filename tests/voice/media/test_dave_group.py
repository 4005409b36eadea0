"""Tests for the offline DAVE group rig (tests/support/dave_group.py)."""

from __future__ import annotations

import davey
import pytest

from tests.support.dave_group import PROTOCOL_VERSION, DaveGroup, ExternalSender

CHANNEL_ID = 1_234_567_890_123_456_789
OPUS = bytes(range(1, 61))  # arbitrary non-silence "opus" payload
AUDIO = davey.MediaType.audio


def _epochs(group: DaveGroup) -> set[int]:
    return {s.epoch for s in group.members.values()}


def _assert_all_ready(group: DaveGroup) -> None:
    assert all(s.ready for s in group.members.values())
    assert _epochs(group) == {group.epoch}
    # The rig's gateway-side leaf bookkeeping agrees with every member's MLS tree.
    assert {uid: s.own_leaf_index for uid, s in group.members.items()} == {
        uid: group.leaf_index(uid) for uid in group.members
    }


def test_lone_member_stays_pending() -> None:
    group = DaveGroup(CHANNEL_ID)
    alice = group.join(1)
    assert alice.status == davey.SessionStatus.pending
    assert not alice.ready
    assert group.epoch == 0


def test_two_members_ready_in_same_epoch() -> None:
    group = DaveGroup(CHANNEL_ID)
    alice = group.join(1)
    bob = group.join(2)
    _assert_all_ready(group)
    assert group.epoch == 1
    assert alice.status == bob.status == davey.SessionStatus.active
    assert sorted(map(int, alice.get_user_ids())) == [1, 2]
    assert alice.voice_privacy_code == bob.voice_privacy_code


def test_frame_roundtrip_between_members() -> None:
    group = DaveGroup(CHANNEL_ID)
    alice, bob = group.join(1), group.join(2)
    frame = alice.encrypt_opus(OPUS)
    assert frame != OPUS
    assert bob.decrypt(1, AUDIO, frame) == OPUS
    assert alice.decrypt(2, AUDIO, bob.encrypt_opus(OPUS)) == OPUS


def test_decrypt_with_wrong_user_id_fails() -> None:
    group = DaveGroup(CHANNEL_ID)
    alice, bob, carol = group.join(1), group.join(2), group.join(3)
    frame = alice.encrypt_opus(OPUS)
    with pytest.raises(ValueError):
        carol.decrypt(2, AUDIO, frame)  # bob's key cannot open alice's frame
    with pytest.raises(ValueError):
        carol.decrypt(999, AUDIO, frame)  # not a member at all
    assert bob.decrypt(1, AUDIO, frame) == OPUS


def test_third_member_advances_epoch_and_decrypts() -> None:
    group = DaveGroup(CHANNEL_ID)
    alice, bob = group.join(1), group.join(2)
    carol = group.join(3)
    _assert_all_ready(group)
    assert group.epoch == 2
    frame = carol.encrypt_opus(OPUS)
    assert alice.decrypt(3, AUDIO, frame) == OPUS
    assert bob.decrypt(3, AUDIO, frame) == OPUS
    assert carol.decrypt(1, AUDIO, alice.encrypt_opus(OPUS)) == OPUS


def test_leave_advances_epoch_and_locks_out_removed_member() -> None:
    group = DaveGroup(CHANNEL_ID)
    alice, bob, carol = group.join(1), group.join(2), group.join(3)
    assert bob.decrypt(1, AUDIO, alice.encrypt_opus(OPUS)) == OPUS
    before = group.epoch
    group.leave(2)
    assert set(group.members) == {1, 3}
    _assert_all_ready(group)
    assert group.epoch == before + 1
    frame = alice.encrypt_opus(OPUS)
    assert carol.decrypt(1, AUDIO, frame) == OPUS
    with pytest.raises(ValueError):
        bob.decrypt(1, AUDIO, frame)


def test_committer_can_leave() -> None:
    group = DaveGroup(CHANNEL_ID)
    _, bob, carol = group.join(1), group.join(2), group.join(3)
    group.leave(1)
    _assert_all_ready(group)
    assert carol.decrypt(2, AUDIO, bob.encrypt_opus(OPUS)) == OPUS


def test_reinit_in_place() -> None:
    group = DaveGroup(CHANNEL_ID)
    alice, bob = group.join(1), group.join(2)
    old_epoch = group.epoch
    same = group.reinit(1)
    assert same is alice and group.members[1] is alice
    _assert_all_ready(group)
    assert group.epoch > old_epoch
    assert sorted(map(int, bob.get_user_ids())) == [1, 2]
    assert bob.decrypt(1, AUDIO, alice.encrypt_opus(OPUS)) == OPUS
    assert alice.decrypt(2, AUDIO, bob.encrypt_opus(OPUS)) == OPUS


def test_churn_reuses_blank_leaves_and_empty_group_restarts() -> None:
    group = DaveGroup(CHANNEL_ID)
    for uid in (1, 2, 3, 4):
        group.join(uid)
    group.leave(2)
    group.leave(1)
    _assert_all_ready(group)
    group.join(5)  # takes the leftmost blank leaf (0)
    _assert_all_ready(group)
    assert group.leaf_index(5) == 0
    group.reinit(3)
    _assert_all_ready(group)
    for uid in (3, 4, 5):
        group.leave(uid)
    assert group.epoch == 0 and not group.members
    again = group.join(6)
    assert not again.ready
    group.join(7)
    _assert_all_ready(group)
    assert group.epoch == 1


def test_attach_prebuilt_session() -> None:
    group = DaveGroup(CHANNEL_ID)
    alice = group.join(1)
    bot = davey.DaveSession(PROTOCOL_VERSION, 77, CHANNEL_ID)
    group.attach(bot)
    assert group.members[77] is bot
    _assert_all_ready(group)
    assert alice.decrypt(77, AUDIO, bot.encrypt_opus(OPUS)) == OPUS


def _fresh_key_package(user_id: int) -> bytes:
    return davey.DaveSession(PROTOCOL_VERSION, user_id, CHANNEL_ID).get_serialized_key_package()


def test_tampered_proposal_signature_rejected() -> None:
    group = DaveGroup(CHANNEL_ID)
    alice, _ = group.join(1), group.join(2)
    good = group.external_sender.add_proposals(CHANNEL_ID, group.epoch, [_fresh_key_package(5)])
    tampered = good[:-1] + bytes([good[-1] ^ 0x01])  # last byte lies inside the DER signature
    with pytest.raises(ValueError, match="InvalidSignature"):
        alice.process_proposals(davey.ProposalsOperationType.append, tampered)
    impostor = ExternalSender().add_proposals(CHANNEL_ID, group.epoch, [_fresh_key_package(5)])
    with pytest.raises(ValueError, match="InvalidSignature"):
        alice.process_proposals(davey.ProposalsOperationType.append, impostor)
    # Positive control: the genuine payload is accepted and yields a commit.
    result = alice.process_proposals(davey.ProposalsOperationType.append, good)
    assert isinstance(result, davey.CommitWelcome) and result.welcome is not None
