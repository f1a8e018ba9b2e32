"""A random walk of agent work, as the agent: every checkpoint restores exactly.

A child process running as uid 1000 (the agent, by number) makes random changes to its
workspace: files written (small, and over 1 MiB), appended, truncated, made sparse
with holes of every size; modes with setuid, setgid and sticky bits; times; xattrs;
hard links; symlinks into a canary folder outside; folders made, removed, moved, and
swapped for symlinks. A checkpoint follows each batch at once, with no pause, and its
``rsync -aHAXS``-grade fingerprint (fidelity.py) is kept. Now and then the session is
restored to a random earlier checkpoint and the agent carries on from there, so the
change tracker is walked across restores too; at the end a sample of the checkpoints
is restored again, and a few are forked. Each restore and fork must give back its
checkpoint's fingerprint exactly, and the canary must be as it was. (This walk found
sparse files with holes under 1 MiB restored dense.)

The same walk runs against a daemon killed with SIGKILL at random moments of its
checkpoints and restores. (It found a restore refused with NOT_FOUND whenever the
agent had made a hard link since the last checkpoint: the look at the workspace
that plans a restore stores nothing, and its link groups were read from the store;
and a restore killed before it linked a hard-link group set aside for an operator
instead of completed at the next start.)
"""

from __future__ import annotations

import itertools
import os
import random
import sys
import threading
from pathlib import Path

import pytest
from worldline.client.errors import FailedPrecondition, Unavailable

from .conftest import DaemonProcess
from .fidelity import AgentProcess, differences, fingerprint

ROUNDS = 300
RESTORE_EVERY = 37
KILL_ROUNDS = 90


class Agent(AgentProcess):
    """The agent working in ``root``: ``do(op, args)`` runs one change there and returns
    its errno (0: done). A change the agent may not make (EACCES, EEXIST...) is a
    change not made."""

    def __init__(self, root: Path) -> None:
        super().__init__(_answer, root)

    def do(self, op: str, args: dict) -> int:
        return self.ask([op, args])


def _answer(request: list) -> int:
    op, args = request
    try:
        _change(op, args)
        return 0
    except OSError as exc:
        return exc.errno


def _change(op: str, a: dict) -> None:
    p = a.get("p")
    if op == "write":
        with open(p, "wb") as f:
            f.write(a["data"].encode())
    elif op == "append":
        with open(p, "ab") as f:
            f.write(a["data"].encode())
    elif op == "big":  # over the pack's largest row: a blob file of its own
        with open(p, "wb") as f:
            f.write(random.Random(a["seed"]).randbytes(a["n"]))
    elif op == "truncate":
        os.truncate(p, a["n"])
    elif op == "holes":  # data, a hole of n bytes, data: every hole size, tiny to large
        with open(p, "wb") as f:
            f.write(b"head")
            f.seek(a["n"], os.SEEK_CUR)
            f.write(b"tail")
    elif op == "chmod":
        os.chmod(p, a["mode"])
    elif op == "utime":
        os.utime(p, ns=(a["t"], a["t"]), follow_symlinks=False)
    elif op == "setxattr":
        os.setxattr(p, f"user.k{a['k']}", a["data"].encode(), follow_symlinks=False)
    elif op == "rmxattr":
        os.removexattr(p, f"user.k{a['k']}", follow_symlinks=False)
    elif op == "link":
        os.link(p, a["q"])
    elif op == "symlink":
        os.symlink(a["target"], a["q"])
    elif op == "mkfifo":
        os.mkfifo(p, 0o640)
    elif op == "mkdir":
        os.mkdir(p, a["mode"])
    elif op == "rename":
        os.rename(p, a["q"])
    elif op == "swap":  # a folder moved aside and a symlink put in its place
        os.rename(p, a["q"])
        os.symlink(a["target"], p)
    elif op == "unlink":
        os.unlink(p)
    elif op == "rmdir":
        os.rmdir(p)
    else:
        raise AssertionError(f"no such change {op}")


def listing(ws: Path) -> tuple[list[str], list[str], list[str]]:
    """(folders with "." first, plain files, everything) below ``ws``, as relative paths."""
    folders, files, every = ["."], [], []
    for top, dirs, names in os.walk(ws):
        rel = os.path.relpath(top, ws)
        for name in dirs + names:
            path = os.path.normpath(os.path.join(rel, name))
            every.append(path)
            full = ws / path
            if full.is_symlink():
                continue
            if full.is_dir():
                folders.append(path)
            elif full.is_file():
                files.append(path)
    return folders, files, every


