"""RTP header facts for Discord voice datagrams (RFC 3550, Discord's `_rtpsize` layout)."""

from __future__ import annotations

from typing import NamedTuple

RTP_VERSION = 2
OPUS_PAYLOAD_TYPE = 0x78
HEADER_SIZE = 12
TAG_SIZE = 16
NONCE_SUFFIX_SIZE = 4
OPUS_SILENCE = b"\xf8\xff\xfe"
DAVE_MAGIC = b"\xfa\xfa"  # every DAVE-encrypted frame ends with this marker


class RtpHeader(NamedTuple):
    """The parts of an RTP header the receive path needs.

    `aad_len` is the length of the cleartext prefix that transport encryption authenticates:
    fixed header + CSRCs + (when X is set) the 4-byte extension preamble. The extension *body*
    (`ext_words` * 4 bytes) is inside the ciphertext.
    """

    payload_type: int
    marker: bool
    sequence: int
    timestamp: int
    ssrc: int
    padded: bool
    aad_len: int
    ext_words: int


def is_rtcp(datagram: bytes) -> bool:
    return len(datagram) >= 2 and 200 <= datagram[1] <= 204


def parse_header(datagram: bytes) -> RtpHeader | None:
    """Parse an RTP header; None when the datagram is not a well-formed RTP v2 packet."""
    n = len(datagram)
    if n < HEADER_SIZE:
        return None
    b0 = datagram[0]
    if b0 >> 6 != RTP_VERSION:
        return None
    b1 = datagram[1]
    aad_len = HEADER_SIZE + 4 * (b0 & 0x0F)
    ext_words = 0
    if b0 & 0x10:
        if n < aad_len + 4:
            return None
        ext_words = int.from_bytes(datagram[aad_len + 2 : aad_len + 4], "big")
        aad_len += 4
    if n < aad_len:
        return None
    return RtpHeader(
        b1 & 0x7F,
        bool(b1 & 0x80),
        int.from_bytes(datagram[2:4], "big"),
        int.from_bytes(datagram[4:8], "big"),
        int.from_bytes(datagram[8:12], "big"),
        bool(b0 & 0x20),
        aad_len,
        ext_words,
    )


def strip_padding(payload: bytes) -> bytes | None:
    """Remove RTP padding (last byte = count). None when the count is 0 or too large."""
    if not payload:
        return None
    count = payload[-1]
    if count == 0 or count > len(payload):
        return None
    return payload[: len(payload) - count]
