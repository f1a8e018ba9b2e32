"""`worldline mcp`: worldline's calls as MCP tools, over stdio (or streamable HTTP).

An MCP-speaking coding agent registers this server and can checkpoint, read its
log, diff, restore (seeing the side effects a restore cannot undo, and
acknowledging them), fork, keep its task list and ask for approval, without code.
Each tool's annotations say what it does to the world: read-only, destructive
(a restore overwrites workspace files), idempotent.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Literal

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import BaseModel, ValidationError

from ._client import Client
from .errors import WorldlineError

TaskStatus = Literal["pending", "in_progress", "completed", "failed", "skipped"]
Effect = Literal["read_only", "local", "external_idempotent", "external_non_idempotent"]

READ = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True,
                       open_world_hint=False)
WRITE = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False,
                        open_world_hint=False)


class WorldlineMCP(MCPServer):
    """Arguments that do not fit a tool's schema are answered in one line of our own,
    ``INVALID_ARGUMENT: field: what is wrong``, like every other worldline error."""

    async def call_tool(self, name: str, arguments: dict[str, Any], context=None):
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            cause = exc.__cause__
            if not isinstance(cause, ValidationError):
                raise
            first = cause.errors()[0]
            field = ".".join(str(part) for part in first["loc"]) or "arguments"
            more = f" (and {cause.error_count() - 1} more)" if cause.error_count() > 1 else ""
            raise ToolError(f"INVALID_ARGUMENT: {name}: {field}: {first['msg']}{more}") from None


class ApprovalAnswer(BaseModel):
    approve: bool
    reason: str = ""


def _tool(server: MCPServer, annotations: ToolAnnotations) -> Callable:
    """Register a tool whose worldline errors reach the agent as tool errors, with the
    status code and message (so it can, say, acknowledge side effects and retry). Its
    description is its docstring, without the indentation."""
    def register(fn: Callable) -> Callable:
        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def wrapped(*args, **kwargs):
                try:
                    return await fn(*args, **kwargs)
                except WorldlineError as exc:
                    raise ToolError(str(exc)) from None
        else:
            @functools.wraps(fn)
            def wrapped(*args, **kwargs):
                try:
                    return fn(*args, **kwargs)
                except WorldlineError as exc:
                    raise ToolError(str(exc)) from None
        return server.tool(annotations=annotations,
                           description=inspect.cleandoc(fn.__doc__ or ""))(wrapped)
    return register


def build(address: str | None = None) -> MCPServer:
    from .about import version
    client = Client(address)
    server = WorldlineMCP(
        "worldline", version=version(), instructions=(
            "Checkpoint after every tool call; restore when the workspace is wrong; fork to"
            " try another approach; ask for approval before an irreversible tool. A restore"
            " lists side effects (pushes, deploys, messages) that it cannot undo. Ids may be"
            " given as a unique prefix; a checkpoint also as SESSION@N, HEAD or HEAD~N."))

    def sid(text: str) -> str:
        """A session id as typed: a unique prefix will do (Client.resolve_id)."""
        return client.resolve_id(text, "session")

    def cid(text: str, session_id: str = "") -> str:
        """A checkpoint id as typed: a unique prefix, SESSION@N, HEAD or HEAD~N (of
        ``session_id``, else the session of this server's folder)."""
        return client.resolve_id(text, "checkpoint", sid(session_id) if session_id else None)

    @_tool(server, READ)
    def sessions() -> list[dict[str, Any]]:
        """Every session: id, name, workspace, container and head checkpoint."""
        return [s.to_dict() for s in client.list_sessions()]

    @_tool(server, WRITE)
    def create_session(workspace: str, name: str = "",
                       exclude: list[str] | None = None) -> dict[str, Any]:
        """Start a session on a workspace folder (absolute path); its first checkpoint is
        the folder as it is now. ``exclude``: gitignore patterns of workspace paths never
        captured nor restored (as a .worldlineignore at its root does)."""
        return client.create_session(workspace, name=name or None, exclude=exclude).to_dict()

    @_tool(server, WRITE)
    def checkpoint(session_id: str, label: str = "", reasoning: str = "",
                   messages: list[dict[str, Any]] | None = None,
                   state: dict[str, Any] | None = None) -> dict[str, Any]:
        """Record the session's world: its workspace (and container) as they are now, the
        messages appended since the last checkpoint, and the agent state."""
        return client.checkpoint(sid(session_id), label=label or None,
                                 reasoning=reasoning or None,
                                 messages=messages, state=state).to_dict()

    @_tool(server, READ)
    def log(session_id: str) -> list[dict[str, Any]]:
        """The session's checkpoints, oldest first (restores included)."""
        return [cp.to_dict() for cp in client.log(sid(session_id))]

    @_tool(server, READ)
    def diff(from_checkpoint: str, to_checkpoint: str, patch: bool = False) -> dict[str, Any]:
        """Paths added, modified and deleted between two checkpoints; with patch, a unified
        diff of the text files."""
        d = client.diff(cid(from_checkpoint), cid(to_checkpoint), patch=patch).to_dict()
        if not patch:
            d.pop("patch")
        return d

    @_tool(server, ToolAnnotations(read_only_hint=False, destructive_hint=True,
                                   idempotent_hint=False, open_world_hint=False))
    def restore(session_id: str, checkpoint_id: str, acknowledge_side_effects: bool = False,
                dry_run: bool = False, paths: list[str] | None = None) -> dict[str, Any]:
        """Make the session's workspace, container, conversation, state and tasks equal to a
        checkpoint (overwriting the workspace's files; history keeps every version). It
        refuses while non-idempotent side effects happened since the checkpoint, listing
        them, until they are acknowledged. dry_run reports and changes nothing. With
        paths (relative to the workspace), only those are restored: the rest of the
        world, the conversation and the tasks stay as they are. The world as it was is
        first kept as a checkpoint of its own ("before" in the answer) when it differs
        from the head; "not_checkpointed" lists the paths that did."""
        session_id = sid(session_id)
        return client.restore(session_id, cid(checkpoint_id, session_id),
                              acknowledge_side_effects=acknowledge_side_effects,
                              dry_run=dry_run, paths=paths).to_dict()

    @_tool(server, READ)
    def path_history(session_id: str, path: str, patch: bool = False) -> list[dict[str, Any]]:
        """The checkpoints that changed one path (relative to the workspace), newest first:
        each with its change (added, modified, deleted) and the tool calls made before
        it; with patch, a unified diff of each change. A rename shows as the deletion of
        one path and the addition of another."""
        return [c.to_dict() for c in client.path_history(sid(session_id), path, patch=patch)]

    @_tool(server, READ)
    def read_file(checkpoint_id: str, path: str) -> dict[str, Any]:
        """A file's content as of a checkpoint (path relative to the workspace): "text"
        when it is UTF-8, else "base64"."""
        data = client.read_file(cid(checkpoint_id), path)
        try:
            return {"path": path, "size": len(data), "text": data.decode("utf-8")}
        except UnicodeDecodeError:
            import base64
            return {"path": path, "size": len(data),
                    "base64": base64.b64encode(data).decode("ascii")}

    @_tool(server, WRITE)
    def fork(checkpoint_id: str, workspace: str = "") -> dict[str, Any]:
        """A new session from a checkpoint, in its own workspace (a new folder under the data
        root unless one is given): try another approach without touching this one."""
        s = client.fork(cid(checkpoint_id), workspace=workspace or None)
        return {**s.to_dict(), "side_effects": [e.to_dict() for e in s.side_effects]}

    @_tool(server, READ)
    def tasks(session_id: str) -> dict[str, Any]:
        """The session's task list and the resume point (the first task not completed or
        skipped)."""
        items, resume = client.tasks(sid(session_id))
        return {"tasks": [t.to_dict() for t in items], "resume": resume}

    @_tool(server, ToolAnnotations(read_only_hint=False, destructive_hint=False,
                                   idempotent_hint=True, open_world_hint=False))
    def set_task(session_id: str, task_id: str, status: TaskStatus, title: str = "",
                 parent: str = "") -> dict[str, Any]:
        """Set a task's status: pending, in_progress, completed, failed or skipped."""
        return client.set_task(sid(session_id), task_id, status, title=title or None,
                               parent=parent or None).to_dict()

    @_tool(server, WRITE)
    def record_tool_call(session_id: str, name: str, args: dict[str, Any] | None = None,
                         effect: Effect | None = None, result: Any = None,
                         idempotency_key: str = "", approval_id: str = "") -> dict[str, Any]:
        """Record a tool call the agent made (or is about to make) in the session's
        side-effect ledger. Without an effect the daemon's policy decides it. A tool the
        policy gates needs the id of an approved approval (request_approval); a call whose
        idempotency key was already recorded comes back with replayed=true, not again."""
        return client.record_tool_call(sid(session_id), name, args=args, effect=effect,
                                       result=result, idempotency_key=idempotency_key or None,
                                       approval_id=approval_id or None).to_dict()

    @_tool(server, WRITE)
    async def request_approval(session_id: str, tool: str, ctx: Context,
                               args: dict[str, Any] | None = None,
                               wait_seconds: float = 0.0) -> dict[str, Any]:
        """Checkpoint, then ask for approval of a tool call before it runs. When the MCP
        client can ask its user (elicitation), the user decides at once; otherwise an
        operator decides (`worldline approve ID`). With wait_seconds, wait that long for
        the decision (status approved, denied, expired, or still pending)."""
        approval = await anyio.to_thread.run_sync(
            lambda: client.request_approval(sid(session_id), tool, args=args))
        capabilities = ctx.client_capabilities
        if capabilities is not None and capabilities.elicitation is not None:
            answer = await ctx.elicit(
                f"The agent asks to run {tool} with {args or {}}: irreversible, so worldline"
                f" checkpointed the world first (approval {approval.id}). Approve it?",
                schema=ApprovalAnswer)
            if answer.action == "accept":
                approval = await anyio.to_thread.run_sync(lambda: client.decide_approval(
                    approval.id, approve=answer.data.approve,
                    reason=answer.data.reason or ("approved" if answer.data.approve else
                                                  "denied") + " by the user through MCP"))
            elif answer.action == "decline":
                approval = await anyio.to_thread.run_sync(lambda: client.decide_approval(
                    approval.id, approve=False, reason="declined by the user through MCP"))
        if approval.status == "pending" and wait_seconds > 0:
            approval = await anyio.to_thread.run_sync(
                lambda: client.wait_approval(approval.id, timeout=wait_seconds))
        return approval.to_dict()

    @_tool(server, READ)
    def get_approval(approval_id: str) -> dict[str, Any]:
        """An approval as it stands: pending, approved, denied or expired."""
        return client.get_approval(client.resolve_id(approval_id, "approval")).to_dict()

    @_tool(server, ToolAnnotations(read_only_hint=True, destructive_hint=False,
                                   idempotent_hint=True, open_world_hint=False))
    async def wait_approval(approval_id: str, timeout_seconds: float = 30.0) -> dict[str, Any]:
        """Wait until an approval is decided or expires, at most timeout_seconds; then it
        is returned as it stands (still pending when nobody decided)."""
        return (await anyio.to_thread.run_sync(
            lambda: client.wait_approval(client.resolve_id(approval_id, "approval"),
                                         timeout=timeout_seconds))).to_dict()

    @_tool(server, WRITE)
    def cancel_approval(approval_id: str, reason: str = "") -> dict[str, Any]:
        """Withdraw a pending approval this agent requested (it becomes denied)."""
        return client.cancel_approval(client.resolve_id(approval_id, "approval"),
                                      reason=reason).to_dict()

    return server


def serve(address: str | None = None, transport: str = "stdio") -> int:
    build(address).run(transport=transport)
    return 0
