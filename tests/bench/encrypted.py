"""The encrypted case: checkpoint-small and history-400 on a daemon started with
`--encryption-key FILE` (32 random bytes). checkpoint-small's rounds run beside a twin
daemon started the same way without a key, alternated (which goes first swaps each
round), so that both sides see the same moments of this shared machine (a few seconds
more); its own row is shown for context. history-400's replay (minutes) is held
against history-400's row in this run, which is run first when it was not; its
storage with a key against git's aggressive pack of the same commits (the history
case's).

Then canaries: distinct random strings written into a workspace file (between random
bytes, which no compression shrinks, so the clear text of the file keeps them), the
conversation, the state, and a tool call's arguments and result, each checkpointed;
then every file under the data root (blobs, packs, SQLite databases with their
write-ahead logs) is read for them, once right after and once after the daemon has
settled. Any canary found under the keyed daemon's root is a failure. The same is done
on the twin without a key, as the control: a canary the control does not show either
proves nothing, and the note says so. A canary in a file's name is looked for too,
for context (no target).

A daemon that does not list `--encryption-key` in `worldline daemon --help` makes the
case skipped, with that reason, and no figure.
"""

from __future__ import annotations

import os
import random
import secrets
import shutil
import subprocess
import time
from pathlib import Path

from ..conftest import WORLDLINE, DaemonProcess
from . import history
from .trees import copy_tree, edit, pick_files

FLAG = "--encryption-key"
CHANNELS = ("file content", "conversation", "state", "tool arguments", "tool result")
CONTEXT = "file name"  # looked for, shown, not a target


def unsupported() -> str | None:
    """Why this build's daemon cannot run the case, or None."""
    out = subprocess.run(WORLDLINE + ["daemon", "--help"], capture_output=True, text=True)
    if FLAG not in out.stdout:
        return f"this daemon has no {FLAG} (`worldline daemon --help` does not list it)"
    return None


def key_file(folder: Path) -> Path:
    path = folder / "encryption.key"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(secrets.token_bytes(32))
    return path


class Twins:
    """Two daemons with data roots of their own, one started with ``keyed`` arguments
    (``--encryption-key FILE``) and one without."""

    def __init__(self, run: Path, name: str, keyed: list[str]) -> None:
        self.roots = {}
        self.daemons = {}
        for side, extra in (("plain", []), ("keyed", keyed)):
            root = run / f"{name}-{side}-data"
            shutil.rmtree(root, ignore_errors=True)
            self.roots[side] = root
            self.daemons[side] = DaemonProcess(root, extra)
        self.clients = {}

    def __enter__(self) -> Twins:
        for side, daemon in self.daemons.items():
            daemon.start()
            self.clients[side] = daemon.client()
        return self

    def __exit__(self, *exc) -> None:
        for side, daemon in self.daemons.items():
            if side in self.clients:
                self.clients[side].close()
            daemon.stop()


def sides(i: int) -> tuple[str, str]:
    """Which side goes first in round ``i``: they take turns."""
    return ("plain", "keyed") if i % 2 == 0 else ("keyed", "plain")


def checkpoint_small(bench, twins: Twins) -> tuple[dict[str, list[float]], dict]:
    """checkpoint-small's rounds on both twins, alternated: seconds per side, and the
    sessions (for the canaries)."""
    from .run import ROUNDS, WARMUP, timed
    sessions = {}
    for side in twins.clients:
        ws = copy_tree(bench.django, bench.run_dir / f"encrypted-small-{side}")
        sessions[side] = twins.clients[side].create_session(str(ws))
        sessions[side].checkpoint()
    rng = random.Random(42)
    samples: dict[str, list[float]] = {side: [] for side in sessions}
    for i in range(WARMUP + ROUNDS):
        files = pick_files(bench.django, rng)
        for side in sides(i):
            os.sync()  # neither side's flush pays for the other's writes (run.checkpoint_case)
            edit(Path(sessions[side].workspace), files, f"encrypted {i}")
            took = timed(sessions[side].checkpoint)
            if i >= WARMUP:
                samples[side].append(took)
    return samples, sessions


