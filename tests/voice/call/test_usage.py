"""What a call used: the fold of provider usage reports, adversarially, and its path through the
GA translation into the core's per-call total."""

from __future__ import annotations

import dataclasses
import math

import pytest

from tests.support.call_core import make_core
from voice.call import events as ev
from voice.call.actions import RecordUsage
from voice.call.providers.openai_ga import parse_ga_event
from voice.call.usage import NO_USAGE, CallUsage

GA_RESPONSE = {"total_tokens": 160, "input_tokens": 120, "output_tokens": 40,
               "input_token_details": {"text_tokens": 70, "audio_tokens": 50, "image_tokens": 0, "cached_tokens": 64,
                                       "cached_tokens_details": {"text_tokens": 60, "audio_tokens": 4}},
               "output_token_details": {"text_tokens": 8, "audio_tokens": 32}}
TOKENS = {"type": "tokens", "input_tokens": 12, "output_tokens": 3, "total_tokens": 15,
          "input_token_details": {"audio_tokens": 12, "text_tokens": 0}}


def test_a_ga_response_usage_is_counted_by_modality_with_cached_as_part_of_input():
    usage = NO_USAGE.add_response(GA_RESPONSE)
    assert usage == CallUsage(responses=1, input_tokens=120, input_text=70, input_audio=50, cached_tokens=64,
                              cached_text=60, cached_audio=4, output_tokens=40, output_text=8, output_audio=32)
    assert usage.total_tokens == 160 and usage.reported


def test_two_responses_and_two_transcriptions_sum_and_the_fold_never_changes_its_input():
    once = NO_USAGE.add_response(GA_RESPONSE)
    total = once.add_response(GA_RESPONSE).add_transcription(TOKENS).add_transcription(
        {"type": "duration", "seconds": 1.5})
    assert once.responses == 1 and NO_USAGE == CallUsage()  # frozen values, folded into new ones
    assert (total.responses, total.input_tokens, total.cached_tokens, total.output_audio) == (2, 240, 128, 64)
    assert (total.transcriptions, total.transcription_input, total.transcription_output) == (2, 12, 3)
    assert total.transcription_seconds == 1.5 and total.total_tokens == 2 * 160 + 15
    assert total == once + once + NO_USAGE.add_transcription(TOKENS).add_transcription({"type": "duration",
                                                                                       "seconds": 1.5})
    with pytest.raises(dataclasses.FrozenInstanceError):
        total.responses = 0  # type: ignore[misc]


@pytest.mark.parametrize("usage", [None, "lots", 42, ["input_tokens", 5], b"{}"])
def test_a_usage_that_is_not_an_object_changes_nothing(usage):
    assert NO_USAGE.add_response(usage) == NO_USAGE
    assert NO_USAGE.add_transcription(usage) == NO_USAGE


def test_missing_fields_count_as_zero_and_a_total_is_recovered_from_its_details():
    assert NO_USAGE.add_response({}) == CallUsage(responses=1)
    no_totals = NO_USAGE.add_response({"input_token_details": {"audio_tokens": 7, "text_tokens": 3},
                                       "output_token_details": {"audio_tokens": 5}})
    assert (no_totals.input_tokens, no_totals.output_tokens, no_totals.output_audio) == (10, 5, 5)
    only_totals = NO_USAGE.add_response({"input_tokens": 9, "output_tokens": 4})
    assert (only_totals.input_tokens, only_totals.input_audio, only_totals.output_tokens) == (9, 0, 4)
    cached_total_only = NO_USAGE.add_response({"input_tokens": 9, "input_token_details": {"cached_tokens": 6}})
    assert (cached_total_only.cached_tokens, cached_total_only.cached_text) == (6, 0)
    assert NO_USAGE.add_transcription({}) == CallUsage(transcriptions=1)
    assert NO_USAGE.add_transcription({"type": "duration"}) == CallUsage(transcriptions=1)


