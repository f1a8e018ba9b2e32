"""A small scripted agent (no model needed) that uses worldline the way a coding agent
would: it edits a real repository through tool calls and checkpoints after each,
meets an approval gate before an irreversible step, forks to try two approaches to a
bug, compares them with diff, and restores the better one.

    python examples/scripted_agent.py [--address unix:///path/to/worldline.sock]

It makes its repository in a temporary folder and prints what it did; exit 0 when
every step went as it should. At the end it deletes its sessions (their history stays
in worldline: `worldline session list --all`) and removes its folders, unless `--keep`
is given. An error (no daemon, an approval denied) is one line on stderr, exit 1.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from worldline.client import Client, WorldlineError, guarded, recorded, require_approval

CALC = '''def mean(values):
    return sum(values) / len(values) + 1  # the bug: off by one
'''
TEST = '''from calc import mean


def test_mean():
    assert mean([1, 2, 3]) == 2


def test_empty():
    assert mean([]) == 0
'''


def run_tests(repo: Path) -> bool:
    """The project's own tests, run as the agent's shell tool would run them."""
    code = ("import sys; sys.path.insert(0, '.'); import test_calc as t\n"
            "failed = 0\n"
            "for name in [n for n in dir(t) if n.startswith('test_')]:\n"
            "    try: getattr(t, name)()\n"
            "    except Exception: failed += 1\n"
            "sys.exit(1 if failed else 0)\n")
    return subprocess.run([sys.executable, "-c", code], cwd=repo).returncode == 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--address", help="the daemon's address (default: the usual one)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the sessions and folders (default: cleaned up at the end)")
    args = parser.parse_args(argv)
    repo = Path(tempfile.mkdtemp(prefix="worldline-example-"))
    (repo / "calc.py").write_text(CALC)
    (repo / "test_calc.py").write_text(TEST)
    sessions: list[str] = []
    try:
        with Client(args.address) as client:
            try:
                return run(client, repo, sessions)
            finally:
                if not args.keep:
                    clean_up(client, sessions)
    except WorldlineError as exc:  # expected failures: said in one line
        print(f"error: {exc.code}: {exc}", file=sys.stderr)
        return 1
    finally:
        if not args.keep:
            shutil.rmtree(repo, ignore_errors=True)


def clean_up(client: Client, sessions: list[str]) -> None:
    """Delete the example's sessions, forks first (their overlay views are unmounted,
    and their folders under the data root are the daemon's to keep)."""
    for sid in reversed(sessions):
        try:
            client.delete_session(sid)
        except WorldlineError as exc:
            print(f"could not delete session {sid}: {exc.code}: {exc}", file=sys.stderr)
    if sessions:
        print(f"deleted {len(sessions)} session(s); their history stays:"
              " `worldline session list --all`")


def run(client: Client, repo: Path, sessions: list[str]) -> int:
    session = client.create_session(str(repo), name="example: fix mean()")
    sessions.append(session.id)
    print(f"session {session.id} on {repo}")
    session.set_task("diagnose", "in_progress", title="Find why the tests fail")
    session.set_task("fix", "pending", title="Fix mean()")
    session.set_task("ship", "pending", title="Ship the fix")

    @recorded(session, name="shell")
    def shell_tests(command: str) -> dict:
        return {"passed": run_tests(repo)}

    @recorded(session, name="write_file")
    def write_file(path: str, text: str) -> dict:
        (repo / path).write_text(text)
        return {"bytes": len(text)}

    first = shell_tests("python -m pytest -q")
    print(f"tests before any fix: {'pass' if first['passed'] else 'fail'}")
    session.set_task("diagnose", "completed")
    base = session.checkpoint(label="diagnosed", reasoning="mean() adds 1; [] divides by 0",
                              messages=[{"role": "assistant",
                                         "content": "mean() is off by one"}])

    # A careless edit: guarded, so the failure puts the whole world back.
    try:
        with guarded(session, label="before a careless edit"):
            write_file("calc.py", "this is not python\n")
            if not run_tests(repo):
                raise RuntimeError("the careless edit broke everything")
    except RuntimeError as exc:
        print(f"guarded: {exc}; restored")
    assert (repo / "calc.py").read_text() == CALC

    # Two approaches from the same point, each in its own fork.
    approaches = {
        "A (drop the +1)": "def mean(values):\n    return sum(values) / len(values)\n",
        "B (drop the +1, empty is 0)": ("def mean(values):\n    if not values:\n"
                                        "        return 0\n"
                                        "    return sum(values) / len(values)\n"),
    }
    results = {}
    for name, code in approaches.items():
        fork = client.fork(base.id)
        sessions.append(fork.id)
        (Path(fork.workspace) / "calc.py").write_text(code)
        client.record_tool_call(fork.id, "write_file", {"path": "calc.py"})
        passed = run_tests(Path(fork.workspace))
        client.record_tool_call(fork.id, "shell", {"command": "python -m pytest -q"},
                                result={"passed": passed})
        cp = client.checkpoint(fork.id, label=f"approach {name}")
        results[name] = (passed, cp)
        print(f"approach {name}: tests {'pass' if passed else 'fail'}"
              f" (fork {fork.id}, diff {client.diff(base.id, cp.id).modified})")
    best_name, (best_passed, best_cp) = max(results.items(), key=lambda kv: kv[1][0])
    assert best_passed, "no approach passed"
    print(f"patch of the better approach, {best_name}:")
    print(client.diff(base.id, best_cp.id, patch=True).patch.rstrip())

    # Bring the better approach into the original session's world (a checkpoint of
    # the fork's history, outside this session's: said so explicitly).
    session.restore(best_cp.id, from_other_session=True)
    session.set_task("fix", "completed")
    assert run_tests(repo), "the restored fix should pass"

    # An irreversible step waits for an operator (here, a thread playing one).
    def operator():
        import time
        for _ in range(100):
            pending = client.list_approvals(session_id=session.id, status="pending")
            if pending:
                client.decide_approval(pending[0].id, approve=True, reason="tests pass")
                return
            time.sleep(0.05)
    threading.Thread(target=operator, daemon=True).start()
    approval = require_approval(session, "deploy", {"env": "staging"}, timeout=30)
    session.record_tool_call("deploy", {"env": "staging"}, effect="external_non_idempotent",
                             approval_id=approval.id)
    session.set_task("ship", "completed")
    final = session.checkpoint(label="shipped")
    tasks, resume = session.tasks()
    print(f"approved by an operator ({approval.reason}); tasks done, resume point: {resume}")
    print(f"history: {len(session.log())} checkpoints, head {final.id}")
    return 0 if resume is None else 1


if __name__ == "__main__":
    sys.exit(main())
