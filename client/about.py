"""The installed worldline's version, as the CLI (``--version``) and the MCP server
(its ``serverInfo``) report it."""


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed
    try:
        return installed("worldline")
    except PackageNotFoundError:
        return "unknown"
