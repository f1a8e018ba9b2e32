"""``worldline console``: the operators' window onto the daemon, in a browser.

A local web server that runs as the calling user and talks to the daemon with that
user's credentials, so it shows and does exactly what that user's CLI may. It prints
its URL, with a one-time token, as the first line on stdout; it binds loopback unless
told otherwise, and any other address needs TLS (``--tls-cert``, ``--tls-key``).
The pages and their safety: ``app.py`` and ``security.py``.
"""

from __future__ import annotations

import ipaddress
import socket
import sys
import threading

from ..errors import InvalidArgument

__all__ = ["serve", "parse_listen"]


def parse_listen(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise InvalidArgument(f"--listen {listen!r}: give HOST:PORT (PORT 0: any free port)")
    return host.strip("[]") or "127.0.0.1", int(port)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve(address: str | None, listen: str = "127.0.0.1:0", open_browser: bool = False,
          tls_cert: str | None = None, tls_key: str | None = None, ready=None) -> int:
    """Serve until interrupted. ``ready(url)``, if given, is called once it listens."""
    import uvicorn

    from .._client import Client
    from .app import make_app
    from .security import Keys

    host, port = parse_listen(listen)
    secure = bool(tls_cert and tls_key)
    if not _loopback(host) and not secure:
        raise InvalidArgument(f"the console listens on {host} beyond this machine only with"
                              " TLS: give --tls-cert and --tls-key")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    port = sock.getsockname()[1]
    keys = Keys()
    client = Client(address)
    client.list_sessions()  # the daemon answers, and lets this user in, or we stop here
    shown = f"[{host}]" if ":" in host else host
    url = f"{'https' if secure else 'http'}://{shown}:{port}/?token={keys.token}"
    print(url, flush=True)
    print("worldline console: open the URL above; Ctrl-C stops it", file=sys.stderr)
    config = uvicorn.Config(make_app(client, keys, secure), log_level="warning",
                            ssl_certfile=tls_cert, ssl_keyfile=tls_key,
                            timeout_keep_alive=5, limit_concurrency=256)
    server = uvicorn.Server(config)
    if open_browser:
        import webbrowser
        threading.Timer(0.5, webbrowser.open, (url,)).start()
    if ready is not None:
        threading.Thread(target=lambda: (_wait_started(server), ready(url)),
                         daemon=True).start()
    try:
        server.run(sockets=[sock])
    finally:
        client.close()
    return 0


def _wait_started(server) -> None:
    import time
    while not server.started:
        time.sleep(0.01)
