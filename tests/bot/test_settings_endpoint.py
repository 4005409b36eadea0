"""A key goes only over TLS, or in clear text to loopback; URLs with credentials are refused, and no
message repeats a URL's userinfo or query. Checked in the settings and again by the provider."""

from __future__ import annotations

import pytest

from bot.settings import check_settings
from common.urls import UnsafeEndpoint, check_key_endpoint, display_url, is_loopback
from voice.call.providers import make_provider
from voice.call.providers.endpoint import check_realtime_url

KEY = "sk-in-the-url-must-not-echo-31337"


@pytest.mark.parametrize("url", [
    "wss://api.openai.com/v1/realtime", "wss://10.0.0.5/v1/realtime", "ws://127.0.0.1:8765/v1/realtime",
    "ws://127.9.8.7/v1/realtime", "ws://localhost:1234/v1/realtime", "ws://LOCALHOST./x", "ws://[::1]:99/x",
    "ws://[::ffff:127.0.0.1]/x", "WSS://api.x.ai/v1/realtime?api-version=1",
])
def test_tls_anywhere_and_plain_websockets_to_loopback_are_accepted(url):
    assert check_realtime_url(url) == url
    assert check_settings({"SWITCHBOARD_REALTIME_URL": url}).problems == ()


@pytest.mark.parametrize("url", [
    "ws://10.0.0.5/v1/realtime", "ws://192.168.1.20:8080/v1/realtime", "ws://api.openai.com/v1/realtime",
    "ws://0.0.0.0:8765/v1/realtime", "ws://127.0.0.1.example.com/v1/realtime", "ws://foo.localhost/x",
    "ws://[::2]/x",
])
def test_plain_websockets_to_any_other_host_are_refused(url):
    with pytest.raises(UnsafeEndpoint, match=r"clear text.*use wss://.*loopback address \(127\.0\.0\.0/8, ::1, localhost\)"):
        check_realtime_url(url)
    (problem,) = check_settings({"SWITCHBOARD_REALTIME_URL": url}).problems
    assert problem.startswith("SWITCHBOARD_REALTIME_URL=") and "clear text" in problem


def test_the_provider_refuses_a_clear_text_url_even_when_settings_were_bypassed():
    with pytest.raises(UnsafeEndpoint, match="clear text"):
        make_provider("openai", api_key=KEY, model="gpt-realtime-2.1-mini", voice="marin",
                      url="ws://203.0.113.9/v1/realtime")
    provider = make_provider("openai", api_key=KEY, model="gpt-realtime-2.1-mini", voice="marin",
                             url="ws://127.0.0.1:9/v1/realtime")
    assert provider.url().startswith("ws://127.0.0.1:9/")


@pytest.mark.parametrize("url", [f"ws://u:{KEY}@127.0.0.1:8765/v1/realtime", f"wss://{KEY}@api.openai.com/v1",
                                 f"wss://:{KEY}@api.openai.com/v1?key={KEY}"])
def test_credentials_in_the_url_are_refused_and_never_repeated(url):
    with pytest.raises(UnsafeEndpoint, match="credentials in the URL are refused") as err:
        check_realtime_url(url)
    report = check_settings({"SWITCHBOARD_REALTIME_URL": url})
    with pytest.raises(UnsafeEndpoint) as provider_err:
        make_provider("openai", api_key="k", model="gpt-realtime-2.1-mini", voice="marin", url=url)
    for text in (str(err.value), *report.problems, str(provider_err.value)):
        assert KEY not in text and "u:" not in text


def test_display_url_drops_userinfo_and_query_and_hides_long_non_urls():
    assert display_url(f"ws://me:{KEY}@127.0.0.1:8765/v1/realtime?token={KEY}") == "ws://127.0.0.1:8765/v1/realtime?…"
    assert display_url("not a url") == "not a url"
    assert KEY not in display_url(KEY) and "characters, not shown" in display_url(KEY)


@pytest.mark.parametrize(("url", "reason"), [
    ("not a url", "not a wss:// URL"), ("wss://", "not a wss:// URL"), ("wss://:443/x", "has no host"),
    ("wss://host:99999/x", "invalid port"), ("wss://host:0/x", "invalid port"), ("https://host/x", "not a wss:// URL"),
])
def test_malformed_urls_say_what_to_use(url, reason):
    with pytest.raises(UnsafeEndpoint, match=reason):
        check_realtime_url(url)


def test_the_hermes_api_follows_the_same_rule_over_http():
    assert check_key_endpoint("http://127.0.0.1:8642", tls="https") == "http://127.0.0.1:8642"
    assert check_key_endpoint("https://hermes.example", tls="https") == "https://hermes.example"
    with pytest.raises(UnsafeEndpoint, match="http:// would send the key in clear text"):
        check_key_endpoint("http://hermes.example", tls="https")


def test_loopback_is_exactly_127_8_and_ipv6_loopback_and_localhost():
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.255.255.254", "::1", "[::1]", "localhost", "LocalHost"))
    assert not any(is_loopback(h) for h in ("128.0.0.1", "0.0.0.0", "::", "10.0.0.1", "localhost.example", "local"))


@pytest.mark.parametrize("query", [f"api_key={KEY}", f"key={KEY}", f"x=1&Api-Key={KEY}", f"token={KEY}",
                                   f"access_token={KEY}", "secret="])
def test_a_credential_in_the_query_is_refused_by_name_and_never_repeated(query):
    url = f"wss://proxy.example.com/v1/realtime?{query}"
    with pytest.raises(UnsafeEndpoint, match=r"a credential in the URL's query \(.+=…\) is refused") as err:
        check_realtime_url(url)
    report = check_settings({"SWITCHBOARD_REALTIME_URL": url})
    assert report.problems and all(KEY not in p for p in report.problems) and KEY not in str(err.value)


def test_ordinary_query_parameters_are_fine():
    url = "wss://api.openai.com/v1/realtime?model=gpt-realtime-2.1-mini&intent=transcription"
    assert check_realtime_url(url) == url
