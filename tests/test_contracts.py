"""Every implementation has the whole of its contract: each method and attribute of the
Protocol, taking the same arguments. The contract suites (test_*_contract.py) hold
what the methods do; this holds that none is missing or takes other arguments, which
a Protocol (checked by no one at run time) does not.

Arguments without a default are compared by position (callers pass them so; an
implementation may name them its way), those with one by name (callers pass them by
keyword).
"""

from __future__ import annotations

import inspect
from typing import Protocol

import pytest
from worldline.daemon.capture.snapshot import MemorySnapshotter, WorkspaceSnapshotter
from worldline.daemon.capture.snapshotter import Snapshotter
from worldline.daemon.storage.blob_store import BlobStore
from worldline.daemon.storage.blobs import LocalBlobStore, MemoryBlobStore
from worldline.daemon.storage.graph_checkpoints import GraphStore
from worldline.daemon.storage.graph_store import (
    MemoryGraphStore,
    PostgresGraphStore,
    SqliteGraphStore,
)
from worldline.daemon.storage.leases import LeaseStore
from worldline.daemon.storage.metadata_store import Store
from worldline.daemon.storage.postgres_store import PostgresStore
from worldline.daemon.storage.s3_blobs import S3BlobStore
from worldline.daemon.storage.sqlite_store import SqliteStore
from worldline.daemon.storage.store import MemoryStore

IMPLEMENTATIONS = {
    BlobStore: (LocalBlobStore, MemoryBlobStore, S3BlobStore),
    Store: (MemoryStore, SqliteStore, PostgresStore),
    GraphStore: (MemoryGraphStore, SqliteGraphStore, PostgresGraphStore),
    Snapshotter: (WorkspaceSnapshotter, MemorySnapshotter),
}


def terms(contract: type) -> dict[str, object]:
    """The contract's methods (name: function) and attributes (name: None), its own and
    those of the contracts it extends (Store: LeaseStore's)."""
    found: dict[str, object] = {}
    for klass in reversed(contract.__mro__):
        if not getattr(klass, "_is_protocol", False) or klass is Protocol:
            continue
        found.update(dict.fromkeys(vars(klass).get("__annotations__", {})))
        found.update({name: value for name, value in vars(klass).items()
                      if inspect.isfunction(value) and not name.startswith("_")})
    return found


def breaches(contract: type, impl: type) -> list[str]:
    out = []
    for name, method in terms(contract).items():
        if not hasattr(impl, name):
            out.append(f"{impl.__name__} has no {name}")
            continue
        if method is None:
            continue
        want = list(inspect.signature(method).parameters.values())[1:]
        got = list(inspect.signature(getattr(impl, name)).parameters.values())[1:]
        if any(p.kind == p.VAR_KEYWORD for p in want) != any(
                p.kind == p.VAR_KEYWORD for p in got):
            out.append(f"{impl.__name__}.{name} takes **fields unlike the contract")
        got_named = {p.name: p for p in got}
        for i, p in enumerate(w for w in want if w.kind != w.VAR_KEYWORD):
            if p.default is p.empty:
                if i >= len(got) or got[i].kind == got[i].VAR_KEYWORD:
                    out.append(f"{impl.__name__}.{name} takes no argument {i + 1} ({p.name})")
            elif p.name not in got_named or got_named[p.name].default is p.empty:
                out.append(f"{impl.__name__}.{name} takes no {p.name}=")
        extra = [p.name for p in got[len(want):]
                 if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        if extra:
            out.append(f"{impl.__name__}.{name} needs more arguments: {extra}")
    return out


@pytest.mark.parametrize("contract", list(IMPLEMENTATIONS), ids=lambda c: c.__name__)
def test_every_implementation_keeps_the_whole_contract(contract):
    assert [b for impl in IMPLEMENTATIONS[contract] for b in breaches(contract, impl)] == []


def test_the_store_contract_includes_the_leases():
    assert set(terms(LeaseStore)) < set(terms(Store))
    assert {"claim_session", "renew_leases", "release_session"} <= set(terms(LeaseStore))


def test_a_missing_method_or_argument_is_found():
    """The check above can fail: a store whose method lacks an argument, and one that
    lacks methods, are named."""

    class Narrow(MemoryBlobStore):
        def put_fd(self, fd):
            return super().put_fd(fd)

    assert breaches(BlobStore, Narrow) == ["Narrow.put_fd takes no limit="]

    class Bare:
        local = True

    assert "Bare has no sync" in breaches(BlobStore, Bare)
