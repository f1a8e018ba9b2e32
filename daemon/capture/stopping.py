"""Whether a container's first process would ignore the signal `docker stop` sends it.

The kernel delivers a signal to the init of a PID namespace, from outside as from
inside, only when init catches it or has it blocked (``sig_task_ignored``): a
container whose PID 1 is ``sleep``, an interactive ``sh`` or any program without a
handler never sees its stop signal, and ``docker stop`` waits out its whole timeout
before it sends SIGKILL. A restore stops the container and would wait for nothing;
when this module can tell for certain that the signal would be dropped, the restore
sends SIGKILL at once instead, which is the same end without the wait.

The answer is read from ``/proc`` of the container's PID 1: its caught and blocked
signals, and the system call it sleeps in (``rt_sigtimedwait`` takes the signals it
waits for out of the blocked set while it waits, as tini, Docker's ``--init``, does).
It counts only when the process is the container's (its cgroup names the container)
and slept in the same call throughout the reading (no context switch between two
reads of its status). Anything else, including an unknown signal or machine, is
"not certain": the caller waits as ``docker stop`` does. The agent controls the
process, so it can only make its own container's stop slower or faster.
"""

from __future__ import annotations

import platform
import signal

# rt_sigtimedwait's number, by machine: a process sleeping in it has the signals it
# waits for unblocked in its status, though the kernel delivers them.
_SIGTIMEDWAIT = {"x86_64": 128, "aarch64": 137}


def signal_number(name: str) -> int | None:
    """The number of a stop signal as Docker records it ("SIGTERM", "TERM", "15")."""
    name = (name or "SIGTERM").strip().upper()
    if name.isdigit():
        return int(name) if 0 < int(name) < signal.NSIG else None
    try:
        return int(signal.Signals[name if name.startswith("SIG") else f"SIG{name}"])
    except KeyError:
        return None  # SIGRTMIN+3 and the like: not certain


def ignores_stop_signal(attrs: dict) -> bool:
    """True only when the container ``docker inspect`` describes in ``attrs`` is running
    a first process that certainly drops its stop signal."""
    pid = (attrs.get("State") or {}).get("Pid") or 0
    number = signal_number((attrs.get("Config") or {}).get("StopSignal") or "")
    container = attrs.get("Id") or ""
    waiting = _SIGTIMEDWAIT.get(platform.machine())
    if pid <= 0 or number is None or not container or waiting is None:
        return False
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            if container not in f.read():
                return False  # another process by now, or a namespace that hides it
        before = _status(pid)
        with open(f"/proc/{pid}/syscall") as f:
            call = f.read().split()
        after = _status(pid)
    except (OSError, ValueError):
        return False
    if not call or not call[0].isdigit() or int(call[0]) == waiting:
        return False  # running, or waiting for signals
    if before != after or not before:
        return False  # it ran between the reads: the masks may not be the ones it slept with
    bit = 1 << (number - 1)
    return not (before["SigCgt"] & bit or before["SigBlk"] & bit)


def _status(pid: int) -> dict[str, int]:
    """The masks and context switch counts of /proc/PID/status."""
    wanted = {"SigCgt", "SigBlk", "voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"}
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in wanted:
                value = value.strip()
                out[key] = int(value, 16) if key.startswith("Sig") else int(value)
    return out if len(out) == len(wanted) else {}
