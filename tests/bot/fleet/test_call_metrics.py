"""A real `switchboard run` process in a voice call, scraped as Prometheus would: the live call, its
committed turn and the audio the room shed show in `/metrics`, and stay counted after the call ends."""

from __future__ import annotations

from tests.support.discord_room import join_and_settle, real_time, room, say
from tests.support.fake_realtime import AudioReply
from tests.support.health import loopback_address, metric_values, probe

pytestmark = real_time("call")


def script(_ctx):
    return AudioReply("Done.", audio_ms=400)


async def test_a_live_call_is_counted_in_metrics_and_its_turns_stay_counted_after_it_ends(tmp_path):
    address, base = loopback_address()
    async with room(tmp_path, script, SWITCHBOARD_HTTP_ADDR=address) as r:
        await join_and_settle(r, r.olive)  # answered after GUILD_CREATE: connected, so ready
        assert await probe(base, "/readyz") == (200, "ready\n")
        await say(r, r.olive)  # one burst: more than the 500 ms a member's backlog keeps
        during = metric_values(await probe(base, "/metrics"))
        assert (during["switchboard_voice_calls"], during["switchboard_shards_held"], during["switchboard_ready"]) \
            == (1, 1, 1)
        assert during["switchboard_turns_committed_total"] >= 1
        assert during["switchboard_room_frames_shed_total"] > 0
        assert during["switchboard_lease_renewals_failed_total"] == 0

        left = await r.command("talk leave", r.olive)
        assert "Left" in left["embeds"][0]["description"], left
        after = metric_values(await probe(base, "/metrics"))
        assert after["switchboard_voice_calls"] == 0
        for name in ("switchboard_turns_committed_total", "switchboard_room_frames_shed_total"):
            assert after[name] >= during[name]  # the ended call's counts are kept: counters never go down
    assert f"health and metrics on http://{address}" in r.log_text()
