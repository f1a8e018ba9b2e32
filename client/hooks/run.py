"""What ``worldline hook AGENT`` does with one event.

- session start: bind the agent session to the worldline session of its workspace,
  creating it when the folder has none (one folder belongs to one session).
- before a tool call: ask the daemon's policy. A call that is not gated passes (the
  agent's own permission rules decide). A gated one (``external_non_idempotent``, or
  a policy rule that requires approval) gets an approval request, which checkpoints
  the world first; then, as configured, the person at the agent is asked, or the
  hook waits for an operator's decision, or the call is refused with the approval's
  id and the command that approves it (a retry after approval goes through). Where
  the person's yes could not count (an agent user of a daemon that leaves approvals
  to its owner, ``approver`` "owner" in the policy's decision), ask is refuse.
- after a tool call: record it (name, input, response; the agent's tool-use id as
  the idempotency key; the approval it was allowed by), then checkpoint with the
  transcript entries appended since the last checkpoint and where they end.
- prompt submitted, stop: checkpoint.
"""

from __future__ import annotations

import os
import sys
import time

from .. import _json as json
from ..errors import (
    FailedPrecondition,
    NotFound,
    PermissionDenied,
    Unavailable,
    WorldlineError,
)
from . import agents, state, transcripts
from .agents import ALLOW, ASK, DENY, PASS, POST, PRE, PROMPT, START, STOP, Event

GATED = "external_non_idempotent"
MAX_RESULT = 1 << 20
WAIT_ENTRY = 0.5  # s: the longest a hook waits for the transcript entry of its call


class Config:
    def __init__(self, agent: str, address: str | None = None, workspace: str = "",
                 container: str = "", image: str = "", approval: str = "",
                 wait: float = 300.0, unavailable: str = "", ttl: float = 0.0) -> None:
        env = os.environ
        self.agent = agent
        self.address = address
        self.workspace = workspace or env.get("WORLDLINE_HOOK_WORKSPACE", "")
        self.container = container
        self.image = image
        self.approval = approval or env.get("WORLDLINE_HOOK_APPROVAL", "") or (
            ASK if agents.can_ask(agent) else DENY)
        if self.approval == ASK and not agents.can_ask(agent):
            self.approval = DENY
        self.wait = float(env.get("WORLDLINE_HOOK_WAIT", wait))
        self.unavailable = unavailable or env.get("WORLDLINE_HOOK_UNAVAILABLE", "")
        self.ttl = ttl


