"""Probing `SWITCHBOARD_HTTP_ADDR` as a supervisor and a scraper would:

    status, text = await probe(address, "/readyz")
    values = metric_values(await probe(address, "/metrics"))   # {"switchboard_voice_calls": 1.0, ...}
"""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.support.runs import free_port


def loopback_address() -> tuple[str, str]:
    """A free loopback port: (`host:port` for the setting, the URL base)."""
    address = f"127.0.0.1:{free_port()}"
    return address, f"http://{address}"


async def probe(base: str, path: str) -> tuple[int, str]:
    async with httpx.AsyncClient(base_url=base, trust_env=False) as client:
        answer = await client.get(path)
    return answer.status_code, answer.text


def metric_values(answer: tuple[int, str]) -> dict[str, float]:
    """Every unlabelled sample of a 200 `/metrics` answer, parsed by prometheus-client's own parser;
    labelled ones as `name{label=value}`."""
    status, text = answer
    assert status == 200, answer
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            values[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return values
