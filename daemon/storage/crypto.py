"""Encryption at rest: the data key, its subkeys, sealing and keyed addresses.

Terms:
- The *key-encryption key* (KEK) is what the operator holds: 32 bytes in the file
  ``--encryption-key`` names (raw, or as 64 hex digits / base64 text). It never
  touches the data; it only wraps the data key.
- The *data key* is 32 random bytes made once per data root (or fleet), stored only
  wrapped by the KEK (``wrap``/``unwrap``). Rotating the KEK re-wraps it; nothing
  else is rewritten.
- From the data key, HKDF-SHA256 derives independent subkeys: ``blob`` (seals blobs,
  chunks, pack rows and bucket objects), ``meta`` (seals the conversation, state,
  tool arguments and results in the metadata store) and ``address`` (the HMAC key
  of content addresses).
- A *sealed* value is ``VERSION || nonce(12) || AES-256-GCM(ciphertext || tag(16))``;
  the caller's *context* is bound as associated data (e.g. the blob's address), so a
  sealed value moved to another name does not open.
- A *keyed address* is HMAC-SHA256(address key, content), hex: whoever holds the
  bucket cannot confirm a guessed file by hashing it; dedupe holds within one key.

Nonces are random (96 bits): AES-GCM keeps its bounds for far more than 2**32 seals
per key, which no data root approaches.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import os
from collections.abc import Iterable, Iterator

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from worldline.wire.errors import DataLoss, InvalidArgument

log = logging.getLogger("worldline.crypto")

VERSION = b"\x01"
NONCE = 12
TAG = 16
OVERHEAD = len(VERSION) + NONCE + TAG
KEY_BYTES = 32
_WRAP_CONTEXT = b"worldline data key"
KEYRING = "keyring"  # the wrapped data key: a file in a data root, an object in a bucket
# The associated data of a streamed blob: its address is known only once it is read,
# after its first bytes are sealed; the reader checks the address of what it opened.
STREAM_CONTEXT = b"worldline stream"


def read_kek(path: str) -> bytes:
    """The key-encryption key in the file at ``path``: 32 raw bytes, or 64 hex digits,
    or base64 of 32 bytes (surrounding whitespace ignored)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(4096)
            mode = os.fstat(f.fileno()).st_mode
    except OSError as exc:
        raise InvalidArgument(f"cannot read the encryption key {path}: {exc.strerror}") from None
    if mode & 0o077:  # whoever else reads it opens every backup of the data
        log.warning("the encryption key %s is open to users other than its owner (mode"
                    " %04o): chmod 600 it", path, mode & 0o7777)
    if len(raw) == KEY_BYTES:
        return raw
    text = raw.strip()
    for decode in (binascii.unhexlify, lambda t: base64.b64decode(t, validate=True)):
        try:
            key = decode(text)
        except (binascii.Error, ValueError):
            continue
        if len(key) == KEY_BYTES:
            return key
    raise InvalidArgument(f"the encryption key {path} is not 32 bytes (raw, hex or base64)")


def new_key() -> bytes:
    return os.urandom(KEY_BYTES)


def key_id(kek: bytes) -> str:
    """A short public name for a KEK (to say which key a data root wants), which
    reveals nothing of it."""
    return hmac.new(kek, b"worldline key id", hashlib.sha256).hexdigest()[:16]


def _aead(key: bytes | AESGCM) -> AESGCM:
    """The cipher of ``key``; one made already is used as it is (making one costs more
    than sealing a short value: the metadata's subkey keeps its own)."""
    return key if isinstance(key, AESGCM) else AESGCM(key)


def _seal(key: bytes | AESGCM, plaintext: bytes, context: bytes) -> bytes:
    nonce = os.urandom(NONCE)
    return VERSION + nonce + _aead(key).encrypt(nonce, plaintext, context)


def _open(key: bytes | AESGCM, sealed: bytes, context: bytes) -> bytes:
    if len(sealed) < OVERHEAD or sealed[:1] != VERSION:
        raise DataLoss("a sealed value is malformed (not written with this format)")
    try:
        return _aead(key).decrypt(sealed[1:1 + NONCE], sealed[1 + NONCE:], context)
    except InvalidTag:
        raise DataLoss("a sealed value fails its authentication tag"
                       " (damaged, moved, or sealed with another key)") from None


def wrap(kek: bytes, data_key: bytes) -> bytes:
    return _seal(kek, data_key, _WRAP_CONTEXT)


