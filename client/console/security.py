"""Who may use the console, and what a page may do in the browser.

- **The token.** ``worldline console`` makes a random token and prints the URL holding
  it (as Jupyter does). The first request with ``?token=`` gets a cookie (``HttpOnly``,
  ``SameSite=Strict``, ``Secure`` over TLS) and is redirected to the same page without
  the token, so it stays out of the history and of ``Referer``. Scripts may send
  ``Authorization: Bearer TOKEN`` instead. Anything else is 401.
- **CSRF.** Every request that changes something (POST) carries the console's CSRF
  token (a hidden form field, or ``X-CSRF-Token``) and, when the browser sends an
  ``Origin``, comes from the console's own origin; else 403.
- **Content.** File names, file contents, messages and tool arguments are the agent's:
  Jinja2 escapes everything, and the Content Security Policy forbids inline script,
  inline style, any origin but the console's own and framing; violations are reported
  to ``/csp-report`` and counted.
"""

from __future__ import annotations

import hmac
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
