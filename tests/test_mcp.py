"""`worldline mcp` through a real MCP client over stdio, against a real daemon."""

from __future__ import annotations

import sys

import anyio
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client


def test_mcp_tools_drive_the_daemon(daemon, workspace):
    (workspace / "a.txt").write_text("one\n")

    async def scenario():
        params = StdioServerParameters(
            command=sys.executable,
            args=["-m", "worldline.client.cli", "mcp", "--address", daemon.address])
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as session:
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
