"""Containers: a session's Docker container, captured from its writable layer.

What is captured: the container's writable layer, read straight from overlay2's
upper folder. Files and folders the container wrote, whiteouts for the image files
it deleted, and opaque folders are captured, with change tracking like a
workspace, so a checkpoint reads what the tool call changed, never the whole layer
and never through `docker commit`. The container is paused only while its layer
(and the bind-mounted workspace) are read. Not captured: bind mounts and volumes
(the workspace is the workspace snapshot's business), and process memory (a
restore restarts the container's processes).

- Restore stops the container, makes its upper folder equal to the checkpoint's
  layer, and starts it again: same container, same name, mounts, env, command and
  network. Its processes restart. The stop waits for a first process that handles
  its stop signal (5 s at most, as `docker stop -t 5`), and kills at once one that
  would drop it (stopping.py).
- Fork creates a new container from the same image and configuration, with the
  fork's workspace mounted where the original's was, writes the checkpoint's layer
  into its upper folder before the first start, and starts it. Every container and
  image worldline makes is labelled with its session (and checkpoint), so nothing
  is ever orphaned unnoticed; a fork is always image + one layer, however deep the
  forks of forks go, so the engine's layer limit is never reached.
- Engine failures are ``Unavailable``; a container that vanished behind the
  daemon's back is ``FailedPrecondition``, saying so.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import os
import re
import threading
from typing import Iterator

from worldline.wire.errors import FailedPrecondition, NotFound, Unavailable

from .resolve import (
    RESOLVE_BENEATH,
    RESOLVE_NO_MAGICLINKS,
    RESOLVE_NO_SYMLINKS,
    identity_of,
    openat2,
)
from .stopping import ignores_stop_signal

log = logging.getLogger(__name__)

LABEL_MANAGED = "io.worldline.managed"
LABEL_SESSION = "io.worldline.session"
LABEL_CHECKPOINT = "io.worldline.checkpoint"
LABEL_ROOT = "io.worldline.root"  # the data root that made it: daemons sharing an engine
                                  # clean up only their own
DEFAULT_MOUNT = "/workspace"
# The parts of a container's Config that say how it was created (the rest, such as
# the attach flags' defaults, the engine fills in the same way again).
_CONFIG_KEYS = ("Hostname", "Domainname", "User", "Env", "Cmd", "Entrypoint", "WorkingDir",
                "Labels", "Tty", "OpenStdin", "StdinOnce", "ExposedPorts", "StopSignal",
                "StopTimeout", "Healthcheck", "Image", "Volumes", "Shell", "NetworkDisabled",
                "MacAddress", "ArgsEscaped", "OnBuild")


def extra_mounts(spec: dict, workspace: str) -> list[str]:
    """The mounts of a container spec other than the workspace, described for a person."""
    out = []
    for mount in spec.get("Mounts") or []:
        kind, source = mount.get("Type"), mount.get("Source") or ""
        if kind == "bind" and os.path.realpath(source) == workspace:
            continue
        if kind == "tmpfs":
            continue  # empty at every start: nothing to share
        what = f"volume {mount.get('Name')}" if kind == "volume" else f"{kind} {source}"
        out.append(f"{what} at {mount.get('Destination') or mount.get('Target')}")
    return out


def _write_mark(mark: str, container: str) -> None:
    with open(mark, "w") as f:
        f.write(container)


_CONTAINER_REF = re.compile(rb"[A-Za-z0-9][A-Za-z0-9_.-]{0,254}")  # an id or a name


def _read_mark(mark: str) -> str:
    """The container a mark names, or "" if what it holds is no container's id or name
    (a file the daemon wrote, damaged since: never a reason not to start)."""
    with open(mark, "rb") as f:
        found = f.read(4096).strip()
    return found.decode() if _CONTAINER_REF.fullmatch(found) else ""


class Engine:
    """The Docker engine through its SDK; errors are mapped here and nowhere else."""

    def __init__(self, base_url: str | None = None, timeout: int = 120) -> None:
        self.base_url = base_url
        self.timeout = timeout
        self._api = None
        self._root: str | None = None
        self._lock = threading.Lock()

    @property
    def api(self):
        with self._lock:
            if self._api is None:
                self._api = self._client()
            return self._api

    def _client(self):
        import docker
        try:
            if self.base_url:
                return docker.APIClient(base_url=self.base_url, timeout=self.timeout)
            return docker.from_env(timeout=self.timeout).api
        except docker.errors.DockerException as exc:
            raise Unavailable(self._unreachable(exc)) from None

    def _unreachable(self, exc: BaseException) -> str:
        """One line for a person: why the engine could not be reached and what to do,
        rather than the repr of the exception requests and urllib3 nested inside."""
        where = self.base_url or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
        err = _os_error(exc)
        if isinstance(err, PermissionError):
            return (f"the Docker engine at {where} refused uid {os.getuid()} (permission"
                    " denied): run the daemon as root or as a member of the docker group")
        if isinstance(err, (FileNotFoundError, ConnectionRefusedError)):
            return (f"no Docker engine listens at {where}: start it (`make docker`, or"
                    " `systemctl start docker`), or point DOCKER_HOST at yours")
        return f"the Docker engine at {where} is unreachable: {err or exc}"

    def starts(self, label: str, value: str):
        """The engine's stream of ``start`` events of the containers labelled
        ``label=value``, from now on (decoded dicts; ``close()`` ends it from another
        thread), on a connection of its own that waits for events as long as it takes."""
        with self.errors():
            return self._client().events(decode=True, filters={
                "type": "container", "event": "start", "label": f"{label}={value}"})

    @contextlib.contextmanager
    def errors(self, container: str = "") -> Iterator[None]:
        import docker
        import requests
        try:
            yield
        except docker.errors.NotFound as exc:
            if container:
                raise FailedPrecondition(
                    f"container {container} no longer exists (removed behind worldline's"
                    f" back?): {exc.explanation}") from None
            raise NotFound(str(exc.explanation)) from None
        except docker.errors.APIError as exc:
            raise FailedPrecondition(f"the Docker engine refused: {exc.explanation}") from None
        except (requests.exceptions.ConnectionError, docker.errors.DockerException) as exc:
            raise Unavailable(self._unreachable(exc)) from None

    def ping(self) -> bool:
        try:
            with self.errors():
                return bool(self.api.ping())
        except (Unavailable, FailedPrecondition, NotFound):
            self._api = None
            return False

    def data_root(self) -> str | None:
        """The engine's data root (``DockerRootDir``), or None when it does not answer."""
        if self._root is None:
            try:
                with self.errors():
                    self._root = os.path.realpath(self.api.info().get("DockerRootDir") or "")
            except (Unavailable, FailedPrecondition, NotFound):
                return None
        return self._root or None

    def exists(self, container: str) -> bool:
        """Whether the engine knows the container (Unavailable when it does not answer)."""
        import docker
        with self.errors():
            try:
                self.api.inspect_container(container)
                return True
            except docker.errors.NotFound:
                return False

    def inspect(self, container: str) -> dict:
        with self.errors(container):
            return self.api.inspect_container(container)

    def upper_dir(self, container: str) -> str:
        return self.layer_dirs(container)[0]

    def layer_dirs(self, container: str) -> tuple[str, str]:
        """The container's upper folder, and the merged view mounted while it runs."""
        attrs = self.inspect(container)
        driver = attrs.get("GraphDriver", {})
        data = driver.get("Data") or {}
        upper, merged = data.get("UpperDir"), data.get("MergedDir")
        if driver.get("Name") != "overlay2" or not upper or not merged:
            raise FailedPrecondition(
                f"container {container} uses the {driver.get('Name')!r} storage driver;"
                " worldline reads container layers from overlay2's upper folder")
        if not os.access(upper, os.R_OK | os.X_OK):
            raise FailedPrecondition(f"the daemon cannot read {upper}: reading a container's"
                                     " layer needs the engine's privileges (run as root)")
        return upper, merged

    @contextlib.contextmanager
    def frozen(self, container: str, mark: str | None = None) -> Iterator[dict]:
        """Pause a running container for the duration; leave others as they are. Yields
        what the engine said of the container just before (``inspect``).
        ``mark``: a file that names the container from just before it is paused until
        it is unpaused, so that a daemon killed in between unpauses it at its next
        start (``unpause_marked``) rather than leave the agent's sandbox frozen."""
        attrs = self.inspect(container)
        state = attrs.get("State", {})
        pause = state.get("Running") and not state.get("Paused")
        if pause:
            if mark:
                _write_mark(mark, container)
            with self.errors(container):
                self.api.pause(container)
        try:
            yield attrs
        finally:
            if pause:
                with self.errors(container):
                    self.api.unpause(container)
                if mark:
                    os.unlink(mark)

    def unpause_marked(self, mark: str) -> str | None:
        """Unpause the container a ``frozen`` mark names, if it is still paused, and
        remove the mark; the container unpaused, or None. Engine errors are raised
        and the mark kept, for the next start."""
        container, state = self._marked(mark)
        if state is None or not state.get("Paused"):
            container = None
        else:
            with self.errors(container):
                self.api.unpause(container)
        os.unlink(mark)
        return container

    def stop(self, container: str, timeout: int = 5, mark: str | None = None) -> bool:
        """Stop the container; return whether it was running. ``mark``: a file that
        names a running container from just before it is stopped (the caller removes
        it once it has started the container again), so that a daemon killed in
        between starts it at its next start (``start_marked``). A first process that
        would drop the stop signal is not waited for: SIGKILL at once (stopping.py)."""
        attrs = self.inspect(container)
        state = attrs.get("State", {})
        with self.errors(container):
            if state.get("Paused"):
                self.api.unpause(container)
            if state.get("Running"):
                if mark:
                    _write_mark(mark, container)
                deaf = ignores_stop_signal(attrs)
                self.api.stop(container, timeout=0 if deaf else timeout)
                return True
        return False

    def start_marked(self, mark: str) -> str | None:
        """Start the container a ``stop`` mark names unless it runs, and remove the
        mark; the container started, or None. Engine errors are raised and the mark
        kept, for the next start."""
        container, state = self._marked(mark)
        if state is None or state.get("Running"):
            container = None
        else:
            self.start(container)
        os.unlink(mark)
        return container

    def _marked(self, mark: str) -> tuple[str, dict | None]:
        """The container a mark names and its state, from one question to the engine
        (None: no such container any more)."""
        import docker
        container = _read_mark(mark)
        if not container:
            return container, None
        with self.errors(container):
            try:
                return container, self.api.inspect_container(container).get("State", {})
            except docker.errors.NotFound:
                return container, None

    def start(self, container: str) -> None:
        with self.errors(container):
            self.api.start(container)

    def processes(self, container: str) -> list[str]:
        """The processes of a running container, ``docker top``'s way: one line each,
        "PID COMMAND" (host pids); none when it does not run."""
        state = self.inspect(container).get("State", {})
        if not state.get("Running"):
            return []
        with self.errors(container):
            top = self.api.top(container)
        titles = top.get("Titles") or []
        pid = titles.index("PID") if "PID" in titles else 1
        cmd = titles.index("CMD") if "CMD" in titles else len(titles) - 1
        return [f"{row[pid]} {row[cmd]}" for row in top.get("Processes") or []]

    def bind_identity(self, container: str, source: str) -> list[int] | None:
        """``bind_identity_of`` the container as the engine shows it now."""
        return bind_identity_of(self.inspect(container), source)

    def remove(self, container: str) -> None:
        with self.errors():
            try:
                self.api.remove_container(container, force=True)
            except Exception as exc:  # already gone is fine
                import docker
                if not isinstance(exc, docker.errors.NotFound):
                    raise

    def create_from_image(self, image: str, name: str, workspace: str, mount: str,
                          labels: dict[str, str], command: list[str] | None = None) -> str:
        with self.errors():
            host = self.api.create_host_config(binds={workspace: {"bind": mount, "mode": "rw"}})
            created = self.api.create_container(
                image, command=command or None, name=name, labels=labels, tty=True,
                stdin_open=True, working_dir=mount, host_config=host, detach=True)
            return created["Id"]

    def creation_spec(self, container: str) -> dict:
        """What it takes to create this container again, identically: its ``Config`` and
        ``HostConfig`` as ``docker inspect`` shows them (the engine takes them back as
        they are), less what the engine fills in for each container, and its mounts."""
        attrs = self.inspect(container)
        config = {k: v for k, v in (attrs.get("Config") or {}).items() if k in _CONFIG_KEYS}
        return {"Config": config, "HostConfig": dict(attrs.get("HostConfig") or {}),
                "Mounts": attrs.get("Mounts") or []}

    def create_from_spec(self, spec: dict, name: str, workspace_from: str, workspace_to: str,
                         labels: dict[str, str], volumes: str = "") -> str:
        """A container made from ``spec`` (``creation_spec``), the bind mount of
        ``workspace_from`` pointed at ``workspace_to``. Other mounts are not part of the
        world: with ``volumes`` "share" they are mounted as they were (a named volume is
        then shared with the original), with "empty" each becomes a new empty anonymous
        volume at the same place; otherwise a spec that has any is refused, naming them."""
        foreign = extra_mounts(spec, workspace_from)
        if foreign and volumes not in ("share", "empty"):
            raise FailedPrecondition(
                f"the container mounts {', '.join(foreign)} besides the workspace: they are"
                " not part of the world; choose --volumes share (mount them as they are) or"
                " --volumes empty (fresh empty volumes)")
        config = copy.deepcopy(spec["Config"])
        host = copy.deepcopy(spec["HostConfig"])
        empty: dict[str, dict] = {}
        binds = []
        for bind in host.get("Binds") or []:
            src, _, rest = bind.partition(":")
            if os.path.isabs(src) and os.path.realpath(src) == workspace_from:
                binds.append(f"{workspace_to}:{rest}")
            elif volumes == "share":
                binds.append(bind)
            else:
                empty[rest.partition(":")[0]] = {}
        host["Binds"] = binds or None
        mounts = []
        for mount in host.get("Mounts") or []:
            source = mount.get("Source") or ""
            if mount.get("Type") == "bind" and os.path.realpath(source) == workspace_from:
                mounts.append({**mount, "Source": workspace_to})
            elif volumes == "share" or mount.get("Type") == "tmpfs":
                mounts.append(mount)
            else:
                empty[mount.get("Target", "")] = {}
        host["Mounts"] = mounts or None
        if volumes != "share":
            # Volumes the image declares get fresh anonymous ones unless shared.
            config["Volumes"] = {**(config.get("Volumes") or {}), **empty} or None
        for binding in (host.get("PortBindings") or {}).values():
            for port in binding or []:
                port["HostPort"] = ""  # the engine picks a free one: the original holds its own
        config["Labels"] = {**(config.get("Labels") or {}), **labels}
        config["HostConfig"] = host
        with self.errors():
            created = self.api.post(self.api._url("/containers/create"),
                                    params={"name": name},
                                    data=json.dumps(config),
                                    headers={"Content-Type": "application/json"})
            return self.api._result(created, True)["Id"]

    def commit(self, container: str, repository: str, tag: str, labels: dict[str, str]) -> str:
        changes = [f'LABEL {k}="{v}"' for k, v in labels.items()]
        with self.errors(container):
            return self.api.commit(container, repository=repository, tag=tag, changes=changes,
                                   pause=False)["Id"]

    def images_labelled(self, key: str, value: str | None = None) -> list[dict]:
        with self.errors():
            return self.api.images(filters={
                "label": f"{key}={value}" if value is not None else key})

    def containers_labelled(self, key: str, value: str | None = None) -> list[dict]:
        with self.errors():
            return self.api.containers(all=True, filters={
                "label": f"{key}={value}" if value is not None else key})

    def remove_image(self, image: str) -> None:
        with self.errors():
            self.api.remove_image(image, force=True)


