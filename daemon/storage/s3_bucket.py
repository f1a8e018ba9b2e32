"""The bucket itself, as the fleet's blob store (s3_blobs.py) and its keyring
(keyring.py) reach it: the client and its settings, the objects' names and sizes, and
each request counted, with an error that comes back as the domain's ``Unavailable``.

An object is written once under a name of its own and never overwritten: a pack
(``pack_name``: its content's address and a random part) or a large blob
(``blobs/<digest>-<random>``). ``FileNotFoundError`` (the object is not there) and
``AlreadyExistsError`` (a write-once name taken) pass as they are, for the caller to
decide what they mean.
"""

from __future__ import annotations

import logging
import os
import re
from datetime import timedelta

from worldline.wire.errors import InvalidArgument, Unavailable

from ..observe import BUCKET_REQUESTS
from .blob_store import digest_of

log = logging.getLogger(__name__)

try:
    import obstore
    from obstore.exceptions import AlreadyExistsError, BaseError
    from obstore.store import S3Store
except ImportError:  # pragma: no cover - the fleet extra is not installed
    obstore = S3Store = None

    class BaseError(Exception):  # type: ignore[no-redef]
        """obstore's errors where it is not installed (nothing raises them: no bucket)."""

    AlreadyExistsError = BaseError  # type: ignore[misc]

ALONE = 8 << 20  # a blob larger than this is an object of its own
PART_BYTES = 16 << 20  # its parts
PACK_LIMIT = 64 << 20  # entries in one pack object, at most
OBJECT_CONTEXT = b"worldline bucket object"  # a sealed pack object's associated data
# A request to the bucket gives up after REQUEST_SECONDS (object_store's default: a
# 16 MiB part or a 64 MiB pack on a slow link). An error that comes back (5xx, a
# refused or dropped connection) is retried for RETRY_SHARE of that, with backoff; a
# request that hangs is not tried again, so a bucket that accepts and never answers
# fails a call in about REQUEST_SECONDS, not the SDK's 3 minutes of retried GETs.
REQUEST_SECONDS = 30.0
RETRY_SHARE = 0.6
# The HTTP client's settings the SDK takes from AWS_<NAME> (AWS_ALLOW_HTTP, ...): passed
# on explicitly, since options given to the store replace what it read from there.
CLIENT_SETTINGS = (
    "allow_http", "allow_invalid_certificates", "connect_timeout", "default_content_type",
    "http1_only", "http2_keep_alive_interval", "http2_keep_alive_timeout",
    "http2_keep_alive_while_idle", "http2_only", "pool_idle_timeout",
    "pool_max_idle_per_host", "proxy_url", "proxy_ca_certificate", "proxy_excludes",
    "randomize_addresses", "read_timeout", "timeout", "user_agent")


class Vanished(Exception):
    """An object was deleted after its rows were read (a repack moved them)."""


def pack_name(body: bytes, address=digest_of) -> str:
    """A new pack object's name: its content's address and a random part. Never the
    name of an object that exists or existed: a delete (gc's sweep of an object no row
    names, a rewrite's of the objects it replaced) decided on an earlier look can only
    hit the object it looked at, never one a host has just uploaded the same bytes as
    and is about to record. (Buckets written by older versions also hold packs named
    by their content alone, ``packs/<sha256>.pack``, which read the same.)"""
    return f"packs/{address(body)}-{os.urandom(8).hex()}.pack"


def content_of(name: str) -> str | None:
    """The content's SHA-256 a pack's name carries (``packs/<sha256>[-<random>].pack``,
    either form), None for any other object."""
    return name[6:70] if name.startswith("packs/") else None


def bucket_client(request_seconds: float) -> tuple[dict[str, str], dict]:
    """(client options, retry config) for the store: the environment's AWS_<setting>
    values, a request timeout of ``request_seconds`` unless AWS_TIMEOUT says, and
    retries for RETRY_SHARE of whichever timeout holds (so a request that hangs is not
    tried again however short AWS_TIMEOUT is; a value the SDK cannot read keeps
    ``request_seconds`` here, and the SDK refuses it)."""
    options = {key: os.environ[f"AWS_{key.upper()}"] for key in CLIENT_SETTINGS
               if f"AWS_{key.upper()}" in os.environ}
    timeout = request_seconds
    if "timeout" in options:
        timeout = duration_seconds(options["timeout"]) or request_seconds
    else:
        options["timeout"] = f"{int(request_seconds * 1000)}ms"
    retry = {"retry_timeout": timedelta(seconds=timeout * RETRY_SHARE)}
    return options, retry


_UNIT_SECONDS = {
    **dict.fromkeys(("nsec", "ns"), 1e-9), **dict.fromkeys(("usec", "us", "\u00b5s"), 1e-6),
    **dict.fromkeys(("msec", "ms", "millis"), 1e-3),
    **dict.fromkeys(("seconds", "second", "secs", "sec", "s"), 1.0),
    **dict.fromkeys(("minutes", "minute", "mins", "min", "m"), 60.0),
    **dict.fromkeys(("hours", "hour", "hrs", "hr", "h"), 3600.0),
    **dict.fromkeys(("days", "day", "d"), 86400.0),
    **dict.fromkeys(("weeks", "week", "w"), 604800.0)}
