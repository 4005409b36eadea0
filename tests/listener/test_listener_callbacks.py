"""Callbacks on a real SQLite file: every change validated when saved (nothing saved on a refusal),
revisions, the default review, deliver targets, and the short-lived mutation tokens."""

from __future__ import annotations

import pytest

from bot.services import LISTENER_MIGRATIONS
from common.store import open_store
from listener.archive import Archive
from listener.callbacks import (
    REVIEW_ID,
    CallbackError,
    Callbacks,
    MutationTokens,
    check_deliver,
    deliver_channel,
)
from listener.pipeline import TranscriptPipeline
from tests.support.calls import call

CHANNEL = "123456789012345678"
NOW = 1_750_000_000.0


@pytest.fixture
async def store(tmp_path, database_url):
    store = await open_store(tmp_path, LISTENER_MIGRATIONS, database_url=database_url)
    yield store
    await store.close()


@pytest.mark.parametrize("value,expected", [
    (None, ""), ("", ""), ("default", ""), ("local", "local"), ("LOCAL", "local"),
    (f"discord:{CHANNEL}", f"discord:{CHANNEL}"), (f" discord: {CHANNEL} ", f"discord:{CHANNEL}"),
])
def test_deliver_targets_that_are_accepted(value, expected):
    assert check_deliver(value) == expected


@pytest.mark.parametrize("value,says", [
    ("discord:123", "not a Discord channel"), ("discord:", "not a Discord channel"),
    ("discord:0123456789012345678", "not a Discord channel"), ("telegram", "not one Switchboard knows"),
    ("all", "not one Switchboard knows"), ("local:123", "not one Switchboard knows"),
])
def test_deliver_targets_that_are_refused_say_what_is_accepted(value, says):
    with pytest.raises(CallbackError, match=says):
        check_deliver(value)


def test_where_a_result_goes():
    assert deliver_channel("", 42) == 42 and deliver_channel("", None) is None
    assert deliver_channel("local", 42) is None and deliver_channel(f"discord:{CHANNEL}", 42) == int(CHANNEL)


async def test_register_update_enable_disable_remove_and_list(store):
    callbacks = Callbacks(store, clock=lambda: 5.0)
    made = await callbacks.register("Calendar", "Calendar", "Add events I agree to attend to my calendar.")
    assert (made.id, made.revision, made.enabled, made.deliver) == ("calendar", 1, True, "")
    changed = await callbacks.update("calendar", deliver=f"discord:{CHANNEL}")
    assert changed.revision == 2 and changed.deliver == f"discord:{CHANNEL}"
    assert (await callbacks.update("calendar", deliver="")).deliver == ""  # cleared back to the default
    assert (await callbacks.set_enabled("calendar", False)).enabled is False
    assert [c.id for c in await callbacks.list()] == ["calendar"]
    assert await callbacks.due(auto_review=True, received_at=10.0) == []  # disabled
    await callbacks.set_enabled("calendar", True)
    assert [c.id for c in await callbacks.due(auto_review=True, received_at=10.0)] == ["calendar"]
    assert await callbacks.due(auto_review=True, received_at=1.0) == []  # the call came before it existed
    await callbacks.remove("calendar")
    assert await callbacks.list() == []


@pytest.mark.parametrize("change,says", [
    (lambda c: c.register("calendar", "Again", "x"), "exists already"),
    (lambda c: c.register("Bad Id!", "Name", "x"), "not valid"),
    (lambda c: c.register("other", "", "x"), "needs a name"),
    (lambda c: c.register("other", "Name", "   "), "needs instructions"),
    (lambda c: c.register("other", "Name", "x" * 5000), "keep it under"),
    (lambda c: c.register("other", "Name", "x", deliver="telegram"), "not one Switchboard knows"),
    (lambda c: c.update("calendar", deliver="discord:12"), "not a Discord channel"),
    (lambda c: c.update("missing", name="x"), "there is no callback"),
    (lambda c: c.register(REVIEW_ID, "Review", "x"), "transcript_review_config"),
])
async def test_a_refused_change_saves_nothing(store, change, says):
    callbacks = Callbacks(store)
    await callbacks.register("calendar", "Calendar", "Add events.")
    before = await callbacks.list()
    with pytest.raises(CallbackError, match=says):
        await change(callbacks)
    assert await callbacks.list() == before


async def test_the_default_review_is_shown_set_and_cleared(store):
    callbacks = Callbacks(store)
    assert await callbacks.review() is None
    review = await callbacks.set_review("Summarise the call; list follow-ups.", deliver="local")
    assert review.is_review and review.deliver == "local" and review.enabled
    again = await callbacks.set_review("Summarise it in two lines.")
    assert again.revision == 2 and again.deliver == "local"  # deliver kept when not given
    await callbacks.register("crm", "CRM", "Log the caller.")
    assert [c.id for c in await callbacks.due(auto_review=True, received_at=1e12)] == [REVIEW_ID, "crm"]
    assert [c.id for c in await callbacks.due(auto_review=False, received_at=1e12)] == ["crm"]
    with pytest.raises(CallbackError, match="review"):
        await callbacks.update(REVIEW_ID, name="x")
    assert await callbacks.clear_review() is True and await callbacks.review() is None
    assert await callbacks.clear_review() is False


