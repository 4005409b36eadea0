"""A call's recap, posted when it ends: how long it took, who spoke and for how long, the runs it started,
what it cost, and what was discussed and decided — pure: a `CallRecap` in, one `discord.Embed` out.

Display names, run tasks and the summary come from what people said: each is shown as text, once, here
(`bot.discord.untrusted.shown`: escaped, and without control or format characters — no ESC, no bidi
override can reorder or hide a name). Every part has its own character budget, and the budgets add up
to less than Discord's 6000 per message, so no input — a hundred speakers, a hundred runs, a summary
of any length — can make the post fail; whatever is left out is counted ("… and 12 more").
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import discord

from bot.discord.embeds import MESSAGE_LIMIT, fitted
from bot.discord.untrusted import shown
from runs import RunTicket
from runs.wording import STATE_WORDS, bounded
from voice.call.records import CallRecord
from voice.call.summary import MAX_DECISIONS, CallSummary
from voice.call.usage import CallUsage

RECAP_COLOUR = 0x5865F2
SPEAKERS_SHOWN = 10
RUNS_SHOWN = 10

# Character budgets: together (with the field names) under MESSAGE_LIMIT, each under Discord's own cap.
DESCRIPTION_BUDGET = 1600  # the call line and the summary (Discord: 4096)
FIELD_BUDGET = 1000  # who spoke, runs, decided (Discord: 1024 each)
REASON_BUDGET = 200
USAGE_BUDGET = 500
FOOTER_BUDGET = 500  # Discord: 2048


class SpeakerTime(NamedTuple):
    """Who spoke (immutable id; display name as shown, untrusted, None when unknown) and for how long."""

    user_id: int
    name: str | None
    spoken_ms: int


@dataclass(frozen=True)
class CallRecap:
    """Everything a recap shows. `summary` None: the model was unavailable or its answer unusable
    (`summary_note` may say why); `usage` None: nothing was measured, and the recap says nothing of cost."""

    call_id: int
    voice_channel_id: int
    started_at: float
    ended_at: float
    end_reason: str | None = None
    speakers: tuple[SpeakerTime, ...] = ()
    runs: tuple[RunTicket, ...] = ()
    usage: CallUsage | None = None
    summary: CallSummary | None = None
    summary_note: str | None = None

    @property
    def duration_s(self) -> float:
        return max(0.0, self.ended_at - self.started_at)


def recap_of(record: CallRecord, *, spoken_ms: Mapping[int, int | float], names: Mapping[int, str] | None = None,
             runs: Sequence[RunTicket] = (), usage: CallUsage | None = None, summary: CallSummary | None = None,
             summary_note: str | None = None, ended_at: float | None = None) -> CallRecap:
    """The recap of `record`. Speakers are everyone with speaking time, and everyone with a turn of their
    own in the record (0 ms when their time was not measured); each is named by `names` (members still
    here), else by their newest turn's name, else unnamed. `ended_at` defaults to the record's, then to
    its last turn, then to its start."""
    from_turns: dict[int, str] = {}
    for turn in record.turns:
        if turn.role == "user" and turn.speaker_id is not None:
            from_turns[turn.speaker_id] = turn.name
    names = names or {}
    speakers = {user_id: int(ms) if math.isfinite(ms) and ms > 0 else 0 for user_id, ms in spoken_ms.items()}
    for user_id in from_turns:
        speakers.setdefault(user_id, 0)
    end = ended_at if ended_at is not None else record.ended_at
    if end is None:
        end = max((t.at for t in record.turns), default=record.started_at)
    return CallRecap(
        call_id=record.id, voice_channel_id=record.voice_channel_id, started_at=record.started_at,
        ended_at=max(end, record.started_at), end_reason=record.end_reason,
        speakers=tuple(SpeakerTime(user_id, names.get(user_id) or from_turns.get(user_id) or None, ms)
                       for user_id, ms in speakers.items()),
        runs=tuple(runs), usage=usage, summary=summary, summary_note=summary_note)


def duration_words(seconds: float) -> str:
    """A short human duration: "under 1 s", "45 s", "3 min 20 s" (under ten minutes), "12 min", "1 h 5 min"."""
    s = int(round(max(0.0, seconds)))
    if s < 1:
        return "under 1 s"
    if s < 60:
        return f"{s} s"
    minutes, rest = divmod(s, 60)
    if minutes < 10:
        return f"{minutes} min" + (f" {rest} s" if rest else "")
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h" + (f" {minutes} min" if minutes else "")


def _speaker_lines(speakers: Sequence[SpeakerTime]) -> tuple[list[str], int]:
    ordered = sorted(speakers, key=lambda s: (-s.spoken_ms, s.user_id))
    lines = []
    for speaker in ordered[:SPEAKERS_SHOWN]:
        name = shown(speaker.name, 80) or f"user {speaker.user_id}"  # a name of invisible characters is none
        lines.append(f"**{name}** · {duration_words(speaker.spoken_ms / 1000)}" if speaker.spoken_ms
                     else f"**{name}**")
    return lines, len(ordered)


def _run_lines(runs: Sequence[RunTicket]) -> tuple[list[str], int]:
    return [f"`/runs show {t.id}` · {STATE_WORDS[t.state]} · {shown(t.task, 70)}" for t in runs[:RUNS_SHOWN]], \
        len(runs)


def _footer(recap: CallRecap) -> str:
    ids = [str(s.user_id) for s in sorted(recap.speakers, key=lambda s: (-s.spoken_ms, s.user_id))]
    tail = f"call {recap.call_id}"
    if not ids:
        return tail
    text = "speakers " + ids[0]
    for n, user_id in enumerate(ids[1:], start=1):
        left = len(ids) - n - 1
        if len(text) + 2 + len(user_id) + len(f" +{left} more") + 3 + len(tail) > FOOTER_BUDGET:
            text += f" +{len(ids) - n} more"
            break
        text += ", " + user_id
    return f"{text} · {tail}"


def recap_embed(recap: CallRecap) -> discord.Embed:
    """The recap as one embed, within every Discord limit whatever it holds."""
    took = duration_words(recap.duration_s)
    head = (f"In <#{recap.voice_channel_id}>, <t:{int(recap.started_at)}:f> to <t:{int(recap.ended_at)}:t> "
            f"({took}).")
    if recap.summary is not None:
        body = shown(recap.summary.summary, DESCRIPTION_BUDGET - len(head) - 2)
    else:
        why = f" ({recap.summary_note})" if recap.summary_note else ""
        body = "*" + shown(f"Summary unavailable{why}.", DESCRIPTION_BUDGET - len(head) - 4) + "*"
    embed = discord.Embed(title="Call recap", colour=RECAP_COLOUR,
                          description=f"{head}\n\n{body}" if body else head)
    embed.add_field(name="duration", value=took, inline=True)
    if recap.end_reason:
        embed.add_field(name="ended", value=shown(recap.end_reason, REASON_BUDGET), inline=True)
    lines, total = _speaker_lines(recap.speakers)
    embed.add_field(name="who spoke", value=fitted(lines, FIELD_BUDGET, total=total) if lines else "nobody",
                    inline=False)
    if recap.runs:
        lines, total = _run_lines(recap.runs)
        embed.add_field(name="runs started", value=fitted(lines, FIELD_BUDGET, total=total), inline=False)
    if recap.summary is not None and recap.summary.decisions:
        each = FIELD_BUDGET // MAX_DECISIONS - 4  # room for all of them, however escaping lengthens each
        decided = [f"• {shown(d, each)}" for d in recap.summary.decisions]
        embed.add_field(name="decided", value=fitted(decided, FIELD_BUDGET), inline=False)
    if recap.usage is not None:
        usage = recap.usage.describe() if recap.usage.reported else "none reported"
        embed.add_field(name="cost", value=bounded(usage, USAGE_BUDGET - 2), inline=False)
    embed.set_footer(text=_footer(recap))
    assert len(embed) <= MESSAGE_LIMIT, len(embed)
    return embed
