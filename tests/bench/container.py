"""The container-checkpoint case."""

from __future__ import annotations


def case(bench):
    from .run import Case
    return Case("container-checkpoint", "checkpoint of a session whose container holds django",
                None, {}, None, "", "median ≤ 0.05 × docker commit", None,
                "skipped: container snapshots are not implemented yet (issue 3)")
