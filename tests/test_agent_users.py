"""A caller admitted with --allow-uid is an agent user: the root daemon does nothing
for it that its user could not do itself (daemon/owners.py, daemon/edge/callers.py).

The agent's side runs as uid 1000 (a child process), through the gateway's frames and
through gRPC's relay alike; a canary folder of root's, with a root-only secret, must
stay unread and untouched whatever it asks."""

from __future__ import annotations

import itertools
import json
import os
import random
import shutil
import subprocess
import tempfile
from pathlib import Path

import grpc
import pytest
from worldline.client import Client
from worldline.v1 import worldline_pb2 as pb
from worldline.v1 import worldline_pb2_grpc as pb_grpc

from .conftest import DaemonProcess, run_python, unmount_below
from .fidelity import (
    AGENT_UID,
    AgentProcess,
    as_agent,
    differences,
    fingerprint,
    in_child_as,
    in_fresh_child_as,
)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="switching uids needs root")


@pytest.fixture
def place(request):
    """base/ (0711): the daemon's root, the agent's home (uid 1000), root's canary. The
    daemon's options beyond --allow-uid: the test's indirect parameter, if any."""
    base = Path(tempfile.mkdtemp(prefix="wl-agent-"))
    os.chmod(base, 0o711)
    home = base / "agent"
    (home / "ws").mkdir(parents=True)
    for p in (home, home / "ws"):
        os.chown(p, AGENT_UID, AGENT_UID)
    as_agent("echo mine > a.txt && mkdir -p src && echo code > src/m.py", home / "ws")
    (base / "public").mkdir(mode=0o755)  # root's, open to all: not the agent's to fill
    canary = base / "canary"
    canary.mkdir(mode=0o700)
    (canary / "secret").write_text("root only\n")
    os.chmod(canary / "secret", 0o600)
    locked = base / "locked"  # root's, 0700: the agent owns a folder it cannot reach
    (locked / "mine").mkdir(parents=True)
    os.chmod(locked, 0o700)
    os.chown(locked / "mine", AGENT_UID, AGENT_UID)
    d = DaemonProcess(base / "root", extra=["--allow-uid", str(AGENT_UID),
                                            *getattr(request, "param", ())]).start()
    before = fingerprint(canary)
    try:
        yield d, home, canary
        assert differences(before, fingerprint(canary)) == []
    finally:
        d.stop()
        unmount_below(base)  # the agent's overlay fork
        shutil.rmtree(base, ignore_errors=True)


def _outcome(call) -> str:
    try:
        call()
        return "ok"
    except Exception as exc:  # noqa: BLE001 -- the test compares the names
        return type(exc).__name__


def _agent_asks_for_everything(address: str, transport: str, home: str, canary: str,
                               theirs: str, theirs_cp: str) -> dict | str:
    """The agent's side of test_an_allowed_user_gets_nothing_it_could_not_do_itself:
    what each call came to, or the step that failed."""
    out: dict = {}
    try:
        return _everything(out, address, transport, Path(home), Path(canary), theirs,
                           theirs_cp)
    except Exception as exc:  # noqa: BLE001 -- which step failed, and how
        return f"after {sorted(out)}: {type(exc).__name__}: {exc}"


