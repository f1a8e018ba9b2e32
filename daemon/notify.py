"""``--notify URL``: a JSON POST for each event a person must hear of.

The events are read from the audit log, which every one of them is written to in the
same transaction as the change it records: an approval requested (``approval.request``)
or decided (``approval.approved``, ``.denied``, ``.expired``), a session that needs
attention (``restore.set_aside``, ``session.copied``) and a gated call that ran anyway
(``gate_bypassed``). A watcher thread follows the log from the daemon's start; a sender
thread posts each event in order, retrying with back-off (1 s doubling to a minute, for
at most ``GIVE_UP`` seconds; then it is logged and dropped). Neither ever holds a
checkpoint back: the log is read after the commit, and at most ``QUEUE`` events wait (the
oldest are dropped past that, said in the log).

The body: ``event`` (approval_requested, approval_decided, needs_attention,
gate_bypassed), ``session_id``, ``text`` (one line, ``&``, ``<``, ``>`` escaped, which
Slack-compatible webhooks show), ``subject_id``, ``detail`` (the audit event's),
``created_at``, ``seq``.
On a fleet every host reads the one log: give ``--notify`` to one host.
"""

from __future__ import annotations

import collections
import json
import logging
import threading
import time
import urllib.error
import urllib.request

from .records import AuditEvent

log = logging.getLogger("worldline.notify")

EVENTS = {
    "approval.request": "approval_requested",
    "approval.approved": "approval_decided",
    "approval.denied": "approval_decided",
    "approval.expired": "approval_decided",
    "restore.set_aside": "needs_attention",
    "session.copied": "needs_attention",
    "gate_bypassed": "gate_bypassed",
}
POLL = 0.5          # seconds between two reads of the audit log
QUEUE = 1000        # events waiting to be sent, at most
GIVE_UP = 600.0     # seconds one event is retried for
TIMEOUT = 5.0       # one POST's


def message(event: AuditEvent) -> dict:
    """The JSON body for one audit event of a kind in EVENTS."""
    d, sid, subject = event.detail or {}, event.session_id or "", event.subject_id
    kind = event.kind
    if kind == "approval.request":
        text = (f"worldline: approval requested for {d.get('tool', '?')} in session {sid}"
                f" (expires {d.get('expires_at', '?')}): `worldline approve {subject}`"
                f" or `worldline deny {subject} --reason ...`")
    elif kind.startswith("approval."):
        status = kind.split(".", 1)[1]
        reason = f": {d['reason']}" if d.get("reason") else ""
        text = f"worldline: approval {subject} in session {sid} {status}{reason}"
    elif kind == "gate_bypassed":
        text = (f"worldline: a gated call ran without an approval in session {sid}"
                f" (tool call {subject}{', ' + d['rule'] if d.get('rule') else ''})")
    else:
        text = (f"worldline: session {sid} needs attention"
                f"{': ' + d['reason'] if d.get('reason') else ''}"
                " (`worldline session show " + sid + "`)")
    return {"event": EVENTS[kind], "session_id": event.session_id, "text": _line(text),
            "kind": kind, "subject_id": subject, "detail": d,
            "created_at": event.created_at, "seq": event.seq}


def _line(text: str) -> str:
    """The text as one line, ``&``, ``<`` and ``>`` escaped as Slack-compatible receivers
    read them: a tool's name or a denial's reason is the agent's to write, and there
    ``<!channel>`` would be a mention and ``<https://...|worldline approve ...>`` a link
    to anywhere."""
    return (" ".join(text.split()).replace("&", "&amp;").replace("<", "&lt;")
            .replace(">", "&gt;"))


class Notifier:
    """Follows ``store``'s audit log and posts its events to ``url``."""

    def __init__(self, store, url: str, poll: float = POLL, give_up: float = GIVE_UP) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"--notify {url!r}: an http:// or https:// URL")
        self.store, self.url, self.poll, self.give_up = store, url, poll, give_up
        self.queue: collections.deque[dict] = collections.deque()
        self.ready = threading.Condition()
        self.stopping = threading.Event()
        self.sent = 0
        self.dropped = 0
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        """Follow the log from now on (what came before the start is not sent)."""
        last = self.store.list_audit(limit=1)
        self._seq = last[-1].seq if last else 0
        for target, name in ((self._watch, "notify-watch"), (self._send, "notify-send")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self.stopping.set()
        with self.ready:
            self.ready.notify_all()
        for t in self._threads:
            t.join(timeout=TIMEOUT + 1)

    def _watch(self) -> None:
        while not self.stopping.wait(self.poll):
            try:
                # by seq, not by time: an event's time is taken before its transaction
                # (and on a fleet by its host's clock), so a later seq may carry an
                # earlier time, and a read by time would miss it
                events = self.store.list_audit(after_seq=self._seq)
            except Exception:  # noqa: BLE001 -- a store away for a moment: next poll
                log.warning("notify: the audit log could not be read", exc_info=True)
                continue
            fresh = [e for e in events if e.seq > self._seq]
            if not fresh:
                continue
            self._seq = fresh[-1].seq
            wanted = [message(e) for e in fresh if e.kind in EVENTS]
            if wanted:
                with self.ready:
                    for m in wanted:
                        if len(self.queue) >= QUEUE:
                            dropped = self.queue.popleft()
                            self.dropped += 1
                            log.warning("notify: queue full, dropped %s of seq %s",
                                        dropped["event"], dropped["seq"])
                        self.queue.append(m)
                    self.ready.notify_all()

    def _send(self) -> None:
        while not self.stopping.is_set():
            with self.ready:
                while not self.queue and not self.stopping.is_set():
                    self.ready.wait()
                if self.stopping.is_set():
                    return
                m = self.queue[0]
            if self._deliver(m):
                self.sent += 1
            else:
                self.dropped += 1
                log.error("notify: gave up on %s of seq %s after %.0f s", m["event"],
                          m["seq"], self.give_up)
            with self.ready:
                if self.queue and self.queue[0] is m:
                    self.queue.popleft()

    def _deliver(self, m: dict) -> bool:
        body = json.dumps(m).encode()
        deadline, wait = time.monotonic() + self.give_up, 1.0
        while not self.stopping.is_set():
            request = urllib.request.Request(self.url, data=body, method="POST",
                                             headers={"Content-Type": "application/json",
                                                      "User-Agent": "worldline-notify"})
            try:
                with urllib.request.urlopen(request, timeout=TIMEOUT) as r:
                    if 200 <= r.status < 300:
                        return True
            except (urllib.error.URLError, OSError, ValueError) as exc:
                log.info("notify: %s of seq %s not delivered (%s); retrying in %.0f s",
                         m["event"], m["seq"], exc, wait)
            if time.monotonic() + wait > deadline:
                return False
            self.stopping.wait(wait)
            wait = min(wait * 2, 60.0)
        return False
