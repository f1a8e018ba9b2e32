"""The World is reached through its public methods: the fleet, maintenance, the edge
and the rest of the daemon use what the facade (daemon/world/facade.py) offers, never
a private member of it, so its modules can change behind it."""

from __future__ import annotations

import ast
from pathlib import Path

DAEMON = Path(__file__).resolve().parent.parent / "daemon"


def _private_reaches(path: Path) -> list[str]:
    """``world._x``, ``self.world._x`` or ``World._x`` in the module at ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                and not node.attr.startswith("__")):
            continue
        owner = node.value
        name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
        if name in ("world", "World", "_world"):
            found.append(f"{path.relative_to(DAEMON)}:{node.lineno}: {name}.{node.attr}")
    return found


def test_nothing_outside_the_world_package_reaches_into_a_world():
    outside = [p for p in DAEMON.rglob("*.py") if "world" not in p.relative_to(DAEMON).parts]
    assert len(outside) > 20  # the daemon's modules were found
    assert [hit for path in outside for hit in _private_reaches(path)] == []