def _everything(out: dict, address: str, transport: str, home: Path, canary: Path,
                theirs: str, theirs_cp: str) -> dict:
    # gRPC reaches the daemon through the relay (.shared); frames through the gateway
    address = address + (".shared" if transport == "grpc" else "")
    ws = home / "ws"
    with Client(address, transport=transport) as c:
        out["etc"] = _outcome(lambda: c.create_session("/etc"))
        out["public"] = _outcome(lambda: c.create_session(str(canary.parent / "public")))
        out["unreachable"] = _outcome(lambda: c.create_session(
            str(canary.parent / "locked" / "mine")))
        out["image"] = _outcome(lambda: c.create_session(str(ws), image="busybox"))
        s = c.create_session(str(ws))
        cp = s.checkpoint()
        out["mine"] = [x.seq for x in c.log(s.id)]
        out["listed"] = [x.id for x in c.list_sessions()] == [s.id]
        out["their session"] = _outcome(lambda: c.get_session(theirs))
        out["their log"] = _outcome(lambda: c.log(theirs))
        out["their show"] = _outcome(lambda: c.show(theirs_cp))
        out["their diff"] = _outcome(lambda: c.diff(cp.id, theirs_cp, patch=True))
        out["their fork"] = _outcome(lambda: c.fork(theirs_cp, str(home / "stolen")))
        out["restore theirs"] = _outcome(lambda: c.restore(
            s.id, theirs_cp, from_other_session=True))
        out["fork into root's"] = _outcome(lambda: c.fork(
            cp.id, str(canary.parent / "public" / "f")))
        out["fork anywhere"] = _outcome(lambda: c.fork(cp.id))
        out["gc"] = _outcome(lambda: c.gc())
        out["fsck"] = _outcome(lambda: c.fsck())
        out["audit"] = _outcome(lambda: c.audit())
        if transport == "grpc":  # LangGraph's service is the owner's
            with grpc.insecure_channel(address) as channel:
                try:
                    pb_grpc.GraphsStub(channel).ListGraphCheckpoints(
                        pb.ListGraphCheckpointsRequest(any_thread=True), timeout=10)
                    out["graphs"] = "ok"
                except grpc.RpcError as exc:
                    out["graphs"] = exc.code().name
        fork = c.fork(cp.id, str(home / "f1"))
        out["fork"] = fork.workspace
        out["listed after"] = sorted(x.id for x in c.list_sessions()) == sorted(
            [s.id, fork.id])
        out["session id"] = s.id
    return out


@pytest.mark.parametrize("transport", ["frames", "grpc"])
def test_an_allowed_user_gets_nothing_it_could_not_do_itself(place, transport):
    d, home, canary = place
    with d.client() as owner:  # the daemon owner's session, over root's canary
        theirs = owner.create_session(str(canary))
        theirs_cp = theirs.checkpoint()

    got = in_fresh_child_as(AGENT_UID, _agent_asks_for_everything, d.address, transport,
                            str(home), str(canary), theirs.id, theirs_cp.id)
    assert isinstance(got, dict), got  # else: what the agent's side raised
    refused = "PermissionDenied"
    assert got["etc"] == got["public"] == refused, got
    assert got["unreachable"] == refused, got
    assert got["image"] == refused, got
    assert got["mine"] == [0, 1] and got["listed"] and got["listed after"], got
    for what in ("their session", "their log", "their show", "their diff", "their fork",
                 "restore theirs", "fork into root's", "fork anywhere", "gc", "fsck",
                 "audit"):
        assert got[what] == refused, (what, got)
    if transport == "grpc":
        assert got["graphs"] == "PERMISSION_DENIED", got
    assert got["fork"] == str(home / "f1")
    assert os.stat(home / "f1").st_uid == AGENT_UID
    assert (home / "f1" / "a.txt").read_text() == "mine\n"
    assert not (home / "stolen").exists()
    assert not (canary.parent / "public" / "f").exists()
    with d.client() as owner:  # the owner sees and may do everything
        assert {s.id for s in owner.list_sessions()} >= {theirs.id, got["session id"]}
        assert len(owner.log(got["session id"])) == 2


def _agent_decides_its_own_approvals(address: str, transport: str, ws: str) -> dict:
    """Whose approval the policy's decision says counts for it; three approval requests
    of the agent's own session: its approval of the first, that request's status after
    it, its denial of the second, its cancel of the third."""
    address = address + (".shared" if transport == "grpc" else "")
    with Client(address, transport=transport) as c:
        s = c.create_session(ws)
        a, b, e = (c.request_approval(s.id, f"deploy-{i}").id for i in range(3))
        return {"approver": c.explain_policy("Bash", '{"command": "git push"}').approver,
                "approve": _outcome(lambda: c.decide_approval(a, approve=True)),
                "status": c.get_approval(a).status,
                "deny": _outcome(lambda: c.decide_approval(b, approve=False, reason="no")),
                "cancel": _outcome(lambda: c.cancel_approval(e)),
                "ids": [a, b, e]}


