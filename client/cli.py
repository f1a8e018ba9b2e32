"""The ``worldline`` command line. Every command takes ``--json`` (stdout is then
exactly one JSON document) and ``--address``. Errors print one line on stderr,
``error: CODE: message``, and exit non-zero."""

from __future__ import annotations

import json
import os
import sys

from .about import version
from .errors import InvalidArgument, WorldlineError

# `worldline hook` runs on every tool call: this module imports nothing it does not
# need to start (typing alone costs a new process milliseconds).
TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable
    from typing import Any

    from ._client import Client

EXIT_ERROR, EXIT_DENIED, EXIT_EXPIRED = 1, 3, 4


class Output:
    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json

    def emit(self, document: Any, human: Callable[[], str], paged: bool = False) -> None:
        """``paged``: a text longer than the terminal goes through the pager ($PAGER,
        else less) when stdout is a terminal."""
        if self.as_json:
            json.dump(document, sys.stdout, ensure_ascii=False, indent=2)
            sys.stdout.write("\n")
        else:
            text = human()
            if paged and sys.stdout.isatty() and text.count("\n") > _rows():
                import pydoc
                pydoc.pager(text)
            elif text:
                print(text)


def _rows() -> int:
    import shutil
    return shutil.get_terminal_size().lines - 2


def _table(rows: list[list[str]], headers: list[str]) -> str:
    if not rows:
        return "(none)"
    widths = [max(len(str(r[i])) for r in rows + [headers]) for i in range(len(headers))]
    line = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
    return "\n".join([line(headers)] + [line(r) for r in rows])


def _kv(d: dict, keys: list[str]) -> str:
    return "\n".join(f"{k}: {d[k] if d[k] is not None else '-'}" for k in keys)


def _read_json_file(value: str, what: str) -> str:
    """JSON given inline (it starts with ``[`` or ``{``), from stdin (``-``) or in a file."""
    if value.lstrip().startswith(("[", "{")):
        return value
    try:
        if value == "-":
            return sys.stdin.read()
        with open(value, encoding="utf-8") as f:
            return f.read()
    except OSError as exc:
        raise InvalidArgument(f"cannot read {what} file {value}: {exc.strerror}") from None


def _session_human(s: dict) -> str:
    text = _kv(s, ["id", "name", "workspace", "container", "head", "forked_from", "created_at"]
               + [k for k in ("host", "released_to", "needs_attention") if s.get(k)])
    excluded = [(p, "--exclude") for p in s.get("exclude") or ()] + [
        (p, ".worldlineignore") for p in s.get("ignore_file") or ()]
    if excluded:  # never captured nor restored
        text += "\nexcluded:\n" + "\n".join(f"  {p}  ({where})" for p, where in excluded)
    return text


def _calls_cell(calls: list[dict]) -> str:
    """The tool calls before a checkpoint, in one cell: how many, and the first."""
    if not calls:
        return "-"
    return f"{len(calls)}: {_call_summary(calls[0], 30)}" + (" …" if len(calls) > 1 else "")


def _effects_human(effects: list[dict]) -> str:
    if not effects:
        return ""
    rows = [[e["tool_call_id"], e["tool"] + (" (gate bypassed)" if e.get("gate") else ""),
             e["created_at"][:19], e["args_summary"][:60]] for e in effects]
    return "side effects no restore can undo:\n" + _table(rows, ["TOOL CALL", "TOOL", "AT", "ARGS"])


# -- commands --------------------------------------------------------------------------
def cmd_session(c: Client, a, out: Output) -> int:
    if a.session_cmd == "create":
        s = c.create_session(os.path.abspath(a.workspace), container=a.container, name=a.name,
                             image=a.image, mount=a.mount, exist_ok=a.exist_ok,
                             exclude=a.exclude)
        out.emit(s.to_dict(), lambda: _session_human(s.to_dict()))
    elif a.session_cmd == "list":
        sessions = [s.to_dict() for s in c.list_sessions(include_deleted=a.all)]
        fleet = any(s["host"] for s in sessions)
        out.emit(sessions, lambda: _table(
            [[s["id"], s["name"], s["head"]] + ([s["host"] or "-"] if fleet else [])
             + [s["workspace"] + ("  [needs attention]" if s["needs_attention"] else "")]
             for s in sessions],
            ["ID", "NAME", "HEAD"] + (["HOST"] if fleet else []) + ["WORKSPACE"]))
    elif a.session_cmd == "resolve":
        s = c.resolve_session(a.id, complete=a.complete).to_dict()
        out.emit(s, lambda: _session_human(s))
    elif a.session_cmd == "move":
        s = c.move_session(a.id, to_host=a.to or "", take_over=a.take_over,
                           workspace=a.workspace).to_dict()
        out.emit(s, lambda: (f"session {s['id']} taken over by host {s['host']}:"
                             f" {s['workspace']} rebuilt from its head" if a.take_over else
                             f"session {s['id']} released to {s['released_to']}: take it"
                             f" over there with `worldline session move {s['id']}"
                             " --take-over`"))
    elif a.session_cmd == "delete":
        s = c.delete_session(a.id, keep_container=a.keep_container).to_dict()
        container = (f"; its container {s['container']} "
                     + ("keeps running" if a.keep_container else "is stopped")
                     if s["container"] else "")
        out.emit(s, lambda: f"session {s['id']} deleted: its history is kept, its workspace"
                            f" {s['workspace']} is released{container}")
    else:
        s = c.get_session(a.id).to_dict()
        out.emit(s, lambda: _session_human(s))
    return 0


def cmd_checkpoint(c: Client, a, out: Output) -> int:
    messages = _read_json_file(a.messages, "messages") if a.messages else ""
    state = _read_json_file(a.state, "state") if a.state else ""
    cp = c.checkpoint_raw(a.session, messages_json=messages, state_json=state, label=a.label,
                          reasoning=a.reasoning, trace_id=a.trace_id,
                          expected_head=a.expected_head, warnings=a.warning).to_dict()
    out.emit(cp, lambda: f"checkpoint {cp['id']} (seq {cp['seq']})"
             + "".join(f"\nwarning: {w}" for w in cp["warnings"]))
    return 0


def _call_summary(t: dict, width: int = 60) -> str:
    """A tool call as a person reads it: its name and its command or file."""
    args = t.get("args") if isinstance(t.get("args"), dict) else {}
    key = next((k for k in ("command", "file_path", "path", "url", "query") if args.get(k)),
               None)
    what = " ".join(str(args[key]).split()) if key else ""
    if len(what) > width:  # a command's start, a file's end
        what = what[:width] + "…" if key == "command" else "…" + what[-width:]
    return f"{t['name']} {what}".rstrip()


def cmd_log_path(c: Client, a, out: Output) -> int:
    from .paths import escape
    changes = [ch.to_dict() for ch in c.path_history(a.session, escape(a.path),
                                                     patch=a.patch)]

    def human() -> str:
        if not changes:
            return f"(no checkpoint of session {a.session} changed {a.path})"
        lines = []
        for ch in changes:
            cp = ch["checkpoint"]
            note = cp["label"] or (f"restore of {cp['restored_from']}"
                                   if cp["kind"] == "restore" else "")
            lines.append(f"#{cp['seq']:<4} {cp['id']}  {ch['change']:<8} {cp['created_at'][:19]}"
                         f"  {cp['kind']}{'  ' + note if note else ''}")
            lines += [f"      by {t['id']}  {_call_summary(t)}" for t in ch["tool_calls"]]
            if a.patch and ch["patch"]:
                lines.append(ch["patch"].rstrip("\n"))
        return "\n".join(lines)
    out.emit(changes, human)
    return 0


def cmd_cat(c: Client, a, out: Output) -> int:
    from .paths import escape
    data = c.read_file(a.checkpoint, escape(a.path))
    if out.as_json:
        import base64
        out.emit({"checkpoint_id": a.checkpoint, "path": a.path, "size": len(data),
                  "base64": base64.b64encode(data).decode("ascii")}, str)
    else:
        sys.stdout.buffer.write(data)
    return 0


