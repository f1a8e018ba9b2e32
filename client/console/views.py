"""What the console's pages show, computed from the client's records: the timeline's
drawing, a patch cut per file, a conversation's messages as parts. Pure functions, so
the pages' shapes are tested without a browser."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from ..models import Checkpoint, Session, ToolCall

ROW = 36          # pixels between two checkpoints on the timeline
PAGE = 400        # checkpoints on one page of a timeline
NODE_X = 40       # the column of the nodes; restore edges curve to its left
SIDE_EFFECTS = ("external_non_idempotent",)


@dataclass
class Node:
    cp: Checkpoint
    y: int
    tools: list[ToolCall] = field(default_factory=list)  # the calls that led to it
    forks: list[Session] = field(default_factory=list)   # sessions forked from it
    restored_from_seq: int | None = None   # a restore of this session's own checkpoint
    restored_from_other: str | None = None  # a restore from another session's

    @property
    def side_effect(self) -> bool:
        """A call no restore undoes, or one that ran though its gate did not let it."""
        return any(t.effect in SIDE_EFFECTS or t.gate == "bypassed" for t in self.tools)

    @property
    def title(self) -> str:
        """What the node says: its tool call (name and command or file), else its label."""
        if self.tools:
            return "; ".join(tool_summary(t) for t in self.tools[:3]) + (
                f" (+{len(self.tools) - 3})" if len(self.tools) > 3 else "")
        if self.cp.kind == "restore":
            return "restore"
        return self.cp.label or self.cp.kind


@dataclass
class Edge:
    path: str      # an SVG path's d
    kind: str      # "restore"


@dataclass
class Timeline:
    nodes: list[Node]
    edges: list[Edge]
    height: int
    page: int
    pages: int
    total: int


def tool_summary(t: ToolCall) -> str:
    """A tool call in a few words: its name and the command or file it acted on."""
    args = t.args if isinstance(t.args, dict) else {}
    for key in ("command", "cmd", "file_path", "path", "filePath", "url", "query"):
        value = args.get(key)
        if isinstance(value, list):
            value = " ".join(map(str, value))
        if value:
            text = str(value).replace("\n", " ")
            return f"{t.name} {text[:80]}{'…' if len(text) > 80 else ''}" + _gate(t)
    return t.name + _gate(t)


def _gate(t: ToolCall) -> str:
    return " (gate bypassed)" if t.gate == "bypassed" else ""


def timeline(checkpoints: list[Checkpoint], tools: list[ToolCall],
             sessions: list[Session], page: int = 0, total: int | None = None) -> Timeline:
    """A page of a session's checkpoints (``checkpoints``: that page, oldest first, of
    ``total``) drawn newest first, each with the tool calls recorded after its parent
    (the calls that led to it), the sessions forked from it, and the restore it was;
    restore edges join checkpoints on the same page."""
    by_head: dict[str, list[ToolCall]] = {}
    for t in tools:
        by_head.setdefault(t.checkpoint_id, []).append(t)
    forks: dict[str, list[Session]] = {}
    for s in sessions:
        if s.forked_from:
            forks.setdefault(s.forked_from, []).append(s)
    seq_of = {cp.id: cp.seq for cp in checkpoints}
    shown = list(reversed(checkpoints))
    total = len(checkpoints) if total is None else total
    pages = max(1, -(-total // PAGE))
    nodes, y_of = [], {}
    for i, cp in enumerate(shown):
        node = Node(cp, 24 + i * ROW, by_head.get(cp.parent_id or "", []) if
                    cp.kind != "restore" else [], forks.get(cp.id, []))
        if cp.kind == "restore" and cp.restored_from:
            if cp.restored_from in seq_of:
                node.restored_from_seq = seq_of[cp.restored_from]
            else:
                node.restored_from_other = cp.restored_from
        nodes.append(node)
        y_of[cp.id] = node.y
    edges = []
    for lane, node in enumerate(n for n in nodes if n.cp.kind == "restore"):
        target = y_of.get(node.cp.restored_from or "")
        if target is None:
            continue
        bend = NODE_X - 18 - 6 * (lane % 3)
        edges.append(Edge(f"M {NODE_X - 7} {node.y} C {bend} {node.y}, {bend} {target},"
                          f" {NODE_X - 7} {target}", "restore"))
    return Timeline(nodes, edges, 24 + len(nodes) * ROW, page, pages, total)


@dataclass
class FilePatch:
    path: str
    text: str
    binary: bool
    added: int
    removed: int


def split_patch(patch: str) -> dict[str, FilePatch]:
    """The daemon's patch cut per file. It holds, in path order, for each changed path:
    ``metadata of PATH:`` and its lines (mode, owner, xattrs) when those changed, then a
    unified diff (``--- a/PATH`` / ``+++ b/PATH``) or ``Binary files a/PATH and b/PATH
    differ``."""
    out: dict[str, FilePatch] = {}
    current: FilePatch | None = None
    lines = patch.splitlines(keepends=True)
    for i, line in enumerate(lines):
        path = None
        if line.startswith("metadata of ") and line.rstrip("\n").endswith(":"):
            path, binary = line[len("metadata of "):].rstrip("\n")[:-1], False
        elif line.startswith("Binary files a/") and line.rstrip("\n").endswith(" differ"):
            path, binary = line[len("Binary files a/"):].rsplit(" and b/", 1)[0], True
        elif line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            old, new = line[4:].rstrip("\n"), lines[i + 1][4:].rstrip("\n")
            path, binary = (new if new != "/dev/null" else old)[2:], False
        if path is not None and (current is None or current.path != path):
            current = out.setdefault(path, FilePatch(path, "", False, 0, 0))
        if current is None:
            continue
        if path is not None:
            current.binary = current.binary or binary
        elif line.startswith("+") and not line.startswith("+++ "):
            current.added += 1
        elif line.startswith("-") and not line.startswith("--- "):
            current.removed += 1
        current.text += line
    return out


@dataclass
class Part:
    kind: str   # "text", "tool_use", "tool_result", "other"
    text: str
    name: str = ""


def message_parts(message) -> tuple[str, list[Part]]:
    """A message of any agent's shape as its role and its parts, as text to show."""
    if not isinstance(message, dict):
        return "", [Part("other", _text(message))]
    role = str(message.get("role") or message.get("type") or "")
    content = message.get("content")
    parts: list[Part] = []
    if isinstance(content, str):
        parts.append(Part("text", content))
    elif isinstance(content, list):
        for block in content:
            if not isinstance(block, dict):
                parts.append(Part("text", _text(block)))
                continue
            kind = block.get("type")
            if kind == "text":
                parts.append(Part("text", str(block.get("text", ""))))
            elif kind in ("tool_use", "function_call"):
                parts.append(Part("tool_use", _text(block.get("input") or
                                                    block.get("arguments")),
                                  str(block.get("name", ""))))
            elif kind in ("tool_result", "function_call_output"):
                parts.append(Part("tool_result", _text(block.get("content") or
                                                       block.get("output"))))
            else:
                parts.append(Part("other", _text(block)))
    elif content is not None:
        parts.append(Part("other", _text(content)))
    for call in message.get("tool_calls") or message.get("toolCalls") or []:
        if isinstance(call, dict):
            fn = call.get("function") or call
            parts.append(Part("tool_use", _text(fn.get("arguments") or fn.get("args")),
                              str(fn.get("name", ""))))
    if not parts:
        rest = {k: v for k, v in message.items() if k not in ("role", "type")}
        parts.append(Part("other", _text(rest)))
    return role, parts


def _text(value) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, dict) and v.get("type") == "text"
                                       for v in value):
        return "\n".join(str(v.get("text", "")) for v in value)
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)
