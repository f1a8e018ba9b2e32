"""Progress bars for the CLI's long calls (restore, fork, gc).

The call runs in a thread with an operation id; the main thread polls the daemon's
``GetProgress`` for that id and draws on stderr: one bar redrawn in place on a
terminal, or a line per phase and per quarter when stderr is a file or a pipe."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import IO, Any

from ._client import Client
from .errors import WorldlineError

POLL_SECONDS = 0.1
WIDTH = 24


def amount(n: int, unit: str) -> str:
    if unit != "bytes":
        return f"{n:,} {unit}"
    for suffix, size in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {suffix}"
    return f"{n} B"


class Bar:
    def __init__(self, stream: IO[str], interactive: bool) -> None:
        self.stream = stream
        self.interactive = interactive
        self.phase = ""
        self.quarter = -1
        self.drawn = False

    def show(self, p: dict) -> None:
        if not p["phase"] or p["phase"] == "starting":
            return
        new_phase = p["phase"] != self.phase
        if new_phase and self.drawn and self.interactive:
            self.stream.write("\n")
        if new_phase:
            self.phase, self.quarter = p["phase"], -1
        total, done = p["total"], min(p["done"], p["total"]) if p["total"] else p["done"]
        if p["finished"] and total:
            done = total
        fraction = done / total if total else None
        files = f", {p['files']:,} files" if p["files"] else ""
        counted = (f"{amount(done, p['unit'])} of {amount(total, p['unit'])}" if total
                   else amount(done, p["unit"]))
        if self.interactive:
            bar = ("#" * round(WIDTH * fraction)).ljust(WIDTH, ".") if fraction is not None \
                else "".ljust(WIDTH, "~")
            pct = f"{fraction:4.0%}" if fraction is not None else "    "
            self.stream.write(f"\r\033[K{p['phase']}  [{bar}] {pct}  {counted}{files}")
        else:
            quarter = 4 if p["finished"] else int(4 * fraction) if fraction is not None else 0
            if quarter == self.quarter and not new_phase:
                return
            self.quarter = quarter
            pct = f"{fraction:.0%}" if fraction is not None else "..."
            self.stream.write(f"{p['phase']}: {pct}  {counted}{files}\n")
        self.stream.flush()
        self.drawn = True

    def close(self) -> None:
        if self.drawn and self.interactive:
            self.stream.write("\n")
            self.stream.flush()


def with_progress(client: Client, call: Callable[[str], Any], stream: IO[str],
                  interactive: bool) -> Any:
    """``call(operation_id)`` in a thread while a bar follows it; its result or error."""
    op = "cli-" + os.urandom(8).hex()
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = call(op)
        except BaseException as exc:  # noqa: BLE001 - raised again below
            box["error"] = exc

    worker = threading.Thread(target=target, daemon=True)
    worker.start()
    bar = Bar(stream, interactive)
    while True:
        worker.join(POLL_SECONDS)
        done = not worker.is_alive()
        try:
            bar.show(client.progress(op))
        except WorldlineError:
            pass  # not begun yet, or refused before it began: the call says why
        if done:
            break
    bar.close()
    if "error" in box:
        raise box["error"]
    return box["value"]