def cmd_log(c: Client, a, out: Output) -> int:
    if a.path:
        return cmd_log_path(c, a, out)
    cps = [cp.to_dict() for cp in c.log(a.session)]
    if not a.graph:
        def rows() -> str:  # each checkpoint with the tool calls made before it
            calls: dict[str, list[dict]] = {}
            for t in c.tool_calls(a.session):
                calls.setdefault(t.checkpoint_id, []).append(t.to_dict())
            return _table([[cp["seq"], cp["id"], cp["kind"] + (" [pruned]" if cp["pruned"]
                                                                 else "")
                            + (f" [{len(cp['warnings'])} warning(s)]" if cp.get("warnings")
                               else ""),
                            cp["created_at"][:19], f"+{cp['messages_added']}",
                            _calls_cell(calls.get(cp["parent_id"] or "", [])
                                        if cp["kind"] == "checkpoint" else []),
                            cp["label"]] for cp in cps],
                          ["SEQ", "ID", "KIND", "CREATED", "MSGS", "CALLS", "LABEL"])
        out.emit(cps, rows)
        return 0
    seq_of = {cp["id"]: cp["seq"] for cp in cps}
    forks: dict[str, list[dict]] = {}
    for s in c.list_sessions():
        if s.forked_from in seq_of:
            forks.setdefault(s.forked_from, []).append(
                {**s.to_dict(), "checkpoints": len(c.log(s.id))})

    def human() -> str:
        lines = []
        for cp in reversed(cps):
            note = cp["label"]
            if cp["kind"] == "restore":
                target = cp["restored_from"]
                where = f"#{seq_of[target]}" if target in seq_of else f"{target} (elsewhere)"
                note = f"↺ restored to {where}"
            pruned = " [pruned]" if cp["pruned"] else ""
            lines.append(f"* #{cp['seq']:<4} {cp['id']}  {cp['kind']:<10} {note}{pruned}")
            for f in forks.get(cp["id"], []):
                lines.append("|\\")
                lines.append(f"| ⑂ fork {f['id']} \"{f['name']}\": {f['checkpoints']}"
                             f" checkpoint(s) in {f['workspace']}")
                lines.append("|/")
        return "\n".join(lines)

    out.emit({"checkpoints": cps, "forks": forks}, human)
    return 0


def cmd_show(c: Client, a, out: Output) -> int:
    d = c.show(a.checkpoint).to_dict()
    out.emit(d, lambda: _kv(d, ["id", "session_id", "seq", "kind", "parent_id", "label",
                                "reasoning", "created_at", "tree", "bytes", "message_count"])
             + f"\ntasks: {len(d['tasks'])}"
             + "".join(f"\n  [{t['status']}] {t['id']} {t['title']}" for t in d["tasks"])
             + f"\nstate: {json.dumps(d['state'])[:200]}"
             + f"\nconversation ({len(d['messages'])} message(s)):"
             + "".join(f"\n{_message_human(m)}" for m in d["messages"])
             + "".join(f"\nwarning: {w}" for w in d["warnings"]), paged=True)
    return 0


def _message_human(m: Any) -> str:
    """One message of a conversation as a person reads it: who, then what (long ones
    cut at 2,000 characters, saying so)."""
    if not isinstance(m, dict):
        return f"  {json.dumps(m, ensure_ascii=False)[:2000]}"
    content = m.get("content", m.get("text", ""))
    if not isinstance(content, str):
        content = json.dumps(content, ensure_ascii=False)
    cut = f" … ({len(content)} characters)" if len(content) > 2000 else ""
    body = "\n    ".join(content[:2000].splitlines() or [""])
    return f"  {m.get('role', '?')}: {body}{cut}"


def cmd_diff(c: Client, a, out: Output) -> int:
    d = c.diff(a.from_id, a.to_id, patch=a.patch).to_dict()
    if not a.patch:
        d.pop("patch")

    def human() -> str:
        if a.patch:
            return d["patch"].rstrip("\n")
        lines = _changes_human(d)
        if d.get("container"):
            lines += _changes_human(d["container"], "container:")
        return "\n".join(lines) or "(no differences)"
    out.emit(d, human)
    return 0


def _changes_human(d: dict, prefix: str = "") -> list[str]:
    lines = [f"A {prefix}{p}" for p in d["added"]] + [f"M {prefix}{p}" for p in d["modified"]] \
        + [f"D {prefix}{p}" for p in d["deleted"]]
    return sorted(lines, key=lambda s: s[2:])


def _followed(c: Client, a, call: Callable[[str | None], Any]) -> Any:
    """``call(operation_id)``, with a progress bar on stderr when wanted: by default on
    a terminal unless --json; --progress and --no-progress decide otherwise."""
    wanted = a.progress if a.progress is not None else (
        sys.stderr.isatty() and not getattr(a, "json", False))
    if not wanted:
        return call(None)
    from .progress import with_progress
    return with_progress(c, call, sys.stderr, sys.stderr.isatty())


def cmd_restore(c: Client, a, out: Output) -> int:
    from .paths import escape
    r = _followed(c, a, lambda op: c.restore(
        a.session, a.checkpoint, acknowledge_side_effects=a.yes, dry_run=a.dry_run,
        operation_id=op, from_other_session=a.from_other_session,
        paths=[escape(p) for p in a.path or ()])).to_dict()

    def human() -> str:
        verb = "would write" if a.dry_run else "wrote"
        gone = "would remove" if a.dry_run else "removed"
        head = "" if a.dry_run else f"restored to {r['restored_from']}: new head" \
                                    f" {r['checkpoint']['id']}\n"
        text = f"{head}{verb} {len(r['files_written'])} path(s), {gone}" \
               f" {len(r['files_removed'])}"
        if a.dry_run:  # the paths themselves, as `diff` shows them
            text += "".join(f"\n  W {p}" for p in r["files_written"])
            text += "".join(f"\n  D {p}" for p in r["files_removed"])
        box = r.get("container")
        if box is not None:
            text += f"\ncontainer: {verb} {len(box['files_written'])} path(s), {gone}" \
                    f" {len(box['files_removed'])}"
            if a.dry_run:
                text += "".join(f"\n  W container:{p}" for p in box["files_written"])
                text += "".join(f"\n  D container:{p}" for p in box["files_removed"])
        text += _kept_human(r, a.dry_run)
        for warning in r.get("warnings", []):
            text += f"\nwarning: {warning}"
        effects = _effects_human(r["side_effects"])
        return text + ("\n" + effects if effects else "")
    out.emit(r, human, paged=a.dry_run)
    return 0


def _kept_human(r: dict, dry_run: bool) -> str:
    """What a restore keeps of the world as it was: the paths that differed from the
    head, the checkpoint that holds them, the container's processes it stops."""
    text = ""
    unsaved = r.get("not_checkpointed") or []
    if unsaved and dry_run:
        text += (f"\n{len(unsaved)} path(s) differ from the head; the restore checkpoints"
                 " them first (label \"before restore\"):")
    elif unsaved and r.get("before"):
        text += (f"\nthe world as it was is kept as checkpoint {r['before']['id']}: undo with"
                 f" `worldline restore {r['before']['session_id']} {r['before']['id']}`;"
                 f" {len(unsaved)} path(s) were not checkpointed before:")
    elif unsaved:
        text += f"\n{len(unsaved)} path(s) differed from the head and were NOT kept:"
    text += "".join(f"\n  {p}" for p in unsaved)
    procs = r.get("processes") or []
    if procs:
        text += (f"\nthe container's processes {'it would stop' if dry_run else 'stopped'}"
                 " (the container starts again with its own command; these are not"
                 " resumed):")
        text += "".join(f"\n  {p}" for p in procs)
    return text


def cmd_fork(c: Client, a, out: Output) -> int:
    s = _followed(c, a, lambda op: c.fork(
        a.checkpoint, workspace=os.path.abspath(a.workspace) if a.workspace else None,
        name=a.name, operation_id=op, volumes=a.volumes))
    d = s.to_dict()
    d["side_effects"] = [e.to_dict() for e in getattr(s, "side_effects", [])]
    out.emit(d, lambda: _session_human(d) + ("\n" + _effects_human(d["side_effects"])
                                             if d["side_effects"] else ""))
    return 0


