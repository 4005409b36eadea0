"""docs/discord.md's gate section names each tool that changes things once, and exactly the ones the
catalogue marks mutating (it listed them twice, the two lists differing)."""

from __future__ import annotations

import re

from bot.tools.phone import transcript_tools
from bot.tools.runs import run_tools
from tests.support.paths import ROOT


def test_the_gate_lists_the_mutating_tools_once_and_all_of_them():
    docs = (ROOT / "docs" / "discord.md").read_text()
    gate = docs.split("## The gate", 1)[1].split("\n## ", 1)[0]
    tools = [*run_tools(None), *transcript_tools(None, None)]  # the catalogue's tools (no service is touched to list them)
    mutating = {tool.name for tool in tools if tool.mutating}
    named = re.findall(r"`([a-z_]+)`", gate)
    assert {name: named.count(name) for name in mutating} == {name: 1 for name in mutating}
    listed = re.search(r"A tool that changes things \(([^)]*)\)", gate)
    assert listed is not None and set(re.findall(r"`([a-z_]+)`", listed.group(1))) == mutating