class Hook:
    def __init__(self, config: Config, client) -> None:
        self.config = config
        self.client = client

    # -- the session -------------------------------------------------------------------
    def _workspace(self, event: Event) -> str:
        return os.path.realpath(self.config.workspace or event.project or event.cwd)

    def session(self, event: Event, st: dict, fresh: bool = False) -> str:
        """The worldline session of this agent session, found or made; ``fresh``: not
        the one remembered (it was deleted or is gone)."""
        sid = st.get("session")
        if sid and not fresh:
            return sid  # a session gone since is found again by the caller (Hook.handle)
        workspace = self._workspace(event)
        for attempt in range(2):
            found = self.client.call("ListSessions", {"workspace": workspace})["sessions"]
            if found:
                sid = found[0]["id"]
                break
            try:
                sid = self.client.call("CreateSession", {
                    "workspace": workspace, "container": self.config.container,
                    "image": self.config.image,
                    "name": f"{event.agent} {event.session_id[:8]}"})["id"]
                break
            except FailedPrecondition:
                if attempt:
                    raise  # overlaps a session that is not this folder's
        st.clear()
        st.update(session=sid, agent=event.agent, agent_session=event.session_id)
        return sid

    # -- events ------------------------------------------------------------------------
    def handle(self, event: Event) -> dict:
        """The answer to one event. The session remembered for the agent session is
        trusted without asking; if the daemon no longer knows it (or it was deleted), the
        event is handled once more against the session of the workspace as it is now."""
        try:
            return self._handle(event)
        except (NotFound, FailedPrecondition) as exc:
            if not _stale_session(exc):
                raise
            with state.held(event.agent, event.session_id) as st:
                self.session(event, st, fresh=True)
            return self._handle(event)

    def _handle(self, event: Event) -> dict:
        if event.kind == PRE:
            return self.before_tool(event)
        with state.held(event.agent, event.session_id) as st:
            if event.kind == START:
                self.session(event, st)
            elif event.kind == POST:
                self.after_tool(event, st)
            elif event.kind in (PROMPT, STOP):
                self.withdraw_stale(st)
                label = ("session end" if event.name == "SessionEnd" else "stop") \
                    if event.kind == STOP else "prompt: " + _short(event.prompt)
                self.checkpoint(event, st, label)
        return agents.answer(event)

    def before_tool(self, event: Event) -> dict:
        with state.held(event.agent, event.session_id) as st:
            sid = self.session(event, st)
            args = json.dumps(event.tool_input)
            decision = self.client.call("ExplainPolicy", {"tool": event.tool,
                                                          "args_json": args})
            if decision["effect"] != GATED and not decision["requires_approval"]:
                return agents.answer(event, PASS)
            key = state.pending_key(event.tool, event.tool_input, event.tool_use_id)
            approval = self._approval_for(sid, event, args)
            st.setdefault("pending", {})[key] = approval["id"]
            if self.config.approval == ASK and decision.get("approver") != "owner":
                # put to the person at the agent: withdrawn if the call never runs. One
                # left to an operator stays pending for `worldline approve` and a retry.
                st.setdefault("asked", {})[key] = approval["id"]
        what = (f"worldline: {event.tool} {_short(_command(event))!r} is {decision['effect']}"
                f" ({decision['rule']})")
        if approval["status"] == "approved":
            return agents.answer(event, ALLOW, f"{what}; approved ({approval['id']})")
        approve = f"`worldline approve {approval['id']}`"
        taken = f"checkpoint {approval['checkpoint_id']} taken before it"
        mode = self.config.approval
        if mode == ASK and decision.get("approver") == "owner":
            # The person's yes at the agent would be no approval here: the call is
            # refused until the daemon's owner approves it, as in deny mode.
            return agents.answer(event, DENY, f"{what}; {taken}. Approvals here are the"
                                              f" daemon owner's (--approvals-by owner):"
                                              f" retry once the owner has run {approve}.")
        if mode == "wait":
            approval = self.client.call("WaitApproval", {
                "approval_id": approval["id"], "timeout_seconds": self.config.wait},
                timeout=self.config.wait + 30)
            if approval["status"] == "approved":
                return agents.answer(event, ALLOW, f"{what}; approved by an operator")
            if approval["status"] == "denied":
                return agents.answer(event, DENY, f"{what}; denied by an operator:"
                                                  f" {approval['reason']}")
            return agents.answer(event, DENY, f"{what}; approval {approval['id']} is"
                                              f" {approval['status']}: retry once an operator"
                                              f" has run {approve}")
        if mode == ASK:
            return agents.answer(event, ASK, f"{what}; {taken}. An operator may also run"
                                             f" {approve}.")
        return agents.answer(event, DENY, f"{what}; {taken}. It needs approval: retry once"
                                          f" an operator has run {approve}.")

    def _approval_for(self, sid: str, event: Event, args: str) -> dict:
        """An approved, unused approval for this very call; else a pending one; else a
        new request (which checkpoints the world)."""
        same = json.dumps(event.tool_input, sort_keys=True)
        mine = [a for a in self.client.call("ListApprovals", {"session_id": sid})["approvals"]
                if a["tool"] == event.tool and _same_args(a["args_json"], same)]
        if any(a["status"] == "approved" for a in mine):
            used = {t["approval_id"] for t in self.client.call(
                "ListToolCalls", {"session_id": sid})["tool_calls"]}
            for a in mine:
                if a["status"] == "approved" and a["id"] not in used:
                    return a
        for a in mine:
            if a["status"] == "pending":
                return a
        return self.client.call("RequestApproval", {
            "session_id": sid, "tool": event.tool, "args_json": args,
            "ttl_seconds": self.config.ttl})

    def after_tool(self, event: Event, st: dict) -> None:
        sid = self.session(event, st)
        key = state.pending_key(event.tool, event.tool_input, event.tool_use_id)
        approval_id = st.get("pending", {}).pop(key, "")
        st.get("asked", {}).pop(key, None)
        if approval_id:
            approval = self.client.call("GetApproval", {"approval_id": approval_id})
            if approval["status"] == "pending":  # the person at the agent said yes
                try:
                    self.client.call("DecideApproval", {
                        "approval_id": approval_id, "approve": True,
                        "reason": f"allowed by the person at {event.agent}"})
                except PermissionDenied as exc:  # the daemon's owner alone approves
                    print(f"worldline hook: the person's yes is not an approval here"
                          f" ({exc.message}); run the hooks with --approval wait",
                          file=sys.stderr)
                    approval_id = ""
            elif approval["status"] != "approved":
                approval_id = ""
        result = json.dumps(event.tool_response)
        if len(result) > MAX_RESULT:
            result = json.dumps({"truncated": True, "bytes": len(result)})
        try:
            self.client.call("RecordToolCall", {
                "session_id": sid, "name": event.tool,
                "args_json": json.dumps(event.tool_input),
                "result_json": result, "idempotency_key": event.tool_use_id,
                "approval_id": approval_id})
        except FailedPrecondition as exc:
            # A tool the policy gates ran without an approval worldline knows of (the
            # pre-hook could not reach the daemon): the world is still checkpointed.
            print(f"worldline hook: tool call not recorded: {exc.message}", file=sys.stderr)
        self.checkpoint(event, st, f"{event.tool}: {_short(_command(event))}")

    def withdraw_stale(self, st: dict) -> None:
        """Approvals put to the person at the agent before tool calls that never ran
        (refused at the agent, or interrupted) are withdrawn once the turn moves on;
        those left to an operator (deny, a wait that timed out) stay pending."""
        asked = st.pop("asked", {})
        for key, approval_id in list(st.get("pending", {}).items()):
            if asked.get(key) == approval_id:
                try:
                    self.client.call("CancelApproval", {
                        "approval_id": approval_id, "reason": "the tool call did not run"})
                except FailedPrecondition:
                    pass  # decided meanwhile
            del st["pending"][key]

    def checkpoint(self, event: Event, st: dict, label: str) -> dict:
        sid = self.session(event, st)
        cursor = transcripts.Cursor.from_dict(st.get("cursor", {}))
        messages, after = list(event.messages), cursor
        if event.transcript:
            skip = "" if cursor.path == event.transcript else self._head_entry(sid)
            try:
                read, after = self._read(event, st, cursor, skip)
            except transcripts.Unreadable as exc:  # the next event reads it again
                print(f"worldline hook: {exc}; this checkpoint has none of its messages",
                      file=sys.stderr)
                read = []
            messages += self._announced(read, st)
        if event.last_message:
            stand_in = transcripts.last_reply(messages, event.last_message)
            if stand_in:  # recorded now; its transcript entry, when read, is not again
                messages.append(stand_in)
                st["announced"] = event.last_message
        resume = {"agent": event.agent, "session_id": event.session_id, **after.as_dict()}
        cp = self.client.call("CreateCheckpoint", {
            "session_id": sid, "label": label[:200],
            "messages_json": json.dumps(messages) if messages else "",
            "resume_json": json.dumps(resume)})
        st["cursor"] = after.to_dict()
        return cp

    def _read(self, event: Event, st: dict, cursor: transcripts.Cursor, skip: str
              ) -> tuple[list[dict], transcripts.Cursor]:
        """The transcript's new entries. Claude Code writes its transcript in batches
        (every 100 ms): after a call, the entry that asked for it may not be written
        yet, and the hook waits for it, at most WAIT_ENTRY (once the transcript shows
        itself Claude Code's own: its entries carry the ``version`` that wrote them)."""
        read, after = transcripts.read_new(event.agent, event.transcript, cursor, skip)
        if any(isinstance(m.get("version"), str) for m in read):
            st["batched"] = True
        want = event.tool_use_id if event.agent == "claude-code" and event.kind == POST \
            and st.get("batched") else ""
        seen = st.get("uses", [])
        deadline = time.monotonic() + WAIT_ENTRY
        while want and want not in seen and want not in transcripts.tool_uses(read) \
                and time.monotonic() < deadline:
            time.sleep(0.02)
            more, after = transcripts.read_new(event.agent, event.transcript, after)
            read += more
        st["uses"] = (seen + transcripts.tool_uses(read))[-64:]
        return read, after

    @staticmethod
    def _announced(read: list[dict], st: dict) -> list[dict]:
        """The entries read, less the reply a Stop event already recorded from its
        payload (the first assistant entry read, when it has that text)."""
        text = st.pop("announced", None)
        for i, m in enumerate(read):
            if m.get("role") == "assistant":
                if text is not None and transcripts.reply_text(m) == text:
                    return read[:i] + read[i + 1:]
                break
        return read

    def _head_entry(self, sid: str) -> str:
        """The last transcript entry the session's head recorded: a conversation resumed
        from it copies the entries up to there into its new transcript."""
        cps = self.client.call("ListCheckpoints", {"session_id": sid})["checkpoints"]
        for cp in reversed(cps):
            if cp["resume_json"]:
                return json.loads(cp["resume_json"]).get("entry", "")
        return ""


