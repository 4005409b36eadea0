"""The certificate check every HTTPS client of ours uses, built once per process.

httpx builds a new `ssl.SSLContext` for every client it is not given one, and building one reads the
whole CA bundle (~40 ms of CPU here): a lane's two connection pools, each text-model client and each
transcript download paid it again. The context is the one httpx would build with `trust_env=False`
(certifi's bundle; `SSL_CERT_FILE` and friends are ignored, as everywhere else we turn `trust_env`
off), verifies certificates and host names, and is never changed after it is built, so one serves
every client of the process.
"""

from __future__ import annotations

import functools
import ssl

import httpx


@functools.cache
def verified_tls() -> ssl.SSLContext:
    """The shared client context: CERT_REQUIRED, host names checked, certifi's CA bundle."""
    return httpx.create_ssl_context(verify=True, trust_env=False)