def bind_identity_of(attrs: dict, source: str) -> list[int] | None:
    """(st_dev, st_ino) of what a running container (``attrs``: its inspection) shows
    at the place its bind mount of ``source`` goes, reached in its root through no
    symlink ([-1, -1] if it cannot be reached so); None if it binds no ``source`` or
    does not run. The engine resolves a bind's source path at each start, following
    symlinks: whoever starts it (a restart policy too) may have it bind another
    folder than the one the path names now."""
    place = next((m.get("Destination") for m in attrs.get("Mounts") or []
                  if m.get("Type") == "bind" and m.get("Source") == source), None)
    pid = (attrs.get("State") or {}).get("Pid")
    if not place or not pid:
        return None
    try:
        root = os.open(f"/proc/{pid}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None  # it ended meanwhile: nothing is bound
    try:
        fd = openat2(root, place.lstrip("/") or ".", os.O_PATH | os.O_DIRECTORY,
                     RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)
        return identity_of(fd) if fd >= 0 else [-1, -1]
    finally:
        os.close(root)


class StartWatch:
    """Tells ``on_start(container, session_id)`` of every start of a container this data
    root made (``root_id``), whoever started it: a restart policy, an operator's
    ``docker start``. The engine's event stream says so as it happens; at each
    (re)connection every such container running is told too, since a start while the
    stream was down is not told again. The engine away: tried again every few seconds,
    quietly."""

    RETRY_SECONDS = (1.0, 2.0, 5.0, 10.0)

    def __init__(self, engine: Engine, root_id: str, on_start) -> None:
        self.engine, self.root_id, self.on_start = engine, root_id, on_start
        self._stopping = threading.Event()
        self._stream = None
        self._thread = threading.Thread(target=self._run, name="container-watch", daemon=True)

    def start(self) -> StartWatch:
        self._thread.start()
        return self

    def close(self) -> None:
        self._stopping.set()
        stream = self._stream
        if stream is not None:
            with contextlib.suppress(Exception):
                stream.close()
        self._thread.join(timeout=5.0)

    def _run(self) -> None:
        failures = 0
        while not self._stopping.is_set():
            try:
                self._stream = self.engine.starts(LABEL_ROOT, self.root_id)
                if self._stopping.is_set():
                    break
                for c in self.engine.containers_labelled(LABEL_ROOT, self.root_id):
                    if c.get("State") == "running":
                        self._tell(c.get("Id", ""), (c.get("Labels") or {}))
                failures = 0
                for event in self._stream:
                    self._tell(event.get("id", ""),
                               (event.get("Actor") or {}).get("Attributes") or {})
            except (Unavailable, FailedPrecondition, NotFound) as exc:
                log.debug("container watch: %s", exc)
            except Exception:  # noqa: BLE001 -- the watch goes on whatever one event does
                log.exception("container watch failed; it starts again")
            finally:
                stream, self._stream = self._stream, None
                if stream is not None:
                    with contextlib.suppress(Exception):
                        stream.close()
            self._stopping.wait(self.RETRY_SECONDS[min(failures, len(self.RETRY_SECONDS) - 1)])
            failures += 1

    def _tell(self, container: str, labels: dict) -> None:
        session = labels.get(LABEL_SESSION)
        if not container or not session or labels.get(LABEL_ROOT) != self.root_id:
            return
        try:
            self.on_start(container, session)
        except Exception as exc:  # noqa: BLE001 -- one container's check never ends the watch
            log.warning("container watch: checking container %s of session %s: %s",
                        container[:12], session, exc)


def _os_error(exc: BaseException, depth: int = 0) -> OSError | None:
    """The OSError at the bottom of an exception that requests or urllib3 wrapped (in its
    args, its cause or its context), if there is one."""
    if depth > 8 or exc is None:
        return None
    if isinstance(exc, OSError) and exc.errno is not None:
        return exc
    for inner in (*[a for a in getattr(exc, "args", ()) if isinstance(a, BaseException)],
                  getattr(exc, "reason", None), exc.__cause__, exc.__context__):
        if isinstance(inner, BaseException):
            found = _os_error(inner, depth + 1)
            if found is not None:
                return found
    return None