@pytest.mark.parametrize("place", [(), ("--approvals-by", "owner")], indirect=True,
                         ids=["approvals-by-anyone", "approvals-by-owner"])
@pytest.mark.parametrize("transport", ["frames", "grpc"])
def test_an_agent_user_approves_its_own_requests_only_where_the_daemon_lets_it(place,
                                                                                transport):
    """By default an agent user decides its own sessions' approvals (the hooks' ask mode
    records the person's yes so). With --approvals-by owner its approval is
    PERMISSION_DENIED and changes nothing; it may still deny or cancel its own, and the
    owner's approval goes through. The policy's decision tells each caller whose
    approval counts for it."""
    d, home, canary = place
    by_owner = "--approvals-by" in d.extra
    got = in_fresh_child_as(AGENT_UID, _agent_decides_its_own_approvals, d.address,
                            transport, str(home / "ws"))
    assert isinstance(got, dict), got
    assert got["approver"] == ("owner" if by_owner else "caller"), got
    with d.client() as owner:
        assert owner.explain_policy("Bash", '{"command": "git push"}').approver == "caller"
    assert got["approve"] == ("PermissionDenied" if by_owner else "ok"), got
    assert got["status"] == ("pending" if by_owner else "approved"), got
    assert got["deny"] == got["cancel"] == "ok", got
    with d.client() as owner:
        a, b, _ = got["ids"]
        assert owner.get_approval(b).status == "denied"
        if by_owner:
            assert owner.decide_approval(a, approve=True).status == "approved"


def _beyond_the_agent(ws: Path) -> None:
    """Root's additions to the agent's workspace, each of the agent's uid but beyond
    what uid 1000 could make itself: a file setgid to root's group, a file capability,
    a trusted xattr."""
    for name in ("sg", "cap", "mark"):
        (ws / name).write_bytes(Path("/bin/true").read_bytes())
        os.chown(ws / name, AGENT_UID, AGENT_UID)
        os.chmod(ws / name, 0o755)
    os.chown(ws / "sg", AGENT_UID, 0)
    os.chmod(ws / "sg", 0o2755)
    subprocess.run(["setcap", "cap_net_raw+ep", str(ws / "cap")], check=True)
    os.setxattr(ws / "mark", "trusted.mark", b"1")


def _session_of(address: str, ws: Path) -> str:
    """The agent's new session over ``ws``: its id."""
    with Client(address) as c:
        return c.create_session(str(ws)).id


def _checkpoint_of(address: str, sid: str) -> str:
    """The agent's checkpoint of ``sid``: "ok", or the error it met, with its message."""
    with Client(address) as c:
        try:
            c.checkpoint(sid)
            return "ok"
        except Exception as exc:  # noqa: BLE001 -- the message is compared
            return f"{type(exc).__name__}: {exc}"


def test_what_an_agent_could_not_make_itself_is_never_recorded(place):
    """Files of the agent's own uid that its user could not have made (setgid to a
    group not its own, a file capability, a trusted xattr; root's doing): the agent's
    checkpoint is PERMISSION_DENIED naming each and why, and records nothing, so no
    restore of the agent's could grant them; its own setgid file of its own group is
    recorded, once they are gone."""
    d, home, _ = place
    ws = home / "ws"
    as_agent("cp /bin/true own && chmod 2755 own", ws)
    sid = in_child_as(AGENT_UID, lambda: _session_of(d.address, ws))
    _beyond_the_agent(ws)
    got = in_child_as(AGENT_UID, lambda: _checkpoint_of(d.address, sid))
    assert got.startswith("PermissionDenied"), got
    for named in ("sg (setgid to gid 0)", "cap (xattr security.capability)",
                  "mark (xattr trusted.mark)"):
        assert named in got, (named, got)
    assert "own (" not in got, got  # its own setgid file, of its own group
    with d.client() as owner:
        assert len(owner.log(sid)) == 1  # nothing recorded
        for name in ("sg", "cap", "mark"):
            os.unlink(ws / name)
        assert in_child_as(AGENT_UID, lambda: _checkpoint_of(d.address, sid)) == "ok"
        log = owner.log(sid)
        assert len(log) == 2 and owner.diff(log[0].id, log[1].id).modified == []


