"""State that outlives its schema: a checkpoint's state carries the version of the
schema it was written in, and a reader with migrations upgrades it when it reads it.

    migrations = StateMigrations(current=3, steps={1: v1_to_v2, 2: v2_to_v3})
    client = Client(migrations=migrations)
    client.show(old_checkpoint).state        # a v1 state, upgraded to v3: v1_to_v2, then v2_to_v3

The version lives in the state object itself, under the reserved key ``"__schema__"``
(an int, 1 or more), so it travels wherever the state goes (the CLI's ``--state``, the
MCP tools, forks, exports, another host) and needs nothing of the daemon. A state
without it is version 1. The upgrade happens in the reader, on a copy: the stored
checkpoint keeps the state and version it was written with, forever.
See docs/state-migrations.md.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

from .errors import FailedPrecondition

__all__ = ["SCHEMA_KEY", "StateMigrationError", "StateMigrations", "StateVersionTooNew"]

SCHEMA_KEY = "__schema__"

Migration = Callable[[dict], dict]


class StateMigrationError(FailedPrecondition):
    """A checkpoint's state could not be brought to the reader's schema: a migration
    raised (its exception is ``__cause__``) or returned something other than a dict, no
    migration starts at the state's version, or the version is not an int of 1 or more.
    ``version``: the state's; ``current``: the reader's; ``step``: the version the
    failing migration starts from (None when none ran); ``checkpoint_id`` when known.
    Nothing stored is changed, and a restore that needed the state did not start."""

    def __init__(self, message: str, *, version: Any, current: int, step: int | None = None,
                 checkpoint_id: str | None = None) -> None:
        where = f"checkpoint {checkpoint_id}: " if checkpoint_id else ""
        super().__init__(where + message)
        self.version, self.current, self.step = version, current, step
        self.checkpoint_id = checkpoint_id


class StateVersionTooNew(StateMigrationError):
    """The state was written in a schema newer than the reader knows (``version`` >
    ``current``): a newer agent wrote it; read it with that agent's migrations."""


class StateMigrations:
    """The schema of an agent's state: its ``current`` version and the ``steps`` that
    upgrade an older one, each ``{from_version: function}`` taking a state of that
    version (a dict) and returning it in the next. They run oldest first (a v1 state
    read at v3 goes through steps 1 then 2); each gets the previous one's result, and
    the first gets a deep copy of the stored state, so it may change it in place (it
    must still return it). After each step the state's ``"__schema__"`` is the next
    version. ``steps`` must be contiguous up to ``current - 1``; versions below the
    first step cannot be read (a StateMigrationError)."""

    def __init__(self, current: int, steps: Mapping[int, Migration] | None = None, *,
                 key: str = SCHEMA_KEY) -> None:
        if not _is_version(current):
            raise ValueError(f"current must be an int of 1 or more, not {current!r}")
        steps = dict(steps or {})
        for version, fn in steps.items():
            if not _is_version(version) or version >= current:
                raise ValueError(f"a migration starts at a version from 1 to {current - 1}"
                                 f" (current - 1), not {version!r}")
            if not callable(fn):
                raise ValueError(f"the migration from {version} is not callable: {fn!r}")
        if steps and sorted(steps) != list(range(min(steps), current)):
            missing = sorted(set(range(min(steps), current)) - set(steps))
            raise ValueError(f"no migration from version(s) {missing}: the steps must run"
                             f" without a gap up to {current}")
        if not isinstance(key, str) or not key:
            raise ValueError("key must be a non-empty string")
        self.current, self.steps, self.key = current, steps, key

    @classmethod
    def of(cls, migrations: StateMigrations | Mapping[int, Migration] | None
           ) -> StateMigrations | None:
        """``migrations`` as given to a client: a StateMigrations, or a plain
        ``{from_version: function}`` whose current version is one past its last step."""
        if migrations is None or isinstance(migrations, StateMigrations):
            return migrations
        if not isinstance(migrations, Mapping) or not migrations:
            raise ValueError("migrations: a StateMigrations or a non-empty"
                             " {from_version: function} mapping")
        if not all(_is_version(v) for v in migrations):
            raise ValueError(f"migration versions must be ints of 1 or more: {list(migrations)}")
        return cls(max(migrations) + 1, migrations)

    def __repr__(self) -> str:
        return f"StateMigrations(current={self.current}, steps={sorted(self.steps)})"

    def version_of(self, state: Mapping, checkpoint_id: str | None = None) -> int:
        """The schema version a state was written in (1 when it carries none)."""
        version = state.get(self.key, 1)
        if not _is_version(version):
            raise StateMigrationError(f"the state's {self.key!r} is {version!r}, not a"
                                      " version (an int of 1 or more)", version=version,
                                      current=self.current, checkpoint_id=checkpoint_id)
        return version

    def stamp(self, state: dict) -> dict:
        """The state to write: marked with the current version unless it names one."""
        if not state or self.key in state:
            return state
        return {**state, self.key: self.current}

    def upgrade(self, state: dict, checkpoint_id: str | None = None) -> dict:
        """``state`` in the current schema: as it is when it is already there, else a
        new dict made by the steps from its version on, oldest first. An empty state
        (the checkpoint has none) stays empty. Raises StateVersionTooNew for a state
        newer than ``current`` and StateMigrationError when a step fails."""
        if not state:
            return state
        version = self.version_of(state, checkpoint_id)
        facts = {"version": version, "current": self.current, "checkpoint_id": checkpoint_id}
        if version > self.current:
            raise StateVersionTooNew(
                f"the state is schema version {version}, newer than this reader's"
                f" {self.current}: it was written by a newer version of the agent", **facts)
        if version == self.current:
            return state
        state = copy.deepcopy(state)
        for step in range(version, self.current):
            fn = self.steps.get(step)
            if fn is None:
                raise StateMigrationError(
                    f"the state is schema version {version} and no migration starts at"
                    f" {step} (the first is {min(self.steps, default=self.current)})",
                    step=step, **facts)
            try:
                state = fn(state)
            except Exception as exc:
                raise StateMigrationError(
                    f"the migration from version {step} to {step + 1} ({_name(fn)}) raised"
                    f" {type(exc).__name__}: {exc}", step=step, **facts) from exc
            if not isinstance(state, dict):
                raise StateMigrationError(
                    f"the migration from version {step} to {step + 1} ({_name(fn)})"
                    f" returned {type(state).__name__}, not a dict", step=step, **facts)
            state[self.key] = step + 1
        return state


def _is_version(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _name(fn: Callable) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)