@pytest.mark.parametrize("bad", [-5, True, 3.0, "12", None, [1], {"n": 1}, math.nan])
def test_negative_boolean_float_and_string_counts_are_ignored(bad):
    hostile = {"input_tokens": bad, "output_tokens": bad, "total_tokens": bad,
               "input_token_details": {"text_tokens": bad, "audio_tokens": 4, "cached_tokens": bad,
                                       "cached_tokens_details": {"text_tokens": bad, "audio_tokens": bad}},
               "output_token_details": {"text_tokens": bad, "audio_tokens": 6}}
    usage = NO_USAGE.add_response(hostile)
    assert usage == CallUsage(responses=1, input_tokens=4, input_audio=4, output_tokens=6, output_audio=6)
    assert NO_USAGE.add_transcription({"type": "tokens", "input_tokens": bad, "output_tokens": bad}) \
        == CallUsage(transcriptions=1)


@pytest.mark.parametrize("seconds", [-1, math.inf, math.nan, "2.5", True, None])
def test_a_bad_transcription_duration_counts_the_transcription_but_no_seconds(seconds):
    assert NO_USAGE.add_transcription({"type": "duration", "seconds": seconds}) == CallUsage(transcriptions=1)


def test_details_in_the_wrong_shape_are_ignored_and_a_total_below_its_parts_is_raised_to_them():
    wrong = NO_USAGE.add_response({"input_tokens": 5, "input_token_details": "audio",
                                   "output_token_details": [1, 2], "output_tokens": 2})
    assert (wrong.input_tokens, wrong.output_tokens, wrong.input_audio) == (5, 2, 0)
    under = NO_USAGE.add_response({"input_tokens": 1, "input_token_details": {
        "text_tokens": 10, "audio_tokens": 20, "cached_tokens": 500}})
    assert under.input_tokens == 30 and under.cached_tokens == 30  # cached never exceeds input
    tiny = NO_USAGE.add_transcription({"input_tokens": 1, "input_token_details": {"audio_tokens": 8}})
    assert tiny.transcription_input == 8


def test_describe_says_nothing_was_reported_until_something_was():
    assert NO_USAGE.describe() == "none reported yet"
    line = NO_USAGE.add_response(GA_RESPONSE).add_transcription(TOKENS).describe()
    assert line == ("120 tokens in (audio 50, text 70; cached 64), 40 out (audio 32, text 8) over 1 response; "
                    "transcription 12 in, 3 out")
    assert "1.5 s" in NO_USAGE.add_transcription({"type": "duration", "seconds": 1.5}).describe()
    assert NO_USAGE.add_response(GA_RESPONSE).to_json()["total_tokens"] == 160


def test_the_ga_translation_reports_usage_beside_the_response_and_the_transcription():
    done = {"type": "response.done", "response": {"id": "r1", "status": "completed", "usage": GA_RESPONSE}}
    usage, finished = parse_ga_event(done)
    assert usage == ev.UsageReported(NO_USAGE.add_response(GA_RESPONSE)) and finished.status == "completed"
    heard = parse_ga_event({"type": "conversation.item.input_audio_transcription.completed", "item_id": "i",
                            "transcript": "hi", "usage": TOKENS})
    assert heard == [ev.UsageReported(NO_USAGE.add_transcription(TOKENS)), ev.UserTranscript("i", "hi")]
    for missing in (None, "lots"):  # nothing reported, nothing counted
        only = parse_ga_event({"type": "response.done", "response": {"id": "r", "usage": missing}})
        assert [type(e) for e in only] == [ev.ResponseDone]


def test_the_core_sums_usage_over_the_call_and_across_a_reconnect_and_hands_on_each_new_total():
    core, _ = make_core()
    answer = NO_USAGE.add_response(GA_RESPONSE)
    assert core.on_provider(ev.UsageReported(answer)) == [RecordUsage(answer)]  # kept at once, not at the next turn
    core.on_disconnect(1.0)
    core.on_reconnected(2.0)
    both = answer.add_transcription(TOKENS)
    assert core.on_provider(ev.UsageReported(NO_USAGE.add_transcription(TOKENS)), 3.0) == [RecordUsage(both)]
    assert core.usage == both
    core.end(4.0)
    core.on_provider(ev.UsageReported(NO_USAGE.add_response(GA_RESPONSE)), 5.0)  # after the end: not counted
    assert core.usage.responses == 1