def _stale_session(exc: WorldlineError) -> bool:
    return "session" in exc.message and (isinstance(exc, NotFound) or "deleted" in exc.message)


def _same_args(stored: str, wanted: str) -> bool:
    try:
        return json.dumps(json.loads(stored or "{}"), sort_keys=True) == wanted
    except ValueError:
        return False


def _command(event: Event) -> str:
    """The short form of a call's input that labels its checkpoint: its command, or its
    file relative to the project."""
    args = event.tool_input
    for key in ("command", "cmd", "file_path", "path", "pattern", "url", "query"):
        value = args.get(key)
        if isinstance(value, str) and value:
            root = event.project.rstrip("/") + "/"
            return value[len(root):] if value.startswith(root) else value
    return json.dumps(args) if args else ""


def _short(text: str, limit: int = 60) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


# -- the daemon is down ------------------------------------------------------------------
def unavailable_answer(config: Config, event: Event, exc: WorldlineError) -> dict:
    """Fail open or closed, as configured; by default open after a call and for calls
    the built-in policy (and ``$WORLDLINE_POLICY``) does not gate, closed for gated
    ones."""
    closed = _fails_closed(config, event)
    why = f"worldline hook: {exc.message}"
    print(why + ("; refusing the call (fail closed)" if closed else
                 "; continuing without a checkpoint (fail open)"), file=sys.stderr)
    if closed:
        return agents.answer(event, DENY, why + "; the call needs worldline's approval gate")
    return agents.answer(event, PASS)