def cmd_image(c: Client, a, out: Output) -> int:
    image_id, reference = c.export_image(a.checkpoint)
    d = {"image_id": image_id, "reference": reference, "checkpoint_id": a.checkpoint}
    out.emit(d, lambda: f"{reference} ({image_id[:19]})")
    return 0


def cmd_tool(c: Client, a, out: Output) -> int:
    t = c.record_tool_call_raw(a.session, a.name, args_json=a.args or "",
                               result_json=a.result or "", effect=a.effect,
                               idempotency_key=a.idempotency_key,
                               approval_id=a.approval).to_dict()
    out.emit(t, lambda: f"tool call {t['id']}: {t['name']} ({t['effect']})"
             + (" [replayed: already executed]" if t["replayed"] else ""))
    return 0


def cmd_tools(c: Client, a, out: Output) -> int:
    calls = [t.to_dict() for t in c.tool_calls(a.session)]

    def human() -> str:
        log = c.log(a.session)
        seq = {cp.id: cp.seq for cp in log}
        made = {cp.parent_id: cp.seq for cp in log if cp.kind == "checkpoint"}
        return _table([[t["id"], _call_summary(t, 50), t["effect"] + (
                            f" (gate {t['gate']})" if t["gate"] else ""),
                        f"#{seq.get(t['checkpoint_id'], '?')}",
                        f"#{made[t['checkpoint_id']]}" if t["checkpoint_id"] in made else "-",
                        t["created_at"][:19]] for t in calls],
                      ["ID", "CALL", "EFFECT", "AFTER", "CHECKPOINT", "AT"])
    out.emit(calls, human)
    return 0


def cmd_task(c: Client, a, out: Output) -> int:
    t = c.set_task(a.session, a.task_id, a.status, title=a.title, parent=a.parent,
                   note=a.note).to_dict()
    out.emit(t, lambda: f"task {t['id']}: {t['status']}")
    return 0


def cmd_tasks(c: Client, a, out: Output) -> int:
    tasks, resume = c.tasks(a.session)
    d = {"tasks": [t.to_dict() for t in tasks], "resume": resume}
    out.emit(d, lambda: _table([[t["id"], t["status"], t["parent"] or "", t["title"]]
                                for t in d["tasks"]], ["ID", "STATUS", "PARENT", "TITLE"])
             + f"\nresume: {resume or '-'}")
    return 0


def _approval_human(ap: dict) -> str:
    return _kv(ap, ["id", "status", "tool", "checkpoint_id", "reason", "expires_at"])


def _approval_full(ap: dict) -> str:
    """An approval as a person decides on it: what the call would do, whose, until when."""
    return (_kv(ap, ["id", "status", "session_id", "tool", "checkpoint_id", "created_at",
                     "expires_at", "decided_at", "reason"])
            + "\nargs: " + json.dumps(ap["args"], ensure_ascii=False, indent=2)
            + (f"\ndecide: worldline approve {ap['id']}   or: worldline deny {ap['id']}"
               " --reason R" if ap["status"] == "pending" else ""))


def cmd_approval(c: Client, a, out: Output) -> int:
    ap = c.request_approval(a.session, a.tool, args_json=a.args or "", ttl=a.ttl)
    if a.wait is not None:
        print(f"approval {ap.id} requested (checkpoint {ap.checkpoint_id}); waiting up to"
              f" {a.wait:g} s. Approve: worldline approve {ap.id}   Deny: worldline deny"
              f" {ap.id} --reason R", file=sys.stderr, flush=True)
        ap = c.wait_approval(ap.id, timeout=a.wait)
    d = ap.to_dict()
    out.emit(d, lambda: _approval_human(d))
    if a.wait is None:
        return 0
    return {"approved": 0, "denied": EXIT_DENIED}.get(d["status"], EXIT_EXPIRED)


def cmd_approvals(c: Client, a, out: Output) -> int:
    if a.approvals_cmd == "show":
        d = c.get_approval(a.id).to_dict()
        out.emit(d, lambda: _approval_full(d))
        return 0
    if a.approvals_cmd == "cancel":
        d = c.cancel_approval(a.id, reason=a.reason or "").to_dict()
        out.emit(d, lambda: f"approval {d['id']}: {d['status']} ({d['reason']})")
        return 0
    if a.approvals_cmd == "watch":
        return _watch_approvals(c, a, out)
    aps = [ap.to_dict() for ap in c.list_approvals(a.session, a.status)]
    out.emit(aps, lambda: _table([[x["id"], x["status"], x["session_id"], x["tool"],
                                   json.dumps(x["args"], ensure_ascii=False)[:50]
                                   if x["args"] else "-",
                                   x["created_at"][:19], x["expires_at"][:19]] for x in aps],
                                 ["ID", "STATUS", "SESSION", "TOOL", "ARGS", "REQUESTED",
                                  "EXPIRES"]))
    return 0


_APPROVAL_EVENTS = {"approval.request": "requested", "approval.approved": "approved",
                    "approval.denied": "denied", "approval.expired": "expired"}


def _line_out(out: Output, document: dict, human: str) -> None:
    """One event of a follow: a JSON line with --json, else ``human``; at once."""
    print(json.dumps(document, ensure_ascii=False) if out.as_json else human, flush=True)


def _follow(events_of: Callable[[], Any]) -> int:
    """Run a follow until Ctrl-C, its usual end: exit 0 (a closed pipe: main's)."""
    try:
        events_of()
    except KeyboardInterrupt:
        pass
    return 0


def _watch_approvals(c: Client, a, out: Output) -> int:
    """The pending approvals, then one line per approval requested or decided from now
    on (each with the approval as it is then)."""
    def show(event: str, ap: dict) -> None:
        args = json.dumps(ap["args"], ensure_ascii=False)[:60] if ap["args"] else "-"
        decide = (f"  decide: worldline approve {ap['id']} | worldline deny {ap['id']}"
                  " --reason R" if ap["status"] == "pending" else
                  f"  {ap['reason']}" if ap["reason"] else "")
        at = ap["created_at"] if event in ("pending", "requested") else ap["decided_at"] or ""
        _line_out(out, {"event": event, **ap},
                  f"{at[:19]}"
                  f"  {event:<9}  {ap['id']}  session {ap['session_id']}  {ap['tool']}"
                  f"  {args}  expires {ap['expires_at'][:19]}{decide}")

    def run() -> None:
        import time
        cursor = c.wait_audit(-1)[1]   # first: so that none falls between list and follow
        seen, waiting = set(), {}      # waiting: pending approval -> when it expires
        for ap in c.list_approvals(a.session, "pending"):
            seen.add(ap.id)
            waiting[ap.id] = _epoch(ap.expires_at)
            show("pending", ap.to_dict())
        while True:
            # An approval expires when it is next read: read the overdue ones, so that
            # their expiry is recorded, and shown, when it falls due.
            for approval_id in [i for i, at in waiting.items() if at <= time.time()]:
                waiting.pop(approval_id)
                c.get_approval(approval_id)
            wait = min([30.0] + [max(0.05, at - time.time() + 0.05) for at in waiting.values()])
            events, cursor = c.wait_audit(cursor, list(_APPROVAL_EVENTS), a.session, wait)
            for e in events:
                if e.kind == "approval.request" and e.subject_id in seen:
                    continue
                ap = c.get_approval(e.subject_id)
                if ap.status == "pending":
                    waiting[ap.id] = _epoch(ap.expires_at)
                else:
                    waiting.pop(ap.id, None)
                show(_APPROVAL_EVENTS[e.kind], ap.to_dict())
    return _follow(run)


def _epoch(stamp: str) -> float:
    """An approval's time (``2026-01-02T03:04:05.678Z``) as seconds since the epoch."""
    import datetime as dt
    return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _audit_row(e: dict) -> list:
    return [e["seq"], e["created_at"][:19], e["kind"], e["session_id"] or "",
            e["subject_id"], json.dumps(e["detail"], ensure_ascii=False, sort_keys=True)]


