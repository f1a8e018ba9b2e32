"""`worldline mcp`: worldline's calls as MCP tools, over stdio (or streamable HTTP).

An MCP-speaking coding agent registers this server and can checkpoint, read its
log, diff, restore (seeing the side effects a restore cannot undo, and
acknowledging them), fork, keep its task list and ask for approval, without code.
Each tool's annotations say what it does to the world: read-only, destructive
(a restore overwrites workspace files), idempotent.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

from ._client import Client
from .errors import WorldlineError

READ = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True,
                       open_world_hint=False)
WRITE = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False,
                        open_world_hint=False)


def _tool(server: MCPServer, annotations: ToolAnnotations) -> Callable:
    """Register a tool whose worldline errors reach the agent as tool errors, with the
    status code and message (so it can, say, acknowledge side effects and retry)."""
    def register(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except WorldlineError as exc:
                raise ToolError(str(exc)) from None
        return server.tool(annotations=annotations)(wrapped)
    return register


def build(address: str | None = None) -> MCPServer:
    client = Client(address)
    server = MCPServer(
        "worldline", instructions=(
            "Checkpoint after every tool call; restore when the workspace is wrong; fork to"
            " try another approach; ask for approval before an irreversible tool. A restore"
            " lists side effects (pushes, deploys, messages) that it cannot undo."))

    @_tool(server, READ)
    def sessions() -> list[dict[str, Any]]:
        """Every session: id, name, workspace, container and head checkpoint."""
        return [s.to_dict() for s in client.list_sessions()]

    @_tool(server, WRITE)
    def create_session(workspace: str, name: str = "") -> dict[str, Any]:
        """Start a session on a workspace folder (absolute path); its first checkpoint is
        the folder as it is now."""
        return client.create_session(workspace, name=name or None).to_dict()

    @_tool(server, WRITE)
    def checkpoint(session_id: str, label: str = "", reasoning: str = "",
                   messages: list[dict[str, Any]] | None = None,
                   state: dict[str, Any] | None = None) -> dict[str, Any]:
        """Record the session's world: its workspace (and container) as they are now, the
        messages appended since the last checkpoint, and the agent state."""
        return client.checkpoint(session_id, label=label or None, reasoning=reasoning or None,
                                 messages=messages, state=state).to_dict()

    @_tool(server, READ)
    def log(session_id: str) -> list[dict[str, Any]]:
        """The session's checkpoints, oldest first (restores included)."""
        return [cp.to_dict() for cp in client.log(session_id)]

    @_tool(server, READ)
    def diff(from_checkpoint: str, to_checkpoint: str, patch: bool = False) -> dict[str, Any]:
        """Paths added, modified and deleted between two checkpoints; with patch, a unified
        diff of the text files."""
        d = client.diff(from_checkpoint, to_checkpoint, patch=patch).to_dict()
        if not patch:
            d.pop("patch")
        return d

    @_tool(server, ToolAnnotations(read_only_hint=False, destructive_hint=True,
                                   idempotent_hint=False, open_world_hint=False))
    def restore(session_id: str, checkpoint_id: str, acknowledge_side_effects: bool = False,
                dry_run: bool = False) -> dict[str, Any]:
        """Make the session's workspace, container, conversation, state and tasks equal to a
        checkpoint (overwriting the workspace's files; history keeps every version). It
        refuses while non-idempotent side effects happened since the checkpoint, listing
        them, until they are acknowledged. dry_run reports and changes nothing."""
        return client.restore(session_id, checkpoint_id,
                              acknowledge_side_effects=acknowledge_side_effects,
                              dry_run=dry_run).to_dict()

    @_tool(server, WRITE)
    def fork(checkpoint_id: str, workspace: str = "") -> dict[str, Any]:
        """A new session from a checkpoint, in its own workspace (a new folder under the data
        root unless one is given): try another approach without touching this one."""
        s = client.fork(checkpoint_id, workspace=workspace or None)
        return {**s.to_dict(), "side_effects": [e.to_dict() for e in s.side_effects]}

    @_tool(server, READ)
    def tasks(session_id: str) -> dict[str, Any]:
        """The session's task list and the resume point (the first task not completed or
        skipped)."""
        items, resume = client.tasks(session_id)
        return {"tasks": [t.to_dict() for t in items], "resume": resume}

    @_tool(server, ToolAnnotations(read_only_hint=False, destructive_hint=False,
                                   idempotent_hint=True, open_world_hint=False))
    def set_task(session_id: str, task_id: str, status: str, title: str = "",
                 parent: str = "") -> dict[str, Any]:
        """Set a task's status: pending, in_progress, completed, failed or skipped."""
        return client.set_task(session_id, task_id, status, title=title or None,
                               parent=parent or None).to_dict()

    @_tool(server, WRITE)
    def request_approval(session_id: str, tool: str, args: dict[str, Any] | None = None,
                         wait_seconds: float = 0.0) -> dict[str, Any]:
        """Checkpoint, then ask an operator to approve a tool call before it runs; with
        wait_seconds, wait that long for the decision (status approved, denied, expired,
        or still pending)."""
        approval = client.request_approval(session_id, tool, args=args)
        if wait_seconds > 0:
            approval = client.wait_approval(approval.id, timeout=wait_seconds)
        return approval.to_dict()

    return server


def serve(address: str | None = None, transport: str = "stdio") -> int:
    build(address).run(transport=transport)
    return 0
