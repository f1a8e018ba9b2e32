"""Storage on real edits: how versions of files are stored over a history, on a real
daemon with its own data root."""

from __future__ import annotations

import hashlib
import os

from worldline.daemon.storage.packs import ZDELTA, Pack


def _replace(path, data: bytes) -> None:
    """Write as git and most editors do: a new file renamed over the old one."""
    tmp = path.with_name(path.name + ".new")
    tmp.write_bytes(data)
    os.rename(tmp, path)


def test_a_file_edited_right_before_each_checkpoint_is_stored_as_deltas(
        fresh_daemon, workspace):
    """A file written just before a checkpoint gets no stat cache entry (its time cannot
    vouch for it), so its previous version comes from the tree: each version is a delta
    of the one before it, not of whatever older version the stat cache last saw (which
    drifts until the delta no longer pays and whole copies are stored)."""
    src = workspace / "module.py"
    lines = [f"def f{i}(x):\n    return x * {i}  # {os.urandom(8).hex()}\n".encode()
             for i in range(600)]
    _replace(src, b"".join(lines))
    fresh_daemon.start()
    versions = [hashlib.sha256(src.read_bytes()).hexdigest()]
    with fresh_daemon.client() as c:
        s = c.create_session(str(workspace))
        for n in range(4):
            lines[n * 100] = f"def edited{n}(x):\n    return -x\n".encode()
            data = b"".join(lines)
            _replace(src, data)
            s.checkpoint()  # at once: the file is newer than the stat cache may trust
            versions.append(hashlib.sha256(data).hexdigest())
    assert fresh_daemon.stop() == 0
    pack = Pack(str(fresh_daemon.root / "blobs" / "pack.db"))
    try:
        for before, digest in zip(versions, versions[1:], strict=False):
            row = pack.row(digest)
            assert row is not None and row.kind == ZDELTA and len(row.data) < 200, row
            assert row.base == before
    finally:
        pack.close()