_RECORDED_BEFORE_0_7_26 = """
import json, os, sys
sys.path.insert(0, {checkout!r})
from tests.test_agent_users import _beyond_the_agent
from pathlib import Path
from worldline.client.errors import PermissionDenied
from worldline.daemon import owners
from worldline.daemon.main import Daemon

base, ws = {base!r}, Path({ws!r})
daemon = Daemon(base + "/root", "unix://" + base + "/root/wl.sock")
daemon.start()
out = {{}}
try:
    world, agent = daemon.world, owners.Agent({uid}, {uid})
    sid = world.create_session(str(ws), agent=agent).id
    _beyond_the_agent(ws)
    rule, owners.beyond = owners.beyond, lambda entry, agent: (  # 0.7.25's: the uid alone
        f"uid {{entry.uid}}" if entry.uid != agent.uid else None)
    recorded = world.checkpoint(sid).id
    owners.beyond = rule
    for name in ("sg", "cap", "mark"):
        os.unlink(ws / name)
    world.checkpoint(sid)
    for what, call in (("restore", lambda: world.restore(sid, recorded)),
                       ("fork", lambda: world.fork(recorded, {fork!r}, agent=agent))):
        try:
            call()
            out[what] = "ok"
        except PermissionDenied as exc:
            out[what] = str(exc)
finally:
    daemon.stop()
print(json.dumps(out))
"""


def test_a_tree_recorded_before_0_7_26_with_what_an_agent_could_not_make_is_not_written_back():
    """A checkpoint of an agent's session recorded under 0.7.25's rule (another uid's
    entries refused, nothing more) may hold a setgid-root file or a file capability: a
    restore to it and a fork of it are PERMISSION_DENIED, naming them, and write
    nothing. (An in-process daemon, in a fresh interpreter, records it so.)"""
    base = Path(tempfile.mkdtemp(prefix="wl-agent-old-"))  # uid 1000 reaches it
    os.chmod(base, 0o711)
    home = base / "agent"
    ws = home / "ws"
    ws.mkdir(parents=True)
    for p in (home, ws):
        os.chown(p, AGENT_UID, AGENT_UID)
    as_agent("echo mine > a.txt", ws)
    try:
        got = json.loads(run_python(_RECORDED_BEFORE_0_7_26.format(
            checkout=str(Path(__file__).resolve().parents[1]), base=str(base), ws=str(ws),
            fork=str(home / "f"), uid=AGENT_UID), timeout=120))
        restore, fork = got["restore"], got["fork"]
        assert "sg (setgid to gid 0)" in restore, restore
        assert "cap (xattr security.capability)" in restore, restore
        assert "nothing was restored" in restore, restore
        assert "nothing was forked" in fork and "sg (setgid to gid 0)" in fork, fork
        assert sorted(os.listdir(ws)) == ["a.txt"]  # nothing written back
        assert not (home / "f").exists()
    finally:
        unmount_below(base)
        shutil.rmtree(base, ignore_errors=True)