def _pick(rng: random.Random, ws: Path, i: int, canary: Path) -> tuple[str, dict]:
    """Change number ``i``: what it makes is named ``n<i>``, a name never used before."""
    folders, files, every = listing(ws)
    new = f"{rng.choice(folders)}/n{i}"
    op = rng.choice(["write", "write", "big", "append", "truncate", "holes", "chmod", "utime",
                     "setxattr", "rmxattr", "link", "symlink", "mkfifo", "mkdir",
                     "rename", "swap", "unlink", "rmdir"])
    if op == "write":
        return op, {"p": rng.choice(files + [new] * 3),
                    "data": "x" * rng.randrange(0, 5000) + str(i)}
    if op == "big":
        return op, {"p": rng.choice(files + [new]), "seed": i,
                    "n": rng.choice([(1 << 20) + 1, 3 << 20])}
    if op in ("append", "truncate", "link") and files:
        return op, {"p": rng.choice(files), "q": new, "data": str(i),
                    "n": rng.randrange(0, 9000)}
    if op == "holes":
        return op, {"p": new, "n": rng.choice([4096, 60_000, 1 << 20, (1 << 20) + 5,
                                               40 << 20])}
    if op == "chmod" and files + folders[1:]:  # not the workspace: the walk would end
        return op, {"p": rng.choice(files + folders[1:]),
                    "mode": rng.choice([0o644, 0o600, 0o755, 0o4755, 0o2755, 0o6711,
                                        0o1777, 0o700, 0o444, 0o555])}
    if op == "utime" and every:
        return op, {"p": rng.choice(every), "t": rng.randrange(10**17, 2 * 10**18)}
    if op in ("setxattr", "rmxattr"):
        return op, {"p": rng.choice(files + folders), "k": rng.randrange(3),
                    "data": "v" * rng.randrange(1, 300)}
    if op == "symlink":
        return op, {"q": new, "target": rng.choice([
            str(canary), str(canary / "keep.txt"), "../" * 6 + "etc", "n3", ".", "nowhere"])}
    if op == "mkfifo":
        return op, {"p": new}
    if op == "mkdir":
        return op, {"p": new, "mode": rng.choice([0o755, 0o700, 0o2775, 0o1777])}
    if op == "rename" and every:
        return op, {"p": rng.choice(every), "q": new}
    if op == "swap" and len(folders) > 1:
        return op, {"p": rng.choice(folders[1:]), "q": new, "target": str(canary)}
    if op == "unlink" and every:
        return op, {"p": rng.choice([p for p in every if p not in folders] or ["none"])}
    if op == "rmdir":
        return op, {"p": rng.choice(folders[1:] or ["none"])}
    return "write", {"p": new, "data": str(i)}


def arm_kill(d: DaemonProcess, rng: random.Random, chance: float,
             within: float) -> threading.Timer | None:
    """With probability ``chance``, a SIGKILL of ``d`` armed for a random moment in the
    next ``within`` seconds: somewhere in the call made next, or just after it."""
    if rng.random() >= chance:
        return None
    timer = threading.Timer(rng.uniform(0, within), d.proc.kill)
    timer.start()
    return timer


def restart_killed(d: DaemonProcess, timer: threading.Timer, client):
    """After a kill armed with ``timer``: the daemon dead before anything else happens
    (the agent is still), started again; a client of the new daemon."""
    timer.join()
    d.proc.wait()
    client.close()
    d.stop()
    d.start()
    return d.client()


