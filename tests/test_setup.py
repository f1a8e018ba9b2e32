"""The set-up a person runs: `make run`'s venv holds the runtime and nothing of the tests,
and the CLI it makes starts a daemon and answers."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]
TEST_ONLY = {"pytest", "pytest-xdist", "pytest-timeout", "hypothesis", "ruff", "moto",
             "boto3", "grpcio-tools", "langgraph", "langgraph-checkpoint-conformance"}


def _copy_tree(dest: Path) -> None:
    """The project as git sees it (tracked and untracked, not ignored): a fresh clone."""
    files = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"],
                           cwd=PROJECT, capture_output=True, check=True).stdout
    for rel in filter(None, files.decode().split("\0")):
        src = PROJECT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


def test_make_runs_venv_has_no_test_dependency_and_its_cli_works(tmp_path):
    clone = tmp_path / "clone"
    clone.mkdir()
    _copy_tree(clone)
    env = {k: v for k, v in os.environ.items() if not k.startswith("WORLDLINE_")}
    subprocess.run(["make", "runtime"], cwd=clone, env=env, check=True, timeout=300,
                   capture_output=True)
    listed = subprocess.run([str(clone / ".venv/bin/python"), "-m", "pip", "list",
                             "--format=freeze"], capture_output=True, text=True,
                            check=True).stdout
    installed = {line.split("==")[0].lower() for line in listed.splitlines()}
    assert "worldline" in installed
    assert not installed & TEST_ONLY, sorted(installed & TEST_ONLY)
    cli = str(clone / ".venv/bin/worldline")
    root = tmp_path / "root"
    address = f"unix://{root}/worldline.sock"
    daemon = subprocess.Popen([cli, "daemon", "--root", str(root)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        work = tmp_path / "work"
        work.mkdir()
        (work / "a.txt").write_text("hello\n")
        deadline = time.monotonic() + 30
        while True:
            out = subprocess.run([cli, "--address", address, "session", "create",
                                  "--workspace", str(work), "--json"], env=env,
                                 capture_output=True, text=True)
            if out.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert out.returncode == 0, out.stderr
        assert '"workspace"' in out.stdout
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)