async def test_tokens_are_hashed_expire_and_are_revoked(store):
    now = [100.0]
    tokens = MutationTokens(store, clock=lambda: now[0], ttl_s=60)
    token = await tokens.issue('["call_1","index",0,0]')
    assert token.startswith("sbt_") and await tokens.valid(token)
    rows = await store.fetchall("SELECT token_hash FROM listener_tokens")
    assert len(rows) == 1 and token not in rows[0]["token_hash"]  # only the hash is stored
    for forged in (None, "", "sbt_", token[:-1], token + "A", "x" * 200, 42):
        assert not await tokens.valid(forged)
    now[0] = 161.0
    assert not await tokens.valid(token)  # expired
    now[0] = 100.0
    assert await tokens.valid(token)
    await tokens.revoke('["call_1","index",0,0]')
    assert not await tokens.valid(token)


def test_the_listener_key_is_read_afresh_from_the_env_file_and_the_environment_wins(tmp_path, caplog):
    from bot.phone.listener import rotating_key

    env = tmp_path / ".env"
    env.write_text("TRANSCRIPT_LISTENER_API_KEY=first-key\n")
    key = rotating_key(env, environ={})
    assert key() == "first-key"
    env.write_text("TRANSCRIPT_LISTENER_API_KEY=second-key\n")  # rotated while running
    assert key() == "second-key"
    env.write_text("TRANSCRIPT_LISTENER_API_KEY=has a space\n")
    assert key() is None and "has a space" not in caplog.text
    assert rotating_key(env, environ={"TRANSCRIPT_LISTENER_API_KEY": "from-env"})() == "from-env"
    env.unlink()
    assert key() is None  # the file is gone and the environment has none: nothing is sent, the client retries


@pytest.mark.parametrize("args", [
    {"action": "register", "id": 7, "name": "N", "instructions": "x"},
    {"action": "register", "id": "a", "name": ["N"], "instructions": "x"},
    {"action": "register", "id": "a", "name": "N", "instructions": "x", "deliver": 5},
    {"action": "set", "instructions": {"x": 1}},
    {"action": "remove", "id": None},
])
async def test_model_arguments_that_are_not_text_are_refused_not_crashed(store, args):
    from bot.tools.phone import review_config

    with pytest.raises(CallbackError):
        await review_config(Callbacks(store), args)
    assert await Callbacks(store).list() == []


# -- a callback registered after a call never fires for it, however often the call is delivered --------

async def test_what_is_due_for_an_archived_call_is_measured_against_its_archive_time_not_this_delivery(store):
    archived = await Archive(store).archive(call("call_7", ("TO", "Hello."), ("FROM", "Hi.")), "{}",
                                            received_at=NOW, user_label="FROM")
    now = [NOW - 60]
    callbacks = Callbacks(store, clock=lambda: now[0])
    await callbacks.register("before", "Before", "Existed when the call came in.")
    now[0] = NOW  # the same instant as the archive: which came first is unknown, so it is not due
    await callbacks.register("same-instant", "Same instant", "Registered as the call was archived.")
    now[0] = NOW + 60
    await callbacks.register("after", "After", "Registered once the call was archived.")
    now[0] = NOW + 3600  # the redelivery, an hour later
    due = await callbacks.due_for_call(archived.transcript_id, auto_review=True)
    assert [c.id for c in due] == ["before"]
    assert [c.id for c in await callbacks.due(auto_review=True, received_at=NOW)] == ["before"]
    assert await callbacks.due_for_call(archived.transcript_id + 1, auto_review=True) == []  # no such call


class StartedJobs:
    def __init__(self) -> None:
        self.started: list = []

    async def start_job(self, job) -> str:
        self.started.append(job)
        return f"run-{len(self.started)}"


async def test_a_redelivered_call_never_runs_a_callback_registered_after_it_arrived(store):
    """The pipeline end to end on a moving clock: the redelivery comes an hour later, after a callback
    was registered; only the callback that existed when the call first arrived ever runs for it."""
    now = [NOW - 60]
    await Callbacks(store, clock=lambda: now[0]).register("early", "Early", "Log the caller.")
    jobs = StartedJobs()
    pipeline = TranscriptPipeline(Archive(store), download=None, jobs=jobs, agent_name="Ares",
                                  clock=lambda: now[0])
    event = {"type": "transcript_url", "event_id": "evt_1", "conversation_id": "call_9",
             "metadata": {"direction": "inbound", "from": "+15550001", "to": "+15550002"},
             "turns": [{"speaker": "TO", "text": "Hello, this is the clinic."}, {"speaker": "FROM", "text": "Hi."}]}
    now[0] = NOW
    first = await pipeline.handle(event)
    assert first["success"] is True and [j.label for j in jobs.started] == ["Early"]
    now[0] = NOW + 60
    await Callbacks(store, clock=lambda: now[0]).register("late", "Late", "Too late for call_9.")
    now[0] = NOW + 3600
    replay = await pipeline.handle({**event, "event_id": "evt_1_again"})
    assert replay["stages"]["archive"] == "already archived"
    assert [j.label for j in jobs.started] == ["Early"] and replay["job_ids"] == first["job_ids"]


async def test_two_stores_changing_one_callback_at_once_keep_both_changes_and_both_succeed(tmp_path, database_url):
    import asyncio

    first, second = await open_store(tmp_path, LISTENER_MIGRATIONS, database_url=database_url), await open_store(tmp_path, LISTENER_MIGRATIONS, database_url=database_url)
    try:
        a, b = Callbacks(first), Callbacks(second)
        cb = await a.register("book-it", "Book it", "add the call to my calendar")
        await asyncio.gather(a.update(cb.id, name="Calendar"), b.set_enabled(cb.id, False))
        after = await a.get(cb.id)
        assert (after.name, after.enabled) == ("Calendar", False)  # neither wrote back the other's stale field
        await asyncio.gather(a.set_review("review the call"), b.set_review("review the call, briefly"))
        assert (await a.review()) is not None  # two first-time sets: no IntegrityError
    finally:
        await first.close()
        await second.close()
