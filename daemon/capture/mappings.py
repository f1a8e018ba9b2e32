"""Files a container's processes have mapped shared and writable.

A write through ``mmap(MAP_SHARED)`` gives no inotify event, and its file's time moves
only when a page first becomes writable (a write to a page already dirty changes
nothing a stat shows). So while its container is paused, a checkpoint asks the kernel
which files the container's processes map shared and writable (``rw?s`` in
``/proc/PID/maps``), and reads each of them again whatever the stat cache says, and
keeps no stat cache entry for it (its next write may again leave its stat as it is).
The end of a mapping is the file's last close, which the tracker reports
(``IN_CLOSE_WRITE``): the checkpoint after it reads the file again too.

The container's processes are its cgroup's (the freezer's on cgroup v1, the unified
hierarchy's on v2), which a process in the container cannot leave. A path is taken as
the kernel names the mapped file, as the process sees it; it is only a name to look at
again, walked below the layer's root like any dirty path (never followed through a
symlink), so a name the agent chose can at worst make a checkpoint read a file of its
own once more. A mapped file is matched to a layer by its device: the container's
view (overlayfs reports the view's device) or the bind-mounted workspace's, below the
folder the workspace is mounted at. Everything else mapped (``/dev/shm``, volumes,
files deleted since) is outside the world.

Processes on the host that map a workspace's file are not seen here: SECURITY.md, threat
model.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass

MAX_CGROUP_DEPTH = 32  # nested cgroups below the container's are walked this deep
DELETED = " (deleted)"


@dataclass(frozen=True)
class Mapped:
    """A file mapped shared and writable: its device and its name in the process's view."""

    dev: int
    path: str


def cgroup_folder(pid: int, mountinfo: str = "/proc/self/mountinfo") -> str | None:
    """The folder of the cgroup holding ``pid`` that holds all of its container: the
    freezer's (what ``docker pause`` freezes on cgroup v1), else the unified one's."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            lines = f.read().splitlines()
    except (FileNotFoundError, ProcessLookupError):
        return None
    mounts = _cgroup_mounts(mountinfo)
    chosen = None
    for line in lines:
        number, controllers, path = line.split(":", 2)
        if "freezer" in controllers.split(",") and "freezer" in mounts:
            chosen = os.path.join(mounts["freezer"], path.lstrip("/"))
            break
        if number == "0" and controllers == "" and "" in mounts:
            chosen = os.path.join(mounts[""], path.lstrip("/"))
    return chosen


@functools.lru_cache(maxsize=4)
def _cgroup_mounts(mountinfo: str) -> dict[str, str]:
    """Mount points of the cgroup hierarchies: "freezer" for v1's, "" for v2's."""
    found: dict[str, str] = {}
    with open(mountinfo) as f:
        for line in f:
            before, _, after = line.partition(" - ")
            fstype, _source, options = (after.split() + ["", "", ""])[:3]
            point = _unescape(before.split()[4])
            if fstype == "cgroup2":
                found.setdefault("", point)
            elif fstype == "cgroup" and "freezer" in options.split(","):
                found.setdefault("freezer", point)
    return found


def _unescape(field: str) -> str:
    """A mountinfo field: space, tab, newline and backslash come octal-escaped."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def processes(folder: str) -> list[int]:
    """Every process in the cgroup at ``folder`` and the cgroups below it."""
    pids: list[int] = []
    stack = [(folder, 0)]
    while stack:
        path, depth = stack.pop()
        try:
            with open(os.path.join(path, "cgroup.procs")) as f:
                pids.extend(int(p) for p in f.read().split())
            if depth < MAX_CGROUP_DEPTH:
                with os.scandir(path) as it:
                    stack.extend((e.path, depth + 1) for e in it
                                 if e.is_dir(follow_symlinks=False))
        except (FileNotFoundError, NotADirectoryError):
            continue  # removed meanwhile
    return pids


# A line of /proc/PID/maps mapping a file shared and writable: its address span, the
# file's device and inode (matched in C: a process may have tens of thousands of lines)
_SHARED_WRITABLE = re.compile(rb"^([0-9a-f]+-[0-9a-f]+) rw[-x]s [0-9a-f]+ ([0-9a-f]+:[0-9a-f]+)"
                              rb" ([0-9]+) ", re.M)