def unwrap(kek: bytes, wrapped: bytes) -> bytes:
    """The data key ``wrapped`` holds; ``InvalidArgument`` when ``kek`` is not the key
    that wrapped it (a wrong key is the operator's input, not damage)."""
    try:
        return _open(kek, wrapped, _WRAP_CONTEXT)
    except DataLoss:
        raise InvalidArgument("the encryption key does not open this data root's data key"
                              " (a wrong key)") from None


def _subkey(data_key: bytes, purpose: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None,
                info=b"worldline " + purpose).derive(data_key)


class DataKey:
    """The subkeys of one data key, and what is done with them."""

    __slots__ = ("_address", "_blob", "_blob_aead", "_meta", "_meta_aead", "_prepared")

    def __init__(self, data_key: bytes) -> None:
        if len(data_key) != KEY_BYTES:
            raise InvalidArgument("a data key is 32 bytes")
        self._blob = _subkey(data_key, b"blob")
        self._meta = _subkey(data_key, b"meta")
        self._address = _subkey(data_key, b"address")
        # Made once: a checkpoint seals and addresses a dozen small blobs, and the key
        # schedule of an AESGCM or an HMAC costs more than sealing a few KB.
        self._blob_aead = AESGCM(self._blob)
        self._meta_aead = AESGCM(self._meta)
        self._prepared = hmac.new(self._address, digestmod=hashlib.sha256)

    def address(self, data: bytes) -> str:
        h = self._prepared.copy()
        h.update(data)
        return h.hexdigest()

    def hasher(self):
        """An incremental keyed hasher (``update``, ``hexdigest``) for streamed content."""
        return self._prepared.copy()

    def seal_blob(self, plaintext: bytes, context: bytes) -> bytes:
        return _seal(self._blob_aead, plaintext, context)

    def open_blob(self, sealed: bytes, context: bytes) -> bytes:
        return _open(self._blob_aead, sealed, context)

    def seal_meta(self, plaintext: bytes, context: bytes) -> bytes:
        return _seal(self._meta_aead, plaintext, context)

    def open_meta(self, sealed: bytes, context: bytes) -> bytes:
        return _open(self._meta_aead, sealed, context)

    # -- streams: blobs too big to hold whole (files over the pack's MAX_BLOB) ----------
    def seal_stream(self, chunks: Iterable[bytes], context: bytes = STREAM_CONTEXT
                    ) -> Iterator[bytes]:
        """The sealed form of the concatenated ``chunks``, in pieces: the same layout
        as ``seal_blob``'s (``VERSION || nonce || ciphertext || tag``), so
        ``open_stream`` or, for a small one, ``open_blob`` reads it."""
        nonce = os.urandom(NONCE)
        enc = Cipher(algorithms.AES(self._blob), modes.GCM(nonce)).encryptor()
        enc.authenticate_additional_data(context)
        yield VERSION + nonce
        for chunk in chunks:
            yield enc.update(chunk)
        yield enc.finalize() + enc.tag

    def open_stream(self, chunks: Iterable[bytes], context: bytes = STREAM_CONTEXT
                    ) -> Iterator[bytes]:
        """The plaintext of a sealed stream, in pieces. The tag is checked only after
        the last piece: a caller must not use what it was given (it writes to a file
        of its own, renamed in only once this generator ends) before the generator is
        exhausted; a bad tag, or a stream cut short, raises DataLoss then."""
        header = b""
        tail = b""
        dec = None
        for chunk in chunks:
            if dec is None:
                header += chunk
                if len(header) < 1 + NONCE:
                    continue
                if header[:1] != VERSION:
                    raise DataLoss("a sealed stream is malformed (not written with this"
                                   " format)")
                dec = Cipher(algorithms.AES(self._blob),
                             modes.GCM(header[1:1 + NONCE])).decryptor()
                dec.authenticate_additional_data(context)
                chunk, header = header[1 + NONCE:], b""
            buf = tail + chunk
            if len(buf) <= TAG:
                tail = buf
                continue
            tail = buf[-TAG:]
            yield dec.update(buf[:-TAG])
        if dec is None or len(tail) < TAG:
            raise DataLoss("a sealed stream is cut short")
        try:
            yield dec.finalize_with_tag(tail)
        except InvalidTag:
            raise DataLoss("a sealed stream fails its authentication tag"
                           " (damaged, or sealed with another key)") from None