def _follow_audit(c: Client, a, out: Output) -> int:
    """``audit --follow``: the last ``--limit`` events (when given), then one line per
    event appended from now on."""
    def run() -> None:
        cursor = c.wait_audit(-1)[1]
        if a.limit:
            for e in c.audit(a.session, a.kind, a.limit):
                _line_out(out, e.to_dict(), "  ".join(map(str, _audit_row(e.to_dict()))))
                cursor = max(cursor, e.seq)
        for e in c.watch_audit(cursor, [a.kind] if a.kind else None, a.session):
            _line_out(out, e.to_dict(), "  ".join(map(str, _audit_row(e.to_dict()))))
    return _follow(run)


def cmd_decide(c: Client, a, out: Output) -> int:
    d = c.decide_approval(a.id, approve=a.command == "approve", reason=a.reason or "").to_dict()
    out.emit(d, lambda: f"approval {d['id']}: {d['status']}")
    return 0


def cmd_policy(c: Client, a, out: Output) -> int:
    d = c.explain_policy(a.tool, a.args or "").to_dict()
    out.emit(d, lambda: _kv(d, ["effect", "requires_approval", "rule"]))
    return 0


def cmd_audit(c: Client, a, out: Output) -> int:
    if a.audit_cmd == "verify":
        d = c.verify_audit()
        out.emit(d, lambda: ("ok" if d["ok"] else "BROKEN") + f": {d['events']} event(s)"
                 + "".join(f"\n  {p}" for p in d["problems"]))
        return 0 if d["ok"] else EXIT_ERROR
    if a.follow:
        return _follow_audit(c, a, out)
    events = [e.to_dict() for e in c.audit(a.session, a.kind, a.limit)]
    out.emit(events, lambda: _table([_audit_row(e) for e in events],
                                    ["SEQ", "AT", "KIND", "SESSION", "SUBJECT", "DETAIL"]))
    return 0


def _session_here(c: Client, explicit: str | None) -> str:
    return explicit or c.session_here().id


# Where a command takes an id (the argument's name, and for `id` the command), the kind
# of id: each is resolved (Client.resolve_id) before the command runs, so a person may
# type a unique prefix, SESSION@N, HEAD or HEAD~N wherever an id goes.
_ID_KINDS = {"session": "session", "checkpoint": "checkpoint", "from_id": "checkpoint",
             "to_id": "checkpoint", "expected_head": "checkpoint", "approval": "approval"}
_ID_OF = {"session": "session", "approve": "approval", "deny": "approval",
          "approvals": "approval"}


def _resolve_ids(c: Client, a) -> None:
    """Every id the command was given, as the full id it names (the session first: HEAD
    in a checkpoint's place is that session's head, else the current folder's)."""
    for name in ("session", "checkpoint", "from_id", "to_id", "expected_head", "approval",
                 "id", "to"):
        value = getattr(a, name, None)
        if not isinstance(value, str) or not value:
            continue
        kind = (_ID_OF.get(a.command) if name == "id" else "checkpoint"
                if name == "to" and a.command == "rewind" else _ID_KINDS.get(name))
        if kind is not None:
            setattr(a, name, c.resolve_id(value, kind, getattr(a, "session", None)))


# Checkpoints that follow no tool call of the agent's: not steps for a rewind.
_NOT_STEPS = ("stop", "prompt: ", "approval requested: ", "before restore")


def _is_step(cp) -> bool:
    """Whether a checkpoint follows a tool call (a hook's "Tool: command" one, or one an
    SDK took): not the first, a fork's, a restore, nor a prompt's, a stop's, an
    approval's or the one a restore takes of the world before it."""
    return cp.kind == "checkpoint" and not (
        cp.label == "stop" or cp.label.startswith(_NOT_STEPS[1:]))


def _rewind_target(c: Client, session_id: str, steps: int) -> tuple[str, list]:
    """The checkpoint ``steps`` tool calls before the world as it is now, and the steps
    it undoes (their checkpoints, newest first): back along the parents, where a
    restore stands for the checkpoint it restored and a checkpoint that follows no tool
    call (a prompt, a stop, an approval) is passed over."""
    if steps < 1:
        raise InvalidArgument(f"--steps must be 1 or more (got {steps})")
    log = {cp.id: cp for cp in c.log(session_id)}
    cp, undone = log[c.get_session(session_id).head], []
    for _ in range(steps):
        while cp.kind == "restore" and cp.restored_from in log or (
                not _is_step(cp) and cp.parent_id in log):
            cp = log[cp.restored_from] if cp.kind == "restore" else log[cp.parent_id]
        if not _is_step(cp) or cp.parent_id not in log:
            raise InvalidArgument(f"the session's history holds fewer than {steps} tool"
                                  " call(s) to go back over; give --to CHECKPOINT")
        undone.append(cp)
        cp = log[cp.parent_id]
    return cp.id, undone


def resume_hint(resume: dict | None) -> str:
    """How to take the agent's own conversation back to where a checkpoint had it."""
    if not resume or not resume.get("session_id"):
        return ""
    agent, sid = resume.get("agent", ""), resume["session_id"]
    entries = resume.get("entries", 0)
    if agent == "claude-code":
        at = resume.get("resume_entry")
        return f"claude --resume {sid}" + (f" --resume-session-at {at}" if at else "")
    if agent == "codex":
        return (f"codex resume {sid}   (the conversation had {entries} transcript entries"
                " then: go back to that turn with Esc Esc)")
    if agent == "gemini":
        return (f"gemini --resume {sid}   (the conversation had {entries} messages then:"
                " go back with /rewind)")
    if agent == "cursor":
        return f"reopen conversation {sid} in Cursor; it had {entries} entries then"
    return f"agent session {sid}, entry {resume.get('entry') or entries}"


def cmd_rewind(c: Client, a, out: Output) -> int:
    session_id = _session_here(c, a.session)
    target, undone = (a.to, []) if a.to else _rewind_target(c, session_id, a.steps)
    r = c.restore(session_id, target, acknowledge_side_effects=a.yes,
                  dry_run=a.dry_run).to_dict()
    shown = c.show(target)
    resume = shown.resume if not a.dry_run else None
    r["session_id"], r["resume"], r["resume_command"] = session_id, resume, resume_hint(resume)
    calls = {}
    for t in c.tool_calls(session_id) if undone else ():
        calls.setdefault(t.checkpoint_id, []).append(t.to_dict())
    r["target"] = {"id": shown.id, "seq": shown.seq, "label": shown.label}
    r["undone"] = [{"checkpoint_id": cp.id, "seq": cp.seq, "label": cp.label,
                    "tool_calls": calls.get(cp.parent_id, [])} for cp in undone]

    def human() -> str:
        verb = "would rewind" if a.dry_run else "rewound"
        label = f" ({shown.label})" if shown.label else ""
        text = (f"{verb} session {session_id} to #{shown.seq} {target}{label}:"
                f" {len(r['files_written'])} path(s) written, {len(r['files_removed'])}"
                " removed")
        for step in r["undone"]:
            what = "; ".join(f"{_call_summary(t)} ({t['id']})" for t in step["tool_calls"])
            text += f"\n  undoes #{step['seq']} {what or step['label']}"
        text += _kept_human(r, a.dry_run)
        for warning in r.get("warnings", []):
            text += f"\nwarning: {warning}"
        if r["resume_command"]:
            text += f"\nresume the conversation there: {r['resume_command']}"
        effects = _effects_human(r["side_effects"])
        return text + ("\n" + effects if effects else "")
    out.emit(r, human)
    return 0


def cmd_fsck(c: Client, a, out: Output) -> int:
    d = c.fsck(repair=a.repair, cached=a.cached, read_data_subset=a.read_data_subset or "",
               repair_from=os.path.abspath(a.repair_from) if a.repair_from else "")

    def human() -> str:
        read = {"bucket": f" read from the bucket: {d['objects_checked']} of"
                          f" {d['objects_total']} object(s), {d['bytes_read']} bytes",
                "cache": " read through this host's cache (--cached)"}.get(d["source"], "")
        subset = f" (subset {d['read_data_subset']})" if d["read_data_subset"] else ""
        return (("ok" if d["ok"] else "PROBLEMS") + f": {d['checkpoints_checked']}"
                f" checkpoint(s), {d['blobs_checked']} blob(s){read}{subset}"
                + "".join(f"\n  {p}" for p in d["problems"])
                + "".join(f"\n  not checked: {p}" for p in d["unchecked"])
                + "".join(f"\n  repaired: {p}" for p in d["repaired"])
                + "".join(f"\n  not repaired: {p}" for p in d["not_repaired"]))
    out.emit(d, human)
    return 0 if d["ok"] else EXIT_ERROR