@pytest.mark.parametrize("seed", [1, 2])
def test_every_checkpoint_of_a_random_walk_restores_exactly(client, places, seed):
    ws, canary = places
    untouched = fingerprint(canary)
    rng = random.Random(seed)
    agent = Agent(ws)
    session = client.create_session(str(ws))
    kept: dict[str, dict] = {}
    done = 0
    numbers = itertools.count()
    try:
        for i in range(ROUNDS):
            for _ in range(rng.randrange(1, 6)):
                done += agent.do(*_pick(rng, ws, next(numbers), canary)) == 0
            cp = session.checkpoint()  # at once: no pause after the changes
            kept[cp.id] = fingerprint(ws)
            if i % RESTORE_EVERY == RESTORE_EVERY - 1:
                target = rng.choice(list(kept))
                session.restore(target)
                assert differences(kept[target], fingerprint(ws)) == [], \
                    f"round {i}: restored to {target}"
        for cp_id in rng.sample(list(kept), 25):
            session.restore(cp_id)
            assert differences(kept[cp_id], fingerprint(ws)) == [], f"at the end: {cp_id}"
        for n, cp_id in enumerate(rng.sample(list(kept), 4)):  # a fork is the same world
            fork = client.fork(cp_id, workspace=str(ws.parent / f"fork{n}"))
            assert differences(kept[cp_id], fingerprint(fork.workspace)) == [], \
                f"fork of {cp_id}"
    finally:
        agent.close()
    assert done > ROUNDS  # the walk changed the world, not only tried to
    assert fingerprint(canary) == untouched


def test_a_walk_killed_at_random_moments_loses_no_acknowledged_checkpoint(tmp_path, places):
    """The same walk against a daemon killed (SIGKILL) at a random moment of a third of
    its checkpoints and restores, and stopped while every tenth batch is made. A
    killed checkpoint never changes the workspace; a killed restore leaves it as it
    was or, once the daemon is back, as its target; and every checkpoint acknowledged
    before or between the kills restores exactly."""
    ws, canary = places
    untouched = fingerprint(canary)
    d = DaemonProcess(tmp_path / "root").start()
    c = None
    try:
        c, sid, kept = killed_walk(d, ws, canary, random.Random(3), KILL_ROUNDS)
        for cp_id in random.Random(4).sample(list(kept), 25):
            c.restore(sid, cp_id)
            assert differences(kept[cp_id], fingerprint(ws)) == [], f"at the end: {cp_id}"
    finally:
        if c is not None:
            c.close()
        d.stop()
    assert fingerprint(canary) == untouched


def killed_walk(d: DaemonProcess, ws: Path, canary: Path, rng: random.Random,
                rounds: int, sid: str = ""):
    """The walk in ``ws`` against ``d``, killed at random moments (see above); checks
    each kill's outcome and, at the end, fsck. ``sid``: the session of ``ws``, made if
    not given. Returns the last client, the session's id and each acknowledged
    checkpoint's fingerprint."""
    agent = Agent(ws)
    numbers = itertools.count(10**6)  # names never used by an earlier walk in ws
    c = d.client()
    sid = sid or c.create_session(str(ws)).id
    kept: dict[str, dict] = {}
    kills = cut = 0
    try:
        for i in range(rounds):
            down = i % 10 == 9  # this batch made while the daemon is stopped
            if down:
                c.close()
                d.stop()
            for _ in range(rng.randrange(1, 6)):
                agent.do(*_pick(rng, ws, next(numbers), canary))
            if down:
                d.start()
                c = d.client()
            before = fingerprint(ws)
            target = rng.choice(list(kept)) if kept and i % 6 == 5 else None
            timer = arm_kill(d, rng, 0.35, 0.004 if target is None else 0.03)
            try:
                if target is None:
                    kept[c.checkpoint(sid).id] = before
                else:
                    c.restore(sid, target)
                    left = differences(kept[target], fingerprint(ws))
                    assert not left, f"round {i}: restored to {target}: " + "; ".join(left)
            except Unavailable:  # killed during the call: nothing was acknowledged
                cut += 1
            if timer is None:
                continue
            kills += 1
            c = restart_killed(d, timer, c)
            # the start completed any restore the kill cut short: the agent was still,
            # so nothing is set aside for an operator
            assert c.get_session(sid).needs_attention is None, f"round {i}"
            now = fingerprint(ws)
            if target is None:
                assert differences(before, now) == [], f"round {i}: a killed checkpoint"
            else:
                assert not differences(before, now) or not differences(kept[target], now), \
                    f"round {i}: a killed restore to {target}"
        print(f"{kills} kills, {cut} of them during a call", file=sys.stderr)
        assert kills >= rounds // 9 and cut >= rounds // 18
        assert c.fsck()["ok"]
    except BaseException:
        c.close()
        raise
    finally:
        agent.close()
    return c, sid, kept


