"""The keyring: where a data root's (or a fleet's) data key is kept, wrapped.

Encryption at rest (``worldline daemon --encryption-key FILE``, crypto.py) seals
everything with one *data key*, made at the first start and stored only wrapped by the
operator's key (the KEK). The keyring holds it with the KEK's public id, as one small
JSON document ``{"format": 1, "key_id": ..., "wrapped": base64}``, next to the blobs:

- local blobs: the file ``<root>/keyring`` (0600, replaced atomically);
- a bucket (``s3://bucket/prefix``): the object ``<prefix>/keyring``, which every host
  of the fleet reads at start (the first host writes it, write-once: two first starts
  at once agree on one data key). A PostgreSQL store with local blobs has no place
  every host finds: encryption there needs a bucket.

At start (``open_data_key``): a keyring and a key that opens it: the data key; a
keyring and no key, or another key: ``InvalidArgument``, nothing read. No keyring and
a key: a new data key, but only over a data root (or bucket) that holds nothing yet;
data written in the clear is refused (there is no migration: restore it into a new,
keyed data root). No keyring and no key: the clear, as before.

``rotate`` re-wraps the data key with a new KEK; nothing else is rewritten. A running
daemon holds the data key already, so rotating under it is safe; its next start
needs the new key.
"""

from __future__ import annotations

import base64
import json
import logging
import os

from worldline.wire.errors import InvalidArgument, NotFound, Unavailable

from . import crypto
from .crypto import KEYRING
from .durable import fsync_folder

log = logging.getLogger("worldline.keyring")

FORMAT = 1
CREDENTIAL = "worldline-key"  # systemd's LoadCredential= name for the KEK


def key_file(flag: str | None) -> str:
    """The KEK's file: ``--encryption-key``, else systemd's credential
    ``$CREDENTIALS_DIRECTORY/worldline-key`` when there is one, else "" (no key)."""
    if flag:
        return flag
    folder = os.environ.get("CREDENTIALS_DIRECTORY")
    if folder and os.path.isfile(os.path.join(folder, CREDENTIAL)):
        return os.path.join(folder, CREDENTIAL)
    return ""


def _encode(kek: bytes, data_key: bytes) -> bytes:
    return json.dumps({"format": FORMAT, "key_id": crypto.key_id(kek),
                       "wrapped": base64.b64encode(crypto.wrap(kek, data_key)).decode()},
                      sort_keys=True).encode() + b"\n"


def _decode(raw: bytes, kek: bytes, where: str) -> bytes:
    """The data key in keyring ``raw``; InvalidArgument for a key that does not open it."""
    try:
        doc = json.loads(raw)
        if doc.get("format") != FORMAT:
            raise ValueError(f"format {doc.get('format')!r}")
        wrapped = base64.b64decode(doc["wrapped"], validate=True)
        wanted = str(doc["key_id"])
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise InvalidArgument(f"the keyring {where} is not one this worldline reads"
                              f" ({exc})") from None
    if crypto.key_id(kek) != wanted:
        raise InvalidArgument(f"the encryption key is not this data's: {where} was made"
                              f" with the key of id {wanted}, the one given is of id"
                              f" {crypto.key_id(kek)}")
    return crypto.unwrap(kek, wrapped)


