"""Run a program on a pseudo-terminal, as a person at a terminal would start it, until
its screen shows a marker, then ``linger`` seconds more, or until ``seconds`` pass;
print the screen's text (escape sequences and spaces left out) and stop it. MARKER is
one or more strings, ``|`` between them: a terminal app redraws only what changed, so
a word on the screen may lack a letter.

``python tests/agents/pty_drive.py SECONDS MARKER LINGER -- ARGV...``
"""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import sys
import time

ESCAPES = re.compile(rb"\x1b\[[0-9;?>]*[a-zA-Z]|\x1b\][^\x07]*\x07")


def main() -> int:
    seconds, marker, linger, sep, *argv = sys.argv[1:]
    assert sep == "--" and argv
    pid, fd = pty.fork()
    if pid == 0:
        os.execvp(argv[0], argv)
    screen, end, seen = b"", time.monotonic() + float(seconds), False
    while time.monotonic() < end:
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            try:
                data = os.read(fd, 1 << 16)
            except OSError:
                break
            if not data:
                break
            screen += data
        text = b"".join(ESCAPES.sub(b"", screen).split()).decode("utf-8", "replace")
        if not seen and any(m in text for m in marker.split("|")):
            seen, end = True, time.monotonic() + float(linger)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    print(b"".join(ESCAPES.sub(b"", screen).split()).decode("utf-8", "replace"))
    return 0 if seen else 1


if __name__ == "__main__":
    sys.exit(main())
