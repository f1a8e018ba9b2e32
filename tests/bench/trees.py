"""The benchmark's trees: Django 5.2.8's source distribution and a generated wide tree."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

DJANGO = "django==5.2.8"


def django_tree(cache: Path) -> Path:
    """The unpacked sdist (6,890 files, 72 MB), downloaded once into ``cache``."""
    target = cache / "django-5.2.8"
    if target.is_dir():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    archive = cache / "django-5.2.8.tar.gz"
    if not archive.exists():
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                        "--no-binary", ":all:", DJANGO, "-d", str(cache)], check=True)
    # --no-same-owner: as root, tar would otherwise keep the archive's uids
    subprocess.run(["tar", "xzf", str(archive), "--no-same-owner", "-C", str(cache)], check=True)
    return target


def wide_tree(cache: Path, files: int = 100_000, seed: int = 1) -> Path:
    """``files`` small files in nested folders, the same for the same seed."""
    target = cache / f"wide-{files}-{seed}"
    if (target / ".complete").exists():
        return target
    shutil.rmtree(target, ignore_errors=True)
    rng = random.Random(seed)
    made: set[Path] = set()
    for i in range(files):
        folder = target / f"d{i % 100:02d}" / f"e{(i // 100) % 10}" / f"f{(i // 1000) % 10}"
        if folder not in made:
            folder.mkdir(parents=True, exist_ok=True)
            made.add(folder)
        (folder / f"file{i}.py").write_bytes(rng.randbytes(rng.randint(40, 400)).hex().encode())
    (target / ".complete").write_text("")
    return target


def copy_tree(src: Path, dst: Path) -> Path:
    subprocess.run(["cp", "-a", str(src), str(dst)], check=True)
    marker = dst / ".complete"
    if marker.exists():
        marker.unlink()
    return dst


def pick_files(tree: Path, rng: random.Random, pattern: str = "*.py", count: int = 3,
               _cache: dict = {}) -> list[str]:  # noqa: B006 - a deliberate memo
    key = (str(tree), pattern)
    if key not in _cache:
        _cache[key] = sorted(str(p.relative_to(tree)) for p in tree.rglob(pattern)
                             if p.is_file())
    return rng.sample(_cache[key], count)


def edit(tree: Path, rel_paths: list[str], tag: str) -> None:
    """A tool call: append a line to each file."""
    for rel in rel_paths:
        with open(tree / rel, "a") as f:
            f.write(f"# {tag}\n")


def du_files(path: Path) -> dict[str, int]:
    """Bytes of disk each file below ``path`` uses, by its path relative to ``path``."""
    out = {}
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            full = os.path.join(dirpath, name)
            try:
                out[os.path.relpath(full, path)] = os.lstat(full).st_blocks * 512
            except FileNotFoundError:
                pass
    return out


def growth_by_file(before: dict[str, int], after: dict[str, int], top: int = 4) -> str:
    """The files that grew (or shrank) most between two ``du_files``, as "path +N KiB"."""
    change = {k: after.get(k, 0) - before.get(k, 0) for k in set(before) | set(after)}
    moved = sorted((k for k, v in change.items() if v), key=lambda k: -abs(change[k]))
    parts = [f"{k} {change[k] / 1024:+.0f} KiB" for k in moved[:top]]
    if len(moved) > top:
        rest = sum(change[k] for k in moved[top:])
        parts.append(f"{len(moved) - top} more {rest / 1024:+.0f} KiB")
    return ", ".join(parts) or "nothing"


def du_bytes(path: Path) -> int:
    """Bytes of disk the folder uses (allocated blocks, as `du` counts them)."""
    return sum(du_files(path).values())
