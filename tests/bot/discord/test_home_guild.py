"""The home-server rule (`bot.discord.checks.home_guild_refusal`) over every case, fast: the end-to-end
tests run with SWITCHBOARD_GUILD_IDS set, so a direct message with it unset is covered only here."""

from __future__ import annotations

from bot.discord.checks import home_guild_refusal

HOME, OTHER = 123456789012345678, 223456789012345678
NAMED = " (SWITCHBOARD_GUILD_IDS)."


def test_a_direct_message_is_refused_whether_or_not_home_servers_are_named():
    unset = home_guild_refusal(None, frozenset())
    assert unset == "This is not available in a direct message: it belongs to the server Switchboard serves."
    assert home_guild_refusal(None, frozenset({HOME})) == unset[:-1] + NAMED


def test_every_server_is_home_when_none_is_named_and_only_the_named_ones_when_some_are():
    assert home_guild_refusal(OTHER, frozenset()) is None
    assert home_guild_refusal(HOME, frozenset({HOME})) is None
    assert home_guild_refusal(OTHER, frozenset({HOME})) == \
        "This is not available in this server: it belongs to the server Switchboard serves" + NAMED
