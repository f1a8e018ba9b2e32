"""`worldline mcp` through a real MCP client over stdio, against a real daemon."""

from __future__ import annotations

import contextlib
import sys

import anyio
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client


@contextlib.asynccontextmanager
async def mcp_session(daemon, **options):
    """`worldline mcp` as a child over stdio, and a client session with it."""
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "worldline.client.cli", "mcp", "--address", daemon.address])
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write, **options) as session:
            yield session


def test_mcp_tools_drive_the_daemon(daemon, workspace):
    (workspace / "a.txt").write_text("one\n")

    async def scenario():
        async with mcp_session(daemon) as session:
            await session.initialize()
            tools = {t.name: t for t in (await session.list_tools()).tools}
            assert {"checkpoint", "log", "diff", "restore", "fork", "tasks",
                    "request_approval"} <= tools.keys()
            assert tools["log"].annotations.read_only_hint is True
            assert tools["restore"].annotations.destructive_hint is True
            assert tools["checkpoint"].annotations.read_only_hint is False

            async def call(name, **args):
                result = await session.call_tool(name, args)
                assert not result.is_error, result.content
                return result.structured_content

            s = await call("create_session", workspace=str(workspace))
            cp = await call("checkpoint", session_id=s["id"], label="via mcp",
                            messages=[{"role": "user", "content": "hi"}])
            (workspace / "a.txt").write_text("two\n")
            cp2 = await call("checkpoint", session_id=s["id"])
            d = await call("diff", from_checkpoint=cp["id"], to_checkpoint=cp2["id"])
            assert d["modified"] == ["a.txt"]
            dry = await call("restore", session_id=s["id"], checkpoint_id=cp["id"],
                             dry_run=True)
            assert dry["files_written"] == ["a.txt"]
            await call("restore", session_id=s["id"], checkpoint_id=cp["id"])
            assert (workspace / "a.txt").read_text() == "one\n"
            log = await call("log", session_id=s["id"])
            assert log["result"][-1]["kind"] == "restore"
            bad = await session.call_tool("restore", {"session_id": s["id"],
                                                      "checkpoint_id": "nope"})
            assert bad.is_error and "INVALID_ARGUMENT" in bad.content[0].text

    anyio.run(scenario)


def test_mcp_ledger_approvals_schemas_and_errors(daemon, workspace):
    """The side-effect gate through MCP: record a tool call, request an approval that the
    user decides through elicitation, read, wait on and cancel approvals; enums in the
    schemas, the version in serverInfo, our own one-line argument errors."""
    import mcp.types as types
    from worldline.client.about import version

    asked = []

    async def elicit(context, params):
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"approve": True,
                                                            "reason": "fine by me"})

    async def scenario():
        async with mcp_session(daemon, elicitation_callback=elicit) as session:
            init = await session.initialize()
            assert init.server_info.version == version()
            tools = {t.name: t for t in (await session.list_tools()).tools}
            assert {"record_tool_call", "get_approval", "wait_approval",
                    "cancel_approval"} <= tools.keys()
            status = tools["set_task"].input_schema["properties"]["status"]
            assert status["enum"] == ["pending", "in_progress", "completed", "failed",
                                      "skipped"]
            effect = str(tools["record_tool_call"].input_schema["properties"]["effect"])
            assert "external_non_idempotent" in effect
            assert not tools["restore"].description.startswith(" ")
            assert "\n    " not in tools["restore"].description

            async def call(tool_name, /, **args):
                result = await session.call_tool(tool_name, args)
                assert not result.is_error, result.content
                return result.structured_content

            s = await call("create_session", workspace=str(workspace))
            t = await call("record_tool_call", session_id=s["id"], name="bash",
                           args={"command": "git push"}, idempotency_key="k1")
            assert t["effect"] == "external_non_idempotent"
            again = await call("record_tool_call", session_id=s["id"], name="bash",
                               args={"command": "git push"}, idempotency_key="k1")
            assert again["replayed"] is True
            a = await call("request_approval", session_id=s["id"], tool="deploy",
                           args={"env": "prod"})
            assert a["status"] == "approved" and asked and "deploy" in asked[0]
            assert (await call("get_approval", approval_id=a["id"]))["status"] == "approved"
            assert (await call("wait_approval", approval_id=a["id"],
                               timeout_seconds=1))["status"] == "approved"
            bad = await session.call_tool("set_task", {"session_id": s["id"],
                                                       "task_id": "t", "status": "done"})
            assert bad.is_error
            text = bad.content[0].text
            assert text.startswith("INVALID_ARGUMENT: set_task: status:")
            assert "\n" not in text
            bad = await session.call_tool("cancel_approval", {"approval_id": a["id"]})
            assert bad.is_error and "FAILED_PRECONDITION" in bad.content[0].text

    anyio.run(scenario)


def test_mcp_approvals_without_elicitation_wait_for_an_operator(daemon, workspace):
    async def scenario():
        async with mcp_session(daemon) as session:
            await session.initialize()
            s = (await session.call_tool("create_session",
                                         {"workspace": str(workspace)})).structured_content
            a = (await session.call_tool("request_approval", {
                "session_id": s["id"], "tool": "deploy"})).structured_content
            assert a["status"] == "pending"
            c = (await session.call_tool("cancel_approval", {
                "approval_id": a["id"], "reason": "changed my mind"})).structured_content
            assert c["status"] == "denied" and "changed my mind" in c["reason"]

    anyio.run(scenario)
