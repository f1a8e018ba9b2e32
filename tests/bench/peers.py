"""The peers worldline is measured against: git, cp -a, docker commit, restic, borg, rsync."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from .trees import du_bytes, edit, pick_files

GIT_ENV = {**os.environ, "GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "bench@example.com",
           "GIT_COMMITTER_NAME": "bench", "GIT_COMMITTER_EMAIL": "bench@example.com",
           "GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "safe.directory",
           "GIT_CONFIG_VALUE_0": "*"}
APT = {"git": "git", "restic": "restic", "borg": "borgbackup", "rsync": "rsync"}


def run(cmd: list[str] | str, cwd: Path | None = None, env: dict | None = None) -> None:
    subprocess.run(cmd, cwd=cwd, env=env or GIT_ENV, check=True, shell=isinstance(cmd, str),
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def ensure_installed() -> dict[str, str]:
    """Install missing peers with apt (as root); return {peer: why it is skipped}."""
    missing = [tool for tool in APT if shutil.which(tool) is None]
    if missing and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], env=env, check=False,
                       stdout=subprocess.DEVNULL)
        subprocess.run(["apt-get", "install", "-y", "-qq", *(APT[t] for t in missing)], env=env,
                       check=False, stdout=subprocess.DEVNULL)
    skipped = {t: "not installed and apt could not install it" for t in APT
               if shutil.which(t) is None}
    if shutil.which("docker") is None or subprocess.run(
            ["docker", "info"], capture_output=True).returncode != 0:
        skipped["docker"] = "no Docker engine answers (make docker starts one)"
    return skipped


def git_init(repo: Path) -> None:
    run(["git", "init", "-q"], repo)
    run(["git", "config", "gc.auto", "0"], repo)
    run(["git", "add", "-A"], repo)
    run(["git", "commit", "-q", "-m", "initial"], repo)


def git_commit(repo: Path, message: str) -> None:
    run(f"git add -A && git commit -q -m '{message}'", repo)


def docker_commit_growth(django: Path, work: Path) -> tuple[int, int] | str:
    """Disk the engine adds per `docker commit` of a container holding the tree in its
    writable layer, after 3-file edits inside it: (bytes added, commits made)."""
    if shutil.which("docker") is None or subprocess.run(
            ["docker", "info"], capture_output=True).returncode != 0:
        return "no Docker engine"
    commits = int(os.environ.get("BENCH_DOCKER_COMMITS", "100"))
    name = f"wl-bench-storage-{os.getpid()}"
    image = "worldline/busybox:latest"
    run(["docker", "rm", "-f", name], env=os.environ) if _exists(name) else None
    run(["docker", "run", "-d", "--name", name, image, "sleep", "100000"], env=os.environ)
    try:
        run(["docker", "cp", str(django), f"{name}:/work/django"], env=os.environ)
        root = Path(subprocess.run(["docker", "info", "-f", "{{.DockerRootDir}}"],
                                   capture_output=True, text=True).stdout.strip())
        before = du_bytes(root)
        import random
        rng = random.Random(5)
        for i in range(commits):
            files = pick_files(django, rng)
            script = "; ".join(f"echo '# docker {i}' >> '/work/django/{f}'" for f in files)
            run(["docker", "exec", name, "sh", "-c", script], env=os.environ)
            run(["docker", "commit", name, f"wl-bench-storage:{i}"], env=os.environ)
        growth = du_bytes(root) - before
    finally:
        run(["docker", "rm", "-f", name], env=os.environ)
        ids = subprocess.run(["docker", "images", "-q", "wl-bench-storage"],
                             capture_output=True, text=True).stdout.split()
        if ids:
            subprocess.run(["docker", "rmi", "-f", *ids], capture_output=True)
    return growth, commits


def _exists(container: str) -> bool:
    return subprocess.run(["docker", "inspect", container], capture_output=True).returncode == 0


def context_peers(django: Path, work: Path, rounds: int) -> dict:
    """restic backup, borg create and rsync --link-dest of a 3-file edit (not targets)."""
    from .run import Stat, stat
    out: dict[str, Stat] = {}
    src = work / "context-src"
    subprocess.run(["cp", "-a", str(django), str(src)], check=True)
    env = {**os.environ, "RESTIC_PASSWORD": "bench", "BORG_PASSPHRASE": "",
           "BORG_UNKNOWN_UNENCRYPTED_REPO_ACCESS_IS_OK": "yes",
           "BORG_RELOCATED_REPO_ACCESS_IS_OK": "yes"}
    tools = {}
    if shutil.which("restic"):
        repo = work / "restic"
        run(["restic", "init", "-q", "--repo", str(repo)], env=env)
        run(["restic", "backup", "-q", "--repo", str(repo), str(src)], env=env)
        tools["restic backup"] = lambda i, repo=repo: run(
            ["restic", "backup", "-q", "--repo", str(repo), str(src)], env=env)
    if shutil.which("borg"):
        repo = work / "borg"
        run(["borg", "init", "--encryption=none", str(repo)], env=env)
        run(["borg", "create", f"{repo}::a0", str(src)], env=env)
        tools["borg create"] = lambda i, repo=repo: run(
            ["borg", "create", f"{repo}::b{i}", str(src)], env=env)
    if shutil.which("rsync"):
        snaps = work / "rsync"
        snaps.mkdir()
        run(["rsync", "-a", f"{src}/", str(snaps / "s0")], env=env)
        tools["rsync --link-dest"] = lambda i: run(
            ["rsync", "-a", f"--link-dest={snaps / f's{i}'}", f"{src}/", str(snaps / f"s{i + 1}")],
            env=env)
    import random
    rng = random.Random(3)
    samples: dict[str, list[float]] = {k: [] for k in tools}
    for i in range(rounds):
        edit(src, pick_files(django, rng), f"context {i}")
        for name, fn in tools.items():
            t = time.perf_counter()
            fn(i)
            samples[name].append(time.perf_counter() - t)
    for name, xs in samples.items():
        out[name] = stat(xs)
    return out