def history_400(bench, keyed: list[str]) -> tuple[list[float], int, list[str]]:
    """history-400's replay on a daemon of its own started with ``keyed``: seconds per
    checkpoint, `blobs/` + `meta.db` once settled, and the sampled restores that differ
    from `git ls-tree -r`."""
    from .run import settle, timed
    repo, commits = history.source(bench.cache)
    ws, root = bench.run_dir / "encrypted-history", bench.run_dir / "encrypted-history-data"
    for folder in (ws, root):
        shutil.rmtree(folder, ignore_errors=True)
    replay = history.Replay(repo, ws, bench.run_dir / "encrypted-history.index")
    replay.first(commits[0])
    daemon = DaemonProcess(root, keyed).start()
    try:
        with daemon.client() as client:
            session = client.create_session(str(ws))
            heads, samples = [session.head], []
            for prev, commit in zip(commits, commits[1:], strict=False):
                replay.step(prev, commit)
                samples.append(timed(session.checkpoint))
                heads.append(session.head)
            settle(root)
            size = history.size_of(root)
            wrong = []
            for i in (len(commits) // 3, 2 * len(commits) // 3):  # the keyed store reads back
                session.restore(heads[i], acknowledge_side_effects=True)
                want = {os.fsdecode(k): v for k, v in history.git_tree(repo, commits[i]).items()}
                if history.work_tree(ws) != want:
                    wrong.append(commits[i][:12])
    finally:
        daemon.stop()
    return samples, size, wrong


def plant(session, canaries: dict[str, str]) -> None:
    """Each canary written where its channel says, and checkpointed."""
    ws = Path(session.workspace)
    (ws / "canary.bin").write_bytes(os.urandom(4096) + canaries["file content"].encode()
                                    + os.urandom(4096))
    (ws / f"{canaries[CONTEXT]}.txt").write_text("a file whose name is the canary\n")
    session.record_tool_call("bench.echo", args={"text": canaries["tool arguments"]},
                             result={"text": canaries["tool result"]})
    session.checkpoint(messages=[{"role": "user", "content": canaries["conversation"]}],
                       state={"note": canaries["state"]})


def found(root: Path, canaries: dict[str, str]) -> dict[str, list[str]]:
    """channel -> the files under ``root`` holding its canary in the clear."""
    wanted = {channel: text.encode() for channel, text in canaries.items()}
    hits: dict[str, list[str]] = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            try:
                with open(path, "rb") as f:
                    data = f.read()
            except OSError:  # a socket, or a file gone meanwhile
                continue
            for channel, needle in wanted.items():
                if needle in data:
                    hits.setdefault(channel, []).append(os.path.relpath(path, root))
    return hits


def canary_check(twins: Twins, sessions: dict) -> dict[str, dict[str, list[str]]]:
    """side -> channel -> files holding that side's canary, read right after the
    canaries' checkpoint and again once the daemon settled (write-ahead logs moved
    into their databases)."""
    from .run import settle
    planted = {}
    for side, session in sessions.items():
        planted[side] = {c: f"wlcanary{secrets.token_hex(12)}" for c in (*CHANNELS, CONTEXT)}
        plant(session, planted[side])
    hits: dict[str, dict[str, list[str]]] = {side: {} for side in sessions}
    for moment in ("now", "settled"):
        for side, root in twins.roots.items():
            if moment == "settled":
                settle(root)
            for channel, files in found(root, planted[side]).items():
                hits[side].setdefault(channel, [])
                hits[side][channel] += [f for f in files if f not in hits[side][channel]]
    return hits


def measure(bench, keyed: list[str]) -> dict:
    """The case's figures, the keyed daemons started with ``keyed`` arguments."""
    from .run import stat
    out: dict = {}
    with Twins(bench.run_dir, "encrypted-small", keyed) as twins:
        t = time.monotonic()
        samples, sessions = checkpoint_small(bench, twins)
        out["small"] = {side: stat(xs) for side, xs in samples.items()}
        out["canaries"] = canary_check(twins, sessions)
        out["small_s"] = time.monotonic() - t
    t = time.monotonic()
    plain = bench.by_name.get("history-400")
    if plain is None or plain.worldline is None:  # not run in this run, or it failed
        plain = bench.history_case()
    out["history_plain"] = plain
    out["history_plain_s"] = time.monotonic() - t
    t = time.monotonic()
    samples, out["size"], out["wrong"] = history_400(bench, keyed)
    out["history"] = stat(samples)
    out["history_s"] = time.monotonic() - t
    out["git_pack"] = history.git_pack(bench)  # the history case's, made above if not before
    return out


def case(bench):
    from .run import Case, Stat
    measured = "checkpoint-small and history-400 on a daemon with --encryption-key"
    target = ("≤ 1.2 × each without a key; history-400's storage ≤ 2 × git's pack; no"
              " canary in the clear in the data root")
    why = unsupported()
    if why:
        return Case("encrypted", measured, None, {}, None, "", target, None,
                    f"skipped: {why}")
    out = measure(bench, [FLAG, str(key_file(bench.run_dir))])
    small, hist, plain = out["small"], out["history"], out["history_plain"]
    ratio = small["keyed"].median / small["plain"].median
    hist_ratio = hist.median / plain.worldline.median
    storage_ratio = out["size"] / max(out["git_pack"], 1)
    plain_size = plain.peers.get("blobs/ + meta.db after idle")
    leaks = {c: f for c, f in out["canaries"]["keyed"].items() if c in CHANNELS}
    control = out["canaries"]["plain"]
    unproven = [c for c in CHANNELS if c not in control]
    checks = {
        f"checkpoint-small {ratio:.2f} × without a key (≤ 1.2)": ratio <= 1.2,
        f"history-400 {hist_ratio:.2f} × without a key (≤ 1.2)": hist_ratio <= 1.2,
        f"history-400's storage {storage_ratio:.2f} × git's pack (≤ 2)": storage_ratio <= 2.0,
        "no canary in the clear" + (
            "" if not leaks else ": FOUND " + "; ".join(
                f"{c} in {', '.join(sorted(f)[:3])}" for c, f in leaks.items())): not leaks,
        "the keyed history's sampled restores equal git" + (
            f": DIFFER at {out['wrong']}" if out["wrong"] else ""): not out["wrong"],
    }
    peers = {"checkpoint-small without a key (twin daemon, alternated)": small["plain"],
             "history-400 with a key": hist,
             "history-400 without a key (its row in this run)": plain.worldline,
             "history-400 with a key: blobs/ + meta.db after idle":
                 Stat(out["size"], out["size"], 1, "bytes"),
             "git gc --aggressive pack": Stat(out["git_pack"], out["git_pack"], 1, "bytes")}
    if plain_size is not None:
        peers["history-400 without a key: blobs/ + meta.db after idle"] = plain_size
    row = bench.by_name.get("checkpoint-small")
    if row is not None and row.worldline is not None:
        peers["checkpoint-small's own row in this run (context)"] = row.worldline

    def shown(hits: dict) -> str:
        files = sorted(hits.get(CONTEXT, []))
        return f"in the clear in {', '.join(files[:3])}" if files else "not found"

    note = ("; ".join(f"{k} {'ok' if v else 'MISSED'}" for k, v in checks.items())
            + ". Canaries in the control without a key: "
            + (", ".join(f"{c} found" for c in CHANNELS if c in control) or "none found")
            + (f"; not shown by the control, so not proven by the check: {', '.join(unproven)}"
               if unproven else "")
            + f". A canary file name (context, no target): with a key"
            f" {shown(out['canaries']['keyed'])}, without {shown(control)}."
            f" checkpoint-small's rounds alternate with a twin daemon without a key;"
            f" history-400's replay is held against its own row in this run."
            f" Times: checkpoint-small twins and canaries {out['small_s']:.0f} s, the keyed"
            f" replay {out['history_s']:.0f} s, history-400 run for it"
            f" {out['history_plain_s']:.0f} s (0 when it ran before). Shared 2-core machine:"
            f" noisy.")
    return Case("encrypted", measured, small["keyed"], peers, round(ratio, 4),
                "with a key / without (checkpoint-small)", target, all(checks.values()), note)