def _duration(text: str) -> float:
    """'90', '90s', '30m', '12h', '7d' -> seconds."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    try:
        if text and text[-1] in units:
            return float(text[:-1]) * units[text[-1]]
        return float(text)
    except ValueError:
        raise InvalidArgument(f"{text!r} is not a duration (like 90s, 30m, 12h, 7d)") from None


def cmd_gc(c: Client, a, out: Output) -> int:
    keep_newer_than = _duration(a.keep_newer_than) if a.keep_newer_than else 0.0
    d = _followed(c, a, lambda op: c.gc(
        dry_run=a.dry_run, keep_last=a.keep_last or 0, keep_labelled=a.keep_labelled,
        keep_newer_than=keep_newer_than, operation_id=op))
    prune, remove, free = (("would prune", "would remove", "would free") if a.dry_run
                           else ("pruned", "removed", "freed"))
    why = ("\nno space is freed yet: gc never removes a blob stored or reused within the"
           " daemon's grace period (--gc-grace, default 600 s), so what the pruned"
           " checkpoints alone held is freed by a gc after that"
           if d["checkpoints_pruned"] and not d["bytes_freed"] else "")
    out.emit(d, lambda: f"{prune} {d['checkpoints_pruned']} checkpoint(s); {remove}"
             f" {d['blobs_removed']} blob(s), {d['images_removed']} image(s) and"
             f" {d['views_removed']} fork view(s); {free} {d['bytes_freed']} bytes{why}")
    return 0


# -- parser --------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    import argparse

    from .hooks.agents import AGENTS
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                        help="print exactly one JSON document on stdout")
    common.add_argument("--address", default=argparse.SUPPRESS,
                        help="daemon address: unix:///abs/path or host:port"
                             " (default $WORLDLINE_ADDRESS or the default socket)")
    p = argparse.ArgumentParser(prog="worldline", parents=[common],
                                description="Undo, branch and audit a coding agent's world.")
    p.add_argument("--version", action="version", version=f"worldline {version()}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, fn, help: str, **kw) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, parents=[common], help=help, description=help, **kw)
        sp.set_defaults(fn=fn)
        return sp

    hk = sub.add_parser("hook", help="answer one hook event of a coding agent (payload on"
                                     " stdin, the agent's answer on stdout)", add_help=False)
    hk.add_argument("agent", choices=AGENTS)
    hk.set_defaults(fn=None)

    ini = sub.add_parser("init", parents=[common],
                         help="merge worldline's hooks into a coding agent's settings")
    ini.add_argument("agent", choices=[a for a in AGENTS if a != "generic"])
    where = ini.add_mutually_exclusive_group()
    where.add_argument("--project", nargs="?", const=".", default=".", metavar="DIR",
                       help="the project's settings file (default: this folder's)")
    where.add_argument("--user", action="store_true", help="the user's settings file")
    ini.add_argument("--shared", action="store_true",
                     help="claude-code: the project's committed .claude/settings.json"
                          " (default: its uncommitted .claude/settings.local.json)")
    ini.add_argument("--dry-run", action="store_true", help="show the change, write nothing")
    ini.add_argument("--remove", action="store_true", help="take worldline's hooks out again")
    ini.add_argument("--approval", choices=["ask", "wait", "deny"],
                     help="how the hook gates irreversible calls (see `worldline hook --help`)")
    ini.add_argument("--wait", type=float, metavar="SECONDS",
                     help="with --approval wait: how long the hook waits for an operator")
    ini.add_argument("--trust", action="store_true",
                     help="gemini: also trust the project folder in Gemini CLI (its"
                          " trustedFolders.json): it runs no hook in a folder it does not"
                          " trust")
    ini.add_argument("--command", dest="hook_command",
                     help="the hook command to write (default: this worldline with the"
                          " options given)")
    ini.set_defaults(fn=None)

    doc = sub.add_parser("doctor", parents=[common],
                         help="check that an installed agent will run worldline's hooks")
    doc.add_argument("agent", nargs="?", choices=[a for a in AGENTS if a != "generic"],
                     help="the agent (default: every agent installed or set up here)")
    doc.add_argument("--project", default=".", metavar="DIR",
                     help="the project whose settings to check (default: this folder)")
    doc.set_defaults(fn=None)

    d = sub.add_parser("daemon", help="run the daemon in the foreground")
    d.add_argument("--root", help="data root (default $WORLDLINE_ROOT or ~/.local/share/worldline)")
    d.add_argument("--listen", help="address to listen on (default unix://<root>/worldline.sock)")
    d.add_argument("--policy", help="side-effect policy file (TOML); default $WORLDLINE_POLICY")
    d.add_argument("--no-tracker", action="store_true",
                   help="no change tracking: every checkpoint scans the whole workspace")
    d.add_argument("--max-watches", type=int, default=1 << 20,
                   help="inotify watches per workspace before falling back to scans")
    d.add_argument("--copy-forks", action="store_true",
                   help="copy forks' workspaces even where overlay mounts are permitted")
    d.add_argument("--tls-cert", help="TLS certificate (PEM): required to listen on TCP")
    d.add_argument("--tls-key", help="TLS private key (PEM): required to listen on TCP")
    d.add_argument("--token-file", help="file holding the bearer token: required on TCP")
    d.add_argument("--metrics-listen", metavar="HOST:PORT",
                   help="serve Prometheus metrics at http://HOST:PORT/metrics")
    d.add_argument("--log-format", choices=["text", "json"], default="text",
                   help="json: one object a line, with the request id of the call")
    d.add_argument("--gc-grace", type=float, default=600.0, metavar="SECONDS",
                   help="gc never removes a blob stored or reused more recently (default 600)")
    d.add_argument("--allow-uid", type=int, action="append", default=[],
                   help="another uid that may connect, through <socket>.shared (repeatable)")
    d.add_argument("--notify", metavar="URL",
                   help="POST a JSON object to URL (http or https) for each approval"
                        " requested or decided, session needing attention, gate bypassed")
    d.add_argument("--console", metavar="HOST:PORT",
                   help="serve the operators' console too (as the daemon's user); its URL"
                        " and token go to the log and to <root>/console.url")
    d.add_argument("--approvals-by", choices=["anyone", "owner"], default="anyone",
                   help="who may approve: anyone allowed on the session (default; the hooks'"
                        " --approval ask needs it), or only the daemon's owner")
    d.add_argument("--max-file-bytes", type=_size, default="8G", metavar="SIZE",
                   help="largest file captured, in data bytes (default 8G)")
    d.add_argument("--max-file-size", type=_size, default="1T", metavar="SIZE",
                   help="largest file captured, in logical size, holes included (default 1T)")
    d.add_argument("--max-checkpoint-bytes", type=_size, default="16G", metavar="SIZE",
                   help="most bytes of changed files one checkpoint reads (default 16G)")
    d.add_argument("--max-entries", type=_count, default="2000000", metavar="N",
                   help="most names (files, folders, links) a workspace or a container's"
                        " layer may hold (default 2000000)")
    d.add_argument("--store", metavar="URL",
                   help="metadata: sqlite (default, <root>/meta.db) or postgresql://... shared"
                        " by a fleet (default $WORLDLINE_STORE)")
    d.add_argument("--blobs", metavar="URL",
                   help="file contents: local (default, <root>/blobs) or s3://bucket/prefix"
                        " shared by a fleet, <root>/blobs its cache (default $WORLDLINE_BLOBS)")
    d.add_argument("--host-id", help="this host's name in a fleet (default $WORLDLINE_HOST_ID;"
                                     " on PostgreSQL, the hostname)")
    d.add_argument("--cache-bytes", type=_size, default="16G", metavar="SIZE",
                   help="with s3 blobs: the most the local cache holds (default 16G)")
    d.add_argument("--advertise", metavar="ADDR",
                   help="in a fleet: the address others reach this daemon at, named when"
                        " they call a host that does not hold a session (default: --listen"
                        " when it is host:port; $WORLDLINE_ADVERTISE)")
    d.add_argument("--lease-seconds", type=float, default=30.0, metavar="SECONDS",
                   help="in a fleet: how long a stopped host keeps its sessions before"
                        " another may take them over (default 30)")
    d.add_argument("--min-free-bytes", type=_size, default="1G", metavar="SIZE",
                   help="free space the data root keeps: checkpoints stop short of it"
                        " (default 1G)")
    d.add_argument("--max-connections", type=_count, default="1024", metavar="N",
                   help="the gateway's connections open at once (default 1024)")
    d.add_argument("--owner-connections", type=_count, default="64", metavar="N",
                   help="of those, the ones no allowed user may take (default 64)")
    d.add_argument("--connections-per-uid", type=_count, default="64", metavar="N",
                   help="an allowed user's connections, on the gateway and on the relay"
                        " (default 64)")
    d.add_argument("--calls-per-uid", type=_count, default="8", metavar="N",
                   help="an allowed user's gRPC calls under way at once (default 8)")
    d.add_argument("--idle-seconds", type=float, default=60.0, metavar="SECONDS",
                   help="a connection that sends nothing for this long is closed"
                        " (default 60)")
    d.add_argument("--gateway-max-line", type=_size, default="8M", metavar="SIZE",
                   help="the largest JSON request line (default 8M)")
    d.add_argument("--gateway-buffer-bytes", type=_size, default="256M", metavar="SIZE",
                   help="requests the gateway holds at once, all connections together; an"
                        " allowed user's at most half (default 256M)")
    d.add_argument("--encryption-key", metavar="FILE",
                   help="encrypt the data at rest with the key in FILE (32 bytes: raw, hex"
                        " or base64; default: systemd's credential worldline-key when given;"
                        " docs/encryption.md)")
    d.set_defaults(fn=None)

    key = sub.add_parser("key", help="the encryption key of a data root (docs/encryption.md)")
    keys = key.add_subparsers(dest="key_cmd", required=True, metavar="SUBCOMMAND")
    rot = keys.add_parser("rotate", help="re-wrap the data key with a new key; the old one"
                                         " opens nothing afterwards (the daemon may run)")
    rot.add_argument("--new-key", metavar="FILE", required=True, help="the new key's file")
    rot.add_argument("--encryption-key", metavar="FILE",
                     help="the key in use (default: systemd's credential worldline-key)")
    rot.add_argument("--root", help="data root (default $WORLDLINE_ROOT or"
                                     " ~/.local/share/worldline)")
    rot.add_argument("--store", metavar="URL", help="as the daemon's --store")
    rot.add_argument("--blobs", metavar="URL", help="as the daemon's --blobs (a fleet's"
                                                    " keyring is in its bucket)")
    key.set_defaults(fn=None)

    comp = sub.add_parser("completion", help="print a shell completion script")
    comp.add_argument("shell", choices=["bash", "zsh"],
                      help="zsh: load it after `autoload -U bashcompinit && bashcompinit`")
    comp.set_defaults(fn=None)

    con = sub.add_parser("console", parents=[common],
                         help="serve the operators' console in a browser (as this user)")
    con.add_argument("--listen", default="127.0.0.1:0",
                     help="HOST:PORT (default 127.0.0.1 and any free port; beyond loopback"
                          " only with --tls-cert and --tls-key)")
    con.add_argument("--open", action="store_true", help="open the URL in a browser")
    con.add_argument("--tls-cert")
    con.add_argument("--tls-key")
    con.set_defaults(fn=None)

    m = sub.add_parser("mcp", parents=[common], help="serve worldline's calls as MCP tools")
    m.add_argument("--transport", choices=["stdio", "streamable-http"], default="stdio")
    m.set_defaults(fn=None)

    s = add("session", cmd_session, "create, list and show sessions")
    ss = s.add_subparsers(dest="session_cmd", required=True, metavar="SUBCOMMAND")
    sc = ss.add_parser("create", parents=[common], help="start a session on a workspace")
    sc.add_argument("--workspace", required=True)
    sc.add_argument("--container", help="attach this existing container to the session")
    sc.add_argument("--image", help="or start a container from this image")
    sc.add_argument("--mount", help="where the image's container sees the workspace"
                                    " (default /workspace)")
    sc.add_argument("--name")
    sc.add_argument("--exist-ok", action="store_true",
                    help="your session over that folder already: print it (no error)")
    sc.add_argument("--exclude", action="append", metavar="PATTERN",
                    help="a workspace path never captured nor restored (gitignore syntax;"
                         " repeatable; besides the workspace's .worldlineignore)")
    sl = ss.add_parser("list", parents=[common], help="list sessions")
    sl.add_argument("--all", action="store_true", help="deleted sessions too")
    sd = ss.add_parser("delete", parents=[common],
                       help="release a session's workspace; its history is kept")
    sd.add_argument("id")
    sd.add_argument("--keep-container", action="store_true",
                    help="leave the session's container running (default: stopped)")
    sm = ss.add_parser("move", parents=[common],
                       help="a fleet: release a session for another host, or take it over"
                            " on the daemon's host")
    sm.add_argument("id")
    where = sm.add_mutually_exclusive_group(required=True)
    where.add_argument("--to", metavar="HOST",
                       help="release it for HOST ('*': any host); ask its holder")
    where.add_argument("--take-over", action="store_true",
                       help="take it over on this daemon's host (its holder released it,"
                            " or its lease ran out): the workspace is rebuilt from its head")
    sm.add_argument("--workspace", help="with --take-over: where (default: its path)")
    sh = ss.add_parser("show", parents=[common], help="show one session")
    sh.add_argument("id")
    rs = ss.add_parser("resolve", parents=[common],
                       help="decide on a session that needs attention (an interrupted"
                            " restore set aside)")
    rs.add_argument("id")
    how = rs.add_mutually_exclusive_group(required=True)
    how.add_argument("--complete", action="store_true",
                     help="bring its layers to the restore's target, whatever they hold now")
    how.add_argument("--abandon", action="store_true",
                     help="leave its layers as they are; the next checkpoint records them")

    c = add("checkpoint", cmd_checkpoint, "record a checkpoint of a session's world")
    c.add_argument("session")
    c.add_argument("--label")
    c.add_argument("--reasoning")
    c.add_argument("--trace-id")
    c.add_argument("--messages", metavar="JSON|FILE",
                   help="JSON list of messages appended since the previous checkpoint,"
                        " inline or in a file ('-': stdin)")
    c.add_argument("--state", metavar="JSON|FILE",
                   help="JSON object, the agent state, inline or in a file ('-': stdin)")
    c.add_argument("--expected-head", help="fail with ABORTED unless this is the head")
    c.add_argument("--warning", action="append", default=[], metavar="TEXT",
                   help="what this checkpoint lacks, kept with it (repeatable)")

    lg = add("log", cmd_log, "list a session's checkpoints, oldest first")
    lg.add_argument("session")
    lg.add_argument("--graph", action="store_true",
                    help="newest first, drawing restores and the forks made from each checkpoint")
    lg.add_argument("--path", metavar="PATH",
                    help="only the checkpoints that changed PATH (relative to the workspace),"
                         " newest first, with the tool calls before each; a rename shows as"
                         " a deletion of the old path and an addition of the new one")
    lg.add_argument("--patch", action="store_true",
                    help="with --path: each change as a unified diff")
    ct = add("cat", cmd_cat, "print a file's bytes as of a checkpoint")
    ct.add_argument("checkpoint")
    ct.add_argument("path", help="relative to the workspace")
    sw = add("show", cmd_show, "show a checkpoint with its conversation, state and tasks")
    sw.add_argument("checkpoint")
    df = add("diff", cmd_diff, "paths that differ between two checkpoints")
    df.add_argument("from_id", metavar="FROM")
    df.add_argument("to_id", metavar="TO")
    df.add_argument("--patch", action="store_true", help="a unified diff of text files")

    r = add("restore", cmd_restore, "make a session's world equal to a checkpoint")
    r.add_argument("session")
    r.add_argument("checkpoint")
    r.add_argument("--yes", action="store_true",
                   help="acknowledge non-idempotent side effects the restore cannot undo")
    r.add_argument("--dry-run", action="store_true", help="report, change nothing")
    r.add_argument("--path", action="append", metavar="PATH",
                   help="only this path (relative to the workspace; repeatable): the rest"
                        " of the world, the conversation and the tasks stay as they are")
    r.add_argument("--from-other-session", action="store_true",
                   help="the checkpoint belongs to another session's history: restore it"
                        " here anyway")
    _progress_flag(r)

    rw = add("rewind", cmd_rewind, "restore the session of this folder to an earlier"
                                   " checkpoint and say where to resume the agent")
    target = rw.add_mutually_exclusive_group()
    target.add_argument("--to", metavar="CHECKPOINT", help="the checkpoint to go back to")
    target.add_argument("--steps", type=int, default=1, metavar="N",
                        help="go back N tool calls (default 1)")
    rw.add_argument("--session", help="the session (default: the one whose workspace holds"
                                      " this folder)")
    rw.add_argument("--yes", action="store_true",
                    help="acknowledge non-idempotent side effects the rewind cannot undo")
    rw.add_argument("--dry-run", action="store_true", help="report, change nothing")

    f = add("fork", cmd_fork, "start a new session from a checkpoint")
    f.add_argument("checkpoint")
    f.add_argument("--workspace", help="folder for the fork (default: under the data root)")
    f.add_argument("--name")
    f.add_argument("--volumes", choices=["share", "empty"],
                   help="the container mounts volumes or folders besides the workspace:"
                        " share them with the fork, or give the fork empty ones")
    _progress_flag(f)

    im = add("image", cmd_image, "a runnable image of a checkpoint's container (docker commit)")
    im.add_argument("checkpoint")
    for parser in (sw, df, im, f, ct):  # the session HEAD and HEAD~N name
        parser.add_argument("--session", help="the session whose HEAD (HEAD~N) is meant"
                                              " (default: the current folder's)")

    t = add("tool", cmd_tool, "record a tool call")
    t.add_argument("session")
    t.add_argument("name")
    t.add_argument("--args", help="JSON object")
    t.add_argument("--effect", help="read_only | local | external_idempotent |"
                                    " external_non_idempotent (default: the policy decides)")
    t.add_argument("--result", help="JSON")
    t.add_argument("--idempotency-key")
    t.add_argument("--approval", help="id of the approved approval for a gated tool")
    add("tools", cmd_tools, "list a session's tool calls").add_argument("session")

    tk = add("task", cmd_task, "set a subtask's status")
    tk.add_argument("session")
    tk.add_argument("task_id")
    tk.add_argument("--status", required=True)
    tk.add_argument("--title")
    tk.add_argument("--parent")
    tk.add_argument("--note")
    add("tasks", cmd_tasks, "list tasks and the resume point").add_argument("session")

    ap = add("approval", cmd_approval, "ask an operator to approve a tool call")
    aps = ap.add_subparsers(dest="approval_cmd", required=True, metavar="SUBCOMMAND")
    apr = aps.add_parser("request", parents=[common], help="checkpoint, then request approval")
    apr.add_argument("session")
    apr.add_argument("tool")
    apr.add_argument("--args", help="JSON object")
    apr.add_argument("--wait", type=float, metavar="SECONDS",
                     help="wait for the decision: exit 0 approved, 3 denied, 4 expired/timeout")
    apr.add_argument("--ttl", type=float, metavar="SECONDS", help="expire after (default 3600)")
    al = add("approvals", cmd_approvals, "list approvals")
    als = al.add_subparsers(dest="approvals_cmd", required=True, metavar="SUBCOMMAND")
    all_ = als.add_parser("list", parents=[common], help="list approvals")
    all_.add_argument("--session")
    all_.add_argument("--status")
    alw = als.add_parser("show", parents=[common],
                         help="one approval: the call's arguments, its checkpoint, expiry")
    alw.add_argument("id")
    alwa = als.add_parser("watch", parents=[common],
                          help="the pending approvals, then one line per approval requested"
                               " or decided as it happens (JSON lines with --json)")
    alwa.add_argument("--session")
    alc = als.add_parser("cancel", parents=[common],
                         help="withdraw a pending approval you requested")
    alc.add_argument("id")
    alc.add_argument("--reason")
    a1 = add("approve", cmd_decide, "approve a pending approval")
    a1.add_argument("id")
    a1.add_argument("--reason")
    a2 = add("deny", cmd_decide, "deny a pending approval")
    a2.add_argument("id")
    a2.add_argument("--reason", required=True)

    po = add("policy", cmd_policy, "explain the side-effect policy")
    pos = po.add_subparsers(dest="policy_cmd", required=True, metavar="SUBCOMMAND")
    pe = pos.add_parser("explain", parents=[common], help="the effect of a tool call and why")
    pe.add_argument("tool")
    pe.add_argument("--args", help="JSON object")

    au = add("audit", cmd_audit, "read or verify the audit log")
    au.add_argument("audit_cmd", nargs="?", choices=["verify"], help="verify the hash chain")
    au.add_argument("--session")
    au.add_argument("--kind")
    au.add_argument("--limit", type=int, default=0)
    au.add_argument("--follow", "-f", action="store_true",
                    help="print each new event as it comes (JSON lines with --json): with"
                         " --limit N, the last N first; an allowed user sees its own"
                         " sessions' events")

    fk = add("fsck", cmd_fsck, "check every blob, reference and the audit chain")
    fk.add_argument("--repair", action="store_true", help="repair what is safe to repair"
                    " (a fleet: put good copies this host holds back in the bucket)")
    fk.add_argument("--cached", action="store_true", help="a fleet host: check through its"
                    " cache (the quick check), not by reading every object of the bucket")
    fk.add_argument("--read-data-subset", metavar="N%|n/m", help="read only a share of the"
                    " objects: N%% chosen at random, or the n-th of m fixed parts")
    fk.add_argument("--repair-from", metavar="ROOT", help="with --repair: a data root whose"
                    " blobs may mend the bucket too (another host's, a backup)")
    g = add("gc", cmd_gc, "prune by retention, then remove what no checkpoint needs")
    g.add_argument("--dry-run", action="store_true", help="report, change nothing")
    g.add_argument("--keep-last", type=int, metavar="N", help="keep the newest N per session")
    g.add_argument("--keep-labelled", action="store_true", help="keep labelled checkpoints")
    g.add_argument("--keep-newer-than", metavar="AGE", help="keep those newer than AGE (7d)")
    _progress_flag(g)
    return p


def _progress_flag(parser: argparse.ArgumentParser) -> None:
    import argparse
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="a progress bar on stderr (default: on a terminal, unless --json)")


SESSION_FIRST = ("checkpoint", "log", "restore", "tool", "tools", "task", "tasks")


def completion_script(parser: argparse.ArgumentParser) -> str:
    import argparse
    """A bash completion for every command and option, read off the parser itself; the
    commands that take a session complete its id from the daemon."""
    commands = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                words = [o for a in sub._actions for o in a.option_strings]
                for a in sub._actions:
                    if isinstance(a, argparse._SubParsersAction):
                        words = list(a.choices) + words
                commands[name] = sorted(set(words))
    cases = "\n".join(f'    {name}) opts="{" ".join(words)}";;'
                       for name, words in sorted(commands.items()))
    return f'''# bash completion for worldline: eval "$(worldline completion bash)"
_worldline() {{
  local cur="${{COMP_WORDS[COMP_CWORD]}}" cmd="${{COMP_WORDS[1]}}" opts
  if [ "$COMP_CWORD" -eq 1 ]; then
    COMPREPLY=( $(compgen -W "{" ".join(sorted(commands))}" -- "$cur") ); return
  fi
  case "$cmd" in
{cases}
  esac
  case "$cmd" in {"|".join(SESSION_FIRST)})
    if [ "$COMP_CWORD" -eq 2 ] && [[ "$cur" != -* ]]; then
      opts="$(worldline session list --json 2>/dev/null | python3 -c \\
        'import json,sys; print(" ".join(s["id"] for s in json.load(sys.stdin)))')"
    fi;;
  esac
  COMPREPLY=( $(compgen -W "$opts" -- "$cur") )
}}
complete -o default -F _worldline worldline
'''


def _count(text: str) -> int:
    """A count: a whole number, at least 1."""
    from argparse import ArgumentTypeError
    try:
        value = int(text.strip().replace("_", ""))
    except ValueError:
        raise ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise ArgumentTypeError(f"{text!r} is less than 1")
    return value


def _size(text: str) -> int:
    """A size: bytes, or a number with K, M, G or T (powers of 1024)."""
    from argparse import ArgumentTypeError
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    number, unit = text.strip().upper().rstrip("IB") or "0", ""
    if number and number[-1] in units:
        number, unit = number[:-1], number[-1]
    try:
        value = int(float(number) * units[unit])
    except ValueError:
        raise ArgumentTypeError(f"{text!r} is not a size (like 512M or 8G)") from None
    if value < 0:
        raise ArgumentTypeError(f"{text!r} is negative")
    return value


def main(argv: list[str] | None = None) -> int:
    """The console script. A reader that closes the pipe early (``| head``) ends the
    command quietly, as it does for any Unix tool."""
    try:
        code = _main(argv)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        # Nothing more can be written; point stdout at /dev/null so the interpreter's
        # own flush at exit does not raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, as a shell reports it


def _main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["hook"]:  # every tool call runs this: no parser, no grpc
        from .hooks import main as hook_main
        return hook_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "completion":
        print(completion_script(parser), end="")
        return 0
    as_json = getattr(args, "json", False)
    if args.command == "init":
        return _init(args, Output(as_json))
    if args.command == "console":
        from .console import serve as console
        try:
            return console(getattr(args, "address", None), args.listen, args.open,
                           args.tls_cert, args.tls_key)
        except WorldlineError as exc:
            return _failed(exc, as_json)
        except KeyboardInterrupt:
            return 0
    if args.command == "doctor":
        from .doctor import main as doctor_main
        return doctor_main(args.agent, args.project, getattr(args, "address", None), as_json)
    if args.command == "mcp":
        from .mcp_server import serve
        return serve(getattr(args, "address", None), args.transport)
    if args.command == "daemon":
        from worldline.daemon.main import command as daemon
        try:
            return daemon(args)
        except WorldlineError as exc:
            return _failed(exc, False)
    if args.command == "key":
        return _key_rotate(args)
    out = Output(as_json)
    try:
        from ._client import Client
        with Client(getattr(args, "address", None)) as client:
            _resolve_ids(client, args)
            return args.fn(client, args, out)
    except WorldlineError as exc:
        return _failed(exc, as_json)
    except KeyboardInterrupt:
        return 130


def _key_rotate(args) -> int:
    from worldline.daemon.main import key_command
    try:
        return key_command(args)
    except WorldlineError as exc:
        return _failed(exc, False)


def _failed(exc: WorldlineError, as_json: bool) -> int:
    """One line on stderr; under --json, stdout still holds exactly one document."""
    print(f"error: {exc.code}: {exc.message}", file=sys.stderr)
    if as_json:
        json.dump({"error": {"code": exc.code, "message": exc.message}}, sys.stdout)
        sys.stdout.write("\n")
    return EXIT_ERROR


def _init(a, out: Output) -> int:
    from .hooks import support
    from .hooks.settings import init
    command = a.hook_command
    # The installed client's version: the hook answers only what that version honours
    # (ask where it is not honoured, or for a version worldline does not know: deny).
    program, version = ("", "") if a.remove else support.detect(a.agent)
    version = version or support.UNKNOWN
    approval, note = support.approval_mode(a.agent, version, a.approval or "")
    if not command:
        exe = sys.argv[0] if os.path.basename(sys.argv[0]) == "worldline" else "worldline"
        command = " ".join([os.path.abspath(exe) if os.sep in exe else exe, "hook", a.agent]
                           + [f"--approval {approval}", f"--client-version {version}"]
                           + ([f"--wait {a.wait:g}"] if a.wait is not None else [])
                           + ([f"--address {a.address}"] if getattr(a, "address", None)
                              else []))
    wait = a.wait if a.wait is not None else (300 if a.approval == "wait" else 0)
    try:
        if a.trust and a.agent != "gemini":
            raise InvalidArgument(f"--trust is Gemini CLI's folder trust; {a.agent} has"
                                  " none that worldline sets")
        d = init(a.agent, user=a.user, project=a.project, remove=a.remove,
                 dry_run=a.dry_run, command=command, pre_timeout=int(wait) + 60,
                 shared=a.shared)
        if a.agent == "gemini" and not a.remove:
            d["trust"] = _gemini_trust(a)
    except WorldlineError as exc:
        return _failed(exc, out.as_json)
    if not a.remove:
        d["client"] = {"program": program or None, "version": version,
                       "approval": approval, "note": note or None}

    def client() -> str:
        if a.remove:
            return ""
        found = (f"{a.agent} {version} at {program}" if version != support.UNKNOWN else
                 f"{a.agent} at {program}, its version unreadable," if program else
                 f"{a.agent} not found on PATH,")
        how = {"ask": "put to the person at the agent", "deny": "refused until approved",
               "wait": "held for an operator's decision"}[approval]
        return f"\n{found}: gated calls are {how}" + (f" ({note})" if note else "")

    checks = []
    if not a.remove:  # what stands between these hooks and their running (worldline doctor)
        from .doctor import run as doctor_run
        checks = doctor_run(a.agent, a.project, getattr(a, "address", None))
        d["checks"] = [c.to_dict() for c in checks]

    def human() -> str:
        from .doctor import render
        return (_init_human(d) + client() + _trust_human(d.get("trust"))
                + ("\n" + render(checks) if checks else ""))
    out.emit(d, human)
    if d.get("trust") and not d["trust"]["trusted"] and out.as_json:
        print("warning: Gemini CLI will not run these hooks: " + d["trust"]["why"],
              file=sys.stderr)
    return 0


def _gemini_trust(a) -> dict:
    """Gemini CLI runs hooks only in a folder it trusts: said, and with --trust done
    for the folder named (never for one the user did not name)."""
    from .hooks.settings import gemini_trust, trust_gemini_folder
    folder = os.path.abspath(a.project or ".")
    if a.trust and not a.dry_run:
        return {**trust_gemini_folder(folder), "why": ""}
    trust = gemini_trust(folder, environ={})  # the environment of this command is not
    # the one Gemini CLI will run in
    why = "" if trust["trusted"] else (
        f"it does not trust {trust['folder']} ({trust['by']}). Run {trust['fix']}")
    return {**trust, "why": why}


def _trust_human(trust: dict | None) -> str:
    if not trust:
        return ""
    if trust["trusted"]:
        return f"\nGemini CLI trusts {trust['folder']} ({trust['by']}): the hooks run there"
    return (f"\nGemini CLI runs hooks only in folders it trusts, and does not trust"
            f" {trust['folder']} ({trust['by']}): headless it refuses to start there;"
            f" interactive, left untrusted, it runs without the hooks and worldline records"
            f" nothing.\n  trust it: {trust['fix']}")


def _init_human(d: dict) -> str:
    if not d["changed"]:
        return f"{d['path']}: already as wanted, nothing changed"
    events = ", ".join(d["events"])
    if d["removed"]:
        what = ("would remove" if d["dry_run"] else "removed") + " worldline's hooks from"
    else:
        what = ("would add" if d["dry_run"] else "added") + f" worldline's hooks ({events}) to"
    text = f"{what} {d['path']}"
    if d["backup"]:
        text += f"\nthe old file is kept as {d['backup']}"
    if d["dry_run"]:
        text += "\n" + d["diff"].rstrip("\n")
    if d.get("also"):
        flag = "" if "local" in os.path.basename(d["also"]) else " --shared"
        text += (f"\nworldline's hooks are in {d['also']} too (the agent runs both): take"
                 f" them out with `worldline init {d['agent']}{flag} --remove`")
    return text


if __name__ == "__main__":
    sys.exit(main())
