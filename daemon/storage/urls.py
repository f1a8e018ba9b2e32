"""A store's URL as messages and logs show it: ``--store postgresql://...`` names its
password, which nothing the daemon writes or says repeats (config.py, postgres_db.py)."""

from __future__ import annotations


def redact(url: str) -> str:
    """The URL without its password, for messages and logs."""
    if "@" not in url or "://" not in url:
        return url
    scheme, rest = url.split("://", 1)
    auth, host = rest.rsplit("@", 1)
    return f"{scheme}://{auth.split(':', 1)[0]}@{host}"