_DURATION_PART = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z\u00b5]+)")


def duration_seconds(text: str) -> float | None:
    """A duration as the SDK's client settings spell it (humantime, case and all:
    ``30s``, ``500ms``, ``1m 30s``), in seconds; None if it is not one this reads (the
    SDK may still take it: months, years) or is zero."""
    total, at = 0.0, 0
    text = text.strip()
    while at < len(text):
        part = _DURATION_PART.match(text, at)
        if part is None or part.group(2) not in _UNIT_SECONDS:
            return None
        total += float(part.group(1)) * _UNIT_SECONDS[part.group(2)]
        at = part.end()
    return total or None


def parse_url(url: str) -> tuple[str, str]:
    """``s3://bucket/prefix`` -> (bucket, prefix without slashes at its ends)."""
    if not url.startswith("s3://") or not url[5:].split("/", 1)[0]:
        raise InvalidArgument(f"blob store {url!r} is not s3://bucket[/prefix]")
    bucket, _, prefix = url[5:].partition("/")
    return bucket, prefix.strip("/")


def answer_error(url: str, what: str, exc: BaseException) -> Unavailable:
    """The bucket did not answer ``what``: one line, no traceback."""
    return Unavailable(f"the blob bucket {url} did not answer {what}:"
                       f" {str(exc).splitlines()[0] if str(exc) else exc}")


class Bucket:
    """The bucket of ``url`` (``s3://bucket/prefix``). Endpoint, region and credentials
    come the SDK's usual way: AWS_ENDPOINT_URL, AWS_REGION / AWS_DEFAULT_REGION,
    AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (AWS_ALLOW_HTTP=true for a plain-HTTP
    endpoint). ``requests`` counts the PUTs, GETs and DELETEs since start (metrics,
    the benchmark)."""

    def __init__(self, url: str, request_seconds: float = REQUEST_SECONDS) -> None:
        if obstore is None:
            raise Unavailable("s3 blobs need obstore: pip install 'worldline[fleet]'")
        self.url = url
        name, prefix = parse_url(url)
        options, retry = bucket_client(request_seconds)
        try:
            self.store = S3Store(name, prefix=prefix or None, client_options=options,
                                 retry_config=retry)
        except BaseError as exc:  # a setting of the environment's the SDK cannot take
            raise InvalidArgument(f"blob store {url}: the environment's AWS_* settings are"
                                  f" not valid: {str(exc).splitlines()[0]}") from None
        self.requests = {"put": 0, "get": 0, "delete": 0}

    def count(self, op: str) -> None:
        self.requests[op] += 1
        BUCKET_REQUESTS.labels(op).inc()

    def call(self, what: str, fn, *args, **kwargs):
        """``fn(*args, **kwargs)``, an error of the bucket's as ``Unavailable``."""
        try:
            return fn(*args, **kwargs)
        except FileNotFoundError:
            raise
        except AlreadyExistsError:
            raise
        except (BaseError, OSError) as exc:
            raise answer_error(self.url, what, exc) from None

    def put_once(self, name: str, body) -> None:
        """One PUT, write-once (If-None-Match: *)."""
        self.count("put")
        try:
            self.call(f"PUT {name}", obstore.put, self.store, name, body, mode="create")
        except AlreadyExistsError:
            pass  # nobody else writes this name: a retry whose first attempt landed

    def put_parts(self, name: str, body) -> None:
        """A large blob: a multipart upload (under a name of its own, like a pack's: S3
        has no write-once condition on multipart uploads that every server honours)."""
        self.count("put")
        self.call(f"PUT {name} (multipart)", obstore.put, self.store, name, body,
                  use_multipart=True, chunk_size=PART_BYTES)

    def get(self, name: str, counted: bool = True):
        """The SDK's result of a GET (``.bytes()``, ``.stream()``); FileNotFoundError
        if there is no such object."""
        if counted:
            self.count("get")
        return self.call(f"GET {name}", obstore.get, self.store, name)

    def listing(self):
        """The bucket's objects, in batches of the SDK's metadata dicts."""
        return self.call("LIST", obstore.list, self.store)

    def delete(self, names: list[str]) -> None:
        """Delete objects: several in one request (S3's DeleteObjects, up to a thousand
        per request), or one by one where the server does not take that; one already
        gone is no error."""
        if len(names) > 1:
            self.count("delete")
            try:
                obstore.delete(self.store, list(names))
                return
            except FileNotFoundError:
                return
            except (BaseError, OSError) as exc:  # no DeleteObjects here: one at a time
                log.info("the bucket refused a bulk delete (%s); deleting one by one",
                         str(exc).splitlines()[0] if str(exc) else exc)
        for name in names:
            self.count("delete")
            try:
                self.call(f"DELETE {name}", obstore.delete, self.store, name)
            except FileNotFoundError:
                pass