def shared_writable(pids: Iterable[int]) -> list[Mapped]:
    """The files the processes ``pids`` map shared and writable. The name is read from
    ``map_files`` (as the kernel names the file, unescaped); a process gone meanwhile
    maps nothing."""
    found: list[Mapped] = []
    seen: set[tuple[int, int]] = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps", "rb") as f:
                data = f.read()
        except (FileNotFoundError, ProcessLookupError):
            continue
        for match in _SHARED_WRITABLE.finditer(data):
            span, device, inode = match.groups()
            major, minor = (int(x, 16) for x in device.split(b":"))
            key = (os.makedev(major, minor), int(inode))
            if key[1] == 0 or key in seen:
                continue
            seen.add(key)
            try:
                path = os.readlink(f"/proc/{pid}/map_files/{span.decode()}")
            except (FileNotFoundError, ProcessLookupError):
                continue  # unmapped, or the process gone, meanwhile
            found.append(Mapped(key[0], path))
    return found


def layer_paths(mapped: Iterable[Mapped], view_dev: int | None, upper: str,
                workspace_dev: int | None, workspace_mounts: Iterable[str]
                ) -> tuple[set[str], set[str]]:
    """The mapped files that are in the world: (workspace paths, container paths),
    relative to each layer's root. A name that ends in " (deleted)" is both that name
    (a file may be called so) and the name without it (a file deleted since, whose
    place another may have taken): looking again at one more name costs a stat."""
    workspace: set[str] = set()
    container: set[str] = set()
    mounts = [m.rstrip("/") for m in workspace_mounts if m.startswith("/")]
    for m in mapped:
        names = [m.path]
        if m.path.endswith(DELETED):
            names.append(m.path[:-len(DELETED)])
        for name in names:
            if not name.startswith("/"):
                continue
            if m.dev == workspace_dev:
                for mount in mounts:
                    if name.startswith(mount + "/"):
                        workspace.add(name[len(mount) + 1:])
            if m.dev == view_dev:
                container.add(name.lstrip("/"))
            elif name.startswith(upper.rstrip("/") + "/"):
                # kernels before 6.6 name an overlay file's mapping by its upper file
                container.add(name[len(upper.rstrip("/")) + 1:])
    return ({p for p in workspace if _plain(p)}, {p for p in container if _plain(p)})


def _plain(rel: str) -> bool:
    """A relative path of names (no "", ".", ".."): what a dirty path must be."""
    return bool(rel) and all(part not in ("", ".", "..") for part in rel.split("/"))


def of_container(attrs: dict, workspace: str, workspace_dev: int | None
                 ) -> tuple[frozenset[str], frozenset[str]]:
    """The files of the world that a paused container's processes map shared and
    writable: (workspace paths, container layer paths). ``attrs``: the engine's
    ``inspect`` of the container; ``workspace``: the session's folder (the real path
    its bind mounts name); ``workspace_dev``: its device."""
    state = attrs.get("State") or {}
    pid = int(state.get("Pid") or 0)
    if not state.get("Running") or pid <= 0:
        return frozenset(), frozenset()
    folder = cgroup_folder(pid)
    if folder is not None and not os.path.isdir(folder):
        _cgroup_mounts.cache_clear()  # the hierarchies were mounted again
        folder = cgroup_folder(pid)
    mapped = shared_writable(processes(folder) if folder else [pid])
    if not mapped:
        return frozenset(), frozenset()
    data = (attrs.get("GraphDriver") or {}).get("Data") or {}
    upper, merged = data.get("UpperDir") or "", data.get("MergedDir") or ""
    try:
        view_dev = os.stat(merged).st_dev if merged else None
    except OSError:
        view_dev = None  # unmounted: the container is not running any more
    mounts = [m.get("Destination") or "" for m in attrs.get("Mounts") or []
              if m.get("Type") == "bind"
              and os.path.realpath(m.get("Source") or "") == workspace]
    work, box = layer_paths(mapped, view_dev, upper, workspace_dev, mounts)
    return frozenset(work), frozenset(box)
