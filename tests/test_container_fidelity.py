"""The metadata conformance suite over a container's upper folder, and container forks
that keep their parent's sandbox. The agent acts as ``nobody`` inside the container."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from worldline.client import FailedPrecondition

from .fidelity import NOBODY, differences, fingerprint
from .test_containers import IMAGE, docker

pytestmark = pytest.mark.docker


def as_nobody(container: str, script: str) -> str:
    return docker("exec", "-u", f"{NOBODY}:{NOBODY}", container, "sh", "-ec", script)


def as_root(container: str, script: str) -> str:
    return docker("exec", container, "sh", "-ec", script)


def upper(container: str) -> str:
    return json.loads(docker("inspect", container))[0]["GraphDriver"]["Data"]["UpperDir"]


def _build_layer(c: str) -> None:
    as_root(c, "mkdir -p /data && chown 65534:65534 /data && mknod /data/null c 1 3"
               " && mknod /data/loop b 7 200 && chmod 620 /data/loop && mkfifo /data/fifo"
               " && chown 0:65534 /data/fifo && mkdir -p /data/rootonly && chmod 700"
               " /data/rootonly && echo secret > /data/rootonly/key")
    as_nobody(c, "cd /data && mkdir -p sub/deep && echo mine > sub/own.txt"
                 " && cp /bin/busybox sub/tool && chmod 4755 sub/tool"
                 " && chmod 2755 sub/deep && ln sub/own.txt sub/hard.txt"
                 " && ln -s own.txt sub/link && touch -d '2001-02-03 04:05:06' sub/own.txt"
                 " && dd if=/dev/zero of=sparse bs=1 count=0 seek=50M 2>/dev/null"
                 " && echo data | dd of=sparse bs=1 seek=20000000 conv=notrunc 2>/dev/null"
                 " && echo head > small-hole && dd if=/dev/zero of=small-hole bs=1 count=0"
                 " seek=200K 2>/dev/null && echo tail >> small-hole")
    # xattrs and ACLs, written from the host into the stopped container's layer
    docker("stop", "-t", "1", c)
    top = upper(c)
    subprocess.run(["setfattr", "-n", "user.note", "-v", "in-a-container",
                    f"{top}/data/sub/own.txt"], check=True)
    subprocess.run(["setfacl", "-m", "u:1000:rw", f"{top}/data/sub/own.txt"], check=True)
    subprocess.run(["setcap", "cap_net_raw+ep", f"{top}/data/sub/tool"], check=True)
    docker("start", c)


def test_layer_round_trip_keeps_every_kind_and_owner(client, workspace, containers):
    s = client.create_session(str(workspace), image=IMAGE)
    c = s.container
    containers.append(c)
    _build_layer(c)
    cp = s.checkpoint(label="layer")
    before = fingerprint(os.path.join(upper(c), "data"))
    as_root(c, "rm -rf /data/sub /data/sparse /data/small-hole /data/null /data/fifo /data/rootonly"
               " && echo new > /data/intruder")
    after = s.checkpoint(label="wrecked")
    d = client.diff(cp.id, after.id)
    assert d.added == [] and "data/sub/own.txt" in d.container.deleted
    assert "data/intruder" in d.container.added
    dry = s.restore(cp.id, dry_run=True)
    assert "data/sub/own.txt" in dry.container.files_written
    result = s.restore(cp.id)
    assert "data/intruder" in result.container.files_removed
    assert differences(before, fingerprint(os.path.join(upper(c), "data"))) == []
    # nobody still owns and writes its own files; its setuid file is nobody's
    as_nobody(c, "echo more >> /data/sub/own.txt && touch /data/sub/deep/new")
    assert as_nobody(c, "stat -c '%u %a' /data/sub/tool").split() == [str(NOBODY), "4755"]


def test_fork_keeps_the_layer_and_the_sandbox(client, workspace, tmp_path, containers):
    name = f"wl-sandbox-{os.urandom(3).hex()}"
    os.chown(workspace, 1000, 1000)
    os.chmod(workspace, 0o750)
    docker("create", "--name", name, "--security-opt", "no-new-privileges",
           "--memory", "64m", "--pids-limit", "64", "--tmpfs", "/run:size=8m",
           "--init", "--ulimit", "nofile=512:1024", "--restart", "on-failure:2",
           "--health-cmd", "true", "--health-interval", "30s", "--stop-signal", "SIGINT",
           "--hostname", "sandbox-host", "--cap-drop", "NET_RAW", "--user", "0:0",
           "-v", f"{workspace}:/workspace", IMAGE, "sleep", "1000000")
    containers.append(name)
    docker("start", name)
    s = client.create_session(str(workspace), container=name)
    _build_layer(name)
    cp = s.checkpoint()
    before = fingerprint(os.path.join(upper(name), "data"))
    fork = client.fork(cp.id, workspace=str(tmp_path / "forked"))
    containers.append(fork.container)
    assert differences(before, fingerprint(os.path.join(upper(fork.container), "data"))) == []
    parent, child = (json.loads(docker("inspect", x))[0] for x in (name, fork.container))
    for key in ("SecurityOpt", "ReadonlyRootfs", "Memory", "PidsLimit", "Tmpfs", "Init",
                "Ulimits", "RestartPolicy", "CapAdd", "CapDrop", "Privileged",
                "NetworkMode", "MaskedPaths", "ReadonlyPaths"):
        assert child["HostConfig"].get(key) == parent["HostConfig"].get(key), key
    for key in ("Healthcheck", "StopSignal", "Hostname", "User", "Cmd", "Env", "WorkingDir"):
        assert child["Config"].get(key) == parent["Config"].get(key), key
    # the fork's /workspace is its own folder, with the source's owner and mode
    assert as_root(fork.container, "stat -c '%u %g %a' /workspace").split() == \
        ["1000", "1000", "750"]
    as_nobody(fork.container, "echo more >> /data/sub/own.txt")


def test_volumes_are_not_part_of_the_world(client, workspace, tmp_path, containers):
    volume = f"wl-vol-{os.urandom(3).hex()}"
    name = f"wl-volumes-{os.urandom(3).hex()}"
    docker("volume", "create", volume)
    try:
        docker("create", "--name", name, "-v", f"{workspace}:/workspace",
               "-v", f"{volume}:/cache", IMAGE, "sleep", "1000000")
        containers.append(name)
        docker("start", name)
        s = client.create_session(str(workspace), container=name)
        as_root(name, "echo shared > /cache/x && echo layer > /l")
        cp = s.checkpoint()
        with pytest.raises(FailedPrecondition) as err:
            client.fork(cp.id, workspace=str(tmp_path / "f0"))
        assert volume in err.value.message
        assert not (tmp_path / "f0").exists() or not any((tmp_path / "f0").iterdir())
        shared = client.fork(cp.id, workspace=str(tmp_path / "f1"), volumes="share")
        containers.append(shared.container)
        assert as_root(shared.container, "cat /cache/x").strip() == "shared"
        empty = client.fork(cp.id, workspace=str(tmp_path / "f2"), volumes="empty")
        containers.append(empty.container)
        assert as_root(empty.container, "ls -A /cache").strip() == ""
        assert as_root(empty.container, "cat /l").strip() == "layer"
        mounts = json.loads(docker("inspect", empty.container))[0]["Mounts"]
        assert all(m.get("Name") != volume for m in mounts)
    finally:
        for c in list(containers):
            subprocess.run(["docker", "rm", "-f", c], capture_output=True)
        containers.clear()
        subprocess.run(["docker", "volume", "rm", "-f", volume], capture_output=True)