def test_a_file_of_another_users_in_an_agents_workspace_is_never_recorded(place):
    """Root puts a root-only file into the agent's folder: the agent's checkpoint is
    PERMISSION_DENIED, naming it, and records nothing, so no show, diff or restore of
    the agent's can read it or write it back; a restore, which would remove it, is
    refused too; once it is gone, checkpoints go on."""
    d, home, canary = place
    ws = home / "ws"
    sid = in_child_as(AGENT_UID, lambda: _session_of(d.address, ws))
    (ws / "src" / "secret").write_text("root only\n")
    os.chmod(ws / "src" / "secret", 0o600)

    def checkpoint():
        return _checkpoint_of(d.address, sid)
    got = in_child_as(AGENT_UID, checkpoint)
    assert got.startswith("PermissionDenied") and "src/secret" in got, got

    def restore():  # to the first checkpoint, which has no such file: nor removed
        with Client(d.address) as c:
            try:
                c.restore(sid, c.log(sid)[0].id)
                return "ok"
            except Exception as exc:  # noqa: BLE001 -- the message is compared
                return f"{type(exc).__name__}: {exc}"
    got = in_child_as(AGENT_UID, restore)
    assert got.startswith("PermissionDenied") and "nothing was restored" in got, got
    assert (ws / "src" / "secret").read_text() == "root only\n"
    with d.client() as owner:
        assert len(owner.log(sid)) == 1  # nothing recorded
        os.unlink(ws / "src" / "secret")
        as_agent("echo more >> a.txt", ws)
        assert in_child_as(AGENT_UID, checkpoint) == "ok"
        log = owner.log(sid)
        assert len(log) == 2 and owner.diff(log[0].id, log[1].id).modified == ["a.txt"]


class AgentClient(AgentProcess):
    """The agent user's calls, made by a Python client of its own in the agent's child
    (made at the first call: the daemon is up by then), one at a time: the result, or
    the error raised here as an AssertionError."""

    def __init__(self, address: str) -> None:
        clients: list[Client] = []

        def answer(request: list) -> dict:
            name, *args = request
            try:
                if not clients:
                    clients.append(Client(address))
                return {"ok": _CALLS[name](clients[0], *args)}
            except Exception as exc:  # noqa: BLE001 -- sent to the parent
                return {"error": f"{type(exc).__name__}: {exc}"}
        super().__init__(answer)

    def __call__(self, name: str, *args):
        answer = self.ask([name, *args])
        if "error" in answer:
            raise AssertionError(f"{name}{args}: {answer['error']}")
        return answer["ok"]


_CALLS = {
    "create": lambda c, ws: c.create_session(ws).id,
    "checkpoint": lambda c, sid: c.checkpoint(sid).id,
    "restore": lambda c, sid, cp: c.restore(sid, cp).checkpoint.id,
    "fork": lambda c, cp, path: c.fork(cp, path).workspace,
}


@pytest.mark.parametrize("seed", [11, 12])
def test_an_agent_users_random_walk_restores_exactly_through_its_own_client(seed):
    """The random walk of test_agent_walk (setuid bits, xattrs, hard links, sparse
    files, symlinks into a canary, folders swapped for symlinks: all of uid 1000's
    making), checkpointed, restored and forked by the agent user itself: what an agent
    user may do is every bit of its own work, exactly."""
    from .test_agent_walk import Agent, _pick
    base = Path(tempfile.mkdtemp(prefix="wl-agent-walk-"))
    os.chmod(base, 0o711)
    ws, forks, canary = base / "ws", base / "forks", base / "canary"
    for p in (ws, forks):
        p.mkdir()
        os.chown(p, AGENT_UID, AGENT_UID)
    canary.mkdir()
    (canary / "keep.txt").write_text("keep\n")
    os.chmod(canary, 0o777)
    untouched = fingerprint(canary)
    # The children are forked before this test's daemon is up; the client's child speaks
    # frames, never gRPC, which a forked child cannot use (fidelity.in_fresh_child_as).
    d = DaemonProcess(base / "root", extra=["--allow-uid", str(AGENT_UID)])
    agent, client = Agent(ws), AgentClient(d.address)
    d.start()
    rng = random.Random(seed)
    try:
        sid = client("create", str(ws))
        kept: dict[str, dict] = {}
        numbers = itertools.count()
        done = 0
        for i in range(40):
            for _ in range(rng.randrange(1, 6)):
                done += agent.do(*_pick(rng, ws, next(numbers), canary)) == 0
            kept[client("checkpoint", sid)] = fingerprint(ws)
            if i % 7 == 6:
                target = rng.choice(list(kept))
                client("restore", sid, target)
                assert differences(kept[target], fingerprint(ws)) == [], f"round {i}"
        for cp in rng.sample(list(kept), 8):
            client("restore", sid, cp)
            assert differences(kept[cp], fingerprint(ws)) == [], f"at the end: {cp}"
        for n, cp in enumerate(rng.sample(list(kept), 2)):
            path = client("fork", cp, str(forks / f"f{n}"))
            assert differences(kept[cp], fingerprint(path)) == [], f"fork of {cp}"
        assert done > 40  # the walk changed the world, not only tried to
        assert fingerprint(canary) == untouched
    finally:
        agent.close()
        client.close()
        d.stop()
        unmount_below(base)
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize("place", [("--approvals-by", "owner")], indirect=True,
                         ids=["approvals-by-owner"])