@pytest.mark.parametrize("how", ["overlay", "copy"])
def test_a_walk_in_a_fork_killed_at_random_moments_loses_nothing_of_either(tmp_path, places,
                                                                           how):
    """The walk goes on in a fork, against a daemon killed at random moments: an
    overlay mount over the checkpoint's view (where a change to a file of the parent's
    copies it up first), mounted again at each start; or a copy (``--copy-forks``).
    Every checkpoint of the fork restores exactly, an overlay fork's workspace is
    mounted once, and the parent's checkpoints are untouched. (It found a restore
    through the overlay filling the holes of the parent's sparse files, and every
    checkpoint of a copied fork dropping its hard links; and the fingerprint's block
    count counting the xattr block overlayfs's own xattrs give a copied-up file.)"""
    ws, canary = places
    untouched = fingerprint(canary)
    rng = random.Random(40)
    numbers = itertools.count()
    d = DaemonProcess(tmp_path / "root", ["--copy-forks"] if how == "copy" else None).start()
    c = d.client()
    parent: dict[str, dict] = {}
    agent = Agent(ws)
    try:
        s = c.create_session(str(ws))
        for _ in range(20):
            for _ in range(rng.randrange(1, 6)):
                agent.do(*_pick(rng, ws, next(numbers), canary))
            parent[s.checkpoint().id] = fingerprint(ws)
    finally:
        agent.close()
    base = rng.choice(list(parent))
    fork = c.fork(base, workspace=str(tmp_path / "fork"))
    c.close()
    c = None
    try:
        c, sid, kept = killed_walk(d, Path(fork.workspace), canary, rng, 60, sid=fork.id)
        for cp_id in rng.sample(list(kept), 12):
            c.restore(sid, cp_id)
            assert differences(kept[cp_id], fingerprint(fork.workspace)) == [], cp_id
        for cp_id in rng.sample(list(parent), 4):
            c.restore(s.id, cp_id)
            assert differences(parent[cp_id], fingerprint(ws)) == [], cp_id
        with open("/proc/self/mountinfo") as f:
            assert sum(f" {fork.workspace} " in line for line in f) == (how == "overlay")
    finally:
        if c is not None:
            c.close()
        d.stop()
    assert fingerprint(canary) == untouched


def test_a_walk_with_gc_killed_at_random_moments_keeps_what_retention_keeps(tmp_path,
                                                                           places):
    """The walk with a gc every seventh round (the last 2 to 5 checkpoints kept, labelled
    ones now and then, no grace period), the daemon killed at a random moment of half
    of them. After each gc, killed or not, fsck is ok and the checkpoints retention
    keeps restore exactly; at the end every checkpoint either restores exactly or says
    it was pruned: nothing is lost or damaged, whichever way gc is cut short."""
    ws, canary = places
    untouched = fingerprint(canary)
    rng = random.Random(60)
    numbers = itertools.count()
    d = DaemonProcess(tmp_path / "root", ["--gc-grace", "0"]).start()
    c = d.client()
    agent = Agent(ws)
    kept: dict[str, dict] = {}
    order: list[str] = []
    try:
        sid = c.create_session(str(ws)).id
        for i in range(80):
            for _ in range(rng.randrange(1, 6)):
                agent.do(*_pick(rng, ws, next(numbers), canary))
            order.append(c.checkpoint(sid, label="L" if rng.random() < 0.1 else "").id)
            kept[order[-1]] = fingerprint(ws)
            if i % 7 != 6:
                continue
            k = rng.randrange(2, 6)
            last = [x.id for x in c.get_session(sid).log()][-k:]
            timer = arm_kill(d, rng, 0.5, 0.05)
            try:
                c.gc(keep_last=k, keep_labelled=rng.random() < 0.5)
            except Unavailable:
                pass  # killed: it did nothing, or all of it
            if timer is not None:
                c = restart_killed(d, timer, c)
            assert c.fsck()["ok"], f"round {i}"
            for cp_id in (x for x in last if x in kept):
                c.restore(sid, cp_id)
                assert differences(kept[cp_id], fingerprint(ws)) == [], f"round {i}: {cp_id}"
        restored = pruned = 0
        for cp_id in order:
            try:
                c.restore(sid, cp_id)
            except FailedPrecondition as exc:
                assert "pruned by retention" in str(exc), exc
                pruned += 1
                continue
            assert differences(kept[cp_id], fingerprint(ws)) == [], cp_id
            restored += 1
        assert pruned > 40 and restored >= 2
    finally:
        agent.close()
        c.close()
        d.stop()
    assert fingerprint(canary) == untouched