def _fails_closed(config: Config, event: Event) -> bool:
    """Whether a call the hook could not check is refused: only before a call, and then
    as ``--unavailable`` says, else when the local policy gates it."""
    if event.kind != PRE:
        return False
    if config.unavailable:
        return config.unavailable == "closed"
    return _locally_gated(event)


def _locally_gated(event: Event) -> bool:
    from worldline.daemon.policy import Policy
    policy_file = os.environ.get("WORLDLINE_POLICY")
    try:
        policy = Policy.load(policy_file) if policy_file else Policy()
    except WorldlineError:
        return True
    decision = policy.classify(event.tool, event.tool_input)
    return decision.effect == GATED or decision.requires_approval


OPTIONS = {"--address": str, "--workspace": str, "--container": str, "--image": str,
           "--approval": str, "--wait": float, "--ttl": float, "--unavailable": str}
CHOICES = {"--approval": (ASK, "wait", DENY), "--unavailable": ("open", "closed")}
USAGE = f"""usage: worldline hook {{{','.join(agents.AGENTS)}}} [options] < payload.json

Answer one hook event of a coding agent: its payload on stdin, its own answer on stdout.

options:
  --address ADDR        the daemon (default $WORLDLINE_ADDRESS or the default socket)
  --workspace DIR       the session's workspace (default: the agent's project folder,
                        else the payload's cwd)
  --container NAME      attach this container to the sessions it creates
  --image IMAGE         or start their containers from this image
  --approval MODE       gated calls: ask (the person at the agent; the default where the
                        agent can ask), wait (for an operator), deny (with the command
                        that approves it; Gemini's default)
  --wait SECONDS        with --approval wait: how long (default 300)
  --ttl SECONDS         approvals expire after (default: the daemon's, 3600)
  --unavailable MODE    open | closed when the daemon cannot be reached (default: open
                        after a call and for ungated calls, closed for gated ones)
"""


