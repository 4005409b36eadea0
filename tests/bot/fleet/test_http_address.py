"""SWITCHBOARD_HTTP_ADDR: unset is off; host:port (IPv4, bracketed IPv6, a host name, any interface)
is accepted; anything else is the usual one settings line naming the variable and what to write.
`doctor` shows the URL or off."""

from __future__ import annotations

import pytest

from bot.setting_rules import show_address
from bot.settings import check_settings
from tests.support.cli import switchboard


def test_unset_means_off():
    report = check_settings({})
    assert report.problems == () and report.settings.http_addr is None


@pytest.mark.parametrize(("value", "address", "shown"), [
    ("127.0.0.1:9464", ("127.0.0.1", 9464), "127.0.0.1:9464"),
    (" 0.0.0.0:80 ", ("0.0.0.0", 80), "0.0.0.0:80"),  # every interface: allowed, and said by doctor
    ("[::1]:9464", ("::1", 9464), "[::1]:9464"),
    ("[::]:65535", ("::", 65535), "[::]:65535"),
    ("LocalHost:1", ("localhost", 1), "localhost:1"),
    ("metrics.internal.example:9464", ("metrics.internal.example", 9464), "metrics.internal.example:9464"),
])
def test_host_and_port_are_accepted(value, address, shown):
    report = check_settings({"SWITCHBOARD_HTTP_ADDR": value})
    assert report.problems == () and report.settings.http_addr == address
    assert show_address(report.settings.http_addr) == shown


@pytest.mark.parametrize(("value", "reason"), [
    ("9464", "is not host:port"),
    ("127.0.0.1", "is not host:port"),
    (":9464", "is not host:port"),
    ("127.0.0.1:", "is not host:port"),
    ("[::1]", "is not host:port"),
    ("[::1]9464", "is not host:port"),
    ("::1:9464", "IPv6 address without brackets"),
    ("127.0.0.1:0", "no port from 1 to 65535"),
    ("127.0.0.1:65536", "no port from 1 to 65535"),
    ("127.0.0.1:-1", "no port from 1 to 65535"),
    ("127.0.0.1:+80", "no port from 1 to 65535"),
    ("127.0.0.1:٩٤٦٤", "no port from 1 to 65535"),  # digits, but not ASCII ones
    ("127.0.0.1:http", "no port from 1 to 65535"),
    ("http://127.0.0.1:9464", "is a URL or a path, not host:port"),
    ("127.0.0.1:9464/metrics", "is a URL or a path, not host:port"),
    ("bad host:9464", "does not name a host"),
    ("-x:9464", "does not name a host"),
    ("[127.0.0.1]:9464", "does not name a host"),  # brackets are for IPv6 only
    ("[not-an-ip]:9464", "does not name a host"),
])
def test_a_malformed_address_is_one_line_naming_the_variable_and_an_example(value, reason):
    report = check_settings({"SWITCHBOARD_HTTP_ADDR": value})
    (problem,) = report.problems
    assert problem.startswith(f"SWITCHBOARD_HTTP_ADDR={value.strip()!r}: ") and reason in problem
    assert "127.0.0.1:9464" in problem and "unset = off" in problem
    assert "SWITCHBOARD_HTTP_ADDR" in report.failed and report.settings.http_addr is None


def test_doctor_shows_the_address_or_off_and_a_bad_value_as_not_checked():
    _, out, _ = switchboard(["--env-file", "/dev/null", "doctor"], {})
    assert "health endpoint        off: SWITCHBOARD_HTTP_ADDR is not set" in out
    _, out, _ = switchboard(["--env-file", "/dev/null", "doctor"], {"SWITCHBOARD_HTTP_ADDR": "127.0.0.1:9464"})
    (row,) = [line for line in out.splitlines() if "health endpoint" in line]
    assert row.startswith("ok ") and "http://127.0.0.1:9464: /healthz, /readyz and /metrics" in row
    assert "other machines" not in row
    _, out, _ = switchboard(["--env-file", "/dev/null", "doctor"], {"SWITCHBOARD_HTTP_ADDR": "[::]:9464"})
    (row,) = [line for line in out.splitlines() if "health endpoint" in line]
    assert "http://[::]:9464" in row and "reachable from other machines" in row
    code, out, _ = switchboard(["--env-file", "/dev/null", "doctor"], {"SWITCHBOARD_HTTP_ADDR": "9464"})
    (row,) = [line for line in out.splitlines() if "health endpoint" in line]
    assert code == 1 and row.startswith("BAD ") and "not checked: fix SWITCHBOARD_HTTP_ADDR first" in row
