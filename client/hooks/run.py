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
  transcript entries appended since the last checkpoint and where they end. A gated
  call that ran though the gate refused it, or asked at a client that does not honour
  ask, is recorded as a gate bypass: never as an approval.
- a call that fired no after-tool event (Codex applies an ``apply_patch`` sent through
  its shell tool itself, firing only PreToolUse): the next event records it and
  checkpoints its changes before anything else, so they are attributed to it.

The hook never answers a decision the client ignores (support.py, per client
version): where ``ask`` is not honoured it refuses the call with the approval's id and
the command that approves it; where ``allow`` is not honoured it passes an approved
call to the client's own rules; an unknown version gets refusals for gated calls.
- prompt submitted, stop: checkpoint.
"""

from __future__ import annotations

import os
import sys
import time

from .. import _json as json
from ..errors import (
    AlreadyExists,
    FailedPrecondition,
    NotFound,
    PermissionDenied,
    Unavailable,
    WorldlineError,
)
from . import agents, state, support, transcripts
from .agents import ALLOW, ASK, DENY, PASS, POST, PRE, PROMPT, START, STOP, Event

GATED = "external_non_idempotent"
BYPASSED = "bypassed"  # a tool call's gate: it ran though the gate did not let it
TRANSCRIBED = ("claude-code", "codex", "gemini")  # agents whose events name a transcript
MAX_RESULT = 1 << 20
WAIT_ENTRY = 0.5  # s: the longest a hook waits for the transcript entry of its call


class Config:
    def __init__(self, agent: str, address: str | None = None, workspace: str = "",
                 container: str = "", image: str = "", approval: str = "",
                 wait: float = 300.0, unavailable: str = "", ttl: float = 0.0,
                 client_version: str = "") -> None:
        env = os.environ
        self.agent = agent
        self.address = address
        self.workspace = workspace or env.get("WORLDLINE_HOOK_WORKSPACE", "")
        self.container = container
        self.image = image
        # The client's version as `worldline init` found it ("unknown": it could not);
        # none given: the client as worldline last knew it.
        self.client_version = client_version or env.get("WORLDLINE_HOOK_CLIENT_VERSION", "")
        self.support = None if self.client_version == support.UNKNOWN else \
            support.support(agent, self.client_version)
        # For tests of clients that ignore the gate: answer as configured even where
        # the client is known not to honour that answer.
        self.unchecked = env.get("WORLDLINE_HOOK_UNCHECKED") == "1"
        self.approval = approval or env.get("WORLDLINE_HOOK_APPROVAL", "") or (
            ASK if self.honours(ASK) else DENY)
        if self.approval == ASK and not self.answers(ASK):
            self.approval = DENY
        self.wait = float(env.get("WORLDLINE_HOOK_WAIT", wait))
        self.unavailable = unavailable or env.get("WORLDLINE_HOOK_UNAVAILABLE", "")
        self.ttl = ttl

    def honours(self, decision: str) -> bool:
        """Whether the client, as its version is known, honours this answer."""
        return self.support is not None and self.support.honours(decision)

    def answers(self, decision: str) -> bool:
        """Whether the hook may give this answer (deny always: it fails closed)."""
        return decision == DENY or self.unchecked or self.honours(decision)

    def may_skip_after_event(self) -> bool:
        """Whether a call that ran may fire no after-tool event at this client (an
        unknown version: as the newest known one does)."""
        return (self.support or support.support(self.agent)).skips_after_event


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
            except (AlreadyExists, FailedPrecondition):  # made meanwhile: found again
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
                self.close_open(event, st)
                self.after_tool(event, st)
            elif event.kind in (PROMPT, STOP):
                self.close_open(event, st)
                self.withdraw_stale(st)
                label = ("session end" if event.name == "SessionEnd" else "stop") \
                    if event.kind == STOP else "prompt: " + _short(event.prompt)
                self.checkpoint(event, st, label)
        return agents.answer(event)

    def before_tool(self, event: Event) -> dict:
        key = state.pending_key(event.tool, event.tool_input, event.tool_use_id)
        with state.held(event.agent, event.session_id) as st:
            sid = self.session(event, st)
            self.close_open(event, st)
            args = json.dumps(event.tool_input)
            decision = self.client.call("ExplainPolicy", {"tool": event.tool,
                                                          "args_json": args})
            if decision["effect"] != GATED and not decision["requires_approval"]:
                self._opened(st, key, event)
                return agents.answer(event, PASS)
            approval = self._approval_for(sid, event, args)
            st.setdefault("pending", {})[key] = approval["id"]
        answer = self._gate(event, decision, approval)  # (may wait: not holding the state)
        out = answer[0]
        asked = out == ASK and self.config.honours(ASK)
        if asked or out in (ALLOW, PASS):  # (_gate passes only an approved call)
            with state.held(event.agent, event.session_id) as st:
                if asked:  # the person's yes, if the call runs, is their approval
                    st.setdefault("asked", {})[key] = approval["id"]
                else:
                    self._opened(st, key, event, approval["id"])
        return agents.answer(event, *answer)

    def _opened(self, st: dict, key: str, event: Event, approval_id: str = "") -> None:
        """A call let through, at a client that may fire no after-tool event for it:
        kept until its after-tool event or the next event."""
        if self.config.may_skip_after_event():
            st.setdefault("open", {})[key] = {
                "tool": event.tool, "input": event.tool_input, "id": event.tool_use_id,
                "approval": approval_id}

    def _gate(self, event: Event, decision: dict, approval: dict) -> tuple[str, str]:
        """The answer to a gated call, as (decision, reason), in what the client honours.
        Talks to the daemon (WaitApproval) in wait mode."""
        what = (f"worldline: {event.tool} {_short(_command(event))!r} is {decision['effect']}"
                f" ({decision['rule']})")
        if approval["status"] == "approved":
            return self._allow(f"{what}; approved ({approval['id']})")
        approve = f"`worldline approve {approval['id']}`"
        taken = f"checkpoint {approval['checkpoint_id']} taken before it"
        mode = self.config.approval
        if mode == ASK and decision.get("approver") == "owner":
            # The person's yes at the agent would be no approval here: the call is
            # refused until the daemon's owner approves it, as in deny mode.
            return DENY, (f"{what}; {taken}. Approvals here are the daemon owner's"
                          f" (--approvals-by owner): retry once the owner has run {approve}.")
        if mode == "wait":
            approval = self.client.call("WaitApproval", {
                "approval_id": approval["id"], "timeout_seconds": self.config.wait},
                timeout=self.config.wait + 30)
            if approval["status"] == "approved":
                return self._allow(f"{what}; approved by an operator")
            if approval["status"] == "denied":
                return DENY, f"{what}; denied by an operator: {approval['reason']}"
            return DENY, (f"{what}; approval {approval['id']} is {approval['status']}: retry"
                          f" once an operator has run {approve}")
        if mode == ASK and self.config.answers(ASK):
            return ASK, f"{what}; {taken}. An operator may also run {approve}."
        return DENY, (f"{what}; {taken}. It needs approval (approval {approval['id']}):"
                      f" retry once an operator has run {approve}.")

    def _allow(self, reason: str) -> tuple[str, str]:
        """An approved call: allowed where the client honours allow, else passed to the
        client's own rules (Codex 0.171.0 ignores allow; it runs the call either way)."""
        return (ALLOW, reason) if self.config.answers(ALLOW) else (PASS, "")

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
        st.get("open", {}).pop(key, None)
        approval_id = st.get("pending", {}).pop(key, "")
        asked = st.get("asked", {}).pop(key, "")
        bypassed = ""
        if approval_id:
            approval = self.client.call("GetApproval", {"approval_id": approval_id})
            if approval["status"] == "pending" and asked:
                # The person at a client that honours ask said yes: their approval.
                try:
                    self.client.call("DecideApproval", {
                        "approval_id": approval_id, "approve": True,
                        "reason": f"allowed by the person at {event.agent}"})
                except PermissionDenied as exc:  # the daemon's owner alone approves
                    print(f"worldline hook: the person's yes is not an approval here"
                          f" ({exc.message}); run the hooks with --approval wait",
                          file=sys.stderr)
                    bypassed, approval_id = approval_id, ""
            elif approval["status"] != "approved":
                # The gate refused the call, or asked a client that does not honour
                # ask, and it ran anyway: a bypass, never an approval.
                bypassed, approval_id = approval_id, ""
        result = json.dumps(event.tool_response)
        if len(result) > MAX_RESULT:
            result = json.dumps({"truncated": True, "bytes": len(result)})
        request = {"session_id": sid, "name": event.tool,
                   "args_json": json.dumps(event.tool_input), "result_json": result,
                   "idempotency_key": event.tool_use_id, "approval_id": approval_id}
        if bypassed:
            self.client.call("RecordToolCall", {**request, "approval_id": bypassed,
                                                "gate": BYPASSED})
        else:
            try:
                self.client.call("RecordToolCall", request)
            except FailedPrecondition as exc:
                if approval_id:
                    raise
                # A tool the policy gates ran without an approval worldline knows of
                # (the pre-hook could not reach the daemon, and refused it): a bypass.
                print(f"worldline hook: {exc.message}", file=sys.stderr)
                self.client.call("RecordToolCall", {**request, "gate": BYPASSED})
                bypassed = "none"
        if bypassed:  # (the daemon puts it on the next checkpoint: said here too)
            print(f"worldline hook: warning: {bypass_warning(event, bypassed)}",
                  file=sys.stderr)
        self.checkpoint(event, st, f"{event.tool}: {_short(_command(event))}")

    def close_open(self, event: Event, st: dict) -> None:
        """Record the calls let through that fired no after-tool event (other than the
        one this event is about), each followed by a checkpoint of what it changed,
        before this event's own work: the changes are attributed to the call that made
        them. (Parallel calls at such a client may be closed before they end: recorded
        then, their own after-tool event finds them recorded.)"""
        calls = st.get("open")
        if not calls:
            return
        mine = state.pending_key(event.tool, event.tool_input, event.tool_use_id) \
            if event.kind in (PRE, POST) else ""
        sid = self.session(event, st)
        for key, call in list(calls.items()):
            if key == mine:
                continue
            del calls[key]
            st.get("pending", {}).pop(key, None)
            try:
                self.client.call("RecordToolCall", {
                    "session_id": sid, "name": call["tool"],
                    "args_json": json.dumps(call["input"]), "result_json": "",
                    "idempotency_key": call["id"], "approval_id": call["approval"]})
            except FailedPrecondition as exc:
                print(f"worldline hook: tool call not recorded: {exc.message}",
                      file=sys.stderr)
            shown = Event(event.agent, event.name, POST, event.session_id, event.cwd,
                          event.project, event.transcript)
            shown.tool, shown.tool_input = call["tool"], call["input"]
            self.checkpoint(event, st, f"{call['tool']}: {_short(_command(shown))}"
                                       f" (no after-tool event)")

    def withdraw_stale(self, st: dict) -> None:
        """Approvals put to the person at the agent before tool calls that never ran
        (they said no, or the call was interrupted) are withdrawn once the turn moves
        on. One the gate refused stays pending: the model was told to retry once an
        operator approves it."""
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
        """A checkpoint with the transcript's entries since the last one; what could
        not be read is a warning on it (and on stderr), never a conversation recorded
        as if whole. (The daemon adds its own, a gate bypass's say.)"""
        sid = self.session(event, st)
        cursor = transcripts.Cursor.from_dict(st.get("cursor", {}))
        messages, after, warnings = list(event.messages), cursor, []
        if event.transcript:
            skip = "" if cursor.path == event.transcript else self._head_entry(sid)
            read, after, unread = self._read(event, st, cursor, skip)
            messages += self._announced(read, st)
            warnings += unread
        elif event.agent in TRANSCRIBED:
            warnings += [f"{event.agent} named no transcript (transcript_path) in its"
                         f" {event.name} event: this checkpoint holds no conversation"]
        if event.last_message:
            stand_in = transcripts.last_reply(messages, event.last_message)
            if stand_in:  # recorded now; its transcript entry, when read, is not again
                messages.append(stand_in)
                st["announced"] = event.last_message
        for warning in warnings:
            print(f"worldline hook: warning: {warning}", file=sys.stderr)
        resume = {"agent": event.agent, "session_id": event.session_id, **after.as_dict()}
        request = {"session_id": sid, "label": label[:200],
                   "messages_json": json.dumps(messages) if messages else "",
                   "resume_json": json.dumps(resume)}
        if warnings:  # (only then: an older daemon knows no such field)
            request["warnings"] = warnings
        cp = self.client.call("CreateCheckpoint", request)
        st["cursor"] = after.to_dict()
        return cp

    def _read(self, event: Event, st: dict, cursor: transcripts.Cursor, skip: str
              ) -> tuple[list[dict], transcripts.Cursor, list[str]]:
        """The transcript's new entries. Claude Code writes its transcript in batches
        (every 100 ms): after a call, the entry that asked for it may not be written
        yet, and the hook waits for it, at most WAIT_ENTRY (once the transcript shows
        itself Claude Code's own: its entries carry the ``version`` that wrote them)."""
        final = event.kind in (PROMPT, STOP)  # the turn is over: nothing changes
        read, after, warnings = transcripts.read_new(
            event.agent, event.transcript, cursor, skip, final=final,
            missing_ok=event.kind == PROMPT and not cursor.entries)
        if any(isinstance(m.get("version"), str) for m in read):
            st["batched"] = True
        want = event.tool_use_id if event.agent == "claude-code" and event.kind == POST \
            and st.get("batched") else ""
        seen = st.get("uses", [])
        deadline = time.monotonic() + WAIT_ENTRY
        while want and not warnings and want not in seen \
                and want not in transcripts.tool_uses(read) and time.monotonic() < deadline:
            # (a transcript that cannot be read is said once, and not waited on)
            time.sleep(0.02)
            more, after, unread = transcripts.read_new(event.agent, event.transcript, after,
                                                       final=final)
            read += more
            warnings += unread
        st["uses"] = (seen + transcripts.tool_uses(read))[-64:]
        return read, after, warnings

    @staticmethod
    def _announced(read: list[dict], st: dict) -> list[dict]:
        """The entries read, less the reply a Stop event already recorded from its
        payload (the first assistant entry read with text, when it has that text: an
        entry of the same reply before it holds its thinking or a tool use alone)."""
        text = st.pop("announced", None)
        if text is None:
            return read
        for i, m in enumerate(read):
            if m.get("role") == "assistant":
                said = transcripts.reply_text(m)
                if said == text:
                    return read[:i] + read[i + 1:]
                if said:
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


