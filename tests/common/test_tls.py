"""One verified TLS context per process (`common/tls.py`): every HTTPS client of ours checks certificates
and host names against certifi's bundle, and none reads the bundle again."""

from __future__ import annotations

import ssl

import certifi

from common.text_model import TextModel
from common.tls import verified_tls
from listener.download import TranscriptDownloader
from runs.config import RunsConfig
from runs.lanes.hermes_api import HermesApiLane


def test_the_shared_context_verifies_certificates_and_host_names_against_certifi():
    tls = verified_tls()
    assert tls is verified_tls()
    assert tls.verify_mode is ssl.CERT_REQUIRED and tls.check_hostname
    assert tls.get_ca_certs() == ssl.create_default_context(cafile=certifi.where()).get_ca_certs()


async def test_no_client_of_ours_reads_the_ca_bundle_again(monkeypatch):
    verified_tls()  # built once, before the clients

    def reread(self, *args, **kwargs):
        raise AssertionError("a client built its own TLS context (read the CA bundle again)")

    monkeypatch.setattr(ssl.SSLContext, "load_verify_locations", reread)
    monkeypatch.setattr(ssl.SSLContext, "set_default_verify_paths", reread)
    lane = HermesApiLane(RunsConfig(lanes=("hermes-api",), hermes_url="http://127.0.0.1:8642", hermes_key="k"))
    model = TextModel("https://api.openai.com/v1", "k", "gpt-test")
    TranscriptDownloader()
    await lane.aclose()
    await model.aclose()
