"""What sealing the metadata costs: checkpoints with a data key against without.

    .venv/bin/python -m tests.sealed_cost [ROUNDS]

Two daemons run side by side (a real daemon each, over a real socket), one whose
stores have a data key (tests.test_sealed_meta.KeyedDaemon) and one started the same
way without; the
rounds alternate between them, so both see the same load of a shared machine. A
round is bench's checkpoint-small: three files edited, then a checkpoint (with two
messages and a label, which are sealed). Then the history: ``log`` of the session
(every checkpoint's row read and opened). Then the store alone, without the daemon's
capture around it: ``SqliteStore.append_checkpoint`` of four messages and an audit
event, and ``conversation`` read back. Medians, and the ratio keyed / clear; and the
size of each daemon's meta.db once stopped.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from worldline.daemon import ids
from worldline.daemon.records import AuditEvent
from worldline.daemon.storage.sqlite_store import SqliteStore

from .test_sealed_meta import KEY, KeyedDaemon
from .test_store_contract import make_cp, new_session


def _median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def _report(what: str, keyed: list[float], clear: list[float]) -> None:
    k, c = _median_ms(keyed), _median_ms(clear)
    print(f"{what:<44} keyed {k:8.3f} ms   clear {c:8.3f} ms   ratio {k / c:5.2f}")


def daemons(rounds: int, tmp: Path) -> None:
    started = {name: KeyedDaemon(tmp / name, key).start() for name, key in
               (("keyed", bytes(range(32))), ("clear", None))}
    try:
        clients = {name: d.client() for name, d in started.items()}
        sessions = {}
        for name, client in clients.items():
            ws = tmp / f"ws-{name}"
            ws.mkdir()
            for i in range(20):
                (ws / f"f{i}.txt").write_text(f"file {i}\n" * 50)
            sessions[name] = (ws, client.create_session(str(ws)).id)
        times: dict[str, list[float]] = {name: [] for name in clients}
        for r in range(rounds):
            for name, client in clients.items():
                ws, session = sessions[name]
                for i in range(3):
                    (ws / f"f{i}.txt").write_text(f"round {r} file {i}\n" * 50)
                messages = [{"role": "user", "content": f"round {r}: " + "x" * 300},
                            {"role": "assistant", "content": "y" * 300}]
                t = time.perf_counter()
                client.checkpoint(session, label=f"round {r}", messages=messages)
                times[name].append(time.perf_counter() - t)
        _report("daemon: checkpoint after a 3-file edit", times["keyed"], times["clear"])
        logs: dict[str, list[float]] = {name: [] for name in clients}
        for _ in range(10):
            for name, client in clients.items():
                t = time.perf_counter()
                client.log(sessions[name][1])
                logs[name].append(time.perf_counter() - t)
        _report(f"daemon: log of {rounds + 1} checkpoints", logs["keyed"], logs["clear"])
    finally:
        for d in started.values():
            d.stop()
    sizes = {name: sum(p.stat().st_size for p in (tmp / name).iterdir()
                       if p.name.startswith("meta.db")) for name in started}
    print(f"{'daemon: meta.db (its pack included), stopped':<44} keyed {sizes['keyed']:8d} B"
          f"    clear {sizes['clear']:8d} B    ratio {sizes['keyed'] / sizes['clear']:5.2f}")


def stores(rounds: int, tmp: Path) -> None:
    opened = {"keyed": SqliteStore(str(tmp / "keyed.db"), key=KEY),
              "clear": SqliteStore(str(tmp / "clear.db"))}
    try:
        heads = {name: new_session(s) for name, s in opened.items()}
        writes: dict[str, list[float]] = {name: [] for name in opened}
        reads: dict[str, list[float]] = {name: [] for name in opened}
        messages = [json.dumps({"role": "user", "content": "x" * 300})] * 4
        for _ in range(rounds):
            for name, store in opened.items():
                session, head = heads[name]
                cp = make_cp(session.id, head.id, n_msgs=4)
                t = time.perf_counter()
                cp = store.append_checkpoint(cp, messages, head.id, None, [AuditEvent(
                    "checkpoint", session.id, cp.id, {"label": "l"}, ids.now())])
                writes[name].append(time.perf_counter() - t)
                heads[name] = (session, cp)
                t = time.perf_counter()
                store.get_checkpoint(cp.id)
                store.conversation(cp.id)
                reads[name].append(time.perf_counter() - t)
        _report("store: append_checkpoint (4 messages)", writes["keyed"], writes["clear"])
        _report("store: get_checkpoint + conversation", reads["keyed"], reads["clear"])
    finally:
        for s in opened.values():
            s.close()


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    with tempfile.TemporaryDirectory(prefix="sealed-cost-") as tmp:
        daemons(rounds, Path(tmp))
        stores(rounds * 4, Path(tmp))


if __name__ == "__main__":
    main()
