"""Who may use the console, and what a page may do in the browser.

- **The token.** ``worldline console`` makes a random token and prints the URL holding
  it (as Jupyter does). The first request with ``?token=`` gets a cookie (``HttpOnly``,
  ``SameSite=Strict``, ``Secure`` over TLS) and is redirected to the same page without
  the token, so it stays out of the history and of ``Referer``. Scripts may send
  ``Authorization: Bearer TOKEN`` instead. Anything else is 401.
- **CSRF.** Every request that changes something (POST) carries the console's CSRF
  token (a hidden form field, or ``X-CSRF-Token``) and, when the browser sends an
  ``Origin``, comes from the console's own origin; else 403.
- **Other users of this machine.** A browser sends a cookie of 127.0.0.1 to every port
  of it: to a server an agent runs there too, which could then use the console with it.
  So a connection from this machine is served only when the socket at its other end is
  the console's own user's, or root's (``/proc/net/tcp``, as ``ss -e`` reads it).
- **Content.** File names, file contents, messages and tool arguments are the agent's:
  Jinja2 escapes everything, and the Content Security Policy forbids inline script,
  inline style, any origin but the console's own and framing; violations are reported
  to ``/csp-report`` and counted.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import secrets

COOKIE = "wl_console"

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:;"
       " connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none';"
       " report-uri /csp-report")

HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",  # (no-referrer would send `Origin: null` on forms)
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}


class Keys:
    """The console's secrets, new at every start: the token in the printed URL, the
    cookie's value, and the CSRF token."""

    def __init__(self, token: str | None = None) -> None:
        self.token = token or secrets.token_urlsafe(32)
        self.cookie = secrets.token_urlsafe(32)
        self.csrf = secrets.token_urlsafe(32)
        self.csp_reports = 0

    def token_ok(self, given: str | None) -> bool:
        return bool(given) and hmac.compare_digest(given.encode(), self.token.encode())

    def cookie_ok(self, given: str | None) -> bool:
        return bool(given) and hmac.compare_digest(given.encode(), self.cookie.encode())

    def csrf_ok(self, given: str | None) -> bool:
        return bool(given) and hmac.compare_digest(given.encode(), self.csrf.encode())


def bearer(header: str | None) -> str | None:
    if header and header.lower().startswith("bearer "):
        return header[7:].strip()
    return None


def loopback(host: str | None) -> bool:
    try:
        address = ipaddress.ip_address(host or "")
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


def peer_uid(client: tuple | None, server: tuple | None) -> int | None:
    """The uid owning the other end of a loopback TCP connection to this process (the
    established socket whose local port is the client's and remote port the server's),
    or None when none is found."""
    if not client or not server:
        return None
    ends = (f"{client[1]:04X}", f"{server[1]:04X}")
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as f:
                next(f, None)
                for line in f:
                    fields = line.split()
                    if (len(fields) > 7 and fields[3] == "01"
                            and (fields[1].rpartition(":")[2],
                                 fields[2].rpartition(":")[2]) == ends):
                        return int(fields[7])
        except OSError:
            continue
    return None


def same_user(client: tuple | None, server: tuple | None) -> bool:
    """Whether a connection may be served: from a socket of this machine, only the
    console's user's or root's (to loopback or to any address of it); else from beyond
    this machine (over TLS, by the token)."""
    if not client:
        return True
    uid = peer_uid(client, server)
    if uid is not None:
        return uid in (os.geteuid(), 0)
    return not loopback(client[0])  # loopback, and not found: refused