class _Local:
    """The keyring file of a data root with local blobs."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.path = os.path.join(root, KEYRING)

    def read(self) -> bytes | None:
        try:
            with open(self.path, "rb") as f:
                return f.read(1 << 16)
        except FileNotFoundError:
            return None

    def holds_data(self) -> bool:
        """Anything stored already: the metadata store, or a blob (file or pack)."""
        if os.path.exists(os.path.join(self.root, "meta.db")):
            return True
        blobs = os.path.join(self.root, "blobs")
        try:
            names = os.listdir(blobs)
        except FileNotFoundError:
            return False
        return any(n == "pack.db" or len(n) == 2 for n in names)

    def write(self, raw: bytes, create: bool) -> bytes:
        """Write the keyring atomically (a temporary, flushed, renamed); ``create``:
        only if there is none (else the one there, which the caller reads)."""
        tmp = f"{self.path}.{os.urandom(6).hex()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, raw)
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            if create:
                try:
                    os.link(tmp, self.path)  # fails if another start made one meanwhile
                except FileExistsError:
                    return self.read() or raw
            else:
                os.rename(tmp, self.path)
                tmp = ""
        finally:
            if tmp:
                os.unlink(tmp)
        self._drop_temporaries()
        fsync_folder(self.root)
        return raw

    def _drop_temporaries(self) -> None:
        """Remove keyrings a crash left aside (``keyring.<12 hex>``): each holds the data
        key wrapped by the KEK of its day, which a rotation must leave opening nothing."""
        prefix = KEYRING + "."
        for name in os.listdir(self.root):
            rest = name[len(prefix):]
            if name.startswith(prefix) and len(rest) == 12 and all(
                    c in "0123456789abcdef" for c in rest):
                try:
                    os.unlink(os.path.join(self.root, name))
                except FileNotFoundError:
                    pass

    def __str__(self) -> str:
        return self.path


class _Bucket:
    """The keyring object of a fleet's bucket."""

    def __init__(self, url: str, store: str) -> None:
        from . import s3_bucket
        self.store = store
        if s3_bucket.obstore is None:
            raise InvalidArgument("s3 blobs need obstore: pip install 'worldline[fleet]'")
        self.url = url
        self.obstore = s3_bucket.obstore
        name, prefix = s3_bucket.parse_url(url)
        options, retry = s3_bucket.bucket_client(s3_bucket.REQUEST_SECONDS)
        self.bucket = s3_bucket.S3Store(name, prefix=prefix or None, client_options=options,
                                        retry_config=retry)

    def _asking(self, what: str, fn):
        """``fn()``; the bucket not answering is Unavailable (a line, no traceback)."""
        from obstore.exceptions import AlreadyExistsError, BaseError
        try:
            return fn()
        except (FileNotFoundError, AlreadyExistsError):
            raise
        except (BaseError, OSError) as exc:
            raise Unavailable(f"the blob bucket {self.url} did not answer {what}:"
                              f" {str(exc).splitlines()[0] if str(exc) else exc}") from None

    def read(self) -> bytes | None:
        try:
            return self._asking(f"GET {KEYRING}", lambda: bytes(
                self.obstore.get(self.bucket, KEYRING).bytes()))
        except FileNotFoundError:
            return None

    def holds_data(self) -> bool:
        """Anything stored already: an object in the bucket, or a session or an object
        (a staged one, whose bytes are in the database) in the fleet's PostgreSQL."""
        if self.store.startswith(("postgresql://", "postgres://")) and _rows_in(self.store):
            return True

        def look() -> bool:
            for batch in self.obstore.list(self.bucket, chunk_size=10):
                if any(meta["path"] != KEYRING for meta in batch):
                    return True
            return False
        return self._asking("LIST", look)

    def write(self, raw: bytes, create: bool) -> bytes:
        from obstore.exceptions import AlreadyExistsError
        try:
            self._asking(f"PUT {KEYRING}", lambda: self.obstore.put(
                self.bucket, KEYRING, raw, mode="create" if create else "overwrite"))
        except AlreadyExistsError:  # another host's first start wrote it: that one
            return self.read() or raw
        return raw

    def __str__(self) -> str:
        return f"{self.url}/{KEYRING}"


def _rows_in(url: str) -> bool:
    """A fleet's PostgreSQL database holds a session or a blob object already."""
    import psycopg
    try:
        with psycopg.connect(url, connect_timeout=10) as conn:
            for table in ("sessions", "blob_objects"):
                try:
                    if conn.execute(f"SELECT 1 FROM {table} LIMIT 1").fetchone():
                        return True
                except psycopg.errors.UndefinedTable:  # a new database: nothing yet
                    conn.rollback()
    except psycopg.OperationalError as exc:
        raise Unavailable(f"the metadata store did not answer: {exc}") from None
    return False


def _place(root: str, store: str, blobs: str):
    if blobs.startswith("s3://"):
        return _Bucket(blobs, store)
    if store != "sqlite":
        raise InvalidArgument("encryption with a PostgreSQL store needs the fleet's blobs in a"
                              " bucket (--blobs s3://...), where every host finds the keyring")
    return _Local(root)


def open_data_key(root: str, store: str, blobs: str, kek_file: str) -> crypto.DataKey | None:
    """The data key of the data root ``root`` (or of the fleet, for a bucket), by the
    rules in this module's docstring; None when it is kept in the clear."""
    if not kek_file:
        if blobs.startswith("s3://") or store == "sqlite":
            place = _place(root, store, blobs)
            try:
                found = place.read()
            except Unavailable as exc:  # a host starts with its bucket away, as before
                log.warning("%s; starting without knowing whether the fleet is encrypted",
                            exc.message)
                found = None
            if found is not None:
                raise InvalidArgument(f"this data is encrypted ({place} holds its data key):"
                                      " start the daemon with --encryption-key FILE")
        return None
    kek = crypto.read_kek(kek_file)
    place = _place(root, store, blobs)
    raw = place.read()
    if raw is None:
        if place.holds_data():
            raise InvalidArgument(f"{root if isinstance(place, _Local) else place} holds data"
                                  " written in the clear: encryption starts with an empty"
                                  " data root (or bucket); there is no migration in place")
        raw = place.write(_encode(kek, crypto.new_key()), create=True)
    return crypto.DataKey(_decode(raw, kek, str(place)))


def rotate(root: str, store: str, blobs: str, old_file: str, new_file: str) -> str:
    """Re-wrap the data key of ``root`` (or of the fleet's bucket) with the KEK in
    ``new_file``, having opened it with the one in ``old_file``; atomically (a rename, or
    one PUT). Returns the new key's id."""
    place = _place(root, store, blobs)
    raw = place.read()
    if raw is None:
        raise NotFound(f"no keyring at {place}: this data is not encrypted")
    old, new = crypto.read_kek(old_file), crypto.read_kek(new_file)
    data_key = _decode(raw, old, str(place))
    place.write(_encode(new, data_key), create=False)
    return crypto.key_id(new)