def bypass_warning(event: Event, approval_id: str) -> str:
    what = f"{event.tool} {_short(_command(event))!r}"
    asked = f" (approval {approval_id} was not granted)" if approval_id != "none" else ""
    return (f"gate bypassed: {event.agent} ran {what}, which needs an approval, without"
            f" one{asked}")


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
    from worldline.wire.policy import Policy
    policy_file = os.environ.get("WORLDLINE_POLICY")
    try:
        policy = Policy.load(policy_file) if policy_file else Policy()
    except WorldlineError:
        return True
    decision = policy.classify(event.tool, event.tool_input)
    return decision.effect == GATED or decision.requires_approval


OPTIONS = {"--address": str, "--workspace": str, "--container": str, "--image": str,
           "--approval": str, "--wait": float, "--ttl": float, "--unavailable": str,
           "--client-version": str}
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
  --client-version V    the agent's version (`worldline init` writes the installed
                        one): the hook answers only what that version honours;
                        "unknown" refuses gated calls
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
            options[name[2:].replace("-", "_")] = OPTIONS[name](value)
        except ValueError:
            raise SystemExit(f"worldline hook: {name} takes a number, not {value!r}") from None
        if name in CHOICES and value not in CHOICES[name]:
            raise SystemExit(f"worldline hook: {name} is one of {', '.join(CHOICES[name])}")
    return options


def main(argv: list[str]) -> int:
    o = _parse_options(argv)
    config = Config(o["agent"], o.get("address"), o.get("workspace", ""),
                    o.get("container", ""), o.get("image", ""), o.get("approval", ""),
                    o.get("wait", 300.0), o.get("unavailable", ""), o.get("ttl", 0.0),
                    o.get("client_version", ""))
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