def test_the_hooks_ask_mode_refuses_where_the_owner_alone_approves(place):
    """Claude Code's hooks run as the agent user in ask mode, on a daemon that leaves
    approvals to its owner: the person's yes at the agent could not count, so the
    gated call is refused (not asked), citing its approval request and the command
    that approves it; the request stays pending for the owner. Once the owner has
    approved, the retry goes through and the call is recorded citing that approval.
    (0.7.26 asked, let the call run on the person's yes and recorded it with none.)"""
    import contextlib
    import io
    import sys

    import worldline.client.hooks.state  # noqa: F401 -- the child imports nothing
    import worldline.client.lite  # noqa: F401
    from worldline.client.hooks import run as hook_run

    from .test_hooks import Agent, decision, reason
    d, home, _ = place
    ws = home / "ws"
    agent = Agent("claude-code", d, ws, home)
    state = str(home / "hook-state")

    def hook(event: str) -> dict:
        payload = agent.payload(event)

        def work():
            os.environ["WORLDLINE_HOOK_STATE"] = state
            sys.stdin = io.StringIO(payload)
            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                hook_run.main(["claude-code", "--address", d.address])
            return {"out": out.getvalue(), "err": err.getvalue()}
        return in_child_as(AGENT_UID, work)

    assert "err" in hook("start")
    agent.say("user", "push it")  # the transcript the hooks read
    os.chown(agent.transcript, AGENT_UID, AGENT_UID)
    with d.client() as owner:
        sid = next(s.id for s in owner.list_sessions() if s.workspace == str(ws))
        got = hook("pre_push")
        out = json.loads(got["out"])
        assert decision("claude-code", out) == "deny", got
        pending = owner.list_approvals(sid, "pending")
        assert len(pending) == 1
        approval = pending[0]
        assert f"worldline approve {approval.id}" in reason("claude-code", out), got
        assert "--approvals-by owner" in reason("claude-code", out), got
        assert owner.log(sid)[-1].id == approval.checkpoint_id  # checkpointed first
        got = hook("pre_push")  # asked again: the same request, refused again
        assert decision("claude-code", json.loads(got["out"])) == "deny", got
        assert len(owner.list_approvals(sid)) == 1
        assert owner.decide_approval(approval.id, approve=True).status == "approved"
        got = hook("pre_push")  # the retry after the owner's approval goes through
        assert decision("claude-code", json.loads(got["out"])) == "allow", got
        got = hook("post_push")
        assert got["err"] == "", got
        calls = [c for c in owner.tool_calls(sid) if c.effect == "external_non_idempotent"]
        assert len(calls) == 1 and calls[0].approval_id == approval.id, calls