def _parse_options(argv: list[str]) -> dict:
    """The hook's options, by hand: argparse alone costs the process ~13 ms."""
    if argv[:1] in (["-h"], ["--help"]):
        print(USAGE)
        raise SystemExit(0)
    if not argv or argv[0] not in agents.AGENTS:
        raise SystemExit(f"worldline hook: the first argument is one of"
                         f" {', '.join(agents.AGENTS)}\n{USAGE}")
    options = {"agent": argv[0]}
    rest = argv[1:]
    while rest:
        word = rest.pop(0)
        name, equals, value = word.partition("=")
        if name in ("-h", "--help"):
            print(USAGE)
            raise SystemExit(0)
        if name not in OPTIONS:
            raise SystemExit(f"worldline hook: unknown option {word}\n{USAGE}")
        if not equals:
            if not rest:
                raise SystemExit(f"worldline hook: {name} needs a value")
            value = rest.pop(0)
        try:
            options[name[2:]] = OPTIONS[name](value)
        except ValueError:
            raise SystemExit(f"worldline hook: {name} takes a number, not {value!r}") from None
        if name in CHOICES and value not in CHOICES[name]:
            raise SystemExit(f"worldline hook: {name} is one of {', '.join(CHOICES[name])}")
    return options


def main(argv: list[str]) -> int:
    o = _parse_options(argv)
    config = Config(o["agent"], o.get("address"), o.get("workspace", ""),
                    o.get("container", ""), o.get("image", ""), o.get("approval", ""),
                    o.get("wait", 300.0), o.get("unavailable", ""), o.get("ttl", 0.0))
    text = sys.stdin.read()
    try:
        event = agents.parse(config.agent, text)
    except agents.PayloadError as exc:
        print(f"worldline hook: {exc}", file=sys.stderr)
        print("{}")
        return 0
    from ..lite import connect
    started = time.monotonic()
    try:
        with connect(config.address, timeout=60.0) as client:
            out = Hook(config, client).handle(event)
    except Unavailable as exc:
        out = unavailable_answer(config, event, exc)
    except OSError as exc:  # its state folder unwritable, say: never leave the agent hanging
        out = unavailable_answer(config, event, Unavailable(
            f"cannot keep the hook's state: {exc}"))
    except WorldlineError as exc:
        # The daemon answered with an error: say so, and neither block a call that is
        # not gated nor let through one the hook could not check.
        closed = _fails_closed(config, event)
        print(f"worldline hook: {exc}", file=sys.stderr)
        out = agents.answer(event, DENY if closed else PASS,
                            f"worldline hook: {exc}" if closed else "")
    if os.environ.get("WORLDLINE_HOOK_DEBUG"):
        print(f"worldline hook: {event.name} in {1000 * (time.monotonic() - started):.1f} ms",
              file=sys.stderr)
    sys.stdout.write(json.dumps(out) + "\n")
    return 0
