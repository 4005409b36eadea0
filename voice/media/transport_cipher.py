"""Transport decryption for Discord's `_rtpsize` AEAD modes, one cipher object per key.

Layout: `[cleartext header (AAD)][ciphertext + 16-byte tag][4-byte big-endian nonce counter]`.
The nonce is the 4-byte counter followed by zeros (24 bytes for XChaCha20, 12 for AES-GCM).
"""

from __future__ import annotations

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from nacl._sodium import ffi, lib

XCHACHA = "aead_xchacha20_poly1305_rtpsize"
AES_GCM = "aead_aes256_gcm_rtpsize"
SUPPORTED_MODES = (XCHACHA, AES_GCM)

_MAX_DATAGRAM = 4096
_ZEROS_20 = bytes(20)
_ZEROS_8 = bytes(8)


class UnsupportedMode(ValueError):
    """The voice server negotiated a transport mode this receiver cannot decrypt."""


class TransportCipher:
    """Decrypts datagrams for one (mode, key). Reuses its output buffer: not thread-safe."""

    __slots__ = ("mode", "_decrypt")

    def __init__(self, mode: str, key: bytes) -> None:
        if len(key) != 32:
            raise ValueError("transport key must be 32 bytes")
        self.mode = mode
        if mode == XCHACHA:
            self._decrypt = _xchacha_decryptor(bytes(key))
        elif mode == AES_GCM:
            self._decrypt = _aes_gcm_decryptor(bytes(key))
        else:
            raise UnsupportedMode(f"unsupported transport mode {mode!r}")

    def decrypt(self, aad: bytes, ciphertext: bytes, nonce_suffix: bytes) -> bytes | None:
        """Plaintext, or None when authentication fails."""
        return self._decrypt(aad, ciphertext, nonce_suffix)


def _xchacha_decryptor(key: bytes):
    # libsodium directly (PyNaCl's bundled build): no per-call argument checks or allocations.
    out = ffi.new("unsigned char[]", _MAX_DATAGRAM)
    out_len = ffi.new("unsigned long long *")
    null = ffi.NULL
    decrypt = lib.crypto_aead_xchacha20poly1305_ietf_decrypt
    buffer = ffi.buffer

    def run(aad: bytes, ciphertext: bytes, nonce_suffix: bytes) -> bytes | None:
        n = len(ciphertext)
        if n < 16 or n > _MAX_DATAGRAM:
            return None
        rc = decrypt(out, out_len, null, ciphertext, n, aad, len(aad), nonce_suffix + _ZEROS_20, key)
        if rc != 0:
            return None
        return buffer(out, out_len[0])[:]

    return run


def _aes_gcm_decryptor(key: bytes):
    aead = AESGCM(key)
    decrypt = aead.decrypt

    def run(aad: bytes, ciphertext: bytes, nonce_suffix: bytes) -> bytes | None:
        if len(ciphertext) < 16:
            return None
        try:
            return decrypt(nonce_suffix + _ZEROS_8, ciphertext, aad)
        except InvalidTag:
            return None

    return run
